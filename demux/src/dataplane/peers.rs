//! Host-to-host forwarding (docs/adr/0005-server-ids-across-hosts.md).
//!
//! - **Out:** a shard that routes a datagram as an orphan first asks
//!   [`Peers::forward`]: if its DCID decodes to a server id of another host listed in
//!   `--peers`, the datagram goes there in an authenticated frame (proto::peer) and is
//!   not reset here.
//! - **In:** one thread receives frames on `--peer-listen`, verifies the tag (the
//!   cluster key file's forwarding key), drops replays (a window per sending host),
//!   and hands the datagram to this host's own stack through a raw socket with the
//!   client's address as source and the local address it was sent to as destination
//!   — so it reaches the owning worker by the kernel fast path or a shard exactly as
//!   if it had arrived here, and the worker answers the client directly.
//!
//! - **Liveness:** every [`HEARTBEAT`] each host sends every peer an empty frame; a
//!   peer not heard from (heartbeat or forwarded datagram) for [`PEER_DEAD`] is dead:
//!   its ids are no longer forwarded, so they are orphans here and get this host's
//!   stateless reset (every host has the cluster's reset key), and the client
//!   reconnects.
//!
//! Injection uses a raw IPv4 socket and a raw IPv6 one (IPV6_HDRINCL, with the UDP
//! checksum IPv6 requires, sys::raw). Without IPv6 on the host (no raw IPv6 socket:
//! one warning at start) an IPv6 frame is counted `inject_errors`, as is a frame
//! whose client and local addresses are of different families.

use proto::cid::KeySet;
use proto::host::HostLayout;
use proto::peer::{self, ForwardingKey, Frame, FrameError, ReplayWindow, Sequencer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a host tells each peer it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// A peer silent this long is dead: its ids are reset here, not forwarded.
pub const PEER_DEAD: Duration = Duration::from_secs(1);
/// Host ids are below this (ADR 0005: at most 8 host bits).
const HOSTS: usize = 1 << proto::host::MAX_HOST_BITS;

/// Counters (lb-status `peers`).
#[derive(Default)]
pub struct PeerCounters {
    pub forwarded: AtomicU64,
    pub forward_errors: AtomicU64,
    pub received: AtomicU64,
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
    pub heartbeats_received: AtomicU64,
    /// Orphans of a dead peer's ids (reset here).
    pub dead_peer: AtomicU64,
}

/// This host's forwarding state, shared by the shards and the receiving thread.
pub struct Peers {
    layout: HostLayout,
    key: ForwardingKey,
    file: PathBuf,
    /// host id → its forwarding address (re-read on SIGHUP).
    table: arc_swap::ArcSwap<HashMap<u16, SocketAddr>>,
    /// Forwarded datagrams per destination host (host ids are below 2^MAX_HOST_BITS).
    per_host: Box<[AtomicU64; HOSTS]>,
    socket: UdpSocket,
    /// The next frame's sequence number (proto::peer::Sequencer's numbering).
    seq: AtomicU64,
    /// The addresses this host serves: a forwarded datagram is injected only towards
    /// one of them (anycast: every host serves the same), so a misconfigured peer
    /// cannot make two hosts bounce a datagram between them.
    serves: Vec<SocketAddr>,
    /// When each peer was last heard from: milliseconds since `epoch`, plus one (0:
    /// never), per host id.
    last_seen: Box<[AtomicU64; HOSTS]>,
    epoch: Instant,
    pub counters: PeerCounters,
}

impl Peers {
    /// Binds `listen` (frames in; also the source of frames out) and reads `file`.
    pub fn start(
        layout: HostLayout,
        reset_key: &[u8; 32],
        file: PathBuf,
        listen: SocketAddr,
        serves: Vec<SocketAddr>,
    ) -> anyhow::Result<Arc<Peers>> {
        use anyhow::Context;
        let table = read_table(&file)?;
        let socket = UdpSocket::bind(listen).with_context(|| format!("--peer-listen {listen}"))?;
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX)) as u32);
        let p = Arc::new(Peers {
            layout,
            key: ForwardingKey::derive(reset_key),
            file,
            table: arc_swap::ArcSwap::from_pointee(table),
            per_host: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            socket,
            seq: AtomicU64::new(Sequencer::new(start).take()),
            serves,
            last_seen: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            epoch: Instant::now(),
            counters: PeerCounters::default(),
        });
        let raw = sys::raw::RawIpv4::open().context("a raw IPv4 socket for forwarded datagrams (needs CAP_NET_RAW)")?;
        let raw6 = sys::raw::RawIpv6::open()
            .map_err(|e| tracing::warn!(error = %e, "no raw IPv6 socket: forwarded IPv6 datagrams will be counted inject_errors"))
            .ok();
        let rx = p.clone();
        std::thread::Builder::new()
            .name("peers".into())
            .spawn(move || rx.receive_loop(&raw, raw6.as_ref()))
            .context("starting the peer receiver")?;
        tracing::info!(listen = %listen, peers = p.table.load().len(), host = layout.host(), "host-to-host forwarding on");
        Ok(p)
    }

    /// SIGHUP: re-reads the peers file; a bad file keeps the old table.
    pub fn reload(&self) {
        match read_table(&self.file) {
            Ok(t) => {
                tracing::info!(peers = t.len(), "peers file re-read");
                self.table.store(Arc::new(t));
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "peers file not re-read; keeping the old one"),
        }
    }

    /// An orphan datagram (its DCID names no live local instance): forwarded when the
    /// DCID decodes to another host's server id with a known peer. `true`: it went.
    pub fn forward(&self, keys: &KeySet, datagram: &[u8], client: SocketAddr, local: SocketAddr) -> bool {
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
        if !self.alive(host) {
            self.counters.dead_peer.fetch_add(1, Relaxed);
            return false;
        }
        match self.send_frame(to, client, local, datagram) {
            Ok(_) => {
                self.counters.forwarded.fetch_add(1, Relaxed);
                if let Some(n) = self.per_host.get(usize::from(host)) {
                    n.fetch_add(1, Relaxed);
                }
                true
            }
            Err(_) => {
                self.counters.forward_errors.fetch_add(1, Relaxed);
                false
            }
        }
    }

    fn serves_addr(&self, a: SocketAddr) -> bool {
        serves(&self.serves, a)
    }

    fn alive(&self, host: u16) -> bool {
        let Some(seen) = self.last_seen.get(usize::from(host)).map(|t| t.load(Relaxed)) else { return false };
        seen != 0 && self.now_ms().saturating_sub(seen - 1) < PEER_DEAD.as_millis() as u64
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn send_frame(
        &self,
        to: SocketAddr,
        client: SocketAddr,
        local: SocketAddr,
        datagram: &[u8],
    ) -> std::io::Result<usize> {
        thread_local! {
            // One frame buffer per shard thread (and the receiving thread's heartbeats).
            static FRAME: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(65_536));
        }
        let seq = self.seq.fetch_add(1, Relaxed);
        let f = Frame { from_host: self.layout.host(), seq, client, local, datagram };
        FRAME.with_borrow_mut(|frame| {
            peer::seal(&self.key, &f, frame);
            self.socket.send_to(frame, to)
        })
    }

    /// An empty frame to every peer (its addresses unused).
    fn heartbeat(&self) {
        let none: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 0));
        for (_, &to) in self.table.load().iter() {
            let _ = self.send_frame(to, none, none, &[]);
        }
    }

    fn receive_loop(&self, raw: &sys::raw::RawIpv4, raw6: Option<&sys::raw::RawIpv6>) {
        let mut windows: HashMap<u16, ReplayWindow> = HashMap::new();
        let mut buf = vec![0u8; 65536];
        let mut packet = Vec::with_capacity(65536);
        let _ = self.socket.set_read_timeout(Some(HEARTBEAT / 2));
        let mut beat = Instant::now() - HEARTBEAT;
        loop {
            if beat.elapsed() >= HEARTBEAT {
                self.heartbeat();
                beat = Instant::now();
            }
            let (n, from) = match self.socket.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "peer socket receive failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            let c = &self.counters;
            let frame = match peer::open(&self.key, &buf[..n]) {
                Ok(f) => f,
                Err(FrameError::NotAFrame) => {
                    c.refused_not_a_frame.fetch_add(1, Relaxed);
                    continue;
                }
                Err(FrameError::Malformed) => {
                    c.refused_malformed.fetch_add(1, Relaxed);
                    continue;
                }
                Err(FrameError::Unauthenticated) => {
                    c.refused_unauthenticated.fetch_add(1, Relaxed);
                    continue;
                }
            };
            // Authentic, but from a host we do not list (or from another address
            // than its listed one): refused, and its numbers do not move a window.
            if self.table.load().get(&frame.from_host).is_none_or(|a| a.ip() != from.ip()) {
                c.refused_unknown_peer.fetch_add(1, Relaxed);
                continue;
            }
            if !windows.entry(frame.from_host).or_default().accept(frame.seq) {
                c.refused_replayed.fetch_add(1, Relaxed);
                continue;
            }
            if let Some(t) = self.last_seen.get(usize::from(frame.from_host)) {
                t.store(self.now_ms() + 1, Relaxed);
            }
            if frame.datagram.is_empty() {
                c.heartbeats_received.fetch_add(1, Relaxed);
                continue;
            }
            c.received.fetch_add(1, Relaxed);
            if !self.serves_addr(frame.local) {
                c.inject_not_served.fetch_add(1, Relaxed);
                continue;
            }
            let sent = match (frame.client, frame.local) {
                (SocketAddr::V4(src), SocketAddr::V4(dst)) => {
                    sys::raw::ipv4_udp_packet(src, dst, frame.datagram, &mut packet).is_some()
                        && raw.send(&packet, dst).is_ok()
                }
                (SocketAddr::V6(src), SocketAddr::V6(dst)) => raw6.is_some_and(|r| {
                    sys::raw::ipv6_udp_packet(src, dst, frame.datagram, &mut packet).is_some()
                        && r.send(&packet, dst).is_ok()
                }),
                _ => false,
            };
            if sent {
                c.injected.fetch_add(1, Relaxed);
            } else {
                c.inject_errors.fetch_add(1, Relaxed);
            }
        }
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
        let alive = self.table.load().keys().filter(|h| self.alive(**h)).count();
        json!({
            "host": self.layout.host(),
            "peers": self.table.load().len(),
            "peers_alive": alive,
            "heartbeats_received": c.heartbeats_received.load(Relaxed),
            "dead_peer": c.dead_peer.load(Relaxed),
            "forwarded": c.forwarded.load(Relaxed),
            "forwarded_to": per,
            "forward_errors": c.forward_errors.load(Relaxed),
            "received": c.received.load(Relaxed),
            "injected": c.injected.load(Relaxed),
            "inject_errors": c.inject_errors.load(Relaxed),
            "inject_not_served": c.inject_not_served.load(Relaxed),
            "refused": {
                "not_a_frame": c.refused_not_a_frame.load(Relaxed),
                "malformed": c.refused_malformed.load(Relaxed),
                "unauthenticated": c.refused_unauthenticated.load(Relaxed),
                "replayed": c.refused_replayed.load(Relaxed),
                "unknown_peer": c.refused_unknown_peer.load(Relaxed),
            },
        })
    }
}

fn read_table(file: &std::path::Path) -> anyhow::Result<HashMap<u16, SocketAddr>> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("--peers {}: {e}", file.display()))?;
    let list = peer::parse_peers(&text).map_err(|e| anyhow::anyhow!("--peers {}: {e}", file.display()))?;
    Ok(list.into_iter().collect())
}

/// Whether `a` is one of the listen addresses `list` (a wildcard one serves every IP
/// of its family on its port).
fn serves(list: &[SocketAddr], a: SocketAddr) -> bool {
    list.iter()
        .any(|s| s.port() == a.port() && (s.ip() == a.ip() || (s.ip().is_unspecified() && s.is_ipv4() == a.is_ipv4())))
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
mod tests {
    use super::dcid;

    /// As root: an authenticated frame from a listed peer whose client and local
    /// addresses are IPv6 is injected, and the UDP socket it names receives the
    /// datagram from the client's address (was: counted inject_errors).
    #[test]
    #[allow(clippy::unwrap_used)] // the test's own set-up
    fn an_ipv6_frame_is_injected_with_the_clients_address() {
        use proto::peer::{seal, ForwardingKey, Frame};
        use std::net::{SocketAddr, UdpSocket};
        use std::sync::atomic::Ordering::Relaxed;
        if sys::raw::RawIpv6::open().is_err() || sys::raw::RawIpv4::open().is_err() {
            eprintln!("SKIPPED: raw sockets need CAP_NET_RAW (and IPv6 for the v6 one)");
            return;
        }
        let Ok(rx) = UdpSocket::bind("[::1]:0") else {
            eprintln!("SKIPPED: no IPv6 loopback");
            return;
        };
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let local = rx.local_addr().unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dir = std::env::temp_dir().join(format!("qd-peers-v6-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("peers");
        std::fs::write(&file, format!("2 {}\n", peer.local_addr().unwrap())).unwrap();
        let reset = [0x42; 32];
        let layout = proto::host::HostLayout::new(2, 1).unwrap();
        let p = super::Peers::start(layout, &reset, file, "127.0.0.1:0".parse().unwrap(), vec![local]).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let to = p.socket.local_addr().unwrap();
        let client: SocketAddr = "[2001:db8::5]:4321".parse().unwrap();
        let mut frame = Vec::new();
        let f = Frame { from_host: 2, seq: 1 << 32, client, local, datagram: b"a forwarded datagram" };
        seal(&ForwardingKey::derive(&reset), &f, &mut frame);
        peer.send_to(&frame, to).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("the datagram is injected");
        assert_eq!((&buf[..n], from), (&b"a forwarded datagram"[..], client));
        // The datagram can arrive before the receiving thread counts it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while p.counters.injected.load(Relaxed) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!((p.counters.injected.load(Relaxed), p.counters.inject_errors.load(Relaxed)), (1, 0));
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
