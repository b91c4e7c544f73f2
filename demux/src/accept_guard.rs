//! Accepting on a Unix listener without spinning or flooding the log (docs/operations.md
//! "Liveness and pressure"): the registry's data and control listeners and the controller's
//! `control.sock`.
//!
//! - An accept that fails with EMFILE / ENFILE / ENOBUFS / ENOMEM (or any other
//!   unexpected error) pauses accepting for [`PAUSE`]: the caller takes the listener
//!   out of its level-triggered epoll set (which would otherwise report it readable
//!   at once, forever) and puts it back when [`AcceptGuard::resume_due`] says so.
//! - Failures are logged at most once per [`LOG_INTERVAL`], with the number of
//!   failures not logged since the last line.
//! - Connections that have not said hello within [`HELLO_TIMEOUT`] are closed by the
//!   caller; at most [`pending_cap`] such connections are kept at once: a new one
//!   beyond the cap evicts the oldest ([`AcceptGuard::evict_oldest`], counted, logged
//!   likewise), so a flood of idle peers churns through the cap while a peer that says
//!   hello at once (a worker, `demux status`) is still served.
//!
//! Pure bookkeeping, time passed in; the callers own the epoll set and the fds.

use std::io;
use std::time::{Duration, Instant};

/// How long accepting pauses after a failed accept.
pub const PAUSE: Duration = Duration::from_millis(250);
/// At most one log line per this interval per listener and kind of event.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);
/// A connection that has sent no hello (or, on a control socket, no message at all)
/// this long after it was accepted is closed.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(3);
/// Most connections kept before their hello, whatever the fd limit.
pub const MAX_PENDING: usize = 256;

/// Connections kept before their hello: [`MAX_PENDING`], or a quarter of the soft
/// RLIMIT_NOFILE when that is smaller (at least 8), so that idle peers can never take
/// all of this process's fds.
pub fn pending_cap() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the live `r`.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    let soft = if ok { usize::try_from(r.rlim_cur).unwrap_or(usize::MAX) } else { MAX_PENDING * 4 };
    (soft / 4).clamp(8, MAX_PENDING)
}

/// A rate-limited log line: `Some(suppressed)` when a line is due now (with the
/// number of events not logged since the last one).
#[derive(Debug, Default)]
struct LogLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|t| now.saturating_duration_since(t) < LOG_INTERVAL) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// One listener's accept state.
#[derive(Debug)]
pub struct AcceptGuard {
    what: &'static str,
    paused_until: Option<Instant>,
    /// Failed accepts (each one paused accepting).
    pub failures: u64,
    /// Connections closed to make room: the oldest of too many before their hello.
    pub over_cap: u64,
    /// Connections closed because they sent no hello in time.
    pub hello_timeouts: u64,
    fail_log: LogLimit,
    cap_log: LogLimit,
}

impl AcceptGuard {
    pub fn new(what: &'static str) -> AcceptGuard {
        AcceptGuard {
            what,
            paused_until: None,
            failures: 0,
            over_cap: 0,
            hello_timeouts: 0,
            fail_log: LogLimit::default(),
            cap_log: LogLimit::default(),
        }
    }

    /// Whether accepting is paused.
    pub fn paused(&self) -> bool {
        self.paused_until.is_some()
    }

    /// `accept` failed with `e` at `now`: accepting pauses for [`PAUSE`] (the caller
    /// removes the listener from its epoll set). Logs at most once per interval.
    pub fn on_error(&mut self, e: &io::Error, now: Instant) {
        self.failures += 1;
        self.paused_until = Some(now + PAUSE);
        if let Some(suppressed) = self.fail_log.due(now) {
            let resource = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
            tracing::warn!(
                listener = self.what, error = %e, resource, suppressed, total = self.failures,
                pause_ms = PAUSE.as_millis() as u64, "accept failed; pausing accepts"
            );
        }
    }

    /// Whether the pause is over at `now` (once: the caller adds the listener back to
    /// its epoll set and accepts what is waiting).
    pub fn resume_due(&mut self, now: Instant) -> bool {
        match self.paused_until {
            Some(t) if now >= t => {
                self.paused_until = None;
                true
            }
            _ => false,
        }
    }

    /// A connection was accepted while `pending` were already waiting for their hello
    /// and the cap is `cap`: true (counted, logged at most once per interval) when the
    /// caller must first close the oldest waiting one.
    pub fn evict_oldest(&mut self, pending: usize, cap: usize, now: Instant) -> bool {
        if pending < cap {
            return false;
        }
        self.over_cap += 1;
        if let Some(suppressed) = self.cap_log.due(now) {
            tracing::warn!(
                listener = self.what,
                cap,
                suppressed,
                total = self.over_cap,
                "too many connections without hello; closing the oldest"
            );
        }
        true
    }

    /// A connection was closed for sending no hello within [`HELLO_TIMEOUT`].
    pub fn hello_timed_out(&mut self) {
        self.hello_timeouts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_pauses_and_resumes_once() {
        let t0 = Instant::now();
        let mut g = AcceptGuard::new("test");
        assert!(!g.paused());
        g.on_error(&io::Error::from_raw_os_error(libc::EMFILE), t0);
        assert!(g.paused());
        assert!(!g.resume_due(t0 + PAUSE - Duration::from_millis(1)));
        assert!(g.resume_due(t0 + PAUSE));
        assert!(!g.paused());
        assert!(!g.resume_due(t0 + PAUSE * 2), "resumes once");
    }

    #[test]
    fn log_lines_are_limited_per_interval_and_count_the_rest() {
        let t0 = Instant::now();
        let mut l = LogLimit::default();
        assert_eq!(l.due(t0), Some(0));
        for i in 1..=100 {
            assert_eq!(l.due(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(l.due(t0 + LOG_INTERVAL), Some(100));
        assert_eq!(l.due(t0 + LOG_INTERVAL), None);
    }

    #[test]
    fn beyond_the_pending_cap_the_oldest_is_evicted() {
        let t0 = Instant::now();
        let mut g = AcceptGuard::new("test");
        assert!(!g.evict_oldest(0, 2, t0));
        assert!(!g.evict_oldest(1, 2, t0));
        assert!(g.evict_oldest(2, 2, t0));
        assert!(g.evict_oldest(2, 2, t0));
        assert_eq!(g.over_cap, 2);
        let cap = pending_cap();
        assert!((8..=MAX_PENDING).contains(&cap));
    }
}
