//! The `worker` binary's command line (clap 4 derive), in the library so that the
//! controller's configuration tests can check that every worker flag has a
//! `[workers]` key (demux/tests/config.rs). Flags the controller gives the workers
//! it spawns are hidden from `--help` (docs/operations.md "Internal flags").

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

use crate::h3_server;

/// Flags (clap ids) that make no sense without the data plane and are refused with
/// `--listen`: the data connection, the controller link, the ADR 0001 keys and
/// connection IDs, the fast path and rings, and echo mode (which echoes forwarded
/// frames).
pub const LISTEN_CONFLICTS: &[&str] = &[
    "server_id",
    "keys",
    "data_socket",
    "server_id_from_controller",
    "control",
    "controller_grace",
    "fast_path",
    "rings",
    "cid_lifetime",
    "echo",
];

/// `--version`: the package version, the git commit and the wire-format versions.
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    proto::wire_version::version_line(env!("CARGO_PKG_VERSION"), env!("QUICDEMUX_GIT_COMMIT"))
});

#[derive(Debug, Parser)]
#[command(
    name = "worker",
    version = VERSION.as_str(),
    about = "HTTP/3 server instance behind the quicdemux data plane",
    args_override_self = true
)]
pub struct Args {
    /// Serve HTTP/3 alone on this UDP address (port 0: any free port), on quinn's own
    /// socket: no data plane, no controller (docs/operations.md "A worker alone").
    #[arg(long, value_name = "ADDR:PORT", conflicts_with_all = LISTEN_CONFLICTS)]
    pub listen: Option<std::net::SocketAddr>,
    /// This instance's 16-bit server id (ADR 0001); standalone mode.
    #[arg(long, value_name = "N")]
    pub server_id: Option<u16>,
    /// Shared key file (`demux gen-keys --out FILE`).
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// The data plane's --data-socket.
    #[arg(long, value_name = "PATH")]
    pub data_socket: Option<PathBuf>,
    /// Certificate chain (PEM); without --cert/--key a self-signed one is made.
    #[arg(long, value_name = "PEM", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM).
    #[arg(long, value_name = "PEM", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Serve static files below DIR.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Answer token-less Initials with Retry (address validation, RFC 9000 §8.1.2).
    #[arg(long)]
    pub retry: bool,
    /// Echo every forwarded datagram back to its source, bypassing QUIC (latency tool).
    #[arg(long)]
    pub echo: bool,
    /// Longest graceful drain after SIGTERM.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub drain_timeout: u64,
    /// Written (atomically) once the instance is placeable: `ready SERVER_ID`.
    #[arg(long, value_name = "PATH", hide = true)]
    pub ready_file: Option<PathBuf>,
    /// Register with the controller and take the server id and keys from it.
    #[arg(long, requires = "control", conflicts_with_all = ["server_id", "keys"], hide = true)]
    pub server_id_from_controller: bool,
    /// The controller's control socket.
    #[arg(long, value_name = "PATH", hide = true)]
    pub control: Option<PathBuf>,
    /// After losing the controller, how long to try re-registering before draining.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub controller_grace: u64,
    /// Ask the data plane for the kernel fast path (own SO_REUSEPORT sockets its
    /// SK_REUSEPORT program steers established datagrams to): on or off.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub fast_path: bool,
    /// Ask the data plane for shared-memory forwarding rings (granted by `demux
    /// --forward ring`, its default; otherwise frames come on the data connection):
    /// on or off. Asked again after every data-plane restart.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub rings: bool,
    /// Most TLS handshakes in progress at once; beyond it token-less Initials get a
    /// stateless Retry and the rest are ignored (0: no limit).
    #[arg(long, value_name = "N", default_value_t = h3_server::DEFAULT_MAX_HANDSHAKES)]
    pub max_handshakes: usize,
    /// Abandon a handshake not complete after this long.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = secs)]
    pub handshake_timeout: Duration,
    /// quinn `max_incoming`: Initials queued before the server takes them; beyond it
    /// quinn ignores new ones before deriving any key.
    #[arg(long, value_name = "N", default_value_t = crate::Limits::default().max_incoming)]
    pub max_incoming: usize,
    /// quinn `incoming_buffer_size`: bytes of further datagrams buffered per queued Initial.
    #[arg(long, value_name = "BYTES", default_value_t = crate::Limits::default().incoming_buffer_size)]
    pub incoming_buffer_size: u64,
    /// quinn `incoming_buffer_size_total`: the same over all queued Initials.
    #[arg(long, value_name = "BYTES", default_value_t = crate::Limits::default().incoming_buffer_size_total)]
    pub incoming_buffer_size_total: u64,
    /// CID lifetime: quinn replaces older CIDs (newest key generation), so rotations
    /// must be at least three lifetimes apart; 0: CIDs never expire.
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = secs)]
    pub cid_lifetime: Duration,
    /// Return freed heap to the OS (glibc `malloc_trim`) when connections close.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub malloc_trim: bool,
    /// Log filter: error, warn, info, debug, trace, or directives such as
    /// `info,worker=debug`. Default: $RUST_LOG, else info.
    #[arg(long, value_name = "LEVEL", value_parser = sys::logging::parse_level)]
    pub log_level: Option<String>,
    /// Log lines as `text` or `json` (one object per line). Colours only on a terminal.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// The reverse proxy (`--upstream` and its options, crate::proxy).
    #[command(flatten)]
    pub proxy: crate::proxy::ProxyArgs,
    /// The access log (crate::access_log).
    #[command(flatten)]
    pub access_log: crate::access_log::AccessLogArgs,
    /// Tests only (hidden): announce protocol version V (and V-1) instead of this
    /// build's, standing for a build that differs only in its version number
    /// (docs/wire.md "Versions"); V is this build's version up to 2 above it.
    #[arg(long, value_name = "V", hide = true)]
    pub protocol_version: Option<u8>,
}

pub fn secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e9).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("expected seconds (e.g. 5 or 0.5), not {s:?}")),
    }
}

pub fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}
