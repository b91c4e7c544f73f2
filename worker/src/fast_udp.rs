//! The kernel fast path's sockets (`FastSockets`, docs/adr/0004-kernel-fast-path.md):
//! one UDP socket per listen address, bound to it in the listen address's SO_REUSEPORT
//! group, to which the data plane's SK_REUSEPORT program steers this worker's
//! established (short-header) datagrams.
//!
//! Unlike the shared sockets ([`crate::udp_send`]) these belong to this worker alone
//! (the data plane closed its copy after handing them over), so
//! `quinn_udp::UdpSocketState::new` configures them directly: O_NONBLOCK, UDP_GRO,
//! IP_PKTINFO / IPV6_RECVPKTINFO (`RecvMeta::dst_ip`), IP_RECVTOS (ECN) and PMTU
//! probing (no fragmentation, RFC 9000 §14). Receives go straight into quinn's
//! buffers (`UdpSocketState::recv`, recvmmsg), sends use `UdpSocketState::try_send`
//! (GSO, `src_ip` → IP_PKTINFO, ECN).
//!
//! A [`FastUdp`] is one handshake's set: a reconnection replaces the whole set and
//! dropping it closes the sockets (the kernel then removes them from the program's
//! socket array and their datagrams fall back to the data plane).

use crate::datasock::{DataStats, SharedSocketFd};
use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

struct FastSock {
    addr: SocketAddr,
    io: AsyncFd<OwnedFd>,
    state: UdpSocketState,
}

/// One handshake's fast-path sockets (possibly none).
pub struct FastUdp {
    socks: Vec<FastSock>,
    /// Where the next receive starts (round robin over the sockets).
    next: AtomicUsize,
    last_error_log: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for FastUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastUdp").field("addrs", &self.addrs().collect::<Vec<_>>()).finish()
    }
}

impl FastUdp {
    /// No fast path.
    pub fn empty() -> FastUdp {
        FastUdp { socks: Vec::new(), next: AtomicUsize::new(0), last_error_log: Mutex::new(None) }
    }

    /// Takes ownership of the sockets from `FastSockets` and configures them for
    /// quinn-udp. Must run inside a tokio runtime.
    pub fn new(sockets: Vec<SharedSocketFd>) -> io::Result<FastUdp> {
        let mut socks = Vec::with_capacity(sockets.len());
        for s in sockets {
            let state = UdpSocketState::new(UdpSockRef::from(&s.fd))?;
            let io = crate::async_fd::register(s.fd, Interest::READABLE | Interest::WRITABLE)?;
            socks.push(FastSock { addr: s.addr, io, state });
        }
        Ok(FastUdp { socks, ..FastUdp::empty() })
    }

    pub fn is_empty(&self) -> bool {
        self.socks.is_empty()
    }

    pub fn len(&self) -> usize {
        self.socks.len()
    }

    /// The listen addresses, in `FastSockets` order.
    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.socks.iter().map(|s| s.addr)
    }

    /// The fast socket of listen address `listen`: the one bound to it, else one on
    /// its port and family bound to the wildcard address.
    pub fn index_for(&self, listen: SocketAddr) -> Option<usize> {
        self.socks.iter().position(|s| s.addr == listen).or_else(|| {
            self.socks.iter().position(|s| {
                s.addr.port() == listen.port() && s.addr.is_ipv4() == listen.is_ipv4() && s.addr.ip().is_unspecified()
            })
        })
    }

    /// Most segments one GSO send may carry on every fast socket.
    pub fn max_gso_segments(&self) -> Option<usize> {
        self.socks.iter().map(|s| s.state.max_gso_segments()).min()
    }

    /// Receives from the first fast socket with datagrams waiting, straight into
    /// quinn's buffers; returns how many and the listen address of the socket. `Pending`
    /// with `cx` registered on every socket when none has any. Errors are counted (`stats.fast_errors`) and never returned: quinn's
    /// endpoint driver stops on a receive error.
    pub fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
        stats: &DataStats,
    ) -> Poll<(usize, SocketAddr)> {
        let n = self.socks.len();
        if n == 0 || bufs.is_empty() || meta.is_empty() {
            return Poll::Pending;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            let s = &self.socks[(start + k) % n];
            loop {
                let mut guard = match s.io.poll_read_ready(cx) {
                    Poll::Pending => break,
                    Poll::Ready(Ok(g)) => g,
                    Poll::Ready(Err(e)) => {
                        // Only when the reactor is gone.
                        self.count_error(stats, &e, s.addr, "poll");
                        break;
                    }
                };
                match guard.try_io(|fd| s.state.recv(UdpSockRef::from(fd.get_ref()), bufs, meta)) {
                    // WouldBlock: readiness cleared, the next poll registers `cx`.
                    Err(_would_block) => continue,
                    Ok(Ok(0)) => {
                        guard.clear_ready();
                        continue;
                    }
                    Ok(Ok(got)) => {
                        let got = got.min(meta.len());
                        for m in &meta[..got] {
                            // A GRO train of `len` bytes is cut every `stride` bytes.
                            let segs = m.len.div_ceil(m.stride.max(1)).max(1);
                            stats.fast_datagrams.fetch_add(segs as u64, Ordering::Relaxed);
                            stats.fast_bytes.fetch_add(m.len as u64, Ordering::Relaxed);
                        }
                        return Poll::Ready((got, s.addr));
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Ok(Err(e)) => {
                        // E.g. a pending ICMP error (SO_ERROR): reported once. Clear the
                        // readiness so a persistent error cannot spin; the next poll
                        // registers `cx` again.
                        self.count_error(stats, &e, s.addr, "receive");
                        guard.clear_ready();
                        continue;
                    }
                }
            }
        }
        Poll::Pending
    }

    /// Sends `t` from fast socket `i`. `WouldBlock` when its buffer is full (await
    /// [`FastUdp::writable`]); other errors are counted and swallowed, as quinn's own
    /// socket layer does (EMSGSIZE is expected for PMTU probes, RFC 8899).
    pub fn try_send(&self, i: usize, t: &Transmit<'_>, stats: &DataStats) -> io::Result<()> {
        let Some(s) = self.socks.get(i) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such fast socket"));
        };
        match s.io.try_io(Interest::WRITABLE, |fd| s.state.try_send(UdpSockRef::from(fd), t)) {
            Ok(()) => {
                stats.fast_transmits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(e),
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Ok(()),
            Err(e) => {
                self.count_error(stats, &e, s.addr, "send");
                Ok(())
            }
        }
    }

    /// Resolves when fast socket `i` may be writable (at once if there is none).
    pub async fn writable(&self, i: usize) -> io::Result<()> {
        match self.socks.get(i) {
            Some(s) => {
                // Keep the readiness: try_io clears it when a send hits WouldBlock.
                drop(s.io.writable().await?);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn count_error(&self, stats: &DataStats, e: &io::Error, addr: SocketAddr, what: &str) {
        stats.fast_errors.fetch_add(1, Ordering::Relaxed);
        let Ok(mut last) = self.last_error_log.lock() else {
            return;
        };
        let now = Instant::now();
        if last.is_none_or(|l| now.duration_since(l) > Duration::from_secs(10)) {
            *last = Some(now);
            tracing::warn!(error = %e, %addr, "fast-path socket {what} failed");
        }
    }
}
