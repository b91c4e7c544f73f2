//! Fuzz `proto::initial_protection::check` and `proto::retry::RetryMinter::mint`: any
//! datagram (byte 0 picks the client address family, bytes 1..3 its port), as the
//! data plane would hand them under `--retry always`. Must never panic; a parsed
//! Initial only borrows bytes inside the datagram; a minted Retry parses as a v1
//! Retry, verifies for the Initial's DCID, echoes its SCID, fits `MAX_RETRY`, and its
//! token checks as a Retry token for that client. The same datagram through
//! `proto::version_negotiation::answer` (what a v2 Initial gets instead): an answer
//! is shorter than the datagram, parses as a Version Negotiation with the CIDs
//! swapped, and ends with the versions listed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::initial_protection::{parse, InitialProtection};
use proto::retry::{self, RetryMinter, MAX_RETRY};
use proto::header::{self, Header};
use proto::token::TokenCheck;
use proto::version_negotiation;
use std::net::SocketAddr;
use std::sync::OnceLock;

fn inside(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    inner.is_empty() || (i >= o && i + inner.len() <= o + outer.len())
}

fuzz_target!(|data: &[u8]| {
    static M: OnceLock<(RetryMinter, InitialProtection)> = OnceLock::new();
    let (m, ip) = M.get_or_init(|| (RetryMinter::new(&[3; 32]), InitialProtection::new()));
    let Some((head, dgram)) = data.split_first_chunk::<3>() else { return };
    let port = u16::from_be_bytes([head[1], head[2]]);
    let client: SocketAddr =
        if head[0] & 1 == 0 { ([192, 0, 2, 1], port).into() } else { ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1], port).into() };
    if let Ok(p) = parse(dgram) {
        assert!(p.packet_len <= dgram.len() && p.pn_offset <= p.packet_len);
        assert!(p.dcid.len() <= 20 && p.scid.len() <= 20);
        assert!(inside(dgram, p.dcid) && inside(dgram, p.scid) && inside(dgram, p.token));
    }
    let checked = ip.check(dgram).map(|p| (p.dcid.to_vec(), p.scid.to_vec()));
    let mut out = [0u8; MAX_RETRY];
    match m.mint(dgram, client, &[7; 12], 1_000, [9; 16], &mut out) {
        Ok(n) => {
            let (dcid, scid) = checked.expect("minted only what passes the check");
            assert!(n <= MAX_RETRY);
            let r = retry::parse(&out[..n]).expect("a Retry");
            assert_eq!((r.version, r.dcid, r.scid), (1, &scid[..], &[7u8; 12][..]));
            assert!(retry::verify(&out[..n], &dcid));
            assert_eq!(m.token_key().check(r.token, client, 1_000), TokenCheck::Retry);
        }
        Err(_) => {}
    }
    let mut vn = [0u8; version_negotiation::max_len(1)];
    if let Ok(n) = version_negotiation::answer(dgram, &[1], head[0] & 0x7f, &mut vn) {
        assert!(n < dgram.len(), "no amplification");
        let (dl, sl) = (usize::from(dgram[5]), usize::from(dgram[6 + dgram[5] as usize]));
        let (dcid, scid) = (&dgram[6..6 + dl], &dgram[7 + dl..7 + dl + sl]);
        assert_eq!(header::parse(&vn[..n], 12), Ok(Header::VersionNegotiation { dcid: scid, scid: dcid }));
        assert_eq!(&vn[n - 4..n], &1u32.to_be_bytes());
    }
});
