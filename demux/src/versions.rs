//! The responder's side of every hello (docs/wire.md "Versions", docs/adr/0006):
//! the data plane on data.sock and its control socket, the controller on
//! control.sock. A hello's window is negotiated with this process's
//! (`sys::protocol::window`): the highest version both speak is answered with
//! `Welcome` in it, and the connection uses it from then on; no common version is
//! refused with an `Error` naming both, counted (`peer_refused.version`) and logged
//! at most once per `trust::LOG_INTERVAL` — never a silent `malformed`.

use crate::trust::{self, Refusal};
use proto::wire::version::VersionRefused;
use proto::wire::{Message, Window};
use std::os::fd::{AsRawFd, BorrowedFd};
use sys::seqpacket::Channel;

/// Answers a hello that announced `theirs` on `fd` (`socket` names it in the log):
/// `Welcome` with `our_caps` in the negotiated version, which it returns. `None`:
/// refused; the caller closes the connection. A `Welcome` that cannot be sent (a
/// peer that sent its request behind the hello and hung up) does not stop the
/// records already queued from being read.
pub fn answer<M: Message>(fd: BorrowedFd<'_>, socket: &str, theirs: Window, our_caps: u64) -> Option<u8> {
    match sys::protocol::window().negotiate(theirs) {
        Ok(v) => {
            if let Err(e) = Channel::<M>::new(fd).dont_wait().at(v).send(&M::welcome(v, our_caps)) {
                tracing::debug!(socket, error = %e, "could not send Welcome");
            }
            Some(v)
        }
        Err(refused) => {
            refuse::<M>(fd, socket, refused);
            None
        }
    }
}

/// A record in protocol version `version`, which this process does not speak
/// (`WireError::UnsupportedVersion`: a peer of another window, or a build before
/// negotiation): refused like a hello of that version.
pub fn refuse_record<M: Message>(fd: BorrowedFd<'_>, socket: &str, version: u8) {
    let theirs = Window { oldest: version, newest: version };
    refuse::<M>(fd, socket, VersionRefused { ours: sys::protocol::window(), theirs });
}

/// Sends the `Error` (in the peer's own newest version, so the peer reads it even
/// when it knows no other), counts and logs the refusal.
fn refuse<M: Message>(fd: BorrowedFd<'_>, socket: &str, refused: VersionRefused) {
    let reason = refused.to_string();
    let _ = Channel::<M>::new(fd).dont_wait().at(refused.theirs.newest).send(&M::error(reason.clone()));
    trust::discard_pending(fd.as_raw_fd());
    let cred = sys::sockopt::peer_cred(fd.as_raw_fd()).ok();
    trust::note_refusal(socket, cred.as_ref(), Refusal::Version, &reason);
}
