//! ADR 0001 connection IDs: round trips, unroutable reasons, and unlinkability, under
//! both PRFs of ADR 0004 (hmac-sha256, siphash-2-4) and key sets that mix them.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::refprf::ref_mask;
use common::rng::Rng;
use proptest::prelude::*;
use proto::cid::{Decoded, Generation, KeySet, Prf, ServerId, Unroutable, CID_LEN, CID_RANDOM_LEN, KEY_LEN};

fn gen(g: u8) -> Generation {
    Generation::new(g).unwrap()
}

fn prf() -> impl Strategy<Value = Prf> {
    prop::sample::select(Prf::ALL.to_vec())
}

/// A key set whose newest generation is `g` with PRF `prfs[0]`, with `prev` (≠ g)
/// still live with PRF `prfs[1]`.
fn keyset(g: u8, prev: Option<u8>, seed: u64, prfs: [Prf; 2]) -> KeySet {
    let mut r = Rng::new(seed);
    let newest = (gen(g), prfs[0], r.array::<KEY_LEN>());
    let previous = prev.map(|p| (gen(p), prfs[1], r.array::<KEY_LEN>()));
    KeySet::with_prfs(newest, previous).unwrap()
}

/// Both PRFs alone, and both mixed pairs (newest, previous).
const PRF_PAIRS: [[Prf; 2]; 4] = [
    [Prf::HmacSha256, Prf::HmacSha256],
    [Prf::SipHash24, Prf::SipHash24],
    [Prf::SipHash24, Prf::HmacSha256],
    [Prf::HmacSha256, Prf::SipHash24],
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// encode → decode gives back the generation and the server id, for every
    /// generation, with or without a previous generation live, for any randomness.
    #[test]
    fn round_trip_every_generation(
        g in 0u8..3,
        prev_off in prop::option::of(1u8..3),
        id in any::<u16>(),
        rand in any::<[u8; CID_RANDOM_LEN]>(),
        seed in any::<u64>(),
        prfs in [prf(), prf()],
    ) {
        let prev = prev_off.map(|o| (g + o) % 3);
        let ks = keyset(g, prev, seed, prfs);
        prop_assert_eq!(ks.prf(gen(g)), Some(prfs[0]));
        prop_assert_eq!(ks.live_generations().count(), 1 + usize::from(prev.is_some()));
        let cid = ks.encode(ServerId(id), &rand);
        prop_assert_eq!(cid.len(), CID_LEN);
        // ADR 0001 layout: cr | 6 random bits, nonce, masked id, random byte.
        prop_assert_eq!(cid[0] >> 6, g);
        prop_assert_eq!(cid[0] & 0x3f, rand[0] & 0x3f);
        prop_assert_eq!(&cid[1..9], &rand[1..9]);
        prop_assert_eq!(cid[11], rand[9]);
        // ADR 0001 PRF, recomputed independently: bytes 9..=10 = id XOR
        // PRF(key[cr], bytes 0..=8)[0..2], the generation's own PRF (ADR 0004).
        let secret = ks.secret(gen(g)).unwrap();
        let m = ref_mask(prfs[0], secret, &cid[..9]);
        let id_be = id.to_be_bytes();
        prop_assert_eq!([cid[9] ^ m[0], cid[10] ^ m[1]], id_be);
        prop_assert_eq!(ks.decode(&cid), Ok(Decoded { generation: gen(g), server_id: ServerId(id) }));
        // The previous generation encodes and decodes too (rotation, ADR 0001), with
        // its own PRF.
        if let Some(p) = prev {
            let old = ks.encode_with(gen(p), ServerId(id), &rand).unwrap();
            prop_assert_eq!(old[0] >> 6, p);
            prop_assert_eq!(ks.prf(gen(p)), Some(prfs[1]));
            let m = ref_mask(prfs[1], ks.secret(gen(p)).unwrap(), &old[..9]);
            prop_assert_eq!([old[9] ^ m[0], old[10] ^ m[1]], id_be);
            prop_assert_eq!(ks.decode(&old), Ok(Decoded { generation: gen(p), server_id: ServerId(id) }));
        }
        // The third generation is not live: neither encodes nor decodes.
        let dead = (0..3).find(|&x| x != g && Some(x) != prev).unwrap();
        prop_assert!(ks.encode_with(gen(dead), ServerId(id), &rand).is_none());
        let mut forged = cid;
        forged[0] = (dead << 6) | (forged[0] & 0x3f);
        prop_assert_eq!(ks.decode(&forged), Err(Unroutable::UnknownGeneration(dead)));
    }

    /// A key set rotated forward keeps decoding what the previous newest minted.
    #[test]
    fn rotation_round_trip(
        g in 0u8..3,
        id in any::<u16>(),
        rand in any::<[u8; CID_RANDOM_LEN]>(),
        fresh in any::<[u8; 32]>(),
        prfs in [prf(), prf()],
    ) {
        let ks = keyset(g, None, 7, prfs);
        let cid = ks.encode(ServerId(id), &rand);
        let r = ks.rotated_with(fresh, prfs[1]);
        prop_assert_eq!(r.newest(), gen((g + 1) % 3));
        prop_assert_eq!((r.prf(r.newest()), r.prf(gen(g))), (Some(prfs[1]), Some(prfs[0])));
        // The new generation masks with the PRF it was given, not the old newest's.
        let new = r.encode(ServerId(id), &rand);
        let m = ref_mask(prfs[1], &fresh, &new[..9]);
        prop_assert_eq!([new[9] ^ m[0], new[10] ^ m[1]], id.to_be_bytes());
        prop_assert_eq!(r.decode(&cid), Ok(Decoded { generation: gen(g), server_id: ServerId(id) }));
        let new = r.encode(ServerId(id), &rand);
        prop_assert_eq!(r.decode(&new), Ok(Decoded { generation: gen((g + 1) % 3), server_id: ServerId(id) }));
        // Two rotations later the original generation is gone.
        let rr = r.rotated([0x55; 32]);
        prop_assert_eq!(rr.decode(&cid), Err(Unroutable::UnknownGeneration(g)));
    }

    /// Any 12 bytes with a live `cr` decode to some id (no integrity, ADR 0001), and
    /// re-encoding that id with the same randomness gives the same 12 bytes back.
    #[test]
    fn decode_then_encode_is_identity(cid in any::<[u8; CID_LEN]>(), g in 0u8..3, p in prf()) {
        let mut cid = cid;
        cid[0] = (g << 6) | (cid[0] & 0x3f);
        let ks = keyset(g, None, 11, [p, p]);
        let d = ks.decode(&cid).unwrap();
        let mut rand = [0u8; CID_RANDOM_LEN];
        rand[0] = cid[0] & 0x3f;
        rand[1..9].copy_from_slice(&cid[1..9]);
        rand[9] = cid[11];
        prop_assert_eq!(ks.encode(d.server_id, &rand), cid);
    }
}

#[test]
fn unroutable_reasons() {
    let ks = keyset(1, Some(0), 3, [Prf::SipHash24, Prf::HmacSha256]);
    // cr = 3: marked unroutable, whatever the rest (ADR 0001).
    let mut r = Rng::new(1);
    for _ in 0..1000 {
        let mut cid = r.array::<CID_LEN>();
        cid[0] |= 0xc0;
        assert_eq!(ks.decode(&cid), Err(Unroutable::Marked));
    }
    // Generation 2 is not held by this set.
    let mut cid = r.array::<CID_LEN>();
    cid[0] = 0x80 | (cid[0] & 0x3f);
    assert_eq!(ks.decode(&cid), Err(Unroutable::UnknownGeneration(2)));
    // Every length but 12 is refused, whatever the bytes (RFC 9000 allows 0..=20).
    for len in (0..=40).filter(|&l| l != CID_LEN) {
        let mut b = r.bytes(len);
        if let Some(f) = b.first_mut() {
            *f &= 0x3f; // generation 0: would decode if the length were right
        }
        assert_eq!(ks.decode(&b), Err(Unroutable::WrongLength), "len {len}");
    }
    let mut twelve = r.array::<CID_LEN>();
    twelve[0] &= 0x3f;
    assert!(ks.decode(&twelve).is_ok());
    assert_eq!(Generation::new(3), None);
    assert_eq!(Generation::new(255), None);
    assert_eq!(gen(2).next(), gen(0));
}

#[test]
fn different_keys_give_different_masks() {
    // The same randomness and id under two keys of one generation: the masked bytes
    // differ (with probability 1 - 2^-16 per CID; 64 CIDs with fixed seeds). Also one
    // secret under the two PRFs (ADR 0004): as different as two keys.
    let h = Prf::HmacSha256;
    let s = Prf::SipHash24;
    for (a, b) in [
        (keyset(0, None, 100, [h, h]), keyset(0, None, 200, [h, h])),
        (keyset(0, None, 100, [s, s]), keyset(0, None, 200, [s, s])),
        (keyset(0, None, 100, [h, h]), keyset(0, None, 100, [s, s])),
    ] {
        let mut r = Rng::new(5);
        let same = (0..64)
            .filter(|_| {
                let rand = r.array::<CID_RANDOM_LEN>();
                a.encode(ServerId(42), &rand)[9..11] == b.encode(ServerId(42), &rand)[9..11]
            })
            .count();
        assert!(same <= 1, "{same} of 64 masks equal under {a:?} / {b:?}");
        // …and decoding under the wrong key does not give the id back.
        let rand = r.array::<CID_RANDOM_LEN>();
        let cid = a.encode(ServerId(42), &rand);
        assert_ne!(b.decode(&cid).map(|d| d.server_id), Ok(ServerId(42)));
    }
}

/// Pearson's chi-square statistic of `counts` against the uniform distribution.
fn chi_square(counts: &[u64; 256]) -> f64 {
    let n: u64 = counts.iter().sum();
    let e = n as f64 / 256.0;
    counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum()
}

/// Unlinkability (ADR 0001 "PRF"): bytes 9 and 10 of many CIDs of ONE server id are
/// uniform, so they say nothing about the id.
///
/// 65 536 CIDs, 256 cells of expected count 256: the statistic has 255 degrees of
/// freedom, mean 255 and standard deviation √510 ≈ 22.6. The threshold 400 is
/// ≈ 5.5 σ above the mean by the Wilson–Hilferty approximation (p ≈ 2·10⁻⁸ for a
/// correct PRF). Without the mask the byte is constant and the statistic is
/// 65 536 × 255 ≈ 1.7·10⁷; a mask that ignored the nonce (constant per key) gives the
/// same. The seeds are fixed, so the test is deterministic.
#[test]
fn masked_bytes_are_uniform_for_one_server_id() {
    const N: usize = 65_536;
    const THRESHOLD: f64 = 400.0;
    for ((seed, id), prfs) in [(0xada0_0040u64, 0u16), (0x5eed, 0x1234), (0xfeed, 0xffff)]
        .into_iter()
        .flat_map(|c| PRF_PAIRS[..2].iter().map(move |p| (c, *p)))
    {
        let ks = keyset(1, Some(0), seed, prfs);
        let mut r = Rng::new(seed ^ 0x9e37);
        let mut b9 = [0u64; 256];
        let mut b10 = [0u64; 256];
        let mut pairs = std::collections::HashSet::new();
        for _ in 0..N {
            let cid = ks.encode(ServerId(id), &r.array::<CID_RANDOM_LEN>());
            b9[cid[9] as usize] += 1;
            b10[cid[10] as usize] += 1;
            pairs.insert([cid[9], cid[10]]);
        }
        let (c9, c10) = (chi_square(&b9), chi_square(&b10));
        assert!(c9 < THRESHOLD, "byte 9 not uniform for id {id}, {}: chi² = {c9:.1}", prfs[0]);
        assert!(c10 < THRESHOLD, "byte 10 not uniform for id {id}, {}: chi² = {c10:.1}", prfs[0]);
        // 65 536 draws from 65 536 values: ≈ 1 − 1/e ≈ 63 % distinct if uniform.
        assert!(pairs.len() > 40_000, "only {} distinct (byte 9, byte 10) pairs", pairs.len());
    }
}

/// The same property seen by an observer comparing two instances: the distributions of
/// bytes 9..10 for two server ids are indistinguishable (both uniform).
#[test]
fn two_server_ids_look_alike() {
    for prfs in PRF_PAIRS {
        let ks = keyset(2, None, 99, prfs);
        let mut r = Rng::new(4);
        let mut diff = [0u64; 256];
        for _ in 0..32_768 {
            let a = ks.encode(ServerId(1), &r.array::<CID_RANDOM_LEN>());
            let b = ks.encode(ServerId(2), &r.array::<CID_RANDOM_LEN>());
            diff[(a[9] ^ b[9]) as usize] += 1;
        }
        assert!(chi_square(&diff) < 400.0, "{}", prfs[0]);
    }
}

/// Unlinkability across a PRF switch (ADR 0004): in a key set whose newest generation
/// is SipHash-2-4 and whose previous is HMAC-SHA-256 (and the reverse), the masked
/// bytes of one server id are uniform under each generation.
#[test]
fn masked_bytes_are_uniform_in_mixed_key_sets() {
    for prfs in &PRF_PAIRS[2..] {
        let ks = keyset(1, Some(0), 0x0004, *prfs);
        let mut r = Rng::new(0x4004);
        for g in [gen(1), gen(0)] {
            let mut b10 = [0u64; 256];
            for _ in 0..65_536 {
                let cid = ks.encode_with(g, ServerId(0x0a0b), &r.array::<CID_RANDOM_LEN>()).unwrap();
                b10[cid[10] as usize] += 1;
            }
            let c = chi_square(&b10);
            assert!(c < 400.0, "generation {g:?} ({:?}): chi² = {c:.1}", ks.prf(g));
        }
    }
}
