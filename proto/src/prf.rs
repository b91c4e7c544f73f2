//! The PRF of a key generation (ADR 0004): what turns a CID's bytes 0..=8 into the
//! two bytes that mask its server id.
//!
//! - `hmac-sha256` (wire code 0): `HMAC-SHA-256(secret, cid[0..9])[0..2]`, ADR 0001.
//! - `siphash-2-4` (wire code 1): `h = SipHash-2-4(k0, k1, cid[0..9])` with
//!   `(k0, k1) =` [`siphash_key`]`(secret)`; mask `= [h as u8, (h >> 8) as u8]`, the
//!   first two bytes of the reference implementation's little-endian output. The kernel
//!   fast path (SK_REUSEPORT eBPF) computes this one; it cannot run HMAC-SHA-256.
//!
//! Either way the server id is `u16::from_be_bytes([cid[9] ^ mask[0], cid[10] ^ mask[1]])`.

use hmac::digest::core_api::{Buffer, FixedOutputCore, UpdateCore};
use hmac::digest::KeyInit;
use hmac::{Hmac, HmacCore, Mac};
use sha2::Sha256;
use std::hash::Hasher;

/// The PRF a key generation masks server ids with (ADR 0004).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prf {
    /// HMAC-SHA-256, truncated to two bytes (ADR 0001). Wire code 0.
    HmacSha256,
    /// SipHash-2-4 under a key derived from the secret ([`siphash_key`]). Wire code 1.
    SipHash24,
}

impl Prf {
    /// Every PRF, in wire-code order.
    pub const ALL: [Prf; 2] = [Prf::HmacSha256, Prf::SipHash24];

    /// The name in key files and logs: `hmac-sha256` or `siphash-2-4`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Prf::HmacSha256 => "hmac-sha256",
            Prf::SipHash24 => "siphash-2-4",
        }
    }

    /// The one-byte code in the wire encoding of `Keys` (docs/wire.md).
    pub const fn code(self) -> u8 {
        match self {
            Prf::HmacSha256 => 0,
            Prf::SipHash24 => 1,
        }
    }

    /// The PRF with wire code `c`; `None` for codes this version does not know.
    pub const fn from_code(c: u8) -> Option<Prf> {
        match c {
            0 => Some(Prf::HmacSha256),
            1 => Some(Prf::SipHash24),
            _ => None,
        }
    }
}

impl std::fmt::Display for Prf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A PRF name that is neither `hmac-sha256` nor `siphash-2-4`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPrf(pub String);

impl std::fmt::Display for UnknownPrf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown PRF '{}' (expected 'hmac-sha256' or 'siphash-2-4')", self.0)
    }
}
impl std::error::Error for UnknownPrf {}

impl std::str::FromStr for Prf {
    type Err = UnknownPrf;
    /// Exact, case-sensitive names only.
    fn from_str(s: &str) -> Result<Prf, UnknownPrf> {
        Prf::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| UnknownPrf(s.to_owned()))
    }
}

/// The HMAC message that derives a generation's SipHash key from its secret (ADR 0004).
pub const SIPHASH_KEY_LABEL: &[u8] = b"quicdemux cid prf siphash-2-4 v1";

/// The SipHash-2-4 key of a generation (ADR 0004): `t = HMAC-SHA-256(key = secret,
/// message = "quicdemux cid prf siphash-2-4 v1")`, `k0 = u64::from_le_bytes(t[0..8])`,
/// `k1 = u64::from_le_bytes(t[8..16])`. The data plane writes `[k0, k1]` into the
/// eBPF map.
pub fn siphash_key(secret: &[u8; 32]) -> [u64; 2] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(SIPHASH_KEY_LABEL);
    let t = mac.finalize().into_bytes();
    let mut k0 = [0u8; 8];
    let mut k1 = [0u8; 8];
    k0.copy_from_slice(&t[0..8]);
    k1.copy_from_slice(&t[8..16]);
    [u64::from_le_bytes(k0), u64::from_le_bytes(k1)]
}

/// A generation's SipHash-2-4 key (ADR 0004 Decision 2): what the kernel fast path's
/// map holds for a live `siphash-2-4` generation ([`crate::KeySet::siphash_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SipHashKey {
    pub k0: u64,
    pub k1: u64,
}

impl From<[u64; 2]> for SipHashKey {
    fn from([k0, k1]: [u64; 2]) -> SipHashKey {
        SipHashKey { k0, k1 }
    }
}

/// SipHash-2-4 of `msg` under `(k0, k1)` as the SipHash paper defines it (§2), the
/// 64-bit value whose little-endian bytes the reference implementation outputs.
#[inline]
pub fn siphash24(key: [u64; 2], msg: &[u8]) -> u64 {
    let mut h = siphasher::sip::SipHasher24::new_with_keys(key[0], key[1]);
    h.write(msg);
    h.finish()
}

/// A generation's PRF with its key prepared once (the hot path never derives keys):
/// for HMAC-SHA-256 the `hmac` crate's `HmacCore`, which holds the chaining values
/// after the key's two pad blocks, so a mask costs two SHA-256 compressions.
#[derive(Clone)]
pub(crate) enum PreparedPrf {
    Hmac(HmacCore<Sha256>),
    SipHash([u64; 2]),
}

impl PreparedPrf {
    pub(crate) fn new(prf: Prf, secret: &[u8; 32]) -> PreparedPrf {
        match prf {
            Prf::HmacSha256 => {
                PreparedPrf::Hmac(HmacCore::new_from_slice(secret).expect("HMAC takes a key of any length"))
            }
            Prf::SipHash24 => PreparedPrf::SipHash(siphash_key(secret)),
        }
    }

    /// The two server-id mask bytes for `prefix` = CID bytes 0..=8.
    #[inline]
    pub(crate) fn mask(&self, prefix: &[u8]) -> [u8; 2] {
        match self {
            // ADR 0001: the first two bytes of the tag.
            PreparedPrf::Hmac(key) => {
                let t = hmac_sha256(key, prefix);
                [t[0], t[1]]
            }
            // ADR 0004: the low two bytes of h, i.e. the first two output bytes.
            PreparedPrf::SipHash(key) => {
                let h = siphash24(*key, prefix);
                [h as u8, (h >> 8) as u8]
            }
        }
    }
}

/// RFC 2104 §2 HMAC-SHA-256 of `text` under a prepared key, through `digest`'s core
/// API: the `HmacCore` copied and finished over one block buffer. The `Mac` wrapper
/// (`Hmac<Sha256>`: clone, update, finalize) costs about a quarter more on a 9-byte
/// CID prefix (proto/benches/crypto_crates.rs, `crypto_ab/cid_decode`).
#[inline]
fn hmac_sha256(key: &HmacCore<Sha256>, text: &[u8]) -> [u8; 32] {
    let mut core = key.clone();
    let mut buffer = Buffer::<HmacCore<Sha256>>::default();
    buffer.digest_blocks(text, |blocks| core.update_blocks(blocks));
    let mut tag = Default::default();
    core.finalize_fixed_core(&mut buffer, &mut tag);
    tag.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    // The slow, obviously right model of the HMAC PRF (what the key set used before
    // the hand-written HMAC and the `hmac` crate).
    use aws_lc_rs::hmac;
    use proptest::prelude::*;

    proptest! {
        /// ADR 0001's mask under any secret, for any CID prefix: the first two bytes
        /// of aws-lc-rs's HMAC-SHA-256.
        #[test]
        fn hmac_mask_is_the_model(secret in any::<[u8; 32]>(), prefix in any::<[u8; 9]>()) {
            let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &secret), &prefix);
            prop_assert_eq!(PreparedPrf::new(Prf::HmacSha256, &secret).mask(&prefix), [tag.as_ref()[0], tag.as_ref()[1]]);
        }

        /// The whole tag of `hmac_sha256` for texts around the block and padding
        /// boundaries (55, 56, 64, 128 bytes): aws-lc-rs's.
        #[test]
        fn hmac_sha256_is_the_model(secret in any::<[u8; 32]>(), text in proptest::collection::vec(any::<u8>(), 0..=200)) {
            let want = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &secret), &text);
            let key = HmacCore::<Sha256>::new_from_slice(&secret).unwrap();
            prop_assert_eq!(&hmac_sha256(&key, &text)[..], want.as_ref());
        }
    }

    /// The 64 SipHash-2-4 outputs of the reference `vectors.h` (veorq/SipHash,
    /// `vectors_sip64`), read as little-endian u64: key = 00 01 .. 0f, message =
    /// 00 01 .. (n-1) for n = 0..=63.
    #[rustfmt::skip]
    const REFERENCE: [u64; 64] = [
        0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
        0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
        0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
        0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
        0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
        0xbed65cf21aa2ee98, 0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
        0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3, 0x2f2e6163076bcfad,
        0xde4daaaca71dc9a5, 0xa6a2506687956571, 0xad87a3535c49ef28, 0x32d892fad841c342,
        0x7127512f72f27cce, 0xa7f32346f95978e3, 0x12e0b01abb051238, 0x15e034d40fa197ae,
        0x314dffbe0815a3b4, 0x027990f029623981, 0xcadcd4e59ef40c4d, 0x9abfd8766a33735c,
        0x0e3ea96b5304a7d0, 0xad0c42d6fc585992, 0x187306c89bc215a9, 0xd4a60abcf3792b95,
        0xf935451de4f21df2, 0xa9538f0419755787, 0xdb9acddff56ca510, 0xd06c98cd5c0975eb,
        0xe612a3cb9ecba951, 0xc766e62cfcadaf96, 0xee64435a9752fe72, 0xa192d576b245165a,
        0x0a8787bf8ecb74b2, 0x81b3e73d20b49b6f, 0x7fa8220ba3b2ecea, 0x245731c13ca42499,
        0xb78dbfaf3a8d83bd, 0xea1ad565322a1a0b, 0x60e61c23a3795013, 0x6606d7e446282b93,
        0x6ca4ecb15c5f91e1, 0x9f626da15c9625f3, 0xe51b38608ef25f57, 0x958a324ceb064572,
    ];

    fn reference_key() -> [u64; 2] {
        let k: Vec<u8> = (0u8..16).collect();
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        lo.copy_from_slice(&k[..8]);
        hi.copy_from_slice(&k[8..]);
        [u64::from_le_bytes(lo), u64::from_le_bytes(hi)]
    }

    #[test]
    fn siphash24_matches_the_reference_vectors() {
        let key = reference_key();
        let msg: Vec<u8> = (0u8..64).collect();
        for (n, want) in REFERENCE.iter().enumerate() {
            assert_eq!(siphash24(key, &msg[..n]), *want, "n = {n}");
        }
        // SipHash paper, Appendix A: the 15-byte example.
        assert_eq!(siphash24(key, &msg[..15]), 0xa129ca6149be45e5);
        // The CID input length (9 bytes), spelled out.
        assert_eq!(siphash24(key, &[0, 1, 2, 3, 4, 5, 6, 7, 8]), 0x9e0082df0ba9e4b0);
    }

    /// One whole known answer, secret → (k0, k1) → mask, computed outside Rust (an
    /// independent Python SipHash-2-4 checked against the 64 reference vectors, and
    /// Python's hmac) so that another implementation (the eBPF C) can check itself too.
    /// Secret 00 01 .. 1f; CID prefix 6a 01 02 .. 08 (generation 1).
    #[test]
    fn known_answer_for_key_derivation_and_mask() {
        let secret: [u8; 32] = core::array::from_fn(|i| i as u8);
        let key = siphash_key(&secret);
        assert_eq!(key, [0xdbeff3a130337d30, 0x098d192ac9064a42]);
        let prefix = [0x6a, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(siphash24(key, &prefix), 0xa64763028e338232);
        assert_eq!(PreparedPrf::new(Prf::SipHash24, &secret).mask(&prefix), [0x32, 0x82]);
    }

    #[test]
    fn siphash_key_is_the_labelled_hmac() {
        let secret = [0x5a; 32];
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &secret), b"quicdemux cid prf siphash-2-4 v1");
        let t = tag.as_ref();
        let le = |b: &[u8]| b.iter().rev().fold(0u64, |acc, &x| acc << 8 | u64::from(x));
        assert_eq!(siphash_key(&secret), [le(&t[0..8]), le(&t[8..16])]);
        assert_ne!(siphash_key(&secret), siphash_key(&[0x5b; 32]));
    }

    #[test]
    fn names_and_codes() {
        for p in Prf::ALL {
            assert_eq!(p.as_str().parse::<Prf>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
            assert_eq!(Prf::from_code(p.code()), Some(p));
        }
        assert_eq!(Prf::HmacSha256.as_str(), "hmac-sha256");
        assert_eq!(Prf::SipHash24.as_str(), "siphash-2-4");
        assert_eq!((Prf::HmacSha256.code(), Prf::SipHash24.code()), (0, 1));
        assert_eq!(Prf::from_code(2), None);
        assert_eq!(Prf::from_code(0xff), None);
        for bad in ["", "siphash", "SipHash-2-4", "hmac-sha256 ", "siphash24", "hmac"] {
            let e = bad.parse::<Prf>().unwrap_err();
            assert_eq!(e, UnknownPrf(bad.to_owned()));
            assert!(e.to_string().contains("siphash-2-4"), "{e}");
        }
    }
}
