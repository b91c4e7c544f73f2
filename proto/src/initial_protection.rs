//! The checks quinn 0.11 makes on a client's first Initial before it would Retry it,
//! done without an endpoint: parse the Initial's cleartext header (RFC 9000 §17.2.2),
//! then remove header protection from its first byte with the Initial keys derived
//! from the DCID (RFC 9001 §5.2, §5.4) and require the reserved bits to be zero
//! (RFC 9000 §17.2). The payload is never decrypted (quinn does not either before a
//! Retry).
//!
//! Only the first byte's mask is needed: the reserved bits live there, and a Retry
//! does not depend on the packet number. So per Initial this costs an HKDF-Extract
//! (under the v1 salt's HMAC key, its pads compressed once), two HKDF-Expand-Label
//! under fresh secrets (the client secret, then the `quic hp` key): ten SHA-256
//! compressions in all (proto::hkdf); then an AES-128 key schedule and one AES block
//! (RFC 9001 §5.4.3).

use crate::header::{read_varint, VERSION_1};
use crate::hkdf::{self, HmacSha256};
use aes::cipher::{BlockEncrypt, KeyInit};

/// RFC 9000 §14.1: a client's Initial datagram is at least this long (quinn drops
/// shorter ones: `MIN_INITIAL_SIZE`).
pub const MIN_INITIAL_DATAGRAM: usize = 1200;
/// RFC 9000 §7.2: a client's first DCID is at least 8 bytes.
pub const MIN_FIRST_DCID: usize = 8;
/// RFC 9000 §17.2: connection IDs of QUIC v1 are at most 20 bytes.
pub const MAX_CID: usize = 20;
/// RFC 9001 §5.4.2: the header-protection sample is 16 bytes, taken 4 bytes after the
/// start of the packet number.
const SAMPLE_OFFSET: usize = 4;
const SAMPLE_LEN: usize = 16;
/// RFC 9000 §17.2: the reserved bits of a long header (after protection removal).
const LONG_RESERVED_BITS: u8 = 0x0c;

// RFC 9001 §5.2: initial_salt of QUIC v1.
const SALT_V1: [u8; 20] = [
    0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f,
    0x0a,
];

// RFC 8446 §7.1 HkdfLabel with an empty context: length (2), label length,
// "tls13 " ‖ label, context length 0 (hkdf::expand_label adds RFC 5869 §2.3's
// counter byte).
const LABEL_CLIENT_IN: &[u8] = b"\x00\x20\x0ftls13 client in\x00";
const LABEL_QUIC_HP: &[u8] = b"\x00\x10\x0dtls13 quic hp\x00";

/// Why a datagram does not get a Retry (quinn would not retry it either).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotRetryable {
    /// Shorter than 1200 bytes (RFC 9000 §14.1).
    Short,
    /// Not a v1 long-header Initial with the fixed bit set, or a field runs past the
    /// datagram (RFC 9000 §17.2.2).
    Malformed,
    /// A DCID shorter than 8 bytes (RFC 9000 §7.2).
    ShortDcid,
    /// Too short for the header-protection sample (RFC 9001 §5.4.2).
    NoSample,
    /// Reserved bits not zero after header protection removal (RFC 9000 §17.2).
    ReservedBits,
    /// Carries a Retry token that is valid for its sender: already validated.
    Validated,
}

/// The cleartext fields of a client Initial (RFC 9000 §17.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInitial<'a> {
    pub version: u32,
    pub dcid: &'a [u8],
    pub scid: &'a [u8],
    pub token: &'a [u8],
    /// Offset of the (protected) packet number.
    pub pn_offset: usize,
    /// Bytes of the first packet (coalesced packets after it are not looked at).
    pub packet_len: usize,
}

/// Parses the first packet of `datagram` as a QUIC v1 client Initial, as quinn's
/// `PartialDecode` does for a server that speaks v1 and never greases the fixed bit.
pub fn parse(datagram: &[u8]) -> Result<ClientInitial<'_>, NotRetryable> {
    parse_inner(datagram).ok_or(NotRetryable::Malformed)
}

fn parse_inner(p: &[u8]) -> Option<ClientInitial<'_>> {
    let first = *p.first()?;
    // Long form, fixed bit, type Initial (0).
    if first & 0xf0 != 0xc0 {
        return None;
    }
    let version = u32::from_be_bytes(p.get(1..5)?.try_into().ok()?);
    if version != VERSION_1 {
        return None;
    }
    let dl = usize::from(*p.get(5)?);
    if dl > MAX_CID {
        return None;
    }
    let dcid = p.get(6..6 + dl)?;
    let mut pos = 6 + dl;
    let sl = usize::from(*p.get(pos)?);
    if sl > MAX_CID {
        return None;
    }
    let scid = p.get(pos + 1..pos + 1 + sl)?;
    pos += 1 + sl;
    let (tl, n) = read_varint(p.get(pos..)?)?;
    pos += n;
    let token_end = pos.checked_add(usize::try_from(tl).ok()?)?;
    let token = p.get(pos..token_end)?;
    pos = token_end;
    let (len, n) = read_varint(p.get(pos..)?)?;
    pos += n;
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    if end > p.len() {
        return None;
    }
    Some(ClientInitial { version, dcid, scid, token, pn_offset: pos, packet_len: end })
}

/// Per-shard state of the check: the HMAC key of the v1 initial salt, set up once.
pub struct InitialProtection {
    salt_v1: HmacSha256,
}

impl std::fmt::Debug for InitialProtection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InitialProtection(..)")
    }
}

impl Default for InitialProtection {
    fn default() -> Self {
        Self::new()
    }
}

impl InitialProtection {
    pub fn new() -> InitialProtection {
        InitialProtection { salt_v1: HmacSha256::new(&SALT_V1) }
    }

    /// The client's Initial header-protection key for `dcid` (RFC 9001 §5.2:
    /// client_initial_secret = HKDF-Expand-Label(HKDF-Extract(initial_salt, dcid),
    /// "client in", 32); hp = HKDF-Expand-Label(that, "quic hp", 16)).
    pub fn client_hp_key(&self, dcid: &[u8]) -> [u8; 16] {
        // RFC 5869 §2.2: the initial secret is the PRK of the v1 salt and the DCID.
        let initial = hkdf::extract(&self.salt_v1, dcid);
        let client: [u8; 32] = hkdf::expand_label(&HmacSha256::new(&initial), LABEL_CLIENT_IN);
        hkdf::expand_label(&HmacSha256::new(&client), LABEL_QUIC_HP)
    }

    /// The checks quinn makes on a first Initial before it may Retry it, in its order:
    /// datagram length, DCID length, sample present, reserved bits zero after header
    /// protection removal (RFC 9001 §5.4.1: the low 4 bits of the first byte are
    /// masked in a long header).
    pub fn check<'a>(&self, datagram: &'a [u8]) -> Result<ClientInitial<'a>, NotRetryable> {
        let p = parse(datagram)?;
        if datagram.len() < MIN_INITIAL_DATAGRAM {
            return Err(NotRetryable::Short);
        }
        if p.dcid.len() < MIN_FIRST_DCID {
            return Err(NotRetryable::ShortDcid);
        }
        let start = p.pn_offset + SAMPLE_OFFSET;
        let sample = datagram
            .get(start..start + SAMPLE_LEN)
            .filter(|_| start + SAMPLE_LEN <= p.packet_len)
            .and_then(|s| <&[u8; SAMPLE_LEN]>::try_from(s).ok())
            .ok_or(NotRetryable::NoSample)?;
        let mask = hp_mask(&self.client_hp_key(p.dcid), sample);
        if (datagram[0] ^ mask[0]) & 0x0f & LONG_RESERVED_BITS != 0 {
            return Err(NotRetryable::ReservedBits);
        }
        Ok(p)
    }
}

/// RFC 9001 §5.4.3: the AES-based header-protection mask, AES-ECB(hp_key, sample)
/// (AES-128 for the Initial keys), of which the first five bytes are used.
fn hp_mask(hp_key: &[u8; 16], sample: &[u8; SAMPLE_LEN]) -> [u8; 16] {
    let mut block = aes::Block::from(*sample);
    aes::Aes128Enc::new(hp_key.into()).encrypt_block(&mut block);
    block.into()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::initial::{build_client_initial, client_initial_keys};
    use aws_lc_rs::aead::quic::{HeaderProtectionKey, AES_128};
    use aws_lc_rs::hmac;
    use proptest::prelude::*;

    /// The aws-lc-rs implementation this module had before proto::hkdf and the `aes`
    /// crate: the slow, obviously right model of `client_hp_key` and `check`.
    pub(crate) mod model {
        use super::super::*;
        use aws_lc_rs::aead::quic::{HeaderProtectionKey, AES_128};
        use aws_lc_rs::hmac;

        const LABEL_CLIENT_IN: &[u8] = b"\x00\x20\x0ftls13 client in\x00\x01";
        const LABEL_QUIC_HP: &[u8] = b"\x00\x10\x0dtls13 quic hp\x00\x01";

        pub fn client_hp_key(dcid: &[u8]) -> [u8; 16] {
            let salt_v1 = hmac::Key::new(hmac::HMAC_SHA256, &SALT_V1);
            let initial = hmac::sign(&salt_v1, dcid);
            let prk = hmac::Key::new(hmac::HMAC_SHA256, initial.as_ref());
            let client = hmac::sign(&prk, LABEL_CLIENT_IN);
            let client = hmac::Key::new(hmac::HMAC_SHA256, client.as_ref());
            let hp = hmac::sign(&client, LABEL_QUIC_HP);
            let mut out = [0u8; 16];
            out.copy_from_slice(&hp.as_ref()[..16]);
            out
        }

        pub fn check(datagram: &[u8]) -> Result<ClientInitial<'_>, NotRetryable> {
            let p = parse(datagram)?;
            if datagram.len() < MIN_INITIAL_DATAGRAM {
                return Err(NotRetryable::Short);
            }
            if p.dcid.len() < MIN_FIRST_DCID {
                return Err(NotRetryable::ShortDcid);
            }
            let start = p.pn_offset + SAMPLE_OFFSET;
            let sample = datagram
                .get(start..start + SAMPLE_LEN)
                .filter(|_| start + SAMPLE_LEN <= p.packet_len)
                .ok_or(NotRetryable::NoSample)?;
            let hp = HeaderProtectionKey::new(&AES_128, &client_hp_key(p.dcid)).map_err(|_| NotRetryable::NoSample)?;
            let mask = hp.new_mask(sample).map_err(|_| NotRetryable::NoSample)?;
            if (datagram[0] ^ mask[0]) & 0x0f & LONG_RESERVED_BITS != 0 {
                return Err(NotRetryable::ReservedBits);
            }
            Ok(p)
        }
    }

    proptest! {
        /// RFC 9001 §5.2 for any DCID of 0..=20 bytes: the same key as the model.
        #[test]
        fn hp_key_is_the_model(dcid in proptest::collection::vec(any::<u8>(), 0..=20)) {
            prop_assert_eq!(InitialProtection::new().client_hp_key(&dcid), model::client_hp_key(&dcid));
        }

        /// RFC 9001 §5.4.3 for any key and sample: the mask aws-lc-rs's
        /// HeaderProtectionKey makes (its five bytes).
        #[test]
        fn hp_mask_is_aws_lc(key in any::<[u8; 16]>(), sample in any::<[u8; 16]>()) {
            let want = HeaderProtectionKey::new(&AES_128, &key).unwrap().new_mask(&sample).unwrap();
            prop_assert_eq!(hp_mask(&key, &sample)[..5].to_vec(), want.to_vec());
        }

        // `check` and `parse` against a model that shares no code with them, and
        // RFC 9001 Appendix A end to end: tests/initial_protection_model.rs.
    }

    /// HMAC keys of the v1 salt: the precomputed pads give aws-lc-rs's tags.
    #[test]
    fn salt_key_is_aws_lc() {
        let ip = InitialProtection::new();
        let model = hmac::Key::new(hmac::HMAC_SHA256, &SALT_V1);
        for dcid in [&[][..], &[0xff; 20], b"8 bytes!"] {
            assert_eq!(hkdf::extract(&ip.salt_v1, dcid)[..], hmac::sign(&model, dcid).as_ref()[..]);
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 9001 Appendix A.1: hp = 9f50449e04a0e810283a1e9933adedd2 for DCID
    /// 0x8394c8f03e515708.
    #[test]
    fn rfc9001_a1_hp_key() {
        let ip = InitialProtection::new();
        assert_eq!(ip.client_hp_key(&hex("8394c8f03e515708")).to_vec(), hex("9f50449e04a0e810283a1e9933adedd2"));
        for dcid in [&[1u8; 8][..], &[2; 20], &[3; 12]] {
            assert_eq!(ip.client_hp_key(dcid), client_initial_keys(VERSION_1, dcid).unwrap().2);
        }
    }

    /// RFC 9001 Appendix A.2: the client's protected Initial header starts
    /// c000000001088394c8f03e5157080000449e7b9aec34 and its unprotected first byte is
    /// c3 (reserved bits zero); the sample is d1b1c98dd7689fb8ec11d242b123dc9b.
    #[test]
    fn rfc9001_a2_first_byte() {
        let ip = InitialProtection::new();
        let key = ip.client_hp_key(&hex("8394c8f03e515708"));
        let sample: [u8; 16] = hex("d1b1c98dd7689fb8ec11d242b123dc9b").try_into().unwrap();
        let hp = HeaderProtectionKey::new(&AES_128, &key).unwrap();
        let mask = hp.new_mask(&sample).unwrap();
        assert_eq!(mask[..5].to_vec(), hex("437b9aec36"));
        assert_eq!(0xc0 ^ (mask[0] & 0x0f), 0xc3);
        assert_eq!(hp_mask(&key, &sample)[..5].to_vec(), hex("437b9aec36"), "the aes crate's mask");
    }

    #[test]
    fn checks_in_quinns_order() {
        let ip = InitialProtection::new();
        let dcid = [9u8; 12];
        let ch = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
        let p = ip.check(&ch).unwrap();
        assert_eq!((p.dcid, p.scid, p.token, p.packet_len), (&dcid[..], &[1u8; 8][..], &[][..], 1200));
        // A token is parsed out, not judged here.
        let t = build_client_initial(VERSION_1, &dcid, &[], &[5; 30], 0, &[6, 0, 1, 0xaa], 1200).unwrap();
        assert_eq!(ip.check(&t).unwrap().token, &[5; 30]);
        let short = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 1199).unwrap();
        assert_eq!(short.len(), 1199);
        assert_eq!(ip.check(&short), Err(NotRetryable::Short));
        let d7 = build_client_initial(VERSION_1, &[9; 7], &[1; 8], &[], 0, &[6, 0, 1, 2], 1200).unwrap();
        assert_eq!(ip.check(&d7), Err(NotRetryable::ShortDcid));
        // v2 is not retried (quinn 0.11 workers speak v1 only).
        let v2 = build_client_initial(crate::header::VERSION_2, &dcid, &[], &[], 0, &[6, 0, 1, 2], 1200).unwrap();
        assert_eq!(ip.check(&v2), Err(NotRetryable::Malformed));
        // Setting a reserved bit under the mask: dropped.
        let mut bad = ch.clone();
        bad[0] ^= 0x04;
        assert_eq!(ip.check(&bad), Err(NotRetryable::ReservedBits));
        let mut bad = ch.clone();
        bad[0] ^= 0x08;
        assert_eq!(ip.check(&bad), Err(NotRetryable::ReservedBits));
        // The packet-number-length bits are not reserved.
        let mut ok = ch.clone();
        ok[0] ^= 0x01;
        assert!(ip.check(&ok).is_ok());
        // A Length that runs past the datagram, a fixed bit clear, a 21-byte DCID.
        let mut padded = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 0).unwrap();
        let first_len = padded.len();
        padded.resize(1200, 0);
        assert_eq!(ip.check(&padded).unwrap().packet_len, first_len, "padding after the packet is not looked at");
        let mut cut = ch.clone();
        cut.truncate(1199);
        assert_eq!(ip.check(&cut), Err(NotRetryable::Malformed), "Length past the end");
        let mut nofix = ch.clone();
        nofix[0] &= !0x40;
        assert_eq!(ip.check(&nofix), Err(NotRetryable::Malformed));
        let mut d21 = ch;
        d21[5] = 21;
        assert_eq!(ip.check(&d21), Err(NotRetryable::Malformed));
    }
}
