//! `bench fastpath`: the kernel fast path against the floor and the user path, the
//! whole system in one run (established flows, short headers only).
//!
//! Contenders, each started fresh for each run:
//! - `floor`: no demux at all. A sink thread reads its own UDP socket with recvmmsg
//!   (the socket set up like the data plane's: UDP_GRO, IP_PKTINFO, IP_RECVTOS,
//!   8 MiB receive buffer).
//! - `fast`: the release demux (`--fast-path on`, one shard); the same sink connects
//!   with `DataHello` and `CAP_FAST_PATH`, takes its own socket from
//!   `FastSockets` and reads it exactly as the floor reads its socket. The
//!   SK_REUSEPORT program steers the short headers there; the demux never sees them.
//! - `seqpacket`: the demux (`--fast-path off`), the sink reads its data connection.
//! - `ring`: the demux (`--fast-path off --forward ring`), the sink drains its rings.
//!
//! The sink and the demux's shard run on `--shard-core`, the sender on `--load-core`.
//! The sender stamps every datagram with CLOCK_MONOTONIC ns after the DCID; the sink
//! takes the time once per batch it receives and records arrival − send for every
//! datagram in an HDR histogram. CPU: on-CPU time (schedstat) of the sink thread, of
//! every demux thread, of the sender thread, and of the ksoftirqd threads, over the
//! run (before the first send until `SETTLE` after the last).
//!
//! First every contender runs unpaced (the sender as fast as it can); the floor's
//! median rate there is 100 %; then paced runs at `--loads` % of it.

use crate::cli::FastpathArgs;
use crate::dataplane::{
    demux_bin, send_rec, start_demux_with, stat_cpu_s, status, wait_placeable, Demux, DATAGRAM, SINK_RCVTIMEO,
};
use crate::load::{flow_payloads, flow_sockets, DCID, FLOWS, LOOPBACK_ANY, SETTLE};
use crate::report::{command_output, fixed, loadavg, loadavg_now, median, thousands, write_outputs};
use crate::sys::{cpu_model, pin, schedstat_ns, sink_timeout, Schedstat};
use anyhow::{bail, Context, Result};
use proto::cid::KeySet;
use proto::keyfile::KeyFile;
use proto::wire::data::{CAP_FAST_PATH, CAP_RINGS};
use proto::wire::frame::HEADER_LEN as FRAME_HEADER_LEN;
use proto::wire::Data;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::mem::size_of;
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::mmsg::{RecvMmsg, SendMeta, SendMmsg};
use sys::seqpacket::{Channel, Incoming};

/// The sink's server id.
const SINK_ID: u16 = 7;
/// The send time (CLOCK_MONOTONIC ns, big-endian) right after the short header's DCID.
const TS_AT: Range<usize> = DCID.end..DCID.end + 8;
/// Messages per sendmmsg (all on one flow, one time stamp), flows in turn.
const SEND_BATCH: usize = 4;
/// Messages per receive batch of the sink.
const RECV_BATCH: usize = 64;
/// Bytes per receive buffer: a frame header and a datagram, with room.
const RECV_LEN: usize = 2048;
/// How long the demux may take until the sink is placeable.
const LIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The demux socket's receive buffer (demux/src/dataplane/socket.rs): the floor's too.
const RCVBUF: usize = 8 << 20;
/// Markers of the generated block in the doc.
const BEGIN: &str = "<!-- bench fastpath: begin";
const END: &str = "<!-- bench fastpath: end -->";

fn now_ns() -> u64 {
    ::sys::monotonic_ns()
}

fn gettid() -> i32 {
    // SAFETY: gettid(2) has no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// On-CPU ns of thread `tid` of this process.
fn thread_ns(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

/// `--bpf-stats`: the kernel counts each eBPF program's runs and run time while the
/// returned fd is open (bpf(2) BPF_ENABLE_STATS, BPF_STATS_RUN_TIME).
fn enable_bpf_stats() -> Result<OwnedFd> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    let attr = [0u32; 2]; // enable_stats.type = BPF_STATS_RUN_TIME (0)
                          // SAFETY: bpf(2) with a live, zero-padded attr of the given size.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_ptr(), size_of::<[u32; 2]>() as u32) };
    if fd < 0 {
        bail!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as RawFd) })
}

/// (run_time_ns, run_cnt) summed over the sk_reuseport programs `pid` holds
/// (`bpftool prog show --json`; every sk_reuseport program when it lists no pids).
fn reuseport_prog_stats(pid: u32) -> (u64, u64) {
    let Ok(o) = Command::new("bpftool").args(["prog", "show", "--json"]).stderr(Stdio::null()).output() else {
        return (0, 0);
    };
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let mut t = (0, 0);
    for p in v.as_array().into_iter().flatten() {
        if p["type"] != "sk_reuseport" {
            continue;
        }
        if let Some(pids) = p["pids"].as_array() {
            if !pids.iter().any(|x| x["pid"].as_u64() == Some(u64::from(pid))) {
                continue;
            }
        }
        t.0 += p["run_time_ns"].as_u64().unwrap_or(0);
        t.1 += p["run_cnt"].as_u64().unwrap_or(0);
    }
    t
}

/// The pids of the ksoftirqd/N kernel threads.
fn ksoftirqd_pids() -> Vec<u32> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("ksoftirqd/")) {
                v.push(pid);
            }
        }
    }
    v
}

/// What the sink thread counted.
struct SinkOut {
    datagrams: u64,
    /// Receive calls that returned datagrams (rings: non-empty drain passes).
    batches: u64,
    hist: hdrhistogram::Histogram<u64>,
}

/// Where the sink reads.
enum Source {
    /// Its own UDP socket (floor) or the fast socket the data plane gave it.
    Udp(UdpSocket),
    /// Its SEQPACKET data connection: frames.
    Seqpacket,
    /// Its rings (and the data connection, for anything that still comes there).
    Rings(Vec<worker::ring::Consumer>),
}

/// The sink: one thread on the receiving core.
struct Sink {
    stop: Arc<AtomicBool>,
    tid: Arc<AtomicI32>,
    thread: std::thread::JoinHandle<SinkOut>,
}

impl Sink {
    /// `conn`: the data connection (kept open for the sink's lifetime: closing it
    /// retires the worker).
    fn start(src: Source, conn: Option<OwnedFd>, core: usize) -> Sink {
        let stop = Arc::new(AtomicBool::new(false));
        let tid = Arc::new(AtomicI32::new(0));
        let (st, t) = (stop.clone(), tid.clone());
        let thread = std::thread::spawn(move || {
            pin(core);
            t.store(gettid(), Ordering::SeqCst);
            let mut out = SinkOut {
                datagrams: 0,
                batches: 0,
                hist: hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("bounds"),
            };
            match src {
                Source::Udp(u) => {
                    sink_timeout(&u, SINK_RCVTIMEO);
                    recv_loop(u.as_fd(), 0, &st, &mut out);
                }
                Source::Seqpacket => {
                    let fd = conn.as_ref().expect("data connection").as_fd();
                    sink_timeout(fd, SINK_RCVTIMEO);
                    recv_loop(fd, FRAME_HEADER_LEN, &st, &mut out);
                }
                Source::Rings(rings) => {
                    ring_loop(&rings, conn.as_ref().expect("data connection").as_raw_fd(), &st, &mut out)
                }
            }
            drop(conn);
            out
        });
        Sink { stop, tid, thread }
    }

    fn tid(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.tid.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.tid.load(Ordering::SeqCst)
    }

    fn finish(self) -> Result<SinkOut> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow::anyhow!("sink panicked"))
    }
}

/// The send time in `rec` (a datagram after `skip` bytes of frame header).
fn stamp(rec: &[u8], skip: usize) -> Option<u64> {
    let p = rec.get(skip..)?;
    Some(u64::from_be_bytes(p.get(TS_AT)?.try_into().ok()?))
}

fn record(out: &mut SinkOut, rec: &[u8], skip: usize, t: u64) {
    out.datagrams += 1;
    if let Some(s) = stamp(rec, skip) {
        let _ = out.hist.record(t.saturating_sub(s).max(1));
    }
}

/// recvmmsg (MSG_WAITFORONE) until `stop`: one time stamp per batch.
fn recv_loop(fd: BorrowedFd<'_>, skip: usize, stop: &AtomicBool, out: &mut SinkOut) {
    let mut batch = RecvMmsg::new(RECV_BATCH, RECV_LEN);
    while !stop.load(Ordering::Relaxed) {
        match batch.recv(fd, libc::MSG_WAITFORONE) {
            Ok(0) => return,
            Ok(_) => {
                let t = now_ns();
                out.batches += 1;
                for m in batch.iter() {
                    record(out, m.data, skip, t);
                }
            }
            Err(_) => continue,
        }
    }
}

/// Drains the rings (up to `RECV_BATCH` records, then one time stamp) and the data
/// connection; sleeps with the rings' protocol (flag, re-check, poll the eventfds).
fn ring_loop(rings: &[worker::ring::Consumer], conn: RawFd, stop: &AtomicBool, out: &mut SinkOut) {
    let mut data = vec![0u8; RECV_BATCH * RECV_LEN];
    let mut lens = [0usize; RECV_BATCH];
    while !stop.load(Ordering::Relaxed) {
        let mut got = 0usize;
        for r in rings {
            loop {
                let mut n = 0;
                while n < RECV_BATCH {
                    match r.pop(&mut data[n * RECV_LEN..(n + 1) * RECV_LEN]) {
                        Ok(Some(len)) => {
                            lens[n] = len;
                            n += 1;
                        }
                        _ => break,
                    }
                }
                if n == 0 {
                    break;
                }
                let t = now_ns();
                out.batches += 1;
                for (i, &len) in lens.iter().take(n).enumerate() {
                    record(out, &data[i * RECV_LEN..i * RECV_LEN + len], FRAME_HEADER_LEN, t);
                }
                got += n;
            }
            r.awake();
        }
        // SAFETY: recv into a live buffer.
        let n = unsafe { libc::recv(conn, data.as_mut_ptr().cast(), RECV_LEN, libc::MSG_DONTWAIT) };
        if n == 0 {
            return;
        }
        if n > 0 {
            out.batches += 1;
            record(out, &data[..n as usize], FRAME_HEADER_LEN, now_ns());
            continue;
        }
        if got > 0 || !rings.iter().all(|r| r.prepare_sleep()) {
            continue;
        }
        let mut pfds: Vec<libc::pollfd> = rings
            .iter()
            .map(|r| libc::pollfd { fd: r.eventfd(), events: libc::POLLIN, revents: 0 })
            .chain([libc::pollfd { fd: conn, events: libc::POLLIN, revents: 0 }])
            .collect();
        // SAFETY: poll(2) on live pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 100) };
        for r in rings {
            r.woke();
        }
    }
}

/// The release demux (io_uring) with one shard on `core` and `extra` flags.
fn start_demux(bin: &Path, kind: &str, core: usize, extra: &[&str]) -> Result<Demux> {
    start_demux_with(bin, &format!("fp-{kind}"), core, &[&["--io", "uring"][..], extra].concat())
}

/// The sink's data connection: DataHello with `caps`, then Welcome, Sockets,
/// FastSockets (with CAP_FAST_PATH: the fast socket, returned) and Rings (consumers,
/// returned).
fn hello(d: &Demux, caps: u64) -> Result<(OwnedFd, Option<UdpSocket>, Vec<worker::ring::Consumer>)> {
    let fd = sys::seqpacket::connect(&d.data)?;
    let mut buf = vec![0u8; 4096];
    crate::dataplane::send_data_hello(fd.as_fd(), SINK_ID, caps, &mut buf)?;
    let next = |buf: &mut Vec<u8>| -> Result<(Data, Vec<OwnedFd>)> {
        match Channel::<Data>::new(fd.as_fd()).recv(buf)? {
            Incoming::Message { msg, fds } => Ok((msg, fds)),
            other => bail!("{other:?}"),
        }
    };
    let (m, _shared) = next(&mut buf)?;
    if !matches!(m, Data::Sockets { .. }) {
        bail!("expected Sockets, got {m:?}");
    }
    let mut fast = None;
    if caps & CAP_FAST_PATH != 0 {
        let (m, fds) = next(&mut buf)?;
        let Data::FastSockets { addrs } = m else { bail!("expected FastSockets, got {m:?}") };
        if addrs.len() != 1 || fds.len() != 1 {
            bail!("FastSockets: {} addresses, {} fds", addrs.len(), fds.len());
        }
        fast = fds.into_iter().next().map(UdpSocket::from);
        // Read it as the floor reads its socket: blocking (with a receive timeout).
        if let Some(u) = &fast {
            u.set_nonblocking(false)?;
        }
    }
    let (m, fds) = next(&mut buf)?;
    let Data::Rings { count, bytes } = m else { bail!("expected Rings, got {m:?}") };
    if fds.len() != 2 * usize::from(count) {
        bail!("Rings: {count} rings, {} fds", fds.len());
    }
    let mut rings = Vec::new();
    let mut fds = fds.into_iter();
    while let (Some(m), Some(e)) = (fds.next(), fds.next()) {
        rings.push(worker::ring::Consumer::open(m, e, bytes)?);
    }
    send_rec(fd.as_fd(), &Data::Ready)?;
    Ok((fd, fast, rings))
}

/// The floor's socket: set up as the data plane sets up its own (socket.rs).
fn floor_socket() -> Result<UdpSocket> {
    let u = UdpSocket::bind(LOOPBACK_ANY)?;
    for (level, name) in
        [(libc::SOL_UDP, libc::UDP_GRO), (libc::IPPROTO_IP, libc::IP_PKTINFO), (libc::IPPROTO_IP, libc::IP_RECVTOS)]
    {
        sys::sockopt::setsockopt_int(u.as_fd(), level, name, 1).context("setsockopt")?;
    }
    sys::sockopt::set_recv_buffer(&u, RCVBUF);
    Ok(u)
}

/// One contender, started: where to send, the CIDs' key set, the demux (if any), the sink.
struct Rx {
    addr: SocketAddr,
    ks: KeySet,
    demux: Option<Demux>,
    sink: Sink,
}

fn start_rx(kind: &str, bin: &Path, core: usize) -> Result<Rx> {
    if kind == "floor" {
        // The same kind of key set as the demux's, for the same datagrams.
        let dir = PathBuf::from(format!("/tmp/qdbench-fp-{}-floor", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let keys_path = dir.join("keys");
        let _ = std::fs::remove_file(&keys_path);
        if !Command::new(bin).args(["gen-keys", "--out"]).arg(&keys_path).stdout(Stdio::null()).status()?.success() {
            bail!("gen-keys failed");
        }
        let ks =
            KeyFile::parse(&std::fs::read_to_string(&keys_path)?)?.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let _ = std::fs::remove_dir_all(&dir);
        let u = floor_socket()?;
        let addr = u.local_addr()?;
        return Ok(Rx { addr, ks, demux: None, sink: Sink::start(Source::Udp(u), None, core) });
    }
    let extra: &[&str] = match kind {
        "fast" => &["--fast-path", "on"],
        "seqpacket" => &["--fast-path", "off", "--forward", "seqpacket"],
        "ring" => &["--fast-path", "off", "--forward", "ring"],
        other => bail!("unknown contender {other}"),
    };
    let d = start_demux(bin, kind, core, extra)?;
    let caps = match kind {
        "fast" => CAP_FAST_PATH,
        "ring" => CAP_RINGS,
        _ => 0,
    };
    let (conn, fast, rings) = hello(&d, caps)?;
    let src = match kind {
        "fast" => Source::Udp(fast.context("no fast socket")?),
        "ring" if rings.is_empty() => bail!("--forward ring gave no rings"),
        "ring" => Source::Rings(rings),
        _ => Source::Seqpacket,
    };
    let sink = Sink::start(src, Some(conn), core);
    wait_placeable(&d, 1, LIVE_TIMEOUT, "sink not placeable")?;
    if kind == "fast" {
        let s = status(&d)?;
        if s["fast_path"]["active"].as_bool() != Some(true) {
            bail!("the fast path is not active: {}", s["fast_path"]);
        }
    }
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(Rx { addr: d.udp, ks, demux: Some(d), sink })
}

/// What the sender did.
struct Sent {
    sent: u64,
    secs: f64,
    cpu_s: f64,
}

/// `FLOWS` flows, `SEND_BATCH` datagrams per sendmmsg on one flow, flows in turn, each
/// call's datagrams stamped with the time just before it; `rate` 0: unpaced.
fn send(addr: SocketAddr, ks: &KeySet, seconds: f64, rate: f64, core: usize) -> Result<Sent> {
    let mut payloads = flow_payloads(ks, &[SINK_ID], 1);
    let socks = flow_sockets(addr, 1)?;
    std::thread::scope(|sc| {
        sc.spawn(move || {
            pin(core);
            // Sleeps end on time (the default 50 µs slack would bunch the sends).
            // SAFETY: prctl on this thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
            let tid = gettid();
            let cpu0 = thread_ns(tid);
            let mut sent = 0u64;
            let start = Instant::now();
            let end = start + Duration::from_secs_f64(seconds);
            let mut sender = SendMmsg::new(SEND_BATCH, 1);
            let mut k = 0usize;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                if rate > 0.0 {
                    let due = start + Duration::from_secs_f64((k * SEND_BATCH) as f64 / rate);
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                }
                let f = k % FLOWS;
                k += 1;
                payloads[f][TS_AT].copy_from_slice(&now_ns().to_be_bytes());
                let p = &payloads[f][..];
                let mut batch = sender.batch();
                while batch.push(&[p], SendMeta::default()) {}
                if let Ok(r) = batch.send_from(&socks[f], 0, 0) {
                    sent += r as u64;
                }
            }
            Sent { sent, secs: start.elapsed().as_secs_f64(), cpu_s: (thread_ns(tid) - cpu0) as f64 / 1e9 }
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))
    })
}

/// One run's figures.
#[derive(Clone, Debug)]
struct Run {
    kind: String,
    rep: usize,
    /// % of the floor's unpaced rate; 0: unpaced.
    pct: f64,
    offered: f64,
    sent: u64,
    received: u64,
    /// The sink's receive calls that returned datagrams.
    batches: u64,
    send_s: f64,
    sink_s: f64,
    demux_s: f64,
    demux_stat_s: f64,
    sender_s: f64,
    ksoftirqd_s: f64,
    /// `--bpf-stats`: the SK_REUSEPORT program's run time and runs over the run.
    bpf_ns: u64,
    bpf_runs: u64,
    /// Datagrams the demux read itself (user path) and the fast path steered.
    demux_in: u64,
    fast: u64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Run {
    fn per(&self, s: f64) -> f64 {
        s * 1e6 / self.received.max(1) as f64
    }
    /// Receiving side: sink + demux, µs per datagram received by the sink.
    fn rx_us(&self) -> f64 {
        self.per(self.sink_s + self.demux_s)
    }
    fn rate(&self) -> f64 {
        self.received as f64 / self.send_s
    }
    fn json(&self) -> Value {
        json!({
            "contender": self.kind, "round": self.rep + 1, "load_pct": self.pct, "offered": self.offered,
            "sent": self.sent, "received": self.received, "sink_batches": self.batches, "send_s": self.send_s,
            "sink_cpu_s": self.sink_s, "demux_cpu_s": self.demux_s, "demux_stat_cpu_s": self.demux_stat_s,
            "sender_cpu_s": self.sender_s, "ksoftirqd_cpu_s": self.ksoftirqd_s,
            "bpf_run_time_ns": self.bpf_ns, "bpf_run_cnt": self.bpf_runs,
            "demux_datagrams_in": self.demux_in, "fast_path_datagrams": self.fast,
            "p50_us": self.p50, "p99_us": self.p99, "p999_us": self.p999, "max_us": self.max,
        })
    }
}

fn run_one(kind: &str, pct: f64, offered: f64, rep: usize, o: &FastpathArgs, bin: &Path) -> Result<Run> {
    let rx = start_rx(kind, bin, o.rounds.shard_core)?;
    let sink_tid = rx.sink.tid();
    let ksirq = ksoftirqd_pids();
    let ksirq_ns = || ksirq.iter().map(|&p| schedstat_ns(p, Schedstat::OnCpu)).sum::<u64>();
    let dpid = rx.demux.as_ref().map(|d| d.child.id());
    let demux_ns = || dpid.map_or(0, |p| schedstat_ns(p, Schedstat::OnCpu));
    let demux_stat = || dpid.map_or(0.0, stat_cpu_s);
    let s0 = rx.demux.as_ref().map(status).transpose()?;
    let bpf = |on: bool| if on { dpid.map_or((0, 0), reuseport_prog_stats) } else { (0, 0) };
    let bpf_on = o.bpf_stats && kind == "fast";
    let bpf0 = bpf(bpf_on);
    let (sink0, demux0, dstat0, ks0) = (thread_ns(sink_tid), demux_ns(), demux_stat(), ksirq_ns());
    let load = send(rx.addr, &rx.ks, o.seconds, offered, o.rounds.load_core)?;
    std::thread::sleep(SETTLE);
    let (sink1, demux1, dstat1, ks1) = (thread_ns(sink_tid), demux_ns(), demux_stat(), ksirq_ns());
    let bpf1 = bpf(bpf_on);
    let s1 = rx.demux.as_ref().map(status).transpose()?;
    let out = rx.sink.finish()?;
    drop(rx.demux);
    let g = |s: &Option<Value>, p: &str| s.as_ref().and_then(|s| s.pointer(p)).and_then(Value::as_u64).unwrap_or(0);
    let h = &out.hist;
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(Run {
        kind: kind.to_string(),
        rep,
        pct,
        offered,
        sent: load.sent,
        received: out.datagrams,
        batches: out.batches,
        send_s: load.secs,
        sink_s: sink1.saturating_sub(sink0) as f64 / 1e9,
        demux_s: demux1.saturating_sub(demux0) as f64 / 1e9,
        demux_stat_s: dstat1 - dstat0,
        sender_s: load.cpu_s,
        ksoftirqd_s: ks1.saturating_sub(ks0) as f64 / 1e9,
        bpf_ns: bpf1.0.saturating_sub(bpf0.0),
        bpf_runs: bpf1.1.saturating_sub(bpf0.1),
        demux_in: g(&s1, "/datagrams_in") - g(&s0, "/datagrams_in"),
        fast: g(&s1, "/fast_path/datagrams") - g(&s0, "/fast_path/datagrams"),
        p50: us(0.5),
        p99: us(0.99),
        p999: us(0.999),
        max: h.max() as f64 / 1000.0,
    })
}

/// Medians over the rounds of one contender at one load.
#[derive(Clone, Debug)]
struct Sum {
    kind: String,
    pct: f64,
    offered: f64,
    rate: f64,
    lost: f64,
    per_batch: f64,
    rx_us: f64,
    sink_us: f64,
    demux_us: f64,
    sender_us: f64,
    ksirq_us: f64,
    user_path: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

fn summarize(runs: &[Run], kinds: &[String], pcts: &[f64]) -> Vec<Sum> {
    let mut v = Vec::new();
    for &pct in pcts {
        for k in kinds {
            let rs: Vec<&Run> = runs.iter().filter(|r| &r.kind == k && r.pct == pct).collect();
            if rs.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(|r| f(r)).collect());
            v.push(Sum {
                kind: k.clone(),
                pct,
                offered: m(&|r| r.offered),
                rate: m(&|r| r.rate()),
                lost: m(&|r| 1.0 - r.received as f64 / r.sent.max(1) as f64),
                per_batch: m(&|r| r.received as f64 / r.batches.max(1) as f64),
                rx_us: m(&|r| r.rx_us()),
                sink_us: m(&|r| r.per(r.sink_s)),
                demux_us: m(&|r| r.per(r.demux_s)),
                sender_us: m(&|r| r.per(r.sender_s)),
                ksirq_us: m(&|r| r.per(r.ksoftirqd_s)),
                user_path: m(&|r| r.demux_in as f64 / r.sent.max(1) as f64),
                p50: m(&|r| r.p50),
                p99: m(&|r| r.p99),
                p999: m(&|r| r.p999),
            });
        }
    }
    v
}

fn load_name(pct: f64) -> String {
    if pct == 0.0 {
        "unpaced".into()
    } else {
        format!("{pct:.0} %")
    }
}

struct Target {
    what: String,
    measured: f64,
    limit: f64,
}

fn targets(sums: &[Sum], pcts: &[f64]) -> Vec<Target> {
    let get = |k: &str, p: f64| sums.iter().find(|s| s.kind == k && s.pct == p);
    let mut t = Vec::new();
    for &p in pcts {
        if let (Some(a), Some(b)) = (get("floor", p), get("fast", p)) {
            t.push(Target {
                what: format!("{}: (b) ÷ (a), receiving side CPU / datagram", load_name(p)),
                measured: b.rx_us / a.rx_us,
                limit: 1.1,
            });
            t.push(Target {
                what: format!("{}: (b) ÷ (a), incl. the sender", load_name(p)),
                measured: (b.rx_us + b.sender_us) / (a.rx_us + a.sender_us),
                limit: 1.1,
            });
        }
    }
    for &p in pcts {
        if let (Some(b), Some(c)) = (get("fast", p), get("seqpacket", p)) {
            t.push(Target {
                what: format!("{}: demux's own CPU / datagram, (b) ÷ (c)", load_name(p)),
                measured: b.demux_us / c.demux_us,
                limit: 0.02,
            });
        }
    }
    for &p in pcts.iter().filter(|&&p| p > 0.0) {
        if let (Some(a), Some(b)) = (get("floor", p), get("fast", p)) {
            t.push(Target {
                what: format!("{}: latency p50, (b) ÷ (a)", load_name(p)),
                measured: b.p50 / a.p50,
                limit: 1.2,
            });
            t.push(Target {
                what: format!("{}: latency p99, (b) ÷ (a)", load_name(p)),
                measured: b.p99 / a.p99,
                limit: 1.2,
            });
        }
    }
    t
}

fn report(runs: &[Run], sums: &[Sum], o: &FastpathArgs, sat: f64, load_start: &str, secs: f64) -> String {
    let out = command_output;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{BEGIN} (generated by `cargo run --release -p bench -- fastpath --doc docs/benchmarks.md`; edits inside are overwritten) -->"
    );
    let _ = writeln!(s, "#### Run finished {}\n", out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]));
    let _ = writeln!(
        s,
        "Conditions: Linux {}, {} ({} CPUs), {}; load average at start {} (at end {}); {} round(s) of {} s per contender and load, contenders in rotating order; the sink and the demux's one shard (`--cores {}`, io_uring) on core {}, the sender ({} flows, sendmmsg of {}) on core {}; {}-byte short-header datagrams for the sink's server id; the bench and all it starts at nice {} in an autogroup of its own. 100 % = the floor's median unpaced rate, {} datagrams/s. Whole run: {:.0} s. Figures are medians over the rounds.\n",
        out("uname", &["-r"]),
        cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        out("rustc", &["--version"]),
        loadavg(load_start),
        loadavg_now(),
        o.rounds.reps,
        o.seconds,
        o.rounds.shard_core,
        o.rounds.shard_core,
        FLOWS,
        SEND_BATCH,
        o.rounds.load_core,
        DATAGRAM,
        o.rounds.nice,
        thousands(sat),
        secs
    );
    let _ = writeln!(s, "| load | contender | offered /s | received /s | lost | **receiving side CPU µs / datagram** (sink + demux) | sink | demux | sender (+ loopback softirq) | ksoftirqd | to the demux | sink datagrams / receive | p50 µs | p99 µs | p99.9 µs |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for m in sums {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} % | **{}** | {} | {} | {} | {} | {:.1} % | {:.1} | {} | {} | {} |",
            load_name(m.pct),
            m.kind,
            if m.offered > 0.0 { thousands(m.offered) } else { "unpaced".into() },
            thousands(m.rate),
            m.lost * 100.0,
            fixed(m.rx_us, 3),
            fixed(m.sink_us, 3),
            fixed(m.demux_us, 3),
            fixed(m.sender_us, 3),
            fixed(m.ksirq_us, 3),
            m.user_path * 100.0,
            m.per_batch,
            fixed(m.p50, 1),
            fixed(m.p99, 1),
            fixed(m.p999, 1),
        );
    }
    let _ = writeln!(s, "\nTargets (docs/benchmarks.md), from the medians above:\n");
    let _ = writeln!(s, "| target | measured | limit | |");
    let _ = writeln!(s, "|---|---|---|---|");
    let mut pcts = vec![0.0];
    pcts.extend(o.loads.iter().copied());
    for t in targets(sums, &pcts) {
        let met = t.measured <= t.limit;
        let _ = writeln!(
            s,
            "| {} | {} | ≤ {} | {} |",
            t.what,
            fixed(t.measured, 3),
            t.limit,
            if met { "**met**".to_string() } else { format!("**missed** ({:.2}× the limit)", t.measured / t.limit) }
        );
    }
    let _ = writeln!(s, "\n<details><summary>Every run</summary>\n");
    let _ = writeln!(s, "| round | load | contender | sent | received | send s | sink CPU s | demux CPU s (schedstat / stat) | sender CPU s | ksoftirqd s | demux read | fast path | eBPF ns / run | p50 | p99 | p99.9 | max µs |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.2} | {:.3} | {:.3} / {:.2} | {:.3} | {:.3} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} |",
            r.rep + 1,
            load_name(r.pct),
            r.kind,
            r.sent,
            r.received,
            r.send_s,
            r.sink_s,
            r.demux_s,
            r.demux_stat_s,
            r.sender_s,
            r.ksoftirqd_s,
            r.demux_in,
            r.fast,
            if r.bpf_runs > 0 { format!("{:.0}", r.bpf_ns as f64 / r.bpf_runs as f64) } else { "–".into() },
            r.p50,
            r.p99,
            r.p999,
            r.max
        );
    }
    let _ = writeln!(s, "\n</details>\n\n{END}");
    s
}

/// Stacked bars per contender and load: sink, demux, sender (µs per datagram).
fn svg(sums: &[Sum], kinds: &[String], pcts: &[f64], reps: usize) -> String {
    const LABEL_W: f64 = 150.0;
    const BAR_W: f64 = 460.0;
    const VALUE_W: f64 = 170.0;
    const ROW_H: f64 = 18.0;
    const GAP: f64 = 12.0;
    const TOP: f64 = 62.0;
    let parts = [("sink", "#4477aa"), ("demux", "#ee6677"), ("sender, incl. loopback receive softirq", "#bbbbbb")];
    let max = sums.iter().map(|m| m.rx_us + m.sender_us).filter(|x| x.is_finite()).fold(1.0f64, f64::max);
    let h = TOP + kinds.len() as f64 * (pcts.len() as f64 * ROW_H + GAP) + 10.0;
    let w = LABEL_W + BAR_W + VALUE_W;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">CPU µs per {DATAGRAM}-byte datagram, whole system, median of {reps} (lower is better)</text>\n"
    );
    for (i, (name, col)) in parts.iter().enumerate() {
        let x = 10.0 + i as f64 * 130.0;
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"32\" width=\"12\" height=\"12\" fill=\"{col}\"/><text x=\"{}\" y=\"42\">{name}</text>",
            x + 16.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"56\" fill=\"#555\">value: receiving side (sink + demux) + sender</text>",
        LABEL_W
    );
    let mut y = TOP;
    for k in kinds {
        for &p in pcts {
            let Some(m) = sums.iter().find(|m| &m.kind == k && m.pct == p) else { continue };
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{k}, {}</text>",
                LABEL_W - 6.0,
                y + ROW_H - 5.0,
                load_name(p)
            );
            let mut x = LABEL_W;
            for (v, (_, col)) in [m.sink_us, m.demux_us, m.sender_us].into_iter().zip(parts.iter()) {
                let bw = if v.is_finite() { v / max * BAR_W } else { 0.0 };
                let _ = writeln!(
                    s,
                    "<rect x=\"{x:.1}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{}\" fill=\"{col}\"/>",
                    ROW_H - 3.0
                );
                x += bw;
            }
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\">{} + {}</text>",
                x + 4.0,
                y + ROW_H - 5.0,
                fixed(m.rx_us, 2),
                fixed(m.sender_us, 2)
            );
            y += ROW_H;
        }
        y += GAP;
    }
    s.push_str("</svg>\n");
    s
}

pub fn main(o: FastpathArgs) -> Result<()> {
    let t0 = Instant::now();
    if o.rounds.nice != 0 {
        crate::all::prioritize(o.rounds.nice);
    }
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let bin = demux_bin()?;
    let _stats = if o.bpf_stats { Some(enable_bpf_stats()?) } else { None };
    let kinds = o.contenders.clone();
    let n = kinds.len();
    let mut runs = Vec::new();
    let go = |pct: f64, offered: f64, rep: usize, runs: &mut Vec<Run>| -> Result<()> {
        for i in 0..n {
            let k = &kinds[(i + rep) % n];
            let r = run_one(k, pct, offered, rep, &o, &bin)
                .with_context(|| format!("{k}, {}, round {}", load_name(pct), rep + 1))?;
            eprintln!(
                "round {} {:<8} {:<9} {:>9.0}/s received ({} of {} sent); µs/datagram: rx {:.3} (sink {:.3}, demux {:.3}), sender {:.3}, ksoftirqd {:.3}; demux read {}, fast path {}; p50 {:.1} p99 {:.1} p99.9 {:.1} µs{}",
                rep + 1, load_name(pct), k, r.rate(), r.received, r.sent, r.rx_us(), r.per(r.sink_s), r.per(r.demux_s),
                r.per(r.sender_s), r.per(r.ksoftirqd_s), r.demux_in, r.fast, r.p50, r.p99, r.p999,
                if r.bpf_runs > 0 { format!("; eBPF {:.0} ns/run over {} runs", r.bpf_ns as f64 / r.bpf_runs as f64, r.bpf_runs) } else { String::new() }
            );
            runs.push(r);
        }
        Ok(())
    };
    for rep in 0..o.rounds.reps {
        go(0.0, 0.0, rep, &mut runs)?;
    }
    let base = if kinds.iter().any(|k| k == "floor") { "floor" } else { kinds[0].as_str() };
    let sat = median(runs.iter().filter(|r| r.kind == base).map(Run::rate).collect());
    eprintln!("100 % = {base}'s median unpaced rate: {sat:.0} datagrams/s");
    for rep in 0..o.rounds.reps {
        for &pct in &o.loads {
            go(pct, sat * pct / 100.0, rep, &mut runs)?;
        }
    }
    let mut pcts = vec![0.0];
    pcts.extend(o.loads.iter().copied());
    let sums = summarize(&runs, &kinds, &pcts);
    let text = report(&runs, &sums, &o, sat, &load_start, t0.elapsed().as_secs_f64());
    write_outputs(
        &o.out,
        (BEGIN, END),
        &text,
        || svg(&sums, &kinds, &pcts, o.rounds.reps),
        || Value::Array(runs.iter().map(Run::json).collect()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(kind: &str, pct: f64, rx_us: f64, demux_us: f64, p50: f64, p99: f64) -> Sum {
        Sum {
            kind: kind.into(),
            pct,
            offered: 0.0,
            rate: 1.0,
            lost: 0.0,
            per_batch: 1.0,
            rx_us,
            sink_us: rx_us - demux_us,
            demux_us,
            sender_us: 1.0,
            ksirq_us: 0.0,
            user_path: 0.0,
            p50,
            p99,
            p999: p99,
        }
    }

    #[test]
    fn load_names() {
        assert_eq!(load_name(0.0), "unpaced");
        assert_eq!(load_name(25.0), "25 %");
    }

    /// The targets (docs/benchmarks.md): (b) ÷ (a) CPU ≤ 1.1, (b)'s demux ≤ 2 % of (c)'s,
    /// (b) ÷ (a) latency ≤ 1.2 at p50 and p99 (paced loads only).
    #[test]
    fn targets_compare_the_right_contenders() {
        let sums = [
            sum("floor", 50.0, 2.0, 0.0, 10.0, 100.0),
            sum("fast", 50.0, 2.4, 0.01, 11.0, 130.0),
            sum("seqpacket", 50.0, 5.0, 3.0, 30.0, 300.0),
        ];
        let t = targets(&sums, &[50.0]);
        let get = |w: &str| t.iter().find(|t| t.what.contains(w)).unwrap_or_else(|| panic!("{w}"));
        assert!((get("receiving side").measured - 1.2).abs() < 1e-9);
        assert!((get("demux's own").measured - 0.01 / 3.0).abs() < 1e-9);
        assert!((get("p50").measured - 1.1).abs() < 1e-9);
        assert!((get("p99").measured - 1.3).abs() < 1e-9);
        assert!(targets(&sums, &[0.0]).iter().all(|t| !t.what.contains("latency")));
    }

    #[test]
    fn svg_has_a_stack_per_contender_and_load() {
        let sums = [sum("floor", 0.0, 2.0, 0.0, 1.0, 1.0), sum("fast", 0.0, 2.1, 0.0, 1.0, 1.0)];
        let s = svg(&sums, &["floor".into(), "fast".into()], &[0.0], 1);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches("fill=\"#4477aa\"").count(), 1 + 2, "legend + one sink bar each");
        assert!(s.contains("fast, unpaced") && s.contains("2.10 + 1.00"));
    }
}
