//! Upgrades across real processes (docs/operations.md "Upgrading"): `demux upgrade`
//! moves a running appliance to other binaries — the data plane on the same
//! sockets, the workers one at a time, the controller by re-executing itself —
//! while downloads and new requests run, and rolls back when a step fails.
//!
//! "Another build" is this one relabelled with the hidden test flag
//! `--protocol-version V` (a build that differs only in its version number,
//! docs/wire.md "Versions"): a wrapper script per build that `exec`s this build's
//! `demux` or `worker` with the flag last, so every process started from the
//! wrapper — the controller, the data plane it starts, `check-state`, the workers —
//! speaks V.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use proto::wire::{Window, PROTOCOL_VERSION};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::*;

const V: u8 = PROTOCOL_VERSION;
/// Each in-flight download (the 8 × 32 MiB), read at most this fast so
/// that all of them span the upgrade on two shared cores.
const DOWNLOADS: usize = 8;
const DOWNLOAD_BYTES: u64 = 32 << 20;
const DOWNLOAD_RATE: u64 = 4 << 20;

/// The binaries of one "build": wrappers of this build's `demux` and `worker`.
struct Build {
    demux: PathBuf,
    worker: PathBuf,
    version: u8,
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The build of protocol version `version` in `dir`. Its workers drain for up to
/// `WORKER_DRAIN_S`: a retiring worker's downloads finish even on a loaded machine.
fn build(dir: &Path, version: u8) -> Build {
    const WORKER_DRAIN_S: u64 = 90;
    let demux = dir.join(format!("demux-v{version}"));
    let worker = dir.join(format!("worker-v{version}"));
    script(&demux, &format!("exec {DEMUX} \"$@\" --protocol-version {version}"));
    script(
        &worker,
        &format!(
            "exec {} \"$@\" --drain-timeout {WORKER_DRAIN_S} --protocol-version {version}",
            worker_bin().display()
        ),
    );
    Build { demux, worker, version }
}

/// A controller of `b` with two workers of `b`.
fn start(tag: &str, b: &Build) -> Controller {
    let worker = b.worker.display().to_string();
    Controller::start_as(tag, 2, &b.demux, &["--worker-bin", &worker])
}

/// `demux upgrade --state-dir DIR --demux-bin … --worker-bin …` (this build's
/// operator tool), stdin closed.
fn upgrade_command(c: &Controller, demux: &Path, worker: &Path) -> Command {
    let mut cmd = Command::new(DEMUX);
    cmd.args(["upgrade", "--timeout", "120", "--state-dir"])
        .arg(&c.state)
        .arg("--demux-bin")
        .arg(demux)
        .arg("--worker-bin")
        .arg(worker)
        .stdin(Stdio::null());
    cmd
}

/// Runs `upgrade_command` to its end.
fn upgrade(c: &Controller, demux: &Path, worker: &Path) -> Output {
    upgrade_command(c, demux, worker).output().expect("demux upgrade")
}

/// `upgrade`, polling `demux status` meanwhile: the distinct `upgrade.step`s seen.
fn upgrade_watching(c: &Controller, demux: &Path, worker: &Path, steps: &mut Vec<String>) -> Output {
    let child =
        upgrade_command(c, demux, worker).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("demux upgrade");
    let pid = child.id() as i64;
    while alive(pid) {
        if let Some(step) = c.status().and_then(|s| s["upgrade"]["step"].as_str().map(str::to_string)) {
            if steps.last() != Some(&step) {
                steps.push(step);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("demux upgrade")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Whether `pid` runs build V: the last `--protocol-version` of its command line
/// (the one in force) says V.
fn runs_version(pid: i64, v: u8) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let last = args.iter().rposition(|a| *a == b"--protocol-version");
    last.and_then(|i| args.get(i + 1)).is_some_and(|a| *a == v.to_string().as_bytes())
}

/// `DOWNLOADS` downloads of `DOWNLOAD_BYTES`, each on a connection of its own.
struct Downloads(Vec<tokio::task::JoinHandle<Result<Resp, String>>>);

impl Downloads {
    /// Starts them and returns once every one is receiving its body: in flight,
    /// past its handshake (a handshake caught by a data-plane restart is another
    /// matter: docs/operations.md "Lifecycle events").
    fn start(rt: &tokio::runtime::Runtime, addr: SocketAddr, cert: &Cert) -> Downloads {
        let ep = {
            let _g = rt.enter();
            client_endpoint(cert)
        };
        let receiving = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks = (0..DOWNLOADS)
            .map(|_| {
                let (ep, receiving) = (ep.clone(), receiving.clone());
                rt.spawn(async move {
                    let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e}"))?;
                    let mut first = true;
                    let on_progress = |_| {
                        if std::mem::take(&mut first) {
                            receiving.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    };
                    let r = h
                        .get_full(&format!("/bytes/{DOWNLOAD_BYTES}"), Some(DOWNLOAD_RATE), on_progress)
                        .await
                        .map_err(|e| format!("{e:?}"))?;
                    h.close();
                    Ok(r)
                })
            })
            .collect();
        wait_until("every download receiving", Duration::from_secs(30), || {
            (receiving.load(std::sync::atomic::Ordering::Relaxed) == DOWNLOADS).then_some(())
        });
        Downloads(tasks)
    }

    /// How many completed 200, full length, every byte as generated.
    fn finish(self, rt: &tokio::runtime::Runtime) -> (usize, Vec<String>) {
        let mut ok = 0;
        let mut bad = Vec::new();
        for t in self.0 {
            match rt.block_on(async { tokio::time::timeout(Duration::from_secs(120), t).await }) {
                Ok(Ok(Ok(r))) if r.status == 200 && r.len == DOWNLOAD_BYTES && r.pattern_ok => ok += 1,
                other => bad.push(format!("{other:?}")),
            }
        }
        (ok, bad)
    }
}

/// Whether `pid` is gone for good: no process, or not a zombie of `parent` (a
/// child the controller failed to reap).
fn reaped(pid: i64, parent: i64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    let rest: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    !(rest.first() == Some(&"Z") && rest.get(1) == Some(&parent.to_string().as_str()))
}

/// Upgrades the running `c` from `from` to `to` while the downloads and a loop of
/// new requests run: the upgrade succeeds, nothing fails, and afterwards only
/// `to`'s processes serve (the data plane, every worker and the controller itself,
/// in the same pid); the old ones exited and were reaped.
fn upgrade_under_load(c: &Controller, from: &Build, to: &Build) {
    let rt = runtime();
    let addr = c.addr();
    let controller_pid = c.child.id() as i64;
    let (dp0, workers0) = (c.dataplane_pid(), c.workers());
    assert!(runs_version(controller_pid, from.version) && runs_version(dp0, from.version), "{}", c.logs());
    let load = Load::start(&rt, addr, &c.cert, 2, "/bytes/16384");
    load.wait_progress(10, Duration::from_secs(30));
    let downloads = Downloads::start(&rt, addr, &c.cert);

    let t = Instant::now();
    let mut steps = Vec::new();
    let out = upgrade_watching(c, &to.demux, &to.worker, &mut steps);
    let took = t.elapsed();
    assert!(out.status.success(), "upgrade: {}{}", text(&out), c.logs());
    // `demux status` showed the upgrade's steps in order while it ran, and shows
    // none once it is done.
    assert!(steps.contains(&"workers".to_string()), "the workers' roll shown: {steps:?}");
    let mut order = steps.clone();
    order.sort_by_key(|s| ["dataplane", "workers", "controller"].iter().position(|x| x == s));
    assert_eq!(order, steps, "steps in order: {steps:?}");
    assert!(c.status_wait()["upgrade"].is_null());
    assert!(text(&out).contains("upgraded"), "{}", text(&out));
    load.wait_progress(10, Duration::from_secs(30));
    let (ok, bad) = downloads.finish(&rt);
    let (served, failed, failures) = load.finish(&rt);
    eprintln!(
        "upgrade v{} -> v{}: {took:?}; {ok}/{DOWNLOADS} downloads of {DOWNLOAD_BYTES} B; {served} requests; steps {steps:?}",
        from.version, to.version
    );
    assert_eq!((ok, bad.len()), (DOWNLOADS, 0), "{bad:?}{}", c.logs());
    assert_eq!(failed, 0, "{failures:?}{}", c.logs());

    // Only the new build's processes: the controller (same pid), the data plane
    // (lb-status: its pid and window) and every worker (each data connection
    // negotiated the new version).
    assert_eq!(c.child.id() as i64, controller_pid);
    assert!(runs_version(controller_pid, to.version), "the controller re-executed the new build{}", c.logs());
    let st = c.status_wait();
    let lb = c.lb_wait();
    let dp = lb["pid"].as_i64().unwrap();
    assert_ne!(dp, dp0, "a new data plane");
    assert_eq!(st["dataplane"]["pid"].as_i64(), Some(dp), "{st}");
    assert!(runs_version(dp, to.version), "the data plane runs the new build");
    assert_eq!(lb["protocol"]["newest"].as_u64(), Some(u64::from(to.version)), "{lb}");
    let workers = c.workers();
    assert_eq!(workers.len(), 2, "{workers:?}");
    for (id, pid, state) in &workers {
        assert_eq!(state, "ready");
        assert!(!workers0.iter().any(|w| w.1 == *pid), "an old worker {pid} still registered: {workers:?}");
        assert!(runs_version(*pid, to.version), "worker {pid} (server id {id}) runs the new build");
    }
    for pid in workers0.iter().map(|w| w.1).chain([dp0]) {
        assert!(!alive(pid), "old process {pid} exited");
        assert!(reaped(pid, controller_pid), "old process {pid} reaped by the controller");
    }
    let mut instances: Vec<(u64, u64)> = lb["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["server_id"].as_u64().unwrap(), i["protocol"].as_u64().unwrap()))
        .collect();
    instances.sort();
    let mut want: Vec<(u64, u64)> = workers.iter().map(|w| (w.0, u64::from(to.version))).collect();
    want.sort();
    assert_eq!(instances, want, "only the new workers' instances, in the new version: {lb}");
    // The new controller serves.
    let load = Load::start(&rt, addr, &c.cert, 1, "/bytes/1000");
    load.wait_progress(3, Duration::from_secs(20));
    assert_eq!(load.finish(&rt).1, 0);
}

/// The controller stops cleanly, reaping its workers with their exit status
/// (they are its children even when it adopted them after re-executing itself:
/// waitid P_PIDFD), not leaving zombies.
fn stop_and_check_reaping(c: &mut Controller) {
    let workers = c.workers();
    assert!(c.stop(Duration::from_secs(60)), "the upgraded controller stops cleanly{}", c.logs());
    let log = std::fs::read_to_string(&c.log).unwrap();
    for (_, pid, _) in &workers {
        assert!(
            log.contains(&format!("worker exited pid={pid} how=\"exit code 0\"")),
            "worker {pid} reaped{}",
            c.logs()
        );
    }
}

/// Up one version, then back down on the re-executed controller (whose data plane
/// and workers it adopted): both under load, both keep every download.
#[test]
fn upgrade_and_back_keep_every_download() {
    let _s = serial();
    let dir = temp_dir("upg-up");
    let (a, b) = (build(&dir, V), build(&dir, V + 1));
    let mut c = start("upg-up", &a);
    upgrade_under_load(&c, &a, &b);
    upgrade_under_load(&c, &b, &a);
    stop_and_check_reaping(&mut c);
}

/// A controller started as the newer build goes down one version.
#[test]
fn downgrade_within_the_window_keeps_every_download() {
    let _s = serial();
    let dir = temp_dir("upg-down");
    let (a, b) = (build(&dir, V), build(&dir, V + 1));
    let mut c = start("upg-down", &b);
    upgrade_under_load(&c, &b, &a);
    stop_and_check_reaping(&mut c);
}

/// What must not change when an upgrade is refused: the processes and server ids.
fn snapshot(c: &Controller) -> (i64, Vec<(u64, i64, String)>, u64) {
    (c.dataplane_pid(), c.workers(), c.status_wait()["next_server_id"].as_u64().unwrap())
}

/// A build two versions newer shares no version with the running one: refused at
/// the preflight with the documented error naming both, and the appliance is
/// untouched (same data plane, workers, ids; load unbroken). So is a state
/// directory of a newer format (a downgrade across a format change). Then SIGUSR1
/// alone upgrades to the binaries at the present paths.
#[test]
fn a_gap_of_two_and_a_newer_state_format_are_refused_untouched() {
    let _s = serial();
    let dir = temp_dir("upg-gap");
    let (a, gap) = (build(&dir, V), build(&dir, V + 2));
    let mut c = start("upg-gap", &a);
    let rt = runtime();
    let load = Load::start(&rt, c.addr(), &c.cert, 2, "/bytes/16384");
    load.wait_progress(10, Duration::from_secs(30));
    let before = snapshot(&c);

    let out = upgrade(&c, &gap.demux, &gap.worker);
    let want = format!("protocol version {} not supported: this build speaks {}", V + 2, Window::ending_at(V));
    assert!(!out.status.success() && text(&out).contains(&want), "{}", text(&out));
    assert!(text(&out).contains("nothing changed"), "{}", text(&out));

    // A state directory written by a newer build (format 2): this build refuses it.
    let format = c.state.join("state-format");
    let ours = std::fs::read_to_string(&format).unwrap();
    assert_eq!(ours, "quicdemux-state 1\n");
    std::fs::write(&format, "quicdemux-state 2\n").unwrap();
    let out = upgrade(&c, &a.demux, &a.worker);
    assert!(
        !out.status.success() && text(&out).contains("state format 2, newer than this build's 1"),
        "{}",
        text(&out)
    );
    std::fs::write(&format, ours).unwrap();

    load.wait_progress(10, Duration::from_secs(30));
    assert_eq!(snapshot(&c), before, "untouched{}", c.logs());

    // SIGUSR1 alone (`systemctl kill -s USR1`): the binaries at the present paths —
    // the controller's own executable, which speaks its own version (the test
    // relabelling is not passed on), and its worker binary.
    let result = c.state.join("upgrade.result");
    let _ = std::fs::remove_file(&result);
    kill(c.child.id() as i64, libc::SIGUSR1);
    let text =
        wait_until("the SIGUSR1 upgrade's result", Duration::from_secs(120), || std::fs::read_to_string(&result).ok());
    assert!(text.starts_with("ok -\n"), "{text}{}", c.logs());
    let (dp, workers, _) = snapshot(&c);
    assert_ne!(dp, before.0, "a new data plane");
    assert!(workers.iter().all(|w| !before.1.iter().any(|o| o.1 == w.1)), "new workers: {workers:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", c.child.id())).unwrap();
    assert!(cmdline.starts_with(DEMUX.as_bytes()), "the controller re-executed this build's demux");
    assert!(!cmdline.windows(18).any(|w| w == b"--protocol-version"), "{}", String::from_utf8_lossy(&cmdline));

    let (_, failed, failures) = load.finish(&rt);
    assert_eq!(failed, 0, "{failures:?}");
    assert!(c.stop(Duration::from_secs(60)), "{}", c.logs());
}

/// New binaries that fail, each while the downloads run: a `demux` that exits 1 at
/// once (refused at the preflight), one whose data plane exits 1 (the data plane
/// restarts from the old binary), and a worker that exits 1 (the workers and the
/// data plane roll back). Each says why; every download completes and the old
/// build serves on.
#[test]
fn a_new_binary_that_exits_1_rolls_back_and_every_download_completes() {
    let _s = serial();
    let dir = temp_dir("upg-fail");
    let (a, b) = (build(&dir, V), build(&dir, V + 1));
    let exits = dir.join("exits-1");
    script(&exits, "exit 1");
    let dp_exits = dir.join("demux-dataplane-exits-1");
    script(&dp_exits, &format!("[ \"$1\" = dataplane ] && exit 1\nexec {} \"$@\"", b.demux.display()));
    let mut c = start("upg-fail", &a);
    let rt = runtime();
    let addr = c.addr();
    let load = Load::start(&rt, addr, &c.cert, 2, "/bytes/16384");
    load.wait_progress(10, Duration::from_secs(30));
    let downloads = Downloads::start(&rt, addr, &c.cert);
    let (dp0, workers0, _) = snapshot(&c);

    let out = upgrade(&c, &exits, &b.worker);
    assert!(
        !out.status.success() && text(&out).contains("cannot take over the state (exit status: 1)"),
        "{}",
        text(&out)
    );
    assert_eq!(c.dataplane_pid(), dp0, "the preflight changed nothing");

    let out = upgrade(&c, &dp_exits, &b.worker);
    let t = text(&out);
    assert!(
        !out.status.success() && t.contains("exited before it was ready: exit code 1") && t.contains("rolled back"),
        "{t}"
    );
    let dp1 = c.dataplane_pid();
    assert_ne!(dp1, dp0, "restarted from the old binary");
    assert!(runs_version(dp1, a.version), "the data plane runs the old build again");
    assert_eq!(c.workers(), workers0, "the workers were not touched");

    let out = upgrade(&c, &b.demux, &exits);
    let t = text(&out);
    assert!(!out.status.success() && t.contains("exited: exit code 1") && t.contains("rolled back"), "{t}{}", c.logs());
    let dp2 = c.dataplane_pid();
    assert!(runs_version(dp2, a.version), "the data plane runs the old build again{}", c.logs());
    let workers = c.workers();
    assert_eq!(workers.len(), 2, "{workers:?}");
    for (_, pid, state) in &workers {
        assert_eq!(state, "ready");
        assert!(runs_version(*pid, a.version), "worker {pid} runs the old build");
    }
    assert!(runs_version(c.child.id() as i64, a.version), "the controller was not replaced");

    let (ok, bad) = downloads.finish(&rt);
    assert_eq!((ok, bad.len()), (DOWNLOADS, 0), "{bad:?}{}", c.logs());
    let (_, failed, failures) = load.finish(&rt);
    assert_eq!(failed, 0, "{failures:?}{}", c.logs());
    let lb = c.lb_wait();
    assert_eq!(lb["protocol"]["newest"].as_u64(), Some(u64::from(V)), "{lb}");
    assert!(c.stop(Duration::from_secs(60)), "{}", c.logs());
}
