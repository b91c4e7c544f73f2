//! The tokio registration of an owned descriptor (data connection, control
//! connection, fast-path sockets, ring eventfds).

use std::io;
use std::os::fd::OwnedFd;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Registers `fd` with the tokio reactor for `interest`. Must run inside a tokio
/// runtime.
pub fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that always returns the same
    // raw fd and stays open until the `AsyncFd` (which owns it) drops it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}
