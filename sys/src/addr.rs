//! A socket address as the kernel wrote it (a recvmsg name, io_uring's RecvMsgOut
//! name), read from its bytes; every other conversion is `socket2::SockAddr`'s
//! (`SockAddr::from(SocketAddr)`, `SockAddr::as_socket`).

use crate::cvt;
use socket2::SockAddr;
use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// Decodes a `sockaddr_in` / `sockaddr_in6` from the first `b.len()` bytes the kernel
/// wrote. `None` for another family or fewer bytes than the family's struct. Fields
/// as std and socket2 read them: the port in network order, `sin6_flowinfo` and
/// `sin6_scope_id` as stored.
pub fn sockaddr_from_bytes(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([*b.first()?, *b.get(1)?]);
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match libc::c_int::from(family) {
        libc::AF_INET if b.len() >= size_of::<libc::sockaddr_in>() => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        libc::AF_INET6 if b.len() >= size_of::<libc::sockaddr_in6>() => {
            let flow = u32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope)))
        }
        _ => None,
    }
}

/// bind(2) of a descriptor held as a raw number (the kernel fast path's sockets) to
/// `addr`; a socket held as `AsFd` binds with `socket2::SockRef::bind`.
pub fn bind(fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
    let a = SockAddr::from(*addr);
    // SAFETY: `a` holds an initialised sockaddr of `a.len()` bytes for the whole call.
    cvt(unsafe { libc::bind(fd, a.as_ptr().cast(), a.len()) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(a: &SockAddr) -> Vec<u8> {
        // SAFETY: `a` is a live sockaddr_storage of which the first `a.len()` bytes
        // are initialised.
        unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), a.len() as usize) }.to_vec()
    }

    /// Addresses of both families with every field varied: edge ports, and bytes,
    /// flow labels and scope ids from a fixed xorshift sequence.
    fn addresses() -> Vec<SocketAddr> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut v = Vec::new();
        for port in [0, 1, 443, 0x1234, 65535] {
            for _ in 0..20 {
                let r = next();
                v.push(SocketAddr::from(((r as u32).to_be_bytes(), port)));
                let ip = (u128::from(r) << 64 | u128::from(next())).to_be_bytes();
                v.push(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, (r >> 32) as u32, next() as u32)));
            }
        }
        v
    }

    /// The model is socket2: what `SockAddr::from` writes decodes to the address it was
    /// made from, and every shorter prefix decodes to nothing.
    #[test]
    fn decodes_what_socket2_encodes() {
        for addr in addresses() {
            let b = bytes_of(&SockAddr::from(addr));
            assert_eq!(sockaddr_from_bytes(&b), Some(addr));
            assert_eq!(SockAddr::from(addr).as_socket(), Some(addr));
            for cut in 0..b.len() {
                assert_eq!(sockaddr_from_bytes(&b[..cut]), None, "{addr} cut at {cut}");
            }
        }
    }

    #[test]
    fn other_families_are_none() {
        let unix = SockAddr::unix("/tmp/x.sock").unwrap();
        assert_eq!(sockaddr_from_bytes(&bytes_of(&unix)), None);
        assert_eq!(sockaddr_from_bytes(&[]), None);
    }

    #[test]
    fn bind_takes_the_address() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        use std::os::fd::AsRawFd;
        bind(s.as_raw_fd(), &"127.0.0.1:0".parse().unwrap()).unwrap();
        let local = s.local_addr().unwrap().as_socket().unwrap();
        assert_eq!(local.ip(), Ipv4Addr::LOCALHOST);
        assert_ne!(local.port(), 0);
    }
}
