//! Rendezvous (highest-random-weight) hashing: `pick` is a plain argmax of `weight`,
//! and the placement is stable: removing one of N instances moves only that
//! instance's keys (≈ 1/N of them); adding one takes ≈ 1/(N+1), only to itself.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::rng::Rng;
use proptest::prelude::*;
use proto::cid::ServerId;
use proto::rendezvous::Rendezvous;

/// The obviously-right argmax: the first candidate with the highest weight.
fn naive_pick(key_hash: u64, candidates: &[(u64, usize)]) -> Option<usize> {
    let weights: Vec<u64> = candidates.iter().map(|&(s, _)| Rendezvous::weight(s, key_hash)).collect();
    let max = *weights.iter().max()?;
    let pos = weights.iter().position(|&w| w == max)?;
    Some(candidates[pos].1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn pick_is_argmax(key_hash in any::<u64>(), seeds in proptest::collection::vec(any::<u64>(), 0..20)) {
        let cands: Vec<(u64, usize)> = seeds.iter().copied().zip(0..).collect();
        prop_assert_eq!(Rendezvous::pick(key_hash, cands.iter().copied()), naive_pick(key_hash, &cands));
    }

    /// Equal seeds have equal weights: the first candidate wins the tie.
    #[test]
    fn ties_go_to_the_first(key_hash in any::<u64>(), seed in any::<u64>(), n in 2usize..6) {
        let cands: Vec<(u64, usize)> = (0..n).map(|i| (seed, i)).collect();
        prop_assert_eq!(Rendezvous::pick(key_hash, cands.iter().copied()), Some(0));
    }

    /// Seeds and key hashes depend on everything they are given.
    #[test]
    fn hashes_depend_on_inputs(k in any::<[u8; 16]>(), a in any::<u16>(), b in any::<u16>(), key in proptest::collection::vec(any::<u8>(), 0..20)) {
        let r = Rendezvous::new(k);
        prop_assert_eq!(r.seed(ServerId(a)), r.seed(ServerId(a)));
        if a != b {
            prop_assert_ne!(r.seed(ServerId(a)), r.seed(ServerId(b)));
        }
        let mut other = key.clone();
        other.push(0);
        prop_assert_ne!(r.key_hash(&key), r.key_hash(&other));
    }
}

#[test]
fn pick_of_nothing_is_none() {
    assert_eq!(Rendezvous::pick::<usize>(42, std::iter::empty()), None);
}

const KEYS: usize = 100_000;

/// 100 000 random client DCIDs (8..=20 bytes, RFC 9000 §7.2), hashed once.
fn key_hashes(r: &Rendezvous, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..KEYS)
        .map(|_| {
            let n = rng.range(8, 20);
            r.key_hash(&rng.bytes(n))
        })
        .collect()
}

fn assign(hashes: &[u64], inst: &[(u64, u16)]) -> Vec<u16> {
    hashes.iter().map(|&h| Rendezvous::pick(h, inst.iter().copied()).unwrap()).collect()
}

/// Binomial bounds: `count` is within 6 standard deviations of `n·p`.
fn near(count: usize, n: usize, p: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (count as f64 - mean).abs() <= 6.0 * sd
}

#[test]
fn removing_and_adding_one_instance_moves_about_one_nth() {
    let mut rng = Rng::new(0x4857);
    let r = Rendezvous::new(rng.array());
    let hashes = key_hashes(&r, 1);
    for n in 2..=16usize {
        // Server ids as the controller gives them: distinct, not the slot index.
        let mut ids: Vec<u16> = Vec::new();
        while ids.len() < n + 1 {
            let id = rng.u8() as u16 * 97 + rng.below(97) as u16;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let inst: Vec<(u64, u16)> = ids[..n].iter().map(|&id| (r.seed(ServerId(id)), id)).collect();
        let before = assign(&hashes, &inst);
        // Balance: every instance gets ≈ 1/N.
        for &(_, id) in &inst {
            let c = before.iter().filter(|&&x| x == id).count();
            assert!(near(c, KEYS, 1.0 / n as f64), "N={n}: instance {id} got {c} keys");
        }

        // Remove one (not always the first or the last).
        let gone = rng.below(n);
        let gone_id = inst[gone].1;
        let mut fewer = inst.clone();
        fewer.remove(gone);
        let after = assign(&hashes, &fewer);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                moved += 1;
                assert_eq!(*b, gone_id, "N={n}: a key moved off a surviving instance");
            }
            assert_ne!(*a, gone_id);
        }
        let on_gone = before.iter().filter(|&&x| x == gone_id).count();
        assert_eq!(moved, on_gone, "N={n}: every key of the removed instance moved");
        assert!(near(moved, KEYS, 1.0 / n as f64), "N={n}: {moved} keys moved on removal");

        // Add one: it takes ≈ 1/(N+1), and keys only move onto it.
        let new_id = ids[n];
        let mut more = inst.clone();
        more.insert(rng.below(n + 1), (r.seed(ServerId(new_id)), new_id));
        let after = assign(&hashes, &more);
        let mut taken = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                taken += 1;
                assert_eq!(*a, new_id, "N={n}: a key moved between old instances");
            }
        }
        assert!(near(taken, KEYS, 1.0 / (n + 1) as f64), "N={n}: {taken} keys taken on addition");

        // The order in which instances are listed does not matter.
        let mut shuffled = inst.clone();
        shuffled.reverse();
        assert_eq!(assign(&hashes, &shuffled), before);
    }
}

#[test]
fn different_hash_keys_give_different_assignments() {
    let ids: Vec<u16> = (0..8).map(|i| 1000 + i * 7).collect();
    let mut rng = Rng::new(17);
    let mut dcids = Vec::new();
    for _ in 0..20_000 {
        dcids.push(rng.bytes(8));
    }
    let place = |key: [u8; 16]| -> Vec<u16> {
        let r = Rendezvous::new(key);
        let inst: Vec<(u64, u16)> = ids.iter().map(|&id| (r.seed(ServerId(id)), id)).collect();
        dcids.iter().map(|d| Rendezvous::pick(r.key_hash(d), inst.iter().copied()).unwrap()).collect()
    };
    let a = place([1; 16]);
    let b = place([2; 16]);
    let a2 = place([1; 16]);
    assert_eq!(a, a2, "deterministic for one key");
    // Independent placements agree on ≈ 1/8 of the keys; equal ones on all.
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(near(same, dcids.len(), 1.0 / 8.0), "{same} of {} keys placed alike under two keys", dcids.len());
}
