//! quicdemux system benchmarks (`bench --help`; the flags are in cli.rs).
//!
//! `cargo run --release -p bench -- all [--seconds S] [--reps N] [--contenders floor,baseline,demux-uring,demux-mmsg,nginx] [--trains 1,8] [--rates 0,100000] [--no-latency] [--no-doc] [--json FILE]`
//!
//! Side by side: the demux (io_uring and mmsg), a per-datagram baseline, nginx's stream
//! UDP proxy and a recv-and-drop floor side by side; CPU µs per datagram, the most
//! datagrams/s with the sender on the other core, ratios, and the demux hop's
//! latency at 25/50/75 % of its saturation. Writes docs/benchmarks.md and
//! docs/benchmarks-cpu.svg.
//!
//! `cargo run --release -p bench -- dataplane [--seconds S] [--rate DATAGRAMS_PER_S] [--io uring,mmsg,uring+ring,mmsg+ring] [--shard-core C] [--load-core L]`
//!
//! The data plane alone: one data-plane shard on one core, a sender and sink workers on the other;
//! the data plane's CPU time per forwarded datagram and its counters.
//!
//! `cargo run --release -p bench -- fastpath [--seconds S] [--reps N] [--contenders floor,fast,seqpacket,ring] [--loads 25,50,75] [--doc FILE] [--svg FILE] [--json FILE]`
//!
//! The kernel fast path, whole system: a sink on its own UDP socket (the floor), the
//! SK_REUSEPORT fast path into the same sink, the user path with SEQPACKET and with
//! `--forward ring`; CPU per datagram of every receiving process, the sender's
//! separately, one-way latency at 25/50/75 % of the floor's rate (fastpath.rs).
//!
//! `cargo run --release -p bench -- saturation [--datagrams N] [--queue BYTES] [--reps N] [--contenders floor,baseline,seqpacket,ring] [--trains 1,8] [--doc FILE] [--json FILE]`
//!
//! Capacity at saturation (saturation.rs): each contender's socket queue is filled
//! while the contender is stopped, then it drains; its CPU time and the wall time of
//! the drain per datagram, uncoalesced and in GRO trains.
//!
//! `cargo run --release -p bench -- h3 [--seconds S] [--reps N] [--contenders alone,fast,user,two] [--loads get-1k,get-64k,new-conn,download] [--doc FILE] [--svg FILE] [--json FILE]`
//!
//! HTTP/3 through the appliance against quinn alone (h3.rs, the client in
//! h3_load.rs): requests/s, new connections/s and MB/s, server CPU per request and
//! latency percentiles, (a) `worker --listen` against the appliance with one worker
//! (fast path on, off) and with two.
//!
//! `cargo run --release -p bench -- proxy [--seconds S] [--reps N] [--download-mib 32] [--doc FILE] [--svg FILE] [--json FILE]`
//!
//! The worker as a reverse proxy (proxy.rs, on h3.rs): the appliance with
//! `--upstream` to a hyper HTTP/1.1 upstream in the bench against the same appliance
//! serving `/bytes/N` itself; requests/s, MB/s, latency, server CPU per request and
//! the upstream's apart.
//!
//! `bench floor-server …` and `bench baseline-server …` are the contenders `all`
//! starts as subprocesses (see servers.rs).

mod all;
mod cli;
mod dataplane;
mod fastpath;
mod forward;
mod h3;
mod h3_load;
mod load;
mod proxy;
mod report;
mod saturation;
mod servers;
mod sys;

use clap::Parser;
use cli::{Cli, Command};

fn main() {
    let r = match Cli::parse().command {
        Command::All(a) => all::main(a),
        Command::Dataplane(a) => dataplane::main(a),
        Command::Forward(a) => forward::main(a),
        Command::Fastpath(a) => fastpath::main(a),
        Command::Saturation(a) => saturation::main(a),
        Command::H3(a) => h3::main(a),
        Command::Proxy(a) => proxy::main(a),
        Command::FloorServer(a) => servers::floor(a),
        Command::BaselineServer(a) => servers::baseline(a),
        Command::RetryFloorServer(a) => servers::retry_floor(a),
    };
    if let Err(e) = r {
        eprintln!("bench: error: {e:#}");
        std::process::exit(1);
    }
}
