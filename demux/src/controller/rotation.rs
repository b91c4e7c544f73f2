//! Key rotation without a split (docs/adr/0001, docs/adr/0005). Invariant: every
//! generation a worker may mint CIDs with is one the data plane decodes.
//!
//! 1. Pacing (`pacing`): refused within 3 × `--cid-lifetime` of the last rotation
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
//! 5. Acknowledged: the counter is stored, every registered worker gets
//!    `KeysChanged`, then `DIR/last-rotation` is stored (the pacing interval starts
//!    once no worker mints with the previous newest generation any more).
//!
//! A generation in another CID format than adr1 (ADR 0007) reaches only peers of
//! protocol version 4 on: a rotation that would make one live is refused while a
//! registered worker negotiated an older version (naming it); a data plane of an
//! older version refuses the `KeysChanged` (its reader does not know the PRF code the
//! generation is written with), so the rotation rolls back (step 4).
//!
//! Adoption (controller restart) and an offline `rotate-keys` are covered by
//! `resync_adopted`: the adopted data plane gets the file's keys, acknowledged,
//! before the control socket exists, so no worker can rejoin with keys it lacks.

use super::conns::tell_dataplane;
use super::{pacing, state, Ctl, Kind};
use anyhow::{Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::{Admin, Announce, Registration};
use std::os::fd::AsFd;
use std::time::Duration;
use sys::seqpacket::Channel;

impl Ctl {
    pub(super) fn cid_lifetime(&self) -> Duration {
        Duration::from_secs(self.opts.cid_lifetime)
    }

    /// Rotates the key generation (module docs); on error nothing changed.
    ///
    /// `Activate` (ADR 0005) drops no generation, so it is not paced; it is recorded
    /// like a rotation, because the generation it stops issuing is the one the next
    /// stage drops.
    pub(super) fn rotate(
        &mut self,
        why: &str,
        prf: Option<proto::cid::Prf>,
        force: bool,
        phase: proto::wire::admin::RotatePhase,
        from: Option<&std::path::Path>,
        format: Option<&proto::cid_format::FormatSpec>,
    ) -> Result<()> {
        if phase != proto::wire::admin::RotatePhase::Activate {
            pacing::check(&self.paths, Some(self.cid_lifetime()), force)?;
        }
        let old = self.keys.clone();
        let k = state::next_keys(&self.keys, prf, phase, from, format)?;
        if k.has_other_formats() {
            self.check_workers_read_formats()?;
        }
        state::write_atomic(&self.paths.keys(), &k.to_text())?;
        if let Err(e) = tell_dataplane(&self.paths.dataplane_sock(), &Admin::KeysChanged { keys: k.keys.clone() }) {
            let restored = state::write_atomic(&self.paths.keys(), &old.to_text());
            send_nowait(&self.paths.dataplane_sock(), &Admin::KeysChanged { keys: old.keys.clone() });
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
        if phase != proto::wire::admin::RotatePhase::Stage {
            // Ids are counted per issuing generation.
            self.counter.starts_in_generation = 0;
        }
        if let Err(e) = state::store_counter(&self.paths, self.counter) {
            tracing::warn!(error = %format!("{e:#}"), "could not store the server-id counter after a rotation");
        }
        tracing::info!(
            why, ?phase, newest = self.keys.keys.newest.generation.get(), prf = %self.keys.keys.newest.prf,
            format = %self.keys.keys.newest.format.describe(),
            previous = ?self.keys.keys.previous.map(|p| p.generation.get()), staged = self.keys.is_staged(),
            "CID key generation rotated"
        );
        let changed = Registration::KeysChanged { keys: self.keys.keys.clone() };
        let workers: Vec<u64> = self.conns.iter().filter(|(_, c)| c.kind == Kind::Worker).map(|(t, _)| *t).collect();
        for t in workers {
            let Some(c) = self.conns.get(&t) else { continue };
            if let Err(e) = c.channel::<Registration>().dont_wait().send(&changed) {
                self.close(t, &format!("sending KeysChanged: {e}"));
            }
        }
        let rec = pacing::Record {
            at_unix_ms: pacing::now_unix_ms(),
            cid_lifetime_ms: self.cid_lifetime().as_millis() as u64,
        };
        if let Err(e) = pacing::store(&self.paths, rec) {
            tracing::warn!(error = %format!("{e:#}"), "could not record the rotation time");
        }
        Ok(())
    }
}

impl Ctl {
    /// ADR 0007: every registered worker negotiated a protocol version whose `Keys`
    /// carry CID formats, else an error naming the ones that did not.
    fn check_workers_read_formats(&self) -> Result<()> {
        let old: Vec<String> = self
            .conns
            .values()
            .filter(|c| c.kind == Kind::Worker)
            .filter_map(|c| c.version.filter(|v| *v < proto::wire::CID_FORMAT_VERSION))
            .map(|v| format!("a worker of protocol version {v}"))
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "a quic-lb generation needs protocol version {} on every peer (docs/adr/0007-quic-lb.md); registered: {}              — upgrade them first (`demux upgrade`)",
            proto::wire::CID_FORMAT_VERSION,
            old.join(", ")
        )
    }
}

/// Adoption: the adopted data plane may hold other keys than the file (an offline
/// `rotate-keys`, a rolled-back rotation it applied late): it gets the file's,
/// acknowledged, before any worker can rejoin. No acknowledgement stops start-up.
pub(super) fn resync_adopted(p: &state::Paths, pid: i32, keys: &KeyFile) -> Result<()> {
    tell_dataplane(&p.dataplane_sock(), &Admin::KeysChanged { keys: keys.keys.clone() }).with_context(|| {
        format!(
            "the adopted data plane (pid {pid}) did not take the key file's keys (generation {}); workers would mint \
             CIDs it cannot decode. Refusing to start: check it (kill -CONT {pid}?) or stop it (kill {pid})",
            keys.keys.newest.generation.get()
        )
    })?;
    tracing::info!(pid, newest = keys.keys.newest.generation.get(), "adopted data plane has the key file's keys");
    Ok(())
}

/// One message to the data plane without waiting (best effort): behind the hello,
/// in our newest version, which a data plane of the same or a newer build reads
/// (docs/wire.md "Versions"); an older one refuses it.
fn send_nowait(path: &std::path::Path, m: &Admin) {
    if let Ok(fd) = sys::seqpacket::connect(path) {
        let ch = Channel::<Admin>::new(fd.as_fd()).dont_wait();
        let hello = Admin::Hello { announce: Announce::plain(sys::protocol::window()), pid: std::process::id() };
        let _ = ch.send(&hello).and_then(|()| ch.send(m));
    }
}
