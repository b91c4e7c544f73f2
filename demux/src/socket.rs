//! The shards' UDP sockets: one SO_REUSEPORT socket per (shard, listen address).

use crate::sys::{self, cvt, owned, setsockopt_int};
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

/// Requested receive buffer per socket (best effort; root may force it).
const RCVBUF: libc::c_int = 8 << 20;

/// One bound UDP socket of a shard.
#[derive(Debug)]
pub struct UdpSock {
    pub fd: OwnedFd,
    /// The address actually bound (port resolved when `--listen` said 0).
    pub local: SocketAddr,
    /// Index of the listen address this socket serves (order of `--listen`).
    #[allow(dead_code)]
    pub listen_index: usize,
}

/// Creates, configures and binds one socket. Options are set before bind so the
/// first datagram already carries its control messages.
pub fn bind_udp(addr: SocketAddr, listen_index: usize) -> Result<UdpSock> {
    let domain = if addr.is_ipv6() { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain syscall.
    let fd = owned(unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })
        .with_context(|| format!("socket() for {addr}"))?;
    let raw = fd.as_raw_fd();
    let opt = |level, name, value, what: &str| {
        setsockopt_int(raw, level, name, value).with_context(|| format!("setsockopt {what} on {addr}"))
    };
    opt(libc::SOL_SOCKET, libc::SO_REUSEPORT, 1, "SO_REUSEPORT")?;
    // Linux udp(7): UDP_GRO — the kernel may coalesce a flow's datagrams into one
    // train; the segment size arrives as a (SOL_UDP, UDP_GRO) control message.
    opt(libc::SOL_UDP, libc::UDP_GRO, 1, "UDP_GRO")?;
    if addr.is_ipv6() {
        opt(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY")?;
        // RFC 3542 §6.1 / §6.5: destination address and traffic class per datagram.
        opt(libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO")?;
        opt(libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS")?;
    } else {
        opt(libc::IPPROTO_IP, libc::IP_PKTINFO, 1, "IP_PKTINFO")?;
        opt(libc::IPPROTO_IP, libc::IP_RECVTOS, 1, "IP_RECVTOS")?;
    }
    if setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF).is_err() {
        let _ = setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF);
    }
    let (ss, len) = sys::to_sockaddr(&addr);
    // SAFETY: ss/len describe a valid sockaddr of the socket's family.
    cvt(unsafe { libc::bind(raw, (&ss as *const libc::sockaddr_storage).cast(), len) })
        .with_context(|| format!("bind {addr}"))?;
    let local = sys::local_addr(&fd).with_context(|| format!("getsockname after bind {addr}"))?;
    Ok(UdpSock { fd, local, listen_index })
}

/// Binds `shards` sockets for every listen address. With port 0 the first socket
/// picks the port and the others join its reuseport group on it.
/// Result: `[shard][listen index]`.
pub fn bind_all(listen: &[SocketAddr], shards: usize) -> Result<Vec<Vec<UdpSock>>> {
    let mut per_shard: Vec<Vec<UdpSock>> = (0..shards).map(|_| Vec::with_capacity(listen.len())).collect();
    for (li, &addr) in listen.iter().enumerate() {
        let mut resolved = addr;
        for shard in per_shard.iter_mut() {
            let s = bind_udp(resolved, li)?;
            resolved = s.local;
            shard.push(s);
        }
    }
    Ok(per_shard)
}
