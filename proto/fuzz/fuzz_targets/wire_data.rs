//! Fuzz the data conversation's decoder: any bytes into `Data::decode`; what decodes
//! re-encodes to the same bytes and is read by no other conversation
//! (`conversation::check`).
#![no_main]

#[path = "conversation.rs"]
mod conversation;

use libfuzzer_sys::fuzz_target;
use proto::wire::{Conversation, Data};

fuzz_target!(|data: &[u8]| {
    conversation::check::<Data>(data, Conversation::Data);
});
