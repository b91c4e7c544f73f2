//! A link-local IPv6 client (`fe80::…%c0`) through the whole appliance, in two
//! network namespaces this test creates and removes, joined by one veth pair:
//!
//! ```text
//! client ns  c0 fe80::c/64 ──── h0 fe80::a/64  host ns: controller, data plane,
//!                                              one worker, listening on [::]:4433
//! ```
//!
//! A link-local address means nothing without its interface: the data plane receives
//! the client as `fe80::c%h0`, and the worker can answer only if the frame carries
//! that scope id (docs/wire.md, frame version 2). Needs root and iproute2; skipped
//! with a message otherwise.
#![allow(clippy::unwrap_used)] // tests may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::process::Command;
use support::*;
use testkit::netns::{can_build, ifindex, in_netns, ip, sysctl};

const PORT: u16 = 4433;

/// The two namespaces; removed on drop (after the controller, declared later).
struct Link {
    client: String,
    host: String,
}

impl Link {
    fn build() -> Link {
        let id = std::process::id();
        let l = Link { client: format!("qd-llc-{id}"), host: format!("qd-llh-{id}") };
        for ns in [&l.client, &l.host] {
            ip(None, &["netns", "add", ns]);
            ip(Some(ns), &["link", "set", "lo", "up"]);
            sysctl(ns, "net.ipv6.conf.all.disable_ipv6=0");
        }
        ip(None, &["link", "add", "c0", "netns", &l.client, "type", "veth", "peer", "name", "h0", "netns", &l.host]);
        for (ns, dev, addr) in [(&l.client, "c0", "fe80::c/64"), (&l.host, "h0", "fe80::a/64")] {
            // nodad: usable at once, not after duplicate address detection.
            ip(Some(ns), &["addr", "add", addr, "dev", dev, "nodad"]);
            ip(Some(ns), &["link", "set", dev, "up"]);
        }
        l
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for ns in [&self.client, &self.host] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// The client connects to `fe80::a%c0` from its own link-local address and fetches
/// 1 MiB over HTTP/3: the handshake goes through the data plane (frames to the
/// worker), so it completes only if the worker can answer `fe80::c` on `h0`.
#[test]
fn link_local_client_is_served() {
    if !can_build() {
        return;
    }
    let _s = serial();
    let link = Link::build();
    let listen = format!("[::]:{PORT}");
    let c = Controller::start_in_netns("linklocal", 1, &link.host, &listen, None, &[]);
    let scope = ifindex(&link.client, "c0");
    let server = SocketAddr::V6(SocketAddrV6::new("fe80::a".parse::<Ipv6Addr>().unwrap(), PORT, 0, scope));
    let der = c.cert.der.clone();
    let (status, len, from) = in_netns(&link.client, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let bind = SocketAddr::V6(SocketAddrV6::new("fe80::c".parse().unwrap(), 0, 0, scope));
            let ep = testkit::h3client::endpoint(&der, bind);
            let mut h = H3::connect(&ep, server).await.expect("connect over link-local");
            let r = h.get("/bytes/1048576").await.expect("GET");
            h.close();
            ep.wait_idle().await;
            (r.status, r.len, ep.local_addr().unwrap())
        })
    });
    assert_eq!((status, len), (200, 1 << 20), "{}", c.logs());
    assert!(matches!(from, SocketAddr::V6(a) if a.scope_id() == scope), "the client was link-local: {from}");
    let s = c.lb_wait();
    assert!(s["reasons"]["Placed"].as_u64().unwrap_or(0) >= 1, "the handshake went through the data plane: {s}");
}
