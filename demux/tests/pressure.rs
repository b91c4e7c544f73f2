//! The data plane's side of overload handling (docs/operations.md "Liveness and
//! pressure"), with test workers speaking the protocol by hand: `Load` reports drive
//! each instance's pressure level (Retry, then drop, for token-less Initials) and the
//! stall rule (no `Load` for 1 s: not placeable, still live).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;
use common::*;
use proto::wire::Data;
use std::time::{Duration, Instant};

fn load(w: &Worker, handshakes: u32) {
    w.send(&Data::Load { handshakes, incoming_bytes: 0 });
}

fn sent_initials(d: &Demux, n: usize, rng: &mut Rng) {
    let c = client();
    for _ in 0..n {
        c.send_to(&initial(&rng.bytes(8), rng), d.addr()).unwrap();
    }
}

fn retried(s: &serde_json::Value) -> u64 {
    u64_at(s, "/retry/sent") + u64_at(s, "/retry/dropped")
}

/// Reported handshakes above `--pressure-retry-above`: token-less Initials for the
/// instance get the Retry path; above `--pressure-drop-above`: dropped, counted;
/// back under: placed again.
#[test]
fn reported_handshakes_switch_an_instance_to_retry_then_drop() {
    let d = Demux::start_with(
        "mmsg",
        "0",
        &["--limits", "off", "--retry", "auto", "--pressure-retry-above", "10", "--pressure-drop-above", "100"],
    );
    let mut rng = Rng(41);
    let w = Worker::connect(&d, 41, true);
    d.wait_instances(&[(41, true)]);
    load(&w, 5);
    d.wait_status("handshakes 5", |s| u64_at(instance(s, 41), "/handshakes") == 5);
    sent_initials(&d, 5, &mut rng);
    wait_for("5 Initials placed", || w.datagrams() == 5);

    load(&w, 50);
    d.wait_status("pressure retry", |s| instance(s, 41)["pressure"] == "retry");
    w.clear();
    sent_initials(&d, 20, &mut rng);
    // `--retry auto` (its rate threshold far away): the minter exists, so pressure
    // Retries; random Initials that quinn does not take as first Initials (reserved
    // bits) count as retry.dropped. With `--retry off` nothing is ever minted.
    let s = d.wait_status("20 on the Retry path", |s| retried(s) == 20);
    assert!(u64_at(&s, "/retry/sent") > 0, "some Retry sent: {}", s["retry"]);
    assert_eq!(w.datagrams(), 0, "nothing placed while under Retry pressure");
    assert_eq!(u64_at(&s, "/refused/Overloaded"), 0);

    load(&w, 500);
    d.wait_status("pressure drop", |s| instance(s, 41)["pressure"] == "drop");
    sent_initials(&d, 7, &mut rng);
    let s = d.wait_status("7 refused Overloaded", |s| u64_at(s, "/refused/Overloaded") == 7);
    assert_eq!(retried(&s), 20, "dropped, not retried");
    // A short header for the instance is still forwarded (it is live).
    let c = client();
    c.send_to(&short(&d.cid(41, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("the short header", || w.datagrams() == 1);

    load(&w, 0);
    d.wait_status("pressure normal", |s| instance(s, 41)["pressure"] == "normal");
    sent_initials(&d, 3, &mut rng);
    wait_for("placed again", || w.datagrams() == 4);
}

/// A worker that sent `Load` and then stops is not placeable within about a second
/// (still live: its short headers are forwarded); when `Load` comes again it is
/// placeable again. A worker that never sends `Load` is never stalled.
#[test]
fn a_silent_reporter_is_stalled_and_returns() {
    let d = Demux::start_with("mmsg", "0", &["--limits", "off"]);
    let mut rng = Rng(42);
    let quiet = Worker::connect(&d, 51, true); // never sends Load
    let w = Worker::connect(&d, 52, true);
    d.wait_instances(&[(51, true), (52, true)]);
    load(&w, 0);
    let t = Instant::now();
    let s = d.wait_status("52 stalled", |s| instance(s, 52)["stalled"] == true);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(1500), "stalled after {took:?}");
    assert_eq!(instance(&s, 52)["placeable"], false);
    assert_eq!(u64_at(instance(&s, 52), "/stalls"), 1);
    assert_eq!(u64_at(&s, "/liveness/stalls"), 1);
    assert_eq!(instance(&s, 51)["placeable"], true, "no Load ever: the rule does not apply");
    assert!(instance(&s, 51)["load_age_ms"].is_null());
    // New connections go to the other one; the stalled one's own datagrams still reach it.
    quiet.clear();
    w.clear();
    sent_initials(&d, 10, &mut rng);
    wait_for("10 Initials on 51", || quiet.datagrams() == 10);
    client().send_to(&short(&d.cid(52, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("52's short header", || w.datagrams() == 1);
    // It reports again: placeable within a tick.
    load(&w, 0);
    let t = Instant::now();
    let s = d.wait_status("52 placeable", |s| instance(s, 52)["placeable"] == true);
    assert!(t.elapsed() < Duration::from_millis(500), "placeable again after {:?}", t.elapsed());
    assert_eq!(instance(&s, 52)["stalled"], false);
    eprintln!("stalled after {} ms", took.as_millis());
}
