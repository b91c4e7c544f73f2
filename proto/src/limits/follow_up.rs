//! Follow-up evidence (docs/adr/0003-demux-retry.md "Initials on live DCIDs"): when
//! the data plane admits and places a client Initial from a 4-tuple on an instance,
//! that 4-tuple may send [`FOLLOW_UP_ALLOWANCE`] more token-less Initials to the
//! instance's own CIDs within [`FOLLOW_UP_TTL`] without meeting the limits again.
//!
//! Those are the Initials a client sends after the server's first Initial, with the
//! server's SCID as DCID (RFC 9000 §7.2) and no token (no Retry happened): its ACK of
//! the server's Initial, a second ClientHello after HelloRetryRequest (RFC 8446
//! §4.1.4), retransmissions of ClientHello pieces (RFC 9002 §6.2.4). The data plane
//! cannot decrypt them (their keys come from the client's original DCID, which only
//! the placement saw) and cannot tie them to a pin (the pin is keyed by that original
//! DCID); the 4-tuple and the owner's server id are what both share.
//!
//! One entry per (client address and port, server id); a new placement of the same
//! pair refills it and restarts its lifetime, so a client gains at most
//! [`FOLLOW_UP_ALLOWANCE`] such Initials per admitted placement.
//!
//! Fixed memory, chosen at construction: a power-of-two array of slots. A key lives
//! within [`WINDOW`] slots of its keyed hash (SipHash-1-3 under a random key, so
//! nobody can aim at a victim's window); a grant takes the key's own slot, else the
//! first free or expired one in the window, else evicts the window's oldest entry
//! (counted). Lookups look at the same [`WINDOW`] slots: no tombstones, no deletion,
//! bounded work per call.

use crate::cid::ServerId;
use crate::pin::PIN_TTL;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Token-less Initials a placed 4-tuple may send to its instance's CIDs without
/// meeting the limits: an ACK of the server's Initial (1), a second ClientHello after
/// HelloRetryRequest in up to two datagrams (2) and two PTO rounds of two datagrams
/// each (RFC 9002 §6.2.4: a PTO sends up to two packets).
pub const FOLLOW_UP_ALLOWANCE: u8 = 8;
/// How long the evidence of a placement lasts: a pin's lifetime ([`PIN_TTL`]), the
/// time the data plane vouches for a placement anyway.
pub const FOLLOW_UP_TTL: Duration = PIN_TTL;
/// Slots a key may live in, from its hash on (wrapping).
pub const WINDOW: usize = 8;

#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The client's address (IPv4 as `::ffff:a.b.c.d`) and port, and the server id.
    ip: [u8; 16],
    port: u16,
    server: u16,
    /// Initials left; 0: free.
    left: u8,
    /// When it was granted, in ms of the router's clock.
    at_ms: u64,
}

const FREE: Slot = Slot { ip: [0; 16], port: 0, server: 0, left: 0, at_ms: 0 };

/// The per-shard table of follow-up allowances.
pub struct FollowUps {
    slots: Box<[Slot]>,
    mask: usize,
    hasher: SipHasher13,
    allowance: u8,
    ttl_ms: u64,
    evicted: u64,
}

impl std::fmt::Debug for FollowUps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowUps")
            .field("capacity", &self.slots.len())
            .field("allowance", &self.allowance)
            .field("evicted", &self.evicted)
            .finish()
    }
}

/// The router's clock in ms (saturating: 584 million years).
fn millis(t: Duration) -> u64 {
    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
}

fn octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl FollowUps {
    /// A table of `capacity` slots (rounded up to a power of two, at least
    /// [`WINDOW`]), [`FOLLOW_UP_ALLOWANCE`] per placement for [`FOLLOW_UP_TTL`], hash
    /// key `hash_key` (choose it at random).
    pub fn new(capacity: usize, hash_key: [u8; 16]) -> FollowUps {
        FollowUps::with_allowance(capacity, hash_key, FOLLOW_UP_ALLOWANCE, FOLLOW_UP_TTL)
    }

    /// As [`FollowUps::new`] with another allowance and lifetime (tests and tuning).
    pub fn with_allowance(capacity: usize, hash_key: [u8; 16], allowance: u8, ttl: Duration) -> FollowUps {
        let n = capacity.clamp(WINDOW, 1 << 28).next_power_of_two();
        FollowUps {
            slots: vec![FREE; n].into_boxed_slice(),
            mask: n - 1,
            hasher: SipHasher13::new_with_key(&hash_key),
            allowance,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            evicted: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
    pub fn allowance(&self) -> u8 {
        self.allowance
    }
    /// Live entries pushed out of a full window.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    #[inline]
    fn home(&self, ip: &[u8; 16], port: u16, server: u16) -> usize {
        let mut h = self.hasher;
        h.write(ip);
        h.write_u16(port);
        h.write_u16(server);
        h.finish() as usize & self.mask
    }

    #[inline]
    fn live(&self, s: &Slot, now_ms: u64) -> bool {
        s.left > 0 && now_ms.saturating_sub(s.at_ms) < self.ttl_ms
    }

    /// `client` had an Initial admitted and placed on `server` at `now`: it gets (back)
    /// the full allowance for the lifetime from `now`.
    pub fn grant(&mut self, client: SocketAddr, server: ServerId, now: Duration) {
        if self.allowance == 0 {
            return;
        }
        let (ip, port, now_ms) = (octets(client.ip()), client.port(), millis(now));
        let home = self.home(&ip, port, server.0);
        let mut free = None;
        let mut oldest = home;
        for k in 0..WINDOW {
            let i = (home + k) & self.mask;
            let s = &self.slots[i];
            if s.ip == ip && s.port == port && s.server == server.0 && s.left > 0 {
                free = Some(i);
                break;
            }
            if free.is_none() && !self.live(s, now_ms) {
                free = Some(i);
            }
            if s.at_ms < self.slots[oldest].at_ms {
                oldest = i;
            }
        }
        let i = free.unwrap_or_else(|| {
            self.evicted += 1;
            oldest
        });
        self.slots[i] = Slot { ip, port, server: server.0, left: self.allowance, at_ms: now_ms };
    }

    /// Spends one Initial of `client`'s allowance for `server` if it has one left at
    /// `now`.
    pub fn take(&mut self, client: SocketAddr, server: ServerId, now: Duration) -> bool {
        let (ip, port, now_ms) = (octets(client.ip()), client.port(), millis(now));
        let home = self.home(&ip, port, server.0);
        for k in 0..WINDOW {
            let i = (home + k) & self.mask;
            let s = &self.slots[i];
            if s.ip == ip && s.port == port && s.server == server.0 && self.live(s, now_ms) {
                self.slots[i].left -= 1;
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn allowance_is_per_four_tuple_and_server_and_runs_out() {
        let mut f = FollowUps::with_allowance(64, [1; 16], 3, Duration::from_secs(10));
        let t = Duration::from_secs(100);
        f.grant(a("192.0.2.1:5000"), ServerId(7), t);
        // Another port, another address, another server: nothing.
        assert!(!f.take(a("192.0.2.1:5001"), ServerId(7), t));
        assert!(!f.take(a("192.0.2.2:5000"), ServerId(7), t));
        assert!(!f.take(a("192.0.2.1:5000"), ServerId(8), t));
        // The v4-mapped form of the same address is the same client (dual-stack sockets).
        assert!(f.take(a("[::ffff:192.0.2.1]:5000"), ServerId(7), t));
        assert!(f.take(a("192.0.2.1:5000"), ServerId(7), t));
        assert!(f.take(a("192.0.2.1:5000"), ServerId(7), t));
        assert!(!f.take(a("192.0.2.1:5000"), ServerId(7), t), "three, not four");
        // A new placement refills it and restarts its lifetime.
        f.grant(a("192.0.2.1:5000"), ServerId(7), t + Duration::from_secs(9));
        assert!(f.take(a("192.0.2.1:5000"), ServerId(7), t + Duration::from_millis(18_999)));
        assert!(!f.take(a("192.0.2.1:5000"), ServerId(7), t + Duration::from_secs(19)), "expired at the TTL");
    }

    #[test]
    fn a_full_window_evicts_its_oldest_entry() {
        // Eight slots: one window covers the whole table.
        let mut f = FollowUps::with_allowance(1, [2; 16], 2, Duration::from_secs(10));
        assert_eq!(f.capacity(), WINDOW);
        let t = Duration::from_secs(1);
        for port in 0..8u16 {
            f.grant(
                SocketAddr::new([198, 51, 100, 1].into(), port),
                ServerId(1),
                t + Duration::from_millis(port.into()),
            );
        }
        assert_eq!(f.evicted(), 0);
        f.grant(a("198.51.100.1:99"), ServerId(1), t + Duration::from_millis(50));
        assert_eq!(f.evicted(), 1);
        assert!(!f.take(a("198.51.100.1:0"), ServerId(1), t), "the oldest went");
        for port in [1u16, 7, 99] {
            assert!(f.take(SocketAddr::new([198, 51, 100, 1].into(), port), ServerId(1), t), "port {port}");
        }
        // Spent and expired slots are reused before anything live is evicted.
        assert!(f.take(a("198.51.100.1:99"), ServerId(1), t));
        f.grant(a("198.51.100.1:100"), ServerId(1), t + Duration::from_millis(60));
        assert_eq!(f.evicted(), 1, "the spent slot of port 99 was free");
        f.grant(a("198.51.100.1:101"), ServerId(1), t + Duration::from_secs(11));
        assert_eq!(f.evicted(), 1, "everything else had expired");
    }

    /// 32 bytes a slot: 2 MiB per shard at the default pin capacity (65 536).
    #[test]
    fn a_slot_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }

    #[test]
    fn zero_allowance_grants_nothing() {
        let mut f = FollowUps::with_allowance(16, [3; 16], 0, Duration::from_secs(10));
        f.grant(a("192.0.2.9:1"), ServerId(1), Duration::ZERO);
        assert!(!f.take(a("192.0.2.9:1"), ServerId(1), Duration::ZERO));
    }
}
