//! The rule for a client Initial whose DCID decodes to a live instance (its *owner*),
//! docs/adr/0003-demux-retry.md "Initials on live DCIDs". A DCID that decodes proves
//! nothing: a Retry's SCID or an SCID of a server's first flight is one anybody can
//! copy. In order, the first that applies decides ([`decide`]):
//!
//! 1. a token valid for the client's address (a Retry or NEW_TOKEN validated it,
//!    RFC 9000 §8.1) → the owner ([`Outcome::Token`]);
//! 2. some Initial of it opens under its own DCID's keys with a CRYPTO frame at
//!    offset 0 ([`crate::initial::starts_connection`]): a ClientHello on a copied CID
//!    → placed and admitted like any new Initial ([`Outcome::Placed`]);
//! 3. its 4-tuple was placed on the owner recently and has follow-ups left
//!    ([`super::follow_up`]) → the owner ([`Outcome::FollowUp`]);
//! 4. anything else — garbage, CRYPTO past offset 0, an ACK from a 4-tuple the data
//!    plane never placed — meets what a new token-less Initial meets, except that
//!    what would be a Retry is a drop (a client past its first flight discards a
//!    Retry, RFC 9000 §17.2.5.2): the owner's pressure
//!    ([`Outcome::DroppedPressure`]), the shard's Retry mode
//!    ([`Outcome::DroppedRetry`]), the client's handshake cap
//!    ([`Outcome::HandshakeLimited`]) and its new-connection rate
//!    ([`Outcome::RateLimited`]), in that order; within all of them → the owner
//!    ([`Outcome::Admitted`]).
//!
//! What the limits and pressure say comes from the caller ([`UnprovenLimits`]: the data
//! plane's sketches, its per-instance pressure and its Retry gate). Pure: time is
//! passed in.

use super::follow_up::FollowUps;
use crate::cid::ServerId;
use crate::counter_enum::counter_enum;
use crate::header::LongHeader;
use crate::route::LiveInitial;
use crate::token::{owner_initial_proof, OwnerInitialProof, TokenKey};
use std::net::SocketAddr;
use std::time::Duration;

counter_enum! {
    /// What became of a client Initial on a live DCID. The order is the counter order;
    /// the names are the counters' (`owner_initial.<name>` in the status).
    pub enum Outcome {
        /// Its token is valid for the client: to the owner.
        Token => "token",
        /// It starts a connection: placed and admitted like a new Initial.
        Placed => "placed",
        /// A follow-up of a placement of its 4-tuple on the owner: to the owner.
        FollowUp => "follow_up",
        /// Unproven, within the limits: to the owner.
        Admitted => "admitted",
        /// Unproven; the owner is under handshake pressure: dropped.
        DroppedPressure => "dropped_pressure",
        /// Unproven; the shard answers token-less Initials with Retry: dropped.
        DroppedRetry => "dropped_retry",
        /// Unproven; the client holds its cap of pinned handshakes: dropped.
        HandshakeLimited => "handshake_limited",
        /// Unproven; the client's new-connection rate is spent: dropped.
        RateLimited => "rate_limited",
    }
}

impl Outcome {
    /// Goes to its owner as `Owner`.
    pub fn to_owner(self) -> bool {
        matches!(self, Outcome::Token | Outcome::FollowUp | Outcome::Admitted)
    }
    /// Dropped.
    pub fn dropped(self) -> bool {
        !self.to_owner() && self != Outcome::Placed
    }
}

/// What the data plane's limits say about an unproven Initial (step 4), asked in
/// this order and only as far as needed.
pub trait UnprovenLimits {
    /// Instance `owner` is under handshake pressure: it gets no token-less Initial.
    fn pressured(&self, owner: usize) -> bool;
    /// The shard answers token-less Initials with a Retry now (an attempt is counted
    /// as the Retry gate counts new ones).
    fn retrying(&mut self) -> bool;
    /// The client holds its cap of pinned handshakes (nothing is taken).
    fn handshakes_full(&self) -> bool;
    /// Charges one new connection to the client's rate; `false` when it is spent.
    fn charge_rate(&mut self) -> bool;
}

/// One client Initial whose DCID decodes to live instance `owner`.
#[derive(Clone, Copy, Debug)]
pub struct OwnerInitialQuery<'a, 'h> {
    pub header: &'a LongHeader<'h>,
    /// The whole datagram, or a uniform GRO train of `stride`-byte segments
    /// (`stride > 0`; decided once for all of them).
    pub datagram: &'a [u8],
    pub stride: usize,
    pub client: SocketAddr,
    /// Index of the owner in the table, and its server id.
    pub owner: usize,
    pub owner_id: ServerId,
    /// The router's clock (follow-up lifetimes) and wall-clock Unix seconds (tokens).
    pub now: Duration,
    pub now_unix: u64,
}

impl<'a, 'h> OwnerInitialQuery<'a, 'h> {
    /// The query about `initial` from `client`, whose owner has server id `owner_id`,
    /// at router time `now` and Unix time `now_unix`.
    pub fn new(
        initial: &LiveInitial<'a, 'h>,
        client: SocketAddr,
        owner_id: ServerId,
        now: Duration,
        now_unix: u64,
    ) -> OwnerInitialQuery<'a, 'h> {
        let LiveInitial { header, datagram, stride, owner } = *initial;
        OwnerInitialQuery { header, datagram, stride, client, owner, owner_id, now, now_unix }
    }
}

/// The rule (module docs). `key`: the instances' token key (`None`: no token is
/// valid). Spends a follow-up only in step 3 and charges the limits only in step 4.
pub fn decide(
    key: Option<&TokenKey>,
    follow_ups: &mut FollowUps,
    q: &OwnerInitialQuery<'_, '_>,
    limits: &mut impl UnprovenLimits,
) -> Outcome {
    match owner_initial_proof(key, q.header, q.datagram, q.stride, q.client, q.now_unix) {
        OwnerInitialProof::Token => return Outcome::Token,
        OwnerInitialProof::StartsConnection => return Outcome::Placed,
        OwnerInitialProof::None => {}
    }
    if follow_ups.take(q.client, q.owner_id, q.now) {
        return Outcome::FollowUp;
    }
    if limits.pressured(q.owner) {
        Outcome::DroppedPressure
    } else if limits.retrying() {
        Outcome::DroppedRetry
    } else if limits.handshakes_full() {
        Outcome::HandshakeLimited
    } else if !limits.charge_rate() {
        Outcome::RateLimited
    } else {
        Outcome::Admitted
    }
}
