//! The demux hop's latency under load (`bench all` without `--no-latency`): at
//! 0/25/50/75 % of the io_uring demux's measured saturation, one way with the
//! in-bench probe, or as round trips with `udpflood --latency` (`--udpflood`).

use super::contenders::{demux_ready, pinned, ChildGuard, Sinks};
use super::Opts;
use crate::dataplane::{
    data_hello, send_rec, sink, start_demux, start_demux_with, stat_cpu_s, Demux, DATAGRAM, SINK_RCVTIMEO,
};
use crate::load::{send_load, Load, DCID, LOOPBACK_ANY, SHORT_HEADER_FORM};
use crate::sys::pin;
use anyhow::{bail, Context, Result};
use proto::cid::{KeySet, CID_RANDOM_LEN};
use proto::ServerId;
use serde_json::{json, Value};
use std::net::UdpSocket;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The loads of the latency runs, in % of the demux's saturation (0: probes only).
pub(super) const LOADS_PCT: [u32; 4] = [0, 25, 50, 75];

/// Where a latency run's probes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum LatPath {
    /// Through the io_uring demux to a probe worker (the default, and the goal's).
    Demux,
    /// The same with the demux at `--busy-poll-us` (the run's `Opts::busy_poll_us`).
    BusyPoll,
    /// Straight to the probe thread's own UDP socket: the direct-socket floor (the
    /// demux still runs and takes the background load).
    Direct,
}

impl LatPath {
    pub(super) fn name(self) -> &'static str {
        match self {
            LatPath::Demux => "demux",
            LatPath::BusyPoll => "demux, busy poll",
            LatPath::Direct => "direct socket",
        }
    }
}

/// The paths of one round's latency runs at each load: the demux alone, or with
/// `--busy-poll-us` also the busy-polling demux and the direct floor, their order
/// rotating from round to round (this VM's speed drifts).
pub(super) fn latency_paths(o: &Opts, rep: usize) -> Vec<LatPath> {
    if o.busy_poll_us == 0 || o.udpflood {
        return vec![LatPath::Demux];
    }
    let mut v = vec![LatPath::Direct, LatPath::Demux, LatPath::BusyPoll];
    v.rotate_left(rep % 3);
    v
}

#[derive(Clone, Debug)]
pub(super) struct LatRow {
    pub(super) pct: u32,
    pub(super) rep: usize,
    pub(super) path: LatPath,
    pub(super) offered: f64,
    pub(super) v: Value,
}

pub(super) fn run_latency(pct: u32, rep: usize, sat: f64, path: LatPath, o: &Opts, bins: &Path) -> Result<LatRow> {
    if o.udpflood {
        run_latency_udpflood(pct, rep, sat, o, bins)
    } else {
        run_latency_probe(pct, rep, sat, path, o, bins)
    }
}

fn now_ns() -> u64 {
    ::sys::monotonic_ns()
}

/// A probe datagram after the short header's DCID: the magic, a sequence number
/// (u32) and the CLOCK_MONOTONIC send time in ns (u64), all big-endian.
const PROBE_MAGIC: &[u8; 4] = b"QDBP";
const PROBE_MAGIC_AT: Range<usize> = DCID.end..DCID.end + 4;
const PROBE_SEQ_AT: Range<usize> = PROBE_MAGIC_AT.end..PROBE_MAGIC_AT.end + 4;
const PROBE_TIME_AT: Range<usize> = PROBE_SEQ_AT.end..PROBE_SEQ_AT.end + 8;
/// The probe worker's receive buffer: a frame header and the largest datagram.
const PROBE_BUF: usize = 70_000;
/// Server id of the probe worker (one-way) or the first echo worker (round trips).
const PROBE_ID: u16 = 1;
/// Server ids of udpflood's echo workers.
const ECHO_IDS: [u16; 2] = [1, 2];
/// Server id of the sink-only worker that takes the background load.
const BACKGROUND_ID: u16 = 3;
/// SCHED_FIFO priority of the demux and the probe threads (`--no-rt`: none).
const FIFO_PRIO: i32 = 10;
/// The background load starts this long before the probes and ends this much
/// after them (it runs `--latency-seconds` + `BACKGROUND_EXTRA`).
const BACKGROUND_LEAD: Duration = Duration::from_millis(250);
const BACKGROUND_EXTRA: Duration = Duration::from_millis(500);
/// Time for the last probes to arrive before the probe worker stops.
const PROBE_DRAIN: Duration = Duration::from_millis(200);
/// udpflood's own wait for the last echoes (its `--drain-ms`).
const UDPFLOOD_DRAIN_MS: &str = "300";

/// SCHED_FIFO at `prio` for every thread of `pid` (0: the calling thread).
fn fifo(pid: u32, prio: i32) {
    let p = libc::sched_param { sched_priority: prio };
    let tids: Vec<i32> = if pid == 0 {
        vec![0]
    } else {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|rd| rd.flatten().filter_map(|t| t.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default()
    };
    for t in tids {
        // SAFETY: sched_setscheduler with a live sched_param.
        if unsafe { libc::sched_setscheduler(t, libc::SCHED_FIFO, &p) } != 0 {
            eprintln!("bench: SCHED_FIFO for {t}: {}", std::io::Error::last_os_error());
        }
    }
}

/// A worker for server id `id` that timestamps each probe frame on arrival: one-way
/// latency = arrival − the CLOCK_MONOTONIC send time in the probe (same host clock).
fn probe_sink(
    d: &Demux,
    id: u16,
    core: usize,
    stop: Arc<AtomicBool>,
    rt: bool,
) -> Result<std::thread::JoinHandle<hdrhistogram::Histogram<u64>>> {
    use proto::wire::frame::HEADER_LEN as FRAME_HEADER_LEN;
    use proto::wire::Data;
    use std::os::fd::AsFd;
    let mut buf = vec![0u8; PROBE_BUF];
    let fd = data_hello(d, id, false, &mut buf)?;
    send_rec(fd.as_fd(), &Data::Ready)?;
    crate::sys::sink_timeout(&fd, SINK_RCVTIMEO);
    Ok(std::thread::spawn(move || {
        let mut h = probe_thread(core, rt);
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: receives into a live buffer.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let t = now_ns();
            if n <= 0 {
                continue;
            }
            record_probe(&mut h, &buf[FRAME_HEADER_LEN.min(n as usize)..n as usize], t);
        }
        h
    }))
}

/// A probe receiving thread's set-up: pinned to `core`, SCHED_FIFO with `rt`; its
/// empty histogram of one-way times in ns.
fn probe_thread(core: usize, rt: bool) -> hdrhistogram::Histogram<u64> {
    pin(core);
    if rt {
        fifo(0, FIFO_PRIO);
    }
    hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("bounds")
}

/// Records a probe's one-way time (`arrival` − its send time) when `p` is one.
fn record_probe(h: &mut hdrhistogram::Histogram<u64>, p: &[u8], arrival: u64) {
    if p.len() >= PROBE_TIME_AT.end && &p[PROBE_MAGIC_AT] == PROBE_MAGIC {
        let sent = u64::from_be_bytes(p[PROBE_TIME_AT].try_into().expect("8 bytes"));
        let _ = h.record(arrival.saturating_sub(sent).max(1));
    }
}

/// The direct-socket floor's probe receiver: a UDP socket of its own on loopback,
/// read by a thread on `core` exactly as the probe worker reads its data connection
/// (one blocking recv per probe). Returns the socket's address.
#[allow(clippy::type_complexity)]
fn direct_probe_sink(
    core: usize,
    stop: Arc<AtomicBool>,
    rt: bool,
) -> Result<(std::net::SocketAddr, std::thread::JoinHandle<hdrhistogram::Histogram<u64>>)> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.set_read_timeout(Some(SINK_RCVTIMEO))?;
    let addr = sock.local_addr()?;
    Ok((
        addr,
        std::thread::spawn(move || {
            let mut h = probe_thread(core, rt);
            let mut buf = vec![0u8; PROBE_BUF];
            while !stop.load(Ordering::Relaxed) {
                let Ok(n) = sock.recv(&mut buf) else { continue };
                let t = now_ns();
                record_probe(&mut h, &buf[..n], t);
            }
            h
        }),
    ))
}

/// The background load of a latency run: a nice-0 sender thread (the rest runs at
/// `--nice`, so the probe path is not queued behind it on the load core) to the
/// sink-only worker, at the share `pct` of the saturation `sat` less the probes.
struct Background {
    /// Offered in all, probes included.
    offered: f64,
    /// Offered by the background sender.
    rate: f64,
    thread: std::thread::JoinHandle<Result<Load>>,
}

impl Background {
    fn start(d: &Demux, ks: &KeySet, pct: u32, sat: f64, o: &Opts) -> Background {
        let offered = sat * f64::from(pct) / 100.0;
        let rate = (offered - o.probe_rate).max(0.0);
        let (addr, ks, core) = (d.udp, ks.clone(), o.load_core);
        let secs = o.lat_seconds + BACKGROUND_EXTRA.as_secs_f64();
        let thread = std::thread::spawn(move || {
            if rate > 0.0 {
                send_load(addr, &ks, &[BACKGROUND_ID], 1, secs, rate, core, Some(0))
            } else {
                Ok(Load { sent: 0, secs, cpu_s: 0.0 })
            }
        });
        std::thread::sleep(BACKGROUND_LEAD);
        Background { offered, rate, thread }
    }

    /// Waits for the sender; the figures it adds to the run's JSON.
    fn finish(self) -> Result<Value> {
        let load = self.thread.join().map_err(|_| anyhow::anyhow!("background sender panicked"))??;
        Ok(json!({"background_offered": self.rate, "background_sent_per_s": load.sent as f64 / load.secs}))
    }
}

/// The demux hop alone: probes from this process (load core) to the io_uring demux
/// (shard core) to a probe worker back in this process; one-way times in an HDR
/// histogram. Background load from a nice-0 thread to a sink-only worker.
fn run_latency_probe(pct: u32, rep: usize, sat: f64, path: LatPath, o: &Opts, bins: &Path) -> Result<LatRow> {
    let d = match path {
        LatPath::BusyPoll => {
            let us = o.busy_poll_us.to_string();
            let flags = ["--io", "uring", "--forward", "seqpacket", "--busy-poll-us", &us];
            start_demux_with(&bins.join("demux"), "uring-busy-poll", o.shard_core, &flags)?
        }
        LatPath::Demux | LatPath::Direct => start_demux(&bins.join("demux"), "uring", o.shard_core)?,
    };
    let bg_sink = background_sink(&d, o)?;
    let pstop = Arc::new(AtomicBool::new(false));
    let (target, probe) = match path {
        LatPath::Direct => direct_probe_sink(o.load_core, pstop.clone(), o.rt)?,
        LatPath::Demux | LatPath::BusyPoll => (d.udp, probe_sink(&d, PROBE_ID, o.load_core, pstop.clone(), o.rt)?),
    };
    // The background sink, and the probe worker unless the probes bypass the demux.
    demux_ready(&d, if path == LatPath::Direct { 1 } else { 2 })?;
    // The demux as it would run on a core of its own: SCHED_FIFO, so the shared
    // machine's other processes do not delay its wake-ups. Not when it busy-polls: a
    // shard that never sleeps would be held by the kernel's real-time throttling
    // (sched_rt_runtime_us: 95 % of each second, then 50 ms off the CPU), and a
    // spinning shard has no wake-ups to speed up.
    if o.rt && path != LatPath::BusyPoll {
        fifo(d.child.id(), FIFO_PRIO);
    }
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let bg = Background::start(&d, &ks, pct, sat, o);
    // Probes: 1200-byte short headers for server id 1, paced, from one socket.
    let sock = UdpSocket::bind(LOOPBACK_ANY)?;
    sock.connect(target)?;
    let (cpu0, t0) = (stat_cpu_s(d.child.id()), Instant::now());
    let mut r = [0u8; CID_RANDOM_LEN];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut r))?;
    let cid = ks.encode(ServerId(PROBE_ID), &r);
    let mut p = vec![0u8; DATAGRAM];
    p[0] = SHORT_HEADER_FORM;
    p[DCID].copy_from_slice(&cid);
    p[PROBE_MAGIC_AT].copy_from_slice(PROBE_MAGIC);
    let n = (o.lat_seconds * o.probe_rate) as u64;
    let probe_core = o.load_core;
    let probe_rate = o.probe_rate;
    let rt = o.rt;
    let sent = std::thread::scope(|sc| {
        sc.spawn(|| {
            pin(probe_core);
            if rt {
                fifo(0, FIFO_PRIO);
            }
            let start = Instant::now();
            let mut sent = 0u64;
            for k in 0..n {
                let due = start + Duration::from_secs_f64(k as f64 / probe_rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                p[PROBE_SEQ_AT].copy_from_slice(&(k as u32).to_be_bytes());
                p[PROBE_TIME_AT].copy_from_slice(&now_ns().to_be_bytes());
                if sock.send(&p).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
        .join()
        .unwrap_or(0)
    });
    let (offered, background) = (bg.offered, bg.finish()?);
    // The demux's CPU over the probes and the background's tail (clock ticks of 10 ms).
    let demux_cpu_share = (stat_cpu_s(d.child.id()) - cpu0) / t0.elapsed().as_secs_f64();
    std::thread::sleep(PROBE_DRAIN);
    pstop.store(true, Ordering::Relaxed);
    let h = probe.join().map_err(|_| anyhow::anyhow!("probe sink panicked"))?;
    drop(d);
    drop(bg_sink);
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let mut v = json!({
        "sent": sent, "received": h.len(), "lost": sent.saturating_sub(h.len()),
        "p50_us": us(0.5), "p90_us": us(0.9), "p99_us": us(0.99), "p999_us": us(0.999), "max_us": h.max() as f64 / 1000.0,
        "mean_us": h.mean() / 1000.0, "path": path.name(), "demux_cpu_share": demux_cpu_share,
    });
    add_background(&mut v, background);
    Ok(LatRow { pct, rep, path, offered, v })
}

/// The sink-only worker (`BACKGROUND_ID`) that takes the background load.
fn background_sink(d: &Demux, o: &Opts) -> Result<Sinks> {
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    Ok(Sinks { stop: stop.clone(), threads: vec![sink(d, BACKGROUND_ID, o.load_core, stop, frames)?] })
}

/// The background figures into a run's JSON object.
fn add_background(v: &mut Value, background: Value) {
    if let (Some(v), Value::Object(b)) = (v.as_object_mut(), background) {
        v.extend(b);
    }
}

/// Round trips through the demux hop: `udpflood --latency` to two `worker --echo`.
fn run_latency_udpflood(pct: u32, rep: usize, sat: f64, o: &Opts, bins: &Path) -> Result<LatRow> {
    let d = start_demux(&bins.join("demux"), "uring", o.shard_core)?;
    // Background load goes to a sink; probes to two echo workers.
    let sinks = background_sink(&d, o)?;
    let keys = d.dir.join("keys");
    let mut workers = Vec::new();
    for id in ECHO_IDS {
        let mut cmd = Command::new(bins.join("worker"));
        cmd.args(["--echo", "--server-id", &id.to_string(), "--keys"])
            .arg(&keys)
            .arg("--data-socket")
            .arg(&d.data)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        workers.push(ChildGuard(pinned(&mut cmd, o.load_core).spawn().context("worker --echo")?));
    }
    demux_ready(&d, ECHO_IDS.len() + 1)?;
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let bg = Background::start(&d, &ks, pct, sat, o);
    let mut cmd = Command::new(bins.join("udpflood"));
    cmd.args(["--latency", "--target", &d.udp.to_string(), "--keys"])
        .arg(&keys)
        .arg("--server-ids")
        .arg(ECHO_IDS.map(|id| id.to_string()).join(","))
        .args(["--size", &DATAGRAM.to_string(), "--json", "--quiet", "--drain-ms", UDPFLOOD_DRAIN_MS])
        .args(["--rate", &o.probe_rate.to_string(), "--duration", &o.lat_seconds.to_string()]);
    let out = pinned(&mut cmd, o.load_core).stderr(Stdio::inherit()).output().context("udpflood --latency")?;
    let (offered, background) = (bg.offered, bg.finish()?);
    drop(workers);
    drop(d);
    drop(sinks);
    if !out.status.success() {
        bail!("udpflood --latency: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v: Value = serde_json::from_str(text.lines().rev().find(|l| l.starts_with('{')).unwrap_or("{}"))
        .context("udpflood --latency --json output")?;
    add_background(&mut v, background);
    Ok(LatRow { pct, rep, path: LatPath::Demux, offered, v })
}
