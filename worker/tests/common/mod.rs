//! Test harness: a real `demux` data plane on 127.0.0.1 (random port) and real
//! `worker` processes behind it, plus a quinn + h3 HTTP/3 client.
#![allow(dead_code)]

use bytes::Buf;
use proto::keyfile::KeyFile;
use proto::wire::{decode_control, encode_control, Control};
use rustls::pki_types::CertificateDer;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use worker::fdpass;

pub const WORKER: &str = env!("CARGO_BIN_EXE_worker");

/// The demux binary of this workspace (built once if missing).
pub fn demux_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| manifest.join("../target"));
        let bin = target.join("debug/demux");
        // Always (re)build: cheap when fresh, and never tests a stale data plane.
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "demux"])
            .current_dir(manifest.join(".."))
            .status()
            .expect("running cargo build -p demux");
        assert!(st.success(), "cargo build -p demux failed");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
    .clone()
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Short: unix socket paths are limited to 107 bytes.
    let d = std::env::temp_dir().join(format!("wk-{}-{}-{n}", tag, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn wait_file(path: &Path, child: &mut Child, log: &Path, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            return t;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited early ({st}): {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(
            Instant::now() < deadline,
            "{what} not ready in time: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running data plane.
pub struct Demux {
    child: Child,
    pub dir: PathBuf,
    pub addr: SocketAddr,
    /// Every listen address, in --listen order.
    pub addrs: Vec<SocketAddr>,
    pub data: PathBuf,
    pub control: PathBuf,
    pub keys_path: PathBuf,
    pub keys: KeyFile,
    /// `--forward ring`: workers are started with `QUICDEMUX_RINGS=1`.
    pub rings: bool,
}

impl Demux {
    pub fn start(tag: &str) -> Demux {
        Demux::start_on(tag, &["127.0.0.1:0"])
    }

    /// [`Demux::start`] with `--forward ring` when `rings` (workers then read rings).
    pub fn start_forward(tag: &str, rings: bool) -> Demux {
        Demux::start_opts(tag, &["127.0.0.1:0"], rings)
    }

    /// A data plane listening on each of `listen` (port 0: a free port).
    pub fn start_on(tag: &str, listen: &[&str]) -> Demux {
        Demux::start_opts(tag, listen, false)
    }

    fn start_opts(tag: &str, listen: &[&str], rings: bool) -> Demux {
        let bin = demux_bin();
        let dir = temp_dir(tag);
        let keys_path = dir.join("keys");
        let st = Command::new(&bin).args(["gen-keys", "--out"]).arg(&keys_path).status().expect("gen-keys");
        assert!(st.success(), "demux gen-keys failed");
        let keys = KeyFile::parse(&std::fs::read_to_string(&keys_path).expect("key file")).expect("parse key file");
        let (data, control, ready, log) =
            (dir.join("d.sock"), dir.join("c.sock"), dir.join("ready"), dir.join("demux.log"));
        let mut child = Command::new(&bin)
            .arg("dataplane")
            .args(listen.iter().flat_map(|l| ["--listen", l]))
            .args(["--cores", "0", "--io", "mmsg", "--keys"])
            .arg(&keys_path)
            .arg("--data-socket")
            .arg(&data)
            .arg("--control-socket")
            .arg(&control)
            .arg("--ready-file")
            .arg(&ready)
            .args(if rings { &["--forward", "ring"][..] } else { &[] })
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn demux");
        let text = wait_file(&ready, &mut child, &log, "demux");
        let addrs: Vec<SocketAddr> =
            text.lines().filter_map(|l| l.strip_prefix("udp ")).filter_map(|a| a.parse().ok()).collect();
        let addr = *addrs.first().expect("udp line in ready file");
        Demux { child, dir, addr, addrs, data, control, keys_path, keys, rings }
    }

    /// SIGKILLs the data plane and starts a new one on the same address, keys and
    /// socket paths (what a supervisor does after a crash).
    pub fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for p in [&self.data, &self.control, &self.dir.join("ready")] {
            let _ = std::fs::remove_file(p);
        }
        let log = self.dir.join("demux2.log");
        self.child = Command::new(demux_bin())
            .args(["dataplane", "--listen", &self.addr.to_string(), "--cores", "0", "--io", "mmsg", "--keys"])
            .arg(&self.keys_path)
            .arg("--data-socket")
            .arg(&self.data)
            .arg("--control-socket")
            .arg(&self.control)
            .arg("--ready-file")
            .arg(self.dir.join("ready"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("respawn demux");
        wait_file(&self.dir.join("ready"), &mut self.child, &log, "restarted demux");
    }

    /// The data plane's status JSON.
    pub fn status(&self) -> serde_json::Value {
        let fd = fdpass::seqpacket_connect(&self.control).expect("control socket");
        fdpass::send_record(fd.as_fd(), &encode_control(&Control::StatusRequest), &[], 0).expect("StatusRequest");
        let mut buf = vec![0u8; 128 * 1024];
        let r = fdpass::recv_record(fd.as_fd(), &mut buf, 0).expect("Status reply");
        match decode_control(&buf[..r.len]) {
            Ok(Control::Status { json }) => serde_json::from_str(&json).expect("status JSON"),
            other => panic!("unexpected reply {other:?}"),
        }
    }

    /// (server id, placeable, datagrams) of every live instance.
    pub fn instances(&self) -> Vec<(u16, bool, u64)> {
        let s = self.status();
        s["instances"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| {
                        (
                            i["server_id"].as_u64().unwrap_or(0) as u16,
                            i["placeable"].as_bool().unwrap_or(false),
                            i["datagrams"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn reason(&self, r: &str) -> u64 {
        self.status().pointer(&format!("/reasons/{r}")).and_then(|v| v.as_u64()).unwrap_or(0)
    }

    /// Waits until `pred(instances)` holds.
    pub fn wait_instances(&self, what: &str, pred: impl Fn(&[(u16, bool, u64)]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let i = self.instances();
            if pred(&i) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; instances {i:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("demux.log")).unwrap_or_default()
    }
}

impl Drop for Demux {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
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

/// A running worker process.
pub struct Worker {
    pub child: Child,
    pub id: u16,
    pub log: PathBuf,
}

impl Worker {
    pub fn start(d: &Demux, c: &Cert, id: u16, extra: &[&str]) -> Worker {
        Worker::spawn(d, Some(c), id, extra)
    }

    /// A worker without --cert/--key: it makes a self-signed certificate at start.
    pub fn start_self_signed(d: &Demux, id: u16, extra: &[&str]) -> Worker {
        Worker::spawn(d, None, id, extra)
    }

    fn spawn(d: &Demux, c: Option<&Cert>, id: u16, extra: &[&str]) -> Worker {
        let ready = d.dir.join(format!("w{id}.ready"));
        let log = d.dir.join(format!("w{id}.log"));
        let _ = std::fs::remove_file(&ready);
        let mut cmd = Command::new(WORKER);
        cmd.args(["--server-id", &id.to_string(), "--keys"]).arg(&d.keys_path).arg("--data-socket").arg(&d.data);
        if let Some(c) = c {
            cmd.arg("--cert").arg(&c.cert).arg("--key").arg(&c.key);
        }
        let mut child = cmd
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .env("RUST_LOG", std::env::var("WORKER_LOG").unwrap_or_else(|_| "info".into()))
            .env("QUICDEMUX_RINGS", if d.rings { "1" } else { "0" })
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn worker");
        wait_file(&ready, &mut child, &log, "worker");
        Worker { child, id, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on the pid of our own child process.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for exit (bounded); returns (success, log).
    pub fn wait_exit(&mut self, within: Duration) -> (bool, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return (st.success(), self.log_text());
            }
            assert!(Instant::now() < deadline, "worker {} did not exit in {within:?}: {}", self.id, self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A counter from the worker's exit line (`worker exit: ... key=value ...`).
    pub fn exit_stat(log: &str, key: &str) -> Option<u64> {
        let line = log.lines().find(|l| l.starts_with("worker exit:"))?;
        line.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{key}=")).and_then(|v| v.parse().ok()))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------
// quinn + h3 client
// ---------------------------------------------------------------------------------

pub fn client_endpoint(c: &Cert) -> quinn::Endpoint {
    client_endpoint_on(c, "127.0.0.1:0")
}

pub fn client_endpoint_on(c: &Cert, bind: &str) -> quinn::Endpoint {
    let crypto = worker::tls::client_crypto(std::slice::from_ref(&c.der), &[b"h3"]).expect("client crypto");
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    cfg.transport_config(Arc::new(t));
    let mut ep = quinn::Endpoint::client(bind.parse().expect("addr")).expect("client endpoint");
    ep.set_default_client_config(cfg);
    ep
}

/// One HTTP/3 connection.
pub struct H3 {
    pub conn: quinn::Connection,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

/// A completed response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub len: u64,
    pub server_id: u16,
    pub pattern_ok: bool,
}

/// Where a request failed: before the response head (safe to retry) or after.
#[derive(Debug)]
pub enum ReqError {
    BeforeHead(String),
    AfterHead(String),
}

impl std::fmt::Display for ReqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl H3 {
    pub async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> anyhow::Result<H3> {
        let conn = ep.connect(addr, "localhost")?.await?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(H3 { conn, send, driver })
    }

    /// GET `path`; `on_progress(bytes so far)` is called after every chunk.
    pub async fn get_with(&mut self, path: &str, mut on_progress: impl FnMut(u64)) -> Result<Resp, ReqError> {
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
            on_progress(len);
        }
        if let Some(w) = want {
            if w != len {
                return Err(ReqError::AfterHead(format!("body {len} bytes, content-length {w}")));
            }
        }
        Ok(Resp { status: resp.status().as_u16(), len, server_id, pattern_ok })
    }

    pub async fn get(&mut self, path: &str) -> Result<Resp, ReqError> {
        self.get_with(path, |_| {}).await
    }

    pub fn close(self) {
        self.conn.close(quinn::VarInt::from_u32(0x100), b"");
        self.driver.abort();
    }
}

/// Skips (returns false) when `tool` is missing and CI is unset; with CI set, a
/// missing tool fails the test.
pub fn have_tool(ok: bool, tool: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{tool} is required when CI is set (tools/install-deps installs it)");
    }
    eprintln!("SKIP: {tool} not installed (set CI=1 to make this a failure)");
    false
}
