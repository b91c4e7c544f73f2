//! The workspace's binaries by path, child processes and their ready files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The workspace root (this crate lives in `testkit/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A python script of the test kit, `testkit/py/NAME` (the aioquic clients).
pub fn python_script(name: &str) -> PathBuf {
    workspace_root().join("testkit/py").join(name)
}

/// Whether python3 can import aioquic, which the aioquic clients need; `false` after
/// reporting why ([`crate::have_tool`]: a failure under CI).
pub fn have_aioquic() -> bool {
    let ok = Command::new("python3").args(["-c", "import aioquic"]).output().is_ok_and(|o| o.status.success());
    crate::have_tool(ok, "aioquic (python3 -m pip install aioquic)")
}

/// The target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds `bin` of `package` (`cargo build -q -p PACKAGE --bin BIN`, debug profile:
/// cheap when fresh, and never a stale binary) once per test process; its path.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let key = format!("{package}/{bin}");
    if let Some(p) = built.get_or_insert_with(HashMap::new).get(&key) {
        return p.clone();
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "-q", "-p", package, "--bin", bin])
        .current_dir(workspace_root())
        .status()
        .expect("running cargo build");
    assert!(st.success(), "cargo build -p {package} --bin {bin} failed");
    let path = target_dir().join("debug").join(bin);
    assert!(path.exists(), "{} missing after build", path.display());
    built.get_or_insert_with(HashMap::new).insert(key, path.clone());
    path
}

/// Builds `bin` of `package` in the release profile (`cargo build --release -q -p
/// PACKAGE --bin BIN`: the one release build shape, a no-op when it is up to date);
/// its path. For the tests that load a process to its CPU limit (floods), where a
/// debug build's cost per datagram, not the design, would decide the outcome.
pub fn release_bin(package: &str, bin: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "-q", "-p", package, "--bin", bin])
        .current_dir(workspace_root())
        .status()
        .expect("running cargo build --release");
    assert!(st.success(), "cargo build --release -p {package} --bin {bin} failed");
    let path = target_dir().join("release").join(bin);
    assert!(path.exists(), "{} missing after build", path.display());
    path
}

/// Waits (at most `within`) until the file at `path` exists and returns its text;
/// panics with the child's log (`log`) when `child` exits first or time runs out.
pub fn wait_ready_file(path: &Path, child: &mut Child, log: &Path, what: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            return t;
        }
        let log_text = || std::fs::read_to_string(log).unwrap_or_default();
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited early ({st}): {}", log_text());
        }
        assert!(Instant::now() < deadline, "{what} not ready in time: {}", log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `udp ADDR` lines of a ready file, in order.
pub fn ready_udp_addrs(text: &str) -> Vec<std::net::SocketAddr> {
    text.lines().filter_map(|l| l.strip_prefix("udp ")).filter_map(|a| a.parse().ok()).collect()
}

/// Adds a data plane's socket and file arguments: `--keys K --data-socket D
/// --control-socket C --ready-file R`.
pub fn dataplane_files<'c>(
    cmd: &'c mut Command,
    keys: &Path,
    data: &Path,
    control: &Path,
    ready: &Path,
) -> &'c mut Command {
    cmd.arg("--keys").arg(keys).arg("--data-socket").arg(data).arg("--control-socket").arg(control);
    cmd.arg("--ready-file").arg(ready)
}

/// A data plane a test started, with its files in one directory.
pub struct TestDataplane {
    pub child: Child,
    pub keys: PathBuf,
    pub data: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
    /// Its ready file's text (`udp ADDR` lines: [`ready_udp_addrs`]).
    pub ready_text: String,
}

/// Writes a key file with `demux gen-keys` (the binary at `demux`) into `dir` and
/// starts `demux dataplane --cores 0 --io mmsg` on each of `listen` with it, its files
/// in `dir` (`keys`, `d.sock`, `c.sock`, `ready`, `demux.log`) and `extra` flags last;
/// returns once its ready file is written (panics with its log after `within`).
pub fn start_dataplane(demux: &Path, dir: &Path, listen: &[&str], extra: &[&str], within: Duration) -> TestDataplane {
    let keys = dir.join("keys");
    let st = Command::new(demux).args(["gen-keys", "--out"]).arg(&keys).status().expect("demux gen-keys");
    assert!(st.success(), "demux gen-keys failed");
    let (data, control, ready, log) =
        (dir.join("d.sock"), dir.join("c.sock"), dir.join("ready"), dir.join("demux.log"));
    let mut cmd = Command::new(demux);
    cmd.arg("dataplane").args(listen.iter().flat_map(|l| ["--listen", l])).args(["--cores", "0", "--io", "mmsg"]);
    let mut child = dataplane_files(&mut cmd, &keys, &data, &control, &ready)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("demux log"))
        .spawn()
        .expect("spawn demux");
    let ready_text = wait_ready_file(&ready, &mut child, &log, "demux", within);
    TestDataplane { child, keys, data, control, log, ready_text }
}

/// Kills a child process and reaps it (errors ignored: it may be gone already).
pub fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `cmd` to completion, at most `within` (then kills it): whether it exited 0,
/// and its stdout followed by its stderr.
pub fn run_bounded(cmd: &mut Command, within: Duration) -> (bool, String) {
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (false, format!("spawn {cmd:?}: {e}")),
    };
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(Ok(o)) => {
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            (o.status.success(), text)
        }
        Ok(Err(e)) => (false, format!("waiting for {cmd:?}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the child this function started (not yet reaped:
            // the waiting thread has not returned).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            let _ = rx.recv_timeout(Duration::from_secs(5));
            (false, format!("{cmd:?} timed out after {within:?}"))
        }
    }
}

/// Kills (SIGKILL), when dropped, every process whose command line names `dir` (a
/// test's own temporary directory): a test that fails half-way leaves none of the
/// controllers, data planes and workers it started running, though they run in
/// process groups of their own.
pub struct Reaper(pub PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        // `DIR/`: a path inside it (`DIR-1` is another test's directory).
        let mut needle = self.0.as_os_str().as_encoded_bytes().to_vec();
        needle.push(b'/');
        let me = std::process::id();
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for e in procs.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if pid == me {
                continue;
            }
            let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else { continue };
            if cmdline.windows(needle.len()).any(|w| w == needle.as_slice()) {
                // SAFETY: kill(2) on a process that names this test's own directory.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}
