//! The data frame: one SOCK_SEQPACKET record from the data plane to a worker (or one
//! ring record, `proto::ring`), carrying one datagram or one GRO train plus its
//! addressing metadata. The header is a fixed [`HEADER_LEN`] bytes so the data plane
//! can send header and payload as two iovecs without copying the payload.

use super::codec::{get_addr, put_addr};
use super::WireError;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

/// First byte of a data frame.
pub const MAGIC: u8 = 0xd7;
/// Data-frame layout version (2: the client's IPv6 scope id, bytes 44..48).
pub const VERSION: u8 = 2;
/// Fixed data-frame header length.
pub const HEADER_LEN: usize = 48;
/// Largest UDP payload (and so largest GRO train) a frame can carry.
pub const MAX_PAYLOAD: usize = 65_535;

const FLAG_CLIENT_V6: u8 = 0x01;
const FLAG_LOCAL: u8 = 0x02;
const FLAG_LOCAL_V6: u8 = 0x04;
const FLAGS_KNOWN: u8 = FLAG_CLIENT_V6 | FLAG_LOCAL | FLAG_LOCAL_V6;

/// Metadata of one forwarded datagram or GRO train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameMeta {
    /// The client's address and port (the datagram's source). An IPv6 one keeps its
    /// scope id (the receiving interface, for a link-local client: the worker cannot
    /// answer `fe80::…` without it); its flow label is not carried (zero).
    pub client: SocketAddr,
    /// The address the client sent to (IP_PKTINFO / IPV6_PKTINFO), when known; the
    /// worker answers from it.
    pub local: Option<SocketAddr>,
    /// The ECN codepoint of the IP header (RFC 3168: 0..=3).
    pub ecn: u8,
    /// GRO segment size; `None` for a single datagram.
    pub segment_size: Option<u16>,
}

/// Writes the frame header for `meta` (the payload follows it in the same record).
pub fn encode_header(meta: &FrameMeta, out: &mut [u8; HEADER_LEN]) {
    let mut flags = 0;
    if meta.client.is_ipv6() {
        flags |= FLAG_CLIENT_V6;
    }
    out[0] = MAGIC;
    out[1] = VERSION;
    out[3] = meta.ecn & 0x03;
    out[4..6].copy_from_slice(&meta.segment_size.unwrap_or(0).to_be_bytes());
    out[6..8].copy_from_slice(&meta.client.port().to_be_bytes());
    put_addr(&mut out[8..24], meta.client.ip());
    match meta.local {
        Some(l) => {
            flags |= FLAG_LOCAL;
            if l.is_ipv6() {
                flags |= FLAG_LOCAL_V6;
            }
            put_addr(&mut out[24..40], l.ip());
            out[40..42].copy_from_slice(&l.port().to_be_bytes());
        }
        None => out[24..42].fill(0),
    }
    out[42..44].fill(0);
    let scope = match meta.client {
        SocketAddr::V6(c) => c.scope_id(),
        SocketAddr::V4(_) => 0,
    };
    out[44..48].copy_from_slice(&scope.to_be_bytes());
    out[2] = flags;
}

/// Encodes a whole frame into a new buffer (tests, tools; the data plane uses iovecs).
pub fn encode(meta: &FrameMeta, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; HEADER_LEN];
    encode_header(meta, &mut h);
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&h);
    v.extend_from_slice(payload);
    v
}

/// Decodes one frame record into its metadata and payload.
pub fn decode(rec: &[u8]) -> Result<(FrameMeta, &[u8]), WireError> {
    if rec.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let (hdr, payload) = rec.split_at(HEADER_LEN);
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(hdr);
    Ok((decode_header(&h, payload.len())?, payload))
}

/// Decodes a frame header whose payload (not needed here) is `payload_len` bytes
/// long: the checks of [`decode`] without the payload in the same buffer, for a
/// reader that copies the payload straight to where it is used (the worker's ring).
pub fn decode_header(rec: &[u8; HEADER_LEN], payload_len: usize) -> Result<FrameMeta, WireError> {
    if rec[0] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if rec[1] != VERSION {
        return Err(WireError::UnsupportedVersion(rec[1]));
    }
    let flags = rec[2];
    if flags & !FLAGS_KNOWN != 0 || (flags & FLAG_LOCAL == 0 && flags & FLAG_LOCAL_V6 != 0) {
        return Err(WireError::ReservedBits);
    }
    if rec[3] > 3 {
        return Err(WireError::BadEcn);
    }
    if rec[42] != 0 || rec[43] != 0 {
        return Err(WireError::ReservedBits);
    }
    if payload_len == 0 {
        return Err(WireError::EmptyPayload);
    }
    if payload_len > MAX_PAYLOAD {
        return Err(WireError::PayloadTooLarge);
    }
    let seg = u16::from_be_bytes([rec[4], rec[5]]);
    let segment_size = match seg {
        0 => None,
        s if usize::from(s) <= payload_len => Some(s),
        _ => return Err(WireError::BadSegmentSize),
    };
    let port = u16::from_be_bytes([rec[6], rec[7]]);
    let scope = u32::from_be_bytes([rec[44], rec[45], rec[46], rec[47]]);
    let client = match get_addr(&rec[8..24], flags & FLAG_CLIENT_V6 != 0)? {
        IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope)),
        IpAddr::V4(_) if scope != 0 => return Err(WireError::ReservedBits),
        ip => SocketAddr::new(ip, port),
    };
    let local = if flags & FLAG_LOCAL != 0 {
        Some(SocketAddr::new(
            get_addr(&rec[24..40], flags & FLAG_LOCAL_V6 != 0)?,
            u16::from_be_bytes([rec[40], rec[41]]),
        ))
    } else {
        if rec[24..42].iter().any(|&b| b != 0) {
            return Err(WireError::ReservedBits);
        }
        None
    };
    Ok(FrameMeta { client, local, ecn: rec[3], segment_size })
}
