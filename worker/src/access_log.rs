//! `--access-log PATH|-`: one line per HTTP/3 request, proxied or served by the
//! built-in routes (docs/operations.md "Reverse proxy"), as text (common-log-like) or JSON (`--access-log-format`). Off by
//! default. Each line is written with one `write(2)` on a file opened `O_APPEND`, so
//! workers sharing a file do not interleave within lines; SIGHUP reopens the file
//! (after logrotate moved it).
//!
//! Fields: time (RFC 3339, UTC), client address (as the QUIC path had it), server
//! id, method, authority, path (with query), status (0: none sent, the client went
//! away), request and response body bytes, total time and upstream time (request
//! sent to response head; absent when the upstream was not reached or there is none).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The access log's flags (flattened into the worker's command line).
#[derive(Debug, Clone, clap::Args)]
pub struct AccessLogArgs {
    /// Write one line per HTTP/3 request to PATH (`-`: standard output); reopened on SIGHUP.
    #[arg(long, value_name = "PATH|-")]
    pub access_log: Option<String>,
    /// Access log lines as `text` or `json`.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub access_log_format: String,
}

/// Line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// Where and how.
#[derive(Debug, Clone)]
pub struct AccessLogOptions {
    /// `None`: standard output.
    pub path: Option<PathBuf>,
    pub format: Format,
}

impl AccessLogArgs {
    pub fn options(&self) -> Option<AccessLogOptions> {
        let format = if self.access_log_format == "json" { Format::Json } else { Format::Text };
        self.access_log.as_ref().map(|p| AccessLogOptions { path: (p != "-").then(|| PathBuf::from(p)), format })
    }
}

/// One request.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub time: SystemTime,
    pub client: SocketAddr,
    pub server_id: u16,
    pub method: &'a str,
    pub authority: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub total: Duration,
    pub upstream: Option<Duration>,
}

/// An open access log.
#[derive(Debug)]
pub struct AccessLog {
    opts: AccessLogOptions,
    file: Mutex<Option<std::fs::File>>,
}

fn open(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

impl AccessLog {
    pub fn open(opts: AccessLogOptions) -> anyhow::Result<AccessLog> {
        let file = match &opts.path {
            Some(p) => Some(open(p).map_err(|e| anyhow::anyhow!("--access-log {}: {e}", p.display()))?),
            None => None,
        };
        Ok(AccessLog { opts, file: Mutex::new(file) })
    }

    /// The file's path (`None`: standard output).
    pub fn path(&self) -> Option<&std::path::Path> {
        self.opts.path.as_deref()
    }

    /// Opens the path again (after a rotation); on failure keeps the old file.
    pub fn reopen(&self) {
        let Some(p) = &self.opts.path else { return };
        match open(p) {
            Ok(f) => {
                if let Ok(mut g) = self.file.lock() {
                    *g = Some(f);
                }
            }
            Err(e) => tracing::warn!(path = %p.display(), error = %e, "access log not reopened"),
        }
    }

    /// Writes one line. A write error is counted in the worker's log, never fatal.
    pub fn record(&self, e: &Entry<'_>) {
        let line = match self.opts.format {
            Format::Text => text_line(e),
            Format::Json => json_line(e),
        };
        let r = match self.file.lock() {
            Ok(mut g) => match g.as_mut() {
                Some(f) => f.write_all(line.as_bytes()),
                None => std::io::stdout().lock().write_all(line.as_bytes()),
            },
            Err(_) => Ok(()),
        };
        if let Err(err) = r {
            tracing::debug!(error = %err, "access log write failed");
        }
    }
}

/// Reopens `log`'s file on every SIGHUP (logrotate's `postrotate`), for as long as
/// the task runs.
pub fn reopen_on_sighup(log: std::sync::Arc<AccessLog>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            log.reopen();
            tracing::info!(path = ?log.path(), "access log reopened (SIGHUP)");
        }
    }))
}

/// RFC 3339 UTC with milliseconds (civil date from days: H. Hinnant's algorithm).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// `CLIENT - - [TIME] "METHOD PATH HTTP/3" STATUS BYTES_OUT "AUTHORITY" server_id=N
/// in=BYTES total_ms=T upstream_ms=T|-`: the common log format's first fields, then
/// the rest as key=value.
pub fn text_line(e: &Entry<'_>) -> String {
    let clean = |s: &str| s.replace(|c: char| c == '"' || c.is_control(), "_");
    format!(
        "{} - - [{}] \"{} {} HTTP/3\" {} {} \"{}\" server_id={} in={} total_ms={} upstream_ms={}\n",
        e.client,
        rfc3339(e.time),
        clean(e.method),
        clean(e.path),
        e.status,
        e.bytes_out,
        clean(e.authority),
        e.server_id,
        e.bytes_in,
        ms(e.total),
        e.upstream.map_or_else(|| "-".to_string(), ms),
    )
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One JSON object per line.
pub fn json_line(e: &Entry<'_>) -> String {
    let mut s = String::with_capacity(256);
    s.push_str("{\"time\":");
    json_str(&mut s, &rfc3339(e.time));
    s.push_str(",\"client\":");
    json_str(&mut s, &e.client.to_string());
    let _ = write!(s, ",\"server_id\":{},\"method\":", e.server_id);
    json_str(&mut s, e.method);
    s.push_str(",\"authority\":");
    json_str(&mut s, e.authority);
    s.push_str(",\"path\":");
    json_str(&mut s, e.path);
    let _ = write!(
        s,
        ",\"status\":{},\"bytes_in\":{},\"bytes_out\":{},\"total_ms\":{}",
        e.status,
        e.bytes_in,
        e.bytes_out,
        ms(e.total)
    );
    match e.upstream {
        Some(u) => {
            let _ = write!(s, ",\"upstream_ms\":{}}}", ms(u));
        }
        None => s.push_str(",\"upstream_ms\":null}"),
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry<'static> {
        Entry {
            time: UNIX_EPOCH + Duration::from_millis(1_764_744_002_123),
            client: "[2001:db8::1]:4433".parse().unwrap(),
            server_id: 7,
            method: "GET",
            authority: "example.com",
            path: "/a?b=\"c\"",
            status: 200,
            bytes_in: 5,
            bytes_out: 1024,
            total: Duration::from_micros(2500),
            upstream: Some(Duration::from_micros(1250)),
        }
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(1_764_744_002_123)), "2025-12-03T06:40:02.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(4_107_542_399)), "2100-02-28T23:59:59.000Z");
    }

    #[test]
    fn lines() {
        let e = entry();
        assert_eq!(
            text_line(&e),
            "[2001:db8::1]:4433 - - [2025-12-03T06:40:02.123Z] \"GET /a?b=_c_ HTTP/3\" 200 1024 \"example.com\" \
             server_id=7 in=5 total_ms=2.500 upstream_ms=1.250\n"
        );
        let j = json_line(&e);
        assert_eq!(
            j,
            "{\"time\":\"2025-12-03T06:40:02.123Z\",\"client\":\"[2001:db8::1]:4433\",\"server_id\":7,\
             \"method\":\"GET\",\"authority\":\"example.com\",\"path\":\"/a?b=\\\"c\\\"\",\"status\":200,\
             \"bytes_in\":5,\"bytes_out\":1024,\"total_ms\":2.500,\"upstream_ms\":1.250}\n"
        );
        let none = Entry { upstream: None, ..entry() };
        assert!(json_line(&none).ends_with("\"upstream_ms\":null}\n"));
        assert!(text_line(&none).ends_with("upstream_ms=-\n"));
    }
}
