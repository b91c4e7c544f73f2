//! Lane arithmetic on `u64` words of four 16-bit lanes ("four lanes, one
//! CAS"): compare all four lanes against a limit, or subtract from all four with
//! saturation, in a handful of ALU instructions and no loop.
//!
//! Invariant everywhere in this module: **every lane is below 2^15**, so its top bit
//! (bit 15 of the lane) is free. Setting it and then subtracting at most 2^15 from the
//! lane cannot borrow into the next lane, and the top bit survives exactly when the
//! lane was at least what was subtracted.

/// Lanes per word.
pub const LANES: u32 = 4;
/// A one in every lane.
pub const ONES: u64 = 0x0001_0001_0001_0001;
/// The top bit of every lane.
pub const HIGH: u64 = ONES << 15;
/// Every lane value is strictly below this (2^15).
pub const LANE_LIMIT: u64 = 1 << 15;
/// The largest lane value, 2^15 − 1.
pub const LANE_MAX: u64 = LANE_LIMIT - 1;

/// The lanes of `word` that are `>= limit`, as their top bits (`HIGH` where true).
///
/// Requires every lane of `word` below 2^15 and `limit <= 2^15`.
#[inline]
pub const fn lanes_at_least(word: u64, limit: u64) -> u64 {
    debug_assert!(word & HIGH == 0 && limit <= LANE_LIMIT);
    // Lane 5, limit 8: 0x8005 - 8 = 0x7ffd, top bit gone. Lane 9: 0x8009 - 8 = 0x8001.
    ((word | HIGH) - limit * ONES) & HIGH
}

/// `max(lane - d, 0)` in every lane.
///
/// Requires every lane of `word` below 2^15 and `d <= 2^15`.
#[inline]
pub const fn sub_sat(word: u64, d: u64) -> u64 {
    // Surviving lanes as 0xffff each: the comparison's top bits moved to the bottom of
    // the lane and multiplied out (no carries: each lane of the product is 0 or 0xffff).
    let keep = (lanes_at_least(word, d) >> 15) * 0xffff;
    ((word | HIGH) - d * ONES) & !HIGH & keep
}

/// Lane `i` (0..4, lane 0 = the low 16 bits) of `word`.
#[inline]
pub const fn lane(word: u64, i: u32) -> u64 {
    (word >> (16 * i)) & 0xffff
}

/// `word` with lane `i` replaced by `v` (`v < 2^16`).
#[inline]
pub const fn with_lane(word: u64, i: u32, v: u64) -> u64 {
    (word & !(0xffff << (16 * i))) | (v << (16 * i))
}

/// The six ways to choose two lanes of four.
const PAIRS: [(u8, u8); 6] = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)];

/// Two distinct lanes of a word, `lo < hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LanePair {
    id: u8,
}

impl LanePair {
    /// The pair number `id` (0..6); `None` beyond.
    pub const fn from_id(id: u8) -> Option<LanePair> {
        if id < 6 {
            Some(LanePair { id })
        } else {
            None
        }
    }
    /// The pair number, 0..6.
    pub const fn id(self) -> u8 {
        self.id
    }
    /// The two lane indices, `lo < hi`.
    #[inline]
    pub const fn lanes(self) -> (u32, u32) {
        let (a, b) = PAIRS[self.id as usize];
        (a as u32, b as u32)
    }
    /// A one in each of the two lanes: adding it raises both by one.
    #[inline]
    pub const fn ones(self) -> u64 {
        let (a, b) = self.lanes();
        (1 << (16 * a)) | (1 << (16 * b))
    }
    /// The top bits of the two lanes (as [`lanes_at_least`] reports them).
    #[inline]
    pub const fn high(self) -> u64 {
        self.ones() << 15
    }
}

/// The lane pair of a client from its keyed hash: one of the 6 pairs, from the high 32
/// bits of `hash` (the word index comes from the low bits, so the two are independent
/// for any table below 2^32 words). Multiply-shift instead of `% 6`: as uniform, no
/// division.
#[inline]
pub const fn lane_pair(hash: u64) -> LanePair {
    LanePair { id: (((hash >> 32) * 6) >> 32) as u8 }
}
