//! The placement pin table (ADR 0001 "Routing rules"): a client-chosen DCID that was
//! placed on an instance stays there for [`PIN_TTL`], so the client's later Initials
//! and its 0-RTT reach the same instance even while the instance set changes.
//!
//! Fixed capacity chosen at construction; memory never grows with traffic.
//! Every pin lives the same time, so insertion order is expiry order: entries sit in
//! a ring (oldest at the head) and an open-addressed index (linear probing,
//! backward-shift deletion, keyed SipHash) finds them in O(1). Expiry pops the head;
//! a full table evicts the head — always the oldest entry.

use crate::cid::ServerId;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;
use std::time::Duration;

/// How long a placement is pinned (ADR 0001).
pub const PIN_TTL: Duration = Duration::from_secs(10);
/// Longest key: a v1/v2 connection ID (RFC 9000 §17.2).
pub const MAX_KEY_LEN: usize = 20;

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    key: [u8; MAX_KEY_LEN],
    key_len: u8,
    target: ServerId,
    at: Duration,
    hash: u64,
    /// Caller's value stored with the pin ([`NO_PAYLOAD`] for none), handed back once
    /// when the pin leaves the table ([`PinTable::insert_with`]).
    payload: u32,
}

/// The payload of a pin that carries none: never handed back.
pub const NO_PAYLOAD: u32 = u32::MAX;

/// Fixed-capacity, oldest-first-evicting map from a client DCID to a server id.
pub struct PinTable {
    ring: Box<[Slot]>,
    head: usize,
    len: usize,
    index: Box<[u32]>,
    mask: usize,
    hasher: SipHasher13,
    ttl: Duration,
    evicted: u64,
}

impl std::fmt::Debug for PinTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinTable")
            .field("capacity", &self.ring.len())
            .field("len", &self.len)
            .field("evicted", &self.evicted)
            .finish()
    }
}

/// Result of a pin insertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// A new entry; `evicted` tells whether the oldest live entry was pushed out.
    New { evicted: bool },
    /// The key was pinned already: its target changed, its expiry did not.
    Retargeted,
    /// The key is longer than a connection ID may be: not stored.
    KeyTooLong,
}

impl PinTable {
    /// A table holding at most `capacity` pins (at least 1), with hash key `hash_key`
    /// (choose it at random so that nobody can aim collisions at the index).
    pub fn new(capacity: usize, hash_key: [u8; 16]) -> PinTable {
        Self::with_ttl(capacity, hash_key, PIN_TTL)
    }

    /// As [`PinTable::new`] with another lifetime (tests and tuning).
    pub fn with_ttl(capacity: usize, hash_key: [u8; 16], ttl: Duration) -> PinTable {
        let capacity = capacity.clamp(1, (u32::MAX / 4) as usize);
        let index_len = (capacity * 2).next_power_of_two();
        let empty = Slot {
            key: [0; MAX_KEY_LEN],
            key_len: 0,
            target: ServerId(0),
            at: Duration::ZERO,
            hash: 0,
            payload: NO_PAYLOAD,
        };
        PinTable {
            ring: vec![empty; capacity].into_boxed_slice(),
            head: 0,
            len: 0,
            index: vec![EMPTY; index_len].into_boxed_slice(),
            mask: index_len - 1,
            hasher: SipHasher13::new_with_key(&hash_key),
            ttl,
            evicted: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.ring.len()
    }
    /// Entries held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Live entries pushed out because the table was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        let mut h = self.hasher;
        h.write(key);
        h.finish()
    }

    #[inline]
    fn expired(&self, slot: &Slot, now: Duration) -> bool {
        now.saturating_sub(slot.at) >= self.ttl
    }

    /// Index position holding `key`, if present.
    #[inline]
    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        // An empty table holds nothing: no probe into its (cold) index. Under a flood
        // answered with Retry nothing gets pinned, and each probe would cost one cache
        // miss per Initial.
        if self.len == 0 {
            return None;
        }
        let mut pos = hash as usize & self.mask;
        loop {
            let s = self.index[pos];
            if s == EMPTY {
                return None;
            }
            let slot = &self.ring[s as usize];
            if slot.hash == hash && &slot.key[..slot.key_len as usize] == key {
                return Some(pos);
            }
            pos = (pos + 1) & self.mask;
        }
    }

    /// The pinned target of `key`, if pinned and not expired at `now`.
    #[inline]
    pub fn get(&self, key: &[u8], now: Duration) -> Option<ServerId> {
        if key.len() > MAX_KEY_LEN {
            return None;
        }
        let pos = self.find(key, self.hash(key))?;
        let slot = &self.ring[self.index[pos] as usize];
        (!self.expired(slot, now)).then_some(slot.target)
    }

    /// Takes the payload of `key`'s pin if it is pinned to `target` and not expired at
    /// `now`, leaving the pin in place with [`NO_PAYLOAD`] (it still routes the key's
    /// Initials and 0-RTT until it expires). The payload leaves once: a second call,
    /// or the pin's later expiry or eviction, hands back nothing. Another target, no
    /// pin, an expired pin (its sweep hands the payload back) or no payload: `None`.
    pub fn take_payload(&mut self, key: &[u8], target: ServerId, now: Duration) -> Option<u32> {
        if key.len() > MAX_KEY_LEN {
            return None;
        }
        let pos = self.find(key, self.hash(key))?;
        let i = self.index[pos] as usize;
        let expired = self.expired(&self.ring[i], now);
        let slot = &mut self.ring[i];
        if expired || slot.target != target || slot.payload == NO_PAYLOAD {
            return None;
        }
        Some(std::mem::replace(&mut slot.payload, NO_PAYLOAD))
    }

    /// Removes the index entry at `pos` with backward-shift deletion, so no tombstones
    /// accumulate and probe chains stay short.
    fn remove_index_at(&mut self, mut pos: usize) {
        loop {
            self.index[pos] = EMPTY;
            let mut next = (pos + 1) & self.mask;
            loop {
                let s = self.index[next];
                if s == EMPTY {
                    return;
                }
                let home = self.ring[s as usize].hash as usize & self.mask;
                // Move `next` back into `pos` unless its home lies cyclically in (pos, next].
                let dist_home = next.wrapping_sub(home) & self.mask;
                let dist_pos = next.wrapping_sub(pos) & self.mask;
                if dist_home >= dist_pos {
                    self.index[pos] = s;
                    pos = next;
                    break;
                }
                next = (next + 1) & self.mask;
            }
        }
    }

    /// Drops the oldest entry (the ring head), handing back its payload.
    fn pop_oldest(&mut self) -> u32 {
        let slot = self.ring[self.head];
        self.ring[self.head].payload = NO_PAYLOAD;
        let key = &slot.key[..slot.key_len as usize];
        if let Some(pos) = self.find(key, slot.hash) {
            self.remove_index_at(pos);
        }
        self.head = (self.head + 1) % self.ring.len();
        self.len -= 1;
        slot.payload
    }

    /// Sweeps every entry expired at `now`. Amortised O(1) per insertion.
    pub fn expire(&mut self, now: Duration) {
        self.expire_with(now, |_| {});
    }

    /// [`PinTable::expire`], handing every swept pin's payload (other than
    /// [`NO_PAYLOAD`]) to `released`, exactly once.
    pub fn expire_with(&mut self, now: Duration, mut released: impl FnMut(u32)) {
        while self.len > 0 && self.expired(&self.ring[self.head], now) {
            let p = self.pop_oldest();
            if p != NO_PAYLOAD {
                released(p);
            }
        }
    }

    /// Empties the table, handing every payload (other than [`NO_PAYLOAD`]) to
    /// `released` exactly once (shutdown: give back what the pins hold).
    pub fn drain(&mut self, mut released: impl FnMut(u32)) {
        while self.len > 0 {
            let p = self.pop_oldest();
            if p != NO_PAYLOAD {
                released(p);
            }
        }
    }

    /// Pins `key` to `target` at `now` (sweeping expired entries first).
    ///
    /// Payload-less: a pin that [`PinTable::insert_with`] made with a payload and that
    /// this call sweeps, evicts or retargets loses its payload. Use one or the other.
    pub fn insert(&mut self, key: &[u8], target: ServerId, now: Duration) -> Inserted {
        self.insert_with(key, target, now, NO_PAYLOAD, |_| {})
    }

    /// [`PinTable::insert`] that stores `payload` with the pin. Every payload leaves
    /// through `released` exactly once (unless it is [`NO_PAYLOAD`]): the payloads of
    /// pins swept as expired or evicted as oldest; on [`Inserted::Retargeted`] the
    /// key's old payload (the new one takes its place, the expiry stays); on
    /// [`Inserted::KeyTooLong`] `payload` itself, as it is not stored. Later,
    /// [`PinTable::expire_with`] and [`PinTable::drain`] hand back the rest.
    pub fn insert_with(
        &mut self,
        key: &[u8],
        target: ServerId,
        now: Duration,
        payload: u32,
        mut released: impl FnMut(u32),
    ) -> Inserted {
        let mut give_back = |p: u32| {
            if p != NO_PAYLOAD {
                released(p)
            }
        };
        if key.len() > MAX_KEY_LEN {
            give_back(payload);
            return Inserted::KeyTooLong;
        }
        self.expire_with(now, &mut give_back);
        let hash = self.hash(key);
        if let Some(pos) = self.find(key, hash) {
            let s = self.index[pos] as usize;
            self.ring[s].target = target;
            let old = std::mem::replace(&mut self.ring[s].payload, payload);
            give_back(old);
            return Inserted::Retargeted;
        }
        let mut evicted = false;
        if self.len == self.ring.len() {
            let p = self.pop_oldest();
            give_back(p);
            self.evicted += 1;
            evicted = true;
        }
        let s = (self.head + self.len) % self.ring.len();
        let mut k = [0u8; MAX_KEY_LEN];
        k[..key.len()].copy_from_slice(key);
        self.ring[s] = Slot { key: k, key_len: key.len() as u8, target, at: now, hash, payload };
        self.len += 1;
        let mut pos = hash as usize & self.mask;
        while self.index[pos] != EMPTY {
            pos = (pos + 1) & self.mask;
        }
        self.index[pos] = s as u32;
        Inserted::New { evicted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_exclusive_at_ttl() {
        let mut p = PinTable::new(4, [0; 16]);
        p.insert(b"abcdefgh", ServerId(1), Duration::from_secs(5));
        assert_eq!(p.get(b"abcdefgh", Duration::from_millis(14_999)), Some(ServerId(1)));
        assert_eq!(p.get(b"abcdefgh", Duration::from_secs(15)), None);
    }

    #[test]
    fn full_table_evicts_oldest() {
        let mut p = PinTable::new(2, [1; 16]);
        let t = Duration::from_secs(1);
        p.insert(b"a", ServerId(1), t);
        p.insert(b"b", ServerId(2), t);
        assert_eq!(p.insert(b"c", ServerId(3), t), Inserted::New { evicted: true });
        assert_eq!(p.get(b"a", t), None);
        assert_eq!(p.get(b"b", t), Some(ServerId(2)));
        assert_eq!(p.get(b"c", t), Some(ServerId(3)));
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn too_long_key_is_refused() {
        let mut p = PinTable::new(2, [1; 16]);
        assert_eq!(p.insert(&[0; 21], ServerId(1), Duration::ZERO), Inserted::KeyTooLong);
        assert_eq!(p.get(&[0; 21], Duration::ZERO), None);
    }
}
