//! End to end through a real `demux` data plane on 127.0.0.1: quinn + h3 clients,
//! `worker` processes behind the demux.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A quinn HTTP/3 client downloads 1 MiB (content checked); then 200 requests over 20
/// concurrent connections all succeed and are spread over all 3 workers, as the
/// responses' x-server-id and the data plane's per-instance counters both show.
/// quinn's client greases the fixed bit whenever the server allows it (RFC 9287);
/// the workers must not allow it, or the demux drops those datagrams as NotQuic.
#[test]
fn download_and_200_requests_over_3_workers() {
    download_and_200_requests(false)
}

/// The same with `--forward ring`: frames reach the workers over shared-memory rings.
#[test]
fn download_and_200_requests_over_3_workers_ring() {
    download_and_200_requests(true)
}

fn download_and_200_requests(rings: bool) {
    let d = Demux::start_forward(if rings { "spread-ring" } else { "spread" }, rings);
    let c = cert(&d.dir);
    let _w: Vec<Worker> = (1..=3).map(|id| Worker::start(&d, &c, id, &[])).collect();
    d.wait_instances("3 placeable", |i| i.iter().filter(|x| x.1).count() == 3);
    let rt = rt();
    rt.block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, d.addr).await.expect("connect");
        let r = h.get("/bytes/1048576").await.expect("1 MiB");
        assert_eq!((r.status, r.len, r.pattern_ok), (200, 1 << 20, true));
        let health = h.get("/health").await.expect("health");
        assert_eq!(health.status, 200);
        h.close();

        let mut tasks = Vec::new();
        for _ in 0..20 {
            let ep = ep.clone();
            let addr = d.addr;
            tasks.push(tokio::spawn(async move {
                let mut h = H3::connect(&ep, addr).await.expect("connect");
                let mut ids = Vec::new();
                for i in 0..10 {
                    let r = h.get(&format!("/bytes/{}", 1000 + i * 4096)).await.expect("request");
                    assert_eq!(r.status, 200);
                    assert!(r.pattern_ok);
                    ids.push(r.server_id);
                }
                h.close();
                ids
            }));
        }
        let mut per_worker: BTreeMap<u16, usize> = BTreeMap::new();
        for t in tasks {
            for id in t.await.expect("task") {
                *per_worker.entry(id).or_default() += 1;
            }
        }
        assert_eq!(per_worker.values().sum::<usize>(), 200);
        assert_eq!(
            per_worker.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3],
            "all 3 workers served: {per_worker:?}"
        );
        ep.wait_idle().await;
    });
    let inst = d.instances();
    assert!(inst.iter().all(|i| i.2 > 0), "demux per-instance datagram counters: {inst:?}");
    assert_eq!(d.reason("NotQuic"), 0, "no fixed-bit-greased datagrams reached the demux");
    let log = std::fs::read_to_string(d.dir.join("demux.log")).unwrap_or_default();
    assert_eq!(log.matches("forwarding over rings").count(), if rings { 3 } else { 0 }, "{log}");
}

/// --retry: every connection gets a Retry, and the client's second Initial (DCID =
/// the Retry's ADR 0001 SCID) routes back to the instance that issued it.
///
/// Proved per connection, one at a time on an idle appliance: the data plane's
/// per-instance datagram counters change for exactly one instance — the one the
/// first Initial was placed on, which sent the Retry — and that is the instance
/// that served the request (x-server-id). If follow-up Initials were placed
/// independently of the issuer (at random, or by their own DCID's hash), a
/// connection would pass only when both land on the same of the 3 instances
/// (p = 1/3), so all 13 pass by chance with p = 3^-13 ≈ 6.3e-7 < 1e-6.
#[test]
fn retry_routes_back_to_the_issuer() {
    const WORKERS: u16 = 3;
    const CONNECTIONS: usize = 13;
    let d = Demux::start("retry");
    let c = cert(&d.dir);
    let mut ws: Vec<Worker> = (1..=WORKERS).map(|id| Worker::start(&d, &c, id, &["--retry"])).collect();
    d.wait_instances("3 placeable", |i| i.iter().filter(|x| x.1).count() == usize::from(WORKERS));
    let counts = |d: &Demux| -> BTreeMap<u16, u64> { d.instances().iter().map(|i| (i.0, i.2)).collect() };
    let mut served: BTreeMap<u16, u64> = BTreeMap::new();
    let rt = rt();
    for n in 0..CONNECTIONS {
        let before = counts(&d);
        let server_id = rt.block_on(async {
            let ep = client_endpoint(&c);
            let mut h = H3::connect(&ep, d.addr).await.expect("connect after Retry");
            let r = h.get("/bytes/20000").await.expect("request");
            assert_eq!((r.status, r.len), (200, 20000));
            h.close();
            ep.wait_idle().await;
            r.server_id
        });
        let after = counts(&d);
        let moved: Vec<u16> = after.iter().filter(|(id, v)| before.get(id) != Some(*v)).map(|(id, _)| *id).collect();
        assert_eq!(
            moved,
            vec![server_id],
            "connection {n}: only the Retry issuer saw datagrams ({before:?} → {after:?})"
        );
        *served.entry(server_id).or_default() += 1;
    }
    let (mut retries, mut conns) = (0, 0);
    for w in ws.iter_mut() {
        w.signal(libc::SIGTERM);
        let (ok, log) = w.wait_exit(Duration::from_secs(20));
        assert!(ok, "worker exit: {log}");
        let r = Worker::exit_stat(&log, "retries").expect("retries stat");
        let c = Worker::exit_stat(&log, "connections").expect("connections stat");
        // Every connection a worker accepted followed a Retry from that worker; a
        // lost Retry only adds Retries.
        assert!(c <= r, "worker {}: every connection here follows a Retry from here: {log}", w.id);
        assert_eq!(c, served.get(&w.id).copied().unwrap_or(0), "worker {}: connections = requests it served", w.id);
        retries += r;
        conns += c;
    }
    assert_eq!(conns, CONNECTIONS as u64);
    assert!(retries >= CONNECTIONS as u64);
}

/// A client that changes its local port mid-download (quinn Endpoint::rebind) keeps
/// its connection: the demux routes by CID, so the same worker finishes it.
#[test]
fn rebind_mid_download_finishes_on_the_same_worker() {
    let d = Demux::start("rebind");
    let c = cert(&d.dir);
    let _w: Vec<Worker> = (1..=3).map(|id| Worker::start(&d, &c, id, &[])).collect();
    d.wait_instances("3 placeable", |i| i.iter().filter(|x| x.1).count() == 3);
    rt().block_on(async {
        let ep = client_endpoint(&c);
        let before = ep.local_addr().expect("local addr");
        let mut h = H3::connect(&ep, d.addr).await.expect("connect");
        let first = h.get("/health").await.expect("health");
        let mut rebound = false;
        let ep2 = ep.clone();
        let r = h
            .get_with("/bytes/16777216", |n| {
                if !rebound && n >= 2 << 20 {
                    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("new socket");
                    ep2.rebind(s).expect("rebind");
                    rebound = true;
                }
            })
            .await
            .expect("download across the rebind");
        assert!(rebound);
        assert_ne!(ep.local_addr().expect("local addr").port(), before.port());
        assert_eq!((r.status, r.len, r.pattern_ok), (200, 16 << 20, true));
        assert_eq!(r.server_id, first.server_id, "same worker before and after");
        let after = h.get("/health").await.expect("after rebind");
        assert_eq!(after.server_id, first.server_id);
        h.close();
    });
    assert_eq!((d.reason("Orphan"), d.reason("Departed")), (0, 0), "no datagram lost its owner");
}

/// SIGKILL of a worker: its connections' next datagrams are `Departed`, another
/// worker answers with a stateless reset (shared reset key, RFC 9000 §10.3), so the
/// client sees a reset at once rather than an idle timeout, and reconnects.
#[test]
fn sigkill_gives_stateless_reset_and_reconnect_succeeds() {
    let d = Demux::start("kill");
    let c = cert(&d.dir);
    let mut ws: Vec<Worker> = (1..=2).map(|id| Worker::start(&d, &c, id, &[])).collect();
    d.wait_instances("2 placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    rt().block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, d.addr).await.expect("connect");
        let victim = h.get("/health").await.expect("health").server_id;
        let w = ws.iter_mut().find(|w| w.id == victim).expect("victim worker");
        w.signal(libc::SIGKILL);
        let _ = w.wait_exit(Duration::from_secs(5));
        d.wait_instances("victim dead", |i| i.iter().all(|x| x.0 != victim));
        let t0 = std::time::Instant::now();
        let res = tokio::time::timeout(Duration::from_secs(10), h.get("/bytes/1000")).await;
        assert!(matches!(res, Ok(Err(_))), "request on the dead worker's connection must fail fast: {res:?}");
        let reason = tokio::time::timeout(Duration::from_secs(5), h.conn.closed()).await.expect("closed");
        assert!(matches!(reason, quinn::ConnectionError::Reset), "stateless reset, got {reason:?}");
        assert!(t0.elapsed() < Duration::from_secs(5), "reset, not a timeout: {:?}", t0.elapsed());
        let mut h2 = H3::connect(&ep, d.addr).await.expect("reconnect");
        let r = h2.get("/bytes/100000").await.expect("after reconnect");
        assert_eq!((r.status, r.len), (200, 100000));
        assert_ne!(r.server_id, victim);
        h2.close();
    });
    assert!(d.reason("Departed") > 0, "the demux forwarded the dead id's datagrams to a live worker");
}

/// SIGTERM under load: the worker sends Draining (the demux stops placing on it),
/// GOAWAY on every connection, finishes every request it accepted, closes with
/// H3_NO_ERROR and exits. Clients retry only requests that never got a response
/// head (rejected or sent after GOAWAY), on a new connection, and all succeed.
#[test]
fn drain_under_load_loses_no_accepted_request() {
    let d = Demux::start("drain");
    let c = cert(&d.dir);
    let mut ws: Vec<Worker> = (1..=2).map(|id| Worker::start(&d, &c, id, &["--drain-timeout", "20"])).collect();
    d.wait_instances("2 placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    let done = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    let rt = rt();
    let _enter = rt.enter();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let ep = client_endpoint(&c);
            let addr = d.addr;
            let (done, retried) = (done.clone(), retried.clone());
            rt.spawn(async move {
                let mut h = H3::connect(&ep, addr).await.expect("connect");
                for _ in 0..30 {
                    loop {
                        match h.get("/bytes/262144").await {
                            Ok(r) => {
                                assert_eq!((r.status, r.len), (200, 262144));
                                done.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(ReqError::BeforeHead(_)) => {
                                // Not accepted: retry on a fresh connection.
                                retried.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                h = H3::connect(&ep, addr).await.expect("reconnect");
                            }
                            Err(e @ ReqError::AfterHead(_)) => panic!("accepted request lost: {e}"),
                        }
                    }
                }
                h.close();
                ep.wait_idle().await;
            })
        })
        .collect();
    // Let load build up, then drain the worker that has connections.
    std::thread::sleep(Duration::from_millis(700));
    let victim_idx = 0;
    ws[victim_idx].signal(libc::SIGTERM);
    d.wait_instances("drained worker unplaceable or gone", |i| i.iter().all(|x| x.0 != 1 || !x.1));
    let (ok, log) = ws[victim_idx].wait_exit(Duration::from_secs(30));
    assert!(ok, "drained worker exits cleanly: {log}");
    assert!(log.contains("drained=true"), "drain finished before the timeout: {log}");
    let accepted = Worker::exit_stat(&log, "requests").expect("requests");
    let ok_count = Worker::exit_stat(&log, "ok").expect("ok");
    assert_eq!(accepted, ok_count, "every request the drained worker accepted completed: {log}");
    assert!(accepted > 0, "the drained worker had load: {log}");
    for c in clients {
        rt.block_on(c).expect("client task");
    }
    assert_eq!(done.load(Ordering::Relaxed), 8 * 30);
    d.wait_instances("drained worker dead", |i| i.iter().all(|x| x.0 != 1));
    eprintln!("drain: accepted by drained worker {accepted}, client retries {}", retried.load(Ordering::Relaxed));
}

/// Drain seen by a real h3 client (RFC 9114 §5.2, §8.1): with a paced download in
/// flight, SIGTERM makes the worker send GOAWAY — the client's next request on that
/// connection fails locally with `RemoteClosing`, which h3 reports only after
/// reading a GOAWAY — the download still completes, and the connection then
/// closes with H3_NO_ERROR (0x100) as its application error code.
#[test]
fn draining_worker_sends_goaway_then_closes_with_h3_no_error() {
    let d = Demux::start("goaway");
    let c = cert(&d.dir);
    let mut w = Worker::start(&d, &c, 1, &["--drain-timeout", "20"]);
    d.wait_instances("1 placeable", |i| i.iter().filter(|x| x.1).count() == 1);
    let rt = rt();
    let ep = {
        let _e = rt.enter();
        client_endpoint(&c)
    };
    let mut h = rt.block_on(H3::connect(&ep, d.addr)).expect("connect");
    assert_eq!(rt.block_on(h.get("/health")).expect("health").status, 200);
    let (conn, mut sender) = (h.conn.clone(), h.sender());
    // 1 MiB at 256 KiB/s: about 4 s in flight, well inside the drain timeout.
    let download = rt.spawn(async move { h.get_paced("/bytes/1048576", Some(256 << 10)).await });
    std::thread::sleep(Duration::from_millis(500));
    w.signal(libc::SIGTERM);
    let refused = rt.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            assert!(tokio::time::Instant::now() < deadline, "no GOAWAY within 3 s of SIGTERM");
            let req = http::Request::get("https://localhost/health").body(()).unwrap();
            match sender.send_request(req).await {
                Err(e) => break e,
                Ok(mut s) => {
                    // Sent before the GOAWAY arrived: answered or rejected, either is fine.
                    let _ = s.finish().await;
                    let _ = s.recv_response().await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    // h3's `StreamError::RemoteClosing` (a private variant; its Display text).
    assert_eq!(refused.to_string(), "Remote is closing the connection", "GOAWAY: {refused:?}");
    let r = rt.block_on(download).expect("download task").expect("the accepted download completes during the drain");
    assert_eq!((r.status, r.len, r.pattern_ok), (200, 1 << 20, true));
    let closed = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), conn.closed()).await });
    match closed {
        Ok(quinn::ConnectionError::ApplicationClosed(a)) => {
            assert_eq!(a.error_code, quinn::VarInt::from_u32(0x100), "H3_NO_ERROR: {a:?}")
        }
        other => panic!("expected an application close with H3_NO_ERROR, got {other:?}"),
    }
    let (ok, log) = w.wait_exit(Duration::from_secs(30));
    assert!(ok && log.contains("drained=true"), "drained worker exits cleanly: {log}");
}

/// RFC 9000 §6, §17.2.1: a client Initial of an unknown version reaches a worker
/// through the demux (reason VersionNegotiation) and the client receives a Version
/// Negotiation packet: version 0, the client's CIDs swapped, and a list that holds
/// QUIC v1.
#[test]
fn unknown_version_gets_version_negotiation_listing_v1() {
    let d = Demux::start("vn");
    let c = cert(&d.dir);
    let _w = Worker::start(&d, &c, 1, &[]);
    d.wait_instances("1 placeable", |i| i.iter().filter(|x| x.1).count() == 1);
    let mut rng = testkit::Rng(7);
    let (dcid, scid_len) = (rng.bytes(8), 8usize);
    let mut p = testkit::packets::long(testkit::packets::INITIAL, &dcid, 1200, &mut rng);
    p[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes());
    let scid = p[6 + dcid.len() + 1..6 + dcid.len() + 1 + scid_len].to_vec();
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    u.send_to(&p, d.addr).unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = u.recv_from(&mut buf).expect("a Version Negotiation packet within 5 s");
    let vn = &buf[..n];
    assert_eq!(from, d.addr, "answered from the shared address");
    assert!(vn[0] & 0x80 != 0, "long header: {vn:02x?}");
    assert_eq!(&vn[1..5], &[0, 0, 0, 0], "version 0 (Version Negotiation)");
    // RFC 9000 §17.2.1: DCID = the client's SCID, SCID = the client's DCID.
    let dl = usize::from(vn[5]);
    assert_eq!(&vn[6..6 + dl], scid.as_slice());
    let sl = usize::from(vn[6 + dl]);
    assert_eq!(&vn[7 + dl..7 + dl + sl], dcid.as_slice());
    let versions: Vec<u32> =
        vn[7 + dl + sl..].chunks_exact(4).map(|v| u32::from_be_bytes([v[0], v[1], v[2], v[3]])).collect();
    assert!(versions.contains(&1), "supported versions {versions:08x?} list QUIC v1");
    assert_eq!(d.reason("VersionNegotiation"), 1);
}

/// Data-plane crash: SIGKILL the demux mid-download and start a new one on the same
/// address and keys. The worker reconnects its data connection (DataHello again,
/// new socket fds, Ready resent), the CIDs route as before, and the download
/// finishes on the same connection.
#[test]
fn demux_restart_keeps_established_connections() {
    let mut d = Demux::start("restart");
    let c = cert(&d.dir);
    let _w: Vec<Worker> = (1..=2).map(|id| Worker::start(&d, &c, id, &[])).collect();
    d.wait_instances("2 placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    let rt = rt();
    let progress = Arc::new(AtomicU64::new(0));
    let p2 = progress.clone();
    let ep = {
        let _e = rt.enter();
        client_endpoint(&c)
    };
    let addr = d.addr;
    let download = rt.spawn(async move {
        let mut h = H3::connect(&ep, addr).await.expect("connect");
        let r = h.get_with("/bytes/67108864", |n| p2.store(n, Ordering::Relaxed)).await;
        let after = r.as_ref().ok().map(|_| ());
        let health = if after.is_some() { h.get("/health").await.ok() } else { None };
        h.close();
        (r, health)
    });
    while progress.load(Ordering::Relaxed) < 4 << 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    d.crash_and_restart();
    d.wait_instances("both workers back and placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    let (r, health) = rt.block_on(download).expect("download task");
    let r = r.expect("download across the data-plane restart");
    assert_eq!((r.status, r.len, r.pattern_ok), (200, 64 << 20, true));
    assert_eq!(health.expect("request after the restart").server_id, r.server_id);
    assert_eq!((d.reason("Orphan"), d.reason("Departed")), (0, 0));
}

/// Two listen addresses, IPv4 and IPv6: `Sockets` carries one fd each; replies to
/// each family leave from the socket the client sent to (IP_PKTINFO /
/// IPV6_PKTINFO source address), so both clients complete.
#[test]
fn ipv4_and_ipv6_listen_addresses() {
    let d = Demux::start_on("v46", &["127.0.0.1:0", "[::1]:0"]);
    assert_eq!(d.addrs.len(), 2);
    let c = cert(&d.dir);
    let _w: Vec<Worker> = (1..=2).map(|id| Worker::start(&d, &c, id, &[])).collect();
    d.wait_instances("2 placeable", |i| i.iter().filter(|x| x.1).count() == 2);
    rt().block_on(async {
        for (bind, addr) in [("127.0.0.1:0", d.addrs[0]), ("[::1]:0", d.addrs[1])] {
            let ep = client_endpoint_on(&c, bind);
            let mut h = H3::connect(&ep, addr).await.expect("connect");
            let r = h.get("/bytes/300000").await.expect("request");
            assert_eq!((r.status, r.len, r.pattern_ok), (200, 300000, true), "via {addr}");
            h.close();
            ep.wait_idle().await;
        }
    });
}

/// Echo mode: a datagram forwarded by the demux comes back to its sender from the
/// shared address, bypassing QUIC.
#[test]
fn echo_mode_returns_datagrams_from_the_shared_socket() {
    let d = Demux::start("echo");
    let c = cert(&d.dir);
    let _w = Worker::start(&d, &c, 9, &["--echo"]);
    d.wait_instances("echo placeable", |i| i.iter().any(|x| x.0 == 9 && x.1));
    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    // A v1 Initial (RFC 9000 §17.2.2) padded to 1200 bytes with a client-chosen DCID.
    let mut p = vec![0xc3u8, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0];
    let rest = 1200 - p.len() - 2;
    p.extend_from_slice(&(0x4000u16 | rest as u16).to_be_bytes());
    p.resize(1200, 0xab);
    let mut buf = [0u8; 2048];
    for _ in 0..3 {
        s.send_to(&p, d.addr).expect("send");
        let (n, from) = s.recv_from(&mut buf).expect("echo reply");
        assert_eq!(&buf[..n], &p[..]);
        assert_eq!(from, d.addr, "reply leaves from the shared socket");
    }
}
