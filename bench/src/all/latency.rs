//! The demux hop's latency under load (`bench all` without `--no-latency`): at
//! 0/25/50/75 % of the io_uring demux's measured saturation, one way with the
//! in-bench probe, or as round trips with `udpflood --latency` (`--udpflood`).

use super::contenders::{demux_ready, pinned, ChildGuard, Sinks};
use super::Opts;
use crate::dataplane::{pin, sink, start_demux, Demux, DATAGRAM};
use crate::load::{send_load, Load};
use anyhow::{bail, Context, Result};
use proto::ServerId;
use serde_json::{json, Value};
use std::mem::{size_of, zeroed};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The loads of the latency runs, in % of the demux's saturation (0: probes only).
pub(super) const LOADS_PCT: [u32; 4] = [0, 25, 50, 75];

#[derive(Clone, Debug)]
pub(super) struct LatRow {
    pub(super) pct: u32,
    pub(super) rep: usize,
    pub(super) offered: f64,
    pub(super) v: Value,
}

pub(super) fn run_latency(pct: u32, rep: usize, sat: f64, o: &Opts, bins: &Path) -> Result<LatRow> {
    if o.udpflood {
        run_latency_udpflood(pct, rep, sat, o, bins)
    } else {
        run_latency_probe(pct, rep, sat, o, bins)
    }
}

fn now_ns() -> u64 {
    // SAFETY: a live timespec.
    let mut ts: libc::timespec = unsafe { zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const PROBE_MAGIC: &[u8; 4] = b"QDBP";

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
    use proto::wire::{Control, FRAME_HEADER_LEN};
    let fd = crate::dataplane::seqpacket_connect(&d.data)?;
    crate::dataplane::send_rec(fd.as_raw_fd(), &Control::DataHello { server_id: ServerId(id) })?;
    let mut buf = vec![0u8; 70_000];
    match crate::dataplane::recv_rec(fd.as_raw_fd(), &mut buf)? {
        Control::Sockets { .. } => {}
        other => bail!("expected Sockets, got {other:?}"),
    }
    crate::dataplane::send_rec(fd.as_raw_fd(), &Control::Ready)?;
    let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
    // SAFETY: live timeval of the right size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    Ok(std::thread::spawn(move || {
        pin(core);
        if rt {
            fifo(0, 10);
        }
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("bounds");
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: receives into a live buffer.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let t = now_ns();
            if n <= 0 {
                continue;
            }
            let p = &buf[FRAME_HEADER_LEN.min(n as usize)..n as usize];
            if p.len() >= 29 && &p[13..17] == PROBE_MAGIC {
                let sent = u64::from_be_bytes(p[21..29].try_into().expect("8 bytes"));
                let _ = h.record(t.saturating_sub(sent).max(1));
            }
        }
        h
    }))
}

/// The demux hop alone: probes from this process (load core) to the io_uring demux
/// (shard core) to a probe worker back in this process; one-way times in an HDR
/// histogram. Background load from a nice-0 thread to a sink-only worker.
fn run_latency_probe(pct: u32, rep: usize, sat: f64, o: &Opts, bins: &Path) -> Result<LatRow> {
    let d = start_demux(&bins.join("demux"), "uring", o.shard_core)?;
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    let bg_sink = Sinks { stop: stop.clone(), threads: vec![sink(&d, 3, o.load_core, stop.clone(), frames)?] };
    let pstop = Arc::new(AtomicBool::new(false));
    let probe = probe_sink(&d, 1, o.load_core, pstop.clone(), o.rt)?;
    demux_ready(&d, 2)?;
    if o.rt {
        // The demux as it would run on a core of its own: SCHED_FIFO, so the shared
        // machine's other processes do not delay its wake-ups.
        fifo(d.child.id(), 10);
    }
    let offered = sat * f64::from(pct) / 100.0;
    let bg = (offered - o.probe_rate).max(0.0);
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (addr, secs, core) = (d.udp, o.lat_seconds + 0.5, o.load_core);
    let ks2 = ks.clone();
    let bg_thread = std::thread::spawn(move || {
        if bg > 0.0 {
            send_load(addr, &ks2, &[3], 1, secs, bg, core, Some(0))
        } else {
            Ok(Load { sent: 0, secs, cpu_s: 0.0 })
        }
    });
    std::thread::sleep(Duration::from_millis(250));
    // Probes: 1200-byte short headers for server id 1, paced, from one socket.
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(d.udp)?;
    let mut r = [0u8; 10];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut r))?;
    let cid = ks.encode(ServerId(1), &r);
    let mut p = vec![0u8; DATAGRAM];
    p[0] = 0x40;
    p[1..13].copy_from_slice(&cid);
    p[13..17].copy_from_slice(PROBE_MAGIC);
    let n = (o.lat_seconds * o.probe_rate) as u64;
    let probe_core = o.load_core;
    let probe_rate = o.probe_rate;
    let rt = o.rt;
    let sent = std::thread::scope(|sc| {
        sc.spawn(|| {
            pin(probe_core);
            if rt {
                fifo(0, 10);
            }
            let start = Instant::now();
            let mut sent = 0u64;
            for k in 0..n {
                let due = start + Duration::from_secs_f64(k as f64 / probe_rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                p[17..21].copy_from_slice(&(k as u32).to_be_bytes());
                p[21..29].copy_from_slice(&now_ns().to_be_bytes());
                if sock.send(&p).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
        .join()
        .unwrap_or(0)
    });
    let load = bg_thread.join().map_err(|_| anyhow::anyhow!("background sender panicked"))??;
    std::thread::sleep(Duration::from_millis(200));
    pstop.store(true, Ordering::Relaxed);
    let h = probe.join().map_err(|_| anyhow::anyhow!("probe sink panicked"))?;
    drop(d);
    drop(bg_sink);
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let v = json!({
        "sent": sent, "received": h.len(), "lost": sent.saturating_sub(h.len()),
        "p50_us": us(0.5), "p90_us": us(0.9), "p99_us": us(0.99), "p999_us": us(0.999), "max_us": h.max() as f64 / 1000.0,
        "mean_us": h.mean() / 1000.0, "background_offered": bg, "background_sent_per_s": load.sent as f64 / load.secs,
    });
    Ok(LatRow { pct, rep, offered, v })
}

fn run_latency_udpflood(pct: u32, rep: usize, sat: f64, o: &Opts, bins: &Path) -> Result<LatRow> {
    let d = start_demux(&bins.join("demux"), "uring", o.shard_core)?;
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    // Background load goes to a sink (server id 3); probes to two echo workers (1, 2).
    // The background sender runs at nice 0 (the rest at --nice) so that the probe
    // path — udpflood, the echo workers — is not queued behind it on the load core.
    let sinks = Sinks { stop: stop.clone(), threads: vec![sink(&d, 3, o.load_core, stop.clone(), frames)?] };
    let keys = d.dir.join("keys");
    let mut workers = Vec::new();
    for id in 1..=2u16 {
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
    demux_ready(&d, 3)?;
    let offered = sat * f64::from(pct) / 100.0;
    let bg = (offered - o.probe_rate).max(0.0);
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (addr, secs, core) = (d.udp, o.lat_seconds + 0.5, o.load_core);
    let bg_thread = std::thread::spawn(move || {
        if bg > 0.0 {
            send_load(addr, &ks, &[3], 1, secs, bg, core, Some(0))
        } else {
            Ok(Load { sent: 0, secs, cpu_s: 0.0 })
        }
    });
    std::thread::sleep(Duration::from_millis(250));
    let mut cmd = Command::new(bins.join("udpflood"));
    cmd.args(["--latency", "--target", &d.udp.to_string(), "--keys"])
        .arg(&keys)
        .args(["--server-ids", "1,2", "--size", "1200", "--json", "--quiet", "--drain-ms", "300"])
        .args(["--rate", &o.probe_rate.to_string(), "--duration", &o.lat_seconds.to_string()]);
    let out = pinned(&mut cmd, o.load_core).stderr(Stdio::inherit()).output().context("udpflood --latency")?;
    let load = bg_thread.join().map_err(|_| anyhow::anyhow!("background sender panicked"))??;
    drop(workers);
    drop(d);
    drop(sinks);
    if !out.status.success() {
        bail!("udpflood --latency: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v: Value = serde_json::from_str(text.lines().rev().find(|l| l.starts_with('{')).unwrap_or("{}"))
        .context("udpflood --latency --json output")?;
    v["background_offered"] = json!(bg);
    v["background_sent_per_s"] = json!(load.sent as f64 / load.secs);
    Ok(LatRow { pct, rep, offered, v })
}
