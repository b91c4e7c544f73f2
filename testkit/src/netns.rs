//! Network namespaces for tests that need more than loopback, made and removed by the
//! test that uses them, with addresses from 198.18.0.0/15 (or link-local) only: `ip`,
//! `sysctl` and threads inside a namespace, and two namespaces joined by a veth pair
//! for traffic that must cross a real device (receive-side GRO).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Runs `ip args…` (inside `ns` when given); panics with its output on failure.
pub fn ip(ns: Option<&str>, args: &[&str]) {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?} in {ns:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Runs `program args…` inside `ns` (`ip netns exec`, which also mounts the
/// namespace's own /sys); panics with its output on failure.
pub fn exec(ns: &str, program: &str, args: &[&str]) {
    let out = Command::new("ip").args(["netns", "exec", ns, program]).args(args).output().expect("ip netns exec");
    assert!(
        out.status.success(),
        "{program} {args:?} in {ns}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sets sysctl `kv` (`name=value`) inside `ns`; panics with its output on failure.
pub fn sysctl(ns: &str, kv: &str) {
    exec(ns, "sysctl", &["-q", "-w", kv]);
}

/// The interface index of `dev` in namespace `ns` (`ip -o link show`: "N: dev…").
pub fn ifindex(ns: &str, dev: &str) -> u32 {
    let out = Command::new("ip").args(["-n", ns, "-o", "link", "show", dev]).output().expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ifindex for {dev} in {ns}: {text}"))
}

/// Runs `f` on a new thread inside network namespace `ns`: sockets it opens live
/// there (they stay in it whatever thread uses them later).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).expect("netns file");
        // SAFETY: setns(2) on a namespace fd this thread opened; it moves only this
        // thread, which then runs `f` and ends.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread")
}

/// Whether this machine can make namespaces and veths (root, iproute2); `false` after
/// reporting why ([`crate::have_tool`]: a failure under CI, which has all of them).
pub fn can_build() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        crate::skip("network namespaces need root");
        return false;
    }
    crate::have_tool(tool_runs("ip", "-V"), "iproute2 (ip)")
}

/// [`can_build`], and the device can be tuned (ethtool).
pub fn available() -> bool {
    can_build() && crate::have_tool(tool_runs("ethtool", "--version"), "ethtool")
}

fn tool_runs(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).output().is_ok_and(|o| o.status.success())
}

/// Namespaces `a` (198.18.100.1/24 on device `a_dev`) and `b` (198.18.100.2/24 on
/// `b_dev`), joined by a veth pair, loopback up in both. Dropping it deletes both
/// namespaces (and so the pair).
pub struct VethPair {
    pub a: String,
    pub b: String,
    pub a_dev: &'static str,
    pub b_dev: &'static str,
    pub a_addr: Ipv4Addr,
    pub b_addr: Ipv4Addr,
}

impl VethPair {
    /// A fresh pair named after this process and `tag`.
    pub fn new(tag: &str) -> VethPair {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{}-{n}", tag.chars().take(8).collect::<String>(), std::process::id());
        let p = VethPair {
            a: format!("qd-{id}-a"),
            b: format!("qd-{id}-b"),
            a_dev: "qd0",
            b_dev: "qd1",
            a_addr: Ipv4Addr::new(198, 18, 100, 1),
            b_addr: Ipv4Addr::new(198, 18, 100, 2),
        };
        for ns in [&p.a, &p.b] {
            ip(None, &["netns", "add", ns]);
            ip(Some(ns), &["link", "set", "lo", "up"]);
        }
        ip(None, &["link", "add", p.a_dev, "netns", &p.a, "type", "veth", "peer", "name", p.b_dev, "netns", &p.b]);
        for (ns, dev, addr) in [(&p.a, p.a_dev, p.a_addr), (&p.b, p.b_dev, p.b_addr)] {
            ip(Some(ns), &["addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(Some(ns), &["link", "set", dev, "up"]);
        }
        p
    }

    /// Receive-side GRO for plain UDP on `b_dev`: GRO on, `rx-udp-gro-forwarding` on
    /// (UDP datagrams are coalesced only with it, or for a socket that asked for
    /// UDP_GRO and was found by the GRO-time lookup), and a GRO flush timeout of
    /// `flush_ns` so that datagrams sent one by one stay in the GRO list long enough
    /// to meet (veth otherwise polls each alone and flushes it at once).
    pub fn gro_on_b(&self, flush_ns: u32) {
        self.gro_on_b_with(flush_ns, &["rx-udp-gro-forwarding", "on"]);
    }

    /// [`VethPair::gro_on_b`] with other `ethtool -K` features, e.g. `rx-gro-list on`:
    /// fraglist GRO, used for datagrams whose socket did not ask for UDP_GRO.
    pub fn gro_on_b_with(&self, flush_ns: u32, features: &[&str]) {
        let mut args = vec!["-K", self.b_dev, "gro", "on"];
        args.extend_from_slice(features);
        exec(&self.b, "ethtool", &args);
        let path = format!("/sys/class/net/{}/gro_flush_timeout", self.b_dev);
        exec(&self.b, "sh", &["-c", &format!("echo {flush_ns} > {path}")]);
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
