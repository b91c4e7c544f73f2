//! `PinTable` against an exact model: a Vec of (key, target, inserted-at) in insertion
//! order, written from the module documentation (pin.rs) and ADR 0001:
//! - a pin lives exactly `ttl`: alive while `now - at < ttl` (so gone AT `at + ttl`);
//! - insertion first sweeps expired pins from the oldest end;
//! - re-pinning a pinned key changes its target and keeps its expiry;
//! - a full table evicts the oldest pin;
//! - keys longer than 20 bytes (RFC 9000 §17.2) are refused;
//! - the capacity is fixed at construction.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::rng::Rng;
use proptest::prelude::*;
use proto::cid::ServerId;
use proto::pin::{Inserted, PinTable, MAX_KEY_LEN, PIN_TTL};
use std::time::Duration;

#[derive(Debug)]
struct Model {
    cap: usize,
    ttl: Duration,
    pins: Vec<(Vec<u8>, ServerId, Duration)>,
    evicted: u64,
}

impl Model {
    fn new(cap: usize, ttl: Duration) -> Model {
        Model { cap: cap.max(1), ttl, pins: Vec::new(), evicted: 0 }
    }
    fn alive(&self, at: Duration, now: Duration) -> bool {
        // A pin from the future (clock went back) counts as just made.
        match now.checked_sub(at) {
            Some(age) => age < self.ttl,
            None => true,
        }
    }
    fn get(&self, key: &[u8], now: Duration) -> Option<ServerId> {
        let p = self.pins.iter().find(|p| p.0 == key)?;
        self.alive(p.2, now).then_some(p.1)
    }
    fn expire(&mut self, now: Duration) {
        while let Some(front) = self.pins.first() {
            if self.alive(front.2, now) {
                break;
            }
            self.pins.remove(0);
        }
    }
    fn insert(&mut self, key: &[u8], target: ServerId, now: Duration) -> Inserted {
        if key.len() > MAX_KEY_LEN {
            return Inserted::KeyTooLong;
        }
        self.expire(now);
        if let Some(p) = self.pins.iter_mut().find(|p| p.0 == key) {
            p.1 = target;
            return Inserted::Retargeted;
        }
        let evicted = self.pins.len() == self.cap;
        if evicted {
            self.pins.remove(0);
            self.evicted += 1;
        }
        self.pins.push((key.to_vec(), target, now));
        Inserted::New { evicted }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(usize, u16),
    Get(usize),
    Expire,
    /// Advance the clock by this many nanoseconds.
    Tick(u64),
    /// Advance the clock to exactly the expiry instant of the oldest pin (or 1 ns
    /// before / after it), to hit the TTL boundary.
    ToBoundary(i8),
}

/// A small pool of keys that collide on purpose: equal keys, keys that are
/// prefixes of each other, the empty key, 12-byte CIDs, 20 and 21 bytes.
fn key_pool() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0, 0],
        vec![1],
        b"abcdefgh".to_vec(),
        b"abcdefghi".to_vec(),
        vec![7; 12],
        vec![7; 13],
        vec![0xff; 20],
        vec![0xff; 21],
        vec![0; 40],
    ];
    let mut r = Rng::new(77);
    for _ in 0..9 {
        let n = r.range(0, 20);
        keys.push(r.bytes(n));
    }
    keys
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..20, 0u16..6).prop_map(|(k, t)| Op::Insert(k, t)),
        4 => (0usize..20).prop_map(Op::Get),
        1 => Just(Op::Expire),
        3 => prop_oneof![0u64..1_000, 0u64..20_000_000_000].prop_map(Op::Tick),
        1 => (-1i8..=1).prop_map(Op::ToBoundary),
    ]
}

fn run(cap: usize, ttl: Duration, hash_key: [u8; 16], ops: &[Op]) -> Result<(), TestCaseError> {
    let keys = key_pool();
    let mut t = PinTable::with_ttl(cap, hash_key, ttl);
    let mut m = Model::new(cap, ttl);
    let capacity = t.capacity();
    prop_assert_eq!(capacity, cap.max(1));
    let mut now = Duration::from_secs(1);
    for op in ops {
        match *op {
            Op::Insert(k, target) => {
                let key = &keys[k];
                prop_assert_eq!(
                    t.insert(key, ServerId(target), now),
                    m.insert(key, ServerId(target), now),
                    "insert {:?}",
                    key
                );
            }
            Op::Get(k) => {
                prop_assert_eq!(t.get(&keys[k], now), m.get(&keys[k], now), "get {:?} at {:?}", &keys[k], now);
            }
            Op::Expire => {
                t.expire(now);
                m.expire(now);
            }
            Op::Tick(ns) => now += Duration::from_nanos(ns),
            Op::ToBoundary(d) => {
                if let Some(front) = m.pins.first() {
                    let edge = front.2 + ttl;
                    let target = match d {
                        -1 => edge.saturating_sub(Duration::from_nanos(1)),
                        0 => edge,
                        _ => edge + Duration::from_nanos(1),
                    };
                    now = now.max(target);
                }
            }
        }
        prop_assert_eq!(t.len(), m.pins.len());
        prop_assert_eq!(t.is_empty(), m.pins.is_empty());
        prop_assert_eq!(t.evicted(), m.evicted);
        prop_assert_eq!(t.capacity(), capacity, "capacity never changes");
        prop_assert!(t.len() <= capacity);
    }
    // Full cross-check of every key at the end, and at the TTL edges of every pin.
    for k in &keys {
        prop_assert_eq!(t.get(k, now), m.get(k, now));
    }
    let edges: Vec<Duration> = m.pins.iter().map(|p| p.2 + ttl).collect();
    for e in edges {
        for at in [e.saturating_sub(Duration::from_nanos(1)), e] {
            for k in &keys {
                prop_assert_eq!(t.get(k, at.max(now)), m.get(k, at.max(now)));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn matches_model_small_capacities(
        cap in 1usize..=8,
        ttl_ms in prop_oneof![Just(10_000u64), 1u64..50],
        hash_key in any::<[u8; 16]>(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(cap, Duration::from_millis(ttl_ms), hash_key, &ops)?;
    }
}

/// A long seeded run with the production TTL, many keys and capacities up to 64, so
/// the open-addressed index sees long probe chains and many backward-shift deletions.
#[test]
fn matches_model_long_run() {
    let mut r = Rng::new(0x0040_0040);
    for round in 0..40 {
        let cap = if round < 30 { r.range(1, 8) } else { r.range(9, 64) };
        let mut t = PinTable::new(cap, r.array());
        let mut m = Model::new(cap, PIN_TTL);
        let keys: Vec<Vec<u8>> = (0..cap * 3)
            .map(|_| {
                let n = r.range(0, 20);
                r.bytes(n)
            })
            .collect();
        let mut now = Duration::ZERO;
        for _ in 0..5_000 {
            match r.below(10) {
                0..=4 => {
                    let k = r.pick(&keys);
                    let tg = ServerId(r.below(4) as u16);
                    assert_eq!(t.insert(k, tg, now), m.insert(k, tg, now));
                }
                5..=7 => {
                    let k = r.pick(&keys);
                    assert_eq!(t.get(k, now), m.get(k, now));
                }
                8 => now += Duration::from_millis(r.range(0, 3_000) as u64),
                _ => {
                    t.expire(now);
                    m.expire(now);
                }
            }
            assert_eq!(t.len(), m.pins.len());
            assert_eq!(t.evicted(), m.evicted);
            assert_eq!(t.capacity(), cap);
        }
    }
}

#[test]
fn expiry_at_exactly_ttl() {
    let mut t = PinTable::new(4, [3; 16]);
    let at = Duration::from_secs(100);
    assert_eq!(t.insert(b"k", ServerId(9), at), Inserted::New { evicted: false });
    assert_eq!(t.get(b"k", at + PIN_TTL - Duration::from_nanos(1)), Some(ServerId(9)));
    assert_eq!(t.get(b"k", at + PIN_TTL), None, "ADR 0001: pinned 10 s, not 10 s + ε");
    // Insert at the boundary sweeps it: the key becomes a new pin, not a retarget.
    assert_eq!(t.insert(b"k", ServerId(1), at + PIN_TTL), Inserted::New { evicted: false });
    assert_eq!(t.len(), 1);
}

#[test]
fn retarget_keeps_expiry() {
    let mut t = PinTable::new(4, [4; 16]);
    let t0 = Duration::from_secs(1);
    t.insert(b"k", ServerId(1), t0);
    assert_eq!(t.insert(b"k", ServerId(2), t0 + Duration::from_secs(9)), Inserted::Retargeted);
    assert_eq!(t.get(b"k", t0 + Duration::from_secs(9)), Some(ServerId(2)));
    assert_eq!(t.get(b"k", t0 + PIN_TTL), None, "the retarget did not extend the pin");
}

#[test]
fn eviction_is_oldest_first() {
    for cap in 1..=8usize {
        let mut t = PinTable::new(cap, [cap as u8; 16]);
        let now = Duration::from_secs(1);
        for i in 0..cap as u8 {
            assert_eq!(t.insert(&[i], ServerId(i.into()), now), Inserted::New { evicted: false });
        }
        // Touch the oldest (a get must not refresh it).
        assert_eq!(t.get(&[0], now), Some(ServerId(0)));
        for i in cap as u8..(3 * cap) as u8 {
            assert_eq!(t.insert(&[i], ServerId(i.into()), now), Inserted::New { evicted: true });
            let oldest_alive = i + 1 - cap as u8;
            assert_eq!(t.get(&[oldest_alive - 1], now), None, "cap {cap}: {} should be evicted", oldest_alive - 1);
            for j in oldest_alive..=i {
                assert_eq!(t.get(&[j], now), Some(ServerId(j.into())), "cap {cap}: {j} should remain");
            }
        }
        assert_eq!(t.evicted(), 2 * cap as u64);
        assert_eq!(t.capacity(), cap);
    }
}

#[test]
fn capacity_is_clamped_and_fixed() {
    let mut t = PinTable::new(0, [0; 16]);
    assert_eq!(t.capacity(), 1);
    for i in 0..100u8 {
        t.insert(&[i], ServerId(1), Duration::from_secs(i.into()));
        assert_eq!(t.capacity(), 1);
        assert!(t.len() <= 1);
    }
}

/// With a clock that jumps backwards (not expected in production, where `now` is
/// monotonic) the table still never panics and never invents a pin.
#[test]
fn non_monotonic_clock_never_invents_pins() {
    let mut r = Rng::new(8);
    let keys = key_pool();
    for cap in 1..=8 {
        let mut t = PinTable::with_ttl(cap, r.array(), Duration::from_millis(5));
        let mut ever: Vec<Vec<u8>> = Vec::new();
        for _ in 0..2_000 {
            let now = Duration::from_millis(r.range(0, 20) as u64);
            let k = r.pick(&keys);
            if r.chance(1, 2) {
                if t.insert(k, ServerId(1), now) != Inserted::KeyTooLong {
                    ever.push(k.clone());
                }
            } else if t.get(k, now).is_some() {
                assert!(ever.contains(k));
            }
            assert!(t.len() <= cap);
        }
    }
}
