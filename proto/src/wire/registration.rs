//! Registration: a worker and the controller on `DIR/control.sock` (docs/wire.md
//! "Registration"). W = worker, C = controller.
//!
//! 1. W → C `Hello { announce, pid }` (or `Rejoin { announce, server_id, pid }` after
//!    losing a controller);
//! 2. C → W `Welcome` in the negotiated version, `Assign { .. }`, then `Sockets {
//!    addrs }` with the UDP fds; or `Error` (a version outside the window, a refusal);
//! 3. W → C `Ready` / `Draining`; C → W `KeysChanged` on every rotation.
//!
//! No capability is defined for this conversation yet ([`CAPS_KNOWN`]).

use super::codec::{self, put_keys, put_socket_addrs};
use super::{Announce, Conversation, Keys, Message, WireError, ERROR, WELCOME};
use crate::cid::ServerId;
use std::net::SocketAddr;

/// The registration capabilities this build knows: none yet.
pub const CAPS_KNOWN: u64 = 0;

/// Every registration message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// W → C, first: register for a fresh server id. `pid` must be the sending
    /// process's (the controller compares it with SO_PEERCRED).
    Hello { announce: Announce, pid: u32 },
    /// W → C, instead of `Hello`: a worker that lost its control connection registers
    /// again under the server id it already has. The controller answers `Assign` with
    /// the same id (adopted) or `Error` (the worker must drain and exit).
    Rejoin { announce: Announce, server_id: ServerId, pid: u32 },
    /// C → W, the answer to the hello: the negotiated protocol version (this record's
    /// version byte) and the controller's capabilities.
    Welcome { version: u8, caps: u64 },
    /// C → W: your server id, the key generations and the shared secrets. UDP socket
    /// fds may travel with this record (SCM_RIGHTS); the controller sends them with
    /// the following `Sockets`.
    Assign { server_id: ServerId, keys: Keys, reset_key: [u8; 32], token_key: [u8; 32] },
    /// C → W, after `Assign`: the shared UDP sockets, one per listen address in this
    /// order; the fds travel with this record. The worker only sends on them.
    Sockets { addrs: Vec<SocketAddr> },
    /// W → C: ready for new connections (shown by `demux status`).
    Ready,
    /// W → C: draining, accepts no new connections.
    Draining,
    /// C → W: the key generations changed (rotation).
    KeysChanged { keys: Keys },
    /// Either way: why the sender is about to close the connection.
    Error { reason: String },
}

mod tag {
    pub const HELLO: u8 = 0x20;
    pub const REJOIN: u8 = 0x21;
    pub const ASSIGN: u8 = 0x22;
    pub const SOCKETS: u8 = 0x23;
    pub const READY: u8 = 0x24;
    pub const DRAINING: u8 = 0x25;
    pub const KEYS_CHANGED: u8 = 0x26;
}

impl Message for Registration {
    fn encode_at(&self, version: u8, v: &mut Vec<u8>) {
        match self {
            Registration::Hello { announce, pid } => {
                codec::hello(tag::HELLO, announce, v);
                v.extend_from_slice(&pid.to_be_bytes());
            }
            Registration::Rejoin { announce, server_id, pid } => {
                codec::hello(tag::REJOIN, announce, v);
                v.extend_from_slice(&server_id.0.to_be_bytes());
                v.extend_from_slice(&pid.to_be_bytes());
            }
            Registration::Welcome { version, caps } => codec::welcome(*version, *caps, v),
            Registration::Assign { server_id, keys, reset_key, token_key } => {
                codec::header(tag::ASSIGN, version, v);
                v.extend_from_slice(&server_id.0.to_be_bytes());
                put_keys(v, version, keys);
                v.extend_from_slice(reset_key);
                v.extend_from_slice(token_key);
            }
            Registration::Sockets { addrs } => {
                codec::header(tag::SOCKETS, version, v);
                put_socket_addrs(v, addrs);
            }
            Registration::Ready => codec::header(tag::READY, version, v),
            Registration::Draining => codec::header(tag::DRAINING, version, v),
            Registration::KeysChanged { keys } => {
                codec::header(tag::KEYS_CHANGED, version, v);
                put_keys(v, version, keys);
            }
            Registration::Error { reason } => codec::error(reason, version, v),
        }
    }

    fn decode(rec: &[u8]) -> Result<Self, WireError> {
        let (version, t, mut c) = codec::open(rec, Conversation::Registration)?;
        let m = match t {
            tag::HELLO => Registration::Hello { announce: c.announce(version)?, pid: c.u32()? },
            tag::REJOIN => {
                Registration::Rejoin { announce: c.announce(version)?, server_id: ServerId(c.u16()?), pid: c.u32()? }
            }
            WELCOME => Registration::Welcome { version, caps: c.u64()? },
            tag::ASSIGN => Registration::Assign {
                server_id: ServerId(c.u16()?),
                keys: c.keys(version)?,
                reset_key: c.array()?,
                token_key: c.array()?,
            },
            tag::SOCKETS => Registration::Sockets { addrs: c.socket_addrs()? },
            tag::READY => Registration::Ready,
            tag::DRAINING => Registration::Draining,
            tag::KEYS_CHANGED => Registration::KeysChanged { keys: c.keys(version)? },
            ERROR => Registration::Error { reason: c.text()? },
            other => return Err(WireError::UnknownMessage(other)),
        };
        c.finish(m)
    }

    fn name(&self) -> &'static str {
        match self {
            Registration::Hello { .. } => "Hello",
            Registration::Rejoin { .. } => "Rejoin",
            Registration::Welcome { .. } => "Welcome",
            Registration::Assign { .. } => "Assign",
            Registration::Sockets { .. } => "Sockets",
            Registration::Ready => "Ready",
            Registration::Draining => "Draining",
            Registration::KeysChanged { .. } => "KeysChanged",
            Registration::Error { .. } => "Error",
        }
    }

    fn carries_fds(&self) -> bool {
        matches!(self, Registration::Assign { .. } | Registration::Sockets { .. })
    }

    fn is_frozen(&self) -> bool {
        matches!(
            self,
            Registration::Hello { .. }
                | Registration::Rejoin { .. }
                | Registration::Welcome { .. }
                | Registration::Error { .. }
        )
    }

    fn error(reason: String) -> Self {
        Registration::Error { reason }
    }

    fn welcome(version: u8, caps: u64) -> Self {
        Registration::Welcome { version, caps }
    }
}
