//! The configuration file (docs/operations.md "Configuration"): dist/quicdemux.toml
//! passes `demux check-config`, names every key once with its true default, and no
//! flag of `demux` or `worker` lacks a key (so the file and the flags cannot drift);
//! errors name the key and the line; flags override keys; SIGHUP applies what can
//! change while running and keeps the rest; `--version` of both binaries.
#![allow(clippy::unwrap_used)]

mod controller_support;

use clap::CommandFactory;
use controller_support::{alive, kill, serial, worker_bin, DEMUX};
use demux::config::{self, Flag, Rendered, KEYS, WORKER_FLAGS_WITHOUT_KEY};
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/quicdemux.toml")
}

/// One `key = value` line of the example: section, key, value text, commented out,
/// and its comment.
struct Line {
    section: String,
    key: String,
    value: String,
    commented: bool,
    comment: String,
}

/// The example's key lines (`key = value  # comment`, possibly behind `# `).
fn example_lines() -> Vec<Line> {
    let text = std::fs::read_to_string(example()).unwrap();
    let mut section = String::new();
    let mut out = Vec::new();
    for raw in text.lines() {
        let l = raw.trim();
        if let Some(s) = l.strip_prefix('[') {
            section = s.trim_end_matches(']').to_string();
            continue;
        }
        let (commented, body) = match l.strip_prefix("# ") {
            Some(b) => (true, b),
            None => (false, l),
        };
        // A key line: a lower-case identifier, `=`, a value (prose comments are not).
        let Some((key, rest)) = body.split_once(" = ") else { continue };
        if section.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let (value, comment) = match rest.split_once("  #") {
            Some((v, c)) => (v.trim().to_string(), c.trim().to_string()),
            None => (rest.trim().to_string(), String::new()),
        };
        out.push(Line { section: section.clone(), key: key.to_string(), value, commented, comment });
    }
    out
}

/// The example with every key line uncommented (every key set to what it shows).
fn everything(dir: &Path) -> PathBuf {
    let mut text = String::new();
    let mut section = String::new();
    for l in example_lines() {
        if l.section != section {
            text += &format!("[{}]\n", l.section);
            section = l.section.clone();
        }
        text += &format!("{} = {}\n", l.key, l.value);
    }
    let p = dir.join("everything.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn controller_command() -> clap::Command {
    let mut c = demux::cli::Cli::command();
    c.build();
    c.find_subcommand("controller").unwrap().clone()
}

fn worker_command() -> clap::Command {
    let mut c = worker::cli::Args::command();
    c.build();
    c
}

/// Long names of the flags `--help` shows (help and version aside).
fn visible(cmd: &clap::Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !["help", "version"].contains(l))
        .map(str::to_string)
        .collect()
}

fn default_of(cmd: &clap::Command, long: &str) -> Option<Vec<String>> {
    let a = cmd.get_arguments().find(|a| a.get_long() == Some(long))?;
    let d: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    (!d.is_empty()).then_some(d)
}

/// Every flag has a key, every key a flag, the example lists every key once, and
/// each default it shows is the flag's own default.
#[test]
fn every_flag_has_a_key_and_the_example_shows_the_true_defaults() {
    let lines = example_lines();
    let in_example: Vec<(String, String)> = lines.iter().map(|l| (l.section.clone(), l.key.clone())).collect();
    let keys: Vec<(String, String)> = KEYS.iter().map(|(s, k, _)| (s.to_string(), k.to_string())).collect();
    assert_eq!(in_example, keys, "dist/quicdemux.toml must list every key once, in the table's order");

    let ctl = controller_command();
    let worker = worker_command();
    let demux_keys: BTreeSet<String> = KEYS.iter().filter_map(|(_, _, f)| f.demux_flag()).map(str::to_string).collect();
    let mut missing: Vec<String> = visible(&ctl)
        .into_iter()
        .filter(|f| !demux_keys.contains(f) && f != "config")
        .filter(|f| !(f == "worker-arg" && KEYS.iter().any(|(_, _, fl)| *fl == Flag::WorkerArgs)))
        .collect();
    assert!(missing.is_empty(), "demux flags without a configuration key: {missing:?}");
    for f in &demux_keys {
        assert!(ctl.get_arguments().any(|a| a.get_long() == Some(f)), "key for a flag demux lacks: --{f}");
        assert!(visible(&ctl).contains(f), "key for a hidden (internal) flag: --{f}");
    }
    let worker_keys: BTreeSet<String> =
        KEYS.iter().filter_map(|(_, _, f)| f.worker_flag()).map(str::to_string).collect();
    let exempt: BTreeSet<String> = WORKER_FLAGS_WITHOUT_KEY.iter().map(|(f, _)| f.to_string()).collect();
    missing = visible(&worker).into_iter().filter(|f| !worker_keys.contains(f) && !exempt.contains(f)).collect();
    assert!(missing.is_empty(), "worker flags without a [workers] key: {missing:?}");
    for f in worker_keys.iter().chain(&exempt) {
        assert!(worker.get_arguments().any(|a| a.get_long() == Some(f)), "the worker has no --{f}");
    }

    // Defaults: what a commented line shows is the flag's default.
    let dir = testkit::temp_dir("cfg-drift");
    let loaded =
        config::load(&everything(&dir)).unwrap_or_else(|e| panic!("{}", config::render_errors(&example(), &e)));
    let mut checked = 0;
    for (l, s) in lines.iter().zip(&loaded.settings) {
        assert_eq!((s.section, s.key), (l.section.as_str(), l.key.as_str()));
        let (cmd, long) = match s.flag {
            Flag::Demux(n) | Flag::DemuxOnOff(n) => (&ctl, n),
            Flag::Worker(n) | Flag::WorkerOnOff(n) | Flag::WorkerSwitch(n) => (&worker, n),
            Flag::WorkerArgs => continue,
        };
        let shown: Vec<String> = match (&s.value, s.flag) {
            (Rendered::One(v), _) => vec![v.clone()],
            (Rendered::Many(v), _) => v.clone(),
            (Rendered::Bool(b), Flag::WorkerSwitch(_)) => vec![b.to_string()],
            (Rendered::Bool(b), _) => vec![if *b { "on" } else { "off" }.to_string()],
        };
        let stated = l.comment.split("(default: ").nth(1).and_then(|d| d.split(')').next());
        match (default_of(cmd, long), l.commented) {
            (Some(d), true) => {
                assert_eq!(shown, d, "{}.{} shows {shown:?}, --{long} defaults to {d:?}", l.section, l.key);
                checked += 1;
            }
            (Some(d), false) => {
                // An active line says its default in words: `(default: N)`.
                assert_eq!(
                    stated.map(str::to_string),
                    Some(d.join(",")),
                    "{}.{}: (default: …) is wrong",
                    l.section,
                    l.key
                );
                checked += 1;
            }
            (None, _) => assert!(
                stated.is_some() || l.comment.contains("required)"),
                "{}.{}: --{long} has no default; the comment must say what happens without it",
                l.section,
                l.key
            ),
        }
    }
    // The keys whose flags have a default (a new one: count it here too).
    assert_eq!(checked, 44, "defaults compared");

    // Every key renders to flags their parsers take: the whole of demux's …
    let argv: Vec<OsString> = vec!["demux".into(), "--config".into(), dir.join("everything.toml").into()];
    let full = config::merged_argv(&argv, &loaded);
    <demux::cli::Cli as clap::Parser>::try_parse_from(&full).unwrap_or_else(|e| panic!("{e}"));
    // … and the worker's.
    let mut wargv = vec!["worker".to_string(), "--server-id-from-controller".into(), "--control".into(), "/x".into()];
    wargv.extend(loaded.settings.iter().flat_map(|s| s.worker_args()));
    let w = <worker::cli::Args as clap::Parser>::try_parse_from(&wargv).unwrap_or_else(|e| panic!("{wargv:?}: {e}"));
    assert_eq!(w.handshake_timeout, Duration::from_secs(5));
    assert!(w.fast_path && w.malloc_trim && !w.retry);
}

/// A system user for the example's `workers.user`, made for the test when absent
/// and removed afterwards (the Debian package makes it on a real host).
struct TempUser(Option<&'static str>);

impl TempUser {
    fn ensure(name: &'static str) -> TempUser {
        let exists =
            || Command::new("id").arg(name).stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap().success();
        if exists() {
            return TempUser(None);
        }
        let st = Command::new("useradd").args(["--system", "--no-create-home", "--user-group", name]).status().unwrap();
        assert!(st.success() && exists(), "useradd {name}");
        TempUser(Some(name))
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        if let Some(n) = self.0 {
            let _ = Command::new("userdel").arg(n).status();
        }
    }
}

fn check_config(path: &Path) -> (bool, String, String) {
    let out = Command::new(DEMUX).arg("check-config").arg(path).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The example as shipped is valid (its `workers.bin` default: `worker` next to
/// `demux`, which a build has; the package puts both in /usr/bin).
#[test]
fn the_example_passes_check_config() {
    let _g = serial();
    let _user = TempUser::ensure("quicdemux");
    worker_bin();
    let (ok, out, err) = check_config(&example());
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains(": valid: listen 0.0.0.0:443 [::]:443; 1 shard(s) on cores 0; 2 worker(s)"), "{out}");
    assert!(out.contains("as quicdemux; state /var/lib/quicdemux"), "{out}");
}

/// Each kind of error: the key, its line, exit status 1; every bad value at once.
#[test]
fn check_config_names_the_key_and_the_line() {
    let dir = testkit::temp_dir("cfg-errors");
    let case = |name: &str, text: &str| -> String {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        let (ok, out, err) = check_config(&p);
        assert!(!ok && out.is_empty(), "{name} passed: {out}");
        err.replace(&format!("{}:", p.display()), "FILE:")
    };
    let base = "[controller]\nstate_dir = \"/tmp/qd-x\"\n[listen]\naddresses = [\"127.0.0.1:4433\"]\n";
    let e = case("unknown-key.toml", &format!("{base}[workers]\ncount = 0\ncuont = 1\n"));
    assert!(e.starts_with("FILE:7:1: [workers] cuont: unknown key `cuont`, expected one of `count`"), "{e}");
    let e = case("unknown-section.toml", &format!("{base}[worker]\ncount = 1\n"));
    assert!(e.starts_with("FILE:5:2: unknown section `worker`, expected one of the sections"), "{e}");
    let e = case("type.toml", &format!("{base}[limits]\nrate = \"fast\"\n"));
    assert!(e.starts_with("FILE:6:8: [limits] rate: invalid type: string \"fast\", expected u64"), "{e}");
    let e = case(
        "values.toml",
        &format!("{base}[dataplane]\nio = \"epoll\"\nbusy_poll_us = 99999\n[log]\nlevel = \"loud,,=\"\n"),
    );
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "every bad value is reported: {e}");
    assert!(lines[0].starts_with("FILE:6:6: dataplane.io: invalid value 'epoll' for '--io <IO>'"), "{e}");
    assert!(lines[1].starts_with("FILE:7:16: dataplane.busy_poll_us: invalid value '99999'"), "{e}");
    assert!(lines[2].starts_with("FILE:9:9: log.level: invalid value 'loud,,='"), "{e}");
    // A check across keys names the key it is about.
    let e = case("semantic.toml", &format!("{base}[dataplane]\nuring_buffers = 3\n"));
    assert_eq!(e.trim(), "FILE:6: dataplane.uring_buffers: --uring-buffers must be a power of two");
    let e = case("no-state.toml", "[listen]\naddresses = [\"127.0.0.1:4433\"]\n");
    assert!(e.contains("controller.state_dir is not set"), "{e}");
    let e = case("syntax.toml", "[listen\n");
    assert!(e.starts_with("FILE:1:"), "{e}");

    let ok = dir.join("ok.toml");
    std::fs::write(&ok, format!("{base}[workers]\ncount = 0\n")).unwrap();
    let (good, out, err) = check_config(&ok);
    assert!(good && err.is_empty(), "{err}");
    assert_eq!(out.trim(), format!("{}: valid: listen 127.0.0.1:4433; 1 shard(s) on cores 0; 0 worker(s) ({}) as the controller's user; state /tmp/qd-x", ok.display(), Path::new(DEMUX).with_file_name("worker").display()));
}

/// Flags override keys; a repeatable flag replaces the key's list; `--worker-arg`s
/// come after the `[workers]` keys (the worker keeps the last).
#[test]
fn flags_override_the_file() {
    let dir = testkit::temp_dir("cfg-override");
    let p = dir.join("c.toml");
    std::fs::write(
        &p,
        "[controller]\nstate_dir = \"/tmp/qd-y\"\n[listen]\naddresses = [\"127.0.0.1:4433\", \"127.0.0.1:4434\"]\n\
         [dataplane]\ncores = \"0\"\nbatch = 7\n[workers]\ncount = 1\ncert = \"/a.pem\"\nkey = \"/a.key\"\n",
    )
    .unwrap();
    let parse = |args: &[&str]| -> (demux::cli::DataPlaneArgs, demux::cli::ControllerOpts) {
        let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
        let full = config::effective_argv(argv).unwrap();
        let cli = <demux::cli::Cli as clap::Parser>::try_parse_from(&full).unwrap();
        match cli.command {
            Some(demux::cli::Command::Controller { dataplane, controller }) => (dataplane, controller),
            None => (cli.dataplane, cli.controller),
            _ => panic!("not a controller"),
        }
    };
    let path = p.to_str().unwrap();
    let (dp, opts) = parse(&["demux", "--config", path]);
    assert_eq!((dp.cores.as_str(), dp.batch, dp.listen.len(), opts.spawn_workers), ("0", 7, 2, 1));
    assert_eq!(opts.state_dir.as_deref(), Some(Path::new("/tmp/qd-y")));
    for argv in [
        vec!["demux", "--config", path, "--cores", "1", "--listen", "127.0.0.2:1", "--worker-arg=--cert=/b.pem"],
        vec![
            "demux",
            "controller",
            "--config",
            path,
            "--cores",
            "1",
            "--listen",
            "127.0.0.2:1",
            "--worker-arg=--cert=/b.pem",
        ],
    ] {
        let (dp, opts) = parse(&argv);
        assert_eq!(dp.cores, "1");
        assert_eq!(dp.batch, 7, "keys the command line does not give stay");
        assert_eq!(dp.listen, ["127.0.0.2:1".parse().unwrap()], "--listen replaces the key's list");
        assert_eq!(opts.worker_args, ["--cert=/a.pem", "--key=/a.key", "--cert=/b.pem"]);
        let mut w = vec!["worker", "--server-id-from-controller", "--control", "/x"];
        w.extend(opts.worker_args.iter().map(String::as_str));
        let w = <worker::cli::Args as clap::Parser>::try_parse_from(&w).unwrap();
        assert_eq!(w.cert.as_deref(), Some(Path::new("/b.pem")), "the worker keeps the last --cert");
    }
}

/// `demux --version` and `worker --version`: version, commit, wire versions.
#[test]
fn versions_name_the_commit_and_the_protocol() {
    let head =
        Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output();
    let commit =
        head.ok().filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    for (bin, name) in [(PathBuf::from(DEMUX), "demux"), (worker_bin(), "worker")] {
        let out = Command::new(&bin).arg("--version").output().unwrap();
        assert!(out.status.success());
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let rest =
            v.strip_prefix(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION"))).unwrap_or_else(|| panic!("{v}"));
        let (c, tail) = rest.split_once("; ").unwrap();
        assert_eq!(tail, format!("{})", proto::wire_version::describe()), "{v}");
        match &commit {
            Some(h) => assert!(c == h || c == format!("{h}-dirty"), "{v}: HEAD is {h}"),
            None => assert_eq!(c, "unknown"),
        }
    }
}

fn status(state: &Path, sub: &str) -> Option<Value> {
    let out = Command::new(DEMUX).arg(sub).arg("--state-dir").arg(state).arg("--json").output().ok()?;
    out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
}

fn ready_workers(st: &Value) -> Vec<(u64, i64)> {
    st["workers"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter(|w| w["state"] == "ready")
                .filter_map(|w| Some((w["server_id"].as_u64()?, w["pid"].as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn cmdline(pid: i64) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).replace('\0', " ")
}

/// SIGHUP with a changed file: the worker count and a limit apply (the data plane
/// restarts on the same sockets with the new limit); the listen addresses and cores
/// need a restart: logged by key, kept. A broken file changes nothing; a data plane
/// that cannot start with the new options is restarted with the old ones.
#[test]
fn sighup_applies_what_it_can_and_keeps_the_rest() {
    let _g = serial();
    let dir = testkit::temp_dir("cfg-reload");
    let _reap = testkit::bin::Reaper(dir.clone());
    let c = controller_support::cert(&dir);
    let state = dir.join("state");
    let write = |extra: &str, listen: &str, cores: &str, count: usize| {
        let text = format!(
            "[controller]\nstate_dir = \"{}\"\n[listen]\naddresses = [{listen}]\n[dataplane]\ncores = \"{cores}\"\n\
             [workers]\ncount = {count}\nbin = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ndrain_timeout = 2\n{extra}",
            state.display(),
            worker_bin().display(),
            c.cert.display(),
            c.key.display()
        );
        std::fs::write(dir.join("c.toml"), text).unwrap();
    };
    write("[limits]\nrate = 10\n", "\"127.0.0.1:0\"", "0-1", 1);
    let log = dir.join("controller.log");
    let mut child = Command::new(DEMUX)
        .arg("--config")
        .arg(dir.join("c.toml"))
        .env("DEMUX_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i64;
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let st = testkit::wait_until("one ready worker", Duration::from_secs(60), || {
        status(&state, "status").filter(|s| ready_workers(s).len() == 1 && s["dataplane"]["state"] == "running")
    });
    let dp1 = st["dataplane"]["pid"].as_i64().unwrap();
    let sockets = st["sockets"].clone();
    assert!(cmdline(dp1).contains("--limit-rate 10"));

    write("[limits]\nrate = 20\n", "\"127.0.0.1:0\", \"127.0.0.2:0\"", "0", 2);
    kill(pid, libc::SIGHUP);
    let st = testkit::wait_until("two ready workers on a new data plane", Duration::from_secs(90), || {
        status(&state, "status").filter(|s| {
            ready_workers(s).len() == 2
                && s["reloading"] == false
                && s["dataplane"]["state"] == "running"
                && s["dataplane"]["pid"].as_i64() != Some(dp1)
        })
    });
    let dp2 = st["dataplane"]["pid"].as_i64().unwrap();
    assert!(cmdline(dp2).contains("--limit-rate 20"), "{}", cmdline(dp2));
    assert!(cmdline(dp2).contains("--cores 0-1"), "cores kept: {}", cmdline(dp2));
    assert_eq!(st["sockets"], sockets, "listen addresses kept, the same sockets");
    assert_eq!(st["dataplane"]["restarts"], 1);
    let l = logs();
    for key in ["listen.addresses", "dataplane.cores"] {
        assert!(
            l.lines().any(|x| x.contains("needs a restart") && x.contains(&format!("key=\"{key}\""))),
            "no restart notice for {key}: {l}"
        );
    }
    assert!(!l.lines().any(|x| x.contains("needs a restart") && x.contains("workers.count")), "{l}");

    // A broken file: nothing changes, no worker is replaced.
    let workers = ready_workers(&st);
    std::fs::write(dir.join("c.toml"), std::fs::read_to_string(dir.join("c.toml")).unwrap() + "[workers]\n").unwrap();
    kill(pid, libc::SIGHUP);
    testkit::wait_until("the refusal logged", Duration::from_secs(10), || {
        logs().contains("the configuration file was not applied").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let st = status(&state, "status").unwrap();
    assert_eq!(ready_workers(&st), workers);
    assert_eq!(st["reloading"], false);
    assert_eq!(st["dataplane"]["pid"], dp2);

    // New data-plane options it cannot start with (a peers file that does not
    // exist): restarted with the previous ones.
    write(
        "[limits]\nrate = 20\n[hosts]\npeers = \"/nonexistent/peers\"\npeer_listen = \"127.0.0.1:0\"\n",
        "\"127.0.0.1:0\"",
        "0-1",
        2,
    );
    kill(pid, libc::SIGHUP);
    testkit::wait_until("the rollback", Duration::from_secs(60), || {
        logs().contains("restarting it with the previous one").then_some(())
    });
    let st = testkit::wait_until("the data plane back", Duration::from_secs(60), || {
        status(&state, "status")
            .filter(|s| s["dataplane"]["state"] == "running" && ready_workers(s).len() == 2 && s["reloading"] == false)
    });
    let dp3 = st["dataplane"]["pid"].as_i64().unwrap();
    assert!(!cmdline(dp3).contains("--peers"), "{}", cmdline(dp3));
    assert!(cmdline(dp3).contains("--limit-rate 20"));

    kill(pid, libc::SIGTERM);
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(dp3));
}
