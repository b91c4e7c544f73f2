//! What operators see (operations contract, "Observability"): `demux status` (the
//! controller's JSON, below), and the Prometheus text endpoint behind `--metrics`,
//! which adds the data plane's counters (asked on its control socket per scrape).

use super::Ctl;
use anyhow::{Context, Result};
use proto::wire::Admin;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl Ctl {
    pub(super) fn status_json(&self) -> Value {
        use super::lifecycle::{Phase, WorkerPhase};
        // Registered workers by server id, then the ones not registered (yet).
        let mut list: Vec<_> = self.lc.workers().iter().filter(|w| w.phase() != WorkerPhase::Exited).collect();
        list.sort_by_key(|w| (w.server_id().is_none(), w.server_id()));
        let workers: Vec<Value> = list
            .into_iter()
            .map(|w| {
                let reg = w.registration();
                json!({
                    "server_id": w.server_id(),
                    "pid": w.pid(),
                    "state": w.phase().kind().name(),
                    "managed": w.managed(),
                    "rejoined": reg.is_some_and(|r| r.rejoined),
                    "registered_for_s": reg.map_or(0, |r| r.since.elapsed().as_secs()),
                })
            })
            .collect();
        let sockets: Vec<Value> = self
            .udp
            .iter()
            .zip(&self.udp_addrs)
            .enumerate()
            .map(|(i, (fd, a))| json!({ "shard": i / self.per_shard.max(1), "addr": a.to_string(), "fd": fd.as_raw_fd() }))
            .collect();
        let k = &self.keys.keys;
        let dp = self.lc.dataplane();
        let phase = self.lc.phase();
        json!({
            "controller_pid": std::process::id(),
            "state_dir": self.paths.dir.display().to_string(),
            "uptime_s": self.started.elapsed().as_secs(),
            "dataplane": {
                "pid": dp.pid(),
                "state": dp.kind().name(),
                "restarts": self.lc.dataplane_restarts(),
                "adopted": dp.adopted(),
                "last_exit": self.lc.dataplane_last_exit(),
                "control_socket": self.paths.dataplane_sock().display().to_string(),
                "data_socket": self.paths.data_sock().display().to_string(),
            },
            "sockets": sockets,
            "next_server_id": self.counter.next,
            "host": { "bits": self.host.bits(), "id": self.host.host() },
            // control.sock refusals by reason (crate::trust::Refusal).
            "peer_refused": crate::trust::refused_json(),
            "starts_in_generation": self.counter.starts_in_generation,
            "rotate_every": self.opts.rotate_every,
            "key_newest": k.newest.generation.get(),
            "key_newest_prf": k.newest.prf.as_str(),
            "key_newest_format": k.newest.format.describe(),
            "key_previous_format": k.previous.map(|p| p.format.describe()),
            "key_previous": k.previous.map(|p| p.generation.get()),
            "key_previous_prf": k.previous.map(|p| p.prf.as_str()),
            "spawn_workers": self.lc.spawn_workers(),
            "worker_replacements": self.lc.worker_replacements(),
            // The controller's phase (lifecycle::Phase), and the same as booleans.
            "phase": phase.kind().name(),
            "reloading": matches!(phase, Phase::Reloading(_)),
            "shutting_down": matches!(phase, Phase::ShuttingDown(_)),
            "summary": self.lc.summary(),
            // Lifecycle events refused since start (each is logged).
            "refused_events": self.lc.refused(),
            // An upgrade under way (upgrade.rs): its step and target binaries.
            "upgrade": self.upgrade_json(),
            "workers": workers,
            // control.sock accepts (crate::accept_guard).
            "accept": {
                "paused": self.accept_guard.paused(),
                "failures": self.accept_guard.failures,
                "over_cap": self.accept_guard.over_cap,
                "hello_timeouts": self.accept_guard.hello_timeouts,
                "waiting_for_hello": self.conns.values().filter(|c| c.idle_since.is_some()).count(),
                "pending_cap": self.pending_cap,
            },
        })
    }

    pub(super) fn publish_status(&self) {
        if let Ok(mut g) = self.status_out.lock() {
            *g = self.status_json();
        }
    }
}

/// Human-readable rendering of the controller's status JSON.
pub fn pretty(v: &Value) -> String {
    let mut s = String::new();
    let dp = &v["dataplane"];
    s += &format!(
        "controller pid {}  state dir {}  up {} s\n",
        v["controller_pid"],
        v["state_dir"].as_str().unwrap_or("?"),
        v["uptime_s"]
    );
    if let Some(summary) = v["summary"].as_str() {
        s += &format!("{summary}\n");
    }
    s += &format!(
        "data plane pid {}  {}  restarts {}{}\n",
        dp["pid"],
        dp["state"].as_str().unwrap_or("?"),
        dp["restarts"],
        if dp["adopted"].as_bool() == Some(true) { "  (adopted)" } else { "" }
    );
    if let Some(list) = v["sockets"].as_array() {
        let addrs: Vec<String> =
            list.iter().map(|x| format!("shard {} {}", x["shard"], x["addr"].as_str().unwrap_or("?"))).collect();
        s += &format!("sockets: {}\n", addrs.join(", "));
    }
    s += &format!(
        "next server id {}  key generation {} {} (previous {} {})  starts in generation {} / {}\n",
        v["next_server_id"],
        v["key_newest"],
        v["key_newest_prf"].as_str().unwrap_or("?"),
        v["key_previous"].as_u64().map_or("none".to_string(), |g| g.to_string()),
        v["key_previous_prf"].as_str().unwrap_or("-"),
        v["starts_in_generation"],
        v["rotate_every"]
    );
    let fp = &v["fast_path"];
    s += &match fp["active"].as_bool() {
        Some(true) => format!(
            "fast path: on (mode {})  program {}  to workers {}  trains to the data plane {}\n",
            fp["mode"].as_str().unwrap_or("?"),
            fp["program"].as_str().unwrap_or("?"),
            fp["datagrams"].as_u64().unwrap_or(0),
            fp["to_demux"]["train_to_shard"].as_u64().unwrap_or(0)
        ),
        _ => format!("fast path: off ({})\n", fp["reason"].as_str().unwrap_or("?")),
    };
    if let Some(step) = v["upgrade"]["step"].as_str() {
        s += &format!(
            "upgrade under way: {step}  to {} and {}\n",
            v["upgrade"]["demux"].as_str().unwrap_or("?"),
            v["upgrade"]["worker"].as_str().unwrap_or("?")
        );
    }
    s += &format!(
        "workers (spawn {}; replaced {}{})\n",
        v["spawn_workers"],
        v["worker_replacements"],
        if v["reloading"].as_bool() == Some(true) { "; rolling reload running" } else { "" }
    );
    s += &format!("{:>9} {:>8} {:>11} {:>8}\n", "server_id", "pid", "state", "managed");
    if let Some(list) = v["workers"].as_array() {
        for w in list {
            s += &format!(
                "{:>9} {:>8} {:>11} {:>8}\n",
                w["server_id"].as_u64().map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
                w["pid"],
                w["state"].as_str().unwrap_or("?"),
                if w["managed"].as_bool() == Some(true) { "yes" } else { "no" }
            );
        }
    }
    s
}

/// Serves Prometheus text on `addr` from a small thread (one request per
/// connection; `GET /metrics` or any path).
/// `status`: the controller's status JSON (None in dataplane-only mode).
pub fn spawn_metrics(addr: SocketAddr, status: Option<Arc<Mutex<Value>>>, dataplane_sock: PathBuf) -> Result<()> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("--metrics {addr}"))?;
    tracing::info!(%addr, "metrics endpoint");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                let mut req = [0u8; 2048];
                let _ = s.read(&mut req);
                let ctl = status.as_ref().map(|st| st.lock().map(|g| g.clone()).unwrap_or(Value::Null));
                let dp = dataplane_status(&dataplane_sock).unwrap_or(Value::Null);
                let body = match &ctl {
                    Some(ctl) => prometheus(ctl, &dp),
                    None => dataplane_metrics(&dp),
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes()));
            }
        })
        .context("spawning the metrics thread")?;
    Ok(())
}

/// The data plane's status JSON (its control socket), bounded by a timeout.
pub fn dataplane_status(path: &std::path::Path) -> Result<Value> {
    match sys::control::request(path, &[&Admin::StatusRequest])?.msg {
        Admin::Status { json } => Ok(serde_json::from_str(&json)?),
        _ => anyhow::bail!("unexpected answer from the data plane"),
    }
}

/// Dataplane-only mode: whether it answered, then every numeric leaf.
fn dataplane_metrics(dp: &Value) -> String {
    let mut s = format!(
        "# HELP quicdemux_dataplane_up 1 when the data plane answers its control socket\n         # TYPE quicdemux_dataplane_up gauge\nquicdemux_dataplane_up {}\n",
        u64::from(!dp.is_null())
    );
    if !dp.is_null() {
        s += &lb_leaves_text(dp);
    }
    s
}

/// Every numeric (and boolean, as 0/1) leaf of the data plane's status JSON
/// (`lb-status --json`) as `quicdemux_lb_<path>`, so no counter can be left out:
/// object keys join the path with `_` (CamelCase becomes snake_case: `reasons.NotQuic`
/// → `quicdemux_lb_reasons_not_quic`); array elements become labels — `shard` or
/// `server_id` when the element has one (that field is the label, not a sample),
/// else `index`. Strings and nulls are skipped.
pub fn lb_leaves(v: &Value) -> Vec<(String, String, Value)> {
    fn snake(k: &str) -> String {
        let mut o = String::new();
        for (i, c) in k.chars().enumerate() {
            if c.is_ascii_uppercase() {
                if i > 0 && !o.ends_with('_') {
                    o.push('_');
                }
                o.push(c.to_ascii_lowercase());
            } else if c.is_ascii_alphanumeric() {
                o.push(c);
            } else {
                o.push('_');
            }
        }
        o
    }
    fn walk(v: &Value, name: &str, labels: &[(String, String)], out: &mut Vec<(String, String, Value)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    walk(x, &format!("{name}_{}", snake(k)), labels, out);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let id = ["shard", "server_id"].into_iter().find(|k| x.get(*k).is_some_and(Value::is_u64));
                    let mut l = labels.to_vec();
                    match id {
                        Some(k) => {
                            l.push((k.to_string(), x[k].to_string()));
                            let mut rest = x.clone();
                            rest.as_object_mut().map(|o| o.remove(k));
                            walk(&rest, name, &l, out);
                        }
                        None => {
                            l.push(("index".to_string(), i.to_string()));
                            walk(x, name, &l, out);
                        }
                    }
                }
            }
            Value::Number(_) | Value::Bool(_) => {
                let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                let l = if l.is_empty() { String::new() } else { format!("{{{}}}", l.join(",")) };
                let n = match v {
                    Value::Bool(b) => Value::from(u64::from(*b)),
                    n => n.clone(),
                };
                out.push((name.to_string(), l, n));
            }
            Value::String(_) | Value::Null => {}
        }
    }
    let mut out = Vec::new();
    walk(v, "quicdemux_lb", &[], &mut out);
    out
}

fn lb_leaves_text(dp: &Value) -> String {
    let mut s = String::new();
    let mut last = String::new();
    let mut leaves = lb_leaves(dp);
    // One TYPE line per name: a name's samples together (per-shard ones interleave).
    leaves.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, labels, v) in leaves {
        if name != last {
            s += &format!("# TYPE {name} gauge\n");
            last = name.clone();
        }
        s += &format!("{name}{labels} {v}\n");
    }
    s
}

fn prometheus(ctl: &Value, dp: &Value) -> String {
    let mut s = String::new();
    let mut metric = |name: &str, help: &str, kind: &str, samples: Vec<(String, u64)>| {
        s += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
        for (labels, v) in samples {
            s += &format!("{name}{labels} {v}\n");
        }
    };
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    metric("quicdemux_controller_up", "1 while the controller runs", "gauge", vec![(String::new(), 1)]);
    metric(
        "quicdemux_dataplane_restarts_total",
        "data plane restarts by the controller",
        "counter",
        vec![(String::new(), u(&ctl["dataplane"]["restarts"]))],
    );
    metric(
        "quicdemux_dataplane_up",
        "1 when the data plane answers its control socket",
        "gauge",
        vec![(String::new(), u64::from(!dp.is_null()))],
    );
    metric(
        "quicdemux_next_server_id",
        "the server id the next instance start gets",
        "gauge",
        vec![(String::new(), u(&ctl["next_server_id"]))],
    );
    let refused = ctl["peer_refused"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (format!("{{socket=\"control\",reason=\"{k}\"}}"), u(v))).collect::<Vec<_>>());
    metric(
        "quicdemux_controller_peer_refused_total",
        "peers refused on control.sock by reason (SO_PEERCRED, registration checks)",
        "counter",
        refused.unwrap_or_default(),
    );
    metric(
        "quicdemux_key_generation",
        "the newest CID key generation",
        "gauge",
        vec![(String::new(), u(&ctl["key_newest"]))],
    );
    metric(
        "quicdemux_worker_replacements_total",
        "spawned workers replaced after dying",
        "counter",
        vec![(String::new(), u(&ctl["worker_replacements"]))],
    );
    let mut by_state: std::collections::BTreeMap<String, u64> =
        ["ready", "registered", "draining", "retiring", "starting"].iter().map(|k| (k.to_string(), 0)).collect();
    for w in ctl["workers"].as_array().into_iter().flatten() {
        *by_state.entry(w["state"].as_str().unwrap_or("unknown").to_string()).or_default() += 1;
    }
    metric(
        "quicdemux_workers",
        "workers known to the controller, by state",
        "gauge",
        by_state.into_iter().map(|(k, v)| (format!("{{state=\"{k}\"}}"), v)).collect(),
    );
    if dp.is_null() {
        return s;
    }
    metric(
        "quicdemux_datagrams_in_total",
        "datagrams received by the data plane",
        "counter",
        vec![(String::new(), u(&dp["datagrams_in"]))],
    );
    metric(
        "quicdemux_bytes_in_total",
        "UDP payload bytes received",
        "counter",
        vec![(String::new(), u(&dp["bytes_in"]))],
    );
    let reasons: Vec<(String, u64)> =
        dp["reasons"].as_object().into_iter().flatten().map(|(k, v)| (format!("{{reason=\"{k}\"}}"), u(v))).collect();
    metric("quicdemux_routed_total", "datagrams by routing reason", "counter", reasons);
    let drops: Vec<(String, u64)> =
        dp["drops"].as_object().into_iter().flatten().map(|(k, v)| (format!("{{why=\"{k}\"}}"), u(v))).collect();
    metric("quicdemux_drops_total", "datagrams dropped", "counter", drops);
    let fp = &dp["fast_path"];
    metric(
        "quicdemux_fast_path_active",
        "1 while the kernel fast path (SK_REUSEPORT program) is attached",
        "gauge",
        vec![(String::new(), u64::from(fp["active"].as_bool() == Some(true)))],
    );
    metric(
        "quicdemux_fast_path_datagrams_total",
        "datagrams the kernel steered straight to their worker",
        "counter",
        vec![(String::new(), u(&fp["datagrams"]))],
    );
    metric(
        "quicdemux_fast_path_program",
        "1 for the SK_REUSEPORT program variant that runs (gso-walk or size-limit)",
        "gauge",
        fp["program"].as_str().map(|p| (format!("{{program=\"{p}\"}}"), 1)).into_iter().collect(),
    );
    metric(
        "quicdemux_fast_path_train_fast_total",
        "GSO/GRO trains the kernel steered whole to their worker (every datagram its own)",
        "counter",
        vec![(String::new(), u(&fp["train_fast"]))],
    );
    let to_demux: Vec<(String, u64)> =
        fp["to_demux"].as_object().into_iter().flatten().map(|(k, v)| (format!("{{why=\"{k}\"}}"), u(v))).collect();
    metric(
        "quicdemux_fast_path_to_demux_total",
        "datagrams the fast path left to the shards, by reason",
        "counter",
        to_demux,
    );
    metric(
        "quicdemux_fast_path_dropped_total",
        "datagrams the fast path dropped because no shard socket could be selected",
        "counter",
        vec![(String::new(), u(&fp["dropped"]))],
    );
    let inst = dp["instances"].as_array().cloned().unwrap_or_default();
    let lab = |i: &Value| format!("{{server_id=\"{}\"}}", u(&i["server_id"]));
    metric(
        "quicdemux_instance_placeable",
        "1 when the instance receives new connections",
        "gauge",
        inst.iter().map(|i| (lab(i), u64::from(i["placeable"].as_bool() == Some(true)))).collect(),
    );
    metric(
        "quicdemux_instance_datagrams_total",
        "datagrams forwarded to the instance",
        "counter",
        inst.iter().map(|i| (lab(i), u(&i["datagrams"]))).collect(),
    );
    metric(
        "quicdemux_instance_bytes_total",
        "bytes forwarded to the instance",
        "counter",
        inst.iter().map(|i| (lab(i), u(&i["bytes"]))).collect(),
    );
    metric(
        "quicdemux_instance_fast_datagrams_total",
        "datagrams the kernel fast path steered to the instance",
        "counter",
        inst.iter().map(|i| (lab(i), u(&i["fast_datagrams"]))).collect(),
    );
    metric(
        "quicdemux_instance_drops_full_total",
        "datagrams dropped on the instance's full socket",
        "counter",
        inst.iter().map(|i| (lab(i), u(&i["drops_full"]))).collect(),
    );
    // Liveness (docs/operations.md "Liveness and pressure").
    metric(
        "quicdemux_instance_stalled",
        "1 while the instance is stalled (no Load heartbeat, or its connection stays full): not placeable",
        "gauge",
        inst.iter().map(|i| (lab(i), u64::from(i["stalled"].as_bool() == Some(true)))).collect(),
    );
    metric(
        "quicdemux_instance_stalls_total",
        "times the instance became stalled",
        "counter",
        inst.iter().map(|i| (lab(i), u(&i["stalls"]))).collect(),
    );
    metric(
        "quicdemux_instance_handshakes",
        "handshakes in progress the instance reports (Load)",
        "gauge",
        inst.iter().map(|i| (lab(i), u(&i["handshakes"]))).collect(),
    );
    metric(
        "quicdemux_stalls_total",
        "instances that became stalled, all instances",
        "counter",
        vec![(String::new(), u(&dp["liveness"]["stalls"]))],
    );
    metric(
        "quicdemux_refused_overloaded_total",
        "token-less Initials dropped: their instance is above --pressure-drop-above",
        "counter",
        vec![(String::new(), u(&dp["refused"]["Overloaded"]))],
    );
    let acc = |who: &str, v: &Value| -> Vec<(String, u64)> {
        ["failures", "over_cap", "hello_timeouts"]
            .iter()
            .map(|k| (format!("{{socket=\"{who}\",what=\"{k}\"}}"), u(&v[*k])))
            .collect()
    };
    let mut samples = acc("controller", &ctl["accept"]);
    samples.extend(acc("dataplane_data", &dp["accept"]["data"]));
    samples.extend(acc("dataplane_control", &dp["accept"]["control"]));
    metric(
        "quicdemux_accept_events_total",
        "accept failures (paused), connections closed over the cap or for no hello",
        "counter",
        samples,
    );
    s += &lb_leaves_text(dp);
    s
}
