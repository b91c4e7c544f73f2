//! The checks every conversation's fuzz target makes on what its decoder accepts:
//! it re-encodes to exactly the same bytes, and no other conversation's decoder
//! reads it (`Error`, the one record all conversations share, is read alike).

use proto::wire::{frame, Admin, Conversation, Data, Message, Registration, WireError, ERROR};

pub fn check<M: Message>(data: &[u8], own: Conversation) {
    let Ok(m) = M::decode(data) else { return };
    assert_eq!(m.to_record(), data, "one encoding per message");
    let tag = data[2];
    if tag == ERROR {
        for other in [
            Registration::decode(data).map(|m| m.to_record()),
            Data::decode(data).map(|m| m.to_record()),
            Admin::decode(data).map(|m| m.to_record()),
        ] {
            assert_eq!(other.as_deref(), Ok(data));
        }
        return;
    }
    assert_eq!(Conversation::of_tag(tag), Some(own));
    let wrong = Err(WireError::WrongConversation { tag, belongs_to: own });
    if own != Conversation::Registration {
        assert_eq!(Registration::decode(data).map(drop), wrong);
    }
    if own != Conversation::Data {
        assert_eq!(Data::decode(data).map(drop), wrong);
    }
    if own != Conversation::Admin {
        assert_eq!(Admin::decode(data).map(drop), wrong);
    }
    assert!(frame::decode(data).is_err(), "a control record is no frame");
}
