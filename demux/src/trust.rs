//! Who may talk to which Unix socket (docs/operations.md "Trust model").
//!
//! File modes are only the first barrier: every accepted connection is checked
//! against the peer's kernel credentials (SO_PEERCRED, `sys::sockopt::peer_cred`)
//! right after accept, and the controller checks each message kind again
//! (`controller/trust.rs`). A refusal is `Error{reason}`, then close; refusals are
//! counted and logged at most once per [`LOG_INTERVAL`] (an attacker cannot flood
//! the log), never a panic.
//!
//! `--worker-user NAME`: [`WorkerUser`] is resolved before any fork; the spawned
//! worker drops to it between fork and exec ([`WorkerUser::drop_privileges`]).

use anyhow::{bail, Context, Result};
use proto::wire::Message;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use sys::seqpacket::Channel;

/// At most one refusal log line per interval (the others are counted in it).
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Which uids may connect to a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPolicy {
    pub uids: Vec<u32>,
}

impl PeerPolicy {
    /// Only our own (effective) uid.
    pub fn only_us() -> PeerPolicy {
        PeerPolicy { uids: vec![euid()] }
    }

    /// Our uid and, if given, the worker uid.
    pub fn us_and(worker_uid: Option<u32>) -> PeerPolicy {
        let mut uids = vec![euid()];
        uids.extend(worker_uid.filter(|u| *u != euid()));
        PeerPolicy { uids }
    }

    pub fn allows(&self, cred: &libc::ucred) -> bool {
        self.uids.contains(&cred.uid)
    }
}

pub fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() }
}

/// Why a peer was refused: the key of its counter in `lb-status --json` /
/// `demux status` (`peer_refused`) and in the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// SO_PEERCRED uid not allowed on this socket (or for this message).
    WrongUid,
    /// SO_PEERCRED failed.
    NoCredentials,
    /// A `Hello`/`Rejoin` names a pid other than the sender's.
    PidMismatch,
    /// The worker uid, from a process the controller did not spawn.
    NotSpawned,
    /// A second registration by a process that holds one.
    AlreadyRegistered,
    /// An operator request (status, rotation, …) from a uid other than ours.
    OperatorOnly,
    /// A data hello for a server id that no registration (of the controller) holds.
    Unregistered,
    /// A data hello for a server id that another pid registered.
    WrongPid,
    /// A data hello for a server id that another data connection holds.
    IdAlreadyLive,
    /// A hello (or record) in protocol versions this build does not speak
    /// (docs/wire.md "Versions", crate::versions).
    Version,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::WrongUid,
        Refusal::NoCredentials,
        Refusal::PidMismatch,
        Refusal::NotSpawned,
        Refusal::AlreadyRegistered,
        Refusal::OperatorOnly,
        Refusal::Unregistered,
        Refusal::WrongPid,
        Refusal::IdAlreadyLive,
        Refusal::Version,
    ];

    /// The counter's key (snake_case).
    pub fn key(self) -> &'static str {
        match self {
            Refusal::WrongUid => "wrong_uid",
            Refusal::NoCredentials => "no_credentials",
            Refusal::PidMismatch => "pid_mismatch",
            Refusal::NotSpawned => "not_spawned",
            Refusal::AlreadyRegistered => "already_registered",
            Refusal::OperatorOnly => "operator_only",
            Refusal::Unregistered => "unregistered",
            Refusal::WrongPid => "wrong_pid",
            Refusal::IdAlreadyLive => "id_already_live",
            Refusal::Version => "version",
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)] // the array initialiser only
const ZERO: AtomicU64 = AtomicU64::new(0);
/// Refusals by [`Refusal`] (its index in [`Refusal::ALL`]), every socket of this process.
static REFUSED: [AtomicU64; Refusal::ALL.len()] = [ZERO; Refusal::ALL.len()];
/// Per [`Refusal`]: when the last one was logged, and how many were not logged
/// since (so a flood of one kind cannot hide another kind's line).
static LOG_STATE: Mutex<[(Option<Instant>, u64); Refusal::ALL.len()]> = Mutex::new([(None, 0); Refusal::ALL.len()]);

fn counter(why: Refusal) -> &'static AtomicU64 {
    &REFUSED[why as usize]
}

/// Refusals of untrusted peers since start (every socket of this process).
pub fn refused_total() -> u64 {
    REFUSED.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// Refusals since start by reason: `{"wrong_uid": n, …}` (every key, zeros too).
pub fn refused_json() -> serde_json::Value {
    let m: serde_json::Map<String, serde_json::Value> =
        Refusal::ALL.iter().map(|r| (r.key().to_string(), counter(*r).load(Ordering::Relaxed).into())).collect();
    serde_json::Value::Object(m)
}

/// Counts a refusal by `why` and logs it unless one of the same kind was logged
/// less than [`LOG_INTERVAL`] ago.
pub fn note_refusal(socket: &str, cred: Option<&libc::ucred>, why: Refusal, reason: &str) {
    counter(why).fetch_add(1, Ordering::Relaxed);
    let total = refused_total();
    let mut all = LOG_STATE.lock().unwrap_or_else(|p| p.into_inner());
    let st = &mut all[why as usize];
    let now = Instant::now();
    if st.0.is_some_and(|t| now.duration_since(t) < LOG_INTERVAL) {
        st.1 += 1;
        return;
    }
    let suppressed = std::mem::take(&mut st.1);
    st.0 = Some(now);
    drop(all);
    let (pid, uid) = cred.map_or((-1, u32::MAX), |c| (c.pid, c.uid));
    let kind = why.key();
    tracing::warn!(
        socket,
        peer_pid = pid,
        peer_uid = uid,
        kind,
        reason,
        total,
        suppressed,
        "refused an untrusted peer"
    );
}

/// Sends `Error{reason}` of conversation `M` without blocking (best effort); the
/// caller closes.
pub fn send_error<M: Message>(fd: BorrowedFd<'_>, reason: &str) {
    let _ = Channel::<M>::new(fd).dont_wait().send(&M::error(reason.to_string()));
}

/// Reads and drops what the peer already sent (a few records at most, without
/// blocking), so that closing does not reset the connection and the peer reads our
/// `Error` (a Unix socket closed with unread data reports ECONNRESET to its peer).
pub(crate) fn discard_pending(fd: RawFd) {
    let mut b = [0u8; 512];
    for _ in 0..8 {
        // SAFETY: receives into a live buffer of the given length.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            return;
        }
    }
}

/// The check right after accept: whether the peer's uid is allowed on `socket`, which
/// carries conversation `M`. A refused peer gets `Error{reason}`; the caller drops
/// `fd` (closing it).
pub fn admit<M: Message>(fd: &OwnedFd, socket: &str, policy: &PeerPolicy) -> bool {
    let (cred, why, reason) = match sys::sockopt::peer_cred(fd.as_raw_fd()) {
        Ok(c) if policy.allows(&c) => return true,
        Ok(c) => (Some(c), Refusal::WrongUid, format!("{socket}: uid {} is not allowed to connect", c.uid)),
        Err(e) => (None, Refusal::NoCredentials, format!("{socket}: no peer credentials ({e})")),
    };
    send_error::<M>(fd.as_fd(), &reason);
    discard_pending(fd.as_raw_fd());
    note_refusal(socket, cred.as_ref(), why, &reason);
    false
}

/// Gives `path` to group `gid` with `mode` (chown keeps our uid as the owner).
pub fn share_with_group(path: &Path, gid: u32, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(path, None, Some(gid)).with_context(|| format!("chgrp {gid} {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// `--worker-user NAME`, resolved (getpwnam_r) before any fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl WorkerUser {
    pub fn resolve(name: &str) -> Result<WorkerUser> {
        let cname = std::ffi::CString::new(name).context("--worker-user: NUL in the name")?;
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: passwd is plain old data; getpwnam_r fills it.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is live for the call; `buf` and its length match;
        // the strings `pw` points to (in `buf`) are not used after it.
        let r = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
        if r != 0 {
            bail!("--worker-user {name}: getpwnam_r: {}", std::io::Error::from_raw_os_error(r));
        }
        if found.is_null() {
            bail!("--worker-user {name}: no such user");
        }
        if pw.pw_uid == 0 {
            bail!("--worker-user {name} is uid 0: workers would run with every privilege; name an unprivileged user");
        }
        Ok(WorkerUser { name: name.to_string(), uid: pw.pw_uid, gid: pw.pw_gid })
    }

    /// Between fork and exec: supplementary groups = only the user's group, then gid,
    /// then uid (in that order: after setuid we could not change groups). Only
    /// setgroups(2), setgid(2), setuid(2): async-signal-safe, nothing allocated. The
    /// raw syscalls change this (single-threaded, forked) process only.
    pub fn drop_privileges(&self) -> std::io::Result<()> {
        let groups = [self.gid as libc::gid_t];
        // SAFETY: setgroups reads one gid from a live array.
        sys::cvt(unsafe { libc::setgroups(1, groups.as_ptr()) })?;
        // SAFETY: plain syscalls taking integers.
        sys::cvt(unsafe { libc::setgid(self.gid) })?;
        // SAFETY: as above.
        sys::cvt(unsafe { libc::setuid(self.uid) })?;
        // Cannot regain root: a failure here means the drop did not happen.
        // SAFETY: as above.
        // (No allocation on this path either: a raw errno.)
        if unsafe { libc::setuid(0) } == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_allows_listed_uids_only() {
        let p = PeerPolicy { uids: vec![0, 999] };
        let c = |uid| libc::ucred { pid: 1, uid, gid: 0 };
        assert!(p.allows(&c(0)) && p.allows(&c(999)));
        assert!(!p.allows(&c(1000)));
        assert_eq!(PeerPolicy::us_and(Some(euid())).uids, vec![euid()], "no duplicate");
    }

    #[test]
    fn peer_cred_of_a_socketpair_is_us() {
        let mut sv = [0; 2];
        // SAFETY: socketpair writes two fds into `sv`.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) }, 0);
        let a = sys::owned(sv[0]).unwrap();
        let _b = sys::owned(sv[1]).unwrap();
        let c = sys::sockopt::peer_cred(a.as_raw_fd()).unwrap();
        assert_eq!((c.pid as u32, c.uid), (std::process::id(), euid()));
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let before = refused_json();
        note_refusal("test.sock", None, Refusal::WrongPid, "a test refusal");
        note_refusal("test.sock", None, Refusal::WrongPid, "a test refusal");
        let after = refused_json();
        for r in Refusal::ALL {
            let (b, a) = (before[r.key()].as_u64().unwrap(), after[r.key()].as_u64().unwrap());
            // Other tests of this binary may refuse concurrently, never WrongPid.
            if r == Refusal::WrongPid {
                assert_eq!(a, b + 2, "{}", r.key());
            }
        }
        assert_eq!(after.as_object().unwrap().len(), Refusal::ALL.len());
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "ALL is in declaration order");
        }
    }

    #[test]
    fn root_is_not_a_worker_user() {
        assert!(WorkerUser::resolve("root").is_err());
        assert!(WorkerUser::resolve("no-such-user-quicdemux").is_err());
    }
}
