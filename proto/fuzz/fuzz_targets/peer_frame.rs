//! Fuzz `proto::peer::open` (host-to-host forwarding frames, ADR 0005 §4), the
//! acceptance rule (`Session::receive`), the replay window and the `--peers` file
//! parser.
//!
//! Input: any bytes. Opened as they are (almost never authentic), and again as the
//! body of a frame with a valid tag appended, so the kind, address and length parsing
//! behind the tag check is reached. Checks: never a panic; an opened frame seals back
//! to exactly the bytes it came from; a session fed the opened header twice never
//! accepts it twice; the replay window, fed the input as sequence numbers, never
//! accepts one twice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::peer::{open, parse_peers, seal, FrameKeys, Me, ReplayWindow, Session, Verdict, MAGIC};

fuzz_target!(|data: &[u8]| {
    // The `--peers` file parser: an accepted file has each host once.
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = parse_peers(text) {
            let mut ids: Vec<u16> = p.iter().map(|(h, _)| *h).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), p.len());
        }
    }
    let keys = FrameKeys::new(&[0x5a; 32], Some(&[0xa5; 32]));
    let _ = open(&keys, data);
    let mut body = MAGIC.to_vec();
    body.extend_from_slice(data);
    let mut framed = body.clone();
    framed.extend_from_slice(&keys.current.tag(&body));
    if let Ok(f) = open(&keys, &framed) {
        let mut again = Vec::new();
        seal(&keys.current, &f, &mut again);
        assert_eq!(again, framed, "a frame seals back to its own bytes");
        let me = Me { host: f.header.to_host, epoch: f.header.to_epoch };
        let mut s = Session::default();
        let first = s.receive(me, &f.header, 0);
        let second = s.receive(me, &f.header, 1);
        if matches!(first, Verdict::Fresh { .. }) {
            assert_eq!(second, Verdict::Replayed, "the same frame accepted twice");
        }
    }
    let mut w = ReplayWindow::default();
    let mut accepted = std::collections::HashSet::new();
    for c in data.chunks_exact(8) {
        let s = u64::from_le_bytes(c.try_into().expect("8 bytes")) >> (c[0] % 64);
        if w.accept(s) {
            assert!(accepted.insert(s), "{s} accepted twice");
        }
    }
});
