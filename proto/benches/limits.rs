//! Criterion benchmarks of the per-source limits,
//! single-threaded, default parameters and table sizes (2^16 words each):
//!
//! - `limits/client_hash`: the keyed SipHash-1-3 of a client alone (both sketches pay
//!   it once per decision).
//! - `limits/concurrency_acquire_release`: `try_acquire` + `release` (cap 64), clients
//!   rotating over 4 096 IPv4 addresses.
//! - `limits/rate_admit`: `try_admit`, 4 096 clients in turn, the clock advancing one
//!   tick (1 ms) per 32 calls, so a client's calls are 128 ticks apart (T = 100): the
//!   admission path (CAS); includes the amortised epoch moves.
//! - `limits/rate_refuse`: `try_admit` of one client that is over its rate (the
//!   refusal path: no write).
//! - `limits/rate_rebase_call_64k`: the one call that moves the epoch (a read pass over
//!   the 64 Ki-word table checking that the previous pass finished), timed alone.
//! - `limits/rate_epoch_pass_64k`: one whole epoch move: the rebasing call plus the
//!   1 024 following decisions that shift the table `SWEEP_CHUNK` (64) words each.
//!   Happens once per window (28.8 s with the defaults).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::{criterion_group, criterion_main, Criterion};
use proto::limits::{
    ClientHasher, ClientKey, ConcurrencySketch, RateSketch, DEFAULT_CONCURRENCY_WORDS, DEFAULT_GCRA,
    DEFAULT_MAX_HANDSHAKES, DEFAULT_RATE_WORDS,
};
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

fn clients(n: u32) -> Vec<ClientKey> {
    (0..n).map(|i| ClientKey::from(Ipv4Addr::from(0xc633_6400 + i * 7919))).collect()
}

fn bench(c: &mut Criterion) {
    let keys = clients(4096);
    let mut g = c.benchmark_group("limits");

    let h = ClientHasher::new([0x11; 16]);
    let mut i = 0;
    g.bench_function("client_hash", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            black_box(h.hash(black_box(keys[i])))
        })
    });

    let s = ConcurrencySketch::new(DEFAULT_CONCURRENCY_WORDS, [0x22; 16]);
    let mut i = 0;
    g.bench_function("concurrency_acquire_release", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            let t = s.try_acquire(black_box(keys[i]), DEFAULT_MAX_HANDSHAKES).unwrap();
            s.release(black_box(t));
        })
    });

    let r = RateSketch::new(DEFAULT_RATE_WORDS, [0x33; 16], DEFAULT_GCRA, 0);
    let (mut i, mut calls) = (0, 0u64);
    g.bench_function("rate_admit", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            calls += 1;
            black_box(r.try_admit(black_box(keys[i]), calls >> 5))
        })
    });

    let r = RateSketch::new(DEFAULT_RATE_WORDS, [0x44; 16], DEFAULT_GCRA, 0);
    while r.try_admit(keys[0], 0) {}
    g.bench_function("rate_refuse", |b| b.iter(|| black_box(r.try_admit(black_box(keys[0]), 0))));

    let r = RateSketch::new(DEFAULT_RATE_WORDS, [0x55; 16], DEFAULT_GCRA, 0);
    let (mut now, mut i) = (0u64, 0);
    g.bench_function("rate_rebase_call_64k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                now += DEFAULT_GCRA.window();
                let t0 = Instant::now();
                black_box(r.try_admit(black_box(keys[0]), now));
                total += t0.elapsed();
                while !r.swept() {
                    i = (i + 1) & 4095;
                    r.try_admit(keys[i], now);
                }
            }
            total
        })
    });
    g.bench_function("rate_epoch_pass_64k", |b| {
        b.iter(|| {
            now += DEFAULT_GCRA.window();
            r.try_admit(black_box(keys[0]), now);
            while !r.swept() {
                i = (i + 1) & 4095;
                r.try_admit(keys[i], now);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
