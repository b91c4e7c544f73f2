//! [`DemuxSocket`]: a quinn 0.11 [`AsyncUdpSocket`] whose receive side is the data
//! connection and whose send side is the shared UDP socket.
//!
//! Receive: each `poll_recv` takes up to as many records as quinn offers buffers
//! (one `recvmmsg`), one record per buffer. A data frame (first byte 0xd7) is decoded
//! with `proto::wire::frame::decode` in place, its payload moved to the front of the
//! buffer, and its metadata put into quinn's `RecvMeta`: `addr` = client, `dst_ip` =
//! the address the client sent to, `ecn`, `len`, `stride` = GRO segment size (else
//! `len`; never 0). Control records (0xc7) are handled here and never reach quinn;
//! malformed or truncated records are counted and dropped.
//!
//! Forwarding rings (`Rings`, the default): read before the data connection, one
//! datagram per buffer, each payload copied once from the ring into quinn's buffer
//! ([`crate::ring::RingSet::poll_frames`]); a restarted data plane's rings replace the
//! old ones ([`DemuxSocket::replace_rings`]).
//!
//! Kernel fast path: the worker's own sockets from `FastSockets`
//! ([`crate::fast_udp::FastUdp`]) are read too, with quinn-udp straight into quinn's
//! buffers (GRO, ECN, IP_PKTINFO `dst_ip`). Each `poll_recv` alternates which source
//! it tries first (fast sockets, or rings + data connection), so a busy one cannot
//! starve the other, and returns `Pending` only with the waker registered on all.
//!
//! Send: from the fast socket of the listen address the reply leaves from, when there
//! is one, else [`crate::udp_send::SharedUdp`].

use crate::datasock::{DataConn, NewSockets, SharedSocketFd};
use crate::fast_udp::FastUdp;
use crate::ring::{Consumer, RingSet};
use crate::udp_send::SharedUdp;
use proto::wire::frame::{self, FrameMeta};
use proto::wire::CONTROL_MAGIC;
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{ready, Context, Poll};
use sys::mmsg::RecvMmsg;

/// Datagrams one `RecvMeta` may describe: quinn sizes each receive buffer as
/// `max_udp_payload_size × max_receive_segments`, and a GRO train from the data
/// plane may be up to 65 535 bytes (`proto::wire::frame::MAX_PAYLOAD`); 64 × 1200 covers it
/// for any allowed `max_udp_payload_size`.
pub const RECEIVE_SEGMENTS: usize = 64;

/// quinn `AsyncUdpSocket` over the demux data connection.
pub struct DemuxSocket {
    data: Arc<DataConn>,
    udp: Swap<SharedUdp>,
    /// The kernel fast path's sockets; replaced (old ones closed) on reconnection.
    fast: Swap<FastUdp>,
    /// Wakes a writability wait on fast sockets that were just replaced.
    fast_replaced: tokio::sync::Notify,
    /// Which socket last reported `WouldBlock`: a fast socket's index, or
    /// [`BLOCKED_SHARED`].
    blocked: AtomicUsize,
    /// Alternates the first receive source (fairness).
    turn: AtomicUsize,
    local: SocketAddr,
    /// Forwarding rings: one per data-plane shard, read before the connection;
    /// replaced when a restarted data plane offers new ones.
    rings: Swap<RingSet>,
    /// The data connection's recvmmsg headers (one receiver at a time: quinn's driver).
    records: Mutex<RecvMmsg>,
}

/// Most records one read of the data connection takes.
const MAX_BATCH: usize = 64;

const BLOCKED_SHARED: usize = usize::MAX;

impl fmt::Debug for DemuxSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemuxSocket").field("server_id", &self.data.server_id()).field("local", &self.local).finish()
    }
}

/// A value the receive and send paths read while a reconnect may replace it: readers
/// take an `Arc` and keep using what they took; a poisoned lock still yields the value.
struct Swap<T>(RwLock<Arc<T>>);

impl<T> Swap<T> {
    fn new(v: T) -> Swap<T> {
        Swap(RwLock::new(Arc::new(v)))
    }

    fn get(&self) -> Arc<T> {
        match self.0.read() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    /// Installs what `made` holds, or `fallback()` when it is an error (returned);
    /// the old value (freed when its last reader is done).
    fn set_or(&self, made: io::Result<T>, fallback: impl FnOnce() -> T) -> (Arc<T>, io::Result<()>) {
        match made {
            Ok(v) => (self.set(v), Ok(())),
            Err(e) => (self.set(fallback()), Err(e)),
        }
    }

    /// Installs `v`; returns the old value (freed when its last reader is done).
    fn set(&self, v: T) -> Arc<T> {
        let mut g = match self.0.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        std::mem::replace(&mut *g, Arc::new(v))
    }
}

impl DemuxSocket {
    /// Builds the socket from a handshaken data connection and the shared UDP sockets.
    /// Must run inside a tokio runtime.
    pub fn new(data: Arc<DataConn>, sockets: Vec<SharedSocketFd>) -> io::Result<Arc<DemuxSocket>> {
        DemuxSocket::with_fast(data, sockets, Vec::new(), Vec::new())
    }

    /// [`DemuxSocket::new`] that also reads the data plane's forwarding rings
    /// (`Handshake::rings`). Must run inside a tokio runtime.
    pub fn with_rings(
        data: Arc<DataConn>,
        sockets: Vec<SharedSocketFd>,
        rings: Vec<Consumer>,
    ) -> io::Result<Arc<DemuxSocket>> {
        DemuxSocket::with_fast(data, sockets, Vec::new(), rings)
    }

    /// [`DemuxSocket::with_rings`] that also receives on (and answers from) the kernel
    /// fast path's sockets (`Handshake::fast`). Must run inside a tokio runtime.
    pub fn with_fast(
        data: Arc<DataConn>,
        sockets: Vec<SharedSocketFd>,
        fast: Vec<SharedSocketFd>,
        rings: Vec<Consumer>,
    ) -> io::Result<Arc<DemuxSocket>> {
        let udp = SharedUdp::new(sockets)?;
        let fast = FastUdp::new(fast)?;
        let local = udp.addrs().next().ok_or_else(|| io::Error::other("no shared UDP socket"))?;
        let rings = RingSet::new(rings)?;
        Ok(Arc::new(DemuxSocket {
            data,
            udp: Swap::new(udp),
            fast: Swap::new(fast),
            fast_replaced: tokio::sync::Notify::new(),
            blocked: AtomicUsize::new(BLOCKED_SHARED),
            turn: AtomicUsize::new(0),
            records: Mutex::new(RecvMmsg::new(MAX_BATCH, 0)),
            local,
            rings: Swap::new(rings),
        }))
    }

    /// The current forwarding rings (empty: frames come on the data connection).
    pub fn rings(&self) -> Arc<RingSet> {
        self.rings.get()
    }

    /// Replaces the forwarding rings (a restarted data plane's `Rings`; empty: SEQPACKET
    /// from now on). The old rings are unmapped once the last receive using them returns.
    pub fn replace_rings(&self, rings: Vec<Consumer>) -> io::Result<()> {
        let (old, res) = self.rings.set_or(RingSet::new(rings), RingSet::default);
        drop(old);
        res
    }

    /// The data connection (lifecycle messages, counters).
    pub fn data(&self) -> &Arc<DataConn> {
        &self.data
    }

    /// The send side (counters).
    pub fn udp(&self) -> Arc<SharedUdp> {
        self.udp.get()
    }

    /// The kernel fast path's current sockets (empty when not active).
    pub fn fast(&self) -> Arc<FastUdp> {
        self.fast.get()
    }

    /// Replaces the fast-path sockets with `fast` (a new data plane's `FastSockets`;
    /// empty: no fast path any more). The old sockets are closed once the last receive
    /// or send that uses them returns. If the new ones cannot be set up, the old ones
    /// are dropped anyway (their datagrams then come over the data connection) and the
    /// error returned.
    pub fn replace_fast_sockets(&self, fast: Vec<SharedSocketFd>) -> io::Result<()> {
        let (old, res) = self.fast.set_or(FastUdp::new(fast), FastUdp::empty);
        self.blocked.store(BLOCKED_SHARED, Ordering::Relaxed);
        self.fast_replaced.notify_waiters();
        drop(old);
        res
    }

    /// Replaces the shared UDP sockets (after a data-plane restart handed new fds).
    pub fn replace_sockets(&self, sockets: Vec<SharedSocketFd>) -> io::Result<()> {
        drop(self.udp.set(SharedUdp::new(sockets)?));
        Ok(())
    }

    /// Starts reconnecting the data connection whenever it is lost (see
    /// [`DataConn::spawn_reconnector`]); new sockets replace the old ones, shared and
    /// fast path alike (no fast sockets from the new data plane: the old ones close).
    pub fn spawn_reconnector(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let weak = Arc::downgrade(self);
        self.data.spawn_reconnector(move |socks: NewSockets| {
            if let Some(me) = weak.upgrade() {
                if let Err(e) = me.replace_sockets(socks.shared) {
                    tracing::warn!(error = %e, "keeping the previous UDP sockets");
                }
                let rings = socks.rings.len();
                match me.replace_rings(socks.rings) {
                    Ok(()) => tracing::info!(rings, "forwarding rings replaced"),
                    Err(e) => tracing::warn!(error = %e, "new forwarding rings unusable: SEQPACKET frames"),
                }
                let n = socks.fast.len();
                match me.replace_fast_sockets(socks.fast) {
                    Ok(()) => tracing::info!(fast_sockets = n, "fast-path sockets replaced"),
                    Err(e) => {
                        tracing::warn!(error = %e, "new fast-path sockets unusable: no fast path")
                    }
                }
            }
        })
    }

    /// Resolves when the socket that last reported `WouldBlock` may be writable.
    async fn writable(&self) -> io::Result<()> {
        let i = self.blocked.load(Ordering::Relaxed);
        if i == BLOCKED_SHARED {
            return self.udp().writable().await;
        }
        let fast = self.fast();
        tokio::select! {
            r = fast.writable(i) => r,
            // Replaced: don't keep the old sockets open; quinn retries the send.
            _ = self.fast_replaced.notified() => Ok(()),
        }
    }

    /// Describes one received frame to quinn: `addr` = client, `dst_ip` = the address
    /// the client sent to, `ecn`, `len`, `stride` = GRO segment size (else `len`).
    fn deliver(&self, udp: &SharedUdp, m: &mut RecvMeta, fm: &FrameMeta, payload_len: usize) {
        udp.learn(fm.client, fm.local);
        m.addr = fm.client;
        m.len = payload_len;
        // RFC 9000 §14.1 datagrams are at least 1 byte; a GRO train is cut every
        // `segment_size` bytes (frame::decode guarantees 0 < segment ≤ payload).
        m.stride = fm.segment_size.map_or(payload_len, usize::from).max(1);
        m.ecn = EcnCodepoint::from_bits(fm.ecn);
        m.dst_ip = fm.local.map(|l| l.ip());
        let stats = &self.data.stats;
        stats.frames.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(payload_len as u64, Ordering::Relaxed);
    }

    /// Turns the records `lens[..got]` in `bufs` into quinn datagrams, compacted to
    /// the front of `bufs`/`meta`. Returns (datagrams, saw_eof).
    fn process(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
        lens: &[usize],
        trunc: &[bool],
    ) -> (usize, bool) {
        let stats = &self.data.stats;
        let udp = self.udp();
        let mut out = 0;
        let mut eof = false;
        for i in 0..lens.len() {
            let len = lens[i];
            if len == 0 {
                // A SEQPACKET read of 0 bytes: the data plane closed the connection.
                eof = true;
                break;
            }
            if trunc[i] {
                stats.truncated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let rec = &bufs[i][..len];
            match rec[0] {
                frame::MAGIC => {}
                CONTROL_MAGIC => {
                    self.data.on_control(rec);
                    continue;
                }
                _ => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let (fm, payload_len) = match frame::decode(rec) {
                Ok((fm, p)) => (fm, p.len()),
                Err(e) => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::trace!(error = %e, "malformed data frame dropped");
                    continue;
                }
            };
            // Payload to the front of buffer `out` (≤ i).
            if bufs[out].len() < payload_len {
                // Only with unevenly sized buffers (quinn's are all equal).
                stats.truncated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if out == i {
                bufs[i].copy_within(frame::HEADER_LEN..len, 0);
            } else {
                let (head, tail) = bufs.split_at_mut(i);
                head[out][..payload_len].copy_from_slice(&tail[0][frame::HEADER_LEN..len]);
            }
            self.deliver(&udp, &mut meta[out], &fm, payload_len);
            out += 1;
        }
        (out, eof)
    }
}

impl AsyncUdpSocket for DemuxSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Poller { sock: self, fut: None })
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let udp = self.udp();
        let fast = self.fast();
        if !fast.is_empty() {
            if let Some(i) = fast.index_for(udp.source_for(transmit)) {
                let r = fast.try_send(i, transmit, &self.data.stats);
                if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                    self.blocked.store(i, Ordering::Relaxed);
                }
                return r;
            }
        }
        let r = udp.try_send(transmit);
        if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
            self.blocked.store(BLOCKED_SHARED, Ordering::Relaxed);
        }
        r
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let n = bufs.len().min(meta.len()).min(MAX_BATCH);
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        let (bufs, meta) = (&mut bufs[..n], &mut meta[..n]);
        let fast = self.fast();
        if fast.is_empty() {
            return self.poll_demux(cx, bufs, meta);
        }
        // Both sources are tried (each registers `cx` when empty); which goes first
        // alternates, so neither starves the other.
        let fast_first = self.turn.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
        if !fast_first {
            if let Poll::Ready(r) = self.poll_demux(cx, bufs, meta) {
                return Poll::Ready(r);
            }
        }
        if let Poll::Ready((got, listen)) = fast.poll_recv(cx, bufs, meta, &self.data.stats) {
            // Replies leave from the port the client used (with several listen ports
            // of one family); frames teach this via their local address, the fast
            // path via the socket the datagrams arrived on.
            let udp = self.udp();
            for m in &meta[..got] {
                udp.learn(m.addr, Some(listen));
            }
            return Poll::Ready(Ok(got));
        }
        if fast_first {
            self.poll_demux(cx, bufs, meta)
        } else {
            Poll::Pending
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn max_transmit_segments(&self) -> usize {
        let shared = self.udp().max_transmit_segments();
        self.fast().max_gso_segments().map_or(shared, |f| f.min(shared)).max(1)
    }

    fn max_receive_segments(&self) -> usize {
        RECEIVE_SEGMENTS
    }

    /// RFC 9000 §14: QUIC datagrams must not be fragmented; with `false` quinn runs
    /// path-MTU discovery (RFC 8899 DPLPMTUD) instead of assuming a safe minimum.
    fn may_fragment(&self) -> bool {
        false
    }
}

impl DemuxSocket {
    /// Receives from the rings and the data connection (`Pending` with `cx`
    /// registered on them when nothing is waiting) into `bufs`, as many as `meta`
    /// (1 to MAX_BATCH: `poll_recv` cuts them).
    fn poll_demux(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        debug_assert!(bufs.len() == meta.len() && (1..=MAX_BATCH).contains(&meta.len()));
        let n = meta.len();
        let mut lens = [0usize; MAX_BATCH];
        let mut trunc = [false; MAX_BATCH];
        let rings = self.rings();
        loop {
            if !rings.is_empty() {
                // One copy per datagram: ring → quinn's buffer (Consumer::pop_frame).
                let udp = self.udp();
                let got = rings.poll_frames(cx, &mut bufs[..n], &self.data.stats, |i, fm, len| {
                    self.deliver(&udp, &mut meta[i], fm, len)
                });
                if got > 0 {
                    return Poll::Ready(Ok(got));
                }
            }
            let Some(fd) = self.data.current().or_else(|| self.data.park(cx.waker())) else {
                // Disconnected: the reconnector wakes us with a new connection.
                return Poll::Pending;
            };
            let mut guard = match ready!(fd.poll_read_ready(cx)) {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "data connection poll failed");
                    self.data.mark_lost(&fd);
                    continue;
                }
            };
            let got = match guard.try_io(|inner| {
                let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
                let got = records.recv_into(inner.get_ref(), &mut bufs[..n], libc::MSG_DONTWAIT)?;
                for (i, r) in records.iter().enumerate() {
                    (lens[i], trunc[i]) = (r.len, r.truncated());
                }
                Ok(got)
            }) {
                Err(_would_block) => continue,
                Ok(Ok(got)) => got,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "data connection receive failed");
                    self.data.mark_lost(&fd);
                    continue;
                }
            };
            drop(guard);
            let (out, eof) = self.process(&mut bufs[..got], &mut meta[..got], &lens[..got], &trunc[..got]);
            if eof {
                self.data.mark_lost(&fd);
            }
            if out > 0 {
                return Poll::Ready(Ok(out));
            }
        }
    }
}

type WritableFut = Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>;

/// Per-task writability waiter (quinn creates one per connection).
struct Poller {
    sock: Arc<DemuxSocket>,
    fut: Option<WritableFut>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl UdpPoller for Poller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.fut.is_none() {
            let sock = Arc::clone(&this.sock);
            this.fut = Some(Box::pin(async move { sock.writable().await }));
        }
        let Some(fut) = this.fut.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let r = fut.as_mut().poll(cx);
        if r.is_ready() {
            this.fut = None;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasock::{handshake_on, HandshakeError};
    use proto::wire::frame::{self, FrameMeta};
    use proto::wire::{Data, Message};
    use proto::ServerId;
    use std::os::fd::{AsFd, OwnedFd};
    use std::time::Duration;

    /// What `sock` gives quinn within `t`: the number of datagrams (`None`: nothing).
    async fn recv_within(
        sock: &DemuxSocket,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
        t: Duration,
    ) -> Option<usize> {
        let got = tokio::time::timeout(t, std::future::poll_fn(|cx| sock.poll_recv(cx, bufs, meta))).await.ok()?;
        Some(got.expect("poll_recv never fails"))
    }

    /// The data plane's end of a handshake: reads DataHello, answers `Welcome` (unless
    /// `reply` is an `Error`), `reply` with `fds` and, after `Sockets`, an empty `Rings`.
    fn fake_plane(plane: OwnedFd, reply: Data, fds: Vec<OwnedFd>) -> std::thread::JoinHandle<(OwnedFd, Data)> {
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let r = sys::seqpacket::recv_record(plane.as_fd(), &mut buf, 0).unwrap();
            let hello = Data::decode(&buf[..r.len]).unwrap();
            let send = |m: &Data, fds: &[std::os::fd::BorrowedFd<'_>]| {
                sys::seqpacket::send_record(plane.as_fd(), &Message::to_record(m), fds, 0).unwrap();
            };
            if !matches!(reply, Data::Error { .. }) {
                send(&Data::Welcome { version: proto::wire::PROTOCOL_VERSION, caps: 0 }, &[]);
            }
            let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            send(&reply, &borrowed);
            if matches!(reply, Data::Sockets { .. }) {
                send(&Data::Rings { count: 0, bytes: 0 }, &[]);
            }
            (plane, hello)
        })
    }

    fn plain_hello(id: u16) -> Data {
        let announce = proto::wire::Announce::plain(sys::protocol::window());
        Data::DataHello { announce, server_id: ServerId(id) }
    }

    fn udp_pair() -> (std::net::UdpSocket, SocketAddr, OwnedFd) {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = s.local_addr().unwrap();
        let fd: OwnedFd = s.try_clone().unwrap().into();
        (s, a, fd)
    }

    #[test]
    fn handshake_success_refusal_and_mismatch() {
        let (w, p) = sys::seqpacket::pair().unwrap();
        let (_s, addr, fd) = udp_pair();
        let t = fake_plane(p, Data::Sockets { addrs: vec![addr] }, vec![fd]);
        let h = handshake_on(w, ServerId(42), Duration::from_secs(5)).unwrap();
        let (_p, hello) = t.join().unwrap();
        assert_eq!(hello, plain_hello(42));
        assert_eq!((h.version, h.caps), (proto::wire::PROTOCOL_VERSION, 0));
        assert_eq!(h.sockets.len(), 1);
        assert_eq!(h.sockets[0].addr, addr);

        let (w, p) = sys::seqpacket::pair().unwrap();
        let t = fake_plane(p, Data::Error { reason: "server id 42 is taken".into() }, vec![]);
        match handshake_on(w, ServerId(42), Duration::from_secs(5)) {
            Err(HandshakeError::Refused(r)) => assert!(r.contains("taken")),
            other => panic!("expected a refusal, got {other:?}"),
        }
        drop(t.join());

        let (w, p) = sys::seqpacket::pair().unwrap();
        let (_s, addr, _fd) = udp_pair();
        let t = fake_plane(p, Data::Sockets { addrs: vec![addr] }, vec![]);
        assert!(matches!(handshake_on(w, ServerId(1), Duration::from_secs(5)), Err(HandshakeError::Protocol(_))));
        drop(t.join());

        let (w, p) = sys::seqpacket::pair().unwrap();
        drop(p);
        assert!(handshake_on(w, ServerId(1), Duration::from_secs(5)).is_err());
    }

    #[tokio::test]
    async fn receive_side_fills_recv_meta_and_drops_the_rest() {
        let (w, plane) = sys::seqpacket::pair().unwrap();
        let (_s, _addr, fd) = udp_pair();
        let data = DataConn::new(w, ServerId(3), None).unwrap();
        let sock = DemuxSocket::new(Arc::clone(&data), vec![SharedSocketFd { addr: _addr, fd }]).unwrap();
        let client: SocketAddr = "192.0.2.7:4433".parse().unwrap();
        let local: SocketAddr = "198.51.100.1:443".parse().unwrap();
        let send = |rec: &[u8]| {
            sys::seqpacket::send_record(plane.as_fd(), rec, &[], 0).unwrap();
        };
        // 1: control record (never reaches quinn)
        send(&Message::to_record(&Data::Error { reason: "note".into() }));
        // 2: one datagram with local address and ECN CE
        send(&frame::encode(&FrameMeta { client, local: Some(local), ecn: 3, segment_size: None }, &[0x40; 100]));
        // 3: malformed: frame magic but truncated header
        send(&[0xd7, 1, 0]);
        // 4: garbage first byte
        send(&[0x00; 60]);
        // 5: a GRO train of 3 × 1200 + 500
        let train: Vec<u8> = (0..4100u32).map(|i| i as u8).collect();
        send(&frame::encode(&FrameMeta { client, local: None, ecn: 0, segment_size: Some(1200) }, &train));

        let mut store = vec![0u8; 8 * 70_000];
        let mut bufs: Vec<IoSliceMut<'_>> = store.chunks_mut(70_000).map(IoSliceMut::new).collect();
        let mut meta = [RecvMeta::default(); 8];
        let n = recv_within(&sock, &mut bufs, &mut meta, Duration::from_secs(2)).await.expect("datagrams");
        assert_eq!(n, 2, "two datagrams, compacted to the front");
        assert_eq!((meta[0].addr, meta[0].len, meta[0].stride), (client, 100, 100));
        assert_eq!(meta[0].dst_ip, Some(local.ip()));
        assert_eq!(meta[0].ecn, Some(EcnCodepoint::Ce));
        assert_eq!(&bufs[0][..100], &[0x40; 100][..]);
        assert_eq!((meta[1].len, meta[1].stride, meta[1].dst_ip, meta[1].ecn), (4100, 1200, None, None));
        assert_eq!(&bufs[1][..4100], &train[..]);
        assert_eq!(data.stats.control.load(Ordering::Relaxed), 1);
        assert_eq!(data.stats.malformed.load(Ordering::Relaxed), 2);
        assert_eq!(data.stats.frames.load(Ordering::Relaxed), 2);

        // 6: a frame longer than quinn's buffer, cut by the kernel (MSG_TRUNC): counted,
        // never delivered.
        send(&frame::encode(&FrameMeta { client, local: None, ecn: 0, segment_size: None }, &[7; 200]));
        let mut small = [0u8; 100];
        let mut small_bufs = [IoSliceMut::new(&mut small)];
        let r = recv_within(&sock, &mut small_bufs, &mut meta[..1], Duration::from_millis(200)).await;
        assert!(r.is_none(), "nothing for quinn");
        assert_eq!(data.stats.truncated.load(Ordering::Relaxed), 1);
        assert_eq!(data.stats.frames.load(Ordering::Relaxed), 2);

        // The data plane goes away: no error reaches quinn, the socket just waits.
        drop(plane);
        let r = recv_within(&sock, &mut bufs, &mut meta, Duration::from_millis(200)).await;
        assert!(r.is_none(), "pending while disconnected");
        assert!(!data.is_connected());
        assert_eq!(data.stats.disconnects.load(Ordering::Relaxed), 1);
        assert!(!sock.may_fragment());
        assert_eq!(sock.max_receive_segments(), RECEIVE_SEGMENTS);
        const { assert!(RECEIVE_SEGMENTS * 1200 >= frame::MAX_PAYLOAD) };
    }

    /// Fast socket and data connection both have datagrams: with one buffer per call
    /// neither starves the other; fast-socket datagrams carry `dst_ip` (IP_PKTINFO,
    /// set up by quinn-udp on the worker's own socket) and are counted.
    #[tokio::test]
    async fn fast_socket_and_data_connection_share_the_receive_side() {
        let (w, plane) = sys::seqpacket::pair().unwrap();
        let (_s, addr, fd) = udp_pair();
        let fast = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fast_addr = fast.local_addr().unwrap();
        let data = DataConn::new(w, ServerId(4), None).unwrap();
        let sock = DemuxSocket::with_fast(
            Arc::clone(&data),
            vec![SharedSocketFd { addr, fd }],
            vec![SharedSocketFd { addr: fast_addr, fd: fast.into() }],
            Vec::new(),
        )
        .unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            client.send_to(&[0x41; 50], fast_addr).unwrap();
        }
        let fm = FrameMeta { client: client.local_addr().unwrap(), local: None, ecn: 0, segment_size: None };
        sys::seqpacket::send_record(plane.as_fd(), &frame::encode(&fm, &[0x42; 60]), &[], 0).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut store = vec![0u8; 70_000];
        let mut got = Vec::new();
        for _ in 0..4 {
            let mut bufs = [IoSliceMut::new(&mut store)];
            let mut meta = [RecvMeta::default(); 1];
            let n = recv_within(&sock, &mut bufs, &mut meta, Duration::from_secs(2)).await.expect("a datagram");
            assert_eq!(n, 1);
            got.push((bufs[0][0], meta[0].len, meta[0].dst_ip));
        }
        let local = Some("127.0.0.1".parse().unwrap());
        assert!(got[..2].contains(&(0x42, 60, None)), "the data connection is not starved: {got:?}");
        assert_eq!(got.iter().filter(|g| **g == (0x41, 50, local)).count(), 3, "{got:?}");
        assert_eq!(data.stats.fast_datagrams.load(Ordering::Relaxed), 3);
        assert_eq!(data.stats.fast_bytes.load(Ordering::Relaxed), 150);
        assert_eq!(data.stats.frames.load(Ordering::Relaxed), 1);
    }

    /// Two fast sockets (two listen ports): a datagram on the second is read (every
    /// socket is polled and registered), and the reply leaves from the fast socket of
    /// the listen address it belongs to.
    #[tokio::test]
    async fn every_fast_socket_is_read_and_answers_from_its_port() {
        let (w, _plane) = sys::seqpacket::pair().unwrap();
        let (f1, f2) =
            (std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let (a1, a2) = (f1.local_addr().unwrap(), f2.local_addr().unwrap());
        let shared: Vec<_> = [a1, a2]
            .iter()
            .map(|&addr| SharedSocketFd { addr, fd: std::net::UdpSocket::bind("127.0.0.1:0").unwrap().into() })
            .collect();
        let data = DataConn::new(w, ServerId(5), None).unwrap();
        let sock = DemuxSocket::with_fast(
            Arc::clone(&data),
            shared,
            vec![SharedSocketFd { addr: a1, fd: f1.into() }, SharedSocketFd { addr: a2, fd: f2.into() }],
            Vec::new(),
        )
        .unwrap();
        let mut store = vec![0u8; 70_000];
        let mut bufs = [IoSliceMut::new(&mut store)];
        let mut meta = [RecvMeta::default(); 1];
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // Sent from another thread once the receive side is parked: only a waker
        // registered on the second socket can wake it.
        let c2 = client.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            c2.send_to(b"to-second", a2).unwrap();
        });
        // (Not `timeout`: it polls the inner future once more when it fires.)
        let n = tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_secs(2)) => panic!("the second fast socket's datagram woke nobody"),
            n = std::future::poll_fn(|cx| sock.poll_recv(cx, &mut bufs, &mut meta)) => n,
        };
        sender.join().unwrap();
        assert_eq!((n.unwrap(), &bufs[0][..meta[0].len]), (1, &b"to-second"[..]));
        assert_eq!(meta[0].addr, client.local_addr().unwrap());
        let t = Transmit {
            destination: meta[0].addr,
            ecn: None,
            contents: b"reply",
            segment_size: None,
            src_ip: meta[0].dst_ip,
        };
        sock.try_send(&t).unwrap();
        let mut b = [0u8; 16];
        let (len, from) = client.recv_from(&mut b).unwrap();
        assert_eq!((&b[..len], from), (&b"reply"[..], a2), "reply from the second fast socket");
        assert_eq!(data.stats.fast_transmits.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn lifecycle_messages_go_out_on_the_data_connection() {
        let (w, plane) = sys::seqpacket::pair().unwrap();
        let data = DataConn::new(w, ServerId(3), None).unwrap();
        data.ready().await.unwrap();
        data.draining().await.unwrap();
        data.ready().await.unwrap(); // ignored once draining
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        while let Ok(r) = sys::seqpacket::recv_record(plane.as_fd(), &mut buf, libc::MSG_DONTWAIT) {
            got.push(Data::decode(&buf[..r.len]).unwrap());
        }
        assert_eq!(got, vec![Data::Ready, Data::Draining]);
        assert!(data.is_draining());
    }

    /// A restarted data plane: the worker reconnects, repeats the handshake, resends
    /// Ready, and frames flow again on the new connection.
    #[tokio::test]
    async fn reconnects_and_re_registers_after_the_data_plane_restarts() {
        let dir = std::env::temp_dir().join(format!("wk-reconnect-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.sock");
        let listener = sys::seqpacket::listen(&path, 64).unwrap();
        let (_s, addr, _fd) = udp_pair();
        let plane = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for round in 0..2 {
                let c = sys::seqpacket::accept(listener.as_fd()).unwrap();
                let mut buf = [0u8; 256];
                let r = sys::seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
                seen.push(Data::decode(&buf[..r.len]).unwrap());
                let welcome = Data::Welcome { version: proto::wire::PROTOCOL_VERSION, caps: 0 };
                sys::seqpacket::send_record(c.as_fd(), &Message::to_record(&welcome), &[], 0).unwrap();
                let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                sys::seqpacket::send_record(
                    c.as_fd(),
                    &Message::to_record(&Data::Sockets { addrs: vec![addr] }),
                    &[udp.as_fd()],
                    0,
                )
                .unwrap();
                let no_rings = Data::Rings { count: 0, bytes: 0 };
                sys::seqpacket::send_record(c.as_fd(), &Message::to_record(&no_rings), &[], 0).unwrap();
                let r = sys::seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
                seen.push(Data::decode(&buf[..r.len]).unwrap());
                if round == 1 {
                    let f =
                        frame::encode(&FrameMeta { client: addr, local: None, ecn: 0, segment_size: None }, b"after");
                    sys::seqpacket::send_record(c.as_fd(), &f, &[], 0).unwrap();
                    std::thread::sleep(Duration::from_millis(500));
                }
                // Round 0: dropping `c` is the data plane dying.
            }
            seen
        });
        // A hello without capabilities (no rings, no fast path).
        let legacy = crate::DataOptions { rings: false, fast_path: false };
        let sock = crate::connect_socket_with(&path, ServerId(11), legacy).await.unwrap();
        sock.data().ready().await.unwrap();
        let mut store = vec![0u8; 4 * 70_000];
        let mut bufs: Vec<IoSliceMut<'_>> = store.chunks_mut(70_000).map(IoSliceMut::new).collect();
        let mut meta = [RecvMeta::default(); 4];
        let n = recv_within(&sock, &mut bufs, &mut meta, Duration::from_secs(10))
            .await
            .expect("a frame after reconnecting");
        assert_eq!((n, &bufs[0][..meta[0].len]), (1, &b"after"[..]));
        let seen = tokio::task::spawn_blocking(move || plane.join().unwrap()).await.unwrap();
        let hello = plain_hello(11);
        assert_eq!(seen, vec![hello.clone(), Data::Ready, hello, Data::Ready]);
        assert_eq!(sock.data().stats.reconnects.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
