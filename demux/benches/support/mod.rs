//! What the demux benches share: the two clocks every benchmark runs under
//! (testkit::cpu_clock: criterion's wall clock, and prefix `cpu/` the benchmark
//! thread's own on-CPU time), chunked timing with untimed work between chunks, and
//! the config.

#![allow(dead_code)] // each bench uses its part

use criterion::measurement::{Measurement, WallTime};

pub use testkit::cpu_clock::{config, ThreadCpu};

/// A measurement [`chunked`] can read by itself (criterion's `iter_custom` hands the
/// routine no measurement).
pub trait Clock: Measurement + 'static {
    fn get() -> Self;
}
impl Clock for WallTime {
    fn get() -> Self {
        WallTime
    }
}
impl Clock for ThreadCpu {
    fn get() -> Self {
        ThreadCpu
    }
}

/// Times `iters` calls of `routine` on `state`, at most `chunk` in a row, running
/// `between` untimed after every chunk (a flush, draining the receiving end): for
/// `b.iter_custom(|iters| chunked::<M, _>(iters, ..))`. Each chunk costs two clock reads.
pub fn chunked<M: Clock, S>(
    iters: u64,
    chunk: u64,
    state: &mut S,
    mut routine: impl FnMut(&mut S),
    mut between: impl FnMut(&mut S),
) -> M::Value {
    let m = M::get();
    let mut total = m.zero();
    let mut left = iters;
    while left > 0 {
        let n = left.min(chunk);
        let start = m.start();
        for _ in 0..n {
            routine(state);
        }
        total = m.add(&total, &m.end(start));
        between(state);
        left -= n;
    }
    total
}
