//! Test harness: a real `demux` data plane on 127.0.0.1 (random port) and real
//! `worker` processes behind it, plus a quinn + h3 HTTP/3 client.
#![allow(dead_code, unused_imports)]

use proto::keyfile::KeyFile;
use proto::wire::Admin;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
pub use testkit::h3client::{cert, client_endpoint, client_endpoint_on, Cert, ReqError, Resp, H3};
pub use testkit::{have_tool, temp_dir};

pub const WORKER: &str = env!("CARGO_BIN_EXE_worker");

/// The demux binary of this workspace (built once per test run).
pub fn demux_bin() -> PathBuf {
    testkit::bin::workspace_bin("demux", "demux")
}

/// The data plane's `--forward`: nothing for rings (its default), else seqpacket.
fn forward_args(rings: bool) -> &'static [&'static str] {
    if rings {
        &[]
    } else {
        &["--forward", "seqpacket"]
    }
}

fn wait_file(path: &Path, child: &mut Child, log: &Path, what: &str) -> String {
    testkit::bin::wait_ready_file(path, child, log, what, Duration::from_secs(30))
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
    /// Forwarding over rings (the default on both sides); `false`: the data plane runs
    /// `--forward seqpacket` and workers `--rings off`.
    pub rings: bool,
}

impl Demux {
    pub fn start(tag: &str) -> Demux {
        Demux::start_on(tag, &["127.0.0.1:0"])
    }

    /// [`Demux::start`] with rings (the default) or, without `rings`, `--forward
    /// seqpacket` (workers then get every frame on the data connection).
    pub fn start_forward(tag: &str, rings: bool) -> Demux {
        Demux::start_opts(tag, &["127.0.0.1:0"], rings, &[])
    }

    /// [`Demux::start`] with `extra` data-plane flags.
    pub fn start_with(tag: &str, extra: &[&str]) -> Demux {
        Demux::start_opts(tag, &["127.0.0.1:0"], true, extra)
    }

    /// A data plane listening on each of `listen` (port 0: a free port), forwarding
    /// over rings (the default).
    pub fn start_on(tag: &str, listen: &[&str]) -> Demux {
        Demux::start_opts(tag, listen, true, &[])
    }

    /// `--forward` as this data plane was started with.
    fn forward_args(&self) -> &'static [&'static str] {
        forward_args(self.rings)
    }

    fn start_opts(tag: &str, listen: &[&str], rings: bool, extra: &[&str]) -> Demux {
        let dir = temp_dir(tag);
        let flags: Vec<&str> = forward_args(rings).iter().chain(extra).copied().collect();
        let dp = testkit::bin::start_dataplane(&demux_bin(), &dir, listen, &flags, Duration::from_secs(30));
        let keys = KeyFile::parse(&std::fs::read_to_string(&dp.keys).expect("key file")).expect("parse key file");
        let addrs = testkit::bin::ready_udp_addrs(&dp.ready_text);
        let addr = *addrs.first().expect("udp line in ready file");
        let (child, data, control, keys_path) = (dp.child, dp.data, dp.control, dp.keys);
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
        let mut cmd = Command::new(demux_bin());
        // As the controller restarts a data plane: holding orphans while workers rejoin.
        cmd.args(["dataplane", "--listen", &self.addr.to_string(), "--cores", "0", "--io", "mmsg"]);
        cmd.args(["--rejoin-grace-ms", "3000"]);
        self.child = testkit::bin::dataplane_files(
            &mut cmd,
            &self.keys_path,
            &self.data,
            &self.control,
            &self.dir.join("ready"),
        )
        .args(self.forward_args())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("respawn demux");
        wait_file(&self.dir.join("ready"), &mut self.child, &log, "restarted demux");
    }

    /// The data plane's status JSON.
    pub fn status(&self) -> serde_json::Value {
        match sys::control::request(&self.control, &[&Admin::StatusRequest]).expect("Status reply").msg {
            Admin::Status { json } => serde_json::from_str(&json).expect("status JSON"),
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

    /// The data plane's count for routing reason `r` (a name of `proto::Reason`; one
    /// the status does not list fails the test rather than reading as 0).
    pub fn reason(&self, r: &str) -> u64 {
        let s = self.status();
        s.pointer(&format!("/reasons/{r}")).and_then(|v| v.as_u64()).unwrap_or_else(|| panic!("no reason {r}: {s}"))
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
        testkit::bin::kill_and_reap(&mut self.child);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
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
            .args(if d.rings { &[][..] } else { &["--rings", "off"] })
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
        testkit::bin::kill_and_reap(&mut self.child);
    }
}

/// Whether `cmd args` runs at all (the tool is installed).
pub fn tool_exists(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// (length, whether byte i == i mod 256 throughout), reading 64 KiB at a time.
pub fn check_pattern(file: &Path) -> (u64, bool) {
    use std::io::Read;
    let pattern: Vec<u8> = (0..65536usize).map(|i| i as u8).collect();
    let Ok(mut f) = std::fs::File::open(file) else { return (0, false) };
    let mut buf = vec![0u8; 65536];
    let (mut len, mut ok) = (0u64, true);
    loop {
        // Fill whole chunks so every chunk starts at a multiple of 65536.
        let mut got = 0;
        while got < buf.len() {
            match f.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(_) => return (len, false),
            }
        }
        if got == 0 {
            return (len, ok);
        }
        ok &= buf[..got] == pattern[..got];
        len += got as u64;
    }
}

/// Runs `cmd` (the caller pipes its stderr) for at most `t`: whether it exited
/// successfully, and the last 3,000 characters of its stderr (or why it did not end).
pub fn run_with_timeout(mut cmd: Command, t: Duration) -> (bool, String) {
    let mut child = cmd.spawn().expect("spawn client");
    let deadline = Instant::now() + t;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (st.success(), err.chars().rev().take(3000).collect::<String>().chars().rev().collect());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (false, format!("timed out after {t:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
