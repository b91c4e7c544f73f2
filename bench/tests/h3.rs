//! Smoke test for `bench h3`: every contender briefly under every load, one round.
//! Not a timing test: it checks that the report is well-formed and that every
//! contender served every request it was sent (status 200, whole body), with server
//! CPU measured for each.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod smoke_support;

const CONTENDERS: [&str; 4] = ["alone", "fast", "user", "two"];
const LOADS: [&str; 4] = ["get-1k", "get-64k", "new-conn", "download"];

#[test]
fn every_contender_serves_every_request() {
    let w = smoke_support::run(
        "h3",
        &[
            "--seconds",
            "0.5",
            "--reps",
            "1",
            "--download-mib",
            "4",
            "--nice",
            "0",
            "--contenders",
            &CONTENDERS.join(","),
        ],
    );
    let v = &w.json;
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), CONTENDERS.len() * LOADS.len(), "one run per contender and load: {v}");
    for c in CONTENDERS {
        for l in LOADS {
            let r = runs.iter().find(|r| r["contender"] == c && r["load"] == l).unwrap_or_else(|| panic!("{c} {l}"));
            let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{c} {l}: {k} in {r}"));
            let what = format!("{c} {l}: {r}");
            assert!(n("ok") >= 1.0, "{what}");
            assert_eq!((n("failed"), n("ok")), (0.0, n("issued")), "every request served: {what}");
            // Every server process is measured: the worker alone; the controller, the
            // data plane and each worker of the appliance.
            let processes = match c {
                "alone" => 1.0,
                "two" => 4.0,
                _ => 3.0,
            };
            assert_eq!(n("server_processes"), processes, "{what}");
            let size = match l {
                "get-64k" => 65536.0,
                "download" => 4.0 * 1048576.0,
                _ => 1024.0,
            };
            assert_eq!(n("bytes"), n("ok") * size, "whole bodies: {what}");
            assert!(n("rate") > 0.0 && n("server_cpu_us_per_request_or_mb") > 0.0, "{what}");
            assert!(n("server_cores") > 0.0 && n("client_cores") > 0.0, "{what}");
            assert!(n("p50_us") >= 1.0 && n("p50_us") <= n("p99_us") && n("p99_us") <= n("p999_us"), "{what}");
        }
    }
    // The appliance's fast-path contenders say whether it was active.
    assert!(runs.iter().filter(|r| r["contender"] == "alone").all(|r| r["fast_path_active"] == false));
    let medians = v["medians"].as_array().unwrap();
    assert_eq!(medians.len(), CONTENDERS.len() * LOADS.len());
    let targets: Vec<&str> = v["targets"].as_array().unwrap().iter().map(|t| t["target"].as_str().unwrap()).collect();
    assert_eq!(targets.len(), 9, "{targets:?}");
    assert!(targets.contains(&"(b)/(a) new connections/s ≥ 0.8"), "{targets:?}");

    // The doc: a row per contender and load.
    let text = &w.doc;
    let rows = text.lines().filter(|l| l.starts_with("| ") && l.contains(") alone |")).count();
    assert_eq!(rows, LOADS.len(), "{text}");
    // Each results row ends with `| failed / served |`, failed 0.
    let served_rows = text.lines().filter(|l| l.starts_with("| ") && l.contains(" | 0 / ")).count();
    assert_eq!(served_rows, CONTENDERS.len() * LOADS.len(), "{text}");
    // The chart: a bar per contender and load.
    let chart = &w.svg;
    assert_eq!(chart.matches("<rect x=").count(), CONTENDERS.len() * LOADS.len(), "{chart}");
}
