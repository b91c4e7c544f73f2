//! Batches of messages in one system call: recvmmsg(2) and sendmmsg(2), the only
//! place quicdemux calls them. The message headers, iovecs, names and control buffers
//! are allocated when a batch is made and reused by every call: nothing is allocated
//! per call, and the raw pointers the kernel needs never leave this module.
//!
//! - [`RecvMmsg`]: up to `capacity` messages into its own buffers ([`RecvMmsg::recv`])
//!   or the caller's ([`RecvMmsg::recv_into`]); per message, [`Received`] gives the
//!   length, the flags (MSG_TRUNC, MSG_CTRUNC), the sender's address and the control
//!   data (read with [`crate::cmsg`]).
//! - [`SendMmsg`]: its [`SendBatch`] borrows the data of each message (one or more
//!   slices, no copy), with an optional destination (`socket2::SockAddr`), source
//!   address (IP_PKTINFO / IPV6_PKTINFO) and GSO segment size (UDP_SEGMENT); sent
//!   from any message on ([`SendBatch::send_from`], a partial send says how many went)
//!   or all of them, skipping each one the kernel refuses ([`SendBatch::send_skipping`]).
//!
//! Flags are recv(2)'s and send(2)'s (`libc::MSG_DONTWAIT`, `MSG_WAITFORONE`, …).

use crate::addr::sockaddr_from_bytes;
use crate::cmsg;
use socket2::SockAddr;
use std::io::{self, IoSliceMut};
use std::marker::PhantomData;
use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};

/// Room for one name the kernel writes: a `sockaddr_storage`.
const NAME_LEN: usize = size_of::<libc::sockaddr_storage>();

fn empty_iovec() -> libc::iovec {
    libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }
}

fn empty_headers(n: usize) -> Box<[libc::mmsghdr]> {
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value (null pointers,
    // zero lengths).
    (0..n).map(|_| unsafe { std::mem::zeroed::<libc::mmsghdr>() }).collect()
}

/// A recvmmsg(2) batch of up to `capacity` messages.
pub struct RecvMmsg {
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
    /// `capacity` buffers of `buf_len` bytes, back to back (empty: only `recv_into`).
    data: Box<[u8]>,
    buf_len: usize,
    /// `capacity` names of NAME_LEN bytes (empty: names not asked for).
    names: Box<[u8]>,
    /// `capacity` control buffers of `control_len` bytes.
    control: Box<[u8]>,
    control_len: usize,
    /// Messages the last call received.
    got: usize,
    /// The last call received into `data` (not the caller's buffers).
    own_data: bool,
}

// SAFETY: the headers' pointers are set right before each call, to this value's own
// heap buffers or to buffers borrowed for that call only; between calls nothing
// dereferences them, so the value may move to another thread.
unsafe impl Send for RecvMmsg {}

impl std::fmt::Debug for RecvMmsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvMmsg")
            .field("capacity", &self.hdrs.len())
            .field("buf_len", &self.buf_len)
            .field("names", &!self.names.is_empty())
            .field("control_len", &self.control_len)
            .field("got", &self.got)
            .finish()
    }
}

/// One message of the last receive.
#[derive(Clone, Copy, Debug)]
pub struct Received<'a> {
    /// recvmmsg's `msg_len`: the bytes placed in the buffer.
    pub len: usize,
    /// `msg_flags`: MSG_TRUNC, MSG_CTRUNC, ….
    pub flags: libc::c_int,
    /// The bytes in the batch's own buffer ([`RecvMmsg::recv`]); empty after
    /// [`RecvMmsg::recv_into`] (they are in the caller's buffer).
    pub data: &'a [u8],
    /// The sender's address as the kernel wrote it (empty without names).
    pub name: &'a [u8],
    /// The control messages ([`crate::cmsg::iter`]).
    pub control: &'a [u8],
}

impl Received<'_> {
    /// The message was longer than its buffer (MSG_TRUNC): the tail is lost.
    pub fn truncated(&self) -> bool {
        self.flags & libc::MSG_TRUNC != 0
    }

    /// Control data did not fit the control buffer (MSG_CTRUNC).
    pub fn control_truncated(&self) -> bool {
        self.flags & libc::MSG_CTRUNC != 0
    }

    /// The sender's IP address and port; `None` without one.
    pub fn source(&self) -> Option<SocketAddr> {
        sockaddr_from_bytes(self.name)
    }
}

impl RecvMmsg {
    /// A batch of `capacity` messages with buffers of `buf_len` bytes each (0: the
    /// caller's buffers only, [`RecvMmsg::recv_into`]), without names or control data.
    pub fn new(capacity: usize, buf_len: usize) -> RecvMmsg {
        RecvMmsg {
            hdrs: empty_headers(capacity),
            iovs: vec![empty_iovec(); capacity].into_boxed_slice(),
            data: vec![0u8; capacity * buf_len].into_boxed_slice(),
            buf_len,
            names: Box::new([]),
            control: Box::new([]),
            control_len: 0,
            got: 0,
            own_data: false,
        }
    }

    /// Takes each sender's address too ([`Received::source`]).
    pub fn with_names(mut self) -> RecvMmsg {
        self.names = vec![0u8; self.hdrs.len() * NAME_LEN].into_boxed_slice();
        self
    }

    /// Takes up to `len` bytes of control messages per message.
    pub fn with_control(mut self, len: usize) -> RecvMmsg {
        self.control = vec![0u8; self.hdrs.len() * len].into_boxed_slice();
        self.control_len = len;
        self
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Bytes of each of the batch's own buffers.
    pub fn buf_len(&self) -> usize {
        self.buf_len
    }

    /// One recvmmsg(2) of up to `capacity` messages into the batch's buffers; how many
    /// came (read them with [`RecvMmsg::get`]). `WouldBlock` (with MSG_DONTWAIT or a
    /// non-blocking socket) when none is waiting; EINTR is the caller's.
    pub fn recv(&mut self, fd: impl AsFd, flags: libc::c_int) -> io::Result<usize> {
        if self.buf_len == 0 {
            self.got = 0;
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a batch without buffers receives with recv_into"));
        }
        let n = self.hdrs.len();
        let base = self.data.as_mut_ptr();
        for (i, iov) in self.iovs.iter_mut().take(n).enumerate() {
            // In bounds: i < capacity and data holds capacity × buf_len bytes.
            *iov = libc::iovec { iov_base: base.wrapping_add(i * self.buf_len).cast(), iov_len: self.buf_len };
        }
        let iovs = self.iovs.as_mut_ptr();
        self.arm(n, |i| iovs.wrapping_add(i));
        self.own_data = true;
        self.call(fd, n, flags)
    }

    /// One recvmmsg(2) of up to `bufs.len()` (at most `capacity`) messages, one
    /// message per buffer of `bufs`; how many came. Their bytes are in `bufs`; lengths,
    /// flags, names and control data from [`RecvMmsg::get`].
    pub fn recv_into(&mut self, fd: impl AsFd, bufs: &mut [IoSliceMut<'_>], flags: libc::c_int) -> io::Result<usize> {
        let n = bufs.len().min(self.hdrs.len());
        // IoSliceMut is guaranteed to be ABI-compatible with `struct iovec` on Unix.
        let iovs = bufs.as_mut_ptr().cast::<libc::iovec>();
        self.arm(n, |i| iovs.wrapping_add(i));
        self.own_data = false;
        self.call(fd, n, flags)
    }

    /// Points the first `n` headers at their iovec, name and control buffer, with the
    /// in/out lengths the kernel overwrites reset.
    fn arm(&mut self, n: usize, iov: impl Fn(usize) -> *mut libc::iovec) {
        let names = if self.names.is_empty() { std::ptr::null_mut() } else { self.names.as_mut_ptr() };
        let control = if self.control_len == 0 { std::ptr::null_mut() } else { self.control.as_mut_ptr() };
        for (i, m) in self.hdrs.iter_mut().take(n).enumerate() {
            let h = &mut m.msg_hdr;
            h.msg_iov = iov(i);
            h.msg_iovlen = 1;
            // In bounds: i < capacity and each buffer holds capacity slots.
            h.msg_name = names.wrapping_add(i * NAME_LEN).cast();
            h.msg_namelen = if names.is_null() { 0 } else { NAME_LEN as libc::socklen_t };
            h.msg_control = control.wrapping_add(i * self.control_len).cast();
            h.msg_controllen = self.control_len as _;
            h.msg_flags = 0;
            m.msg_len = 0;
        }
    }

    fn call(&mut self, fd: impl AsFd, n: usize, flags: libc::c_int) -> io::Result<usize> {
        self.got = 0;
        if n == 0 {
            return Ok(0);
        }
        let hdrs = self.hdrs.as_mut_ptr();
        // SAFETY: the first `n` headers were just armed: each points at one iovec
        // (into `data`, or into the caller's `bufs` borrowed for this call, each
        // writable for its length), at its NAME_LEN bytes of `names` (or null, length
        // 0) and at its `control_len` bytes of `control` (or null, length 0); the
        // timeout may be null.
        let r = unsafe { libc::recvmmsg(fd.as_fd().as_raw_fd(), hdrs, n as libc::c_uint, flags, std::ptr::null_mut()) };
        self.got = crate::cvt(r)? as usize;
        Ok(self.got)
    }

    /// Messages the last call received.
    pub fn len(&self) -> usize {
        self.got
    }

    pub fn is_empty(&self) -> bool {
        self.got == 0
    }

    /// Message `i` of the last call (`None` past [`RecvMmsg::len`]).
    pub fn get(&self, i: usize) -> Option<Received<'_>> {
        if i >= self.got {
            return None;
        }
        let m = self.hdrs.get(i)?;
        let len = m.msg_len as usize;
        let data = if self.own_data { self.data.get(i * self.buf_len..)?.get(..len.min(self.buf_len))? } else { &[] };
        let name = match self.names.get(i * NAME_LEN..(i + 1) * NAME_LEN) {
            Some(n) => &n[..(m.msg_hdr.msg_namelen as usize).min(NAME_LEN)],
            None => &[],
        };
        let control = match self.control.get(i * self.control_len..(i + 1) * self.control_len) {
            Some(c) => &c[..m.msg_hdr.msg_controllen.min(self.control_len)],
            None => &[],
        };
        Some(Received { len, flags: m.msg_hdr.msg_flags, data, name, control })
    }

    /// The messages of the last call, in order.
    pub fn iter(&self) -> impl Iterator<Item = Received<'_>> + '_ {
        (0..self.got).filter_map(|i| self.get(i))
    }
}

/// What goes with one message besides its bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendMeta<'d> {
    /// The destination (unconnected sockets).
    pub to: Option<&'d SockAddr>,
    /// The source address (IP_PKTINFO / IPV6_PKTINFO), for a socket bound to a
    /// wildcard address or an IP_TRANSPARENT one.
    pub source: Option<IpAddr>,
    /// UDP_SEGMENT: the kernel cuts the message into datagrams of this size (GSO).
    pub segment_size: Option<u16>,
}

impl<'d> SendMeta<'d> {
    pub fn to(to: &'d SockAddr) -> SendMeta<'d> {
        SendMeta { to: Some(to), ..SendMeta::default() }
    }
}

/// The arrays of a sendmmsg(2) batch of up to `capacity` messages of up to `max_iovs`
/// slices each; [`SendMmsg::batch`] fills them.
pub struct SendMmsg {
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
    /// `capacity` control buffers of [`cmsg::SEND_SPACE`] bytes.
    control: Box<[u8]>,
    max_iovs: usize,
    len: usize,
    /// The headers' iovec and control pointers are set for the messages queued.
    armed: bool,
}

// SAFETY: as for RecvMmsg: the pointers are rewritten before each call (to this
// value's own heap buffers and to data borrowed by a SendBatch, which cannot outlive
// it) and dereferenced only during the call.
unsafe impl Send for SendMmsg {}

impl std::fmt::Debug for SendMmsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendMmsg")
            .field("capacity", &self.hdrs.len())
            .field("max_iovs", &self.max_iovs)
            .field("len", &self.len)
            .finish()
    }
}

impl SendMmsg {
    pub fn new(capacity: usize, max_iovs: usize) -> SendMmsg {
        SendMmsg {
            hdrs: empty_headers(capacity),
            iovs: vec![empty_iovec(); capacity * max_iovs].into_boxed_slice(),
            control: vec![0u8; capacity * cmsg::SEND_SPACE].into_boxed_slice(),
            max_iovs,
            len: 0,
            armed: false,
        }
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// An empty batch whose messages borrow data for `'d`.
    pub fn batch<'d>(&mut self) -> SendBatch<'_, 'd> {
        self.len = 0;
        self.armed = false;
        SendBatch { m: self, data: PhantomData }
    }
}

/// Messages queued for sendmmsg(2); their data stays borrowed (`'d`) until the batch
/// is dropped.
#[derive(Debug)]
pub struct SendBatch<'s, 'd> {
    m: &'s mut SendMmsg,
    data: PhantomData<&'d [u8]>,
}

impl<'d> SendBatch<'_, 'd> {
    pub fn len(&self) -> usize {
        self.m.len
    }

    pub fn is_empty(&self) -> bool {
        self.m.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.m.len >= self.m.hdrs.len()
    }

    /// Queues one message: the concatenation of `bufs` (at most `max_iovs` slices),
    /// with `meta`. `false` (nothing queued) when the batch is full or `bufs` too many.
    pub fn push(&mut self, bufs: &[&'d [u8]], meta: SendMeta<'d>) -> bool {
        let (i, max) = (self.m.len, self.m.max_iovs);
        if i >= self.m.hdrs.len() || bufs.len() > max {
            return false;
        }
        for (iov, b) in self.m.iovs[i * max..i * max + bufs.len()].iter_mut().zip(bufs) {
            // The kernel only reads from a send's iovecs.
            *iov = libc::iovec { iov_base: b.as_ptr().cast_mut().cast(), iov_len: b.len() };
        }
        let controllen = if meta.source.is_none() && meta.segment_size.is_none() {
            0
        } else {
            let mut control = cmsg::Encoder::new(&mut self.m.control[i * cmsg::SEND_SPACE..(i + 1) * cmsg::SEND_SPACE]);
            // SEND_SPACE holds the larger source address and a segment size: cannot fail.
            if let Some(ip) = meta.source {
                let _ = control.source(ip);
            }
            if let Some(size) = meta.segment_size {
                let _ = control.segment_size(size);
            }
            control.len()
        };
        let m = &mut self.m.hdrs[i];
        let h = &mut m.msg_hdr;
        // The kernel only reads a send's name.
        (h.msg_name, h.msg_namelen) = match meta.to {
            Some(a) => (a.as_ptr().cast_mut().cast(), a.len()),
            None => (std::ptr::null_mut(), 0),
        };
        h.msg_iovlen = bufs.len() as _;
        h.msg_controllen = controllen as _;
        h.msg_flags = 0;
        m.msg_len = 0;
        self.m.len += 1;
        self.m.armed = false;
        true
    }

    /// Points every queued header at its iovecs and control bytes.
    fn arm(&mut self) {
        if self.m.armed {
            return;
        }
        let (iovs, control, max) = (self.m.iovs.as_mut_ptr(), self.m.control.as_mut_ptr(), self.m.max_iovs);
        for (i, m) in self.m.hdrs[..self.m.len].iter_mut().enumerate() {
            let h = &mut m.msg_hdr;
            // In bounds: i < capacity, and iovs and control hold capacity slots.
            h.msg_iov = iovs.wrapping_add(i * max);
            h.msg_control = if h.msg_controllen == 0 {
                std::ptr::null_mut()
            } else {
                control.wrapping_add(i * cmsg::SEND_SPACE).cast()
            };
        }
        self.m.armed = true;
    }

    /// One sendmmsg(2) of the messages from `start` on (EINTR is retried): how many the
    /// kernel took, at least one (0 only when none is left). An error (EAGAIN on a
    /// full socket, ENOBUFS, an unreachable address …) is the first message's.
    pub fn send_from(&mut self, fd: impl AsFd, start: usize, flags: libc::c_int) -> io::Result<usize> {
        let len = self.m.len;
        if start >= len {
            return Ok(0);
        }
        self.arm();
        let fd = fd.as_fd().as_raw_fd();
        loop {
            let hdrs = self.m.hdrs[start..len].as_mut_ptr();
            // SAFETY: the headers from `start` to `len` were filled by `push` and armed:
            // each points at its iovecs (into data borrowed for `'d`, which outlives this
            // batch), at its name (a SockAddr borrowed for `'d`, or null) and at its
            // control bytes (in `control`, or null); the kernel reads those and writes
            // only each header's msg_len.
            let r = unsafe { libc::sendmmsg(fd, hdrs, (len - start) as libc::c_uint, flags) };
            match crate::cvt(r) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.map(|n| n as usize),
            }
        }
    }

    /// Sends every queued message: a message the kernel refuses (a full socket buffer,
    /// an unreachable address) is told to `refused(index, error)` and skipped, the
    /// rest still go; at most one call per message. How many went.
    pub fn send_skipping(
        &mut self,
        fd: impl AsFd,
        flags: libc::c_int,
        mut refused: impl FnMut(usize, io::Error),
    ) -> usize {
        let fd = fd.as_fd();
        let (mut next, mut sent) = (0, 0);
        while next < self.m.len {
            match self.send_from(fd, next, flags) {
                Ok(0) => {
                    refused(next, io::Error::new(io::ErrorKind::WriteZero, "sendmmsg sent nothing"));
                    next += 1;
                }
                Ok(k) => {
                    next += k;
                    sent += k;
                }
                Err(e) => {
                    refused(next, e);
                    next += 1;
                }
            }
        }
        sent
    }

    /// Bytes the kernel took of message `i` in the last send (`msg_len`).
    pub fn sent_len(&self, i: usize) -> usize {
        self.m.hdrs.get(i..self.m.len).and_then(|h| h.first()).map_or(0, |m| m.msg_len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmsg;
    use socket2::SockRef;
    use std::net::{Ipv4Addr, UdpSocket};

    fn udp(addr: &str) -> UdpSocket {
        UdpSocket::bind(addr).unwrap()
    }

    fn set_int(s: &impl AsRawFd, level: libc::c_int, name: libc::c_int) {
        crate::sockopt::setsockopt_int(s.as_raw_fd(), level, name, 1).unwrap();
    }

    /// The destination address IP_PKTINFO / IPV6_PKTINFO reported.
    fn pktinfo_dst(control: &[u8]) -> Option<IpAddr> {
        cmsg::iter(control).find_map(|c| match (c.level, c.ty) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => Some(IpAddr::from(<[u8; 4]>::try_from(&c.data[8..12]).ok()?)),
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => Some(IpAddr::from(<[u8; 16]>::try_from(&c.data[..16]).ok()?)),
            _ => None,
        })
    }

    /// A batch of datagrams from two senders: each one's bytes, length, sender and
    /// control data; then nothing waiting is `WouldBlock`.
    #[test]
    fn a_udp_batch_with_names_and_control() {
        let rx = udp("0.0.0.0:0");
        set_int(&rx, libc::IPPROTO_IP, libc::IP_PKTINFO);
        let to = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 5), rx.local_addr().unwrap().port()));
        let (a, b) = (udp("127.0.0.2:0"), udp("127.0.0.3:0"));
        a.send_to(b"first", to).unwrap();
        b.send_to(&[2; 40], to).unwrap();
        a.send_to(b"", to).unwrap();
        let mut r = RecvMmsg::new(4, 64).with_names().with_control(64);
        assert_eq!(r.recv(&rx, libc::MSG_DONTWAIT).unwrap(), 3);
        let got: Vec<_> = r.iter().map(|m| (m.data.to_vec(), m.len, m.source(), pktinfo_dst(m.control))).collect();
        let dst = Some(to.ip());
        assert_eq!(
            got,
            [
                (b"first".to_vec(), 5, Some(a.local_addr().unwrap()), dst),
                (vec![2; 40], 40, Some(b.local_addr().unwrap()), dst),
                (vec![], 0, Some(a.local_addr().unwrap()), dst),
            ]
        );
        assert!(r.iter().all(|m| !m.truncated() && !m.control_truncated()));
        assert!(r.get(3).is_none());
        assert_eq!(r.recv(&rx, libc::MSG_DONTWAIT).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert_eq!(r.len(), 0, "a failed call leaves no messages");
    }

    /// A datagram longer than its buffer is cut (MSG_TRUNC) and its bytes are the
    /// buffer's worth; control data longer than the control buffer is MSG_CTRUNC.
    #[test]
    fn truncation_flags() {
        let rx = udp("0.0.0.0:0");
        set_int(&rx, libc::IPPROTO_IP, libc::IP_PKTINFO);
        let to = SocketAddr::from((Ipv4Addr::LOCALHOST, rx.local_addr().unwrap().port()));
        let tx = udp("127.0.0.1:0");
        let payload: Vec<u8> = (0..100).collect();
        tx.send_to(&payload, to).unwrap();
        tx.send_to(&payload[..10], to).unwrap();
        let mut r = RecvMmsg::new(2, 32).with_control(cmsg::space(12));
        assert_eq!(r.recv(&rx, libc::MSG_DONTWAIT).unwrap(), 2);
        let (cut, whole) = (r.get(0).unwrap(), r.get(1).unwrap());
        assert!(cut.truncated() && !whole.truncated());
        assert_eq!((cut.data, cut.len), (&payload[..32], 32));
        assert_eq!(whole.data, &payload[..10]);
        assert!(!cut.control_truncated());
        assert_eq!(cut.source(), None, "no names asked for");
        tx.send_to(&payload, to).unwrap();
        let mut small = RecvMmsg::new(1, 128).with_control(cmsg::len(12) - 1);
        assert_eq!(small.recv(&rx, 0).unwrap(), 1);
        assert!(small.get(0).unwrap().control_truncated());
    }

    /// One batch read from an IPv4 and then an IPv6 socket, the second with more
    /// control data: the name and control lengths the kernel wrote back are reset
    /// before each call, so neither is cut.
    #[test]
    fn a_batch_reused_across_calls_and_families() {
        let rx4 = udp("127.0.0.1:0");
        set_int(&rx4, libc::IPPROTO_IP, libc::IP_RECVTOS);
        let rx6 = udp("[::]:0");
        set_int(&rx6, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO);
        set_int(&rx6, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS);
        let tx4 = udp("127.0.0.1:0");
        let tx6 = udp("[::1]:0");
        let mut r = RecvMmsg::new(2, 16).with_names().with_control(128);
        tx4.send_to(b"v4", rx4.local_addr().unwrap()).unwrap();
        assert_eq!(r.recv(&rx4, libc::MSG_WAITFORONE).unwrap(), 1);
        assert_eq!(r.get(0).unwrap().source(), Some(tx4.local_addr().unwrap()));
        assert_eq!(r.get(0).unwrap().name.len(), size_of::<libc::sockaddr_in>());
        tx6.send_to(b"v6", ("::1", rx6.local_addr().unwrap().port())).unwrap();
        assert_eq!(r.recv(&rx6, libc::MSG_WAITFORONE).unwrap(), 1);
        let m = r.get(0).unwrap();
        assert_eq!((m.data, m.source()), (&b"v6"[..], Some(tx6.local_addr().unwrap())));
        assert!(!m.control_truncated());
        assert_eq!(pktinfo_dst(m.control), Some("::1".parse().unwrap()));
        assert_eq!(cmsg::iter(m.control).count(), 2, "pktinfo and traffic class");
    }

    /// SEQPACKET records into the caller's buffers: lengths and MSG_TRUNC per record.
    #[test]
    fn seqpacket_records_into_the_callers_buffers() {
        let (a, b) = crate::seqpacket::pair().unwrap();
        let mut store = vec![vec![0u8; 32]; 4];
        let mut r = RecvMmsg::new(8, 0);
        {
            let mut bufs: Vec<IoSliceMut<'_>> = store.iter_mut().map(|v| IoSliceMut::new(v)).collect();
            let e = r.recv_into(&b, &mut bufs, libc::MSG_DONTWAIT).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            for i in 0..3u8 {
                crate::seqpacket::send_record(a.as_fd(), &vec![i; 5 + usize::from(i) * 20], &[], 0).unwrap();
            }
            assert_eq!(r.recv_into(&b, &mut bufs, libc::MSG_DONTWAIT).unwrap(), 3);
        }
        let lens: Vec<_> = r.iter().map(|m| (m.len, m.truncated(), m.data.len())).collect();
        assert_eq!(lens, [(5, false, 0), (25, false, 0), (32, true, 0)]);
        assert_eq!(&store[1][..25], &[1u8; 25][..]);
        assert_eq!(&store[2][..], &[2u8; 32][..]);
        // Only as many as there are buffers, and the batch's own buffers need a length.
        for _ in 0..3 {
            crate::seqpacket::send_record(a.as_fd(), b"x", &[], 0).unwrap();
        }
        let mut one = [0u8; 4];
        assert_eq!(r.recv_into(&b, &mut [IoSliceMut::new(&mut one)], 0).unwrap(), 1);
        assert_eq!(r.recv(&b, 0).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    /// Each message is the concatenation of its slices, one record per message.
    #[test]
    fn seqpacket_batch_of_two_slice_messages() {
        let (a, b) = crate::seqpacket::pair().unwrap();
        let heads = [[1u8; 3], [2; 3], [3; 3]];
        let bodies = [&b"alpha"[..], b"", b"gamma!"];
        let mut s = SendMmsg::new(4, 2);
        let mut batch = s.batch();
        for (h, body) in heads.iter().zip(bodies) {
            assert!(batch.push(&[h, body], SendMeta::default()));
        }
        assert!(!batch.push(&[b"a", b"b", b"c"], SendMeta::default()), "three slices where two fit");
        assert_eq!(batch.len(), 3);
        assert_eq!(batch.send_from(&a, 0, libc::MSG_DONTWAIT).unwrap(), 3);
        assert_eq!((batch.sent_len(0), batch.sent_len(1), batch.sent_len(2)), (8, 3, 9));
        assert_eq!(batch.send_from(&a, 3, 0).unwrap(), 0, "nothing left");
        let mut r = RecvMmsg::new(4, 16);
        assert_eq!(r.recv(&b, libc::MSG_DONTWAIT).unwrap(), 3);
        let got: Vec<Vec<u8>> = r.iter().map(|m| m.data.to_vec()).collect();
        assert_eq!(got, [b"\x01\x01\x01alpha".to_vec(), vec![2, 2, 2], b"\x03\x03\x03gamma!".to_vec()]);
    }

    /// A full socket takes the first k messages of a batch; sending on from k is
    /// EAGAIN; skipping tells each refused one and sends nothing twice.
    #[test]
    fn partial_send_then_eagain() {
        let (a, b) = crate::seqpacket::pair().unwrap();
        SockRef::from(&a).set_send_buffer_size(16 * 1024).unwrap();
        let record = vec![7u8; 4000];
        let mut s = SendMmsg::new(64, 1);
        let mut batch = s.batch();
        while batch.push(&[&record], SendMeta::default()) {}
        assert!(batch.is_full());
        let k = batch.send_from(&a, 0, libc::MSG_DONTWAIT).unwrap();
        assert!(k > 0 && k < 64, "a 16 KiB buffer takes some of 64 × 4000 bytes: {k}");
        let e = batch.send_from(&a, k, libc::MSG_DONTWAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let mut refused = Vec::new();
        let more = batch.send_skipping(&a, libc::MSG_DONTWAIT, |i, e| refused.push((i, e.kind())));
        assert_eq!(more, 0, "still full");
        assert_eq!(refused.len(), 64, "every message refused once, none twice");
        assert!(refused.iter().enumerate().all(|(i, r)| *r == (i, io::ErrorKind::WouldBlock)));
        let mut r = RecvMmsg::new(64, 4096);
        assert_eq!(r.recv(&b, libc::MSG_DONTWAIT).unwrap(), k, "exactly the k messages taken");
        assert!(r.iter().all(|m| m.data == &record[..]));
    }

    /// Destinations per message, on an unconnected socket; a refused message in the
    /// middle (no such family) is skipped and the rest go.
    #[test]
    fn names_per_message_and_a_refused_one_skipped() {
        let (r1, r2) = (udp("127.0.0.1:0"), udp("127.0.0.1:0"));
        let tx = udp("127.0.0.1:0");
        let (to1, to2) = (SockAddr::from(r1.local_addr().unwrap()), SockAddr::from(r2.local_addr().unwrap()));
        let v6 = SockAddr::from("[::1]:9".parse::<SocketAddr>().unwrap());
        let mut s = SendMmsg::new(8, 1);
        let mut batch = s.batch();
        for (to, what) in [(&to1, &b"one"[..]), (&v6, b"bad"), (&to2, b"two"), (&to1, b"three")] {
            assert!(batch.push(&[what], SendMeta::to(to)));
        }
        let mut refused = Vec::new();
        assert_eq!(batch.send_skipping(&tx, 0, |i, _| refused.push(i)), 3);
        assert_eq!(refused, [1]);
        let mut buf = [0u8; 8];
        for (rx, want) in [(&r1, &b"one"[..]), (&r2, b"two"), (&r1, b"three")] {
            let (n, from) = rx.recv_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], from), (want, tx.local_addr().unwrap()));
        }
    }

    /// A datagram sent with a source address arrives from it: 127.0.0.9 from a socket
    /// bound to 0.0.0.0 (any 127/8 address is local), ::1 from one bound to ::; the
    /// same batch reused without a source sends from the route's choice.
    #[test]
    fn the_datagram_leaves_from_the_given_source() {
        for (bind, src, to) in [("0.0.0.0:0", "127.0.0.9", "127.0.0.1:0"), ("[::]:0", "::1", "[::1]:0")] {
            let (tx, rx) = (udp(bind), udp(to));
            let dst = SockAddr::from(rx.local_addr().unwrap());
            let src: IpAddr = src.parse().unwrap();
            let mut s = SendMmsg::new(2, 1);
            let mut batch = s.batch();
            assert!(batch.push(&[b"x"], SendMeta { to: Some(&dst), source: Some(src), segment_size: None }));
            assert_eq!(batch.send_from(&tx, 0, 0).unwrap(), 1);
            let mut b = [0u8; 4];
            assert_eq!(rx.recv_from(&mut b).unwrap().1.ip(), src, "from {bind}");
            let mut batch = s.batch();
            assert!(batch.push(&[b"y"], SendMeta::to(&dst)));
            assert_eq!(batch.send_from(&tx, 0, 0).unwrap(), 1);
            let from = rx.recv_from(&mut b).unwrap().1.ip();
            assert_eq!(from, rx.local_addr().unwrap().ip(), "no source: the route's, here the destination's");
        }
    }

    /// UDP_SEGMENT: one message of 2500 bytes leaves as datagrams of 1000, 1000 and 500.
    #[test]
    fn a_segment_size_splits_the_message() {
        let rx = udp("127.0.0.1:0");
        let tx = udp("127.0.0.1:0");
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let data: Vec<u8> = (0..2500u32).map(|i| (i / 1000) as u8).collect();
        let mut s = SendMmsg::new(1, 1);
        let mut batch = s.batch();
        assert!(batch.push(&[&data], SendMeta { segment_size: Some(1000), ..SendMeta::default() }));
        assert_eq!(batch.send_from(&tx, 0, 0).unwrap(), 1);
        let mut r = RecvMmsg::new(4, 2048);
        let mut lens = Vec::new();
        while lens.len() < 3 {
            lens.extend((0..r.recv(&rx, libc::MSG_WAITFORONE).unwrap()).map(|i| r.get(i).map(|m| (m.len, m.data[0]))));
        }
        assert_eq!(lens, [Some((1000, 0)), Some((1000, 1)), Some((500, 2))]);
    }

    /// A batch is cleared by `batch()`, holds `capacity` messages, and moves to
    /// another thread with its arrays.
    #[test]
    fn capacity_and_reuse() {
        let (a, b) = crate::seqpacket::pair().unwrap();
        let mut s = SendMmsg::new(2, 1);
        for round in 0..3u8 {
            let data = [round; 3];
            let mut batch = s.batch();
            assert!(batch.is_empty());
            assert!(batch.push(&[&data], SendMeta::default()) && batch.push(&[&data[..1]], SendMeta::default()));
            assert!(!batch.push(&[&data], SendMeta::default()), "full at 2");
            assert_eq!(batch.send_from(a.as_fd(), 0, 0).unwrap(), 2);
        }
        let mut r = RecvMmsg::new(8, 8);
        let r = std::thread::spawn(move || {
            r.recv(&b, libc::MSG_DONTWAIT).unwrap();
            r.iter().map(|m| m.data.to_vec()).collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        assert_eq!(r, [vec![0; 3], vec![0], vec![1; 3], vec![1], vec![2; 3], vec![2]]);
    }
}
