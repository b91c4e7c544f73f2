//! Fuzz the admin conversation's decoder: any bytes into `Admin::decode`; what decodes
//! re-encodes to the same bytes and is read by no other conversation
//! (`conversation::check`).
#![no_main]

#[path = "conversation.rs"]
mod conversation;

use libfuzzer_sys::fuzz_target;
use proto::wire::{Admin, Conversation};

fuzz_target!(|data: &[u8]| {
    conversation::check::<Admin>(data, Conversation::Admin);
});
