//! Criterion bench of a demux-minted Retry (demux/src/dataplane/retry.rs, minted by
//! proto::retry::RetryMinter; results: docs/benchmarks.md, "Retry at line rate").
//!
//! - `retry/mint`: `Minter::mint` of a token-less quinn client Initial (1200 bytes):
//!   the checks quinn makes first (Initial keys' header protection, reserved bits),
//!   quinn's Retry token, the integrity tag, the ADR 0001 SCID, the randomness. No
//!   socket.
//! - `retry/answer`: `Minter::answer` and `Minter::flush`, i.e. that plus one sendmmsg
//!   of the Retry to a UDP socket on loopback (never read: the kernel drops what does
//!   not fit).
//! - `retry/answer_batched`: `Minter::answer` alone; every `RETRY_BATCH`-th call
//!   flushes the queue with one sendmmsg, as a shard's round does.
//! - `retry/recv_answer`: what one shard core does per Retry under a flood, with the
//!   receive included: per chunk of 256, the Initials (256 different DCIDs, from
//!   another socket) are queued on the shard's socket untimed; then each is received
//!   (`recvfrom`, one syscall per datagram: the uncoalesced worst case) and answered,
//!   the Retries sent in batches of `RETRY_BATCH` (and the chunk's rest at its end).
//!   Its CPU median is the CPU per Retry of one core; 1 s / that is Retries per
//!   CPU-second.
//!
//! The Endpoint-driven minter this replaced is not kept: its figure (10.5 µs for
//! `retry/mint` = the answer above) is in docs/journal/2026-11-30-to-12-02-benchmarks.md.
//!
//! Every benchmark runs twice: wall clock, and (prefix `cpu/`) thread CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod support;

use criterion::measurement::Measurement;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use demux::dataplane::counters::ShardCounters;
use demux::dataplane::retry::{unix_now, Minter, RetryConfig, RetryMode};
use proto::cid::{Generation, KeySet, ServerId};
use quinn_proto::{ClientConfig, Endpoint, EndpointConfig};
use std::hint::black_box;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use support::{chunked, config, Clock, ThreadCpu};

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

const CHUNK: usize = 256;

struct Drain {
    srv: UdpSocket,
    flooder: UdpSocket,
    local: std::net::SocketAddr,
    initials: Vec<Vec<u8>>,
    m: Minter,
    keys: KeySet,
    counters: ShardCounters,
    buf: Vec<u8>,
    queued: usize,
}

impl Drain {
    /// Untimed: queue one chunk of Initials on the shard's socket.
    fn fill(&mut self) {
        for i in &self.initials {
            self.flooder.send_to(i, self.local).unwrap();
        }
        self.queued = self.initials.len();
    }
    /// Timed: receive one and answer it.
    fn one(&mut self) {
        if self.queued == 0 {
            // Only when criterion asks for fewer iterations than a chunk holds.
            return;
        }
        let (n, from) = self.srv.recv_from(&mut self.buf).unwrap();
        self.queued -= 1;
        self.m.answer(
            &self.buf[..n],
            from,
            self.local,
            None,
            &self.keys,
            ServerId(1),
            unix_now(),
            false,
            &self.counters,
        );
        if self.queued == 0 {
            self.m.flush(&self.counters);
        }
    }
}

fn benches<M: Measurement + Clock + 'static>(c: &mut Criterion<M>, p: &str) {
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let srv = UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = srv.local_addr().unwrap();
    let cfg = RetryConfig { mode: RetryMode::Always, token_secret: [7; 32] };
    let mut m = Minter::new(&cfg, vec![(local, srv.as_raw_fd())]).unwrap();
    let initial = client_initial(local);
    let keys = KeySet::new((Generation::new(0).unwrap(), [1; 32]), None).unwrap();
    let counters = ShardCounters::new(1);
    let client = sink.local_addr().unwrap();
    m.answer(&initial, client, local, None, &keys, ServerId(1), unix_now(), false, &counters);
    m.flush(&counters);
    assert_eq!(counters.retries_sent.load(Ordering::Relaxed), 1, "one Retry sent");

    let mut g = c.benchmark_group(format!("{p}retry"));
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(1));
    g.bench_function("mint", |b| {
        b.iter(|| m.mint(black_box(&initial), client, &keys, ServerId(1), 1_800_000_000).map(|r| r.len()).unwrap())
    });
    g.bench_function("answer", |b| {
        b.iter(|| {
            m.answer(black_box(&initial), client, local, None, &keys, ServerId(1), unix_now(), false, &counters);
            m.flush(&counters)
        })
    });
    // A full queue is flushed by the next answer: one sendmmsg per RETRY_BATCH Retries.
    g.bench_function("answer_batched", |b| {
        b.iter(|| m.answer(black_box(&initial), client, local, None, &keys, ServerId(1), unix_now(), false, &counters))
    });
    m.flush(&counters);
    let sent = counters.retries_sent.load(Ordering::Relaxed);
    let other = counters.retry_dropped.load(Ordering::Relaxed) + counters.retry_send_errors.load(Ordering::Relaxed);
    assert_eq!(other, 0, "every Initial answered with a Retry ({sent} sent)");

    // recv + answer, fed from 256 distinct quinn-valid Initials (fresh DCIDs).
    let srv2 = UdpSocket::bind("127.0.0.1:0").unwrap();
    sys::sockopt::set_recv_buffer(&srv2, 8 << 20);
    let local2 = srv2.local_addr().unwrap();
    let initials = (0..CHUNK)
        .map(|i| {
            let mut dcid = [0u8; 12];
            dcid[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
            proto::initial::build_client_initial(1, &dcid, &[5; 8], &[], 0, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap()
        })
        .collect();
    let mut d = Drain {
        m: Minter::new(&cfg, vec![(local2, srv2.as_raw_fd())]).unwrap(),
        srv: srv2,
        flooder: UdpSocket::bind("127.0.0.1:0").unwrap(),
        local: local2,
        initials,
        keys: keys.clone(),
        counters: ShardCounters::new(1),
        buf: vec![0; 2048],
        queued: 0,
    };
    sys::sockopt::set_recv_buffer(&d.flooder, 1 << 16);
    g.bench_function("recv_answer", |b| {
        b.iter_custom(|iters| {
            d.fill();
            let t = chunked::<M, _>(iters, CHUNK as u64, &mut d, Drain::one, |d| {
                // Drain what is left of this chunk untimed, then queue the next.
                while d.queued > 0 {
                    d.one();
                }
                d.fill();
            });
            while d.queued > 0 {
                d.one();
            }
            t
        })
    });
    g.finish();
    let c2 = &d.counters;
    let (sent, dropped) = (c2.retries_sent.load(Ordering::Relaxed), c2.retry_dropped.load(Ordering::Relaxed));
    assert_eq!(
        dropped + c2.retry_send_errors.load(Ordering::Relaxed),
        0,
        "every queued Initial answered ({sent} sent)"
    );
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
