//! Datagram builders: pure functions of (buffer, keys, randomness). No I/O.
//!
//! Every builder fills a caller-supplied buffer and returns how many bytes it used.
//! The demux never decrypts, so everything it does not read is random.

use proto::cid::{KeySet, ServerId, CID_LEN, CID_RANDOM_LEN, CR_UNROUTABLE};
use proto::header::{MIN_AFTER_PN_OFFSET, VERSION_1};

/// Smallest datagram a client may carry an Initial in (RFC 9000 §14.1).
pub const MIN_INITIAL: usize = 1200;
/// Smallest short-header datagram the demux routes: first byte, 12-byte DCID and a
/// header-protection sample (RFC 9001 §5.4.2).
pub const MIN_SHORT: usize = 1 + CID_LEN + MIN_AFTER_PN_OFFSET;
/// Largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;

/// A small, fast, non-cryptographic PRNG (xoshiro256**, seeded by splitmix64).
/// Load generation needs varied bytes, not secrecy.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// A seed that differs per process and per call (std's randomly keyed hasher).
    pub fn from_entropy(salt: u64) -> Rng {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        Rng::new(h.finish())
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    pub fn u8(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    /// Uniform in `lo..=hi` (tiny bias is irrelevant here).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(lo <= hi);
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&last[..n]);
    }

    pub fn cid_random(&mut self) -> [u8; CID_RANDOM_LEN] {
        let mut r = [0u8; CID_RANDOM_LEN];
        self.fill(&mut r);
        r
    }
}

/// Writes an RFC 9000 §16 varint of exactly `len` bytes (1, 2, 4 or 8); returns false
/// if `v` does not fit.
fn put_varint(buf: &mut [u8], v: u64, len: usize) -> bool {
    let (max, tag) = match len {
        1 => (63u64, 0x00u8),
        2 => (16_383, 0x40),
        4 => (1_073_741_823, 0x80),
        8 => (4_611_686_018_427_387_903, 0xc0),
        _ => return false,
    };
    if v > max || buf.len() < len {
        return false;
    }
    let be = v.to_be_bytes();
    buf[..len].copy_from_slice(&be[8 - len..]);
    buf[0] |= tag;
    true
}

/// Where an Initial's DCID starts (after first byte, version and DCID length); every
/// DCID [`initial`] writes is at least [`INITIAL_DCID_MIN`] bytes long.
pub const INITIAL_DCID_OFFSET: usize = 6;
pub const INITIAL_DCID_MIN: usize = 8;

/// Overwrites the first 8 DCID bytes of an Initial built by [`initial`] with `tag`,
/// so a reused buffer looks like a new connection attempt.
pub fn refresh_initial_dcid(datagram: &mut [u8], tag: u64) {
    if let Some(d) = datagram.get_mut(INITIAL_DCID_OFFSET..INITIAL_DCID_OFFSET + INITIAL_DCID_MIN) {
        d.copy_from_slice(&tag.to_le_bytes());
    }
}

/// A QUIC v1 client Initial (RFC 9000 §17.2.2) filling all of `buf` (≥ 1200 bytes):
/// first byte 0xc0 | (pn_len − 1), version 1, a random 8..=20-byte DCID, a random
/// 0..=20-byte SCID, no token, a Length that covers exactly the rest of the datagram,
/// then random packet number and payload. Returns `None` if `buf` is too short or long.
pub fn initial(buf: &mut [u8], rng: &mut Rng) -> Option<usize> {
    let size = buf.len();
    if !(MIN_INITIAL..=MAX_DATAGRAM).contains(&size) {
        return None;
    }
    let pn_len = rng.range(1, 4);
    let dcid_len = rng.range(INITIAL_DCID_MIN, 20);
    let scid_len = rng.range(0, 20);
    rng.fill(buf);
    buf[0] = 0xc0 | (pn_len as u8 - 1);
    buf[1..5].copy_from_slice(&VERSION_1.to_be_bytes());
    let mut p = 5;
    buf[p] = dcid_len as u8;
    p += 1 + dcid_len;
    buf[p] = scid_len as u8;
    p += 1 + scid_len;
    buf[p] = 0; // token length 0
    p += 1;
    // Length covers packet number + payload: everything after the Length field.
    let len_bytes = if size - p - 2 <= 16_383 { 2 } else { 4 };
    let length = (size - p - len_bytes) as u64;
    buf[p..p + len_bytes].fill(0);
    if !put_varint(&mut buf[p..], length, len_bytes) {
        return None;
    }
    Some(size)
}

fn short_into(buf: &mut [u8], cid: &[u8; CID_LEN], rng: &mut Rng) -> Option<usize> {
    if !(MIN_SHORT..=MAX_DATAGRAM).contains(&buf.len()) {
        return None;
    }
    rng.fill(buf);
    // 0 1 S R R K P P: everything but the fixed bit is header-protected, so random.
    buf[0] = 0x40 | (buf[0] & 0x3f);
    buf[1..1 + CID_LEN].copy_from_slice(cid);
    Some(buf.len())
}

/// A 1-RTT short-header packet (RFC 9000 §17.3.1) filling `buf` (≥ 33 bytes) whose
/// DCID is a fresh ADR 0001 CID for `server_id`.
pub fn short(buf: &mut [u8], keys: &KeySet, server_id: ServerId, rng: &mut Rng) -> Option<usize> {
    let cid = keys.encode(server_id, &rng.cid_random());
    short_into(buf, &cid, rng)
}

/// A short-header packet whose DCID does not reach any of `live`: with `keys`, a CID
/// minted for a random server id not in `live`; without keys (or if `live` leaves no
/// id free after some tries), a CID marked unroutable (cr = 3).
pub fn orphan(buf: &mut [u8], keys: Option<&KeySet>, live: &[ServerId], rng: &mut Rng) -> Option<usize> {
    let mut cid = None;
    if let Some(ks) = keys {
        for _ in 0..64 {
            let id = ServerId((rng.next_u64() >> 48) as u16);
            if !live.contains(&id) {
                cid = Some(ks.encode(id, &rng.cid_random()));
                break;
            }
        }
    }
    let cid = cid.unwrap_or_else(|| {
        let mut c = [0u8; CID_LEN];
        rng.fill(&mut c);
        c[0] = (CR_UNROUTABLE << 6) | (c[0] & 0x3f);
        c
    });
    short_into(buf, &cid, rng)
}

/// Bytes the demux must drop. With `allow_short`, one in four is a short header too
/// short to carry a DCID and a sample (1..=32 bytes, fixed bit set); the rest fill
/// `buf` and have the header-form and fixed bits clear.
pub fn garbage(buf: &mut [u8], allow_short: bool, rng: &mut Rng) -> Option<usize> {
    if buf.is_empty() || buf.len() > MAX_DATAGRAM {
        return None;
    }
    rng.fill(buf);
    if allow_short && rng.u8() < 64 {
        let n = rng.range(1, (MIN_SHORT - 1).min(buf.len()));
        buf[0] = 0x40 | (buf[0] & 0x3f);
        return Some(n);
    }
    buf[0] &= 0x3f;
    Some(buf.len())
}

/// What to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Initial,
    Short,
    Orphan,
    Garbage,
    Mix,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Ok(match s {
            "initial" => Mode::Initial,
            "short" => Mode::Short,
            "orphan" => Mode::Orphan,
            "garbage" => Mode::Garbage,
            "mix" => Mode::Mix,
            _ => return Err(format!("unknown mode '{s}' (initial|short|orphan|garbage|mix)")),
        })
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Initial => "initial",
            Mode::Short => "short",
            Mode::Orphan => "orphan",
            Mode::Garbage => "garbage",
            Mode::Mix => "mix",
        }
    }
}

/// `mix`: a fixed cycle of ten datagrams: 6 short, 2 initial, 1 orphan, 1 garbage.
pub const MIX_CYCLE: [Mode; 10] = [
    Mode::Short,
    Mode::Short,
    Mode::Initial,
    Mode::Short,
    Mode::Short,
    Mode::Orphan,
    Mode::Short,
    Mode::Initial,
    Mode::Short,
    Mode::Garbage,
];

/// Everything needed to build one mode's datagrams.
#[derive(Clone, Debug)]
pub struct Spec {
    pub mode: Mode,
    pub size: usize,
    pub keys: Option<KeySet>,
    pub server_ids: Vec<ServerId>,
    /// Every datagram exactly `size` bytes (needed for GSO trains): no short garbage.
    pub fixed_size: bool,
}

impl Spec {
    /// Checks the combination; the message says what to change.
    pub fn validate(&self) -> Result<(), String> {
        let needs_keys = matches!(self.mode, Mode::Short | Mode::Mix);
        if needs_keys && (self.keys.is_none() || self.server_ids.is_empty()) {
            return Err(format!("--mode {} needs --keys FILE and --server-ids LIST", self.mode.name()));
        }
        if self.size > MAX_DATAGRAM {
            return Err(format!("--size {} exceeds the largest UDP datagram ({MAX_DATAGRAM})", self.size));
        }
        match self.mode {
            Mode::Initial if self.size < MIN_INITIAL => {
                Err(format!("--mode initial needs --size >= {MIN_INITIAL} (RFC 9000 §14.1)"))
            }
            Mode::Mix if self.fixed_size && self.size < MIN_INITIAL => {
                Err(format!("--mode mix with --gso needs --size >= {MIN_INITIAL} (its Initials are >= {MIN_INITIAL})"))
            }
            Mode::Short | Mode::Orphan | Mode::Mix if self.size < MIN_SHORT => {
                Err(format!("--mode {} needs --size >= {MIN_SHORT}", self.mode.name()))
            }
            Mode::Garbage if self.size == 0 => Err("--size must be at least 1".into()),
            _ => Ok(()),
        }
    }

    /// The largest datagram this spec builds (`mix` Initials are at least 1200 bytes).
    pub fn slot_len(&self) -> usize {
        match self.mode {
            Mode::Mix => self.size.max(MIN_INITIAL),
            _ => self.size,
        }
    }

    /// The kind of datagram number `i`.
    pub fn mode_of(&self, i: usize) -> Mode {
        match self.mode {
            Mode::Mix => MIX_CYCLE[i % MIX_CYCLE.len()],
            m => m,
        }
    }

    /// Builds datagram number `i` of this spec into `buf` (at least `slot_len()` long).
    pub fn build(&self, i: usize, buf: &mut [u8], rng: &mut Rng) -> Option<usize> {
        match self.mode_of(i) {
            Mode::Initial => initial(buf.get_mut(..self.size.max(MIN_INITIAL))?, rng),
            Mode::Short => {
                let keys = self.keys.as_ref()?;
                let id = *self.server_ids.get(i % self.server_ids.len().max(1))?;
                short(buf.get_mut(..self.size)?, keys, id, rng)
            }
            Mode::Orphan => orphan(buf.get_mut(..self.size)?, self.keys.as_ref(), &self.server_ids, rng),
            Mode::Garbage => garbage(buf.get_mut(..self.size)?, !self.fixed_size, rng),
            Mode::Mix => None,
        }
    }
}

/// A pool of prebuilt datagrams, so the send loop costs no HMAC and no copying:
/// slot `i` starts at `i * stride` and is `lens[i]` bytes long. With a fixed size the
/// stride equals the size, so consecutive slots form a GSO train.
pub struct Pool {
    pub data: Vec<u8>,
    pub stride: usize,
    pub lens: Vec<usize>,
    /// Which slots hold Initials (their DCIDs can be refreshed per send).
    pub initials: Vec<bool>,
}

impl Pool {
    pub fn build(spec: &Spec, n: usize, rng: &mut Rng) -> Result<Pool, String> {
        spec.validate()?;
        let stride = spec.slot_len();
        let mut data = vec![0u8; stride * n];
        let mut lens = Vec::with_capacity(n);
        let mut initials = Vec::with_capacity(n);
        for (i, slot) in data.chunks_exact_mut(stride).enumerate() {
            let len = spec
                .build(i, slot, rng)
                .ok_or_else(|| format!("cannot build a {}-byte {} datagram", spec.size, spec.mode.name()))?;
            lens.push(len);
            initials.push(spec.mode_of(i) == Mode::Initial);
        }
        Ok(Pool { data, stride, lens, initials })
    }

    pub fn len(&self) -> usize {
        self.lens.len()
    }

    #[cfg(test)]
    pub fn slot(&self, i: usize) -> &[u8] {
        &self.data[i * self.stride..i * self.stride + self.lens[i]]
    }
}

/// Parses "1,2,10-12" into server ids.
pub fn parse_server_ids(s: &str) -> Result<Vec<ServerId>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num =
            |x: &str| x.trim().parse::<u16>().map_err(|_| format!("server id '{x}' is not a number in 0..=65535"));
        if let Some((a, b)) = part.split_once('-') {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("server id range '{part}' is backwards"));
            }
            out.extend((a..=b).map(ServerId));
        } else {
            out.push(ServerId(num(part)?));
        }
    }
    if out.is_empty() {
        return Err("empty server id list".into());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::cid::{Generation, Unroutable};
    use proto::header::{parse, Header, HeaderError, LongType};

    fn keys() -> KeySet {
        KeySet::new((Generation::new(1).unwrap(), [7; 32]), Some((Generation::ZERO, [9; 32]))).unwrap()
    }

    #[test]
    fn initial_parses_with_consistent_length() {
        let mut rng = Rng::new(1);
        for size in [1200usize, 1201, 1350, 1500, 9000, 20_000, MAX_DATAGRAM] {
            for _ in 0..50 {
                let mut buf = vec![0u8; size];
                assert_eq!(initial(&mut buf, &mut rng), Some(size));
                assert_eq!(buf[0] & 0xfc, 0xc0, "long form, fixed bit, type Initial");
                match parse(&buf, CID_LEN) {
                    Ok(Header::Long(h)) => {
                        assert_eq!(h.version, VERSION_1);
                        assert_eq!(h.ty, LongType::Initial);
                        assert!((8..=20).contains(&h.dcid.len()));
                        assert!(h.scid.len() <= 20);
                        assert!(h.token.is_empty());
                        assert_eq!(h.packet_len, size, "Length covers the rest exactly");
                    }
                    other => panic!("size {size}: {other:?}"),
                }
            }
        }
        assert_eq!(initial(&mut [0u8; 1199], &mut rng), None);
        let mut buf = vec![0u8; 1200];
        initial(&mut buf, &mut rng).unwrap();
        refresh_initial_dcid(&mut buf, 0x0102_0304_0506_0708);
        let Ok(Header::Long(h)) = parse(&buf, CID_LEN) else { panic!() };
        assert_eq!(&h.dcid[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(h.packet_len, 1200);
    }

    #[test]
    fn short_decodes_to_its_server_id() {
        let ks = keys();
        let mut rng = Rng::new(2);
        for (i, size) in [MIN_SHORT, 64, 1200].into_iter().enumerate() {
            for id in [0u16, 1, 7, 0xffff] {
                let mut buf = vec![0u8; size];
                assert_eq!(short(&mut buf, &ks, ServerId(id), &mut rng), Some(size), "{i}");
                let h = parse(&buf, CID_LEN).unwrap();
                let Header::Short { dcid } = h else { panic!("{h:?}") };
                assert_eq!(ks.decode(dcid).unwrap().server_id, ServerId(id));
            }
        }
        assert_eq!(short(&mut [0u8; MIN_SHORT - 1], &ks, ServerId(1), &mut rng), None);
    }

    #[test]
    fn orphan_never_decodes_to_a_live_id() {
        let ks = keys();
        let live: Vec<ServerId> = (0..1000).map(ServerId).collect();
        let mut rng = Rng::new(3);
        for _ in 0..500 {
            let mut buf = [0u8; 100];
            orphan(&mut buf, Some(&ks), &live, &mut rng).unwrap();
            let Ok(Header::Short { dcid }) = parse(&buf, CID_LEN) else { panic!() };
            match ks.decode(dcid) {
                Ok(d) => assert!(!live.contains(&d.server_id)),
                Err(e) => panic!("{e:?}"),
            }
            orphan(&mut buf, None, &live, &mut rng).unwrap();
            let Ok(Header::Short { dcid }) = parse(&buf, CID_LEN) else { panic!() };
            assert_eq!(ks.decode(dcid), Err(Unroutable::Marked));
        }
    }

    #[test]
    fn garbage_never_parses() {
        let mut rng = Rng::new(4);
        let (mut short_seen, mut clear_seen) = (0, 0);
        for _ in 0..1000 {
            let mut buf = [0u8; 200];
            let n = garbage(&mut buf, true, &mut rng).unwrap();
            match parse(&buf[..n], CID_LEN) {
                Err(HeaderError::ShortTooShort) => short_seen += 1,
                Err(HeaderError::FixedBitClear) => clear_seen += 1,
                other => panic!("{n} bytes: {other:?}"),
            }
            let n = garbage(&mut buf, false, &mut rng).unwrap();
            assert_eq!(n, buf.len());
            assert_eq!(parse(&buf, CID_LEN), Err(HeaderError::FixedBitClear));
        }
        assert!(short_seen > 100 && clear_seen > 500, "{short_seen} {clear_seen}");
    }

    #[test]
    fn mix_pool_follows_the_cycle() {
        let ks = keys();
        let ids = vec![ServerId(3), ServerId(4)];
        let spec =
            Spec { mode: Mode::Mix, size: 100, keys: Some(ks.clone()), server_ids: ids.clone(), fixed_size: false };
        let pool = Pool::build(&spec, 100, &mut Rng::new(5)).unwrap();
        let (mut s, mut i, mut o, mut g) = (0, 0, 0, 0);
        for k in 0..pool.len() {
            let d = pool.slot(k);
            match parse(d, CID_LEN) {
                Ok(Header::Long(h)) if h.ty == LongType::Initial => {
                    assert_eq!(d.len(), MIN_INITIAL);
                    i += 1
                }
                Ok(Header::Short { dcid }) => match ks.decode(dcid) {
                    Ok(x) if ids.contains(&x.server_id) => s += 1,
                    _ => o += 1,
                },
                Err(_) => g += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((s, i, o, g), (60, 20, 10, 10));
        assert_eq!(pool.initials.iter().filter(|&&x| x).count(), 20);
    }

    #[test]
    fn fixed_size_pool_is_a_train() {
        let spec = Spec { mode: Mode::Garbage, size: 50, keys: None, server_ids: vec![], fixed_size: true };
        let pool = Pool::build(&spec, 64, &mut Rng::new(6)).unwrap();
        assert_eq!(pool.stride, 50);
        assert!(pool.lens.iter().all(|&l| l == 50));
        assert_eq!(pool.data.len(), 64 * 50);
    }

    #[test]
    fn validation_messages() {
        let mut spec = Spec { mode: Mode::Short, size: 1200, keys: None, server_ids: vec![], fixed_size: false };
        assert!(spec.validate().unwrap_err().contains("--keys"));
        spec.mode = Mode::Initial;
        spec.size = 1000;
        assert!(spec.validate().unwrap_err().contains("1200"));
        spec.mode = Mode::Orphan;
        spec.size = 20;
        assert!(spec.validate().is_err());
        spec.size = 33;
        assert!(spec.validate().is_ok());
        spec.mode = Mode::Mix;
        spec.keys = Some(keys());
        spec.server_ids = vec![ServerId(1)];
        spec.fixed_size = true;
        assert!(spec.validate().unwrap_err().contains("--gso"));
    }

    #[test]
    fn server_id_lists() {
        assert_eq!(parse_server_ids("3, 1,5-7,1").unwrap(), [1, 3, 5, 6, 7].map(ServerId).to_vec());
        assert!(parse_server_ids("").is_err());
        assert!(parse_server_ids("7-5").is_err());
        assert!(parse_server_ids("70000").is_err());
        assert!(parse_server_ids("x").is_err());
    }

    #[test]
    fn varint_writer_matches_reader() {
        for (v, len) in [(0u64, 1usize), (63, 1), (64, 2), (16_383, 2), (16_384, 4), (1 << 29, 4)] {
            let mut b = [0u8; 8];
            assert!(put_varint(&mut b, v, len));
            assert_eq!(proto::header::read_varint(&b), Some((v, len)));
        }
        assert!(!put_varint(&mut [0u8; 8], 64, 1));
    }
}
