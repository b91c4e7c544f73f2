//! The shards' UDP sockets: one SO_REUSEPORT socket per (shard, listen address).

use anyhow::{Context, Result};
use socket2::{Domain, SockAddr, SockRef, Socket, Type};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use sys::sockopt::setsockopt_int;

/// Requested receive buffer per socket (best effort; root may force it).
const RCVBUF: usize = 8 << 20;

/// The address `fd` is bound to.
pub(crate) fn local_addr(fd: &OwnedFd) -> std::io::Result<SocketAddr> {
    SockRef::from(fd)
        .local_addr()?
        .as_socket()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an IP socket"))
}

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
    let fd: OwnedFd = Socket::new(Domain::for_address(addr), Type::DGRAM.nonblocking(), None)
        .with_context(|| format!("socket() for {addr}"))?
        .into();
    let raw = fd.as_raw_fd();
    setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
        .with_context(|| format!("setsockopt SO_REUSEPORT on {addr}"))?;
    if addr.is_ipv6() {
        setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)
            .with_context(|| format!("setsockopt IPV6_V6ONLY on {addr}"))?;
    }
    configure(&fd, addr)?;
    SockRef::from(&fd).bind(&SockAddr::from(addr)).with_context(|| format!("bind {addr}"))?;
    let local = local_addr(&fd).with_context(|| format!("getsockname after bind {addr}"))?;
    Ok(UdpSock { fd, local, listen_index })
}

/// The options of a shard socket that may be set before or after bind: a socket
/// bound by someone else (systemd's socket activation) gets them after.
pub fn configure(fd: &OwnedFd, addr: SocketAddr) -> Result<()> {
    let raw = fd.as_raw_fd();
    let opt = |level, name, value, what: &str| {
        setsockopt_int(raw, level, name, value).with_context(|| format!("setsockopt {what} on {addr}"))
    };
    // Linux udp(7): UDP_GRO — the kernel may coalesce a flow's datagrams into one
    // train; the segment size arrives as a (SOL_UDP, UDP_GRO) control message.
    opt(libc::SOL_UDP, libc::UDP_GRO, 1, "UDP_GRO")?;
    // The destination address per datagram only where the bound one does not say it:
    // a socket bound to one address receives only datagrams to that address, so its
    // shard uses the bound address (shard::Router::datagram) and the kernel is spared
    // a control message per receive (as nginx asks for it only on wildcard listeners).
    let wildcard = addr.ip().is_unspecified();
    if addr.is_ipv6() {
        // RFC 3542 §6.1 / §6.5: destination address and traffic class per datagram.
        if wildcard {
            opt(libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO")?;
        }
        opt(libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS")?;
    } else {
        if wildcard {
            opt(libc::IPPROTO_IP, libc::IP_PKTINFO, 1, "IP_PKTINFO")?;
        }
        opt(libc::IPPROTO_IP, libc::IP_RECVTOS, 1, "IP_RECVTOS")?;
    }
    // RFC 9000 §14: QUIC datagrams must not be fragmented; in IPv4 the DF bit is set.
    // PROBE: DF set, but sends are not limited by a cached path MTU (what the demux
    // sends — Retries, resets, Version Negotiation — is small). It also spares the
    // kernel choosing an IP ID per datagram.
    if addr.is_ipv6() {
        opt(libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_PROBE, "IPV6_MTU_DISCOVER")?;
    } else {
        opt(libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_PROBE, "IP_MTU_DISCOVER")?;
    }
    sys::sockopt::set_recv_buffer(fd, RCVBUF);
    Ok(())
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

/// Takes over sockets a parent (the controller) bound and left open across exec:
/// `fds` shard-major, `[shard][listen index]`. Each must be a bound UDP socket; the
/// addresses of one listen index must agree across shards. The fds become ours
/// (close-on-exec again, non-blocking).
pub fn from_inherited(fds: &[i32], shards: usize) -> Result<Vec<Vec<UdpSock>>> {
    use std::os::fd::FromRawFd;
    if shards == 0 || fds.is_empty() || fds.len() / shards * shards != fds.len() {
        anyhow::bail!("--inherit-fds: {} fds cannot be split over {} shards", fds.len(), shards);
    }
    let per = fds.len() / shards;
    for (i, fd) in fds.iter().enumerate() {
        if *fd < 3 || fds[..i].contains(fd) {
            anyhow::bail!("--inherit-fds: fd {fd} is invalid or listed twice");
        }
        // Validate before owning: a closed fd must not be wrapped in an OwnedFd.
        // SAFETY: F_GETFD only queries the descriptor table.
        if unsafe { libc::fcntl(*fd, libc::F_GETFD) } < 0 {
            anyhow::bail!("--inherit-fds: fd {fd} is not open");
        }
    }
    let mut out: Vec<Vec<UdpSock>> = Vec::with_capacity(shards);
    for shard in 0..shards {
        let mut v = Vec::with_capacity(per);
        for li in 0..per {
            let raw = fds[shard * per + li];
            // SAFETY: `raw` is open (checked above), listed once, and was passed to us
            // by our parent for us to own; nothing else in this process uses it.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let sock = SockRef::from(&fd);
            let ty = sock.r#type().with_context(|| format!("--inherit-fds: fd {raw} is not a socket"))?;
            if ty != Type::DGRAM {
                anyhow::bail!("--inherit-fds: fd {raw} is not a UDP socket");
            }
            sock.set_cloexec(true).context("F_SETFD")?;
            sock.set_nonblocking(true).context("F_SETFL")?;
            let local = local_addr(&fd).with_context(|| format!("getsockname on inherited fd {raw}"))?;
            if let Some(first) = out.first() {
                if first[li].local != local {
                    anyhow::bail!("--inherit-fds: shard {shard} serves {local} but shard 0 serves {}", first[li].local);
                }
            }
            v.push(UdpSock { fd, local, listen_index: li });
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_opt(fd: &OwnedFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt(2) into a live c_int of the size passed.
        let r = unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len) };
        assert_eq!(r, 0, "getsockopt {level}/{name}: {}", std::io::Error::last_os_error());
        v
    }

    /// DF on every socket (RFC 9000 §14); the destination address per datagram only
    /// where the bound address does not give it (a wildcard).
    #[test]
    fn df_everywhere_pktinfo_only_on_wildcards() {
        let specific = bind_udp("127.0.0.1:0".parse().unwrap(), 0).unwrap();
        let wildcard = bind_udp("0.0.0.0:0".parse().unwrap(), 0).unwrap();
        for s in [&specific, &wildcard] {
            assert_eq!(int_opt(&s.fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER), libc::IP_PMTUDISC_PROBE);
            assert_eq!(int_opt(&s.fd, libc::IPPROTO_IP, libc::IP_RECVTOS), 1, "ECN on both");
        }
        assert_eq!(int_opt(&specific.fd, libc::IPPROTO_IP, libc::IP_PKTINFO), 0);
        assert_eq!(int_opt(&wildcard.fd, libc::IPPROTO_IP, libc::IP_PKTINFO), 1);
        let v6 = bind_udp("[::1]:0".parse().unwrap(), 0).unwrap();
        assert_eq!(int_opt(&v6.fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER), libc::IPV6_PMTUDISC_PROBE);
        assert_eq!(int_opt(&v6.fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO), 0);
        let v6any = bind_udp("[::]:0".parse().unwrap(), 0).unwrap();
        assert_eq!(int_opt(&v6any.fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO), 1);
    }
}
