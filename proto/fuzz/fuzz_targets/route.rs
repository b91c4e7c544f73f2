//! Fuzz `proto::route::Router::route` and `route_train` against small fixed tables.
//!
//! Input: byte 0..2 = GRO stride (big-endian u16), byte 2 = clock step, byte 3 = the
//! key set's PRFs (bit 0: newest siphash-2-4, bit 1: previous siphash-2-4, ADR 0004;
//! otherwise hmac-sha256), rest = the datagram / train. Checks: never a panic; a target is always a valid index and is
//! present exactly for the reasons that need one; the runs of a train tile it in
//! order and count every segment once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::cid::{Generation, KeySet, Prf, ServerId};
use proto::pin::PinTable;
use proto::route::{Decision, InstanceInfo, Reason, Router, Table};
use std::sync::OnceLock;
use std::time::Duration;

/// One table per PRF pair (newest, previous), index = input byte 3 & 3.
fn table(prfs: u8) -> &'static Table {
    static T: [OnceLock<Table>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = usize::from(prfs & 3);
    T[i].get_or_init(|| {
        let prf = |bit: usize| if i & bit != 0 { Prf::SipHash24 } else { Prf::HmacSha256 };
        let keys = KeySet::with_prfs(
            (Generation::new(1).unwrap(), prf(1), [0x11; 32]),
            Some((Generation::new(0).unwrap(), prf(2), [0x22; 32])),
        )
        .unwrap();
        let instances = [
            InstanceInfo { server_id: ServerId(0), placeable: true },
            InstanceInfo { server_id: ServerId(7), placeable: false },
            InstanceInfo { server_id: ServerId(0x1234), placeable: true },
            InstanceInfo { server_id: ServerId(0xffff), placeable: true },
        ];
        Table::new(keys, [0x33; 16], &instances).unwrap()
    })
}

fn check(d: Decision, t: &Table) {
    match d.reason {
        Reason::Owner
        | Reason::Placed
        | Reason::Pinned
        | Reason::Orphan
        | Reason::Departed
        | Reason::VersionNegotiation => {
            let i = d.target.expect("a forwarding reason has a target");
            assert!(i < t.len());
        }
        Reason::NotQuic | Reason::NoInstance => assert_eq!(d.target, None),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let stride = usize::from(u16::from_be_bytes([data[0], data[1]]));
    let step = Duration::from_millis(u64::from(data[2]) * 100);
    let payload = &data[4..];
    let t = table(data[3]);
    let mut pins = PinTable::new(8, [0x44; 16]);
    let now = Duration::from_secs(100);

    let route = |pins: &mut PinTable, now| {
        let Ok(decision) = Router::new(t, pins, now).route(payload);
        decision
    };
    let first = route(&mut pins, now);
    check(first, t);
    // Routing is deterministic while the pin lives (ADR 0001): same answer again,
    // up to Placed becoming Pinned.
    let again = route(&mut pins, now + step.min(Duration::from_secs(9)));
    check(again, t);
    if first.reason == Reason::Placed {
        assert_eq!((again.reason, again.target), (Reason::Pinned, first.target));
    } else {
        assert_eq!(again, first);
    }

    let mut end = 0;
    let mut segments = 0;
    Router::new(t, &mut pins, now + step).route_train(payload, stride, |run, _| {
        assert_eq!(run.bytes.start, end, "runs are contiguous");
        assert!(run.bytes.end > run.bytes.start && run.segments >= 1);
        check(run.decision, t);
        end = run.bytes.end;
        segments += run.segments;
    });
    assert_eq!(end, payload.len(), "runs cover the train");
    let want = if payload.is_empty() {
        0
    } else if stride == 0 || stride >= payload.len() {
        1
    } else {
        payload.len().div_ceil(stride)
    };
    assert_eq!(segments, want);
});
