//! # quicdemux-proto
//!
//! The sans-IO core shared by the demux, the workers and the tools: pure functions
//! over bytes, time passed in, no sockets, no clocks, no threads, no `unsafe`.
//!
//! - [`cid`]: ADR 0001 connection IDs (encode / decode, key generations).
//! - [`cid_format`]: the CID format of a key generation: ADR 0001 or QUIC-LB (ADR 0007).
//! - [`prf`]: the per-generation PRF that masks server ids (ADR 0004).
//! - [`quic_lb`]: QUIC-LB connection IDs (draft-ietf-quic-load-balancers-21): plaintext, single-pass AES, four-pass Feistel.
//! - [`decode_cache`]: a per-shard cache of CID decodes (skips the HMAC for repeat DCIDs).
//! - [`header`]: the cleartext QUIC header (RFC 8999, RFC 9000 §17, RFC 9369).
//! - [`initial`]: client Initials opened with their public keys (does a datagram start a connection?).
//! - [`initial_protection`]: the Initial keys (RFC 9001 §5.2, the one derivation) and the checks on a first Initial before a Retry.
//! - [`token`]: quinn 0.11 address-validation tokens checked (Retry and NEW_TOKEN).
//! - [`route`]: the ADR 0001 routing table as a function of datagram and snapshot.
//! - [`pin`]: the fixed-capacity 10 s placement pin table.
//! - [`rendezvous`]: keyed highest-random-weight hashing.
//! - [`limits`]: per-source limits in fixed memory (GCRA and count-min lanes sketches), and the rule for client Initials on a live DCID.
//! - [`retry`]: Retry packets and their integrity tag (RFC 9000 §17.2.5, RFC 9001 §5.8); the Retry minter.
//! - [`version_negotiation`]: Version Negotiation packets (RFC 9000 §17.2.1) for versions the workers do not speak.
//! - [`keyfile`]: the shared-secrets file of the state directory.
//! - [`wire`]: data frames, and one message type per conversation between processes (registration, data, admin).
//! - [`wire_version`]: the versions of those formats, as `--version` prints them.
//! - [`ring`]: layout and index arithmetic of the shared-memory forwarding ring.
#![forbid(unsafe_code)]

pub mod cid;
pub mod cid_format;
mod counter_enum;
pub mod decode_cache;
pub mod header;
pub mod host;
pub mod initial;
pub mod initial_protection;
pub mod keyfile;
pub mod limits;
pub mod peer;
pub mod pin;
pub mod prf;
pub mod quic_lb;
pub mod rendezvous;
pub mod retry;
pub mod ring;
pub mod route;
pub mod token;
pub mod version_negotiation;
pub mod wire;
pub mod wire_version;

pub use cid::{Decoded, Generation, KeySet, Prf, ServerId, Unroutable, CID_LEN};
pub use decode_cache::{DecodeCache, Decoder, Uncached};
pub use header::{Header, HeaderError, LongHeader, LongType};
pub use pin::PinTable;
pub use route::{
    Admission, Decision, InstanceInfo, LiveInitial, NoAdmission, OwnerInitial, Reason, Router, Table, TrainRun,
};
