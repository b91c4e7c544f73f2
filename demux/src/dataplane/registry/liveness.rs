//! Liveness and handshake pressure of a live instance (docs/operations.md "Liveness
//! and pressure"), from its `Load` reports (docs/wire.md, every 250 ms) and its
//! forwarding drops. Pure: the registry passes the time in.
//!
//! An instance is **stalled** — not placeable in the published snapshot, but still
//! live, so its established connections keep being forwarded — when
//!
//! - it has sent at least one `Load` and none for [`HEARTBEAT_TIMEOUT`], or
//! - it has sent at least one `Load` and its data connection or rings have been full
//!   (its `drops_full` grew at every tick) for longer than [`FULL_BOUND`].
//!
//! When every ready instance is stalled, the registry keeps them all placeable (a
//! slow instance still answers; none at all answers nobody).
//!
//! Workers that never send `Load` (older workers, test workers) are never stalled.
//! A stalled instance is placeable again (if it said `Ready`) at the first tick with
//! a fresh `Load` and no new `drops_full`.

use std::time::Duration;

/// How often the registry applies the rule ([`Liveness::tick`]).
pub const TICK: Duration = Duration::from_millis(100);
/// No `Load` for this long: stalled.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// Forwarding to it failed with a full connection (or ring) for this long: stalled.
pub const FULL_BOUND: Duration = Duration::from_millis(500);

/// One live instance's liveness state.
#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// When the last `Load` arrived (`None`: never; the rule does not apply).
    last_load: Option<Duration>,
    pub handshakes: u32,
    pub incoming_bytes: u32,
    /// `drops_full` at the previous tick.
    drops_full: Option<u64>,
    /// Since when `drops_full` has grown at every tick.
    full_since: Option<Duration>,
    stalled: bool,
    /// Times it became stalled.
    pub stalls: u64,
    /// Why it is (or last was) stalled.
    pub why: &'static str,
}

impl Liveness {
    /// A `Load` arrived at `now`.
    pub fn on_load(&mut self, now: Duration, handshakes: u32, incoming_bytes: u32) {
        self.last_load = Some(now);
        self.handshakes = handshakes;
        self.incoming_bytes = incoming_bytes;
    }

    pub fn stalled(&self) -> bool {
        self.stalled
    }

    /// Whether it has ever sent a `Load`.
    pub fn reports(&self) -> bool {
        self.last_load.is_some()
    }

    /// Milliseconds since the last `Load` (`None`: never sent one).
    pub fn load_age_ms(&self, now: Duration) -> Option<u64> {
        self.last_load.map(|t| now.saturating_sub(t).as_millis() as u64)
    }

    /// The registry itself did not run for a while (it was stopped, or starved):
    /// what it did not read is no worker's fault. Counts the silence from `now` and
    /// restarts the full-connection bound.
    pub fn registry_resumed(&mut self, now: Duration) {
        if self.last_load.is_some() {
            self.last_load = Some(now);
        }
        self.full_since = None;
    }

    /// Applies the rule at `now`, given the instance's running `drops_full` total.
    /// Returns true when the stalled state changed.
    pub fn tick(&mut self, now: Duration, drops_full: u64) -> bool {
        let grew = self.drops_full.is_some_and(|before| drops_full > before);
        self.drops_full = Some(drops_full);
        if grew {
            self.full_since.get_or_insert(now);
        } else {
            self.full_since = None;
        }
        let Some(last) = self.last_load else { return false };
        let silent = now.saturating_sub(last) >= HEARTBEAT_TIMEOUT;
        let full = self.full_since.is_some_and(|since| now.saturating_sub(since) >= FULL_BOUND);
        let stalled = if self.stalled { silent || grew } else { silent || full };
        if stalled == self.stalled {
            return false;
        }
        self.stalled = stalled;
        if stalled {
            self.stalls += 1;
            self.why = if silent { "no Load for 1 s" } else { "data connection full" };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn never_reporting_instances_are_never_stalled() {
        let mut l = Liveness::default();
        for t in 0..100 {
            assert!(!l.tick(ms(t * 100), t * 1000), "drops grow, no Load ever");
        }
        assert!(!l.stalled());
        assert_eq!(l.stalls, 0);
    }

    #[test]
    fn silence_stalls_after_the_timeout_and_a_fresh_load_revives() {
        let mut l = Liveness::default();
        l.on_load(ms(0), 3, 0);
        assert!(!l.tick(ms(100), 0));
        assert!(!l.tick(ms(900), 0));
        assert!(!l.stalled(), "999 ms of silence is not yet a stall");
        assert!(l.tick(ms(1000), 0), "1 s without Load: stalled");
        assert!(l.stalled());
        assert_eq!((l.stalls, l.why), (1, "no Load for 1 s"));
        assert!(!l.tick(ms(5000), 0), "still stalled, counted once");
        assert_eq!(l.stalls, 1);
        l.on_load(ms(5050), 0, 0);
        assert!(l.tick(ms(5100), 0), "Load resumed and nothing dropped: placeable again");
        assert!(!l.stalled());
        // A second silence is a second stall.
        assert!(l.tick(ms(6100), 0));
        assert_eq!(l.stalls, 2);
    }

    #[test]
    fn a_full_connection_for_longer_than_the_bound_stalls_until_it_drains() {
        let mut l = Liveness::default();
        let mut drops = 0;
        let mut t = 0;
        l.on_load(ms(t), 0, 0);
        l.tick(ms(t), drops);
        // Drops grow at every tick, heartbeats keep coming (the worker's runtime
        // lives, its receive path does not keep up).
        while t < 500 {
            t += 100;
            drops += 10;
            l.on_load(ms(t), 0, 0);
            l.tick(ms(t), drops);
        }
        assert!(!l.stalled(), "full since 100 ms: 400 ms < the bound");
        t += 100;
        drops += 10;
        l.on_load(ms(t), 0, 0);
        assert!(l.tick(ms(t), drops), "full for 500 ms: stalled");
        assert_eq!(l.why, "data connection full");
        // Still dropping (the shards still forward its Owner datagrams): stays stalled.
        t += 100;
        drops += 1;
        l.on_load(ms(t), 0, 0);
        assert!(!l.tick(ms(t), drops));
        assert!(l.stalled());
        // Drained: no new drops at a tick with a fresh Load.
        t += 100;
        l.on_load(ms(t), 0, 0);
        assert!(l.tick(ms(t), drops));
        assert!(!l.stalled());
        assert_eq!(l.stalls, 1);
    }

    #[test]
    fn a_pause_in_the_drops_restarts_the_bound() {
        let mut l = Liveness::default();
        l.on_load(ms(0), 0, 0);
        l.tick(ms(0), 0);
        let mut drops = 0;
        for t in (100..=2000).step_by(100) {
            // Every third tick sees no new drop: never full for 500 ms in a row.
            if t % 300 != 0 {
                drops += 5;
            }
            l.on_load(ms(t), 0, 0);
            l.tick(ms(t), drops);
            assert!(!l.stalled(), "at {t} ms");
        }
    }

    /// A data plane that was itself stopped (SIGSTOP) for longer than the timeout
    /// does not blame its workers when it resumes.
    #[test]
    fn a_registry_pause_is_forgiven() {
        let mut l = Liveness::default();
        l.on_load(ms(0), 0, 0);
        l.tick(ms(100), 0);
        l.registry_resumed(ms(5000));
        assert!(!l.tick(ms(5000), 0));
        assert!(!l.stalled());
        assert!(l.tick(ms(6000), 0), "and a real silence after that still counts");
    }
}
