//! New-connection rate per client: GCRA in 16-bit lanes (four lanes per word,
//! one CAS).
//!
//! **GCRA.** One number per client, the theoretical arrival time (TAT). A connection
//! at `now` is let in when `max(TAT, now) - now <= tau`, and then
//! `TAT = max(TAT, now) + T`; `T` is the interval at the sustained rate and
//! `tau = (burst - 1) * T`. Nothing but `max` and `+`.
//!
//! **Lanes.** The TATs go into the same table shape as the concurrency sketch: four
//! 16-bit lanes per `AtomicU64`, two per client chosen by a keyed hash, one CAS per
//! decision. A lane holds (at least) the largest TAT of everybody on it, so it never
//! says a client's TAT is earlier than it is: a collision can only make the limit
//! stricter. The estimate is the *smaller* of the two lanes.
//!
//! **Conservative update is right here** (unlike the concurrency sketch): each of the
//! two lanes is raised only to the client's new TAT, `lane = max(lane, tat + T)`.
//! Nothing is ever undone — a TAT just falls behind as time passes — and raising with
//! `max` twice is raising once (a semilattice, not a group), so a lane never drops
//! below anyone's true TAT.
//!
//! **Epochs.** Lanes count ticks since an epoch and 15 bits run out. Once the epoch is
//! [`Gcra::window`] old, the next admission moves it to `now` and the difference is
//! subtracted from the whole table, four lanes at a time, saturating at zero
//! ([`sub_sat`]) — by the following decisions, [`SWEEP_CHUNK`] words each, so that no
//! decision pays for the whole table (a 2^16-word pass at once took milliseconds; the
//! rebasing decision itself pays one read pass, ~0.1 ms). Saturation loses nothing: a
//! TAT before the new epoch is before `now`, and GCRA treats every TAT `<= now` alike.
//! The window is what the lanes leave after the largest TAT an admission can write,
//! `now + tau + T`.
//!
//! **Concurrent rebases (seqlock style, plus a parity bit per word).** Admissions read
//! the epoch state before and after their word and start over if it moved.
//! That alone leaves one race open: an admission under the *new* epoch that writes a
//! word the rebase has not shifted yet would later be shifted once more, making that
//! client's TAT too early (a lenient limit). So each word carries the parity of the
//! epoch its lanes count from, in its bit 63 (the unused top bit of lane 3), and the
//! state remembers the last shift. A word of the previous parity is shifted by whoever
//! meets it first — the sweep or an admission, each with one CAS from the value it read,
//! so it is shifted exactly once. One parity bit tells only "current" from
//! "previous", so a rebase first finishes the previous sweep (cut short only if
//! another rebase overtook it), then flips. A word left two epochs behind would read
//! as current: lanes counted from an older epoch, later TATs — too strict, never
//! lenient, but wrong, hence the extra pass.
//!
//! Cases, with the state re-read after the word: (a) the word was read before a flip
//! and written after it: the sweep changed it (the parity bit flips), the CAS fails,
//! start over; (b) the word is of the previous epoch: shift it, decide, write it with
//! the current parity in one CAS; (c) the state moved between the two reads: start
//! over; (d) a CAS that succeeds after a later flip (the sweep has not reached the
//! word) wrote a previous-epoch word, which the sweep then shifts once, correctly.
//! The only ABA (a word of zeros flipped twice back to the same bits) writes lanes
//! counted from an older epoch, i.e. later TATs: stricter, never lenient.
//!
//! The seed's scheme without the parity bit (epoch first, then a `fetch_update` of
//! every word) lets an idle client admitted mid-pass lose its new TAT to the pass;
//! `rate_two_threads_with_rebases` in proto/tests/limits_model.rs catches that (3 runs
//! of 3 on two cores; it is a race, so not every run everywhere), and catches a missing
//! re-check every run.
//!
//! **Time** is a `u64` tick count passed in (1 ms in the defaults), stored modulo 2^47
//! in the state word; differences of less than 2^46 ticks (2 230 years of 1 ms ticks)
//! are read correctly, and a `now` slightly before the epoch (another shard rebased
//! with a later clock read) is handled as negative: only stricter.

use super::client::{ClientKey, Layout};
use super::lanes::{lane, sub_sat, with_lane, LanePair, LANE_LIMIT, LANE_MAX};
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, SeqCst},
};

/// `tau + T` may be at most this many ticks, so that a window is at least
/// `LANE_MAX - MAX_SPAN` (16 383) ticks: a rebase (a pass over the table) at most once
/// per 16 s with 1 ms ticks.
pub const MAX_SPAN: u64 = 1 << 14;

/// GCRA parameters in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    interval: u64,
    tau: u64,
}

impl Gcra {
    /// `interval` (T) ticks between admissions at the sustained rate, `burst`
    /// admissions at once (`tau = (burst - 1) * T`). `None` unless `T >= 1`,
    /// `burst >= 1` and `tau + T <= MAX_SPAN`.
    pub const fn new(interval: u64, burst: u32) -> Option<Gcra> {
        if interval == 0 || burst == 0 || burst as u64 > MAX_SPAN {
            return None;
        }
        let tau = (burst as u64 - 1) * interval;
        if interval > MAX_SPAN || tau > MAX_SPAN - interval {
            return None;
        }
        Some(Gcra { interval, tau })
    }

    /// `rate` admissions per second sustained, `burst` at once, on a clock of
    /// `ticks_per_second` ticks (T rounded down, at least one tick).
    pub const fn per_second(rate: u32, burst: u32, ticks_per_second: u64) -> Option<Gcra> {
        if rate == 0 {
            return None;
        }
        let t = ticks_per_second / rate as u64;
        Gcra::new(if t == 0 { 1 } else { t }, burst)
    }

    /// T: ticks between admissions at the sustained rate.
    pub const fn interval(&self) -> u64 {
        self.interval
    }
    /// tau = (burst − 1) · T.
    pub const fn tau(&self) -> u64 {
        self.tau
    }
    /// Admissions allowed at once.
    pub const fn burst(&self) -> u64 {
        self.tau / self.interval + 1
    }
    /// Ticks after which the epoch moves: lanes must hold `now − epoch + tau + T`.
    pub const fn window(&self) -> u64 {
        LANE_MAX - self.tau - self.interval
    }
}

/// Bit 63 of a table word (the top bit of lane 3, never used by a lane value): the
/// parity of the epoch its lanes count from.
const PARITY: u64 = 1 << 63;
/// The state word keeps the epoch modulo 2^47.
const EPOCH_BITS: u32 = 47;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;

/// The epoch state, one `AtomicU64`: `epoch (47 bits) | shift (16) | parity (1)`.
#[derive(Clone, Copy, Debug)]
struct State {
    /// Start of the current epoch, in ticks modulo 2^47.
    epoch: u64,
    /// How far the last rebase moved the epoch (clamped to 2^15): what a word of the
    /// previous parity still has to be shifted by.
    shift: u64,
    /// Parity of the current epoch (0 or 1).
    parity: u64,
}

impl State {
    const fn pack(self) -> u64 {
        self.epoch << 17 | self.shift << 1 | self.parity
    }
    const fn unpack(s: u64) -> State {
        State { epoch: s >> 17, shift: (s >> 1) & 0xffff, parity: s & 1 }
    }
    /// `now − epoch` as a signed tick count (negative: `now` is before the epoch).
    #[inline]
    fn rel(self, now: u64) -> i64 {
        let r = now.wrapping_sub(self.epoch) & EPOCH_MASK;
        if r >= 1 << (EPOCH_BITS - 1) {
            r as i64 - (1i64 << EPOCH_BITS)
        } else {
            r as i64
        }
    }
    /// A word's lanes in this epoch's frame (shifted if it is of the previous one).
    #[inline]
    fn lanes_of(self, word: u64) -> u64 {
        if word >> 63 == self.parity {
            word & !PARITY
        } else {
            sub_sat(word & !PARITY, self.shift)
        }
    }
}

/// GCRA per client in 16-bit lanes, fixed memory, one CAS per decision.
#[derive(Debug)]
pub struct RateSketch {
    cells: Box<[AtomicU64]>,
    layout: Layout,
    gcra: Gcra,
    state: AtomicU64,
    /// Next word to shift into the current epoch; `>= words` once the pass is done.
    /// On a line of its own: it is written by every decision during a pass, while the
    /// state next to `cells` is read by every decision always.
    cursor: Padded,
}

#[derive(Debug)]
#[repr(align(128))]
struct Padded(AtomicUsize);

/// Words each decision shifts into the current epoch after a rebase until the pass is
/// done, so that no single decision pays for the whole table (2^16 words: ~1 000
/// decisions of up to 64 CASes each instead of one decision of 65 536).
pub const SWEEP_CHUNK: usize = 64;

impl RateSketch {
    /// A table of `words` words (rounded up to a power of two, at most
    /// [`super::MAX_WORDS`]; 8 bytes each), keyed by `hash_key` (choose it at random),
    /// limiting each client to `gcra`, with its first epoch at `now` ticks.
    pub fn new(words: usize, hash_key: [u8; 16], gcra: Gcra, now: u64) -> RateSketch {
        let layout = Layout::new(words, hash_key);
        let cells: Box<[AtomicU64]> = (0..layout.words()).map(|_| AtomicU64::new(0)).collect();
        let state = State { epoch: now & EPOCH_MASK, shift: 0, parity: 0 };
        let cursor = Padded(AtomicUsize::new(cells.len()));
        RateSketch { cells, layout, gcra, state: AtomicU64::new(state.pack()), cursor }
    }

    pub fn gcra(&self) -> Gcra {
        self.gcra
    }
    /// Words in the table.
    pub fn words(&self) -> usize {
        self.cells.len()
    }
    /// The current epoch, in ticks modulo 2^47 (tests and diagnostics).
    pub fn epoch(&self) -> u64 {
        State::unpack(self.state.load(Acquire)).epoch
    }
    /// The lanes of word `i` counted from the current epoch (tests and diagnostics).
    pub fn word(&self, i: usize) -> u64 {
        let st = State::unpack(self.state.load(Acquire));
        st.lanes_of(self.cells[i].load(Acquire))
    }
    /// Where `client` counts: its word and lane pair.
    pub fn locate(&self, client: ClientKey) -> (usize, LanePair) {
        self.layout.locate(client)
    }

    /// Admits a new connection of `client` at `now` ticks if its GCRA allows it, as far
    /// as the sketch knows (never more than the exact per-client GCRA would).
    #[inline]
    pub fn try_admit(&self, client: ClientKey, now: u64) -> bool {
        let (index, pair) = self.layout.locate(client);
        let (a, b) = pair.lanes();
        let cell = &self.cells[index];
        let t = self.gcra.interval as i64;
        let tau = self.gcra.tau as i64;
        let window = self.gcra.window() as i64;
        self.help_sweep();
        loop {
            let s = self.state.load(Acquire);
            let st = State::unpack(s);
            let now_rel = st.rel(now);
            if now_rel >= window {
                self.rebase(s, now, now_rel as u64);
                continue;
            }
            let w = cell.load(Acquire);
            // Seqlock-style re-check: the word was read under state `s`.
            if self.state.load(Acquire) != s {
                continue;
            }
            let lanes = st.lanes_of(w);
            let (la, lb) = (lane(lanes, a), lane(lanes, b));
            // The client's TAT is at most the smaller lane (each lane >= its TAT).
            let start = (la.min(lb) as i64).max(now_rel);
            if start - now_rel > tau {
                return false;
            }
            // <= window - 1 + tau + T = LANE_MAX - 1: fits a lane.
            let tat = (start + t) as u64;
            let new = with_lane(with_lane(lanes, a, la.max(tat)), b, lb.max(tat)) | st.parity << 63;
            if cell.compare_exchange_weak(w, new, AcqRel, Acquire).is_ok() {
                return true;
            }
        }
    }

    /// Moves the epoch to `now` (seen `now_rel` ticks after the epoch of `seen`) and
    /// the whole table with it; returns with nothing done if the state moved meanwhile
    /// (the caller re-reads it).
    #[cold]
    fn rebase(&self, seen: u64, now: u64, now_rel: u64) {
        // One parity bit tells only current from previous: no word may still count
        // from the epoch before `seen` once the parity flips again (it would read as
        // current, too strict). Normally a read-only pass: the last sweep finished.
        if !self.sweep(seen) {
            return;
        }
        let st = State::unpack(seen);
        let next = State { epoch: now & EPOCH_MASK, shift: now_rel.min(LANE_LIMIT), parity: st.parity ^ 1 }.pack();
        // The epoch moves first, the words after it: the next decisions
        // shift the table, SWEEP_CHUNK words each ([`RateSketch::help_sweep`]).
        if self.state.compare_exchange(seen, next, SeqCst, SeqCst).is_ok() {
            self.cursor.0.store(0, SeqCst);
        }
    }

    /// Shifts the next [`SWEEP_CHUNK`] words into the current epoch if the pass after
    /// the last rebase is not done; one load when it is. Correctness does not depend
    /// on the pass: a word of the previous parity is shifted by whoever meets it, and
    /// a rebase first finishes the pass (which a lost cursor update can leave short).
    #[inline]
    fn help_sweep(&self) {
        let n = self.cells.len();
        if self.cursor.0.load(Relaxed) >= n {
            return;
        }
        let s = self.state.load(Acquire);
        let start = self.cursor.0.fetch_add(SWEEP_CHUNK, Relaxed);
        if start < n {
            self.sweep_range(s, start, (start + SWEEP_CHUNK).min(n));
        }
    }

    /// Whether the pass after the last rebase is done (tests and diagnostics).
    pub fn swept(&self) -> bool {
        self.cursor.0.load(Relaxed) >= self.cells.len()
    }

    /// Shifts every word still of the previous parity into the epoch of `state`, each
    /// with one CAS from the value read; false (stopped) once the state is not `state`.
    fn sweep(&self, state: u64) -> bool {
        self.sweep_range(state, 0, self.cells.len())
    }

    /// [`RateSketch::sweep`] of the words `start..end`.
    fn sweep_range(&self, state: u64, start: usize, end: usize) -> bool {
        let st = State::unpack(state);
        for cell in &self.cells[start..end] {
            let mut w = cell.load(Acquire);
            while w >> 63 != st.parity {
                if self.state.load(Acquire) != state {
                    return false;
                }
                let moved = st.lanes_of(w) | st.parity << 63;
                match cell.compare_exchange_weak(w, moved, AcqRel, Acquire) {
                    Ok(_) => break,
                    Err(now) => w = now,
                }
            }
        }
        true
    }
}
