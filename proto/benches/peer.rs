//! The CPU cost of one host-to-host forward's framing (docs/scaling.md): sealing a
//! 1200-byte datagram on the sending host (AES-256-GCM-SIV tag, proto::peer::frame),
//! and on the receiving host opening (verifying) it plus the acceptance rule
//! (proto::peer::session: epoch check and replay window). Wall clock and thread CPU
//! time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::measurement::Measurement;
use criterion::{Criterion, Throughput};
use proto::peer::{open, seal, Body, Frame, FrameKeys, Header, Me, Session};
use std::hint::black_box;

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    let keys = FrameKeys::new(&[7; 32], None);
    let datagram = vec![0x41u8; 1200];
    let me = Me { host: 1, epoch: 0x1234 };
    let f = Frame {
        header: Header { from_host: 2, to_host: 1, from_epoch: 0x5678, to_epoch: me.epoch, seq: 1, ack: 0 },
        body: Body::Data {
            client: "198.18.1.2:50000".parse().unwrap(),
            local: "198.19.9.9:443".parse().unwrap(),
            datagram: &datagram,
        },
    };
    let mut out = Vec::with_capacity(1400);
    let mut g = c.benchmark_group(format!("{p}peer"));
    g.throughput(Throughput::Elements(1));
    g.bench_function("seal_1200", |b| b.iter(|| seal(&keys.current, black_box(&f), &mut out)));
    seal(&keys.current, &f, &mut out);
    let sealed = out.clone();
    let mut s = Session::default();
    let mut seq = 0u64;
    g.bench_function("open_and_accept_1200", |b| {
        b.iter(|| {
            seq += 1;
            let fr = open(&keys, black_box(&sealed)).unwrap();
            // The same frame each time: the sequence number is varied so that the
            // window takes the accepting path.
            let h = Header { seq, ..fr.header };
            black_box(s.receive(me, &h, 0))
        })
    });
    g.finish();
}

testkit::criterion_main_both_clocks!(benches);
