//! The control message that picks a datagram's source address on send: IP_PKTINFO
//! (ip(7)) or IPV6_PKTINFO (RFC 3542 §6.1), for a socket bound to a wildcard address
//! (the data plane's Retries) or an IP_TRANSPARENT one (spoofed test floods).

use std::net::IpAddr;

/// Room for one source-address control message (an in6_pktinfo: CMSG_SPACE(20) = 40
/// bytes), 8-byte aligned as cmsghdr needs.
pub type SourceControl = [u64; 8];

/// Points `msg`'s control data at `control`, holding one IP_PKTINFO / IPV6_PKTINFO that
/// sends the message from `src`. `control` must outlive the send that uses `msg`.
pub fn set_source(msg: &mut libc::msghdr, control: &mut SourceControl, src: IpAddr) {
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(control) as _;
    // SAFETY: msg_control points at `control` (64 bytes, 8-aligned), enough for one
    // cmsghdr with an in6_pktinfo (16 + 20 bytes, aligned: 40); CMSG_FIRSTHDR is
    // non-null for a buffer that large, and we write within CMSG_SPACE(len).
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(msg);
        match src {
            IpAddr::V4(v4) => {
                (*cm).cmsg_level = libc::IPPROTO_IP;
                (*cm).cmsg_type = libc::IP_PKTINFO;
                (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::in_pktinfo>() as u32) as _;
                let pi = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr { s_addr: u32::from_ne_bytes(v4.octets()) },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<libc::in_pktinfo>(), pi);
                msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::in_pktinfo>() as u32) as _;
            }
            IpAddr::V6(v6) => {
                (*cm).cmsg_level = libc::IPPROTO_IPV6;
                (*cm).cmsg_type = libc::IPV6_PKTINFO;
                (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::in6_pktinfo>() as u32) as _;
                let pi = libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: v6.octets() }, ipi6_ifindex: 0 };
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<libc::in6_pktinfo>(), pi);
                msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::in6_pktinfo>() as u32) as _;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// A datagram sent with the control message arrives from that source: 127.0.0.1
    /// bound to 0.0.0.0 sends from 127.0.0.9 (any 127/8 address is local), and a v6
    /// one from ::1 (the only local v6 loopback address).
    #[test]
    fn the_datagram_leaves_from_the_given_source() {
        for (bind, src, to) in [("0.0.0.0:0", "127.0.0.9", "127.0.0.1:0"), ("[::]:0", "::1", "[::1]:0")] {
            let Ok(tx) = UdpSocket::bind(bind) else { continue };
            let rx = UdpSocket::bind(to).unwrap();
            let dst = rx.local_addr().unwrap();
            let (ss, len) = crate::addr::to_sockaddr(&dst);
            let mut iov = libc::iovec { iov_base: b"x".as_ptr() as *mut libc::c_void, iov_len: 1 };
            // SAFETY: plain old data; all-zero is a valid empty msghdr.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = &ss as *const libc::sockaddr_storage as *mut libc::c_void;
            msg.msg_namelen = len;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            let mut control = [0u64; 8];
            set_source(&mut msg, &mut control, src.parse().unwrap());
            // SAFETY: msg points at live locals for the call.
            assert_eq!(unsafe { libc::sendmsg(tx.as_raw_fd(), &msg, 0) }, 1, "{}", std::io::Error::last_os_error());
            let mut b = [0u8; 4];
            let (_, from) = rx.recv_from(&mut b).unwrap();
            assert_eq!(from.ip(), src.parse::<IpAddr>().unwrap(), "from {bind}");
        }
    }
}
