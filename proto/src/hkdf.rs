//! HMAC-SHA-256 (RFC 2104, RFC 4231) and HKDF-SHA-256 (RFC 5869) over the bare
//! SHA-256 compression function (`sha2::compress256`, SHA-NI when the CPU has it),
//! for the short, fresh-key derivations of the Retry path (RFC 9001 §5.2's Initial
//! secrets, quinn's token key: proto::initial_protection, proto::token).
//!
//! A [`HmacSha256`] keeps the two chaining values after the key's inner and outer pad
//! blocks, so keying it costs two compressions and each tag of a message of at most
//! 55 bytes two more: an HKDF-Expand-Label of RFC 9001 §5.2 under a fresh secret is
//! four compressions, with no allocation and no context set-up. The slow, obviously
//! right model is aws-lc-rs's `hmac` / `hkdf` (the proptests below).
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

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::{digest, hkdf, hmac};
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The model: aws-lc-rs's HMAC.
    fn model_hmac(key: &[u8], text: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), text).as_ref().to_vec()
    }

    /// The model: aws-lc-rs's HKDF (extract, then expand to `len` bytes).
    fn model_hkdf(salt: &[u8], ikm: &[u8], info: &[u8], len: usize) -> Vec<u8> {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
        let mut out = vec![0; len];
        prk.expand(&[info], Len(len)).unwrap().fill(&mut out).unwrap();
        out
    }

    fn hkdf(salt: &[u8], ikm: &[u8], info: &[u8], len: usize) -> Vec<u8> {
        let prk = extract(&HmacSha256::new(salt), ikm);
        let mut out = vec![0; len];
        expand(&HmacSha256::new(&prk), info, &mut out).unwrap();
        out
    }

    /// RFC 4231 §4.2–4.8: the HMAC-SHA-256 test cases (case 5's output is truncated to
    /// 128 bits; cases 6 and 7 have a 131-byte key, hashed first).
    #[test]
    fn rfc4231_vectors() {
        let cases: [(Vec<u8>, Vec<u8>, &str); 7] = [
            (vec![0x0b; 20], b"Hi There".to_vec(), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (vec![0xaa; 20], vec![0xdd; 50], "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            ((1..=0x19).collect(), vec![0xcd; 50], "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
            (vec![0x0c; 20], b"Test With Truncation".to_vec(), "a3b6167473100ee06e0c796c2955552b"),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                vec![0xaa; 131],
                b"This is a test using a larger than block-size key and a larger than block-size data. \
                  The key needs to be hashed before being used by the HMAC algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (i, (key, data, want)) in cases.iter().enumerate() {
            let want = hex(want);
            let got = HmacSha256::new(key).sign(data);
            assert_eq!(got[..want.len()], want[..], "RFC 4231 test case {}", i + 1);
        }
    }

    /// RFC 5869 Appendix A.1–A.3: HKDF-SHA-256 (PRK and OKM; A.2's 82-byte inputs and
    /// L = 82, A.3's empty salt and info).
    #[test]
    fn rfc5869_vectors() {
        let a2_ikm: Vec<u8> = (0x00..=0x4f).collect();
        let a2_salt: Vec<u8> = (0x60..=0xaf).collect();
        let a2_info: Vec<u8> = (0xb0..=0xff).collect();
        /// IKM, salt, info, PRK, OKM.
        type Case<'a> = (&'a [u8], &'a [u8], &'a [u8], &'a str, &'a str);
        let cases: [Case; 3] = [
            (
                &[0x0b; 22],
                &hex("000102030405060708090a0b0c"),
                &hex("f0f1f2f3f4f5f6f7f8f9"),
                "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5",
                "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
            ),
            (
                &a2_ikm,
                &a2_salt,
                &a2_info,
                "06a6b88c5853361a06104c9ceb35b45cef760014904671014a193f40c15fc244",
                "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c\
                 59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71\
                 cc30c58179ec3e87c14c01d5c1f3434f1d87",
            ),
            (
                &[0x0b; 22],
                &[],
                &[],
                "19ef24a32c717b167f33a91d6f648bdf96596776afdb6377ac434c1c293ccb04",
                "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
            ),
        ];
        for (i, (ikm, salt, info, prk, okm)) in cases.iter().enumerate() {
            let (prk, okm) = (hex(prk), hex(okm));
            let got_prk = extract(&HmacSha256::new(salt), ikm);
            assert_eq!(got_prk[..], prk[..], "RFC 5869 A.{} PRK", i + 1);
            let mut got = vec![0; okm.len()];
            expand(&HmacSha256::new(&got_prk), info, &mut got).unwrap();
            assert_eq!(got, okm, "RFC 5869 A.{} OKM", i + 1);
        }
    }

    #[test]
    fn sha256_and_limits() {
        // FIPS 180-2 Appendix B.1/B.2 and the empty message.
        assert_eq!(sha256(b"abc").to_vec(), hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
        assert_eq!(
            sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").to_vec(),
            hex("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        );
        assert_eq!(sha256(b"").to_vec(), hex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
        let prk = HmacSha256::new(&[1; 32]);
        assert_eq!(expand(&prk, b"", &mut [0; 255 * 32 + 1]), None, "RFC 5869 §2.3: L ≤ 255·HashLen");
        let mut max = vec![0; 255 * 32];
        expand(&prk, b"x", &mut max).unwrap();
        assert_eq!(max, model_hkdf_from_prk(&[1; 32], b"x", 255 * 32));
    }

    fn model_hkdf_from_prk(prk: &[u8], info: &[u8], len: usize) -> Vec<u8> {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, prk);
        let mut out = vec![0; len];
        prk.expand(&[info], Len(len)).unwrap().fill(&mut out).unwrap();
        out
    }

    proptest! {
        /// Any key (empty, a block, longer than a block: hashed first) and text of any
        /// length around the block and padding boundaries, in one or several pieces.
        #[test]
        fn hmac_is_aws_lc(key in proptest::collection::vec(any::<u8>(), 0..=150),
                          text in proptest::collection::vec(any::<u8>(), 0..=200),
                          cut in any::<prop::sample::Index>()) {
            let k = HmacSha256::new(&key);
            let want = model_hmac(&key, &text);
            prop_assert_eq!(k.sign(&text).to_vec(), want.clone());
            let (a, b) = text.split_at(cut.index(text.len() + 1));
            prop_assert_eq!(k.sign_parts(&[a, b]).to_vec(), want);
        }

        #[test]
        fn sha256_is_aws_lc(data in proptest::collection::vec(any::<u8>(), 0..=300)) {
            prop_assert_eq!(sha256(&data).to_vec(), digest::digest(&digest::SHA256, &data).as_ref().to_vec());
        }

        #[test]
        fn hkdf_is_aws_lc(salt in proptest::collection::vec(any::<u8>(), 0..=80),
                          ikm in proptest::collection::vec(any::<u8>(), 0..=80),
                          info in proptest::collection::vec(any::<u8>(), 0..=80),
                          len in 0usize..=100) {
            prop_assert_eq!(hkdf(&salt, &ikm, &info, len), model_hkdf(&salt, &ikm, &info, len));
        }

        /// RFC 9001 §5.2's use: Extract from a DCID of 0..=20 bytes, two
        /// Expand-Label under fresh secrets.
        #[test]
        fn expand_label_is_aws_lc(salt in proptest::collection::vec(any::<u8>(), 20),
                                  dcid in proptest::collection::vec(any::<u8>(), 0..=20),
                                  label in proptest::collection::vec(any::<u8>(), 0..=40)) {
            let prk = extract(&HmacSha256::new(&salt), &dcid);
            let a: [u8; 32] = expand_label(&HmacSha256::new(&prk), &label);
            let b: [u8; 16] = expand_label(&HmacSha256::new(&a), &label);
            prop_assert_eq!(a.to_vec(), model_hkdf(&salt, &dcid, &label, 32));
            prop_assert_eq!(b.to_vec(), model_hkdf_from_prk(&a, &label, 16));
        }
    }
}
