//! What a CID decode costs inside an eBPF program (docs/adr/0007-quic-lb.md), timed
//! by the kernel: BPF_PROG_TEST_RUN runs each XDP program of bpf/cid_cost.bpf.c
//! `REPEAT` times on one 64-byte packet and reports the average time per run; this
//! prints, for `ROUNDS` rounds, each program's time and the time less `baseline`
//! (the harness's own cost), then the median of each. Needs CAP_BPF (root).
//! Run: `cargo bench -p quicdemux-fastpath --bench cid_cost`.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use fastpath::cid_cost::{CostProgram, CostPrograms};
use std::time::Duration;

const REPEAT: u32 = 200_000;
const ROUNDS: usize = 9;

fn main() {
    let key: [u8; 16] = core::array::from_fn(|i| i as u8);
    let mut p = match CostPrograms::load(&key, proto::cid::SipHashKey { k0: 1, k1: 2 }) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cid_cost: BPF programs cannot be loaded here: {e}");
            return;
        }
    };
    let block: [u8; 16] = core::array::from_fn(|i| (i as u8).wrapping_mul(37));
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); CostProgram::ALL.len()];
    for _ in 0..ROUNDS {
        for (i, which) in CostProgram::ALL.into_iter().enumerate() {
            samples[i].push(p.run(which, &block, REPEAT).unwrap().1);
        }
    }
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let base = median(&samples[0]);
    println!("cid_cost: BPF_PROG_TEST_RUN, {REPEAT} runs per sample, {ROUNDS} samples, medians");
    for (i, which) in CostProgram::ALL.into_iter().enumerate() {
        let m = median(&samples[i]);
        println!(
            "cid_cost/{:<9} {:>7.1} ns per run, {:>7.1} ns above baseline",
            which.name(),
            m.as_nanos() as f64,
            m.as_nanos() as f64 - base.as_nanos() as f64
        );
    }
}
