//! QUIC Initial packet protection (RFC 9001 §5; RFC 9369 §3.3 for v2) as the data
//! plane needs it, and the checks quinn 0.11 makes on a client's first Initial before
//! it would Retry it.
//!
//! **The Initial keys.** This module is the one place that derives them: the
//! versions' `initial_salt`s and labels, HKDF-Extract of the client's DCID under the
//! salt, HKDF-Expand-Label to the side's secret, then to its AEAD key, IV and
//! header-protection key (RFC 9001 §5.2, §5.1; [`InitialSalt`],
//! [`client_initial_keys`]), on the `hkdf` crate (HMAC-SHA-256 of `hmac` and `sha2`,
//! SHA-NI chosen at run time). proto::initial opens Initials with these keys.
//!
//! **The checks before a Retry** ([`InitialProtection::check`]): parse the Initial's
//! cleartext header (RFC 9000 §17.2.2), then remove header protection from its first
//! byte and require the reserved bits to be zero (RFC 9000 §17.2). The payload is
//! never decrypted (quinn does not either before a Retry). Only the first byte's mask
//! is needed: the reserved bits live there, and a Retry does not depend on the packet
//! number. So per Initial this costs an HKDF-Extract (under the v1 salt's HMAC key,
//! set up once), two HKDF-Expand-Label under fresh secrets (the client secret, then
//! the `quic hp` key): ten SHA-256 compressions in all; then an AES-128 key schedule
//! and one AES block (RFC 9001 §5.4.3, the `aes` crate, AES-NI chosen at run time).

use crate::header::{read_varint, MAX_CID_LEN_V1, MIN_INITIAL_DATAGRAM, VERSION_1, VERSION_2};
use aes::cipher::{BlockCipherEncrypt, KeyInit};
use hkdf::{Hkdf, HkdfExtract};
use sha2::Sha256;

/// The Initial secrets' parameters of one QUIC version.
struct VersionLabels {
    /// `initial_salt`.
    salt: [u8; 20],
    key: &'static [u8],
    iv: &'static [u8],
    hp: &'static [u8],
}

//= https://www.rfc-editor.org/rfc/rfc9001#section-5.2
//# This secret is determined by using HKDF-Extract (see Section 2.2 of [HKDF]) with a salt of
//# 0x38762cf7f55934b34d179ae6a4c80cadccbb7f0a and the input keying material (IKM) of the
//# Destination Connection ID field.
/// RFC 9001 §5.2 (initial_salt) and §5.1 (labels) for QUIC v1.
const V1_LABELS: VersionLabels = VersionLabels {
    salt: [
        0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb,
        0x7f, 0x0a,
    ],
    key: b"quic key",
    iv: b"quic iv",
    hp: b"quic hp",
};

/// RFC 9369 §3.3.1 (initial_salt) and §3.3.2 (labels) for QUIC v2.
const V2_LABELS: VersionLabels = VersionLabels {
    salt: [
        0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd,
        0x2e, 0xd9,
    ],
    key: b"quicv2 key",
    iv: b"quicv2 iv",
    hp: b"quicv2 hp",
};

/// Whose Initial packets: the client's (`"client in"`) or the server's
/// (`"server in"`), RFC 9001 §5.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// One side's Initial packet protection keys (RFC 9001 §5.1–5.2: AEAD_AES_128_GCM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitialKeys {
    /// The AEAD key (`quic key`).
    pub key: [u8; 16],
    /// The AEAD IV (`quic iv`).
    pub iv: [u8; 12],
    /// The header-protection key (`quic hp`).
    pub hp: [u8; 16],
}

/// One version's `initial_salt` as an HMAC key, set up once: the Initial secrets of
/// any DCID under it (RFC 9001 §5.2; RFC 9369 §3.3.1).
#[derive(Clone)]
pub struct InitialSalt {
    extract: HkdfExtract<Sha256>,
    labels: &'static VersionLabels,
}

impl std::fmt::Debug for InitialSalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InitialSalt(..)")
    }
}

impl InitialSalt {
    /// The salt of QUIC `version` (v1 or v2); `None` for another version.
    pub fn new(version: u32) -> Option<InitialSalt> {
        match version {
            VERSION_1 => Some(Self::with_labels(&V1_LABELS)),
            VERSION_2 => Some(Self::with_labels(&V2_LABELS)),
            _ => None,
        }
    }

    fn with_labels(labels: &'static VersionLabels) -> InitialSalt {
        // RFC 5869 §2.2: the salt is HMAC's key, its pads compressed here once.
        InitialSalt { extract: HkdfExtract::new(Some(&labels.salt)), labels }
    }

    //= https://www.rfc-editor.org/rfc/rfc9001#section-5.2
    //# The secret used by clients to construct Initial packets uses the PRK and the label "client
    //# in" as input to the HKDF-Expand-Label function from TLS [TLS13] to produce a 32-byte secret.
    //# Packets constructed by the server use the same process with the label "server in".
    /// RFC 9001 §5.2: `side`'s initial secret for the client's first DCID `dcid`,
    /// HKDF-Expand-Label(HKDF-Extract(initial_salt, dcid), "client in" | "server in",
    /// "", 32), as an HKDF PRK for the Expand-Labels that follow.
    fn secret(&self, side: Side, dcid: &[u8]) -> Hkdf<Sha256> {
        let mut extract = self.extract.clone();
        extract.input_ikm(dcid);
        let (_, initial_secret) = extract.finalize();
        let label: &[u8] = match side {
            Side::Client => b"client in",
            Side::Server => b"server in",
        };
        let secret: [u8; 32] = expand_label(&initial_secret, label);
        Hkdf::from_prk(&secret).expect("a 32-byte PRK is HashLen long (RFC 5869 §2.3)")
    }

    /// `side`'s Initial keys for `dcid` (RFC 9001 §5.1: `quic key`, `quic iv`,
    /// `quic hp` under the side's secret; RFC 9369 §3.3.2: the `quicv2` labels).
    pub fn keys(&self, side: Side, dcid: &[u8]) -> InitialKeys {
        let secret = self.secret(side, dcid);
        InitialKeys {
            key: expand_label(&secret, self.labels.key),
            iv: expand_label(&secret, self.labels.iv),
            hp: expand_label(&secret, self.labels.hp),
        }
    }

    /// `side`'s header-protection key for `dcid` alone (two HMACs fewer than
    /// [`InitialSalt::keys`]).
    pub fn hp_key(&self, side: Side, dcid: &[u8]) -> [u8; 16] {
        expand_label(&self.secret(side, dcid), self.labels.hp)
    }
}

//= https://www.rfc-editor.org/rfc/rfc9001#section-5.2
//# The HKDF-Expand-Label function defined in TLS 1.3 MUST be used for Initial packets even where
//# the TLS versions offered do not include TLS 1.3.
/// RFC 8446 §7.1 HKDF-Expand-Label(Secret, Label, "", N): HKDF-Expand with the
/// HkdfLabel structure (length, "tls13 " ‖ label, empty context) as info.
fn expand_label<const N: usize>(secret: &Hkdf<Sha256>, label: &[u8]) -> [u8; N] {
    const { assert!(N <= 255, "HkdfLabel length fits a u16 and HKDF's L ≤ 255·HashLen") };
    let length = (N as u16).to_be_bytes();
    let label_len = [u8::try_from(6 + label.len()).expect("the labels here are short")];
    let mut out = [0u8; N];
    secret
        .expand_multi_info(&[&length, &label_len, b"tls13 ", label, &[0]], &mut out)
        .expect("L ≤ 255·HashLen (RFC 5869 §2.3)");
    out
}

/// The client's Initial keys for `dcid` under QUIC `version` (v1 or v2), the salt
/// set up for this call; `None` for another version.
pub fn client_initial_keys(version: u32, dcid: &[u8]) -> Option<InitialKeys> {
    Some(InitialSalt::new(version)?.keys(Side::Client, dcid))
}

/// RFC 9000 §7.2: a client's first DCID is at least 8 bytes.
pub const MIN_FIRST_DCID: usize = 8;
//= https://www.rfc-editor.org/rfc/rfc9001#section-5.4.2
//# The sample of ciphertext is taken starting from an offset of 4 bytes after the start of the
//# Packet Number field.
/// RFC 9001 §5.4.2: the header-protection sample is 16 bytes, taken 4 bytes after the
/// start of the packet number.
const SAMPLE_OFFSET: usize = 4;
const SAMPLE_LEN: usize = 16;
/// RFC 9000 §17.2: the reserved bits of a long header (after protection removal).
const LONG_RESERVED_BITS: u8 = 0x0c;

/// Why a datagram does not get a Retry (quinn would not retry it either).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotRetryable {
    /// Shorter than 1200 bytes (RFC 9000 §14.1).
    Short,
    /// Not a v1 long-header Initial with the fixed bit set, or a field runs past the
    /// datagram (RFC 9000 §17.2.2).
    Malformed,
    /// A DCID shorter than 8 bytes (RFC 9000 §7.2).
    ShortDcid,
    /// Too short for the header-protection sample (RFC 9001 §5.4.2).
    NoSample,
    /// Reserved bits not zero after header protection removal (RFC 9000 §17.2).
    ReservedBits,
    /// Carries a Retry token that is valid for its sender: already validated.
    Validated,
}

/// The cleartext fields of a client Initial (RFC 9000 §17.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInitial<'a> {
    pub version: u32,
    pub dcid: &'a [u8],
    pub scid: &'a [u8],
    pub token: &'a [u8],
    /// Offset of the (protected) packet number.
    pub pn_offset: usize,
    /// Bytes of the first packet (coalesced packets after it are not looked at).
    pub packet_len: usize,
}

/// Parses the first packet of `datagram` as a QUIC v1 client Initial, as quinn's
/// `PartialDecode` does for a server that speaks v1 and never greases the fixed bit.
pub fn parse(datagram: &[u8]) -> Result<ClientInitial<'_>, NotRetryable> {
    parse_inner(datagram).ok_or(NotRetryable::Malformed)
}

fn parse_inner(p: &[u8]) -> Option<ClientInitial<'_>> {
    let first = *p.first()?;
    // Long form, fixed bit, type Initial (0).
    if first & 0xf0 != 0xc0 {
        return None;
    }
    let version = u32::from_be_bytes(p.get(1..5)?.try_into().ok()?);
    if version != VERSION_1 {
        return None;
    }
    let dl = usize::from(*p.get(5)?);
    if dl > MAX_CID_LEN_V1 {
        return None;
    }
    let dcid = p.get(6..6 + dl)?;
    let mut pos = 6 + dl;
    let sl = usize::from(*p.get(pos)?);
    if sl > MAX_CID_LEN_V1 {
        return None;
    }
    let scid = p.get(pos + 1..pos + 1 + sl)?;
    pos += 1 + sl;
    let (tl, n) = read_varint(p.get(pos..)?)?;
    pos += n;
    let token_end = pos.checked_add(usize::try_from(tl).ok()?)?;
    let token = p.get(pos..token_end)?;
    pos = token_end;
    let (len, n) = read_varint(p.get(pos..)?)?;
    pos += n;
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    if end > p.len() {
        return None;
    }
    Some(ClientInitial { version, dcid, scid, token, pn_offset: pos, packet_len: end })
}

/// Per-shard state of the check: the v1 salt's HMAC key, set up once.
pub struct InitialProtection {
    salt_v1: InitialSalt,
}

impl std::fmt::Debug for InitialProtection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InitialProtection(..)")
    }
}

impl Default for InitialProtection {
    fn default() -> Self {
        Self::new()
    }
}

impl InitialProtection {
    pub fn new() -> InitialProtection {
        InitialProtection { salt_v1: InitialSalt::with_labels(&V1_LABELS) }
    }

    /// The client's v1 Initial header-protection key for `dcid` (RFC 9001 §5.2:
    /// client_initial_secret = HKDF-Expand-Label(HKDF-Extract(initial_salt, dcid),
    /// "client in", 32); hp = HKDF-Expand-Label(that, "quic hp", 16)).
    pub fn client_hp_key(&self, dcid: &[u8]) -> [u8; 16] {
        self.salt_v1.hp_key(Side::Client, dcid)
    }

    /// The checks quinn makes on a first Initial before it may Retry it, in its order:
    /// datagram length, DCID length, sample present, reserved bits zero after header
    /// protection removal (RFC 9001 §5.4.1: the low 4 bits of the first byte are
    /// masked in a long header).
    pub fn check<'a>(&self, datagram: &'a [u8]) -> Result<ClientInitial<'a>, NotRetryable> {
        let (p, sample) = parse_to_sample(datagram)?;
        //= https://www.rfc-editor.org/rfc/rfc9001#section-5.4.1
        //# The least significant bits of the first byte of the packet are masked by the least
        //# significant bits of the first mask byte, and the packet number is masked with the
        //# remaining bytes.
        let mask = hp_mask(&self.client_hp_key(p.dcid), sample);
        if (datagram[0] ^ mask[0]) & 0x0f & LONG_RESERVED_BITS != 0 {
            return Err(NotRetryable::ReservedBits);
        }
        Ok(p)
    }
}

/// The first three of [`InitialProtection::check`]'s checks, in quinn's order (datagram
/// length, DCID length, sample present): the Initial and its header-protection sample.
fn parse_to_sample(datagram: &[u8]) -> Result<(ClientInitial<'_>, &[u8; SAMPLE_LEN]), NotRetryable> {
    let p = parse(datagram)?;
    if datagram.len() < MIN_INITIAL_DATAGRAM {
        return Err(NotRetryable::Short);
    }
    if p.dcid.len() < MIN_FIRST_DCID {
        return Err(NotRetryable::ShortDcid);
    }
    let start = p.pn_offset + SAMPLE_OFFSET;
    let sample = datagram
        .get(start..start + SAMPLE_LEN)
        .filter(|_| start + SAMPLE_LEN <= p.packet_len)
        .and_then(|s| <&[u8; SAMPLE_LEN]>::try_from(s).ok())
        .ok_or(NotRetryable::NoSample)?;
    Ok((p, sample))
}

/// RFC 9001 §5.4.3: the AES-based header-protection mask, AES-ECB(hp_key, sample)
/// (AES-128 for the Initial keys), of which the first five bytes are used.
fn hp_mask(hp_key: &[u8; 16], sample: &[u8; SAMPLE_LEN]) -> [u8; 16] {
    let mut block = aes::Block::from(*sample);
    aes::Aes128Enc::new(&(*hp_key).into()).encrypt_block(&mut block);
    block.into()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::initial::build_client_initial;
    use aws_lc_rs::aead::quic::{HeaderProtectionKey, AES_128};
    use proptest::prelude::*;

    /// The aws-lc-rs implementations this module and proto::initial had before the
    /// `hkdf` and `aes` crates: the slow, obviously right models of the Initial keys
    /// and of `check`, with the salts and labels transcribed from the RFCs again.
    pub(crate) mod model {
        use super::super::*;
        use aws_lc_rs::aead::quic::{HeaderProtectionKey, AES_128};
        use aws_lc_rs::hkdf::{KeyType, Prk, Salt, HKDF_SHA256};
        use aws_lc_rs::hmac;

        // RFC 9001 §5.2.
        const SALT_V1: [u8; 20] = [
            0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb,
            0x7f, 0x0a,
        ];
        // RFC 9369 §3.3.1.
        const SALT_V2: [u8; 20] = [
            0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd,
            0x2e, 0xd9,
        ];
        // RFC 8446 §7.1 HkdfLabel ‖ RFC 5869 §2.3's counter 0x01.
        const LABEL_CLIENT_IN: &[u8] = b"\x00\x20\x0ftls13 client in\x00\x01";
        const LABEL_QUIC_HP: &[u8] = b"\x00\x10\x0dtls13 quic hp\x00\x01";

        /// The v1 client hp key, HMAC by HMAC.
        pub fn client_hp_key(dcid: &[u8]) -> [u8; 16] {
            let salt_v1 = hmac::Key::new(hmac::HMAC_SHA256, &SALT_V1);
            let initial = hmac::sign(&salt_v1, dcid);
            let prk = hmac::Key::new(hmac::HMAC_SHA256, initial.as_ref());
            let client = hmac::sign(&prk, LABEL_CLIENT_IN);
            let client = hmac::Key::new(hmac::HMAC_SHA256, client.as_ref());
            let hp = hmac::sign(&client, LABEL_QUIC_HP);
            let mut out = [0u8; 16];
            out.copy_from_slice(&hp.as_ref()[..16]);
            out
        }

        struct Len(usize);
        impl KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }

        /// RFC 8446 §7.1 HKDF-Expand-Label with an empty context.
        fn expand_label(prk: &Prk, label: &[u8], out: &mut [u8]) {
            let len = (out.len() as u16).to_be_bytes();
            let info: [&[u8]; 5] = [&len, &[6 + label.len() as u8], b"tls13 ", label, &[0]];
            prk.expand(&info, Len(out.len())).unwrap().fill(out).unwrap();
        }

        /// RFC 9001 §5.2 / RFC 9369 §3.3 with aws-lc-rs's HKDF: (key, iv, hp).
        pub fn initial_keys(version: u32, server: bool, dcid: &[u8]) -> ([u8; 16], [u8; 12], [u8; 16]) {
            let (salt, key_l, iv_l, hp_l): (&[u8], &[u8], &[u8], &[u8]) = match version {
                VERSION_1 => (&SALT_V1, b"quic key", b"quic iv", b"quic hp"),
                VERSION_2 => (&SALT_V2, b"quicv2 key", b"quicv2 iv", b"quicv2 hp"),
                _ => panic!("no salt for {version:#x}"),
            };
            let initial = Salt::new(HKDF_SHA256, salt).extract(dcid);
            let mut secret = [0u8; 32];
            expand_label(&initial, if server { b"server in" } else { b"client in" }, &mut secret);
            let side = Prk::new_less_safe(HKDF_SHA256, &secret);
            let (mut key, mut iv, mut hp) = ([0u8; 16], [0u8; 12], [0u8; 16]);
            expand_label(&side, key_l, &mut key);
            expand_label(&side, iv_l, &mut iv);
            expand_label(&side, hp_l, &mut hp);
            (key, iv, hp)
        }

        /// `check` with aws-lc-rs's header protection (the parsing and the length
        /// checks before it are [`parse_to_sample`], shared).
        pub fn check(datagram: &[u8]) -> Result<ClientInitial<'_>, NotRetryable> {
            let (p, sample) = parse_to_sample(datagram)?;
            let hp = HeaderProtectionKey::new(&AES_128, &client_hp_key(p.dcid)).map_err(|_| NotRetryable::NoSample)?;
            let mask = hp.new_mask(sample).map_err(|_| NotRetryable::NoSample)?;
            if (datagram[0] ^ mask[0]) & 0x0f & LONG_RESERVED_BITS != 0 {
                return Err(NotRetryable::ReservedBits);
            }
            Ok(p)
        }
    }

    proptest! {
        /// RFC 9001 §5.2 for any DCID of 0..=20 bytes: the same key as the model.
        #[test]
        fn hp_key_is_the_model(dcid in proptest::collection::vec(any::<u8>(), 0..=20)) {
            prop_assert_eq!(InitialProtection::new().client_hp_key(&dcid), model::client_hp_key(&dcid));
        }

        /// RFC 9001 §5.2 / RFC 9369 §3.3 for any DCID of 0..=20 bytes, both
        /// versions and both sides: aws-lc-rs's HKDF gives the same key, IV and hp.
        #[test]
        fn initial_keys_are_the_model(dcid in proptest::collection::vec(any::<u8>(), 0..=20),
                                      v2 in any::<bool>(),
                                      server in any::<bool>()) {
            let version = if v2 { VERSION_2 } else { VERSION_1 };
            let side = if server { Side::Server } else { Side::Client };
            let salt = InitialSalt::new(version).unwrap();
            let k = salt.keys(side, &dcid);
            prop_assert_eq!((k.key, k.iv, k.hp), model::initial_keys(version, server, &dcid));
            prop_assert_eq!(salt.hp_key(side, &dcid), k.hp);
            if !server {
                prop_assert_eq!(client_initial_keys(version, &dcid), Some(k));
            }
        }

        /// RFC 9001 §5.4.3 for any key and sample: the mask aws-lc-rs's
        /// HeaderProtectionKey makes (its five bytes).
        #[test]
        fn hp_mask_is_aws_lc(key in any::<[u8; 16]>(), sample in any::<[u8; 16]>()) {
            let want = HeaderProtectionKey::new(&AES_128, &key).unwrap().new_mask(&sample).unwrap();
            prop_assert_eq!(hp_mask(&key, &sample)[..5].to_vec(), want.to_vec());
        }

        // `check` and `parse` against a model that shares no code with them, and
        // RFC 9001 Appendix A end to end: tests/initial_protection_model.rs.
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 9001 Appendix A.1 (and RFC 9369 Appendix A.1 for v2): both sides' key,
    /// IV and hp for DCID 0x8394c8f03e515708; the Retry path's `client_hp_key` is the
    /// same derivation; another version has no salt.
    #[test]
    fn rfc9001_a1_and_rfc9369_a1_keys() {
        let dcid = hex("8394c8f03e515708");
        let cases = [
            (
                VERSION_1,
                Side::Client,
                "1f369613dd76d5467730efcbe3b1a22d",
                "fa044b2f42a3fd3b46fb255c",
                "9f50449e04a0e810283a1e9933adedd2",
            ),
            (
                VERSION_1,
                Side::Server,
                "cf3a5331653c364c88f0f379b6067e37",
                "0ac1493ca1905853b0bba03e",
                "c206b8d9b9f0f37644430b490eeaa314",
            ),
            (
                VERSION_2,
                Side::Client,
                "8b1a0bc121284290a29e0971b5cd045d",
                "91f73e2351d8fa91660e909f",
                "45b95e15235d6f45a6b19cbcb0294ba9",
            ),
            (
                VERSION_2,
                Side::Server,
                "82db637861d55e1d011f19ea71d5d2a7",
                "dd13c276499c0249d3310652",
                "edf6d05c83121201b436e16877593c3a",
            ),
        ];
        for (version, side, key, iv, hp) in cases {
            let k = InitialSalt::new(version).unwrap().keys(side, &dcid);
            let what = format!("{version:#x} {side:?}");
            assert_eq!((k.key.to_vec(), k.iv.to_vec(), k.hp.to_vec()), (hex(key), hex(iv), hex(hp)), "{what}");
        }
        assert_eq!(InitialProtection::new().client_hp_key(&dcid).to_vec(), hex("9f50449e04a0e810283a1e9933adedd2"));
        assert!(InitialSalt::new(0xff00_001d).is_none() && client_initial_keys(0, &dcid).is_none());
    }

    /// RFC 9001 Appendix A.2: the client's protected Initial header starts
    /// c000000001088394c8f03e5157080000449e7b9aec34 and its unprotected first byte is
    /// c3 (reserved bits zero); the sample is d1b1c98dd7689fb8ec11d242b123dc9b, the
    /// mask 437b9aec36. Appendix A.3: the server's sample
    /// 2cd0991cd25b0aac406a5816b6394100 gives mask 2ec0d8356a under the server hp key,
    /// and its first byte c1 is protected to cf.
    #[test]
    fn rfc9001_a2_a3_masks() {
        let dcid = hex("8394c8f03e515708");
        let key = InitialProtection::new().client_hp_key(&dcid);
        let sample: [u8; 16] = hex("d1b1c98dd7689fb8ec11d242b123dc9b").try_into().unwrap();
        let hp = HeaderProtectionKey::new(&AES_128, &key).unwrap();
        let mask = hp.new_mask(&sample).unwrap();
        assert_eq!(mask[..5].to_vec(), hex("437b9aec36"));
        assert_eq!(0xc0 ^ (mask[0] & 0x0f), 0xc3);
        assert_eq!(hp_mask(&key, &sample)[..5].to_vec(), hex("437b9aec36"), "the aes crate's mask");
        let server = InitialSalt::new(VERSION_1).unwrap().hp_key(Side::Server, &dcid);
        let sample: [u8; 16] = hex("2cd0991cd25b0aac406a5816b6394100").try_into().unwrap();
        let mask = hp_mask(&server, &sample);
        assert_eq!(mask[..5].to_vec(), hex("2ec0d8356a"));
        assert_eq!(0xc1 ^ (mask[0] & 0x0f), 0xcf);
    }

    #[test]
    fn checks_in_quinns_order() {
        let ip = InitialProtection::new();
        let dcid = [9u8; 12];
        let ch = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 1200).unwrap();
        let p = ip.check(&ch).unwrap();
        assert_eq!((p.dcid, p.scid, p.token, p.packet_len), (&dcid[..], &[1u8; 8][..], &[][..], 1200));
        // A token is parsed out, not judged here.
        let t = build_client_initial(VERSION_1, &dcid, &[], &[5; 30], 0, &[6, 0, 1, 0xaa], 1200).unwrap();
        assert_eq!(ip.check(&t).unwrap().token, &[5; 30]);
        let short = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 1199).unwrap();
        assert_eq!(short.len(), 1199);
        assert_eq!(ip.check(&short), Err(NotRetryable::Short));
        let d7 = build_client_initial(VERSION_1, &[9; 7], &[1; 8], &[], 0, &[6, 0, 1, 2], 1200).unwrap();
        assert_eq!(ip.check(&d7), Err(NotRetryable::ShortDcid));
        // v2 is not retried (quinn 0.11 workers speak v1 only).
        let v2 = build_client_initial(crate::header::VERSION_2, &dcid, &[], &[], 0, &[6, 0, 1, 2], 1200).unwrap();
        assert_eq!(ip.check(&v2), Err(NotRetryable::Malformed));
        // Setting a reserved bit under the mask: dropped.
        let mut bad = ch.clone();
        bad[0] ^= 0x04;
        assert_eq!(ip.check(&bad), Err(NotRetryable::ReservedBits));
        let mut bad = ch.clone();
        bad[0] ^= 0x08;
        assert_eq!(ip.check(&bad), Err(NotRetryable::ReservedBits));
        // The packet-number-length bits are not reserved.
        let mut ok = ch.clone();
        ok[0] ^= 0x01;
        assert!(ip.check(&ok).is_ok());
        // A Length that runs past the datagram, a fixed bit clear, a 21-byte DCID.
        let mut padded = build_client_initial(VERSION_1, &dcid, &[1; 8], &[], 0, &[6, 0, 3, 1, 2, 3], 0).unwrap();
        let first_len = padded.len();
        padded.resize(1200, 0);
        assert_eq!(ip.check(&padded).unwrap().packet_len, first_len, "padding after the packet is not looked at");
        let mut cut = ch.clone();
        cut.truncate(1199);
        assert_eq!(ip.check(&cut), Err(NotRetryable::Malformed), "Length past the end");
        let mut nofix = ch.clone();
        nofix[0] &= !0x40;
        assert_eq!(ip.check(&nofix), Err(NotRetryable::Malformed));
        let mut d21 = ch;
        d21[5] = 21;
        assert_eq!(ip.check(&d21), Err(NotRetryable::Malformed));
    }
}
