//! The ADR 0001 routing table as a pure function:
//! (datagram, table snapshot, pin table, now) → [`Decision`].
//!
//! | datagram                                                  | reason               |
//! |-----------------------------------------------------------|----------------------|
//! | any header whose DCID decodes to a live server id         | `Owner`              |
//! | client Initial / 0-RTT, client-chosen DCID, pinned        | `Pinned`             |
//! | client Initial / 0-RTT, client-chosen DCID, not pinned    | `Placed` (+ pin 10 s)|
//! | decodes to a server id that is not live (short, Handshake) | `Departed`           |
//! | does not decode: `cr` = 3, unknown generation, wrong length | `Orphan`             |
//! | long header of an unsupported version, ≥ 1200 bytes       | `VersionNegotiation` |
//! | too short, fixed bit clear, inconsistent lengths, …       | `NotQuic` (drop)     |
//! | a reason above, but no instance to send it to             | `NoInstance` (drop)  |
//!
//! **Why a client Initial whose random DCID decodes to a live id may go to that
//! instance.** Routing by DCID is deterministic: every datagram the client sends
//! with that DCID (its Initials, its 0-RTT) decodes to the same live id and so reaches
//! the same instance, exactly as a pin would guarantee. The instance sees an ordinary
//! new connection; it need not have issued the CID (RFC 9000 §7.2 lets the client pick
//! any DCID), and from its Handshake on the client uses the instance's own CIDs. The
//! only cost is placement ignoring `placeable` with probability ≤ live/65 536 per
//! random DCID: a draining instance refuses the connection and the client retries with
//! a fresh DCID. The alternative — pinning first — would need the pin table on the
//! Owner path, which must stay stateless (ADR 0001 "Consequences").

use crate::cid::{KeySet, ServerId, CID_LEN};
use crate::counter_enum::counter_enum;
use crate::decode_cache::{Decoder, Uncached};
use crate::header::{self, Header, LongHeader, LongType, MIN_INITIAL_DATAGRAM};
use crate::pin::PinTable;
use crate::rendezvous::Rendezvous;
use std::time::Duration;

counter_enum! {
    /// Why a datagram goes where it goes. The order is the counter order.
    pub enum Reason {
        Owner,
        Placed,
        Pinned,
        Orphan,
        VersionNegotiation,
        NotQuic,
        NoInstance,
        /// Like `Orphan`, but the DCID does decode, to a server id that is not live: its
        /// instance exited, or has not rejoined a restarted data plane yet.
        Departed,
    }
}

/// Where a datagram goes: `target` indexes [`Table::instances`]; `None` means drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub reason: Reason,
    pub target: Option<usize>,
}

impl Decision {
    const fn drop(reason: Reason) -> Decision {
        Decision { reason, target: None }
    }
}

/// An instance as the controller describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceInfo {
    pub server_id: ServerId,
    /// Accepts new connections (ready and not draining).
    pub placeable: bool,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    info: InstanceInfo,
    seed: u64,
}

/// Errors building a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableError {
    DuplicateServerId(ServerId),
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::DuplicateServerId(id) => write!(f, "server id {id} listed twice"),
        }
    }
}
impl std::error::Error for TableError {}

/// An immutable snapshot of what routing needs: keys and live instances.
/// The data plane swaps whole snapshots (RCU); it never mutates one.
#[derive(Clone, Debug)]
pub struct Table {
    keys: KeySet,
    rendezvous: Rendezvous,
    entries: Vec<Entry>,
    /// (server id, entry index), sorted by id, for O(log n) lookup.
    by_id: Vec<(u16, u32)>,
    any_placeable: bool,
}

impl Table {
    /// `instances` keeps its order: [`Decision::target`] indexes it.
    pub fn new(keys: KeySet, rendezvous_key: [u8; 16], instances: &[InstanceInfo]) -> Result<Table, TableError> {
        let rendezvous = Rendezvous::new(rendezvous_key);
        let entries: Vec<Entry> =
            instances.iter().map(|&info| Entry { info, seed: rendezvous.seed(info.server_id) }).collect();
        let mut by_id: Vec<(u16, u32)> =
            entries.iter().enumerate().map(|(i, e)| (e.info.server_id.0, i as u32)).collect();
        by_id.sort_unstable();
        if let Some(w) = by_id.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(TableError::DuplicateServerId(ServerId(w[0].0)));
        }
        let any_placeable = instances.iter().any(|i| i.placeable);
        Ok(Table { keys, rendezvous, entries, by_id, any_placeable })
    }

    pub fn keys(&self) -> &KeySet {
        &self.keys
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn instance(&self, index: usize) -> Option<InstanceInfo> {
        self.entries.get(index).map(|e| e.info)
    }
    pub fn instances(&self) -> impl Iterator<Item = InstanceInfo> + '_ {
        self.entries.iter().map(|e| e.info)
    }

    /// The entry index of a live server id.
    #[inline]
    pub fn index_of(&self, id: ServerId) -> Option<usize> {
        self.by_id.binary_search_by_key(&id.0, |&(sid, _)| sid).ok().map(|i| self.by_id[i].1 as usize)
    }

    /// Rendezvous winner among placeable instances.
    #[inline]
    fn place(&self, key_hash: u64) -> Option<usize> {
        Rendezvous::pick(
            key_hash,
            self.entries.iter().enumerate().filter(|(_, e)| e.info.placeable).map(|(i, e)| (e.seed, i)),
        )
    }

    /// "Any serving instance": placeable ones first, else any live one.
    #[inline]
    fn any_serving(&self, dcid: &[u8]) -> Option<usize> {
        let h = self.rendezvous.key_hash(dcid);
        if self.any_placeable {
            self.place(h)
        } else {
            Rendezvous::pick(h, self.entries.iter().enumerate().map(|(i, e)| (e.seed, i)))
        }
    }

    #[inline]
    fn owner<D: Decoder>(&self, dcid: &[u8], decoder: &mut D) -> Owner {
        // ADR 0001: only a 12-byte CID with a live `cr` can name an owner.
        match decoder.decode(&self.keys, dcid) {
            Ok(d) => self.index_of(d.server_id).map_or(Owner::NotLive, Owner::Live),
            Err(_) => Owner::Undecodable,
        }
    }

    /// A datagram with no live owner goes to any serving instance (which answers with
    /// a stateless reset, RFC 9000 §10.3), counted as `Departed` when its DCID names
    /// an id that is not live and as `Orphan` when it names none.
    fn orphan(&self, dcid: &[u8], owner: Owner) -> Decision {
        let reason = if owner == Owner::NotLive { Reason::Departed } else { Reason::Orphan };
        match self.any_serving(dcid) {
            Some(i) => Decision { reason, target: Some(i) },
            None => Decision::drop(Reason::NoInstance),
        }
    }
}

/// What a DCID says about its owner under a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Decodes to the live instance at this index.
    Live(usize),
    /// Decodes to a server id no live instance has.
    NotLive,
    /// Does not decode under the table's keys.
    Undecodable,
}

/// Admission control at the one point where a datagram makes new state: a client
/// Initial / 0-RTT with a client-chosen DCID that no live pin covers, about to be
/// placed (and pinned). Owner and Pinned datagrams, short headers and everything else
/// never reach it, so they pay nothing for it.
pub trait Admission {
    /// Why a placement was refused (the caller's own reasons; not a [`Reason`]).
    type Refusal: Copy + Eq + std::fmt::Debug;
    /// `h` would be placed on `target` (an index of [`Table::instances`]).
    /// `Ok(payload)` places it and stores `payload` with its pin (see
    /// [`PinTable::insert_with`]); `Err` drops the datagram instead (no pin is made).
    fn admit(
        &mut self,
        h: &LongHeader<'_>,
        datagram_len: usize,
        table: &Table,
        target: usize,
    ) -> Result<u32, Self::Refusal>;
    /// A payload that [`Admission::admit`] returned left the pin table (expired,
    /// evicted, retargeted, or never stored): called exactly once per payload other
    /// than [`crate::pin::NO_PAYLOAD`].
    fn release(&mut self, payload: u32);
    /// A client Initial whose DCID decodes to a live instance ([`LiveInitial`]): does
    /// it go to that owner as `Owner`, is it placed like a client-chosen DCID (pin,
    /// placement, [`Admission::admit`], Retry), or dropped? Default
    /// [`OwnerInitial::Owner`]: plain ADR 0001 routing.
    ///
    /// A DCID that decodes is no proof of anything: a CID of the sender's own
    /// connection or a Retry's SCID is one anybody can copy. The data plane's answer:
    /// [`crate::limits::owner_initial`] (docs/adr/0003-demux-retry.md "Initials on
    /// live DCIDs").
    #[inline]
    fn owner_initial(&mut self, _initial: &LiveInitial<'_, '_>, _table: &Table) -> OwnerInitial<Self::Refusal> {
        OwnerInitial::Owner
    }
}

/// A client Initial whose DCID decodes to live instance `owner` (an index of
/// [`Table::instances`]), as [`Admission::owner_initial`] is asked about it.
#[derive(Clone, Copy, Debug)]
pub struct LiveInitial<'a, 'h> {
    pub header: &'a LongHeader<'h>,
    /// The whole datagram, or a uniform GRO train of `stride`-byte segments when
    /// `stride > 0` (routed as one: the answer covers every segment); empty from
    /// [`Router::route_header`].
    pub datagram: &'a [u8],
    pub stride: usize,
    pub owner: usize,
}

impl LiveInitial<'_, '_> {
    /// How many datagrams the answer covers: the segments of a GRO train, else 1.
    pub fn segments(&self) -> usize {
        if self.stride > 0 && self.stride < self.datagram.len() {
            self.datagram.len().div_ceil(self.stride)
        } else {
            1
        }
    }
}

/// The admission's answer for a client Initial whose DCID decodes to a live instance
/// ([`Admission::owner_initial`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerInitial<R> {
    /// To its owner, as `Owner`.
    Owner,
    /// Placed like a client-chosen DCID: pinned, or placed through [`Admission::admit`].
    Place,
    /// Dropped with the admission's refusal: nothing forwarded, nothing pinned.
    Refuse(R),
}

/// Admits everything with no payload: plain ADR 0001 routing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoAdmission;

impl Admission for NoAdmission {
    type Refusal = std::convert::Infallible;
    #[inline]
    fn admit(&mut self, _: &LongHeader<'_>, _: usize, _: &Table, _: usize) -> Result<u32, Self::Refusal> {
        Ok(crate::pin::NO_PAYLOAD)
    }
    #[inline]
    fn release(&mut self, _: u32) {}
}

/// `&mut` of an admission is one too: a caller keeps its admission (and its counts)
/// across routers.
impl<A: Admission + ?Sized> Admission for &mut A {
    type Refusal = A::Refusal;
    #[inline]
    fn admit(&mut self, h: &LongHeader<'_>, len: usize, t: &Table, target: usize) -> Result<u32, Self::Refusal> {
        (**self).admit(h, len, t, target)
    }
    #[inline]
    fn release(&mut self, payload: u32) {
        (**self).release(payload)
    }
    #[inline]
    fn owner_initial(&mut self, initial: &LiveInitial<'_, '_>, t: &Table) -> OwnerInitial<Self::Refusal> {
        (**self).owner_initial(initial, t)
    }
}

/// The routing entry point: a table snapshot, the shard's pin table and the time,
/// plus two options with "none" defaults — admission control on new placements
/// ([`Router::with_admission`], default [`NoAdmission`]) and the CID decoder
/// ([`Router::with_decoder`], default [`Uncached`]; a
/// [`crate::decode_cache::DecodeCache`] skips the HMAC for repeat DCIDs). The decision
/// never depends on the decoder: a [`Decoder`] returns exactly [`KeySet::decode`].
///
/// A router is a handful of references, built per datagram or per batch:
///
/// ```
/// # use proto::{cid::*, route::*, pin::PinTable};
/// # use std::time::Duration;
/// # let keys = KeySet::new((Generation::new(1).unwrap(), [1; 32]), None).unwrap();
/// let table = Table::new(keys, [2; 16], &[InstanceInfo { server_id: ServerId(7), placeable: true }]).unwrap();
/// let mut pins = PinTable::new(16, [3; 16]);
/// let cid = table.keys().encode(ServerId(7), &[9; 10]);
/// let mut dg = vec![0x40];
/// dg.extend_from_slice(&cid);
/// dg.resize(1200, 0);
/// let Ok(d) = Router::new(&table, &mut pins, Duration::ZERO).route(&dg);
/// assert_eq!(d, Decision { reason: Reason::Owner, target: Some(0) });
/// ```
pub struct Router<'r, A = NoAdmission, D = Uncached> {
    table: &'r Table,
    pins: &'r mut PinTable,
    now: Duration,
    admission: A,
    decoder: D,
}

impl<'r> Router<'r> {
    /// Plain ADR 0001 routing: every placement admitted, every DCID decoded anew.
    pub fn new(table: &'r Table, pins: &'r mut PinTable, now: Duration) -> Router<'r> {
        Router { table, pins, now, admission: NoAdmission, decoder: Uncached }
    }
}

impl<'r, A: Admission, D: Decoder> Router<'r, A, D> {
    /// Admission control on new placements (pass `&mut a` to keep `a`).
    pub fn with_admission<B: Admission>(self, admission: B) -> Router<'r, B, D> {
        let Router { table, pins, now, decoder, .. } = self;
        Router { table, pins, now, admission, decoder }
    }

    /// Decodes DCIDs through `decoder` (pass `&mut cache` to keep the cache).
    pub fn with_decoder<E: Decoder>(self, decoder: E) -> Router<'r, A, E> {
        let Router { table, pins, now, admission, .. } = self;
        Router { table, pins, now, admission, decoder }
    }

    /// Routes one datagram (a single UDP payload, possibly of coalesced packets;
    /// RFC 9000 §12.2 has them share one DCID, so the first header decides). `Err` is
    /// the refusal of the admission (the datagram is dropped, nothing was pinned);
    /// with [`NoAdmission`] it cannot happen (`let Ok(d) = router.route(..)`).
    #[inline]
    pub fn route(&mut self, datagram: &[u8]) -> Result<Decision, A::Refusal> {
        match header::parse(datagram, CID_LEN) {
            Ok(h) => self.route_parsed(&h, datagram.len(), datagram, 0),
            Err(_) => Ok(Decision::drop(Reason::NotQuic)),
        }
    }

    /// [`Router::route`] for a header already parsed from a datagram of
    /// `datagram_len` bytes. Not API: the benches measure the decision without the
    /// parse through it.
    #[doc(hidden)]
    #[inline]
    pub fn route_header(&mut self, h: &Header<'_>, datagram_len: usize) -> Result<Decision, A::Refusal> {
        self.route_parsed(h, datagram_len, &[], 0)
    }

    /// `datagram` (+ `stride`, a uniform train): the bytes `h` was parsed from, for
    /// [`Admission::owner_initial`] (empty when the caller has none).
    #[inline]
    fn route_parsed(
        &mut self,
        h: &Header<'_>,
        datagram_len: usize,
        datagram: &[u8],
        stride: usize,
    ) -> Result<Decision, A::Refusal> {
        let (table, now) = (self.table, self.now);
        let (pins, admission, decoder) = (&mut *self.pins, &mut self.admission, &mut self.decoder);
        Ok(match *h {
            // RFC 9000 §17.2.1: only servers send Version Negotiation; a server drops it.
            Header::VersionNegotiation { .. } => Decision::drop(Reason::NotQuic),
            Header::UnsupportedVersion { dcid, .. } => {
                // RFC 9000 §5.2.2: answer with VN only if large enough to start a connection.
                if datagram_len < MIN_INITIAL_DATAGRAM {
                    return Ok(Decision::drop(Reason::NotQuic));
                }
                match table.any_serving(dcid) {
                    Some(i) => Decision { reason: Reason::VersionNegotiation, target: Some(i) },
                    None => Decision::drop(Reason::NoInstance),
                }
            }
            Header::Short { dcid } => match table.owner(dcid, decoder) {
                Owner::Live(i) => Decision { reason: Reason::Owner, target: Some(i) },
                other => table.orphan(dcid, other),
            },
            Header::Long(ref l) => {
                let owner = table.owner(l.dcid, decoder);
                if let Owner::Live(i) = owner {
                    // An Initial's DCID proves nothing by itself (it may be copied):
                    // the admission decides whether it goes to its owner, is placed
                    // like a client-chosen DCID, or is dropped (Admission::owner_initial).
                    let to_owner = Ok(Decision { reason: Reason::Owner, target: Some(i) });
                    if l.ty != LongType::Initial {
                        return to_owner;
                    }
                    let initial = LiveInitial { header: l, datagram, stride, owner: i };
                    match admission.owner_initial(&initial, table) {
                        OwnerInitial::Owner => return to_owner,
                        OwnerInitial::Refuse(r) => return Err(r),
                        OwnerInitial::Place => {}
                    }
                }
                match l.ty {
                    LongType::Initial | LongType::ZeroRtt => {
                        // RFC 9000 §14.1: Initials travel in datagrams of ≥ 1200 bytes.
                        if l.ty == LongType::Initial && datagram_len < MIN_INITIAL_DATAGRAM {
                            return Ok(Decision::drop(Reason::NotQuic));
                        }
                        return place(l, datagram_len, table, pins, now, admission);
                    }
                    LongType::Handshake => table.orphan(l.dcid, owner),
                    // RFC 9000 §17.2.5: only servers send Retry.
                    LongType::Retry => Decision::drop(Reason::NotQuic),
                }
            }
        })
    }

    /// Routes a GRO train of `stride`-byte segments (the last may be shorter; a
    /// `stride` of 0 or ≥ the train's length: one datagram). When every segment
    /// parses with the first segment's DCID the train is routed once and travels
    /// whole; otherwise each segment is routed by itself and consecutive segments with
    /// the same decision are merged. `out` receives the runs in order, each with the
    /// admission's refusal if it had one: then
    /// `decision == Decision { reason: Placed, target: None }` (the admission dropped
    /// it, before placement or on its way to its owner; nothing was pinned). A uniform
    /// train is admitted once, as it is routed once. An empty train has no runs.
    pub fn route_train(&mut self, train: &[u8], stride: usize, mut out: impl FnMut(TrainRun, Option<A::Refusal>)) {
        if train.is_empty() {
            return;
        }
        if stride == 0 || stride >= train.len() {
            let (decision, refused) = split(self.route(train));
            out(TrainRun { bytes: 0..train.len(), segments: 1, decision }, refused);
            return;
        }
        let first = &train[..stride];
        let first_hdr = header::parse(first, CID_LEN);
        let uniform = match &first_hdr {
            Ok(h0) => train
                .chunks(stride)
                .skip(1)
                .all(|seg| matches!(header::parse(seg, CID_LEN), Ok(h) if h.dcid() == h0.dcid())),
            Err(_) => false,
        };
        if let (true, Ok(h0)) = (uniform, &first_hdr) {
            let (decision, refused) = split(self.route_parsed(h0, first.len(), train, stride));
            let segments = train.len().div_ceil(stride);
            out(TrainRun { bytes: 0..train.len(), segments, decision }, refused);
            return;
        }
        let mut run: Option<(TrainRun, Option<A::Refusal>)> = None;
        for (k, seg) in train.chunks(stride).enumerate() {
            let (decision, refused) = split(self.route(seg));
            let start = k * stride;
            let end = start + seg.len();
            match &mut run {
                Some((r, rf)) if r.decision == decision && *rf == refused => {
                    r.bytes.end = end;
                    r.segments += 1;
                }
                _ => {
                    if let Some((r, rf)) = run.take() {
                        out(r, rf);
                    }
                    run = Some((TrainRun { bytes: start..end, segments: 1, decision }, refused));
                }
            }
        }
        if let Some((r, rf)) = run {
            out(r, rf);
        }
    }
}

/// Placement of a client-chosen DCID: the pin if it still names a live instance,
/// else the rendezvous winner among placeable instances, admitted and pinned.
fn place<A: Admission>(
    l: &LongHeader<'_>,
    datagram_len: usize,
    table: &Table,
    pins: &mut PinTable,
    now: Duration,
    admission: &mut A,
) -> Result<Decision, A::Refusal> {
    let dcid = l.dcid;
    if let Some(i) = pins.get(dcid, now).and_then(|id| table.index_of(id)) {
        return Ok(Decision { reason: Reason::Pinned, target: Some(i) });
    }
    match table.place(table.rendezvous.key_hash(dcid)) {
        Some(i) => {
            let payload = admission.admit(l, datagram_len, table, i)?;
            pins.insert_with(dcid, table.entries[i].info.server_id, now, payload, |p| admission.release(p));
            Ok(Decision { reason: Reason::Placed, target: Some(i) })
        }
        None => Ok(Decision::drop(Reason::NoInstance)),
    }
}

/// A run of consecutive segments of a GRO train that go to the same place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainRun {
    /// Byte range within the train.
    pub bytes: std::ops::Range<usize>,
    /// Segments in the run (each is one datagram for the counters).
    pub segments: usize,
    pub decision: Decision,
}

fn split<R>(r: Result<Decision, R>) -> (Decision, Option<R>) {
    match r {
        Ok(d) => (d, None),
        Err(e) => (Decision::drop(Reason::Placed), Some(e)),
    }
}
