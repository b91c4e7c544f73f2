//! QUIC-LB connection IDs end to end (docs/adr/0007-quic-lb.md): a controller
//! rotated adr1 → quic-lb (keyed: Feistel) → quic-lb (plaintext) → adr1 → adr1 under
//! live quinn downloads and long-lived connections: 0 failed downloads, 0 Orphan,
//! no long-lived connection lost. At each quic-lb generation, aioquic clients and
//! an ngtcp2 client (`gtlsclient`, its own packet log) report the CIDs the server
//! chose; a QUIC-LB decoder that is not this
//! project's code (`testkit/py/quic_lb_ref.py`, written from draft-21) decodes every
//! one of them to the server id of the worker that served the request. A CID of the
//! generation's other config id is unroutable and counted (Orphan).
//! Run: `cargo test -p demux --test quic_lb`.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use proto::cid_format::CidFormat;
use proto::keyfile::KeyFile;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::*;

/// `rotate-keys [--cid-format F]`, retried while the pacing (3 × `--cid-lifetime`)
/// refuses it; the new generation.
fn rotate(c: &Controller, format: Option<&str>) -> u64 {
    let t0 = Instant::now();
    loop {
        let mut cmd = Command::new(DEMUX);
        cmd.arg("rotate-keys").arg("--state-dir").arg(&c.state);
        if let Some(f) = format {
            cmd.arg("--cid-format").arg(f);
        }
        let out = cmd.output().expect("run rotate-keys");
        if out.status.success() {
            return c.status_wait()["key_newest"].as_u64().unwrap();
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains("refusing to rotate"), "rotate-keys {format:?}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(20), "rotation refused for 20 s: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The newest generation's format, from the key file.
fn newest_format(c: &Controller) -> CidFormat {
    let text = std::fs::read_to_string(c.state.join("keys")).unwrap();
    KeyFile::parse(&text).unwrap().keys.newest.format
}

/// One aioquic GET through the appliance: (server id that served it, the CIDs the
/// server chose for the connection).
fn aioquic_server_cids(c: &Controller) -> (u64, Vec<String>) {
    let (id, cids, _) = aioquic_run(c);
    (id, cids)
}

/// [`aioquic_server_cids`] and the SCID of the Retry the client got, if any.
fn aioquic_run(c: &Controller) -> (u64, Vec<String>, Option<String>) {
    let script = testkit::bin::python_script("aioquic_server_cids.py");
    let addr = c.addr();
    let out = Command::new("python3")
        .arg(&script)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg("/bytes/100000")
        .output()
        .expect("run aioquic");
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "aioquic: {line} {}{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
            .to_string()
    };
    assert_eq!((field("status"), field("bytes"), field("ok")), ("200".into(), "100000".into(), "True".into()));
    let cids: Vec<String> = field("cids").split(',').map(str::to_owned).collect();
    assert!(cids.len() >= 2, "the server issued more than its handshake CID: {line}");
    let retry = Some(field("retry_scid")).filter(|r| r != "-");
    (field("server_id").parse().unwrap(), cids, retry)
}

/// One ngtcp2 (`gtlsclient`) GET of `/health` through the appliance: (server id that
/// served it, from the body `… server-id=N`; the CIDs the server chose, from the
/// client's own packet log: the SCIDs of its long headers and the CIDs of
/// NEW_CONNECTION_ID frames, RFC 9000 §19.15).
fn gtlsclient_server_cids(c: &Controller) -> (u64, Vec<String>) {
    let dir = testkit::temp_dir("quiclb-ngtcp2");
    let (qlog, dl) = (dir.join("client.qlog"), dir.join("dl"));
    std::fs::create_dir_all(&dl).unwrap();
    let port = c.addr().port().to_string();
    let mut cmd = Command::new("gtlsclient");
    cmd.args(["-q", "--exit-on-all-streams-close", "--timeout=30s"])
        .arg(format!("--qlog-file={}", qlog.display()))
        .arg(format!("--download={}", dl.display()))
        .args(["127.0.0.1", &port, &format!("https://localhost:{port}/health")]);
    let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(60));
    let body = std::fs::read_to_string(dl.join("health")).unwrap_or_default();
    assert!(ok, "gtlsclient: {out} {body}{}", c.logs());
    let id = body
        .split_whitespace()
        .find_map(|f| f.strip_prefix("server-id="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no server-id in /health: {body:?}"));
    let mut cids = Vec::new();
    let text = std::fs::read_to_string(&qlog).unwrap();
    for rec in text.split('\u{1e}').filter(|r| !r.trim().is_empty()) {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(rec) else { continue };
        if !e["name"].as_str().is_some_and(|n| n.ends_with("packet_received")) {
            continue;
        }
        let data = &e["data"];
        let scid = data["header"]["scid"].as_str().filter(|s| !s.is_empty());
        let frames = data["frames"].as_array().into_iter().flatten();
        let issued =
            frames.filter(|f| f["frame_type"] == "new_connection_id").filter_map(|f| f["connection_id"].as_str());
        for cid in scid.into_iter().chain(issued) {
            if !cids.iter().any(|c| c == cid) {
                cids.push(cid.to_owned());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(cids.len() >= 2, "the server issued more than its handshake CID: {cids:?} in {}", qlog.display());
    (id, cids)
}

/// The reference decoder's answers, one per request line.
fn reference(requests: &[String]) -> Vec<String> {
    let script = testkit::bin::python_script("quic_lb_ref.py");
    let mut child = Command::new("python3").arg(script).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
    }
    drop(stdin);
    let answers: Vec<String> = BufReader::new(child.stdout.take().unwrap()).lines().map(Result::unwrap).collect();
    assert!(child.wait().unwrap().success());
    assert_eq!(answers.len(), requests.len(), "{answers:?}");
    answers
}

fn config_line(f: &CidFormat) -> String {
    let CidFormat::QuicLb(p) = f else { panic!("not quic-lb: {f:?}") };
    let key = p.key.map_or("-".to_owned(), |k| k.iter().map(|b| format!("{b:02x}")).collect());
    format!("config {} {} {} {key}", p.config_id.get(), p.server_id_len, p.nonce_len)
}

/// The server-chosen CIDs of `runs` aioquic clients and one ngtcp2 client, decoded by
/// the reference decoder holding `format`'s config: each to the serving worker's id
/// (zero-padded to the config's server-id length, in hex). Returns the server ids seen.
fn check_cids_decode_to_the_server(c: &Controller, format: &CidFormat, runs: usize) -> Vec<u64> {
    let CidFormat::QuicLb(p) = format else { unreachable!() };
    let mut requests = vec![config_line(format)];
    let mut want = vec!["ok".to_owned()];
    let mut served = Vec::new();
    for run in 0..=runs {
        let (id, cids) = if run < runs { aioquic_server_cids(c) } else { gtlsclient_server_cids(c) };
        served.push(id);
        for cid in cids {
            assert_eq!(cid.len(), 24, "12-byte CIDs: {cid}");
            requests.push(format!("decode {cid}"));
            let sid = format!("{:0width$x}", id, width = 2 * usize::from(p.server_id_len));
            want.push(format!("sid {} {sid}", p.config_id.get()));
        }
    }
    let got = reference(&requests);
    assert_eq!(got, want, "reference decoder vs serving worker{}", c.logs());
    served
}

/// A short-header datagram whose DCID has generation 1's other config id (3): not
/// routable, counted as Orphan, answered with a stateless reset (RFC 9000 §10.3).
fn orphan_is_counted_and_reset(c: &Controller) {
    let orphans = c.reason("Orphan");
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Short header (0x40), then the 12-byte DCID: config 3, length 11.
    let mut d = vec![0x40, 0x60 | 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    d.resize(1200, 0);
    sock.send_to(&d, c.addr()).unwrap();
    let t0 = Instant::now();
    while c.reason("Orphan") != orphans + 1 {
        assert!(t0.elapsed() < Duration::from_secs(10), "not counted as Orphan: {}", c.lb_wait()["reasons"]);
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut buf = [0u8; 1500];
    let (n, from) = sock.recv_from(&mut buf).unwrap_or_else(|e| panic!("no stateless reset: {e}{}", c.logs()));
    // RFC 9000 §10.3: at least 21 bytes, a short header's first bits, from the service.
    assert!(n >= 21 && n < d.len() && buf[0] & 0xc0 == 0x40, "not a stateless reset: {:02x?}", &buf[..n]);
    assert_eq!(from, c.addr());
}

/// Retry (`--retry always`: every token-less Initial gets one from the data plane)
/// with a keyed quic-lb generation: the Retry's SCID, minted by the data plane for
/// the worker it places the client on, and every CID that worker then issues decode,
/// by the reference decoder, to the worker that served; an unroutable CID is reset.
#[test]
fn retry_and_resets_with_a_quic_lb_generation() {
    if !testkit::bin::have_aioquic() {
        return;
    }
    let _s = serial();
    let mut c = Controller::start("quiclbretry", 2, &["--retry", "always", "--limits", "off"]);
    // A worker of protocol version 3 (by hand: its Keys have no CID format) is
    // registered: the rotation to quic-lb is refused, naming it; nothing changes.
    {
        use proto::wire::{Announce, Message, Registration, Window};
        let ctl = seqpacket_connect(&c.control_sock());
        let v3 = Announce::plain(Window { oldest: 3, newest: 3 });
        send_raw(&ctl, &Registration::Hello { announce: v3, pid: std::process::id() }.to_record());
        assert_eq!(Registration::decode(&recv_raw(&ctl)), Ok(Registration::Welcome { version: 3, caps: 0 }));
        let assign = recv_raw(&ctl);
        assert!(matches!(Registration::decode(&assign), Ok(Registration::Assign { .. })), "{}", c.logs());
        assert_eq!(assign[1], 3, "Assign in version 3");
        let keys_before = std::fs::read_to_string(c.state.join("keys")).unwrap();
        let out = Command::new(DEMUX)
            .args(["rotate-keys", "--cid-format", "quic-lb server-id=2", "--state-dir"])
            .arg(&c.state)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rotation to quic-lb with a version 3 worker registered");
        assert!(err.contains("needs protocol version 4") && err.contains("a worker of protocol version 3"), "{err}");
        assert_eq!(std::fs::read_to_string(c.state.join("keys")).unwrap(), keys_before, "the key file changed");
        assert_eq!(newest_format(&c), CidFormat::Adr1);
    }
    // It has gone (its connection closed): the rotation goes through.
    wait_until("the version 3 worker gone", Duration::from_secs(20), || (c.workers().len() == 2).then_some(()));
    assert_eq!(rotate(&c, Some("quic-lb server-id=2 key=generate length=self")), 1);
    let format = newest_format(&c);
    let CidFormat::QuicLb(p) = format else { panic!("{format:?}") };
    let sent = c.lb_wait()["retry"]["sent"].as_u64().unwrap();
    let mut requests = vec![config_line(&format)];
    let mut want = vec!["ok".to_owned()];
    for _ in 0..4 {
        let (id, cids, retry) = aioquic_run(&c);
        let retry = retry.unwrap_or_else(|| panic!("no Retry with --retry always{}", c.logs()));
        for cid in std::iter::once(retry).chain(cids) {
            requests.push(format!("decode {cid}"));
            want.push(format!("sid {} {id:04x}", p.config_id.get()));
        }
    }
    assert_eq!(reference(&requests), want, "Retry SCIDs and CIDs vs the serving worker{}", c.logs());
    assert!(c.lb_wait()["retry"]["sent"].as_u64().unwrap() >= sent + 4);
    orphan_is_counted_and_reset(&c);
    assert_eq!((c.reason("Departed"), c.reason("Orphan")), (0, 1), "{}", c.logs());
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

#[test]
fn quic_lb_rotations_under_downloads_decode_with_an_independent_decoder() {
    if !testkit::bin::have_aioquic()
        || !testkit::have_tool(Command::new("gtlsclient").arg("--help").output().is_ok(), "gtlsclient (ngtcp2-client)")
    {
        return;
    }
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("quiclb", 2, &["--cid-lifetime", "3", "--limits", "off"]);
    assert_eq!(newest_format(&c), CidFormat::Adr1);
    assert!(std::fs::read_to_string(c.state.join("keys")).unwrap().starts_with("quicdemux-keys 3\n"));
    let workers: Vec<u64> = c.workers().iter().map(|w| w.0).collect();
    const LONG: usize = 4;
    let load = Load::start(&rt, c.addr(), &c.cert, LONG, "/bytes/2097152");
    let fresh = Downloads::start(&rt, &c, 2, 65_536);
    let fresh_connections = || fresh.ok.load(Ordering::Relaxed);
    load.wait_progress(LONG as u64, Duration::from_secs(30));

    // adr1 → quic-lb, keyed (12-byte CIDs: a 4-pass Feistel network).
    let g = rotate(&c, Some("quic-lb server-id=2 key=generate length=self"));
    assert_eq!(g, 1);
    let keyed = newest_format(&c);
    let CidFormat::QuicLb(kp) = keyed else { panic!("{keyed:?}") };
    assert_eq!((kp.config_id.get(), kp.key.is_some(), kp.self_encoded_len), (2, true, true));
    let s = c.status_wait();
    assert_eq!(s["key_newest_format"], "quic-lb config=2 server-id=2 nonce=9 key=set length=self", "{s}");
    let lb = c.lb_wait();
    assert_eq!((&lb["key_newest"], &lb["key_newest_format"]), (&1.into(), &"quic-lb".into()), "{lb}");
    assert!(std::fs::read_to_string(c.state.join("keys")).unwrap().starts_with("quicdemux-keys 4\n"));
    let served = check_cids_decode_to_the_server(&c, &keyed, 4);
    assert!(served.iter().all(|id| workers.contains(id)), "{served:?} not in {workers:?}");
    // The kernel runs no AES: the keyed generation's datagrams take the user path,
    // counted by the program.
    let fast = |c: &Controller, what: &str| c.lb_wait().pointer(&format!("/fast_path/{what}")).and_then(|v| v.as_u64());
    let encrypted = fast(&c, "to_demux/quic_lb_encrypted");
    assert!(encrypted.is_some_and(|n| n > 0), "keyed quic-lb datagrams counted by the program: {encrypted:?}");

    // A short-header datagram of generation 1's other config id (3): unroutable,
    // counted as Orphan (and answered by a stateless reset).
    orphan_is_counted_and_reset(&c);
    let lost_before = c.reason("Orphan") + c.reason("Departed");

    // quic-lb → another quic-lb config (plaintext, 3-byte server ids), then back to
    // adr1, twice, so no quic-lb generation is left.
    let g = rotate(&c, Some("quic-lb server-id=3"));
    assert_eq!(g, 2);
    let plain = newest_format(&c);
    let CidFormat::QuicLb(pp) = plain else { panic!("{plain:?}") };
    assert_eq!((pp.config_id.get(), pp.server_id_len, pp.nonce_len, pp.key), (4, 3, 8, None));
    let served = check_cids_decode_to_the_server(&c, &plain, 4);
    assert!(served.iter().all(|id| workers.contains(id)), "{served:?} not in {workers:?}");
    // Generations 2 (plaintext) and 1 (keyed) are live, no adr1 one: every datagram
    // the program hands to a worker now is a plaintext QUIC-LB one.
    let steered = fast(&c, "datagrams").unwrap();
    wait_until("plaintext quic-lb datagrams steered in the kernel", Duration::from_secs(30), || {
        (fast(&c, "datagrams").unwrap() >= steered + 100).then_some(())
    });
    let before = fresh_connections();
    wait_until("fresh connections on the plaintext generation", Duration::from_secs(30), || {
        (fresh_connections() >= before + 4).then_some(())
    });
    assert_eq!(rotate(&c, Some("adr1")), 0);
    assert_eq!(newest_format(&c), CidFormat::Adr1);
    assert_eq!(c.lb_wait()["key_previous_format"], "quic-lb");
    // Without --cid-format the next generation keeps adr1.
    assert_eq!(rotate(&c, None), 1);
    assert_eq!(newest_format(&c), CidFormat::Adr1);
    let text = std::fs::read_to_string(c.state.join("keys")).unwrap();
    assert!(text.starts_with("quicdemux-keys 3\n"), "no quic-lb generation left: version 3 again\n{text}");
    // adr1 CIDs are not QUIC-LB ones of the last config.
    let (_, cids) = aioquic_server_cids(&c);
    let mut req = vec![config_line(&plain)];
    req.extend(cids.iter().map(|cid| format!("decode {cid}")));
    let got = reference(&req);
    assert!(got[1..].iter().all(|l| l == "unroutable unknown-config"), "{got:?}");

    let before = fresh_connections();
    wait_until("fresh connections on adr1", Duration::from_secs(30), || {
        (fresh_connections() >= before + 4).then_some(())
    });
    load.wait_progress(load.ok() + LONG as u64, Duration::from_secs(60));
    let lost = c.reason("Orphan") + c.reason("Departed") - lost_before;
    let (connections, retried) =
        (load.stats.connections.load(Ordering::Relaxed), load.stats.retried.load(Ordering::Relaxed));
    let (ok, failed, f) = load.finish(&rt);
    assert!(failed == 0 && f.is_empty(), "long downloads: {failed} failed ({ok} ok): {f:?}{}", c.logs());
    assert_eq!((connections, retried), (LONG as u64, 0), "long-lived clients reconnected{}", c.logs());
    let (fok, ff) = fresh.finish(&rt);
    assert!(ff.is_empty() && fok > 20, "fresh downloads: {} failed ({fok} ok): {ff:?}{}", ff.len(), c.logs());
    assert_eq!(lost, 0, "connections were orphaned: {}{}", c.lb_wait()["reasons"], c.logs());
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}
