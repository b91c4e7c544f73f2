//! Control messages (cmsg(3)) read from and written to plain byte buffers, without
//! raw pointers: a header is Linux's `struct cmsghdr { size_t cmsg_len; int
//! cmsg_level; int cmsg_type; }`, its data starts at CMSG_ALIGN(sizeof(cmsghdr)) and
//! the next header at CMSG_ALIGN(cmsg_len), CMSG_ALIGN rounding up to `size_t`.
//!
//! Offsets are relative to the start of the buffer, as the kernel lays them out
//! relative to `msg_control`; it copies control data in and out, so the buffer itself
//! needs no alignment.
//!
//! Also the control messages quicdemux sends: the source address of a datagram
//! (IP_PKTINFO, ip(7); IPV6_PKTINFO, RFC 3542 §6.1) and its GSO segment size
//! (UDP_SEGMENT, udp(7)), and descriptors (SCM_RIGHTS, unix(7)).

use std::mem::size_of;
use std::net::IpAddr;
use std::os::fd::RawFd;

/// CMSG_ALIGN's unit: `size_t`.
const ALIGN: usize = size_of::<usize>();
/// `sizeof(struct cmsghdr)`.
const HDR: usize = size_of::<libc::cmsghdr>();

/// CMSG_ALIGN(n).
pub const fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// CMSG_LEN(n): a header and `n` data bytes, the value of `cmsg_len`.
pub const fn len(n: usize) -> usize {
    align(HDR) + n
}

/// CMSG_SPACE(n): the room one control message with `n` data bytes takes.
pub const fn space(n: usize) -> usize {
    align(HDR) + align(n)
}

/// linux/udp.h: the GSO segment size of a send, level SOL_UDP (an u16).
pub const UDP_SEGMENT: libc::c_int = 103;

/// Room for every control message [`Encoder`] writes on one datagram: an
/// in6_pktinfo (the larger source address) and a UDP_SEGMENT.
pub const SEND_SPACE: usize = space(size_of::<libc::in6_pktinfo>()) + space(size_of::<u16>());

/// One control message of a buffer: its level, type and data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cmsg<'a> {
    pub level: libc::c_int,
    pub ty: libc::c_int,
    pub data: &'a [u8],
}

impl Cmsg<'_> {
    /// The data as a native-endian `int` (UDP_GRO, IPV6_TCLASS), if it holds one.
    pub fn int(&self) -> Option<i32> {
        Some(i32::from_ne_bytes(self.data.get(..4)?.try_into().ok()?))
    }
}

/// The control messages of `control`, in order (CMSG_FIRSTHDR / CMSG_NXTHDR): the walk
/// ends at the first header that does not fit or whose length is impossible.
pub fn iter(control: &[u8]) -> Iter<'_> {
    Iter { control, off: 0 }
}

#[derive(Clone, Debug)]
pub struct Iter<'a> {
    control: &'a [u8],
    off: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = Cmsg<'a>;

    fn next(&mut self) -> Option<Cmsg<'a>> {
        let rest = self.control.get(self.off..)?;
        let h = rest.get(..HDR)?;
        let clen = usize::from_ne_bytes(h[..ALIGN].try_into().ok()?);
        let level = libc::c_int::from_ne_bytes(h[ALIGN..ALIGN + 4].try_into().ok()?);
        let ty = libc::c_int::from_ne_bytes(h[ALIGN + 4..ALIGN + 8].try_into().ok()?);
        if clen < HDR || clen > rest.len() {
            self.off = self.control.len();
            return None;
        }
        let data = rest.get(align(HDR)..clen.max(align(HDR)))?;
        self.off = self.off.saturating_add(align(clen));
        Some(Cmsg { level, ty, data })
    }
}

/// The control buffer was too small for the message (nothing was written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

/// Appends control messages to a byte buffer.
#[derive(Debug)]
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Encoder<'a> {
    pub fn new(buf: &'a mut [u8]) -> Encoder<'a> {
        Encoder { buf, len: 0 }
    }

    /// Bytes written so far (each message's CMSG_SPACE): the `msg_controllen` to send.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one message of `level`, `ty` and `data`.
    pub fn push(&mut self, level: libc::c_int, ty: libc::c_int, data: &[u8]) -> Result<(), Full> {
        self.reserve(level, ty, data.len())?.copy_from_slice(data);
        Ok(())
    }

    /// Appends the header of a message with `n` data bytes; its data area, zeroed.
    fn reserve(&mut self, level: libc::c_int, ty: libc::c_int, n: usize) -> Result<&mut [u8], Full> {
        let end = self.len.checked_add(space(n)).ok_or(Full)?;
        let room = self.buf.get_mut(self.len..end).ok_or(Full)?;
        room.fill(0);
        room[..ALIGN].copy_from_slice(&len(n).to_ne_bytes());
        room[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        room[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
        self.len = end;
        Ok(&mut room[align(HDR)..align(HDR) + n])
    }

    /// The source address of a datagram sent from a socket bound to a wildcard address
    /// (or an IP_TRANSPARENT one): IP_PKTINFO's `ipi_spec_dst` (ip(7)), or IPV6_PKTINFO's
    /// `ipi6_addr` (RFC 3542 §6.1); interface 0, the route decides.
    pub fn source(&mut self, ip: IpAddr) -> Result<(), Full> {
        match ip {
            IpAddr::V4(v4) => {
                // struct in_pktinfo { int ipi_ifindex; in_addr ipi_spec_dst; in_addr ipi_addr; }
                let mut pi = [0u8; size_of::<libc::in_pktinfo>()];
                pi[4..8].copy_from_slice(&v4.octets());
                self.push(libc::IPPROTO_IP, libc::IP_PKTINFO, &pi)
            }
            IpAddr::V6(v6) => {
                // struct in6_pktinfo { in6_addr ipi6_addr; unsigned ipi6_ifindex; }
                let mut pi = [0u8; size_of::<libc::in6_pktinfo>()];
                pi[..16].copy_from_slice(&v6.octets());
                self.push(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &pi)
            }
        }
    }

    /// UDP_SEGMENT: the kernel splits the datagram into segments of `size` bytes (GSO).
    pub fn segment_size(&mut self, size: u16) -> Result<(), Full> {
        self.push(libc::SOL_UDP, UDP_SEGMENT, &size.to_ne_bytes())
    }

    /// SCM_RIGHTS: `fds` go with the message.
    pub fn rights(&mut self, fds: &[RawFd]) -> Result<(), Full> {
        let data = self.reserve(libc::SOL_SOCKET, libc::SCM_RIGHTS, size_of_val(fds))?;
        for (d, fd) in data.chunks_exact_mut(size_of::<RawFd>()).zip(fds) {
            d.copy_from_slice(&fd.to_ne_bytes());
        }
        Ok(())
    }
}

/// The descriptors of an SCM_RIGHTS message's data (native-endian ints).
pub fn rights(data: &[u8]) -> impl Iterator<Item = RawFd> + '_ {
    data.chunks_exact(size_of::<RawFd>()).filter_map(|c| c.try_into().ok().map(RawFd::from_ne_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arithmetic is libc's CMSG_ALIGN / CMSG_LEN / CMSG_SPACE.
    #[test]
    fn sizes_are_the_c_macros() {
        for n in 0..100u32 {
            // SAFETY: CMSG_LEN and CMSG_SPACE are pure size computations.
            let (l, s) = unsafe { (libc::CMSG_LEN(n), libc::CMSG_SPACE(n)) };
            assert_eq!((len(n as usize), space(n as usize)), (l as usize, s as usize), "{n} data bytes");
        }
    }

    /// What the encoder writes, libc's CMSG_FIRSTHDR / CMSG_NXTHDR / CMSG_DATA read
    /// back; and the iterator reads the same.
    #[test]
    fn encoder_output_reads_back_with_the_c_macros_and_the_iterator() {
        #[repr(C, align(8))]
        struct Buf([u8; 128]);
        let mut buf = Buf([0xa5; 128]);
        let mut e = Encoder::new(&mut buf.0);
        e.source("127.0.0.9".parse().unwrap()).unwrap();
        e.segment_size(1200).unwrap();
        e.source("2001:db8::7".parse().unwrap()).unwrap();
        let n = e.len();
        assert_eq!(n, space(12) + space(2) + space(20));
        let mut seen = Vec::new();
        // SAFETY: msghdr is plain old data; the control pointer and length describe
        // `buf`, alive and unchanged while the macros walk it.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_control = buf.0.as_mut_ptr().cast();
            msg.msg_controllen = n;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let dlen = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                let data = std::slice::from_raw_parts(libc::CMSG_DATA(c), dlen).to_vec();
                seen.push(((*c).cmsg_level, (*c).cmsg_type, data));
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        let mine: Vec<_> = iter(&buf.0[..n]).map(|c| (c.level, c.ty, c.data.to_vec())).collect();
        assert_eq!(seen, mine);
        assert_eq!(seen.len(), 3);
        assert_eq!((seen[0].0, seen[0].1, &seen[0].2[4..8]), (libc::IPPROTO_IP, libc::IP_PKTINFO, &[127, 0, 0, 9][..]));
        assert_eq!((seen[1].0, seen[1].1, &seen[1].2[..]), (libc::SOL_UDP, UDP_SEGMENT, &1200u16.to_ne_bytes()[..]));
        assert_eq!((seen[2].1, seen[2].2.len()), (libc::IPV6_PKTINFO, 20));
        assert_eq!(seen[2].2[..16], "2001:db8::7".parse::<std::net::Ipv6Addr>().unwrap().octets());
    }

    #[test]
    fn a_full_buffer_writes_nothing() {
        let mut buf = [0u8; 40];
        let mut e = Encoder::new(&mut buf);
        e.source("127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(e.segment_size(1), Err(Full), "32 + 24 > 40");
        assert_eq!(e.len(), 32);
        assert_eq!(iter(&buf[..32]).count(), 1);
    }

    #[test]
    fn rights_round_trip() {
        let mut buf = [0u8; 64];
        let mut e = Encoder::new(&mut buf);
        e.rights(&[3, 70000, -1]).unwrap();
        let n = e.len();
        let c = iter(&buf[..n]).next().unwrap();
        assert_eq!((c.level, c.ty), (libc::SOL_SOCKET, libc::SCM_RIGHTS));
        assert_eq!(rights(c.data).collect::<Vec<_>>(), [3, 70000, -1]);
    }

    /// Cut, garbage and zero buffers end the walk without a panic or a loop.
    #[test]
    fn bad_buffers_end_the_walk() {
        let mut buf = [0u8; 96];
        let mut e = Encoder::new(&mut buf);
        e.source("2001:db8::1".parse().unwrap()).unwrap();
        e.segment_size(9).unwrap();
        let n = e.len();
        for cut in 0..=n {
            let got = iter(&buf[..cut]).count();
            let want = usize::from(cut >= len(20)) + usize::from(cut >= space(20) + len(2));
            assert_eq!(got, want, "cut at {cut}");
        }
        assert_eq!(iter(&[0xff; 64]).count(), 0);
        assert_eq!(iter(&[0; 64]).count(), 0);
        // A length that would step past the end of memory is refused, not wrapped.
        let mut huge = [0u8; 32];
        huge[..8].copy_from_slice(&usize::MAX.to_ne_bytes());
        assert_eq!(iter(&huge).count(), 0);
    }
}
