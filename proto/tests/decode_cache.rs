//! `DecodeCache` against `KeySet::decode`: for any sequence of CIDs interleaved with
//! key-set changes, the cached decode returns exactly what the key set returns.
//!
//! The CIDs: ours under many server ids and every generation, re-sent often; CIDs of
//! key sets that share a generation number but not its secret (what three rotations
//! produce, and what a cache that ignored the key set would get wrong); random bytes,
//! `cr` = 3, wrong lengths; and CIDs equal in the index bytes 1..=8 (same slot) but
//! different elsewhere (what a cache that compared fewer than 12 bytes would get wrong).
//! Key sets use both PRFs (ADR 0004), mixed within one set, and pairs that differ
//! only in a generation's PRF (what a cache keyed on secrets alone would get wrong).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proptest::prelude::*;
use proto::cid::{Generation, KeySet, Prf, ServerId, CID_LEN};
use proto::decode_cache::{DecodeCache, Decoder};

#[derive(Clone, Debug)]
enum Op {
    /// Switch to key set `i` of the pool.
    Keys(usize),
    /// Rotate the current key set (fresh newest generation, seed given, with this PRF
    /// or, for `None`, the newest's).
    Rotate(u8, Option<Prf>),
    /// Mint a CID under pool key set `ks` for `id`, remember it, decode it.
    Mint { ks: usize, g: u8, id: u16, rand: [u8; 10] },
    /// Decode a remembered CID again (an established connection).
    Again(usize),
    /// Remembered CID `i` with byte `at` (outside 1..=8: same slot) xored with `x`.
    Twin { i: usize, at: usize, x: u8 },
    /// Arbitrary bytes (random, cr = 3, wrong lengths).
    Raw(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..POOL).prop_map(Op::Keys),
        1 => (any::<u8>(), prop::option::of(prop::sample::select(Prf::ALL.to_vec())))
            .prop_map(|(seed, prf)| Op::Rotate(seed, prf)),
        4 => (0..POOL, 0..3u8, prop_oneof![0..4u16, any::<u16>()], any::<[u8; 10]>())
            .prop_map(|(ks, g, id, rand)| Op::Mint { ks, g, id, rand }),
        6 => any::<usize>().prop_map(Op::Again),
        2 => (any::<usize>(), prop::sample::select(vec![0usize, 9, 10, 11]), 1..=255u8)
            .prop_map(|(i, at, x)| Op::Twin { i, at, x }),
        1 => prop_oneof![prop::collection::vec(any::<u8>(), 12), prop::collection::vec(any::<u8>(), 0..24)]
            .prop_map(Op::Raw),
    ]
}

const POOL: usize = 8;

/// Key sets that hold the same generation numbers with different secrets, and
/// different live generation pairs; the last four repeat the first four's secrets
/// with other PRFs (ADR 0004): all SipHash-2-4, or newest SipHash-2-4 and previous
/// HMAC-SHA-256, or the reverse.
fn pool() -> Vec<KeySet> {
    let g = |n| Generation::new(n).unwrap();
    let (h, s) = (Prf::HmacSha256, Prf::SipHash24);
    let v = vec![
        KeySet::new((g(0), [1; 32]), None).unwrap(),
        KeySet::new((g(0), [2; 32]), Some((g(2), [3; 32]))).unwrap(),
        KeySet::new((g(1), [4; 32]), Some((g(0), [1; 32]))).unwrap(),
        KeySet::new((g(2), [5; 32]), Some((g(1), [6; 32]))).unwrap(),
        KeySet::with_prfs((g(0), s, [1; 32]), None).unwrap(),
        KeySet::with_prfs((g(0), s, [2; 32]), Some((g(2), h, [3; 32]))).unwrap(),
        KeySet::with_prfs((g(1), h, [4; 32]), Some((g(0), s, [1; 32]))).unwrap(),
        KeySet::with_prfs((g(2), s, [5; 32]), Some((g(1), s, [6; 32]))).unwrap(),
    ];
    assert_eq!(v.len(), POOL);
    v
}

fn run(ops: &[Op], entries: usize) -> (u64, u64) {
    let pool = pool();
    let mut keys = pool[0].clone();
    let mut cache = DecodeCache::new(entries);
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for op in ops {
        let cid: Vec<u8> = match op {
            Op::Keys(i) => {
                keys = pool[*i].clone();
                continue;
            }
            Op::Rotate(seed, prf) => {
                keys = match prf {
                    Some(p) => keys.rotated_with([*seed; 32], *p),
                    None => keys.rotated([*seed; 32]),
                };
                continue;
            }
            Op::Mint { ks, g, id, rand } => {
                let ks = &pool[*ks];
                let g = Generation::new(*g).unwrap();
                let c = ks.encode_with(g, ServerId(*id), rand).unwrap_or_else(|| ks.encode(ServerId(*id), rand));
                seen.push(c.to_vec());
                c.to_vec()
            }
            // Mostly one of the last 64 (a live connection), sometimes any.
            Op::Again(i) if !seen.is_empty() => {
                let n = if i % 8 == 0 { seen.len() } else { seen.len().min(64) };
                seen[seen.len() - 1 - (i / 8) % n].clone()
            }
            Op::Twin { i, at, x } if !seen.is_empty() => {
                let mut c = seen[i % seen.len()].clone();
                c[*at] ^= x;
                seen.push(c.clone());
                c
            }
            Op::Raw(b) => b.clone(),
            _ => continue,
        };
        assert_eq!(cache.decode(&keys, &cid), keys.decode(&cid), "cid {cid:02x?} under {keys:?}");
    }
    (cache.hits(), cache.misses())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn cached_decode_equals_keyset_decode(
        ops in prop::collection::vec(op(), 1..300),
        entries in prop::sample::select(vec![0usize, 1, 2, 8, 64, 4096]),
    ) {
        run(&ops, entries);
    }
}

/// A fixed scenario that needs both the key-set check and the 12-byte compare, so a
/// cache that dropped either fails here whatever proptest happens to generate.
#[test]
fn same_slot_other_key_set_and_twins() {
    let pool = pool();
    let mut c = DecodeCache::new(8);
    // Generation 0 under two different secrets: same CID, different server ids.
    let cid = pool[0].encode(ServerId(7), &[0; 10]);
    assert_eq!(c.decode(&pool[0], &cid).unwrap().server_id, ServerId(7));
    assert_ne!(pool[1].decode(&cid), pool[0].decode(&cid));
    assert_eq!(c.decode(&pool[1], &cid), pool[1].decode(&cid));
    assert_eq!(c.decode(&pool[0], &cid), pool[0].decode(&cid));
    // Same live generations, other secret (a key file replaced, or three rotations).
    let other = KeySet::new((Generation::new(0).unwrap(), [9; 32]), None).unwrap();
    assert_ne!(other.decode(&cid), pool[0].decode(&cid));
    assert_eq!(c.decode(&other, &cid), other.decode(&cid));
    assert_eq!(c.decode(&pool[0], &cid), pool[0].decode(&cid));
    // Same bytes 1..=8 (same slot), other bytes 0, 9, 10, 11.
    for at in [0usize, 9, 10, 11] {
        let mut twin = cid;
        twin[at] ^= 0x15;
        assert_eq!(c.decode(&pool[0], &cid), pool[0].decode(&cid));
        assert_eq!(c.decode(&pool[0], &twin), pool[0].decode(&twin), "byte {at}");
    }
    // Many server ids and generations through one small cache, twice each.
    let mut hits = 0;
    for ks in &pool {
        for g in ks.live_generations() {
            for id in 0..200u16 {
                let rand = [id as u8, (id >> 8) as u8, g.get(), 3, 4, 5, 6, 7, 8, 9];
                let x = ks.encode_with(g, ServerId(id), &rand).unwrap();
                assert_eq!(c.decode(ks, &x).unwrap().server_id, ServerId(id));
                let before = c.hits();
                assert_eq!(c.decode(ks, &x).unwrap().server_id, ServerId(id));
                hits += c.hits() - before;
            }
        }
    }
    assert!(hits > 1000, "repeats hit: {hits}");
    assert_eq!(CID_LEN, 12);
}

/// ADR 0004: one secret under two PRFs is two decode functions. The same CID through
/// one cache under a key set and under its twin with the other PRF in one generation
/// (newest SipHash-2-4 / previous HMAC-SHA-256 and the reverse, and a single
/// generation) gives each key set's own answer, in every order.
#[test]
fn same_secrets_other_prf_never_share_entries() {
    let g = |n| Generation::new(n).unwrap();
    let (h, s) = (Prf::HmacSha256, Prf::SipHash24);
    let twins = [
        (KeySet::new((g(0), [1; 32]), None).unwrap(), KeySet::with_prfs((g(0), s, [1; 32]), None).unwrap()),
        (
            KeySet::with_prfs((g(1), s, [4; 32]), Some((g(0), h, [7; 32]))).unwrap(),
            KeySet::with_prfs((g(1), h, [4; 32]), Some((g(0), h, [7; 32]))).unwrap(),
        ),
        (
            KeySet::with_prfs((g(1), s, [4; 32]), Some((g(0), h, [7; 32]))).unwrap(),
            KeySet::with_prfs((g(1), s, [4; 32]), Some((g(0), s, [7; 32]))).unwrap(),
        ),
        (
            KeySet::with_prfs((g(2), h, [8; 32]), Some((g(1), s, [9; 32]))).unwrap(),
            KeySet::with_prfs((g(2), s, [8; 32]), Some((g(1), h, [9; 32]))).unwrap(),
        ),
    ];
    for (a, b) in &twins {
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut c = DecodeCache::new(16);
        let mut differ = 0;
        for gen in a.live_generations() {
            for id in 0..50u16 {
                let rand = [id as u8, 1, 2, 3, 4, 5, 6, (id >> 8) as u8, gen.get(), 9];
                let cid = a.encode_with(gen, ServerId(id), &rand).unwrap();
                differ += usize::from(a.decode(&cid) != b.decode(&cid));
                for ks in [a, b, a, a, b, b, a] {
                    assert_eq!(c.decode(ks, &cid), ks.decode(&cid), "{gen:?} id {id} under {ks:?}");
                }
            }
        }
        assert!(differ >= 40, "the twins decode alike too often: {differ}");
        assert!(c.hits() > 0);
    }
}

/// Seeded long run: many rotations, a default-size cache, repeat-heavy traffic.
#[test]
fn long_seeded_run_hits_and_matches() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let ops = prop::collection::vec(op(), 20_000).new_tree(&mut runner).unwrap().current();
    // Key changes every few hundred CIDs rather than every few: long-lived entries.
    let mut changes = 0;
    let ops: Vec<Op> = ops
        .into_iter()
        .filter(|o| {
            !matches!(o, Op::Keys(_) | Op::Rotate(..)) || {
                changes += 1;
                changes % 32 == 0
            }
        })
        .collect();
    let (hits, misses) = run(&ops, 4096);
    assert!(hits > 2_000 && misses > 1_000, "hits {hits} misses {misses}");
}
