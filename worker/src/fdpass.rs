//! Unix SOCK_SEQPACKET plumbing for the data connection: the `sys` crate's
//! (connect, one record out, one record in with SCM_RIGHTS descriptors, a batch of
//! records in), under the names this crate has always used, plus the tokio
//! registration of an owned descriptor.

use std::io;
use std::os::fd::OwnedFd;

pub use sys::seqpacket::{
    accept as seqpacket_accept, connect as seqpacket_connect, pair as seqpacket_pair, recv_batch, recv_record,
    send_record, Received, MAX_BATCH, MAX_FDS,
};
pub use sys::sockopt::{is_nonblocking, set_nonblocking, socket_type};

/// Binds and listens on `path` (tests and in-process forwarders).
pub fn seqpacket_listen(path: &std::path::Path) -> io::Result<OwnedFd> {
    sys::seqpacket::listen(path, 64)
}

/// Sets SO_RCVTIMEO (blocking receives give up with `WouldBlock` after `t`).
pub fn set_recv_timeout(fd: std::os::fd::BorrowedFd<'_>, t: Option<std::time::Duration>) -> io::Result<()> {
    sys::sockopt::set_recv_timeout(fd, t)
}

/// Registers an owned descriptor with the tokio reactor for `interest`. Must run
/// inside a tokio runtime.
pub fn async_fd(fd: OwnedFd, interest: tokio::io::Interest) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that always returns the same
    // raw fd and stays open until the `AsyncFd` (which owns it) drops it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}
