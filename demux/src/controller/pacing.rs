//! Rotation pacing (docs/adr/0001): the data plane decodes only the
//! newest and the previous key generation, so a rotation while connections still
//! use CIDs of the previous one orphans them. Workers move their connections to
//! newest-generation CIDs within two CID lifetimes (`worker --cid-lifetime`: a CID
//! expires one lifetime after it was issued, and quinn may keep it one more
//! lifetime while it waits for the peer's RETIRE_CONNECTION_ID, RFC 9000 §5.1.2;
//! docs/worker.md), so a rotation is refused within [`PACE_LIFETIMES`] × lifetime
//! of the last one (two lifetimes for the last rotation's generation to take over,
//! one of margin), unless forced.
//!
//! `DIR/last-rotation` (0600, atomic) records when the last rotation happened and
//! the CID lifetime in force then, so the rule survives controller restarts and
//! also holds for an offline `demux rotate-keys` (which has no `--cid-lifetime`).

use super::state::{self, Paths};
use anyhow::{bail, Result};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MAGIC: &str = "quicdemux-last-rotation 1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Wall-clock time of the last rotation (ms since the Unix epoch).
    pub at_unix_ms: u64,
    /// The CID lifetime the workers had then (ms).
    pub cid_lifetime_ms: u64,
}

pub fn path(p: &Paths) -> std::path::PathBuf {
    p.dir.join("last-rotation")
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Record {
    fn parse(text: &str) -> Option<Record> {
        let mut l = text.lines().map(str::trim).filter(|l| !l.is_empty());
        if l.next()? != MAGIC {
            return None;
        }
        let mut field = |name: &str| -> Option<u64> {
            let line = l.next()?;
            line.strip_prefix(name)?.trim().parse().ok()
        };
        let r = Record { at_unix_ms: field("at_unix_ms")?, cid_lifetime_ms: field("cid_lifetime_ms")? };
        l.next().is_none().then_some(r)
    }

    fn to_text(self) -> String {
        format!("{MAGIC}\nat_unix_ms {}\ncid_lifetime_ms {}\n", self.at_unix_ms, self.cid_lifetime_ms)
    }
}

/// The last rotation, `None` when none was recorded. A corrupt record is an error
/// (refused unless forced: it cannot tell that rotating is safe).
pub fn load(p: &Paths) -> Result<Option<Record>> {
    match state::read_private(&path(p))? {
        None => Ok(None),
        Some(t) => match Record::parse(&t) {
            Some(r) => Ok(Some(r)),
            None => bail!("{} is corrupt (cannot tell when keys last rotated)", path(p).display()),
        },
    }
}

pub fn store(p: &Paths, r: Record) -> Result<()> {
    state::write_atomic(&path(p), &r.to_text())
}

/// Rotations are at least this many CID lifetimes apart (the module comment says why).
pub const PACE_LIFETIMES: u64 = 3;

/// How long after `last` a rotation is allowed: [`PACE_LIFETIMES`] × the longer of
/// the recorded lifetime and the current one.
pub fn wait_needed(last: Option<Record>, lifetime: Option<Duration>, now_ms: u64) -> Option<Duration> {
    let last = last?;
    let life = lifetime.map_or(0, |d| d.as_millis() as u64).max(last.cid_lifetime_ms);
    let allowed_at = last.at_unix_ms.saturating_add(PACE_LIFETIMES * life);
    (now_ms < allowed_at).then(|| Duration::from_millis(allowed_at - now_ms))
}

/// Ok when a rotation may run now; else the operator's message.
pub fn check(p: &Paths, lifetime: Option<Duration>, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let last = load(p).map_err(|e| anyhow::anyhow!("{e:#}; pass --force to rotate anyway"))?;
    let now = now_unix_ms();
    if let Some(wait) = wait_needed(last, lifetime, now) {
        let last = last.expect("a wait needs a last rotation");
        let life_ms = lifetime.map_or(0, |d| d.as_millis() as u64).max(last.cid_lifetime_ms);
        bail!(
            "refusing to rotate: the last rotation was {:.1} s ago, and connections may still use CIDs of the \
             generation this rotation would stop decoding (CIDs live up to {:.1} s, so rotations are at least \
             {PACE_LIFETIMES} × {:.1} s apart); retry in {:.1} s, or pass --force (orphans those connections)",
            now.saturating_sub(last.at_unix_ms) as f64 / 1000.0,
            life_ms as f64 / 1000.0,
            life_ms as f64 / 1000.0,
            wait.as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_corruption() {
        let r = Record { at_unix_ms: 1_700_000_000_123, cid_lifetime_ms: 600_000 };
        assert_eq!(Record::parse(&r.to_text()), Some(r));
        assert_eq!(Record::parse("quicdemux-last-rotation 1\nat_unix_ms 5\n"), None);
        assert_eq!(Record::parse("nonsense"), None);
        assert_eq!(Record::parse(&(r.to_text() + "extra 1\n")), None);
    }

    #[test]
    fn three_lifetimes_apart_using_the_longer_lifetime() {
        let last = Some(Record { at_unix_ms: 10_000, cid_lifetime_ms: 2_000 });
        assert_eq!(wait_needed(None, Some(Duration::from_secs(2)), 10_000), None, "first rotation");
        // Two lifetimes are not enough: a CID may still be in use then.
        assert_eq!(wait_needed(last, Some(Duration::from_secs(2)), 14_000), Some(Duration::from_millis(2_000)));
        assert_eq!(wait_needed(last, Some(Duration::from_secs(2)), 15_999), Some(Duration::from_millis(1)));
        assert_eq!(wait_needed(last, Some(Duration::from_secs(2)), 16_000), None, "exactly 3 × lifetime");
        // The controller now runs a longer lifetime: CIDs may live that long.
        assert_eq!(wait_needed(last, Some(Duration::from_secs(5)), 16_000), Some(Duration::from_millis(9_000)));
        // Offline (no lifetime known here): the recorded one.
        assert_eq!(wait_needed(last, None, 15_500), Some(Duration::from_millis(500)));
    }
}
