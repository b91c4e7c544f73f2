//! The data plane (`demux dataplane`, docs/architecture.md "The shard loop"): shard
//! threads that receive, route and forward datagrams, and the registry that owns the
//! data connections and publishes routing snapshots.

pub mod buffer_stock;
pub mod cmsg;
pub mod cores;
pub mod counters;
pub mod fast_path;
pub mod forward;
pub mod handshakes;
pub mod io_uring_backend;
pub mod limits;
pub mod mmsg_backend;
pub mod peer_out;
pub mod peers;
pub mod pressure;
pub mod registry;
pub mod retry;
pub mod ring;
pub mod shard;
pub mod signals;
pub mod snapshot;
pub mod socket;
pub mod status;
pub mod steer_cpu;

use crate::cli::{DataPlaneArgs, IoKind, Steer};
use anyhow::{bail, Context, Result};
use proto::keyfile::KeyFile;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

/// The receive backend every shard of this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// io_uring: multishot recvmsg into a provided-buffer ring.
    Uring,
    /// recvmmsg + epoll.
    Mmsg,
}

impl Backend {
    /// `--io`: `uring` must work, `auto` falls back to `mmsg` with one log line.
    pub fn select(io: IoKind) -> Result<Backend> {
        Ok(match io {
            IoKind::Mmsg => Backend::Mmsg,
            IoKind::Uring => {
                io_uring_backend::probe().context("--io uring: io_uring is not usable here")?;
                Backend::Uring
            }
            IoKind::Auto => match io_uring_backend::probe() {
                Ok(()) => Backend::Uring,
                Err(e) => {
                    tracing::warn!("io_uring unavailable ({e:#}); using the recvmmsg+epoll backend (--io mmsg)");
                    Backend::Mmsg
                }
            },
        })
    }

    /// The name status and logs show (`--io` spelling).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Uring => "uring",
            Backend::Mmsg => "mmsg",
        }
    }
}

pub fn load_keys(path: &Path) -> Result<KeyFile> {
    let md = std::fs::metadata(path)
        .with_context(|| format!("key file {} (create one with `demux gen-keys --out FILE`)", path.display()))?;
    if md.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", md.permissions().mode() & 0o777), "key file is readable by group/others; it should be 0600");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading key file {}", path.display()))?;
    KeyFile::parse(&text).with_context(|| format!("key file {}", path.display()))
}

/// The checks of the options alone (the controller makes them too, before it
/// starts a data plane, and `demux check-config`).
pub fn check_args(a: &DataPlaneArgs) -> Result<()> {
    if a.listen.len() > proto::wire::MAX_SOCKETS {
        bail!("at most {} --listen addresses", proto::wire::MAX_SOCKETS);
    }
    if !a.uring_buffers.is_power_of_two() {
        bail!("--uring-buffers must be a power of two");
    }
    if a.max_instances == 0 || a.max_instances > 65_536 {
        bail!("--max-instances must be 1..=65536");
    }
    if a.busy_poll_us > 0 && a.io == IoKind::Mmsg {
        bail!("--busy-poll-us needs the io_uring backend (--io uring): the recvmmsg backend sleeps in epoll_wait");
    }
    cores::parse(&a.cores)?;
    Ok(())
}

/// `demux dataplane …` (and the controller's child): binds or inherits the UDP
/// sockets, starts one shard per core and runs the registry on this thread.
pub fn run(a: DataPlaneArgs) -> Result<()> {
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
    check_args(&a)?;
    let keyfile = load_keys(keys_path)?;
    let keyset = keyfile.key_set().map_err(|e| anyhow::anyhow!("key file {}: {e:?}", keys_path.display()))?;
    let cores = cores::resolve(&a.cores)?;

    let backend = Backend::select(a.io)?;
    if a.busy_poll_us > 0 && backend != Backend::Uring {
        bail!("--busy-poll-us needs the io_uring backend (--io uring): the recvmmsg backend sleeps in epoll_wait");
    }

    let sockets = if a.inherit_fds.is_empty() {
        socket::bind_all(&a.listen, cores.len())?
    } else {
        socket::from_inherited(&a.inherit_fds, cores.len())?
    };
    // Every shard's fd, shard-major: handed back to a controller on `GetSockets`.
    let all_udp_fds: Vec<std::os::fd::RawFd> = sockets.iter().flatten().map(|s| s.fd.as_raw_fd()).collect();
    let all_udp_addrs: Vec<std::net::SocketAddr> = sockets.iter().flatten().map(|s| s.local).collect();
    let bound: Vec<std::net::SocketAddr> = sockets[0].iter().map(|s| s.local).collect();
    let core_ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
    // The fast path's program replaces the kernel's hash (and `--steer cpu`'s classic
    // program, whose CPU rule it carries: fast_path::cpu_table).
    let fast_path = fast_path::FastPathState::start(
        a.fast_path,
        &sockets,
        (a.steer == Steer::Cpu).then_some(core_ids.as_slice()),
        a.max_instances,
        &keyset,
    )?;
    if a.steer == Steer::Cpu && fast_path.active().is_none() {
        steer_cpu::attach_cpu_steering(&sockets, &cores)?;
    }
    let udp_fds = sockets[0].iter().map(|s| s.fd.as_raw_fd()).collect();

    let shared: snapshot::Shared =
        Arc::new(arc_swap::ArcSwap::from_pointee(registry::empty_snapshot(&keyset, keyfile.rendezvous_key)?));
    let counters: Vec<Arc<counters::ShardCounters>> =
        (0..cores.len()).map(|_| Arc::new(counters::ShardCounters::new(a.max_instances))).collect();
    let data_listener = sys::seqpacket::listen_private(data_path)?;
    if let Some(gid) = a.worker_gid {
        // Workers under `--worker-user` connect through the group (0660).
        crate::trust::share_with_group(data_path, gid, 0o660)?;
    }
    let control_listener = match &a.control_socket {
        Some(p) => Some(sys::seqpacket::listen_private(p)?),
        None => None,
    };
    let info = status::StatusInfo {
        io: backend.name(),
        steer: if a.steer == Steer::Cpu { "cpu" } else { "hash" },
        cores: cores.iter().map(|c| c.id).collect(),
        listen: bound.iter().map(|a| a.to_string()).collect(),
        pid: std::process::id(),
        busy_poll_us: a.busy_poll_us,
    };
    let own_files: Vec<std::path::PathBuf> =
        [Some(data_path.to_path_buf()), a.control_socket.clone(), a.ready_file.clone()].into_iter().flatten().collect();
    // Before any other thread exists: signals are then blocked everywhere.
    signals::exit_on_signal(own_files.clone())?;
    let limits = Arc::new(limits::Limits::new(a.limits_config())?.with_retry(a.retry_mode(), keyfile.token_key));
    let host = proto::host::HostLayout::new(a.host_bits, a.host_id)?;
    let peers = match (&a.peers, a.peer_listen) {
        (Some(file), Some(listen)) => {
            // ADR 0005 §4: the key file's forwarding secrets, which no worker receives.
            let keys = proto::peer::FrameKeys::of(&keyfile);
            Some(peers::Peers::start(host, keys, file.clone(), listen, bound.clone())?)
        }
        _ => None,
    };
    if let Some(p) = &peers {
        // The peer thread's ring of each worker comes after the shards' (registry::hello).
        p.hand_over_to(shared.clone(), a.max_instances, counters.len());
    }
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
        reload_signal: Some(signals::reload_signal_fd()?),
        fast_path,
        fast_path_mode: a.fast_path,
        orphan_timeout: a.orphan_timeout.filter(|s| *s > 0).map(std::time::Duration::from_secs),
        orphan_files: own_files,
        handshakes_done: limits.handshakes_done.clone(),
        pressure: a.pressure_config(),
        data_peers: crate::trust::PeerPolicy::us_and(a.worker_uid),
        registrations: a.registrations.clone(),
        peers: peers.clone(),
        rejoin_grace: std::time::Duration::from_millis(u64::from(a.rejoin_grace_ms.unwrap_or(0))),
    })?;

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
            busy_poll: std::time::Duration::from_micros(u64::from(a.busy_poll_us)),
            rejoin_grace: std::time::Duration::from_millis(u64::from(a.rejoin_grace_ms.unwrap_or(0))),
            limits: limits.clone(),
            peers: peers.clone(),
            started: started_tx.clone(),
        };
        std::thread::Builder::new()
            .name(format!("shard-{i}"))
            .spawn(move || {
                let r = match backend {
                    Backend::Uring => io_uring_backend::run(setup),
                    Backend::Mmsg => mmsg_backend::run(setup),
                };
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
        io = backend.name(), data_socket = %data_path.display(), "data plane running"
    );
    if let Some(p) = &a.ready_file {
        write_ready(p, &bound, data_path)?;
    }
    if let Some(addr) = a.metrics {
        // Dataplane-only metrics: the same text as a controller's, from our own
        // control socket (the registry answers it), without the controller's part.
        let Some(sock) = a.control_socket.clone() else {
            bail!("--metrics needs --control-socket (the metrics are the control socket's status)")
        };
        crate::controller::status::spawn_metrics(addr, None, sock)?;
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
