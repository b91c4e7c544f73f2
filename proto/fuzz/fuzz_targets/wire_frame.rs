//! Fuzz the data-frame decoder: any bytes into `frame::decode`; what decodes must
//! re-encode to exactly the same bytes (one encoding per frame), and no control
//! conversation reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::wire::frame::{self, HEADER_LEN};
use proto::wire::{Admin, Data, Message, Registration};

fuzz_target!(|data: &[u8]| {
    if let Ok((meta, payload)) = frame::decode(data) {
        assert_eq!(payload.len() + HEADER_LEN, data.len());
        assert_eq!(frame::encode(&meta, payload), data);
        assert!(Registration::decode(data).is_err() && Data::decode(data).is_err() && Admin::decode(data).is_err());
    }
});
