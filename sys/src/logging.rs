//! Logging, set up the same way by `demux` (controller, data plane) and `worker`:
//! one line per event on stderr, as text or JSON (`--log-format`), filtered by
//! `--log-level` (else the binary's environment variable, else `info`).
//!
//! - Colours only when stderr is a terminal (and `NO_COLOR` is unset): a log file, a
//!   pipe or journald gets plain text.
//! - Under journald (`JOURNAL_STREAM` names stderr, systemd.exec(5)) every line
//!   starts with its syslog priority, `<3>` … `<7>` (sd-daemon(3)), which journald
//!   strips and records as `PRIORITY` (`journalctl -p warning` works), and carries no
//!   timestamp of its own (journald stamps each line).
//! - The filter can be replaced while running ([`Logging::set_level`], the
//!   controller's SIGHUP).

use std::io::Write;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Layer, Registry};

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines (tracing-subscriber's default format).
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`).
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(format!("expected text or json, not {s:?}")),
        }
    }
}

impl Format {
    /// The `--log-format` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

/// Checks a `--log-level` value: a level (`error` … `trace`) or any `EnvFilter`
/// directive list (`info,demux::controller=debug`).
pub fn parse_level(s: &str) -> Result<String, String> {
    EnvFilter::try_new(s).map(|_| s.to_string()).map_err(|e| format!("invalid log level {s:?}: {e}"))
}

/// The installed subscriber's filter, replaceable while running.
pub struct Logging {
    filter: reload::Handle<EnvFilter, Registry>,
    level: String,
    env_var: &'static str,
}

impl Logging {
    /// Replaces the filter: `--log-level` syntax, or (`None`) the default [`init`] took.
    pub fn set_level(&mut self, level: Option<&str>) -> Result<(), String> {
        let level = effective_level(level, self.env_var);
        let f = EnvFilter::try_new(&level).map_err(|e| format!("invalid log level {level:?}: {e}"))?;
        self.filter.reload(f).map_err(|e| e.to_string())?;
        self.level = level;
        Ok(())
    }

    /// The filter in force.
    pub fn level(&self) -> &str {
        &self.level
    }
}

/// `level` if given; otherwise `env_var` (when it parses), otherwise `info`.
fn effective_level(level: Option<&str>, env_var: &str) -> String {
    match level {
        Some(l) => l.to_string(),
        None => std::env::var(env_var).ok().filter(|v| EnvFilter::try_new(v).is_ok()).unwrap_or_else(|| "info".into()),
    }
}

/// Installs the global subscriber. `level`: `--log-level` if given; otherwise
/// `env_var` (`DEMUX_LOG`, `RUST_LOG`), otherwise `info`.
pub fn init(level: Option<&str>, format: Format, env_var: &'static str) -> Result<Logging, String> {
    let level = effective_level(level, env_var);
    let filter = EnvFilter::try_new(&level).map_err(|e| format!("invalid log level {level:?}: {e}"))?;
    let (filter, handle) = reload::Layer::new(filter);
    let journal = stderr_is_journal();
    let ansi = format == Format::Text && !journal && colours_wanted();
    let writer = StderrWriter { journal };
    let layer: Box<dyn Layer<_> + Send + Sync> = match (format, journal) {
        (Format::Text, false) => fmt::layer().with_writer(writer).with_ansi(ansi).boxed(),
        (Format::Text, true) => fmt::layer().with_writer(writer).with_ansi(false).without_time().boxed(),
        (Format::Json, false) => fmt::layer().json().with_writer(writer).with_ansi(false).boxed(),
        (Format::Json, true) => fmt::layer().json().with_writer(writer).with_ansi(false).without_time().boxed(),
    };
    tracing_subscriber::registry().with(filter).with(layer).try_init().map_err(|e| e.to_string())?;
    Ok(Logging { filter: handle, level, env_var })
}

/// Whether a human watches stderr: a terminal, and `NO_COLOR` unset (no-color.org).
fn colours_wanted() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Whether stderr is the journald stream systemd connected: `JOURNAL_STREAM` is
/// `DEV:INODE` of that stream (systemd.exec(5)); a child that inherited the variable
/// but writes elsewhere does not match.
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| {
        let (d, i) = v.split_once(':')?;
        Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The syslog priority of a level, as sd-daemon(3)'s `SD_ERR` … `SD_DEBUG`.
pub fn priority(level: &tracing::Level) -> u8 {
    match *level {
        tracing::Level::ERROR => 3,
        tracing::Level::WARN => 4,
        tracing::Level::INFO => 6,
        _ => 7,
    }
}

/// stderr, with the event's `<priority>` first when it is journald's stream.
#[derive(Clone, Copy)]
struct StderrWriter {
    journal: bool,
}

/// One event's writer: fmt formats the whole line, then writes it (the prefix goes
/// before its first byte).
struct EventWriter {
    prefix: Option<u8>,
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        match self.prefix.take() {
            Some(p) => {
                // One write(2) for prefix and line, so lines of threads do not mix.
                let mut line = Vec::with_capacity(buf.len() + 3);
                line.extend_from_slice(format!("<{p}>").as_bytes());
                line.extend_from_slice(buf);
                err.write_all(&line)?;
                Ok(buf.len())
            }
            None => err.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> fmt::MakeWriter<'a> for StderrWriter {
    type Writer = EventWriter;
    fn make_writer(&'a self) -> EventWriter {
        EventWriter { prefix: None }
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> EventWriter {
        EventWriter { prefix: self.journal.then(|| priority(meta.level())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_sd_daemon_levels() {
        use tracing::Level;
        let p: Vec<u8> =
            [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE].iter().map(priority).collect();
        assert_eq!(p, [3, 4, 6, 7, 7]);
    }

    #[test]
    fn formats_and_levels_parse() {
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("text".parse::<Format>().map(Format::as_str), Ok("text"));
        assert!("yaml".parse::<Format>().is_err());
        assert!(parse_level("debug").is_ok());
        assert!(parse_level("info,demux::controller=trace").is_ok());
        assert!(parse_level("[[").is_err());
    }
}
