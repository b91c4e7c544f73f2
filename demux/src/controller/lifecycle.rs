//! The controller's lifecycle state, and the only code that changes it
//! (docs/architecture.md "The controller", docs/operations.md "Lifecycle events"):
//!
//! - [`DataPlane`]: `Backoff` → `Starting` → `Running` → (exit) `Backoff` …; at
//!   shutdown `Stopping` → `Stopped`. Adoption is a way into `Running`. A restart
//!   with new options (SIGHUP with a changed configuration) is `Running` →
//!   `Replacing` → (exit) `Backoff` → `Starting` → `Running`, and the states on
//!   that way hold the previous options: a new data plane that exits before it is
//!   ready is started again with them (rollback).
//! - [`Worker`] / [`WorkerPhase`]: one record per worker, whether this controller
//!   spawned (or adopted) its process or it registered by itself: `Spawned` →
//!   `Registered` → `Ready` → `Draining` (said by the worker) or `Retiring` (told by
//!   the controller) → `Exited`.
//! - [`Phase`]: the controller's own `Serving`, `Reloading` (SIGHUP),
//!   `ShuttingDown` (SIGTERM), `HandingOver` (SIGUSR2: it exits and leaves the data
//!   plane and the workers running for the next controller).
//!
//! Events go in ([`Lifecycle::handle`]): signals, child exits, the data plane's
//! readiness and what it says it places on, registrations and what workers say on
//! them, and the supervision tick. What the controller must do and the moments a
//! service manager cares about come out ([`Output`], [`Became`]). This module
//! starts no process, sends no signal and touches no file, so every transition is
//! tested without processes (`lifecycle/tests.rs`).
//!
//! Every move goes through a `move_to_*` method that refuses an illegal move
//! ([`Illegal`]) and leaves the state as it was; an event the state does not take is
//! refused ([`Refused`]: logged, counted, and handed back with whatever it carried,
//! so a process handle is never lost). Nothing here panics.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// Longest wait for a reload step's new worker to become ready.
pub(super) const RELOAD_STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Data-plane restart backoff bounds; a data plane that ran this long resets it.
pub(super) const DP_BACKOFF_MIN: Duration = Duration::from_millis(200);
pub(super) const DP_BACKOFF_MAX: Duration = Duration::from_secs(5);
pub(super) const DP_STABLE: Duration = Duration::from_secs(10);
/// Worker replacement backoff (a worker that dies within WORKER_STABLE doubles it,
/// one that lived longer resets it).
pub(super) const WORKER_BACKOFF_MIN: Duration = Duration::from_millis(500);
pub(super) const WORKER_BACKOFF_MAX: Duration = Duration::from_secs(10);
pub(super) const WORKER_STABLE: Duration = Duration::from_secs(5);
/// SIGTERM: the workers get `--drain-timeout` plus this before they are killed.
pub(super) const DRAIN_MARGIN: Duration = Duration::from_secs(5);
/// SIGTERM: a data plane told to stop is killed after this long.
pub(super) const DP_STOP_GRACE: Duration = Duration::from_secs(5);

/// A process the lifecycle holds: the data plane or a worker. Only its pid is read
/// here; the controller polls it for its exit and reports that as an event.
pub(crate) trait Process {
    fn pid(&self) -> i32;
}

impl Process for super::procs::Proc {
    fn pid(&self) -> i32 {
        super::procs::Proc::pid(self)
    }
}

/// A move a state machine does not make. The state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Illegal {
    pub what: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

impl fmt::Display for Illegal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cannot go from {} to {}", self.what, self.from, self.to)
    }
}

// ---------------------------------------------------------------- data plane

/// The data plane's command line, but the inherited sockets and what the
/// controller adds at each start (`--rejoin-grace-ms`, the log flags): the options
/// a restart with new options changes, and a rollback brings back.
pub(crate) type Options = Vec<String>;

/// The data plane's state, without its payload (status names, the transition table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum DataPlaneKind {
    Backoff,
    Starting,
    Running,
    Replacing,
    Stopping,
    Stopped,
}

impl DataPlaneKind {
    /// The name in the status JSON (`dataplane.state`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            DataPlaneKind::Backoff => "restarting",
            DataPlaneKind::Starting => "starting",
            DataPlaneKind::Running => "running",
            DataPlaneKind::Replacing => "replacing",
            DataPlaneKind::Stopping => "stopping",
            DataPlaneKind::Stopped => "stopped",
        }
    }
}

/// The data plane, a supervised child on the controller's sockets.
///
/// `rollback`: the options of the data plane that ran before a restart with new
/// options. They stay with the restart until a data plane with the new options is
/// ready (then they go) or exits before (then they are the options again).
pub(crate) enum DataPlane<P> {
    /// Not running; (re)started once `until` has passed. `first`: no data plane has
    /// run on these sockets yet, so its start is not a restart.
    Backoff { until: Instant, first: bool, rollback: Option<Options> },
    /// Spawned; not ready yet (its ready file has not appeared).
    Starting { proc: P, since: Instant, rollback: Option<Options> },
    /// Ready, or adopted from the previous controller: workers start, and the
    /// controller holds its link. `since`: when it was started or adopted.
    Running { proc: P, since: Instant, adopted: bool },
    /// Told to stop (SIGTERM at `since`) so that one with new options replaces it
    /// on the same sockets; `rollback` are the options it ran with.
    Replacing { proc: P, since: Instant, adopted: bool, rollback: Options },
    /// Shutting down: told to stop (SIGTERM) at `since`; killed after DP_STOP_GRACE.
    Stopping { proc: P, since: Instant, adopted: bool },
    /// Shutting down: gone, and not started again.
    Stopped,
}

/// The process of a data-plane state that has one (the same arms for `&` and `&mut`).
macro_rules! data_plane_proc {
    ($state:expr) => {
        match $state {
            DataPlane::Starting { proc, .. }
            | DataPlane::Running { proc, .. }
            | DataPlane::Replacing { proc, .. }
            | DataPlane::Stopping { proc, .. } => Some(proc),
            DataPlane::Backoff { .. } | DataPlane::Stopped => None,
        }
    };
}

impl<P: Process> DataPlane<P> {
    pub(crate) fn kind(&self) -> DataPlaneKind {
        match self {
            DataPlane::Backoff { .. } => DataPlaneKind::Backoff,
            DataPlane::Starting { .. } => DataPlaneKind::Starting,
            DataPlane::Running { .. } => DataPlaneKind::Running,
            DataPlane::Replacing { .. } => DataPlaneKind::Replacing,
            DataPlane::Stopping { .. } => DataPlaneKind::Stopping,
            DataPlane::Stopped => DataPlaneKind::Stopped,
        }
    }

    pub(crate) fn proc(&self) -> Option<&P> {
        data_plane_proc!(self)
    }

    fn proc_mut(&mut self) -> Option<&mut P> {
        data_plane_proc!(self)
    }

    pub(crate) fn pid(&self) -> Option<i32> {
        self.proc().map(Process::pid)
    }

    /// The adopted data plane of the previous controller (still the current one).
    pub(crate) fn adopted(&self) -> bool {
        matches!(
            self,
            DataPlane::Running { adopted: true, .. }
                | DataPlane::Replacing { adopted: true, .. }
                | DataPlane::Stopping { adopted: true, .. }
        )
    }

    /// The options to go back to: a restart with new options is under way.
    pub(crate) fn rollback(&self) -> Option<&Options> {
        match self {
            DataPlane::Backoff { rollback, .. } | DataPlane::Starting { rollback, .. } => rollback.as_ref(),
            DataPlane::Replacing { rollback, .. } => Some(rollback),
            DataPlane::Running { .. } | DataPlane::Stopping { .. } | DataPlane::Stopped => None,
        }
    }

    fn illegal(&self, to: DataPlaneKind) -> Illegal {
        Illegal { what: "the data plane", from: self.kind().name(), to: to.name() }
    }

    /// Backoff → Starting (the rollback goes along). Returns whether this is the
    /// first data plane on these sockets; an illegal move hands `proc` back.
    fn move_to_starting(&mut self, proc: P, now: Instant) -> Result<bool, (Illegal, P)> {
        match self {
            DataPlane::Backoff { first, rollback, .. } => {
                let (first, rollback) = (*first, rollback.take());
                *self = DataPlane::Starting { proc, since: now, rollback };
                Ok(first)
            }
            _ => Err((self.illegal(DataPlaneKind::Starting), proc)),
        }
    }

    /// Starting → Running (a rollback is dropped: the new options work). Returns
    /// whether it started with new options.
    fn move_to_running(&mut self) -> Result<bool, Illegal> {
        if !matches!(self, DataPlane::Starting { .. }) {
            return Err(self.illegal(DataPlaneKind::Running));
        }
        match std::mem::replace(self, DataPlane::Stopped) {
            DataPlane::Starting { proc, since, rollback } => {
                *self = DataPlane::Running { proc, since, adopted: false };
                Ok(rollback.is_some())
            }
            other => {
                *self = other;
                Err(self.illegal(DataPlaneKind::Running))
            }
        }
    }

    /// Starting | Running → Replacing: told to stop for a restart with new options;
    /// `rollback` are the options it runs with. Returns its pid (to signal).
    fn move_to_replacing(&mut self, rollback: Options, now: Instant) -> Result<i32, Illegal> {
        if !matches!(self, DataPlane::Starting { rollback: None, .. } | DataPlane::Running { .. }) {
            return Err(self.illegal(DataPlaneKind::Replacing));
        }
        match std::mem::replace(self, DataPlane::Stopped) {
            DataPlane::Starting { proc, .. } => {
                let pid = proc.pid();
                *self = DataPlane::Replacing { proc, since: now, adopted: false, rollback };
                Ok(pid)
            }
            DataPlane::Running { proc, adopted, .. } => {
                let pid = proc.pid();
                *self = DataPlane::Replacing { proc, since: now, adopted, rollback };
                Ok(pid)
            }
            other => {
                *self = other;
                Err(self.illegal(DataPlaneKind::Replacing))
            }
        }
    }

    /// Starting | Running | Replacing → Backoff (it exited: its pid and how long it
    /// ran), or Backoff → Backoff (a start failed: None, or a restart with new
    /// options planned while none runs: `plan`). The rollback of Backoff and
    /// Replacing goes along (the next start has the new options); one of Starting
    /// is dropped (the caller went back to those options).
    fn move_to_backoff(
        &mut self,
        until: Instant,
        now: Instant,
        plan: Option<Options>,
    ) -> Result<Option<(i32, Duration)>, Illegal> {
        let ran = |proc: &P, since: &Instant| (proc.pid(), now.saturating_duration_since(*since));
        match self {
            DataPlane::Backoff { first, rollback, .. } => {
                if plan.is_some() && rollback.is_some() {
                    return Err(self.illegal(DataPlaneKind::Backoff));
                }
                let (first, rollback) = (*first, plan.or(rollback.take()));
                *self = DataPlane::Backoff { until, first, rollback };
                Ok(None)
            }
            _ if plan.is_some() => Err(self.illegal(DataPlaneKind::Backoff)),
            DataPlane::Starting { proc, since, .. } | DataPlane::Running { proc, since, .. } => {
                let ran = ran(proc, since);
                *self = DataPlane::Backoff { until, first: false, rollback: None };
                Ok(Some(ran))
            }
            DataPlane::Replacing { proc, since, rollback, .. } => {
                let (ran, rollback) = (ran(proc, since), std::mem::take(rollback));
                *self = DataPlane::Backoff { until, first: false, rollback: Some(rollback) };
                Ok(Some(ran))
            }
            DataPlane::Stopping { .. } | DataPlane::Stopped => Err(self.illegal(DataPlaneKind::Backoff)),
        }
    }

    /// Replacing → Backoff, handing back the process to kill (it did not stop when
    /// told); the rollback goes along.
    fn move_to_backoff_killed(&mut self, until: Instant) -> Result<P, Illegal> {
        if !matches!(self, DataPlane::Replacing { .. }) {
            return Err(self.illegal(DataPlaneKind::Backoff));
        }
        match std::mem::replace(self, DataPlane::Stopped) {
            DataPlane::Replacing { proc, rollback, .. } => {
                *self = DataPlane::Backoff { until, first: false, rollback: Some(rollback) };
                Ok(proc)
            }
            other => {
                *self = other;
                Err(self.illegal(DataPlaneKind::Backoff))
            }
        }
    }

    /// Starting | Running → Stopping (told to stop at `now`), or Replacing →
    /// Stopping (told already, at its `since`). Returns the pid to signal (None:
    /// told already).
    fn move_to_stopping(&mut self, now: Instant) -> Result<Option<i32>, Illegal> {
        if !matches!(self, DataPlane::Starting { .. } | DataPlane::Running { .. } | DataPlane::Replacing { .. }) {
            return Err(self.illegal(DataPlaneKind::Stopping));
        }
        match std::mem::replace(self, DataPlane::Stopped) {
            DataPlane::Starting { proc, .. } => {
                let pid = proc.pid();
                *self = DataPlane::Stopping { proc, since: now, adopted: false };
                Ok(Some(pid))
            }
            DataPlane::Running { proc, adopted, .. } => {
                let pid = proc.pid();
                *self = DataPlane::Stopping { proc, since: now, adopted };
                Ok(Some(pid))
            }
            DataPlane::Replacing { proc, since, adopted, .. } => {
                *self = DataPlane::Stopping { proc, since, adopted };
                Ok(None)
            }
            other => {
                *self = other;
                Err(self.illegal(DataPlaneKind::Stopping))
            }
        }
    }

    /// Backoff | Starting | Running | Replacing | Stopping → Stopped; returns the
    /// process it held (to kill and reap), if any.
    fn move_to_stopped(&mut self) -> Result<Option<P>, Illegal> {
        if matches!(self, DataPlane::Stopped) {
            return Err(self.illegal(DataPlaneKind::Stopped));
        }
        Ok(match std::mem::replace(self, DataPlane::Stopped) {
            DataPlane::Starting { proc, .. }
            | DataPlane::Running { proc, .. }
            | DataPlane::Replacing { proc, .. }
            | DataPlane::Stopping { proc, .. } => Some(proc),
            DataPlane::Backoff { .. } | DataPlane::Stopped => None,
        })
    }
}

// ---------------------------------------------------------------- workers

/// A worker record's identity for its whole life (never reused; not a pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct WorkerId(u64);

/// A worker's registration: its control connection and the server id on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    /// The control connection's epoll token.
    pub token: u64,
    pub server_id: u16,
    pub since: Instant,
    /// Came back with `Rejoin` (its id from the previous controller).
    pub rejoined: bool,
}

/// Why the controller retires a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retire {
    /// A rolling reload's step: its replacement is ready.
    Reload,
    /// More workers than `--spawn-workers` (a controller restarted with a smaller N).
    ScaleIn,
    /// SIGTERM to the controller.
    Shutdown,
    /// Listed `retiring` in `DIR/workers` by the previous controller.
    Adopted,
}

/// Where a worker is (docs/architecture.md "Processes and the data-connection
/// protocol", step 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkerPhase {
    /// Its process runs; it holds no registration (not yet, or its control
    /// connection closed and it will `Rejoin`). Spawned or adopted workers only.
    Spawned,
    /// Registered (Assign sent), not yet `Ready`.
    Registered,
    /// Said `Ready`: placeable.
    Ready,
    /// Said `Draining` by itself (someone else's SIGTERM, or it lost its sockets):
    /// not placeable; still counted toward `--spawn-workers`, replaced when it exits.
    Draining,
    /// Told to drain by this controller (SIGTERM) since `since`: not counted, not
    /// replaced; its exit is expected. What it says meanwhile changes nothing.
    Retiring { since: Instant, why: Retire },
    /// Its process exited (or, for a worker someone else started, its registration
    /// closed). Terminal: the record goes once it holds no registration.
    Exited,
}

/// A worker phase without its payload (status names, the transition table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum WorkerKind {
    Spawned,
    Registered,
    Ready,
    Draining,
    Retiring,
    Exited,
}

impl WorkerKind {
    /// The name in the status JSON (`workers[].state`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            WorkerKind::Spawned => "starting",
            WorkerKind::Registered => "registered",
            WorkerKind::Ready => "ready",
            WorkerKind::Draining => "draining",
            WorkerKind::Retiring => "retiring",
            WorkerKind::Exited => "exited",
        }
    }
}

impl WorkerPhase {
    pub(crate) fn kind(self) -> WorkerKind {
        match self {
            WorkerPhase::Spawned => WorkerKind::Spawned,
            WorkerPhase::Registered => WorkerKind::Registered,
            WorkerPhase::Ready => WorkerKind::Ready,
            WorkerPhase::Draining => WorkerKind::Draining,
            WorkerPhase::Retiring { .. } => WorkerKind::Retiring,
            WorkerPhase::Exited => WorkerKind::Exited,
        }
    }
}

/// One worker: its process (when this controller spawned or adopted it), its
/// registration (while it holds one) and its phase.
pub(crate) struct Worker<P> {
    id: WorkerId,
    pid: u32,
    /// Spawned or adopted by this controller: counted toward `--spawn-workers`,
    /// signalled, replaced. Otherwise a worker someone else started that registered.
    managed: bool,
    /// The process while it runs (managed workers only).
    proc: Option<P>,
    started: Instant,
    reg: Option<Registration>,
    phase: WorkerPhase,
}

impl<P> Worker<P> {
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }
    pub(crate) fn managed(&self) -> bool {
        self.managed
    }
    pub(crate) fn registration(&self) -> Option<&Registration> {
        self.reg.as_ref()
    }
    pub(crate) fn server_id(&self) -> Option<u16> {
        self.reg.map(|r| r.server_id)
    }
    pub(crate) fn phase(&self) -> WorkerPhase {
        self.phase
    }

    /// Counted toward `--spawn-workers`: managed, neither retiring nor exited.
    fn counted(&self) -> bool {
        self.managed && !matches!(self.phase, WorkerPhase::Retiring { .. } | WorkerPhase::Exited)
    }

    fn illegal(&self, to: WorkerKind) -> Illegal {
        Illegal { what: "a worker", from: self.phase.kind().name(), to: to.name() }
    }

    /// Spawned → Registered (its registration attached by the caller).
    fn move_to_registered(&mut self) -> Result<(), Illegal> {
        match self.phase {
            WorkerPhase::Spawned => {
                self.phase = WorkerPhase::Registered;
                Ok(())
            }
            _ => Err(self.illegal(WorkerKind::Registered)),
        }
    }

    /// Registered | Ready → Ready (a worker repeats Ready after it rejoins).
    fn move_to_ready(&mut self) -> Result<(), Illegal> {
        match self.phase {
            WorkerPhase::Registered | WorkerPhase::Ready => {
                self.phase = WorkerPhase::Ready;
                Ok(())
            }
            _ => Err(self.illegal(WorkerKind::Ready)),
        }
    }

    /// Registered | Ready | Draining → Draining.
    fn move_to_draining(&mut self) -> Result<(), Illegal> {
        match self.phase {
            WorkerPhase::Registered | WorkerPhase::Ready | WorkerPhase::Draining => {
                self.phase = WorkerPhase::Draining;
                Ok(())
            }
            _ => Err(self.illegal(WorkerKind::Draining)),
        }
    }

    /// Spawned | Registered | Ready | Draining → Retiring (managed workers only).
    fn move_to_retiring(&mut self, since: Instant, why: Retire) -> Result<(), Illegal> {
        match self.phase {
            WorkerPhase::Spawned | WorkerPhase::Registered | WorkerPhase::Ready | WorkerPhase::Draining
                if self.managed =>
            {
                self.phase = WorkerPhase::Retiring { since, why };
                Ok(())
            }
            _ => Err(self.illegal(WorkerKind::Retiring)),
        }
    }

    /// Registered | Ready → Spawned: a managed worker's registration closed while
    /// its process runs (it registers again with `Rejoin`).
    fn move_to_spawned(&mut self) -> Result<(), Illegal> {
        match self.phase {
            WorkerPhase::Registered | WorkerPhase::Ready if self.managed => {
                self.phase = WorkerPhase::Spawned;
                Ok(())
            }
            _ => Err(self.illegal(WorkerKind::Spawned)),
        }
    }

    /// Anything but Exited → Exited; returns the process (to reap), if it held one.
    fn move_to_exited(&mut self) -> Result<Option<P>, Illegal> {
        match self.phase {
            WorkerPhase::Exited => Err(self.illegal(WorkerKind::Exited)),
            _ => {
                self.phase = WorkerPhase::Exited;
                Ok(self.proc.take())
            }
        }
    }
}

// ---------------------------------------------------------------- the controller's phase

/// A rolling reload (SIGHUP): the managed workers it replaces, one at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reload {
    queue: VecDeque<WorkerId>,
    step: Option<ReloadStep>,
}

/// One step of a rolling reload: the data plane being restarted with new options,
/// or the old worker `old` being replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReloadStep {
    /// A restart of the data plane with new options is under way (since `since`):
    /// the workers are replaced once a data plane runs again (with the new options,
    /// or the previous ones after a rollback).
    DataPlaneRestarting { since: Instant },
    /// Its replacement is starting (since `since`); `old` serves on, not counted,
    /// and is told to drain once every counted worker is ready.
    AwaitReplacement { old: WorkerId, since: Instant },
    /// `old` is retiring; the step ends when it exits.
    AwaitExit { old: WorkerId },
}

/// SIGTERM: the managed workers drain until `deadline`, then the data plane stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shutdown {
    deadline: Instant,
}

/// The controller's own phase. ShuttingDown and HandingOver are final.
///
/// `demux upgrade` (a new binary) will be one more phase, `Upgrading(..)`, beside
/// `Reloading`: replace the data plane, then roll the workers as a reload does,
/// rolling back on failure; it enters from Serving and leaves to Serving or
/// ShuttingDown like a reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Serving,
    Reloading(Reload),
    ShuttingDown(Shutdown),
    /// SIGUSR2: the controller exits and leaves the running data plane and every
    /// worker as they are, for the next controller to adopt. Nothing changes any
    /// more: every event but the tick is refused.
    HandingOver,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum PhaseKind {
    Serving,
    Reloading,
    ShuttingDown,
    HandingOver,
}

impl PhaseKind {
    /// The name in the status JSON (`phase`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            PhaseKind::Serving => "serving",
            PhaseKind::Reloading => "reloading",
            PhaseKind::ShuttingDown => "shutting_down",
            PhaseKind::HandingOver => "handing_over",
        }
    }
}

impl Phase {
    pub(crate) fn kind(&self) -> PhaseKind {
        match self {
            Phase::Serving => PhaseKind::Serving,
            Phase::Reloading(_) => PhaseKind::Reloading,
            Phase::ShuttingDown(_) => PhaseKind::ShuttingDown,
            Phase::HandingOver => PhaseKind::HandingOver,
        }
    }

    fn illegal(&self, to: PhaseKind) -> Illegal {
        Illegal { what: "the controller", from: self.kind().name(), to: to.name() }
    }

    /// Serving → Reloading.
    fn move_to_reloading(&mut self, r: Reload) -> Result<(), Illegal> {
        match self {
            Phase::Serving => {
                *self = Phase::Reloading(r);
                Ok(())
            }
            _ => Err(self.illegal(PhaseKind::Reloading)),
        }
    }

    /// Reloading → Serving (the reload finished or stopped).
    fn move_to_serving(&mut self) -> Result<(), Illegal> {
        match self {
            Phase::Reloading(_) => {
                *self = Phase::Serving;
                Ok(())
            }
            _ => Err(self.illegal(PhaseKind::Serving)),
        }
    }

    /// Serving | Reloading → ShuttingDown (a reload in progress is abandoned).
    fn move_to_shutting_down(&mut self, s: Shutdown) -> Result<(), Illegal> {
        match self {
            Phase::Serving | Phase::Reloading(_) => {
                *self = Phase::ShuttingDown(s);
                Ok(())
            }
            Phase::ShuttingDown(_) | Phase::HandingOver => Err(self.illegal(PhaseKind::ShuttingDown)),
        }
    }

    /// Serving | Reloading → HandingOver (a reload in progress is left as it is:
    /// the next controller counts the workers anew).
    fn move_to_handing_over(&mut self) -> Result<(), Illegal> {
        match self {
            Phase::Serving | Phase::Reloading(_) => {
                *self = Phase::HandingOver;
                Ok(())
            }
            Phase::ShuttingDown(_) | Phase::HandingOver => Err(self.illegal(PhaseKind::HandingOver)),
        }
    }
}

// ---------------------------------------------------------------- events and outputs

/// What the lifecycle hears: from the signalfd, the supervision tick (child exits,
/// the data plane's ready file, spawns), and the control socket.
pub(crate) enum Event<P> {
    /// SIGHUP.
    Reload,
    /// SIGTERM / SIGINT.
    Shutdown,
    /// SIGUSR2: exit, leaving the data plane and the workers running.
    HandOver,
    /// SIGHUP's re-read of the configuration: `--spawn-workers` and
    /// `--drain-timeout`, in force at once.
    Configure {
        spawn_workers: usize,
        drain_timeout: Duration,
    },
    /// SIGHUP's re-read changed the data plane's options: restart it on the same
    /// sockets with `options`, and go back to the present ones if the new data
    /// plane exits before it is ready.
    RestartDataPlane {
        options: Options,
    },
    /// A data plane was spawned (after [`Lifecycle::dataplane_start_due`]).
    DataPlaneSpawned(P),
    DataPlaneSpawnFailed(String),
    /// The starting data plane wrote its ready file.
    DataPlaneReady,
    /// The running data plane places new connections on these server ids
    /// (its status: `instances[].placeable`), asked while
    /// [`Lifecycle::placeable_check_wanted`].
    DataPlanePlaces {
        server_ids: Vec<u16>,
    },
    /// The data plane's process ended (how).
    DataPlaneExited(String),
    /// A worker was spawned (after [`Lifecycle::worker_wanted`]).
    WorkerSpawned(P),
    WorkerSpawnFailed(String),
    /// At start: a worker of the previous controller (`DIR/workers`).
    WorkerAdopted {
        proc: P,
        retiring: bool,
    },
    /// A managed worker's process ended (how).
    WorkerExited {
        id: WorkerId,
        how: String,
    },
    /// A control connection registered a worker (Assign sent).
    Registered {
        token: u64,
        pid: u32,
        server_id: u16,
        rejoined: bool,
    },
    /// A registered worker said `Ready` (true) or `Draining` (false).
    Said {
        token: u64,
        ready: bool,
    },
    /// A registered worker's control connection closed.
    RegistrationClosed {
        token: u64,
    },
    /// The supervision tick: timers (reload step, drain deadline, stop grace),
    /// scale-in.
    Tick,
}

impl<P> Event<P> {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Event::Reload => "reload",
            Event::Shutdown => "shutdown",
            Event::HandOver => "hand over",
            Event::Configure { .. } => "configure",
            Event::RestartDataPlane { .. } => "restart the data plane",
            Event::DataPlaneSpawned(_) => "data plane spawned",
            Event::DataPlaneSpawnFailed(_) => "data plane spawn failed",
            Event::DataPlaneReady => "data plane ready",
            Event::DataPlanePlaces { .. } => "data plane places",
            Event::DataPlaneExited(_) => "data plane exited",
            Event::WorkerSpawned(_) => "worker spawned",
            Event::WorkerSpawnFailed(_) => "worker spawn failed",
            Event::WorkerAdopted { .. } => "worker adopted",
            Event::WorkerExited { .. } => "worker exited",
            Event::Registered { .. } => "registered",
            Event::Said { ready: true, .. } => "said ready",
            Event::Said { ready: false, .. } => "said draining",
            Event::RegistrationClosed { .. } => "registration closed",
            Event::Tick => "tick",
        }
    }
}

/// An event the state does not take: the state is unchanged and the event (with
/// any process it carried) is handed back.
pub(crate) struct Refused<P> {
    pub event: Event<P>,
    pub why: String,
}

/// The moments a service manager (or an operator) cares about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Became {
    /// A data plane was started (`restarts`: starts on these sockets after the first).
    DataPlaneStarted { pid: i32, restarts: u64 },
    /// First time only: the data plane runs, every `--spawn-workers` worker is
    /// ready, and the data plane places new connections on each of them (with no
    /// `--spawn-workers`: once the data plane runs). A client can be served.
    Placeable,
    /// SIGHUP taken: a rolling reload runs.
    ReloadStarted,
    /// The rolling reload replaced every worker it set out to.
    ReloadDone,
    /// A step's replacement was not ready in time: the reload stopped.
    ReloadStopped,
    /// SIGTERM taken: the workers drain.
    ShuttingDown,
    /// SIGUSR2 taken: the controller exits now; the data plane and the workers run on.
    HandingOver,
    /// Workers gone, data plane stopped: the controller exits.
    Stopped,
}

/// What the controller does after an event, in order.
pub(crate) enum Output<P> {
    /// kill(2) this pid (a process the lifecycle holds).
    Signal {
        pid: i32,
        sig: libc::c_int,
    },
    /// SIGKILL these processes (no longer tracked), then reap them.
    Kill(Vec<P>),
    Became(Became),
}

/// The lifecycle: the data plane, the workers, the controller's phase, and the
/// counters and timers that go with them.
pub(crate) struct Lifecycle<P> {
    dp: DataPlane<P>,
    /// The options the next data plane starts with (those of the running one,
    /// unless a restart with new options is under way).
    dp_options: Options,
    dp_backoff: Duration,
    dp_restarts: u64,
    dp_last_exit: Option<String>,
    workers: Vec<Worker<P>>,
    next_worker: u64,
    phase: Phase,
    spawn_workers: usize,
    drain_timeout: Duration,
    worker_backoff: Duration,
    next_worker_spawn: Instant,
    worker_replacements: u64,
    told_placeable: bool,
    told_stopped: bool,
    refused: u64,
}

type Step<P> = Result<(), Refused<P>>;

fn refuse<P>(event: Event<P>, why: impl fmt::Display) -> Step<P> {
    Err(Refused { event, why: why.to_string() })
}

impl<P: Process> Lifecycle<P> {
    /// `adopted`: the previous controller's data plane (now Running), whose restart
    /// count on these sockets was `restarts`; otherwise one is started at once.
    /// `options`: the data plane's options (an adopted one is taken to run with them).
    pub(crate) fn new(
        now: Instant,
        spawn_workers: usize,
        drain_timeout: Duration,
        options: Options,
        adopted: Option<P>,
        restarts: u64,
    ) -> Lifecycle<P> {
        let dp = match adopted {
            Some(proc) => DataPlane::Running { proc, since: now, adopted: true },
            None => DataPlane::Backoff { until: now, first: true, rollback: None },
        };
        Lifecycle {
            dp,
            dp_options: options,
            dp_backoff: DP_BACKOFF_MIN,
            dp_restarts: restarts,
            dp_last_exit: None,
            workers: Vec::new(),
            next_worker: 0,
            phase: Phase::Serving,
            spawn_workers,
            drain_timeout,
            worker_backoff: WORKER_BACKOFF_MIN,
            next_worker_spawn: now,
            worker_replacements: 0,
            told_placeable: false,
            told_stopped: false,
            refused: 0,
        }
    }

    // ------------------------------------------------------------ reading

    pub(crate) fn dataplane(&self) -> &DataPlane<P> {
        &self.dp
    }
    /// The data plane's process, to poll for its exit.
    pub(crate) fn dataplane_proc_mut(&mut self) -> Option<&mut P> {
        self.dp.proc_mut()
    }
    /// The running data plane's pid (ready or adopted): workers start, the link is held.
    pub(crate) fn dataplane_running(&self) -> Option<i32> {
        match &self.dp {
            DataPlane::Running { proc, .. } => Some(proc.pid()),
            _ => None,
        }
    }
    /// The options the next data plane starts with.
    pub(crate) fn dataplane_options(&self) -> &Options {
        &self.dp_options
    }
    pub(crate) fn dataplane_restarts(&self) -> u64 {
        self.dp_restarts
    }
    pub(crate) fn dataplane_last_exit(&self) -> Option<&str> {
        self.dp_last_exit.as_deref()
    }
    /// `--spawn-workers` in force (SIGHUP's re-read may change it: `Event::Configure`).
    pub(crate) fn spawn_workers(&self) -> usize {
        self.spawn_workers
    }
    pub(crate) fn phase(&self) -> &Phase {
        &self.phase
    }
    /// Every worker record, in the order they came (spawned, adopted, registered).
    pub(crate) fn workers(&self) -> &[Worker<P>] {
        &self.workers
    }
    /// The live managed workers' processes, to poll for their exits.
    pub(crate) fn worker_procs_mut(&mut self) -> impl Iterator<Item = (WorkerId, &mut P)> {
        self.workers.iter_mut().filter_map(|w| Some((w.id, w.proc.as_mut()?)))
    }
    pub(crate) fn worker_by_token(&self, token: u64) -> Option<&Worker<P>> {
        self.workers.iter().find(|w| w.reg.is_some_and(|r| r.token == token))
    }
    pub(crate) fn worker_replacements(&self) -> u64 {
        self.worker_replacements
    }
    /// Events refused since start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }
    /// `(server_id, pid)` of every registration.
    pub(crate) fn registrations(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.workers.iter().filter_map(|w| Some((w.reg?.server_id, w.pid)))
    }
    pub(crate) fn server_id_held(&self, id: u16) -> bool {
        self.registrations().any(|(s, _)| s == id)
    }
    /// A live process this controller spawned or adopted.
    pub(crate) fn is_managed_pid(&self, pid: u32) -> bool {
        self.workers.iter().any(|w| w.pid == pid && w.proc.is_some())
    }
    pub(crate) fn pid_registered(&self, pid: u32) -> bool {
        self.registrations().any(|(_, p)| p == pid)
    }
    /// Whether a new registration may be answered, and processes started (not
    /// while shutting down or handing over).
    pub(crate) fn accepts_registrations(&self) -> bool {
        matches!(self.phase, Phase::Serving | Phase::Reloading(_))
    }
    /// Shutdown done: the controller exits.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.phase, Phase::ShuttingDown(_))
            && matches!(self.dp, DataPlane::Stopped)
            && !self.workers.iter().any(|w| w.proc.is_some())
    }
    /// SIGUSR2 taken: the controller exits, stopping nothing.
    pub(crate) fn handed_over(&self) -> bool {
        self.phase == Phase::HandingOver
    }
    /// `Became::Placeable` was told: a client could be served.
    pub(crate) fn told_placeable(&self) -> bool {
        self.told_placeable
    }
    /// Whether to ask the running data plane which server ids it places on
    /// ([`Event::DataPlanePlaces`]): Placeable is not told yet, and every wanted
    /// worker said Ready.
    pub(crate) fn placeable_check_wanted(&self) -> bool {
        !self.told_placeable
            && self.spawn_workers > 0
            && self.accepts_registrations()
            && self.dataplane_running().is_some()
            && self.all_ready(None)
    }

    /// `DIR/workers`: `PID` or `PID retiring` per live managed worker, for the next
    /// controller (a retiring one is not counted and not replaced there either).
    pub(crate) fn workers_file(&self) -> String {
        self.workers
            .iter()
            .filter(|w| w.proc.is_some())
            .map(|w| match w.phase {
                WorkerPhase::Retiring { .. } => format!("{} retiring\n", w.pid),
                _ => format!("{}\n", w.pid),
            })
            .collect()
    }

    /// One line for operators and service managers.
    pub(crate) fn summary(&self) -> String {
        let counted = self.counted(None);
        let ready = self.workers.iter().filter(|w| w.counted() && w.phase == WorkerPhase::Ready).count();
        let dp = match self.dp.pid() {
            Some(pid) => format!("data plane {} (pid {pid})", self.dp.kind().name()),
            None => format!("data plane {}", self.dp.kind().name()),
        };
        let draining = self
            .workers
            .iter()
            .filter(|w| matches!(w.phase, WorkerPhase::Draining | WorkerPhase::Retiring { .. }))
            .count();
        let draining = if draining > 0 { format!(", {draining} draining") } else { String::new() };
        format!(
            "{}; {dp}; workers {ready} ready of {counted} (want {}){draining}",
            self.phase.kind().name(),
            self.spawn_workers
        )
    }

    /// When to start a data plane: `Some(rejoin_grace)` once one is due. A restarted
    /// data plane (or a first one beside adopted workers) holds the ids of workers
    /// that are not back yet (`--rejoin-grace-ms`).
    pub(crate) fn dataplane_start_due(&self, now: Instant) -> Option<bool> {
        match self.dp {
            DataPlane::Backoff { until, first, .. } if now >= until && self.accepts_registrations() => {
                Some(!first || !self.workers.is_empty())
            }
            _ => None,
        }
    }

    /// Whether to spawn a worker now: fewer counted than `--spawn-workers`, the
    /// data plane running, not shutting down, the replacement backoff passed.
    pub(crate) fn worker_wanted(&self, now: Instant) -> bool {
        self.accepts_registrations()
            && self.dataplane_running().is_some()
            && now >= self.next_worker_spawn
            && self.counted(self.reload_replacing()) < self.spawn_workers
    }

    /// The old worker of a reload step waiting for its replacement: not counted.
    fn reload_replacing(&self) -> Option<WorkerId> {
        match &self.phase {
            Phase::Reloading(Reload { step: Some(ReloadStep::AwaitReplacement { old, .. }), .. }) => Some(*old),
            _ => None,
        }
    }

    /// Managed workers counted toward `--spawn-workers`, but `except`.
    fn counted(&self, except: Option<WorkerId>) -> usize {
        self.workers.iter().filter(|w| w.counted() && Some(w.id) != except).count()
    }

    /// Every counted worker but `except` is Ready, and there are enough of them.
    fn all_ready(&self, except: Option<WorkerId>) -> bool {
        let counted = self.workers.iter().filter(|w| w.counted() && Some(w.id) != except);
        counted.clone().all(|w| w.phase == WorkerPhase::Ready) && counted.count() >= self.spawn_workers
    }

    fn index(&self, id: WorkerId) -> Option<usize> {
        self.workers.iter().position(|w| w.id == id)
    }

    fn index_by_token(&self, token: u64) -> Option<usize> {
        self.workers.iter().position(|w| w.reg.is_some_and(|r| r.token == token))
    }

    /// A new record: `proc` for a worker of ours, `reg` for one known by its registration.
    fn new_worker(&mut self, pid: u32, proc: Option<P>, reg: Option<Registration>, now: Instant, phase: WorkerPhase) {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        let managed = proc.is_some();
        self.workers.push(Worker { id, pid, managed, proc, started: now, reg, phase });
    }

    /// Drops exited records that hold no registration any more.
    fn forget_exited(&mut self) {
        self.workers.retain(|w| !(w.phase == WorkerPhase::Exited && w.reg.is_none()));
    }

    // ------------------------------------------------------------ events

    /// Takes one event. On success: what to do, in order. Refused: nothing changed
    /// (logged and counted here).
    pub(crate) fn handle(&mut self, now: Instant, ev: Event<P>) -> Result<Vec<Output<P>>, Refused<P>> {
        let mut out = Vec::new();
        match self.apply(now, ev, &mut out) {
            Ok(()) => {
                self.forget_exited();
                // With workers to wait for, Placeable comes with DataPlanePlaces.
                if !self.told_placeable
                    && self.spawn_workers == 0
                    && self.accepts_registrations()
                    && self.dataplane_running().is_some()
                {
                    self.tell_placeable(&mut out);
                }
                if !self.told_stopped && self.is_done() {
                    self.told_stopped = true;
                    out.push(Output::Became(Became::Stopped));
                }
                Ok(out)
            }
            Err(r) => {
                self.refused += 1;
                tracing::warn!(event = r.event.name(), why = %r.why, "lifecycle event refused");
                Err(r)
            }
        }
    }

    fn tell_placeable(&mut self, out: &mut Vec<Output<P>>) {
        self.told_placeable = true;
        tracing::info!(summary = %self.summary(), "serving: every worker is placeable");
        out.push(Output::Became(Became::Placeable));
    }

    fn apply(&mut self, now: Instant, ev: Event<P>, out: &mut Vec<Output<P>>) -> Step<P> {
        if self.phase == Phase::HandingOver && !matches!(ev, Event::Tick) {
            return refuse(ev, "the controller handed over: it exits and changes nothing");
        }
        match ev {
            Event::Reload => self.on_reload(ev, out),
            Event::Shutdown => self.on_shutdown(now, ev, out),
            Event::HandOver => self.on_hand_over(ev, out),
            Event::Configure { spawn_workers, drain_timeout } => {
                if !self.accepts_registrations() {
                    return refuse(ev, format!("the controller is {}", self.phase.kind().name()));
                }
                if spawn_workers != self.spawn_workers {
                    tracing::info!(from = self.spawn_workers, to = spawn_workers, "workers wanted (--spawn-workers)");
                }
                self.spawn_workers = spawn_workers;
                self.drain_timeout = drain_timeout;
                Ok(())
            }
            Event::RestartDataPlane { options } => self.on_restart_dataplane(now, options, out),
            Event::DataPlaneSpawned(proc) => {
                if self.dataplane_start_due(now).is_none() {
                    let why = format!("no data plane start is due ({})", self.dp.kind().name());
                    return refuse(Event::DataPlaneSpawned(proc), why);
                }
                let pid = proc.pid();
                match self.dp.move_to_starting(proc, now) {
                    Ok(first) => {
                        if !first {
                            self.dp_restarts += 1;
                        }
                        out.push(Output::Became(Became::DataPlaneStarted { pid, restarts: self.dp_restarts }));
                        Ok(())
                    }
                    Err((e, proc)) => refuse(Event::DataPlaneSpawned(proc), e),
                }
            }
            Event::DataPlaneSpawnFailed(why) => {
                if self.dataplane_start_due(now).is_none() {
                    return refuse(Event::DataPlaneSpawnFailed(why), "no data plane start is due");
                }
                let backoff = (self.dp_backoff * 2).min(DP_BACKOFF_MAX);
                if let Err(e) = self.dp.move_to_backoff(now + backoff, now, None) {
                    return refuse(Event::DataPlaneSpawnFailed(why), e);
                }
                self.dp_backoff = backoff;
                tracing::error!(error = %why, "could not start the data plane; retrying");
                Ok(())
            }
            Event::DataPlaneReady => match self.dp.move_to_running() {
                Ok(false) => {
                    tracing::info!(pid = self.dp.pid(), "data plane ready");
                    Ok(())
                }
                Ok(true) => {
                    tracing::info!(pid = self.dp.pid(), "data plane ready: it runs with the new options");
                    Ok(())
                }
                Err(e) => refuse(ev, e),
            },
            Event::DataPlanePlaces { server_ids } => {
                if self.dataplane_running().is_none() {
                    let why = format!("no data plane runs ({})", self.dp.kind().name());
                    return refuse(Event::DataPlanePlaces { server_ids }, why);
                }
                let placed = |w: &Worker<P>| w.server_id().is_some_and(|id| server_ids.contains(&id));
                if self.placeable_check_wanted() && self.workers.iter().filter(|w| w.counted()).all(placed) {
                    self.tell_placeable(out);
                }
                Ok(())
            }
            Event::DataPlaneExited(how) => self.on_dataplane_exit(now, how),
            Event::WorkerSpawned(proc) => {
                if !self.worker_wanted(now) {
                    return refuse(Event::WorkerSpawned(proc), "no worker is wanted");
                }
                let pid = proc.pid() as u32;
                self.new_worker(pid, Some(proc), None, now, WorkerPhase::Spawned);
                Ok(())
            }
            Event::WorkerSpawnFailed(why) => {
                if !self.worker_wanted(now) {
                    return refuse(Event::WorkerSpawnFailed(why), "no worker is wanted");
                }
                tracing::error!(error = %why, "could not start a worker");
                self.next_worker_spawn = now + self.worker_backoff;
                Ok(())
            }
            Event::WorkerAdopted { proc, retiring } => {
                if self.phase != Phase::Serving {
                    let why = format!("workers are adopted while serving, not {}", self.phase.kind().name());
                    return refuse(Event::WorkerAdopted { proc, retiring }, why);
                }
                let pid = proc.pid() as u32;
                let phase = if retiring {
                    WorkerPhase::Retiring { since: now, why: Retire::Adopted }
                } else {
                    WorkerPhase::Spawned
                };
                self.new_worker(pid, Some(proc), None, now, phase);
                tracing::info!(pid, retiring, "adopted a running worker");
                Ok(())
            }
            Event::WorkerExited { id, how } => self.on_worker_exit(now, id, how),
            Event::Registered { token, pid, server_id, rejoined } => {
                if !self.accepts_registrations() {
                    return refuse(ev, "the controller is shutting down");
                }
                if self.index_by_token(token).is_some() {
                    return refuse(ev, "this connection already holds a registration");
                }
                let reg = Registration { token, server_id, since: now, rejoined };
                // A process we spawned or adopted, not registered: this is its registration.
                let ours = self.workers.iter().position(|w| w.pid == pid && w.proc.is_some() && w.reg.is_none());
                match ours {
                    Some(i) => {
                        let w = &mut self.workers[i];
                        if w.phase == WorkerPhase::Spawned {
                            if let Err(e) = w.move_to_registered() {
                                return refuse(ev, e);
                            }
                        }
                        // Draining or Retiring: it keeps that phase (it repeats Draining).
                        w.reg = Some(reg);
                    }
                    None => self.new_worker(pid, None, Some(reg), now, WorkerPhase::Registered),
                }
                tracing::info!(server_id, pid, rejoined, "worker registered");
                Ok(())
            }
            Event::Said { token, ready } => {
                let Some(i) = self.index_by_token(token) else {
                    return refuse(ev, "no registration on this connection");
                };
                let w = &mut self.workers[i];
                let server_id = w.server_id();
                match (w.phase, ready) {
                    (WorkerPhase::Retiring { .. }, true) => {}
                    (WorkerPhase::Retiring { .. }, false) => tracing::info!(server_id, "worker draining"),
                    (phase, true) => {
                        if let Err(e) = w.move_to_ready() {
                            return refuse(ev, e);
                        }
                        if phase != WorkerPhase::Ready {
                            tracing::info!(server_id, "worker ready");
                        }
                    }
                    (_, false) => {
                        if let Err(e) = w.move_to_draining() {
                            return refuse(ev, e);
                        }
                        tracing::info!(server_id, "worker draining");
                    }
                }
                Ok(())
            }
            Event::RegistrationClosed { token } => {
                let Some(i) = self.index_by_token(token) else {
                    return refuse(ev, "no registration on this connection");
                };
                let w = &mut self.workers[i];
                let moved = match w.phase {
                    WorkerPhase::Registered | WorkerPhase::Ready if w.managed => w.move_to_spawned(),
                    // Someone else's worker: we know it only by its registration.
                    WorkerPhase::Registered | WorkerPhase::Ready | WorkerPhase::Draining if !w.managed => {
                        w.move_to_exited().map(drop)
                    }
                    // Draining, Retiring: it keeps draining; Exited: the record goes.
                    _ => Ok(()),
                };
                if let Err(e) = moved {
                    return refuse(ev, e);
                }
                w.reg = None;
                Ok(())
            }
            Event::Tick => {
                match self.phase {
                    Phase::Serving => {
                        self.kill_stuck_replaced(now, out);
                        self.scale_in(now, out);
                    }
                    Phase::Reloading(_) => {
                        self.kill_stuck_replaced(now, out);
                        self.step_reload(now, out);
                    }
                    Phase::ShuttingDown(_) => self.step_shutdown(now, out),
                    Phase::HandingOver => {}
                }
                Ok(())
            }
        }
    }

    fn on_reload(&mut self, ev: Event<P>, out: &mut Vec<Output<P>>) -> Step<P> {
        let queue: VecDeque<WorkerId> = self.workers.iter().filter(|w| w.counted()).map(|w| w.id).collect();
        let n = queue.len();
        match self.phase.move_to_reloading(Reload { queue, step: None }) {
            Ok(()) => {
                tracing::info!(workers = n, "rolling reload (SIGHUP, or an upgrade's workers)");
                out.push(Output::Became(Became::ReloadStarted));
                Ok(())
            }
            Err(e) if self.phase.kind() == PhaseKind::Reloading => {
                refuse(ev, format!("{e}: a rolling reload is already running"))
            }
            Err(e) => refuse(ev, e),
        }
    }

    /// SIGUSR2: only with a running data plane (one the next controller can adopt:
    /// its control socket answers, and no restart is under way), and nothing is
    /// stopped or signalled.
    fn on_hand_over(&mut self, ev: Event<P>, out: &mut Vec<Output<P>>) -> Step<P> {
        if self.dataplane_running().is_none() {
            let why = format!(
                "the data plane is {}: the next controller could not adopt it; hand over once it runs",
                self.dp.kind().name()
            );
            return refuse(ev, why);
        }
        if let Err(e) = self.phase.move_to_handing_over() {
            return refuse(ev, e);
        }
        let managed = self.workers.iter().filter(|w| w.proc.is_some()).count();
        tracing::info!(
            pid = self.dp.pid(),
            workers = managed,
            "SIGUSR2: handing the data plane and the workers over to the next controller"
        );
        out.push(Output::Became(Became::HandingOver));
        Ok(())
    }

    /// New options for the data plane: the running (or starting) one is told to
    /// stop and one with the new options starts on the same sockets; with none
    /// running, the next start has them. Refused while a restart with new options
    /// is under way, and when shutting down.
    fn on_restart_dataplane(&mut self, now: Instant, options: Options, out: &mut Vec<Output<P>>) -> Step<P> {
        if !self.accepts_registrations() {
            let why = format!("the controller is {}", self.phase.kind().name());
            return refuse(Event::RestartDataPlane { options }, why);
        }
        if self.dp.rollback().is_some() {
            let why = "the data plane is still restarting with the previous new options; reload again once it runs";
            return refuse(Event::RestartDataPlane { options }, why);
        }
        let previous = self.dp_options.clone();
        let moved = match self.dp {
            DataPlane::Backoff { until, .. } => self.dp.move_to_backoff(until, now, Some(previous)).map(|_| None),
            _ => self.dp.move_to_replacing(previous, now).map(Some),
        };
        match moved {
            Ok(pid) => {
                tracing::info!(pid, "new data-plane options: restarting the data plane on the same sockets");
                self.dp_options = options;
                if let Some(pid) = pid {
                    // Its exit is the restart (on_dataplane_exit), with no backoff.
                    out.push(Output::Signal { pid, sig: libc::SIGTERM });
                }
                Ok(())
            }
            Err(e) => refuse(Event::RestartDataPlane { options }, e),
        }
    }

    fn on_shutdown(&mut self, now: Instant, ev: Event<P>, out: &mut Vec<Output<P>>) -> Step<P> {
        let deadline = now + self.drain_timeout + DRAIN_MARGIN;
        if let Err(e) = self.phase.move_to_shutting_down(Shutdown { deadline }) {
            return refuse(ev, e);
        }
        let managed = self.workers.iter().filter(|w| w.proc.is_some()).count();
        tracing::info!(workers = managed, "shutting down: draining the workers");
        out.push(Output::Became(Became::ShuttingDown));
        for w in self.workers.iter_mut().filter(|w| w.proc.is_some()) {
            // A worker that drains already is not signalled again: a second SIGTERM
            // ends a worker's drain at once.
            let signal = matches!(w.phase, WorkerPhase::Spawned | WorkerPhase::Registered | WorkerPhase::Ready);
            if w.move_to_retiring(now, Retire::Shutdown).is_ok() && signal {
                out.push(Output::Signal { pid: w.pid as i32, sig: libc::SIGTERM });
            }
        }
        if self.dp.kind() == DataPlaneKind::Backoff {
            // Not started again; nothing to stop.
            let _ = self.dp.move_to_stopped();
        }
        Ok(())
    }

    fn on_dataplane_exit(&mut self, now: Instant, how: String) -> Step<P> {
        match self.dp.kind() {
            // Told to stop for new options: the new one starts at once.
            DataPlaneKind::Replacing if self.accepts_registrations() => match self.dp.move_to_backoff(now, now, None) {
                Ok(exited) => {
                    let pid = exited.map(|(p, _)| p);
                    tracing::info!(pid, how, "data plane stopped for the new options; starting the new one");
                    self.dp_last_exit = Some(how);
                    Ok(())
                }
                Err(e) => refuse(Event::DataPlaneExited(how), e),
            },
            // The new options did not come up: back to the previous ones, at once.
            DataPlaneKind::Starting if self.accepts_registrations() && self.dp.rollback().is_some() => {
                let previous = self.dp.rollback().cloned().unwrap_or_default();
                match self.dp.move_to_backoff(now, now, None) {
                    Ok(exited) => {
                        tracing::error!(
                            pid = exited.map(|(p, _)| p),
                            how,
                            "the data plane exited before it was ready with the new options; restarting it with the \
                             previous one"
                        );
                        self.dp_options = previous;
                        self.dp_last_exit = Some(how);
                        Ok(())
                    }
                    Err(e) => refuse(Event::DataPlaneExited(how), e),
                }
            }
            DataPlaneKind::Starting | DataPlaneKind::Running if self.accepts_registrations() => {
                let ran = match &self.dp {
                    DataPlane::Starting { since, .. } | DataPlane::Running { since, .. } => {
                        now.saturating_duration_since(*since)
                    }
                    _ => Duration::ZERO,
                };
                let backoff = if ran >= DP_STABLE { DP_BACKOFF_MIN } else { (self.dp_backoff * 2).min(DP_BACKOFF_MAX) };
                match self.dp.move_to_backoff(now + backoff, now, None) {
                    Ok(exited) => {
                        self.dp_backoff = backoff;
                        tracing::error!(
                            pid = exited.map(|(p, _)| p),
                            how,
                            ran_ms = ran.as_millis() as u64,
                            backoff_ms = backoff.as_millis() as u64,
                            "data plane died; restarting it on the same sockets"
                        );
                        self.dp_last_exit = Some(how);
                        Ok(())
                    }
                    Err(e) => refuse(Event::DataPlaneExited(how), e),
                }
            }
            DataPlaneKind::Starting | DataPlaneKind::Running | DataPlaneKind::Replacing | DataPlaneKind::Stopping => {
                let pid = self.dp.pid();
                match self.dp.move_to_stopped() {
                    Ok(_) => {
                        tracing::info!(pid, how, "data plane stopped");
                        self.dp_last_exit = Some(how);
                        Ok(())
                    }
                    Err(e) => refuse(Event::DataPlaneExited(how), e),
                }
            }
            DataPlaneKind::Backoff | DataPlaneKind::Stopped => {
                let why = format!("no data plane runs ({})", self.dp.kind().name());
                refuse(Event::DataPlaneExited(how), why)
            }
        }
    }

    fn on_worker_exit(&mut self, now: Instant, id: WorkerId, how: String) -> Step<P> {
        let Some(i) = self.index(id).filter(|i| self.workers[*i].proc.is_some()) else {
            return refuse(Event::WorkerExited { id, how }, "no such running worker");
        };
        let expected = matches!(self.workers[i].phase, WorkerPhase::Retiring { .. })
            || !self.accepts_registrations()
            || self.reload_replacing() == Some(id);
        let w = &mut self.workers[i];
        let (pid, lived) = (w.pid, now.saturating_duration_since(w.started));
        if let Err(e) = w.move_to_exited() {
            return refuse(Event::WorkerExited { id, how }, e);
        }
        if expected {
            tracing::info!(pid, how, "worker exited");
        } else {
            self.worker_replacements += 1;
            self.worker_backoff = if lived < WORKER_STABLE {
                (self.worker_backoff * 2).min(WORKER_BACKOFF_MAX)
            } else {
                WORKER_BACKOFF_MIN
            };
            self.next_worker_spawn = now + self.worker_backoff;
            tracing::error!(pid, how, "worker died; replacing it (the replacement gets a new server id)");
        }
        Ok(())
    }

    /// A data plane told to stop for new options that has not stopped after
    /// DP_STOP_GRACE is killed; the new one starts at once.
    fn kill_stuck_replaced(&mut self, now: Instant, out: &mut Vec<Output<P>>) {
        let DataPlane::Replacing { since, .. } = self.dp else { return };
        if now.saturating_duration_since(since) < DP_STOP_GRACE {
            return;
        }
        tracing::warn!(pid = self.dp.pid(), "the data plane did not stop for the new options; killing it");
        if let Ok(proc) = self.dp.move_to_backoff_killed(now) {
            out.push(Output::Kill(vec![proc]));
        }
    }

    /// More counted workers than `--spawn-workers` (a controller restarted with a
    /// smaller N adopted the old ones): the newest extras retire (scale-in).
    fn scale_in(&mut self, now: Instant, out: &mut Vec<Output<P>>) {
        while self.counted(None) > self.spawn_workers {
            let Some(w) = self.workers.iter_mut().rev().find(|w| w.counted()) else { break };
            let signal = w.phase != WorkerPhase::Draining;
            if w.move_to_retiring(now, Retire::ScaleIn).is_err() {
                break;
            }
            tracing::info!(pid = w.pid, "more workers than --spawn-workers: draining one");
            if signal {
                out.push(Output::Signal { pid: w.pid as i32, sig: libc::SIGTERM });
            }
        }
    }

    fn reload_mut(&mut self) -> Option<&mut Reload> {
        match &mut self.phase {
            Phase::Reloading(r) => Some(r),
            _ => None,
        }
    }

    /// One step of the rolling reload: for each old worker in turn, its replacement
    /// starts (the old one is not counted), and once every counted worker is ready
    /// the old one retires; the next step starts when it has exited.
    fn step_reload(&mut self, now: Instant, out: &mut Vec<Output<P>>) {
        loop {
            let Some(step) = self.reload_mut().map(|r| r.step) else { return };
            match step {
                None if self.dp.rollback().is_some() => {
                    if let Some(r) = self.reload_mut() {
                        r.step = Some(ReloadStep::DataPlaneRestarting { since: now });
                    }
                    return;
                }
                Some(ReloadStep::DataPlaneRestarting { since }) => {
                    if self.dp.rollback().is_none() && self.dataplane_running().is_some() {
                        if let Some(r) = self.reload_mut() {
                            r.step = None;
                        }
                        continue;
                    }
                    if now.saturating_duration_since(since) > RELOAD_STEP_TIMEOUT {
                        tracing::error!(
                            dataplane = self.dp.kind().name(),
                            "reload: the data plane did not run again in time; reload stopped"
                        );
                        if self.phase.move_to_serving().is_ok() {
                            out.push(Output::Became(Became::ReloadStopped));
                        }
                    }
                    return;
                }
                None => {
                    let next = self.reload_mut().and_then(|r| r.queue.pop_front());
                    let Some(old) = next else {
                        if self.phase.move_to_serving().is_ok() {
                            tracing::info!("rolling reload done");
                            out.push(Output::Became(Became::ReloadDone));
                        }
                        return;
                    };
                    if !self.index(old).is_some_and(|i| self.workers[i].counted()) {
                        continue;
                    }
                    if let Some(r) = self.reload_mut() {
                        r.step = Some(ReloadStep::AwaitReplacement { old, since: now });
                    }
                    return;
                }
                Some(ReloadStep::AwaitReplacement { old, since }) => {
                    // Not while the data plane restarts with new options (a SIGHUP
                    // during the reload): the old worker serves on until it runs.
                    if self.all_ready(Some(old)) && self.dp.rollback().is_none() {
                        if let Some(i) = self.index(old).filter(|i| self.workers[*i].counted()) {
                            let w = &mut self.workers[i];
                            let signal = w.phase != WorkerPhase::Draining;
                            if w.move_to_retiring(now, Retire::Reload).is_ok() {
                                tracing::info!(pid = w.pid, "reload: replacement ready; draining the old worker");
                                if signal {
                                    out.push(Output::Signal { pid: w.pid as i32, sig: libc::SIGTERM });
                                }
                            }
                        }
                        if let Some(r) = self.reload_mut() {
                            r.step = Some(ReloadStep::AwaitExit { old });
                        }
                    } else if now.saturating_duration_since(since) > RELOAD_STEP_TIMEOUT {
                        let pid = self.index(old).map(|i| self.workers[i].pid);
                        tracing::error!(pid, "reload: the replacement did not become ready; reload stopped");
                        if self.phase.move_to_serving().is_ok() {
                            out.push(Output::Became(Became::ReloadStopped));
                        }
                    }
                    return;
                }
                Some(ReloadStep::AwaitExit { old }) => {
                    if self.index(old).is_some_and(|i| self.workers[i].proc.is_some()) {
                        return;
                    }
                    if let Some(r) = self.reload_mut() {
                        r.step = None;
                    }
                }
            }
        }
    }

    /// The managed workers drain until the deadline (then they are killed); then
    /// the data plane is told to stop, and killed after DP_STOP_GRACE.
    fn step_shutdown(&mut self, now: Instant, out: &mut Vec<Output<P>>) {
        let Phase::ShuttingDown(Shutdown { deadline }) = self.phase else { return };
        let left = self.workers.iter().filter(|w| w.proc.is_some()).count();
        if left > 0 {
            if now < deadline {
                return;
            }
            tracing::warn!(left, "drain deadline passed; killing the remaining workers");
            let mut procs = Vec::new();
            for w in self.workers.iter_mut().filter(|w| w.proc.is_some()) {
                if let Ok(Some(p)) = w.move_to_exited() {
                    procs.push(p);
                }
            }
            out.push(Output::Kill(procs));
        }
        match self.dp {
            DataPlane::Starting { .. } | DataPlane::Running { .. } | DataPlane::Replacing { .. } => {
                // A replacing one was told already (None).
                if let Ok(Some(pid)) = self.dp.move_to_stopping(now) {
                    out.push(Output::Signal { pid, sig: libc::SIGTERM });
                }
            }
            DataPlane::Stopping { since, .. } => {
                if now.saturating_duration_since(since) >= DP_STOP_GRACE {
                    tracing::warn!(pid = self.dp.pid(), "the data plane did not stop; killing it");
                    if let Ok(Some(p)) = self.dp.move_to_stopped() {
                        out.push(Output::Kill(vec![p]));
                    }
                }
            }
            DataPlane::Backoff { .. } => {
                let _ = self.dp.move_to_stopped();
            }
            DataPlane::Stopped => {}
        }
    }
}

#[cfg(test)]
mod tests;
