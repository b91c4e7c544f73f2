//! Receive-side GRO trains through the real program (docs/adr/0004, "Trains"): a veth
//! pair between two network namespaces this test makes and removes (198.18.100.0/24),
//! GRO and UDP GRO forwarding on the receiving device, and a sender that `sendmmsg`s
//! same-size datagrams of one 4-tuple. The kernel coalesces them into trains before
//! the socket lookup, whatever their DCIDs; the program's counters show it did.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use fastpath::Variant;
use std::net::UdpSocket;
use testkit::netns::{in_netns, VethPair};

/// How long the receiving device's GRO holds datagrams for more of their flow.
const GRO_FLUSH_NS: u32 = 200_000;
const BURSTS: usize = 40;
const PER_BURST: usize = 16;

/// The group in namespace `b` of `pair` running gso-walk, its generation 0 key, and a
/// socket in namespace `a` connected to it.
fn setup(pair: &VethPair) -> Option<(Group, [u64; 2], UdpSocket)> {
    let b_addr = pair.b_addr;
    let g = in_netns(&pair.b, move || group_at(&format!("{b_addr}:0"), Some(Variant::GsoWalk), 2, 3, 4, None))?;
    let k0 = prepare(&g);
    let (a_addr, to) = (pair.a_addr, g.addr);
    let tx = in_netns(&pair.a, move || {
        let s = UdpSocket::bind((a_addr, 0)).unwrap();
        s.connect(to).unwrap();
        s
    });
    Some((g, k0, tx))
}

/// A 1200-byte fast datagram of worker `w` appended to `plan`.
fn push(plan: &mut Vec<Dgram>, rng: &mut Rng, k0: [u64; 2], w: usize, expect: Expect) {
    let c = cid(rng, 0, IDS[w], Some(k0));
    let first = 0x40 | (rng.next() as u8 & 0x3f);
    let bytes = short_datagram(rng, first, &c, 1200, plan.len() as u32);
    plan.push(Dgram { src: 0, bytes, expect, outcome: Outcome::Fast });
}

/// Sends `plan[range]` in bursts of `PER_BURST` (one sendmmsg each) and receives them.
fn send_and_receive(g: &Group, tx: &UdpSocket, plan: &[Dgram], range: std::ops::Range<usize>, del: &mut Delivery) {
    for burst in plan[range.clone()].chunks(PER_BURST) {
        let bytes: Vec<Vec<u8>> = burst.iter().map(|d| d.bytes.clone()).collect();
        testkit::trains::send_batch(tx, &bytes).unwrap();
    }
    receive(g, plan, range.len(), 0, &Default::default(), del);
}

/// Datagrams of two workers alternating on one 4-tuple reach their own worker (alone,
/// or in a train of one worker's) or a shard (in a mixed train), never the other
/// worker; bursts of one worker's datagrams reach it, coalesced trains kept whole.
#[test]
fn gro_trains_reach_their_own_worker_or_a_shard() {
    if !testkit::netns::available() {
        return;
    }
    let pair = VethPair::new("fp-gro");
    pair.gro_on_b(GRO_FLUSH_NS);
    let Some((g, k0, tx)) = setup(&pair) else { return };
    let mut rng = Rng(0x6a0);
    let mut plan: Vec<Dgram> = Vec::new();
    for i in 0..BURSTS * PER_BURST {
        push(&mut plan, &mut rng, k0, i % 2, Expect::WorkerOrShard(i % 2));
    }
    let mixed = plan.len();
    for _ in 0..BURSTS * PER_BURST {
        push(&mut plan, &mut rng, k0, 2, Expect::Worker(2));
    }
    let mut del = Delivery::default();
    send_and_receive(&g, &tx, &plan, 0..mixed, &mut del);
    send_and_receive(&g, &tx, &plan, mixed..plan.len(), &mut del);
    assert_eq!(del.at.len(), plan.len());
    let c = g.steering.counters().unwrap();
    let to_workers: u64 = del.per_worker.values().sum();
    assert_eq!(c.fast_datagrams, to_workers, "{c:?}");
    assert_eq!(del.per_worker.get(&2).copied(), Some((BURSTS * PER_BURST) as u64));
    assert_eq!(g.steering.worker_fast(2).unwrap(), (BURSTS * PER_BURST) as u64);
    // Coalescing happened (so the checks above were about trains): mixed trains
    // were sent to the shards, one worker's trains kept whole, and fewer skbs than
    // datagrams reached the program.
    assert!(c.train_to_shard > 0 && c.train_fast > 0, "no GRO trains seen: {c:?}");
    assert!(c.total() < plan.len() as u64, "{c:?}");
    eprintln!(
        "GRO: {} datagrams in {} skbs; trains kept whole {}, to a shard {}",
        plan.len(),
        c.total(),
        c.train_fast,
        c.train_to_shard
    );
}

/// A fraglist GRO train (`rx-gro-list`: what the kernel builds for sockets that did
/// not ask for UDP_GRO) goes to a shard even when every datagram is one worker's:
/// the gso-walk program leaves such skbs to the data plane (ADR 0004).
#[test]
fn fraglist_gro_trains_go_to_a_shard() {
    if !testkit::netns::available() {
        return;
    }
    let pair = VethPair::new("fp-flist");
    pair.gro_on_b_with(GRO_FLUSH_NS, &["rx-gro-list", "on"]);
    let Some((g, k0, tx)) = setup(&pair) else { return };
    // Without UDP_GRO on any socket of the group, GRO builds fraglist trains.
    for s in g.shards.iter().chain(g.workers.iter().flatten()) {
        testkit::trains::set_gro(s, false).unwrap();
    }
    let mut rng = Rng(0xf1);
    let mut plan: Vec<Dgram> = Vec::new();
    for _ in 0..BURSTS * PER_BURST {
        push(&mut plan, &mut rng, k0, 2, Expect::WorkerOrShard(2));
    }
    let mut del = Delivery::default();
    send_and_receive(&g, &tx, &plan, 0..plan.len(), &mut del);
    let c = g.steering.counters().unwrap();
    assert!(c.train_to_shard > 0 && c.train_fast == 0, "fraglist trains kept on the fast path: {c:?}");
    assert_eq!(c.fast_datagrams, del.per_worker.values().sum::<u64>(), "{c:?}");
    assert!(c.total() < plan.len() as u64, "{c:?}");
}
