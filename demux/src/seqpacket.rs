//! Unix SOCK_SEQPACKET helpers: listen (mode 0600), accept, connect, one record in /
//! out, and fd passing with SCM_RIGHTS (unix(7)).

use crate::sys::{cvt, cvt_isize, owned};
use anyhow::{bail, Context, Result};
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Most fds one SCM_RIGHTS message carries (the kernel's SCM_MAX_FD, include/net/scm.h).
pub const SCM_MAX_FD: usize = 253;
/// Fds a [`recv`] control buffer takes before MSG_CTRUNC (the kernel closes any
/// beyond): [`recv`] closes them all anyway, as the data plane accepts none.
const RECV_FDS: usize = 60;
/// Control buffer of [`recv`], in u64 words (u64: cmsghdr alignment): 32.
const RECV_CMSG_WORDS: usize = cmsg_words(RECV_FDS);
/// Control buffer of [`recv_with_fds`]: room for [`SCM_MAX_FD`] fds.
const RECV_WITH_FDS_CMSG_WORDS: usize = cmsg_words(SCM_MAX_FD);

/// `CMSG_SPACE` of `fds` file descriptors, in u64 words.
const fn cmsg_words(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure computation.
    let bytes = unsafe { libc::CMSG_SPACE((fds * size_of::<RawFd>()) as u32) } as usize;
    bytes.div_ceil(size_of::<u64>())
}

fn sockaddr_un(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut sun: libc::sockaddr_un = unsafe { zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.is_empty() || b.len() >= sun.sun_path.len() || b.contains(&0) {
        bail!(
            "unix socket path {} is empty, contains NUL or is longer than {} bytes",
            path.display(),
            sun.sun_path.len() - 1
        );
    }
    for (d, s) in sun.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + b.len() + 1;
    Ok((sun, len as libc::socklen_t))
}

fn new_socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain syscall.
    owned(unsafe { libc::socket(libc::AF_UNIX, flags, 0) })
}

/// Binds and listens at `path`, mode 0600. A stale socket file is replaced; any other
/// existing file is an error.
pub fn listen(path: &Path) -> Result<OwnedFd> {
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if md.file_type().is_socket() {
            std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
        } else {
            bail!("{} exists and is not a socket", path.display());
        }
    }
    let (sun, len) = sockaddr_un(path)?;
    let fd = new_socket(true).context("socket(AF_UNIX, SOCK_SEQPACKET)")?;
    // The socket file gets mode 0666 & ~umask: restrict the umask around bind so it
    // is 0600 from the start (no window in which others could connect).
    // SAFETY: umask is always safe; restored right after bind.
    let old = unsafe { libc::umask(0o177) };
    // SAFETY: sun/len describe a valid sockaddr_un.
    let r = cvt(unsafe { libc::bind(fd.as_raw_fd(), (&sun as *const libc::sockaddr_un).cast(), len) });
    // SAFETY: restores the previous mask.
    unsafe { libc::umask(old) };
    r.with_context(|| format!("bind {}", path.display()))?;
    // SAFETY: plain syscall on a bound socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) }).with_context(|| format!("listen {}", path.display()))?;
    Ok(fd)
}

/// Accepts one connection (non-blocking, close-on-exec); `None` when none is waiting.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: null address pointers are allowed by accept4.
    let r = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    match owned(r) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Connects (blocking) to a SOCK_SEQPACKET listener.
pub fn connect(path: &Path) -> Result<OwnedFd> {
    let (sun, len) = sockaddr_un(path)?;
    let fd = new_socket(false).context("socket(AF_UNIX, SOCK_SEQPACKET)")?;
    // SAFETY: sun/len describe a valid sockaddr_un.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&sun as *const libc::sockaddr_un).cast(), len) })
        .with_context(|| format!("connect {}", path.display()))?;
    Ok(fd)
}

/// Sends one record, with `fds` attached (SCM_RIGHTS) when not empty.
pub fn send(fd: RawFd, rec: &[u8], fds: &[RawFd], flags: libc::c_int) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: rec.as_ptr() as *mut libc::c_void, iov_len: rec.len() };
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points to `space` bytes (8-aligned), enough for one
        // cmsghdr carrying `fds`; CMSG_* stay within that buffer.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
    }
    // SAFETY: msg points to live iovec and control buffers.
    cvt_isize(unsafe { libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) })
}

/// Receives one record into `buf`; `Ok(0)` means the peer closed. Any fds the peer
/// attached are closed (the data plane accepts none). Sets `*truncated` on MSG_TRUNC.
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int, truncated: &mut bool) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: plain old data.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut cbuf = [0u64; RECV_CMSG_WORDS];
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points to live buffers of the advertised sizes.
    let n = cvt_isize(unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) })?;
    *truncated = msg.msg_flags & libc::MSG_TRUNC != 0;
    close_passed_fds(&msg);
    Ok(n)
}

/// What reading a control connection produced (see [`drain_control`]).
pub enum Inbound {
    /// One well-formed control message.
    Message(proto::wire::Control),
    /// The peer closed, hung up, or the socket failed: close with this reason.
    Closed(String),
    /// The peer sent an over-long or malformed record: refuse (Error, close).
    Invalid(String),
}

/// Reads the control records waiting on a non-blocking connection (at most 64 per
/// call, so one chatty peer cannot starve the others) and hands each to `on`, which
/// returns false once it has closed the connection. EOF, a socket error, an over-long
/// or a malformed record end the drain with one `Closed` / `Invalid`; after an EAGAIN,
/// a hang-up in `ev` (EPOLLHUP / EPOLLERR) does the same.
pub fn drain_control(fd: RawFd, buf: &mut [u8], ev: u32, mut on: impl FnMut(Inbound) -> bool) {
    for _ in 0..64 {
        let mut truncated = false;
        match recv(fd, buf, libc::MSG_DONTWAIT, &mut truncated) {
            Ok(0) => {
                on(Inbound::Closed("peer closed".into()));
                return;
            }
            Ok(_) if truncated => {
                on(Inbound::Invalid("record too long".into()));
                return;
            }
            Ok(n) => match proto::wire::decode_control(&buf[..n]) {
                Ok(m) => {
                    if !on(Inbound::Message(m)) {
                        return;
                    }
                }
                Err(e) => {
                    on(Inbound::Invalid(format!("malformed control message: {e}")));
                    return;
                }
            },
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                on(Inbound::Closed(format!("recv: {e}")));
                return;
            }
        }
    }
    if ev & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
        on(Inbound::Closed("hang-up".into()));
    }
}

/// Receives one record and the fds attached to it (SCM_RIGHTS, up to [`SCM_MAX_FD`]), which
/// become ours (close-on-exec). `Ok((0, _))` means the peer closed.
pub fn recv_with_fds(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, bool, Vec<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: plain old data.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut cbuf = [0u64; RECV_WITH_FDS_CMSG_WORDS];
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points to live buffers of the advertised sizes.
    let n = cvt_isize(unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) })?;
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok((n, truncated, take_passed_fds(&msg)))
}

fn take_passed_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut out = Vec::new();
    // SAFETY: walks the control buffer the kernel filled, with the CMSG_* macros that
    // bound every step by msg_controllen; fds received are ours to own.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let n = data_len / size_of::<RawFd>();
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..n {
                    let fd = std::ptr::read_unaligned(p.add(i));
                    if let Ok(o) = owned(fd) {
                        out.push(o);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    out
}

fn close_passed_fds(msg: &libc::msghdr) {
    drop(take_passed_fds(msg));
}

/// Sets a large send buffer on a data connection: records wait there while the worker
/// catches up (root may exceed net.core.wmem_max).
pub fn set_sndbuf(fd: RawFd, bytes: libc::c_int) {
    if crate::sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, bytes).is_err() {
        let _ = crate::sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes);
    }
}
