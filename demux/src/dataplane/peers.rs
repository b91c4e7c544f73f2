//! Host-to-host forwarding (docs/adr/0005-server-ids-across-hosts.md §4).
//!
//! - **Out:** a shard that routes a datagram as an orphan first asks
//!   [`Peers::forward`]: if its DCID decodes to a server id of another host listed in
//!   `--peers`, live, whose epoch this host has learned, the datagram goes there in a
//!   frame (proto::peer) and is not reset here.
//! - **In:** one thread receives frames on `--peer-listen`, verifies the tag (the key
//!   file's forwarding secrets, which no worker holds), checks the source against the
//!   peer's listed address, and applies the acceptance rule (proto::peer::session:
//!   this host's id, this boot's epoch, a replay window per peer). An accepted
//!   datagram whose owner is live in the current routing snapshot is handed straight
//!   to that worker's data connection (a frame with the client's and the local
//!   address, as a shard would send it: [`Peers::hand_over_to`]); any other is
//!   handed to this host's own stack through a raw socket with the client's address
//!   as source and the local address it was sent to as destination, so that a shard
//!   deals with it exactly as if it had arrived here (a held or reset id). Either way
//!   the worker answers the client directly.
//! - **Liveness and the handshake:** every [`HEARTBEAT`] each host sends every peer a
//!   heartbeat (to its learned epoch, or a hello); a stale frame is answered at once
//!   (proto::peer::session rule 2). A peer not heard from (an accepted frame) for
//!   [`PEER_DEAD`] is dead: its ids are no longer forwarded, so they are orphans here
//!   and get this host's stateless reset, and the client reconnects.
//! - **The peers file** is re-read on SIGHUP, and when a stat every
//!   [`PEERS_FILE_CHECK`] shows it changed (inode, size, modification or change time).
//!
//! Injection uses a raw IPv4 socket and a raw IPv6 one (IPV6_HDRINCL, with the UDP
//! checksum IPv6 requires, sys::raw); IPv4-mapped IPv6 addresses go through the IPv4
//! one. A raw IPv6 socket that could not be opened at start is tried again (at most
//! once per [`PEERS_FILE_CHECK`]) when an IPv6 frame needs it; until then such frames
//! are counted `inject_errors`, as are frames whose client and local addresses are of
//! different families.

use crate::dataplane::cmsg;
use crate::dataplane::counters::ShardCounters;
use crate::dataplane::forward::Forwarder;
use crate::dataplane::peer_out::{self, PeerOut};
use crate::dataplane::snapshot::Snapshot;
use proto::cid::KeySet;
use proto::host::HostLayout;
use proto::peer::{self, Body, Frame, FrameError, FrameKeys, Header, KeyUsed, Learned, Me, Outbound, Session, Verdict};
use proto::wire::frame::FrameMeta;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sys::mmsg::{RecvMmsg, SendMeta};

/// How often a host tells each peer it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// A peer silent this long is dead: its ids are reset here, not forwarded.
pub const PEER_DEAD: Duration = Duration::from_secs(1);
/// How often the peers file is checked for changes.
pub const PEERS_FILE_CHECK: Duration = Duration::from_secs(1);
/// The peer socket's receive and send buffers (bytes; forced past rmem_max and
/// wmem_max when the data plane may).
const PEER_SOCKET_BUFFER: usize = 8 << 20;
/// Messages per recvmmsg on the peer socket, each up to a whole GRO train.
const RECV_BATCH: usize = 32;
const RECV_BUF: usize = 65_535;
/// Room for UDP_GRO's segment size, with its header.
const RECV_CONTROL: usize = 64;
/// Host ids are below this (ADR 0005: at most 8 host bits).
const HOSTS: usize = 1 << proto::host::MAX_HOST_BITS;

/// Counters (lb-status `peers`).
#[derive(Default)]
pub struct PeerCounters {
    pub forwarded: AtomicU64,
    pub forward_errors: AtomicU64,
    /// GSO sends of more than one frame (crate::dataplane::peer_out).
    pub trains_sent: AtomicU64,
    pub received: AtomicU64,
    /// Reads of more than one frame at once (UDP_GRO trains).
    pub trains_received: AtomicU64,
    /// Handed to the owning worker's data connection (its drops: `handed_over_dropped`).
    pub handed_over: AtomicU64,
    pub injected: AtomicU64,
    pub inject_errors: AtomicU64,
    /// Forwarded to an address this host does not serve (peers disagree on the
    /// anycast address): dropped.
    pub inject_not_served: AtomicU64,
    pub refused_not_a_frame: AtomicU64,
    pub refused_malformed: AtomicU64,
    pub refused_unauthenticated: AtomicU64,
    pub refused_replayed: AtomicU64,
    pub refused_unknown_peer: AtomicU64,
    /// Sealed for another host (a frame replayed to a third host).
    pub refused_wrong_receiver: AtomicU64,
    /// Data frames sealed for another boot of this data plane (a replay across a
    /// restart, or a peer that has not learned this boot's epoch yet).
    pub refused_stale: AtomicU64,
    pub heartbeats_received: AtomicU64,
    /// Heartbeats for another boot: hellos of the handshake (answered), or replays.
    pub heartbeats_stale: AtomicU64,
    /// Orphans of a dead peer's ids (reset here), or of a peer whose epoch is not
    /// learned yet.
    pub dead_peer: AtomicU64,
    pub peers_file_reloads: AtomicU64,
}

/// The clock of liveness and pacing: monotonic milliseconds (never the wall clock:
/// docs/adr/0005 §4). Tests step it to check that a clock going back breaks nothing.
struct PeerClock {
    base: Instant,
    offset_ms: AtomicU64,
}

impl PeerClock {
    /// Starts far from 0, so that a test can step it back by hours.
    const START_MS: u64 = 1 << 40;

    fn new() -> PeerClock {
        PeerClock { base: Instant::now(), offset_ms: AtomicU64::new(Self::START_MS) }
    }

    fn now_ms(&self) -> u64 {
        (self.base.elapsed().as_millis() as u64).wrapping_add(self.offset_ms.load(Relaxed))
    }

    #[cfg(test)]
    fn step(&self, delta_ms: i64) {
        let o = self.offset_ms.load(Relaxed).wrapping_add_signed(delta_ms);
        self.offset_ms.store(o, Relaxed);
    }
}

/// What identifies a version of the peers file (a change of any: re-read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(path: &std::path::Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// This host's forwarding state, shared by the shards and the receiving thread.
pub struct Peers {
    layout: HostLayout,
    /// This host's id and this boot's epoch (random, nonzero).
    me: Me,
    keys: arc_swap::ArcSwap<FrameKeys>,
    file: PathBuf,
    /// host id → its forwarding address.
    table: arc_swap::ArcSwap<HashMap<u16, SocketAddr>>,
    /// Forwarded datagrams per destination host (host ids are below 2^MAX_HOST_BITS).
    per_host: Box<[AtomicU64; HOSTS]>,
    /// Per destination: its learned epoch and our sequence counter towards it.
    outbound: Box<[Outbound; HOSTS]>,
    /// Per peer: the `ack` our frames carry (the receiving thread's sessions'
    /// `Session::ack`, mirrored for the shards).
    acks: Box<[AtomicU64; HOSTS]>,
    /// Per peer: which of our secrets verified its latest frame (0 current, 1
    /// other); frames to it are sealed with that one (proto::peer::KeyUsed).
    seal_with: Box<[AtomicU8; HOSTS]>,
    socket: UdpSocket,
    /// The addresses this host serves: a forwarded datagram is injected only towards
    /// one of them (anycast: every host serves the same), so a misconfigured peer
    /// cannot make two hosts bounce a datagram between them.
    serves: Vec<SocketAddr>,
    /// When each peer was last heard from (an accepted frame): the clock's
    /// milliseconds plus one (0: never), per host id.
    last_seen: Box<[AtomicU64; HOSTS]>,
    clock: PeerClock,
    /// Set once the routing snapshot exists ([`Peers::hand_over_to`]).
    handoff: std::sync::OnceLock<Handoff>,
    stop: AtomicBool,
    receiver: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The smallest segment size of a GSO train the kernel refused (`usize::MAX`:
    /// none): frames of that size or more go one by one.
    gso_refused_at: AtomicUsize,
    pub counters: PeerCounters,
}

/// A fresh nonzero epoch from the OS's random source.
fn draw_epoch() -> anyhow::Result<u64> {
    loop {
        let mut b = [0u8; 8];
        sys::os_random(&mut b).map_err(|e| anyhow::anyhow!("getrandom: {e}"))?;
        let e = u64::from_ne_bytes(b);
        if e != 0 {
            return Ok(e);
        }
    }
}

impl Peers {
    /// Binds `listen` (frames in; also the source of frames out), reads `file` and
    /// starts the receiving thread.
    pub fn start(
        layout: HostLayout,
        keys: FrameKeys,
        file: PathBuf,
        listen: SocketAddr,
        serves: Vec<SocketAddr>,
    ) -> anyhow::Result<Arc<Peers>> {
        use anyhow::Context;
        use std::os::fd::AsRawFd;
        let table = read_table(&file)?;
        let socket = UdpSocket::bind(listen).with_context(|| format!("--peer-listen {listen}"))?;
        // GSO trains of frames arrive whole (udp(7) UDP_GRO; without it the kernel
        // splits them before the socket), read with recvmmsg.
        if let Err(e) = sys::sockopt::setsockopt_int(socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1) {
            tracing::warn!(error = %e, "no UDP_GRO on the peer socket: frames are read one by one");
        }
        sys::sockopt::set_recv_buffer(&socket, PEER_SOCKET_BUFFER);
        sys::sockopt::set_send_buffer(&socket, PEER_SOCKET_BUFFER);
        let p = Arc::new(Peers {
            layout,
            me: Me { host: layout.host(), epoch: draw_epoch()? },
            keys: arc_swap::ArcSwap::from_pointee(keys),
            file,
            table: arc_swap::ArcSwap::from_pointee(table),
            per_host: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            outbound: Box::new(std::array::from_fn(|_| Outbound::default())),
            acks: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            seal_with: Box::new(std::array::from_fn(|_| AtomicU8::new(0))),
            socket,
            serves,
            last_seen: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            clock: PeerClock::new(),
            handoff: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
            receiver: Mutex::new(None),
            gso_refused_at: AtomicUsize::new(usize::MAX),
            counters: PeerCounters::default(),
        });
        let raw = sys::raw::RawIpv4::open().context("a raw IPv4 socket for forwarded datagrams (needs CAP_NET_RAW)")?;
        let raw6 = sys::raw::RawIpv6::open()
            .map_err(|e| tracing::warn!(error = %e, "no raw IPv6 socket yet: tried again when an IPv6 frame arrives"))
            .ok();
        let rx = p.clone();
        let handle = std::thread::Builder::new()
            .name("peers".into())
            .spawn(move || rx.receive_loop(Injector { raw, raw6, raw6_tried: Instant::now(), packet: Vec::new() }))
            .context("starting the peer receiver")?;
        if let Ok(mut r) = p.receiver.lock() {
            *r = Some(handle);
        }
        tracing::info!(
            listen = %listen, peers = p.table.load().len(), host = layout.host(), epoch = format!("{:016x}", p.me.epoch),
            "host-to-host forwarding on"
        );
        Ok(p)
    }

    /// From now on, accepted datagrams whose owner is live in `shared` go straight to
    /// it: into its ring number `ring` (the registry gives each worker one ring per
    /// shard, numbered from 0, and then this thread's), else on its data connection.
    /// `max_instances`: the size of the counter slots.
    pub fn hand_over_to(&self, shared: crate::dataplane::snapshot::Shared, max_instances: usize, ring: usize) {
        let _ = self.handoff.set(Handoff { shared, counters: ShardCounters::new(max_instances), ring });
    }

    /// Stops the receiving thread and waits for it (tests: a data-plane restart in
    /// one process; the socket closes when the last `Arc` goes).
    pub fn shutdown(&self) {
        self.stop.store(true, Relaxed);
        let handle = self.receiver.lock().ok().and_then(|mut r| r.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// SIGHUP or a changed file: re-reads the peers file; a bad file keeps the old
    /// table.
    pub fn reload(&self) {
        match read_table(&self.file) {
            Ok(t) => {
                tracing::info!(peers = t.len(), "peers file re-read");
                self.counters.peers_file_reloads.fetch_add(1, Relaxed);
                self.table.store(Arc::new(t));
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "peers file not re-read; keeping the old one"),
        }
    }

    /// New forwarding secrets (a key-file rotation, ADR 0005 §3). Frames are sealed
    /// with the current one again until a peer's frame shows it holds only the other.
    pub fn set_keys(&self, keys: FrameKeys) {
        self.keys.store(Arc::new(keys));
        for s in self.seal_with.iter() {
            s.store(0, Relaxed);
        }
    }

    /// An orphan datagram (its DCID names no live local instance): forwarded when the
    /// DCID decodes to another host's server id with a known, live peer whose epoch
    /// is learned. `true`: it was sealed into `out`, sent at the next
    /// [`Peers::flush`] (a full `out` is flushed first); a frame the kernel then
    /// refuses is counted `forward_errors`.
    pub fn forward(
        &self,
        out: &mut PeerOut,
        keys: &KeySet,
        datagram: &[u8],
        client: SocketAddr,
        local: SocketAddr,
    ) -> bool {
        // A client's Initial or 0-RTT carries a DCID it chose (RFC 9000 §7.2): any
        // host it decodes to is chance. New connections are placed locally.
        if client_chosen_dcid(datagram) {
            return false;
        }
        let Some(dcid) = dcid(datagram) else { return false };
        let Ok(d) = keys.decode(dcid) else { return false };
        let host = self.layout.host_of(d.server_id);
        if host == self.layout.host() {
            return false;
        }
        let Some(&to) = self.table.load().get(&host) else { return false };
        let learned = self.outbound.get(usize::from(host)).filter(|_| self.alive(host)).and_then(|o| o.data());
        let Some((to_epoch, seq)) = learned else {
            self.counters.dead_peer.fetch_add(1, Relaxed);
            return false;
        };
        if out.is_full() {
            self.flush(out);
        }
        let body = Body::Data { client, local, datagram };
        let header = self.header(host, to_epoch, seq);
        let keys = self.keys.load();
        let dest = out.dest(host, to);
        let start = dest.bytes.len();
        peer::seal_append(keys.sealing(self.seal_key(host)), &Frame { header, body }, &mut dest.bytes);
        dest.lens.push(dest.bytes.len() - start);
        out.frames += 1;
        true
    }

    /// Sends the frames sealed into `out`: one sendmmsg per peer, equal-sized frames
    /// in GSO trains (crate::dataplane::peer_out). A train the kernel refuses as such
    /// (EMSGSIZE, EINVAL: a segment over the path's MTU; EIO: a device without
    /// checksum offload) goes again frame by frame, and so do, from then on, frames of its
    /// segment size or more.
    pub fn flush(&self, out: &mut PeerOut) {
        if out.is_empty() {
            return;
        }
        let segment_below = self.gso_refused_at.load(Relaxed);
        let PeerOut { dests, used, send, trains, .. } = out;
        for d in &dests[..*used] {
            peer_out::plan(&d.lens, peer_out::MAX_SEGMENTS, peer_out::MAX_TRAIN_BYTES, segment_below, trains);
            let mut batch = send.batch();
            for t in trains.iter() {
                let meta = SendMeta { to: Some(&d.to), source: None, segment_size: t.segment };
                batch.push(&[&d.bytes[t.offset..t.offset + t.bytes]], meta);
            }
            let (mut next, mut sent, mut failed) = (0, 0u64, 0u64);
            while next < trains.len() {
                // Never blocks the shard: a full socket buffer loses the frames (counted).
                match batch.send_from(&self.socket, next, libc::MSG_DONTWAIT) {
                    Ok(0) => break,
                    Ok(k) => {
                        let went = &trains[next..next + k];
                        sent += went.iter().map(|t| t.frames as u64).sum::<u64>();
                        let gso = went.iter().filter(|t| t.segment.is_some()).count();
                        self.counters.trains_sent.fetch_add(gso as u64, Relaxed);
                        next += k;
                    }
                    Err(e) => {
                        let t = trains[next];
                        let refused_gso = matches!(e.raw_os_error(), Some(libc::EMSGSIZE | libc::EINVAL | libc::EIO));
                        if let (true, Some(size)) = (refused_gso, t.segment) {
                            let size = usize::from(size);
                            if self.gso_refused_at.fetch_min(size, Relaxed) > size {
                                tracing::warn!(
                                    error = %e, frame_bytes = size,
                                    "UDP GSO refused towards a peer: frames of this size or more go one by one"
                                );
                            }
                            let mut off = t.offset;
                            for &len in &d.lens[t.first..t.first + t.frames] {
                                let frame = &d.bytes[off..off + len];
                                match socket2::SockRef::from(&self.socket).send_to_with_flags(
                                    frame,
                                    &d.to,
                                    libc::MSG_DONTWAIT,
                                ) {
                                    Ok(_) => sent += 1,
                                    Err(_) => failed += 1,
                                }
                                off += len;
                            }
                        } else {
                            failed += t.frames as u64;
                        }
                        next += 1;
                    }
                }
            }
            failed += trains[next..].iter().map(|t| t.frames as u64).sum::<u64>();
            self.counters.forwarded.fetch_add(sent, Relaxed);
            self.counters.forward_errors.fetch_add(failed, Relaxed);
            if let Some(n) = self.per_host.get(usize::from(d.host)) {
                n.fetch_add(sent, Relaxed);
            }
        }
        out.clear();
    }

    fn serves_addr(&self, a: SocketAddr) -> bool {
        serves(&self.serves, a)
    }

    fn alive(&self, host: u16) -> bool {
        let Some(seen) = self.last_seen.get(usize::from(host)).map(|t| t.load(Relaxed)) else { return false };
        seen != 0 && self.clock.now_ms().saturating_sub(seen - 1) < PEER_DEAD.as_millis() as u64
    }

    /// The header of a frame to `host` (its epoch `to_epoch`) numbered `seq`.
    fn header(&self, host: u16, to_epoch: u64, seq: u64) -> Header {
        let ack = self.acks.get(usize::from(host)).map_or(0, |a| a.load(Relaxed));
        Header { from_host: self.me.host, to_host: host, from_epoch: self.me.epoch, to_epoch, seq, ack }
    }

    /// Which of our secrets frames to `host` are sealed with.
    fn seal_key(&self, host: u16) -> KeyUsed {
        match self.seal_with.get(usize::from(host)).map(|s| s.load(Relaxed)) {
            Some(1) => KeyUsed::Other,
            _ => KeyUsed::Current,
        }
    }

    fn send_frame(&self, to: SocketAddr, host: u16, to_epoch: u64, seq: u64, body: Body<'_>) -> std::io::Result<usize> {
        thread_local! {
            // One frame buffer per thread (heartbeats).
            static FRAME: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(65_536));
        }
        let header = self.header(host, to_epoch, seq);
        let keys = self.keys.load();
        FRAME.with_borrow_mut(|frame| {
            peer::seal(keys.sealing(self.seal_key(host)), &Frame { header, body }, frame);
            self.socket.send_to(frame, to)
        })
    }

    /// A heartbeat to `host` at `to`, for its epoch `to_epoch` (0: a hello).
    fn heartbeat(&self, host: u16, to: SocketAddr, to_epoch: u64) {
        let Some(o) = self.outbound.get(usize::from(host)) else { return };
        let _ = self.send_frame(to, host, to_epoch, o.seq(), Body::Heartbeat);
    }

    fn receive_loop(&self, mut inject: Injector) {
        let mut sessions: Vec<Session> = (0..HOSTS).map(|_| Session::default()).collect();
        let mut batch = RecvMmsg::new(RECV_BATCH, RECV_BUF).with_names().with_control(RECV_CONTROL);
        let _ = self.socket.set_read_timeout(Some(HEARTBEAT / 2));
        let mut beat = Instant::now() - HEARTBEAT;
        let (mut stamp, mut checked) = (FileStamp::of(&self.file), Instant::now());
        let mut fwd: Option<Forwarder> = None;
        while !self.stop.load(Relaxed) {
            if beat.elapsed() >= HEARTBEAT {
                let now = self.clock.now_ms();
                for (&host, &to) in self.table.load().iter() {
                    if let Some(s) = sessions.get_mut(usize::from(host)) {
                        s.tick(now);
                        self.heartbeat(host, to, s.peer_epoch());
                    }
                }
                beat = Instant::now();
            }
            if checked.elapsed() >= PEERS_FILE_CHECK {
                let now = FileStamp::of(&self.file);
                if now != stamp {
                    stamp = now;
                    self.reload();
                }
                checked = Instant::now();
            }
            // Blocks (up to the read timeout) for the first message, then takes what
            // else is queued.
            match batch.recv(&self.socket, libc::MSG_WAITFORONE) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "peer socket receive failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            }
            if let (Some(h), None) = (self.handoff.get(), &fwd) {
                // This thread's ring of each worker, or its data connection.
                fwd = Some(Forwarder::new(h.ring));
            }
            let handoff = self.handoff.get().zip(fwd.as_mut());
            let snap = handoff.as_ref().map(|(h, _)| h.shared.load());
            let mut to_owner = match (handoff, snap.as_deref()) {
                (Some((h, fwd)), Some(snap)) => Some(HandOver { snap, counters: &h.counters, fwd }),
                _ => None,
            };
            for m in batch.iter() {
                let Some(from) = m.source().filter(|_| !m.truncated() && !m.control_truncated()) else {
                    self.counters.refused_malformed.fetch_add(1, Relaxed);
                    continue;
                };
                // A GRO train (UDP_GRO) is frames of its segment size, the last
                // possibly shorter: each is verified and accepted on its own.
                let stride = cmsg::parse(m.control).gro_size.map_or(m.data.len(), usize::from).max(1);
                if m.data.len() > stride {
                    self.counters.trains_received.fetch_add(1, Relaxed);
                }
                for bytes in m.data.chunks(stride) {
                    if let Some(frame) = self.accept(&mut sessions, bytes, from) {
                        self.deliver(&frame, &mut inject, to_owner.as_mut());
                    }
                }
            }
            if let Some(h) = to_owner {
                h.fwd.flush(h.snap, h.counters);
            }
        }
    }

    /// Verifies a frame and applies the acceptance rule; `Some` for an accepted data
    /// frame. Every refusal is counted; heartbeats are answered where the rule says.
    fn accept<'a>(&self, sessions: &mut [Session], bytes: &'a [u8], from: SocketAddr) -> Option<Frame<'a>> {
        let c = &self.counters;
        let (frame, used) = match peer::open_with(&self.keys.load(), bytes) {
            Ok(f) => f,
            Err(FrameError::NotAFrame) => return bump(&c.refused_not_a_frame),
            Err(FrameError::Malformed) => return bump(&c.refused_malformed),
            Err(FrameError::Unauthenticated) => return bump(&c.refused_unauthenticated),
        };
        let h = frame.header;
        // Authentic, but from a host we do not list, or from another address than
        // its listed one: refused, and it moves no window.
        let table = self.table.load();
        let Some(&listed) = table.get(&h.from_host).filter(|a| same_endpoint(**a, from)) else {
            return bump(&c.refused_unknown_peer);
        };
        let i = usize::from(h.from_host);
        // A listed id at or above 2^MAX_HOST_BITS owns no server id: not a peer.
        let (Some(session), Some(outbound), Some(ack)) = (sessions.get_mut(i), self.outbound.get(i), self.acks.get(i))
        else {
            return bump(&c.refused_unknown_peer);
        };
        let heartbeat = frame.body == Body::Heartbeat;
        let now = self.clock.now_ms();
        let verdict = session.receive(self.me, &h, now);
        if matches!(verdict, Verdict::Fresh { .. } | Verdict::Stale { .. }) {
            if let Some(s) = self.seal_with.get(usize::from(h.from_host)) {
                s.store(u8::from(used == KeyUsed::Other), Relaxed);
            }
        }
        match verdict {
            Verdict::WrongReceiver => bump(&c.refused_wrong_receiver),
            Verdict::Replayed => bump(&c.refused_replayed),
            Verdict::Stale { ack: their_ack, nudge } => {
                outbound.raise(their_ack);
                if let Some(e) = nudge {
                    self.heartbeat(h.from_host, listed, e);
                }
                bump(if heartbeat { &c.heartbeats_stale } else { &c.refused_stale })
            }
            Verdict::Fresh { learned } => {
                ack.store(session.ack(), Relaxed);
                if let Some(l @ Learned { .. }) = learned {
                    outbound.learn(l);
                }
                if let Some(t) = self.last_seen.get(usize::from(h.from_host)) {
                    t.store(now + 1, Relaxed);
                }
                if heartbeat {
                    return bump(&c.heartbeats_received);
                }
                c.received.fetch_add(1, Relaxed);
                Some(frame)
            }
        }
    }

    /// Hands an accepted data frame's datagram to its owner's data connection (queued
    /// in `to_owner`, sent at the end of the receive batch), or to this host's stack.
    fn deliver<'b>(&self, frame: &Frame<'b>, inject: &mut Injector, to_owner: Option<&mut HandOver<'_>>) {
        let c = &self.counters;
        let Body::Data { client, local, datagram } = frame.body else { return };
        if !self.serves_addr(local) {
            c.inject_not_served.fetch_add(1, Relaxed);
            return;
        }
        if let Some(h) = to_owner {
            if let Some(target) = self.owner(h.snap, datagram) {
                if h.fwd.is_full() {
                    h.fwd.flush(h.snap, h.counters);
                }
                let meta = FrameMeta { client, local: Some(local), ecn: 0, segment_size: None };
                // SAFETY: `datagram` lies in the receive batch's buffers, which are not
                // written again before the batch's flush (Forwarder::push's contract).
                unsafe { h.fwd.push(h.snap, target, &meta, datagram, 1, h.counters) };
                c.handed_over.fetch_add(1, Relaxed);
                return;
            }
        }
        if inject.send(client, local, datagram) {
            c.injected.fetch_add(1, Relaxed);
        } else {
            c.inject_errors.fetch_add(1, Relaxed);
        }
    }

    /// The index (in `snap`) of the live local instance that owns `datagram`'s DCID.
    /// Client-chosen DCIDs, other hosts' ids and ids not live here: `None` (they are
    /// injected, and a shard applies its rules: placement, hold, reset).
    fn owner(&self, snap: &Snapshot, datagram: &[u8]) -> Option<usize> {
        if client_chosen_dcid(datagram) {
            return None;
        }
        let d = snap.table.keys().decode(dcid(datagram)?).ok()?;
        if !self.layout.is_local(d.server_id) {
            return None;
        }
        snap.table.index_of(d.server_id).filter(|&t| t < snap.conns.len())
    }

    /// lb-status `peers`.
    pub fn status_json(&self) -> Value {
        let c = &self.counters;
        let per: serde_json::Map<String, Value> = self
            .per_host
            .iter()
            .enumerate()
            .filter_map(|(h, n)| Some(n.load(Relaxed)).filter(|n| *n > 0).map(|n| (h.to_string(), json!(n))))
            .collect();
        let table = self.table.load();
        let alive = table.keys().filter(|h| self.alive(**h)).count();
        let addresses: serde_json::Map<String, Value> =
            table.iter().map(|(h, a)| (h.to_string(), json!(a.to_string()))).collect();
        json!({
            "host": self.layout.host(),
            "epoch": format!("{:016x}", self.me.epoch),
            "forwarding_keys": self.keys.load().ids.clone(),
            "peers": table.len(),
            "peers_alive": alive,
            "addresses": addresses,
            "peers_file_reloads": c.peers_file_reloads.load(Relaxed),
            "heartbeats_received": c.heartbeats_received.load(Relaxed),
            "heartbeats_stale": c.heartbeats_stale.load(Relaxed),
            "dead_peer": c.dead_peer.load(Relaxed),
            "forwarded": c.forwarded.load(Relaxed),
            "forwarded_to": per,
            "forward_errors": c.forward_errors.load(Relaxed),
            "trains_sent": c.trains_sent.load(Relaxed),
            "received": c.received.load(Relaxed),
            "trains_received": c.trains_received.load(Relaxed),
            "injected": c.injected.load(Relaxed),
            "handed_over": c.handed_over.load(Relaxed),
            "handed_over_dropped": self.handoff.get().map_or(0, |h| {
                h.counters.drops_full.load(Relaxed) + h.counters.drops_send_error.load(Relaxed)
            }),
            "inject_errors": c.inject_errors.load(Relaxed),
            "inject_not_served": c.inject_not_served.load(Relaxed),
            "refused": {
                "not_a_frame": c.refused_not_a_frame.load(Relaxed),
                "malformed": c.refused_malformed.load(Relaxed),
                "unauthenticated": c.refused_unauthenticated.load(Relaxed),
                "replayed": c.refused_replayed.load(Relaxed),
                "unknown_peer": c.refused_unknown_peer.load(Relaxed),
                "wrong_receiver": c.refused_wrong_receiver.load(Relaxed),
                "stale": c.refused_stale.load(Relaxed),
            },
        })
    }
}

/// The routing snapshot accepted datagrams are handed over with, and the counters
/// the hand-over's forwarder keeps (its drops are shown as `handed_over_dropped`).
struct Handoff {
    shared: crate::dataplane::snapshot::Shared,
    counters: ShardCounters,
    /// Which of each worker's rings is this thread's.
    ring: usize,
}

/// One receive batch's hand-over: the snapshot it routes with (the same until its
/// flush, Forwarder's contract) and the frames queued for the owners.
struct HandOver<'a> {
    snap: &'a Snapshot,
    counters: &'a ShardCounters,
    fwd: &'a mut Forwarder,
}

/// Counts one and yields nothing (a refused frame).
fn bump<T>(c: &AtomicU64) -> Option<T> {
    c.fetch_add(1, Relaxed);
    None
}

/// Whether a frame from `from` comes from the peer listed at `listed`: the same IP
/// (IPv4-mapped IPv6 compared as IPv4) and port (frames leave from `--peer-listen`).
fn same_endpoint(listed: SocketAddr, from: SocketAddr) -> bool {
    listed.ip().to_canonical() == from.ip().to_canonical() && listed.port() == from.port()
}

/// The raw sockets a forwarded datagram is injected through.
struct Injector {
    raw: sys::raw::RawIpv4,
    raw6: Option<sys::raw::RawIpv6>,
    raw6_tried: Instant,
    packet: Vec<u8>,
}

impl Injector {
    /// Sends `datagram` from `client` to `local` into this host's stack.
    fn send(&mut self, client: SocketAddr, local: SocketAddr, datagram: &[u8]) -> bool {
        let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        match (canonical(client), canonical(local)) {
            (SocketAddr::V4(src), SocketAddr::V4(dst)) => {
                sys::raw::ipv4_udp_packet(src, dst, datagram, &mut self.packet).is_some()
                    && self.raw.send(&self.packet, dst).is_ok()
            }
            (SocketAddr::V6(src), SocketAddr::V6(dst)) => {
                if self.raw6.is_none() && self.raw6_tried.elapsed() >= PEERS_FILE_CHECK {
                    self.raw6_tried = Instant::now();
                    match sys::raw::RawIpv6::open() {
                        Ok(r) => {
                            tracing::info!("raw IPv6 socket open: forwarded IPv6 datagrams are injected");
                            self.raw6 = Some(r);
                        }
                        Err(e) => tracing::warn!(error = %e, "still no raw IPv6 socket"),
                    }
                }
                self.raw6.as_ref().is_some_and(|r| {
                    sys::raw::ipv6_udp_packet(src, dst, datagram, &mut self.packet).is_some()
                        && r.send(&self.packet, dst).is_ok()
                })
            }
            _ => false,
        }
    }
}

fn read_table(file: &std::path::Path) -> anyhow::Result<HashMap<u16, SocketAddr>> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("--peers {}: {e}", file.display()))?;
    let list = peer::parse_peers(&text).map_err(|e| anyhow::anyhow!("--peers {}: {e}", file.display()))?;
    Ok(list.into_iter().collect())
}

/// Whether `a` is one of the listen addresses `list` (a wildcard one serves every IP
/// of its family on its port).
/// IPv4-mapped IPv6 addresses compare as IPv4.
fn serves(list: &[SocketAddr], a: SocketAddr) -> bool {
    let ip = a.ip().to_canonical();
    list.iter().any(|s| {
        let sip = s.ip().to_canonical();
        s.port() == a.port() && (sip == ip || (sip.is_unspecified() && sip.is_ipv4() == ip.is_ipv4()))
    })
}

/// A v1 long header of type Initial or 0-RTT (RFC 9000 §17.2: type bits 0b00, 0b01).
fn client_chosen_dcid(d: &[u8]) -> bool {
    matches!(d.first(), Some(b) if b & 0x80 != 0 && (b >> 4) & 0x03 <= 1)
}

/// The DCID of a QUIC datagram: 12 bytes after the first in a short header (ADR 0001
/// fixes the length), the length-prefixed one of a long header (RFC 9000 §17.2).
fn dcid(d: &[u8]) -> Option<&[u8]> {
    let first = *d.first()?;
    if first & 0x80 == 0 {
        return d.get(1..1 + proto::cid::CID_LEN);
    }
    let len = usize::from(*d.get(5)?);
    d.get(6..6 + len)
}

#[cfg(test)]
#[path = "../../tests/peer_support/mod.rs"]
mod peer_support;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // the tests' own set-up
mod tests {
    use super::peer_support::Scripted;
    use super::{dcid, PeerOut, Peers};
    use proto::cid::{Prf, ServerId};
    use proto::host::HostLayout;
    use proto::keyfile::KeyFile;
    use proto::peer::{Body, Frame, FrameKeys, Me};
    use std::collections::HashMap;
    use std::net::{SocketAddr, UdpSocket};
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Raw sockets need root (CAP_NET_RAW), which CI has.
    fn can_inject() -> bool {
        if sys::raw::RawIpv4::open().is_err() {
            testkit::skip("raw sockets need CAP_NET_RAW");
            return false;
        }
        true
    }

    fn cluster_keys() -> KeyFile {
        let mut random = [0u8; proto::keyfile::RANDOM_LEN];
        sys::os_random(&mut random).unwrap();
        KeyFile::generate(&random, Prf::SipHash24)
    }

    /// A real `Peers` (host `id` of 4, `--host-bits 2`) on 127.0.0.1, serving
    /// `serves`, with a peers file listing `peers`.
    struct Real {
        peers: Arc<Peers>,
        file: std::path::PathBuf,
        addr: SocketAddr,
    }

    impl Real {
        fn start(
            id: u16,
            keys: &KeyFile,
            listen: SocketAddr,
            peers: &[(u16, SocketAddr)],
            serves: Vec<SocketAddr>,
        ) -> Real {
            let dir = testkit::temp_dir("peers");
            let file = dir.join("peers");
            Real::write(&file, peers);
            let layout = HostLayout::new(2, id).unwrap();
            let p = Peers::start(layout, FrameKeys::of(keys), file.clone(), listen, serves).unwrap();
            let addr = p.socket.local_addr().unwrap();
            Real { peers: p, file, addr }
        }

        fn write(file: &std::path::Path, peers: &[(u16, SocketAddr)]) {
            let text: String = peers.iter().map(|(h, a)| format!("{h} {a}\n")).collect();
            std::fs::write(file, text).unwrap();
        }

        /// Lists `peers` and re-reads the file at once (as SIGHUP does).
        fn list(&self, peers: &[(u16, SocketAddr)]) {
            Real::write(&self.file, peers);
            self.peers.reload();
        }

        fn count(&self, f: impl Fn(&super::PeerCounters) -> &std::sync::atomic::AtomicU64) -> u64 {
            f(&self.peers.counters).load(Relaxed)
        }
    }

    /// Forwards one datagram in a batch of its own, sent at once.
    fn forward_now(p: &Peers, ks: &proto::cid::KeySet, d: &[u8], client: SocketAddr, local: SocketAddr) -> bool {
        let mut out = PeerOut::new();
        let queued = p.forward(&mut out, ks, d, client, local);
        p.flush(&mut out);
        queued
    }

    fn wait(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !ok() {
            assert!(Instant::now() < deadline, "{what} within {within:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A scripted peer host `host` on 127.0.0.1 with a random epoch (tests/peer_support).
    fn scripted(host: u16, secret: &[u8; 32]) -> Scripted {
        let mut epoch = [0u8; 8];
        sys::os_random(&mut epoch).unwrap();
        let me = Me { host, epoch: u64::from_ne_bytes(epoch) | 1 };
        Scripted::new(UdpSocket::bind("127.0.0.1:0").unwrap(), me, secret)
    }

    fn client() -> SocketAddr {
        "127.0.0.1:40000".parse().unwrap()
    }

    /// A socket standing for an address this host serves (read timeout 5 s), and the
    /// address.
    fn served_sink() -> (UdpSocket, SocketAddr) {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let local = sink.local_addr().unwrap();
        (sink, local)
    }

    /// A scripted host 2 and a real host 1 on 127.0.0.1 that lists it and serves
    /// `serves`, past their handshake.
    fn scripted_to_real(keys: &KeyFile, serves: Vec<SocketAddr>) -> (Scripted, Real) {
        let mut a = scripted(2, &keys.forwarding);
        let b = Real::start(1, keys, "127.0.0.1:0".parse().unwrap(), &[(2, a.addr())], serves);
        a.handshake(1, b.addr, Duration::from_secs(5));
        (a, b)
    }

    /// ADR 0005 §4: a process holding everything a worker is ever sent — the
    /// `Assign` contents: CID keys, reset key, token key — cannot get a frame
    /// accepted. Every 32-byte string of the encoded `Assign`, used as the forwarding
    /// secret, and the old derivation from the reset key, make frames that are
    /// counted `unauthenticated`; the cluster's secret itself is accepted.
    #[test]
    fn the_assign_contents_forge_no_frame() {
        use proto::wire::Message;
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let (sink, local) = served_sink();
        let (mut good, b) = scripted_to_real(&keys, vec![local]);
        let epoch = good.outbound[&1].epoch();
        let mut assign = Vec::new();
        keys.assign(ServerId(1 << 14)).encode(&mut assign);
        let mut candidates: Vec<[u8; 32]> = assign.windows(32).map(|w| w.try_into().unwrap()).collect();
        // The version-1 frame key: HMAC-SHA-256(reset key, label).
        let old = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &keys.reset_key),
            b"quicdemux peer forwarding v1",
        );
        candidates.push(old.as_ref().try_into().unwrap());
        for secret in &candidates {
            let mut forger = scripted(2, secret);
            // From the listed peer's own socket, to the right epoch, with a fresh number.
            forger.sock = good.sock.try_clone().unwrap();
            let f = forger.seal(1, epoch, 1 << 40, Body::Data { client: client(), local, datagram: b"forged" });
            forger.sock.send_to(&f, b.addr).unwrap();
        }
        let n = candidates.len() as u64;
        wait("the forgeries counted", Duration::from_secs(5), || b.count(|c| &c.refused_unauthenticated) == n);
        assert_eq!(b.count(|c| &c.received), 0);
        // The control: the same frame under the cluster's forwarding secret goes through.
        good.data(1, b.addr, client(), local, b"genuine");
        wait("the genuine frame received", Duration::from_secs(5), || b.count(|c| &c.received) == 1);
        let mut buf = [0u8; 16];
        let (n, from) = sink.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"genuine"[..], client()));
        b.peers.shutdown();
    }

    /// A frame A → B replayed to C from A's address is refused by C (wrong
    /// receiver); replayed to B, it is refused as a replay.
    #[test]
    fn a_frame_replayed_to_a_third_host_is_refused() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let (_sink, local) = served_sink();
        let (mut a, b) = scripted_to_real(&keys, vec![local]);
        let c = Real::start(3, &keys, "127.0.0.1:0".parse().unwrap(), &[(2, a.addr())], vec![local]);
        a.handshake(3, c.addr, Duration::from_secs(5));
        let ab = a.data(1, b.addr, client(), local, b"for B");
        wait("B received it", Duration::from_secs(5), || b.count(|c| &c.received) == 1);
        a.sock.send_to(&ab, c.addr).unwrap();
        a.sock.send_to(&ab, b.addr).unwrap();
        wait("C refused it", Duration::from_secs(5), || c.count(|c| &c.refused_wrong_receiver) == 1);
        wait("B refused the replay", Duration::from_secs(5), || b.count(|c| &c.refused_replayed) == 1);
        assert_eq!((b.count(|c| &c.received), c.count(|c| &c.received)), (1, 0));
        b.peers.shutdown();
        c.peers.shutdown();
    }

    /// A frame captured before the receiver's data plane restarted is refused after
    /// it (stale), and the sender gets through to the new boot once it has answered
    /// the new boot's hello.
    #[test]
    fn a_frame_captured_before_a_restart_is_refused_after_it() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let (_sink, local) = served_sink();
        let (mut a, b) = scripted_to_real(&keys, vec![local]);
        let captured = a.data(1, b.addr, client(), local, b"before");
        wait("received before the restart", Duration::from_secs(5), || b.count(|c| &c.received) == 1);
        let at = b.addr;
        b.peers.shutdown();
        drop(b);
        let b = Real::start(1, &keys, at, &[(2, a.addr())], vec![local]);
        a.sock.send_to(&captured, b.addr).unwrap();
        wait("the captured frame refused", Duration::from_secs(5), || b.count(|c| &c.refused_stale) == 1);
        assert_eq!((b.count(|c| &c.received), b.count(|c| &c.refused_replayed)), (0, 0));
        // The new boot's answers teach A its epoch.
        a.pump(&HashMap::from([(1, b.addr)]), 300);
        a.data(1, b.addr, client(), local, b"after");
        wait("received after the restart", Duration::from_secs(5), || b.count(|c| &c.received) == 1);
        b.peers.shutdown();
    }

    /// Two real hosts: a sender whose clock steps back an hour (and forward again)
    /// keeps being accepted, and so is a restarted sender whose clock is an hour
    /// behind; nothing is refused as a replay, and a forwarded datagram arrives.
    #[test]
    fn clock_steps_and_a_restarted_sender_are_accepted() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let (sink, local) = served_sink();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = Real::start(1, &keys, any, &[], vec![local]);
        let b = Real::start(2, &keys, any, &[(1, a.addr)], vec![local]);
        a.list(&[(2, b.addr)]);
        let both_alive = |a: &Real, b: &Real| a.peers.alive(2) && b.peers.alive(1);
        wait("the handshake", Duration::from_secs(3), || both_alive(&a, &b));
        let hour = 3_600_000;
        a.peers.clock.step(-hour);
        let beats = b.count(|c| &c.heartbeats_received);
        wait("heartbeats after the step back", Duration::from_secs(2), || {
            b.count(|c| &c.heartbeats_received) >= beats + 3
        });
        assert!(both_alive(&a, &b), "both still alive after a step back");
        a.peers.clock.step(2 * hour);
        wait("heartbeats after a step forward", Duration::from_secs(2), || {
            b.count(|c| &c.heartbeats_received) >= beats + 6
        });
        assert!(both_alive(&a, &b));
        // A forwarded datagram for one of host 2's ids reaches host 2's served socket.
        let ks = keys.key_set().unwrap();
        let mut d = vec![0x40];
        d.extend_from_slice(&ks.encode(ServerId(2 << 14), &[7; proto::cid::CID_RANDOM_LEN]));
        d.extend_from_slice(b" forwarded");
        assert!(forward_now(&a.peers, &ks, &d, client(), local));
        let mut buf = [0u8; 64];
        let (n, from) = sink.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&d[..], client()));
        // A restarts an hour behind: B accepts it within a second of its first hello.
        let at = a.addr;
        a.peers.shutdown();
        drop(a);
        let a = Real::start(1, &keys, at, &[(2, b.addr)], vec![local]);
        a.peers.clock.step(-hour);
        wait("the restarted sender accepted", Duration::from_secs(1), || both_alive(&a, &b));
        assert!(forward_now(&a.peers, &ks, &d, client(), local));
        let (n, _) = sink.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &d[..]);
        for r in [&a, &b] {
            assert_eq!(r.count(|c| &c.refused_replayed), 0);
            assert_eq!(r.count(|c| &c.refused_unauthenticated), 0);
        }
        a.peers.shutdown();
        b.peers.shutdown();
    }

    /// The peers file is watched: a peer's new address is used without SIGHUP, within
    /// a second or two of the file changing.
    #[test]
    fn a_peer_that_moves_is_followed_without_sighup() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let (_a, b) = scripted_to_real(&keys, vec![]);
        wait("A alive at B", Duration::from_secs(2), || b.peers.alive(2));
        // A moves (a new socket, another port); only the file says so.
        let mut moved = scripted(2, &keys.forwarding);
        Real::write(&b.file, &[(2, moved.addr())]);
        let table = HashMap::from([(1, b.addr)]);
        let deadline = Instant::now() + Duration::from_secs(4);
        while moved.outbound.get(&1).is_none_or(|o| o.epoch() == 0) {
            assert!(Instant::now() < deadline, "B never sent to A's new address");
            moved.pump(&table, 50);
        }
        assert!(b.count(|c| &c.peers_file_reloads) >= 1);
        assert_eq!(b.peers.status_json()["addresses"]["2"], moved.addr().to_string());
        b.peers.shutdown();
    }

    /// A routing snapshot with one live, placeable owner (server id `1 << 14`: host 1)
    /// whose data connection has `rings`: the owner, the worker's end of that data
    /// connection, and the snapshot to hand over.
    fn one_live_owner(
        keys: &KeyFile,
        rings: Vec<crate::dataplane::ring::Producer>,
    ) -> (ServerId, std::os::fd::OwnedFd, Arc<arc_swap::ArcSwap<crate::dataplane::snapshot::Snapshot>>) {
        use crate::dataplane::snapshot::{DataConn, Snapshot};
        use proto::route::{InstanceInfo, Table};
        let owner = ServerId(1 << 14);
        let (ours, worker_end) = sys::seqpacket::pair().unwrap();
        let infos = [InstanceInfo { server_id: owner, placeable: true }];
        let table = Table::new(keys.key_set().unwrap(), keys.rendezvous_key, &infos).unwrap();
        let conn = Arc::new(DataConn { fd: ours, server_id: owner.0, slot: 0, rings });
        let snap = Snapshot { table, conns: vec![conn], pressure: Vec::new(), version: 1, awaited: Default::default() };
        (owner, worker_end, Arc::new(arc_swap::ArcSwap::from_pointee(snap)))
    }

    /// With the routing snapshot given, an accepted datagram whose owner is live here
    /// goes straight to the owner's data connection, as a shard's frame with the
    /// client's and the local address; one for an id not live here is injected.
    #[test]
    fn a_datagram_for_a_live_owner_is_handed_to_its_data_connection() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let ks = keys.key_set().unwrap();
        let (owner, worker_end, shared) = one_live_owner(&keys, Vec::new());
        let (sink, local) = served_sink();
        let mut a = scripted(2, &keys.forwarding);
        let b = Real::start(1, &keys, "127.0.0.1:0".parse().unwrap(), &[(2, a.addr())], vec![local]);
        b.peers.hand_over_to(shared, 16, 0);
        a.handshake(1, b.addr, Duration::from_secs(5));
        let short = |id: ServerId| {
            let mut d = vec![0x40];
            d.extend_from_slice(&ks.encode(id, &[9; proto::cid::CID_RANDOM_LEN]));
            d.extend_from_slice(b" payload");
            d
        };
        let d = short(owner);
        a.data(1, b.addr, client(), local, &d);
        let mut rec = [0u8; 2048];
        // recv(2) on the worker's end (a SEQPACKET socket reads like a datagram one).
        let worker_end = std::os::unix::net::UnixDatagram::from(worker_end);
        worker_end.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = worker_end.recv(&mut rec).unwrap();
        let (meta, payload) = proto::wire::frame::decode(&rec[..n]).unwrap();
        assert_eq!((meta.client, meta.local, payload), (client(), Some(local), &d[..]));
        wait("counted", Duration::from_secs(2), || b.count(|c| &c.handed_over) == 1);
        // Another local id, not live: injected for a shard to deal with.
        let other = short(ServerId((1 << 14) + 1));
        a.data(1, b.addr, client(), local, &other);
        let mut buf = [0u8; 64];
        let (n, from) = sink.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&other[..], client()));
        // The datagram can arrive before the receiving thread counts it.
        wait("injected counted", Duration::from_secs(2), || b.count(|c| &c.injected) == 1);
        assert_eq!(b.count(|c| &c.handed_over), 1);
        assert_eq!(b.peers.status_json()["handed_over_dropped"], 0);
        b.peers.shutdown();
    }

    /// Enables UDP_GRO on a test socket: GSO trains are read whole.
    fn read_trains_whole(sock: &UdpSocket) {
        use std::os::fd::AsRawFd;
        sys::sockopt::setsockopt_int(sock.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1).unwrap();
    }

    /// A 1200-byte short header for server id `host << 14` (`--host-bits 2`), its
    /// CID's random part and padding `k`.
    fn short_for(ks: &proto::cid::KeySet, host: u16, k: u8) -> Vec<u8> {
        let mut d = vec![0x40];
        d.extend_from_slice(&ks.encode(ServerId(host << 14), &[k; proto::cid::CID_RANDOM_LEN]));
        d.resize(1200, k);
        d
    }

    /// One shard batch with frames to two peers, interleaved: each peer gets one GSO
    /// train (one sendmmsg per peer), which its socket reads whole (UDP_GRO) and which
    /// splits at its segment size back into exactly the frames of its datagrams, in
    /// order, sealed for it.
    #[test]
    fn a_batch_to_two_peers_goes_as_one_train_each() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let ks = keys.key_set().unwrap();
        let (mut p2, mut p3) = (scripted(2, &keys.forwarding), scripted(3, &keys.forwarding));
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = Real::start(1, &keys, any, &[(2, p2.addr()), (3, p3.addr())], vec![]);
        p2.handshake(1, a.addr, Duration::from_secs(5));
        p3.handshake(1, a.addr, Duration::from_secs(5));
        read_trains_whole(&p2.sock);
        read_trains_whole(&p3.sock);
        let local: SocketAddr = "198.19.9.9:443".parse().unwrap();
        let mut out = PeerOut::new();
        let mut want: HashMap<u16, Vec<Vec<u8>>> = HashMap::new();
        for k in 0..10u8 {
            for host in [2, 3] {
                let d = short_for(&ks, host, k);
                assert!(a.peers.forward(&mut out, &ks, &d, client(), local));
                want.entry(host).or_default().push(d);
            }
        }
        assert_eq!(a.count(|c| &c.forwarded), 0, "nothing goes before the batch's end");
        a.peers.flush(&mut out);
        assert_eq!((a.count(|c| &c.forwarded), a.count(|c| &c.trains_sent)), (20, 2));
        assert_eq!(a.count(|c| &c.forward_errors), 0);
        assert!(out.is_empty());
        for (p, host) in [(&p2, 2u16), (&p3, 3)] {
            let mut rx = sys::mmsg::RecvMmsg::new(1, 65_535).with_control(64);
            let deadline = Instant::now() + Duration::from_secs(5);
            // Heartbeats may come first: the train is the first message longer than one.
            let (train, segment) = loop {
                assert!(Instant::now() < deadline, "no train reached host {host}");
                if rx.recv(&p.sock, 0).is_err() {
                    continue;
                }
                let m = rx.get(0).unwrap();
                if m.data.len() > 1300 {
                    let segment = crate::dataplane::cmsg::parse(m.control).gro_size;
                    break (m.data.to_vec(), segment);
                }
            };
            let segment = usize::from(segment.expect("read as one GRO train"));
            let frames: Vec<&[u8]> = train.chunks(segment).collect();
            assert_eq!(frames.len(), 10);
            for (f, d) in frames.iter().zip(&want[&host]) {
                let opened = proto::peer::open(&p.keys, f).expect("each segment is one whole frame");
                assert_eq!((opened.header.from_host, opened.header.to_host), (1, host));
                assert_eq!(opened.body, Body::Data { client: client(), local, datagram: d });
            }
        }
        a.peers.shutdown();
    }

    /// A GSO train of three frames, the middle one corrupted: the receiver reads it
    /// as one train, counts the bad frame `unauthenticated`, accepts the other two
    /// and delivers their datagrams in order.
    #[test]
    fn a_bad_frame_inside_a_train_is_counted_and_the_rest_accepted() {
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let (sink, local) = served_sink();
        let (mut a, b) = scripted_to_real(&keys, vec![local]);
        let mut frames: Vec<Vec<u8>> = (0..3u8)
            .map(|k| {
                let (e, seq) = a.outbound[&1].data().unwrap();
                a.seal(1, e, seq, Body::Data { client: client(), local, datagram: &[b'a' + k; 100] })
            })
            .collect();
        frames[1][30] ^= 1;
        let train = frames.concat();
        let to = socket2::SockAddr::from(b.addr);
        let mut send = sys::mmsg::SendMmsg::new(1, 1);
        let mut batch = send.batch();
        let segment = Some(frames[0].len() as u16);
        assert!(batch.push(&[&train], sys::mmsg::SendMeta { to: Some(&to), source: None, segment_size: segment }));
        assert_eq!(batch.send_from(&a.sock, 0, 0).unwrap(), 1);
        wait("two accepted", Duration::from_secs(5), || b.count(|c| &c.received) == 2);
        assert_eq!(b.count(|c| &c.refused_unauthenticated), 1);
        assert_eq!(b.count(|c| &c.trains_received), 1, "read as one train");
        let mut buf = [0u8; 256];
        for k in [0u8, 2] {
            let (n, from) = sink.recv_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], from), (&[b'a' + k; 100][..], client()));
        }
        b.peers.shutdown();
    }

    /// With rings, an accepted datagram goes into its owner's ring that is this
    /// thread's (the one after the shards'), not a shard's ring and not the data
    /// connection, with the client's and the local address.
    #[test]
    fn a_datagram_for_a_live_owner_goes_into_the_peer_threads_ring() {
        use crate::dataplane::ring::Producer;
        if !can_inject() {
            return;
        }
        let keys = cluster_keys();
        let ks = keys.key_set().unwrap();
        let (shard_ring, peer_ring) = (Producer::create(1 << 18).unwrap(), Producer::create(1 << 18).unwrap());
        let open = |p: &Producer| {
            let [m, e] = p.fds();
            worker::ring::Consumer::open(m.try_clone_to_owned().unwrap(), e.try_clone_to_owned().unwrap(), p.capacity())
                .unwrap()
        };
        let (shard_rx, peer_rx) = (open(&shard_ring), open(&peer_ring));
        let (_owner, worker_end, shared) = one_live_owner(&keys, vec![shard_ring, peer_ring]);
        let (_sink, local) = served_sink();
        let mut a = scripted(2, &keys.forwarding);
        let b = Real::start(1, &keys, "127.0.0.1:0".parse().unwrap(), &[(2, a.addr())], vec![local]);
        b.peers.hand_over_to(shared, 16, 1);
        a.handshake(1, b.addr, Duration::from_secs(5));
        let d = short_for(&ks, 1, 4);
        a.data(1, b.addr, client(), local, &d);
        wait("counted", Duration::from_secs(5), || b.count(|c| &c.handed_over) == 1);
        let mut payload = vec![0u8; 2048];
        match peer_rx.pop_frame(&mut payload).unwrap() {
            Some(worker::ring::Popped::Frame { meta, len }) => {
                assert_eq!((meta.client, meta.local, &payload[..len]), (client(), Some(local), &d[..]));
            }
            other => panic!("the peer thread's ring holds {other:?}"),
        }
        assert!(shard_rx.is_empty(), "the shard's ring is not the peer thread's");
        let worker_end = std::os::unix::net::UnixDatagram::from(worker_end);
        worker_end.set_nonblocking(true).unwrap();
        let mut rec = [0u8; 64];
        assert!(worker_end.recv(&mut rec).is_err(), "nothing on the data connection");
        b.peers.shutdown();
    }

    /// Between two network namespaces whose veth has an MTU of 1280, a train of
    /// frames too long for it (1300-byte datagrams) is refused by the kernel and sent
    /// again frame by frame (IP fragments): nothing lost, nothing counted an error.
    /// Trains of shorter frames still go as trains; longer ones go alone from then on.
    #[test]
    fn a_train_the_path_refuses_goes_frame_by_frame() {
        use testkit::netns::{in_netns, ip, VethPair};
        if !can_inject() || !testkit::netns::can_build() {
            return;
        }
        let keys = cluster_keys();
        let ks = keys.key_set().unwrap();
        let pair = VethPair::new("peermtu");
        for (ns, dev) in [(&pair.a, pair.a_dev), (&pair.b, pair.b_dev)] {
            ip(Some(ns), &["link", "set", dev, "mtu", "1280"]);
        }
        let (a_addr, b_addr) = (pair.a_addr, pair.b_addr);
        let sock = in_netns(&pair.b, move || UdpSocket::bind((b_addr, 0)).unwrap());
        let mut p2 = Scripted::new(sock, Me { host: 2, epoch: 0x2222_0001 }, &keys.forwarding);
        let (k, peer) = (keys.clone(), p2.addr());
        let a = in_netns(&pair.a, move || Real::start(1, &k, SocketAddr::new(a_addr.into(), 0), &[(2, peer)], vec![]));
        p2.handshake(1, a.addr, Duration::from_secs(5));
        let local: SocketAddr = "198.19.9.9:443".parse().unwrap();
        let batch = |len: usize, k: u8| {
            let mut out = PeerOut::new();
            let sent: Vec<Vec<u8>> = (0..3)
                .map(|i| {
                    let mut d = short_for(&ks, 2, k + i);
                    d.resize(len, k + i);
                    assert!(a.peers.forward(&mut out, &ks, &d, client(), local));
                    d
                })
                .collect();
            a.peers.flush(&mut out);
            sent
        };
        let mut got = Vec::new();
        let receive = |n: usize, got: &mut Vec<Vec<u8>>| {
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut buf = vec![0u8; 65_535];
            while got.len() < n {
                assert!(Instant::now() < deadline, "only {} of {n} frames arrived", got.len());
                let Ok((len, _)) = p2.sock.recv_from(&mut buf) else { continue };
                if let Ok(Frame { body: Body::Data { datagram, .. }, .. }) = proto::peer::open(&p2.keys, &buf[..len]) {
                    got.push(datagram.to_vec());
                }
            }
        };
        let long = batch(1300, 10);
        receive(3, &mut got);
        assert_eq!(got, long, "every frame of the refused train arrived, in order");
        // An IPv4 data frame: header, two 7-byte addresses, the datagram, the tag.
        let long_frame = proto::peer::HEADER_LEN + 2 * 7 + 1300 + proto::peer::TAG_LEN;
        assert_eq!(a.peers.gso_refused_at.load(Relaxed), long_frame, "trains of such frames are not tried again");
        assert_eq!((a.count(|c| &c.forwarded), a.count(|c| &c.forward_errors), a.count(|c| &c.trains_sent)), (3, 0, 0));
        let short = batch(1000, 20);
        receive(6, &mut got);
        assert_eq!(&got[3..], &short[..]);
        assert_eq!(a.count(|c| &c.trains_sent), 1, "shorter frames still go as a train");
        let long_again = batch(1300, 30);
        receive(9, &mut got);
        assert_eq!(&got[6..], &long_again[..]);
        assert_eq!((a.count(|c| &c.forwarded), a.count(|c| &c.trains_sent)), (9, 1), "long frames now go alone");
        a.peers.shutdown();
    }

    /// An authenticated frame from a listed peer whose client and local addresses
    /// are IPv6 is injected, and the UDP socket it names receives the datagram from
    /// the client's address; IPv4-mapped addresses go through the IPv4 socket.
    #[test]
    fn ipv6_and_mapped_frames_are_injected_with_the_clients_address() {
        if !can_inject() {
            return;
        }
        let Ok(rx) = UdpSocket::bind("[::1]:0") else {
            testkit::skip_optional("ipv6-loopback", "no IPv6 loopback");
            return;
        };
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (rx4, local4) = served_sink();
        let local = rx.local_addr().unwrap();
        let keys = cluster_keys();
        let (mut a, b) = scripted_to_real(&keys, vec![local, local4]);
        let client6: SocketAddr = "[2001:db8::5]:4321".parse().unwrap();
        a.data(1, b.addr, client6, local, b"a forwarded datagram");
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("the datagram is injected");
        assert_eq!((&buf[..n], from), (&b"a forwarded datagram"[..], client6));
        let mapped = |a: SocketAddr| match a {
            SocketAddr::V4(v4) => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
            v6 => v6,
        };
        a.data(1, b.addr, mapped(client()), mapped(local4), b"mapped");
        let (n, from) = rx4.recv_from(&mut buf).expect("the mapped datagram is injected");
        assert_eq!((&buf[..n], from), (&b"mapped"[..], client()));
        wait("counted", Duration::from_secs(2), || b.count(|c| &c.injected) == 2);
        assert_eq!(b.count(|c| &c.inject_errors), 0);
        b.peers.shutdown();
    }

    #[test]
    fn frames_come_from_the_listed_ip_and_port() {
        use super::same_endpoint;
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(same_endpoint(a("198.18.2.2:4434"), a("198.18.2.2:4434")));
        assert!(same_endpoint(a("198.18.2.2:4434"), a("[::ffff:198.18.2.2]:4434")), "IPv4-mapped");
        assert!(!same_endpoint(a("198.18.2.2:4434"), a("198.18.2.2:4435")), "another port on the peer's host");
        assert!(!same_endpoint(a("198.18.2.2:4434"), a("198.18.2.3:4434")));
    }

    #[test]
    fn injection_only_towards_served_addresses() {
        use super::serves;
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let list = [a("198.19.9.9:443"), a("0.0.0.0:8443")];
        assert!(serves(&list, a("198.19.9.9:443")));
        assert!(!serves(&list, a("198.19.9.8:443")), "another IP");
        assert!(!serves(&list, a("198.19.9.9:444")), "another port");
        assert!(serves(&list, a("10.1.2.3:8443")), "a wildcard serves every IPv4 address on its port");
        assert!(!serves(&list, a("[2001:db8::1]:8443")), "but not IPv6");
        assert!(!serves(&[], a("198.19.9.9:443")));
        assert!(serves(&list, a("[::ffff:198.19.9.9]:443")), "IPv4-mapped");
        assert!(serves(&[a("[::ffff:198.19.9.9]:443")], a("198.19.9.9:443")));
    }

    #[test]
    fn only_server_chosen_dcids_are_forwarded() {
        use super::client_chosen_dcid;
        assert!(client_chosen_dcid(&[0xc3]), "Initial");
        assert!(client_chosen_dcid(&[0xd3]), "0-RTT");
        assert!(!client_chosen_dcid(&[0xe3]), "Handshake");
        assert!(!client_chosen_dcid(&[0x43]), "short header");
        assert!(!client_chosen_dcid(&[]));
    }

    #[test]
    fn dcids_of_both_header_forms() {
        let mut short = vec![0x40];
        short.extend(1..=12u8);
        short.extend([0; 20]);
        assert_eq!(dcid(&short), Some(&short[1..13]));
        assert_eq!(dcid(&short[..10]), None, "too short for a 12-byte CID");
        let long = [0xe0, 0, 0, 0, 1, 3, 7, 8, 9, 0];
        assert_eq!(dcid(&long), Some(&[7u8, 8, 9][..]));
        assert_eq!(dcid(&long[..7]), None);
        assert_eq!(dcid(&[]), None);
    }
}
