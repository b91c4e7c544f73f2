//! Harness for tests/controller.rs: a real controller (`demux --state-dir …`) with
//! its data plane and workers, external workers, and HTTP/3 load from quinn + h3
//! clients. Loopback only; every wait is bounded.
#![allow(dead_code, unused_imports)]

use bytes::Buf;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const DEMUX: &str = env!("CARGO_BIN_EXE_demux");

pub use testkit::h3client::{cert, client_endpoint, runtime, Cert, ReqError, Resp, H3};
pub use testkit::{temp_dir, wait_until};

/// The worker binary of this workspace (built once per test run).
pub fn worker_bin() -> PathBuf {
    testkit::bin::workspace_bin("worker", "worker")
}

/// One test at a time: each starts a controller, a data plane and several workers,
/// which is all two cores can carry.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn kill(pid: i64, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill(2) on a pid this test started (directly or via the controller).
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}

pub fn alive(pid: i64) -> bool {
    // SAFETY: signal 0 only checks existence.
    pid > 0 && unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 && !zombie(pid)
}

fn zombie(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

/// A controller process (`demux --listen 127.0.0.1:0 --cores 0-1 --state-dir DIR`).
pub struct Controller {
    pub child: Child,
    pub dir: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub cert: Cert,
    pub spawn: usize,
    pub extra: Vec<String>,
    pub externals: Vec<Child>,
    /// `--listen` (default `127.0.0.1:0`: a free port).
    pub listen: String,
    /// Run inside this network namespace (`ip netns exec NS demux …`).
    pub netns: Option<String>,
    /// The executable started as the controller (default: this build's `demux`).
    pub bin: PathBuf,
    starts: usize,
}

/// `n` HTTP/3 connections on one new endpoint, each after one `GET /bytes/1000`:
/// (the server id that answered, the connection).
pub fn connections(rt: &tokio::runtime::Runtime, c: &Controller, n: usize) -> (quinn::Endpoint, Vec<(u16, H3)>) {
    let addr = c.addr();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let conns = (0..n)
        .map(|_| {
            let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
            let id = rt.block_on(h.get("/bytes/1000")).expect("GET").server_id;
            (id, h)
        })
        .collect();
    (ep, conns)
}

impl Controller {
    pub fn start(tag: &str, spawn: usize, extra: &[&str]) -> Controller {
        Controller::start_on(tag, spawn, "127.0.0.1:0", extra)
    }

    /// `start` on a given `--listen` address.
    pub fn start_on(tag: &str, spawn: usize, listen: &str, extra: &[&str]) -> Controller {
        Controller::launched(tag, spawn, listen, extra, None, None, Path::new(DEMUX))
    }

    /// `start` with `bin` as the controller's executable (a wrapper of `demux`).
    pub fn start_as(tag: &str, spawn: usize, bin: &Path, extra: &[&str]) -> Controller {
        Controller::launched(tag, spawn, "127.0.0.1:0", extra, None, None, bin)
    }

    /// A controller inside network namespace `netns`, listening on `listen`, whose
    /// state directory starts with a copy of the key file `keys` and whose workers
    /// serve `cert` (a cluster's hosts share both, docs/adr/0005).
    pub fn start_in_netns(
        tag: &str,
        spawn: usize,
        netns: &str,
        listen: &str,
        shared: Option<(&Path, &Cert)>,
        extra: &[&str],
    ) -> Controller {
        Controller::launched(tag, spawn, listen, extra, Some(netns), shared, Path::new(DEMUX))
    }

    fn launched(
        tag: &str,
        spawn: usize,
        listen: &str,
        extra: &[&str],
        netns: Option<&str>,
        shared: Option<(&Path, &Cert)>,
        bin: &Path,
    ) -> Controller {
        let dir = temp_dir(tag);
        let state = dir.join("state");
        if let Some((k, _)) = shared {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new().mode(0o700).create(&state).expect("state dir");
            std::fs::copy(k, state.join("keys")).expect("copy the key file");
            std::fs::set_permissions(state.join("keys"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        let cert = match shared {
            Some((_, c)) => Cert { cert: c.cert.clone(), key: c.key.clone(), der: c.der.clone() },
            None => cert(&dir),
        };
        let mut c = Controller {
            child: Command::new("true").spawn().expect("placeholder"),
            log: dir.join("controller-0.log"),
            dir,
            state,
            cert,
            spawn,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            externals: Vec::new(),
            listen: listen.to_string(),
            netns: netns.map(str::to_string),
            bin: bin.to_path_buf(),
            starts: 0,
        };
        let _ = c.child.wait();
        c.launch();
        c
    }

    /// (Re)starts the controller process with the same arguments and state dir.
    pub fn launch(&mut self) {
        self.log = self.dir.join(format!("controller-{}.log", self.starts));
        self.starts += 1;
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.args(["--listen", &self.listen, "--cores", "0-1", "--drain-timeout", "10"]);
        cmd.arg("--state-dir").arg(&self.state);
        cmd.arg("--spawn-workers").arg(self.spawn.to_string());
        cmd.arg("--worker-bin").arg(worker_bin());
        for a in self.worker_args() {
            cmd.arg(format!("--worker-arg={a}"));
        }
        cmd.args(&self.extra);
        self.child = cmd
            .env("DEMUX_LOG", "info")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&self.log).expect("log"))
            .spawn()
            .expect("spawn controller");
        let st = wait_until("the controller's data plane and workers", Duration::from_secs(60), || {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("controller exited early ({st}): {}", self.logs());
            }
            let s = self.status()?;
            let ready = s["workers"].as_array()?.iter().filter(|w| w["state"] == "ready").count();
            (s["dataplane"]["state"] == "running" && ready >= self.spawn).then_some(s)
        });
        let _ = st;
    }

    fn worker_args(&self) -> Vec<String> {
        vec![
            "--cert".into(),
            self.cert.cert.display().to_string(),
            "--key".into(),
            self.cert.key.display().to_string(),
            "--drain-timeout".into(),
            "20".into(),
        ]
    }

    pub fn control_sock(&self) -> PathBuf {
        self.state.join("control.sock")
    }

    /// Runs `demux <args> --state-dir DIR --json`, parsed.
    fn json_cmd(&self, sub: &str) -> Option<Value> {
        let out = Command::new(DEMUX).arg(sub).arg("--state-dir").arg(&self.state).arg("--json").output().ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// `demux status --state-dir DIR --json`.
    pub fn status(&self) -> Option<Value> {
        self.json_cmd("status")
    }

    /// `demux lb-status --state-dir DIR --json`.
    pub fn lb(&self) -> Option<Value> {
        self.json_cmd("lb-status")
    }

    pub fn lb_wait(&self) -> Value {
        wait_until("lb-status", Duration::from_secs(20), || self.lb())
    }

    pub fn status_wait(&self) -> Value {
        wait_until("status", Duration::from_secs(20), || self.status())
    }

    pub fn addr(&self) -> SocketAddr {
        let s = self.status_wait();
        s["sockets"][0]["addr"].as_str().and_then(|a| a.parse().ok()).expect("socket address in status")
    }

    pub fn dataplane_pid(&self) -> i64 {
        self.status_wait()["dataplane"]["pid"].as_i64().unwrap_or(0)
    }

    /// (server_id, pid, state) of every registered worker.
    pub fn workers(&self) -> Vec<(u64, i64, String)> {
        self.status_wait()["workers"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|w| {
                        Some((w["server_id"].as_u64()?, w["pid"].as_i64()?, w["state"].as_str()?.to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// (server_id, placeable, datagrams) per instance, from the data plane.
    pub fn instances(&self) -> Vec<(u64, bool, u64)> {
        self.lb_wait()["instances"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|i| {
                        (
                            i["server_id"].as_u64().unwrap_or(0),
                            i["placeable"].as_bool().unwrap_or(false),
                            i["datagrams"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The data plane's count for routing reason `r` (a name of `proto::Reason`; one
    /// the status does not list fails the test rather than reading as 0).
    pub fn reason(&self, r: &str) -> u64 {
        let s = self.lb_wait();
        s["reasons"][r].as_u64().unwrap_or_else(|| panic!("no reason {r}: {s}"))
    }

    /// Starts a worker outside the controller's supervision (scale-out by hand);
    /// returns its index in `externals`.
    pub fn start_external(&mut self) -> usize {
        self.start_external_with(&[])
    }

    /// [`Controller::start_external`] with `extra` worker arguments; its log is
    /// [`Controller::external_log`].
    pub fn start_external_with(&mut self, extra: &[&str]) -> usize {
        let log = self.external_log(self.externals.len());
        let child = Command::new(worker_bin())
            .arg("--server-id-from-controller")
            .arg("--control")
            .arg(self.control_sock())
            .args(self.worker_args())
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn worker");
        self.externals.push(child);
        self.externals.len() - 1
    }

    /// The log file of external worker `i`.
    pub fn external_log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("external-{i}.log"))
    }

    pub fn logs(&self) -> String {
        let mut s = String::new();
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            let mut names: Vec<PathBuf> =
                rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "log")).collect();
            names.sort();
            for p in names {
                let t = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(60).collect();
                s += &format!("\n--- {} (last lines)\n", p.display());
                for l in tail.into_iter().rev() {
                    s += l;
                    s += "\n";
                }
            }
        }
        s
    }

    /// SIGTERM and wait (bounded) for a clean exit; true when it exited 0.
    pub fn stop(&mut self, within: Duration) -> bool {
        kill(self.child.id() as i64, libc::SIGTERM);
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.success();
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill_everything(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let read_pids = |p: PathBuf| -> Vec<i64> {
            std::fs::read_to_string(p).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
        };
        for pid in read_pids(self.state.join("workers")).into_iter().chain(read_pids(self.state.join("dataplane.pid")))
        {
            if std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    c.windows(self.state.as_os_str().len()).any(|w| w == self.state.as_os_str().as_encoded_bytes())
                })
                .unwrap_or(false)
            {
                kill(pid, libc::SIGKILL);
            }
        }
        for e in &mut self.externals {
            let _ = e.kill();
            let _ = e.wait();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("controller test logs in {}:{}", self.dir.display(), self.logs());
        }
        self.kill_everything();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------
// HTTP/3 client and load
// ---------------------------------------------------------------------------------

/// Outcome counters of a [`Load`].
#[derive(Default)]
pub struct LoadStats {
    pub ok: AtomicU64,
    /// Requests refused before their head (GOAWAY, connection closing): retried.
    pub retried: AtomicU64,
    /// Requests lost: failed after their head, or never served within the retries.
    pub failed: AtomicU64,
    pub failures: Mutex<Vec<String>>,
    pub connections: AtomicU64,
    pub by_server: Mutex<std::collections::BTreeMap<u16, u64>>,
}

/// `clients` tasks, each on its own connection (a new one when the old one goes
/// away), GETting `path` until stopped. Every request is checked: status 200, full
/// length, byte pattern.
pub struct Load {
    pub stats: Arc<LoadStats>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(rt: &tokio::runtime::Runtime, addr: SocketAddr, cert: &Cert, clients: usize, path: &str) -> Load {
        let stats = Arc::new(LoadStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let want: u64 = path.strip_prefix("/bytes/").and_then(|n| n.parse().ok()).unwrap_or(0);
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (stats, stop, path) = (stats.clone(), stop.clone(), path.to_string());
            let ep = {
                let _g = rt.enter();
                client_endpoint(cert)
            };
            tasks.push(rt.spawn(async move {
                let mut conn: Option<H3> = None;
                while !stop.load(Ordering::Relaxed) {
                    let mut served = false;
                    for attempt in 0..4 {
                        if conn.is_none() || conn.as_ref().is_some_and(|c| c.conn.close_reason().is_some()) {
                            match H3::connect(&ep, addr).await {
                                Ok(c) => {
                                    stats.connections.fetch_add(1, Ordering::Relaxed);
                                    conn = Some(c);
                                }
                                Err(e) => {
                                    stats.retried.fetch_add(1, Ordering::Relaxed);
                                    if attempt == 3 {
                                        stats.failures.lock().unwrap().push(format!("connect: {e}"));
                                    }
                                    tokio::time::sleep(Duration::from_millis(200)).await;
                                    continue;
                                }
                            }
                        }
                        let Some(c) = conn.as_mut() else { continue };
                        match tokio::time::timeout(Duration::from_secs(60), c.get(&path)).await {
                            Ok(Ok(r)) if r.status == 200 && r.len == want && r.pattern_ok => {
                                stats.ok.fetch_add(1, Ordering::Relaxed);
                                *stats.by_server.lock().unwrap().entry(r.server_id).or_default() += 1;
                                served = true;
                                break;
                            }
                            Ok(Ok(r)) => {
                                stats.failures.lock().unwrap().push(format!("bad response {r:?}"));
                                break;
                            }
                            Ok(Err(ReqError::BeforeHead(_))) => {
                                // Not accepted (GOAWAY / closing): a new connection.
                                stats.retried.fetch_add(1, Ordering::Relaxed);
                                if let Some(c) = conn.take() {
                                    c.close();
                                }
                            }
                            Ok(Err(ReqError::AfterHead(e))) => {
                                stats.failures.lock().unwrap().push(format!("after head: {e}"));
                                conn = None;
                                break;
                            }
                            Err(_) => {
                                stats.failures.lock().unwrap().push("request timed out (60 s)".into());
                                conn = None;
                                break;
                            }
                        }
                    }
                    if !served {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if let Some(c) = conn {
                    c.close();
                }
            }));
        }
        Load { stats, stop, tasks }
    }

    pub fn ok(&self) -> u64 {
        self.stats.ok.load(Ordering::Relaxed)
    }

    /// Waits until `n` more requests completed (bounded).
    pub fn wait_progress(&self, n: u64, within: Duration) {
        let start = self.ok();
        wait_until(&format!("{n} more completed requests"), within, || (self.ok() >= start + n).then_some(()));
    }

    /// Stops the clients (in-flight requests finish) and returns (ok, failed, failures).
    pub fn finish(self, rt: &tokio::runtime::Runtime) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(90), t).await });
        }
        let f = self.stats.failures.lock().unwrap().clone();
        (self.stats.ok.load(Ordering::Relaxed), self.stats.failed.load(Ordering::Relaxed), f)
    }
}

// ---------------------------------------------------------------------------------
// Raw SOCK_SEQPACKET (bad-input tests)
// ---------------------------------------------------------------------------------

pub fn seqpacket_connect(path: &Path) -> std::os::fd::OwnedFd {
    let fd = sys::seqpacket::connect(path).unwrap_or_else(|e| panic!("{e}"));
    rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, Some(Duration::from_secs(10)))
        .expect("SO_RCVTIMEO");
    fd
}

pub fn send_raw(fd: &std::os::fd::OwnedFd, rec: &[u8]) {
    let n = sys::seqpacket::send_record(fd.as_fd(), rec, &[], 0).expect("send");
    assert_eq!(n, rec.len(), "send");
}

/// One record; empty when the peer closed (or on timeout).
pub fn recv_raw(fd: &std::os::fd::OwnedFd) -> Vec<u8> {
    let mut b = vec![0u8; 70_000];
    let n = sys::seqpacket::recv_record(fd.as_fd(), &mut b, 0).map(|r| r.len).unwrap_or(0);
    b.truncate(n);
    b
}

/// The inode of the socket `pid` holds as `fd` (`/proc/PID/fd/FD` → `socket:[INO]`).
pub fn socket_inode(pid: i64, fd: i64) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The inodes of every socket `pid` holds open.
pub fn socket_inodes(pid: i64) -> std::collections::BTreeSet<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc/PID/fd");
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok())
        .filter_map(|fd| socket_inode(pid, fd))
        .collect()
}

/// Downloads on fresh connections, each checked; (ok, failures). (Many new
/// connections a second from one address: the controllers run `--limits off`.)
pub struct Downloads {
    pub ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Downloads {
    pub fn start(rt: &tokio::runtime::Runtime, c: &Controller, clients: usize, bytes: u64) -> Downloads {
        let addr = c.addr();
        let (ok, failures, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let ep = {
                let _g = rt.enter();
                client_endpoint(&c.cert)
            };
            let (ok, failures, stop) = (ok.clone(), failures.clone(), stop.clone());
            tasks.push(rt.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = tokio::time::timeout(Duration::from_secs(30), async {
                        let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e}"))?;
                        let r = h.get(&format!("/bytes/{bytes}")).await.map_err(|e| format!("GET: {e:?}"))?;
                        h.close();
                        if r.status == 200 && r.len == bytes && r.pattern_ok {
                            Ok(())
                        } else {
                            Err(format!("bad response {r:?}"))
                        }
                    })
                    .await;
                    match r {
                        Ok(Ok(())) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Err(e)) => failures.lock().unwrap().push(e),
                        Err(_) => failures.lock().unwrap().push("download timed out (30 s)".into()),
                    }
                }
            }));
        }
        Downloads { ok, failures, stop, tasks }
    }

    pub fn finish(self, rt: &tokio::runtime::Runtime) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), t).await });
        }
        let f = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), f)
    }
}
