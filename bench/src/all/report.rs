//! The results of `bench all` as a Markdown block (the summary tables, the goals,
//! every run), the SVG chart of CPU µs per datagram, and JSON.

use super::docs::{BEGIN, END};
use super::latency::{LatRow, LOADS_PCT};
use super::run::Row;
use super::Opts;
use crate::dataplane::DATAGRAM;
use serde_json::{json, Value};
use std::fmt::Write as _;

// Issue #6's goals, per demux backend, datagram mode and offered rate.
/// CPU µs per uncoalesced datagram, at most.
const GOAL_US_UNCOALESCED: f64 = 0.40;
/// CPU µs per datagram in GRO trains, at most.
const GOAL_US_TRAINS: f64 = 0.10;
/// The baseline's and nginx's CPU per datagram over the demux's, at least.
const GOAL_TIMES_CHEAPER: f64 = 10.0;
/// The demux's CPU per datagram over the floor's, at most.
const GOAL_X_FLOOR: f64 = 1.5;
/// The demux hop's p99 latency in µs at `GOAL_LATENCY_LOAD_PCT` % load, at most.
const GOAL_P99_US: f64 = 20.0;
const GOAL_LATENCY_LOAD_PCT: u32 = 50;
/// A missed goal is reported in % below this factor, as "N×" from it on.
const MISSED_IN_PERCENT_BELOW: f64 = 2.0;

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub(super) fn offered_name(offered: f64) -> String {
    if offered > 0.0 {
        format!("{}/s", thousands(offered))
    } else {
        "unpaced".into()
    }
}

pub(super) fn mode_name(train: usize) -> String {
    if train == 1 {
        "uncoalesced".into()
    } else {
        format!("GRO trains of {train}")
    }
}

pub(super) struct Summary {
    pub(super) contender: String,
    pub(super) offered: f64,
    pub(super) train: usize,
    pub(super) us: f64,
    pub(super) us_min: f64,
    pub(super) us_max: f64,
    pub(super) rate: f64,
    pub(super) x_base: f64,
    pub(super) x_floor: f64,
    pub(super) loss: f64,
    pub(super) busy: f64,
}

pub(super) fn summarize(rows: &[Row], o: &Opts) -> Vec<Summary> {
    let mut out = Vec::new();
    for (&offered, &train) in o.rates.iter().flat_map(|r| o.trains.iter().map(move |t| (r, t))) {
        for c in &o.contenders {
            let mine: Vec<&Row> =
                rows.iter().filter(|r| r.offered == offered && r.train == train && &r.contender == c).collect();
            if mine.is_empty() {
                continue;
            }
            // Ratios within each round (side by side), then the median over rounds.
            let ratio_to = |other: &str| {
                median(
                    mine.iter()
                        .filter_map(|r| {
                            rows.iter()
                                .find(|x| {
                                    x.offered == offered && x.train == train && x.rep == r.rep && x.contender == other
                                })
                                .map(|x| r.us() / x.us())
                        })
                        .collect(),
                )
            };
            let us: Vec<f64> = mine.iter().map(|r| r.us()).collect();
            out.push(Summary {
                contender: c.clone(),
                offered,
                train,
                us: median(us.clone()),
                us_min: us.iter().cloned().fold(f64::INFINITY, f64::min),
                us_max: us.iter().cloned().fold(0.0, f64::max),
                rate: median(mine.iter().map(|r| r.rate()).collect()),
                x_base: ratio_to("baseline"),
                x_floor: ratio_to("floor"),
                loss: median(mine.iter().map(|r| 1.0 - r.handled as f64 / r.sent.max(1) as f64).collect()),
                busy: median(mine.iter().map(|r| r.cpu_s / r.secs).collect()),
            });
        }
    }
    out
}

pub(super) fn fmt(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "–".into()
    }
}

pub(super) fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push('\u{202f}');
        }
        out.push(ch);
    }
    out
}

pub(super) struct Conditions {
    pub(super) date: String,
    pub(super) kernel: String,
    pub(super) cpu: String,
    pub(super) ncpu: usize,
    pub(super) load_start: String,
    pub(super) load_end: String,
    pub(super) rustc: String,
    pub(super) nginx: String,
}

pub(super) fn goal_line(name: &str, value: f64, goal: f64, le: bool) -> String {
    let ok = if le { value <= goal } else { value >= goal };
    let by = if le { value / goal } else { goal / value };
    format!(
        "| {name} | {} | {} | {} |",
        fmt(value, 2),
        fmt(goal, 2),
        if ok {
            "**met**".to_string()
        } else if by < MISSED_IN_PERCENT_BELOW {
            format!("**missed** by {:.0} %", (by - 1.0) * 100.0)
        } else {
            format!("**missed** by {}×", fmt(by, 1))
        }
    )
}

pub(super) fn report(
    rows: &[Row],
    sums: &[Summary],
    lat: &[LatRow],
    sat: f64,
    o: &Opts,
    c: &Conditions,
    secs: f64,
) -> String {
    let mut s = String::new();
    let _ =
        writeln!(s, "{BEGIN} (generated by `cargo run --release -p bench -- all`; edits inside are overwritten) -->");
    let _ = writeln!(s, "### Results: {}\n", c.date);
    let _ = writeln!(
        s,
        "Conditions: Linux {}, {} ({} CPUs), {}; nginx {}; load average at start {} (at end {}); \
         {} repetitions of {} s per contender and mode, contenders in rotating order within each round; \
         contender pinned to core {}, sender (64 flows, sendmmsg of 8 messages) and sinks on core {}; \
         1200-byte short-header datagrams; offered: {}; the bench and everything it starts run at nice {} in an autogroup of their own. Whole run: {:.0} s. \
         Figures are medians over the repetitions; ratios are taken within each round, then the median.\n",
        c.kernel,
        c.cpu,
        c.ncpu,
        c.rustc,
        c.nginx,
        c.load_start,
        c.load_end,
        o.reps,
        o.seconds,
        o.shard_core,
        o.load_core,
        o.rates.iter().map(|&r| offered_name(r)).collect::<Vec<_>>().join(" and "),
        o.nice,
        secs
    );
    for &offered in &o.rates {
        let _ = writeln!(
            s,
            "{}:\n",
            if offered > 0.0 {
                format!("**Paced at {} datagrams/s offered**", thousands(offered))
            } else {
                "**Unpaced** (the sender as fast as it can; \"datagrams/s handled\" is the most the contender handled)"
                    .into()
            }
        );
        let _ = writeln!(s, "| contender | datagrams | **CPU µs / datagram** (min–max) | datagrams/s handled | × baseline | × floor | not handled | contender core busy |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for m in sums.iter().filter(|m| m.offered == offered) {
            let _ = writeln!(
                s,
                "| {} | {} | **{}** ({}–{}) | {} | {} | {} | {} % | {} % |",
                m.contender,
                mode_name(m.train),
                fmt(m.us, 3),
                fmt(m.us_min, 2),
                fmt(m.us_max, 2),
                thousands(m.rate),
                fmt(m.x_base, 3),
                fmt(m.x_floor, 2),
                fmt(m.loss * 100.0, 1),
                fmt(m.busy * 100.0, 0)
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\n\"CPU µs / datagram\": the contender's CPU time (all threads, /proc/<pid>/task/*/schedstat; nginx: its worker \
         process) over the run divided by the datagrams it handled — forwarded to a worker (demux, baseline: \
         SEQPACKET frames accepted by the kernel; nginx: datagrams arriving at its UDP upstreams) or, for the floor, \
         received. \"datagrams/s handled\": handled / send time. \"contender core busy\": its CPU time / send time — \
         unpaced, a contender below ≈ 100 % was limited by the sender, not by its own core. \"not handled\": \
         1 − handled / sent (the kernel dropped what the contender did not take in time, or the contender dropped it). \
         Trains: the sender sets UDP_SEGMENT = 1200 and sends 9600 bytes per message; the floor and the demux \
         receive them with UDP_GRO as one train, the baseline and nginx (no UDP_GRO) as 8 datagrams.\n"
    );
    // Goals.
    let mut goals = String::new();
    for &offered in &o.rates {
        let find = |c: &str, t: usize| sums.iter().find(|m| m.contender == c && m.train == t && m.offered == offered);
        let on = offered_name(offered);
        for io in ["demux-uring", "demux-mmsg"] {
            for &t in &o.trains {
                let Some(m) = find(io, t) else { continue };
                let what = format!("{io}, {}, {on}", mode_name(t));
                let _ = writeln!(
                    goals,
                    "{}",
                    goal_line(
                        &format!("{what}: CPU µs / datagram"),
                        m.us,
                        if t == 1 { GOAL_US_UNCOALESCED } else { GOAL_US_TRAINS },
                        true
                    )
                );
                if m.x_base.is_finite() {
                    let _ = writeln!(
                        goals,
                        "{}",
                        goal_line(&format!("{what}: baseline ÷ demux"), 1.0 / m.x_base, GOAL_TIMES_CHEAPER, false)
                    );
                }
                if let Some(n) = find("nginx", t) {
                    let _ = writeln!(
                        goals,
                        "{}",
                        goal_line(&format!("{what}: nginx ÷ demux"), n.us / m.us, GOAL_TIMES_CHEAPER, false)
                    );
                }
                if m.x_floor.is_finite() {
                    let _ = writeln!(
                        goals,
                        "{}",
                        goal_line(&format!("{what}: demux ÷ floor"), m.x_floor, GOAL_X_FLOOR, true)
                    );
                }
            }
        }
    }
    if !lat.is_empty() {
        if o.udpflood {
            let _ = writeln!(s, "Latency of the demux hop (`--io uring`), round trips: `udpflood --latency` sends {} probes/s of 1200 bytes through the demux to two `worker --echo` (server ids 1, 2) and records round trips in an HDR histogram; this process adds background load (a nice-0 thread) to a third, sink-only worker so that the demux handles the stated share of its saturation ({} datagrams/s: the median io_uring uncoalesced unpaced rate above). The demux on core {}, workers, udpflood and background sender on core {}; {} s per run, {} runs per load, medians of the per-run percentiles. The round trip includes the echo worker and the loopback both ways.\n",
                o.probe_rate, thousands(sat), o.shard_core, o.load_core, o.lat_seconds, o.reps);
        } else {
            let _ = writeln!(s, "Latency of the demux hop (`--io uring`), one way: a probe thread sends {} probes/s (1200-byte short headers for server id 1, the CLOCK_MONOTONIC send time inside) to the demux; a probe worker in the bench (DataHello as server id 1) takes each frame off its data connection and records arrival − send time in an HDR histogram. So the figure is sendto → kernel UDP → demux (receive, decode, route, sendmmsg) → AF_UNIX → the worker's recv. A nice-0 thread adds background load to a sink-only worker (server id 3) so that the demux handles the stated share of its saturation ({} datagrams/s: the median io_uring uncoalesced unpaced rate above). The demux on core {}; the probe sender, probe worker, background sender and sink on core {}; {}; {} s per run, {} runs per load, medians of the per-run percentiles.\n",
                o.probe_rate, thousands(sat), o.shard_core, o.load_core,
                if o.rt { "the demux's threads, the probe sender and the probe worker run SCHED_FIFO (as on cores of their own; `--no-rt`: at the bench's nice value, sharing the cores with the machine's other processes)" } else { "everything at the bench's nice value (`--no-rt`)" },
                o.lat_seconds, o.reps);
        }
        let _ = writeln!(s, "| load | offered datagrams/s | p50 µs | p99 µs | p99.9 µs | max µs | probes lost |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for pct in LOADS_PCT {
            let mine: Vec<&LatRow> = lat.iter().filter(|l| l.pct == pct).collect();
            if mine.is_empty() {
                continue;
            }
            let m = |k: &str| median(mine.iter().filter_map(|l| l.v[k].as_f64()).collect());
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} / {} |",
                if pct == 0 { "probes only".to_string() } else { format!("{pct} %") },
                thousands(mine[0].offered),
                fmt(m("p50_us"), 1),
                fmt(m("p99_us"), 1),
                fmt(m("p999_us"), 1),
                fmt(m("max_us"), 0),
                mine.iter().map(|l| l.v["lost"].as_u64().unwrap_or(0)).sum::<u64>(),
                mine.iter().map(|l| l.v["sent"].as_u64().unwrap_or(0)).sum::<u64>()
            );
        }
        let p99_50 = median(
            lat.iter().filter(|l| l.pct == GOAL_LATENCY_LOAD_PCT).filter_map(|l| l.v["p99_us"].as_f64()).collect(),
        );
        let _ = writeln!(
            goals,
            "{}",
            goal_line(
                &format!(
                    "demux hop p99 µs at {GOAL_LATENCY_LOAD_PCT} % load ({})",
                    if o.udpflood { "round trip" } else { "one way" }
                ),
                p99_50,
                GOAL_P99_US,
                true
            )
        );
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "Goals, from the medians above:\n");
    let _ = writeln!(s, "| goal | measured | target | |\n|---|---|---|---|");
    s.push_str(&goals);
    let _ = writeln!(s, "\n![CPU µs per datagram](benchmarks-cpu.svg)\n");
    let _ = writeln!(s, "<details><summary>Every run</summary>\n");
    let _ = writeln!(s, "| round | contender | datagrams | offered | sent | received | handled | CPU s | send s | CPU µs / datagram | datagrams/s | sender CPU s |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.2} | {:.3} | {} | {:.2} |",
            r.rep + 1,
            r.contender,
            mode_name(r.train),
            offered_name(r.offered),
            r.sent,
            r.received,
            r.handled,
            r.cpu_s,
            r.secs,
            r.us(),
            thousands(r.rate()),
            r.sender_cpu_s
        );
    }
    for l in lat {
        let _ = writeln!(s, "\nlatency {} % round {}: `{}`", l.pct, l.rep + 1, l.v);
    }
    let _ = writeln!(s, "\n</details>\n{END}");
    s
}

// The chart's layout, in pixels: a legend of (mode, rate) series in
// `LEGEND_COLUMNS` columns, then per contender one bar per series. (The small
// offsets that place text on its bar stay inline.)
const LABEL_W: f64 = 110.0;
const BAR_W: f64 = 560.0;
/// Room right of the longest bar for its value.
const VALUE_W: f64 = 70.0;
const ROW_H: f64 = 18.0;
const GROUP_GAP: f64 = 14.0;
const TITLE_H: f64 = 34.0;
const LEGEND_TOP: f64 = 30.0;
const LEGEND_COLUMNS: usize = 2;
const LEGEND_COLUMN_W: f64 = 280.0;
const MARGIN: f64 = 10.0;
/// The scale's least maximum (CPU µs), so that tiny figures do not fill the width.
const MIN_SCALE_US: f64 = 0.1;
const COLORS: [&str; 6] = ["#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d"];

/// The SVG bar chart of CPU µs per datagram (docs/benchmarks-cpu.svg).
pub(super) fn svg(sums: &[Summary], o: &Opts) -> String {
    let max = sums.iter().map(|m| m.us).filter(|x| x.is_finite()).fold(0.0f64, f64::max).max(MIN_SCALE_US);
    let series: Vec<(f64, usize)> = o.rates.iter().flat_map(|&r| o.trains.iter().map(move |&t| (r, t))).collect();
    let groups: Vec<&String> = o.contenders.iter().filter(|c| sums.iter().any(|m| &m.contender == *c)).collect();
    let ns = series.len() as f64;
    let legend_rows = series.len().div_ceil(LEGEND_COLUMNS) as f64;
    let top = TITLE_H + legend_rows * ROW_H + 8.0;
    let h = top + groups.len() as f64 * (ROW_H * ns + GROUP_GAP) + MARGIN;
    let w = LABEL_W + BAR_W + VALUE_W;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">CPU µs per {DATAGRAM}-byte datagram, median of {} runs (lower is better)</text>\n",
        o.reps
    );
    for (i, &(r, t)) in series.iter().enumerate() {
        let x = LABEL_W + (i % LEGEND_COLUMNS) as f64 * LEGEND_COLUMN_W;
        let y = LEGEND_TOP + (i / LEGEND_COLUMNS) as f64 * ROW_H;
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}, {}</text>",
            COLORS[i % COLORS.len()],
            x + 16.0,
            y + 10.0,
            mode_name(t),
            offered_name(r)
        );
    }
    let mut y = top;
    for c in groups {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{c}</text>",
            LABEL_W - 8.0,
            y + ROW_H * ns / 2.0 + 4.0
        );
        for (i, &(r, t)) in series.iter().enumerate() {
            if let Some(m) = sums.iter().find(|m| &m.contender == c && m.train == t && m.offered == r) {
                let bw = if m.us.is_finite() { m.us / max * BAR_W } else { 0.0 };
                let _ = writeln!(
                    s,
                    "<rect x=\"{LABEL_W}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\">{}</text>",
                    ROW_H - 3.0,
                    COLORS[i % COLORS.len()],
                    LABEL_W + bw + 4.0,
                    y + ROW_H - 6.0,
                    fmt(m.us, 2)
                );
            }
            y += ROW_H;
        }
        y += GROUP_GAP;
    }
    let _ = writeln!(
        s,
        "<line x1=\"{LABEL_W}\" y1=\"{}\" x2=\"{LABEL_W}\" y2=\"{}\" stroke=\"black\"/>",
        top - 4.0,
        y - MARGIN
    );
    s.push_str("</svg>\n");
    s
}

/// Every run and every latency run, for `--json FILE`.
pub(super) fn json(rows: &[Row], lat: &[LatRow]) -> Value {
    json!({
        "rows": rows.iter().map(|r| json!({
            "contender": r.contender, "train": r.train, "rep": r.rep, "sent": r.sent, "received": r.received,
            "handled": r.handled, "cpu_s": r.cpu_s, "secs": r.secs, "us_per_datagram": r.us(),
            "sender_cpu_s": r.sender_cpu_s})).collect::<Vec<_>>(),
        "latency": lat.iter().map(|l| json!({"pct": l.pct, "rep": l.rep, "offered": l.offered, "udpflood": l.v})).collect::<Vec<_>>(),
    })
}
