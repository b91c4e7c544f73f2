//! The few system calls std does not wrap: sendmmsg with an optional UDP_SEGMENT
//! control message or with a per-datagram IP_PKTINFO source address, socket buffer
//! sizes, and CLOCK_MONOTONIC in nanoseconds.

use std::io;
use std::os::fd::AsRawFd;

/// `UDP_SEGMENT` (linux/udp.h): per-message GSO segment size, level SOL_UDP.
const UDP_SEGMENT: libc::c_int = 103;
/// The kernel's UDP_MAX_SEGMENTS.
pub const MAX_GSO_SEGMENTS: usize = 64;

pub use ::sys::monotonic_ns;

/// Asks for a `bytes` send buffer; as root, SO_SNDBUFFORCE passes net.core.wmem_max.
pub fn set_send_buffer(fd: &impl AsRawFd, bytes: usize) {
    ::sys::sockopt::set_send_buffer(fd.as_raw_fd(), bytes)
}

/// Asks for a `bytes` receive buffer; as root, SO_RCVBUFFORCE passes net.core.rmem_max.
pub fn set_recv_buffer(fd: &impl AsRawFd, bytes: usize) {
    ::sys::sockopt::set_recv_buffer(fd.as_raw_fd(), bytes)
}

/// One control buffer big enough for CMSG_SPACE(sizeof u16), 8-byte aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; 32]);

/// Reusable sendmmsg state for a connected socket: up to `cap` messages, each one
/// datagram or (with GSO) one train of equal-sized segments.
pub struct MmsgSender {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    cmsg: Box<CmsgBuf>,
    cmsg_len: usize,
}

// SAFETY: the raw pointers inside point only into this struct's own heap buffers
// (which move with it) and into slices borrowed for the duration of one `send`
// call; nothing is shared with another thread.
unsafe impl Send for MmsgSender {}

impl MmsgSender {
    /// `gso_segment_size`: Some(size) attaches UDP_SEGMENT = size to every message.
    pub fn new(cap: usize, gso_segment_size: Option<u16>) -> MmsgSender {
        let mut cmsg = Box::new(CmsgBuf([0; 32]));
        let mut cmsg_len = 0;
        if let Some(seg) = gso_segment_size {
            // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic on the constant size of u16.
            let (space, len) = unsafe { (libc::CMSG_SPACE(2) as usize, libc::CMSG_LEN(2) as usize) };
            assert!(space <= cmsg.0.len());
            // Build the header by hand in the aligned buffer: cmsg_len, level, type, data.
            // SAFETY: the buffer is 8-byte aligned and at least CMSG_SPACE(2) long, so a
            // cmsghdr fits at its start and CMSG_DATA(hdr) + 2 stays inside it; the
            // msghdr only serves to let CMSG_FIRSTHDR compute the first header address.
            unsafe {
                let mut mh: libc::msghdr = std::mem::zeroed();
                mh.msg_control = cmsg.0.as_mut_ptr().cast();
                mh.msg_controllen = space as _;
                let hdr = libc::CMSG_FIRSTHDR(&mh);
                (*hdr).cmsg_level = libc::SOL_UDP;
                (*hdr).cmsg_type = UDP_SEGMENT;
                (*hdr).cmsg_len = len as _;
                std::ptr::copy_nonoverlapping(seg.to_ne_bytes().as_ptr(), libc::CMSG_DATA(hdr), 2);
            }
            cmsg_len = space;
        }
        // SAFETY: mmsghdr and iovec are plain C structs for which all-zero is valid
        // (null pointers, zero lengths).
        let (hdrs, iovs) =
            unsafe { (vec![std::mem::zeroed::<libc::mmsghdr>(); cap], vec![std::mem::zeroed::<libc::iovec>(); cap]) };
        MmsgSender { hdrs, iovs, cmsg, cmsg_len }
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Sends each `data[start..start + len]` of `msgs` (at most `capacity()`) as one
    /// message on the connected socket `fd`. Returns how many messages went out, how
    /// many failed (each failure is counted and skipped, never retried) and the last error.
    pub fn send(
        &mut self,
        fd: &impl AsRawFd,
        data: &[u8],
        msgs: &[(usize, usize)],
    ) -> (usize, usize, Option<io::Error>) {
        let n = msgs.len().min(self.hdrs.len());
        for (i, &(start, len)) in msgs[..n].iter().enumerate() {
            let m = &data[start..start + len];
            self.iovs[i] = libc::iovec { iov_base: m.as_ptr() as *mut libc::c_void, iov_len: m.len() };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = std::ptr::null_mut();
            h.msg_namelen = 0;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = if self.cmsg_len > 0 { self.cmsg.0.as_mut_ptr().cast() } else { std::ptr::null_mut() };
            h.msg_controllen = self.cmsg_len as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        // SAFETY: hdrs[..n] are initialised above; each points at its own iovec, which
        // points into `data`, borrowed for the whole call, and at the control buffer
        // owned by self.
        unsafe { sendmmsg_all(fd.as_raw_fd(), &mut self.hdrs[..n]) }
    }
}

/// Reusable sendmmsg state for an unconnected IPv4 socket bound to 0.0.0.0 that sends
/// every datagram to one target from a source address of the caller's choice
/// (IP_PKTINFO `ipi_spec_dst`, ip(7)). Any 127.0.0.0/8 address is local on Linux
/// (the `local 127.0.0.0/8 dev lo` route), so a loopback source needs no raw socket
/// and no privilege: many clients as seen by the receiver, from one socket.
pub struct SpoofSender {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<::sys::pktinfo::SourceControl>,
    target: Box<libc::sockaddr_in>,
}

// SAFETY: as for MmsgSender: the raw pointers point into this struct's own heap
// buffers and into slices borrowed for one `send` call only.
unsafe impl Send for SpoofSender {}

impl SpoofSender {
    pub fn new(cap: usize, target: std::net::SocketAddrV4) -> SpoofSender {
        let target = Box::new(libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: target.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(target.ip().octets()) },
            sin_zero: [0; 8],
        });
        // SAFETY: mmsghdr and iovec are plain C structs for which all-zero is valid.
        let (hdrs, iovs) =
            unsafe { (vec![std::mem::zeroed::<libc::mmsghdr>(); cap], vec![std::mem::zeroed::<libc::iovec>(); cap]) };
        SpoofSender { hdrs, iovs, cmsgs: vec![[0; 8]; cap], target }
    }

    /// Sends each `data[start..start + len]` of `msgs` (at most the capacity) to the
    /// target from `sources[i]`, the i-th message's source address. Returns as
    /// [`MmsgSender::send`].
    pub fn send(
        &mut self,
        fd: &impl AsRawFd,
        data: &[u8],
        msgs: &[(usize, usize)],
        sources: &[std::net::Ipv4Addr],
    ) -> (usize, usize, Option<io::Error>) {
        let n = msgs.len().min(self.hdrs.len()).min(sources.len());
        for (i, &(start, dlen)) in msgs[..n].iter().enumerate() {
            let m = &data[start..start + dlen];
            self.iovs[i] = libc::iovec { iov_base: m.as_ptr() as *mut libc::c_void, iov_len: m.len() };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut *self.target as *mut libc::sockaddr_in).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            ::sys::pktinfo::set_source(h, &mut self.cmsgs[i], sources[i].into());
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        // SAFETY: hdrs[..n] are initialised above; each points at its own iovec (into
        // `data`, borrowed for the call), its own control buffer and the target
        // address, all owned by self.
        unsafe { sendmmsg_all(fd.as_raw_fd(), &mut self.hdrs[..n]) }
    }
}

/// sendmmsg(2) until every header was tried: a failing message is counted and
/// skipped, EINTR retried. (sent, errors, the last error).
///
/// # Safety
/// Every header's name, iovec and control pointers must be valid for the call.
unsafe fn sendmmsg_all(fd: std::os::fd::RawFd, hdrs: &mut [libc::mmsghdr]) -> (usize, usize, Option<io::Error>) {
    let n = hdrs.len();
    let (mut done, mut errors, mut last_err) = (0usize, 0usize, None);
    let mut off = 0;
    while off < n {
        // SAFETY: the caller vouches for every header; the kernel only reads them
        // (and writes msg_len), at most n − off from `off`.
        let rc = unsafe { libc::sendmmsg(fd, hdrs[off..].as_mut_ptr(), (n - off) as libc::c_uint, 0) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            errors += 1;
            off += 1;
            last_err = Some(e);
        } else {
            done += rc as usize;
            off += (rc as usize).max(1).min(n - off);
            if rc == 0 {
                errors += 1;
            }
        }
    }
    (done, errors, last_err)
}
