//! Thin, checked wrappers over the libc calls the data plane needs. Every `unsafe`
//! block is small and says why it is sound.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `-1` → the last OS error.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn cvt_isize(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Takes ownership of a descriptor a syscall just returned.
pub fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: `fd` was just returned by the kernel, is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A `sockaddr_storage` for `addr`, with its length.
pub fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Decodes a socket address from raw `sockaddr` bytes (as the kernel wrote them:
/// recvmsg name, io_uring RecvMsgOut name). `None` for other families or short input.
pub fn sockaddr_from_bytes(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([*b.first()?, *b.get(1)?]);
    match libc::c_int::from(family) {
        libc::AF_INET if b.len() >= size_of::<libc::sockaddr_in>() => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        libc::AF_INET6 if b.len() >= size_of::<libc::sockaddr_in6>() => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope)))
        }
        _ => None,
    }
}

/// Bytes of a `sockaddr_storage` the kernel filled in.
pub fn storage_bytes(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> &[u8] {
    let len = (len as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: `ss` is a live sockaddr_storage; we view at most its size in bytes.
    unsafe { std::slice::from_raw_parts((ss as *const libc::sockaddr_storage).cast::<u8>(), len) }
}

pub fn local_addr(fd: &impl AsRawFd) -> io::Result<SocketAddr> {
    // SAFETY: all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: ss/len are live and sized correctly.
    cvt(unsafe { libc::getsockname(fd.as_raw_fd(), (&mut ss as *mut libc::sockaddr_storage).cast(), &mut len) })?;
    sockaddr_from_bytes(storage_bytes(&ss, len))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "getsockname: not an IP socket"))
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

/// A Linux epoll instance.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall.
        Ok(Epoll { fd: owned(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })? })
    }
    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a live epoll_event.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
    }
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: ev is a live epoll_event (ignored by DEL on modern kernels).
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) }).map(drop)
    }
    /// Waits; returns the number of events written to `events`.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        let max = events.len().min(i32::MAX as usize) as libc::c_int;
        // SAFETY: the kernel writes at most `max` events into the live slice.
        let r = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        match cvt(r) {
            Ok(n) => Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// The credentials (pid, uid, gid) of the process at the other end of a connected
/// Unix socket, as the kernel recorded them at connect(2) time (SO_PEERCRED, unix(7)):
/// nothing the peer sends can change them.
pub fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `cred`.
    cvt(unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    })?;
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short SO_PEERCRED"));
    }
    Ok(cred)
}
