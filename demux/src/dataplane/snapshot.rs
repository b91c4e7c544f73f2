//! The RCU snapshot the shards route against (docs/architecture.md "The shard loop").
//! The registry builds a whole new [`Snapshot`] on every change and publishes it with
//! arc-swap; shards load it once per batch through an `arc_swap::Cache` (a pointer
//! compare when nothing changed: no lock, no shared write on the hot path).

use arc_swap::ArcSwap;
use proto::Table;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// One worker's data connection. Snapshots hold it by `Arc`: a shard may keep sending
/// on a snapshot it loaded even after the worker disconnected and the registry
/// moved on; the fd closes when the last snapshot referring to it is gone.
#[derive(Debug)]
pub struct DataConn {
    pub fd: OwnedFd,
    pub server_id: u16,
    /// Per-shard counter slot ([`crate::dataplane::counters`]).
    pub slot: usize,
    /// `--forward ring`: one ring per shard (indexed by shard); empty: SEQPACKET.
    pub rings: Vec<crate::dataplane::ring::Producer>,
}

#[derive(Debug)]
pub struct Snapshot {
    /// Keys + live instances, in the order of `conns` (Decision::target indexes both).
    pub table: Table,
    pub conns: Vec<Arc<DataConn>>,
    /// Each instance's handshake pressure, in the order of `conns` (may be shorter:
    /// missing entries are `Normal`; crate::dataplane::pressure).
    pub pressure: Vec<crate::dataplane::pressure::Pressure>,
    /// Bumped on every publish (status, logs).
    pub version: u64,
}

pub type Shared = Arc<ArcSwap<Snapshot>>;
