//! QUIC Retry packets (RFC 9000 §17.2.5) and their integrity tag (RFC 9001 §5.8;
//! RFC 9369 §3.3.3 for QUIC v2): parse, build and verify, sans-IO.
//!
//! The data plane mints its Retries with quinn (docs/adr/0003-demux-retry.md), so
//! that the token is quinn's own; this module is the independent check the tests use
//! on what goes out (and a way to build a Retry without quinn, e.g. for fuzzing).

use crate::header::{VERSION_1, VERSION_2};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};

/// Length of the Retry Integrity Tag (RFC 9001 §5.8: AEAD_AES_128_GCM's tag).
pub const TAG_LEN: usize = 16;

// RFC 9001 §5.8: the fixed key and nonce of the v1 Retry integrity AEAD.
const V1_KEY: [u8; 16] =
    [0xbe, 0x0c, 0x69, 0x0b, 0x9f, 0x66, 0x57, 0x5a, 0x1d, 0x76, 0x6b, 0x54, 0xe3, 0x68, 0xc8, 0x4e];
const V1_NONCE: [u8; 12] = [0x46, 0x15, 0x99, 0xd3, 0x5d, 0x63, 0x2b, 0xf2, 0x23, 0x98, 0x25, 0xbb];
// RFC 9369 §3.3.3: the v2 ones.
const V2_KEY: [u8; 16] =
    [0x8f, 0xb4, 0xb0, 0x1b, 0x56, 0xac, 0x48, 0xe2, 0x60, 0xfb, 0xcb, 0xce, 0xad, 0x7c, 0xcc, 0x92];
const V2_NONCE: [u8; 12] = [0xd8, 0x69, 0x69, 0xbc, 0x2d, 0x7c, 0x6d, 0x99, 0x90, 0xef, 0xb0, 0x4a];

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
    if dl > 20 || sl > 20 {
        return None;
    }
    let rest = p.get(7 + dl + sl..)?;
    let split = rest.len().checked_sub(TAG_LEN)?;
    let (token, tag) = rest.split_at(split);
    Some(Retry { version, dcid, scid, token, tag: tag.try_into().ok()? })
}

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
    // Retry Pseudo-Packet: ODCID Length (8), ODCID, then the Retry without its tag.
    let mut pseudo = Vec::with_capacity(1 + odcid.len() + retry_without_tag.len());
    pseudo.push(u8::try_from(odcid.len()).ok()?);
    pseudo.extend_from_slice(odcid);
    pseudo.extend_from_slice(retry_without_tag);
    let k = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).ok()?);
    let tag = k
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&pseudo[..]), &mut [0u8; 0])
        .ok()?;
    tag.as_ref().try_into().ok()
}

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
    if dcid.len() > 20 || scid.len() > 20 || token.is_empty() {
        return None;
    }
    out.clear();
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
