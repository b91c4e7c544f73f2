//! `--latency`: timestamped short-header probes through the demux to echo workers,
//! round-trip times in an HDR histogram.
//!
//! Probe layout (after the 13-byte short header whose DCID names a live server id):
//!
//! ```text
//! 13..17  magic "QDLP"
//! 17..21  run id (random per run, so stray datagrams are ignored)
//! 21..29  sequence number, u64 big-endian
//! 29..37  send time, CLOCK_MONOTONIC nanoseconds, u64 big-endian
//! 37..    random padding up to --size
//! ```

use crate::flood;
use crate::packets::{self, Rng, Spec};
use crate::sys;
use hdrhistogram::Histogram;
use proto::cid::{KeySet, ServerId, CID_LEN};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MAGIC: [u8; 4] = *b"QDLP";
const OFF_MAGIC: usize = 1 + CID_LEN;
const OFF_RUN: usize = OFF_MAGIC + 4;
const OFF_SEQ: usize = OFF_RUN + 4;
const OFF_TS: usize = OFF_SEQ + 8;
/// Smallest probe: header, magic, run id, sequence, timestamp.
pub const MIN_PROBE: usize = OFF_TS + 8;
/// Round trips above this are clamped (a minute; nothing sane takes longer).
const HIST_MAX_NS: u64 = 60_000_000_000;
/// At most this many probes per run (the receive bitmap is one byte each).
pub const MAX_PROBES: u64 = 100_000_000;

/// Writes a probe for `server_id` into `buf` (≥ MIN_PROBE bytes); the caller stamps
/// the time with [`stamp`] right before sending.
pub fn build_probe(
    buf: &mut [u8],
    keys: &KeySet,
    server_id: ServerId,
    run: u32,
    seq: u64,
    rng: &mut Rng,
) -> Option<()> {
    if buf.len() < MIN_PROBE.max(packets::MIN_SHORT) {
        return None;
    }
    packets::short(buf, keys, server_id, rng)?;
    buf[OFF_MAGIC..OFF_RUN].copy_from_slice(&MAGIC);
    buf[OFF_RUN..OFF_SEQ].copy_from_slice(&run.to_be_bytes());
    buf[OFF_SEQ..OFF_TS].copy_from_slice(&seq.to_be_bytes());
    Some(())
}

pub fn stamp(buf: &mut [u8], now_ns: u64) {
    buf[OFF_TS..MIN_PROBE].copy_from_slice(&now_ns.to_be_bytes());
}

/// (sequence, send time) of one of our probes, or None for anything else.
pub fn read_probe(d: &[u8], run: u32) -> Option<(u64, u64)> {
    let d = d.get(..MIN_PROBE)?;
    if d[OFF_MAGIC..OFF_RUN] != MAGIC || d[OFF_RUN..OFF_SEQ] != run.to_be_bytes() {
        return None;
    }
    let seq = u64::from_be_bytes(d[OFF_SEQ..OFF_TS].try_into().ok()?);
    let ts = u64::from_be_bytes(d[OFF_TS..MIN_PROBE].try_into().ok()?);
    Some((seq, ts))
}

#[derive(Clone, Debug)]
pub struct Config {
    pub target: SocketAddr,
    pub keys: KeySet,
    pub server_ids: Vec<ServerId>,
    pub rate: f64,
    pub duration: Duration,
    pub size: usize,
    pub count: Option<u64>,
    /// Wait this long after the last probe for stragglers.
    pub drain: Duration,
    /// Background load: (mode, datagrams/s), from its own thread and sockets.
    pub background: Option<(packets::Mode, f64)>,
    /// CPUs to pin the background sender to.
    pub background_cpus: Vec<usize>,
    pub progress: bool,
}

pub struct Report {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub send_errors: u64,
    pub ignored: u64,
    pub hist: Histogram<u64>,
    pub elapsed: Duration,
    pub background: Option<flood::Summary>,
}

impl Report {
    /// Round-trip time at quantile `q`, in µs.
    pub fn us(&self, q: f64) -> f64 {
        if self.hist.is_empty() {
            0.0
        } else {
            self.hist.value_at_quantile(q) as f64 / 1000.0
        }
    }
    pub fn max_us(&self) -> f64 {
        if self.hist.is_empty() {
            0.0
        } else {
            self.hist.max() as f64 / 1000.0
        }
    }
}

impl Config {
    pub fn total(&self) -> u64 {
        let by_time = (self.rate * self.duration.as_secs_f64()).ceil() as u64;
        self.count.map_or(by_time, |c| c.min(by_time)).max(1)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !flood::is_loopback(self.target.ip()) || self.target.port() == 0 {
            return Err(format!("target {} must be a loopback address with a port", self.target));
        }
        if self.server_ids.is_empty() {
            return Err("--latency needs --server-ids".into());
        }
        if !(self.rate > 0.0 && self.rate <= 1e6) {
            return Err("--latency needs --rate in (0, 1000000] probes/s".into());
        }
        if self.size < MIN_PROBE || self.size > packets::MAX_DATAGRAM {
            return Err(format!("--size must be in {MIN_PROBE}..={} for probes", packets::MAX_DATAGRAM));
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(24 * 3600) {
            return Err("--duration must be in (0, 86400] seconds".into());
        }
        if self.total() > MAX_PROBES {
            return Err(format!("at most {MAX_PROBES} probes per run: lower --rate or --duration"));
        }
        Ok(())
    }
}

pub fn run(cfg: &Config, stop: Arc<AtomicBool>) -> anyhow::Result<Report> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let total = cfg.total();
    let sock = flood::source_socket(cfg.target).map_err(|e| anyhow::anyhow!("binding the probe socket: {e}"))?;
    ::sys::sockopt::set_recv_buffer(&sock, 4 << 20);
    ::sys::sockopt::set_send_buffer(&sock, 4 << 20);
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let send_sock = sock.try_clone()?;
    let mut rng = Rng::from_entropy(0x1a7e);
    let run_id = rng.next_u64() as u32;

    // Background load, bounded by the same duration.
    let bg_stop = Arc::new(AtomicBool::new(false));
    let bg = match cfg.background {
        Some((mode, rate)) => {
            let fc = flood::Config {
                target: cfg.target,
                spec: Spec {
                    mode,
                    size: cfg.size.max(packets::MIN_SHORT),
                    keys: Some(cfg.keys.clone()),
                    server_ids: cfg.server_ids.clone(),
                    fixed_size: false,
                },
                rate: flood::Rate::Pps(rate),
                duration: cfg.duration,
                threads: 1,
                sources: 4,
                gso: None,
                count: None,
                progress: false,
                label: "background ",
                cpus: cfg.background_cpus.clone(),
                reuse_dcids: false,
                spoof_sources: None,
            };
            fc.validate().map_err(|e| anyhow::anyhow!("background load: {e}"))?;
            let s = bg_stop.clone();
            Some(std::thread::Builder::new().name("udpflood-bg".into()).spawn(move || flood::run(&fc, s))?)
        }
        None => None,
    };

    let sent = Arc::new(AtomicU64::new(0));
    let send_errors = Arc::new(AtomicU64::new(0));
    let sender_done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let sender = {
        let (sent, errs, done, stop) = (sent.clone(), send_errors.clone(), sender_done.clone(), stop.clone());
        let (keys, ids, target, size, rate) =
            (cfg.keys.clone(), cfg.server_ids.clone(), cfg.target, cfg.size, cfg.rate);
        let deadline = start + cfg.duration + Duration::from_secs(1);
        std::thread::Builder::new().name("udpflood-probe".into()).spawn(move || {
            let mut buf = vec![0u8; size];
            'probes: for seq in 0..total {
                let due = start + Duration::from_secs_f64(seq as f64 / rate);
                loop {
                    let now = Instant::now();
                    if stop.load(Ordering::Relaxed) || now > deadline {
                        break 'probes;
                    }
                    if now >= due {
                        break;
                    }
                    std::thread::sleep((due - now).min(Duration::from_millis(5)));
                }
                let id = ids[(seq % ids.len() as u64) as usize];
                if build_probe(&mut buf, &keys, id, run_id, seq, &mut rng).is_none() {
                    errs.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                stamp(&mut buf, sys::monotonic_ns());
                match send_sock.send_to(&buf, target) {
                    Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errs.fetch_add(1, Ordering::Relaxed),
                };
            }
            done.store(true, Ordering::Release);
        })?
    };

    let mut hist = Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3)?;
    let mut seen = vec![false; total as usize];
    let (mut received, mut dups, mut ignored) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; 65_536];
    let mut done_at: Option<Instant> = None;
    let hard_stop = start + cfg.duration + cfg.drain + Duration::from_secs(5);
    let mut next_tick = start + Duration::from_secs(1);
    loop {
        let now = Instant::now();
        if sender_done.load(Ordering::Acquire) {
            let d = *done_at.get_or_insert(now);
            if received >= sent.load(Ordering::Relaxed) || now >= d + cfg.drain {
                break;
            }
        }
        if now >= hard_stop {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        if cfg.progress && now >= next_tick {
            eprintln!(
                "[{:>4.0}s] probes sent {:>10}  received {:>10}",
                now.duration_since(start).as_secs_f64(),
                sent.load(Ordering::Relaxed),
                received
            );
            next_tick += Duration::from_secs(1);
        }
        match sock.recv_from(&mut buf) {
            Ok((n, _)) => {
                let t = sys::monotonic_ns();
                match read_probe(&buf[..n], run_id) {
                    Some((seq, ts)) if seq < total => {
                        if std::mem::replace(&mut seen[seq as usize], true) {
                            dups += 1;
                        } else {
                            received += 1;
                            hist.saturating_record(t.saturating_sub(ts).max(1));
                        }
                    }
                    _ => ignored += 1,
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // ECONNREFUSED from an ICMP error for an earlier probe: keep going.
            Err(_) => {}
        }
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    bg_stop.store(true, Ordering::Relaxed);
    let background = match bg {
        Some(h) => match h.join() {
            Ok(r) => Some(r?),
            Err(_) => anyhow::bail!("the background load thread panicked"),
        },
        None => None,
    };
    let sent = sent.load(Ordering::Relaxed);
    Ok(Report {
        sent,
        received,
        lost: sent.saturating_sub(received),
        duplicates: dups,
        send_errors: send_errors.load(Ordering::Relaxed),
        ignored,
        hist,
        elapsed,
        background,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::cid::Generation;
    use proto::header::{parse, Header};

    #[test]
    fn probe_round_trip() {
        let ks = KeySet::new((Generation::ZERO, [3; 32]), None).unwrap();
        let mut rng = Rng::new(9);
        let mut buf = vec![0u8; 64];
        build_probe(&mut buf, &ks, ServerId(42), 0xdead_beef, 7, &mut rng).unwrap();
        stamp(&mut buf, 123_456_789);
        let Ok(Header::Short { dcid }) = parse(&buf, CID_LEN) else { panic!() };
        assert_eq!(ks.decode(dcid).unwrap().server_id, ServerId(42));
        assert_eq!(read_probe(&buf, 0xdead_beef), Some((7, 123_456_789)));
        assert_eq!(read_probe(&buf, 1), None);
        assert_eq!(read_probe(&buf[..MIN_PROBE - 1], 0xdead_beef), None);
        assert!(build_probe(&mut buf[..MIN_PROBE - 1], &ks, ServerId(1), 1, 1, &mut rng).is_none());
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = sys::monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = sys::monotonic_ns();
        assert!(b - a >= 2_000_000);
    }
}
