//! Address-validation tokens in quinn-proto 0.11's format, checked without quinn
//! (quinn keeps its token type crate-private: src/token.rs `Token::decode`), so the
//! data plane can tell whether a client Initial's token is one the instances' quinn
//! would accept (docs/adr/0003-demux-retry.md).
//!
//! Format (quinn-proto 0.11.19 `Token::encode`): `sealed ‖ nonce`, where `nonce` is
//! 16 random bytes and `sealed` is AES-256-GCM (zero nonce, no AAD) under a key
//! HKDF-Expand(prk, info = nonce, 32) of the shared token key over
//! - Retry (type 0): IP (tag 0 + 4 bytes | tag 1 + 16), port (u16 BE), original
//!   DCID (u8 length + bytes), issue time (u64 BE Unix seconds);
//! - Validation, i.e. NEW_TOKEN (type 1): IP, issue time.
//!
//! [`TokenKey::check`] accepts a Retry token bound to exactly the client's address
//! that has not outlived quinn's `retry_token_lifetime` ([`RETRY_LIFETIME`], 15 s),
//! and a NEW_TOKEN token for the client's IP within quinn's default validation
//! lifetime ([`VALIDATION_LIFETIME`], two weeks). It cannot consult the workers'
//! `TokenLog` (reuse of a NEW_TOKEN token): the data plane only uses the answer to
//! decide where a datagram goes and whether to drop rather than Retry it; the worker's
//! quinn still makes its own decision.
//!
//! [`TokenKey::seal_retry`] is the other side: it writes the Retry token quinn's
//! `Endpoint::retry` would (same layout, same key derivation), into a caller's buffer,
//! with the issue time and the nonce passed in. The data plane mints its Retries
//! with it (proto::retry::RetryMinter); a quinn endpoint accepting these tokens is
//! tested in demux/src/dataplane/retry.rs. The layout is quinn-proto 0.11.19's, and
//! the workspace pins that exact version (Cargo.toml).
//!
//! Pure: time and nonce are passed in. Cost: one HKDF-Expand (the `hkdf` crate, one
//! HMAC-SHA-256 under the PRK's pads compressed once: RFC 5869 §2.3 needs a single
//! block for 32 bytes, so two SHA-256 compressions), one AES-256 key expansion and the
//! GCM seal or open of ≈ 40 bytes (the `aes-gcm` crate; its open compares the tag in
//! constant time before it decrypts).

use aes_gcm::aead::AeadInOut;
use aes_gcm::{AesGcm, KeyInit};
use hkdf::Hkdf;
use sha2::Sha256;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// quinn's default `ServerConfig::retry_token_lifetime`, in seconds.
pub const RETRY_LIFETIME: u64 = 15;
/// quinn's default `ValidationTokenConfig::lifetime`, in seconds (two weeks).
pub const VALIDATION_LIFETIME: u64 = 2 * 7 * 24 * 60 * 60;
/// The salt of the instances' token key derivation (worker::secrets, demux retry.rs).
pub const TOKEN_SALT: &[u8] = b"quicdemux token v1";

/// What a token is for the client it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenCheck {
    /// A Retry token for this client address, not expired.
    Retry,
    /// A NEW_TOKEN token for this client IP, not expired.
    Validation,
    /// Empty, not ours, tampered with, another address, or expired.
    Invalid,
}

impl TokenCheck {
    pub fn is_valid(self) -> bool {
        self != TokenCheck::Invalid
    }
}

/// The instances' shared token key: the PRK that HKDF-Extract(salt = [`TOKEN_SALT`],
/// the key file's `token` secret) gives (RFC 5869 §2.2), as an HKDF-Expand key whose
/// HMAC pads are compressed once, so that each token's HKDF-Expand is one HMAC of one
/// block: two SHA-256 compressions.
pub struct TokenKey(Hkdf<Sha256>);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// AES-256-GCM (the `aes-gcm` crate) on the encrypt-only AES-256 key schedule: GCM
/// only ever encrypts blocks, and `aes::Aes256` (what `aes_gcm::Aes256Gcm` uses)
/// would also expand the decryption round keys of every fresh token key.
type Aes256Gcm = AesGcm<aes::Aes256Enc, aes::cipher::consts::U12>;

/// The random nonce appended to every token (quinn: a `u128`, little-endian).
pub const NONCE_LEN: usize = 16;
/// AES-256-GCM's full 128-bit tag (NIST SP 800-38D §5.2.1.2).
const TAG_LEN: usize = 16;
/// quinn seals every token with a zero nonce: each token has its own key.
const ZERO_IV: [u8; 12] = [0; 12];
/// The longest Retry token: type, IPv6 (tag + 16), port, ODCID (length + 20), issue
/// time, AEAD tag, nonce.
pub const MAX_RETRY_TOKEN: usize = 1 + 17 + 2 + 21 + 8 + TAG_LEN + NONCE_LEN;

impl TokenKey {
    /// The key worker::secrets derives from the key file's `token` secret.
    pub fn new(secret: &[u8; 32]) -> TokenKey {
        // RFC 5869 §2.2: PRK = HKDF-Extract(salt, secret).
        TokenKey(Hkdf::new(Some(TOKEN_SALT), secret))
    }

    /// quinn's `aead_from_hkdf`: the AES-256-GCM key of the token with `nonce`,
    /// HKDF-Expand(prk, info = nonce, 32), i.e. T(1) = HMAC(prk, nonce ‖ 0x01)
    /// (RFC 5869 §2.3).
    fn token_key(&self, nonce: &[u8]) -> Option<[u8; 32]> {
        let mut key = [0u8; 32];
        self.0.expand(nonce, &mut key).ok()?;
        Some(key)
    }

    //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.3
    //# When a server receives an Initial packet with an address validation token, it MUST attempt
    //# to validate the token, unless it has already completed address validation.
    /// Checks `token` from `client` at `now_unix` seconds (RFC 9000 §8.1.3–8.1.4).
    pub fn check(&self, token: &[u8], client: SocketAddr, now_unix: u64) -> TokenCheck {
        self.check_inner(token, client, now_unix).unwrap_or(TokenCheck::Invalid)
    }

    fn check_inner(&self, token: &[u8], client: SocketAddr, now_unix: u64) -> Option<TokenCheck> {
        // Shortest: type, IPv4, time, tag, nonce.
        if token.len() < 1 + 5 + 8 + TAG_LEN + NONCE_LEN || token.len() > 256 {
            return None;
        }
        let (sealed, nonce) = token.split_at(token.len() - NONCE_LEN);
        let (ct, tag) = sealed.split_at(sealed.len() - TAG_LEN);
        let mut buf = [0u8; 256];
        let plain = &mut buf[..ct.len()];
        plain.copy_from_slice(ct);
        // quinn: AES-256-GCM, zero nonce, no AAD (NIST SP 800-38D §7.2: the tag is
        // compared in constant time, and nothing is decrypted unless it matches).
        let tag = <[u8; TAG_LEN]>::try_from(tag).ok()?;
        //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.4
        //# For this design to work, the token MUST be covered by integrity protection against
        //# modification or falsification by clients.
        Aes256Gcm::new(&self.token_key(nonce)?.into())
            .decrypt_inout_detached(&ZERO_IV.into(), &[], plain.into(), &tag.into())
            .ok()?;
        read_plain(plain, client, now_unix)
    }

    /// Writes the Retry token quinn-proto 0.11.19's `Endpoint::retry` makes
    /// (`TokenPayload::Retry { address, orig_dst_cid, issued }`, `Token::encode`) for
    /// `client` and original DCID `odcid` into `out`; its length. `None` for an ODCID
    /// longer than 20 bytes (RFC 9000 §17.2) or an `out` shorter than needed. No
    /// allocation.
    pub fn seal_retry(
        &self,
        client: SocketAddr,
        odcid: &[u8],
        issued_unix: u64,
        nonce: [u8; NONCE_LEN],
        out: &mut [u8],
    ) -> Option<usize> {
        let plain_len = write_retry_plain(out, client, odcid, issued_unix)?;
        self.seal_plain(out, plain_len, nonce)
    }

    /// Seals a token in quinn's format, allocating (tests and tools). `odcid: Some`
    /// makes a Retry token for `client` (as [`TokenKey::seal_retry`]), `None` a
    /// NEW_TOKEN token for its IP.
    pub fn seal(&self, client: SocketAddr, odcid: Option<&[u8]>, issued_unix: u64, nonce: [u8; 16]) -> Option<Vec<u8>> {
        let mut b = [0u8; MAX_RETRY_TOKEN];
        let plain_len = match odcid {
            Some(odcid) => write_retry_plain(&mut b, client, odcid, issued_unix)?,
            None => write_validation_plain(&mut b, client, issued_unix)?,
        };
        let n = self.seal_plain(&mut b, plain_len, nonce)?;
        Some(b[..n].to_vec())
    }

    /// Seals the `plain_len` bytes of plaintext at the front of `out` in place and
    /// appends the tag and `nonce` (quinn's `Token::encode`); the token's length.
    fn seal_plain(&self, out: &mut [u8], plain_len: usize, nonce: [u8; NONCE_LEN]) -> Option<usize> {
        // quinn: AES-256-GCM, zero nonce, no AAD (NIST SP 800-38D §7.1).
        let tag = Aes256Gcm::new(&self.token_key(&nonce)?.into())
            .encrypt_inout_detached(&ZERO_IV.into(), &[], out.get_mut(..plain_len)?.into())
            .ok()?;
        let end = plain_len + TAG_LEN + NONCE_LEN;
        out.get_mut(plain_len..plain_len + TAG_LEN)?.copy_from_slice(&tag);
        out.get_mut(plain_len + TAG_LEN..end)?.copy_from_slice(&nonce);
        Some(end)
    }
}

/// What a client Initial whose DCID decodes to a live id proves by itself, before the
/// data plane's state and limits have a say (proto::limits::owner_initial, docs/adr/0003).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerInitialProof {
    /// Its token is valid for the client: a Retry or NEW_TOKEN validated the address
    /// (RFC 9000 §8.1).
    Token,
    /// No valid token, and some segment starts a connection
    /// ([`crate::initial::starts_connection`]): a ClientHello on a copied CID.
    StartsConnection,
    /// Neither: garbage, CRYPTO past offset 0, an ACK — a client's Initial after the
    /// server's first flight (RFC 9000 §7.2) and an attacker's look the same here.
    None,
}

/// Classifies a client Initial on a live DCID by its bytes alone. `datagram` is the
/// whole datagram, or a uniform GRO train of `stride`-byte segments (`stride > 0`).
/// Pays a token check when there is a token and, unless it validated, opening the
/// Initial(s) of each segment.
pub fn owner_initial_proof(
    key: Option<&TokenKey>,
    h: &crate::header::LongHeader<'_>,
    datagram: &[u8],
    stride: usize,
    client: SocketAddr,
    now_unix: u64,
) -> OwnerInitialProof {
    if !h.token.is_empty() && key.is_some_and(|k| k.check(h.token, client, now_unix).is_valid()) {
        return OwnerInitialProof::Token;
    }
    let stride = if stride == 0 { datagram.len().max(1) } else { stride };
    if datagram.chunks(stride).any(|seg| crate::initial::starts_connection(seg) == Some(true)) {
        OwnerInitialProof::StartsConnection
    } else {
        OwnerInitialProof::None
    }
}

/// What an opened token's plaintext `plain` (quinn's `TokenPayload`) is for `client`
/// at `now_unix`; `None` when it is for another address, expired or malformed.
pub(crate) fn read_plain(plain: &[u8], client: SocketAddr, now_unix: u64) -> Option<TokenCheck> {
    let mut r = plain;
    let ty = take(&mut r, 1)?[0];
    let ip = match take(&mut r, 1)?[0] {
        0 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(take(&mut r, 4)?).ok()?)),
        1 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(take(&mut r, 16)?).ok()?)),
        _ => return None,
    };
    //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.3
    //# Tokens provided with NEW_TOKEN frames and Retry packets can be distinguished by servers
    //# (see Section 8.1.1), and the latter can be validated more strictly.
    let (check, lifetime) = match ty {
        0 => {
            let port = u16::from_be_bytes(take(&mut r, 2)?.try_into().ok()?);
            let odcid_len = usize::from(take(&mut r, 1)?[0]);
            take(&mut r, odcid_len)?;
            //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.4
            //# Tokens sent in Retry packets SHOULD include information that allows the server
            //# to verify that the source IP address and port in client packets remain constant.
            if SocketAddr::new(ip, port) != client {
                return None;
            }
            (TokenCheck::Retry, RETRY_LIFETIME)
        }
        1 => {
            //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.4
            //# Tokens sent in NEW_TOKEN frames MUST include information that allows the server
            //# to verify that the client IP address has not changed from when the token was
            //# issued.
            if ip != client.ip() {
                return None;
            }
            (TokenCheck::Validation, VALIDATION_LIFETIME)
        }
        _ => return None,
    };
    //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.4
    //# Servers SHOULD ensure that tokens sent in Retry packets are only accepted for a short
    //# time, as they are returned immediately by clients.
    //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.3
    //# Thus, a token SHOULD have an expiration time, which could be either an explicit
    //# expiration time or an issued timestamp that can be used to dynamically calculate the
    //# expiration time.
    let issued = u64::from_be_bytes(take(&mut r, 8)?.try_into().ok()?);
    // quinn: invalid once `issued + lifetime < now`.
    if !r.is_empty() || issued.saturating_add(lifetime) < now_unix {
        return None;
    }
    Some(check)
}

/// Writes the plaintext of quinn's Retry token (type 0, IP, port, original DCID, issue
/// time) to the front of `out`; its length. `None` for an original DCID longer than 20
/// bytes (RFC 9000 §17.2) or an `out` too short.
pub(crate) fn write_retry_plain(out: &mut [u8], client: SocketAddr, odcid: &[u8], issued_unix: u64) -> Option<usize> {
    if odcid.len() > 20 {
        return None;
    }
    let mut w = Writer { out, pos: 0 };
    w.put(&[0])?;
    w.put_ip(client.ip())?;
    w.put(&client.port().to_be_bytes())?;
    w.put(&[odcid.len() as u8])?;
    //= https://www.rfc-editor.org/rfc/rfc9000#section-8.1.2
    //# Requiring the server to provide a different connection ID, along with the
    //# original_destination_connection_id transport parameter defined in Section 18.2, forces
    //# the server to demonstrate that it, or an entity it cooperates with, received the
    //# original Initial packet from the client.
    w.put(odcid)?;
    w.put(&issued_unix.to_be_bytes())?;
    Some(w.pos)
}

/// Writes the plaintext of quinn's NEW_TOKEN token (type 1, IP, issue time) to the
/// front of `out`; its length.
fn write_validation_plain(out: &mut [u8], client: SocketAddr, issued_unix: u64) -> Option<usize> {
    let mut w = Writer { out, pos: 0 };
    w.put(&[1])?;
    w.put_ip(client.ip())?;
    w.put(&issued_unix.to_be_bytes())?;
    Some(w.pos)
}

/// Appends to a fixed buffer; `None` once it is full.
struct Writer<'a> {
    out: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, b: &[u8]) -> Option<()> {
        self.out.get_mut(self.pos..self.pos + b.len())?.copy_from_slice(b);
        self.pos += b.len();
        Some(())
    }

    /// quinn's encoding of an IP address: tag 0 and 4 bytes, or tag 1 and 16.
    fn put_ip(&mut self, ip: IpAddr) -> Option<()> {
        match ip {
            IpAddr::V4(v4) => {
                self.put(&[0])?;
                self.put(&v4.octets())
            }
            IpAddr::V6(v6) => {
                self.put(&[1])?;
                self.put(&v6.octets())
            }
        }
    }
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (a, b) = (r.get(..n)?, r.get(n..)?);
    *r = b;
    Some(a)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The aws-lc-rs implementation this module had before the RustCrypto crates: the
    /// slow, obviously right model of the token key and of the AEAD around the token's
    /// plaintext. The plaintext codec (`read_plain`, `write_retry_plain`) is shared:
    /// its oracle is quinn itself (demux/src/dataplane/retry.rs).
    pub(crate) mod model {
        use super::super::{read_plain, TokenCheck, TOKEN_SALT};
        use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        use aws_lc_rs::hmac;
        use std::net::SocketAddr;

        pub struct TokenKey(hmac::Key);

        impl TokenKey {
            pub fn new(secret: &[u8; 32]) -> TokenKey {
                let prk = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, TOKEN_SALT), secret);
                TokenKey(hmac::Key::new(hmac::HMAC_SHA256, prk.as_ref()))
            }

            pub fn key_bytes(&self, nonce: &[u8]) -> [u8; 32] {
                let mut ctx = hmac::Context::with_key(&self.0);
                ctx.update(nonce);
                ctx.update(&[1]);
                ctx.sign().as_ref().try_into().unwrap()
            }

            fn aead(&self, nonce: &[u8]) -> Option<LessSafeKey> {
                Some(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.key_bytes(nonce)).ok()?))
            }

            /// `TokenKey::check`: aws-lc-rs opens the token, `read_plain` reads it.
            pub fn check(&self, token: &[u8], client: SocketAddr, now_unix: u64) -> TokenCheck {
                // Shortest: type, IPv4, time, tag, nonce.
                if token.len() < 1 + 5 + 8 + 16 + 16 || token.len() > 256 {
                    return TokenCheck::Invalid;
                }
                let (sealed, nonce) = token.split_at(token.len() - 16);
                let mut buf = sealed.to_vec();
                let zero = Nonce::assume_unique_for_key([0; 12]);
                let plain = self.aead(nonce).and_then(|k| k.open_in_place(zero, Aad::empty(), &mut buf).ok());
                plain.and_then(|p| read_plain(p, client, now_unix)).unwrap_or(TokenCheck::Invalid)
            }

            /// `TokenKey::seal_plain` on aws-lc-rs: seals the `plain_len` bytes at the
            /// front of `out` and appends the tag and the nonce.
            pub fn seal_plain(&self, out: &mut [u8], plain_len: usize, nonce: [u8; 16]) -> Option<usize> {
                let zero = Nonce::assume_unique_for_key([0; 12]);
                let tag = self
                    .aead(&nonce)?
                    .seal_in_place_separate_tag(zero, Aad::empty(), out.get_mut(..plain_len)?)
                    .ok()?;
                let end = plain_len + 16 + 16;
                out.get_mut(plain_len..plain_len + 16)?.copy_from_slice(tag.as_ref());
                out.get_mut(plain_len + 16..end)?.copy_from_slice(&nonce);
                Some(end)
            }
        }
    }

    pub(crate) fn any_client() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(Ipv4Addr::from(ip).into(), port)),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(Ipv6Addr::from(ip).into(), port)),
        ]
    }

    proptest! {
        /// RFC 5869 §2.2–2.3 as quinn derives it: the same PRK and per-token key as
        /// the model, for any secret and nonce.
        #[test]
        fn token_key_is_the_model(secret in any::<[u8; 32]>(), nonce in any::<[u8; 16]>()) {
            prop_assert_eq!(TokenKey::new(&secret).token_key(&nonce), Some(model::TokenKey::new(&secret).key_bytes(&nonce)));
        }

        /// `check` answers as the model for Retry and NEW_TOKEN tokens of any client,
        /// checked from that client or a neighbour, at any time around their
        /// lifetimes, intact or with one bit flipped, and for random bytes.
        #[test]
        fn check_is_the_model(secret in any::<[u8; 32]>(),
                              client in any_client(),
                              retry in any::<bool>(),
                              odcid in proptest::collection::vec(any::<u8>(), 0..=20),
                              issued in 0u64..1 << 40,
                              nonce in any::<[u8; 16]>(),
                              other_port in any::<bool>(),
                              age in 0u64..=2 * VALIDATION_LIFETIME,
                              flip in proptest::option::of(0usize..80 * 8),
                              junk in proptest::collection::vec(any::<u8>(), 0..=80)) {
            let key = TokenKey::new(&secret);
            let model = model::TokenKey::new(&secret);
            let mut t = key.seal(client, retry.then_some(&odcid[..]), issued, nonce).unwrap();
            if let Some(bit) = flip.filter(|b| b / 8 < t.len()) {
                t[bit / 8] ^= 1 << (bit % 8);
            }
            let from = if other_port { SocketAddr::new(client.ip(), client.port() ^ 1) } else { client };
            let now = issued + age % if retry { 3 * RETRY_LIFETIME } else { 2 * VALIDATION_LIFETIME };
            prop_assert_eq!(key.check(&t, from, now), model.check(&t, from, now));
            prop_assert_eq!(key.check(&junk, from, now), model.check(&junk, from, now));
        }

        /// `seal_retry` writes the model's bytes (quinn's plaintext sealed by the
        /// model's AEAD) for any client, ODCID of 0..=21 bytes, issue time, nonce and
        /// output room; the token checks.
        #[test]
        fn seal_retry_is_the_model(secret in any::<[u8; 32]>(),
                                   client in any_client(),
                                   odcid in proptest::collection::vec(any::<u8>(), 0..=21),
                                   issued in any::<u64>(),
                                   nonce in any::<[u8; 16]>(),
                                   room in 0usize..=MAX_RETRY_TOKEN + 2) {
            let (mut got, mut want) = ([0u8; MAX_RETRY_TOKEN + 2], [0u8; MAX_RETRY_TOKEN + 2]);
            let n = TokenKey::new(&secret).seal_retry(client, &odcid, issued, nonce, &mut got[..room]);
            let m = write_retry_plain(&mut want[..room], client, &odcid, issued)
                .and_then(|n| model::TokenKey::new(&secret).seal_plain(&mut want[..room], n, nonce));
            prop_assert_eq!(n, m);
            if let Some(n) = n {
                prop_assert_eq!(&got[..n], &want[..n]);
                let t = TokenKey::new(&secret).check(&got[..n], client, issued.saturating_sub(1));
                prop_assert_eq!(t, TokenCheck::Retry);
            }
        }
    }

    /// NIST SP 800-38D §7.2 step 8: a token whose tag differs in any one byte — each
    /// of the 16 positions, low and high bit — is refused, and so is one with any
    /// other byte changed (ciphertext: the tag no longer matches; nonce: another key).
    #[test]
    fn tampered_tokens_are_refused() {
        let k = TokenKey::new(&[7; 32]);
        let c: SocketAddr = "192.0.2.1:4433".parse().unwrap();
        for t in [k.seal(c, Some(&[1; 8]), 1000, [3; 16]).unwrap(), k.seal(c, None, 1000, [4; 16]).unwrap()] {
            assert!(k.check(&t, c, 1000).is_valid());
            let tag_at = t.len() - NONCE_LEN - TAG_LEN;
            for i in 0..t.len() {
                for bit in [0x01, 0x80] {
                    let mut bad = t.clone();
                    bad[i] ^= bit;
                    let what = match i {
                        _ if i < tag_at => format!("ciphertext byte {i}"),
                        _ if i < tag_at + TAG_LEN => format!("tag byte {}", i - tag_at),
                        _ => format!("nonce byte {}", i - tag_at - TAG_LEN),
                    };
                    assert_eq!(k.check(&bad, c, 1000), TokenCheck::Invalid, "{what} ^ {bit:#x}");
                }
            }
        }
    }

    /// A forgery that puts a token's cleartext where its ciphertext goes, under any
    /// tag, is refused: the payload is only read after the tag matched.
    #[test]
    fn cleartext_forgeries_are_refused() {
        let k = TokenKey::new(&[7; 32]);
        let c: SocketAddr = "192.0.2.1:4433".parse().unwrap();
        let retry =
            [&[0u8, 0, 192, 0, 2, 1][..], &4433u16.to_be_bytes(), &[8], &[1; 8], &1000u64.to_be_bytes()].concat();
        let validation = [&[1u8, 0, 192, 0, 2, 1][..], &1000u64.to_be_bytes()].concat();
        for (plain, kind) in [(retry, Some(&[1u8; 8][..])), (validation, None)] {
            // The layout is the real one: sealing it gives a token that checks.
            let real = k.seal(c, kind, 1000, [3; 16]).unwrap();
            assert_eq!(real.len(), plain.len() + TAG_LEN + NONCE_LEN);
            assert!(k.check(&real, c, 1000).is_valid());
            for tag in [[0u8; TAG_LEN], [0xff; TAG_LEN], real[plain.len()..plain.len() + TAG_LEN].try_into().unwrap()] {
                let forged = [&plain[..], &tag, &[3; 16]].concat();
                assert_eq!(k.check(&forged, c, 1000), TokenCheck::Invalid, "cleartext under tag {tag:02x?}");
            }
        }
    }

    #[test]
    fn retry_and_validation_tokens() {
        let k = TokenKey::new(&[7; 32]);
        let c: SocketAddr = "192.0.2.1:4433".parse().unwrap();
        let t = k.seal(c, Some(&[1; 8]), 1000, [3; 16]).unwrap();
        assert_eq!(k.check(&t, c, 1000), TokenCheck::Retry);
        assert_eq!(k.check(&t, c, 1015), TokenCheck::Retry);
        assert_eq!(k.check(&t, c, 1016), TokenCheck::Invalid, "expired");
        assert_eq!(k.check(&t, "192.0.2.1:4434".parse().unwrap(), 1000), TokenCheck::Invalid, "other port");
        assert_eq!(TokenKey::new(&[8; 32]).check(&t, c, 1000), TokenCheck::Invalid, "other key");
        let mut bad = t.clone();
        bad[3] ^= 1;
        assert_eq!(k.check(&bad, c, 1000), TokenCheck::Invalid, "tampered");
        assert_eq!(k.check(&[], c, 1000), TokenCheck::Invalid);
        let v = k.seal("[2001:db8::1]:1".parse().unwrap(), None, 1000, [4; 16]).unwrap();
        assert_eq!(k.check(&v, "[2001:db8::1]:9".parse().unwrap(), 1000 + VALIDATION_LIFETIME), TokenCheck::Validation);
        assert_eq!(k.check(&v, "[2001:db8::2]:9".parse().unwrap(), 1000), TokenCheck::Invalid);
    }
}
