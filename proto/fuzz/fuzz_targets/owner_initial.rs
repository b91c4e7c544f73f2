//! Fuzz the rule for client Initials on a live DCID
//! (`proto::limits::owner_initial::decide`, docs/adr/0003-demux-retry.md "Initials on
//! live DCIDs"): the token check, the Initial opening and frame scan of every segment
//! (`proto::initial::starts_connection`), and the follow-up table.
//!
//! Input: bytes 0..2 = GRO stride (big-endian u16), byte 2 = what the limits say
//! (bit 0 pressured, bit 1 Retry on, bit 2 handshake cap full, bit 3 rate spent),
//! byte 3 = bit 0: the client's 4-tuple was placed on the owner (a follow-up
//! allowance of 2), bits 1..: the client's port; rest = the datagram (a valid Retry
//! token for the client is swapped in when the token field is 0x5a 0x5a).
//! Checks: never a panic; the outcome is the first step that applies, each step
//! computed independently (the token check, `starts_connection` per segment, the
//! allowance granted, the limits' flags in order); the limits are asked only in step
//! 4 and only as far as needed; an allowance of 2 is spent at most twice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::cid::ServerId;
use proto::header::{self, Header};
use proto::limits::owner_initial::{decide, OwnerInitialQuery, Outcome, UnprovenLimits};
use proto::limits::FollowUps;
use proto::token::TokenKey;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

const NOW_UNIX: u64 = 1_800_000_000;

fn key() -> &'static TokenKey {
    static K: OnceLock<TokenKey> = OnceLock::new();
    K.get_or_init(|| TokenKey::new(&[0x5a; 32]))
}

/// The limits' answers from the flags, recording what was asked.
struct Flags {
    bits: u8,
    asked: Vec<u8>,
}

impl UnprovenLimits for Flags {
    fn pressured(&self, owner: usize) -> bool {
        assert_eq!(owner, 1);
        self.bits & 1 != 0
    }
    fn retrying(&mut self) -> bool {
        self.asked.push(2);
        self.bits & 2 != 0
    }
    fn handshakes_full(&self) -> bool {
        self.bits & 4 != 0
    }
    fn charge_rate(&mut self) -> bool {
        self.asked.push(8);
        self.bits & 8 == 0
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let stride = usize::from(u16::from_be_bytes([data[0], data[1]]));
    let (bits, who) = (data[2], data[3]);
    let client = SocketAddr::from(([192, 0, 2, 1], 4000 + u16::from(who >> 1)));
    let mut datagram = data[4..].to_vec();
    let Ok(Header::Long(h)) = header::parse(&datagram, 12) else { return };
    // A token field of 0x5a 0x5a becomes a valid Retry token for the client (the
    // fuzzer cannot forge one), the rest of the datagram kept.
    if h.token == [0x5a, 0x5a] {
        let start = h.token.as_ptr() as usize - datagram.as_ptr() as usize;
        let token = key().seal(client, Some(&[1; 8]), NOW_UNIX, [2; 16]).unwrap();
        let mut d = datagram[..start - 1].to_vec();
        d.push(0x40 | (token.len() >> 8) as u8);
        d.push(token.len() as u8);
        d.extend_from_slice(&token);
        d.extend_from_slice(&datagram[start + 2..]);
        datagram = d;
    }
    let Ok(Header::Long(h)) = header::parse(&datagram, 12) else { return };
    let now = Duration::from_secs(50);
    let mut follow_ups = FollowUps::with_allowance(16, [3; 16], 2, Duration::from_secs(10));
    let placed = who & 1 != 0;
    if placed {
        follow_ups.grant(client, ServerId(9), now);
    }
    let q = OwnerInitialQuery {
        header: &h,
        datagram: &datagram,
        stride,
        client,
        owner: 1,
        owner_id: ServerId(9),
        now,
        now_unix: NOW_UNIX,
    };
    let token_valid = !h.token.is_empty() && key().check(h.token, client, NOW_UNIX).is_valid();
    let seg = if stride == 0 { datagram.len().max(1) } else { stride };
    let starts = datagram.chunks(seg).any(|s| proto::initial::starts_connection(s) == Some(true));
    let mut spent = 0;
    for round in 0..3 {
        let mut limits = Flags { bits, asked: vec![] };
        let got = decide(Some(key()), &mut follow_ups, &q, &mut limits);
        let follow_up = placed && spent < 2;
        let want = if token_valid {
            Outcome::Token
        } else if starts {
            Outcome::Placed
        } else if follow_up {
            Outcome::FollowUp
        } else if bits & 1 != 0 {
            Outcome::DroppedPressure
        } else if bits & 2 != 0 {
            Outcome::DroppedRetry
        } else if bits & 4 != 0 {
            Outcome::HandshakeLimited
        } else if bits & 8 != 0 {
            Outcome::RateLimited
        } else {
            Outcome::Admitted
        };
        assert_eq!(got, want, "round {round}");
        spent += usize::from(got == Outcome::FollowUp);
        // The Retry gate and the rate are asked only in step 4, in order, no further
        // than needed.
        let step4 = !token_valid && !starts && !follow_up;
        let expect_asked: Vec<u8> = match (step4, bits & 1 != 0, bits & 2 != 0, bits & 4 != 0) {
            (false, ..) | (true, true, ..) => vec![],
            (true, false, true, _) => vec![2],
            (true, false, false, true) => vec![2],
            (true, false, false, false) => vec![2, 8],
        };
        assert_eq!(limits.asked, expect_asked, "round {round}");
    }
});
