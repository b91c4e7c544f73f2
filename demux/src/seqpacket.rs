//! Unix SOCK_SEQPACKET helpers: listen (mode 0600), accept, connect, one record in /
//! out, and fd passing with SCM_RIGHTS (unix(7)).

use anyhow::Result;
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::Path;

/// Most fds one SCM_RIGHTS message carries (the kernel's SCM_MAX_FD, include/net/scm.h).
pub use ::sys::seqpacket::MAX_FDS as SCM_MAX_FD;

/// Binds and listens at `path`, mode 0600, non-blocking. A stale socket file is
/// replaced; any other existing file is an error.
pub fn listen(path: &Path) -> Result<OwnedFd> {
    Ok(::sys::seqpacket::listen_private(path)?)
}

/// Accepts one connection (non-blocking, close-on-exec); `None` when none is waiting.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    ::sys::seqpacket::accept_nonblocking(listener.as_fd())
}

/// Connects (blocking) to a SOCK_SEQPACKET listener.
pub fn connect(path: &Path) -> Result<OwnedFd> {
    Ok(::sys::seqpacket::connect(path)?)
}

/// Sends one record, with `fds` attached (SCM_RIGHTS) when not empty.
pub fn send(fd: RawFd, rec: &[u8], fds: &[RawFd], flags: libc::c_int) -> io::Result<usize> {
    ::sys::seqpacket::send_record_raw(fd, rec, fds, flags)
}

/// Receives one record into `buf`; `Ok(0)` means the peer closed. Any fds the peer
/// attached are closed (the data plane accepts none). Sets `*truncated` on MSG_TRUNC.
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int, truncated: &mut bool) -> io::Result<usize> {
    let r = ::sys::seqpacket::recv_record_raw(fd, buf, flags)?;
    *truncated = r.truncated;
    Ok(r.len)
}

/// A server of control connections (the controller's control.sock, the data
/// plane's sockets): what [`serve_ready`] calls for each record or end of one.
pub trait ControlServer {
    /// Handles one message; false when it closed the connection.
    fn on_message(&mut self, token: u64, m: proto::wire::Control) -> bool;
    /// Closes the connection (peer gone, socket error).
    fn close(&mut self, token: u64, why: &str);
    /// Answers `Error{why}` and closes (a bad record).
    fn refuse(&mut self, token: u64, why: &str);
    /// The receive buffer, lent to [`serve_ready`] while it drains.
    fn recv_buf(&mut self) -> &mut Vec<u8>;
}

/// A readable control connection `token` (`raw`, epoll events `ev`): every record
/// waiting is handed to `s` ([`drain_control`]); EOF or an error closes it.
pub fn serve_ready<S: ControlServer>(s: &mut S, token: u64, raw: RawFd, ev: u32) {
    let mut buf = std::mem::take(s.recv_buf());
    drain_control(raw, &mut buf, ev, |inbound| match inbound {
        Inbound::Message(m) => s.on_message(token, m),
        Inbound::Closed(why) => {
            s.close(token, &why);
            false
        }
        Inbound::Invalid(why) => {
            s.refuse(token, &why);
            false
        }
    });
    *s.recv_buf() = buf;
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

/// Receives one record and the fds attached to it (SCM_RIGHTS, up to 253), which
/// become ours (close-on-exec). `Ok((0, _))` means the peer closed.
pub fn recv_with_fds(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, bool, Vec<OwnedFd>)> {
    let r = ::sys::seqpacket::recv_record_raw(fd, buf, flags)?;
    Ok((r.len, r.truncated, r.fds))
}

/// Sets a large send buffer on a data connection: records wait there while the worker
/// catches up (root may exceed net.core.wmem_max).
pub fn set_sndbuf(fd: RawFd, bytes: libc::c_int) {
    ::sys::sockopt::set_send_buffer(fd, bytes.max(0) as usize);
}
