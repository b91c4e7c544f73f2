//! Parsing the control messages of a received datagram, from raw bytes (recvmsg's
//! control buffer or io_uring's RecvMsgOut control slice). Safe code only: every
//! header field is read with bounds checks.

use std::mem::size_of;
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

const HDR: usize = size_of::<libc::cmsghdr>();
const ALIGN: usize = size_of::<usize>();

fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

fn int_at(d: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(d.get(..4)?.try_into().ok()?))
}

/// Walks the cmsg list (CMSG_FIRSTHDR / CMSG_NXTHDR semantics, cmsg(3)).
pub fn parse(control: &[u8]) -> RecvMeta {
    let mut m = RecvMeta::default();
    let mut off = 0usize;
    while off + HDR <= control.len() {
        let h = &control[off..off + HDR];
        let len = usize::from_ne_bytes(h[..ALIGN].try_into().unwrap_or([0; ALIGN]));
        let level = i32::from_ne_bytes(h[ALIGN..ALIGN + 4].try_into().unwrap_or([0; 4]));
        let ty = i32::from_ne_bytes(h[ALIGN + 4..ALIGN + 8].try_into().unwrap_or([0; 4]));
        if len < HDR || len > control.len() - off {
            break;
        }
        let data = &control[off + align(HDR)..off + len.max(align(HDR))];
        match (level, ty) {
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
                if let Some(v) = int_at(data) {
                    m.ecn = (v & 0x03) as u8;
                }
            }
            // udp(7): UDP_GRO carries the segment size as an int.
            (libc::SOL_UDP, libc::UDP_GRO) => {
                if let Some(v) = int_at(data) {
                    if v > 0 && v <= i32::from(u16::MAX) {
                        m.gro_size = Some(v as u16);
                    }
                }
            }
            _ => {}
        }
        off += align(len);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(buf: &mut Vec<u8>, level: i32, ty: i32, data: &[u8]) {
        let len = HDR + data.len();
        buf.extend_from_slice(&len.to_ne_bytes());
        buf.extend_from_slice(&level.to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(data);
        while !buf.len().is_multiple_of(ALIGN) {
            buf.push(0);
        }
    }

    #[test]
    fn parses_v4_and_gro() {
        let mut b = Vec::new();
        push(&mut b, libc::IPPROTO_IP, libc::IP_PKTINFO, &[1, 0, 0, 0, 0, 0, 0, 0, 127, 0, 0, 2]);
        push(&mut b, libc::IPPROTO_IP, libc::IP_TOS, &[0x03]);
        push(&mut b, libc::SOL_UDP, libc::UDP_GRO, &1200i32.to_ne_bytes());
        let m = parse(&b);
        assert_eq!(m.local_ip, Some("127.0.0.2".parse().unwrap()));
        assert_eq!(m.ecn, 3);
        assert_eq!(m.gro_size, Some(1200));
        // Every truncation parses without panicking.
        for i in 0..b.len() {
            let _ = parse(&b[..i]);
        }
        // Garbage lengths do not loop or panic.
        let _ = parse(&[0xff; 64]);
        let _ = parse(&[0; 64]);
    }
}
