//! The sender: 1200-byte short-header datagrams over loopback from many flows,
//! paced or as fast as the kernel takes them.

use crate::dataplane::DATAGRAM;
use crate::sys::pin;
use anyhow::Result;
use proto::cid::{KeySet, CID_LEN, CID_RANDOM_LEN};
use proto::ServerId;
use socket2::SockAddr;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};
use sys::mmsg::{SendMeta, SendMmsg};

/// CPU ns of the calling thread.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

/// Flows (source sockets) of a sender: the kernel's reuseport and GRO see many 4-tuples.
pub(crate) const FLOWS: usize = 64;
/// Messages per sendmmsg call of `send_load` (all on one flow).
pub(crate) const MSGS_PER_CALL: usize = 8;
/// A short header's first byte (RFC 9000 §17.3.1): the fixed bit set, the rest
/// (spin, key phase, packet number length) random or zero.
pub(crate) const SHORT_HEADER_FORM: u8 = 0x40;
/// Bits of the first byte left as they are under the form bits.
const SHORT_HEADER_FREE_BITS: u8 = 0x3f;
/// Where a short header's destination CID sits (ADR 0001's length).
pub(crate) const DCID: Range<usize> = 1..1 + CID_LEN;
/// Seed of the payloads' xorshift generator: every run sends the same bytes.
const PAYLOAD_SEED: u64 = 0x1234_5678_9abc_def0;

/// One payload per flow: `train` datagrams of `DATAGRAM` random bytes under a short
/// header whose DCID names server id `ids[flow % ids.len()]`.
pub(crate) fn flow_payloads(ks: &KeySet, ids: &[u16], train: usize) -> Vec<Vec<u8>> {
    let mut seed = PAYLOAD_SEED;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for f in 0..FLOWS {
        let mut r = [0u8; CID_RANDOM_LEN];
        r.iter_mut().for_each(|b| *b = rnd() as u8);
        let cid = ks.encode(ServerId(ids[f % ids.len()]), &r);
        let mut buf = Vec::with_capacity(DATAGRAM * train);
        for _ in 0..train {
            let mut p = vec![0u8; DATAGRAM];
            p.iter_mut().for_each(|b| *b = rnd() as u8);
            p[0] = SHORT_HEADER_FORM | (p[0] & SHORT_HEADER_FREE_BITS);
            p[DCID].copy_from_slice(&cid);
            buf.extend_from_slice(&p);
        }
        payloads.push(buf);
    }
    payloads
}

/// `FLOWS` loopback sockets connected to `addr`; with `train` > 1 each sends
/// UDP_SEGMENT trains of `DATAGRAM`-byte segments.
pub(crate) fn flow_sockets(addr: SocketAddr, train: usize) -> Result<Vec<UdpSocket>> {
    let socks: Vec<UdpSocket> = (0..FLOWS).map(|_| UdpSocket::bind(LOOPBACK_ANY)).collect::<std::io::Result<_>>()?;
    for s in &socks {
        s.connect(addr)?;
        if train > 1 {
            // udp(7): every send of this socket is a train of DATAGRAM-byte segments.
            sys::sockopt::setsockopt_int(s.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, DATAGRAM as libc::c_int)
                .map_err(|e| anyhow::anyhow!("UDP_SEGMENT: {e}"))?;
        }
    }
    Ok(socks)
}

/// Loopback, any port: where the bench binds its own UDP sockets.
pub(crate) const LOOPBACK_ANY: &str = "127.0.0.1:0";
/// After the load: time for the receiver to drain its queues before its counters
/// and CPU time are read.
pub(crate) const SETTLE: Duration = Duration::from_millis(300);

/// What `send_load` did.
pub(crate) struct Load {
    pub sent: u64,
    pub secs: f64,
    pub cpu_s: f64,
}

/// Offers 1200-byte short-header datagrams (CIDs for `ids`) from `FLOWS` flows,
/// `MSGS_PER_CALL` messages per sendmmsg on one flow, flows in turn, for `seconds`;
/// `train` > 1 sends UDP_SEGMENT trains. `rate` 0: as fast as the kernel takes them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_load(
    addr: SocketAddr,
    ks: &KeySet,
    ids: &[u16],
    train: usize,
    seconds: f64,
    rate: f64,
    core: usize,
    nice: Option<i32>,
) -> Result<Load> {
    let limit = Duration::from_secs_f64(seconds);
    send_until(addr, ks, ids, train, rate, core, nice, |_, elapsed| elapsed < limit)
}

/// As `send_load`, for as long as `more(datagrams sent, time since the first send)`
/// says so (asked before every sendmmsg).
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_until(
    addr: SocketAddr,
    ks: &KeySet,
    ids: &[u16],
    train: usize,
    rate: f64,
    core: usize,
    nice: Option<i32>,
    more: impl FnMut(u64, Duration) -> bool + Send,
) -> Result<Load> {
    let payloads = flow_payloads(ks, ids, train);
    let socks = flow_sockets(addr, train)?;
    send_messages_until(&socks, None, rate, core, nice, |call, _| (&payloads[call % FLOWS][..], None), more)
}

/// Distinct token-less QUIC v1 client Initials (1200 bytes, header protection applied
/// with each DCID's Initial keys, RFC 9001 §5; DCID = 8 bytes of `i`): what a flood of
/// fresh connection attempts looks like to a demux minting Retries. Their payloads are
/// not valid TLS, which the demux does not look at.
pub(crate) fn initials(n: usize) -> Result<Vec<Vec<u8>>> {
    (0..n)
        .map(|i| {
            let dcid = (i as u64 + 1).to_be_bytes();
            proto::initial::build_client_initial(
                proto::header::VERSION_1,
                &dcid,
                &[7; 8],
                &[],
                0,
                &[6, 0, 1, 0],
                DATAGRAM,
            )
            .ok_or_else(|| anyhow::anyhow!("Initial {i} could not be built"))
        })
        .collect()
}

/// Sends datagrams on `socks` (connected: `flow_sockets`; unconnected: to `to`),
/// `MSGS_PER_CALL` messages per sendmmsg on one socket, sockets in turn: message `j`
/// of call `k` is `payload(k, j)` = (bytes, source address to send it from with
/// IP_PKTINFO, e.g. a spoofed one on an IP_TRANSPARENT socket), while `more(datagrams
/// sent, time since the first send)` says so (asked before every sendmmsg). A message
/// that is a UDP_SEGMENT train counts as its segments.
pub(crate) fn send_messages_until<'p>(
    socks: &[UdpSocket],
    to: Option<SocketAddr>,
    rate: f64,
    core: usize,
    nice: Option<i32>,
    payload: impl Fn(usize, usize) -> (&'p [u8], Option<std::net::Ipv4Addr>) + Send + Sync,
    mut more: impl FnMut(u64, Duration) -> bool + Send,
) -> Result<Load> {
    let train = payload(0, 0).0.len().div_ceil(DATAGRAM).max(1);
    let name = to.map(SockAddr::from);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            pin(core);
            if let Some(n) = nice {
                // SAFETY: setpriority on this thread (Linux: PRIO_PROCESS 0 is the caller).
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) };
            }
            let cpu0 = thread_cpu_ns();
            let per_call = (MSGS_PER_CALL * train) as f64;
            let mut sent = 0u64;
            let start = Instant::now();
            let mut k = 0usize;
            let mut sender = SendMmsg::new(MSGS_PER_CALL, 1);
            loop {
                let now = Instant::now();
                if !more(sent, now - start) {
                    break;
                }
                if rate > 0.0 {
                    let due = start + Duration::from_secs_f64(k as f64 * per_call / rate);
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                }
                let f = k % socks.len();
                k += 1;
                let mut batch = sender.batch();
                for j in 0..MSGS_PER_CALL {
                    let (p, src) = payload(k - 1, j);
                    let meta = SendMeta { to: name.as_ref(), source: src.map(IpAddr::V4), segment_size: None };
                    batch.push(&[p], meta);
                }
                if let Ok(r) = batch.send_from(&socks[f], 0, 0) {
                    sent += (r * train) as u64;
                }
            }
            Load { sent, secs: start.elapsed().as_secs_f64(), cpu_s: (thread_cpu_ns() - cpu0) as f64 / 1e9 }
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))
    })
}
