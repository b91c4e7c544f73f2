//! Limits that do not drop honest clients, and Initials that cannot skip admission, end to end: a real `demux dataplane` with its
//! default limits and Retry mode, real `worker` processes, quinn HTTP/3 clients and
//! hand-made Initials (proto::initial::build_client_initial) on loopback.
//! The set-up is tests/appliance_support (shared with tests/flood.rs).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

#[path = "appliance_support/mod.rs"]
mod support;
use support::*;

/// `n` sequential downloads of `size` bytes from one client endpoint (one address,
/// one port); each bounded by `each`. The errors, in order.
fn sequential(s: &Setup, bind: SocketAddr, n: usize, size: u64, each: Duration) -> (Vec<String>, Duration) {
    let rt = rt();
    let (cert, target) = (s.cert.clone(), s.addr);
    rt.block_on(async move {
        let ep = client(&cert, bind);
        let t0 = Instant::now();
        let mut errs = Vec::new();
        for i in 0..n {
            match tokio::time::timeout(each, download(&ep, target, size)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errs.push(format!("#{i}: {e}")),
                Err(_) => errs.push(format!("#{i}: timed out")),
            }
        }
        let took = t0.elapsed();
        ep.wait_idle().await;
        (errs, took)
    })
}

/// The reproduction, rerun: sequential 1 MiB downloads from 127.0.0.1 with
/// default limits used to fail after the 64th (each pin held its ticket 10 s; the
/// over-limit Initial was dropped in silence). 200 now all succeed: tickets leave when
/// the worker reports the handshake done, and a client over its rate gets a Retry.
#[test]
fn two_hundred_sequential_downloads_from_one_address() {
    let s = start("seq", &[], 2, &[]);
    let (errs, took) = sequential(&s, "127.0.0.1:0".parse().unwrap(), 200, 1 << 20, Duration::from_secs(20));
    let v = s.status();
    eprintln!(
        "200 × 1 MiB in {took:?}: Placed {}, Owner {}, RateLimited {}, HandshakeLimited {}, retry.sent {}, \
         retry.sent_over_limit {}, tickets_released_done {}",
        u(&v, "/reasons/Placed"),
        u(&v, "/reasons/Owner"),
        u(&v, "/refused/RateLimited"),
        u(&v, "/refused/HandshakeLimited"),
        u(&v, "/retry/sent"),
        u(&v, "/retry/sent_over_limit"),
        u(&v, "/tickets_released_done"),
    );
    assert!(errs.is_empty(), "{} of 200 failed: {errs:?}", errs.len());
    // Every placed handshake gave its ticket back on completion (a pin holds one only
    // while its handshake is in progress).
    let placed = u(&v, "/reasons/Placed");
    assert!(u(&v, "/tickets_released_done") >= placed.min(200) * 9 / 10, "tickets released early: {v}");
    // Nothing over the limit went unanswered.
    assert_eq!(u(&v, "/refused/RateLimited") + u(&v, "/refused/HandshakeLimited"), 0, "silent drops: {v}");
}

/// An honest client over its rate (burst 2, 1/s) gets a Retry, not silence, and
/// completes; with `--retry off` (the demux cannot mint) the same client is dropped
/// as before.
#[test]
fn over_limit_client_gets_a_retry_and_completes() {
    let s = start("over", &["--limit-burst", "2", "--limit-rate", "1"], 1, &[]);
    let (errs, _) = sequential(&s, "127.0.0.3:0".parse().unwrap(), 8, 4096, Duration::from_secs(10));
    let v = s.status();
    assert!(errs.is_empty(), "failed: {errs:?} {v}");
    assert!(u(&v, "/retry/sent_over_limit") >= 4, "over-limit Retries: {v}");
    assert_eq!(u(&v, "/retry/sent"), u(&v, "/retry/sent_over_limit"), "below --retry-above only over-limit ones: {v}");
    assert_eq!(u(&v, "/refused/RateLimited"), 0, "{v}");

    let off = start("over-off", &["--limit-burst", "2", "--limit-rate", "1", "--retry", "off"], 1, &[]);
    // (The client's own Initial retransmissions may outlast the refill: no claim on
    // its success, only on what the demux did — refused in silence.)
    let _ = sequential(&off, "127.0.0.3:0".parse().unwrap(), 4, 4096, Duration::from_secs(2));
    let v = off.status();
    assert!(u(&v, "/refused/RateLimited") > 0, "--retry off: over the limit is dropped: {v}");
    assert_eq!(u(&v, "/retry/sent"), 0, "{v}");
}

/// A ClientHello-like first CRYPTO frame (CRYPTO at offset 0).
const CH: [u8; 7] = [6, 0, 4, 1, 0, 0, 0];

fn ch_initial(dcid: &[u8], token: &[u8], pn: u32) -> Vec<u8> {
    proto::initial::build_client_initial(1, dcid, &[0x5c; 8], token, pn, &CH, 1200).expect("initial")
}

/// Collects the Retries waiting on `sock`: (SCID, token) of each.
fn retries(sock: &UdpSocket, want: usize, within: Duration) -> Vec<(Vec<u8>, Vec<u8>)> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 1500];
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    while out.len() < want && Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            if let Some(r) = proto::retry::parse(&buf[..n]) {
                out.push((r.scid.to_vec(), r.token.to_vec()));
            }
        }
    }
    out
}

/// The attack: an over-limit source collects Retry SCIDs (each decodes
/// to a live instance) and sends token-less ClientHello Initials with them as DCID —
/// before the fix each went to its owner as `Owner`, past the rate limit, the
/// handshake cap and Retry. Now each is counted as `owner_initial.placed`, goes
/// through admission and is answered with an over-limit Retry; none is forwarded as
/// Owner. The same DCID with the Retry's token (`owner_initial.token`), or an ACK-only
/// Initial from this socket, which the data plane placed connections for
/// (`owner_initial.follow_up`: a client after the server's first flight), still goes
/// to its owner.
#[test]
fn copied_live_dcids_do_not_skip_admission() {
    let s = start("bypass", &[], 2, &[]);
    let sock = UdpSocket::bind("127.0.0.7:0").expect("bind");
    sock.connect(s.addr).expect("connect");
    // 40 at once is the default burst: 100 fresh DCIDs → ≥ 50 over-limit Retries.
    for i in 0..100u32 {
        let mut dcid = [0u8; 8];
        dcid[..4].copy_from_slice(&i.to_be_bytes());
        sock.send(&ch_initial(&dcid, &[], 0)).expect("send");
    }
    let got = retries(&sock, 50, Duration::from_secs(5));
    assert!(got.len() >= 50, "over-limit Retries: {} {}", got.len(), s.status());
    // All 100 accounted for (placed or answered) before the baseline is taken: the
    // shard may still be routing the last of them when the first 50 Retries arrive
    // (a round's Retries leave together at its end).
    let accounted = |v: &serde_json::Value| {
        ["/reasons/Placed", "/reasons/Pinned", "/retry/sent_over_limit", "/retry/send_errors", "/retry/dropped"]
            .iter()
            .map(|p| u(v, p))
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let before = loop {
        let v = s.status();
        if accounted(&v) >= 100 || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(accounted(&before), 100, "the first 100 Initials: {before}");
    // The attack: 5 rounds of token-less ClientHellos on the copied live DCIDs.
    let mut sent = 0;
    for round in 0..5 {
        for (scid, _) in &got {
            sock.send(&ch_initial(scid, &[], round)).expect("send");
            sent += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mid = loop {
        let v = s.status();
        if u(&v, "/owner_initial/placed") - u(&before, "/owner_initial/placed") >= sent || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let d = |p: &str| u(&mid, p) - u(&before, p);
    eprintln!(
        "attack: {sent} sent; Owner +{}, owner_initial.placed +{}, Placed +{}, Pinned +{}, retry.sent_over_limit +{}, \
         RateLimited +{}, retry.dropped +{}",
        d("/reasons/Owner"),
        d("/owner_initial/placed"),
        d("/reasons/Placed"),
        d("/reasons/Pinned"),
        d("/retry/sent_over_limit"),
        d("/refused/RateLimited"),
        d("/retry/dropped"),
    );
    assert_eq!(d("/reasons/Owner"), 0, "a copied live DCID skipped admission: {mid}");
    assert_eq!(d("/owner_initial/placed"), sent, "{mid}");
    // Over the limit (its rate is spent): answered with a Retry; the few the 10/s
    // refill admits are placed (and their DCID's later rounds follow the pin).
    let answered = d("/retry/sent_over_limit") + d("/retry/send_errors") + d("/retry/dropped");
    assert_eq!(answered + d("/reasons/Placed") + d("/reasons/Pinned"), sent, "{mid}");
    assert!(answered >= sent * 8 / 10 && d("/reasons/Placed") <= 20, "{mid}");
    // Drain the Retries the attack earned.
    let _ = retries(&sock, usize::MAX, Duration::from_millis(300));

    // With the Retry's own token (bound to this address and port) → Owner.
    let (scid, token) = &got[0];
    sock.send(&ch_initial(scid, token, 9)).expect("send");
    // An ACK-only Initial on a live DCID (what a client sends after the server's
    // Initial, RFC 9000 §7.2) from this socket, whose Initials were placed on both
    // instances → Owner as a follow-up, no token needed.
    let ack = proto::initial::build_client_initial(1, &got[1].0, &[0x5c; 8], &[], 1, &[2, 0, 0, 0, 0], 1200).unwrap();
    sock.send(&ack).expect("send");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = s.status();
        if u(&v, "/reasons/Owner") - u(&mid, "/reasons/Owner") >= 2 {
            assert_eq!(u(&v, "/owner_initial/placed"), u(&mid, "/owner_initial/placed"), "{v}");
            assert_eq!(u(&v, "/owner_initial/token") - u(&mid, "/owner_initial/token"), 1, "{v}");
            assert_eq!(u(&v, "/owner_initial/follow_up") - u(&mid, "/owner_initial/follow_up"), 1, "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "valid token / ACK-only Initial not routed as Owner: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
