//! Host-to-host forwarding frames (docs/adr/0005-server-ids-across-hosts.md): a
//! datagram that reached this host but whose server id belongs to another host is
//! sent there over UDP, with the client's address and the local (anycast) address it
//! was sent to, so the owning host can hand it to its worker as if it had arrived
//! there.
//!
//! ```text
//! magic "QDF1" (4) · sender host id (u16) · sequence (u64) ·
//! client address · local address · datagram · tag (16)
//! address = family (4 | 6) · IP (4 | 16 bytes) · port (u16)        all big-endian
//! tag     = HMAC-SHA-256(forwarding key, everything before it)[0..16]
//! ```
//!
//! The forwarding key is derived from the cluster's key file (every host has the same
//! one): HMAC-SHA-256(reset key, "quicdemux peer forwarding v1"). A frame whose tag
//! does not verify is dropped and counted; so is a replayed one: each receiver keeps,
//! per sender, a [`ReplayWindow`] over the sequence numbers (RFC 4303 §3.4.3), and a
//! sender numbers its frames `start time in seconds << 32 | counter`, so a restarted
//! sender's frames are newer than everything it sent before. An open forwarding port
//! therefore injects nothing: without the key no frame verifies, and a captured frame
//! verifies once.
//!
//! Pure: no sockets, no clocks (the sender passes its sequence numbers in).

use aws_lc_rs::{constant_time, hmac};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const MAGIC: [u8; 4] = *b"QDF1";
/// The truncated HMAC-SHA-256 tag (128 bits, RFC 2104 §5 allows truncation to half).
pub const TAG_LEN: usize = 16;
/// The label the forwarding key is derived with.
const KEY_LABEL: &[u8] = b"quicdemux peer forwarding v1";
/// The fixed part: magic, host id, sequence, tag.
const FIXED_LEN: usize = 4 + 2 + 8 + TAG_LEN;
/// Largest frame overhead: the fixed part and two IPv6 addresses.
pub const MAX_OVERHEAD: usize = FIXED_LEN + 2 * (1 + 16 + 2);

/// The key every host of a cluster authenticates its frames with.
pub struct ForwardingKey(hmac::Key);

impl ForwardingKey {
    /// Derived from the key file's reset key (identical on every host).
    pub fn derive(reset_key: &[u8; 32]) -> ForwardingKey {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, reset_key), KEY_LABEL);
        ForwardingKey(hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref()))
    }

    /// The tag [`seal`] appends to `bytes` (public for tests and the fuzz target,
    /// which build authentic frames around arbitrary bodies).
    pub fn tag(&self, bytes: &[u8]) -> [u8; TAG_LEN] {
        let t = hmac::sign(&self.0, bytes);
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&t.as_ref()[..TAG_LEN]);
        out
    }
}

impl std::fmt::Debug for ForwardingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForwardingKey(..)")
    }
}

/// A verified frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub from_host: u16,
    pub seq: u64,
    pub client: SocketAddr,
    pub local: SocketAddr,
    pub datagram: &'a [u8],
}

/// Why a received frame was dropped (each a counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Not a frame: wrong magic, or shorter than any frame.
    NotAFrame,
    /// The addresses or lengths do not parse.
    Malformed,
    /// The tag does not verify: forged, corrupted, or another cluster's key.
    Unauthenticated,
}

/// Writes the frame for `f` into `out` (cleared first).
pub fn seal(key: &ForwardingKey, f: &Frame<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&f.from_host.to_be_bytes());
    out.extend_from_slice(&f.seq.to_be_bytes());
    put_addr(out, f.client);
    put_addr(out, f.local);
    out.extend_from_slice(f.datagram);
    let tag = key.tag(out);
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

/// Parses and verifies a frame. The tag is checked before anything else is trusted
/// (and in constant time); the replay check is the caller's ([`ReplayWindow`]).
pub fn open<'a>(key: &ForwardingKey, bytes: &'a [u8]) -> Result<Frame<'a>, FrameError> {
    if bytes.len() < FIXED_LEN || bytes[..4] != MAGIC {
        return Err(FrameError::NotAFrame);
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    if constant_time::verify_slices_are_equal(&key.tag(body), tag).is_err() {
        return Err(FrameError::Unauthenticated);
    }
    let from_host = u16::from_be_bytes([body[4], body[5]]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&body[6..14]);
    let mut rest = &body[14..];
    let client = take_addr(&mut rest).ok_or(FrameError::Malformed)?;
    let local = take_addr(&mut rest).ok_or(FrameError::Malformed)?;
    Ok(Frame { from_host, seq: u64::from_be_bytes(seq), client, local, datagram: rest })
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

/// The sequence numbers a sender uses: its start time in whole seconds in the high 32
/// bits, a counter in the low 32. After 2^32 frames the counter carries into the
/// time half, which only moves the numbers further ahead.
#[derive(Clone, Debug)]
pub struct Sequencer {
    next: u64,
}

impl Sequencer {
    pub fn new(start_unix_secs: u32) -> Sequencer {
        Sequencer { next: u64::from(start_unix_secs) << 32 }
    }

    pub fn take(&mut self) -> u64 {
        let s = self.next;
        self.next = self.next.wrapping_add(1);
        s
    }
}

/// Anti-replay over one sender's sequence numbers (RFC 4303 §3.4.3): accepts each
/// number at most once, and nothing older than [`ReplayWindow::SIZE`] below the
/// highest accepted. Reordering within the window is fine.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    /// The highest accepted sequence number (`None`: nothing accepted yet).
    top: Option<u64>,
    /// Bit `i`: `top − i` was accepted.
    seen: [u64; ReplayWindow::WORDS],
}

impl ReplayWindow {
    const WORDS: usize = 16;
    /// How far below the highest accepted number a frame may still arrive.
    pub const SIZE: u64 = 64 * ReplayWindow::WORDS as u64;

    /// Whether `seq` is new; if so, it is recorded. Call only after the tag verified
    /// (an unauthenticated frame must not move the window).
    pub fn accept(&mut self, seq: u64) -> bool {
        let Some(top) = self.top else {
            self.top = Some(seq);
            self.seen = [0; Self::WORDS];
            self.seen[0] = 1;
            return true;
        };
        if seq > top {
            self.shift(seq - top);
            self.top = Some(seq);
            self.seen[0] |= 1;
            return true;
        }
        let behind = top - seq;
        if behind >= Self::SIZE {
            return false;
        }
        let (w, b) = ((behind / 64) as usize, behind % 64);
        if self.seen[w] & (1 << b) != 0 {
            return false;
        }
        self.seen[w] |= 1 << b;
        true
    }

    /// Moves every recorded bit `by` places older (bits past the window fall off).
    fn shift(&mut self, by: u64) {
        if by >= Self::SIZE {
            self.seen = [0; Self::WORDS];
            return;
        }
        let (words, bits) = ((by / 64) as usize, (by % 64) as u32);
        for i in (0..Self::WORDS).rev() {
            let lo = i.checked_sub(words).map_or(0, |j| self.seen[j]);
            let carry = match (bits, i.checked_sub(words + 1)) {
                (0, _) | (_, None) => 0,
                (_, Some(j)) => self.seen[j] >> (64 - bits),
            };
            self.seen[i] = (lo << bits) | carry;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> ForwardingKey {
        ForwardingKey::derive(&[b; 32])
    }

    fn frame(d: &[u8]) -> Frame<'_> {
        Frame {
            from_host: 3,
            seq: 42 << 32 | 7,
            client: "198.18.0.2:51000".parse().expect("addr"),
            local: "[2001:db8::9]:443".parse().expect("addr"),
            datagram: d,
        }
    }

    #[test]
    fn sealed_frames_open_to_what_was_sealed() {
        let mut out = Vec::new();
        let f = frame(&[0x40, 1, 2, 3]);
        seal(&key(1), &f, &mut out);
        assert_eq!(out.len(), f.datagram.len() + FIXED_LEN + (1 + 4 + 2) + (1 + 16 + 2));
        assert_eq!(open(&key(1), &out), Ok(f));
    }

    #[test]
    fn any_flipped_bit_or_other_key_is_refused() {
        let mut out = Vec::new();
        seal(&key(1), &frame(b"datagram"), &mut out);
        assert_eq!(open(&key(2), &out), Err(FrameError::Unauthenticated));
        for i in 4..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            assert_eq!(open(&key(1), &bad), Err(FrameError::Unauthenticated), "byte {i}");
        }
        assert_eq!(open(&key(1), &out[..out.len() - 1]), Err(FrameError::Unauthenticated));
        assert_eq!(open(&key(1), &out[..FIXED_LEN - 1]), Err(FrameError::NotAFrame));
        let mut wrong = out.clone();
        wrong[0] = b'X';
        assert_eq!(open(&key(1), &wrong), Err(FrameError::NotAFrame));
    }

    #[test]
    fn an_authenticated_frame_with_bad_addresses_is_malformed() {
        // Built by hand with a valid tag: family 5 does not exist.
        let k = key(1);
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[0, 1]);
        b.extend_from_slice(&[0; 8]);
        b.push(5);
        let tag = k.tag(&b);
        b.extend_from_slice(&tag);
        assert_eq!(open(&k, &b), Err(FrameError::Malformed));
    }

    #[test]
    fn the_key_is_derived_not_the_reset_key_itself() {
        let reset = [7u8; 32];
        let direct = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &reset), b"x");
        let derived = ForwardingKey::derive(&reset).0;
        assert_ne!(direct.as_ref(), hmac::sign(&derived, b"x").as_ref());
    }

    #[test]
    fn replay_window_basics() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(100));
        assert!(!w.accept(100), "a replay");
        assert!(w.accept(99), "reordered within the window");
        assert!(!w.accept(99));
        assert!(w.accept(100 + ReplayWindow::SIZE));
        assert!(!w.accept(100), "fell out of the window");
        assert!(w.accept(101), "still inside");
        let top = 100 + ReplayWindow::SIZE;
        assert!(!w.accept(top - ReplayWindow::SIZE), "exactly SIZE below the top is outside");
        assert!(w.accept(top - ReplayWindow::SIZE + 2), "near the oldest number inside, not yet seen");
        let mut s = Sequencer::new(5);
        assert_eq!((s.take(), s.take()), (5 << 32, (5 << 32) + 1));
    }
}

/// A `--peers` file: one `HOST_ID ADDR:PORT` line per other host (its forwarding
/// address); blank lines and `#` comments ignored. Strict: a host id at most once,
/// every line well formed.
pub fn parse_peers(text: &str) -> Result<Vec<(u16, SocketAddr)>, String> {
    let mut out: Vec<(u16, SocketAddr)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(id), Some(addr), None) = (it.next(), it.next(), it.next()) else {
            return Err(format!("line {}: expected `HOST_ID ADDR:PORT`", i + 1));
        };
        let id: u16 = id.parse().map_err(|_| format!("line {}: host id {id:?} is not 0..=65535", i + 1))?;
        let addr: SocketAddr = addr.parse().map_err(|_| format!("line {}: {addr:?} is not ADDR:PORT", i + 1))?;
        if out.iter().any(|(h, _)| *h == id) {
            return Err(format!("line {}: host id {id} given twice", i + 1));
        }
        out.push((id, addr));
    }
    Ok(out)
}

#[cfg(test)]
mod peers_file_tests {
    use super::parse_peers;

    #[test]
    fn peers_files_parse_strictly() {
        let ok = parse_peers("# cluster\n1 198.18.2.2:4434\n\n2 [2001:db8::2]:4434 # b\n").expect("valid");
        assert_eq!(ok, vec![(1, "198.18.2.2:4434".parse().unwrap()), (2, "[2001:db8::2]:4434".parse().unwrap())]);
        for (bad, why) in [
            ("1 198.18.2.2:4434\n1 198.18.2.3:4434", "line 2: host id 1 given twice"),
            ("1", "line 1: expected"),
            ("1 198.18.2.2:4434 extra", "line 1: expected"),
            ("x 198.18.2.2:4434", "line 1: host id \"x\""),
            ("70000 198.18.2.2:4434", "line 1: host id \"70000\""),
            ("1 198.18.2.2", "line 1: \"198.18.2.2\" is not ADDR:PORT"),
        ] {
            let e = parse_peers(bad).expect_err(bad);
            assert!(e.starts_with(why), "{bad:?}: {e}");
        }
    }
}
