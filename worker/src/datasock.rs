//! The data connection to the data plane (docs/architecture.md, "Processes and the
//! data-connection protocol"; the data conversation of `proto::wire`, [`Data`]):
//!
//! 1. worker → data plane: `DataHello { announce, server_id }`: this process's
//!    protocol window and the capabilities `CAP_FAST_PATH` and/or `CAP_RINGS`
//!    ([`DataOptions`]);
//! 2. data plane → worker: `Welcome { version, caps }` (the negotiated protocol
//!    version, in which both sides encode from then on, docs/wire.md "Versions"),
//!    then `Sockets { addrs }` with one UDP socket fd per listen address
//!    (SCM_RIGHTS), `FastSockets { addrs }` (only when both announced
//!    `CAP_FAST_PATH`: one fd per address, the worker's own kernel-fast-path sockets,
//!    possibly none) and `Rings { count, bytes }` (docs/wire.md); or `Error { reason
//!    }` and close (a version outside the data plane's window, a refusal);
//! 3. worker → data plane: `Ready` when the endpoint accepts connections, `Draining`
//!    when it stops (the id stays live until the connection closes);
//! 4. closing the connection makes the id dead at once.
//!
//! [`DataConn`] owns the connection, sends the lifecycle messages and, when the data
//! plane goes away, reconnects and repeats the handshake (a restarted data plane
//! learns the table again from its workers' data connections).

use proto::wire::data::{CAPS_KNOWN, CAP_FAST_PATH, CAP_RINGS};
use proto::wire::version::common_caps;
use proto::wire::{frame, Announce, Data, Message, WireError, MAX_TEXT};
use proto::ServerId;
use socket2::SockRef;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::Waker;
use std::time::Duration;
use sys::seqpacket::{Channel, Incoming};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// One shared UDP socket as handed over in `Sockets`: its listen address and fd.
#[derive(Debug)]
pub struct SharedSocketFd {
    pub addr: SocketAddr,
    pub fd: OwnedFd,
}

/// What the handshake yields: the connected data connection (blocking mode) and the
/// shared UDP sockets.
#[derive(Debug)]
pub struct Handshake {
    pub conn: OwnedFd,
    pub sockets: Vec<SharedSocketFd>,
    /// The kernel fast path's sockets from `FastSockets` (asked with
    /// [`DataOptions::fast_path`]): one per listen address, this worker's own, to be
    /// read as well as the data connection. Empty when the fast path is not active.
    pub fast: Vec<SharedSocketFd>,
    /// The forwarding rings (asked with [`DataOptions::rings`], granted by
    /// `--forward ring` data planes, the default): one ring per shard. Empty: frames
    /// come on the data connection (SEQPACKET).
    pub rings: Vec<crate::ring::Consumer>,
    /// The protocol version the hello negotiated: the connection's from now on.
    pub version: u8,
    /// The data capabilities in effect (announced by both sides).
    pub caps: u64,
}

/// What a worker asks the data plane for in its hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataOptions {
    /// Forwarding rings (`CAP_RINGS`, `worker --rings on`), granted by `--forward
    /// ring` data planes (the default); on every (re)connection.
    pub rings: bool,
    /// Kernel fast-path sockets (`CAP_FAST_PATH`, docs/adr/0004-kernel-fast-path.md).
    pub fast_path: bool,
}

impl Default for DataOptions {
    /// Fast path on, rings on.
    fn default() -> Self {
        DataOptions { rings: true, fast_path: true }
    }
}

impl DataOptions {
    /// The capability bits of the `DataHello`.
    pub fn caps(&self) -> u64 {
        let mut caps = 0;
        if self.rings {
            caps |= CAP_RINGS;
        }
        if self.fast_path {
            caps |= CAP_FAST_PATH;
        }
        caps
    }
}

/// Why the handshake failed.
#[derive(Debug)]
pub enum HandshakeError {
    Io(io::Error),
    /// The data plane refused us (e.g. the server id is held by another connection).
    Refused(String),
    /// The data plane closed the connection without a reply.
    Closed,
    /// A reply we cannot use.
    Protocol(String),
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Io(e) => write!(f, "data connection: {e}"),
            HandshakeError::Refused(r) => write!(f, "data plane refused the data connection: {r}"),
            HandshakeError::Closed => f.write_str("data plane closed the data connection during the handshake"),
            HandshakeError::Protocol(p) => write!(f, "data connection protocol error: {p}"),
        }
    }
}
impl std::error::Error for HandshakeError {}
impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

/// Largest control record we expect on a data connection.
const CONTROL_BUF: usize = 16 + MAX_TEXT;

/// SO_RCVTIMEO on a connection being handshaken (`None`: wait forever; a zero
/// timeout is refused, as std refuses it).
pub(crate) fn recv_timeout(conn: &OwnedFd, t: Option<Duration>) -> io::Result<()> {
    Ok(rustix::net::sockopt::set_socket_timeout(conn, rustix::net::sockopt::Timeout::Recv, t)?)
}

/// Runs the data-connection handshake on an already connected SEQPACKET socket
/// without capabilities: sends `DataHello`, waits up to `timeout` for `Welcome`,
/// `Sockets` with its fds and `Rings` (count 0). Data frames that arrive before it
/// (none should) are skipped.
pub fn handshake_on(conn: OwnedFd, server_id: ServerId, timeout: Duration) -> Result<Handshake, HandshakeError> {
    handshake_on_opts(conn, server_id, timeout, DataOptions { rings: false, fast_path: false })
}

/// Takes the UDP fds of a `Sockets` / `FastSockets` record: one per address, each a
/// datagram socket.
fn udp_fds(
    what: &str,
    addrs: Vec<SocketAddr>,
    fds: Vec<OwnedFd>,
    allow_empty: bool,
) -> Result<Vec<SharedSocketFd>, HandshakeError> {
    if (addrs.is_empty() && !allow_empty) || addrs.len() != fds.len() {
        return Err(HandshakeError::Protocol(format!(
            "{what} lists {} addresses but carries {} descriptors",
            addrs.len(),
            fds.len()
        )));
    }
    let mut sockets = Vec::with_capacity(addrs.len());
    for (addr, fd) in addrs.into_iter().zip(fds) {
        if SockRef::from(&fd).r#type()? != socket2::Type::DGRAM {
            return Err(HandshakeError::Protocol(format!("{what}: descriptor for {addr} is not a UDP socket")));
        }
        sockets.push(SharedSocketFd { addr, fd });
    }
    Ok(sockets)
}

/// The handshake with the capabilities of `opts`: `DataHello { announce }`, answered
/// by `Welcome` (the negotiated version and the data plane's capabilities), then
/// `Sockets`, `FastSockets` (only when both sides announced `CAP_FAST_PATH`), then
/// `Rings`.
pub fn handshake_on_opts(
    conn: OwnedFd,
    server_id: ServerId,
    timeout: Duration,
    opts: DataOptions,
) -> Result<Handshake, HandshakeError> {
    SockRef::from(&conn).set_nonblocking(false)?;
    let window = sys::protocol::window();
    let hello = Data::DataHello { announce: Announce { window, caps: opts.caps() }, server_id };
    let plane = Channel::<Data>::new(conn.as_fd());
    plane.send(&hello)?;
    let other_version = |v: u8| {
        HandshakeError::Protocol(format!("the data plane answered in protocol version {v}: this build speaks {window}"))
    };
    // The negotiated version and the capabilities in effect.
    let mut welcome: Option<(u8, u64)> = None;
    let mut got_sockets: Option<Vec<SharedSocketFd>> = None;
    let mut got_fast: Option<Vec<SharedSocketFd>> = None;
    recv_timeout(&conn, Some(timeout))?;
    let deadline = std::time::Instant::now() + timeout;
    let mut buf = vec![0u8; CONTROL_BUF.max(frame::HEADER_LEN + frame::MAX_PAYLOAD)];
    loop {
        if std::time::Instant::now() >= deadline {
            return Err(HandshakeError::Io(io::Error::new(io::ErrorKind::TimedOut, "no Sockets reply")));
        }
        let got = match plane.recv(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(HandshakeError::Io(io::Error::new(io::ErrorKind::TimedOut, "no Sockets reply")))
            }
            Err(e) => return Err(e.into()),
        };
        match got {
            Incoming::Closed => return Err(HandshakeError::Closed),
            // A data frame before Sockets: not expected, harmless.
            Incoming::Malformed(WireError::BadMagic) => continue,
            Incoming::TooLong => return Err(HandshakeError::Protocol("control record too long".into())),
            Incoming::Malformed(WireError::UnsupportedVersion(v)) => return Err(other_version(v)),
            Incoming::Malformed(e) => return Err(HandshakeError::Protocol(format!("undecodable control record: {e}"))),
            Incoming::Message { msg: Data::Welcome { version, caps }, .. } if welcome.is_none() => {
                if !window.speaks(version) {
                    return Err(other_version(version));
                }
                welcome = Some((version, common_caps(opts.caps(), caps, CAPS_KNOWN)));
            }
            Incoming::Message { msg: Data::Sockets { .. } | Data::FastSockets { .. } | Data::Rings { .. }, .. }
                if welcome.is_none() =>
            {
                return Err(HandshakeError::Protocol("the data plane answered without Welcome".into()))
            }
            Incoming::Message { msg: Data::Sockets { addrs }, fds } if got_sockets.is_none() => {
                got_sockets = Some(udp_fds("Sockets", addrs, fds, false)?);
            }
            Incoming::Message { msg: Data::FastSockets { addrs }, fds } => {
                let asked = welcome.is_some_and(|(_, caps)| caps & CAP_FAST_PATH != 0);
                if !asked || got_sockets.is_none() || got_fast.is_some() {
                    return Err(HandshakeError::Protocol(
                        "FastSockets out of order (not announced by both, before Sockets, or twice)".into(),
                    ));
                }
                got_fast = Some(udp_fds("FastSockets", addrs, fds, true)?);
            }
            Incoming::Message { msg: Data::Rings { count, bytes }, fds } if got_sockets.is_some() => {
                if fds.len() != 2 * usize::from(count) {
                    return Err(HandshakeError::Protocol(format!(
                        "Rings announces {count} rings but carries {} descriptors",
                        fds.len()
                    )));
                }
                let mut rings = Vec::with_capacity(usize::from(count));
                let mut fds = fds.into_iter();
                while let (Some(memfd), Some(efd)) = (fds.next(), fds.next()) {
                    rings.push(crate::ring::Consumer::open(memfd, efd, bytes)?);
                }
                recv_timeout(&conn, None)?;
                let sockets = got_sockets.take().unwrap_or_default();
                let (version, caps) = welcome.unwrap_or((window.newest, 0));
                let fast = match got_fast.take() {
                    Some(f) => f,
                    None => {
                        if opts.fast_path {
                            tracing::info!("the data plane offers no fast path (no FastSockets): datagrams come on the data connection");
                        }
                        Vec::new()
                    }
                };
                return Ok(Handshake { conn, sockets, fast, rings, version, caps });
            }
            Incoming::Message { msg: Data::Error { reason }, .. } => return Err(HandshakeError::Refused(reason)),
            Incoming::Message { msg: other, .. } => {
                tracing::debug!(?other, "ignoring control message during the data handshake");
            }
        }
    }
}

/// Connects to the data plane at `path` and runs [`handshake_on_opts`].
pub fn handshake_opts(
    path: &Path,
    server_id: ServerId,
    timeout: Duration,
    opts: DataOptions,
) -> Result<Handshake, HandshakeError> {
    let conn = sys::seqpacket::connect(path)?;
    handshake_on_opts(conn, server_id, timeout, opts)
}

/// Counters of the data connection, readable at any time.
#[derive(Debug, Default)]
pub struct DataStats {
    /// Data frames handed to quinn.
    pub frames: AtomicU64,
    /// Of `frames`, those read from forwarding rings.
    pub ring_frames: AtomicU64,
    /// Payload bytes handed to quinn.
    pub bytes: AtomicU64,
    /// Records that failed `frame::decode` / `Data::decode` (dropped).
    pub malformed: AtomicU64,
    /// Records longer than the receive buffer (dropped).
    pub truncated: AtomicU64,
    /// Control records received on the data connection (never passed to quinn).
    pub control: AtomicU64,
    /// Times the data connection was lost.
    pub disconnects: AtomicU64,
    /// Successful reconnections.
    pub reconnects: AtomicU64,
    /// UDP datagrams (GRO segments counted one by one) received on the kernel fast
    /// path's sockets and handed to quinn.
    pub fast_datagrams: AtomicU64,
    /// Payload bytes of those.
    pub fast_bytes: AtomicU64,
    /// Transmits sent from a fast-path socket (the rest leave the shared socket).
    pub fast_transmits: AtomicU64,
    /// Receive or send errors on fast-path sockets (counted, logged, never given to quinn).
    pub fast_errors: AtomicU64,
}

/// What a repeated handshake handed over: the shared UDP sockets (`Sockets`), the
/// fast path's (`FastSockets`, possibly none) and the new data plane's forwarding
/// rings (`Rings`, possibly none).
#[derive(Debug)]
pub struct NewSockets {
    pub shared: Vec<SharedSocketFd>,
    pub fast: Vec<SharedSocketFd>,
    pub rings: Vec<crate::ring::Consumer>,
}

#[derive(Debug, Default)]
struct Lifecycle {
    ready: bool,
    draining: bool,
}

/// The live data connection: current socket, lifecycle state, reconnection.
#[derive(Debug)]
pub struct DataConn {
    server_id: ServerId,
    path: Option<PathBuf>,
    /// What reconnections ask for (the same as the first handshake).
    opts: DataOptions,
    /// The current connection's negotiated protocol version (set before the fd, so a
    /// sender that sees the new fd sends in its version).
    version: AtomicU8,
    /// `None` while disconnected.
    fd: RwLock<Option<Arc<AsyncFd<OwnedFd>>>>,
    lifecycle: Mutex<Lifecycle>,
    /// The receive side parks here while disconnected.
    waker: Mutex<Option<Waker>>,
    /// Wakes the reconnect task.
    lost: tokio::sync::Notify,
    reconnecting: AtomicBool,
    pub stats: DataStats,
}

fn poisoned() -> io::Error {
    io::Error::other("lock poisoned")
}

impl DataConn {
    /// Wraps a connection handshaken in this process's newest protocol version.
    /// `path` enables reconnection (which asks for the fast path and rings,
    /// [`DataOptions::default`]); call from within a tokio runtime.
    pub fn new(conn: OwnedFd, server_id: ServerId, path: Option<PathBuf>) -> io::Result<Arc<DataConn>> {
        let version = sys::protocol::window().newest;
        DataConn::with_options(conn, server_id, path, DataOptions::default(), version)
    }

    /// [`DataConn::new`] for a connection whose hello negotiated `version`;
    /// reconnections ask for `opts`.
    pub fn with_options(
        conn: OwnedFd,
        server_id: ServerId,
        path: Option<PathBuf>,
        opts: DataOptions,
        version: u8,
    ) -> io::Result<Arc<DataConn>> {
        SockRef::from(&conn).set_nonblocking(true)?;
        let fd = crate::async_fd::register(conn, Interest::READABLE | Interest::WRITABLE)?;
        Ok(Arc::new(DataConn {
            server_id,
            path,
            opts,
            version: AtomicU8::new(version),
            fd: RwLock::new(Some(Arc::new(fd))),
            lifecycle: Mutex::new(Lifecycle::default()),
            waker: Mutex::new(None),
            lost: tokio::sync::Notify::new(),
            reconnecting: AtomicBool::new(false),
            stats: DataStats::default(),
        }))
    }

    pub fn server_id(&self) -> ServerId {
        self.server_id
    }

    /// The current connection, or `None` while disconnected.
    pub fn current(&self) -> Option<Arc<AsyncFd<OwnedFd>>> {
        self.fd.read().ok().and_then(|g| g.clone())
    }

    /// The protocol version the current connection negotiated (docs/wire.md
    /// "Versions"): what control messages go out in.
    pub fn version(&self) -> u8 {
        self.version.load(Ordering::Acquire)
    }

    /// Registers `waker` to be woken when a connection is (re)established; returns
    /// the connection if one appeared meanwhile.
    pub fn park(&self, waker: &Waker) -> Option<Arc<AsyncFd<OwnedFd>>> {
        if let Ok(mut w) = self.waker.lock() {
            *w = Some(waker.clone());
        }
        self.current()
    }

    /// The receive side saw EOF or a fatal error on `which`: drop it (if still
    /// current) and wake the reconnect task.
    pub fn mark_lost(&self, which: &Arc<AsyncFd<OwnedFd>>) {
        let Ok(mut g) = self.fd.write() else { return };
        if g.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, which)) {
            *g = None;
            self.stats.disconnects.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(server_id = %self.server_id, "data connection lost");
            self.lost.notify_one();
        }
    }

    /// Whether the connection is currently up.
    pub fn is_connected(&self) -> bool {
        self.current().is_some()
    }

    /// Sends a control message (best effort when disconnected: the state is replayed
    /// on reconnection).
    pub async fn send_control(&self, m: &Data) -> io::Result<()> {
        let fd = self.current().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "data connection down"))?;
        loop {
            let mut guard = fd.writable().await?;
            match guard.try_io(|inner| Channel::new(inner.as_fd()).dont_wait().at(self.version()).send(m)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Tells the data plane this instance takes new connections (`Ready`).
    pub async fn ready(&self) -> io::Result<()> {
        {
            let mut l = self.lifecycle.lock().map_err(|_| poisoned())?;
            l.ready = true;
            if l.draining {
                return Ok(());
            }
        }
        self.send_control(&Data::Ready).await
    }

    /// Tells the data plane to place nothing new here (`Draining`); datagrams of
    /// existing connections keep arriving until the connection closes.
    pub async fn draining(&self) -> io::Result<()> {
        self.lifecycle.lock().map_err(|_| poisoned())?.draining = true;
        self.send_control(&Data::Draining).await
    }

    /// Whether `Draining` was sent.
    pub fn is_draining(&self) -> bool {
        self.lifecycle.lock().map(|l| l.draining).unwrap_or(true)
    }

    /// Closes the data connection: the server id becomes dead at once.
    pub fn close(&self) {
        if let Ok(mut g) = self.fd.write() {
            *g = None;
        }
        self.reconnecting.store(false, Ordering::Relaxed);
    }

    /// Handles a control record that arrived on the data connection (never given to
    /// quinn). Returns whether the record asks us to treat the connection as closing.
    pub fn on_control(&self, rec: &[u8]) -> bool {
        self.stats.control.fetch_add(1, Ordering::Relaxed);
        match Data::decode(rec) {
            Ok(Data::Error { reason }) => {
                tracing::warn!(%reason, "data plane reports an error on the data connection");
                false
            }
            Ok(m) => {
                tracing::debug!(?m, "ignoring control message on the data connection");
                false
            }
            Err(e) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "malformed control record dropped");
                false
            }
        }
    }

    /// The capabilities reconnections ask for.
    pub fn options(&self) -> DataOptions {
        self.opts
    }

    /// Reconnects whenever the connection is lost, until [`DataConn::close`]. New UDP
    /// socket fds from the repeated handshake (shared and fast path) and the new
    /// forwarding rings go to `on_sockets`. `Ready` is resent if it was sent before and the instance is not
    /// draining.
    pub fn spawn_reconnector(
        self: &Arc<Self>,
        on_sockets: impl Fn(NewSockets) + Send + Sync + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let path = self.path.clone()?;
        self.reconnecting.store(true, Ordering::Relaxed);
        let me = Arc::clone(self);
        Some(tokio::spawn(async move {
            loop {
                me.lost.notified().await;
                if !me.reconnecting.load(Ordering::Relaxed) {
                    return;
                }
                let mut backoff = Duration::from_millis(50);
                loop {
                    if !me.reconnecting.load(Ordering::Relaxed) {
                        return;
                    }
                    let (p, id, opts) = (path.clone(), me.server_id, me.opts);
                    let res =
                        tokio::task::spawn_blocking(move || handshake_opts(&p, id, Duration::from_secs(5), opts)).await;
                    match res {
                        Ok(Ok(h)) => match me.install(h.conn, h.version) {
                            Ok(()) => {
                                on_sockets(NewSockets { shared: h.sockets, fast: h.fast, rings: h.rings });
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "data connection re-registration failed")
                            }
                        },
                        Ok(Err(e)) => tracing::debug!(error = %e, "data plane not back yet"),
                        Err(e) => tracing::warn!(error = %e, "handshake task failed"),
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                let (ready, draining) = me.lifecycle.lock().map(|l| (l.ready, l.draining)).unwrap_or((false, true));
                if ready && !draining {
                    if let Err(e) = me.send_control(&Data::Ready).await {
                        tracing::warn!(error = %e, "resending Ready failed");
                    }
                }
                me.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                tracing::info!(server_id = %me.server_id, "data connection re-established");
            }
        }))
    }

    fn install(&self, conn: OwnedFd, version: u8) -> io::Result<()> {
        SockRef::from(&conn).set_nonblocking(true)?;
        let fd = Arc::new(crate::async_fd::register(conn, Interest::READABLE | Interest::WRITABLE)?);
        let mut g = self.fd.write().map_err(|_| poisoned())?;
        // A new data plane may speak another version than the last one.
        self.version.store(version, Ordering::Release);
        *g = Some(fd);
        drop(g);
        if let Some(w) = self.waker.lock().map_err(|_| poisoned())?.take() {
            w.wake();
        }
        Ok(())
    }
}
