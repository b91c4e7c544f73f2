//! One owner per port: a controller that opens new
//! sockets refuses to join a SO_REUSEPORT group another process already serves —
//! another appliance, or an orphaned data plane — since the kernel would split the
//! datagrams between them. Allowed holders: this directory's own workers (left from
//! a previous controller; they are drained at start). The adoptable data plane of
//! this directory never gets here (its sockets are adopted instead).
//!
//! `/proc/net/udp{,6}` (local address, port, inode) → `/proc/*/fd` (`socket:[inode]`)
//! → the pid; the message names it (or the socket's uid when the pid is not visible).

use super::{procs, state::Paths};
use anyhow::{bail, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// One UDP socket from `/proc/net/udp{,6}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpSocket {
    pub local: SocketAddr,
    pub uid: u32,
    pub inode: u64,
}

fn hex_u32(s: &str) -> Option<u32> {
    u32::from_str_radix(s, 16).ok()
}

/// The kernel prints each 32-bit word of the address as a native-endian `%08X`.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (a, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match a.len() {
        8 => IpAddr::V4(Ipv4Addr::from(hex_u32(a)?.to_ne_bytes())),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&hex_u32(&a[i * 8..i * 8 + 8])?.to_ne_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Parses the text of `/proc/net/udp` or `/proc/net/udp6`.
pub fn parse_proc_net_udp(text: &str) -> Vec<UdpSocket> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(UdpSocket {
                local: parse_addr(f.get(1)?)?,
                uid: f.get(7)?.parse().ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// Whether a socket bound to `held` takes datagrams meant for `want`.
pub fn overlaps(want: SocketAddr, held: SocketAddr) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let (w, h) = (canon(want.ip()), canon(held.ip()));
    want.port() == held.port() && (w == h || w.is_unspecified() || h.is_unspecified())
}

/// Pids with an fd on socket `inode`.
fn holders(inode: u64) -> Vec<i32> {
    let needle = format!("socket:[{inode}]");
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return pids };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == needle.as_str())) {
            pids.push(pid);
        }
    }
    pids
}

fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let s: Vec<String> =
        raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    s.join(" ").chars().take(200).collect()
}

/// How long a socket that no visible process holds may take to go away before it
/// counts as held. The kernel releases a socket after its last process has exited
/// when something of the kernel's still refers to it: a torn-down io_uring's
/// in-flight receives (io_uring's exit work runs in a kernel worker) or a freed
/// SK_REUSEPORT socket array. An orphaned data plane that just exited leaves its
/// sockets for a few milliseconds that way.
const RELEASE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Refuses when another process holds a UDP socket on one of `listen` (port 0 is
/// never checked: the kernel picks a free port). A socket no visible process holds
/// is waited for, up to [`RELEASE_GRACE`], before it is refused: it may be one the
/// kernel is still releasing; one held from another PID namespace stays.
pub fn refuse_if_held(listen: &[SocketAddr], p: &Paths) -> Result<()> {
    let since = std::time::Instant::now();
    loop {
        match held(listen, p) {
            Held::No => return Ok(()),
            Held::Invisibly(why) if since.elapsed() < RELEASE_GRACE => {
                tracing::debug!(why = %why, "a socket on the port has no visible holder: waiting for its release");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Held::Invisibly(why) | Held::By(why) => bail!(why),
        }
    }
}

/// What holds the port, with the message to refuse with.
enum Held {
    No,
    /// By a process this one sees (another appliance, an orphaned data plane).
    By(String),
    /// By a socket no visible process has an fd on.
    Invisibly(String),
}

fn held(listen: &[SocketAddr], p: &Paths) -> Held {
    let mut sockets = Vec::new();
    for f in ["/proc/net/udp", "/proc/net/udp6"] {
        if let Ok(t) = std::fs::read_to_string(f) {
            sockets.extend(parse_proc_net_udp(&t));
        }
    }
    let me = std::process::id() as i32;
    for want in listen.iter().filter(|a| a.port() != 0) {
        for s in sockets.iter().filter(|s| overlaps(*want, s.local)) {
            let pids = holders(s.inode);
            if pids.contains(&me) {
                continue;
            }
            let foreign: Vec<i32> =
                pids.iter().copied().filter(|pid| !procs::is_our_worker(*pid, &p.control_sock())).collect();
            if pids.is_empty() {
                return Held::Invisibly(format!(
                    "{want} is already in use: a UDP socket on {} (inode {}, uid {}) whose process is not visible to us \
                     (it stayed for {} s); a second server on this port would take part of its datagrams. Stop it, or \
                     listen elsewhere",
                    s.local,
                    s.inode,
                    s.uid,
                    RELEASE_GRACE.as_secs()
                ));
            }
            if let Some(pid) = foreign.first() {
                return Held::By(format!(
                    "{want} is already in use by pid {pid} ({}; socket {}); a second appliance on this port would take \
                     part of its datagrams. Stop it (an orphaned data plane exits by itself after its --orphan-timeout), \
                     or listen elsewhere",
                    cmdline(*pid),
                    s.local
                ));
            }
        }
    }
    Held::No
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_udp_and_udp6() {
        let v4 = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                  \x20 12: 0100007F:1151 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 4242 2 0000000000000000 0\n";
        let s = parse_proc_net_udp(v4);
        assert_eq!(s, vec![UdpSocket { local: "127.0.0.1:4433".parse().unwrap(), uid: 1000, inode: 4242 }]);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                  \x20 5: 00000000000000000000000001000000:01BB 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 77 2 0000000000000000 0\n";
        let s = parse_proc_net_udp(v6);
        assert_eq!(s[0].local, "[::1]:443".parse().unwrap());
        assert_eq!(s[0].inode, 77);
    }

    #[test]
    fn overlap_rules() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(overlaps(a("127.0.0.1:4433"), a("127.0.0.1:4433")));
        assert!(overlaps(a("127.0.0.1:4433"), a("0.0.0.0:4433")));
        assert!(overlaps(a("0.0.0.0:4433"), a("10.0.0.1:4433")));
        assert!(overlaps(a("[::]:4433"), a("127.0.0.1:4433")));
        assert!(overlaps(a("127.0.0.1:4433"), a("[::ffff:127.0.0.1]:4433")));
        assert!(!overlaps(a("127.0.0.1:4433"), a("127.0.0.1:4434")));
        assert!(!overlaps(a("127.0.0.1:4433"), a("127.0.0.2:4433")));
    }

    /// A UDP socket on `addr` that no process has an fd on: an io_uring receive holds
    /// it after its fd is closed, as an exited data plane's ring does until the kernel
    /// tears it down. Dropping the returned ring releases it.
    fn socket_only_the_kernel_holds() -> (io_uring::IoUring, SocketAddr) {
        use std::os::fd::AsRawFd;
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let mut ring = io_uring::IoUring::new(4).unwrap();
        let buf = Box::leak(vec![0u8; 2048].into_boxed_slice());
        let recv =
            io_uring::opcode::Recv::new(io_uring::types::Fd(s.as_raw_fd()), buf.as_mut_ptr(), buf.len() as u32).build();
        // SAFETY: the buffer is leaked (lives forever); the fd is live at submission.
        unsafe { ring.submission().push(&recv).unwrap() };
        ring.submit().unwrap();
        drop(s);
        (ring, addr)
    }

    /// A socket the kernel is still releasing is waited for; one that stays past the
    /// grace is refused, with a message that says why.
    #[test]
    fn a_socket_being_released_is_waited_for_and_one_that_stays_is_refused() {
        let dir = std::env::temp_dir().join(format!("qd-ownership-{}", std::process::id()));
        let p = Paths::new(&dir);
        let (ring, addr) = socket_only_the_kernel_holds();
        let t = std::fs::read_to_string("/proc/net/udp").unwrap();
        let s = parse_proc_net_udp(&t).into_iter().find(|x| x.local == addr).expect("still listed");
        assert!(holders(s.inode).is_empty(), "no process has an fd on it");
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(ring);
        });
        let t0 = std::time::Instant::now();
        refuse_if_held(&[addr], &p).expect("released within the grace");
        assert!(t0.elapsed() >= std::time::Duration::from_millis(250), "it did not wait: {:?}", t0.elapsed());
        release.join().unwrap();

        let (ring, addr) = socket_only_the_kernel_holds();
        let t0 = std::time::Instant::now();
        let err = refuse_if_held(&[addr], &p).expect_err("held past the grace").to_string();
        assert!(t0.elapsed() >= RELEASE_GRACE, "refused before the grace ran out: {:?}", t0.elapsed());
        assert!(err.contains("whose process is not visible to us"), "{err}");
        drop(ring);
    }

    /// A socket of this process is found, and refused when it is not ours to skip.
    #[test]
    fn finds_the_holder_of_a_live_socket() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let t = std::fs::read_to_string("/proc/net/udp").unwrap();
        let found = parse_proc_net_udp(&t).into_iter().find(|x| x.local == addr).expect("listed");
        assert!(holders(found.inode).contains(&(std::process::id() as i32)));
    }
}
