//! ADR 0001 connection IDs: 12 bytes that carry the owning instance's server id,
//! encrypted so that observers cannot link two CIDs or count instances.
//!
//! ```text
//! byte 0      : cr (2 bits) | random (6 bits)     cr = key generation 0..=2, 3 = unroutable
//! bytes 1..=8 : nonce (64 random bits, fresh per CID)
//! bytes 9..=10: server id XOR PRF(key[cr], byte0 || nonce)[0..2]
//! byte 11     : random
//! ```
//!
//! The PRF input is byte 0 *including* its six random bits, followed by the nonce
//! (bytes 0..=8 of the CID), so a decoder can recompute it from the CID alone. Each
//! generation records its PRF (ADR 0004): HMAC-SHA-256 or SipHash-2-4, see [`Prf`].
//!
//! A generation may instead use the QUIC-LB format (ADR 0007, [`crate::cid_format`]):
//! its 12-byte CIDs start with a config id whose top two bits are the generation, so
//! the first octet's `cr` bits pick the generation, and with it the format, for both.

use crate::cid_format::CidFormat;
use crate::prf::PreparedPrf;
pub use crate::prf::{siphash_key, Prf, SipHashKey, UnknownPrf};
use crate::quic_lb;

/// Every server-issued CID is exactly this long (ADR 0001 "Length"), which is what
/// lets the demux parse short headers without per-connection state (RFC 9000 §17.3).
pub const CID_LEN: usize = 12;
/// Length of one key generation's secret.
pub const KEY_LEN: usize = 32;
/// `cr` value that marks a CID as deliberately unroutable (ADR 0001).
pub const CR_UNROUTABLE: u8 = 3;
/// At most this many generations are live (decodable) at once (ADR 0001 "Rotation").
pub const MAX_LIVE_GENERATIONS: usize = 2;
/// Bytes of caller-supplied randomness one CID consumes: 6 bits of byte 0 (taken from
/// the low bits of `rand[0]`), 8 nonce bytes and the trailing random byte.
pub const CID_RANDOM_LEN: usize = 10;

/// A 16-bit server id, assigned per instance start by the controller (ADR 0001).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerId(pub u16);

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A key generation, carried in the two `cr` bits: 0, 1 or 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(u8);

impl Generation {
    pub const ZERO: Generation = Generation(0);
    pub const fn new(g: u8) -> Option<Generation> {
        if g < CR_UNROUTABLE {
            Some(Generation(g))
        } else {
            None
        }
    }
    pub const fn get(self) -> u8 {
        self.0
    }
    /// The generation that follows this one in the 0 → 1 → 2 → 0 cycle.
    pub const fn next(self) -> Generation {
        Generation((self.0 + 1) % CR_UNROUTABLE)
    }
}

/// Why a byte string is not a routable CID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unroutable {
    /// Not 12 bytes long.
    WrongLength,
    /// `cr` = 3: marked unroutable by its issuer.
    Marked,
    /// `cr` names a generation this key set does not hold (rotated away or never made).
    UnknownGeneration(u8),
    /// A QUIC-LB generation's CID whose config id (the first octet's top three bits)
    /// is not that generation's config (ADR 0007).
    UnknownConfig(u8),
    /// A QUIC-LB CID whose server id does not fit 16 bits (ADR 0007: the bytes before
    /// the last two are zero in every CID a worker issues).
    ServerIdOutOfRange,
}

/// What a routable CID says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub generation: Generation,
    pub server_id: ServerId,
}

/// Errors building a key set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySetError {
    /// The previous generation equals the newest one.
    DuplicateGeneration,
    /// The generation's QUIC-LB config does not fit it ([`CidFormat::check`]).
    BadFormat(Generation),
}

impl std::fmt::Display for KeySetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySetError::DuplicateGeneration => f.write_str("two live keys share one generation"),
            KeySetError::BadFormat(g) => write!(f, "generation {}'s quic-lb config does not fit it (ADR 0007)", g.0),
        }
    }
}
impl std::error::Error for KeySetError {}

/// One live generation: its PRF, its secret, and the PRF's key prepared once.
#[derive(Clone)]
struct Slot {
    prf: Prf,
    secret: [u8; KEY_LEN],
    prepared: PreparedPrf,
    /// `Some` for a QUIC-LB generation (ADR 0007): its config, key schedule prepared.
    quic_lb: Option<quic_lb::Config>,
}

/// The live key generations (at most two), each with its PRF (ADR 0004) and its key
/// prepared once (an HMAC key, or the derived SipHash key: no HMAC on the hot path).
#[derive(Clone)]
pub struct KeySet {
    newest: Generation,
    /// Indexed by generation; `None` for generations that are not live.
    slots: [Option<Slot>; 3],
    /// Identity of this key set's decode function ([`KeySet::fingerprint`]).
    fingerprint: u64,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("KeySet")
            .field("newest", &self.newest)
            .field("live", &self.live_generations().collect::<Vec<_>>())
            .finish()
    }
}

impl KeySet {
    /// A key set whose newest generation is `newest`, optionally still decoding
    /// `previous`, both with HMAC-SHA-256 (ADR 0001). See [`KeySet::with_prfs`].
    pub fn new(
        newest: (Generation, [u8; KEY_LEN]),
        previous: Option<(Generation, [u8; KEY_LEN])>,
    ) -> Result<KeySet, KeySetError> {
        let hmac = |(g, k): (Generation, [u8; KEY_LEN])| (g, Prf::HmacSha256, k);
        KeySet::with_prfs(hmac(newest), previous.map(hmac))
    }

    /// A key set whose newest generation is `newest`, optionally still decoding
    /// `previous`, each generation with its own PRF (ADR 0004).
    pub fn with_prfs(
        newest: (Generation, Prf, [u8; KEY_LEN]),
        previous: Option<(Generation, Prf, [u8; KEY_LEN])>,
    ) -> Result<KeySet, KeySetError> {
        let adr1 = |(g, p, k): (Generation, Prf, [u8; KEY_LEN])| (g, p, k, CidFormat::Adr1);
        KeySet::with_formats(adr1(newest), previous.map(adr1))
    }

    /// As [`KeySet::with_prfs`], each generation with its CID format (ADR 0007); a
    /// format that does not fit its generation ([`CidFormat::check`]) is an error.
    pub fn with_formats(
        newest: (Generation, Prf, [u8; KEY_LEN], CidFormat),
        previous: Option<(Generation, Prf, [u8; KEY_LEN], CidFormat)>,
    ) -> Result<KeySet, KeySetError> {
        let mut slots: [Option<Slot>; 3] = [None, None, None];
        if let Some((g, _, _, _)) = previous {
            if g == newest.0 {
                return Err(KeySetError::DuplicateGeneration);
            }
        }
        for (g, prf, secret, format) in std::iter::once(newest).chain(previous) {
            let quic_lb = match format {
                CidFormat::Adr1 => None,
                CidFormat::QuicLb(params) => {
                    format.check(g).map_err(|_| KeySetError::BadFormat(g))?;
                    Some(quic_lb::Config::new(params).map_err(|_| KeySetError::BadFormat(g))?)
                }
            };
            slots[g.0 as usize] = Some(Slot { prf, secret, prepared: PreparedPrf::new(prf, &secret), quic_lb });
        }
        let fingerprint = Self::fingerprint_of(newest.0, &slots);
        Ok(KeySet { newest: newest.0, slots, fingerprint })
    }

    /// The CID format of a live generation; `None` if `g` is not live.
    pub fn format(&self, g: Generation) -> Option<CidFormat> {
        self.slot(g).map(|s| s.quic_lb.as_ref().map_or(CidFormat::Adr1, |c| CidFormat::QuicLb(*c.params())))
    }

    /// SHA-256 over a domain label, the newest generation and every slot's PRF code
    /// and secret (with a presence byte), truncated to 64 bits and never 0. Computed once.
    fn fingerprint_of(newest: Generation, slots: &[Option<Slot>; 3]) -> u64 {
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        ctx.update(b"quicdemux keyset fingerprint v2");
        ctx.update(&[newest.0]);
        for slot in slots {
            match slot {
                Some(s) => {
                    // ADR 0004: one secret under two PRFs decodes differently.
                    ctx.update(&[1, s.prf.code()]);
                    ctx.update(&s.secret);
                    // ADR 0007: a QUIC-LB generation decodes by its config (adr1 slots
                    // hash as before).
                    if let Some(c) = &s.quic_lb {
                        let p = c.params();
                        ctx.update(&[2, p.config_id.get(), p.server_id_len, p.nonce_len, u8::from(p.self_encoded_len)]);
                        ctx.update(&p.key.map_or([0; 17], |k| {
                            let mut b = [1; 17];
                            b[1..].copy_from_slice(&k);
                            b
                        }));
                    }
                }
                None => ctx.update(&[0]),
            }
        }
        let d = ctx.finish();
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.as_ref()[..8]);
        u64::from_le_bytes(b).max(1)
    }

    /// A 64-bit identity of this key set, fixed at construction: two key sets with
    /// the same fingerprint hold the same live generations with the same PRFs and
    /// secrets (up to a 2^-64 accident), so they decode every CID alike. Never 0. Caches of
    /// decode results ([`crate::decode_cache::DecodeCache`]) tag entries with it.
    #[inline]
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The generation new CIDs are minted with.
    pub fn newest(&self) -> Generation {
        self.newest
    }

    /// The generations this set decodes, newest first.
    pub fn live_generations(&self) -> impl Iterator<Item = Generation> + '_ {
        let prev = (0..3u8).map(Generation).filter(move |g| *g != self.newest && self.slots[g.0 as usize].is_some());
        std::iter::once(self.newest).chain(prev)
    }

    /// Whether `cr` (0..=3) names a live generation of this set.
    #[inline]
    pub(crate) fn holds(&self, cr: u8) -> bool {
        self.slots.get(cr as usize).is_some_and(|k| k.is_some())
    }

    fn slot(&self, g: Generation) -> Option<&Slot> {
        self.slots[g.0 as usize].as_ref()
    }

    /// The raw secret of a live generation (for handing to workers).
    pub fn secret(&self, g: Generation) -> Option<&[u8; KEY_LEN]> {
        self.slot(g).map(|s| &s.secret)
    }

    /// The PRF of a live generation (ADR 0004); `None` if `g` is not live.
    pub fn prf(&self, g: Generation) -> Option<Prf> {
        self.slot(g).map(|s| s.prf)
    }

    /// The SipHash-2-4 key ([`siphash_key`]) of a live `siphash-2-4` generation, for
    /// the kernel fast path's map; `None` for a generation that is not live or uses
    /// `hmac-sha256` (never steered in the kernel, ADR 0004).
    pub fn siphash_key(&self, g: Generation) -> Option<SipHashKey> {
        let slot = self.slot(g)?;
        if slot.quic_lb.is_some() {
            // ADR 0007: the kernel decodes ADR 0001 CIDs only.
            return None;
        }
        match slot.prepared {
            PreparedPrf::SipHash(k) => Some(k.into()),
            PreparedPrf::Hmac(_) => None,
        }
    }

    /// Rotation: `fresh` becomes the newest generation (the one after the current newest)
    /// with the current newest's PRF, the current newest stays decodable, and the one
    /// before it is dropped. See [`KeySet::rotated_with`].
    pub fn rotated(&self, fresh: [u8; KEY_LEN]) -> KeySet {
        self.rotated_with(fresh, self.newest_slot().prf)
    }

    /// Rotation as [`KeySet::rotated`], the new generation with PRF `prf`.
    pub fn rotated_with(&self, fresh: [u8; KEY_LEN], prf: Prf) -> KeySet {
        let g = self.newest;
        let prev = (g, self.newest_slot().prf, self.newest_slot().secret, self.format(g).unwrap_or_default());
        let set = KeySet::with_formats((g.next(), prf, fresh, CidFormat::Adr1), Some(prev));
        set.expect("next() differs from the newest generation; the previous format was checked")
    }

    fn newest_slot(&self) -> &Slot {
        self.slot(self.newest).expect("newest generation always has a key")
    }

    /// Mints a CID for `server_id` with the newest generation. `rand` supplies every
    /// random bit: the low six bits of `rand[0]`, the nonce `rand[1..9]`, and `rand[9]`.
    pub fn encode(&self, server_id: ServerId, rand: &[u8; CID_RANDOM_LEN]) -> [u8; CID_LEN] {
        self.encode_with(self.newest, server_id, rand).expect("newest generation always has a key")
    }

    /// Mints a CID under a specific live generation; `None` if `g` is not live.
    pub fn encode_with(
        &self,
        g: Generation,
        server_id: ServerId,
        rand: &[u8; CID_RANDOM_LEN],
    ) -> Option<[u8; CID_LEN]> {
        let slot = self.slot(g)?;
        let mut cid = [0u8; CID_LEN];
        if let Some(config) = &slot.quic_lb {
            // ADR 0007: server id (16 bits, zero-padded) and a nonce of the config's
            // length from `rand[1..]` (at most 9 bytes), the first octet's five low
            // bits from `rand[0]` unless they encode the length.
            let (sid, n) = CidFormat::server_id_bytes(config.params(), server_id);
            let nonce = rand.get(1..1 + config.nonce_len())?;
            config.encode(&sid[..n], nonce, rand[0], &mut cid).ok()?;
            return Some(cid);
        }
        cid[0] = (g.0 << 6) | (rand[0] & 0x3f);
        cid[1..9].copy_from_slice(&rand[1..9]);
        let m = slot.prepared.mask(&cid[..9]);
        let id = server_id.0.to_be_bytes();
        cid[9] = id[0] ^ m[0];
        cid[10] = id[1] ^ m[1];
        cid[11] = rand[9];
        Some(cid)
    }

    /// Recovers (generation, server id) from a CID, or says why it is not routable.
    /// Any 12 bytes with a live `cr` decode to *some* server id: integrity is not
    /// needed (ADR 0001), the caller checks whether that id is live.
    #[inline]
    pub fn decode(&self, cid: &[u8]) -> Result<Decoded, Unroutable> {
        if cid.len() != CID_LEN {
            return Err(Unroutable::WrongLength);
        }
        let cr = cid[0] >> 6;
        if cr == CR_UNROUTABLE {
            return Err(Unroutable::Marked);
        }
        let Some(slot) = self.slots[cr as usize].as_ref() else {
            return Err(Unroutable::UnknownGeneration(cr));
        };
        if let Some(config) = &slot.quic_lb {
            return decode_quic_lb(config, cid).map(|id| Decoded { generation: Generation(cr), server_id: id });
        }
        let m = slot.prepared.mask(&cid[..9]);
        let id = u16::from_be_bytes([cid[9] ^ m[0], cid[10] ^ m[1]]);
        Ok(Decoded { generation: Generation(cr), server_id: ServerId(id) })
    }
}

/// A QUIC-LB generation's CID to its 16-bit server id (ADR 0007).
fn decode_quic_lb(config: &quic_lb::Config, cid: &[u8]) -> Result<ServerId, Unroutable> {
    let first = cid.first().copied().unwrap_or(0);
    let sid = config.decode(cid).ok_or(Unroutable::UnknownConfig(first >> 5))?;
    let b = sid.as_bytes();
    match b {
        [zeros @ .., hi, lo] if zeros.iter().all(|z| *z == 0) => Ok(ServerId(u16::from_be_bytes([*hi, *lo]))),
        _ => Err(Unroutable::ServerIdOutOfRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::hmac;

    fn keys() -> KeySet {
        KeySet::new((Generation(1), [7; 32]), Some((Generation(0), [9; 32]))).unwrap()
    }

    #[test]
    fn layout_matches_adr_0040() {
        let ks = keys();
        let rand = [0xff, 1, 2, 3, 4, 5, 6, 7, 8, 0xaa];
        let cid = ks.encode(ServerId(0x1234), &rand);
        assert_eq!(cid[0] >> 6, 1, "cr bits carry the newest generation");
        assert_eq!(cid[0] & 0x3f, 0x3f, "six random bits kept");
        assert_eq!(&cid[1..9], &[1, 2, 3, 4, 5, 6, 7, 8], "nonce in bytes 1..=8");
        assert_eq!(cid[11], 0xaa, "byte 11 random");
        // Recompute the mask independently of the implementation.
        let k = hmac::Key::new(hmac::HMAC_SHA256, &[7; 32]);
        let tag = hmac::sign(&k, &cid[..9]);
        assert_eq!(cid[9] ^ tag.as_ref()[0], 0x12);
        assert_eq!(cid[10] ^ tag.as_ref()[1], 0x34);
    }

    #[test]
    fn siphash_layout_matches_adr_0004() {
        let g = Generation;
        let ks = KeySet::with_prfs((g(2), Prf::SipHash24, [7; 32]), Some((g(0), Prf::HmacSha256, [9; 32]))).unwrap();
        let rand = [0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0xaa];
        let cid = ks.encode(ServerId(0x1234), &rand);
        assert_eq!(cid[0], 0x81, "cr 2, six random bits");
        assert_eq!(&cid[1..9], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(cid[11], 0xaa);
        // ADR 0004, recomputed with the siphasher crate directly: mask = h's low two
        // bytes, low byte first, against the big-endian server id.
        let [k0, k1] = siphash_key(&[7; 32]);
        let mut sip = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
        std::hash::Hasher::write(&mut sip, &cid[..9]);
        let h = std::hash::Hasher::finish(&sip);
        assert_eq!(cid[9] ^ h as u8, 0x12);
        assert_eq!(cid[10] ^ (h >> 8) as u8, 0x34);
        assert_eq!(ks.decode(&cid), Ok(Decoded { generation: g(2), server_id: ServerId(0x1234) }));
        // The previous generation keeps HMAC.
        let old = ks.encode_with(g(0), ServerId(0x1234), &rand).unwrap();
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &[9; 32]), &old[..9]);
        assert_eq!([old[9] ^ tag.as_ref()[0], old[10] ^ tag.as_ref()[1]], [0x12, 0x34]);
        assert_eq!(ks.decode(&old).unwrap().server_id, ServerId(0x1234));
    }

    #[test]
    fn prf_and_siphash_key_per_generation() {
        let g = Generation;
        let ks = KeySet::with_prfs((g(1), Prf::SipHash24, [7; 32]), Some((g(0), Prf::HmacSha256, [9; 32]))).unwrap();
        assert_eq!(ks.prf(g(1)), Some(Prf::SipHash24));
        assert_eq!(ks.prf(g(0)), Some(Prf::HmacSha256));
        assert_eq!(ks.prf(g(2)), None);
        assert_eq!(ks.siphash_key(g(1)), Some(siphash_key(&[7; 32]).into()));
        assert_eq!(ks.siphash_key(g(0)), None, "hmac generations are never steered in the kernel");
        assert_eq!(ks.siphash_key(g(2)), None);
        assert_eq!(ks.secret(g(1)), Some(&[7; 32]));
        // rotated keeps the newest's PRF; rotated_with sets the new one's.
        let r = ks.rotated([3; 32]);
        assert_eq!((r.prf(g(2)), r.prf(g(1)), r.prf(g(0))), (Some(Prf::SipHash24), Some(Prf::SipHash24), None));
        let h = KeySet::new((g(0), [1; 32]), None).unwrap();
        assert_eq!(h.prf(g(0)), Some(Prf::HmacSha256));
        assert_eq!(h.rotated([2; 32]).prf(g(1)), Some(Prf::HmacSha256));
        let s = h.rotated_with([2; 32], Prf::SipHash24);
        assert_eq!((s.prf(g(1)), s.prf(g(0))), (Some(Prf::SipHash24), Some(Prf::HmacSha256)));
        assert_eq!(s.siphash_key(g(1)), Some(siphash_key(&[2; 32]).into()));
        let back = s.rotated_with([4; 32], Prf::HmacSha256);
        assert_eq!((back.prf(g(2)), back.prf(g(1))), (Some(Prf::HmacSha256), Some(Prf::SipHash24)));
    }

    #[test]
    fn unroutable_reasons() {
        let ks = KeySet::new((Generation(0), [1; 32]), None).unwrap();
        assert_eq!(ks.decode(&[0; 11]), Err(Unroutable::WrongLength));
        assert_eq!(ks.decode(&[0; 13]), Err(Unroutable::WrongLength));
        assert_eq!(ks.decode(&[0xc0; 12]), Err(Unroutable::Marked));
        assert_eq!(ks.decode(&[0x40; 12]), Err(Unroutable::UnknownGeneration(1)));
        assert_eq!(ks.decode(&[0x80; 12]), Err(Unroutable::UnknownGeneration(2)));
        assert!(ks.decode(&[0x3f; 12]).is_ok());
    }

    #[test]
    fn rotation_keeps_previous_and_drops_older() {
        let ks = KeySet::new((Generation(2), [1; 32]), Some((Generation(1), [2; 32]))).unwrap();
        let old = ks.encode(ServerId(5), &[0; 10]);
        let r = ks.rotated([3; 32]);
        assert_eq!(r.newest(), Generation(0));
        assert_eq!(r.decode(&old).unwrap().server_id, ServerId(5));
        let older = ks.encode_with(Generation(1), ServerId(6), &[0; 10]).unwrap();
        assert_eq!(r.decode(&older), Err(Unroutable::UnknownGeneration(1)));
        assert_eq!(r.live_generations().collect::<Vec<_>>(), vec![Generation(0), Generation(2)]);
    }

    #[test]
    fn fingerprint_tells_key_sets_apart() {
        let g = Generation;
        let a = KeySet::new((g(0), [1; 32]), None).unwrap();
        assert_eq!(a.fingerprint(), KeySet::new((g(0), [1; 32]), None).unwrap().fingerprint());
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
        for b in [
            KeySet::new((g(0), [2; 32]), None).unwrap(),
            KeySet::new((g(1), [1; 32]), None).unwrap(),
            KeySet::new((g(0), [1; 32]), Some((g(1), [1; 32]))).unwrap(),
            a.rotated([1; 32]),
            // Same generation and secret, other PRF (ADR 0004).
            KeySet::with_prfs((g(0), Prf::SipHash24, [1; 32]), None).unwrap(),
        ] {
            assert_ne!(a.fingerprint(), b.fingerprint(), "{b:?}");
        }
        assert_ne!(a.fingerprint(), 0);
        let prf = |p, q| KeySet::with_prfs((g(1), p, [1; 32]), Some((g(0), q, [2; 32]))).unwrap().fingerprint();
        let h = Prf::HmacSha256;
        let s = Prf::SipHash24;
        assert_eq!(prf(h, h), KeySet::new((g(1), [1; 32]), Some((g(0), [2; 32]))).unwrap().fingerprint());
        let all = [prf(h, h), prf(h, s), prf(s, h), prf(s, s)];
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(all[i], all[j], "PRF pairs {i} and {j}");
            }
        }
    }

    #[test]
    fn duplicate_generation_rejected() {
        assert_eq!(
            KeySet::new((Generation(0), [1; 32]), Some((Generation(0), [2; 32]))).unwrap_err(),
            KeySetError::DuplicateGeneration
        );
    }

    fn g(n: u8) -> Generation {
        Generation(n)
    }

    fn quic_lb_set(sid_len: u8, key: Option<[u8; 16]>, self_len: bool) -> KeySet {
        let p = quic_lb::Params {
            config_id: crate::cid_format::config_ids_of(g(1))[0],
            server_id_len: sid_len,
            nonce_len: 11 - sid_len,
            key,
            self_encoded_len: self_len,
        };
        KeySet::with_formats(
            (g(1), Prf::SipHash24, [7; 32], CidFormat::QuicLb(p)),
            Some((g(0), Prf::SipHash24, [9; 32], CidFormat::Adr1)),
        )
        .unwrap()
    }

    /// ADR 0007: a QUIC-LB generation's CIDs are draft-21 CIDs of config 2 (generation
    /// 1), 12 bytes, the server id in the clear for a plaintext config (the obvious
    /// model), decoded back by the key set and by `quic_lb`'s own config set; the adr1
    /// generation beside it decodes as before, and the kernel gets no key for it.
    #[test]
    fn quic_lb_generation_encodes_and_decodes() {
        let ks = quic_lb_set(3, None, true);
        assert_eq!(ks.format(g(0)), Some(CidFormat::Adr1));
        assert!(matches!(ks.format(g(1)), Some(CidFormat::QuicLb(_))));
        assert_eq!(ks.siphash_key(g(1)), None, "never steered by the ADR 0001 program");
        assert!(ks.siphash_key(g(0)).is_some());
        let rand = [0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        let cid = ks.encode(ServerId(0xbeef), &rand);
        // config 2 | length 11 (self-encoded); server id 00 be ef; nonce 1..=8.
        assert_eq!(cid, [0x40 | 11, 0, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ks.decode(&cid), Ok(Decoded { generation: g(1), server_id: ServerId(0xbeef) }));
        let old = ks.encode_with(g(0), ServerId(0xbeef), &rand).unwrap();
        assert_eq!(ks.decode(&old), Ok(Decoded { generation: g(0), server_id: ServerId(0xbeef) }));
        // Config 3 (generation 1's other config id) is not this generation's config.
        let mut other = cid;
        other[0] |= 0x20;
        assert_eq!(ks.decode(&other), Err(Unroutable::UnknownConfig(3)));
        // A server id past 16 bits is not one a worker issued.
        let mut wide = cid;
        wide[1] = 1;
        assert_eq!(ks.decode(&wide), Err(Unroutable::ServerIdOutOfRange));
        // Random low bits when the length is not self-encoded.
        let r = quic_lb_set(2, None, false).encode(ServerId(1), &[0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(r[0], 0x40 | 0x1f);
        // The fingerprint tells the formats apart (decode caches are tagged with it).
        assert_ne!(ks.fingerprint(), quic_lb_set(2, None, true).fingerprint());
        assert_ne!(ks.fingerprint(), quic_lb_set(3, Some([1; 16]), true).fingerprint());
        assert_ne!(ks.fingerprint(), quic_lb_set(3, None, false).fingerprint());
        assert_eq!(ks.fingerprint(), quic_lb_set(3, None, true).fingerprint());
        // A config of another generation is refused.
        let p = quic_lb::Params {
            config_id: crate::cid_format::config_ids_of(g(2))[0],
            server_id_len: 2,
            nonce_len: 9,
            key: None,
            self_encoded_len: false,
        };
        let bad = KeySet::with_formats((g(1), Prf::SipHash24, [7; 32], CidFormat::QuicLb(p)), None);
        assert_eq!(bad.unwrap_err(), KeySetError::BadFormat(g(1)));
    }

    proptest::proptest! {
        /// Any server id, any randomness, plaintext or keyed (Feistel), any server-id
        /// length: the key set decodes its own CIDs, and so does an independent
        /// `quic_lb::ConfigSet` holding the same config (what a load balancer runs).
        #[test]
        fn quic_lb_round_trip(id: u16, rand: [u8; CID_RANDOM_LEN], sid_len in 2u8..=7, key: Option<[u8; 16]>, self_len: bool) {
            let ks = quic_lb_set(sid_len, key, self_len);
            let cid = ks.encode(ServerId(id), &rand);
            proptest::prop_assert_eq!(ks.decode(&cid), Ok(Decoded { generation: g(1), server_id: ServerId(id) }));
            proptest::prop_assert_eq!(cid[0] >> 6, 1, "cr bits are the generation");
            let Some(CidFormat::QuicLb(p)) = ks.format(g(1)) else { unreachable!() };
            let mut lb = quic_lb::ConfigSet::new();
            lb.insert(quic_lb::Config::new(p).unwrap());
            let d = lb.decode(&cid).unwrap();
            let mut want = [0u8; 7];
            want[usize::from(sid_len) - 2..usize::from(sid_len)].copy_from_slice(&id.to_be_bytes());
            proptest::prop_assert_eq!(d.server_id.as_bytes(), &want[..usize::from(sid_len)]);
        }
    }
}
