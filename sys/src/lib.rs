//! The Linux system calls quicdemux needs beyond std, socket2 and rustix, written once
//! for demux, worker, bench, udpflood and fastpath. Every function is small and every
//! `unsafe` block carries a `// SAFETY:` note; `proto` (the sans-IO core) stays free of
//! `unsafe`.
//!
//! - [`seqpacket`]: AF_UNIX SOCK_SEQPACKET connect / listen / accept, one record in or
//!   out with SCM_RIGHTS descriptors, and [`seqpacket::Channel`], a connection typed by
//!   its conversation (`proto::wire`).
//! - [`mmsg`]: recvmmsg / sendmmsg batches over preallocated headers, iovecs, names and
//!   control buffers (the only place they are called).
//! - [`cmsg`]: control messages read and written as bytes (pktinfo, UDP_SEGMENT,
//!   SCM_RIGHTS).
//! - [`control`]: one admin request, one reply on a control socket, under [`control::REPLY_TIMEOUT`].
//! - [`protocol`]: this process's protocol window (the versions it announces and reads).
//! - [`sockopt`]: the socket options socket2 and rustix lack (any int option, forced
//!   buffer sizes, SO_PEERCRED, SO_MEMINFO).
//! - [`addr`]: a socket address from the bytes the kernel wrote.
//! - [`raw`]: raw IPv4 / IPv6 sockets that send UDP with any source (forwarded datagrams).
//! - [`ring`]: the memfd mapping of a forwarding ring (index arithmetic: `proto::ring`).
//! - [`epoll`], [`signals`]: an epoll instance; blocked signals and signalfd.
//! - [`logging`]: stderr logging as text or JSON, journald-aware, reloadable filter.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

pub mod addr;
pub mod cmsg;
pub mod control;
pub mod epoll;
pub mod logging;
pub mod mmsg;
pub mod protocol;
pub mod raw;
pub mod ring;
pub mod seqpacket;
pub mod signals;
pub mod sockopt;

pub use epoll::Epoll;

/// `-1` (any negative result) → the last OS error.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A negative byte count → the last OS error.
pub fn cvt_isize(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Takes ownership of a descriptor a syscall just returned (or its error).
pub fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: `fd` was just returned by the kernel, is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Fills `buf` from the OS CSPRNG (getrandom(2)).
pub fn os_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: writes at most rest.len() bytes into a live buffer.
        let r = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match cvt_isize(r) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}
