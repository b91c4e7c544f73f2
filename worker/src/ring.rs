//! The consumer side of a shared-memory forwarding ring (docs/wire.md "Ring"): the
//! data plane's shard writes records, this worker reads them. Layout and index
//! arithmetic are `proto::ring` (pure, model-tested); this module owns the mapping
//! and the few raw accesses into it.
//!
//! The producer is another process: everything read from the mapping is checked
//! (proto::ring::next) before it is used as an offset, and record bytes are copied
//! out with a raw copy, never borrowed as `&[u8]` (the producer may write the free
//! part of the ring at any time).
//!
//! Sleep protocol: [`Consumer::prepare_sleep`] sets *sleeping*, fences (SeqCst) and
//! re-checks the tail; only when the ring is still empty may the caller wait on
//! [`Consumer::eventfd`]; after waking it calls [`Consumer::woke`].

use proto::ring::{self, Next, OFF_CAPACITY, OFF_HEAD, OFF_MAGIC, OFF_TAIL, RING_MAGIC};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use sys::ring::Mapping;

/// One consumer per ring: `pop` takes `&self` but the owner (DemuxSocket) calls it
/// from one task at a time (it holds the rings in a Mutex).
pub struct Consumer {
    map: Mapping,
    capacity: u64,
    _memfd: OwnedFd,
    eventfd: OwnedFd,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer").field("capacity", &self.capacity).finish()
    }
}

fn corrupt(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("forwarding ring: {why}"))
}

impl Consumer {
    /// Maps a ring the data plane offered (`Rings { bytes }`): checks the memfd's
    /// size, the magic and the capacity before using it.
    pub fn open(memfd: OwnedFd, eventfd: OwnedFd, capacity: u64) -> io::Result<Consumer> {
        if !ring::valid_capacity(capacity) {
            return Err(corrupt("capacity"));
        }
        let map = Mapping::open(memfd.as_fd(), capacity)?;
        let c = Consumer { map, capacity, _memfd: memfd, eventfd };
        if c.word(OFF_MAGIC).load(Ordering::Acquire) != RING_MAGIC
            || c.word(OFF_CAPACITY).load(Ordering::Relaxed) != capacity
        {
            return Err(corrupt("bad magic or capacity"));
        }
        Ok(c)
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.map.word(off)
    }

    fn sleeping(&self) -> &AtomicU32 {
        self.map.sleeping()
    }

    /// Copies `out.len()` bytes from data offset `at` (in bounds: checked). The bytes
    /// lie between head and the tail read with Acquire, so the producer finished
    /// writing them and will not reuse them before we publish a head past them.
    fn read(&self, at: usize, out: &mut [u8]) {
        self.map.read(at, out)
    }

    /// The eventfd the producer writes when the consumer sleeps (register it with
    /// the reactor).
    pub fn eventfd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// A duplicate of the eventfd (for the reactor, which owns what it registers).
    pub fn eventfd_owned(&self) -> io::Result<OwnedFd> {
        self.eventfd.try_clone()
    }

    pub fn is_empty(&self) -> bool {
        self.word(OFF_TAIL).load(Ordering::Acquire) == self.word(OFF_HEAD).load(Ordering::Relaxed)
    }

    /// Copies the next record (frame header + payload) into `out` and consumes it.
    /// `Ok(None)`: empty. A record longer than `out` is consumed and dropped
    /// (`Ok(Some(0))`). `Err`: the producer wrote nonsense; stop using this ring.
    pub fn pop(&self, out: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            let head = self.word(OFF_HEAD).load(Ordering::Relaxed);
            let tail = self.word(OFF_TAIL).load(Ordering::Acquire);
            if head == tail {
                return Ok(None);
            }
            if tail < head || tail - head > self.capacity {
                return Err(corrupt("tail"));
            }
            let mut w = [0u8; 4];
            self.read(ring::word_at(head, self.capacity), &mut w);
            match ring::next(head, tail, self.capacity, u32::from_le_bytes(w)) {
                Next::Skip { new_head } => self.word(OFF_HEAD).store(new_head, Ordering::Release),
                Next::Record { at, len, new_head } => {
                    let n = if len <= out.len() {
                        self.read(at, &mut out[..len]);
                        len
                    } else {
                        0
                    };
                    self.word(OFF_HEAD).store(new_head, Ordering::Release);
                    return Ok(Some(n));
                }
                Next::Corrupt => return Err(corrupt("record length")),
            }
        }
    }

    /// Announces that the consumer is about to wait. `true`: the ring is still empty,
    /// wait on the eventfd (the producer will write it). `false`: records arrived in
    /// between; keep reading (the flag is cleared again).
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping().store(1, Ordering::Relaxed);
        // Pairs with the producer's fence between publishing the tail and reading
        // the flag: either it sees the flag, or we see its tail.
        fence(Ordering::SeqCst);
        if self.is_empty() {
            return true;
        }
        self.sleeping().store(0, Ordering::Relaxed);
        false
    }

    /// Records arrived while the flag was set: clear it (no syscall).
    pub fn awake(&self) {
        if self.sleeping().load(Ordering::Relaxed) != 0 {
            self.sleeping().store(0, Ordering::Relaxed);
        }
    }

    /// After a wake-up (or before reading again): clears the flag and the eventfd.
    pub fn woke(&self) {
        self.sleeping().store(0, Ordering::Relaxed);
        sys::ring::eventfd_clear(self.eventfd.as_fd());
    }
}
