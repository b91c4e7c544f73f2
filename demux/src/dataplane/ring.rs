//! The producer side of a shared-memory forwarding ring (`--forward ring`,
//! docs/wire.md "Ring"): one per (shard, worker) pair, in a memfd the worker maps
//! too. Layout and index arithmetic are `proto::ring` (pure, tested against a model);
//! this module only owns the mapping and the few raw accesses into it.
//!
//! Only the owning shard calls [`Producer::push`] / [`Producer::publish`] (single
//! producer); the tail is the producer's own word, the head the consumer's.
//! Pushes of one round are published together (one store of the tail, one look at
//! the sleeping flag), and the head is read at a round's first push and again only
//! when the head read then leaves too little room: the words the other process writes
//! or reads are touched about once per round, not once per record (each touch moves a
//! cache line between the cores).
//! The consumer is another process and is not trusted. Nothing it can write changes
//! where the producer writes: the producer keeps its own copy of the tail (the shared
//! tail word is only published, never read back), its own capacity, and checks the
//! head it reads; a head that makes no sense makes every push fail (counted as full).
//! The memfd's size is sealed (`sys::ring::Mapping::create`), so the consumer cannot
//! truncate it under us either.

use proto::ring::{self, OFF_CAPACITY, OFF_HEAD, OFF_MAGIC, OFF_TAIL, RING_MAGIC, SKIP};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use sys::ring::Mapping;

/// Record bytes are written only by the single producer thread (the contract of
/// `push`), in the free part of the ring; `&Producer` exposes only push/publish, which
/// the owning shard alone calls.
pub struct Producer {
    map: Mapping,
    capacity: u64,
    /// The tail as this producer last published it (the shared word is the
    /// consumer's to read, and a hostile consumer may overwrite it). Only the owning
    /// shard touches it (Relaxed).
    tail: AtomicU64,
    /// The consumer's head as last read and checked, in this round (`head_read`; a
    /// publish ends the round). The real head only moves forward from it (an honest
    /// consumer), so room computed against it is never too much; a hostile
    /// consumer's head is checked whenever it is read again.
    head_seen: AtomicU64,
    head_read: AtomicBool,
    memfd: OwnedFd,
    eventfd: OwnedFd,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("capacity", &self.capacity).finish()
    }
}

impl Producer {
    /// Creates a ring of `capacity` data bytes (proto::ring::valid_capacity) in a new
    /// memfd, with its eventfd.
    pub fn create(capacity: u64) -> io::Result<Producer> {
        if !ring::valid_capacity(capacity) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "ring capacity"));
        }
        let (map, memfd) = Mapping::create(capacity)?;
        let eventfd = sys::ring::eventfd()?;
        let p = Producer {
            map,
            capacity,
            tail: AtomicU64::new(0),
            head_seen: AtomicU64::new(0),
            head_read: AtomicBool::new(false),
            memfd,
            eventfd,
        };
        p.word(OFF_CAPACITY).store(capacity, Ordering::Relaxed);
        p.word(OFF_MAGIC).store(RING_MAGIC, Ordering::Release);
        Ok(p)
    }

    /// The memfd and eventfd to hand to the worker (SCM_RIGHTS).
    pub fn fds(&self) -> [std::os::fd::BorrowedFd<'_>; 2] {
        [self.memfd.as_fd(), self.eventfd.as_fd()]
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.map.word(off)
    }

    fn sleeping(&self) -> &AtomicU32 {
        self.map.sleeping()
    }

    /// Copies `data` to data offset `at` (`at + data.len() <= capacity`, checked by
    /// the caller through proto::ring::reserve, asserted by the mapping): the free part
    /// of the ring (against the head the consumer published, Acquire), which the
    /// consumer does not read until the tail is published (Release).
    fn write(&self, at: usize, data: &[u8]) {
        self.map.write(at, data)
    }

    /// Appends one record (`hdr` then `payload`), visible to the consumer at the next
    /// [`Producer::publish`]. `false`: the ring is full (the caller drops and counts
    /// the frame). Only the owning shard calls this.
    pub fn push(&self, hdr: &[u8], payload: &[u8]) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        let len = hdr.len() + payload.len();
        let seen = self.head_read.load(Ordering::Relaxed).then(|| self.head_seen.load(Ordering::Relaxed));
        let r = match seen.and_then(|head| ring::reserve(head, tail, self.capacity, len)) {
            Some(r) => r,
            None => {
                // The round's first push, or too little room against the head read
                // earlier in it: read the consumer's.
                let head = self.word(OFF_HEAD).load(Ordering::Acquire);
                if head > tail || tail - head > self.capacity || !head.is_multiple_of(ring::ALIGN as u64) {
                    return false; // a consumer that wrote nonsense: never write out of bounds
                }
                self.head_seen.store(head, Ordering::Relaxed);
                self.head_read.store(true, Ordering::Relaxed);
                let Some(r) = ring::reserve(head, tail, self.capacity, len) else {
                    return false;
                };
                r
            }
        };
        // The next record's place is fetched while this one is copied (a record's
        // lines in the ring are cold: the consumer's core read them last).
        if let Some(next) = ring::next_span(r.new_tail, self.capacity, len) {
            self.map.prefetch_for_write(next);
        }
        if let Some(s) = r.skip_at {
            self.write(s, &SKIP.to_le_bytes());
        }
        self.write(r.at, &((hdr.len() + payload.len()) as u32).to_le_bytes());
        self.write(r.at + ring::LEN_WORD, hdr);
        self.write(r.at + ring::LEN_WORD + hdr.len(), payload);
        self.tail.store(r.new_tail, Ordering::Relaxed);
        true
    }

    /// After a batch of pushes: makes them visible (Release store of the tail) and
    /// wakes the consumer if it said it sleeps. Returns whether the eventfd was written.
    pub fn publish(&self) -> bool {
        self.word(OFF_TAIL).store(self.tail.load(Ordering::Relaxed), Ordering::Release);
        self.head_read.store(false, Ordering::Relaxed);
        // Pairs with the consumer's fence between setting `sleeping` and re-reading
        // the tail: either it sees our tail, or we see its flag.
        fence(Ordering::SeqCst);
        if self.sleeping().load(Ordering::Relaxed) == 0 {
            return false;
        }
        sys::ring::eventfd_signal(self.eventfd.as_fd());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use worker::ring::Consumer;

    fn consumer(p: &Producer) -> Consumer {
        let [m, e] = p.fds();
        Consumer::open(m.try_clone_to_owned().unwrap(), e.try_clone_to_owned().unwrap(), p.capacity()).unwrap()
    }

    /// Deterministic record `i`: its length and bytes follow from `i`.
    fn record(i: u64, buf: &mut Vec<u8>) {
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234_5678;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let len = match next() % 50 {
            0 => 65_535,
            1..=4 => (next() % 65_535 + 1) as usize,
            _ => (next() % 1500 + 1) as usize,
        };
        buf.clear();
        buf.extend_from_slice(&i.to_le_bytes());
        buf.resize(44 + len, (i as u8) ^ 0x5a);
        let last = buf.len() - 1;
        buf[last] = len as u8;
    }

    /// A producer thread and a consumer thread on two mappings of one memfd:
    /// random record sizes up to 44 + 65 535 bytes, many wrap-arounds, full-ring drops
    /// counted, every record that was accepted arrives once, in order, intact; the
    /// consumer sleeps on the eventfd and is never left sleeping on a non-empty ring.
    #[test]
    fn cross_thread_no_loss_no_dup_no_missed_wakeup() {
        const N: u64 = 120_000;
        let p = Producer::create(1 << 18).unwrap();
        let c = consumer(&p);
        let done = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (acc2, done2) = (accepted.clone(), done.clone());
        let prod = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let (mut full, mut wakes) = (0u64, 0u64);
            let mut ok = Vec::new();
            for i in 0..N {
                record(i, &mut buf);
                if p.push(&buf[..44], &buf[44..]) {
                    ok.push(i);
                } else {
                    full += 1;
                }
                // Batches of 1..8 records, then one publish and wake check.
                if i % (1 + i % 8) == 0 {
                    wakes += u64::from(p.publish());
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            }
            p.publish();
            *acc2.lock().unwrap() = ok;
            done2.store(true, Ordering::Release);
            // Keep the producer's mapping alive until the consumer is done.
            (p, full, wakes)
        });
        let mut got = Vec::new();
        let mut out = vec![0u8; 44 + 65_535];
        let mut sleeps = 0u64;
        loop {
            match c.pop(&mut out).unwrap() {
                Some(n) => {
                    let i = u64::from_le_bytes(out[..8].try_into().unwrap());
                    let mut want = Vec::new();
                    record(i, &mut want);
                    assert_eq!(&out[..n], &want[..], "record {i}");
                    got.push(i);
                }
                None => {
                    if done.load(Ordering::Acquire) && c.is_empty() {
                        break;
                    }
                    if c.prepare_sleep() {
                        sleeps += 1;
                        // A missed wake-up would block here forever: bound it and fail.
                        let mut pfd = libc::pollfd { fd: c.eventfd(), events: libc::POLLIN, revents: 0 };
                        // SAFETY: poll(2) on one live pollfd.
                        let r = unsafe { libc::poll(&mut pfd, 1, 5_000) };
                        assert!(r == 1 || done.load(Ordering::Acquire), "missed wake-up");
                        c.woke();
                    }
                }
            }
        }
        let (_p, full, wakes) = prod.join().unwrap();
        let ok = accepted.lock().unwrap().clone();
        assert_eq!(got, ok, "every accepted record once, in order");
        assert_eq!(ok.len() as u64 + full, N);
        // How many fit depends on scheduling (a loaded machine starves the consumer);
        // what must hold is above. Enough went through to wrap the ring many times.
        assert!(ok.len() as u64 >= N / 100, "records went through: {} of {N}", ok.len());
        eprintln!("accepted {} full {full} consumer sleeps {sleeps} wakes {wakes}", ok.len());
    }

    #[test]
    fn full_ring_refuses_and_recovers() {
        let p = Producer::create(1 << 17).unwrap();
        let c = consumer(&p);
        let payload = vec![7u8; 1200];
        let mut n = 0;
        while p.push(&[1u8; 44], &payload) {
            n += 1;
        }
        assert_eq!(n, (1 << 17) / proto::ring::slot_len(1244));
        assert!(!p.push(&[1u8; 44], &payload));
        let mut out = vec![0u8; 70_000];
        assert_eq!(c.pop(&mut out).unwrap(), None, "nothing is visible before publish");
        p.publish();
        assert_eq!(c.pop(&mut out).unwrap(), Some(1244));
        // The room the consumer freed is seen when the producer looks again.
        assert!(p.push(&[1u8; 44], &payload));
        assert!(!p.push(&[1u8; 44], &payload));
    }

    /// A hostile consumer overwrites the producer's tail word (and the magic and
    /// capacity) with values that would put a record, or the SKIP word, past the end of
    /// the data area: the producer ignores them (its own tail, its own capacity), every
    /// push stays in bounds, and an honest reader of the same mapping still gets
    /// intact records.
    #[test]
    fn garbage_tail_written_by_the_consumer_is_ignored() {
        let p = Producer::create(1 << 17).unwrap();
        let c = consumer(&p);
        let payload = vec![9u8; 1200];
        let mut out = vec![0u8; 70_000];
        for (i, garbage) in
            [(1u64 << 17) - 2, (1 << 17) - 1, 3, u64::MAX, u64::MAX - 5, (1 << 40) + 7].into_iter().enumerate()
        {
            let before = p.tail.load(Ordering::Relaxed);
            p.word(OFF_TAIL).store(garbage, Ordering::Relaxed);
            p.word(OFF_CAPACITY).store(u64::MAX, Ordering::Relaxed);
            p.word(OFF_MAGIC).store(0, Ordering::Relaxed);
            // The head is still sane (the honest reader's): the push succeeds, from our tail.
            p.word(OFF_HEAD).store(before, Ordering::Relaxed);
            assert!(p.push(&[i as u8; 44], &payload), "push {i} after a garbage tail {garbage:#x}");
            p.publish();
            assert_eq!(p.word(OFF_TAIL).load(Ordering::Relaxed), before + proto::ring::slot_len(1244) as u64);
            assert_eq!(c.pop(&mut out).unwrap(), Some(1244));
            assert_eq!((&out[..44], &out[44..1244]), (&[i as u8; 44][..], &payload[..]));
        }
    }

    /// The head is read when the head seen last leaves too little room: then a head
    /// past the tail, further behind it than the capacity, or misaligned refuses the
    /// push; the consumer's real progress is taken.
    #[test]
    fn nonsense_head_refuses_pushes() {
        let p = Producer::create(1 << 17).unwrap();
        let payload = [1u8; 1200];
        let fill = || while p.push(&[0u8; 44], &payload) {};
        fill();
        // The consumer took it all; the producer fills the ring once more (it reads the
        // head again when it runs out of room), so its tail is past the capacity.
        p.word(OFF_HEAD).store(p.tail.load(Ordering::Relaxed), Ordering::Relaxed);
        fill();
        p.publish();
        let tail = p.tail.load(Ordering::Relaxed);
        assert!(tail > 1 << 17);
        // Past the tail, misaligned, further behind than the capacity.
        for nonsense in [1 << 40, tail + 8, tail - 1, 0] {
            p.word(OFF_HEAD).store(nonsense, Ordering::Relaxed);
            assert!(!p.push(&[0u8; 44], &payload), "head {nonsense:#x}, tail {tail:#x}");
            assert_eq!(p.tail.load(Ordering::Relaxed), tail, "nothing written");
        }
        // The consumer took everything: room again.
        p.word(OFF_HEAD).store(tail, Ordering::Relaxed);
        assert!(p.push(&[0u8; 44], &payload));
    }
}
