//! Unix SOCK_SEQPACKET plumbing for the data connection: connect, one record out,
//! one record in with SCM_RIGHTS file descriptors, and a batch of records in
//! (`recvmmsg`).
//!
//! Every `unsafe` block is a single libc call or a read of kernel-filled memory;
//! each carries a `// SAFETY:` note, and the module's tests exercise each one.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Most descriptors one record may carry (matches `proto::wire::MAX_SOCKETS`).
pub const MAX_FDS: usize = proto::wire::MAX_SOCKETS;

/// Size of the control buffer for [`MAX_FDS`] descriptors, rounded up generously.
const CMSG_BUF_LEN: usize = 64 + MAX_FDS * mem::size_of::<RawFd>();

/// Control-message buffer with the alignment `cmsghdr` needs.
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_BUF_LEN]);

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A new, unconnected AF_UNIX SOCK_SEQPACKET socket (close-on-exec).
pub fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant arguments; no pointers.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2), is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A connected pair of SEQPACKET sockets (tests, in-process forwarders).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: `fds` is a valid, writable array of two c_ints, as socketpair(2) requires.
    cvt(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: socketpair succeeded, so both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unix socket path must be 1..{} bytes without NUL", addr.sun_path.len()),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// Connects a SEQPACKET socket to `path` (blocking).
pub fn seqpacket_connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let (addr, len) = sockaddr_un(path)?;
    // SAFETY: `addr` is a valid sockaddr_un that outlives the call and `len` covers
    // only its initialised prefix.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(fd)
}

/// Binds and listens on `path` (tests and in-process forwarders).
pub fn seqpacket_listen(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let (addr, len) = sockaddr_un(path)?;
    // SAFETY: as in `seqpacket_connect`.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    // SAFETY: plain syscall on a descriptor we own.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
    Ok(fd)
}

/// Accepts one connection on a listening SEQPACKET socket (blocking unless the
/// listener is non-blocking).
pub fn seqpacket_accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: null address pointers are allowed by accept4(2) when the peer address
    // is not wanted.
    let fd = cvt(unsafe {
        libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
    })?;
    // SAFETY: accept4 returned a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets or clears O_NONBLOCK on a descriptor we own exclusively (never on the shared
/// UDP sockets: that flag lives in the open file description the data plane shares).
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFL) on a valid descriptor; no pointers.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let new = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    if new != flags {
        // SAFETY: fcntl(F_SETFL) with an int argument on a valid descriptor.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) })?;
    }
    Ok(())
}

/// Whether O_NONBLOCK is set on the open file description behind `fd`.
pub fn is_nonblocking(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: fcntl(F_GETFL) on a valid descriptor; no pointers.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    Ok(flags & libc::O_NONBLOCK != 0)
}

/// Sets SO_RCVTIMEO (blocking receives give up with `WouldBlock` after `t`).
pub fn set_recv_timeout(fd: BorrowedFd<'_>, t: Option<std::time::Duration>) -> io::Result<()> {
    let tv = match t {
        Some(t) => libc::timeval {
            tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_usec: t.subsec_micros().max(u32::from(t.is_zero())) as libc::suseconds_t,
        },
        None => libc::timeval { tv_sec: 0, tv_usec: 0 },
    };
    // SAFETY: `tv` is a valid timeval that outlives the call; the length matches it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// The socket type (SO_TYPE) of a descriptor, e.g. `libc::SOCK_DGRAM`.
pub fn socket_type(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    let mut ty: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `ty` and `len` are valid for writes and `len` holds the size of `ty`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(ty)
}

/// Sends one record, optionally with descriptors attached (SCM_RIGHTS).
/// `flags` are added to MSG_NOSIGNAL (e.g. `libc::MSG_DONTWAIT`).
pub fn send_record(fd: BorrowedFd<'_>, rec: &[u8], fds: &[BorrowedFd<'_>], flags: libc::c_int) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one record"));
    }
    let mut iov = libc::iovec { iov_base: rec.as_ptr() as *mut libc::c_void, iov_len: rec.len() };
    let mut cbuf = CmsgBuf([0; CMSG_BUF_LEN]);
    // SAFETY: msghdr is plain old data; all-zero is a valid "no name, no control" value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = (fds.len() * mem::size_of::<RawFd>()) as libc::c_uint;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` (≤ CMSG_BUF_LEN) aligned bytes, so the
        // first header exists and is writable.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        if cmsg.is_null() {
            return Err(io::Error::other("control buffer too small"));
        }
        // SAFETY: `cmsg` points into `cbuf` (checked non-null above); CMSG_DATA lies
        // within the `space` bytes reserved for `payload`, and write_unaligned copes
        // with any alignment of the data area.
        unsafe {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, f) in fds.iter().enumerate() {
                data.add(i).write_unaligned(f.as_raw_fd());
            }
        }
    }
    // SAFETY: `msg` points at `iov` (valid for `rec.len()` bytes) and at `cbuf`, both
    // alive for the duration of the call.
    cvt_size(unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) })
}

/// One received record.
#[derive(Debug)]
pub struct Received {
    /// Bytes of the record placed in the buffer.
    pub len: usize,
    /// The record was longer than the buffer (MSG_TRUNC): the tail is lost.
    pub truncated: bool,
    /// Descriptors that came with the record, owned now.
    pub fds: Vec<OwnedFd>,
}

/// Receives one record and any SCM_RIGHTS descriptors with it (close-on-exec).
/// A zero-length result on a SEQPACKET socket means the peer closed the connection.
pub fn recv_record(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cbuf = CmsgBuf([0; CMSG_BUF_LEN]);
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_BUF_LEN as _;
    // SAFETY: `msg` points at `iov` (valid for `buf.len()` writable bytes) and at
    // `cbuf` (CMSG_BUF_LEN writable bytes), both alive for the duration of the call.
    let len = cvt_size(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) })?;
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_control`/`msg_controllen`; CMSG_FIRSTHDR only
    // reads those fields.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return null or a header lying entirely
        // inside the kernel-filled control buffer.
        let (level, ty, clen) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len as usize) };
        if level == libc::SOL_SOCKET && ty == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN is a pure size computation.
            let hdr = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = clen.saturating_sub(hdr) / mem::size_of::<RawFd>();
            // SAFETY: the data area of this header holds `n` descriptors written by the
            // kernel; read_unaligned copes with any alignment.
            let data = unsafe { libc::CMSG_DATA(cmsg).cast::<RawFd>() };
            for i in 0..n {
                // SAFETY: `i < n`, inside the data area (see above).
                let raw = unsafe { data.add(i).read_unaligned() };
                // SAFETY: SCM_RIGHTS installed `raw` as a new descriptor in this process;
                // nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: `cmsg` is a valid header of `msg` (see above).
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Some descriptors were dropped by the kernel; the ones we got close on drop.
        return Err(io::Error::other("control data truncated (too many descriptors)"));
    }
    Ok(Received { len, truncated: msg.msg_flags & libc::MSG_TRUNC != 0, fds })
}

/// Registers an owned descriptor with the tokio reactor for `interest`. Must run
/// inside a tokio runtime.
pub fn async_fd(fd: OwnedFd, interest: tokio::io::Interest) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that always returns the same
    // raw fd and stays open until the `AsyncFd` (which owns it) drops it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

/// Most records one [`recv_batch`] call takes.
pub const MAX_BATCH: usize = 64;

/// Receives up to `bufs.len()` (at most [`MAX_BATCH`]) records without blocking,
/// one record per buffer (`recvmmsg` with MSG_DONTWAIT). For each received record
/// `lens[i]` is its length in `bufs[i]` and `trunc[i]` whether it was cut (MSG_TRUNC).
/// Returns the number of records, or `WouldBlock` if none is waiting.
pub fn recv_batch(
    fd: BorrowedFd<'_>,
    bufs: &mut [io::IoSliceMut<'_>],
    lens: &mut [usize],
    trunc: &mut [bool],
) -> io::Result<usize> {
    let n = bufs.len().min(lens.len()).min(trunc.len()).min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    for (h, b) in hdrs.iter_mut().zip(bufs.iter_mut()).take(n) {
        // IoSliceMut is guaranteed ABI-compatible with `struct iovec` on Unix.
        h.msg_hdr.msg_iov = (b as *mut io::IoSliceMut<'_>).cast::<libc::iovec>();
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `n` headers each point at one live iovec (`bufs[i]`, writable
    // for its length); no name or control buffers; null timeout is allowed.
    let got = cvt(unsafe {
        libc::recvmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT, std::ptr::null_mut())
    })? as usize;
    for i in 0..got {
        lens[i] = hdrs[i].msg_len as usize;
        trunc[i] = hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn record_round_trip_with_fds() {
        let (a, b) = seqpacket_pair().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_addr = udp.local_addr().unwrap();
        send_record(a.as_fd(), b"hello", &[udp.as_fd(), udp.as_fd()], 0).unwrap();
        let mut buf = [0u8; 64];
        let r = recv_record(b.as_fd(), &mut buf, 0).unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        assert!(!r.truncated);
        assert_eq!(r.fds.len(), 2);
        assert_eq!(socket_type(r.fds[0].as_fd()).unwrap(), libc::SOCK_DGRAM);
        // The passed descriptor is the same socket: its local address matches.
        let dup = std::net::UdpSocket::from(r.fds.into_iter().next().unwrap());
        assert_eq!(dup.local_addr().unwrap(), udp_addr);
    }

    #[test]
    fn record_without_fds_and_truncation() {
        let (a, b) = seqpacket_pair().unwrap();
        send_record(a.as_fd(), &[7u8; 100], &[], 0).unwrap();
        let mut buf = [0u8; 10];
        let r = recv_record(b.as_fd(), &mut buf, 0).unwrap();
        assert!(r.truncated);
        assert_eq!(r.len, 10);
        assert!(r.fds.is_empty());
    }

    #[test]
    fn batch_receive_and_eof() {
        let (a, b) = seqpacket_pair().unwrap();
        let mut bufs_store = vec![vec![0u8; 32]; 4];
        {
            let mut bufs: Vec<io::IoSliceMut<'_>> = bufs_store.iter_mut().map(|v| io::IoSliceMut::new(v)).collect();
            let (mut lens, mut trunc) = ([0usize; 4], [false; 4]);
            let e = recv_batch(b.as_fd(), &mut bufs, &mut lens, &mut trunc).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            for i in 0..3u8 {
                send_record(a.as_fd(), &vec![i; 5 + usize::from(i) * 20], &[], 0).unwrap();
            }
            let got = recv_batch(b.as_fd(), &mut bufs, &mut lens, &mut trunc).unwrap();
            assert_eq!(got, 3);
            assert_eq!(&lens[..3], &[5, 25, 32]);
            assert_eq!(&trunc[..3], &[false, false, true]);
        }
        assert_eq!(&bufs_store[1][..25], &[1u8; 25][..]);
        drop(a);
        let mut buf = [0u8; 8];
        let r = recv_record(b.as_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(r.len, 0, "EOF reads as an empty record");
    }

    #[test]
    fn connect_listen_accept_and_flags() {
        let dir = std::env::temp_dir().join(format!("worker-fdpass-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = seqpacket_listen(&path).unwrap();
        let c = seqpacket_connect(&path).unwrap();
        let s = seqpacket_accept(l.as_fd()).unwrap();
        assert!(!is_nonblocking(c.as_fd()).unwrap());
        set_nonblocking(c.as_fd(), true).unwrap();
        assert!(is_nonblocking(c.as_fd()).unwrap());
        set_recv_timeout(s.as_fd(), Some(std::time::Duration::from_millis(20))).unwrap();
        let mut buf = [0u8; 4];
        let e = recv_record(s.as_fd(), &mut buf, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(seqpacket_connect(&dir.join("missing.sock")).is_err());
        assert!(seqpacket_connect(Path::new(&"x".repeat(200))).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
