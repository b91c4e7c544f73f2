//! What the control messages of a received datagram say, from raw bytes (recvmsg's
//! control buffer or io_uring's RecvMsgOut control slice), walked by
//! `sys::cmsg::iter`. Safe code only: every field is read with bounds checks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What the control messages tell about one datagram (or GRO train).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// The destination address of the IP header (IP_PKTINFO ipi_addr / IPV6_PKTINFO).
    pub local_ip: Option<IpAddr>,
    /// RFC 3168 ECN codepoint (low two bits of TOS / traffic class).
    pub ecn: u8,
    /// UDP_GRO segment size: the payload is a train of segments of this stride.
    pub gro_size: Option<u16>,
}

/// Reads the control messages of one datagram (`sys::cmsg::iter`).
pub fn parse(control: &[u8]) -> RecvMeta {
    let mut m = RecvMeta::default();
    for c in sys::cmsg::iter(control) {
        let data = c.data;
        match (c.level, c.ty) {
            // ip(7) IP_PKTINFO: struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data.len() >= 12 => {
                m.local_ip = Some(IpAddr::V4(Ipv4Addr::new(data[8], data[9], data[10], data[11])));
            }
            // ip(7) IP_RECVTOS delivers IP_TOS with one byte.
            (libc::IPPROTO_IP, libc::IP_TOS) if !data.is_empty() => m.ecn = data[0] & 0x03,
            // RFC 3542 §6.1: struct in6_pktinfo { in6_addr addr; unsigned ifindex; }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if data.len() >= 16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(&data[..16]);
                m.local_ip = Some(IpAddr::V6(Ipv6Addr::from(a)));
            }
            // RFC 3542 §6.5: traffic class as an int.
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                if let Some(v) = c.int() {
                    m.ecn = (v & 0x03) as u8;
                }
            }
            // udp(7): UDP_GRO carries the segment size as an int.
            (libc::SOL_UDP, libc::UDP_GRO) => {
                if let Some(v) = c.int() {
                    if v > 0 && v <= i32::from(u16::MAX) {
                        m.gro_size = Some(v as u16);
                    }
                }
            }
            _ => {}
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_gro() {
        let mut b = [0u8; 128];
        let mut e = sys::cmsg::Encoder::new(&mut b);
        e.push(libc::IPPROTO_IP, libc::IP_PKTINFO, &[1, 0, 0, 0, 0, 0, 0, 0, 127, 0, 0, 2]).unwrap();
        e.push(libc::IPPROTO_IP, libc::IP_TOS, &[0x03]).unwrap();
        e.push(libc::SOL_UDP, libc::UDP_GRO, &1200i32.to_ne_bytes()).unwrap();
        let n = e.len();
        let b = &b[..n];
        let m = parse(b);
        assert_eq!(m.local_ip, Some("127.0.0.2".parse().unwrap()));
        assert_eq!(m.ecn, 3);
        assert_eq!(m.gro_size, Some(1200));
        // Every truncation parses without panicking.
        for i in 0..b.len() {
            let _ = parse(&b[..i]);
        }
        // The last message cut inside its int (its padding is 4 bytes): the first two
        // still read.
        let cut = parse(&b[..n - 5]);
        assert_eq!((cut.local_ip, cut.ecn, cut.gro_size), (m.local_ip, 3, None));
        // Garbage lengths do not loop or panic.
        let _ = parse(&[0xff; 64]);
        let _ = parse(&[0; 64]);
    }
}
