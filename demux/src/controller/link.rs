//! The controller holds one connection open to its data plane's control socket
//! for as long as it runs: the data plane's sign of a controller (its
//! `--orphan-timeout` counts only while no control connection is open and no
//! instance is live; `dataplane::registry::orphan`).

use super::Ctl;
use proto::wire::{Admin, Announce};
use std::os::fd::{AsFd, OwnedFd};
use sys::seqpacket::Channel;

/// The held connection: the data plane's pid it was opened to, and the socket.
pub(crate) type Link = Option<(i32, OwnedFd)>;

impl Ctl {
    /// Once per tick: (re)connects when the data plane runs and is not linked yet
    /// (dropped while none runs; kept while it stops).
    pub(super) fn keep_dataplane_link(&mut self) {
        let Some(pid) = self.lc.dataplane().pid() else {
            self.dp_link = None;
            return;
        };
        if self.dp_link.as_ref().is_some_and(|(p, _)| *p == pid) {
            return;
        }
        // Ready (or adopted): its control socket answers.
        if self.lc.dataplane_running() != Some(pid) {
            return;
        }
        let Ok(fd) = sys::seqpacket::connect(&self.paths.dataplane_sock()) else { return };
        let hello = Admin::Hello { announce: Announce::plain(sys::protocol::window()), pid: std::process::id() };
        if Channel::<Admin>::new(fd.as_fd()).dont_wait().send(&hello).is_ok() {
            tracing::debug!(pid, "holding a connection to the data plane");
            self.dp_link = Some((pid, fd));
        }
    }
}
