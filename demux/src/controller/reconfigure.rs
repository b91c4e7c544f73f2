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
//!   If the new data plane exits before it is ready, the previous options come back
//!   (logged). The peers file's content is re-read without a restart: the
//!   controller passes SIGHUP on to its data plane.
//! - Need a restart, logged per key and left as they were: `controller.state_dir`,
//!   `listen.addresses`, `dataplane.cores`, `hosts.bits`, `hosts.id`,
//!   `workers.user`, `controller.metrics`, `log.format`.
//!
//! A file that does not parse or check changes nothing, and the workers are not
//! reloaded: the error is logged with its key and line.

use super::{add_worker_contract_args, full_dataplane_args, plan, supervise, Ctl, Planned};
use anyhow::Result;
use std::fmt::Debug;

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

/// The arguments but `--log-level` (a new level alone does not restart the data plane).
fn without_log_level(args: &[String]) -> Vec<&String> {
    args.iter().filter(|a| !a.starts_with("--log-level")).collect()
}

impl Ctl {
    /// SIGHUP.
    pub(super) fn on_sighup(&mut self) {
        if self.shutdown.is_some() || self.handover {
            return;
        }
        self.sd.reloading("reloading: re-reading the configuration; replacing the workers one at a time");
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
        // is the controller's own: no rotation runs while this loop handles a signal).
        if self.dp.planned.is_none() {
            if let Some(p) = &self.dp.proc {
                p.signal(libc::SIGHUP);
            }
        }
        self.begin_reload();
    }

    /// Re-reads and applies the configuration (the module's list).
    fn reconfigure(&mut self) -> Result<()> {
        if self.dp.planned.is_some() {
            anyhow::bail!("the data plane is still restarting for the previous reload; reload again once it runs");
        }
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

        if log.log_level != self.log.log_level {
            self.logging.set_level(log.log_level.as_deref()).map_err(anyhow::Error::msg)?;
            tracing::info!(level = %self.logging.level(), "SIGHUP: log level (new workers and the next data plane get it too)");
        }
        if opts.spawn_workers != self.opts.spawn_workers {
            tracing::info!(from = self.opts.spawn_workers, to = opts.spawn_workers, "SIGHUP: workers.count");
        }
        if opts.worker_args != self.opts.worker_args || plan.worker_bin != self.worker_bin {
            tracing::info!(bin = %plan.worker_bin.display(), args = ?opts.worker_args, "SIGHUP: new workers start with");
        }
        let new_args = full_dataplane_args(&dp, &log, &self.paths, self.worker_user.as_ref());
        if without_log_level(&new_args) != without_log_level(&self.dataplane_args) {
            let added: Vec<&String> = new_args.iter().filter(|a| !self.dataplane_args.contains(a)).collect();
            tracing::info!(changed = ?added, "SIGHUP: new data-plane options: restarting the data plane on the same sockets");
            let previous_args = std::mem::replace(&mut self.dataplane_args, new_args);
            self.dp.planned = Some(Planned { previous_args, previous_opts: self.dp_opts.clone(), started: false });
            if let Some(p) = &self.dp.proc {
                p.signal(libc::SIGTERM);
            }
        } else {
            self.dataplane_args = new_args;
        }
        self.dp_opts = dp;
        self.rejoin_grace_ms = self.dp_opts.rejoin_grace_ms.unwrap_or(supervise::REJOIN_GRACE_MS);
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

    #[test]
    fn a_log_level_alone_is_no_data_plane_change() {
        let a: Vec<String> = ["--cores", "0", "--log-level=info"].map(String::from).to_vec();
        let b: Vec<String> = ["--cores", "0", "--log-level=debug"].map(String::from).to_vec();
        assert_eq!(without_log_level(&a), without_log_level(&b));
    }
}
