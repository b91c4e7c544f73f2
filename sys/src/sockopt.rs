//! Socket options and descriptor flags.

use crate::cvt;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// setsockopt(2) with an `int` value.
pub fn setsockopt_int(fd: impl AsRawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn setsockopt_timeval(fd: impl AsRawFd, name: libc::c_int, t: Option<Duration>) -> io::Result<()> {
    let tv = match t {
        Some(t) => libc::timeval {
            tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
            // A zero timeout would mean "none": round it up to 1 µs.
            tv_usec: t.subsec_micros().max(u32::from(t.is_zero())) as libc::suseconds_t,
        },
        None => libc::timeval { tv_sec: 0, tv_usec: 0 },
    };
    // SAFETY: `tv` is a valid timeval that outlives the call; the length matches it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// SO_RCVTIMEO: blocking receives give up with `WouldBlock` after `t` (`None`: never).
pub fn set_recv_timeout(fd: impl AsRawFd, t: Option<Duration>) -> io::Result<()> {
    setsockopt_timeval(fd, libc::SO_RCVTIMEO, t)
}

/// SO_SNDTIMEO: blocking sends give up with `WouldBlock` after `t` (`None`: never).
pub fn set_send_timeout(fd: impl AsRawFd, t: Option<Duration>) -> io::Result<()> {
    setsockopt_timeval(fd, libc::SO_SNDTIMEO, t)
}

/// A `bytes` send buffer; as root SO_SNDBUFFORCE passes net.core.wmem_max (best effort).
pub fn set_send_buffer(fd: impl AsRawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    let fd = fd.as_raw_fd();
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v);
    }
}

/// A `bytes` receive buffer; as root SO_RCVBUFFORCE passes net.core.rmem_max (best effort).
pub fn set_recv_buffer(fd: impl AsRawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    let fd = fd.as_raw_fd();
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
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

/// The socket type (SO_TYPE) of a descriptor, e.g. `libc::SOCK_DGRAM`.
pub fn socket_type(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)
}

/// getsockopt(2) of an `int` option.
pub fn getsockopt_int(fd: impl AsRawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes and `len` holds the size of `v`.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len) })?;
    Ok(v)
}

/// The credentials (pid, uid, gid) of the process at the other end of a connected
/// Unix socket, as the kernel recorded them at connect(2) time (SO_PEERCRED, unix(7)):
/// nothing the peer sends can change them.
pub fn peer_cred(fd: std::os::fd::RawFd) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `cred`.
    crate::cvt(unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    })?;
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "short SO_PEERCRED"));
    }
    Ok(cred)
}

/// The datagrams the kernel dropped on this socket since it was created: its
/// `sk_drops` (receive queue full, or no memory), from SO_MEMINFO (socket(7)).
pub fn kernel_drops(fd: impl AsRawFd) -> io::Result<u32> {
    /// SK_MEMINFO_VARS (linux/sock_diag.h): the length of the SO_MEMINFO array.
    const VARS: usize = 9;
    let mut info = [0u32; VARS];
    let mut len = size_of::<[u32; VARS]>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `info`, which is that long.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MEMINFO, info.as_mut_ptr().cast(), &mut len)
    })?;
    let at = libc::SK_MEMINFO_DROPS as usize;
    if (len as usize) < (at + 1) * size_of::<u32>() {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "SO_MEMINFO without a drop count"));
    }
    Ok(info[at])
}

#[cfg(test)]
mod kernel_drops_tests {
    use super::kernel_drops;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// A receiver with a small buffer that nobody reads: every datagram sent to it is
    /// either queued (and read back afterwards) or dropped and counted, exactly.
    #[test]
    fn queued_plus_dropped_is_everything_sent() {
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        super::setsockopt_int(rx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096).expect("SO_RCVBUF");
        let tx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert_eq!(kernel_drops(rx.as_raw_fd()).expect("SO_MEMINFO"), 0);
        let sent = 200u32;
        for _ in 0..sent {
            tx.send_to(&[7u8; 1000], rx.local_addr().expect("addr")).expect("send");
        }
        rx.set_nonblocking(true).expect("nonblocking");
        let mut got = 0u32;
        let mut buf = [0u8; 2000];
        while rx.recv(&mut buf).is_ok() {
            got += 1;
        }
        let dropped = kernel_drops(rx.as_raw_fd()).expect("SO_MEMINFO");
        assert!(got > 0 && dropped > 0, "a 4 KiB buffer queues some and drops most: got {got}, dropped {dropped}");
        assert_eq!(got + dropped, sent);
    }
}
