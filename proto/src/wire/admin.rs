//! Admin: requests to a control socket from the operator tool (`demux status`,
//! `lb-status`, `rotate-keys`) and from the controller as the data plane's supervisor
//! (docs/wire.md "Admin"). O = operator tool, C = controller, D = data plane.
//!
//! Every connection opens with `Hello`, answered by `Welcome` in the negotiated
//! version (or `Error`). On the controller's `control.sock` (beside registration):
//! O → C `Hello`, then `StatusRequest` → `Status` or `RotateKeys` → `Status` /
//! `Error`. On the data plane's control socket: C → D `Hello` (held open: the data
//! plane's sign of a controller), `KeysChanged`, `GetSockets` → `Sockets` (+ fds),
//! and from C or O `StatusRequest` → `Status`.
//!
//! No capability is defined for this conversation yet ([`CAPS_KNOWN`]).

use super::codec::{self, put_keys, put_socket_addrs, put_text};
use super::{Announce, Conversation, Keys, Message, WireError, ERROR, WELCOME};
use crate::cid::Prf;
use crate::cid_format::FormatSpec;
use std::net::SocketAddr;

/// The admin capabilities this build knows: none yet.
pub const CAPS_KNOWN: u64 = 0;

/// Every admin message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admin {
    /// O → C, C → D, first: the asker's window and capabilities, and its pid (for
    /// the logs).
    Hello { announce: Announce, pid: u32 },
    /// C → O, D → O, D → C: the answer to `Hello`: the negotiated protocol version (this
    /// record's version byte) and the answerer's capabilities.
    Welcome { version: u8, caps: u64 },
    /// O → C / D, C → D: request the status text (JSON).
    StatusRequest,
    /// C / D → O, D → C: status as JSON text.
    Status { json: String },
    /// O → C: rotate the CID key generation now; the new generation uses `prf`
    /// (`None`: the newest generation's PRF). `force`: even within three CID lifetimes
    /// of the last rotation. Reply: `Status` (JSON) or `Error`.
    /// `from`: with `Stage`, stage the generation another host staged, from this key
    /// file (a path the controller reads), instead of a fresh one (ADR 0005 §3).
    /// `format`: the new generation's CID format (ADR 0007; `None`: the newest
    /// generation's, `FormatSpec::kept`); from protocol version 4.
    RotateKeys { prf: Option<Prf>, force: bool, phase: RotatePhase, from: Option<String>, format: Option<FormatSpec> },
    /// C → D: the key generations changed (rotation, adoption).
    KeysChanged { keys: Keys },
    /// C → D: hand back every UDP socket, all shards, shard-major (`[shard][listen
    /// index]`). The reply is `Sockets` with the fds attached. A restarted controller
    /// adopts a running data plane with it.
    GetSockets,
    /// D → C, the answer to `GetSockets`; the fds travel with this record.
    Sockets { addrs: Vec<SocketAddr> },
    /// Either way: why the sender is about to close the connection.
    Error { reason: String },
}

/// Which rotation `RotateKeys` asks for (ADR 0001; two phases across hosts, ADR 0005).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotatePhase {
    /// Decode and issue a new generation at once (one host).
    Rotate,
    /// Decode a new generation, keep issuing the current one.
    Stage,
    /// Issue the staged generation.
    Activate,
}

impl RotatePhase {
    fn bits(self) -> u8 {
        match self {
            RotatePhase::Rotate => 0,
            RotatePhase::Stage => 1,
            RotatePhase::Activate => 2,
        }
    }
}

/// `RotateKeys` flags byte: bit 0 force, bits 1–2 the [`RotatePhase`], bit 3 a
/// `from` path follows (text).
const ROTATE_FORCE: u8 = 1;
const ROTATE_FROM: u8 = 8;
/// Bit 4, from protocol version 4: a CID format follows (text, after the path; ADR
/// 0007). A version 3 reader refuses it as a reserved bit, so a format is never lost
/// on the way to an older controller.
const ROTATE_FORMAT: u8 = 0x10;

/// `RotateKeys` body byte: keep the newest generation's PRF (else a PRF code).
pub const KEEP_PRF: u8 = 0xff;

mod tag {
    pub const HELLO: u8 = 0x60;
    pub const STATUS_REQUEST: u8 = 0x61;
    pub const STATUS: u8 = 0x62;
    pub const ROTATE_KEYS: u8 = 0x63;
    pub const KEYS_CHANGED: u8 = 0x64;
    pub const GET_SOCKETS: u8 = 0x65;
    pub const SOCKETS: u8 = 0x66;
}

impl Message for Admin {
    fn encode_at(&self, version: u8, v: &mut Vec<u8>) {
        match self {
            Admin::Hello { announce, pid } => {
                codec::hello(tag::HELLO, announce, v);
                v.extend_from_slice(&pid.to_be_bytes());
            }
            Admin::Welcome { version, caps } => codec::welcome(*version, *caps, v),
            Admin::StatusRequest => codec::header(tag::STATUS_REQUEST, version, v),
            Admin::Status { json } => {
                codec::header(tag::STATUS, version, v);
                put_text(v, json);
            }
            Admin::RotateKeys { prf, force, phase, from, format } => {
                codec::header(tag::ROTATE_KEYS, version, v);
                v.push(prf.map_or(KEEP_PRF, Prf::code));
                let flags = u8::from(*force)
                    | phase.bits() << 1
                    | if from.is_some() { ROTATE_FROM } else { 0 }
                    | if format.is_some() { ROTATE_FORMAT } else { 0 };
                v.push(flags);
                if let Some(f) = from {
                    put_text(v, f);
                }
                if let Some(f) = format {
                    put_text(v, &f.to_string());
                }
            }
            Admin::KeysChanged { keys } => {
                codec::header(tag::KEYS_CHANGED, version, v);
                put_keys(v, version, keys);
            }
            Admin::GetSockets => codec::header(tag::GET_SOCKETS, version, v),
            Admin::Sockets { addrs } => {
                codec::header(tag::SOCKETS, version, v);
                put_socket_addrs(v, addrs);
            }
            Admin::Error { reason } => codec::error(reason, version, v),
        }
    }

    fn decode(rec: &[u8]) -> Result<Self, WireError> {
        let (version, t, mut c) = codec::open(rec, Conversation::Admin)?;
        let m = match t {
            tag::HELLO => Admin::Hello { announce: c.announce(version)?, pid: c.u32()? },
            WELCOME => Admin::Welcome { version, caps: c.u64()? },
            tag::STATUS_REQUEST => Admin::StatusRequest,
            tag::STATUS => Admin::Status { json: c.text()? },
            tag::ROTATE_KEYS => {
                let prf = match c.u8()? {
                    KEEP_PRF => None,
                    p => Some(Prf::from_code(p).ok_or(WireError::BadPrf(p))?),
                };
                let flags = c.u8()?;
                let reserved = if version >= super::CID_FORMAT_VERSION { 0xe0 } else { 0xf0 };
                if flags & reserved != 0 {
                    return Err(WireError::ReservedBits);
                }
                let phase = match (flags >> 1) & 0b11 {
                    0 => RotatePhase::Rotate,
                    1 => RotatePhase::Stage,
                    2 => RotatePhase::Activate,
                    _ => return Err(WireError::ReservedBits),
                };
                let from = if flags & ROTATE_FROM != 0 { Some(c.text()?) } else { None };
                let format = if flags & ROTATE_FORMAT != 0 {
                    // Only the canonical text (what `Display` writes): one encoding per
                    // message.
                    let text = c.text()?;
                    let spec = text.parse::<FormatSpec>().map_err(|_| WireError::BadCidFormatText)?;
                    if spec.to_string() != text {
                        return Err(WireError::BadCidFormatText);
                    }
                    Some(spec)
                } else {
                    None
                };
                Admin::RotateKeys { prf, force: flags & ROTATE_FORCE != 0, phase, from, format }
            }
            tag::KEYS_CHANGED => Admin::KeysChanged { keys: c.keys(version)? },
            tag::GET_SOCKETS => Admin::GetSockets,
            tag::SOCKETS => Admin::Sockets { addrs: c.socket_addrs()? },
            ERROR => Admin::Error { reason: c.text()? },
            other => return Err(WireError::UnknownMessage(other)),
        };
        c.finish(m)
    }

    fn name(&self) -> &'static str {
        match self {
            Admin::Hello { .. } => "Hello",
            Admin::Welcome { .. } => "Welcome",
            Admin::StatusRequest => "StatusRequest",
            Admin::Status { .. } => "Status",
            Admin::RotateKeys { .. } => "RotateKeys",
            Admin::KeysChanged { .. } => "KeysChanged",
            Admin::GetSockets => "GetSockets",
            Admin::Sockets { .. } => "Sockets",
            Admin::Error { .. } => "Error",
        }
    }

    fn carries_fds(&self) -> bool {
        matches!(self, Admin::Sockets { .. })
    }

    fn is_frozen(&self) -> bool {
        matches!(self, Admin::Hello { .. } | Admin::Welcome { .. } | Admin::Error { .. })
    }

    fn error(reason: String) -> Self {
        Admin::Error { reason }
    }

    fn welcome(version: u8, caps: u64) -> Self {
        Admin::Welcome { version, caps }
    }
}
