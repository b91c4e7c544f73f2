//! Packet trains through a real data plane, with the kernel fast path on and off
//! (docs/adr/0004-kernel-fast-path.md, "Trains"): several datagrams of one client
//! 4-tuple that reach the reuseport group as one skb — a UDP GSO send on loopback, or
//! datagrams a receiving veth's GRO coalesced — whose datagrams belong to two live
//! workers. Each test worker must receive exactly its own datagrams, on its fast
//! socket or over its data connection, and the status counts them per instance.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use std::net::UdpSocket;
use std::sync::Mutex;
use std::time::Duration;
use testkit::netns::{in_netns, VethPair};

/// One test at a time: each runs a data plane and sends bursts that two cores carry
/// best alone (GRO coalescing depends on the receiver keeping up).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

const A: u16 = 21;
const B: u16 = 22;
/// Datagrams per train (as in the set-up that showed the defect: 8 × 1200 bytes).
const SEGS: usize = 8;
const LEN: usize = 1200;

/// The two test workers, asking for the fast path.
fn workers(d: &Demux) -> (Worker, Worker) {
    let a = Worker::connect_fast(d, A, true);
    let b = Worker::connect_fast(d, B, true);
    d.wait_instances(&[(A, true), (B, true)]);
    (a, b)
}

/// A fresh short-header datagram of `LEN` bytes for server id `id`.
fn dgram(d: &Demux, id: u16, rng: &mut Rng) -> Vec<u8> {
    short(&d.cid(id, rng), LEN, rng)
}

/// Three phases of `n` trains each: trains whose datagrams alternate between A and B
/// (each a fresh CID), then trains of one connection of A each (one CID per train),
/// then B's. Returns the phases and how many datagrams each id was sent.
fn plan(d: &Demux, n: usize, rng: &mut Rng) -> (Vec<Vec<Vec<Vec<u8>>>>, u64, u64) {
    let mut mixed = Vec::new();
    for i in 0..n {
        let (x, y) = if i % 2 == 0 { (A, B) } else { (B, A) };
        mixed.push((0..SEGS).map(|k| dgram(d, if k % 2 == 0 { x } else { y }, rng)).collect());
    }
    let one_connection = |id: u16, rng: &mut Rng| -> Vec<Vec<Vec<u8>>> {
        (0..n / 2)
            .map(|_| {
                let one = dgram(d, id, rng);
                vec![one; SEGS]
            })
            .collect()
    };
    let (ones_a, ones_b) = (one_connection(A, rng), one_connection(B, rng));
    let per_id = (n * SEGS) as u64;
    (vec![mixed, ones_a, ones_b], per_id, per_id)
}

/// Waits until worker `w` has received `want` datagrams (user path + fast path),
/// then checks that each one's DCID decodes to `w`'s server id and that the status
/// counts exactly `want` for the instance. Returns (user path, fast path).
fn owns_exactly(d: &Demux, w: &Worker, want: u64) -> (u64, u64) {
    let ks = d.key_set();
    let id_of = |dcid: &[u8]| ks.decode(dcid).map(|x| x.server_id.0).ok();
    let fast = std::cell::RefCell::new(Vec::new());
    wait_for(&format!("worker {} gets {want} datagrams", w.server_id), || {
        fast.borrow_mut().extend(w.fast_datagrams());
        (w.datagrams() + fast.borrow().len()) as u64 >= want
    });
    let mut fast = fast.into_inner();
    std::thread::sleep(Duration::from_millis(100));
    fast.extend(w.fast_datagrams());
    let user: Vec<Vec<u8>> = w.frames().into_iter().flat_map(|f| f.segment_dcids).collect();
    assert_eq!((user.len() + fast.len()) as u64, want, "worker {}: datagrams received", w.server_id);
    for dcid in user.iter().map(Vec::as_slice).chain(fast.iter().map(|p| &p[1..13])) {
        assert_eq!(id_of(dcid), Some(w.server_id), "worker {} got {dcid:02x?}", w.server_id);
    }
    let s = d.status();
    let i = instance(&s, w.server_id);
    assert_eq!((u64_at(i, "/datagrams"), u64_at(i, "/fast_datagrams")), (user.len() as u64, fast.len() as u64));
    (user.len() as u64, fast.len() as u64)
}

/// Whether this data plane runs the gso-walk program; reports why when it does not.
fn gso_walk_or_skip(d: &Demux) -> bool {
    let fp = &d.status()["fast_path"];
    if fp["active"].as_bool() == Some(true) && fp["program"] == "gso-walk" {
        return true;
    }
    testkit::skip(&format!("the fast path's gso-walk program does not run here: {fp}"));
    false
}

/// The set-up that showed the defect, on loopback: one client socket sends UDP GSO
/// trains of 8 × 1200-byte short headers alternating between two live ids, and as
/// many trains of one connection each.
fn gso_trains(fast_path: bool) {
    let _serial = serial();
    let extra: &[&str] = if fast_path { &[] } else { &["--fast-path", "off"] };
    let d = Demux::start_with("mmsg", "0", extra);
    if fast_path && !gso_walk_or_skip(&d) {
        return;
    }
    let (a, b) = workers(&d);
    let mut rng = Rng(24);
    let n = 40;
    let (phases, want_a, want_b) = plan(&d, n, &mut rng);
    let c = client();
    c.connect(d.addr()).unwrap();
    for t in phases.iter().flatten() {
        testkit::trains::send_gso(&c, t).unwrap();
    }
    let (user_a, fast_a) = owns_exactly(&d, &a, want_a);
    let (user_b, fast_b) = owns_exactly(&d, &b, want_b);
    let s = d.status();
    if fast_path {
        // Mixed trains went to the shards whole and were split there; trains of one
        // connection stayed on the fast path.
        assert_eq!(u64_at(&s, "/fast_path/to_demux/train_to_shard"), n as u64);
        assert_eq!(u64_at(&s, "/fast_path/train_fast"), n as u64);
        assert_eq!(fast_a + fast_b, (n * SEGS) as u64);
        assert_eq!(user_a + user_b, (n * SEGS) as u64);
    } else {
        assert_eq!(s["fast_path"]["active"], false);
        assert_eq!(fast_a + fast_b, 0);
    }
    // What the data plane read came as trains (it cuts them itself).
    assert_eq!(u64_at(&s, "/trains_in"), if fast_path { n as u64 } else { 2 * n as u64 });
}

#[test]
fn gso_trains_reach_each_owner_with_the_fast_path() {
    gso_trains(true);
}

#[test]
fn gso_trains_reach_each_owner_without_the_fast_path() {
    gso_trains(false);
}

/// The same over a veth pair whose receiving side coalesces (GRO): the data plane
/// runs in namespace b (198.18.100.2), the client in a `sendmmsg`s bursts of
/// same-size datagrams on one 4-tuple, mixing two ids, then bursts of one
/// connection's. The status shows coalescing happened (trains sent to the shards or
/// read as trains), so the test cannot pass without trains.
fn gro_trains(fast_path: bool) {
    let _serial = serial();
    if !testkit::netns::available() {
        return;
    }
    let pair = VethPair::new("dp-gro");
    pair.gro_on_b(200_000);
    let listen = format!("{}:4433", pair.b_addr);
    let extra: &[&str] = if fast_path { &[] } else { &["--fast-path", "off"] };
    let d = Demux::start_in_netns(&pair.b, &listen, "mmsg", "0", extra);
    if fast_path && !gso_walk_or_skip(&d) {
        return;
    }
    let (a, b) = workers(&d);
    let mut rng = Rng(25);
    let n = 40;
    let (phases, want_a, want_b) = plan(&d, n, &mut rng);
    let (from, to) = (pair.a_addr, d.addr());
    let c = in_netns(&pair.a, move || {
        let s = UdpSocket::bind((from, 0)).unwrap();
        s.connect(to).unwrap();
        s
    });
    // Bursts of two trains' datagrams; a pause between phases lets GRO flush, so
    // one connection's datagrams are not coalesced with the mixed ones.
    for phase in &phases {
        for burst in phase.chunks(2) {
            testkit::trains::send_batch(&c, &burst.concat()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    owns_exactly(&d, &a, want_a);
    owns_exactly(&d, &b, want_b);
    let s = d.status();
    if fast_path {
        assert!(u64_at(&s, "/fast_path/to_demux/train_to_shard") > 0, "no mixed GRO train seen: {}", s["fast_path"]);
        assert!(u64_at(&s, "/fast_path/train_fast") > 0, "no GRO train of one connection seen: {}", s["fast_path"]);
    } else {
        assert!(u64_at(&s, "/trains_in") > 0, "the shards read no GRO train");
    }
}

#[test]
fn gro_trains_reach_each_owner_with_the_fast_path() {
    gro_trains(true);
}

#[test]
fn gro_trains_reach_each_owner_without_the_fast_path() {
    gro_trains(false);
}
