//! A raw IPv4 socket that delivers a UDP datagram with any source address: how a
//! host hands a datagram forwarded by another host (docs/adr/0005) to its own stack,
//! so it reaches the owning worker (kernel fast path or data plane) exactly as if the
//! client had sent it here. Root (CAP_NET_RAW) only.

use crate::{cvt, cvt_isize};
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
    Some(())
}

/// `socket(AF_INET, SOCK_RAW, IPPROTO_RAW)`: sends whole IPv4 packets.
pub struct RawIpv4(OwnedFd);

impl RawIpv4 {
    pub fn open() -> io::Result<RawIpv4> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) })?;
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Ok(RawIpv4(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends one packet built by [`ipv4_udp_packet`] towards `dst`.
    pub fn send(&self, packet: &[u8], dst: SocketAddrV4) -> io::Result<()> {
        let (ss, len) = crate::addr::to_sockaddr(&dst.into());
        // SAFETY: `packet` and `ss` are live for the call; `len` is `ss`'s length.
        let n = cvt_isize(unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&ss as *const libc::sockaddr_storage).cast(),
                len,
            )
        })?;
        if n != packet.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "raw send was short"));
        }
        Ok(())
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
