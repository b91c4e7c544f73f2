//! Handcrafted QUIC datagrams (RFC 9000 §17), random but for the header fields
//! routing looks at.

use crate::Rng;

/// A 1-RTT packet (RFC 9000 §17.3.1): 0b01 form/fixed bits, 12-byte DCID, `len` bytes.
pub fn short(dcid: &[u8; 12], len: usize, rng: &mut Rng) -> Vec<u8> {
    let mut p = rng.bytes(len.max(33));
    p[0] = 0x40 | (p[0] & 0x3f);
    p[1..13].copy_from_slice(dcid);
    p
}

/// Long header type bits for QUIC v1 (RFC 9000 Table 5).
pub const INITIAL: u8 = 0;
pub const ZERO_RTT: u8 = 1;
pub const HANDSHAKE: u8 = 2;

/// A v1 long-header packet of `total` bytes (RFC 9000 §17.2) with a Length that
/// covers the rest of the datagram.
pub fn long(ty: u8, dcid: &[u8], total: usize, rng: &mut Rng) -> Vec<u8> {
    let mut p = vec![0xc0 | (ty << 4) | 0x03];
    p.extend_from_slice(&1u32.to_be_bytes());
    p.push(dcid.len() as u8);
    p.extend_from_slice(dcid);
    p.push(8);
    p.extend_from_slice(&rng.bytes(8));
    if ty == INITIAL {
        p.push(0); // token length
    }
    let rest = total.saturating_sub(p.len() + 2).max(24);
    p.extend_from_slice(&(0x4000u16 | rest as u16).to_be_bytes());
    p.extend_from_slice(&rng.bytes(rest));
    p
}

/// A 1200-byte v1 Initial.
pub fn initial(dcid: &[u8], rng: &mut Rng) -> Vec<u8> {
    long(INITIAL, dcid, 1200, rng)
}
