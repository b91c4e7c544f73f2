//! Which of the io_uring shard's receive buffers the kernel is offered, and in what
//! order (the policy only; the shared `io_uring_buf_ring` is `io_uring_backend`'s).
//!
//! The kernel takes provided buffers first in, first out. Offered all of a shard's
//! buffers (512 × 64.5 KiB by default) at once, it writes each datagram into a
//! different one, a page and most cache lines away from the last 511: at saturation
//! every receive then writes lines that are no longer in the core's cache. So the
//! kernel is offered only [`Stock::target`] buffers at a time, and refilled from a
//! last-in, first-out stack of free ones: a buffer whose datagram was copied into a
//! ring, or dropped, comes back as soon as it is routed and is the next one offered.
//! At saturation the same ≈ 128 buffers (≈ 170 KB of written lines) cycle, and stay
//! in the core's L2 ("Seventh pass", docs/journal/2026-11-30-to-12-02-benchmarks.md: −0.04 µs per datagram).
//! Buffers a SEQPACKET frame points into are held until the round's flush, and then
//! come back the same way; the rest of the buffers are there for them.

/// The kernel's share of the buffers at any time (capped by how many exist).
pub const OFFERED: usize = 128;

/// The shard's buffers: each id is free (on the stack), offered to the kernel, or
/// held by the shard (received, not yet given back).
#[derive(Debug)]
pub struct Stock {
    /// Free buffer ids, the most recently given back on top.
    free: Vec<u16>,
    /// Buffers offered to the kernel and not yet taken.
    offered: usize,
    target: usize,
}

impl Stock {
    /// `total` buffers, ids 0..total, all free; the kernel is to be offered
    /// `min(total, max(OFFERED, per_task_run × 2))` of them (a round goes on asking
    /// for receives only while every socket's task run can be served).
    pub fn new(total: u16, per_task_run: usize) -> Stock {
        let target = OFFERED.max(per_task_run.saturating_mul(2)).min(usize::from(total));
        Stock { free: (0..total).rev().collect(), offered: 0, target }
    }

    /// How many buffers the kernel is to hold once refilled.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Buffers offered and not yet taken.
    pub fn offered(&self) -> usize {
        self.offered
    }

    /// The kernel filled `n` offered buffers (one completion each).
    pub fn taken(&mut self, n: usize) {
        self.offered = self.offered.saturating_sub(n);
    }

    /// A buffer the shard no longer needs (its datagram was routed and nothing
    /// points into it). It is the next one offered.
    pub fn give_back(&mut self, bid: u16) {
        self.free.push(bid);
    }

    /// Offers free buffers, the most recently given back first, until the kernel
    /// holds [`Stock::target`] (or none is free). `offer` adds one to the kernel's
    /// ring; returns whether any was offered (the ring's tail must then be published).
    pub fn refill(&mut self, mut offer: impl FnMut(u16)) -> bool {
        let mut any = false;
        while self.offered < self.target {
            let Some(bid) = self.free.pop() else { break };
            offer(bid);
            self.offered += 1;
            any = true;
        }
        any
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on their own setup
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone)]
    enum Op {
        /// The kernel fills up to n offered buffers.
        Receive(usize),
        /// The shard gives back its i-th held buffer (modulo how many it holds).
        GiveBack(usize),
        Refill,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![(0usize..80).prop_map(Op::Receive), any::<usize>().prop_map(Op::GiveBack), Just(Op::Refill)]
    }

    proptest! {
        /// Against a model that tracks each id's place: the kernel's ring (first in,
        /// first out), the shard's hands, and the free ids. No id is ever offered while
        /// it is offered or held; every id is in exactly one place; the kernel never
        /// holds more than the target; a refill tops it up to the target when enough are
        /// free; the id offered first is the one given back last.
        #[test]
        fn ids_are_offered_once_and_last_given_back_first(
            total in 1u16..600,
            per_task_run in 1usize..200,
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            let mut s = Stock::new(total, per_task_run);
            let mut kernel: VecDeque<u16> = VecDeque::new();
            let mut held: Vec<u16> = Vec::new();
            let mut last_given_back: Option<u16> = None;
            for op in ops {
                match op {
                    Op::Receive(n) => {
                        let n = n.min(kernel.len());
                        for _ in 0..n {
                            held.push(kernel.pop_front().unwrap());
                        }
                        s.taken(n);
                    }
                    Op::GiveBack(i) => {
                        if !held.is_empty() {
                            let bid = held.swap_remove(i % held.len());
                            s.give_back(bid);
                            last_given_back = Some(bid);
                        }
                    }
                    Op::Refill => {
                        let mut first = None;
                        let mut out = Vec::new();
                        let any = s.refill(|bid| {
                            first.get_or_insert(bid);
                            out.push(bid);
                        });
                        prop_assert_eq!(any, !out.is_empty());
                        for bid in out {
                            prop_assert!(!kernel.contains(&bid) && !held.contains(&bid), "id {} offered twice", bid);
                            kernel.push_back(bid);
                        }
                        if let Some(f) = first {
                            if let Some(l) = last_given_back.take() {
                                prop_assert_eq!(f, l, "the last id given back is offered first");
                            }
                        }
                        let free = usize::from(total) - kernel.len() - held.len();
                        prop_assert!(kernel.len() == s.target() || free == 0, "refill stopped short");
                    }
                }
                prop_assert_eq!(s.offered(), kernel.len());
                prop_assert!(kernel.len() <= s.target());
                prop_assert_eq!(s.free.len() + kernel.len() + held.len(), usize::from(total));
            }
        }
    }

    #[test]
    fn the_target_is_capped_by_the_buffers_and_covers_the_task_runs() {
        assert_eq!(Stock::new(512, 33).target(), OFFERED);
        assert_eq!(Stock::new(64, 33).target(), 64);
        assert_eq!(Stock::new(512, 33 * 4).target(), 264);
    }
}
