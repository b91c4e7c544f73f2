//! `proto::header::parse` against the RFC example packets, every truncation of them,
//! hand-picked boundary cases, and a reference parser over random input.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use aws_lc_rs::aead::{self, quic as hp, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::hkdf;
use common::refparse::{ref_parse, ref_varint};
use common::{hex, vectors::*};
use proptest::prelude::*;
use proto::header::{self, parse, read_varint, Header, HeaderError, LongHeader, LongType};

const V1: u32 = 0x0000_0001;
const V2: u32 = 0x6b33_43cf;

// ---------------------------------------------------------------------------------
// The vectors are the RFCs' bytes: prove it by opening them.
// ---------------------------------------------------------------------------------

struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// RFC 8446 §7.1 HKDF-Expand-Label with an empty context.
fn expand_label(secret: &[u8], label: &str, len: usize) -> Vec<u8> {
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let full = format!("tls13 {label}");
    let mut info = vec![(len >> 8) as u8, len as u8, full.len() as u8];
    info.extend_from_slice(full.as_bytes());
    info.push(0);
    let info_ref = [info.as_slice()];
    let okm = prk.expand(&info_ref, Len(len)).unwrap();
    let mut out = vec![0; len];
    okm.fill(&mut out).unwrap();
    out
}

/// RFC 9001 §5.2 (v1) / RFC 9369 §3.3.1-2 (v2): Initial key, IV and HP key of one side.
fn initial_keys(version: u32, dcid: &[u8], server: bool) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (salt, prefix) = if version == V2 {
        (hex("0dede3def700a6db819381be6e269dcbf9bd2ed9"), "quicv2 ")
    } else {
        (hex("38762cf7f55934b34d179ae6a4c80cadccbb7f0a"), "quic ")
    };
    let initial = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(dcid);
    // `Prk` does not expose its bytes: expand the side secret through a helper key type.
    let side = if server { "server in" } else { "client in" };
    let full = format!("tls13 {side}");
    let mut info = vec![0u8, 32, full.len() as u8];
    info.extend_from_slice(full.as_bytes());
    info.push(0);
    let info_ref = [info.as_slice()];
    let mut secret = [0u8; 32];
    initial.expand(&info_ref, Len(32)).unwrap().fill(&mut secret).unwrap();
    (
        expand_label(&secret, &format!("{prefix}key"), 16),
        expand_label(&secret, &format!("{prefix}iv"), 12),
        expand_label(&secret, &format!("{prefix}hp"), 16),
    )
}

/// Removes header protection (RFC 9001 §5.4) and opens the AEAD (§5.3) of a long
/// header packet whose packet number starts at `pn_offset`; returns the plaintext.
fn open_initial(packet: &[u8], version: u32, server: bool, pn_offset: usize) -> Vec<u8> {
    let (key, iv, hpk) = initial_keys(version, &hex(CLIENT_DCID), server);
    let mut p = packet.to_vec();
    let sample = &p[pn_offset + 4..pn_offset + 20];
    let mask = hp::HeaderProtectionKey::new(&hp::AES_128, &hpk).unwrap().new_mask(sample).unwrap();
    p[0] ^= mask[0] & 0x0f; // long header: low four bits
    let pn_len = usize::from(p[0] & 0x03) + 1;
    let mut pn: u64 = 0;
    for i in 0..pn_len {
        p[pn_offset + i] ^= mask[1 + i];
        pn = (pn << 8) | u64::from(p[pn_offset + i]);
    }
    let mut nonce = [0u8; 12];
    nonce.copy_from_slice(&iv);
    for (i, b) in pn.to_be_bytes().iter().enumerate() {
        nonce[4 + i] ^= b;
    }
    let hdr_len = pn_offset + pn_len;
    let (hdr, body) = p.split_at_mut(hdr_len);
    let k = LessSafeKey::new(UnboundKey::new(&aead::AES_128_GCM, &key).unwrap());
    let plain = k
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&*hdr), body)
        .expect("AEAD open failed: the packet is not the RFC's byte for byte");
    plain.to_vec()
}

/// RFC 9001 §5.8 (v1) / RFC 9369 §3.3.3 (v2): recomputes the Retry Integrity Tag.
fn retry_tag_ok(packet: &[u8], version: u32) -> bool {
    let (key, nonce) = if version == V2 {
        (hex("8fb4b01b56ac48e260fbcbcead7ccc92"), hex("d86969bc2d7c6d9990efb04a"))
    } else {
        (hex("be0c690b9f66575a1d766b54e368c84e"), hex("461599d35d632bf2239825bb"))
    };
    let odcid = hex(CLIENT_DCID);
    let (body, tag) = packet.split_at(packet.len() - 16);
    let mut pseudo = vec![odcid.len() as u8];
    pseudo.extend_from_slice(&odcid);
    pseudo.extend_from_slice(body);
    let k = LessSafeKey::new(UnboundKey::new(&aead::AES_128_GCM, &key).unwrap());
    let mut n = [0u8; 12];
    n.copy_from_slice(&nonce);
    let computed = k.seal_in_place_separate_tag(Nonce::assume_unique_for_key(n), Aad::from(pseudo), &mut []).unwrap();
    computed.as_ref() == tag
}

#[test]
fn rfc_vectors_are_authentic() {
    // RFC 9001 Appendix A.2: the plaintext is a CRYPTO frame (06 00 40f1) with a
    // ClientHello (01 0000ed 0303 …), then PADDING.
    let p = open_initial(&hex(RFC9001_A2_CLIENT_INITIAL), V1, false, 18);
    assert_eq!(&p[..8], &hex("060040f1010000ed")[..]);
    // RFC 9369 Appendix A.2: the same frames under v2 keys.
    let p = open_initial(&hex(RFC9369_A2_CLIENT_INITIAL), V2, false, 18);
    assert_eq!(&p[..8], &hex("060040f1010000ed")[..]);
    // RFC 9001 Appendix A.3 / RFC 9369 Appendix A.3: ACK (02 00 00 00 00) then
    // CRYPTO (06 00 405a) with the ServerHello (02 000056).
    for (v, pkt) in [(V1, RFC9001_A3_SERVER_INITIAL), (V2, RFC9369_A3_SERVER_INITIAL)] {
        let p = open_initial(&hex(pkt), v, true, 18);
        assert_eq!(&p[..12], &hex("02000000000600405a020000")[..]);
    }
    // RFC 9001 Appendix A.4 / RFC 9369 Appendix A.4.
    assert!(retry_tag_ok(&hex(RFC9001_A4_RETRY), V1));
    assert!(retry_tag_ok(&hex(RFC9369_A4_RETRY), V2));
    // And the check can fail: one flipped bit breaks it.
    let mut bad = hex(RFC9001_A4_RETRY);
    bad[20] ^= 1;
    assert!(!retry_tag_ok(&bad, V1));
}

// ---------------------------------------------------------------------------------
// Every field of every example.
// ---------------------------------------------------------------------------------

fn long(d: &[u8]) -> LongHeader<'_> {
    match parse(d, 12) {
        Ok(Header::Long(l)) => l,
        other => panic!("expected a v1/v2 long header, got {other:?}"),
    }
}

#[test]
fn rfc9001_a2_client_initial() {
    let d = hex(RFC9001_A2_CLIENT_INITIAL);
    assert_eq!(d.len(), 1200);
    let l = long(&d);
    assert_eq!(l.version, V1);
    assert_eq!(l.ty, LongType::Initial);
    assert_eq!(l.dcid, &hex(CLIENT_DCID)[..]);
    assert_eq!(l.scid, b"");
    assert_eq!(l.token, b"");
    // Header is 18 bytes (1 + 4 + 1 + 8 + 1 + 1 token length + 2 Length) and
    // Length = 0x449e = 1182: the packet fills the 1200-byte datagram.
    assert_eq!(l.packet_len, 18 + 0x049e);
    assert_eq!(l.packet_len, 1200);
    assert_eq!(parse(&d, 12).unwrap().dcid(), &hex(CLIENT_DCID)[..]);
}

#[test]
fn rfc9369_a2_v2_client_initial() {
    let d = hex(RFC9369_A2_CLIENT_INITIAL);
    assert_eq!(d.len(), 1200);
    assert_eq!(d[0], 0xd7, "RFC 9369 §3.2: Initial is type 0b01 in v2");
    let l = long(&d);
    assert_eq!(l.version, V2);
    assert_eq!(l.ty, LongType::Initial);
    assert_eq!(l.dcid, &hex(CLIENT_DCID)[..]);
    assert_eq!(l.scid, b"");
    assert_eq!(l.token, b"");
    assert_eq!(l.packet_len, 1200);
}

#[test]
fn rfc_server_initials_v1_and_v2() {
    for (pkt, v) in [(RFC9001_A3_SERVER_INITIAL, V1), (RFC9369_A3_SERVER_INITIAL, V2)] {
        let d = hex(pkt);
        let l = long(&d);
        assert_eq!(l.version, v);
        assert_eq!(l.ty, LongType::Initial);
        assert_eq!(l.dcid, b"", "the server's Initial has an empty DCID");
        assert_eq!(l.scid, &hex(SERVER_SCID)[..]);
        assert_eq!(l.token, b"");
        // 18-byte header (1 + 4 + 1 + 0 + 1 + 8 + 1 + 2) + Length 0x4075 = 117.
        assert_eq!(l.packet_len, 18 + 117);
        assert_eq!(d.len(), 135);
    }
}

#[test]
fn rfc_retries_v1_and_v2() {
    for (pkt, v, first) in [(RFC9001_A4_RETRY, V1, 0xff), (RFC9369_A4_RETRY, V2, 0xcf)] {
        let d = hex(pkt);
        assert_eq!(d[0], first);
        let l = long(&d);
        assert_eq!(l.version, v);
        assert_eq!(l.ty, LongType::Retry);
        assert_eq!(l.dcid, b"");
        assert_eq!(l.scid, &hex(SERVER_SCID)[..]);
        assert_eq!(l.token, b"token");
        assert_eq!(l.packet_len, d.len());
        assert_eq!(d.len(), 15 + 5 + 16, "15-byte header, \"token\", 16-byte tag");
    }
}

#[test]
fn coalesced_trailing_bytes_do_not_change_packet_len() {
    // RFC 9000 §12.2: the Length field lets a receiver find the next packet.
    for pkt in [RFC9001_A3_SERVER_INITIAL, RFC9369_A3_SERVER_INITIAL] {
        let mut d = hex(pkt);
        d.extend_from_slice(&[0x40; 50]);
        assert_eq!(long(&d).packet_len, 135);
    }
}

/// Every prefix of every example: an error, or (Retry, which has no Length field and
/// runs to the end of the datagram) a consistent parse. Never a panic.
#[test]
fn every_truncation_of_the_rfc_packets() {
    let all = [
        RFC9001_A2_CLIENT_INITIAL,
        RFC9001_A3_SERVER_INITIAL,
        RFC9001_A4_RETRY,
        RFC9369_A2_CLIENT_INITIAL,
        RFC9369_A3_SERVER_INITIAL,
        RFC9369_A4_RETRY,
    ];
    for pkt in all {
        let d = hex(pkt);
        let full = long(&d);
        for n in 0..d.len() {
            let prefix = &d[..n];
            let got = parse(prefix, 12);
            assert_eq!(got, ref_parse(prefix, 12), "prefix {n} of {pkt:.20}");
            match got {
                Err(e) => {
                    // Cut inside the fixed fields → Truncated; cut inside the
                    // Length-covered part → LengthMismatch.
                    let hdr = if full.ty == LongType::Retry { 15 } else { 18 };
                    let want = if n < hdr { HeaderError::Truncated } else { HeaderError::LengthMismatch };
                    assert_eq!(e, want, "prefix {n}");
                }
                Ok(Header::Long(l)) => {
                    assert_eq!(full.ty, LongType::Retry, "only a Retry parses truncated (prefix {n})");
                    assert!(n >= 15 + 16);
                    assert_eq!((l.version, l.ty, l.dcid, l.scid), (full.version, full.ty, full.dcid, full.scid));
                    assert_eq!(l.token, &d[15..n - 16]);
                    assert_eq!(l.packet_len, n);
                }
                Ok(other) => panic!("prefix {n}: {other:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Hand-picked boundaries.
// ---------------------------------------------------------------------------------

/// A v1/v2 long header with the given fields; `length` is the Length field value and
/// `body` bytes follow it. Varints are written in the minimal encoding.
fn build_long(
    first: u8,
    version: u32,
    dcid: &[u8],
    scid: &[u8],
    token: Option<&[u8]>,
    length: u64,
    body: usize,
) -> Vec<u8> {
    let mut v = vec![first];
    v.extend_from_slice(&version.to_be_bytes());
    v.push(dcid.len() as u8);
    v.extend_from_slice(dcid);
    v.push(scid.len() as u8);
    v.extend_from_slice(scid);
    if let Some(t) = token {
        put_varint(&mut v, t.len() as u64, 0);
        v.extend_from_slice(t);
    }
    put_varint(&mut v, length, 0);
    v.resize(v.len() + body, 0xab);
    v
}

/// RFC 9000 §16: writes `x` in 1, 2, 4 or 8 bytes (at least `min_len`, at least the
/// minimal length).
fn put_varint(v: &mut Vec<u8>, x: u64, min_len: usize) {
    let need = if x < 1 << 6 {
        1
    } else if x < 1 << 14 {
        2
    } else if x < 1 << 30 {
        4
    } else {
        8
    };
    let len = need.max(min_len);
    let tag: u8 = match len {
        1 => 0,
        2 => 1,
        4 => 2,
        _ => 3,
    };
    let bytes = x.to_be_bytes();
    let mut out = bytes[8 - len..].to_vec();
    out[0] |= tag << 6;
    v.extend_from_slice(&out);
}

#[test]
fn short_header_boundaries() {
    // RFC 9000 §17.3.1 + RFC 9001 §5.4.2: 1 + 12 + 20 bytes is the minimum.
    for first in [0x40u8, 0x41, 0x5f, 0x7f] {
        let mut d = vec![first; 33];
        d[1..13].copy_from_slice(&[9; 12]);
        assert_eq!(parse(&d, 12), Ok(Header::Short { dcid: &[9; 12] }));
        assert_eq!(parse(&d[..32], 12), Err(HeaderError::ShortTooShort));
        assert_eq!(parse(&d[..13], 12), Err(HeaderError::ShortTooShort));
        assert_eq!(parse(&d[..5], 12), Err(HeaderError::ShortTooShort));
        assert_eq!(parse(&d[..1], 12), Err(HeaderError::ShortTooShort));
    }
    for first in [0x00u8, 0x01, 0x3f] {
        assert_eq!(parse(&[first; 64], 12), Err(HeaderError::FixedBitClear));
    }
    assert_eq!(parse(&[], 12), Err(HeaderError::Truncated));
    // Other fixed DCID lengths.
    assert_eq!(parse(&[0x40; 21], 0), Ok(Header::Short { dcid: &[] }));
    assert_eq!(parse(&[0x40; 20], 0), Err(HeaderError::ShortTooShort));
    assert_eq!(parse(&[0x40; 41], 20).map(|h| h.dcid().len()), Ok(20));
}

#[test]
fn length_field_boundaries() {
    let dcid = [1u8; 8];
    for (v, first) in [(V1, 0xc0u8), (V2, 0xd0)] {
        // Length exactly equal to what follows: the packet fills the datagram.
        let d = build_long(first, v, &dcid, &[], Some(b""), 20, 20);
        assert_eq!(long(&d).packet_len, d.len());
        // One byte short: LengthMismatch (RFC 9000 §17.2: Length covers the rest).
        let d = build_long(first, v, &dcid, &[], Some(b""), 21, 20);
        assert_eq!(parse(&d, 12), Err(HeaderError::LengthMismatch));
        // Length 19 cannot hold a 4-byte packet number + 16-byte sample (RFC 9001 §5.4.2).
        let d = build_long(first, v, &dcid, &[], Some(b""), 19, 40);
        assert_eq!(parse(&d, 12), Err(HeaderError::LengthMismatch));
        // Non-minimal varint encodings are valid (RFC 9000 §16).
        let mut d = vec![first];
        d.extend_from_slice(&v.to_be_bytes());
        d.extend_from_slice(&[8, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
        put_varint(&mut d, 3, 8); // token length 3 in 8 bytes
        d.extend_from_slice(b"tok");
        put_varint(&mut d, 25, 4); // Length 25 in 4 bytes
        let hdr = d.len();
        d.resize(hdr + 25, 0);
        let l = long(&d);
        assert_eq!((l.token, l.packet_len), (&b"tok"[..], hdr + 25));
        // A token that runs past the datagram.
        let mut d = build_long(first, v, &dcid, &[], None, 0, 0);
        d.truncate(15);
        put_varint(&mut d, 100, 0);
        d.resize(d.len() + 99, 0);
        assert_eq!(parse(&d, 12), Err(HeaderError::Truncated));
    }
    // Handshake and 0-RTT have no token field (RFC 9000 §17.2.3-4).
    for (v, first, ty) in [
        (V1, 0xe0u8, LongType::Handshake),
        (V1, 0xd0, LongType::ZeroRtt),
        (V2, 0xf0, LongType::Handshake),
        (V2, 0xe0, LongType::ZeroRtt),
    ] {
        let d = build_long(first, v, &dcid, &[2; 3], None, 20, 20);
        let l = long(&d);
        assert_eq!((l.ty, l.token, l.scid, l.packet_len), (ty, &b""[..], &[2u8; 3][..], d.len()));
    }
}

#[test]
fn connection_id_lengths() {
    // RFC 9000 §17.2: at most 20 bytes in v1 (and v2).
    let d = build_long(0xe0, V1, &[1; 20], &[2; 20], None, 20, 20);
    assert_eq!(long(&d).dcid.len(), 20);
    let d = build_long(0xe0, V1, &[1; 21], &[2; 1], None, 20, 20);
    assert_eq!(parse(&d, 12), Err(HeaderError::CidTooLong));
    let d = build_long(0xe0, V1, &[1; 1], &[2; 21], None, 20, 20);
    assert_eq!(parse(&d, 12), Err(HeaderError::CidTooLong));
    // RFC 8999 §5.1: other versions may use up to 255.
    let d = build_long(0xc0, 0xff00_001d, &[1; 255], &[2; 255], None, 0, 0);
    assert_eq!(
        parse(&d, 12),
        Ok(Header::UnsupportedVersion { version: 0xff00_001d, dcid: &[1; 255], scid: &[2; 255] })
    );
    // RFC 9000 §17.2.1: Version Negotiation, whatever the fixed bit.
    let mut d = vec![0x80, 0, 0, 0, 0, 4, 1, 2, 3, 4, 0];
    d.extend_from_slice(&1u32.to_be_bytes());
    assert_eq!(parse(&d, 12), Ok(Header::VersionNegotiation { dcid: &[1, 2, 3, 4], scid: &[] }));
    // Fixed bit clear on a v1 long header.
    let d = build_long(0x80, V1, &[1; 8], &[], Some(b""), 20, 20);
    assert_eq!(parse(&d, 12), Err(HeaderError::FixedBitClear));
    // A Retry shorter than its integrity tag.
    let d = build_long(0xf0, V1, &[1; 8], &[2; 8], None, 0, 0);
    let d = &d[..d.len() - 1]; // drop the Length byte build_long wrote
    let mut d = d.to_vec();
    d.extend_from_slice(&[0; 15]);
    assert_eq!(parse(&d, 12), Err(HeaderError::LengthMismatch));
    d.push(0);
    assert!(matches!(parse(&d, 12), Ok(Header::Long(LongHeader { ty: LongType::Retry, token: b"", .. }))));
}

#[test]
fn varints_match_the_reference() {
    // RFC 9000 Appendix A.1 examples plus every length class boundary.
    for x in [0u64, 37, 63, 64, 15_293, 16_383, 16_384, 494_878_333, (1 << 30) - 1, 1 << 30, (1 << 62) - 1] {
        for min in [1, 2, 4, 8] {
            let mut v = Vec::new();
            put_varint(&mut v, x, min);
            assert_eq!(read_varint(&v), Some((x, v.len())));
            assert_eq!(ref_varint(&v), Some((x, v.len())));
            assert_eq!(read_varint(&v[..v.len() - 1]), None);
        }
    }
    assert_eq!(header::read_varint(&[]), None);
}

// ---------------------------------------------------------------------------------
// Reference parser over random and near-valid input.
// ---------------------------------------------------------------------------------

/// Near-valid datagrams: plausible first bytes, versions, CID lengths around the
/// limits, token and Length varints around the datagram size, then an optional cut
/// and an optional corrupted byte.
fn near_valid() -> impl Strategy<Value = Vec<u8>> {
    let first = prop_oneof![
        any::<u8>(),
        (0u8..4, any::<u8>()).prop_map(|(t, low)| 0xc0 | (t << 4) | (low & 0x0f)),
        any::<u8>().prop_map(|b| 0x40 | (b & 0x3f)),
    ];
    let version = prop_oneof![
        4 => Just(V1),
        4 => Just(V2),
        1 => Just(0u32),
        1 => Just(0xff00_001du32),
        1 => any::<u32>(),
    ];
    let cid_len = prop_oneof![0usize..=8, Just(12usize), 18usize..=22, Just(255usize)];
    let varint_len = prop_oneof![Just(0usize), Just(1), Just(2), Just(4), Just(8)];
    (
        first,
        version,
        cid_len.clone(),
        cid_len,
        (0usize..40, varint_len.clone()),
        (-3i64..=3, prop_oneof![Just(false), Just(true)], varint_len),
        0usize..64,
        proptest::option::of(any::<prop::sample::Index>()),
        proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        any::<u64>(),
    )
        .prop_map(|(first, version, dl, sl, (tok, tmin), (delta, tiny, lmin), extra, cut, flip, seed)| {
            let mut rng = common::rng::Rng::new(seed);
            let mut d = vec![first];
            if first & 0x80 == 0 {
                // Short header: DCID + a payload around the 20-byte sample minimum.
                d.extend(rng.bytes(12 + 17 + extra % 8));
            } else {
                d.extend_from_slice(&version.to_be_bytes());
                d.push(dl as u8);
                d.extend(rng.bytes(dl));
                d.push(sl as u8);
                d.extend(rng.bytes(sl));
                if tmin > 0 {
                    put_varint(&mut d, tok as u64, tmin);
                    d.extend(rng.bytes(tok));
                }
                let body = 20 + extra;
                let length = if tiny { 17 + (delta.unsigned_abs() % 5) } else { (body as i64 + delta).max(0) as u64 };
                if lmin > 0 {
                    put_varint(&mut d, length, lmin);
                }
                d.extend(rng.bytes(body));
            }
            if let Some(c) = cut {
                d.truncate(c.index(d.len() + 1));
            }
            if let Some((at, b)) = flip {
                if !d.is_empty() {
                    let i = at.index(d.len());
                    d[i] = b;
                }
            }
            d
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn matches_reference_on_random_bytes(d in proptest::collection::vec(any::<u8>(), 0..96), n in prop_oneof![Just(12usize), 0usize..=21]) {
        prop_assert_eq!(parse(&d, n), ref_parse(&d, n));
    }

    #[test]
    fn matches_reference_on_near_valid(d in near_valid()) {
        let got = parse(&d, 12);
        prop_assert_eq!(got, ref_parse(&d, 12));
        if let Ok(Header::Long(l)) = got {
            prop_assert!(l.packet_len <= d.len());
        }
    }
}

/// The near-valid generator does reach every outcome (so the property above is not
/// vacuously comparing garbage).
#[test]
fn near_valid_generator_covers_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = near_valid();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let d = strat.new_tree(&mut runner).unwrap().current();
        let tag = match parse(&d, 12) {
            Ok(Header::Long(l)) => format!("{:?}-{}", l.ty, l.version),
            Ok(Header::Short { .. }) => "short".into(),
            Ok(Header::VersionNegotiation { .. }) => "vn".into(),
            Ok(Header::UnsupportedVersion { .. }) => "unsupported".into(),
            Err(e) => format!("{e:?}"),
        };
        seen.insert(tag);
    }
    for want in [
        "Initial-1",
        "ZeroRtt-1",
        "Handshake-1",
        "Retry-1",
        "Initial-1798521807",
        "ZeroRtt-1798521807",
        "Handshake-1798521807",
        "Retry-1798521807",
        "short",
        "vn",
        "unsupported",
        "Truncated",
        "FixedBitClear",
        "CidTooLong",
        "ShortTooShort",
        "LengthMismatch",
    ] {
        assert!(seen.contains(want), "generator never produced {want}: {seen:?}");
    }
}
