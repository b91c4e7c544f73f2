//! `worker --listen ADDR:PORT`: the HTTP/3 server alone on quinn's own UDP socket,
//! no data plane and no controller (docs/operations.md "A worker alone"). Served to
//! the project's quinn/h3 client, to ngtcp2's gtlsclient and to aioquic; the flags
//! that need a data plane are refused, and so is an address it cannot bind.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A `worker --listen 127.0.0.1:0` process; killed when dropped.
struct Alone {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    dir: PathBuf,
}

impl Alone {
    fn start(tag: &str, extra: &[&str]) -> Alone {
        let dir = temp_dir(tag);
        let (ready, log) = (dir.join("ready"), dir.join("worker.log"));
        let mut child = Command::new(WORKER)
            .args(["--listen", "127.0.0.1:0", "--drain-timeout", "5"])
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn worker");
        let text = testkit::bin::wait_ready_file(&ready, &mut child, &log, "worker --listen", Duration::from_secs(20));
        let addrs = testkit::bin::ready_udp_addrs(&text);
        assert_eq!(addrs.len(), 1, "one `udp ADDR` line in the ready file: {text:?}");
        let addr = addrs[0];
        assert!(addr.ip().is_loopback() && addr.port() != 0, "the bound address, port picked: {addr}");
        Alone { child, addr, log, dir }
    }

    /// SIGTERM, then the exit status and the log (at most 15 s).
    fn stop(&mut self) -> (bool, String) {
        // SAFETY: kill(2) on our own child process, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return (st.success(), std::fs::read_to_string(&self.log).unwrap_or_default());
            }
            assert!(std::time::Instant::now() < deadline, "worker --listen did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        testkit::bin::kill_and_reap(&mut self.child);
    }
}

/// The quinn/h3 client against `--cert/--key` and `--root`: `/health` says server id
/// 0, `/bytes/N` streams N pattern bytes, a static file is served as is, a missing
/// one is 404; SIGTERM drains and the exit line counts what was served.
#[test]
fn quinn_client_gets_health_bytes_and_files() {
    let files = temp_dir("alone-root");
    let c = cert(&files);
    let root = files.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("hello.txt"), b"hello, alone\n").unwrap();
    let (cp, kp, rp) = (c.cert.display().to_string(), c.key.display().to_string(), root.display().to_string());
    let mut w = Alone::start("alone-quinn", &["--cert", &cp, "--key", &kp, "--root", &rp]);
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, w.addr).await.unwrap();
        let health = h.get("/health").await.unwrap();
        assert_eq!((health.status, health.server_id), (200, 0));
        let bytes = h.get(&format!("/bytes/{MIB}")).await.unwrap();
        assert_eq!((bytes.status, bytes.len), (200, MIB));
        assert!(bytes.pattern_ok, "body pattern");
        let file = h.get("/hello.txt").await.unwrap();
        assert_eq!((file.status, file.len), (200, 13));
        let missing = h.get("/missing.txt").await.unwrap();
        assert_eq!(missing.status, 404);
        h.close();
        ep.wait_idle().await;
    });
    let (ok, log) = w.stop();
    assert!(ok, "clean exit after SIGTERM: {log}");
    assert!(log.contains(&format!("listen={}", w.addr)), "exit line names the address: {log}");
    assert_eq!(Worker::exit_stat(&log, "connections"), Some(1), "{log}");
    assert_eq!(Worker::exit_stat(&log, "requests"), Some(4), "{log}");
    assert_eq!(Worker::exit_stat(&log, "ok"), Some(3), "the 404 is not ok: {log}");
    let _ = std::fs::remove_dir_all(&files);
    let _ = std::fs::remove_dir_all(&w.dir);
}

/// Many connections at once, each with requests in flight: every one is served
/// (quinn's own socket with GSO/GRO, no data plane in between).
#[test]
fn quinn_client_many_connections() {
    let files = temp_dir("alone-many-cert");
    let c = cert(&files);
    let (cp, kp) = (c.cert.display().to_string(), c.key.display().to_string());
    let w = Alone::start("alone-many", &["--cert", &cp, "--key", &kp]);
    let rt = testkit::h3client::runtime();
    let served = rt.block_on(async {
        let ep = client_endpoint(&c);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (ep, addr) = (ep.clone(), w.addr);
            tasks.spawn(async move {
                let mut h = H3::connect(&ep, addr).await.unwrap();
                let mut n = 0;
                for _ in 0..20 {
                    let r = h.get("/bytes/65536").await.unwrap();
                    assert!(r.status == 200 && r.len == 65536 && r.pattern_ok);
                    n += 1;
                }
                h.close();
                n
            });
        }
        let mut total = 0;
        while let Some(n) = tasks.join_next().await {
            total += n.unwrap();
        }
        total
    });
    assert_eq!(served, 16 * 20);
    let _ = std::fs::remove_dir_all(&files);
}

/// gtlsclient (ngtcp2) fetches 1 MiB from a worker alone with its self-signed
/// certificate (made at start: no --cert/--key).
#[test]
fn gtlsclient_gets_1_mib() {
    if !have_tool(tool_exists("gtlsclient", &["--help"]), "gtlsclient (ngtcp2-client)") {
        return;
    }
    let w = Alone::start("alone-gtls", &[]);
    let dl = w.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let port = w.addr.port().to_string();
    let url = format!("https://localhost:{port}/bytes/{MIB}");
    let mut cmd = Command::new("gtlsclient");
    cmd.args(["-q", "--exit-on-all-streams-close", "--timeout=15s"])
        .arg(format!("--download={}", dl.display()))
        .args(["127.0.0.1", &port, &url]);
    let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(40));
    let (len, pattern_ok) = check_pattern(&dl.join(MIB.to_string()));
    assert!(ok && len == MIB && pattern_ok, "gtlsclient: ok={ok} {len} bytes pattern={pattern_ok}: {out}");
}

/// aioquic fetches 1 MiB from a worker alone (self-signed certificate).
#[test]
fn aioquic_gets_1_mib() {
    if !testkit::bin::have_aioquic() {
        return;
    }
    let w = Alone::start("alone-aioquic", &[]);
    let script = testkit::bin::python_script("aioquic_h3_get.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args(["127.0.0.1", &w.addr.port().to_string(), &format!("/bytes/{MIB}")]);
    let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(40));
    assert!(ok && out.contains(&format!("status=200 bytes={MIB} ")) && out.contains("ok=True"), "aioquic: {out}");
}

/// A value each refused flag would otherwise accept.
fn conflicting(id: &str) -> Vec<&'static str> {
    match id {
        "server_id" => vec!["--server-id", "1"],
        "keys" => vec!["--keys", "/nonexistent/keys"],
        "data_socket" => vec!["--data-socket", "/nonexistent/data.sock"],
        "server_id_from_controller" => vec!["--server-id-from-controller", "--control", "/nonexistent/c.sock"],
        "control" => vec!["--control", "/nonexistent/c.sock"],
        "controller_grace" => vec!["--controller-grace", "5"],
        "fast_path" => vec!["--fast-path", "off"],
        "rings" => vec!["--rings", "off"],
        "cid_lifetime" => vec!["--cid-lifetime", "60"],
        "echo" => vec!["--echo"],
        other => panic!("no example value for the refused flag {other}: add one here"),
    }
}

/// Every flag in `LISTEN_CONFLICTS` is refused with `--listen` by clap (exit 2, the
/// flag named), and each of those flags alone still parses (so it is the conflict
/// that refuses it, not a bad value).
#[test]
fn flags_needing_a_data_plane_are_refused() {
    use clap::Parser;
    use worker::cli::{Args, LISTEN_CONFLICTS};
    assert!(LISTEN_CONFLICTS.len() >= 10);
    for id in LISTEN_CONFLICTS {
        let flag = conflicting(id);
        let mut alone = vec!["worker"];
        alone.extend(&flag);
        Args::try_parse_from(&alone).unwrap_or_else(|e| panic!("{flag:?} alone must parse: {e}"));
        let mut both = vec!["worker", "--listen", "127.0.0.1:0"];
        both.extend(&flag);
        let err = Args::try_parse_from(&both).expect_err(&format!("--listen with {flag:?} must be refused"));
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{flag:?}: {err}");
    }
    // The binary: exit status 2 and a message naming both flags, before binding.
    let mut cmd = Command::new(WORKER);
    cmd.args(["--listen", "127.0.0.1:0", "--data-socket", "/nonexistent/data.sock"]);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'--listen <ADDR:PORT>' cannot be used with '--data-socket <PATH>'"), "{err}");
}

/// A value that is no socket address is a usage error (2); an address this host
/// does not have (TEST-NET-3, RFC 5737: bound, never sent to) fails to bind with an
/// error naming it (1), at once.
#[test]
fn a_bad_listen_address_is_refused() {
    let out = Command::new(WORKER).args(["--listen", "localhost"]).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("invalid value 'localhost' for '--listen <ADDR:PORT>'"), "{err}");

    let mut cmd = Command::new(WORKER);
    cmd.args(["--listen", "203.0.113.1:4433"]);
    let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(20));
    assert!(!ok, "binding 203.0.113.1 must fail: {out}");
    assert!(out.contains("worker: --listen 203.0.113.1:4433:"), "the error names the address: {out}");
}

/// A request whose body never ends: the response goes out, the server gives the rest
/// of the body 1 s, then stops reading it. That read was still in flight, so the
/// stream must be given up without touching it (h3-quinn's `stop_sending` panics on a
/// stream with a read in flight): no panic in the log, and the connection still serves.
#[test]
fn a_request_body_that_never_ends_is_given_up_without_a_panic() {
    let files = temp_dir("alone-open-body");
    let c = cert(&files);
    let (cp, kp) = (c.cert.display().to_string(), c.key.display().to_string());
    let mut w = Alone::start("alone-open-body", &["--cert", &cp, "--key", &kp]);
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, w.addr).await.unwrap();
        let mut sender = h.sender();
        let req = http::Request::post("https://localhost/health").body(()).unwrap();
        let mut s = sender.send_request(req).await.unwrap();
        s.send_data(bytes::Bytes::from_static(b"a body that never ends")).await.unwrap();
        let resp = s.recv_response().await.unwrap();
        assert_eq!(resp.status(), 405, "POST on a GET route");
        // Past the server's 1 s for the rest of the body, the stream still open here.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let after = h.get("/health").await.unwrap();
        assert_eq!(after.status, 200, "the connection still serves");
        drop(s);
        h.close();
        ep.wait_idle().await;
    });
    let (ok, log) = w.stop();
    assert!(ok, "clean exit after SIGTERM: {log}");
    assert!(!log.contains("panicked"), "no panic: {log}");
    assert_eq!(Worker::exit_stat(&log, "requests"), Some(2), "{log}");
    let _ = std::fs::remove_dir_all(&files);
    let _ = std::fs::remove_dir_all(&w.dir);
}
