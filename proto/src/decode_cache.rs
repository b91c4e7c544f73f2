//! A per-shard cache of ADR 0001 CID decodes: every packet of an established
//! connection carries one of a few DCIDs, so repeating the HMAC-SHA-256 of
//! [`KeySet::decode`] (≈ 90 ns, docs/benchmarks.md "Crypto: crates against hand-written code") for each one is wasted work.
//! (A `siphash-2-4` generation, ADR 0004, decodes in ≈ 16 ns: the cache saves less.)
//!
//! Direct-mapped, a fixed power-of-two number of entries chosen at construction;
//! memory never grows. Each entry holds the whole 12-byte CID, its decode result and
//! the [`KeySet::fingerprint`] of the key set that produced it. A lookup hits only
//! when all 12 bytes *and* the fingerprint match, so the result is exactly what
//! `keys.decode(cid)` would return: a key rotation (new fingerprint) turns every old
//! entry into a miss, and an attacker who aims CIDs at one index only causes misses.
//!
//! The index is CID bytes 1..=8, the nonce, which ADR 0001 makes uniformly random
//! for the CIDs we issue. Inputs that [`KeySet::decode`] rejects without an HMAC
//! (wrong length, `cr` = 3, a generation the set does not hold) bypass the cache:
//! they cost nothing to recompute and must not evict useful entries.

use crate::cid::{Decoded, KeySet, Unroutable, CID_LEN, CR_UNROUTABLE};

/// Default number of entries per cache (per shard): 4096 × 32 bytes = 128 KiB.
pub const DEFAULT_ENTRIES: usize = 4096;

/// How routing turns a DCID into (generation, server id): directly with the key set
/// ([`Uncached`]) or through a [`DecodeCache`]. Must return exactly
/// `keys.decode(cid)`.
pub trait Decoder {
    fn decode(&mut self, keys: &KeySet, cid: &[u8]) -> Result<Decoded, Unroutable>;
}

/// `&mut` of a decoder is one too: a shard keeps its cache across routers.
impl<D: Decoder + ?Sized> Decoder for &mut D {
    #[inline]
    fn decode(&mut self, keys: &KeySet, cid: &[u8]) -> Result<Decoded, Unroutable> {
        (**self).decode(keys, cid)
    }
}

/// [`KeySet::decode`] every time: plain ADR 0001 routing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Uncached;

impl Decoder for Uncached {
    #[inline]
    fn decode(&mut self, keys: &KeySet, cid: &[u8]) -> Result<Decoded, Unroutable> {
        keys.decode(cid)
    }
}

#[derive(Clone, Copy)]
struct Entry {
    cid: [u8; CID_LEN],
    result: Result<Decoded, Unroutable>,
    /// Fingerprint of the key set that decoded `cid`; 0 = empty (never a fingerprint).
    keys: u64,
}

const EMPTY: Entry = Entry { cid: [0; CID_LEN], result: Err(Unroutable::WrongLength), keys: 0 };

/// Direct-mapped decode cache (see the module documentation).
#[derive(Clone)]
pub struct DecodeCache {
    /// Empty when the cache is off (0 entries): every decode goes to the key set.
    entries: Box<[Entry]>,
    mask: usize,
    hits: u64,
    misses: u64,
}

impl std::fmt::Debug for DecodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeCache")
            .field("entries", &self.entries.len())
            .field("hits", &self.hits)
            .field("misses", &self.misses)
            .finish()
    }
}

impl Default for DecodeCache {
    fn default() -> Self {
        DecodeCache::new(DEFAULT_ENTRIES)
    }
}

impl DecodeCache {
    /// A cache of `entries` slots, rounded up to a power of two (at most 2^24);
    /// 0 turns it off (it then decodes every CID with the key set).
    pub fn new(entries: usize) -> DecodeCache {
        let n = if entries == 0 { 0 } else { entries.min(1 << 24).next_power_of_two() };
        DecodeCache { entries: vec![EMPTY; n].into_boxed_slice(), mask: n.wrapping_sub(1), hits: 0, misses: 0 }
    }

    /// Number of slots (0 when off).
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }
    /// Lookups answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits
    }
    /// Lookups that ran the HMAC (and filled their slot).
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Forgets every entry (not needed for correctness: entries of another key set
    /// never hit).
    pub fn clear(&mut self) {
        self.entries.fill(EMPTY);
    }

    #[inline]
    fn slot(&self, cid: &[u8; CID_LEN]) -> usize {
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&cid[1..9]);
        u64::from_le_bytes(nonce) as usize & self.mask
    }
}

impl Decoder for DecodeCache {
    #[inline]
    fn decode(&mut self, keys: &KeySet, cid: &[u8]) -> Result<Decoded, Unroutable> {
        let Ok(cid12) = <&[u8; CID_LEN]>::try_from(cid) else {
            return keys.decode(cid);
        };
        // Rejections that need no HMAC (cr = 3, a generation not held) and a cache
        // that is off: straight to the key set.
        let cr = cid12[0] >> 6;
        if self.entries.is_empty() || cr == CR_UNROUTABLE || !keys.holds(cr) {
            return keys.decode(cid);
        }
        let i = self.slot(cid12);
        let fp = keys.fingerprint();
        let e = &mut self.entries[i];
        if e.keys == fp && e.cid == *cid12 {
            self.hits += 1;
            return e.result;
        }
        let result = keys.decode(cid);
        *e = Entry { cid: *cid12, result, keys: fp };
        self.misses += 1;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cid::{Generation, ServerId};

    #[test]
    fn hit_after_miss_and_rotation_misses() {
        let ks = KeySet::new((Generation::ZERO, [1; 32]), None).unwrap();
        let mut c = DecodeCache::new(16);
        let cid = ks.encode(ServerId(7), &[3; 10]);
        assert_eq!(c.decode(&ks, &cid), ks.decode(&cid));
        assert_eq!(c.decode(&ks, &cid), ks.decode(&cid));
        assert_eq!((c.hits(), c.misses()), (1, 1));
        let r = ks.rotated([2; 32]);
        assert_eq!(c.decode(&r, &cid), r.decode(&cid));
        assert_eq!((c.hits(), c.misses()), (1, 2));
    }

    #[test]
    fn entry_is_32_bytes() {
        // DEFAULT_ENTRIES × 32 = 128 KiB per shard (docs/operations.md).
        assert_eq!(std::mem::size_of::<Entry>(), 32);
    }

    #[test]
    fn off_and_rounding() {
        assert_eq!(DecodeCache::new(0).capacity(), 0);
        assert_eq!(DecodeCache::new(3).capacity(), 4);
        let ks = KeySet::new((Generation::ZERO, [1; 32]), None).unwrap();
        let mut c = DecodeCache::new(0);
        let cid = ks.encode(ServerId(7), &[3; 10]);
        assert_eq!(c.decode(&ks, &cid), ks.decode(&cid));
        assert_eq!(c.decode(&ks, &cid[..11]), Err(Unroutable::WrongLength));
    }
}
