//! Processes the controller supervises: the data plane and the spawned workers.
//!
//! Each runs in its own process group (so a terminal's Ctrl-C reaches only the
//! controller, and the controller's death — even SIGKILL — leaves them running, to
//! be adopted by the next controller). A process is either our
//! child (reaped with `try_wait`) or adopted from a previous controller (watched
//! through a pidfd, pidfd_open(2)). An adopted process can still be our child: the
//! controller that re-executed itself for an upgrade (controller/upgrade.rs) keeps
//! its pid and so its children; those are reaped through the pidfd
//! (waitid(2) `P_PIDFD`).

use anyhow::{Context, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub enum Proc {
    Child(Child),
    Adopted { pid: i32, pidfd: OwnedFd },
}

impl Proc {
    pub fn pid(&self) -> i32 {
        match self {
            Proc::Child(c) => c.id() as i32,
            Proc::Adopted { pid, .. } => *pid,
        }
    }

    /// Adopts a running process that is not our child.
    pub fn adopt(pid: i32) -> std::io::Result<Proc> {
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = sys::owned(fd as libc::c_int)?;
        Ok(Proc::Adopted { pid, pidfd })
    }

    /// `Some(how it ended)` once the process has exited (reaped if it is our child).
    pub fn poll_exit(&mut self) -> Option<String> {
        match self {
            Proc::Child(c) => match c.try_wait() {
                Ok(Some(st)) => Some(describe(st)),
                Ok(None) => None,
                Err(e) => Some(format!("wait failed: {e}")),
            },
            Proc::Adopted { pidfd, .. } => {
                if let Some(how) = reap_pidfd(pidfd.as_raw_fd()) {
                    return Some(how);
                }
                let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: polls one live pollfd without blocking.
                let r = unsafe { libc::poll(&mut p, 1, 0) };
                (r > 0).then(|| "exited (adopted process; status unknown)".to_string())
            }
        }
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) with a pid we supervise.
        unsafe { libc::kill(self.pid(), sig) };
    }
}

/// waitid(2) `P_PIDFD`, without blocking: `Some(how it ended)` once an adopted
/// process that is our child (a re-executed controller's) has exited, now reaped;
/// `None` while it runs or when it is not our child (ECHILD: then only the pidfd's
/// readability tells its exit).
fn reap_pidfd(pidfd: RawFd) -> Option<String> {
    // SAFETY: siginfo_t is plain old data.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on a live pidfd we own, writing into `info`.
    let r = unsafe { libc::waitid(libc::P_PIDFD, pidfd as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG) };
    // SAFETY: si_pid/si_status are valid to read for a siginfo waitid(2) filled.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if r != 0 || pid == 0 {
        return None;
    }
    Some(match info.si_code {
        libc::CLD_EXITED => format!("exit code {status}"),
        libc::CLD_KILLED | libc::CLD_DUMPED => format!("killed by signal {status}"),
        _ => "exited".into(),
    })
}

fn describe(st: std::process::ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "exited".into(),
    }
}

/// Starts the data plane (`demux dataplane --inherit-fds …`) on the controller's
/// sockets: only those fds lose close-on-exec, in the child, between fork and exec.
pub fn spawn_dataplane(exe: &Path, fds: &[RawFd], args: &[String]) -> Result<Child> {
    let list = fds.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(exe);
    cmd.arg("dataplane").arg("--inherit-fds").arg(list).args(args);
    cmd.stdin(Stdio::null()).process_group(0);
    for v in super::systemd::MAIN_ONLY_ENV {
        cmd.env_remove(v);
    }
    let keep = fds.to_vec();
    // SAFETY: the closure runs in the forked child before exec and only calls
    // fcntl(2) and sigprocmask(2), which are async-signal-safe; it allocates nothing
    // (`keep` was built before the fork).
    unsafe {
        cmd.pre_exec(move || {
            unblock_all_signals()?;
            for &fd in &keep {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("starting the data plane ({})", exe.display()))
}

/// The controller blocks SIGTERM/SIGINT/SIGHUP/SIGCHLD (it takes them from a
/// signalfd) and a blocked mask survives exec: children must start with none.
/// Async-signal-safe (called between fork and exec).
fn unblock_all_signals() -> std::io::Result<()> {
    // SAFETY: sigemptyset initialises the set; sigprocmask only changes this
    // (single-threaded, forked) process's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Starts one worker registering on `control`; with `user` (`--worker-user`, resolved
/// before this call) it runs as that user.
pub fn spawn_worker(
    bin: &Path,
    control: &Path,
    extra: &[String],
    user: Option<&crate::trust::WorkerUser>,
) -> Result<Child> {
    let mut cmd = Command::new(bin);
    cmd.arg("--server-id-from-controller").arg("--control").arg(control).args(extra);
    cmd.stdin(Stdio::null()).process_group(0);
    for v in super::systemd::MAIN_ONLY_ENV {
        cmd.env_remove(v);
    }
    let user = user.cloned();
    // SAFETY: the closure runs between fork and exec and only calls sigprocmask(2),
    // setgroups(2), setgid(2) and setuid(2), all async-signal-safe; it allocates
    // nothing (`user` was resolved and moved in before the fork).
    unsafe {
        cmd.pre_exec(move || {
            unblock_all_signals()?;
            if let Some(u) = &user {
                u.drop_privileges()?;
            }
            Ok(())
        })
    };
    cmd.spawn().with_context(|| format!("starting worker {}", bin.display()))
}

/// Whether `pid` is a worker registered on `control` (its command line says so):
/// guards against pid reuse before signalling or adopting a pid from a state file.
pub fn is_our_worker(pid: i32, control: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let ctl = control.as_os_str().as_encoded_bytes();
    args.iter().any(|a| *a == b"--server-id-from-controller") && args.contains(&ctl)
}

/// Whether `pid` is a data plane serving `dataplane_sock` (command line check).
pub fn is_our_dataplane(pid: i32, dataplane_sock: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let s = dataplane_sock.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|a| a == s)
}
