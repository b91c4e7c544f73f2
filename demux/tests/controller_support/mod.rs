//! Harness for tests/controller.rs: a real controller (`demux --state-dir …`) with
//! its data plane and workers, external workers, and HTTP/3 load from quinn + h3
//! clients. Loopback only; every wait is bounded.
#![allow(dead_code)]

use bytes::Buf;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const DEMUX: &str = env!("CARGO_BIN_EXE_demux");

/// The worker binary of this workspace (built once per test run).
pub fn worker_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| manifest.join("../target"));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "worker", "--bin", "worker"])
            .current_dir(manifest.join(".."))
            .status()
            .expect("running cargo build -p worker");
        assert!(st.success(), "cargo build -p worker failed");
        let bin = target.join("debug/worker");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
    .clone()
}

/// One test at a time: each starts a controller, a data plane and several workers,
/// which is all two cores can carry.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("qc-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub fn wait_until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// Test TLS identity shared by all workers of a test.
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: CertificateDer<'static>,
}

pub fn cert(dir: &Path) -> Cert {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("rcgen");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.key_pair.serialize_pem()).expect("write key");
    Cert { cert, key, der: ck.cert.der().clone() }
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
    starts: usize,
}

impl Controller {
    pub fn start(tag: &str, spawn: usize, extra: &[&str]) -> Controller {
        Controller::start_on(tag, spawn, "127.0.0.1:0", extra)
    }

    /// `start` on a given `--listen` address.
    pub fn start_on(tag: &str, spawn: usize, listen: &str, extra: &[&str]) -> Controller {
        let dir = temp_dir(tag);
        let state = dir.join("state");
        let cert = cert(&dir);
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
        let mut cmd = Command::new(DEMUX);
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

    pub fn reason(&self, r: &str) -> u64 {
        self.lb_wait()["reasons"][r].as_u64().unwrap_or(0)
    }

    /// Starts a worker outside the controller's supervision (scale-out by hand);
    /// returns its index in `externals`.
    pub fn start_external(&mut self) -> usize {
        let log = self.dir.join(format!("external-{}.log", self.externals.len()));
        let child = Command::new(worker_bin())
            .arg("--server-id-from-controller")
            .arg("--control")
            .arg(self.control_sock())
            .args(self.worker_args())
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

    fn kill_everything(&mut self) {
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

pub fn client_endpoint(c: &Cert) -> quinn::Endpoint {
    let crypto = worker::tls::client_crypto(std::slice::from_ref(&c.der), &[b"h3"]).expect("client crypto");
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    cfg.transport_config(Arc::new(t));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client endpoint");
    ep.set_default_client_config(cfg);
    ep
}

pub struct H3 {
    pub conn: quinn::Connection,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub len: u64,
    pub server_id: u16,
    pub pattern_ok: bool,
}

/// Where a request failed: before the response head (not accepted: safe to retry)
/// or after it (an accepted request lost).
#[derive(Debug)]
pub enum ReqError {
    BeforeHead(String),
    AfterHead(String),
}

impl H3 {
    pub async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> anyhow::Result<H3> {
        let conn = tokio::time::timeout(Duration::from_secs(15), ep.connect(addr, "localhost")?).await??;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(H3 { conn, send, driver })
    }

    /// GET `path`, reading at most `rate` bytes per second when given (a slow reader
    /// keeps the download in flight for a while; flow control slows the server).
    pub async fn get_paced(&mut self, path: &str, rate: Option<u64>) -> Result<Resp, ReqError> {
        let started = tokio::time::Instant::now();
        let req = http::Request::get(format!("https://localhost{path}"))
            .body(())
            .map_err(|e| ReqError::BeforeHead(e.to_string()))?;
        let mut s = self.send.send_request(req).await.map_err(|e| ReqError::BeforeHead(e.to_string()))?;
        s.finish().await.map_err(|e| ReqError::BeforeHead(e.to_string()))?;
        let resp = s.recv_response().await.map_err(|e| ReqError::BeforeHead(e.to_string()))?;
        let server_id =
            resp.headers().get("x-server-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
        let want: Option<u64> =
            resp.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let mut len = 0u64;
        let mut pattern_ok = true;
        while let Some(mut chunk) = s.recv_data().await.map_err(|e| ReqError::AfterHead(e.to_string()))? {
            while chunk.has_remaining() {
                let b = chunk.chunk();
                if pattern_ok && path.starts_with("/bytes/") {
                    pattern_ok = b.iter().enumerate().all(|(i, x)| *x == ((len + i as u64) % 256) as u8);
                }
                len += b.len() as u64;
                let n = b.len();
                chunk.advance(n);
            }
            if let Some(rate) = rate {
                let due = started + Duration::from_secs_f64(len as f64 / rate as f64);
                tokio::time::sleep_until(due).await;
            }
        }
        if let Some(w) = want {
            if w != len {
                return Err(ReqError::AfterHead(format!("body {len} bytes, content-length {w}")));
            }
        }
        Ok(Resp { status: resp.status().as_u16(), len, server_id, pattern_ok })
    }

    pub async fn get(&mut self, path: &str) -> Result<Resp, ReqError> {
        self.get_paced(path, None).await
    }

    pub fn close(self) {
        self.conn.close(quinn::VarInt::from_u32(0x100), b"");
        self.driver.abort();
    }
}

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

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

// ---------------------------------------------------------------------------------
// Raw SOCK_SEQPACKET (bad-input tests)
// ---------------------------------------------------------------------------------

pub fn seqpacket_connect(path: &Path) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscall; the fd is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket");
    // SAFETY: a fresh fd we own.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero sockaddr_un is valid.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_encoded_bytes();
    for (d, s) in sun.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + b.len() + 1) as libc::socklen_t;
    // SAFETY: sun/len describe a valid sockaddr_un.
    let r = unsafe { libc::connect(fd, (&sun as *const libc::sockaddr_un).cast(), len) };
    assert_eq!(r, 0, "connect {}: {}", path.display(), std::io::Error::last_os_error());
    let tv = libc::timeval { tv_sec: 10, tv_usec: 0 };
    // SAFETY: a live timeval of the right size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    owned
}

pub fn send_raw(fd: &std::os::fd::OwnedFd, rec: &[u8]) {
    use std::os::fd::AsRawFd;
    // SAFETY: sends from a live buffer.
    let n = unsafe { libc::send(fd.as_raw_fd(), rec.as_ptr().cast(), rec.len(), libc::MSG_NOSIGNAL) };
    assert_eq!(n, rec.len() as isize, "send");
}

/// One record; empty when the peer closed (or on timeout).
pub fn recv_raw(fd: &std::os::fd::OwnedFd) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let mut b = vec![0u8; 70_000];
    // SAFETY: receives into a live buffer.
    let n = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
    b.truncate(n.max(0) as usize);
    b
}
