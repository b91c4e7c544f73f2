//! `bench forward`: the cost of one host-to-host forward (docs/scaling.md, ADR 0005).
//!
//! Two standalone data planes play two hosts of a cluster (`--host-bits 2`, hosts 1
//! and 2, one key file, each other's `--peers`, the user path: `--fast-path off`),
//! each in its own network namespace with the anycast address 198.19.9.9 on `lo`
//! and a veth between them (198.18.0.1 / 198.18.0.2); a sink worker on host 2 with a
//! host-2 server id. Two runs with the same paced load of 1200-byte short headers for
//! that id, sent from inside the namespace of the host it goes to:
//!
//! - **direct**: sent to host 2 (its own id: forwarded to the sink as usual);
//! - **forwarded**: sent to host 1, which forwards each to host 2 in a frame; host 2
//!   verifies it and hands it to the sink's data connection (the sink is live there).
//!
//! Reported: each data plane's CPU time (utime + stime of the whole process, all
//! threads) per datagram the sink received, and the forward's extra CPU: (host 1 +
//! host 2 in the forwarded run) − (host 2 in the direct run).

use crate::cli::ForwardArgs;
use crate::dataplane::{demux_bin, g, sink, start_demux_at, stat_cpu_s, status, wait_placeable, Demux};
use crate::load::flow_payloads;
use crate::sys::pin;
use anyhow::{bail, Context, Result};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::mmsg::{SendMeta, SendMmsg};

/// Host 2's first server id with `--host-bits 2`: 2 << 14.
const SINK_ID: u16 = 2 << 14;
/// Datagrams per `sendmmsg` of the load generator.
const SEND_BATCH: usize = 32;
const PEER_PORT: u16 = 4434;

struct Run {
    received: u64,
    /// How long the sender took to send the run's datagrams (longer than asked when
    /// it cannot keep the pace).
    send_s: f64,
    cpu_host1_s: f64,
    cpu_host2_s: f64,
}

/// One repetition's figures: CPU µs per datagram received (the direct run's host 2,
/// the forwarded run's hosts 1 and 2) and the forwarded run's received rate.
struct Row {
    direct: f64,
    host1: f64,
    host2: f64,
    rate: f64,
}

const ANYCAST: &str = "198.19.9.9:4433";

/// Runs `ip args…` (in `ns` when given).
fn ip(ns: Option<&str>, args: &[&str]) -> Result<()> {
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["netns", "exec", ns, "ip"]);
    }
    let out = cmd.args(args).output().context("ip")?;
    if !out.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The two hosts' namespaces; removed on drop.
struct Namespaces([String; 2]);

impl Namespaces {
    fn build() -> Result<Namespaces> {
        let id = std::process::id();
        let ns = Namespaces([format!("qdf-1-{id}"), format!("qdf-2-{id}")]);
        for (i, n) in ns.0.iter().enumerate() {
            ip(None, &["netns", "add", n])?;
            ip(Some(n), &["link", "set", "lo", "up"])?;
            ip(Some(n), &["addr", "add", "198.19.9.9/32", "dev", "lo"])?;
            let _ = i;
        }
        ip(None, &["link", "add", "f1", "netns", &ns.0[0], "type", "veth", "peer", "name", "f2", "netns", &ns.0[1]])?;
        for (n, (dev, addr)) in ns.0.iter().zip([("f1", "198.18.0.1/30"), ("f2", "198.18.0.2/30")]) {
            ip(Some(n), &["addr", "add", addr, "dev", dev])?;
            ip(Some(n), &["link", "set", dev, "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = std::process::Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

fn host(bin: &std::path::Path, n: u16, keys: Option<&std::path::Path>, ns: &Namespaces, core: usize) -> Result<Demux> {
    let dir = std::env::temp_dir().join(format!("qdbench-forward-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (me, other) = if n == 1 { ("198.18.0.1", "198.18.0.2") } else { ("198.18.0.2", "198.18.0.1") };
    let peers = dir.join("peers");
    std::fs::write(&peers, format!("{} {other}:{PEER_PORT}\n", 3 - n))?;
    let (host_id, peers, listen) = (n.to_string(), peers.display().to_string(), format!("{me}:{PEER_PORT}"));
    let flags = [
        "--host-bits",
        "2",
        "--host-id",
        &host_id,
        "--peers",
        &peers,
        "--peer-listen",
        &listen,
        "--fast-path",
        "off",
        "--forward",
        "ring",
        "--limits",
        "off",
    ];
    let netns = &ns.0[usize::from(n) - 1];
    start_demux_at(bin, &format!("forward-{n}"), core, ANYCAST, keys, Some(netns), &flags)
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).context("netns")?;
    // SAFETY: setns(2) on a namespace fd we opened; it moves only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {ns}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn run_once(o: &ForwardArgs, to_host: u16) -> Result<Run> {
    let bin = demux_bin()?;
    let ns = Namespaces::build()?;
    let h1 = host(&bin, 1, None, &ns, o.shard_core)?;
    let h2 = host(&bin, 2, Some(&h1.dir.join("keys")), &ns, o.shard_core)?;
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    let s = sink(&h2, SINK_ID, o.load_core, stop.clone(), frames.clone())?;
    wait_placeable(&h2, 1, Duration::from_secs(10), "the sink is not live on host 2")?;
    // Both hosts must hear each other's heartbeats before host 1 forwards.
    let deadline = Instant::now() + Duration::from_secs(5);
    while g(&status(&h1)?, "/peers/peers_alive") != 1 {
        if Instant::now() > deadline {
            bail!("host 1 never heard host 2's heartbeat");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ks = h1.keys.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let payload = flow_payloads(&ks, &[SINK_ID], 1).swap_remove(0);
    let sender_ns = ns.0[usize::from(to_host) - 1].clone();
    let (p1, p2) = (h1.child.id(), h2.child.id());
    let (c1, c2) = (stat_cpu_s(p1), stat_cpu_s(p2));
    let f0 = frames.load(Ordering::Relaxed);
    let send_s = std::thread::scope(|sc| {
        sc.spawn(|| -> Result<f64> {
            pin(o.load_core);
            enter(&sender_ns)?;
            let sock = UdpSocket::bind("127.0.0.1:0").context("sender socket")?;
            sock.connect(ANYCAST)?;
            // Paced per batch of SEND_BATCH datagrams sent with one sendmmsg: the load
            // generator shares a core with the sink, and one `send` per datagram
            // (≈ 1.3 µs each) would make it the limit, not the data planes. The
            // datagrams stay separate (no GSO), as independent clients' would be.
            let mut sender = SendMmsg::new(SEND_BATCH, 1);
            let start = Instant::now();
            let n = (o.rate * o.seconds) as u64;
            for k in (0..n).step_by(SEND_BATCH) {
                let due = start + Duration::from_secs_f64(k as f64 / o.rate);
                if let Some(w) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(w);
                }
                let mut batch = sender.batch();
                for _ in 0..SEND_BATCH.min((n - k) as usize) {
                    batch.push(&[&payload[..]], SendMeta::default());
                }
                let _ = batch.send_from(&sock, 0, 0);
            }
            Ok(start.elapsed().as_secs_f64())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))?
    })?;
    std::thread::sleep(crate::load::SETTLE);
    let run = Run {
        received: frames.load(Ordering::Relaxed) - f0,
        send_s,
        cpu_host1_s: stat_cpu_s(p1) - c1,
        cpu_host2_s: stat_cpu_s(p2) - c2,
    };
    if to_host == 1 {
        let (s1, s2) = (status(&h1)?, status(&h2)?);
        if g(&s1, "/peers/forwarded") == 0 {
            bail!("host 1 forwarded nothing: {}", s1["peers"]);
        }
        // Where the datagrams went: what was lost before host 1's shard read it, what
        // host 1 sent (and in how many GSO trains), what host 2 accepted (read in how
        // many GRO trains) and handed over.
        println!(
            "  host 1: socket drops {}, forwarded {} in {} trains, errors {} | host 2: received {} in {} trains, handed over {} (dropped {})",
            g(&s1, "/socket_drops"),
            g(&s1, "/peers/forwarded"),
            g(&s1, "/peers/trains_sent"),
            g(&s1, "/peers/forward_errors"),
            g(&s2, "/peers/received"),
            g(&s2, "/peers/trains_received"),
            g(&s2, "/peers/handed_over"),
            g(&s2, "/peers/handed_over_dropped"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    drop((h1, h2));
    drop(ns);
    let _ = s.join();
    Ok(run)
}

pub fn main(o: ForwardArgs) -> Result<()> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench forward needs root (the owning host injects forwarded datagrams through a raw socket)");
    }
    let mut rows = Vec::new();
    for rep in 0..o.reps {
        let direct = run_once(&o, 2)?;
        let fwd = run_once(&o, 1)?;
        let per = |cpu: f64, n: u64| cpu * 1e6 / n.max(1) as f64;
        let d2 = per(direct.cpu_host2_s, direct.received);
        let (f1, f2) = (per(fwd.cpu_host1_s, fwd.received), per(fwd.cpu_host2_s, fwd.received));
        // Received per second of sending: the sink's rate while the load lasted.
        let rate = |r: &Run| r.received as f64 / r.send_s.max(1e-9);
        println!(
            "rep {rep}: direct: host 2 {d2:.2} µs/datagram ({} received, {:.0}/s) | forwarded: host 1 {f1:.2} + host 2 {f2:.2} µs/datagram ({} received, {:.0}/s over {:.2} s of sending) | forward's extra CPU {:.2} µs/datagram",
            direct.received,
            rate(&direct),
            fwd.received,
            rate(&fwd),
            fwd.send_s,
            f1 + f2 - d2
        );
        rows.push(Row { direct: d2, host1: f1, host2: f2, rate: rate(&fwd) });
    }
    let med = |f: &dyn Fn(&Row) -> f64| crate::report::median(rows.iter().map(f).collect());
    println!(
        "median of {} reps at {} datagrams/s for {} s (1200-byte short headers; CPU from /proc/PID/stat, 10 ms ticks): \
         direct host 2 {:.2} µs; forwarded host 1 {:.2} µs + host 2 {:.2} µs; extra {:.2} µs per datagram; \
         forwarded datagrams received {:.0}/s",
        o.reps,
        o.rate,
        o.seconds,
        med(&|r| r.direct),
        med(&|r| r.host1),
        med(&|r| r.host2),
        med(&|r| r.host1 + r.host2 - r.direct),
        med(&|r| r.rate)
    );
    Ok(())
}
