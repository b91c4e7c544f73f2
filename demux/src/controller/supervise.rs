//! Supervision, once per tick: feeds the lifecycle (`lifecycle.rs`) what happened
//! to the processes (exits, the data plane's ready file, what it places on),
//! starts the data plane and workers when it asks for them, and carries out what
//! it says (signals, kills, state files, and the notifications to systemd in
//! [`Ctl::became`]); docs/operations.md "Lifecycle events".

use super::lifecycle::{Became, Event, Output, Refused};
use super::{procs, state, Ctl};
use anyhow::Result;
use proto::wire::Admin;
use serde_json::Value;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// `--rejoin-grace-ms` of a restarted data plane: workers retry their data connection
/// with a backoff capped at 1 s (worker::datasock), so all are back well within 3 s.
pub const REJOIN_GRACE_MS: u32 = 3000;
/// How long killed processes get to die before they are reaped.
const KILL_WAIT: Duration = Duration::from_millis(200);
/// Longest wait for the data plane's status while the controller checks that it
/// places on every worker (`Event::DataPlanePlaces`): the loop is not held up for
/// longer, and an answer that is late is asked for again at the next tick.
const PLACES_TIMEOUT: Duration = Duration::from_millis(100);

impl Ctl {
    /// One supervision pass; true when the controller should exit (shutdown done,
    /// or handed over).
    pub(super) fn tick(&mut self) -> Result<bool> {
        if self.lc.handed_over() {
            // SIGUSR2: the data plane and the workers stay; the next controller adopts
            // them (DIR/dataplane.pid, DIR/workers stay too).
            self.store_workers();
            if self.upgrade_execs() {
                // An upgrade's last step: the next controller is the new binary, in
                // this very process. Only a failed exec comes back.
                let e = self.exec_new_controller();
                tracing::error!(error = %format!("{e:#}"), "upgrade: exiting; the data plane and the workers run on");
                return Ok(true);
            }
            tracing::info!(summary = %self.lc.summary(), "handed over: exiting; the data plane and the workers run on");
            return Ok(true);
        }
        let now = Instant::now();
        self.sd.watchdog_tick();
        self.accept_tick(now);
        self.poll_exits();
        self.supervise_dataplane();
        self.keep_dataplane_link();
        self.spawn_workers();
        self.check_placeable();
        self.lifecycle(Event::Tick);
        self.upgrade_tick(now);
        self.store_workers();
        self.publish_status();
        let done = self.lc.is_done();
        if done {
            self.remove_state_files();
        }
        Ok(done)
    }

    /// Feeds one event to the lifecycle and carries out its outputs; false when it
    /// was refused (already logged and counted). A refused event that carried a
    /// process we started: that process is not wanted, so it is stopped rather than
    /// left unsupervised.
    pub(super) fn lifecycle(&mut self, ev: Event<procs::Proc>) -> bool {
        match self.lc.handle(Instant::now(), ev) {
            Ok(outputs) => {
                for o in outputs {
                    self.carry_out(o);
                }
                true
            }
            Err(Refused { event: Event::DataPlaneSpawned(p) | Event::WorkerSpawned(p), .. }) => {
                p.signal(libc::SIGTERM);
                false
            }
            Err(_) => false,
        }
    }

    fn carry_out(&mut self, o: Output<procs::Proc>) {
        match o {
            Output::Signal { pid, sig } => {
                // SAFETY: kill(2) on a pid the lifecycle holds (our child, not yet
                // reaped, or an adopted process watched through its pidfd).
                unsafe { libc::kill(pid, sig) };
            }
            Output::Kill(mut procs) => {
                for p in &procs {
                    p.signal(libc::SIGKILL);
                }
                std::thread::sleep(KILL_WAIT);
                for p in &mut procs {
                    let _ = p.poll_exit();
                }
            }
            Output::Became(b) => self.became(b),
        }
    }

    /// The moments a service manager cares about (lifecycle::Became): the one
    /// place that notifies systemd (controller/systemd.rs), with the lifecycle's
    /// summary as `STATUS=`.
    fn became(&mut self, b: Became) {
        let summary = self.lc.summary();
        match b {
            Became::DataPlaneStarted { pid, restarts } => {
                if let Err(e) = state::write_atomic(&self.paths.dataplane_pid(), &format!("{pid}\n")) {
                    tracing::warn!(error = %format!("{e:#}"), "could not write dataplane.pid (a controller restart will not adopt it)");
                }
                if let Err(e) = state::write_atomic(&self.paths.dataplane_restarts(), &format!("{restarts}\n")) {
                    tracing::warn!(error = %format!("{e:#}"), "could not write dataplane.restarts");
                }
                tracing::info!(pid, restarts, "data plane started");
            }
            // A client can be served.
            Became::Placeable => {
                self.sd.ready(&summary);
                self.upgrade_finished();
            }
            Became::ReloadStarted => self.sd.reloading(&summary),
            // Ready again, unless it never was (then Placeable says it).
            Became::ReloadDone | Became::ReloadStopped if self.lc.told_placeable() => self.sd.ready(&summary),
            Became::ShuttingDown => self.sd.stopping(&summary),
            Became::HandingOver => self.sd.status(&summary),
            Became::ReloadDone | Became::ReloadStopped | Became::Stopped => {}
        }
        tracing::debug!(?b, %summary, "lifecycle");
    }

    /// While the lifecycle waits to tell Placeable: asks the data plane (bounded by
    /// PLACES_TIMEOUT) which server ids it places new connections on. A worker says
    /// Ready to the data plane before it tells the controller, but the data plane
    /// places on it only once its data connection is up and it is not stalled.
    fn check_placeable(&mut self) {
        if !self.lc.placeable_check_wanted() {
            return;
        }
        let asked = sys::control::connect(&self.paths.dataplane_sock()).and_then(|fd| {
            let s = socket2::SockRef::from(&fd);
            s.set_read_timeout(Some(PLACES_TIMEOUT))?;
            s.set_write_timeout(Some(PLACES_TIMEOUT))?;
            sys::control::request_on(fd.as_fd(), &[&Admin::StatusRequest])
        });
        let status = match asked {
            Ok(sys::control::Reply { msg: Admin::Status { json }, .. }) => serde_json::from_str::<Value>(&json),
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "the data plane's status (is it placing on the workers?)");
                return;
            }
        };
        let Ok(status) = status else { return };
        let server_ids: Vec<u16> = status["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["placeable"].as_bool() == Some(true))
            .filter_map(|i| i["server_id"].as_u64().and_then(|id| u16::try_from(id).ok()))
            .collect();
        self.lifecycle(Event::DataPlanePlaces { server_ids });
    }

    /// Child exits, reported to the lifecycle.
    fn poll_exits(&mut self) {
        use super::lifecycle::DataPlaneKind;
        let mut exits = Vec::new();
        if let Some(how) = self.lc.dataplane_proc_mut().and_then(|p| p.poll_exit()) {
            let starting = self.lc.dataplane().kind() == DataPlaneKind::Starting;
            self.upgrade_exit(starting, None, &how);
            exits.push(Event::DataPlaneExited(how));
        }
        let mut workers = Vec::new();
        for (id, p) in self.lc.worker_procs_mut() {
            if let Some(how) = p.poll_exit() {
                workers.push((p.pid() as u32, how.clone()));
                exits.push(Event::WorkerExited { id, how });
            }
        }
        for (pid, how) in workers {
            self.upgrade_exit(false, Some(pid), &how);
        }
        for e in exits {
            self.lifecycle(e);
        }
    }

    /// The data plane's ready file appearing is its move to Running (the one place
    /// the controller looks at it); a due (re)start is made.
    fn supervise_dataplane(&mut self) {
        use super::lifecycle::DataPlaneKind;
        if self.lc.dataplane().kind() == DataPlaneKind::Starting && self.paths.dataplane_ready().exists() {
            self.lifecycle(Event::DataPlaneReady);
        }
        let Some(rejoin_grace) = self.lc.dataplane_start_due(Instant::now()) else { return };
        let fds: Vec<RawFd> = self.udp.iter().map(|f| f.as_raw_fd()).collect();
        let _ = std::fs::remove_file(self.paths.dataplane_ready());
        // A restarted data plane (or a first one while adopted workers run) holds the
        // orphans of ids that are not live yet while the workers rejoin, one by one
        // after their reconnect backoff (at most 1 s apart): no stateless resets of
        // their established connections meanwhile.
        // The options name the executable first (controller::dataplane_options).
        let (exe, options) = match self.lc.dataplane_options().split_first() {
            Some((exe, rest)) => (std::path::PathBuf::from(exe), rest.to_vec()),
            None => (self.exe.clone(), Vec::new()),
        };
        let mut args = options;
        args.extend(super::log_args(&self.log));
        if rejoin_grace {
            args.extend(["--rejoin-grace-ms".into(), self.rejoin_grace_ms.to_string()]);
        }
        match procs::spawn_dataplane(&exe, &fds, &args) {
            Ok(child) => self.lifecycle(Event::DataPlaneSpawned(procs::Proc::Child(child))),
            Err(e) => self.lifecycle(Event::DataPlaneSpawnFailed(format!("{e:#}"))),
        };
    }

    /// Workers connect to the data plane right after registering: the lifecycle
    /// wants them only once it runs.
    fn spawn_workers(&mut self) {
        while self.lc.worker_wanted(Instant::now()) {
            match procs::spawn_worker(
                &self.worker_bin,
                &self.paths.control_sock(),
                &self.opts.worker_args,
                self.worker_user.as_ref(),
            ) {
                Ok(child) => {
                    tracing::info!(pid = child.id(), "worker started");
                    self.upgrade_worker_started(child.id());
                    self.lifecycle(Event::WorkerSpawned(procs::Proc::Child(child)));
                }
                Err(e) => {
                    self.lifecycle(Event::WorkerSpawnFailed(format!("{e:#}")));
                    break;
                }
            }
        }
    }

    /// `DIR/workers`: the pids of the workers we supervise, for the next controller
    /// (written when it changes).
    fn store_workers(&mut self) {
        let text = self.lc.workers_file();
        if self.workers_file.as_ref() == Some(&text) {
            return;
        }
        match state::write_atomic(&self.paths.workers(), &text) {
            Ok(()) => self.workers_file = Some(text),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "could not write the workers file"),
        }
    }

    /// At start: the previous controller's spawned workers (DIR/workers). With the
    /// data plane adopted they are adopted too (they re-register with Rejoin);
    /// otherwise they send on sockets nobody reads any more: drain them.
    pub(super) fn take_over_workers(&mut self) {
        let text = state::read_private(&self.paths.workers()).ok().flatten().unwrap_or_default();
        let control = self.paths.control_sock();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let Some(pid) = it.next().and_then(|p| p.parse::<i32>().ok()) else { continue };
            let retiring = it.next() == Some("retiring");
            if !state::pid_alive(pid) || !procs::is_our_worker(pid, &control) {
                continue;
            }
            if self.adopted_sockets {
                match procs::Proc::adopt(pid) {
                    Ok(proc) => {
                        self.lifecycle(Event::WorkerAdopted { proc, retiring });
                    }
                    Err(e) => tracing::warn!(pid, error = %e, "could not adopt a worker"),
                }
            } else {
                tracing::warn!(pid, "a worker of the previous controller runs on sockets that are gone; draining it");
                // SAFETY: kill(2); the pid was checked to be one of our workers.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        self.store_workers();
    }

    /// SIGUSR2: exit at the next tick leaving the data plane and the workers running
    /// (what a crash does, on purpose): the next controller adopts them, so their
    /// connections survive (docs/operations.md "Running under systemd").
    pub(super) fn begin_hand_over(&mut self) {
        self.lifecycle(Event::HandOver);
    }

    /// SIGTERM / SIGINT: drain the workers, stop the data plane, exit.
    pub(super) fn begin_shutdown(&mut self) {
        self.lifecycle(Event::Shutdown);
    }

    fn remove_state_files(&self) {
        for p in [
            self.paths.dataplane_pid(),
            self.paths.dataplane_restarts(),
            self.paths.workers(),
            super::trust::registrations_path(&self.paths),
            self.paths.controller_pid(),
            self.paths.control_sock(),
        ] {
            let _ = std::fs::remove_file(p);
        }
        tracing::info!("controller stopped");
    }
}
