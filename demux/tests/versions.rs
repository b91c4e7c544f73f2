//! Protocol versions across real processes (docs/wire.md "Versions", docs/adr/0006):
//! two builds one version apart negotiate the older version and serve; a gap of two
//! is refused with the documented error, counted (`peer_refused.version`), logged at
//! most once per interval, and the running appliance is untouched.
//!
//! The other build is this one relabelled with the hidden test flag
//! `--protocol-version V` (a build that differs only in its version number): a
//! controller given it passes it to its data plane; a worker takes its own.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use proto::wire::{Admin, Announce, Message, Window, PROTOCOL_VERSION};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const V: u8 = PROTOCOL_VERSION;

/// `peer_refused.version` of a status JSON.
fn refused_version(v: &serde_json::Value) -> u64 {
    v["peer_refused"]["version"].as_u64().unwrap_or_else(|| panic!("no peer_refused.version in {v}"))
}

/// The protocol version each live instance's data connection negotiated, by id.
fn instance_protocols(lb: &serde_json::Value) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = lb["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["server_id"].as_u64().unwrap(), i["protocol"].as_u64().unwrap_or(0)))
        .collect();
    v.sort();
    v
}

/// One GET of `/bytes/N` on a new connection: the server id that answered.
fn get(c: &Controller, addr: std::net::SocketAddr, n: u64) -> u16 {
    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    rt.block_on(async {
        let mut h = H3::connect(&ep, addr).await.expect("connect");
        let r = h.get(&format!("/bytes/{n}")).await.expect("GET");
        assert_eq!((r.status, r.len, r.pattern_ok), (200, n, true), "{r:?}");
        h.close();
        r.server_id
    })
}

/// Sends the raw records `recs` on a new connection to `sock` and returns every
/// record received until the peer closes (bounded by a receive timeout).
fn exchange_raw(sock: &Path, recs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let fd: OwnedFd = sys::seqpacket::connect(sock).expect("connect");
    socket2::SockRef::from(&fd).set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    for r in recs {
        if sys::seqpacket::send_record(fd.as_fd(), r, &[], 0).is_err() {
            break;
        }
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while let Ok(r) = sys::seqpacket::recv_record(fd.as_fd(), &mut buf, 0) {
        if r.len == 0 {
            break;
        }
        out.push(buf[..r.len].to_vec());
    }
    out
}

/// An `Error` record read by hand (it is the same in every version, so this also
/// reads one labelled with a version this build does not speak): its version byte
/// and text.
fn error_record(rec: &[u8]) -> (u8, String) {
    assert_eq!((rec[0], rec[2]), (0xc7, proto::wire::ERROR), "an Error record: {rec:?}");
    let n = u32::from_be_bytes(rec[3..7].try_into().unwrap()) as usize;
    (rec[1], String::from_utf8(rec[7..7 + n].to_vec()).unwrap())
}

fn log_lines(path: &Path, pat: &[&str]) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| pat.iter().all(|p| l.contains(p))).count()
}

/// A controller one version newer than its workers (the controller and its data
/// plane relabelled to N+1; the spawned workers this build, N): the workers
/// register, negotiate N on both connections and serve; a worker of N+1 negotiates
/// N+1 beside them. A key rotation asked by this build's operator tool reaches the
/// data plane and every worker in its own version.
#[test]
fn workers_one_version_older_register_and_serve() {
    let _s = serial();
    let newer = (V + 1).to_string();
    let mut c = Controller::start("ver-window", 2, &["--protocol-version", &newer]);
    let workers = c.workers();
    assert_eq!(workers.len(), 2, "{workers:?}");
    assert!(workers.iter().all(|w| w.2 == "ready"), "{workers:?}{}", c.logs());
    let lb = c.lb_wait();
    assert_eq!(
        (lb["protocol"]["newest"].as_u64(), lb["protocol"]["oldest"].as_u64()),
        (Some(u64::from(V) + 1), Some(u64::from(V))),
        "the controller passed its version on: {lb}"
    );
    let ids: Vec<u64> = workers.iter().map(|w| w.0).collect();
    let mut want: Vec<(u64, u64)> = ids.iter().map(|id| (*id, u64::from(V))).collect();
    want.sort();
    assert_eq!(instance_protocols(&lb), want, "each data connection negotiated the older version");
    // A worker of the controller's own version beside them negotiates that one.
    let ext = c.start_external_with(&["--protocol-version", &newer]);
    let lb = wait_until("the N+1 worker live", Duration::from_secs(30), || {
        let lb = c.lb()?;
        (instance_protocols(&lb).len() == 3).then_some(lb)
    });
    let ext_id = instance_protocols(&lb).into_iter().find(|(id, _)| !ids.contains(id)).expect("the external worker");
    assert_eq!(ext_id.1, u64::from(V) + 1, "two N+1 peers speak N+1: {lb}");
    let addr = c.addr();
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..12 {
        served.insert(u64::from(get(&c, addr, 100_000)));
    }
    assert!(served.iter().all(|s| ids.contains(s) || *s == ext_id.0), "served by {served:?}");
    assert!(served.iter().any(|s| ids.contains(s)), "the older workers serve: {served:?}");
    // Rotation: this build's operator tool (N) asks the controller (N+1).
    let out = Command::new(DEMUX)
        .args(["rotate-keys", "--force", "--state-dir"])
        .arg(&c.state)
        .stderr(Stdio::piped())
        .output()
        .expect("rotate-keys");
    assert!(out.status.success(), "rotate-keys: {}{}", String::from_utf8_lossy(&out.stderr), c.logs());
    assert_eq!(c.status_wait()["key_newest"].as_u64(), Some(1));
    assert_eq!(c.lb_wait()["key_newest"].as_u64(), Some(1), "the data plane took the new keys");
    // Every worker applied the KeysChanged sent in its own version (a record in a
    // version it does not speak would be logged as malformed and dropped).
    let rotated = |log: &Path| log_lines(log, &["key rotation", "newest=1"]);
    wait_until("both spawned workers rotated", Duration::from_secs(10), || (rotated(&c.log) == 2).then_some(()));
    wait_until("the external worker rotated", Duration::from_secs(10), || {
        (rotated(&c.external_log(ext)) == 1).then_some(())
    });
    for log in [c.log.clone(), c.external_log(ext)] {
        assert_eq!(log_lines(&log, &["malformed"]), 0, "{}", std::fs::read_to_string(&log).unwrap_or_default());
        assert_eq!(log_lines(&log, &["refused"]), 0, "{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    get(&c, addr, 1000);
    assert_eq!(refused_version(&c.status_wait()), 0);
    assert_eq!(refused_version(&c.lb_wait()), 0);
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// A worker two versions newer than the appliance is refused at registration with
/// the documented error, counted and logged once; so are a pre-negotiation record
/// on control.sock and an admin hello two versions newer on dataplane.sock. Load
/// keeps flowing throughout with no failure, no worker, id or process changes, and
/// a worker one version newer still joins.
#[test]
fn a_gap_of_two_is_refused_and_the_appliance_is_untouched() {
    let _s = serial();
    let mut c = Controller::start("ver-gap", 2, &[]);
    let rt = runtime();
    let addr = c.addr();
    let (ctl0, lb0, workers0, dp0) = (c.status_wait(), c.lb_wait(), c.workers(), c.dataplane_pid());
    let load = Load::start(&rt, addr, &c.cert, 2, "/bytes/65536");
    load.wait_progress(10, Duration::from_secs(60));

    // A worker of V+2: refused, and it says why.
    let gap = (V + 2).to_string();
    let ext = c.start_external_with(&["--protocol-version", &gap]);
    let st = wait_until("the refused worker to exit", Duration::from_secs(30), || {
        c.externals[ext].try_wait().ok().flatten()
    });
    let text = format!("protocol version {} not supported: this build speaks {}", V + 2, Window::OWN);
    let wlog = std::fs::read_to_string(c.external_log(ext)).unwrap_or_default();
    assert!(!st.success() && wlog.contains(&text), "{st}: {wlog}");
    let ctl1 = c.status_wait();
    assert_eq!(refused_version(&ctl1), refused_version(&ctl0) + 1, "{ctl1}");
    assert_eq!(ctl1["next_server_id"], ctl0["next_server_id"], "no server id for the refused worker");
    assert_eq!(log_lines(&c.log, &["refused an untrusted peer", "kind=\"version\"", &text]), 1, "{}", c.logs());

    // A record of a build before negotiation (version byte 2) on control.sock: an
    // Error in that peer's own version, naming both; counted, not logged again
    // within the interval.
    let got = exchange_raw(&c.control_sock(), &[vec![0xc7, 2, 0x61]]);
    assert_eq!(got.len(), 1, "one Error, then closed: {got:?}");
    assert_eq!(
        error_record(&got[0]),
        (2, format!("protocol version 2 not supported: this build speaks {}", Window::OWN))
    );
    assert_eq!(refused_version(&c.status_wait()), refused_version(&ctl0) + 2);
    assert_eq!(log_lines(&c.log, &["refused an untrusted peer", "kind=\"version\""]), 1, "rate-limited: {}", c.logs());

    // An admin hello of V+2 on the data plane's control socket (root, our uid).
    let hello = Admin::Hello { announce: Announce::plain(Window::ending_at(V + 2)), pid: std::process::id() };
    let got = exchange_raw(&c.state.join("dataplane.sock"), &[hello.to_record(), Admin::StatusRequest.to_record()]);
    assert_eq!(got.len(), 1, "one Error, then closed: {got:?}");
    assert_eq!(error_record(&got[0]), (V + 2, text.clone()), "in the refused peer's own version");
    let lb1 = c.lb_wait();
    assert_eq!(refused_version(&lb1), refused_version(&lb0) + 1, "{lb1}");

    // Untouched: the same workers, ids, processes; load without a failure.
    load.wait_progress(10, Duration::from_secs(60));
    assert_eq!(c.workers(), workers0);
    assert_eq!(c.dataplane_pid(), dp0);
    let mut ids: Vec<u64> = workers0.iter().map(|w| w.0).collect();
    ids.sort();
    assert_eq!(instance_protocols(&c.lb_wait()).into_iter().map(|i| i.0).collect::<Vec<_>>(), ids);

    // A worker one version newer (V+1) joins: the older version, V, on both conversations.
    let ext = c.start_external_with(&["--protocol-version", &(V + 1).to_string()]);
    let lb = wait_until("the V+1 worker live", Duration::from_secs(30), || {
        let lb = c.lb()?;
        (lb["instances"].as_array()?.len() == 3).then_some(lb)
    });
    let new = instance_protocols(&lb).into_iter().find(|(id, _)| !ids.contains(id)).expect("the V+1 worker");
    assert_eq!(new.1, u64::from(V), "{lb}");
    wait_until("the V+1 worker ready", Duration::from_secs(30), || {
        c.workers().iter().any(|w| w.0 == new.0 && w.2 == "ready").then_some(())
    });
    assert!(c.externals[ext].try_wait().unwrap().is_none(), "the V+1 worker runs");
    let (ok, failed, failures) = load.finish(&rt);
    assert!(ok > 20 && failed == 0, "ok {ok}, failed {failed}: {failures:?}");
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// A standalone data plane of this build and standalone workers: one of V+1 serves
/// (its data connection negotiated V); one of V+2 is refused on data.sock with the
/// documented error (the worker exits saying so), counted in lb-status.
#[test]
fn a_standalone_data_plane_refuses_a_data_hello_two_versions_newer() {
    let _s = serial();
    let dir = temp_dir("ver-dp");
    let cert = cert(&dir);
    let keys = dir.join("keys");
    assert!(Command::new(DEMUX).args(["gen-keys", "--out"]).arg(&keys).status().unwrap().success());
    let (data, control, ready) = (dir.join("d.sock"), dir.join("c.sock"), dir.join("ready"));
    let dp_log = dir.join("demux.log");
    let mut cmd = Command::new(DEMUX);
    cmd.args(["dataplane", "--listen", "127.0.0.1:0", "--cores", "0"]);
    testkit::bin::dataplane_files(&mut cmd, &keys, &data, &control, &ready);
    let spawned = cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&dp_log).unwrap()).spawn();
    let mut dp = Reaped(spawned.expect("demux dataplane"));
    let text = testkit::bin::wait_ready_file(&ready, &mut dp.0, &dp_log, "demux", Duration::from_secs(30));
    let addr = testkit::bin::ready_udp_addrs(&text)[0];
    let worker = |id: &str, version: u8, log: &str| {
        Command::new(worker_bin())
            .args(["--server-id", id, "--keys"])
            .arg(&keys)
            .arg("--data-socket")
            .arg(&data)
            .arg("--cert")
            .arg(&cert.cert)
            .arg("--key")
            .arg(&cert.key)
            .args(["--protocol-version", &version.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(log)).unwrap())
            .spawn()
            .expect("worker")
    };
    let lb = || match sys::control::request(&control, &[&Admin::StatusRequest]).map(|r| r.msg) {
        Ok(Admin::Status { json }) => serde_json::from_str::<serde_json::Value>(&json).ok(),
        _ => None,
    };
    let _near = Reaped(worker("7", V + 1, "near.log"));
    let s = wait_until("worker 7 placeable", Duration::from_secs(30), || {
        let s = lb()?;
        s["instances"].as_array()?.iter().any(|i| i["server_id"] == 7 && i["placeable"] == true).then_some(s)
    });
    assert_eq!(instance_protocols(&s), vec![(7, u64::from(V))]);
    let far = worker("9", V + 2, "far.log").wait_with_output().expect("the V+2 worker");
    let far_log = std::fs::read_to_string(dir.join("far.log")).unwrap();
    assert!(!far.status.success(), "{far_log}");
    assert!(
        far_log.contains(&format!("protocol version {} not supported: this build speaks {}", V + 2, Window::OWN)),
        "{far_log}"
    );
    let s = lb().expect("status");
    assert_eq!(refused_version(&s), 1, "{s}");
    assert_eq!(instance_protocols(&s), vec![(7, u64::from(V))], "the refused worker is not live");
    // Worker 7 serves.
    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&cert)
    };
    rt.block_on(async {
        let mut h = H3::connect(&ep, addr).await.expect("connect");
        let r = h.get("/bytes/20000").await.expect("GET");
        assert_eq!((r.status, r.len, r.server_id), (200, 20000, 7));
        h.close();
    });
    let refusals = log_lines(&dp_log, &["refused an untrusted peer", "kind=\"version\""]);
    assert_eq!(refusals, 1, "{}", std::fs::read_to_string(&dp_log).unwrap_or_default());
    drop(dp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process killed and reaped when the test ends, also on a panic.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        testkit::bin::kill_and_reap(&mut self.0);
    }
}

/// The test flag is hidden, bounded to this build's version and two above, and
/// refused by every other value.
#[test]
fn the_protocol_version_flag_is_hidden_and_bounded() {
    let help = Command::new(DEMUX).arg("--help").output().unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("protocol-version"));
    let dp_help = Command::new(DEMUX).args(["dataplane", "--help"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&dp_help.stdout).contains("protocol-version"));
    for bad in [V - 1, V + 3, 0, 255] {
        let out = Command::new(DEMUX)
            .args(["dataplane", "--listen", "127.0.0.1:0", "--protocol-version", &bad.to_string()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--protocol-version {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("a test relabelling"), "{out:?}");
    }
}
