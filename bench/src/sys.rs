//! Linux pieces both benches use: pinning, AF_UNIX SEQPACKET sockets, receive
//! timeouts, a recvmmsg drain loop, /proc figures and `BENCH_PERF` profiles.

use anyhow::{Context, Result};
use std::mem::zeroed;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Pins the calling thread to `core`.
pub(crate) fn pin(core: usize) {
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// SO_RCVTIMEO: a blocking receive on `fd` returns after `t` without data (so a
/// loop sees its stop flag).
pub(crate) fn set_rcvtimeo(fd: RawFd, t: Duration) {
    let _ = sys::sockopt::set_recv_timeout(fd, Some(t));
}

/// A SEQPACKET connection to the listener at `path`.
pub(crate) fn seqpacket_connect(path: &Path) -> Result<OwnedFd> {
    Ok(sys::seqpacket::connect(path)?)
}

/// A SEQPACKET listener at `path` (replacing a stale one) with a backlog of
/// `backlog`; accept waits at most `accept_timeout`.
pub(crate) fn seqpacket_listen(path: &Path, backlog: i32, accept_timeout: Duration) -> Result<OwnedFd> {
    let _ = std::fs::remove_file(path);
    let fd = sys::seqpacket::listen(path, backlog)?;
    set_rcvtimeo(fd.as_raw_fd(), accept_timeout);
    Ok(fd)
}

/// Messages per recvmmsg in a drain loop.
const DRAIN_BATCH: usize = 64;
/// Bytes per message buffer: a 64 KiB GRO train plus a frame header.
pub(crate) const DRAIN_MSG_LEN: usize = 65_536 + 64;

/// recvmmsg (up to `DRAIN_BATCH`, MSG_WAITFORONE) on `fd` and add the messages to
/// `count` until `stop` is set or the peer closes; `fd` should have a receive
/// timeout (`set_rcvtimeo`) so that `stop` is seen.
pub(crate) fn drain_count(fd: RawFd, stop: &AtomicBool, count: &AtomicU64) {
    let mut data = vec![0u8; DRAIN_BATCH * DRAIN_MSG_LEN];
    let mut iovs: Vec<libc::iovec> = (0..DRAIN_BATCH)
        .map(|i| libc::iovec { iov_base: data[i * DRAIN_MSG_LEN..].as_mut_ptr().cast(), iov_len: DRAIN_MSG_LEN })
        .collect();
    // SAFETY: plain old data.
    let mut msgs: Vec<libc::mmsghdr> = (0..DRAIN_BATCH).map(|_| unsafe { zeroed() }).collect();
    for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: msgs point at live buffers; MSG_WAITFORONE returns after one.
        let r = unsafe {
            libc::recvmmsg(fd, msgs.as_mut_ptr(), DRAIN_BATCH as u32, libc::MSG_WAITFORONE, std::ptr::null_mut())
        };
        if r > 0 {
            count.fetch_add(r as u64, Ordering::Relaxed);
        } else if r == 0 {
            return;
        }
    }
}

/// schedstat(5) fields, in nanoseconds.
#[derive(Clone, Copy)]
pub(crate) enum Schedstat {
    /// Time on a CPU.
    OnCpu = 0,
    /// Time runnable but waiting on a run queue.
    Waiting = 1,
}

/// `field` summed over every thread of `pid` (0 when unreadable).
pub(crate) fn schedstat_ns(pid: u32, field: Schedstat) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().nth(field as usize).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

/// The CPU's model name from /proc/cpuinfo ("" when unknown).
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|x| x.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_default()
}

/// `BENCH_PERF=DIR`: `perf record -e cpu-clock -g` (no hardware counters needed) of
/// one process into DIR/<name>.perf.data, from `start` until `stop`.
pub(crate) struct Perf(Child);

impl Perf {
    /// None without BENCH_PERF.
    pub(crate) fn start(pid: u32, name: &str) -> Result<Option<Perf>> {
        let Ok(dir) = std::env::var("BENCH_PERF") else { return Ok(None) };
        let child = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-g", "-p", &pid.to_string(), "-o"])
            .arg(format!("{dir}/{name}.perf.data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("perf record")?;
        Ok(Some(Perf(child)))
    }

    /// SIGINT, so perf writes its file, and wait for it.
    pub(crate) fn stop(mut self) {
        // SAFETY: SIGINT to the perf child we spawned.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}
