//! The CID format of a key generation (docs/adr/0007-quic-lb.md): this project's own
//! ADR 0001 format (`adr1`, the default) or QUIC-LB (draft-ietf-quic-load-balancers-21,
//! [`crate::quic_lb`]) with its config.
//!
//! A QUIC-LB generation is constrained so that both formats share what the data plane
//! and quinn rely on:
//! - **The generation in the first two bits.** The config id is `2 × generation` or
//!   `2 × generation + 1`: its top two bits are the generation, where ADR 0001 puts its
//!   `cr` bits, so the first octet still names the generation (and its format), and
//!   `0b11…` stays unroutable in both (config ids 6 and 7 are never used).
//! - **12 bytes.** Short headers carry no DCID length (RFC 9000 §17.3) and a quinn
//!   endpoint's CIDs have one length, so a QUIC-LB CID is [`CID_LEN`] bytes like an
//!   ADR 0001 one: server-id length + nonce length = 11.
//! - **A 16-bit server id** (ADR 0001): the server-id length is at least 2; the id
//!   is big-endian in its last two bytes, the bytes before it zero.
//!
//! Text forms. In the key file (`crate::keyfile`, version 4), after a generation's
//! secret: `adr1`, or `quic-lb config=C server-id=S nonce=N key=none|<32 hex>
//! length=self|random`. As the format new generations take ([`FormatSpec`], the
//! controller's `cid-format` setting): `adr1`, or `quic-lb server-id=S nonce=N
//! key=none|generate|<32 hex> length=self|random` — the config id follows the
//! generation; `key=generate` takes a fresh key from the new generation's random
//! secret; `nonce` defaults to `11 - server-id`, `key` to `none`, `length` to `random`.
//!
//! A rotation without a new setting keeps the newest generation's format
//! ([`FormatSpec::kept`]): the same config in the new generation's config id, and a
//! fresh key when the newest's key is its own secret's first 16 bytes (it was
//! generated).

use crate::cid::{Generation, CID_LEN};
use crate::quic_lb::{self, ConfigId, Params};

/// Server-id length + nonce length of every QUIC-LB generation: 12-byte CIDs.
pub const QUIC_LB_PLAINTEXT_LEN: usize = CID_LEN - 1;
/// The shortest server id: ADR 0001 server ids are 16 bits.
pub const MIN_SERVER_ID_LEN: u8 = 2;

/// How the CIDs of one key generation are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CidFormat {
    /// ADR 0001 (`proto::cid`).
    #[default]
    Adr1,
    /// QUIC-LB, with its config ([`CidFormat::check`] holds).
    QuicLb(Params),
}

/// Why a format does not fit a generation, or its text does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidFormatError(pub String);

impl std::fmt::Display for CidFormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for CidFormatError {}

fn bad(what: impl Into<String>) -> CidFormatError {
    CidFormatError(what.into())
}

/// The config ids a generation's QUIC-LB config may use: its top two bits are the
/// generation (module docs).
pub fn config_ids_of(generation: Generation) -> [ConfigId; 2] {
    let g = generation.get() << 1;
    // A generation is 0..=2, so these are 0..=5: valid config ids.
    let id = |c: u8| ConfigId::new(c).expect("config ids 0..=5 are valid");
    [id(g), id(g | 1)]
}

impl CidFormat {
    /// The format's name: `adr1` or `quic-lb`.
    pub fn name(&self) -> &'static str {
        match self {
            CidFormat::Adr1 => "adr1",
            CidFormat::QuicLb(_) => "quic-lb",
        }
    }

    /// Whether this format may be generation `generation`'s (module docs): a QUIC-LB
    /// config with a config id of that generation, 12-byte CIDs, a server id of at
    /// least 2 bytes, and lengths draft-21 allows.
    pub fn check(&self, generation: Generation) -> Result<(), CidFormatError> {
        let CidFormat::QuicLb(p) = self else { return Ok(()) };
        if !config_ids_of(generation).contains(&p.config_id) {
            let [a, b] = config_ids_of(generation);
            return Err(bad(format!(
                "quic-lb config id {} cannot be generation {}'s: its top two bits must be the generation (config {} \
                 or {})",
                p.config_id.get(),
                generation.get(),
                a.get(),
                b.get()
            )));
        }
        if p.server_id_len < MIN_SERVER_ID_LEN {
            return Err(bad(format!(
                "quic-lb server-id={}: server ids are 16 bits, at least {MIN_SERVER_ID_LEN} bytes",
                p.server_id_len
            )));
        }
        if usize::from(p.server_id_len) + usize::from(p.nonce_len) != QUIC_LB_PLAINTEXT_LEN {
            return Err(bad(format!(
                "quic-lb server-id={} nonce={}: the two must add up to {QUIC_LB_PLAINTEXT_LEN} (12-byte CIDs)",
                p.server_id_len, p.nonce_len
            )));
        }
        quic_lb::Config::new(*p).map_err(|e| bad(format!("quic-lb: {e}")))?;
        Ok(())
    }

    /// What status and logs show: the key-file text with `key=<32 hex>` replaced by
    /// `key=set` (never key material).
    pub fn describe(&self) -> String {
        match self {
            CidFormat::QuicLb(p) if p.key.is_some() => {
                CidFormat::QuicLb(Params { key: None, ..*p }).to_text().replace("key=none", "key=set")
            }
            _ => self.to_text(),
        }
    }

    /// The key-file text (module docs).
    pub fn to_text(&self) -> String {
        match self {
            CidFormat::Adr1 => "adr1".into(),
            CidFormat::QuicLb(p) => format!(
                "quic-lb config={} server-id={} nonce={} key={} length={}",
                p.config_id.get(),
                p.server_id_len,
                p.nonce_len,
                p.key.map_or_else(|| "none".to_owned(), |k| to_hex(&k)),
                if p.self_encoded_len { "self" } else { "random" }
            ),
        }
    }

    /// Parses the key-file text of generation `generation`'s format (split at
    /// whitespace) and checks it ([`CidFormat::check`]).
    pub fn parse(fields: &[&str], generation: Generation) -> Result<CidFormat, CidFormatError> {
        let f = match parse_fields(fields, Where::KeyFile)? {
            Parsed::Adr1 => CidFormat::Adr1,
            Parsed::QuicLb { config_id, server_id_len, nonce_len, key, self_encoded_len } => {
                let key = match key {
                    KeySpec::None => None,
                    KeySpec::Fixed(k) => Some(k),
                    KeySpec::Generate => return Err(bad("quic-lb key=generate: a key file names the key itself")),
                };
                CidFormat::QuicLb(Params {
                    config_id: config_id.ok_or_else(|| bad("quic-lb: missing config=<0..=5>"))?,
                    server_id_len,
                    nonce_len,
                    key,
                    self_encoded_len,
                })
            }
        };
        f.check(generation)?;
        Ok(f)
    }

    /// The server id's bytes in a QUIC-LB CID of `p` (module docs): `id` big-endian
    /// in the last two, zeros before.
    pub fn server_id_bytes(p: &Params, id: crate::cid::ServerId) -> ([u8; quic_lb::MAX_SERVER_ID_LEN], usize) {
        let mut b = [0u8; quic_lb::MAX_SERVER_ID_LEN];
        let n = usize::from(p.server_id_len).clamp(2, quic_lb::MAX_SERVER_ID_LEN);
        b[n - 2..n].copy_from_slice(&id.0.to_be_bytes());
        (b, n)
    }
}

/// The format new key generations take (module docs): a [`CidFormat`] without its
/// config id and, with `key=generate`, without its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FormatSpec {
    #[default]
    Adr1,
    QuicLb {
        server_id_len: u8,
        nonce_len: u8,
        key: KeySpec,
        self_encoded_len: bool,
    },
}

/// Where a QUIC-LB generation's key comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KeySpec {
    /// Plaintext: observers see the server id (draft-21 §5.2).
    None,
    /// This key for every generation (an external load balancer configured with it).
    Fixed([u8; quic_lb::KEY_LEN]),
    /// The first 16 bytes of each new generation's random secret.
    Generate,
}

impl std::fmt::Debug for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeySpec::None => "None",
            KeySpec::Fixed(_) => "Fixed(<key>)",
            KeySpec::Generate => "Generate",
        })
    }
}

impl FormatSpec {
    /// The spec that keeps generation `format`'s format (module docs); `secret` is
    /// that generation's secret.
    pub fn kept(format: &CidFormat, secret: &[u8; 32]) -> FormatSpec {
        let CidFormat::QuicLb(p) = format else { return FormatSpec::Adr1 };
        let key = match p.key {
            None => KeySpec::None,
            Some(k) if k[..] == secret[..quic_lb::KEY_LEN] => KeySpec::Generate,
            Some(k) => KeySpec::Fixed(k),
        };
        FormatSpec::QuicLb {
            server_id_len: p.server_id_len,
            nonce_len: p.nonce_len,
            key,
            self_encoded_len: p.self_encoded_len,
        }
    }

    /// Generation `generation`'s format, its config id `2 × generation`; `secret` is
    /// the generation's fresh random secret (the key of `key=generate`).
    pub fn for_generation(&self, generation: Generation, secret: &[u8; 32]) -> Result<CidFormat, CidFormatError> {
        let FormatSpec::QuicLb { server_id_len, nonce_len, key, self_encoded_len } = *self else {
            return Ok(CidFormat::Adr1);
        };
        let key = match key {
            KeySpec::None => None,
            KeySpec::Fixed(k) => Some(k),
            KeySpec::Generate => {
                let mut k = [0u8; quic_lb::KEY_LEN];
                k.copy_from_slice(&secret[..quic_lb::KEY_LEN]);
                Some(k)
            }
        };
        let [config_id, _] = config_ids_of(generation);
        let f = CidFormat::QuicLb(Params { config_id, server_id_len, nonce_len, key, self_encoded_len });
        f.check(generation)?;
        Ok(f)
    }
}

impl std::fmt::Display for FormatSpec {
    /// The setting's text (module docs), which [`FormatSpec::from_str`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatSpec::Adr1 => f.write_str("adr1"),
            FormatSpec::QuicLb { server_id_len, nonce_len, key, self_encoded_len } => write!(
                f,
                "quic-lb server-id={server_id_len} nonce={nonce_len} key={} length={}",
                match key {
                    KeySpec::None => "none".to_owned(),
                    KeySpec::Generate => "generate".to_owned(),
                    KeySpec::Fixed(k) => to_hex(k),
                },
                if *self_encoded_len { "self" } else { "random" }
            ),
        }
    }
}

impl std::str::FromStr for FormatSpec {
    type Err = CidFormatError;
    /// The setting's text (module docs), checked against generation 0.
    fn from_str(s: &str) -> Result<FormatSpec, CidFormatError> {
        let fields: Vec<&str> = s.split_whitespace().collect();
        let spec = match parse_fields(&fields, Where::Spec)? {
            Parsed::Adr1 => FormatSpec::Adr1,
            Parsed::QuicLb { config_id: _, server_id_len, nonce_len, key, self_encoded_len } => {
                FormatSpec::QuicLb { server_id_len, nonce_len, key, self_encoded_len }
            }
        };
        spec.for_generation(Generation::ZERO, &[0; 32])?;
        Ok(spec)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Where {
    KeyFile,
    Spec,
}

enum Parsed {
    Adr1,
    QuicLb { config_id: Option<ConfigId>, server_id_len: u8, nonce_len: u8, key: KeySpec, self_encoded_len: bool },
}

fn parse_fields(fields: &[&str], at: Where) -> Result<Parsed, CidFormatError> {
    match fields.first() {
        Some(&"adr1") if fields.len() == 1 => return Ok(Parsed::Adr1),
        Some(&"adr1") => return Err(bad("'adr1' takes no settings")),
        Some(&"quic-lb") => {}
        Some(other) => return Err(bad(format!("unknown CID format '{other}' (expected 'adr1' or 'quic-lb')"))),
        None => return Err(bad("missing CID format (expected 'adr1' or 'quic-lb')")),
    }
    let (mut config_id, mut sid, mut nonce, mut key, mut len) = (None, None, None, None, None);
    for f in &fields[1..] {
        let Some((k, v)) = f.split_once('=') else {
            return Err(bad(format!("quic-lb setting '{f}' is not name=value")));
        };
        let twice = |seen: bool| if seen { Err(bad(format!("quic-lb '{k}' given twice"))) } else { Ok(()) };
        let number = |max: u8| {
            v.parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| bad(format!("quic-lb {k}={v}: expected a number 0..={max}")))
        };
        match k {
            "config" if at == Where::KeyFile => {
                twice(config_id.is_some())?;
                let id = number(5)?;
                config_id = ConfigId::new(id);
            }
            "server-id" => {
                twice(sid.is_some())?;
                sid = Some(number(quic_lb::MAX_SERVER_ID_LEN as u8)?);
            }
            "nonce" => {
                twice(nonce.is_some())?;
                nonce = Some(number(quic_lb::MAX_NONCE_LEN as u8)?);
            }
            "key" => {
                twice(key.is_some())?;
                key = Some(match v {
                    "none" => KeySpec::None,
                    "generate" if at == Where::Spec => KeySpec::Generate,
                    hex => KeySpec::Fixed(from_hex(hex).ok_or_else(|| {
                        bad(format!(
                            "quic-lb key: expected 'none'{} or 32 hex digits",
                            if at == Where::Spec { ", 'generate'" } else { "" }
                        ))
                    })?),
                });
            }
            "length" => {
                twice(len.is_some())?;
                len = Some(match v {
                    "self" => true,
                    "random" => false,
                    _ => return Err(bad(format!("quic-lb length={v}: expected 'self' or 'random'"))),
                });
            }
            _ => {
                let names = if at == Where::KeyFile {
                    "config, server-id, nonce, key, length"
                } else {
                    "server-id, nonce, key, length (the config id follows the generation)"
                };
                return Err(bad(format!("unknown quic-lb setting '{k}' (expected {names})")));
            }
        }
    }
    let server_id_len = sid.ok_or_else(|| bad("quic-lb: missing server-id=<bytes>"))?;
    let nonce_len = match (nonce, at) {
        (Some(n), _) => n,
        (None, Where::Spec) => (QUIC_LB_PLAINTEXT_LEN as u8).saturating_sub(server_id_len),
        (None, Where::KeyFile) => return Err(bad("quic-lb: missing nonce=<bytes>")),
    };
    let (key, self_encoded_len) = match at {
        Where::Spec => (key.unwrap_or(KeySpec::None), len.unwrap_or(false)),
        Where::KeyFile => (
            key.ok_or_else(|| bad("quic-lb: missing key=none|<32 hex>"))?,
            len.ok_or_else(|| bad("quic-lb: missing length=self|random"))?,
        ),
    };
    Ok(Parsed::QuicLb { config_id, server_id_len, nonce_len, key, self_encoded_len })
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&b[2 * i..2 * i + 2]).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(n: u8) -> Generation {
        Generation::new(n).expect("0..=2")
    }

    #[test]
    fn config_ids_follow_the_generation() {
        for n in 0..=2u8 {
            let ids = config_ids_of(g(n)).map(|c| c.get());
            assert_eq!(ids, [2 * n, 2 * n + 1]);
            // Their top two bits (of the first octet) are ADR 0001's cr bits.
            assert!(ids.iter().all(|id| (id << 5) >> 6 == n));
        }
    }

    #[test]
    fn spec_text_and_errors() {
        let s: FormatSpec = "quic-lb server-id=3 key=generate length=self".parse().expect("valid");
        assert_eq!(
            s,
            FormatSpec::QuicLb { server_id_len: 3, nonce_len: 8, key: KeySpec::Generate, self_encoded_len: true }
        );
        assert_eq!("adr1".parse::<FormatSpec>(), Ok(FormatSpec::Adr1));
        let f = s.for_generation(g(2), &[0xab; 32]).expect("fits");
        let CidFormat::QuicLb(p) = f else { panic!("quic-lb") };
        assert_eq!((p.config_id.get(), p.key), (4, Some([0xab; 16])));
        assert_eq!(f.describe(), "quic-lb config=4 server-id=3 nonce=8 key=set length=self");
        assert!(f.to_text().contains(&"ab".repeat(16)));
        let cases = [
            ("", "missing CID format"),
            ("adr2", "unknown CID format 'adr2'"),
            ("adr1 server-id=2", "'adr1' takes no settings"),
            ("quic-lb", "missing server-id"),
            ("quic-lb server-id=1", "server ids are 16 bits"),
            ("quic-lb server-id=2 nonce=8", "must add up to 11"),
            ("quic-lb server-id=8", "nonce length 3"),
            ("quic-lb server-id=2 server-id=2", "'server-id' given twice"),
            ("quic-lb server-id=2 config=0", "unknown quic-lb setting 'config'"),
            ("quic-lb server-id=2 key=00", "32 hex digits"),
            ("quic-lb server-id=2 length=fixed", "expected 'self' or 'random'"),
            ("quic-lb server-id", "not name=value"),
            ("quic-lb server-id=x", "expected a number"),
        ];
        for (text, want) in cases {
            let e = text.parse::<FormatSpec>().expect_err(text);
            assert!(e.0.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn key_file_text_errors() {
        let parse = |t: &str, n| CidFormat::parse(&t.split_whitespace().collect::<Vec<_>>(), g(n));
        let ok = "quic-lb config=3 server-id=2 nonce=9 key=none length=random";
        assert!(parse(ok, 1).is_ok());
        let e = parse(ok, 2).expect_err("config 3 is generation 1's");
        assert!(e.0.contains("config 4 or 5"), "{e}");
        for (t, want) in [
            ("quic-lb server-id=2 nonce=9 key=none length=random", "missing config"),
            ("quic-lb config=2 server-id=2 key=none length=random", "missing nonce"),
            ("quic-lb config=2 server-id=2 nonce=9 length=random", "missing key"),
            ("quic-lb config=2 server-id=2 nonce=9 key=none", "missing length"),
            ("quic-lb config=2 server-id=2 nonce=9 key=generate length=self", "32 hex digits"),
            ("quic-lb config=6 server-id=2 nonce=9 key=none length=self", "0..=5"),
        ] {
            let e = parse(t, 1).expect_err(t);
            assert!(e.0.contains(want), "{t}: {e}");
        }
    }

    fn arb_format(generation: Generation) -> impl Strategy<Value = CidFormat> {
        prop_oneof![
            Just(CidFormat::Adr1),
            (2u8..=7, any::<bool>(), any::<Option<[u8; 16]>>(), any::<bool>()).prop_map(move |(sid, low, key, sel)| {
                let [a, b] = config_ids_of(generation);
                CidFormat::QuicLb(Params {
                    config_id: if low { b } else { a },
                    server_id_len: sid,
                    nonce_len: 11 - sid,
                    key,
                    self_encoded_len: sel,
                })
            }),
        ]
    }

    proptest! {
        /// Every valid format's text parses back to it.
        #[test]
        fn text_round_trip(n in 0u8..=2, f in (0u8..=2).prop_flat_map(|n| arb_format(g(n)))) {
            let _ = n;
            let generation = match f {
                CidFormat::QuicLb(p) => g(p.config_id.get() >> 1),
                CidFormat::Adr1 => g(n),
            };
            let text = f.to_text();
            let fields: Vec<&str> = text.split_whitespace().collect();
            prop_assert_eq!(CidFormat::parse(&fields, generation), Ok(f));
        }

        /// A spec's text reads back to it; keeping a generation's format gives the
        /// spec it was made with, so rotations keep it (a generated key stays generated).
        #[test]
        fn spec_text_and_kept(sid in 2u8..=7, key in prop_oneof![Just(KeySpec::None), Just(KeySpec::Generate), any::<[u8; 16]>().prop_map(KeySpec::Fixed)], sel: bool, n in 0u8..=2, secret: [u8; 32]) {
            let spec = FormatSpec::QuicLb { server_id_len: sid, nonce_len: 11 - sid, key, self_encoded_len: sel };
            prop_assert_eq!(spec.to_string().parse::<FormatSpec>(), Ok(spec));
            let f = spec.for_generation(g(n), &secret).expect("fits");
            // A fixed key equal to the secret's prefix is indistinguishable from a generated one.
            prop_assume!(key != KeySpec::Fixed(secret[..16].try_into().expect("16")));
            prop_assert_eq!(FormatSpec::kept(&f, &secret), spec);
            prop_assert_eq!(FormatSpec::kept(&CidFormat::Adr1, &secret), FormatSpec::Adr1);
        }

        /// The server id sits big-endian in the last two bytes of the server-id field.
        #[test]
        fn server_id_bytes_model(sid in 2u8..=7, id: u16) {
            let p = Params { config_id: config_ids_of(g(0))[0], server_id_len: sid, nonce_len: 11 - sid, key: None, self_encoded_len: false };
            let (b, n) = CidFormat::server_id_bytes(&p, crate::cid::ServerId(id));
            prop_assert_eq!(n, usize::from(sid));
            let value = b[..n].iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
            prop_assert_eq!(value, u64::from(id));
        }
    }
}
