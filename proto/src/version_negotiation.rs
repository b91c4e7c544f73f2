//! Version Negotiation (RFC 9000 §6, §17.2.1; RFC 8999 §6): the packet a server
//! answers a client's first packet with when it does not speak that packet's version.
//! The client then starts again with a version from the list (RFC 9368 §2.2,
//! incompatible version negotiation).

use crate::header::MIN_INITIAL_DATAGRAM;

//= https://www.rfc-editor.org/rfc/rfc9000#section-15
//# Versions that follow the pattern 0x?a?a?a?a are reserved for use in forcing version negotiation
//# to be exercised -- that is, any version number where the low four bits of all bytes is 1010 (in
//# binary).
/// A reserved version (RFC 9000 §15: 0x?a?a?a?a) listed first, as quinn 0.11 lists
/// one, so that clients go on ignoring versions they do not know.
pub const GREASE: u32 = 0x0a1a_2a3a;
/// The reserved version listed instead when the client's own version is [`GREASE`]:
/// a Version Negotiation never lists the version it answers (RFC 9368 §4).
pub const GREASE_OTHER: u32 = 0x0a1a_2a4a;

/// Connection IDs of versions we do not know may be up to 255 bytes (RFC 8999 §5.1).
const MAX_INVARIANT_CID: usize = 255;

/// The longest Version Negotiation [`answer`] writes listing `versions` versions.
pub const fn max_len(versions: usize) -> usize {
    1 + 4 + 2 * (1 + MAX_INVARIANT_CID) + 4 * (1 + versions)
}

/// Why a datagram gets no Version Negotiation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoAnswer {
    /// Under 1200 bytes: RFC 9000 §5.2.2, servers drop smaller packets of unsupported
    /// versions (an answer would amplify a spoofed source).
    Short,
    /// Not a long header (RFC 8999 §5.1).
    Malformed,
    /// Version 0: itself a Version Negotiation, which is never answered (RFC 9000 §6.1).
    IsVersionNegotiation,
    /// A version in `versions`: spoken here, nothing to negotiate.
    Spoken,
    /// `out` is too short for the answer.
    NoRoom,
}

//= https://www.rfc-editor.org/rfc/rfc9000#section-5.2.2
//# If a server receives a packet that indicates an unsupported version and if the packet is large
//# enough to initiate a new connection for any supported version, the server SHOULD send a Version
//# Negotiation packet as described in Section 6.1.
/// The Version Negotiation answering `datagram` (a client's first packet, of a
/// version not in `versions`), listing [`GREASE`] (or [`GREASE_OTHER`]) then
/// `versions`, written to `out`; its length. RFC 9000 §17.2.1: the first byte is
/// the long-header form bit and seven arbitrary bits (`random`; the fixed bit is
/// set as well, as quinn sets it, RFC 9000 §17.2.1 allows any value), version 0, the
/// DCID is the client's SCID and the SCID is the client's DCID.
pub fn answer(datagram: &[u8], versions: &[u32], random: u8, out: &mut [u8]) -> Result<usize, NoAnswer> {
    //= https://www.rfc-editor.org/rfc/rfc9000#section-5.2.2
    //# Servers MUST drop smaller packets that specify unsupported versions.
    if datagram.len() < MIN_INITIAL_DATAGRAM {
        return Err(NoAnswer::Short);
    }
    // RFC 8999 §5.1: form bit, version, DCID length and DCID, SCID length and SCID.
    let first = *datagram.first().ok_or(NoAnswer::Malformed)?;
    if first & 0x80 == 0 {
        return Err(NoAnswer::Malformed);
    }
    let version = u32::from_be_bytes(datagram.get(1..5).and_then(|v| v.try_into().ok()).ok_or(NoAnswer::Malformed)?);
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# Version-specific rules for the connection ID therefore MUST NOT influence a decision about
    //# whether to send a Version Negotiation packet.
    let dcid_len = usize::from(*datagram.get(5).ok_or(NoAnswer::Malformed)?);
    let dcid = datagram.get(6..6 + dcid_len).ok_or(NoAnswer::Malformed)?;
    let scid_len = usize::from(*datagram.get(6 + dcid_len).ok_or(NoAnswer::Malformed)?);
    let scid = datagram.get(7 + dcid_len..7 + dcid_len + scid_len).ok_or(NoAnswer::Malformed)?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-6.1
    //# An endpoint MUST NOT send a Version Negotiation packet in response to receiving a Version
    //# Negotiation packet.
    if version == 0 {
        return Err(NoAnswer::IsVersionNegotiation);
    }
    if versions.contains(&version) {
        return Err(NoAnswer::Spoken);
    }
    let grease = if version == GREASE { GREASE_OTHER } else { GREASE };
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# A server MUST NOT send more than one Version Negotiation packet in response to a single UDP
    //# datagram.
    let len = 1 + 4 + 1 + scid.len() + 1 + dcid.len() + 4 * (1 + versions.len());
    let out = out.get_mut(..len).ok_or(NoAnswer::NoRoom)?;
    let mut pos = 0;
    let mut put = |b: &[u8]| {
        out[pos..pos + b.len()].copy_from_slice(b);
        pos += b.len();
    };
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# The value in the Unused field is set to an arbitrary value by the server. Clients MUST
    //# ignore the value of this field. Where QUIC might be multiplexed with other protocols (see
    //# [RFC7983]), servers SHOULD set the most significant bit of this field (0x40) to 1 so that
    //# Version Negotiation packets appear to have the Fixed Bit field.
    put(&[0xc0 | random]);
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# The Version field of a Version Negotiation packet MUST be set to 0x00000000.
    put(&0u32.to_be_bytes());
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# The server MUST include the value from the Source Connection ID field of the packet it
    //# receives in the Destination Connection ID field. The value for Source Connection ID MUST be
    //# copied from the Destination Connection ID of the received packet, which is initially
    //# randomly selected by a client.
    put(&[scid.len() as u8]);
    put(scid);
    put(&[dcid.len() as u8]);
    put(dcid);
    //= https://www.rfc-editor.org/rfc/rfc9000#section-17.2.1
    //# The remainder of the Version Negotiation packet is a list of 32-bit versions that the server
    //# supports.
    put(&grease.to_be_bytes());
    for v in versions {
        put(&v.to_be_bytes());
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::header::{self, Header, VERSION_1, VERSION_2};
    use crate::initial::build_client_initial;
    use proptest::prelude::*;

    /// A Version Negotiation read back field by field (RFC 9000 §17.2.1), by hand.
    fn read(vn: &[u8]) -> (u8, u32, Vec<u8>, Vec<u8>, Vec<u32>) {
        let d = usize::from(vn[5]);
        let s = usize::from(vn[6 + d]);
        let rest = &vn[7 + d + s..];
        assert_eq!(rest.len() % 4, 0, "whole versions");
        let versions = rest.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
        (
            vn[0],
            u32::from_be_bytes(vn[1..5].try_into().unwrap()),
            vn[6..6 + d].to_vec(),
            vn[7 + d..7 + d + s].to_vec(),
            versions,
        )
    }

    /// A real QUIC v2 client Initial gets the answer RFC 9000 §17.2.1 describes, and
    /// this crate's header parser reads it as a Version Negotiation.
    #[test]
    fn a_v2_initial_is_answered_with_the_versions_spoken() {
        let (dcid, scid) = ([0x83; 8], [0x5c; 5]);
        let initial = build_client_initial(VERSION_2, &dcid, &scid, &[], 0, &[6, 0, 1, 0], 1200).unwrap();
        let mut out = [0u8; max_len(1)];
        let n = answer(&initial, &[VERSION_1], 0x15, &mut out).unwrap();
        assert_eq!(n, 1 + 4 + 1 + 5 + 1 + 8 + 8);
        let (first, version, d, s, versions) = read(&out[..n]);
        assert_eq!(first, 0xd5, "form and fixed bits, then the random bits");
        assert_eq!(version, 0);
        assert_eq!((d, s), (scid.to_vec(), dcid.to_vec()), "the client's CIDs, swapped");
        assert_eq!(versions, [GREASE, VERSION_1]);
        match header::parse(&out[..n], 12).unwrap() {
            Header::VersionNegotiation { dcid: d, scid: s } => assert_eq!((d, s), (&scid[..], &dcid[..])),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_gets_no_answer() {
        let (dcid, scid) = ([0x83; 8], [0x5c; 5]);
        let mut out = [0u8; max_len(2)];
        let v1 = build_client_initial(VERSION_1, &dcid, &scid, &[], 0, &[6, 0, 1, 0], 1200).unwrap();
        assert_eq!(answer(&v1, &[VERSION_1], 0, &mut out), Err(NoAnswer::Spoken));
        let v2 = build_client_initial(VERSION_2, &dcid, &scid, &[], 0, &[6, 0, 1, 0], 1200).unwrap();
        assert_eq!(answer(&v2[..1199], &[VERSION_1], 0, &mut out), Err(NoAnswer::Short));
        let mut vn = v2.clone();
        vn[1..5].copy_from_slice(&[0; 4]);
        assert_eq!(answer(&vn, &[VERSION_1], 0, &mut out), Err(NoAnswer::IsVersionNegotiation));
        let mut short_header = v2.clone();
        short_header[0] = 0x40;
        assert_eq!(answer(&short_header, &[VERSION_1], 0, &mut out), Err(NoAnswer::Malformed));
        // (CIDs cannot run past 1200 bytes: at most 7 + 2 × 255 bytes of header.)
        assert_eq!(answer(&v2, &[VERSION_1], 0, &mut out[..20]), Err(NoAnswer::NoRoom));
        let mut grease = v2;
        grease[1..5].copy_from_slice(&GREASE.to_be_bytes());
        let n = answer(&grease, &[VERSION_1], 0, &mut out).unwrap();
        assert_eq!(read(&out[..n]).4, [GREASE_OTHER, VERSION_1], "never the client's own version");
    }

    proptest! {
        /// Against a model built by concatenation for any long-header datagram of an
        /// unspoken version (CIDs up to 255 bytes, RFC 8999); and never longer than the
        /// datagram it answers (no amplification).
        #[test]
        fn answer_is_the_model(version in any::<u32>().prop_filter("not VN", |v| *v != 0),
                               dcid in proptest::collection::vec(any::<u8>(), 0..=255),
                               scid in proptest::collection::vec(any::<u8>(), 0..=255),
                               first in any::<u8>(), random in 0u8..0x80, len in 1200usize..1500,
                               versions in proptest::collection::vec(any::<u32>(), 0..4)) {
            let mut d = vec![first | 0x80];
            d.extend_from_slice(&version.to_be_bytes());
            d.push(dcid.len() as u8);
            d.extend_from_slice(&dcid);
            d.push(scid.len() as u8);
            d.extend_from_slice(&scid);
            d.resize(d.len().max(len), 0xee);
            let mut out = vec![0u8; max_len(versions.len())];
            let got = answer(&d, &versions, random, &mut out);
            if versions.contains(&version) {
                prop_assert_eq!(got, Err(NoAnswer::Spoken));
            } else {
                let mut model = vec![0x80 | 0x40 | random, 0, 0, 0, 0, scid.len() as u8];
                model.extend_from_slice(&scid);
                model.push(dcid.len() as u8);
                model.extend_from_slice(&dcid);
                let grease: u32 = if version == 0x0a1a_2a3a { 0x0a1a_2a4a } else { 0x0a1a_2a3a };
                for v in std::iter::once(grease).chain(versions.iter().copied()) {
                    model.extend_from_slice(&v.to_be_bytes());
                }
                let n = got.unwrap();
                prop_assert_eq!(&out[..n], &model[..]);
                prop_assert!(n < d.len());
            }
        }
    }
}
