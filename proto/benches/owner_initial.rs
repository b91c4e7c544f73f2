//! What a client Initial on a live DCID pays for the data plane's rule
//! (`proto::limits::owner_initial::decide`, docs/adr/0003-demux-retry.md "Initials on
//! live DCIDs"), single-threaded, with the real sketches behind it:
//!
//! - `owner_initial/token_check`: `TokenKey::check` of a valid Retry token alone.
//! - `owner_initial/token`: `decide` of a post-Retry Initial (valid token → owner).
//! - `owner_initial/follow_up_ack`: a token-less 1200-byte ACK-only Initial from a
//!   4-tuple placed on the owner (opened, no ClientHello, one follow-up spent → owner)
//!   — the common case of a handshake without Retry. The allowance (255 here) is
//!   granted again every 255 calls, ≈ 0.2 ns a call.
//! - `owner_initial/unproven_ack`: the same ACK from a 4-tuple never placed: opened,
//!   then pressure, Retry gate, cap and rate asked (the rate spent: rate-limited).
//! - `owner_initial/unproven_offset1`: a flood's CRYPTO-at-offset-1 Initial, likewise.
//! - `owner_initial/unproven_garbage`: a flood's Initial that does not open, likewise.
//! - `owner_initial/client_hello`: a ClientHello on a copied CID (found at the first
//!   frame → placed).
//!
//! What the rule adds to opening the Initial, alone (what the whole-path figures
//! above cannot resolve on a busy machine):
//! - `owner_initial/follow_up_take`: `FollowUps::take` that finds the 4-tuple (one
//!   SipHash-1-3, a window of 8 slots);
//! - `owner_initial/unproven_limits`: step 4's questions over the real sketches for a
//!   client whose rate is spent (pressure, Retry gate, cap look, rate).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::{criterion_group, criterion_main, Criterion};
use proto::cid::ServerId;
use proto::header::{self, Header, LongHeader};
use proto::initial::build_client_initial;
use proto::limits::owner_initial::{decide, Outcome, OwnerInitialQuery, UnprovenLimits};
use proto::limits::{ClientKey, ConcurrencySketch, FollowUps, RateSketch, DEFAULT_GCRA, FOLLOW_UP_TTL};
use proto::token::TokenKey;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

/// The data plane's step 4 over real sketches (demux/src/dataplane/limits.rs).
struct Sketches {
    rate: RateSketch,
    conc: ConcurrencySketch,
    client: SocketAddr,
}

impl UnprovenLimits for Sketches {
    fn pressured(&self, _: usize) -> bool {
        false
    }
    fn retrying(&mut self) -> bool {
        false
    }
    fn handshakes_full(&self) -> bool {
        self.conc.full(ClientKey::from(self.client), 64)
    }
    fn charge_rate(&mut self) -> bool {
        self.rate.try_admit(ClientKey::from(self.client), 1_000)
    }
}

fn bench(c: &mut Criterion) {
    let key = TokenKey::new(&[3; 32]);
    let client: SocketAddr = "192.0.2.1:4433".parse().unwrap();
    let unix = 1_800_000_000;
    let now = Duration::from_secs(1);
    let token = key.seal(client, Some(&[7; 8]), unix, [5; 16]).unwrap();
    let dcid = [0x42u8; 12];
    let initial =
        |token: &[u8], frames: &[u8]| build_client_initial(1, &dcid, &[1; 8], token, 1, frames, 1200).unwrap();
    let post_retry = initial(&token, &[6, 0, 4, 1, 0, 0, 0]);
    let ack = initial(&[], &[2, 0, 0, 0, 0]);
    let offset1 = initial(&[], &[6, 1, 2, 0xaa, 0xbb]);
    let mut garbage = offset1.clone();
    garbage[1100] ^= 1;
    let ch = initial(&[], &[6, 0, 4, 1, 0, 0, 0]);
    let mut limits = Sketches {
        rate: RateSketch::new(1 << 16, [1; 16], DEFAULT_GCRA, 0),
        conc: ConcurrencySketch::new(1 << 16, [2; 16]),
        client,
    };
    let mut follow_ups = FollowUps::new(1 << 16, [4; 16]);
    let owner_id = ServerId(7);
    let parse = |d: &'static [u8]| match header::parse(d, 12) {
        Ok(Header::Long(h)) => h,
        _ => panic!("parse"),
    };
    let query = |h: &'static LongHeader<'static>, d: &'static [u8], client: SocketAddr| OwnerInitialQuery {
        header: h,
        datagram: d,
        stride: 0,
        client,
        owner: 0,
        owner_id,
        now,
        now_unix: unix,
    };
    let leak = |v: Vec<u8>| -> &'static [u8] { Box::leak(v.into_boxed_slice()) };
    let leak_h = |h: LongHeader<'static>| -> &'static LongHeader<'static> { Box::leak(Box::new(h)) };

    let mut g = c.benchmark_group("owner_initial");
    g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    g.bench_function("token_check", |b| b.iter(|| key.check(black_box(&token), client, unix)));

    let stranger: SocketAddr = "198.51.100.9:9".parse().unwrap();
    for (name, d, who, want) in [
        ("token", post_retry, client, Outcome::Token),
        ("unproven_ack", ack.clone(), stranger, Outcome::RateLimited),
        ("unproven_offset1", offset1, stranger, Outcome::RateLimited),
        ("unproven_garbage", garbage, stranger, Outcome::RateLimited),
        ("client_hello", ch, stranger, Outcome::Placed),
    ] {
        let d = leak(d);
        let h = leak_h(parse(d));
        let q = query(h, d, who);
        limits.client = who;
        // The stranger's burst is spent first: the flood's steady state.
        while decide(Some(&key), &mut follow_ups, &q, &mut limits) == Outcome::Admitted {}
        assert_eq!(decide(Some(&key), &mut follow_ups, &q, &mut limits), want, "{name}");
        g.bench_function(name, |b| {
            b.iter(|| decide(Some(&key), &mut follow_ups, black_box(&q), &mut limits));
        });
    }

    let d = leak(ack);
    let h = leak_h(parse(d));
    let q = query(h, d, client);
    limits.client = client;
    let mut follow_ups = FollowUps::with_allowance(1 << 16, [4; 16], 255, FOLLOW_UP_TTL);
    follow_ups.grant(client, owner_id, now);
    assert_eq!(decide(Some(&key), &mut follow_ups, &q, &mut limits), Outcome::FollowUp);
    let mut calls = 0u32;
    g.bench_function("follow_up_ack", |b| {
        b.iter(|| {
            calls += 1;
            if calls == 255 {
                follow_ups.grant(client, owner_id, now);
                calls = 0;
            }
            decide(Some(&key), &mut follow_ups, black_box(&q), &mut limits)
        })
    });

    let mut calls = 0u32;
    g.bench_function("follow_up_take", |b| {
        b.iter(|| {
            calls += 1;
            if calls == 255 {
                follow_ups.grant(client, owner_id, now);
                calls = 0;
            }
            follow_ups.take(black_box(client), owner_id, now)
        })
    });
    limits.client = stranger;
    assert!(limits.handshakes_full() || !limits.charge_rate(), "the stranger's rate is spent");
    g.bench_function("unproven_limits", |b| {
        b.iter(|| {
            let l = black_box(&mut limits);
            l.pressured(0) || l.retrying() || l.handshakes_full() || !l.charge_rate()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
