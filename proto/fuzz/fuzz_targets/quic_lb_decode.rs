//! Fuzz `proto::quic_lb` (draft-ietf-quic-load-balancers-21): an arbitrary config and
//! an arbitrary CID.
//!
//! Input: byte 0 = config id (bits 0..=2, 7 is refused), keyed (bit 3), self-encoded
//! length (bit 4); byte 1 = server id length, byte 2 = nonce length (any value:
//! `Config::new` must accept exactly §5.3's lengths); bytes 3..19 = key; the rest = CID.
//! Checks: never a panic; `ConfigSet::decode` says why a CID is unroutable exactly as
//! its first octet and length dictate; decode equals the head of the four-pass
//! `decrypt`; encoding what `decrypt` returns gives the CID's block back; and a CID
//! encoded for the server id and nonce read off the input decodes to that server id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::quic_lb::{Config, ConfigId, ConfigSet, Params, Unroutable, MAX_CID_LEN, MAX_PLAINTEXT_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < 19 {
        return;
    }
    let Some(config_id) = ConfigId::new(data[0] & 7) else {
        return;
    };
    let (sid_len, nonce_len) = (data[1], data[2]);
    let key: [u8; 16] = data[3..19].try_into().expect("16 bytes");
    let params = Params {
        config_id,
        server_id_len: sid_len,
        nonce_len,
        key: (data[0] & 8 != 0).then_some(key),
        self_encoded_len: data[0] & 16 != 0,
    };
    let cid = &data[19..];
    let valid = (1..=15).contains(&sid_len) && nonce_len >= 4 && usize::from(sid_len) + usize::from(nonce_len) <= 19;
    let config = match Config::new(params) {
        Ok(c) => c,
        Err(e) => {
            assert!(!valid, "{params:?} refused: {e}");
            return;
        }
    };
    assert!(valid, "{params:?} accepted");
    let mut set = ConfigSet::new();
    set.insert(config.clone());

    // Decode, with the reason for an unroutable CID.
    let decoded = set.decode(cid);
    match cid.first() {
        None => assert_eq!(decoded, Err(Unroutable::Empty)),
        Some(&b) if b >> 5 == 7 => assert_eq!(decoded, Err(Unroutable::Marked)),
        Some(&b) if b >> 5 != config_id.get() => {
            assert_eq!(decoded, Err(Unroutable::UnknownConfig(ConfigId::of_first_octet(b).expect("0..=6"))))
        }
        Some(_) if cid.len() < config.cid_len() => assert_eq!(decoded, Err(Unroutable::TooShort)),
        Some(_) => assert!(decoded.is_ok()),
    }
    if let Some(&b) = cid.first() {
        if let Some(len) = set.dcid_len(b) {
            assert!((config.cid_len()..=MAX_CID_LEN).contains(&len));
        }
    }
    let mut plain = [0u8; MAX_PLAINTEXT_LEN];
    let full = config.decrypt(cid, &mut plain).map(<[u8]>::to_vec);
    let sid = config.decode(cid);
    assert_eq!(sid.map(|s| s.as_bytes().to_vec()), full.as_ref().map(|p| p[..usize::from(sid_len)].to_vec()));
    assert_eq!(decoded.ok().map(|d| d.server_id), sid);

    let plen = config.plaintext_len();
    if let Some(p) = full {
        // The block is a permutation: encoding the decryption gives the block back.
        let mut again = [0u8; MAX_CID_LEN];
        let out = &mut again[..config.cid_len()];
        config.encode(&p[..usize::from(sid_len)], &p[usize::from(sid_len)..], cid[0], out).expect("valid lengths");
        assert_eq!(out[1..], cid[1..=plen]);
        if !params.self_encoded_len {
            assert_eq!(out[0], cid[0]);
        }
    }
    // Round trip of the server id and nonce read off the input (zero-padded).
    let mut raw = [0u8; MAX_PLAINTEXT_LEN];
    let n = cid.len().min(plen);
    raw[..n].copy_from_slice(&cid[..n]);
    let (s, nonce) = raw[..plen].split_at(usize::from(sid_len));
    let len = config.cid_len() + cid.len() % (MAX_CID_LEN - config.cid_len() + 1);
    let mut out = [0u8; MAX_CID_LEN];
    config.encode(s, nonce, data[0], &mut out[..len]).expect("valid lengths");
    assert_eq!(config.decode(&out[..len]).map(|d| d.as_bytes().to_vec()), Some(s.to_vec()));
    assert_eq!(set.decode(&out[..len]).map(|d| d.config_id), Ok(config_id));
    if params.self_encoded_len {
        assert_eq!(set.dcid_len(out[0]), Some(len));
    }
});
