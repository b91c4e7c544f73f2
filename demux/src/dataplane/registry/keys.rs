//! New CID keys: `KeysChanged` on the control socket, or SIGHUP (standalone
//! rotation), which re-reads the key file. Either publishes a new snapshot and
//! updates the kernel fast path; either makes forwarding take the key file's
//! forwarding secrets (ADR 0005 §3).

use super::Registry;
use proto::KeySet;
use std::os::fd::AsRawFd;

/// One `signalfd_siginfo` (signalfd(2)): what one read of the reload signalfd returns.
const SIGNALFD_RECORD: usize = 128;

impl Registry {
    pub(super) fn set_keys(&mut self, keys: KeySet, why: &str) {
        tracing::info!(newest = self.keys_generation(&keys), why, "CID keys changed");
        if let Some(fp) = self.fast_path.active() {
            // The program decodes exactly the generations the user path decodes.
            if let Err(e) = fp.set_keys(&keys) {
                tracing::error!(error = %e, "fast path: key update failed; such datagrams take the user path");
            }
        }
        self.keys = keys;
        self.publish();
    }

    fn keys_generation(&self, keys: &KeySet) -> u8 {
        keys.newest().get()
    }

    /// SIGHUP: re-read the key file (standalone rotation). A bad file keeps the old keys.
    pub(super) fn on_reload_signal(&mut self) {
        let Some(fd) = &self.reload_signal else { return };
        // Drain the signalfd (one signalfd_siginfo per pending signal).
        let mut info = [0u8; SIGNALFD_RECORD];
        // SAFETY: reads into a live buffer of its own length from our non-blocking signalfd.
        while unsafe { libc::read(fd.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) } > 0 {}
        if let Some(p) = &self.peers {
            p.reload();
        }
        let loaded = self.read_key_file().and_then(|k| k.key_set().map(|ks| (ks, k)).map_err(|e| format!("{e:?}")));
        match loaded {
            Ok((ks, k)) => {
                self.rendezvous_key = k.rendezvous_key;
                self.set_forwarding_keys(&k);
                self.set_keys(ks, "SIGHUP: key file re-read");
            }
            Err(e) => tracing::warn!(path = %self.keys_path.display(), error = %e, "SIGHUP: key file not reloaded"),
        }
    }

    fn read_key_file(&self) -> Result<proto::keyfile::KeyFile, String> {
        let t = std::fs::read_to_string(&self.keys_path).map_err(|e| e.to_string())?;
        proto::keyfile::KeyFile::parse(&t).map_err(|e| e.to_string())
    }

    fn set_forwarding_keys(&self, k: &proto::keyfile::KeyFile) {
        if let Some(p) = &self.peers {
            p.set_keys(proto::peer::FrameKeys::of(k));
        }
    }

    /// `KeysChanged` (a rotation by the controller, which wrote the key file first):
    /// the forwarding secrets, which that message does not carry (ADR 0005 §4: they
    /// travel only in the key file), are re-read from the file. A file that does not
    /// read keeps the current ones.
    pub(super) fn reload_forwarding_keys(&self) {
        if self.peers.is_none() {
            return;
        }
        match self.read_key_file() {
            Ok(k) => self.set_forwarding_keys(&k),
            Err(e) => tracing::warn!(
                path = %self.keys_path.display(), error = %e, "forwarding secrets not re-read; keeping the current ones"
            ),
        }
    }
}
