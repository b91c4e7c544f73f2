//! Unix SOCK_SEQPACKET sockets (unix(7)): connect, listen, accept, one record out or
//! in with SCM_RIGHTS descriptors, and [`Channel`]: a connection typed by the
//! conversation it carries (`proto::wire::{Registration, Data, Admin}`). A batch of
//! records in or out is [`crate::mmsg`]'s.

use crate::{cmsg, cvt_isize};
use proto::wire::{Message, WireError};
use socket2::{Domain, SockAddr, SockRef, Socket, Type};
use std::io;
use std::marker::PhantomData;
use std::mem::{self, size_of};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Most descriptors one record may carry (the kernel's SCM_MAX_FD).
pub const MAX_FDS: usize = 253;

/// Room for the control data of [`MAX_FDS`] descriptors.
const CMSG_BUF_LEN: usize = cmsg::space(MAX_FDS * size_of::<RawFd>());

/// `e`, its message prefixed with `what` and `path` (e.g. "connect /run/x.sock: …").
fn at_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// The address of the socket file `path` (never an abstract name: a leading NUL is
/// refused, as any NUL is).
fn unix_addr(path: &Path) -> io::Result<SockAddr> {
    let bytes = path.as_os_str().as_bytes();
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unix socket path {} is empty, contains NUL or is longer than {MAX_PATH} bytes", path.display()),
        )
    };
    if bytes.is_empty() || bytes.contains(&0) {
        return Err(bad());
    }
    SockAddr::unix(path).map_err(|_| bad())
}

/// sizeof(sun_path) − 1: the longest path a unix socket address holds.
const MAX_PATH: usize = 107;

/// A new, unconnected AF_UNIX SOCK_SEQPACKET socket (close-on-exec).
pub fn socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let ty = if nonblocking { Type::SEQPACKET.nonblocking() } else { Type::SEQPACKET };
    Ok(Socket::new(Domain::UNIX, ty, None)?.into())
}

/// A connected pair of SEQPACKET sockets (tests, in-process forwarders).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None)?;
    Ok((a.into(), b.into()))
}

/// Connects (blocking) to the SEQPACKET listener at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let addr = unix_addr(path)?;
    let fd = socket(false)?;
    SockRef::from(&fd).connect(&addr).map_err(|e| at_path(e, "connect", path))?;
    Ok(fd)
}

fn bind_listen(fd: &OwnedFd, path: &Path, backlog: i32) -> io::Result<()> {
    let addr = unix_addr(path)?;
    let s = SockRef::from(fd);
    s.bind(&addr).map_err(|e| at_path(e, "bind", path))?;
    s.listen(backlog).map_err(|e| at_path(e, "listen", path))?;
    Ok(())
}

/// Binds and listens (blocking accept) at `path`, with `backlog` (tests, benches,
/// in-process forwarders). The file must not exist.
pub fn listen(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    let fd = socket(false)?;
    bind_listen(&fd, path, backlog)?;
    Ok(fd)
}

/// The data plane's and controller's listeners: non-blocking, backlog 128, mode 0600
/// from the start. A stale socket file is replaced; any other existing file is an error.
pub fn listen_private(path: &Path) -> io::Result<OwnedFd> {
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !md.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        std::fs::remove_file(path).map_err(|e| at_path(e, "removing stale socket", path))?;
    }
    let fd = socket(true)?;
    // The socket file gets mode 0666 & ~umask: restrict the umask around bind so it
    // is 0600 from the start (no window in which others could connect).
    // SAFETY: umask is always safe; restored right after bind.
    let old = unsafe { libc::umask(0o177) };
    let r = bind_listen(&fd, path, 128);
    // SAFETY: restores the previous mask.
    unsafe { libc::umask(old) };
    r.map(|()| fd)
}

/// Accepts one connection (close-on-exec; blocking unless the listener is non-blocking).
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(SockRef::from(&listener).accept()?.0.into())
}

/// Accepts one connection, itself non-blocking; `None` when none is waiting (EAGAIN,
/// EINTR, ECONNABORTED).
pub fn accept_nonblocking(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    match SockRef::from(&listener).accept() {
        Ok((s, _)) => {
            s.set_nonblocking(true)?;
            Ok(Some(s.into()))
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sends one record, optionally with descriptors attached (SCM_RIGHTS).
/// `flags` are added to MSG_NOSIGNAL (e.g. `libc::MSG_DONTWAIT`).
pub fn send_record(fd: BorrowedFd<'_>, rec: &[u8], fds: &[BorrowedFd<'_>], flags: libc::c_int) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one record"));
    }
    let mut raw = [-1 as RawFd; MAX_FDS];
    for (r, f) in raw.iter_mut().zip(fds) {
        *r = f.as_raw_fd();
    }
    send_record_raw(fd.as_raw_fd(), rec, &raw[..fds.len()], flags)
}

/// [`send_record`] on raw descriptors (an invalid one fails with EBADF).
pub fn send_record_raw(fd: RawFd, rec: &[u8], fds: &[RawFd], flags: libc::c_int) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one record"));
    }
    let mut cbuf = [0u8; CMSG_BUF_LEN];
    let mut control = cmsg::Encoder::new(&mut cbuf);
    if !fds.is_empty() {
        control.rights(fds).map_err(|_| io::Error::other("control buffer too small"))?;
    }
    let controllen = control.len();
    let mut iov = libc::iovec { iov_base: rec.as_ptr() as *mut libc::c_void, iov_len: rec.len() };
    // SAFETY: msghdr is plain old data; all-zero is a valid "no name, no control" value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if controllen > 0 {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = controllen as _;
    }
    // SAFETY: `msg` points at `iov` (valid for `rec.len()` bytes) and at the first
    // `controllen` bytes of `cbuf`, both alive for the duration of the call; the
    // kernel only reads them.
    cvt_isize(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | flags) })
}

/// One received record.
#[derive(Debug)]
pub struct Received {
    /// Bytes of the record placed in the buffer (0 on a SEQPACKET socket: the peer closed).
    pub len: usize,
    /// The record was longer than the buffer (MSG_TRUNC): the tail is lost.
    pub truncated: bool,
    /// Descriptors that came with the record, owned now (close-on-exec).
    pub fds: Vec<OwnedFd>,
}

/// Receives one record and any SCM_RIGHTS descriptors with it (close-on-exec).
/// A zero-length result on a SEQPACKET socket means the peer closed the connection.
pub fn recv_record(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<Received> {
    recv_record_raw(fd.as_raw_fd(), buf, flags)
}

/// [`recv_record`] on a raw descriptor (an invalid one fails with EBADF).
pub fn recv_record_raw(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cbuf = [0u8; CMSG_BUF_LEN];
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_BUF_LEN as _;
    // SAFETY: `msg` points at `iov` (valid for `buf.len()` writable bytes) and at
    // `cbuf` (CMSG_BUF_LEN writable bytes), both alive for the duration of the call.
    let len = cvt_isize(unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) })?;
    let fds = take_passed_fds(&cbuf[..(msg.msg_controllen as usize).min(CMSG_BUF_LEN)]);
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Some descriptors were dropped by the kernel; the ones we got close on drop.
        return Err(io::Error::other("control data truncated (too many descriptors)"));
    }
    Ok(Received { len, truncated: msg.msg_flags & libc::MSG_TRUNC != 0, fds })
}

/// The SCM_RIGHTS descriptors in the control data recvmsg(2) just wrote, owned.
fn take_passed_fds(control: &[u8]) -> Vec<OwnedFd> {
    cmsg::iter(control)
        .filter(|c| (c.level, c.ty) == (libc::SOL_SOCKET, libc::SCM_RIGHTS))
        .flat_map(|c| cmsg::rights(c.data))
        // SAFETY: SCM_RIGHTS installed each of these as a new descriptor in this
        // process (the kernel wrote this control data just now); nothing else owns it.
        .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) })
        .collect()
}

/// A connection that carries one conversation, `M` (`proto::wire::Registration`,
/// `Data`, `Admin`, or `ControlSocket` for the controller's listener): it sends and
/// receives only `M`'s messages, so a registration connection cannot be sent an admin
/// message. Descriptors travel only with the messages that carry them
/// ([`Message::carries_fds`]).
///
/// Versions (docs/wire.md "Versions"): it sends in the connection's negotiated
/// protocol version ([`Channel::at`]; before the hello is answered, in this
/// process's newest) and reads a record only in a version this process speaks
/// ([`crate::protocol::window`]; the frozen hello, `Welcome` and `Error` in any).
pub struct Channel<'fd, M> {
    fd: BorrowedFd<'fd>,
    flags: libc::c_int,
    version: Option<u8>,
    conversation: PhantomData<fn(M) -> M>,
}

impl<M> Clone for Channel<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Channel<'_, M> {}

impl<M> std::fmt::Debug for Channel<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("fd", &self.fd)
            .field("flags", &self.flags)
            .field("version", &self.version)
            .finish()
    }
}

/// What [`Channel::recv`] read.
#[derive(Debug)]
pub enum Incoming<M> {
    /// One message, with the descriptors that came with it (owned now,
    /// close-on-exec; always empty for a message that carries none: any the peer
    /// attached are closed).
    Message { msg: M, fds: Vec<OwnedFd> },
    /// The peer closed the connection.
    Closed,
    /// The record was longer than the buffer (MSG_TRUNC): its tail is lost.
    TooLong,
    /// A record this conversation does not read (a data frame on the data connection
    /// is `BadMagic`; one in a protocol version this process does not speak is
    /// `UnsupportedVersion`).
    Malformed(WireError),
}

impl<'fd, M: Message> Channel<'fd, M> {
    /// Sends and receives on `fd` as its blocking mode says.
    pub fn new(fd: BorrowedFd<'fd>) -> Self {
        Channel { fd, flags: 0, version: None, conversation: PhantomData }
    }

    /// Sends in protocol version `version`: the connection's negotiated one.
    pub fn at(self, version: u8) -> Self {
        Channel { version: Some(version), ..self }
    }

    /// The version records go out in: the negotiated one, or this process's newest.
    pub fn version(&self) -> u8 {
        self.version.unwrap_or_else(|| crate::protocol::window().newest)
    }

    /// Never waits: every call adds MSG_DONTWAIT (a full or empty socket is `WouldBlock`).
    pub fn dont_wait(self) -> Self {
        Channel { flags: libc::MSG_DONTWAIT, ..self }
    }

    pub fn fd(&self) -> BorrowedFd<'fd> {
        self.fd
    }

    /// Sends `m` as one record.
    pub fn send(&self, m: &M) -> io::Result<()> {
        self.send_with_raw_fds(m, &[])
    }

    /// Sends `m` with `fds` attached (SCM_RIGHTS); only a message that carries
    /// descriptors may have any.
    pub fn send_with_fds(&self, m: &M, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        self.send_with_raw_fds(m, &raw)
    }

    /// [`Channel::send_with_fds`] on raw descriptors (an invalid one fails with EBADF).
    pub fn send_with_raw_fds(&self, m: &M, fds: &[RawFd]) -> io::Result<()> {
        if !fds.is_empty() && !m.carries_fds() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} carries no descriptors", m.name())));
        }
        send_record_raw(self.fd.as_raw_fd(), &m.to_record_at(self.version()), fds, self.flags).map(drop)
    }

    /// Receives one record into `buf` (sized for the largest record expected) and
    /// decodes it as `M`.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Incoming<M>> {
        let r = recv_record(self.fd, buf, self.flags)?;
        if r.len == 0 {
            return Ok(Incoming::Closed);
        }
        if r.truncated {
            return Ok(Incoming::TooLong);
        }
        let rec = &buf[..r.len];
        let version = proto::wire::record_version(rec).unwrap_or(0);
        Ok(match M::decode(rec) {
            Ok(msg) if !msg.is_frozen() && !crate::protocol::window().speaks(version) => {
                Incoming::Malformed(WireError::UnsupportedVersion(version))
            }
            Ok(msg) => {
                let fds = if msg.carries_fds() { r.fds } else { Vec::new() };
                Incoming::Message { msg, fds }
            }
            Err(e) => Incoming::Malformed(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn socket_type(fd: BorrowedFd<'_>) -> io::Result<Type> {
        SockRef::from(&fd).r#type()
    }

    #[test]
    fn record_round_trip_with_fds() {
        let (a, b) = pair().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_addr = udp.local_addr().unwrap();
        send_record(a.as_fd(), b"hello", &[udp.as_fd(), udp.as_fd()], 0).unwrap();
        let mut buf = [0u8; 64];
        let r = recv_record(b.as_fd(), &mut buf, 0).unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        assert!(!r.truncated);
        assert_eq!(r.fds.len(), 2);
        assert_eq!(socket_type(r.fds[0].as_fd()).unwrap(), Type::DGRAM);
        // The passed descriptor is the same socket: its local address matches.
        let dup = std::net::UdpSocket::from(r.fds.into_iter().next().unwrap());
        assert_eq!(dup.local_addr().unwrap(), udp_addr);
    }

    #[test]
    fn record_without_fds_and_truncation() {
        let (a, b) = pair().unwrap();
        send_record(a.as_fd(), &[7u8; 100], &[], 0).unwrap();
        let mut buf = [0u8; 10];
        let r = recv_record(b.as_fd(), &mut buf, 0).unwrap();
        assert!(r.truncated);
        assert_eq!(r.len, 10);
        assert!(r.fds.is_empty());
    }

    #[test]
    fn eof_reads_as_an_empty_record() {
        let (a, b) = pair().unwrap();
        drop(a);
        let mut buf = [0u8; 8];
        let r = recv_record(b.as_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(r.len, 0, "EOF reads as an empty record");
    }

    /// More descriptors than one record carries are refused before sending; the most
    /// it carries arrive, every one of them owned.
    #[test]
    fn the_most_descriptors_a_record_carries() {
        let (a, b) = pair().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let many = vec![udp.as_fd(); MAX_FDS + 1];
        let e = send_record(a.as_fd(), b"x", &many, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        send_record(a.as_fd(), b"x", &many[..MAX_FDS], 0).unwrap();
        let mut buf = [0u8; 4];
        let r = recv_record(b.as_fd(), &mut buf, 0).unwrap();
        assert_eq!(r.fds.len(), MAX_FDS);
        assert!(r.fds.iter().all(|f| socket_type(f.as_fd()).unwrap() == Type::DGRAM));
    }

    /// Versions: a channel sends in the version it is set to (else this process's
    /// newest) and reads only the versions this process speaks, except the frozen
    /// hello, `Welcome` and `Error`, which it reads in any.
    #[test]
    fn channel_sends_in_its_version_and_reads_only_spoken_ones() {
        use proto::wire::{Announce, Data, Window, PROTOCOL_VERSION};
        let (a, b) = pair().unwrap();
        let rx = Channel::<Data>::new(b.as_fd());
        let mut buf = [0u8; 256];
        let mut raw = [0u8; 256];
        let own = crate::protocol::window();
        assert_eq!(own, Window::OWN, "this test process is not relabelled");
        assert_eq!(Channel::<Data>::new(a.as_fd()).version(), PROTOCOL_VERSION);
        // In the process's version: read. One it does not speak: UnsupportedVersion.
        for (v, spoken) in [(own.newest, true), (own.newest + 1, false), (own.oldest - 1, false)] {
            let tx = Channel::<Data>::new(a.as_fd()).at(v);
            assert_eq!(tx.version(), v);
            tx.send(&Data::Ready).unwrap();
            let r = recv_record(b.as_fd(), &mut raw, libc::MSG_PEEK).unwrap();
            assert_eq!(&raw[..r.len], &Data::Ready.to_record_at(v)[..], "sent in version {v}");
            match rx.recv(&mut buf).unwrap() {
                Incoming::Message { msg: Data::Ready, .. } if spoken => {}
                Incoming::Malformed(WireError::UnsupportedVersion(got)) if !spoken && got == v => {}
                other => panic!("version {v}: {other:?}"),
            }
        }
        // Frozen records in versions this process does not speak are still read.
        let far = own.newest + 7;
        let tx = Channel::<Data>::new(a.as_fd());
        tx.send(&Data::Welcome { version: far, caps: u64::MAX }).unwrap();
        assert!(
            matches!(rx.recv(&mut buf).unwrap(), Incoming::Message { msg: Data::Welcome { version, .. }, .. } if version == far)
        );
        let announce = Announce { window: Window::ending_at(far), caps: 0 };
        tx.send(&Data::DataHello { announce, server_id: proto::ServerId(4) }).unwrap();
        assert!(
            matches!(rx.recv(&mut buf).unwrap(), Incoming::Message { msg: Data::DataHello { announce: a, .. }, .. } if a == announce)
        );
        tx.at(far).send(&Data::Error { reason: "far".into() }).unwrap();
        assert!(matches!(rx.recv(&mut buf).unwrap(), Incoming::Message { msg: Data::Error { .. }, .. }));
    }

    /// A typed channel: the message and its descriptors arrive as sent; another
    /// conversation's record is refused by name; descriptors only travel with the
    /// messages that carry them.
    #[test]
    fn channel_is_typed_by_its_conversation() {
        use proto::wire::{Admin, Conversation, Data, Registration};
        let (a, b) = pair().unwrap();
        let (tx, rx) = (Channel::<Data>::new(a.as_fd()), Channel::<Data>::new(b.as_fd()));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = udp.local_addr().unwrap();
        tx.send_with_fds(&Data::Sockets { addrs: vec![addr] }, &[udp.as_fd()]).unwrap();
        let mut buf = [0u8; 256];
        match rx.recv(&mut buf).unwrap() {
            Incoming::Message { msg, fds } => {
                assert_eq!(msg, Data::Sockets { addrs: vec![addr] });
                assert_eq!(fds.len(), 1);
                assert_eq!(socket_type(fds[0].as_fd()).unwrap(), Type::DGRAM);
            }
            other => panic!("{other:?}"),
        }
        // Ready carries no descriptors: refused before anything is sent.
        let e = tx.send_with_fds(&Data::Ready, &[udp.as_fd()]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // A peer that attaches some anyway: they are closed, the message is read.
        send_record(a.as_fd(), &Data::Ready.to_record(), &[udp.as_fd()], 0).unwrap();
        assert!(matches!(rx.recv(&mut buf).unwrap(), Incoming::Message { msg: Data::Ready, fds } if fds.is_empty()));
        // Another conversation's record on this one.
        Channel::<Admin>::new(a.as_fd()).send(&Admin::StatusRequest).unwrap();
        match rx.recv(&mut buf).unwrap() {
            Incoming::Malformed(WireError::WrongConversation { belongs_to: Conversation::Admin, .. }) => {}
            other => panic!("{other:?}"),
        }
        // Error is every conversation's.
        Channel::<Registration>::new(a.as_fd()).send(&Registration::Error { reason: "no".into() }).unwrap();
        assert!(
            matches!(rx.recv(&mut buf).unwrap(), Incoming::Message { msg: Data::Error { reason }, .. } if reason == "no")
        );
        // Too long for the buffer; then nothing waiting; then closed.
        tx.send(&Data::Error { reason: "x".repeat(100) }).unwrap();
        assert!(matches!(rx.recv(&mut buf[..20]).unwrap(), Incoming::TooLong));
        let e = rx.dont_wait().recv(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        assert!(matches!(rx.recv(&mut buf).unwrap(), Incoming::Closed));
    }

    #[test]
    fn connect_listen_accept_and_flags() {
        let dir = std::env::temp_dir().join(format!("sys-seqpacket-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = listen(&path, 64).unwrap();
        let c = connect(&path).unwrap();
        let s = accept(l.as_fd()).unwrap();
        assert!(!SockRef::from(&c).nonblocking().unwrap());
        assert!(!SockRef::from(&s).nonblocking().unwrap());
        SockRef::from(&l).set_nonblocking(true).unwrap();
        let nb = accept_nonblocking(l.as_fd()).unwrap();
        assert!(nb.is_none(), "nobody waiting");
        let _c2 = connect(&path).unwrap();
        let s2 = accept_nonblocking(l.as_fd()).unwrap().expect("one waiting");
        assert!(SockRef::from(&s2).nonblocking().unwrap());
        rustix::net::sockopt::set_socket_timeout(
            &s,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_millis(20)),
        )
        .unwrap();
        let mut buf = [0u8; 4];
        let e = recv_record(s.as_fd(), &mut buf, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(connect(&dir.join("missing.sock")).is_err());
        assert!(connect(Path::new(&"x".repeat(200))).is_err());
        // Paths: a file name of up to 107 bytes, never empty, never a NUL (no abstract names).
        assert!(unix_addr(Path::new(&"x".repeat(MAX_PATH))).is_ok());
        for bad in ["x".repeat(MAX_PATH + 1), String::new(), "\0abstract".into(), "a\0b".into()] {
            let e = unix_addr(Path::new(&bad)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
