//! The controller under systemd (`Type=notify`, docs/operations.md "Running under
//! systemd"), through the sd-notify crate (sd_notify(3)). Every call is a no-op
//! without `NOTIFY_SOCKET`.
//!
//! When each is sent is the lifecycle's (controller/lifecycle.rs `Became`, carried
//! out in `Ctl::became`, supervise.rs):
//!
//! - `READY=1` once a client can be served (`Placeable`: the data plane runs, every
//!   `--spawn-workers` worker said Ready, and the data plane places new
//!   connections on each; with no spawned workers, once the data plane runs);
//!   again when a reload is done or stopped.
//! - `RELOADING=1` with `MONOTONIC_USEC=` when a rolling reload starts (SIGHUP).
//! - `STOPPING=1` when the shutdown (drain) begins.
//! - `STATUS=` the lifecycle's one-line summary: with each of the above, and every
//!   [`STATUS_EVERY`] from a thread of its own with the datagram rate.
//! - `WATCHDOG=1` every half `WATCHDOG_USEC`, from the controller's loop (a stuck
//!   loop stops the pings and systemd restarts the controller).
//! - `FDSTORE=1` with each UDP socket, `FDNAME=udp-SHARD-ADDR` (activation.rs).
//!
//! Only the controller talks to systemd (`NotifyAccess=main`): the processes it
//! starts get none of these variables ([`MAIN_ONLY_ENV`]).

use super::activation;
use anyhow::{Context, Result};
use sd_notify::NotifyState;
use serde_json::Value;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the status thread refreshes `STATUS=`.
pub const STATUS_EVERY: Duration = Duration::from_secs(5);

/// Environment meant for the controller only: removed from every child's.
pub const MAIN_ONLY_ENV: &[&str] =
    &["NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC"];

/// The controller's side of the notification protocol.
pub struct Notifier {
    enabled: bool,
    watchdog: Option<Duration>,
    last_ping: Instant,
}

impl Notifier {
    /// From the environment systemd gave this process.
    pub fn from_env() -> Notifier {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some_and(|v| !v.is_empty());
        let watchdog = sd_notify::watchdog_enabled().filter(|d| !d.is_zero());
        if enabled {
            tracing::info!(watchdog_ms = watchdog.map(|d| d.as_millis() as u64), "notifying systemd");
        }
        Notifier { enabled, watchdog, last_ping: Instant::now() }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn send(&self, states: &[NotifyState]) {
        if !self.enabled {
            return;
        }
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!(error = %e, "sd_notify failed");
        }
    }

    /// `READY=1` with a `STATUS=`.
    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=` (CLOCK_MONOTONIC now), sd_notify(3).
    pub fn reloading(&self, status: &str) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now, NotifyState::Status(status)]),
            Err(_) => self.send(&[NotifyState::Reloading, NotifyState::Status(status)]),
        }
    }

    /// `STOPPING=1`.
    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }

    /// `STATUS=`.
    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// `WATCHDOG=1` when half the watchdog interval has passed since the last one.
    pub fn watchdog_tick(&mut self) {
        let Some(every) = self.watchdog else { return };
        if self.last_ping.elapsed() >= every / 2 {
            self.send(&[NotifyState::Watchdog]);
            self.last_ping = Instant::now();
        }
    }

    /// `FDSTORE=1`: every shard socket under its [`activation::store_name`], one
    /// message each. systemd ignores a socket it already stores.
    pub fn store_fds(&self, fds: &[OwnedFd], addrs: &[SocketAddr], per_shard: usize) {
        if !self.enabled {
            return;
        }
        for (i, (fd, addr)) in fds.iter().zip(addrs).enumerate() {
            let name = activation::store_name(i / per_shard.max(1), *addr);
            let states = [NotifyState::FdStore, NotifyState::FdName(&name)];
            if let Err(e) = sd_notify::notify_with_fds(&states, &[fd.as_fd()]) {
                tracing::warn!(error = %e, %name, "FDSTORE failed: a restart of the service will open this socket anew");
            }
        }
    }

    /// `FDSTOREREMOVE=1` for each name (sockets no shard serves any more).
    pub fn forget_fds(&self, names: &[String]) {
        for name in names {
            self.send(&[NotifyState::FdStoreRemove, NotifyState::FdName(name)]);
        }
    }
}

/// Starts the thread that refreshes `STATUS=` every [`STATUS_EVERY`] from the
/// controller's status JSON and the data plane's counters.
pub fn spawn_status(status: Arc<Mutex<Value>>, dataplane_sock: PathBuf) -> Result<()> {
    std::thread::Builder::new()
        .name("sd-status".into())
        .spawn(move || {
            let mut last: Option<(Instant, u64)> = None;
            loop {
                std::thread::sleep(STATUS_EVERY);
                let ctl = status.lock().map(|g| g.clone()).unwrap_or(Value::Null);
                let received = super::status::dataplane_status(&dataplane_sock).ok().map(|dp| datagrams_received(&dp));
                let now = Instant::now();
                let rate = match (last, received) {
                    (Some((t, before)), Some(n)) if n >= before => {
                        Some((n - before) as f64 / now.duration_since(t).as_secs_f64().max(1e-3))
                    }
                    _ => None,
                };
                last = received.map(|n| (now, n));
                if let Err(e) = sd_notify::notify(&[NotifyState::Status(&status_line(&ctl, rate))]) {
                    tracing::debug!(error = %e, "sd_notify STATUS failed");
                }
            }
        })
        .context("spawning the systemd status thread")?;
    Ok(())
}

/// Datagrams the data plane received: through its shards and straight to the
/// workers by the kernel fast path.
pub fn datagrams_received(dp: &Value) -> u64 {
    dp["datagrams_in"].as_u64().unwrap_or(0) + dp["fast_path"]["datagrams"].as_u64().unwrap_or(0)
}

/// The periodic `STATUS=`: the lifecycle's summary from the controller's status
/// JSON (`demux status --json`, `summary`) and the datagram rate when known:
/// `serving; data plane running (pid 812); workers 2 ready of 2 (want 2); 1234
/// datagrams/s`.
pub fn status_line(ctl: &Value, datagrams_per_sec: Option<f64>) -> String {
    let summary = ctl["summary"].as_str().unwrap_or("starting");
    match datagrams_per_sec {
        Some(r) => format!("{summary}; {r:.0} datagrams/s"),
        None => summary.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_line_is_the_summary_and_the_rate() {
        let ctl = json!({ "summary": "serving; data plane running (pid 7); workers 2 ready of 3 (want 3)" });
        assert_eq!(
            status_line(&ctl, Some(1234.4)),
            "serving; data plane running (pid 7); workers 2 ready of 3 (want 3); 1234 datagrams/s"
        );
        assert_eq!(status_line(&ctl, None), "serving; data plane running (pid 7); workers 2 ready of 3 (want 3)");
        assert_eq!(status_line(&json!(null), None), "starting");
        let dp = json!({"datagrams_in": 10, "fast_path": {"datagrams": 5}});
        assert_eq!(datagrams_received(&dp), 15);
    }
}
