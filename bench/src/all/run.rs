//! One measured run of `bench all`: a contender, an offered rate and a train size;
//! the contender's CPU time and counters around the sender's load.

use super::contenders::{start, DirGuard};
use super::Opts;
use crate::dataplane::cpu_ns;
use crate::load::send_load;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[derive(Clone, Debug)]
pub(super) struct Row {
    pub(super) contender: String,
    pub(super) offered: f64,
    pub(super) train: usize,
    pub(super) rep: usize,
    pub(super) sent: u64,
    pub(super) received: u64,
    pub(super) handled: u64,
    pub(super) cpu_s: f64,
    pub(super) secs: f64,
    pub(super) sender_cpu_s: f64,
    /// Time the contender's threads were runnable but waited for a CPU.
    pub(super) wait_s: f64,
}

impl Row {
    pub(super) fn us(&self) -> f64 {
        self.cpu_s * 1e6 / self.handled.max(1) as f64
    }
    pub(super) fn rate(&self) -> f64 {
        self.handled as f64 / self.secs
    }
}

pub(super) fn run_once(
    kind: &str,
    offered: f64,
    train: usize,
    rep: usize,
    o: &Opts,
    bins: &Path,
    tmp: &Path,
) -> Result<Row> {
    let dir = tmp.join(format!("{kind}-{offered}-{train}-{rep}"));
    std::fs::create_dir_all(&dir)?;
    let _dg = DirGuard(dir.clone());
    let r = start(kind, o, bins, &dir, train)?;
    // BENCH_PERF=DIR: `perf record -e cpu-clock -g` of the contender per run.
    let perf = match std::env::var("BENCH_PERF") {
        Ok(dir) => Some(
            Command::new("perf")
                .args(["record", "-q", "-e", "cpu-clock", "-g", "-p", &r.pid.to_string(), "-o"])
                .arg(format!("{dir}/{kind}-{offered}-{train}-{rep}.perf.data"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("perf record")?,
        ),
        Err(_) => None,
    };
    let (c0, cpu0, w0) = ((r.counts)()?, cpu_ns(r.pid), wait_ns(r.pid));
    let load = send_load(r.addr, &r.ks, &r.ids, train, o.seconds, offered, o.load_core, None)?;
    std::thread::sleep(Duration::from_millis(300));
    let (c1, cpu1, w1) = ((r.counts)()?, cpu_ns(r.pid), wait_ns(r.pid));
    if let Some(mut p) = perf {
        // SAFETY: SIGINT to the perf child we spawned, so it writes its file.
        unsafe { libc::kill(p.id() as i32, libc::SIGINT) };
        let _ = p.wait();
    }
    if cpu1 == 0 {
        bail!("no CPU time readable for pid {}", r.pid);
    }
    Ok(Row {
        contender: kind.to_string(),
        offered,
        train,
        rep,
        sent: load.sent,
        received: c1.0 - c0.0,
        handled: c1.1 - c0.1,
        cpu_s: (cpu1 - cpu0) as f64 / 1e9,
        secs: load.secs,
        sender_cpu_s: load.cpu_s,
        wait_s: (w1 - w0) as f64 / 1e9,
    })
}

/// Nanoseconds all threads of `pid` waited on a run queue (schedstat field 2).
fn wait_ns(pid: u32) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().nth(1).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}
