//! Upgrading to new binaries without dropping a connection (docs/operations.md
//! "Upgrading"): `demux upgrade --state-dir DIR [--demux-bin PATH] [--worker-bin
//! PATH]`, or SIGUSR1 to the controller.
//!
//! The client writes `DIR/upgrade.request` (`demux PATH` / `worker PATH` lines;
//! without the file SIGUSR1 upgrades to the binaries at the present paths), sends
//! SIGUSR1 and waits for `DIR/upgrade.result`. The controller, one step at a time,
//! each checked before the next:
//!
//! 1. Preflight: the new binary's `demux check-state` says it takes over the state
//!    directory (its format, controller/state_format.rs, and the key file) and
//!    which protocol window it speaks; a window with no version in common with ours
//!    is refused with the error naming both (docs/wire.md "Versions"). Nothing
//!    has changed yet.
//! 2. The data plane restarts from the new binary on the same sockets (the
//!    lifecycle's restart with new options, whose executable is the first option):
//!    the kernel keeps the sockets, the new data plane attaches its own fast-path
//!    program to them, established connections wait out the gap (rejoin grace). A
//!    new data plane that exits before it is ready, or is not ready within
//!    [`DATAPLANE_READY_TIMEOUT`] (then it is killed), gives way to the previous
//!    one again.
//! 3. The workers roll to the new worker binary one at a time (the rolling reload:
//!    the new one becomes placeable, then the old one drains and exits). A new
//!    worker that exits, or a reload that stops, fails the step.
//! 4. The controller re-executes itself from the new binary with its own command
//!    line (its pid stays, and with it its children and systemd's main pid): the
//!    new controller adopts the data plane and the workers as after a hand-over,
//!    and writes the result once it serves.
//!
//! A failed step rolls everything back to the previous binaries (the data plane
//! restarted from the old one, then the workers rolled back) and the result says
//! why.

use super::lifecycle::{Event, Options, PhaseKind, WorkerPhase};
use super::{state, Ctl};
use anyhow::{anyhow, bail, Context, Result};
use proto::wire::Window;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest run of the new binary's `check-state`.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the new data plane's ready file.
pub(super) const DATAPLANE_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Per worker, besides its drain timeout: the longest a rolling step may take.
const WORKER_STEP_MARGIN: Duration = Duration::from_secs(60);
/// The hidden flag that relabels a build's protocol version (tests only): a new
/// binary speaks its own, so it is not passed on to it.
const PROTOCOL_VERSION_FLAG: &str = "--protocol-version";

/// The binaries the appliance runs from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Binaries {
    pub demux: PathBuf,
    pub worker: PathBuf,
}

/// An upgrade under way.
pub(super) struct Upgrade {
    /// The request's id (echoed in the result).
    id: Option<String>,
    from: Binaries,
    to: Binaries,
    /// The request named a worker binary (the new controller gets `--worker-bin`).
    worker_named: bool,
    old_options: Options,
    new_options: Options,
    step: Step,
    /// Workers started from the new binary (their pids).
    new_workers: Vec<u32>,
    /// The workers' step began (a rollback rolls them back too).
    workers_rolled: bool,
    /// Why a step failed, noticed outside the tick (a new worker's exit).
    failure: Option<String>,
    /// The new data plane was killed for not becoming ready in time.
    killed_slow_dataplane: bool,
    /// When step 4 last asked the lifecycle to hand over.
    exec_asked: Instant,
}

enum Step {
    DataPlane {
        since: Instant,
    },
    Workers {
        since: Instant,
    },
    RollBack {
        why: String,
        stage: RollBack,
    },
    /// Handing over to the new controller (tick re-executes once handed over).
    Exec,
}

#[derive(Clone, Copy)]
enum RollBack {
    DataPlane,
    /// The interrupted rolling reload finishes (its new workers from the old binary).
    WorkersFinishing,
    /// A rolling reload back to the old binary.
    Workers,
}

/// `DIR/upgrade.request` (written by `demux upgrade`; none: SIGUSR1 alone).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Echoed in the result, so a client reads its own outcome.
    pub id: Option<String>,
    pub demux: Option<PathBuf>,
    pub worker: Option<PathBuf>,
}

/// The request's text: `id ID`, `demux PATH` and `worker PATH` lines (absolute
/// paths), each at most once.
pub fn parse_request(text: &str) -> Result<Request> {
    let mut r = Request::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line.split_once(' ').ok_or_else(|| anyhow!("upgrade request line {line:?}"))?;
        let value = value.trim();
        let path = || -> Result<PathBuf> {
            let p = PathBuf::from(value);
            if !p.is_absolute() {
                bail!("upgrade request: {key} path {value:?} is not absolute");
            }
            Ok(p)
        };
        let slot_taken = match key {
            "id" => r.id.replace(value.to_string()).is_some(),
            "demux" => r.demux.replace(path()?).is_some(),
            "worker" => r.worker.replace(path()?).is_some(),
            _ => bail!("upgrade request: unknown key {key:?}"),
        };
        if slot_taken {
            bail!("upgrade request: {key} given twice");
        }
    }
    Ok(r)
}

fn request_text(r: &Request) -> String {
    let mut t = String::new();
    if let Some(id) = &r.id {
        t.push_str(&format!("id {id}\n"));
    }
    for (k, p) in [("demux", &r.demux), ("worker", &r.worker)] {
        if let Some(p) = p {
            t.push_str(&format!("{k} {}\n", p.display()));
        }
    }
    t
}

/// `--protocol-version V` / `--protocol-version=V` taken out of a command line.
fn without_protocol_version(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == PROTOCOL_VERSION_FLAG {
            skip = true;
        } else if !a.starts_with(&format!("{PROTOCOL_VERSION_FLAG}=")) {
            out.push(a.clone());
        }
    }
    out
}

/// `/proc/self/exe` names a replaced file `PATH (deleted)`: the new one is at PATH.
fn present_path(p: &Path) -> PathBuf {
    let s = p.display().to_string();
    PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s))
}

/// The window a `check-state` output announces (`protocol OLDEST NEWEST`).
fn parse_window(out: &str) -> Option<Window> {
    let line = out.lines().find_map(|l| l.strip_prefix("protocol "))?;
    let mut it = line.split_whitespace().map(|n| n.parse::<u8>().ok());
    let w = Window { oldest: it.next()??, newest: it.next()?? };
    w.is_valid().then_some(w)
}

/// `demux check-state --state-dir DIR` (hidden; an upgrade's preflight runs it
/// with the new binary): whether this build takes the directory over, and the
/// protocol window it speaks.
pub fn check_state(dir: &Path, controller_args: Option<Vec<std::ffi::OsString>>) -> Result<String> {
    let p = state::Paths::new(dir);
    let command_line = match controller_args {
        Some(argv) => check_command_line(argv)?,
        None => "controller command line not checked".into(),
    };
    let format = super::state_format::check(&p)?;
    let keys = match state::read_private(&p.keys())? {
        Some(t) => {
            let k = proto::keyfile::KeyFile::parse(&t).map_err(|e| anyhow!("{}: {e}", p.keys().display()))?;
            format!("keys ok (newest generation {})", k.keys.newest.generation.get())
        }
        None => "keys none yet".into(),
    };
    let w = sys::protocol::window();
    Ok(format!(
        "state-format {format} (this build: {})\n{keys}\n{command_line}\nprotocol {} {}",
        super::state_format::STATE_FORMAT,
        w.oldest,
        w.newest
    ))
}

/// `check-state --controller-args-stdin`: the NUL-separated command line.
pub fn args_from_stdin() -> Result<Vec<std::ffi::OsString>> {
    use std::io::Read;
    use std::os::unix::ffi::OsStringExt;
    let mut buf = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut buf).context("reading the command line from stdin")?;
    // A terminating NUL ends the last argument; it starts no empty one.
    if buf.last() == Some(&0) {
        buf.pop();
    }
    Ok(buf.split(|b| *b == 0).map(|a| std::ffi::OsString::from_vec(a.to_vec())).collect())
}

/// Whether this build takes `argv` as a controller's command line (its `--config`
/// file included) and passes the checks that change nothing (`controller::plan`).
fn check_command_line(argv: Vec<std::ffi::OsString>) -> Result<String> {
    let effective = crate::config::effective_argv(argv)?;
    let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(&effective)
        .map_err(|e| anyhow!("the controller's command line: {}", e.to_string().lines().next().unwrap_or("")))?;
    let (dp, opts) = match cli.command {
        None if cli.controller.state_dir.is_some() || cli.controller.config.is_some() => {
            (cli.dataplane, cli.controller)
        }
        Some(crate::cli::Command::Controller { dataplane, controller }) => (dataplane, controller),
        _ => bail!("the controller's command line is not a controller's"),
    };
    let plan = super::plan(&dp, &opts).context("the controller's command line")?;
    Ok(format!("controller command line ok: {}", plan.summary(&dp, &opts)))
}

/// Step 1: runs `NEW check-state --state-dir DIR --controller-args-stdin`
/// (bounded), giving it the command line the new controller will run with, and
/// checks its window against ours.
fn preflight(bin: &Path, dir: &Path, argv: &[String]) -> Result<Window> {
    let mut child = Command::new(bin)
        .arg("check-state")
        .arg("--state-dir")
        .arg(dir)
        .arg("--controller-args-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running the new binary {}", bin.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        // A binary that does not read it fails below; its exit is the error to report.
        let _ = stdin.write_all(argv.join("\0").as_bytes());
    }
    let deadline = Instant::now() + PREFLIGHT_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the new binary {} did not answer check-state within {PREFLIGHT_TIMEOUT:?}", bin.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !status.success() {
        bail!("the new binary {} cannot take over the state ({status}): {}", bin.display(), stderr.trim());
    }
    let theirs = parse_window(&stdout)
        .ok_or_else(|| anyhow!("the new binary {} said no protocol window: {}", bin.display(), stdout.trim()))?;
    sys::protocol::window()
        .negotiate(theirs)
        .map_err(|refused| anyhow!("the new binary {}: {refused}", bin.display()))?;
    Ok(theirs)
}

/// `DIR/upgrade.result`: `ok ID` or `failed ID` (`-` without an id), then the text.
fn write_result(p: &state::Paths, id: Option<&str>, ok: bool, text: &str) {
    let body = format!("{} {}\n{text}\n", if ok { "ok" } else { "failed" }, id.unwrap_or("-"));
    if let Err(e) = state::write_atomic(&p.upgrade_result(), &body) {
        tracing::warn!(error = %format!("{e:#}"), "could not write upgrade.result");
    }
}

impl Ctl {
    /// SIGUSR1: begin an upgrade (the module's steps); a refusal is the result.
    pub(super) fn on_sigusr1(&mut self) {
        let req = state::read_private(&self.paths.upgrade_request())
            .and_then(|t| t.map(|t| parse_request(&t)).transpose().map(Option::unwrap_or_default));
        let _ = std::fs::remove_file(self.paths.upgrade_request());
        let id = req.as_ref().ok().and_then(|r| r.id.clone());
        if self.upgrade.is_some() {
            let why = "upgrade refused: another upgrade is under way";
            tracing::warn!("SIGUSR1: {why}");
            write_result(&self.paths, id.as_deref(), false, why);
            return;
        }
        let begun = req.and_then(|r| self.begin_upgrade(r));
        if let Err(e) = begun {
            let why = format!("upgrade refused: {e:#}; nothing changed");
            tracing::error!("{why}");
            write_result(&self.paths, id.as_deref(), false, &why);
        }
    }

    fn begin_upgrade(&mut self, req: Request) -> Result<()> {
        let Request { id, demux, worker } = req;
        if self.lc.phase().kind() != PhaseKind::Serving {
            bail!("the controller is {}; upgrade once it serves", self.lc.phase().kind().name());
        }
        if self.lc.dataplane_running().is_none() || self.lc.dataplane().rollback().is_some() {
            bail!("the data plane is {}; upgrade once it runs", self.lc.dataplane().kind().name());
        }
        let old_options = self.lc.dataplane_options().clone();
        let from_demux = old_options.first().map(PathBuf::from).unwrap_or_else(|| self.exe.clone());
        let from = Binaries { demux: from_demux, worker: self.worker_bin.clone() };
        let worker_named = worker.is_some();
        let to = Binaries {
            demux: demux.unwrap_or_else(|| present_path(&self.exe)),
            worker: worker.unwrap_or_else(|| present_path(&self.worker_bin)),
        };
        if self.opts.spawn_workers > 0 && !to.worker.is_file() {
            bail!("the new worker binary {} is not a file", to.worker.display());
        }
        let argv = self.exec_argv(&to, worker_named);
        let theirs = preflight(&to.demux, &self.paths.dir, &argv)?;
        // The new binary speaks its own version: the test relabelling is not passed on.
        let mut new_options = vec![to.demux.display().to_string()];
        new_options.extend(without_protocol_version(old_options.get(1..).unwrap_or_default()));
        tracing::info!(
            demux = %to.demux.display(), worker = %to.worker.display(), protocol = %theirs,
            "upgrade: preflight passed; restarting the data plane from the new binary on the same sockets"
        );
        if !self.lifecycle(Event::RestartDataPlane { options: new_options.clone() }) {
            bail!("the data plane cannot restart now (the refusal is logged)");
        }
        self.upgrade = Some(Upgrade {
            id,
            from,
            to,
            worker_named,
            old_options,
            new_options,
            step: Step::DataPlane { since: Instant::now() },
            new_workers: Vec::new(),
            workers_rolled: false,
            failure: None,
            killed_slow_dataplane: false,
            exec_asked: Instant::now(),
        });
        Ok(())
    }

    /// A worker was started: from the new binary while the workers' step runs.
    pub(super) fn upgrade_worker_started(&mut self, pid: u32) {
        if let Some(u) = self.upgrade.as_mut() {
            if matches!(u.step, Step::Workers { .. }) {
                u.new_workers.push(pid);
            }
        }
    }

    /// A process exited (supervise, before the lifecycle hears it): the data plane
    /// while a new one starts, or a new-binary worker while the workers roll, fails
    /// the step.
    pub(super) fn upgrade_exit(&mut self, dataplane_starting: bool, worker: Option<u32>, how: &str) {
        let Some(u) = self.upgrade.as_mut() else { return };
        if u.failure.is_some() {
            return;
        }
        match (&u.step, worker) {
            (Step::DataPlane { .. }, None) if dataplane_starting => {
                u.failure = Some(if u.killed_slow_dataplane {
                    format!(
                        "the new data plane ({}) was not ready within {DATAPLANE_READY_TIMEOUT:?}",
                        u.to.demux.display()
                    )
                } else {
                    format!("the new data plane ({}) exited before it was ready: {how}", u.to.demux.display())
                });
            }
            (Step::Workers { .. }, Some(pid)) if u.new_workers.contains(&pid) => {
                u.failure =
                    Some(format!("a worker of the new binary {} (pid {pid}) exited: {how}", u.to.worker.display()));
            }
            _ => {}
        }
    }

    /// `demux status`'s `upgrade`: null, or the step and the binaries.
    pub(super) fn upgrade_json(&self) -> serde_json::Value {
        let Some(u) = &self.upgrade else { return serde_json::Value::Null };
        let step = match &u.step {
            Step::DataPlane { .. } => "dataplane",
            Step::Workers { .. } => "workers",
            Step::RollBack { .. } => "rolling_back",
            Step::Exec => "controller",
        };
        serde_json::json!({
            "step": step,
            "demux": u.to.demux.display().to_string(),
            "worker": u.to.worker.display().to_string(),
            "from_demux": u.from.demux.display().to_string(),
            "from_worker": u.from.worker.display().to_string(),
        })
    }

    /// Whether the controller hands over to re-execute itself (tick).
    pub(super) fn upgrade_execs(&self) -> bool {
        self.upgrade.as_ref().is_some_and(|u| matches!(u.step, Step::Exec))
    }

    /// Once per tick, after the lifecycle's: moves the upgrade on.
    pub(super) fn upgrade_tick(&mut self, now: Instant) {
        let Some(mut u) = self.upgrade.take() else { return };
        if matches!(self.lc.phase().kind(), PhaseKind::ShuttingDown) {
            let why = "upgrade abandoned: the controller is shutting down".to_string();
            tracing::error!("{why}");
            write_result(&self.paths, u.id.as_deref(), false, &why);
            return;
        }
        let step = std::mem::replace(&mut u.step, Step::Exec);
        u.step = match step {
            Step::DataPlane { since } => self.step_dataplane(&mut u, since, now),
            Step::Workers { since } => self.step_workers(&mut u, since, now),
            Step::RollBack { why, stage } => match self.step_rollback(&mut u, &why, stage) {
                Some(stage) => Step::RollBack { why, stage },
                None => {
                    let text = format!(
                        "{why}; rolled back: the data plane and the workers run {} and {} again",
                        u.from.demux.display(),
                        u.from.worker.display()
                    );
                    tracing::error!("upgrade failed: {text}");
                    write_result(&self.paths, u.id.as_deref(), false, &text);
                    return;
                }
            },
            // A refused hand-over (the data plane not running at that moment) is
            // asked for again, once a second, until the lifecycle takes it.
            Step::Exec
                if self.lc.phase().kind() != PhaseKind::HandingOver
                    && now.saturating_duration_since(u.exec_asked) >= Duration::from_secs(1) =>
            {
                self.hand_over_for_exec(&mut u)
            }
            Step::Exec => Step::Exec,
        };
        self.upgrade = Some(u);
    }

    fn step_dataplane(&mut self, u: &mut Upgrade, since: Instant, now: Instant) -> Step {
        if let Some(why) = u.failure.take() {
            // The lifecycle brings the previous options (and binary) back.
            return self.roll_back(u, why);
        }
        let settled = self.lc.dataplane_running().is_some() && self.lc.dataplane().rollback().is_none();
        if settled && *self.lc.dataplane_options() == u.new_options {
            tracing::info!(pid = self.lc.dataplane_running(), "upgrade: the new data plane runs");
            self.worker_bin = u.to.worker.clone();
            let managed = self.lc.workers().iter().any(|w| w.managed());
            if !managed {
                return self.hand_over_for_exec(u);
            }
            if !self.lifecycle(Event::Reload) {
                return self.roll_back(u, "the rolling reload onto the new worker binary was refused".into());
            }
            tracing::info!(worker = %u.to.worker.display(), "upgrade: rolling the workers to the new binary");
            u.workers_rolled = true;
            return Step::Workers { since: now };
        }
        if now.saturating_duration_since(since) > DATAPLANE_READY_TIMEOUT && !u.killed_slow_dataplane {
            if let Some(pid) = self.lc.dataplane().pid() {
                tracing::error!(pid, "upgrade: the new data plane is not ready in time; killing it");
                u.killed_slow_dataplane = true;
                // SAFETY: kill(2) on the starting data plane (our child, not reaped).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        Step::DataPlane { since }
    }

    fn step_workers(&mut self, u: &mut Upgrade, since: Instant, now: Instant) -> Step {
        if let Some(why) = u.failure.take() {
            return self.roll_back(u, why);
        }
        if self.lc.phase().kind() == PhaseKind::Serving {
            let old: Vec<u32> = self
                .lc
                .workers()
                .iter()
                .filter(|w| w.managed() && !matches!(w.phase(), WorkerPhase::Retiring { .. } | WorkerPhase::Exited))
                .map(|w| w.pid())
                .filter(|pid| !u.new_workers.contains(pid))
                .collect();
            if !old.is_empty() {
                return self.roll_back(u, format!("the rolling reload stopped with workers {old:?} on the old binary"));
            }
            tracing::info!(workers = u.new_workers.len(), "upgrade: every worker runs the new binary");
            return self.hand_over_for_exec(u);
        }
        let n = self.lc.workers().iter().filter(|w| w.managed()).count().max(1) as u32;
        let limit = (Duration::from_secs(self.opts.drain_timeout) + WORKER_STEP_MARGIN) * n;
        if now.saturating_duration_since(since) > limit {
            return self.roll_back(u, format!("the workers did not all roll within {limit:?}"));
        }
        Step::Workers { since }
    }

    /// Step 4 begins: the lifecycle hands over (nothing stopped), then tick re-executes.
    fn hand_over_for_exec(&mut self, u: &mut Upgrade) -> Step {
        u.exec_asked = Instant::now();
        self.lifecycle(Event::HandOver);
        Step::Exec
    }

    fn roll_back(&mut self, u: &mut Upgrade, why: String) -> Step {
        tracing::error!(why, "upgrade: rolling back to the previous binaries");
        self.worker_bin = u.from.worker.clone();
        Step::RollBack { why, stage: RollBack::DataPlane }
    }

    /// One rollback stage; `None` once rolled back.
    fn step_rollback(&mut self, u: &mut Upgrade, _why: &str, stage: RollBack) -> Option<RollBack> {
        match stage {
            RollBack::DataPlane => {
                let settled = self.lc.dataplane_running().is_some() && self.lc.dataplane().rollback().is_none();
                if *self.lc.dataplane_options() != u.old_options {
                    if settled {
                        self.lifecycle(Event::RestartDataPlane { options: u.old_options.clone() });
                    }
                    return Some(stage);
                }
                if !settled {
                    return Some(stage);
                }
                u.workers_rolled.then_some(RollBack::WorkersFinishing)
            }
            RollBack::WorkersFinishing => {
                if self.lc.phase().kind() != PhaseKind::Serving {
                    return Some(stage);
                }
                let new_ones_left = self.lc.workers().iter().any(|w| {
                    w.managed()
                        && !matches!(w.phase(), WorkerPhase::Retiring { .. } | WorkerPhase::Exited)
                        && u.new_workers.contains(&w.pid())
                });
                if new_ones_left && self.lifecycle(Event::Reload) {
                    Some(RollBack::Workers)
                } else {
                    None
                }
            }
            RollBack::Workers => (self.lc.phase().kind() != PhaseKind::Serving).then_some(stage),
        }
    }

    /// Handed over for an upgrade: re-executes the new binary with our command line
    /// (without the test relabelling; plus `--worker-bin` when the request named
    /// one). Returns only when exec failed (the error), leaving the data plane and
    /// the workers running for the next controller, as a hand-over does.
    /// The new controller's command line: `to.demux`, then ours without the test
    /// relabelling, plus `--worker-bin` when the request named one.
    fn exec_argv(&self, to: &Binaries, worker_named: bool) -> Vec<String> {
        let argv: Vec<String> = self.opts.argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let mut v = vec![to.demux.display().to_string()];
        v.extend(without_protocol_version(argv.get(1..).unwrap_or_default()));
        if worker_named {
            v.extend(["--worker-bin".into(), to.worker.display().to_string()]);
        }
        v
    }

    pub(super) fn exec_new_controller(&mut self) -> anyhow::Error {
        let Some(u) = self.upgrade.take() else { return anyhow!("no upgrade to carry out") };
        let argv = self.exec_argv(&u.to, u.worker_named);
        let summary = format!(
            "data plane pid {} runs {}; {} worker(s) run {}; the controller (pid {}) re-executes {}",
            self.lc.dataplane_running().unwrap_or(0),
            u.to.demux.display(),
            u.new_workers.len(),
            u.to.worker.display(),
            std::process::id(),
            u.to.demux.display()
        );
        let exec_note = format!("{}\n{summary}", u.id.as_deref().unwrap_or("-"));
        if let Err(e) = state::write_atomic(&self.paths.upgrade_exec(), &exec_note) {
            tracing::warn!(error = %format!("{e:#}"), "could not write upgrade.exec");
        }
        tracing::info!(%summary, "upgrade: re-executing the controller");
        let mut cmd = Command::new(&u.to.demux);
        cmd.args(argv.get(1..).unwrap_or_default());
        // What systemd passed at the first start is gone (close-on-exec): the new
        // controller adopts the sockets from the data plane.
        for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            cmd.env_remove(v);
        }
        use std::os::unix::process::CommandExt;
        let e = cmd.exec();
        let why = format!("could not execute the new controller {}: {e}", u.to.demux.display());
        let _ = std::fs::remove_file(self.paths.upgrade_exec());
        write_result(
            &self.paths,
            u.id.as_deref(),
            false,
            &format!("{why}; the data plane and the workers run the new binaries; start the controller again"),
        );
        anyhow!(why)
    }

    /// At the new controller's first Placeable: an upgrade that re-executed it is done.
    pub(super) fn upgrade_finished(&mut self) {
        let Ok(Some(note)) = state::read_private(&self.paths.upgrade_exec()) else { return };
        let _ = std::fs::remove_file(self.paths.upgrade_exec());
        let (id, summary) = note.split_once('\n').unwrap_or(("-", note.as_str()));
        let text = format!("{summary}\nthe new controller serves (protocol {})", sys::protocol::window());
        tracing::info!(%text, "upgrade done");
        write_result(&self.paths, Some(id), true, &text);
    }
}

/// `demux upgrade`: the request, SIGUSR1, then the result (bounded by `timeout`).
pub fn request(dir: &Path, demux: Option<&Path>, worker: Option<&Path>, timeout: Duration) -> Result<()> {
    let p = state::Paths::new(dir);
    let abs = |x: Option<&Path>| -> Result<Option<PathBuf>> {
        x.map(|x| std::path::absolute(x).with_context(|| format!("{}", x.display()))).transpose()
    };
    let id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    let req = Request { id: Some(id.clone()), demux: abs(demux)?, worker: abs(worker)? };
    let pid = state::read_pid(&p.controller_pid())
        .filter(|pid| state::pid_alive(*pid))
        .ok_or_else(|| anyhow!("no controller runs on {} (controller.pid)", dir.display()))?;
    let _ = std::fs::remove_file(p.upgrade_result());
    state::write_atomic(&p.upgrade_request(), &request_text(&req))?;
    // SAFETY: kill(2) with the pid of the controller of this state directory.
    if unsafe { libc::kill(pid, libc::SIGUSR1) } != 0 {
        bail!("signalling the controller (pid {pid}): {}", std::io::Error::last_os_error());
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(text) = state::read_private(&p.upgrade_result())? {
            let (first, rest) = text.split_once('\n').unwrap_or((text.as_str(), ""));
            match first.split_once(' ') {
                Some(("ok", i)) if i == id => {
                    println!("upgraded: {}", rest.trim());
                    return Ok(());
                }
                Some(("failed", i)) if i == id => bail!("{}", rest.trim()),
                // Another client's outcome.
                _ => {}
            }
        }
        if !state::pid_alive(pid) {
            bail!("the controller (pid {pid}) exited during the upgrade");
        }
        if Instant::now() > deadline {
            bail!("no upgrade result within {timeout:?} (the controller may still be at it: see its log)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    #[test]
    fn a_request_round_trips_and_bad_ones_are_refused() {
        let full = Request {
            id: Some("12-34".into()),
            demux: Some("/opt/b/demux".into()),
            worker: Some("/opt/b/worker".into()),
        };
        assert_eq!(parse_request(&request_text(&full)).unwrap(), full);
        let worker_only = Request { worker: Some("/opt/b/worker".into()), ..Request::default() };
        assert_eq!(parse_request(&request_text(&worker_only)).unwrap(), worker_only);
        assert_eq!(parse_request("").unwrap(), Request::default());
        for bad in ["demux relative/path", "shell /bin/sh", "demux", "demux /a\ndemux /b", "id 1\nid 2"] {
            assert!(parse_request(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// Any text: a request or an error, never a panic; a request read back from
        /// its own text is the same request.
        #[test]
        fn requests_parse_without_panic_and_round_trip(text in ".{0,200}") {
            if let Ok(r) = parse_request(&text) {
                prop_assert_eq!(parse_request(&request_text(&r)).unwrap(), r);
            }
        }

        #[test]
        fn absolute_paths_round_trip(
            id in "[a-z0-9-]{1,20}",
            demux in proptest::option::of("/[a-zA-Z0-9_./ -]{0,40}[a-zA-Z0-9_]"),
            worker in proptest::option::of("/[a-zA-Z0-9_./-]{0,40}"),
        ) {
            let r = Request { id: Some(id), demux: demux.map(PathBuf::from), worker: worker.map(PathBuf::from) };
            prop_assert_eq!(parse_request(&request_text(&r)).unwrap(), r);
        }

        /// `check-state` output: a window exactly when a valid `protocol A B` line.
        #[test]
        fn windows_parse_like_the_model(a in 0u8..12, b in 0u8..12, junk in "[a-z ]{0,10}") {
            let out = format!("{junk}\nprotocol {a} {b}\n");
            let model = Window { oldest: a, newest: b };
            prop_assert_eq!(parse_window(&out), model.is_valid().then_some(model));
        }
    }

    /// The new controller's command line is checked by the new binary: a
    /// controller's, accepted by its parser, with a plan.
    #[test]
    fn command_lines_are_checked_like_a_start() {
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let ok =
            check_command_line(os(&["demux", "--listen", "127.0.0.1:4433", "--cores", "0", "--state-dir", "/tmp/x"]));
        assert!(ok.as_ref().is_ok_and(|s| s.starts_with("controller command line ok")), "{ok:?}");
        let unknown =
            check_command_line(os(&["demux", "--listen", "127.0.0.1:4433", "--state-dir", "/x", "--no-such"]));
        assert!(format!("{:#}", unknown.unwrap_err()).contains("--no-such"));
        let no_listen = check_command_line(os(&["demux", "--state-dir", "/tmp/x"]));
        assert!(format!("{:#}", no_listen.unwrap_err()).contains("--listen"));
        assert!(check_command_line(os(&["demux", "lb-status", "--state-dir", "/x"])).is_err(), "not a controller");
    }

    #[test]
    fn the_relabelling_flag_is_not_passed_to_a_new_binary() {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(
            without_protocol_version(&s(&["--listen", "x", "--protocol-version", "4", "--cores", "0"])),
            s(&["--listen", "x", "--cores", "0"])
        );
        assert_eq!(without_protocol_version(&s(&["--protocol-version=5", "--a"])), s(&["--a"]));
        assert_eq!(without_protocol_version(&s(&["--a", "4"])), s(&["--a", "4"]));
    }

    #[test]
    fn check_state_windows_parse() {
        assert_eq!(parse_window("state-format 1\nprotocol 3 4\n"), Some(Window { oldest: 3, newest: 4 }));
        assert_eq!(parse_window("protocol 4 3"), None, "oldest above newest");
        assert_eq!(parse_window("protocol x"), None);
        assert_eq!(parse_window("state-format 1"), None);
        assert_eq!(present_path(Path::new("/usr/bin/demux (deleted)")), PathBuf::from("/usr/bin/demux"));
    }
}
