//! SIGHUP (`systemctl reload`, docs/operations.md "Configuration"): re-read
//! `--config` with the command line the controller started with, apply what can
//! change while it runs, then replace the workers one at a time (the rolling
//! reload, as without a file).
//!
//! - Applied at once: `workers.count`, `controller.drain_timeout`,
//!   `controller.rotate_every`, `controller.rejoin_grace_ms`, `log.level` (the
//!   controller's own filter).
//! - Applied by the rolling reload (new workers get them): every other `[workers]`
//!   key (`bin`, `cert`, `args`, …, `cid_lifetime`), and `log.level` for workers.
//! - Applied by restarting the data plane on the same sockets (what a data-plane
//!   restart keeps: established connections, docs/operations.md "Lifecycle
//!   events"): `[dataplane]` but `cores`, `[fast_path]`, `[limits]`, `[retry]`,
//!   `[pressure]`, `hosts.peers`/`hosts.peer_listen`, `controller.orphan_timeout`.
//!   The restart is the lifecycle's (`Event::RestartDataPlane`, lifecycle.rs): it
//!   holds the previous options, and if the new data plane exits before it is ready
//!   they come back (logged); it refuses a second restart while one is under way,
//!   and then nothing of the file applies. The peers file's content is re-read
//!   without a restart: the controller passes SIGHUP on to a running data plane.
//! - Need a restart, logged per key and left as they were: `controller.state_dir`,
//!   `listen.addresses`, `dataplane.cores`, `hosts.bits`, `hosts.id`,
//!   `workers.user`, `controller.metrics`, `log.format`.
//!
//! A file that does not parse or check changes nothing, and the workers are not
//! reloaded: the error is logged with its key and line.

use super::lifecycle::Event;
use super::{add_worker_contract_args, dataplane_options, plan, supervise, Ctl};
use anyhow::{bail, Result};
use std::fmt::Debug;
use std::time::Duration;

/// Keeps `*new` as `old` when they differ, logging the key: it needs a restart.
fn needs_restart<T: PartialEq + Clone + Debug>(key: &str, flag: &str, new: &mut T, old: &T) -> bool {
    if new == old {
        return false;
    }
    tracing::warn!(
        key, flag, running = ?old, configured = ?new,
        "SIGHUP: this setting needs a restart of the service (systemctl restart); it stays as it is until then"
    );
    *new = old.clone();
    true
}

impl Ctl {
    /// SIGHUP: re-read the configuration file (with `--config`), then the rolling
    /// reload (lifecycle `Event::Reload`). Nothing while shutting down or handing over.
    pub(super) fn on_sighup(&mut self) {
        if !self.lc.accepts_registrations() {
            tracing::warn!(phase = self.lc.phase().kind().name(), "SIGHUP ignored");
            return;
        }
        if self.upgrade.is_some() {
            tracing::warn!("SIGHUP ignored: an upgrade is under way (reload once it is done)");
            return;
        }
        if self.opts.config.is_some() {
            if let Err(e) = self.reconfigure() {
                tracing::error!(
                    error = %format!("{e:#}"),
                    "SIGHUP: the configuration file was not applied (nothing changed, no worker replaced); fix it \
                     (demux check-config) and reload again"
                );
                return;
            }
        }
        // The data plane re-reads its --peers file on SIGHUP (and the key file, which
        // is the controller's own: no rotation runs while this loop handles a
        // signal). One being replaced is not: the new one reads them as it starts.
        if let Some(pid) = self.lc.dataplane_running() {
            // SAFETY: kill(2) on the running data plane's pid (our child, not yet
            // reaped, or an adopted process watched through its pidfd).
            unsafe { libc::kill(pid, libc::SIGHUP) };
        }
        self.lifecycle(Event::Reload);
    }

    /// Re-reads and applies the configuration (the module's list). An error changes
    /// nothing: the one step that can be refused (the data plane's restart with new
    /// options, by the lifecycle) comes before every change.
    fn reconfigure(&mut self) -> Result<()> {
        let (mut dp, mut opts, mut log) = crate::config::reread(&self.opts.argv)?;
        needs_restart("controller.state_dir", "--state-dir", &mut opts.state_dir, &self.opts.state_dir);
        needs_restart("listen.addresses", "--listen", &mut dp.listen, &self.dp_opts.listen);
        needs_restart("dataplane.cores", "--cores", &mut dp.cores, &self.dp_opts.cores);
        needs_restart("hosts.bits", "--host-bits", &mut dp.host_bits, &self.dp_opts.host_bits);
        needs_restart("hosts.id", "--host-id", &mut dp.host_id, &self.dp_opts.host_id);
        needs_restart("workers.user", "--worker-user", &mut opts.worker_user, &self.opts.worker_user);
        needs_restart("controller.metrics", "--metrics", &mut dp.metrics, &self.dp_opts.metrics);
        needs_restart("log.format", "--log-format", &mut log.log_format, &self.log.log_format);
        let plan = plan(&dp, &opts)?;
        opts.rotate_every = plan.rotate_every;
        opts.argv = self.opts.argv.clone();
        add_worker_contract_args(&mut opts, &dp, &log);

        let options = dataplane_options(&self.exe, &dp, &self.paths, self.worker_user.as_ref());
        if options != *self.lc.dataplane_options() {
            let changed: Vec<&String> = options.iter().filter(|a| !self.lc.dataplane_options().contains(a)).collect();
            tracing::info!(?changed, "SIGHUP: new data-plane options");
            if !self.lifecycle(Event::RestartDataPlane { options }) {
                bail!("the data plane cannot restart with new options now (the refusal is logged above)");
            }
        }
        if log.log_level != self.log.log_level {
            match self.logging.set_level(log.log_level.as_deref()) {
                Ok(()) => tracing::info!(
                    level = %self.logging.level(),
                    "SIGHUP: log level (new workers and the next data plane get it too)"
                ),
                Err(e) => tracing::warn!(error = %e, "SIGHUP: log level not changed"),
            }
        }
        if opts.worker_args != self.opts.worker_args || plan.worker_bin != self.worker_bin {
            tracing::info!(bin = %plan.worker_bin.display(), args = ?opts.worker_args, "SIGHUP: new workers start with");
        }
        let drain_timeout = Duration::from_secs(opts.drain_timeout);
        self.lifecycle(Event::Configure { spawn_workers: opts.spawn_workers, drain_timeout });
        self.rejoin_grace_ms = dp.rejoin_grace_ms.unwrap_or(supervise::REJOIN_GRACE_MS);
        self.dp_opts = dp;
        self.worker_bin = plan.worker_bin;
        self.opts = opts;
        self.log = log;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_needs_a_restart_is_kept() {
        let mut new = vec![1, 2];
        assert!(needs_restart("listen.addresses", "--listen", &mut new, &vec![1]));
        assert_eq!(new, vec![1]);
        let mut same = 5;
        assert!(!needs_restart("hosts.id", "--host-id", &mut same, &5));
    }
}
