//! This process's protocol window (docs/wire.md "Versions"): the versions its
//! hellos announce and the versions [`crate::seqpacket::Channel`] reads. It is this
//! build's, `proto::wire::Window::OWN`, unless the process was started with the
//! hidden test flag `--protocol-version V` ([`relabel`]), which makes it stand for
//! a build that differs from this one only in its version number. Only the command
//! line sets it, once, before any connection: no peer, file or environment can.

use proto::wire::Window;
use std::sync::OnceLock;

static RELABELLED: OnceLock<Window> = OnceLock::new();

/// The window this process announces and reads.
pub fn window() -> Window {
    RELABELLED.get().copied().unwrap_or(Window::OWN)
}

/// `--protocol-version V` (tests only): from now on this process speaks
/// `Window::relabelled(V)`. Call once, at start, before any connection.
pub fn relabel(newest: u8) -> Result<Window, String> {
    let w = Window::relabelled(newest)?;
    RELABELLED.set(w).map_err(|_| "the protocol window is set once, at start".to_string())?;
    Ok(w)
}
