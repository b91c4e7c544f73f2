//! Linux pieces the benches use beyond the `sys` crate: pinning, a recvmmsg drain
//! loop, /proc figures and `BENCH_PERF` profiles.

use anyhow::{Context, Result};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use sys::mmsg::RecvMmsg;

/// Pins the calling thread to `core`.
pub(crate) fn pin(core: usize) {
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// Messages per recvmmsg in a drain loop.
const DRAIN_BATCH: usize = 64;
/// Bytes per message buffer: a 64 KiB GRO train plus a frame header.
pub(crate) const DRAIN_MSG_LEN: usize = 65_536 + 64;

/// recvmmsg (up to `DRAIN_BATCH`, MSG_WAITFORONE) on `fd` and add the messages to
/// `count` until `stop` is set or the peer closes; `fd` should have a receive
/// timeout (SO_RCVTIMEO) so that `stop` is seen.
pub(crate) fn drain_count(fd: BorrowedFd<'_>, stop: &AtomicBool, count: &AtomicU64) {
    let mut batch = RecvMmsg::new(DRAIN_BATCH, DRAIN_MSG_LEN);
    while !stop.load(Ordering::Relaxed) {
        match batch.recv(fd, libc::MSG_WAITFORONE) {
            Ok(0) => return,
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }
}

/// SO_RCVTIMEO on a sink's socket, so that its receive loop sees `stop` (best effort).
pub(crate) fn sink_timeout(fd: impl AsFd, t: Duration) {
    let _ = rustix::net::sockopt::set_socket_timeout(fd, rustix::net::sockopt::Timeout::Recv, Some(t));
}

/// schedstat(5) fields, in nanoseconds.
#[derive(Clone, Copy)]
pub(crate) enum Schedstat {
    /// Time on a CPU.
    OnCpu = 0,
    /// Time runnable but waiting on a run queue.
    Waiting = 1,
}

/// `field` summed over every thread of `pid` (0 when unreadable).
pub(crate) fn schedstat_ns(pid: u32, field: Schedstat) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().nth(field as usize).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

/// The CPU's model name from /proc/cpuinfo ("" when unknown).
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|x| x.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_default()
}

/// `BENCH_PERF=DIR`: `perf record -e cpu-clock -g` (no hardware counters needed) of
/// one process into DIR/<name>.perf.data, from `start` until `stop`.
pub(crate) struct Perf(Child);

impl Perf {
    /// None without BENCH_PERF.
    pub(crate) fn start(pid: u32, name: &str) -> Result<Option<Perf>> {
        let Ok(dir) = std::env::var("BENCH_PERF") else { return Ok(None) };
        let child = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-g", "-p", &pid.to_string(), "-o"])
            .arg(format!("{dir}/{name}.perf.data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("perf record")?;
        Ok(Some(Perf(child)))
    }

    /// SIGINT, so perf writes its file, and wait for it.
    pub(crate) fn stop(mut self) {
        // SAFETY: SIGINT to the perf child we spawned.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

/// One socket's line of /proc/net/udp: the bytes in its receive queue (skb
/// truesize, sk_rmem_alloc), the datagrams it dropped since it was created, its inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UdpQueue {
    pub(crate) rx_queue: u64,
    pub(crate) drops: u64,
    pub(crate) inode: u64,
}

/// The first socket bound to local `port` in a /proc/net/udp text (proc_net(5):
/// `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid
/// timeout inode ref pointer drops`, addresses and queues in hex).
pub(crate) fn parse_proc_net_udp(text: &str, port: u16) -> Option<UdpQueue> {
    let want = format!(":{port:04X}");
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 13 || !f[1].ends_with(&want) {
            return None;
        }
        let rx_queue = u64::from_str_radix(f[4].split_once(':')?.1, 16).ok()?;
        Some(UdpQueue { rx_queue, inode: f[9].parse().ok()?, drops: f[12].parse().ok()? })
    })
}

/// (busy, total) jiffies of all CPUs so far (/proc/stat's `cpu` line; idle and
/// iowait are not busy).
pub(crate) fn cpu_jiffies() -> Option<(u64, u64)> {
    parse_proc_stat_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

pub(crate) fn parse_proc_stat_cpu(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

/// Waits (at most `limit`) until the machine has been nearly idle (< 10 % busy over
/// all CPUs) for a tenth of a second: what the previous run left behind (a process's
/// exit, a network namespace's cleanup in a kernel worker) should not run during the
/// next one. Returns whether it got quiet.
pub(crate) fn wait_quiet(limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    let mut last = cpu_jiffies();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = cpu_jiffies();
        if let (Some((b0, t0)), Some((b1, t1))) = (last, now) {
            if t1 > t0 && (b1 - b0) * 10 < t1 - t0 {
                return true;
            }
        }
        last = now;
    }
    false
}

/// The host's UDP `RcvbufErrors` counter (/proc/net/snmp): datagrams dropped at a
/// full receive queue. The saturation bench's Retries end there, so this counts them
/// at the far end without asking the demux.
pub(crate) fn udp_rcvbuf_errors() -> Option<u64> {
    parse_snmp_udp(&std::fs::read_to_string("/proc/net/snmp").ok()?, "RcvbufErrors")
}

/// Field `name` of the `Udp:` lines of /proc/net/snmp (a header line, then values).
pub(crate) fn parse_snmp_udp(text: &str, name: &str) -> Option<u64> {
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let i = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// The IPv4 UDP socket bound to `port` in the network namespace of process `pid`, as
/// /proc/PID/net/udp shows it now.
pub(crate) fn udp_queue_of(pid: u32, port: u16) -> Option<UdpQueue> {
    parse_proc_net_udp(&std::fs::read_to_string(format!("/proc/{pid}/net/udp")).ok()?, port)
}

/// Field `field` (0-based after the colon: rx bytes, packets, errs, drop, …, then tx
/// from 8) of device `dev` in the network namespace of process `pid` (/proc/PID/net/dev).
pub(crate) fn dev_counter(pid: u32, dev: &str, field: usize) -> Option<u64> {
    parse_proc_net_dev(&std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?, dev, field)
}

/// Field `field` of `dev` in /proc/net/dev's format (`name: rx × 8, tx × 8`).
pub(crate) fn parse_proc_net_dev(text: &str, dev: &str, field: usize) -> Option<u64> {
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        (name.trim() == dev).then(|| rest.split_whitespace().nth(field)?.parse().ok())?
    })
}

/// The descriptor number under which process `pid` holds the socket with `inode`.
pub(crate) fn socket_fd_of(pid: u32, inode: u64) -> Option<RawFd> {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten().find_map(|e| {
        let target = std::fs::read_link(e.path()).ok()?;
        (target.to_str() == Some(want.as_str())).then(|| e.file_name().to_str()?.parse().ok())?
    })
}

/// A duplicate of descriptor `fd` of process `pid` (pidfd_open + pidfd_getfd,
/// Linux ≥ 5.6; needs ptrace rights over `pid`): the same open socket, so options set
/// on it are the process's own.
pub(crate) fn dup_from_process(pid: u32, fd: RawFd) -> Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open(2) takes a pid and flags, no pointers.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        anyhow::bail!("pidfd_open({pid}): {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: pidfd_getfd(2) takes a pidfd, a descriptor number and flags, no pointers.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        anyhow::bail!("pidfd_getfd({pid}, {fd}): {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(got as RawFd) })
}

/// Whether every thread of `pid` is stopped (state `T` in /proc/<pid>/task/*/stat).
pub(crate) fn all_threads_stopped(pid: u32) -> bool {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    rd.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').and_then(|x| x.1.split_whitespace().next().map(|st| st == "T")))
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn proc_net_dev_fields() {
        let t = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:  100  2    0    0    0     0          0         0      300  4    0    0    0     0       0          0\nqdx-egress:    0       0    0    0    0     0          0         0  123456  789    0    0    0     0       0          0\n";
        assert_eq!(parse_proc_net_dev(t, "lo", 9), Some(4), "tx packets");
        assert_eq!(parse_proc_net_dev(t, "lo", 1), Some(2), "rx packets");
        assert_eq!(parse_proc_net_dev(t, "qdx-egress", 9), Some(789));
        assert_eq!(parse_proc_net_dev(t, "qdx-egress", 3), Some(0), "rx drop");
        assert_eq!(parse_proc_net_dev(t, "eth0", 9), None);
        assert_eq!(parse_proc_net_dev(t, "lo", 16), None, "no such field");
    }

    #[test]
    fn proc_stat_busy_and_total() {
        let t = "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n";
        // busy = user + nice + system + irq + softirq + steal = 160; idle + iowait = 820.
        assert_eq!(parse_proc_stat_cpu(t), Some((160, 980)));
        assert_eq!(parse_proc_stat_cpu("cpu0 1 2 3\n"), None, "no aggregate line");
    }

    #[test]
    fn snmp_udp_fields() {
        let t = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors\nUdp: 10 42 3\nUdpLite: InDatagrams NoPorts\nUdpLite: 0 7\n";
        assert_eq!(parse_snmp_udp(t, "NoPorts"), Some(42));
        assert_eq!(parse_snmp_udp(t, "InErrors"), Some(3));
        assert_eq!(parse_snmp_udp(t, "Missing"), None);
        assert_eq!(parse_snmp_udp("Udp: NoPorts\n", "NoPorts"), None, "no value line");
    }

    use super::*;

    #[test]
    fn a_proc_net_udp_line_gives_queue_drops_and_inode() {
        let text = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
             1: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1111 2 0000000000000000 0\n\
             2: 0100007F:A1B2 00000000:0000 07 00000000:0012C000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n";
        assert_eq!(parse_proc_net_udp(text, 0xa1b2), Some(UdpQueue { rx_queue: 0x12c000, drops: 17, inode: 4242 }));
        assert_eq!(parse_proc_net_udp(text, 53), Some(UdpQueue { rx_queue: 0, drops: 0, inode: 1111 }));
        assert_eq!(parse_proc_net_udp(text, 0xb2), None, "the port is the whole field after the colon");
        assert_eq!(parse_proc_net_udp(text, 9), None);
    }

    #[test]
    fn this_processs_socket_is_found_and_duplicated() {
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = u.local_addr().unwrap().port();
        let me = std::process::id();
        let q = udp_queue_of(me, port).expect("in /proc/net/udp");
        assert_eq!(socket_fd_of(me, q.inode), Some(u.as_raw_fd()));
        let dup = dup_from_process(me, u.as_raw_fd()).unwrap();
        assert_eq!(socket2::SockRef::from(&dup).local_addr().unwrap().as_socket().unwrap().port(), port);
        assert!(!all_threads_stopped(me));
    }
}
