//! Command line (clap 4 derive): `bench all`, `bench dataplane`, and the two
//! contenders `bench all` starts as its own subprocesses (`floor-server`,
//! `baseline-server`).

use clap::{ArgAction, Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The contenders of `bench all`, in their default order.
pub const CONTENDERS: [&str; 5] = ["floor", "baseline", "demux-uring", "demux-mmsg", "nginx"];

/// The contenders of `bench fastpath`, in their default order: a sink on its own UDP
/// socket (no demux), the kernel fast path into the same sink, the user path with
/// SEQPACKET, the user path with `--forward ring`.
pub const FASTPATH_CONTENDERS: [&str; 4] = ["floor", "fast", "seqpacket", "ring"];

/// The contenders of `bench h3`, in their default order: (a) `alone`, one `worker
/// --listen` on quinn's own socket; the appliance (`demux --state-dir`) with (b)
/// `fast`, one worker and the fast path on, (c) `user`, one worker and the fast path
/// off, (d) `two`, two workers and a shard on each of the two cores.
pub const H3_CONTENDERS: [&str; 4] = ["alone", "fast", "user", "two"];

/// The loads of `bench h3`, in order: 1 KiB and 64 KiB GETs on established
/// connections, new connections (one small GET each), one large download.
pub const H3_LOADS: [&str; 4] = ["get-1k", "get-64k", "new-conn", "download"];

/// The contenders of `bench saturation`, in their default order: the recv-and-drop
/// floor, the per-datagram baseline, the demux's user path (io_uring, `--fast-path
/// off`) with `--forward seqpacket` and with `--forward ring`, and the demux answering
/// a flood of token-less Initials with Retries (`--retry always`; uncoalesced only):
/// `retry` sends them through a dummy device in a namespace of its own (as towards a
/// NIC), `retry-loopback` back over loopback to the sender's full sockets.
pub const SATURATION_CONTENDERS: [&str; 7] =
    ["floor", "baseline", "seqpacket", "ring", "retry-floor", "retry", "retry-loopback"];

/// Datagrams `bench saturation` queues per run by default (≈ 0.9 GiB of queue uncoalesced).
pub const SATURATION_DATAGRAMS: u64 = 400_000;

/// The largest receive queue `bench saturation` asks for: the kernel keeps the
/// queue's bytes in an `int`, which a 2 GiB queue would overflow.
pub const MAX_SATURATION_QUEUE: u64 = 1 << 30;

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
    /// Side by side: demux, baseline, nginx and floor; rewrites docs/benchmarks.md.
    ///
    /// The demux (io_uring and mmsg), the per-datagram baseline, nginx's stream UDP
    /// proxy and a recv-and-drop floor, each pinned to the shard core, under load from
    /// the load core; CPU µs per datagram, ratios, and the demux hop's latency at
    /// 25/50/75 % of its saturation. Rewrites the generated block of docs/benchmarks.md
    /// and docs/benchmarks-cpu.svg (`--no-doc`: neither).
    All(AllArgs),
    /// Host-to-host forwarding (ADR 0005): CPU per datagram forwarded between two
    /// data planes on this machine, against the same load sent straight to its owner.
    Forward(ForwardArgs),
    /// Data plane: one demux shard's CPU time per forwarded datagram.
    ///
    /// One data-plane shard on one core, a sender and sink workers on the other; the
    /// data plane's CPU time per forwarded datagram and its counters, as a table on stdout.
    Dataplane(DataplaneArgs),
    /// Whole system, established short headers: floor, kernel fast path, SEQPACKET, ring.
    ///
    /// (a) a sink on its own UDP socket, no demux; (b) the kernel fast path into the
    /// same sink (DataHello with CAP_FAST_PATH, its own socket); (c) the user path
    /// with SEQPACKET; (d) with `--forward ring`. CPU per datagram of every receiving
    /// process (and, separately, the sender's), one-way latency at 25/50/75 % of the
    /// floor's unpaced rate. Prints Markdown; `--doc`/`--svg` write it into the docs.
    Fastpath(FastpathArgs),
    /// HTTP/3 through the appliance against quinn alone: requests/s, connections/s, MB/s.
    ///
    /// (a) one `worker --listen` (quinn's own UDP socket), (b) the appliance with one
    /// worker and the fast path, (c) without the fast path, (d) with two workers on
    /// two cores; an in-process quinn/h3 client on the other core offers 1 KiB and
    /// 64 KiB GETs over established connections, new connections (one small GET
    /// each, full handshakes) and one large download. Server CPU (every server
    /// process) per request, latency percentiles, medians over rotating rounds.
    /// Prints Markdown; `--doc` writes it into docs/benchmarks.md.
    H3(H3Args),
    /// The worker as a reverse proxy against its built-in responses.
    ///
    /// `bench h3`'s (b), the appliance with one worker and the fast path, against
    /// (e) the same with `--upstream` to a hyper HTTP/1.1 upstream in the bench (on
    /// the client's core): 1 KiB GETs over established connections and one large
    /// download; server CPU per request (the upstream's apart), latency
    /// percentiles, medians over rotating rounds. Prints Markdown; `--doc` writes it
    /// into docs/benchmarks.md.
    Proxy(ProxyArgs),
    /// Capacity at saturation: queue datagrams while the contender is stopped, then time its drain.
    ///
    /// Floor, baseline, and the demux's user path with SEQPACKET and with ring
    /// forwarding: each contender's socket gets a receive queue of `--queue` bytes, the
    /// contender is stopped (SIGSTOP) while the sender fills it, then continued
    /// (SIGCONT); its CPU time and the wall time until the last datagram reached the
    /// workers give CPU µs per datagram and datagrams/s per core at saturation.
    /// Prints Markdown; `--doc` writes it into docs/benchmarks.md.
    Saturation(SaturationArgs),
    /// Contender started by `bench all`: recvmmsg and discard.
    ///
    /// The least any socket reader can spend per datagram.
    FloorServer(FloorArgs),
    /// Contender started by `bench all`: one recvmsg, decode and send() per datagram.
    ///
    /// The per-datagram design being replaced: recvmsg, CID decode, one send() of a
    /// frame to that server id's SEQPACKET socket.
    BaselineServer(BaselineArgs),
    /// Contender started by `bench saturation`: recvmmsg, then one reply per datagram.
    ///
    /// What the kernel alone costs a Retry: each received datagram's first
    /// `--reply-len` bytes go back to its source (sendmmsg), with no parsing or crypto.
    RetryFloorServer(RetryFloorArgs),
}

/// `bench all`. A list flag given twice: the last one wins; `--rate` and `--rates`
/// override each other the same way.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct AllArgs {
    /// Seconds of load per run (per contender, mode and offered rate).
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = positive_f64)]
    pub seconds: f64,
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
    #[command(flatten)]
    pub rounds: Rounds,
    /// Skip the demux hop's latency runs.
    #[arg(long)]
    pub no_latency: bool,
    /// Skip the saturation runs (`bench saturation` with its defaults and these
    /// `--reps`, `--trains` and cores, its own block in the doc).
    #[arg(long)]
    pub no_saturation: bool,
    /// Latency as round trips with `udpflood --latency` and `worker --echo` instead
    /// of the one-way in-bench probe (builds worker and udpflood).
    #[arg(long)]
    pub udpflood: bool,
    /// Latency runs: leave the demux and the probe threads at the bench's nice
    /// value instead of SCHED_FIFO.
    #[arg(long)]
    pub no_rt: bool,
    /// Latency runs: also run each load with the demux at `--busy-poll-us N`, and
    /// with the probes sent straight to the probe thread's own UDP socket (the
    /// direct-socket floor, the demux still taking the background load). 0 = neither.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0, conflicts_with = "udpflood")]
    pub busy_poll_us: u32,
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

/// `bench forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// Seconds of load per run.
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = positive_f64)]
    pub seconds: f64,
    /// Datagrams per second offered (paced).
    #[arg(long, value_name = "DATAGRAMS_PER_S", default_value_t = 20_000.0, value_parser = positive_f64)]
    pub rate: f64,
    /// Repetitions (medians are reported).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub reps: usize,
    /// Core of both data planes' one shard.
    #[arg(long, value_name = "C", default_value_t = 0)]
    pub shard_core: usize,
    /// Core of the sender and the sink.
    #[arg(long, value_name = "L", default_value_t = 1)]
    pub load_core: usize,
}

/// `bench fastpath`. A list flag given twice: the last one wins.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct FastpathArgs {
    /// Seconds of load per run (per contender and load).
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = positive_f64)]
    pub seconds: f64,
    /// Contenders to run, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = FASTPATH_CONTENDERS, default_value = "floor,fast,seqpacket,ring")]
    pub contenders: Vec<String>,
    /// Paced loads in % of the floor's unpaced rate, comma-separated (after one unpaced run each).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = positive_f64, default_value = "25,50,75")]
    pub loads: Vec<f64>,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub out: Outputs,
    /// Count the SK_REUSEPORT program's run time in the fast runs (BPF_ENABLE_STATS,
    /// `bpftool prog show`); adds two clock reads to every eBPF program run meanwhile.
    #[arg(long)]
    pub bpf_stats: bool,
}

/// `bench h3`. A list flag given twice: the last one wins.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct H3Args {
    /// Seconds of each timed load (per contender, load and round).
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = positive_f64)]
    pub seconds: f64,
    /// Contenders to run, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = H3_CONTENDERS, default_value = "alone,fast,user,two")]
    pub contenders: Vec<String>,
    /// Loads to offer, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = H3_LOADS, default_value = "get-1k,get-64k,new-conn,download")]
    pub loads: Vec<String>,
    /// Established connections of the GET loads (one request in flight on each).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = positive_usize)]
    pub connections: usize,
    /// New-connection load: connections being opened at once.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = positive_usize)]
    pub handshakes: usize,
    /// Size of the download, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = positive_u64)]
    pub download_mib: u64,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub out: Outputs,
}

/// `bench proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Seconds of the 1 KiB GET load (per contender and round).
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = positive_f64)]
    pub seconds: f64,
    /// Established connections of the GET load (one request in flight on each).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = positive_usize)]
    pub connections: usize,
    /// Size of the download, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 32, value_parser = positive_u64)]
    pub download_mib: u64,
    #[command(flatten)]
    pub rounds: Rounds,
    #[command(flatten)]
    pub out: Outputs,
}

/// `bench saturation`. A list flag given twice: the last one wins.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct SaturationArgs {
    /// Datagrams to queue per run (fewer when the queue fills first).
    #[arg(long, value_name = "N", default_value_t = SATURATION_DATAGRAMS, value_parser = positive_u64)]
    pub datagrams: u64,
    /// The contender socket's receive queue in bytes as the kernel counts it (skb
    /// truesize: ≈ 2.3 KB per uncoalesced 1200-byte datagram on loopback); at most 1 GiB.
    #[arg(long, value_name = "BYTES", default_value_t = MAX_SATURATION_QUEUE, value_parser = queue_bytes)]
    pub queue: u64,
    /// Contenders to run, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = SATURATION_CONTENDERS, default_value = "floor,baseline,seqpacket,ring,retry-floor,retry,retry-loopback")]
    pub contenders: Vec<String>,
    /// Datagrams per message, comma-separated: 1 = uncoalesced, N > 1 = UDP_SEGMENT trains of N.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = positive_usize, default_value = "1,8")]
    pub trains: Vec<usize>,
    /// Core the sender fills the queue from. `shard`: every skb is allocated on the
    /// core that drains it, as when a NIC queue's interrupts are on the shard's core
    /// (RSS with steering by CPU). `load`: on the other core, so the drain also pays
    /// the kernel's cross-core skb free (skb_attempt_defer_free and its IPIs), which
    /// loopback alone causes.
    #[arg(long, value_enum, default_value = "shard")]
    pub fill_core: FillCore,
    #[command(flatten)]
    pub rounds: Rounds,
    /// Rewrite the generated `bench saturation` block of FILE (e.g. docs/benchmarks.md).
    #[arg(long, value_name = "FILE")]
    pub doc: Option<PathBuf>,
    /// Also write every run as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `bench saturation --fill-core`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FillCore {
    Shard,
    Load,
}

/// What `bench all`, `bench fastpath` and `bench saturation` share: rounds, where the
/// contender and the load run, and at what priority.
#[derive(Clone, Debug, Args)]
pub struct Rounds {
    /// Repetitions (rounds); the contenders' order rotates from round to round.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = positive_usize)]
    pub reps: usize,
    /// Core of the contender: the demux's one shard (also in latency runs), a
    /// contender server, the sink of `bench fastpath`.
    #[arg(long, value_name = "C", default_value_t = 0)]
    pub shard_core: usize,
    /// Core of the sender, the sinks (`bench all`, `bench saturation`) and the latency probes.
    #[arg(long, value_name = "L", default_value_t = 1)]
    pub load_core: usize,
    /// Nice value for the bench and all it starts, in an autogroup of its own (0 = leave priorities alone).
    #[arg(long, value_name = "N", default_value_t = -20, allow_negative_numbers = true)]
    pub nice: i32,
}

/// Where `bench fastpath` and `bench h3` write their results besides stdout.
#[derive(Clone, Debug, Default, Args)]
pub struct Outputs {
    /// Rewrite this bench's generated block of FILE (e.g. docs/benchmarks.md).
    #[arg(long, value_name = "FILE")]
    pub doc: Option<PathBuf>,
    /// Write this bench's chart to FILE (e.g. docs/benchmarks-fastpath.svg, docs/benchmarks-h3.svg).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Also write every run (`bench h3`: and the medians and targets) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
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
pub struct RetryFloorArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Bytes of each received datagram to send back (a Retry's length; at most 2048).
    #[arg(long, value_name = "N")]
    pub reply_len: usize,
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

fn positive_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be positive".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn queue_bytes(s: &str) -> Result<u64, String> {
    match positive_u64(s)? {
        n if n > MAX_SATURATION_QUEUE => Err(format!("at most {MAX_SATURATION_QUEUE} (1 GiB)")),
        n if n < 1 << 20 => Err("at least 1048576 (1 MiB)".into()),
        n => Ok(n),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
    }

    fn all(line: &str) -> AllArgs {
        match parse(&format!("all {line}")).unwrap_or_else(|e| panic!("bench all {line}: {e}")).command {
            Command::All(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every command line docs/benchmarks.md, the crate docs (main.rs, servers.rs) and
    /// the smoke test show, with their placeholders filled in.
    #[test]
    fn documented_invocations_parse() {
        let lines = [
            // docs/benchmarks.md, "Side by side": the command and each option it lists.
            "all",
            "all --seconds 3 --reps 3 --contenders floor,baseline,demux-uring,demux-mmsg,nginx --trains 1,8 \
             --rates 0,100000 --no-latency --latency-seconds 3 --probe-rate 1000 --udpflood --no-rt --nice -20 \
             --json /tmp/runs.json --no-doc --no-saturation",
            "all --no-install --doc /tmp/b.md --svg /tmp/b.svg --nice 0",
            "all --contenders floor,baseline,demux-mmsg --trains 1 --rates 0",
            // docs/benchmarks.md, "data plane" and "ring forwarding".
            "dataplane",
            "dataplane --seconds 5 --rate 100000 --io uring,mmsg --shard-core 0 --load-core 1",
            "dataplane --rate 100000",
            "dataplane --seconds 4 --io uring,uring+ring,mmsg,mmsg+ring",
            // main.rs's crate docs (and the old usage message: `--rate N` on `all`).
            "all --seconds 3 --reps 3 --contenders floor,baseline,demux-uring,demux-mmsg,nginx --trains 1,8 \
             --rates 0,100000 --no-latency --no-doc --json /tmp/runs.json",
            "all --rate 100000",
            "dataplane --seconds 5 --rate 0 --io uring,mmsg,uring+ring,mmsg+ring --shard-core 0 --load-core 1",
            // docs/benchmarks.md, "kernel fast path", and a smoke run.
            "fastpath",
            "fastpath --seconds 3 --reps 3 --contenders floor,fast,seqpacket,ring --loads 25,50,75 \
             --shard-core 0 --load-core 1 --nice -20 --doc docs/benchmarks.md --svg docs/benchmarks-fastpath.svg \
             --json /tmp/fp.json",
            "fastpath --contenders floor,fast --loads 50 --bpf-stats",
            "fastpath --seconds 1 --reps 1 --loads 50 --nice 0",
            // servers.rs, as `bench all` starts them (all/contenders.rs).
            "floor-server --listen 127.0.0.1:0 --ready-file /tmp/r --counters /tmp/c --gro",
            "baseline-server --keys /tmp/k --worker 1=/tmp/w1.sock --worker 2=/tmp/w2.sock --listen 127.0.0.1:0 \
             --ready-file /tmp/r --counters /tmp/c",
            // docs/benchmarks.md, "Saturation", and tests/saturation.rs.
            "saturation",
            "saturation --datagrams 400000 --queue 1073741824 --reps 3 --contenders floor,baseline,seqpacket,ring \
             --trains 1,8 --shard-core 0 --load-core 1 --nice -20 --doc docs/benchmarks.md --json /tmp/sat.json",
            "saturation --datagrams 20000 --queue 67108864 --reps 1 --contenders floor,ring --trains 1 --nice 0",
            // tests/smoke.rs.
            "all --seconds 1 --reps 1 --rates 5000 --trains 1,8 --no-latency --no-saturation --no-doc --nice 0 \
             --contenders floor,baseline --json /tmp/smoke.json",
        ];
        for l in lines {
            if let Err(e) = parse(l) {
                panic!("bench {l}: {e}");
            }
        }
    }

    /// The `cargo run --release -p bench -- …` command lines quoted in docs/benchmarks.md.
    #[test]
    fn command_lines_in_benchmarks_md_parse() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/benchmarks.md")).unwrap();
        let doc = doc.replace('\n', " ");
        let mut n = 0;
        for (i, _) in doc.match_indices("-p bench -- ") {
            let rest = &doc[i + "-p bench -- ".len()..];
            let line = &rest[..rest.find(['`', '(']).unwrap_or(rest.len())];
            if let Err(e) = parse(line) {
                panic!("bench {line}: {e}");
            }
            n += 1;
        }
        assert!(n >= 3, "found only {n} bench command lines in docs/benchmarks.md");
    }

    #[test]
    fn unknown_flags_and_bad_values_are_errors() {
        for l in [
            "all --bogus",
            "dataplane --bogus",
            "floor-server --ready-file r --counters c --bogus",
            "all --contenders floor,nope",
            "all --seconds 0",
            "all --seconds x",
            "all --reps 0",
            "all --trains 1,x",
            "all --no-doc --doc /tmp/b.md",
            "dataplane --io uring,nope",
            "fastpath --contenders floor,nope",
            "fastpath --loads 0",
            "fastpath --seconds 0",
            "saturation --contenders floor,nope",
            "saturation --datagrams 0",
            "saturation --queue 2147483648",
            "saturation --queue 1000",
            "saturation --trains 0",
            "baseline-server --ready-file r --counters c --keys k --worker 1",
            "baseline-server --ready-file r --counters c",
            "nope",
        ] {
            assert!(parse(l).is_err(), "bench {l} was accepted");
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let a = all("");
        assert_eq!(
            (a.seconds, a.rounds.reps, a.rounds.nice, a.probe_rate, a.latency_seconds),
            (3.0, 3, -20, 1000.0, 3.0)
        );
        assert_eq!(a.contenders, CONTENDERS);
        assert_eq!((a.trains, a.rates, a.rate), (vec![1, 8], vec![0.0, 100_000.0], None));
        assert_eq!((a.rounds.shard_core, a.rounds.load_core), (0, 1));
        assert!(!a.no_latency && !a.no_saturation && !a.udpflood && !a.no_rt && !a.no_doc && !a.no_install);
        let Command::Dataplane(d) = parse("dataplane").unwrap().command else { panic!() };
        assert_eq!((d.seconds, d.rate, d.shard_core, d.load_core), (5.0, 0.0, 0, 1));
        assert_eq!(d.ios, ["uring", "mmsg", "uring+ring", "mmsg+ring"]);
        let Command::Fastpath(f) = parse("fastpath").unwrap().command else { panic!() };
        let r = &f.rounds;
        assert_eq!((f.seconds, r.reps, r.nice, r.shard_core, r.load_core), (3.0, 3, -20, 0, 1));
        assert_eq!(f.contenders, FASTPATH_CONTENDERS);
        assert_eq!(f.loads, [25.0, 50.0, 75.0]);
        assert!(f.out.doc.is_none() && f.out.svg.is_none() && f.out.json.is_none() && !f.bpf_stats);
        let Command::Saturation(s) = parse("saturation").unwrap().command else { panic!() };
        let r = &s.rounds;
        assert_eq!((s.datagrams, s.queue, r.reps, r.nice, r.shard_core, r.load_core), (400_000, 1 << 30, 3, -20, 0, 1));
        assert_eq!((s.contenders, s.trains), (SATURATION_CONTENDERS.map(String::from).to_vec(), vec![1, 8]));
        assert!(s.doc.is_none() && s.json.is_none());
        assert_eq!(s.fill_core, FillCore::Shard);
        let Command::Saturation(s) = parse("saturation --fill-core load").unwrap().command else { panic!() };
        assert_eq!(s.fill_core, FillCore::Load);
        assert!(parse("saturation --fill-core 1").is_err());
    }

    /// As with the hand-written parser: a flag given again, and `--rate` against
    /// `--rates`, the last one wins.
    #[test]
    fn last_one_wins() {
        assert_eq!(all("--contenders floor,nginx --contenders baseline").contenders, ["baseline"]);
        assert_eq!(all("--seconds 2 --seconds 5").seconds, 5.0);
        let a = all("--rates 1,2 --rate 7");
        assert_eq!(a.rate, Some(7.0));
        let a = all("--rate 7 --rates 1,2");
        assert_eq!((a.rate, a.rates), (None, vec![1.0, 2.0]));
    }
}
