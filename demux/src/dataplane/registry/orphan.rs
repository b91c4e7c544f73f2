//! One owner per port: a data plane with no open
//! control connection (its controller holds one for as long as it runs) and no live
//! instance for `--orphan-timeout` exits, removing its socket and ready files, so
//! its SO_REUSEPORT sockets stop taking datagrams meant for whoever serves the port
//! next. Off (`None`) for a standalone data plane unless asked for.

use super::{Conn, Registry};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub(super) struct Watch {
    pub timeout: Option<Duration>,
    /// Unattended (no control connection, no instance) since.
    since: Option<Instant>,
    /// Removed before exiting.
    pub files: Vec<PathBuf>,
}

impl Watch {
    pub fn new(timeout: Option<Duration>, files: Vec<PathBuf>) -> Watch {
        Watch { timeout, since: Some(Instant::now()), files }
    }
}

impl Registry {
    /// The epoll timeout that lets `check_orphan` run (ms; -1 when off).
    pub(super) fn orphan_wait_ms(&self) -> i32 {
        if self.orphan.timeout.is_some() {
            1000
        } else {
            -1
        }
    }

    /// Exits the process when unattended for longer than the timeout.
    pub(super) fn check_orphan(&mut self) {
        let Some(timeout) = self.orphan.timeout else { return };
        let attended = self.conns.values().any(|c| matches!(c, Conn::Control { .. } | Conn::Live { .. }));
        if attended {
            self.orphan.since = None;
            return;
        }
        let since = *self.orphan.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= timeout {
            for p in &self.orphan.files {
                let _ = std::fs::remove_file(p);
            }
            tracing::warn!(
                timeout_s = timeout.as_secs(),
                "no controller and no instance for --orphan-timeout: exiting to release the UDP port"
            );
            std::process::exit(0);
        }
    }
}
