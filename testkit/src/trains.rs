//! Packet trains: several datagrams of one 4-tuple that the kernel hands around as
//! one skb. [`send_gso`] makes one with a UDP GSO send (`UDP_SEGMENT`, udp(7)): on
//! loopback it reaches the receiving socket's lookup whole. [`send_batch`] sends
//! separate datagrams with one `sendmmsg(2)`, which a receiving veth with GRO may
//! coalesce into one. Both send on a connected socket (no address per message).
//! [`set_gro`] and [`recv_segments`] receive trains whole and cut them, as quinn
//! and the data plane do.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

/// udp(7) `UDP_SEGMENT` (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
/// udp(7) `UDP_GRO` (linux/udp.h).
const UDP_GRO: libc::c_int = 104;

/// Asks the kernel to hand `sock` GRO trains whole (udp(7) `UDP_GRO`), with the
/// segment size in a control message ([`recv_segments`]); `false` turns it off again
/// (the kernel then cuts trains before they reach the socket).
pub fn set_gro(sock: &UdpSocket, on: bool) -> io::Result<()> {
    let one = libc::c_int::from(on);
    // SAFETY: a live socket; the value is a c_int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One receive on `sock` (blocking or not, as the socket is): the datagrams it
/// carried (a GRO train cut at its `UDP_GRO` segment size, else one) and the sender.
pub fn recv_segments(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<(Vec<Vec<u8>>, SocketAddr)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: sockaddr_storage is plain data.
    let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut control = [0u64; 8]; // room for one int cmsg, aligned for cmsghdr
                                 // SAFETY: msghdr is plain data; every pointer set below stays live until recvmsg
                                 // returns.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: a live socket and a msghdr whose buffers outlive the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    let mut segment = n;
    // SAFETY: the kernel filled msg_control (msg_controllen bytes); CMSG_FIRSTHDR /
    // CMSG_NXTHDR walk only within it, and an int is read only from a UDP_GRO cmsg.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                segment = usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(n);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    // An empty datagram is one segment too.
    let segments =
        if n == 0 { vec![Vec::new()] } else { buf[..n].chunks(segment.max(1)).map(<[u8]>::to_vec).collect() };
    Ok((segments, sockaddr(&from)?))
}

fn sockaddr(s: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: ss_family says the storage holds a sockaddr_in.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: ss_family says the storage holds a sockaddr_in6.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(a.sin6_port), a.sin6_flowinfo, a.sin6_scope_id)))
        }
        f => Err(io::Error::other(format!("address family {f}"))),
    }
}

/// Sends `segments` as one UDP GSO datagram on the connected `sock`: every segment
/// but the last must be `segments[0].len()` bytes, the last at most that; the kernel
/// cuts the payload every `segments[0].len()` bytes.
pub fn send_gso(sock: &UdpSocket, segments: &[Vec<u8>]) -> io::Result<()> {
    let Some(first) = segments.first() else { return Ok(()) };
    let size = u16::try_from(first.len()).map_err(|_| io::Error::other("segment over 64 KiB"))?;
    let (last, body) = segments.split_last().unwrap_or((first, &[]));
    if body.iter().any(|s| s.len() != first.len()) || last.len() > first.len() || last.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "segments of unequal size"));
    }
    let payload: Vec<u8> = segments.concat();
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)]; // u64s: aligned for cmsghdr
                                                     // SAFETY: msghdr is plain data; every pointer set below stays live until sendmsg
                                                     // returns.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` zeroed bytes, enough for one cmsghdr
    // carrying a u16; CMSG_FIRSTHDR/CMSG_DATA stay within it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), size);
    }
    // SAFETY: a live socket and a msghdr whose buffers outlive the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != payload.len() {
        return Err(io::Error::other(format!("GSO send took {n} of {} bytes", payload.len())));
    }
    Ok(())
}

/// Sends every datagram of `datagrams` on the connected `sock` with as few
/// `sendmmsg(2)` calls as it takes.
pub fn send_batch(sock: &UdpSocket, datagrams: &[Vec<u8>]) -> io::Result<()> {
    let mut iovs: Vec<libc::iovec> =
        datagrams.iter().map(|d| libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() }).collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: mmsghdr is plain data; the iovec it points at outlives the call.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let mut done = 0;
    while done < msgs.len() {
        let rest = &mut msgs[done..];
        // SAFETY: a live socket and `rest.len()` initialised mmsghdrs whose buffers
        // outlive the call.
        let n = unsafe { libc::sendmmsg(sock.as_raw_fd(), rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GSO send arrives as its segments; a batch as its datagrams.
    #[test]
    fn gso_segments_and_batches_arrive_as_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let segs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; if i == 4 { 300 } else { 1000 }]).collect();
        send_gso(&tx, &segs).unwrap();
        send_batch(&tx, &[vec![7; 10], vec![8; 20]]).unwrap();
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        for _ in 0..7 {
            let n = rx.recv(&mut buf).unwrap();
            got.push(buf[..n].to_vec());
        }
        let want: Vec<Vec<u8>> = segs.into_iter().chain([vec![7; 10], vec![8; 20]]).collect();
        assert_eq!(got, want);
        assert!(send_gso(&tx, &[vec![1; 10], vec![2; 11]]).is_err(), "a longer last segment is refused");
    }

    /// A socket with UDP_GRO gets a loopback GSO train whole; recv_segments cuts it.
    #[test]
    fn gro_socket_gets_trains_whole_and_recv_segments_cuts_them() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_gro(&rx, true).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.2:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let segs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; if i == 3 { 100 } else { 700 }]).collect();
        send_gso(&tx, &segs).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut raw = [0u8; 4096];
        // A plain recv would get all 2200 bytes in one piece.
        let (got, from) = recv_segments(&rx, &mut buf).unwrap();
        assert_eq!((got, from), (segs.clone(), tx.local_addr().unwrap()));
        send_gso(&tx, &segs).unwrap();
        assert_eq!(rx.recv(&mut raw).unwrap(), 2200, "one train, one receive");
    }
}
