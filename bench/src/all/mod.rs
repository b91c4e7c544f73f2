//! `bench all`: the demux (io_uring and mmsg), the per-datagram baseline,
//! nginx's stream UDP proxy and a recv-and-drop floor, side by side in one run.
//!
//! Every contender runs as its own process pinned to the shard core; a sender
//! (in this process, pinned to the load core) offers 1200-byte datagrams for
//! `--seconds`, uncoalesced and as UDP_SEGMENT trains of 8. The figure is the
//! contender's CPU time (schedstat of all its threads) divided by the datagrams it
//! handled (forwarded; for the floor: received). Rounds alternate the order of the
//! contenders. Then the demux hop's latency at 0/25/50/75 % of the io_uring demux's
//! measured saturation (latency.rs).
//!
//! This module is the orchestration: options, the rounds, the latency runs, then the
//! outputs. contenders.rs starts each contender; run.rs measures one run; latency.rs
//! the latency runs; report.rs turns the results into the Markdown block, the SVG
//! chart and the JSON; docs.rs puts the block into docs/benchmarks.md.

pub(crate) mod contenders;
mod docs;
mod latency;
mod report;
mod run;

use crate::cli::AllArgs;
use crate::report::{command_output, loadavg, loadavg_now};
use anyhow::{bail, Context, Result};
use contenders::{ensure_nginx, DirGuard, NGINX};
use latency::{latency_paths, run_latency, LOADS_PCT};
use report::{mode_name, offered_name, report, summarize, svg, Conditions};
use run::run_once;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The options of one `bench all`, resolved from the command line.
pub(super) struct Opts {
    pub(super) seconds: f64,
    pub(super) reps: usize,
    pub(super) contenders: Vec<String>,
    pub(super) trains: Vec<usize>,
    /// Offered datagrams/s per run (0: unpaced, as fast as the sender can).
    pub(super) rates: Vec<f64>,
    pub(super) shard_core: usize,
    pub(super) load_core: usize,
    pub(super) latency: bool,
    /// Also run `bench saturation` (its defaults, these rounds, trains and cores).
    pub(super) saturation: bool,
    /// Measure latency with udpflood --latency and echo workers (round trips) instead
    /// of the in-bench one-way probe.
    pub(super) udpflood: bool,
    /// Latency runs: SCHED_FIFO for the demux and the probe threads.
    pub(super) rt: bool,
    pub(super) lat_seconds: f64,
    /// Latency runs: also the demux with `--busy-poll-us` this many µs, and the
    /// direct-socket floor (0: neither).
    pub(super) busy_poll_us: u32,
    pub(super) probe_rate: f64,
    pub(super) doc: Option<PathBuf>,
    pub(super) svg: Option<PathBuf>,
    pub(super) json: Option<PathBuf>,
    pub(super) install_nginx: bool,
    pub(super) nice: i32,
}

impl From<AllArgs> for Opts {
    fn from(a: AllArgs) -> Opts {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let (doc, svg) = if a.no_doc {
            (None, None)
        } else {
            (
                Some(a.doc.unwrap_or_else(|| docs.join("benchmarks.md"))),
                Some(a.svg.unwrap_or_else(|| docs.join("benchmarks-cpu.svg"))),
            )
        };
        Opts {
            seconds: a.seconds,
            reps: a.rounds.reps,
            contenders: a.contenders,
            trains: a.trains,
            rates: a.rate.map_or(a.rates, |r| vec![r]),
            shard_core: a.rounds.shard_core,
            load_core: a.rounds.load_core,
            latency: !a.no_latency,
            saturation: !a.no_saturation,
            udpflood: a.udpflood,
            rt: !a.no_rt,
            lat_seconds: a.latency_seconds,
            busy_poll_us: a.busy_poll_us,
            probe_rate: a.probe_rate,
            doc,
            svg,
            json: a.json,
            install_nginx: !a.no_install,
            nice: a.rounds.nice,
        }
    }
}

/// Release binaries next to this one; built first unless BENCH_NO_BUILD is set.
fn bins(o: &Opts) -> Result<PathBuf> {
    let dir = std::env::current_exe()?.parent().context("exe dir")?.to_path_buf();
    let mut pkgs = vec![];
    if o.contenders.iter().any(|c| c.starts_with("demux")) {
        pkgs.push("demux");
    }
    if o.latency && o.udpflood && o.contenders.iter().any(|c| c == "demux-uring") {
        pkgs.extend(["worker", "udpflood"]);
    }
    if std::env::var_os("BENCH_NO_BUILD").is_none() && !pkgs.is_empty() {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--release"]);
        for p in &pkgs {
            cmd.args(["-p", p]);
        }
        if !cmd.status().context("cargo build --release")?.success() {
            bail!("cargo build --release {pkgs:?} failed");
        }
    }
    for p in pkgs {
        if !dir.join(p).exists() {
            bail!("{} missing (build it, or unset BENCH_NO_BUILD)", dir.join(p).display());
        }
    }
    Ok(dir)
}

/// The machine and its state, for the report's "Conditions" line.
fn conditions(o: &Opts, load_start: &str) -> Conditions {
    Conditions {
        date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        kernel: command_output("uname", &["-r"]),
        cpu: crate::sys::cpu_model(),
        ncpu: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        load_start: loadavg(load_start),
        load_end: loadavg_now(),
        rustc: command_output("rustc", &["--version"]),
        nginx: if o.contenders.iter().any(|c| c == "nginx") {
            command_output(NGINX, &["-v"]).trim_start_matches("nginx version: ").to_string()
        } else {
            "not run".into()
        },
    }
}

/// The machine is shared: run the contenders, the sender and the sinks at a high
/// priority so other processes take little of their cores (children inherit it).
/// With autogroup scheduling (kernel.sched_autogroup_enabled) a task's nice value
/// only weighs within its session, so the bench first starts a session of its own
/// (setsid: a new autogroup holding only the bench and its children), gives that
/// group the nice value, and asks for SIGTERM if its parent (cargo) goes away.
pub(crate) fn prioritize(nice: i32) {
    // SAFETY: plain syscalls on this process.
    unsafe {
        if libc::setsid() >= 0 {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        }
        if libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
            eprintln!("bench: setpriority({nice}): {}", std::io::Error::last_os_error());
        }
    }
    if Path::new("/proc/self/autogroup").exists() {
        if let Err(e) = std::fs::write("/proc/self/autogroup", nice.to_string()) {
            eprintln!("bench: /proc/self/autogroup: {e}");
        }
    }
}

pub fn main(args: AllArgs) -> Result<()> {
    let o = Opts::from(args);
    let t_start = Instant::now();
    if o.nice != 0 {
        prioritize(o.nice);
    }
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    if o.contenders.iter().any(|c| c == "nginx") {
        ensure_nginx(o.install_nginx)?;
    }
    let bins = bins(&o)?;
    let tmp = std::env::temp_dir().join(format!("qdbench-all-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let _tg = DirGuard(tmp.clone());
    let mut rows = Vec::new();
    for rep in 0..o.reps {
        for (&train, &offered) in o.trains.iter().flat_map(|t| o.rates.iter().map(move |r| (t, r))) {
            let n = o.contenders.len();
            for i in 0..n {
                let kind = &o.contenders[(i + rep) % n];
                let r = run_once(kind, offered, train, rep, &o, &bins, &tmp).with_context(|| {
                    format!("{kind}, {}, {}, round {}", mode_name(train), offered_name(offered), rep + 1)
                })?;
                eprintln!(
                    "round {} {:<12} {:<16} {:<8} {:>7.3} µs CPU/datagram, {:>9.0} datagrams/s handled ({} sent, {} received, {} handled; CPU {:.2} s, waited {:.2} s; sender {:.2} s)",
                    rep + 1,
                    kind,
                    mode_name(train),
                    offered_name(offered),
                    r.us(),
                    r.rate(),
                    r.sent,
                    r.received,
                    r.handled,
                    r.cpu_s,
                    r.wait_s,
                    r.sender_cpu_s
                );
                rows.push(r);
            }
        }
    }
    let sums = summarize(&rows, &o);
    let mut lat = Vec::new();
    let sat = sums
        .iter()
        .find(|m| m.contender == "demux-uring" && m.train == 1 && m.offered == 0.0)
        .map(|m| m.rate)
        .unwrap_or(f64::NAN);
    if o.latency && sat.is_finite() {
        for rep in 0..o.reps {
            for (pct, path) in
                LOADS_PCT.into_iter().flat_map(|p| latency_paths(&o, rep).into_iter().map(move |v| (p, v)))
            {
                let l = run_latency(pct, rep, sat, path, &o, &bins)
                    .with_context(|| format!("latency {pct} %, {}", path.name()))?;
                eprintln!(
                    "latency {pct} % {} ({:.0}/s) round {}: p50 {} µs, p99 {} µs, p99.9 {} µs, lost {}",
                    l.path.name(),
                    l.offered,
                    rep + 1,
                    l.v["p50_us"],
                    l.v["p99_us"],
                    l.v["p999_us"],
                    l.v["lost"]
                );
                lat.push(l);
            }
        }
    }
    let c = conditions(&o, &load_start);
    let text = report(&rows, &sums, &lat, sat, &o, &c, t_start.elapsed().as_secs_f64());
    println!("{text}");
    if let Some(p) = &o.doc {
        docs::write_doc(p, &text)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &o.svg {
        std::fs::write(p, svg(&sums, &o))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &o.json {
        std::fs::write(p, serde_json::to_string_pretty(&report::json(&rows, &lat))?)?;
    }
    if o.saturation {
        // Capacity where the sender cannot limit it; needs root (SO_RCVBUFFORCE).
        let s = crate::cli::SaturationArgs {
            datagrams: crate::cli::SATURATION_DATAGRAMS,
            queue: crate::cli::MAX_SATURATION_QUEUE,
            rounds: crate::cli::Rounds { reps: o.reps, shard_core: o.shard_core, load_core: o.load_core, nice: o.nice },
            contenders: crate::cli::SATURATION_CONTENDERS.map(String::from).to_vec(),
            trains: o.trains.clone(),
            fill_core: crate::cli::FillCore::Shard,
            doc: o.doc.clone(),
            json: None,
        };
        if let Err(e) = crate::saturation::run(&s, command_output("uptime", &[])) {
            eprintln!("bench: saturation runs failed (the rest is written): {e:#}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Opts;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn opts(line: &str) -> Opts {
        let cli = Cli::try_parse_from(["bench", "all"].into_iter().chain(line.split_whitespace())).unwrap();
        let Command::All(a) = cli.command else { panic!() };
        Opts::from(a)
    }

    #[test]
    fn resolved_like_the_hand_written_parser() {
        let o = opts("");
        assert!(o.doc.as_ref().unwrap().ends_with("docs/benchmarks.md"));
        assert!(o.svg.as_ref().unwrap().ends_with("docs/benchmarks-cpu.svg"));
        assert_eq!(o.rates, [0.0, 100_000.0]);
        assert!(o.latency && o.saturation && o.rt && o.install_nginx && !o.udpflood && o.json.is_none());
        let o = opts("--no-doc --rate 5000 --no-latency --no-rt --no-install --udpflood");
        assert!(o.doc.is_none() && o.svg.is_none());
        assert_eq!(o.rates, [5000.0]);
        assert!(!o.latency && !o.rt && !o.install_nginx && o.udpflood);
        assert!(!opts("--no-saturation").saturation);
        let o = opts("--doc /tmp/b.md");
        assert_eq!(o.doc.unwrap().to_str(), Some("/tmp/b.md"));
        assert!(o.svg.unwrap().ends_with("docs/benchmarks-cpu.svg"));
    }

    /// Without `--busy-poll-us` only the demux's own latency runs; with it, each
    /// round runs the three paths once each, starting with a different one.
    #[test]
    fn latency_paths_rotate_with_busy_poll() {
        use super::latency::{latency_paths, LatPath};
        assert_eq!(latency_paths(&opts(""), 0), [LatPath::Demux]);
        let o = opts("--busy-poll-us 50");
        assert_eq!(o.busy_poll_us, 50);
        let rounds: Vec<Vec<LatPath>> = (0..3).map(|r| latency_paths(&o, r)).collect();
        for r in &rounds {
            let mut names: Vec<&str> = r.iter().map(|p| p.name()).collect();
            names.sort_unstable();
            assert_eq!(names, ["demux", "demux, busy poll", "direct socket"]);
        }
        let firsts: std::collections::HashSet<LatPath> = rounds.iter().map(|r| r[0]).collect();
        assert_eq!(firsts.len(), 3, "each round starts with another path: {rounds:?}");
        assert!(Cli::try_parse_from(["bench", "all", "--busy-poll-us", "5", "--udpflood"]).is_err());
    }
}
