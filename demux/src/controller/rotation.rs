//! Key rotation without a split (trust and keys issue, item 2). Invariant: every
//! generation a worker may mint CIDs with is one the data plane decodes.
//!
//! 1. Pacing (`pacing`): refused within 2 × `--cid-lifetime` of the last rotation
//!    unless forced.
//! 2. The new key file is written (a data plane that restarts now reads it).
//! 3. The data plane gets `KeysChanged` and must acknowledge it (`tell_dataplane`:
//!    the `Status` answer to a `StatusRequest` behind it, bounded by a timeout).
//! 4. No acknowledgement (not running, stopped, refused, timed out): roll back — the
//!    previous key file is restored, the counter and the pacing record are
//!    untouched, the data plane is told the previous keys again (best effort: a
//!    data plane that applies the late update still decodes the previous newest,
//!    which is what every worker keeps minting with), and the operator gets the
//!    error. Workers never hear of the rolled-back generation.
//! 5. Acknowledged: the counter and `DIR/last-rotation` are stored, then every
//!    registered worker gets `KeysChanged`.
//!
//! Adoption (controller restart) and an offline `rotate-keys` are covered by
//! `resync_adopted`: the adopted data plane gets the file's keys, acknowledged,
//! before the control socket exists, so no worker can rejoin with keys it lacks.

use super::conns::tell_dataplane;
use super::{pacing, state, Ctl, Kind};
use crate::seqpacket;
use anyhow::{Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::{encode_control, Control};
use std::os::fd::AsRawFd;
use std::time::Duration;

impl Ctl {
    pub(super) fn cid_lifetime(&self) -> Duration {
        Duration::from_secs(self.opts.cid_lifetime)
    }

    /// Rotates the key generation (module docs); on error nothing changed.
    pub(super) fn rotate(&mut self, why: &str, prf: Option<proto::cid::Prf>, force: bool) -> Result<()> {
        pacing::check(&self.paths, Some(self.cid_lifetime()), force)?;
        let old = self.keys.clone();
        let k = state::rotate_keys(&self.paths, &self.keys, prf)?;
        let changed = Control::KeysChanged { keys: k.keys.clone() };
        if let Err(e) = tell_dataplane(&self.paths.dataplane_sock(), &changed) {
            let restored = state::write_atomic(&self.paths.keys(), &old.to_text());
            send_nowait(&self.paths.dataplane_sock(), &Control::KeysChanged { keys: old.keys.clone() });
            tracing::error!(
                error = %format!("{e:#}"), kept = old.keys.newest.generation.get(),
                "the data plane did not confirm the new keys: rotation rolled back"
            );
            restored.context("rolling back the key file after the data plane did not confirm the new keys")?;
            anyhow::bail!(
                "the data plane did not confirm the new keys ({e:#}); rotation rolled back: key generation {} stays \
                 the newest (no worker was told about the new one)",
                old.keys.newest.generation.get()
            );
        }
        self.keys = k;
        self.counter.starts_in_generation = 0;
        if let Err(e) = state::store_counter(&self.paths, self.counter) {
            tracing::warn!(error = %format!("{e:#}"), "could not store the server-id counter after a rotation");
        }
        let rec = pacing::Record {
            at_unix_ms: pacing::now_unix_ms(),
            cid_lifetime_ms: self.cid_lifetime().as_millis() as u64,
        };
        if let Err(e) = pacing::store(&self.paths, rec) {
            tracing::warn!(error = %format!("{e:#}"), "could not record the rotation time");
        }
        tracing::info!(
            why, newest = self.keys.keys.newest.generation.get(), prf = %self.keys.keys.newest.prf,
            previous = ?self.keys.keys.previous.map(|p| p.generation.get()), "CID key generation rotated"
        );
        let rec = encode_control(&changed);
        let workers: Vec<u64> =
            self.conns.iter().filter(|(_, c)| matches!(c.kind, Kind::Worker { .. })).map(|(t, _)| *t).collect();
        for t in workers {
            let raw = self.conns.get(&t).map(|c| c.fd.as_raw_fd()).unwrap_or(-1);
            if let Err(e) = seqpacket::send(raw, &rec, &[], libc::MSG_DONTWAIT) {
                self.close(t, &format!("sending KeysChanged: {e}"));
            }
        }
        Ok(())
    }
}

/// Adoption: the adopted data plane may hold other keys than the file (an offline
/// `rotate-keys`, a rolled-back rotation it applied late): it gets the file's,
/// acknowledged, before any worker can rejoin. No acknowledgement stops start-up.
pub(super) fn resync_adopted(p: &state::Paths, pid: i32, keys: &KeyFile) -> Result<()> {
    tell_dataplane(&p.dataplane_sock(), &Control::KeysChanged { keys: keys.keys.clone() }).with_context(|| {
        format!(
            "the adopted data plane (pid {pid}) did not take the key file's keys (generation {}); workers would mint \
             CIDs it cannot decode. Refusing to start: check it (kill -CONT {pid}?) or stop it (kill {pid})",
            keys.keys.newest.generation.get()
        )
    })?;
    tracing::info!(pid, newest = keys.keys.newest.generation.get(), "adopted data plane has the key file's keys");
    Ok(())
}

/// One message to the data plane without waiting (best effort).
fn send_nowait(path: &std::path::Path, m: &Control) {
    if let Ok(fd) = seqpacket::connect(path) {
        let _ = seqpacket::send(fd.as_raw_fd(), &encode_control(m), &[], libc::MSG_DONTWAIT);
    }
}
