//! Fuzz `proto::header::parse`: any bytes, any fixed short-header DCID length.
//! Must never panic; a parsed header only borrows bytes that are in the datagram and
//! its packet length never exceeds the datagram (RFC 9000 §12.2).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::header::{parse, read_varint, Header};

fn inside(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    inner.is_empty() || (i >= o && i + inner.len() <= o + outer.len())
}

fuzz_target!(|data: &[u8]| {
    for n in [12usize, 0, 8, 20] {
        match parse(data, n) {
            Ok(Header::Long(l)) => {
                assert!(l.packet_len <= data.len());
                assert!(l.dcid.len() <= 20 && l.scid.len() <= 20);
                assert!(inside(data, l.dcid) && inside(data, l.scid) && inside(data, l.token));
            }
            Ok(Header::Short { dcid }) => {
                assert_eq!(dcid.len(), n);
                assert!(data.len() >= 1 + n + 20);
            }
            Ok(Header::UnsupportedVersion { dcid, scid, .. } | Header::VersionNegotiation { dcid, scid }) => {
                assert!(inside(data, dcid) && inside(data, scid));
            }
            Err(_) => {}
        }
    }
    if let Some((_, used)) = read_varint(data) {
        assert!(used <= data.len() && [1, 2, 4, 8].contains(&used));
    }
});
