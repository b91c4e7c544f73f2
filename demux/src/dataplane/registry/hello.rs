//! The data hello (steps 1 and 2 of the protocol in the parent module): a
//! `DataHello` / `DataHelloV2` is answered with `Sockets`, then for `DataHelloV2`
//! `FastSockets` (`CAP_FAST_PATH`) and `Rings`, and the connection becomes live.

use super::{Conn, Registry};
use crate::dataplane::ring::Producer;
use crate::dataplane::snapshot::DataConn;
use proto::wire::data::{CAP_FAST_PATH, CAP_RINGS, MAX_RINGS};
use proto::wire::Data;
use proto::ServerId;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use sys::seqpacket::Channel;

/// What a worker asked for in its data hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Wants {
    /// `DataHelloV2`: the answer ends with `Rings`.
    v2: bool,
    rings: bool,
    fast_path: bool,
}

impl Wants {
    pub(super) const V1: Wants = Wants { v2: false, rings: false, fast_path: false };
    pub(super) fn from_caps(caps: u32) -> Wants {
        Wants { v2: true, rings: caps & CAP_RINGS != 0, fast_path: caps & CAP_FAST_PATH != 0 }
    }
}

impl Registry {
    /// The answer to every `DataHelloV2`: `Rings`, with one ring per shard when
    /// `--forward ring` and the worker asked (`wanted`), else count 0.
    /// Any failure leaves the worker on SEQPACKET frames (empty vector).
    fn offer_rings(&self, conn: Channel<'_, Data>, server_id: ServerId, wanted: bool) -> Vec<Producer> {
        let made: std::io::Result<Vec<_>> = match self.ring_bytes {
            Some(bytes) if wanted && self.counters.len() <= usize::from(MAX_RINGS) => {
                (0..self.counters.len()).map(|_| Producer::create(bytes)).collect()
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

    pub(super) fn hello(&mut self, token: u64, server_id: ServerId, wants: Wants) -> bool {
        if !self.hello_allowed(token, server_id) {
            return false;
        }
        let Some(slot) = self.slots.take() else {
            self.refuse(token, &format!("too many live instances (--max-instances {})", self.slots.capacity()));
            return false;
        };
        let Some(Conn::Pending { fd, .. }) = self.conns.remove(&token) else { return false };
        let conn = Channel::<Data>::new(fd.as_fd()).dont_wait();
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
        let rings = if wants.v2 { self.offer_rings(conn, server_id, wants.rings) } else { Vec::new() };
        let conn = Arc::new(DataConn { fd, server_id: server_id.0, slot, rings });
        self.conns.insert(token, Conn::Live { conn, placeable: false, live: Default::default() });
        tracing::info!(server_id = server_id.0, slot, "instance live");
        self.publish();
        true
    }
}
