//! Layout and index arithmetic of the shared-memory forwarding ring
//! (`--forward ring`, docs/wire.md "Ring"): pure functions, no memory access.
//!
//! One ring per (shard, worker) pair: a single producer (the shard) and a single
//! consumer (the worker) share one memfd mapping:
//!
//! ```text
//! offset 0    header page (HEADER_LEN bytes)
//!   0         magic u64 (RING_MAGIC), capacity u64       (written once by the producer)
//!   128       tail  u64: bytes ever published (producer writes, Release)
//!   256       head  u64: bytes ever consumed  (consumer writes, Release)
//!   384       consumer_sleeping u32 (consumer sets 1 before waiting on its eventfd)
//! HEADER_LEN  data: `capacity` bytes, a power of two, a multiple of 8
//! ```
//!
//! `head` and `tail` are free-running byte counters (never wrapped): the used space
//! is `tail - head`, a position in the data area is `counter % capacity`.
//! A record is a u32 length word (little endian: the ring never leaves the host)
//! followed by the record body (the 48-byte frame header and the payload), padded to
//! 8 bytes. A record never wraps: when it does not fit before the end of the data
//! area, the producer writes a [`SKIP`] length word there (positions are 8-aligned
//! and the capacity a multiple of 8, so at least 8 bytes remain) and the record
//! starts at offset 0.

/// "QDXRING1" little endian.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"QDXRING1");
/// Bytes before the data area: magic + capacity, tail, head and flag on their own
/// 128-byte lines (two cache lines: the adjacent-line prefetcher).
pub const HEADER_LEN: usize = 4096;
pub const OFF_MAGIC: usize = 0;
pub const OFF_CAPACITY: usize = 8;
pub const OFF_TAIL: usize = 128;
pub const OFF_HEAD: usize = 256;
pub const OFF_SLEEPING: usize = 384;
/// The length word of a record.
pub const LEN_WORD: usize = 4;
/// Records start on 8-byte boundaries.
pub const ALIGN: usize = 8;
/// Length word meaning "the rest of the data area is padding, continue at 0".
pub const SKIP: u32 = u32::MAX;
/// The smallest and largest data area a ring may have.
pub const MIN_CAPACITY: usize = 1 << 17;
pub const MAX_CAPACITY: usize = 1 << 30;
/// The largest record body: a 48-byte frame header and a 65 535-byte payload.
pub const MAX_BODY: usize = crate::wire::frame::HEADER_LEN + crate::wire::frame::MAX_PAYLOAD;

/// Bytes a record with a `body`-byte body occupies (length word + body, padded).
pub const fn slot_len(body: usize) -> usize {
    (LEN_WORD + body + ALIGN - 1) & !(ALIGN - 1)
}

/// Whether `capacity` is a valid data-area size: a power of two in
/// `MIN_CAPACITY..=MAX_CAPACITY` (so at least one largest record fits).
pub fn valid_capacity(capacity: u64) -> bool {
    capacity.is_power_of_two() && capacity >= MIN_CAPACITY as u64 && capacity <= MAX_CAPACITY as u64
}

/// Where the producer writes a record, given the counters it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserve {
    /// Offset in the data area of the SKIP word to write first, if any.
    pub skip_at: Option<usize>,
    /// Offset in the data area of the record's length word.
    pub at: usize,
    /// The tail to publish after writing the record.
    pub new_tail: u64,
}

/// Plans writing a `body`-byte record at `tail` when the consumer is at `head`.
/// `None`: the ring is full (or the body is too large): the record is dropped.
pub fn reserve(head: u64, tail: u64, capacity: u64, body: usize) -> Option<Reserve> {
    debug_assert!(tail >= head && tail - head <= capacity);
    if body == 0 || body > MAX_BODY {
        return None;
    }
    let need = slot_len(body) as u64;
    let pos = tail % capacity;
    let to_end = capacity - pos;
    let (skip, at) = if need <= to_end { (0, pos) } else { (to_end, 0) };
    let used = tail - head;
    if used + skip + need > capacity {
        return None;
    }
    let skip_at = if skip > 0 { Some(pos as usize) } else { None };
    Some(Reserve { skip_at, at: at as usize, new_tail: tail + skip + need })
}

/// The most bytes of the next record's place that the producer prefetches (a GRO
/// train's record is long enough for the CPU's own stream prefetcher).
pub const PREFETCH_MAX: usize = 2048;

/// Where the next record goes when it has a `body`-byte body too and the producer's
/// tail is `tail`: the data-area bytes the producer asks the CPU to fetch for writing
/// while it copies the current record (docs/journal/2026-11-30-to-12-02-benchmarks.md, "Fifth pass"). At most
/// [`PREFETCH_MAX`] bytes, always inside the data area; a record that would not fit
/// before the end starts at offset 0, and so does this. `None`: no such record.
pub fn next_span(tail: u64, capacity: u64, body: usize) -> Option<std::ops::Range<usize>> {
    // An empty ring at `tail`: only the place matters here, not whether it is free.
    let r = reserve(tail, tail, capacity, body)?;
    Some(r.at..r.at + slot_len(body).min(PREFETCH_MAX))
}

/// What the consumer finds at `head`, given the length word `word` it read there
/// (only read when `tail > head`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A record body at data offset `at`, `len` bytes; the new head after it.
    Record { at: usize, len: usize, new_head: u64 },
    /// Padding to the end of the data area; the new head.
    Skip { new_head: u64 },
    /// The length word is impossible (a corrupt ring: the consumer must stop).
    Corrupt,
}

/// The data-area offset of the length word at `head` (8-aligned, ≤ capacity - 8).
pub fn word_at(head: u64, capacity: u64) -> usize {
    (head % capacity) as usize
}

/// Interprets the length word `word` found at `head` with `tail` published.
pub fn next(head: u64, tail: u64, capacity: u64, word: u32) -> Next {
    let pos = head % capacity;
    let to_end = capacity - pos;
    if word == SKIP {
        // A producer writes SKIP only where a record does not fit before the end, so
        // never at offset 0 (the whole area): one there would be corrupt (and could
        // make a consumer chase SKIPs for as long as a hostile producer writes them).
        if pos == 0 || to_end > tail - head {
            return Next::Corrupt;
        }
        return Next::Skip { new_head: head + to_end };
    }
    let len = word as usize;
    let need = slot_len(len) as u64;
    if len == 0 || len > MAX_BODY || need > to_end || need > tail - head {
        return Next::Corrupt;
    }
    Next::Record { at: pos as usize + LEN_WORD, len, new_head: head + need }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_lengths() {
        assert_eq!(slot_len(1), 8);
        assert_eq!(slot_len(4), 8);
        assert_eq!(slot_len(5), 16);
        assert_eq!(slot_len(MAX_BODY), (4 + MAX_BODY + 7) & !7);
    }

    #[test]
    fn full_and_wrap() {
        let cap = MIN_CAPACITY as u64;
        // A record that does not fit before the end wraps behind a SKIP word.
        let r = reserve(cap - 16, cap - 16, cap, 100).unwrap();
        assert_eq!(r.skip_at, Some((cap - 16) as usize));
        assert_eq!(r.at, 0);
        assert_eq!(r.new_tail, cap - 16 + 16 + slot_len(100) as u64);
        // Full.
        assert_eq!(reserve(0, cap - 8, cap, 8), None);
        assert!(reserve(0, cap - 16, cap, 8).is_some());
        assert_eq!(reserve(0, 0, cap, 0), None);
        assert_eq!(reserve(0, 0, cap, MAX_BODY + 1), None);
    }

    /// What a consumer accepts from a producer it does not trust: a length word is
    /// only a record or a SKIP when it stays inside both the published bytes and the
    /// data area; anything else is `Corrupt` (the consumer stops using the ring).
    #[test]
    fn next_refuses_impossible_length_words() {
        let cap = MIN_CAPACITY as u64;
        assert_eq!(next(0, 16, cap, 12), Next::Record { at: 4, len: 12, new_head: 16 });
        assert_eq!(next(0, 16, cap, 13), Next::Corrupt, "past the published tail");
        assert_eq!(next(0, 16, cap, 0), Next::Corrupt, "empty record");
        assert_eq!(next(0, cap, cap, (MAX_BODY + 1) as u32), Next::Corrupt, "longer than any frame");
        assert_eq!(next(cap - 8, cap + 64, cap, 12), Next::Corrupt, "would run past the end of the area");
        assert_eq!(next(cap - 8, cap, cap, SKIP), Next::Skip { new_head: cap });
        assert_eq!(next(cap - 16, cap - 8, cap, SKIP), Next::Corrupt, "SKIP beyond the tail");
        assert_eq!(next(cap, 2 * cap, cap, SKIP), Next::Corrupt, "SKIP at offset 0");
    }
}
