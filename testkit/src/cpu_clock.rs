//! The clocks the criterion benches run under: criterion's wall clock, and
//! [`ThreadCpu`], the benchmark thread's own on-CPU time, which does not count the
//! time the thread spent preempted on a shared, loaded machine; and the bench
//! configuration sized for two shared cores.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, Throughput};
use std::time::Duration;

/// On-CPU nanoseconds of the calling thread: `CLOCK_THREAD_CPUTIME_ID` (the
/// scheduler's `sum_exec_runtime` brought up to the current instant: one vDSO-free
/// syscall, no lag to the last tick, cheap enough to read once per timed chunk).
pub fn thread_cpu_ns() -> u64 {
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

/// Two shared, noisy cores: few, long samples (about 200 ms each; flat sampling in
/// the groups); `--warm-up-time` / `--measurement-time` override.
pub fn config<M: Measurement>(m: M) -> Criterion<M> {
    Criterion::default()
        .with_measurement(m)
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6))
}
