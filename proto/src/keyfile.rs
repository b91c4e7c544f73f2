//! The key file: every secret the instances share, as kept by the controller in its
//! state directory (mode 0600) and read by standalone demux/worker/udpflood runs.
//!
//! ```text
//! quicdemux-keys 2
//! newest 1 siphash-2-4 <64 hex>     # generation 0..=2, its PRF (ADR 0004), its 32-byte CID key
//! previous 0 hmac-sha256 <64 hex>   # optional: the generation still decodable
//! reset <64 hex digits>             # stateless-reset key, identical on every instance
//! token <64 hex digits>             # Retry/NEW_TOKEN key, identical on every instance
//! rendezvous <32 hex digits>        # placement hash key of the demux
//! ```
//! PRF names: `hmac-sha256`, `siphash-2-4`. Version 1 files (`quicdemux-keys 1`) have
//! no PRF field (`newest 1 <64 hex>`) and parse as `hmac-sha256`; [`KeyFile::to_text`]
//! always writes version 2. Blank lines and lines starting with `#` are ignored.
//! Parsing is strict: every required line exactly once, the field count of the file's
//! version, no unknown keywords or PRF names.

use crate::cid::{Generation, KeySet, KeySetError, Prf, KEY_LEN};
use crate::wire::{KeyGen, Keys};

/// Random bytes [`KeyFile::generate`] takes: the generation-0 CID key, the reset key
/// and the token key (32 bytes each), then the 16-byte rendezvous key.
pub const RANDOM_LEN: usize = KEY_LEN + 32 + 32 + 16;

const MAGIC: &str = "quicdemux-keys";
/// The version [`KeyFile::to_text`] writes.
const VERSION: u8 = 2;

/// All shared secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFile {
    pub keys: Keys,
    pub reset_key: [u8; 32],
    pub token_key: [u8; 32],
    pub rendezvous_key: [u8; 16],
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
        KeyFile {
            keys: Keys { newest: KeyGen { generation: Generation::ZERO, prf, secret: k }, previous: None },
            reset_key,
            token_key,
            rendezvous_key,
        }
    }

    /// Two-phase rotation, first phase (ADR 0005 §3): `fresh` becomes the next
    /// generation, decodable but not issued: it takes the `previous` line (whose old
    /// generation is dropped), and `newest` — the generation new CIDs use — stays.
    pub fn staged(&self, fresh: [u8; KEY_LEN], prf: Prf) -> KeyFile {
        let next = KeyGen { generation: self.keys.newest.generation.next(), prf, secret: fresh };
        KeyFile { keys: Keys { newest: self.keys.newest, previous: Some(next) }, ..self.clone() }
    }

    /// Stages the generation `other` (another host's key file) staged, so every host
    /// of a cluster decodes the same new key: `other` must be staged, issue the same
    /// newest generation as this file, and hold the same shared secrets.
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
        if (other.reset_key, other.token_key, other.rendezvous_key)
            != (self.reset_key, self.token_key, self.rendezvous_key)
        {
            return Err("that key file has other reset, token or rendezvous keys: not the same cluster".into());
        }
        Ok(KeyFile { keys: other.keys.clone(), ..self.clone() })
    }

    /// Whether a staged generation waits for activation: the other decodable
    /// generation is the one *after* the newest (after an ordinary rotation it is the
    /// one before).
    pub fn is_staged(&self) -> bool {
        self.keys.previous.is_some_and(|p| p.generation == self.keys.newest.generation.next())
    }

    /// Two-phase rotation, second phase: the staged generation becomes the newest,
    /// the current newest stays decodable. `None` when nothing is staged.
    pub fn activated(&self) -> Option<KeyFile> {
        let staged = self.keys.previous.filter(|_| self.is_staged())?;
        Some(KeyFile { keys: Keys { newest: staged, previous: Some(self.keys.newest) }, ..self.clone() })
    }

    /// Rotation (ADR 0001): `fresh` becomes the next generation, with PRF `prf`
    /// (ADR 0004); the current newest stays decodable; the one before is dropped.
    pub fn rotated(&self, fresh: [u8; KEY_LEN], prf: Prf) -> KeyFile {
        let newest = KeyGen { generation: self.keys.newest.generation.next(), prf, secret: fresh };
        KeyFile { keys: Keys { newest, previous: Some(self.keys.newest) }, ..self.clone() }
    }

    /// The routing key set.
    pub fn key_set(&self) -> Result<KeySet, KeySetError> {
        self.keys.key_set()
    }

    pub fn to_text(&self) -> String {
        let mut s = format!("{MAGIC} {VERSION}\n");
        let line = |what: &str, k: &KeyGen| format!("{what} {} {} {}\n", k.generation.get(), k.prf, to_hex(&k.secret));
        s += &line("newest", &self.keys.newest);
        if let Some(p) = &self.keys.previous {
            s += &line("previous", p);
        }
        s += &format!("reset {}\n", to_hex(&self.reset_key));
        s += &format!("token {}\n", to_hex(&self.token_key));
        s += &format!("rendezvous {}\n", to_hex(&self.rendezvous_key));
        s
    }

    pub fn parse(text: &str) -> Result<KeyFile, KeyFileError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        // Version 1 has no PRF field (ADR 0004); version 2 names one per generation.
        let v2 = match lines.next() {
            Some((_, l)) if l == format!("{MAGIC} 1") => false,
            Some((_, l)) if l == format!("{MAGIC} 2") => true,
            Some((n, _)) => return Err(err(n, format!("expected '{MAGIC} 1' or '{MAGIC} 2'"))),
            None => return Err(err(0, "empty key file")),
        };
        let (mut newest, mut previous, mut reset, mut token, mut rdv) = (None, None, None, None, None);
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
                    let v = if v2 { 2 } else { 1 };
                    Err(err(n, format!("'{keyword}' takes {want} fields in version {v}, found {}", f.len())))
                }
            };
            let once = |seen: bool| if seen { Err(err(n, format!("'{keyword}' given twice"))) } else { Ok(()) };
            match keyword {
                "newest" | "previous" => {
                    let slot = if keyword == "newest" { &mut newest } else { &mut previous };
                    once(slot.is_some())?;
                    fields(if v2 { 4 } else { 3 })?;
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
                    let secret = hex(f[f.len() - 1], n)?;
                    *slot = Some(KeyGen { generation, prf, secret });
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
                k => return Err(err(n, format!("unexpected line starting '{k}'"))),
            }
        }
        let missing = |what: &str| err(last, format!("missing '{what}' line"));
        let newest = newest.ok_or_else(|| missing("newest"))?;
        if let Some(p) = &previous {
            if p.generation == newest.generation {
                return Err(err(last, "previous and newest share a generation"));
            }
        }
        Ok(KeyFile {
            keys: Keys { newest, previous },
            reset_key: reset.ok_or_else(|| missing("reset"))?,
            token_key: token.ok_or_else(|| missing("token"))?,
            rendezvous_key: rdv.ok_or_else(|| missing("rendezvous"))?,
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
        let staged = a.staged([9; KEY_LEN], Prf::SipHash24);
        assert!(staged.is_staged());
        assert_eq!(staged.keys.newest, a.keys.newest);
        assert_eq!(
            staged.keys.previous.map(|g| (g.generation, g.secret)),
            Some((Generation::ZERO.next(), [9; KEY_LEN]))
        );
        assert_eq!(KeyFile::parse(&staged.to_text()).expect("round trip"), staged);
        // Host 2 (same cluster file, not staged) stages host 1's generation.
        assert_eq!(a.staged_from(&staged), Ok(staged.clone()));
        assert!(a.staged_from(&a).expect_err("nothing staged").contains("no staged generation"));
        let other_cluster = KeyFile::generate(&[8; RANDOM_LEN], Prf::SipHash24).staged([9; KEY_LEN], Prf::SipHash24);
        assert!(a.staged_from(&other_cluster).expect_err("other keys").contains("another key"));
        let mut other_reset = staged.clone();
        other_reset.reset_key[0] ^= 1;
        assert!(a.staged_from(&other_reset).expect_err("other reset key").contains("not the same cluster"));
        let act = staged.activated().expect("staged");
        assert_eq!((act.keys.newest, act.keys.previous), (staged.keys.previous.unwrap(), Some(a.keys.newest)));
        assert!(!act.is_staged(), "after activation the other generation is the one before");
        // An ordinary rotation's previous is the one before: not staged.
        assert!(!a.rotated([5; KEY_LEN], Prf::SipHash24).is_staged());
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
        assert_eq!(lines[0], "quicdemux-keys 2");
        assert_eq!(lines[1], format!("newest 1 siphash-2-4 {}", "ab".repeat(32)));
        assert_eq!(lines[2], format!("previous 0 hmac-sha256 {}", to_hex(&counting()[..32])));
        assert!(
            lines[3].starts_with("reset ") && lines[4].starts_with("token ") && lines[5].starts_with("rendezvous ")
        );
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
    /// and is written back as version 2.
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
            KeyGen { generation: Generation::new(2).unwrap(), prf: Prf::HmacSha256, secret: [0x11; 32] }
        );
        assert_eq!(
            k.keys.previous,
            Some(KeyGen { generation: Generation::new(1).unwrap(), prf: Prf::HmacSha256, secret: [0x22; 32] })
        );
        assert_eq!((k.reset_key, k.token_key, k.rendezvous_key), ([0x33; 32], [0x44; 32], [0x55; 16]));
        assert!(k.to_text().starts_with("quicdemux-keys 2\nnewest 2 hmac-sha256 "));
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
        assert_eq!((e.line, e.what.contains("'newest' takes 4 fields in version 2, found 3")), (2, true), "{e}");
        let e = bad("previous 0 siphash-2-4 ", "previous 0 siphash-2-4 siphash-2-4 ");
        assert_eq!((e.line, e.what.contains("found 5")), (3, true), "{e}");
        let e = bad("reset ", "reset 00 ");
        assert_eq!((e.line, e.what.contains("'reset' takes 2 fields")), (4, true), "{e}");
        // Unknown versions.
        for v in ["0", "3", "10", "2.0", ""] {
            let e = bad("quicdemux-keys 2", &format!("quicdemux-keys {v}"));
            assert_eq!(e.line, 1, "{e}");
            assert!(e.what.contains("expected 'quicdemux-keys 1' or 'quicdemux-keys 2'"), "{e}");
        }
        // Twice.
        let e = KeyFile::parse(&format!("{good}previous 2 hmac-sha256 {}\n", "00".repeat(32))).unwrap_err();
        assert_eq!((e.line, e.what.as_str()), (7, "'previous' given twice"));
    }

    #[test]
    fn rejects_bad_files() {
        let good = KeyFile::generate(&[7; RANDOM_LEN], Prf::SipHash24).to_text();
        assert!(KeyFile::parse("").is_err());
        assert!(KeyFile::parse("quicdemux-keys 2\n").is_err());
        assert!(KeyFile::parse("quicdemux-keys 3\n").is_err());
        for drop in ["newest", "reset", "token", "rendezvous"] {
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
}
