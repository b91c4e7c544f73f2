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

use proto::ring::{self, Next, HEADER_LEN, OFF_CAPACITY, OFF_HEAD, OFF_MAGIC, OFF_SLEEPING, OFF_TAIL, RING_MAGIC};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

pub struct Consumer {
    base: *mut u8,
    map_len: usize,
    capacity: u64,
    _memfd: OwnedFd,
    eventfd: OwnedFd,
}

// SAFETY: the mapping is owned (unmapped in Drop only); shared words are atomics and
// record bytes are only copied out. One consumer per ring: `pop` takes `&self` but the
// owner (DemuxSocket) calls it from one task at a time (it holds the rings in a Mutex).
unsafe impl Send for Consumer {}
// SAFETY: see Send.
unsafe impl Sync for Consumer {}

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
        let map_len = HEADER_LEN + capacity as usize;
        // SAFETY: fstat into a zeroed stat buffer we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat(2) on an fd we own, into `st`.
        if unsafe { libc::fstat(memfd.as_raw_fd(), &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as u64) < map_len as u64 {
            return Err(corrupt("memfd smaller than announced"));
        }
        // SAFETY: a shared mapping of the first `map_len` bytes of the memfd, which is
        // at least that large (checked above); MAP_FAILED checked; unmapped in Drop.
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
        let c = Consumer { base: base as *mut u8, map_len, capacity, _memfd: memfd, eventfd };
        if c.word(OFF_MAGIC).load(Ordering::Acquire) != RING_MAGIC || c.word(OFF_CAPACITY).load(Ordering::Relaxed) != capacity
        {
            return Err(corrupt("bad magic or capacity"));
        }
        Ok(c)
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= HEADER_LEN);
        // SAFETY: an 8-aligned offset in the header page of a live page-aligned
        // mapping; both processes access this word only atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: as `word`, a 4-aligned u32 in the header page.
        unsafe { &*(self.base.add(OFF_SLEEPING) as *const AtomicU32) }
    }

    /// Copies `out.len()` bytes from data offset `at` (in bounds: checked).
    fn read(&self, at: usize, out: &mut [u8]) {
        assert!(at as u64 + out.len() as u64 <= self.capacity);
        // SAFETY: in bounds (asserted); the bytes lie between head and the tail read
        // with Acquire, so the producer finished writing them and will not reuse them
        // before we publish a head past them.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(HEADER_LEN + at), out.as_mut_ptr(), out.len()) }
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
        let mut v: u64 = 0;
        // SAFETY: read(2) of 8 bytes into a live u64 from our non-blocking eventfd;
        // EAGAIN (nothing pending) is fine.
        unsafe { libc::read(self.eventfd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; nothing borrowed from it
        // outlives `self` (reads copy out).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}
