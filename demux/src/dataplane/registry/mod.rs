//! The control thread: accepts data connections (docs/architecture.md "Processes and
//! the data-connection protocol") and status requests, keeps the set of live
//! instances and publishes a new immutable snapshot on every change.
//!
//! 1. worker → `DataHello{announce, server_id}`: a window without a version in
//!    common with ours is refused (crate::versions); a server id another open
//!    connection holds is refused with `Error`, then close.
//! 2. → `Welcome` in the negotiated version, then in it `Sockets{addrs}` with the
//!    shared UDP fds (SCM_RIGHTS), one per listen address; the id is live (Owner /
//!    Orphan / VersionNegotiation routing). With `CAP_FAST_PATH` on both sides →
//!    `FastSockets{addrs}`: the worker's own sockets, steered to it by the kernel
//!    fast path (crate::dataplane::fast_path; empty when the fast path is not
//!    active). Then `Rings` (count 0 unless `--forward ring` and `CAP_RINGS`).
//! 3. `Ready` → placeable; `Draining` → not placeable (still live, still fast).
//! 4. close → dead at once, out of the fast path's maps.
//!
//! This module: the epoll loop, the connection table and publishing snapshots.
//! [`hello`]: the data hello (Sockets, FastSockets, Rings). [`keys`]: new keys
//! (KeysChanged, SIGHUP key file reload). [`slots`]: per-instance counter slots and
//! their baselines. [`status`]: the status JSON. [`liveness`]: the stall rule
//! (`Load` heartbeats, full data connections) applied every [`liveness::TICK`].
//! Accepting is guarded by [`crate::accept_guard`]: paused on EMFILE and friends,
//! connections without hello closed after a timeout and capped. The control socket
//! (the admin conversation) takes `Hello` first, answered by `Welcome`.

mod hello;
mod keys;
pub mod liveness;
mod orphan;
mod registrations;
mod slots;
mod status;

use crate::accept_guard::{self, AcceptGuard, HELLO_TIMEOUT};
use crate::cli::FastPathMode;
use crate::control_server::{self, ControlServer, Serves};
use crate::dataplane::counters::ShardCounters;
use crate::dataplane::fast_path::FastPathState;
use crate::dataplane::pressure::{Pressure, PressureConfig};
use crate::dataplane::snapshot::{Awaited, DataConn, Shared, Snapshot};
use crate::dataplane::status::StatusInfo;
use anyhow::{Context, Result};
use proto::wire::{admin::CAPS_KNOWN as CAPS_ADMIN, Admin, Data, Message};
use proto::{InstanceInfo, KeySet, ServerId, Table};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::seqpacket::Channel;
use sys::Epoll;

use liveness::Liveness;
use slots::Slots;

const TOKEN_DATA_LISTENER: u64 = 0;
const TOKEN_CONTROL_LISTENER: u64 = 1;
const TOKEN_RELOAD: u64 = 2;
/// Epoll tokens of connections start after the three fixed ones.
const FIRST_CONN_TOKEN: u64 = 3;
/// Largest control record the registry reads (a status reply is the largest it sends).
const CONTROL_BUF: usize = 65_536;
/// Send buffer of a data connection: frames wait here while the worker catches up.
const DATA_SNDBUF: usize = 4 << 20;

enum Conn {
    /// Data connection before its DataHello (accepted at `since`).
    Pending { fd: OwnedFd, since: Instant },
    Live {
        conn: Arc<DataConn>,
        /// The negotiated protocol version.
        version: u8,
        /// Said `Ready` (and not `Draining` since).
        placeable: bool,
        /// `Load` reports and the stall rule: placeable in the snapshot only when
        /// not stalled.
        live: Liveness,
    },
    /// A control-socket connection; `idle_since`: accepted then, no message yet;
    /// `version`: negotiated by its `Hello` (none before).
    Control { fd: OwnedFd, idle_since: Option<Instant>, version: Option<u8> },
}

impl Conn {
    fn raw(&self) -> RawFd {
        self.fd().as_raw_fd()
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Pending { fd, .. } | Conn::Control { fd, .. } => fd.as_fd(),
            Conn::Live { conn, .. } => conn.fd.as_fd(),
        }
    }

    /// The data connection (data.sock), while it speaks the data conversation (in
    /// its negotiated version once live).
    fn data(&self) -> Option<Channel<'_, Data>> {
        match self {
            Conn::Pending { .. } => Some(Channel::new(self.fd())),
            Conn::Live { version, .. } => Some(Channel::new(self.fd()).at(*version)),
            Conn::Control { .. } => None,
        }
    }

    /// The control-socket connection (admin conversation), in its negotiated
    /// version once it said `Hello`.
    fn admin(&self) -> Option<Channel<'_, Admin>> {
        match self {
            Conn::Control { fd, version: Some(v), .. } => Some(Channel::new(fd.as_fd()).at(*v)),
            Conn::Control { fd, version: None, .. } => Some(Channel::new(fd.as_fd())),
            Conn::Pending { .. } | Conn::Live { .. } => None,
        }
    }

    /// Accepted, and no hello (or on the control socket no message) yet: since when.
    fn waiting_since(&self) -> Option<Instant> {
        match self {
            Conn::Pending { since, .. } => Some(*since),
            Conn::Control { idle_since, .. } => *idle_since,
            Conn::Live { .. } => None,
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
    orphan: orphan::Watch,
    handshakes_done: Arc<crate::dataplane::handshakes::HandshakesDone>,
    pressure: PressureConfig,
    /// Origin of the liveness clock.
    epoch: Instant,
    next_tick: Instant,
    /// Instances that became stalled, all time.
    stalls_total: u64,
    data_guard: AcceptGuard,
    control_guard: AcceptGuard,
    /// Most connections kept before their hello ([`accept_guard::pending_cap`]).
    pending_cap: usize,
    /// SO_PEERCRED policy: data.sock (us and the worker uid), dataplane.sock (us).
    data_peers: crate::trust::PeerPolicy,
    control_peers: crate::trust::PeerPolicy,
    /// `--registrations`: which pid registered which server id ([`registrations`]).
    registrations: Option<std::path::PathBuf>,
    /// The end of `--rejoin-grace-ms`: until then each snapshot says which ids the
    /// shards wait for ([`Snapshot::awaited`]).
    rejoin_until: Instant,
    /// Host-to-host forwarding (re-read on SIGHUP, shown in status).
    peers: Option<Arc<crate::dataplane::peers::Peers>>,
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
    /// `--forward ring`: ring size offered to workers that ask (`CAP_RINGS` in their `DataHello`).
    pub ring_bytes: Option<u64>,
    pub info: StatusInfo,
    /// The key file, re-read on SIGHUP (`reload_signal`, a signalfd).
    pub keys_path: std::path::PathBuf,
    pub reload_signal: Option<OwnedFd>,
    /// The kernel fast path, attached (or not, and why) before the shards started.
    pub fast_path: FastPathState,
    pub fast_path_mode: FastPathMode,
    /// `--orphan-timeout` (None: never) and the files to remove then ([`orphan`]).
    pub orphan_timeout: Option<std::time::Duration>,
    pub orphan_files: Vec<std::path::PathBuf>,
    /// Where `HandshakeDone` notices go (shared with the shards through the limits).
    pub handshakes_done: Arc<crate::dataplane::handshakes::HandshakesDone>,
    /// `--pressure-retry-above`, `--pressure-drop-above`.
    pub pressure: PressureConfig,
    /// Who may open a data connection (docs/operations.md "Trust model");
    /// the control socket accepts only our own uid.
    pub data_peers: crate::trust::PeerPolicy,
    /// The controller's registrations file (None: dataplane-only, uid rules only).
    pub registrations: Option<std::path::PathBuf>,
    pub peers: Option<Arc<crate::dataplane::peers::Peers>>,
    /// `--rejoin-grace-ms` (zero: off).
    pub rejoin_grace: std::time::Duration,
}

/// The snapshot before any worker connected.
pub fn empty_snapshot(keys: &KeySet, rendezvous_key: [u8; 16]) -> Result<Snapshot> {
    let table = Table::new(keys.clone(), rendezvous_key, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Snapshot { table, conns: Vec::new(), pressure: Vec::new(), version: 0, awaited: Default::default() })
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
            orphan: orphan::Watch::new(cfg.orphan_timeout, cfg.orphan_files),
            handshakes_done: cfg.handshakes_done,
            pressure: cfg.pressure,
            epoch: Instant::now(),
            next_tick: Instant::now() + liveness::TICK,
            stalls_total: 0,
            data_guard: AcceptGuard::new("data socket"),
            control_guard: AcceptGuard::new("control socket"),
            pending_cap: accept_guard::pending_cap(),
            data_peers: cfg.data_peers,
            control_peers: crate::trust::PeerPolicy::only_us(),
            registrations: cfg.registrations,
            peers: cfg.peers,
            rejoin_until: Instant::now() + cfg.rejoin_grace,
            buf: vec![0u8; CONTROL_BUF],
        })
    }

    /// Runs forever (errors here are per connection and logged).
    pub fn run(&mut self) -> Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let tick = self.next_tick.saturating_duration_since(Instant::now()).as_millis();
            let tick = i32::try_from(tick).unwrap_or(i32::MAX).max(1);
            let orphan = self.orphan_wait_ms();
            let timeout = if orphan < 0 { tick } else { tick.min(orphan) };
            let n = self.epoll.wait(&mut events, timeout).context("epoll_wait (registry)")?;
            self.check_orphan();
            for e in &events[..n] {
                let (token, ev) = (e.u64, e.events);
                match token {
                    TOKEN_DATA_LISTENER => self.accept_all(false),
                    TOKEN_CONTROL_LISTENER => self.accept_all(true),
                    TOKEN_RELOAD => self.on_reload_signal(),
                    t => self.on_conn(t, ev),
                }
            }
            let now = Instant::now();
            if now >= self.next_tick {
                // A tick much later than due: this thread did not run (the data plane
                // was stopped or starved), so the silence was ours, not the workers'.
                let late = now.saturating_duration_since(self.next_tick) > liveness::HEARTBEAT_TIMEOUT / 2;
                self.next_tick = now + liveness::TICK;
                if late {
                    let clock = self.clock(now);
                    tracing::info!("registry resumed after a pause; liveness counts from now");
                    for c in self.conns.values_mut() {
                        if let Conn::Live { live, .. } = c {
                            live.registry_resumed(clock);
                        }
                    }
                }
                self.tick(now);
            }
        }
    }

    /// The liveness clock: time since the registry started.
    fn clock(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.epoch)
    }

    fn listener_fd(&self, control: bool) -> Option<RawFd> {
        if control {
            self.control_listener.as_ref().map(|l| l.as_raw_fd())
        } else {
            Some(self.data_listener.as_raw_fd())
        }
    }

    /// Every [`liveness::TICK`]: resumes paused listeners, closes connections that
    /// sent no hello in time, applies the stall rule.
    fn tick(&mut self, now: Instant) {
        // The fd limit may change under us (prlimit): the cap follows it.
        self.pending_cap = accept_guard::pending_cap();
        for (control, token) in [(false, TOKEN_DATA_LISTENER), (true, TOKEN_CONTROL_LISTENER)] {
            let guard = if control { &mut self.control_guard } else { &mut self.data_guard };
            if guard.resume_due(now) {
                if let Some(fd) = self.listener_fd(control) {
                    if let Err(e) = self.epoll.add(fd, libc::EPOLLIN as u32, token) {
                        tracing::warn!(error = %e, control, "epoll_ctl ADD listener");
                    }
                }
                self.accept_all(control);
            }
        }
        let late: Vec<(u64, bool)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.waiting_since().is_some_and(|t| now.saturating_duration_since(t) >= HELLO_TIMEOUT))
            .map(|(t, c)| (*t, matches!(c, Conn::Control { .. })))
            .collect();
        for (token, control) in late {
            if control { &mut self.control_guard } else { &mut self.data_guard }.hello_timed_out();
            self.close(token, "no hello within the timeout");
        }
        let clock = self.clock(now);
        let mut changed = false;
        for c in self.conns.values_mut() {
            let Conn::Live { conn, live, .. } = c else { continue };
            let drops_full = crate::dataplane::counters::instance_total(&self.counters, conn.slot).drops_full;
            if live.tick(clock, drops_full) {
                changed = true;
                if live.stalled() {
                    self.stalls_total += 1;
                    tracing::warn!(
                        server_id = conn.server_id,
                        why = live.why,
                        stalls = live.stalls,
                        "instance stalled (not placeable)"
                    );
                } else {
                    tracing::info!(server_id = conn.server_id, "instance draining again (placeable if ready)");
                }
            }
        }
        if !changed && self.registrations.is_some() && now < self.rejoin_until {
            // A registered worker whose process exited while awaited: not waited for
            // any longer (its clients get their resets from the next snapshot on).
            let snap = self.shared.load();
            if !snap.awaited.is_empty() {
                let live: Vec<InstanceInfo> = snap.table.instances().collect();
                changed = self.awaited(&live) != snap.awaited;
            }
        }
        if changed {
            self.publish();
        }
    }

    /// Connections waiting for their hello (data and control).
    fn waiting(&self) -> usize {
        self.conns.values().filter(|c| c.waiting_since().is_some()).count()
    }

    fn accept_all(&mut self, control: bool) {
        loop {
            let guard = if control { &self.control_guard } else { &self.data_guard };
            if guard.paused() {
                return;
            }
            let listener = if control { self.control_listener.as_ref() } else { Some(&self.data_listener) };
            let Some(listener) = listener else { return };
            match sys::seqpacket::accept_nonblocking(listener.as_fd()) {
                Ok(Some(fd)) => {
                    if !self.admit(&fd, control) {
                        continue;
                    }
                    let now = Instant::now();
                    let waiting = self.waiting();
                    let guard = if control { &mut self.control_guard } else { &mut self.data_guard };
                    if guard.evict_oldest(waiting, self.pending_cap, now) {
                        let oldest = self.conns.iter().filter_map(|(t, c)| Some((c.waiting_since()?, *t))).min();
                        if let Some((_, t)) = oldest {
                            self.close(t, "evicted: too many connections without hello");
                        }
                    }
                    let token = self.next_token;
                    self.next_token += 1;
                    let ev = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
                    if let Err(e) = self.epoll.add(fd.as_raw_fd(), ev, token) {
                        tracing::warn!(error = %e, "epoll_ctl ADD connection");
                        continue;
                    }
                    if !control {
                        sys::sockopt::set_send_buffer(&fd, DATA_SNDBUF);
                    }
                    let conn = if control {
                        Conn::Control { fd, idle_since: Some(now), version: None }
                    } else {
                        Conn::Pending { fd, since: now }
                    };
                    self.conns.insert(token, conn);
                }
                Ok(None) => return,
                Err(e) => {
                    // EMFILE and friends: the listener leaves the (level-triggered)
                    // epoll set until the pause is over (tick); logged once per interval.
                    let guard = if control { &mut self.control_guard } else { &mut self.data_guard };
                    guard.on_error(&e, Instant::now());
                    if let Some(fd) = self.listener_fd(control) {
                        let _ = self.epoll.delete(fd);
                    }
                    return;
                }
            }
        }
    }

    fn on_conn(&mut self, token: u64, ev: u32) {
        match self.conns.get(&token) {
            Some(Conn::Control { .. }) => control_server::serve_ready::<Admin, _>(self, token, ev),
            Some(_) => control_server::serve_ready::<Data, _>(self, token, ev),
            None => {}
        }
    }

    /// Handles one message of a data connection; false when it was closed.
    fn on_data(&mut self, token: u64, m: Data) -> bool {
        let now = Instant::now();
        let clock = self.clock(now);
        let Some(conn) = self.conns.get_mut(&token) else { return false };
        match (conn, m) {
            (Conn::Pending { .. }, Data::DataHello { announce, server_id }) => self.hello(token, announce, server_id),
            // The heartbeat and handshake-pressure report (docs/wire.md `Load`).
            (Conn::Live { live, .. }, Data::Load { handshakes, incoming_bytes }) => {
                let before = self.pressure.level(live.handshakes);
                live.on_load(clock, handshakes, incoming_bytes);
                if self.pressure.level(handshakes) != before {
                    self.publish();
                }
                true
            }
            (Conn::Live { placeable, conn, .. }, Data::Ready) => {
                if !*placeable {
                    *placeable = true;
                    tracing::info!(server_id = conn.server_id, "instance ready (placeable)");
                    self.publish();
                }
                true
            }
            // A worker's handshake completed: its pin's ticket may leave now (handshakes.rs).
            (Conn::Live { conn, .. }, Data::HandshakeDone { odcid }) => {
                self.handshakes_done.push(ServerId(conn.server_id), &odcid);
                true
            }
            (Conn::Live { placeable, conn, .. }, Data::Draining) => {
                if *placeable {
                    *placeable = false;
                    tracing::info!(server_id = conn.server_id, "instance draining (not placeable)");
                    self.publish();
                }
                true
            }
            (_, other) => {
                self.refuse(token, &format!("unexpected message {}", other.name()));
                false
            }
        }
    }

    /// Handles one message of a control-socket connection; false when it was closed.
    fn on_admin(&mut self, token: u64, m: Admin) -> bool {
        let Some(Conn::Control { idle_since, version, fd }) = self.conns.get_mut(&token) else { return false };
        *idle_since = None;
        match (*version, m) {
            // docs/wire.md "Versions": the hello first, answered in the version both speak.
            (None, Admin::Hello { announce, .. }) => {
                match crate::versions::answer::<Admin>(fd.as_fd(), "dataplane.sock", announce.window, CAPS_ADMIN) {
                    Some(v) => {
                        *version = Some(v);
                        true
                    }
                    None => {
                        self.close(token, "hello refused");
                        false
                    }
                }
            }
            (None, other) => {
                self.refuse(token, &format!("unexpected message {} before Hello", other.name()));
                false
            }
            (Some(_), m) => self.on_admin_request(token, m),
        }
    }

    /// An admin request after the hello; false when the connection was closed.
    fn on_admin_request(&mut self, token: u64, m: Admin) -> bool {
        match m {
            Admin::StatusRequest => {
                let json = self.status_json();
                self.reply(token, &Admin::Status { json }, &[], "status")
            }
            // A (restarted) controller takes the sockets back to keep them open across
            // our own restarts.
            Admin::GetSockets => {
                let (addrs, fds) = (self.all_udp_addrs.clone(), self.all_udp_fds.clone());
                self.reply(token, &Admin::Sockets { addrs }, &fds, "sockets")
            }
            // ADR 0001 rotation: new CIDs use the newest generation, the previous one
            // stays decodable. (The controller sends this; operators may too.)
            Admin::KeysChanged { keys } => match keys.key_set() {
                Ok(ks) => {
                    self.reload_forwarding_keys();
                    self.set_keys(ks, "KeysChanged on the control socket");
                    true
                }
                Err(e) => {
                    self.refuse(token, &format!("invalid keys: {e:?}"));
                    false
                }
            },
            other => {
                self.refuse(token, &format!("unexpected message {}", other.name()));
                false
            }
        }
    }

    /// Sends `m` (with `fds`) on control-socket connection `token` without waiting;
    /// a failure closes it. False when it was closed.
    fn reply(&mut self, token: u64, m: &Admin, fds: &[RawFd], what: &str) -> bool {
        let Some(ch) = self.conns.get(&token).and_then(Conn::admin) else { return false };
        if let Err(e) = ch.dont_wait().send_with_raw_fds(m, fds) {
            self.close(token, &format!("sending {what}: {e}"));
            return false;
        }
        true
    }

    /// SO_PEERCRED right after accept: dataplane.sock hands out every UDP socket
    /// (`GetSockets`) and takes keys (`KeysChanged`): only our own uid; data.sock:
    /// ours and the worker uid. A refused connection gets `Error` and is dropped.
    fn admit(&self, fd: &OwnedFd, control: bool) -> bool {
        if control {
            crate::trust::admit::<Admin>(fd, "dataplane.sock", &self.control_peers)
        } else {
            crate::trust::admit::<Data>(fd, "data.sock", &self.data_peers)
        }
    }

    /// Sends `Error{reason}` (best effort) and closes.
    fn refuse(&mut self, token: u64, reason: &str) {
        // The same Error record in both conversations; typed by the connection's.
        match self.conns.get(&token) {
            Some(c @ Conn::Control { .. }) => crate::trust::send_error::<Admin>(c.fd(), reason),
            Some(c) => crate::trust::send_error::<Data>(c.fd(), reason),
            None => {}
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
        // A stalled instance stays live (its connections are forwarded), not placeable
        // — unless every ready instance is stalled: then they all stay placeable (a
        // slow instance still answers; none at all answers nobody), as a load
        // balancer's panic threshold does.
        let healthy =
            self.conns.values().any(|c| matches!(c, Conn::Live { placeable: true, live, .. } if !live.stalled()));
        let mut live: Vec<(Arc<DataConn>, bool, Pressure)> = self
            .conns
            .values()
            .filter_map(|c| match c {
                Conn::Live { conn, placeable, live, .. } => Some((
                    conn.clone(),
                    *placeable && (!live.stalled() || !healthy),
                    self.pressure.level(live.handshakes),
                )),
                _ => None,
            })
            .collect();
        live.sort_by_key(|(c, ..)| c.server_id);
        let instances: Vec<InstanceInfo> =
            live.iter().map(|(c, p, _)| InstanceInfo { server_id: ServerId(c.server_id), placeable: *p }).collect();
        let table = match Table::new(self.keys.clone(), self.rendezvous_key, &instances) {
            Ok(t) => t,
            Err(e) => {
                // Unreachable: hello() refuses duplicates. Keep the old snapshot.
                tracing::error!(error = %e, "not publishing an invalid table");
                return;
            }
        };
        self.version += 1;
        let awaited = self.awaited(&instances);
        let pressure = live.iter().map(|(_, _, p)| *p).collect();
        let conns = live.into_iter().map(|(c, ..)| c).collect();
        self.shared.store(Arc::new(Snapshot { table, conns, pressure, version: self.version, awaited }));
    }

    /// Which not-live ids the shards hold `Departed` datagrams for
    /// (`--rejoin-grace-ms`): under a controller, the registered instances that still
    /// run and are not live yet; without one, any; after the grace, none (the shards
    /// stop holding then by their own clock too).
    fn awaited(&self, live: &[InstanceInfo]) -> Awaited {
        if Instant::now() >= self.rejoin_until {
            return Awaited::Ids(Vec::new());
        }
        let Some(path) = &self.registrations else { return Awaited::Any };
        match crate::controller::state::read_private(path) {
            Ok(text) => {
                let live: Vec<u16> = live.iter().map(|i| i.server_id.0).collect();
                let text = text.unwrap_or_default();
                Awaited::Ids(registrations::awaited_ids(&text, &live, registrations::process_exists))
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "registrations unreadable: holding every not-live id");
                Awaited::Any
            }
        }
    }
}
impl ControlServer for Registry {
    fn close(&mut self, token: u64, why: &str) {
        Registry::close(self, token, why)
    }
    fn refuse(&mut self, token: u64, why: &str) {
        Registry::refuse(self, token, why)
    }
    fn refuse_version(&mut self, token: u64, version: u8) {
        match self.conns.get(&token) {
            Some(c @ Conn::Control { .. }) => {
                crate::versions::refuse_record::<Admin>(c.fd(), "dataplane.sock", version)
            }
            Some(c) => crate::versions::refuse_record::<Data>(c.fd(), "data.sock", version),
            None => {}
        }
        self.close(token, "protocol version not supported");
    }
    fn recv_buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

impl Serves<Data> for Registry {
    fn channel(&self, token: u64) -> Option<Channel<'_, Data>> {
        self.conns.get(&token).and_then(Conn::data)
    }
    fn on_message(&mut self, token: u64, m: Data) -> bool {
        self.on_data(token, m)
    }
}

impl Serves<Admin> for Registry {
    fn channel(&self, token: u64) -> Option<Channel<'_, Admin>> {
        self.conns.get(&token).and_then(Conn::admin)
    }
    fn on_message(&mut self, token: u64, m: Admin) -> bool {
        self.on_admin(token, m)
    }
}
