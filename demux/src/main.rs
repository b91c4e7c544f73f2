//! `demux`: the quicdemux data plane (docs/architecture.md, issue #3) and, with
//! `--state-dir`, the controller that supervises it and the workers (issue #5,
//! `controller/`, docs/operations.md).

mod bpf;
mod cli;
mod cmsg;
mod controller;
mod cores;
mod counters;
mod limits;
mod retry;
mod forward;
mod io_uring_backend;
mod mmsg_backend;
mod registry;
mod ring;
mod seqpacket;
mod shard;
mod snapshot;
mod socket;
mod status;
mod sys;

use anyhow::{bail, Context, Result};
use clap::Parser;
use cli::{Cli, Command, DataPlaneArgs, IoKind, Steer};
use proto::keyfile::KeyFile;
use proto::wire::{decode_control, encode_control, Control};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DEMUX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        None if cli.controller.state_dir.is_some() => controller::run(cli.dataplane, cli.controller),
        None => dataplane(cli.dataplane),
        Some(Command::Dataplane(a)) => dataplane(a),
        Some(Command::Controller { dataplane, controller }) => controller::run(dataplane, controller),
        Some(Command::Status { state_dir, json }) => controller::client::status(&state_dir, json),
        Some(Command::RotateKeys { state_dir }) => controller::client::rotate_keys(&state_dir),
        Some(Command::GenKeys { out, force }) => gen_keys(&out, force),
        Some(Command::LbStatus { control_socket, state_dir, json }) => {
            match control_socket.or_else(|| state_dir.map(|d| controller::state::Paths::new(&d).dataplane_sock())) {
                Some(p) => lb_status(&p, json),
                None => Err(anyhow::anyhow!("--control-socket PATH or --state-dir DIR is required")),
            }
        }
    };
    if let Err(e) = r {
        eprintln!("demux: error: {e:#}");
        std::process::exit(1);
    }
}

fn gen_keys(out: &Path, force: bool) -> Result<()> {
    let mut random = [0u8; 3 * 32 + 16];
    sys::os_random(&mut random).context("getrandom")?;
    let text = KeyFile::generate(&random, proto::cid::Prf::SipHash24).to_text();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(out).with_context(|| format!("creating key file {}", out.display()))?;
    // An existing file opened with --force keeps its mode: set 0600 explicitly.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

fn lb_status(path: &Path, json: bool) -> Result<()> {
    let fd = seqpacket::connect(path)?;
    seqpacket::send(fd.as_raw_fd(), &encode_control(&Control::StatusRequest), &[], 0)
        .context("sending StatusRequest")?;
    let mut buf = vec![0u8; 128 * 1024];
    let mut truncated = false;
    let n = seqpacket::recv(fd.as_raw_fd(), &mut buf, 0, &mut truncated).context("reading status")?;
    if n == 0 {
        bail!("the data plane closed the control connection without answering");
    }
    match decode_control(&buf[..n]).map_err(|e| anyhow::anyhow!("malformed reply: {e}"))? {
        Control::Status { json: text } => {
            if json {
                println!("{text}");
            } else {
                print!("{}", status::pretty(&text).context("status is not valid JSON")?);
            }
            Ok(())
        }
        Control::Error { reason } => bail!("data plane refused: {reason}"),
        _ => bail!("unexpected reply to StatusRequest"),
    }
}

fn load_keys(path: &Path) -> Result<KeyFile> {
    let md = std::fs::metadata(path)
        .with_context(|| format!("key file {} (create one with `demux gen-keys --out FILE`)", path.display()))?;
    if md.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", md.permissions().mode() & 0o777), "key file is readable by group/others; it should be 0600");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading key file {}", path.display()))?;
    KeyFile::parse(&text).with_context(|| format!("key file {}", path.display()))
}

fn dataplane(a: DataPlaneArgs) -> Result<()> {
    if a.listen.is_empty() && a.inherit_fds.is_empty() {
        bail!("--listen ADDR:PORT is required (repeatable)");
    }
    let Some(keys_path) = a.keys.as_deref() else { bail!("--keys FILE is required") };
    let Some(data_path) = a.data_socket.as_deref() else { bail!("--data-socket PATH is required") };
    for (i, l) in a.listen.iter().enumerate() {
        if a.listen[..i].contains(l) && l.port() != 0 {
            bail!("--listen {l} given twice");
        }
    }
    if a.listen.len() > proto::wire::MAX_SOCKETS {
        bail!("at most {} --listen addresses", proto::wire::MAX_SOCKETS);
    }
    if !a.uring_buffers.is_power_of_two() {
        bail!("--uring-buffers must be a power of two");
    }
    if a.max_instances == 0 || a.max_instances > 65_536 {
        bail!("--max-instances must be 1..=65536");
    }
    let keyfile = load_keys(keys_path)?;
    let keyset = keyfile.key_set().map_err(|e| anyhow::anyhow!("key file {}: {e:?}", keys_path.display()))?;
    let cores = cores::resolve(&a.cores)?;

    let backend = match a.io {
        IoKind::Mmsg => "mmsg",
        IoKind::Uring => {
            io_uring_backend::probe().context("--io uring: io_uring is not usable here")?;
            "uring"
        }
        IoKind::Auto => match io_uring_backend::probe() {
            Ok(()) => "uring",
            Err(e) => {
                tracing::warn!("io_uring unavailable ({e:#}); using the recvmmsg+epoll backend (--io mmsg)");
                "mmsg"
            }
        },
    };

    let sockets = if a.inherit_fds.is_empty() {
        socket::bind_all(&a.listen, cores.len())?
    } else {
        socket::from_inherited(&a.inherit_fds, cores.len())?
    };
    // Every shard's fd, shard-major: handed back to a controller on `GetSockets`.
    let all_udp_fds: Vec<std::os::fd::RawFd> = sockets.iter().flatten().map(|s| s.fd.as_raw_fd()).collect();
    let all_udp_addrs: Vec<std::net::SocketAddr> = sockets.iter().flatten().map(|s| s.local).collect();
    let bound: Vec<std::net::SocketAddr> = sockets[0].iter().map(|s| s.local).collect();
    if a.steer == Steer::Cpu {
        bpf::attach_cpu_steering(&sockets, &cores)?;
    }
    let udp_fds = sockets[0].iter().map(|s| s.fd.as_raw_fd()).collect();

    let shared: snapshot::Shared =
        Arc::new(arc_swap::ArcSwap::from_pointee(registry::empty_snapshot(&keyset, keyfile.rendezvous_key)?));
    let counters: Vec<Arc<counters::ShardCounters>> =
        (0..cores.len()).map(|_| Arc::new(counters::ShardCounters::new(a.max_instances))).collect();
    let data_listener = seqpacket::listen(data_path)?;
    let control_listener = match &a.control_socket {
        Some(p) => Some(seqpacket::listen(p)?),
        None => None,
    };
    let info = status::StatusInfo {
        io: backend,
        steer: if a.steer == Steer::Cpu { "cpu" } else { "hash" },
        cores: cores.iter().map(|c| c.id).collect(),
        listen: bound.iter().map(|a| a.to_string()).collect(),
        pid: std::process::id(),
    };
    // Before any other thread exists: signals are then blocked everywhere.
    exit_on_signal(
        vec![Some(data_path.to_path_buf()), a.control_socket.clone(), a.ready_file.clone()]
            .into_iter()
            .flatten()
            .collect(),
    )?;
    let mut reg = registry::Registry::new(registry::RegistryConfig {
        keys: keyset,
        rendezvous_key: keyfile.rendezvous_key,
        shared: shared.clone(),
        data_listener,
        control_listener,
        udp_fds,
        udp_addrs: bound.clone(),
        all_udp_fds,
        all_udp_addrs,
        counters: counters.clone(),
        max_instances: a.max_instances,
        ring_bytes: a.ring_size(),
        info,
        keys_path: keys_path.to_path_buf(),
        reload_signal: Some(reload_signal_fd()?),
    })?;

    let limits = Arc::new(limits::Limits::new(a.limits_config())?.with_retry(a.retry_mode(), keyfile.token_key));
    tracing::info!(
        limits = limits.enabled(),
        table_bytes = limits.table_bytes(),
        retry = ?a.retry_mode(),
        "initial-flood defence"
    );
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    // Shard 0's sockets stay open for the registry (their fds are handed to workers):
    // the shard threads own their sockets for the life of the process.
    for (i, (socks, core)) in sockets.into_iter().zip(cores.iter().copied()).enumerate() {
        let setup = shard::ShardSetup {
            index: i,
            core,
            sockets: socks,
            counters: counters[i].clone(),
            shared: shared.clone(),
            pin_capacity: a.pin_capacity,
            decode_cache: a.decode_cache,
            batch: a.batch,
            uring_buffers: a.uring_buffers,
            limits: limits.clone(),
            started: started_tx.clone(),
        };
        std::thread::Builder::new()
            .name(format!("shard-{i}"))
            .spawn(move || {
                let r = if backend == "uring" { io_uring_backend::run(setup) } else { mmsg_backend::run(setup) };
                if let Err(e) = r {
                    tracing::error!(shard = i, "shard failed: {e:#}");
                    std::process::exit(1);
                }
            })
            .context("spawning shard thread")?;
    }
    drop(started_tx);
    // Ready means receiving: wait until every shard has its ring / epoll set up (a
    // shard that fails exits the process with its error).
    for _ in 0..cores.len() {
        started_rx.recv_timeout(std::time::Duration::from_secs(60)).context("a shard did not start")?;
    }
    tracing::info!(
        listen = ?bound, cores = %cores::format(&cores.iter().map(|c| c.id).collect::<Vec<_>>()),
        io = backend, data_socket = %data_path.display(), "data plane running"
    );
    if let Some(p) = &a.ready_file {
        write_ready(p, &bound, data_path)?;
    }
    reg.run()
}

fn write_ready(path: &Path, bound: &[std::net::SocketAddr], data: &Path) -> Result<()> {
    let mut text = String::new();
    for b in bound {
        text += &format!("udp {b}\n");
    }
    text += &format!("data {}\n", data.display());
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// SIGTERM / SIGINT: remove our socket and ready files, exit 0. The signals are
/// blocked in every thread (the mask is inherited by the threads spawned after
/// this) and taken synchronously by one thread with sigwait(3).
fn exit_on_signal(paths: Vec<std::path::PathBuf>) -> Result<()> {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    };
    let mut blocked = set;
    // SAFETY: adds to a live sigset_t.
    unsafe { libc::sigaddset(&mut blocked, libc::SIGHUP) };
    // SAFETY: blocks the signals in the calling thread; `blocked` is live. SIGHUP is
    // blocked too: the registry takes it from its signalfd (key reload).
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut()) };
    if r != 0 {
        bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(r));
    }
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: waits for one of the blocked signals in `set`.
            let r = unsafe { libc::sigwait(&set, &mut sig) };
            for p in &paths {
                let _ = std::fs::remove_file(p);
            }
            tracing::info!(signal = sig, sigwait = r, "exiting on signal");
            std::process::exit(0);
        })
        .context("spawning the signal thread")?;
    Ok(())
}

/// A signalfd for SIGHUP (blocked in every thread by exit_on_signal): the registry
/// re-reads the key file when it fires.
fn reload_signal_fd() -> Result<std::os::fd::OwnedFd> {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    };
    // SAFETY: creates a new signalfd for a live set.
    sys::owned(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) }).context("signalfd(SIGHUP)")
}
