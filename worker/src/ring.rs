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

use crate::datasock::DataStats;
use proto::ring::{self, Next, OFF_CAPACITY, OFF_HEAD, OFF_MAGIC, OFF_TAIL, RING_MAGIC};
use proto::wire::{decode_frame_header, FrameMeta, FRAME_HEADER_LEN};
use std::io;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use sys::ring::Mapping;
use tokio::io::unix::AsyncFd;

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

/// What [`Consumer::pop_frame`] took off a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Popped {
    /// A datagram or GRO train: its metadata; the payload is in `payload[..len]`.
    Frame { meta: FrameMeta, len: usize },
    /// A record that is not a valid data frame (dropped).
    Malformed,
    /// A frame whose payload is longer than the buffer offered (dropped).
    TooLong,
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

    /// The next record at the head (skipping the SKIP padding before it): its data
    /// offset, length and the head after it, all checked against the capacity and the
    /// published tail (`proto::ring::next`). `Ok(None)`: empty.
    fn next_record(&self) -> io::Result<Option<(usize, usize, u64)>> {
        // At most one SKIP precedes a record (`proto::ring::next` refuses a SKIP at 0).
        for _ in 0..2 {
            let head = self.word(OFF_HEAD).load(Ordering::Relaxed);
            let tail = self.word(OFF_TAIL).load(Ordering::Acquire);
            if head == tail {
                return Ok(None);
            }
            if tail < head || tail - head > self.capacity || !head.is_multiple_of(ring::ALIGN as u64) {
                return Err(corrupt("tail"));
            }
            let mut w = [0u8; 4];
            self.read(ring::word_at(head, self.capacity), &mut w);
            match ring::next(head, tail, self.capacity, u32::from_le_bytes(w)) {
                Next::Skip { new_head } => self.word(OFF_HEAD).store(new_head, Ordering::Release),
                Next::Record { at, len, new_head } => return Ok(Some((at, len, new_head))),
                Next::Corrupt => return Err(corrupt("record length")),
            }
        }
        Err(corrupt("SKIP after SKIP"))
    }

    /// Copies the next record (frame header + payload) into `out` and consumes it.
    /// `Ok(None)`: empty. A record longer than `out` is consumed and dropped
    /// (`Ok(Some(0))`). `Err`: the producer wrote nonsense; stop using this ring.
    pub fn pop(&self, out: &mut [u8]) -> io::Result<Option<usize>> {
        let Some((at, len, new_head)) = self.next_record()? else { return Ok(None) };
        let n = if len <= out.len() {
            self.read(at, &mut out[..len]);
            len
        } else {
            0
        };
        self.word(OFF_HEAD).store(new_head, Ordering::Release);
        Ok(Some(n))
    }

    /// Takes the next record as a data frame: its 44-byte header is decoded from a
    /// copy on the stack, and its payload is copied once, straight from the ring to
    /// `payload[..len]` (quinn's receive buffer: no intermediate buffer, no move of
    /// the payload afterwards). Consumes the record whatever it holds. `Ok(None)`:
    /// empty. `Err`: the producer wrote nonsense; stop using this ring.
    pub fn pop_frame(&self, payload: &mut [u8]) -> io::Result<Option<Popped>> {
        let Some((at, len, new_head)) = self.next_record()? else { return Ok(None) };
        let popped = match len.checked_sub(FRAME_HEADER_LEN) {
            None => Popped::Malformed,
            Some(plen) => {
                let mut hdr = [0u8; FRAME_HEADER_LEN];
                self.read(at, &mut hdr);
                match decode_frame_header(&hdr, plen) {
                    Err(_) => Popped::Malformed,
                    Ok(_) if plen > payload.len() => Popped::TooLong,
                    Ok(meta) => {
                        self.read(at + FRAME_HEADER_LEN, &mut payload[..plen]);
                        Popped::Frame { meta, len: plen }
                    }
                }
            }
        };
        self.word(OFF_HEAD).store(new_head, Ordering::Release);
        Ok(Some(popped))
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

/// A forwarding ring and (a duplicate of) its eventfd registered with tokio.
#[derive(Debug)]
struct RingReader {
    wake: AsyncFd<OwnedFd>,
    ring: Consumer,
    /// The producer wrote nonsense once: never read this ring again.
    dead: AtomicBool,
}

/// The rings of one data-plane incarnation (one per shard), read by the worker's
/// quinn socket: replaced as a whole when a restarted data plane offers new ones.
/// `poll_frames` is called from one task at a time (quinn's receive task).
#[derive(Debug, Default)]
pub struct RingSet {
    readers: Vec<RingReader>,
}

impl RingSet {
    /// Registers each ring's eventfd with the tokio reactor (call inside a runtime).
    pub fn new(rings: Vec<Consumer>) -> io::Result<RingSet> {
        let readers = rings
            .into_iter()
            .map(|ring| {
                let wake = crate::fdpass::async_fd(ring.eventfd_owned()?, tokio::io::Interest::READABLE)?;
                Ok(RingReader { wake, ring, dead: AtomicBool::new(false) })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(RingSet { readers })
    }

    /// Rings in the set (the data plane's shards), usable or not.
    pub fn len(&self) -> usize {
        self.readers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.readers.is_empty()
    }

    /// Rings given up because the producer wrote nonsense.
    pub fn dead(&self) -> usize {
        self.readers.iter().filter(|r| r.dead.load(Ordering::Relaxed)).count()
    }

    fn live(&self) -> impl Iterator<Item = &RingReader> {
        self.readers.iter().filter(|r| !r.dead.load(Ordering::Relaxed))
    }

    /// Reads up to `bufs.len()` frames, one per buffer: each payload straight into
    /// `bufs[i]` (`Consumer::pop_frame`: one copy), its metadata handed to
    /// `frame(i, meta, len)`. Invalid records are counted (`malformed`, `truncated`)
    /// and skipped. When every ring is empty, follows the sleep protocol (docs/wire.md
    /// "Ring") and registers the eventfds with `cx`. Returns the frames read; 0 with
    /// the wakers registered.
    pub fn poll_frames(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        stats: &DataStats,
        mut frame: impl FnMut(usize, &FrameMeta, usize),
    ) -> usize {
        'again: loop {
            let mut got = 0;
            for r in self.live() {
                while got < bufs.len() {
                    match r.ring.pop_frame(&mut bufs[got]) {
                        Ok(Some(Popped::Frame { meta, len })) => {
                            stats.ring_frames.fetch_add(1, Ordering::Relaxed);
                            frame(got, &meta, len);
                            got += 1;
                        }
                        Ok(Some(Popped::Malformed)) => {
                            stats.malformed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Some(Popped::TooLong)) => {
                            stats.truncated.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "forwarding ring unusable; no longer read");
                            stats.malformed.fetch_add(1, Ordering::Relaxed);
                            r.dead.store(true, Ordering::Relaxed);
                            break;
                        }
                    }
                }
                r.ring.awake();
            }
            if got > 0 {
                return got;
            }
            for r in self.live() {
                if !r.ring.prepare_sleep() {
                    continue 'again;
                }
            }
            for r in self.live() {
                if let Poll::Ready(Ok(mut g)) = r.wake.poll_read_ready(cx) {
                    g.clear_ready();
                    r.ring.woke();
                    continue 'again;
                }
            }
            return 0;
        }
    }
}
