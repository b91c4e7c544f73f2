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
//! **A benchmark baseline, not product code.** This is the hand-written GCM that
//! `proto::gcm` was until the `aes-gcm` crate replaced it (docs/benchmarks.md
//! "Crypto: crates against hand-written code"), kept as the A side of
//! proto/benches/crypto_crates.rs, whose start-up checks its bytes against the
//! production minter's. Its tests (aws-lc-rs model, McGrew–Viega vectors) and its
//! tag comparison's constant-time question went with it: nothing here opens a
//! token that came from outside.

use aes::cipher::consts::U16;
use aes::cipher::{BlockCipherEncrypt, BlockSizeUser, KeyInit};
use aes::{Aes128Enc, Aes256Enc, Block};
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
