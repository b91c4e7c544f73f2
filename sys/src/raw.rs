//! Raw IPv4 and IPv6 sockets that deliver a UDP datagram with any source address:
//! how a host hands a datagram forwarded by another host (docs/adr/0005) to its own
//! stack, so it reaches the owning worker (kernel fast path or data plane) exactly as
//! if the client had sent it here. Root (CAP_NET_RAW) only.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};

/// IPv4 (20 bytes, no options) and UDP (8 bytes) headers.
pub const HEADERS: usize = 20 + 8;

/// Writes an IPv4/UDP packet from `src` to `dst` carrying `payload` into `out`
/// (cleared first). RFC 791 header with DF set and TTL 64; the kernel fills the
/// header checksum and the id (raw(7), IP_HDRINCL). The UDP checksum is 0: "no
/// checksum", allowed over IPv4 (RFC 768), and the packet never leaves this host.
/// `None` when the payload does not fit one IPv4 packet.
pub fn ipv4_udp_packet(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let total = u16::try_from(HEADERS + payload.len()).ok()?;
    let udp_len = total - 20;
    out.clear();
    out.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
    out[2..4].copy_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&src.ip().octets());
    out.extend_from_slice(&dst.ip().octets());
    put_udp(out, src.port(), dst.port(), udp_len, payload);
    Some(())
}

/// RFC 768: the UDP header (checksum 0, to be filled by the caller where needed)
/// and the payload, appended to `out`.
fn put_udp(out: &mut Vec<u8>, src_port: u16, dst_port: u16, udp_len: u16, payload: &[u8]) {
    out.extend_from_slice(&src_port.to_be_bytes());
    out.extend_from_slice(&dst_port.to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
}

/// IPv6 (40 bytes, no extension headers) and UDP (8 bytes) headers.
pub const HEADERS_V6: usize = 40 + 8;

/// Writes an IPv6/UDP packet from `src` to `dst` carrying `payload` into `out`
/// (cleared first): RFC 8200 §3 header, traffic class and flow label 0, hop limit
/// 64; the UDP checksum over the RFC 8200 §8.1 pseudo-header, which IPv6 requires
/// (0 is sent as 0xffff, RFC 768). `None` when the payload does not fit one packet
/// without a jumbogram.
pub fn ipv6_udp_packet(src: SocketAddrV6, dst: SocketAddrV6, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let udp_len = u16::try_from(8 + payload.len()).ok()?;
    out.clear();
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[libc::IPPROTO_UDP as u8, 64]);
    out.extend_from_slice(&src.ip().octets());
    out.extend_from_slice(&dst.ip().octets());
    put_udp(out, src.port(), dst.port(), udp_len, payload);
    // RFC 8200 §8.1: source, destination, upper-layer length (32 bits), three zero
    // bytes and the next header, then the UDP header and data.
    let mut sum = ones_complement_sum(0, &out[8..40]);
    sum = ones_complement_sum(sum, &u32::from(udp_len).to_be_bytes());
    sum = ones_complement_sum(sum, &[0, 0, 0, libc::IPPROTO_UDP as u8]);
    sum = ones_complement_sum(sum, &out[40..]);
    let check = match !fold(sum) {
        0 => 0xffff,
        c => c,
    };
    out[46..48].copy_from_slice(&check.to_be_bytes());
    Some(())
}

/// RFC 1071: the 32-bit running sum of `data` as big-endian 16-bit words (an odd
/// last byte padded with zero), added to `sum`.
fn ones_complement_sum(mut sum: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([w[0], w[1]])));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if let [b] = words.remainder() {
        sum = sum.wrapping_add(u32::from(*b) << 8);
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// RFC 1071: the running sum folded to 16 bits (end-around carry).
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// `socket(AF_INET6, SOCK_RAW, IPPROTO_RAW)` with IPV6_HDRINCL: sends whole IPv6
/// packets (raw(7), ipv6(7)).
pub struct RawIpv6(Socket);

impl RawIpv6 {
    pub fn open() -> io::Result<RawIpv6> {
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::from(libc::IPPROTO_RAW)))?;
        // IPPROTO_RAW implies it on Linux; set it explicitly all the same.
        s.set_header_included_v6(true)?;
        Ok(RawIpv6(s))
    }

    /// Sends one packet built by [`ipv6_udp_packet`] towards `dst`. (A raw IPv6
    /// socket reads the address's port as a protocol number: it is sent as 0.)
    pub fn send(&self, packet: &[u8], dst: SocketAddrV6) -> io::Result<()> {
        let to = SocketAddrV6::new(*dst.ip(), 0, 0, dst.scope_id());
        send_to(&self.0, packet, to.into())
    }
}

/// sendto(2) of one whole packet.
fn send_to(s: &Socket, packet: &[u8], dst: SocketAddr) -> io::Result<()> {
    let n = s.send_to(packet, &SockAddr::from(dst))?;
    if n != packet.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "raw send was short"));
    }
    Ok(())
}

/// `socket(AF_INET, SOCK_RAW, IPPROTO_RAW)`: sends whole IPv4 packets.
pub struct RawIpv4(Socket);

impl RawIpv4 {
    pub fn open() -> io::Result<RawIpv4> {
        Ok(RawIpv4(Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(libc::IPPROTO_RAW)))?))
    }

    /// Sends one packet built by [`ipv4_udp_packet`] towards `dst`.
    pub fn send(&self, packet: &[u8], dst: SocketAddrV4) -> io::Result<()> {
        send_to(&self.0, packet, dst.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, UdpSocket};

    #[test]
    fn headers_are_rfc_791_and_768() {
        let mut p = Vec::new();
        let src = SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 2), 50000);
        let dst = SocketAddrV4::new(Ipv4Addr::new(198, 19, 9, 9), 443);
        ipv4_udp_packet(src, dst, b"quic", &mut p).expect("fits");
        assert_eq!(p.len(), 32);
        assert_eq!(&p[..4], &[0x45, 0, 0, 32]);
        assert_eq!((p[6], p[8], p[9]), (0x40, 64, 17));
        assert_eq!((&p[12..16], &p[16..20]), (&[198, 18, 1, 2][..], &[198, 19, 9, 9][..]));
        assert_eq!(&p[20..28], &[0xc3, 0x50, 0x01, 0xbb, 0, 12, 0, 0]);
        assert_eq!(&p[28..], b"quic");
        assert!(ipv4_udp_packet(src, dst, &vec![0; 65536], &mut p).is_none());
    }

    /// The slow, obviously right checksum: RFC 768's one's-complement sum of 16-bit
    /// words over the RFC 8200 §8.1 pseudo-header and the UDP header and data.
    fn model_udp6_checksum(src: &[u8; 16], dst: &[u8; 16], udp: &[u8]) -> u16 {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(src);
        bytes.extend_from_slice(dst);
        bytes.extend_from_slice(&(udp.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&[0, 0, 0, 17]);
        bytes.extend_from_slice(udp);
        if bytes.len() % 2 == 1 {
            bytes.push(0);
        }
        let mut sum: u64 = bytes.chunks(2).map(|w| u64::from(u16::from_be_bytes([w[0], w[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        match !(sum as u16) {
            0 => 0xffff,
            c => c,
        }
    }

    #[test]
    fn v6_headers_are_rfc_8200_with_the_udp_checksum() {
        use std::net::Ipv6Addr;
        let src = SocketAddrV6::new(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7), 50000, 0, 0);
        let dst = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 443, 0, 0);
        let mut p = Vec::new();
        for payload in [&b"quic"[..], b"odd", b"", &[0xff; 1201][..]] {
            ipv6_udp_packet(src, dst, payload, &mut p).expect("fits");
            assert_eq!(p.len(), HEADERS_V6 + payload.len());
            assert_eq!(&p[..4], &[0x60, 0, 0, 0], "version 6, no class or label");
            assert_eq!(u16::from_be_bytes([p[4], p[5]]) as usize, 8 + payload.len(), "payload length");
            assert_eq!((p[6], p[7]), (17, 64), "UDP, hop limit 64");
            assert_eq!((&p[8..24], &p[24..40]), (&src.ip().octets()[..], &dst.ip().octets()[..]));
            assert_eq!(&p[40..44], &[0xc3, 0x50, 0x01, 0xbb]);
            assert_eq!(u16::from_be_bytes([p[44], p[45]]) as usize, 8 + payload.len());
            let mut udp = p[40..].to_vec();
            udp[6..8].copy_from_slice(&[0, 0]);
            let want = model_udp6_checksum(&src.ip().octets(), &dst.ip().octets(), &udp);
            assert_eq!(u16::from_be_bytes([p[46], p[47]]), want, "{} bytes", payload.len());
            assert_eq!(&p[48..], payload);
        }
        assert!(ipv6_udp_packet(src, dst, &vec![0; 65528], &mut p).is_none());
        assert!(ipv6_udp_packet(src, dst, &vec![0; 65527], &mut p).is_some());
    }

    /// As root: an IPv6 packet "from" a documentation address reaches a UDP socket on
    /// ::1, which sees exactly that source (the kernel checks the UDP checksum).
    #[test]
    fn a_raw_v6_packet_arrives_with_the_source_it_names() {
        use std::net::Ipv6Addr;
        let raw = match RawIpv6::open() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("SKIPPED: a raw IPv6 socket needs CAP_NET_RAW and IPv6: {e}");
                return;
            }
        };
        let rx = match UdpSocket::bind("[::1]:0") {
            Ok(s) => s,
            Err(e) => {
                eprintln!("SKIPPED: no IPv6 loopback: {e}");
                return;
            }
        };
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
        let std::net::SocketAddr::V6(dst) = rx.local_addr().expect("addr") else { unreachable!() };
        let src = SocketAddrV6::new(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 9, 7), 40404, 0, 0);
        let mut p = Vec::new();
        // An odd length, so the checksum's padding is exercised on the real path.
        ipv6_udp_packet(src, dst, b"forwarded", &mut p).expect("fits");
        raw.send(&p, dst).expect("send");
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("the datagram arrives");
        assert_eq!((&buf[..n], from), (&b"forwarded"[..], std::net::SocketAddr::V6(src)));
    }

    /// As root: a packet "from" another loopback address and port reaches a UDP
    /// socket, which sees exactly that source.
    #[test]
    fn a_raw_packet_arrives_with_the_source_it_names() {
        let raw = match RawIpv4::open() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("SKIPPED: a raw socket needs CAP_NET_RAW: {e}");
                return;
            }
        };
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
        let std::net::SocketAddr::V4(dst) = rx.local_addr().expect("addr") else { unreachable!() };
        let src = SocketAddrV4::new(Ipv4Addr::new(127, 9, 8, 7), 40404);
        let mut p = Vec::new();
        ipv4_udp_packet(src, dst, b"forwarded", &mut p).expect("fits");
        raw.send(&p, dst).expect("send");
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("the datagram arrives");
        assert_eq!((&buf[..n], from), (&b"forwarded"[..], std::net::SocketAddr::V4(src)));
    }
}
