//! The pieces every control record is made of: the record header with its version
//! and tag ranges, the frozen records (hello announcement, `Welcome`, `Error`), and
//! the body fields (addresses, keys, text) with their checks.

use super::version::{Announce, Window, FIRST_VERSION};
use super::{Conversation, KeyGen, Keys, WireError, CONTROL_MAGIC, ERROR, MAX_SOCKETS, MAX_TEXT, WELCOME};
use crate::cid::{Generation, Prf};
use crate::cid_format::CidFormat;
use crate::quic_lb;

/// The first protocol version whose `Keys` carry a CID format per generation (ADR 0007).
pub const CID_FORMAT_VERSION: u8 = 4;
/// The PRF code a quic-lb generation is written with in a version before
/// [`CID_FORMAT_VERSION`]: no reader knows it ([`put_keys`]).
pub const NO_PRF_IN_THIS_VERSION: u8 = 0xff;
const FORMAT_ADR1: u8 = 0;
const FORMAT_QUIC_LB: u8 = 1;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Starts a record: magic, protocol `version`, `tag`.
pub(super) fn header(tag: u8, version: u8, out: &mut Vec<u8>) {
    out.extend_from_slice(&[CONTROL_MAGIC, version, tag]);
}

/// Reads a record's header for `conv`: its protocol version (one from
/// [`FIRST_VERSION`] on: 1 and 2 are the formats of builds before negotiation),
/// the tag (one of `conv`'s range, [`ERROR`] or [`WELCOME`]) and a cursor on the
/// body.
pub(super) fn open(rec: &[u8], conv: Conversation) -> Result<(u8, u8, Cur<'_>), WireError> {
    let mut c = Cur { b: rec };
    if c.u8()? != CONTROL_MAGIC {
        return Err(WireError::BadMagic);
    }
    let ver = c.u8()?;
    if ver < FIRST_VERSION {
        return Err(WireError::UnsupportedVersion(ver));
    }
    let tag = c.u8()?;
    if tag == ERROR || tag == WELCOME || conv.tags().contains(&tag) {
        return Ok((ver, tag, c));
    }
    match Conversation::of_tag(tag) {
        Some(belongs_to) => Err(WireError::WrongConversation { tag, belongs_to }),
        None => Err(WireError::UnknownMessage(tag)),
    }
}

/// `Error { reason }`'s record (frozen: the same in every version).
pub(super) fn error(reason: &str, version: u8, out: &mut Vec<u8>) {
    header(ERROR, version, out);
    put_text(out, reason);
}

/// `Welcome { version, caps }`'s record (frozen): caps u64.
pub(super) fn welcome(version: u8, caps: u64, out: &mut Vec<u8>) {
    header(WELCOME, version, out);
    out.extend_from_slice(&caps.to_be_bytes());
}

/// A hello's header and announcement (frozen): the version byte is the sender's
/// newest, then oldest u8, caps u64. The conversation's own fields follow.
pub(super) fn hello(tag: u8, a: &Announce, out: &mut Vec<u8>) {
    header(tag, a.window.newest, out);
    out.push(a.window.oldest);
    out.extend_from_slice(&a.caps.to_be_bytes());
}

/// The 16-byte address field: IPv4 in the first 4 bytes, the rest zero.
pub(super) fn put_addr(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            out[..4].copy_from_slice(&v4.octets());
            out[4..16].fill(0);
        }
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
}

/// The 16-byte address field back; nonzero IPv4 padding is an error.
pub(super) fn get_addr(b: &[u8], v6: bool) -> Result<IpAddr, WireError> {
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

/// `n u8` then per address `family u8 (4|6), ip [16], port u16` (at most MAX_SOCKETS).
pub(super) fn put_socket_addrs(v: &mut Vec<u8>, addrs: &[SocketAddr]) {
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
/// u8 (ADR 0004), secret [32], and from [`CID_FORMAT_VERSION`] on its CID format
/// (ADR 0007): format u8 (0 adr1, 1 quic-lb), for quic-lb config id u8, server-id
/// length u8, nonce length u8, flags u8 (bit 0 keyed, bit 1 self-encoded length),
/// [key [16] when keyed].
///
/// In an older version a quic-lb generation has no field to go in: it is written with
/// the PRF code [`NO_PRF_IN_THIS_VERSION`], which that version's reader refuses
/// (`BadPrf`, and with it the whole `Keys`), never reads as adr1. The controller
/// issues no quic-lb generation while such a peer is registered (docs/wire.md
/// "Versions").
pub(super) fn put_keys(v: &mut Vec<u8>, version: u8, k: &Keys) {
    let put = |v: &mut Vec<u8>, g: &KeyGen| {
        v.push(g.generation.get());
        let carried = version >= CID_FORMAT_VERSION || g.format == CidFormat::Adr1;
        v.push(if carried { g.prf.code() } else { NO_PRF_IN_THIS_VERSION });
        v.extend_from_slice(&g.secret);
        if version < CID_FORMAT_VERSION {
            return;
        }
        match &g.format {
            CidFormat::Adr1 => v.push(FORMAT_ADR1),
            CidFormat::QuicLb(p) => {
                v.push(FORMAT_QUIC_LB);
                let flags = u8::from(p.key.is_some()) | (u8::from(p.self_encoded_len) << 1);
                v.extend_from_slice(&[p.config_id.get(), p.server_id_len, p.nonce_len, flags]);
                if let Some(key) = &p.key {
                    v.extend_from_slice(key);
                }
            }
        }
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

/// Length u32 then UTF-8, cut at MAX_TEXT bytes (never inside a UTF-8 sequence).
pub(super) fn put_text(v: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(MAX_TEXT)];
    let mut n = b.len();
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    v.extend_from_slice(&(n as u32).to_be_bytes());
    v.extend_from_slice(&b[..n]);
}

/// A cursor over a record's body: every read checks its length.
pub(super) struct Cur<'a> {
    pub(super) b: &'a [u8],
}

impl<'a> Cur<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(WireError::Truncated);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    pub(super) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub(super) fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    /// A hello's announcement, in a record whose version byte was `newest`. Unknown
    /// capability bits are kept (the reader ignores them, `version::common_caps`).
    pub(super) fn announce(&mut self, newest: u8) -> Result<Announce, WireError> {
        let oldest = self.u8()?;
        let window = Window { oldest, newest };
        if !window.is_valid() {
            return Err(WireError::BadWindow { oldest, newest });
        }
        Ok(Announce { window, caps: self.u64()? })
    }
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub(super) fn socket_addrs(&mut self) -> Result<Vec<SocketAddr>, WireError> {
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
    fn key_gen(&mut self, version: u8) -> Result<KeyGen, WireError> {
        let (generation, prf, secret) = (self.generation()?, self.prf()?, self.array()?);
        let format = if version < CID_FORMAT_VERSION {
            CidFormat::Adr1
        } else {
            match self.u8()? {
                FORMAT_ADR1 => CidFormat::Adr1,
                FORMAT_QUIC_LB => {
                    let [id, server_id_len, nonce_len, flags] = self.array()?;
                    if flags & !0b11 != 0 {
                        return Err(WireError::ReservedBits);
                    }
                    let key = if flags & 1 != 0 { Some(self.array()?) } else { None };
                    let config_id = quic_lb::ConfigId::new(id).ok_or(WireError::BadCidFormat(generation.get()))?;
                    let p =
                        quic_lb::Params { config_id, server_id_len, nonce_len, key, self_encoded_len: flags & 2 != 0 };
                    let f = CidFormat::QuicLb(p);
                    f.check(generation).map_err(|_| WireError::BadCidFormat(generation.get()))?;
                    f
                }
                other => return Err(WireError::UnknownCidFormat(other)),
            }
        };
        Ok(KeyGen { generation, prf, secret, format })
    }
    /// `Keys` of a record in protocol `version` ([`put_keys`]).
    pub(super) fn keys(&mut self, version: u8) -> Result<Keys, WireError> {
        let newest = self.key_gen(version)?;
        let previous = if self.bool()? {
            let p = self.key_gen(version)?;
            if p.generation == newest.generation {
                return Err(WireError::BadGeneration(p.generation.get()));
            }
            Some(p)
        } else {
            None
        };
        Ok(Keys { newest, previous })
    }
    pub(super) fn text(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        if n > MAX_TEXT {
            return Err(WireError::TooMany);
        }
        let b = self.take(n)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| WireError::BadUtf8)
    }
    /// The end of the record: nothing may follow the body.
    pub(super) fn finish<T>(self, m: T) -> Result<T, WireError> {
        if self.b.is_empty() {
            Ok(m)
        } else {
            Err(WireError::TrailingBytes)
        }
    }
}
