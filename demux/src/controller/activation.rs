//! UDP sockets from systemd (docs/operations.md "Running under systemd"): those of
//! quicdemux.socket (`ListenDatagram=`: socket activation) and those the controller
//! put in the service's file-descriptor store at its previous start (`FDSTORE=1`,
//! [`store_name`]), both passed as `LISTEN_FDS`/`LISTEN_FDNAMES` (sd_listen_fds(3)).
//! The controller serves them instead of binding: across a restart of the service
//! the port is never closed (no ICMP port unreachable; datagrams wait in the
//! sockets until the new data plane reads them).
//!
//! The data plane runs one SO_REUSEPORT socket per shard and listen address. Per
//! address, the socket unit's socket is a shard socket (systemd keeps it open, so
//! it must be read), stored sockets fill the other shards in their stored order,
//! and missing ones are bound beside them with SO_REUSEPORT (joining their group:
//! same address, same uid, IPV6_V6ONLY set). Stored sockets left over (fewer
//! `--cores` now, an address no longer listened on) are dropped from the store.

use crate::dataplane::socket::{self, UdpSock};
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// FDNAME prefix of the sockets the controller stores.
const STORE_PREFIX: &str = "udp-";

/// The file-descriptor store name of a shard socket: `udp-SHARD-ADDR` (`:` is not
/// allowed in names, sd_pid_notify_with_fds(3): written `_`).
pub fn store_name(shard: usize, addr: SocketAddr) -> String {
    format!("{STORE_PREFIX}{shard}-{}", addr.to_string().replace(':', "_"))
}

/// The shard of a stored socket's name (`None`: not a name of ours).
pub fn stored_shard(name: &str) -> Option<usize> {
    name.strip_prefix(STORE_PREFIX)?.split('-').next()?.parse().ok()
}

/// One socket systemd passed.
#[derive(Debug)]
pub struct Passed {
    pub fd: OwnedFd,
    pub name: String,
    pub local: SocketAddr,
    /// Its inode: a stored socket and the socket unit's can be the same socket.
    pub inode: u64,
    /// From the socket unit (systemd keeps it open: it must be served).
    pub from_socket_unit: bool,
    /// From the store: the shard it served.
    pub shard: Option<usize>,
}

/// Takes the sockets systemd passed to this process (none unless `LISTEN_PID` is
/// ours), each checked: a bound UDP socket of IPv4 or IPv6, not connected.
/// Duplicates (a socket both in the store and the socket unit) are merged.
pub fn take() -> Result<Vec<Passed>> {
    // Not ours: a parent's variables, inherited (sd-notify 0.5 would then compare
    // the parent's LISTEN_FDNAMES with no descriptors and fail).
    if std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id()) {
        return Ok(Vec::new());
    }
    let fds: Vec<(RawFd, String)> =
        sd_notify::listen_fds_with_names().context("LISTEN_FDS / LISTEN_FDNAMES")?.collect();
    let mut out: Vec<Passed> = Vec::new();
    for (raw, name) in fds {
        // SAFETY: sd_listen_fds(3): descriptors 3 … 3+LISTEN_FDS-1 were passed to this
        // process (LISTEN_PID checked) for it to own; nothing else in it uses them.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let p = inspect(fd, name)?;
        match out.iter_mut().find(|o| o.inode == p.inode) {
            Some(o) => {
                o.from_socket_unit |= p.from_socket_unit;
                o.shard = o.shard.or(p.shard);
                if p.shard.is_some() {
                    o.name = p.name;
                }
            }
            None => out.push(p),
        }
    }
    if !out.is_empty() {
        let list: Vec<String> = out.iter().map(|p| format!("{} ({})", p.local, p.name)).collect();
        tracing::info!(sockets = ?list, "sockets from systemd");
    }
    Ok(out)
}

/// Checks one passed descriptor and reads its address.
pub fn inspect(fd: OwnedFd, name: String) -> Result<Passed> {
    let raw = fd.as_raw_fd();
    let what = || format!("passed fd {raw} ({name})");
    let ty = sys::sockopt::getsockopt_int(raw, libc::SOL_SOCKET, libc::SO_TYPE)
        .with_context(|| format!("{} is not a socket", what()))?;
    let proto = sys::sockopt::getsockopt_int(raw, libc::SOL_SOCKET, libc::SO_PROTOCOL).unwrap_or(-1);
    if ty != libc::SOCK_DGRAM || proto != libc::IPPROTO_UDP {
        bail!("{} is not a UDP socket (ListenDatagram= in the socket unit)", what());
    }
    let domain = sys::sockopt::getsockopt_int(raw, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        bail!("{} is not an IPv4 or IPv6 socket", what());
    }
    let local = crate::dataplane::socket::local_addr(&fd).with_context(|| format!("getsockname on {}", what()))?;
    if local.port() == 0 {
        bail!("{} is not bound", what());
    }
    if is_connected(raw) {
        bail!("{} is connected to a peer: it would receive from that peer only", what());
    }
    let inode = inode_of(raw).with_context(|| format!("fstat {}", what()))?;
    let shard = stored_shard(&name);
    Ok(Passed { fd, from_socket_unit: shard.is_none(), shard, name, local, inode })
}

fn is_connected(fd: RawFd) -> bool {
    // SAFETY: sockaddr_storage is plain old data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getpeername(2) writes at most `len` bytes into `ss`.
    unsafe { libc::getpeername(fd, (&mut ss as *mut libc::sockaddr_storage).cast(), &mut len) == 0 }
}

/// Whether a passed socket serves listen address `want` (port 0: any port).
fn serves(want: SocketAddr, local: SocketAddr) -> bool {
    want.ip() == local.ip() && (want.port() == 0 || want.port() == local.port())
}

/// The controller's shard sockets, `[shard][listen index]`, and what to tell systemd.
#[derive(Debug)]
pub struct Assembled {
    pub socks: Vec<Vec<UdpSock>>,
    /// Store names to forget (FDSTOREREMOVE): sockets no shard serves any more.
    pub forget: Vec<String>,
    /// How many shard sockets came from systemd.
    pub from_systemd: usize,
}

/// Builds the shard sockets from the passed ones and new ones bound beside them.
/// A socket unit's socket that no listen address names is an error (systemd keeps
/// it open and it would take a share of the datagrams nobody reads).
pub fn assemble(passed: Vec<Passed>, listen: &[SocketAddr], shards: usize) -> Result<Assembled> {
    let mut passed = passed;
    for p in &passed {
        if p.from_socket_unit && !listen.iter().any(|w| serves(*w, p.local)) {
            bail!(
                "the socket unit passes {} ({}), which no listen address names: add it to listen.addresses \
                 (--listen), or remove it from quicdemux.socket",
                p.local,
                p.name
            );
        }
    }
    let mut per_listen: Vec<Vec<UdpSock>> = Vec::with_capacity(listen.len());
    let mut from_systemd = 0;
    for (li, &want) in listen.iter().enumerate() {
        // This address's passed sockets: the socket unit's first (in the order
        // passed), then the stored ones in shard order.
        let mut mine: Vec<Passed> = Vec::new();
        let mut rest = Vec::new();
        for p in passed.drain(..) {
            if serves(want, p.local) && mine.first().is_none_or(|m: &Passed| m.local == p.local) {
                mine.push(p);
            } else {
                rest.push(p);
            }
        }
        passed = rest;
        mine.sort_by_key(|p| (!p.from_socket_unit, p.shard.unwrap_or(usize::MAX)));
        let unit_sockets = mine.iter().filter(|p| p.from_socket_unit).count();
        if unit_sockets > shards {
            bail!(
                "the socket unit passes {unit_sockets} sockets for {want}, more than the {shards} shard(s) (--cores)"
            );
        }
        let extra: Vec<Passed> = if mine.len() > shards { mine.split_off(shards) } else { Vec::new() };
        passed.extend(extra);
        let mut socks = Vec::with_capacity(shards);
        for p in mine {
            prepare_passed(&p)?;
            socks.push(UdpSock { fd: p.fd, local: p.local, listen_index: li });
            from_systemd += 1;
        }
        while socks.len() < shards {
            // Beside the passed ones: same address and port, IPV6_V6ONLY like theirs
            // (a reuseport group's members must agree: the kernel sets it on every
            // socket bound to a specific IPv6 address, and a wildcard one without it
            // was refused above).
            let s = socket::bind_udp(socks.first().map_or(want, |f: &UdpSock| f.local), li)?;
            // With port 0 the first socket picks the port and the others join it.
            socks.push(s);
        }
        per_listen.push(socks);
    }
    // What is left was stored by an earlier start and serves no shard now.
    let forget: Vec<String> = passed.iter().filter(|p| p.shard.is_some()).map(|p| p.name.clone()).collect();
    if !forget.is_empty() {
        tracing::info!(sockets = ?forget, "stored sockets no shard serves any more: dropped from the store");
    }
    drop(passed);
    // `[listen][shard]` → `[shard][listen]`.
    let mut socks: Vec<Vec<UdpSock>> = (0..shards).map(|_| Vec::with_capacity(listen.len())).collect();
    for l in per_listen {
        for (shard, s) in l.into_iter().enumerate() {
            socks[shard].push(s);
        }
    }
    Ok(Assembled { socks, forget, from_systemd })
}

/// A passed socket gets what the bind path gives a shard socket (the options that
/// can be set after bind); SO_REUSEPORT, which the shards and the workers' fast
/// sockets need to join it, is set if the socket unit did not (`ReusePort=yes`).
fn prepare_passed(p: &Passed) -> Result<()> {
    let raw = p.fd.as_raw_fd();
    if p.local.is_ipv6()
        && p.local.ip().is_unspecified()
        && sys::sockopt::getsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)? == 0
    {
        bail!(
            "the socket {} ({}) also receives IPv4 (dual-stack): set BindIPv6Only=ipv6-only in the socket unit and \
             listen on 0.0.0.0 separately",
            p.local,
            p.name
        );
    }
    if sys::sockopt::getsockopt_int(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT)? == 0 {
        tracing::warn!(socket = %p.local, name = %p.name, "passed socket without SO_REUSEPORT: setting it (ReusePort=yes in the socket unit)");
        sys::sockopt::setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
            .context("setsockopt SO_REUSEPORT")?;
    }
    socket2::SockRef::from(&p.fd).set_nonblocking(true).context("O_NONBLOCK")?;
    socket::configure(&p.fd, p.local)
}

/// With an adopted data plane the sockets are its own: what systemd passed must be
/// among them (the store's are the very sockets; a socket unit's must be one).
/// Returns the stored names to forget: stored sockets the data plane does not serve.
pub fn check_adopted(passed: &[Passed], adopted: &[OwnedFd]) -> Result<Vec<String>> {
    let inodes: Vec<u64> = adopted.iter().filter_map(|fd| inode_of(fd.as_raw_fd()).ok()).collect();
    let mut forget = Vec::new();
    for p in passed {
        if inodes.contains(&p.inode) {
            continue;
        }
        if p.from_socket_unit {
            bail!(
                "the socket unit passes {} ({}), which the running data plane does not serve; stop the data plane, or \
                 match the socket unit to listen.addresses",
                p.local,
                p.name
            );
        }
        forget.push(p.name.clone());
    }
    Ok(forget)
}

fn inode_of(fd: RawFd) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(format!("/proc/self/fd/{fd}"))?.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passed(s: std::net::UdpSocket, name: &str) -> Passed {
        inspect(OwnedFd::from(s), name.to_string()).expect("a bound UDP socket")
    }

    #[test]
    fn store_names_round_trip_without_colons() {
        let a: SocketAddr = "[::1]:443".parse().unwrap();
        let n = store_name(3, a);
        assert!(!n.contains(':'), "{n}");
        assert_eq!(stored_shard(&n), Some(3));
        assert_eq!(stored_shard("quicdemux.socket"), None);
        assert_eq!(stored_shard("udp-x-1"), None);
    }

    #[test]
    fn refuses_what_is_not_a_bound_unconnected_udp_socket() {
        let unbound = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = inspect(OwnedFd::from(tcp), "x".into()).unwrap_err().to_string();
        assert!(err.contains("not a UDP socket"), "{err}");
        let connected = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        connected.connect(unbound.local_addr().unwrap()).unwrap();
        let err = inspect(OwnedFd::from(connected), "x".into()).unwrap_err().to_string();
        assert!(err.contains("connected"), "{err}");
        // SAFETY: a plain socket(2) call.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        // SAFETY: `raw` is a fresh socket this test owns.
        let not_bound = unsafe { OwnedFd::from_raw_fd(raw) };
        let err = inspect(not_bound, "x".into()).unwrap_err().to_string();
        assert!(err.contains("not bound"), "{err}");
        let (r, w) = std::io::pipe().unwrap();
        drop(w);
        let err = inspect(OwnedFd::from(r), "x".into()).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
    }

    /// The socket unit's socket is shard 0 and the others join its port; every one
    /// gets the shard options.
    #[test]
    fn a_socket_unit_socket_becomes_shard_zero_and_the_rest_join_it() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let p = passed(s, "quicdemux.socket");
        let inode = p.inode;
        let a = assemble(vec![p], &[addr], 3).expect("assembled");
        assert_eq!(a.from_systemd, 1);
        assert!(a.forget.is_empty());
        assert_eq!(a.socks.len(), 3);
        let ino = |fd: &OwnedFd| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino()
        };
        assert_eq!(ino(&a.socks[0][0].fd), inode, "shard 0 is the passed socket");
        for shard in &a.socks {
            assert_eq!(shard[0].local, addr);
            let fd = shard[0].fd.as_raw_fd();
            assert_eq!(sys::sockopt::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT).unwrap(), 1);
            assert_eq!(sys::sockopt::getsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO).unwrap(), 1);
            assert_eq!(
                sys::sockopt::getsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER).unwrap(),
                libc::IP_PMTUDISC_PROBE
            );
        }
    }

    /// Stored sockets come back in their shards; ones beyond `--cores` are forgotten;
    /// a socket unit's socket for an address not listened on is refused.
    #[test]
    fn stored_sockets_keep_their_shards_and_extras_are_forgotten() {
        let first = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = first.local_addr().unwrap();
        sys::sockopt::setsockopt_int(first.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).unwrap();
        let mut socks = vec![first];
        for _ in 0..2 {
            let s = socket::bind_udp(addr, 0).unwrap();
            socks.push(std::net::UdpSocket::from(s.fd));
        }
        let mut list: Vec<Passed> =
            socks.into_iter().enumerate().map(|(i, s)| passed(s, &store_name(i, addr))).collect();
        list.reverse();
        let inodes: Vec<u64> = {
            let mut v: Vec<(usize, u64)> = list.iter().map(|p| (p.shard.unwrap(), p.inode)).collect();
            v.sort();
            v.into_iter().map(|(_, i)| i).collect()
        };
        let a = assemble(list, &[addr], 2).expect("assembled");
        let ino = |fd: &OwnedFd| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino()
        };
        assert_eq!([ino(&a.socks[0][0].fd), ino(&a.socks[1][0].fd)], [inodes[0], inodes[1]], "shard order kept");
        assert_eq!(a.forget, vec![store_name(2, addr)]);

        let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let unit = passed(other, "quicdemux.socket");
        let err = assemble(vec![unit], &["127.0.0.2:0".parse().unwrap()], 1).unwrap_err().to_string();
        assert!(err.contains("no listen address names"), "{err}");
    }
}
