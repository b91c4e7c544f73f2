//! Rendezvous (highest-random-weight) hashing over instances, with a keyed hash.
//!
//! Each (instance, key) pair gets a pseudo-random weight and the key goes to the
//! instance with the highest weight. Removing an instance only moves the keys whose
//! winner it was; adding one only takes keys it now wins — about 1/N each.
//! The hash is keyed (SipHash-1-3) so that clients cannot choose DCIDs that all land
//! on one instance.

use crate::cid::ServerId;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;

/// Keyed rendezvous hashing.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    hasher: SipHasher13,
}

/// The finaliser of SplitMix64: a bijective mixer with full avalanche.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rendezvous {
    pub fn new(key: [u8; 16]) -> Rendezvous {
        Rendezvous { hasher: SipHasher13::new_with_key(&key) }
    }

    /// The per-instance seed, computed once when the instance joins the table.
    pub fn seed(&self, id: ServerId) -> u64 {
        let mut h = self.hasher;
        h.write(b"instance");
        h.write(&id.0.to_be_bytes());
        h.finish()
    }

    /// The per-key hash, computed once per routing decision.
    #[inline]
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        let mut h = self.hasher;
        h.write(key);
        h.finish()
    }

    /// The weight of an instance (by its seed) for a key (by its hash).
    #[inline]
    pub fn weight(seed: u64, key_hash: u64) -> u64 {
        mix(seed ^ key_hash)
    }

    /// The winner among `(seed, item)` candidates for `key_hash`; ties (practically
    /// impossible) go to the candidate that comes first.
    #[inline]
    pub fn pick<T: Copy>(key_hash: u64, candidates: impl Iterator<Item = (u64, T)>) -> Option<T> {
        let mut best: Option<(u64, T)> = None;
        for (seed, item) in candidates {
            let w = Self::weight(seed, key_hash);
            if best.is_none_or(|(bw, _)| w > bw) {
                best = Some((w, item));
            }
        }
        best.map(|(_, t)| t)
    }
}
