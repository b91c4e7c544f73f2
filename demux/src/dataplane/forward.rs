//! Forwarding to workers: frames collected during one receive batch are grouped by
//! destination and sent with one sendmmsg(2) per destination, MSG_DONTWAIT. Each
//! message is two iovecs — the 48-byte frame header (proto::wire, docs/wire.md) and
//! the payload where it was received — so payloads are never copied. All arrays are
//! allocated once per shard; nothing is allocated per datagram.
//!
//! A full data connection (EAGAIN / ENOBUFS) drops the rest of that destination's
//! frames in this batch, counted for the instance: a shard never blocks on a worker.
//!
//! `--forward ring`: a frame for a worker with a ring is copied into that ring at
//! once, while the payload the kernel just wrote is still in this core's cache, and
//! the rings written in the batch are published (and their workers woken) at its
//! flush. Nothing of it is queued, sorted or kept until the flush.

use crate::dataplane::counters::{bump, ShardCounters};
use crate::dataplane::snapshot::Snapshot;
use proto::wire::frame::{self, FrameMeta};
use sys::mmsg::{SendMeta, SendMmsg};

/// Frames one batch may hold before a forced flush.
pub const MAX_PENDING: usize = 1024;

struct Pending {
    hdr: [u8; frame::HEADER_LEN],
    target: u32,
    segments: u32,
    payload: *const u8,
    len: usize,
}

pub struct Forwarder {
    pending: Vec<Pending>,
    order: Vec<(u32, u32)>,
    /// One destination's frames: header and payload, two slices a message.
    send: SendMmsg,
    /// This shard's index: its ring in `DataConn::rings` (`--forward ring`).
    shard: usize,
    /// The targets (indexes of `Snapshot::conns`) whose rings were pushed to since
    /// the last flush, and the same as a bit set (one look per push).
    rings_written: Vec<u32>,
    rings_written_bits: Vec<u64>,
    queued_total: u64,
}

impl Forwarder {
    /// The forwarder of shard `shard` (which ring of a worker's rings is ours).
    pub fn new(shard: usize) -> Forwarder {
        Forwarder {
            pending: Vec::with_capacity(MAX_PENDING),
            order: Vec::with_capacity(MAX_PENDING),
            send: SendMmsg::new(MAX_PENDING, 2),
            shard,
            rings_written: Vec::new(),
            rings_written_bits: Vec::new(),
            queued_total: 0,
        }
    }

    /// How many payloads were ever queued for a flush's sendmmsg (wrapping): when a
    /// push leaves it unchanged, the push kept no pointer to its payload.
    pub fn queued_total(&self) -> u64 {
        self.queued_total
    }

    pub fn is_full(&self) -> bool {
        self.pending.len() >= MAX_PENDING
    }

    /// Forwards `payload` to `target` (an index of `snap.conns`): into its ring at
    /// once, or queued for the flush's sendmmsg.
    ///
    /// # Safety
    /// `payload` must stay valid and unchanged until the next [`Forwarder::flush`]:
    /// only its address is kept. The caller must flush before the queue is full
    /// ([`Forwarder::is_full`]), with the same `snap`; an overfull push is dropped
    /// and counted.
    pub unsafe fn push(
        &mut self,
        snap: &Snapshot,
        target: usize,
        meta: &FrameMeta,
        payload: &[u8],
        segments: u32,
        counters: &ShardCounters,
    ) {
        let mut hdr = [0u8; frame::HEADER_LEN];
        if let Some(conn) = snap.conns.get(target) {
            if let Some(ring) = conn.rings.get(self.shard) {
                frame::encode_header(meta, &mut hdr);
                self.push_ring(ring, conn.slot, target, &hdr, payload, segments, counters);
                return;
            }
        }
        if self.pending.len() >= MAX_PENDING {
            bump(&counters.drops_full, u64::from(segments));
            return;
        }
        frame::encode_header(meta, &mut hdr);
        self.queued_total = self.queued_total.wrapping_add(1);
        self.pending.push(Pending {
            hdr,
            target: target as u32,
            segments,
            payload: payload.as_ptr(),
            len: payload.len(),
        });
    }

    /// Copies one frame into `target`'s ring (published at the flush). A full ring
    /// drops and counts exactly as a full data connection does.
    #[allow(clippy::too_many_arguments)]
    fn push_ring(
        &mut self,
        ring: &crate::dataplane::ring::Producer,
        slot: usize,
        target: usize,
        hdr: &[u8; frame::HEADER_LEN],
        payload: &[u8],
        segments: u32,
        counters: &ShardCounters,
    ) {
        let inst = counters.instances.get(slot);
        let segs = u64::from(segments);
        if !ring.push(hdr, payload) {
            bump(&counters.drops_full, segs);
            if let Some(c) = inst {
                bump(&c.drops_full, segs);
            }
            return;
        }
        if let Some(c) = inst {
            bump(&c.datagrams, segs);
            bump(&c.bytes, payload.len() as u64);
        }
        let (word, bit) = (target / 64, 1u64 << (target % 64));
        if self.rings_written_bits.len() <= word {
            self.rings_written_bits.resize(word + 1, 0);
        }
        if self.rings_written_bits[word] & bit == 0 {
            self.rings_written_bits[word] |= bit;
            self.rings_written.push(target as u32);
        }
    }

    /// Publishes every ring written since the last flush, waking each worker that
    /// sleeps once.
    fn publish_rings(&mut self, snap: &Snapshot, counters: &ShardCounters) {
        for &target in &self.rings_written {
            let t = target as usize;
            if let Some(ring) = snap.conns.get(t).and_then(|c| c.rings.get(self.shard)) {
                bump(&counters.ring_wakes, u64::from(ring.publish()));
            }
            if let Some(w) = self.rings_written_bits.get_mut(t / 64) {
                *w = 0;
            }
        }
        self.rings_written.clear();
    }

    /// Sends everything queued, one sendmmsg per destination, and counts the outcome.
    pub fn flush(&mut self, snap: &Snapshot, counters: &ShardCounters) {
        if !self.rings_written.is_empty() {
            self.publish_rings(snap, counters);
        }
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

    fn send_group(&mut self, snap: &Snapshot, target: usize, start: usize, end: usize, counters: &ShardCounters) {
        let n = end - start;
        let Some(conn) = snap.conns.get(target) else {
            // Cannot happen with a Decision from this snapshot's table; count, not panic.
            let segs: u64 =
                self.order[start..end].iter().map(|&(_, i)| u64::from(self.pending[i as usize].segments)).sum();
            bump(&counters.drops_send_error, segs);
            return;
        };
        let mut batch = self.send.batch();
        for &(_, i) in &self.order[start..end] {
            let p = &self.pending[i as usize];
            // SAFETY: `p.payload` and `p.len` are a payload the caller keeps valid and
            // unchanged until flush returns (Forwarder::push contract).
            let payload = unsafe { std::slice::from_raw_parts(p.payload, p.len) };
            batch.push(&[&p.hdr, payload], SendMeta::default());
        }
        let inst = counters.instances.get(conn.slot);
        let mut sent = 0usize;
        let mut failure = None;
        while sent < n {
            bump(&counters.sendmmsg_calls, 1);
            match batch.send_from(&conn.fd, sent, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
                Ok(k) if k > 0 => sent += k,
                Ok(_) => {
                    failure = Some(false);
                    break;
                }
                Err(e) => {
                    failure = Some(matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS)));
                    break;
                }
            }
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
