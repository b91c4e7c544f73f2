//! Who may say `DataHello{server_id}` (docs/operations.md "Trust model"): data.sock
//! admits our uid and the worker uid at accept (`crate::trust::admit`); the hello
//! itself must moreover name a server id that no other live data connection holds
//! and, under a controller (`--registrations`), that the connecting process
//! (SO_PEERCRED pid) registered on control.sock. The controller writes that file
//! (`SERVER_ID PID` per line, 0600, ours) before it sends the worker its `Assign`,
//! so a worker's hello always finds its own line. Refusals are `Error`, close, and
//! counted by reason (`peer_refused` in `lb-status`).

use super::{Conn, Registry};
use crate::trust::{self, Refusal};
use proto::ServerId;
use std::path::Path;

/// The pid that registered `server_id` in the registrations text, if any. Lines
/// that do not parse are ignored (their id counts as not registered).
pub(super) fn registered_pid(text: &str, server_id: u16) -> Option<i32> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let id = it.next()?.parse::<u16>().ok()?;
        let pid = it.next()?.parse::<i32>().ok()?;
        (id == server_id && it.next().is_none()).then_some(pid)
    })
}

/// Why a hello for `server_id` from `peer_pid` is refused under `path` (None: allowed).
fn registration_refusal(path: &Path, server_id: u16, peer_pid: i32) -> Option<(Refusal, String)> {
    let text = match crate::controller::state::read_private(path) {
        Ok(t) => t.unwrap_or_default(),
        Err(e) => return Some((Refusal::Unregistered, format!("server id {server_id}: registrations: {e:#}"))),
    };
    match registered_pid(&text, server_id) {
        None => Some((Refusal::Unregistered, format!("server id {server_id} is not registered with the controller"))),
        Some(pid) if pid != peer_pid => Some((
            Refusal::WrongPid,
            format!("server id {server_id} was registered by pid {pid}, not by pid {peer_pid}"),
        )),
        Some(_) => None,
    }
}

impl Registry {
    /// The data hello's trust checks; refuses (Error, close, counted) and returns
    /// false when `token`'s peer may not take `server_id`.
    pub(super) fn hello_allowed(&mut self, token: u64, server_id: ServerId) -> bool {
        let Some(raw) = self.conns.get(&token).map(Conn::raw) else { return false };
        let cred = crate::sys::peer_cred(raw);
        let dup = self.conns.values().any(|c| matches!(c, Conn::Live { conn, .. } if conn.server_id == server_id.0));
        let refusal = if dup {
            Some((
                Refusal::IdAlreadyLive,
                format!("server id {} is already live on another data connection", server_id.0),
            ))
        } else {
            match (&self.registrations, &cred) {
                (None, _) => None,
                (Some(path), Ok(c)) => registration_refusal(path, server_id.0, c.pid),
                (Some(_), Err(e)) => Some((Refusal::NoCredentials, format!("no peer credentials ({e})"))),
            }
        };
        let Some((why, reason)) = refusal else { return true };
        trust::note_refusal("data.sock", cred.as_ref().ok(), why, &reason);
        self.refuse(token, &reason);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_pid_reads_only_whole_lines_of_that_id() {
        let text = "3 100\n4 200\nbad line\n5 300 extra\n40 400\n";
        assert_eq!(registered_pid(text, 3), Some(100));
        assert_eq!(registered_pid(text, 4), Some(200));
        assert_eq!(registered_pid(text, 5), None, "trailing garbage");
        assert_eq!(registered_pid(text, 40), Some(400));
        assert_eq!(registered_pid(text, 0), None);
        assert_eq!(registered_pid("", 3), None);
    }
}
