//! Smoke test for `bench all`: each contender briefly at a low fixed rate; the counts
//! add up and the CPU figure is positive and finite. nginx is left out (CI installs
//! nothing for bench); the demux contenders run only when a demux binary has been
//! built next to this bench binary (e.g. by `cargo test --workspace`).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use std::path::Path;
use std::process::Command;

/// Whether this process may create an io_uring (seccomp or a sysctl may refuse it).
fn io_uring_available() -> bool {
    let mut params = [0u32; 30]; // struct io_uring_params is 120 bytes
                                 // SAFETY: io_uring_setup with a zeroed params struct of the right size; the fd is closed.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: closes the fd we just got.
        unsafe { libc::close(fd as i32) };
    }
    fd >= 0
}

#[test]
fn contenders_count_and_measure() {
    let bench = Path::new(env!("CARGO_BIN_EXE_bench"));
    let mut contenders = vec!["floor", "baseline"];
    if bench.with_file_name("demux").exists() {
        if io_uring_available() {
            contenders.push("demux-uring");
        } else {
            testkit::skip("io_uring_setup refused here: the demux-uring contender");
        }
        contenders.push("demux-mmsg");
    } else {
        testkit::skip(&format!("no {}: the demux contenders", bench.with_file_name("demux").display()));
    }
    let json = std::env::temp_dir().join(format!("bench-smoke-{}.json", std::process::id()));
    let out = Command::new(bench)
        .args([
            "all",
            "--seconds",
            "1",
            "--reps",
            "1",
            "--rates",
            "5000",
            "--trains",
            "1,8",
            "--no-latency",
            "--no-saturation",
            "--no-doc",
        ])
        .args(["--nice", "0", "--contenders", &contenders.join(","), "--json"])
        .arg(&json)
        .env("BENCH_NO_BUILD", "1")
        .output()
        .expect("run bench");
    assert!(out.status.success(), "bench all failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), contenders.len() * 2, "one row per contender and mode");
    for r in rows {
        let (sent, received, handled) =
            (r["sent"].as_u64().unwrap(), r["received"].as_u64().unwrap(), r["handled"].as_u64().unwrap());
        let us = r["us_per_datagram"].as_f64().unwrap();
        assert!(sent >= 4000, "{r}: ~5000 datagrams offered in 1 s");
        assert!(handled <= received && received <= sent, "{r}: handled ≤ received ≤ sent");
        assert!(handled as f64 >= 0.95 * sent as f64, "{r}: at 5000/s nearly everything is handled");
        assert!(us.is_finite() && us > 0.0, "{r}: CPU µs per datagram positive and finite");
    }
}
