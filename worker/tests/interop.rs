//! Interop through the real demux with clients nobody here wrote: ngtcp2's
//! `gtlsclient` (Debian ngtcp2-client) and aioquic (PyPI), each fetching 1 MiB over
//! HTTP/3; gtlsclient also migrating (--change-local-addr, with path validation)
//! and NAT-rebinding (--nat-rebinding, no path validation). Tests skip only when the
//! tool is missing and CI is unset.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A demux with two workers. gtlsclient and aioquic do not verify the certificate
/// here, so the workers make their own self-signed certificates at start (rcgen).
fn setup(tag: &str) -> (Demux, Vec<Worker>) {
    let d = Demux::start(tag);
    let w = (1..=2).map(|id| Worker::start_self_signed(&d, id, &[])).collect();
    d.wait_instances("2 placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    (d, w)
}

/// Runs gtlsclient for `/bytes/1048576` with `extra` flags and checks the
/// downloaded file: exact size and the server's byte pattern.
fn gtlsclient_get(d: &Demux, extra: &[&str]) {
    gtlsclient_get_n(d, MIB, extra, Duration::from_secs(40));
}

fn gtlsclient_get_n(d: &Demux, n: u64, extra: &[&str], timeout: Duration) {
    let dl = d.dir.join(format!("dl-{}", extra.join("").replace(['-', '=', '/'], "")));
    std::fs::create_dir_all(&dl).expect("download dir");
    let port = d.addr.port().to_string();
    let url = format!("https://localhost:{port}/bytes/{n}");
    let mut cmd = Command::new("gtlsclient");
    cmd.args(["-q", "--exit-on-all-streams-close", "--timeout=15s"])
        .arg(format!("--download={}", dl.display()))
        .args(extra)
        .args(["127.0.0.1", &port, &url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let out = run_with_timeout(cmd, timeout);
    let file = dl.join(n.to_string());
    let (len, pattern_ok) = check_pattern(&file);
    let _ = std::fs::remove_file(&file);
    assert!(out.0 && len == n, "gtlsclient {extra:?}: exit ok={} got {len} bytes; stderr: {}", out.0, out.1);
    assert!(pattern_ok, "body pattern");
}

/// The download's established traffic took the kernel fast path (the data plane's
/// default where BPF loads): the SK_REUSEPORT program steered the client's short
/// headers to the workers' own sockets, and the data plane routed only long headers.
fn assert_fast_path_carried(d: &Demux, what: &str) {
    let s = d.status();
    let fp = &s["fast_path"];
    if fp["active"].as_bool() != Some(true) {
        assert!(std::env::var_os("CI").is_none(), "{what}: the fast path must be active in CI: {fp}");
        testkit::skip(&format!("{what}: fast path not active here ({})", fp["reason"]));
        return;
    }
    let fast = fp["datagrams"].as_u64().unwrap_or(0);
    let owner = d.reason("Owner");
    assert!(fast >= 50, "{what}: {fast} datagrams on the fast path: {fp}");
    assert!(owner * 10 < fast, "{what}: the user path routed {owner} Owner datagrams vs {fast} fast ones");
}

#[test]
fn gtlsclient_gets_1_mib() {
    if !have_tool(tool_exists("gtlsclient", &["--help"]), "gtlsclient (ngtcp2-client)") {
        return;
    }
    let (d, _w) = setup("gtls");
    gtlsclient_get(&d, &[]);
    assert_fast_path_carried(&d, "gtlsclient");
}

/// `/bytes/N` streams without holding N in memory: 1 GiB arrives complete.
#[test]
fn gtlsclient_gets_1_gib() {
    if !have_tool(tool_exists("gtlsclient", &["--help"]), "gtlsclient (ngtcp2-client)") {
        return;
    }
    let (d, _w) = setup("gtlsgib");
    gtlsclient_get_n(&d, 1 << 30, &[], Duration::from_secs(150));
}

/// Active migration (RFC 9000 §9.2): the client moves to a new local port 50 ms
/// into the download and validates the new path; the demux routes by CID.
#[test]
fn gtlsclient_change_local_addr() {
    if !have_tool(tool_exists("gtlsclient", &["--help"]), "gtlsclient (ngtcp2-client)") {
        return;
    }
    let (d, _w) = setup("gtlsmig");
    gtlsclient_get(&d, &["--change-local-addr=50ms"]);
    assert_eq!((d.reason("Orphan"), d.reason("Departed")), (0, 0));
    assert_fast_path_carried(&d, "gtlsclient migrating");
}

/// NAT rebinding (RFC 9000 §9.3): the client's port changes without any path
/// validation on its side. The request is delayed until after the rebinding: quinn
/// 0.11 migrates on the first non-probing packet from the new address, and
/// gtlsclient's simulation ignores everything arriving on the old port, so a
/// rebinding in the middle of a pure download leaves it sending only probing
/// frames, which quinn never follows (a quinn limitation, docs/worker.md).
#[test]
fn gtlsclient_nat_rebinding() {
    if !have_tool(tool_exists("gtlsclient", &["--help"]), "gtlsclient (ngtcp2-client)") {
        return;
    }
    let (d, _w) = setup("gtlsnat");
    gtlsclient_get(&d, &["--change-local-addr=50ms", "--nat-rebinding", "--delay-stream=300ms"]);
    assert_eq!((d.reason("Orphan"), d.reason("Departed")), (0, 0));
    assert_fast_path_carried(&d, "gtlsclient rebinding");
}

/// Runs the aioquic client for `/bytes/1048576` (with `extra` flags, at most 40 s):
/// whether it exited successfully (a whole response), its output line and the end of
/// its log.
fn aioquic_get(d: &Demux, extra: &[&str]) -> (bool, String, String) {
    let script = testkit::bin::python_script("aioquic_h3_get.py");
    let out_path = d.dir.join(format!("aioquic{}.out", extra.join("")));
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .args(["127.0.0.1", &d.addr.port().to_string(), &format!("/bytes/{MIB}")])
        .args(extra)
        .stdout(std::fs::File::create(&out_path).expect("aioquic output file"))
        .stderr(Stdio::piped());
    let (ok, log) = run_with_timeout(cmd, Duration::from_secs(40));
    (ok, std::fs::read_to_string(&out_path).unwrap_or_default(), log)
}

#[test]
fn aioquic_gets_1_mib() {
    if !testkit::bin::have_aioquic() {
        return;
    }
    let (d, _w) = setup("aioquic");
    let (ok, line, log) = aioquic_get(&d, &[]);
    assert!(
        ok && line.contains(&format!("status=200 bytes={MIB} ")) && line.contains("ok=True"),
        "aioquic: {line} {log}"
    );
    assert_fast_path_carried(&d, "aioquic");
}

/// A client offering QUIC v2 first (aioquic, RFC 9369) meets a data plane that
/// answers every new connection statelessly (`--retry always`). Its v2 Initial gets
/// the demux's Version Negotiation listing v1, the workers' version (the demux does
/// not mint a v2 Retry for workers that cannot serve v2, nor drop it); the client
/// starts again in v1 (RFC 9368 §2.2), gets a demux-minted Retry and fetches 1 MiB.
#[test]
fn aioquic_offering_v2_first_is_moved_to_v1_then_retried() {
    if !testkit::bin::have_aioquic() {
        return;
    }
    let d = Demux::start_with("aioquic-v2", &["--retry", "always"]);
    let _w: Vec<Worker> = (1..=2).map(|id| Worker::start_self_signed(&d, id, &[])).collect();
    d.wait_instances("2 placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    let (ok, line, log) = aioquic_get(&d, &["--v2-first"]);
    assert!(
        ok && line.contains(&format!("status=200 bytes={MIB} ")) && line.contains("ok=True"),
        "aioquic: {line} {log}"
    );
    assert!(line.contains("version=0x1"), "moved to v1: {line}");
    let s = d.status();
    let at = |p: &str| s.pointer(p).and_then(serde_json::Value::as_u64).unwrap_or(0);
    assert!(at("/retry/version_negotiations") >= 1, "the v2 Initial got a Version Negotiation: {s}");
    assert!(at("/retry/sent") >= 1, "the v1 Initial got a Retry: {s}");
}
