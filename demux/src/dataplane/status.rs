//! Status: the shards' counters aggregated on request (Admin::StatusRequest on
//! `--control-socket`), as JSON, and its readable rendering for `demux lb-status`.

use crate::dataplane::counters::{ShardCounters, SlotCounts};
use proto::limits::OwnerInitialOutcome;
use proto::wire::MAX_TEXT;
use proto::Reason;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Fixed facts of this data plane.
#[derive(Clone, Debug)]
pub struct StatusInfo {
    pub io: &'static str,
    pub steer: &'static str,
    pub cores: Vec<usize>,
    pub listen: Vec<String>,
    pub pid: u32,
    /// `--busy-poll-us` (0: off).
    pub busy_poll_us: u32,
}

pub struct InstanceStatus {
    pub server_id: u16,
    pub placeable: bool,
    /// How its frames travel: `"ring"` (shared-memory rings) or `"seqpacket"`.
    pub forward: &'static str,
    /// The protocol version its data connection negotiated (docs/wire.md "Versions").
    pub protocol: Option<u8>,
    pub counts: SlotCounts,
    /// Liveness and pressure (crate::dataplane::registry::liveness).
    pub live: Option<LiveStatus>,
}

/// An instance's `Load` reports and stall state.
pub struct LiveStatus {
    pub stalled: bool,
    pub stalls: u64,
    pub handshakes: u32,
    pub incoming_bytes: u32,
    /// Since the last `Load`; `None`: it never sent one (the stall rule is off for it).
    pub load_age_ms: Option<u64>,
    pub pressure: crate::dataplane::pressure::Pressure,
}

fn shard_json(c: &ShardCounters) -> Map<String, Value> {
    let mut reasons = Map::new();
    for r in Reason::ALL {
        reasons.insert(r.name().to_string(), json!(c.reasons[r.index()].load(Relaxed)));
    }
    let mut m = Map::new();
    m.insert("datagrams_in".into(), json!(c.datagrams_in.load(Relaxed)));
    m.insert("bytes_in".into(), json!(c.bytes_in.load(Relaxed)));
    m.insert("trains_in".into(), json!(c.trains_in.load(Relaxed)));
    m.insert("reasons".into(), Value::Object(reasons));
    m.insert(
        "drops".into(),
        json!({
            "no_instance": c.drops_no_instance.load(Relaxed),
            "full": c.drops_full.load(Relaxed),
            "truncated": c.drops_truncated.load(Relaxed),
            "send_error": c.drops_send_error.load(Relaxed),
        }),
    );
    // Refused before placement (crate::dataplane::limits), each under its own reason.
    m.insert(
        "refused".into(),
        json!({
            "RateLimited": c.refused_rate.load(Relaxed),
            "HandshakeLimited": c.refused_handshakes.load(Relaxed),
            "Overloaded": c.refused_overloaded.load(Relaxed),
        }),
    );
    // Client Initials on a live DCID, by outcome (proto::limits::owner_initial).
    let mut owner = Map::new();
    for o in OwnerInitialOutcome::ALL {
        owner.insert(o.name().to_string(), json!(c.owner_initial[o.index()].load(Relaxed)));
    }
    m.insert("owner_initial".into(), Value::Object(owner));
    m.insert("tickets_released_done".into(), json!(c.tickets_released_done.load(Relaxed)));
    m.insert("held_for_rejoin".into(), json!(c.held_for_rejoin.load(Relaxed)));
    m.insert(
        "retry".into(),
        json!({
            "sent": c.retries_sent.load(Relaxed),
            "sent_over_limit": c.retries_sent_over_limit.load(Relaxed),
            "version_negotiations": c.version_negotiations_sent.load(Relaxed),
            "dropped": c.retry_dropped.load(Relaxed),
            "send_errors": c.retry_send_errors.load(Relaxed),
        }),
    );
    m.insert("recv_no_buffers".into(), json!(c.recv_no_buffers.load(Relaxed)));
    m.insert("batches".into(), json!(c.batches.load(Relaxed)));
    m.insert("sendmmsg_calls".into(), json!(c.sendmmsg_calls.load(Relaxed)));
    m.insert("ring_wakes".into(), json!(c.ring_wakes.load(Relaxed)));
    m.insert(
        "busy_poll".into(),
        json!({ "spins": c.busy_poll_spins.load(Relaxed), "found": c.busy_poll_found.load(Relaxed) }),
    );
    m
}

/// Adds every numeric leaf of `b` into `a` (same shape).
fn add_into(a: &mut Map<String, Value>, b: &Map<String, Value>) {
    for (k, v) in b {
        match (a.get_mut(k), v) {
            (Some(Value::Object(x)), Value::Object(y)) => add_into(x, y),
            (Some(Value::Number(x)), Value::Number(y)) => {
                let s = x.as_u64().unwrap_or(0).wrapping_add(y.as_u64().unwrap_or(0));
                *a.get_mut(k).unwrap_or(&mut Value::Null) = json!(s);
            }
            (None, v) => {
                a.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
}

pub fn render(
    info: &StatusInfo,
    keys: &proto::KeySet,
    snapshot_version: u64,
    shards: &[Arc<ShardCounters>],
    instances: &[InstanceStatus],
    fast_path: Value,
    extra: Value,
) -> String {
    let per_shard: Vec<Map<String, Value>> = shards.iter().map(|c| shard_json(c)).collect();
    let mut total = Map::new();
    for s in &per_shard {
        add_into(&mut total, s);
    }
    let inst: Vec<Value> = instances
        .iter()
        .map(|i| {
            let l = i.live.as_ref();
            json!({
                "server_id": i.server_id,
                "placeable": i.placeable,
                "forward": i.forward,
                "protocol": i.protocol,
                "datagrams": i.counts.datagrams,
                "bytes": i.counts.bytes,
                "drops_full": i.counts.drops_full,
                "fast_datagrams": i.counts.fast_datagrams,
                "stalled": l.is_some_and(|l| l.stalled),
                "stalls": l.map_or(0, |l| l.stalls),
                "handshakes": l.map_or(0, |l| l.handshakes),
                "incoming_bytes": l.map_or(0, |l| l.incoming_bytes),
                "load_age_ms": l.and_then(|l| l.load_age_ms),
                "pressure": format!("{:?}", l.map(|l| l.pressure).unwrap_or_default()).to_lowercase(),
            })
        })
        .collect();
    let mut top = Map::new();
    top.insert("pid".into(), json!(info.pid));
    let window = sys::protocol::window();
    top.insert("protocol".into(), json!({ "newest": window.newest, "oldest": window.oldest }));
    top.insert("io".into(), json!(info.io));
    top.insert("steer".into(), json!(info.steer));
    top.insert("busy_poll_us".into(), json!(info.busy_poll_us));
    top.insert("shards".into(), json!(shards.len()));
    top.insert("cores".into(), json!(info.cores));
    top.insert("listen".into(), json!(info.listen));
    top.insert("snapshot_version".into(), json!(snapshot_version));
    // ADR 0001 key generations: the newest mints, the previous still decodes.
    let newest = keys.newest();
    top.insert("key_newest".into(), json!(newest.get()));
    top.insert("key_previous".into(), json!(keys.live_generations().find(|g| *g != newest).map(|g| g.get())));
    // ADR 0007: each live generation's CID format (`adr1`, or `quic-lb` and its config
    // without the key).
    let format = |g| keys.format(g).map(|f: proto::cid_format::CidFormat| f.name());
    top.insert("key_newest_format".into(), json!(format(newest)));
    top.insert("key_previous_format".into(), json!(keys.live_generations().find(|g| *g != newest).and_then(format)));
    for (k, v) in total {
        top.insert(k, v);
    }
    let shard_list: Vec<Value> = per_shard
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            m.insert("shard".into(), json!(i));
            m.insert("core".into(), json!(info.cores.get(i)));
            Value::Object(m)
        })
        .collect();
    top.insert("per_shard".into(), Value::Array(shard_list));
    // The kernel fast path (crate::dataplane::fast_path): datagrams it steered
    // straight to workers, and what it left to the shards, by reason.
    top.insert("fast_path".into(), fast_path);
    // Liveness (stalls) and the accept guards (docs/operations.md "Liveness and pressure").
    if let Value::Object(m) = extra {
        for (k, v) in m {
            top.insert(k, v);
        }
    }
    top.insert("instances_total".into(), json!(inst.len()));
    // A control message carries at most MAX_TEXT bytes (proto::wire): list as many
    // instances as fit and say so.
    let mut keep = inst.len();
    loop {
        top.insert("instances".into(), Value::Array(inst[..keep].to_vec()));
        top.insert("instances_truncated".into(), json!(keep < inst.len()));
        let s = Value::Object(top.clone()).to_string();
        if s.len() <= MAX_TEXT || keep == 0 {
            return s;
        }
        keep = keep * 3 / 4;
    }
}

/// Human-readable rendering of a status JSON text.
/// `name value` for every non-zero numeric leaf of `v` (nested keys joined by `.`),
/// or `none`.
fn nonzero_leaves(v: &Value) -> String {
    fn walk(v: &Value, name: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    walk(x, &if name.is_empty() { k.clone() } else { format!("{name}.{k}") }, out);
                }
            }
            Value::Number(n) if n.as_u64() != Some(0) => out.push(format!("{name} {n}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, "", &mut out);
    if out.is_empty() {
        "none".into()
    } else {
        out.join("  ")
    }
}

/// Host-to-host forwarding (ADR 0005), when configured.
fn pretty_peers(p: &Value) -> String {
    if p.is_null() {
        return String::new();
    }
    let g = |k: &str| p.pointer(k).and_then(Value::as_u64).unwrap_or(0);
    format!(
        "peers: host {}  alive {}/{}  forwarded {} (errors {})  received {}  injected {} (errors {}, not served {})  dead-peer resets {}  refused: {}\n",
        g("/host"),
        g("/peers_alive"),
        g("/peers"),
        g("/forwarded"),
        g("/forward_errors"),
        g("/received"),
        g("/injected"),
        g("/inject_errors"),
        g("/inject_not_served"),
        g("/dead_peer"),
        nonzero_leaves(&p["refused"])
    )
}

pub fn pretty(json_text: &str) -> Result<String, serde_json::Error> {
    let v: Value = serde_json::from_str(json_text)?;
    let g = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let mut s = String::new();
    s += &format!(
        "data plane pid {}  io {}  steer {}  shards {}  cores {}\n",
        g("/pid"),
        v["io"].as_str().unwrap_or("?"),
        v["steer"].as_str().unwrap_or("?"),
        g("/shards"),
        v["cores"]
    );
    s += &format!("listen {}\n", v["listen"]);
    s += &format!("datagrams in {}  bytes in {}  GRO trains {}\n", g("/datagrams_in"), g("/bytes_in"), g("/trains_in"));
    s += "reasons:";
    for r in Reason::ALL {
        s += &format!("  {} {}", r.name(), g(&format!("/reasons/{}", r.name())));
    }
    s += "\n";
    s += &format!(
        "drops: no instance {}  full instance socket {}  truncated {}  send error {}\n",
        g("/drops/no_instance"),
        g("/drops/full"),
        g("/drops/truncated"),
        g("/drops/send_error")
    );
    s += &format!(
        "refused: RateLimited {}  HandshakeLimited {}  Overloaded {}\nretry: sent {}  dropped {}  send errors {}\n",
        g("/refused/RateLimited"),
        g("/refused/HandshakeLimited"),
        g("/refused/Overloaded"),
        g("/retry/sent"),
        g("/retry/dropped"),
        g("/retry/send_errors")
    );
    s += "owner initials (live DCID):";
    for o in OwnerInitialOutcome::ALL {
        s += &format!("  {} {}", o.name(), g(&format!("/owner_initial/{}", o.name())));
    }
    s += "\n";
    s += &format!("socket drops (kernel, before a shard read them) {}\n", g("/socket_drops"));
    s += &pretty_fast_path(&v["fast_path"]);
    s += &pretty_peers(&v["peers"]);
    s += &format!("trust refusals: {}\n", nonzero_leaves(&v["peer_refused"]));
    s += &format!(
        "liveness: stalls {}  stalled now {}  pressure retry above {}  drop above {}\n",
        g("/liveness/stalls"),
        g("/liveness/stalled"),
        g("/liveness/pressure_retry_above"),
        g("/liveness/pressure_drop_above")
    );
    s += &format!(
        "accept: waiting for hello {} (cap {})  data: failures {} over cap {} hello timeouts {}  control: failures {} over cap {} hello timeouts {}\n",
        g("/accept/waiting_for_hello"),
        g("/accept/pending_cap"),
        g("/accept/data/failures"),
        g("/accept/data/over_cap"),
        g("/accept/data/hello_timeouts"),
        g("/accept/control/failures"),
        g("/accept/control/over_cap"),
        g("/accept/control/hello_timeouts")
    );
    s += &format!(
        "{:>9} {:>9} {:>9} {:>5} {:>14} {:>16} {:>10} {:>14} {:>7} {:>6} {:>10} {:>8} {:>8}\n",
        "server_id",
        "placeable",
        "forward",
        "proto",
        "datagrams",
        "bytes",
        "drops_full",
        "fast_datagrams",
        "stalled",
        "stalls",
        "handshakes",
        "load_ms",
        "pressure"
    );
    if let Some(list) = v["instances"].as_array() {
        for i in list {
            s += &format!(
                "{:>9} {:>9} {:>9} {:>5} {:>14} {:>16} {:>10} {:>14} {:>7} {:>6} {:>10} {:>8} {:>8}\n",
                i["server_id"].as_u64().unwrap_or(0),
                if i["placeable"].as_bool().unwrap_or(false) { "yes" } else { "no" },
                i["forward"].as_str().unwrap_or("-"),
                i["protocol"].as_u64().map_or("-".to_string(), |v| v.to_string()),
                i["datagrams"].as_u64().unwrap_or(0),
                i["bytes"].as_u64().unwrap_or(0),
                i["drops_full"].as_u64().unwrap_or(0),
                i["fast_datagrams"].as_u64().unwrap_or(0),
                if i["stalled"].as_bool().unwrap_or(false) { "yes" } else { "no" },
                i["stalls"].as_u64().unwrap_or(0),
                i["handshakes"].as_u64().unwrap_or(0),
                i["load_age_ms"].as_u64().map_or("-".to_string(), |m| m.to_string()),
                i["pressure"].as_str().unwrap_or("?")
            );
        }
    }
    if v["instances_truncated"].as_bool() == Some(true) {
        s += &format!("(instance list truncated; {} live)\n", g("/instances_total"));
    }
    Ok(s)
}

/// The fast-path lines of `lb-status`: on or off (and why), the program variant,
/// datagrams steered to workers, trains kept whole, and what went to the shards by
/// reason (`train_to_shard`: trains not provably one worker's, ADR 0004 "Trains").
fn pretty_fast_path(f: &Value) -> String {
    let mode = f["mode"].as_str().unwrap_or("?");
    if f["active"].as_bool() != Some(true) {
        return format!("fast path: off (mode {mode}: {})\n", f["reason"].as_str().unwrap_or("?"));
    }
    let mut s = format!(
        "fast path: on (mode {mode})  program {}  to workers {}  trains kept whole {}  dropped {}\n",
        f["program"].as_str().unwrap_or("?"),
        f["datagrams"].as_u64().unwrap_or(0),
        f["train_fast"].as_u64().unwrap_or(0),
        f["dropped"].as_u64().unwrap_or(0)
    );
    if let Some(why) = f["gso_walk_refused"].as_str() {
        s += &format!("fast path: gso-walk program refused by this kernel: {why}\n");
    }
    s += "fast path to demux:";
    if let Some(m) = f["to_demux"].as_object() {
        for (k, v) in m {
            s += &format!("  {k} {}", v.as_u64().unwrap_or(0));
        }
    }
    s + "\n"
}

#[cfg(test)]
mod tests {
    use super::pretty;

    /// The readable `lb-status` shows what the JSON has for forwarding, kernel socket
    /// drops, trust refusals and each instance's forwarding mode.
    #[test]
    fn readable_status_shows_peers_socket_drops_refusals_and_forward() {
        let json = serde_json::json!({
            "pid": 7, "io": "uring", "steer": "hash", "shards": 1, "cores": [0], "listen": ["198.19.9.9:443"],
            "socket_drops": 12,
            "peer_refused": { "data": { "wrong_pid": 2, "wrong_uid": 0 } },
            "peers": { "host": 1, "peers": 2, "peers_alive": 1, "forwarded": 30, "received": 4, "injected": 4,
                       "dead_peer": 5, "refused": { "replayed": 3, "unauthenticated": 0 } },
            "instances": [ { "server_id": 16384, "placeable": true, "forward": "ring" } ],
        });
        let text = pretty(&json.to_string()).expect("valid JSON");
        for want in [
            "socket drops (kernel, before a shard read them) 12",
            "peers: host 1  alive 1/2  forwarded 30",
            "dead-peer resets 5  refused: replayed 3\n",
            "trust refusals: data.wrong_pid 2\n",
            "ring",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        // The fast path: program variant, trains kept whole and sent to the shards.
        let fp = serde_json::json!({ "instances": [], "fast_path": {
            "mode": "auto", "active": true, "program": "size-limit", "datagrams": 40, "train_fast": 3,
            "dropped": 0, "gso_walk_refused": "no kfuncs",
            "to_demux": { "long_header": 1, "train_to_shard": 7 } } });
        let text = pretty(&fp.to_string()).expect("valid JSON");
        for want in [
            "fast path: on (mode auto)  program size-limit  to workers 40  trains kept whole 3  dropped 0\n",
            "gso-walk program refused by this kernel: no kfuncs\n",
            "fast path to demux:  long_header 1  train_to_shard 7\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        // Client Initials on live DCIDs, by outcome (proto::limits::owner_initial).
        let owner = serde_json::json!({ "owner_initial": { "follow_up": 3, "rate_limited": 398, "admitted": 2 } });
        let text = pretty(&owner.to_string()).expect("valid JSON");
        assert!(
            text.contains(
                "owner initials (live DCID):  token 0  placed 0  follow_up 3  admitted 2  dropped_pressure 0"
            ) && text.contains("handshake_limited 0  rate_limited 398\n"),
            "{text}"
        );
        // Without forwarding and refusals: no peers line, refusals "none".
        let plain = pretty(&serde_json::json!({ "instances": [] }).to_string()).expect("valid JSON");
        assert!(!plain.contains("peers:") && plain.contains("trust refusals: none"), "{plain}");
    }
}
