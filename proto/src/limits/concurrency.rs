//! Concurrent pinned handshakes per client: a count-min sketch in 16-bit lanes
//!.
//!
//! Each `AtomicU64` holds four counters. A client counts against two lanes of one
//! word, both picked by a keyed hash (6 pairs). Admission checks that **not both** of
//! the client's lanes are at the cap and adds one to both, in one compare-and-swap;
//! release is one `fetch_sub` of the same two ones.
//!
//! **The bound.** A lane only ever holds the sum of the live tickets of the clients on
//! it, so each of a client's lanes is `>=` its live count, and so is the smaller one.
//! Admitting only while the smaller lane is below `cap` therefore never lets a client
//! hold more than `cap` tickets. Both lanes live in one word and change in one CAS: two
//! words with two `fetch_add`s would not be one atomic step, and two racing admissions
//! of a client one below its cap could each see a different lane below the cap.
//!
//! **Plain, not conservative, update.** Conservative update (raise only the lanes at
//! the client's minimum) would collide less, but it breaks the bound: with A on
//! (L1, L3) and B on (L1, L2), A opens 5 (L1 = L3 = 5), B opens 3 raising only L2,
//! A closes 5 (L1 = 0): B holds 3 with a minimum of 0. Plain update makes every
//! release undo its admission exactly, whatever happened in between (a group
//! homomorphism); conservative update makes an admission depend on the lanes at that
//! moment, which a later release cannot undo.
//!
//! **Lane range.** A pair's own count never exceeds `cap` (each admission needs one of
//! its two lanes, both `>=` the pair's count, below `cap`), and a lane is shared by 3
//! pairs, so a lane never exceeds `3 * cap`: with `cap <= MAX_CAP` every lane stays
//! below 2^15 and the lane arithmetic holds.
//!
//! **Refusals of honest clients.** The reverse of the bound can fail: a client is
//! refused when both its lanes are full of other people — mostly a *twin* (same word,
//! same pair; about `clients / (6 * words)` of them) that itself sits at the cap. The
//! keyed hash keeps anyone from choosing their cell. Sizing: [`super`] module docs.

use super::client::{ClientKey, Layout};
use super::lanes::{lanes_at_least, LanePair};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The largest cap: `3 * MAX_CAP < 2^15` keeps every lane below 2^15.
pub const MAX_CAP: u16 = ((1u32 << 15) / 3) as u16 - 1;

/// Proof of one admission: which word and which two lanes to give back.
///
/// Not `Clone`: releasing a ticket twice would take a count from somebody else (and
/// underflow a lane). [`Ticket::to_raw`] / [`Ticket::from_raw`] pack it into 32 bits for
/// storage next to a pin; a raw value must be turned back into a ticket exactly once.
#[must_use = "a ticket that is dropped without release() holds its lanes forever"]
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    index: u32,
    pair: LanePair,
}

impl Ticket {
    /// The word index.
    pub fn index(&self) -> usize {
        self.index as usize
    }
    /// The two lanes.
    pub fn pair(&self) -> LanePair {
        self.pair
    }
    /// `index << 3 | pair id` (indices are below 2^28, [`super::MAX_WORDS`]).
    pub fn to_raw(self) -> u32 {
        self.index << 3 | u32::from(self.pair.id())
    }
    /// The ticket [`Ticket::to_raw`] packed; `None` for a value it cannot have made.
    pub fn from_raw(raw: u32) -> Option<Ticket> {
        Some(Ticket { index: raw >> 3, pair: LanePair::from_id((raw & 7) as u8)? })
    }
}

/// Count-min lanes sketch of live tickets per client, fixed memory, lock-free.
#[derive(Debug)]
pub struct ConcurrencySketch {
    cells: Box<[AtomicU64]>,
    layout: Layout,
}

impl ConcurrencySketch {
    /// A table of `words` words (rounded up to a power of two, at most
    /// [`super::MAX_WORDS`]; 8 bytes each), keyed by `hash_key` (choose it at random).
    pub fn new(words: usize, hash_key: [u8; 16]) -> ConcurrencySketch {
        let layout = Layout::new(words, hash_key);
        let cells = (0..layout.words()).map(|_| AtomicU64::new(0)).collect();
        ConcurrencySketch { cells, layout }
    }

    /// Words in the table.
    pub fn words(&self) -> usize {
        self.cells.len()
    }

    /// Word `i` as it is now (diagnostics and tests).
    pub fn word(&self, i: usize) -> u64 {
        self.cells[i].load(Relaxed)
    }

    /// Where `client` counts: its word and lane pair.
    pub fn locate(&self, client: ClientKey) -> (usize, LanePair) {
        self.layout.locate(client)
    }

    /// Admits one more handshake of `client` unless both of its lanes are at `cap`
    /// (clamped to [`MAX_CAP`]; 0 refuses everyone). One CAS loop on one word.
    #[inline]
    pub fn try_acquire(&self, client: ClientKey, cap: u16) -> Option<Ticket> {
        let cap = u64::from(cap.min(MAX_CAP));
        let (index, pair) = self.layout.locate(client);
        let cell = &self.cells[index];
        let ones = pair.ones();
        let mine = pair.high();
        // Relaxed is enough: the bound needs only that the CAS and the fetch_sub are
        // read-modify-writes of one location (one modification order); no other
        // memory is published through this word.
        let mut cur = cell.load(Relaxed);
        loop {
            if lanes_at_least(cur, cap) & mine == mine {
                return None;
            }
            match cell.compare_exchange_weak(cur, cur + ones, Relaxed, Relaxed) {
                Ok(_) => return Some(Ticket { index: index as u32, pair }),
                Err(now) => cur = now,
            }
        }
    }

    /// Whether [`ConcurrencySketch::try_acquire`] would refuse `client` now (both of
    /// its lanes at `cap`): a look, nothing taken. For Initials that make no pin
    /// (proto::limits::owner_initial) but must not come from a client at its cap.
    #[inline]
    pub fn full(&self, client: ClientKey, cap: u16) -> bool {
        let cap = u64::from(cap.min(MAX_CAP));
        let (index, pair) = self.layout.locate(client);
        let mine = pair.high();
        lanes_at_least(self.cells[index].load(Relaxed), cap) & mine == mine
    }

    /// Gives back the two lanes `ticket` took: one `fetch_sub`.
    #[inline]
    pub fn release(&self, ticket: Ticket) {
        let ones = ticket.pair.ones();
        let prev = self.cells[ticket.index as usize].fetch_sub(ones, Relaxed);
        // Both lanes were at least 1 (this ticket's own count): no borrow happened.
        debug_assert_eq!(lanes_at_least(prev, 1) & ticket.pair.high(), ticket.pair.high());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// `full` says exactly what `try_acquire` would do, and takes nothing: over
    /// random acquisitions and releases of clients crowded into a small table (so
    /// lanes are shared), with caps 0..=3.
    #[test]
    fn full_is_what_try_acquire_would_refuse() {
        let s = ConcurrencySketch::new(4, [5; 16]);
        let mut held: Vec<Ticket> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut step = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let r = step();
            let client = ClientKey::from(Ipv4Addr::from(0xc000_0200 | (r & 15) as u32));
            let cap = ((r >> 8) % 4) as u16;
            if (r >> 16) % 3 == 0 && !held.is_empty() {
                let i = (r >> 20) as usize % held.len();
                s.release(held.swap_remove(i));
                continue;
            }
            let words: Vec<u64> = (0..s.words()).map(|i| s.word(i)).collect();
            let full = s.full(client, cap);
            assert_eq!(words, (0..s.words()).map(|i| s.word(i)).collect::<Vec<_>>(), "full took something");
            match s.try_acquire(client, cap) {
                Some(t) => {
                    assert!(!full, "full, yet admitted");
                    held.push(t);
                }
                None => assert!(full, "not full, yet refused"),
            }
        }
        for t in held {
            s.release(t);
        }
    }
}
