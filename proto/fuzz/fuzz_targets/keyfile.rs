//! Fuzz `proto::keyfile::KeyFile::parse` (version 1, 2 and 3 key files, ADR 0004, ADR 0005).
//!
//! Input: any bytes, as text when UTF-8. Checks: never a panic; an accepted file has a
//! valid key set, its errors name a line that exists, and what it writes
//! (`to_text`, always version 3) parses back to the same file and text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::keyfile::KeyFile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match KeyFile::parse(text) {
        Ok(k) => {
            k.key_set().expect("a parsed key file has a valid key set");
            let out = k.to_text();
            assert!(out.starts_with("quicdemux-keys 3\n"));
            let back = KeyFile::parse(&out).expect("to_text parses");
            assert_eq!(back, k);
            assert_eq!(back.to_text(), out);
        }
        Err(e) => assert!(e.line <= text.lines().count(), "{e}"),
    }
});
