//! Pins that carry a payload:
//! every payload stored with a pin comes back exactly once — when the pin expires, is
//! evicted as the oldest, is retargeted (the old payload) or the table is drained —
//! checked against an exact model; and the table keeps its fixed capacity under a
//! flood of 10⁶ client DCIDs from 10⁵ sources, evicting the oldest, while tickets of
//! the concurrency sketch are released exactly once (the sketch is all zeros after a
//! drain) and honest handshakes keep completing.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::rng::Rng;
use proto::cid::{Generation, KeySet, ServerId};
use proto::header::LongHeader;
use proto::limits::{ClientKey, ConcurrencySketch, Ticket};
use proto::pin::{Inserted, PinTable, MAX_KEY_LEN, NO_PAYLOAD};
use proto::route::{Admission, InstanceInfo, Reason, Router, Table};
use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The model: pins in insertion order, (key, target, at, payload).
struct Model {
    cap: usize,
    ttl: Duration,
    pins: Vec<(Vec<u8>, u16, Duration, u32)>,
}

impl Model {
    fn alive(&self, at: Duration, now: Duration) -> bool {
        match now.checked_sub(at) {
            Some(age) => age < self.ttl,
            None => true,
        }
    }
    fn expire(&mut self, now: Duration, out: &mut Vec<u32>) {
        while let Some(f) = self.pins.first() {
            if self.alive(f.2, now) {
                break;
            }
            out.push(self.pins.remove(0).3);
        }
    }
    fn insert(&mut self, key: &[u8], target: u16, now: Duration, payload: u32, out: &mut Vec<u32>) -> Inserted {
        if key.len() > MAX_KEY_LEN {
            out.push(payload);
            return Inserted::KeyTooLong;
        }
        self.expire(now, out);
        if let Some(p) = self.pins.iter_mut().find(|p| p.0 == key) {
            p.1 = target;
            out.push(std::mem::replace(&mut p.3, payload));
            return Inserted::Retargeted;
        }
        let evicted = self.pins.len() == self.cap;
        if evicted {
            out.push(self.pins.remove(0).3);
        }
        self.pins.push((key.to_vec(), target, now, payload));
        Inserted::New { evicted }
    }
}

#[test]
fn every_payload_comes_back_exactly_once_model() {
    let mut rng = Rng::new(0x7105);
    let mut keys: Vec<Vec<u8>> = (0..24).map(|i| rng.bytes(i % 22)).collect();
    keys.push(vec![0; 21]);
    let mut ops_total = 0usize;
    for case in 0..40 {
        let cap = 1 + case % 9;
        let ttl = Duration::from_millis(50 + 37 * case as u64);
        let mut t = PinTable::with_ttl(cap, rng.array(), ttl);
        let mut m = Model { cap, ttl, pins: Vec::new() };
        let mut now = Duration::from_secs(1);
        let mut next_payload = 0u32;
        let mut outstanding: HashSet<u32> = HashSet::new();
        for _ in 0..5_000 {
            ops_total += 1;
            let mut got = Vec::new();
            let mut want = Vec::new();
            match rng.below(10) {
                0..=4 => {
                    let key = rng.pick(&keys).clone();
                    let target = rng.below(4) as u16;
                    // Some pins carry no payload: they must never be handed back.
                    let payload = if rng.chance(1, 8) {
                        NO_PAYLOAD
                    } else {
                        next_payload += 1;
                        outstanding.insert(next_payload);
                        next_payload
                    };
                    let a = t.insert_with(&key, ServerId(target), now, payload, |p| got.push(p));
                    let b = m.insert(&key, target, now, payload, &mut want);
                    assert_eq!(a, b, "insert {key:?}");
                }
                5 | 6 => {
                    let key = rng.pick(&keys);
                    let want_t =
                        m.pins.iter().find(|p| &p.0 == key).filter(|p| m.alive(p.2, now)).map(|p| ServerId(p.1));
                    assert_eq!(t.get(key, now), want_t);
                }
                7 => {
                    t.expire_with(now, |p| got.push(p));
                    m.expire(now, &mut want);
                }
                _ => now += Duration::from_millis(rng.below(2 * ttl.as_millis() as usize / 3) as u64),
            }
            want.retain(|&p| p != NO_PAYLOAD);
            assert_eq!(got, want, "released payloads");
            for p in got {
                assert!(outstanding.remove(&p), "payload {p} handed back twice or never stored");
            }
            assert!(t.len() <= t.capacity());
            assert_eq!(t.len(), m.pins.len());
        }
        let mut got = Vec::new();
        t.drain(|p| got.push(p));
        let mut want: Vec<u32> = m.pins.iter().map(|p| p.3).filter(|&p| p != NO_PAYLOAD).collect();
        assert_eq!(got, want);
        for p in got.drain(..) {
            assert!(outstanding.remove(&p));
        }
        want.clear();
        assert!(outstanding.is_empty(), "payloads never handed back: {}", outstanding.len());
        assert!(t.is_empty());
    }
    assert!(ops_total >= 200_000);
}

/// A v1 client Initial (RFC 9000 §17.2.2) of 1200 bytes with this DCID and no token.
fn initial(dcid: &[u8]) -> Vec<u8> {
    let mut d = vec![0xc3];
    d.extend_from_slice(&1u32.to_be_bytes());
    d.push(dcid.len() as u8);
    d.extend_from_slice(dcid);
    d.push(8);
    d.extend_from_slice(&[9; 8]);
    d.push(0); // token length
    let rest = 1200 - d.len() - 2;
    d.extend_from_slice(&(rest as u16 | 0x4000).to_be_bytes());
    d.resize(1200, 0);
    d
}

/// The data plane's admission in miniature: the concurrency sketch, one ticket per pin.
struct Tickets<'a> {
    sketch: &'a ConcurrencySketch,
    cap: u16,
    client: ClientKey,
    acquired: u64,
    released: u64,
    outstanding: HashMap<u32, u64>,
}

impl Admission for Tickets<'_> {
    type Refusal = ();
    fn admit(&mut self, _: &LongHeader<'_>, _: usize, _: &Table, _: usize) -> Result<u32, ()> {
        let t = self.sketch.try_acquire(self.client, self.cap).ok_or(())?;
        self.acquired += 1;
        let raw = t.to_raw();
        *self.outstanding.entry(raw).or_default() += 1;
        Ok(raw)
    }
    fn release(&mut self, payload: u32) {
        let n = self.outstanding.get_mut(&payload).expect("released a payload never acquired");
        *n -= 1;
        if *n == 0 {
            self.outstanding.remove(&payload);
        }
        self.released += 1;
        self.sketch.release(Ticket::from_raw(payload).expect("a ticket's raw value"));
    }
}

fn flood_table() -> Table {
    let ks = KeySet::new((Generation::new(1).unwrap(), [1; 32]), None).unwrap();
    let infos: Vec<InstanceInfo> = (1..=4).map(|i| InstanceInfo { server_id: ServerId(i), placeable: true }).collect();
    Table::new(ks, [3; 16], &infos).unwrap()
}

fn src(i: u32) -> ClientKey {
    ClientKey::from(SocketAddr::from((Ipv4Addr::from(0x0a00_0000 | i), 4433)))
}

/// 10⁶ distinct client DCIDs from 10⁵ sources within one pin
/// lifetime. The table never holds more than its capacity, evicts strictly oldest
/// first, every ticket is released exactly once (the sketch is all zeros after a
/// drain), and a handshake whose pin is younger than the flood needs to push it out
/// still finds it.
#[test]
fn flood_of_a_million_dcids_keeps_capacity_and_tickets() {
    const CAP: usize = 1 << 16;
    const SOURCES: u32 = 100_000;
    const DCIDS: u32 = 1_000_000;
    let table = flood_table();
    let mut pins = PinTable::new(CAP, [5; 16]);
    let sketch = ConcurrencySketch::new(1 << 16, [6; 16]);
    let mut adm =
        Tickets { sketch: &sketch, cap: 64, client: src(0), acquired: 0, released: 0, outstanding: HashMap::new() };
    let mut rng = Rng::new(11);
    // 10 s of pin lifetime, 1 000 000 DCIDs: 9 µs apart, all within one lifetime.
    let step = Duration::from_micros(9);
    let mut now = Duration::from_secs(1);
    let mut placed = 0u64;
    let mut honest_ok = 0u32;
    let mut honest_tries = 0u32;
    let mut pending: Vec<(Vec<u8>, usize, u32)> = Vec::new(); // (dcid, target, placed at step)
    let mut refused = 0u64;
    let mut buf = initial(&[0; 8]);
    for i in 0..DCIDS {
        now += step;
        rng.fill(&mut buf[6..14]);
        adm.client = src(i % SOURCES);
        let mut run_out = None;
        Router::new(&table, &mut pins, now)
            .with_admission(&mut adm)
            .route_train(&buf, 0, |run, rf| run_out = Some((run, rf)));
        let (run, rf) = run_out.expect("one run");
        match rf {
            None => {
                assert_eq!(run.decision.reason, Reason::Placed);
                placed += 1;
            }
            Some(()) => refused += 1,
        }
        assert!(pins.len() <= CAP && pins.capacity() == CAP);
        // An honest client every 100 DCIDs: its second Initial (RFC 9000 §17.2.2, e.g.
        // the rest of a large ClientHello) comes CAP/4 placements later, well inside
        // the time the table takes to turn over.
        if i % 100 == 0 {
            let h = rng.bytes(8);
            adm.client = src(SOURCES + i / 100);
            let mut first = None;
            Router::new(&table, &mut pins, now)
                .with_admission(&mut adm)
                .route_train(&initial(&h), 0, |r, rf| first = Some((r, rf)));
            if let Some((r, None)) = first {
                placed += 1;
                pending.push((h, r.decision.target.expect("placed"), i));
            }
            honest_tries += 1;
        }
        while pending.first().is_some_and(|p| i - p.2 >= (CAP / 4) as u32) {
            let (h, target, _) = pending.remove(0);
            let mut again = None;
            Router::new(&table, &mut pins, now)
                .with_admission(&mut adm)
                .route_train(&initial(&h), 0, |r, rf| again = Some((r, rf)));
            let (r, rf) = again.expect("one run");
            if rf.is_none() && r.decision.reason == Reason::Pinned && r.decision.target == Some(target) {
                honest_ok += 1;
            }
        }
    }
    // 10 DCIDs per source within one lifetime stay under the cap of 64: the flood is
    // placed in full, so the table turned over ~15 times.
    assert_eq!(refused, 0);
    assert!(pins.evicted() >= placed - CAP as u64);
    assert_eq!(adm.acquired - adm.released, pins.len() as u64, "one live ticket per pin");
    assert!(honest_ok + pending.len() as u32 == honest_tries, "honest {honest_ok} of {honest_tries}");
    pins.drain(|p| adm.release(p));
    assert_eq!(adm.acquired, adm.released);
    assert!(adm.outstanding.is_empty());
    assert!((0..sketch.words()).all(|w| sketch.word(w) == 0), "a lane kept a count: a ticket leaked");
}

/// A few sources trying to fill the pin table: the concurrency cap keeps each at 64
/// live pins, so the table never fills and every honest handshake completes.
#[test]
fn few_abusive_sources_cannot_fill_the_table() {
    const CAP: usize = 1 << 14;
    let table = flood_table();
    let mut pins = PinTable::new(CAP, [5; 16]);
    let sketch = ConcurrencySketch::new(1 << 12, [6; 16]);
    let mut adm =
        Tickets { sketch: &sketch, cap: 64, client: src(0), acquired: 0, released: 0, outstanding: HashMap::new() };
    let mut rng = Rng::new(12);
    let mut now = Duration::from_secs(1);
    let (mut refused, mut honest_ok) = (0u64, 0u32);
    for i in 0..200_000u32 {
        now += Duration::from_micros(100); // 20 s: pins expire and tickets come back
        adm.client = src(i % 100);
        let mut out = None;
        Router::new(&table, &mut pins, now).with_admission(&mut adm).route_train(
            &initial(&rng.bytes(8)),
            0,
            |r, rf| out = Some((r, rf)),
        );
        refused += u64::from(out.expect("run").1.is_some());
        // 100 abusers at 64 each, plus the honest pins of the last 10 s (500).
        assert!(pins.len() <= 100 * 64 + 600, "{}", pins.len());
        if i % 200 == 0 {
            adm.client = src(1_000 + i);
            let h = rng.bytes(8);
            let mut a = None;
            Router::new(&table, &mut pins, now)
                .with_admission(&mut adm)
                .route_train(&initial(&h), 0, |r, rf| a = Some((r, rf)));
            let mut b = None;
            Router::new(&table, &mut pins, now)
                .with_admission(&mut adm)
                .route_train(&initial(&h), 0, |r, rf| b = Some((r, rf)));
            let (a, b) = (a.expect("run"), b.expect("run"));
            if a.1.is_none() && b.1.is_none() && b.0.decision.reason == Reason::Pinned {
                honest_ok += 1;
            }
        }
    }
    assert!(refused > 150_000, "refused {refused}");
    assert_eq!(pins.evicted(), 0);
    // An honest source refused only when it shares both lanes with abusers at the
    // cap (100 abusers in 4 096 words: ~0.4 %, proto::limits docs).
    assert!(honest_ok >= 990, "honest {honest_ok} of 1000");
    pins.drain(|p| adm.release(p));
    assert_eq!(adm.acquired, adm.released);
    assert!((0..sketch.words()).all(|w| sketch.word(w) == 0));
}
