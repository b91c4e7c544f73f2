//! quicdemux's test kit, used only as a dev-dependency by every crate's tests. It
//! depends on quinn and h3 (and their TLS), never on the crates it tests.
//!
//! - [`temp_dir`], [`wait_until`]: short temp dirs (unix socket paths stay under
//!   107 bytes), bounded waits.
//! - [`rng::Rng`]: a seeded xorshift64* generator, so failures reproduce.
//! - [`packets`]: handcrafted QUIC datagrams (RFC 9000 §17).
//! - [`h3client`]: a test TLS identity, the quinn + h3 client.
//! - [`bin`]: the workspace binaries by path, child processes and their ready files.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod bin;
pub mod cpu_clock;
pub mod h3client;
pub mod packets;
pub mod rng;

pub use rng::Rng;

/// A fresh, empty directory `$TMPDIR/qd-<tag>-<pid>-<n>` (the tag cut to 12
/// characters: unix socket paths inside must stay under 107 bytes).
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let tag: String = tag.chars().take(12).collect();
    let d = std::env::temp_dir().join(format!("qd-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Calls `f` until it returns `Some` (its value is returned) or `within` has passed
/// (a panic naming `what`). Polls every 5 ms at first, backing off to 50 ms.
pub fn wait_until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Skips (returns false) when `tool` is missing and CI is unset; with CI set, a
/// missing tool fails the test.
pub fn have_tool(ok: bool, tool: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{tool} is required when CI is set (tools/install-deps installs it)");
    }
    eprintln!("SKIP: {tool} not installed (set CI=1 to make this a failure)");
    false
}

/// The number after `"key":` in a one-line JSON object (panics when absent).
pub fn json_num(json: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let i = json.find(&pat).unwrap_or_else(|| panic!("no {key} in {json}")) + pat.len();
    let rest = &json[i..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].parse().unwrap_or_else(|_| panic!("{key} not a number in {json}"))
}
