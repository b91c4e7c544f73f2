//! The flood's sends: batches of datagrams, one sendmmsg(2) per batch (`sys::mmsg`),
//! each datagram one message or (with GSO) one UDP_SEGMENT train, optionally from a
//! source address of the caller's choice (IP_PKTINFO).

use ::sys::mmsg::{SendBatch, SendMeta, SendMmsg};
use socket2::SockAddr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;

/// The kernel's UDP_MAX_SEGMENTS.
pub const MAX_GSO_SEGMENTS: usize = 64;

pub use ::sys::monotonic_ns;

/// Sends every message of `batch`, blocking: a failing message is counted and skipped,
/// never retried. (sent, errors, the last error).
fn send_all(mut batch: SendBatch<'_, '_>, fd: impl AsFd) -> (usize, usize, Option<io::Error>) {
    let (mut errors, mut last) = (0, None);
    let sent = batch.send_skipping(fd, 0, |_, e| {
        errors += 1;
        last = Some(e);
    });
    (sent, errors, last)
}

/// Reusable sendmmsg state for a connected socket: up to `cap` messages, each one
/// datagram or (with GSO) one train of equal-sized segments.
pub struct MmsgSender {
    mmsg: SendMmsg,
    gso_segment_size: Option<u16>,
}

impl MmsgSender {
    /// `gso_segment_size`: Some(size) attaches UDP_SEGMENT = size to every message.
    pub fn new(cap: usize, gso_segment_size: Option<u16>) -> MmsgSender {
        MmsgSender { mmsg: SendMmsg::new(cap, 1), gso_segment_size }
    }

    pub fn capacity(&self) -> usize {
        self.mmsg.capacity()
    }

    /// Sends each `data[start..start + len]` of `msgs` (at most `capacity()`) as one
    /// message on the connected socket `fd`. Returns how many messages went out, how
    /// many failed (each failure is counted and skipped, never retried) and the last error.
    pub fn send(&mut self, fd: impl AsFd, data: &[u8], msgs: &[(usize, usize)]) -> (usize, usize, Option<io::Error>) {
        let meta = SendMeta { segment_size: self.gso_segment_size, ..SendMeta::default() };
        let mut batch = self.mmsg.batch();
        for &(start, len) in msgs {
            if !batch.push(&[&data[start..start + len]], meta) {
                break;
            }
        }
        send_all(batch, fd)
    }
}

/// Reusable sendmmsg state for an unconnected IPv4 socket bound to 0.0.0.0 that sends
/// every datagram to one target from a source address of the caller's choice
/// (IP_PKTINFO `ipi_spec_dst`, ip(7)). Any 127.0.0.0/8 address is local on Linux
/// (the `local 127.0.0.0/8 dev lo` route), so a loopback source needs no raw socket
/// and no privilege: many clients as seen by the receiver, from one socket.
pub struct SpoofSender {
    mmsg: SendMmsg,
    target: SockAddr,
}

impl SpoofSender {
    pub fn new(cap: usize, target: SocketAddrV4) -> SpoofSender {
        SpoofSender { mmsg: SendMmsg::new(cap, 1), target: target.into() }
    }

    /// Sends each `data[start..start + len]` of `msgs` (at most the capacity) to the
    /// target from `sources[i]`, the i-th message's source address. Returns as
    /// [`MmsgSender::send`].
    pub fn send(
        &mut self,
        fd: impl AsFd,
        data: &[u8],
        msgs: &[(usize, usize)],
        sources: &[Ipv4Addr],
    ) -> (usize, usize, Option<io::Error>) {
        let mut batch = self.mmsg.batch();
        for (&(start, len), &src) in msgs.iter().zip(sources) {
            let meta = SendMeta { to: Some(&self.target), source: Some(IpAddr::V4(src)), segment_size: None };
            if !batch.push(&[&data[start..start + len]], meta) {
                break;
            }
        }
        send_all(batch, fd)
    }
}
