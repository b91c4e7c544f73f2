//! Forwarding to workers: frames collected during one receive batch are grouped by
//! destination and sent with one sendmmsg(2) per destination, MSG_DONTWAIT. Each
//! message is two iovecs — the 44-byte frame header (proto::wire, docs/wire.md) and
//! the payload where it was received — so payloads are never copied. All arrays are
//! allocated once per shard; nothing is allocated per datagram.
//!
//! A full data connection (EAGAIN / ENOBUFS) drops the rest of that destination's
//! frames in this batch, counted for the instance: a shard never blocks on a worker.

use crate::dataplane::counters::{bump, ShardCounters};
use crate::dataplane::snapshot::Snapshot;
use proto::wire::{encode_frame_header, FrameMeta, FRAME_HEADER_LEN};
use std::os::fd::AsRawFd;

/// Frames one batch may hold before a forced flush.
pub const MAX_PENDING: usize = 1024;

struct Pending {
    hdr: [u8; FRAME_HEADER_LEN],
    target: u32,
    segments: u32,
    payload: *const u8,
    len: usize,
}

pub struct Forwarder {
    pending: Vec<Pending>,
    order: Vec<(u32, u32)>,
    iovs: Vec<[libc::iovec; 2]>,
    msgs: Vec<libc::mmsghdr>,
    /// This shard's index: its ring in `DataConn::rings` (`--forward ring`).
    shard: usize,
}

impl Forwarder {
    /// The forwarder of shard `shard` (which ring of a worker's rings is ours).
    pub fn new(shard: usize) -> Forwarder {
        let empty_iov = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        Forwarder {
            pending: Vec::with_capacity(MAX_PENDING),
            order: Vec::with_capacity(MAX_PENDING),
            iovs: vec![[empty_iov, empty_iov]; MAX_PENDING],
            // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
            msgs: (0..MAX_PENDING).map(|_| unsafe { std::mem::zeroed::<libc::mmsghdr>() }).collect(),
            shard,
        }
    }

    pub fn is_full(&self) -> bool {
        self.pending.len() >= MAX_PENDING
    }

    /// Queues `payload` for `target` (an index of `snap.conns`).
    ///
    /// # Safety
    /// `payload` must stay valid and unchanged until the next [`Forwarder::flush`]:
    /// only its address is kept. The caller must flush before the queue is full
    /// ([`Forwarder::is_full`]); an overfull push is dropped and counted.
    pub unsafe fn push(
        &mut self,
        target: usize,
        meta: &FrameMeta,
        payload: &[u8],
        segments: u32,
        counters: &ShardCounters,
    ) {
        if self.pending.len() >= MAX_PENDING {
            bump(&counters.drops_full, u64::from(segments));
            return;
        }
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        encode_frame_header(meta, &mut hdr);
        self.pending.push(Pending {
            hdr,
            target: target as u32,
            segments,
            payload: payload.as_ptr(),
            len: payload.len(),
        });
    }

    /// Sends everything queued, one sendmmsg per destination, and counts the outcome.
    pub fn flush(&mut self, snap: &Snapshot, counters: &ShardCounters) {
        if self.pending.is_empty() {
            return;
        }
        self.order.clear();
        self.order.extend(self.pending.iter().enumerate().map(|(i, p)| (p.target, i as u32)));
        // Sorting (target, arrival index) groups by destination and keeps each
        // destination's order. sort_unstable does not allocate.
        self.order.sort_unstable();
        let mut start = 0;
        while start < self.order.len() {
            let target = self.order[start].0;
            let mut end = start;
            while end < self.order.len() && self.order[end].0 == target {
                end += 1;
            }
            self.send_group(snap, target as usize, start, end, counters);
            start = end;
        }
        self.pending.clear();
    }

    /// `--forward ring`: copies the group's frames into this shard's ring for the
    /// worker, then publishes them at once and wakes it once if it sleeps. A full ring drops and counts exactly
    /// as a full data connection does.
    fn push_group(
        &self,
        ring: &crate::dataplane::ring::Producer,
        slot: usize,
        start: usize,
        end: usize,
        counters: &ShardCounters,
    ) {
        let inst = counters.instances.get(slot);
        let mut pushed = false;
        for &(_, i) in &self.order[start..end] {
            let p = &self.pending[i as usize];
            // SAFETY: `p.payload` / `p.len` come from a slice the caller keeps alive and
            // unchanged until flush returns (Forwarder::push contract).
            let payload = unsafe { std::slice::from_raw_parts(p.payload, p.len) };
            let segs = u64::from(p.segments);
            if ring.push(&p.hdr, payload) {
                pushed = true;
                if let Some(c) = inst {
                    bump(&c.datagrams, segs);
                    bump(&c.bytes, p.len as u64);
                }
            } else {
                bump(&counters.drops_full, segs);
                if let Some(c) = inst {
                    bump(&c.drops_full, segs);
                }
            }
        }
        if pushed {
            bump(&counters.ring_wakes, u64::from(ring.publish()));
        }
    }

    fn send_group(&mut self, snap: &Snapshot, target: usize, start: usize, end: usize, counters: &ShardCounters) {
        let n = end - start;
        let Some(conn) = snap.conns.get(target) else {
            // Cannot happen with a Decision from this snapshot's table; count, not panic.
            let segs: u64 =
                self.order[start..end].iter().map(|&(_, i)| u64::from(self.pending[i as usize].segments)).sum();
            bump(&counters.drops_send_error, segs);
            return;
        };
        if let Some(ring) = conn.rings.get(self.shard) {
            self.push_group(ring, conn.slot, start, end, counters);
            return;
        }
        for (k, &(_, i)) in self.order[start..end].iter().enumerate() {
            let p = &self.pending[i as usize];
            self.iovs[k] = [
                libc::iovec { iov_base: p.hdr.as_ptr() as *mut libc::c_void, iov_len: FRAME_HEADER_LEN },
                libc::iovec { iov_base: p.payload as *mut libc::c_void, iov_len: p.len },
            ];
            let h = &mut self.msgs[k].msg_hdr;
            h.msg_name = std::ptr::null_mut();
            h.msg_namelen = 0;
            h.msg_iov = self.iovs[k].as_mut_ptr();
            h.msg_iovlen = 2;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            self.msgs[k].msg_len = 0;
        }
        let inst = counters.instances.get(conn.slot);
        let mut sent = 0usize;
        let mut failure = None;
        while sent < n {
            bump(&counters.sendmmsg_calls, 1);
            // SAFETY: msgs[sent..n] are initialised above and point into `self.iovs`,
            // the headers in `self.pending` and payloads the caller keeps alive until
            // flush returns (Forwarder::push contract).
            let r = unsafe {
                libc::sendmmsg(
                    conn.fd.as_raw_fd(),
                    self.msgs[sent..n].as_mut_ptr(),
                    (n - sent) as libc::c_uint,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r > 0 {
                sent += r as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::ENOBUFS) => failure = Some(true),
                _ => failure = Some(false),
            }
            break;
        }
        for (k, &(_, i)) in self.order[start..end].iter().enumerate() {
            let p = &self.pending[i as usize];
            let segs = u64::from(p.segments);
            if k < sent {
                if let Some(c) = inst {
                    bump(&c.datagrams, segs);
                    bump(&c.bytes, p.len as u64);
                }
            } else if failure == Some(true) {
                bump(&counters.drops_full, segs);
                if let Some(c) = inst {
                    bump(&c.drops_full, segs);
                }
            } else {
                bump(&counters.drops_send_error, segs);
            }
        }
    }
}
