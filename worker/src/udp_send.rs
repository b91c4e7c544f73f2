//! The send side: replies go straight out of the shared UDP socket(s) the data plane
//! handed over in `Sockets` (the worker never reads them).
//!
//! Sends use `quinn_udp::UdpSocketState`, quinn's own socket layer, so GSO
//! (`segment_size` → UDP_SEGMENT), ECN (IP_TOS / IPV6_TCLASS) and the source address
//! (`src_ip` → IP_PKTINFO / IPV6_PKTINFO, so a wildcard-bound socket answers from the
//! address the client used) behave exactly as on a socket quinn owns.
//!
//! `UdpSocketState::new` configures the socket it is given (it sets O_NONBLOCK, GRO,
//! IP_RECVTOS, PMTU discovery …). Those settings live in the open file description
//! the data plane shares with us, so we build the state on a private *probe* socket
//! of the same family and only ever pass the shared socket to `try_send`, which
//! changes nothing. Consequently the shared socket's O_NONBLOCK is whatever the data
//! plane chose: if set, `WouldBlock` is reported to quinn and writability is awaited
//! through tokio; if not, a send may block briefly when the socket buffer is full.

use crate::datasock::SharedSocketFd;
use quinn_udp::{Transmit, UdpSockRef, UdpSocketState};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Bound on remembered client → socket choices (only used with several sockets of
/// one family, e.g. two ports).
const MAX_LEARNED: usize = 65_536;

#[derive(Debug)]
enum Fd {
    /// O_NONBLOCK set by the data plane: writability through tokio.
    Async(AsyncFd<OwnedFd>),
    /// Blocking description: sends may block briefly.
    Blocking(OwnedFd),
}

#[derive(Debug)]
struct Sock {
    addr: SocketAddr,
    fd: Fd,
}

/// Send counters.
#[derive(Debug, Default)]
pub struct SendStats {
    pub transmits: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub would_block: AtomicU64,
}

/// The shared UDP sockets, send-only.
#[derive(Debug)]
pub struct SharedUdp {
    socks: Vec<Sock>,
    state: UdpSocketState,
    /// client address → index of the socket its last datagram arrived on (only
    /// consulted when one family has several sockets).
    learned: Mutex<HashMap<SocketAddr, usize>>,
    ambiguous: bool,
    last_would_block: AtomicUsize,
    last_error_log: Mutex<Option<Instant>>,
    pub stats: SendStats,
}

fn probe_state(v6_only: bool) -> io::Result<UdpSocketState> {
    let probe = if v6_only {
        std::net::UdpSocket::bind("[::1]:0")?
    } else {
        std::net::UdpSocket::bind("127.0.0.1:0").or_else(|_| std::net::UdpSocket::bind("[::1]:0"))?
    };
    UdpSocketState::new(UdpSockRef::from(&probe))
}

impl SharedUdp {
    /// Takes ownership of the sockets from `Sockets`. Must run inside a tokio runtime.
    pub fn new(sockets: Vec<SharedSocketFd>) -> io::Result<SharedUdp> {
        if sockets.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no shared UDP socket"));
        }
        let only_v6 = sockets.iter().all(|s| s.addr.is_ipv6());
        let state = probe_state(only_v6)?;
        let mut socks = Vec::with_capacity(sockets.len());
        for s in sockets {
            let fd = if socket2::SockRef::from(&s.fd).nonblocking()? {
                Fd::Async(crate::async_fd::register(s.fd, Interest::WRITABLE)?)
            } else {
                tracing::info!(addr = %s.addr, "shared UDP socket is blocking: sends may block briefly");
                Fd::Blocking(s.fd)
            };
            socks.push(Sock { addr: s.addr, fd });
        }
        let v4 = socks.iter().filter(|s| s.addr.is_ipv4()).count();
        let ambiguous = v4 > 1 || socks.len() - v4 > 1;
        Ok(SharedUdp {
            socks,
            state,
            learned: Mutex::new(HashMap::new()),
            ambiguous,
            last_would_block: AtomicUsize::new(0),
            last_error_log: Mutex::new(None),
            stats: SendStats::default(),
        })
    }

    /// The listen addresses, in `Sockets` order.
    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.socks.iter().map(|s| s.addr)
    }

    /// Most datagrams one GSO send may carry (quinn-udp's probe of UDP_SEGMENT).
    pub fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// Remembers which listen address `client` used (frame's local address), so the
    /// reply leaves from the same port when one family has several sockets.
    pub fn learn(&self, client: SocketAddr, local: Option<SocketAddr>) {
        if !self.ambiguous {
            return;
        }
        let Some(local) = local else { return };
        let Some(idx) = self.index_for_local(local) else {
            return;
        };
        if let Ok(mut m) = self.learned.lock() {
            if m.get(&client) != Some(&idx) {
                if m.len() >= MAX_LEARNED {
                    m.clear();
                }
                m.insert(client, idx);
            }
        }
    }

    fn index_for_local(&self, local: SocketAddr) -> Option<usize> {
        let same_family = |a: &SocketAddr| a.is_ipv4() == local.is_ipv4();
        self.socks
            .iter()
            .position(|s| s.addr == local)
            .or_else(|| {
                self.socks
                    .iter()
                    .position(|s| s.addr.port() == local.port() && s.addr.ip().is_unspecified() && same_family(&s.addr))
            })
            .or_else(|| self.socks.iter().position(|s| s.addr.port() == local.port() && same_family(&s.addr)))
    }

    /// Which socket a transmit leaves from: the one the client's datagrams arrived on
    /// if known and ambiguous, else the one bound to `src_ip`, else the first of the
    /// destination's family.
    fn pick(&self, t: &Transmit<'_>) -> usize {
        if self.socks.len() == 1 {
            return 0;
        }
        if self.ambiguous {
            if let Some(i) = self.learned.lock().ok().and_then(|m| m.get(&t.destination).copied()) {
                return i;
            }
        }
        let fam_v4 = t.destination.is_ipv4();
        if let Some(src) = t.src_ip {
            if let Some(i) = self.socks.iter().position(|s| s.addr.ip() == src) {
                return i;
            }
        }
        let v4mapped = |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        self.socks
            .iter()
            .position(|s| s.addr.is_ipv4() == fam_v4)
            .or_else(|| {
                // An IPv4 client on a dual-stack IPv6 socket shows up v4-mapped.
                self.socks.iter().position(|s| s.addr.is_ipv6() && v4mapped(t.destination.ip()))
            })
            .unwrap_or(0)
    }

    /// The listen address a transmit leaves from (see [`SharedUdp::try_send`]); the
    /// fast path answers from its socket of the same listen address.
    pub fn source_for(&self, t: &Transmit<'_>) -> SocketAddr {
        self.socks[self.pick(t)].addr
    }

    /// Sends one transmit. `WouldBlock` only on a non-blocking socket whose buffer
    /// is full (then [`SharedUdp::writable`] must be awaited). Other errors are
    /// counted and swallowed, as quinn's own socket layer does: UDP is unreliable and
    /// QUIC recovers.
    pub fn try_send(&self, t: &Transmit<'_>) -> io::Result<()> {
        let i = self.pick(t);
        let sock = &self.socks[i];
        let res = match &sock.fd {
            Fd::Async(a) => a.try_io(Interest::WRITABLE, |fd| self.state.try_send(UdpSockRef::from(fd), t)),
            Fd::Blocking(fd) => self.state.try_send(UdpSockRef::from(fd), t),
        };
        match res {
            Ok(()) => {
                self.stats.transmits.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(t.contents.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.stats.would_block.fetch_add(1, Ordering::Relaxed);
                self.last_would_block.store(i, Ordering::Relaxed);
                Err(e)
            }
            // Expected for PMTU probes larger than the path (RFC 8899).
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Ok(()),
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                self.log_error(&e, t);
                Ok(())
            }
        }
    }

    fn log_error(&self, e: &io::Error, t: &Transmit<'_>) {
        let Ok(mut last) = self.last_error_log.lock() else {
            return;
        };
        let now = Instant::now();
        if last.is_none_or(|l| now.duration_since(l) > Duration::from_secs(10)) {
            *last = Some(now);
            tracing::warn!(error = %e, dst = %t.destination, src = ?t.src_ip, len = t.contents.len(), "UDP send failed");
        }
    }

    /// Resolves when the socket that last reported `WouldBlock` may be writable.
    pub async fn writable(&self) -> io::Result<()> {
        let i = self.last_would_block.load(Ordering::Relaxed).min(self.socks.len() - 1);
        match &self.socks[i].fd {
            Fd::Async(a) => {
                let guard = a.writable().await?;
                // Keep the readiness: try_io clears it when a send hits WouldBlock.
                drop(guard);
                Ok(())
            }
            Fd::Blocking(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn shared(addrs: &[&str]) -> (Vec<UdpSocket>, SharedUdp) {
        let mut keep = Vec::new();
        let mut fds = Vec::new();
        for a in addrs {
            let s = UdpSocket::bind(a).unwrap();
            let addr = s.local_addr().unwrap();
            let fd: OwnedFd = s.try_clone().unwrap().into();
            keep.push(s);
            fds.push(SharedSocketFd { addr, fd });
        }
        (keep, SharedUdp::new(fds).unwrap())
    }

    #[tokio::test]
    async fn sends_from_the_shared_socket_without_touching_its_flags() {
        let (socks, udp) = shared(&["127.0.0.1:0"]);
        assert!(!socket2::SockRef::from(&socks[0]).nonblocking().unwrap(), "flags of the shared description unchanged");
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let t = Transmit {
            destination: peer.local_addr().unwrap(),
            ecn: None,
            contents: b"reply",
            segment_size: None,
            src_ip: Some("127.0.0.1".parse().unwrap()),
        };
        udp.try_send(&t).unwrap();
        let mut b = [0u8; 16];
        let (n, from) = peer.recv_from(&mut b).unwrap();
        assert_eq!(&b[..n], b"reply");
        assert_eq!(from, socks[0].local_addr().unwrap(), "reply leaves from the shared socket");
        assert!(udp.max_transmit_segments() >= 1);
    }

    #[tokio::test]
    async fn gso_train_arrives_as_separate_datagrams() {
        let (_socks, udp) = shared(&["127.0.0.1:0"]);
        if udp.max_transmit_segments() < 2 {
            return; // kernel without UDP GSO
        }
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let contents: Vec<u8> = (0..250u8).collect();
        let t = Transmit {
            destination: peer.local_addr().unwrap(),
            ecn: None,
            contents: &contents,
            segment_size: Some(100),
            src_ip: None,
        };
        udp.try_send(&t).unwrap();
        let mut b = [0u8; 300];
        let sizes: Vec<usize> = (0..3).map(|_| peer.recv_from(&mut b).unwrap().0).collect();
        assert_eq!(sizes, vec![100, 100, 50]);
    }

    #[tokio::test]
    async fn picks_socket_by_family_source_and_learned_port() {
        let (socks, udp) = shared(&["127.0.0.1:0", "127.0.0.1:0", "[::1]:0"]);
        let a1 = socks[1].local_addr().unwrap();
        let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let t = |d: SocketAddr, src: Option<IpAddr>| Transmit {
            destination: d,
            ecn: None,
            contents: b"",
            segment_size: None,
            src_ip: src,
        };
        assert_eq!(udp.pick(&t(dst, None)), 0);
        assert_eq!(udp.pick(&t("[::1]:9".parse().unwrap(), None)), 2);
        udp.learn(dst, Some(a1));
        assert_eq!(udp.pick(&t(dst, Some("127.0.0.1".parse().unwrap()))), 1, "same port the client used");
    }
}
