//! Fuzz the wire decoders: any bytes into `decode_frame` and `decode_control`; what
//! decodes must re-encode to exactly the same bytes (one encoding per message).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::wire::{decode_control, decode_frame, encode_control, encode_frame, FRAME_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok((meta, payload)) = decode_frame(data) {
        assert_eq!(payload.len() + FRAME_HEADER_LEN, data.len());
        assert_eq!(encode_frame(&meta, payload), data);
    }
    if let Ok(m) = decode_control(data) {
        assert_eq!(encode_control(&m), data);
    }
});
