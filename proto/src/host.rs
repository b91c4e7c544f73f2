//! Server ids across hosts (docs/adr/0005-server-ids-across-hosts.md): with
//! `--host-bits B`, a server id carries its host's id `H` in its top `B` bits and a
//! per-host instance number in the rest. `B = 0` is one host: every id is local,
//! exactly as before.
//!
//! Pure arithmetic; the controller persists the per-host counter (ADR 0001: ids are
//! monotonic and never reused within a key generation, now per host).

use crate::cid::ServerId;

/// At most this many host bits: 2^8 hosts, and 2^8 − 1 instance starts per host per
/// key generation, which the controller's rotation outpaces.
pub const MAX_HOST_BITS: u8 = 8;

/// Why a host layout is not valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostLayoutError {
    TooManyBits { bits: u8 },
    HostIdTooLarge { host: u16, bits: u8 },
}

impl std::fmt::Display for HostLayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostLayoutError::TooManyBits { bits } => {
                write!(f, "--host-bits {bits}: at most {MAX_HOST_BITS}")
            }
            HostLayoutError::HostIdTooLarge { host, bits } => {
                write!(f, "--host-id {host} does not fit in --host-bits {bits} (at most {})", (1u32 << bits) - 1)
            }
        }
    }
}
impl std::error::Error for HostLayoutError {}

/// This host's place in the server-id space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLayout {
    bits: u8,
    host: u16,
}

impl HostLayout {
    /// One host (`--host-bits 0`): every server id is local.
    pub const SINGLE: HostLayout = HostLayout { bits: 0, host: 0 };

    pub fn new(bits: u8, host: u16) -> Result<HostLayout, HostLayoutError> {
        if bits > MAX_HOST_BITS {
            return Err(HostLayoutError::TooManyBits { bits });
        }
        if u32::from(host) >= 1u32 << bits {
            return Err(HostLayoutError::HostIdTooLarge { host, bits });
        }
        Ok(HostLayout { bits, host })
    }

    pub fn bits(self) -> u8 {
        self.bits
    }

    pub fn host(self) -> u16 {
        self.host
    }

    /// Bits of the per-host instance number.
    fn local_bits(self) -> u32 {
        16 - u32::from(self.bits)
    }

    /// The host a server id belongs to (always 0 with no host bits).
    pub fn host_of(self, id: ServerId) -> u16 {
        // `checked_shr`: a shift by 16 (no host bits) is 0, not an overflow.
        id.0.checked_shr(self.local_bits()).unwrap_or(0)
    }

    /// Whether `id` is one of this host's.
    pub fn is_local(self, id: ServerId) -> bool {
        self.host_of(id) == self.host
    }

    /// The number of instance ids each host has: ids `first() ..= last()`.
    pub fn per_host(self) -> u32 {
        1u32 << self.local_bits()
    }

    /// This host's lowest server id. With no host bits, 1: id 0 is never issued, as
    /// before (the controller's counter starts at 1).
    pub fn first(self) -> u16 {
        let base = u32::from(self.host) << self.local_bits();
        base.max(1) as u16
    }

    /// This host's highest server id.
    pub fn last(self) -> u16 {
        ((u32::from(self.host) << self.local_bits()) + self.per_host() - 1) as u16
    }

    /// The id after `id` in this host's range, wrapping to [`HostLayout::first`]
    /// (the caller skips ids still registered, as after any wrap). An `id` outside
    /// the range (a counter from another layout) restarts at `first()`.
    pub fn next(self, id: u16) -> u16 {
        if !(self.first()..self.last()).contains(&id) {
            return self.first();
        }
        id + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_is_todays_id_space() {
        let l = HostLayout::SINGLE;
        assert_eq!((l.first(), l.last(), l.per_host()), (1, u16::MAX, 1 << 16));
        assert!((0..=u16::MAX).all(|i| l.is_local(ServerId(i)) && l.host_of(ServerId(i)) == 0));
        assert_eq!(l.next(1), 2);
        assert_eq!(l.next(u16::MAX), 1, "wraps past 0");
    }

    #[test]
    fn host_bits_split_the_space_without_overlap() {
        for bits in 1..=MAX_HOST_BITS {
            let hosts = 1u32 << bits;
            let mut seen = vec![false; 1 << 16];
            for h in 0..hosts {
                let l = HostLayout::new(bits, h as u16).expect("fits");
                for id in l.first()..=l.last() {
                    assert!(!seen[id as usize], "id {id} in two hosts (bits {bits})");
                    seen[id as usize] = true;
                    assert_eq!(l.host_of(ServerId(id)), h as u16);
                    assert!(l.is_local(ServerId(id)));
                }
            }
            // Every id but 0 (never issued) belongs to exactly one host.
            assert!(seen.iter().skip(1).all(|s| *s), "bits {bits}");
        }
    }

    #[test]
    fn next_stays_inside_the_hosts_range() {
        let l = HostLayout::new(4, 3).expect("fits");
        assert_eq!((l.first(), l.last()), (3 << 12, (4 << 12) - 1));
        assert_eq!(l.next(l.first()), l.first() + 1);
        assert_eq!(l.next(l.last()), l.first(), "wraps within the host");
        assert_eq!(l.next(5), l.first(), "a counter from another layout restarts in range");
        assert_eq!(l.host_of(ServerId(l.last())), 3);
        assert_eq!(l.host_of(ServerId(l.last() + 1)), 4);
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert_eq!(HostLayout::new(9, 0), Err(HostLayoutError::TooManyBits { bits: 9 }));
        assert_eq!(HostLayout::new(2, 4), Err(HostLayoutError::HostIdTooLarge { host: 4, bits: 2 }));
        assert_eq!(HostLayout::new(0, 1), Err(HostLayoutError::HostIdTooLarge { host: 1, bits: 0 }));
        assert!(HostLayout::new(2, 3).is_ok());
    }
}
