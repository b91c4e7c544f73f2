//! QUIC-LB connection IDs (draft-ietf-quic-load-balancers-21): the IETF's format for
//! a server id carried in a CID, next to this project's own ADR 0001 format.
//!
//! ```text
//! CID = first octet | plaintext block, encrypted or not | optional bytes of the server's own
//! first octet    = config id (3 bits, 0..=6; 0b111 = unroutable) | length - 1 or random (5 bits)
//! plaintext block = server id (1..=15 bytes) | nonce (4..=18 bytes), 5..=19 bytes in all
//! ```
//!
//! A config ([`Config`]) fixes the config id, the two lengths, an optional 16-byte
//! AES-128 key and whether the first octet encodes the CID's length (§3.3). With no
//! key the block is plaintext; with a key and a 16-byte block it is one AES-128-ECB
//! block (§5.4.1); otherwise it goes through the four-pass Feistel network whose round
//! function is AES-128-ECB over `expand()` (§5.4.2). A load balancer decodes with three
//! passes when the server id fits in the left half, that is when the nonce is at least
//! as long as the server id (§5.5.2). [`ConfigSet`] holds the configs of the seven
//! config ids and decodes any CID; an unknown config id, the reserved 0b111 and a CID
//! too short for its config are unroutable (§4.1).
//!
//! Encoding and decoding allocate nothing and never panic, whatever the input.

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes128Enc};

/// Length of a config's AES-128 key (§5.3).
pub const KEY_LEN: usize = 16;
/// Shortest server id (§5.3: "at least 1 octet").
pub const MIN_SERVER_ID_LEN: usize = 1;
/// Shortest nonce (§5.3: "at least 4 octets").
pub const MIN_NONCE_LEN: usize = 4;
/// Longest server id and nonce together (§5.3: "19 octets or less").
pub const MAX_PLAINTEXT_LEN: usize = 19;
/// Longest server id: the longest block less the shortest nonce.
pub const MAX_SERVER_ID_LEN: usize = MAX_PLAINTEXT_LEN - MIN_NONCE_LEN;
/// Longest nonce: the longest block less the shortest server id.
pub const MAX_NONCE_LEN: usize = MAX_PLAINTEXT_LEN - MIN_SERVER_ID_LEN;
/// Longest connection ID of QUIC version 1 (RFC 9000 §17.2).
pub const MAX_CID_LEN: usize = 20;
/// The config id no config may use: a CID carrying it is always unroutable (§3.2).
pub const UNROUTABLE_CONFIG_ID: u8 = 0b111;
/// How many config ids a config may use (0..=6).
pub const CONFIG_IDS: usize = 7;

/// The AES block, and the plaintext length that selects single-pass encryption (§5.4.1).
const BLOCK_LEN: usize = 16;
/// The longest Feistel half: half of the longest block, rounded up (§5.4.2.2).
const MAX_HALF_LEN: usize = MAX_PLAINTEXT_LEN.div_ceil(2);
/// The five low bits of the first octet: length self-description or random (§3.4).
const LENGTH_BITS: u8 = 0x1f;

/// A config id, 0..=6: the three config rotation bits of the first octet (§3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigId(u8);

impl ConfigId {
    /// `None` for 0b111 (reserved: unroutable) and anything above.
    pub const fn new(id: u8) -> Option<ConfigId> {
        if id < UNROUTABLE_CONFIG_ID {
            Some(ConfigId(id))
        } else {
            None
        }
    }
    pub const fn get(self) -> u8 {
        self.0
    }
    /// The config id of a CID's first octet; `None` for the reserved 0b111 (§3.2).
    pub const fn of_first_octet(first_octet: u8) -> Option<ConfigId> {
        ConfigId::new(first_octet >> 5)
    }
    /// Every config id a config may use.
    pub fn all() -> impl Iterator<Item = ConfigId> {
        (0..UNROUTABLE_CONFIG_ID).map(ConfigId)
    }
}

/// A server id of 1..=15 bytes, as carried in a QUIC-LB CID (§5.1). Compared by its
/// bytes; no heap.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerId {
    len: u8,
    /// Bytes past `len` are always zero, so the derived comparisons see only the id.
    bytes: [u8; MAX_SERVER_ID_LEN],
}

impl ServerId {
    /// `None` unless `bytes` is 1..=15 bytes long.
    pub fn new(bytes: &[u8]) -> Option<ServerId> {
        if !(MIN_SERVER_ID_LEN..=MAX_SERVER_ID_LEN).contains(&bytes.len()) {
            return None;
        }
        let mut id = ServerId { len: bytes.len() as u8, bytes: [0; MAX_SERVER_ID_LEN] };
        id.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(id)
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerId({self})")
    }
}

impl std::fmt::Display for ServerId {
    /// Lower-case hex, as the draft writes server ids.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_bytes().iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// What a config says: everything a server and a load balancer must share (§5.3).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub config_id: ConfigId,
    /// 1..=15 bytes.
    pub server_id_len: u8,
    /// 4..=18 bytes, and at most 19 with the server id.
    pub nonce_len: u8,
    /// `None`: the plaintext algorithm (the server mapping is visible to observers).
    pub key: Option<[u8; KEY_LEN]>,
    /// The first octet's five low bits carry the CID length less one (§3.3); random
    /// bits otherwise.
    pub self_encoded_len: bool,
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Params")
            .field("config_id", &self.config_id.0)
            .field("server_id_len", &self.server_id_len)
            .field("nonce_len", &self.nonce_len)
            .field("keyed", &self.key.is_some())
            .field("self_encoded_len", &self.self_encoded_len)
            .finish()
    }
}

/// How a config hides the server id, chosen by the key and the lengths (§5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// No key: the server id is in clear.
    Plaintext,
    /// A key and a 16-byte block: one AES-128-ECB block (§5.4.1).
    SinglePass,
    /// A key and any other block length: four Feistel passes (§5.4.2).
    FourPass,
}

/// Why [`Params`] are not a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Outside 1..=15.
    ServerIdLength(u8),
    /// Outside 4..=18.
    NonceLength(u8),
    /// Server id and nonce longer than 19 bytes together.
    PlaintextLength(usize),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::ServerIdLength(n) => {
                write!(f, "server id length {n} is outside {MIN_SERVER_ID_LEN}..={MAX_SERVER_ID_LEN}")
            }
            ConfigError::NonceLength(n) => write!(f, "nonce length {n} is outside {MIN_NONCE_LEN}..={MAX_NONCE_LEN}"),
            ConfigError::PlaintextLength(n) => {
                write!(f, "server id and nonce are {n} bytes together, more than {MAX_PLAINTEXT_LEN}")
            }
        }
    }
}
impl std::error::Error for ConfigError {}

/// Why [`Config::encode`] wrote nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The server id is not the config's length.
    ServerIdLength { expected: u8, got: usize },
    /// The nonce is not the config's length.
    NonceLength { expected: u8, got: usize },
    /// The output is shorter than the config's CID or longer than 20 bytes.
    CidLength { min: usize, got: usize },
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EncodeError::ServerIdLength { expected, got } => {
                write!(f, "server id is {got} bytes, the config says {expected}")
            }
            EncodeError::NonceLength { expected, got } => write!(f, "nonce is {got} bytes, the config says {expected}"),
            EncodeError::CidLength { min, got } => write!(f, "CID of {got} bytes is outside {min}..={MAX_CID_LEN}"),
        }
    }
}
impl std::error::Error for EncodeError {}

/// The config's key schedule: decryption too for the single pass, encryption only for
/// the Feistel network (its round function only ever encrypts).
#[derive(Clone)]
enum Cipher {
    Plaintext,
    SinglePass(Box<Aes128>),
    FourPass(Box<Aes128Enc>),
}

/// One QUIC-LB config, its key schedule prepared once. Encodes and decodes CIDs of its
/// config id only.
#[derive(Clone)]
pub struct Config {
    params: Params,
    cipher: Cipher,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config").field("params", &self.params).field("algorithm", &self.algorithm()).finish()
    }
}

impl Config {
    /// Checks the lengths (§5.3) and prepares the key schedule.
    pub fn new(params: Params) -> Result<Config, ConfigError> {
        let (sid, nonce) = (usize::from(params.server_id_len), usize::from(params.nonce_len));
        if !(MIN_SERVER_ID_LEN..=MAX_SERVER_ID_LEN).contains(&sid) {
            return Err(ConfigError::ServerIdLength(params.server_id_len));
        }
        if !(MIN_NONCE_LEN..=MAX_NONCE_LEN).contains(&nonce) {
            return Err(ConfigError::NonceLength(params.nonce_len));
        }
        if sid + nonce > MAX_PLAINTEXT_LEN {
            return Err(ConfigError::PlaintextLength(sid + nonce));
        }
        let cipher = match params.key {
            None => Cipher::Plaintext,
            Some(key) if sid + nonce == BLOCK_LEN => Cipher::SinglePass(Box::new(Aes128::new(&key.into()))),
            Some(key) => Cipher::FourPass(Box::new(Aes128Enc::new(&key.into()))),
        };
        Ok(Config { params, cipher })
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn id(&self) -> ConfigId {
        self.params.config_id
    }

    pub fn server_id_len(&self) -> usize {
        usize::from(self.params.server_id_len)
    }

    pub fn nonce_len(&self) -> usize {
        usize::from(self.params.nonce_len)
    }

    pub fn algorithm(&self) -> Algorithm {
        match self.cipher {
            Cipher::Plaintext => Algorithm::Plaintext,
            Cipher::SinglePass(_) => Algorithm::SinglePass,
            Cipher::FourPass(_) => Algorithm::FourPass,
        }
    }

    /// Server id and nonce together: the length of the (encrypted) block.
    pub fn plaintext_len(&self) -> usize {
        self.server_id_len() + self.nonce_len()
    }

    /// The shortest CID of this config: the first octet and the block. Servers may
    /// append bytes of their own (§5.4).
    pub fn cid_len(&self) -> usize {
        1 + self.plaintext_len()
    }

    /// Whether the Feistel decode of a load balancer stops after three passes: the
    /// server id lies in the left half when the nonce is at least as long (§5.5.2).
    pub fn three_pass_decode(&self) -> bool {
        matches!(self.cipher, Cipher::FourPass(_)) && self.nonce_len() >= self.server_id_len()
    }

    /// Writes a CID for `server_id` with `nonce` into all of `cid`, whose length is the
    /// CID's: [`Config::cid_len`] up to 20 bytes (RFC 9000 §17.2). Bytes past the block
    /// are left as the caller put them (§5.4: the server's own, random bytes). The
    /// first octet is the config id and either the length less one or the low five
    /// bits of `random_bits` (§3.3). The caller supplies fresh nonces: random ones for a
    /// plaintext config, never repeated ones for a keyed one (§5.4, §9.6).
    pub fn encode(&self, server_id: &[u8], nonce: &[u8], random_bits: u8, cid: &mut [u8]) -> Result<(), EncodeError> {
        let (sid_len, nonce_len, plen) = (self.server_id_len(), self.nonce_len(), self.plaintext_len());
        if server_id.len() != sid_len {
            return Err(EncodeError::ServerIdLength { expected: self.params.server_id_len, got: server_id.len() });
        }
        if nonce.len() != nonce_len {
            return Err(EncodeError::NonceLength { expected: self.params.nonce_len, got: nonce.len() });
        }
        if !(self.cid_len()..=MAX_CID_LEN).contains(&cid.len()) {
            return Err(EncodeError::CidLength { min: self.cid_len(), got: cid.len() });
        }
        // cid.len() - 1 <= 19 fits the five length bits.
        let low_bits = if self.params.self_encoded_len { (cid.len() - 1) as u8 } else { random_bits & LENGTH_BITS };
        cid[0] = (self.params.config_id.0 << 5) | low_bits;
        let block = &mut cid[1..1 + plen];
        block[..sid_len].copy_from_slice(server_id);
        block[sid_len..].copy_from_slice(nonce);
        match &self.cipher {
            Cipher::Plaintext => {}
            Cipher::SinglePass(aes) => {
                let mut b = [0u8; BLOCK_LEN];
                b.copy_from_slice(block);
                aes.encrypt_block((&mut b).into());
                block.copy_from_slice(&b);
            }
            Cipher::FourPass(aes) => {
                let mut h = Halves::split(block);
                for pass in 1..=4 {
                    h.pass(aes, pass);
                }
                h.join(block);
            }
        }
        Ok(())
    }

    /// The server id of a CID of this config, as a load balancer reads it (§5.5):
    /// `None` if the CID is shorter than [`Config::cid_len`] or its first octet names
    /// another config id. Bytes past the block are ignored, so `cid` may be the rest
    /// of a short-header datagram.
    pub fn decode(&self, cid: &[u8]) -> Option<ServerId> {
        let block = self.block_of(cid)?;
        let sid_len = self.server_id_len();
        match &self.cipher {
            Cipher::Plaintext => ServerId::new(&block[..sid_len]),
            Cipher::SinglePass(aes) => {
                let mut b = [0u8; BLOCK_LEN];
                b.copy_from_slice(block);
                aes.decrypt_block((&mut b).into());
                ServerId::new(&b[..sid_len])
            }
            Cipher::FourPass(aes) => {
                let mut h = Halves::split(block);
                for pass in [4, 3, 2] {
                    h.pass(aes, pass);
                }
                if self.three_pass_decode() {
                    // sid_len < half_len, or == half_len with an even block: whole bytes of left_0.
                    return ServerId::new(&h.left[..sid_len]);
                }
                h.pass(aes, 1);
                let mut plain = [0u8; MAX_PLAINTEXT_LEN];
                h.join(&mut plain[..h.len]);
                ServerId::new(&plain[..sid_len])
            }
        }
    }

    /// The whole block, server id then nonce, of a CID of this config: all four passes,
    /// as the server that issued it would read it. `None` as for [`Config::decode`].
    pub fn decrypt<'a>(&self, cid: &[u8], out: &'a mut [u8; MAX_PLAINTEXT_LEN]) -> Option<&'a [u8]> {
        let block = self.block_of(cid)?;
        let plain = &mut out[..block.len()];
        match &self.cipher {
            Cipher::Plaintext => plain.copy_from_slice(block),
            Cipher::SinglePass(aes) => {
                let mut b = [0u8; BLOCK_LEN];
                b.copy_from_slice(block);
                aes.decrypt_block((&mut b).into());
                plain.copy_from_slice(&b);
            }
            Cipher::FourPass(aes) => {
                let mut h = Halves::split(block);
                for pass in (1..=4).rev() {
                    h.pass(aes, pass);
                }
                h.join(plain);
            }
        }
        Some(plain)
    }

    /// The block of `cid` (after the first octet), if `cid` is long enough and of this config.
    fn block_of<'c>(&self, cid: &'c [u8]) -> Option<&'c [u8]> {
        let first = *cid.first()?;
        if ConfigId::of_first_octet(first) != Some(self.params.config_id) {
            return None;
        }
        cid.get(1..self.cid_len())
    }
}

/// The two halves of the Feistel network (§5.4.2.2): `left` holds the first
/// `half_len` bytes of the block, `right` the last `half_len`; with an odd block length
/// the middle byte is split, its high nibble ending `left` (low nibble kept zero) and
/// its low nibble starting `right` (high nibble kept zero).
struct Halves {
    left: [u8; MAX_HALF_LEN],
    right: [u8; MAX_HALF_LEN],
    /// The block length, 5..=19.
    len: usize,
    half_len: usize,
    odd: bool,
}

impl Halves {
    /// Step 2 of §5.4.2.3 (and the split of the ciphertext in §5.5.2). `block` is 5..=19 bytes.
    fn split(block: &[u8]) -> Halves {
        let len = block.len();
        let half_len = len.div_ceil(2);
        let mut h = Halves { left: [0; MAX_HALF_LEN], right: [0; MAX_HALF_LEN], len, half_len, odd: len % 2 == 1 };
        h.left[..half_len].copy_from_slice(&block[..half_len]);
        h.right[..half_len].copy_from_slice(&block[len - half_len..]);
        h.clear_left_bits();
        h.clear_right_bits();
        h
    }

    /// Step 12 of §5.4.2.3: `out` (the block length) gets left then right, the middle
    /// byte of an odd block made of left's high nibble and right's low one.
    fn join(&self, out: &mut [u8]) {
        let half = self.half_len;
        out[..half].copy_from_slice(&self.left[..half]);
        if self.odd {
            out[half - 1] |= self.right[0];
            out[half..].copy_from_slice(&self.right[1..half]);
        } else {
            out[half..].copy_from_slice(&self.right[..half]);
        }
    }

    /// One pass of §5.4.2.3 (encryption runs 1, 2, 3, 4; decryption 4, 3, 2 and maybe
    /// 1): odd passes XOR right with AES(expand(left)), even passes XOR left with
    /// AES(expand(right)), and clear the half's spare nibble. Each pass is its own inverse.
    fn pass(&mut self, aes: &Aes128Enc, pass: u8) {
        let half = self.half_len;
        if pass % 2 == 1 {
            let mask = self.round(aes, pass, true);
            self.right[..half].iter_mut().zip(&mask).for_each(|(r, m)| *r ^= m);
            self.clear_right_bits();
        } else {
            let mask = self.round(aes, pass, false);
            self.left[..half].iter_mut().zip(&mask).for_each(|(l, m)| *l ^= m);
            self.clear_left_bits();
        }
    }

    /// AES-ECB(key, expand(len, pass, half)) (§5.4.2.2), of which the XOR uses the
    /// first `half_len` bytes: the half in the high bytes, zeros, then the block length
    /// and the pass number in the last two bytes.
    fn round(&self, aes: &Aes128Enc, pass: u8, from_left: bool) -> [u8; BLOCK_LEN] {
        let half = self.half_len;
        let src = if from_left { &self.left } else { &self.right };
        let mut b = [0u8; BLOCK_LEN];
        b[..half].copy_from_slice(&src[..half]);
        b[BLOCK_LEN - 2] = self.len as u8;
        b[BLOCK_LEN - 1] = pass;
        aes.encrypt_block((&mut b).into());
        b
    }

    /// With an odd length, left's last four bits are zero.
    fn clear_left_bits(&mut self) {
        if self.odd {
            self.left[self.half_len - 1] &= 0xf0;
        }
    }

    /// With an odd length, right's first four bits are zero.
    fn clear_right_bits(&mut self) {
        if self.odd {
            self.right[0] &= 0x0f;
        }
    }
}

/// Why a CID is unroutable for a [`ConfigSet`] (§4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unroutable {
    /// A zero-length CID: no first octet.
    Empty,
    /// Config id 0b111, which servers with no config use (§3.2).
    Marked,
    /// A config id the set holds no config for.
    UnknownConfig(ConfigId),
    /// Shorter than the config's CID.
    TooShort,
}

/// What a routable CID says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub config_id: ConfigId,
    pub server_id: ServerId,
}

/// The configs a load balancer knows, at most one per config id (§3.1: the config
/// rotation bits pick the config of each CID).
#[derive(Clone, Debug, Default)]
pub struct ConfigSet {
    configs: [Option<Config>; CONFIG_IDS],
}

impl ConfigSet {
    pub fn new() -> ConfigSet {
        ConfigSet::default()
    }

    /// Adds `config` under its config id; returns the config it replaces.
    pub fn insert(&mut self, config: Config) -> Option<Config> {
        let slot = &mut self.configs[usize::from(config.id().0)];
        slot.replace(config)
    }

    pub fn remove(&mut self, id: ConfigId) -> Option<Config> {
        self.configs[usize::from(id.0)].take()
    }

    pub fn get(&self, id: ConfigId) -> Option<&Config> {
        self.configs[usize::from(id.0)].as_ref()
    }

    /// The configs held, by config id.
    pub fn iter(&self) -> impl Iterator<Item = &Config> {
        self.configs.iter().flatten()
    }

    /// The config id and server id of `cid`, or why it is unroutable (§4.1). As
    /// [`Config::decode`], bytes past the config's CID length are ignored.
    pub fn decode(&self, cid: &[u8]) -> Result<Decoded, Unroutable> {
        let first = *cid.first().ok_or(Unroutable::Empty)?;
        let id = ConfigId::of_first_octet(first).ok_or(Unroutable::Marked)?;
        let config = self.get(id).ok_or(Unroutable::UnknownConfig(id))?;
        let server_id = config.decode(cid).ok_or(Unroutable::TooShort)?;
        Ok(Decoded { config_id: id, server_id })
    }

    /// The length of a short-header DCID that starts with `first_octet`, which the
    /// header does not carry (RFC 9000 §17.3): the self-encoded length (§3.3) if the
    /// config encodes it, else the config's CID length. `None` for 0b111, an unknown
    /// config id, or a self-encoded length too short for the config.
    pub fn dcid_len(&self, first_octet: u8) -> Option<usize> {
        let config = self.get(ConfigId::of_first_octet(first_octet)?)?;
        if !config.params.self_encoded_len {
            return Some(config.cid_len());
        }
        let len = usize::from(first_octet & LENGTH_BITS) + 1;
        (config.cid_len()..=MAX_CID_LEN).contains(&len).then_some(len)
    }
}

/// Makes `cid` the unroutable CID of a server with no config (§3.2): config id 0b111
/// and the self-encoded length, which is mandatory there. The caller fills `cid[1..]`
/// with random bytes (§3.2 recommends at least 8 bytes in all); `cid` is 1..=20 bytes.
pub fn write_unroutable(cid: &mut [u8]) -> Result<(), EncodeError> {
    if !(1..=MAX_CID_LEN).contains(&cid.len()) {
        return Err(EncodeError::CidLength { min: 1, got: cid.len() });
    }
    cid[0] = (UNROUTABLE_CONFIG_ID << 5) | (cid.len() - 1) as u8;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The worked example of §5.4.2.4 pass by pass. Appendix B's vectors, the models
    //! and the properties are in proto/tests/quic_lb.rs.
    use super::*;

    fn hex<const N: usize>(s: &str) -> [u8; N] {
        let v: Vec<u8> = (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect();
        v.try_into().unwrap()
    }

    fn example() -> Config {
        Config::new(Params {
            config_id: ConfigId::new(0).unwrap(),
            server_id_len: 3,
            nonce_len: 4,
            key: Some(hex("fdf726a9893ec05c0632d3956680baf0")),
            self_encoded_len: true,
        })
        .unwrap()
    }

    fn halves(h: &Halves) -> ([u8; 4], [u8; 4]) {
        (h.left[..4].try_into().unwrap(), h.right[..4].try_into().unwrap())
    }

    /// §5.4.2.4, step by step: the split, each pass's AES input and output, each half
    /// after its bits are cleared, and the CID. The draft's step 10 XORs with
    /// 0xb3e4357c although its AES output starts 0xb334357c; the result it prints,
    /// 0x67947d2c, is the XOR with the AES output (0xd4a04850 ^ 0xb3e4357c would be
    /// 0x67447d2c), and so is the CID of step 12: the typo is in the operand only.
    #[test]
    fn encryption_example_pass_by_pass() {
        let config = example();
        let Cipher::FourPass(aes) = &config.cipher else { panic!("3 + 4 bytes with a key is four-pass") };
        // Steps 1 and 2.
        let mut h = Halves::split(&hex::<7>("31441a9c69c275"));
        assert_eq!((h.len, h.half_len, h.odd), (7, 4, true));
        assert_eq!(halves(&h), (hex("31441a90"), hex("0c69c275")));
        // Steps 3 to 11: (pass, AES input, AES output, left after, right after).
        let passes: [(u8, &str, &str, &str, &str); 4] = [
            (1, "31441a90000000000000000000000701", "a255dd8cdacf01948d3a848c3c7fee23", "31441a90", "0e3c1ff9"),
            (2, "0e3c1ff9000000000000000000000702", "e5e452cb9e1bedb0b2bf830506bf4c4e", "d4a04850", "0e3c1ff9"),
            (3, "d4a04850000000000000000000000703", "b7821ab3024fed0913b6a04d18e3216f", "d4a04850", "09be054a"),
            (4, "09be054a000000000000000000000704", "b334357cfdf81e3fafe180154eaf7378", "67947d20", "09be054a"),
        ];
        for (pass, aes_in, aes_out, left, right) in passes {
            let mut expect_in = [0u8; 16];
            expect_in[..4].copy_from_slice(if pass % 2 == 1 { &h.left[..4] } else { &h.right[..4] });
            expect_in[14..].copy_from_slice(&[7, pass]);
            assert_eq!(expect_in, hex::<16>(aes_in), "expand() of pass {pass}");
            assert_eq!(h.round(aes, pass, pass % 2 == 1), hex::<16>(aes_out), "AES output of pass {pass}");
            h.pass(aes, pass);
            assert_eq!(halves(&h), (hex(left), hex(right)), "halves after pass {pass}");
        }
        // The unmasked XORs the draft prints before clearing bits (steps 4, 6, 10, 8).
        assert_eq!(0x0c69c275u32 ^ 0xa255dd8c, 0xae3c1ff9);
        assert_eq!(0x31441a90u32 ^ 0xe5e452cb, 0xd4a0485b);
        assert_eq!(0x0e3c1ff9u32 ^ 0xb7821ab3, 0xb9be054a);
        assert_eq!(0xd4a04850u32 ^ 0xb334357c, 0x67947d2c);
        // Step 12.
        let mut block = [0u8; 7];
        h.join(&mut block);
        assert_eq!(block, hex("67947d29be054a"));
        let mut cid = [0u8; 8];
        config.encode(&hex::<3>("31441a"), &hex::<4>("9c69c275"), 0, &mut cid).unwrap();
        assert_eq!(cid, hex("0767947d29be054a"));
    }

    /// §5.5.2 on the same example: passes 4, 3, 2 give back left_1, right_1, left_0;
    /// the server id (3 bytes) lies in left_0 (the nonce is longer), so three passes do.
    #[test]
    fn load_balancer_decode_of_the_example_takes_three_passes() {
        let config = example();
        assert!(config.three_pass_decode());
        let Cipher::FourPass(aes) = &config.cipher else { panic!() };
        let mut h = Halves::split(&hex::<7>("67947d29be054a"));
        assert_eq!(halves(&h), (hex("67947d20"), hex("09be054a")));
        h.pass(aes, 4);
        assert_eq!(halves(&h), (hex("d4a04850"), hex("09be054a")), "left_1");
        h.pass(aes, 3);
        assert_eq!(halves(&h), (hex("d4a04850"), hex("0e3c1ff9")), "right_1");
        h.pass(aes, 2);
        assert_eq!(halves(&h), (hex("31441a90"), hex("0e3c1ff9")), "left_0");
        assert_eq!(config.decode(&hex::<8>("0767947d29be054a")), ServerId::new(&hex::<3>("31441a")));
    }

    /// §5.4.2.3 step 2's own example of the split, and its inverse.
    #[test]
    fn split_and_join_of_an_odd_block() {
        let h = Halves::split(&hex::<7>("7040b81b55ccf3"));
        assert_eq!(halves(&h), (hex("7040b810"), hex("0b55ccf3")));
        let mut back = [0u8; 7];
        h.join(&mut back);
        assert_eq!(back, hex("7040b81b55ccf3"));
        let even = Halves::split(&hex::<8>("0011223344556677"));
        assert_eq!(halves(&even), (hex("00112233"), hex("44556677")));
    }

    /// §5.4.2.2's examples of expand() and truncate(): expand(0x06, 0x02, 0xaaba3c).
    #[test]
    fn expand_example() {
        // A block of 6 bytes: halves of 3.
        let h = Halves::split(&hex::<6>("aaba3c000000"));
        let mut expanded = [0u8; 16];
        expanded[..3].copy_from_slice(&h.left[..3]);
        expanded[14..].copy_from_slice(&[h.len as u8, 2]);
        assert_eq!(expanded, hex("aaba3c00000000000000000000000602"));
        // round() builds the same input: it encrypts to AES(expanded).
        let aes = Aes128Enc::new(&[9u8; 16].into());
        let mut want = expanded;
        aes.encrypt_block((&mut want).into());
        assert_eq!(h.round(&aes, 2, true), want);
    }
}
