//! Zero-copy parser for the cleartext part of a QUIC packet header.
//!
//! It reads only what is never header-protected or encrypted: the first byte's form
//! and fixed bits, the long-header packet type, version, connection IDs, the Initial
//! token and the Length field. It never reads packet-number bits or payload.
//!
//! - RFC 8999 §5.1 / §5.2: version-independent long and short header invariants.
//! - RFC 9000 §17.2 (long header), §17.2.1 (Version Negotiation), §17.2.2 (Initial),
//!   §17.2.3 (0-RTT), §17.2.4 (Handshake), §17.2.5 (Retry), §17.3 (short header).
//! - RFC 9369 §3.2: QUIC version 2 long-header type codes.

//= https://www.rfc-editor.org/rfc/rfc9000#section-15
//# This version of the specification is identified by the number 0x00000001.
/// QUIC version 1 (RFC 9000 §15).
pub const VERSION_1: u32 = 0x0000_0001;
/// QUIC version 2 (RFC 9369 §3.1).
pub const VERSION_2: u32 = 0x6b33_43cf;
/// Versions whose long-header packet types this parser understands.
pub const SUPPORTED_VERSIONS: [u32; 2] = [VERSION_1, VERSION_2];
//= https://www.rfc-editor.org/rfc/rfc9000#section-14.1
//# A server MUST discard an Initial packet that is carried in a UDP datagram with a payload that is
//# smaller than the smallest allowed maximum datagram size of 1200 bytes.
/// RFC 9000 §14.1: a server MUST discard an Initial in a datagram smaller than this
/// (quinn's `MIN_INITIAL_SIZE`); RFC 9000 §5.2.2: a server MUST drop smaller packets
/// of unsupported versions.
pub const MIN_INITIAL_DATAGRAM: usize = 1200;
/// RFC 9000 §17.2: in QUIC v1 and v2 a connection ID is at most 20 bytes.
pub const MAX_CID_LEN_V1: usize = 20;
/// RFC 9001 §5.4.2: header protection samples 16 bytes starting 4 bytes after the
/// packet-number offset, so a protected packet has at least 20 bytes after it.
pub const MIN_AFTER_PN_OFFSET: usize = 20;
/// The largest UDP payload a worker accepts: quinn's `EndpointConfig::max_udp_payload_size`
/// (RFC 9000 §18.2 `max_udp_payload_size`; 1472 = a 1500-byte Ethernet MTU less the IPv4
/// and UDP headers, quinn's default) is set from it, and the kernel fast path's
/// size-limit program sends any longer UDP payload, which must then be a train of
/// several datagrams, to the data plane (docs/adr/0004-kernel-fast-path.md).
pub const MAX_UDP_PAYLOAD: u16 = 1472;

/// Long-header packet types of QUIC v1/v2 (RFC 9000 §17.2, RFC 9369 §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LongType {
    Initial,
    ZeroRtt,
    Handshake,
    Retry,
}

/// A parsed header, borrowing from the datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header<'a> {
    /// A long header of QUIC v1 or v2.
    Long(LongHeader<'a>),
    /// A long header of a version this parser does not know (RFC 8999 §5.1 invariants
    /// only): the server would answer it with Version Negotiation (RFC 9000 §6.1).
    UnsupportedVersion { version: u32, dcid: &'a [u8], scid: &'a [u8] },
    /// A Version Negotiation packet (version 0, RFC 9000 §17.2.1). Only servers send
    /// these; a server receiving one discards it.
    VersionNegotiation { dcid: &'a [u8], scid: &'a [u8] },
    /// A 1-RTT packet (RFC 9000 §17.3.1) whose DCID is `dcid_len` bytes.
    Short { dcid: &'a [u8] },
}

/// A QUIC v1/v2 long header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongHeader<'a> {
    pub version: u32,
    pub ty: LongType,
    pub dcid: &'a [u8],
    pub scid: &'a [u8],
    /// Initial only: the token (empty when the client has none).
    pub token: &'a [u8],
    /// Bytes of the datagram this packet covers (header + Length), so the caller can
    /// find coalesced packets after it (RFC 9000 §12.2). For Retry, the whole datagram.
    pub packet_len: usize,
}

impl Header<'_> {
    /// The destination connection ID, whatever the header form.
    pub fn dcid(&self) -> &[u8] {
        match self {
            Header::Long(h) => h.dcid,
            Header::UnsupportedVersion { dcid, .. }
            | Header::VersionNegotiation { dcid, .. }
            | Header::Short { dcid } => dcid,
        }
    }
}

/// Why a datagram is not a QUIC packet this demux can route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderError {
    /// Empty, or ends before a field it announces.
    Truncated,
    /// The fixed bit (0x40) is clear on a v1/v2 or short-header packet (RFC 9000
    /// §17.2, §17.3.1). Greasing it (RFC 9287) is never negotiated by our workers.
    FixedBitClear,
    /// A connection ID length above 20 in a v1/v2 packet (RFC 9000 §17.2).
    CidTooLong,
    /// A short header too short to carry the fixed-length DCID and a protected
    /// payload that can be sampled (RFC 9001 §5.4.2).
    ShortTooShort,
    /// A Length (or Retry integrity tag) that runs past the end of the datagram.
    LengthMismatch,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            HeaderError::Truncated => "truncated header",
            HeaderError::FixedBitClear => "fixed bit clear",
            HeaderError::CidTooLong => "connection id longer than 20 bytes",
            HeaderError::ShortTooShort => "short header packet too short",
            HeaderError::LengthMismatch => "length field exceeds datagram",
        };
        f.write_str(s)
    }
}
impl std::error::Error for HeaderError {}

const FORM_LONG: u8 = 0x80;
const FIXED_BIT: u8 = 0x40;

/// A cursor over the datagram that never panics: every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn u8(&mut self) -> Result<u8, HeaderError> {
        let b = *self.buf.get(self.pos).ok_or(HeaderError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }
    #[inline]
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], HeaderError> {
        let end = self.pos.checked_add(n).ok_or(HeaderError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(HeaderError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    #[inline]
    fn u32(&mut self) -> Result<u32, HeaderError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// RFC 9000 §16 variable-length integer.
    #[inline]
    fn varint(&mut self) -> Result<u64, HeaderError> {
        let first = self.u8()?;
        let extra = (1usize << (first >> 6)) - 1;
        let mut v = u64::from(first & 0x3f);
        for &b in self.bytes(extra)? {
            v = (v << 8) | u64::from(b);
        }
        Ok(v)
    }
    #[inline]
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
}

//= https://www.rfc-editor.org/rfc/rfc9000#section-16
//# The QUIC variable-length integer encoding reserves the two most significant bits of the first
//# byte to encode the base-2 logarithm of the integer encoding length in bytes. The integer value
//# is encoded on the remaining bits, in network byte order.
/// Decodes an RFC 9000 §16 varint from the front of `buf`: (value, bytes used).
pub fn read_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut r = Reader { buf, pos: 0 };
    let v = r.varint().ok()?;
    Some((v, r.pos))
}

//= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
//# Long Packet Type: The next two bits (those with a mask of 0x30) of byte 0 contain a packet type.
//# Packet types are listed in Table 5.
/// The long-header packet type for a v1/v2 first byte (RFC 9000 §17.2, RFC 9369 §3.2).
fn long_type(version: u32, first: u8) -> LongType {
    let bits = (first >> 4) & 0x03;
    if version == VERSION_2 {
        // RFC 9369 §3.2: Initial 0b01, 0-RTT 0b10, Handshake 0b11, Retry 0b00.
        match bits {
            0b01 => LongType::Initial,
            0b10 => LongType::ZeroRtt,
            0b11 => LongType::Handshake,
            _ => LongType::Retry,
        }
    } else {
        // RFC 9000 §17.2, Table 5.
        match bits {
            0b00 => LongType::Initial,
            0b01 => LongType::ZeroRtt,
            0b10 => LongType::Handshake,
            _ => LongType::Retry,
        }
    }
}

/// Parses the first packet header of a datagram. `short_dcid_len` is the fixed DCID
/// length of short headers (ADR 0001: 12).
pub fn parse(datagram: &[u8], short_dcid_len: usize) -> Result<Header<'_>, HeaderError> {
    let mut r = Reader { buf: datagram, pos: 0 };
    let first = r.u8()?;
    if first & FORM_LONG == 0 {
        // RFC 9000 §17.3.1: 1-RTT packet.
        //= https://www.rfc-editor.org/rfc/rfc9000#section-17.3.1
        //# Fixed Bit: The next bit (0x40) of byte 0 is set to 1. Packets containing a zero value
        //# for this bit are not valid packets in this version and MUST be discarded.
        if first & FIXED_BIT == 0 {
            return Err(HeaderError::FixedBitClear);
        }
        let dcid = r.bytes(short_dcid_len).map_err(|_| HeaderError::ShortTooShort)?;
        if r.remaining() < MIN_AFTER_PN_OFFSET {
            return Err(HeaderError::ShortTooShort);
        }
        return Ok(Header::Short { dcid });
    }
    // RFC 8999 §5.1: version, then DCID and SCID, each with a one-byte length.
    let version = r.u32()?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
    //# In order to properly form a Version Negotiation packet, servers SHOULD be able to read
    //# longer connection IDs from other QUIC versions.
    let dcid_len = r.u8()? as usize;
    let dcid = r.bytes(dcid_len)?;
    let scid_len = r.u8()? as usize;
    let scid = r.bytes(scid_len)?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# Upon receipt by a client, it will be identified as a Version Negotiation packet based on the
    //# Version field having a value of 0.
    if version == 0 {
        return Ok(Header::VersionNegotiation { dcid, scid });
    }
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Ok(Header::UnsupportedVersion { version, dcid, scid });
    }
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
    //# Fixed Bit: The next bit (0x40) of byte 0 is set to 1, unless the packet is a Version
    //# Negotiation packet. Packets containing a zero value for this bit are not valid packets in
    //# this version and MUST be discarded.
    if first & FIXED_BIT == 0 {
        return Err(HeaderError::FixedBitClear);
    }
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
    //# In QUIC version 1, this value MUST NOT exceed 20 bytes. Endpoints that receive a version 1
    //# long header with a value larger than 20 MUST drop the packet.
    if dcid_len > MAX_CID_LEN_V1 || scid_len > MAX_CID_LEN_V1 {
        return Err(HeaderError::CidTooLong);
    }
    let ty = long_type(version, first);
    let mut token: &[u8] = &[];
    match ty {
        LongType::Retry => {
            //= https://www.rfc-editor.org/rfc/rfc9000#section-12.2
            //# Retry packets (Section 17.2.5), Version Negotiation packets (Section 17.2.1), and
            //# packets with a short header (Section 17.3) do not contain a Length field and so
            //# cannot be followed by other packets in the same UDP datagram.
            // RFC 9000 §17.2.5: Retry Token, then a 16-byte integrity tag.
            if r.remaining() < 16 {
                return Err(HeaderError::LengthMismatch);
            }
            return Ok(Header::Long(LongHeader {
                version,
                ty,
                dcid,
                scid,
                token: &datagram[r.pos..datagram.len() - 16],
                packet_len: datagram.len(),
            }));
        }
        LongType::Initial => {
            //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.2
            //# Token Length: A variable-length integer specifying the length of the Token field, in
            //# bytes.
            // RFC 9000 §17.2.2: Token Length (varint) and Token.
            let len = r.varint()?;
            let len = usize::try_from(len).map_err(|_| HeaderError::Truncated)?;
            token = r.bytes(len)?;
        }
        LongType::ZeroRtt | LongType::Handshake => {}
    }
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2
    //# Length: This is the length of the remainder of the packet (that is, the Packet Number and
    //# Payload fields) in bytes, encoded as a variable-length integer (Section 16).
    // RFC 9000 §17.2.2-4: Length covers packet number and payload.
    let length = r.varint()?;
    let length = usize::try_from(length).map_err(|_| HeaderError::LengthMismatch)?;
    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.4.2
    //# An endpoint MUST discard packets that are not long enough to contain a complete sample.
    // RFC 9001 §5.4.2: the header-protection sample must fit inside the packet.
    if length > r.remaining() || length < MIN_AFTER_PN_OFFSET {
        return Err(HeaderError::LengthMismatch);
    }
    Ok(Header::Long(LongHeader { version, ty, dcid, scid, token, packet_len: r.pos + length }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_examples_rfc9000_a1() {
        // RFC 9000 Appendix A.1 sample encodings.
        let cases: [(&[u8], u64); 4] = [
            (&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c], 151_288_809_941_952_652),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, v) in cases {
            assert_eq!(read_varint(bytes), Some((v, bytes.len())));
            assert_eq!(read_varint(&bytes[..bytes.len() - 1]), None);
        }
        assert_eq!(read_varint(&[0x40, 0x25]), Some((37, 2)));
    }

    #[test]
    fn short_header_needs_dcid_and_sample() {
        let mut p = vec![0x40u8; 1 + 12 + 20];
        assert!(matches!(parse(&p, 12), Ok(Header::Short { dcid }) if dcid.len() == 12));
        p.pop();
        assert_eq!(parse(&p, 12), Err(HeaderError::ShortTooShort));
        let q = [0x00u8; 40];
        assert_eq!(parse(&q, 12), Err(HeaderError::FixedBitClear));
        assert_eq!(parse(&[], 12), Err(HeaderError::Truncated));
    }

    #[test]
    fn v2_types_differ_from_v1() {
        for (first, v1, v2) in [
            (0xc0, LongType::Initial, LongType::Retry),
            (0xd0, LongType::ZeroRtt, LongType::Initial),
            (0xe0, LongType::Handshake, LongType::ZeroRtt),
            (0xf0, LongType::Retry, LongType::Handshake),
        ] {
            assert_eq!(long_type(VERSION_1, first), v1);
            assert_eq!(long_type(VERSION_2, first), v2);
        }
    }
}
