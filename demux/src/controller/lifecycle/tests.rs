//! The lifecycle against its transition tables, without processes. A world of fake
//! processes feeds random event sequences, including ones a real controller never
//! sends: a spawn nobody asked for, an exit of nothing, a message on a closed
//! registration. Every step is checked against the tables below and the
//! invariants in [`World::check`]. After the random part the world behaves: workers
//! register and say Ready, a signalled worker exits. The lifecycle must then settle
//! (every wanted worker ready, any reload finished), and a shutdown must finish.
//!
//! Each `move_to_*` is also checked on its own, every from-state × every move
//! (`*_MOVES`), since the event handlers guard most illegal moves before they get
//! there.
//!
//! Beyond the tables, [`World::check`] holds what the service relies on: a data
//! plane restarted with new options runs with them once ready and with the
//! previous ones if it exits before; a hand-over (SIGUSR2) signals, kills and
//! moves nothing, then and after; Placeable (READY=1) is told only when the data
//! plane places on every wanted worker.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use PhaseKind::{HandingOver, Reloading, Serving, ShuttingDown};
use WorkerKind::{Draining, Exited, Ready, Registered, Retiring, Spawned};
use D::{Backoff, BackoffNew, Replacing, Running, Starting, StartingNew, Stopped, Stopping};

/// A process that is only a pid.
#[derive(Debug, PartialEq, Eq)]
struct Fake(i32);

impl Process for Fake {
    fn pid(&self) -> i32 {
        self.0
    }
}

// ------------------------------------------------------------ the tables

/// The data plane as the tables see it: its kind, and for Backoff and Starting
/// whether it holds options to roll back to (`…New`: a restart with new options is
/// under way; Replacing always holds them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum D {
    Backoff,
    BackoffNew,
    Starting,
    StartingNew,
    Running,
    Replacing,
    Stopping,
    Stopped,
}

fn d_of(dp: &DataPlane<Fake>) -> D {
    match (dp.kind(), dp.rollback().is_some()) {
        (DataPlaneKind::Backoff, false) => Backoff,
        (DataPlaneKind::Backoff, true) => BackoffNew,
        (DataPlaneKind::Starting, false) => Starting,
        (DataPlaneKind::Starting, true) => StartingNew,
        (DataPlaneKind::Running, _) => Running,
        (DataPlaneKind::Replacing, _) => Replacing,
        (DataPlaneKind::Stopping, _) => Stopping,
        (DataPlaneKind::Stopped, _) => Stopped,
    }
}

/// The controller's phase when the event arrives: serving or reloading (Up),
/// shutting down (Down), handed over (Gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    Up,
    Down,
    Gone,
}

fn when_of(phase: PhaseKind) -> When {
    match phase {
        Serving | Reloading => When::Up,
        ShuttingDown => When::Down,
        HandingOver => When::Gone,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DpEv {
    /// A spawned data plane is reported while a start is due / is not.
    SpawnedDue,
    SpawnedEarly,
    SpawnFailedDue,
    SpawnFailedEarly,
    Ready,
    Exited,
    /// New options (SIGHUP's re-read of the configuration).
    Restart,
}

/// Data-plane events: (from, event, when) → to. Every other combination is refused.
/// The options: a Restart takes the new ones (the previous ones held to roll back
/// to); a StartingNew that exits in Up rolls back; nothing else changes them.
const DATA_PLANE: &[(D, DpEv, When, D)] = &[
    (Backoff, DpEv::SpawnedDue, When::Up, Starting),
    (BackoffNew, DpEv::SpawnedDue, When::Up, StartingNew),
    (Backoff, DpEv::SpawnFailedDue, When::Up, Backoff),
    (BackoffNew, DpEv::SpawnFailedDue, When::Up, BackoffNew),
    (Starting, DpEv::Ready, When::Up, Running),
    (Starting, DpEv::Ready, When::Down, Running),
    (StartingNew, DpEv::Ready, When::Up, Running),
    (StartingNew, DpEv::Ready, When::Down, Running),
    (Starting, DpEv::Exited, When::Up, Backoff),
    (StartingNew, DpEv::Exited, When::Up, Backoff),
    (Running, DpEv::Exited, When::Up, Backoff),
    (Replacing, DpEv::Exited, When::Up, BackoffNew),
    (Starting, DpEv::Exited, When::Down, Stopped),
    (StartingNew, DpEv::Exited, When::Down, Stopped),
    (Running, DpEv::Exited, When::Down, Stopped),
    (Replacing, DpEv::Exited, When::Down, Stopped),
    (Stopping, DpEv::Exited, When::Down, Stopped),
    (Backoff, DpEv::Restart, When::Up, BackoffNew),
    (Starting, DpEv::Restart, When::Up, Replacing),
    (Running, DpEv::Restart, When::Up, Replacing),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PhaseEv {
    Reload,
    Shutdown,
    HandOver,
}

/// Signals: (from, event) → to. Every other combination is refused.
const PHASE: &[(PhaseKind, PhaseEv, PhaseKind)] = &[
    (Serving, PhaseEv::Reload, Reloading),
    (Serving, PhaseEv::Shutdown, ShuttingDown),
    (Reloading, PhaseEv::Shutdown, ShuttingDown),
];

/// SIGUSR2: (from, data plane) → to, only with a data plane the next controller
/// can adopt. Every other combination is refused.
const HAND_OVER: &[(PhaseKind, D, PhaseKind)] = &[(Serving, Running, HandingOver), (Reloading, Running, HandingOver)];

/// What SIGTERM to the controller does to the data plane: from → to (else unchanged).
const SHUTDOWN_DATA_PLANE: &[(D, D)] = &[(Backoff, Stopped), (BackoffNew, Stopped)];

/// Who started a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// Spawned or adopted by the controller.
    Ours,
    /// Someone else's, known by its registration only.
    Outside,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WEv {
    /// Its process registers (Hello/Rejoin answered).
    Register,
    SaidReady,
    SaidDraining,
    /// Its control connection closes.
    Closed,
    /// Its process exits.
    Exit,
}

/// What becomes of a worker record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum To {
    Is(WorkerKind),
    /// Forgotten (exited and holding no registration).
    Gone,
}

/// Worker events: (from, holds a registration, who, event) → to. Every other
/// combination is refused.
const WORKER: &[(WorkerKind, bool, Who, WEv, To)] = &[
    (Spawned, false, Who::Ours, WEv::Register, To::Is(Registered)),
    (Draining, false, Who::Ours, WEv::Register, To::Is(Draining)),
    (Retiring, false, Who::Ours, WEv::Register, To::Is(Retiring)),
    (Registered, true, Who::Ours, WEv::SaidReady, To::Is(Ready)),
    (Registered, true, Who::Outside, WEv::SaidReady, To::Is(Ready)),
    (Ready, true, Who::Ours, WEv::SaidReady, To::Is(Ready)),
    (Ready, true, Who::Outside, WEv::SaidReady, To::Is(Ready)),
    (Retiring, true, Who::Ours, WEv::SaidReady, To::Is(Retiring)),
    (Registered, true, Who::Ours, WEv::SaidDraining, To::Is(Draining)),
    (Registered, true, Who::Outside, WEv::SaidDraining, To::Is(Draining)),
    (Ready, true, Who::Ours, WEv::SaidDraining, To::Is(Draining)),
    (Ready, true, Who::Outside, WEv::SaidDraining, To::Is(Draining)),
    (Draining, true, Who::Ours, WEv::SaidDraining, To::Is(Draining)),
    (Draining, true, Who::Outside, WEv::SaidDraining, To::Is(Draining)),
    (Retiring, true, Who::Ours, WEv::SaidDraining, To::Is(Retiring)),
    (Registered, true, Who::Ours, WEv::Closed, To::Is(Spawned)),
    (Ready, true, Who::Ours, WEv::Closed, To::Is(Spawned)),
    (Draining, true, Who::Ours, WEv::Closed, To::Is(Draining)),
    (Retiring, true, Who::Ours, WEv::Closed, To::Is(Retiring)),
    (Exited, true, Who::Ours, WEv::Closed, To::Gone),
    (Registered, true, Who::Outside, WEv::Closed, To::Gone),
    (Ready, true, Who::Outside, WEv::Closed, To::Gone),
    (Draining, true, Who::Outside, WEv::Closed, To::Gone),
    (Spawned, false, Who::Ours, WEv::Exit, To::Gone),
    (Draining, false, Who::Ours, WEv::Exit, To::Gone),
    (Retiring, false, Who::Ours, WEv::Exit, To::Gone),
    (Registered, true, Who::Ours, WEv::Exit, To::Is(Exited)),
    (Ready, true, Who::Ours, WEv::Exit, To::Is(Exited)),
    (Draining, true, Who::Ours, WEv::Exit, To::Is(Exited)),
    (Retiring, true, Who::Ours, WEv::Exit, To::Is(Exited)),
];

/// What SIGTERM to the controller does to each of its own workers: from → (to,
/// signalled). A worker that drains already is not signalled again. Other workers
/// are unchanged.
const SHUTDOWN_WORKER: &[(WorkerKind, WorkerKind, bool)] = &[
    (Spawned, Retiring, true),
    (Registered, Retiring, true),
    (Ready, Retiring, true),
    (Draining, Retiring, false),
    (Retiring, Retiring, false),
];

/// The supervision tick's moves (anything else is unchanged); which of them may
/// happen when is checked in [`World::check_tick`].
const TICK_PHASE: &[(PhaseKind, PhaseKind)] = &[(Reloading, Serving)];
const TICK_DATA_PLANE: &[(D, D)] = &[
    // Shutting down: told to stop once the workers are gone (a replacing one was
    // told already), killed after DP_STOP_GRACE.
    (Starting, Stopping),
    (StartingNew, Stopping),
    (Running, Stopping),
    (Replacing, Stopping),
    (Stopping, Stopped),
    // Serving or reloading: a replacing one that did not stop in DP_STOP_GRACE is
    // killed, and the new one is due.
    (Replacing, BackoffNew),
];
const TICK_WORKER: &[(WorkerKind, To)] = &[
    // Scale-in (serving) or a reload step (reloading).
    (Spawned, To::Is(Retiring)),
    (Registered, To::Is(Retiring)),
    (Ready, To::Is(Retiring)),
    (Draining, To::Is(Retiring)),
    // Killed at the drain deadline (SIGTERM made every worker of ours Retiring).
    (Retiring, To::Is(Exited)),
    (Retiring, To::Gone),
];

fn data_plane_move(from: D, ev: DpEv, when: When) -> Option<D> {
    DATA_PLANE.iter().find(|r| (r.0, r.1, r.2) == (from, ev, when)).map(|r| r.3)
}

fn phase_move(from: PhaseKind, ev: PhaseEv, dp: D) -> Option<PhaseKind> {
    match ev {
        PhaseEv::HandOver => HAND_OVER.iter().find(|r| (r.0, r.1) == (from, dp)).map(|r| r.2),
        _ => PHASE.iter().find(|r| (r.0, r.1) == (from, ev)).map(|r| r.2),
    }
}

fn worker_move(from: WorkerKind, held: bool, who: Who, ev: WEv) -> Option<To> {
    WORKER.iter().find(|r| (r.0, r.1, r.2, r.3) == (from, held, who, ev)).map(|r| r.4)
}

// ------------------------------------------------------------ guards, from the state

/// A data-plane start is due: backing off, the time passed, serving or reloading.
fn due(lc: &Lifecycle<Fake>, now: Instant) -> bool {
    matches!(lc.dp, DataPlane::Backoff { until, .. } if now >= until) && when_of(lc.phase.kind()) == When::Up
}

/// A worker is wanted: the data plane runs, not shutting down, the replacement
/// backoff passed, fewer counted (the reload's old one aside) than --spawn-workers.
fn wanted(lc: &Lifecycle<Fake>, now: Instant) -> bool {
    let replacing = match &lc.phase {
        Phase::Reloading(Reload { step: Some(ReloadStep::AwaitReplacement { old, .. }), .. }) => Some(*old),
        _ => None,
    };
    let counted = lc
        .workers
        .iter()
        .filter(|w| w.managed && !matches!(w.phase, WorkerPhase::Retiring { .. } | WorkerPhase::Exited))
        .filter(|w| Some(w.id) != replacing)
        .count();
    matches!(lc.dp, DataPlane::Running { .. })
        && when_of(lc.phase.kind()) == When::Up
        && now >= lc.next_worker_spawn
        && counted < lc.spawn_workers
}

/// What [`Lifecycle::placeable_check_wanted`] should say: Placeable not told,
/// workers wanted, the data plane running, every wanted worker ready.
fn placeable_wanted(s: &Snap) -> bool {
    let counted: Vec<&W> = s.workers.values().filter(|w| w.counted).collect();
    !s.told_placeable
        && s.spawn_workers > 0
        && when_of(s.phase) == When::Up
        && s.dp == Running
        && counted.len() >= s.spawn_workers
        && counted.iter().all(|w| w.kind == Ready)
}

/// The options of the `n`-th RestartDataPlane (0: the first data plane's).
fn options(n: u32) -> Options {
    vec!["--generation".into(), n.to_string()]
}

// ------------------------------------------------------------ snapshots

/// One worker as the tables see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct W {
    kind: WorkerKind,
    pid: u32,
    who: Who,
    held: bool,
    proc: Option<i32>,
    counted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Snap {
    dp: D,
    dp_pid: Option<i32>,
    dp_due: bool,
    /// Replacing: told to stop then.
    dp_replacing_since: Option<Instant>,
    options: Options,
    rollback: Option<Options>,
    told_placeable: bool,
    spawn_workers: usize,
    phase: PhaseKind,
    replacing: Option<WorkerId>,
    workers: BTreeMap<WorkerId, W>,
    restarts: u64,
    replacements: u64,
    refused: u64,
    /// Everything but the refusal count, for "a refused event changes nothing".
    all: String,
}

fn snap(lc: &Lifecycle<Fake>, now: Instant) -> Snap {
    let workers = lc
        .workers
        .iter()
        .map(|w| {
            let who = if w.managed { Who::Ours } else { Who::Outside };
            let proc = w.proc.as_ref().map(|p| p.0);
            (w.id, W { kind: w.phase.kind(), pid: w.pid, who, held: w.reg.is_some(), proc, counted: w.counted() })
        })
        .collect();
    let dp_all = match &lc.dp {
        DataPlane::Backoff { until, first, rollback } => format!("backoff {until:?} {first} {rollback:?}"),
        DataPlane::Starting { proc, since, rollback } => format!("starting {proc:?} {since:?} {rollback:?}"),
        DataPlane::Running { proc, since, adopted } => format!("running {proc:?} {since:?} {adopted}"),
        DataPlane::Replacing { proc, since, adopted, rollback } => {
            format!("replacing {proc:?} {since:?} {adopted} {rollback:?}")
        }
        DataPlane::Stopping { proc, since, adopted } => format!("stopping {proc:?} {since:?} {adopted}"),
        DataPlane::Stopped => "stopped".into(),
    };
    let workers_all: Vec<String> = lc
        .workers
        .iter()
        .map(|w| format!("{:?} {} {} {:?} {:?} {:?} {:?}", w.id, w.pid, w.managed, w.proc, w.started, w.reg, w.phase))
        .collect();
    let all = format!(
        "{dp_all} {:?} | {:?} {} {:?} | {workers_all:?} {} | {:?} {} {:?} {} {:?} {:?} {} {}",
        lc.dp_options,
        lc.dp_backoff,
        lc.dp_restarts,
        lc.dp_last_exit,
        lc.next_worker,
        lc.phase,
        lc.spawn_workers,
        lc.drain_timeout,
        lc.worker_replacements,
        lc.worker_backoff,
        lc.next_worker_spawn,
        lc.told_placeable,
        lc.told_stopped,
    );
    Snap {
        dp: d_of(&lc.dp),
        dp_pid: lc.dp.pid(),
        dp_due: due(lc, now),
        dp_replacing_since: match lc.dp {
            DataPlane::Replacing { since, .. } => Some(since),
            _ => None,
        },
        options: lc.dp_options.clone(),
        rollback: lc.dp.rollback().cloned(),
        told_placeable: lc.told_placeable,
        spawn_workers: lc.spawn_workers,
        phase: lc.phase.kind(),
        replacing: lc.reload_replacing(),
        workers,
        restarts: lc.dp_restarts,
        replacements: lc.worker_replacements,
        refused: lc.refused,
        all,
    }
}

// ------------------------------------------------------------ the world

/// What the random part does.
#[derive(Clone, Debug)]
enum Op {
    Reload,
    Shutdown,
    HandOver,
    /// SIGHUP's re-read: `--spawn-workers` becomes n.
    Configure(usize),
    /// SIGHUP's re-read: new data-plane options.
    RestartDataPlane,
    /// The data plane says it places on these of the registered server ids (a
    /// bit mask over them; `u64::MAX`: on all).
    Places(u64),
    /// Time passes (ms), then the supervision tick.
    Advance(u64),
    /// A controller's tick: start what is due, spawn what is wanted, tick.
    Supervise,
    SpawnDataPlane,
    DataPlaneSpawnFails,
    DataPlaneReady,
    /// The data plane exits (or, with none running, a bogus exit).
    DataPlaneExits,
    SpawnWorker,
    WorkerSpawnFails,
    /// The i-th running worker process exits.
    WorkerExits(usize),
    /// An exit of a worker the lifecycle never had.
    BogusWorkerExit,
    /// The i-th running worker process of ours registers (a second time too).
    RegisterOurs(usize),
    /// A process someone else started registers.
    RegisterOutside,
    /// A registration on a connection that already holds one.
    RegisterAgain(usize),
    /// On the i-th connection ever opened (it may be closed).
    Say(usize, bool),
    Close(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Reload),
        1 => Just(Op::Shutdown),
        1 => Just(Op::HandOver),
        1 => (0usize..4).prop_map(Op::Configure),
        2 => Just(Op::RestartDataPlane),
        2 => prop_oneof![Just(u64::MAX), any::<u64>()].prop_map(Op::Places),
        6 => prop_oneof![0u64..300, 0u64..12_000, 0u64..130_000].prop_map(Op::Advance),
        8 => Just(Op::Supervise),
        2 => Just(Op::SpawnDataPlane),
        1 => Just(Op::DataPlaneSpawnFails),
        3 => Just(Op::DataPlaneReady),
        2 => Just(Op::DataPlaneExits),
        2 => Just(Op::SpawnWorker),
        1 => Just(Op::WorkerSpawnFails),
        3 => any::<usize>().prop_map(Op::WorkerExits),
        1 => Just(Op::BogusWorkerExit),
        5 => any::<usize>().prop_map(Op::RegisterOurs),
        1 => Just(Op::RegisterOutside),
        1 => any::<usize>().prop_map(Op::RegisterAgain),
        6 => (any::<usize>(), prop::bool::weighted(0.7)).prop_map(|(i, r)| Op::Say(i, r)),
        3 => any::<usize>().prop_map(Op::Close),
    ]
}

struct World {
    lc: Lifecycle<Fake>,
    now: Instant,
    next_pid: i32,
    next_token: u64,
    /// Processes that run (the lifecycle may or may not hold them).
    dp_procs: BTreeSet<i32>,
    worker_procs: BTreeSet<i32>,
    /// Every control connection opened, in order.
    tokens: Vec<u64>,
    /// SIGTERMs sent, per pid; and the ones of the step being checked.
    terms: BTreeMap<i32, u32>,
    step_terms: BTreeSet<i32>,
    /// Ids seen Exited, Retiring; the phase seen ShuttingDown.
    seen_exited: BTreeSet<WorkerId>,
    seen_retiring: BTreeSet<WorkerId>,
    seen_shutting_down: bool,
    seen_handed_over: bool,
    /// SIGTERMs sent to data-plane processes, per pid.
    dp_terms: BTreeMap<i32, u32>,
    /// Options handed out to RestartDataPlane so far.
    generation: u32,
    /// The step being checked is a DataPlanePlaces: whether its ids cover every
    /// counted worker's.
    places_cover: Option<bool>,
    told_placeable: u32,
    told_stopped: u32,
    log: Vec<String>,
    /// Worker processes that said Draining by themselves.
    said_draining: BTreeSet<i32>,
    /// Table rows taken (see `every_row_is_reached`).
    hits: BTreeSet<String>,
}

fn fail(w: &World, what: String) -> TestCaseError {
    TestCaseError::fail(format!("{what}\nsteps:\n  {}", w.log.join("\n  ")))
}

macro_rules! check {
    ($w:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(fail($w, format!($($fmt)+)));
        }
    };
}

/// How an event was classified before it was fed, to look its row up after.
enum Class {
    Dp(DpEv),
    Phase(PhaseEv),
    /// A worker event on this record (None: no record to act on).
    Worker(Option<WorkerId>, WEv),
    /// A new record, when taken.
    NewWorker(WorkerKind),
    /// A worker spawn (failed or not) reported when one is wanted or not.
    Spawn {
        wanted: bool,
        failed: bool,
    },
    /// SIGHUP's new `--spawn-workers`.
    Configure,
    /// What the data plane places on.
    Places,
    Tick,
}

impl World {
    fn new(spawn_workers: usize, adopt_dp: bool, adopted: &[bool]) -> Result<World, TestCaseError> {
        let now = Instant::now();
        let mut w = World {
            lc: Lifecycle::new(now, spawn_workers, Duration::from_secs(30), options(0), None, 0),
            now,
            next_pid: 1000,
            next_token: 100,
            dp_procs: BTreeSet::new(),
            worker_procs: BTreeSet::new(),
            tokens: Vec::new(),
            terms: BTreeMap::new(),
            step_terms: BTreeSet::new(),
            seen_exited: BTreeSet::new(),
            seen_retiring: BTreeSet::new(),
            seen_shutting_down: false,
            seen_handed_over: false,
            dp_terms: BTreeMap::new(),
            generation: 0,
            places_cover: None,
            told_placeable: 0,
            told_stopped: 0,
            log: Vec::new(),
            hits: BTreeSet::new(),
            said_draining: BTreeSet::new(),
        };
        if adopt_dp {
            let pid = w.pid();
            w.dp_procs.insert(pid);
            w.lc = Lifecycle::new(now, spawn_workers, Duration::from_secs(30), options(0), Some(Fake(pid)), 7);
            check!(&w, w.lc.dp.adopted() && w.lc.dataplane_running() == Some(pid), "adoption is a way into Running");
        }
        for &retiring in adopted {
            let pid = w.pid();
            w.worker_procs.insert(pid);
            let kind = if retiring { Retiring } else { Spawned };
            w.feed(Event::WorkerAdopted { proc: Fake(pid), retiring }, Class::NewWorker(kind))?;
        }
        Ok(w)
    }

    fn pid(&mut self) -> i32 {
        self.next_pid += 1;
        self.next_pid
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.tokens.push(self.next_token);
        self.next_token
    }

    fn when(&self) -> When {
        when_of(self.lc.phase.kind())
    }

    fn worker_id_of_pid(&self, pid: i32) -> Option<WorkerId> {
        self.lc.workers.iter().find(|w| w.proc.as_ref().is_some_and(|p| p.0 == pid)).map(|w| w.id)
    }

    fn run(&mut self, op: Op) -> Result<(), TestCaseError> {
        self.log.push(format!("{op:?}"));
        match op {
            Op::Reload => self.feed(Event::Reload, Class::Phase(PhaseEv::Reload)),
            Op::Shutdown => self.feed(Event::Shutdown, Class::Phase(PhaseEv::Shutdown)),
            Op::HandOver => self.feed(Event::HandOver, Class::Phase(PhaseEv::HandOver)),
            Op::Configure(n) => {
                let ev = Event::Configure { spawn_workers: n, drain_timeout: Duration::from_secs(30) };
                self.feed(ev, Class::Configure)
            }
            Op::RestartDataPlane => {
                self.generation += 1;
                let ev = Event::RestartDataPlane { options: options(self.generation) };
                self.feed(ev, Class::Dp(DpEv::Restart))
            }
            Op::Places(mask) => {
                let ids: Vec<u16> = self
                    .lc
                    .workers
                    .iter()
                    .filter_map(|w| w.server_id())
                    .enumerate()
                    .filter(|(i, _)| mask & (1u64 << (i % 64)) != 0)
                    .map(|(_, id)| id)
                    .collect();
                self.places(ids)
            }
            Op::Advance(ms) => {
                self.now += Duration::from_millis(ms);
                self.feed(Event::Tick, Class::Tick)
            }
            Op::Supervise => self.supervise(),
            Op::SpawnDataPlane => {
                let due = due(&self.lc, self.now);
                let pid = self.pid();
                self.dp_procs.insert(pid);
                self.feed(
                    Event::DataPlaneSpawned(Fake(pid)),
                    Class::Dp(if due { DpEv::SpawnedDue } else { DpEv::SpawnedEarly }),
                )
            }
            Op::DataPlaneSpawnFails => {
                let due = due(&self.lc, self.now);
                let ev = if due { DpEv::SpawnFailedDue } else { DpEv::SpawnFailedEarly };
                self.feed(Event::DataPlaneSpawnFailed("no such file".into()), Class::Dp(ev))
            }
            Op::DataPlaneReady => self.feed(Event::DataPlaneReady, Class::Dp(DpEv::Ready)),
            Op::DataPlaneExits => {
                // After a hand-over nobody hears it (the controller exits): the world
                // keeps what the lifecycle holds.
                if let Some(pid) = self.lc.dp.pid().filter(|_| !self.lc.handed_over()) {
                    self.dp_procs.remove(&pid);
                }
                self.feed(Event::DataPlaneExited("exit code 1".into()), Class::Dp(DpEv::Exited))
            }
            Op::SpawnWorker => {
                let wanted = wanted(&self.lc, self.now);
                let pid = self.pid();
                self.worker_procs.insert(pid);
                self.feed(Event::WorkerSpawned(Fake(pid)), Class::Spawn { wanted, failed: false })
            }
            Op::WorkerSpawnFails => {
                let wanted = wanted(&self.lc, self.now);
                self.feed(Event::WorkerSpawnFailed("no such file".into()), Class::Spawn { wanted, failed: true })
            }
            Op::WorkerExits(i) => {
                let running: Vec<i32> = self.worker_procs.iter().copied().collect();
                let Some(&pid) = running.get(i % running.len().max(1)) else { return Ok(()) };
                let Some(id) = self.worker_id_of_pid(pid) else { return Ok(()) };
                if !self.lc.handed_over() {
                    self.worker_procs.remove(&pid);
                }
                self.feed(Event::WorkerExited { id, how: "exit code 0".into() }, Class::Worker(Some(id), WEv::Exit))
            }
            Op::BogusWorkerExit => {
                let id = WorkerId(u64::MAX);
                self.feed(Event::WorkerExited { id, how: "?".into() }, Class::Worker(None, WEv::Exit))
            }
            Op::RegisterOurs(i) => {
                let ours: Vec<(WorkerId, u32)> =
                    self.lc.workers.iter().filter(|w| w.proc.is_some()).map(|w| (w.id, w.pid)).collect();
                let Some(&(id, pid)) = ours.get(i % ours.len().max(1)) else { return Ok(()) };
                let token = self.token();
                let ev = Event::Registered { token, pid, server_id: (token % 60_000) as u16, rejoined: i % 2 == 0 };
                let held = self.lc.workers.iter().any(|w| w.id == id && w.reg.is_some());
                if held {
                    // A second registration of the same process: an outside record.
                    self.feed(ev, Class::NewWorker(Registered))
                } else {
                    self.feed(ev, Class::Worker(Some(id), WEv::Register))
                }
            }
            Op::RegisterOutside => {
                let pid = self.pid() as u32;
                let token = self.token();
                let ev = Event::Registered { token, pid, server_id: (token % 60_000) as u16, rejoined: false };
                self.feed(ev, Class::NewWorker(Registered))
            }
            Op::RegisterAgain(i) => {
                let held: Vec<(u64, u32)> =
                    self.lc.workers.iter().filter_map(|w| Some((w.reg?.token, w.pid))).collect();
                let Some(&(token, pid)) = held.get(i % held.len().max(1)) else { return Ok(()) };
                let id = self.lc.worker_by_token(token).map(|w| w.id);
                let ev = Event::Registered { token, pid, server_id: 1, rejoined: false };
                // Not in the table for any phase: refused.
                self.feed(ev, Class::Worker(id, WEv::Register))
            }
            Op::Say(i, ready) => {
                let Some(&token) = self.tokens.get(i % self.tokens.len().max(1)) else { return Ok(()) };
                let id = self.lc.worker_by_token(token).map(|w| w.id);
                if let Some(pid) = self.lc.worker_by_token(token).and_then(|w| w.proc.as_ref()).filter(|_| !ready) {
                    self.said_draining.insert(pid.0);
                }
                let ev = if ready { WEv::SaidReady } else { WEv::SaidDraining };
                self.feed(Event::Said { token, ready }, Class::Worker(id, ev))
            }
            Op::Close(i) => {
                let Some(&token) = self.tokens.get(i % self.tokens.len().max(1)) else { return Ok(()) };
                let id = self.lc.worker_by_token(token).map(|w| w.id);
                self.feed(Event::RegistrationClosed { token }, Class::Worker(id, WEv::Closed))
            }
        }
    }

    /// The data plane says it places on `ids`.
    fn places(&mut self, ids: Vec<u16>) -> Result<(), TestCaseError> {
        let cover =
            self.lc.workers.iter().filter(|w| w.counted()).all(|w| w.server_id().is_some_and(|i| ids.contains(&i)));
        self.places_cover = Some(cover);
        let r = self.feed(Event::DataPlanePlaces { server_ids: ids }, Class::Places);
        self.places_cover = None;
        r
    }

    /// What `Ctl::tick` does, with processes that are only pids.
    fn supervise(&mut self) -> Result<(), TestCaseError> {
        check!(self, self.lc.dataplane_start_due(self.now).is_some() == due(&self.lc, self.now), "dataplane_start_due");
        if self.lc.dataplane_start_due(self.now).is_some() {
            let pid = self.pid();
            self.dp_procs.insert(pid);
            self.feed(Event::DataPlaneSpawned(Fake(pid)), Class::Dp(DpEv::SpawnedDue))?;
        }
        let mut n = 0;
        loop {
            let asks = self.lc.worker_wanted(self.now);
            check!(self, asks == wanted(&self.lc, self.now), "worker_wanted says {asks}");
            if !asks {
                break;
            }
            n += 1;
            check!(self, n <= 64, "worker_wanted never stops");
            let pid = self.pid();
            self.worker_procs.insert(pid);
            self.feed(Event::WorkerSpawned(Fake(pid)), Class::Spawn { wanted: true, failed: false })?;
        }
        let asks = self.lc.placeable_check_wanted();
        let b = snap(&self.lc, self.now);
        check!(self, asks == placeable_wanted(&b), "placeable_check_wanted says {asks}");
        if asks {
            // A data plane that places on every worker that said Ready.
            let ids = self.lc.workers.iter().filter(|w| w.phase == WorkerPhase::Ready).filter_map(|w| w.server_id());
            let ids = ids.collect();
            self.places(ids)?;
        }
        self.feed(Event::Tick, Class::Tick)
    }

    /// Feeds one event and checks the step.
    fn feed(&mut self, ev: Event<Fake>, class: Class) -> Result<(), TestCaseError> {
        let before = snap(&self.lc, self.now);
        let carried = match &ev {
            Event::DataPlaneSpawned(p) | Event::WorkerSpawned(p) | Event::WorkerAdopted { proc: p, .. } => Some(p.0),
            _ => None,
        };
        let result = self.lc.handle(self.now, ev);
        let after = snap(&self.lc, self.now);
        let outputs = match result {
            Ok(o) => {
                check!(self, after.refused == before.refused, "a taken event counted as refused");
                o
            }
            Err(r) => {
                check!(
                    self,
                    after.all == before.all,
                    "a refused event changed the state:\n{}\n{}",
                    before.all,
                    after.all
                );
                check!(self, after.refused == before.refused + 1, "a refused event was not counted");
                // Whatever process it carried comes back (and is stopped by the controller).
                let back = match &r.event {
                    Event::DataPlaneSpawned(p) | Event::WorkerSpawned(p) | Event::WorkerAdopted { proc: p, .. } => {
                        Some(p.0)
                    }
                    _ => None,
                };
                check!(self, back == carried, "a refused event lost its process");
                if let Some(pid) = back {
                    self.dp_procs.remove(&pid);
                    self.worker_procs.remove(&pid);
                }
                self.check_table(&class, &before, &after, false)?;
                return self.check(&before, &after, &[], false);
            }
        };
        // Killed processes are gone.
        self.step_terms.clear();
        for o in &outputs {
            match o {
                Output::Kill(procs) => {
                    for p in procs {
                        self.dp_procs.remove(&p.0);
                        self.worker_procs.remove(&p.0);
                    }
                }
                Output::Signal { pid, .. } => _ = self.step_terms.insert(*pid),
                Output::Became(_) => {}
            }
        }
        self.check_table(&class, &before, &after, true)?;
        self.check(&before, &after, &outputs, true)
    }

    /// The step against the tables.
    fn check_table(&mut self, class: &Class, b: &Snap, a: &Snap, taken: bool) -> Result<(), TestCaseError> {
        let when = when_of(b.phase);
        if !matches!(class, Class::Dp(_)) {
            check!(self, a.options == b.options, "options changed by {} event", "a non-data-plane");
        }
        let others_unchanged =
            |skip: Option<WorkerId>| b.workers.iter().all(|(id, w)| Some(*id) == skip || a.workers.get(id) == Some(w));
        match *class {
            Class::Dp(ev) => {
                let want = data_plane_move(b.dp, ev, when);
                if want.is_some() {
                    self.hits.insert(format!("dp {:?} {ev:?} {when:?}", b.dp));
                }
                check!(
                    self,
                    taken == want.is_some(),
                    "data plane {:?} × {ev:?} ({when:?}): taken {taken}, table {want:?}",
                    b.dp
                );
                if let Some(to) = want {
                    check!(self, a.dp == to, "data plane {:?} × {ev:?}: went to {:?}, table says {to:?}", b.dp, a.dp);
                }
                check!(self, a.phase == b.phase && others_unchanged(None), "a data-plane event moved something else");
                // The options: new ones with the previous ones held; back to the
                // previous ones when a data plane with the new ones exits before ready.
                let restarted = taken && ev == DpEv::Restart;
                let rolled_back = taken && (b.dp, ev, when) == (StartingNew, DpEv::Exited, When::Up);
                if restarted {
                    check!(
                        self,
                        a.options != b.options && a.rollback.as_ref() == Some(&b.options),
                        "a restart with new options: options {:?} → {:?}, rollback {:?}",
                        b.options,
                        a.options,
                        a.rollback
                    );
                } else if rolled_back {
                    check!(
                        self,
                        Some(&a.options) == b.rollback.as_ref() && a.rollback.is_none(),
                        "no rollback: options {:?} → {:?}, held {:?}",
                        b.options,
                        a.options,
                        b.rollback
                    );
                } else {
                    check!(
                        self,
                        a.options == b.options,
                        "options changed by {ev:?}: {:?} → {:?}",
                        b.options,
                        a.options
                    );
                }
                if a.dp == Running && b.dp == StartingNew {
                    check!(
                        self,
                        a.rollback.is_none(),
                        "a data plane that is ready with the new options still rolls back"
                    );
                }
            }
            Class::Phase(ev) => {
                let want = phase_move(b.phase, ev, b.dp);
                if want.is_some() {
                    self.hits.insert(format!("phase {:?} {ev:?}", b.phase));
                }
                check!(self, taken == want.is_some(), "phase {:?} × {ev:?}: taken {taken}, table {want:?}", b.phase);
                if let Some(to) = want {
                    check!(self, a.phase == to, "phase {:?} × {ev:?}: went to {:?}, table {to:?}", b.phase, a.phase);
                }
                if taken && ev == PhaseEv::Shutdown {
                    let dp_to = SHUTDOWN_DATA_PLANE.iter().find(|r| r.0 == b.dp).map_or(b.dp, |r| r.1);
                    check!(
                        self,
                        a.dp == dp_to,
                        "shutdown moved the data plane {:?} → {:?}, table {dp_to:?}",
                        b.dp,
                        a.dp
                    );
                    for (id, w) in &b.workers {
                        let row = SHUTDOWN_WORKER.iter().find(|r| r.0 == w.kind && w.who == Who::Ours);
                        if let Some(r) = row {
                            self.hits.insert(format!("shutdown {:?}", r.0));
                        }
                        let to = row.map_or(w.kind, |r| r.1);
                        let got = a.workers.get(id).map(|x| x.kind);
                        check!(
                            self,
                            got == Some(to),
                            "shutdown moved worker {:?} {:?} → {got:?}, table {to:?}",
                            w.who,
                            w.kind
                        );
                        let termed = row.is_some_and(|r| r.2);
                        let got = w.proc.is_some_and(|p| self.step_terms.contains(&p));
                        check!(
                            self,
                            got == termed,
                            "shutdown signalled a {:?} {:?} worker: {got}, table {termed}",
                            w.who,
                            w.kind
                        );
                    }
                } else {
                    check!(
                        self,
                        a.dp == b.dp && a.dp_pid == b.dp_pid && others_unchanged(None),
                        "a reload or a hand-over moved a worker or the data plane"
                    );
                }
            }
            Class::Worker(id, ev) => {
                let want = id.and_then(|id| b.workers.get(&id)).and_then(|w| worker_move(w.kind, w.held, w.who, ev));
                // Nothing registers while the controller shuts down, and nothing
                // changes once it handed over.
                let want = if (ev == WEv::Register && when == When::Down) || when == When::Gone { None } else { want };
                if let (Some(w), Some(_)) = (id.and_then(|i| b.workers.get(&i)), want) {
                    self.hits.insert(format!("worker {:?} {} {:?} {ev:?}", w.kind, w.held, w.who));
                }
                check!(
                    self,
                    taken == want.is_some(),
                    "worker {:?} × {ev:?}: taken {taken}, table {want:?}",
                    id.and_then(|i| b.workers.get(&i))
                );
                if let (Some(id), Some(to)) = (id, want) {
                    let got = a.workers.get(&id).map_or(To::Gone, |w| To::Is(w.kind));
                    check!(self, got == to, "worker {:?} × {ev:?}: went to {got:?}, table {to:?}", b.workers[&id]);
                }
                check!(
                    self,
                    a.phase == b.phase && a.dp == b.dp && others_unchanged(id),
                    "a worker event moved something else"
                );
            }
            Class::NewWorker(kind) => {
                let new: Vec<&W> =
                    a.workers.iter().filter(|(id, _)| !b.workers.contains_key(id)).map(|(_, w)| w).collect();
                if taken {
                    check!(self, new.len() == 1 && new[0].kind == kind, "a new record is {kind:?}: {new:?}");
                }
                check!(self, others_unchanged(None), "a new record moved another");
            }
            Class::Spawn { wanted, failed } => {
                check!(self, taken == wanted, "a worker spawn (failed: {failed}) taken {taken} while wanted {wanted}");
                let new = a.workers.len() - b.workers.len().min(a.workers.len());
                check!(self, new == usize::from(taken && !failed), "a spawn added {new} records");
                check!(self, others_unchanged(None), "a spawn moved another worker");
                // Only workers wanted are spawned: never more counted than
                // --spawn-workers (the reload's old one aside).
                let counted = a.workers.iter().filter(|(id, w)| w.counted && a.replacing != Some(**id)).count();
                check!(
                    self,
                    !taken || counted <= self.lc.spawn_workers,
                    "{counted} counted workers, want {}",
                    self.lc.spawn_workers
                );
            }
            Class::Configure => {
                check!(self, taken == (when == When::Up), "configure taken {taken} while {:?}", b.phase);
                check!(self, a.dp == b.dp && a.phase == b.phase && others_unchanged(None), "configure moved something");
            }
            Class::Places => {
                check!(self, taken == (b.dp == Running && when != When::Gone), "places taken {taken} with {:?}", b.dp);
                check!(self, a.dp == b.dp && a.phase == b.phase && others_unchanged(None), "places moved something");
            }
            Class::Tick => {
                check!(self, taken, "the tick is never refused");
                self.check_tick(b, a)?;
                if a.phase != b.phase {
                    self.hits.insert(format!("tick phase {:?} {:?}", b.phase, a.phase));
                }
                if a.dp != b.dp {
                    self.hits.insert(format!("tick dp {:?} {:?}", b.dp, a.dp));
                }
                for (id, w) in &b.workers {
                    let to = a.workers.get(id).map_or(To::Gone, |x| To::Is(x.kind));
                    if to != To::Is(w.kind) {
                        self.hits.insert(format!("tick worker {:?} {to:?}", w.kind));
                    }
                }
            }
        }
        Ok(())
    }

    /// The tick moves only what TICK_* allow, and only when its rules say so.
    fn check_tick(&self, b: &Snap, a: &Snap) -> Result<(), TestCaseError> {
        check!(
            self,
            a.phase == b.phase || TICK_PHASE.contains(&(b.phase, a.phase)),
            "tick moved the phase {:?} → {:?}",
            b.phase,
            a.phase
        );
        check!(
            self,
            a.dp == b.dp || TICK_DATA_PLANE.contains(&(b.dp, a.dp)),
            "tick moved the data plane {:?} → {:?}",
            b.dp,
            a.dp
        );
        if (b.dp, a.dp) == (Replacing, BackoffNew) {
            // Killed: it was told to stop for new options DP_STOP_GRACE ago.
            let told = b.dp_replacing_since.is_some_and(|t| self.now.saturating_duration_since(t) >= DP_STOP_GRACE);
            check!(self, told && when_of(b.phase) == When::Up, "a replacing data plane killed early");
        } else if a.dp != b.dp {
            check!(self, b.phase == ShuttingDown, "the data plane stops only when shutting down");
            if a.dp == Stopping {
                let left = a.workers.values().any(|w| w.proc.is_some());
                check!(self, !left, "the data plane is told to stop while workers of ours run");
            }
        }
        for (id, w) in &b.workers {
            let to = a.workers.get(id).map_or(To::Gone, |x| To::Is(x.kind));
            if to == To::Is(w.kind) {
                continue;
            }
            check!(
                self,
                w.who == Who::Ours && TICK_WORKER.contains(&(w.kind, to)),
                "tick moved worker {w:?} to {to:?}"
            );
            match (b.phase, to) {
                (Serving, To::Is(Retiring)) => {
                    // Scale-in: only extras, never below --spawn-workers.
                    let counted = a.workers.values().filter(|w| w.counted).count();
                    check!(self, counted >= self.lc.spawn_workers, "scale-in went below --spawn-workers");
                }
                (Reloading, To::Is(Retiring)) => {
                    // The reload's old worker retires once the others are ready.
                    check!(self, b.replacing == Some(*id), "a reload retired a worker it was not replacing");
                    check!(self, b.rollback.is_none(), "a reload retired a worker while the data plane restarts");
                    let ready = a.workers.values().filter(|w| w.counted && w.kind == Ready).count();
                    let counted = a.workers.values().filter(|w| w.counted).count();
                    check!(
                        self,
                        ready == counted && ready >= self.lc.spawn_workers,
                        "a reload retired a worker with {ready} of {counted} ready (want {})",
                        self.lc.spawn_workers
                    );
                }
                (ShuttingDown, To::Gone | To::Is(Exited)) => {
                    let Phase::ShuttingDown(s) = &self.lc.phase else { unreachable!() };
                    check!(self, self.now >= s.deadline, "a worker was killed before the drain deadline");
                }
                (phase, to) => return Err(fail(self, format!("tick moved worker {w:?} to {to:?} while {phase:?}"))),
            }
        }
        Ok(())
    }

    /// Invariants after every step, taken or refused.
    fn check(&mut self, b: &Snap, a: &Snap, outputs: &[Output<Fake>], taken: bool) -> Result<(), TestCaseError> {
        // At most one data-plane process runs, and it is the one the lifecycle holds.
        let held: BTreeSet<i32> = a.dp_pid.into_iter().collect();
        check!(self, self.dp_procs == held, "data-plane processes {:?}, the lifecycle holds {:?}", self.dp_procs, held);
        // Every worker process of ours that runs is held, once.
        let held: Vec<i32> = a.workers.values().filter_map(|w| w.proc).collect();
        let held_set: BTreeSet<i32> = held.iter().copied().collect();
        check!(self, held.len() == held_set.len(), "a worker process is held twice");
        check!(self, self.worker_procs == held_set, "worker processes {:?}, held {:?}", self.worker_procs, held_set);
        // Records are consistent with their phase.
        for w in a.workers.values() {
            let ok = match (w.kind, w.who) {
                (Spawned, who) => who == Who::Ours && !w.held && w.proc.is_some(),
                (Registered | Ready, Who::Ours) => w.held && w.proc.is_some(),
                (Draining | Retiring, Who::Ours) => w.proc.is_some(),
                (Retiring, Who::Outside) => false,
                (Exited, _) => w.held && w.proc.is_none(),
                (_, Who::Outside) => w.held && w.proc.is_none(),
            };
            check!(self, ok, "inconsistent record {w:?}");
        }
        // Exited is terminal, Retiring is never undone, ShuttingDown never ends.
        for (id, w) in &a.workers {
            check!(
                self,
                !self.seen_exited.contains(id) || w.kind == Exited,
                "worker {id:?} came back from Exited as {:?}",
                w.kind
            );
            check!(
                self,
                !self.seen_retiring.contains(id) || matches!(w.kind, Retiring | Exited),
                "worker {id:?} came back from Retiring as {:?}",
                w.kind
            );
            match w.kind {
                Exited => _ = self.seen_exited.insert(*id),
                Retiring => _ = self.seen_retiring.insert(*id),
                _ => {}
            }
        }
        check!(self, !self.seen_shutting_down || a.phase == ShuttingDown, "ShuttingDown went back to {:?}", a.phase);
        self.seen_shutting_down |= a.phase == ShuttingDown;
        // A hand-over leaves everything as it is, then and after: the next
        // controller adopts the data plane and every worker.
        check!(self, !self.seen_handed_over || a.phase == HandingOver, "HandingOver went back to {:?}", a.phase);
        if a.phase == HandingOver {
            let stopped = outputs.iter().any(|o| matches!(o, Output::Signal { .. } | Output::Kill(_)));
            check!(self, !stopped, "the hand-over signalled or killed something");
            check!(
                self,
                a.dp == Running && a.dp_pid == b.dp_pid && a.workers == b.workers,
                "the hand-over moved the data plane or a worker: {:?} → {:?}",
                b.dp,
                a.dp
            );
            if self.seen_handed_over {
                check!(self, outputs.is_empty() && a.all == b.all, "something changed after the hand-over");
            }
        }
        self.seen_handed_over |= a.phase == HandingOver;
        if a.phase == ShuttingDown {
            check!(
                self,
                !matches!(a.dp, Backoff | Starting) || b.dp == a.dp,
                "a data plane started while shutting down"
            );
        }
        // A start is a restart unless it is the first on these sockets.
        let starting = |d: D| matches!(d, Starting | StartingNew);
        if starting(a.dp) && !starting(b.dp) {
            check!(self, a.restarts == b.restarts || a.restarts == b.restarts + 1, "restarts jumped");
        } else {
            check!(self, a.restarts == b.restarts, "restarts changed without a start");
        }
        // A replacement is counted exactly when a counted worker of ours exits
        // unexpectedly (not retiring, not the reload's old one, not shutting down).
        let died = b
            .workers
            .iter()
            .filter(|(id, w)| {
                w.proc.is_some()
                    && a.workers.get(id).is_none_or(|x| x.proc.is_none())
                    && w.kind != Retiring
                    && b.replacing != Some(**id)
                    && b.phase != ShuttingDown
            })
            .count() as u64;
        check!(
            self,
            a.replacements == b.replacements + died,
            "replacements {} → {}, {died} died",
            b.replacements,
            a.replacements
        );
        // Outputs.
        let mut became = Vec::new();
        for o in outputs {
            match o {
                Output::Signal { pid, sig } => {
                    check!(self, *sig == libc::SIGTERM, "only SIGTERM is signalled (SIGKILL goes with Kill)");
                    if Some(*pid) == b.dp_pid {
                        // Told to stop once: to shut down, or to be replaced.
                        check!(
                            self,
                            a.dp_pid == b.dp_pid && matches!(a.dp, Stopping | Replacing),
                            "SIGTERM to a data plane that is not stopping: {:?} → {:?}",
                            b.dp,
                            a.dp
                        );
                        let n = self.dp_terms.entry(*pid).or_default();
                        *n += 1;
                        check!(self, *n == 1, "data plane {pid} was told to stop twice");
                    } else {
                        let w = a.workers.values().find(|w| w.proc == Some(*pid));
                        check!(
                            self,
                            w.is_some_and(|w| w.kind == Retiring),
                            "SIGTERM to {pid}, not a retiring worker of ours: {w:?}"
                        );
                        let n = self.terms.entry(*pid).or_default();
                        *n += 1;
                        check!(self, *n == 1, "worker {pid} was told to drain twice (a second SIGTERM ends its drain)");
                    }
                }
                Output::Kill(procs) => {
                    for p in procs {
                        let ours = b.dp_pid == Some(p.0) || b.workers.values().any(|w| w.proc == Some(p.0));
                        check!(self, ours, "killed {}, not a process the lifecycle held", p.0);
                    }
                }
                Output::Became(x) => became.push(*x),
            }
        }
        // A data plane told to stop is signalled as it moves: to Replacing, or to
        // Stopping unless it was replacing (told already).
        let told = matches!((b.dp, a.dp), (Starting | StartingNew | Running, Stopping | Replacing));
        let signalled = outputs.iter().any(|o| matches!(o, Output::Signal { pid, .. } if Some(*pid) == b.dp_pid));
        check!(self, told == signalled, "data plane {:?} → {:?}: signalled {signalled}", b.dp, a.dp);
        let reload_started = b.phase == Serving && a.phase == Reloading;
        let reload_ended = b.phase == Reloading && a.phase == Serving;
        let count = |x: Became| became.iter().filter(|b| **b == x).count();
        check!(self, count(Became::ReloadStarted) == usize::from(reload_started), "ReloadStarted: {became:?}");
        check!(
            self,
            count(Became::ReloadDone) + count(Became::ReloadStopped) == usize::from(reload_ended),
            "ReloadDone/ReloadStopped: {became:?}"
        );
        check!(
            self,
            count(Became::ShuttingDown) == usize::from(b.phase != ShuttingDown && a.phase == ShuttingDown),
            "ShuttingDown: {became:?}"
        );
        check!(
            self,
            count(Became::HandingOver) == usize::from(b.phase != HandingOver && a.phase == HandingOver),
            "HandingOver: {became:?}"
        );
        let started = became.iter().filter(|x| matches!(x, Became::DataPlaneStarted { .. })).count();
        check!(self, started == usize::from(starting(a.dp) && !starting(b.dp)), "DataPlaneStarted: {became:?}");
        // Placeable (READY=1) exactly when a client can be served for the first
        // time: with workers to wait for, when the data plane says it places on
        // every one of them, all ready; without, once the data plane runs.
        let should_tell = taken
            && !b.told_placeable
            && if a.spawn_workers == 0 {
                a.dp == Running && when_of(a.phase) == When::Up
            } else {
                self.places_cover == Some(true) && placeable_wanted(b)
            };
        check!(
            self,
            count(Became::Placeable) == usize::from(should_tell),
            "Placeable told {} times, should {should_tell} (places cover {:?}): {:?} {:?}",
            count(Became::Placeable),
            self.places_cover,
            a.dp,
            a.workers
        );
        if count(Became::Placeable) > 0 {
            self.told_placeable += 1;
        }
        check!(self, self.told_placeable <= 1, "Placeable told twice");
        if count(Became::Stopped) > 0 {
            self.told_stopped += 1;
            check!(self, a.dp == Stopped && a.workers.values().all(|w| w.proc.is_none()), "Stopped too early");
        }
        check!(
            self,
            self.told_stopped <= 1 && (self.told_stopped == 1) == self.lc.is_done(),
            "Stopped told {} times, done {}",
            self.told_stopped,
            self.lc.is_done()
        );
        Ok(())
    }

    /// A well-behaved world for a while: what is due starts, the data plane becomes
    /// ready, workers register and say Ready, a signalled worker exits, and (with
    /// `drains_end`) so does one that said Draining by itself.
    fn behave(&mut self, steps: usize, drains_end: bool) -> Result<(), TestCaseError> {
        for _ in 0..steps {
            self.log.push("behave".into());
            if self.lc.handed_over() {
                // The controller exits; a last tick changes nothing.
                return self.feed(Event::Tick, Class::Tick);
            }
            self.supervise()?;
            if matches!(d_of(&self.lc.dp), Starting | StartingNew) {
                self.feed(Event::DataPlaneReady, Class::Dp(DpEv::Ready))?;
            }
            let termed: Vec<i32> = self
                .worker_procs
                .iter()
                .copied()
                .filter(|p| self.terms.contains_key(p) || (drains_end && self.said_draining.contains(p)))
                .collect();
            for pid in termed {
                self.worker_procs.remove(&pid);
                if let Some(id) = self.worker_id_of_pid(pid) {
                    self.feed(
                        Event::WorkerExited { id, how: "exit code 0".into() },
                        Class::Worker(Some(id), WEv::Exit),
                    )?;
                }
            }
            if matches!(d_of(&self.lc.dp), Stopping | Replacing) {
                if let Some(pid) = self.lc.dp.pid() {
                    self.dp_procs.remove(&pid);
                }
                self.feed(Event::DataPlaneExited("exit code 0".into()), Class::Dp(DpEv::Exited))?;
            }
            let unregistered: Vec<(WorkerId, u32)> =
                self.lc.workers.iter().filter(|w| w.proc.is_some() && w.reg.is_none()).map(|w| (w.id, w.pid)).collect();
            for (id, pid) in unregistered {
                if self.when() == When::Down {
                    break;
                }
                let token = self.token();
                let ev = Event::Registered { token, pid, server_id: (token % 60_000) as u16, rejoined: false };
                self.feed(ev, Class::Worker(Some(id), WEv::Register))?;
            }
            let registered: Vec<(WorkerId, u64)> = self
                .lc
                .workers
                .iter()
                .filter(|w| w.phase == WorkerPhase::Registered)
                .filter_map(|w| Some((w.id, w.reg?.token)))
                .collect();
            for (id, token) in registered {
                self.feed(Event::Said { token, ready: true }, Class::Worker(Some(id), WEv::SaidReady))?;
            }
            self.now += Duration::from_millis(100);
        }
        Ok(())
    }
}

/// One random case: the ops, then a world that behaves; returns the table rows
/// it took.
fn run_case(
    spawn_workers: usize,
    adopt_dp: bool,
    adopted: Vec<bool>,
    ops: Vec<Op>,
) -> Result<BTreeSet<String>, TestCaseError> {
    let adopted = if adopt_dp { adopted } else { Vec::new() };
    let mut w = World::new(spawn_workers, adopt_dp, &adopted)?;
    for op in ops {
        w.run(op)?;
    }
    // A while with the world's self-drained workers still there (a reload retires
    // them like any other), then their drains end: they exit.
    w.behave(20, false)?;
    // Backoffs are at most 10 s, a reload step waits at most 120 s.
    w.behave(200, true)?;
    if w.lc.handed_over() {
        // Handed over: the data plane and every worker process of ours still run
        // and are still held (World::check), for the next controller.
        prop_assert_eq!(d_of(&w.lc.dp), Running);
        prop_assert_eq!(w.told_stopped, 0);
        prop_assert!(!w.lc.is_done());
        return Ok(w.hits);
    }
    if w.lc.phase.kind() != ShuttingDown {
        prop_assert_eq!(w.lc.phase.kind(), Serving, "{}", w.lc.summary());
        prop_assert_eq!(d_of(&w.lc.dp), Running);
        let counted: Vec<&Worker<Fake>> = w.lc.workers.iter().filter(|x| x.counted()).collect();
        prop_assert_eq!(counted.len(), w.lc.spawn_workers, "{}", w.lc.summary());
        prop_assert!(counted.iter().all(|x| x.phase == WorkerPhase::Ready), "{}", w.lc.summary());
        prop_assert_eq!(w.told_placeable, 1, "Placeable was told once it served");
        w.log.push("Shutdown".into());
        w.feed(Event::Shutdown, Class::Phase(PhaseEv::Shutdown))?;
    }
    // Drain deadline 30 s + 5 s, then at most 5 s for the data plane.
    w.behave(500, true)?;
    prop_assert!(w.lc.is_done(), "{}", w.lc.summary());
    prop_assert_eq!(w.told_stopped, 1);
    Ok(w.hits)
}

fn case() -> impl Strategy<Value = (usize, bool, Vec<bool>, Vec<Op>)> {
    (0usize..4, any::<bool>(), prop::collection::vec(any::<bool>(), 0..3), prop::collection::vec(op(), 0..120))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random event sequences against the tables and invariants; then, left to a
    /// world that behaves, the lifecycle settles (every wanted worker ready, no
    /// reload left running) unless it is shutting down, and a shutdown finishes
    /// with every worker gone and the data plane stopped.
    #[test]
    fn random_events_follow_the_table_and_settle((spawn_workers, adopt_dp, adopted, ops) in case()) {
        run_case(spawn_workers, adopt_dp, adopted, ops)?;
    }
}

/// The random cases reach every row of the tables (a row no case reaches is a row
/// the proptest does not check).
#[test]
fn every_row_is_reached() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    // Rare at random: scale-in of an adopted extra that drains by itself (it is not
    // signalled again).
    let directed = vec![Op::RegisterOurs(1), Op::Say(0, false), Op::Advance(0)];
    let mut hits = run_case(1, true, vec![false, false], directed).expect("the directed case passes");
    // A starting data plane that exits while shutting down.
    let directed = vec![Op::Supervise, Op::Shutdown, Op::DataPlaneExits];
    hits.extend(run_case(1, false, vec![], directed).expect("the directed case passes"));
    // A worker of ours that drains by itself, loses its connection and registers again.
    let directed = vec![Op::RegisterOurs(0), Op::Say(0, false), Op::Close(0), Op::RegisterOurs(0)];
    hits.extend(run_case(1, true, vec![false], directed).expect("the directed case passes"));
    for _ in 0..512 {
        let (n, adopt, adopted, ops) = case().new_tree(&mut runner).expect("a case").current();
        hits.extend(run_case(n, adopt, adopted, ops).expect("the case passes"));
    }
    let mut rows: Vec<String> = Vec::new();
    rows.extend(DATA_PLANE.iter().map(|r| format!("dp {:?} {:?} {:?}", r.0, r.1, r.2)));
    rows.extend(PHASE.iter().map(|r| format!("phase {:?} {:?}", r.0, r.1)));
    rows.extend(HAND_OVER.iter().map(|r| format!("phase {:?} {:?}", r.0, PhaseEv::HandOver)));
    rows.extend(WORKER.iter().map(|r| format!("worker {:?} {} {:?} {:?}", r.0, r.1, r.2, r.3)));
    rows.extend(SHUTDOWN_WORKER.iter().map(|r| format!("shutdown {:?}", r.0)));
    rows.extend(TICK_PHASE.iter().map(|r| format!("tick phase {:?} {:?}", r.0, r.1)));
    rows.extend(TICK_DATA_PLANE.iter().map(|r| format!("tick dp {:?} {:?}", r.0, r.1)));
    rows.extend(TICK_WORKER.iter().map(|r| format!("tick worker {:?} {:?}", r.0, r.1)));
    let missed: Vec<&String> = rows.iter().filter(|r| !hits.contains(*r)).collect();
    assert!(missed.is_empty(), "rows no case reached: {missed:#?}");
}

/// The tables list each (from, event) once: a lookup cannot depend on row order.
#[test]
fn tables_have_no_duplicate_rows() {
    let mut seen = BTreeSet::new();
    for r in WORKER {
        assert!(seen.insert((r.0, r.1, r.2 == Who::Ours, r.3 as u8)), "duplicate worker row {r:?}");
    }
    let mut seen = BTreeSet::new();
    for r in DATA_PLANE {
        assert!(seen.insert((r.0, r.1 as u8, r.2 as u8)), "duplicate data-plane row {r:?}");
    }
    let mut seen = BTreeSet::new();
    for r in PHASE {
        assert!(seen.insert((r.0, r.1 as u8)), "duplicate phase row {r:?}");
    }
}

/// A rolling reload by hand: each old worker is replaced only once its
/// replacement is ready, and is told to drain exactly once.
#[test]
fn a_reload_replaces_each_worker_after_its_replacement_is_ready() {
    let mut w = World::new(2, false, &[]).unwrap();
    w.behave(10, true).unwrap();
    let old: BTreeSet<u32> = w.lc.workers.iter().map(|x| x.pid).collect();
    assert_eq!(old.len(), 2);
    w.run(Op::Reload).unwrap();
    w.behave(30, true).unwrap();
    assert_eq!(w.lc.phase.kind(), Serving, "{}", w.lc.summary());
    let new: BTreeSet<u32> = w.lc.workers.iter().filter(|x| x.counted()).map(|x| x.pid).collect();
    assert_eq!(new.len(), 2);
    assert!(old.is_disjoint(&new), "every worker was replaced");
    assert!(old.iter().all(|p| w.terms.get(&(*p as i32)) == Some(&1)), "{:?}", w.terms);
    assert_eq!(w.lc.worker_replacements, 0, "a reload is not a replacement");
}

/// SIGHUP with new data-plane options during a reload: the running data plane is
/// told to stop once, the new one starts with the new options at once (no
/// backoff, a restart), and the workers are replaced only after it runs.
#[test]
fn a_restart_with_new_options_keeps_them_once_ready_and_the_reload_waits_for_it() {
    let mut w = World::new(1, false, &[]).unwrap();
    w.behave(10, true).unwrap();
    let old_dp = w.lc.dp.pid().unwrap();
    let old_worker = w.lc.workers[0].pid;
    w.run(Op::RestartDataPlane).unwrap();
    w.run(Op::Reload).unwrap();
    assert_eq!(d_of(&w.lc.dp), Replacing);
    assert_eq!(w.dp_terms.get(&old_dp), Some(&1));
    // It exits; the reload does not replace the worker meanwhile.
    w.run(Op::DataPlaneExits).unwrap();
    assert_eq!(d_of(&w.lc.dp), BackoffNew);
    w.run(Op::Supervise).unwrap();
    assert_eq!(d_of(&w.lc.dp), StartingNew, "started at once");
    assert_eq!(w.lc.dp_restarts, 1);
    assert!(matches!(w.lc.phase, Phase::Reloading(Reload { step: Some(ReloadStep::DataPlaneRestarting { .. }), .. })));
    assert!(w.terms.is_empty(), "no worker retired while the data plane restarts");
    w.behave(30, true).unwrap();
    assert_eq!(w.lc.phase.kind(), Serving, "{}", w.lc.summary());
    assert_eq!((d_of(&w.lc.dp), w.lc.dp_options.clone()), (Running, options(1)));
    assert_eq!(w.terms.get(&(old_worker as i32)), Some(&1), "the worker was replaced after");
}

/// A data plane with new options that exits before it is ready: the previous
/// options come back for the next start, and a later SIGHUP may try again.
#[test]
fn a_restart_with_new_options_rolls_back_when_the_new_one_fails() {
    let mut w = World::new(1, false, &[]).unwrap();
    w.behave(10, true).unwrap();
    w.run(Op::RestartDataPlane).unwrap();
    w.run(Op::DataPlaneExits).unwrap();
    w.run(Op::Supervise).unwrap();
    assert_eq!((d_of(&w.lc.dp), w.lc.dp_options.clone()), (StartingNew, options(1)));
    // A second SIGHUP is refused while the first restart runs.
    w.run(Op::RestartDataPlane).unwrap();
    assert_eq!(w.lc.dp_options, options(1));
    w.run(Op::DataPlaneExits).unwrap();
    assert_eq!((d_of(&w.lc.dp), w.lc.dp_options.clone()), (Backoff, options(0)), "rolled back");
    w.behave(10, true).unwrap();
    assert_eq!(d_of(&w.lc.dp), Running);
    w.run(Op::RestartDataPlane).unwrap();
    assert_eq!((d_of(&w.lc.dp), w.lc.dp_options.clone()), (Replacing, options(3)), "tried again");
}

/// SIGUSR2 during a reload, with a worker retiring: nothing is signalled,
/// killed or moved, and every later event but the tick is refused (World::check).
/// While a restart with new options runs it is refused (the next controller
/// could not adopt the data plane).
#[test]
fn a_hand_over_leaves_everything_running() {
    let mut w = World::new(2, false, &[]).unwrap();
    w.behave(10, true).unwrap();
    w.run(Op::RestartDataPlane).unwrap();
    w.run(Op::HandOver).unwrap();
    assert_eq!(w.lc.phase.kind(), Serving, "refused while the data plane is replaced");
    w.behave(10, true).unwrap();
    w.run(Op::Reload).unwrap();
    w.behave(2, false).unwrap();
    let before: Vec<(u32, WorkerPhase)> = w.lc.workers.iter().map(|x| (x.pid, x.phase)).collect();
    let terms = w.terms.clone();
    w.run(Op::HandOver).unwrap();
    assert!(w.lc.handed_over());
    for op in [Op::Shutdown, Op::Reload, Op::Advance(200_000), Op::Supervise, Op::WorkerExits(0), Op::RestartDataPlane]
    {
        w.run(op).unwrap();
    }
    let after: Vec<(u32, WorkerPhase)> = w.lc.workers.iter().map(|x| (x.pid, x.phase)).collect();
    assert_eq!(before, after);
    assert_eq!(w.terms, terms);
    assert!(w.lc.workers_file().lines().count() >= 2, "{}", w.lc.workers_file());
}

/// Placeable (READY=1) waits for the data plane to place on every wanted worker:
/// Ready said to the controller is not enough.
#[test]
fn placeable_waits_for_the_data_plane_to_place_on_every_worker() {
    let mut w = World::new(2, false, &[]).unwrap();
    for _ in 0..5 {
        w.run(Op::Supervise).unwrap();
        if d_of(&w.lc.dp) == Starting {
            w.feed(Event::DataPlaneReady, Class::Dp(DpEv::Ready)).unwrap();
        }
    }
    let ours: Vec<(WorkerId, u32)> = w.lc.workers.iter().map(|x| (x.id, x.pid)).collect();
    assert_eq!(ours.len(), 2);
    let mut ids = Vec::new();
    for (id, pid) in ours {
        let token = w.token();
        ids.push((token % 60_000) as u16);
        let ev = Event::Registered { token, pid, server_id: (token % 60_000) as u16, rejoined: false };
        w.feed(ev, Class::Worker(Some(id), WEv::Register)).unwrap();
        w.feed(Event::Said { token, ready: true }, Class::Worker(Some(id), WEv::SaidReady)).unwrap();
    }
    assert!(w.lc.placeable_check_wanted());
    w.places(vec![ids[0]]).unwrap();
    assert!(!w.lc.told_placeable, "one of two placed");
    w.places(ids.clone()).unwrap();
    assert!(w.lc.told_placeable);
    assert!(!w.lc.placeable_check_wanted());
}

/// The status names (docs/operations.md, `demux status`).
#[test]
fn status_names() {
    let w = [Spawned, Registered, Ready, Draining, Retiring, Exited].map(WorkerKind::name);
    assert_eq!(w, ["starting", "registered", "ready", "draining", "retiring", "exited"]);
    use DataPlaneKind as K;
    let d = [K::Backoff, K::Starting, K::Running, K::Replacing, K::Stopping, K::Stopped].map(DataPlaneKind::name);
    assert_eq!(d, ["restarting", "starting", "running", "replacing", "stopping", "stopped"]);
    let p = [Serving, Reloading, ShuttingDown, HandingOver].map(PhaseKind::name);
    assert_eq!(p, ["serving", "reloading", "shutting_down", "handing_over"]);
}

// ------------------------------------------------------------ the move_to_* methods

/// A data-plane `move_to_*` (Backoff comes three ways: an exit or failed start, a
/// restart with new options planned while none runs, a kill of one that did not
/// stop for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    Starting,
    Running,
    Replacing,
    Backoff,
    BackoffPlan,
    BackoffKilled,
    Stopping,
    Stopped,
}

/// Data-plane moves: from → the legal `move_to_*` and where each goes. Every other
/// one is refused and leaves the state as it was.
const DATA_PLANE_MOVES: &[(D, &[(Move, D)])] = &[
    (
        Backoff,
        &[
            (Move::Starting, Starting),
            (Move::Backoff, Backoff),
            (Move::BackoffPlan, BackoffNew),
            (Move::Stopped, Stopped),
        ],
    ),
    (BackoffNew, &[(Move::Starting, StartingNew), (Move::Backoff, BackoffNew), (Move::Stopped, Stopped)]),
    (
        Starting,
        &[
            (Move::Running, Running),
            (Move::Replacing, Replacing),
            (Move::Backoff, Backoff),
            (Move::Stopping, Stopping),
            (Move::Stopped, Stopped),
        ],
    ),
    (
        StartingNew,
        &[(Move::Running, Running), (Move::Backoff, Backoff), (Move::Stopping, Stopping), (Move::Stopped, Stopped)],
    ),
    (
        Running,
        &[(Move::Replacing, Replacing), (Move::Backoff, Backoff), (Move::Stopping, Stopping), (Move::Stopped, Stopped)],
    ),
    (
        Replacing,
        &[
            (Move::Backoff, BackoffNew),
            (Move::BackoffKilled, BackoffNew),
            (Move::Stopping, Stopping),
            (Move::Stopped, Stopped),
        ],
    ),
    (Stopping, &[(Move::Stopped, Stopped)]),
    (Stopped, &[]),
];

fn data_plane(d: D, now: Instant) -> DataPlane<Fake> {
    let old = || Some(options(1));
    match d {
        Backoff => DataPlane::Backoff { until: now, first: false, rollback: None },
        BackoffNew => DataPlane::Backoff { until: now, first: false, rollback: old() },
        Starting => DataPlane::Starting { proc: Fake(7), since: now, rollback: None },
        StartingNew => DataPlane::Starting { proc: Fake(7), since: now, rollback: old() },
        Running => DataPlane::Running { proc: Fake(7), since: now, adopted: true },
        Replacing => DataPlane::Replacing { proc: Fake(7), since: now, adopted: true, rollback: options(1) },
        Stopping => DataPlane::Stopping { proc: Fake(7), since: now, adopted: true },
        Stopped => DataPlane::Stopped,
    }
}

#[test]
fn data_plane_moves_follow_their_table() {
    let now = Instant::now();
    let all = [
        Move::Starting,
        Move::Running,
        Move::Replacing,
        Move::Backoff,
        Move::BackoffPlan,
        Move::BackoffKilled,
        Move::Stopping,
        Move::Stopped,
    ];
    for (from, legal) in DATA_PLANE_MOVES {
        for m in all {
            let mut dp = data_plane(*from, now);
            let (ok, back) = match m {
                Move::Starting => match dp.move_to_starting(Fake(8), now) {
                    Ok(_) => (true, None),
                    Err((_, p)) => (false, Some(p.0)),
                },
                Move::Running => (dp.move_to_running().is_ok(), None),
                Move::Replacing => (dp.move_to_replacing(options(2), now).is_ok(), None),
                Move::Backoff => (dp.move_to_backoff(now, now, None).is_ok(), None),
                Move::BackoffPlan => (dp.move_to_backoff(now, now, Some(options(2))).is_ok(), None),
                Move::BackoffKilled => match dp.move_to_backoff_killed(now) {
                    Ok(p) => (true, Some(p.0)),
                    Err(_) => (false, None),
                },
                Move::Stopping => (dp.move_to_stopping(now).is_ok(), None),
                Move::Stopped => (dp.move_to_stopped().is_ok(), None),
            };
            let want = legal.iter().find(|(x, _)| *x == m).map(|(_, to)| *to);
            assert_eq!(ok, want.is_some(), "data plane {from:?} × {m:?}");
            match want {
                Some(to) => {
                    assert_eq!(d_of(&dp), to, "{from:?} × {m:?}");
                    if m == Move::BackoffKilled {
                        assert_eq!(back, Some(7), "the process to kill is handed back");
                    }
                }
                None => {
                    let before = data_plane(*from, now);
                    assert_eq!(
                        (d_of(&dp), dp.pid(), dp.rollback()),
                        (*from, before.pid(), before.rollback()),
                        "a refused move changed it"
                    );
                    assert_eq!(back, (m == Move::Starting).then_some(8), "the process is handed back");
                }
            }
        }
    }
}

/// Worker moves: (from, managed) → the `move_to_*` that are legal.
const WORKER_MOVES: &[(WorkerKind, bool, &[WorkerKind])] = &[
    (Spawned, true, &[Registered, Retiring, Exited]),
    (Registered, true, &[Ready, Draining, Retiring, Spawned, Exited]),
    (Registered, false, &[Ready, Draining, Exited]),
    (Ready, true, &[Ready, Draining, Retiring, Spawned, Exited]),
    (Ready, false, &[Ready, Draining, Exited]),
    (Draining, true, &[Draining, Retiring, Exited]),
    (Draining, false, &[Draining, Exited]),
    (Retiring, true, &[Exited]),
    (Exited, true, &[]),
    (Exited, false, &[]),
];

#[test]
fn worker_moves_follow_their_table() {
    let now = Instant::now();
    let all = [Spawned, Registered, Ready, Draining, Retiring, Exited];
    for (from, managed, legal) in WORKER_MOVES {
        let phase = match from {
            Spawned => WorkerPhase::Spawned,
            Registered => WorkerPhase::Registered,
            Ready => WorkerPhase::Ready,
            Draining => WorkerPhase::Draining,
            Retiring => WorkerPhase::Retiring { since: now, why: Retire::Reload },
            Exited => WorkerPhase::Exited,
        };
        for to in all {
            let live = *from != Exited && *managed;
            let mut w = Worker {
                id: WorkerId(1),
                pid: 9,
                managed: *managed,
                proc: live.then_some(Fake(9)),
                started: now,
                reg: None,
                phase,
            };
            let ok = match to {
                Spawned => w.move_to_spawned().is_ok(),
                Registered => w.move_to_registered().is_ok(),
                Ready => w.move_to_ready().is_ok(),
                Draining => w.move_to_draining().is_ok(),
                Retiring => w.move_to_retiring(now, Retire::ScaleIn).is_ok(),
                Exited => w.move_to_exited().is_ok(),
            };
            assert_eq!(ok, legal.contains(&to), "worker {from:?} (managed {managed}) → {to:?}");
            let want = if ok { to } else { *from };
            assert_eq!(w.phase.kind(), want, "{from:?} → {to:?}");
            assert_eq!(w.proc.is_some(), live && want != Exited, "the process goes only with Exited");
        }
    }
}

/// Phase moves: from → the `move_to_*` that are legal. ShuttingDown and
/// HandingOver go nowhere.
const PHASE_MOVES: &[(PhaseKind, &[PhaseKind])] = &[
    (Serving, &[Reloading, ShuttingDown, HandingOver]),
    (Reloading, &[Serving, ShuttingDown, HandingOver]),
    (ShuttingDown, &[]),
    (HandingOver, &[]),
];

#[test]
fn phase_moves_follow_their_table() {
    let now = Instant::now();
    for (from, legal) in PHASE_MOVES {
        for to in [Serving, Reloading, ShuttingDown, HandingOver] {
            let mut p = match from {
                Serving => Phase::Serving,
                Reloading => Phase::Reloading(Reload { queue: VecDeque::new(), step: None }),
                ShuttingDown => Phase::ShuttingDown(Shutdown { deadline: now }),
                HandingOver => Phase::HandingOver,
            };
            let ok = match to {
                Serving => p.move_to_serving().is_ok(),
                Reloading => p.move_to_reloading(Reload { queue: VecDeque::new(), step: None }).is_ok(),
                ShuttingDown => p.move_to_shutting_down(Shutdown { deadline: now }).is_ok(),
                HandingOver => p.move_to_handing_over().is_ok(),
            };
            assert_eq!(ok, legal.contains(&to), "phase {from:?} → {to:?}");
            assert_eq!(p.kind(), if ok { to } else { *from });
        }
    }
}
