//! Host-to-host forwarding frames (proto::peer) against slow, obviously right
//! models: the replay window against the set of every number accepted so far, and
//! sealing against opening, for any addresses and datagram.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proptest::prelude::*;
use proto::host::HostLayout;
use proto::peer::{open, seal, ForwardingKey, Frame, FrameError, ReplayWindow};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// The rule, written out: a number is accepted when it was never accepted before and
/// is not `SIZE` or more below the highest accepted one.
struct Model {
    accepted: BTreeSet<u64>,
}

impl Model {
    fn accept(&mut self, seq: u64) -> bool {
        let top = self.accepted.iter().next_back().copied();
        let fresh = !self.accepted.contains(&seq);
        let in_window = top.is_none_or(|t| seq > t || t - seq < ReplayWindow::SIZE);
        let ok = fresh && in_window;
        if ok {
            self.accepted.insert(seq);
        }
        ok
    }
}

/// Sequence numbers that exercise the window: mostly near a moving point (replays,
/// reordering, steps across word boundaries), sometimes far jumps.
fn seqs() -> impl Strategy<Value = Vec<u64>> {
    // Offsets below the moving point cluster around the window's edge (SIZE ± 8)
    // as well as spreading over it; one op in 50 jumps anywhere.
    prop::collection::vec((0u8..50, 0u64..3000, any::<u64>()), 1..400).prop_map(|ops| {
        let mut at = 1u64 << 40;
        ops.into_iter()
            .map(|(kind, d, far)| match kind {
                0..=14 => at.saturating_sub(d % 1100),
                15..=19 => at.saturating_sub(ReplayWindow::SIZE - 8 + d % 17),
                20..=44 => {
                    at += d % 200;
                    at
                }
                45..=48 => {
                    at += d;
                    at
                }
                _ => far,
            })
            .collect()
    })
}

fn addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![any::<[u8; 4]>().prop_map(IpAddr::from), any::<[u8; 16]>().prop_map(IpAddr::from)]
        .prop_flat_map(|ip| any::<u16>().prop_map(move |p| SocketAddr::new(ip, p)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn replay_window_matches_the_set_model(seqs in seqs()) {
        let mut w = ReplayWindow::default();
        let mut m = Model { accepted: BTreeSet::new() };
        for s in seqs {
            prop_assert_eq!(w.accept(s), m.accept(s), "seq {}", s);
        }
    }

    #[test]
    fn frames_round_trip_and_any_change_is_refused(
        host in any::<u16>(), seq in any::<u64>(), client in addr(), local in addr(),
        datagram in prop::collection::vec(any::<u8>(), 0..1500), flip in any::<prop::sample::Index>(),
        reset in any::<[u8; 32]>(),
    ) {
        let key = ForwardingKey::derive(&reset);
        let f = Frame { from_host: host, seq, client, local, datagram: &datagram };
        let mut out = Vec::new();
        seal(&key, &f, &mut out);
        prop_assert_eq!(open(&key, &out), Ok(f));
        let mut bad = out.clone();
        let i = flip.index(bad.len());
        bad[i] ^= 1;
        let r = open(&key, &bad);
        prop_assert!(matches!(r, Err(FrameError::Unauthenticated | FrameError::NotAFrame)), "{:?}", r);
    }

    #[test]
    fn every_id_has_exactly_one_host(bits in 0u8..=8, id in 1u16..) {
        let owners: Vec<u16> = (0..1u32 << bits)
            .map(|h| HostLayout::new(bits, h as u16).unwrap())
            .filter(|l| (l.first()..=l.last()).contains(&id))
            .map(|l| l.host())
            .collect();
        prop_assert_eq!(owners.len(), 1);
        prop_assert_eq!(HostLayout::new(bits, owners[0]).unwrap().host_of(proto::cid::ServerId(id)), owners[0]);
    }
}
