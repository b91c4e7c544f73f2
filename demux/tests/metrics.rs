//! Metrics carry every field of `lb-status --json` (docs/operations.md "Status"),
//! with a controller and in dataplane-only mode: compared field for field on a
//! quiescent data plane. Run: `cargo test --release -p demux --test metrics`.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use support::*;

fn free_tcp_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).expect("HTTP body")
}

/// The documented naming rule (docs/operations.md, the controller's "Status"), written out again
/// here: `quicdemux_lb_` + the key path joined by `_` (CamelCase → snake_case);
/// array elements labelled by `shard` / `server_id` (else `index`); booleans 0/1.
fn expected(v: &Value) -> BTreeMap<String, f64> {
    fn snake(k: &str) -> String {
        // Each capital starts a word (unless one just started); anything not
        // alphanumeric becomes `_`.
        k.chars().fold(String::new(), |mut o, c| {
            match c {
                'A'..='Z' if o.is_empty() || o.ends_with('_') => o.push(c.to_ascii_lowercase()),
                'A'..='Z' => o.extend(['_', c.to_ascii_lowercase()]),
                c if c.is_ascii_alphanumeric() => o.push(c),
                _ => o.push('_'),
            }
            o
        })
    }
    fn walk(v: &Value, name: &str, labels: &[String], skip: Option<&str>, out: &mut BTreeMap<String, f64>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter().filter(|(k, _)| Some(k.as_str()) != skip) {
                    walk(x, &format!("{name}_{}", snake(k)), labels, None, out);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let id = ["shard", "server_id"].into_iter().find(|k| x.get(*k).is_some_and(Value::is_u64));
                    let mut l = labels.to_vec();
                    match id {
                        Some(k) => l.push(format!("{k}=\"{}\"", x[k])),
                        None => l.push(format!("index=\"{i}\"")),
                    }
                    walk(x, name, &l, id, out);
                }
            }
            Value::Number(n) => {
                let key = if labels.is_empty() { name.to_string() } else { format!("{name}{{{}}}", labels.join(",")) };
                out.insert(key, n.as_f64().unwrap());
            }
            Value::Bool(b) => {
                let key = if labels.is_empty() { name.to_string() } else { format!("{name}{{{}}}", labels.join(",")) };
                out.insert(key, f64::from(u8::from(*b)));
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk(v, "quicdemux_lb", &[], None, &mut out);
    out
}

fn samples(text: &str, prefix: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// lb-status, then /metrics, then lb-status: every field of lb-status must be on
/// /metrics with a value between the two answers (equal to both for all but the
/// few that move on an idle data plane, e.g. `batches` of the io_uring loop).
fn compare(lb: impl Fn() -> Value, metrics: SocketAddr) {
    {
        let before = lb();
        let text = scrape(metrics);
        let after = lb();
        let lo = expected(&before);
        let want = expected(&after);
        let got = samples(&text, "quicdemux_lb_");
        let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        assert!(missing.is_empty(), "lb-status fields missing from /metrics: {missing:?}\n{text}");
        let mut moving = Vec::new();
        for (k, v) in &want {
            let l = lo.get(k).copied().unwrap_or(*v);
            let (l, h) = (l.min(*v), l.max(*v));
            assert!(l <= got[k] && got[k] <= h, "{k}: metrics {} vs lb-status {l}..={h}", got[k]);
            if l != h {
                moving.push(k.clone());
            }
        }
        assert!(moving.len() <= 8, "too many fields moved on an idle data plane: {moving:?}");
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(extra.is_empty(), "/metrics samples that lb-status does not have: {extra:?}");
        // The flood-defence counters are among them.
        for name in [
            "quicdemux_lb_refused_rate_limited",
            "quicdemux_lb_refused_handshake_limited",
            "quicdemux_lb_retry_sent",
            "quicdemux_lb_retry_dropped",
            "quicdemux_lb_recv_no_buffers",
            "quicdemux_lb_reasons_not_quic",
        ] {
            assert!(got.contains_key(name), "{name} missing");
        }
        assert!(want.len() > 40, "only {} numeric fields compared", want.len());
        // One TYPE line per metric name (Prometheus rejects repeats).
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut uniq = types.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), types.len(), "repeated TYPE lines");
    }
}

/// Controller mode: after some traffic (requests, malformed datagrams), every
/// numeric `lb-status --json` field is on `--metrics` with the same value.
#[test]
fn controller_metrics_match_lb_status_field_for_field() {
    let _s = serial();
    let rt = runtime();
    let m = free_tcp_port();
    let c = Controller::start("metrics", 2, &["--metrics", &m.to_string()]);
    let addr = c.addr();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    for _ in 0..3 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        rt.block_on(h.get("/bytes/10000")).expect("GET");
        h.close();
    }
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..50u8 {
        u.send_to(&[0x00, i, 1, 2, 3, 4, 5, 6, 7, 8], addr).unwrap();
    }
    rt.block_on(async { tokio::time::sleep(Duration::from_secs(1)).await });
    ep.close(0u32.into(), b"done");
    compare(|| c.lb_wait(), m);
    let text = scrape(m);
    assert!(text.contains("quicdemux_controller_up 1"), "the controller's own metrics are still there");
}

/// Dataplane-only mode (`demux dataplane --metrics`): the same fields, without a
/// controller.
#[test]
fn dataplane_only_metrics_match_lb_status_field_for_field() {
    let _s = serial();
    let m = free_tcp_port();
    let d = common::Demux::start_with("mmsg", "0", &["--metrics", &m.to_string()]);
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..20u8 {
        u.send_to(&[0x00, i, 9, 9, 9, 9], d.addr()).unwrap();
    }
    let lb = || {
        let out = Command::new(DEMUX)
            .arg("lb-status")
            .arg("--control-socket")
            .arg(&d.control)
            .arg("--json")
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).expect("lb-status --json")
    };
    wait_until("20 NotQuic", Duration::from_secs(10), || (lb()["reasons"]["NotQuic"] == 20).then_some(()));
    compare(lb, m);
    let text = scrape(m);
    assert!(text.contains("quicdemux_dataplane_up 1") && !text.contains("quicdemux_controller_up"), "{text}");
}
