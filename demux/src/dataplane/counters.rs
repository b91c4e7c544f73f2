//! Per-shard counters. Each shard owns one [`ShardCounters`]: only that shard writes
//! it (plain relaxed load + store, no locked read-modify-write), the control thread
//! reads it for status. The struct is aligned to 128 bytes (two cache lines, the
//! adjacent-line prefetcher's unit) and the per-instance array is a separate heap
//! allocation, so no hot cache line is shared between shards.
//!
//! Per-instance counters are indexed by *slot*, not by server id: the registry gives
//! every live instance a slot in `0..max_instances` (`--max-instances`, default 1024:
//! 24 KiB per shard) and reuses freed slots oldest-first, remembering a baseline so a
//! reused slot reports only its new owner's traffic.

use proto::limits::OwnerInitialOutcome;
use proto::Reason;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Adds `n` to a counter that only the calling thread writes.
#[inline(always)]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

#[derive(Debug, Default)]
pub struct InstanceCounters {
    /// Datagrams handed to the instance's data connection (a train counts its segments).
    pub datagrams: AtomicU64,
    pub bytes: AtomicU64,
    /// Datagrams dropped because the data connection was full (EAGAIN / ENOBUFS).
    pub drops_full: AtomicU64,
}

#[derive(Debug)]
#[repr(align(128))]
pub struct ShardCounters {
    /// Datagrams received (a GRO train counts its segments); truncated ones excluded.
    pub datagrams_in: AtomicU64,
    pub bytes_in: AtomicU64,
    /// GRO trains (receives carrying more than one segment).
    pub trains_in: AtomicU64,
    /// One count per datagram, by routing reason ([`Reason::index`]).
    pub reasons: [AtomicU64; Reason::COUNT],
    /// Routed to nobody: no live / placeable instance.
    pub drops_no_instance: AtomicU64,
    /// The destination's data connection was full.
    pub drops_full: AtomicU64,
    /// Receives with MSG_TRUNC (payload) or MSG_CTRUNC (control data): not routed.
    pub drops_truncated: AtomicU64,
    /// sendmmsg failed otherwise (the worker went away between snapshot and send).
    pub drops_send_error: AtomicU64,
    /// io_uring: the provided-buffer ring ran empty (multishot ended with ENOBUFS).
    pub recv_no_buffers: AtomicU64,
    /// Client Initials / 0-RTT refused before placement (crate::dataplane::limits): the
    /// client's new-connection rate is spent.
    pub refused_rate: AtomicU64,
    /// … the client holds its cap of pinned handshakes.
    pub refused_handshakes: AtomicU64,
    /// Token-less Initials dropped: their instance reports more handshakes in progress
    /// than `--pressure-drop-above` (crate::dataplane::pressure).
    pub refused_overloaded: AtomicU64,
    /// Demux-minted Retries sent (crate::dataplane::retry).
    pub retries_sent: AtomicU64,
    /// Of `retries_sent`, those answering an Initial over its client's limits
    /// (crate::dataplane::limits::Refusal::RetryOverLimit).
    pub retries_sent_over_limit: AtomicU64,
    /// Version Negotiations sent instead of a Retry: the Initial's version (QUIC v2)
    /// is not one the workers speak (crate::dataplane::retry::SPOKEN).
    pub version_negotiations_sent: AtomicU64,
    /// Client Initials whose DCID decodes to a live id, by outcome
    /// ([`OwnerInitialOutcome::index`], proto::limits::owner_initial). `token`,
    /// `follow_up` and `admitted` also count under `reasons.Owner`, `placed` where
    /// placement sent it; the other outcomes are drops, counted only here.
    pub owner_initial: [AtomicU64; OwnerInitialOutcome::COUNT],
    /// Handshake tickets given back early: the worker reported the handshake done
    /// (`HandshakeDone`, crate::dataplane::handshakes) while the pin still held it.
    pub tickets_released_done: AtomicU64,
    /// Token-less Initials that were to get a Retry but were dropped instead: quinn
    /// did not take them as a client's first Initial (did not decrypt, …).
    pub retry_dropped: AtomicU64,
    /// `Departed` datagrams (ids not live) dropped during `--rejoin-grace-ms` after start
    /// (their instance may be about to rejoin), not reset.
    pub held_for_rejoin: AtomicU64,
    /// Retries whose sendmsg failed (EAGAIN: the socket's send buffer was full).
    pub retry_send_errors: AtomicU64,
    /// Receive batches processed.
    pub batches: AtomicU64,
    /// sendmmsg calls.
    pub sendmmsg_calls: AtomicU64,
    /// `--forward ring`: eventfd writes to wake a sleeping worker (at most one per
    /// ring per batch).
    pub ring_wakes: AtomicU64,
    /// `--busy-poll-us`: spins before sleeping, and those that saw receives arrive
    /// (a round begun without a wake-up).
    pub busy_poll_spins: AtomicU64,
    pub busy_poll_found: AtomicU64,
    pub instances: Box<[InstanceCounters]>,
}

impl ShardCounters {
    pub fn new(max_instances: usize) -> ShardCounters {
        ShardCounters {
            datagrams_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            trains_in: AtomicU64::new(0),
            reasons: Default::default(),
            drops_no_instance: AtomicU64::new(0),
            drops_full: AtomicU64::new(0),
            drops_truncated: AtomicU64::new(0),
            drops_send_error: AtomicU64::new(0),
            recv_no_buffers: AtomicU64::new(0),
            refused_rate: AtomicU64::new(0),
            refused_handshakes: AtomicU64::new(0),
            refused_overloaded: AtomicU64::new(0),
            retries_sent: AtomicU64::new(0),
            retries_sent_over_limit: AtomicU64::new(0),
            version_negotiations_sent: AtomicU64::new(0),
            owner_initial: Default::default(),
            tickets_released_done: AtomicU64::new(0),
            retry_dropped: AtomicU64::new(0),
            held_for_rejoin: AtomicU64::new(0),
            retry_send_errors: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            sendmmsg_calls: AtomicU64::new(0),
            ring_wakes: AtomicU64::new(0),
            busy_poll_spins: AtomicU64::new(0),
            busy_poll_found: AtomicU64::new(0),
            instances: (0..max_instances).map(|_| InstanceCounters::default()).collect(),
        }
    }

    /// This slot's counts.
    pub fn instance(&self, slot: usize) -> SlotCounts {
        match self.instances.get(slot) {
            Some(i) => SlotCounts {
                datagrams: i.datagrams.load(Relaxed),
                bytes: i.bytes.load(Relaxed),
                drops_full: i.drops_full.load(Relaxed),
                fast_datagrams: 0,
            },
            None => SlotCounts::default(),
        }
    }
}

/// One instance slot's counts: forwarded by the shards, and (`fast_datagrams`)
/// steered to the worker by the kernel fast path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCounts {
    pub datagrams: u64,
    pub bytes: u64,
    pub drops_full: u64,
    pub fast_datagrams: u64,
}

impl SlotCounts {
    /// Field-wise wrapping sum.
    pub fn plus(self, o: SlotCounts) -> SlotCounts {
        SlotCounts {
            datagrams: self.datagrams.wrapping_add(o.datagrams),
            bytes: self.bytes.wrapping_add(o.bytes),
            drops_full: self.drops_full.wrapping_add(o.drops_full),
            fast_datagrams: self.fast_datagrams.wrapping_add(o.fast_datagrams),
        }
    }

    /// Field-wise wrapping difference: the counts since `base` (a slot's counters
    /// keep running across owners; each owner sees them from its baseline).
    pub fn since(self, base: SlotCounts) -> SlotCounts {
        SlotCounts {
            datagrams: self.datagrams.wrapping_sub(base.datagrams),
            bytes: self.bytes.wrapping_sub(base.bytes),
            drops_full: self.drops_full.wrapping_sub(base.drops_full),
            fast_datagrams: self.fast_datagrams.wrapping_sub(base.fast_datagrams),
        }
    }
}

/// Sum of every shard's slot counters.
pub fn instance_total(shards: &[std::sync::Arc<ShardCounters>], slot: usize) -> SlotCounts {
    shards.iter().fold(SlotCounts::default(), |t, s| t.plus(s.instance(slot)))
}
