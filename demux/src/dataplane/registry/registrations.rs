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

/// One whole `SERVER_ID PID` line, or None.
fn parse_line(l: &str) -> Option<(u16, i32)> {
    let mut it = l.split_whitespace();
    let id = it.next()?.parse::<u16>().ok()?;
    let pid = it.next()?.parse::<i32>().ok()?;
    it.next().is_none().then_some((id, pid))
}

/// The pid that registered `server_id` in the registrations text, if any. Lines
/// that do not parse are ignored (their id counts as not registered).
pub(super) fn registered_pid(text: &str, server_id: u16) -> Option<i32> {
    text.lines().filter_map(parse_line).find_map(|(id, pid)| (id == server_id).then_some(pid))
}

/// The server ids a restarted data plane waits for (`--rejoin-grace-ms`): registered
/// in `text` by a process `alive` says still runs, and not in `live`. Sorted, each
/// once. A worker that died, or was never more than a line in the file, is not
/// waited for: its clients get their stateless resets at once.
pub(super) fn awaited_ids(text: &str, live: &[u16], alive: impl Fn(i32) -> bool) -> Vec<u16> {
    let mut ids: Vec<u16> = text
        .lines()
        .filter_map(parse_line)
        .filter(|&(id, pid)| pid > 0 && !live.contains(&id) && alive(pid))
        .map(|(id, _)| id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Whether process `pid` exists (a zombie still does, until it is reaped).
pub(super) fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
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
        let cred = sys::sockopt::peer_cred(raw);
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

    #[test]
    fn awaited_ids_are_the_registered_running_not_live_ones() {
        let text = "7 100\n3 200\nbad line\n5 300 extra\n9 400\n3 201\n11 0\n12 -4\n13 500\n";
        let alive = |pid: i32| pid != 400;
        // 9's process is gone, 13 is live already, 5's line is not whole, 11 and
        // 12 have no real pid; 3 is listed twice.
        assert_eq!(awaited_ids(text, &[13], alive), vec![3, 7]);
        assert_eq!(awaited_ids(text, &[3, 7, 13], alive), Vec::<u16>::new());
        assert_eq!(awaited_ids(text, &[], |_| true), vec![3, 7, 9, 13]);
        assert_eq!(awaited_ids("", &[], |_| true), Vec::<u16>::new());
    }

    #[test]
    fn process_exists_sees_us_and_not_a_reaped_child() {
        assert!(process_exists(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!process_exists(pid));
    }
}
