//! An Initial flood below any Retry threshold against a real data plane and a real
//! `worker` under an Initial flood (docs/operations.md "Liveness and pressure"): real ClientHello Initials (quinn-proto clients, one
//! unique DCID each) from `FLOOD_SOURCES` loopback addresses (127.1.x.y, one socket,
//! the source address set per datagram with IP_PKTINFO), `FLOOD_PER_SOURCE` each, at
//! `FLOOD_RATE`/s. The demux runs `--retry off --limits off --pressure-retry-above 0
//! --pressure-drop-above 0`, so every Initial is placed on the worker, and the
//! worker's own overload path (a Retry over `--max-handshakes`) answers the flood.
//! The data plane and the worker are release builds (`testkit::bin::release_bin`):
//! a debug worker spent over a second of CPU on the 256 full handshakes it admits at
//! the flood's start, so its second legitimate connection waited the Initial PTO in
//! most runs, a cost of the debug build that the latency checks below would measure.
//!
//! Asserts: the worker's RSS stays under 300 MB and comes back within 2× its idle RSS
//! within 30 s after the flood; nothing on the path drops a datagram (the legitimate
//! client's socket, the data plane's socket, the ring, the worker's sends), the data
//! plane places every Initial (counted exactly) and the worker receives every datagram
//! it forwards; a legitimate quinn client from 127.0.0.1, connecting anew every 50 ms
//! during the flood, completes every request, none of its connections waits for
//! quinn's Initial probe timeout (PTO, 1 s before any RTT sample: what a lost first
//! flight costs), and so every time to first byte (connect + request + response head)
//! is within 1 s. The measured figures are printed (`--nocapture`).
//! `FLOOD_WORKER_ARGS` adds worker flags.
//!
//! Why the pressure thresholds are off: at its handshake cap (256, which the flood
//! keeps full) the worker admits a Retry-validated client beyond the cap, so its next
//! `Load` report says 257, above the default `--pressure-retry-above 256`. For that
//! 250 ms report interval the data plane answers every token-less Initial for the
//! worker with a Retry, and under `--retry off`, which cannot mint one, drops it
//! (`retry.dropped`, docs/operations.md "Liveness and pressure"): the legitimate
//! client's next connection lost its first Initial and waited the 1 s PTO (the ≈ 1 in
//! 70 slow handshakes of earlier runs of this test, each one in such a window).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn env_or(k: &str, d: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        testkit::bin::kill_and_reap(&mut self.0);
    }
}

fn wait_for(path: &Path, child: &mut Child, log: &Path, what: &str) -> String {
    testkit::bin::wait_ready_file(path, child, log, what, Duration::from_secs(30))
}

/// The data plane's status JSON (`reasons`: Placed, Owner, dropped…; per-instance
/// datagrams), or Null when it does not answer.
fn demux_status(control: &Path) -> serde_json::Value {
    use proto::wire::Admin;
    match sys::control::request(control, &[&Admin::StatusRequest]).map(|r| r.msg) {
        Ok(Admin::Status { json }) => serde_json::from_str(&json).unwrap_or_default(),
        _ => serde_json::Value::Null,
    }
}

/// utime + stime of `pid` in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `n` real client Initials (RFC 9000 §17.2.2), each the first datagram of a fresh
/// quinn-proto client connection: a full TLS 1.3 ClientHello (X25519 only, so it fits
/// one 1200-byte datagram) and a random DCID.
fn initials(n: usize, server: SocketAddr) -> Vec<Vec<u8>> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let qc = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic client config");
    let cfg = quinn_proto::ClientConfig::new(Arc::new(qc));
    let mut out = Vec::with_capacity(n);
    let mut ep = None;
    for i in 0..n {
        if i % 1000 == 0 {
            ep = Some(quinn_proto::Endpoint::new(Arc::new(quinn_proto::EndpointConfig::default()), None, false, None));
        }
        let Some(ep) = ep.as_mut() else { unreachable!() };
        let now = Instant::now();
        let (_, mut conn) = ep.connect(now, cfg.clone(), server, "localhost").expect("connect");
        let mut buf = Vec::with_capacity(1500);
        let t = conn.poll_transmit(now, 1, &mut buf).expect("an Initial");
        buf.truncate(t.size);
        out.push(buf);
    }
    out
}

/// quinn-proto's `PTO fired` trace events in this process, by packet-number space
/// (`Initial`, `Handshake`, `Data`): every quinn connection in it is the legitimate
/// client's (the flood's Initials come from quinn-proto endpoints that are never
/// driven).
#[derive(Clone, Default)]
struct Ptos(Arc<Mutex<Vec<String>>>);

impl Ptos {
    fn count(&self, space: &str) -> usize {
        self.0.lock().expect("lock").iter().filter(|s| *s == space).count()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Ptos {
    fn register_callsite(&self, m: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        // quinn-proto 0.11 `Connection::on_loss_detection_timeout`:
        // trace!(in_flight, count, ?space, "PTO fired").
        let pto = m.is_event() && m.target() == "quinn_proto::connection" && m.fields().field("in_flight").is_some();
        if pto {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            space: String,
            message: String,
        }
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                match f.name() {
                    "space" => self.space = format!("{v:?}"),
                    "message" => self.message = format!("{v:?}"),
                    _ => {}
                }
            }
        }
        let mut f = Fields::default();
        e.record(&mut f);
        if f.message == "PTO fired" {
            self.0.lock().expect("lock").push(f.space);
        }
    }
}

/// Datagrams the kernel dropped on the UDP socket bound to 127.0.0.1:`port` (`ss -m`,
/// skmem `d`: receive-queue overflows and other receive drops).
fn socket_drops(port: u16) -> u64 {
    let out = Command::new("ss")
        .args(["-u", "-a", "-n", "-m", "-H", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) to read the client socket's drop counter");
    let text = String::from_utf8_lossy(&out.stdout);
    let d = text.split(['(', ')', ',']).filter_map(|f| f.strip_prefix('d')?.parse::<u64>().ok()).collect::<Vec<_>>();
    assert_eq!(d.len(), 1, "one socket on port {port}: {text}");
    d[0]
}

#[derive(Debug, Default)]
struct Legit {
    ok: u64,
    failed: u64,
    ttfb_ms: Vec<u64>,
    errors: Vec<String>,
}

#[test]
fn initial_flood_is_bounded_and_memory_returns() {
    let sources = env_or("FLOOD_SOURCES", 12_000);
    let per_source = env_or("FLOOD_PER_SOURCE", 3);
    let rate = env_or("FLOOD_RATE", 6_000);
    assert!(sources <= 65_000);

    let dir = temp_dir("flood");
    let demux = testkit::bin::release_bin("demux", "demux");
    let keys = dir.join("keys");
    assert!(Command::new(&demux).args(["gen-keys", "--out"]).arg(&keys).status().expect("gen-keys").success());
    let (data, control, ready, dlog) =
        (dir.join("d.sock"), dir.join("c.sock"), dir.join("ready"), dir.join("demux.log"));
    let mut cmd = Command::new(&demux);
    cmd.args(["dataplane", "--listen", "127.0.0.1:0", "--cores", "0", "--io", "mmsg", "--retry", "off"]);
    cmd.args(["--limits", "off", "--pressure-retry-above", "0", "--pressure-drop-above", "0"]);
    let mut d = testkit::bin::dataplane_files(&mut cmd, &keys, &data, &control, &ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&dlog).expect("log"))
        .spawn()
        .expect("spawn demux");
    let text = wait_for(&ready, &mut d, &dlog, "demux");
    let _d = Kill(d);
    let addr: SocketAddr = text.lines().find_map(|l| l.strip_prefix("udp ")).and_then(|a| a.parse().ok()).expect("udp");

    let c = cert(&dir);
    let (wready, wlog) = (dir.join("w.ready"), dir.join("w.log"));
    let extra = std::env::var("FLOOD_WORKER_ARGS").unwrap_or_default();
    let mut w = Command::new(testkit::bin::release_bin("worker", "worker"))
        .args(["--server-id", "1", "--fast-path", "off", "--keys"])
        .arg(&keys)
        .arg("--data-socket")
        .arg(&data)
        .arg("--cert")
        .arg(&c.cert)
        .arg("--key")
        .arg(&c.key)
        .arg("--ready-file")
        .arg(&wready)
        .args(extra.split_whitespace())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&wlog).expect("log"))
        .spawn()
        .expect("spawn worker");
    wait_for(&wready, &mut w, &wlog, "worker");
    let wpid = w.id();
    let mut w = Kill(w);

    let ptos = Ptos::default();
    {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(ptos.clone());
        tracing::subscriber::set_global_default(subscriber).expect("the PTO counter is the only subscriber");
    }
    let t0 = Instant::now();
    let dgrams = Arc::new(initials(sources * per_source, addr));
    println!("generated {} Initials ({} bytes each) in {:?}", dgrams.len(), dgrams[0].len(), t0.elapsed());

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    // Warm up (one request), then the idle RSS.
    rt.block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, addr).await.expect("warm-up connect");
        h.get("/health").await.expect("warm-up request");
        h.close();
    });
    std::thread::sleep(Duration::from_secs(1));
    let idle = rss_kib(wpid);
    let cpu0 = cpu_ticks(wpid);

    // RSS sampler.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(idle));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(wpid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // The flood: round r sends datagram r·sources + s from source s.
    let flooding = Arc::new(AtomicBool::new(true));
    let flood = {
        let (dgrams, flooding) = (dgrams.clone(), flooding.clone());
        std::thread::spawn(move || {
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("flood socket");
            let state = quinn_udp::UdpSocketState::new((&sock).into()).expect("udp state");
            let start = Instant::now();
            let (mut sent, mut errors) = (0u64, 0u64);
            for (i, d) in dgrams.iter().enumerate() {
                let s = (i % sources) as u32;
                let src = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 1, 0, 0)) + s);
                let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
                if let Some(w) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(w);
                }
                let t = quinn_udp::Transmit {
                    destination: addr,
                    ecn: None,
                    contents: d,
                    segment_size: None,
                    src_ip: Some(IpAddr::V4(src)),
                };
                match state.try_send((&sock).into(), &t) {
                    Ok(()) => sent += 1,
                    Err(_) => errors += 1,
                }
            }
            flooding.store(false, Ordering::Relaxed);
            (sent, errors, start.elapsed())
        })
    };

    // The legitimate client during the flood.
    let legit = Arc::new(Mutex::new(Legit::default()));
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c)
    };
    let client_port = ep.local_addr().expect("client address").port();
    let client_drops_before = socket_drops(client_port);
    let ptos_before = (ptos.count("Initial"), ptos.count("Handshake"), ptos.count("Data"));
    rt.block_on(async {
        while flooding.load(Ordering::Relaxed) {
            let started = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(10), async {
                let mut h = H3::connect(&ep, addr).await.map_err(|e| e.to_string())?;
                let r = h.get("/health").await.map_err(|e| e.to_string());
                h.close();
                r
            })
            .await;
            {
                let mut l = legit.lock().expect("lock");
                match r {
                    Ok(Ok(resp)) if resp.status == 200 => {
                        l.ok += 1;
                        l.ttfb_ms.push(started.elapsed().as_millis() as u64);
                    }
                    other => {
                        l.failed += 1;
                        l.errors.push(format!("{other:?}"));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let (sent, errors, took) = flood.join().expect("flood thread");
    let client_drops = socket_drops(client_port) - client_drops_before;
    let initial_ptos = ptos.count("Initial") - ptos_before.0;
    let later_ptos = (ptos.count("Handshake") - ptos_before.1, ptos.count("Data") - ptos_before.2);
    drop(ep);
    let flood_end = Instant::now();
    let cpu_flood = cpu_ticks(wpid) - cpu0;
    let peak_during = peak.load(Ordering::Relaxed);

    // Back within 2× idle within 30 s?
    let mut back_after = None;
    let mut last = 0;
    while flood_end.elapsed() < Duration::from_secs(30) {
        last = rss_kib(wpid);
        if last <= 2 * idle {
            back_after = Some(flood_end.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let peak_all = peak.load(Ordering::Relaxed);

    let status = demux_status(&control);
    // The worker's counters (exit line on SIGTERM).
    // SAFETY: signals the worker process this test started.
    unsafe { libc::kill(wpid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && matches!(w.0.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(&wlog).unwrap_or_default();
    let exit = log.lines().find(|l| l.starts_with("worker exit:")).unwrap_or("(no exit line)").to_string();
    let dlog_text = std::fs::read_to_string(&dlog).unwrap_or_default();
    let _ = &mut w;

    let l = legit.lock().expect("lock");
    let max_ttfb = l.ttfb_ms.iter().copied().max().unwrap_or(0);
    println!(
        "flood: {sent} sent ({errors} errors) from {sources} sources × {per_source} in {took:?} ({rate}/s); \
         worker CPU during it {} ms\n\
         worker RSS: idle {} MiB, peak during flood {} MiB, peak overall {} MiB, back ≤ 2× idle after {:?} (last {} MiB)\n\
         legit client: {} ok, {} failed, TTFB ms {:?} (max {max_ttfb}); PTOs: {initial_ptos} Initial, \
         {} Handshake, {} Data; its socket dropped {client_drops}\n{exit}\ndemux: reasons {} socket drops {} \
         instances {}",
        cpu_flood * 10,
        idle / 1024,
        peak_during / 1024,
        peak_all / 1024,
        back_after,
        last / 1024,
        l.ok,
        l.failed,
        l.ttfb_ms,
        later_ptos.0,
        later_ptos.1,
        status["reasons"],
        status["socket_drops"],
        status["instances"],
    );
    if !l.errors.is_empty() {
        println!("legit errors: {:?}", &l.errors[..l.errors.len().min(5)]);
    }
    let _ = dlog_text;
    assert!(sources >= 10_000 || std::env::var("FLOOD_SOURCES").is_ok(), "the flood must come from ≥ 10 000 sources");
    assert!(errors == 0 || errors * 100 < sent, "flood sends failed: {errors}");
    assert!(peak_all < 300 * 1024, "worker RSS peaked at {} MiB (bound 300 MiB)", peak_all / 1024);
    assert!(back_after.is_some(), "RSS {} MiB 30 s after the flood, idle {} MiB", last / 1024, idle / 1024);
    assert!(l.ok > 0 && l.failed == 0, "legit client: {} ok, {} failed: {:?}", l.ok, l.failed, l.errors);

    let n =
        |p: &str| status.pointer(p).and_then(serde_json::Value::as_u64).unwrap_or_else(|| panic!("{p} in {status}"));
    let stat = |k: &str| exit_stat(&log, k).unwrap_or_else(|| panic!("{k} in {exit}"));
    let legit_conns = 1 + l.ok + l.failed;
    // Nothing on the path dropped a datagram: the legitimate client's socket, the data
    // plane's socket (the shard kept up), the worker's ring, the worker's sends.
    let drops = [
        ("legit client socket", client_drops),
        ("data plane socket", n("/socket_drops")),
        ("ring (drops_full)", n("/instances/0/drops_full")),
        ("worker sends", stat("udp_errors")),
    ];
    assert!(drops.iter().all(|d| d.1 == 0), "datagrams dropped on the path: {drops:?}");
    // Every Initial is accounted for, by the data plane: each flood Initial (a fresh
    // DCID) and each legitimate connection's first Initial (the warm-up and one per
    // attempt) is Placed, exactly once (a first Initial sent again would be Pinned);
    // nothing is refused by reason (`refused`: rate, handshakes, overloaded under
    // worker pressure), answered with a Retry or counted as a Retry not sent
    // (`retry`), or dropped for want of an instance (`NoInstance`).
    let by_reason = [
        "/reasons/Placed",
        "/reasons/Pinned",
        "/reasons/NoInstance",
        "/refused/RateLimited",
        "/refused/HandshakeLimited",
        "/refused/Overloaded",
        "/retry/sent",
        "/retry/dropped",
        "/retry/send_errors",
        "/socket_drops",
    ];
    let accounted: u64 = by_reason.iter().map(|p| n(p)).sum();
    let shown: Vec<String> = by_reason.iter().map(|p| format!("{p}={}", n(p))).collect();
    println!("accounted: {accounted} = {}", shown.join(" "));
    assert_eq!(
        (n("/reasons/Placed"), accounted),
        (sent + legit_conns, sent + legit_conns),
        "{sent} flood Initials + {legit_conns} legitimate connections' first Initials: {shown:?}"
    );
    for r in ["/reasons/NotQuic", "/reasons/VersionNegotiation"] {
        assert_eq!(n(r), 0, "{r}: {}", status["reasons"]);
    }
    // Every datagram routed to the one instance was forwarded to it and read by the
    // worker: one frame per datagram, or per GRO train (the legitimate client's GSO
    // bursts; `trains_in`, each of 2 to 64 datagrams). A datagram with no live owner
    // (`Orphan`, `Departed`) goes to a serving instance too, for its stateless reset
    // (proto::route, RFC 9000 §10.3).
    let routed =
        ["Placed", "Owner", "Pinned", "Orphan", "Departed"].iter().map(|r| n(&format!("/reasons/{r}"))).sum::<u64>();
    let (forwarded, read, trains) = (n("/instances/0/datagrams"), stat("frames"), n("/trains_in"));
    assert_eq!(forwarded, routed, "routed to the worker but not forwarded: {}", status["instances"]);
    assert!(
        read <= forwarded && (trains..=63 * trains).contains(&(forwarded - read)),
        "{forwarded} datagrams forwarded ({trains} GRO trains), {read} frames read by the worker: {exit}"
    );
    // So no legitimate connection lost its first flight: none waited quinn's Initial
    // PTO (1 s), and every request had its response head within 1 s.
    assert_eq!(initial_ptos, 0, "legitimate connections waited the 1 s Initial PTO; TTFB ms {:?}", l.ttfb_ms);
    assert!(
        max_ttfb <= 1000,
        "legit client: TTFB up to {max_ttfb} ms without a lost first flight (queueing: RSS, CPU above): {:?}",
        l.ttfb_ms
    );
    // The worker: each placed flood Initial became an `Incoming` that was retried
    // (over --max-handshakes), refused or ignored, or accepted and then timed out
    // (its client never answers); the legitimate ones completed.
    let answered = stat("overload_retries") + stat("overload_ignored") + stat("refused") + stat("handshake_timeouts");
    let placed = n("/reasons/Placed");
    assert!(answered + 3 * legit_conns >= placed, "the worker answered {answered} of {placed} placed Initials: {exit}");
    assert_eq!(stat("connections"), legit_conns, "{exit}");
}

fn exit_stat(log: &str, key: &str) -> Option<u64> {
    Worker::exit_stat(log, key)
}
