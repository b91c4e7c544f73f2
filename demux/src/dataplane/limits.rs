//! Per-source limits of the data plane (proto::limits):
//! one [`RateSketch`] (new connections per client) and one [`ConcurrencySketch`]
//! (concurrent pinned handshakes per client) per data plane, shared by every shard
//! through an `Arc`: fixed memory, lock-free, one CAS per decision.
//!
//! Only a client Initial / 0-RTT that would be **placed** (no live pin, DCID not one
//! of ours) reaches [`ShardAdmission::admit`] (proto::route::Admission): Owner and
//! Pinned datagrams and short headers pay nothing — no hash, no atomic.
//!
//! A placement takes a concurrency ticket first (reversible), then asks the rate
//! sketch; a rate refusal gives the ticket straight back. The ticket travels with the
//! pin (its raw `u32` is the pin's payload) and is released exactly once when the pin
//! expires, is evicted, is retargeted, or the shard's table is drained on exit.

use proto::header::LongHeader;
use proto::limits::{
    ClientKey, ConcurrencySketch, Gcra, RateSketch, Ticket, DEFAULT_BURST, DEFAULT_CONCURRENCY_WORDS,
    DEFAULT_MAX_HANDSHAKES, DEFAULT_RATE_PER_SECOND, DEFAULT_TICKS_PER_SECOND, MAX_CAP, MAX_WORDS,
};
use proto::pin::NO_PAYLOAD;
use proto::route::Admission;
use proto::Table;
use std::net::SocketAddr;
use std::time::Instant;

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
    /// Wall-clock Unix seconds (token expiry, proto::token), once per batch.
    pub unix: u64,
    /// This shard's Retry gate, when Retry is configured.
    pub retry: Option<&'a mut crate::dataplane::retry::RetryGate>,
    /// Initials on a live DCID sent to admission instead of their owner
    /// ([`Admission::owner_initial`] said no), for the shard's counter.
    pub owner_unvalidated: u64,
}

impl ShardAdmission<'_> {
    /// Whether `token` is valid for this client (proto::token: quinn's Retry or
    /// NEW_TOKEN format, bound to the address, not expired).
    fn token_valid(&self, token: &[u8]) -> bool {
        !token.is_empty()
            && self.limits.token_key.as_ref().is_some_and(|k| k.check(token, self.client, self.unix).is_valid())
    }
}

impl Admission for ShardAdmission<'_> {
    type Refusal = Refusal;

    #[inline]
    fn admit(&mut self, h: &LongHeader<'_>, _: usize, _: &Table, target: usize) -> Result<u32, Refusal> {
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
            Ok(t) => Ok(t),
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

    /// A client Initial whose DCID decodes to a live id goes to that owner only with
    /// a valid token or when it does not start a connection (proto::token::
    /// owner_initial_allowed); otherwise it is placed and admitted like any new
    /// Initial. With neither limits nor Retry there is
    /// nothing to enforce: the owner, as before, at no cost.
    #[inline]
    fn owner_initial(&mut self, h: &LongHeader<'_>, datagram: &[u8], stride: usize, _: &Table, _: usize) -> bool {
        if !self.limits.enabled() && self.retry.is_none() {
            return true;
        }
        let Some(key) = &self.limits.token_key else { return true };
        let ok = proto::token::owner_initial_allowed(key, h, datagram, stride, self.client, self.unix);
        if !ok {
            self.owner_unvalidated += 1;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut a = ShardAdmission {
            limits: &l,
            client: "192.0.2.1:1".parse().unwrap(),
            ms: 0,
            unix: 0,
            retry: Some(&mut gate),
            owner_unvalidated: 0,
        };
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
        let mut a =
            ShardAdmission { limits: &l, client, ms: 0, unix: 100, retry: Some(&mut gate), owner_unvalidated: 0 };
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
