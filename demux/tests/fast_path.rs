//! The kernel fast path through a real data plane (docs/adr/0004-kernel-fast-path.md):
//! the SK_REUSEPORT program steers a live worker's short headers to the worker's own
//! socket; everything else takes the user path, exactly as without it.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use proto::keyfile::KeyFile;
use std::time::{Duration, Instant};

/// Waits (bounded) until the worker's fast sockets have delivered `n` datagrams in all.
fn fast_received(w: &Worker, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(w.fast_datagrams());
        assert!(Instant::now() < deadline, "worker {}: {} of {n} fast datagrams", w.server_id, got.len());
        std::thread::sleep(Duration::from_millis(2));
    }
    got
}

/// Whether this data plane runs the fast path; prints why when it does not.
fn active_or_skip(d: &Demux) -> bool {
    let fp = &d.status()["fast_path"];
    if fp["active"].as_bool() == Some(true) {
        return true;
    }
    testkit::skip(&format!("the kernel fast path is not active here: {}", fp["reason"]));
    false
}

/// Established short headers of two live workers reach each worker's own socket and
/// never the data connections; long headers keep the user path. Counted per
/// instance and in total.
#[test]
fn short_headers_reach_the_owners_socket() {
    let d = Demux::start("uring", "0");
    if !active_or_skip(&d) {
        return;
    }
    let mut rng = Rng(41);
    let a = Worker::connect_fast(&d, 21, true);
    let b = Worker::connect_fast(&d, 22, true);
    d.wait_instances(&[(21, true), (22, true)]);
    assert_eq!(a.fast.len(), 1, "one fast socket per listen address");
    assert_eq!(a.fast[0].0, d.addr(), "bound to the listen address");
    let c = client();
    let (na, nb) = (300, 200);
    for i in 0..na + nb {
        let id = if i < na { 21 } else { 22 };
        let mut p = short(&d.cid(id, &mut rng), 100, &mut rng);
        p[13] = (i % 251) as u8;
        c.send_to(&p, d.addr()).unwrap();
    }
    let ga = fast_received(&a, na);
    let gb = fast_received(&b, nb);
    let cid_id = |p: &Vec<u8>| {
        let mut cid = [0u8; 12];
        cid.copy_from_slice(&p[1..13]);
        d.key_set().decode(&cid).unwrap().server_id.0
    };
    assert!(ga.iter().all(|p| cid_id(p) == 21), "only worker 21's CIDs on its socket");
    assert!(gb.iter().all(|p| cid_id(p) == 22), "only worker 22's CIDs on its socket");
    // A Handshake packet to a live id is not a short header: the user path routes it.
    c.send_to(&long(HANDSHAKE, &d.cid(21, &mut rng), 1200, &mut rng), d.addr()).unwrap();
    wait_for("long header over the data connection", || a.datagrams() == 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(a.datagrams() + b.datagrams(), 1, "short headers never took the user path");
    assert!(a.fast_datagrams().is_empty() && b.fast_datagrams().is_empty(), "nothing more on the fast sockets");
    let s = d.status();
    assert_eq!(u64_at(&s, "/fast_path/datagrams"), (na + nb) as u64);
    assert_eq!(u64_at(&s, "/fast_path/to_demux/long_header"), 1);
    assert_eq!(u64_at(instance(&s, 21), "/fast_datagrams"), na as u64);
    assert_eq!(u64_at(instance(&s, 22), "/fast_datagrams"), nb as u64);
    assert_eq!(u64_at(&s, "/datagrams_in"), 1, "the data plane saw only the long header");
    let text =
        std::process::Command::new(BIN).args(["lb-status", "--control-socket"]).arg(&d.control).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("fast path: on (mode auto)  program gso-walk  to workers {}", na + nb)), "{text}");
}

/// A worker whose own socket is gone (crashed, or closed it) keeps its established
/// traffic through the user path; once its data connection closes too, its
/// datagrams are `Departed` for a serving instance (which answers with a stateless
/// reset), as ADR 0001's routing rules say.
#[test]
fn closed_worker_socket_falls_back_to_the_user_path() {
    let d = Demux::start("uring", "0");
    if !active_or_skip(&d) {
        return;
    }
    let mut rng = Rng(42);
    let mut a = Worker::connect_fast(&d, 31, true);
    let b = Worker::connect_fast(&d, 32, true);
    d.wait_instances(&[(31, true), (32, true)]);
    let c = client();
    c.send_to(&short(&d.cid(31, &mut rng), 100, &mut rng), d.addr()).unwrap();
    fast_received(&a, 1);
    let inode = socket_inode(&a.fast[0].1);
    assert!(udp_socket_exists(inode), "the kernel lists worker 31's fast socket");
    a.fast.clear(); // closes worker 31's fast socket: the kernel drops it from the map
                    // ... once the last copy of its fd is gone. A child another test thread is forking
                    // holds a copy until its exec, and datagrams steered meanwhile would be lost.
    wait_for("worker 31's fast socket released", || !udp_socket_exists(inode));
    for _ in 0..20 {
        c.send_to(&short(&d.cid(31, &mut rng), 100, &mut rng), d.addr()).unwrap();
    }
    wait_for("owner over the data connection", || a.datagrams() == 20);
    let s = d.status();
    assert_eq!(u64_at(&s, "/fast_path/to_demux/select_failed"), 20);
    assert_eq!(reason(&s, "Owner"), 20);
    a.close();
    d.wait_instances(&[(32, true)]);
    for _ in 0..10 {
        c.send_to(&short(&d.cid(31, &mut rng), 100, &mut rng), d.addr()).unwrap();
    }
    wait_for("orphans at the serving instance", || b.datagrams() == 10);
    let s = d.status();
    assert_eq!((reason(&s, "Departed"), reason(&s, "Orphan")), (10, 0));
    assert_eq!(u64_at(&s, "/fast_path/to_demux/not_live"), 10, "a dead id is out of the map");
}

/// A generation whose PRF is hmac-sha256 (a version-1 key file) cannot be decoded in
/// the kernel: every datagram takes the user path, counted as unknown_generation.
#[test]
fn hmac_generation_takes_the_user_path() {
    let d = Demux::start("uring", "0");
    if !active_or_skip(&d) {
        return;
    }
    // Rewrite the key file as version 1 (hmac-sha256) and reload it with SIGHUP.
    let k = &d.keys;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let v1 = format!(
        "quicdemux-keys 1\nnewest 0 {}\nreset {}\ntoken {}\nrendezvous {}\n",
        hex(&k.keys.newest.secret),
        hex(&k.reset_key),
        hex(&k.token_key),
        hex(&k.rendezvous_key)
    );
    let parsed = KeyFile::parse(&v1).unwrap();
    std::fs::write(d.dir.join("keys"), &v1).unwrap();
    // SAFETY: signals our own child.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) };
    let ks = parsed.key_set().unwrap();
    let a = Worker::connect_fast(&d, 41, true);
    d.wait_instances(&[(41, true)]);
    let mut rng = Rng(43);
    let c = client();
    let probe = short(&ks.encode(proto::ServerId(41), &[7; 10]), 100, &mut rng);
    // Until the SIGHUP is handled the probe decodes to a random id; either way it
    // takes the user path and reaches the only serving instance, 41.
    let probes = std::cell::Cell::new(0);
    wait_for("v1 keys loaded in the kernel", || {
        c.send_to(&probe, d.addr()).unwrap();
        probes.set(probes.get() + 1);
        std::thread::sleep(Duration::from_millis(5));
        u64_at(&d.status(), "/fast_path/to_demux/unknown_generation") > 0
    });
    // Probes still in flight would land after `n0` below: wait for every one.
    wait_for("every probe delivered", || a.datagrams() == probes.get());
    let before = u64_at(&d.status(), "/fast_path/to_demux/unknown_generation");
    let n0 = a.datagrams();
    for _ in 0..10 {
        let mut r = [0u8; 10];
        rng.fill(&mut r);
        c.send_to(&short(&ks.encode(proto::ServerId(41), &r), 100, &mut rng), d.addr()).unwrap();
    }
    wait_for("user path", || a.datagrams() == n0 + 10);
    assert!(a.fast_datagrams().is_empty(), "an hmac generation is never steered in the kernel");
    assert_eq!(u64_at(&d.status(), "/fast_path/to_demux/unknown_generation"), before + 10);
}

/// `--fast-path off`: no program, `FastSockets` empty, status says why.
#[test]
fn fast_path_off() {
    let d = Demux::start_with("uring", "0", &["--fast-path", "off"]);
    let fp = &d.status()["fast_path"];
    assert_eq!(fp["active"], false);
    assert_eq!(fp["reason"], "--fast-path off");
    let a = Worker::connect_fast(&d, 51, true);
    assert!(a.fast.is_empty(), "no fast sockets without the fast path");
    d.wait_instances(&[(51, true)]);
    let mut rng = Rng(44);
    client().send_to(&short(&d.cid(51, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("user path", || a.datagrams() == 1);
}

/// `--fast-path auto` where bpf(2) is refused (seccomp, as in a container without
/// CAP_BPF): one log line names the reason, and the user path serves everything.
#[test]
fn auto_falls_back_when_bpf_is_refused() {
    let d = Demux::start_opts("uring", "0", &[], &[libc::SYS_bpf]);
    let fp = &d.status()["fast_path"];
    assert_eq!(fp["active"], false, "{fp}");
    let log = d.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("kernel fast path unavailable")).collect();
    assert_eq!(lines.len(), 1, "exactly one fallback line: {log}");
    let a = Worker::connect_fast(&d, 61, true);
    assert!(a.fast.is_empty());
    d.wait_instances(&[(61, true)]);
    let mut rng = Rng(45);
    client().send_to(&short(&d.cid(61, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("user path", || a.datagrams() == 1);
}

/// `--fast-path on` where bpf(2) is refused: a clear start-up error, no panic.
#[test]
fn on_refused_is_a_clear_error() {
    let err = refused_start("fp-refuse", &[libc::SYS_bpf], &["--listen", "127.0.0.1:0", "--fast-path", "on"]);
    assert!(err.contains("--fast-path on"), "{err}");
}
