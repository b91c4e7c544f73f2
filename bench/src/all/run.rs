//! One measured run of `bench all`: a contender, an offered rate and a train size;
//! the contender's CPU time and counters around the sender's load.

use super::contenders::{start, DirGuard};
use super::Opts;
use crate::load::{send_load, SETTLE};
use crate::sys::{schedstat_ns, Perf, Schedstat::*};
use anyhow::{bail, Result};
use std::path::Path;

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
    let perf = Perf::start(r.pid, &format!("{kind}-{offered}-{train}-{rep}"))?;
    let (c0, cpu0, w0) = ((r.counts)()?, schedstat_ns(r.pid, OnCpu), schedstat_ns(r.pid, Waiting));
    let load = send_load(r.addr, &r.ks, &r.ids, train, o.seconds, offered, o.load_core, None)?;
    std::thread::sleep(SETTLE);
    let (c1, cpu1, w1) = ((r.counts)()?, schedstat_ns(r.pid, OnCpu), schedstat_ns(r.pid, Waiting));
    if let Some(p) = perf {
        p.stop();
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
