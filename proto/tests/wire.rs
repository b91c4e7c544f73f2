//! The demux → worker frame and the control messages: round trips over every field,
//! truncations, single-byte corruptions, reserved bits.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::rng::Rng;
use proptest::prelude::*;
use proto::cid::{Generation, Prf, ServerId};
use proto::wire::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

// ---------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------

/// A client address: an IPv6 one with any scope id (the frame carries it; the flow
/// label it does not, so that stays zero).
fn client_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        addr(),
        (any::<[u8; 16]>(), any::<u16>(), any::<u32>()).prop_map(|(a, p, scope)| SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(a),
            p,
            0,
            scope
        ))),
    ]
}

fn addr() -> impl Strategy<Value = SocketAddr> {
    // flowinfo and scope_id are not carried for the local address (the worker sends
    // from the address alone): generate them as zero, as SocketAddr::new does.
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(a, p)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), p)),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(a, p)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), p)),
        // IPv4-mapped IPv6 stays IPv6 (the flag says so).
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(a, p)| SocketAddr::new(IpAddr::V6(Ipv4Addr::from(a).to_ipv6_mapped()), p)),
    ]
}

fn frame() -> impl Strategy<Value = (FrameMeta, Vec<u8>)> {
    (
        client_addr(),
        proptest::option::of(addr()),
        0u8..=3,
        prop_oneof![1usize..=1500, Just(MAX_PAYLOAD)],
        any::<u64>(),
        proptest::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(client, local, ecn, len, seed, seg)| {
            let payload = Rng::new(seed).bytes(len);
            let segment_size = seg.map(|i| (i.index(len) + 1) as u16);
            (FrameMeta { client, local, ecn, segment_size }, payload)
        })
}

fn generation() -> impl Strategy<Value = Generation> {
    (0u8..3).prop_map(|g| Generation::new(g).unwrap())
}

fn prf() -> impl Strategy<Value = Prf> {
    prop::sample::select(Prf::ALL.to_vec())
}

fn keys() -> impl Strategy<Value = Keys> {
    (generation(), prf(), any::<[u8; 32]>(), proptest::option::of((1u8..3, prf(), any::<[u8; 32]>()))).prop_map(
        |(g, prf, s, prev)| Keys {
            newest: KeyGen { generation: g, prf, secret: s },
            previous: prev.map(|(off, prf, ps)| KeyGen {
                generation: Generation::new((g.get() + off) % 3).unwrap(),
                prf,
                secret: ps,
            }),
        },
    )
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,40}", "[a-z{}\":, ]{0,300}", Just(String::new())]
}

fn control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (prop_oneof![Just(Role::Worker), Just(Role::DataPlane), Just(Role::Operator)], any::<u32>())
            .prop_map(|(role, pid)| Control::Hello { role, pid }),
        (any::<u16>(), keys(), any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(id, keys, reset_key, token_key)| {
            Control::Assign { server_id: ServerId(id), keys, reset_key, token_key }
        }),
        keys().prop_map(|keys| Control::KeysChanged { keys }),
        Just(Control::Ready),
        Just(Control::Draining),
        (keys(), proptest::collection::vec((any::<u16>(), any::<bool>()), 0..40)).prop_map(|(keys, v)| {
            Control::Table {
                keys,
                instances: v
                    .into_iter()
                    .map(|(id, p)| InstanceState { server_id: ServerId(id), placeable: p })
                    .collect(),
            }
        }),
        any::<u16>().prop_map(|id| Control::DataHello { server_id: ServerId(id) }),
        (any::<u16>(), 0u32..=CAPS_KNOWN).prop_map(|(id, caps)| Control::DataHelloV2 { server_id: ServerId(id), caps }),
        (1u8..=MAX_RINGS, 17u32..=30).prop_map(|(count, shift)| Control::Rings { count, bytes: 1u64 << shift }),
        Just(Control::Rings { count: 0, bytes: 0 }),
        (any::<u32>(), any::<u32>())
            .prop_map(|(handshakes, incoming_bytes)| Control::Load { handshakes, incoming_bytes }),
        proptest::collection::vec(addr(), 0..6).prop_map(|addrs| Control::Sockets { addrs }),
        proptest::collection::vec(addr(), 0..6).prop_map(|addrs| Control::FastSockets { addrs }),
        Just(Control::StatusRequest),
        text().prop_map(|json| Control::Status { json }),
        text().prop_map(|reason| Control::Error { reason }),
        Just(Control::GetSockets),
        proptest::collection::vec(any::<u8>(), 0..=MAX_ODCID_LEN).prop_map(|odcid| Control::HandshakeDone { odcid }),
        (any::<u16>(), any::<u32>()).prop_map(|(id, pid)| Control::Rejoin { server_id: ServerId(id), pid }),
        (
            proptest::option::of(prop_oneof![Just(Prf::HmacSha256), Just(Prf::SipHash24)]),
            any::<bool>(),
            prop_oneof![Just(RotatePhase::Rotate), Just(RotatePhase::Stage), Just(RotatePhase::Activate)],
            proptest::option::of("[a-z/]{0,20}"),
        )
            .prop_map(|(prf, force, phase, from)| Control::RotateKeys { prf, force, phase, from }),
    ]
}

// ---------------------------------------------------------------------------------
// Round trips, truncations, corruptions
// ---------------------------------------------------------------------------------

/// A frame that decoded must re-encode to exactly the bytes it came from.
fn frame_reencodes(rec: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((meta, payload)) = decode_frame(rec) {
        prop_assert_eq!(encode_frame(&meta, payload), rec.to_vec());
    }
    Ok(())
}

fn control_reencodes(rec: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(m) = decode_control(rec) {
        prop_assert_eq!(encode_control(&m), rec.to_vec());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// `Control::name` (what logs print instead of the message) names the variant it
    /// is given, and never prints a field (Assign carries secrets).
    #[test]
    fn control_name_is_the_variant(m in control()) {
        let debug = format!("{m:?}");
        let variant = debug.split(|c: char| !c.is_alphanumeric()).next().unwrap_or_default();
        prop_assert_eq!(m.name(), variant);
    }

    #[test]
    fn frame_round_trip((meta, payload) in frame()) {
        let rec = encode_frame(&meta, &payload);
        prop_assert_eq!(rec.len(), FRAME_HEADER_LEN + payload.len());
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        encode_frame_header(&meta, &mut hdr);
        prop_assert_eq!(&rec[..FRAME_HEADER_LEN], &hdr[..]);
        let (m, p) = decode_frame(&rec).unwrap();
        prop_assert_eq!(m, meta);
        prop_assert_eq!(p, &payload[..]);
    }

    /// Records are SOCK_SEQPACKET-framed: the frame has no payload length, so a cut
    /// inside the payload is not detectable by the decoder (the socket reports
    /// MSG_TRUNC). Every cut inside the 48-byte header is an error; a cut inside the
    /// payload decodes to the same metadata with the shorter payload, or is rejected
    /// when the segment size no longer fits / nothing is left.
    #[test]
    fn frame_truncations((meta, payload) in frame()) {
        let rec = encode_frame(&meta, &payload);
        let cuts: Vec<usize> = (0..=FRAME_HEADER_LEN + 2).chain([rec.len() - 1]).filter(|&n| n < rec.len()).collect();
        for n in cuts {
            match decode_frame(&rec[..n]) {
                Ok((m, p)) => {
                    prop_assert!(n > FRAME_HEADER_LEN, "a cut header decoded ({n} bytes)");
                    prop_assert_eq!(m, meta);
                    prop_assert_eq!(p, &payload[..n - FRAME_HEADER_LEN]);
                }
                Err(e) => {
                    let ok = if n < FRAME_HEADER_LEN {
                        e == WireError::Truncated
                    } else if n == FRAME_HEADER_LEN {
                        e == WireError::EmptyPayload
                    } else {
                        e == WireError::BadSegmentSize
                    };
                    prop_assert!(ok, "cut at {}: {:?}", n, e);
                }
            }
        }
    }

    #[test]
    fn frame_single_byte_corruption((meta, payload) in frame(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
        let mut rec = encode_frame(&meta, &payload);
        let i = at.index(FRAME_HEADER_LEN.min(rec.len()));
        rec[i] = b;
        frame_reencodes(&rec)?;
    }

    #[test]
    fn control_round_trip(m in control()) {
        let rec = encode_control(&m);
        prop_assert_eq!(decode_control(&rec), Ok(m));
    }

    #[test]
    fn control_every_truncation_is_an_error(m in control()) {
        let rec = encode_control(&m);
        for n in 0..rec.len() {
            prop_assert!(decode_control(&rec[..n]).is_err(), "prefix of {} bytes decoded: {:?}", n, decode_control(&rec[..n]));
        }
        // …and so is anything appended.
        let mut longer = rec.clone();
        longer.push(0);
        prop_assert_eq!(decode_control(&longer), Err(WireError::TrailingBytes));
    }

    #[test]
    fn control_single_byte_corruption(m in control(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
        let mut rec = encode_control(&m);
        let i = at.index(rec.len());
        rec[i] = b;
        control_reencodes(&rec)?;
    }

    #[test]
    fn decoders_never_panic_on_random_bytes(rec in proptest::collection::vec(any::<u8>(), 0..120), magic in any::<bool>()) {
        let mut rec = rec;
        if magic && rec.len() >= 3 {
            rec[0] = CONTROL_MAGIC;
            rec[1] = CONTROL_VERSION;
            rec[2] %= 13;
        }
        control_reencodes(&rec)?;
        if magic && rec.len() >= 2 {
            rec[0] = FRAME_MAGIC;
            rec[1] = FRAME_VERSION;
        }
        frame_reencodes(&rec)?;
    }
}

/// Every byte of a few valid encodings set to every value: decodes to something that
/// re-encodes to the same bytes, or is rejected.
#[test]
fn exhaustive_single_byte_corruption() {
    let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 443);
    let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)), 4433);
    let frames = [
        (FrameMeta { client: v4, local: None, ecn: 0, segment_size: None }, vec![1u8; 5]),
        (FrameMeta { client: v6, local: Some(v4), ecn: 2, segment_size: Some(2) }, vec![2u8; 5]),
        (FrameMeta { client: v4, local: Some(v6), ecn: 3, segment_size: Some(5) }, vec![3u8; 5]),
    ];
    for (meta, payload) in &frames {
        let rec = encode_frame(meta, payload);
        for i in 0..rec.len() {
            for b in 0..=255u8 {
                let mut c = rec.clone();
                c[i] = b;
                frame_reencodes(&c).unwrap();
            }
        }
    }
    let k = Keys {
        newest: KeyGen { generation: Generation::new(1).unwrap(), prf: Prf::SipHash24, secret: [7; 32] },
        previous: Some(KeyGen { generation: Generation::new(0).unwrap(), prf: Prf::HmacSha256, secret: [8; 32] }),
    };
    let msgs = [
        Control::Hello { role: Role::Worker, pid: 77 },
        Control::Assign { server_id: ServerId(3), keys: k.clone(), reset_key: [1; 32], token_key: [2; 32] },
        Control::Table {
            keys: k,
            instances: vec![
                InstanceState { server_id: ServerId(1), placeable: true },
                InstanceState { server_id: ServerId(2), placeable: false },
            ],
        },
        Control::Status { json: "{\"é\":1}".into() },
        Control::Sockets {
            addrs: vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 443),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 8443),
            ],
        },
        Control::GetSockets,
        Control::Rejoin { server_id: ServerId(0x1234), pid: 0xdead_beef },
        Control::RotateKeys { prf: None, force: false, phase: RotatePhase::Rotate, from: None },
        Control::RotateKeys { prf: Some(Prf::SipHash24), force: true, phase: RotatePhase::Rotate, from: None },
        Control::RotateKeys { prf: None, force: false, phase: RotatePhase::Stage, from: None },
        Control::RotateKeys { prf: None, force: true, phase: RotatePhase::Activate, from: None },
    ];
    for m in &msgs {
        let rec = encode_control(m);
        for i in 0..rec.len() {
            for b in 0..=255u8 {
                let mut c = rec.clone();
                c[i] = b;
                control_reencodes(&c).unwrap();
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Reserved bits and range checks, one by one.
// ---------------------------------------------------------------------------------

fn sample_frame(local: Option<SocketAddr>) -> Vec<u8> {
    let client = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)), 5000);
    encode_frame(&FrameMeta { client, local, ecn: 1, segment_size: Some(4) }, &[9; 8])
}

#[test]
fn frame_reserved_bits() {
    let base = sample_frame(None);
    assert!(decode_frame(&base).is_ok());
    let with = |i: usize, b: u8| {
        let mut r = base.clone();
        r[i] = b;
        decode_frame(&r).map(|_| ())
    };
    assert_eq!(with(0, 0xd6), Err(WireError::BadMagic));
    assert_eq!(with(1, 1), Err(WireError::UnsupportedVersion(1)), "the layout before the scope id");
    assert_eq!(with(1, 3), Err(WireError::UnsupportedVersion(3)));
    assert_eq!(with(1, 0), Err(WireError::UnsupportedVersion(0)));
    // Flags: only 0x01 (client v6), 0x02 (local), 0x04 (local v6, needs local).
    for bit in [0x08u8, 0x10, 0x20, 0x40, 0x80] {
        assert_eq!(with(2, bit), Err(WireError::ReservedBits), "flag {bit:#x}");
    }
    assert_eq!(with(2, 0x04), Err(WireError::ReservedBits), "local v6 without local");
    assert_eq!(with(2, 0x06), Ok(()), "local v6 with local (address ::, port 0)");
    // ECN is two bits (RFC 3168).
    assert_eq!(with(3, 4), Err(WireError::BadEcn));
    assert_eq!(with(3, 0xff), Err(WireError::BadEcn));
    assert_eq!(with(3, 3), Ok(()));
    // Segment size: 0 means none; larger than the payload is refused.
    assert_eq!(with(5, 0), Ok(()));
    assert_eq!(with(5, 8), Ok(()));
    assert_eq!(with(5, 9), Err(WireError::BadSegmentSize));
    assert_eq!(with(4, 1), Err(WireError::BadSegmentSize));
    // The padding of a v4 client address.
    for i in 12..24 {
        assert_eq!(with(i, 1), Err(WireError::ReservedBits), "client address byte {i}");
    }
    // The local-address block must be zero when there is no local address.
    for i in 24..42 {
        assert_eq!(with(i, 1), Err(WireError::ReservedBits), "local block byte {i}");
    }
    // Trailing reserved bytes.
    assert_eq!(with(42, 1), Err(WireError::ReservedBits));
    assert_eq!(with(43, 0x80), Err(WireError::ReservedBits));
    // A scope id belongs to an IPv6 client only.
    for i in 44..48 {
        assert_eq!(with(i, 1), Err(WireError::ReservedBits), "scope id byte {i} of a v4 client");
    }
    let link_local: SocketAddr = "[fe80::1%7]:443".parse().unwrap();
    let r = encode_frame(&FrameMeta { client: link_local, local: None, ecn: 0, segment_size: None }, &[1; 8]);
    assert_eq!(&r[44..48], &[0, 0, 0, 7]);
    assert_eq!(decode_frame(&r).unwrap().0.client, link_local);
    // A v4 local address has its own padding.
    let mut r = sample_frame(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 443)));
    assert!(decode_frame(&r).is_ok());
    r[30] = 1;
    assert_eq!(decode_frame(&r).map(|_| ()), Err(WireError::ReservedBits));
    // Payload bounds.
    assert_eq!(decode_frame(&base[..FRAME_HEADER_LEN]).map(|_| ()), Err(WireError::EmptyPayload));
    let mut big = base[..FRAME_HEADER_LEN].to_vec();
    big[4] = 0;
    big[5] = 0;
    big.resize(FRAME_HEADER_LEN + MAX_PAYLOAD, 0);
    assert!(decode_frame(&big).is_ok());
    big.push(0);
    assert_eq!(decode_frame(&big).map(|_| ()), Err(WireError::PayloadTooLarge));
}

#[test]
fn control_reserved_values() {
    let rec = |m: &Control| encode_control(m);
    let dec = |b: &[u8]| decode_control(b);
    assert_eq!(dec(&[0xc6, 1, 4]), Err(WireError::BadMagic));
    assert_eq!(dec(&[CONTROL_MAGIC, 2, 4]), Err(WireError::UnsupportedVersion(2)));
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 0]), Err(WireError::UnknownMessage(0)));
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 18]), Err(WireError::Truncated)); // Load, no body
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 19]), Err(WireError::Truncated)); // HandshakeDone, no body
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 20]), Err(WireError::UnknownMessage(20)));
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 255]), Err(WireError::UnknownMessage(255)));
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 4]), Ok(Control::Ready));
    assert_eq!(dec(&[CONTROL_MAGIC, 1, 4, 0]), Err(WireError::TrailingBytes));
    // Hello roles are 1..=3.
    for role in [0u8, 4, 255] {
        assert_eq!(dec(&[CONTROL_MAGIC, 1, 1, role, 0, 0, 0, 1]), Err(WireError::ReservedBits));
    }
    // Keys: generation 3 is not a generation; PRF codes are 0 and 1 (ADR 0004); the
    // "previous present" flag is 0 or 1; the previous generation differs from the newest.
    let k = Keys {
        newest: KeyGen { generation: Generation::new(2).unwrap(), prf: Prf::HmacSha256, secret: [0; 32] },
        previous: None,
    };
    let base = rec(&Control::KeysChanged { keys: k });
    let mut b = base.clone();
    b[3] = 3;
    assert_eq!(dec(&b), Err(WireError::BadGeneration(3)));
    for code in [2u8, 3, 0x80, 0xff] {
        let mut b = base.clone();
        b[4] = code;
        assert_eq!(dec(&b), Err(WireError::BadPrf(code)), "newest PRF code {code}");
    }
    let mut b = base.clone();
    b[3 + 2 + 32] = 2;
    assert_eq!(dec(&b), Err(WireError::ReservedBits));
    let mut b = base.clone();
    b[3 + 2 + 32] = 1;
    b.extend_from_slice(&[2, 1]);
    b.extend_from_slice(&[0; 32]);
    assert_eq!(dec(&b), Err(WireError::BadGeneration(2)));
    let n = b.len();
    b[n - 34] = 0;
    assert!(
        matches!(dec(&b), Ok(Control::KeysChanged { keys }) if keys.previous.is_some_and(|p| p.prf == Prf::SipHash24))
    );
    b[n - 33] = 7;
    assert_eq!(dec(&b), Err(WireError::BadPrf(7)), "previous PRF code");
    // Truncated inside a KeyGen (after the PRF byte, before the secret ends).
    assert_eq!(dec(&base[..5]), Err(WireError::Truncated));
    assert_eq!(dec(&base[..4]), Err(WireError::Truncated));
    // Table: placeable is a strict bool; more than MAX_INSTANCES is refused.
    let t = rec(&Control::Table {
        keys: Keys {
            newest: KeyGen { generation: Generation::new(0).unwrap(), prf: Prf::SipHash24, secret: [0; 32] },
            previous: None,
        },
        instances: vec![InstanceState { server_id: ServerId(1), placeable: true }],
    });
    let mut b = t.clone();
    *b.last_mut().unwrap() = 2;
    assert_eq!(dec(&b), Err(WireError::ReservedBits));
    let mut b = t[..t.len() - 5].to_vec();
    b.extend_from_slice(&((MAX_INSTANCES + 1) as u16).to_be_bytes());
    assert_eq!(dec(&b), Err(WireError::TooMany));
    // Sockets: family 4 or 6, v4 padding zero, at most MAX_SOCKETS.
    let s = rec(&Control::Sockets { addrs: vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 443)] });
    assert_eq!(s.len(), 3 + 1 + 1 + 16 + 2);
    for fam in [0u8, 5, 10, 46] {
        let mut b = s.clone();
        b[4] = fam;
        assert_eq!(dec(&b), Err(WireError::ReservedBits), "family {fam}");
    }
    let mut b = s.clone();
    b[4 + 1 + 4] = 1;
    assert_eq!(dec(&b), Err(WireError::ReservedBits), "v4 padding");
    let mut b = s.clone();
    b[4] = 6;
    assert!(matches!(dec(&b), Ok(Control::Sockets { addrs }) if addrs[0].is_ipv6()));
    let mut b = vec![CONTROL_MAGIC, 1, 11, (MAX_SOCKETS + 1) as u8];
    b.resize(4 + (MAX_SOCKETS + 1) * 19, 0);
    assert_eq!(dec(&b), Err(WireError::TooMany));
    // Text: longer than MAX_TEXT, or not UTF-8.
    let mut b = vec![CONTROL_MAGIC, 1, 9];
    b.extend_from_slice(&((MAX_TEXT + 1) as u32).to_be_bytes());
    b.resize(b.len() + MAX_TEXT + 1, b'a');
    assert_eq!(dec(&b), Err(WireError::TooMany));
    let mut b = vec![CONTROL_MAGIC, 1, 10, 0, 0, 0, 2, 0xc3, 0x28];
    assert_eq!(dec(&b), Err(WireError::BadUtf8));
    b[8] = 0xa9;
    assert_eq!(dec(&b), Ok(Control::Error { reason: "é".into() }));
}

#[test]
fn encoder_limits() {
    // Text is cut at MAX_TEXT, never inside a UTF-8 sequence.
    let long = "é".repeat(MAX_TEXT); // 2 bytes each
    let m = decode_control(&encode_control(&Control::Status { json: long })).unwrap();
    assert!(matches!(&m, Control::Status { json } if json.len() == MAX_TEXT && json.chars().all(|c| c == 'é')));
    let odd = format!("a{}", "é".repeat(MAX_TEXT / 2));
    let m = decode_control(&encode_control(&Control::Error { reason: odd })).unwrap();
    assert!(matches!(&m, Control::Error { reason } if reason.len() == MAX_TEXT - 1));
    // A table update lists at most MAX_INSTANCES.
    let instances: Vec<InstanceState> = (0..MAX_INSTANCES as u16 + 5)
        .map(|i| InstanceState { server_id: ServerId(i), placeable: i % 2 == 0 })
        .collect();
    let keys = Keys {
        newest: KeyGen { generation: Generation::new(0).unwrap(), prf: Prf::HmacSha256, secret: [0; 32] },
        previous: None,
    };
    let m = decode_control(&encode_control(&Control::Table { keys, instances: instances.clone() })).unwrap();
    assert!(matches!(&m, Control::Table { instances: got, .. } if got[..] == instances[..MAX_INSTANCES]));
    // A Sockets message carries at most MAX_SOCKETS addresses.
    let addrs: Vec<SocketAddr> =
        (0..MAX_SOCKETS as u16 + 3).map(|p| SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), p)).collect();
    let m = decode_control(&encode_control(&Control::Sockets { addrs: addrs.clone() })).unwrap();
    assert_eq!(m, Control::Sockets { addrs: addrs[..MAX_SOCKETS].to_vec() });
}

#[test]
fn keys_give_the_key_set_they_describe() {
    let g = |n| Generation::new(n).unwrap();
    for (pn, pp) in [(Prf::SipHash24, Prf::HmacSha256), (Prf::HmacSha256, Prf::SipHash24)] {
        let k = Keys {
            newest: KeyGen { generation: g(2), prf: pn, secret: [5; 32] },
            previous: Some(KeyGen { generation: g(1), prf: pp, secret: [6; 32] }),
        };
        let ks = k.key_set().unwrap();
        assert_eq!(ks.newest(), g(2));
        assert_eq!(ks.secret(g(1)), Some(&[6; 32]));
        assert_eq!(ks.secret(g(0)), None);
        assert_eq!((ks.prf(g(2)), ks.prf(g(1)), ks.prf(g(0))), (Some(pn), Some(pp), None));
        // Same fingerprint as the key set built directly (so decodes agree).
        let direct = proto::KeySet::with_prfs((g(2), pn, [5; 32]), Some((g(1), pp, [6; 32]))).unwrap();
        assert_eq!(ks.fingerprint(), direct.fingerprint());
        // The secret is never printed; the PRF is.
        let dbg = format!("{:?}", k);
        assert!(!dbg.contains("5, 5"), "{dbg}");
        assert!(dbg.contains(pn.as_str()), "{dbg}");
    }
}

/// Exact bytes of `Keys` (docs/wire.md): per generation `generation u8, PRF code u8,
/// secret [32]`, with the has-previous byte between them.
#[test]
fn keys_layout() {
    let g = |n| Generation::new(n).unwrap();
    let keys = Keys {
        newest: KeyGen { generation: g(1), prf: Prf::SipHash24, secret: [0xaa; 32] },
        previous: Some(KeyGen { generation: g(0), prf: Prf::HmacSha256, secret: [0xbb; 32] }),
    };
    let mut want = vec![CONTROL_MAGIC, 1, 3, 1, 1];
    want.extend_from_slice(&[0xaa; 32]);
    want.extend_from_slice(&[1, 0, 0]);
    want.extend_from_slice(&[0xbb; 32]);
    assert_eq!(encode_control(&Control::KeysChanged { keys: keys.clone() }), want);
    assert_eq!(decode_control(&want), Ok(Control::KeysChanged { keys }));
    // Newest hmac-sha256 in generation 2, no previous.
    let keys = Keys { newest: KeyGen { generation: g(2), prf: Prf::HmacSha256, secret: [0xcc; 32] }, previous: None };
    let mut want = vec![CONTROL_MAGIC, 1, 3, 2, 0];
    want.extend_from_slice(&[0xcc; 32]);
    want.push(0);
    assert_eq!(encode_control(&Control::KeysChanged { keys: keys.clone() }), want);
    assert_eq!(decode_control(&want), Ok(Control::KeysChanged { keys }));
    // Assign: server id, Keys, reset key, token key.
    let keys = Keys { newest: KeyGen { generation: g(0), prf: Prf::SipHash24, secret: [0x11; 32] }, previous: None };
    let m = Control::Assign { server_id: ServerId(0x0102), keys, reset_key: [0x22; 32], token_key: [0x33; 32] };
    let mut want = vec![CONTROL_MAGIC, 1, 2, 1, 2, 0, 1];
    want.extend_from_slice(&[0x11; 32]);
    want.push(0);
    want.extend_from_slice(&[0x22; 32]);
    want.extend_from_slice(&[0x33; 32]);
    assert_eq!(encode_control(&m), want);
    assert_eq!(decode_control(&want), Ok(m));
}

#[test]
fn controller_messages_layout() {
    // Appended tags 12..=14 (docs/wire.md): GetSockets, Rejoin{id u16, pid u32}, RotateKeys.
    assert_eq!(encode_control(&Control::GetSockets), vec![CONTROL_MAGIC, 1, 12]);
    assert_eq!(
        encode_control(&Control::Rejoin { server_id: ServerId(0x0102), pid: 0x0304_0506 }),
        vec![CONTROL_MAGIC, 1, 13, 1, 2, 3, 4, 5, 6]
    );
    // rotate-keys [--prf] [--force] [--stage|--activate]: a PRF code (0 hmac-sha256,
    // 1 siphash-2-4) or 0xff (keep), then flags: bit 0 force, bits 1-2 the phase
    // (0 rotate, 1 stage, 2 activate).
    assert_eq!(
        encode_control(&Control::RotateKeys { prf: None, force: false, phase: RotatePhase::Rotate, from: None }),
        vec![CONTROL_MAGIC, 1, 14, 0xff, 0]
    );
    assert_eq!(
        encode_control(&Control::RotateKeys {
            prf: Some(Prf::SipHash24),
            force: true,
            phase: RotatePhase::Rotate,
            from: None
        }),
        vec![CONTROL_MAGIC, 1, 14, 1, 1]
    );
    assert_eq!(
        decode_control(&[CONTROL_MAGIC, 1, 14, 0, 0]),
        Ok(Control::RotateKeys { prf: Some(Prf::HmacSha256), force: false, phase: RotatePhase::Rotate, from: None })
    );
    assert_eq!(
        decode_control(&[CONTROL_MAGIC, 1, 14, 0xff, 2]),
        Ok(Control::RotateKeys { prf: None, force: false, phase: RotatePhase::Stage, from: None })
    );
    assert_eq!(
        decode_control(&[CONTROL_MAGIC, 1, 14, 0xff, 5]),
        Ok(Control::RotateKeys { prf: None, force: true, phase: RotatePhase::Activate, from: None })
    );
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 14, 0xff, 6]), Err(WireError::ReservedBits));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 14, 0xff, 16]), Err(WireError::ReservedBits));
    // Bit 3: a `from` key file path follows, as text.
    let from = Control::RotateKeys { prf: None, force: false, phase: RotatePhase::Stage, from: Some("/k".into()) };
    let enc = encode_control(&from);
    assert_eq!(enc[..5], [CONTROL_MAGIC, 1, 14, 0xff, 2 | 8]);
    assert_eq!(decode_control(&enc), Ok(from));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 14, 0xff, 8]), Err(WireError::Truncated));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 14, 2, 0]), Err(WireError::BadPrf(2)));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 14, 0xff]), Err(WireError::Truncated));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 14]), Err(WireError::Truncated));
    assert!(decode_control(&[CONTROL_MAGIC, 1, 13, 1, 2, 3]).is_err());
    assert!(decode_control(&[CONTROL_MAGIC, 1, 12, 0]).is_err());
}

#[test]
fn ring_messages_layout() {
    // Appended tags 15, 16 (docs/wire.md): DataHelloV2{id u16, caps u32}, Rings{count u8, bytes u64}.
    assert_eq!(
        encode_control(&Control::DataHelloV2 { server_id: ServerId(0x0102), caps: CAP_RINGS }),
        vec![CONTROL_MAGIC, 1, 15, 1, 2, 0, 0, 0, 1]
    );
    assert_eq!(
        encode_control(&Control::Rings { count: 2, bytes: 1 << 20 }),
        vec![CONTROL_MAGIC, 1, 16, 2, 0, 0, 0, 0, 0, 0x10, 0, 0]
    );
    // Unknown capability bits, zero or too many rings, a capacity that is no power of two.
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 15, 1, 2, 0, 0, 0, 4]), Err(WireError::ReservedBits));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 16, 0, 0, 0, 0, 0, 0, 0x10, 0, 0]), Err(WireError::ReservedBits));
    assert_eq!(
        decode_control(&[CONTROL_MAGIC, 1, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Ok(Control::Rings { count: 0, bytes: 0 })
    );
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 16, 65, 0, 0, 0, 0, 0, 0x10, 0, 0]), Err(WireError::TooMany));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 16, 1, 0, 0, 0, 0, 0, 0x10, 0, 1]), Err(WireError::ReservedBits));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 16, 1, 0, 0, 0, 0, 0, 0x01, 0, 0]), Err(WireError::ReservedBits));
}

#[test]
fn fast_path_messages_layout() {
    // Tag 17 (docs/wire.md): FastSockets, laid out exactly as Sockets; CAP_FAST_PATH = bit 1.
    assert_eq!(CAP_FAST_PATH, 2);
    assert_eq!(
        encode_control(&Control::DataHelloV2 { server_id: ServerId(7), caps: CAP_RINGS | CAP_FAST_PATH }),
        vec![CONTROL_MAGIC, 1, 15, 0, 7, 0, 0, 0, 3]
    );
    let a = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), 0x1151);
    let mut want = vec![CONTROL_MAGIC, 1, 17, 1, 4, 127, 0, 0, 1];
    want.extend_from_slice(&[0; 12]);
    want.extend_from_slice(&[0x11, 0x51]);
    assert_eq!(encode_control(&Control::FastSockets { addrs: vec![a] }), want);
    assert_eq!(decode_control(&want), Ok(Control::FastSockets { addrs: vec![a] }));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 17, 0]), Ok(Control::FastSockets { addrs: vec![] }));
    // The sockets body is the same as tag 11's: a Sockets record with the tag changed decodes alike.
    let mut s = encode_control(&Control::Sockets { addrs: vec![a] });
    s[2] = 17;
    assert_eq!(s, want);
}

/// `HandshakeDone` (tag 19): `len u8 (≤ 20), odcid [len]`.
#[test]
fn handshake_done_layout() {
    let m = Control::HandshakeDone { odcid: vec![0xaa, 0xbb, 0xcc] };
    let rec = encode_control(&m);
    assert_eq!(rec, [CONTROL_MAGIC, 1, 19, 3, 0xaa, 0xbb, 0xcc]);
    assert_eq!(decode_control(&rec), Ok(m));
    assert_eq!(m_name(), "HandshakeDone");
    let mut long = vec![CONTROL_MAGIC, 1, 19, 21];
    long.extend_from_slice(&[0; 21]);
    assert_eq!(decode_control(&long), Err(WireError::TooMany));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 19, 4, 1, 2]), Err(WireError::Truncated));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 19]), Err(WireError::Truncated));
    assert_eq!(decode_control(&[CONTROL_MAGIC, 1, 19, 0]), Ok(Control::HandshakeDone { odcid: vec![] }));
}

fn m_name() -> &'static str {
    Control::HandshakeDone { odcid: vec![] }.name()
}

#[test]
fn load_message_layout() {
    // Tag 18 (docs/wire.md): Load{handshakes u32, incoming_bytes u32}, worker → data plane.
    assert_eq!(LOAD_INTERVAL_MS, 250);
    let m = Control::Load { handshakes: 0x0102_0304, incoming_bytes: 0x0506_0708 };
    let want = vec![CONTROL_MAGIC, 1, 18, 1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(encode_control(&m), want);
    assert_eq!(m.name(), "Load");
    assert_eq!(decode_control(&want), Ok(m));
    for n in 3..want.len() {
        assert_eq!(decode_control(&want[..n]), Err(WireError::Truncated), "cut at {n}");
    }
    let mut long = want.clone();
    long.push(0);
    assert_eq!(decode_control(&long), Err(WireError::TrailingBytes));
    assert_eq!(
        decode_control(&[CONTROL_MAGIC, 1, 18, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
        Ok(Control::Load { handshakes: u32::MAX, incoming_bytes: 0 })
    );
}
