//! Owner Initials (docs/adr/0003-demux-retry.md "Initials on live DCIDs"), end to end:
//! a real `demux dataplane` (one shard, `--limit-burst 2 --limit-rate 1
//! --pressure-retry-above 100`) and two real `worker`s (`--max-handshakes 0`: no cap
//! of their own, so what bounds worker 1 is what the data plane lets through) on
//! loopback. Token-less client Initials on live DCIDs of worker 1 — garbage (does not
//! open under its DCID's keys) and CRYPTO at offset 1 (opens, starts nothing; quinn
//! makes a handshake of it) — with CIDs minted from the key file, as a harvester would
//! copy them from Retries or server flights. Three phases:
//! - A: 400 from one source. Exactly `burst` reach worker 1 (GCRA: a source whose
//!   Initials fall within D ms gets at most `burst + ⌊D / T⌋` through, T = 1000 / rate
//!   ms), the rest are `rate_limited`; worker 1's datagram count says the same.
//! - B: garbage, 4 each from 10 000 spoofed sources (127.1.0.0 onwards: one socket,
//!   the source set per datagram with IP_PKTINFO), each source's back to back: at most
//!   `10 000 × burst` reach worker 1 (fewer where two sources share sketch lanes: the
//!   sketches only err on the strict side), counted, and worker 1's datagram count
//!   says the same. Garbage makes no handshake, so only the limits act.
//! - C: CRYPTO-at-offset-1 and garbage, 6 each from 10 000 other spoofed sources, while
//!   the legitimate clients below connect (they also run alone first, where each of
//!   their Initials on a server's CID must be a follow-up or carry a token):
//!   at most `10 000 × burst` reach worker 1;
//!   its handshakes in progress (its `Load` reports, in lb-status) never exceed what
//!   was admitted; pressure engages (`dropped_pressure`) once they pass 100; they
//!   drain after the flood.
//!
//! Every flood Initial is counted under one `owner_initial.<outcome>` (an admitted one
//! also counts as `Owner`); a kernel drop before the shard read it would count under
//! `socket_drops`.
//! - meanwhile aioquic and ngtcp2 (`gtlsclient`) clients whose ClientHello spans two
//!   Initial packets (aioquic: a 1 216-byte GREASE key share, the size of an
//!   X25519MLKEM768 one; gtlsclient: an FFDHE8192 key share, once more with a
//!   HelloRetryRequest) complete HTTP/3 downloads. The two-packet ClientHello is
//!   checked in each client's own packet log (qlog).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proto::limits::OwnerInitialOutcome as Outcome;
use proto::{KeySet, ServerId};
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "appliance_support/mod.rs"]
mod support;
use support::*;

/// The data plane's limits here: a source gets BURST at once, then one per T_MS.
const BURST: u64 = 2;
const RATE: u64 = 1;
const T_MS: u64 = 1000 / RATE;
/// `--pressure-retry-above`: worker 1's reported handshakes beyond which its
/// token-less Initials are refused (new ones get a Retry, unproven ones a drop).
const PRESSURE: u64 = 100;
const OWNER: u16 = 1;
/// Phase A: Initials from one source.
const ONE_SOURCE: u64 = 400;
/// Phases B and C: spoofed sources, Initials each (back to back), datagrams per second.
const SOURCES: u32 = 10_000;
const GARBAGE_PER_SOURCE: u64 = 4;
const MIXED_PER_SOURCE: u64 = 6;
const FLOOD_RATE: u64 = 12_000;

/// The unproven outcomes: every flood Initial ends as one of them.
const UNPROVEN: [Outcome; 5] = [
    Outcome::Admitted,
    Outcome::DroppedPressure,
    Outcome::DroppedRetry,
    Outcome::HandshakeLimited,
    Outcome::RateLimited,
];

fn outcome(v: &Value, o: Outcome) -> u64 {
    u(v, &format!("/owner_initial/{}", o.name()))
}

fn unproven(v: &Value) -> u64 {
    UNPROVEN.iter().map(|&o| outcome(v, o)).sum()
}

fn instance(v: &Value, id: u16) -> Value {
    v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["server_id"] == u64::from(id)))
        .cloned()
        .unwrap_or(Value::Null)
}

fn inst(v: &Value, id: u16, field: &str) -> u64 {
    u(&instance(v, id), &format!("/{field}"))
}

/// The Initials a harvester sends: on a fresh CID of `owner` each, 1200 bytes, no token.
struct Harvested {
    keys: KeySet,
    x: u64,
}

impl Harvested {
    fn new(dir: &Path, seed: u64) -> Harvested {
        let text = std::fs::read_to_string(dir.join("keys")).expect("key file");
        let keys = proto::keyfile::KeyFile::parse(&text).expect("key file").key_set().expect("key set");
        Harvested { keys, x: 0x9e37_79b9_7f4a_7c15 ^ seed }
    }

    fn cid(&mut self) -> [u8; 12] {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        let mut r = [0u8; 10];
        r[..8].copy_from_slice(&self.x.to_le_bytes());
        self.keys.encode(ServerId(OWNER), &r)
    }

    /// Encrypted under its own DCID's keys, CRYPTO at offset 1 (RFC 9000 §19.6): opens,
    /// starts no connection; the owner's quinn makes a handshake waiting for offset 0.
    fn offset1(&mut self) -> Vec<u8> {
        proto::initial::build_client_initial(1, &self.cid(), &[0x5c; 8], &[], 0, &[6, 1, 4, 1, 0, 0, 0], 1200).unwrap()
    }

    /// The same with one ciphertext byte flipped: does not open (RFC 9001 §5.3).
    fn garbage(&mut self) -> Vec<u8> {
        let mut d = self.offset1();
        d[1100] ^= 0x20;
        d
    }

    /// The k-th Initial of a source: offset 1 first, then alternating.
    fn nth(&mut self, k: u64) -> Vec<u8> {
        if k.is_multiple_of(2) {
            self.offset1()
        } else {
            self.garbage()
        }
    }
}

/// Sends `per_source` Initials (`garbage_only`, or offset 1 and garbage alternating)
/// from each of `SOURCES` spoofed addresses `base + i`, a source's back to back,
/// `FLOOD_RATE` datagrams per second in all. (datagrams the kernel took, time taken)
fn spoofed_flood(
    mut harvest: Harvested,
    target: SocketAddr,
    base: Ipv4Addr,
    per_source: u64,
    garbage_only: bool,
) -> (u64, Duration) {
    let spoof = Spoofer::new(target);
    let mut sent = 0u64;
    let start = Instant::now();
    for src in 0..SOURCES {
        let ip = Ipv4Addr::from(u32::from(base) + src);
        for k in 0..per_source {
            let d = if garbage_only { harvest.garbage() } else { harvest.nth(k) };
            if spoof.send(ip, &d) {
                sent += 1;
            }
        }
        let due = start + Duration::from_micros(u64::from(src + 1) * per_source * 1_000_000 / FLOOD_RATE);
        if let Some(w) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
    }
    (sent, start.elapsed())
}

/// Waits until `sent` flood Initials since `before` are counted (under an unproven
/// outcome, or as a kernel socket drop); the status then.
fn counted(s: &Setup, before: &Value, sent: u64) -> Value {
    testkit::wait_until("the flood counted", Duration::from_secs(60), || {
        let v = s.status();
        let drops = u(&v, "/socket_drops") - u(before, "/socket_drops");
        (unproven(&v) - unproven(before) + drops >= sent).then_some(v)
    })
}

/// Sends datagrams from any 127/8 source: a wildcard-bound socket with IP_PKTINFO.
struct Spoofer {
    sock: UdpSocket,
    to: socket2::SockAddr,
    batch: std::cell::RefCell<sys::mmsg::SendMmsg>,
}

impl Spoofer {
    fn new(target: SocketAddr) -> Spoofer {
        Spoofer {
            sock: UdpSocket::bind("0.0.0.0:0").expect("bind"),
            to: socket2::SockAddr::from(target),
            batch: std::cell::RefCell::new(sys::mmsg::SendMmsg::new(1, 1)),
        }
    }

    fn send(&self, src: Ipv4Addr, d: &[u8]) -> bool {
        let mut mm = self.batch.borrow_mut();
        let mut batch = mm.batch();
        let meta = sys::mmsg::SendMeta { to: Some(&self.to), source: Some(IpAddr::V4(src)), segment_size: None };
        batch.push(&[d], meta) && batch.send_from(&self.sock, 0, 0).is_ok_and(|n| n == 1)
    }
}

/// From an ngtcp2 qlog (JSON text sequences): (the distinct CRYPTO offsets of the
/// Initial packets sent before the client first heard from the server — a
/// retransmission repeats one — and the end of their CRYPTO data: its ClientHello in
/// packets and bytes; whether it later sent CRYPTO in an Initial beyond that end: a
/// second ClientHello, after HelloRetryRequest).
fn qlog_first_flight(path: &Path) -> (usize, u64, bool) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (mut offsets, mut bytes, mut heard, mut second) = (std::collections::BTreeSet::new(), 0, false, false);
    for rec in text.split('\u{1e}').filter(|r| !r.trim().is_empty()) {
        let Ok(e) = serde_json::from_str::<Value>(rec) else { continue };
        let name = e["name"].as_str().unwrap_or("");
        if name.ends_with("packet_received") {
            heard = true;
        }
        if !name.ends_with("packet_sent") || e["data"]["header"]["packet_type"] != "initial" {
            continue;
        }
        let crypto: Vec<(u64, u64)> = e["data"]["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["frame_type"] == "crypto")
            .map(|f| (f["offset"].as_u64().unwrap_or(0), f["length"].as_u64().unwrap_or(0)))
            .collect();
        if crypto.is_empty() {
            continue;
        }
        if !heard {
            offsets.extend(crypto.iter().map(|c| c.0));
            bytes = crypto.iter().map(|c| c.0 + c.1).fold(bytes, u64::max);
        } else if crypto.iter().any(|c| c.0 >= bytes) {
            second = true;
        }
    }
    (offsets.len(), bytes, second)
}

/// The legitimate clients: each downloads /bytes/4096 through the data plane with a
/// ClientHello of two Initial packets. Their report lines; a failure panics.
fn legitimate_clients(dir: &Path, target: SocketAddr) -> Vec<String> {
    let port = target.port().to_string();
    let mut lines = Vec::new();
    // aioquic, a 1 216-byte GREASE key share.
    let script = testkit::bin::python_script("aioquic_big_hello.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args(["127.0.0.1", &port, "/bytes/4096"]);
    let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(ok && out.contains("status=200") && out.contains("bytes=4096"), "aioquic: {out}");
    let packets: u64 =
        out.split_whitespace().find_map(|w| w.strip_prefix("ch_packets=")).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(packets >= 2, "aioquic's ClientHello in {packets} Initial packet(s): {out}");
    lines.push(format!("aioquic: {}", out.trim()));
    // gtlsclient: FFDHE8192 (1 024-byte key share) and secp384r1, which the workers'
    // rustls takes; then FFDHE8192 and secp521r1 shares, neither of which it takes:
    // a HelloRetryRequest for secp256r1, and a second ClientHello on the server's CID.
    for (tag, groups, hrr) in [
        ("ffdhe8192", "-GROUP-ALL:+GROUP-FFDHE8192:+GROUP-SECP384R1", false),
        ("ffdhe8192-hrr", "-GROUP-ALL:+GROUP-FFDHE8192:+GROUP-SECP521R1:+GROUP-SECP256R1", true),
    ] {
        let dl = dir.join(format!("dl-{tag}"));
        std::fs::create_dir_all(&dl).expect("download dir");
        let qlog = dir.join(format!("{tag}.qlog"));
        let mut cmd = Command::new("gtlsclient");
        cmd.args(["-q", "--exit-on-all-streams-close", "--timeout=30s"])
            .arg(format!("--groups={groups}"))
            .arg(format!("--qlog-file={}", qlog.display()))
            .arg(format!("--download={}", dl.display()))
            .args(["127.0.0.1", &port, &format!("https://localhost:{port}/bytes/4096")]);
        let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(60));
        let len = std::fs::metadata(dl.join("4096")).map(|m| m.len()).unwrap_or(0);
        assert!(ok && len == 4096, "gtlsclient {tag}: ok={ok} len={len}: {out}");
        let (packets, bytes, later) = qlog_first_flight(&qlog);
        assert!(packets >= 2, "gtlsclient {tag}: ClientHello of {bytes} bytes in {packets} Initial packet(s)");
        assert_eq!(later, hrr, "gtlsclient {tag}: a second ClientHello after HelloRetryRequest");
        lines.push(format!(
            "gtlsclient {tag}: ClientHello {bytes} bytes in {packets} Initials, second ClientHello {later}"
        ));
    }
    lines
}

#[test]
fn owner_initials_meet_the_limits_while_big_client_hellos_complete() {
    let have_gtls = Command::new("gtlsclient").arg("--help").output().is_ok();
    if !testkit::have_tool(have_gtls, "gtlsclient (ngtcp2-client)") || !testkit::bin::have_aioquic() {
        return;
    }
    let flags = [
        "--limit-burst",
        &BURST.to_string(),
        "--limit-rate",
        &RATE.to_string(),
        "--retry",
        "auto",
        "--retry-above",
        "1000000",
        "--pressure-retry-above",
        &PRESSURE.to_string(),
        "--pressure-drop-above",
        "1000000",
    ]
    .map(String::from);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let s = start("owner-initials", &flags, 2, &["--max-handshakes", "0"]);
    let mut harvest = Harvested::new(&s.dir, 1);

    // ---- The legitimate clients alone: every Initial of theirs on a server's CID
    // (the ACK of the server's Initial, the second ClientHello, or any Initial after
    // a Retry) is proven — a follow-up of their placement, or its token — and none
    // meets the limits. The first two are within 127.0.0.1's burst: placed. ----
    let before = s.status();
    for l in legitimate_clients(&s.dir, s.addr) {
        eprintln!("alone: {l}");
    }
    let v = s.status();
    let d = |o| outcome(&v, o) - outcome(&before, o);
    eprintln!(
        "alone: follow_up {}, token {}, placed {}, unproven {}",
        d(Outcome::FollowUp),
        d(Outcome::Token),
        d(Outcome::Placed),
        unproven(&v) - unproven(&before)
    );
    assert_eq!(unproven(&v), unproven(&before), "a legitimate Initial met the limits: {v}");
    assert!(d(Outcome::FollowUp) >= 2 && d(Outcome::FollowUp) + d(Outcome::Token) >= 3, "{v}");

    // ---- Phase A: one source. ----
    let before = s.status();
    let sock = UdpSocket::bind("127.0.0.50:0").expect("bind");
    let t0 = Instant::now();
    for k in 0..ONE_SOURCE {
        sock.send_to(&harvest.nth(k), s.addr).expect("send");
    }
    let a = testkit::wait_until("phase A counted", Duration::from_secs(30), || {
        let v = s.status();
        (unproven(&v) - unproven(&before) >= ONE_SOURCE).then_some(v)
    });
    let d_ms = t0.elapsed().as_millis() as u64;
    let d = |o| outcome(&a, o) - outcome(&before, o);
    let allowed = BURST + d_ms / T_MS;
    let admitted = d(Outcome::Admitted);
    let reached = inst(&a, OWNER, "datagrams") - inst(&before, OWNER, "datagrams");
    eprintln!(
        "one source, {ONE_SOURCE} Initials in {d_ms} ms: admitted {admitted} (allowed {allowed}), rate_limited {}, \
         worker 1 received {reached}",
        d(Outcome::RateLimited)
    );
    assert_eq!(unproven(&a) - unproven(&before), ONE_SOURCE, "each counted once: {a}");
    assert!(admitted <= allowed && admitted >= BURST, "admitted {admitted}, allowed {allowed}: {a}");
    assert_eq!(d(Outcome::RateLimited), ONE_SOURCE - admitted, "the rest rate-limited: {a}");
    assert_eq!(reached, admitted, "worker 1 got exactly what was admitted: {a}");
    assert_eq!(inst(&a, 2, "datagrams"), inst(&before, 2, "datagrams"), "worker 2 got none");
    for o in [Outcome::Token, Outcome::Placed, Outcome::FollowUp] {
        assert_eq!(d(o), 0, "{}: {a}", o.name());
    }
    assert_eq!(u(&a, "/reasons/Owner") - u(&before, "/reasons/Owner"), admitted, "{a}");
    // Its Load reports (every 250 ms) show at most the admitted offset-1 Initials.
    std::thread::sleep(Duration::from_millis(700));
    let hs = inst(&s.status(), OWNER, "handshakes");
    eprintln!("worker 1 handshakes after phase A: {hs}");
    assert!(hs <= admitted.div_ceil(2), "handshakes {hs} > admitted offset-1 Initials");

    // ---- Phase B: garbage from 10 000 spoofed sources; only the limits act. ----
    let before = s.status();
    let (sent, took) =
        spoofed_flood(Harvested::new(&s.dir, 2), s.addr, Ipv4Addr::new(127, 1, 0, 0), GARBAGE_PER_SOURCE, true);
    let v = counted(&s, &before, sent);
    let d = |o| outcome(&v, o) - outcome(&before, o);
    let (admitted, socket_drops) = (d(Outcome::Admitted), u(&v, "/socket_drops") - u(&before, "/socket_drops"));
    let reached = inst(&v, OWNER, "datagrams") - inst(&before, OWNER, "datagrams");
    let allowed = u64::from(SOURCES) * BURST;
    eprintln!(
        "B: {SOURCES} spoofed sources, {sent} garbage Initials in {took:?}: admitted {admitted} (allowed {allowed}), \
         rate_limited {}, socket drops {socket_drops}, worker 1 received {reached}",
        d(Outcome::RateLimited)
    );
    assert!(sent >= u64::from(SOURCES) * GARBAGE_PER_SOURCE * 99 / 100, "flood sent only {sent}");
    assert_eq!(unproven(&v) - unproven(&before) + socket_drops, sent, "each counted once: {v}");
    // A source's Initials go out within microseconds of each other, so the shard
    // charges them within a second of each other: `burst` each at most.
    assert!(admitted <= allowed, "admitted {admitted} > {SOURCES} × {BURST}: {v}");
    assert!(admitted >= allowed * 9 / 10 - socket_drops, "the limits, not something else, decided: {v}");
    assert_eq!(d(Outcome::RateLimited), unproven(&v) - unproven(&before) - admitted, "the rest rate-limited: {v}");
    assert_eq!(reached, admitted, "worker 1 got exactly what was admitted: {v}");

    // ---- Phase C: offset-1 and garbage from 10 000 other spoofed sources, and the
    // legitimate clients meanwhile. ----
    let before = s.status();
    let peak = Arc::new(AtomicU64::new(0));
    let flooding = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, flooding, control) = (peak.clone(), flooding.clone(), s.control.clone());
        std::thread::spawn(move || {
            let status = || {
                let out = Command::new(DEMUX)
                    .args(["lb-status", "--json", "--control-socket"])
                    .arg(&control)
                    .output()
                    .expect("lb-status");
                serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
            };
            while flooding.load(Ordering::Relaxed) {
                peak.fetch_max(inst(&status(), OWNER, "handshakes"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let (target, harvest) = (s.addr, Harvested::new(&s.dir, 3));
    let flood = std::thread::spawn(move || {
        spoofed_flood(harvest, target, Ipv4Addr::new(127, 2, 0, 0), MIXED_PER_SOURCE, false)
    });
    std::thread::sleep(Duration::from_millis(300));
    let legit = legitimate_clients(&s.dir, s.addr);
    let (sent, took) = flood.join().expect("flood");
    let c = counted(&s, &before, sent);
    flooding.store(false, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let peak = peak.load(Ordering::Relaxed);
    let d = |o| outcome(&c, o) - outcome(&before, o);
    let socket_drops = u(&c, "/socket_drops") - u(&before, "/socket_drops");
    let counted = unproven(&c) - unproven(&before);
    let admitted = d(Outcome::Admitted);
    let by_outcome: Vec<String> = Outcome::ALL.iter().map(|&o| format!("{} {}", o.name(), d(o))).collect();
    eprintln!(
        "C: {SOURCES} spoofed sources, {sent} Initials in {took:?}: {}; socket drops {socket_drops}; admitted \
         {admitted} of {allowed} allowed; worker 1 handshakes peak {peak}",
        by_outcome.join(", ")
    );
    for l in &legit {
        eprintln!("{l}");
    }
    assert!(sent >= u64::from(SOURCES) * MIXED_PER_SOURCE * 99 / 100, "flood sent only {sent}");
    // Each flood Initial is counted under an unproven outcome or was dropped by the
    // kernel before the shard read it; the legitimate clients' Initials on live DCIDs
    // were all proven (a follow-up or a token): with no kernel drops, exactly.
    assert!(counted + socket_drops >= sent && counted <= sent, "counted {counted} + drops {socket_drops} vs {sent}");
    if socket_drops == 0 {
        assert_eq!(counted, sent, "{c}");
    }
    assert!(admitted <= allowed, "admitted {admitted} > {SOURCES} × {BURST}: {c}");
    assert!(d(Outcome::RateLimited) > 0 && d(Outcome::DroppedPressure) > 0, "limits and pressure both met: {c}");
    // Worker 1's handshakes never exceeded what the data plane let through (+ the
    // legitimate clients' and phase A's one).
    assert!(peak <= admitted + 4, "worker 1 handshakes peaked at {peak}, {admitted} admitted");
    assert!(peak > PRESSURE, "the flood's offset-1 Initials made handshakes (peak {peak}): pressure was met");
    // The legitimate clients' Initials on the servers' CIDs — their ACKs, the second
    // ClientHello, post-Retry Initials — were follow-ups or carried a token.
    assert!(d(Outcome::FollowUp) + d(Outcome::Token) >= 3, "{c}");
    // After the flood the handshakes drain (worker handshake timeout 5 s).
    testkit::wait_until("worker 1 handshakes drain", Duration::from_secs(15), || {
        (inst(&s.status(), OWNER, "handshakes") == 0).then_some(())
    });
    let text = s.lb_status(false);
    assert!(text.contains(&format!("rate_limited {}", outcome(&c, Outcome::RateLimited))), "lb-status: {text}");
    let _ = std::fs::remove_dir_all(&s.dir);
}
