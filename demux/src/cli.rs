//! Command line (clap 4 derive). The data-plane flags live on `demux dataplane` and,
//! for now, also on the bare `demux` (no subcommand), so that the controller can add
//! its own subcommands later without breaking existing invocations.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "demux",
    version,
    about = "quicdemux data plane: shares one UDP address among QUIC server processes",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Data-plane flags when no subcommand is given (same as `demux dataplane`).
    #[command(flatten)]
    pub dataplane: DataPlaneArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the data plane (the default when no subcommand is given).
    Dataplane(DataPlaneArgs),
    /// Write a fresh key file (OS randomness, mode 0600).
    GenKeys {
        /// Where to write the key file; refuses to overwrite an existing file.
        #[arg(long)]
        out: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Ask a running data plane for its counters.
    LbStatus {
        /// The data plane's `--control-socket`.
        #[arg(long)]
        control_socket: PathBuf,
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
pub enum Steer {
    /// The kernel's reuseport 4-tuple hash.
    Hash,
    /// A classic-BPF reuseport program: the socket of the CPU that handles the packet.
    Cpu,
}

#[derive(Clone, Debug, Args)]
pub struct DataPlaneArgs {
    /// UDP address to serve (repeatable; IPv4 and IPv6). Port 0 picks a free port,
    /// shared by every shard (see --ready-file).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Cores to run one shard each on: `0-3`, `0,2`, `0-1,3`.
    #[arg(long, value_name = "LIST", default_value = "0")]
    pub cores: String,
    /// Key file (quicdemux-keys 1; `demux gen-keys` writes one).
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// Unix SOCK_SEQPACKET path the workers connect their data connections to.
    #[arg(long, value_name = "PATH")]
    pub data_socket: Option<PathBuf>,
    /// Receive backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoKind,
    /// How the kernel spreads datagrams over the shards' sockets.
    #[arg(long, value_enum, default_value = "hash")]
    pub steer: Steer,
    /// Unix SOCK_SEQPACKET path answering StatusRequest (mode 0600).
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    /// Placement pins per shard (ADR-0040: 10 s each; the oldest is evicted when full).
    #[arg(long, default_value_t = 65_536)]
    pub pin_capacity: usize,
    /// Most live instances at once (per-shard counter slots).
    #[arg(long, default_value_t = 1024)]
    pub max_instances: usize,
    /// io_uring: provided buffers per shard (power of two, 1..=32768), each one
    /// 64 KiB GRO train plus 512 bytes of headers.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=32768))]
    pub uring_buffers: u16,
    /// Datagrams (or GRO trains) received per batch (recvmmsg backend).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Written once every socket is bound: one line `udp ADDR:PORT` per listen address,
    /// then `data PATH` (atomic rename; for tests and supervisors).
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
}
