//! Handshake-done notices, registry → shards.
//!
//! A worker sends `Data::HandshakeDone { odcid }` on its data connection when quinn
//! reports a connection established. The registry thread appends (its server id, the
//! DCID) here; every shard, once per batch, takes the notices it has not seen yet and
//! gives back the handshake ticket of its pin of that DCID if the pin targets that
//! instance (`PinTable::take_payload`). The pin itself stays: the client's late
//! Initials and 0-RTT keep their instance until it expires.
//!
//! The shard that placed the DCID is not known (the kernel picks it), so every shard
//! looks; a look is one pin-table probe. Fixed memory: a ring of [`CAPACITY`] notices,
//! one writer; a shard more than [`CAPACITY`] behind skips the oldest ones (their
//! tickets then leave when their pins expire, as before). The hot path pays one
//! relaxed atomic load per batch when there is nothing new.
//!
//! **Trust.** A notice only releases a ticket of a pin placed on the sending worker's
//! own instance, at most once per pin (the payload is taken): a forged, duplicate or
//! stale notice releases nothing, and no lane can underflow. A worker can release the
//! tickets of handshakes placed on itself — what it can do anyway by completing them
//! (or, with a wrong DCID, nothing). Workers are trusted processes of the appliance
//! (they hold the token and CID keys); the bound is per-instance, not per-client.

use proto::cid::ServerId;
use proto::wire::data::MAX_ODCID_LEN;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Notices kept for shards that lag behind.
pub const CAPACITY: usize = 4096;

#[derive(Clone, Copy)]
struct Notice {
    server_id: ServerId,
    len: u8,
    odcid: [u8; MAX_ODCID_LEN],
}

/// The notice ring shared by the registry (writer) and every shard (readers).
pub struct HandshakesDone {
    ring: Mutex<Box<[Notice]>>,
    /// Notices ever written (the next one's sequence number).
    written: AtomicU64,
}

impl std::fmt::Debug for HandshakesDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakesDone").field("written", &self.written.load(Ordering::Relaxed)).finish()
    }
}

impl Default for HandshakesDone {
    fn default() -> Self {
        let empty = Notice { server_id: ServerId(0), len: 0, odcid: [0; MAX_ODCID_LEN] };
        HandshakesDone { ring: Mutex::new(vec![empty; CAPACITY].into_boxed_slice()), written: AtomicU64::new(0) }
    }
}

impl HandshakesDone {
    /// Instance `server_id` reports the handshake of `odcid` done (registry thread).
    /// A DCID longer than a CID may be is ignored.
    pub fn push(&self, server_id: ServerId, odcid: &[u8]) {
        if odcid.len() > MAX_ODCID_LEN {
            return;
        }
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.written.load(Ordering::Relaxed);
        let mut n = Notice { server_id, len: odcid.len() as u8, odcid: [0; MAX_ODCID_LEN] };
        n.odcid[..odcid.len()].copy_from_slice(odcid);
        ring[(seq % CAPACITY as u64) as usize] = n;
        // Release: a shard that sees the new count under the lock sees the notice.
        self.written.store(seq + 1, Ordering::Release);
    }

    /// Notices written so far (a shard compares its cursor with it, once per batch).
    #[inline]
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Calls `f` for every notice after `cursor` (the newest [`CAPACITY`] at most) and
    /// moves `cursor` to the end.
    pub fn take_since(&self, cursor: &mut u64, mut f: impl FnMut(ServerId, &[u8])) {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let end = self.written.load(Ordering::Relaxed);
        let start = (*cursor).max(end.saturating_sub(CAPACITY as u64));
        for seq in start..end {
            let n = &ring[(seq % CAPACITY as u64) as usize];
            f(n.server_id, &n.odcid[..usize::from(n.len)]);
        }
        *cursor = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_each_notice_once_and_skip_what_fell_out() {
        let h = HandshakesDone::default();
        let mut a = 0;
        h.push(ServerId(1), &[1, 2, 3]);
        h.push(ServerId(2), &[4]);
        h.push(ServerId(2), &[0; 21]);
        let mut seen = vec![];
        h.take_since(&mut a, |s, d| seen.push((s, d.to_vec())));
        assert_eq!(seen, [(ServerId(1), vec![1, 2, 3]), (ServerId(2), vec![4])]);
        h.take_since(&mut a, |_, _| panic!("nothing new"));
        for i in 0..(CAPACITY + 10) {
            h.push(ServerId(3), &(i as u32).to_be_bytes());
        }
        let mut n = 0;
        let mut first = None;
        h.take_since(&mut a, |_, d| {
            first.get_or_insert(d.to_vec());
            n += 1
        });
        assert_eq!(n, CAPACITY);
        assert_eq!(first, Some(10u32.to_be_bytes().to_vec()));
    }
}
