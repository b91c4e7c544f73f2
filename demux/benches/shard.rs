//! Criterion benches of the shard's per-datagram path (docs/architecture.md "The
//! shard loop"; results: docs/benchmarks.md, "demux (criterion)"). One shard's
//! `Router` as `dataplane::run` builds it (default limits on, 4096-entry decode cache,
//! 65 536 pins), a snapshot of 4 live instances whose data connections are real
//! SOCK_SEQPACKET socketpairs (4 MiB send buffer, as the registry sets), 1200-byte
//! datagrams.
//!
//! - `shard/datagram_short`: `Router::datagram` of one 1-RTT datagram to a live
//!   instance: count, route (decode-cache hit), queue the frame. Timed in chunks of
//!   256; the flush and the draining of the worker's end run untimed between chunks.
//! - `shard/datagram_train`: the same for a GRO train of 16 segments of one DCID
//!   (routed once, queued as one frame). Chunks of 64.
//! - `shard/flush_32`: `Forwarder::flush` of 32 queued frames for one worker: one
//!   sendmmsg of 32 records (48-byte header + payload, 2 iovecs each) into the
//!   socketpair. Queueing and draining untimed.
//! - `shard/cmsg_parse`: `cmsg::parse` of the control data of an IPv4 GRO train
//!   (UDP_GRO, IP_PKTINFO, IP_TOS: what a shard socket receives).
//! - `shard/ring_push`: `ring::Producer::push` of one frame (48 + 1200 bytes) into a
//!   1 MiB forwarding ring (`--forward ring`); a worker's `Consumer` empties it
//!   untimed between chunks of 512.
//! - `shard/ring_pop_frame`: the worker's `Consumer::pop_frame` of one such frame into
//!   a quinn-sized buffer (payload copied once); `shard/ring_pop_copy_move`: the same
//!   frame popped whole, decoded in the buffer and its payload moved to the front (the
//!   two copies the worker made before). Refilled untimed between chunks of 512.
//!
//! Every benchmark runs twice: wall clock, and (prefix `cpu/`) thread CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod support;

use arc_swap::ArcSwap;
use criterion::{Criterion, SamplingMode, Throughput};
use demux::dataplane::cmsg::{self, RecvMeta};
use demux::dataplane::counters::ShardCounters;
use demux::dataplane::limits::{Limits, LimitsConfig};
use demux::dataplane::ring::Producer;
use demux::dataplane::shard::{Router, ShardSetup, SockInfo};
use demux::dataplane::snapshot::{DataConn, Snapshot};
use proto::cid::{Generation, KeySet, ServerId};
use proto::{InstanceInfo, Reason, Table};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use support::{chunked, Clock};

const INSTANCES: u16 = 4;
const DATAGRAM: usize = 1200;
const TRAIN_SEGMENTS: usize = 16;
/// The registry's send buffer of a data connection.
const DATA_SNDBUF: i32 = 4 << 20;

fn socketpair() -> (OwnedFd, OwnedFd) {
    let mut sv = [0; 2];
    // SAFETY: socketpair(2) writes two fds into `sv`.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) };
    assert_eq!(r, 0, "socketpair");
    // SAFETY: both fds are fresh and ours.
    unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) }
}

/// Reads and discards every record waiting on `fd` (the worker's end).
fn drain(fd: RawFd, buf: &mut [u8]) -> usize {
    let mut n = 0;
    // SAFETY: recv(2) into a live buffer of its own length.
    while unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) } > 0 {
        n += 1;
    }
    n
}

struct Shard {
    router: Router,
    snap: Snapshot,
    /// The workers' ends of the data connections, by instance index.
    workers: Vec<OwnedFd>,
    sock: SockInfo,
    client: SocketAddr,
    keys: KeySet,
    buf: Vec<u8>,
}

impl Shard {
    fn new() -> Shard {
        let keys = KeySet::new((Generation::new(1).unwrap(), [0x5a; 32]), None).unwrap();
        let ids: Vec<InstanceInfo> =
            (1..=INSTANCES).map(|i| InstanceInfo { server_id: ServerId(i), placeable: true }).collect();
        let table = Table::new(keys.clone(), [0x42; 16], &ids).unwrap();
        let (mut conns, mut workers) = (Vec::new(), Vec::new());
        for (slot, info) in ids.iter().enumerate() {
            let (ours, theirs) = socketpair();
            sys::sockopt::set_send_buffer(&ours, DATA_SNDBUF as usize);
            conns.push(Arc::new(DataConn { fd: ours, server_id: info.server_id.0, slot, rings: Vec::new() }));
            workers.push(theirs);
        }
        let snap = Snapshot { table, conns, pressure: Vec::new(), version: 1, awaited: Default::default() };
        let empty = Snapshot {
            table: Table::new(keys.clone(), [0x42; 16], &[]).unwrap(),
            conns: Vec::new(),
            pressure: Vec::new(),
            version: 0,
            awaited: Default::default(),
        };
        let setup = ShardSetup {
            index: 0,
            core: core_affinity::CoreId { id: 0 },
            sockets: Vec::new(),
            counters: Arc::new(ShardCounters::new(1024)),
            shared: Arc::new(ArcSwap::from_pointee(empty)),
            pin_capacity: 1 << 16,
            decode_cache: proto::decode_cache::DEFAULT_ENTRIES,
            batch: 32,
            uring_buffers: 256,
            busy_poll: std::time::Duration::ZERO,
            rejoin_grace: std::time::Duration::ZERO,
            limits: Arc::new(Limits::new(LimitsConfig::default()).unwrap()),
            peers: None,
            started: std::sync::mpsc::channel().0,
        };
        let mut router = Router::new(&setup).unwrap();
        router.begin();
        let local: SocketAddr = "127.0.0.1:4433".parse().unwrap();
        Shard {
            router,
            snap,
            workers,
            sock: SockInfo { local },
            client: "127.0.0.2:50000".parse().unwrap(),
            keys,
            buf: vec![0u8; 1 << 16],
        }
    }

    /// A 1-RTT datagram of `len` bytes to instance `server_id`.
    fn short(&self, server_id: u16, len: usize) -> Vec<u8> {
        let mut d = vec![0x43];
        d.extend_from_slice(&self.keys.encode(ServerId(server_id), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
        d.resize(len, 0x17);
        d
    }

    fn meta(gro_size: Option<u16>) -> RecvMeta {
        RecvMeta { local_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), ecn: 0, gro_size }
    }

    /// # Safety
    /// `payload` stays valid until the next [`Shard::flush`].
    unsafe fn datagram(&mut self, meta: &RecvMeta, payload: &[u8]) {
        // SAFETY: the caller upholds `Router::datagram`'s contract (payload lives until flush).
        unsafe { self.router.datagram(&self.snap, &self.sock, self.client, meta, payload) }
    }

    /// End of a batch: flush, empty the workers' ends, start the next batch.
    fn flush(&mut self) {
        self.router.flush(&self.snap);
        self.drain();
        self.router.begin();
    }

    fn drain(&mut self) -> usize {
        self.workers.iter().map(|w| drain(w.as_raw_fd(), &mut self.buf)).sum()
    }

    fn count(&self, f: impl Fn(&ShardCounters) -> &std::sync::atomic::AtomicU64) -> u64 {
        f(&self.router.counters).load(Ordering::Relaxed)
    }

    /// Nothing dropped so far: the benches measured the forwarding path.
    fn assert_all_forwarded(&self) {
        assert_eq!(self.count(|c| &c.drops_full), 0, "worker socket full");
        assert_eq!(self.count(|c| &c.drops_send_error), 0, "send errors");
        assert_eq!(self.count(|c| &c.drops_no_instance), 0);
        assert_eq!(self.count(|c| &c.reasons[Reason::NotQuic.index()]), 0);
    }
}

/// Control data of an IPv4 GRO train, in the kernel's order (udp_recvmsg: UDP_GRO,
/// then ip_cmsg_recv: IP_PKTINFO, IP_TOS), laid out as CMSG_NXTHDR walks it.
fn gro_control() -> Vec<u8> {
    fn push(buf: &mut Vec<u8>, level: i32, ty: i32, data: &[u8]) {
        // SAFETY: CMSG_LEN / CMSG_SPACE are pure computations.
        let (len, space) = unsafe { (libc::CMSG_LEN(data.len() as u32), libc::CMSG_SPACE(data.len() as u32)) };
        let start = buf.len();
        buf.extend_from_slice(&(len as usize).to_ne_bytes());
        buf.extend_from_slice(&level.to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(data);
        buf.resize(start + space as usize, 0);
    }
    let mut b = Vec::new();
    push(&mut b, libc::SOL_UDP, libc::UDP_GRO, &(DATAGRAM as i32).to_ne_bytes());
    push(&mut b, libc::IPPROTO_IP, libc::IP_PKTINFO, &[2, 0, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
    push(&mut b, libc::IPPROTO_IP, libc::IP_TOS, &[0x02]);
    b
}

fn benches<M: Clock>(c: &mut Criterion<M>, p: &str) {
    let mut s = Shard::new();
    let short = s.short(2, DATAGRAM);
    let train: Vec<u8> = (0..TRAIN_SEGMENTS).flat_map(|_| short.iter().copied()).collect();
    let (plain, gro) = (Shard::meta(None), Shard::meta(Some(DATAGRAM as u16)));
    // SAFETY (every `datagram` below): `short` and `train` outlive the shard's flushes.
    // SAFETY: `short` and `train` outlive the flush below.
    unsafe { s.datagram(&plain, &short) };
    // SAFETY: as above.
    unsafe { s.datagram(&gro, &train) };
    s.router.flush(&s.snap);
    assert_eq!(s.drain(), 2, "one frame each");
    assert_eq!(s.count(|c| &c.reasons[Reason::Owner.index()]), 1 + TRAIN_SEGMENTS as u64);

    let mut g = c.benchmark_group(format!("{p}shard"));
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(1));
    g.bench_function("datagram_short", |b| {
        b.iter_custom(|iters| {
            // SAFETY: `short` outlives every flush of the measurement.
            let routine = |s: &mut Shard| unsafe { s.datagram(&plain, black_box(&short)) };
            chunked::<M, _>(iters, 256, &mut s, routine, Shard::flush)
        })
    });
    g.throughput(Throughput::Elements(TRAIN_SEGMENTS as u64));
    g.bench_function("datagram_train", |b| {
        b.iter_custom(|iters| {
            // SAFETY: `train` outlives every flush of the measurement.
            let routine = |s: &mut Shard| unsafe { s.datagram(&gro, black_box(&train)) };
            chunked::<M, _>(iters, 64, &mut s, routine, Shard::flush)
        })
    });
    g.throughput(Throughput::Elements(32));
    let fill = |s: &mut Shard| {
        s.drain();
        s.router.begin();
        for _ in 0..32 {
            // SAFETY: `short` outlives the flush.
            unsafe { s.datagram(&plain, &short) };
        }
    };
    g.bench_function("flush_32", |b| {
        b.iter_custom(|iters| {
            fill(&mut s);
            let t = chunked::<M, _>(iters, 1, &mut s, |s| s.router.flush(&s.snap), fill);
            s.flush();
            t
        })
    });
    g.finish();
    s.assert_all_forwarded();

    let mut g = c.benchmark_group(format!("{p}shard"));
    g.sampling_mode(SamplingMode::Flat);
    let control = gro_control();
    let want = RecvMeta { local_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), ecn: 2, gro_size: Some(DATAGRAM as u16) };
    assert_eq!(cmsg::parse(&control), want);
    g.bench_function("cmsg_parse", |b| b.iter(|| cmsg::parse(black_box(&control))));

    let ring = Producer::create(1 << 20).unwrap();
    let [m, e] = ring.fds();
    let consumer =
        worker::ring::Consumer::open(m.try_clone_to_owned().unwrap(), e.try_clone_to_owned().unwrap(), 1 << 20)
            .unwrap();
    let hdr = [0u8; proto::wire::frame::HEADER_LEN];
    let mut out = vec![0u8; 1 << 16];
    let mut full = 0u64;
    g.bench_function("ring_push", |b| {
        b.iter_custom(|iters| {
            let routine = |full: &mut u64| *full += u64::from(!ring.push(&hdr, black_box(&short)));
            chunked::<M, _>(iters, 512, &mut full, routine, |_| {
                ring.publish();
                while let Ok(Some(_)) = consumer.pop(&mut out) {}
            })
        })
    });
    // The worker's side: one frame (48 + 1200 bytes) out of the ring into a
    // quinn-sized buffer. `ring_pop_frame`: header decoded from a stack copy, payload
    // copied once into the buffer (what the worker does). `ring_pop_copy_move`: the
    // whole record copied into the buffer, decoded there and the payload moved to the
    // front (the two copies it did before). The producer refills 512 frames untimed.
    while consumer.pop(&mut out).unwrap().is_some() {}
    let mut fh = [0u8; proto::wire::frame::HEADER_LEN];
    let client = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 4433);
    let meta = proto::wire::frame::FrameMeta { client, local: None, ecn: 0, segment_size: None };
    proto::wire::frame::encode_header(&meta, &mut fh);
    let mut drain = vec![0u8; 1 << 16];
    let mut refill = |_: &mut u64| {
        while consumer.pop(&mut drain).unwrap().is_some() {}
        for _ in 0..512 {
            assert!(ring.push(&fh, &short));
        }
        ring.publish();
    };
    let mut quinn_buf = vec![0u8; 1200 * 64];
    let mut popped = 0u64;
    g.bench_function("ring_pop_frame", |b| {
        b.iter_custom(|iters| {
            refill(&mut popped);
            let routine = |n: &mut u64| {
                if let Ok(Some(worker::ring::Popped::Frame { len, .. })) = consumer.pop_frame(&mut quinn_buf) {
                    *n += black_box(len) as u64;
                }
            };
            chunked::<M, _>(iters, 512, &mut popped, routine, &mut refill)
        })
    });
    let mut moved = 0u64;
    g.bench_function("ring_pop_copy_move", |b| {
        b.iter_custom(|iters| {
            refill(&mut moved);
            let routine = |n: &mut u64| {
                if let Ok(Some(len)) = consumer.pop(&mut quinn_buf) {
                    if let Ok((_, p)) = proto::wire::frame::decode(&quinn_buf[..len]) {
                        let plen = p.len();
                        quinn_buf.copy_within(proto::wire::frame::HEADER_LEN..len, 0);
                        *n += black_box(plen) as u64;
                    }
                }
            };
            chunked::<M, _>(iters, 512, &mut moved, routine, &mut refill)
        })
    });
    g.finish();
    assert_eq!(full, 0, "the ring never filled");
    assert!(popped > 0 && moved > 0 && popped.is_multiple_of(1200) && moved.is_multiple_of(1200), "{popped} {moved}");
}

testkit::criterion_main_both_clocks!(benches);
