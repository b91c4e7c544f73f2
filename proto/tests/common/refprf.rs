//! The per-generation PRF of ADR 0004, written from the ADR's text and not from
//! `proto::prf`: the models of the integration tests decode CIDs with it.

use aws_lc_rs::hmac;
use proto::cid::Prf;
use std::hash::Hasher;

/// ADR 0004: `t = HMAC-SHA-256(secret, "quicdemux cid prf siphash-2-4 v1")`,
/// `k0 = LE(t[0..8])`, `k1 = LE(t[8..16])`.
pub fn ref_siphash_key(secret: &[u8; 32]) -> (u64, u64) {
    let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), b"quicdemux cid prf siphash-2-4 v1");
    let t = t.as_ref();
    let le = |b: &[u8]| b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
    (le(&t[0..8]), le(&t[8..16]))
}

/// The two mask bytes for `prefix` = CID bytes 0..=8: HMAC-SHA-256 tag bytes 0 and 1
/// (ADR 0001), or SipHash-2-4 output bytes 0 and 1, i.e. `h` and `h >> 8` (ADR 0004).
pub fn ref_mask(prf: Prf, secret: &[u8; 32], prefix: &[u8]) -> [u8; 2] {
    match prf {
        Prf::HmacSha256 => {
            let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), prefix);
            [t.as_ref()[0], t.as_ref()[1]]
        }
        Prf::SipHash24 => {
            let (k0, k1) = ref_siphash_key(secret);
            let mut s = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
            s.write(prefix);
            s.finish().to_le_bytes()[..2].try_into().unwrap()
        }
    }
}

/// The server id a 12-byte CID carries under (`prf`, `secret`).
pub fn ref_server_id(prf: Prf, secret: &[u8; 32], cid: &[u8]) -> u16 {
    let m = ref_mask(prf, secret, &cid[..9]);
    u16::from_be_bytes([cid[9] ^ m[0], cid[10] ^ m[1]])
}
