//! Per-source limits in fixed memory, lock-free (design: four 16-bit
//! lanes per word, one CAS). Sans-IO: time is a tick count passed in; the tables are
//! atomics so that every shard of the data plane can share one.
//!
//! - [`ClientKey`]: an IPv4 address or an IPv6 /64.
//! - [`lanes`]: arithmetic on `u64` words of four 16-bit lanes.
//! - [`ConcurrencySketch`]: concurrent pinned handshakes per client (count-min lanes,
//!   plain update, one CAS to admit, one `fetch_sub` to release).
//! - [`RateSketch`]: new connections per client (GCRA in lanes, conservative update,
//!   one CAS per decision, epoch rebase).
//! - [`owner_initial`]: the rule for client Initials on a live DCID (a token, a
//!   ClientHello, a follow-up of a placement — [`follow_up`] — or the limits above).
//!
//! Both sketches only ever err on the strict side: a client is never admitted where an
//! exact per-client counter would refuse it; an honest client is refused only when it
//! shares both of its lanes with clients that are themselves at the limit.
//!
//! # Defaults and why
//!
//! An honest client must never notice. Browsers open one QUIC connection per origin
//! and a page touches a handful of origins; a reload spree, a NAT'd household or a
//! small office multiplies that by tens, not hundreds. A scanner or an Initial flood
//! from one source sends thousands per second.
//!
//! - **Rate** ([`DEFAULT_RATE_PER_SECOND`] = 10/s, [`DEFAULT_BURST`] = 40, on
//!   [`DEFAULT_TICKS_PER_SECOND`] = 1 000 ticks/s): forty connections at once, then
//!   one every 100 ms — the seed's numbers, enough for a reload spree, far below a
//!   scanner. T = 100 ticks, tau = 3 900, so the epoch moves every 28.8 s
//!   ([`Gcra::window`]). 1 ms ticks are fine enough for T and coarse enough for
//!   `tau + T <= 2^14` ticks ([`rate::MAX_SPAN`]).
//! - **Concurrent pinned handshakes** ([`DEFAULT_MAX_HANDSHAKES`] = 64): a pin lives
//!   10 s ([`crate::pin::PIN_TTL`]) and holds one ticket, so this is at most 64 new
//!   client DCIDs per client per 10 s. It bounds one source's share of the pin table,
//!   and it is above the rate limit for any window shorter than 2.4 s (40 + 10/s),
//!   so a burst never meets it; in the long run it allows 6.4 new connections/s per
//!   client, still far above what one subscriber opens. Lanes reach at most 3 × 64.
//! - **Table sizes** ([`DEFAULT_CONCURRENCY_WORDS`], [`DEFAULT_RATE_WORDS`] = 2^16
//!   words = 512 KiB each, shared by all shards). An honest client is refused when its
//!   twin (same word, same pair; one in `6 × words` of the clients) or two clients
//!   covering both its lanes are at the limit. With `A` sources at the limit at once,
//!   the refused fraction of honest clients is about `A / (6 × words)` (twins) plus
//!   `(A / words)^2 / 3` (two abusers, one on each lane): keep `A <= words / 64` for
//!   about 0.3 %, e.g. 1 000 abusive sources in 2^16 words. The concurrency lanes also
//!   carry honest load: keep live tickets (all shards' pins) at most `2 × words` so a
//!   lane averages at most 1 — far from 64. The tests (proto/tests/limits_model.rs)
//!   check both sketches at this load scaled down — 1 024 words, 2 048 clients,
//!   16 abusers — and find 0.3–0.7 % (concurrency, cap 8) and under 0.1 % (rate) of
//!   honest attempts refused.

pub mod client;
pub mod concurrency;
pub mod follow_up;
pub mod lanes;
pub mod owner_initial;
pub mod rate;

pub use client::{ClientHasher, ClientKey, MAX_WORDS};
pub use concurrency::{ConcurrencySketch, Ticket, MAX_CAP};
pub use follow_up::{FollowUps, FOLLOW_UP_ALLOWANCE, FOLLOW_UP_TTL};
pub use lanes::{lane_pair, lanes_at_least, sub_sat, LanePair};
pub use owner_initial::{Outcome as OwnerInitialOutcome, OwnerInitialQuery, UnprovenLimits};
pub use rate::{Gcra, RateSketch};

/// Ticks per second of the clock the defaults assume (1 ms ticks).
pub const DEFAULT_TICKS_PER_SECOND: u64 = 1_000;
/// New connections per second per client, sustained.
pub const DEFAULT_RATE_PER_SECOND: u32 = 10;
/// New connections per client at once.
pub const DEFAULT_BURST: u32 = 40;
/// Concurrent pinned handshakes per client.
pub const DEFAULT_MAX_HANDSHAKES: u16 = 64;
/// Words of the concurrency table (512 KiB).
pub const DEFAULT_CONCURRENCY_WORDS: usize = 1 << 16;
/// Words of the rate table (512 KiB).
pub const DEFAULT_RATE_WORDS: usize = 1 << 16;

/// The default rate limit: [`DEFAULT_RATE_PER_SECOND`], [`DEFAULT_BURST`], 1 ms ticks.
pub const DEFAULT_GCRA: Gcra = match Gcra::per_second(DEFAULT_RATE_PER_SECOND, DEFAULT_BURST, DEFAULT_TICKS_PER_SECOND)
{
    Some(g) => g,
    None => panic!("default GCRA out of range"),
};
