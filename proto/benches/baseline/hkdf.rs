//! HMAC-SHA-256 (RFC 2104, RFC 4231) and HKDF-SHA-256 (RFC 5869) over the bare
//! SHA-256 compression function (`sha2::compress256`, SHA-NI when the CPU has it),
//! for the short, fresh-key derivations of the Retry path (RFC 9001 §5.2's Initial
//! secrets, quinn's token key: proto::initial_protection, proto::token).
//!
//! A [`HmacSha256`] keeps the two chaining values after the key's inner and outer pad
//! blocks, so keying it costs two compressions and each tag of a message of at most
//! 55 bytes two more: an HKDF-Expand-Label of RFC 9001 §5.2 under a fresh secret is
//! four compressions, with no allocation and no context set-up.
//!
//! **A benchmark baseline, not product code.** This is the hand-written HMAC/HKDF
//! that `proto::hkdf` was until the `hmac` and `hkdf` crates replaced it
//! (docs/benchmarks.md "Crypto: crates against hand-written code"), kept as the A
//! side of proto/benches/crypto_crates.rs, whose start-up checks its output against
//! the production code's.
//!
//! Not constant-size in the length of the data (nothing here needs that); no secret
//! dependent branch or index.

use sha2::digest::generic_array::GenericArray;

/// SHA-256 block size in bytes (FIPS 180-4 §5.1.1; RFC 2104's B).
const BLOCK: usize = 64;
/// SHA-256 output size in bytes (RFC 2104's L).
pub const OUT_LEN: usize = 32;

/// FIPS 180-4 §5.3.3: the initial hash value of SHA-256.
const IV: [u32; 8] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

fn compress(state: &mut [u32; 8], block: &[u8; BLOCK]) {
    sha2::compress256(state, core::slice::from_ref(GenericArray::from_slice(block)));
}

/// SHA-256 from a chaining value after `done` whole blocks (FIPS 180-4 §6.2), over
/// data given in pieces.
struct Sha256 {
    state: [u32; 8],
    block: [u8; BLOCK],
    fill: usize,
    /// Bytes hashed so far, including the ones before this value was made.
    len: u64,
}

impl Sha256 {
    fn resume(state: [u32; 8], done_blocks: u64) -> Sha256 {
        Sha256 { state, block: [0; BLOCK], fill: 0, len: done_blocks * BLOCK as u64 }
    }

    fn update(&mut self, mut data: &[u8]) {
        self.len = self.len.wrapping_add(data.len() as u64);
        if self.fill > 0 {
            let n = data.len().min(BLOCK - self.fill);
            self.block[self.fill..self.fill + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
            if self.fill < BLOCK {
                return;
            }
            compress(&mut self.state, &self.block);
            self.fill = 0;
        }
        let mut blocks = data.chunks_exact(BLOCK);
        for b in &mut blocks {
            sha2::compress256(&mut self.state, core::slice::from_ref(GenericArray::from_slice(b)));
        }
        let rest = blocks.remainder();
        self.block[..rest.len()].copy_from_slice(rest);
        self.fill = rest.len();
    }

    /// FIPS 180-4 §5.1.1: 0x80, zeros, the length in bits as a 64-bit big-endian
    /// integer, to a whole number of blocks.
    fn finish(mut self) -> [u32; 8] {
        let bits = self.len.wrapping_mul(8);
        self.block[self.fill] = 0x80;
        self.block[self.fill + 1..].fill(0);
        if self.fill + 1 > BLOCK - 8 {
            compress(&mut self.state, &self.block);
            self.block = [0; BLOCK];
        }
        self.block[BLOCK - 8..].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &self.block);
        self.state
    }
}

/// FIPS 180-4 §6.2.2 step 4: the digest is the final chaining value, big-endian.
fn digest_bytes(state: [u32; 8]) -> [u8; OUT_LEN] {
    let mut out = [0u8; OUT_LEN];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// SHA-256 of `data` (FIPS 180-4 §6.2): the digest of an HMAC key longer than a block.
pub fn sha256(data: &[u8]) -> [u8; OUT_LEN] {
    let mut h = Sha256::resume(IV, 0);
    h.update(data);
    digest_bytes(h.finish())
}

/// An HMAC-SHA-256 key (RFC 2104 §2) with its pad blocks already compressed.
#[derive(Clone)]
pub struct HmacSha256 {
    /// The chaining value after the block K ⊕ ipad.
    inner: [u32; 8],
    /// The chaining value after the block K ⊕ opad.
    outer: [u32; 8],
}

impl std::fmt::Debug for HmacSha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacSha256(..)")
    }
}

impl HmacSha256 {
    /// RFC 2104 §2: a key longer than B = 64 bytes is hashed first; the key is
    /// zero-padded to B bytes; ipad = 0x36 repeated, opad = 0x5c repeated.
    pub fn new(key: &[u8]) -> HmacSha256 {
        let mut k = [0u8; BLOCK];
        if key.len() > BLOCK {
            k[..OUT_LEN].copy_from_slice(&sha256(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let (mut ipad, mut opad) = ([0u8; BLOCK], [0u8; BLOCK]);
        for ((i, o), k) in ipad.iter_mut().zip(opad.iter_mut()).zip(k) {
            *i = k ^ 0x36;
            *o = k ^ 0x5c;
        }
        let (mut inner, mut outer) = (IV, IV);
        compress(&mut inner, &ipad);
        compress(&mut outer, &opad);
        HmacSha256 { inner, outer }
    }

    /// RFC 2104 §2: H(K ⊕ opad, H(K ⊕ ipad, text)) of `text` = the concatenation of
    /// `parts`.
    pub fn sign_parts(&self, parts: &[&[u8]]) -> [u8; OUT_LEN] {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let inner = if len <= BLOCK - 9 {
            // The whole inner message after the pad block fits one block with its
            // padding (FIPS 180-4 §5.1.1): text ‖ 0x80 ‖ zeros ‖ (64 + len) · 8.
            let mut b = [0u8; BLOCK];
            let mut at = 0;
            for p in parts {
                b[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            b[at] = 0x80;
            b[BLOCK - 8..].copy_from_slice(&(((BLOCK + len) as u64) * 8).to_be_bytes());
            let mut state = self.inner;
            compress(&mut state, &b);
            state
        } else {
            let mut h = Sha256::resume(self.inner, 1);
            for p in parts {
                h.update(p);
            }
            h.finish()
        };
        // The outer message, K ⊕ opad ‖ the inner digest, is one block after the pad
        // block: digest ‖ 0x80 ‖ zeros ‖ (64 + 32) · 8.
        let mut b = [0u8; BLOCK];
        for (o, w) in b.chunks_exact_mut(4).zip(inner) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        b[OUT_LEN] = 0x80;
        b[BLOCK - 8..].copy_from_slice(&(((BLOCK + OUT_LEN) as u64) * 8).to_be_bytes());
        let mut state = self.outer;
        compress(&mut state, &b);
        digest_bytes(state)
    }

    /// RFC 2104 §2: HMAC-SHA-256 of `text`.
    pub fn sign(&self, text: &[u8]) -> [u8; OUT_LEN] {
        self.sign_parts(&[text])
    }
}

/// RFC 5869 §2.2: PRK = HKDF-Extract(salt, IKM) = HMAC-Hash(salt, IKM), with the salt
/// already made an HMAC key.
pub fn extract(salt: &HmacSha256, ikm: &[u8]) -> [u8; OUT_LEN] {
    salt.sign(ikm)
}

/// RFC 5869 §2.3: OKM = HKDF-Expand(PRK, info, L) into `okm` (L = its length), with
/// the PRK already made an HMAC key: T(i) = HMAC-Hash(PRK, T(i-1) ‖ info ‖ i), T(0)
/// empty, OKM the first L bytes of T(1) ‖ T(2) ‖ …. `None` when L > 255 · 32.
/// An L of at most 32 is one HMAC.
pub fn expand(prk: &HmacSha256, info: &[u8], okm: &mut [u8]) -> Option<()> {
    if okm.len() > 255 * OUT_LEN {
        return None;
    }
    let mut t = [0u8; OUT_LEN];
    for (i, chunk) in okm.chunks_mut(OUT_LEN).enumerate() {
        // i < 255 by the check above.
        let counter = [i as u8 + 1];
        let prev: &[u8] = if i == 0 { &[] } else { &t };
        t = prk.sign_parts(&[prev, info, &counter]);
        chunk.copy_from_slice(&t[..chunk.len()]);
    }
    Some(())
}

/// RFC 8446 §7.1 HKDF-Expand-Label(Secret, Label, "", Length) for a `Length` of at
/// most 32, as RFC 9001 §5.2 uses it: `hkdf_label` is the whole HkdfLabel structure
/// (length, "tls13 " ‖ label, empty context), without HKDF's counter. RFC 5869 §2.3:
/// one block, T(1) = HMAC-Hash(PRK, info ‖ 0x01).
pub fn expand_label<const N: usize>(secret: &HmacSha256, hkdf_label: &[u8]) -> [u8; N] {
    const { assert!(N <= OUT_LEN, "one HKDF-Expand block") };
    let t = secret.sign_parts(&[hkdf_label, &[1]]);
    let mut out = [0u8; N];
    out.copy_from_slice(&t[..N]);
    out
}
