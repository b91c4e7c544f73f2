//! Command line (clap 4 derive). The data-plane flags live on `demux dataplane` and,
//! for now, also on the bare `demux` (no subcommand), so that the controller can add
//! its own subcommands later without breaking existing invocations.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `--version`: the package version, the git commit and the wire-format versions.
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    proto::wire_version::version_line(env!("CARGO_PKG_VERSION"), env!("QUICDEMUX_GIT_COMMIT"))
});

/// Flags the controller gives the processes it starts, hidden from `--help`
/// (docs/operations.md "Internal flags" documents each).
#[derive(Debug, Parser)]
#[command(
    name = "demux",
    version = VERSION.as_str(),
    about = "quicdemux: shares one UDP address among QUIC server processes (the controller with --state-dir or --config, else the data plane)",
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Data-plane flags when no subcommand is given (same as `demux dataplane`).
    #[command(flatten)]
    pub dataplane: DataPlaneArgs,
    /// Controller flags: with `--state-dir` the bare `demux` is the controller.
    #[command(flatten)]
    pub controller: ControllerOpts,
    #[command(flatten)]
    pub log: LogArgs,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    pub fn to_sys(self) -> sys::logging::Format {
        match self {
            LogFormat::Text => sys::logging::Format::Text,
            LogFormat::Json => sys::logging::Format::Json,
        }
    }
}

/// Logging, for every subcommand (sys::logging). The controller passes both on to
/// its data plane and workers.
#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log filter: error, warn, info, debug, trace, or directives such as
    /// `info,demux::controller=debug`. Default: $DEMUX_LOG, else info.
    #[arg(long, value_name = "LEVEL", global = true, value_parser = sys::logging::parse_level)]
    pub log_level: Option<String>,
    /// Log lines as `text` or `json` (one object per line). Colours only on a terminal.
    #[arg(long, value_name = "FORMAT", value_enum, global = true, default_value = "text")]
    pub log_format: LogFormat,
}

/// The controller: `demux --listen … --state-dir DIR [--spawn-workers N]`.
#[derive(Clone, Debug, Args)]
pub struct ControllerOpts {
    /// Read every option from this TOML file (dist/quicdemux.toml lists each key);
    /// flags given here override its keys. Re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The command line as given (for SIGHUP's re-read of `--config`); set by main.
    #[arg(skip)]
    pub argv: Vec<std::ffi::OsString>,
    /// State directory (0700): keys, server-id counter, sockets, pid files. Makes
    /// `demux` the controller, which runs the data plane as its child.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// Start and supervise N workers (`worker --server-id-from-controller`).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "state_dir")]
    pub spawn_workers: usize,
    /// One argument passed to every spawned worker (repeatable, in order).
    #[arg(long = "worker-arg", value_name = "ARG", allow_hyphen_values = true, requires = "state_dir")]
    pub worker_args: Vec<String>,
    /// The worker executable (default: `worker` next to this executable).
    #[arg(long, value_name = "PATH", requires = "state_dir")]
    pub worker_bin: Option<std::path::PathBuf>,
    /// Rotate the CID key generation every N instance starts (ADR 0001). Default
    /// 10 000, or half the host's server ids when `--host-bits` leaves fewer.
    #[arg(long = "rotate-every", value_name = "N", requires = "state_dir")]
    pub rotate_every_arg: Option<u32>,
    /// `--rotate-every` as resolved at start (controller::run).
    #[arg(skip)]
    pub rotate_every: u32,
    /// How long a worker's connection IDs live (passed to spawned workers as
    /// `worker --cid-lifetime`). Rotations are refused
    /// within 3 × this of the last one (`rotate-keys --force` overrides).
    #[arg(long, value_name = "SECS", default_value_t = 600, requires = "state_dir")]
    pub cid_lifetime: u64,
    /// SIGTERM: longest wait for the workers to drain before they are killed.
    #[arg(long, value_name = "SECS", default_value_t = 30, requires = "state_dir")]
    pub drain_timeout: u64,
    /// Run the spawned workers as this (unprivileged) user; the controller must run as
    /// root. control.sock and data.sock become 0660 for the user's group, the state
    /// directory 0710 (docs/operations.md "Running workers unprivileged").
    #[arg(long, value_name = "NAME", requires = "state_dir")]
    pub worker_user: Option<String>,
}

impl Cli {
    /// `--protocol-version` of the data plane or controller being started (hidden,
    /// tests only: `sys::protocol::relabel`).
    pub fn protocol_version(&self) -> Option<u8> {
        match &self.command {
            None => self.dataplane.protocol_version,
            Some(Command::Dataplane(dp) | Command::Controller { dataplane: dp, .. }) => dp.protocol_version,
            Some(Command::CheckState { protocol_version, .. }) => *protocol_version,
            Some(_) => None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the data plane (the default when no subcommand is given).
    #[command(
        args_override_self = true,
        mut_arg("keys", |a| a.hide(false)),
        mut_arg("data_socket", |a| a.hide(false)),
        mut_arg("control_socket", |a| a.hide(false)),
        mut_arg("ready_file", |a| a.hide(false))
    )]
    Dataplane(DataPlaneArgs),
    /// Check a configuration file (`--config`): every error with its key and line;
    /// exit 0 with a one-line summary when it is valid.
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
    /// Write a fresh key file (OS randomness, mode 0600).
    GenKeys {
        /// Where to write the key file; refuses to overwrite an existing file.
        #[arg(long)]
        out: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// The controller (same as the bare `demux … --state-dir DIR`).
    #[command(args_override_self = true)]
    Controller {
        #[command(flatten)]
        dataplane: DataPlaneArgs,
        #[command(flatten)]
        controller: ControllerOpts,
    },
    /// Ask a running controller for its state (pids, restarts, sockets, workers).
    Status {
        /// The controller's state directory.
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rotate the CID key generation (through the running controller, or in the
    /// key file when none runs).
    RotateKeys {
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        /// The new generation's PRF: `siphash-2-4` (the kernel fast path can decode
        /// it) or `hmac-sha256` (user path only). Default: the newest generation's.
        #[arg(long, value_name = "PRF")]
        prf: Option<proto::cid::Prf>,
        /// Rotate even within three CID lifetimes of the last rotation (connections
        /// still on the generation that stops decoding are orphaned).
        #[arg(long)]
        force: bool,
        /// Several hosts (ADR 0005), first phase: decode a new generation but keep
        /// issuing the current one. Run on every host, then `--activate` on every host.
        #[arg(long, conflicts_with = "activate")]
        stage: bool,
        /// With `--stage`: stage the generation another host staged, from a copy of
        /// its key file (0600, root), so every host decodes the same new key.
        #[arg(long, value_name = "FILE", requires = "stage", conflicts_with = "prf")]
        from: Option<PathBuf>,
        /// Second phase: issue the staged generation (no new key; `--prf` does not apply).
        #[arg(long, conflicts_with_all = ["prf", "cid_format"])]
        activate: bool,
        /// The new generation's CID format (docs/adr/0007-quic-lb.md): `adr1`, or
        /// `"quic-lb server-id=S [nonce=N] [key=none|generate|HEX32] [length=self|random]"`
        /// (one argument). Default: the newest generation's. The config id is twice
        /// the generation.
        #[arg(long, value_name = "FORMAT", conflicts_with = "from")]
        cid_format: Option<proto::cid_format::FormatSpec>,
    },
    /// Upgrade a running appliance to new binaries without dropping a connection
    /// (docs/operations.md "Upgrading"): the data plane, then the workers one at a
    /// time, then the controller; a failed step rolls back and says why. Same as
    /// SIGUSR1 to the controller, but waits for the outcome (exit 1 on failure).
    Upgrade {
        /// The controller's state directory.
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        /// The new `demux` binary (default: the present path, holding the new build).
        #[arg(long, value_name = "PATH")]
        demux_bin: Option<PathBuf>,
        /// The new worker binary (default: the present `--worker-bin`).
        #[arg(long, value_name = "PATH")]
        worker_bin: Option<PathBuf>,
        /// Longest wait for the outcome.
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        timeout: u64,
    },
    /// Internal (an upgrade's preflight runs it with the new binary): whether this
    /// build takes over the state directory, and the protocol window it speaks.
    #[command(hide = true)]
    CheckState {
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        /// Tests only: as `demux dataplane --protocol-version`.
        #[arg(long, value_name = "V", hide = true)]
        protocol_version: Option<u8>,
        /// Also check a controller command line (NUL-separated, from stdin): this
        /// build parses it and passes its start checks.
        #[arg(long)]
        controller_args_stdin: bool,
    },
    /// Ask a running data plane for its counters.
    LbStatus {
        /// The data plane's `--control-socket`.
        #[arg(long, required_unless_present = "state_dir", conflicts_with = "state_dir")]
        control_socket: Option<PathBuf>,
        /// A controller's state directory (uses DIR/dataplane.sock).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IoKind {
    /// io_uring if this kernel and sandbox allow it, else mmsg (one log line says why).
    Auto,
    /// io_uring multishot recvmsg with a provided-buffer ring.
    Uring,
    /// recvmmsg + epoll (portable).
    Mmsg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RetryArg {
    Off,
    Auto,
    Always,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// `--fast-path`: the kernel fast path (docs/adr/0004-kernel-fast-path.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FastPathMode {
    /// Load the SK_REUSEPORT program if this kernel and sandbox allow it; otherwise
    /// one log line says why and every datagram takes the user path.
    Auto,
    /// Load it or refuse to start.
    On,
    /// Never: every datagram takes the user path.
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Steer {
    /// The kernel's reuseport 4-tuple hash.
    Hash,
    /// A classic-BPF reuseport program: the socket of the CPU that handles the packet.
    Cpu,
}

/// The longest `--busy-poll-us` (10 ms): a shard still sleeps between bursts.
pub const MAX_BUSY_POLL_US: u32 = 10_000;

#[derive(Clone, Debug, Args)]
pub struct DataPlaneArgs {
    /// Tests only (hidden): announce protocol version V (and V-1) instead of this
    /// build's, standing for a build that differs only in its version number
    /// (docs/wire.md "Versions"); V is this build's version up to 2 above it. A
    /// controller passes it on to the data plane it runs. Command line only.
    #[arg(long, value_name = "V", hide = true)]
    pub protocol_version: Option<u8>,
    /// Several hosts behind one anycast address (ADR 0005): this many top bits of
    /// every server id name the host (0..=8; 0 is one host).
    #[arg(long, value_name = "B", default_value_t = 0)]
    pub host_bits: u8,
    /// This host's id in the cluster (below 2^--host-bits); its server ids carry it.
    #[arg(long, value_name = "H", default_value_t = 0)]
    pub host_id: u16,
    /// The other hosts: `HOST_ID ADDR:PORT` lines (their `--peer-listen`), re-read on
    /// SIGHUP. A datagram for another host's server id is forwarded there.
    #[arg(long, value_name = "FILE", requires = "peer_listen")]
    pub peers: Option<std::path::PathBuf>,
    /// UDP address receiving forwarded datagrams from the other hosts (authenticated
    /// with the cluster key file; forged and replayed frames are dropped and counted).
    #[arg(long, value_name = "ADDR:PORT")]
    pub peer_listen: Option<SocketAddr>,
    /// Serve Prometheus text metrics on this TCP address (e.g. 127.0.0.1:9464):
    /// every numeric field of `lb-status --json` (with `--state-dir`: plus the
    /// controller's own).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Exit (removing the socket files) after this many seconds with no open control
    /// connection (a controller holds one) and no live instance. 0 = never (the
    /// standalone default); a controller passes its own value (default 60).
    #[arg(long, value_name = "SECS")]
    pub orphan_timeout: Option<u64>,
    /// UDP address to serve (repeatable; IPv4 and IPv6). Port 0 picks a free port,
    /// shared by every shard (see --ready-file).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Cores to run one shard each on: `0-3`, `0,2`, `0-1,3`.
    #[arg(long, value_name = "LIST", default_value = "0")]
    pub cores: String,
    /// Key file (quicdemux-keys 1, 2 or 3; `demux gen-keys` writes one). Standalone data
    /// plane only: the controller keeps it in the state directory.
    #[arg(long, value_name = "FILE", hide = true)]
    pub keys: Option<PathBuf>,
    /// Unix SOCK_SEQPACKET path the workers connect their data connections to.
    /// Standalone data plane only.
    #[arg(long, value_name = "PATH", hide = true)]
    pub data_socket: Option<PathBuf>,
    /// Receive backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoKind,
    /// How frames reach the workers: `ring` (a shared-memory ring per shard and
    /// worker, for workers that ask for it with `CAP_RINGS` in their `DataHello`, as the
    /// `worker` binary does unless `--rings off`; others keep SEQPACKET) or
    /// `seqpacket` (one record per frame on the data connection, for every worker).
    #[arg(long, value_enum, default_value = "ring")]
    pub forward: ForwardKind,
    /// `--forward ring`: data bytes per ring (a power of two, 128 KiB..=1 GiB).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub ring_bytes: u64,
    /// How the kernel spreads datagrams over the shards' sockets.
    #[arg(long, value_enum, default_value = "hash")]
    pub steer: Steer,
    /// Kernel fast path: an SK_REUSEPORT eBPF program steers established short-header
    /// datagrams straight to their worker's own socket; everything else comes here.
    #[arg(long, value_enum, default_value = "auto")]
    pub fast_path: FastPathMode,
    /// Unix SOCK_SEQPACKET path answering StatusRequest (mode 0600). Standalone data
    /// plane only.
    #[arg(long, value_name = "PATH", hide = true)]
    pub control_socket: Option<PathBuf>,
    /// Placement pins per shard (ADR 0001: 10 s each; the oldest is evicted when full).
    #[arg(long, default_value_t = 65_536)]
    pub pin_capacity: usize,
    /// CID decode cache entries per shard (rounded up to a power of two; 0 = off):
    /// repeat DCIDs of established connections skip the HMAC (proto::decode_cache).
    #[arg(long, value_name = "ENTRIES", default_value_t = proto::decode_cache::DEFAULT_ENTRIES)]
    pub decode_cache: usize,
    /// Per-source limits on new placements: `on` (default) or `off`.
    #[arg(long, value_enum, default_value = "on")]
    pub limits: OnOff,
    /// New connections per second per client (IPv4 address or IPv6 /64), sustained
    /// (1..=1000).
    #[arg(long, value_name = "PER_SEC", default_value_t = proto::limits::DEFAULT_RATE_PER_SECOND)]
    pub limit_rate: u32,
    /// New connections per client at once (GCRA burst).
    #[arg(long, value_name = "N", default_value_t = proto::limits::DEFAULT_BURST)]
    pub limit_burst: u32,
    /// Concurrent pinned handshakes per client (one per pin, 10 s each).
    #[arg(long, value_name = "N", default_value_t = proto::limits::DEFAULT_MAX_HANDSHAKES)]
    pub limit_handshakes: u16,
    /// Words (8 bytes) of each limits sketch, shared by all shards (power of two).
    #[arg(long, value_name = "N", default_value_t = proto::limits::DEFAULT_CONCURRENCY_WORDS)]
    pub limit_table_words: usize,
    /// Demux-minted stateless Retry for token-less client Initials:
    /// `auto` above --retry-above per shard, `always`, or `off`.
    #[arg(long, value_enum, default_value = "auto")]
    pub retry: RetryArg,
    /// `--retry auto`: token-less client Initials to place per second per shard
    /// above which they are answered with a Retry.
    #[arg(long, value_name = "PER_SEC", default_value_t = 10_000)]
    pub retry_above: u32,
    /// Handshake pressure (docs/operations.md "Liveness and pressure"): token-less
    /// Initials for an instance reporting more handshakes in progress than this (its
    /// `Load` messages) get a Retry at any rate. 0 = off.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub pressure_retry_above: u32,
    /// Token-less Initials for an instance reporting more handshakes in progress than
    /// this are dropped (counted as refused Overloaded). 0 = off.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub pressure_drop_above: u32,
    /// Most live instances at once (per-shard counter slots).
    #[arg(long, default_value_t = 1024)]
    pub max_instances: usize,
    /// io_uring: provided buffers per shard (power of two, 1..=32768), each one
    /// 64 KiB GRO train plus 512 bytes of headers.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..=32768))]
    pub uring_buffers: u16,
    /// io_uring: before a shard sleeps it spins up to this many µs watching for
    /// receives, so a datagram that arrives meanwhile is taken without a wake-up.
    /// Trades the shard core's idle time for latency: for shards on cores of their
    /// own (docs/operations.md "Busy polling"). 0 = off.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=MAX_BUSY_POLL_US as i64))]
    pub busy_poll_us: u32,
    /// After a data-plane restart the instances rejoin one by one: for this many ms
    /// after start, a datagram whose DCID decodes to an id that is not live is
    /// dropped (counted `held_for_rejoin`) instead of going to another instance for a
    /// stateless reset, so an established connection survives until its instance
    /// is back. Data plane: default 0 (off). Controller: what it gives each data
    /// plane it restarts (default 3000).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u32).range(0..=60_000))]
    pub rejoin_grace_ms: Option<u32>,
    /// Datagrams (or GRO trains) received per batch (recvmmsg backend).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Written once every socket is bound: one line `udp ADDR:PORT` per listen address,
    /// then `data PATH` (atomic rename; for tests and supervisors). Standalone data
    /// plane only.
    #[arg(long, value_name = "PATH", hide = true)]
    pub ready_file: Option<PathBuf>,
    /// Use these already bound UDP sockets (inherited fds, shard-major:
    /// `[shard][listen index]`) instead of binding: how the controller runs the data
    /// plane, so that a restarted data plane serves the very same sockets.
    #[arg(long, value_name = "FD,FD,...", value_delimiter = ',', hide = true)]
    pub inherit_fds: Vec<i32>,
    /// Also accept data connections from this uid (SO_PEERCRED; besides our own uid).
    /// The controller passes its `--worker-user`'s uid (docs/operations.md "Trust model").
    #[arg(long, value_name = "UID", hide = true)]
    pub worker_uid: Option<u32>,
    /// Make the data socket group-accessible (0660) to this gid (the controller passes
    /// its `--worker-user`'s group).
    #[arg(long, value_name = "GID", hide = true)]
    pub worker_gid: Option<u32>,
    /// The controller's registrations file (`SERVER_ID PID` lines, 0600, ours): a data
    /// hello for a server id must come from the pid that registered it (SO_PEERCRED).
    /// Without it (dataplane-only), data.sock checks the peer's uid only.
    #[arg(long, value_name = "PATH", hide = true)]
    pub registrations: Option<PathBuf>,
}

impl DataPlaneArgs {
    /// The `--limit*` flags (crate::dataplane::limits).
    pub fn limits_config(&self) -> crate::dataplane::limits::LimitsConfig {
        crate::dataplane::limits::LimitsConfig {
            enabled: self.limits == OnOff::On,
            rate_per_second: self.limit_rate,
            burst: self.limit_burst,
            handshakes: self.limit_handshakes,
            table_words: self.limit_table_words,
        }
    }

    /// The `--pressure-*` flags (crate::dataplane::pressure).
    pub fn pressure_config(&self) -> crate::dataplane::pressure::PressureConfig {
        crate::dataplane::pressure::PressureConfig {
            retry_above: self.pressure_retry_above,
            drop_above: self.pressure_drop_above,
        }
    }

    /// The `--retry*` flags (crate::dataplane::retry).
    pub fn retry_mode(&self) -> crate::dataplane::retry::RetryMode {
        match self.retry {
            RetryArg::Off => crate::dataplane::retry::RetryMode::Off,
            RetryArg::Auto => crate::dataplane::retry::RetryMode::Auto { above: self.retry_above },
            RetryArg::Always => crate::dataplane::retry::RetryMode::Always,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardKind {
    Seqpacket,
    Ring,
}

impl DataPlaneArgs {
    /// The ring size when forwarding over rings (`None`: SEQPACKET only).
    pub fn ring_size(&self) -> Option<u64> {
        (self.forward == ForwardKind::Ring).then_some(self.ring_bytes)
    }
}
