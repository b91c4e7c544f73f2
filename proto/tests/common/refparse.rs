//! A slow, obviously-right reference for `proto::header::parse`, written straight
//! from the RFCs with plain index arithmetic (no cursor, no early shared helpers), so
//! that it shares no code and no structure with the implementation under test.
//!
//! Error precedence (which error wins when several apply) follows the order in which
//! the fields appear on the wire, as documented on `proto::header::HeaderError`:
//! a field that is not there is `Truncated` before anything is said about its value.

use proto::header::{Header, HeaderError, LongHeader, LongType};

/// RFC 9000 §16: a variable-length integer; `None` if `b` is too short for it.
pub fn ref_varint(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    // The two most significant bits give the length: 00→1, 01→2, 10→4, 11→8 bytes.
    let len = match first >> 6 {
        0 => 1,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    if b.len() < len {
        return None;
    }
    let mut v: u64 = 0;
    for (i, &byte) in b[..len].iter().enumerate() {
        let byte = if i == 0 { byte & 0x3f } else { byte };
        v = v * 256 + u64::from(byte);
    }
    Some((v, len))
}

/// RFC 9000 §17.2 Table 5 (v1) and RFC 9369 §3.2 (v2): the long packet type bits.
pub fn ref_long_type(version: u32, first: u8) -> LongType {
    let bits = (first & 0b0011_0000) >> 4;
    let v1 = [LongType::Initial, LongType::ZeroRtt, LongType::Handshake, LongType::Retry];
    let v2 = [LongType::Retry, LongType::Initial, LongType::ZeroRtt, LongType::Handshake];
    if version == 0x6b33_43cf {
        v2[bits as usize]
    } else {
        v1[bits as usize]
    }
}

/// The reference parser. `short_dcid_len` is the fixed DCID length of short headers.
pub fn ref_parse(d: &[u8], short_dcid_len: usize) -> Result<Header<'_>, HeaderError> {
    if d.is_empty() {
        return Err(HeaderError::Truncated);
    }
    let first = d[0];
    let long_form = first >= 0x80; // RFC 8999 §5: the most significant bit
    let fixed_bit = first & 0x40 == 0x40; // RFC 9000 §17.2 / §17.3.1
    if !long_form {
        // RFC 9000 §17.3.1: 1 byte, then the DCID; RFC 9001 §5.4.2: the sample needs
        // 4 + 16 bytes after the packet-number offset (which is right after the DCID).
        if !fixed_bit {
            return Err(HeaderError::FixedBitClear);
        }
        let needed = 1usize.saturating_add(short_dcid_len).saturating_add(20);
        if d.len() < needed {
            return Err(HeaderError::ShortTooShort);
        }
        return Ok(Header::Short { dcid: &d[1..1 + short_dcid_len] });
    }
    // RFC 8999 §5.1: first byte, 32-bit version, DCID Len, DCID, SCID Len, SCID.
    if d.len() < 6 {
        return Err(HeaderError::Truncated);
    }
    let version = (u32::from(d[1]) << 24) | (u32::from(d[2]) << 16) | (u32::from(d[3]) << 8) | u32::from(d[4]);
    let dcid_len = usize::from(d[5]);
    let dcid_start = 6;
    let dcid_end = dcid_start + dcid_len;
    if d.len() < dcid_end + 1 {
        return Err(HeaderError::Truncated);
    }
    let dcid = &d[dcid_start..dcid_end];
    let scid_len = usize::from(d[dcid_end]);
    let scid_start = dcid_end + 1;
    let scid_end = scid_start + scid_len;
    if d.len() < scid_end {
        return Err(HeaderError::Truncated);
    }
    let scid = &d[scid_start..scid_end];
    if version == 0 {
        // RFC 9000 §17.2.1
        return Ok(Header::VersionNegotiation { dcid, scid });
    }
    if version != 1 && version != 0x6b33_43cf {
        return Ok(Header::UnsupportedVersion { version, dcid, scid });
    }
    if !fixed_bit {
        return Err(HeaderError::FixedBitClear);
    }
    if dcid_len > 20 || scid_len > 20 {
        return Err(HeaderError::CidTooLong);
    }
    let ty = ref_long_type(version, first);
    let mut at = scid_end;
    let rest = d.len() - at;
    if ty == LongType::Retry {
        // RFC 9000 §17.2.5: Retry Token (the rest) then a 128-bit Retry Integrity Tag.
        let Some(token_len) = rest.checked_sub(16) else { return Err(HeaderError::LengthMismatch) };
        let token = &d[at..][..token_len];
        return Ok(Header::Long(LongHeader { version, ty, dcid, scid, token, packet_len: d.len() }));
    }
    let mut token: &[u8] = &[];
    if ty == LongType::Initial {
        // RFC 9000 §17.2.2: Token Length (i), Token (..).
        let (tlen, n) = ref_varint(&d[at..]).ok_or(HeaderError::Truncated)?;
        at += n;
        if tlen > (d.len() - at) as u64 {
            return Err(HeaderError::Truncated);
        }
        token = &d[at..at + tlen as usize];
        at += tlen as usize;
    }
    // RFC 9000 §17.2.2-4: Length (i) covers the packet number and the payload.
    let (length, n) = ref_varint(&d[at..]).ok_or(HeaderError::Truncated)?;
    at += n;
    let remaining = (d.len() - at) as u64;
    if length > remaining || length < 20 {
        return Err(HeaderError::LengthMismatch);
    }
    Ok(Header::Long(LongHeader { version, ty, dcid, scid, token, packet_len: at + length as usize }))
}
