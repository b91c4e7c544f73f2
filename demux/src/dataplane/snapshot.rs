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
    /// `--rejoin-grace-ms`: the not-live ids whose datagrams are held.
    pub awaited: Awaited,
}

/// `--rejoin-grace-ms`: which not-live server ids the shards hold `Departed`
/// datagrams for while a restarted data plane's instances rejoin
/// (docs/operations.md "data-plane crash").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Awaited {
    /// Without a registrations file (a data plane with no controller): every one.
    #[default]
    Any,
    /// The ids registered with the controller by a process that still runs and not
    /// live yet (sorted). Empty: every registered instance is back, nothing is held.
    Ids(Vec<u16>),
}

impl Awaited {
    /// Nothing is held.
    pub fn is_empty(&self) -> bool {
        matches!(self, Awaited::Ids(ids) if ids.is_empty())
    }

    /// Whether the packet at the start of `datagram`, already routed `Departed`, is
    /// held: its DCID decodes under `keys` to an awaited id.
    #[cold]
    pub fn holds(&self, keys: &proto::KeySet, datagram: &[u8]) -> bool {
        match self {
            Awaited::Any => true,
            Awaited::Ids(ids) => proto::header::parse(datagram, proto::cid::CID_LEN)
                .ok()
                .and_then(|h| keys.decode(h.dcid()).ok())
                .is_some_and(|d| ids.binary_search(&d.server_id.0).is_ok()),
        }
    }
}

pub type Shared = Arc<ArcSwap<Snapshot>>;
