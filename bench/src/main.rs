//! quicdemux system benchmarks.
//!
//! `cargo run --release -p bench -- dataplane [--seconds S] [--rate DATAGRAMS_PER_S] [--io uring,mmsg] [--shard-core C] [--load-core L]`
//!
//! Issue #3: one data-plane shard on one core, a sender and sink workers on the other;
//! the data plane's CPU time (user + sys of every thread, from
//! /proc/<pid>/task/*/schedstat, cross-checked with /proc/<pid>/stat) per forwarded
//! datagram, for 1200-byte datagrams sent one by one and as UDP_SEGMENT trains of 8,
//! for both io backends.

mod dataplane;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("dataplane") => dataplane::main(&args[1..]),
        _ => {
            eprintln!("usage: bench dataplane [--seconds S] [--rate DATAGRAMS_PER_S] [--io uring,mmsg] [--shard-core C] [--load-core L]");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("bench: error: {e:#}");
        std::process::exit(1);
    }
}
