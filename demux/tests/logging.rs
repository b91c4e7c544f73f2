//! Logging of both binaries (sys::logging, docs/operations.md "Logs"): no colour
//! codes unless stderr is a terminal, `--log-format json` (every line an object, the
//! controller's children too), `--log-level`, and journald's stream (a syslog
//! priority first, no timestamp). Each test runs the real processes with stderr to
//! a file.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEMUX: &str = env!("CARGO_BIN_EXE_demux");

fn worker_bin() -> PathBuf {
    testkit::bin::workspace_bin("worker", "worker")
}

/// A command whose stderr goes to `log`, with no colour hints in its environment.
fn logged(program: &Path, log: &Path) -> Command {
    let mut c = Command::new(program);
    c.env_remove("NO_COLOR")
        .env_remove("JOURNAL_STREAM")
        .env("DEMUX_LOG", "info")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    c
}

fn stop(child: &mut Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A standalone data plane and one worker, each with `extra` flags and `env`, run
/// until the worker serves, then stopped: their logs (data plane, worker).
fn run_pair(
    tag: &str,
    dp_extra: &[&str],
    worker_extra: &[&str],
    env: &dyn Fn(&mut Command, &Path),
) -> (String, String) {
    let dir = testkit::temp_dir(tag);
    let _reap = testkit::bin::Reaper(dir.clone());
    let keys = dir.join("keys");
    assert!(Command::new(DEMUX).arg("gen-keys").arg("--out").arg(&keys).status().unwrap().success());
    let (dp_log, w_log) = (dir.join("dataplane.log"), dir.join("worker.log"));
    let (data, ready) = (dir.join("data.sock"), dir.join("dp.ready"));
    let mut dp = logged(Path::new(DEMUX), &dp_log);
    dp.args(["dataplane", "--listen", "127.0.0.1:0", "--cores", "0"]);
    testkit::bin::dataplane_files(&mut dp, &keys, &data, &dir.join("control.sock"), &ready);
    dp.args(dp_extra);
    env(&mut dp, &dp_log);
    let mut dp = dp.spawn().unwrap();
    testkit::bin::wait_ready_file(&ready, &mut dp, &dp_log, "data plane", Duration::from_secs(30));
    let w_ready = dir.join("worker.ready");
    let mut w = logged(&worker_bin(), &w_log);
    w.args(["--server-id", "7", "--drain-timeout", "1"]).arg("--keys").arg(&keys).arg("--data-socket").arg(&data);
    w.arg("--ready-file").arg(&w_ready).args(worker_extra);
    env(&mut w, &w_log);
    let mut w = w.spawn().unwrap();
    testkit::bin::wait_ready_file(&w_ready, &mut w, &w_log, "worker", Duration::from_secs(30));
    stop(&mut w);
    stop(&mut dp);
    (std::fs::read_to_string(&dp_log).unwrap(), std::fs::read_to_string(&w_log).unwrap())
}

fn no_env(_: &mut Command, _: &Path) {}

/// stderr to a file: plain text, both binaries.
#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    let (dp, w) = run_pair("log-plain", &[], &[], &no_env);
    assert!(dp.contains("data plane running"), "{dp}");
    assert!(w.contains("serving HTTP/3"), "{w}");
    for (who, text) in [("demux", &dp), ("worker", &w)] {
        assert!(!text.contains('\x1b'), "{who} wrote an escape sequence to a file: {text:?}");
        assert!(text.lines().any(|l| l.contains(" INFO ")), "{who}: {text}");
    }
}

/// The control: on a terminal (a pty, through script(1)) the same binary colours.
#[test]
fn a_terminal_gets_colours() {
    if !testkit::have_tool(Command::new("script").arg("--version").output().is_ok(), "script (bsdutils)") {
        return;
    }
    let dir = testkit::temp_dir("log-tty");
    let _reap = testkit::bin::Reaper(dir.clone());
    let cmd = format!(
        "timeout -s TERM 2 {DEMUX} --listen 127.0.0.1:0 --cores 0 --state-dir {} --log-level info",
        dir.join("state").display()
    );
    let out = Command::new("script").args(["-qec", &cmd, "/dev/null"]).env_remove("NO_COLOR").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("controller starting"), "{text}");
    assert!(text.contains('\x1b'), "no colours on a terminal: {text:?}");
}

/// `--log-format json`: every line of both binaries is one JSON object with the
/// level, the message and the target; `--log-level warn` leaves out the INFO lines.
#[test]
fn json_lines_and_the_level_filter() {
    let (dp, w) = run_pair("log-json", &["--log-format", "json"], &["--log-format", "json"], &no_env);
    for (who, text, message) in [("demux", &dp, "data plane running"), ("worker", &w, "serving HTTP/3")] {
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{who}: not JSON ({e}): {l}")))
            .collect();
        assert!(lines.iter().all(|v| v["level"].is_string() && v["target"].is_string()), "{who}: {text}");
        assert!(lines.iter().any(|v| v["fields"]["message"] == message && v["level"] == "INFO"), "{who}: {text}");
    }
    assert!(w.lines().any(|l| l.contains("\"worker exit\"") && l.contains("drained=true")), "{w}");

    let (dp, w) = run_pair("log-warn", &["--log-level", "warn"], &["--log-level", "warn"], &no_env);
    assert!(!dp.contains(" INFO ") && !w.contains(" INFO "), "INFO lines under --log-level warn:\n{dp}\n{w}");
}

/// Under journald (`JOURNAL_STREAM` names stderr): each line starts with its
/// syslog priority and has no timestamp of its own. A `JOURNAL_STREAM` that names
/// another file (inherited, stderr redirected) changes nothing.
#[test]
fn journald_lines_carry_their_priority_and_no_timestamp() {
    use std::os::unix::fs::MetadataExt;
    let journal = |c: &mut Command, log: &Path| {
        let m = std::fs::metadata(log).unwrap();
        c.env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()));
    };
    let (dp, w) = run_pair("log-journal", &[], &[], &journal);
    let stamp = |l: &str| l.len() > 4 && l.as_bytes()[..4].iter().all(u8::is_ascii_digit) && l.as_bytes()[4] == b'-';
    for (who, text) in [("demux", &dp), ("worker", &w)] {
        let events: Vec<&str> = text.lines().filter(|l| !l.starts_with("worker exit:")).collect();
        assert!(!events.is_empty());
        for l in &events {
            let rest = ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .find_map(|p| l.strip_prefix(p))
                .unwrap_or_else(|| panic!("{who}: no priority prefix: {l}"));
            assert!(!stamp(rest.trim_start()), "{who}: a timestamp under journald: {l}");
        }
        assert!(events.iter().any(|l| l.starts_with("<6>") && l.contains("INFO")), "{who}: {text}");
    }
    let elsewhere = |c: &mut Command, _: &Path| {
        c.env("JOURNAL_STREAM", "1:1");
    };
    let (dp, _) = run_pair("log-notjournal", &[], &[], &elsewhere);
    assert!(dp.lines().all(|l| !l.starts_with('<') && stamp(l)), "{dp}");
}

/// The controller passes `--log-format json` to its data plane and workers: with all
/// three writing to its stderr, every line is JSON.
#[test]
fn the_controller_passes_the_format_to_its_children() {
    let dir = testkit::temp_dir("log-ctl");
    let _reap = testkit::bin::Reaper(dir.clone());
    let log = dir.join("controller.log");
    let mut c = logged(Path::new(DEMUX), &log);
    c.args(["--listen", "127.0.0.1:0", "--cores", "0", "--spawn-workers", "1", "--log-format", "json"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--worker-bin")
        .arg(worker_bin())
        .arg("--worker-arg=--drain-timeout=1");
    let mut c = c.spawn().unwrap();
    testkit::wait_until("the worker serving", Duration::from_secs(60), || {
        std::fs::read_to_string(&log).unwrap().contains("serving HTTP/3").then_some(())
    });
    stop(&mut c);
    let text = std::fs::read_to_string(&log).unwrap();
    let targets: std::collections::BTreeSet<String> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter_map(|v| v["target"].as_str().map(|t| t.split("::").take(2).collect::<Vec<_>>().join("::")))
        .collect();
    for t in ["demux::controller", "demux::dataplane", "worker"] {
        assert!(targets.contains(t), "no JSON line of {t}: {targets:?}");
    }
}
