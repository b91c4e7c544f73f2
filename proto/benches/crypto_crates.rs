//! A/B: the hand-written HMAC-SHA-256 / HKDF (precomputed pads over the bare SHA-256
//! compression) and AES-GCM (on `aes` 0.9 + `ghash` 0.6) that proto had as
//! `proto::hkdf` and `proto::gcm` — kept in `baseline/` as the A side — against the
//! RustCrypto crates proto uses now on the same primitives: `hmac` 0.12 + `hkdf` 0.12
//! (on the same `sha2` 0.10) and `aes-gcm` 0.11 (on the same `aes` 0.9 and `ghash`
//! 0.6), on the whole operations the data plane pays per datagram, and on their
//! parts. Same inputs, one binary, each pair run back to back. Method, result and
//! decision: docs/benchmarks.md, "Crypto: crates against hand-written code".
//!
//! Whole operations:
//! - `crypto_ab/retry_mint/*`: a Retry for a token-less 1200-byte v1 client Initial
//!   (16-byte DCID, IPv4 client), as `proto::retry::RetryMinter::mint` makes it: the
//!   Initial checks (RFC 9001 §5.2 header-protection key from the DCID, one AES
//!   block), quinn's Retry token (HKDF-Expand of the token key, AES-256-GCM seal),
//!   the integrity tag (RFC 9001 §5.8). `proto` is the production minter;
//!   `hkdf=X,gcm=Y` is `Minter::mint` below with the key derivations from X (`hand`:
//!   the baseline; `crate`: `hmac` + `hkdf`) and the GCM from Y (`hand`: the
//!   baseline; `crate`: `aes-gcm`), so each one's share of the whole is seen with the
//!   other held fixed. Every variant's bytes are checked equal to the production
//!   minter's first.
//! - `crypto_ab/cid_decode/*`: the ADR 0001 decode of a 12-byte CID under an
//!   `hmac-sha256` generation: `proto` is `KeySet::decode`; `hand`/`crates` are
//!   `CidKeys::decode` below with the HMAC from the baseline or from `hmac` (its
//!   `Mac` API: `Hmac<Sha256>` cloned, updated, finalized); `crates_core` the same
//!   `hmac` HMAC driven through `digest`'s core API (`HmacCore` cloned and finalized
//!   over a block buffer, without the `CoreWrapper`: what proto::prf does). Checked
//!   equal to `KeySet::decode` over 4096 CIDs first.
//!
//! Parts (`crypto_ab/part/*`): `hmac_9` (the CID mask: one HMAC of 9 bytes under a
//! prepared key), `hp_key` (RFC 9001 §5.2 from the DCID to the `quic hp` key),
//! `token_key` (HKDF-Expand(token PRK, nonce, 32)), `seal_256` (one-shot AES-256-GCM
//! seal of the 33-byte IPv4 token plaintext, key expansion included), `open_256` (its
//! open), `integrity_tag` (AES-128-GCM tag of a 79-byte Retry pseudo-packet under
//! the fixed key).
//!
//! `cargo bench -p quicdemux-proto --bench crypto_crates`; every benchmark runs
//! twice, wall clock and (prefix `cpu/`) thread CPU time.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use aes_gcm::aead::AeadInOut;
use aes_gcm::{AesGcm, KeyInit as _};
use criterion::measurement::Measurement;
use criterion::{Criterion, SamplingMode, Throughput};
use hkdf::{Hkdf, HkdfExtract};
use hmac::{Hmac, Mac};
use proto::cid::{Generation, KeySet, ServerId};
use proto::header::VERSION_1;
use proto::initial::build_client_initial;
use proto::retry::{RetryMinter, MAX_RETRY};
use sha2::Sha256;
use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};

/// The hand-written implementations proto had before the crates (the A side).
#[allow(dead_code)] // whole modules, of which the bench calls a part
mod baseline {
    #[path = "../baseline/gcm.rs"]
    pub mod gcm;
    #[path = "../baseline/hkdf.rs"]
    pub mod hkdf;
}
use baseline::hkdf::HmacSha256;

// RFC 9001 §5.2: initial_salt of QUIC v1.
const SALT_V1: [u8; 20] = [
    0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f,
    0x0a,
];
// RFC 8446 §7.1 HkdfLabel (length, "tls13 " ‖ label, empty context).
const LABEL_CLIENT_IN: &[u8] = b"\x00\x20\x0ftls13 client in\x00";
const LABEL_QUIC_HP: &[u8] = b"\x00\x10\x0dtls13 quic hp\x00";
// RFC 9001 §5.8: the v1 Retry integrity key and nonce.
const V1_KEY: [u8; 16] =
    [0xbe, 0x0c, 0x69, 0x0b, 0x9f, 0x66, 0x57, 0x5a, 0x1d, 0x76, 0x6b, 0x54, 0xe3, 0x68, 0xc8, 0x4e];
const V1_NONCE: [u8; 12] = [0x46, 0x15, 0x99, 0xd3, 0x5d, 0x63, 0x2b, 0xf2, 0x23, 0x98, 0x25, 0xbb];
const TOKEN_SALT: &[u8] = proto::token::TOKEN_SALT;

/// The key derivations of the Retry path: RFC 9001 §5.2 (DCID → `quic hp` key) and
/// quinn's per-token AES-256-GCM key (HKDF-Expand(PRK, nonce, 32)).
trait Kdf {
    fn new(token_secret: &[u8; 32]) -> Self;
    fn hp_key(&self, dcid: &[u8]) -> [u8; 16];
    fn token_key(&self, nonce: &[u8; 16]) -> [u8; 32];
}

/// AES-GCM of the Retry path: one-shot AES-256-GCM under a fresh key (zero IV, no
/// AAD: the token) and the v1 Retry integrity tag under the fixed key.
trait Gcm {
    fn new() -> Self;
    fn seal_256(&self, key: &[u8; 32], in_out: &mut [u8]) -> [u8; 16];
    fn open_256(&self, key: &[u8; 32], in_out: &mut [u8], tag: &[u8; 16]) -> bool;
    fn integrity_tag(&self, pseudo: &[u8]) -> [u8; 16];
}

/// The baseline HMAC/HKDF.
struct HandKdf {
    salt: HmacSha256,
    token: HmacSha256,
}

impl Kdf for HandKdf {
    fn new(token_secret: &[u8; 32]) -> Self {
        let prk = baseline::hkdf::extract(&HmacSha256::new(TOKEN_SALT), token_secret);
        HandKdf { salt: HmacSha256::new(&SALT_V1), token: HmacSha256::new(&prk) }
    }
    fn hp_key(&self, dcid: &[u8]) -> [u8; 16] {
        let initial = baseline::hkdf::extract(&self.salt, dcid);
        let client: [u8; 32] = baseline::hkdf::expand_label(&HmacSha256::new(&initial), LABEL_CLIENT_IN);
        baseline::hkdf::expand_label(&HmacSha256::new(&client), LABEL_QUIC_HP)
    }
    fn token_key(&self, nonce: &[u8; 16]) -> [u8; 32] {
        let mut k = [0; 32];
        baseline::hkdf::expand(&self.token, nonce, &mut k).unwrap();
        k
    }
}

/// `hmac` 0.12 + `hkdf` 0.12, each key prepared once (the salt's HMAC as an
/// `HkdfExtract`, the token PRK as an `Hkdf`: both hold the pads' chaining values).
struct CrateKdf {
    salt: HkdfExtract<Sha256>,
    token: Hkdf<Sha256>,
}

impl Kdf for CrateKdf {
    fn new(token_secret: &[u8; 32]) -> Self {
        let (_, token) = Hkdf::<Sha256>::extract(Some(TOKEN_SALT), token_secret);
        CrateKdf { salt: HkdfExtract::new(Some(&SALT_V1)), token }
    }
    fn hp_key(&self, dcid: &[u8]) -> [u8; 16] {
        let mut x = self.salt.clone();
        x.input_ikm(dcid);
        let (_, initial) = x.finalize();
        let mut client = [0; 32];
        initial.expand(LABEL_CLIENT_IN, &mut client).unwrap();
        let mut hp = [0; 16];
        Hkdf::<Sha256>::from_prk(&client).unwrap().expand(LABEL_QUIC_HP, &mut hp).unwrap();
        hp
    }
    fn token_key(&self, nonce: &[u8; 16]) -> [u8; 32] {
        let mut k = [0; 32];
        self.token.expand(nonce, &mut k).unwrap();
        k
    }
}

/// The baseline AES-GCM.
struct HandGcm(baseline::gcm::FixedIvTagKey);

impl Gcm for HandGcm {
    fn new() -> Self {
        HandGcm(baseline::gcm::FixedIvTagKey::new_128(&V1_KEY, &V1_NONCE))
    }
    fn seal_256(&self, key: &[u8; 32], in_out: &mut [u8]) -> [u8; 16] {
        baseline::gcm::seal_256(key, &[0; 12], &[], in_out).unwrap()
    }
    fn open_256(&self, key: &[u8; 32], in_out: &mut [u8], tag: &[u8; 16]) -> bool {
        baseline::gcm::open_256(key, &[0; 12], &[], in_out, tag).is_ok()
    }
    fn integrity_tag(&self, pseudo: &[u8]) -> [u8; 16] {
        self.0.tag(pseudo)
    }
}

/// AES-GCM of `aes-gcm` 0.11 on `aes`'s encrypt-only key schedules, as proto uses it.
type Aes128Gcm = AesGcm<aes::Aes128Enc, aes::cipher::consts::U12>;
type Aes256Gcm = AesGcm<aes::Aes256Enc, aes::cipher::consts::U12>;

/// `aes-gcm` 0.11 (the integrity key scheduled once, with its H).
struct CrateGcm(Aes128Gcm);

impl Gcm for CrateGcm {
    fn new() -> Self {
        CrateGcm(Aes128Gcm::new(&V1_KEY.into()))
    }
    fn seal_256(&self, key: &[u8; 32], in_out: &mut [u8]) -> [u8; 16] {
        let aead = Aes256Gcm::new(&(*key).into());
        aead.encrypt_inout_detached(&[0; 12].into(), &[], in_out.into()).unwrap().into()
    }
    fn open_256(&self, key: &[u8; 32], in_out: &mut [u8], tag: &[u8; 16]) -> bool {
        let aead = Aes256Gcm::new(&(*key).into());
        aead.decrypt_inout_detached(&[0; 12].into(), &[], in_out.into(), &(*tag).into()).is_ok()
    }
    fn integrity_tag(&self, pseudo: &[u8]) -> [u8; 16] {
        self.0.encrypt_inout_detached(&V1_NONCE.into(), pseudo, (&mut [][..]).into()).unwrap().into()
    }
}

/// A Retry minter over a [`Kdf`] and a [`Gcm`]: the steps and layout of
/// `RetryMinter::mint` for a token-less Initial (RFC 9000 §17.2.5; quinn-proto
/// 0.11.19's token; RFC 9001 §5.8), the header-protection mask with the same
/// `aes` 0.9 AES-128 in every variant.
struct Minter<K, G> {
    kdf: K,
    gcm: G,
}

impl<K: Kdf, G: Gcm> Minter<K, G> {
    fn new(token_secret: &[u8; 32]) -> Self {
        Minter { kdf: K::new(token_secret), gcm: G::new() }
    }

    fn mint(
        &self,
        datagram: &[u8],
        client: SocketAddr,
        scid: &[u8],
        now: u64,
        nonce: [u8; 16],
        out: &mut [u8; MAX_RETRY],
    ) -> Option<usize> {
        use aes::cipher::{BlockCipherEncrypt, KeyInit};
        // The Initial checks (RFC 9000 §14.1, §7.2; RFC 9001 §5.4.2; RFC 9000 §17.2).
        let p = proto::initial_protection::parse(datagram).ok()?;
        if datagram.len() < 1200 || p.dcid.len() < 8 || !p.token.is_empty() {
            return None;
        }
        let sample: [u8; 16] = datagram.get(p.pn_offset + 4..p.pn_offset + 20)?.try_into().ok()?;
        let mut mask = aes::Block::from(sample);
        aes::Aes128Enc::new(&self.kdf.hp_key(p.dcid).into()).encrypt_block(&mut mask);
        if (datagram[0] ^ mask[0]) & 0x0c != 0 {
            return None;
        }
        // The Retry header: quinn's first byte, version, DCID = client SCID, SCID.
        let mut pos = 0;
        let put = |out: &mut [u8; MAX_RETRY], pos: &mut usize, b: &[u8]| {
            out[*pos..*pos + b.len()].copy_from_slice(b);
            *pos += b.len();
        };
        put(out, &mut pos, &[0xf0]);
        put(out, &mut pos, &p.version.to_be_bytes());
        put(out, &mut pos, &[p.scid.len() as u8]);
        put(out, &mut pos, p.scid);
        put(out, &mut pos, &[scid.len() as u8]);
        put(out, &mut pos, scid);
        // quinn's Retry token: type 0, IP, port, ODCID, issue time; sealed; nonce.
        let token_start = pos;
        put(out, &mut pos, &[0]);
        match client.ip() {
            IpAddr::V4(a) => {
                put(out, &mut pos, &[0]);
                put(out, &mut pos, &a.octets());
            }
            IpAddr::V6(a) => {
                put(out, &mut pos, &[1]);
                put(out, &mut pos, &a.octets());
            }
        }
        put(out, &mut pos, &client.port().to_be_bytes());
        put(out, &mut pos, &[p.dcid.len() as u8]);
        put(out, &mut pos, p.dcid);
        put(out, &mut pos, &now.to_be_bytes());
        let plain_end = pos;
        let tag = self.gcm.seal_256(&self.kdf.token_key(&nonce), &mut out[token_start..plain_end]);
        put(out, &mut pos, &tag);
        put(out, &mut pos, &nonce);
        // RFC 9001 §5.8: the tag over the Retry Pseudo-Packet.
        let mut pseudo = [0u8; 1 + 20 + MAX_RETRY];
        let n = 1 + p.dcid.len() + pos;
        pseudo[0] = p.dcid.len() as u8;
        pseudo[1..1 + p.dcid.len()].copy_from_slice(p.dcid);
        pseudo[1 + p.dcid.len()..n].copy_from_slice(&out[..pos]);
        let tag = self.gcm.integrity_tag(&pseudo[..n]);
        out[pos..pos + 16].copy_from_slice(&tag);
        Some(pos + 16)
    }
}

/// The 2-byte server-id mask of a CID prefix under a prepared HMAC-SHA-256 key.
trait CidMac: Clone {
    fn new(secret: &[u8; 32]) -> Self;
    fn mask(&self, prefix: &[u8]) -> [u8; 2];
}

impl CidMac for HmacSha256 {
    fn new(secret: &[u8; 32]) -> Self {
        HmacSha256::new(secret)
    }
    fn mask(&self, prefix: &[u8]) -> [u8; 2] {
        let t = self.sign(prefix);
        [t[0], t[1]]
    }
}

impl CidMac for Hmac<Sha256> {
    fn new(secret: &[u8; 32]) -> Self {
        <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap()
    }
    fn mask(&self, prefix: &[u8]) -> [u8; 2] {
        let mut m = self.clone();
        m.update(prefix);
        let t = m.finalize().into_bytes();
        [t[0], t[1]]
    }
}

/// `hmac` 0.12's `HmacCore` driven through `digest`'s core API (no `CoreWrapper`).
#[derive(Clone)]
struct CoreMac(hmac::HmacCore<Sha256>);

impl CidMac for CoreMac {
    fn new(secret: &[u8; 32]) -> Self {
        use hmac::digest::KeyInit;
        CoreMac(hmac::HmacCore::<Sha256>::new_from_slice(secret).unwrap())
    }
    fn mask(&self, prefix: &[u8]) -> [u8; 2] {
        use hmac::digest::core_api::{Buffer, FixedOutputCore};
        let mut core = self.0.clone();
        let mut buf = Buffer::<hmac::HmacCore<Sha256>>::new(prefix);
        let mut out = Default::default();
        core.finalize_fixed_core(&mut buf, &mut out);
        [out[0], out[1]]
    }
}

/// ADR 0001 decode ([`KeySet::decode`]'s steps) over live `hmac-sha256` generations.
struct CidKeys<M> {
    slots: [Option<M>; 3],
}

impl<M: CidMac> CidKeys<M> {
    fn new(live: &[(u8, [u8; 32])]) -> Self {
        let mut slots = [None, None, None];
        for (g, s) in live {
            slots[*g as usize] = Some(M::new(s));
        }
        CidKeys { slots }
    }

    fn decode(&self, cid: &[u8]) -> Option<(u8, u16)> {
        if cid.len() != 12 {
            return None;
        }
        let cr = cid[0] >> 6;
        let key = self.slots.get(usize::from(cr))?.as_ref()?;
        let m = key.mask(&cid[..9]);
        Some((cr, u16::from_be_bytes([cid[9] ^ m[0], cid[10] ^ m[1]])))
    }
}

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, p: &str) {
    // One Initial, client, SCID, time and secret for every variant.
    let (dcid, cscid, scid) = ([0x42u8; 16], [0x17u8; 8], [0x5au8; 12]);
    let init = build_client_initial(VERSION_1, &dcid, &cscid, &[], 0, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
    let client: SocketAddr = "192.0.2.1:4433".parse().unwrap();
    let (now, secret) = (1_800_000_000, [3u8; 32]);

    let production = RetryMinter::new(&secret);
    let hh = Minter::<HandKdf, HandGcm>::new(&secret);
    let hc = Minter::<HandKdf, CrateGcm>::new(&secret);
    let ch = Minter::<CrateKdf, HandGcm>::new(&secret);
    let cc = Minter::<CrateKdf, CrateGcm>::new(&secret);
    // Same bytes from every variant, for a few nonces, before anything is timed.
    for i in 0..64u8 {
        let nonce = [i; 16];
        let mut want = [0u8; MAX_RETRY];
        let n = production.mint(&init, client, &scid, now, nonce, &mut want).unwrap();
        let mut got = [0u8; MAX_RETRY];
        for (name, m) in [
            ("hh", hh.mint(&init, client, &scid, now, nonce, &mut got).map(|n| (n, got))),
            ("hc", hc.mint(&init, client, &scid, now, nonce, &mut got).map(|n| (n, got))),
            ("ch", ch.mint(&init, client, &scid, now, nonce, &mut got).map(|n| (n, got))),
            ("cc", cc.mint(&init, client, &scid, now, nonce, &mut got).map(|n| (n, got))),
        ] {
            let (gn, g) = m.unwrap();
            assert_eq!(&g[..gn], &want[..n], "{name}: the production minter's bytes");
        }
    }

    let mut g = c.benchmark_group(format!("{p}crypto_ab/retry_mint"));
    g.sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(1));
    let mut out = [0u8; MAX_RETRY];
    let mut nonce = [9u8; 16];
    g.bench_function("proto", |b| {
        b.iter(|| {
            nonce[0] = nonce[0].wrapping_add(1);
            production.mint(black_box(&init), client, &scid, now, nonce, &mut out).unwrap()
        })
    });
    macro_rules! variant {
        ($name:literal, $m:expr) => {
            g.bench_function($name, |b| {
                b.iter(|| {
                    nonce[0] = nonce[0].wrapping_add(1);
                    $m.mint(black_box(&init), client, &scid, now, nonce, &mut out).unwrap()
                })
            });
        };
    }
    variant!("hkdf=hand,gcm=hand", hh);
    variant!("hkdf=hand,gcm=crate", hc);
    variant!("hkdf=crate,gcm=hand", ch);
    variant!("hkdf=crate,gcm=crate", cc);
    g.finish();

    // CID decode: two live hmac-sha256 generations, 4096 valid CIDs cycled.
    let (s1, s0) = ([0x5a; 32], [0xa5; 32]);
    let ks = KeySet::new((Generation::new(1).unwrap(), s1), Some((Generation::new(0).unwrap(), s0))).unwrap();
    let hand = CidKeys::<HmacSha256>::new(&[(1, s1), (0, s0)]);
    let crates = CidKeys::<Hmac<Sha256>>::new(&[(1, s1), (0, s0)]);
    let core = CidKeys::<CoreMac>::new(&[(1, s1), (0, s0)]);
    let cids: Vec<[u8; 12]> = (0..4096u32)
        .map(|i| {
            let r: [u8; 10] = core::array::from_fn(|j| (i.wrapping_mul(2654435761) >> (j % 4 * 8)) as u8 ^ j as u8);
            ks.encode(ServerId(i as u16), &r)
        })
        .collect();
    for cid in &cids {
        let d = ks.decode(cid).unwrap();
        let want = Some((d.generation.get(), d.server_id.0));
        assert_eq!(hand.decode(cid), want);
        assert_eq!(crates.decode(cid), want);
        assert_eq!(core.decode(cid), want);
    }
    let mut g = c.benchmark_group(format!("{p}crypto_ab/cid_decode"));
    g.sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(1));
    let mut i = 0usize;
    let mut next = || {
        i = (i + 1) & 4095;
        black_box(&cids[i])
    };
    g.bench_function("proto", |b| b.iter(|| ks.decode(next()).unwrap().server_id));
    g.bench_function("hand", |b| b.iter(|| hand.decode(next()).unwrap().1));
    g.bench_function("crates", |b| b.iter(|| crates.decode(next()).unwrap().1));
    g.bench_function("crates_core", |b| b.iter(|| core.decode(next()).unwrap().1));
    g.finish();

    // Parts.
    let (hk, ck) = (HandKdf::new(&secret), CrateKdf::new(&secret));
    let (hg, cg) = (HandGcm::new(), CrateGcm::new());
    let plain = {
        let mut t = vec![0u8, 0, 192, 0, 2, 1, 0x11, 0x51, 16];
        t.extend_from_slice(&dcid);
        t.extend_from_slice(&now.to_be_bytes());
        t
    };
    assert_eq!(plain.len(), 33);
    let pseudo: Vec<u8> = (0..79u8).collect();
    let key = hk.token_key(&[7; 16]);
    let mut sealed = plain.clone();
    let tag = hg.seal_256(&key, &mut sealed);
    let prefix = &cids[0][..9];
    let (hm, cm) = (<HmacSha256 as CidMac>::new(&s1), <Hmac<Sha256> as CidMac>::new(&s1));
    assert_eq!(hm.mask(prefix), cm.mask(prefix));
    assert_eq!(hk.hp_key(&dcid), ck.hp_key(&dcid));
    assert_eq!(hk.token_key(&[7; 16]), ck.token_key(&[7; 16]));
    assert_eq!(hg.seal_256(&key, &mut plain.clone()), cg.seal_256(&key, &mut plain.clone()));
    assert!(hg.open_256(&key, &mut sealed.clone(), &tag) && cg.open_256(&key, &mut sealed.clone(), &tag));
    assert_eq!(hg.integrity_tag(&pseudo), cg.integrity_tag(&pseudo));

    let mut g = c.benchmark_group(format!("{p}crypto_ab/part"));
    g.sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(1));
    g.bench_function("hmac_9/hand", |b| b.iter(|| hm.mask(black_box(prefix))));
    g.bench_function("hmac_9/crate", |b| b.iter(|| cm.mask(black_box(prefix))));
    g.bench_function("hp_key/hand", |b| b.iter(|| hk.hp_key(black_box(&dcid))));
    g.bench_function("hp_key/crate", |b| b.iter(|| ck.hp_key(black_box(&dcid))));
    let ip = proto::initial_protection::InitialProtection::new();
    g.bench_function("hp_key/proto", |b| b.iter(|| ip.client_hp_key(black_box(&dcid))));
    g.bench_function("token_key/hand", |b| b.iter(|| hk.token_key(black_box(&[7; 16]))));
    g.bench_function("token_key/crate", |b| b.iter(|| ck.token_key(black_box(&[7; 16]))));
    let mut buf = [0u8; 33];
    g.bench_function("seal_256/hand", |b| {
        b.iter(|| {
            buf.copy_from_slice(&plain);
            hg.seal_256(black_box(&key), &mut buf)
        })
    });
    g.bench_function("seal_256/crate", |b| {
        b.iter(|| {
            buf.copy_from_slice(&plain);
            cg.seal_256(black_box(&key), &mut buf)
        })
    });
    g.bench_function("open_256/hand", |b| {
        b.iter(|| {
            buf.copy_from_slice(&sealed);
            hg.open_256(black_box(&key), &mut buf, &tag)
        })
    });
    g.bench_function("open_256/crate", |b| {
        b.iter(|| {
            buf.copy_from_slice(&sealed);
            cg.open_256(black_box(&key), &mut buf, &tag)
        })
    });
    g.bench_function("integrity_tag/hand", |b| b.iter(|| hg.integrity_tag(black_box(&pseudo))));
    g.bench_function("integrity_tag/crate", |b| b.iter(|| cg.integrity_tag(black_box(&pseudo))));
    g.finish();
}

testkit::criterion_main_both_clocks!(benches);
