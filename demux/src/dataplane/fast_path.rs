//! The kernel fast path, data-plane side (docs/adr/0004-kernel-fast-path.md).
//!
//! The `fastpath` crate's SK_REUSEPORT program runs on every skb that reaches a
//! listen address's reuseport group. For a short header whose DCID has a live
//! siphash-2-4 generation and decodes to a live worker's server id, it selects that
//! worker's own socket: the datagram never enters this process. A GSO/GRO train of
//! several datagrams goes there only when every datagram provably belongs to that
//! worker (the gso-walk program; the size-limit fallback sends every skb longer than
//! `proto::header::MAX_UDP_PAYLOAD` to a shard instead, ADR 0004 "Trains").
//! Everything else goes to a shard socket (by the flow hash, or by CPU under
//! `--steer cpu`), and the user path handles it exactly as without the fast path,
//! splitting trains.
//!
//! This module keeps the program's maps in step with the registry:
//! - keys: every live siphash-2-4 generation's SipHash key (an hmac-sha256
//!   generation stays inactive: the kernel cannot decode it);
//! - workers: a worker that asks (a `DataHello` announcing `CAP_FAST_PATH`) gets one new
//!   socket per listen address, bound into the group and inserted at its counter
//!   slot, then handed over with `FastSockets`; the data plane closes its own copy,
//!   so the socket lives as long as the worker holds it and a crashed worker's
//!   socket leaves the socket array at once (the kernel removes closed sockets);
//! - a closed data connection removes the worker from the maps.
//!
//! Sockets enter the group only while the program is attached: without it, the
//! kernel's hash would hand worker sockets arbitrary datagrams.

use crate::cli::FastPathMode;
use crate::dataplane::socket::{self, UdpSock};
use anyhow::{bail, Result};
use fastpath::{GenSteering, Variant};
use proto::cid_format::CidFormat;
use proto::{Generation, KeySet, ServerId};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::os::fd::AsFd;

/// CPUs the `--steer cpu` table of the program covers (the `cpu_shard` map).
const CPU_TABLE_LEN: usize = 256;

/// One listen address's reuseport group and the program attached to it.
struct Group {
    addr: SocketAddr,
    listen_index: usize,
    steering: fastpath::Steering,
}

/// The attached fast path, one program instance per listen address.
pub struct FastPath {
    groups: Vec<Group>,
}

/// Whether the fast path runs, and why not (for status and the start-up log).
pub enum FastPathState {
    Active(FastPath),
    Inactive { reason: String },
}

impl FastPathState {
    /// `--fast-path`: `off` never loads; `on` loads or fails; `auto` falls back to the
    /// user path with one log line naming the reason (no CAP_BPF, seccomp, an old
    /// kernel, a build without clang).
    pub fn start(
        mode: FastPathMode,
        sockets: &[Vec<UdpSock>],
        shard_cores: Option<&[usize]>,
        max_instances: usize,
        keys: &KeySet,
    ) -> Result<FastPathState> {
        if mode == FastPathMode::Off {
            return Ok(FastPathState::Inactive { reason: "--fast-path off".into() });
        }
        match FastPath::attach(sockets, shard_cores, max_instances, keys) {
            Ok(fp) => {
                let variant = fp.variant();
                tracing::info!(groups = fp.groups.len(), program = %variant, "kernel fast path attached (SK_REUSEPORT)");
                if let Some(why) = fp.gso_walk_refused() {
                    tracing::warn!(
                        "kernel fast path: the gso-walk program was refused ({why}); running the size-limit \
                         program: a train of at most {} bytes is steered by its first datagram",
                        proto::header::MAX_UDP_PAYLOAD
                    );
                }
                Ok(FastPathState::Active(fp))
            }
            Err(e) if mode == FastPathMode::Auto => {
                tracing::warn!("kernel fast path unavailable ({e:#}); every datagram takes the user path");
                Ok(FastPathState::Inactive { reason: format!("{e:#}") })
            }
            Err(e) => Err(e.context("--fast-path on")),
        }
    }

    pub fn active(&self) -> Option<&FastPath> {
        match self {
            FastPathState::Active(fp) => Some(fp),
            FastPathState::Inactive { .. } => None,
        }
    }
}

/// The `cpu_shard` table for `--steer cpu`: a CPU that runs shard i maps to i, any
/// other CPU to `cpu mod shards` (the classic program's rule, crate::dataplane::steer_cpu).
pub fn cpu_table(shard_cores: &[usize]) -> Vec<u32> {
    let n = shard_cores.len().max(1);
    (0..CPU_TABLE_LEN).map(|cpu| shard_cores.iter().position(|&c| c == cpu).unwrap_or(cpu % n) as u32).collect()
}

impl FastPath {
    fn attach(
        sockets: &[Vec<UdpSock>],
        shard_cores: Option<&[usize]>,
        max_instances: usize,
        keys: &KeySet,
    ) -> Result<FastPath> {
        let Some(first) = sockets.first() else { bail!("no shard sockets") };
        let table = shard_cores.map(cpu_table);
        let max_workers = u32::try_from(max_instances)?;
        let mut groups = Vec::with_capacity(first.len());
        for (li, s0) in first.iter().enumerate() {
            let shard_fds: Vec<_> = sockets.iter().filter_map(|shard| shard.get(li)).map(|s| s.fd.as_fd()).collect();
            let config = fastpath::Config {
                max_workers,
                shard_by_cpu: table.as_deref(),
                max_udp_payload: proto::header::MAX_UDP_PAYLOAD,
            };
            let steering = fastpath::Steering::attach(&shard_fds, &config).map_err(|e| anyhow::anyhow!("{e}"))?;
            groups.push(Group { addr: s0.local, listen_index: li, steering });
        }
        let fp = FastPath { groups };
        fp.set_keys(keys)?;
        Ok(fp)
    }

    /// The program variant that runs (every group loads the same one on one kernel;
    /// the weaker one is reported if they ever differ).
    pub fn variant(&self) -> Variant {
        if self.groups.iter().any(|g| g.steering.variant() == Variant::SizeLimit) {
            Variant::SizeLimit
        } else {
            Variant::GsoWalk
        }
    }

    /// Why the gso-walk program was refused, if some group runs the size-limit one.
    fn gso_walk_refused(&self) -> Option<&str> {
        self.groups.iter().find_map(|g| g.steering.gso_walk_refused())
    }

    /// Writes every generation's state: the SipHash key of a live siphash-2-4
    /// generation, the config of a plaintext QUIC-LB one, "encrypted" for a keyed
    /// QUIC-LB one (to the user path, counted: ADR 0007), inactive otherwise
    /// (hmac-sha256, not live).
    pub fn set_keys(&self, keys: &KeySet) -> Result<()> {
        for cr in 0..3u8 {
            let Some(gen) = Generation::new(cr) else { continue };
            let how = match keys.format(gen) {
                Some(CidFormat::QuicLb(p)) if p.key.is_none() => {
                    GenSteering::QuicLbPlaintext { config_id: p.config_id.get(), server_id_len: p.server_id_len }
                }
                Some(CidFormat::QuicLb(_)) => GenSteering::QuicLbEncrypted,
                _ => keys.siphash_key(gen).map_or(GenSteering::Inactive, GenSteering::SipHash),
            };
            for g in &self.groups {
                g.steering.set_generation_as(gen, how)?;
            }
        }
        Ok(())
    }

    /// A worker asked for the fast path: one new socket per listen address, in its
    /// group, steered to `slot`. The caller sends them with `FastSockets` and drops
    /// them. On any failure the worker is taken out again and gets none.
    pub fn open_worker_sockets(&self, slot: usize, server_id: ServerId) -> Result<Vec<UdpSock>> {
        let slot32 = u32::try_from(slot)?;
        let mut out = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let made = socket::bind_udp(g.addr, g.listen_index)
                .and_then(|s| Ok(g.steering.insert_worker(slot32, server_id, s.fd.as_fd()).map(|()| s)?));
            match made {
                Ok(s) => out.push(s),
                Err(e) => {
                    self.remove_worker(slot, server_id);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// The worker's data connection closed: its id leaves every group's map.
    pub fn remove_worker(&self, slot: usize, server_id: ServerId) {
        let Ok(slot) = u32::try_from(slot) else { return };
        for g in &self.groups {
            if let Err(e) = g.steering.remove_worker(slot, server_id) {
                tracing::warn!(server_id = server_id.0, error = %e, "fast path: removing a worker");
            }
        }
    }

    /// Fast-path datagrams delivered to the worker at `slot`, all groups (a train
    /// counts its segments).
    pub fn worker_datagrams(&self, slot: usize) -> u64 {
        let Ok(slot) = u32::try_from(slot) else { return 0 };
        self.groups.iter().filter_map(|g| g.steering.worker_fast(slot).ok()).sum()
    }

    /// The program's outcome counters, summed over groups and CPUs: datagrams handed
    /// to workers, trains kept whole on the fast path, and what went to the shards by
    /// reason (skbs: a train counts once).
    fn counters(&self) -> Map<String, Value> {
        let mut t = fastpath::Counters::default();
        for g in &self.groups {
            match g.steering.counters() {
                Ok(c) => t.add(&c),
                Err(e) => tracing::warn!(error = %e, "fast path: reading counters"),
            }
        }
        let to_demux = json!({
            "long_header": t.long_header,
            "short_packet": t.short_packet,
            "cr_unroutable": t.cr_unroutable,
            "unknown_generation": t.unknown_generation,
            "quic_lb_encrypted": t.quic_lb_encrypted,
            "not_live": t.not_live,
            "train_to_shard": t.train_to_shard,
            "select_failed": t.select_failed,
        });
        let mut m = Map::new();
        m.insert("program".into(), json!(self.variant().name()));
        if let Some(why) = self.gso_walk_refused() {
            m.insert("gso_walk_refused".into(), json!(why));
        }
        m.insert("datagrams".into(), json!(t.fast_datagrams));
        m.insert("train_fast".into(), json!(t.train_fast));
        m.insert("to_demux".into(), to_demux);
        m.insert("dropped".into(), json!(t.shard_select_failed));
        m
    }
}

/// The `fast_path` object of the status JSON.
pub fn status_json(state: &FastPathState, mode: FastPathMode) -> Value {
    let mode = match mode {
        FastPathMode::Auto => "auto",
        FastPathMode::On => "on",
        FastPathMode::Off => "off",
    };
    match state {
        FastPathState::Active(fp) => {
            let mut m = fp.counters();
            m.insert("mode".into(), json!(mode));
            m.insert("active".into(), json!(true));
            Value::Object(m)
        }
        FastPathState::Inactive { reason } => json!({ "mode": mode, "active": false, "reason": reason }),
    }
}
