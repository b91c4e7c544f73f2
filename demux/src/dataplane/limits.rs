//! Per-source limits of the data plane (proto::limits):
//! one [`RateSketch`] (new connections per client) and one [`ConcurrencySketch`]
//! (concurrent pinned handshakes per client) per data plane, shared by every shard
//! through an `Arc`: fixed memory, lock-free, one CAS per decision.
//!
//! Only a client Initial / 0-RTT that would be **placed** (no live pin, DCID not one
//! of ours) reaches [`ShardAdmission::admit`] (proto::route::Admission), and a client
//! Initial whose DCID is one of ours reaches [`ShardAdmission::owner_initial`]
//! (proto::limits::owner_initial: a valid token, a ClientHello, a follow-up of this
//! shard's own placement of its 4-tuple, or the limits and pressure below). Other
//! Owner and Pinned datagrams and short headers pay nothing — no hash, no atomic.
//!
//! A placement takes a concurrency ticket first (reversible), then asks the rate
//! sketch; a rate refusal gives the ticket straight back. The ticket travels with the
//! pin (its raw `u32` is the pin's payload) and is released exactly once when the pin
//! expires, is evicted, is retargeted, or the shard's table is drained on exit.

use crate::dataplane::pressure::Pressure;
use proto::header::LongHeader;
use proto::limits::owner_initial::{self, Outcome, OwnerInitialQuery, UnprovenLimits};
use proto::limits::{
    ClientKey, ConcurrencySketch, FollowUps, Gcra, RateSketch, Ticket, DEFAULT_BURST, DEFAULT_CONCURRENCY_WORDS,
    DEFAULT_MAX_HANDSHAKES, DEFAULT_RATE_PER_SECOND, DEFAULT_TICKS_PER_SECOND, MAX_CAP, MAX_WORDS,
};
use proto::pin::NO_PAYLOAD;
use proto::route::{Admission, LiveInitial, OwnerInitial};
use proto::Table;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The flags' values (`demux dataplane --limit-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitsConfig {
    pub enabled: bool,
    /// New connections per second per client, sustained (1..=1000: 1 ms ticks).
    pub rate_per_second: u32,
    /// New connections per client at once.
    pub burst: u32,
    /// Concurrent pinned handshakes per client (0 refuses every placement).
    pub handshakes: u16,
    /// Words of each sketch (rounded up to a power of two; 8 bytes each).
    pub table_words: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            enabled: true,
            rate_per_second: DEFAULT_RATE_PER_SECOND,
            burst: DEFAULT_BURST,
            handshakes: DEFAULT_MAX_HANDSHAKES,
            table_words: DEFAULT_CONCURRENCY_WORDS,
        }
    }
}

/// Why a placement was refused: counted per shard, never a proto Reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The client's new-connection rate (GCRA) is spent.
    RateLimited,
    /// The client holds its cap of pinned handshakes.
    HandshakeLimited,
    /// A token-less Initial while Retry is on: answer it with a Retry naming
    /// `target` (an index of the table's instances) instead of placing it.
    Retry { target: usize },
    /// A token-less Initial for an instance above `--pressure-drop-above` handshakes
    /// (crate::dataplane::pressure): dropped.
    Overloaded,
    /// An Initial over its client's limits (`why`) that has no valid token, while the
    /// demux can mint: a Retry instead of silence (RFC 9000
    /// §8.1.2). An honest client behind a shared address comes back validated and
    /// routes as Owner; a spoofed one never does.
    RetryOverLimit { target: usize, why: OverLimit },
    /// A client Initial on a live DCID dropped on its way to its owner
    /// (proto::limits::owner_initial; counted there, by outcome).
    OwnerInitial(Outcome),
}

/// Which limit an over-limit Initial met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverLimit {
    Rate,
    Handshakes,
}

/// The sketches, shared by all shards of one data plane.
#[derive(Debug)]
pub struct Limits {
    sketches: Option<(RateSketch, ConcurrencySketch)>,
    cap: u16,
    /// Demux-minted Retry (crate::dataplane::retry); `None`: off.
    pub retry: Option<crate::dataplane::retry::RetryConfig>,
    /// The instances' token key (the key file's `token` secret), to validate tokens
    /// of Initials (proto::token); `None` until [`Limits::with_retry`].
    pub token_key: Option<proto::token::TokenKey>,
    /// Workers' `HandshakeDone` notices, registry → shards (tickets leave early).
    pub handshakes_done: std::sync::Arc<crate::dataplane::handshakes::HandshakesDone>,
    /// The data plane's monotonic clock origin: shards route with `epoch.elapsed()`
    /// and the rate sketch counts milliseconds from it.
    pub epoch: Instant,
}

impl Limits {
    pub fn new(cfg: LimitsConfig) -> anyhow::Result<Limits> {
        let epoch = Instant::now();
        if !cfg.enabled {
            return Ok(Limits {
                sketches: None,
                cap: 0,
                retry: None,
                token_key: None,
                handshakes_done: Default::default(),
                epoch,
            });
        }
        anyhow::ensure!(
            (1..=DEFAULT_TICKS_PER_SECOND as u32).contains(&cfg.rate_per_second),
            "--limit-rate must be 1..=1000 per second (1 ms ticks); use --limits off to disable"
        );
        let gcra = Gcra::per_second(cfg.rate_per_second, cfg.burst, DEFAULT_TICKS_PER_SECOND).ok_or_else(|| {
            anyhow::anyhow!(
                "--limit-burst {} with --limit-rate {}: need burst >= 1 and burst * (1000 / rate) <= {} ms",
                cfg.burst,
                cfg.rate_per_second,
                proto::limits::rate::MAX_SPAN
            )
        })?;
        anyhow::ensure!(cfg.handshakes <= MAX_CAP, "--limit-handshakes must be at most {MAX_CAP}");
        anyhow::ensure!((1..=MAX_WORDS).contains(&cfg.table_words), "--limit-table-words must be 1..={MAX_WORDS}");
        let mut k1 = [0u8; 16];
        let mut k2 = [0u8; 16];
        sys::os_random(&mut k1)?;
        sys::os_random(&mut k2)?;
        let rate = RateSketch::new(cfg.table_words, k1, gcra, 0);
        let conc = ConcurrencySketch::new(cfg.table_words, k2);
        Ok(Limits {
            sketches: Some((rate, conc)),
            cap: cfg.handshakes,
            retry: None,
            token_key: None,
            handshakes_done: Default::default(),
            epoch,
        })
    }

    /// Turns demux-minted Retry on (`mode` other than Off) with the key file's token
    /// secret; token validation (proto::token) is on whatever the mode.
    pub fn with_retry(mut self, mode: crate::dataplane::retry::RetryMode, token_secret: [u8; 32]) -> Limits {
        self.token_key = Some(proto::token::TokenKey::new(&token_secret));
        if mode != crate::dataplane::retry::RetryMode::Off {
            self.retry = Some(crate::dataplane::retry::RetryConfig { mode, token_secret });
        }
        self
    }

    pub fn enabled(&self) -> bool {
        self.sketches.is_some()
    }

    /// Bytes of sketch memory (status).
    pub fn table_bytes(&self) -> usize {
        self.sketches.as_ref().map_or(0, |(r, c)| 8 * (r.words() + c.words()))
    }

    /// Admits one new placement of `client` at `ms` milliseconds since [`Limits::epoch`]:
    /// the raw ticket to store with the pin, or why not.
    #[inline]
    pub fn admit(&self, client: SocketAddr, ms: u64) -> Result<u32, Refusal> {
        let Some((rate, conc)) = &self.sketches else {
            return Ok(NO_PAYLOAD);
        };
        let key = ClientKey::from(client);
        let ticket = conc.try_acquire(key, self.cap).ok_or(Refusal::HandshakeLimited)?;
        if !rate.try_admit(key, ms) {
            conc.release(ticket);
            return Err(Refusal::RateLimited);
        }
        Ok(ticket.to_raw())
    }

    /// Whether `client` holds its cap of pinned handshakes (nothing is taken): an
    /// unproven Initial on a live DCID from it is dropped (proto::limits::owner_initial).
    #[inline]
    pub fn handshakes_full(&self, client: SocketAddr) -> bool {
        self.sketches.as_ref().is_some_and(|(_, conc)| conc.full(ClientKey::from(client), self.cap))
    }

    /// Charges one new connection of `client` at `ms` to its rate, as a placement
    /// does, without a ticket: an unproven Initial on a live DCID makes no pin.
    /// `false` when the rate is spent.
    #[inline]
    pub fn charge_rate(&self, client: SocketAddr, ms: u64) -> bool {
        self.sketches.as_ref().is_none_or(|(rate, _)| rate.try_admit(ClientKey::from(client), ms))
    }

    /// Gives back a ticket [`Limits::admit`] handed out (the pin left the table).
    #[inline]
    pub fn release(&self, raw: u32) {
        if let (Some((_, conc)), Some(t)) = (&self.sketches, Ticket::from_raw(raw)) {
            conc.release(t);
        }
    }
}

/// One routing call's view of the limits: the datagram's client and the time.
pub struct ShardAdmission<'a> {
    pub limits: &'a Limits,
    pub client: SocketAddr,
    pub ms: u64,
    /// The router's clock (`ms` as a Duration: follow-up lifetimes).
    pub now: Duration,
    /// Wall-clock Unix seconds (token expiry, proto::token), once per batch.
    pub unix: u64,
    /// This shard's Retry gate, when Retry is configured.
    pub retry: Option<&'a mut crate::dataplane::retry::RetryGate>,
    /// This shard's follow-up evidence (proto::limits::follow_up): granted when an
    /// Initial is admitted and placed, spent by Initials on that instance's CIDs.
    pub follow_ups: &'a mut FollowUps,
    /// The snapshot's per-instance pressure: an unproven Initial on a live DCID of an
    /// instance under pressure is dropped (the placement path's pressure is
    /// crate::dataplane::pressure::PressureAdmission).
    pub pressure: &'a [Pressure],
    /// The shard's counters (written by this thread only): client Initials on a live
    /// DCID are counted by outcome (proto::limits::owner_initial), in datagrams (a
    /// uniform GRO train counts its segments), when decided.
    pub counters: &'a crate::dataplane::counters::ShardCounters,
}

impl ShardAdmission<'_> {
    /// Whether `token` is valid for this client (proto::token: quinn's Retry or
    /// NEW_TOKEN format, bound to the address, not expired).
    fn token_valid(&self, token: &[u8]) -> bool {
        !token.is_empty()
            && self.limits.token_key.as_ref().is_some_and(|k| k.check(token, self.client, self.unix).is_valid())
    }
}

/// The limits an unproven Initial on a live DCID meets (proto::limits::owner_initial
/// step 4): the owner's pressure, the Retry gate, the handshake cap, the rate.
struct Unproven<'s, 'a> {
    limits: &'a Limits,
    client: SocketAddr,
    ms: u64,
    retry: Option<&'s mut crate::dataplane::retry::RetryGate>,
    pressure: &'a [Pressure],
}

impl UnprovenLimits for Unproven<'_, '_> {
    #[inline]
    fn pressured(&self, owner: usize) -> bool {
        // Either level: what would be a Retry for a new Initial is a drop here (a
        // client past its first flight discards a Retry, RFC 9000 §17.2.5.2).
        matches!(self.pressure.get(owner), Some(Pressure::Retry | Pressure::Drop))
    }
    #[inline]
    fn retrying(&mut self) -> bool {
        let ms = self.ms;
        self.retry.as_deref_mut().is_some_and(|g| g.want_retry(ms))
    }
    #[inline]
    fn handshakes_full(&self) -> bool {
        self.limits.handshakes_full(self.client)
    }
    #[inline]
    fn charge_rate(&mut self) -> bool {
        self.limits.charge_rate(self.client, self.ms)
    }
}

impl Admission for ShardAdmission<'_> {
    type Refusal = Refusal;

    #[inline]
    fn admit(&mut self, h: &LongHeader<'_>, _: usize, table: &Table, target: usize) -> Result<u32, Refusal> {
        // RFC 9000 §8.1.2: a token-less Initial may be answered with a Retry; one that
        // carries a token (a Retry's or a NEW_TOKEN's) goes on to its instance, which
        // validates it. Retry comes first: a spoofed source gets a Retry and costs
        // nobody's limits (its address may be a victim's).
        if h.ty == proto::LongType::Initial && h.token.is_empty() {
            if let Some(g) = self.retry.as_deref_mut() {
                if g.want_retry(self.ms) {
                    return Err(Refusal::Retry { target });
                }
            }
        }
        match self.limits.admit(self.client, self.ms) {
            Ok(t) => {
                // Placed: this 4-tuple's next token-less Initials on the instance's
                // own CIDs are its follow-ups (docs/adr/0003 "Initials on live DCIDs").
                if let Some(info) = table.instance(target) {
                    self.follow_ups.grant(self.client, info.server_id, self.now);
                }
                Ok(t)
            }
            // Over the limit: a Retry, not silence, while the demux can mint (a v1
            // Initial: quinn's Retry; RFC 9000 §8.1.2, §17.2.5) and the Initial has no
            // valid token — an address-validated source over its limit is dropped.
            Err(why @ (Refusal::RateLimited | Refusal::HandshakeLimited))
                if h.ty == proto::LongType::Initial
                    && h.version == proto::header::VERSION_1
                    && self.retry.is_some()
                    && !self.token_valid(h.token) =>
            {
                let why = if why == Refusal::RateLimited { OverLimit::Rate } else { OverLimit::Handshakes };
                Err(Refusal::RetryOverLimit { target, why })
            }
            Err(e) => Err(e),
        }
    }

    #[inline]
    fn release(&mut self, payload: u32) {
        self.limits.release(payload);
    }

    /// A client Initial whose DCID decodes to a live id (proto::limits::owner_initial,
    /// docs/adr/0003 "Initials on live DCIDs"): a valid token or a follow-up of this
    /// shard's placement of its 4-tuple goes to the owner; a ClientHello is placed
    /// and admitted like any new Initial; anything else meets the owner's pressure,
    /// the Retry gate and the client's limits, and goes to the owner only within them.
    #[inline]
    fn owner_initial(&mut self, initial: &LiveInitial<'_, '_>, table: &Table) -> OwnerInitial<Refusal> {
        let Some(info) = table.instance(initial.owner) else { return OwnerInitial::Owner };
        let q = OwnerInitialQuery::new(initial, self.client, info.server_id, self.now, self.unix);
        let mut limits = Unproven {
            limits: self.limits,
            client: self.client,
            ms: self.ms,
            retry: self.retry.as_deref_mut(),
            pressure: self.pressure,
        };
        let outcome = owner_initial::decide(self.limits.token_key.as_ref(), self.follow_ups, &q, &mut limits);
        crate::dataplane::counters::bump(&self.counters.owner_initial[outcome.index()], initial.segments() as u64);
        match outcome {
            Outcome::Placed => OwnerInitial::Place,
            o if o.to_owner() => OwnerInitial::Owner,
            o => OwnerInitial::Refuse(Refusal::OwnerInitial(o)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dataplane::counters::ShardCounters;
    use std::sync::atomic::Ordering::Relaxed;

    /// A shard's admission for `client` at `ms`, with no pressure.
    fn admission<'a>(
        limits: &'a Limits,
        client: SocketAddr,
        ms: u64,
        unix: u64,
        retry: Option<&'a mut crate::dataplane::retry::RetryGate>,
        follow_ups: &'a mut FollowUps,
        counters: &'a ShardCounters,
    ) -> ShardAdmission<'a> {
        ShardAdmission {
            limits,
            client,
            ms,
            now: Duration::from_millis(ms),
            unix,
            retry,
            follow_ups,
            pressure: &[],
            counters,
        }
    }

    #[test]
    fn off_admits_everything_without_tickets() {
        let l = Limits::new(LimitsConfig { enabled: false, ..Default::default() }).unwrap();
        for i in 0..10_000 {
            assert_eq!(l.admit("192.0.2.1:1".parse().unwrap(), i), Ok(NO_PAYLOAD));
        }
    }

    #[test]
    fn burst_then_rate_then_handshakes() {
        let cfg = LimitsConfig { rate_per_second: 10, burst: 5, handshakes: 8, table_words: 64, enabled: true };
        let l = Limits::new(cfg).unwrap();
        let a: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let tickets: Vec<u32> = (0..5).map(|_| l.admit(a, 0).unwrap()).collect();
        assert_eq!(l.admit(a, 0), Err(Refusal::RateLimited));
        // Another port, same address: the same client.
        assert_eq!(l.admit("192.0.2.1:2".parse().unwrap(), 0), Err(Refusal::RateLimited));
        // 100 ms later one more.
        let t6 = l.admit(a, 100).unwrap();
        // Two more over time reach the cap of 8 live tickets.
        let more: Vec<u32> = (2..4).map(|k| l.admit(a, 100 * k).unwrap()).collect();
        assert_eq!(l.admit(a, 10_000), Err(Refusal::HandshakeLimited));
        l.release(t6);
        assert!(l.admit(a, 10_000).is_ok());
        for t in tickets.into_iter().chain(more) {
            l.release(t);
        }
        assert!(l.admit("198.51.100.7:9".parse().unwrap(), 10_000).is_ok());
    }

    /// RFC 9000 §8.1.2: only a token-less Initial gets a Retry; one with a token and
    /// 0-RTT go on to the limits (and are placed).
    #[test]
    fn retry_only_for_token_less_initials() {
        use proto::header::LongHeader;
        use proto::LongType;
        let l = Limits::new(LimitsConfig::default()).unwrap();
        let keys = proto::KeySet::new((proto::Generation::new(0).unwrap(), [1; 32]), None).unwrap();
        let info = [proto::InstanceInfo { server_id: proto::ServerId(1), placeable: true }];
        let table = Table::new(keys, [2; 16], &info).unwrap();
        let mut gate = crate::dataplane::retry::RetryGate::new(crate::dataplane::retry::RetryMode::Always);
        let (mut fu, c) = (FollowUps::new(64, [0; 16]), ShardCounters::new(1));
        let mut a = admission(&l, "192.0.2.1:1".parse().unwrap(), 0, 0, Some(&mut gate), &mut fu, &c);
        let h = |ty, token| LongHeader { version: 1, ty, dcid: &[1; 8], scid: &[], token, packet_len: 1200 };
        assert_eq!(a.admit(&h(LongType::Initial, &[]), 1200, &table, 0), Err(Refusal::Retry { target: 0 }));
        let t = a.admit(&h(LongType::Initial, &[9; 40]), 1200, &table, 0).expect("token: limits, admitted");
        a.release(t);
        let t = a.admit(&h(LongType::ZeroRtt, &[]), 1200, &table, 0).expect("0-RTT: limits, admitted");
        a.release(t);
    }

    /// Issue "overload" item 2: over the limit, a Retry instead of silence while the
    /// demux can mint; a valid token (address already validated), 0-RTT, v2 or no
    /// minter: dropped as before.
    #[test]
    fn over_limit_gets_a_retry_unless_validated() {
        use proto::header::LongHeader;
        use proto::LongType;
        let cfg = LimitsConfig { rate_per_second: 1, burst: 1, handshakes: 8, table_words: 64, enabled: true };
        let l = Limits::new(cfg).unwrap().with_retry(crate::dataplane::retry::RetryMode::Auto { above: 1000 }, [4; 32]);
        let keys = proto::KeySet::new((proto::Generation::new(0).unwrap(), [1; 32]), None).unwrap();
        let table =
            Table::new(keys, [2; 16], &[proto::InstanceInfo { server_id: proto::ServerId(1), placeable: true }])
                .unwrap();
        let client: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let valid = proto::token::TokenKey::new(&[4; 32]).seal(client, None, 100, [1; 16]).unwrap();
        let mut gate =
            crate::dataplane::retry::RetryGate::new(crate::dataplane::retry::RetryMode::Auto { above: 1000 });
        let (mut fu, c) = (FollowUps::new(64, [0; 16]), ShardCounters::new(1));
        let mut a = admission(&l, client, 0, 100, Some(&mut gate), &mut fu, &c);
        let h = |version, ty, token| LongHeader { version, ty, dcid: &[1; 8], scid: &[], token, packet_len: 1200 };
        let t = a.admit(&h(1, LongType::Initial, &[]), 1200, &table, 0).expect("first: within the burst");
        let over = Err(Refusal::RetryOverLimit { target: 0, why: OverLimit::Rate });
        assert_eq!(a.admit(&h(1, LongType::Initial, &[]), 1200, &table, 0), over);
        assert_eq!(a.admit(&h(1, LongType::Initial, &[9; 50]), 1200, &table, 0), over, "garbage token");
        assert_eq!(a.admit(&h(1, LongType::Initial, &valid), 1200, &table, 0), Err(Refusal::RateLimited));
        assert_eq!(a.admit(&h(1, LongType::ZeroRtt, &[]), 1200, &table, 0), Err(Refusal::RateLimited));
        assert_eq!(
            a.admit(&h(proto::header::VERSION_2, LongType::Initial, &[]), 1200, &table, 0),
            Err(Refusal::RateLimited)
        );
        a.retry = None;
        assert_eq!(a.admit(&h(1, LongType::Initial, &[]), 1200, &table, 0), Err(Refusal::RateLimited), "cannot mint");
        a.release(t);
    }

    /// The data plane's side of proto::limits::owner_initial, through the real router
    /// and the real sketches: an unproven Initial on a live DCID (CRYPTO at offset 1)
    /// meets the owner's pressure (either level: a drop), the Retry gate (a drop), the
    /// handshake cap and the rate, in that order, and costs the rate only when it gets
    /// that far; a follow-up of the client's own placement, a valid token, and a
    /// ClientHello (placed) skip all that. Counted by outcome.
    #[test]
    fn owner_initials_meet_pressure_retry_cap_and_rate_unless_proven() {
        use crate::dataplane::retry::{RetryGate, RetryMode};
        use proto::initial::build_client_initial;
        use proto::{Decision, InstanceInfo, PinTable, Reason, ServerId};
        let secret = [4; 32];
        let cfg = LimitsConfig { rate_per_second: 1, burst: 2, handshakes: 2, table_words: 1024, enabled: true };
        let l = Limits::new(cfg).unwrap().with_retry(RetryMode::Auto { above: 1_000_000 }, secret);
        let keys = proto::KeySet::new((proto::Generation::new(0).unwrap(), [1; 32]), None).unwrap();
        let infos = [1, 2].map(|i| InstanceInfo { server_id: ServerId(i), placeable: true });
        let table = Table::new(keys.clone(), [2; 16], &infos).unwrap();
        let mut pins = PinTable::new(64, [3; 16]);
        let mut fu = FollowUps::new(64, [5; 16]);
        let mut gate = RetryGate::new(RetryMode::Auto { above: 1_000_000 });
        let owned = |id: u16, n: u8| keys.encode(ServerId(id), &[n; 10]);
        let initial = |dcid: &[u8], token: &[u8], frames: &[u8]| {
            build_client_initial(1, dcid, &[7; 8], token, 1, frames, 1200).unwrap()
        };
        let offset1 = |dcid: &[u8]| initial(dcid, &[], &[6, 1, 2, 0xaa, 0xbb]);
        let unix = 1_800_000_000;
        // (outcome counts, routing result)
        let mut route = |client: &str, ms: u64, d: &[u8], pressure: &[Pressure], gate: Option<&mut RetryGate>| {
            let c = ShardCounters::new(1);
            let mut a = admission(&l, client.parse().unwrap(), ms, unix, gate, &mut fu, &c);
            a.pressure = pressure;
            let r = proto::Router::new(&table, &mut pins, Duration::from_millis(ms)).with_admission(&mut a).route(d);
            let counts: Vec<u64> = c.owner_initial.iter().map(|n| n.load(Relaxed)).collect();
            let outcome = Outcome::ALL.into_iter().find(|o| counts[o.index()] > 0);
            assert!(counts.iter().sum::<u64>() <= 1, "counted once: {counts:?}");
            (outcome, r)
        };
        let owner = |i| Ok(Decision { reason: Reason::Owner, target: Some(i) });
        let dropped = |o| Err(Refusal::OwnerInitial(o));

        // Burst 2: two unproven Initials reach the owner, the third is rate-limited.
        let a = "192.0.2.1:1000";
        for n in 0..2 {
            assert_eq!(route(a, 0, &offset1(&owned(1, n)), &[], None), (Some(Outcome::Admitted), owner(0)));
        }
        let rl = Outcome::RateLimited;
        assert_eq!(route(a, 0, &offset1(&owned(1, 9)), &[], None), (Some(rl), dropped(rl)));
        // Pressure (either level) and the Retry gate drop before the rate is charged:
        // a second later exactly one is admitted again.
        let dp = Outcome::DroppedPressure;
        for p in [Pressure::Retry, Pressure::Drop] {
            assert_eq!(route(a, 1000, &offset1(&owned(1, 3)), &[p], None), (Some(dp), dropped(dp)));
        }
        assert_eq!(
            route(a, 1000, &offset1(&owned(2, 3)), &[Pressure::Drop, Pressure::Normal], None).0,
            Some(Outcome::Admitted),
            "the other instance is not pressured"
        );
        let mut always = RetryGate::new(RetryMode::Always);
        let dr = Outcome::DroppedRetry;
        assert_eq!(route(a, 2000, &offset1(&owned(1, 4)), &[], Some(&mut always)), (Some(dr), dropped(dr)));
        assert_eq!(route(a, 2000, &offset1(&owned(1, 4)), &[], Some(&mut gate)).0, Some(Outcome::Admitted));
        assert_eq!(route(a, 2000, &offset1(&owned(1, 5)), &[], None).0, Some(rl));

        // The cap: a client holding two pinned handshakes gets no unproven Initial
        // through, whatever its rate.
        let b = "192.0.2.2:2000";
        for n in 0..2u8 {
            let (o, r) = route(b, 0, &initial(&[n; 8], &[], &[6, 0, 2, 1, 0]), &[], None);
            assert_eq!((o, r.map(|d| d.reason)), (None, Ok(Reason::Placed)));
        }
        let hl = Outcome::HandshakeLimited;
        assert_eq!(route(b, 5000, &offset1(&owned(1, 6)), &[], None), (Some(hl), dropped(hl)));

        // A follow-up: client c placed on instance w (client-chosen DCID), then
        // token-less non-ClientHello Initials on w's CIDs from the same 4-tuple go to w
        // under pressure and Retry, 8 times (FOLLOW_UP_ALLOWANCE); then they are
        // unproven. Another port of the same address has no follow-ups.
        let c = "192.0.2.3:3000";
        let placed = route(c, 10_000, &initial(&[9; 8], &[], &[6, 0, 2, 1, 0]), &[], None).1.unwrap();
        let w = placed.target.unwrap();
        let w_id = table.instance(w).unwrap().server_id.0;
        let pressured = [Pressure::Drop, Pressure::Drop];
        let ack = |n| initial(&owned(w_id, n), &[], &[2, 0, 0, 0, 0]);
        assert_eq!(route("192.0.2.3:3001", 10_001, &ack(0), &pressured, None), (Some(dp), dropped(dp)));
        for n in 0..proto::limits::FOLLOW_UP_ALLOWANCE {
            let mut always = RetryGate::new(RetryMode::Always);
            let got = route(c, 10_001, &ack(n), &pressured, Some(&mut always));
            assert_eq!(got, (Some(Outcome::FollowUp), owner(w)), "follow-up {n}");
        }
        assert_eq!(route(c, 10_001, &ack(99), &pressured, None), (Some(dp), dropped(dp)), "allowance spent");

        // A valid token: the owner, under pressure and Retry.
        let token =
            proto::token::TokenKey::new(&secret).seal(a.parse().unwrap(), Some(&[1; 8]), unix, [2; 16]).unwrap();
        let mut always = RetryGate::new(RetryMode::Always);
        let got = route(a, 20_000, &initial(&owned(1, 7), &token, &[6, 1, 1, 0]), &pressured, Some(&mut always));
        assert_eq!(got, (Some(Outcome::Token), owner(0)));
        // ClientHellos on copied CIDs: placed and admitted like new Initials (pinned,
        // a ticket each), then over the cap of 2: a Retry, not the owner.
        for n in 0..3u8 {
            let (o, r) = route(a, 20_000, &initial(&owned(1, 10 + n), &[], &[6, 0, 2, 1, 0]), &[], Some(&mut gate));
            assert_eq!(o, Some(Outcome::Placed));
            match n {
                0 | 1 => assert_eq!(r.map(|d| d.reason), Ok(Reason::Placed)),
                _ => assert!(matches!(r, Err(Refusal::RetryOverLimit { why: OverLimit::Handshakes, .. })), "{r:?}"),
            }
        }
    }

    #[test]
    fn bad_flags_are_refused() {
        let bad = |c: LimitsConfig| Limits::new(c).is_err();
        assert!(bad(LimitsConfig { rate_per_second: 0, ..Default::default() }));
        assert!(bad(LimitsConfig { rate_per_second: 2000, ..Default::default() }));
        assert!(bad(LimitsConfig { rate_per_second: 1, burst: 100, ..Default::default() }));
        assert!(bad(LimitsConfig { handshakes: MAX_CAP + 1, ..Default::default() }));
        assert!(bad(LimitsConfig { table_words: 0, ..Default::default() }));
    }
}
