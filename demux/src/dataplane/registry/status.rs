//! `StatusRequest` on the control socket (`demux lb-status`): the shards' counters,
//! each live instance's counts since its slot was handed to it, rendered by
//! [`crate::dataplane::status`].

use super::Conn;
use super::Registry;
use crate::accept_guard::AcceptGuard;
use crate::dataplane::fast_path;
use crate::dataplane::status::{self, InstanceStatus, LiveStatus};
use serde_json::json;
use std::collections::HashMap;
use std::time::Instant;

fn guard_json(g: &AcceptGuard) -> serde_json::Value {
    json!({
        "paused": g.paused(),
        "failures": g.failures,
        "over_cap": g.over_cap,
        "hello_timeouts": g.hello_timeouts,
    })
}

impl Registry {
    pub(super) fn status_json(&self) -> String {
        let snap = self.shared.load();
        let clock = self.clock(Instant::now());
        let lives: HashMap<u16, _> = self
            .conns
            .values()
            .filter_map(|c| match c {
                Conn::Live { conn, live, version, .. } => Some((conn.server_id, (live, *version))),
                _ => None,
            })
            .collect();
        let instances: Vec<InstanceStatus> = snap
            .conns
            .iter()
            .zip(snap.table.instances())
            .map(|(c, info)| InstanceStatus {
                server_id: c.server_id,
                placeable: info.placeable,
                forward: if c.rings.is_empty() { "seqpacket" } else { "ring" },
                protocol: lives.get(&c.server_id).map(|(_, v)| *v),
                counts: self.slots.since_baseline(c.slot, self.slot_counts(c.slot)),
                live: lives.get(&c.server_id).map(|(l, _)| LiveStatus {
                    stalled: l.stalled(),
                    stalls: l.stalls,
                    handshakes: l.handshakes,
                    incoming_bytes: l.incoming_bytes,
                    load_age_ms: l.load_age_ms(clock),
                    pressure: self.pressure.level(l.handshakes),
                }),
            })
            .collect();
        let fast = fast_path::status_json(&self.fast_path, self.fast_path_mode);
        // What never reached a shard: datagrams the kernel dropped on our sockets
        // (receive queue full while the shard was behind).
        let socket_drops: u64 =
            self.all_udp_fds.iter().filter_map(|&fd| ::sys::sockopt::kernel_drops(fd).ok()).map(u64::from).sum();
        let extra = json!({
            "socket_drops": socket_drops,
            "peers": self.peers.as_ref().map(|p| p.status_json()),
            "liveness": {
                "stalls": self.stalls_total,
                "stalled": lives.values().filter(|(l, _)| l.stalled()).count(),
                "pressure_retry_above": self.pressure.retry_above,
                "pressure_drop_above": self.pressure.drop_above,
            },
            "accept": {
                "waiting_for_hello": self.waiting(),
                "pending_cap": self.pending_cap,
                "data": guard_json(&self.data_guard),
                "control": guard_json(&self.control_guard),
            },
            // SO_PEERCRED and data-hello refusals on data.sock and dataplane.sock,
            // by reason (crate::trust::Refusal).
            "peer_refused": crate::trust::refused_json(),
        });
        status::render(&self.info, snap.table.keys(), snap.version, &self.counters, &instances, fast, extra)
    }
}
