//! The data plane's signals: SIGTERM/SIGINT end the process after removing its socket
//! and ready files; SIGHUP is read from a signalfd by the registry (key reload).

use anyhow::{bail, Context, Result};

/// SIGTERM / SIGINT: remove our socket and ready files, exit 0. The signals are
/// blocked in every thread (the mask is inherited by the threads spawned after
/// this) and taken synchronously by one thread with sigwait(3).
pub fn exit_on_signal(paths: Vec<std::path::PathBuf>) -> Result<()> {
    let set = sys::signals::sigset(&[libc::SIGTERM, libc::SIGINT]);
    // SIGHUP is blocked too: the registry takes it from its signalfd (key reload).
    if let Err(e) = sys::signals::block(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]) {
        bail!("pthread_sigmask: {e}");
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
    sys::signals::signalfd(&[libc::SIGHUP]).context("signalfd(SIGHUP)")
}
