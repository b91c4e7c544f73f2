//! The controller:
//! the process the operator starts. It owns the state directory (keys, server-id
//! counter), opens the UDP sockets once and keeps them, runs the data plane as a
//! supervised child on those sockets, registers workers on `DIR/control.sock`,
//! optionally spawns and supervises workers, and adopts a running data plane and
//! workers when it restarts.
//!
//! Modules, one concern each: `state` (files), `procs` (child processes),
//! `lifecycle` (the states of the data plane, the workers and the controller, and
//! every change to them), `conns` (the control socket), `supervise` (carries out
//! what the lifecycle decides), `reconfigure` (SIGHUP's re-read of `--config`),
//! `status` (status JSON, metrics), `client` (operator commands), `systemd`
//! (readiness, status and watchdog notifications), `activation` (sockets passed
//! by systemd, the file-descriptor store), `upgrade` (SIGUSR1 / `demux upgrade`:
//! new binaries without dropping a connection), `state_format` (the state
//! directory's format, forward only).

pub mod activation;
pub mod client;
pub mod conns;
mod lifecycle;
mod link;
pub mod ownership;
pub mod pacing;
pub mod procs;
mod reconfigure;
mod rotation;
pub mod state;
pub mod state_format;
pub mod status;
pub mod supervise;
pub mod systemd;
mod trust;
pub mod upgrade;

use crate::cli::{ControllerOpts, DataPlaneArgs, LogArgs};
use crate::dataplane::cores;
use anyhow::{bail, Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::Admin;
use state::{Counter, Paths};
use std::collections::HashMap;
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

/// What a control connection is; a worker's registration itself lives in the
/// lifecycle (`lifecycle::Worker`), found by this connection's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Before its first message.
    Pending,
    Worker,
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
    /// `--rejoin-grace-ms` for the data planes it restarts (supervise::REJOIN_GRACE_MS
    /// unless the operator gave one).
    rejoin_grace_ms: u32,
    /// The data plane, the workers and the controller's phase (lifecycle.rs).
    lc: lifecycle::Lifecycle<procs::Proc>,
    /// The last `DIR/workers` written.
    workers_file: Option<String>,
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
    /// The data-plane flags as the configuration last gave them (SIGHUP compares
    /// the keys that need a restart with them; the data plane's command line in
    /// force is the lifecycle's, `Lifecycle::dataplane_options`).
    dp_opts: DataPlaneArgs,
    /// `--log-level`/`--log-format` in force, and the filter to change on SIGHUP.
    log: LogArgs,
    logging: sys::logging::Logging,
    /// Notifications to systemd (no-ops without NOTIFY_SOCKET).
    sd: systemd::Notifier,
    /// An upgrade under way (SIGUSR1, upgrade.rs).
    upgrade: Option<upgrade::Upgrade>,
}

/// What the controller checks before it opens anything: the options alone, and
/// this machine's cores, user and executables (`demux check-config` stops here).
pub struct Plan {
    pub host: proto::host::HostLayout,
    pub cores: Vec<core_affinity::CoreId>,
    pub rotate_every: u32,
    pub exe: PathBuf,
    pub worker_bin: PathBuf,
    pub worker_user: Option<crate::trust::WorkerUser>,
}

impl Plan {
    /// One line for `demux check-config`.
    pub fn summary(&self, dp: &DataPlaneArgs, opts: &ControllerOpts) -> String {
        let listen: Vec<String> = dp.listen.iter().map(|a| a.to_string()).collect();
        let user = self.worker_user.as_ref().map_or_else(|| "the controller's user".to_string(), |u| u.name.clone());
        format!(
            "listen {}; {} shard(s) on cores {}; {} worker(s) ({}) as {}; state {}",
            listen.join(" "),
            self.cores.len(),
            dp.cores,
            opts.spawn_workers,
            self.worker_bin.display(),
            user,
            opts.state_dir.as_deref().map_or_else(|| "-".into(), |d| d.display().to_string())
        )
    }
}

/// The checks of [`run`] that change nothing (docs/operations.md "Configuration").
pub fn plan(dp: &DataPlaneArgs, opts: &ControllerOpts) -> Result<Plan> {
    if opts.state_dir.is_none() {
        bail!("--state-dir DIR (controller.state_dir) is required");
    }
    if dp.listen.is_empty() {
        bail!("--listen ADDR:PORT (listen.addresses) is required (repeatable)");
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
    crate::dataplane::check_args(dp)?;
    let host = proto::host::HostLayout::new(dp.host_bits, dp.host_id)?;
    // Two live generations × rotate-every starts must stay below the host's ids.
    let max_rotate_every = host.per_host() / 2;
    let rotate_every = opts.rotate_every_arg.unwrap_or(DEFAULT_ROTATE_EVERY.min(max_rotate_every));
    if rotate_every == 0 || rotate_every > max_rotate_every {
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
    let worker_user = opts.worker_user.as_deref().map(crate::trust::WorkerUser::resolve).transpose()?;
    Ok(Plan { host, cores, rotate_every, exe, worker_bin, worker_user })
}

/// Entry point: `demux --state-dir DIR …` / `demux controller …` / `demux --config FILE`.
pub fn run(dp: DataPlaneArgs, opts: ControllerOpts, log: LogArgs, logging: sys::logging::Logging) -> Result<()> {
    // Before any thread starts: the sockets systemd passed, if any (LISTEN_FDS).
    let passed = activation::take().context("the sockets systemd passed (LISTEN_FDS)")?;
    let sd = systemd::Notifier::from_env();
    let plan = plan(&dp, &opts)?;
    let Some(dir) = opts.state_dir.clone() else { bail!("--state-dir DIR is required") };
    let host = plan.host;
    let mut opts = opts;
    opts.rotate_every = plan.rotate_every;
    let cores = plan.cores.clone();
    let exe = plan.exe.clone();
    let worker_bin = plan.worker_bin.clone();
    let worker_user = trust::resolve_worker_user(&opts)?;
    let paths = Paths::new(&dir);
    state::prepare_dir_for(&dir, worker_user.as_ref().map(|u| u.gid))?;
    let lock = state::lock(&paths)?;
    state_format::ensure(&paths)?;
    state::write_atomic(&paths.controller_pid(), &format!("{}\n", std::process::id()))?;
    let (keys, created) = state::load_or_create_keys(&paths)?;
    let counter = state::load_or_create_counter(&paths)?;
    tracing::info!(
        state_dir = %dir.display(), keys_created = created, next_server_id = counter.next,
        key_newest = keys.keys.newest.generation.get(), "controller starting"
    );

    let dataplane_options = dataplane_options(&exe, &dp, &paths, worker_user.as_ref());
    // Adopt a running data plane (controller restart), else open the sockets (or
    // take those systemd passed).
    let (udp, udp_addrs, adopted_dp) = match adopt_dataplane(&paths, &dp, cores.len())? {
        Some((pid, fds, addrs)) => {
            tracing::info!(pid, sockets = ?addrs, "adopted the running data plane and its sockets");
            let proc = procs::Proc::adopt(pid).context("pidfd_open on the adopted data plane")?;
            // Before the control socket exists (so before any worker rejoins).
            rotation::resync_adopted(&paths, pid, &keys)?;
            // What systemd passed are the same sockets (its file-descriptor store) or
            // must be among them (a socket unit's).
            sd.forget_fds(&activation::check_adopted(&passed, &fds)?);
            (fds, addrs, Some(proc))
        }
        None => {
            // One owner per port: not beside another appliance's (or orphan's)
            // sockets. Sockets systemd passed us are ours (we hold them).
            ownership::refuse_if_held(&dp.listen, &paths)?;
            let a = activation::assemble(passed, &dp.listen, cores.len())?;
            sd.forget_fds(&a.forget);
            let addrs: Vec<SocketAddr> = a.socks.iter().flatten().map(|s| s.local).collect();
            let fds: Vec<OwnedFd> = a.socks.into_iter().flatten().map(|s| s.fd).collect();
            tracing::info!(sockets = ?addrs, from_systemd = a.from_systemd, "UDP sockets open");
            (fds, addrs, None)
        }
    };
    // A restart of the service hands them back (LISTEN_FDS): the port never closes.
    sd.store_fds(&udp, &udp_addrs, dp.listen.len());
    let adopted_sockets = adopted_dp.is_some();
    // Restarts count per set of sockets: an adopted data plane continues the count.
    let restarts = if adopted_sockets {
        std::fs::read_to_string(paths.dataplane_restarts()).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
    } else {
        0
    };
    let lc = lifecycle::Lifecycle::new(
        Instant::now(),
        opts.spawn_workers,
        Duration::from_secs(opts.drain_timeout),
        dataplane_options,
        adopted_dp,
        restarts,
    );

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
    if sd.enabled() {
        systemd::spawn_status(status_out.clone(), paths.dataplane_sock())?;
    }

    add_worker_contract_args(&mut opts, &dp, &log);
    let mut ctl = Ctl {
        paths,
        exe,
        worker_bin,
        keys,
        counter,
        udp,
        udp_addrs,
        per_shard: dp.listen.len(),
        rejoin_grace_ms: dp.rejoin_grace_ms.unwrap_or(supervise::REJOIN_GRACE_MS),
        lc,
        workers_file: None,
        conns: HashMap::new(),
        epoll,
        listener,
        signals,
        next_token: FIRST_CONN_TOKEN,
        adopted_sockets,
        issued_here: Default::default(),
        started: Instant::now(),
        status_out,
        buf: vec![0u8; CONTROL_BUF],
        dp_link: None,
        accept_guard: crate::accept_guard::AcceptGuard::new("control.sock"),
        pending_cap: crate::accept_guard::pending_cap(),
        opts,
        worker_user,
        host,
        dp_opts: dp,
        log,
        logging,
        sd,
        upgrade: None,
    };
    ctl.take_over_workers();
    let r = ctl.run();
    drop(lock);
    r
}

/// The arguments every spawned worker gets from the controller besides the
/// operator's (`--worker-arg`, `[workers]`): `--cid-lifetime`, `--rings`, and the
/// log flags when set. Part of the worker's command-line contract.
fn add_worker_contract_args(opts: &mut ControllerOpts, dp: &DataPlaneArgs, log: &LogArgs) {
    if opts.spawn_workers == 0 {
        return;
    }
    add_cid_lifetime_arg(opts);
    add_rings_arg(opts, dp.forward);
    add_log_args(opts, log);
}

/// `--log-level`/`--log-format` reach the spawned workers when set (a worker binary
/// of the operator's own need not know them otherwise), unless the operator passed
/// them in the worker arguments.
fn add_log_args(opts: &mut ControllerOpts, log: &LogArgs) {
    if let Some(level) = &log.log_level {
        if !opts.worker_args.iter().any(|a| a.starts_with("--log-level")) {
            opts.worker_args.push(format!("--log-level={level}"));
        }
    }
    if log.log_format != crate::cli::LogFormat::Text && !opts.worker_args.iter().any(|a| a.starts_with("--log-format"))
    {
        opts.worker_args.push(format!("--log-format={}", flag_value(log.log_format)));
    }
}

/// The data plane's options (`lifecycle::Options`): the executable it runs from
/// (first), then every argument of the data plane the controller starts but the
/// fds and what each start adds ([`log_args`], `--rejoin-grace-ms`). The executable
/// is part of them so that an upgrade's rollback (controller/upgrade.rs) brings the
/// previous binary back with the previous options.
fn dataplane_options(
    exe: &std::path::Path,
    dp: &DataPlaneArgs,
    paths: &Paths,
    user: Option<&crate::trust::WorkerUser>,
) -> Vec<String> {
    let mut v = vec![exe.display().to_string()];
    v.extend(dataplane_args(dp, paths));
    v.extend(trust::dataplane_trust_args(paths, user));
    v
}

/// `--log-format` and `--log-level` (when set) for a data plane: those in force
/// when it starts (a new log level alone restarts nothing).
fn log_args(log: &LogArgs) -> Vec<String> {
    let mut v = vec![format!("--log-format={}", flag_value(log.log_format))];
    if let Some(level) = &log.log_level {
        v.push(format!("--log-level={level}"));
    }
    v
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

/// Blocks SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 and SIGCHLD in this thread (and so in every thread
/// spawned later) and returns a signalfd for them. Children get a clean mask (std
/// resets it between fork and exec).
fn block_signals() -> Result<OwnedFd> {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGCHLD] {
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
                libc::SIGHUP => self.on_sighup(),
                libc::SIGUSR1 => self.on_sigusr1(),
                libc::SIGUSR2 => self.begin_hand_over(),
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
