//! The controller's side of the trust model (docs/operations.md "Trust model";
//! policy types in `crate::trust`).
//!
//! - At accept: the peer's uid (SO_PEERCRED) must be the controller's or the
//!   `--worker-user`'s; anyone else is refused before sending a byte.
//! - Per message ([`Ctl::authorize`], before the state machine in `conns.rs`):
//!   operator requests (admin `Hello`, `StatusRequest`, `RotateKeys`)
//!   only from the controller's uid; a worker's `Hello`/`Rejoin` must name the pid
//!   that actually connected; from the worker uid it must moreover come from a
//!   process this controller spawned (or adopted from `DIR/workers`) that holds no
//!   registration yet: the worker uid cannot register anything else, nor a second
//!   identity.

use super::Ctl;
use crate::cli::ControllerOpts;
use crate::trust::{self as policy, PeerPolicy, Refusal, WorkerUser};
use anyhow::{bail, Result};
use proto::wire::{Admin, ControlSocket, Registration};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

pub(super) fn resolve_worker_user(opts: &ControllerOpts) -> Result<Option<WorkerUser>> {
    let Some(name) = &opts.worker_user else { return Ok(None) };
    if policy::euid() != 0 {
        bail!("--worker-user {name} needs the controller to run as root (it starts the workers as that user)");
    }
    let u = WorkerUser::resolve(name)?;
    tracing::info!(user = %u.name, uid = u.uid, gid = u.gid, "spawned workers run unprivileged");
    Ok(Some(u))
}

/// `DIR/registrations`: `SERVER_ID PID` per registered worker, read by the data plane
/// on every data hello (`dataplane/registry/registrations.rs`).
pub(super) fn registrations_path(paths: &super::state::Paths) -> std::path::PathBuf {
    paths.dir.join("registrations")
}

/// The data plane's trust flags: `--registrations` (a data hello must come from the
/// pid that registered its server id) and `--worker-uid/--worker-gid` (data.sock
/// accepts that uid and is 0660 for that group).
pub(super) fn dataplane_trust_args(paths: &super::state::Paths, user: Option<&WorkerUser>) -> Vec<String> {
    let mut v = vec!["--registrations".to_string(), registrations_path(paths).display().to_string()];
    if let Some(u) = user {
        v.extend(["--worker-uid".into(), u.uid.to_string(), "--worker-gid".into(), u.gid.to_string()]);
    }
    v
}

/// control.sock 0660 for the worker user's group (it stays 0600 without one).
pub(super) fn share_control_sock(paths: &super::state::Paths, user: Option<&WorkerUser>) -> Result<()> {
    match user {
        Some(u) => policy::share_with_group(&paths.control_sock(), u.gid, 0o660),
        None => Ok(()),
    }
}

impl Ctl {
    /// Rewrites `DIR/registrations` from the registered workers, plus `adding` (a
    /// registration about to be answered: written before its `Assign`, so that the
    /// worker's data hello finds it).
    pub(super) fn store_registrations(&self, adding: Option<(u16, u32)>) -> Result<()> {
        let mut lines: Vec<(u16, u32)> = self.lc.registrations().chain(adding).collect();
        lines.sort_unstable();
        let text: String = lines.iter().map(|(id, pid)| format!("{id} {pid}\n")).collect();
        super::state::write_atomic(&registrations_path(&self.paths), &text)
    }

    fn worker_uid(&self) -> Option<u32> {
        self.worker_user.as_ref().map(|u| u.uid)
    }

    /// Right after accept: only our uid and the worker uid may connect at all.
    pub(super) fn admit_peer(&self, fd: &OwnedFd) -> bool {
        policy::admit::<ControlSocket>(fd, "control.sock", &PeerPolicy::us_and(self.worker_uid()))
    }

    /// Whether the peer of `token` may send `m`; refuses (Error, close, counted,
    /// rate-limited log) and returns false if not.
    pub(super) fn authorize(&mut self, token: u64, m: &ControlSocket) -> bool {
        let Some(conn) = self.conns.get(&token) else { return false };
        let raw = conn.fd.as_raw_fd();
        let (cred, refusal) = match sys::sockopt::peer_cred(raw) {
            Ok(c) => (Some(c), self.refusal(&c, m)),
            Err(e) => (None, Some((Refusal::NoCredentials, format!("no peer credentials ({e})")))),
        };
        let Some((why, reason)) = refusal else { return true };
        policy::send_error::<ControlSocket>(conn.fd.as_fd(), &reason);
        policy::note_refusal("control.sock", cred.as_ref(), why, &reason);
        self.close(token, &reason);
        false
    }

    /// Why `cred` may not send `m` (None: it may).
    fn refusal(&self, cred: &libc::ucred, m: &ControlSocket) -> Option<(Refusal, String)> {
        let ours = cred.uid == policy::euid();
        match m {
            ControlSocket::Registration(Registration::Hello { pid, .. } | Registration::Rejoin { pid, .. }) => {
                if !ours && Some(cred.uid) != self.worker_uid() {
                    return Some((Refusal::WrongUid, format!("uid {} may not register workers", cred.uid)));
                }
                if i64::from(*pid) != i64::from(cred.pid) {
                    return Some((
                        Refusal::PidMismatch,
                        format!("the message says pid {pid} but pid {} sent it", cred.pid),
                    ));
                }
                if !ours {
                    // The worker uid is the one exposed to the internet: only processes
                    // we started may use it, each for one registration.
                    let pid = cred.pid as u32;
                    if !self.lc.is_managed_pid(pid) {
                        return Some((
                            Refusal::NotSpawned,
                            format!("pid {} was not spawned by this controller", cred.pid),
                        ));
                    }
                    if self.lc.pid_registered(pid) {
                        return Some((Refusal::AlreadyRegistered, format!("pid {} is already registered", cred.pid)));
                    }
                }
                None
            }
            ControlSocket::Admin(Admin::Hello { .. } | Admin::StatusRequest | Admin::RotateKeys { .. }) if !ours => {
                let reason = format!("operator requests only from uid {} (not uid {})", policy::euid(), cred.uid);
                Some((Refusal::OperatorOnly, reason))
            }
            _ => None,
        }
    }
}
