//! What the per-source limits add to routing: `Router::route_train` (plain
//! ADR 0001 routing) against the same with an admission (`Router::with_admission`)
//! that does what the data plane's does (demux/src/dataplane/limits.rs: concurrency ticket,
//! then rate; the ticket stored with the pin and released when the pin leaves),
//! default parameters and 2^16-word tables, 4 instances, a 65 536-pin table,
//! single-threaded.
//!
//! - `admission/short_owner_{plain,limits}`: a short-header datagram for a live
//!   instance: the limits are never called (no hash, no atomic) — the two must match.
//! - `admission/initial_pinned_{plain,limits}`: a client Initial whose DCID is pinned:
//!   also never reaches the limits.
//! - `admission/initial_placed_{plain,limits}`: a client Initial with a fresh DCID
//!   each time (placed and pinned; the full table evicts the oldest pin, whose ticket
//!   goes back): the difference is the cost of the limits per new placement.
//!   4 096 clients in turn, the clock one tick (1 ms) per 32 calls, so every call is
//!   admitted (the admission path, not the cheaper refusal).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::{criterion_group, criterion_main, Criterion};
use proto::cid::{Generation, KeySet, ServerId};
use proto::header::LongHeader;
use proto::limits::{
    ClientKey, ConcurrencySketch, RateSketch, Ticket, DEFAULT_CONCURRENCY_WORDS, DEFAULT_GCRA, DEFAULT_MAX_HANDSHAKES,
    DEFAULT_RATE_WORDS,
};
use proto::route::{Admission, InstanceInfo, Router, Table};
use proto::PinTable;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

struct Limits {
    rate: RateSketch,
    conc: ConcurrencySketch,
    client: ClientKey,
    ms: u64,
}

impl Admission for Limits {
    type Refusal = ();
    fn admit(&mut self, _: &LongHeader<'_>, _: usize, _: &Table, _: usize) -> Result<u32, ()> {
        let t = self.conc.try_acquire(self.client, DEFAULT_MAX_HANDSHAKES).ok_or(())?;
        if !self.rate.try_admit(self.client, self.ms) {
            self.conc.release(t);
            return Err(());
        }
        Ok(t.to_raw())
    }
    fn release(&mut self, raw: u32) {
        if let Some(t) = Ticket::from_raw(raw) {
            self.conc.release(t);
        }
    }
}

fn initial(dcid: &[u8; 8]) -> Vec<u8> {
    let mut d = vec![0xc3, 0, 0, 0, 1, 8];
    d.extend_from_slice(dcid);
    d.extend_from_slice(&[8, 9, 9, 9, 9, 9, 9, 9, 9, 0]);
    let rest = 1200 - d.len() - 2;
    d.extend_from_slice(&(rest as u16 | 0x4000).to_be_bytes());
    d.resize(1200, 0);
    d
}

fn bench(c: &mut Criterion) {
    let keys = KeySet::new((Generation::new(1).unwrap(), [1; 32]), None).unwrap();
    let infos: Vec<InstanceInfo> = (1..=4).map(|i| InstanceInfo { server_id: ServerId(i), placeable: true }).collect();
    let table = Table::new(keys.clone(), [3; 16], &infos).unwrap();
    let clients: Vec<ClientKey> =
        (0..4096u32).map(|i| ClientKey::from(Ipv4Addr::from(0xc633_6400 + i * 7919))).collect();
    let mut lim = Limits {
        rate: RateSketch::new(DEFAULT_RATE_WORDS, [0x33; 16], DEFAULT_GCRA, 0),
        conc: ConcurrencySketch::new(DEFAULT_CONCURRENCY_WORDS, [0x22; 16]),
        client: clients[0],
        ms: 0,
    };
    let mut g = c.benchmark_group("admission");
    let now = Duration::from_secs(1);

    let mut short = vec![0x41];
    short.extend_from_slice(&keys.encode(ServerId(2), &[7; 10]));
    short.resize(1200, 0);
    let mut pins = PinTable::new(1 << 16, [5; 16]);
    g.bench_function("short_owner_plain", |b| {
        b.iter(|| {
            Router::new(&table, &mut pins, now).route_train(black_box(&short), 0, |r, _| {
                black_box(r);
            })
        })
    });
    g.bench_function("short_owner_limits", |b| {
        b.iter(|| {
            Router::new(&table, &mut pins, now).with_admission(&mut lim).route_train(black_box(&short), 0, |r, f| {
                black_box((r, f));
            })
        })
    });

    let pinned = initial(&[1, 2, 3, 4, 5, 6, 7, 8]);
    Router::new(&table, &mut pins, now).with_admission(&mut lim).route_train(&pinned, 0, |_, _| {});
    g.bench_function("initial_pinned_plain", |b| {
        b.iter(|| {
            Router::new(&table, &mut pins, now).route_train(black_box(&pinned), 0, |r, _| {
                black_box(r);
            })
        })
    });
    g.bench_function("initial_pinned_limits", |b| {
        b.iter(|| {
            Router::new(&table, &mut pins, now).with_admission(&mut lim).route_train(black_box(&pinned), 0, |r, f| {
                black_box((r, f));
            })
        })
    });

    let mut buf = initial(&[0; 8]);
    let mut n = 0u64;
    let mut plain_pins = PinTable::new(1 << 16, [6; 16]);
    g.bench_function("initial_placed_plain", |b| {
        b.iter(|| {
            n += 1;
            buf[6..14].copy_from_slice(&n.to_le_bytes());
            Router::new(&table, &mut plain_pins, now).route_train(black_box(&buf), 0, |r, _| {
                black_box(r);
            })
        })
    });
    let mut limit_pins = PinTable::new(1 << 16, [7; 16]);
    let (mut i, mut calls, mut refused) = (0usize, 0u64, 0u64);
    g.bench_function("initial_placed_limits", |b| {
        b.iter(|| {
            n += 1;
            i = (i + 1) & 4095;
            calls += 1;
            lim.client = clients[i];
            lim.ms = calls >> 5;
            buf[6..14].copy_from_slice(&n.to_le_bytes());
            Router::new(&table, &mut limit_pins, now).with_admission(&mut lim).route_train(
                black_box(&buf),
                0,
                |r, f| {
                    refused += u64::from(f.is_some());
                    black_box(r);
                },
            )
        })
    });
    g.finish();
    eprintln!("initial_placed_limits: {refused} of {calls} refused");
}

criterion_group!(benches, bench);
criterion_main!(benches);
