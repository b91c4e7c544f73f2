//! The CPU cost of a Retry minted by proto (proto::retry::RetryMinter), and of its
//! parts, single-threaded, no socket:
//!
//! - `retry_mint/mint`: `RetryMinter::mint` of a token-less 1200-byte v1 client
//!   Initial (16-byte DCID, IPv4 client): the Initial checks (header-protection key
//!   from the DCID, one AES block), quinn's Retry token, the integrity tag.
//! - `retry_mint/client_hp_key`: `InitialProtection::client_hp_key` of that DCID
//!   (RFC 9001 §5.2: HKDF-Extract, two HKDF-Expand-Label).
//! - `retry_mint/check`: `InitialProtection::check` of that Initial (the hp key, the
//!   mask of the sample, the reserved bits).
//! - `retry_mint/seal_retry`: `TokenKey::seal_retry` of that client and ODCID (one
//!   HMAC, the AES-256-GCM key of the token, its seal).
//!
//! Every benchmark runs twice: wall clock, and (prefix `cpu/`) thread CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::measurement::Measurement;
use criterion::{Criterion, SamplingMode, Throughput};
use proto::header::VERSION_1;
use proto::initial::build_client_initial;
use proto::initial_protection::InitialProtection;
use proto::retry::{RetryMinter, MAX_RETRY};
use proto::token::{TokenKey, MAX_RETRY_TOKEN};
use std::hint::black_box;
use std::net::SocketAddr;

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    let (dcid, scid, server_scid) = ([0x42u8; 16], [0x17u8; 8], [0x5au8; 12]);
    let init = build_client_initial(VERSION_1, &dcid, &scid, &[], 0, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
    assert_eq!(init.len(), 1200);
    let client: SocketAddr = "192.0.2.1:4433".parse().unwrap();
    let now = 1_800_000_000;
    let m = RetryMinter::new(&[3; 32]);
    let ip = InitialProtection::new();
    let key = TokenKey::new(&[3; 32]);
    let mut out = [0u8; MAX_RETRY];
    let mut tok = [0u8; MAX_RETRY_TOKEN];
    let mut nonce = [9u8; 16];

    let mut g = c.benchmark_group(format!("{p}retry_mint"));
    g.sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(1));
    g.bench_function("mint", |b| {
        b.iter(|| {
            nonce[0] = nonce[0].wrapping_add(1);
            m.mint(black_box(&init), client, &server_scid, now, nonce, &mut out).unwrap()
        })
    });
    g.bench_function("client_hp_key", |b| b.iter(|| ip.client_hp_key(black_box(&dcid))));
    g.bench_function("check", |b| b.iter(|| ip.check(black_box(&init)).unwrap().packet_len));
    g.bench_function("seal_retry", |b| {
        b.iter(|| {
            nonce[0] = nonce[0].wrapping_add(1);
            key.seal_retry(client, black_box(&dcid), now, nonce, &mut tok).unwrap()
        })
    });
    g.finish();
}

testkit::criterion_main_both_clocks!(benches);
