//! `proto::route::Router` (`route`, `route_train`) against a slow, obviously-right model
//! written from ADR 0001 "Routing rules", docs/adr/0002-routing.md and the table in
//! route.rs's module docs — not from route.rs's code:
//!
//! | datagram                                                  | reason               |
//! |-----------------------------------------------------------|----------------------|
//! | v1/v2 long or short header whose DCID decodes to a live id | Owner               |
//! | client Initial (≥ 1200 B) / 0-RTT, pinned to a live id     | Pinned              |
//! | the same, not pinned                                       | Placed (+ pin 10 s) |
//! | short / Handshake: decodes to an id that is not live       | Departed            |
//! | short / Handshake: cr = 3, unknown gen, wrong len          | Orphan              |
//! | unsupported version, datagram ≥ 1200 bytes                | VersionNegotiation  |
//! | unparsable, Initial < 1200 B, VN or Retry sent to a server | NotQuic             |
//! | a target is needed but there is none                       | NoInstance          |
//!
//! The model uses its own header parser (tests/common/refparse.rs), its own CID
//! decoder (HMAC-SHA-256 straight from aws-lc-rs, ADR 0001 "PRF"), a naive pin list
//! (Vec of (key, target, time), large enough never to evict) and a naive argmax over
//! `Rendezvous::weight` (whose `pick` is checked against a naive argmax in
//! tests/rendezvous.rs).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::refparse::ref_parse;
use common::refprf::ref_server_id;
use common::rng::Rng;
use common::{hex, vectors};
use proto::cid::{Generation, KeySet, Prf, ServerId, CID_LEN, KEY_LEN};
use proto::decode_cache::DecodeCache;
use proto::header::{Header, LongType};
use proto::pin::{PinTable, PIN_TTL};
use proto::rendezvous::Rendezvous;
use proto::route::{Decision, InstanceInfo, Reason, Router, Table, TrainRun};
use std::time::Duration;

/// One datagram through the plain router (no admission, no decode cache).
fn route(d: &[u8], table: &Table, pins: &mut PinTable, now: Duration) -> Decision {
    let Ok(decision) = Router::new(table, pins, now).route(d);
    decision
}

/// One GRO train through the plain router.
fn route_train(
    train: &[u8],
    stride: usize,
    table: &Table,
    pins: &mut PinTable,
    now: Duration,
    mut out: impl FnMut(TrainRun),
) {
    Router::new(table, pins, now).route_train(train, stride, |run, _| out(run))
}

const V1: u32 = 1;
const V2: u32 = 0x6b33_43cf;
/// RFC 9000 §14.1 / §5.2.2.
const MIN_INITIAL: usize = 1200;

fn to(reason: Reason, target: usize) -> Decision {
    Decision { reason, target: Some(target) }
}
fn dropped(reason: Reason) -> Decision {
    Decision { reason, target: None }
}

// ---------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------

struct Model {
    /// PRFs and raw secrets of the live generations (ADR 0001: at most two; ADR 0004).
    live_keys: [Option<(Prf, [u8; KEY_LEN])>; 3],
    instances: Vec<InstanceInfo>,
    rendezvous: Rendezvous,
    /// Every pin ever made, with the time it was made.
    pins: Vec<(Vec<u8>, ServerId, Duration)>,
}

impl Model {
    /// ADR 0001: 12 bytes, cr = byte 0 >> 6 names a live generation, server id =
    /// bytes 9..=10 XOR PRF[cr](key[cr], bytes 0..=8)[0..2] (ADR 0004: the PRF of
    /// that generation, HMAC-SHA-256 or SipHash-2-4).
    fn decode(&self, dcid: &[u8]) -> Option<ServerId> {
        if dcid.len() != 12 {
            return None;
        }
        let cr = usize::from(dcid[0] >> 6);
        let (prf, secret) = self.live_keys.get(cr)?.as_ref()?;
        Some(ServerId(ref_server_id(*prf, secret, dcid)))
    }

    fn index_of(&self, id: ServerId) -> Option<usize> {
        self.instances.iter().position(|i| i.server_id == id)
    }

    fn owner(&self, dcid: &[u8]) -> Option<usize> {
        self.decode(dcid).and_then(|id| self.index_of(id))
    }

    /// The reason of a datagram without a live owner: its DCID names a server id (not
    /// live), or none.
    fn ownerless(&self, dcid: &[u8]) -> Reason {
        if self.decode(dcid).is_some() {
            Reason::Departed
        } else {
            Reason::Orphan
        }
    }

    /// Highest weight among the candidates; the first one listed wins a tie.
    fn argmax(&self, dcid: &[u8], only_placeable: bool) -> Option<usize> {
        let h = self.rendezvous.key_hash(dcid);
        let mut best: Option<(u64, usize)> = None;
        for (i, inst) in self.instances.iter().enumerate() {
            if only_placeable && !inst.placeable {
                continue;
            }
            let w = Rendezvous::weight(self.rendezvous.seed(inst.server_id), h);
            if !matches!(best, Some((bw, _)) if w <= bw) {
                best = Some((w, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// "Any serving instance": among placeable ones if there are any, else among all.
    fn any_serving(&self, dcid: &[u8]) -> Option<usize> {
        let any_placeable = self.instances.iter().any(|i| i.placeable);
        self.argmax(dcid, any_placeable)
    }

    fn serve(&self, reason: Reason, dcid: &[u8]) -> Decision {
        match self.any_serving(dcid) {
            Some(i) => to(reason, i),
            None => dropped(Reason::NoInstance),
        }
    }

    fn place(&mut self, dcid: &[u8], now: Duration) -> Decision {
        let alive = |at: Duration| now.saturating_sub(at) < PIN_TTL;
        if let Some(p) = self.pins.iter().find(|p| p.0 == dcid && alive(p.2)) {
            if let Some(i) = self.index_of(p.1) {
                return to(Reason::Pinned, i);
            }
        }
        let Some(i) = self.argmax(dcid, true) else {
            return dropped(Reason::NoInstance);
        };
        let id = self.instances[i].server_id;
        // Pin: expired pins are gone; a live pin of this key is retargeted and keeps
        // its time (its expiry), otherwise a new pin starts now.
        self.pins.retain(|p| alive(p.2));
        match self.pins.iter_mut().find(|p| p.0 == dcid) {
            Some(p) => p.1 = id,
            None => self.pins.push((dcid.to_vec(), id, now)),
        }
        to(Reason::Placed, i)
    }

    fn route(&mut self, d: &[u8], now: Duration) -> Decision {
        let h = match ref_parse(d, CID_LEN) {
            Ok(h) => h,
            Err(_) => return dropped(Reason::NotQuic),
        };
        match h {
            Header::VersionNegotiation { .. } => dropped(Reason::NotQuic),
            Header::UnsupportedVersion { dcid, .. } => {
                if d.len() < MIN_INITIAL {
                    dropped(Reason::NotQuic)
                } else {
                    self.serve(Reason::VersionNegotiation, dcid)
                }
            }
            Header::Short { dcid } => match self.owner(dcid) {
                Some(i) => to(Reason::Owner, i),
                None => self.serve(self.ownerless(dcid), dcid),
            },
            Header::Long(l) => {
                if let Some(i) = self.owner(l.dcid) {
                    return to(Reason::Owner, i);
                }
                match l.ty {
                    LongType::Initial if d.len() < MIN_INITIAL => dropped(Reason::NotQuic),
                    LongType::Initial | LongType::ZeroRtt => self.place(l.dcid, now),
                    LongType::Handshake => self.serve(self.ownerless(l.dcid), l.dcid),
                    LongType::Retry => dropped(Reason::NotQuic),
                }
            }
        }
    }

    /// ADR-0002: a train whose segments all parse with the first one's DCID is routed
    /// once (as its first segment) and travels whole; otherwise segment by segment,
    /// consecutive equal decisions merged.
    fn route_train(&mut self, train: &[u8], stride: usize, now: Duration) -> Vec<TrainRun> {
        if train.is_empty() {
            return vec![];
        }
        if stride == 0 || stride >= train.len() {
            let decision = self.route(train, now);
            return vec![TrainRun { bytes: 0..train.len(), segments: 1, decision }];
        }
        let segs: Vec<&[u8]> = train.chunks(stride).collect();
        let first = ref_parse(segs[0], CID_LEN);
        let uniform = match &first {
            Ok(h0) => segs[1..].iter().all(|s| matches!(ref_parse(s, CID_LEN), Ok(h) if h.dcid() == h0.dcid())),
            Err(_) => false,
        };
        if uniform {
            let decision = self.route(segs[0], now);
            let segments = train.len().div_ceil(stride);
            return vec![TrainRun { bytes: 0..train.len(), segments, decision }];
        }
        let mut runs: Vec<TrainRun> = Vec::new();
        for (k, s) in segs.iter().enumerate() {
            let decision = self.route(s, now);
            let start = k * stride;
            match runs.last_mut() {
                Some(r) if r.decision == decision => {
                    r.bytes.end = start + s.len();
                    r.segments += 1;
                }
                _ => runs.push(TrainRun { bytes: start..start + s.len(), segments: 1, decision }),
            }
        }
        runs
    }
}

// ---------------------------------------------------------------------------------
// The world: the real table and pins, the model, and a datagram generator.
// ---------------------------------------------------------------------------------

struct World {
    rng: Rng,
    keys: KeySet,
    /// Every key set that ever existed (to mint CIDs of rotated-away generations).
    old_keys: Vec<KeySet>,
    rendezvous_key: [u8; 16],
    table: Table,
    pins: PinTable,
    model: Model,
    next_id: u16,
    dead_ids: Vec<u16>,
    client_dcids: Vec<Vec<u8>>,
    now: Duration,
    counts: [u64; Reason::COUNT],
    changes: [u64; 6],
    /// Rotations by the new generation's PRF code, and those that switched PRF.
    prf_mix: [u64; 3],
    /// The cached router (route_*_cached with a small DecodeCache) and its own pins:
    /// it must decide every datagram exactly as the uncached one.
    cache: DecodeCache,
    cached_pins: PinTable,
    /// Recent server DCIDs, sent again (an established connection's packets), also
    /// across key rotations.
    seen: Vec<Vec<u8>>,
}

fn long_first_byte(version: u32, ty: LongType, low: u8) -> u8 {
    // RFC 9000 §17.2 Table 5 (v1), RFC 9369 §3.2 (v2).
    let bits = match (version == V2, ty) {
        (false, LongType::Initial) => 0,
        (false, LongType::ZeroRtt) => 1,
        (false, LongType::Handshake) => 2,
        (false, LongType::Retry) => 3,
        (true, LongType::Retry) => 0,
        (true, LongType::Initial) => 1,
        (true, LongType::ZeroRtt) => 2,
        (true, LongType::Handshake) => 3,
    };
    0xc0 | (bits << 4) | (low & 0x0f)
}

impl World {
    fn new(seed: u64, instances: usize) -> World {
        let mut rng = Rng::new(seed);
        // ADR 0004: the first generation's PRF drawn too; every rotation draws again.
        let prf = *rng.pick(&Prf::ALL);
        let keys = KeySet::with_prfs((Generation::new(0).unwrap(), prf, rng.array()), None).unwrap();
        let rendezvous_key = rng.array();
        let infos: Vec<InstanceInfo> =
            (0..instances).map(|i| InstanceInfo { server_id: ServerId(100 + i as u16), placeable: true }).collect();
        let model = Model {
            live_keys: [keys.secret(Generation::new(0).unwrap()).map(|s| (prf, *s)), None, None],
            instances: infos.clone(),
            rendezvous: Rendezvous::new(rendezvous_key),
            pins: Vec::new(),
        };
        World {
            table: Table::new(keys.clone(), rendezvous_key, &infos).unwrap(),
            // Large enough that nothing is evicted within one TTL of this test's traffic.
            pins: PinTable::new(1 << 17, rng.array()),
            old_keys: vec![keys.clone()],
            keys,
            rendezvous_key,
            model,
            next_id: 100 + instances as u16,
            dead_ids: vec![1, 2, 99],
            client_dcids: Vec::new(),
            now: Duration::from_secs(1_000),
            counts: [0; Reason::COUNT],
            changes: [0; 6],
            prf_mix: [0; 3],
            // Small: slots collide and are overwritten often.
            cache: DecodeCache::new(64),
            cached_pins: PinTable::new(1 << 17, rng.array()),
            seen: Vec::new(),
            rng,
        }
    }

    fn rebuild(&mut self) {
        self.table = Table::new(self.keys.clone(), self.rendezvous_key, &self.model.instances).unwrap();
        for g in 0..3u8 {
            let g = Generation::new(g).unwrap();
            self.model.live_keys[g.get() as usize] = self.keys.prf(g).zip(self.keys.secret(g).copied());
        }
    }

    /// One random change of the instance set, keys or clock.
    fn change(&mut self) {
        let n = self.model.instances.len();
        let kind = self.rng.below(6);
        self.changes[kind] += 1;
        match kind {
            0 if n < 16 => {
                // A new instance start: a fresh, never-reused server id (ADR 0001).
                self.next_id += 1 + self.rng.below(3) as u16;
                let info = InstanceInfo { server_id: ServerId(self.next_id), placeable: self.rng.chance(4, 5) };
                let at = self.rng.below(n + 1);
                self.model.instances.insert(at, info);
            }
            1 if n > 0 => {
                let i = self.rng.below(n);
                let gone = self.model.instances.remove(i);
                self.dead_ids.push(gone.server_id.0);
            }
            2 if n > 0 => {
                let i = self.rng.below(n);
                self.model.instances[i].placeable ^= true;
            }
            3 => {
                // Rotation: a fresh newest generation with either PRF (ADR 0004), the
                // current one stays decodable.
                let prf = *self.rng.pick(&Prf::ALL);
                self.prf_mix[prf.code() as usize] += 1;
                self.prf_mix[2] += u64::from(self.keys.prf(self.keys.newest()) != Some(prf));
                self.keys = self.keys.rotated_with(self.rng.array(), prf);
                self.old_keys.push(self.keys.clone());
            }
            4 => {
                // The order of the snapshot changes (indices change, ids do not).
                let i = self.rng.below(n.max(1));
                let j = self.rng.below(n.max(1));
                if n > 0 {
                    self.model.instances.swap(i, j);
                }
            }
            _ => {
                // The clock jumps, often past the 10 s pin TTL.
                let ms = *self.rng.pick(&[1_000u64, 5_000, 9_999, 10_000, 10_001, 12_000]);
                self.now += Duration::from_millis(ms);
            }
        }
        self.rebuild();
    }

    /// A 12-byte CID as the instances mint them, or not quite.
    fn server_dcid(&mut self) -> Vec<u8> {
        if !self.seen.is_empty() && self.rng.chance(1, 3) {
            return self.rng.pick(&self.seen).clone();
        }
        let cid = self.fresh_server_dcid();
        if self.seen.len() < 48 {
            self.seen.push(cid.clone());
        } else {
            let i = self.rng.below(self.seen.len());
            self.seen[i] = cid.clone();
        }
        cid
    }

    fn fresh_server_dcid(&mut self) -> Vec<u8> {
        let rand = self.rng.array::<10>();
        let live: Vec<Generation> = self.keys.live_generations().collect();
        match self.rng.below(12) {
            0..=5 if !self.model.instances.is_empty() => {
                let id = self.rng.pick(&self.model.instances).server_id;
                let g = *self.rng.pick(&live);
                self.keys.encode_with(g, id, &rand).unwrap().to_vec()
            }
            6 => {
                let id = ServerId(*self.rng.pick(&self.dead_ids));
                self.keys.encode(id, &rand).to_vec()
            }
            7 | 8 => {
                // Minted under some key set of the past (possibly rotated away, possibly
                // a generation number that is live again under a new key).
                let ks = self.rng.pick(&self.old_keys).clone();
                let id = if self.model.instances.is_empty() || self.rng.chance(1, 2) {
                    ServerId(self.rng.u8().into())
                } else {
                    self.rng.pick(&self.model.instances).server_id
                };
                ks.encode(id, &rand).to_vec()
            }
            9 => {
                let mut c = self.rng.bytes(CID_LEN);
                c[0] |= 0xc0; // cr = 3
                c
            }
            10 => self.rng.bytes(CID_LEN),
            _ => {
                let n = *self.rng.pick(&[0usize, 1, 8, 11, 13, 20]);
                self.rng.bytes(n)
            }
        }
    }

    /// A client-chosen DCID (RFC 9000 §7.2): often one seen before, so pins matter.
    fn client_dcid(&mut self) -> Vec<u8> {
        if !self.client_dcids.is_empty() && self.rng.chance(2, 5) {
            return self.rng.pick(&self.client_dcids).clone();
        }
        let d = match self.rng.below(10) {
            0..=5 => {
                let n = self.rng.range(8, 20);
                self.rng.bytes(n)
            }
            6 => {
                let n = self.rng.range(0, 7);
                self.rng.bytes(n)
            }
            7 => self.rng.bytes(CID_LEN),
            // The client's second Initial after a Retry uses our CID (ADR 0001 "Retry").
            _ => self.server_dcid(),
        };
        if self.client_dcids.len() < 64 {
            self.client_dcids.push(d.clone());
        } else {
            let i = self.rng.below(64);
            self.client_dcids[i] = d.clone();
        }
        d
    }

    /// A v1/v2 long header of type `ty`, `total` bytes long (when the header fits).
    fn long_packet(&mut self, ty: LongType, dcid: &[u8], total: usize) -> Vec<u8> {
        let version = if self.rng.chance(1, 2) { V1 } else { V2 };
        let mut d = vec![long_first_byte(version, ty, self.rng.u8())];
        d.extend_from_slice(&version.to_be_bytes());
        d.push(dcid.len() as u8);
        d.extend_from_slice(dcid);
        let scid_len = self.rng.range(0, 20);
        d.push(scid_len as u8);
        d.extend(self.rng.bytes(scid_len));
        match ty {
            LongType::Retry => {
                let tok = self.rng.range(0, 40);
                d.extend(self.rng.bytes(tok + 16));
                return d;
            }
            LongType::Initial => {
                let tok = if self.rng.chance(3, 4) { 0 } else { self.rng.range(1, 60) };
                d.push(tok as u8); // < 64: one-byte varint
                d.extend(self.rng.bytes(tok));
            }
            _ => {}
        }
        // Length (2-byte varint) covers the rest, minus coalesced bytes sometimes.
        let rest = total.saturating_sub(d.len() + 2);
        let coalesced = if self.rng.chance(1, 8) { self.rng.range(0, rest.min(60)) } else { 0 };
        let length = (rest - coalesced) as u16 | 0x4000;
        d.extend_from_slice(&length.to_be_bytes());
        d.extend(self.rng.bytes(rest));
        d
    }

    fn initial_size(&mut self) -> usize {
        match self.rng.below(10) {
            0..=5 => MIN_INITIAL + self.rng.range(0, 200),
            6 => MIN_INITIAL,
            7 => MIN_INITIAL - 1,
            _ => self.rng.range(60, MIN_INITIAL - 1),
        }
    }

    fn datagram(&mut self) -> Vec<u8> {
        match self.rng.below(100) {
            0..=29 => {
                let first = if self.rng.chance(1, 20) { self.rng.u8() & 0x3f } else { 0x40 | (self.rng.u8() & 0x3f) };
                let mut d = vec![first];
                d.extend(self.server_dcid());
                let n = if self.rng.chance(1, 10) { self.rng.range(0, 25) } else { self.rng.range(20, 1400) };
                d.extend(self.rng.bytes(n));
                d
            }
            30..=49 => {
                let dcid = self.client_dcid();
                let size = self.initial_size();
                self.long_packet(LongType::Initial, &dcid, size)
            }
            50..=57 => {
                let dcid = self.client_dcid();
                let size = self.rng.range(40, 1400);
                self.long_packet(LongType::ZeroRtt, &dcid, size)
            }
            58..=67 => {
                let dcid = self.server_dcid();
                let size = self.rng.range(40, 1400);
                self.long_packet(LongType::Handshake, &dcid, size)
            }
            68..=71 => {
                let dcid = self.server_dcid();
                self.long_packet(LongType::Retry, &dcid, 0)
            }
            72..=75 => {
                // RFC 9000 §17.2.1 Version Negotiation.
                let mut d = vec![0x80 | self.rng.u8(), 0, 0, 0, 0];
                let dcid = self.server_dcid();
                d.push(dcid.len() as u8);
                d.extend(dcid);
                d.push(8);
                d.extend(self.rng.bytes(8));
                d.extend_from_slice(&[0, 0, 0, 1, 0x6b, 0x33, 0x43, 0xcf]);
                if self.rng.chance(1, 3) {
                    d.resize(1300, 0);
                }
                d
            }
            76..=81 => {
                // RFC 8999 long header of an unknown version (e.g. a draft, or greased).
                let version = loop {
                    let v = self.rng.next_u64() as u32;
                    if v != 0 && v != V1 && v != V2 {
                        break if self.rng.chance(1, 2) { 0xff00_001d } else { v | 0x0a0a_0a0a };
                    }
                };
                let mut d = vec![0x80 | self.rng.u8()];
                d.extend_from_slice(&version.to_be_bytes());
                let dcid = if self.rng.chance(1, 2) { self.client_dcid() } else { self.server_dcid() };
                d.push(dcid.len() as u8);
                d.extend(dcid);
                d.push(0);
                let size = if self.rng.chance(1, 2) { self.initial_size() } else { self.rng.range(20, 300) };
                d.resize(size.max(d.len()), 0xee);
                d
            }
            82..=89 => {
                let n = self.rng.range(0, 1500);
                self.rng.bytes(n)
            }
            _ => {
                let mut d = self.datagram();
                let cut = self.rng.below(d.len() + 1);
                d.truncate(cut);
                d
            }
        }
    }

    fn check_one(&mut self, d: &[u8]) {
        let got = route(d, &self.table, &mut self.pins, self.now);
        let want = self.model.route(d, self.now);
        assert_eq!(got, want, "datagram {:02x?}… ({} bytes) at {:?}", &d[..d.len().min(48)], d.len(), self.now);
        let Ok(cached) =
            Router::new(&self.table, &mut self.cached_pins, self.now).with_decoder(&mut self.cache).route(d);
        assert_eq!(cached, got, "cached router, datagram {:02x?}…", &d[..d.len().min(48)]);
        self.counts[got.reason.index()] += 1;
    }

    /// A GRO train: `k` segments of `stride` bytes, the last possibly shorter; all
    /// with one DCID (uniform) or assorted.
    fn train(&mut self) -> (Vec<u8>, usize) {
        let uniform = self.rng.chance(1, 2);
        let k = self.rng.range(2, 6);
        if uniform && self.rng.chance(1, 2) {
            // Initials of one client DCID (each ≥ 1200 except maybe the last).
            let dcid = self.client_dcid();
            let stride = self.rng.range(MIN_INITIAL, 1400);
            let mut t = Vec::new();
            for _ in 0..k {
                t.extend(self.long_packet(LongType::Initial, &dcid, stride));
            }
            let last = self.rng.range(1, stride);
            t.truncate((k - 1) * stride + last);
            return (t, stride);
        }
        let stride = self.rng.range(33, 1400);
        let dcid = self.server_dcid();
        let mut t = Vec::new();
        for i in 0..k {
            let mut seg = if uniform || (i > 0 && self.rng.chance(1, 3)) {
                let mut s = vec![0x40 | (self.rng.u8() & 0x3f)];
                s.extend_from_slice(&dcid);
                s
            } else {
                self.datagram()
            };
            seg.resize(stride, 0x5a);
            t.extend(seg);
        }
        let last = self.rng.range(1, stride);
        t.truncate((k - 1) * stride + last);
        let stride = match self.rng.below(20) {
            0 => 0,
            1 => t.len() + self.rng.below(3),
            _ => stride,
        };
        (t, stride)
    }

    fn check_train(&mut self) {
        let (t, stride) = self.train();
        let mut got = Vec::new();
        route_train(&t, stride, &self.table, &mut self.pins, self.now, |r| got.push(r));
        let want = self.model.route_train(&t, stride, self.now);
        assert_eq!(got, want, "train of {} bytes, stride {stride}", t.len());
        let mut cached = Vec::new();
        let mut router = Router::new(&self.table, &mut self.cached_pins, self.now).with_decoder(&mut self.cache);
        router.route_train(&t, stride, |r, refused| {
            assert!(refused.is_none());
            cached.push(r)
        });
        assert_eq!(cached, got, "cached router, train of {} bytes, stride {stride}", t.len());
        // The runs tile the train, in order.
        let mut end = 0;
        for r in &got {
            assert_eq!(r.bytes.start, end);
            end = r.bytes.end;
        }
        assert_eq!(end, t.len());
    }
}

#[test]
fn route_matches_model_over_100k_datagrams() {
    const DATAGRAMS: usize = 100_000;
    let mut w = World::new(0xada0_0040, 5);
    let mut trains = 0;
    for i in 0..DATAGRAMS {
        if w.rng.chance(1, 60) {
            w.change();
        }
        // Time moves on a little with every datagram (≈ 10 s over ~10 000 datagrams).
        w.now += Duration::from_micros(w.rng.range(0, 2_000) as u64);
        let d = w.datagram();
        w.check_one(&d);
        if i % 40 == 0 {
            w.check_train();
            trains += 1;
        }
    }
    // Every outcome was exercised, and the table changed in every way.
    for r in Reason::ALL {
        assert!(w.counts[r.index()] >= 200, "{}: only {} datagrams ({:?})", r.name(), w.counts[r.index()], w.counts);
    }
    assert!(w.changes.iter().all(|&c| c >= 100), "changes {:?}", w.changes);
    // Rotations to either PRF, and switches between them (ADR 0004).
    assert!(w.prf_mix.iter().all(|&c| c >= 50), "PRF mix {:?}", w.prf_mix);
    assert!(trains >= 2_000);
    // The cached router saw repeats (hits) and fresh CIDs (misses) in quantity.
    assert!(w.cache.hits() >= 5_000 && w.cache.misses() >= 5_000, "{:?}", w.cache);
    eprintln!("{:?}", w.cache);
    eprintln!("reasons {:?}, changes {:?}, pins {}", w.counts, w.changes, w.pins.len());
}

// ---------------------------------------------------------------------------------
// Hand-written scenarios (readable statements of the rules).
// ---------------------------------------------------------------------------------

fn table(keys: &KeySet, instances: &[(u16, bool)]) -> Table {
    let infos: Vec<InstanceInfo> =
        instances.iter().map(|&(id, placeable)| InstanceInfo { server_id: ServerId(id), placeable }).collect();
    Table::new(keys.clone(), [7; 16], &infos).unwrap()
}

/// Newest generation SipHash-2-4, previous HMAC-SHA-256 (ADR 0004: a key set mid-switch).
fn keys() -> KeySet {
    let g = |n| Generation::new(n).unwrap();
    KeySet::with_prfs((g(1), Prf::SipHash24, [1; 32]), Some((g(0), Prf::HmacSha256, [2; 32]))).unwrap()
}

fn short(dcid: &[u8]) -> Vec<u8> {
    let mut d = vec![0x41];
    d.extend_from_slice(dcid);
    d.resize(1 + dcid.len() + 40, 0);
    d
}

#[test]
fn rfc9001_initial_is_placed_then_pinned_then_replaced_after_ttl() {
    let ks = keys();
    let t = table(&ks, &[(10, true), (11, true), (12, true)]);
    // RFC 9001 Appendix A.2 / RFC 9369 Appendix A.2: client Initials, 1200 bytes.
    for (pkt, version, zero_rtt_first) in
        [(vectors::RFC9001_A2_CLIENT_INITIAL, V1, 0xd0u8), (vectors::RFC9369_A2_CLIENT_INITIAL, V2, 0xe0)]
    {
        let mut pins = PinTable::new(64, [0; 16]);
        let d = hex(pkt);
        let t0 = Duration::from_secs(50);
        let first = route(&d, &t, &mut pins, t0);
        assert_eq!(first.reason, Reason::Placed);
        let again = route(&d, &t, &mut pins, t0 + PIN_TTL - Duration::from_nanos(1));
        assert_eq!(again, Decision { reason: Reason::Pinned, target: first.target });
        // 0-RTT with the same DCID follows the Initial (ADR 0001), at any size.
        let mut zrtt = vec![zero_rtt_first];
        zrtt.extend_from_slice(&version.to_be_bytes());
        zrtt.push(8);
        zrtt.extend_from_slice(&hex(vectors::CLIENT_DCID));
        zrtt.extend_from_slice(&[0, 0x40, 30]);
        zrtt.resize(zrtt.len() + 30, 0);
        let z = route(&zrtt, &t, &mut pins, t0 + Duration::from_secs(1));
        assert_eq!(z, Decision { reason: Reason::Pinned, target: first.target });
        // At exactly the TTL the pin is gone; placement is deterministic.
        let later = route(&d, &t, &mut pins, t0 + PIN_TTL);
        assert_eq!(later, Decision { reason: Reason::Placed, target: first.target });
        // The same Initial cut to 1199 bytes is not routable (RFC 9000 §14.1).
        assert_eq!(route(&d[..1199], &t, &mut pins, t0), dropped(Reason::NotQuic));
    }
}

#[test]
fn pinned_instance_survives_placement_changes_until_it_dies() {
    let ks = keys();
    let mut pins = PinTable::new(64, [0; 16]);
    let dcid = [0x33u8; 8];
    let mut init = vec![0xc0, 0, 0, 0, 1, 8];
    init.extend_from_slice(&dcid);
    init.extend_from_slice(&[0, 0, 0x44, 0x9e]);
    init.resize(1200, 0);
    let all = [(10, true), (11, true), (12, true), (13, true)];
    let t = table(&ks, &all);
    let now = Duration::from_secs(1);
    let placed = route(&init, &t, &mut pins, now);
    assert_eq!(placed.reason, Reason::Placed);
    let winner = all[placed.target.unwrap()].0;
    // The winner stops being placeable: the pin still holds (draining keeps its
    // handshakes). Another instance joins: the pin still holds.
    let mut changed: Vec<(u16, bool)> = all.iter().map(|&(id, p)| (id, p && id != winner)).collect();
    changed.push((14, true));
    let t2 = table(&ks, &changed);
    let d = route(&init, &t2, &mut pins, now + Duration::from_secs(1));
    assert_eq!((d.reason, changed[d.target.unwrap()].0), (Reason::Pinned, winner));
    // The winner dies: placed again on a live placeable instance.
    let gone: Vec<(u16, bool)> = changed.iter().copied().filter(|&(id, _)| id != winner).collect();
    let t3 = table(&ks, &gone);
    let d = route(&init, &t3, &mut pins, now + Duration::from_secs(2));
    assert_eq!(d.reason, Reason::Placed);
    assert_ne!(gone[d.target.unwrap()].0, winner);
}

#[test]
fn short_headers_owner_orphan_and_no_instance() {
    let ks = keys();
    let t = table(&ks, &[(10, false), (11, true)]);
    let mut pins = PinTable::new(4, [0; 16]);
    let now = Duration::ZERO;
    // Owner even when not placeable (an established connection), for both live gens.
    for g in [0u8, 1] {
        let cid = ks.encode_with(Generation::new(g).unwrap(), ServerId(10), &[g; 10]).unwrap();
        assert_eq!(route(&short(&cid), &t, &mut pins, now), to(Reason::Owner, 0));
    }
    // A dead id: Departed; cr = 3 or a rotated-away generation: Orphan.
    // Both go to a placeable instance.
    let dead = ks.encode(ServerId(99), &[5; 10]);
    assert_eq!(route(&short(&dead), &t, &mut pins, now), to(Reason::Departed, 1));
    let mut marked = ks.encode(ServerId(10), &[6; 10]);
    marked[0] |= 0xc0;
    let old = KeySet::new((Generation::new(2).unwrap(), [3; 32]), None).unwrap().encode(ServerId(10), &[7; 10]);
    for cid in [marked, old] {
        assert_eq!(route(&short(&cid), &t, &mut pins, now), to(Reason::Orphan, 1));
    }
    // Nobody placeable: orphans still go to a live instance (ADR-0002).
    let t = table(&ks, &[(10, false)]);
    assert_eq!(route(&short(&dead), &t, &mut pins, now), to(Reason::Departed, 0));
    assert_eq!(route(&short(&old), &t, &mut pins, now), to(Reason::Orphan, 0));
    // Nobody at all.
    let t = table(&ks, &[]);
    assert_eq!(route(&short(&dead), &t, &mut pins, now), dropped(Reason::NoInstance));
    // Too short to sample (RFC 9001 §5.4.2), fixed bit clear (RFC 9000 §17.3.1).
    let t = table(&ks, &[(10, true)]);
    let cid = ks.encode(ServerId(10), &[1; 10]);
    assert_eq!(route(&short(&cid)[..32], &t, &mut pins, now), dropped(Reason::NotQuic));
    let mut clear = short(&cid);
    clear[0] = 0x01;
    assert_eq!(route(&clear, &t, &mut pins, now), dropped(Reason::NotQuic));
}

#[test]
fn long_header_rules() {
    let ks = keys();
    let t = table(&ks, &[(10, true), (11, true)]);
    let mut pins = PinTable::new(4, [0; 16]);
    let now = Duration::ZERO;
    let ours = ks.encode(ServerId(11), &[9; 10]);
    let long = |first: u8, version: u32, dcid: &[u8], len: usize| {
        let mut d = vec![first];
        d.extend_from_slice(&version.to_be_bytes());
        d.push(dcid.len() as u8);
        d.extend_from_slice(dcid);
        d.push(0);
        if first & 0x30 == 0 && version == V1 || first & 0x30 == 0x10 && version == V2 {
            d.push(0); // Initial: empty token
        }
        let rest = len - d.len() - 2;
        d.extend_from_slice(&(0x4000 | rest as u16).to_be_bytes());
        d.resize(len, 0);
        d
    };
    // Handshake with our CID → Owner; with a dead one → Departed; with one that does
    // not decode → Orphan.
    assert_eq!(route(&long(0xe0, V1, &ours, 100), &t, &mut pins, now), to(Reason::Owner, 1));
    assert_eq!(route(&long(0xf0, V2, &ours, 100), &t, &mut pins, now), to(Reason::Owner, 1));
    let dead = ks.encode(ServerId(12), &[9; 10]);
    assert_eq!(route(&long(0xe0, V1, &dead, 100), &t, &mut pins, now).reason, Reason::Departed);
    let mut undecodable = ours;
    undecodable[0] |= 0xc0; // cr = 3
    assert_eq!(route(&long(0xe0, V1, &undecodable, 100), &t, &mut pins, now).reason, Reason::Orphan);
    assert_eq!(route(&long(0xe0, V1, &ours[..8], 100), &t, &mut pins, now).reason, Reason::Orphan, "8-byte DCID");
    // The Initial after a Retry carries our CID → Owner, whatever its size.
    assert_eq!(route(&long(0xc0, V1, &ours, 1200), &t, &mut pins, now), to(Reason::Owner, 1));
    // A 0-RTT packet below 1200 bytes is still placed (only Initials have a minimum).
    assert_eq!(route(&long(0xd0, V1, &[4; 8], 100), &t, &mut pins, now).reason, Reason::Placed);
    assert_eq!(route(&long(0xc0, V1, &[5; 8], 1199), &t, &mut pins, now), dropped(Reason::NotQuic));
    // Retry and Version Negotiation are server → client only.
    let mut retry = vec![0xf0, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0];
    retry.extend_from_slice(&[0; 16]);
    assert_eq!(route(&retry, &t, &mut pins, now), dropped(Reason::NotQuic));
    assert_eq!(route(&hex(vectors::RFC9001_A4_RETRY), &t, &mut pins, now), dropped(Reason::NotQuic));
    let mut vn = vec![0x80, 0, 0, 0, 0, 12];
    vn.extend_from_slice(&ours);
    vn.extend_from_slice(&[0, 0, 0, 0, 1]);
    vn.resize(1300, 0);
    assert_eq!(route(&vn, &t, &mut pins, now), dropped(Reason::NotQuic));
    // Unknown version: VN from some instance if ≥ 1200 bytes (RFC 9000 §5.2.2), else drop.
    let mut unk = vec![0xc0, 0xff, 0, 0, 0x1d, 8, 1, 1, 1, 1, 1, 1, 1, 1, 0];
    unk.resize(1200, 0);
    assert_eq!(route(&unk, &t, &mut pins, now).reason, Reason::VersionNegotiation);
    assert_eq!(route(&unk[..1199], &t, &mut pins, now), dropped(Reason::NotQuic));
    let empty = table(&ks, &[]);
    assert_eq!(route(&unk, &empty, &mut pins, now), dropped(Reason::NoInstance));
    // Nothing placeable: a new connection has nowhere to go.
    let drained = table(&ks, &[(10, false)]);
    assert_eq!(route(&long(0xc0, V1, &[6; 8], 1200), &drained, &mut pins, now), dropped(Reason::NoInstance));
}

// ---------------------------------------------------------------------------------
// GRO trains
// ---------------------------------------------------------------------------------

#[test]
fn uniform_train_is_one_run() {
    let ks = keys();
    let t = table(&ks, &[(10, true), (11, true), (12, true)]);
    let cid = ks.encode(ServerId(12), &[3; 10]);
    let now = Duration::ZERO;
    for stride in [33usize, 100, 1200, 1472] {
        for count in 2..=7usize {
            for last in [33, stride] {
                let mut train = Vec::new();
                for k in 0..count {
                    let mut seg = vec![0x40 | k as u8];
                    seg.extend_from_slice(&cid);
                    seg.resize(if k + 1 == count { last.min(stride) } else { stride }, k as u8);
                    train.extend(seg);
                }
                let mut runs = Vec::new();
                let mut pins = PinTable::new(4, [0; 16]);
                route_train(&train, stride, &t, &mut pins, now, |r| runs.push(r));
                assert_eq!(
                    runs,
                    vec![TrainRun {
                        bytes: 0..train.len(),
                        segments: train.len().div_ceil(stride),
                        decision: to(Reason::Owner, 2),
                    }],
                    "stride {stride}, {count} segments"
                );
                assert_eq!(runs[0].segments, count);
            }
        }
    }
}

#[test]
fn mixed_train_is_routed_per_segment_and_merged() {
    let ks = keys();
    let t = table(&ks, &[(10, true), (11, true)]);
    let a = ks.encode(ServerId(10), &[1; 10]);
    let b = ks.encode(ServerId(11), &[2; 10]);
    let stride = 60;
    let seg = |cid: &[u8]| {
        let mut s = vec![0x40];
        s.extend_from_slice(cid);
        s.resize(stride, 0);
        s
    };
    // a a b b b garbage a(short last) → runs: [a×2] [b×3] [NotQuic] [a? no: last is 20 bytes → NotQuic]
    let mut train = Vec::new();
    for cid in [&a, &a, &b, &b, &b] {
        train.extend(seg(cid));
    }
    train.extend(vec![0u8; stride]); // fixed bit clear
    let mut tail = seg(&a);
    tail.truncate(20); // too short: NotQuic, merges with the garbage segment
    train.extend(tail);
    let mut runs = Vec::new();
    let mut pins = PinTable::new(4, [0; 16]);
    route_train(&train, stride, &t, &mut pins, Duration::ZERO, |r| runs.push(r));
    assert_eq!(
        runs,
        vec![
            TrainRun { bytes: 0..2 * stride, segments: 2, decision: to(Reason::Owner, 0) },
            TrainRun { bytes: 2 * stride..5 * stride, segments: 3, decision: to(Reason::Owner, 1) },
            TrainRun { bytes: 5 * stride..6 * stride + 20, segments: 2, decision: dropped(Reason::NotQuic) },
        ]
    );
    // Two valid segments of equal length but different DCIDs: not uniform.
    let mut two = seg(&a);
    two.extend(seg(&b));
    let mut runs = Vec::new();
    route_train(&two, stride, &t, &mut pins, Duration::ZERO, |r| runs.push(r));
    assert_eq!(
        runs,
        vec![
            TrainRun { bytes: 0..stride, segments: 1, decision: to(Reason::Owner, 0) },
            TrainRun { bytes: stride..2 * stride, segments: 1, decision: to(Reason::Owner, 1) },
        ]
    );
    // Stride 0 or ≥ the train: one datagram.
    for s in [0, train.len(), train.len() + 5] {
        let mut runs = Vec::new();
        route_train(&train, s, &t, &mut pins, Duration::ZERO, |r| runs.push(r));
        assert_eq!(runs, vec![TrainRun { bytes: 0..train.len(), segments: 1, decision: to(Reason::Owner, 0) }]);
    }
    let mut runs = Vec::new();
    route_train(&[], 10, &t, &mut pins, Duration::ZERO, |r| runs.push(r));
    assert!(runs.is_empty());
}

// ---------------------------------------------------------------------------------
// Initials on a DCID that decodes to a live id (docs/adr/0003-demux-retry.md
// "Initials on live DCIDs"). The model, written from the ADR's rule: in order,
// 1. a token valid for the client → Owner;
// 2. some packet opens with CRYPTO at offset 0 (a ClientHello) → placed and admitted
//    like any client-chosen DCID;
// 3. the 4-tuple was placed (admitted) on the owner's server id within the follow-up
//    lifetime and has allowance left → Owner, one spent;
// 4. else: owner under pressure → dropped; Retry on → dropped; the client holds its
//    cap of tickets → dropped; its rate (GCRA) spent → dropped; else charged, Owner.
// Placement (the data plane's composition): pinned → Pinned; token-less and the
// winner under pressure → refused; token-less and Retry on → refused; the cap
// (tickets held by unswept pins); the rate; then Placed, pinned with a ticket, and the
// 4-tuple gets its follow-ups.
// ---------------------------------------------------------------------------------

mod live_dcid_initials {
    use super::*;
    use proptest::prelude::*;
    use proto::header::{LongHeader, VERSION_1};
    use proto::initial::build_client_initial;
    use proto::limits::owner_initial::{decide, Outcome, OwnerInitialQuery, UnprovenLimits};
    use proto::limits::{ClientKey, ConcurrencySketch, FollowUps, Gcra, RateSketch, Ticket, FOLLOW_UP_TTL};
    use proto::route::{Admission, LiveInitial, OwnerInitial};
    use proto::token::TokenKey;
    use std::collections::HashMap;
    use std::net::{IpAddr, SocketAddr};

    const NOW_UNIX: u64 = 1_800_000_000;
    const TOKEN_SECRET: [u8; 32] = [9; 32];
    /// Three client addresses (the limits' clients), two ports each (the 4-tuples
    /// follow-ups belong to). The sketches' hash key is fixed and these addresses share
    /// no lane in either sketch (checked in `sketches`), so both are exact here.
    const IPS: [[u8; 4]; 3] = [[192, 0, 2, 1], [192, 0, 2, 2], [198, 51, 100, 7]];
    const CLIENTS: usize = 6;
    const SKETCH_KEY: [u8; 16] = [0x5e; 16];
    const SKETCH_WORDS: usize = 1024;
    /// The live instances (all placeable); an Initial for instance index 3 carries a
    /// CID of id 99, which decodes but is not live.
    const IDS: [u16; 4] = [10, 11, 12, 99];

    fn client(i: usize) -> SocketAddr {
        SocketAddr::new(IpAddr::from(IPS[i / 2]), 4000 + (i % 2) as u16)
    }

    #[derive(Clone, Copy, Debug)]
    struct Config {
        burst: u32,
        per_second: u32,
        cap: u16,
        allowance: u8,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Body {
        /// Does not open under its DCID's keys.
        Garbage,
        /// CRYPTO at offset 1: opens, does not start a connection.
        CryptoAt1,
        /// ACK only (the client's Initial after the server's first flight).
        Ack,
        /// A ClientHello's first CRYPTO frame.
        ClientHello,
        /// A second ClientHello after HelloRetryRequest: CRYPTO past offset 0.
        CryptoLater,
        /// A PING Initial with a ClientHello Initial coalesced after it.
        PingThenClientHello,
    }
    const BODIES: [Body; 6] =
        [Body::Garbage, Body::CryptoAt1, Body::Ack, Body::ClientHello, Body::CryptoLater, Body::PingThenClientHello];

    impl Body {
        fn starts(self) -> bool {
            matches!(self, Body::ClientHello | Body::PingThenClientHello)
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Tok {
        None,
        Retry,
        Validation,
        RetryOtherPort,
        Garbage,
    }
    const TOKS: [Tok; 5] = [Tok::None, Tok::Retry, Tok::Validation, Tok::RetryOtherPort, Tok::Garbage];

    #[derive(Clone, Debug)]
    enum Event {
        Advance(u16),
        /// A new connection's first Initial (a ClientHello) on a fresh client-chosen DCID.
        Connect {
            client: usize,
            dcid: u64,
            tok: Tok,
        },
        /// Initials with one CID of instance `instance` (seed `cid`): one datagram of
        /// `bodies[0]` (`short`: 1100 bytes), or a uniform GRO train of 1200-byte ones.
        Owner {
            client: usize,
            instance: usize,
            cid: u8,
            bodies: Vec<Body>,
            tok: Tok,
            short: bool,
        },
        Pressure(usize, bool),
        Retrying(bool),
    }

    fn token(t: Tok, key: &TokenKey, client: SocketAddr, now_unix: u64, seed: u64) -> Vec<u8> {
        let mut nonce = [0u8; 16];
        nonce[..8].copy_from_slice(&seed.to_le_bytes());
        let other_port = SocketAddr::new(client.ip(), client.port() ^ 1);
        match t {
            Tok::None => vec![],
            Tok::Retry => key.seal(client, Some(&seed.to_be_bytes()), now_unix, nonce).unwrap(),
            Tok::Validation => key.seal(client, None, now_unix, nonce).unwrap(),
            Tok::RetryOtherPort => key.seal(other_port, Some(&[1; 8]), now_unix, nonce).unwrap(),
            Tok::Garbage => seed.to_le_bytes().repeat(1 + (seed % 7) as usize),
        }
    }

    /// One client Initial datagram of exactly `len` bytes.
    fn datagram(b: Body, dcid: &[u8], tok: &[u8], len: usize) -> Vec<u8> {
        let ch = [6, 0, 4, 1, 0, 0, 0];
        let i = |pn, f: &[u8], min| build_client_initial(VERSION_1, dcid, &[7; 8], tok, pn, f, min).unwrap();
        let d = match b {
            Body::Garbage => {
                let mut d = i(1, &[6, 1, 2, 0xaa, 0xbb], len);
                let n = d.len();
                d[n - 20] ^= 0x40;
                d
            }
            Body::CryptoAt1 => i(1, &[6, 1, 2, 0xaa, 0xbb], len),
            Body::Ack => i(1, &[2, 0, 0, 0, 0], len),
            Body::ClientHello => i(0, &ch, len),
            Body::CryptoLater => i(1, &[6, 0x41, 0x20, 2, 0xaa, 0xbb], len),
            Body::PingThenClientHello => {
                let ping = i(0, &[1], 0);
                let rest = i(1, &ch, len - ping.len());
                [ping, rest].concat()
            }
        };
        assert_eq!(d.len(), len);
        d
    }

    // -----------------------------------------------------------------------------
    // The code under test: proto::Router with proto::limits::owner_initial::decide,
    // proto::limits::FollowUps and the sketches, composed as the data plane composes
    // them (demux/src/dataplane/{pressure,limits}.rs).
    // -----------------------------------------------------------------------------

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Refused {
        Owner(Outcome),
        Pressure,
        Retry,
        Cap,
        Rate,
    }

    struct Code {
        table: Table,
        pins: PinTable,
        follow_ups: FollowUps,
        rate: RateSketch,
        conc: ConcurrencySketch,
        cap: u16,
        key: TokenKey,
    }

    struct Gate<'a> {
        follow_ups: &'a mut FollowUps,
        rate: &'a RateSketch,
        conc: &'a ConcurrencySketch,
        cap: u16,
        key: &'a TokenKey,
        client: SocketAddr,
        now: Duration,
        pressure: &'a [bool; 3],
        retrying: bool,
        outcomes: Vec<Outcome>,
    }

    struct Unproven<'a> {
        rate: &'a RateSketch,
        conc: &'a ConcurrencySketch,
        cap: u16,
        client: SocketAddr,
        ms: u64,
        pressure: &'a [bool; 3],
        retrying: bool,
    }

    impl UnprovenLimits for Unproven<'_> {
        fn pressured(&self, owner: usize) -> bool {
            self.pressure[owner]
        }
        fn retrying(&mut self) -> bool {
            self.retrying
        }
        fn handshakes_full(&self) -> bool {
            self.conc.full(ClientKey::from(self.client), self.cap)
        }
        fn charge_rate(&mut self) -> bool {
            self.rate.try_admit(ClientKey::from(self.client), self.ms)
        }
    }

    impl Admission for Gate<'_> {
        type Refusal = Refused;
        fn admit(&mut self, h: &LongHeader<'_>, _: usize, table: &Table, target: usize) -> Result<u32, Refused> {
            let token_less = h.ty == LongType::Initial && h.token.is_empty();
            if token_less && self.pressure[target] {
                return Err(Refused::Pressure);
            }
            if token_less && self.retrying {
                return Err(Refused::Retry);
            }
            let key = ClientKey::from(self.client);
            let t = self.conc.try_acquire(key, self.cap).ok_or(Refused::Cap)?;
            if !self.rate.try_admit(key, self.now.as_millis() as u64) {
                self.conc.release(t);
                return Err(Refused::Rate);
            }
            self.follow_ups.grant(self.client, table.instance(target).unwrap().server_id, self.now);
            Ok(t.to_raw())
        }
        fn release(&mut self, p: u32) {
            self.conc.release(Ticket::from_raw(p).unwrap());
        }
        fn owner_initial(&mut self, initial: &LiveInitial<'_, '_>, table: &Table) -> OwnerInitial<Refused> {
            let owner_id = table.instance(initial.owner).unwrap().server_id;
            let q = OwnerInitialQuery::new(initial, self.client, owner_id, self.now, NOW_UNIX + self.now.as_secs());
            let mut limits = Unproven {
                rate: self.rate,
                conc: self.conc,
                cap: self.cap,
                client: self.client,
                ms: self.now.as_millis() as u64,
                pressure: self.pressure,
                retrying: self.retrying,
            };
            let o = decide(Some(self.key), self.follow_ups, &q, &mut limits);
            self.outcomes.push(o);
            match o {
                Outcome::Placed => OwnerInitial::Place,
                o if o.to_owner() => OwnerInitial::Owner,
                o => OwnerInitial::Refuse(Refused::Owner(o)),
            }
        }
    }

    fn sketches(cfg: Config) -> (RateSketch, ConcurrencySketch) {
        let gcra = Gcra::per_second(cfg.per_second, cfg.burst, 1000).unwrap();
        let rate = RateSketch::new(SKETCH_WORDS, SKETCH_KEY, gcra, 0);
        let conc = ConcurrencySketch::new(SKETCH_WORDS, SKETCH_KEY);
        // No two clients share a lane: each sketch counts each client exactly.
        for (i, a) in IPS.iter().enumerate() {
            for b in &IPS[i + 1..] {
                let (ka, kb) = (ClientKey::from(IpAddr::from(*a)), ClientKey::from(IpAddr::from(*b)));
                for (wa, pa, wb, pb) in [
                    (rate.locate(ka).0, rate.locate(ka).1, rate.locate(kb).0, rate.locate(kb).1),
                    (conc.locate(ka).0, conc.locate(ka).1, conc.locate(kb).0, conc.locate(kb).1),
                ] {
                    let (a1, a2) = pa.lanes();
                    let (b1, b2) = pb.lanes();
                    assert!(wa != wb || ![b1, b2].iter().any(|l| *l == a1 || *l == a2), "{a:?} and {b:?} share a lane");
                }
            }
        }
        (rate, conc)
    }

    impl Code {
        fn new(cfg: Config) -> Code {
            let (rate, conc) = sketches(cfg);
            Code {
                table: table(&keys(), &[(IDS[0], true), (IDS[1], true), (IDS[2], true)]),
                pins: PinTable::new(1 << 12, [4; 16]),
                follow_ups: FollowUps::with_allowance(1 << 12, [6; 16], cfg.allowance, FOLLOW_UP_TTL),
                rate,
                conc,
                cap: cfg.cap,
                key: TokenKey::new(&TOKEN_SECRET),
            }
        }

        /// Routes a datagram (`stride` 0) or a train; its one run, and the outcomes
        /// the rule gave.
        fn route(
            &mut self,
            d: &[u8],
            stride: usize,
            client: SocketAddr,
            now: Duration,
            pressure: &[bool; 3],
            retrying: bool,
        ) -> ((Decision, Option<Refused>, usize), Vec<Outcome>) {
            let mut gate = Gate {
                follow_ups: &mut self.follow_ups,
                rate: &self.rate,
                conc: &self.conc,
                cap: self.cap,
                key: &self.key,
                client,
                now,
                pressure,
                retrying,
                outcomes: vec![],
            };
            let mut runs = vec![];
            Router::new(&self.table, &mut self.pins, now).with_admission(&mut gate).route_train(
                d,
                stride,
                |r, refused| runs.push((r.decision, refused, r.segments)),
            );
            assert_eq!(runs.len(), 1, "one DCID, one run");
            (runs[0], gate.outcomes)
        }
    }

    // -----------------------------------------------------------------------------
    // The model.
    // -----------------------------------------------------------------------------

    struct RuleModel {
        base: Model,
        cfg: Config,
        /// ms between admissions (T) and tau = (burst − 1)·T.
        interval: u64,
        tau: u64,
        /// GCRA theoretical arrival time per client address, in ms.
        tat: HashMap<IpAddr, u64>,
        /// Pins not yet swept: (DCID, server id, time, holder of its ticket).
        pins: Vec<(Vec<u8>, ServerId, Duration, IpAddr)>,
        /// (4-tuple, server id, granted at, allowance left).
        follow: Vec<(SocketAddr, ServerId, Duration, u8)>,
    }

    /// What the model says of a datagram or train.
    type Expect = (Result<Decision, Refused>, Option<Outcome>);

    impl RuleModel {
        fn new(cfg: Config) -> RuleModel {
            let g = |n| Generation::new(n).unwrap();
            let ks = keys();
            let mut live_keys = [None, None, None];
            for gen in [g(0), g(1)] {
                live_keys[gen.get() as usize] = Some((ks.prf(gen).unwrap(), *ks.secret(gen).unwrap()));
            }
            let interval = (1000 / u64::from(cfg.per_second)).max(1);
            RuleModel {
                base: Model {
                    live_keys,
                    instances: (0..3).map(|i| InstanceInfo { server_id: ServerId(IDS[i]), placeable: true }).collect(),
                    rendezvous: Rendezvous::new([7; 16]),
                    pins: vec![],
                },
                cfg,
                interval,
                tau: (u64::from(cfg.burst) - 1) * interval,
                tat: HashMap::new(),
                pins: vec![],
                follow: vec![],
            }
        }

        fn tickets(&self, ip: IpAddr) -> usize {
            self.pins.iter().filter(|p| p.3 == ip).count()
        }

        fn gcra(&mut self, ip: IpAddr, ms: u64) -> bool {
            let tat = self.tat.get(&ip).copied().unwrap_or(0);
            let start = tat.max(ms);
            if start - ms > self.tau {
                return false;
            }
            self.tat.insert(ip, start + self.interval);
            true
        }

        /// A client-chosen DCID (or a ClientHello on a copied one), placed.
        #[allow(clippy::too_many_arguments)]
        fn place(
            &mut self,
            dcid: &[u8],
            c: SocketAddr,
            token_less: bool,
            len: usize,
            now: Duration,
            pressure: &[bool; 3],
            retrying: bool,
        ) -> Result<Decision, Refused> {
            if len < MIN_INITIAL {
                return Ok(dropped(Reason::NotQuic));
            }
            let live = |at: Duration| now.saturating_sub(at) < PIN_TTL;
            if let Some(p) = self.pins.iter().find(|p| p.0 == dcid && live(p.2)) {
                return Ok(to(Reason::Pinned, self.base.index_of(p.1).unwrap()));
            }
            let w = self.base.argmax(dcid, true).unwrap();
            if token_less && pressure[w] {
                return Err(Refused::Pressure);
            }
            if token_less && retrying {
                return Err(Refused::Retry);
            }
            if self.tickets(c.ip()) >= usize::from(self.cfg.cap) {
                return Err(Refused::Cap);
            }
            if !self.gcra(c.ip(), now.as_millis() as u64) {
                return Err(Refused::Rate);
            }
            // Inserting sweeps expired pins (their tickets go back) first.
            self.pins.retain(|p| live(p.2));
            let id = ServerId(IDS[w]);
            self.pins.push((dcid.to_vec(), id, now, c.ip()));
            if self.cfg.allowance > 0 {
                self.follow.retain(|f| !(f.0 == c && f.1 == id));
                self.follow.push((c, id, now, self.cfg.allowance));
            }
            Ok(to(Reason::Placed, w))
        }

        /// Initials with DCID `dcid` from `c`: `token_valid` / `token_less` / `starts`
        /// are what the generator made them.
        #[allow(clippy::too_many_arguments)]
        fn route(
            &mut self,
            dcid: &[u8],
            c: SocketAddr,
            token_valid: bool,
            token_less: bool,
            starts: bool,
            len: usize,
            now: Duration,
            pressure: &[bool; 3],
            retrying: bool,
        ) -> Expect {
            let Some(i) = self.base.owner(dcid) else {
                return (self.place(dcid, c, token_less, len, now, pressure, retrying), None);
            };
            if token_valid {
                return (Ok(to(Reason::Owner, i)), Some(Outcome::Token));
            }
            if starts {
                return (self.place(dcid, c, token_less, len, now, pressure, retrying), Some(Outcome::Placed));
            }
            let id = ServerId(IDS[i]);
            if let Some(f) = self
                .follow
                .iter_mut()
                .find(|f| f.0 == c && f.1 == id && f.3 > 0 && now.saturating_sub(f.2) < FOLLOW_UP_TTL)
            {
                f.3 -= 1;
                return (Ok(to(Reason::Owner, i)), Some(Outcome::FollowUp));
            }
            let o = if pressure[i] {
                Outcome::DroppedPressure
            } else if retrying {
                Outcome::DroppedRetry
            } else if self.tickets(c.ip()) >= usize::from(self.cfg.cap) {
                Outcome::HandshakeLimited
            } else if !self.gcra(c.ip(), now.as_millis() as u64) {
                Outcome::RateLimited
            } else {
                return (Ok(to(Reason::Owner, i)), Some(Outcome::Admitted));
            };
            (Err(Refused::Owner(o)), Some(o))
        }
    }

    // -----------------------------------------------------------------------------
    // Model and code, event by event.
    // -----------------------------------------------------------------------------

    /// Runs `events`; every decision must agree. The outcomes and placement refusals
    /// seen, for coverage.
    fn run(cfg: Config, events: &[Event]) -> HashMap<String, usize> {
        let mut code = Code::new(cfg);
        let mut model = RuleModel::new(cfg);
        let ks = keys();
        let mut now = Duration::ZERO;
        let (mut pressure, mut retrying) = ([false; 3], false);
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (n, e) in events.iter().enumerate() {
            let now_unix = NOW_UNIX + now.as_secs();
            let (d, stride, c, want) = match e {
                Event::Advance(ms) => {
                    now += Duration::from_millis(u64::from(*ms));
                    continue;
                }
                Event::Pressure(i, on) => {
                    pressure[*i] = *on;
                    continue;
                }
                Event::Retrying(on) => {
                    retrying = *on;
                    continue;
                }
                Event::Connect { client: ci, dcid, tok } => {
                    let c = client(*ci);
                    let dcid = dcid.to_be_bytes();
                    let t = token(*tok, &code.key, c, now_unix, *dcid.last().unwrap() as u64);
                    let d = datagram(Body::ClientHello, &dcid, &t, 1200);
                    let valid = matches!(tok, Tok::Retry | Tok::Validation);
                    let want = model.route(&dcid, c, valid, t.is_empty(), true, 1200, now, &pressure, retrying);
                    (d, 0, c, want)
                }
                Event::Owner { client: ci, instance, cid, bodies, tok, short } => {
                    let c = client(*ci);
                    let dcid = ks.encode(ServerId(IDS[*instance]), &[*cid; 10]);
                    let t = token(*tok, &code.key, c, now_unix, u64::from(*cid) << 8 | n as u64);
                    let valid = matches!(tok, Tok::Retry | Tok::Validation);
                    let train = bodies.len() > 1;
                    let len = if *short && !train { 1100 } else { 1200 };
                    let d: Vec<u8> = bodies.iter().flat_map(|b| datagram(*b, &dcid, &t, len)).collect();
                    let starts = bodies.iter().any(|b| b.starts());
                    let want = model.route(&dcid, c, valid, t.is_empty(), starts, len, now, &pressure, retrying);
                    (d, if train { len } else { 0 }, c, want)
                }
            };
            let ((decision, refused, segments), outcomes) = code.route(&d, stride, c, now, &pressure, retrying);
            let got = match refused {
                Some(r) => Err(r),
                None => Ok(decision),
            };
            assert_eq!((got, outcomes.first().copied()), want, "event {n}: {e:?} at {now:?}, {cfg:?}");
            assert!(outcomes.len() <= 1, "decided once per datagram or train: {outcomes:?}");
            assert_eq!(segments, d.len().checked_div(stride).unwrap_or(1));
            if let Some(o) = want.1 {
                *seen.entry(o.name().to_string()).or_default() += 1;
            }
            if let Err(r) = want.0 {
                *seen.entry(format!("{r:?}")).or_default() += 1;
            }
        }
        seen
    }

    fn config() -> impl Strategy<Value = Config> {
        (1u32..=4, prop::sample::select(vec![1u32, 2, 10, 1000]), 0u16..=4, prop::sample::select(vec![0u8, 1, 2, 8]))
            .prop_map(|(burst, per_second, cap, allowance)| Config { burst, per_second, cap, allowance })
    }

    fn event() -> impl Strategy<Value = Event> {
        let tok = prop::sample::select(TOKS.to_vec());
        let body = prop::sample::select(BODIES.to_vec());
        prop_oneof![
            3 => (0u16..3000).prop_map(Event::Advance),
            3 => (0..CLIENTS, 0u64..24, tok.clone()).prop_map(|(client, dcid, tok)| Event::Connect { client, dcid, tok }),
            8 => (0..CLIENTS, 0..4usize, 0u8..6, body.clone(), tok.clone(), any::<bool>()).prop_map(
                |(client, instance, cid, b, tok, short)| Event::Owner { client, instance, cid, bodies: vec![b], tok, short }
            ),
            2 => (0..CLIENTS, 0..3usize, 0u8..6, prop::collection::vec(body, 2..=3), tok).prop_map(
                |(client, instance, cid, bodies, tok)| Event::Owner { client, instance, cid, bodies, tok, short: false }
            ),
            1 => (0..3usize, any::<bool>()).prop_map(|(i, on)| Event::Pressure(i, on)),
            1 => prop::bool::weighted(0.3).prop_map(Event::Retrying),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The rule and the placement around it, model against code, over random
        /// configurations and event sequences.
        #[test]
        fn owner_initials_follow_the_rule(cfg in config(), events in prop::collection::vec(event(), 1..150)) {
            run(cfg, &events);
        }
    }

    /// Long deterministic runs with the default allowance: every outcome and every
    /// placement refusal happens, many times (the proptest cannot say so of its
    /// cases), and model and code agree throughout.
    #[test]
    fn every_outcome_is_exercised() {
        let mut rng = common::rng::Rng::new(0x0e7_10ad);
        let mut events = Vec::new();
        for _ in 0..6_000 {
            let e = match rng.below(18) {
                0..=2 => Event::Advance(rng.below(4000) as u16),
                3..=5 => {
                    Event::Connect { client: rng.below(CLIENTS), dcid: rng.below(40) as u64, tok: *rng.pick(&TOKS) }
                }
                6..=14 => Event::Owner {
                    client: rng.below(CLIENTS),
                    instance: rng.below(4),
                    cid: rng.below(6) as u8,
                    bodies: vec![*rng.pick(&BODIES)],
                    tok: *rng.pick(&TOKS),
                    short: rng.chance(1, 8),
                },
                15 => Event::Owner {
                    client: rng.below(CLIENTS),
                    instance: rng.below(3),
                    cid: rng.below(6) as u8,
                    bodies: (0..rng.range(2, 3)).map(|_| *rng.pick(&BODIES)).collect(),
                    tok: *rng.pick(&TOKS),
                    short: false,
                },
                16 => Event::Pressure(rng.below(3), rng.chance(1, 3)),
                _ => Event::Retrying(rng.chance(1, 4)),
            };
            events.push(e);
        }
        // One configuration where the rate binds first, one where the cap does (a
        // client at its cap stays there until a placement sweeps its expired pins).
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (burst, per_second, cap) in [(2, 5, 6), (2, 1, 3)] {
            let cfg = Config { burst, per_second, cap, allowance: proto::limits::FOLLOW_UP_ALLOWANCE };
            for (k, v) in run(cfg, &events) {
                *seen.entry(k).or_default() += v;
            }
        }
        for o in Outcome::ALL {
            assert!(seen.get(o.name()).copied().unwrap_or(0) >= 20, "{}: {seen:?}", o.name());
        }
        for r in ["Pressure", "Retry", "Cap", "Rate"] {
            assert!(seen.get(r).copied().unwrap_or(0) >= 20, "{r}: {seen:?}");
        }
        eprintln!("{seen:?}");
    }

    /// RFC 9001 Appendix A.2's client Initial (a ClientHello) starts a connection;
    /// RFC 9369 A.2's too.
    #[test]
    fn rfc_client_initials_start_connections() {
        assert_eq!(proto::initial::starts_connection(&hex(vectors::RFC9001_A2_CLIENT_INITIAL)), Some(true));
        assert_eq!(proto::initial::starts_connection(&hex(vectors::RFC9369_A2_CLIENT_INITIAL)), Some(true));
    }

    /// Without a hook (NoAdmission) nothing changes: Owner, whatever the token.
    #[test]
    fn plain_router_keeps_owner() {
        let ks = keys();
        let t = table(&ks, &[(10, true)]);
        let dcid = ks.encode(ServerId(10), &[3; 10]);
        let mut pins = PinTable::new(16, [1; 16]);
        for b in BODIES {
            let d = datagram(b, &dcid, &[], 1200);
            assert_eq!(route(&d, &t, &mut pins, Duration::ZERO), to(Reason::Owner, 0));
        }
    }

    /// A uniform GRO train of one DCID is decided once: one ClientHello among ACKs
    /// sends the whole train to placement; the ACK-only segment's packet may end
    /// before its segment does (zero padding after it, as some clients send).
    #[test]
    fn uniform_train_with_one_client_hello_is_placed() {
        let cfg = Config { burst: 1, per_second: 1, cap: 4, allowance: 0 };
        let ks = keys();
        let dcid = ks.encode(ServerId(IDS[0]), &[3; 10]);
        let c = client(0);
        let mut ack = build_client_initial(VERSION_1, &dcid, &[7; 8], &[], 1, &[2, 0, 0, 0, 0], 1000).unwrap();
        ack.resize(1200, 0);
        let ch = datagram(Body::ClientHello, &dcid, &[], 1200);
        let mut code = Code::new(cfg);
        let now = Duration::from_secs(1);
        let (run, outcomes) = code.route(&[ack.clone(), ack.clone()].concat(), 1200, c, now, &[false; 3], false);
        assert_eq!((run, outcomes), ((to(Reason::Owner, 0), None, 2), vec![Outcome::Admitted]));
        let (run, outcomes) = code.route(&[ack.clone(), ack].concat(), 1200, c, now, &[false; 3], false);
        assert_eq!((run.1, outcomes), (Some(Refused::Owner(Outcome::RateLimited)), vec![Outcome::RateLimited]));
        let (run, outcomes) =
            code.route(&[datagram(Body::Ack, &dcid, &[], 1200), ch].concat(), 1200, c, now, &[false; 3], false);
        assert_eq!((run.1, outcomes), (Some(Refused::Rate), vec![Outcome::Placed]));
    }
}
