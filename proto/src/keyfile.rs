//! The key file: every secret the instances share, as kept by the controller in its
//! state directory (mode 0600) and read by standalone demux/worker/udpflood runs.
//!
//! ```text
//! quicdemux-keys 4
//! newest 1 siphash-2-4 <64 hex> quic-lb config=2 server-id=2 nonce=9 key=none length=self
//!                                   # generation 0..=2, its PRF (ADR 0004), its 32-byte CID key,
//!                                   # its CID format (version 4: ADR 0007)
//! previous 0 hmac-sha256 <64 hex> adr1  # optional: the generation still decodable
//! reset <64 hex digits>             # stateless-reset key, identical on every instance
//! token <64 hex digits>             # Retry/NEW_TOKEN key, identical on every instance
//! rendezvous <32 hex digits>        # placement hash key of the demux
//! forwarding <64 hex digits>        # cluster forwarding secret: frames are sealed with it
//! forwarding-other <64 hex digits>  # optional: also accepted (staged next, or previous)
//! ```
//! PRF names: `hmac-sha256`, `siphash-2-4`. Blank lines and lines starting with `#`
//! are ignored. Parsing is strict: every required line exactly once, the field count
//! of the file's version, no unknown keywords or PRF names. [`KeyFile::to_text`]
//! writes version 3 while every generation is `adr1`, so such a file stays readable by
//! a build that knows no CID format, and version 4 once a generation is `quic-lb`,
//! which such a build refuses at line 1 (docs/wire.md "Versions"). How each version
//! reads:
//!
//! - **4**: as above; each generation line ends with its CID format
//!   ([`crate::cid_format`]: `adr1`, or `quic-lb` and its config; the PRF and secret
//!   stay, used by `adr1` only).
//! - **3**: no CID format: every generation is `adr1`; `forwarding` is required.
//! - **2**: no `forwarding` lines (they are refused). The forwarding secret is
//!   derived from the rendezvous key: HMAC-SHA-256(rendezvous key, [`V2_FORWARDING_LABEL`]).
//!   Every host reading the same version 2 file derives the same secret, and the
//!   rendezvous key, like the forwarding secret, never leaves the controller and the
//!   data plane (ADR 0005 §4), so an upgraded cluster keeps forwarding.
//! - **1**: as 2, and the generations have no PRF field (`newest 1 <64 hex>`): they
//!   are `hmac-sha256` (ADR 0004).
//!
//! Workers get only [`KeyFile::assign`]'s contents: the CID keys, the reset key and
//! the token key. The forwarding secret and the rendezvous key stay in the data plane
//! (ADR 0005 §4: a worker must not be able to forge host-to-host frames).

use crate::cid::{Generation, KeySet, KeySetError, Prf, ServerId, KEY_LEN};
use crate::cid_format::{CidFormat, CidFormatError, FormatSpec};
use crate::wire::{KeyGen, Keys, Registration};

/// Random bytes [`KeyFile::generate`] takes: the generation-0 CID key, the reset key
/// and the token key (32 bytes each), the 16-byte rendezvous key, then the 32-byte
/// forwarding secret.
pub const RANDOM_LEN: usize = KEY_LEN + 32 + 32 + 16 + 32;

const MAGIC: &str = "quicdemux-keys";
/// The version [`KeyFile::to_text`] writes while every generation is `adr1`.
const VERSION_ADR1: u8 = 3;
/// The version [`KeyFile::to_text`] writes once a generation has another format.
const VERSION: u8 = 4;
/// The label a version 1 or 2 file's forwarding secret is derived with.
pub const V2_FORWARDING_LABEL: &[u8] = b"quicdemux forwarding secret of a version 2 key file";

/// All shared secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFile {
    pub keys: Keys,
    pub reset_key: [u8; 32],
    pub token_key: [u8; 32],
    pub rendezvous_key: [u8; 16],
    /// The cluster forwarding secret host-to-host frames are sealed with
    /// (proto::peer, ADR 0005 §4). Never sent to a worker.
    pub forwarding: [u8; 32],
    /// The other accepted forwarding secret: the staged next one while a generation
    /// is staged ([`KeyFile::is_staged`]), else the previous one (or none).
    pub forwarding_other: Option<[u8; 32]>,
}

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFile").field("keys", &self.keys).finish_non_exhaustive()
    }
}

/// Why a key file is not valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFileError {
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "key file line {}: {}", self.line, self.what)
    }
}
impl std::error::Error for KeyFileError {}

fn err(line: usize, what: impl Into<String>) -> KeyFileError {
    KeyFileError { line, what: what.into() }
}

fn hex<const N: usize>(s: &str, line: usize) -> Result<[u8; N], KeyFileError> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return Err(err(line, format!("expected {} hex digits, found {}", 2 * N, b.len())));
    }
    let nib = |c: u8| -> Result<u8, KeyFileError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(err(line, "not a hex digit")),
        }
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nib(b[2 * i])? << 4) | nib(b[2 * i + 1])?;
    }
    Ok(out)
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl KeyFile {
    /// A fresh key file from `random` bytes (the caller draws them from the OS); its
    /// one generation (0) uses `prf`.
    pub fn generate(random: &[u8; RANDOM_LEN], prf: Prf) -> KeyFile {
        let mut k = [0u8; KEY_LEN];
        k.copy_from_slice(&random[..32]);
        let mut reset_key = [0u8; 32];
        reset_key.copy_from_slice(&random[32..64]);
        let mut token_key = [0u8; 32];
        token_key.copy_from_slice(&random[64..96]);
        let mut rendezvous_key = [0u8; 16];
        rendezvous_key.copy_from_slice(&random[96..112]);
        let mut forwarding = [0u8; 32];
        forwarding.copy_from_slice(&random[112..144]);
        KeyFile {
            keys: Keys {
                newest: KeyGen { generation: Generation::ZERO, prf, secret: k, format: CidFormat::Adr1 },
                previous: None,
            },
            reset_key,
            token_key,
            rendezvous_key,
            forwarding,
            forwarding_other: None,
        }
    }

    /// What the controller sends a worker (`Assign`, docs/wire.md): the CID keys, the
    /// reset key and the token key. Nothing else of this file reaches a worker.
    pub fn assign(&self, server_id: ServerId) -> Registration {
        Registration::Assign {
            server_id,
            keys: self.keys.clone(),
            reset_key: self.reset_key,
            token_key: self.token_key,
        }
    }

    /// The forwarding secrets a receiver accepts: the current one first.
    pub fn forwarding_secrets(&self) -> impl Iterator<Item = &[u8; 32]> {
        std::iter::once(&self.forwarding).chain(self.forwarding_other.as_ref())
    }

    /// Two-phase rotation, first phase (ADR 0005 §3): `fresh` becomes the next
    /// generation, decodable but not issued: it takes the `previous` line (whose old
    /// generation is dropped), and `newest` — the generation new CIDs use — stays.
    /// Likewise `fresh_forwarding` becomes the accepted other forwarding secret while
    /// frames are still sealed with the current one.
    pub fn staged(&self, fresh: [u8; KEY_LEN], fresh_forwarding: [u8; 32], prf: Prf) -> KeyFile {
        let next =
            KeyGen { generation: self.keys.newest.generation.next(), prf, secret: fresh, format: CidFormat::Adr1 };
        self.staged_gen(next, fresh_forwarding)
    }

    /// [`KeyFile::staged`], the staged generation in the CID format `spec` gives it
    /// (docs/adr/0007-quic-lb.md).
    pub fn staged_as(
        &self,
        fresh: [u8; KEY_LEN],
        fresh_forwarding: [u8; 32],
        prf: Prf,
        spec: &FormatSpec,
    ) -> Result<KeyFile, CidFormatError> {
        Ok(self.staged_gen(self.next_generation(fresh, prf, spec)?, fresh_forwarding))
    }

    fn staged_gen(&self, next: KeyGen, fresh_forwarding: [u8; 32]) -> KeyFile {
        KeyFile {
            keys: Keys { newest: self.keys.newest, previous: Some(next) },
            forwarding_other: Some(fresh_forwarding),
            ..self.clone()
        }
    }

    /// The generation after the newest, in the format `spec` gives it.
    fn next_generation(&self, fresh: [u8; KEY_LEN], prf: Prf, spec: &FormatSpec) -> Result<KeyGen, CidFormatError> {
        let generation = self.keys.newest.generation.next();
        Ok(KeyGen { generation, prf, secret: fresh, format: spec.for_generation(generation, &fresh)? })
    }

    /// Stages the generation `other` (another host's key file) staged, so every host
    /// of a cluster decodes the same new key and accepts the same next forwarding
    /// secret: `other` must be staged, issue the same newest generation as this file,
    /// and hold the same shared secrets (the current forwarding secret included).
    pub fn staged_from(&self, other: &KeyFile) -> Result<KeyFile, String> {
        if !other.is_staged() {
            return Err("that key file has no staged generation".into());
        }
        if other.keys.newest != self.keys.newest {
            return Err(format!(
                "that key file issues generation {} with another key than this one's {}: not the same cluster or not \
                 the same rotation",
                other.keys.newest.generation.get(),
                self.keys.newest.generation.get()
            ));
        }
        if (other.reset_key, other.token_key, other.rendezvous_key, other.forwarding)
            != (self.reset_key, self.token_key, self.rendezvous_key, self.forwarding)
        {
            return Err(
                "that key file has other reset, token, rendezvous or forwarding secrets: not the same cluster".into()
            );
        }
        Ok(KeyFile { keys: other.keys.clone(), forwarding_other: other.forwarding_other, ..self.clone() })
    }

    /// Whether a staged generation waits for activation: the other decodable
    /// generation is the one *after* the newest (after an ordinary rotation it is the
    /// one before).
    pub fn is_staged(&self) -> bool {
        self.keys.previous.is_some_and(|p| p.generation == self.keys.newest.generation.next())
    }

    /// Two-phase rotation, second phase: the staged generation becomes the newest,
    /// the current newest stays decodable; the staged forwarding secret seals frames,
    /// the current one stays accepted. `None` when nothing is staged.
    pub fn activated(&self) -> Option<KeyFile> {
        let staged = self.keys.previous.filter(|_| self.is_staged())?;
        let (forwarding, forwarding_other) = match self.forwarding_other {
            Some(next) => (next, Some(self.forwarding)),
            // Staged by a version 2 controller: no next forwarding secret.
            None => (self.forwarding, None),
        };
        Some(KeyFile {
            keys: Keys { newest: staged, previous: Some(self.keys.newest) },
            forwarding,
            forwarding_other,
            ..self.clone()
        })
    }

    /// Rotation (ADR 0001): `fresh` becomes the next generation, with PRF `prf`
    /// (ADR 0004); the current newest stays decodable; the one before is dropped.
    /// The forwarding secrets stay: they change only in the two phases every host of
    /// a cluster runs ([`KeyFile::staged`], [`KeyFile::activated`]).
    pub fn rotated(&self, fresh: [u8; KEY_LEN], prf: Prf) -> KeyFile {
        let newest =
            KeyGen { generation: self.keys.newest.generation.next(), prf, secret: fresh, format: CidFormat::Adr1 };
        KeyFile { keys: Keys { newest, previous: Some(self.keys.newest) }, ..self.clone() }
    }

    /// [`KeyFile::rotated`], the new generation in the CID format `spec` gives it
    /// (docs/adr/0007-quic-lb.md): rotation is how the format changes.
    pub fn rotated_as(&self, fresh: [u8; KEY_LEN], prf: Prf, spec: &FormatSpec) -> Result<KeyFile, CidFormatError> {
        let newest = self.next_generation(fresh, prf, spec)?;
        Ok(KeyFile { keys: Keys { newest, previous: Some(self.keys.newest) }, ..self.clone() })
    }

    /// Whether any live generation is not `adr1` (the file is then written as version 4).
    pub fn has_other_formats(&self) -> bool {
        std::iter::once(&self.keys.newest).chain(&self.keys.previous).any(|g| g.format != CidFormat::Adr1)
    }

    /// The routing key set.
    pub fn key_set(&self) -> Result<KeySet, KeySetError> {
        self.keys.key_set()
    }

    pub fn to_text(&self) -> String {
        let v4 = self.has_other_formats();
        let mut s = format!("{MAGIC} {}\n", if v4 { VERSION } else { VERSION_ADR1 });
        let line = |what: &str, k: &KeyGen| {
            let format = if v4 { format!(" {}", k.format.to_text()) } else { String::new() };
            format!("{what} {} {} {}{format}\n", k.generation.get(), k.prf, to_hex(&k.secret))
        };
        s += &line("newest", &self.keys.newest);
        if let Some(p) = &self.keys.previous {
            s += &line("previous", p);
        }
        s += &format!("reset {}\n", to_hex(&self.reset_key));
        s += &format!("token {}\n", to_hex(&self.token_key));
        s += &format!("rendezvous {}\n", to_hex(&self.rendezvous_key));
        s += &format!("forwarding {}\n", to_hex(&self.forwarding));
        if let Some(o) = &self.forwarding_other {
            s += &format!("forwarding-other {}\n", to_hex(o));
        }
        s
    }

    /// A version 1 or 2 file's forwarding secret (module docs).
    pub fn v2_forwarding_secret(rendezvous_key: &[u8; 16]) -> [u8; 32] {
        use aws_lc_rs::hmac;
        let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, rendezvous_key), V2_FORWARDING_LABEL);
        let mut out = [0u8; 32];
        out.copy_from_slice(t.as_ref());
        out
    }

    pub fn parse(text: &str) -> Result<KeyFile, KeyFileError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        // Version 1 has no PRF field (ADR 0004); version 2 names one per generation;
        // version 3 adds the forwarding secrets (ADR 0005 §4); version 4 a CID format
        // per generation (ADR 0007).
        let version: u8 = match lines.next() {
            Some((_, l)) if l == format!("{MAGIC} 1") => 1,
            Some((_, l)) if l == format!("{MAGIC} 2") => 2,
            Some((_, l)) if l == format!("{MAGIC} 3") => 3,
            Some((_, l)) if l == format!("{MAGIC} 4") => 4,
            Some((n, _)) => {
                return Err(err(n, format!("expected '{MAGIC} 1', '{MAGIC} 2', '{MAGIC} 3' or '{MAGIC} 4'")))
            }
            None => return Err(err(0, "empty key file")),
        };
        let v2 = version >= 2;
        let (mut newest, mut previous, mut reset, mut token, mut rdv) = (None, None, None, None, None);
        let (mut forwarding, mut forwarding_other) = (None, None);
        let mut last = 1;
        for (n, l) in lines {
            last = n;
            let f: Vec<&str> = l.split_whitespace().collect();
            // Not empty: blank lines were skipped.
            let Some(&keyword) = f.first() else { continue };
            let fields = |want: usize| {
                if f.len() == want {
                    Ok(())
                } else {
                    Err(err(n, format!("'{keyword}' takes {want} fields in version {version}, found {}", f.len())))
                }
            };
            let once = |seen: bool| if seen { Err(err(n, format!("'{keyword}' given twice"))) } else { Ok(()) };
            match keyword {
                "newest" | "previous" => {
                    let slot = if keyword == "newest" { &mut newest } else { &mut previous };
                    once(slot.is_some())?;
                    if version >= 4 {
                        if f.len() < 5 {
                            return Err(err(
                                n,
                                format!(
                                    "'{keyword}' takes a generation, PRF, secret and CID format in version 4, found \
                                     {} fields",
                                    f.len() - 1
                                ),
                            ));
                        }
                    } else {
                        fields(if v2 { 4 } else { 3 })?;
                    }
                    let generation = f[1]
                        .parse::<u8>()
                        .ok()
                        .and_then(Generation::new)
                        .ok_or_else(|| err(n, "generation must be 0, 1 or 2"))?;
                    let prf = if v2 {
                        f[2].parse::<Prf>().map_err(|e| err(n, e.to_string()))?
                    } else {
                        // ADR 0004: version 1 generations are HMAC-SHA-256 (ADR 0001).
                        Prf::HmacSha256
                    };
                    let secret = hex(f[if v2 { 3 } else { 2 }], n)?;
                    let format = if version >= 4 {
                        CidFormat::parse(&f[4..], generation).map_err(|e| err(n, e.to_string()))?
                    } else {
                        CidFormat::Adr1
                    };
                    *slot = Some(KeyGen { generation, prf, secret, format });
                }
                "reset" | "token" | "rendezvous" => {
                    fields(2)?;
                    match keyword {
                        "reset" => {
                            once(reset.is_some())?;
                            reset = Some(hex(f[1], n)?);
                        }
                        "token" => {
                            once(token.is_some())?;
                            token = Some(hex(f[1], n)?);
                        }
                        _ => {
                            once(rdv.is_some())?;
                            rdv = Some(hex(f[1], n)?);
                        }
                    }
                }
                "forwarding" | "forwarding-other" if version >= 3 => {
                    fields(2)?;
                    let slot = if keyword == "forwarding" { &mut forwarding } else { &mut forwarding_other };
                    once(slot.is_some())?;
                    *slot = Some(hex(f[1], n)?);
                }
                k => return Err(err(n, format!("unexpected line starting '{k}' in version {version}"))),
            }
        }
        let missing = |what: &str| err(last, format!("missing '{what}' line"));
        let newest = newest.ok_or_else(|| missing("newest"))?;
        if let Some(p) = &previous {
            if p.generation == newest.generation {
                return Err(err(last, "previous and newest share a generation"));
            }
        }
        let rendezvous_key = rdv.ok_or_else(|| missing("rendezvous"))?;
        let forwarding = match forwarding {
            Some(f) => f,
            None if version < 3 => KeyFile::v2_forwarding_secret(&rendezvous_key),
            None => return Err(missing("forwarding")),
        };
        Ok(KeyFile {
            keys: Keys { newest, previous },
            reset_key: reset.ok_or_else(|| missing("reset"))?,
            token_key: token.ok_or_else(|| missing("token"))?,
            rendezvous_key,
            forwarding,
            forwarding_other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two-phase rotation across hosts (ADR 0005 §3): staging keeps the issuing
    /// generation, another host stages the same key from this file, activation
    /// swaps; mismatched files are refused with the reason.
    #[test]
    fn staging_activation_and_staging_from_another_host() {
        let a = KeyFile::generate(&[7; RANDOM_LEN], Prf::SipHash24);
        assert!(!a.is_staged() && a.activated().is_none());
        let staged = a.staged([9; KEY_LEN], [0xf9; 32], Prf::SipHash24);
        assert!(staged.is_staged());
        assert_eq!((staged.forwarding, staged.forwarding_other), (a.forwarding, Some([0xf9; 32])));
        assert_eq!(staged.keys.newest, a.keys.newest);
        assert_eq!(
            staged.keys.previous.map(|g| (g.generation, g.secret)),
            Some((Generation::ZERO.next(), [9; KEY_LEN]))
        );
        assert_eq!(KeyFile::parse(&staged.to_text()).expect("round trip"), staged);
        // Host 2 (same cluster file, not staged) stages host 1's generation.
        assert_eq!(a.staged_from(&staged), Ok(staged.clone()));
        assert!(a.staged_from(&a).expect_err("nothing staged").contains("no staged generation"));
        let other_cluster =
            KeyFile::generate(&[8; RANDOM_LEN], Prf::SipHash24).staged([9; KEY_LEN], [0xf9; 32], Prf::SipHash24);
        assert!(a.staged_from(&other_cluster).expect_err("other keys").contains("another key"));
        let mut other_reset = staged.clone();
        other_reset.reset_key[0] ^= 1;
        assert!(a.staged_from(&other_reset).expect_err("other reset key").contains("not the same cluster"));
        let mut other_forwarding = staged.clone();
        other_forwarding.forwarding[0] ^= 1;
        assert!(a.staged_from(&other_forwarding).expect_err("other forwarding").contains("not the same cluster"));
        let act = staged.activated().expect("staged");
        assert_eq!((act.keys.newest, act.keys.previous), (staged.keys.previous.unwrap(), Some(a.keys.newest)));
        // The staged forwarding secret seals, the old one is still accepted.
        assert_eq!((act.forwarding, act.forwarding_other), ([0xf9; 32], Some(a.forwarding)));
        assert_eq!(act.forwarding_secrets().copied().collect::<Vec<_>>(), vec![[0xf9; 32], a.forwarding]);
        assert_eq!(KeyFile::parse(&act.to_text()).expect("round trip"), act);
        // The next stage drops the oldest forwarding secret.
        let again = act.staged([3; KEY_LEN], [0xf3; 32], Prf::SipHash24);
        assert_eq!((again.forwarding, again.forwarding_other), ([0xf9; 32], Some([0xf3; 32])));
        // A plain rotation keeps the forwarding secrets (only the two phases change them).
        let r = act.rotated([4; KEY_LEN], Prf::SipHash24);
        assert_eq!((r.forwarding, r.forwarding_other), (act.forwarding, act.forwarding_other));
        assert!(!act.is_staged(), "after activation the other generation is the one before");
        // An ordinary rotation's previous is the one before: not staged.
        assert!(!a.rotated([5; KEY_LEN], Prf::SipHash24).is_staged());
    }

    /// ADR 0005 §4: a worker's `Assign` carries the CID keys, the reset key and the
    /// token key, and no byte string of it is the forwarding secret (current or other)
    /// or the rendezvous key the version 2 secret derives from.
    #[test]
    fn assign_carries_no_forwarding_secret() {
        use crate::wire::Message;
        let k = KeyFile::generate(&counting(), Prf::SipHash24).staged([0xee; 32], [0xdd; 32], Prf::HmacSha256);
        let a = k.assign(ServerId(7));
        assert_eq!(
            a,
            Registration::Assign {
                server_id: ServerId(7),
                keys: k.keys.clone(),
                reset_key: k.reset_key,
                token_key: k.token_key
            }
        );
        let mut bytes = Vec::new();
        a.encode(&mut bytes);
        for secret in k.forwarding_secrets() {
            assert!(!bytes.windows(32).any(|w| w == secret), "a forwarding secret in Assign");
        }
        assert!(!bytes.windows(16).any(|w| w == k.rendezvous_key), "the rendezvous key in Assign");
        // …while the secrets a worker needs are there (the check above can fail).
        assert!(bytes.windows(32).any(|w| w == k.reset_key));
    }

    /// Version 2 (and 1) files have no forwarding line: the secret is derived from
    /// the rendezvous key, the same on every host reading the same file, and written
    /// back as an explicit version 3 line; a forwarding line in version 2 is refused.
    #[test]
    fn version_2_files_get_a_derived_forwarding_secret() {
        let v3 = KeyFile::generate(&counting(), Prf::SipHash24);
        let v2: String = v3
            .to_text()
            .replace("quicdemux-keys 3", "quicdemux-keys 2")
            .lines()
            .filter(|l| !l.starts_with("forwarding"))
            .map(|l| format!("{l}\n"))
            .collect();
        let k = KeyFile::parse(&v2).expect("version 2");
        let derived = {
            use aws_lc_rs::hmac;
            let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &v3.rendezvous_key), V2_FORWARDING_LABEL);
            t.as_ref().to_vec()
        };
        assert_eq!(k.forwarding.to_vec(), derived);
        assert_ne!(k.forwarding, v3.forwarding);
        assert_eq!(k.forwarding_other, None);
        assert_eq!(KeyFile::parse(&v2).expect("again"), k, "deterministic: every host derives the same");
        let text = k.to_text();
        assert!(text.starts_with("quicdemux-keys 3\n"));
        assert!(text.contains(&format!("\nforwarding {}\n", to_hex(&derived))), "{text}");
        assert_eq!(KeyFile::parse(&text).expect("written back"), k);
        let e = KeyFile::parse(&format!("{v2}forwarding {}\n", "00".repeat(32))).expect_err("not in version 2");
        assert!(e.what.contains("unexpected line starting 'forwarding' in version 2"), "{e}");
    }

    fn counting() -> [u8; RANDOM_LEN] {
        core::array::from_fn(|i| i as u8)
    }

    #[test]
    fn round_trip_and_rotation() {
        for prf in Prf::ALL {
            let k = KeyFile::generate(&counting(), prf);
            assert_eq!(k.keys.newest.prf, prf);
            assert_eq!(KeyFile::parse(&k.to_text()).unwrap(), k);
            let k2 = k.rotated([9; 32], prf);
            assert_eq!(k2.keys.newest.generation.get(), 1);
            assert_eq!(k2.keys.previous.unwrap().secret, k.keys.newest.secret);
            assert_eq!(KeyFile::parse(&k2.to_text()).unwrap(), k2);
            let k3 = k2.rotated([8; 32], prf);
            assert_eq!(k3.keys.previous.unwrap().generation.get(), 1);
        }
    }

    /// The exact version 2 text, and mixed PRFs across newest and previous.
    #[test]
    fn version_2_text_and_mixed_prfs() {
        let k = KeyFile::generate(&counting(), Prf::HmacSha256).rotated([0xab; 32], Prf::SipHash24);
        let text = k.to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "quicdemux-keys 3");
        assert_eq!(lines[1], format!("newest 1 siphash-2-4 {}", "ab".repeat(32)));
        assert_eq!(lines[2], format!("previous 0 hmac-sha256 {}", to_hex(&counting()[..32])));
        assert!(
            lines[3].starts_with("reset ") && lines[4].starts_with("token ") && lines[5].starts_with("rendezvous ")
        );
        assert_eq!(lines[6], format!("forwarding {}", to_hex(&counting()[112..144])));
        assert_eq!(lines.len(), 7, "no forwarding-other before a stage");
        let back = KeyFile::parse(&text).unwrap();
        assert_eq!(back, k);
        assert_eq!((back.keys.newest.prf, back.keys.previous.unwrap().prf), (Prf::SipHash24, Prf::HmacSha256));
        // …and the other way round.
        let k = KeyFile::generate(&counting(), Prf::SipHash24).rotated([0xcd; 32], Prf::HmacSha256);
        let back = KeyFile::parse(&k.to_text()).unwrap();
        assert_eq!((back.keys.newest.prf, back.keys.previous.unwrap().prf), (Prf::HmacSha256, Prf::SipHash24));
        let ks = back.key_set().unwrap();
        assert_eq!(ks.prf(Generation::new(1).unwrap()), Some(Prf::HmacSha256));
        assert_eq!(ks.prf(Generation::ZERO), Some(Prf::SipHash24));
    }

    /// A version 1 file (no PRF field) still parses, every generation `hmac-sha256`,
    /// and is written back as version 3.
    #[test]
    fn version_1_parses_as_hmac() {
        let v1 = format!(
            "# written by an older quicdemux\nquicdemux-keys 1\nnewest 2 {}\nprevious 1 {}\n\nreset {}\ntoken {}\nrendezvous {}\n",
            "11".repeat(32),
            "22".repeat(32),
            "33".repeat(32),
            "44".repeat(32),
            "55".repeat(16)
        );
        let k = KeyFile::parse(&v1).unwrap();
        assert_eq!(
            k.keys.newest,
            KeyGen {
                generation: Generation::new(2).unwrap(),
                prf: Prf::HmacSha256,
                secret: [0x11; 32],
                format: CidFormat::Adr1
            }
        );
        assert_eq!(
            k.keys.previous,
            Some(KeyGen {
                generation: Generation::new(1).unwrap(),
                prf: Prf::HmacSha256,
                secret: [0x22; 32],
                format: CidFormat::Adr1
            })
        );
        assert_eq!((k.reset_key, k.token_key, k.rendezvous_key), ([0x33; 32], [0x44; 32], [0x55; 16]));
        assert_eq!(k.forwarding, KeyFile::v2_forwarding_secret(&[0x55; 16]));
        assert!(k.to_text().starts_with("quicdemux-keys 3\nnewest 2 hmac-sha256 "));
        assert_eq!(KeyFile::parse(&k.to_text()).unwrap(), k);
        // A PRF field in a version 1 file is a wrong field count, not a PRF.
        let with_prf = v1.replace("newest 2 ", "newest 2 siphash-2-4 ");
        let e = KeyFile::parse(&with_prf).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(e.what.contains("3 fields in version 1"), "{e}");
    }

    #[test]
    fn clear_errors_with_line_numbers() {
        let good = KeyFile::generate(&[7; RANDOM_LEN], Prf::SipHash24).rotated([8; 32], Prf::HmacSha256).to_text();
        let bad = |from: &str, to: &str| {
            assert!(good.contains(from), "{from}");
            KeyFile::parse(&good.replacen(from, to, 1)).unwrap_err()
        };
        // Unknown PRF names: exact, case-sensitive.
        for name in ["siphash", "SipHash-2-4", "hmac", "sha256", "siphash-1-3"] {
            let e = bad("newest 1 hmac-sha256", &format!("newest 1 {name}"));
            assert_eq!(e.line, 2, "{e}");
            assert!(e.what.contains(&format!("unknown PRF '{name}'")), "{e}");
            let e = bad("previous 0 siphash-2-4", &format!("previous 0 {name}"));
            assert_eq!(e.line, 3, "{e}");
            assert!(e.what.contains("unknown PRF"), "{e}");
        }
        // Version 2 without the PRF field, or with one too many.
        let e = bad("newest 1 hmac-sha256 ", "newest 1 ");
        assert_eq!((e.line, e.what.contains("'newest' takes 4 fields in version 3, found 3")), (2, true), "{e}");
        let e = bad("previous 0 siphash-2-4 ", "previous 0 siphash-2-4 siphash-2-4 ");
        assert_eq!((e.line, e.what.contains("found 5")), (3, true), "{e}");
        let e = bad("reset ", "reset 00 ");
        assert_eq!((e.line, e.what.contains("'reset' takes 2 fields")), (4, true), "{e}");
        let e = bad("forwarding ", "forwarding 00 ");
        assert_eq!((e.line, e.what.contains("'forwarding' takes 2 fields")), (7, true), "{e}");
        // Unknown versions.
        for v in ["0", "5", "10", "3.0", ""] {
            let e = bad("quicdemux-keys 3", &format!("quicdemux-keys {v}"));
            assert_eq!(e.line, 1, "{e}");
            assert!(
                e.what.contains(
                    "expected 'quicdemux-keys 1', 'quicdemux-keys 2', 'quicdemux-keys 3' or 'quicdemux-keys 4'"
                ),
                "{e}"
            );
        }
        // Twice.
        let e = KeyFile::parse(&format!("{good}previous 2 hmac-sha256 {}\n", "00".repeat(32))).unwrap_err();
        assert_eq!((e.line, e.what.as_str()), (8, "'previous' given twice"));
        let e = KeyFile::parse(&format!("{good}forwarding {}\n", "00".repeat(32))).unwrap_err();
        assert_eq!((e.line, e.what.as_str()), (8, "'forwarding' given twice"));
        let two = format!("{good}forwarding-other {}\nforwarding-other {}\n", "00".repeat(32), "01".repeat(32));
        assert_eq!(KeyFile::parse(&two).unwrap_err().what, "'forwarding-other' given twice");
    }

    #[test]
    fn rejects_bad_files() {
        let good = KeyFile::generate(&[7; RANDOM_LEN], Prf::SipHash24).to_text();
        assert!(KeyFile::parse("").is_err());
        assert!(KeyFile::parse("quicdemux-keys 2\n").is_err());
        assert!(KeyFile::parse("quicdemux-keys 3\n").is_err());
        for drop in ["newest", "reset", "token", "rendezvous", "forwarding"] {
            let t: String = good.lines().filter(|l| !l.starts_with(drop)).map(|l| format!("{l}\n")).collect();
            assert!(KeyFile::parse(&t).is_err(), "{drop} missing must fail");
        }
        assert!(KeyFile::parse(&format!("{good}reset {}\n", "00".repeat(32))).is_err());
        assert!(KeyFile::parse(&good.replace("newest 0", "newest 3")).is_err());
        assert!(KeyFile::parse(&format!("{}x", good.trim_end())).is_err());
        let same = format!("{good}previous 0 hmac-sha256 {}\n", "00".repeat(32));
        assert!(KeyFile::parse(&same).unwrap_err().what.contains("share a generation"));
        // Every truncation fails or parses to something valid; never panics.
        for i in 0..good.len() {
            let _ = KeyFile::parse(&good[..i]);
        }
    }

    fn quic_lb(server_id_len: u8, key: crate::cid_format::KeySpec, self_len: bool) -> FormatSpec {
        FormatSpec::QuicLb { server_id_len, nonce_len: 11 - server_id_len, key, self_encoded_len: self_len }
    }

    /// ADR 0007: rotation changes the format; the file is version 4 while a quic-lb
    /// generation is live, and version 3 again (byte for byte what a build without
    /// formats writes) once both live generations are adr1.
    #[test]
    fn rotation_changes_the_cid_format() {
        use crate::cid_format::KeySpec;
        let a = KeyFile::generate(&counting(), Prf::SipHash24);
        let v3 = a.to_text();
        assert!(v3.starts_with("quicdemux-keys 3\nnewest 0 siphash-2-4 ") && !v3.contains("adr1"), "{v3}");
        let b = a.rotated_as([9; 32], Prf::SipHash24, &quic_lb(2, KeySpec::Generate, true)).expect("fits");
        let text = b.to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "quicdemux-keys 4");
        assert_eq!(
            lines[1],
            format!(
                "newest 1 siphash-2-4 {} quic-lb config=2 server-id=2 nonce=9 key={} length=self",
                "09".repeat(32),
                "09".repeat(16)
            )
        );
        assert_eq!(lines[2], format!("previous 0 siphash-2-4 {} adr1", to_hex(&counting()[..32])));
        assert_eq!(KeyFile::parse(&text).expect("round trip"), b);
        // Plaintext, generation 2: config id 4.
        let c = b.rotated_as([7; 32], Prf::HmacSha256, &quic_lb(3, KeySpec::None, false)).expect("fits");
        assert!(c.to_text().contains(" quic-lb config=4 server-id=3 nonce=8 key=none length=random\n"));
        assert_eq!(KeyFile::parse(&c.to_text()).expect("round trip"), c);
        // Back to adr1: version 4 while the quic-lb generation is still the previous one…
        let d = c.rotated_as([6; 32], Prf::SipHash24, &FormatSpec::Adr1).expect("adr1");
        assert!(d.to_text().starts_with("quicdemux-keys 4\nnewest 0 siphash-2-4 "));
        assert_eq!(KeyFile::parse(&d.to_text()).expect("round trip"), d);
        // …and version 3 once it is gone.
        let e = d.rotated([5; 32], Prf::SipHash24);
        assert_eq!(e.to_text(), d.rotated([5; 32], Prf::SipHash24).to_text());
        assert!(e.to_text().starts_with("quicdemux-keys 3\n") && !e.to_text().contains("adr1"));
        // Staging takes the format too, and activation keeps it.
        let s = a.staged_as([4; 32], [0xf4; 32], Prf::SipHash24, &quic_lb(2, KeySpec::None, false)).expect("fits");
        assert!(s.is_staged() && s.has_other_formats());
        assert_eq!(KeyFile::parse(&s.to_text()).expect("round trip"), s);
        let act = s.activated().expect("staged");
        assert_eq!(act.keys.newest.format, s.keys.previous.expect("staged").format);
        assert!(matches!(act.keys.newest.format, CidFormat::QuicLb(p) if p.config_id.get() == 2));
    }

    /// A version 4 file names the format on every generation line; a bad one gets the
    /// line and the reason; a format in a version 3 file is a field-count error.
    #[test]
    fn version_4_errors() {
        use crate::cid_format::KeySpec;
        let good = KeyFile::generate(&[7; RANDOM_LEN], Prf::SipHash24)
            .rotated_as([8; 32], Prf::HmacSha256, &quic_lb(2, KeySpec::None, true))
            .expect("fits")
            .to_text();
        let bad = |from: &str, to: &str| {
            assert!(good.contains(from), "{from} in {good}");
            KeyFile::parse(&good.replacen(from, to, 1)).unwrap_err()
        };
        let cases = [
            (" adr1\n", "\n", 3, "takes a generation, PRF, secret and CID format in version 4, found 3"),
            (" adr1\n", " adr2\n", 3, "unknown CID format 'adr2'"),
            ("config=2", "config=4", 2, "cannot be generation 1's"),
            ("config=2", "config=7", 2, "expected a number 0..=5"),
            ("nonce=9", "nonce=8", 2, "must add up to 11"),
            ("server-id=2 nonce=9", "server-id=1 nonce=10", 2, "server ids are 16 bits"),
            ("key=none", "key=generate", 2, "32 hex digits"),
            ("length=self", "length=self length=self", 2, "'length' given twice"),
            ("length=self", "", 2, "missing length"),
        ];
        for (from, to, line, want) in cases {
            let e = bad(from, to);
            assert_eq!(e.line, line, "{from} -> {to}: {e}");
            assert!(e.what.contains(want), "{from} -> {to}: {e}");
        }
        let v3_with_format = good.replacen("quicdemux-keys 4", "quicdemux-keys 3", 1);
        let e = KeyFile::parse(&v3_with_format).unwrap_err();
        assert!(e.what.contains("'newest' takes 4 fields in version 3"), "{e}");
        // A format the generation cannot take is refused by rotation, not written.
        let e = KeyFile::generate(&[7; RANDOM_LEN], Prf::SipHash24)
            .rotated_as([8; 32], Prf::SipHash24, &quic_lb(1, KeySpec::None, false))
            .unwrap_err();
        assert!(e.0.contains("16 bits"), "{e}");
    }

    fn arb_spec() -> impl proptest::strategy::Strategy<Value = FormatSpec> {
        use crate::cid_format::KeySpec;
        use proptest::prelude::*;
        prop_oneof![
            Just(FormatSpec::Adr1),
            (
                2u8..=7,
                prop_oneof![Just(KeySpec::None), Just(KeySpec::Generate), any::<[u8; 16]>().prop_map(KeySpec::Fixed)],
                any::<bool>()
            )
                .prop_map(|(sid, key, sel)| quic_lb(sid, key, sel)),
        ]
    }

    proptest::proptest! {
        /// Any sequence of rotations and stages in any formats: every file parses back
        /// to itself, its version is 4 exactly when a live generation is not adr1, and
        /// each quic-lb generation's config id has the generation in its top two bits.
        #[test]
        fn rotations_round_trip(steps in proptest::collection::vec((arb_spec(), proptest::prelude::any::<[u8; 32]>(), 0u8..3), 1..8)) {
            let mut k = KeyFile::generate(&counting(), Prf::SipHash24);
            for (spec, fresh, op) in steps {
                k = match op {
                    0 => k.rotated_as(fresh, Prf::HmacSha256, &spec).expect("valid spec"),
                    1 => k.staged_as(fresh, [1; 32], Prf::SipHash24, &spec).expect("valid spec"),
                    _ => k.activated().unwrap_or(k),
                };
                let text = k.to_text();
                proptest::prop_assert_eq!(KeyFile::parse(&text).expect("parses"), k.clone());
                proptest::prop_assert_eq!(text.starts_with("quicdemux-keys 4\n"), k.has_other_formats());
                for g in std::iter::once(k.keys.newest).chain(k.keys.previous) {
                    if let CidFormat::QuicLb(p) = g.format {
                        proptest::prop_assert_eq!(p.config_id.get() >> 1, g.generation.get());
                    }
                }
            }
        }
    }
}
