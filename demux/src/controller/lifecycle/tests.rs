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

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use DataPlaneKind::{Backoff, Running, Starting, Stopped, Stopping};
use PhaseKind::{Reloading, Serving, ShuttingDown};
use WorkerKind::{Draining, Exited, Ready, Registered, Retiring, Spawned};

/// A process that is only a pid.
#[derive(Debug, PartialEq, Eq)]
struct Fake(i32);

impl Process for Fake {
    fn pid(&self) -> i32 {
        self.0
    }
}

// ------------------------------------------------------------ the tables

/// Whether the controller is shutting down when the event arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    Up,
    Down,
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
}

/// Data-plane events: (from, event, when) → to. Every other combination is refused.
const DATA_PLANE: &[(DataPlaneKind, DpEv, When, DataPlaneKind)] = &[
    (Backoff, DpEv::SpawnedDue, When::Up, Starting),
    (Backoff, DpEv::SpawnFailedDue, When::Up, Backoff),
    (Starting, DpEv::Ready, When::Up, Running),
    (Starting, DpEv::Ready, When::Down, Running),
    (Starting, DpEv::Exited, When::Up, Backoff),
    (Running, DpEv::Exited, When::Up, Backoff),
    (Starting, DpEv::Exited, When::Down, Stopped),
    (Running, DpEv::Exited, When::Down, Stopped),
    (Stopping, DpEv::Exited, When::Down, Stopped),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PhaseEv {
    Reload,
    Shutdown,
}

/// Signals: (from, event) → to. Every other combination is refused.
const PHASE: &[(PhaseKind, PhaseEv, PhaseKind)] = &[
    (Serving, PhaseEv::Reload, Reloading),
    (Serving, PhaseEv::Shutdown, ShuttingDown),
    (Reloading, PhaseEv::Shutdown, ShuttingDown),
];

/// What SIGTERM to the controller does to the data plane: from → to (else unchanged).
const SHUTDOWN_DATA_PLANE: &[(DataPlaneKind, DataPlaneKind)] = &[(Backoff, Stopped)];

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
const TICK_DATA_PLANE: &[(DataPlaneKind, DataPlaneKind)] =
    &[(Starting, Stopping), (Running, Stopping), (Stopping, Stopped)];
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

fn data_plane_move(from: DataPlaneKind, ev: DpEv, when: When) -> Option<DataPlaneKind> {
    DATA_PLANE.iter().find(|r| (r.0, r.1, r.2) == (from, ev, when)).map(|r| r.3)
}

fn phase_move(from: PhaseKind, ev: PhaseEv) -> Option<PhaseKind> {
    PHASE.iter().find(|r| (r.0, r.1) == (from, ev)).map(|r| r.2)
}

fn worker_move(from: WorkerKind, held: bool, who: Who, ev: WEv) -> Option<To> {
    WORKER.iter().find(|r| (r.0, r.1, r.2, r.3) == (from, held, who, ev)).map(|r| r.4)
}

// ------------------------------------------------------------ guards, from the state

/// A data-plane start is due: backing off, the time passed, not shutting down.
fn due(lc: &Lifecycle<Fake>, now: Instant) -> bool {
    matches!(lc.dp, DataPlane::Backoff { until, .. } if now >= until) && lc.phase.kind() != ShuttingDown
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
        && lc.phase.kind() != ShuttingDown
        && now >= lc.next_worker_spawn
        && counted < lc.spawn_workers
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
    dp: DataPlaneKind,
    dp_pid: Option<i32>,
    dp_due: bool,
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
        DataPlane::Backoff { until, first } => format!("backoff {until:?} {first}"),
        DataPlane::Starting { proc, since } => format!("starting {proc:?} {since:?}"),
        DataPlane::Running { proc, since, adopted } => format!("running {proc:?} {since:?} {adopted}"),
        DataPlane::Stopping { proc, since, adopted } => format!("stopping {proc:?} {since:?} {adopted}"),
        DataPlane::Stopped => "stopped".into(),
    };
    let workers_all: Vec<String> = lc
        .workers
        .iter()
        .map(|w| format!("{:?} {} {} {:?} {:?} {:?} {:?}", w.id, w.pid, w.managed, w.proc, w.started, w.reg, w.phase))
        .collect();
    let all = format!(
        "{dp_all} | {:?} {} {:?} | {workers_all:?} {} | {:?} {} {} {:?} {:?} {} {}",
        lc.dp_backoff,
        lc.dp_restarts,
        lc.dp_last_exit,
        lc.next_worker,
        lc.phase,
        lc.spawn_workers,
        lc.worker_replacements,
        lc.worker_backoff,
        lc.next_worker_spawn,
        lc.told_placeable,
        lc.told_stopped,
    );
    Snap {
        dp: lc.dp.kind(),
        dp_pid: lc.dp.pid(),
        dp_due: due(lc, now),
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
    Tick,
}

impl World {
    fn new(spawn_workers: usize, adopt_dp: bool, adopted: &[bool]) -> Result<World, TestCaseError> {
        let now = Instant::now();
        let mut w = World {
            lc: Lifecycle::new(now, spawn_workers, Duration::from_secs(30), None, 0),
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
            told_placeable: 0,
            told_stopped: 0,
            log: Vec::new(),
            hits: BTreeSet::new(),
            said_draining: BTreeSet::new(),
        };
        if adopt_dp {
            let pid = w.pid();
            w.dp_procs.insert(pid);
            w.lc = Lifecycle::new(now, spawn_workers, Duration::from_secs(30), Some(Fake(pid)), 7);
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
        if self.lc.phase.kind() == ShuttingDown {
            When::Down
        } else {
            When::Up
        }
    }

    fn worker_id_of_pid(&self, pid: i32) -> Option<WorkerId> {
        self.lc.workers.iter().find(|w| w.proc.as_ref().is_some_and(|p| p.0 == pid)).map(|w| w.id)
    }

    fn run(&mut self, op: Op) -> Result<(), TestCaseError> {
        self.log.push(format!("{op:?}"));
        match op {
            Op::Reload => self.feed(Event::Reload, Class::Phase(PhaseEv::Reload)),
            Op::Shutdown => self.feed(Event::Shutdown, Class::Phase(PhaseEv::Shutdown)),
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
                if let Some(pid) = self.lc.dp.pid() {
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
                self.worker_procs.remove(&pid);
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
                return self.check(&before, &after, &[]);
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
        self.check(&before, &after, &outputs)
    }

    /// The step against the tables.
    fn check_table(&mut self, class: &Class, b: &Snap, a: &Snap, taken: bool) -> Result<(), TestCaseError> {
        let when = if b.phase == ShuttingDown { When::Down } else { When::Up };
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
            }
            Class::Phase(ev) => {
                let want = phase_move(b.phase, ev);
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
                    check!(self, a.dp == b.dp && others_unchanged(None), "a reload moved a worker or the data plane");
                }
            }
            Class::Worker(id, ev) => {
                let want = id.and_then(|id| b.workers.get(&id)).and_then(|w| worker_move(w.kind, w.held, w.who, ev));
                // Nothing registers while the controller shuts down.
                let want = if ev == WEv::Register && when == When::Down { None } else { want };
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
        if a.dp != b.dp {
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
    fn check(&mut self, b: &Snap, a: &Snap, outputs: &[Output<Fake>]) -> Result<(), TestCaseError> {
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
        if a.phase == ShuttingDown {
            check!(
                self,
                !matches!(a.dp, Backoff | Starting) || b.dp == a.dp,
                "a data plane started while shutting down"
            );
        }
        // A start is a restart unless it is the first on these sockets.
        if a.dp == Starting && b.dp != Starting {
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
                    if Some(*pid) == a.dp_pid {
                        check!(
                            self,
                            a.dp == Stopping && b.dp != Stopping,
                            "SIGTERM to a data plane that is not stopping"
                        );
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
        let started = became.iter().filter(|x| matches!(x, Became::DataPlaneStarted { .. })).count();
        check!(self, started == usize::from(a.dp == Starting && b.dp != Starting), "DataPlaneStarted: {became:?}");
        if count(Became::Placeable) > 0 {
            self.told_placeable += 1;
            let counted: Vec<&W> = a.workers.values().filter(|w| w.counted).collect();
            check!(
                self,
                a.dp == Running
                    && a.phase != ShuttingDown
                    && counted.len() >= self.lc.spawn_workers
                    && counted.iter().all(|w| w.kind == Ready),
                "Placeable while not every wanted worker is ready: {:?} {counted:?}",
                a.dp
            );
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
            self.supervise()?;
            if self.lc.dp.kind() == Starting {
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
            if self.lc.dp.kind() == Stopping {
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
    if w.lc.phase.kind() != ShuttingDown {
        prop_assert_eq!(w.lc.phase.kind(), Serving, "{}", w.lc.summary());
        prop_assert_eq!(w.lc.dp.kind(), Running);
        let counted: Vec<&Worker<Fake>> = w.lc.workers.iter().filter(|x| x.counted()).collect();
        prop_assert_eq!(counted.len(), spawn_workers, "{}", w.lc.summary());
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
    for _ in 0..512 {
        let (n, adopt, adopted, ops) = case().new_tree(&mut runner).expect("a case").current();
        hits.extend(run_case(n, adopt, adopted, ops).expect("the case passes"));
    }
    let mut rows: Vec<String> = Vec::new();
    rows.extend(DATA_PLANE.iter().map(|r| format!("dp {:?} {:?} {:?}", r.0, r.1, r.2)));
    rows.extend(PHASE.iter().map(|r| format!("phase {:?} {:?}", r.0, r.1)));
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
        assert!(seen.insert((r.0, r.1 as u8, r.2 == When::Up)), "duplicate data-plane row {r:?}");
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

/// The status names (docs/operations.md, `demux status`).
#[test]
fn status_names() {
    let w = [Spawned, Registered, Ready, Draining, Retiring, Exited].map(WorkerKind::name);
    assert_eq!(w, ["starting", "registered", "ready", "draining", "retiring", "exited"]);
    let d = [Backoff, Starting, Running, Stopping, Stopped].map(DataPlaneKind::name);
    assert_eq!(d, ["restarting", "starting", "running", "stopping", "stopped"]);
    let p = [Serving, Reloading, ShuttingDown].map(PhaseKind::name);
    assert_eq!(p, ["serving", "reloading", "shutting_down"]);
}

// ------------------------------------------------------------ the move_to_* methods

/// Data-plane moves: from → the `move_to_*` that are legal. Every other one is
/// refused and leaves the state as it was.
const DATA_PLANE_MOVES: &[(DataPlaneKind, &[DataPlaneKind])] = &[
    (Backoff, &[Starting, Backoff, Stopped]),
    (Starting, &[Running, Backoff, Stopping, Stopped]),
    (Running, &[Backoff, Stopping, Stopped]),
    (Stopping, &[Stopped]),
    (Stopped, &[]),
];

fn data_plane(kind: DataPlaneKind, now: Instant) -> DataPlane<Fake> {
    match kind {
        Backoff => DataPlane::Backoff { until: now, first: false },
        Starting => DataPlane::Starting { proc: Fake(7), since: now },
        Running => DataPlane::Running { proc: Fake(7), since: now, adopted: true },
        Stopping => DataPlane::Stopping { proc: Fake(7), since: now, adopted: true },
        Stopped => DataPlane::Stopped,
    }
}

#[test]
fn data_plane_moves_follow_their_table() {
    let now = Instant::now();
    let all = [Backoff, Starting, Running, Stopping, Stopped];
    for (from, legal) in DATA_PLANE_MOVES {
        for to in all {
            let mut dp = data_plane(*from, now);
            let (ok, back) = match to {
                Starting => match dp.move_to_starting(Fake(8), now) {
                    Ok(_) => (true, None),
                    Err((_, p)) => (false, Some(p)),
                },
                Running => (dp.move_to_running().is_ok(), None),
                Backoff => (dp.move_to_backoff(now, now).is_ok(), None),
                Stopping => (dp.move_to_stopping(now).is_ok(), None),
                Stopped => (dp.move_to_stopped().is_ok(), None),
            };
            assert_eq!(ok, legal.contains(&to), "data plane {from:?} → {to:?}");
            if ok {
                assert_eq!(dp.kind(), to, "{from:?} → {to:?}");
            } else {
                assert_eq!((dp.kind(), dp.pid()), (*from, data_plane(*from, now).pid()), "a refused move changed it");
                assert_eq!(back.map(|p| p.0), (to == Starting).then_some(8), "the process is handed back");
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

/// Phase moves: from → the `move_to_*` that are legal. ShuttingDown goes nowhere.
const PHASE_MOVES: &[(PhaseKind, &[PhaseKind])] =
    &[(Serving, &[Reloading, ShuttingDown]), (Reloading, &[Serving, ShuttingDown]), (ShuttingDown, &[])];

#[test]
fn phase_moves_follow_their_table() {
    let now = Instant::now();
    for (from, legal) in PHASE_MOVES {
        for to in [Serving, Reloading, ShuttingDown] {
            let mut p = match from {
                Serving => Phase::Serving,
                Reloading => Phase::Reloading(Reload { queue: VecDeque::new(), step: None }),
                ShuttingDown => Phase::ShuttingDown(Shutdown { deadline: now }),
            };
            let ok = match to {
                Serving => p.move_to_serving().is_ok(),
                Reloading => p.move_to_reloading(Reload { queue: VecDeque::new(), step: None }).is_ok(),
                ShuttingDown => p.move_to_shutting_down(Shutdown { deadline: now }).is_ok(),
            };
            assert_eq!(ok, legal.contains(&to), "phase {from:?} → {to:?}");
            assert_eq!(p.kind(), if ok { to } else { *from });
        }
    }
}
