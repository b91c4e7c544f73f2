//! The key file: every secret the instances share, as kept by the controller in its
//! state directory (mode 0600) and read by standalone demux/worker/udpflood runs.
//!
//! ```text
//! quicdemux-keys 1
//! newest 1 <64 hex digits>          # generation 0..=2 and its 32-byte CID key (ADR-0040)
//! previous 0 <64 hex digits>        # optional: the generation still decodable
//! reset <64 hex digits>             # stateless-reset key, identical on every instance
//! token <64 hex digits>             # Retry/NEW_TOKEN key, identical on every instance
//! rendezvous <32 hex digits>        # placement hash key of the demux
//! ```
//! Blank lines and lines starting with `#` are ignored. Parsing is strict: every
//! required line exactly once, no unknown keywords.

use crate::cid::{Generation, KeySet, KeySetError, KEY_LEN};
use crate::wire::{KeyGen, Keys};

const MAGIC: &str = "quicdemux-keys";
const VERSION: &str = "1";

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
    /// A fresh key file from `random` bytes (the caller draws them from the OS).
    pub fn generate(random: &[u8; 3 * 32 + 16]) -> KeyFile {
        let mut k = [0u8; KEY_LEN];
        k.copy_from_slice(&random[..32]);
        let mut reset_key = [0u8; 32];
        reset_key.copy_from_slice(&random[32..64]);
        let mut token_key = [0u8; 32];
        token_key.copy_from_slice(&random[64..96]);
        let mut rendezvous_key = [0u8; 16];
        rendezvous_key.copy_from_slice(&random[96..112]);
        KeyFile {
            keys: Keys { newest: KeyGen { generation: Generation::ZERO, secret: k }, previous: None },
            reset_key,
            token_key,
            rendezvous_key,
        }
    }

    /// Rotation (ADR-0040): `fresh` becomes the next generation; the current newest
    /// stays decodable; the one before is dropped.
    pub fn rotated(&self, fresh: [u8; KEY_LEN]) -> KeyFile {
        let newest = KeyGen { generation: self.keys.newest.generation.next(), secret: fresh };
        KeyFile { keys: Keys { newest, previous: Some(self.keys.newest) }, ..self.clone() }
    }

    /// The routing key set.
    pub fn key_set(&self) -> Result<KeySet, KeySetError> {
        self.keys.key_set()
    }

    pub fn to_text(&self) -> String {
        let mut s = format!("{MAGIC} {VERSION}\n");
        s += &format!("newest {} {}\n", self.keys.newest.generation.get(), to_hex(&self.keys.newest.secret));
        if let Some(p) = &self.keys.previous {
            s += &format!("previous {} {}\n", p.generation.get(), to_hex(&p.secret));
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
        match lines.next() {
            Some((_, l)) if l == format!("{MAGIC} {VERSION}") => {}
            Some((n, _)) => return Err(err(n, format!("expected '{MAGIC} {VERSION}'"))),
            None => return Err(err(0, "empty key file")),
        }
        let (mut newest, mut previous, mut reset, mut token, mut rdv) = (None, None, None, None, None);
        let mut last = 1;
        for (n, l) in lines {
            last = n;
            let f: Vec<&str> = l.split_whitespace().collect();
            let dup = || err(n, format!("'{}' given twice", f[0]));
            let gen = |s: &str| -> Result<Generation, KeyFileError> {
                s.parse::<u8>()
                    .ok()
                    .and_then(Generation::new)
                    .ok_or_else(|| err(n, "generation must be 0, 1 or 2"))
            };
            match (f[0], f.len()) {
                ("newest", 3) if newest.is_none() => {
                    newest = Some(KeyGen { generation: gen(f[1])?, secret: hex(f[2], n)? })
                }
                ("previous", 3) if previous.is_none() => {
                    previous = Some(KeyGen { generation: gen(f[1])?, secret: hex(f[2], n)? })
                }
                ("reset", 2) if reset.is_none() => reset = Some(hex(f[1], n)?),
                ("token", 2) if token.is_none() => token = Some(hex(f[1], n)?),
                ("rendezvous", 2) if rdv.is_none() => rdv = Some(hex(f[1], n)?),
                ("newest" | "previous" | "reset" | "token" | "rendezvous", 2 | 3) => return Err(dup()),
                (k, _) => return Err(err(n, format!("unexpected line starting '{k}'"))),
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

    #[test]
    fn round_trip_and_rotation() {
        let mut r = [0u8; 112];
        for (i, b) in r.iter_mut().enumerate() {
            *b = i as u8;
        }
        let k = KeyFile::generate(&r);
        assert_eq!(KeyFile::parse(&k.to_text()).unwrap(), k);
        let k2 = k.rotated([9; 32]);
        assert_eq!(k2.keys.newest.generation.get(), 1);
        assert_eq!(k2.keys.previous.unwrap().secret, k.keys.newest.secret);
        assert_eq!(KeyFile::parse(&k2.to_text()).unwrap(), k2);
        let k3 = k2.rotated([8; 32]);
        assert_eq!(k3.keys.previous.unwrap().generation.get(), 1);
    }

    #[test]
    fn rejects_bad_files() {
        let good = KeyFile::generate(&[7; 112]).to_text();
        assert!(KeyFile::parse("").is_err());
        assert!(KeyFile::parse("quicdemux-keys 2\n").is_err());
        for drop in ["newest", "reset", "token", "rendezvous"] {
            let t: String = good.lines().filter(|l| !l.starts_with(drop)).map(|l| format!("{l}\n")).collect();
            assert!(KeyFile::parse(&t).is_err(), "{drop} missing must fail");
        }
        assert!(KeyFile::parse(&format!("{good}reset {}\n", "00".repeat(32))).is_err());
        assert!(KeyFile::parse(&good.replace("newest 0", "newest 3")).is_err());
        assert!(KeyFile::parse(&format!("{}x", good.trim_end())).is_err());
        // Every truncation fails or parses to something valid; never panics.
        for i in 0..good.len() {
            let _ = KeyFile::parse(&good[..i]);
        }
    }
}
