//! Criterion benchmarks of QUIC-LB CID decoding (`proto::quic_lb`,
//! draft-ietf-quic-load-balancers-21) next to ADR 0001's `KeySet::decode`. Results:
//! docs/quic-lb.md, "Cost".
//!
//! - `quic_lb/decode_plaintext`: server id 2, nonce 9 (a 12-byte CID): a copy.
//! - `quic_lb/decode_single_pass`: server id 2, nonce 14 (a 17-byte CID): one AES-128
//!   block decryption.
//! - `quic_lb/decode_feistel_3pass_3_8`: server id 3, nonce 8 (12 bytes, ADR 0001's
//!   length): the load balancer's three Feistel passes (three AES-128 encryptions).
//! - `quic_lb/decode_feistel_3pass_2_6`: server id 2, nonce 6 (a 9-byte CID).
//! - `quic_lb/decrypt_feistel_4pass_3_8`: the same 3 + 8 CID, all four passes (what
//!   the issuing server pays to read its nonce back).
//! - `quic_lb/decode_feistel_4pass_10_5`: Appendix B's server id 10, nonce 5, where the
//!   server id is longer than the nonce and the load balancer needs the fourth pass.
//! - `quic_lb/config_set_decode_3_8`: `ConfigSet::decode` of the 3 + 8 CID (config
//!   lookup and reasons on top of `decode_feistel_3pass_3_8`).
//! - `quic_lb/encode_feistel_3_8`: `Config::encode` of a 3 + 8 CID (four passes).
//! - `adr1/decode_hmac`, `adr1/decode_siphash`: `KeySet::decode` of a 12-byte ADR 0001
//!   CID under an HMAC-SHA-256 and a SipHash-2-4 generation (ADR 0004), as `cid/decode`
//!   and `cid/decode_siphash` in benches/proto.rs.
//!
//! Every benchmark runs twice: with criterion's wall clock, and (prefix `cpu/`) with
//! the benchmark thread's own on-CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::measurement::Measurement;
use criterion::{Criterion, SamplingMode};
use proto::cid::{Generation, KeySet, Prf, ServerId};
use proto::quic_lb::{Algorithm, Config, ConfigId, ConfigSet, Params, MAX_PLAINTEXT_LEN};
use std::hint::black_box;

const KEY: [u8; 16] = [0x8f, 0x95, 0xf0, 0x92, 0x45, 0x76, 0x5f, 0x80, 0x25, 0x69, 0x34, 0xe5, 0x0c, 0x66, 0x20, 0x7f];

fn config(sid_len: u8, nonce_len: u8, key: Option<[u8; 16]>) -> Config {
    Config::new(Params {
        config_id: ConfigId::new(1).unwrap(),
        server_id_len: sid_len,
        nonce_len,
        key,
        self_encoded_len: true,
    })
    .unwrap()
}

/// A CID of `c` for server id 0x11, 0x22, … and a nonce of 0xa0, 0xa1, …
fn cid(c: &Config) -> Vec<u8> {
    let sid: Vec<u8> = (1..=c.server_id_len() as u8).map(|i| i * 0x11).collect();
    let nonce: Vec<u8> = (0..c.nonce_len() as u8).map(|i| 0xa0 + i).collect();
    let mut out = vec![0; c.cid_len()];
    c.encode(&sid, &nonce, 0, &mut out).unwrap();
    assert_eq!(c.decode(&out).unwrap().as_bytes(), sid);
    out
}

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    let mut g = c.benchmark_group(format!("{p}quic_lb"));
    g.sampling_mode(SamplingMode::Flat);
    let cases = [
        ("decode_plaintext", config(2, 9, None), Algorithm::Plaintext),
        ("decode_single_pass", config(2, 14, Some(KEY)), Algorithm::SinglePass),
        ("decode_feistel_3pass_3_8", config(3, 8, Some(KEY)), Algorithm::FourPass),
        ("decode_feistel_3pass_2_6", config(2, 6, Some(KEY)), Algorithm::FourPass),
        ("decode_feistel_4pass_10_5", config(10, 5, Some(KEY)), Algorithm::FourPass),
    ];
    for (name, conf, algorithm) in &cases {
        assert_eq!(conf.algorithm(), *algorithm);
        assert_eq!(conf.three_pass_decode(), name.contains("3pass"));
        let id = cid(conf);
        g.bench_function(*name, |b| b.iter(|| conf.decode(black_box(&id))));
    }
    let c38 = config(3, 8, Some(KEY));
    let id38 = cid(&c38);
    assert_eq!(id38.len(), 12);
    let mut plain = [0u8; MAX_PLAINTEXT_LEN];
    g.bench_function("decrypt_feistel_4pass_3_8", |b| {
        b.iter(|| c38.decrypt(black_box(&id38), &mut plain).map(|p| p[0]))
    });
    let mut set = ConfigSet::new();
    set.insert(config(2, 9, None));
    set.insert(Config::new(Params { config_id: ConfigId::new(3).unwrap(), ..*c38.params() }).unwrap());
    let mut id38_in_set = id38.clone();
    id38_in_set[0] = (3 << 5) | (id38[0] & 0x1f);
    assert_eq!(set.decode(&id38_in_set).unwrap().server_id, c38.decode(&id38).unwrap());
    g.bench_function("config_set_decode_3_8", |b| b.iter(|| set.decode(black_box(&id38_in_set))));
    let (sid, nonce) = ([0x11, 0x22, 0x33], [0xa5; 8]);
    let mut out = [0u8; 12];
    g.bench_function("encode_feistel_3_8", |b| {
        b.iter(|| {
            c38.encode(black_box(&sid), black_box(&nonce), 0, &mut out).unwrap();
            out[1]
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("{p}adr1"));
    g.sampling_mode(SamplingMode::Flat);
    for (name, prf) in [("decode_hmac", Prf::HmacSha256), ("decode_siphash", Prf::SipHash24)] {
        let ks = KeySet::with_prfs((Generation::new(1).unwrap(), prf, [0x5a; 32]), None).unwrap();
        let live = ks.encode(ServerId(1021), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(ks.decode(&live).map(|d| d.server_id), Ok(ServerId(1021)));
        g.bench_function(name, |b| b.iter(|| ks.decode(black_box(&live))));
    }
    g.finish();
}

testkit::criterion_main_both_clocks!(benches);
