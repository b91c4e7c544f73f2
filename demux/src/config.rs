//! `demux --config FILE`: the controller's configuration file (TOML), and
//! `demux check-config FILE` (docs/operations.md "Configuration"; every key with
//! its default: dist/quicdemux.toml).
//!
//! Every key stands for one command-line flag ([`KEYS`]): a controller or data-plane
//! flag of `demux`, or a flag of the spawned workers (passed as `--worker-arg`).
//! The file becomes those flags, placed before the command line's own, so that a
//! flag given on the command line overrides its key (`--listen` and the other
//! repeatable flags replace the key's list; `--worker-arg`s come after the
//! `[workers]` keys, and the worker's last occurrence of a flag wins). Then clap
//! parses the whole as usual: the file meets exactly the checks the flags meet.
//!
//! A key cannot go silently unused: an unknown section or key is an error naming
//! it and its line (`deny_unknown_fields`), and so is a value of the wrong type or
//! one its flag refuses (the flag's own parser, with the key's line).

use crate::cli::Cli;
use anyhow::{anyhow, bail, Result};
use clap::CommandFactory;
use serde::Deserialize;
use std::ffi::OsString;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// How a key reaches the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// `--NAME=VALUE` of `demux` (a list: once per element).
    Demux(&'static str),
    /// A boolean as `--NAME=on|off` of `demux`.
    DemuxOnOff(&'static str),
    /// `--worker-arg=--NAME=VALUE`: a flag of every spawned worker.
    Worker(&'static str),
    /// A boolean worker switch: `--worker-arg=--NAME` when true, nothing when false.
    WorkerSwitch(&'static str),
    /// A boolean as `--worker-arg=--NAME=on|off`.
    WorkerOnOff(&'static str),
    /// A list of raw worker arguments, each `--worker-arg=ARG`.
    WorkerArgs,
}

impl Flag {
    /// The `demux` flag this key sets (`None`: a worker flag).
    pub fn demux_flag(self) -> Option<&'static str> {
        match self {
            Flag::Demux(n) | Flag::DemuxOnOff(n) => Some(n),
            _ => None,
        }
    }

    /// The worker flag this key sets (`None`: a demux flag, or raw arguments).
    pub fn worker_flag(self) -> Option<&'static str> {
        match self {
            Flag::Worker(n) | Flag::WorkerSwitch(n) | Flag::WorkerOnOff(n) => Some(n),
            _ => None,
        }
    }
}

/// Seconds, as an integer or a fraction (`5`, `0.5`).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Seconds {
    Whole(u64),
    Fraction(f64),
}

/// A string or a list of strings (a flag given once per element).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A key's value as command-line text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendered {
    One(String),
    Bool(bool),
    Many(Vec<String>),
}

trait Render {
    fn render(&self) -> Rendered;
}

impl Render for String {
    fn render(&self) -> Rendered {
        Rendered::One(self.clone())
    }
}

impl Render for u64 {
    fn render(&self) -> Rendered {
        Rendered::One(self.to_string())
    }
}

impl Render for bool {
    fn render(&self) -> Rendered {
        Rendered::Bool(*self)
    }
}

impl Render for Vec<String> {
    fn render(&self) -> Rendered {
        Rendered::Many(self.clone())
    }
}

impl Render for OneOrMany {
    fn render(&self) -> Rendered {
        match self {
            OneOrMany::One(s) => Rendered::Many(vec![s.clone()]),
            OneOrMany::Many(v) => Rendered::Many(v.clone()),
        }
    }
}

impl Render for Seconds {
    fn render(&self) -> Rendered {
        Rendered::One(match self {
            Seconds::Whole(s) => s.to_string(),
            Seconds::Fraction(f) => f.to_string(),
        })
    }
}

/// One key set in the file.
#[derive(Clone, Debug)]
pub struct Setting {
    pub section: &'static str,
    pub key: &'static str,
    pub flag: Flag,
    pub value: Rendered,
    /// Byte range of the value in the file.
    pub span: Range<usize>,
}

impl Setting {
    /// `section.key`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.section, self.key)
    }

    /// The command-line arguments this setting stands for.
    pub fn args(&self) -> Vec<String> {
        let on_off = |b: bool| if b { "on" } else { "off" };
        match (self.flag, &self.value) {
            (Flag::Demux(n), Rendered::One(v)) => vec![format!("--{n}={v}")],
            (Flag::Demux(n), Rendered::Many(vs)) => vs.iter().map(|v| format!("--{n}={v}")).collect(),
            (Flag::DemuxOnOff(n), Rendered::Bool(b)) => vec![format!("--{n}={}", on_off(*b))],
            (Flag::Worker(n), Rendered::One(v)) => vec![format!("--worker-arg=--{n}={v}")],
            (Flag::Worker(n), Rendered::Many(vs)) => vs.iter().map(|v| format!("--worker-arg=--{n}={v}")).collect(),
            (Flag::WorkerSwitch(n), Rendered::Bool(b)) => {
                if *b {
                    vec![format!("--worker-arg=--{n}")]
                } else {
                    vec![]
                }
            }
            (Flag::WorkerOnOff(n), Rendered::Bool(b)) => vec![format!("--worker-arg=--{n}={}", on_off(*b))],
            (Flag::WorkerArgs, Rendered::Many(vs)) => vs.iter().map(|v| format!("--worker-arg={v}")).collect(),
            // The table pairs each flag kind with a value type (tests: every key of
            // dist/quicdemux.toml renders); a mismatch would be a bug in KEYS.
            (f, v) => unreachable!("config key with flag {f:?} has a value of another kind: {v:?}"),
        }
    }

    /// The worker arguments alone (without the `--worker-arg=` wrapper).
    pub fn worker_args(&self) -> Vec<String> {
        self.args().iter().filter_map(|a| a.strip_prefix("--worker-arg=").map(str::to_string)).collect()
    }
}

macro_rules! sections {
    ($( $(#[$sdoc:meta])* $section:ident : $ty:ident { $( $key:ident : $vty:ty => $flag:expr , )* } )*) => {
        /// The whole file: one optional table per section.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct ConfigFile {
            $( #[serde(default)] pub $section: $ty, )*
        }
        $(
            $(#[$sdoc])*
            #[derive(Debug, Default, Deserialize)]
            #[serde(deny_unknown_fields)]
            pub struct $ty { $( pub $key: Option<Spanned<$vty>>, )* }
        )*
        /// Every key: section, key, and the flag it stands for.
        pub const KEYS: &[(&str, &str, Flag)] = &[ $( $( (stringify!($section), stringify!($key), $flag), )* )* ];
        impl ConfigFile {
            /// The keys set, in [`KEYS`] order.
            pub fn settings(&self) -> Vec<Setting> {
                let mut v = Vec::new();
                $( $(
                    if let Some(x) = &self.$section.$key {
                        v.push(Setting {
                            section: stringify!($section),
                            key: stringify!($key),
                            flag: $flag,
                            value: Render::render(x.get_ref()),
                            span: x.span(),
                        });
                    }
                )* )*
                v
            }
        }
    };
}

sections! {
    /// The controller itself.
    controller: ControllerSection {
        state_dir: String => Flag::Demux("state-dir"),
        drain_timeout: u64 => Flag::Demux("drain-timeout"),
        rotate_every: u64 => Flag::Demux("rotate-every"),
        metrics: String => Flag::Demux("metrics"),
        orphan_timeout: u64 => Flag::Demux("orphan-timeout"),
        rejoin_grace_ms: u64 => Flag::Demux("rejoin-grace-ms"),
    }
    /// The UDP addresses served.
    listen: ListenSection {
        addresses: Vec<String> => Flag::Demux("listen"),
    }
    /// The data plane's shards.
    dataplane: DataPlaneSection {
        cores: String => Flag::Demux("cores"),
        io: String => Flag::Demux("io"),
        steer: String => Flag::Demux("steer"),
        forward: String => Flag::Demux("forward"),
        ring_bytes: u64 => Flag::Demux("ring-bytes"),
        pin_capacity: u64 => Flag::Demux("pin-capacity"),
        decode_cache: u64 => Flag::Demux("decode-cache"),
        max_instances: u64 => Flag::Demux("max-instances"),
        batch: u64 => Flag::Demux("batch"),
        uring_buffers: u64 => Flag::Demux("uring-buffers"),
        busy_poll_us: u64 => Flag::Demux("busy-poll-us"),
    }
    /// The kernel fast path (docs/adr/0004-kernel-fast-path.md).
    fast_path: FastPathSection {
        mode: String => Flag::Demux("fast-path"),
    }
    /// Per-source limits on new connections.
    limits: LimitsSection {
        enabled: bool => Flag::DemuxOnOff("limits"),
        rate: u64 => Flag::Demux("limit-rate"),
        burst: u64 => Flag::Demux("limit-burst"),
        handshakes: u64 => Flag::Demux("limit-handshakes"),
        table_words: u64 => Flag::Demux("limit-table-words"),
    }
    /// Demux-minted Retry (docs/adr/0003-demux-retry.md).
    retry: RetrySection {
        mode: String => Flag::Demux("retry"),
        above: u64 => Flag::Demux("retry-above"),
    }
    /// Handshake pressure from the workers' load reports.
    pressure: PressureSection {
        retry_above: u64 => Flag::Demux("pressure-retry-above"),
        drop_above: u64 => Flag::Demux("pressure-drop-above"),
    }
    /// Several hosts behind one address (docs/adr/0005).
    hosts: HostsSection {
        bits: u64 => Flag::Demux("host-bits"),
        id: u64 => Flag::Demux("host-id"),
        peers: String => Flag::Demux("peers"),
        peer_listen: String => Flag::Demux("peer-listen"),
    }
    /// The spawned workers: the controller's worker flags, then the workers' own.
    workers: WorkersSection {
        count: u64 => Flag::Demux("spawn-workers"),
        bin: String => Flag::Demux("worker-bin"),
        user: String => Flag::Demux("worker-user"),
        cid_lifetime: u64 => Flag::Demux("cid-lifetime"),
        cert: String => Flag::Worker("cert"),
        key: String => Flag::Worker("key"),
        root: String => Flag::Worker("root"),
        retry: bool => Flag::WorkerSwitch("retry"),
        echo: bool => Flag::WorkerSwitch("echo"),
        drain_timeout: u64 => Flag::Worker("drain-timeout"),
        controller_grace: u64 => Flag::Worker("controller-grace"),
        fast_path: bool => Flag::WorkerOnOff("fast-path"),
        max_handshakes: u64 => Flag::Worker("max-handshakes"),
        handshake_timeout: Seconds => Flag::Worker("handshake-timeout"),
        max_incoming: u64 => Flag::Worker("max-incoming"),
        incoming_buffer_size: u64 => Flag::Worker("incoming-buffer-size"),
        incoming_buffer_size_total: u64 => Flag::Worker("incoming-buffer-size-total"),
        malloc_trim: bool => Flag::WorkerOnOff("malloc-trim"),
        upstream: OneOrMany => Flag::Worker("upstream"),
        upstream_timeout: Seconds => Flag::Worker("upstream-timeout"),
        upstream_max_body: u64 => Flag::Worker("upstream-max-body"),
        upstream_x_forwarded: bool => Flag::WorkerOnOff("upstream-x-forwarded"),
        upstream_fail_threshold: u64 => Flag::Worker("upstream-fail-threshold"),
        upstream_down_ms: u64 => Flag::Worker("upstream-down-ms"),
        access_log: String => Flag::Worker("access-log"),
        access_log_format: String => Flag::Worker("access-log-format"),
        args: Vec<String> => Flag::WorkerArgs,
    }
    /// Logging, of the controller and of the processes it starts.
    log: LogSection {
        level: String => Flag::Demux("log-level"),
        format: String => Flag::Demux("log-format"),
    }
}

/// Worker flags that have no `[workers]` key, and why (the drift test in
/// demux/tests/config.rs checks every other worker flag has one).
pub const WORKER_FLAGS_WITHOUT_KEY: &[(&str, &str)] = &[
    ("listen", "workers alone only (no data plane): the controller's workers serve its sockets"),
    ("server-id", "standalone workers only: the controller assigns the id"),
    ("keys", "standalone workers only: the controller sends the keys"),
    ("data-socket", "the controller's workers use DIR/data.sock"),
    ("rings", "set by the controller from dataplane.forward"),
    ("cid-lifetime", "set by the controller from workers.cid_lifetime"),
    ("log-level", "set by the controller from log.level"),
    ("log-format", "set by the controller from log.format"),
];

/// A configuration file, read and checked key by key.
#[derive(Debug)]
pub struct Loaded {
    pub path: PathBuf,
    pub text: String,
    pub settings: Vec<Setting>,
}

/// An error at a place in the file.
#[derive(Debug)]
pub struct ConfigError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Line and column (1-based) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = prefix(text, offset);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// `text` up to byte `offset`, or up to the char boundary before it.
fn prefix(text: &str, offset: usize) -> &str {
    let mut at = offset.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    &text[..at]
}

/// The `[section]` a byte offset is in (the last table header before it).
fn section_at(text: &str, offset: usize) -> Option<String> {
    prefix(text, offset)
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_start_matches('[').split(']').next().unwrap_or("").trim().to_string())
}

/// A TOML or schema error with the section and key it is about: `[workers] count:
/// invalid type …`, `[controller] bogus: unknown key, expected one of …`,
/// `unknown section [controler], expected one of …`.
fn describe_toml_error(text: &str, offset: usize, message: &str) -> String {
    let message = message.trim();
    let section = section_at(text, offset).unwrap_or_default();
    let before = prefix(text, offset);
    let line = before.rsplit('\n').next().unwrap_or("");
    let rest = text[before.len()..].split('\n').next().unwrap_or("");
    let whole = format!("{line}{rest}");
    let whole = whole.trim();
    if whole.starts_with('[') {
        return match message.strip_prefix("unknown field ") {
            Some(m) => format!("unknown section {}", m.replace("expected one of", "expected one of the sections")),
            None => message.to_string(),
        };
    }
    let key = whole.split_once('=').map(|(k, _)| k.trim().trim_matches('"')).filter(|k| !k.is_empty());
    let message = match message.strip_prefix("unknown field ") {
        Some(m) => format!("unknown key {m}"),
        None => message.to_string(),
    };
    match (section.is_empty(), key) {
        (false, Some(k)) => format!("[{section}] {k}: {message}"),
        (true, Some(k)) => format!("{k}: {message} (keys belong in a [section])"),
        (_, None) => message,
    }
}

/// Reads and checks `path`: TOML, known sections and keys, value types, and every
/// value through its flag's parser. All value errors are returned, not only the first.
pub fn load(path: &Path) -> std::result::Result<Loaded, Vec<ConfigError>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![ConfigError { line: 0, column: 0, message: format!("cannot read: {e}") }])?;
    let file: ConfigFile = toml::from_str(&text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        let (line, column) = line_col(&text, offset);
        vec![ConfigError { line, column, message: describe_toml_error(&text, offset, e.message()) }]
    })?;
    let settings = file.settings();
    let mut errors = Vec::new();
    let cmd = controller_command();
    for s in &settings {
        if let Err(m) = check_value(&cmd, s) {
            let (line, column) = line_col(&text, s.span.start);
            errors.push(ConfigError { line, column, message: format!("{}: {m}", s.name()) });
        }
    }
    if errors.is_empty() {
        Ok(Loaded { path: path.to_path_buf(), text, settings })
    } else {
        Err(errors)
    }
}

/// `demux controller`'s clap command, built (global flags propagated).
fn controller_command() -> clap::Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd.find_subcommand("controller").cloned().unwrap_or(cmd)
}

/// Runs a demux flag's value parser on each of the key's values. Worker keys are
/// checked by type here, and by the worker when it starts.
fn check_value(cmd: &clap::Command, s: &Setting) -> std::result::Result<(), String> {
    let Some(name) = s.flag.demux_flag() else { return Ok(()) };
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(name))
        .cloned()
        .ok_or_else(|| format!("no flag --{name} (a bug in the key table)"))?;
    // The flag's own value parser, alone (its relations to other flags are checked
    // when the whole command line is parsed).
    let mut one = clap::Arg::new(name)
        .long(name)
        .value_parser(arg.get_value_parser().clone())
        .action(clap::ArgAction::Append)
        .allow_hyphen_values(true);
    if let Some(names) = arg.get_value_names() {
        one = one.value_names(names.to_vec());
    }
    let alone = clap::Command::new("demux").no_binary_name(true).arg(one);
    alone.try_get_matches_from(s.args()).map(drop).map_err(|e| first_line(&e.to_string()))
}

/// The first line of a clap error, without its `error: ` prefix.
fn first_line(text: &str) -> String {
    let l = text.lines().next().unwrap_or(text).trim();
    l.strip_prefix("error: ").unwrap_or(l).to_string()
}

/// Renders errors as `FILE:LINE:COLUMN: message` lines.
pub fn render_errors(path: &Path, errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(|e| {
            if e.line == 0 {
                format!("{}: {}", path.display(), e.message)
            } else {
                format!("{}:{}:{}: {}", path.display(), e.line, e.column, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `--config FILE` of a command line, if any (clap's own tokenizer, errors
/// ignored: the real parse reports them).
pub fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let m = Cli::command().ignore_errors(true).try_get_matches_from(argv).ok()?;
    let m = match m.subcommand() {
        Some(("controller", sub)) => sub.clone(),
        Some(_) => return None,
        None => m,
    };
    m.get_one::<PathBuf>("config").cloned()
}

/// The command line with the file's flags inserted before the command line's own
/// (after `controller` when that subcommand is used): the file's value for a
/// repeatable `demux` flag the command line also gives is dropped, so the command
/// line's list replaces it.
pub fn merged_argv(argv: &[OsString], loaded: &Loaded) -> Vec<OsString> {
    let given_on_line: Vec<String> = {
        let m = Cli::command().ignore_errors(true).try_get_matches_from(argv).ok();
        let m = m.map(|m| match m.subcommand() {
            Some(("controller", sub)) => sub.clone(),
            _ => m,
        });
        let mut v = Vec::new();
        if let Some(m) = m {
            for id in m.ids() {
                if m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine) {
                    v.push(id.as_str().to_string());
                }
            }
        }
        v
    };
    let mut file_args: Vec<OsString> = Vec::new();
    for s in &loaded.settings {
        // Lists of the command line replace the file's (`--listen`); a worker
        // argument is always added (the worker's last occurrence wins).
        if let (Flag::Demux(n), Rendered::Many(_)) = (s.flag, &s.value) {
            if given_on_line.iter().any(|id| id.replace('_', "-") == n) {
                continue;
            }
        }
        file_args.extend(s.args().into_iter().map(OsString::from));
    }
    let at = if argv.get(1).is_some_and(|a| a == "controller") { 2 } else { 1 };
    let mut out: Vec<OsString> = argv[..at.min(argv.len())].to_vec();
    out.extend(file_args);
    out.extend(argv[at.min(argv.len())..].iter().cloned());
    out
}

/// The key a message about `--flag` refers to, and where it is set (the first
/// `--name` in `message` that a setting of the file stands for).
pub fn locate_flag_error(loaded: &Loaded, message: &str) -> Option<(String, usize)> {
    let mut best: Option<(usize, &Setting)> = None;
    for s in &loaded.settings {
        let Some(n) = s.flag.demux_flag() else { continue };
        let needle = format!("--{n}");
        let mut from = 0;
        while let Some(i) = message[from..].find(&needle) {
            let at = from + i;
            let end = at + needle.len();
            // Whole flag names only (`--limit` is not `--limit-rate`).
            let whole = message[end..].chars().next().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'));
            if whole && best.is_none_or(|(b, _)| at < b) {
                best = Some((at, s));
            }
            from = end;
        }
    }
    best.map(|(_, s)| (s.name(), line_col(&loaded.text, s.span.start).0))
}

/// `demux check-config FILE`: the file's own checks, then the whole command line it
/// makes (as `demux controller --config FILE`), then the controller's checks before
/// it opens anything. `Ok(summary)` or every error, each with its key and line.
pub fn check(path: &Path) -> std::result::Result<String, String> {
    let loaded = load(path).map_err(|e| render_errors(path, &e))?;
    let argv: Vec<OsString> = vec!["demux".into(), "controller".into(), "--config".into(), path.as_os_str().into()];
    let full = merged_argv(&argv, &loaded);
    let with_place = |msg: String| match locate_flag_error(&loaded, &msg) {
        Some((key, line)) => format!("{}:{line}: {key}: {msg}", path.display()),
        None => format!("{}: {msg}", path.display()),
    };
    let cli = <Cli as clap::Parser>::try_parse_from(&full).map_err(|e| with_place(first_line(&e.to_string())))?;
    let (dp, opts) = match cli.command {
        Some(crate::cli::Command::Controller { dataplane, controller }) => (dataplane, controller),
        _ => return Err(format!("{}: not a controller configuration", path.display())),
    };
    if opts.state_dir.is_none() {
        return Err(format!("{}: controller.state_dir is not set (the controller needs one)", path.display()));
    }
    let plan = crate::controller::plan(&dp, &opts).map_err(|e| with_place(format!("{e:#}")))?;
    Ok(format!("{}: valid: {}", path.display(), plan.summary(&dp, &opts)))
}

/// For `demux --config FILE …`: the effective command line, or an error naming the
/// file, key and line.
pub fn effective_argv(argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let Some(path) = config_path(&argv) else { return Ok(argv) };
    let loaded = load(&path).map_err(|e| anyhow!("{}", render_errors(&path, &e)))?;
    Ok(merged_argv(&argv, &loaded))
}

/// Re-reads the file for SIGHUP with the command line the controller started with:
/// the new data-plane and controller options.
pub fn reread(
    argv: &[OsString],
) -> Result<(crate::cli::DataPlaneArgs, crate::cli::ControllerOpts, crate::cli::LogArgs)> {
    let Some(path) = config_path(argv) else { bail!("no --config file on the command line") };
    let loaded = load(&path).map_err(|e| anyhow!("{}", render_errors(&path, &e)))?;
    let full = merged_argv(argv, &loaded);
    let cli = <Cli as clap::Parser>::try_parse_from(&full)
        .map_err(|e| anyhow!("{}: {}", path.display(), first_line(&e.to_string())))?;
    match cli.command {
        Some(crate::cli::Command::Controller { dataplane, controller }) => Ok((dataplane, controller, cli.log)),
        None => Ok((cli.dataplane, cli.controller, cli.log)),
        Some(_) => bail!("not a controller command line"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn load_text(text: &str) -> std::result::Result<Loaded, Vec<ConfigError>> {
        let dir = std::env::temp_dir().join(format!("qd-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{:x}.toml", {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut h);
            h.finish()
        }));
        std::fs::write(&p, text).unwrap();
        let r = load(&p);
        let _ = std::fs::remove_file(&p);
        r
    }

    #[test]
    fn line_and_column_of_offsets() {
        let t = "a = 1\n[x]\nkey = \"é\"\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 6), (2, 1));
        assert_eq!(line_col(t, 12), (3, 3));
        // Inside the two bytes of é: the char before it.
        let inside = t.find('é').unwrap() + 1;
        assert_eq!(line_col(t, inside), (3, 8));
        assert_eq!(line_col(t, 999), (4, 1));
        assert_eq!(section_at(t, 13).as_deref(), Some("x"));
    }

    #[test]
    fn upstream_is_one_url_or_a_list_of_routes() {
        let one = load_text("[workers]\nupstream = \"http://127.0.0.1:8080\"\n").unwrap();
        assert_eq!(one.settings[0].args(), ["--worker-arg=--upstream=http://127.0.0.1:8080"]);
        let many = load_text("[workers]\nupstream = [\"http://a:1\", \"/api=h2c://b:2\"]\n").unwrap();
        assert_eq!(
            many.settings[0].args(),
            ["--worker-arg=--upstream=http://a:1", "--worker-arg=--upstream=/api=h2c://b:2"]
        );
    }

    proptest! {
        /// Any text: an error with a place (or a valid file), never a panic.
        #[test]
        fn any_text_loads_or_fails_cleanly(text in "\\PC{0,200}") {
            match load_text(&text) {
                // Every key set renders to its flags (the value kind fits the flag).
                Ok(l) => l.settings.iter().for_each(|s| drop(s.args())),
                Err(e) => prop_assert!(!e.is_empty() && e.iter().all(|e| !e.message.is_empty())),
            }
        }

        /// The example with one byte replaced (often still TOML, with odd values).
        #[test]
        fn the_example_with_a_byte_changed_never_panics(at in 0usize..6000, byte in any::<u8>()) {
            let example = include_str!("../../dist/quicdemux.toml");
            let mut bytes = example.as_bytes().to_vec();
            let at = at % bytes.len();
            bytes[at] = byte;
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if let Err(e) = load_text(&text) {
                prop_assert!(e.iter().all(|e| e.line >= 1 && !e.message.is_empty()));
            }
        }
    }
}
