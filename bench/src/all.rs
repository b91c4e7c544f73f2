//! `bench all` (issue #6): the demux (io_uring and mmsg), the per-datagram baseline,
//! nginx's stream UDP proxy and a recv-and-drop floor, side by side in one run.
//!
//! Every contender runs as its own process pinned to the shard core; a sender
//! (in this process, pinned to the load core) offers 1200-byte datagrams for
//! `--seconds`, uncoalesced and as UDP_SEGMENT trains of 8. The figure is the
//! contender's CPU time (schedstat of all its threads) divided by the datagrams it
//! handled (forwarded; for the floor: received). Rounds alternate the order of the
//! contenders. Then the demux hop's round-trip latency at 25/50/75 % of the
//! io_uring demux's measured saturation (udpflood --latency against echo workers,
//! background load from this process to a sink worker).

use crate::dataplane::{cpu_ns, forwarded, g, pin, sink, start_demux, status, Demux, DATAGRAM};
use crate::servers::{Counters, FORWARDED, N_COUNTERS, RECEIVED};
use anyhow::{bail, Context, Result};
use proto::cid::KeySet;
use proto::keyfile::KeyFile;
use proto::ServerId;
use serde_json::{json, Value};
use std::any::Any;
use std::fmt::Write as _;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const CONTENDERS: [&str; 5] = ["floor", "baseline", "demux-uring", "demux-mmsg", "nginx"];

struct Opts {
    seconds: f64,
    reps: usize,
    contenders: Vec<String>,
    trains: Vec<usize>,
    /// Offered datagrams/s per run (0: unpaced, as fast as the sender can).
    rates: Vec<f64>,
    shard_core: usize,
    load_core: usize,
    latency: bool,
    /// Measure latency with udpflood --latency and echo workers (round trips) instead
    /// of the in-bench one-way probe.
    udpflood: bool,
    /// Latency runs: SCHED_FIFO for the demux and the probe threads.
    rt: bool,
    lat_seconds: f64,
    probe_rate: f64,
    doc: Option<PathBuf>,
    svg: Option<PathBuf>,
    json: Option<PathBuf>,
    install_nginx: bool,
    nice: i32,
}

fn parse(args: &[String]) -> Result<Opts> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut o = Opts {
        seconds: 3.0,
        reps: 3,
        contenders: CONTENDERS.iter().map(|s| s.to_string()).collect(),
        trains: vec![1, 8],
        rates: vec![0.0, 100_000.0],
        shard_core: 0,
        load_core: 1,
        latency: true,
        udpflood: false,
        rt: true,
        lat_seconds: 3.0,
        probe_rate: 1000.0,
        doc: Some(docs.join("benchmarks.md")),
        svg: Some(docs.join("benchmarks-cpu.svg")),
        json: None,
        install_nginx: true,
        nice: -20,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--seconds" => o.seconds = val()?.parse()?,
            "--reps" => o.reps = val()?.parse()?,
            "--contenders" => o.contenders = val()?.split(',').map(str::to_string).collect(),
            "--trains" => o.trains = val()?.split(',').map(|x| x.parse()).collect::<Result<_, _>>()?,
            "--rate" => o.rates = vec![val()?.parse()?],
            "--rates" => o.rates = val()?.split(',').map(|x| x.parse()).collect::<Result<_, _>>()?,
            "--shard-core" => o.shard_core = val()?.parse()?,
            "--load-core" => o.load_core = val()?.parse()?,
            "--no-latency" => o.latency = false,
            "--udpflood" => o.udpflood = true,
            "--no-rt" => o.rt = false,
            "--latency-seconds" => o.lat_seconds = val()?.parse()?,
            "--probe-rate" => o.probe_rate = val()?.parse()?,
            "--doc" => o.doc = Some(val()?.into()),
            "--svg" => o.svg = Some(val()?.into()),
            "--no-doc" => (o.doc, o.svg) = (None, None),
            "--json" => o.json = Some(val()?.into()),
            "--no-install" => o.install_nginx = false,
            "--nice" => o.nice = val()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    for c in &o.contenders {
        if !CONTENDERS.contains(&c.as_str()) {
            bail!("unknown contender {c} (one of {})", CONTENDERS.join(","));
        }
    }
    if o.reps == 0 || o.seconds <= 0.0 {
        bail!("--reps and --seconds must be positive");
    }
    Ok(o)
}

/// Release binaries next to this one; built first unless BENCH_NO_BUILD is set.
fn bins(o: &Opts) -> Result<PathBuf> {
    let dir = std::env::current_exe()?.parent().context("exe dir")?.to_path_buf();
    let mut pkgs = vec![];
    if o.contenders.iter().any(|c| c.starts_with("demux")) {
        pkgs.push("demux");
    }
    if o.latency && o.udpflood && o.contenders.iter().any(|c| c == "demux-uring") {
        pkgs.extend(["worker", "udpflood"]);
    }
    if std::env::var_os("BENCH_NO_BUILD").is_none() && !pkgs.is_empty() {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--release"]);
        for p in &pkgs {
            cmd.args(["-p", p]);
        }
        if !cmd.status().context("cargo build --release")?.success() {
            bail!("cargo build --release {pkgs:?} failed");
        }
    }
    for p in pkgs {
        if !dir.join(p).exists() {
            bail!("{} missing (build it, or unset BENCH_NO_BUILD)", dir.join(p).display());
        }
    }
    Ok(dir)
}

/// Runs `cmd` pinned to `core` (sched_setaffinity in the child before exec).
fn pinned(cmd: &mut Command, core: usize) -> &mut Command {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = zeroed();
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
            // Die with the bench (it may be killed: its own session does not get the terminal's ^C).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

struct ChildGuard(Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SIGTERM first (nginx's master takes its worker down with it), then SIGKILL.
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        for _ in 0..50 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct DirGuard(PathBuf);
impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Drain threads (recvmmsg and count) on sockets of any type; stopped on drop.
struct Sinks {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}
impl Drop for Sinks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn drain(fd: OwnedFd, core: usize, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
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
    std::thread::spawn(move || {
        pin(core);
        const N: usize = 64;
        const LEN: usize = 65_536 + 64;
        let mut data = vec![0u8; N * LEN];
        let mut iovs: Vec<libc::iovec> =
            (0..N).map(|i| libc::iovec { iov_base: data[i * LEN..].as_mut_ptr().cast(), iov_len: LEN }).collect();
        // SAFETY: plain old data.
        let mut msgs: Vec<libc::mmsghdr> = (0..N).map(|_| unsafe { zeroed() }).collect();
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: msgs point at live buffers.
            let r = unsafe {
                libc::recvmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), N as u32, libc::MSG_WAITFORONE, std::ptr::null_mut())
            };
            if r > 0 {
                count.fetch_add(r as u64, Ordering::Relaxed);
            } else if r == 0 {
                return;
            }
        }
    })
}

/// A contender under test.
struct Running {
    /// The process whose CPU time is measured.
    pid: u32,
    addr: SocketAddr,
    ks: KeySet,
    /// Server ids whose CIDs the sender uses.
    ids: Vec<u16>,
    /// (received, handled) so far.
    counts: Box<dyn Fn() -> Result<(u64, u64)>>,
    _hold: Vec<Box<dyn Any>>,
}

fn wait_ready(ready: &Path, child: &mut Child) -> Result<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(t) = std::fs::read_to_string(ready) {
            if let Some(a) = t.lines().find_map(|l| l.strip_prefix("udp ")) {
                return Ok(a.parse()?);
            }
        }
        if let Some(st) = child.try_wait()? {
            bail!("{} exited: {st}", ready.display());
        }
        if Instant::now() > deadline {
            bail!("{} not ready", ready.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fresh key file (as `demux gen-keys` writes it) in `dir`.
fn gen_keys(dir: &Path) -> Result<(PathBuf, KeySet)> {
    use std::io::Read;
    let p = dir.join("keys");
    let mut random = [0u8; 3 * 32 + 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let kf = KeyFile::generate(&random, proto::cid::Prf::SipHash24);
    std::fs::write(&p, kf.to_text())?;
    Ok((p, kf.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?))
}

fn fixed_keys() -> KeySet {
    KeySet::new((proto::cid::Generation::ZERO, [0x5a; 32]), None).expect("one generation")
}

fn start_server(kind: &str, o: &Opts, dir: &Path, train: usize) -> Result<Running> {
    let me = std::env::current_exe()?;
    let (ready, counters) = (dir.join("ready"), dir.join("counters"));
    let mut cmd = Command::new(me);
    let mut hold: Vec<Box<dyn Any>> = Vec::new();
    let (ks, ids) = if kind == "floor" {
        cmd.arg("floor-server");
        if train > 1 {
            cmd.arg("--gro");
        }
        (fixed_keys(), vec![1, 2])
    } else {
        let (kp, ks) = gen_keys(dir)?;
        cmd.args(["baseline-server", "--keys"]).arg(kp);
        // The two workers: SEQPACKET listeners here, drained on the load core.
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let mut listeners = Vec::new();
        for id in 1..=2u16 {
            let p = dir.join(format!("w{id}.sock"));
            listeners.push(seqpacket_listen(&p)?);
            cmd.arg("--worker").arg(format!("{id}={}", p.display()));
        }
        cmd.args(["--listen", "127.0.0.1:0", "--ready-file"]).arg(&ready).arg("--counters").arg(&counters);
        let mut child = pinned(&mut cmd, o.shard_core).stdout(Stdio::null()).spawn()?;
        let mut threads = Vec::new();
        for l in listeners {
            // SAFETY: accept on a listening socket (SO_RCVTIMEO bounds the wait).
            let fd =
                unsafe { libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
            if fd < 0 {
                let _ = child.kill();
                let _ = child.wait();
                bail!("baseline did not connect: {}", std::io::Error::last_os_error());
            }
            // SAFETY: a fresh fd we own.
            threads.push(drain(unsafe { OwnedFd::from_raw_fd(fd) }, o.load_core, stop.clone(), count.clone()));
        }
        let addr = wait_ready(&ready, &mut child)?;
        let pid = child.id();
        let c = Rc::new(Counters::map(&counters, N_COUNTERS, false)?);
        let c2 = c.clone();
        // Drop order: the server first, then the sinks.
        hold.push(Box::new(ChildGuard(child)));
        hold.push(Box::new(Sinks { stop, threads }));
        return Ok(Running {
            pid,
            addr,
            ks,
            ids: vec![1, 2],
            counts: Box::new(move || Ok((c2.get(RECEIVED), c2.get(FORWARDED)))),
            _hold: hold,
        });
    };
    cmd.args(["--listen", "127.0.0.1:0", "--ready-file"]).arg(&ready).arg("--counters").arg(&counters);
    let mut child = pinned(&mut cmd, o.shard_core).stdout(Stdio::null()).spawn()?;
    let addr = wait_ready(&ready, &mut child)?;
    let pid = child.id();
    let c = Counters::map(&counters, N_COUNTERS, false)?;
    hold.push(Box::new(ChildGuard(child)));
    Ok(Running { pid, addr, ks, ids, counts: Box::new(move || Ok((c.get(RECEIVED), c.get(RECEIVED)))), _hold: hold })
}

fn seqpacket_listen(path: &Path) -> Result<OwnedFd> {
    let _ = std::fs::remove_file(path);
    // SAFETY: plain syscalls with checked results on a fresh socket.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sun: libc::sockaddr_un = zeroed();
        sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in sun.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
            *d = *s as libc::c_char;
        }
        let len = (size_of::<libc::sa_family_t>() + path.as_os_str().len() + 1) as libc::socklen_t;
        if libc::bind(fd.as_raw_fd(), (&sun as *const libc::sockaddr_un).cast(), len) < 0
            || libc::listen(fd.as_raw_fd(), 4) < 0
        {
            bail!("bind/listen {}: {}", path.display(), std::io::Error::last_os_error());
        }
        let tv = libc::timeval { tv_sec: 10, tv_usec: 0 };
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        );
        Ok(fd)
    }
}

fn demux_ready(d: &Demux, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(d)?["instances"].as_array().map(|a| a.iter().filter(|i| i["placeable"] == true).count()) != Some(n) {
        if Instant::now() > deadline {
            bail!("workers not placeable");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn start_demux_run(io: &str, o: &Opts, bins: &Path) -> Result<Running> {
    let d = Rc::new(start_demux(&bins.join("demux"), io, o.shard_core)?);
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    let threads = (1..=2).map(|id| sink(&d, id, o.load_core, stop.clone(), frames.clone())).collect::<Result<_>>()?;
    demux_ready(&d, 2)?;
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let d2 = d.clone();
    Ok(Running {
        pid: d.child.id(),
        addr: d.udp,
        ks,
        ids: vec![1, 2],
        counts: Box::new(move || {
            let s = status(&d2)?;
            Ok((g(&s, "/datagrams_in"), forwarded(&s)))
        }),
        _hold: vec![Box::new(d), Box::new(Sinks { stop, threads })],
    })
}

const NGINX: &str = "/usr/sbin/nginx";
const NGINX_STREAM: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// Installs Debian's nginx-light + libnginx-mod-stream when nginx or its stream
/// module is missing (without starting the packaged service: RUNLEVEL=1).
pub(crate) fn ensure_nginx(install: bool) -> Result<()> {
    if Path::new(NGINX).exists() && Path::new(NGINX_STREAM).exists() {
        return Ok(());
    }
    if !install {
        bail!("{NGINX} or {NGINX_STREAM} missing (apt-get install nginx-light libnginx-mod-stream)");
    }
    eprintln!("bench: installing nginx-light libnginx-mod-stream");
    let st = Command::new("apt-get")
        .args(["install", "-y", "-q", "nginx-light", "libnginx-mod-stream"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("RUNLEVEL", "1")
        .status()
        .context("apt-get")?;
    if !st.success() || !Path::new(NGINX_STREAM).exists() {
        bail!("could not install nginx-light libnginx-mod-stream");
    }
    Ok(())
}

fn start_nginx(o: &Opts, dir: &Path) -> Result<Running> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut ups = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..2 {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        ups.push(s.local_addr()?);
        threads.push(drain(OwnedFd::from(s), o.load_core, stop.clone(), count.clone()));
    }
    let sinks = Sinks { stop, threads };
    let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(o.shard_core + 1);
    let mask: String = (0..ncpu).rev().map(|c| if c == o.shard_core { '1' } else { '0' }).collect();
    let conf = format!(
        "load_module {NGINX_STREAM};\nworker_processes 1;\nworker_cpu_affinity {mask};\nworker_rlimit_nofile 65536;\n\
         daemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 16384; }}\n\
         stream {{\n  upstream u {{ hash $remote_addr consistent; server {u1}; server {u2}; }}\n  \
         server {{ listen 127.0.0.1:{port} udp reuseport; proxy_pass u; proxy_responses 0; }}\n}}\n",
        d = dir.display(),
        u1 = ups[0],
        u2 = ups[1],
    );
    std::fs::write(dir.join("nginx.conf"), conf)?;
    let mut child = crate::dataplane::with_parent(&mut Command::new(NGINX))
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdout(Stdio::null())
        .spawn()
        .context("nginx")?;
    let master = child.id();
    // The worker: the master's child.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let kids = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children")).unwrap_or_default();
        if let Some(p) = kids.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            break p;
        }
        if let Some(st) = child.try_wait()? {
            bail!("nginx exited: {st}: {}", std::fs::read_to_string(dir.join("error.log")).unwrap_or_default());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("no nginx worker");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(200));
    let c = count.clone();
    Ok(Running {
        pid,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        ks: fixed_keys(),
        ids: vec![1, 2],
        counts: Box::new(move || {
            let n = c.load(Ordering::Relaxed);
            Ok((n, n))
        }),
        _hold: vec![Box::new(ChildGuard(child)), Box::new(sinks)],
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

/// CPU ns of the calling thread.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

pub(crate) struct Load {
    pub sent: u64,
    pub secs: f64,
    pub cpu_s: f64,
}

/// Offers 1200-byte short-header datagrams (CIDs for `ids`) from 64 flows, 8
/// messages per sendmmsg on one flow, flows in turn; `train` > 1 sends UDP_SEGMENT
/// trains. `rate` 0: as fast as the kernel takes them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_load(
    addr: SocketAddr,
    ks: &KeySet,
    ids: &[u16],
    train: usize,
    seconds: f64,
    rate: f64,
    core: usize,
    nice: Option<i32>,
) -> Result<Load> {
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    const FLOWS: usize = 64;
    const MSGS: usize = 8;
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for f in 0..FLOWS {
        let mut r = [0u8; 10];
        r.iter_mut().for_each(|b| *b = rnd() as u8);
        let cid = ks.encode(ServerId(ids[f % ids.len()]), &r);
        let mut buf = Vec::with_capacity(DATAGRAM * train);
        for _ in 0..train {
            let mut p = vec![0u8; DATAGRAM];
            p.iter_mut().for_each(|b| *b = rnd() as u8);
            p[0] = 0x40 | (p[0] & 0x3f);
            p[1..13].copy_from_slice(&cid);
            buf.extend_from_slice(&p);
        }
        payloads.push(buf);
    }
    let socks: Vec<UdpSocket> = (0..FLOWS).map(|_| UdpSocket::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    for s in &socks {
        s.connect(addr)?;
        if train > 1 {
            let seg: libc::c_int = DATAGRAM as libc::c_int;
            // SAFETY: udp(7) UDP_SEGMENT with a live c_int.
            if unsafe {
                libc::setsockopt(s.as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, (&seg as *const i32).cast(), 4)
            } != 0
            {
                bail!("UDP_SEGMENT: {}", std::io::Error::last_os_error());
            }
        }
    }
    std::thread::scope(|sc| {
        sc.spawn(|| {
            pin(core);
            if let Some(n) = nice {
                // SAFETY: setpriority on this thread (Linux: PRIO_PROCESS 0 is the caller).
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) };
            }
            let cpu0 = thread_cpu_ns();
            let per_call = (MSGS * train) as f64;
            let mut sent = 0u64;
            let start = Instant::now();
            let end = start + Duration::from_secs_f64(seconds);
            let mut k = 0usize;
            let mut iovs: Vec<libc::iovec> = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MSGS];
            // SAFETY: plain old data.
            let mut msgs: Vec<libc::mmsghdr> = (0..MSGS).map(|_| unsafe { zeroed() }).collect();
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                if rate > 0.0 {
                    let due = start + Duration::from_secs_f64(k as f64 * per_call / rate);
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                }
                let f = k % FLOWS;
                k += 1;
                for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
                    iov.iov_base = payloads[f].as_ptr() as *mut _;
                    iov.iov_len = payloads[f].len();
                    m.msg_hdr.msg_iov = iov;
                    m.msg_hdr.msg_iovlen = 1;
                }
                // SAFETY: msgs point at live buffers (read only by the kernel).
                let r = unsafe { libc::sendmmsg(socks[f].as_raw_fd(), msgs.as_mut_ptr(), MSGS as u32, 0) };
                if r > 0 {
                    sent += (r as usize * train) as u64;
                }
            }
            Load { sent, secs: start.elapsed().as_secs_f64(), cpu_s: (thread_cpu_ns() - cpu0) as f64 / 1e9 }
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))
    })
}

#[derive(Clone, Debug)]
struct Row {
    contender: String,
    offered: f64,
    train: usize,
    rep: usize,
    sent: u64,
    received: u64,
    handled: u64,
    cpu_s: f64,
    secs: f64,
    sender_cpu_s: f64,
    /// Time the contender's threads were runnable but waited for a CPU.
    wait_s: f64,
}

impl Row {
    fn us(&self) -> f64 {
        self.cpu_s * 1e6 / self.handled.max(1) as f64
    }
    fn rate(&self) -> f64 {
        self.handled as f64 / self.secs
    }
}

fn run_once(kind: &str, offered: f64, train: usize, rep: usize, o: &Opts, bins: &Path, tmp: &Path) -> Result<Row> {
    let dir = tmp.join(format!("{kind}-{offered}-{train}-{rep}"));
    std::fs::create_dir_all(&dir)?;
    let _dg = DirGuard(dir.clone());
    let r = match kind {
        "floor" | "baseline" => start_server(kind, o, &dir, train)?,
        "demux-uring" => start_demux_run("uring", o, bins)?,
        "demux-mmsg" => start_demux_run("mmsg", o, bins)?,
        "nginx" => start_nginx(o, &dir)?,
        _ => unreachable!(),
    };
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

#[derive(Clone, Debug)]
struct LatRow {
    pct: u32,
    rep: usize,
    offered: f64,
    v: Value,
}

fn run_latency(pct: u32, rep: usize, sat: f64, o: &Opts, bins: &Path) -> Result<LatRow> {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn cmd_out(c: &str, args: &[&str]) -> String {
    Command::new(c)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(if o.stdout.is_empty() { &o.stderr } else { &o.stdout }).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn offered_name(offered: f64) -> String {
    if offered > 0.0 {
        format!("{}/s", thousands(offered))
    } else {
        "unpaced".into()
    }
}

fn mode_name(train: usize) -> String {
    if train == 1 {
        "uncoalesced".into()
    } else {
        format!("GRO trains of {train}")
    }
}

struct Summary {
    contender: String,
    offered: f64,
    train: usize,
    us: f64,
    us_min: f64,
    us_max: f64,
    rate: f64,
    x_base: f64,
    x_floor: f64,
    loss: f64,
    busy: f64,
}

fn summarize(rows: &[Row], o: &Opts) -> Vec<Summary> {
    let mut out = Vec::new();
    for (&offered, &train) in o.rates.iter().flat_map(|r| o.trains.iter().map(move |t| (r, t))) {
        for c in &o.contenders {
            let mine: Vec<&Row> =
                rows.iter().filter(|r| r.offered == offered && r.train == train && &r.contender == c).collect();
            if mine.is_empty() {
                continue;
            }
            // Ratios within each round (side by side), then the median over rounds.
            let ratio_to = |other: &str| {
                median(
                    mine.iter()
                        .filter_map(|r| {
                            rows.iter()
                                .find(|x| {
                                    x.offered == offered && x.train == train && x.rep == r.rep && x.contender == other
                                })
                                .map(|x| r.us() / x.us())
                        })
                        .collect(),
                )
            };
            let us: Vec<f64> = mine.iter().map(|r| r.us()).collect();
            out.push(Summary {
                contender: c.clone(),
                offered,
                train,
                us: median(us.clone()),
                us_min: us.iter().cloned().fold(f64::INFINITY, f64::min),
                us_max: us.iter().cloned().fold(0.0, f64::max),
                rate: median(mine.iter().map(|r| r.rate()).collect()),
                x_base: ratio_to("baseline"),
                x_floor: ratio_to("floor"),
                loss: median(mine.iter().map(|r| 1.0 - r.handled as f64 / r.sent.max(1) as f64).collect()),
                busy: median(mine.iter().map(|r| r.cpu_s / r.secs).collect()),
            });
        }
    }
    out
}

fn fmt(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "–".into()
    }
}

fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push('\u{202f}');
        }
        out.push(ch);
    }
    out
}

struct Conditions {
    date: String,
    kernel: String,
    cpu: String,
    ncpu: usize,
    load_start: String,
    load_end: String,
    rustc: String,
    nginx: String,
}

fn goal_line(name: &str, value: f64, goal: f64, le: bool) -> String {
    let ok = if le { value <= goal } else { value >= goal };
    let by = if le { value / goal } else { goal / value };
    format!(
        "| {name} | {} | {} | {} |",
        fmt(value, 2),
        fmt(goal, 2),
        if ok {
            "**met**".to_string()
        } else if by < 2.0 {
            format!("**missed** by {:.0} %", (by - 1.0) * 100.0)
        } else {
            format!("**missed** by {}×", fmt(by, 1))
        }
    )
}

fn report(rows: &[Row], sums: &[Summary], lat: &[LatRow], sat: f64, o: &Opts, c: &Conditions, secs: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<!-- bench all: begin (generated by `cargo run --release -p bench -- all`; edits inside are overwritten) -->"
    );
    let _ = writeln!(s, "### Results: {}\n", c.date);
    let _ = writeln!(
        s,
        "Conditions: Linux {}, {} ({} CPUs), {}; nginx {}; load average at start {} (at end {}); \
         {} repetitions of {} s per contender and mode, contenders in rotating order within each round; \
         contender pinned to core {}, sender (64 flows, sendmmsg of 8 messages) and sinks on core {}; \
         1200-byte short-header datagrams; offered: {}; the bench and everything it starts run at nice {} in an autogroup of their own. Whole run: {:.0} s. \
         Figures are medians over the repetitions; ratios are taken within each round, then the median.\n",
        c.kernel,
        c.cpu,
        c.ncpu,
        c.rustc,
        c.nginx,
        c.load_start,
        c.load_end,
        o.reps,
        o.seconds,
        o.shard_core,
        o.load_core,
        o.rates.iter().map(|&r| offered_name(r)).collect::<Vec<_>>().join(" and "),
        o.nice,
        secs
    );
    for &offered in &o.rates {
        let _ = writeln!(
            s,
            "{}:\n",
            if offered > 0.0 {
                format!("**Paced at {} datagrams/s offered**", thousands(offered))
            } else {
                "**Unpaced** (the sender as fast as it can; \"datagrams/s handled\" is the most the contender handled)"
                    .into()
            }
        );
        let _ = writeln!(s, "| contender | datagrams | **CPU µs / datagram** (min–max) | datagrams/s handled | × baseline | × floor | not handled | contender core busy |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for m in sums.iter().filter(|m| m.offered == offered) {
            let _ = writeln!(
                s,
                "| {} | {} | **{}** ({}–{}) | {} | {} | {} | {} % | {} % |",
                m.contender,
                mode_name(m.train),
                fmt(m.us, 3),
                fmt(m.us_min, 2),
                fmt(m.us_max, 2),
                thousands(m.rate),
                fmt(m.x_base, 3),
                fmt(m.x_floor, 2),
                fmt(m.loss * 100.0, 1),
                fmt(m.busy * 100.0, 0)
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\n\"CPU µs / datagram\": the contender's CPU time (all threads, /proc/<pid>/task/*/schedstat; nginx: its worker \
         process) over the run divided by the datagrams it handled — forwarded to a worker (demux, baseline: \
         SEQPACKET frames accepted by the kernel; nginx: datagrams arriving at its UDP upstreams) or, for the floor, \
         received. \"datagrams/s handled\": handled / send time. \"contender core busy\": its CPU time / send time — \
         unpaced, a contender below ≈ 100 % was limited by the sender, not by its own core. \"not handled\": \
         1 − handled / sent (the kernel dropped what the contender did not take in time, or the contender dropped it). \
         Trains: the sender sets UDP_SEGMENT = 1200 and sends 9600 bytes per message; the floor and the demux \
         receive them with UDP_GRO as one train, the baseline and nginx (no UDP_GRO) as 8 datagrams.\n"
    );
    // Goals.
    let mut goals = String::new();
    for &offered in &o.rates {
        let find = |c: &str, t: usize| sums.iter().find(|m| m.contender == c && m.train == t && m.offered == offered);
        let on = offered_name(offered);
        for io in ["demux-uring", "demux-mmsg"] {
            for &t in &o.trains {
                let Some(m) = find(io, t) else { continue };
                let what = format!("{io}, {}, {on}", mode_name(t));
                let _ = writeln!(
                    goals,
                    "{}",
                    goal_line(&format!("{what}: CPU µs / datagram"), m.us, if t == 1 { 0.40 } else { 0.10 }, true)
                );
                if m.x_base.is_finite() {
                    let _ = writeln!(
                        goals,
                        "{}",
                        goal_line(&format!("{what}: baseline ÷ demux"), 1.0 / m.x_base, 10.0, false)
                    );
                }
                if let Some(n) = find("nginx", t) {
                    let _ =
                        writeln!(goals, "{}", goal_line(&format!("{what}: nginx ÷ demux"), n.us / m.us, 10.0, false));
                }
                if m.x_floor.is_finite() {
                    let _ = writeln!(goals, "{}", goal_line(&format!("{what}: demux ÷ floor"), m.x_floor, 1.5, true));
                }
            }
        }
    }
    if !lat.is_empty() {
        if o.udpflood {
            let _ = writeln!(s, "Latency of the demux hop (`--io uring`), round trips: `udpflood --latency` sends {} probes/s of 1200 bytes through the demux to two `worker --echo` (server ids 1, 2) and records round trips in an HDR histogram; this process adds background load (a nice-0 thread) to a third, sink-only worker so that the demux handles the stated share of its saturation ({} datagrams/s: the median io_uring uncoalesced unpaced rate above). The demux on core {}, workers, udpflood and background sender on core {}; {} s per run, {} runs per load, medians of the per-run percentiles. The round trip includes the echo worker and the loopback both ways.\n",
                o.probe_rate, thousands(sat), o.shard_core, o.load_core, o.lat_seconds, o.reps);
        } else {
            let _ = writeln!(s, "Latency of the demux hop (`--io uring`), one way: a probe thread sends {} probes/s (1200-byte short headers for server id 1, the CLOCK_MONOTONIC send time inside) to the demux; a probe worker in the bench (DataHello as server id 1) takes each frame off its data connection and records arrival − send time in an HDR histogram. So the figure is sendto → kernel UDP → demux (receive, decode, route, sendmmsg) → AF_UNIX → the worker's recv. A nice-0 thread adds background load to a sink-only worker (server id 3) so that the demux handles the stated share of its saturation ({} datagrams/s: the median io_uring uncoalesced unpaced rate above). The demux on core {}; the probe sender, probe worker, background sender and sink on core {}; {}; {} s per run, {} runs per load, medians of the per-run percentiles.\n",
                o.probe_rate, thousands(sat), o.shard_core, o.load_core,
                if o.rt { "the demux's threads, the probe sender and the probe worker run SCHED_FIFO (as on cores of their own; `--no-rt`: at the bench's nice value, sharing the cores with the machine's other processes)" } else { "everything at the bench's nice value (`--no-rt`)" },
                o.lat_seconds, o.reps);
        }
        let _ = writeln!(s, "| load | offered datagrams/s | p50 µs | p99 µs | p99.9 µs | max µs | probes lost |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for pct in [0u32, 25, 50, 75] {
            let mine: Vec<&LatRow> = lat.iter().filter(|l| l.pct == pct).collect();
            if mine.is_empty() {
                continue;
            }
            let m = |k: &str| median(mine.iter().filter_map(|l| l.v[k].as_f64()).collect());
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} / {} |",
                if pct == 0 { "probes only".to_string() } else { format!("{pct} %") },
                thousands(mine[0].offered),
                fmt(m("p50_us"), 1),
                fmt(m("p99_us"), 1),
                fmt(m("p999_us"), 1),
                fmt(m("max_us"), 0),
                mine.iter().map(|l| l.v["lost"].as_u64().unwrap_or(0)).sum::<u64>(),
                mine.iter().map(|l| l.v["sent"].as_u64().unwrap_or(0)).sum::<u64>()
            );
        }
        let p99_50 = median(lat.iter().filter(|l| l.pct == 50).filter_map(|l| l.v["p99_us"].as_f64()).collect());
        let _ = writeln!(
            goals,
            "{}",
            goal_line(
                if o.udpflood {
                    "demux hop p99 µs at 50 % load (round trip)"
                } else {
                    "demux hop p99 µs at 50 % load (one way)"
                },
                p99_50,
                20.0,
                true
            )
        );
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "Goals (issue #6), from the medians above:\n");
    let _ = writeln!(s, "| goal | measured | target | |\n|---|---|---|---|");
    s.push_str(&goals);
    let _ = writeln!(s, "\n![CPU µs per datagram](benchmarks-cpu.svg)\n");
    let _ = writeln!(s, "<details><summary>Every run</summary>\n");
    let _ = writeln!(s, "| round | contender | datagrams | offered | sent | received | handled | CPU s | send s | CPU µs / datagram | datagrams/s | sender CPU s |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.2} | {:.3} | {} | {:.2} |",
            r.rep + 1,
            r.contender,
            mode_name(r.train),
            offered_name(r.offered),
            r.sent,
            r.received,
            r.handled,
            r.cpu_s,
            r.secs,
            r.us(),
            thousands(r.rate()),
            r.sender_cpu_s
        );
    }
    for l in lat {
        let _ = writeln!(s, "\nlatency {} % round {}: `{}`", l.pct, l.rep + 1, l.v);
    }
    let _ = writeln!(s, "\n</details>\n<!-- bench all: end -->");
    s
}

fn svg(sums: &[Summary], o: &Opts) -> String {
    let max = sums.iter().map(|m| m.us).filter(|x| x.is_finite()).fold(0.0f64, f64::max).max(0.1);
    let series: Vec<(f64, usize)> = o.rates.iter().flat_map(|&r| o.trains.iter().map(move |&t| (r, t))).collect();
    let (label_w, bar_w, row_h) = (110.0, 560.0, 18.0);
    let groups: Vec<&String> = o.contenders.iter().filter(|c| sums.iter().any(|m| &m.contender == *c)).collect();
    let ns = series.len() as f64;
    let legend_rows = series.len().div_ceil(2) as f64;
    let top = 34.0 + legend_rows * 18.0 + 8.0;
    let h = top + groups.len() as f64 * (row_h * ns + 14.0) + 10.0;
    let w = label_w + bar_w + 70.0;
    let colors = ["#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">CPU µs per 1200-byte datagram, median of {} runs (lower is better)</text>\n",
        o.reps
    );
    for (i, &(r, t)) in series.iter().enumerate() {
        let x = label_w + (i % 2) as f64 * 280.0;
        let y = 30.0 + (i / 2) as f64 * 18.0;
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}, {}</text>",
            colors[i % colors.len()],
            x + 16.0,
            y + 10.0,
            mode_name(t),
            offered_name(r)
        );
    }
    let mut y = top;
    for c in groups {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{c}</text>",
            label_w - 8.0,
            y + row_h * ns / 2.0 + 4.0
        );
        for (i, &(r, t)) in series.iter().enumerate() {
            if let Some(m) = sums.iter().find(|m| &m.contender == c && m.train == t && m.offered == r) {
                let bw = if m.us.is_finite() { m.us / max * bar_w } else { 0.0 };
                let _ = writeln!(
                    s,
                    "<rect x=\"{label_w}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\">{}</text>",
                    row_h - 3.0,
                    colors[i % colors.len()],
                    label_w + bw + 4.0,
                    y + row_h - 6.0,
                    fmt(m.us, 2)
                );
            }
            y += row_h;
        }
        y += 14.0;
    }
    let _ = writeln!(
        s,
        "<line x1=\"{label_w}\" y1=\"{}\" x2=\"{label_w}\" y2=\"{}\" stroke=\"black\"/>",
        top - 4.0,
        y - 10.0
    );
    s.push_str("</svg>\n");
    s
}

/// Replaces the generated block in the doc (or inserts it after the "## side by side" heading, or appends it).
fn write_doc(path: &Path, block: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let begin = old.find("<!-- bench all: begin");
    let end = old.find("<!-- bench all: end -->");
    let new = match (begin, end) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{}{}", &old[..b], block.trim_end(), &old[e + "<!-- bench all: end -->".len()..])
        }
        _ => format!("{}\n{}", old.trim_end(), block),
    };
    std::fs::write(path, new)?;
    Ok(())
}

/// The machine is shared: run the contenders, the sender and the sinks at a high
/// priority so other processes take little of their cores (children inherit it).
/// With autogroup scheduling (kernel.sched_autogroup_enabled) a task's nice value
/// only weighs within its session, so the bench first starts a session of its own
/// (setsid: a new autogroup holding only the bench and its children), gives that
/// group the nice value, and asks for SIGTERM if its parent (cargo) goes away.
fn prioritize(nice: i32) {
    // SAFETY: plain syscalls on this process.
    unsafe {
        if libc::setsid() >= 0 {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        }
        if libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
            eprintln!("bench: setpriority({nice}): {}", std::io::Error::last_os_error());
        }
    }
    if Path::new("/proc/self/autogroup").exists() {
        if let Err(e) = std::fs::write("/proc/self/autogroup", nice.to_string()) {
            eprintln!("bench: /proc/self/autogroup: {e}");
        }
    }
}

pub fn main(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let t_start = Instant::now();
    if o.nice != 0 {
        prioritize(o.nice);
    }
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    if o.contenders.iter().any(|c| c == "nginx") {
        ensure_nginx(o.install_nginx)?;
    }
    let bins = bins(&o)?;
    let tmp = std::env::temp_dir().join(format!("qdbench-all-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let _tg = DirGuard(tmp.clone());
    let mut rows = Vec::new();
    for rep in 0..o.reps {
        for (&train, &offered) in o.trains.iter().flat_map(|t| o.rates.iter().map(move |r| (t, r))) {
            let n = o.contenders.len();
            for i in 0..n {
                let kind = &o.contenders[(i + rep) % n];
                let r = run_once(kind, offered, train, rep, &o, &bins, &tmp).with_context(|| {
                    format!("{kind}, {}, {}, round {}", mode_name(train), offered_name(offered), rep + 1)
                })?;
                eprintln!(
                    "round {} {:<12} {:<16} {:<8} {:>7.3} µs CPU/datagram, {:>9.0} datagrams/s handled ({} sent, {} received, {} handled; CPU {:.2} s, waited {:.2} s; sender {:.2} s)",
                    rep + 1,
                    kind,
                    mode_name(train),
                    offered_name(offered),
                    r.us(),
                    r.rate(),
                    r.sent,
                    r.received,
                    r.handled,
                    r.cpu_s,
                    r.wait_s,
                    r.sender_cpu_s
                );
                rows.push(r);
            }
        }
    }
    let sums = summarize(&rows, &o);
    let mut lat = Vec::new();
    let sat = sums
        .iter()
        .find(|m| m.contender == "demux-uring" && m.train == 1 && m.offered == 0.0)
        .map(|m| m.rate)
        .unwrap_or(f64::NAN);
    if o.latency && sat.is_finite() {
        for rep in 0..o.reps {
            for pct in [0u32, 25, 50, 75] {
                let l = run_latency(pct, rep, sat, &o, &bins).with_context(|| format!("latency {pct} %"))?;
                eprintln!(
                    "latency {pct} % ({:.0}/s) round {}: p50 {} µs, p99 {} µs, p99.9 {} µs, lost {}",
                    l.offered,
                    rep + 1,
                    l.v["p50_us"],
                    l.v["p99_us"],
                    l.v["p999_us"],
                    l.v["lost"]
                );
                lat.push(l);
            }
        }
    }
    let c = Conditions {
        date: cmd_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        kernel: cmd_out("uname", &["-r"]),
        cpu: std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("model name").map(|x| x.trim_start_matches([' ', '\t', ':']).to_string()))
            .unwrap_or_default(),
        ncpu: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        load_start: load_start.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        load_end: std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        rustc: cmd_out("rustc", &["--version"]),
        nginx: if o.contenders.iter().any(|c| c == "nginx") {
            cmd_out(NGINX, &["-v"]).trim_start_matches("nginx version: ").to_string()
        } else {
            "not run".into()
        },
    };
    let text = report(&rows, &sums, &lat, sat, &o, &c, t_start.elapsed().as_secs_f64());
    println!("{text}");
    if let Some(p) = &o.doc {
        write_doc(p, &text)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &o.svg {
        std::fs::write(p, svg(&sums, &o))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &o.json {
        let v = json!({
            "rows": rows.iter().map(|r| json!({
                "contender": r.contender, "train": r.train, "rep": r.rep, "sent": r.sent, "received": r.received,
                "handled": r.handled, "cpu_s": r.cpu_s, "secs": r.secs, "us_per_datagram": r.us(),
                "sender_cpu_s": r.sender_cpu_s})).collect::<Vec<_>>(),
            "latency": lat.iter().map(|l| json!({"pct": l.pct, "rep": l.rep, "offered": l.offered, "udpflood": l.v})).collect::<Vec<_>>(),
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
