//! The passive health check of one upstream: after `threshold` connection errors in
//! a row it is down for `period`; requests to it then get 502 at once, without a
//! connection attempt; after the period one trial request goes through, and its
//! outcome marks the upstream up (a response head) or down again (a connection
//! error). A timeout neither counts as a failure nor clears the count.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The check's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Connection errors in a row that take the upstream down (0: never).
    pub threshold: u32,
    /// How long it stays down before a trial request.
    pub period: Duration,
}

/// What to do with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Send it.
    Yes,
    /// Send it: the one trial after the down period.
    Trial,
    /// The upstream is down: 502 without dialing.
    Down,
}

#[derive(Debug, Default)]
struct State {
    failures: u32,
    down_until: Option<Instant>,
    trial_out: bool,
}

/// One upstream's state.
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<State>,
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere never leaves State inconsistent (plain fields).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a request may go to the upstream at `now`.
    pub fn admit(&self, now: Instant) -> Admit {
        let mut s = self.state();
        match s.down_until {
            None => Admit::Yes,
            Some(t) if now < t || s.trial_out => Admit::Down,
            Some(_) => {
                s.trial_out = true;
                Admit::Trial
            }
        }
    }

    /// The upstream answered (a response head): up, the count cleared.
    pub fn success(&self) {
        *self.state() = State::default();
    }

    /// A connection error at `now`; whether this took the upstream down.
    pub fn failure(&self, now: Instant, policy: HealthPolicy) -> bool {
        let mut s = self.state();
        s.failures = s.failures.saturating_add(1);
        let was_trial = std::mem::take(&mut s.trial_out);
        if policy.threshold > 0 && (was_trial || s.failures >= policy.threshold) {
            let newly = s.down_until.is_none();
            s.down_until = Some(now + policy.period);
            newly || was_trial
        } else {
            false
        }
    }

    /// A trial request that ended otherwise (a timeout, the client gone): the next
    /// request may try again.
    pub fn trial_abandoned(&self) {
        self.state().trial_out = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: HealthPolicy = HealthPolicy { threshold: 3, period: Duration::from_secs(10) };

    #[test]
    fn down_after_threshold_then_one_trial() {
        let h = Health::default();
        let t0 = Instant::now();
        assert!(!h.failure(t0, P));
        assert!(!h.failure(t0, P));
        assert_eq!(h.admit(t0), Admit::Yes);
        assert!(h.failure(t0, P), "the third failure takes it down");
        assert_eq!(h.admit(t0 + Duration::from_secs(9)), Admit::Down);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(h.admit(later), Admit::Trial);
        assert_eq!(h.admit(later), Admit::Down, "one trial at a time");
        // The trial fails: down for another period.
        assert!(h.failure(later, P));
        assert_eq!(h.admit(later + Duration::from_secs(9)), Admit::Down);
        assert_eq!(h.admit(later + Duration::from_secs(10)), Admit::Trial);
        h.success();
        assert_eq!(h.admit(later + Duration::from_secs(10)), Admit::Yes);
        // The count starts again from zero.
        assert!(!h.failure(later, P));
        assert!(!h.failure(later, P));
        assert_eq!(h.admit(later), Admit::Yes);
    }

    #[test]
    fn success_clears_the_run_and_zero_never_downs() {
        let h = Health::default();
        let t0 = Instant::now();
        h.failure(t0, P);
        h.failure(t0, P);
        h.success();
        assert!(!h.failure(t0, P));
        assert_eq!(h.admit(t0), Admit::Yes);
        let never = HealthPolicy { threshold: 0, ..P };
        for _ in 0..10 {
            assert!(!h.failure(t0, never));
        }
        assert_eq!(h.admit(t0), Admit::Yes);
    }

    #[test]
    fn an_abandoned_trial_lets_the_next_request_try() {
        let h = Health::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            h.failure(t0, P);
        }
        let later = t0 + P.period;
        assert_eq!(h.admit(later), Admit::Trial);
        h.trial_abandoned();
        assert_eq!(h.admit(later), Admit::Trial);
    }
}
