//! Client Initial packets opened with their public keys (RFC 9001 §5.2: Initial keys
//! derive from the client's DCID alone, so anyone on the path can read them), to
//! answer one question statelessly: **does this datagram start a connection?**
//!
//! The data plane asks it about client Initials whose DCID decodes to a live server
//! id and that carry no valid token (docs/adr/0002-routing.md). Such an Initial is either
//! - a client's Initial *after* the server's first flight: RFC 9000 §7.2 has the
//!   client use the server's SCID as DCID from then on, so it decodes to that server;
//!   it carries ACKs (and a second ClientHello after a HelloRetryRequest, which
//!   continues the CRYPTO stream past offset 0) and must go to its owner; or
//! - a first Initial aimed at an instance with a copied CID (one of the attacker's
//!   own connections, a Retry SCID): it carries the ClientHello, which starts at
//!   CRYPTO offset 0 (RFC 9001 §4.1.3: the CRYPTO stream of each epoch starts at 0).
//!
//! [`starts_connection`] is `Some(true)` exactly when some Initial packet of the
//! datagram (coalesced packets included, RFC 9000 §12.2 — quinn processes them all
//! once the first one made the connection) carries a CRYPTO frame at offset 0 among
//! the frames before the first one it cannot parse (where quinn stops, too).
//!
//! The Initial keys come from proto::initial_protection, the one derivation of RFC
//! 9001 §5.2 (and RFC 9369 §3.3 for v2). Cost: one HKDF-Extract and four
//! HKDF-Expand-Label (HMAC-SHA-256), one AES-128 header-protection mask and one
//! AES-128-GCM open of the packet (aws-lc-rs), per datagram.

use crate::header::{read_varint, VERSION_1, VERSION_2};
use crate::initial_protection::client_initial_keys;
use aws_lc_rs::aead::quic::{HeaderProtectionKey, AES_128};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};

/// Long-header Initial type bits (RFC 9000 §17.2; RFC 9369 §3.2).
fn is_initial(version: u32, first: u8) -> bool {
    let bits = (first >> 4) & 3;
    match version {
        VERSION_1 => bits == 0,
        VERSION_2 => bits == 1,
        _ => false,
    }
}

/// The keys of one DCID, made once per datagram.
struct Keys {
    aead: LessSafeKey,
    iv: [u8; 12],
    hp: HeaderProtectionKey,
}

//= https://www.rfc-editor.org/rfc/rfc9000#section-12.2
//# The receiver of coalesced QUIC packets MUST individually process each QUIC packet and separately
//# acknowledge them, as if they were received as the payload of different UDP datagrams.
/// Whether `datagram` (from a client) starts a QUIC connection: some Initial packet
/// in it carries a CRYPTO frame at offset 0. `None` when the first packet is not a
/// v1/v2 Initial or does not open (quinn drops such a packet too).
pub fn starts_connection(datagram: &[u8]) -> Option<bool> {
    let mut off = 0;
    let mut keys: Option<(Vec<u8>, Keys)> = None;
    let mut opened_any = false;
    while off < datagram.len() {
        let rest = &datagram[off..];
        let Some(p) = split_initial(rest) else { break };
        if keys.as_ref().is_some_and(|(d, _)| d[..] != *p.dcid) {
            //= https://www.rfc-editor.org/rfc/rfc9000#section-12.2
            //# Receivers SHOULD ignore any subsequent packets with a different Destination
            //# Connection ID than the first packet in the datagram.
            // RFC 9000 §12.2: a coalesced packet with another DCID is dropped.
            break;
        }
        if keys.is_none() {
            let k = client_initial_keys(p.version, p.dcid)?;
            let aead = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &k.key).ok()?);
            let hp = HeaderProtectionKey::new(&AES_128, &k.hp).ok()?;
            keys = Some((p.dcid.to_vec(), Keys { aead, iv: k.iv, hp }));
        }
        let (_, k) = keys.as_ref()?;
        match open(k, &rest[..p.len], p.pn_offset) {
            Some(payload) => {
                opened_any = true;
                if crypto_at_zero(&payload) {
                    return Some(true);
                }
            }
            None if !opened_any => return None,
            None => {}
        }
        off += p.len;
    }
    if opened_any {
        Some(false)
    } else {
        None
    }
}

struct InitialPacket<'a> {
    version: u32,
    dcid: &'a [u8],
    pn_offset: usize,
    /// Bytes of the packet (header, packet number, payload).
    len: usize,
}

/// The Initial packet at the front of `p` (RFC 9000 §17.2.2), or `None`.
fn split_initial(p: &[u8]) -> Option<InitialPacket<'_>> {
    let first = *p.first()?;
    if first & 0xc0 != 0xc0 {
        return None;
    }
    let version = u32::from_be_bytes(p.get(1..5)?.try_into().ok()?);
    if !is_initial(version, first) {
        return None;
    }
    let dl = usize::from(*p.get(5)?);
    let dcid = p.get(6..6 + dl)?;
    let mut pos = 6 + dl;
    let sl = usize::from(*p.get(pos)?);
    pos += 1 + sl;
    let (tl, n) = read_varint(p.get(pos..)?)?;
    pos += n + usize::try_from(tl).ok()?;
    let (len, n) = read_varint(p.get(pos..)?)?;
    pos += n;
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    if end > p.len() {
        return None;
    }
    Some(InitialPacket { version, dcid, pn_offset: pos, len: end })
}

/// Removes header protection (RFC 9001 §5.4) and opens the packet (§5.3): its
/// plaintext payload.
fn open(k: &Keys, packet: &[u8], pn_offset: usize) -> Option<Vec<u8>> {
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.4.2
    //# The sample of ciphertext is taken starting from an offset of 4 bytes after the start of the
    //# Packet Number field.
    // RFC 9001 §5.4.2: the sample starts 4 bytes after the packet number's start.
    let sample = packet.get(pn_offset + 4..pn_offset + 20)?;
    let mask = k.hp.new_mask(sample).ok()?;
    let mut buf = packet.to_vec();
    buf[0] ^= mask[0] & 0x0f;
    let pn_len = usize::from(buf[0] & 0x03) + 1;
    let mut pn: u64 = 0;
    for i in 0..pn_len {
        let b = buf.get_mut(pn_offset + i)?;
        *b ^= mask[1 + i];
        pn = pn << 8 | u64::from(*b);
    }
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.3
    //# The exclusive OR of the padded packet number and the IV forms the AEAD nonce.
    // RFC 9001 §5.3: nonce = IV xor the (truncated, for the first packets it is the
    // full) packet number, left-padded. A client's packet numbers of a new
    // connection are small, so the truncated value is the packet number.
    let mut nonce = k.iv;
    for (i, b) in pn.to_be_bytes().iter().enumerate() {
        nonce[4 + i] ^= b;
    }
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.3
    //# The associated data, A, for the AEAD is the contents of the QUIC header, starting from the
    //# first byte of either the short or long header, up to and including the unprotected packet
    //# number.
    let (header, payload) = buf.split_at_mut(pn_offset + pn_len);
    let plain = k.aead.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&*header), payload).ok()?;
    Some(plain.to_vec())
}

/// Builds a protected client Initial (RFC 9001 §5.3–5.4) with packet number `pn`
/// (encoded in 4 bytes) and plaintext `frames`, padded with PADDING frames so the
/// datagram is at least `min_len` bytes. For tests and tools (what a client sends).
pub fn build_client_initial(
    version: u32,
    dcid: &[u8],
    scid: &[u8],
    token: &[u8],
    pn: u32,
    frames: &[u8],
    min_len: usize,
) -> Option<Vec<u8>> {
    let keys = client_initial_keys(version, dcid)?;
    let ty = if version == VERSION_2 { 1 } else { 0 };
    let mut p = vec![0xc0 | ty << 4 | 0x03];
    p.extend_from_slice(&version.to_be_bytes());
    p.push(u8::try_from(dcid.len()).ok()?);
    p.extend_from_slice(dcid);
    p.push(u8::try_from(scid.len()).ok()?);
    p.extend_from_slice(scid);
    put_varint(&mut p, token.len() as u64);
    p.extend_from_slice(token);
    let mut payload = frames.to_vec();
    // Length (2-byte varint) + pn (4) + payload + tag (16).
    let fixed = p.len() + 2 + 4 + 16;
    if fixed + payload.len() < min_len {
        payload.resize(min_len - fixed, 0);
    }
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.4.2
    //# To ensure that sufficient data is available for sampling, packets are padded so that the
    //# combined lengths of the encoded packet number and protected payload is at least 4 bytes
    //# longer than the sample required for header protection.
    // RFC 9001 §5.4.2: at least 4 bytes of packet number + payload before the sample.
    if payload.len() < 4 {
        payload.resize(4, 0);
    }
    let length = 4 + payload.len() + 16;
    if length >= 1 << 14 {
        return None;
    }
    p.extend_from_slice(&(0x4000 | length as u16).to_be_bytes());
    let pn_offset = p.len();
    p.extend_from_slice(&pn.to_be_bytes());
    let mut nonce = keys.iv;
    for (i, b) in u64::from(pn).to_be_bytes().iter().enumerate() {
        nonce[4 + i] ^= b;
    }
    let aead = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &keys.key).ok()?);
    aead.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&p[..]), &mut payload).ok()?;
    p.extend_from_slice(&payload);
    let mask =
        HeaderProtectionKey::new(&AES_128, &keys.hp).ok()?.new_mask(p.get(pn_offset + 4..pn_offset + 20)?).ok()?;
    p[0] ^= mask[0] & 0x0f;
    for i in 0..4 {
        p[pn_offset + i] ^= mask[1 + i];
    }
    Some(p)
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    // RFC 9000 §16.
    match v {
        0..=63 => out.push(v as u8),
        64..=16383 => out.extend_from_slice(&(0x4000 | v as u16).to_be_bytes()),
        16384..=0x3fff_ffff => out.extend_from_slice(&(0x8000_0000 | v as u32).to_be_bytes()),
        _ => out.extend_from_slice(&(0xc000_0000_0000_0000 | v).to_be_bytes()),
    }
}

/// Whether the frames of an Initial payload include CRYPTO at offset 0 before the
/// first frame that does not parse or may not appear in an Initial (RFC 9000 §12.4).
fn crypto_at_zero(mut f: &[u8]) -> bool {
    fn varint(f: &mut &[u8]) -> Option<u64> {
        let (v, n) = read_varint(f)?;
        *f = f.get(n..)?;
        Some(v)
    }
    fn skip(f: &mut &[u8], n: u64) -> Option<()> {
        *f = f.get(usize::try_from(n).ok()?..)?;
        Some(())
    }
    let step = |f: &mut &[u8]| -> Option<bool> {
        match varint(f)? {
            // PADDING, PING.
            0x00 | 0x01 => Some(false),
            // ACK (RFC 9000 §19.3), 0x03 with ECN counts.
            ty @ (0x02 | 0x03) => {
                varint(f)?;
                varint(f)?;
                let ranges = varint(f)?;
                varint(f)?;
                for _ in 0..ranges {
                    varint(f)?;
                    varint(f)?;
                }
                if ty == 0x03 {
                    for _ in 0..3 {
                        varint(f)?;
                    }
                }
                Some(false)
            }
            // CRYPTO (RFC 9000 §19.6).
            0x06 => {
                let offset = varint(f)?;
                let len = varint(f)?;
                skip(f, len)?;
                Some(offset == 0)
            }
            // CONNECTION_CLOSE of the transport (RFC 9000 §19.19).
            0x1c => {
                varint(f)?;
                varint(f)?;
                let len = varint(f)?;
                skip(f, len)?;
                Some(false)
            }
            _ => None,
        }
    };
    while !f.is_empty() {
        // PADDING runs (most of a padded Initial) in one go.
        let pad = f.iter().position(|&b| b != 0).unwrap_or(f.len());
        f = &f[pad..];
        if f.is_empty() {
            break;
        }
        match step(&mut f) {
            Some(true) => return true,
            Some(false) => {}
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        // PADDING, PING, ACK, CRYPTO at 0.
        assert!(crypto_at_zero(&[0, 0, 1, 2, 0, 0, 0, 0, 6, 0, 1, 0xaa]));
        // CRYPTO at offset 5 (a second ClientHello after HRR), then padding.
        assert!(!crypto_at_zero(&[6, 5, 1, 0xaa, 0, 0]));
        // ACK with ECN only.
        assert!(!crypto_at_zero(&[3, 1, 0, 0, 0, 1, 2, 3]));
        // An unknown frame stops the scan (quinn stops there too).
        assert!(!crypto_at_zero(&[0x08, 6, 0, 1, 0xaa]));
        // Truncated CRYPTO.
        assert!(!crypto_at_zero(&[6, 0, 9, 0xaa]));
    }

    #[test]
    fn garbage_does_not_open() {
        let mut g = vec![0xc0, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0x44, 0xd0];
        g.resize(1200, 7);
        assert_eq!(starts_connection(&g), None);
        assert_eq!(starts_connection(&[0x40, 1, 2]), None);
    }

    #[test]
    fn built_initials_round_trip() {
        let dcid = [9u8; 12];
        // A ClientHello's first CRYPTO frame: starts a connection.
        let ch = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
        assert_eq!(ch.len(), 1200);
        assert_eq!(starts_connection(&ch), Some(true));
        // An ACK-only Initial after the server's first flight: does not.
        let ack = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 1, &[2, 0, 0, 0, 0], 1200).unwrap();
        assert_eq!(starts_connection(&ack), Some(false));
        // Coalesced: a PING Initial first, the ClientHello second: starts one.
        let ping = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[1], 0).unwrap();
        let ch2 = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 1, &[6, 0, 3, 1, 2, 3], 0).unwrap();
        assert_eq!(starts_connection(&[ping.clone(), ch2.clone()].concat()), Some(true));
        // ... but not when the second one has another DCID (RFC 9000 §12.2).
        let other = build_client_initial(VERSION_1, &[8; 12], &[1; 8], &[], 1, &[6, 0, 3, 1, 2, 3], 0).unwrap();
        assert_eq!(starts_connection(&[ping, other].concat()), Some(false));
        // v2.
        let v2 = build_client_initial(VERSION_2, &dcid, &[], &[5; 30], 0, &[6, 0, 1, 0xaa], 1200).unwrap();
        assert_eq!(starts_connection(&v2), Some(true));
        // A flipped payload bit: does not open.
        let mut bad = ch;
        bad[100] ^= 1;
        assert_eq!(starts_connection(&bad), None);
        // Parsed by the header parser as the same Initial.
        let Ok(crate::header::Header::Long(h)) = crate::header::parse(&v2, 12) else { panic!() };
        assert_eq!((h.dcid, h.token.len(), h.packet_len), (&dcid[..], 30, 1200));
    }
}
