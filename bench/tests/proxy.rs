//! Smoke test for `bench proxy`: every contender briefly under both loads, one
//! round. Not a timing test: it checks that every request was served (status 200,
//! whole body), that the proxies' ((e) HTTP/1.1, (f) over a Unix socket, (g) h2c)
//! requests went through the upstream and (b)'s did not, that the upstream's CPU is
//! measured apart, and that the report is well-formed.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod smoke_support;

#[test]
fn proxy_and_builtin_serve_every_request() {
    let w = smoke_support::run("proxy", &["--seconds", "0.5", "--reps", "1", "--download-mib", "4", "--nice", "0"]);
    let v = &w.json;
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8, "one run per contender and load: {v}");
    for c in ["fast", "proxy", "proxy-unix", "proxy-h2c"] {
        for l in ["get-1k", "download"] {
            let r = runs.iter().find(|r| r["contender"] == c && r["load"] == l).unwrap_or_else(|| panic!("{c} {l}"));
            let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{c} {l}: {k} in {r}"));
            let what = format!("{c} {l}: {r}");
            assert!(n("ok") >= 1.0, "{what}");
            assert_eq!((n("failed"), n("ok")), (0.0, n("issued")), "every request served: {what}");
            // The controller, the data plane and the one worker.
            assert_eq!(n("server_processes"), 3.0, "{what}");
            let size = if l == "download" { 4.0 * 1048576.0 } else { 1024.0 };
            assert_eq!(n("bytes"), n("ok") * size, "whole bodies: {what}");
            assert!(n("rate") > 0.0 && n("server_cpu_us_per_request_or_mb") > 0.0, "{what}");
            assert!(n("p50_us") >= 1.0 && n("p50_us") <= n("p99_us"), "{what}");
            if c != "fast" {
                // Every request served went through the upstream, whose CPU is measured.
                assert_eq!(n("upstream_requests"), n("ok"), "{what}");
                assert!(n("upstream_cpu_us_per_request_or_mb") > 0.0, "{what}");
            } else {
                assert_eq!(n("upstream_requests"), 0.0, "{what}");
                assert_eq!(n("upstream_cpu_us_per_request_or_mb"), 0.0, "{what}");
            }
        }
    }
    let targets: Vec<&str> = v["targets"].as_array().unwrap().iter().map(|t| t["target"].as_str().unwrap()).collect();
    assert_eq!(
        targets,
        [
            "(e)/(b) server CPU per request, get-1k ≤ 2",
            "(e)/(b) requests/s, get-1k (reported)",
            "(e)/(b) server CPU per MB, download ≤ 2",
            "(e)/(b) MB/s, download (reported)",
            "(f)/(b) server CPU per request, get-1k ≤ 2",
            "(f)/(b) requests/s, get-1k (reported)",
            "(f)/(b) server CPU per MB, download ≤ 2",
            "(f)/(b) MB/s, download (reported)",
            "(g)/(b) server CPU per request, get-1k ≤ 2",
            "(g)/(b) requests/s, get-1k (reported)",
            "(g)/(b) server CPU per MB, download ≤ 2",
            "(g)/(b) MB/s, download (reported)",
        ]
    );

    // The doc: a row per contender and load.
    let text = &w.doc;
    assert!(
        text.contains("| upstream CPU µs / request (download: / MB) |") && text.contains("| rate vs (b) |"),
        "{text}"
    );
    let served_rows = text.lines().filter(|l| l.starts_with("| ") && l.contains(" | 0 / ")).count();
    assert_eq!(served_rows, 8, "{text}");
    for row in ["(e) proxy |", "(f) proxy-unix |", "(g) proxy-h2c |"] {
        assert_eq!(text.lines().filter(|l| l.contains(row)).count(), 2, "{row}: {text}");
    }
    let chart = &w.svg;
    assert_eq!(chart.matches("<rect x=").count(), 8, "{chart}");
}
