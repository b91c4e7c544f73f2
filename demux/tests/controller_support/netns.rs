//! Network namespaces for tests that need more than loopback (ecmp.rs, link_local.rs):
//! created and removed by the test, addresses from 198.18.0.0/15 or link-local only.

use std::process::Command;

/// Runs `ip args…` (inside `ns` when given); panics with its output on failure.
pub fn ip(ns: Option<&str>, args: &[&str]) {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["netns", "exec", ns, "ip"]);
    }
    let out = cmd.args(args).output().expect("ip");
    assert!(out.status.success(), "ip {args:?} in {ns:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub fn sysctl(ns: &str, kv: &str) {
    let out = Command::new("ip").args(["netns", "exec", ns, "sysctl", "-q", "-w", kv]).output().expect("sysctl");
    assert!(out.status.success(), "sysctl {kv} in {ns}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Whether this machine can build namespaces (root, iproute2); otherwise skip.
pub fn can_build() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        testkit::skip("network namespaces need root");
        return false;
    }
    let ok = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    testkit::have_tool(ok, "iproute2 (ip)")
}

/// Runs `f` on a thread inside network namespace `ns` (sockets it opens live there).
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

/// The interface index of `dev` in namespace `ns` (`ip -o link show`: "N: dev…").
pub fn ifindex(ns: &str, dev: &str) -> u32 {
    let out = Command::new("ip").args(["-n", ns, "-o", "link", "show", dev]).output().expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ifindex for {dev} in {ns}: {text}"))
}
