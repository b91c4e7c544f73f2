//! Fuzz the registration conversation's decoder: any bytes into `Registration::decode`; what decodes
//! re-encodes to the same bytes and is read by no other conversation
//! (`conversation::check`); and `ControlSocket::decode` (control.sock: registration
//! or admin).
#![no_main]

#[path = "conversation.rs"]
mod conversation;

use libfuzzer_sys::fuzz_target;
use proto::wire::{ControlSocket, Conversation, Message, Registration};

fuzz_target!(|data: &[u8]| {
    conversation::check::<Registration>(data, Conversation::Registration);
    // control.sock reads registration and admin records, each re-encoding alike.
    if let Ok(m) = ControlSocket::decode(data) {
        assert_eq!(m.to_record_at(data[1]), data);
    }
});
