//! `proto::initial_protection` (the checks on a client's first Initial before a
//! Retry) against a slow model written here from the RFCs, and end to end on RFC 9001
//! Appendix A.
//!
//! The model shares no code with the module under test: it parses the Initial with
//! plain index arithmetic (RFC 9000 §16, §17.2, §17.2.2), derives keys with HKDF
//! written from RFC 5869 §2.2–2.3 and RFC 8446 §7.1 on aws-lc-rs's HMAC-SHA-256, and
//! applies and removes packet protection with aws-lc-rs's AEADs (RFC 9001 §5.3) and
//! QUIC header-protection keys (§5.4). Before it judges anything, the model is held
//! to the RFC's own bytes: it derives A.1's keys and opens and rebuilds, byte for
//! byte, A.2 (client Initial), A.3 (server Initial) and A.5 (ChaCha20-Poly1305 short
//! header). Then `check`, `parse` and `client_hp_key` must answer as the model does
//! on those packets and on Initials the model protects itself, with every header
//! field, varint width, packet-number length, reserved bit, cut and coalesced tail
//! varied.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use aws_lc_rs::aead::{self, quic as hp, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::hmac;
use common::refparse::ref_varint;
use common::{hex, vectors::*};
use proptest::prelude::*;
use proto::initial_protection::{parse, ClientInitial, InitialProtection, NotRetryable};

const V1: u32 = 0x0000_0001;
const V2: u32 = 0x6b33_43cf;
/// RFC 9001 §5.2: initial_salt of QUIC v1.
const INITIAL_SALT_V1: &str = "38762cf7f55934b34d179ae6a4c80cadccbb7f0a";

// ---------------------------------------------------------------------------------
// The model: key derivation (RFC 5869, RFC 8446 §7.1, RFC 9001 §5.1–5.2)
// ---------------------------------------------------------------------------------

/// RFC 5869 §2.2: PRK = HMAC-Hash(salt, IKM).
fn hkdf_extract(salt: &[u8], ikm: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, salt), ikm).as_ref().to_vec()
}

/// RFC 5869 §2.3: T(i) = HMAC-Hash(PRK, T(i-1) | info | i), OKM = the first L bytes
/// of T(1) | T(2) | …
fn hkdf_expand(prk: &[u8], info: &[u8], len: usize) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, prk);
    let (mut okm, mut t) = (Vec::new(), Vec::new());
    let mut i = 1u8;
    while okm.len() < len {
        let mut m = t.clone();
        m.extend_from_slice(info);
        m.push(i);
        t = hmac::sign(&key, &m).as_ref().to_vec();
        okm.extend_from_slice(&t);
        i += 1;
    }
    okm.truncate(len);
    okm
}

/// RFC 8446 §7.1: HkdfLabel { uint16 length; opaque label<7..255> = "tls13 " + Label;
/// opaque context<0..255> } with an empty context.
fn hkdf_label(label: &str, len: usize) -> Vec<u8> {
    let full = format!("tls13 {label}");
    let mut out = u16::try_from(len).unwrap().to_be_bytes().to_vec();
    out.push(u8::try_from(full.len()).unwrap());
    out.extend_from_slice(full.as_bytes());
    out.push(0);
    out
}

fn expand_label(secret: &[u8], label: &str, len: usize) -> Vec<u8> {
    hkdf_expand(secret, &hkdf_label(label, len), len)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// RFC 9001 §5.2: initial_secret = HKDF-Extract(initial_salt, client_dst_connection_id).
fn initial_secret(dcid: &[u8]) -> Vec<u8> {
    hkdf_extract(&hex(INITIAL_SALT_V1), dcid)
}

/// RFC 9001 §5.2: client_initial_secret / server_initial_secret.
fn side_secret(dcid: &[u8], side: Side) -> Vec<u8> {
    let label = if side == Side::Client { "client in" } else { "server in" };
    expand_label(&initial_secret(dcid), label, 32)
}

/// A packet-protection key, IV and header-protection key (RFC 9001 §5.1).
struct Keys {
    key: Vec<u8>,
    iv: Vec<u8>,
    hp: Vec<u8>,
}

fn keys_from_secret(secret: &[u8], key_len: usize) -> Keys {
    Keys {
        key: expand_label(secret, "quic key", key_len),
        iv: expand_label(secret, "quic iv", 12),
        hp: expand_label(secret, "quic hp", key_len),
    }
}

/// RFC 9001 §5.2: Initial packets use AEAD_AES_128_GCM and AES-128 header protection.
fn initial_keys(dcid: &[u8], side: Side) -> Keys {
    keys_from_secret(&side_secret(dcid, side), 16)
}

/// The AEAD and header-protection algorithm of a packet's keys.
#[derive(Clone, Copy)]
enum Suite {
    Aes128Gcm,
    ChaCha20Poly1305,
}

impl Suite {
    fn aead(self) -> &'static aead::Algorithm {
        match self {
            Suite::Aes128Gcm => &aead::AES_128_GCM,
            Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
    fn hp(self) -> &'static hp::Algorithm {
        match self {
            Suite::Aes128Gcm => &hp::AES_128,
            Suite::ChaCha20Poly1305 => &hp::CHACHA20,
        }
    }
}

/// RFC 9001 §5.4.3 / §5.4.4: the five mask bytes for a 16-byte sample.
fn mask(suite: Suite, hp_key: &[u8], sample: &[u8]) -> [u8; 5] {
    hp::HeaderProtectionKey::new(suite.hp(), hp_key).unwrap().new_mask(sample).unwrap()
}

/// RFC 9001 §5.3: the nonce is the IV XORed with the packet number, left-padded.
fn nonce(iv: &[u8], pn: u64) -> Nonce {
    let mut n = [0u8; 12];
    n.copy_from_slice(iv);
    for (b, p) in n[4..].iter_mut().zip(pn.to_be_bytes()) {
        *b ^= p;
    }
    Nonce::assume_unique_for_key(n)
}

/// The header bits header protection covers (RFC 9001 §5.4.1): four in a long header,
/// five in a short one.
fn first_byte_mask(first: u8) -> u8 {
    if first & 0x80 != 0 {
        0x0f
    } else {
        0x1f
    }
}

/// Protects a packet (RFC 9001 §5.3, then §5.4.1): `header` is the unprotected header
/// through the encoded packet number, which starts at `pn_offset`; `pn` is the full
/// packet number. When the packet is too short for a sample (RFC 9001 §5.4.2) the
/// header is left unprotected, as no sender would send it.
fn seal(header: &[u8], pn_offset: usize, pn: u64, payload: &[u8], keys: &Keys, suite: Suite) -> Vec<u8> {
    let k = LessSafeKey::new(UnboundKey::new(suite.aead(), &keys.key).unwrap());
    let mut body = payload.to_vec();
    let tag = k.seal_in_place_separate_tag(nonce(&keys.iv, pn), Aad::from(header), &mut body).unwrap();
    let mut p = header.to_vec();
    p.extend_from_slice(&body);
    p.extend_from_slice(tag.as_ref());
    let pn_len = usize::from(header[0] & 0x03) + 1;
    let sample_at = pn_offset + 4;
    if let Some(sample) = p.get(sample_at..sample_at + 16) {
        let m = mask(suite, &keys.hp, sample);
        p[0] ^= m[0] & first_byte_mask(p[0]);
        for i in 0..pn_len {
            p[pn_offset + i] ^= m[1 + i];
        }
    }
    p
}

/// RFC 9000 Appendix A.3: the full packet number from a truncated one.
fn decode_pn(largest_pn: Option<u64>, truncated: u64, pn_nbits: u32) -> u64 {
    let expected = largest_pn.map_or(0, |l| l + 1);
    let win = 1u64 << pn_nbits;
    let (hwin, mask) = (win / 2, win - 1);
    let candidate = (expected & !mask) | truncated;
    if candidate + hwin <= expected && candidate < (1 << 62) - win {
        candidate + win
    } else if candidate > expected + hwin && candidate >= win {
        candidate - win
    } else {
        candidate
    }
}

/// Removes protection (RFC 9001 §5.4.1, then §5.3): (unprotected header through the
/// packet number, full packet number, plaintext); `None` when the AEAD does not open.
fn open(
    packet: &[u8],
    pn_offset: usize,
    largest_pn: Option<u64>,
    keys: &Keys,
    suite: Suite,
) -> Option<(Vec<u8>, u64, Vec<u8>)> {
    let mut p = packet.to_vec();
    let sample_at = pn_offset + 4;
    let m = mask(suite, &keys.hp, p.get(sample_at..sample_at + 16)?);
    p[0] ^= m[0] & first_byte_mask(p[0]);
    let pn_len = usize::from(p[0] & 0x03) + 1;
    let mut truncated = 0u64;
    for i in 0..pn_len {
        p[pn_offset + i] ^= m[1 + i];
        truncated = (truncated << 8) | u64::from(p[pn_offset + i]);
    }
    let pn = decode_pn(largest_pn, truncated, 8 * pn_len as u32);
    let (header, body) = p.split_at_mut(pn_offset + pn_len);
    let k = LessSafeKey::new(UnboundKey::new(suite.aead(), &keys.key).unwrap());
    let plain = k.open_in_place(nonce(&keys.iv, pn), Aad::from(&*header), body).ok()?.to_vec();
    Some((header.to_vec(), pn, plain))
}

// ---------------------------------------------------------------------------------
// The model: the Initial header and the checks before a Retry
// ---------------------------------------------------------------------------------

/// The cleartext fields of a client Initial, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fields {
    version: u32,
    dcid: Vec<u8>,
    scid: Vec<u8>,
    token: Vec<u8>,
    pn_offset: usize,
    packet_len: usize,
}

impl From<ClientInitial<'_>> for Fields {
    fn from(c: ClientInitial<'_>) -> Fields {
        Fields {
            version: c.version,
            dcid: c.dcid.to_vec(),
            scid: c.scid.to_vec(),
            token: c.token.to_vec(),
            pn_offset: c.pn_offset,
            packet_len: c.packet_len,
        }
    }
}

/// RFC 9000 §17.2 and §17.2.2: the first packet of `d` as a v1 Initial, or `None`.
/// Header Form 1, Fixed Bit 1 (a v1 server that never greases it, RFC 9287, drops a
/// packet without it), Long Packet Type 0b00 (Table 5); version 1; connection IDs of
/// at most 20 bytes (§17.2: a longer one in v1 is dropped); every field, and the
/// Length's packet, inside the datagram.
fn model_parse(d: &[u8]) -> Option<Fields> {
    if d.len() < 6 {
        return None;
    }
    let first = d[0];
    let long_form = first & 0x80 != 0;
    let fixed_bit = first & 0x40 != 0;
    let packet_type = (first >> 4) & 0x03;
    if !long_form || !fixed_bit || packet_type != 0 {
        return None;
    }
    let version = u32::from_be_bytes([d[1], d[2], d[3], d[4]]);
    if version != V1 {
        return None;
    }
    let dcid_len = usize::from(d[5]);
    let dcid_end = 6 + dcid_len;
    if dcid_len > 20 || d.len() < dcid_end + 1 {
        return None;
    }
    let scid_len = usize::from(d[dcid_end]);
    let scid_end = dcid_end + 1 + scid_len;
    if scid_len > 20 || d.len() < scid_end {
        return None;
    }
    let (token_len, n) = ref_varint(&d[scid_end..])?;
    let token_start = scid_end + n;
    if token_len > (d.len() - token_start) as u64 {
        return None;
    }
    let token_end = token_start + token_len as usize;
    let (length, n) = ref_varint(&d[token_end..])?;
    let pn_offset = token_end + n;
    if length > (d.len() - pn_offset) as u64 {
        return None;
    }
    Some(Fields {
        version,
        dcid: d[6..dcid_end].to_vec(),
        scid: d[dcid_end + 1..scid_end].to_vec(),
        token: d[token_start..token_end].to_vec(),
        pn_offset,
        packet_len: pn_offset + length as usize,
    })
}

/// What quinn checks before it may Retry a first Initial, in its order (as
/// `InitialProtection::check` documents it): a v1 Initial at all; a datagram of at
/// least 1200 bytes (RFC 9000 §14.1); a DCID of at least 8 bytes (§7.2); a 16-byte
/// sample 4 bytes after the packet-number offset, inside the packet (RFC 9001
/// §5.4.2); the reserved bits 0x0c zero once the client's header protection is off
/// (RFC 9000 §17.2, RFC 9001 §5.4.1).
fn model_check(d: &[u8]) -> Result<Fields, NotRetryable> {
    let f = model_parse(d).ok_or(NotRetryable::Malformed)?;
    if d.len() < 1200 {
        return Err(NotRetryable::Short);
    }
    if f.dcid.len() < 8 {
        return Err(NotRetryable::ShortDcid);
    }
    let sample_at = f.pn_offset + 4;
    if sample_at + 16 > f.packet_len {
        return Err(NotRetryable::NoSample);
    }
    let m = mask(Suite::Aes128Gcm, &initial_keys(&f.dcid, Side::Client).hp, &d[sample_at..sample_at + 16]);
    if (d[0] ^ (m[0] & 0x0f)) & 0x0c != 0 {
        return Err(NotRetryable::ReservedBits);
    }
    Ok(f)
}

/// The code under test, owned.
fn check(d: &[u8]) -> Result<Fields, NotRetryable> {
    InitialProtection::new().check(d).map(Fields::from)
}

// ---------------------------------------------------------------------------------
// The model against RFC 9001 Appendix A
// ---------------------------------------------------------------------------------

/// RFC 9001 Appendix A.2: the CRYPTO frame of the client Initial (then PADDING to
/// 1162 bytes).
const A2_CRYPTO_FRAME: &str = "
    060040f1010000ed0303ebf8fa56f129 39b9584a3896472ec40bb863cfd3e868
    04fe3a47f06a2b69484c000004130113 02010000c000000010000e00000b6578
    616d706c652e636f6dff01000100000a 00080006001d00170018001000070005
    04616c706e0005000501000000000033 00260024001d00209370b2c9caa47fba
    baf4559fedba753de171fa71f50f1ce1 5d43e994ec74d748002b000302030400
    0d0010000e0403050306030203080408 050806002d00020101001c0002400100
    3900320408ffffffffffffffff050480 00ffff07048000ffff08011001048000
    75300901100f088394c8f03e51570806 048000ffff";
/// RFC 9001 Appendix A.2: the unprotected header (packet number 2 in 4 bytes).
const A2_HEADER: &str = "c300000001088394c8f03e5157080000449e00000002";
/// RFC 9001 Appendix A.3: the server Initial's payload (ACK, CRYPTO, no PADDING).
const A3_PAYLOAD: &str = "
    02000000000600405a020000560303ee fce7f7b37ba1d1632e96677825ddf739
    88cfc79825df566dc5430b9a045a1200 130100002e00330024001d00209d3c94
    0d89690b84d08a60993c144eca684d10 81287c834d5311bcf32bb9da1a002b00
    020304";
/// RFC 9001 Appendix A.3: its unprotected header (packet number 1 in 2 bytes).
const A3_HEADER: &str = "c1000000010008f067a5502a4262b50040750001";
/// RFC 9001 Appendix A.5: the application secret and the protected short-header packet.
const A5_SECRET: &str = "9ac312a7f877468ebe69422748ad00a1 5443f18203a07d6060f688f30f21632b";
const A5_PACKET: &str = "4cfe4189655e5cd55c41f69080575d7999c25a5bfb";
const A5_PN: u64 = 654_360_564;

/// RFC 9001 Appendix A.1: the labels, the initial secret, and both sides' keys.
#[test]
fn model_derives_the_rfc9001_a1_keys() {
    assert_eq!(hkdf_label("client in", 32), hex("00200f746c73313320636c69656e7420696e00"));
    assert_eq!(hkdf_label("server in", 32), hex("00200f746c7331332073657276657220696e00"));
    assert_eq!(hkdf_label("quic key", 16), hex("00100e746c7331332071756963206b657900"));
    assert_eq!(hkdf_label("quic iv", 12), hex("000c0d746c733133207175696320697600"));
    assert_eq!(hkdf_label("quic hp", 16), hex("00100d746c733133207175696320687000"));
    let dcid = hex(CLIENT_DCID);
    assert_eq!(initial_secret(&dcid), hex("7db5df06e7a69e432496adedb00851923595221596ae2ae9fb8115c1e9ed0a44"));
    // (side, its secret, key, iv, hp).
    let sides = [
        (
            Side::Client,
            "c00cf151ca5be075ed0ebfb5c80323c42d6b7db67881289af4008f1f6c357aea",
            "1f369613dd76d5467730efcbe3b1a22d",
            "fa044b2f42a3fd3b46fb255c",
            "9f50449e04a0e810283a1e9933adedd2",
        ),
        (
            Side::Server,
            "3c199828fd139efd216c155ad844cc81fb82fa8d7446fa7d78be803acdda951b",
            "cf3a5331653c364c88f0f379b6067e37",
            "0ac1493ca1905853b0bba03e",
            "c206b8d9b9f0f37644430b490eeaa314",
        ),
    ];
    for (side, secret, key, iv, hp) in sides {
        assert_eq!(side_secret(&dcid, side), hex(secret), "{side:?}");
        let k = initial_keys(&dcid, side);
        assert_eq!((k.key, k.iv, k.hp), (hex(key), hex(iv), hex(hp)), "{side:?}");
    }
}

/// RFC 9001 Appendix A.2, end to end: the model parses the protected client Initial,
/// finds the RFC's sample and mask, opens it to the RFC's header, packet number and
/// CRYPTO frame plus PADDING, and protects that again into the very same 1200 bytes.
#[test]
fn model_opens_and_rebuilds_rfc9001_a2() {
    let packet = hex(RFC9001_A2_CLIENT_INITIAL);
    let dcid = hex(CLIENT_DCID);
    let f = model_parse(&packet).unwrap();
    assert_eq!(
        f,
        Fields { version: V1, dcid: dcid.clone(), scid: vec![], token: vec![], pn_offset: 18, packet_len: 1200 }
    );
    let keys = initial_keys(&dcid, Side::Client);
    assert_eq!(&packet[22..38], &hex("d1b1c98dd7689fb8ec11d242b123dc9b")[..], "the sample");
    assert_eq!(mask(Suite::Aes128Gcm, &keys.hp, &packet[22..38]).to_vec(), hex("437b9aec36"));
    let (header, pn, plain) = open(&packet, 18, None, &keys, Suite::Aes128Gcm).unwrap();
    assert_eq!((header.clone(), pn), (hex(A2_HEADER), 2));
    let mut frames = hex(A2_CRYPTO_FRAME);
    frames.resize(1162, 0);
    assert_eq!(plain, frames);
    assert_eq!(seal(&header, 18, pn, &plain, &keys, Suite::Aes128Gcm), packet);
    assert_eq!(model_check(&packet), Ok(f));
    // The server's keys do not open it: the model's open can fail.
    assert!(open(&packet, 18, None, &initial_keys(&dcid, Side::Server), Suite::Aes128Gcm).is_none());
}

/// RFC 9001 Appendix A.3, end to end: the server Initial under the server's keys of
/// the client's DCID.
#[test]
fn model_opens_and_rebuilds_rfc9001_a3() {
    let packet = hex(RFC9001_A3_SERVER_INITIAL);
    let f = model_parse(&packet).unwrap();
    let want =
        Fields { version: V1, dcid: vec![], scid: hex(SERVER_SCID), token: vec![], pn_offset: 18, packet_len: 135 };
    assert_eq!(f, want);
    let keys = initial_keys(&hex(CLIENT_DCID), Side::Server);
    assert_eq!(&packet[22..38], &hex("2cd0991cd25b0aac406a5816b6394100")[..], "the sample");
    assert_eq!(mask(Suite::Aes128Gcm, &keys.hp, &packet[22..38]).to_vec(), hex("2ec0d8356a"));
    let (header, pn, plain) = open(&packet, 18, None, &keys, Suite::Aes128Gcm).unwrap();
    assert_eq!((header.clone(), pn, plain.clone()), (hex(A3_HEADER), 1, hex(A3_PAYLOAD)));
    assert_eq!(seal(&header, 18, pn, &plain, &keys, Suite::Aes128Gcm), packet);
}

/// RFC 9001 Appendix A.5: the model's HKDF-Expand-Label at 32 bytes, the ChaCha20
/// header protection of a short header, and RFC 9000 Appendix A.3's packet-number
/// decoding, on the RFC's 21-byte packet.
#[test]
fn model_rebuilds_rfc9001_a5_chacha20_short_header() {
    let secret = hex(A5_SECRET);
    let keys = keys_from_secret(&secret, 32);
    assert_eq!(keys.key, hex("c6d98ff3441c3fe1b2182094f69caa2ed4b716b65488960a7a984979fb23e1c8"));
    assert_eq!(keys.iv, hex("e0459b3474bdd0e44a41c144"));
    assert_eq!(keys.hp, hex("25a282b9e82f06f21f488917a4fc8f1b73573685608597d0efcb076b0ab7a7a4"));
    assert_eq!(
        expand_label(&secret, "quic ku", 32),
        hex("1223504755036d556342ee9361d253421a826c9ecdf3c7148684b36b714881f9")
    );
    let packet = hex(A5_PACKET);
    assert_eq!(seal(&hex("4200bff4"), 1, A5_PN, &[0x01], &keys, Suite::ChaCha20Poly1305), packet);
    let (header, pn, plain) = open(&packet, 1, Some(A5_PN - 1), &keys, Suite::ChaCha20Poly1305).unwrap();
    assert_eq!((header, pn, plain), (hex("4200bff4"), A5_PN, vec![0x01]));
}

// ---------------------------------------------------------------------------------
// The code under test on the RFC's packets
// ---------------------------------------------------------------------------------

/// RFC 9001 Appendix A.1: the client's header-protection key.
#[test]
fn client_hp_key_is_rfc9001_a1() {
    let ip = InitialProtection::new();
    assert_eq!(ip.client_hp_key(&hex(CLIENT_DCID)).to_vec(), hex("9f50449e04a0e810283a1e9933adedd2"));
}

/// RFC 9001 Appendix A.2: the client's first Initial is one quinn would Retry, and
/// `check` and `parse` read its fields as the RFC states them.
#[test]
fn rfc9001_a2_client_initial_is_retryable() {
    let packet = hex(RFC9001_A2_CLIENT_INITIAL);
    let want =
        Fields { version: V1, dcid: hex(CLIENT_DCID), scid: vec![], token: vec![], pn_offset: 18, packet_len: 1200 };
    assert_eq!(check(&packet), Ok(want.clone()));
    assert_eq!(parse(&packet).map(Fields::from), Ok(want.clone()));
    assert_eq!(model_check(&packet), Ok(want.clone()));
    // Coalesced bytes after the packet are not looked at.
    let mut longer = packet.clone();
    longer.extend_from_slice(&[0x5a; 300]);
    assert_eq!(check(&longer), Ok(want.clone()));
    // One byte short: the Length runs past the datagram (parsed first, as quinn does).
    assert_eq!(check(&packet[..1199]), Err(NotRetryable::Malformed));
    // The same header and frames protected again with each reserved bit set, and with
    // every packet-number length: only the reserved bits make it not retryable.
    let keys = initial_keys(&hex(CLIENT_DCID), Side::Client);
    let (header, _, plain) = open(&packet, 18, None, &keys, Suite::Aes128Gcm).unwrap();
    for reserved in 0..4u8 {
        for pn_len in 1..=4usize {
            let mut h = header[..18].to_vec();
            h[0] = 0xc0 | (reserved << 2) | (pn_len as u8 - 1);
            h.extend_from_slice(&2u32.to_be_bytes()[4 - pn_len..]);
            // Length stays 0x449e: 1182 = pn_len + payload + 16 (more PADDING).
            let mut body = plain.clone();
            body.resize(1182 - 16 - pn_len, 0);
            let d = seal(&h, 18, 2, &body, &keys, Suite::Aes128Gcm);
            assert_eq!(d.len(), 1200);
            let got = check(&d);
            assert_eq!(got, model_check(&d), "reserved {reserved:02b}, {pn_len}-byte packet number");
            if reserved == 0 {
                assert_eq!(got, Ok(want.clone()), "{pn_len}-byte packet number");
            } else {
                assert_eq!(got, Err(NotRetryable::ReservedBits), "reserved {reserved:02b}");
            }
        }
    }
}

/// RFC 9001 Appendix A.3: the server's Initial is never retried: as sent it is a
/// 135-byte datagram (RFC 9000 §14.1), and padded to 1200 bytes its DCID is the
/// client's empty SCID (RFC 9000 §7.2).
#[test]
fn rfc9001_a3_server_initial_is_not_retryable() {
    let packet = hex(RFC9001_A3_SERVER_INITIAL);
    assert_eq!(check(&packet), Err(NotRetryable::Short));
    let parsed = parse(&packet).map(Fields::from).unwrap();
    assert_eq!((parsed.dcid.len(), parsed.scid, parsed.packet_len), (0, hex(SERVER_SCID), 135));
    let mut padded = packet.clone();
    padded.resize(1200, 0);
    assert_eq!(check(&padded), Err(NotRetryable::ShortDcid));
    assert_eq!(model_check(&padded), Err(NotRetryable::ShortDcid));
}

/// RFC 9001 Appendix A.5 (a short header), A.4 (a Retry) and RFC 9369 Appendix A.2
/// (a v2 Initial, which quinn 0.11 workers do not speak): none is a v1 Initial.
#[test]
fn other_rfc_packets_are_malformed() {
    let mut v2 = hex(RFC9369_A2_CLIENT_INITIAL);
    for (what, d) in [("A.5", hex(A5_PACKET)), ("A.4", hex(RFC9001_A4_RETRY)), ("RFC 9369 A.2", v2.clone())] {
        assert_eq!(check(&d), Err(NotRetryable::Malformed), "{what}");
        assert_eq!(parse(&d).err(), Some(NotRetryable::Malformed), "{what}");
        assert_eq!(model_check(&d), Err(NotRetryable::Malformed), "{what}");
    }
    // The v2 Initial with version 1 written over its version is still not an Initial:
    // v2's Initial type bits (0b01) are v1's 0-RTT.
    v2[1..5].copy_from_slice(&V1.to_be_bytes());
    assert_eq!(check(&v2), Err(NotRetryable::Malformed));
    assert_eq!(u32::from_be_bytes(hex(RFC9369_A2_CLIENT_INITIAL)[1..5].try_into().unwrap()), V2);
}

// ---------------------------------------------------------------------------------
// The code under test against the model, on Initials the model protects
// ---------------------------------------------------------------------------------

/// RFC 9000 §16: `v` in `width` bytes (1, 2, 4 or 8), or in the smallest width it fits
/// when `width` is too small for it.
fn varint(v: u64, width: usize) -> Vec<u8> {
    let fits = |w: usize| v < 1u64 << (8 * w - 2);
    let w = [1, 2, 4, 8].into_iter().find(|&w| w >= width && fits(w)).unwrap();
    let prefix = match w {
        1 => 0x00,
        2 => 0x40,
        4 => 0x80,
        _ => 0xc0,
    };
    let mut out = v.to_be_bytes()[8 - w..].to_vec();
    out[0] |= prefix;
    out
}

/// A datagram the model builds: a client Initial with the given fields, protected
/// under the client's keys of its DCID, then mangled.
#[derive(Clone, Debug)]
struct Spec {
    /// Header Form, Fixed Bit and Long Packet Type bits of the first byte.
    form: u8,
    reserved: u8,
    version: u32,
    dcid: Vec<u8>,
    scid: Vec<u8>,
    token: Vec<u8>,
    /// Varint widths of Token Length and Length (at least the smallest that fits).
    token_len_width: usize,
    length_width: usize,
    pn_len: usize,
    pn: u32,
    /// The datagram length aimed at with the packet alone (the payload fills it).
    total: usize,
    /// Bytes coalesced after the packet.
    tail: Vec<u8>,
    /// Truncate the datagram to this fraction (per mille) of its length.
    cut: Option<u16>,
    /// XOR one byte of the first 64 with a value.
    flip: Option<(usize, u8)>,
}

impl Spec {
    fn datagram(&self) -> Vec<u8> {
        let mut h = vec![self.form | (self.reserved << 2) | (self.pn_len as u8 - 1)];
        h.extend_from_slice(&self.version.to_be_bytes());
        h.push(self.dcid.len() as u8);
        h.extend_from_slice(&self.dcid);
        h.push(self.scid.len() as u8);
        h.extend_from_slice(&self.scid);
        h.extend_from_slice(&varint(self.token.len() as u64, self.token_len_width));
        h.extend_from_slice(&self.token);
        // Length = packet number + payload + 16-byte tag (RFC 9000 §17.2.2).
        let length_bytes = varint(0, self.length_width).len();
        let fixed = h.len() + length_bytes + self.pn_len + 16;
        let payload = vec![0u8; self.total.saturating_sub(fixed)];
        let length = (self.pn_len + payload.len() + 16) as u64;
        h.extend_from_slice(&varint(length, self.length_width));
        let pn_offset = h.len();
        h.extend_from_slice(&self.pn.to_be_bytes()[4 - self.pn_len..]);
        let pn = u64::from(self.pn) & ((1u64 << (8 * self.pn_len)) - 1);
        let keys = initial_keys(&self.dcid, Side::Client);
        let mut d = seal(&h, pn_offset, pn, &payload, &keys, Suite::Aes128Gcm);
        d.extend_from_slice(&self.tail);
        if let Some((at, x)) = self.flip {
            if let Some(b) = d.get_mut(at) {
                *b ^= x;
            }
        }
        if let Some(per_mille) = self.cut {
            d.truncate(d.len() * usize::from(per_mille) / 1000);
        }
        d
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    let form = prop_oneof![
        30 => Just(0xc0u8),  // a long-header Initial
        1 => Just(0xd0u8),   // 0-RTT
        1 => Just(0xe0u8),   // Handshake
        1 => Just(0xf0u8),   // Retry
        1 => Just(0x80u8),   // fixed bit clear
        1 => Just(0x40u8),   // a short header
    ];
    let version = prop_oneof![30 => Just(V1), 1 => Just(V2), 1 => Just(0u32), 1 => any::<u32>()];
    let cid = || proptest::collection::vec(any::<u8>(), 0..=22);
    let total = prop_oneof![6 => 1190usize..=1260, 1 => 0usize..=1400, 2 => 0usize..=80];
    let tail = prop_oneof![
        3 => Just(vec![]),
        1 => proptest::collection::vec(any::<u8>(), 1..=64),
        2 => (1000usize..=1300).prop_map(|n| vec![0u8; n]), // a short packet, padded
    ];
    let cut = prop_oneof![12 => Just(None), 1 => (0u16..1000).prop_map(Some)];
    let flip = prop_oneof![12 => Just(None), 1 => (0usize..64, 1u8..=255).prop_map(Some)];
    (
        (
            form,
            prop_oneof![2 => Just(0u8), 1 => 1u8..4],
            version,
            cid(),
            cid(),
            proptest::collection::vec(any::<u8>(), 0..=80),
        ),
        (prop_oneof![Just(1usize), Just(2), Just(4), Just(8)], prop_oneof![Just(1usize), Just(2), Just(4), Just(8)]),
        (1usize..=4, any::<u32>(), total, tail, cut, flip),
    )
        .prop_map(
            |(
                (form, reserved, version, dcid, scid, token),
                (token_len_width, length_width),
                (pn_len, pn, total, tail, cut, flip),
            )| Spec {
                form,
                reserved,
                version,
                dcid,
                scid,
                token,
                token_len_width,
                length_width,
                pn_len,
                pn,
                total,
                tail,
                cut,
                flip,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// RFC 9001 §5.2 for any DCID length: the model's key.
    #[test]
    fn client_hp_key_is_the_model(dcid in proptest::collection::vec(any::<u8>(), 0..=40)) {
        prop_assert_eq!(
            InitialProtection::new().client_hp_key(&dcid).to_vec(),
            initial_keys(&dcid, Side::Client).hp
        );
    }

    /// `check` and `parse` answer as the model on every datagram the model builds.
    #[test]
    fn check_and_parse_are_the_model(s in spec()) {
        let d = s.datagram();
        prop_assert_eq!(check(&d), model_check(&d), "{:02x?}", &d[..d.len().min(80)]);
        prop_assert_eq!(parse(&d).map(Fields::from).ok(), model_parse(&d));
    }

    /// ... and on noise behind a v1 Initial's first five bytes.
    #[test]
    fn check_is_the_model_on_noise(first in 0xc0u8..=0xcf, mut d in proptest::collection::vec(any::<u8>(), 5..1400)) {
        d[0] = first;
        d[1..5].copy_from_slice(&V1.to_be_bytes());
        prop_assert_eq!(check(&d), model_check(&d));
    }
}

/// The generator reaches every answer (otherwise the comparison above proves little).
#[test]
fn the_generator_reaches_every_answer() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..2048 {
        let d = spec().new_tree(&mut runner).unwrap().current().datagram();
        let answer = match model_check(&d) {
            Ok(_) => "Ok".to_string(),
            Err(e) => format!("{e:?}"),
        };
        *seen.entry(answer).or_insert(0u32) += 1;
    }
    for want in ["Ok", "Malformed", "Short", "ShortDcid", "NoSample", "ReservedBits"] {
        assert!(seen.get(want).copied().unwrap_or(0) >= 20, "{want} reached too rarely: {seen:?}");
    }
}
