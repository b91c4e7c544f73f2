//! The control thread: accepts data connections (docs/architecture.md "Processes and
//! the data-connection protocol") and status requests, keeps the set of live
//! instances and publishes a new immutable snapshot on every change.
//!
//! 1. worker → `DataHello{server_id}` or `DataHelloV2{server_id, caps}`; a server id
//!    another open connection holds is refused with `Error`, then close.
//! 2. → `Sockets{addrs}` with the shared UDP fds (SCM_RIGHTS), one per listen address;
//!    the id is live (Owner / Orphan / VersionNegotiation routing).
//!    `DataHelloV2` with `CAP_FAST_PATH` → `FastSockets{addrs}`: the worker's own
//!    sockets, steered to it by the kernel fast path (crate::dataplane::fast_path;
//!    empty when the fast path is not active). Every `DataHelloV2` → `Rings`
//!    (count 0 unless `--forward ring` and `CAP_RINGS`).
//! 3. `Ready` → placeable; `Draining` → not placeable (still live, still fast).
//! 4. close → dead at once, out of the fast path's maps.
//!
//! This module: the epoll loop, the connection table and publishing snapshots.
//! [`hello`]: the data hello (Sockets, FastSockets, Rings). [`keys`]: new keys
//! (KeysChanged, SIGHUP key file reload). [`slots`]: per-instance counter slots and
//! their baselines. [`status`]: the status JSON.

mod hello;
mod keys;
mod slots;
mod status;

use crate::cli::FastPathMode;
use crate::dataplane::counters::ShardCounters;
use crate::dataplane::fast_path::FastPathState;
use crate::seqpacket::{self, Inbound};
use crate::dataplane::snapshot::{DataConn, Shared, Snapshot};
use crate::dataplane::status::StatusInfo;
use crate::sys::Epoll;
use anyhow::{Context, Result};
use proto::wire::{encode_control, Control};
use proto::{InstanceInfo, KeySet, ServerId, Table};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use hello::Wants;
use slots::Slots;

const TOKEN_DATA_LISTENER: u64 = 0;
const TOKEN_CONTROL_LISTENER: u64 = 1;
const TOKEN_RELOAD: u64 = 2;
/// Epoll tokens of connections start after the three fixed ones.
const FIRST_CONN_TOKEN: u64 = 3;
/// Largest control record the registry reads (a status reply is the largest it sends).
const CONTROL_BUF: usize = 65_536;
/// Send buffer of a data connection: frames wait here while the worker catches up.
const DATA_SNDBUF: libc::c_int = 4 << 20;

enum Conn {
    /// Data connection before its DataHello.
    Pending(OwnedFd),
    Live {
        conn: Arc<DataConn>,
        placeable: bool,
    },
    Control(OwnedFd),
}

impl Conn {
    fn raw(&self) -> RawFd {
        match self {
            Conn::Pending(fd) | Conn::Control(fd) => fd.as_raw_fd(),
            Conn::Live { conn, .. } => conn.fd.as_raw_fd(),
        }
    }
}

pub struct Registry {
    keys: KeySet,
    rendezvous_key: [u8; 16],
    shared: Shared,
    version: u64,
    epoll: Epoll,
    data_listener: OwnedFd,
    control_listener: Option<OwnedFd>,
    conns: HashMap<u64, Conn>,
    next_token: u64,
    slots: Slots,
    /// The fds handed to workers: shard 0's socket per listen address.
    udp_fds: Vec<RawFd>,
    udp_addrs: Vec<SocketAddr>,
    /// Every shard's socket, shard-major (`GetSockets`, controller adoption).
    all_udp_fds: Vec<RawFd>,
    all_udp_addrs: Vec<SocketAddr>,
    counters: Vec<Arc<ShardCounters>>,
    info: StatusInfo,
    buf: Vec<u8>,
    keys_path: std::path::PathBuf,
    reload_signal: Option<OwnedFd>,
    ring_bytes: Option<u64>,
    fast_path: FastPathState,
    fast_path_mode: FastPathMode,
    /// SO_PEERCRED policy: data.sock (us and the worker uid), dataplane.sock (us).
    data_peers: crate::trust::PeerPolicy,
    control_peers: crate::trust::PeerPolicy,
}

pub struct RegistryConfig {
    pub keys: KeySet,
    pub rendezvous_key: [u8; 16],
    pub shared: Shared,
    pub data_listener: OwnedFd,
    pub control_listener: Option<OwnedFd>,
    pub udp_fds: Vec<RawFd>,
    pub udp_addrs: Vec<SocketAddr>,
    pub all_udp_fds: Vec<RawFd>,
    pub all_udp_addrs: Vec<SocketAddr>,
    pub counters: Vec<Arc<ShardCounters>>,
    pub max_instances: usize,
    /// `--forward ring`: ring size offered to workers that ask (`DataHelloV2`).
    pub ring_bytes: Option<u64>,
    pub info: StatusInfo,
    /// The key file, re-read on SIGHUP (`reload_signal`, a signalfd).
    pub keys_path: std::path::PathBuf,
    pub reload_signal: Option<OwnedFd>,
    /// The kernel fast path, attached (or not, and why) before the shards started.
    pub fast_path: FastPathState,
    pub fast_path_mode: FastPathMode,
    /// Who may open a data connection (docs/operations.md "Trust model");
    /// the control socket accepts only our own uid.
    pub data_peers: crate::trust::PeerPolicy,
}

/// The snapshot before any worker connected.
pub fn empty_snapshot(keys: &KeySet, rendezvous_key: [u8; 16]) -> Result<Snapshot> {
    let table = Table::new(keys.clone(), rendezvous_key, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Snapshot { table, conns: Vec::new(), version: 0 })
}

impl Registry {
    pub fn new(cfg: RegistryConfig) -> Result<Registry> {
        let epoll = Epoll::new().context("epoll_create1")?;
        epoll.add(cfg.data_listener.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_DATA_LISTENER)?;
        if let Some(c) = &cfg.control_listener {
            epoll.add(c.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_CONTROL_LISTENER)?;
        }
        if let Some(r) = &cfg.reload_signal {
            epoll.add(r.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_RELOAD)?;
        }
        Ok(Registry {
            keys: cfg.keys,
            rendezvous_key: cfg.rendezvous_key,
            shared: cfg.shared,
            version: 0,
            epoll,
            data_listener: cfg.data_listener,
            control_listener: cfg.control_listener,
            conns: HashMap::new(),
            next_token: FIRST_CONN_TOKEN,
            slots: Slots::new(cfg.max_instances),
            udp_fds: cfg.udp_fds,
            udp_addrs: cfg.udp_addrs,
            all_udp_fds: cfg.all_udp_fds,
            all_udp_addrs: cfg.all_udp_addrs,
            counters: cfg.counters,
            info: cfg.info,
            keys_path: cfg.keys_path,
            reload_signal: cfg.reload_signal,
            ring_bytes: cfg.ring_bytes,
            fast_path: cfg.fast_path,
            fast_path_mode: cfg.fast_path_mode,
            data_peers: cfg.data_peers,
            control_peers: crate::trust::PeerPolicy::only_us(),
            buf: vec![0u8; CONTROL_BUF],
        })
    }

    /// Runs forever (errors here are per connection and logged).
    pub fn run(&mut self) -> Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let n = self.epoll.wait(&mut events, -1).context("epoll_wait (registry)")?;
            for e in &events[..n] {
                let (token, ev) = (e.u64, e.events);
                match token {
                    TOKEN_DATA_LISTENER => self.accept_all(false),
                    TOKEN_CONTROL_LISTENER => self.accept_all(true),
                    TOKEN_RELOAD => self.on_reload_signal(),
                    t => self.on_conn(t, ev),
                }
            }
        }
    }

    fn accept_all(&mut self, control: bool) {
        loop {
            let listener = if control { self.control_listener.as_ref() } else { Some(&self.data_listener) };
            let Some(listener) = listener else { return };
            match seqpacket::accept(listener) {
                Ok(Some(fd)) => {
                    if !self.admit(&fd, control) {
                        continue;
                    }
                    let token = self.next_token;
                    self.next_token += 1;
                    let ev = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
                    if let Err(e) = self.epoll.add(fd.as_raw_fd(), ev, token) {
                        tracing::warn!(error = %e, "epoll_ctl ADD connection");
                        continue;
                    }
                    if !control {
                        seqpacket::set_sndbuf(fd.as_raw_fd(), DATA_SNDBUF);
                    }
                    self.conns.insert(token, if control { Conn::Control(fd) } else { Conn::Pending(fd) });
                }
                Ok(None) => return,
                Err(e) => {
                    // EMFILE and friends: log and retry on the next readiness.
                    tracing::warn!(error = %e, control, "accept failed");
                    return;
                }
            }
        }
    }

    fn on_conn(&mut self, token: u64, ev: u32) {
        let Some(raw) = self.conns.get(&token).map(Conn::raw) else { return };
        // Drain every record waiting; stop at EAGAIN, close on EOF or error.
        let mut buf = std::mem::take(&mut self.buf);
        seqpacket::drain_control(raw, &mut buf, ev, |inbound| match inbound {
            Inbound::Message(m) => self.on_message(token, m),
            Inbound::Closed(why) => {
                self.close(token, &why);
                false
            }
            Inbound::Invalid(why) => {
                self.refuse(token, &why);
                false
            }
        });
        self.buf = buf;
    }

    /// Handles one message; false when the connection was closed.
    fn on_message(&mut self, token: u64, m: Control) -> bool {
        let Some(conn) = self.conns.get_mut(&token) else { return false };
        match (conn, m) {
            (Conn::Pending(_), Control::DataHello { server_id }) => self.hello(token, server_id, Wants::V1),
            (Conn::Pending(_), Control::DataHelloV2 { server_id, caps }) => {
                self.hello(token, server_id, Wants::from_caps(caps))
            }
            (Conn::Live { placeable, conn }, Control::Ready) => {
                if !*placeable {
                    *placeable = true;
                    tracing::info!(server_id = conn.server_id, "instance ready (placeable)");
                    self.publish();
                }
                true
            }
            (Conn::Live { placeable, conn }, Control::Draining) => {
                if *placeable {
                    *placeable = false;
                    tracing::info!(server_id = conn.server_id, "instance draining (not placeable)");
                    self.publish();
                }
                true
            }
            (Conn::Control(_), Control::StatusRequest) => {
                let json = self.status_json();
                let rec = encode_control(&Control::Status { json });
                let raw = self.conns.get(&token).map(Conn::raw).unwrap_or(-1);
                if let Err(e) = seqpacket::send(raw, &rec, &[], libc::MSG_DONTWAIT) {
                    self.close(token, &format!("sending status: {e}"));
                    return false;
                }
                true
            }
            (Conn::Control(_), Control::Hello { .. }) => true,
            // A (restarted) controller takes the sockets back to keep them open across
            // our own restarts (issue #5, controller adoption).
            (Conn::Control(_), Control::GetSockets) => {
                let rec = encode_control(&Control::Sockets { addrs: self.all_udp_addrs.clone() });
                let raw = self.conns.get(&token).map(Conn::raw).unwrap_or(-1);
                if let Err(e) = seqpacket::send(raw, &rec, &self.all_udp_fds, libc::MSG_DONTWAIT) {
                    self.close(token, &format!("sending sockets: {e}"));
                    return false;
                }
                true
            }
            // ADR-0040 rotation: new CIDs use the newest generation, the previous one
            // stays decodable. (The controller sends this; operators may too.)
            (Conn::Control(_), Control::KeysChanged { keys }) => match keys.key_set() {
                Ok(ks) => {
                    self.set_keys(ks, "KeysChanged on the control socket");
                    true
                }
                Err(e) => {
                    self.refuse(token, &format!("invalid keys: {e:?}"));
                    false
                }
            },
            (_, other) => {
                self.refuse(token, &format!("unexpected message {}", other.name()));
                false
            }
        }
    }

    /// SO_PEERCRED right after accept: dataplane.sock hands out every UDP socket
    /// (`GetSockets`) and takes keys (`KeysChanged`): only our own uid; data.sock:
    /// ours and the worker uid. A refused connection gets `Error` and is dropped.
    fn admit(&self, fd: &OwnedFd, control: bool) -> bool {
        if control {
            crate::trust::admit(fd, "dataplane.sock", &self.control_peers)
        } else {
            crate::trust::admit(fd, "data.sock", &self.data_peers)
        }
    }

    /// Sends `Error{reason}` (best effort) and closes.
    fn refuse(&mut self, token: u64, reason: &str) {
        if let Some(c) = self.conns.get(&token) {
            let rec = encode_control(&Control::Error { reason: reason.to_string() });
            let _ = seqpacket::send(c.raw(), &rec, &[], libc::MSG_DONTWAIT);
        }
        self.close(token, reason);
    }

    fn close(&mut self, token: u64, why: &str) {
        let Some(c) = self.conns.remove(&token) else { return };
        let _ = self.epoll.delete(c.raw());
        if let Conn::Live { conn, .. } = c {
            tracing::info!(server_id = conn.server_id, why, "instance dead");
            if let Some(fp) = self.fast_path.active() {
                fp.remove_worker(conn.slot, ServerId(conn.server_id));
            }
            self.slots.give_back(conn.slot);
            self.publish();
            // The fd closes when the last snapshot holding `conn` is dropped.
        } else {
            tracing::debug!(why, "connection closed");
        }
    }

    /// Builds and publishes a new snapshot of the live instances (sorted by id).
    fn publish(&mut self) {
        let mut live: Vec<(Arc<DataConn>, bool)> = self
            .conns
            .values()
            .filter_map(|c| match c {
                Conn::Live { conn, placeable } => Some((conn.clone(), *placeable)),
                _ => None,
            })
            .collect();
        live.sort_by_key(|(c, _)| c.server_id);
        let instances: Vec<InstanceInfo> =
            live.iter().map(|(c, p)| InstanceInfo { server_id: ServerId(c.server_id), placeable: *p }).collect();
        let table = match Table::new(self.keys.clone(), self.rendezvous_key, &instances) {
            Ok(t) => t,
            Err(e) => {
                // Unreachable: hello() refuses duplicates. Keep the old snapshot.
                tracing::error!(error = %e, "not publishing an invalid table");
                return;
            }
        };
        self.version += 1;
        let conns = live.into_iter().map(|(c, _)| c).collect();
        self.shared.store(Arc::new(Snapshot { table, conns, version: self.version }));
    }
}
