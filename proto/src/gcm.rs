//! AES-GCM (NIST SP 800-38D) with 96-bit IVs only, for the Retry path: the Retry
//! token's AES-256-GCM under a fresh key per token (proto::token) and the Retry
//! integrity tag's AES-128-GCM under a fixed key (proto::retry, RFC 9001 §5.8).
//!
//! Built on the `aes` crate's encryption-only key schedules (AES-NI chosen at run
//! time) and the `ghash` crate (PCLMULQDQ chosen at run time). For the ~40-byte
//! messages of the Retry path this is cheaper than aws-lc-rs, which sets up an EVP
//! context and a table of powers of H for every key: here a one-shot seal or open
//! is one key expansion and one batch of AES blocks — H = E_K(0^128), E_K(J0) and
//! the first key-stream blocks together — and GHASH over a few blocks.
//!
//! The aws-lc-rs AES-GCM is the model in the tests (proptests over keys, IVs, AAD
//! and plaintexts), with the McGrew–Viega test cases of the GCM specification.

use aes09::cipher::consts::U16;
use aes09::cipher::{BlockCipherEncrypt, BlockSizeUser, KeyInit};
use aes09::{Aes128Enc, Aes256Enc, Block};
use ghash::universal_hash::UniversalHash;
use ghash::GHash;

/// Length of the authentication tag: the full 128 bits (NIST SP 800-38D §5.2.1.2).
pub const TAG_LEN: usize = 16;
/// Length of the IV: only 96-bit IVs (NIST SP 800-38D §8.2 recommends them; J0 is
/// then IV ‖ 0^31 ‖ 1, §7.1 step 2).
pub const IV_LEN: usize = 12;
/// Blocks handed to the cipher at once (AES-NI pipelines them).
const BATCH: usize = 8;
/// NIST SP 800-38D §5.2.1.1: len(P) ≤ 2^39 − 256 bits, i.e. 2^32 − 2 blocks: the
/// 32-bit counter of inc32 never wraps back to J0.
const MAX_TEXT: u64 = (1 << 36) - 32;

/// A failed [`open`]: the tag does not match (or the text is too long).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenError;

/// An AES-GCM key scheduled once: the block cipher's encryption schedule and GHASH
/// keyed with H = E_K(0^128) (NIST SP 800-38D §7.1 step 1), for a key used many
/// times (the fixed Retry integrity keys).
#[derive(Clone)]
pub struct GcmKey<C> {
    cipher: C,
    ghash: GHash,
}

impl<C> std::fmt::Debug for GcmKey<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GcmKey(..)")
    }
}

/// AES-128-GCM under a pre-expanded key.
pub type Aes128GcmKey = GcmKey<Aes128Enc>;
/// AES-256-GCM under a pre-expanded key.
pub type Aes256GcmKey = GcmKey<Aes256Enc>;

impl GcmKey<Aes128Enc> {
    pub fn new(key: &[u8; 16]) -> Self {
        Self::from_cipher(Aes128Enc::new(&(*key).into()))
    }
}

impl GcmKey<Aes256Enc> {
    pub fn new(key: &[u8; 32]) -> Self {
        Self::from_cipher(Aes256Enc::new(&(*key).into()))
    }
}

impl<C: BlockCipherEncrypt + BlockSizeUser<BlockSize = U16>> GcmKey<C> {
    fn from_cipher(cipher: C) -> Self {
        // NIST SP 800-38D §7.1 step 1: H = CIPH_K(0^128).
        let mut h = Block::default();
        cipher.encrypt_block(&mut h);
        GcmKey { ghash: GHash::new(&h), cipher }
    }

    /// GCM-AE_K(IV, P, A) (NIST SP 800-38D §7.1): encrypts `in_out` in place and
    /// returns the tag. `None` only for a text longer than §5.2.1.1 allows.
    pub fn seal(&self, iv: &[u8; IV_LEN], aad: &[u8], in_out: &mut [u8]) -> Option<[u8; TAG_LEN]> {
        run(&self.cipher, Some(&self.ghash), iv, aad, in_out, None).ok()
    }

    /// GCM-AD_K(IV, C, A, T) (NIST SP 800-38D §7.2): checks `tag` (in constant time)
    /// and only then decrypts `in_out` in place; on failure `in_out` is unchanged.
    pub fn open(&self, iv: &[u8; IV_LEN], aad: &[u8], in_out: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), OpenError> {
        run(&self.cipher, Some(&self.ghash), iv, aad, in_out, Some(tag)).map(drop)
    }
}

/// GCM-AE_K(IV, ε, A) (NIST SP 800-38D §7.1 with an empty plaintext, i.e. GMAC)
/// under a fixed key and a fixed IV, as the Retry integrity tag uses them (RFC 9001
/// §5.8): E_K(J0) is then a constant, computed once, and each tag is GHASH alone.
#[derive(Clone)]
pub struct FixedIvTagKey {
    ghash: GHash,
    ek_j0: Block,
}

impl std::fmt::Debug for FixedIvTagKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FixedIvTagKey(..)")
    }
}

impl FixedIvTagKey {
    /// AES-128-GCM under `key` with the fixed `iv`.
    pub fn new_128(key: &[u8; 16], iv: &[u8; IV_LEN]) -> Self {
        let k = Aes128GcmKey::new(key);
        // §7.1 step 2: J0 = IV ‖ 0^31 ‖ 1.
        let mut ek_j0 = counter_block(iv, 1);
        k.cipher.encrypt_block(&mut ek_j0);
        FixedIvTagKey { ghash: k.ghash, ek_j0 }
    }

    /// The tag of `aad` with an empty plaintext (§7.1 steps 5–6).
    pub fn tag(&self, aad: &[u8]) -> [u8; TAG_LEN] {
        tag(&self.ghash, aad, &[], &self.ek_j0)
    }
}

/// One-shot AES-128-GCM seal (NIST SP 800-38D §7.1): as [`GcmKey::seal`].
pub fn seal_128(key: &[u8; 16], iv: &[u8; IV_LEN], aad: &[u8], in_out: &mut [u8]) -> Option<[u8; TAG_LEN]> {
    run(&Aes128Enc::new(&(*key).into()), None, iv, aad, in_out, None).ok()
}

/// One-shot AES-128-GCM open (NIST SP 800-38D §7.2): as [`GcmKey::open`].
pub fn open_128(
    key: &[u8; 16],
    iv: &[u8; IV_LEN],
    aad: &[u8],
    in_out: &mut [u8],
    tag: &[u8; TAG_LEN],
) -> Result<(), OpenError> {
    run(&Aes128Enc::new(&(*key).into()), None, iv, aad, in_out, Some(tag)).map(drop)
}

/// One-shot AES-256-GCM seal (NIST SP 800-38D §7.1): as [`GcmKey::seal`], with H
/// computed in the same batch of blocks as E_K(J0) and the key stream.
pub fn seal_256(key: &[u8; 32], iv: &[u8; IV_LEN], aad: &[u8], in_out: &mut [u8]) -> Option<[u8; TAG_LEN]> {
    run(&Aes256Enc::new(&(*key).into()), None, iv, aad, in_out, None).ok()
}

/// One-shot AES-256-GCM open (NIST SP 800-38D §7.2): as [`GcmKey::open`].
pub fn open_256(
    key: &[u8; 32],
    iv: &[u8; IV_LEN],
    aad: &[u8],
    in_out: &mut [u8],
    tag: &[u8; TAG_LEN],
) -> Result<(), OpenError> {
    run(&Aes256Enc::new(&(*key).into()), None, iv, aad, in_out, Some(tag)).map(drop)
}

/// The counter block IV ‖ [i]_32 (NIST SP 800-38D §7.1 step 2 with a 96-bit IV:
/// J0 is i = 1; inc32 adds one modulo 2^32 to the last 32 bits, §6.2).
fn counter_block(iv: &[u8; IV_LEN], i: u32) -> Block {
    let mut b = Block::default();
    b[..IV_LEN].copy_from_slice(iv);
    b[IV_LEN..].copy_from_slice(&i.to_be_bytes());
    b
}

/// GCM-AE (`expected: None`) or GCM-AD (`Some(tag)`) under `cipher`; `ghash` keyed
/// with H, or `None` to compute H in the first batch. The tag on success.
fn run<C: BlockCipherEncrypt + BlockSizeUser<BlockSize = U16>>(
    cipher: &C,
    ghash: Option<&GHash>,
    iv: &[u8; IV_LEN],
    aad: &[u8],
    in_out: &mut [u8],
    expected: Option<&[u8; TAG_LEN]>,
) -> Result<[u8; TAG_LEN], OpenError> {
    // NIST SP 800-38D §5.2.1.1: the length limits on P (and C) and A.
    if in_out.len() as u64 > MAX_TEXT || aad.len() as u64 >= 1 << 61 {
        return Err(OpenError);
    }
    // One batch: [0^128 for H (§7.1 step 1) unless given], J0 (§7.1 step 2, for the
    // tag, step 6), then the first key-stream blocks from inc32(J0) (step 3, §6.5).
    let pre = usize::from(ghash.is_none()) + 1;
    let first_len = in_out.len().div_ceil(16).min(BATCH - pre);
    let mut first = [Block::default(); BATCH];
    first[pre - 1] = counter_block(iv, 1);
    for (i, b) in first[pre..pre + first_len].iter_mut().enumerate() {
        *b = counter_block(iv, 2 + i as u32);
    }
    cipher.encrypt_blocks(&mut first[..pre + first_len]);
    let owned;
    let ghash = match ghash {
        Some(g) => g,
        None => {
            owned = GHash::new(&first[0]);
            &owned
        }
    };
    let ek_j0 = first[pre - 1];
    let key_stream = &first[pre..pre + first_len];
    match expected {
        None => {
            ctr(cipher, iv, key_stream, in_out);
            Ok(tag(ghash, aad, in_out, &ek_j0))
        }
        Some(expected) => {
            // §7.2 steps 5–8: the tag over the ciphertext first; no plaintext is
            // released unless it matches.
            let t = tag(ghash, aad, in_out, &ek_j0);
            if !ct_eq(&t, expected) {
                return Err(OpenError);
            }
            ctr(cipher, iv, key_stream, in_out);
            Ok(t)
        }
    }
}

/// GCTR_K(inc32(J0), ·) (NIST SP 800-38D §6.5) over `data` in place: `first` are
/// the already computed key-stream blocks for counters 2, 3, …; more are computed
/// in batches.
fn ctr<C: BlockCipherEncrypt + BlockSizeUser<BlockSize = U16>>(
    cipher: &C,
    iv: &[u8; IV_LEN],
    first: &[Block],
    data: &mut [u8],
) {
    let (head, rest) = data.split_at_mut((first.len() * 16).min(data.len()));
    for (c, k) in head.chunks_mut(16).zip(first) {
        xor(c, k);
    }
    let mut next = 2u32.wrapping_add(first.len() as u32);
    for chunk in rest.chunks_mut(16 * BATCH) {
        let n = chunk.len().div_ceil(16);
        let mut ks = [Block::default(); BATCH];
        for (i, b) in ks[..n].iter_mut().enumerate() {
            *b = counter_block(iv, next.wrapping_add(i as u32));
        }
        cipher.encrypt_blocks(&mut ks[..n]);
        for (c, k) in chunk.chunks_mut(16).zip(&ks) {
            xor(c, k);
        }
        next = next.wrapping_add(n as u32);
    }
}

/// T = MSB_128(GCTR_K(J0, S)) = E_K(J0) ⊕ S with S = GHASH_H(A ‖ 0^v ‖ C ‖ 0^u ‖
/// [len(A)]_64 ‖ [len(C)]_64) (NIST SP 800-38D §7.1 steps 5–6, §6.4).
fn tag(ghash: &GHash, aad: &[u8], ct: &[u8], ek_j0: &Block) -> [u8; TAG_LEN] {
    let mut g = ghash.clone();
    g.update_padded(aad);
    g.update_padded(ct);
    let mut lengths = Block::default();
    lengths[..8].copy_from_slice(&(aad.len() as u64 * 8).to_be_bytes());
    lengths[8..].copy_from_slice(&(ct.len() as u64 * 8).to_be_bytes());
    g.update(&[lengths]);
    let mut t: [u8; TAG_LEN] = g.finalize().into();
    xor(&mut t, ek_j0);
    t
}

fn xor(out: &mut [u8], k: &[u8]) {
    for (o, k) in out.iter_mut().zip(k) {
        *o ^= k;
    }
}

/// Tag comparison without an early exit (NIST SP 800-38D §7.2 step 8; the time does
/// not tell how many leading bytes matched).
fn ct_eq(a: &[u8; TAG_LEN], b: &[u8; TAG_LEN]) -> bool {
    let d = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(d) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The model: aws-lc-rs AES-GCM (key length picks AES-128 or AES-256).
    fn model_seal(key: &[u8], iv: &[u8; 12], aad: &[u8], in_out: &mut [u8]) -> [u8; 16] {
        let alg = if key.len() == 16 { &AES_128_GCM } else { &AES_256_GCM };
        let k = LessSafeKey::new(UnboundKey::new(alg, key).unwrap());
        let t = k.seal_in_place_separate_tag(Nonce::assume_unique_for_key(*iv), Aad::from(aad), in_out).unwrap();
        t.as_ref().try_into().unwrap()
    }

    /// Seals with every implementation here for `key`, checks they agree, and
    /// opens the result again with each; the ciphertext and tag.
    fn seal_all(key: &[u8], iv: &[u8; 12], aad: &[u8], plain: &[u8]) -> (Vec<u8>, [u8; 16]) {
        let (mut a, mut b) = (plain.to_vec(), plain.to_vec());
        let (ta, tb) = match key.len() {
            16 => {
                let k: &[u8; 16] = key.try_into().unwrap();
                (seal_128(k, iv, aad, &mut a).unwrap(), Aes128GcmKey::new(k).seal(iv, aad, &mut b).unwrap())
            }
            _ => {
                let k: &[u8; 32] = key.try_into().unwrap();
                (seal_256(k, iv, aad, &mut a).unwrap(), Aes256GcmKey::new(k).seal(iv, aad, &mut b).unwrap())
            }
        };
        assert_eq!((&a, ta), (&b, tb), "one-shot and pre-expanded key agree");
        if let (Ok(k), true) = (<&[u8; 16]>::try_from(key), plain.is_empty()) {
            assert_eq!(FixedIvTagKey::new_128(k, iv).tag(aad), ta, "the fixed-IV tag agrees");
        }
        assert_eq!(open_all(key, iv, aad, &a, &ta), Some(plain.to_vec()));
        (a, ta)
    }

    /// Opens with every implementation; `None` if all reject (they must agree, and
    /// leave the text unchanged when they do).
    fn open_all(key: &[u8], iv: &[u8; 12], aad: &[u8], ct: &[u8], tag: &[u8; 16]) -> Option<Vec<u8>> {
        let (mut a, mut b) = (ct.to_vec(), ct.to_vec());
        let (ra, rb) = match key.len() {
            16 => {
                let k: &[u8; 16] = key.try_into().unwrap();
                (open_128(k, iv, aad, &mut a, tag), Aes128GcmKey::new(k).open(iv, aad, &mut b, tag))
            }
            _ => {
                let k: &[u8; 32] = key.try_into().unwrap();
                (open_256(k, iv, aad, &mut a, tag), Aes256GcmKey::new(k).open(iv, aad, &mut b, tag))
            }
        };
        assert_eq!((ra, &a), (rb, &b));
        if ra.is_err() {
            assert_eq!(a, ct, "a failed open leaves the ciphertext");
        }
        ra.ok().map(|()| a)
    }

    /// McGrew and Viega, "The Galois/Counter Mode of Operation (GCM)", Appendix B
    /// test cases 1–4 (AES-128) and 13–16 (AES-256): the NIST GCM test vectors.
    #[test]
    fn gcm_spec_test_cases() {
        let k3 = "feffe9928665731c6d6a8f9467308308";
        let p3 = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                  1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
        let p4 = &p3[..120];
        let iv3 = "cafebabefacedbaddecaf888";
        let a4 = "feedfacedeadbeeffeedfacedeadbeefabaddad2";
        let cases: [(&str, &str, &str, &str, &str, &str, &str); 8] = [
            (
                "1",
                "00000000000000000000000000000000",
                "",
                "000000000000000000000000",
                "",
                "",
                "58e2fccefa7e3061367f1d57a4e7455a",
            ),
            (
                "2",
                "00000000000000000000000000000000",
                "00000000000000000000000000000000",
                "000000000000000000000000",
                "",
                "0388dace60b6a392f328c2b971b2fe78",
                "ab6e47d42cec13bdf53a67b21257bddf",
            ),
            (
                "3",
                k3,
                p3,
                iv3,
                "",
                "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e\
                 21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091473f5985",
                "4d5c2af327cd64a62cf35abd2ba6fab4",
            ),
            (
                "4",
                k3,
                p4,
                iv3,
                a4,
                "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e\
                 21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091",
                "5bc94fbc3221a5db94fae95ae7121a47",
            ),
            (
                "13",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "",
                "000000000000000000000000",
                "",
                "",
                "530f8afbc74536b9a963b4f1c4cb738b",
            ),
            (
                "14",
                "0000000000000000000000000000000000000000000000000000000000000000",
                "00000000000000000000000000000000",
                "000000000000000000000000",
                "",
                "cea7403d4d606b6e074ec5d3baf39d18",
                "d0d1c8a799996bf0265b98b5d48ab919",
            ),
            (
                "15",
                "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
                p3,
                iv3,
                "",
                "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                 8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad",
                "b094dac5d93471bdec1a502270e3cc6c",
            ),
            (
                "16",
                "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
                p4,
                iv3,
                a4,
                "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                 8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
                "76fc6ece0f4e1768cddf8853bb2d551b",
            ),
        ];
        for (name, k, p, iv, a, c, t) in cases {
            let (k, p, a, c) = (hex(k), hex(p), hex(a), hex(c));
            let iv: [u8; 12] = hex(iv).try_into().unwrap();
            let t: [u8; 16] = hex(t).try_into().unwrap();
            let (got_c, got_t) = seal_all(&k, &iv, &a, &p);
            assert_eq!((&got_c, got_t), (&c, t), "test case {name}");
            assert_eq!(open_all(&k, &iv, &a, &c, &t), Some(p), "test case {name}");
        }
    }

    /// More than one batch of key stream (a ~256-byte token opened by token::check).
    #[test]
    fn long_texts_are_the_model() {
        for len in [0, 1, 15, 16, 17, 95, 96, 97, 111, 112, 113, 128, 129, 255, 256, 1000] {
            let p: Vec<u8> = (0..len).map(|i| i as u8).collect();
            for key in [vec![7u8; 16], vec![9u8; 32]] {
                let mut want = p.clone();
                let t = model_seal(&key, &[3; 12], b"aad", &mut want);
                assert_eq!(seal_all(&key, &[3; 12], b"aad", &p), (want, t), "len {len}");
            }
        }
    }

    fn any_key() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![proptest::collection::vec(any::<u8>(), 16), proptest::collection::vec(any::<u8>(), 32)]
    }

    proptest! {
        /// seal and open agree with aws-lc-rs AES-128-GCM and AES-256-GCM for any
        /// key, IV, AAD (0..200 bytes) and plaintext (0..200 bytes).
        #[test]
        fn seal_open_are_the_model(key in any_key(),
                                   iv in any::<[u8; 12]>(),
                                   aad in proptest::collection::vec(any::<u8>(), 0..200),
                                   plain in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut want = plain.clone();
            let want_tag = model_seal(&key, &iv, &aad, &mut want);
            prop_assert_eq!(seal_all(&key, &iv, &aad, &plain), (want, want_tag));
            // An empty plaintext (the Retry integrity tag), also via FixedIvTagKey.
            let want_tag = model_seal(&key, &iv, &aad, &mut []);
            prop_assert_eq!(seal_all(&key, &iv, &aad, &[]), (vec![], want_tag));
        }

        /// open rejects any single-bit flip of the tag, the ciphertext or the AAD.
        #[test]
        fn open_rejects_any_bit_flip(key in any_key(),
                                     iv in any::<[u8; 12]>(),
                                     aad in proptest::collection::vec(any::<u8>(), 0..200),
                                     plain in proptest::collection::vec(any::<u8>(), 0..200),
                                     bit in any::<proptest::sample::Index>()) {
            let (mut ct, mut tag) = seal_all(&key, &iv, &aad, &plain);
            let mut aad = aad;
            let bit = bit.index(8 * (16 + ct.len() + aad.len()));
            let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
            if byte < 16 {
                tag[byte] ^= mask;
            } else if byte < 16 + ct.len() {
                ct[byte - 16] ^= mask;
            } else {
                aad[byte - 16 - ct.len()] ^= mask;
            }
            prop_assert_eq!(open_all(&key, &iv, &aad, &ct, &tag), None);
        }
    }
}
