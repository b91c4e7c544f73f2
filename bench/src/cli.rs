//! Command line (clap 4 derive): `bench all`, `bench dataplane`, and the two
//! contenders `bench all` starts as its own subprocesses (`floor-server`,
//! `baseline-server`).

use clap::{ArgAction, Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The contenders of `bench all`, in their default order.
pub const CONTENDERS: [&str; 5] = ["floor", "baseline", "demux-uring", "demux-mmsg", "nginx"];

/// The `--io` values of `bench dataplane`: a demux `--io` backend, `+ring` for `--forward ring`.
pub const DATAPLANE_IOS: [&str; 6] = ["uring", "mmsg", "auto", "uring+ring", "mmsg+ring", "auto+ring"];

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "quicdemux system benchmarks",
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Side by side (issue #6): demux, baseline, nginx and floor; rewrites docs/benchmarks.md.
    ///
    /// The demux (io_uring and mmsg), the per-datagram baseline, nginx's stream UDP
    /// proxy and a recv-and-drop floor, each pinned to the shard core, under load from
    /// the load core; CPU µs per datagram, ratios, and the demux hop's latency at
    /// 25/50/75 % of its saturation. Rewrites the generated block of docs/benchmarks.md
    /// and docs/benchmarks-cpu.svg (`--no-doc`: neither).
    All(AllArgs),
    /// Data plane (issue #3): one demux shard's CPU time per forwarded datagram.
    ///
    /// One data-plane shard on one core, a sender and sink workers on the other; the
    /// data plane's CPU time per forwarded datagram and its counters, as a table on stdout.
    Dataplane(DataplaneArgs),
    /// Contender started by `bench all`: recvmmsg and discard.
    ///
    /// The least any socket reader can spend per datagram.
    FloorServer(FloorArgs),
    /// Contender started by `bench all`: one recvmsg, decode and send() per datagram.
    ///
    /// The per-datagram design being replaced: recvmsg, CID decode, one send() of a
    /// frame to that server id's SEQPACKET socket.
    BaselineServer(BaselineArgs),
}

/// `bench all`. A list flag given twice: the last one wins; `--rate` and `--rates`
/// override each other the same way.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct AllArgs {
    /// Seconds of load per run (per contender, mode and offered rate).
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = positive_f64)]
    pub seconds: f64,
    /// Repetitions (rounds); the contenders' order rotates from round to round.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = positive_usize)]
    pub reps: usize,
    /// Contenders to run, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = CONTENDERS, default_value = "floor,baseline,demux-uring,demux-mmsg,nginx")]
    pub contenders: Vec<String>,
    /// Datagrams per message, comma-separated: 1 = uncoalesced, N > 1 = UDP_SEGMENT trains of N.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = positive_usize, default_value = "1,8")]
    pub trains: Vec<usize>,
    /// One offered rate in datagrams/s (0 = unpaced): the same as `--rates N`.
    #[arg(long, value_name = "N", overrides_with = "rates")]
    pub rate: Option<f64>,
    /// Offered rates in datagrams/s, comma-separated, one run each (0 = unpaced).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          default_value = "0,100000", overrides_with = "rate")]
    pub rates: Vec<f64>,
    /// Core the contender (and the demux in latency runs) is pinned to.
    #[arg(long, value_name = "C", default_value_t = 0)]
    pub shard_core: usize,
    /// Core of the sender, the sinks and the latency probes.
    #[arg(long, value_name = "L", default_value_t = 1)]
    pub load_core: usize,
    /// Skip the demux hop's latency runs.
    #[arg(long)]
    pub no_latency: bool,
    /// Latency as round trips with `udpflood --latency` and `worker --echo` instead
    /// of the one-way in-bench probe (builds worker and udpflood).
    #[arg(long)]
    pub udpflood: bool,
    /// Latency runs: leave the demux and the probe threads at the bench's nice
    /// value instead of SCHED_FIFO.
    #[arg(long)]
    pub no_rt: bool,
    /// Seconds of probes per latency run.
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    pub latency_seconds: f64,
    /// Latency probes per second.
    #[arg(long, value_name = "N", default_value_t = 1000.0)]
    pub probe_rate: f64,
    /// The doc whose generated block is rewritten [default: docs/benchmarks.md].
    #[arg(long, value_name = "FILE")]
    pub doc: Option<PathBuf>,
    /// Where to write the CPU chart [default: docs/benchmarks-cpu.svg].
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Write neither the doc nor the chart (the report goes to stdout only).
    #[arg(long, conflicts_with_all = ["doc", "svg"])]
    pub no_doc: bool,
    /// Also write every run as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Refuse instead of apt-get installing nginx-light and libnginx-mod-stream when missing.
    #[arg(long)]
    pub no_install: bool,
    /// Nice value for the bench and all it starts, in an autogroup of its own (0 = leave priorities alone).
    #[arg(long, value_name = "N", default_value_t = -20, allow_negative_numbers = true)]
    pub nice: i32,
}

/// `bench dataplane`. `--io` given twice: the last one wins.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct DataplaneArgs {
    /// Seconds of load per run.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    pub seconds: f64,
    /// Datagrams per second to offer (0 = unpaced, as fast as the sender can).
    #[arg(long, value_name = "DATAGRAMS_PER_S", default_value_t = 0.0)]
    pub rate: f64,
    /// Demux backends, comma-separated; `+ring`: the demux runs with `--forward ring`.
    #[arg(long = "io", value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = DATAPLANE_IOS, default_value = "uring,mmsg,uring+ring,mmsg+ring")]
    pub ios: Vec<String>,
    /// Core of the demux's one shard.
    #[arg(long, value_name = "C", default_value_t = 0)]
    pub shard_core: usize,
    /// Core of the sender and the sink workers.
    #[arg(long, value_name = "L", default_value_t = 1)]
    pub load_core: usize,
}

/// What both contender servers take.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// UDP address to receive on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Written (`udp ADDR`) once the socket is bound.
    #[arg(long, value_name = "FILE")]
    pub ready_file: PathBuf,
    /// The shared counters file (created) that the bench maps.
    #[arg(long, value_name = "FILE")]
    pub counters: PathBuf,
}

#[derive(Debug, Args)]
pub struct FloorArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Receive with UDP_GRO and count the datagrams inside each train.
    #[arg(long)]
    pub gro: bool,
}

#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The key file (as `demux gen-keys` writes it) to decode CIDs with.
    #[arg(long, value_name = "FILE")]
    pub keys: PathBuf,
    /// A worker: server id ID is served on the SEQPACKET socket PATH (repeatable).
    #[arg(long = "worker", value_name = "ID=PATH", value_parser = worker_spec)]
    pub workers: Vec<(u16, PathBuf)>,
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 => Ok(x),
        Ok(_) => Err("must be positive".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn positive_usize(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be positive".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn worker_spec(s: &str) -> Result<(u16, PathBuf), String> {
    let (id, path) = s.split_once('=').ok_or("expected ID=PATH")?;
    Ok((id.parse().map_err(|e| format!("server id {id:?}: {e}"))?, path.into()))
}
