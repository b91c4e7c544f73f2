//! What the demux benches share: the two clocks every benchmark runs under (as in
//! proto/benches: criterion's wall clock, and prefix `cpu/` the benchmark thread's own
//! on-CPU time, which does not count the time the thread spent preempted on a shared,
//! loaded machine), chunked timing with untimed work between chunks, and the config.

#![allow(dead_code)] // each bench uses its part

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput};
use std::time::Duration;

/// On-CPU nanoseconds of the calling thread: `CLOCK_THREAD_CPUTIME_ID` (the
/// scheduler's `sum_exec_runtime` brought up to the current instant, as proto's
/// `/proc/thread-self/schedstat` reading; a cheaper read, because [`chunked`] takes
/// one per chunk).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime(2) writes one timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "CLOCK_THREAD_CPUTIME_ID");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A criterion measurement of thread CPU time.
pub struct ThreadCpu;
struct Ns;

impl ValueFormatter for Ns {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns (cpu)"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let n = match t {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Elements(n) => *n as f64,
        };
        for v in values {
            *v = n * 1e9 / *v;
        }
        "elem/s (cpu)"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns().saturating_sub(i)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Ns
    }
}

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

/// Two shared, noisy cores: few, long samples (flat sampling in the groups), as in
/// proto/benches/proto.rs; `--warm-up-time` / `--measurement-time` override.
pub fn config<M: Measurement>(m: M) -> Criterion<M> {
    Criterion::default()
        .with_measurement(m)
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6))
}
