//! Helpers shared by the integration tests of `quicdemux-proto` (and by its benches,
//! which include `vectors.rs` by path). Everything here is test code: it may unwrap.
#![allow(dead_code)]

pub mod refparse;
pub mod refprf;
pub mod rng;
pub mod vectors;

/// Decodes hex text, ignoring ASCII whitespace (so RFC-style blocks can be pasted).
pub fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() & 1, 0, "odd number of hex digits");
    digits.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
}
