//! The data hello (steps 1 and 2 of the protocol in the parent module): a
//! `DataHello` is answered with `Welcome` in the negotiated version (or refused,
//! crate::versions), then in that version `Sockets`, `FastSockets` (`CAP_FAST_PATH`
//! on both sides) and `Rings`, and the connection becomes live.

use super::{Conn, Registry};
use crate::dataplane::ring::Producer;
use crate::dataplane::snapshot::DataConn;
use proto::wire::data::{CAPS_KNOWN, CAP_FAST_PATH, CAP_RINGS, MAX_RINGS};
use proto::wire::version::common_caps;
use proto::wire::{Announce, Data};
use proto::ServerId;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use sys::seqpacket::Channel;

/// The data capabilities this data plane announces in its `Welcome`: every one it
/// knows (whether rings or a fast path are on is said by `Rings` and `FastSockets`).
const OUR_CAPS: u64 = CAPS_KNOWN;

/// What a worker asked for in its data hello: the capabilities both announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Wants {
    rings: bool,
    fast_path: bool,
}

impl Wants {
    /// Unknown bits are ignored (docs/wire.md "Versions").
    fn from_caps(theirs: u64) -> Wants {
        let caps = common_caps(OUR_CAPS, theirs, CAPS_KNOWN);
        Wants { rings: caps & CAP_RINGS != 0, fast_path: caps & CAP_FAST_PATH != 0 }
    }
}

impl Registry {
    /// The last answer to every `DataHello`: `Rings`, with one ring per shard when
    /// `--forward ring` and the worker asked (`wanted`), and with host-to-host
    /// forwarding one more, last, for the peer thread's hand-over
    /// (crate::dataplane::peers); else count 0.
    /// Any failure leaves the worker on SEQPACKET frames (empty vector).
    fn offer_rings(&self, conn: Channel<'_, Data>, server_id: ServerId, wanted: bool) -> Vec<Producer> {
        let count = self.counters.len() + usize::from(self.peers.is_some());
        let made: std::io::Result<Vec<_>> = match self.ring_bytes {
            Some(bytes) if wanted && count <= usize::from(MAX_RINGS) => {
                (0..count).map(|_| Producer::create(bytes)).collect()
            }
            _ => Ok(Vec::new()),
        };
        let rings = made.unwrap_or_else(|e| {
            tracing::warn!(server_id = server_id.0, error = %e, "could not create rings; SEQPACKET frames");
            Vec::new()
        });
        let bytes = if rings.is_empty() { 0 } else { self.ring_bytes.unwrap_or(0) };
        let fds: Vec<RawFd> = rings.iter().flat_map(|r| r.fds().map(|f| f.as_raw_fd())).collect();
        match conn.send_with_raw_fds(&Data::Rings { count: rings.len() as u8, bytes }, &fds) {
            Ok(_) => {
                if !rings.is_empty() {
                    tracing::info!(server_id = server_id.0, rings = rings.len(), bytes, "forwarding over rings");
                }
                rings
            }
            Err(e) => {
                tracing::warn!(server_id = server_id.0, error = %e, "could not send Rings; SEQPACKET frames");
                Vec::new()
            }
        }
    }

    /// `FastSockets` for a worker with `CAP_FAST_PATH`: its own sockets when the fast
    /// path is active (empty otherwise, or when opening them failed: the worker then
    /// gets everything over the user path). Our copies close when this returns.
    fn offer_fast_sockets(&self, conn: Channel<'_, Data>, server_id: ServerId, slot: usize) -> std::io::Result<()> {
        let socks = match self.fast_path.active() {
            Some(fp) => fp.open_worker_sockets(slot, server_id).unwrap_or_else(|e| {
                tracing::warn!(server_id = server_id.0, error = %e, "fast path: no worker socket; user path only");
                Vec::new()
            }),
            None => Vec::new(),
        };
        let addrs = socks.iter().map(|s| s.local).collect();
        let fds: Vec<BorrowedFd<'_>> = socks.iter().map(|s| s.fd.as_fd()).collect();
        let sent = conn.send_with_fds(&Data::FastSockets { addrs }, &fds);
        if sent.is_err() && !socks.is_empty() {
            if let Some(fp) = self.fast_path.active() {
                fp.remove_worker(slot, server_id);
            }
        }
        sent
    }

    pub(super) fn hello(&mut self, token: u64, announce: Announce, server_id: ServerId) -> bool {
        // Trust first (an untrusted peer learns nothing, not even our versions), then
        // the protocol version (docs/wire.md "Versions").
        if !self.hello_allowed(token, server_id) {
            return false;
        }
        let Some(fd) = self.conns.get(&token).map(|c| c.fd()) else { return false };
        let Some(version) = crate::versions::answer::<Data>(fd, "data.sock", announce.window, OUR_CAPS) else {
            self.close(token, "hello refused");
            return false;
        };
        let wants = Wants::from_caps(announce.caps);
        let Some(slot) = self.slots.take() else {
            self.refuse(token, &format!("too many live instances (--max-instances {})", self.slots.capacity()));
            return false;
        };
        let Some(Conn::Pending { fd, .. }) = self.conns.remove(&token) else { return false };
        let conn = Channel::<Data>::new(fd.as_fd()).dont_wait().at(version);
        if let Err(e) = conn.send_with_raw_fds(&Data::Sockets { addrs: self.udp_addrs.clone() }, &self.udp_fds) {
            tracing::warn!(server_id = server_id.0, error = %e, "could not send Sockets; closing");
            self.slots.give_back(slot);
            let _ = self.epoll.delete(fd.as_raw_fd());
            return false;
        }
        self.slots.set_baseline(slot, self.slot_counts(slot));
        if wants.fast_path {
            if let Err(e) = self.offer_fast_sockets(conn, server_id, slot) {
                tracing::warn!(server_id = server_id.0, error = %e, "could not send FastSockets; closing");
                self.slots.give_back(slot);
                let _ = self.epoll.delete(fd.as_raw_fd());
                return false;
            }
        }
        let rings = self.offer_rings(conn, server_id, wants.rings);
        let conn = Arc::new(DataConn { fd, server_id: server_id.0, slot, rings });
        self.conns.insert(token, Conn::Live { conn, version, placeable: false, live: Default::default() });
        tracing::info!(server_id = server_id.0, slot, protocol = version, "instance live");
        self.publish();
        true
    }
}
