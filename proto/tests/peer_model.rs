//! Host-to-host forwarding (proto::peer) against slow, obviously right models:
//!
//! - the replay window against the set of every number accepted so far;
//! - sealing against opening, for any header, addresses and datagram;
//! - the whole protocol (ADR 0005 §4, "Replay"): three hosts exchanging heartbeats and
//!   data through a network that delays, drops and reorders, an attacker who records
//!   every frame and replays any of them to any host from its sender's address, host
//!   restarts and clock steps of up to an hour either way. Checked against the
//!   ground truth the simulation keeps: no datagram is delivered twice, or to a host
//!   it was not sealed for, or to a boot of its receiver other than the one it was
//!   sealed for; and once the network is quiet again every host delivers to every
//!   other within a few heartbeat rounds.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proptest::prelude::*;
use proto::host::HostLayout;
use proto::peer::{open, seal, Body, Frame, FrameError, FrameKey, FrameKeys, Header, Me, Outbound, ReplayWindow};
use proto::peer::{Session, Verdict};
use std::collections::{BTreeSet, HashMap, HashSet};
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

fn header() -> impl Strategy<Value = Header> {
    (any::<u16>(), any::<u16>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(from_host, to_host, from_epoch, to_epoch, seq, ack)| Header {
            from_host,
            to_host,
            from_epoch,
            to_epoch,
            seq,
            ack,
        },
    )
}

// ---- the protocol simulation ----

const HOSTS: usize = 3;
const DEAD_MS: u64 = 1000;
const HOUR_MS: u64 = 3_600_000;

/// One host's data plane: everything is lost on restart but the host id.
struct Host {
    id: u16,
    boot: u32,
    epoch: u64,
    now_ms: u64,
    sessions: Vec<Session>,
    outbound: Vec<Outbound>,
}

impl Host {
    fn me(&self) -> Me {
        Me { host: self.id, epoch: self.epoch }
    }
}

/// What the simulation knows about a frame it carried (ground truth).
#[derive(Clone)]
struct Sent {
    bytes: Vec<u8>,
    from: usize,
    to: usize,
}

#[derive(Clone, Debug)]
enum Op {
    /// The host's periodic heartbeats.
    Beat(usize),
    /// Forward a datagram from one host to another.
    Data(usize, usize),
    /// Deliver / drop the in-flight frame at this index (modulo).
    Deliver(usize),
    Drop(usize),
    /// The attacker replays a recorded frame to a host, from its sender's address.
    Replay(usize, usize),
    Restart(usize),
    /// Milliseconds on a host's clock; negative: stepped back.
    Clock(usize, i64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let h = 0..HOSTS;
    let op = prop_oneof![
        3 => h.clone().prop_map(Op::Beat),
        4 => (h.clone(), h.clone()).prop_map(|(a, b)| Op::Data(a, b)),
        8 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Drop),
        3 => (any::<usize>(), h.clone()).prop_map(|(i, t)| Op::Replay(i, t)),
        1 => h.clone().prop_map(Op::Restart),
        2 => (h.clone(), prop_oneof![0i64..300, -(HOUR_MS as i64)..=HOUR_MS as i64]).prop_map(|(h, d)| Op::Clock(h, d)),
    ];
    prop::collection::vec(op, 1..300)
}

struct Sim {
    keys: FrameKeys,
    hosts: Vec<Host>,
    /// Every epoch ever drawn → (host index, boot).
    epochs: HashMap<u64, (usize, u32)>,
    next_epoch: u64,
    flight: Vec<Sent>,
    recorded: Vec<Sent>,
    next_datagram: u64,
    /// Datagram ids delivered, and frames (by bytes) accepted.
    delivered: HashSet<u64>,
    accepted: HashSet<Vec<u8>>,
    client: SocketAddr,
    local: SocketAddr,
}

impl Sim {
    fn new(secret: [u8; 32]) -> Sim {
        let mut s = Sim {
            keys: FrameKeys::new(&secret, None),
            hosts: Vec::new(),
            epochs: HashMap::new(),
            next_epoch: 0x5eed,
            flight: Vec::new(),
            recorded: Vec::new(),
            next_datagram: 0,
            delivered: HashSet::new(),
            accepted: HashSet::new(),
            client: "198.18.1.2:5000".parse().unwrap(),
            local: "198.19.9.9:443".parse().unwrap(),
        };
        for i in 0..HOSTS {
            let epoch = s.draw_epoch(i, 0);
            s.hosts.push(Host {
                id: i as u16 + 1,
                boot: 0,
                epoch,
                now_ms: 50 * HOUR_MS,
                sessions: (0..HOSTS).map(|_| Session::default()).collect(),
                outbound: (0..HOSTS).map(|_| Outbound::default()).collect(),
            });
        }
        s
    }

    /// A fresh epoch (distinct, as 64 random bits are with overwhelming probability).
    fn draw_epoch(&mut self, host: usize, boot: u32) -> u64 {
        self.next_epoch = self.next_epoch.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
        self.epochs.insert(self.next_epoch, (host, boot));
        self.next_epoch
    }

    fn send(&mut self, from: usize, to: usize, to_epoch: u64, seq: u64, body: Body<'_>) {
        let h = &self.hosts[from];
        let header = Header {
            from_host: h.id,
            to_host: to as u16 + 1,
            from_epoch: h.epoch,
            to_epoch,
            seq,
            ack: h.sessions[to].ack(),
        };
        let mut bytes = Vec::new();
        seal(&self.keys.current, &Frame { header, body }, &mut bytes);
        let s = Sent { bytes, from, to };
        self.flight.push(s.clone());
        self.recorded.push(s);
    }

    fn heartbeat(&mut self, from: usize, to: usize, to_epoch: u64) {
        let seq = self.hosts[from].outbound[to].seq();
        self.send(from, to, to_epoch, seq, Body::Heartbeat);
    }

    fn beat(&mut self, h: usize) {
        for to in (0..HOSTS).filter(|&t| t != h) {
            let e = self.hosts[h].sessions[to].peer_epoch();
            self.heartbeat(h, to, e);
        }
    }

    /// Forwards one datagram; false when the peer's epoch is not known yet.
    fn data(&mut self, from: usize, to: usize) -> bool {
        if from == to {
            return false;
        }
        let Some((epoch, seq)) = self.hosts[from].outbound[to].data() else { return false };
        let id = self.next_datagram;
        self.next_datagram += 1;
        let (client, local) = (self.client, self.local);
        self.send(from, to, epoch, seq, Body::Data { client, local, datagram: &id.to_be_bytes() });
        true
    }

    /// Host `at` receives `bytes` from host `src`'s address. Returns the datagram id
    /// delivered, if any.
    fn receive(&mut self, at: usize, src: usize, bytes: &[u8]) -> Result<Option<u64>, TestCaseError> {
        let f = match open(&self.keys, bytes) {
            Ok(f) => f,
            Err(e) => return Err(TestCaseError::fail(format!("an authentic frame did not open: {e:?}"))),
        };
        // The address check: the frame claims the host whose address it came from.
        if f.header.from_host != src as u16 + 1 || src == at {
            return Ok(None);
        }
        let peer = src;
        let h = &mut self.hosts[at];
        let (me, now) = (h.me(), h.now_ms);
        let v = h.sessions[peer].receive(me, &f.header, now);
        match v {
            Verdict::WrongReceiver | Verdict::Replayed => Ok(None),
            Verdict::Stale { ack, nudge } => {
                h.outbound[peer].raise(ack);
                if let Some(e) = nudge {
                    self.heartbeat(at, peer, e);
                }
                Ok(None)
            }
            Verdict::Fresh { learned } => {
                if let Some(l) = learned {
                    h.outbound[peer].learn(l);
                }
                // Ground truth: sealed for this host, and for its current boot.
                let (owner, boot) = self.epochs.get(&f.header.to_epoch).copied().unwrap_or((usize::MAX, 0));
                prop_assert_eq!((owner, boot), (at, self.hosts[at].boot), "accepted a frame sealed for another boot");
                prop_assert!(self.accepted.insert(bytes.to_vec()), "a frame accepted twice");
                match f.body {
                    Body::Data { datagram, .. } => {
                        let id = u64::from_be_bytes(datagram.try_into().unwrap());
                        prop_assert!(self.delivered.insert(id), "datagram {} delivered twice", id);
                        Ok(Some(id))
                    }
                    Body::Heartbeat => Ok(None),
                }
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Beat(h) => self.beat(h),
            Op::Data(a, b) => {
                self.data(a, b);
            }
            Op::Deliver(i) if !self.flight.is_empty() => {
                let s = self.flight.remove(i % self.flight.len());
                self.receive(s.to, s.from, &s.bytes)?;
            }
            Op::Drop(i) if !self.flight.is_empty() => {
                self.flight.remove(i % self.flight.len());
            }
            Op::Replay(i, to) if !self.recorded.is_empty() => {
                let s = self.recorded[i % self.recorded.len()].clone();
                self.receive(to, s.from, &s.bytes)?;
            }
            Op::Restart(h) => {
                let boot = self.hosts[h].boot + 1;
                let epoch = self.draw_epoch(h, boot);
                let host = &mut self.hosts[h];
                host.boot = boot;
                host.epoch = epoch;
                host.sessions = (0..HOSTS).map(|_| Session::default()).collect();
                host.outbound = (0..HOSTS).map(|_| Outbound::default()).collect();
            }
            Op::Clock(h, d) => {
                let host = &mut self.hosts[h];
                host.now_ms = host.now_ms.saturating_add_signed(d);
                let now = host.now_ms;
                host.sessions.iter_mut().for_each(|s| s.tick(now));
            }
            _ => {}
        }
        Ok(())
    }

    /// A quiet network: everything in flight is delivered in order, every host
    /// beats, the clocks move on by a heartbeat interval.
    fn quiet_round(&mut self) -> Result<(), TestCaseError> {
        for h in 0..HOSTS {
            self.beat(h);
            self.hosts[h].now_ms += 250;
        }
        while !self.flight.is_empty() {
            let s = self.flight.remove(0);
            self.receive(s.to, s.from, &s.bytes)?;
        }
        Ok(())
    }
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
        header in header(), heartbeat in any::<bool>(), client in addr(), local in addr(),
        datagram in prop::collection::vec(any::<u8>(), 0..1500), flip in any::<prop::sample::Index>(),
        secret in any::<[u8; 32]>(), other in any::<[u8; 32]>(),
    ) {
        let keys = FrameKeys::new(&secret, None);
        let body = if heartbeat { Body::Heartbeat } else { Body::Data { client, local, datagram: &datagram } };
        let f = Frame { header, body };
        let mut out = Vec::new();
        seal(&keys.current, &f, &mut out);
        prop_assert_eq!(open(&keys, &out), Ok(f));
        // Accepted as the other secret during a rotation, refused without it.
        prop_assert_eq!(open(&FrameKeys::new(&other, Some(&secret)), &out), Ok(f));
        if other != secret {
            prop_assert_eq!(open(&FrameKeys::new(&other, None), &out), Err(FrameError::Unauthenticated));
        }
        let mut bad = out.clone();
        let i = flip.index(bad.len());
        bad[i] ^= 1;
        let r = open(&keys, &bad);
        prop_assert!(matches!(r, Err(FrameError::Unauthenticated | FrameError::NotAFrame)), "{:?}", r);
        // The sealing key as the only key on the other side.
        let mut again = Vec::new();
        seal(&FrameKey::new(&secret), &f, &mut again);
        prop_assert_eq!(again, out);
    }

    /// The protocol model (module docs).
    #[test]
    fn no_replay_no_misdelivery_and_recovery(ops in ops(), secret in any::<[u8; 32]>()) {
        let mut sim = Sim::new(secret);
        for op in &ops {
            sim.apply(op)?;
        }
        // Quiet again: within three heartbeat rounds every host knows every other.
        for _ in 0..3 {
            sim.quiet_round()?;
        }
        for a in 0..HOSTS {
            for b in (0..HOSTS).filter(|&b| b != a) {
                prop_assert!(sim.data(a, b), "host {} never learned host {}'s epoch", a + 1, b + 1);
                let s = sim.flight.pop().unwrap();
                let got = sim.receive(s.to, s.from, &s.bytes)?;
                prop_assert!(got.is_some(), "a datagram from host {} to host {} after recovery was refused", a + 1, b + 1);
                let now = sim.hosts[b].now_ms;
                prop_assert!(sim.hosts[b].sessions[a].alive(now, DEAD_MS));
            }
        }
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

/// Scenarios from ADR 0005 §4 spelled out: replay to a third host, replay after the
/// receiver restarts, a sender restarted with its clock an hour back.
#[test]
fn the_adr_scenarios() {
    let mut sim = Sim::new([9; 32]);
    for _ in 0..2 {
        sim.quiet_round().unwrap();
    }
    // A → B, captured.
    assert!(sim.data(0, 1));
    let ab = sim.flight.pop().unwrap();
    assert!(sim.receive(1, 0, &ab.bytes).unwrap().is_some());
    // Replayed to B: refused; to C from A's address: refused (wrong receiver).
    assert_eq!(sim.receive(1, 0, &ab.bytes).unwrap(), None);
    let f = open(&sim.keys, &ab.bytes).unwrap();
    let (me_c, now_c) = (sim.hosts[2].me(), sim.hosts[2].now_ms);
    assert_eq!(sim.hosts[2].sessions[0].clone().receive(me_c, &f.header, now_c), Verdict::WrongReceiver);
    // B restarts: the captured frame is stale there, and A's next datagram goes
    // through once B's hello and A's answer have crossed.
    sim.apply(&Op::Restart(1)).unwrap();
    let (me_b, now_b) = (sim.hosts[1].me(), sim.hosts[1].now_ms);
    assert!(matches!(sim.hosts[1].sessions[0].clone().receive(me_b, &f.header, now_b), Verdict::Stale { .. }));
    assert_eq!(sim.receive(1, 0, &ab.bytes).unwrap(), None);
    sim.quiet_round().unwrap();
    assert!(sim.data(0, 1));
    let s = sim.flight.pop().unwrap();
    assert!(sim.receive(1, 0, &s.bytes).unwrap().is_some());
    // A restarts with its clock an hour back: nothing in the protocol reads it; A's
    // first datagram after one round is accepted, numbered above its old ones.
    sim.apply(&Op::Restart(0)).unwrap();
    sim.apply(&Op::Clock(0, -(HOUR_MS as i64))).unwrap();
    assert!(!sim.data(0, 1), "no data before A learns B's epoch");
    sim.quiet_round().unwrap();
    assert!(sim.data(0, 1));
    let s = sim.flight.pop().unwrap();
    assert!(open(&sim.keys, &s.bytes).unwrap().header.seq > f.header.seq);
    assert!(sim.receive(1, 0, &s.bytes).unwrap().is_some());
}
