//! Blocked signals and signalfd(2).

use crate::owned;
use std::io;
use std::os::fd::OwnedFd;

/// A `sigset_t` holding exactly `sigs`.
pub fn sigset(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; the sig* calls only touch `set`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks `sigs` in the calling thread (and so in every thread it spawns later).
pub fn block(sigs: &[libc::c_int]) -> io::Result<()> {
    let set = sigset(sigs);
    // SAFETY: blocks the signals in the calling thread; `set` is live.
    match unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } {
        0 => Ok(()),
        r => Err(io::Error::from_raw_os_error(r)),
    }
}

/// A non-blocking, close-on-exec signalfd for `sigs` (block them first).
pub fn signalfd(sigs: &[libc::c_int]) -> io::Result<OwnedFd> {
    let set = sigset(sigs);
    // SAFETY: creates a new signalfd for a live set.
    owned(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })
}
