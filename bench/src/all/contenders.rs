//! The contenders of `bench all`, started for one run: each as its own process on
//! the shard core (the floor and the baseline are this binary's `floor-server` and
//! `baseline-server`, the demux the release `demux`, nginx the system's), with the
//! sinks that take what it forwards on the load core.

use super::Opts;
use crate::dataplane::{
    forwarded, g, sink, start_demux_at, start_demux_with, status, wait_placeable, wait_ready_file, Demux, POLL,
    READY_TIMEOUT, SINK_RCVTIMEO,
};
use crate::load::LOOPBACK_ANY;
use crate::servers::{Counters, FORWARDED, N_COUNTERS, RECEIVED};
use crate::sys::{drain_count, pin};
use anyhow::{bail, Context, Result};
use proto::cid::KeySet;
use proto::keyfile::KeyFile;
use std::any::Any;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `cmd` pinned to `core` (sched_setaffinity in the child before exec).
pub(super) fn pinned(cmd: &mut Command, core: usize) -> &mut Command {
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

/// Backlog of the baseline's worker listeners (it connects once to each).
const WORKER_BACKLOG: i32 = 4;
/// How long the baseline may take to connect to its workers.
const WORKER_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The server ids of the two workers (sinks) behind every contender; the sender's
/// flows alternate between them.
const WORKER_IDS: [u16; 2] = [1, 2];
/// How long a contender has between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(500);
/// How long nginx's master may take to fork its worker.
const NGINX_WORKER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for nginx's worker to open its sockets before the load starts.
const NGINX_SETTLE: Duration = Duration::from_millis(200);
/// Random bytes `KeyFile::generate` takes: three 32-byte keys and 16 more.
const KEYFILE_RANDOM_LEN: usize = proto::keyfile::RANDOM_LEN;
/// The key of the floor's and nginx's CIDs (neither decodes them).
const FIXED_KEY: [u8; 32] = [0x5a; 32];

pub(super) struct ChildGuard(pub(super) Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SIGTERM first (nginx's master takes its worker down with it), then SIGKILL.
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(POLL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) struct DirGuard(pub(crate) PathBuf);
impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Drain threads (recvmmsg and count) on sockets of any type; stopped on drop.
pub(super) struct Sinks {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
}
impl Drop for Sinks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A thread on `core` that counts what arrives on `fd` until `stop`.
fn drain(fd: OwnedFd, core: usize, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    crate::sys::sink_timeout(&fd, SINK_RCVTIMEO);
    std::thread::spawn(move || {
        pin(core);
        drain_count(fd.as_fd(), &stop, &count);
    })
}

/// Where a contender runs: its own process on `shard`; the sinks (and in the bench
/// the sender) on `load`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cores {
    pub(crate) shard: usize,
    pub(crate) load: usize,
}

/// A contender under test.
/// The demux's `batches` (rounds of its shard loop) and `ring_wakes` (eventfd writes
/// to sleeping ring consumers) counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LoopCounts {
    pub(crate) batches: u64,
    pub(crate) ring_wakes: u64,
}

pub(crate) struct Running {
    /// The process whose CPU time is measured.
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
    pub(crate) ks: KeySet,
    /// Server ids whose CIDs the sender uses.
    pub(crate) ids: Vec<u16>,
    /// (received, handled) so far.
    pub(crate) counts: Box<dyn Fn() -> Result<(u64, u64)>>,
    /// What has reached the far end so far (the floor: received; otherwise what the
    /// sinks took, in records), read without a request to the contender.
    pub(crate) progress: Box<dyn Fn() -> u64>,
    /// The demux's shard-loop counters so far; None for the others.
    pub(crate) batches: Option<Box<dyn Fn() -> Result<LoopCounts>>>,
    pub(crate) _hold: Vec<Box<dyn Any>>,
}

fn wait_ready(ready: &Path, child: &mut Child) -> Result<SocketAddr> {
    wait_ready_file(ready, child, &ready.display().to_string())
}

/// A fresh key file (as `demux gen-keys` writes it) in `dir`.
fn gen_keys(dir: &Path) -> Result<(PathBuf, KeySet)> {
    use std::io::Read;
    let p = dir.join("keys");
    let mut random = [0u8; KEYFILE_RANDOM_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let kf = KeyFile::generate(&random, proto::cid::Prf::SipHash24);
    std::fs::write(&p, kf.to_text())?;
    Ok((p, kf.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?))
}

fn fixed_keys() -> KeySet {
    KeySet::new((proto::cid::Generation::ZERO, FIXED_KEY), None).expect("one generation")
}

pub(crate) fn start_server(kind: &str, cores: Cores, dir: &Path, train: usize) -> Result<Running> {
    let me = std::env::current_exe()?;
    let (ready, counters) = (dir.join("ready"), dir.join("counters"));
    let mut cmd = Command::new(me);
    let mut hold: Vec<Box<dyn Any>> = Vec::new();
    let (ks, ids) = if kind == "floor" {
        cmd.arg("floor-server");
        if train > 1 {
            cmd.arg("--gro");
        }
        (fixed_keys(), WORKER_IDS.to_vec())
    } else {
        let (kp, ks) = gen_keys(dir)?;
        cmd.args(["baseline-server", "--keys"]).arg(kp);
        // The two workers: SEQPACKET listeners here, drained on the load core.
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let mut listeners = Vec::new();
        for id in WORKER_IDS {
            let p = dir.join(format!("w{id}.sock"));
            let _ = std::fs::remove_file(&p);
            let l = sys::seqpacket::listen(&p, WORKER_BACKLOG)?;
            // accept waits at most this long.
            rustix::net::sockopt::set_socket_timeout(
                &l,
                rustix::net::sockopt::Timeout::Recv,
                Some(WORKER_CONNECT_TIMEOUT),
            )?;
            listeners.push(l);
            cmd.arg("--worker").arg(format!("{id}={}", p.display()));
        }
        cmd.args(["--listen", LOOPBACK_ANY, "--ready-file"]).arg(&ready).arg("--counters").arg(&counters);
        let mut child = pinned(&mut cmd, cores.shard).stdout(Stdio::null()).spawn()?;
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
            threads.push(drain(unsafe { OwnedFd::from_raw_fd(fd) }, cores.load, stop.clone(), count.clone()));
        }
        let addr = wait_ready(&ready, &mut child)?;
        let pid = child.id();
        let c = Rc::new(Counters::map(&counters, N_COUNTERS, false)?);
        let c2 = c.clone();
        let delivered = count.clone();
        // Drop order: the server first, then the sinks.
        hold.push(Box::new(ChildGuard(child)));
        hold.push(Box::new(Sinks { stop, threads }));
        return Ok(Running {
            pid,
            addr,
            ks,
            ids: WORKER_IDS.to_vec(),
            counts: Box::new(move || Ok((c2.get(RECEIVED), c2.get(FORWARDED)))),
            progress: Box::new(move || delivered.load(Ordering::Relaxed)),
            batches: None,
            _hold: hold,
        });
    };
    cmd.args(["--listen", LOOPBACK_ANY, "--ready-file"]).arg(&ready).arg("--counters").arg(&counters);
    let mut child = pinned(&mut cmd, cores.shard).stdout(Stdio::null()).spawn()?;
    let addr = wait_ready(&ready, &mut child)?;
    let pid = child.id();
    let c = Rc::new(Counters::map(&counters, N_COUNTERS, false)?);
    let c2 = c.clone();
    hold.push(Box::new(ChildGuard(child)));
    Ok(Running {
        pid,
        addr,
        ks,
        ids,
        counts: Box::new(move || Ok((c.get(RECEIVED), c.get(RECEIVED)))),
        progress: Box::new(move || c2.get(RECEIVED)),
        batches: None,
        _hold: hold,
    })
}

/// `bench retry-floor-server` on `core`, listening on `listen` inside the network
/// namespace `netns` (`ip netns exec`: the same pid), replying `reply_len` bytes to
/// each datagram. Handled: the replies sent.
pub(crate) fn start_retry_floor(
    core: usize,
    dir: &Path,
    listen: &str,
    netns: &str,
    reply_len: usize,
) -> Result<Running> {
    let (ready, counters) = (dir.join("ready"), dir.join("counters"));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).arg(std::env::current_exe()?).arg("retry-floor-server");
    cmd.args(["--listen", listen, "--reply-len", &reply_len.to_string(), "--ready-file"]).arg(&ready);
    cmd.arg("--counters").arg(&counters);
    let mut child = pinned(&mut cmd, core).stdout(Stdio::null()).spawn()?;
    let addr = wait_ready(&ready, &mut child)?;
    let pid = child.id();
    let c = Rc::new(Counters::map(&counters, N_COUNTERS, false)?);
    Ok(Running {
        pid,
        addr,
        ks: fixed_keys(),
        ids: WORKER_IDS.to_vec(),
        counts: Box::new(move || Ok((c.get(RECEIVED), c.get(FORWARDED)))),
        // The caller counts what reached the far end.
        progress: Box::new(|| 0),
        batches: None,
        _hold: vec![Box::new(ChildGuard(child))],
    })
}

/// Waits until the demux has `n` placeable workers.
pub(super) fn demux_ready(d: &Demux, n: usize) -> Result<()> {
    wait_placeable(d, n, READY_TIMEOUT, "workers not placeable")
}

/// The release demux (`flags`: `--io`, `--forward`, …; `name` names its scratch
/// directory) with a sink worker per server id of `WORKER_IDS` on the load core.
pub(crate) fn start_demux_run(name: &str, flags: &[&str], cores: Cores, bins: &Path) -> Result<Running> {
    start_demux_run_counting(name, flags, cores, bins, None, forwarded)
}

/// As [`start_demux_run`], listening on `at`'s address inside `at`'s network namespace
/// (`ip netns`) when given, with `handled(status)` as what the demux handled (e.g. the
/// Retries it sent instead of the datagrams it forwarded).
pub(crate) fn start_demux_run_counting(
    name: &str,
    flags: &[&str],
    cores: Cores,
    bins: &Path,
    at: Option<(&str, &str)>,
    handled: fn(&serde_json::Value) -> u64,
) -> Result<Running> {
    let bin = bins.join("demux");
    let d = Rc::new(match at {
        Some((listen, netns)) => start_demux_at(&bin, name, cores.shard, listen, None, Some(netns), flags)?,
        None => start_demux_with(&bin, name, cores.shard, flags)?,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    let threads =
        WORKER_IDS.iter().map(|&id| sink(&d, id, cores.load, stop.clone(), frames.clone())).collect::<Result<_>>()?;
    demux_ready(&d, WORKER_IDS.len())?;
    let ks = d.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (d2, d3) = (d.clone(), d.clone());
    let delivered = frames.clone();
    Ok(Running {
        pid: d.child.id(),
        addr: d.udp,
        ks,
        ids: WORKER_IDS.to_vec(),
        counts: Box::new(move || {
            let s = status(&d2)?;
            Ok((g(&s, "/datagrams_in"), handled(&s)))
        }),
        progress: Box::new(move || delivered.load(Ordering::Relaxed)),
        batches: Some(Box::new(move || {
            let s = status(&d3)?;
            Ok(LoopCounts { batches: g(&s, "/batches"), ring_wakes: g(&s, "/ring_wakes") })
        })),
        _hold: vec![Box::new(d), Box::new(Sinks { stop, threads })],
    })
}

pub(super) const NGINX: &str = "/usr/sbin/nginx";
const NGINX_STREAM: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// Installs Debian's nginx-light + libnginx-mod-stream when nginx or its stream
/// module is missing (without starting the packaged service: RUNLEVEL=1).
pub(super) fn ensure_nginx(install: bool) -> Result<()> {
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

fn start_nginx(cores: Cores, dir: &Path) -> Result<Running> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut ups = Vec::new();
    let mut threads = Vec::new();
    for _ in WORKER_IDS {
        let s = UdpSocket::bind(LOOPBACK_ANY)?;
        ups.push(s.local_addr()?);
        threads.push(drain(OwnedFd::from(s), cores.load, stop.clone(), count.clone()));
    }
    let sinks = Sinks { stop, threads };
    let port = UdpSocket::bind(LOOPBACK_ANY)?.local_addr()?.port();
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(cores.shard + 1);
    let mask: String = (0..ncpu).rev().map(|c| if c == cores.shard { '1' } else { '0' }).collect();
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
    let deadline = Instant::now() + NGINX_WORKER_TIMEOUT;
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
        std::thread::sleep(POLL);
    };
    std::thread::sleep(NGINX_SETTLE);
    let (c, delivered) = (count.clone(), count.clone());
    Ok(Running {
        pid,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        ks: fixed_keys(),
        ids: WORKER_IDS.to_vec(),
        counts: Box::new(move || {
            let n = c.load(Ordering::Relaxed);
            Ok((n, n))
        }),
        progress: Box::new(move || delivered.load(Ordering::Relaxed)),
        batches: None,
        _hold: vec![Box::new(ChildGuard(child)), Box::new(sinks)],
    })
}

/// Starts contender `kind` (one of `cli::CONTENDERS`) for a run with trains of `train`;
/// `dir` is the run's scratch directory.
pub(super) fn start(kind: &str, o: &Opts, bins: &Path, dir: &Path, train: usize) -> Result<Running> {
    let cores = Cores { shard: o.shard_core, load: o.load_core };
    match kind {
        "floor" | "baseline" => start_server(kind, cores, dir, train),
        "demux-uring" => start_demux_run(kind, &["--io", "uring", "--forward", "seqpacket"], cores, bins),
        "demux-mmsg" => start_demux_run(kind, &["--io", "mmsg", "--forward", "seqpacket"], cores, bins),
        "nginx" => start_nginx(cores, dir),
        _ => bail!("unknown contender {kind}"),
    }
}
