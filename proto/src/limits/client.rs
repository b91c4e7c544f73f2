//! Who a limit counts against (a client is an IPv4 address or an IPv6 /64: the /64
//! is what one subscriber usually gets), and where in a
//! sketch table a client lives.

use super::lanes::{lane_pair, LanePair};
use siphasher::sip::SipHasher13;
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A client for the per-source limits: an IPv4 address, or the /64 prefix of an IPv6
/// address. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, seen on dual-stack sockets)
/// are the IPv4 client they map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    V4(Ipv4Addr),
    /// The upper 64 bits of the address.
    V6Prefix(u64),
}

impl From<Ipv4Addr> for ClientKey {
    fn from(a: Ipv4Addr) -> ClientKey {
        ClientKey::V4(a)
    }
}

impl From<Ipv6Addr> for ClientKey {
    fn from(a: Ipv6Addr) -> ClientKey {
        match a.to_ipv4_mapped() {
            Some(v4) => ClientKey::V4(v4),
            None => ClientKey::V6Prefix((u128::from(a) >> 64) as u64),
        }
    }
}

impl From<IpAddr> for ClientKey {
    fn from(a: IpAddr) -> ClientKey {
        match a {
            IpAddr::V4(a) => a.into(),
            IpAddr::V6(a) => a.into(),
        }
    }
}

impl From<SocketAddr> for ClientKey {
    fn from(a: SocketAddr) -> ClientKey {
        a.ip().into()
    }
}

/// Keyed SipHash-1-3 of a [`ClientKey`]. The key is secret and chosen at random at
/// start-up, so nobody can choose addresses that share a cell with a victim.
#[derive(Clone, Debug)]
pub struct ClientHasher {
    sip: SipHasher13,
}

impl ClientHasher {
    pub fn new(key: [u8; 16]) -> ClientHasher {
        ClientHasher { sip: SipHasher13::new_with_key(&key) }
    }

    #[inline]
    pub fn hash(&self, client: ClientKey) -> u64 {
        let mut h = self.sip;
        match client {
            ClientKey::V4(a) => {
                h.write_u8(4);
                h.write(&a.octets());
            }
            ClientKey::V6Prefix(p) => {
                h.write_u8(6);
                h.write(&p.to_be_bytes());
            }
        }
        h.finish()
    }
}

/// A table of `2^k` words and the hash that places clients in it.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    hasher: ClientHasher,
    mask: usize,
}

/// Most words a sketch table may have (2^28: 2 GiB). Keeps word indices in 28 bits
/// and the low 32 bits of the hash (the index) apart from the high 32 (the pair).
pub const MAX_WORDS: usize = 1 << 28;

impl Layout {
    /// `words` rounded up to a power of two in `1..=MAX_WORDS`.
    pub(crate) fn new(words: usize, key: [u8; 16]) -> Layout {
        let n = words.clamp(1, MAX_WORDS).next_power_of_two();
        Layout { hasher: ClientHasher::new(key), mask: n - 1 }
    }
    pub(crate) fn words(&self) -> usize {
        self.mask + 1
    }
    /// The client's word and lane pair.
    #[inline]
    pub(crate) fn locate(&self, client: ClientKey) -> (usize, LanePair) {
        let h = self.hasher.hash(client);
        (h as usize & self.mask, lane_pair(h))
    }
}
