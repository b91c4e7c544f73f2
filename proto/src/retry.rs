//! QUIC Retry packets (RFC 9000 §17.2.5) and their integrity tag (RFC 9001 §5.8;
//! RFC 9369 §3.3.3 for QUIC v2): parse, build and verify, sans-IO; and
//! [`RetryMinter`], which answers a client's first Initial with the Retry a quinn 0.11
//! server would send (docs/adr/0003-demux-retry.md), without a quinn endpoint.

use crate::header::{VERSION_1, VERSION_2};
use crate::initial_protection::{ClientInitial, InitialProtection, NotRetryable};
use crate::token::{TokenCheck, TokenKey, MAX_RETRY_TOKEN, NONCE_LEN};
use aes_gcm::aead::AeadInOut;
use aes_gcm::{AesGcm, KeyInit};

/// AES-128-GCM (the `aes-gcm` crate) on the encrypt-only AES-128 key schedule (GCM
/// only ever encrypts blocks).
type Aes128Gcm = AesGcm<aes::Aes128Enc, aes::cipher::consts::U12>;
use std::net::SocketAddr;

/// Length of the Retry Integrity Tag (RFC 9001 §5.8: AEAD_AES_128_GCM's tag).
pub const TAG_LEN: usize = 16;

// RFC 9001 §5.8: the fixed key and nonce of the v1 Retry integrity AEAD.
//= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
//# The secret key, K, is 128 bits equal to 0xbe0c690b9f66575a1d766b54e368c84e.
const V1_KEY: [u8; 16] =
    [0xbe, 0x0c, 0x69, 0x0b, 0x9f, 0x66, 0x57, 0x5a, 0x1d, 0x76, 0x6b, 0x54, 0xe3, 0x68, 0xc8, 0x4e];
//= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
//# The nonce, N, is 96 bits equal to 0x461599d35d632bf2239825bb.
const V1_NONCE: [u8; 12] = [0x46, 0x15, 0x99, 0xd3, 0x5d, 0x63, 0x2b, 0xf2, 0x23, 0x98, 0x25, 0xbb];
// RFC 9369 §3.3.3: the v2 ones.
const V2_KEY: [u8; 16] =
    [0x8f, 0xb4, 0xb0, 0x1b, 0x56, 0xac, 0x48, 0xe2, 0x60, 0xfb, 0xcb, 0xce, 0xad, 0x7c, 0xcc, 0x92];
const V2_NONCE: [u8; 12] = [0xd8, 0x69, 0x69, 0xbc, 0x2d, 0x7c, 0x6d, 0x99, 0x90, 0xef, 0xb0, 0x4a];

//= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5
//# Retry Packet {
//#   Header Form (1) = 1,
//#   Fixed Bit (1) = 1,
//#   Long Packet Type (2) = 3,
//#   Unused (4),
//#   Version (32),
//#   Destination Connection ID Length (8),
//#   Destination Connection ID (0..160),
//#   Source Connection ID Length (8),
//#   Source Connection ID (0..160),
//#   Retry Token (..),
//#   Retry Integrity Tag (128),
//# }
/// The fields of a Retry packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry<'a> {
    pub version: u32,
    /// The client's SCID (RFC 9000 §17.2.5: the Retry's DCID).
    pub dcid: &'a [u8],
    /// The server-chosen CID the client uses as DCID from now on.
    pub scid: &'a [u8],
    /// Opaque, non-empty (RFC 9000 §17.2.5.1: a client discards an empty one).
    pub token: &'a [u8],
    pub tag: [u8; TAG_LEN],
}

//= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5
//# a Retry packet uses a long packet header with a type value of 0x03.
/// Long-header type bits of Retry: 3 in v1 (RFC 9000 §17.2), 0 in v2 (RFC 9369 §3.2).
fn retry_type_bits(version: u32) -> Option<u8> {
    match version {
        VERSION_1 => Some(3),
        VERSION_2 => Some(0),
        _ => None,
    }
}

/// Parses a Retry packet (the whole datagram: a Retry is never coalesced with a
/// packet after it, RFC 9000 §17.2.5). `None` if it is not a v1/v2 Retry.
pub fn parse(p: &[u8]) -> Option<Retry<'_>> {
    let first = *p.first()?;
    let version = u32::from_be_bytes(p.get(1..5)?.try_into().ok()?);
    // Long form, fixed bit, the version's Retry type.
    if first & 0xc0 != 0xc0 || (first >> 4) & 3 != retry_type_bits(version)? {
        return None;
    }
    let dl = usize::from(*p.get(5)?);
    let dcid = p.get(6..6 + dl)?;
    let sl = usize::from(*p.get(6 + dl)?);
    let scid = p.get(7 + dl..7 + dl + sl)?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
    //# In QUIC version 1, this value MUST NOT exceed 20 bytes. Endpoints that receive a version 1
    //# long header with a value larger than 20 MUST drop the packet.
    if dl > 20 || sl > 20 {
        return None;
    }
    let rest = p.get(7 + dl + sl..)?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5
    //# Retry Integrity Tag: Defined in Section 5.8 ("Retry Packet Integrity") of [QUIC-TLS].
    let split = rest.len().checked_sub(TAG_LEN)?;
    let (token, tag) = rest.split_at(split);
    Some(Retry { version, dcid, scid, token, tag: tag.try_into().ok()? })
}

//= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
//# The Retry Integrity Tag is a 128-bit field that is computed as the output of AEAD_AES_128_GCM
//# [AEAD] used with the following inputs:
//= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
//# Retry Pseudo-Packet {
//#   ODCID Length (8),
//#   Original Destination Connection ID (0..160),
//#   Header Form (1) = 1,
//#   Fixed Bit (1) = 1,
//#   Long Packet Type (2) = 3,
//#   Unused (4),
//#   Version (32),
//#   DCID Len (8),
//#   Destination Connection ID (0..160),
//#   SCID Len (8),
//#   Source Connection ID (0..160),
//#   Retry Token (..),
//# }
/// The Retry Integrity Tag of `retry_without_tag` for a client whose original DCID
/// was `odcid` (RFC 9001 §5.8: AES-128-GCM with a fixed key and nonce over an empty
/// plaintext, the Retry Pseudo-Packet as associated data). `None` for another
/// version or an ODCID longer than 255 bytes.
pub fn integrity_tag(version: u32, odcid: &[u8], retry_without_tag: &[u8]) -> Option<[u8; TAG_LEN]> {
    let (key, nonce) = match version {
        VERSION_1 => (V1_KEY, V1_NONCE),
        VERSION_2 => (V2_KEY, V2_NONCE),
        _ => return None,
    };
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
    //# The Retry Pseudo-Packet is not sent over the wire. It is computed by taking the transmitted
    //# Retry packet, removing the Retry Integrity Tag, and prepending the two following fields:
    // Retry Pseudo-Packet: ODCID Length (8), ODCID, then the Retry without its tag.
    let mut pseudo = Vec::with_capacity(1 + odcid.len() + retry_without_tag.len());
    pseudo.push(u8::try_from(odcid.len()).ok()?);
    pseudo.extend_from_slice(odcid);
    pseudo.extend_from_slice(retry_without_tag);
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
    //# The plaintext, P, is empty.
    integrity_key(&key, &nonce).tag(&pseudo)
}

//= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5.2
//# Clients MUST discard Retry packets that have a Retry Integrity Tag that cannot be validated; see
//# Section 5.8 of [QUIC-TLS].
/// Whether `packet` is a Retry whose integrity tag is right for original DCID
/// `odcid` (what a client checks, RFC 9001 §5.8).
pub fn verify(packet: &[u8], odcid: &[u8]) -> bool {
    let Some(r) = parse(packet) else { return false };
    let body = &packet[..packet.len() - TAG_LEN];
    integrity_tag(r.version, odcid, body).is_some_and(|t| t == r.tag)
}

/// Builds a Retry into `out` (cleared first). `unused` supplies the four unused bits
/// of the first byte (RFC 9000 §17.2.5: arbitrary). `None` for another version, a CID
/// longer than 20 bytes or an empty token.
pub fn build(
    version: u32,
    dcid: &[u8],
    scid: &[u8],
    token: &[u8],
    odcid: &[u8],
    unused: u8,
    out: &mut Vec<u8>,
) -> Option<()> {
    let ty = retry_type_bits(version)?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5.2
    //# A client MUST discard a Retry packet with a zero-length Retry Token field.
    if dcid.len() > 20 || scid.len() > 20 || token.is_empty() {
        return None;
    }
    out.clear();
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5
    //# The value in the Unused field is set to an arbitrary value by the server; a client MUST
    //# ignore these bits.
    out.push(0xc0 | ty << 4 | (unused & 0x0f));
    out.extend_from_slice(&version.to_be_bytes());
    out.push(dcid.len() as u8);
    out.extend_from_slice(dcid);
    out.push(scid.len() as u8);
    out.extend_from_slice(scid);
    out.extend_from_slice(token);
    let tag = integrity_tag(version, odcid, out)?;
    out.extend_from_slice(&tag);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 9001 Appendix A.4: the server's Retry for the Initial of A.2 (ODCID
    /// 0x8394c8f03e515708).
    #[test]
    fn rfc9001_a4_retry_vector() {
        let odcid = hex("8394c8f03e515708");
        let p = hex("ff000000010008f067a5502a4262b5746f6b656e04a265ba2eff4d829058fb3f0f2496ba");
        assert!(verify(&p, &odcid));
        let r = parse(&p).unwrap();
        assert_eq!((r.version, r.dcid, r.scid, r.token), (1, &[][..], &hex("f067a5502a4262b5")[..], &b"token"[..]));
        let mut out = Vec::new();
        build(1, r.dcid, r.scid, r.token, &odcid, 0x0f, &mut out).unwrap();
        assert_eq!(out, p);
        // Another ODCID, a flipped bit: the tag no longer matches.
        assert!(!verify(&p, &hex("8394c8f03e515709")));
        let mut bad = p.clone();
        bad[10] ^= 1;
        assert!(!verify(&bad, &odcid));
    }

    /// RFC 9369 Appendix A.4: the same for QUIC v2.
    #[test]
    fn rfc9369_a4_retry_vector() {
        let odcid = hex("8394c8f03e515708");
        let p = hex("cf6b3343cf0008f067a5502a4262b5746f6b656ec8646ce8bfe33952d955543665dcc7b6");
        assert!(verify(&p, &odcid));
        let r = parse(&p).unwrap();
        let mut out = Vec::new();
        build(VERSION_2, r.dcid, r.scid, r.token, &odcid, 0x0f, &mut out).unwrap();
        assert_eq!(out, p);
    }

    #[test]
    fn not_a_retry() {
        assert_eq!(parse(&[]), None);
        // A v1 Initial's first byte.
        assert_eq!(parse(&hex("c30000000100000000000000000000000000000000")), None);
        let mut out = Vec::new();
        assert_eq!(build(1, &[], &[1; 8], &[], &[2; 8], 0, &mut out), None, "empty token");
        assert_eq!(build(7, &[], &[1; 8], &[1], &[2; 8], 0, &mut out), None, "unknown version");
    }
}

/// The longest Retry [`RetryMinter::mint`] writes: first byte, version, DCID and
/// SCID (length + at most 20 bytes each), token, integrity tag.
pub const MAX_RETRY: usize = 1 + 4 + 21 + 21 + MAX_RETRY_TOKEN + TAG_LEN;

/// Mints Retries (RFC 9000 §17.2.5) bit for bit as quinn-proto 0.11.19's
/// `Endpoint::handle` + `Endpoint::retry` would for the same Initial, nonce, issue
/// time and SCID: the same checks before retrying (initial_protection), quinn's
/// Retry token (token::TokenKey::seal_retry), first byte `0xf0` (quinn writes the
/// unused bits as zero), the integrity tag (RFC 9001 §5.8).
///
/// Key schedules are made once: the v1 salt's HMAC pads, the token PRK's HMAC pads
/// (the `hkdf` crate) and the fixed integrity AEAD key (`aes-gcm`). Per Retry: the
/// Initial's header-protection key (RFC 9001 §5.2: ten SHA-256 compressions) and one
/// AES-128 block for its mask, the token's AEAD key (RFC 5869 §2.3: one HMAC, two
/// compressions; one AES-256-GCM key schedule), one GCM seal of the token and one
/// GCM tag over the Retry pseudo-packet. No allocation.
pub struct RetryMinter {
    protection: InitialProtection,
    token: TokenKey,
    v1_integrity: IntegrityKey,
}

impl std::fmt::Debug for RetryMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryMinter(..)")
    }
}

impl RetryMinter {
    /// For the instances' token secret (the key file's `token`, as
    /// token::TokenKey::new).
    pub fn new(token_secret: &[u8; 32]) -> RetryMinter {
        RetryMinter {
            protection: InitialProtection::new(),
            token: TokenKey::new(token_secret),
            v1_integrity: integrity_key(&V1_KEY, &V1_NONCE),
        }
    }

    /// The token key Retries are sealed under.
    pub fn token_key(&self) -> &TokenKey {
        &self.token
    }

    /// Answers the client Initial `datagram` from `client` at `now_unix` with a Retry
    /// whose SCID is `scid` and whose token carries `nonce` (which must be unique:
    /// it picks the token's AES-256-GCM key, used with a zero nonce), written to
    /// `out`; its length. Err when quinn would not retry it either: see
    /// [`NotRetryable`]. A token that is not a Retry token valid for `client` is
    /// ignored, as quinn ignores it (RFC 9000 §8.1.3).
    pub fn mint(
        &self,
        datagram: &[u8],
        client: SocketAddr,
        scid: &[u8],
        now_unix: u64,
        nonce: [u8; NONCE_LEN],
        out: &mut [u8; MAX_RETRY],
    ) -> Result<usize, NotRetryable> {
        //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5.1
        //# A server MUST NOT send more than one Retry packet in response to a single UDP datagram.
        let p = self.protection.check(datagram)?;
        //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.2
        //# In response to processing an Initial packet containing a token that was provided in a
        //# Retry packet, a server cannot send another Retry packet; it can only refuse the
        //# connection or permit it to proceed.
        //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.3
        //# If the token is invalid, then the server SHOULD proceed as if the client did not have a
        //# validated address, including potentially sending a Retry packet.
        if !p.token.is_empty() && self.token.check(p.token, client, now_unix) == TokenCheck::Retry {
            return Err(NotRetryable::Validated);
        }
        write_retry(
            &p,
            scid,
            out,
            |odcid, out| self.token.seal_retry(client, odcid, now_unix, nonce, out),
            |odcid, retry| tag_with(&self.v1_integrity, odcid, retry),
        )
    }
}

/// Writes to `out` the Retry answering the client Initial `p` with SCID `scid`: the
/// header (first byte `0xf0`, as quinn writes it), the token `seal_token` writes for
/// the original DCID, and the integrity tag `tag` computes over the pseudo-packet;
/// its length. The one layout of [`RetryMinter::mint`] and of its model, which differ
/// in the crypto behind `seal_token` and `tag` only.
fn write_retry(
    p: &ClientInitial<'_>,
    scid: &[u8],
    out: &mut [u8; MAX_RETRY],
    seal_token: impl FnOnce(&[u8], &mut [u8]) -> Option<usize>,
    tag: impl FnOnce(&[u8], &[u8]) -> Option<[u8; TAG_LEN]>,
) -> Result<usize, NotRetryable> {
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
    //# In QUIC version 1, this value MUST NOT exceed 20 bytes.
    if scid.len() > 20 {
        return Err(NotRetryable::Malformed);
    }
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.5.1
    //# The server populates the Destination Connection ID with the connection ID that the
    //# client included in the Source Connection ID of the Initial packet.
    let mut pos = 0;
    let mut put = |out: &mut [u8; MAX_RETRY], b: &[u8]| {
        out[pos..pos + b.len()].copy_from_slice(b);
        pos += b.len();
    };
    put(out, &[0xf0]);
    put(out, &p.version.to_be_bytes());
    put(out, &[p.scid.len() as u8]);
    put(out, p.scid);
    put(out, &[scid.len() as u8]);
    put(out, scid);
    pos += seal_token(p.dcid, &mut out[pos..]).ok_or(NotRetryable::Malformed)?;
    let tag = tag(p.dcid, &out[..pos]).ok_or(NotRetryable::Malformed)?;
    out[pos..pos + TAG_LEN].copy_from_slice(&tag);
    Ok(pos + TAG_LEN)
}

/// RFC 9001 §5.8 (RFC 9369 §3.3.3): a version's fixed integrity key, scheduled once
/// (its AES round keys and GHASH's H, NIST SP 800-38D §7.1 step 1), with its fixed
/// nonce.
#[derive(Clone)]
struct IntegrityKey {
    aead: Aes128Gcm,
    nonce: [u8; 12],
}

fn integrity_key(key: &[u8; 16], nonce: &[u8; 12]) -> IntegrityKey {
    IntegrityKey { aead: Aes128Gcm::new(&(*key).into()), nonce: *nonce }
}

impl IntegrityKey {
    /// AEAD_AES_128_GCM with an empty plaintext and `aad` as associated data: the
    /// tag alone (NIST SP 800-38D §7.1). `None` only for an AAD beyond GCM's limit.
    fn tag(&self, aad: &[u8]) -> Option<[u8; TAG_LEN]> {
        let tag = self.aead.encrypt_inout_detached(&self.nonce.into(), aad, (&mut [][..]).into()).ok()?;
        Some(tag.into())
    }
}

//= https://www.rfc-editor.org/rfc/rfc9001#section-5.8
//# Original Destination Connection ID: The Original Destination Connection ID contains the value of
//# the Destination Connection ID from the Initial packet that this Retry is in response to.
/// RFC 9001 §5.8 under an already scheduled key, without allocating: the Retry
/// Pseudo-Packet (ODCID length, ODCID, the Retry without its tag) is the AAD.
fn tag_with(key: &IntegrityKey, odcid: &[u8], retry_without_tag: &[u8]) -> Option<[u8; TAG_LEN]> {
    let mut pseudo = [0u8; 1 + 20 + MAX_RETRY];
    let n = 1 + odcid.len() + retry_without_tag.len();
    let pseudo = pseudo.get_mut(..n)?;
    pseudo[0] = u8::try_from(odcid.len()).ok()?;
    pseudo[1..1 + odcid.len()].copy_from_slice(odcid);
    pseudo[1 + odcid.len()..].copy_from_slice(retry_without_tag);
    key.tag(pseudo)
}

#[cfg(test)]
mod minter_tests {
    use super::*;
    use crate::initial::build_client_initial;
    use crate::initial_protection::tests::model as protection_model;
    use crate::token::tests::{any_client, model as token_model};
    use crate::token::write_retry_plain;
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
    use proptest::prelude::*;

    /// The aws-lc-rs integrity key and tag this module had before the RustCrypto
    /// GCM: the slow, obviously right model of `integrity_key` and `tag_with` (RFC
    /// 9001 §5.8).
    fn model_integrity_key(key: &[u8; 16]) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_128_GCM, key).unwrap())
    }

    fn model_tag_with(key: &LessSafeKey, nonce: &[u8; 12], odcid: &[u8], retry_without_tag: &[u8]) -> [u8; TAG_LEN] {
        let mut pseudo = vec![u8::try_from(odcid.len()).unwrap()];
        pseudo.extend_from_slice(odcid);
        pseudo.extend_from_slice(retry_without_tag);
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(&pseudo[..]), &mut [0u8; 0])
            .unwrap();
        tag.as_ref().try_into().unwrap()
    }

    /// What the client's Initial carries as its token.
    #[derive(Clone, Debug)]
    enum Tok {
        None,
        Junk(Vec<u8>),
        /// A Retry token the minter made, for this client or its port's neighbour.
        Retry {
            other_port: bool,
            age: u64,
        },
        /// A NEW_TOKEN token for this client's IP (valid, but not a Retry token).
        Validation,
    }

    fn any_tok() -> impl Strategy<Value = Tok> {
        prop_oneof![
            Just(Tok::None),
            proptest::collection::vec(any::<u8>(), 1..=80).prop_map(Tok::Junk),
            (any::<bool>(), 0u64..=20).prop_map(|(other_port, age)| Tok::Retry { other_port, age }),
            Just(Tok::Validation),
        ]
    }

    proptest! {
        /// `integrity_tag` (v1 and v2) and `tag_with` give the model's tag for any
        /// ODCID (0..=20 bytes) and Retry (0..=200 bytes; `tag_with`: up to
        /// [`MAX_RETRY`]).
        #[test]
        fn integrity_tag_is_the_model(v2 in any::<bool>(),
                                      odcid in proptest::collection::vec(any::<u8>(), 0..=20),
                                      retry in proptest::collection::vec(any::<u8>(), 0..=200)) {
            let (version, key, nonce) = if v2 { (VERSION_2, V2_KEY, V2_NONCE) } else { (VERSION_1, V1_KEY, V1_NONCE) };
            let want = model_tag_with(&model_integrity_key(&key), &nonce, &odcid, &retry);
            prop_assert_eq!(integrity_tag(version, &odcid, &retry), Some(want));
            // tag_with's buffer holds the pseudo-packet of a minted Retry only.
            let fits = odcid.len() + retry.len() <= 20 + MAX_RETRY;
            prop_assert_eq!(tag_with(&integrity_key(&key, &nonce), &odcid, &retry), fits.then_some(want));
        }

        /// The minter writes the model's bytes (or fails as it does) for Initials of
        /// any DCID (0..=20 bytes), SCID and token, any length around 1200 bytes, any
        /// reserved bits, any client, server SCID (0..=21 bytes), time and nonce.
        #[test]
        fn mint_is_the_model(secret in any::<[u8; 32]>(),
                             odcid in prop_oneof![4 => proptest::collection::vec(any::<u8>(), 8..=20),
                                                  1 => proptest::collection::vec(any::<u8>(), 0..8)],
                             cscid in proptest::collection::vec(any::<u8>(), 0..=20),
                             tok in any_tok(),
                             len in prop_oneof![4 => 1200usize..=1300, 1 => 1190usize..1200],
                             first_xor in prop_oneof![3 => Just(0u8), 1 => 1u8..16],
                             client in any_client(),
                             scid in proptest::collection::vec(any::<u8>(), 0..=21),
                             now in 0u64..1 << 40,
                             nonce in any::<[u8; 16]>()) {
            let m = RetryMinter::new(&secret);
            let token = match tok {
                Tok::None => vec![],
                Tok::Junk(j) => j,
                Tok::Retry { other_port, age } => {
                    let c = if other_port { SocketAddr::new(client.ip(), client.port() ^ 1) } else { client };
                    m.token_key().seal(c, Some(&odcid), now.saturating_sub(age), nonce).unwrap()
                }
                Tok::Validation => m.token_key().seal(client, None, now, nonce).unwrap(),
            };
            let Some(mut init) = build_client_initial(VERSION_1, &odcid, &cscid, &token, 0, &[6, 0, 1, 0], len) else {
                return Ok(());
            };
            init[0] ^= first_xor;
            let (mut got, mut want) = ([0u8; MAX_RETRY], [0u8; MAX_RETRY]);
            let n = m.mint(&init, client, &scid, now, nonce, &mut got);
            // The model: `mint` as it was on aws-lc-rs alone, from the models of
            // initial_protection and token (the layout, `write_retry`, is shared).
            let model_token = token_model::TokenKey::new(&secret);
            let w = protection_model::check(&init).and_then(|p| {
                if !p.token.is_empty() && model_token.check(p.token, client, now) == TokenCheck::Retry {
                    return Err(NotRetryable::Validated);
                }
                let seal = |odcid: &[u8], out: &mut [u8]| {
                    let n = write_retry_plain(out, client, odcid, now)?;
                    model_token.seal_plain(out, n, nonce)
                };
                let tag = |odcid: &[u8], retry: &[u8]| {
                    Some(model_tag_with(&model_integrity_key(&V1_KEY), &V1_NONCE, odcid, retry))
                };
                write_retry(&p, &scid, &mut want, seal, tag)
            });
            prop_assert_eq!(n, w);
            if let Ok(n) = n {
                prop_assert_eq!(&got[..n], &want[..n]);
                prop_assert!(verify(&got[..n], &odcid));
            }
        }
    }

    #[test]
    fn mints_a_verifiable_retry_with_a_checkable_token() {
        let m = RetryMinter::new(&[7; 32]);
        let client: SocketAddr = "192.0.2.9:5555".parse().unwrap();
        let (odcid, cscid, scid) = ([3u8; 16], [4u8; 5], [5u8; 12]);
        let init = build_client_initial(VERSION_1, &odcid, &cscid, &[], 0, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
        let mut out = [0u8; MAX_RETRY];
        let n = m.mint(&init, client, &scid, 1000, [9; 16], &mut out).unwrap();
        let r = parse(&out[..n]).unwrap();
        assert_eq!(out[0], 0xf0, "quinn's first byte");
        assert_eq!((r.version, r.dcid, r.scid), (VERSION_1, &cscid[..], &scid[..]));
        assert!(verify(&out[..n], &odcid));
        assert!(!verify(&out[..n], &[3; 15]));
        // The token is the one token::TokenKey::seal makes, and checks for this client.
        assert_eq!(r.token, &m.token_key().seal(client, Some(&odcid), 1000, [9; 16]).unwrap()[..]);
        assert_eq!(m.token_key().check(r.token, client, 1000), TokenCheck::Retry);
        // The same bytes as the allocating builder with quinn's first byte.
        let mut built = Vec::new();
        build(VERSION_1, r.dcid, r.scid, r.token, &odcid, 0, &mut built).unwrap();
        assert_eq!(built, &out[..n]);
        // Its own token back (the client's second Initial): already validated.
        let again = build_client_initial(VERSION_1, &scid, &cscid, r.token, 1, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
        assert_eq!(m.mint(&again, client, &scid, 1001, [8; 16], &mut out), Err(NotRetryable::Validated));
        // ... from another port it is not valid, so that Initial gets a Retry.
        let other: SocketAddr = "192.0.2.9:5556".parse().unwrap();
        assert!(m.mint(&again, other, &scid, 1001, [8; 16], &mut out).is_ok());
        // A 20-byte ODCID, IPv6 client, 20-byte CIDs: the longest Retry fits.
        let v6: SocketAddr = "[2001:db8::1]:9".parse().unwrap();
        let big = build_client_initial(VERSION_1, &[1; 20], &[2; 20], &[], 0, &[6, 0, 1, 0], 1200).unwrap();
        let n = m.mint(&big, v6, &[6; 20], 5, [1; 16], &mut out).unwrap();
        assert_eq!(n, MAX_RETRY);
        assert!(verify(&out[..n], &[1; 20]));
        // Not retryable: a reserved bit set under header protection.
        let mut bad = init;
        bad[0] ^= 0x08;
        assert_eq!(m.mint(&bad, client, &scid, 1000, [9; 16], &mut out), Err(NotRetryable::ReservedBits));
    }
}
