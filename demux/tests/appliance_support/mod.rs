//! A real `demux dataplane` (mmsg backend, one core, `--keys` of its own) with real
//! `worker` processes behind it, for the end-to-end admission and flood tests
//! (tests/admission.rs, tests/flood.rs): start, status through `lb-status`, and the
//! quinn HTTP/3 download those tests count. Loopback only; every wait is bounded.
#![allow(dead_code)] // each test file uses its own subset

use rustls::pki_types::CertificateDer;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::bin::{ready_udp_addrs, start_dataplane, wait_ready_file, workspace_bin as build_bin};
use testkit::h3client::H3;
use testkit::temp_dir;

pub const DEMUX: &str = env!("CARGO_BIN_EXE_demux");

/// The test kit's tokio runtime (two worker threads, I/O and time).
pub fn rt() -> tokio::runtime::Runtime {
    testkit::h3client::runtime()
}

pub fn wait_file(path: &Path, child: &mut Child, log: &Path, what: &str) -> String {
    wait_ready_file(path, child, log, what, Duration::from_secs(60))
}

/// Children killed on drop (also when a test fails).
pub struct Kids(pub Vec<Child>);
impl Drop for Kids {
    fn drop(&mut self) {
        self.0.iter_mut().for_each(testkit::bin::kill_and_reap);
    }
}

pub struct Setup {
    pub dir: PathBuf,
    pub addr: SocketAddr,
    pub control: PathBuf,
    pub cert: CertificateDer<'static>,
    _kids: Kids,
}

/// A data plane on 127.0.0.1 (`extra` flags) and `workers` workers behind it.
pub fn start(tag: &str, extra: &[&str], workers: u16, worker_extra: &[&str]) -> Setup {
    start_on(tag, "127.0.0.1:0", extra, workers, worker_extra)
}

/// As [`start`], listening on `listen`; a wildcard address is reached on 127.0.0.1.
pub fn start_on(tag: &str, listen: &str, extra: &[&str], workers: u16, worker_extra: &[&str]) -> Setup {
    let dir = temp_dir(tag);
    let dp = start_dataplane(Path::new(DEMUX), &dir, &[listen], extra, Duration::from_secs(60));
    let mut addr: SocketAddr = *ready_udp_addrs(&dp.ready_text).first().expect("udp line");
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
    }
    let (keys, data, control) = (dp.keys, dp.data, dp.control);
    let mut kids = Kids(vec![dp.child]);
    let cert = testkit::h3client::cert(&dir);
    let (cert_path, key_path) = (&cert.cert, &cert.key);
    let worker = build_bin("worker", "worker");
    for id in 1..=workers {
        let (ready, log) = (dir.join(format!("w{id}.ready")), dir.join(format!("w{id}.log")));
        let mut w = Command::new(&worker)
            .args(["--server-id", &id.to_string(), "--keys"])
            .arg(&keys)
            .arg("--data-socket")
            .arg(&data)
            .arg("--cert")
            .arg(cert_path)
            .arg("--key")
            .arg(key_path)
            .arg("--ready-file")
            .arg(&ready)
            .args(worker_extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn worker");
        wait_file(&ready, &mut w, &log, "worker");
        kids.0.push(w);
    }
    let s = Setup { dir, addr, control, cert: cert.der.clone(), _kids: kids };
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.status()["instances"].as_array().map_or(0, |a| a.iter().filter(|i| i["placeable"] == true).count())
        < workers as usize
    {
        assert!(Instant::now() < deadline, "workers did not register: {}", s.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

impl Setup {
    pub fn lb_status(&self, json: bool) -> String {
        let mut cmd = Command::new(DEMUX);
        cmd.args(["lb-status", "--control-socket"]).arg(&self.control);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("lb-status");
        assert!(out.status.success(), "lb-status: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    pub fn status(&self) -> Value {
        serde_json::from_str(&self.lb_status(true)).expect("status JSON")
    }
}

pub fn u(v: &Value, p: &str) -> u64 {
    v.pointer(p).and_then(Value::as_u64).unwrap_or(0)
}

/// A quinn client endpoint on `bind` trusting `cert`.
pub fn client(cert: &CertificateDer<'static>, bind: SocketAddr) -> quinn::Endpoint {
    testkit::h3client::endpoint(cert, bind)
}

/// One HTTP/3 connection: handshake, GET /bytes/N, content checked. Errors as text.
pub async fn download(ep: &quinn::Endpoint, addr: SocketAddr, n: u64) -> Result<(), String> {
    let mut h = H3::connect(ep, addr).await.map_err(|e| format!("handshake: {e}"))?;
    let r = h.get(&format!("/bytes/{n}")).await.map_err(|e| e.to_string());
    h.close();
    match r? {
        r if r.status != 200 => Err(format!("status {}", r.status)),
        r if !r.pattern_ok => Err("body pattern".into()),
        r if r.len != n => Err(format!("body {} of {n} bytes", r.len)),
        _ => Ok(()),
    }
}
