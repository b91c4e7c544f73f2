//! `bench saturation` on a small queue: the floor, the baseline and the Retry floor
//! (and the demux
//! with SEQPACKET and rings, and minting Retries for a queue of Initials, when a demux
//! binary has been built next to the bench binary) each drain a queue that was
//! filled while they were stopped.
#![allow(clippy::unwrap_used)] // tests may panic on their own setup

use std::path::Path;
use std::process::Command;

/// Datagrams per run: small enough for a loaded CI machine, large enough that a
/// queue that was drained while being filled shows.
const DATAGRAMS: u64 = 20_000;
/// The receive queue: room for every datagram (≈ 2.3 KB of truesize uncoalesced,
/// ≈ 10.4 KB per train of 8).
const QUEUE: u64 = 64 << 20;
/// Bytes of a 1200-byte datagram's payload: the least each takes in the queue.
const DATAGRAM: u64 = 1200;

#[test]
fn every_contender_drains_a_queue_filled_while_it_was_stopped() {
    // SAFETY: geteuid has no arguments.
    if unsafe { libc::geteuid() } != 0 {
        testkit::skip("not root (SO_RCVBUFFORCE and pidfd_getfd need it)");
        return;
    }
    let bench = Path::new(env!("CARGO_BIN_EXE_bench"));
    let mut contenders = vec!["floor", "baseline", "retry-floor"];
    if bench.with_file_name("demux").exists() {
        contenders.extend(["seqpacket", "ring", "retry", "retry-loopback"]);
    } else {
        testkit::skip(&format!("no {}: the demux contenders", bench.with_file_name("demux").display()));
    }
    let json = std::env::temp_dir().join(format!("bench-saturation-{}.json", std::process::id()));
    let out = Command::new(bench)
        .args(["saturation", "--datagrams", &DATAGRAMS.to_string(), "--queue", &QUEUE.to_string()])
        .args(["--reps", "1", "--trains", "1,8", "--nice", "0", "--contenders", &contenders.join(","), "--json"])
        .arg(&json)
        .env("BENCH_NO_BUILD", "1")
        .output()
        .expect("run bench");
    assert!(out.status.success(), "bench saturation failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("<!-- bench saturation: begin") && stdout.contains("<!-- bench saturation: end -->"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let runs = v.as_array().unwrap();
    // The retry contenders' Initials are never trains: one run each.
    let want = contenders.iter().map(|k| if k.starts_with("retry") { 1 } else { 2 }).sum::<usize>();
    assert_eq!(runs.len(), want, "one run per contender and mode");
    for k in &contenders {
        assert!(runs.iter().any(|r| r["contender"] == *k), "{k} ran");
    }
    for r in runs {
        let u = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        // The sender queued them all (a train of 8 rounds the count up to whole sendmmsg calls).
        assert!(u("sent") >= DATAGRAMS && u("sent") < DATAGRAMS + 64 * 8, "{r}");
        // Everything was in the queue at once: the contender could not run meanwhile.
        assert!(u("queued_bytes") >= u("sent") * DATAGRAM, "{r}: queue not filled while stopped");
        assert_eq!(u("fill_drops"), 0, "{r}");
        // And then it took every datagram out.
        assert_eq!(u("received"), u("sent"), "{r}");
        assert!(u("handled") <= u("received") && u("handled") as f64 >= 0.95 * u("sent") as f64, "{r}");
        // The demux's rounds take more than one task run's receives (the kernel's 32
        // per multishot): the shard enters again while receives are pending.
        if r["batches"].is_u64() && r["train"] == 1 {
            let per_round = u("received") as f64 / u("batches").max(1) as f64;
            assert!(per_round > 64.0, "{r}: {per_round:.1} receives per round");
        }
        let (cpu, wall, us) = (f("cpu_s"), f("wall_s"), f("us_per_datagram"));
        assert!(cpu > 0.0 && wall > 0.0 && us.is_finite() && us > 0.0, "{r}");
        assert!((us - cpu * 1e6 / u("handled") as f64).abs() < 1e-6, "{r}: µs = CPU / handled");
    }
}
