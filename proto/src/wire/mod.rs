//! Wire formats between quicdemux processes (layout: docs/wire.md), one module per
//! conversation:
//!
//! - [`frame`]: the data frame, one SOCK_SEQPACKET record from the data plane to a
//!   worker (or one ring record) carrying one datagram or GRO train.
//! - [`registration`]: a worker and the controller on `control.sock` ([`Registration`]).
//! - [`data`]: a worker and the data plane on `data.sock`, beside the frames ([`Data`]).
//! - [`admin`]: the operator tool, and the controller as the data plane's supervisor,
//!   asking a control socket ([`Admin`]).
//!
//! Every control record is `CONTROL_MAGIC, CONTROL_VERSION, tag, body`. Each
//! conversation owns a range of tags ([`Conversation::tags`]): a record sent on the
//! wrong conversation is refused ([`WireError::WrongConversation`]), never read as
//! another message. One tag belongs to no conversation: [`ERROR`], which every
//! conversation decodes as its own `Error { reason }` (so a socket can refuse a peer
//! before it knows which conversation the peer speaks). Each conversation opens with
//! its own hello (`Hello` / `Rejoin`, `DataHello` / `DataHelloV2`, the admin `Hello`).
//!
//! Every decoder checks every length and reserved bit: malformed input is an error,
//! never a panic.

pub mod admin;
mod codec;
pub mod data;
pub mod frame;
pub mod registration;

pub use admin::Admin;
pub use data::Data;
pub use registration::Registration;

use crate::cid::{Generation, Prf, KEY_LEN};

/// First byte of a control record (a data frame starts with [`frame::MAGIC`]).
pub const CONTROL_MAGIC: u8 = 0xc7;
/// Control-record layout version (2: one tag range per conversation; 1 was one flat
/// list of tags). A decoder refuses the other.
pub const CONTROL_VERSION: u8 = 2;
/// The tag of `Error { reason }`, the same in every conversation.
pub const ERROR: u8 = 0x01;
/// Most UDP sockets (listen addresses) one `Sockets` message may carry: the SCM_RIGHTS
/// limit is 253 fds per message (SCM_MAX_FD).
pub const MAX_SOCKETS: usize = 64;
/// Longest text (reasons, status) a control message may carry.
pub const MAX_TEXT: usize = 60_000;

/// One conversation's messages: what a typed channel (`sys::seqpacket::Channel`)
/// sends and receives.
pub trait Message: Sized {
    /// Appends this message's record to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes one whole record; another conversation's tag is
    /// [`WireError::WrongConversation`].
    fn decode(rec: &[u8]) -> Result<Self, WireError>;
    /// The message's name for logs (never its contents: `Assign` carries secrets).
    fn name(&self) -> &'static str;
    /// Whether descriptors (SCM_RIGHTS) travel with this message.
    fn carries_fds(&self) -> bool;
    /// This conversation's `Error { reason }`.
    fn error(reason: String) -> Self;
    /// The record in a new buffer.
    fn to_record(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// The conversations of control records, each with its own tag range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversation {
    Registration,
    Data,
    Admin,
}

impl Conversation {
    pub const ALL: [Conversation; 3] = [Conversation::Registration, Conversation::Data, Conversation::Admin];

    /// The tags this conversation's messages use (disjoint from the others').
    pub const fn tags(self) -> std::ops::RangeInclusive<u8> {
        match self {
            Conversation::Registration => 0x20..=0x3f,
            Conversation::Data => 0x40..=0x5f,
            Conversation::Admin => 0x60..=0x7f,
        }
    }

    /// The conversation whose range holds `tag` (none for [`ERROR`] and unused tags).
    pub fn of_tag(tag: u8) -> Option<Conversation> {
        Conversation::ALL.into_iter().find(|c| c.tags().contains(&tag))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Conversation::Registration => "registration",
            Conversation::Data => "data",
            Conversation::Admin => "admin",
        }
    }
}

/// Why bytes are not a valid frame or control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    Truncated,
    BadMagic,
    UnsupportedVersion(u8),
    ReservedBits,
    BadEcn,
    BadSegmentSize,
    EmptyPayload,
    PayloadTooLarge,
    UnknownMessage(u8),
    /// A tag of another conversation's range: the record was sent on the wrong socket
    /// or at the wrong peer.
    WrongConversation {
        tag: u8,
        belongs_to: Conversation,
    },
    BadGeneration(u8),
    /// A key generation's PRF code is not one this version knows (ADR 0004).
    BadPrf(u8),
    TooMany,
    TrailingBytes,
    BadUtf8,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated"),
            WireError::BadMagic => f.write_str("bad magic byte"),
            WireError::UnsupportedVersion(v) => write!(f, "unsupported version {v}"),
            WireError::ReservedBits => f.write_str("reserved bits set"),
            WireError::BadEcn => f.write_str("ECN codepoint out of range"),
            WireError::BadSegmentSize => f.write_str("segment size zero or larger than payload"),
            WireError::EmptyPayload => f.write_str("empty payload"),
            WireError::PayloadTooLarge => f.write_str("payload larger than 65535 bytes"),
            WireError::UnknownMessage(t) => write!(f, "unknown message type {t:#04x}"),
            WireError::WrongConversation { tag, belongs_to } => {
                write!(f, "message type {tag:#04x} belongs to the {} conversation, not this one", belongs_to.as_str())
            }
            WireError::BadGeneration(g) => write!(f, "key generation {g} out of range"),
            WireError::BadPrf(p) => write!(f, "unknown PRF code {p}"),
            WireError::TooMany => f.write_str("list longer than allowed"),
            WireError::TrailingBytes => f.write_str("trailing bytes"),
            WireError::BadUtf8 => f.write_str("text is not UTF-8"),
        }
    }
}
impl std::error::Error for WireError {}

/// A key generation with its PRF (ADR 0004) and secret, as handed to workers and the
/// data plane.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyGen {
    pub generation: Generation,
    pub prf: Prf,
    pub secret: [u8; KEY_LEN],
}

impl std::fmt::Debug for KeyGen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyGen({:?}, {}, <secret>)", self.generation, self.prf)
    }
}

/// The live key generations: the newest first, then the previous one if still live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    pub newest: KeyGen,
    pub previous: Option<KeyGen>,
}

impl Keys {
    /// The routing key set these generations describe, each with its PRF.
    pub fn key_set(&self) -> Result<crate::cid::KeySet, crate::cid::KeySetError> {
        let t = |k: &KeyGen| (k.generation, k.prf, k.secret);
        crate::cid::KeySet::with_prfs(t(&self.newest), self.previous.as_ref().map(t))
    }
}

/// What the controller's `control.sock` reads: it carries two conversations, told
/// apart by the tag of the first record (a worker's registration, an operator's
/// admin requests). `Error` decodes as `Registration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlSocket {
    Registration(Registration),
    Admin(Admin),
}

impl Message for ControlSocket {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ControlSocket::Registration(m) => m.encode(out),
            ControlSocket::Admin(m) => m.encode(out),
        }
    }
    fn decode(rec: &[u8]) -> Result<Self, WireError> {
        match Registration::decode(rec) {
            Err(WireError::WrongConversation { belongs_to: Conversation::Admin, .. }) => {
                Admin::decode(rec).map(ControlSocket::Admin)
            }
            r => r.map(ControlSocket::Registration),
        }
    }
    fn name(&self) -> &'static str {
        match self {
            ControlSocket::Registration(m) => m.name(),
            ControlSocket::Admin(m) => m.name(),
        }
    }
    fn carries_fds(&self) -> bool {
        match self {
            ControlSocket::Registration(m) => m.carries_fds(),
            ControlSocket::Admin(m) => m.carries_fds(),
        }
    }
    fn error(reason: String) -> Self {
        ControlSocket::Registration(Registration::Error { reason })
    }
}
