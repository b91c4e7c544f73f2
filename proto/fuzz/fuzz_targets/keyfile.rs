//! Fuzz `proto::keyfile::KeyFile::parse` (version 1 to 4 key files, ADR 0004, ADR 0005,
//! ADR 0007) and the CID format setting (`proto::cid_format::FormatSpec`).
//!
//! Input: any bytes, as text when UTF-8. Checks: never a panic; an accepted file has a
//! valid key set, its errors name a line that exists, and what it writes (`to_text`:
//! version 3 while every generation is adr1, else 4) parses back to the same file and
//! text; an accepted format setting writes text that reads back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::cid_format::FormatSpec;
use proto::keyfile::KeyFile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = text.parse::<FormatSpec>() {
        assert_eq!(spec.to_string().parse::<FormatSpec>(), Ok(spec));
    }
    match KeyFile::parse(text) {
        Ok(k) => {
            k.key_set().expect("a parsed key file has a valid key set");
            let out = k.to_text();
            let version = if k.has_other_formats() { "quicdemux-keys 4\n" } else { "quicdemux-keys 3\n" };
            assert!(out.starts_with(version));
            let back = KeyFile::parse(&out).expect("to_text parses");
            assert_eq!(back, k);
            assert_eq!(back.to_text(), out);
        }
        Err(e) => assert!(e.line <= text.lines().count(), "{e}"),
    }
});
