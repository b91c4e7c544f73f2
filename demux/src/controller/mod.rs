//! The controller:
//! the process the operator starts. It owns the state directory (keys, server-id
//! counter), opens the UDP sockets once and keeps them, runs the data plane as a
//! supervised child on those sockets, registers workers on `DIR/control.sock`,
//! optionally spawns and supervises workers, and adopts a running data plane and
//! workers when it restarts.
//!
//! Modules, one concern each: `state` (files), `procs` (child processes),
//! `conns` (the control socket), `supervise` (data plane, workers, reload,
//! shutdown), `status` (status JSON, metrics), `client` (operator commands).

pub mod client;
pub mod conns;
mod link;
pub mod ownership;
pub mod pacing;
pub mod procs;
mod rotation;
pub mod state;
pub mod status;
pub mod supervise;
mod trust;

use crate::cli::{ControllerOpts, DataPlaneArgs};
use crate::dataplane::{cores, socket};
use anyhow::{bail, Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::Admin;
use state::{Counter, Paths};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sys::seqpacket::{Channel, Incoming};

const TOKEN_LISTENER: u64 = 0;
const TOKEN_SIGNALS: u64 = 1;
/// Epoll tokens of connections start here, above the fixed ones.
const FIRST_CONN_TOKEN: u64 = 16;
/// Largest control record the controller reads.
const CONTROL_BUF: usize = 65_536;
/// Supervision tick.
const TICK_MS: i32 = 100;
/// `--orphan-timeout` of a controller's data plane unless given (seconds).
pub const ORPHAN_TIMEOUT_DEFAULT: u64 = 60;

/// Where a registered worker is (docs/architecture.md "Processes and the
/// data-connection protocol", step 4): `Ready` and `Draining` are its last message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkerState {
    /// Registered (Assign sent), not yet `Ready`.
    Registered,
    /// Sent `Ready`: accepts new connections.
    Ready,
    /// Sent `Draining`: serves its connections, accepts no new ones.
    Draining,
}

impl WorkerState {
    /// The name in the status JSON (`workers[].state`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            WorkerState::Registered => "registered",
            WorkerState::Ready => "ready",
            WorkerState::Draining => "draining",
        }
    }
}

/// A registered (or registering) control connection.
pub(crate) enum Kind {
    /// Before its first message.
    Pending,
    Worker {
        server_id: u16,
        pid: u32,
        state: WorkerState,
        since: Instant,
        rejoined: bool,
    },
    Operator,
}

pub(crate) struct Conn {
    fd: OwnedFd,
    kind: Kind,
    /// Accepted then, no message yet: closed after `accept_guard::HELLO_TIMEOUT`.
    idle_since: Option<Instant>,
    /// The protocol version its hello negotiated (docs/wire.md "Versions").
    version: Option<u8>,
}

/// A worker process the controller started (or adopted from the previous one).
pub(crate) struct Managed {
    proc: procs::Proc,
    spawned: Instant,
    /// Being replaced (rolling reload) or drained: not counted toward
    /// `--spawn-workers`, not replaced when it exits.
    retiring: bool,
    signaled: bool,
}

pub(crate) struct DataPlane {
    proc: Option<procs::Proc>,
    restarts: u64,
    adopted: bool,
    started: Instant,
    backoff: Duration,
    restart_at: Option<Instant>,
    last_exit: Option<String>,
}

pub(crate) struct Reload {
    queue: VecDeque<i32>,
    step: Option<ReloadStep>,
}

/// One step of a rolling reload: the old worker `old` (a pid) being replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReloadStep {
    /// `old` is retiring and its replacement starting (since `since`); `old` is
    /// signalled once every non-retiring worker is ready.
    AwaitReplacement { old: i32, since: Instant },
    /// `old` was signalled (SIGTERM: drain); the step ends when it exits.
    AwaitExit { old: i32 },
}

pub(crate) struct Shutdown {
    deadline: Instant,
    workers_signaled: bool,
    dataplane_signaled: Option<Instant>,
}

pub(crate) struct Ctl {
    paths: Paths,
    opts: ControllerOpts,
    exe: PathBuf,
    worker_bin: PathBuf,
    keys: KeyFile,
    counter: Counter,
    /// Every UDP socket, shard-major (`[shard][listen index]`), kept open for the
    /// life of the controller so a restarted data plane serves the same sockets.
    udp: Vec<OwnedFd>,
    udp_addrs: Vec<SocketAddr>,
    per_shard: usize,
    dataplane_args: Vec<String>,
    /// `--rejoin-grace-ms` for the data planes it restarts (supervise::REJOIN_GRACE_MS
    /// unless the operator gave one).
    rejoin_grace_ms: u32,
    dp: DataPlane,
    workers: Vec<Managed>,
    conns: HashMap<u64, Conn>,
    epoll: sys::Epoll,
    listener: OwnedFd,
    signals: OwnedFd,
    next_token: u64,
    /// Workers that lose us may re-register under their id (Rejoin) only with a
    /// controller that serves the sockets they send on: one that adopted the running
    /// data plane (or issued the id itself).
    adopted_sockets: bool,
    issued_here: std::collections::HashSet<u16>,
    reload: Option<Reload>,
    shutdown: Option<Shutdown>,
    worker_replacements: u64,
    next_worker_spawn: Instant,
    worker_backoff: Duration,
    started: Instant,
    status_out: Arc<Mutex<serde_json::Value>>,
    buf: Vec<u8>,
    dp_link: link::Link,
    /// `control.sock` accepts: paused on EMFILE and friends, capped before hello.
    accept_guard: crate::accept_guard::AcceptGuard,
    pending_cap: usize,
    /// `--worker-user`, resolved at start (docs/operations.md "Trust model").
    worker_user: Option<crate::trust::WorkerUser>,
    /// `--host-bits`/`--host-id` (ADR 0005): the server ids this host issues.
    host: proto::host::HostLayout,
}

/// Entry point: `demux --state-dir DIR …` / `demux controller …`.
pub fn run(dp: DataPlaneArgs, opts: ControllerOpts) -> Result<()> {
    let Some(dir) = opts.state_dir.clone() else { bail!("--state-dir DIR is required") };
    if dp.listen.is_empty() {
        bail!("--listen ADDR:PORT is required (repeatable)");
    }
    for (flag, set) in [
        ("--keys", dp.keys.is_some()),
        ("--data-socket", dp.data_socket.is_some()),
        ("--control-socket", dp.control_socket.is_some()),
        ("--ready-file", dp.ready_file.is_some()),
        ("--inherit-fds", !dp.inherit_fds.is_empty()),
        ("--worker-uid", dp.worker_uid.is_some()),
        ("--worker-gid", dp.worker_gid.is_some()),
    ] {
        if set {
            bail!("{flag} is not used with --state-dir: the controller keeps these in the state directory");
        }
    }
    for (i, l) in dp.listen.iter().enumerate() {
        if dp.listen[..i].contains(l) {
            bail!("--listen {l} given twice");
        }
    }
    let host = proto::host::HostLayout::new(dp.host_bits, dp.host_id)?;
    // Two live generations × rotate-every starts must stay below the host's ids.
    let max_rotate_every = host.per_host() / 2;
    let mut opts = opts;
    opts.rotate_every = opts.rotate_every_arg.unwrap_or(DEFAULT_ROTATE_EVERY.min(max_rotate_every));
    if opts.rotate_every == 0 || opts.rotate_every > max_rotate_every {
        bail!(
            "--rotate-every must be 1..={max_rotate_every} (two live key generations must not span the host's {} server \
             ids)",
            host.per_host()
        );
    }
    let cores = cores::resolve(&dp.cores)?;
    if cores.len() * dp.listen.len() > proto::wire::MAX_SOCKETS {
        bail!("at most {} sockets (cores × listen addresses)", proto::wire::MAX_SOCKETS);
    }
    let exe = std::env::current_exe().context("locating the demux executable")?;
    let worker_bin = match &opts.worker_bin {
        Some(b) => b.clone(),
        None => exe.parent().map(|d| d.join("worker")).context("locating the worker executable")?,
    };
    if opts.spawn_workers > 0 && !worker_bin.exists() {
        bail!("worker executable {} not found (build it, or pass --worker-bin PATH)", worker_bin.display());
    }

    let worker_user = trust::resolve_worker_user(&opts)?;
    let paths = Paths::new(&dir);
    state::prepare_dir_for(&dir, worker_user.as_ref().map(|u| u.gid))?;
    let lock = state::lock(&paths)?;
    state::write_atomic(&paths.controller_pid(), &format!("{}\n", std::process::id()))?;
    let (keys, created) = state::load_or_create_keys(&paths)?;
    let counter = state::load_or_create_counter(&paths)?;
    tracing::info!(
        state_dir = %dir.display(), keys_created = created, next_server_id = counter.next,
        key_newest = keys.keys.newest.generation.get(), "controller starting"
    );

    let mut dataplane_args = dataplane_args(&dp, &paths);
    dataplane_args.extend(trust::dataplane_trust_args(&paths, worker_user.as_ref()));
    // Adopt a running data plane (controller restart), else open the sockets.
    let (udp, udp_addrs, dp_state) = match adopt_dataplane(&paths, &dp, cores.len())? {
        Some((pid, fds, addrs)) => {
            tracing::info!(pid, sockets = ?addrs, "adopted the running data plane and its sockets");
            let proc = procs::Proc::adopt(pid).context("pidfd_open on the adopted data plane")?;
            // Before the control socket exists (so before any worker rejoins).
            rotation::resync_adopted(&paths, pid, &keys)?;
            (fds, addrs, DataPlane::new(Some(proc), true))
        }
        None => {
            // One owner per port: not beside another appliance's (or orphan's) sockets.
            ownership::refuse_if_held(&dp.listen, &paths)?;
            let socks = socket::bind_all(&dp.listen, cores.len())?;
            let addrs: Vec<SocketAddr> = socks.iter().flatten().map(|s| s.local).collect();
            let fds: Vec<OwnedFd> = socks.into_iter().flatten().map(|s| s.fd).collect();
            tracing::info!(sockets = ?addrs, "UDP sockets open");
            (fds, addrs, DataPlane::new(None, false))
        }
    };
    let adopted_sockets = dp_state.adopted;
    let mut dp_state = dp_state;
    // Restarts count per set of sockets: an adopted data plane continues the count.
    dp_state.restarts = if adopted_sockets {
        std::fs::read_to_string(paths.dataplane_restarts()).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
    } else {
        0
    };

    let signals = block_signals()?;
    let listener = sys::seqpacket::listen_private(&paths.control_sock())?;
    trust::share_control_sock(&paths, worker_user.as_ref())?;
    let epoll = sys::Epoll::new().context("epoll_create1")?;
    epoll.add(listener.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_LISTENER)?;
    epoll.add(signals.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_SIGNALS)?;
    let status_out = Arc::new(Mutex::new(serde_json::Value::Null));
    if let Some(addr) = dp.metrics {
        status::spawn_metrics(addr, Some(status_out.clone()), paths.dataplane_sock())?;
    }

    if opts.spawn_workers > 0 {
        add_cid_lifetime_arg(&mut opts);
        add_rings_arg(&mut opts, dp.forward);
    }
    let mut ctl = Ctl {
        paths,
        exe,
        worker_bin,
        keys,
        counter,
        udp,
        udp_addrs,
        per_shard: dp.listen.len(),
        dataplane_args,
        rejoin_grace_ms: dp.rejoin_grace_ms.unwrap_or(supervise::REJOIN_GRACE_MS),
        dp: dp_state,
        workers: Vec::new(),
        conns: HashMap::new(),
        epoll,
        listener,
        signals,
        next_token: FIRST_CONN_TOKEN,
        adopted_sockets,
        issued_here: Default::default(),
        reload: None,
        shutdown: None,
        worker_replacements: 0,
        next_worker_spawn: Instant::now(),
        worker_backoff: supervise::WORKER_BACKOFF_MIN,
        started: Instant::now(),
        status_out,
        buf: vec![0u8; CONTROL_BUF],
        dp_link: None,
        accept_guard: crate::accept_guard::AcceptGuard::new("control.sock"),
        pending_cap: crate::accept_guard::pending_cap(),
        opts,
        worker_user,
        host,
    };
    ctl.take_over_workers();
    let r = ctl.run();
    drop(lock);
    r
}

/// `--rotate-every` unless given (and the host has the ids for it).
const DEFAULT_ROTATE_EVERY: u32 = 10_000;

/// `--cid-lifetime` reaches spawned workers as `worker --cid-lifetime SECS` unless the
/// operator passed one in the worker arguments. It is part of the worker's command-line
/// contract (like `--server-id-from-controller`): the controller never runs the worker
/// binary to ask (that would run it as root, unbounded, before the control socket is
/// served).
fn add_cid_lifetime_arg(opts: &mut ControllerOpts) {
    if opts.worker_args.iter().any(|a| a.starts_with("--cid-lifetime")) {
        return;
    }
    opts.worker_args.push("--cid-lifetime".into());
    opts.worker_args.push(opts.cid_lifetime.to_string());
}

/// Spawned workers ask for forwarding rings when the data plane offers them:
/// `worker --rings on` with `--forward ring` (the default), `--rings off` with
/// `--forward seqpacket`, unless the operator passed `--rings` in the worker arguments.
/// Part of the worker's command-line contract, like `--cid-lifetime`.
fn add_rings_arg(opts: &mut ControllerOpts, forward: crate::cli::ForwardKind) {
    if opts.worker_args.iter().any(|a| a.starts_with("--rings")) {
        return;
    }
    opts.worker_args.push("--rings".into());
    opts.worker_args.push(if forward == crate::cli::ForwardKind::Ring { "on" } else { "off" }.into());
}

impl DataPlane {
    fn new(proc: Option<procs::Proc>, adopted: bool) -> DataPlane {
        DataPlane {
            proc,
            restarts: 0,
            adopted,
            started: Instant::now(),
            backoff: supervise::DP_BACKOFF_MIN,
            restart_at: None,
            last_exit: None,
        }
    }
}

/// The data-plane flags the controller passes on (everything but the paths it owns).
fn dataplane_args(dp: &DataPlaneArgs, p: &Paths) -> Vec<String> {
    let mut v: Vec<String> = vec!["--cores".into(), dp.cores.clone()];
    // Without us (and without instances) for this long, the data plane exits and
    // gives the port back (one owner per port).
    v.push("--orphan-timeout".into());
    v.push(dp.orphan_timeout.unwrap_or(ORPHAN_TIMEOUT_DEFAULT).to_string());
    for (f, path) in [
        ("--keys", p.keys()),
        ("--data-socket", p.data_sock()),
        ("--control-socket", p.dataplane_sock()),
        ("--ready-file", p.dataplane_ready()),
    ] {
        v.push(f.into());
        v.push(path.display().to_string());
    }
    for (flag, value) in [
        ("--io", flag_value(dp.io)),
        ("--steer", flag_value(dp.steer)),
        ("--fast-path", flag_value(dp.fast_path)),
        ("--forward", flag_value(dp.forward)),
        ("--ring-bytes", dp.ring_bytes.to_string()),
        // Initial-flood defence: the operator's limits and Retry mode.
        ("--limits", flag_value(dp.limits)),
        ("--retry", flag_value(dp.retry)),
    ] {
        v.push(flag.into());
        v.push(value);
    }
    v.extend(["--host-bits".into(), dp.host_bits.to_string(), "--host-id".into(), dp.host_id.to_string()]);
    // Our own binary runs the data plane: it speaks what we speak (docs/wire.md "Versions").
    if let Some(p) = dp.protocol_version {
        v.extend(["--protocol-version".into(), p.to_string()]);
    }
    if let (Some(peers), Some(listen)) = (&dp.peers, dp.peer_listen) {
        v.extend(["--peers".into(), peers.display().to_string(), "--peer-listen".into(), listen.to_string()]);
    }
    for (f, n) in [
        ("--pin-capacity", dp.pin_capacity),
        ("--decode-cache", dp.decode_cache),
        ("--max-instances", dp.max_instances),
        ("--batch", dp.batch),
        ("--uring-buffers", usize::from(dp.uring_buffers)),
        ("--busy-poll-us", dp.busy_poll_us as usize),
        ("--limit-rate", dp.limit_rate as usize),
        ("--limit-burst", dp.limit_burst as usize),
        ("--limit-handshakes", usize::from(dp.limit_handshakes)),
        ("--limit-table-words", dp.limit_table_words),
        ("--retry-above", dp.retry_above as usize),
        ("--pressure-retry-above", dp.pressure_retry_above as usize),
        ("--pressure-drop-above", dp.pressure_drop_above as usize),
    ] {
        v.push(f.into());
        v.push(n.to_string());
    }
    v
}

/// A value-enum flag as the command line spells it (clap's own name for it).
fn flag_value(v: impl clap::ValueEnum) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

/// An adopted data plane: its pid, and its sockets with their addresses (shard-major).
type Adopted = (i32, Vec<OwnedFd>, Vec<SocketAddr>);

/// A controller restart: if `DIR/dataplane.pid` names a live data plane of this
/// directory whose control socket answers, take its sockets back (`GetSockets`,
/// SCM_RIGHTS). Its `--listen`/`--cores` must match ours.
fn adopt_dataplane(p: &Paths, dp: &DataPlaneArgs, shards: usize) -> Result<Option<Adopted>> {
    let Some(pid) = state::read_pid(&p.dataplane_pid()) else {
        return Ok(None);
    };
    if !state::pid_alive(pid) || !procs::is_our_dataplane(pid, &p.dataplane_sock()) {
        tracing::info!(pid, "the data plane of the previous controller is gone; starting a new one");
        let _ = std::fs::remove_file(p.dataplane_pid());
        return Ok(None);
    }
    let fd = sys::seqpacket::connect(&p.dataplane_sock())
        .with_context(|| format!("the data plane (pid {pid}) runs but its control socket does not answer; stop it (kill {pid}) and start again"))?;
    set_timeout(fd.as_raw_fd(), Duration::from_secs(5));
    let version = match sys::control::hello_on(fd.as_fd()).context("the data plane's hello")? {
        Ok(v) => v,
        Err(refused) => match refused.msg {
            Admin::Error { reason } => bail!("the running data plane (pid {pid}) refused our hello: {reason}"),
            other => bail!(
                "the running data plane (pid {pid}) answered our hello with {}",
                proto::wire::Message::name(&other)
            ),
        },
    };
    let dp_control = Channel::<Admin>::new(fd.as_fd()).at(version);
    dp_control.send(&Admin::GetSockets).context("sending GetSockets")?;
    let mut buf = vec![0u8; 4096];
    let got = dp_control
        .recv(&mut buf)
        .with_context(|| format!("no answer to GetSockets from the data plane (pid {pid})"))?;
    let (addrs, fds) = match got {
        Incoming::Message { msg: Admin::Sockets { addrs }, fds } if addrs.len() == fds.len() => (addrs, fds),
        Incoming::Message { msg: Admin::Error { reason }, .. } => {
            bail!("the running data plane (pid {pid}) refused GetSockets ({reason}); it predates the controller: stop it (kill {pid})")
        }
        _ => {
            bail!("the running data plane (pid {pid}) answered GetSockets with something unusable")
        }
    };
    let matches = addrs.len() == shards * dp.listen.len()
        && addrs.iter().enumerate().all(|(i, a)| {
            let want = dp.listen[i % dp.listen.len()];
            want.ip() == a.ip() && (want.port() == 0 || want.port() == a.port())
        });
    if !matches {
        bail!(
            "the running data plane (pid {pid}) serves {addrs:?} on {} shard socket(s); start the controller with its --listen and --cores, or stop it (kill {pid})",
            addrs.len()
        );
    }
    Ok(Some((pid, fds, addrs)))
}

pub(crate) fn set_timeout(fd: RawFd, t: Duration) {
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: passes a live timeval of the right size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
}

/// Blocks SIGTERM, SIGINT, SIGHUP and SIGCHLD in this thread (and so in every thread
/// spawned later) and returns a signalfd for them. Children get a clean mask (std
/// resets it between fork and exec).
fn block_signals() -> Result<OwnedFd> {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
            libc::sigaddset(&mut set, s);
        }
        set
    };
    // SAFETY: blocks the signals in the calling thread; `set` is live.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(r));
    }
    // SAFETY: creates a new signalfd for a live set.
    sys::owned(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) }).context("signalfd")
}

impl Ctl {
    fn run(&mut self) -> Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            if self.tick()? {
                return Ok(());
            }
            let n = self.epoll.wait(&mut events, TICK_MS).context("epoll_wait (controller)")?;
            for e in events[..n].iter().copied() {
                match e.u64 {
                    TOKEN_LISTENER => self.accept_all(),
                    TOKEN_SIGNALS => self.on_signals(),
                    t => self.on_conn(t, e.events),
                }
            }
        }
    }

    fn on_signals(&mut self) {
        loop {
            // SAFETY: signalfd_siginfo is plain old data.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reads at most `size` bytes into `info` from our signalfd.
            let r = unsafe {
                libc::read(self.signals.as_raw_fd(), (&mut info as *mut libc::signalfd_siginfo).cast(), size)
            };
            if r != size as isize {
                return;
            }
            match info.ssi_signo as libc::c_int {
                libc::SIGTERM | libc::SIGINT => self.begin_shutdown(),
                libc::SIGHUP => self.begin_reload(),
                _ => {} // SIGCHLD: the next tick reaps.
            }
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::cli::{ForwardKind, OnOff, RetryArg};
    use clap::Parser;

    fn parse(args: &[&str]) -> crate::cli::Cli {
        crate::cli::Cli::try_parse_from(args).expect("valid command line")
    }

    /// Every data-plane tuning flag the operator gives the controller reaches the
    /// data plane it spawns: a flag dropped here would silently run the defaults.
    #[test]
    fn dataplane_args_carry_every_tuning_flag() {
        let cli = parse(&[
            "demux",
            "--listen",
            "127.0.0.1:4433",
            "--cores",
            "0",
            "--forward",
            "seqpacket",
            "--ring-bytes",
            "1048576",
            "--state-dir",
            "/tmp/x",
            "--io",
            "mmsg",
            "--steer",
            "cpu",
            "--fast-path",
            "off",
            "--pin-capacity",
            "77",
            "--decode-cache",
            "0",
            "--max-instances",
            "9",
            "--batch",
            "5",
            "--uring-buffers",
            "8",
            "--busy-poll-us",
            "40",
            "--limits",
            "off",
            "--limit-rate",
            "3",
            "--limit-burst",
            "4",
            "--limit-handshakes",
            "6",
            "--limit-table-words",
            "1024",
            "--retry",
            "always",
            "--retry-above",
            "123",
            "--pressure-retry-above",
            "17",
            "--pressure-drop-above",
            "19",
            "--host-bits",
            "3",
            "--host-id",
            "5",
            "--peers",
            "/tmp/peers",
            "--peer-listen",
            "127.0.0.1:4434",
            "--protocol-version",
            "4",
        ]);
        let paths = Paths::new(std::path::Path::new("/tmp/x"));
        let mut argv = vec!["demux".to_string(), "dataplane".to_string(), "--listen".into(), "127.0.0.1:4433".into()];
        argv.extend(dataplane_args(&cli.dataplane, &paths));
        let child = crate::cli::Cli::try_parse_from(&argv).expect("the data plane accepts what we pass");
        let Some(crate::cli::Command::Dataplane(dp)) = child.command else { panic!("not a dataplane command") };
        let want = &cli.dataplane;
        assert_eq!(dp.io, want.io);
        assert_eq!(dp.steer, want.steer);
        assert_eq!(dp.fast_path, crate::cli::FastPathMode::Off, "off differs from the default auto");
        assert_eq!(dp.pin_capacity, 77);
        assert_eq!(dp.decode_cache, 0, "0 (off) differs from the default and must reach the child");
        assert_eq!(dp.max_instances, 9);
        assert_eq!(dp.batch, 5);
        assert_eq!(dp.uring_buffers, 8);
        assert_eq!(dp.busy_poll_us, 40);
        assert_eq!(dp.limits, OnOff::Off);
        assert_eq!((dp.limit_rate, dp.limit_burst, dp.limit_handshakes, dp.limit_table_words), (3, 4, 6, 1024));
        assert_eq!(dp.retry, RetryArg::Always);
        assert_eq!(dp.retry_above, 123);
        assert_eq!((dp.pressure_retry_above, dp.pressure_drop_above), (17, 19));
        assert_eq!(dp.forward, ForwardKind::Seqpacket, "seqpacket differs from the default ring");
        assert_eq!(dp.ring_bytes, 1 << 20);
        assert_eq!((dp.host_bits, dp.host_id), (3, 5));
        assert_eq!(dp.peers.as_deref(), Some(std::path::Path::new("/tmp/peers")));
        assert_eq!(dp.peer_listen, Some("127.0.0.1:4434".parse().unwrap()));
        assert_eq!(dp.keys.as_deref(), Some(paths.keys().as_path()));
        assert_eq!(dp.orphan_timeout, Some(ORPHAN_TIMEOUT_DEFAULT), "a controller's data plane exits when orphaned");
        assert_eq!(dp.metrics, None, "the controller serves the metrics, not its data plane");
        assert_eq!(dp.protocol_version, Some(4), "our binary runs the data plane: it speaks what we speak");
        let plain = parse(&["demux", "--listen", "127.0.0.1:4433", "--state-dir", "/tmp/x"]);
        assert!(!dataplane_args(&plain.dataplane, &paths).iter().any(|a| a == "--protocol-version"));
    }

    /// Spawned workers ask for rings exactly when the data plane offers them, and an
    /// operator's own `--rings` in the worker arguments wins.
    #[test]
    fn spawned_workers_get_rings_on_unless_seqpacket_or_told_otherwise() {
        let base = ["demux", "--listen", "127.0.0.1:4433", "--cores", "0", "--state-dir", "/tmp/x"];
        let rings_args = |extra: &[&str]| {
            let argv: Vec<&str> = base.iter().chain(extra).copied().collect();
            let cli = parse(&argv);
            let mut opts = cli.controller.clone();
            add_rings_arg(&mut opts, cli.dataplane.forward);
            opts.worker_args
        };
        assert_eq!(rings_args(&[]), ["--rings", "on"], "rings are the default");
        assert_eq!(rings_args(&["--forward", "seqpacket"]), ["--rings", "off"]);
        assert_eq!(rings_args(&["--forward", "ring"]), ["--rings", "on"]);
        assert_eq!(rings_args(&["--worker-arg=--rings=off"]), ["--rings=off"], "the operator's choice stays");
    }

    /// The status JSON's `workers[].state` (docs/operations.md, `demux status`).
    #[test]
    fn worker_state_names_are_the_status_names() {
        let names = [WorkerState::Registered, WorkerState::Ready, WorkerState::Draining].map(WorkerState::name);
        assert_eq!(names, ["registered", "ready", "draining"]);
    }

    /// `GetSockets` adoption receives every shard's sockets in one record: the
    /// admin channel's receive takes the most one message can carry (SCM_MAX_FD).
    #[test]
    fn get_sockets_reply_takes_scm_max_fd_fds() {
        let (a, b) = sys::seqpacket::pair().expect("socketpair");
        let fds = vec![a.as_raw_fd(); sys::seqpacket::MAX_FDS];
        Channel::<Admin>::new(a.as_fd()).send_with_raw_fds(&Admin::Sockets { addrs: vec![] }, &fds).expect("send");
        let mut buf = [0u8; 64];
        match Channel::<Admin>::new(b.as_fd()).recv(&mut buf).expect("recv") {
            Incoming::Message { msg: Admin::Sockets { addrs }, fds } => {
                assert_eq!((addrs.len(), fds.len()), (0, sys::seqpacket::MAX_FDS))
            }
            other => panic!("{other:?}"),
        }
    }
}
