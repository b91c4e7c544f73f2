//! End-to-end: the udpflood binary against plain UDP sockets on 127.0.0.1.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proto::cid::{ServerId, CID_LEN};
use proto::header::{parse, Header, LongType};
use proto::keyfile::KeyFile;
use std::collections::HashSet;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_udpflood");

fn temp_path(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("udpflood-test-{}-{n}-{name}", std::process::id()))
}

fn key_file() -> (PathBuf, KeyFile) {
    let kf = KeyFile::generate(&[0x5a; proto::keyfile::RANDOM_LEN], proto::cid::Prf::SipHash24);
    let p = temp_path("keys");
    std::fs::write(&p, kf.to_text()).unwrap();
    (p, kf)
}

fn rcvbuf(s: &UdpSocket, bytes: i32) {
    sys::sockopt::set_recv_buffer(s, bytes.max(0) as usize);
}

use testkit::json_num;

fn run(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().expect("run udpflood");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

/// Receives until `quiet` passes with nothing arriving after `done` is set.
fn sink(sock: UdpSocket, done: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<(u16, Vec<u8>)>> {
    std::thread::spawn(move || {
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65_536];
        let start = Instant::now();
        let mut idle_since = None;
        while start.elapsed() < Duration::from_secs(20) {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    got.push((from.port(), buf[..n].to_vec()));
                    idle_since = None;
                }
                Err(_) => {
                    if done.load(Ordering::Acquire) {
                        let t = *idle_since.get_or_insert(Instant::now());
                        if t.elapsed() > Duration::from_millis(300) {
                            break;
                        }
                    }
                }
            }
        }
        got
    })
}

fn flood_into_sink(extra: &[&str]) -> (String, Vec<(u16, Vec<u8>)>) {
    flood_into(UdpSocket::bind("127.0.0.1:0").unwrap(), extra)
}

/// The same into a socket with UDP_GRO (udp(7)): on loopback a GSO send reaches it
/// whole, as one read of all its segments; separately sent datagrams stay separate
/// reads (loopback does not coalesce). So each read is one of udpflood's sends.
fn flood_into_gro_sink(extra: &[&str]) -> (String, Vec<(u16, Vec<u8>)>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sys::sockopt::setsockopt_int(sock.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1).expect("UDP_GRO");
    flood_into(sock, extra)
}

fn flood_into(sock: UdpSocket, extra: &[&str]) -> (String, Vec<(u16, Vec<u8>)>) {
    rcvbuf(&sock, 4 << 20);
    let target = sock.local_addr().unwrap().to_string();
    let done = Arc::new(AtomicBool::new(false));
    let h = sink(sock, done.clone());
    let mut args = vec!["--target", &target, "--json", "--quiet"];
    if !extra.contains(&"--duration") {
        args.extend_from_slice(&["--duration", "10"]);
    }
    args.extend_from_slice(extra);
    let out = run(&args);
    done.store(true, Ordering::Release);
    let got = h.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), got)
}

#[test]
fn paced_mix_arrives_complete_and_in_ratio() {
    let (keys, kf) = key_file();
    let ks = kf.key_set().unwrap();
    let (json, got) = flood_into_sink(&[
        "--mode",
        "mix",
        "--keys",
        keys.to_str().unwrap(),
        "--server-ids",
        "1,2",
        "--size",
        "200",
        "--count",
        "1000",
        "--rate",
        "20000",
    ]);
    assert_eq!(json_num(&json, "sent"), 1000.0, "{json}");
    assert_eq!(json_num(&json, "errors"), 0.0, "{json}");
    assert_eq!(got.len(), 1000, "received == sent");
    let (mut live, mut init, mut orphan, mut bad) = (0, 0, 0, 0);
    for (_, d) in &got {
        match parse(d, CID_LEN) {
            Ok(Header::Short { dcid }) => match ks.decode(dcid) {
                Ok(x) if [ServerId(1), ServerId(2)].contains(&x.server_id) => live += 1,
                _ => orphan += 1,
            },
            Ok(Header::Long(h)) if h.ty == LongType::Initial && d.len() == 1200 => init += 1,
            Err(_) => bad += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((live, init, orphan, bad), (600, 200, 100, 100));
    let _ = std::fs::remove_file(keys);
}

#[test]
fn gso_trains_from_many_sources() {
    let (keys, kf) = key_file();
    let ks = kf.key_set().unwrap();
    let keys_arg = keys.to_str().unwrap();
    // 1000 short headers of 100 bytes for server id 7, GSO trains of 8, two threads
    // of six sources each, 20 000/s in all.
    let flood: &[&str] = &["--mode", "short", "--keys", keys_arg, "--server-ids", "7", "--size", "100", "--gso", "8"];
    let flood = [flood, &["--threads", "2", "--sources", "6", "--count", "1000", "--rate", "20000"]].concat();
    let (json, got) = flood_into_sink(&flood);
    assert_eq!(json_num(&json, "sent"), 1000.0, "{json}");
    assert_eq!(got.len(), 1000, "GSO trains are split into single datagrams");
    let ports: HashSet<u16> = got.iter().map(|(p, _)| *p).collect();
    assert_eq!(ports.len(), 6, "every source socket used");
    for (_, d) in &got {
        assert_eq!(d.len(), 100);
        let Ok(Header::Short { dcid }) = parse(d, CID_LEN) else { panic!() };
        assert_eq!(ks.decode(dcid).unwrap().server_id, ServerId(7));
    }
    // The same flood into a GRO socket: each read is one send. Paced at 10 000/s
    // per thread, each sendmmsg call carries n >= 10 datagrams (except a thread's
    // last) as floor(n / 8) trains of 8 and at most one shorter one: at most
    // 2 x (500 / 8 + 1 + 500 / 10 + 1) = 230 sends, and full trains carry at least
    // 8/15 of every call's datagrams (the worst n is 15). Plain sends would be 1000
    // reads of 100 bytes, none of 800.
    let (json, sends) = flood_into_gro_sink(&flood);
    assert_eq!(json_num(&json, "sent"), 1000.0, "{json}");
    let sizes: Vec<usize> = sends.iter().map(|(_, d)| d.len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 100_000, "every byte arrived: {sizes:?}");
    assert!(sizes.iter().all(|n| n % 100 == 0 && *n <= 800), "whole segments, at most 8 per send: {sizes:?}");
    let trains = sizes.iter().filter(|n| **n == 800).count();
    assert!(sends.len() <= 230 && trains * 8 >= 500, "{} sends, {trains} of 8 segments: {sizes:?}", sends.len());
    for (_, d) in &sends {
        for seg in d.chunks(100) {
            let Ok(Header::Short { dcid }) = parse(seg, CID_LEN) else { panic!("segment {seg:?}") };
            assert_eq!(ks.decode(dcid).unwrap().server_id, ServerId(7));
        }
    }
    let _ = std::fs::remove_file(keys);
}

#[test]
fn rate_limit_holds() {
    let (json, got) =
        flood_into_sink(&["--mode", "garbage", "--size", "100", "--rate", "5000", "--duration", "1", "--cpus", "0"]);
    let sent = json_num(&json, "sent");
    // Paced, not flooded: within a batch of the target, and not far below it even on a busy machine.
    assert!((3500.0..=5200.0).contains(&sent), "{json}");
    assert_eq!(got.len() as f64, sent);
}

#[test]
fn initial_flood_is_well_formed() {
    // More than one pool (4100 per thread) so reuse is visible.
    let (json, got) = flood_into_sink(&["--mode", "initial", "--size", "1252", "--count", "6000", "--rate", "50000"]);
    assert_eq!(json_num(&json, "sent"), 6000.0);
    assert_eq!(got.len(), 6000);
    let mut dcids = HashSet::new();
    for (_, d) in &got {
        let Ok(Header::Long(h)) = parse(d, CID_LEN) else { panic!() };
        assert_eq!((h.ty, h.packet_len), (LongType::Initial, 1252));
        dcids.insert(h.dcid.to_vec());
    }
    assert_eq!(dcids.len(), 6000, "every Initial has a fresh DCID");
    let (_, got) = flood_into_sink(&[
        "--mode",
        "initial",
        "--size",
        "1200",
        "--count",
        "6000",
        "--rate",
        "50000",
        "--reuse-dcids",
    ]);
    let dcids: HashSet<Vec<u8>> = got.iter().map(|(_, d)| parse(d, CID_LEN).unwrap().dcid().to_vec()).collect();
    assert_eq!(dcids.len(), 4100, "--reuse-dcids cycles the pool");
}

#[test]
fn latency_against_an_echo_server() {
    let (keys, _) = key_file();
    let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
    rcvbuf(&echo, 4 << 20);
    echo.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let target = echo.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let h = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let start = Instant::now();
            while !stop.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(20) {
                if let Ok((n, from)) = echo.recv_from(&mut buf) {
                    let _ = echo.send_to(&buf[..n], from);
                }
            }
        })
    };
    let hgrm = temp_path("rtt.hgrm");
    let out = run(&[
        "--latency",
        "--target",
        &target,
        "--keys",
        keys.to_str().unwrap(),
        "--server-ids",
        "3,4",
        "--rate",
        "2000",
        "--duration",
        "1",
        "--size",
        "64",
        "--background-rate",
        "5000",
        "--hgrm-out",
        hgrm.to_str().unwrap(),
        "--json",
        "--quiet",
        "--drain-ms",
        "5000",
    ]);
    stop.store(true, Ordering::Release);
    h.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json_num(&json, "sent"), 2000.0, "{json}");
    assert_eq!(json_num(&json, "received"), 2000.0, "{json}");
    assert_eq!(json_num(&json, "lost"), 0.0, "{json}");
    assert!(json_num(&json, "background_sent") > 2000.0, "{json}");
    let (p50, p99, p999, max) =
        (json_num(&json, "p50_us"), json_num(&json, "p99_us"), json_num(&json, "p999_us"), json_num(&json, "max_us"));
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999 && p999 <= max, "{json}");
    assert!(max < 1_000_000.0, "a loopback echo takes well under a second: {json}");
    let text = std::fs::read_to_string(&hgrm).unwrap();
    assert!(text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"), "{text}");
    assert!(text.contains("Total count    =         2000]"), "{text}");
    let _ = std::fs::remove_file(hgrm);
    let _ = std::fs::remove_file(keys);
}

#[test]
fn bad_flags_are_clear_errors() {
    let (keys, _) = key_file();
    let bad_keys = temp_path("badkeys");
    std::fs::write(&bad_keys, "quicdemux-keys 1\nnewest 7 00\n").unwrap();
    let k = keys.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--target", "10.1.2.3:443", "--mode", "garbage"], "loopback"),
        (vec!["--target", "127.0.0.1:443", "--mode", "initial", "--size", "500"], "1200"),
        (vec!["--target", "127.0.0.1:443", "--mode", "short"], "--keys"),
        (vec!["--target", "127.0.0.1:443", "--mode", "bogus"], "unknown mode"),
        (vec!["--target", "127.0.0.1:443", "--rate=-1"], "rate"),
        (vec!["--target", "localhost"], "--target"),
        (vec!["--target", "127.0.0.1:443", "--duration", "0"], "duration"),
        (vec!["--target", "127.0.0.1:443", "--mode", "garbage", "--gso", "65"], "--gso"),
        (vec!["--target", "127.0.0.1:443", "--mode", "garbage", "--gso", "64", "--size", "1200"], "exceeds"),
        (vec!["--target", "127.0.0.1:443", "--threads", "4", "--sources", "2", "--mode", "garbage"], "--sources"),
        (vec!["--target", "127.0.0.1:443", "--keys", "/nonexistent/keys"], "key file"),
        (vec!["--target", "127.0.0.1:443", "--mode", "garbage", "--cpus", "4000"], "not available"),
        (vec!["--target", "127.0.0.1:443", "--mode", "garbage", "--cpus", "3-1"], "CPU"),
        (vec!["--target", "127.0.0.1:443", "--keys", bad_keys.to_str().unwrap()], "line 2"),
        (vec!["--target", "127.0.0.1:443", "--keys", k, "--server-ids", "9-1"], "backwards"),
        (vec!["--latency", "--target", "127.0.0.1:443", "--keys", k, "--server-ids", "1"], "fixed --rate"),
        (vec!["--latency", "--target", "127.0.0.1:443", "--server-ids", "1", "--rate", "10"], "--keys"),
        (
            vec![
                "--latency",
                "--target",
                "127.0.0.1:443",
                "--keys",
                k,
                "--server-ids",
                "1",
                "--rate",
                "10",
                "--size",
                "20",
            ],
            "--size",
        ),
    ];
    for (args, want) in cases {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: expected '{want}' in: {err}");
    }
    let _ = std::fs::remove_file(keys);
    let _ = std::fs::remove_file(bad_keys);
}
