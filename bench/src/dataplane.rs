//! The data-plane system benchmark.

use crate::cli::DataplaneArgs;
use crate::load::{flow_payloads, flow_sockets, FLOWS, LOOPBACK_ANY, SETTLE};
use crate::sys::{cpu_model, drain_count, pin, schedstat_ns, sink_timeout, Perf, Schedstat, DRAIN_MSG_LEN};
use anyhow::{bail, Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::{Admin, Data, Message};
use proto::ServerId;
use serde_json::Value;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::seqpacket::{Channel, Incoming};

pub(crate) const DATAGRAM: usize = 1200;
pub(crate) const SINKS: u16 = 2;
/// The sinks' server ids.
const SINK_IDS: [u16; SINKS as usize] = [1, 2];

/// The release demux next to this binary (`cargo build --release -p demux` first,
/// unless BENCH_NO_BUILD is set and it exists).
pub(crate) fn demux_bin() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("demux");
    if std::env::var_os("BENCH_NO_BUILD").is_some() && bin.exists() {
        return Ok(bin);
    }
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "-p", "demux"])
        .status()
        .context("cargo build --release -p demux")?;
    if !status.success() || !bin.exists() {
        bail!("could not build {}", bin.display());
    }
    Ok(bin)
}

/// The child gets SIGKILL when the bench dies (PR_SET_PDEATHSIG), so no demux or
/// server outlives a killed bench.
pub(crate) fn with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

pub(crate) struct Demux {
    pub(crate) child: Child,
    pub(crate) dir: PathBuf,
    pub(crate) udp: SocketAddr,
    pub(crate) data: PathBuf,
    pub(crate) control: PathBuf,
    pub(crate) keys: KeyFile,
    /// `--forward ring` (an io of `uring+ring` / `mmsg+ring`): sinks read rings.
    pub(crate) rings: bool,
}

impl Drop for Demux {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The release demux with one shard on `core`: `io` is a `--io` backend, `+ring`
/// for `--forward ring` (e.g. `uring+ring`).
pub(crate) fn start_demux(bin: &Path, io: &str, core: usize) -> Result<Demux> {
    let (backend, forward) = match io.strip_suffix("+ring") {
        Some(b) => (b, "ring"),
        None => (io, "seqpacket"),
    };
    start_demux_with(bin, io, core, &["--io", backend, "--forward", forward])
}

/// The release demux with one shard on `core`, its own keys, data and control
/// sockets in a scratch directory named after `name`, and `flags` (`--io`,
/// `--forward`, `--fast-path`, …); `--forward ring` makes the sinks read rings.
pub(crate) fn start_demux_with(bin: &Path, name: &str, core: usize, flags: &[&str]) -> Result<Demux> {
    start_demux_at(bin, name, core, LOOPBACK_ANY, None, None, flags)
}

/// [`start_demux_with`] listening on `listen`, with a copy of the key file `keys`
/// (`None`: a new one).
pub(crate) fn start_demux_at(
    bin: &Path,
    name: &str,
    core: usize,
    listen: &str,
    keys: Option<&Path>,
    netns: Option<&str>,
    flags: &[&str],
) -> Result<Demux> {
    let dir = PathBuf::from(format!("/tmp/qdbench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let keys_path = dir.join("keys");
    match keys {
        Some(k) => {
            std::fs::copy(k, &keys_path)?;
        }
        None => {
            if !Command::new(bin).args(["gen-keys", "--out"]).arg(&keys_path).stdout(Stdio::null()).status()?.success()
            {
                bail!("gen-keys failed");
            }
        }
    }
    let keys = KeyFile::parse(&std::fs::read_to_string(&keys_path)?)?;
    let (data, control, ready) = (dir.join("d.sock"), dir.join("c.sock"), dir.join("ready"));
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let child = with_parent(&mut cmd)
        .args(["dataplane", "--listen", listen, "--cores", &core.to_string(), "--keys"])
        .arg(&keys_path)
        .arg("--data-socket")
        .arg(&data)
        .arg("--control-socket")
        .arg(&control)
        .arg("--ready-file")
        .arg(&ready)
        .args(flags)
        .env("DEMUX_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let rings = flags.windows(2).any(|w| w == ["--forward", "ring"]);
    let mut d = Demux { child, dir, udp: "0.0.0.0:0".parse()?, data, control, keys, rings };
    d.udp = wait_ready_file(&ready, &mut d.child, "demux")?;
    Ok(d)
}

/// How long a started process (the demux, a contender) may take to write its ready file.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval while waiting for a process or the demux's status to change.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// The UDP address in `ready` (`udp ADDR`, written by the demux and by the contender
/// servers) once `child` writes it; `what` names the child in the errors.
pub(crate) fn wait_ready_file(ready: &Path, child: &mut Child, what: &str) -> Result<SocketAddr> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(t) = std::fs::read_to_string(ready) {
            if let Some(a) = t.lines().find_map(|l| l.strip_prefix("udp ")) {
                return Ok(a.parse()?);
            }
        }
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited: {st}");
        }
        if Instant::now() > deadline {
            bail!("{what} not ready");
        }
        std::thread::sleep(POLL);
    }
}

/// Waits until the demux reports exactly `n` placeable instances (workers that said
/// Ready); `err` is the error after `timeout`.
pub(crate) fn wait_placeable(d: &Demux, n: usize, timeout: Duration, err: &str) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while status(d)?["instances"].as_array().map(|a| a.iter().filter(|i| i["placeable"] == true).count()) != Some(n) {
        if Instant::now() > deadline {
            bail!("{err}");
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

pub(crate) fn send_rec<M: Message>(fd: BorrowedFd<'_>, m: &M) -> Result<()> {
    Channel::new(fd).send(m).context("send")
}

/// One message of conversation `M` (descriptors that came with it are closed).
pub(crate) fn recv_rec<M: Message + std::fmt::Debug>(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<M> {
    match Channel::new(fd).recv(buf).context("recv")? {
        Incoming::Message { msg, .. } => Ok(msg),
        other => bail!("recv: {other:?}"),
    }
}

pub(crate) fn status(d: &Demux) -> Result<Value> {
    match sys::control::request(&d.control, &[&Admin::StatusRequest])?.msg {
        Admin::Status { json } => Ok(serde_json::from_str(&json)?),
        other => bail!("unexpected {other:?}"),
    }
}

/// The hello of a data connection with capabilities `caps`, and its `Welcome`
/// (docs/wire.md "Versions").
pub(crate) fn send_data_hello(fd: BorrowedFd<'_>, id: u16, caps: u64, buf: &mut [u8]) -> Result<()> {
    let announce = proto::wire::Announce { window: sys::protocol::window(), caps };
    send_rec(fd, &Data::DataHello { announce, server_id: ServerId(id) })?;
    match recv_rec(fd, buf)? {
        Data::Welcome { .. } => Ok(()),
        other => bail!("expected Welcome, got {other:?}"),
    }
}

/// A data connection to the demux as server id `id`: DataHello (with CAP_RINGS when
/// `rings`), then the demux's Welcome and Sockets records, received into `buf`;
/// without rings also the (empty) Rings that ends the answer.
pub(crate) fn data_hello(d: &Demux, id: u16, rings: bool, buf: &mut [u8]) -> Result<OwnedFd> {
    let fd = sys::seqpacket::connect(&d.data)?;
    let caps = if rings { proto::wire::data::CAP_RINGS } else { 0 };
    send_data_hello(fd.as_fd(), id, caps, buf)?;
    match recv_rec(fd.as_fd(), buf)? {
        Data::Sockets { .. } => {}
        other => bail!("expected Sockets, got {other:?}"),
    }
    if !rings {
        match recv_rec(fd.as_fd(), buf)? {
            Data::Rings { count: 0, .. } => {}
            other => bail!("expected Rings without rings, got {other:?}"),
        }
    }
    Ok(fd)
}

/// Receive timeout of the bench's sink and probe connections, so their loops see `stop`.
pub(crate) const SINK_RCVTIMEO: Duration = Duration::from_millis(100);

/// A sink worker: DataHello, Ready, then recvmmsg everything and count it.
pub(crate) fn sink(
    d: &Demux,
    id: u16,
    core: usize,
    stop: Arc<AtomicBool>,
    frames: Arc<AtomicU64>,
) -> Result<std::thread::JoinHandle<()>> {
    let mut buf = vec![0u8; 4096];
    let fd = data_hello(d, id, d.rings, &mut buf)?;
    let mut rings = Vec::new();
    if d.rings {
        let Incoming::Message { msg: Data::Rings { count, bytes }, fds } = Channel::new(fd.as_fd()).recv(&mut buf)?
        else {
            bail!("expected Rings")
        };
        if count == 0 || fds.len() != 2 * usize::from(count) {
            bail!("Rings: {count} rings, {} fds", fds.len());
        }
        let mut fds = fds.into_iter();
        while let (Some(m), Some(e)) = (fds.next(), fds.next()) {
            rings.push(worker::ring::Consumer::open(m, e, bytes)?);
        }
    }
    send_rec(fd.as_fd(), &Data::Ready)?;
    sink_timeout(&fd, SINK_RCVTIMEO);
    Ok(std::thread::spawn(move || {
        pin(core);
        let mut data = vec![0u8; DRAIN_MSG_LEN];
        // `--forward ring`: drain the rings, and the data connection once a poll saw
        // it readable (it carries what the host-to-host receiver hands over,
        // docs/scaling.md; no extra syscall per pass otherwise), then the sleep
        // protocol (flag, re-check, poll the eventfds and the connection with a
        // timeout so `stop` is seen).
        let mut data_ready = false;
        while !rings.is_empty() && !stop.load(Ordering::Relaxed) {
            let mut n = 0u64;
            for r in &rings {
                while let Ok(Some(_)) = r.pop(&mut data) {
                    n += 1;
                }
                r.awake();
            }
            if data_ready {
                let mut got = 0u64;
                // SAFETY: recv(2) into a live buffer of its own length, without waiting.
                while unsafe { libc::recv(fd.as_raw_fd(), data.as_mut_ptr().cast(), data.len(), libc::MSG_DONTWAIT) }
                    > 0
                {
                    got += 1;
                }
                data_ready = got > 0;
                n += got;
            }
            if n > 0 {
                frames.fetch_add(n, Ordering::Relaxed);
                continue;
            }
            if !rings.iter().all(|r| r.prepare_sleep()) {
                continue;
            }
            let mut pfds: Vec<libc::pollfd> =
                rings.iter().map(|r| libc::pollfd { fd: r.eventfd(), events: libc::POLLIN, revents: 0 }).collect();
            pfds.push(libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            // SAFETY: poll(2) on live pollfds.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 100) };
            data_ready = pfds.last().is_some_and(|p| p.revents & libc::POLLIN != 0);
            for r in &rings {
                r.woke();
            }
        }
        drain_count(fd.as_fd(), &stop, &frames);
    }))
}

/// utime + stime of `pid` in seconds (/proc/<pid>/stat fields 14 and 15).
pub(crate) fn stat_cpu_s(pid: u32) -> f64 {
    let (user, system) = stat_user_system_s(pid);
    user + system
}

/// (utime, stime) of `pid` in seconds, all its threads (/proc/<pid>/stat fields 14
/// and 15, in clock ticks); zeros when unreadable.
pub(crate) fn stat_user_system_s(pid: u32) -> (f64, f64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // After the comm field: state is index 0, utime is field 14 → index 11.
    let ut: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    let st: f64 = f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf is always safe.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ut / hz, st / hz)
}

pub(crate) fn forwarded(s: &Value) -> u64 {
    s["instances"].as_array().map(|a| a.iter().map(|i| i["datagrams"].as_u64().unwrap_or(0)).sum()).unwrap_or(0)
}

pub(crate) fn g(s: &Value, p: &str) -> u64 {
    s.pointer(p).and_then(Value::as_u64).unwrap_or(0)
}

struct Row {
    io: String,
    mode: String,
    sent: u64,
    datagrams_in: u64,
    fwd: u64,
    drops_full: u64,
    cpu_s: f64,
    stat_cpu_s: f64,
    wall_s: f64,
    per_batch: f64,
    per_sendmmsg: f64,
}

/// How long `bench dataplane` waits for its sinks to be placeable.
const SINKS_LIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Datagrams per UDP_SEGMENT train in the "GRO trains" runs.
const TRAIN: usize = 8;
/// Flows the sender sends on, one send() each, between two pacing checks.
const BURST: usize = 8;

fn run_one(bin: &Path, io: &str, train: usize, sinks_n: u16, o: &DataplaneArgs) -> Result<Row> {
    let d = start_demux(bin, io, o.shard_core)?;
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    let sinks: Vec<_> =
        (1..=sinks_n).map(|id| sink(&d, id, o.load_core, stop.clone(), frames.clone())).collect::<Result<_>>()?;
    wait_placeable(&d, usize::from(sinks_n), SINKS_LIVE_TIMEOUT, "sinks not live")?;
    // Datagrams: short headers (RFC 9000 §17.3.1) for the sinks' CIDs, 1200 bytes.
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    // FLOWS flows (source sockets), half to each sink: the kernel's reuseport and GRO
    // see realistic 4-tuples; one shard receives all of them.
    let payloads = flow_payloads(&ks, &SINK_IDS, train);
    let socks = flow_sockets(d.udp, train)?;
    let pid = d.child.id();
    let secs = o.seconds;
    let sent = Arc::new(AtomicU64::new(0));
    let s0 = status(&d)?;
    let perf = Perf::start(pid, &format!("{io}-{train}"))?;
    let (cpu0, stat0, t0) = (schedstat_ns(pid, Schedstat::OnCpu), stat_cpu_s(pid), Instant::now());
    {
        let sent = sent.clone();
        let load_core = o.load_core;
        let rate = o.rate;
        std::thread::scope(|sc| {
            sc.spawn(|| {
                pin(load_core);
                let start = Instant::now();
                let end = start + Duration::from_secs_f64(secs);
                let mut k = 0usize;
                while Instant::now() < end {
                    if rate > 0.0 {
                        // Paced: the k-th send is due at k * train / rate.
                        let due = start + Duration::from_secs_f64(k as f64 * train as f64 / rate);
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                    }
                    // One burst: a send on each of BURST flows.
                    for _ in 0..BURST {
                        let f = k % FLOWS;
                        k += 1;
                        if socks[f].send(&payloads[f]).is_ok() {
                            sent.fetch_add(train as u64, Ordering::Relaxed);
                        }
                    }
                }
            });
        });
    }
    // Let the data plane drain, then read its counters and CPU time.
    std::thread::sleep(SETTLE);
    let (cpu1, stat1, wall) = (schedstat_ns(pid, Schedstat::OnCpu), stat_cpu_s(pid), t0.elapsed().as_secs_f64());
    let s1 = status(&d)?;
    if let Some(p) = perf {
        p.stop();
    }
    stop.store(true, Ordering::Relaxed);
    drop(d);
    for s in sinks {
        let _ = s.join();
    }
    let fwd = forwarded(&s1) - forwarded(&s0);
    let din = g(&s1, "/datagrams_in") - g(&s0, "/datagrams_in");
    let batches = (g(&s1, "/batches") - g(&s0, "/batches")).max(1);
    let calls = (g(&s1, "/sendmmsg_calls") - g(&s0, "/sendmmsg_calls")).max(1);
    let calls = if sinks_n == 0 { u64::MAX } else { calls };
    let receives = din / train as u64;
    Ok(Row {
        io: io.to_string(),
        mode: format!(
            "{}{}",
            if train > 1 { format!("GRO trains of {train}") } else { "uncoalesced".into() },
            if sinks_n > 0 { "" } else { ", no worker (receive + route only)" }
        ),
        sent: sent.load(Ordering::Relaxed),
        datagrams_in: din,
        fwd,
        drops_full: g(&s1, "/drops/full") - g(&s0, "/drops/full"),
        cpu_s: (cpu1 - cpu0) as f64 / 1e9,
        stat_cpu_s: stat1 - stat0,
        wall_s: wall,
        per_batch: receives as f64 / batches as f64,
        per_sendmmsg: receives as f64 / calls as f64,
    })
}

pub fn main(o: DataplaneArgs) -> Result<()> {
    let bin = demux_bin()?;
    let mut rows = Vec::new();
    for io in &o.ios {
        for (train, sinks_n) in [(1usize, SINKS), (TRAIN, SINKS), (1, 0)] {
            if sinks_n == 0 && io.ends_with("+ring") {
                continue; // no workers, no forwarding: the same as without rings
            }
            let r = run_one(&bin, io, train, sinks_n, &o).with_context(|| format!("{io}, train {train}"))?;
            eprintln!(
                "{} {}: {:.3} µs CPU/received datagram ({} received, {} forwarded)",
                r.io,
                r.mode,
                r.cpu_s * 1e6 / r.datagrams_in.max(1) as f64,
                r.datagrams_in,
                r.fwd
            );
            rows.push(r);
        }
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpu_model = cpu_model();
    println!("Conditions: Linux {}, {} ({} cores), release build; demux: 1 shard on core {}, `--io <backend>`; sender ({} UDP flows, loopback) and {} sink workers on core {}; {:.0} s per run, offered rate {}; 1200-byte datagrams (short headers for live server ids); load average at the end {}.",
        kernel.trim(), cpu_model, std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), o.shard_core, FLOWS, SINKS, o.load_core, o.seconds, if o.rate > 0.0 { format!("{} datagrams/s", o.rate) } else { "unpaced".into() }, load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!();
    println!("| backend | datagrams | sent | received by demux | forwarded | dropped (worker full) | demux CPU s (schedstat / stat) | wall s | **CPU µs / forwarded datagram** | CPU µs / received datagram | receives / batch | receives / sendmmsg |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.3} / {:.2} | {:.2} | **{}** | {:.3} | {:.1} | {:.1} |",
            r.io,
            r.mode,
            r.sent,
            r.datagrams_in,
            r.fwd,
            r.drops_full,
            r.cpu_s,
            r.stat_cpu_s,
            r.wall_s,
            if r.fwd > 0 { format!("{:.3}", r.cpu_s * 1e6 / r.fwd as f64) } else { "–".to_string() },
            r.cpu_s * 1e6 / r.datagrams_in.max(1) as f64,
            r.per_batch,
            r.per_sendmmsg
        );
    }
    Ok(())
}
