//! The load generator: N threads, each with its own connected source sockets,
//! sending prebuilt datagrams with sendmmsg (optionally as UDP GSO trains),
//! paced by a per-thread token bucket.

use crate::packets::{Pool, Rng, Spec};
use crate::sys::{self, MmsgSender, SpoofSender};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Datagrams per sendmmsg call.
pub const BATCH: usize = 64;
/// Prebuilt datagrams per thread (cycled).
const POOL_DATAGRAMS: usize = 4096;
/// The longest single sleep of the pacing loop, so stop and deadline are seen promptly.
const MAX_SLEEP: Duration = Duration::from_millis(5);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    Max,
    /// Datagrams per second, in total over all threads.
    Pps(f64),
}

pub fn parse_rate(s: &str) -> Result<Rate, String> {
    if s == "max" {
        return Ok(Rate::Max);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e9 => Ok(Rate::Pps(v)),
        _ => Err(format!("rate '{s}' must be 'max' or a number of datagrams/s in (0, 1e9]")),
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub target: SocketAddr,
    pub spec: Spec,
    pub rate: Rate,
    pub duration: Duration,
    pub threads: usize,
    pub sources: usize,
    /// Segments per GSO train; None = one datagram per message.
    pub gso: Option<usize>,
    pub count: Option<u64>,
    /// Print a progress line to stderr every second.
    pub progress: bool,
    /// Prefix of progress lines.
    pub label: &'static str,
    /// Pin sender thread i to CPU cpus[i % len] (empty: no pinning).
    pub cpus: Vec<usize>,
    /// Send the pool's Initials as built, instead of with a fresh DCID each time.
    pub reuse_dcids: bool,
    /// Send every datagram from a random one of this many loopback source addresses
    /// (127.1.0.0 + k, IP_PKTINFO; one unbound socket per thread) instead of from
    /// `sources` sockets. IPv4 targets, no GSO.
    pub spoof_sources: Option<u32>,
}

/// The first spoofed source address: 127.1.0.0 (127.0.0.0/16 is left to real clients).
pub const SPOOF_BASE: u32 = 0x7f01_0000;
/// The most spoofed sources: the rest of 127.0.0.0/8.
pub const MAX_SPOOF_SOURCES: u32 = 0x00fe_0000;

impl Config {
    pub fn validate(&self) -> Result<(), String> {
        self.spec.validate()?;
        if !is_loopback(self.target.ip()) {
            return Err(format!(
                "target {} is not a loopback address: udpflood only sends to 127.0.0.0/8 and ::1",
                self.target
            ));
        }
        if self.target.port() == 0 {
            return Err("target port must not be 0".into());
        }
        if self.threads == 0 || self.threads > 256 {
            return Err("--threads must be in 1..=256".into());
        }
        if self.sources < self.threads || self.sources > 4096 {
            return Err(format!("--sources must be in {}..=4096 (at least one socket per thread)", self.threads));
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(24 * 3600) {
            return Err("--duration must be in (0, 86400] seconds".into());
        }
        if let Some(g) = self.gso {
            if g == 0 || g > sys::MAX_GSO_SEGMENTS {
                return Err(format!("--gso must be in 1..={}", sys::MAX_GSO_SEGMENTS));
            }
            if g * self.spec.size > crate::packets::MAX_DATAGRAM {
                return Err(format!(
                    "--gso {g} x --size {} = {} bytes exceeds one UDP send ({})",
                    self.spec.size,
                    g * self.spec.size,
                    crate::packets::MAX_DATAGRAM
                ));
            }
            if self.spec.size > u16::MAX as usize {
                return Err("--size too large for GSO".into());
            }
        }
        if !self.cpus.is_empty() {
            let avail: Vec<usize> =
                core_affinity::get_core_ids().unwrap_or_default().into_iter().map(|c| c.id).collect();
            if let Some(c) = self.cpus.iter().find(|c| !avail.contains(c)) {
                return Err(format!("--cpus: CPU {c} is not available to this process (available: {avail:?})"));
            }
        }
        if let Some(n) = self.spoof_sources {
            if n == 0 || n > MAX_SPOOF_SOURCES {
                return Err(format!("--spoof-sources must be in 1..={MAX_SPOOF_SOURCES}"));
            }
            if !self.target.is_ipv4() || self.gso.is_some() {
                return Err("--spoof-sources needs an IPv4 target and no --gso".into());
            }
        }
        if self.count == Some(0) {
            return Err("--count must be at least 1".into());
        }
        Ok(())
    }
}

pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback(),
    }
}

/// A loopback source socket of the target's family.
pub fn source_socket(target: SocketAddr) -> std::io::Result<UdpSocket> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (IpAddr::V4(Ipv4Addr::LOCALHOST), 0).into(),
        SocketAddr::V6(_) => (IpAddr::V6(Ipv6Addr::LOCALHOST), 0).into(),
    };
    UdpSocket::bind(local)
}

#[derive(Default)]
pub struct Counters {
    /// Datagrams the kernel accepted.
    pub sent: AtomicU64,
    /// Datagrams whose send failed (skipped, not retried).
    pub errors: AtomicU64,
    pub bytes: AtomicU64,
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub sent: u64,
    pub errors: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub last_error: Option<String>,
}

impl Summary {
    pub fn rate(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.sent as f64 / s
        } else {
            0.0
        }
    }
}

/// A token bucket: `rate` tokens per second, at most `cap` banked.
struct Bucket {
    rate: f64,
    tokens: f64,
    cap: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64, cap: f64) -> Bucket {
        Bucket { rate, tokens: 0.0, cap, last: Instant::now() }
    }
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.cap);
    }
}

/// Splits `total` into `parts` nearly equal shares.
fn share(total: u64, parts: usize, i: usize) -> u64 {
    let p = parts as u64;
    total / p + u64::from((i as u64) < total % p)
}

/// Per-thread state of `--spoof-sources`.
struct Spoof {
    sender: SpoofSender,
    n: u32,
    rng: Rng,
    addrs: Vec<Ipv4Addr>,
}

struct Worker {
    socks: Vec<UdpSocket>,
    spoof: Option<Spoof>,
    pool: Pool,
    sender: MmsgSender,
    seg: usize,
    rate: Option<f64>,
    limit: Option<u64>,
    /// Fresh DCID tags for Initials (None: reuse the pool's DCIDs).
    dcid_tag: Option<u64>,
}

impl Worker {
    /// Sends until the deadline, the stop flag or the count; returns when the last
    /// send returned and the last error seen.
    fn run(mut self, deadline: Instant, stop: &AtomicBool, c: &Counters) -> (Instant, Option<String>) {
        let seg = self.seg;
        let trains = self.pool.len() / seg;
        let max_call = self.sender.capacity() * seg;
        // Paced: aim for about a millisecond's worth of datagrams per call, and bank at
        // most ~2 ms (or two calls) of tokens so a late wake-up is caught up, not lost.
        let (mut bucket, target) = match self.rate {
            Some(r) => {
                let t = ((r / 1000.0) as usize).clamp(seg, max_call);
                (Some(Bucket::new(r, (r * 0.002).max(2.0 * max_call as f64))), t)
            }
            None => (None, max_call),
        };
        let mut remaining = self.limit.unwrap_or(u64::MAX);
        let (mut cursor, mut sock_i) = (0usize, 0usize);
        let mut last_err = None;
        let mut msgs: Vec<(usize, usize)> = Vec::with_capacity(self.sender.capacity());
        while remaining > 0 && !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let rem = remaining.min(max_call as u64) as usize;
            let want = target.min(rem);
            let n = match bucket.as_mut() {
                None => rem,
                Some(b) => {
                    b.refill(now);
                    if b.tokens < want as f64 {
                        let wait = Duration::from_secs_f64((want as f64 - b.tokens) / b.rate);
                        std::thread::sleep(wait.min(MAX_SLEEP).min(deadline - now));
                        continue;
                    }
                    let n = ((b.tokens as usize) / seg * seg).max(want).min(rem);
                    b.tokens -= n as f64;
                    n
                }
            };
            // Every Initial about to go out gets a DCID never sent before, so each one
            // looks like a new connection attempt (not a retransmission hitting a pin).
            if let Some(tag) = self.dcid_tag.as_mut() {
                let (first, len) = (cursor * seg, self.pool.len());
                for k in 0..n {
                    let j = (first + k) % len;
                    if self.pool.initials[j] {
                        *tag = tag.wrapping_add(1);
                        let off = j * self.pool.stride;
                        crate::packets::refresh_initial_dcid(&mut self.pool.data[off..off + self.pool.stride], *tag);
                    }
                }
            }
            // n datagrams as ceil(n / seg) messages of consecutive pool slots.
            msgs.clear();
            let mut left = n;
            while left > 0 {
                let k = left.min(seg);
                let start = cursor * seg * self.pool.stride;
                if seg == 1 {
                    msgs.push((start, self.pool.lens[cursor]));
                } else {
                    msgs.push((start, k * self.pool.stride));
                }
                cursor = (cursor + 1) % trains;
                left -= k;
            }
            let sock = &self.socks[sock_i];
            sock_i = (sock_i + 1) % self.socks.len();
            let (ok, errs, e) = match self.spoof.as_mut() {
                Some(sp) => {
                    sp.addrs.clear();
                    for _ in 0..msgs.len() {
                        let k = (sp.rng.next_u64() % u64::from(sp.n)) as u32;
                        sp.addrs.push(Ipv4Addr::from(SPOOF_BASE + k));
                    }
                    sp.sender.send(sock, &self.pool.data, &msgs, &sp.addrs)
                }
                None => self.sender.send(sock, &self.pool.data, &msgs),
            };
            // Messages map to `seg` datagrams each except possibly the last.
            let (mut okd, mut okb) = (0u64, 0u64);
            for &(_, len) in &msgs[..ok] {
                okd += (len as u64).div_ceil(self.pool.stride as u64).max(1);
                okb += len as u64;
            }
            let errd = (n as u64).saturating_sub(okd);
            c.sent.fetch_add(okd, Ordering::Relaxed);
            c.bytes.fetch_add(okb, Ordering::Relaxed);
            if errs > 0 {
                c.errors.fetch_add(errd, Ordering::Relaxed);
                last_err = e.map(|e| e.to_string()).or(last_err);
            }
            remaining = remaining.saturating_sub(n as u64);
        }
        (Instant::now(), last_err)
    }
}

/// Runs the flood to completion; progress lines go to stderr.
pub fn run(cfg: &Config, stop: Arc<AtomicBool>) -> anyhow::Result<Summary> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let seg = cfg.gso.unwrap_or(1);
    let mut spec = cfg.spec.clone();
    spec.fixed_size = cfg.gso.is_some();
    // A whole number of mix cycles and of GSO trains, so ratios hold exactly.
    let unit = crate::packets::MIX_CYCLE.len() * seg;
    let pool_n = POOL_DATAGRAMS.div_ceil(unit) * unit;
    let mut workers = Vec::with_capacity(cfg.threads);
    for t in 0..cfg.threads {
        let mut socks = Vec::new();
        let mut rng = Rng::from_entropy(t as u64);
        let spoof = match (cfg.spoof_sources, cfg.target) {
            (Some(n), SocketAddr::V4(target)) => {
                let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
                    .map_err(|e| anyhow::anyhow!("binding the spoofing socket: {e}"))?;
                ::sys::sockopt::set_send_buffer(&s, 4 << 20);
                socks.push(s);
                let cap = BATCH.max(1);
                Some(Spoof {
                    sender: SpoofSender::new(cap, target),
                    n,
                    rng: Rng::new(rng.next_u64()),
                    addrs: Vec::with_capacity(cap),
                })
            }
            _ => None,
        };
        for _ in 0..if spoof.is_some() { 0 } else { share(cfg.sources as u64, cfg.threads, t) } {
            let s = source_socket(cfg.target).map_err(|e| anyhow::anyhow!("binding a loopback source socket: {e}"))?;
            s.connect(cfg.target).map_err(|e| anyhow::anyhow!("connecting to {}: {e}", cfg.target))?;
            ::sys::sockopt::set_send_buffer(&s, 4 << 20);
            socks.push(s);
        }
        let pool = Pool::build(&spec, pool_n, &mut rng).map_err(anyhow::Error::msg)?;
        let gso_size = cfg.gso.map(|_| spec.size as u16);
        workers.push(Worker {
            socks,
            spoof,
            pool,
            sender: MmsgSender::new(BATCH.div_ceil(seg).max(1), gso_size),
            seg,
            rate: match cfg.rate {
                Rate::Max => None,
                Rate::Pps(r) => Some(r / cfg.threads as f64),
            },
            limit: cfg.count.map(|c| share(c, cfg.threads, t)),
            dcid_tag: (!cfg.reuse_dcids).then(|| rng.next_u64()),
        });
    }
    let counters = Arc::new(Counters::default());
    let start = Instant::now();
    let deadline = start + cfg.duration;
    let handles: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let (stop, c) = (stop.clone(), counters.clone());
            let cpu = (!cfg.cpus.is_empty()).then(|| cfg.cpus[i % cfg.cpus.len()]);
            std::thread::Builder::new().name(format!("udpflood-{i}")).spawn(move || {
                if let Some(id) = cpu {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                        return (Instant::now(), Some(format!("could not pin to CPU {id}")));
                    }
                }
                w.run(deadline, &stop, &c)
            })
        })
        .collect::<Result<_, _>>()?;

    let mut last = (start, 0u64);
    let mut next_tick = start + Duration::from_secs(1);
    while !handles.iter().all(|h| h.is_finished()) {
        let now = Instant::now();
        if now >= next_tick {
            let sent = counters.sent.load(Ordering::Relaxed);
            let errors = counters.errors.load(Ordering::Relaxed);
            let dt = now.duration_since(last.0).as_secs_f64();
            if cfg.progress {
                eprintln!(
                    "{}[{:>4.0}s] sent {:>12}  {:>10.0} datagrams/s  errors {}",
                    cfg.label,
                    now.duration_since(start).as_secs_f64(),
                    sent,
                    (sent - last.1) as f64 / dt,
                    errors
                );
            }
            last = (now, sent);
            next_tick += Duration::from_secs(1);
        }
        // Bounded: the workers stop at the deadline; give them a grace second.
        if now > deadline + Duration::from_secs(5) {
            stop.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut end = start;
    let mut last_error = None;
    for h in handles {
        match h.join() {
            Ok((t, e)) => {
                end = end.max(t);
                last_error = e.or(last_error);
            }
            Err(_) => anyhow::bail!("a sender thread panicked"),
        }
    }
    Ok(Summary {
        sent: counters.sent.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        bytes: counters.bytes.load(Ordering::Relaxed),
        elapsed: end.duration_since(start),
        last_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for (total, parts) in [(10u64, 3usize), (1000, 7), (5, 8), (0, 2)] {
            let s: u64 = (0..parts).map(|i| share(total, parts, i)).sum();
            assert_eq!(s, total);
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("max"), Ok(Rate::Max));
        assert_eq!(parse_rate("2000"), Ok(Rate::Pps(2000.0)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("-5").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("inf").is_err());
    }

    #[test]
    fn loopback_only() {
        assert!(is_loopback("127.0.0.1".parse().unwrap()));
        assert!(is_loopback("127.9.9.9".parse().unwrap()));
        assert!(is_loopback("::1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
        assert!(!is_loopback("0.0.0.0".parse().unwrap()));
    }

    /// `--spoof-sources 3`: every datagram arrives from one of 127.1.0.0..=127.1.0.2,
    /// all three are seen, nothing else.
    #[test]
    fn spoofed_sources_arrive_as_many_clients() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let target = rx.local_addr().unwrap();
        let cfg = Config {
            target,
            spec: Spec {
                mode: crate::packets::Mode::Initial,
                size: 1200,
                keys: None,
                server_ids: vec![],
                fixed_size: false,
            },
            rate: Rate::Max,
            duration: Duration::from_secs(5),
            threads: 1,
            sources: 1,
            gso: None,
            count: Some(60),
            progress: false,
            label: "",
            cpus: vec![],
            reuse_dcids: false,
            spoof_sources: Some(3),
        };
        let s = run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
        assert_eq!((s.sent, s.errors), (60, 0));
        let mut seen = std::collections::BTreeSet::new();
        let mut buf = [0u8; 1500];
        for _ in 0..60 {
            let (n, from) = rx.recv_from(&mut buf).unwrap();
            assert_eq!(n, 1200);
            seen.insert(from.ip());
        }
        let want: std::collections::BTreeSet<IpAddr> =
            (0..3).map(|k| IpAddr::V4(Ipv4Addr::from(SPOOF_BASE + k))).collect();
        assert_eq!(seen, want);
        let mut bad = cfg.clone();
        bad.spoof_sources = Some(0);
        assert!(bad.validate().is_err());
        bad.spoof_sources = Some(3);
        bad.gso = Some(2);
        assert!(bad.validate().is_err());
    }
}
