//! What an Initial on a live DCID pays for `Admission::owner_initial` (proto::token,
//! proto::initial), single-threaded:
//!
//! - `owner_initial/token_check`: `TokenKey::check` of a valid Retry token (the
//!   post-Retry Initial: validated, goes to its owner).
//! - `owner_initial/open_ack_only`: `owner_initial_allowed` of a token-less 1200-byte
//!   ACK-only Initial (the client's Initial after the server's first flight: opened,
//!   no ClientHello, goes to its owner) — the common case of a handshake without Retry.
//! - `owner_initial/open_client_hello`: the same for a ClientHello (a copied CID:
//!   found at the first frame, sent to admission).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::{criterion_group, criterion_main, Criterion};
use proto::header::{self, Header};
use proto::initial::build_client_initial;
use proto::token::{owner_initial_allowed, TokenKey};
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let key = TokenKey::new(&[3; 32]);
    let client: SocketAddr = "192.0.2.1:4433".parse().unwrap();
    let now = 1_800_000_000;
    let token = key.seal(client, Some(&[7; 8]), now, [5; 16]).unwrap();
    let dcid = [0x42u8; 12];
    let ack = build_client_initial(1, &dcid, &[1; 8], &[], 1, &[2, 0, 0, 0, 0], 1200).unwrap();
    let ch = build_client_initial(1, &dcid, &[1; 8], &[], 0, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap();
    let mut g = c.benchmark_group("owner_initial");
    g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    g.bench_function("token_check", |b| b.iter(|| key.check(black_box(&token), client, now)));
    for (name, d, want) in [("open_ack_only", &ack, true), ("open_client_hello", &ch, false)] {
        let Ok(Header::Long(h)) = header::parse(d, 12) else { panic!("parse") };
        assert_eq!(owner_initial_allowed(&key, &h, d, 0, client, now), want);
        g.bench_function(name, |b| b.iter(|| owner_initial_allowed(&key, &h, black_box(d), 0, client, now)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
