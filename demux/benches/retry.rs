//! Criterion bench of a demux-minted Retry (demux/src/dataplane/retry.rs; results:
//! docs/benchmarks.md, "demux (criterion)").
//!
//! - `retry/mint`: `Minter::answer` of a token-less client Initial (quinn's own, 1200
//!   bytes): quinn derives the Initial keys, removes header protection, seals the
//!   token and computes the Retry integrity tag; then one sendmsg of the Retry to a
//!   UDP socket on loopback (never read: the kernel drops what does not fit).
//!
//! Every benchmark runs twice: wall clock, and (prefix `cpu/`) thread CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod support;

use criterion::measurement::Measurement;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use demux::dataplane::counters::ShardCounters;
use demux::dataplane::retry::{Minter, RetryConfig, RetryMode};
use proto::cid::{Generation, KeySet, ServerId};
use quinn_proto::{ClientConfig, Endpoint, EndpointConfig};
use std::hint::black_box;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use support::{config, ThreadCpu};

/// A quinn client's first Initial to `server`.
fn client_initial(server: std::net::SocketAddr) -> Vec<u8> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let crypto = worker::tls::client_crypto(&[ck.cert.der().clone()], &[b"h3"]).unwrap();
    let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
    let (_h, mut conn) = ep.connect(Instant::now(), ClientConfig::new(Arc::new(crypto)), server, "localhost").unwrap();
    let mut buf = Vec::new();
    let t = conn.poll_transmit(Instant::now(), 1, &mut buf).unwrap();
    buf[..t.size].to_vec()
}

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let srv = UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = srv.local_addr().unwrap();
    let cfg = RetryConfig { mode: RetryMode::Always, token_secret: [7; 32] };
    let mut m = Minter::new(&cfg, vec![(local, srv.as_raw_fd())]).unwrap();
    let initial = client_initial(local);
    let keys = KeySet::new((Generation::new(0).unwrap(), [1; 32]), None).unwrap();
    let counters = ShardCounters::new(1);
    let client = sink.local_addr().unwrap();
    m.answer(&initial, client, local, None, &keys, ServerId(1), &counters);
    assert_eq!(counters.retries_sent.load(Ordering::Relaxed), 1, "one Retry sent");

    let mut g = c.benchmark_group(format!("{p}retry"));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("mint", |b| {
        b.iter(|| m.answer(black_box(&initial), client, local, None, &keys, ServerId(1), &counters))
    });
    g.finish();
    let sent = counters.retries_sent.load(Ordering::Relaxed);
    let other = counters.retry_dropped.load(Ordering::Relaxed) + counters.retry_send_errors.load(Ordering::Relaxed);
    assert_eq!(other, 0, "every Initial answered with a Retry ({sent} sent)");
}

fn wall(c: &mut Criterion) {
    benches(c, "");
}

fn cpu(c: &mut Criterion<ThreadCpu>) {
    benches(c, "cpu/");
}

criterion_group! { name = wall_clock; config = config(criterion::measurement::WallTime); targets = wall }
criterion_group! { name = cpu_time; config = config(ThreadCpu); targets = cpu }
criterion_main!(wall_clock, cpu_time);
