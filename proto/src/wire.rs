//! Wire formats between quicdemux processes (layout: docs/wire.md).
//!
//! - The data frame: one SOCK_SEQPACKET record from the demux to a worker, carrying
//!   one datagram or one GRO train plus its addressing metadata. The header is a
//!   fixed [`FRAME_HEADER_LEN`] bytes so the demux can send header and payload as two
//!   iovecs without copying the payload.
//! - Control messages: one SOCK_SEQPACKET record each, between controller, data plane
//!   and workers.
//!
//! Every decoder checks every length and reserved bit: malformed input is an error,
//! never a panic.

use crate::cid::{Generation, Prf, ServerId, KEY_LEN};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

/// First byte of a data frame.
pub const FRAME_MAGIC: u8 = 0xd7;
/// Data-frame layout version (2: the client's IPv6 scope id, bytes 44..48).
pub const FRAME_VERSION: u8 = 2;
/// Fixed data-frame header length.
pub const FRAME_HEADER_LEN: usize = 48;
/// Largest UDP payload (and so largest GRO train) a frame can carry.
pub const MAX_PAYLOAD: usize = 65_535;

const FLAG_CLIENT_V6: u8 = 0x01;
const FLAG_LOCAL: u8 = 0x02;
const FLAG_LOCAL_V6: u8 = 0x04;
const FLAGS_KNOWN: u8 = FLAG_CLIENT_V6 | FLAG_LOCAL | FLAG_LOCAL_V6;

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
            WireError::UnknownMessage(t) => write!(f, "unknown message type {t}"),
            WireError::BadGeneration(g) => write!(f, "key generation {g} out of range"),
            WireError::BadPrf(p) => write!(f, "unknown PRF code {p}"),
            WireError::TooMany => f.write_str("list longer than allowed"),
            WireError::TrailingBytes => f.write_str("trailing bytes"),
            WireError::BadUtf8 => f.write_str("text is not UTF-8"),
        }
    }
}
impl std::error::Error for WireError {}

/// Metadata of one forwarded datagram or GRO train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameMeta {
    /// The client's address and port (the datagram's source). An IPv6 one keeps its
    /// scope id (the receiving interface, for a link-local client: the worker cannot
    /// answer `fe80::…` without it); its flow label is not carried (zero).
    pub client: SocketAddr,
    /// The address the client sent to (IP_PKTINFO / IPV6_PKTINFO), when known; the
    /// worker answers from it.
    pub local: Option<SocketAddr>,
    /// The ECN codepoint of the IP header (RFC 3168: 0..=3).
    pub ecn: u8,
    /// GRO segment size; `None` for a single datagram.
    pub segment_size: Option<u16>,
}

fn put_addr(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            out[..4].copy_from_slice(&v4.octets());
            out[4..16].fill(0);
        }
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
}

fn get_addr(b: &[u8], v6: bool) -> Result<IpAddr, WireError> {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    if v6 {
        Ok(IpAddr::V6(Ipv6Addr::from(a)))
    } else if a[4..].iter().any(|&x| x != 0) {
        Err(WireError::ReservedBits)
    } else {
        Ok(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])))
    }
}

/// Writes the frame header for `meta` (the payload follows it in the same record).
pub fn encode_frame_header(meta: &FrameMeta, out: &mut [u8; FRAME_HEADER_LEN]) {
    let mut flags = 0;
    if meta.client.is_ipv6() {
        flags |= FLAG_CLIENT_V6;
    }
    out[0] = FRAME_MAGIC;
    out[1] = FRAME_VERSION;
    out[3] = meta.ecn & 0x03;
    out[4..6].copy_from_slice(&meta.segment_size.unwrap_or(0).to_be_bytes());
    out[6..8].copy_from_slice(&meta.client.port().to_be_bytes());
    put_addr(&mut out[8..24], meta.client.ip());
    match meta.local {
        Some(l) => {
            flags |= FLAG_LOCAL;
            if l.is_ipv6() {
                flags |= FLAG_LOCAL_V6;
            }
            put_addr(&mut out[24..40], l.ip());
            out[40..42].copy_from_slice(&l.port().to_be_bytes());
        }
        None => out[24..42].fill(0),
    }
    out[42..44].fill(0);
    let scope = match meta.client {
        SocketAddr::V6(c) => c.scope_id(),
        SocketAddr::V4(_) => 0,
    };
    out[44..48].copy_from_slice(&scope.to_be_bytes());
    out[2] = flags;
}

/// Encodes a whole frame into a new buffer (tests, tools; the demux uses iovecs).
pub fn encode_frame(meta: &FrameMeta, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    encode_frame_header(meta, &mut h);
    let mut v = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    v.extend_from_slice(&h);
    v.extend_from_slice(payload);
    v
}

/// Decodes one frame record into its metadata and payload.
pub fn decode_frame(rec: &[u8]) -> Result<(FrameMeta, &[u8]), WireError> {
    if rec.len() < FRAME_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let (hdr, payload) = rec.split_at(FRAME_HEADER_LEN);
    let mut h = [0u8; FRAME_HEADER_LEN];
    h.copy_from_slice(hdr);
    Ok((decode_frame_header(&h, payload.len())?, payload))
}

/// Decodes a frame header whose payload (not needed here) is `payload_len` bytes
/// long: the checks of [`decode_frame`] without the payload in the same buffer, for
/// a reader that copies the payload straight to where it is used (the worker's ring).
pub fn decode_frame_header(rec: &[u8; FRAME_HEADER_LEN], payload_len: usize) -> Result<FrameMeta, WireError> {
    if rec[0] != FRAME_MAGIC {
        return Err(WireError::BadMagic);
    }
    if rec[1] != FRAME_VERSION {
        return Err(WireError::UnsupportedVersion(rec[1]));
    }
    let flags = rec[2];
    if flags & !FLAGS_KNOWN != 0 || (flags & FLAG_LOCAL == 0 && flags & FLAG_LOCAL_V6 != 0) {
        return Err(WireError::ReservedBits);
    }
    if rec[3] > 3 {
        return Err(WireError::BadEcn);
    }
    if rec[42] != 0 || rec[43] != 0 {
        return Err(WireError::ReservedBits);
    }
    if payload_len == 0 {
        return Err(WireError::EmptyPayload);
    }
    if payload_len > MAX_PAYLOAD {
        return Err(WireError::PayloadTooLarge);
    }
    let seg = u16::from_be_bytes([rec[4], rec[5]]);
    let segment_size = match seg {
        0 => None,
        s if usize::from(s) <= payload_len => Some(s),
        _ => return Err(WireError::BadSegmentSize),
    };
    let port = u16::from_be_bytes([rec[6], rec[7]]);
    let scope = u32::from_be_bytes([rec[44], rec[45], rec[46], rec[47]]);
    let client = match get_addr(&rec[8..24], flags & FLAG_CLIENT_V6 != 0)? {
        IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope)),
        IpAddr::V4(_) if scope != 0 => return Err(WireError::ReservedBits),
        ip => SocketAddr::new(ip, port),
    };
    let local = if flags & FLAG_LOCAL != 0 {
        Some(SocketAddr::new(
            get_addr(&rec[24..40], flags & FLAG_LOCAL_V6 != 0)?,
            u16::from_be_bytes([rec[40], rec[41]]),
        ))
    } else {
        if rec[24..42].iter().any(|&b| b != 0) {
            return Err(WireError::ReservedBits);
        }
        None
    };
    Ok(FrameMeta { client, local, ecn: rec[3], segment_size })
}

// ---------------------------------------------------------------------------------
// Control messages
// ---------------------------------------------------------------------------------

/// First byte of a control message.
pub const CONTROL_MAGIC: u8 = 0xc7;
/// Control-protocol version.
pub const CONTROL_VERSION: u8 = 1;
/// Most instances one table update may list.
pub const MAX_INSTANCES: usize = 4096;
/// Most UDP sockets (listen addresses) one `Sockets` message may carry: the SCM_RIGHTS
/// limit is 253 fds per message (SCM_MAX_FD).
pub const MAX_SOCKETS: usize = 64;
/// Longest text (reasons, status) a control message may carry.
pub const MAX_TEXT: usize = 60_000;

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

/// What a process is, in its hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    Worker = 1,
    DataPlane = 2,
    Operator = 3,
}

/// An instance entry in a table update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceState {
    pub server_id: ServerId,
    pub placeable: bool,
}

/// Every control message. Directions are in the comments:
/// W = worker, C = controller, D = data plane, O = operator tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// W/D/O → C: who is connecting.
    Hello { role: Role, pid: u32 },
    /// C → W: your server id, the key generations and the shared secrets.
    /// The UDP socket fds travel with this record (SCM_RIGHTS).
    Assign { server_id: ServerId, keys: Keys, reset_key: [u8; 32], token_key: [u8; 32] },
    /// C → W, C → D: the key generations changed (rotation).
    KeysChanged { keys: Keys },
    /// W → C: ready for new connections (becomes placeable).
    Ready,
    /// W → C: draining, place nothing new here (stays live until it disconnects).
    Draining,
    /// C → D: the full set of live instances and the keys (a whole new snapshot).
    Table { keys: Keys, instances: Vec<InstanceState> },
    /// W → D, on a data connection: the frames on this connection are for this id.
    DataHello { server_id: ServerId },
    /// D → W (reply to `DataHello`), C → W (after `Assign`): the shared UDP sockets,
    /// one per listen address in this order; the fds travel with this record
    /// (SCM_RIGHTS). The worker only sends on them, never reads.
    Sockets { addrs: Vec<SocketAddr> },
    /// O → C/D: request the status text (JSON).
    StatusRequest,
    /// C/D → O: status as JSON text.
    Status { json: String },
    /// Any direction: why the sender is about to close the connection.
    Error { reason: String },
    /// C → D (on the data plane's control socket): hand back every UDP socket, all
    /// shards, shard-major (`[shard][listen index]`). The reply is `Sockets` with the
    /// fds attached. A restarted controller adopts a running data plane with it.
    GetSockets,
    /// W → C, instead of `Hello`: a worker that lost its control connection registers
    /// again under the server id it already has. The controller answers `Assign` with
    /// the same id (adopted) or `Error` (the worker must drain and exit).
    Rejoin { server_id: ServerId, pid: u32 },
    /// O → C: rotate the CID key generation now; the new generation uses `prf`
    /// (`None`: the newest generation's PRF). `force`: even within two CID lifetimes
    /// of the last rotation (second body byte, 0 or 1). Reply: `Status` (JSON) or
    /// `Error`.
    /// `from`: with `Stage`, stage the generation another host staged, from this key
    /// file (a path the controller reads), instead of a fresh one (ADR 0005 §3).
    RotateKeys { prf: Option<Prf>, force: bool, phase: RotatePhase, from: Option<String> },
    /// W → D, instead of `DataHello`: the same, plus capability bits ([`CAP_RINGS`]:
    /// the worker reads shared-memory rings). A data plane that knows the message
    /// answers `Sockets`, then `Rings` when it forwards over rings.
    DataHelloV2 { server_id: ServerId, caps: u32 },
    /// D → W: `count` shared-memory rings (one per shard) of `bytes` data bytes each
    /// (proto::ring layout); the fds travel with this record, ring-major: the memfd,
    /// then its eventfd, for each ring. Frames may still come on the connection too.
    /// The answer to every `DataHelloV2` (after `Sockets`); `count: 0, bytes: 0` when
    /// the data plane forwards over SEQPACKET only.
    Rings { count: u8, bytes: u64 },
    /// D → W, the answer to a `DataHelloV2` with [`CAP_FAST_PATH`], after `Sockets`
    /// and before `Rings`: this worker's own UDP sockets, one per listen address in
    /// `Sockets` order, each in that address's SO_REUSEPORT group, where the data
    /// plane's SK_REUSEPORT program steers this worker's established datagrams to it
    /// (docs/adr/0004). The worker receives on them and answers from them. The fds
    /// travel with this record; `addrs` is empty when the fast path is not active.
    FastSockets { addrs: Vec<SocketAddr> },
    /// W → D, on a live data connection, every [`LOAD_INTERVAL_MS`]: the worker's
    /// handshake pressure — `handshakes` in progress (accepted, not yet established)
    /// and `incoming_bytes` buffered by its QUIC stack for connections not yet
    /// accepted (0 when unknown). It is also the worker's heartbeat: a data plane
    /// that stops receiving it marks the instance stalled (not placeable).
    Load { handshakes: u32, incoming_bytes: u32 },
    /// W → D on the data connection: quinn reports the connection whose client's
    /// original DCID is `odcid` established (handshake complete). The data plane gives
    /// back the handshake ticket of the pin of that DCID placed on this instance, if it
    /// still holds one (docs/wire.md). At most [`MAX_ODCID_LEN`] bytes (RFC 9000
    /// §17.2: a v1 CID is at most 20).
    HandshakeDone { odcid: Vec<u8> },
}

/// How often a worker sends [`Control::Load`] (milliseconds).
pub const LOAD_INTERVAL_MS: u64 = 250;

/// Longest `HandshakeDone` DCID (RFC 9000 §17.2).
pub const MAX_ODCID_LEN: usize = 20;

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

/// `RotateKeys` body byte: keep the newest generation's PRF (else a PRF code).
pub const KEEP_PRF: u8 = 0xff;

/// `DataHelloV2` capability: the worker reads forwarding rings (`Rings`).
pub const CAP_RINGS: u32 = 0x1;
/// `DataHelloV2` capability: the worker receives on its own fast-path sockets
/// (`FastSockets`) as well as on the data connection.
pub const CAP_FAST_PATH: u32 = 0x2;
/// Capability bits this version knows; others are reserved (zero).
pub const CAPS_KNOWN: u32 = CAP_RINGS | CAP_FAST_PATH;
/// The most rings one `Rings` message announces (two fds each: 253 / 2 SCM_RIGHTS).
pub const MAX_RINGS: u8 = 64;

impl Control {
    /// The message's name for logs (never its contents: `Assign` carries secrets).
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello { .. } => "Hello",
            Control::Assign { .. } => "Assign",
            Control::KeysChanged { .. } => "KeysChanged",
            Control::Ready => "Ready",
            Control::Draining => "Draining",
            Control::Table { .. } => "Table",
            Control::DataHello { .. } => "DataHello",
            Control::Sockets { .. } => "Sockets",
            Control::StatusRequest => "StatusRequest",
            Control::Status { .. } => "Status",
            Control::Error { .. } => "Error",
            Control::GetSockets => "GetSockets",
            Control::Rejoin { .. } => "Rejoin",
            Control::RotateKeys { .. } => "RotateKeys",
            Control::DataHelloV2 { .. } => "DataHelloV2",
            Control::Rings { .. } => "Rings",
            Control::FastSockets { .. } => "FastSockets",
            Control::HandshakeDone { .. } => "HandshakeDone",
            Control::Load { .. } => "Load",
        }
    }
}

mod tag {
    pub const HELLO: u8 = 1;
    pub const ASSIGN: u8 = 2;
    pub const KEYS_CHANGED: u8 = 3;
    pub const READY: u8 = 4;
    pub const DRAINING: u8 = 5;
    pub const TABLE: u8 = 6;
    pub const DATA_HELLO: u8 = 7;
    pub const STATUS_REQUEST: u8 = 8;
    pub const STATUS: u8 = 9;
    pub const ERROR: u8 = 10;
    pub const SOCKETS: u8 = 11;
    pub const GET_SOCKETS: u8 = 12;
    pub const REJOIN: u8 = 13;
    pub const ROTATE_KEYS: u8 = 14;
    pub const DATA_HELLO_V2: u8 = 15;
    pub const RINGS: u8 = 16;
    pub const FAST_SOCKETS: u8 = 17;
    pub const LOAD: u8 = 18;
    pub const HANDSHAKE_DONE: u8 = 19;
}

/// `n u8` then per address `family u8 (4|6), ip [16], port u16` (at most MAX_SOCKETS).
fn put_socket_addrs(v: &mut Vec<u8>, addrs: &[SocketAddr]) {
    let n = addrs.len().min(MAX_SOCKETS);
    v.push(n as u8);
    for a in &addrs[..n] {
        v.push(if a.is_ipv6() { 6 } else { 4 });
        let mut b = [0u8; 16];
        put_addr(&mut b, a.ip());
        v.extend_from_slice(&b);
        v.extend_from_slice(&a.port().to_be_bytes());
    }
}

/// Keys = KeyGen, has-previous u8 (0/1), [KeyGen]; KeyGen = generation u8, PRF code
/// u8 (ADR 0004), secret [32].
fn put_keys(v: &mut Vec<u8>, k: &Keys) {
    let put = |v: &mut Vec<u8>, g: &KeyGen| {
        v.push(g.generation.get());
        v.push(g.prf.code());
        v.extend_from_slice(&g.secret);
    };
    put(v, &k.newest);
    match &k.previous {
        Some(p) => {
            v.push(1);
            put(v, p);
        }
        None => v.push(0),
    }
}

fn put_text(v: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(MAX_TEXT)];
    // Never cut inside a UTF-8 sequence.
    let mut n = b.len();
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    v.extend_from_slice(&(n as u32).to_be_bytes());
    v.extend_from_slice(&b[..n]);
}

/// Encodes a control message as one record.
pub fn encode_control(m: &Control) -> Vec<u8> {
    let mut v = vec![CONTROL_MAGIC, CONTROL_VERSION];
    match m {
        Control::Hello { role, pid } => {
            v.push(tag::HELLO);
            v.push(*role as u8);
            v.extend_from_slice(&pid.to_be_bytes());
        }
        Control::Assign { server_id, keys, reset_key, token_key } => {
            v.push(tag::ASSIGN);
            v.extend_from_slice(&server_id.0.to_be_bytes());
            put_keys(&mut v, keys);
            v.extend_from_slice(reset_key);
            v.extend_from_slice(token_key);
        }
        Control::KeysChanged { keys } => {
            v.push(tag::KEYS_CHANGED);
            put_keys(&mut v, keys);
        }
        Control::Ready => v.push(tag::READY),
        Control::Draining => v.push(tag::DRAINING),
        Control::Table { keys, instances } => {
            v.push(tag::TABLE);
            put_keys(&mut v, keys);
            let n = instances.len().min(MAX_INSTANCES);
            v.extend_from_slice(&(n as u16).to_be_bytes());
            for i in &instances[..n] {
                v.extend_from_slice(&i.server_id.0.to_be_bytes());
                v.push(u8::from(i.placeable));
            }
        }
        Control::DataHello { server_id } => {
            v.push(tag::DATA_HELLO);
            v.extend_from_slice(&server_id.0.to_be_bytes());
        }
        Control::Sockets { addrs } => {
            v.push(tag::SOCKETS);
            put_socket_addrs(&mut v, addrs);
        }
        Control::FastSockets { addrs } => {
            v.push(tag::FAST_SOCKETS);
            put_socket_addrs(&mut v, addrs);
        }
        Control::HandshakeDone { odcid } => {
            v.push(tag::HANDSHAKE_DONE);
            let n = odcid.len().min(MAX_ODCID_LEN);
            v.push(n as u8);
            v.extend_from_slice(&odcid[..n]);
        }
        Control::StatusRequest => v.push(tag::STATUS_REQUEST),
        Control::Status { json } => {
            v.push(tag::STATUS);
            put_text(&mut v, json);
        }
        Control::Error { reason } => {
            v.push(tag::ERROR);
            put_text(&mut v, reason);
        }
        Control::GetSockets => v.push(tag::GET_SOCKETS),
        Control::Rejoin { server_id, pid } => {
            v.push(tag::REJOIN);
            v.extend_from_slice(&server_id.0.to_be_bytes());
            v.extend_from_slice(&pid.to_be_bytes());
        }
        Control::RotateKeys { prf, force, phase, from } => {
            v.push(tag::ROTATE_KEYS);
            v.push(prf.map_or(KEEP_PRF, Prf::code));
            v.push(u8::from(*force) | phase.bits() << 1 | if from.is_some() { ROTATE_FROM } else { 0 });
            if let Some(f) = from {
                put_text(&mut v, f);
            }
        }
        Control::DataHelloV2 { server_id, caps } => {
            v.push(tag::DATA_HELLO_V2);
            v.extend_from_slice(&server_id.0.to_be_bytes());
            v.extend_from_slice(&caps.to_be_bytes());
        }
        Control::Rings { count, bytes } => {
            v.push(tag::RINGS);
            v.push(*count);
            v.extend_from_slice(&bytes.to_be_bytes());
        }
        Control::Load { handshakes, incoming_bytes } => {
            v.push(tag::LOAD);
            v.extend_from_slice(&handshakes.to_be_bytes());
            v.extend_from_slice(&incoming_bytes.to_be_bytes());
        }
    }
    v
}

struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(WireError::Truncated);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn socket_addrs(&mut self) -> Result<Vec<SocketAddr>, WireError> {
        let n = self.u8()? as usize;
        if n > MAX_SOCKETS {
            return Err(WireError::TooMany);
        }
        let mut addrs = Vec::with_capacity(n);
        for _ in 0..n {
            let v6 = match self.u8()? {
                4 => false,
                6 => true,
                _ => return Err(WireError::ReservedBits),
            };
            let ip = get_addr(self.take(16)?, v6)?;
            addrs.push(SocketAddr::new(ip, self.u16()?));
        }
        Ok(addrs)
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::ReservedBits),
        }
    }
    fn generation(&mut self) -> Result<Generation, WireError> {
        let g = self.u8()?;
        Generation::new(g).ok_or(WireError::BadGeneration(g))
    }
    fn prf(&mut self) -> Result<Prf, WireError> {
        let p = self.u8()?;
        Prf::from_code(p).ok_or(WireError::BadPrf(p))
    }
    fn key_gen(&mut self) -> Result<KeyGen, WireError> {
        Ok(KeyGen { generation: self.generation()?, prf: self.prf()?, secret: self.array()? })
    }
    fn keys(&mut self) -> Result<Keys, WireError> {
        let newest = self.key_gen()?;
        let previous = if self.bool()? {
            let p = self.key_gen()?;
            if p.generation == newest.generation {
                return Err(WireError::BadGeneration(p.generation.get()));
            }
            Some(p)
        } else {
            None
        };
        Ok(Keys { newest, previous })
    }
    fn text(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        if n > MAX_TEXT {
            return Err(WireError::TooMany);
        }
        let b = self.take(n)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| WireError::BadUtf8)
    }
}

/// Decodes one control record.
pub fn decode_control(rec: &[u8]) -> Result<Control, WireError> {
    let mut c = Cur { b: rec };
    if c.u8()? != CONTROL_MAGIC {
        return Err(WireError::BadMagic);
    }
    let ver = c.u8()?;
    if ver != CONTROL_VERSION {
        return Err(WireError::UnsupportedVersion(ver));
    }
    let t = c.u8()?;
    let m = match t {
        tag::HELLO => {
            let role = match c.u8()? {
                1 => Role::Worker,
                2 => Role::DataPlane,
                3 => Role::Operator,
                _ => return Err(WireError::ReservedBits),
            };
            Control::Hello { role, pid: c.u32()? }
        }
        tag::ASSIGN => Control::Assign {
            server_id: ServerId(c.u16()?),
            keys: c.keys()?,
            reset_key: c.array()?,
            token_key: c.array()?,
        },
        tag::KEYS_CHANGED => Control::KeysChanged { keys: c.keys()? },
        tag::READY => Control::Ready,
        tag::DRAINING => Control::Draining,
        tag::TABLE => {
            let keys = c.keys()?;
            let n = c.u16()? as usize;
            if n > MAX_INSTANCES {
                return Err(WireError::TooMany);
            }
            let mut instances = Vec::with_capacity(n);
            for _ in 0..n {
                instances.push(InstanceState { server_id: ServerId(c.u16()?), placeable: c.bool()? });
            }
            Control::Table { keys, instances }
        }
        tag::DATA_HELLO => Control::DataHello { server_id: ServerId(c.u16()?) },
        tag::SOCKETS => Control::Sockets { addrs: c.socket_addrs()? },
        tag::FAST_SOCKETS => Control::FastSockets { addrs: c.socket_addrs()? },
        tag::HANDSHAKE_DONE => {
            let n = usize::from(c.u8()?);
            if n > MAX_ODCID_LEN {
                return Err(WireError::TooMany);
            }
            Control::HandshakeDone { odcid: c.take(n)?.to_vec() }
        }
        tag::STATUS_REQUEST => Control::StatusRequest,
        tag::STATUS => Control::Status { json: c.text()? },
        tag::ERROR => Control::Error { reason: c.text()? },
        tag::GET_SOCKETS => Control::GetSockets,
        tag::REJOIN => Control::Rejoin { server_id: ServerId(c.u16()?), pid: c.u32()? },
        tag::ROTATE_KEYS => {
            let prf = match c.u8()? {
                KEEP_PRF => None,
                p => Some(Prf::from_code(p).ok_or(WireError::BadPrf(p))?),
            };
            let flags = c.u8()?;
            if flags & 0xf0 != 0 {
                return Err(WireError::ReservedBits);
            }
            let phase = match (flags >> 1) & 0b11 {
                0 => RotatePhase::Rotate,
                1 => RotatePhase::Stage,
                2 => RotatePhase::Activate,
                _ => return Err(WireError::ReservedBits),
            };
            let from = if flags & ROTATE_FROM != 0 { Some(c.text()?) } else { None };
            Control::RotateKeys { prf, force: flags & ROTATE_FORCE != 0, phase, from }
        }
        tag::DATA_HELLO_V2 => {
            let server_id = ServerId(c.u16()?);
            let caps = c.u32()?;
            if caps & !CAPS_KNOWN != 0 {
                return Err(WireError::ReservedBits);
            }
            Control::DataHelloV2 { server_id, caps }
        }
        tag::RINGS => {
            let count = c.u8()?;
            if count > MAX_RINGS {
                return Err(WireError::TooMany);
            }
            let hi = u64::from(c.u32()?);
            let bytes = hi << 32 | u64::from(c.u32()?);
            // count 0, bytes 0: "no rings, frames stay on this connection".
            if (count == 0) != (bytes == 0) || (count > 0 && !crate::ring::valid_capacity(bytes)) {
                return Err(WireError::ReservedBits);
            }
            Control::Rings { count, bytes }
        }
        tag::LOAD => Control::Load { handshakes: c.u32()?, incoming_bytes: c.u32()? },
        other => return Err(WireError::UnknownMessage(other)),
    };
    if !c.b.is_empty() {
        return Err(WireError::TrailingBytes);
    }
    Ok(m)
}

impl Keys {
    /// The routing key set these generations describe, each with its PRF.
    pub fn key_set(&self) -> Result<crate::cid::KeySet, crate::cid::KeySetError> {
        let t = |k: &KeyGen| (k.generation, k.prf, k.secret);
        crate::cid::KeySet::with_prfs(t(&self.newest), self.previous.as_ref().map(t))
    }
}
