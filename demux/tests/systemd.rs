//! The controller under systemd without systemd as PID 1 (docs/operations.md
//! "Running under systemd"): this test is the service manager. It owns the
//! `NOTIFY_SOCKET` (an AF_UNIX datagram socket bound to a temp path) and reads every
//! notification with the descriptors attached to it; `systemd-socket-activate
//! --datagram` passes an activated UDP socket; and the sockets the controller put in
//! the "file-descriptor store" are handed to the next controller as `LISTEN_FDS`, as
//! systemd does on a restart.
#![allow(clippy::unwrap_used)]

mod controller_support;

use controller_support::{
    alive, cert, client_endpoint, kill, runtime, serial, socket_inode, worker_bin, Cert, DEMUX, H3,
};
use serde_json::Value;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One notification: its `KEY=VALUE` lines and the descriptors that came with it.
struct Msg {
    fields: Vec<(String, String)>,
    fds: Vec<OwnedFd>,
}

impl Msg {
    fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
    fn has(&self, key: &str, value: &str) -> bool {
        self.get(key) == Some(value)
    }
    /// The state change it announces, if any.
    fn state(&self) -> Option<&'static str> {
        ["READY", "RELOADING", "STOPPING"].into_iter().find(|k| self.has(k, "1"))
    }
}

/// The service manager's end of `NOTIFY_SOCKET`.
struct Notify {
    sock: UnixDatagram,
    path: PathBuf,
    got: Vec<Msg>,
}

impl Notify {
    fn new(dir: &Path, name: &str) -> Notify {
        let path = dir.join(name);
        let sock = UnixDatagram::bind(&path).expect("bind NOTIFY_SOCKET");
        sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        Notify { sock, path, got: Vec::new() }
    }

    /// Reads what has arrived (at most `within`), keeping every message.
    fn pump(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut buf = vec![0u8; 4096];
        while Instant::now() < deadline {
            match sys::seqpacket::recv_record_raw(self.sock.as_raw_fd(), &mut buf, 0) {
                Ok(r) => {
                    let text = String::from_utf8_lossy(&buf[..r.len]).into_owned();
                    let fields = text
                        .lines()
                        .filter_map(|l| l.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect();
                    self.got.push(Msg { fields, fds: r.fds });
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("NOTIFY_SOCKET: {e}"),
            }
        }
    }

    /// Reads until a message has `key=value` (after the `from`-th message); its index.
    fn wait_for(
        &mut self,
        from: usize,
        key: &str,
        value: &str,
        within: Duration,
        child: &mut Child,
        log: &Path,
    ) -> usize {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.got.iter().skip(from).position(|m| m.has(key, value)) {
                return from + i;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("the controller exited ({st}) before {key}={value}: {}", tail(log));
            }
            assert!(Instant::now() < deadline, "no {key}={value} within {within:?}: {}", tail(log));
            self.pump(Duration::from_millis(100));
        }
    }

    /// The sequence of READY / RELOADING / STOPPING announcements.
    fn states(&self) -> Vec<&'static str> {
        self.got.iter().filter_map(Msg::state).collect()
    }
}

fn tail(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A configuration file for a controller on `listen` with `workers` workers.
fn config(dir: &Path, listen: &str, workers: usize, c: &Cert) -> PathBuf {
    let path = dir.join("quicdemux.toml");
    let text = format!(
        "[controller]\nstate_dir = \"{state}\"\ndrain_timeout = 10\n\
         [listen]\naddresses = [\"{listen}\"]\n\
         [dataplane]\ncores = \"0-1\"\n\
         [workers]\ncount = {workers}\nbin = \"{bin}\"\ncert = \"{cert}\"\nkey = \"{key}\"\ndrain_timeout = 5\n\
         [log]\nlevel = \"info\"\n",
        state = dir.join("state").display(),
        bin = worker_bin().display(),
        cert = c.cert.display(),
        key = c.key.display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `demux status|lb-status --state-dir DIR --json`.
fn json(dir: &Path, sub: &str) -> Option<Value> {
    let out = Command::new(DEMUX).arg(sub).arg("--state-dir").arg(dir.join("state")).arg("--json").output().ok()?;
    out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
}

fn placeable(lb: &Value) -> usize {
    lb["instances"].as_array().map_or(0, |l| l.iter().filter(|i| i["placeable"] == true).count())
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// CLOCK_MONOTONIC in µs (what `MONOTONIC_USEC=` carries).
fn monotonic_usec() -> u64 {
    // SAFETY: timespec is plain old data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a live timespec.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) }, 0);
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

fn inode(fd: &OwnedFd) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino()
}

fn local_addr(fd: &OwnedFd) -> SocketAddr {
    socket2::SockRef::from(fd).local_addr().unwrap().as_socket().unwrap()
}

/// The FDSTORE messages from index `from` on: (name, fd).
fn stored(n: &mut Notify, from: usize) -> Vec<(String, OwnedFd)> {
    let mut out = Vec::new();
    for m in n.got.iter_mut().skip(from) {
        if m.has("FDSTORE", "1") {
            assert_eq!(m.fds.len(), 1, "one socket per FDSTORE message: {:?}", m.fields);
            let name = m.get("FDNAME").expect("FDNAME with FDSTORE").to_string();
            out.push((name, m.fds.pop().unwrap()));
        }
    }
    out
}

/// A GET on a new connection.
fn get_once(rt: &tokio::runtime::Runtime, c: &Cert, addr: SocketAddr) -> controller_support::Resp {
    let ep = {
        let _g = rt.enter();
        client_endpoint(c)
    };
    rt.block_on(async {
        let mut h = H3::connect(&ep, addr).await.expect("connect");
        let r = h.get("/bytes/1000").await.expect("GET");
        h.close();
        r
    })
}

/// `systemd-socket-activate --datagram -l ADDR` in front of `demux --config FILE`:
/// socket activation, notifications in order, the sockets in the store, a client
/// served on the activated socket, reload and stop.
#[test]
fn socket_activation_readiness_reload_and_stop() {
    let _g = serial();
    if !have_socket_activate() {
        return;
    }
    let dir = testkit::temp_dir("sd-activate");
    let _reap = testkit::bin::Reaper(dir.clone());
    let c = cert(&dir);
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = config(&dir, &addr.to_string(), 1, &c);
    let mut notify = Notify::new(&dir, "notify.sock");
    let log = dir.join("controller.log");
    let notify_env = format!("NOTIFY_SOCKET={}", notify.path.display());
    let (listen, watchdog) = (addr.to_string(), "WATCHDOG_USEC=400000");
    let args = ["--datagram", "-l", &listen, "--fdname=quicdemux-test", "-E", &notify_env, "-E", watchdog];
    let mut child = socket_activated(&args, &cfg, &log);
    let pid = child.id() as i64;
    // The first datagram activates the service (it stays in the socket): garbage,
    // which the data plane must then read from the activated socket (NotQuic).
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(&[0x00, 1, 2, 3], addr).unwrap();

    let ready = notify.wait_for(0, "READY", "1", Duration::from_secs(60), &mut child, &log);
    // READY=1 means a client can be served: the data plane already places on a worker.
    let lb = json(&dir, "lb-status").expect("lb-status");
    assert!(placeable(&lb) >= 1, "READY=1 before a placeable instance: {lb}");
    // STATUS= is the status summary (demux status: `summary`).
    assert!(
        notify.got[ready]
            .get("STATUS")
            .is_some_and(|s| s.starts_with("serving; data plane running (pid ")
                && s.ends_with("; workers 1 ready of 1 (want 1)")),
        "{:?}",
        notify.got[ready].fields
    );
    assert_eq!(lb["reasons"]["NotQuic"], 1, "the activating datagram is read from the passed socket: {lb}");

    // The store: both shard sockets, bound to ADDR; shard 0 is the activated one (fd 3).
    let store = stored(&mut notify, 0);
    assert!(notify.got[..ready].iter().filter(|m| m.has("FDSTORE", "1")).count() == 2, "FDSTORE before READY");
    let names: Vec<&str> = store.iter().map(|(n, _)| n.as_str()).collect();
    let a = addr.to_string().replace(':', "_");
    assert_eq!(names, [format!("udp-0-{a}"), format!("udp-1-{a}")]);
    for (_, fd) in &store {
        assert_eq!(local_addr(fd), addr);
        assert_eq!(
            sys::sockopt::getsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TYPE).unwrap(),
            libc::SOCK_DGRAM
        );
    }
    assert_eq!(Some(inode(&store[0].1)), socket_inode(pid, 3), "shard 0 is the socket systemd passed (fd 3)");
    assert_ne!(inode(&store[0].1), inode(&store[1].1));
    let st = json(&dir, "status").expect("status");
    assert_eq!(st["sockets"][0]["fd"], 3, "{st}");
    assert!(tail(&log).contains("sockets from systemd"), "{}", tail(&log));

    // A client is served on the activated socket.
    let rt = runtime();
    let r = get_once(&rt, &c, addr);
    assert_eq!((r.status, r.len, r.pattern_ok), (200, 1000, true));
    let first_id = r.server_id;

    // Only the controller talks to systemd: its children get none of the variables.
    let worker_pid = st["workers"][0]["pid"].as_i64().expect("worker pid");
    for p in [worker_pid, st["dataplane"]["pid"].as_i64().unwrap()] {
        let env = std::fs::read(format!("/proc/{p}/environ")).unwrap();
        for v in ["NOTIFY_SOCKET=", "LISTEN_FDS=", "LISTEN_PID=", "WATCHDOG_USEC="] {
            assert!(!env.split(|b| *b == 0).any(|e| e.starts_with(v.as_bytes())), "pid {p} inherited {v}");
        }
    }

    // STATUS= refreshed by the status thread with the datagram rate.
    let t0 = Instant::now();
    let with_rate = testkit::wait_until("a periodic STATUS with datagrams/s", Duration::from_secs(15), || {
        notify.pump(Duration::from_millis(200));
        notify.got[ready + 1..]
            .iter()
            .filter_map(|m| m.get("STATUS"))
            .find(|s| s.contains(" datagrams/s") && !s.contains("unknown"))
            .map(str::to_string)
    });
    assert!(
        with_rate.starts_with("serving; data plane running (pid ")
            && with_rate.contains("; workers 1 ready of 1 (want 1); "),
        "{with_rate}"
    );
    // WATCHDOG=1 every half WATCHDOG_USEC (0.2 s) from the controller's loop.
    let pings = notify.got[ready..].iter().filter(|m| m.has("WATCHDOG", "1")).count();
    let waited = t0.elapsed().as_secs_f64();
    assert!(pings as f64 >= waited / 0.2 / 2.0, "{pings} WATCHDOG=1 in {waited:.1} s (one per 0.2 s expected)");

    // SIGHUP: RELOADING=1 with MONOTONIC_USEC= of the moment, then READY=1 once the
    // rolling reload replaced the worker.
    let before = monotonic_usec();
    kill(pid, libc::SIGHUP);
    let reloading = notify.wait_for(ready + 1, "RELOADING", "1", Duration::from_secs(10), &mut child, &log);
    let after = monotonic_usec();
    let at: u64 =
        notify.got[reloading].get("MONOTONIC_USEC").expect("MONOTONIC_USEC with RELOADING=1").parse().unwrap();
    assert!((before..=after).contains(&at), "MONOTONIC_USEC {at} not within [{before}, {after}]");
    let ready2 = notify.wait_for(reloading + 1, "READY", "1", Duration::from_secs(90), &mut child, &log);
    let st = json(&dir, "status").expect("status");
    assert_eq!(st["reloading"], false, "READY=1 before the reload was done: {st}");
    let ids: Vec<u64> = st["workers"].as_array().unwrap().iter().filter_map(|w| w["server_id"].as_u64()).collect();
    assert!(!ids.contains(&u64::from(first_id)) && ids.len() == 1, "the worker was not replaced: {st}");

    // SIGTERM: STOPPING=1, then a clean exit.
    kill(pid, libc::SIGTERM);
    let stopping = notify.wait_for(ready2 + 1, "STOPPING", "1", Duration::from_secs(10), &mut child, &log);
    assert!(
        notify.got[stopping]
            .get("STATUS")
            .is_some_and(|s| s.starts_with("shutting_down;") && s.ends_with(", 1 draining")),
        "{:?}",
        notify.got[stopping].fields
    );
    let st = wait_exit(&mut child, Duration::from_secs(40)).expect("the controller exits");
    assert!(st.success(), "{st}: {}", tail(&log));
    notify.pump(Duration::from_millis(100));
    assert_eq!(notify.states(), ["READY", "RELOADING", "READY", "STOPPING"]);
}

/// Whether systemd-socket-activate is installed (a skip says why when it is not).
fn have_socket_activate() -> bool {
    testkit::have_tool(
        Command::new("systemd-socket-activate").arg("--version").output().is_ok(),
        "systemd-socket-activate",
    )
}

/// `systemd-socket-activate ARGS… DEMUX --config CFG` (stderr to `log`), once it is
/// listening (`ARGS` has `-l ADDR`, and `--datagram` for UDP).
fn socket_activated(args: &[&str], cfg: &Path, log: &Path) -> Child {
    let child = Command::new("systemd-socket-activate")
        .args(args)
        .arg(DEMUX)
        .arg("--config")
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("systemd-socket-activate");
    testkit::wait_until("systemd-socket-activate listening", Duration::from_secs(10), || {
        tail(log).contains("Listening on").then_some(())
    });
    child
}

/// A controller started with `NOTIFY_SOCKET` on a fresh state directory (one worker,
/// 127.0.0.1, an ephemeral port), once it is ready and has stored its sockets.
struct Notified {
    dir: PathBuf,
    _reap: testkit::bin::Reaper,
    c: Cert,
    cfg: PathBuf,
    notify: Notify,
    log: PathBuf,
    child: Child,
    /// The index of its READY=1 in `notify.got`.
    ready: usize,
    store: Vec<(String, OwnedFd)>,
}

impl Notified {
    fn start(tag: &str) -> Notified {
        let dir = testkit::temp_dir(tag);
        let _reap = testkit::bin::Reaper(dir.clone());
        let c = cert(&dir);
        let cfg = config(&dir, "127.0.0.1:0", 1, &c);
        let mut notify = Notify::new(&dir, "notify.sock");
        let log = dir.join("controller-a.log");
        let mut child = start_notified(&cfg, &notify.path, &log);
        let ready = notify.wait_for(0, "READY", "1", Duration::from_secs(60), &mut child, &log);
        let store = stored(&mut notify, 0);
        Notified { dir, _reap, c, cfg, notify, log, child, ready, store }
    }
}

/// Starts `demux --config cfg` as systemd would after a restart: `fds` as
/// descriptors 3… (`LISTEN_FDS`, `LISTEN_FDNAMES`, `LISTEN_PID` = the new process).
fn start_with_fds(cfg: &Path, notify: &Path, fds: &[(String, OwnedFd)], log: &Path) -> Child {
    start_with_fds_for(cfg, notify, fds, log, "$$")
}

/// [`start_with_fds`] with `LISTEN_PID` set to `listen_pid` (shell syntax).
fn start_with_fds_for(cfg: &Path, notify: &Path, fds: &[(String, OwnedFd)], log: &Path, listen_pid: &str) -> Child {
    // Out of the way of 3…3+n first, then into place between fork and exec.
    let high: Vec<RawFd> = fds
        .iter()
        // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor ≥ 100 for a live one.
        .map(|(_, fd)| unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) })
        .collect();
    assert!(high.iter().all(|f| *f >= 100));
    let names: Vec<&str> = fds.iter().map(|(n, _)| n.as_str()).collect();
    let mut cmd = Command::new("sh");
    // LISTEN_PID must be the pid that reads it: the shell's, kept by exec.
    let script = format!("LISTEN_PID={listen_pid} exec \"$@\"");
    cmd.args(["-c", &script, "sh", DEMUX, "--config"])
        .arg(cfg)
        .env("LISTEN_FDS", fds.len().to_string())
        .env("LISTEN_FDNAMES", names.join(":"))
        .env("NOTIFY_SOCKET", notify)
        .env_remove("LISTEN_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let moved = high.clone();
    // SAFETY: between fork and exec only dup2(2), which is async-signal-safe; `moved`
    // was allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for (i, fd) in moved.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn the next controller");
    for fd in high {
        // SAFETY: our own duplicate, no longer needed in this process.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    child
}

fn start_notified(cfg: &Path, notify: &Path, log: &Path) -> Child {
    Command::new(DEMUX)
        .arg("--config")
        .arg(cfg)
        .env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn the controller")
}

/// `systemctl restart` of a unit whose sockets are in the store: the controller
/// stops everything (its workers drain: their connections end), the service
/// manager keeps the sockets, and the next controller serves on them without
/// binding. The port never closes: a datagram sent meanwhile is not refused, and
/// the new data plane reads it.
#[test]
fn a_restart_serves_the_stored_sockets_and_never_closes_the_port() {
    let _g = serial();
    let Notified { dir, _reap, c, cfg, mut notify, log: log_a, child: mut a, ready, store } =
        Notified::start("sd-restart");
    assert_eq!(store.len(), 2, "one stored socket per shard");
    let addr = local_addr(&store[0].1);
    let inodes: Vec<u64> = store.iter().map(|(_, f)| inode(f)).collect();

    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c)
    };
    let mut c1 = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    assert_eq!(rt.block_on(c1.get("/bytes/1000")).expect("GET").status, 200);

    // Stop (what systemctl restart does first): drain, exit 0.
    kill(a.id() as i64, libc::SIGTERM);
    notify.wait_for(ready + 1, "STOPPING", "1", Duration::from_secs(10), &mut a, &log_a);
    assert!(wait_exit(&mut a, Duration::from_secs(40)).is_some_and(|s| s.success()), "{}", tail(&log_a));
    // Established connections do not survive it: their worker drained and exited.
    assert!(rt.block_on(c1.get("/bytes/1000")).is_err(), "a connection of the stopped worker still served");

    // Nothing runs, but the port is open: the stored sockets hold it. A connected
    // UDP socket would get ECONNREFUSED (ICMP port unreachable) from a closed port.
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    probe.connect(addr).unwrap();
    probe.send(&[0x00, 9, 9, 9]).unwrap();
    probe.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut b = [0u8; 16];
    let e = probe.recv(&mut b).expect_err("nothing answers garbage");
    assert_ne!(e.kind(), std::io::ErrorKind::ConnectionRefused, "the port was closed during the restart");
    probe.send(&[0x00, 9, 9, 9]).expect("a second datagram is not refused either");

    // The next controller: the stored sockets as LISTEN_FDS.
    let mut notify_b = Notify::new(&dir, "notify-b.sock");
    let log_b = dir.join("controller-b.log");
    let mut b_child = start_with_fds(&cfg, &notify_b.path, &store, &log_b);
    drop(store);
    notify_b.wait_for(0, "READY", "1", Duration::from_secs(60), &mut b_child, &log_b);
    let st = json(&dir, "status").expect("status");
    let pid_b = b_child.id() as i64;
    let served: Vec<u64> = st["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| socket_inode(pid_b, s["fd"].as_i64().unwrap()).expect("socket fd"))
        .collect();
    assert_eq!(served, inodes, "the new controller serves the very sockets it was handed, in shard order");
    assert!(tail(&log_b).contains("from_systemd=2"), "{}", tail(&log_b));
    // The datagrams sent while nothing ran waited in the sockets for the new data plane.
    let lb = json(&dir, "lb-status").expect("lb-status");
    assert_eq!(lb["reasons"]["NotQuic"], 2, "{lb}");
    let r = get_once(&rt, &c, addr);
    assert_eq!((r.status, r.len), (200, 1000));
    // It stores them again (systemd keeps one copy of each).
    let again: Vec<u64> = stored(&mut notify_b, 0).iter().map(|(_, f)| inode(f)).collect();
    assert_eq!(again, inodes);

    kill(pid_b, libc::SIGTERM);
    assert!(wait_exit(&mut b_child, Duration::from_secs(40)).is_some_and(|s| s.success()), "{}", tail(&log_b));
}

/// SIGUSR2 (`systemctl kill -s USR2 --kill-whom=main`, with `KillMode=process` and
/// `Restart=always`): the controller exits at once and leaves the data plane and the
/// workers running; the next one, handed the store, adopts them. A download in
/// flight across the hand-over completes on its connection, byte for byte.
#[test]
fn a_hand_over_keeps_established_connections() {
    let _g = serial();
    let Notified { dir, _reap, c, cfg, mut notify, log: log_a, child: mut a, ready, store } =
        Notified::start("sd-handover");
    let addr = local_addr(&store[0].1);
    let st = json(&dir, "status").unwrap();
    let dp_pid = st["dataplane"]["pid"].as_i64().unwrap();
    let worker_pid = st["workers"][0]["pid"].as_i64().unwrap();

    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c)
    };
    let mut c1 = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    let id = rt.block_on(c1.get("/bytes/1000")).expect("GET").server_id;
    // 4 MiB at 1 MiB/s: in flight for the whole hand-over.
    let download = {
        let mut sender = c1.sender();
        rt.spawn(async move {
            let req = http::Request::get("https://localhost/bytes/4194304").body(()).unwrap();
            let mut s = sender.send_request(req).await.map_err(|e| e.to_string())?;
            s.finish().await.map_err(|e| e.to_string())?;
            s.recv_response().await.map_err(|e| e.to_string())?;
            let (mut len, mut ok) = (0u64, true);
            let t = tokio::time::Instant::now();
            while let Some(mut chunk) = s.recv_data().await.map_err(|e| e.to_string())? {
                use bytes::Buf;
                while chunk.has_remaining() {
                    let b = chunk.chunk();
                    ok &= b.iter().enumerate().all(|(i, x)| *x == ((len + i as u64) % 256) as u8);
                    len += b.len() as u64;
                    let n = b.len();
                    chunk.advance(n);
                }
                tokio::time::sleep_until(t + Duration::from_secs_f64(len as f64 / (1 << 20) as f64)).await;
            }
            Ok::<_, String>((len, ok))
        })
    };
    std::thread::sleep(Duration::from_millis(500));

    kill(a.id() as i64, libc::SIGUSR2);
    assert!(wait_exit(&mut a, Duration::from_secs(10)).is_some_and(|s| s.success()), "{}", tail(&log_a));
    notify.pump(Duration::from_millis(200));
    assert!(!notify.got[ready..].iter().any(|m| m.has("STOPPING", "1")), "a hand-over is no stop");
    assert!(
        notify.got[ready..].iter().any(|m| m.get("STATUS").is_some_and(|s| s.starts_with("handing_over; "))),
        "no STATUS for the hand-over"
    );
    assert!(alive(dp_pid) && alive(worker_pid), "the data plane and the worker keep running");

    let mut notify_b = Notify::new(&dir, "notify-b.sock");
    let log_b = dir.join("controller-b.log");
    let mut b = start_with_fds(&cfg, &notify_b.path, &store, &log_b);
    drop(store);
    notify_b.wait_for(0, "READY", "1", Duration::from_secs(60), &mut b, &log_b);
    let st = json(&dir, "status").unwrap();
    assert_eq!(st["dataplane"]["pid"], dp_pid, "{st}");
    assert_eq!(st["dataplane"]["adopted"], true);
    assert_eq!(st["workers"][0]["server_id"], id, "{st}");
    assert_eq!(st["workers"][0]["rejoined"], true, "{st}");

    let (len, ok) = rt.block_on(download).unwrap().expect("the download across the hand-over");
    assert_eq!((len, ok), (4 << 20, true));
    let r = rt.block_on(c1.get("/bytes/1000")).expect("the same connection after the hand-over");
    assert_eq!((r.status, r.server_id), (200, id));

    kill(b.id() as i64, libc::SIGTERM);
    assert!(wait_exit(&mut b, Duration::from_secs(40)).is_some_and(|s| s.success()), "{}", tail(&log_b));
    testkit::wait_until("the adopted processes stopped", Duration::from_secs(10), || {
        (!alive(dp_pid) && !alive(worker_pid)).then_some(())
    });
}

/// What systemd passes must be a bound UDP socket of a listen address.
#[test]
fn unusable_passed_sockets_stop_the_start_with_a_reason() {
    let _g = serial();
    if !have_socket_activate() {
        return;
    }
    let dir = testkit::temp_dir("sd-refuse");
    let _reap = testkit::bin::Reaper(dir.clone());
    let c = cert(&dir);
    let run = |args: &[&str], cfg: &Path, trigger: &dyn Fn(SocketAddr), addr: SocketAddr| -> String {
        let log = dir.join("refused.log");
        let listen = addr.to_string();
        let mut child = socket_activated(&[args, &["-l", &listen]].concat(), cfg, &log);
        trigger(addr);
        let st = wait_exit(&mut child, Duration::from_secs(20)).expect("the controller gives up");
        assert!(!st.success());
        tail(&log)
    };
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A TCP listener (no --datagram).
    let cfg = config(&dir, &addr.to_string(), 0, &c);
    let out = run(&[], &cfg, &|a| drop(std::net::TcpStream::connect(a)), addr);
    assert!(out.contains("is not a UDP socket"), "{out}");
    // A UDP socket of an address the configuration does not listen on.
    let cfg = config(&dir, "127.0.0.2:4433", 0, &c);
    let out = run(&["--datagram"], &cfg, &|a| drop(UdpSocket::bind("127.0.0.1:0").unwrap().send_to(&[0], a)), addr);
    assert!(out.contains("which no listen address names"), "{out}");

    // Descriptors meant for another process (LISTEN_PID not ours) are not taken: the
    // same TCP socket is ignored, the controller binds and starts.
    let tcp = OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let cfg = config(&dir, "127.0.0.1:0", 0, &c);
    let mut notify = Notify::new(&dir, "notify-other.sock");
    let log = dir.join("other-pid.log");
    let mut child = start_with_fds_for(&cfg, &notify.path, &[("x".into(), tcp)], &log, "1");
    notify.wait_for(0, "READY", "1", Duration::from_secs(60), &mut child, &log);
    assert!(!tail(&log).contains("sockets from systemd"), "{}", tail(&log));
    kill(child.id() as i64, libc::SIGTERM);
    assert!(wait_exit(&mut child, Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", tail(&log));
}

/// IPv6: an activated socket on `[::1]` is served and the controller's other shard
/// joins its group; a dual-stack `[::]` socket is refused (IPv4 would arrive on it
/// and on 0.0.0.0).
#[test]
fn ipv6_activated_sockets() {
    let _g = serial();
    if !have_socket_activate() {
        return;
    }
    if UdpSocket::bind("[::1]:0").is_err() {
        testkit::skip_optional("ipv6-loopback", "no IPv6 loopback");
        return;
    }
    let dir = testkit::temp_dir("sd-ipv6");
    let _reap = testkit::bin::Reaper(dir.clone());
    let c = cert(&dir);
    let port = UdpSocket::bind("[::1]:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let cfg = config(&dir, &addr.to_string(), 1, &c);
    let mut notify = Notify::new(&dir, "notify.sock");
    let log = dir.join("controller.log");
    let notify_env = format!("NOTIFY_SOCKET={}", notify.path.display());
    let mut child = socket_activated(&["--datagram", "-l", &addr.to_string(), "-E", &notify_env], &cfg, &log);
    UdpSocket::bind("[::1]:0").unwrap().send_to(&[0x00, 1], addr).unwrap();
    notify.wait_for(0, "READY", "1", Duration::from_secs(60), &mut child, &log);
    let store = stored(&mut notify, 0);
    assert_eq!(store.len(), 2);
    let v6only: Vec<i32> = store
        .iter()
        .map(|(_, fd)| sys::sockopt::getsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap())
        .collect();
    assert_eq!(v6only, [1, 1], "IPV6_V6ONLY on both (a reuseport group's members agree)");
    assert_eq!(Some(inode(&store[0].1)), socket_inode(child.id() as i64, 3));
    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        testkit::h3client::client_endpoint_on(&c, "[::1]:0")
    };
    let r = rt.block_on(async {
        let mut h = H3::connect(&ep, addr).await.expect("connect over IPv6");
        h.get("/bytes/1000").await.expect("GET")
    });
    assert_eq!((r.status, r.len), (200, 1000));
    kill(child.id() as i64, libc::SIGTERM);
    assert!(wait_exit(&mut child, Duration::from_secs(40)).is_some_and(|s| s.success()), "{}", tail(&log));

    // `[::]` as the kernel binds it by default (net.ipv6.bindv6only = 0): dual-stack.
    let dual = std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "0");
    if !dual {
        return;
    }
    let port = UdpSocket::bind("[::]:0").unwrap().local_addr().unwrap().port();
    let any: SocketAddr = format!("[::]:{port}").parse().unwrap();
    let cfg = config(&dir, &any.to_string(), 0, &c);
    let log = dir.join("dual.log");
    let mut child = socket_activated(&["--datagram", "-l", &any.to_string()], &cfg, &log);
    UdpSocket::bind("[::1]:0").unwrap().send_to(&[0x00, 1], format!("[::1]:{port}")).unwrap();
    let st = wait_exit(&mut child, Duration::from_secs(20)).expect("refused");
    assert!(!st.success());
    assert!(tail(&log).contains("dual-stack"), "{}", tail(&log));
}
