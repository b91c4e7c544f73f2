//! Per-instance counter slots: each live instance counts into one slot of every
//! shard's `--max-instances` array. A slot is reused after its instance died, so the
//! registry remembers its totals when it hands it out (the baseline) and reports
//! counts since then.

use super::Registry;
use crate::dataplane::counters::{instance_total, SlotCounts};
use std::collections::VecDeque;

pub(super) struct Slots {
    /// Free slots, handed out oldest-freed first.
    free: VecDeque<usize>,
    /// Slot counter totals when the slot was handed to its current owner.
    baselines: Vec<SlotCounts>,
}

impl Slots {
    pub(super) fn new(max_instances: usize) -> Slots {
        Slots { free: (0..max_instances).collect(), baselines: vec![SlotCounts::default(); max_instances] }
    }

    /// `--max-instances`.
    pub(super) fn capacity(&self) -> usize {
        self.baselines.len()
    }

    pub(super) fn take(&mut self) -> Option<usize> {
        self.free.pop_front()
    }

    pub(super) fn give_back(&mut self, slot: usize) {
        self.free.push_back(slot);
    }

    /// `slot` goes to a new owner whose counts start at `totals`.
    pub(super) fn set_baseline(&mut self, slot: usize, totals: SlotCounts) {
        self.baselines[slot] = totals;
    }

    /// The current owner's counts, given the slot's running `totals`.
    pub(super) fn since_baseline(&self, slot: usize, totals: SlotCounts) -> SlotCounts {
        totals.since(self.baselines.get(slot).copied().unwrap_or_default())
    }
}

impl Registry {
    /// A slot's running totals: the shards' counters and the fast path's.
    pub(super) fn slot_counts(&self, slot: usize) -> SlotCounts {
        let mut c = instance_total(&self.counters, slot);
        c.fast_datagrams = self.fast_path.active().map_or(0, |fp| fp.worker_datagrams(slot));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(datagrams: u64) -> SlotCounts {
        SlotCounts { datagrams, bytes: 10 * datagrams, drops_full: 1, fast_datagrams: 2 }
    }

    #[test]
    fn slots_are_reused_oldest_freed_first_and_count_from_their_baseline() {
        let mut s = Slots::new(3);
        assert_eq!(s.capacity(), 3);
        assert_eq!((s.take(), s.take(), s.take(), s.take()), (Some(0), Some(1), Some(2), None));
        s.give_back(2);
        s.give_back(0);
        assert_eq!(s.take(), Some(2));
        // A fresh slot counts from zero; a reused one from its totals at hand-out.
        assert_eq!(s.since_baseline(1, counts(5)), counts(5));
        s.set_baseline(2, counts(7));
        assert_eq!(s.since_baseline(2, counts(7)), SlotCounts::default());
        assert_eq!(s.since_baseline(2, counts(9)).datagrams, 2);
        assert_eq!(s.since_baseline(2, counts(9)).bytes, 20);
        assert_eq!(s.take(), Some(0));
    }
}
