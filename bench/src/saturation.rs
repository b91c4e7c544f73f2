//! `bench saturation`: what one core handles when no sender can hold it back.
//!
//! Every figure of `bench all` and `bench fastpath` is limited by the sender: one
//! sender thread offers 0.15–0.4 M datagrams/s and the contender's core idles part of
//! the time, waking for every one or two datagrams. Here the sender never races the
//! contender. Per run:
//!
//! 1. The contender starts fresh on the shard core: `bench floor-server` (recvmmsg
//!    and discard), `bench baseline-server` (one recvmsg and one send per datagram),
//!    or the release demux with one shard (`--io uring --fast-path off --forward
//!    seqpacket|ring`) and two sink workers on the load core.
//! 2. Its UDP socket's receive queue is raised to `--queue` bytes from outside: the
//!    bench takes a duplicate of the contender's own socket (pidfd_getfd) and sets
//!    SO_RCVBUFFORCE on it (root), so the contender itself runs unchanged.
//! 3. The contender is stopped (SIGSTOP: it cannot run), and the sender queues
//!    `--datagrams` datagrams (64 flows, sendmmsg of 8), stopping early at
//!    `FILL_LIMIT` of the queue (/proc/net/udp shows its bytes and drops). It runs
//!    on the shard core by default (`--fill-core shard`): each skb is then allocated
//!    on the core that frees it, as when the NIC queue feeding a shard interrupts
//!    that shard's core. From the load core (`--fill-core load`) the kernel frees
//!    every skb across cores (skb_attempt_defer_free), with an IPI per few dozen of
//!    them; that cost exists only because loopback allocates on the sender's core.
//! 4. SIGCONT: the contender drains the queue at its own pace. The bench polls what
//!    has reached the far end (the floor: its receive counter; otherwise what the
//!    sinks took) every `DRAIN_POLL` until it has not moved for `QUIET` and the queue
//!    is empty.
//!
//! CPU: on-CPU time (schedstat) of all the contender's threads from the stop to the
//! end (a stopped process runs nothing), split into user and system time by
//! /proc/<pid>/stat. Wall: SIGCONT to the last change of the far end's count. So
//! CPU µs per datagram is its CPU over the datagrams it handled, and datagrams/s per
//! core is the inverse.

use crate::all::contenders::{
    start_demux_run, start_demux_run_counting, start_retry_floor, start_server, Cores, Running,
};
use crate::all::prioritize;
use crate::cli::{FillCore, SaturationArgs};
use crate::dataplane::{demux_bin, stat_user_system_s, DATAGRAM};
use crate::load::{flow_sockets, initials, send_messages_until, send_until, FLOWS, MSGS_PER_CALL};
use crate::report::{
    command_output, fixed, loadavg, loadavg_now, median, median_interval, mode_name, replace_block, thousands,
    MedianInterval,
};
use crate::sys::{
    all_threads_stopped, cpu_model, dev_counter, dup_from_process, schedstat_ns, socket_fd_of, udp_queue_of,
    udp_rcvbuf_errors, wait_quiet, Schedstat,
};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The sender stops when the queue holds this share of `--queue` bytes.
const FILL_LIMIT: f64 = 0.9;
/// Datagrams between two looks at the queue while filling it.
const FILL_CHECK_EVERY: u64 = 1024;
/// The longest a fill may take.
const FILL_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the drain's progress is read.
const DRAIN_POLL: Duration = Duration::from_millis(1);
/// The drain is over when nothing reached the far end for this long and the queue is empty.
const QUIET: Duration = Duration::from_millis(200);
/// The longest a drain may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest the bench waits for the machine to be quiet before a run.
const QUIET_LIMIT: Duration = Duration::from_secs(3);
/// How long SIGSTOP may take to stop every thread.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Markers of the generated block in the doc.
const BEGIN: &str = "<!-- bench saturation: begin";
const END: &str = "<!-- bench saturation: end -->";

// The issue's targets at saturation, for the demux with ring forwarding.
/// CPU µs per uncoalesced datagram, at most.
const TARGET_US_UNCOALESCED: f64 = 0.6;
/// The demux's CPU per uncoalesced datagram over the floor's, at most.
const TARGET_X_FLOOR: f64 = 1.5;
/// Retries one core mints per second, at least (as CPU µs per Retry: at most 4).
const TARGET_RETRIES_PER_CORE_S: f64 = 250_000.0;
/// Distinct Initials (DCIDs) the retry contender's sender cycles through.
const RETRY_INITIALS: usize = 4096;
/// Distinct spoofed client addresses of the retry contender's flood (each Retry goes
/// to a different address than the one before, as under a flood from random sources).
const RETRY_SOURCES: usize = 60_000;
/// SO_RCVBUF of the retry contender's flow sockets (the kernel doubles it).
const RETRY_SINK_RCVBUF: usize = 4096;
/// CPU µs per datagram in GRO trains, at most.
const TARGET_US_TRAINS: f64 = 0.15;

/// The demux flags of a demux contender; None for the floor and the baseline.
fn demux_flags(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        "seqpacket" => Some(&["--io", "uring", "--fast-path", "off", "--forward", "seqpacket"]),
        "ring" => Some(&["--io", "uring", "--fast-path", "off", "--forward", "ring"]),
        "retry" | "retry-loopback" => {
            Some(&["--io", "uring", "--fast-path", "off", "--forward", "ring", "--retry", "always"])
        }
        _ => None,
    }
}

/// Whether `kind` runs in this mode: the retry contenders' Initials are never trains.
fn runs_in(kind: &str, train: usize) -> bool {
    !is_retry(kind) || train == 1
}

fn is_retry(kind: &str) -> bool {
    kind.starts_with("retry")
}

/// The retry contender's network namespace (`ip netns`, removed on drop): `lo` holds
/// the demux's address [`EGRESS_DEMUX`], and the flood's sources (198.18.0.0/16) are
/// routed through a gateway on an ifb device, which drops what it is given (no tc
/// redirect brought it: counted as its rx_dropped). So a Retry's send costs what it
/// costs towards a NIC — route, IP output, the gateway's neighbour entry, a qdisc
/// (pfifo_fast), the device's transmit — and not the receiving side of a loopback
/// delivery as well. (This kernel has no dummy driver.)
struct EgressNetns(String);

/// The retry contender's listen address inside its namespace (RFC 2544's 198.18.0.0/15).
const EGRESS_DEMUX: &str = "198.19.0.1";
/// The gateway the flood's sources are routed through.
const EGRESS_GATEWAY: &str = "198.19.0.2";
/// The ifb device the Retries leave through, and its drop counter in /proc/net/dev
/// (the rx `drop` field: ifb counts a packet it drops on transmit there).
const EGRESS_DEV: &str = "qdx-egress";
const EGRESS_DROPS_FIELD: usize = 3;

impl EgressNetns {
    fn build() -> Result<EgressNetns> {
        let ns = EgressNetns(format!("qds-{}", std::process::id()));
        let ip = |args: &[&str]| -> Result<()> {
            let out = std::process::Command::new("ip").args(args).output().context("ip")?;
            if !out.status.success() {
                bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            Ok(())
        };
        let _ = std::process::Command::new("ip").args(["netns", "del", &ns.0]).output();
        ip(&["netns", "add", &ns.0])?;
        let demux = format!("{EGRESS_DEMUX}/32");
        ip(&["-n", &ns.0, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns.0, "addr", "add", &demux, "dev", "lo"])?;
        ip(&["-n", &ns.0, "link", "add", EGRESS_DEV, "type", "ifb"])?;
        ip(&["-n", &ns.0, "link", "set", EGRESS_DEV, "up"])?;
        // A gateway, as a host's default route has: one neighbour entry for every
        // client (an on-link /16 would make one per client address).
        ip(&["-n", &ns.0, "route", "add", &format!("{EGRESS_GATEWAY}/32"), "dev", EGRESS_DEV])?;
        ip(&["-n", &ns.0, "route", "add", "198.18.0.0/16", "via", EGRESS_GATEWAY, "dev", EGRESS_DEV])?;
        Ok(ns)
    }

    /// Runs `f` with the calling thread in this namespace (sockets made there stay there).
    fn within<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        use std::os::fd::AsRawFd;
        let home = std::fs::File::open("/proc/thread-self/ns/net").context("own netns")?;
        let there = std::fs::File::open(format!("/var/run/netns/{}", self.0)).context("netns")?;
        // SAFETY: setns(2) on namespace fds we opened; it moves only this thread.
        if unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns {}: {}", self.0, std::io::Error::last_os_error());
        }
        let r = f();
        // SAFETY: as above, back to where the thread was.
        if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns back: {}", std::io::Error::last_os_error());
        }
        r
    }
}

impl Drop for EgressNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// An unconnected IP_TRANSPARENT socket in `ns`: with IP_PKTINFO, each message leaves
/// from any source address (the flood's spoofed clients, [`spoofed_source`]).
fn spoofed_socket(ns: &EgressNetns) -> Result<std::net::UdpSocket> {
    ns.within(|| {
        use std::os::fd::FromRawFd;
        // SAFETY: socket(2); the descriptor is owned by the UdpSocket right away.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let s = unsafe { std::net::UdpSocket::from_raw_fd(fd) };
        ::sys::sockopt::setsockopt_int(fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1)
            .context("IP_TRANSPARENT (needs CAP_NET_ADMIN)")?;
        Ok(s)
    })
}

/// Client `i` of the spoofed flood: 198.18.(i / 250).(i % 250 + 1), for i below
/// [`RETRY_SOURCES`] (inside 198.18.0.0/16, which the namespace routes to its ifb).
fn spoofed_source(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(198, 18, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// The length of the demux's Retry to the flood's Initials (its SCIDs are
/// [`proto::CID_LEN`] bytes): what `retry-floor` sends back.
fn retry_len() -> Result<usize> {
    let initial = initials(1)?.pop().context("an Initial")?;
    let client = std::net::SocketAddr::from((spoofed_source(0), 4433));
    let mut out = [0u8; proto::retry::MAX_RETRY];
    proto::retry::RetryMinter::new(&[1; 32])
        .mint(&initial, client, &[0; proto::CID_LEN], 0, [0; proto::token::NONCE_LEN], &mut out)
        .map_err(|e| anyhow::anyhow!("the flood's Initial is not retryable: {e:?}"))
}

/// The Retries a demux sent (its status).
fn retries_sent(s: &Value) -> u64 {
    crate::dataplane::g(s, "/retry/sent")
}

/// One run's figures.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) kind: String,
    pub(crate) train: usize,
    pub(crate) rep: usize,
    /// Datagrams the sender queued (sendmmsg accepted them).
    pub(crate) sent: u64,
    /// The queue's bytes when the contender was continued.
    pub(crate) queued_bytes: u64,
    /// Drops the socket counted while filling (a full queue).
    pub(crate) fill_drops: u64,
    /// Datagrams the contender received and handled (forwarded; the floor: received).
    pub(crate) received: u64,
    pub(crate) handled: u64,
    pub(crate) cpu_s: f64,
    pub(crate) user_s: f64,
    pub(crate) system_s: f64,
    /// Runnable but waiting for a CPU (the machine's other load).
    pub(crate) waited_s: f64,
    pub(crate) wall_s: f64,
    /// The demux's receive batches (shard loop rounds) over the drain; None for the others.
    pub(crate) batches: Option<u64>,
    /// The demux's eventfd writes to sleeping ring consumers over the drain.
    pub(crate) ring_wakes: Option<u64>,
}

impl Run {
    pub(crate) fn us(&self) -> f64 {
        self.cpu_s * 1e6 / self.handled as f64
    }
    /// Datagrams per second of one core's CPU time.
    pub(crate) fn per_core(&self) -> f64 {
        self.handled as f64 / self.cpu_s
    }
    pub(crate) fn wall_rate(&self) -> f64 {
        self.handled as f64 / self.wall_s
    }
    /// User time's share of the contender's CPU time (the rest: system calls, and the
    /// softirq work of its sends).
    /// Datagrams received per batch of the demux's shard (NaN for the others).
    pub(crate) fn per_batch(&self) -> f64 {
        self.batches.map_or(f64::NAN, |b| self.received as f64 / b as f64)
    }
    /// Eventfd wake-ups of ring consumers per batch of the demux's shard (NaN for the others).
    pub(crate) fn wakes_per_batch(&self) -> f64 {
        self.batches.zip(self.ring_wakes).map_or(f64::NAN, |(b, w)| w as f64 / b.max(1) as f64)
    }
    pub(crate) fn user_share(&self) -> f64 {
        self.user_s / (self.user_s + self.system_s)
    }
    fn json(&self) -> Value {
        json!({
            "contender": self.kind, "train": self.train, "round": self.rep + 1, "sent": self.sent,
            "queued_bytes": self.queued_bytes, "fill_drops": self.fill_drops, "received": self.received,
            "handled": self.handled, "cpu_s": self.cpu_s, "user_s": self.user_s, "system_s": self.system_s,
            "waited_s": self.waited_s, "wall_s": self.wall_s, "us_per_datagram": self.us(), "batches": self.batches,
            "ring_wakes": self.ring_wakes,
        })
    }
}

/// The receive queue (SO_RCVBUF) of `fd`, in bytes.
fn recv_buffer(fd: &OwnedFd) -> Result<u64> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one c_int into `v`; `len` holds its size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        bail!("getsockopt SO_RCVBUF: {}", std::io::Error::last_os_error());
    }
    Ok(v as u64)
}

/// Gives the contender's socket on `port` a receive queue of `bytes` (the kernel
/// doubles what SO_RCVBUFFORCE asks for) through a duplicate of its own descriptor.
fn raise_queue(pid: u32, port: u16, bytes: u64) -> Result<()> {
    let q = udp_queue_of(pid, port).with_context(|| format!("no UDP socket on port {port} in /proc/{pid}/net/udp"))?;
    let fd = socket_fd_of(pid, q.inode).with_context(|| format!("pid {pid} holds no socket:[{}]", q.inode))?;
    let sock = dup_from_process(pid, fd)?;
    ::sys::sockopt::set_recv_buffer(&sock, (bytes / 2) as usize);
    let got = recv_buffer(&sock)?;
    if got < bytes {
        bail!("the receive queue is {got} bytes, not {bytes}: SO_RCVBUFFORCE needs CAP_NET_ADMIN (run as root)");
    }
    Ok(())
}

pub(crate) fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    // SAFETY: a signal to our own child.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// SIGSTOP, and wait until every thread of `pid` has stopped.
fn stop(pid: u32) -> Result<()> {
    signal(pid, libc::SIGSTOP)?;
    let deadline = Instant::now() + STOP_TIMEOUT;
    while !all_threads_stopped(pid) {
        if Instant::now() > deadline {
            bail!("pid {pid} did not stop");
        }
        std::thread::sleep(DRAIN_POLL);
    }
    Ok(())
}

/// Continues the contender on drop, so an error never leaves it stopped.
struct Stopped(u32);
impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = signal(self.0, libc::SIGCONT);
    }
}

/// `BENCH_DEMUX_FLAGS`: extra flags for every demux contender, space-separated (an
/// experiment's knob, e.g. `--uring-buffers 256`; the report's conditions name them).
fn extra_demux_flags() -> Vec<String> {
    std::env::var("BENCH_DEMUX_FLAGS").unwrap_or_default().split_whitespace().map(String::from).collect()
}

fn start(kind: &str, train: usize, o: &SaturationArgs, bins: &Path, dir: &Path) -> Result<Running> {
    let cores = Cores { shard: o.rounds.shard_core, load: o.rounds.load_core };
    let extra = extra_demux_flags();
    let flags: Option<Vec<&str>> =
        demux_flags(kind).map(|f| f.iter().copied().chain(extra.iter().map(String::as_str)).collect());
    let flags = flags.as_deref();
    match flags {
        Some(flags) if kind == "retry-loopback" => {
            // Handled: Retries sent; what reached the far end: the Retries dropped at
            // the sender's full sockets (run_one).
            let mut r = start_demux_run_counting(&format!("sat-{kind}"), flags, cores, bins, None, retries_sent)?;
            r.progress = Box::new(|| udp_rcvbuf_errors().unwrap_or(0));
            Ok(r)
        }
        Some(flags) if kind == "retry" => {
            // In a namespace of its own; what reached the far end: the Retries the ifb
            // device dropped.
            let ns = EgressNetns::build()?;
            let at = Some((format!("{EGRESS_DEMUX}:0"), ns.0.clone()));
            let at = at.as_ref().map(|(l, n)| (l.as_str(), n.as_str()));
            let mut r = start_demux_run_counting(&format!("sat-{kind}"), flags, cores, bins, at, retries_sent)?;
            let pid = r.pid;
            r.progress = Box::new(move || dev_counter(pid, EGRESS_DEV, EGRESS_DROPS_FIELD).unwrap_or(0));
            r._hold.push(Box::new(ns));
            Ok(r)
        }
        Some(flags) => start_demux_run(&format!("sat-{kind}"), flags, cores, bins),
        None if kind == "retry-floor" => {
            // The retry contender's namespace and flood, answered by the kernel alone.
            let ns = EgressNetns::build()?;
            let mut r = start_retry_floor(cores.shard, dir, &format!("{EGRESS_DEMUX}:0"), &ns.0, retry_len()?)?;
            let pid = r.pid;
            r.progress = Box::new(move || dev_counter(pid, EGRESS_DEV, EGRESS_DROPS_FIELD).unwrap_or(0));
            r._hold.push(Box::new(ns));
            Ok(r)
        }
        None => start_server(kind, cores, dir, train),
    }
}

/// `progress()` once two reads 50 ms apart agree (at most 2 s of reads).
fn settled(progress: &dyn Fn() -> u64) -> u64 {
    let mut last = progress();
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        let now = progress();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The core the sender fills from (`--fill-core`). The contender is stopped
/// meanwhile, so the shard core is free.
fn fill_core(o: &SaturationArgs) -> usize {
    match o.fill_core {
        FillCore::Shard => o.rounds.shard_core,
        FillCore::Load => o.rounds.load_core,
    }
}

fn run_one(kind: &str, train: usize, rep: usize, o: &SaturationArgs, bins: &Path, tmp: &Path) -> Result<Run> {
    let dir = tmp.join(format!("{kind}-{train}-{rep}"));
    std::fs::create_dir_all(&dir)?;
    let _dg = crate::all::contenders::DirGuard(dir.clone());
    let r = start(kind, train, o, bins, &dir)?;
    let (pid, port) = (r.pid, r.addr.port());
    raise_queue(pid, port, o.queue)?;
    // Counters first: a stopped demux answers no status request.
    let batches = |r: &Running| r.batches.as_ref().map(|b| b()).transpose();
    let (c0, b0) = ((r.counts)()?, batches(&r)?);
    stop(r.pid)?;
    let stopped = Stopped(r.pid);
    // What the contender sent just before it stopped (a start-up probe's answer) may
    // still be on its way through loopback: progress is read once it holds still.
    let p0 = settled(&*r.progress);
    // `BENCH_PERF`: attached while the contender is stopped, so it sees the whole drain.
    let perf = crate::sys::Perf::start(r.pid, &format!("saturation-{kind}-{train}-{rep}"))?;
    let (cpu0, wait0, (user0, sys0)) =
        (schedstat_ns(r.pid, Schedstat::OnCpu), schedstat_ns(r.pid, Schedstat::Waiting), stat_user_system_s(r.pid));
    let q0 = udp_queue_of(pid, port).context("the socket left /proc/net/udp")?;
    let limit = (o.queue as f64 * FILL_LIMIT) as u64;
    let (target, mut next_check) = (o.datagrams, FILL_CHECK_EVERY);
    let more = move |sent, elapsed| {
        if sent >= target || elapsed > FILL_TIMEOUT {
            return false;
        }
        if sent >= next_check {
            next_check = sent + FILL_CHECK_EVERY;
            return udp_queue_of(pid, port).is_some_and(|q| q.rx_queue < limit);
        }
        true
    };
    // `retry`: Initials from RETRY_SOURCES spoofed clients, one socket; their Retries
    // leave through the namespace's ifb. `retry-loopback`: the Retries come back to
    // the flow sockets, which stay open (until the run ends) with a small receive
    // queue nobody reads, so each ends in the kernel's UDP receive as a counted drop
    // (RcvbufErrors); a closed port would cost an ICMP unreachable per Retry, which
    // Linux does not rate-limit on loopback.
    let retry_socks = match kind {
        "retry-floor" => {
            let ns = r._hold.iter().find_map(|h| h.downcast_ref::<EgressNetns>()).context("the egress namespace")?;
            vec![spoofed_socket(ns)?]
        }
        "retry-loopback" => {
            let socks = flow_sockets(r.addr, 1)?;
            for s in &socks {
                sys::sockopt::set_recv_buffer(s.as_fd(), RETRY_SINK_RCVBUF);
            }
            socks
        }
        "retry" => {
            let ns = r._hold.iter().find_map(|h| h.downcast_ref::<EgressNetns>()).context("the egress namespace")?;
            vec![spoofed_socket(ns)?]
        }
        _ => Vec::new(),
    };
    let load = if is_retry(kind) {
        let initials = initials(RETRY_INITIALS)?;
        let spoofed = kind == "retry" || kind == "retry-floor";
        let pick = |call: usize, j: usize| {
            let i = call * MSGS_PER_CALL + j;
            (&initials[i % initials.len()][..], spoofed.then(|| spoofed_source(i % RETRY_SOURCES)))
        };
        let to = spoofed.then_some(r.addr);
        send_messages_until(&retry_socks, to, 0.0, fill_core(o), None, pick, more)?
    } else {
        send_until(r.addr, &r.ks, &r.ids, train, 0.0, fill_core(o), None, more)?
    };
    let q1 = udp_queue_of(pid, port).context("the socket left /proc/net/udp")?;
    if (r.progress)() != p0 {
        bail!("{kind} handled datagrams while stopped");
    }
    let t0 = Instant::now();
    drop(stopped); // SIGCONT
    let (mut last, mut t_last) = (p0, t0);
    loop {
        std::thread::sleep(DRAIN_POLL);
        let (p, now) = ((r.progress)(), Instant::now());
        if p != last {
            (last, t_last) = (p, now);
        } else if now - t_last >= QUIET && udp_queue_of(pid, port).is_some_and(|q| q.rx_queue == 0) {
            break;
        }
        if now - t0 > DRAIN_TIMEOUT {
            bail!("{kind} did not drain its queue within {DRAIN_TIMEOUT:?}");
        }
    }
    let (cpu1, wait1, (user1, sys1)) =
        (schedstat_ns(r.pid, Schedstat::OnCpu), schedstat_ns(r.pid, Schedstat::Waiting), stat_user_system_s(r.pid));
    if let Some(p) = perf {
        p.stop();
    }
    let (c1, b1) = ((r.counts)()?, batches(&r)?);
    let handled = c1.1 - c0.1;
    if handled == 0 || cpu1 <= cpu0 {
        bail!("{kind} handled {handled} datagrams in {} ns of CPU", cpu1.saturating_sub(cpu0));
    }
    Ok(Run {
        kind: kind.to_string(),
        train,
        rep,
        sent: load.sent,
        queued_bytes: q1.rx_queue,
        fill_drops: q1.drops - q0.drops,
        received: c1.0 - c0.0,
        handled,
        cpu_s: (cpu1 - cpu0) as f64 / 1e9,
        user_s: user1 - user0,
        system_s: sys1 - sys0,
        waited_s: wait1.saturating_sub(wait0) as f64 / 1e9,
        wall_s: (t_last - t0).as_secs_f64(),
        batches: b0.zip(b1).map(|(b0, b1)| b1.batches - b0.batches),
        ring_wakes: b0.zip(b1).map(|(b0, b1)| b1.ring_wakes - b0.ring_wakes),
    })
}

/// Medians over the rounds of one contender in one mode.
#[derive(Clone, Debug)]
pub(crate) struct Sum {
    pub(crate) kind: String,
    pub(crate) train: usize,
    pub(crate) received: f64,
    pub(crate) handled_share: f64,
    pub(crate) us: f64,
    pub(crate) us_min: f64,
    pub(crate) us_max: f64,
    pub(crate) per_core: f64,
    pub(crate) wall_rate: f64,
    pub(crate) busy: f64,
    pub(crate) user_share: f64,
    pub(crate) waited_share: f64,
    pub(crate) per_batch: f64,
    pub(crate) wakes_per_batch: f64,
    /// CPU per datagram over the floor's and the baseline's in the same round and
    /// mode, the median over the rounds.
    pub(crate) x_floor: f64,
    pub(crate) x_baseline: f64,
    /// The 95 % intervals of the medians `us` and `x_floor` (crate::report::median_interval).
    pub(crate) us_interval: Option<MedianInterval>,
    pub(crate) x_floor_interval: Option<MedianInterval>,
}

/// The confidence the targets' intervals ask for.
const TARGET_LEVEL: f64 = 0.95;

pub(crate) fn summarize(runs: &[Run], kinds: &[String], trains: &[usize]) -> Vec<Sum> {
    let mut out = Vec::new();
    for &train in trains {
        for k in kinds {
            let mine: Vec<&Run> = runs.iter().filter(|r| &r.kind == k && r.train == train).collect();
            if mine.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Run) -> f64| median(mine.iter().map(|r| f(r)).collect());
            let ratios_to = |other: &str| -> Vec<f64> {
                mine.iter()
                    .filter_map(|r| {
                        runs.iter()
                            .find(|x| x.kind == other && x.train == train && x.rep == r.rep)
                            .map(|x| r.us() / x.us())
                    })
                    .collect()
            };
            let ratio_to = |other: &str| median(ratios_to(other));
            let us: Vec<f64> = mine.iter().map(|r| r.us()).collect();
            out.push(Sum {
                kind: k.clone(),
                train,
                received: m(&|r| r.received as f64),
                handled_share: m(&|r| r.handled as f64 / r.received.max(1) as f64),
                us: median(us.clone()),
                us_min: us.iter().copied().fold(f64::INFINITY, f64::min),
                us_max: us.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                per_core: m(&|r| r.per_core()),
                wall_rate: m(&|r| r.wall_rate()),
                busy: m(&|r| r.cpu_s / r.wall_s),
                user_share: m(&|r| r.user_share()),
                waited_share: m(&|r| r.waited_s / r.wall_s),
                per_batch: m(&|r| r.per_batch()),
                wakes_per_batch: m(&|r| r.wakes_per_batch()),
                x_floor: ratio_to(floor_of(k)),
                x_baseline: ratio_to("baseline"),
                us_interval: median_interval(us.clone(), TARGET_LEVEL),
                x_floor_interval: median_interval(ratios_to(floor_of(k)), TARGET_LEVEL),
            });
        }
    }
    out
}

/// The floor a contender's CPU is compared with: the kernel's own work for the same
/// job. `retry` (the demux answering the flood): `retry-floor`, the kernel receiving
/// the same flood and sending a Retry-sized reply each; everything else: `floor`.
fn floor_of(kind: &str) -> &'static str {
    if kind == "retry" {
        "retry-floor"
    } else {
        "floor"
    }
}

/// The contenders with a ratio target and the floor that ratio is taken against:
/// they run back to back in every round, so that both meet the same state of the
/// machine (this VM's speed drifts by up to 40 % within a minute).
const PAIRS: [(&str, &str); 2] = [("floor", "ring"), ("retry-floor", "retry")];

/// Round `rep`'s order: the contenders rotated by one place per round, each pair of
/// [`PAIRS`] (when both run) kept together as one place, its order swapped every
/// other round.
fn round_order(contenders: &[String], rep: usize) -> Vec<String> {
    let has = |k: &str| contenders.iter().any(|c| c == k);
    let mut places: Vec<Vec<String>> = Vec::new();
    for k in contenders {
        match PAIRS.iter().find(|(f, c)| (k == f || k == c) && has(f) && has(c)) {
            Some((f, c)) if k == f => places.push(vec![f.to_string(), c.to_string()]),
            Some(_) => {} // the pair's second member: placed with its first
            None => places.push(vec![k.clone()]),
        }
    }
    let n = places.len().max(1);
    let mut out = Vec::with_capacity(contenders.len());
    for i in 0..places.len() {
        let mut place = places[(i + rep) % n].clone();
        if rep % 2 == 1 {
            place.reverse();
        }
        out.extend(place);
    }
    out
}

/// One target (docs/benchmarks.md) against a median.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) measured: f64,
    pub(crate) limit: f64,
    /// The median's interval over the rounds (none with one round).
    pub(crate) interval: Option<MedianInterval>,
    /// What the contender's CPU went to (user/system split).
    pub(crate) split: String,
}

/// A target against its median and that median's interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The whole interval is within the limit (one round: the median is).
    Met,
    /// The whole interval is over the limit.
    Missed,
    /// The interval holds the limit: these rounds cannot tell.
    Undecided,
}

impl Target {
    pub(crate) fn verdict(&self) -> Verdict {
        match self.interval {
            Some(i) if i.hi <= self.limit => Verdict::Met,
            Some(i) if i.lo > self.limit => Verdict::Missed,
            Some(_) => Verdict::Undecided,
            None if self.measured <= self.limit => Verdict::Met,
            None => Verdict::Missed,
        }
    }

    /// The report's verdict cell.
    fn verdict_text(&self) -> String {
        match (self.verdict(), self.interval) {
            (Verdict::Met, _) => "**met**".to_string(),
            (Verdict::Missed, _) => format!("**missed** ({:.2}× the limit)", self.measured / self.limit),
            (Verdict::Undecided, Some(i)) => format!(
                "**undecided**: the median's {:.0} % interval, {}–{}, holds the limit (more rounds narrow it)",
                i.coverage * 100.0,
                fixed(i.lo, 3),
                fixed(i.hi, 3)
            ),
            (Verdict::Undecided, None) => "**undecided**".to_string(),
        }
    }
}

/// The targets, for the ring contender, and the same limits for SEQPACKET (for
/// comparison): uncoalesced ≤ 0.6 µs and ≤ 1.5× the floor, trains ≤ 0.15 µs.
pub(crate) fn targets(sums: &[Sum]) -> Vec<Target> {
    let mut t = Vec::new();
    for kind in ["ring", "seqpacket"] {
        for s in sums.iter().filter(|s| s.kind == kind) {
            let what = |w: &str| {
                let cmp = if kind == "seqpacket" { " (SEQPACKET, for comparison)" } else { "" };
                format!("{kind}, {}: {w}{cmp}", mode_name(s.train))
            };
            let split = format!("user {:.0} %, system {:.0} %", s.user_share * 100.0, (1.0 - s.user_share) * 100.0);
            if s.train == 1 {
                t.push(Target {
                    what: what("CPU µs / datagram"),
                    measured: s.us,
                    limit: TARGET_US_UNCOALESCED,
                    interval: s.us_interval,
                    split: split.clone(),
                });
                t.push(Target {
                    what: what("× floor"),
                    measured: s.x_floor,
                    limit: TARGET_X_FLOOR,
                    interval: s.x_floor_interval,
                    split,
                });
            } else {
                t.push(Target {
                    what: what("CPU µs / datagram"),
                    measured: s.us,
                    limit: TARGET_US_TRAINS,
                    interval: s.us_interval,
                    split,
                });
            }
        }
    }
    let retry_floor = sums.iter().find(|s| s.kind == "retry-floor");
    for s in sums.iter().filter(|s| is_retry(&s.kind) && s.kind != "retry-floor") {
        let mut split = format!("user {:.0} %, system {:.0} %", s.user_share * 100.0, (1.0 - s.user_share) * 100.0);
        if let Some(f) = retry_floor.filter(|_| s.kind == "retry") {
            let _ = write!(split, "; the kernel alone (retry-floor): {:.3} µs, this {:.2}× that", f.us, s.x_floor);
        }
        t.push(Target {
            what: format!(
                "{}, uncoalesced: CPU µs / Retry (≥ {} Retries/s per core)",
                s.kind,
                thousands(TARGET_RETRIES_PER_CORE_S)
            ),
            measured: s.us,
            limit: 1e6 / TARGET_RETRIES_PER_CORE_S,
            interval: s.us_interval,
            split,
        });
    }
    t
}

/// The machine and the run, for the report's conditions line.
struct Conditions {
    uptime_start: String,
    uptime_end: String,
    load_start: String,
    secs: f64,
}

fn report(runs: &[Run], sums: &[Sum], o: &SaturationArgs, c: &Conditions) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{BEGIN} (generated by `cargo run --release -p bench -- saturation --doc docs/benchmarks.md`; edits inside are overwritten) -->"
    );
    let _ = writeln!(s, "#### Run finished {}\n", command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]));
    let _ = writeln!(
        s,
        "Conditions: Linux {}, {} ({} CPUs), {}; **shared machine**: load average at start {} (at end {}; `uptime` before: `{}`, after: `{}`); \
         {} round(s) per contender and mode, contenders in rotating order with floor and ring, and retry-floor and retry, back to back (their order swapped every other round); the contender on core {}, the sinks on core {}, the sender ({} flows, sendmmsg of 8) on core {} ({}); \
         up to {} {}-byte short-header datagrams queued per run into a receive queue of {} bytes (SO_RCVBUFFORCE on the contender's own socket) while the contender is stopped; \
         demux: one shard, `--io uring --fast-path off --forward seqpacket|ring` (retry: `--forward ring --retry always`){}, two sink workers; \
         the retry contenders get token-less v1 Initials ({} DCIDs): `retry` and `retry-floor` from {} spoofed sources (one IP_TRANSPARENT socket, IP_PKTINFO) in a network namespace of its own whose Retries leave via a gateway through an ifb device (dropped there, like a NIC's transmit), `retry-loopback` from the 64 flows, its Retries back over loopback to them (unread, dropped at their full queues); the bench and all it starts at nice {} in an autogroup of its own. \
         Whole run: {:.0} s. Figures are medians over the rounds; ratios are taken within each round, then the median.\n",
        command_output("uname", &["-r"]),
        cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        command_output("rustc", &["--version"]),
        loadavg(&c.load_start),
        loadavg_now(),
        c.uptime_start,
        c.uptime_end,
        o.rounds.reps,
        o.rounds.shard_core,
        o.rounds.load_core,
        FLOWS,
        fill_core(o),
        match o.fill_core {
            FillCore::Shard => "`--fill-core shard`: every skb is allocated on the core that drains it, as with a NIC queue steered to the shard's core",
            FillCore::Load => "`--fill-core load`: the drain also frees skbs allocated on the other core, with the kernel's deferred-free IPIs",
        },
        thousands(o.datagrams as f64),
        DATAGRAM,
        thousands(o.queue as f64),
        match extra_demux_flags() {
            f if f.is_empty() => String::new(),
            f => format!(" plus `{}` (BENCH_DEMUX_FLAGS)", f.join(" ")),
        },
        thousands(RETRY_INITIALS as f64),
        thousands(RETRY_SOURCES as f64),
        o.rounds.nice,
        c.secs,
    );
    let _ = writeln!(s, "| contender | datagrams | queued (median) | handled | **CPU µs / datagram** (min–max) | **datagrams/s per core** | drain datagrams/s (wall) | core busy while draining | × floor | × baseline | user / system | waited for a CPU | datagrams / shard batch | eventfd wakes / batch |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for m in sums {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} % | **{}** ({}–{}) | **{}** | {} | {:.0} % | {} | {} | {:.0} / {:.0} % | {:.1} % | {} | {} |",
            m.kind,
            mode_name(m.train),
            thousands(m.received),
            m.handled_share * 100.0,
            fixed(m.us, 3),
            fixed(m.us_min, 3),
            fixed(m.us_max, 3),
            thousands(m.per_core),
            thousands(m.wall_rate),
            m.busy * 100.0,
            fixed(m.x_floor, 2),
            fixed(m.x_baseline, 2),
            m.user_share * 100.0,
            (1.0 - m.user_share) * 100.0,
            m.waited_share * 100.0,
            fixed(m.per_batch, 1),
            fixed(m.wakes_per_batch, 2),
        );
    }
    let _ = writeln!(
        s,
        "\n\"CPU µs / datagram\": the contender's CPU time (schedstat, all threads) from its stop to the end of the drain over the datagrams it handled \
         (forwarded to a worker; the floor: received; retry: Retries sent; retry-floor: replies sent). \"× floor\": over the floor's CPU per datagram in the same round, \
         the median over the rounds; for `retry`, over `retry-floor`'s (the kernel's share of a Retry: the same flood received and a Retry-sized reply sent to each source, \
         with no parsing or cryptography). \"datagrams/s per core\": handled / CPU seconds. \"drain datagrams/s (wall)\": handled / (SIGCONT → \
         the last datagram at the far end). \"user / system\": /proc/<pid>/stat, in clock ticks. \"waited for a CPU\": schedstat run-queue wait over the drain's wall time. \
         \"datagrams / shard batch\": the demux's received datagrams over its `batches` counter (rounds of its loop: receive, route, forward, \
         and with rings one eventfd write per sleeping worker). \"eventfd wakes / batch\": its `ring_wakes` counter over `batches`: \
         how often a round found a worker asleep on its ring and wrote the worker's eventfd.\n"
    );
    let _ = writeln!(
        s,
        "Targets (docs/benchmarks.md), from the medians above. A target is met when the whole interval of its median is within \
         the limit, missed when the whole interval is over it, and undecided otherwise (the interval: the sign test's, \
         x(k) … x(n+1−k) of the n rounds with the largest k for 95 %, or the least and the greatest round when there are \
         too few rounds for 95 %):\n"
    );
    let _ = writeln!(s, "| target | measured (median) | its interval | limit | | CPU split |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for t in targets(sums) {
        let interval = match t.interval {
            Some(i) => format!("{}–{} ({:.0} %)", fixed(i.lo, 3), fixed(i.hi, 3), i.coverage * 100.0),
            None => "– (one round)".to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | ≤ {} | {} | {} |",
            t.what,
            fixed(t.measured, 3),
            interval,
            t.limit,
            t.verdict_text(),
            t.split
        );
    }
    let _ = writeln!(s, "\n<details><summary>Every run</summary>\n");
    let _ = writeln!(s, "| round | contender | datagrams | sent | queued bytes | fill drops | received | handled | CPU s | user s | system s | waited s | drain s | CPU µs / datagram | datagrams / batch |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {} |",
            r.rep + 1,
            r.kind,
            mode_name(r.train),
            r.sent,
            r.queued_bytes,
            r.fill_drops,
            r.received,
            r.handled,
            r.cpu_s,
            r.user_s,
            r.system_s,
            r.waited_s,
            r.wall_s,
            r.us(),
            fixed(r.per_batch(), 1)
        );
    }
    let _ = writeln!(s, "\n</details>\n\n{END}");
    s
}

pub fn main(o: SaturationArgs) -> Result<()> {
    let uptime_start = command_output("uptime", &[]);
    if o.rounds.nice != 0 {
        prioritize(o.rounds.nice);
    }
    run(&o, uptime_start).map(|_| ())
}

/// Every round, then the report (printed, and written into `o.doc` when given) and
/// `o.json`; `uptime_start` is `uptime` before anything started. Returns the report.
pub(crate) fn run(o: &SaturationArgs, uptime_start: String) -> Result<String> {
    let t0 = Instant::now();
    let load_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let bins: PathBuf = if o.contenders.iter().any(|k| demux_flags(k).is_some()) {
        demux_bin()?.parent().context("demux dir")?.to_path_buf()
    } else {
        std::env::current_exe()?.parent().context("exe dir")?.to_path_buf()
    };
    let tmp = std::env::temp_dir().join(format!("qdbench-sat-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let _tg = crate::all::contenders::DirGuard(tmp.clone());
    let mut runs = Vec::new();
    for rep in 0..o.rounds.reps {
        for &train in &o.trains {
            for k in &round_order(&o.contenders, rep) {
                if !runs_in(k, train) {
                    continue;
                }
                // What the last run left behind (its processes' exit, a namespace's
                // cleanup) finishes before this one starts.
                if !wait_quiet(QUIET_LIMIT) {
                    eprintln!("saturation: the machine did not get quiet within {QUIET_LIMIT:?}; running anyway");
                }
                let r = run_one(k, train, rep, o, &bins, &tmp)
                    .with_context(|| format!("{k}, {}, round {}", mode_name(train), rep + 1))?;
                eprintln!(
                    "saturation round {} {:<10} {:<16} {:>7.3} µs CPU/datagram, {:>10.0} datagrams/s per core, {:>10.0}/s wall ({} sent, {} queued bytes, {} fill drops, {} received, {} handled; CPU {:.3} s = user {:.2} + system {:.2}; waited {:.3} s; drain {:.3} s)",
                    rep + 1, k, mode_name(train), r.us(), r.per_core(), r.wall_rate(), r.sent, r.queued_bytes,
                    r.fill_drops, r.received, r.handled, r.cpu_s, r.user_s, r.system_s, r.waited_s, r.wall_s
                );
                runs.push(r);
            }
        }
    }
    let sums = summarize(&runs, &o.contenders, &o.trains);
    let c = Conditions {
        uptime_start,
        uptime_end: command_output("uptime", &[]),
        load_start,
        secs: t0.elapsed().as_secs_f64(),
    };
    let text = report(&runs, &sums, o, &c);
    println!("{text}");
    if let Some(p) = &o.doc {
        replace_block(p, BEGIN, END, &text)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &o.json {
        std::fs::write(p, serde_json::to_string_pretty(&Value::Array(runs.iter().map(Run::json).collect()))?)?;
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: &str, train: usize, rep: usize, cpu_s: f64, handled: u64) -> Run {
        Run {
            kind: kind.into(),
            train,
            rep,
            sent: handled,
            queued_bytes: 0,
            fill_drops: 0,
            received: handled,
            handled,
            cpu_s,
            user_s: cpu_s * 0.25,
            system_s: cpu_s * 0.75,
            waited_s: 0.0,
            wall_s: cpu_s * 2.0,
            batches: None,
            ring_wakes: None,
        }
    }

    /// Ratios are taken within a round, then the median: the floor of round 2 does not
    /// divide the ring of round 1.
    #[test]
    fn figures_and_ratios_per_round() {
        let runs = [
            run("floor", 1, 0, 0.2, 1_000_000),
            run("ring", 1, 0, 0.3, 1_000_000),
            run("floor", 1, 1, 0.4, 1_000_000),
            run("ring", 1, 1, 0.4, 1_000_000),
            run("floor", 1, 2, 0.3, 1_000_000),
            run("ring", 1, 2, 0.6, 1_000_000),
        ];
        let sums = summarize(&runs, &["floor".into(), "ring".into()], &[1]);
        let ring = sums.iter().find(|s| s.kind == "ring").unwrap();
        assert!((ring.us - 0.4).abs() < 1e-9, "{}", ring.us);
        assert!((ring.us_min - 0.3).abs() < 1e-9 && (ring.us_max - 0.6).abs() < 1e-9);
        // Per round 1.5, 1.0, 2.0 → 1.5 (the ratio of the medians would be 0.4/0.3).
        assert!((ring.x_floor - 1.5).abs() < 1e-9, "{}", ring.x_floor);
        assert!((ring.per_core - 2_500_000.0).abs() < 1e-3, "{}", ring.per_core);
        assert!((ring.busy - 0.5).abs() < 1e-9 && (ring.user_share - 0.25).abs() < 1e-9);
        assert!(ring.x_baseline.is_nan(), "no baseline ran");
        assert!(ring.per_batch.is_nan(), "no batch counts");
        let r = Run { batches: Some(40_000), ring_wakes: Some(10_000), ..run("ring", 1, 0, 0.3, 1_000_000) };
        assert_eq!(r.per_batch(), 25.0, "received datagrams per batch");
        assert_eq!(r.wakes_per_batch(), 0.25, "wakes per batch");
    }

    #[test]
    fn targets_are_the_issues() {
        let runs = [
            run("floor", 1, 0, 0.4, 1_000_000),
            run("ring", 1, 0, 0.5, 1_000_000),
            run("ring", 8, 0, 0.2, 1_000_000),
            run("seqpacket", 1, 0, 1.0, 1_000_000),
        ];
        let sums = summarize(&runs, &["floor".into(), "ring".into(), "seqpacket".into()], &[1, 8]);
        let t = targets(&sums);
        let get = |w: &str| t.iter().find(|t| t.what == w).unwrap_or_else(|| panic!("{w}: {t:?}"));
        let us = get("ring, uncoalesced: CPU µs / datagram");
        assert!(us.verdict() == Verdict::Met && us.limit == 0.6 && (us.measured - 0.5).abs() < 1e-9);
        let x = get("ring, uncoalesced: × floor");
        assert!(x.verdict() == Verdict::Met && x.limit == 1.5 && (x.measured - 1.25).abs() < 1e-9);
        let trains = get("ring, GRO trains of 8: CPU µs / datagram");
        assert!(trains.verdict() == Verdict::Missed && trains.limit == 0.15 && (trains.measured - 0.2).abs() < 1e-9);
        let seq = get("seqpacket, uncoalesced: × floor (SEQPACKET, for comparison)");
        assert!(seq.verdict() == Verdict::Missed && (seq.measured - 2.5).abs() < 1e-9);
        assert_eq!(us.split, "user 25 %, system 75 %");
        assert!(t.iter().all(|t| !t.what.starts_with("floor")), "the floor has no target");
        let runs = [run("retry", 1, 0, 1.0, 200_000), run("retry", 1, 1, 1.0, 300_000)];
        let t = targets(&summarize(&runs, &["retry".into()], &[1]));
        let r = &t[0];
        assert!(r.what.starts_with("retry, uncoalesced: CPU µs / Retry") && r.limit == 4.0, "{r:?}");
        // Over the limit by the median, but one of the two rounds is within it.
        assert!(
            (r.measured - (5.0 + 10.0 / 3.0) / 2.0).abs() < 1e-9 && r.verdict() == Verdict::Undecided,
            "median of 5 and 3.33 µs: {r:?}"
        );
        assert!(!runs_in("retry", 8) && runs_in("retry", 1) && runs_in("ring", 8));
        // The retry contender is compared with the kernel's own share, retry-floor,
        // round by round; the retry floor itself has no target.
        let runs = [
            run("floor", 1, 0, 0.1, 200_000),
            run("retry-floor", 1, 0, 0.6, 200_000),
            run("retry", 1, 0, 0.9, 200_000),
            run("retry-floor", 1, 1, 0.5, 200_000),
            run("retry", 1, 1, 1.0, 200_000),
        ];
        let kinds = ["floor".into(), "retry-floor".into(), "retry".into()];
        let sums = summarize(&runs, &kinds, &[1]);
        let retry = sums.iter().find(|s| s.kind == "retry").unwrap();
        assert!((retry.x_floor - 1.75).abs() < 1e-9, "per round 1.5 and 2.0: {}", retry.x_floor);
        let rf = sums.iter().find(|s| s.kind == "retry-floor").unwrap();
        assert!((rf.x_floor - 6.0).abs() < 1e-9, "the retry floor over the receive floor: {}", rf.x_floor);
        let t = targets(&sums);
        assert_eq!(t.len(), 1, "{t:?}");
        assert!(
            t[0].what.starts_with("retry,") && t[0].split.ends_with("retry-floor): 2.750 µs, this 1.75× that"),
            "{t:?}"
        );
    }

    /// With rounds, the verdict is the interval's: wholly within the limit, wholly over
    /// it, or holding it.
    #[test]
    fn verdicts_follow_the_interval() {
        // Six rounds: ring ÷ floor per round.
        let rounds = |ratios: &[f64]| -> Vec<Run> {
            ratios
                .iter()
                .enumerate()
                .flat_map(|(rep, x)| [run("floor", 1, rep, 0.4, 1_000_000), run("ring", 1, rep, 0.4 * x, 1_000_000)])
                .collect()
        };
        let verdict = |ratios: &[f64]| {
            let sums = summarize(&rounds(ratios), &["floor".into(), "ring".into()], &[1]);
            let t = targets(&sums);
            let x = t.iter().find(|t| t.what == "ring, uncoalesced: × floor").unwrap().clone();
            (x.verdict(), x.interval.unwrap(), x)
        };
        let (v, i, _) = verdict(&[1.2, 1.3, 1.4, 1.45, 1.35, 1.25]);
        assert_eq!(v, Verdict::Met);
        // Six values: k = 1 (96.9 %), the least and the greatest.
        assert!((i.lo - 1.2).abs() < 1e-9 && (i.hi - 1.45).abs() < 1e-9 && (i.coverage - 0.96875).abs() < 1e-9);
        // One round over the limit makes the interval hold it, though the median is 1.375.
        let (v, _, x) = verdict(&[1.2, 1.3, 1.4, 1.6, 1.35, 1.25]);
        assert_eq!(v, Verdict::Undecided, "{x:?}");
        assert!(
            x.measured < x.limit
                && x.verdict_text().starts_with("**undecided**: the median's 97 % interval, 1.200–1.600")
        );
        let (v, _, x) = verdict(&[1.6, 1.7, 1.55, 1.8, 1.65, 1.51]);
        assert_eq!(v, Verdict::Missed);
        assert!(x.verdict_text().starts_with("**missed**"));
    }

    /// Every round runs every contender once; a pair runs back to back, in both
    /// orders over two rounds; the first place rotates.
    #[test]
    fn pairs_run_back_to_back() {
        let all: Vec<String> = crate::cli::SATURATION_CONTENDERS.map(String::from).to_vec();
        let mut firsts = std::collections::HashSet::new();
        for rep in 0..6 {
            let o = round_order(&all, rep);
            let mut sorted = o.clone();
            sorted.sort();
            let mut want = all.clone();
            want.sort();
            assert_eq!(sorted, want, "round {rep}: {o:?}");
            let at = |k: &str| o.iter().position(|x| x == k).unwrap();
            for (f, c) in PAIRS {
                assert_eq!(at(f).abs_diff(at(c)), 1, "round {rep}: {o:?}");
                assert_eq!(at(f) < at(c), rep % 2 == 0, "round {rep}: {o:?}");
            }
            firsts.insert(o[0].clone());
        }
        assert!(firsts.len() >= 3, "the first place rotates: {firsts:?}");
        // Without its partner a pair member is an ordinary place.
        let some: Vec<String> = ["ring", "baseline", "retry"].map(String::from).to_vec();
        assert_eq!(round_order(&some, 1), ["baseline", "retry", "ring"]);
    }

    /// What retry-floor sends back is as long as the demux's Retry: a real one, whose
    /// integrity tag verifies for the Initial's DCID, with a demux-length SCID.
    #[test]
    fn retry_floor_replies_are_retry_sized() {
        let n = retry_len().unwrap();
        let initial = initials(1).unwrap().pop().unwrap();
        let client = std::net::SocketAddr::from((spoofed_source(0), 4433));
        let mut out = [0u8; proto::retry::MAX_RETRY];
        let keys = proto::KeySet::new((proto::Generation::ZERO, [9; 32]), None).unwrap();
        let scid = keys.encode(proto::ServerId(1), &[5; proto::cid::CID_RANDOM_LEN]);
        let m = proto::retry::RetryMinter::new(&[2; 32])
            .mint(&initial, client, &scid, 1_700_000_000, [3; proto::token::NONCE_LEN], &mut out)
            .unwrap();
        assert_eq!(n, m, "the same length for another key, SCID, time and nonce");
        assert!(proto::retry::verify(&out[..m], &initial[6..14]), "a Retry for DCID 1");
        assert!(n > 40 && n < 200, "{n}");
    }

    #[test]
    fn only_the_demux_contenders_get_demux_flags() {
        assert_eq!(demux_flags("ring").unwrap()[5], "ring");
        assert_eq!(
            demux_flags("seqpacket").unwrap(),
            ["--io", "uring", "--fast-path", "off", "--forward", "seqpacket"]
        );
        assert!(demux_flags("floor").is_none() && demux_flags("baseline").is_none());
        assert_eq!(demux_flags("retry").unwrap()[6..], ["--retry", "always"]);
    }
}
