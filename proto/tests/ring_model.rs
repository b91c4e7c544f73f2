//! The ring's index arithmetic (proto::ring) driving a byte array, against a
//! VecDeque model: every record read back is the model's front, in order, with its
//! bytes intact (no overlap of live records), full is refused only when the bytes
//! really do not fit, and the counters stay within capacity.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proptest::prelude::*;
use proto::ring::*;
use std::collections::VecDeque;

#[derive(Clone, Debug)]
enum Op {
    Push(usize, u8),
    Pop,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => (1usize..200, any::<u8>()).prop_map(|(l, b)| Op::Push(l, b)),
            2 => Just(Op::Pop),
        ],
        0..400,
    )
}

struct Ring {
    data: Vec<u8>,
    head: u64,
    tail: u64,
}

impl Ring {
    fn cap(&self) -> u64 {
        self.data.len() as u64
    }

    fn push(&mut self, body: &[u8]) -> bool {
        let Some(r) = reserve(self.head, self.tail, self.cap(), body.len()) else { return false };
        if let Some(s) = r.skip_at {
            self.data[s..s + 4].copy_from_slice(&SKIP.to_le_bytes());
        }
        self.data[r.at..r.at + 4].copy_from_slice(&(body.len() as u32).to_le_bytes());
        self.data[r.at + 4..r.at + 4 + body.len()].copy_from_slice(body);
        assert!(r.new_tail - self.head <= self.cap());
        assert_eq!(r.new_tail % ALIGN as u64, 0);
        self.tail = r.new_tail;
        true
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        loop {
            if self.head == self.tail {
                return None;
            }
            let w = word_at(self.head, self.cap());
            let word = u32::from_le_bytes(self.data[w..w + 4].try_into().unwrap());
            match next(self.head, self.tail, self.cap(), word) {
                Next::Skip { new_head } => self.head = new_head,
                Next::Record { at, len, new_head } => {
                    self.head = new_head;
                    return Some(self.data[at..at + len].to_vec());
                }
                Next::Corrupt => panic!("corrupt at head {} tail {}", self.head, self.tail),
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn ring_matches_vecdeque(cap_shift in 8u32..11, start in 0u64..4096, ops in ops()) {
        let cap = 1u64 << cap_shift;
        // Start anywhere (8-aligned): counters are free-running.
        let start = start * 8;
        let mut ring = Ring { data: vec![0xee; cap as usize], head: start, tail: start };
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        for op in ops {
            match op {
                Op::Push(len, b) => {
                    let body: Vec<u8> = (0..len).map(|i| b.wrapping_add(i as u8)).collect();
                    let used = ring.tail - ring.head;
                    let need = slot_len(len) as u64;
                    let to_end = cap - ring.tail % cap;
                    let waste = if need <= to_end { 0 } else { to_end };
                    let fits = used + waste + need <= cap;
                    prop_assert_eq!(ring.push(&body), fits);
                    if fits {
                        model.push_back(body);
                    }
                }
                Op::Pop => prop_assert_eq!(ring.pop(), model.pop_front()),
            }
        }
        while let Some(front) = model.pop_front() {
            prop_assert_eq!(ring.pop(), Some(front));
        }
        prop_assert_eq!(ring.pop(), None);
        prop_assert_eq!(ring.head, ring.tail);
    }

    /// The span prefetched for the next record is where that record lands when it has
    /// the same length (wrapping to offset 0 included), never past the data area.
    #[test]
    fn next_span_is_where_the_next_record_goes(cap_shift in 8u32..14, tail in 0u64..4096, lens in prop::collection::vec(1usize..5000, 1..40)) {
        let cap = 1u64 << cap_shift;
        let mut tail = tail * 8;
        for len in lens {
            // The model: a record goes where the tail points, or to offset 0 when it
            // does not fit before the end; nowhere when even an empty ring has no room
            // for it and the padding before it.
            let need = slot_len(len) as u64;
            let pos = tail % cap;
            let wraps = need > cap - pos;
            let placeable = if wraps { cap - pos + need <= cap } else { need <= cap };
            let span = next_span(tail, cap, len);
            if !placeable {
                prop_assert_eq!(span, None);
                continue;
            }
            let at = if wraps { 0 } else { pos as usize };
            prop_assert_eq!(span, Some(at..at + (need as usize).min(PREFETCH_MAX)));
            tail += if wraps { cap - pos } else { 0 } + need;
        }
    }

    #[test]
    fn corrupt_words_are_refused(cap_shift in 8u32..12, head in 0u64..1000, avail in 8u64..4096, word in any::<u32>()) {
        let cap = 1u64 << cap_shift;
        let head = head * 8;
        let avail = (avail.min(cap)) & !7;
        prop_assume!(avail > 0);
        let tail = head + avail;
        match next(head, tail, cap, word) {
            Next::Record { at, len, new_head } => {
                prop_assert!((1..=MAX_BODY).contains(&len));
                prop_assert!(at as u64 + len as u64 <= cap);
                prop_assert!(new_head <= tail);
            }
            Next::Skip { new_head } => {
                prop_assert_eq!(new_head % cap, 0);
                prop_assert!(new_head <= tail);
            }
            Next::Corrupt => {}
        }
    }
}

#[test]
fn capacities() {
    assert!(valid_capacity(MIN_CAPACITY as u64));
    assert!(valid_capacity(1 << 20));
    assert!(!valid_capacity(3 << 17));
    assert!(!valid_capacity(1 << 16));
    assert!(!valid_capacity(1 << 12));
    assert!(!valid_capacity(1 << 31));
    // The largest record fits an empty ring of the least capacity.
    assert!(reserve(0, 0, MIN_CAPACITY as u64, MAX_BODY).is_some());
}
