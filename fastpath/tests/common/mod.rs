//! The harness of the fast-path tests (steering.rs, trains.rs): reuseport groups on
//! 127.0.0.1 with the real program attached, senders on several 127.x.y.z sources,
//! and an independent model of where each datagram must arrive. The model derives the
//! SipHash key with aws-lc-rs's HMAC and hashes with the `siphasher` crate:
//! independent of the C program and of proto.
#![allow(dead_code)] // each test file uses its own subset

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use aws_lc_rs::hmac;
use fastpath::{Config, Counters, LoadError, Steering, Variant};
use proto::{Generation, ServerId};
use siphasher::sip::SipHasher24;
pub use testkit::Rng;

// ---------- the independent model ----------

pub const PRF_LABEL: &[u8] = b"quicdemux cid prf siphash-2-4 v1";

/// k0/k1 of a siphash-2-4 generation: HMAC-SHA-256(secret, label)[0..16], LE.
pub fn derive(secret: &[u8; 32]) -> [u64; 2] {
    let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), PRF_LABEL);
    let t = t.as_ref();
    [u64::from_le_bytes(t[0..8].try_into().unwrap()), u64::from_le_bytes(t[8..16].try_into().unwrap())]
}

pub fn mask(key: [u64; 2], prefix: &[u8]) -> [u8; 2] {
    let h = SipHasher24::new_with_keys(key[0], key[1]).hash(prefix);
    [(h & 0xff) as u8, ((h >> 8) & 0xff) as u8]
}

/// A 12-byte CID with generation bits `cr` whose bytes 9..=10 decode to `id` under `key`
/// (random there when `key` is None: the id is not decodable anyway).
pub fn cid(rng: &mut Rng, cr: u8, id: u16, key: Option<[u64; 2]>) -> [u8; 12] {
    let mut c = [0u8; 12];
    for b in c.iter_mut() {
        *b = rng.next() as u8;
    }
    c[0] = (cr << 6) | (c[0] & 0x3f);
    if let Some(k) = key {
        let m = mask(k, &c[..9]);
        let idb = id.to_be_bytes();
        c[9] = idb[0] ^ m[0];
        c[10] = idb[1] ^ m[1];
    }
    c
}

/// A short-header datagram of `len` bytes (>= 17) for `cid`; the last 4 bytes carry `seq`.
pub fn short_datagram(rng: &mut Rng, first: u8, cid: &[u8; 12], len: usize, seq: u32) -> Vec<u8> {
    assert!(len >= 17);
    let mut d: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    d[0] = first;
    d[1..13].copy_from_slice(cid);
    d[len - 4..].copy_from_slice(&seq.to_le_bytes());
    d
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    Worker(usize),
    AnyShard,
    /// Worker `w` or a shard: a datagram that may or may not share an skb with
    /// another worker's (receive-side GRO decides).
    WorkerOrShard(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arrived {
    Shard(usize),
    Worker(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Fast,
    LongHeader,
    ShortPacket,
    CrUnroutable,
    UnknownGeneration,
    QuicLbEncrypted,
    NotLive,
    SelectFailed,
}

pub fn bump(c: &mut Counters, o: Outcome) {
    match o {
        Outcome::Fast => {
            c.fast += 1;
            c.fast_datagrams += 1;
        }
        Outcome::LongHeader => c.long_header += 1,
        Outcome::ShortPacket => c.short_packet += 1,
        Outcome::CrUnroutable => c.cr_unroutable += 1,
        Outcome::UnknownGeneration => c.unknown_generation += 1,
        Outcome::QuicLbEncrypted => c.quic_lb_encrypted += 1,
        Outcome::NotLive => c.not_live += 1,
        Outcome::SelectFailed => c.select_failed += 1,
    }
}

// ---------- the harness ----------

pub fn gen(g: u8) -> Generation {
    Generation::new(g).unwrap()
}

pub fn set_rcvbuf(s: &UdpSocket) {
    let v: libc::c_int = 4 << 20;
    // SAFETY: s is a live socket; the value is a c_int of the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

pub struct Group {
    pub addr: SocketAddr,
    pub shards: Vec<UdpSocket>,
    pub workers: Vec<Option<UdpSocket>>,
    pub steering: Steering,
}

/// `shards` shard sockets and `workers` worker sockets in one group on 127.0.0.1,
/// the program attached; None (after printing why) when BPF is refused here.
pub fn group(shards: usize, workers: usize, max_workers: u32, by_cpu: Option<&[u32]>) -> Option<Group> {
    group_at("127.0.0.1:0", None, shards, workers, max_workers, by_cpu)
}

/// [`group`] on `bind`, running `variant` (None: whichever `Steering::attach` picks).
pub fn group_at(
    bind: &str,
    variant: Option<Variant>,
    shards: usize,
    workers: usize,
    max_workers: u32,
    by_cpu: Option<&[u32]>,
) -> Option<Group> {
    let first = UdpSocket::from(fastpath::open_worker_socket(bind.parse().unwrap()).unwrap());
    let addr = first.local_addr().unwrap();
    let mut shard_socks = vec![first];
    for _ in 1..shards {
        shard_socks.push(UdpSocket::from(fastpath::open_worker_socket(addr).unwrap()));
    }
    let worker_socks: Vec<Option<UdpSocket>> =
        (0..workers).map(|_| Some(UdpSocket::from(fastpath::open_worker_socket(addr).unwrap()))).collect();
    // UDP_GRO, as the data plane's shard sockets and quinn's worker sockets have: GRO
    // trains arrive whole (and `receive` cuts them), and the kernel's GRO-time socket
    // lookup finds a socket that lets it coalesce.
    for s in shard_socks.iter().chain(worker_socks.iter().flatten()) {
        set_rcvbuf(s);
        testkit::trains::set_gro(s, true).unwrap();
    }
    let fds: Vec<BorrowedFd<'_>> = shard_socks.iter().map(|s| s.as_fd()).collect();
    let config = Config { shard_by_cpu: by_cpu, ..Config::new(max_workers) };
    let attached = match variant {
        Some(v) => Steering::attach_variant(v, &fds, &config),
        None => Steering::attach(&fds, &config),
    };
    let steering = match attached {
        Ok(s) => s,
        Err(LoadError::Unsupported(why)) => {
            testkit::skip(&format!("kernel fast path ({variant:?}) unavailable here: {why}"));
            return None;
        }
        Err(e) => panic!("attach: {e}"),
    };
    Some(Group { addr, shards: shard_socks, workers: worker_socks, steering })
}

pub fn senders(n: usize) -> Vec<UdpSocket> {
    let ips =
        ["127.0.0.1", "127.0.0.2", "127.1.2.3", "127.9.8.7", "127.200.0.1", "127.33.44.55", "127.5.5.5", "127.77.0.9"];
    (0..n).map(|i| UdpSocket::bind((ips[i % ips.len()], 0)).unwrap()).collect()
}

/// One datagram to send and where it must arrive.
pub struct Dgram {
    pub src: usize,
    pub bytes: Vec<u8>,
    pub expect: Expect,
    pub outcome: Outcome,
}

/// What arrived where.
#[derive(Default)]
pub struct Delivery {
    /// seq -> where
    pub at: HashMap<u32, Arrived>,
    /// per worker: datagrams received
    pub per_worker: HashMap<usize, u64>,
    /// source address -> shards it reached
    pub src_shards: HashMap<SocketAddr, Vec<usize>>,
}

/// Sends `plan` one datagram at a time in batches, draining all sockets after each
/// batch, and checks every datagram arrived exactly once where the model says.
/// Datagrams shorter than 17 bytes carry no tag: they are identified by (source,
/// length), which the plan keeps unique within a batch.
pub fn run(g: &Group, srcs: &[UdpSocket], plan: &[Dgram]) -> Delivery {
    let units: Vec<Range<usize>> = (0..plan.len()).map(|i| i..i + 1).collect();
    run_units(g, srcs, plan, &units)
}

/// As [`run`], sending each unit (a range of `plan`, all from one source) as one
/// datagram or, with several, as one UDP GSO train (`testkit::trains::send_gso`: on
/// loopback the program sees the train as one skb; the receiving sockets, which do
/// not ask for UDP_GRO, then get its segments one by one).
pub fn run_units(g: &Group, srcs: &[UdpSocket], plan: &[Dgram], units: &[Range<usize>]) -> Delivery {
    let mut del = Delivery::default();
    let mut next = 0;
    let mut b = 0;
    while next < units.len() {
        // A batch: whole units, about 128 datagrams.
        let first = next;
        let mut count = 0;
        while next < units.len() && (count == 0 || count + units[next].len() <= 128) {
            count += units[next].len();
            next += 1;
        }
        let mut tiny: HashMap<(SocketAddr, usize), u32> = HashMap::new();
        for u in &units[first..next] {
            let src = plan[u.start].src;
            assert!(plan[u.clone()].iter().all(|d| d.src == src), "plan: a train from several sources");
            if u.len() == 1 {
                let d = &plan[u.start];
                if d.bytes.len() < 17 {
                    let key = (srcs[src].local_addr().unwrap(), d.bytes.len());
                    assert!(
                        tiny.insert(key, u.start as u32).is_none(),
                        "plan: two tiny datagrams share (source, length)"
                    );
                }
                srcs[src].send_to(&d.bytes, g.addr).unwrap();
            } else {
                assert!(plan[u.clone()].iter().all(|d| d.bytes.len() >= 17), "plan: a train of untagged datagrams");
                let segments: Vec<Vec<u8>> = plan[u.clone()].iter().map(|d| d.bytes.clone()).collect();
                srcs[src].connect(g.addr).unwrap();
                testkit::trains::send_gso(&srcs[src], &segments).unwrap();
            }
        }
        receive(g, plan, count, b, &tiny, &mut del);
        b += 1;
    }
    del
}

/// Drains every socket of `g` until `count` datagrams of `plan` arrived (at most 5 s),
/// checking each against the model.
pub fn receive(
    g: &Group,
    plan: &[Dgram],
    count: usize,
    batch: usize,
    tiny: &HashMap<(SocketAddr, usize), u32>,
    del: &mut Delivery,
) {
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 1 << 16];
    while got < count {
        assert!(Instant::now() < deadline, "only {got} of {count} datagrams of batch {batch} arrived");
        let mut any = false;
        let socks = g
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (Arrived::Shard(i), s))
            .chain(g.workers.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (Arrived::Worker(i), s))));
        for (where_, s) in socks {
            loop {
                let (segments, from) = match testkit::trains::recv_segments(s, &mut buf) {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("recv: {e}"),
                };
                any = true;
                for dg in segments {
                    got += 1;
                    let n = dg.len();
                    let seq = if n >= 17 {
                        u32::from_le_bytes(dg[n - 4..n].try_into().unwrap())
                    } else {
                        *tiny.get(&(from, n)).expect("unknown tiny datagram")
                    };
                    let d = &plan[seq as usize];
                    assert_eq!(&dg[..], &d.bytes[..], "datagram {seq} corrupted");
                    assert!(del.at.insert(seq, where_).is_none(), "datagram {seq} arrived twice");
                    match (d.expect, where_) {
                        (Expect::Worker(w), Arrived::Worker(a)) if w == a => {}
                        (Expect::AnyShard, Arrived::Shard(_)) => {}
                        (Expect::WorkerOrShard(w), Arrived::Worker(a)) if w == a => {}
                        (Expect::WorkerOrShard(_), Arrived::Shard(_)) => {}
                        (e, a) => panic!("datagram {seq} ({:?}) expected at {e:?}, arrived at {a:?}", d.outcome),
                    }
                    match where_ {
                        Arrived::Worker(w) => *del.per_worker.entry(w).or_default() += 1,
                        Arrived::Shard(s) => del.src_shards.entry(from).or_default().push(s),
                    }
                }
            }
        }
        if !any {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

pub fn expected_counters(plan: &[Dgram]) -> Counters {
    let mut c = Counters::default();
    for d in plan {
        bump(&mut c, d.outcome);
    }
    c
}

pub const SECRET0: [u8; 32] = [0x11; 32];
pub const SECRET1: [u8; 32] = *b"another generation's 32B secret!";
/// Server ids of the three workers (slot i = worker i): asymmetric bytes, so a
/// swapped mask or id byte order decodes to another id.
pub const IDS: [u16; 3] = [0x1234, 0x00fe, 0xab01];

pub fn fast(rng: &mut Rng, src: usize, cr: u8, key: [u64; 2], worker: usize, seq: u32) -> Dgram {
    let c = cid(rng, cr, IDS[worker], Some(key));
    let len = 33 + rng.below(1200) as usize;
    let first = 0x40 | ((rng.next() as u8) & 0x3f);
    Dgram {
        src,
        bytes: short_datagram(rng, first, &c, len, seq),
        expect: Expect::Worker(worker),
        outcome: Outcome::Fast,
    }
}

pub fn to_shard(src: usize, bytes: Vec<u8>, outcome: Outcome) -> Dgram {
    Dgram { src, bytes, expect: Expect::AnyShard, outcome }
}

/// Plan of `n` fast datagrams for worker `w` (generation 0) from all sources.
#[allow(clippy::too_many_arguments)]
pub fn fast_plan(
    rng: &mut Rng,
    key: [u64; 2],
    w: usize,
    n: usize,
    srcs: usize,
    start: usize,
    expect: Expect,
    outcome: Outcome,
) -> Vec<Dgram> {
    (0..n)
        .map(|i| {
            let mut d = fast(rng, i % srcs, 0, key, w, (start + i) as u32);
            d.expect = expect;
            d.outcome = outcome;
            d
        })
        .collect()
}

pub fn prepare(g: &Group) -> [u64; 2] {
    let k0 = derive(&SECRET0);
    g.steering.set_generation(gen(0), Some(k0.into())).unwrap();
    for (slot, w) in g.workers.iter().enumerate() {
        g.steering.insert_worker(slot as u32, ServerId(IDS[slot]), w.as_ref().unwrap().as_fd()).unwrap();
    }
    k0
}
