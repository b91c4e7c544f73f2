//! The producer side of a shared-memory forwarding ring (`--forward ring`,
//! docs/wire.md "Ring"): one per (shard, worker) pair, in a memfd the worker maps
//! too. Layout and index arithmetic are `proto::ring` (pure, tested against a model);
//! this module only owns the mapping and the few raw accesses into it.
//!
//! Only the owning shard calls [`Producer::push`] / [`Producer::wake`] (single
//! producer); the tail is the producer's own word, the head the consumer's.
//! The consumer is another process and is not trusted: a head it writes that makes
//! no sense makes every push fail (counted as full), never an out-of-bounds write.

use proto::ring::{self, HEADER_LEN, OFF_CAPACITY, OFF_HEAD, OFF_MAGIC, OFF_SLEEPING, OFF_TAIL, RING_MAGIC, SKIP};
use crate::sys::cvt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

pub struct Producer {
    base: *mut u8,
    map_len: usize,
    capacity: u64,
    memfd: OwnedFd,
    eventfd: OwnedFd,
}

// SAFETY: the mapping is owned by the Producer (unmapped in Drop only); shared words
// are accessed through atomics, and record bytes are written only by the single
// producer thread (the contract of `push`), in the free part of the ring.
unsafe impl Send for Producer {}
// SAFETY: as above; `&Producer` exposes only push/wake, which the owning shard alone calls.
unsafe impl Sync for Producer {}

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
        let map_len = HEADER_LEN + capacity as usize;
        // SAFETY: memfd_create with a NUL-terminated name; the returned fd is owned below.
        let fd = cvt(unsafe { libc::memfd_create(c"quicdemux-ring".as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on an fd we own.
        cvt(unsafe { libc::ftruncate(memfd.as_raw_fd(), map_len as libc::off_t) })?;
        // SAFETY: eventfd(2); the fd is owned below.
        let efd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: fresh descriptor.
        let eventfd = unsafe { OwnedFd::from_raw_fd(efd) };
        // SAFETY: a new shared mapping of the whole memfd (sized above); checked for
        // MAP_FAILED; unmapped in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                memfd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let p = Producer { base: base as *mut u8, map_len, capacity, memfd, eventfd };
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
        debug_assert!(off.is_multiple_of(8) && off + 8 <= HEADER_LEN);
        // SAFETY: `off` is an 8-aligned offset inside the header page of a live,
        // page-aligned mapping; AtomicU64 has the layout of u64 and every access to
        // this word, in both processes, is atomic.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: as `word`, a 4-aligned u32 in the header page.
        unsafe { &*(self.base.add(OFF_SLEEPING) as *const AtomicU32) }
    }

    /// Copies `data` to data offset `at` (`at + data.len() <= capacity`, checked by
    /// the caller through proto::ring::reserve).
    fn write(&self, at: usize, data: &[u8]) {
        assert!(at as u64 + data.len() as u64 <= self.capacity);
        // SAFETY: in bounds (asserted); the destination lies in the free part of the
        // ring (proto::ring::reserve against the head the consumer published, Acquire),
        // which the consumer does not read until the tail is published (Release).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(HEADER_LEN + at), data.len()) }
    }

    /// Appends one record (`hdr` then `payload`) and publishes it. `false`: the ring
    /// is full (the caller drops and counts the frame). Only the owning shard calls this.
    pub fn push(&self, hdr: &[u8], payload: &[u8]) -> bool {
        let tail = self.word(OFF_TAIL).load(Ordering::Relaxed);
        let head = self.word(OFF_HEAD).load(Ordering::Acquire);
        if head > tail || tail - head > self.capacity || !head.is_multiple_of(ring::ALIGN as u64) {
            return false; // a consumer that wrote nonsense: never write out of bounds
        }
        let Some(r) = ring::reserve(head, tail, self.capacity, hdr.len() + payload.len()) else {
            return false;
        };
        if let Some(s) = r.skip_at {
            self.write(s, &SKIP.to_le_bytes());
        }
        self.write(r.at, &((hdr.len() + payload.len()) as u32).to_le_bytes());
        self.write(r.at + ring::LEN_WORD, hdr);
        self.write(r.at + ring::LEN_WORD + hdr.len(), payload);
        self.word(OFF_TAIL).store(r.new_tail, Ordering::Release);
        true
    }

    /// After a batch of pushes: wakes the consumer if it said it sleeps. Returns
    /// whether the eventfd was written.
    pub fn wake(&self) -> bool {
        // Pairs with the consumer's fence between setting `sleeping` and re-reading
        // the tail: either it sees our tail, or we see its flag.
        fence(Ordering::SeqCst);
        if self.sleeping().load(Ordering::Relaxed) == 0 {
            return false;
        }
        let one: u64 = 1;
        // SAFETY: write(2) of 8 bytes from a live u64 to our eventfd. EAGAIN (counter
        // saturated) means a wake-up is pending anyway.
        unsafe { libc::write(self.eventfd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
        true
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `create`; no reference into
        // it outlives `self`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
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
                // Batches of 1..8 records, then one wake check.
                if i % (1 + i % 8) == 0 {
                    wakes += u64::from(p.wake());
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            }
            p.wake();
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
        assert!(ok.len() as u64 >= N / 4, "most records fit: {} of {N}", ok.len());
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
        assert_eq!(c.pop(&mut out).unwrap(), Some(1244));
        assert!(p.push(&[1u8; 44], &payload));
    }

    #[test]
    fn nonsense_head_refuses_pushes() {
        let p = Producer::create(1 << 17).unwrap();
        p.word(OFF_HEAD).store(1 << 40, Ordering::Relaxed);
        assert!(!p.push(&[0u8; 44], &[1u8; 10]));
        p.word(OFF_HEAD).store(0, Ordering::Relaxed);
        assert!(p.push(&[0u8; 44], &[1u8; 10]));
    }
}
