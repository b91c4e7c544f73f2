//! The checks every conversation's fuzz target makes on what its decoder accepts:
//! it re-encodes, in the protocol version it came in, to exactly the same bytes, and
//! no other conversation's decoder reads it (`Error` and `Welcome`, the records all
//! conversations share, are read alike). A hello's window is a valid one.

use proto::wire::version::FIRST_VERSION;
use proto::wire::{frame, Admin, Conversation, Data, Message, Registration, WireError, ERROR, WELCOME};

pub fn check<M: Message>(data: &[u8], own: Conversation) {
    let Ok(m) = M::decode(data) else { return };
    let version = data[1];
    assert!(version >= FIRST_VERSION, "no record of a build before negotiation decodes");
    assert_eq!(m.to_record_at(version), data, "one encoding per message and version");
    let tag = data[2];
    if tag == ERROR || tag == WELCOME {
        assert!(m.is_frozen());
        for other in [
            Registration::decode(data).map(|m| m.to_record_at(version)),
            Data::decode(data).map(|m| m.to_record_at(version)),
            Admin::decode(data).map(|m| m.to_record_at(version)),
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
