//! Packet trains through the real program on real sockets (docs/adr/0004, "Trains"):
//! UDP GSO sends on loopback, which the SK_REUSEPORT program sees as one skb of
//! several datagrams, checked against a model of each variant's rule:
//! - gso-walk: a train goes to the first datagram's worker only when every segment
//!   is a routable short header of that same live server id; otherwise to a shard;
//! - size-limit: a train whose UDP payload exceeds `max_udp_payload` goes to a
//!   shard; a shorter one follows its first datagram (the documented hole).
//!
//! Receive-side GRO trains: tests/gro.rs.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use fastpath::{Counters, Variant};
use proto::header::MAX_UDP_PAYLOAD;
use proto::ServerId;
use std::ops::Range;
use std::os::fd::AsFd;

/// What one segment of a train is.
#[derive(Clone, Copy, Debug)]
enum Seg {
    /// A fast datagram of worker `w`; `same`: with the first segment's DCID bytes.
    Fast {
        w: usize,
        same: bool,
    },
    Long,
    CrUnroutable,
    Inactive,
    NotLive,
    FixedBitClear,
}

/// Where one datagram would go alone (the single-datagram rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alone {
    Worker(usize),
    Shard(Outcome),
}

/// The first byte's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Short,
    Long,
    FixedBitClear,
}

/// One planned segment: its first byte, what its DCID decodes to (a live worker or
/// why not), its length.
#[derive(Clone, Copy, Debug)]
struct Planned {
    form: Form,
    dcid: Alone,
    len: usize,
}

impl Planned {
    /// Where it would go alone if it were `len` bytes long (the program checks the
    /// form bit, then fixed bit and length, then the DCID).
    fn alone(&self, len: usize) -> Alone {
        match self.form {
            Form::Long => Alone::Shard(Outcome::LongHeader),
            Form::FixedBitClear => Alone::Shard(Outcome::ShortPacket),
            Form::Short if len < 33 => Alone::Shard(Outcome::ShortPacket),
            Form::Short => self.dcid,
        }
    }
}

/// The keys of the group: generations 0 and 1 live (siphash-2-4), 2 inactive.
struct Keys {
    k: [[u64; 2]; 2],
}

fn prepare_two(g: &Group) -> Keys {
    let k = [derive(&SECRET0), derive(&SECRET1)];
    g.steering.set_generation(gen(0), Some(k[0].into())).unwrap();
    g.steering.set_generation(gen(1), Some(k[1].into())).unwrap();
    g.steering.set_generation(gen(2), None).unwrap();
    for (slot, w) in g.workers.iter().enumerate() {
        g.steering.insert_worker(slot as u32, ServerId(IDS[slot]), w.as_ref().unwrap().as_fd()).unwrap();
    }
    Keys { k }
}

/// One datagram of `len` bytes (>= 17) for segment kind `seg`; `first`: the train's
/// first segment's DCID and its decoding (for `same`).
fn segment(
    rng: &mut Rng,
    keys: &Keys,
    seg: Seg,
    first: Option<([u8; 12], Alone)>,
    len: usize,
    seq: u32,
) -> (Vec<u8>, [u8; 12], Planned) {
    let live_cr = rng.below(2) as u8;
    let key = keys.k[live_cr as usize];
    let (form, c, dcid) = match seg {
        Seg::Fast { w, same } => match (same, first) {
            (true, Some((c, dcid))) => (Form::Short, c, dcid),
            _ => (Form::Short, cid(rng, live_cr, IDS[w], Some(key)), Alone::Worker(w)),
        },
        Seg::Long => (Form::Long, cid(rng, live_cr, IDS[0], Some(key)), Alone::Worker(0)),
        Seg::CrUnroutable => {
            let mut c = cid(rng, 0, IDS[1], Some(keys.k[0]));
            c[0] |= 0xc0;
            (Form::Short, c, Alone::Shard(Outcome::CrUnroutable))
        }
        Seg::Inactive => {
            let mut c = cid(rng, 0, IDS[2], Some(keys.k[0]));
            c[0] = (c[0] & 0x3f) | 0x80;
            (Form::Short, c, Alone::Shard(Outcome::UnknownGeneration))
        }
        Seg::NotLive => {
            let mut id = rng.next() as u16;
            while IDS.contains(&id) {
                id = rng.next() as u16;
            }
            (Form::Short, cid(rng, live_cr, id, Some(key)), Alone::Shard(Outcome::NotLive))
        }
        Seg::FixedBitClear => (Form::FixedBitClear, cid(rng, live_cr, IDS[0], Some(key)), Alone::Worker(0)),
    };
    let first_byte = match form {
        Form::Short => 0x40 | ((rng.next() as u8) & 0x3f),
        Form::Long => 0x80 | (rng.next() as u8),
        Form::FixedBitClear => (rng.next() as u8) & 0x3f,
    };
    (short_datagram(rng, first_byte, &c, len, seq), c, Planned { form, dcid, len })
}

/// A planned unit: its datagrams' range in the plan and what each segment is.
struct Unit {
    range: Range<usize>,
    segs: Vec<Planned>,
}

/// Appends a train of `segs` (segment i has `size` bytes, the last `last`) to `plan`.
#[allow(clippy::too_many_arguments)]
fn push_train(
    plan: &mut Vec<Dgram>,
    units: &mut Vec<Unit>,
    rng: &mut Rng,
    keys: &Keys,
    src: usize,
    segs: &[Seg],
    size: usize,
    last: usize,
) {
    let start = plan.len();
    let mut first = None;
    let mut planned = Vec::new();
    for (i, &s) in segs.iter().enumerate() {
        let len = if i + 1 == segs.len() { last } else { size };
        let (bytes, c, p) = segment(rng, keys, s, first, len, plan.len() as u32);
        first.get_or_insert((c, p.dcid));
        planned.push(p);
        // expect/outcome are set by `apply_model`.
        plan.push(Dgram { src, bytes, expect: Expect::AnyShard, outcome: Outcome::Fast });
    }
    units.push(Unit { range: start..plan.len(), segs: planned });
}

/// Each variant's rule for one unit: where all its datagrams go (one skb goes to one
/// socket) and the counters it bumps, into `want` and `per_worker` (worker_fast).
/// gso-walk sees the segments: the first decides as a single datagram would, then
/// every other must go alone where it goes. size-limit sees one datagram of the
/// whole payload: its first bytes decide, and a payload over `MAX_UDP_PAYLOAD` that
/// would be fast goes to a shard instead.
fn apply_model(
    variant: Variant,
    plan: &mut [Dgram],
    u: &Unit,
    want: &mut Counters,
    per_worker: &mut [u64; 3],
) -> Expect {
    let segs = u.segs.len() as u64;
    let payload: usize = u.segs.iter().map(|p| p.len).sum();
    let first = match variant {
        Variant::GsoWalk => u.segs[0].alone(u.segs[0].len),
        Variant::SizeLimit => u.segs[0].alone(payload),
    };
    let (expect, outcome) = match first {
        Alone::Shard(o) => {
            bump_reason(want, o);
            (Expect::AnyShard, o)
        }
        Alone::Worker(w) => {
            let keep = match variant {
                Variant::GsoWalk => u.segs.iter().all(|p| p.alone(p.len) == Alone::Worker(w)),
                Variant::SizeLimit => payload <= usize::from(MAX_UDP_PAYLOAD),
            };
            if keep {
                // The size-limit program cannot see segments: one skb, one datagram.
                let seen = if variant == Variant::GsoWalk { segs } else { 1 };
                want.fast += 1;
                want.fast_datagrams += seen;
                want.train_fast += u64::from(seen > 1);
                per_worker[w] += seen;
                (Expect::Worker(w), Outcome::Fast)
            } else {
                want.train_to_shard += 1;
                // No Outcome variant for it: the name only shows in failure messages.
                (Expect::AnyShard, Outcome::SelectFailed)
            }
        }
    };
    for d in &mut plan[u.range.clone()] {
        d.expect = expect;
        d.outcome = outcome;
    }
    expect
}

fn bump_reason(c: &mut Counters, o: Outcome) {
    match o {
        Outcome::LongHeader => c.long_header += 1,
        Outcome::ShortPacket => c.short_packet += 1,
        Outcome::CrUnroutable => c.cr_unroutable += 1,
        Outcome::UnknownGeneration => c.unknown_generation += 1,
        Outcome::NotLive => c.not_live += 1,
        other => panic!("not a shard reason: {other:?}"),
    }
}

/// Runs `units` of `plan` through a group running `variant`: checks every datagram's
/// destination, that a train sent to the shards reached one shard socket whole, and
/// the counters and per-worker counts against the model. Returns the counters.
fn check(variant: Variant, g: &Group, mut plan: Vec<Dgram>, units: &[Unit]) -> Counters {
    let mut want = Counters::default();
    let mut per_worker = [0u64; 3];
    let mut expects = Vec::new();
    for u in units {
        expects.push(apply_model(variant, &mut plan, u, &mut want, &mut per_worker));
    }
    let srcs = senders(8);
    let ranges: Vec<Range<usize>> = units.iter().map(|u| u.range.clone()).collect();
    let del = run_units(g, &srcs, &plan, &ranges);
    assert_eq!(del.at.len(), plan.len());
    for (u, e) in units.iter().zip(&expects) {
        if *e == Expect::AnyShard {
            let shards: Vec<_> = u.range.clone().map(|i| del.at[&(i as u32)]).collect();
            assert!(shards.iter().all(|s| *s == shards[0]), "one skb, one shard socket: {shards:?}");
        }
    }
    let have = g.steering.counters().unwrap();
    assert_eq!(have, want, "{variant} counters (left: kernel, right: model)");
    assert_eq!(have.total(), units.len() as u64, "every skb counts once");
    for (w, n) in per_worker.iter().enumerate() {
        assert_eq!(g.steering.worker_fast(w as u32).unwrap(), *n, "{variant}: worker_fast({w})");
    }
    have
}

fn group_of(variant: Variant) -> Option<Group> {
    let g = group_at("127.0.0.1:0", Some(variant), 2, 3, 4, None)?;
    assert_eq!(g.steering.variant(), variant);
    Some(g)
}

/// The train `segs` of 8 × 1200 bytes whose segments alternate between workers
/// `a` and `b` (each segment a fresh CID).
fn alternating(a: usize, b: usize, n: usize) -> Vec<Seg> {
    (0..n).map(|i| Seg::Fast { w: if i % 2 == 0 { a } else { b }, same: false }).collect()
}

/// The set-up that showed the defect: one client socket sends UDP GSO trains of
/// 8 × 1200-byte short headers alternating between two live ids. Neither variant
/// may hand such a train to the first segment's worker; both send it to a shard
/// (which splits it), counted `train_to_shard`.
#[test]
fn mixed_gso_train_goes_to_a_shard() {
    for variant in [Variant::GsoWalk, Variant::SizeLimit] {
        let Some(g) = group_of(variant) else { return };
        let keys = prepare_two(&g);
        let mut rng = Rng(24);
        let (mut plan, mut units) = (Vec::new(), Vec::new());
        for i in 0..40 {
            let (a, b) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            push_train(&mut plan, &mut units, &mut rng, &keys, i % 8, &alternating(a, b, 8), 1200, 1200);
        }
        let c = check(variant, &g, plan, &units);
        assert_eq!((c.train_to_shard, c.fast), (40, 0), "{variant}: {c:?}");
    }
}

/// A train of one connection (the common case: one quinn connection's GSO send) is
/// steered whole to its worker by gso-walk, counted `train_fast` and, per worker, by
/// its segments; so is a train of several CIDs of one server id (each needs its own
/// SipHash) and one whose last segment is shorter. size-limit cannot tell such a
/// train from a mixed one and sends it to a shard.
#[test]
fn one_connection_gso_train_stays_on_the_fast_path() {
    for variant in [Variant::GsoWalk, Variant::SizeLimit] {
        let Some(g) = group_of(variant) else { return };
        let keys = prepare_two(&g);
        let mut rng = Rng(25);
        let (mut plan, mut units) = (Vec::new(), Vec::new());
        for i in 0..30 {
            let w = i % 3;
            let same: Vec<Seg> = (0..8).map(|_| Seg::Fast { w, same: true }).collect();
            push_train(&mut plan, &mut units, &mut rng, &keys, i % 8, &same, 1200, 1200);
            let fresh: Vec<Seg> = (0..8).map(|_| Seg::Fast { w, same: false }).collect();
            push_train(&mut plan, &mut units, &mut rng, &keys, i % 8, &fresh, 1200, 1200);
            push_train(&mut plan, &mut units, &mut rng, &keys, i % 8, &same, 1000, 33);
        }
        let c = check(variant, &g, plan, &units);
        match variant {
            Variant::GsoWalk => assert_eq!((c.fast, c.train_fast, c.fast_datagrams), (90, 90, 720), "{c:?}"),
            Variant::SizeLimit => assert_eq!((c.fast, c.train_to_shard), (0, 90), "{c:?}"),
        }
    }
}

/// The hole ADR 0004 documents for the size-limit fallback: a mixed train no longer
/// than the workers' largest datagram (here 2 × 600 bytes) still follows its first
/// datagram, so its second datagram reaches the wrong worker. gso-walk sends it to a
/// shard.
#[test]
fn size_limit_steers_a_short_mixed_train_by_its_first_datagram() {
    for variant in [Variant::GsoWalk, Variant::SizeLimit] {
        let Some(g) = group_of(variant) else { return };
        let keys = prepare_two(&g);
        let mut rng = Rng(26);
        let (mut plan, mut units) = (Vec::new(), Vec::new());
        for i in 0..20 {
            push_train(&mut plan, &mut units, &mut rng, &keys, i % 8, &alternating(0, 1, 2), 600, 600);
        }
        // The bound itself: 1472 bytes in all is a datagram a worker accepts, 1473 is not.
        let max = usize::from(MAX_UDP_PAYLOAD);
        push_train(&mut plan, &mut units, &mut rng, &keys, 0, &alternating(0, 1, 2), max / 2, max / 2);
        push_train(&mut plan, &mut units, &mut rng, &keys, 1, &alternating(0, 1, 2), max / 2 + 1, max / 2);
        let c = check(variant, &g, plan, &units);
        match variant {
            Variant::GsoWalk => assert_eq!((c.train_to_shard, c.fast), (22, 0), "{c:?}"),
            // `check` saw both datagrams of every short train arrive at worker 0: 21 of
            // them are worker 1's. The program counted one datagram per skb.
            Variant::SizeLimit => assert_eq!(
                (c.fast, c.train_to_shard, g.steering.worker_fast(0).unwrap(), g.steering.worker_fast(1).unwrap()),
                (21, 1, 21, 0)
            ),
        }
    }
}

/// UDP GSO's largest train (128 segments) is walked to its end: all one worker's is
/// fast; one whose 128th segment is another worker's goes to a shard.
#[test]
fn the_longest_gso_train_is_walked_to_its_last_segment() {
    let Some(g) = group_of(Variant::GsoWalk) else { return };
    let keys = prepare_two(&g);
    let mut rng = Rng(27);
    let n = fastpath::MAX_TRAIN_SEGMENTS as usize;
    let (mut plan, mut units) = (Vec::new(), Vec::new());
    for i in 0..4 {
        let mut segs: Vec<Seg> = (0..n).map(|k| Seg::Fast { w: 2, same: k % 2 == 0 }).collect();
        push_train(&mut plan, &mut units, &mut rng, &keys, i, &segs, 40, 40);
        segs[n - 1] = Seg::Fast { w: 1, same: false };
        push_train(&mut plan, &mut units, &mut rng, &keys, i, &segs, 40, 40);
    }
    let c = check(Variant::GsoWalk, &g, plan, &units);
    assert_eq!((c.fast, c.fast_datagrams, c.train_to_shard), (4, 4 * n as u64, 4), "{c:?}");
}

/// Every segment kind at every position: the exact model of each variant over a few
/// hundred trains and single datagrams.
#[test]
fn gso_walk_matches_the_model_exactly() {
    model_test(Variant::GsoWalk, 61);
}

#[test]
fn size_limit_matches_the_model_exactly() {
    model_test(Variant::SizeLimit, 62);
}

fn random_seg(rng: &mut Rng) -> Seg {
    match rng.below(8) {
        0 => Seg::Long,
        1 => Seg::CrUnroutable,
        2 => Seg::Inactive,
        3 => Seg::NotLive,
        4 => Seg::FixedBitClear,
        _ => Seg::Fast { w: rng.below(3) as usize, same: rng.below(2) == 0 },
    }
}

fn model_test(variant: Variant, seed: u64) {
    let Some(g) = group_of(variant) else { return };
    let keys = prepare_two(&g);
    let mut rng = Rng(seed);
    let (mut plan, mut units) = (Vec::new(), Vec::new());
    for i in 0..400 {
        let src = i % 8;
        // Mostly 2..=12 segments of 17..=1200 bytes; sometimes up to UDP GSO's 128
        // segments of a few dozen bytes.
        let (n, size) = if rng.below(10) == 0 {
            (2 + rng.below(127) as usize, 33 + rng.below(40) as usize)
        } else {
            (1 + rng.below(12) as usize, 17 + rng.below(1184) as usize)
        };
        let last = if rng.below(3) == 0 { 17 + rng.below(size as u64 - 16) as usize } else { size };
        let w = rng.below(3) as usize;
        let segs: Vec<Seg> = match rng.below(5) {
            // One worker: same or fresh CIDs.
            0 | 1 => (0..n).map(|_| Seg::Fast { w, same: rng.below(2) == 0 }).collect(),
            // One worker but one segment that is not.
            2 => {
                let mut s: Vec<Seg> = (0..n).map(|_| Seg::Fast { w, same: rng.below(2) == 0 }).collect();
                let at = rng.below(n as u64) as usize;
                s[at] =
                    if rng.below(2) == 0 { Seg::Fast { w: (w + 1) % 3, same: false } } else { random_seg(&mut rng) };
                s
            }
            3 => alternating(w, (w + 1 + rng.below(2) as usize) % 3, n),
            _ => (0..n).map(|_| random_seg(&mut rng)).collect(),
        };
        push_train(&mut plan, &mut units, &mut rng, &keys, src, &segs, size, last.min(size));
    }
    let c = check(variant, &g, plan, &units);
    // The plan covers both rules' outcomes.
    assert!(c.train_to_shard > 0 && c.fast > 0 && c.long_header > 0 && c.not_live > 0, "{c:?}");
    if variant == Variant::GsoWalk {
        assert!(c.train_fast > 10, "{c:?}");
    }
}
