//! One owner per port: an orphaned data plane exits
//! after `--orphan-timeout`; a controller refuses an address another process's
//! socket holds, naming the pid. Run: `cargo test --release -p demux --test ownership`.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// Starts a controller on `addr` with a fresh state dir and returns its exit
/// status and stderr (it is expected to refuse quickly).
fn start_refused(tag: &str, addr: SocketAddr) -> (std::process::ExitStatus, String) {
    let dir = temp_dir(tag);
    let mut child = Command::new(DEMUX)
        .args(["--listen", &addr.to_string(), "--cores", "0-1"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn controller");
    let deadline = Instant::now() + Duration::from_secs(15);
    let st = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a second appliance on a busy port {addr} started (did not refuse within 15 s)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (st, err)
}

fn pids_in(path: &std::path::Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Downloads on `n` fresh connections; (ok, failures).
fn downloads(rt: &tokio::runtime::Runtime, c: &Controller, addr: SocketAddr, n: usize) -> (usize, Vec<String>) {
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let (mut ok, mut failures) = (0, Vec::new());
    for _ in 0..n {
        let r = rt.block_on(async {
            let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e}"))?;
            let r = h.get("/bytes/1048576").await.map_err(|e| format!("GET: {e:?}"))?;
            h.close();
            if r.status == 200 && r.len == 1 << 20 && r.pattern_ok {
                Ok(())
            } else {
                Err(format!("bad response {r:?}"))
            }
        });
        match r {
            Ok(()) => ok += 1,
            Err(e) => failures.push(e),
        }
    }
    (ok, failures)
}

/// A controller is SIGKILLed and its workers exit: its data plane, with no
/// controller and no instance, exits after `--orphan-timeout` and removes its
/// socket files. Before that, a new appliance on the same port refuses to start,
/// naming the orphan's pid; after it, the new appliance starts and serves 10 of 10
/// downloads.
#[test]
fn orphaned_dataplane_exits_and_the_new_appliance_gets_every_download() {
    let _s = serial();
    let rt = runtime();
    let mut a = Controller::start("own-a", 2, &["--orphan-timeout", "3", "--limits", "off"]);
    let addr = a.addr();
    let dp = a.dataplane_pid();
    kill(a.child.id() as i64, libc::SIGKILL);
    let _ = a.child.wait();
    for w in pids_in(&a.state.join("workers")) {
        kill(w, libc::SIGKILL);
    }
    let killed = Instant::now();
    let (st, err) = start_refused("own-early", addr);
    assert!(!st.success(), "started beside the orphan");
    assert!(
        err.contains(&format!("{addr} is already in use by pid {dp}")),
        "the refusal does not name the orphan (pid {dp}): {err}"
    );
    wait_until("the orphaned data plane to exit", Duration::from_secs(15), || (!alive(dp)).then_some(()));
    let took = killed.elapsed();
    assert!(took >= Duration::from_secs(2), "the orphan exited after {took:?}, before its timeout");
    for f in ["data.sock", "dataplane.sock", "dataplane.ready"] {
        assert!(!a.state.join(f).exists(), "{f} left behind by the exiting data plane");
    }
    assert!(a.logs().contains("no controller and no instance"), "{}", a.logs());
    let b = Controller::start_on("own-b", 2, &addr.to_string(), &["--limits", "off"]);
    assert_eq!(b.addr(), addr);
    let (ok, failures) = downloads(&rt, &b, addr, 10);
    assert_eq!((ok, failures.len()), (10, 0), "downloads on the new appliance: {failures:?}{}", b.logs());
}

/// A healthy appliance holds the port: a second one (another state directory)
/// refuses to start with a clear error naming a pid of the first; the first keeps
/// serving; a controller with a data plane keeps it (no orphan exit while linked).
#[test]
fn a_second_appliance_on_a_busy_port_refuses_to_start() {
    let _s = serial();
    let rt = runtime();
    let a = Controller::start("own-busy", 2, &["--orphan-timeout", "2", "--limits", "off"]);
    let addr = a.addr();
    let mut pids = pids_in(&a.state.join("workers"));
    pids.push(a.dataplane_pid());
    let (st, err) = start_refused("own-second", addr);
    assert!(!st.success(), "a second appliance started on {addr}");
    let named: Option<i64> = err
        .split(&format!("{addr} is already in use by pid "))
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
    assert!(
        named.is_some_and(|p| pids.contains(&p)),
        "the refusal names no pid of the first appliance {pids:?}: {err}"
    );
    let (ok, failures) = downloads(&rt, &a, addr, 10);
    assert_eq!((ok, failures.len()), (10, 0), "the first appliance after the refusal: {failures:?}{}", a.logs());
    drop(a);
    // No instance, but a controller: its held connection keeps the data plane
    // (longer than the orphan timeout).
    let idle = Controller::start("own-idle", 0, &["--orphan-timeout", "2"]);
    let dp = idle.dataplane_pid();
    std::thread::sleep(Duration::from_secs(4));
    assert!(alive(dp), "the data plane exited while its controller ran{}", idle.logs());
}
