//! quicdemux's test kit, used only as a dev-dependency by every crate's tests. It
//! depends on quinn and h3 (and their TLS), never on the crates it tests.
//!
//! - [`temp_dir`], [`wait_until`]: short temp dirs (unix socket paths stay under
//!   107 bytes), bounded waits.
//! - [`rng::Rng`]: a seeded xorshift64* generator, so failures reproduce.
//! - [`packets`]: handcrafted QUIC datagrams (RFC 9000 §17).
//! - [`h3client`]: a test TLS identity, the quinn + h3 client.
//! - [`bin`]: the workspace binaries by path, child processes and their ready files.
//! - [`trains`]: UDP GSO sends and `sendmmsg` batches (packet trains).
//! - [`netns`]: two network namespaces joined by a veth pair (receive-side GRO).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod bin;
pub mod cpu_clock;
pub mod h3client;
pub mod netns;
pub mod packets;
pub mod rng;
pub mod trains;

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
    skip(&format!("{tool} not installed (set CI=1 to make this a failure)"));
    false
}

/// The environment variable naming the file [`skip`] appends its lines to
/// (`tools/test-all` sets it and prints the file at the end).
pub const SKIP_LOG_ENV: &str = "QUICDEMUX_SKIP_LOG";

/// Reports that the calling test skips (some or all of its checks) and why: prints
/// `SKIPPED: <test>: <why>` to stderr (captured by libtest on success) and appends
/// the same line to the file named by `QUICDEMUX_SKIP_LOG`, if set, so that CI
/// can list every skip. The caller returns (or leaves out the checks) itself.
pub fn skip(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let line = skip_line(test, why);
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) {
        use std::io::Write;
        // One write(2) of one line to an O_APPEND file: lines of parallel tests and
        // test processes do not interleave. A log that cannot be written is reported,
        // never fatal: the skip itself already printed.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            eprintln!("{SKIP_LOG_ENV}={}: {e}", std::path::Path::new(&path).display());
        }
    }
}

/// Skips because the machine lacks a capability the README lists under "Optional
/// capabilities" (by its `name`): the line says `optional capability 'NAME'`, and
/// `CI=true tools/test-all` accepts it. Any other skip fails a CI run.
pub fn skip_optional(capability: &str, why: &str) {
    skip(&format!("optional capability '{capability}': {why}"));
}

/// `SKIPPED: <crate test binary> <test>: <why>` on one line (newlines in `why`
/// become spaces).
fn skip_line(test: &str, why: &str) -> String {
    let exe = std::env::current_exe().ok();
    let bin = exe.as_deref().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("?");
    // Cargo names test binaries NAME-HASH: keep NAME.
    let bin = bin.rsplit_once('-').map_or(bin, |(name, _)| name);
    let why = why.replace(['\n', '\r'], " ");
    format!("SKIPPED: {bin} {test}: {why}")
}

/// The number after `"key":` in a one-line JSON object (panics when absent).
pub fn json_num(json: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let i = json.find(&pat).unwrap_or_else(|| panic!("no {key} in {json}")) + pat.len();
    let rest = &json[i..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].parse().unwrap_or_else(|_| panic!("{key} not a number in {json}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_lines_are_one_uniform_line() {
        let l = skip_line("a_test", "needs 2 cores\nhas 1");
        assert!(l.starts_with("SKIPPED: ") && l.ends_with(" a_test: needs 2 cores has 1"), "{l}");
        assert!(!l.contains('\n'));
    }

    #[test]
    fn skip_appends_to_the_log_named_by_the_env_var() {
        let d = temp_dir("skiplog");
        let log = d.join("skips");
        std::env::set_var(SKIP_LOG_ENV, &log);
        skip("first reason");
        skip("second reason");
        std::env::remove_var(SKIP_LOG_ENV);
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("SKIPPED: ") && lines[0].ends_with("first reason"), "{text}");
        assert!(lines[1].ends_with("second reason"), "{text}");
    }
}
