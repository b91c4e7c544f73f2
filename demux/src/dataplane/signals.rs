//! The data plane's signals: SIGTERM/SIGINT end the process after removing its socket
//! and ready files; SIGHUP is read from a signalfd by the registry (key reload).

use crate::sys;
use anyhow::{bail, Context, Result};

/// SIGTERM / SIGINT: remove our socket and ready files, exit 0. The signals are
/// blocked in every thread (the mask is inherited by the threads spawned after
/// this) and taken synchronously by one thread with sigwait(3).
pub fn exit_on_signal(paths: Vec<std::path::PathBuf>) -> Result<()> {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    };
    let mut blocked = set;
    // SAFETY: adds to a live sigset_t.
    unsafe { libc::sigaddset(&mut blocked, libc::SIGHUP) };
    // SAFETY: blocks the signals in the calling thread; `blocked` is live. SIGHUP is
    // blocked too: the registry takes it from its signalfd (key reload).
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut()) };
    if r != 0 {
        bail!("pthread_sigmask: {}", std::io::Error::from_raw_os_error(r));
    }
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: waits for one of the blocked signals in `set`.
            let r = unsafe { libc::sigwait(&set, &mut sig) };
            for p in &paths {
                let _ = std::fs::remove_file(p);
            }
            tracing::info!(signal = sig, sigwait = r, "exiting on signal");
            std::process::exit(0);
        })
        .context("spawning the signal thread")?;
    Ok(())
}

/// A signalfd for SIGHUP (blocked in every thread by exit_on_signal): the registry
/// re-reads the key file when it fires.
pub fn reload_signal_fd() -> Result<std::os::fd::OwnedFd> {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    };
    // SAFETY: creates a new signalfd for a live set.
    sys::owned(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })
        .context("signalfd(SIGHUP)")
}
