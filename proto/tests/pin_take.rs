//! `PinTable::take_payload` (a worker's `HandshakeDone`):
//! mixed with inserts, retargets, evictions, expiry and a final drain, every payload
//! still leaves exactly once; a take for another target, a second take, or a take of
//! an expired pin hands back nothing; the pin keeps routing after its payload left.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::rng::Rng;
use proto::cid::ServerId;
use proto::pin::{PinTable, NO_PAYLOAD};
use std::collections::HashMap;
use std::time::Duration;

#[test]
fn every_payload_leaves_once_with_takes() {
    let mut rng = Rng::new(0x7a4e);
    let ttl = Duration::from_millis(500);
    let mut pins = PinTable::with_ttl(64, [5; 16], ttl);
    let mut out: HashMap<u32, u32> = HashMap::new();
    let mut now = Duration::ZERO;
    let mut next = 0u32;
    let (mut takes, mut refused) = (0, 0);
    let keys: Vec<Vec<u8>> = (0..200).map(|i| vec![i as u8, (i >> 8) as u8, 7, 7, 7, 7, 7, 7]).collect();
    for _ in 0..50_000 {
        now += Duration::from_micros(rng.range(0, 400) as u64);
        let key = &keys[rng.below(keys.len())];
        let target = ServerId(rng.range(1, 3) as u16);
        if rng.chance(1, 2) {
            let p = next;
            next += 1;
            pins.insert_with(key, target, now, p, |r| *out.entry(r).or_default() += 1);
        } else {
            let before = pins.get(key, now);
            match pins.take_payload(key, target, now) {
                Some(p) => {
                    assert_eq!(before, Some(target), "only a live pin to that target gives its payload");
                    assert_ne!(p, NO_PAYLOAD);
                    *out.entry(p).or_default() += 1;
                    takes += 1;
                    // Still pinned, now without a payload: a second take gives nothing.
                    assert_eq!(pins.get(key, now), Some(target));
                    assert_eq!(pins.take_payload(key, target, now), None);
                }
                None => refused += 1,
            }
        }
    }
    pins.drain(|r| *out.entry(r).or_default() += 1);
    assert_eq!(out.len() as u32, next, "every payload came back");
    assert!(out.values().all(|&n| n == 1), "exactly once");
    assert!(takes > 2_000 && refused > 2_000, "takes {takes}, refused {refused}");
}

#[test]
fn take_of_an_expired_pin_leaves_it_to_the_sweep() {
    let mut pins = PinTable::with_ttl(4, [5; 16], Duration::from_secs(10));
    let mut out = vec![];
    pins.insert_with(b"abcdefgh", ServerId(1), Duration::ZERO, 42, |r| out.push(r));
    assert_eq!(pins.take_payload(b"abcdefgh", ServerId(2), Duration::from_secs(1)), None, "another instance");
    assert_eq!(pins.take_payload(b"abcdefgh", ServerId(1), Duration::from_secs(10)), None, "expired");
    pins.expire_with(Duration::from_secs(10), |r| out.push(r));
    assert_eq!(out, [42]);
    assert_eq!(pins.take_payload(&[0; 21], ServerId(1), Duration::ZERO), None);
}
