//! The trust model (docs/operations.md "Trust model", "Running workers
//! unprivileged"): every Unix socket checks SO_PEERCRED, and `--worker-user` runs the
//! spawned workers as another uid. Real processes: the controller, its data plane and
//! workers as in tests/controller.rs; the attacker is this test binary re-executed
//! (`probe_helper`) under an unprivileged uid (setuid between fork and exec).
//!
//! Needs root (to create and become the test user); skipped with a message otherwise.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use proto::wire::{Admin, Data, Message, Registration};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;
use support::*;

const TEST_USER: &str = "quicdemux-test";

/// The attacker's uid/gid: `quicdemux-test`, created if absent (idempotent).
fn test_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid(2) cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        testkit::skip(&format!("the trust tests need root (to run processes as {TEST_USER})"));
        return None;
    }
    let lookup = || -> Option<(u32, u32)> {
        let id = |f: &str| {
            let o = std::process::Command::new("id").arg(f).arg(TEST_USER).output().ok()?;
            String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().ok()
        };
        Some((id("-u")?, id("-g")?))
    };
    if lookup().is_none() {
        let st = std::process::Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", TEST_USER])
            .status()
            .expect("useradd");
        assert!(st.success() || lookup().is_some(), "useradd {TEST_USER} failed");
    }
    Some(lookup().expect("the test user exists"))
}

/// What the attacker does (`QD_PROBE`): one request on one socket, or a file read.
enum Probe<'a> {
    Hello { pid: Option<u32> },
    Rejoin { server_id: u16, pid: Option<u32> },
    Rotate,
    Status,
    GetSockets,
    DataHello { server_id: u16 },
    Read(&'a Path),
}

/// Runs `probe` against `sock` as `uid:gid` (None: as ourselves, root). Returns the
/// probe's one-line report: `connect-error ERRNO`, `read-error ERRNO`, `read-ok`, or
/// the records received until close, e.g. `Error(uid 999 is not …) fds=0; closed`.
fn probe(ids: Option<(u32, u32)>, sock: &Path, p: Probe) -> String {
    let spec = match p {
        Probe::Hello { pid } => format!("hello {}", pid.map_or("self".into(), |p| p.to_string())),
        Probe::Rejoin { server_id, pid } => {
            format!("rejoin {} {server_id}", pid.map_or("self".into(), |p| p.to_string()))
        }
        Probe::Rotate => "rotate".into(),
        Probe::Status => "status".into(),
        Probe::GetSockets => "getsockets".into(),
        Probe::DataHello { server_id } => format!("datahello {server_id}"),
        Probe::Read(path) => format!("read {}", path.display()),
    };
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("test exe"));
    cmd.args(["--exact", "probe_helper", "--nocapture", "--test-threads=1"]);
    cmd.env("QD_PROBE", &spec).env("QD_PROBE_SOCK", sock);
    if let Some((uid, gid)) = ids {
        // SAFETY: only setgroups/setgid/setuid between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                let g = [gid];
                if libc::setgroups(1, g.as_ptr()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
    }
    let out = cmd.output().expect("run the probe");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.split_once("PROBE: ")).map(|(_, r)| r.to_string());
    line.unwrap_or_else(|| panic!("probe {spec} printed no result: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

/// The attacker (re-executed by [`probe`]); a no-op in a normal test run.
#[test]
fn probe_helper() {
    let Ok(spec) = std::env::var("QD_PROBE") else { return };
    let sock = std::path::PathBuf::from(std::env::var("QD_PROBE_SOCK").unwrap_or_default());
    let words: Vec<&str> = spec.split(' ').collect();
    let pid = |w: &str| if w == "self" { std::process::id() } else { w.parse().unwrap() };
    // An operator request goes behind the admin hello (docs/wire.md "Versions").
    let admin = |m: Admin| vec![admin_hello(), m.to_record()];
    let msgs = match words[0] {
        "hello" => vec![Registration::Hello { announce: own(0), pid: pid(words[1]) }.to_record()],
        "rejoin" => vec![Registration::Rejoin {
            announce: own(0),
            server_id: proto::ServerId(words[2].parse().unwrap()),
            pid: pid(words[1]),
        }
        .to_record()],
        "rotate" => admin(Admin::RotateKeys {
            prf: None,
            force: false,
            phase: proto::wire::admin::RotatePhase::Rotate,
            from: None,
            format: None,
        }),
        "status" => admin(Admin::StatusRequest),
        "getsockets" => admin(Admin::GetSockets),
        "datahello" => {
            vec![Data::DataHello { announce: own(3), server_id: proto::ServerId(words[1].parse().unwrap()) }.to_record()]
        }
        "hello-twice" => return hello_twice(&sock),
        "register-then-datahello" => return register_then_datahello(&sock),
        "read" => {
            let r = match std::fs::read(words[1]) {
                Ok(_) => "read-ok".to_string(),
                Err(e) => format!("read-error {}", e.raw_os_error().unwrap_or(0)),
            };
            println!("PROBE: {r}");
            return;
        }
        other => panic!("unknown probe {other}"),
    };
    println!("PROBE: {}", exchange(&sock, &msgs, 4).0);
}

/// This build's window and capabilities `caps`.
fn own(caps: u64) -> proto::wire::Announce {
    proto::wire::Announce { window: proto::wire::Window::OWN, caps }
}

fn admin_hello() -> Vec<u8> {
    Admin::Hello { announce: own(0), pid: std::process::id() }.to_record()
}

/// What a received record is, whichever conversation it belongs to: `Error(reason)`
/// or the message's name.
fn describe(rec: &[u8]) -> String {
    match (Registration::decode(rec), Data::decode(rec), Admin::decode(rec)) {
        (Ok(Registration::Error { reason }), ..) => format!("Error({reason})"),
        (Ok(m), ..) => m.name().to_string(),
        (_, Ok(m), _) => m.name().to_string(),
        (_, _, Ok(m)) => m.name().to_string(),
        (Err(e), ..) => format!("undecodable {e:?}"),
    }
}

/// Sends the records `msgs` on a new connection to `sock`; the records received until
/// close (at most `max`), as the report line of [`probe_helper`], and the connection.
fn exchange(sock: &Path, msgs: &[Vec<u8>], max: usize) -> (String, Option<std::os::fd::OwnedFd>) {
    let fd = match sys::seqpacket::connect(sock) {
        Ok(fd) => fd,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(0);
            return (format!("connect-error {errno} ({e})"), None);
        }
    };
    let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
    // SAFETY: a live timeval of the right size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let mut report = Vec::new();
    for msg in msgs {
        if let Err(e) = sys::seqpacket::send_record_raw(fd.as_raw_fd(), msg, &[], 0) {
            report.push(format!("send-error {e}"));
            break;
        }
    }
    let mut buf = vec![0u8; 70_000];
    let mut got = 0;
    for _ in 0..max + 2 {
        if got == max {
            break;
        }
        match sys::seqpacket::recv_record_raw(fd.as_raw_fd(), &mut buf, 0).map(|r| (r.len, r.fds)) {
            Ok((0, _)) => {
                report.push("closed".into());
                break;
            }
            Ok((n, fds)) => {
                got += 1;
                let what = describe(&buf[..n]);
                report.push(format!("{what} fds={}", fds.len()));
            }
            // Closed with our record unread (refused at accept): the reset is reported
            // once, before any record still queued for us.
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                report.push("timeout".into());
                break;
            }
            Err(e) => {
                report.push(format!("recv-error {e}"));
                break;
            }
        }
    }
    (report.join("; "), Some(fd))
}

/// The fake spawned worker of [`a_spawned_worker_registers_only_once`]: registers,
/// keeps that registration and registers again; writes both answers to QD_PROBE_OUT.
fn hello_twice(sock: &Path) {
    let hello = vec![Registration::Hello { announce: own(0), pid: std::process::id() }.to_record()];
    let (first, _keep) = exchange(sock, &hello, 3);
    let (second, _) = exchange(sock, &hello, 4);
    let out = std::path::PathBuf::from(std::env::var("QD_PROBE_OUT").expect("QD_PROBE_OUT"));
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    if !out.exists() {
        std::fs::write(&tmp, format!("{first}\n{second}\n")).expect("write");
        let _ = std::fs::rename(&tmp, &out);
    }
    std::thread::sleep(Duration::from_secs(60));
}

/// The registering process of [`a_data_hello_must_come_from_the_registering_pid`]:
/// registers on control.sock (root, its own pid) and keeps the registration, prints
/// `PROBE-ID: <server id>`, waits for a line on stdin, then sends the data hello for
/// that id itself on `QD_PROBE_DATA` and prints the answer.
fn register_then_datahello(ctl: &Path) {
    let fd = sys::seqpacket::connect(ctl).expect("connect control.sock");
    let hello = Registration::Hello { announce: own(0), pid: std::process::id() };
    sys::seqpacket::send_record_raw(fd.as_raw_fd(), &hello.to_record(), &[], 0).expect("send Hello");
    let mut buf = vec![0u8; 70_000];
    let n = sys::seqpacket::recv_record_raw(fd.as_raw_fd(), &mut buf, 0).expect("recv Welcome").len;
    assert!(matches!(Registration::decode(&buf[..n]), Ok(Registration::Welcome { .. })));
    let n = sys::seqpacket::recv_record_raw(fd.as_raw_fd(), &mut buf, 0).expect("recv Assign").len;
    let Ok(Registration::Assign { server_id, .. }) = Registration::decode(&buf[..n]) else {
        println!("PROBE-ID: none ({:?})", Registration::decode(&buf[..n]));
        return;
    };
    println!("PROBE-ID: {}", server_id.0);
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let data = std::path::PathBuf::from(std::env::var("QD_PROBE_DATA").expect("QD_PROBE_DATA"));
    let (report, _data_conn) = exchange(&data, &[Data::DataHello { announce: own(0), server_id }.to_record()], 3);
    println!("PROBE: {report}");
    drop(fd);
}

/// `peer_refused.<reason>` of a status JSON.
fn refused(v: &serde_json::Value, reason: &str) -> u64 {
    v["peer_refused"][reason].as_u64().unwrap_or_else(|| panic!("no peer_refused.{reason} in {v}"))
}

/// Refused: one `Error` naming why, no fds, then closed.
fn assert_refused(what: &str, got: &str, why: &str) {
    // A peer refused at accept may find the connection closed before it sent.
    let got = got.split_once("; ").filter(|(a, _)| a.starts_with("send-error")).map_or(got, |(_, b)| b);
    assert!(
        got.starts_with("Error(")
            && got.contains(why)
            && got.contains("fds=0")
            && got.ends_with("closed")
            && !got.contains("Assign")
            && !got.contains("Sockets")
            && !got.contains("Status"),
        "{what}: expected a refusal containing {why:?}, got {got:?}"
    );
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn download_ok(c: &Controller, path: &str, want: u64) -> u16 {
    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let addr = c.addr();
    rt.block_on(async {
        let mut h = H3::connect(&ep, addr).await.expect("connect");
        let r = h.get(path).await.expect("GET");
        assert_eq!((r.status, r.len, r.pattern_ok), (200, want, true), "{r:?}");
        h.close();
        r.server_id
    })
}

/// With the state directory opened to 0711 and every socket to 0666, a process of
/// an unprivileged uid reaches every socket but cannot register, rejoin, rotate
/// keys, read the status, take the data plane's sockets or open a data connection;
/// each is refused (Error, no fds, closed), logged once per interval, and the
/// appliance keeps serving.
#[test]
fn unprivileged_peer_with_open_socket_modes_is_refused_everywhere() {
    let Some(ids) = test_user() else { return };
    let _s = serial();
    let mut c = Controller::start("trust-open", 1, &[]);
    let (id, _, _) = c.workers()[0].clone();
    let ctl_before = c.status_wait();
    let next_before = ctl_before["next_server_id"].clone();
    let dp_before = c.lb_wait();
    chmod(&c.state, 0o711);
    for s in ["control.sock", "data.sock", "dataplane.sock"] {
        chmod(&c.state.join(s), 0o666);
    }
    let (ctl, data, dp) = (c.control_sock(), c.state.join("data.sock"), c.state.join("dataplane.sock"));
    // The probe itself works: as root it gets a status.
    assert!(probe(None, &ctl, Probe::Status).starts_with("Welcome fds=0; Status fds=0"), "probe sanity");
    let not_allowed = format!("uid {} is not allowed to connect", ids.0);
    let me = Some(ids);
    assert_refused("Hello", &probe(me, &ctl, Probe::Hello { pid: None }), &not_allowed);
    assert_refused("Rejoin", &probe(me, &ctl, Probe::Rejoin { server_id: id as u16 + 1, pid: None }), &not_allowed);
    assert_refused("RotateKeys", &probe(me, &ctl, Probe::Rotate), &not_allowed);
    assert_refused("StatusRequest", &probe(me, &ctl, Probe::Status), &not_allowed);
    assert_refused("GetSockets", &probe(me, &dp, Probe::GetSockets), &not_allowed);
    assert_refused("StatusRequest (data plane)", &probe(me, &dp, Probe::Status), &not_allowed);
    assert_refused("DataHello", &probe(me, &data, Probe::DataHello { server_id: 4242 }), &not_allowed);
    // Counted by reason: 4 on control.sock (controller), 3 on the data plane's sockets.
    let (ctl_after, dp_after) = (c.status_wait(), c.lb_wait());
    assert_eq!(refused(&ctl_after, "wrong_uid"), refused(&ctl_before, "wrong_uid") + 4, "{ctl_after}");
    assert_eq!(refused(&dp_after, "wrong_uid"), refused(&dp_before, "wrong_uid") + 3, "{dp_after}");
    // Nothing changed: no id handed out, no rotation, no new instance; still serving.
    let s = c.status_wait();
    assert_eq!((s["next_server_id"].clone(), s["key_newest"].as_u64()), (next_before, Some(0)), "{s}");
    assert_eq!(c.workers().len(), 1);
    assert_eq!(c.instances().iter().map(|i| i.0).collect::<Vec<_>>(), vec![id]);
    assert_eq!(download_ok(&c, "/bytes/100000", 100_000), id as u16);
    // Counted and logged once per interval: one line per process (controller, data plane).
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    let lines = log.lines().filter(|l| l.contains("refused an untrusted peer")).count();
    assert!((1..=2).contains(&lines), "{lines} refusal log lines (rate limit): {log}");
    assert!(c.stop(Duration::from_secs(60)));
}

/// `--worker-user`: the worker uid may register only from a process the controller
/// spawned, under that process's own pid, once. A process of the worker uid that was
/// not spawned (forging the spawned worker's pid, or its own), a root process forging
/// a pid, and the worker uid's operator requests are all refused; dataplane.sock
/// refuses the worker uid.
#[test]
fn forged_pid_hello_for_a_spawned_slot_is_refused() {
    let Some(ids) = test_user() else { return };
    let _s = serial();
    let mut c = Controller::start("trust-forge", 1, &["--worker-user", TEST_USER]);
    let (id, pid, _) = c.workers()[0].clone();
    let pid = pid as u32;
    let ctl_before = c.status_wait();
    let next_before = ctl_before["next_server_id"].clone();
    let ctl = c.control_sock();
    let me = Some(ids);
    assert_refused(
        "forged pid",
        &probe(me, &ctl, Probe::Hello { pid: Some(pid) }),
        &format!("the message says pid {pid}"),
    );
    assert_refused("own pid", &probe(me, &ctl, Probe::Hello { pid: None }), "was not spawned by this controller");
    assert_refused(
        "Rejoin as the spawned worker",
        &probe(me, &ctl, Probe::Rejoin { server_id: id as u16, pid: Some(pid) }),
        &format!("the message says pid {pid}"),
    );
    assert_refused(
        "Rejoin as another id",
        &probe(me, &ctl, Probe::Rejoin { server_id: id as u16 + 7, pid: None }),
        "was not spawned by this controller",
    );
    assert_refused("root forging a pid", &probe(None, &ctl, Probe::Hello { pid: Some(pid) }), "the message says pid");
    assert_refused("worker uid RotateKeys", &probe(me, &ctl, Probe::Rotate), "operator requests only from uid 0");
    assert_refused("worker uid status", &probe(me, &ctl, Probe::Status), "operator requests only from uid 0");
    // Open the file mode: SO_PEERCRED still refuses the worker uid.
    chmod(&c.state.join("dataplane.sock"), 0o666);
    assert_refused(
        "worker uid GetSockets",
        &probe(me, &c.state.join("dataplane.sock"), Probe::GetSockets),
        &format!("uid {} is not allowed to connect", ids.0),
    );
    let s = c.status_wait();
    assert_eq!((s["next_server_id"].clone(), s["key_newest"].as_u64()), (next_before, Some(0)), "{s}");
    // Each refusal under its reason.
    for (reason, n) in [("pid_mismatch", 3), ("not_spawned", 2), ("operator_only", 2)] {
        assert_eq!(refused(&s, reason), refused(&ctl_before, reason) + n, "{reason}: {s}");
    }
    let w = c.workers();
    assert_eq!((w.len(), w[0].0, w[0].1 as u32, w[0].2.as_str()), (1, id, pid, "ready"), "{w:?}");
    assert_eq!(download_ok(&c, "/bytes/1000", 1000), id as u16);
    assert!(c.stop(Duration::from_secs(60)));
}

fn proc_ids(pid: i64, field: &str) -> Vec<u32> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = st.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {st}"));
    line[field.len()..].split_whitespace().map(|x| x.parse().unwrap()).collect()
}

/// `--worker-user`: the controller (root) spawns the workers as that uid; they serve
/// HTTP/3 through the appliance (also after a controller restart: they rejoin), and
/// the worker uid cannot read the state directory's key file or counter.
#[test]
fn worker_user_serves_http3_and_cannot_read_the_keys() {
    let Some((uid, gid)) = test_user() else { return };
    let _s = serial();
    let mut c = Controller::start("trust-user", 2, &["--worker-user", TEST_USER]);
    let workers = c.workers();
    assert_eq!(workers.len(), 2);
    for (_, pid, _) in &workers {
        assert_eq!(proc_ids(*pid, "Uid:"), vec![uid; 4], "worker {pid} real/effective/saved/fs uid");
        assert_eq!(proc_ids(*pid, "Gid:"), vec![gid; 4], "worker {pid} gids");
        assert_eq!(proc_ids(*pid, "Groups:"), vec![gid], "worker {pid} supplementary groups");
    }
    // The controller and its data plane stay root.
    assert_eq!(proc_ids(c.child.id() as i64, "Uid:")[1], 0);
    assert_eq!(proc_ids(c.dataplane_pid(), "Uid:")[1], 0);
    // Modes: the group may search the directory and use the two worker sockets only.
    let md = |n: &str| std::fs::metadata(c.state.join(n)).expect("stat");
    assert_eq!((md("").mode() & 0o777, md("").gid()), (0o710, gid));
    for s in ["control.sock", "data.sock"] {
        assert_eq!((md(s).mode() & 0o777, md(s).uid(), md(s).gid()), (0o660, 0, gid), "{s}");
    }
    assert_eq!(md("dataplane.sock").mode() & 0o777, 0o600);
    assert_eq!(md("keys").mode() & 0o777, 0o600);
    for f in ["keys", "server-id", "workers"] {
        assert_eq!(probe(Some((uid, gid)), &c.state.join(f), Probe::Read(&c.state.join(f))), "read-error 13", "{f}");
    }
    let served: std::collections::BTreeSet<u16> = (0..6).map(|_| download_ok(&c, "/bytes/1048576", 1 << 20)).collect();
    let ids: std::collections::BTreeSet<u16> = workers.iter().map(|w| w.0 as u16).collect();
    assert!(served.is_subset(&ids) && !served.is_empty(), "served by {served:?}, workers {ids:?}");
    // Controller restart: the adopted unprivileged workers rejoin under their ids.
    kill(c.child.id() as i64, libc::SIGKILL);
    let _ = c.child.wait();
    c.launch();
    let s = wait_until("both workers rejoined", Duration::from_secs(30), || {
        let s = c.status()?;
        let l = s["workers"].as_array()?;
        (l.len() == 2 && l.iter().all(|w| w["rejoined"] == true && w["state"] == "ready")).then_some(s)
    });
    let again: std::collections::BTreeSet<u16> =
        s["workers"].as_array().unwrap().iter().map(|w| w["server_id"].as_u64().unwrap() as u16).collect();
    assert_eq!(again, ids, "{s}");
    assert!(ids.contains(&download_ok(&c, "/bytes/1000", 1000)));
    assert!(c.stop(Duration::from_secs(60)));
}

/// `--worker-user`: a spawned worker holds one registration; its second `Hello`
/// (same pid, the spawned one) is refused — a worker cannot take a second identity.
/// The spawned "worker" is this test binary (`hello_twice`) behind a shell script.
#[test]
fn a_spawned_worker_registers_only_once() {
    let Some(_) = test_user() else { return };
    let _s = serial();
    let dir = temp_dir("trust-twice");
    let outdir = dir.join("out");
    std::fs::create_dir(&outdir).expect("mkdir");
    chmod(&outdir, 0o777);
    let out = outdir.join("result");
    let script = dir.join("fake-worker");
    std::fs::write(&script, "#!/bin/sh\nexec \"$QD_PROBE_EXE\" --exact probe_helper --nocapture --test-threads=1\n")
        .expect("script");
    chmod(&script, 0o755);
    let state = dir.join("state");
    let log = dir.join("controller.log");
    let mut child = std::process::Command::new(DEMUX)
        .args(["--listen", "127.0.0.1:0", "--cores", "0", "--spawn-workers", "1", "--worker-user", TEST_USER])
        // The fake worker never drains: bound the shutdown's wait for it.
        .args(["--drain-timeout", "5"])
        .arg("--state-dir")
        .arg(&state)
        .arg("--worker-bin")
        .arg(&script)
        .env("QD_PROBE", "hello-twice")
        .env("QD_PROBE_SOCK", state.join("control.sock"))
        .env("QD_PROBE_OUT", &out)
        .env("QD_PROBE_EXE", std::env::current_exe().expect("exe"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("controller");
    let got = wait_until("the fake worker's report", Duration::from_secs(60), || {
        std::fs::read_to_string(&out).ok().filter(|s| s.ends_with('\n'))
    });
    kill(child.id() as i64, libc::SIGTERM);
    // The fake worker never drains: the controller kills it after --drain-timeout.
    let stopped =
        wait_until("the controller's exit on SIGTERM", Duration::from_secs(30), || child.try_wait().ok().flatten());
    let (first, second) = got.trim_end().split_once('\n').expect("two lines");
    assert!(
        first.starts_with("Welcome fds=0; Assign fds=0; Sockets fds=1"),
        "first Hello: {first} {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_refused("second Hello of the same spawned pid", second, "is already registered");
    assert!(stopped.success(), "{stopped}");
}

/// A data hello for a server id must come from the process that registered that id
/// with the controller (SO_PEERCRED pid, the registrations file): another process
/// of the same uid is refused for that id (`wrong_pid`) and for an id nobody
/// registered (`unregistered`), each counted in lb-status; the registering process
/// itself gets its sockets. The appliance keeps serving.
#[test]
fn a_data_hello_must_come_from_the_registering_pid() {
    use std::io::{BufRead, Write};
    let Some(_) = test_user() else { return };
    let _s = serial();
    let mut c = Controller::start("trust-dpid", 1, &[]);
    let (served_by, _, _) = c.workers()[0].clone();
    let data = c.state.join("data.sock");
    let mut owner = std::process::Command::new(std::env::current_exe().expect("test exe"))
        .args(["--exact", "probe_helper", "--nocapture", "--test-threads=1"])
        .env("QD_PROBE", "register-then-datahello")
        .env("QD_PROBE_SOCK", c.control_sock())
        .env("QD_PROBE_DATA", &data)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the registering probe");
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let mut next_line = |what: &str| loop {
        let l = lines.next().unwrap_or_else(|| panic!("{what}: the probe exited")).unwrap();
        if let Some((_, v)) = l.split_once(what) {
            return v.to_string();
        }
    };
    let id: u16 = next_line("PROBE-ID: ").parse().expect("the registering probe got a server id");
    let before = c.lb_wait();
    // Another process (this test's probe, root like the owner) claims the id.
    assert_refused(
        "DataHello for another pid's id",
        &probe(None, &data, Probe::DataHello { server_id: id }),
        &format!("server id {id} was registered by pid {}", owner.id()),
    );
    assert_refused(
        "DataHello for an unregistered id",
        &probe(None, &data, Probe::DataHello { server_id: id.wrapping_add(100) }),
        "is not registered with the controller",
    );
    let after = c.lb_wait();
    assert_eq!(refused(&after, "wrong_pid"), refused(&before, "wrong_pid") + 1, "{after}");
    assert_eq!(refused(&after, "unregistered"), refused(&before, "unregistered") + 1, "{after}");
    assert!(!c.instances().iter().any(|i| i.0 == u64::from(id)), "the refused id is not live");
    // The registering process itself: Welcome, Sockets (one fd per listen address), Rings.
    owner.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let got = next_line("PROBE: ");
    assert!(got.starts_with("Welcome fds=0; Sockets fds=1; Rings fds=0"), "the owner's own data hello: {got}");
    let _ = owner.wait();
    assert_eq!(download_ok(&c, "/bytes/1000", 1000), served_by as u16);
    assert!(c.stop(Duration::from_secs(60)));
}
