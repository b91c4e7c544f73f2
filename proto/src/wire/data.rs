//! The data connection: a worker and the data plane on `data.sock` (docs/wire.md
//! "Data connection"), beside the data frames ([`super::frame`]) the data plane sends
//! on it. W = worker, D = data plane.
//!
//! 1. W → D `DataHello { announce, server_id }` (capabilities [`CAP_RINGS`],
//!    [`CAP_FAST_PATH`]);
//! 2. D → W `Welcome` in the negotiated version, `Sockets` (+ fds), `FastSockets`
//!    (when both announced [`CAP_FAST_PATH`], + fds) and `Rings` (+ fds); or `Error`
//!    and close;
//! 3. W → D `Ready` / `Draining`, `Load` every [`LOAD_INTERVAL_MS`], `HandshakeDone`.

use super::codec::{self, put_socket_addrs};
use super::{Announce, Conversation, Message, WireError, ERROR, WELCOME};
use crate::cid::ServerId;
use std::net::SocketAddr;

/// How often a worker sends [`Data::Load`] (milliseconds).
pub const LOAD_INTERVAL_MS: u64 = 250;
/// Longest `HandshakeDone` DCID (RFC 9000 §17.2).
pub const MAX_ODCID_LEN: usize = 20;
/// Data capability: forwarding rings (`Rings` with rings in it; without it, `Rings`
/// says count 0).
pub const CAP_RINGS: u64 = 0x1;
/// Data capability: the worker's own kernel fast-path sockets (`FastSockets`),
/// read as well as the data connection.
pub const CAP_FAST_PATH: u64 = 0x2;
/// The data capabilities this build knows; a reader ignores the others.
pub const CAPS_KNOWN: u64 = CAP_RINGS | CAP_FAST_PATH;
/// The most rings one `Rings` message announces (two fds each: 253 / 2 SCM_RIGHTS).
pub const MAX_RINGS: u8 = 64;

/// Every control message of the data connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// W → D, first: the frames on this connection are for this id. The
    /// capabilities ask for shared-memory rings ([`CAP_RINGS`]) and the worker's own
    /// fast-path sockets ([`CAP_FAST_PATH`]). The data plane answers `Welcome`,
    /// `Sockets`, [`Data::FastSockets`] when both announced it, then `Rings`.
    DataHello { announce: Announce, server_id: ServerId },
    /// D → W, the answer to the hello: the negotiated protocol version (this record's
    /// version byte) and the data plane's capabilities.
    Welcome { version: u8, caps: u64 },
    /// D → W, after `Welcome`: the shared UDP sockets, one per listen address in this
    /// order; the fds travel with this record (SCM_RIGHTS). The worker only sends on
    /// them, never reads.
    Sockets { addrs: Vec<SocketAddr> },
    /// D → W, when both hello and `Welcome` carry [`CAP_FAST_PATH`], after `Sockets`
    /// and before `Rings`: this worker's own UDP sockets, one per listen address in
    /// `Sockets` order, each in that address's SO_REUSEPORT group, where the data
    /// plane's SK_REUSEPORT program steers this worker's established datagrams to it
    /// (docs/adr/0004). The worker receives on them and answers from them. The fds
    /// travel with this record; `addrs` is empty when the fast path is not active.
    FastSockets { addrs: Vec<SocketAddr> },
    /// D → W: `count` shared-memory rings (one per shard) of `bytes` data bytes each
    /// (proto::ring layout); the fds travel with this record, ring-major: the memfd,
    /// then its eventfd, for each ring. Frames may still come on the connection too.
    /// The last answer to every `DataHello`; `count: 0, bytes: 0` when the data plane
    /// forwards over SEQPACKET only (or either side lacks [`CAP_RINGS`]).
    Rings { count: u8, bytes: u64 },
    /// W → D: ready for new connections (becomes placeable).
    Ready,
    /// W → D: draining, place nothing new here (stays live until it disconnects).
    Draining,
    /// W → D, on a live data connection, every [`LOAD_INTERVAL_MS`]: the worker's
    /// handshake pressure — `handshakes` in progress (accepted, not yet established)
    /// and `incoming_bytes` buffered by its QUIC stack for connections not yet
    /// accepted (0 when unknown). It is also the worker's heartbeat: a data plane
    /// that stops receiving it marks the instance stalled (not placeable).
    Load { handshakes: u32, incoming_bytes: u32 },
    /// W → D: quinn reports the connection whose client's original DCID is `odcid`
    /// established (handshake complete). The data plane gives back the handshake
    /// ticket of the pin of that DCID placed on this instance, if it still holds one
    /// (docs/wire.md). At most [`MAX_ODCID_LEN`] bytes (RFC 9000 §17.2: a v1 CID is at
    /// most 20).
    HandshakeDone { odcid: Vec<u8> },
    /// Either way: why the sender is about to close the connection (or, from the data
    /// plane, a note on it).
    Error { reason: String },
}

mod tag {
    pub const DATA_HELLO: u8 = 0x40;
    // 0x41 was `DataHelloV2` (capabilities before protocol versions): unused.
    pub const SOCKETS: u8 = 0x42;
    pub const FAST_SOCKETS: u8 = 0x43;
    pub const RINGS: u8 = 0x44;
    pub const READY: u8 = 0x45;
    pub const DRAINING: u8 = 0x46;
    pub const LOAD: u8 = 0x47;
    pub const HANDSHAKE_DONE: u8 = 0x48;
}

impl Message for Data {
    fn encode_at(&self, version: u8, v: &mut Vec<u8>) {
        match self {
            Data::DataHello { announce, server_id } => {
                codec::hello(tag::DATA_HELLO, announce, v);
                v.extend_from_slice(&server_id.0.to_be_bytes());
            }
            Data::Welcome { version, caps } => codec::welcome(*version, *caps, v),
            Data::Sockets { addrs } => {
                codec::header(tag::SOCKETS, version, v);
                put_socket_addrs(v, addrs);
            }
            Data::FastSockets { addrs } => {
                codec::header(tag::FAST_SOCKETS, version, v);
                put_socket_addrs(v, addrs);
            }
            Data::Rings { count, bytes } => {
                codec::header(tag::RINGS, version, v);
                v.push(*count);
                v.extend_from_slice(&bytes.to_be_bytes());
            }
            Data::Ready => codec::header(tag::READY, version, v),
            Data::Draining => codec::header(tag::DRAINING, version, v),
            Data::Load { handshakes, incoming_bytes } => {
                codec::header(tag::LOAD, version, v);
                v.extend_from_slice(&handshakes.to_be_bytes());
                v.extend_from_slice(&incoming_bytes.to_be_bytes());
            }
            Data::HandshakeDone { odcid } => {
                codec::header(tag::HANDSHAKE_DONE, version, v);
                let n = odcid.len().min(MAX_ODCID_LEN);
                v.push(n as u8);
                v.extend_from_slice(&odcid[..n]);
            }
            Data::Error { reason } => codec::error(reason, version, v),
        }
    }

    fn decode(rec: &[u8]) -> Result<Self, WireError> {
        let (version, t, mut c) = codec::open(rec, Conversation::Data)?;
        let m = match t {
            tag::DATA_HELLO => Data::DataHello { announce: c.announce(version)?, server_id: ServerId(c.u16()?) },
            WELCOME => Data::Welcome { version, caps: c.u64()? },
            tag::SOCKETS => Data::Sockets { addrs: c.socket_addrs()? },
            tag::FAST_SOCKETS => Data::FastSockets { addrs: c.socket_addrs()? },
            tag::RINGS => {
                let count = c.u8()?;
                if count > MAX_RINGS {
                    return Err(WireError::TooMany);
                }
                let bytes = c.u64()?;
                // count 0, bytes 0: "no rings, frames stay on this connection".
                if (count == 0) != (bytes == 0) || (count > 0 && !crate::ring::valid_capacity(bytes)) {
                    return Err(WireError::ReservedBits);
                }
                Data::Rings { count, bytes }
            }
            tag::READY => Data::Ready,
            tag::DRAINING => Data::Draining,
            tag::LOAD => Data::Load { handshakes: c.u32()?, incoming_bytes: c.u32()? },
            tag::HANDSHAKE_DONE => {
                let n = usize::from(c.u8()?);
                if n > MAX_ODCID_LEN {
                    return Err(WireError::TooMany);
                }
                Data::HandshakeDone { odcid: c.take(n)?.to_vec() }
            }
            ERROR => Data::Error { reason: c.text()? },
            other => return Err(WireError::UnknownMessage(other)),
        };
        c.finish(m)
    }

    fn name(&self) -> &'static str {
        match self {
            Data::DataHello { .. } => "DataHello",
            Data::Welcome { .. } => "Welcome",
            Data::Sockets { .. } => "Sockets",
            Data::FastSockets { .. } => "FastSockets",
            Data::Rings { .. } => "Rings",
            Data::Ready => "Ready",
            Data::Draining => "Draining",
            Data::Load { .. } => "Load",
            Data::HandshakeDone { .. } => "HandshakeDone",
            Data::Error { .. } => "Error",
        }
    }

    fn carries_fds(&self) -> bool {
        matches!(self, Data::Sockets { .. } | Data::FastSockets { .. } | Data::Rings { .. })
    }

    fn is_frozen(&self) -> bool {
        matches!(self, Data::DataHello { .. } | Data::Welcome { .. } | Data::Error { .. })
    }

    fn error(reason: String) -> Self {
        Data::Error { reason }
    }

    fn welcome(version: u8, caps: u64) -> Self {
        Data::Welcome { version, caps }
    }
}
