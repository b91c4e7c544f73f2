//! What every backend does with a received datagram or GRO train: count it, route it
//! with proto (ADR 0001 routing table), queue it for its worker. Backends only differ
//! in how bytes arrive (docs/architecture.md "The shard loop").

use crate::dataplane::cmsg::RecvMeta;
use crate::dataplane::counters::{bump, ShardCounters};
use crate::dataplane::forward::Forwarder;
use crate::dataplane::limits::{Limits, Refusal, ShardAdmission};
use crate::dataplane::pressure::PressureAdmission;
use crate::dataplane::retry::{Minter, RetryGate};
use crate::dataplane::snapshot::Snapshot;
use crate::dataplane::socket::UdpSock;
use proto::limits::FollowUps;
use proto::wire::frame::FrameMeta;
use proto::{PinTable, Reason};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Everything a shard thread needs, built by main before the thread starts.
pub struct ShardSetup {
    pub index: usize,
    pub core: core_affinity::CoreId,
    pub sockets: Vec<UdpSock>,
    pub counters: Arc<ShardCounters>,
    pub shared: crate::dataplane::snapshot::Shared,
    pub pin_capacity: usize,
    /// Entries of this shard's CID decode cache (0 = off).
    pub decode_cache: usize,
    pub batch: usize,
    pub uring_buffers: u16,
    /// io_uring: how long a shard spins for receives before it sleeps (zero: never).
    pub busy_poll: Duration,
    /// `--rejoin-grace-ms`: how long after start `Departed` datagrams are held
    /// (dropped, not reset) while instances rejoin.
    pub rejoin_grace: Duration,
    /// Per-source limits shared by every shard (and the data plane's clock origin).
    pub limits: Arc<Limits>,
    /// Host-to-host forwarding of other hosts' ids (crate::dataplane::peers).
    pub peers: Option<Arc<crate::dataplane::peers::Peers>>,
    /// Told the shard index once the shard is set up and about to receive.
    pub started: std::sync::mpsc::Sender<usize>,
}

/// Per-socket facts the hot path needs.
#[derive(Clone, Copy, Debug)]
pub struct SockInfo {
    pub local: SocketAddr,
}

pub struct Router {
    pins: PinTable,
    /// Follow-up evidence of this shard's placements (proto::limits::follow_up),
    /// one entry per placement at most: sized like the pin table.
    follow_ups: FollowUps,
    cache: proto::DecodeCache,
    pub counters: Arc<ShardCounters>,
    pub fwd: Forwarder,
    limits: Arc<Limits>,
    /// Demux-minted Retry, when configured: the gate and this shard's minter.
    retry: Option<(RetryGate, Minter)>,
    now: Duration,
    /// `now` in milliseconds (the rate sketch's ticks), once per batch.
    ms: u64,
    /// Wall-clock Unix seconds (token expiry), once per batch.
    unix: u64,
    /// Until this `ms` (since the data plane started), orphans of decodable ids are
    /// held for their instance to rejoin ([`ShardSetup::rejoin_grace`]).
    rejoin_grace_ms: u64,
    /// `HandshakeDone` notices seen (crate::dataplane::handshakes).
    done_cursor: u64,
    peers: Option<Arc<crate::dataplane::peers::Peers>>,
    /// This batch's frames to other hosts (sent at its flush).
    peer_out: crate::dataplane::peer_out::PeerOut,
}

impl Drop for Router {
    /// Gives back the concurrency tickets the pins still hold (the sketch is shared
    /// with the other shards, which keep running if only this one stops).
    fn drop(&mut self) {
        let limits = &self.limits;
        self.pins.drain(|p| limits.release(p));
    }
}

impl Router {
    pub fn new(setup: &ShardSetup) -> std::io::Result<Router> {
        let mut hash_key = [0u8; 16];
        sys::os_random(&mut hash_key)?;
        let mut follow_up_key = [0u8; 16];
        sys::os_random(&mut follow_up_key)?;
        Ok(Router {
            pins: PinTable::new(setup.pin_capacity, hash_key),
            follow_ups: FollowUps::new(setup.pin_capacity, follow_up_key),
            cache: proto::DecodeCache::new(setup.decode_cache),
            counters: setup.counters.clone(),
            fwd: Forwarder::new(setup.index),
            limits: setup.limits.clone(),
            retry: match &setup.limits.retry {
                Some(cfg) => {
                    use std::os::fd::AsRawFd;
                    let socks = setup.sockets.iter().map(|s| (s.local, s.fd.as_raw_fd())).collect();
                    let minter = Minter::new(cfg, socks).map_err(|e| std::io::Error::other(format!("retry: {e:#}")))?;
                    Some((RetryGate::new(cfg.mode), minter))
                }
                None => None,
            },
            now: Duration::ZERO,
            ms: 0,
            unix: 0,
            rejoin_grace_ms: setup.rejoin_grace.as_millis() as u64,
            done_cursor: setup.limits.handshakes_done.written(),
            peers: setup.peers.clone(),
            peer_out: Default::default(),
        })
    }

    /// Start of a batch: one clock read for all its routing decisions.
    #[inline]
    pub fn begin(&mut self) {
        self.now = self.limits.epoch.elapsed();
        self.ms = self.now.as_millis() as u64;
        self.unix = crate::dataplane::retry::unix_now();
        bump(&self.counters.batches, 1);
        if self.limits.handshakes_done.written() != self.done_cursor {
            self.handshakes_done();
        }
    }

    /// Workers reported handshakes done: the tickets of this shard's pins of those
    /// DCIDs on those instances leave now, not when the pins expire (crate::dataplane::handshakes). The pins stay.
    #[cold]
    fn handshakes_done(&mut self) {
        let (pins, limits, now) = (&mut self.pins, &*self.limits, self.now);
        let mut released = 0;
        limits.handshakes_done.take_since(&mut self.done_cursor, |server_id, odcid| {
            if let Some(p) = pins.take_payload(odcid, server_id, now) {
                limits.release(p);
                released += 1;
            }
        });
        bump(&self.counters.tickets_released_done, released);
    }

    /// How many payloads were ever queued for a flush (SEQPACKET frames, wrapping):
    /// a receive buffer whose datagram left it unchanged is free once routed.
    #[inline]
    pub fn payloads_queued(&self) -> u64 {
        self.fwd.queued_total()
    }

    /// A receive the kernel flagged MSG_TRUNC / MSG_CTRUNC: counted, not routed.
    #[inline]
    pub fn truncated(&self) {
        bump(&self.counters.drops_truncated, 1);
    }

    /// Routes and queues one received payload (a datagram, or a GRO train when
    /// `meta.gro_size` is set).
    ///
    /// # Safety
    /// `payload` must stay valid and unchanged until the next `flush`.
    #[inline]
    pub unsafe fn datagram(
        &mut self,
        snap: &Snapshot,
        sock: &SockInfo,
        client: SocketAddr,
        meta: &RecvMeta,
        payload: &[u8],
    ) {
        let stride = meta.gro_size.map(usize::from).unwrap_or(0);
        let segments = if stride > 0 && stride < payload.len() { payload.len().div_ceil(stride) } else { 1 };
        let c = &*self.counters;
        bump(&c.datagrams_in, segments as u64);
        bump(&c.bytes_in, payload.len() as u64);
        if segments > 1 {
            bump(&c.trains_in, 1);
        }
        if payload.is_empty() {
            // proto::Router::route_train emits no run for an empty train; a zero-length UDP
            // datagram is not QUIC (RFC 9000 §17: every packet has a header byte).
            bump(&c.reasons[Reason::NotQuic.index()], 1);
            return;
        }
        let local = match meta.local_ip {
            Some(ip) => Some(SocketAddr::new(ip, sock.local.port())),
            None if !sock.local.ip().is_unspecified() => Some(sock.local),
            None => None,
        };
        let (fwd, unix) = (&mut self.fwd, self.unix);
        let rejoining = self.ms < self.rejoin_grace_ms && !snap.awaited.is_empty();
        let (peers, peer_out) = (self.peers.as_deref(), &mut self.peer_out);
        // Only a new placement calls into the limits (proto::route::Admission); the
        // clock in ms for the rate sketch is the batch's, no extra clock read.
        let (gate, mut minter) = match &mut self.retry {
            Some((g, m)) => (Some(g), Some(m)),
            None => (None, None),
        };
        let mut admission = ShardAdmission {
            limits: &self.limits,
            client,
            ms: self.ms,
            now: self.now,
            unix: self.unix,
            retry: gate,
            follow_ups: &mut self.follow_ups,
            pressure: &snap.pressure,
            counters: c,
        };
        // Per-instance handshake pressure (crate::dataplane::pressure) comes first.
        let pressured = PressureAdmission { inner: &mut admission, pressure: &snap.pressure };
        let router = proto::Router::new(&snap.table, &mut self.pins, self.now).with_admission(pressured);
        router.with_decoder(&mut self.cache).route_train(payload, stride, |run, refused| {
            let segs = run.segments as u64;
            match refused {
                // Dropped before placement; counted under its own reason, not a
                // routing reason (nothing was routed or pinned).
                Some(Refusal::RateLimited) => return bump(&c.refused_rate, segs),
                Some(Refusal::HandshakeLimited) => return bump(&c.refused_handshakes, segs),
                Some(Refusal::Overloaded) => return bump(&c.refused_overloaded, segs),
                // A client Initial on a live DCID dropped on its way to its owner:
                // counted by the admission under owner_initial.<outcome>.
                Some(Refusal::OwnerInitial(_)) => return,
                // RFC 9000 §17.2.5: answered here with a Retry naming the instance it
                // would have been placed on; not forwarded, nothing pinned. A train of
                // one DCID's Initials gets one Retry (for its first segment).
                // Over its client's limits and not address-validated: a Retry, not
                // silence (limits::Refusal::RetryOverLimit), counted as a Retry and
                // under retry.sent_over_limit.
                Some(r @ (Refusal::Retry { target } | Refusal::RetryOverLimit { target, .. })) => {
                    let (Some(m), Some(info)) = (minter.as_deref_mut(), snap.table.instance(target)) else {
                        return bump(&c.retry_dropped, segs);
                    };
                    let end = if run.segments > 1 { run.bytes.start + stride } else { run.bytes.end };
                    let first = payload.get(run.bytes.start..end).unwrap_or(&[]);
                    let local = local.unwrap_or(sock.local);
                    let keys = snap.table.keys();
                    let over_limit = matches!(r, Refusal::RetryOverLimit { .. });
                    m.answer(first, client, local, meta.local_ip, keys, info.server_id, unix, over_limit, c);
                    return;
                }
                None => {}
            }
            // ADR 0005: an orphan here (or, with no local instance at all, a datagram
            // for nobody) may be another host's: forwarded there (each segment of a
            // train in its own frame), not reset or dropped here.
            if matches!(run.decision.reason, Reason::Orphan | Reason::Departed | Reason::NoInstance) {
                if let Some(p) = peers {
                    let keys = snap.table.keys();
                    let local = local.unwrap_or(sock.local);
                    let bytes = payload.get(run.bytes.clone()).unwrap_or(&[]);
                    let mut all = true;
                    let seg_len = if run.segments > 1 { stride.max(1) } else { bytes.len().max(1) };
                    for seg in bytes.chunks(seg_len) {
                        all &= p.forward(peer_out, keys, seg, client, local);
                    }
                    if all {
                        return;
                    }
                }
            }
            // Just after a restart an id that is not live may be one whose instance
            // has not rejoined yet: its datagrams are dropped (QUIC retransmits), not
            // handed to another instance whose stateless reset would end the
            // connection (docs/operations.md "data-plane crash").
            if rejoining
                && run.decision.reason == Reason::Departed
                && snap.awaited.holds(snap.table.keys(), payload.get(run.bytes.start..).unwrap_or(&[]))
            {
                return bump(&c.held_for_rejoin, segs);
            }
            bump(&c.reasons[run.decision.reason.index()], segs);
            match run.decision.target {
                Some(t) => {
                    if fwd.is_full() {
                        fwd.flush(snap, c);
                    }
                    let frame = FrameMeta {
                        client,
                        local,
                        ecn: meta.ecn,
                        segment_size: if run.segments > 1 { Some(stride as u16) } else { None },
                    };
                    let bytes = payload.get(run.bytes.clone()).unwrap_or(&[]);
                    // SAFETY: `bytes` lies within `payload`, which the caller keeps
                    // valid until flush (this function's contract).
                    unsafe { fwd.push(snap, t, &frame, bytes, run.segments as u32, c) };
                }
                None => {
                    if run.decision.reason == Reason::NoInstance {
                        bump(&c.drops_no_instance, segs);
                    }
                }
            }
        });
    }

    /// End of a batch: one sendmmsg per destination (workers, and peers for the
    /// frames to other hosts), and one per socket for the batch's Retries.
    #[inline]
    pub fn flush(&mut self, snap: &Snapshot) {
        self.fwd.flush(snap, &self.counters);
        if let Some(p) = &self.peers {
            p.flush(&mut self.peer_out);
        }
        if let Some((_, m)) = &mut self.retry {
            m.flush(&self.counters);
        }
    }
}

/// Pins the calling thread to its core (logs, does not fail, when refused).
pub fn pin_thread(setup: &ShardSetup) {
    if !core_affinity::set_for_current(setup.core) {
        tracing::warn!(shard = setup.index, core = setup.core.id, "could not pin shard thread to its core");
    }
}
