//! Key rotation without orphans or splits (docs/adr/0001 rotation, pacing):
//! pacing under live downloads, a data plane that does not confirm, an offline
//! rotation picked up at start. Run: `cargo test --release -p demux --test rotation`.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::*;

fn rotate(c: &Controller, force: bool) -> std::process::Output {
    let mut cmd = Command::new(DEMUX);
    cmd.arg("rotate-keys").arg("--state-dir").arg(&c.state);
    if force {
        cmd.arg("--force");
    }
    cmd.output().expect("run rotate-keys")
}

fn gens(v: &serde_json::Value) -> (Option<u64>, Option<u64>) {
    (v["key_newest"].as_u64(), v["key_previous"].as_u64())
}

/// `--cid-lifetime 2`: a second rotation right after the first is refused with a
/// clear message; 10 rotations at the fastest allowed pace (retrying until allowed)
/// under live downloads: 0 failed downloads, 0 Orphan, data plane and controller on
/// the same generations after every one, and 8 long-lived connections each keep
/// their one connection through all of them; `--force` overrides the pacing.
#[test]
fn ten_rotations_at_the_fastest_allowed_pace_under_live_downloads() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("rotpace", 2, &["--cid-lifetime", "2", "--limits", "off"]);
    let lost_before = c.reason("Orphan") + c.reason("Departed");
    // Long-lived connections: 8 clients, each on one connection for the whole run
    // (10 rotations, ≥ 54 s: 27 CID lifetimes), downloading 4 MiB after 4 MiB. They
    // survive only because the workers move them to newest-generation CIDs
    // (`worker --cid-lifetime`, which the controller passes).
    const LONG: usize = 8;
    let load = Load::start(&rt, c.addr(), &c.cert, LONG, "/bytes/4194304");
    let fresh = Downloads::start(&rt, &c, 4, 1 << 20);
    let started = Instant::now();
    let mut times = Vec::new();
    for i in 0..10u64 {
        let t0 = Instant::now();
        loop {
            let out = rotate(&c, false);
            if out.status.success() {
                break;
            }
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(err.contains("refusing to rotate") && err.contains("--force"), "rotation {i}: {err}");
            assert!(t0.elapsed() < Duration::from_secs(10), "rotation {i} refused for 10 s: {err}");
            std::thread::sleep(Duration::from_millis(if t0.elapsed() < Duration::from_secs(5) { 1000 } else { 50 }));
        }
        times.push(Instant::now());
        let s = c.status_wait();
        // Generations count modulo 3 (ADR-0001: two bits, three values).
        assert_eq!(gens(&s), (Some((i + 1) % 3), Some(i % 3)), "controller after rotation {}", i + 1);
        assert_eq!(gens(&c.lb_wait()), gens(&s), "data plane and controller split after rotation {}", i + 1);
        if i == 0 {
            // Right after a rotation: refused, with the reason and the way out.
            let out = rotate(&c, false);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "a second rotation 0 s later was allowed");
            assert!(
                err.contains("refusing to rotate") && err.contains("3 × 2.0 s") && err.contains("--force"),
                "{err}"
            );
            assert_eq!(gens(&c.status_wait()), (Some(1), Some(0)), "a refused rotation changed the keys");
        }
    }
    // The fastest allowed pace: 3 × 2 s apart (and not much more). Two lifetimes are
    // not enough: quinn may keep a CID for up to two lifetimes (docs/worker.md).
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap >= Duration::from_millis(5_900) && gap < Duration::from_secs(9), "rotations {gap:?} apart");
    }
    // The long-lived connections still download after the tenth rotation.
    load.wait_progress(LONG as u64, Duration::from_secs(60));
    let (ok, failures) = fresh.finish(&rt);
    assert!(failures.is_empty(), "{} failed downloads ({ok} ok): {failures:?}{}", failures.len(), c.logs());
    assert!(ok >= 20, "only {ok} downloads in {:?}", started.elapsed());
    let (connections, retried) =
        (load.stats.connections.load(Ordering::Relaxed), load.stats.retried.load(Ordering::Relaxed));
    let (ok, failed, f) = load.finish(&rt);
    assert!(failed == 0 && f.is_empty(), "long downloads: {failed} failed ({ok} ok): {f:?}{}", c.logs());
    assert_eq!(
        (connections, retried),
        (LONG as u64, 0),
        "the long-lived clients had to reconnect ({ok} downloads ok){}",
        c.logs()
    );
    let lost = c.reason("Orphan") + c.reason("Departed") - lost_before;
    assert_eq!(lost, 0, "connections were orphaned{}", c.logs());
    // --force: allowed at once, and said so.
    let out = rotate(&c, true);
    assert!(out.status.success(), "forced rotation: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(gens(&c.status_wait()), (Some(11 % 3), Some(10 % 3)));
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
    // The pacing survives the controller: an offline rotation right now is refused.
    let out = rotate(&c, false);
    assert!(!out.status.success(), "offline rotation within the pacing window was allowed");
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to rotate"));
}

/// The data plane is stopped (SIGSTOP) so it cannot confirm `KeysChanged`: the
/// rotation fails with the reason, the key file is restored, no worker hears of the
/// new generation; after SIGCONT the data plane decodes what the workers mint and
/// every new connection works; the next rotation goes through.
#[test]
fn a_data_plane_that_does_not_confirm_rolls_the_rotation_back() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("rotfail", 2, &["--cid-lifetime", "1", "--limits", "off"]);
    let keys_before = std::fs::read_to_string(c.state.join("keys")).unwrap();
    let dp = c.dataplane_pid();
    kill(dp, libc::SIGSTOP);
    let t0 = Instant::now();
    let out = rotate(&c, false);
    kill(dp, libc::SIGCONT);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "rotation succeeded with a stopped data plane");
    assert!(err.contains("did not confirm") && err.contains("rolled back"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "the failure took {:?}", t0.elapsed());
    assert_eq!(std::fs::read_to_string(c.state.join("keys")).unwrap(), keys_before, "key file not restored");
    assert!(!c.state.join("last-rotation").exists(), "a rolled-back rotation was recorded for pacing");
    let s = c.status_wait();
    assert_eq!(gens(&s), (Some(0), None), "the controller kept the rolled-back generation");
    // The data plane may have applied the late update ({1, 0}) or the restore ({0}):
    // either way it decodes generation 0, the one every worker mints with.
    let lb = c.lb_wait();
    assert!(lb["key_newest"] == 0 || lb["key_previous"] == 0, "data plane cannot decode generation 0: {lb}");
    let d = Downloads::start(&rt, &c, 4, 65_536);
    std::thread::sleep(Duration::from_secs(2));
    // A worker registering now gets the file's keys, which the data plane decodes.
    c.start_external();
    wait_until("the external worker", Duration::from_secs(30), || (c.workers().len() == 3).then_some(()));
    std::thread::sleep(Duration::from_secs(2));
    let out = rotate(&c, false);
    assert!(out.status.success(), "rotation after SIGCONT: {}", String::from_utf8_lossy(&out.stderr));
    let s = c.status_wait();
    assert_eq!(gens(&s), (Some(1), Some(0)));
    assert_eq!(gens(&c.lb_wait()), gens(&s), "split after the retried rotation");
    std::thread::sleep(Duration::from_secs(2));
    let (ok, failures) = d.finish(&rt);
    assert!(failures.is_empty() && ok > 10, "{} failed ({ok} ok): {failures:?}{}", failures.len(), c.logs());
    assert_eq!((c.reason("Orphan"), c.reason("Departed")), (0, 0), "{}", c.logs());
}

/// The controller dies (SIGKILL; data plane and workers keep running), the key file
/// is rotated offline, the controller starts again: the adopted data plane gets the
/// file's keys before the workers rejoin with them — same generations everywhere,
/// old connections keep their owners, new connections work, 0 Orphan.
#[test]
fn offline_rotation_then_controller_start_nothing_splits() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("rotoff", 2, &["--limits", "off"]);
    let (_ep, mut old) = connections(&rt, &c, 4);
    let dp = c.dataplane_pid();
    kill(c.child.id() as i64, libc::SIGKILL);
    let _ = c.child.wait();
    let out = rotate(&c, false);
    assert!(out.status.success(), "offline rotate-keys: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no controller running"));
    assert_eq!(gens(&c.lb_wait()), (Some(0), None), "the running data plane still has the old keys");
    c.launch();
    assert_eq!(c.dataplane_pid(), dp, "the data plane was not adopted{}", c.logs());
    wait_until("workers rejoined", Duration::from_secs(60), || {
        let w = c.workers();
        (w.len() == 2 && w.iter().all(|(_, _, s)| s == "ready")).then_some(())
    });
    let s = c.status_wait();
    assert_eq!(gens(&s), (Some(1), Some(0)));
    assert_eq!(gens(&c.lb_wait()), gens(&s), "adopted data plane and key file split{}", c.logs());
    for (id, h) in old.iter_mut() {
        let r = rt.block_on(h.get("/bytes/65536")).unwrap_or_else(|e| panic!("old connection: {e:?}{}", c.logs()));
        assert_eq!((r.len, r.server_id), (65_536, *id));
    }
    let d = Downloads::start(&rt, &c, 4, 65_536);
    std::thread::sleep(Duration::from_secs(3));
    let (ok, failures) = d.finish(&rt);
    assert!(failures.is_empty() && ok > 10, "{} failed ({ok} ok): {failures:?}{}", failures.len(), c.logs());
    assert_eq!((c.reason("Orphan"), c.reason("Departed")), (0, 0), "{}", c.logs());
    for (_, h) in old {
        h.close();
    }
}
