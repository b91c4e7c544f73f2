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
use proto::wire::frame::{self, FrameMeta};
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

    /// Takes the next record as a data frame: its 48-byte header is decoded from a
    /// copy on the stack, and its payload is copied once, straight from the ring to
    /// `payload[..len]` (quinn's receive buffer: no intermediate buffer, no move of
    /// the payload afterwards). Consumes the record whatever it holds. `Ok(None)`:
    /// empty. `Err`: the producer wrote nonsense; stop using this ring.
    pub fn pop_frame(&self, payload: &mut [u8]) -> io::Result<Option<Popped>> {
        let Some((at, len, new_head)) = self.next_record()? else { return Ok(None) };
        let popped = match len.checked_sub(frame::HEADER_LEN) {
            None => Popped::Malformed,
            Some(plen) => {
                let mut hdr = [0u8; frame::HEADER_LEN];
                self.read(at, &mut hdr);
                match frame::decode_header(&hdr, plen) {
                    Err(_) => Popped::Malformed,
                    Ok(_) if plen > payload.len() => Popped::TooLong,
                    Ok(meta) => {
                        self.read(at + frame::HEADER_LEN, &mut payload[..plen]);
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
                let wake = crate::async_fd::register(ring.eventfd_owned()?, tokio::io::Interest::READABLE)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use proto::wire::frame::MAX_PAYLOAD;
    use std::net::SocketAddr;

    const CAP: u64 = ring::MIN_CAPACITY as u64;

    /// The data plane's side, by hand: a mapping with magic and capacity, and the
    /// consumer opened on the same memfd.
    fn pair() -> (Mapping, Consumer) {
        let (map, memfd) = Mapping::create(CAP).unwrap();
        map.word(OFF_CAPACITY).store(CAP, Ordering::Relaxed);
        map.word(OFF_MAGIC).store(RING_MAGIC, Ordering::Release);
        let c = Consumer::open(memfd, sys::ring::eventfd().unwrap(), CAP).unwrap();
        (map, c)
    }

    /// Writes one record with body `body` the way the producer does and publishes it.
    fn put(map: &Mapping, body: &[u8]) {
        let tail = map.word(OFF_TAIL).load(Ordering::Relaxed);
        let head = map.word(OFF_HEAD).load(Ordering::Relaxed);
        let r = ring::reserve(head, tail, CAP, body.len()).unwrap();
        if let Some(s) = r.skip_at {
            map.write(s, &ring::SKIP.to_le_bytes());
        }
        map.write(r.at, &(body.len() as u32).to_le_bytes());
        map.write(r.at + ring::LEN_WORD, body);
        map.word(OFF_TAIL).store(r.new_tail, Ordering::Release);
    }

    fn frame(meta: &FrameMeta, payload: &[u8]) -> Vec<u8> {
        let mut h = [0u8; frame::HEADER_LEN];
        frame::encode_header(meta, &mut h);
        [&h[..], payload].concat()
    }

    fn meta(segment_size: Option<u16>) -> FrameMeta {
        let client: SocketAddr = "192.0.2.9:5555".parse().unwrap();
        FrameMeta { client, local: Some("198.51.100.2:443".parse().unwrap()), ecn: 2, segment_size }
    }

    /// One copy: the payload lands at the front of the buffer and nothing else is
    /// written to it (no header to move away afterwards), across a wrap-around.
    #[test]
    fn pop_frame_copies_only_the_payload_into_the_buffer() {
        let (map, c) = pair();
        let mut buf = vec![0xeeu8; 70_000];
        for i in 0..300u32 {
            let payload: Vec<u8> = (0..1200 + i).map(|b| (b ^ i) as u8).collect();
            let m = meta(if i % 3 == 0 { Some(600) } else { None });
            put(&map, &frame(&m, &payload));
            buf.fill(0xee);
            assert_eq!(c.pop_frame(&mut buf).unwrap(), Some(Popped::Frame { meta: m, len: payload.len() }));
            assert_eq!(&buf[..payload.len()], &payload[..], "record {i}");
            assert!(buf[payload.len()..].iter().all(|&b| b == 0xee), "record {i}: bytes past the payload written");
        }
        assert!(map.word(OFF_TAIL).load(Ordering::Relaxed) > 2 * CAP, "wrapped around");
        assert_eq!(c.pop_frame(&mut buf).unwrap(), None);
    }

    /// Records that are not frames, or too long for the buffer, are consumed and
    /// reported, and the next record is read normally.
    #[test]
    fn pop_frame_drops_bad_and_too_long_records() {
        let (map, c) = pair();
        let mut buf = vec![0u8; 1500];
        put(&map, &[0xd7; 20]); // shorter than a frame header
        put(&map, &frame(&meta(None), b"x")[..frame::HEADER_LEN]); // empty payload
        let mut bad = frame(&meta(None), b"abc");
        bad[3] = 7; // ECN > 3
        put(&map, &bad);
        put(&map, &frame(&meta(Some(1000)), &[1u8; 999])); // segment > payload
        put(&map, &frame(&meta(None), &[2u8; 1501])); // longer than `buf`
        put(&map, &frame(&meta(None), &[3u8; 1500]));
        for _ in 0..4 {
            assert_eq!(c.pop_frame(&mut buf).unwrap(), Some(Popped::Malformed));
        }
        assert_eq!(c.pop_frame(&mut buf).unwrap(), Some(Popped::TooLong));
        assert_eq!(c.pop_frame(&mut buf).unwrap(), Some(Popped::Frame { meta: meta(None), len: 1500 }));
        assert_eq!(buf, [3u8; 1500]);
        assert_eq!(c.pop_frame(&mut buf).unwrap(), None);
    }

    /// A producer that writes nonsense (tails behind the head or beyond the capacity,
    /// length words past the tail, the end of the area or any frame, a SKIP at
    /// offset 0 or beyond the tail): every read stays in bounds and ends in an
    /// error, never a panic or a loop.
    #[test]
    fn hostile_producer_words_are_errors_not_reads_out_of_bounds() {
        /// (head, tail, a length word written at that position).
        type Case = (u64, u64, Option<(u64, u32)>);
        let cases: [Case; 9] = [
            (64, 8, None),                                    // tail behind head
            (0, CAP + 8, None),                               // more than the capacity
            (4, 20, None),                                    // unaligned head
            (0, 64, Some((0, 0))),                            // empty record
            (0, 64, Some((0, 100))),                          // past the tail
            (0, CAP, Some((0, u32::MAX - 1))),                // huge length
            (0, CAP, Some((0, (ring::MAX_BODY + 1) as u32))), // longer than any frame
            (CAP - 8, CAP + 64, Some((CAP - 8, 44))),         // runs past the end
            (CAP, 2 * CAP, Some((CAP, ring::SKIP))),          // SKIP at offset 0
        ];
        let mut buf = vec![0u8; MAX_PAYLOAD];
        for (i, (head, tail, word)) in cases.into_iter().enumerate() {
            let (map, c) = pair();
            if let Some((at, w)) = word {
                map.write(ring::word_at(at, CAP), &w.to_le_bytes());
            }
            map.word(OFF_HEAD).store(head, Ordering::Relaxed);
            map.word(OFF_TAIL).store(tail, Ordering::Relaxed);
            assert!(c.pop_frame(&mut buf).is_err(), "case {i}: pop_frame");
            assert!(c.pop(&mut buf).is_err(), "case {i}: pop");
            assert_eq!(map.word(OFF_HEAD).load(Ordering::Relaxed), head, "case {i}: head unchanged");
        }
    }

    /// A ring whose producer wrote nonsense is given up (counted once) and never read
    /// again; the other rings of the set keep delivering. A ring kept in use would
    /// make the sleep protocol spin (never empty, never readable): bounded here.
    #[test]
    fn a_corrupt_ring_is_given_up_and_the_others_keep_delivering() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(corrupt_ring_given_up());
            let _ = tx.send(());
        });
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("poll_frames spins on a corrupt ring"),
            Err(e) => panic!("the test thread failed: {e}"),
        }
    }

    async fn corrupt_ring_given_up() {
        let (bad_map, bad) = pair();
        let (good_map, good) = pair();
        let set = RingSet::new(vec![bad, good]).unwrap();
        let stats = DataStats::default();
        bad_map.word(OFF_TAIL).store(CAP * 4, Ordering::Release); // beyond the capacity
        put(&good_map, &frame(&meta(None), &[7u8; 100]));
        let mut store = vec![0u8; 2 * 2000];
        let mut got = Vec::new();
        for _ in 0..3 {
            let mut bufs: Vec<IoSliceMut<'_>> = store.chunks_mut(2000).map(IoSliceMut::new).collect();
            let n = std::future::poll_fn(|cx| {
                Poll::Ready(set.poll_frames(cx, &mut bufs, &stats, |i, m, len| got.push((i, *m, len))))
            })
            .await;
            assert!(n <= 1);
        }
        assert_eq!(got, vec![(0, meta(None), 100)]);
        assert_eq!((set.len(), set.dead()), (2, 1));
        assert_eq!(stats.malformed.load(Ordering::Relaxed), 1, "counted once, not on every poll");
        assert_eq!(stats.ring_frames.load(Ordering::Relaxed), 1);
    }
}
