//! `bench h3`: what the appliance costs an HTTP/3 service, against the same server
//! alone on the port (docs/benchmarks.md "HTTP/3 against quinn alone").
//!
//! Contenders, each started afresh per round and stopped after its loads:
//! (a) `alone`: `worker --listen` (quinn's own UDP socket, quinn-udp GSO/GRO);
//! (b) `fast`: `demux --state-dir` with one worker, `--fast-path on`;
//! (c) `user`: the same with `--fast-path off`;
//! (d) `two`: two workers and a shard on each of the two cores.
//! (a)–(c) run with every server process pinned to the shard core (`taskset`, the
//! data plane's one shard `--cores SHARD`) and the client's runtime (one thread) on
//! the load core; (d) takes both cores for the server (`--cores 0-1`), so its
//! client (two threads) is not pinned. The appliance runs with `--limits off`:
//! with its per-source limits (40 new connections at once, then 10/s, per client
//! address) the one-address new-connection load would get a demux-minted Retry
//! (proto::limits::owner_initial) for nearly every connection.
//!
//! Loads (h3_load.rs), one after the other per contender: `get-1k` and `get-64k`
//! (16 established connections, one GET in flight on each), `new-conn` (16 at once,
//! each a full handshake, one 1 KiB GET, close) and `download` (one GET of 256 MiB).
//! Server CPU = schedstat time of every server process (controller, data plane,
//! workers) over the window.

use crate::cli::H3Args;
use crate::dataplane::{demux_bin, with_parent};
use crate::h3_load::{Client, Measured, SMALL};
use crate::report::{fixed, loadavg, median, thousands, write_outputs};
use crate::saturation::signal;
use crate::sys::{cpu_model, schedstat_ns, Schedstat};
use anyhow::{bail, Context, Result};
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BEGIN: &str = "<!-- bench h3: begin";
const END: &str = "<!-- bench h3: end -->";

/// The `worker` binary next to this one (built with `cargo build --release -p
/// worker` unless `BENCH_NO_BUILD` is set and it exists).
fn worker_bin() -> Result<PathBuf> {
    let bin = std::env::current_exe()?.with_file_name("worker");
    if std::env::var_os("BENCH_NO_BUILD").is_some() && bin.exists() {
        return Ok(bin);
    }
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "-p", "worker"])
        .status()
        .context("cargo build --release -p worker")?;
    if !status.success() || !bin.exists() {
        bail!("could not build {}", bin.display());
    }
    Ok(bin)
}

/// The letter the docs give a contender.
pub(crate) fn letter(kind: &str) -> &'static str {
    match kind {
        "alone" => "(a)",
        "fast" => "(b)",
        "user" => "(c)",
        "proxy" => "(e)",
        "proxy-unix" => "(f)",
        "proxy-h2c" => "(g)",
        _ => "(d)",
    }
}

/// What `bench h3` and `bench proxy` (proxy.rs) do differently.
pub(crate) struct Flavor<'a> {
    /// The subcommand, for the generated block's header.
    pub(crate) command: &'static str,
    /// The generated block's markers in the doc.
    pub(crate) markers: (&'static str, &'static str),
    /// The contender the ratios are over.
    pub(crate) base: &'static str,
    /// The chart's title.
    pub(crate) title: &'static str,
    /// The chart's dashed line (a ratio).
    pub(crate) line: f64,
    pub(crate) targets: fn(&[Sum]) -> Vec<Target>,
    /// Appended to the conditions.
    pub(crate) conditions: String,
    /// `proxy`'s upstream (its CPU is reported apart from the servers').
    pub(crate) upstream: Option<&'a crate::proxy::Upstream>,
}

/// A running contender.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// Every server process (the controller's descendants included).
    pids: Vec<u32>,
    /// The appliance's state directory (None: a worker alone).
    state: Option<PathBuf>,
    demux: PathBuf,
    /// The data plane reported the fast path active.
    fast_active: bool,
}

/// The bench's certificate: PEM files for the servers, DER for the client.
struct Identity {
    cert: PathBuf,
    key: PathBuf,
    der: CertificateDer<'static>,
}

fn identity(dir: &Path) -> Result<Identity> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem())?;
    std::fs::write(&key, ck.key_pair.serialize_pem())?;
    Ok(Identity { cert, key, der: ck.cert.der().clone() })
}

/// `pid` and all its descendants (from /proc/*/stat).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
            // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// `demux SUB --state-dir DIR --json`, parsed.
fn demux_json(demux: &Path, sub: &str, state: &Path) -> Option<Value> {
    let out = Command::new(demux).arg(sub).arg("--state-dir").arg(state).arg("--json").output().ok()?;
    out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
}

fn wait_ready<T>(what: &str, child: &mut Child, log: &Path, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(t) = f() {
            return Ok(t);
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!("{what} exited ({st}): {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        if Instant::now() > deadline {
            bail!("{what} not ready in 60 s: {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `taskset -c CORES` before `bin` when `cores` is given (children inherit it).
fn pinned(cores: Option<&str>, bin: &Path) -> Command {
    match cores {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", c]).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

impl Server {
    fn start(
        kind: &str,
        o: &H3Args,
        bins: &(PathBuf, PathBuf),
        id: &Identity,
        dir: &Path,
        upstream: Option<&crate::proxy::Upstream>,
    ) -> Result<Server> {
        let (demux, worker) = bins;
        let shard = o.rounds.shard_core.to_string();
        let log = dir.join(format!("{kind}.log"));
        let logf = std::fs::File::create(&log)?;
        if kind == "alone" {
            let ready = dir.join("alone.ready");
            let _ = std::fs::remove_file(&ready);
            let mut cmd = pinned(Some(&shard), worker);
            cmd.args(["--listen", "127.0.0.1:0", "--log-level", "warn"])
                .arg("--cert")
                .arg(&id.cert)
                .arg("--key")
                .arg(&id.key)
                .arg("--ready-file")
                .arg(&ready);
            let mut child = with_parent(&mut cmd).stdin(Stdio::null()).stdout(Stdio::null()).stderr(logf).spawn()?;
            let text = wait_ready("worker --listen", &mut child, &log, || std::fs::read_to_string(&ready).ok())?;
            let addr = text
                .lines()
                .find_map(|l| l.strip_prefix("udp ")?.parse().ok())
                .with_context(|| format!("no `udp ADDR` in {text:?}"))?;
            let pid = child.id();
            return Ok(Server { child, addr, pids: vec![pid], state: None, demux: demux.clone(), fast_active: false });
        }
        let state = dir.join(format!("state-{kind}"));
        let _ = std::fs::remove_dir_all(&state);
        let (cores, workers, fast) = match kind {
            "fast" | "proxy" | "proxy-unix" | "proxy-h2c" => (shard.clone(), 1, "on"),
            "user" => (shard.clone(), 1, "off"),
            _ => ("0-1".to_string(), 2, "on"),
        };
        let mut cmd = pinned((workers == 1).then_some(shard.as_str()), demux);
        cmd.args(["--listen", "127.0.0.1:0", "--cores", &cores, "--fast-path", fast, "--limits", "off"])
            .args(["--log-level", "warn", "--spawn-workers", &workers.to_string()])
            .arg("--state-dir")
            .arg(&state)
            .arg("--worker-bin")
            .arg(worker)
            .arg(format!("--worker-arg=--cert={}", id.cert.display()))
            .arg(format!("--worker-arg=--key={}", id.key.display()));
        if kind.starts_with("proxy") {
            let up = upstream.context("the proxy contenders need an upstream")?;
            let url = up.url(kind).with_context(|| format!("no upstream URL for {kind}"))?;
            cmd.arg(format!("--worker-arg=--upstream={url}"));
        }
        let mut child = with_parent(&mut cmd).stdin(Stdio::null()).stdout(Stdio::null()).stderr(logf).spawn()?;
        let status = wait_ready("the appliance", &mut child, &log, || {
            let s = demux_json(demux, "status", &state)?;
            let ready = s["workers"].as_array()?.iter().filter(|w| w["state"] == "ready").count();
            (s["dataplane"]["state"] == "running" && ready >= workers).then_some(s)
        })?;
        let addr = status["sockets"][0]["addr"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no socket address in the status: {status}"))?;
        let lb = demux_json(demux, "lb-status", &state).unwrap_or(Value::Null);
        let fast_active = lb["fast_path"]["active"].as_bool() == Some(true);
        let pids = descendants(child.id());
        Ok(Server { child, addr, pids, state: Some(state), demux: demux.clone(), fast_active })
    }

    fn cpu_ns(&self) -> u64 {
        self.pids.iter().map(|&p| schedstat_ns(p, Schedstat::OnCpu)).sum()
    }

    /// Datagrams the fast path carried so far (appliance only).
    fn fast_datagrams(&self) -> u64 {
        let Some(state) = &self.state else { return 0 };
        demux_json(&self.demux, "lb-status", state).and_then(|v| v["fast_path"]["datagrams"].as_u64()).unwrap_or(0)
    }

    /// SIGTERM (the appliance drains its workers and stops its data plane), at most
    /// 15 s, then SIGKILL to whatever of it is left.
    fn stop(mut self) {
        let _ = signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever of it is still there (a pid of ours that has exited may only be
        // reused after we reap it: the child is reaped last).
        for &p in self.pids.iter().skip(1) {
            if Path::new(&format!("/proc/{p}")).exists() {
                let _ = signal(p, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(s) = &self.state {
            let _ = std::fs::remove_dir_all(s);
        }
    }
}

/// One contender under one load in one round.
pub(crate) struct Run {
    pub(crate) kind: String,
    pub(crate) load: String,
    pub(crate) round: usize,
    pub(crate) m: Measured,
    pub(crate) fast_active: bool,
    /// Server processes whose CPU time was summed.
    pub(crate) processes: usize,
    /// CPU time of the upstream over the load (`bench proxy`; else 0).
    pub(crate) upstream_ns: u64,
    /// Requests the upstream answered during the load.
    pub(crate) upstream_requests: u64,
}

impl Run {
    /// Requests (or connections) served per second.
    pub(crate) fn rate(&self) -> f64 {
        self.m.ok as f64 / self.m.secs
    }
    pub(crate) fn mbps(&self) -> f64 {
        self.m.bytes as f64 / self.m.secs / 1e6
    }
    /// Per request served (per connection: one request each), per MB for the download.
    fn per_unit(&self, ns: u64) -> f64 {
        let per = if self.load == "download" { self.m.bytes as f64 / 1e6 } else { self.m.ok as f64 };
        ns as f64 / 1e3 / per
    }
    /// Server CPU µs per request served, per MB for the download.
    pub(crate) fn server_us(&self) -> f64 {
        self.per_unit(self.m.server_ns)
    }
    /// The upstream's CPU µs per request served, per MB for the download.
    pub(crate) fn upstream_us(&self) -> f64 {
        self.per_unit(self.upstream_ns)
    }
    /// Server CPU in cores (1.0: one core busy all the window).
    pub(crate) fn server_cores(&self) -> f64 {
        self.m.server_ns as f64 / 1e9 / self.m.secs
    }
    pub(crate) fn client_cores(&self) -> f64 {
        self.m.client_ns as f64 / 1e9 / self.m.secs
    }
    fn pct(&self, q: f64) -> f64 {
        if self.m.latency.is_empty() {
            f64::NAN
        } else {
            self.m.latency.value_at_quantile(q) as f64
        }
    }
    fn json(&self) -> Value {
        json!({
            "contender": self.kind, "load": self.load, "round": self.round + 1,
            "issued": self.m.issued, "ok": self.m.ok, "failed": self.m.failed, "bytes": self.m.bytes,
            "secs": self.m.secs, "rate": self.rate(), "mb_per_s": self.mbps(),
            "server_cpu_us_per_request_or_mb": self.server_us(), "server_cores": self.server_cores(),
            "client_cores": self.client_cores(), "p50_us": self.pct(0.5), "p99_us": self.pct(0.99),
            "p999_us": self.pct(0.999), "fast_path_active": self.fast_active, "server_processes": self.processes, "errors": self.m.errors,
            "upstream_cpu_us_per_request_or_mb": self.upstream_us(), "upstream_requests": self.upstream_requests,
        })
    }
}

/// Medians over the rounds of one contender under one load.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sum {
    pub(crate) kind: String,
    pub(crate) load: String,
    pub(crate) rate: f64,
    pub(crate) mbps: f64,
    pub(crate) server_us: f64,
    pub(crate) upstream_us: f64,
    pub(crate) server_cores: f64,
    pub(crate) client_cores: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) failed: u64,
    pub(crate) served: u64,
}

fn summarize(runs: &[Run], kinds: &[String], loads: &[String]) -> Vec<Sum> {
    let mut out = Vec::new();
    for load in loads {
        for kind in kinds {
            let rs: Vec<&Run> = runs.iter().filter(|r| &r.kind == kind && &r.load == load).collect();
            if rs.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(|r| f(r)).collect());
            out.push(Sum {
                kind: kind.clone(),
                load: load.clone(),
                rate: m(&Run::rate),
                mbps: m(&Run::mbps),
                server_us: m(&Run::server_us),
                upstream_us: m(&Run::upstream_us),
                server_cores: m(&Run::server_cores),
                client_cores: m(&Run::client_cores),
                p50: m(&|r| r.pct(0.5)),
                p99: m(&|r| r.pct(0.99)),
                p999: m(&|r| r.pct(0.999)),
                failed: rs.iter().map(|r| r.m.failed).sum(),
                served: rs.iter().map(|r| r.m.ok).sum(),
            });
        }
    }
    out
}

/// A target of the issue, checked on the medians.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) ratio: f64,
    /// None: reported only.
    pub(crate) met: Option<bool>,
}

pub(crate) fn find<'a>(sums: &'a [Sum], kind: &str, load: &str) -> Option<&'a Sum> {
    sums.iter().find(|s| s.kind == kind && s.load == load)
}

/// (b) ≥ 0.9× (a) requests/s and ≤ 1.1× (a) CPU per request on established
/// connections; (b) ≥ 0.8× (a) new connections/s; (d) over (a), reported.
pub(crate) fn targets(sums: &[Sum]) -> Vec<Target> {
    let mut out = Vec::new();
    let ratio = |k: &str, load: &str, f: fn(&Sum) -> f64| -> Option<f64> {
        Some(f(find(sums, k, load)?) / f(find(sums, "alone", load)?))
    };
    for load in ["get-1k", "get-64k"] {
        if let Some(r) = ratio("fast", load, |s| s.rate) {
            out.push(Target { what: format!("(b)/(a) requests/s, {load} ≥ 0.9"), ratio: r, met: Some(r >= 0.9) });
        }
        if let Some(r) = ratio("fast", load, |s| s.server_us) {
            out.push(Target {
                what: format!("(b)/(a) CPU per request, {load} ≤ 1.1"), ratio: r, met: Some(r <= 1.1)
            });
        }
    }
    if let Some(r) = ratio("fast", "new-conn", |s| s.rate) {
        out.push(Target { what: "(b)/(a) new connections/s ≥ 0.8".into(), ratio: r, met: Some(r >= 0.8) });
    }
    for load in crate::cli::H3_LOADS {
        let f: fn(&Sum) -> f64 = if load == "download" { |s| s.mbps } else { |s| s.rate };
        if let Some(r) = ratio("two", load, f) {
            let unit = if load == "download" { "MB/s" } else { "rate" };
            out.push(Target { what: format!("(d)/(a) {unit}, {load} (reported)"), ratio: r, met: None });
        }
    }
    out
}

fn load_name(load: &str, o: &H3Args) -> String {
    match load {
        "get-1k" => format!("1 KiB GETs, {} connections", o.connections),
        "get-64k" => format!("64 KiB GETs, {} connections", o.connections),
        "new-conn" => format!("new connections, {} at once, one {SMALL}-byte GET each", o.handshakes),
        _ => format!("one {} MiB download", o.download_mib),
    }
}

/// The load in a few words (the chart's labels).
fn short_name(load: &str, o: &H3Args) -> String {
    match load {
        "get-1k" => "1 KiB GETs".into(),
        "get-64k" => "64 KiB GETs".into(),
        "new-conn" => "new connections".into(),
        _ => format!("{} MiB download", o.download_mib),
    }
}

fn report(runs: &[Run], sums: &[Sum], o: &H3Args, f: &Flavor, load_start: &str, secs: f64) -> String {
    let out = |c: &str, a: &[&str]| crate::report::command_output(c, a);
    let mut s = format!(
        "{} (generated by `cargo run --release -p bench -- {} --doc docs/benchmarks.md`; edits inside are overwritten) -->\n#### Run finished {}\n\n",
        f.markers.0,
        f.command,
        out("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
    );
    let fast: Vec<String> = ["fast", "two", "proxy", "proxy-unix", "proxy-h2c"]
        .iter()
        .filter(|k| runs.iter().any(|r| r.kind == **k))
        .map(|k| {
            let on = runs.iter().filter(|r| r.kind == *k).all(|r| r.fast_active);
            format!("{} {}", letter(k), if on { "active" } else { "NOT active" })
        })
        .collect();
    s += &format!(
        "Conditions: Linux {}, {} ({} CPUs), {}; load average at start {} (at end {}); {} round(s) of {} s per contender and load, contenders in rotating order, each started afresh per round; (a)–(c): every server process on core {} (`taskset`; the appliance `--cores {}`), the client on core {} (one runtime thread); (d): the appliance `--cores 0-1` with two workers, the client unpinned (two runtime threads); the appliance with `--limits off` (with its default per-source limits, one client address's new connections beyond 40 + 10/s each get a demux-minted Retry first), `--retry auto` (Retries only above 10 000 new connections/s per shard), everything else default; fast path: {}; the client: quinn + h3 in the bench, one UDP socket, no TLS session resumption, closed loop (each task's next request when the last one completed); a request counts only with status 200 and its whole body; server CPU = schedstat time of every server process (controller, data plane, workers) over the window; the bench and all it starts at nice {}.{} Whole run: {:.0} s. Figures are medians over the rounds.\n\n",
        out("uname", &["-r"]),
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        out("rustc", &["--version"]),
        loadavg(load_start),
        crate::report::loadavg_now(),
        o.rounds.reps,
        o.seconds,
        o.rounds.shard_core,
        o.rounds.shard_core,
        o.rounds.load_core,
        if fast.is_empty() { "–".into() } else { fast.join(", ") },
        o.rounds.nice,
        f.conditions,
        secs,
    );
    let (b, up) = (letter(f.base), f.upstream.is_some());
    s += &format!(
        "| load | contender | served /s | MB/s | **server CPU µs / request** (download: / MB) |{} server cores | client cores | p50 µs | p99 µs | p99.9 µs | rate vs {b} | CPU vs {b} | failed / served |\n",
        if up { " upstream CPU µs / request (download: / MB) |" } else { "" }
    );
    s += &format!("|---|---|---|---|---|{}---|---|---|---|---|---|---|---|\n", if up { "---|" } else { "" });
    for x in sums {
        let a = find(sums, f.base, &x.load);
        let vs = |f: fn(&Sum) -> f64| a.map_or(f64::NAN, |a| f(x) / f(a));
        let rate_vs = vs(if x.load == "download" { |s| s.mbps } else { |s| s.rate });
        s += &format!(
            "| {} | {} {} | {} | {} | **{}** |{} {} | {} | {} | {} | {} | {} | {} | {} / {} |\n",
            load_name(&x.load, o),
            letter(&x.kind),
            x.kind,
            if x.load == "download" { fixed(x.rate, 2) } else { thousands(x.rate) },
            fixed(x.mbps, 1),
            fixed(x.server_us, 1),
            if up { format!(" {} |", fixed(x.upstream_us, 1)) } else { String::new() },
            fixed(x.server_cores, 2),
            fixed(x.client_cores, 2),
            thousands(x.p50),
            thousands(x.p99),
            thousands(x.p999),
            fixed(rate_vs, 2),
            fixed(vs(|s| s.server_us), 2),
            x.failed,
            x.served,
        );
    }
    let ts = (f.targets)(sums);
    if !ts.is_empty() {
        s += "\n| target | result | |\n|---|---|---|\n";
        for t in &ts {
            let status = match t.met {
                Some(true) => "met",
                Some(false) => "missed",
                None => "reported",
            };
            s += &format!("| {} | {} | {status} |\n", t.what, fixed(t.ratio, 2));
        }
    }
    s += &format!("\n{}\n", f.markers.1);
    s
}

/// A bar per contender and load: its rate (requests, connections or MB per second)
/// over the base contender's, with lines at 1 and at `f.line`.
fn svg(sums: &[Sum], kinds: &[String], loads: &[String], o: &H3Args, f: &Flavor) -> String {
    use std::fmt::Write;
    const LABEL_W: f64 = 250.0;
    const BAR_W: f64 = 420.0;
    const VALUE_W: f64 = 190.0;
    const ROW_H: f64 = 18.0;
    const GAP: f64 = 12.0;
    const TOP: f64 = 50.0;
    const MAX: f64 = 1.25;
    let colour = |k: &str| match k {
        "alone" => "#bbbbbb",
        "fast" => "#4477aa",
        "user" => "#ee6677",
        "proxy" => "#ccbb44",
        "proxy-unix" => "#aa3377",
        "proxy-h2c" => "#66ccee",
        _ => "#228833",
    };
    let h = TOP + loads.len() as f64 * (kinds.len() as f64 * ROW_H + GAP) + 10.0;
    let w = LABEL_W + BAR_W + VALUE_W;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}, median of {} (higher is better)</text>\n\
         <text x=\"10\" y=\"38\" fill=\"#555\">dashed: {}; value: ratio, and requests/s (download: MB/s)</text>\n",
        f.title,
        o.rounds.reps,
        fixed(f.line, 1)
    );
    let x_of = |r: f64| LABEL_W + r.clamp(0.0, MAX) / MAX * BAR_W;
    let mut y = TOP;
    for load in loads {
        let Some(a) = find(sums, f.base, load) else { continue };
        let v = |x: &Sum| if load == "download" { x.mbps } else { x.rate };
        for k in kinds {
            let Some(m) = find(sums, k, load) else { continue };
            let r = v(m) / v(a);
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}, {} {k}</text>",
                LABEL_W - 6.0,
                y + ROW_H - 5.0,
                short_name(load, o),
                letter(k)
            );
            let bw = if r.is_finite() { x_of(r) - LABEL_W } else { 0.0 };
            let _ = writeln!(
                s,
                "<rect x=\"{LABEL_W}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{}\" fill=\"{}\"/>",
                ROW_H - 3.0,
                colour(k)
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\">{} ({})</text>",
                LABEL_W + bw + 4.0,
                y + ROW_H - 5.0,
                fixed(r, 2),
                if load == "download" { fixed(v(m), 0) } else { thousands(v(m)) }
            );
            y += ROW_H;
        }
        y += GAP;
    }
    for (r, dash) in [(1.0, ""), (f.line, " stroke-dasharray=\"4 3\"")] {
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#333\"{dash}/>",
            y - GAP,
            x = x_of(r)
        );
    }
    s.push_str("</svg>\n");
    s
}

pub fn main(o: H3Args) -> Result<()> {
    let flavor = Flavor {
        command: "h3",
        markers: (BEGIN, END),
        base: "alone",
        title: "HTTP/3 served per second over (a) quinn alone",
        line: 0.9,
        targets,
        conditions: String::new(),
        upstream: None,
    };
    run(o, &flavor)
}

/// Every round of every contender under every load, then the report.
pub(crate) fn run(o: H3Args, f: &Flavor) -> Result<()> {
    let t0 = Instant::now();
    if o.rounds.nice != 0 {
        crate::all::prioritize(o.rounds.nice);
    }
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let bins = (demux_bin()?, worker_bin()?);
    let dir = std::env::temp_dir().join(format!("bench-h3-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let id = identity(&dir)?;
    let (kinds, n) = (o.contenders.clone(), o.contenders.len());
    let mut runs = Vec::new();
    for round in 0..o.rounds.reps {
        for i in 0..n {
            let kind = &kinds[(i + round) % n];
            run_contender(kind, round, &o, f, &bins, &id, &dir, &mut runs)
                .with_context(|| format!("{kind}, round {}", round + 1))?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let sums = summarize(&runs, &kinds, &o.loads);
    let text = report(&runs, &sums, &o, f, &load_start, t0.elapsed().as_secs_f64());
    let json = || {
        let sum_json = |x: &Sum| {
            json!({"contender": x.kind, "load": x.load, "rate": x.rate, "mb_per_s": x.mbps,
                   "server_cpu_us_per_request_or_mb": x.server_us, "server_cores": x.server_cores,
                   "upstream_cpu_us_per_request_or_mb": x.upstream_us,
                   "client_cores": x.client_cores, "p50_us": x.p50, "p99_us": x.p99, "p999_us": x.p999,
                   "failed": x.failed, "served": x.served})
        };
        json!({
            "runs": runs.iter().map(Run::json).collect::<Vec<_>>(),
            "medians": sums.iter().map(sum_json).collect::<Vec<_>>(),
            "targets": (f.targets)(&sums).iter().map(|t| json!({"target": t.what, "ratio": t.ratio, "met": t.met})).collect::<Vec<_>>(),
        })
    };
    write_outputs(&o.out, f.markers, &text, || svg(&sums, &kinds, &o.loads, &o, f), json)
}

/// Starts `kind`, offers every load, stops it.
#[allow(clippy::too_many_arguments)]
fn run_contender(
    kind: &str,
    round: usize,
    o: &H3Args,
    f: &Flavor,
    bins: &(PathBuf, PathBuf),
    id: &Identity,
    dir: &Path,
    runs: &mut Vec<Run>,
) -> Result<()> {
    let server = Server::start(kind, o, bins, id, dir, f.upstream)?;
    eprintln!(
        "round {} {} {kind}: {} server process(es) on {}",
        round + 1,
        letter(kind),
        server.pids.len(),
        server.addr
    );
    let two = kind == "two";
    let result = (|| -> Result<()> {
        let client = if two {
            Client::new(server.addr, &id.der, 2, None)?
        } else {
            Client::new(server.addr, &id.der, 1, Some(o.rounds.load_core))?
        };
        let cpu = || server.cpu_ns();
        let fast_before = server.fast_datagrams();
        let upstream = || f.upstream.map_or((0, 0), |u| (u.cpu_ns(), u.requests()));
        for load in &o.loads {
            let (u0, q0) = upstream();
            let m = match load.as_str() {
                "get-1k" => client.established(1024, o.connections, o.seconds, &cpu)?,
                "get-64k" => client.established(65_536, o.connections, o.seconds, &cpu)?,
                "new-conn" => client.new_connections(o.handshakes, o.seconds, &cpu)?,
                _ => client.download(o.download_mib << 20, &cpu)?,
            };
            let r = Run {
                kind: kind.to_string(),
                load: load.clone(),
                round,
                m,
                fast_active: server.fast_active,
                processes: server.pids.len(),
                upstream_ns: upstream().0.saturating_sub(u0),
                upstream_requests: upstream().1.saturating_sub(q0),
            };
            eprintln!(
                "round {} {} {:<5} {:<8} {:>9.1}/s {:>8.1} MB/s; server {:.1} µs/request ({:.2} cores), client {:.2} cores; p50 {:.0} p99 {:.0} p99.9 {:.0} µs; {} of {} served{}",
                round + 1, letter(kind), kind, load, r.rate(), r.mbps(), r.server_us(), r.server_cores(),
                r.client_cores(), r.pct(0.5), r.pct(0.99), r.pct(0.999), r.m.ok, r.m.issued,
                if r.m.errors.is_empty() { String::new() } else { format!("; errors: {:?}", r.m.errors) }
            );
            runs.push(r);
        }
        if server.state.is_some() {
            eprintln!(
                "round {} {} {kind}: fast path {}, {} datagrams on it",
                round + 1,
                letter(kind),
                if server.fast_active { "active" } else { "inactive" },
                server.fast_datagrams().saturating_sub(fast_before)
            );
        }
        client.finish();
        Ok(())
    })();
    server.stop();
    result
}

/// A median with the given figures and fixed others (p50 1, p99 2, p99.9 3 µs;
/// one core each side; 1 served, 0 failed), for the targets' unit tests.
#[cfg(test)]
pub(crate) fn test_sum(kind: &str, load: &str, rate: f64, mbps: f64, server_us: f64, upstream_us: f64) -> Sum {
    Sum {
        kind: kind.into(),
        load: load.into(),
        rate,
        mbps,
        server_us,
        server_cores: 1.0,
        client_cores: 1.0,
        p50: 1.0,
        p99: 2.0,
        p999: 3.0,
        failed: 0,
        served: 1,
        upstream_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(kind: &str, load: &str, rate: f64, server_us: f64, mbps: f64) -> Sum {
        super::test_sum(kind, load, rate, mbps, server_us, 0.0)
    }

    #[test]
    fn targets_compare_b_and_d_with_a() {
        let sums = vec![
            sum("alone", "get-1k", 1000.0, 10.0, 1.0),
            sum("fast", "get-1k", 900.0, 11.0, 1.0),
            sum("alone", "get-64k", 100.0, 50.0, 6.0),
            sum("fast", "get-64k", 89.0, 55.5, 6.0),
            sum("alone", "new-conn", 500.0, 400.0, 0.5),
            sum("fast", "new-conn", 399.0, 400.0, 0.5),
            sum("user", "new-conn", 10_000.0, 1.0, 0.5),
            sum("two", "download", 1.0, 1.0, 300.0),
            sum("alone", "download", 1.0, 1.0, 200.0),
        ];
        let t = targets(&sums);
        let get = |w: &str| t.iter().find(|x| x.what.starts_with(w)).unwrap().clone();
        // Exactly at the bound is met; just past it is missed.
        assert_eq!(get("(b)/(a) requests/s, get-1k").met, Some(true));
        assert_eq!(get("(b)/(a) CPU per request, get-1k").met, Some(true));
        assert_eq!(get("(b)/(a) requests/s, get-64k").met, Some(false));
        assert_eq!(get("(b)/(a) CPU per request, get-64k").met, Some(false));
        let nc = get("(b)/(a) new connections/s");
        assert_eq!((nc.met, nc.ratio), (Some(false), 0.798));
        // (c) is never a target; (d)'s download is MB/s over (a)'s, reported only.
        assert!(t.iter().all(|x| !x.what.contains("(c)")));
        let d = get("(d)/(a) MB/s, download");
        assert_eq!((d.met, d.ratio), (None, 1.5));
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn descendants_include_the_root_and_its_children() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id();
        let d = descendants(me);
        assert_eq!(d[0], me);
        assert!(d.contains(&child.id()), "{d:?}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
