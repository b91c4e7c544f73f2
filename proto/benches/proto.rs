//! Criterion benchmarks of the proto hot paths. Results and how to read
//! them: docs/benchmarks.md, section "proto (criterion)".
//!
//! - `cid/decode`: `KeySet::decode` of a valid 12-byte CID (one HMAC-SHA-256).
//! - `cid/decode_siphash`: the same under a `siphash-2-4` generation (ADR 0004: one
//!   SipHash-2-4 of 9 bytes under the key derived once per key set).
//! - `header_parse/short`, `header_parse/rfc9001_initial`: `header::parse`.
//! - `route/short_owner`: a whole routing decision for a 1-RTT datagram to a live
//!   instance (parse + decode + id lookup).
//! - `cid/decode_cache_hit`, `cid/decode_cache_miss`: the same CID through a
//!   default (4096-entry) `DecodeCache` that holds it (12-byte compare, no HMAC), or
//!   cycling through 65 536 distinct CIDs so every lookup misses (HMAC + store).
//! - `route/short_owner_cache_hit`: `route/short_owner` through a `Router` with a
//!   `DecodeCache` decoder that holds the DCID (what a shard pays per packet of an
//!   established connection).
//! - `route/initial_placed`, `route/initial_pinned`: the RFC 9001 A.2 Initial, placed
//!   by rendezvous over 8 instances (+ pin insert), or found in the pin table.
//! - `route_header/*`: routing a pre-parsed header (`Router::route_header`), no CID decode involved: `cr` = 3
//!   fails before any HMAC, so this is the rest of the decision (dispatch + rendezvous
//!   over 8 instances for the orphan's stateless-reset target).
//!
//! - `route_header/index_of`: the live-id lookup of the Owner path (binary search).
//!
//! "Routing decision excluding decode" = `route/short_owner` − `cid/decode`, checked
//! against the sum of its parts `header_parse/short` + `route_header/index_of`.
//!
//! Every benchmark runs twice: with criterion's wall clock, and (prefix `cpu/`) with
//! the benchmark thread's own on-CPU time from `/proc/thread-self/schedstat`, which
//! does not count the time the thread spent preempted on a shared, loaded machine.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::measurement::{Measurement, WallTime};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use proto::cid::{Generation, KeySet, Prf, ServerId};
use proto::decode_cache::{DecodeCache, Decoder};
use proto::header::{self, Header};
use proto::pin::PinTable;
use proto::route::{Decision, InstanceInfo, Reason, Router, Table};
use std::hint::black_box;
use std::time::Duration;
use testkit::cpu_clock::{config, ThreadCpu};

#[path = "../tests/common/vectors.rs"]
#[allow(dead_code)]
mod vectors;

fn hex(s: &str) -> Vec<u8> {
    let d: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    d.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
}

fn keys() -> KeySet {
    KeySet::new((Generation::new(1).unwrap(), [0x5a; 32]), Some((Generation::new(0).unwrap(), [0xa5; 32]))).unwrap()
}

/// One datagram through the plain router.
fn route(d: &[u8], table: &Table, pins: &mut PinTable, now: Duration) -> Decision {
    let Ok(decision) = Router::new(table, pins, now).route(d);
    decision
}

/// A pre-parsed header through the plain router.
fn route_header(h: &Header<'_>, len: usize, table: &Table, pins: &mut PinTable, now: Duration) -> Decision {
    let Ok(decision) = Router::new(table, pins, now).route_header(h, len);
    decision
}

fn table(n: u16) -> Table {
    let inst: Vec<InstanceInfo> =
        (0..n).map(|i| InstanceInfo { server_id: ServerId(1000 + 7 * i), placeable: true }).collect();
    Table::new(keys(), [0x42; 16], &inst).unwrap()
}

/// A 1-RTT datagram of `len` bytes to `cid`.
fn short(cid: &[u8], len: usize) -> Vec<u8> {
    let mut d = vec![0x43];
    d.extend_from_slice(cid);
    d.resize(len, 0x17);
    d
}

fn wall(c: &mut Criterion<WallTime>) {
    benches(c, "");
}

fn cpu(c: &mut Criterion<ThreadCpu>) {
    benches(c, "cpu/");
}

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    let ks = keys();
    let live_cid = ks.encode(ServerId(1000 + 7 * 3), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let initial = hex(vectors::RFC9001_A2_CLIENT_INITIAL);
    let short_dg = short(&live_cid, 1200);
    let t8 = table(8);
    assert_eq!(route(&short_dg, &t8, &mut PinTable::new(4, [0; 16]), Duration::ZERO).reason, Reason::Owner);

    let mut g = c.benchmark_group(format!("{p}cid"));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("decode", |b| b.iter(|| ks.decode(black_box(&live_cid))));
    let sip = KeySet::with_prfs((Generation::new(1).unwrap(), Prf::SipHash24, [0x5a; 32]), None).unwrap();
    let sip_cid = sip.encode(ServerId(1000 + 7 * 3), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    assert_eq!(sip.decode(&sip_cid).map(|d| d.server_id), Ok(ServerId(1021)));
    g.bench_function("decode_siphash", |b| b.iter(|| sip.decode(black_box(&sip_cid))));
    let mut cache = DecodeCache::default();
    assert_eq!(cache.decode(&ks, &live_cid), ks.decode(&live_cid));
    g.bench_function("decode_cache_hit", |b| b.iter(|| cache.decode(&ks, black_box(&live_cid))));
    let many: Vec<[u8; 12]> = (0..65_536u32)
        .map(|i| {
            let r = i.to_le_bytes();
            ks.encode(ServerId(1021), &[9, r[0], r[1], r[2], r[3], 9, 9, 9, 9, 9])
        })
        .collect();
    let mut k = 0usize;
    g.bench_function("decode_cache_miss", |b| {
        b.iter(|| {
            k = (k + 1) & 0xffff;
            cache.decode(&ks, black_box(&many[k]))
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("{p}header_parse"));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("short", |b| b.iter(|| header::parse(black_box(&short_dg), 12)));
    g.bench_function("rfc9001_initial", |b| b.iter(|| header::parse(black_box(&initial), 12)));
    g.finish();

    let mut g = c.benchmark_group(format!("{p}route"));
    g.sampling_mode(SamplingMode::Flat);
    let mut pins = PinTable::new(1 << 16, [9; 16]);
    let now = Duration::from_secs(100);
    g.bench_function("short_owner", |b| b.iter(|| route(black_box(&short_dg), &t8, &mut pins, now)));
    let mut cache = DecodeCache::default();
    let mut route_cached = |d: &[u8], pins: &mut PinTable| {
        let Ok(decision) = Router::new(&t8, pins, now).with_decoder(&mut cache).route(d);
        decision
    };
    assert_eq!(route_cached(&short_dg, &mut pins).reason, Reason::Owner);
    g.bench_function("short_owner_cache_hit", |b| b.iter(|| route_cached(black_box(&short_dg), &mut pins)));
    // TTL zero: the pin is never found again, so every call places and pins anew.
    let mut fresh = PinTable::with_ttl(1 << 16, [9; 16], Duration::ZERO);
    assert_eq!(route(&initial, &t8, &mut fresh, now).reason, Reason::Placed);
    g.bench_function("initial_placed", |b| b.iter(|| route(black_box(&initial), &t8, &mut fresh, now)));
    assert_eq!(route(&initial, &t8, &mut pins, now).reason, Reason::Placed);
    assert_eq!(route(&initial, &t8, &mut pins, now).reason, Reason::Pinned);
    g.bench_function("initial_pinned", |b| b.iter(|| route(black_box(&initial), &t8, &mut pins, now)));
    g.finish();

    let mut g = c.benchmark_group(format!("{p}route_header"));
    g.sampling_mode(SamplingMode::Flat);
    let mut marked = live_cid;
    marked[0] |= 0xc0; // cr = 3: decode fails on the first byte, no HMAC
    let marked_dg = short(&marked, 1200);
    let h_marked = header::parse(&marked_dg, 12).unwrap();
    assert_eq!(route_header(&h_marked, 1200, &t8, &mut pins, now).reason, Reason::Orphan);
    g.bench_function("short_orphan_no_decode", |b| {
        b.iter(|| route_header(black_box(&h_marked), 1200, &t8, &mut pins, now))
    });
    let live_id = ServerId(1000 + 7 * 3);
    assert_eq!(t8.index_of(live_id), Some(3));
    g.bench_function("index_of", |b| b.iter(|| t8.index_of(black_box(live_id))));
    let h_init = header::parse(&initial, 12).unwrap();
    assert!(matches!(h_init, Header::Long(_)));
    assert_eq!(route_header(&h_init, 1200, &t8, &mut pins, now).reason, Reason::Pinned);
    g.bench_function("initial_pinned_no_decode", |b| {
        b.iter(|| route_header(black_box(&h_init), 1200, &t8, &mut pins, now))
    });
    g.finish();
}

criterion_group! { name = wall_clock; config = config(WallTime); targets = wall }
criterion_group! { name = cpu_time; config = config(ThreadCpu); targets = cpu }
criterion_main!(wall_clock, cpu_time);
