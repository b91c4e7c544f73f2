//! The host-to-host frame (docs/adr/0005-server-ids-across-hosts.md §4).
//!
//! ```text
//! magic "QDF2" (4) · kind (u8) · from host (u16) · to host (u16) ·
//! from epoch (u64) · to epoch (u64) · sequence (u64) · ack (u64) · body · tag (16)
//! body, kind 0 (data)      = client address · local address · datagram
//! body, kind 1 (heartbeat) = nothing
//! address = family (4 | 6) · IP (4 | 16 bytes) · port (u16)        all big-endian
//! tag = AES-256-GCM-SIV (RFC 8452) under the frame key, nonce = from host · to host ·
//!       sequence (the header's bytes 5..9 and 25..33), associated data = every byte
//!       before the tag, empty plaintext
//! frame key = HMAC-SHA-256(forwarding secret, "quicdemux peer frame key v2")
//! ```
//!
//! The forwarding secret is the key file's `forwarding` line (proto::keyfile), which
//! the controller never sends a worker. The tag covers both host ids and both epochs,
//! so a frame is bound to its receiver and to that receiver's boot (proto::peer::session
//! has the acceptance rule). GCM-SIV resists nonce reuse: a repeated (from, to,
//! sequence) under one key reveals only that two frames are equal, never the key.
//! The receiver checks the tag before it parses anything past the magic, and accepts
//! the current secret or the other one (staged or previous, ADR 0005 §3).

use aws_lc_rs::{aead, constant_time, hmac};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const MAGIC: [u8; 4] = *b"QDF2";
/// The GCM-SIV tag (128 bits).
pub const TAG_LEN: usize = 16;
/// Magic, kind, both host ids, both epochs, sequence, ack.
pub const HEADER_LEN: usize = 4 + 1 + 2 + 2 + 8 + 8 + 8 + 8;
/// Largest overhead of a data frame: header, tag and two IPv6 addresses.
pub const MAX_OVERHEAD: usize = HEADER_LEN + TAG_LEN + 2 * (1 + 16 + 2);
/// The label the frame key is derived with.
const KEY_LABEL: &[u8] = b"quicdemux peer frame key v2";
const KIND_DATA: u8 = 0;
const KIND_HEARTBEAT: u8 = 1;

/// One forwarding secret's frame key.
pub struct FrameKey(aead::LessSafeKey);

impl FrameKey {
    /// The key of forwarding secret `secret` (module docs).
    pub fn new(secret: &[u8; 32]) -> FrameKey {
        let k = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), KEY_LABEL);
        match aead::UnboundKey::new(&aead::AES_256_GCM_SIV, k.as_ref()) {
            Ok(u) => FrameKey(aead::LessSafeKey::new(u)),
            // A 32-byte key is what AES-256-GCM-SIV takes.
            Err(_) => unreachable!("AES-256-GCM-SIV takes a 32-byte key"),
        }
    }

    /// The tag of `body` (every byte before the tag): public for tests and the fuzz
    /// target, which build authentic frames around arbitrary bodies. The nonce comes
    /// from the header bytes (zeros where `body` is shorter than a header).
    pub fn tag(&self, body: &[u8]) -> [u8; TAG_LEN] {
        let mut nonce = [0u8; 12];
        for (n, i) in nonce.iter_mut().zip((5..9).chain(25..33)) {
            *n = body.get(i).copied().unwrap_or(0);
        }
        let mut out = [0u8; TAG_LEN];
        // Sealing an empty plaintext cannot fail for a valid key and nonce.
        if let Ok(t) =
            self.0.seal_in_place_separate_tag(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(body), &mut [])
        {
            out.copy_from_slice(t.as_ref());
        }
        out
    }

    fn verifies(&self, body: &[u8], tag: &[u8]) -> bool {
        constant_time::verify_slices_are_equal(&self.tag(body), tag).is_ok()
    }
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(..)")
    }
}

/// The keys a host seals with (the current one) and accepts (both).
#[derive(Debug)]
pub struct FrameKeys {
    pub current: FrameKey,
    pub other: Option<FrameKey>,
    /// [`FrameKeys::id`] of each secret (current first), for status output.
    pub ids: Vec<String>,
}

impl FrameKeys {
    pub fn new(current: &[u8; 32], other: Option<&[u8; 32]>) -> FrameKeys {
        let ids = std::iter::once(current).chain(other).map(FrameKeys::id).collect();
        FrameKeys { current: FrameKey::new(current), other: other.map(FrameKey::new), ids }
    }

    /// A name for a forwarding secret that reveals nothing of it: the first 4 bytes
    /// of HMAC-SHA-256(secret, "quicdemux forwarding secret id"), in hex. Hosts of
    /// one cluster show the same names once a rotation step has run everywhere.
    pub fn id(secret: &[u8; 32]) -> String {
        let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), b"quicdemux forwarding secret id");
        t.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A key file's forwarding secrets.
    pub fn of(k: &crate::keyfile::KeyFile) -> FrameKeys {
        FrameKeys::new(&k.forwarding, k.forwarding_other.as_ref())
    }

    /// Which key verifies `tag` over `body`, the current one tried first.
    fn verifying(&self, body: &[u8], tag: &[u8]) -> Option<KeyUsed> {
        if self.current.verifies(body, tag) {
            Some(KeyUsed::Current)
        } else if self.other.as_ref().is_some_and(|k| k.verifies(body, tag)) {
            Some(KeyUsed::Other)
        } else {
            None
        }
    }

    /// The key to seal with: `used` as far as this host has it (the current one
    /// when it has no other).
    pub fn sealing(&self, used: KeyUsed) -> &FrameKey {
        match (used, &self.other) {
            (KeyUsed::Other, Some(k)) => k,
            _ => &self.current,
        }
    }
}

/// Which of a host's two accepted secrets verified a frame. A host seals its frames
/// to a peer with the one that verified that peer's latest frame (ADR 0005 §3: a
/// host that has not staged a rotation still exchanges frames, under the old secret,
/// with hosts that activated it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KeyUsed {
    #[default]
    Current,
    Other,
}

/// The header every frame carries (all of it under the tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub from_host: u16,
    pub to_host: u16,
    /// The sender's boot (proto::peer::session).
    pub from_epoch: u64,
    /// The receiver's boot as the sender knows it (0: not known).
    pub to_epoch: u64,
    /// Per sender and receiver (proto::peer::session::Outbound).
    pub seq: u64,
    /// The sequence number the sender expects next from the receiver in the
    /// sender's current boot (0: none accepted yet).
    pub ack: u64,
}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// A client's datagram and the addresses it travelled between.
    Data { client: SocketAddr, local: SocketAddr, datagram: &'a [u8] },
    /// Liveness, and the handshake (proto::peer::session).
    Heartbeat,
}

/// A frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub header: Header,
    pub body: Body<'a>,
}

/// Why a received frame was dropped (each a counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Not a frame: wrong magic, or shorter than any frame.
    NotAFrame,
    /// Authentic, but the kind, addresses or lengths do not parse.
    Malformed,
    /// The tag does not verify: forged, corrupted, or another cluster's secret.
    Unauthenticated,
}

/// Writes the frame for `f`, sealed with `key`, into `out` (cleared first).
pub fn seal(key: &FrameKey, f: &Frame<'_>, out: &mut Vec<u8>) {
    out.clear();
    seal_append(key, f, out);
}

/// Appends the frame for `f`, sealed with `key`, to `out` (a batch of frames back to
/// back, one per datagram of a GSO send): the tag covers only this frame's bytes.
pub fn seal_append(key: &FrameKey, f: &Frame<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    let h = &f.header;
    out.extend_from_slice(&MAGIC);
    out.push(match f.body {
        Body::Data { .. } => KIND_DATA,
        Body::Heartbeat => KIND_HEARTBEAT,
    });
    out.extend_from_slice(&h.from_host.to_be_bytes());
    out.extend_from_slice(&h.to_host.to_be_bytes());
    out.extend_from_slice(&h.from_epoch.to_be_bytes());
    out.extend_from_slice(&h.to_epoch.to_be_bytes());
    out.extend_from_slice(&h.seq.to_be_bytes());
    out.extend_from_slice(&h.ack.to_be_bytes());
    if let Body::Data { client, local, datagram } = f.body {
        put_addr(out, client);
        put_addr(out, local);
        out.extend_from_slice(datagram);
    }
    let tag = key.tag(&out[start..]);
    out.extend_from_slice(&tag);
}

fn put_addr(out: &mut Vec<u8>, a: SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&a.port().to_be_bytes());
}

/// Parses and verifies a frame. The tag is checked (in constant time, under each
/// accepted key) before anything past the magic is read; the acceptance rule is the
/// caller's (proto::peer::session).
pub fn open<'a>(keys: &FrameKeys, bytes: &'a [u8]) -> Result<Frame<'a>, FrameError> {
    open_with(keys, bytes).map(|(f, _)| f)
}

/// [`open`], and which key verified the frame.
pub fn open_with<'a>(keys: &FrameKeys, bytes: &'a [u8]) -> Result<(Frame<'a>, KeyUsed), FrameError> {
    if bytes.len() < HEADER_LEN + TAG_LEN || bytes[..4] != MAGIC {
        return Err(FrameError::NotAFrame);
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    let Some(used) = keys.verifying(body, tag) else {
        return Err(FrameError::Unauthenticated);
    };
    let u16_at = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[i..i + 8]);
        u64::from_be_bytes(b)
    };
    let header = Header {
        from_host: u16_at(5),
        to_host: u16_at(7),
        from_epoch: u64_at(9),
        to_epoch: u64_at(17),
        seq: u64_at(25),
        ack: u64_at(33),
    };
    let mut rest = &body[HEADER_LEN..];
    let body = match body[4] {
        KIND_DATA => {
            let client = take_addr(&mut rest).ok_or(FrameError::Malformed)?;
            let local = take_addr(&mut rest).ok_or(FrameError::Malformed)?;
            Body::Data { client, local, datagram: rest }
        }
        KIND_HEARTBEAT if rest.is_empty() => Body::Heartbeat,
        _ => return Err(FrameError::Malformed),
    };
    Ok((Frame { header, body }, used))
}

fn take_addr(rest: &mut &[u8]) -> Option<SocketAddr> {
    let (&family, tail) = rest.split_first()?;
    let ip_len = match family {
        4 => 4,
        6 => 16,
        _ => return None,
    };
    let ip = tail.get(..ip_len)?;
    let port = tail.get(ip_len..ip_len + 2)?;
    let ip: IpAddr = if ip_len == 4 {
        Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).into()
    } else {
        let mut o = [0u8; 16];
        o.copy_from_slice(ip);
        Ipv6Addr::from(o).into()
    };
    *rest = &tail[ip_len + 2..];
    Some(SocketAddr::new(ip, u16::from_be_bytes([port[0], port[1]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> FrameKeys {
        FrameKeys::new(&[b; 32], None)
    }

    fn header() -> Header {
        Header { from_host: 3, to_host: 1, from_epoch: 0x1111, to_epoch: 0x2222, seq: 42, ack: 17 }
    }

    fn data(d: &[u8]) -> Frame<'_> {
        Frame {
            header: header(),
            body: Body::Data {
                client: "198.18.0.2:51000".parse().expect("addr"),
                local: "[2001:db8::9]:443".parse().expect("addr"),
                datagram: d,
            },
        }
    }

    #[test]
    fn sealed_frames_open_to_what_was_sealed() {
        let mut out = Vec::new();
        let f = data(&[0x40, 1, 2, 3]);
        seal(&keys(1).current, &f, &mut out);
        assert_eq!(out.len(), 4 + HEADER_LEN + TAG_LEN + (1 + 4 + 2) + (1 + 16 + 2));
        assert!(out.len() - 4 <= MAX_OVERHEAD);
        assert_eq!(&out[..5], b"QDF2\0");
        assert_eq!(open(&keys(1), &out), Ok(f));
        let hb = Frame { header: header(), body: Body::Heartbeat };
        seal(&keys(1).current, &hb, &mut out);
        assert_eq!(out.len(), HEADER_LEN + TAG_LEN);
        assert_eq!(open(&keys(1), &out), Ok(hb));
    }

    /// Frames appended back to back are each the frame `seal` makes alone (the tag
    /// covers only its own frame, not what precedes it in the buffer).
    #[test]
    fn appended_frames_are_each_a_sealed_frame() {
        let (a, b) = (data(&[0x40, 1, 2, 3]), Frame { header: header(), body: Body::Heartbeat });
        let (mut alone_a, mut alone_b) = (Vec::new(), Vec::new());
        seal(&keys(1).current, &a, &mut alone_a);
        seal(&keys(1).current, &b, &mut alone_b);
        let mut batch = b"prefix".to_vec();
        seal_append(&keys(1).current, &a, &mut batch);
        seal_append(&keys(1).current, &b, &mut batch);
        assert_eq!(&batch[..6], b"prefix");
        let (got_a, got_b) = batch[6..].split_at(alone_a.len());
        assert_eq!((got_a, got_b), (&alone_a[..], &alone_b[..]));
        assert_eq!(open(&keys(1), got_b), Ok(b));
    }

    /// The byte layout, field by field (docs/adr/0005 §4).
    #[test]
    fn header_layout() {
        let mut out = Vec::new();
        let h = Header { from_host: 0x0102, to_host: 0x0304, from_epoch: 5, to_epoch: 6, seq: 7, ack: 8 };
        seal(&keys(1).current, &Frame { header: h, body: Body::Heartbeat }, &mut out);
        let want: Vec<u8> = [&b"QDF2"[..], &[1], &[1, 2], &[3, 4]]
            .into_iter()
            .flatten()
            .copied()
            .chain([5u64, 6, 7, 8].iter().flat_map(|v| v.to_be_bytes()))
            .collect();
        assert_eq!(&out[..out.len() - TAG_LEN], &want[..]);
    }

    #[test]
    fn any_flipped_bit_or_other_key_is_refused() {
        let mut out = Vec::new();
        seal(&keys(1).current, &data(b"datagram"), &mut out);
        assert_eq!(open(&keys(2), &out), Err(FrameError::Unauthenticated));
        for i in 4..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            assert_eq!(open(&keys(1), &bad), Err(FrameError::Unauthenticated), "byte {i}");
        }
        assert_eq!(open(&keys(1), &out[..out.len() - 1]), Err(FrameError::Unauthenticated));
        assert_eq!(open(&keys(1), &out[..HEADER_LEN + TAG_LEN - 1]), Err(FrameError::NotAFrame));
        let mut wrong = out.clone();
        wrong[0] = b'X';
        assert_eq!(open(&keys(1), &wrong), Err(FrameError::NotAFrame));
    }

    /// Two-phase rotation (ADR 0005 §3): a receiver accepts the current and the other
    /// secret; a key set without the sender's secret refuses.
    #[test]
    fn either_accepted_secret_opens() {
        let (old, new) = ([1u8; 32], [2u8; 32]);
        let mut by_old = Vec::new();
        seal(&FrameKey::new(&old), &data(b"x"), &mut by_old);
        let mut by_new = Vec::new();
        seal(&FrameKey::new(&new), &data(b"x"), &mut by_new);
        let staged = FrameKeys::new(&old, Some(&new));
        let activated = FrameKeys::new(&new, Some(&old));
        for k in [&staged, &activated] {
            assert!(open(k, &by_old).is_ok() && open(k, &by_new).is_ok());
        }
        assert_eq!(open_with(&staged, &by_old).map(|(_, k)| k), Ok(KeyUsed::Current));
        assert_eq!(open_with(&staged, &by_new).map(|(_, k)| k), Ok(KeyUsed::Other));
        assert_eq!(open_with(&activated, &by_old).map(|(_, k)| k), Ok(KeyUsed::Other));
        // Sealing with the key a peer used: the other one when there is one.
        let mut again = Vec::new();
        seal(activated.sealing(KeyUsed::Other), &data(b"x"), &mut again);
        assert_eq!(again, by_old);
        seal(FrameKeys::new(&new, None).sealing(KeyUsed::Other), &data(b"x"), &mut again);
        assert_eq!(again, by_new, "no other key: the current one");
        assert_eq!(open(&FrameKeys::new(&new, None), &by_old), Err(FrameError::Unauthenticated));
        assert_eq!(open(&FrameKeys::new(&old, Some(&[3; 32])), &by_new), Err(FrameError::Unauthenticated));
        assert_eq!(staged.ids, vec![FrameKeys::id(&old), FrameKeys::id(&new)]);
        assert_eq!(activated.ids, vec![FrameKeys::id(&new), FrameKeys::id(&old)]);
        assert_ne!(FrameKeys::id(&old), FrameKeys::id(&new));
        assert_eq!(FrameKeys::id(&old).len(), 8);
    }

    #[test]
    fn authenticated_but_unparsable_frames_are_malformed() {
        let k = keys(1);
        let with_tag = |mut b: Vec<u8>| {
            let tag = k.current.tag(&b);
            b.extend_from_slice(&tag);
            b
        };
        let mut head = MAGIC.to_vec();
        head.push(0);
        head.extend_from_slice(&[0; HEADER_LEN - 5]);
        // Family 5 does not exist.
        let mut b = head.clone();
        b.push(5);
        assert_eq!(open(&k, &with_tag(b)), Err(FrameError::Malformed));
        // A truncated address.
        let mut b = head.clone();
        b.extend_from_slice(&[4, 1, 2]);
        assert_eq!(open(&k, &with_tag(b)), Err(FrameError::Malformed));
        // Kind 2 does not exist; a heartbeat has no body.
        let mut b = head.clone();
        b[4] = 2;
        assert_eq!(open(&k, &with_tag(b)), Err(FrameError::Malformed));
        for n in [1, 8] {
            let mut b = head.clone();
            b[4] = 1;
            b.extend(std::iter::repeat_n(0, n));
            assert_eq!(open(&k, &with_tag(b)), Err(FrameError::Malformed), "a heartbeat with {n} body bytes");
        }
        let mut b = head.clone();
        b[4] = 1;
        assert!(open(&k, &with_tag(b)).is_ok(), "the same with no body");
    }

    /// The frame key is derived from the secret with a label: a frame tagged under
    /// the secret itself as the key does not verify.
    #[test]
    fn the_key_is_derived_not_the_secret_itself() {
        let secret = [7u8; 32];
        let raw = aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_256_GCM_SIV, &secret).expect("key"));
        let mut out = Vec::new();
        seal(&FrameKey::new(&secret), &data(b"x"), &mut out);
        let (body, tag) = out.split_at(out.len() - TAG_LEN);
        let mut nonce = [0u8; 12];
        nonce[..4].copy_from_slice(&body[5..9]);
        nonce[4..].copy_from_slice(&body[25..33]);
        let t = raw
            .seal_in_place_separate_tag(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(body), &mut [])
            .expect("seal");
        assert_ne!(t.as_ref(), tag);
        // …and the nonce/AAD construction is what the docs say: under the derived key
        // it reproduces the tag.
        let k = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &secret), KEY_LABEL);
        let derived = aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_256_GCM_SIV, k.as_ref()).expect("key"));
        let t = derived
            .seal_in_place_separate_tag(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(body), &mut [])
            .expect("seal");
        assert_eq!(t.as_ref(), tag);
    }
}
