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
//! - [`version`]: protocol versions, windows, capabilities and their negotiation.
//!
//! Every control record is `CONTROL_MAGIC, version, tag, body`, where `version` is
//! the protocol version the body is encoded in ([`version`]). Each conversation owns
//! a range of tags ([`Conversation::tags`]): a record sent on the wrong conversation
//! is refused ([`WireError::WrongConversation`]), never read as another message. Two
//! tags belong to no conversation: [`ERROR`] and [`WELCOME`], which every
//! conversation decodes as its own `Error { reason }` and `Welcome { version, caps }`
//! (so a socket can refuse a peer before it knows which conversation the peer
//! speaks). Each conversation opens with its own hello (`Hello` / `Rejoin`,
//! `DataHello`, the admin `Hello`), answered by `Welcome` or `Error`.
//!
//! Every decoder checks every length and reserved bit: malformed input is an error,
//! never a panic.

pub mod admin;
mod codec;
pub use codec::{CID_FORMAT_VERSION, NO_PRF_IN_THIS_VERSION};
pub mod data;
pub mod frame;
pub mod registration;
pub mod version;

pub use admin::Admin;
pub use data::Data;
pub use registration::Registration;
pub use version::{Announce, Window, PROTOCOL_VERSION};

use crate::cid::{Generation, Prf, KEY_LEN};
use crate::cid_format::CidFormat;

/// First byte of a control record (a data frame starts with [`frame::MAGIC`]).
pub const CONTROL_MAGIC: u8 = 0xc7;
/// The tag of `Error { reason }`, the same in every conversation.
pub const ERROR: u8 = 0x01;
/// The tag of `Welcome { version, caps }`, the responder's answer to every hello, the
/// same in every conversation.
pub const WELCOME: u8 = 0x02;
/// Most UDP sockets (listen addresses) one `Sockets` message may carry: the SCM_RIGHTS
/// limit is 253 fds per message (SCM_MAX_FD).
pub const MAX_SOCKETS: usize = 64;
/// Longest text (reasons, status) a control message may carry.
pub const MAX_TEXT: usize = 60_000;

/// One conversation's messages: what a typed channel (`sys::seqpacket::Channel`)
/// sends and receives.
pub trait Message: Sized {
    /// Appends this message's record, encoded in protocol version `version` (the
    /// negotiated one). A hello's version byte is its announced newest and
    /// `Welcome`'s its own `version`, whatever `version` says.
    fn encode_at(&self, version: u8, out: &mut Vec<u8>);
    /// Decodes one whole record, in the version its version byte names (any from
    /// [`version::FIRST_VERSION`] on: which ones a process speaks is its window's
    /// business, `sys::seqpacket::Channel`); another conversation's tag is
    /// [`WireError::WrongConversation`].
    fn decode(rec: &[u8]) -> Result<Self, WireError>;
    /// The message's name for logs (never its contents: `Assign` carries secrets).
    fn name(&self) -> &'static str;
    /// Whether descriptors (SCM_RIGHTS) travel with this message.
    fn carries_fds(&self) -> bool;
    /// The hello, `Welcome` and `Error`: the same layout in every protocol version,
    /// read whatever version byte they carry (docs/wire.md "Versions").
    fn is_frozen(&self) -> bool;
    /// This conversation's `Error { reason }`.
    fn error(reason: String) -> Self;
    /// This conversation's `Welcome { version, caps }`.
    fn welcome(version: u8, caps: u64) -> Self;
    /// Appends the record in this build's version, [`PROTOCOL_VERSION`] (tests and
    /// tools; a connection encodes in its negotiated version).
    fn encode(&self, out: &mut Vec<u8>) {
        self.encode_at(PROTOCOL_VERSION, out)
    }
    /// The record in a new buffer, in [`PROTOCOL_VERSION`].
    fn to_record(&self) -> Vec<u8> {
        self.to_record_at(PROTOCOL_VERSION)
    }
    /// The record in a new buffer, in protocol version `version`.
    fn to_record_at(&self, version: u8) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_at(version, &mut v);
        v
    }
}

/// The protocol version a control record is encoded in (its second byte); `None`
/// for anything that is not a control record (a data frame, a short record).
pub fn record_version(rec: &[u8]) -> Option<u8> {
    match rec {
        [CONTROL_MAGIC, v, ..] => Some(*v),
        _ => None,
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
    /// A hello's window is not `FIRST_VERSION <= oldest <= newest`.
    BadWindow {
        oldest: u8,
        newest: u8,
    },
    BadGeneration(u8),
    /// A key generation's PRF code is not one this version knows (ADR 0004).
    BadPrf(u8),
    /// A CID format code this version does not know (ADR 0007).
    UnknownCidFormat(u8),
    /// A generation's QUIC-LB config that does not fit it (ADR 0007,
    /// `proto::cid_format`); the generation.
    BadCidFormat(u8),
    /// A `RotateKeys` CID format text that does not parse (ADR 0007).
    BadCidFormatText,
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
            WireError::BadWindow { oldest, newest } => {
                write!(f, "hello announces versions {oldest}..={newest}, not a window from version 3 on")
            }
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
            WireError::UnknownCidFormat(c) => write!(f, "unknown CID format code {c}"),
            WireError::BadCidFormat(g) => write!(f, "key generation {g}'s quic-lb config does not fit it"),
            WireError::BadCidFormatText => f.write_str("the CID format text does not parse"),
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
    /// How this generation's CIDs are built (docs/adr/0007-quic-lb.md): ADR 0001's
    /// format (which uses `prf` and `secret`) or QUIC-LB with its config.
    pub format: CidFormat,
}

impl std::fmt::Debug for KeyGen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyGen({:?}, {}, <secret>, {:?})", self.generation, self.prf, self.format)
    }
}

/// The live key generations: the newest first, then the previous one if still live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    pub newest: KeyGen,
    pub previous: Option<KeyGen>,
}

impl Keys {
    /// The routing key set these generations describe, each with its PRF and CID format.
    pub fn key_set(&self) -> Result<crate::cid::KeySet, crate::cid::KeySetError> {
        let t = |k: &KeyGen| (k.generation, k.prf, k.secret, k.format);
        crate::cid::KeySet::with_formats(t(&self.newest), self.previous.as_ref().map(t))
    }
}

/// What the controller's `control.sock` reads: it carries two conversations, told
/// apart by the tag of the first record (a worker's registration, an operator's
/// admin requests). `Error` and `Welcome` decode as `Registration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlSocket {
    Registration(Registration),
    Admin(Admin),
}

impl Message for ControlSocket {
    fn encode_at(&self, version: u8, out: &mut Vec<u8>) {
        match self {
            ControlSocket::Registration(m) => m.encode_at(version, out),
            ControlSocket::Admin(m) => m.encode_at(version, out),
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
    fn is_frozen(&self) -> bool {
        match self {
            ControlSocket::Registration(m) => m.is_frozen(),
            ControlSocket::Admin(m) => m.is_frozen(),
        }
    }
    fn error(reason: String) -> Self {
        ControlSocket::Registration(Registration::Error { reason })
    }
    fn welcome(version: u8, caps: u64) -> Self {
        ControlSocket::Registration(Registration::Welcome { version, caps })
    }
}
