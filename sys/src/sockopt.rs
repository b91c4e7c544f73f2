//! The socket options socket2 and rustix do not cover (every other one is set with
//! `socket2::SockRef` or `rustix::net::sockopt` where it is needed): any `int` option
//! (UDP_GRO, IP_PKTINFO, SO_ATTACH_REUSEPORT_EBPF …), a buffer size forced past the
//! sysctl limit with a fallback, SO_PEERCRED with a pid that may be 0, SO_MEMINFO.

use crate::cvt;
use rustix::net::sockopt;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd};

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

/// getsockopt(2) of an `int` option (the reading side of [`setsockopt_int`]).
pub fn getsockopt_int(fd: impl AsRawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes and `len` holds the size of `v`.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len) })?;
    Ok(v)
}

/// A `bytes` send buffer; as root SO_SNDBUFFORCE passes net.core.wmem_max (best effort).
pub fn set_send_buffer(fd: impl AsFd, bytes: usize) {
    let bytes = bytes.min(i32::MAX as usize);
    if sockopt::set_socket_send_buffer_size_force(&fd, bytes).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(&fd, bytes);
    }
}

/// A `bytes` receive buffer; as root SO_RCVBUFFORCE passes net.core.rmem_max (best effort).
pub fn set_recv_buffer(fd: impl AsFd, bytes: usize) {
    let bytes = bytes.min(i32::MAX as usize);
    if sockopt::set_socket_recv_buffer_size_force(&fd, bytes).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(&fd, bytes);
    }
}

/// The credentials (pid, uid, gid) of the process at the other end of a connected
/// Unix socket, as the kernel recorded them at connect(2) time (SO_PEERCRED, unix(7)):
/// nothing the peer sends can change them. (Not rustix's `socket_peercred`: its pid is
/// non-zero, but the kernel reports 0 for a peer outside our pid namespace.)
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
        socket2::SockRef::from(&rx).set_recv_buffer_size(4096).expect("SO_RCVBUF");
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
