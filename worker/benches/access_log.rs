//! What `--access-log` costs per request (worker/src/access_log.rs): formatting one
//! line as text and as JSON, and recording it (formatting plus one `write(2)` with
//! `O_APPEND`) to a file on the benchmark's temporary directory.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::{Duration, SystemTime};
use worker::access_log::{json_line, text_line, AccessLog, AccessLogOptions, Entry, Format};

fn entry() -> Entry<'static> {
    Entry {
        time: SystemTime::now(),
        client: "[2001:db8::1]:4433".parse().unwrap(),
        server_id: 7,
        method: "GET",
        authority: "www.example.com",
        path: "/static/app.js?v=1234",
        status: 200,
        bytes_in: 0,
        bytes_out: 48_213,
        total: Duration::from_micros(2500),
        upstream: Some(Duration::from_micros(1250)),
    }
}

fn bench(c: &mut Criterion) {
    let e = entry();
    let mut g = c.benchmark_group("access_log");
    g.bench_function("text_line", |b| b.iter(|| black_box(text_line(black_box(&e)))));
    g.bench_function("json_line", |b| b.iter(|| black_box(json_line(black_box(&e)))));
    let dir = std::env::temp_dir().join(format!("access-log-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, format) in [("record_text_file", Format::Text), ("record_json_file", Format::Json)] {
        let path = dir.join(format!("{name}.log"));
        let log = AccessLog::open(AccessLogOptions { path: Some(path.clone()), format }).unwrap();
        g.bench_function(name, |b| b.iter(|| log.record(black_box(&e))));
        let _ = std::fs::remove_file(&path);
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
