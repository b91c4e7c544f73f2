//! Supervision, once per tick: the data plane (restarted on the same sockets with
//! exponential backoff), the spawned workers (a crashed one is replaced; the
//! replacement gets a new server id when it registers), the rolling reload (SIGHUP)
//! and the shutdown (SIGTERM); docs/operations.md "Lifecycle events".

use super::{procs, state, Ctl, Kind, Managed, Reload, ReloadStep, Shutdown, WorkerState};
use anyhow::Result;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Longest wait for a reload step's new worker to become ready.
const RELOAD_STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Data-plane restart backoff bounds; a data plane that ran this long resets it.
pub(super) const DP_BACKOFF_MIN: Duration = Duration::from_millis(200);
const DP_BACKOFF_MAX: Duration = Duration::from_secs(5);
const DP_STABLE: Duration = Duration::from_secs(10);
/// `--rejoin-grace-ms` of a restarted data plane: workers retry their data connection
/// with a backoff capped at 1 s (worker::datasock), so all are back well within 3 s.
pub const REJOIN_GRACE_MS: u32 = 3000;
/// Worker replacement backoff (a worker that dies within WORKER_STABLE doubles it,
/// one that lived longer resets it).
pub(super) const WORKER_BACKOFF_MIN: Duration = Duration::from_millis(500);
const WORKER_BACKOFF_MAX: Duration = Duration::from_secs(10);
const WORKER_STABLE: Duration = Duration::from_secs(5);

impl Ctl {
    /// One supervision pass; true when the controller should exit (shutdown done).
    pub(super) fn tick(&mut self) -> Result<bool> {
        if self.handover {
            // SIGUSR2: the data plane and the workers stay; the next controller adopts them.
            self.store_workers();
            tracing::info!(
                workers = self.workers.len(),
                "handed over: exiting without stopping the data plane and workers"
            );
            return Ok(true);
        }
        self.accept_tick(Instant::now());
        self.supervise_dataplane();
        self.keep_dataplane_link();
        self.supervise_workers();
        self.step_reload();
        let done = self.step_shutdown();
        self.publish_status();
        self.notify_systemd();
        Ok(done)
    }

    /// `READY=1` once a client can be served (the data plane runs and lists a
    /// placeable instance; with no spawned workers, once the data plane runs), and
    /// again when a reload is done; the watchdog ping (controller/systemd.rs).
    fn notify_systemd(&mut self) {
        self.sd.watchdog_tick();
        if !self.sd.enabled() || self.sd.is_ready() || self.shutdown.is_some() {
            return;
        }
        if self.reload.is_some() || self.dp.planned.is_some() || !self.serving() {
            return;
        }
        let line = super::systemd::status_line(&self.status_json(), None);
        self.sd.ready(&line);
    }

    /// Whether a client can be served now.
    fn serving(&self) -> bool {
        let dp_running = self.dp.proc.is_some() && (self.dp.adopted || self.paths.dataplane_ready().exists());
        if !dp_running {
            return false;
        }
        if self.opts.spawn_workers == 0 {
            return true;
        }
        // A worker says Ready to the data plane before it tells us: when we know of
        // one, ask the data plane whether it places connections on it yet.
        let any_ready = self.conns.values().any(|c| matches!(c.kind, Kind::Worker { state: WorkerState::Ready, .. }));
        any_ready
            && super::status::dataplane_status(&self.paths.dataplane_sock()).is_ok_and(|v| {
                v["instances"].as_array().is_some_and(|l| l.iter().any(|i| i["placeable"].as_bool() == Some(true)))
            })
    }

    /// SIGUSR2: exit at the next tick leaving the data plane and the workers running
    /// (what a crash does, on purpose): the next controller adopts them, so their
    /// connections survive (docs/operations.md "Running under systemd").
    pub(super) fn begin_handover(&mut self) {
        if self.shutdown.is_some() {
            tracing::warn!("SIGUSR2 ignored: shutting down already");
            return;
        }
        tracing::info!("SIGUSR2: handing the data plane and workers over to the next controller");
        self.sd.status("handing over to the next controller");
        self.handover = true;
    }

    fn supervise_dataplane(&mut self) {
        if self.dp.planned.as_ref().is_some_and(|p| p.started)
            && self.dp.proc.is_some()
            && self.paths.dataplane_ready().exists()
        {
            tracing::info!("the data plane runs with the new configuration");
            self.dp.planned = None;
        }
        if let Some(p) = self.dp.proc.as_mut() {
            if let Some(how) = p.poll_exit() {
                let pid = p.pid();
                self.dp.proc = None;
                if self.shutdown.is_some() {
                    tracing::info!(pid, how, "data plane stopped");
                    return;
                }
                if let Some(planned) = self.dp.planned.as_mut() {
                    if planned.started {
                        // The new options did not come up: back to the previous ones.
                        tracing::error!(
                            pid,
                            how,
                            "the data plane exited before it was ready with the new configuration; restarting it with \
                             the previous one"
                        );
                        self.dataplane_args = std::mem::take(&mut planned.previous_args);
                        self.dp_opts = planned.previous_opts.clone();
                        self.dp.planned = None;
                    } else {
                        tracing::info!(pid, how, "data plane stopped for the new configuration; starting the new one");
                    }
                    self.dp.last_exit = Some(how);
                    self.dp.restart_at = Some(Instant::now());
                    return;
                }
                let ran = self.dp.started.elapsed();
                self.dp.backoff =
                    if ran >= DP_STABLE { DP_BACKOFF_MIN } else { (self.dp.backoff * 2).min(DP_BACKOFF_MAX) };
                tracing::error!(
                    pid,
                    how,
                    ran_ms = ran.as_millis() as u64,
                    backoff_ms = self.dp.backoff.as_millis() as u64,
                    "data plane died; restarting it on the same sockets"
                );
                self.dp.last_exit = Some(how);
                self.dp.restart_at = Some(Instant::now() + self.dp.backoff);
            }
        }
        if self.dp.proc.is_none() && self.shutdown.is_none() {
            let due = match self.dp.restart_at {
                Some(t) => Instant::now() >= t,
                None => true,
            };
            if due {
                self.start_dataplane();
            }
        }
    }

    fn start_dataplane(&mut self) {
        let fds: Vec<RawFd> = self.udp.iter().map(|f| f.as_raw_fd()).collect();
        let _ = std::fs::remove_file(self.paths.dataplane_ready());
        let first = self.dp.restart_at.is_none();
        // A restarted data plane (or a first one while adopted workers run) holds the
        // orphans of ids that are not live yet while the workers rejoin, one by one
        // after their reconnect backoff (at most 1 s apart): no stateless resets of
        // their established connections meanwhile.
        let mut args = self.dataplane_args.clone();
        if !first || !self.workers.is_empty() {
            args.extend(["--rejoin-grace-ms".into(), self.rejoin_grace_ms.to_string()]);
        }
        match procs::spawn_dataplane(&self.exe, &fds, &args) {
            Ok(child) => {
                let pid = child.id();
                if let Some(p) = self.dp.planned.as_mut() {
                    p.started = true;
                }
                if let Err(e) = state::write_atomic(&self.paths.dataplane_pid(), &format!("{pid}\n")) {
                    tracing::warn!(error = %format!("{e:#}"), "could not write dataplane.pid (a controller restart will not adopt it)");
                }
                if !first {
                    self.dp.restarts += 1;
                }
                let n = format!("{}\n", self.dp.restarts);
                if let Err(e) = state::write_atomic(&self.paths.dataplane_restarts(), &n) {
                    tracing::warn!(error = %format!("{e:#}"), "could not write dataplane.restarts");
                }
                tracing::info!(pid, restarts = self.dp.restarts, "data plane started");
                self.dp.proc = Some(procs::Proc::Child(child));
                self.dp.adopted = false;
                self.dp.started = Instant::now();
                self.dp.restart_at = None;
            }
            Err(e) => {
                self.dp.backoff = (self.dp.backoff * 2).min(DP_BACKOFF_MAX);
                tracing::error!(error = %format!("{e:#}"), "could not start the data plane; retrying");
                self.dp.restart_at = Some(Instant::now() + self.dp.backoff);
            }
        }
    }

    fn supervise_workers(&mut self) {
        let mut changed = false;
        let mut i = 0;
        while i < self.workers.len() {
            let w = &mut self.workers[i];
            if let Some(how) = w.proc.poll_exit() {
                let pid = w.proc.pid();
                let expected = w.retiring || self.shutdown.is_some();
                let lived = w.spawned.elapsed();
                self.workers.remove(i);
                changed = true;
                if expected {
                    tracing::info!(pid, how, "worker exited");
                } else {
                    self.worker_replacements += 1;
                    if lived < WORKER_STABLE {
                        self.worker_backoff = (self.worker_backoff * 2).min(WORKER_BACKOFF_MAX);
                    } else {
                        self.worker_backoff = WORKER_BACKOFF_MIN;
                    }
                    self.next_worker_spawn = Instant::now() + self.worker_backoff;
                    tracing::error!(pid, how, "worker died; replacing it (the replacement gets a new server id)");
                }
                continue;
            }
            i += 1;
        }
        // Workers connect to the data plane right after registering: start them once
        // it runs.
        let dp_running = self.dp.proc.is_some() && (self.dp.adopted || self.paths.dataplane_ready().exists());
        if self.shutdown.is_none() && dp_running {
            while self.workers.iter().filter(|w| !w.retiring).count() < self.opts.spawn_workers
                && Instant::now() >= self.next_worker_spawn
            {
                match procs::spawn_worker(
                    &self.worker_bin,
                    &self.paths.control_sock(),
                    &self.opts.worker_args,
                    self.worker_user.as_ref(),
                ) {
                    Ok(child) => {
                        tracing::info!(pid = child.id(), "worker started");
                        self.workers.push(Managed {
                            proc: procs::Proc::Child(child),
                            spawned: Instant::now(),
                            retiring: false,
                            signaled: false,
                        });
                        changed = true;
                    }
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "could not start a worker");
                        self.next_worker_spawn = Instant::now() + self.worker_backoff;
                        break;
                    }
                }
            }
        }
        // More than --spawn-workers (a controller restarted with a smaller N adopted
        // the old ones): drain the newest extras — scale-in.
        if self.shutdown.is_none() && self.reload.is_none() {
            while self.workers.iter().filter(|w| !w.retiring).count() > self.opts.spawn_workers {
                let Some(w) = self.workers.iter_mut().rev().find(|w| !w.retiring) else { break };
                tracing::info!(pid = w.proc.pid(), "more workers than --spawn-workers: draining one");
                w.retiring = true;
                w.signaled = true;
                w.proc.signal(libc::SIGTERM);
                changed = true;
            }
        }
        if changed {
            self.store_workers();
        }
    }

    /// `DIR/workers`: the pids of the workers we supervise, for the next controller.
    fn store_workers(&self) {
        // `PID` or `PID retiring` (already told to drain: not counted, not replaced).
        let text: String = self
            .workers
            .iter()
            .map(|w| if w.signaled { format!("{} retiring\n", w.proc.pid()) } else { format!("{}\n", w.proc.pid()) })
            .collect();
        if let Err(e) = state::write_atomic(&self.paths.workers(), &text) {
            tracing::warn!(error = %format!("{e:#}"), "could not write the workers file");
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
                        tracing::info!(pid, "adopted a running worker");
                        self.workers.push(Managed { proc, spawned: Instant::now(), retiring, signaled: retiring });
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

    pub(super) fn begin_reload(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        if self.reload.is_some() {
            tracing::warn!("SIGHUP: a rolling reload is already running");
            return;
        }
        let queue: VecDeque<i32> = self.workers.iter().filter(|w| !w.retiring).map(|w| w.proc.pid()).collect();
        tracing::info!(workers = queue.len(), "SIGHUP: rolling reload");
        self.reload = Some(Reload { queue, step: None });
    }

    /// Whether every non-retiring spawned worker has registered and is ready.
    fn all_ready(&self) -> bool {
        self.workers.iter().filter(|w| !w.retiring).all(|w| {
            let pid = w.proc.pid() as u32;
            self.conns
                .values()
                .any(|c| matches!(c.kind, Kind::Worker { pid: p, state: WorkerState::Ready, .. } if p == pid))
        })
    }

    fn step_reload(&mut self) {
        let Some(mut r) = self.reload.take() else {
            return;
        };
        if self.shutdown.is_some() {
            return;
        }
        loop {
            match r.step {
                None => {
                    let Some(old) = r.queue.pop_front() else {
                        tracing::info!("rolling reload done");
                        return;
                    };
                    let Some(w) = self.workers.iter_mut().find(|w| w.proc.pid() == old) else {
                        continue;
                    };
                    // Retiring: the supervisor starts its replacement right away.
                    w.retiring = true;
                    r.step = Some(ReloadStep::AwaitReplacement { old, since: Instant::now() });
                    break;
                }
                Some(ReloadStep::AwaitReplacement { old, since }) => {
                    if self.all_ready()
                        && self.workers.iter().filter(|w| !w.retiring).count() >= self.opts.spawn_workers
                    {
                        if let Some(w) = self.workers.iter_mut().find(|w| w.proc.pid() == old) {
                            tracing::info!(pid = old, "reload: replacement ready; draining the old worker");
                            w.proc.signal(libc::SIGTERM);
                            w.signaled = true;
                        }
                        self.store_workers();
                        r.step = Some(ReloadStep::AwaitExit { old });
                    } else if since.elapsed() > RELOAD_STEP_TIMEOUT {
                        tracing::error!(pid = old, "reload: the replacement did not become ready; reload stopped");
                        if let Some(w) = self.workers.iter_mut().find(|w| w.proc.pid() == old) {
                            w.retiring = false;
                        }
                        return;
                    }
                    break;
                }
                Some(ReloadStep::AwaitExit { old }) => {
                    if self.workers.iter().any(|w| w.proc.pid() == old) {
                        break;
                    }
                    r.step = None;
                }
            }
        }
        self.reload = Some(r);
    }

    pub(super) fn begin_shutdown(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        tracing::info!(workers = self.workers.len(), "shutting down: draining the workers");
        self.sd.stopping(&format!("stopping: draining {} worker(s)", self.workers.len()));
        self.shutdown = Some(Shutdown {
            deadline: Instant::now() + Duration::from_secs(self.opts.drain_timeout) + Duration::from_secs(5),
            workers_signaled: false,
            dataplane_signaled: None,
        });
    }

    /// True when done: workers drained (or the deadline passed), data plane stopped.
    fn step_shutdown(&mut self) -> bool {
        let Some(s) = self.shutdown.as_mut() else {
            return false;
        };
        if !s.workers_signaled {
            for w in &mut self.workers {
                w.proc.signal(libc::SIGTERM);
                w.signaled = true;
            }
            s.workers_signaled = true;
        }
        if !self.workers.is_empty() {
            if Instant::now() < s.deadline {
                return false;
            }
            tracing::warn!(left = self.workers.len(), "drain deadline passed; killing the remaining workers");
            for w in &mut self.workers {
                w.proc.signal(libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(200));
            for w in &mut self.workers {
                let _ = w.proc.poll_exit();
            }
            self.workers.clear();
        }
        match (self.dp.proc.as_ref(), s.dataplane_signaled) {
            (Some(p), None) => {
                p.signal(libc::SIGTERM);
                s.dataplane_signaled = Some(Instant::now());
                return false;
            }
            (Some(p), Some(t)) => {
                if t.elapsed() < Duration::from_secs(5) {
                    return false;
                }
                p.signal(libc::SIGKILL);
                std::thread::sleep(Duration::from_millis(100));
            }
            (None, _) => {}
        }
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
        true
    }
}
