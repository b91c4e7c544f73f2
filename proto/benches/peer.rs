//! The CPU cost of one host-to-host forward's framing (docs/scaling.md): sealing a
//! 1200-byte datagram on the sending host and opening (verifying) it on the
//! receiving host, plus the replay check. Wall clock and thread CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::measurement::{Measurement, WallTime};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use proto::peer::{open, seal, ForwardingKey, Frame, ReplayWindow};
use std::hint::black_box;
use testkit::cpu_clock::{config, ThreadCpu};

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    let key = ForwardingKey::derive(&[7; 32]);
    let datagram = vec![0x41u8; 1200];
    let f = Frame {
        from_host: 2,
        seq: 1 << 32,
        client: "198.18.1.2:50000".parse().unwrap(),
        local: "198.19.9.9:443".parse().unwrap(),
        datagram: &datagram,
    };
    let mut out = Vec::with_capacity(1400);
    let mut g = c.benchmark_group(format!("{p}peer"));
    g.throughput(Throughput::Elements(1));
    g.bench_function("seal_1200", |b| b.iter(|| seal(&key, black_box(&f), &mut out)));
    seal(&key, &f, &mut out);
    let sealed = out.clone();
    let mut w = ReplayWindow::default();
    let mut seq = 0u64;
    g.bench_function("open_and_replay_check_1200", |b| {
        b.iter(|| {
            seq += 1;
            let fr = open(&key, black_box(&sealed)).unwrap();
            black_box(w.accept(fr.seq ^ seq))
        })
    });
    g.finish();
}

fn wall(c: &mut Criterion<WallTime>) {
    benches(c, "");
}

fn cpu(c: &mut Criterion<ThreadCpu>) {
    benches(c, "cpu/");
}

criterion_group! { name = wall_clock; config = config(WallTime); targets = wall }
criterion_group! { name = cpu_time; config = config(ThreadCpu); targets = cpu }
criterion_main!(wall_clock, cpu_time);
