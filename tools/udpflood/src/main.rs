//! udpflood: quicdemux's load generator and latency probe. Loopback targets only.
//!
//! Load:    udpflood --target 127.0.0.1:4433 --mode short --keys keys --server-ids 1,2 \
//!                   --size 1200 --rate max --duration 10 --threads 2 --sources 64 [--gso 8]
//! Spoofed: udpflood --target 127.0.0.1:4433 --mode initial --spoof-sources 100000
//! Latency: udpflood --latency --target 127.0.0.1:4433 --keys keys --server-ids 1,2 \
//!                   --rate 1000 --duration 10 [--background-rate 200000] [--hgrm-out rtt.hgrm]
//! HTTP/3:  udpflood --latency-h3 --url https://127.0.0.1:4433/bytes/0 --connections 8 --requests 1000

mod flood;
mod h3lat;
mod hgrm;
mod latency;
mod packets;
mod sys;

use anyhow::Context;
use clap::Parser;
use packets::Mode;
use proto::cid::{KeySet, ServerId};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
struct Ids(Vec<ServerId>);

fn parse_ids(s: &str) -> Result<Ids, String> {
    packets::parse_server_ids(s).map(Ids)
}

#[derive(Clone, Debug)]
struct Cpus(Vec<usize>);

/// "1", "0,1", "0-3".
fn parse_cpus(s: &str) -> Result<Cpus, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| format!("CPU '{x}' is not a number"));
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if a > b || b - a > 4096 {
            return Err(format!("bad CPU range '{part}'"));
        }
        out.extend(a..=b);
    }
    if out.is_empty() {
        return Err("empty CPU list".into());
    }
    Ok(Cpus(out))
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("'{s}' is not a duration in (0, 86400] seconds")),
    }
}

fn parse_pps(s: &str) -> Result<f64, String> {
    match flood::parse_rate(s)? {
        flood::Rate::Pps(v) => Ok(v),
        flood::Rate::Max => Err("a fixed rate is needed here, not 'max'".into()),
    }
}

#[derive(Parser, Debug)]
#[command(name = "udpflood", version, about = "quicdemux load generator and latency probe (loopback targets only)")]
struct Args {
    /// Where to send: ADDR:PORT on 127.0.0.0/8 or [::1].
    #[arg(long)]
    target: Option<SocketAddr>,
    /// Datagram kind: initial, short, orphan, garbage or mix (6 short : 2 initial : 1 orphan : 1 garbage).
    #[arg(long, default_value = "short")]
    mode: Mode,
    /// UDP payload bytes per datagram (initial: >= 1200; short/orphan: >= 33).
    #[arg(long, default_value_t = 1200)]
    size: usize,
    /// Datagrams per second in total, or 'max'. With --latency: probes per second.
    #[arg(long, default_value = "max", value_parser = flood::parse_rate)]
    rate: flood::Rate,
    /// Seconds to run.
    #[arg(long, default_value = "10", value_parser = parse_secs)]
    duration: Duration,
    /// Sender threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Source sockets in total (spread over the threads); default: one per thread.
    #[arg(long)]
    sources: Option<usize>,
    /// Send UDP GSO trains of this many --size datagrams per message (1..=64).
    #[arg(long)]
    gso: Option<usize>,
    /// Key file (quicdemux-keys 1) to mint ADR 0001 CIDs with.
    #[arg(long)]
    keys: Option<PathBuf>,
    /// Live server ids, e.g. "1,2,10-12": short datagrams go to them, orphans avoid them.
    #[arg(long, value_parser = parse_ids)]
    server_ids: Option<Ids>,
    /// Pin sender thread i to the i-th CPU of this list (cyclically), e.g. "1" or "0-1".
    /// With --latency: pins the background sender.
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<Cpus>,
    /// initial/mix: send the 4096 prebuilt Initials per thread as they are (repeating
    /// DCIDs hit the demux's pin table) instead of with a fresh DCID each time.
    #[arg(long)]
    reuse_dcids: bool,
    /// Send each datagram from a random one of N loopback source addresses (127.1.0.0
    /// onwards, IP_PKTINFO; IPv4 target, no --gso) instead of from --sources sockets:
    /// a flood from many clients, e.g. 100000.
    #[arg(long)]
    spoof_sources: Option<u32>,
    /// Stop after this many datagrams (or probes) in total.
    #[arg(long)]
    count: Option<u64>,
    /// Print the final summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Latency mode: timestamped probes to echo workers, round trips in an HDR histogram.
    #[arg(long)]
    latency: bool,
    /// Latency mode: background load in datagrams/s from another thread.
    #[arg(long, value_parser = parse_pps)]
    background_rate: Option<f64>,
    /// Latency mode: background load kind (short or mix).
    #[arg(long, default_value = "short")]
    background_mode: Mode,
    /// Latency mode: write the round-trip distribution (µs) as an HdrHistogram .hgrm file.
    #[arg(long)]
    hgrm_out: Option<PathBuf>,
    /// Latency mode: milliseconds to wait for echoes after the last probe.
    #[arg(long, default_value_t = 1000)]
    drain_ms: u64,
    /// HTTP/3 latency mode: requests over real QUIC connections (quinn + h3). The server
    /// certificate is NOT verified (insecure, for benchmarks only).
    #[arg(long)]
    latency_h3: bool,
    /// HTTP/3 latency mode: the URL to GET, e.g. https://127.0.0.1:4433/bytes/0 (loopback only).
    #[arg(long, value_parser = h3lat::parse_url)]
    url: Option<h3lat::Target>,
    /// HTTP/3 latency mode: concurrent QUIC connections, each from its own source port.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// HTTP/3 latency mode: requests per connection, one after another.
    #[arg(long, default_value_t = 100)]
    requests: u64,
    /// HTTP/3 latency mode: seconds one handshake or request may take.
    #[arg(long, default_value = "5", value_parser = parse_secs)]
    request_timeout: Duration,
}

impl Args {
    fn target(&self) -> anyhow::Result<SocketAddr> {
        self.target.context("--target ADDR:PORT is required")
    }
}

fn load_keys(path: &Option<PathBuf>) -> anyhow::Result<Option<KeySet>> {
    let Some(p) = path else { return Ok(None) };
    let text = std::fs::read_to_string(p).with_context(|| format!("reading key file {}", p.display()))?;
    let kf = proto::keyfile::KeyFile::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    let ks = kf.key_set().map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    Ok(Some(ks))
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn run_flood(a: &Args, keys: Option<KeySet>, ids: Vec<ServerId>) -> anyhow::Result<()> {
    let threads = a.threads;
    let cfg = flood::Config {
        target: a.target()?,
        spec: packets::Spec { mode: a.mode, size: a.size, keys, server_ids: ids, fixed_size: a.gso.is_some() },
        rate: a.rate,
        duration: a.duration,
        threads,
        sources: a.sources.unwrap_or(threads),
        gso: a.gso,
        count: a.count,
        progress: !a.quiet,
        label: "",
        cpus: a.cpus.clone().map(|c| c.0).unwrap_or_default(),
        reuse_dcids: a.reuse_dcids,
        spoof_sources: a.spoof_sources,
    };
    let s = flood::run(&cfg, Arc::new(AtomicBool::new(false)))?;
    if a.json {
        println!(
            "{{\"mode\":{},\"target\":{},\"size\":{},\"threads\":{},\"sources\":{},\"gso\":{},\"sent\":{},\"errors\":{},\"bytes\":{},\"elapsed_s\":{:.6},\"datagrams_per_s\":{:.1},\"last_error\":{}}}",
            json_str(a.mode.name()),
            json_str(&a.target()?.to_string()),
            a.size,
            cfg.threads,
            cfg.sources,
            a.gso.unwrap_or(0),
            s.sent,
            s.errors,
            s.bytes,
            s.elapsed.as_secs_f64(),
            s.rate(),
            s.last_error.as_deref().map_or("null".to_string(), json_str)
        );
    } else {
        println!(
            "udpflood: mode {} size {} -> {}: sent {} datagrams in {:.3} s = {:.0} datagrams/s ({:.1} MB/s), errors {}{}",
            a.mode.name(),
            a.size,
            cfg.target,
            s.sent,
            s.elapsed.as_secs_f64(),
            s.rate(),
            s.bytes as f64 / s.elapsed.as_secs_f64().max(1e-9) / 1e6,
            s.errors,
            s.last_error.map(|e| format!(" (last: {e})")).unwrap_or_default()
        );
    }
    Ok(())
}

fn run_latency(a: &Args, keys: Option<KeySet>, ids: Vec<ServerId>) -> anyhow::Result<()> {
    let keys = keys.context("--latency needs --keys FILE")?;
    let rate = match a.rate {
        flood::Rate::Pps(r) => r,
        flood::Rate::Max => anyhow::bail!("--latency needs a fixed --rate (probes/s), not 'max'"),
    };
    if !matches!(a.background_mode, Mode::Short | Mode::Mix) {
        anyhow::bail!("--background-mode must be short or mix");
    }
    let cfg = latency::Config {
        target: a.target()?,
        keys,
        server_ids: ids,
        rate,
        duration: a.duration,
        size: a.size,
        count: a.count,
        drain: Duration::from_millis(a.drain_ms.min(60_000)),
        background: a.background_rate.map(|r| (a.background_mode, r)),
        background_cpus: a.cpus.clone().map(|c| c.0).unwrap_or_default(),
        progress: !a.quiet,
    };
    let r = latency::run(&cfg, Arc::new(AtomicBool::new(false)))?;
    if let Some(p) = &a.hgrm_out {
        std::fs::write(p, hgrm::percentile_distribution(&r.hist, 5, 1000.0))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let [p50, p90, p99, p999] = [0.5, 0.9, 0.99, 0.999].map(|q| r.us(q));
    let (max, mean) = (r.max_us(), if r.hist.is_empty() { 0.0 } else { r.hist.mean() / 1000.0 });
    let (sent, received, lost, dup) = (r.sent, r.received, r.lost, r.duplicates);
    let bg_sent = r.background.as_ref().map(|b| b.sent);
    if a.json {
        let bg = bg_sent.map_or("null".to_string(), |v| v.to_string());
        println!(
            "{{\"target\":{},\"rate\":{rate},\"size\":{},\"sent\":{sent},\"received\":{received},\"lost\":{lost},\"duplicates\":{dup},\"send_errors\":{},\"ignored\":{},\"p50_us\":{p50:.3},\"p90_us\":{p90:.3},\"p99_us\":{p99:.3},\"p999_us\":{p999:.3},\"max_us\":{max:.3},\"mean_us\":{mean:.3},\"elapsed_s\":{:.6},\"background_sent\":{bg}}}",
            json_str(&a.target()?.to_string()),
            a.size,
            r.send_errors,
            r.ignored,
            r.elapsed.as_secs_f64(),
        );
    } else {
        let bg = bg_sent.map(|v| format!(" | background sent {v}")).unwrap_or_default();
        println!(
            "udpflood latency -> {}: probes sent {sent} received {received} lost {lost} dup {dup} | RTT p50 {p50:.1} µs  p90 {p90:.1} µs  p99 {p99:.1} µs  p99.9 {p999:.1} µs  max {max:.1} µs{bg}",
            cfg.target,
        );
    }
    Ok(())
}

fn us(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else if q >= 1.0 {
        h.max() as f64 / 1000.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

fn run_h3(a: &Args) -> anyhow::Result<()> {
    let target = a.url.clone().context("--latency-h3 needs --url https://127.0.0.1:PORT/PATH")?;
    let cfg = h3lat::Config {
        target,
        connections: a.connections,
        requests: a.requests,
        duration: a.duration,
        timeout: a.request_timeout,
    };
    let r = h3lat::run(&cfg)?;
    if let Some(p) = &a.hgrm_out {
        std::fs::write(p, hgrm::percentile_distribution(&r.hist, 5, 1000.0))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let (h, hs) = (&r.hist, &r.handshake);
    let [p50, p90, p99, p999, max] = [0.5, 0.9, 0.99, 0.999, 1.0].map(|q| us(h, q));
    let (hs50, hs_max) = (us(hs, 0.5), us(hs, 1.0));
    let (ok, failed) = (r.requests_ok, r.requests_failed);
    let (c_ok, c_failed) = (r.connections_ok, r.connections_failed);
    if a.json {
        let per_s = ok as f64 / r.elapsed.as_secs_f64().max(1e-9);
        println!(
            "{{\"url\":{},\"connections_ok\":{c_ok},\"connections_failed\":{c_failed},\"requests_ok\":{ok},\"requests_failed\":{failed},\"p50_us\":{p50:.3},\"p90_us\":{p90:.3},\"p99_us\":{p99:.3},\"p999_us\":{p999:.3},\"max_us\":{max:.3},\"handshake_p50_us\":{hs50:.3},\"handshake_max_us\":{hs_max:.3},\"elapsed_s\":{:.6},\"requests_per_s\":{per_s:.1},\"last_error\":{}}}",
            json_str(&cfg.target.uri.to_string()),
            r.elapsed.as_secs_f64(),
            r.last_error.as_deref().map_or("null".to_string(), json_str)
        );
    } else {
        let last = r.last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default();
        println!(
            "udpflood h3 latency -> {}: connections {c_ok} ok {c_failed} failed | requests {ok} ok {failed} failed | p50 {p50:.1} µs  p90 {p90:.1} µs  p99 {p99:.1} µs  p99.9 {p999:.1} µs  max {max:.1} µs | handshake p50 {hs50:.1} µs max {hs_max:.1} µs{last}",
            cfg.target.uri,
        );
    }
    if r.requests_ok == 0 {
        anyhow::bail!("no request succeeded");
    }
    Ok(())
}

fn real_main() -> anyhow::Result<()> {
    let a = Args::parse();
    let keys = load_keys(&a.keys)?;
    let ids = a.server_ids.clone().map(|i| i.0).unwrap_or_default();
    if a.latency_h3 {
        run_h3(&a)
    } else if a.latency {
        run_latency(&a, keys, ids)
    } else {
        run_flood(&a, keys, ids)
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("udpflood: error: {e:#}");
        std::process::exit(1);
    }
}
