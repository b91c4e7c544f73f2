//! Several quicdemux hosts behind ECMP on one anycast address
//! (docs/adr/0005-server-ids-across-hosts.md, docs/scaling.md), in network
//! namespaces this test creates and removes, with addresses from 198.18.0.0/15 only:
//!
//! ```text
//! client ns 198.18.1.2 ── 198.18.1.1 router ns ──┬── 198.18.2.2 host 1 (198.19.9.9 on lo)
//!                       route 198.19.9.9:         └── 198.18.3.2 host 2 (198.19.9.9 on lo)
//!                       ECMP over both, L4 hash (fib_multipath_hash_policy=1)
//! ```
//!
//! The same over IPv6 for one scenario: 2001:db8:1::2 the client, 2001:db8:N+1::2
//! host N, the anycast address 2001:db8:9::9 (net.ipv6.fib_multipath_hash_policy=1).
//!
//! Each host runs a whole appliance (controller, data plane, workers) with
//! `--host-bits 2 --host-id N` and the same key file. Scenario (a): ngtcp2 and aioquic
//! downloads from the client namespace spread over both hosts and all complete.
//! Needs root and iproute2; skipped with a message otherwise.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod peer_support;
#[path = "controller_support/mod.rs"]
mod support;

use peer_support::Scripted;
use proto::peer::{Body, Frame, FrameKeys, Header, Me};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use std::time::Instant;
use support::*;
use testkit::netns::{can_build, in_netns, ip, sysctl};

const ANYCAST: &str = "198.19.9.9";
const PORT: u16 = 4433;
const MIB: u64 = 1 << 20;

/// The namespaces; removed on drop (their processes are the controllers', which are
/// dropped first).
struct Topology {
    client: String,
    router: String,
    hosts: Vec<String>,
    v6: bool,
}

impl Topology {
    fn build(hosts: usize) -> Topology {
        Topology::build_family(hosts, false)
    }

    /// `v6`: every address (links, anycast, forwarding) IPv6 from 2001:db8::/32.
    fn build_family(hosts: usize, v6: bool) -> Topology {
        let id = std::process::id();
        let t = Topology {
            client: format!("qd-c-{id}"),
            router: format!("qd-r-{id}"),
            hosts: (1..=hosts).map(|h| format!("qd-h{h}-{id}")).collect(),
            v6,
        };
        for ns in t.all() {
            ip(None, &["netns", "add", ns]);
            ip(Some(ns), &["link", "set", "lo", "up"]);
            sysctl(ns, "net.ipv4.conf.all.rp_filter=0");
            sysctl(ns, "net.ipv4.conf.default.rp_filter=0");
            // No duplicate address detection: addresses are usable at once.
            sysctl(ns, "net.ipv6.conf.all.accept_dad=0");
            sysctl(ns, "net.ipv6.conf.default.accept_dad=0");
        }
        let (c, r) = (t.client.as_str(), t.router.as_str());
        sysctl(r, "net.ipv4.ip_forward=1");
        sysctl(r, "net.ipv4.fib_multipath_hash_policy=1");
        sysctl(r, "net.ipv6.conf.all.forwarding=1");
        sysctl(r, "net.ipv6.fib_multipath_hash_policy=1");
        // `ip -6` for IPv6 routes; addresses carry their family.
        let fam = if v6 { "-6" } else { "-4" };
        let addr = |a: String| if v6 { vec![a, "nodad".to_string()] } else { vec![a] };
        let add = |ns: &str, a: String, dev: &str| {
            let mut args = vec!["addr".to_string(), "add".to_string()];
            args.extend(addr(a));
            args.extend(["dev".to_string(), dev.to_string()]);
            ip(Some(ns), &args.iter().map(String::as_str).collect::<Vec<_>>());
        };
        ip(None, &["link", "add", "c0", "netns", c, "type", "veth", "peer", "name", "rc", "netns", r]);
        add(c, t.link(1, 2, true), "c0");
        ip(Some(c), &["link", "set", "c0", "up"]);
        ip(Some(c), &[fam, "route", "add", "default", "via", &t.link(1, 1, false)]);
        add(r, t.link(1, 1, true), "rc");
        ip(Some(r), &["link", "set", "rc", "up"]);
        let anycast = t.anycast();
        let mut nexthops = vec![fam, "route", "add", anycast.as_str()];
        let gateways: Vec<String> = (1..=hosts).map(|h| t.host_addr(h)).collect();
        for (i, h) in t.hosts.iter().enumerate() {
            let n = i + 1;
            let (dev, rdev) = (format!("h{n}"), format!("r{n}"));
            ip(None, &["link", "add", &dev, "netns", h, "type", "veth", "peer", "name", &rdev, "netns", r]);
            add(h, t.link(n as u8 + 1, 2, true), &dev);
            ip(Some(h), &["link", "set", &dev, "up"]);
            add(h, format!("{anycast}/{}", if v6 { 128 } else { 32 }), "lo");
            ip(Some(h), &[fam, "route", "add", "default", "via", &t.link(n as u8 + 1, 1, false)]);
            add(r, t.link(n as u8 + 1, 1, true), &rdev);
            ip(Some(r), &["link", "set", &rdev, "up"]);
        }
        for g in &gateways {
            nexthops.extend(["nexthop", "via", g.as_str()]);
        }
        ip(Some(r), &nexthops);
        t
    }

    /// Address `x` on link `net` (1: client–router, N+1: host N–router), with its
    /// prefix length when `prefix`.
    fn link(&self, net: u8, x: u8, prefix: bool) -> String {
        match (self.v6, prefix) {
            (false, false) => format!("198.18.{net}.{x}"),
            (false, true) => format!("198.18.{net}.{x}/24"),
            (true, false) => format!("2001:db8:{net}::{x}"),
            (true, true) => format!("2001:db8:{net}::{x}/64"),
        }
    }

    /// Host `n`'s address on its link to the router (also its forwarding address).
    fn host_addr(&self, n: usize) -> String {
        self.link(n as u8 + 1, 2, false)
    }

    fn anycast(&self) -> String {
        if self.v6 { "2001:db8:9::9" } else { ANYCAST }.to_string()
    }

    /// `ip:port` with brackets for IPv6.
    fn sockaddr(&self, ip: &str, port: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::new(ip.parse().expect("an IP"), port)
    }

    /// The anycast service address.
    fn service(&self) -> std::net::SocketAddr {
        self.sockaddr(&self.anycast(), PORT)
    }

    /// Where the client's sockets bind.
    fn client_bind(&self) -> std::net::SocketAddr {
        self.sockaddr(&self.link(1, 2, false), 0)
    }

    fn all(&self) -> impl Iterator<Item = &str> {
        [self.client.as_str(), self.router.as_str()].into_iter().chain(self.hosts.iter().map(String::as_str))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.all() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

const PEER_PORT: u16 = 4434;

/// Host `n`'s address on its link to the router (also its forwarding address), IPv4.
fn host_addr(n: usize) -> String {
    format!("198.18.{}.2", n + 1)
}

/// The appliances: host 1 makes the cluster's key file and certificate, the others
/// start with copies; each lists the others in its `--peers` file (`DIR/peers-N`,
/// DIR returned).
fn appliances(t: &Topology) -> (Vec<Controller>, std::path::PathBuf) {
    appliances_with(t, &[])
}

/// [`appliances`], every peers file also listing `extra` (`HOST_ID ADDR:PORT`).
fn appliances_with(t: &Topology, extra_peers: &[(u16, std::net::SocketAddr)]) -> (Vec<Controller>, std::path::PathBuf) {
    let listen = t.service().to_string();
    let dir = testkit::temp_dir("ecmp-peers");
    let mut out: Vec<Controller> = Vec::new();
    for (i, ns) in t.hosts.iter().enumerate() {
        let n = i + 1;
        let mut peers: String = (1..=t.hosts.len())
            .filter(|&m| m != n)
            .map(|m| format!("{m} {}\n", t.sockaddr(&t.host_addr(m), PEER_PORT)))
            .collect();
        peers.extend(extra_peers.iter().map(|(h, a)| format!("{h} {a}\n")));
        let file = dir.join(format!("peers-{n}"));
        std::fs::write(&file, peers).expect("peers file");
        let (host, file, peer_listen) =
            (n.to_string(), file.display().to_string(), t.sockaddr(&t.host_addr(n), PEER_PORT).to_string());
        let extra = ["--host-bits", "2", "--host-id", &host, "--peers", &file, "--peer-listen", &peer_listen];
        let keys = out.first().map(|c| c.state.join("keys"));
        let shared = out.first().map(|c| &c.cert).zip(keys.as_deref()).map(|(c, k)| (k, c));
        let c = Controller::start_in_netns(&format!("ecmp-h{n}"), 1, ns, &listen, shared, &extra);
        out.push(c);
    }
    (out, dir)
}

fn peers_status(c: &Controller) -> serde_json::Value {
    c.lb_wait()["peers"].clone()
}

/// (length, whether byte i == i mod 256 throughout): the workers' `/bytes/N` body.
fn check_pattern(file: &Path) -> (u64, bool) {
    let Ok(b) = std::fs::read(file) else { return (0, false) };
    (b.len() as u64, b.iter().enumerate().all(|(i, &x)| x == i as u8))
}

/// Datagrams a host's one worker received (data plane and kernel fast path).
fn received(c: &Controller) -> u64 {
    let lb = c.lb_wait();
    lb["instances"]
        .as_array()
        .map(|l| l.iter().map(|i| i["datagrams"].as_u64().unwrap_or(0) + i["fast_datagrams"].as_u64().unwrap_or(0)))
        .into_iter()
        .flatten()
        .sum()
}

/// (a) 16 ngtcp2 and 8 aioquic downloads of 1 MiB from the client namespace, each a
/// new UDP flow (a fresh source port), all complete; ECMP put flows on both hosts.
/// With a fair L4 hash, all 24 flows on one host has probability 2 · 2^-24 ≈ 1.2e-7.
#[test]
fn downloads_spread_over_two_hosts() {
    if !can_build() {
        return;
    }
    let _s = serial();
    let t = Topology::build(2);
    let (hosts, _) = appliances(&t);
    let have_gtls =
        testkit::have_tool(Command::new("gtlsclient").arg("--help").output().is_ok(), "gtlsclient (ngtcp2-client)");
    let have_aioquic = testkit::bin::have_aioquic();
    let before: Vec<u64> = hosts.iter().map(received).collect();
    let dl = testkit::temp_dir("ecmp-dl");
    let url = format!("https://{ANYCAST}:{PORT}/bytes/{MIB}");
    let mut flows = 0;
    for i in 0..16 {
        if !have_gtls {
            break;
        }
        let dir = dl.join(format!("g{i}"));
        std::fs::create_dir_all(&dir).expect("download dir");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &t.client, "gtlsclient", "-q", "--exit-on-all-streams-close", "--timeout=15s"])
            .arg(format!("--download={}", dir.display()))
            .args([ANYCAST, &PORT.to_string(), &url]);
        let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(40));
        let (len, pattern) = check_pattern(&dir.join(MIB.to_string()));
        assert!(ok && len == MIB && pattern, "gtlsclient flow {i}: ok={ok} len={len} pattern={pattern}: {out}");
        flows += 1;
    }
    let script = testkit::bin::python_script("aioquic_h3_get.py");
    for i in 0..8 {
        if !have_aioquic {
            break;
        }
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &t.client, "python3"]).arg(&script).args([
            ANYCAST,
            &PORT.to_string(),
            &format!("/bytes/{MIB}"),
        ]);
        let (ok, out) = testkit::bin::run_bounded(&mut cmd, Duration::from_secs(40));
        // The script checks every body byte against the `/bytes/N` pattern (`ok=`).
        let want = format!("status=200 bytes={MIB} ");
        assert!(ok && out.contains(&want) && out.contains(" ok=True "), "aioquic flow {i}: {out}");
        flows += 1;
    }
    if flows == 0 {
        return;
    }
    let after: Vec<u64> = hosts.iter().map(received).collect();
    let per_host: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("{flows} flows; datagrams received per host: {per_host:?}");
    // A 1 MiB download is hundreds of client datagrams (ACKs); a host that served
    // no flow sees none of them.
    assert!(per_host.iter().all(|&n| n > 100), "ECMP used only some hosts: {per_host:?}");
}

/// (b) Eight paced 4 MiB downloads (each its own UDP flow) start over hosts 1 and 2
/// while host 3 is out of the route; then the next-hop set changes under them: host 2
/// removed, a third host added, all three, reordered. Flows that change host are
/// forwarded to the host that owns their connection (its id is in the CID), so every
/// download completes, and the forwarding counters show the traffic that crossed.
#[test]
fn downloads_survive_next_hop_changes() {
    if !can_build() {
        return;
    }
    let _s = serial();
    next_hop_changes(false);
}

/// (b) over IPv6: clients, hosts, forwarding and the anycast address all in
/// 2001:db8::/32. Forwarded IPv6 datagrams are injected (nothing counted
/// `inject_errors`).
#[test]
fn downloads_survive_next_hop_changes_over_ipv6() {
    if !can_build() {
        return;
    }
    let _s = serial();
    next_hop_changes(true);
}

/// (b) with QUIC-LB connection IDs (docs/adr/0007-quic-lb.md): every host rotates to
/// the same keyed QUIC-LB generation (4-pass Feistel, 2-byte server ids carrying the
/// host bits) before the downloads, so the workers mint QUIC-LB CIDs and a host
/// that receives another host's flow decodes the owner from them and forwards it.
#[test]
fn downloads_survive_next_hop_changes_with_quic_lb_cids() {
    if !can_build() {
        return;
    }
    let _s = serial();
    next_hop_changes_as(false, Some("quic-lb server-id=2 key=00112233445566778899aabbccddeeff"));
}

fn next_hop_changes(v6: bool) {
    next_hop_changes_as(v6, None);
}

/// [`next_hop_changes`]; `cid_format`: first rotate every host to a generation of
/// this `rotate-keys --cid-format` (the same on every host: a keyed format names its
/// key).
fn next_hop_changes_as(v6: bool, cid_format: Option<&str>) {
    let t = Topology::build_family(3, v6);
    let (hosts, _) = appliances(&t);
    if let Some(f) = cid_format {
        for h in &hosts {
            let out = Command::new(DEMUX)
                .args(["rotate-keys", "--force", "--cid-format", f, "--state-dir"])
                .arg(&h.state)
                .output()
                .expect("run rotate-keys");
            assert!(out.status.success(), "rotate-keys: {}", String::from_utf8_lossy(&out.stderr));
            let s = h.status_wait();
            assert_eq!(s["key_newest"].as_u64(), Some(1), "{s}");
            let lb = h.lb_wait();
            assert_eq!(lb["key_newest_format"].as_str(), Some("quic-lb"), "the data plane's newest format: {lb}");
        }
    }
    let router = Some(t.router.as_str());
    let (h1, h2, h3) = (t.host_addr(1), t.host_addr(2), t.host_addr(3));
    let (fam, anycast) = (if v6 { "-6" } else { "-4" }, t.anycast());
    ip(router, &[fam, "route", "replace", &anycast, "nexthop", "via", &h1, "nexthop", "via", &h2]);
    let cert = hosts[0].cert.der.clone();
    let (addr, bind) = (t.service(), t.client_bind());
    // Every connection is made (over hosts 1 and 2) before the next hops change.
    let (connected_tx, connected) = std::sync::mpsc::channel::<()>();
    let downloads = std::thread::spawn({
        let ns = t.client.clone();
        move || {
            in_netns(&ns, move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for _ in 0..8 {
                        let ep = testkit::h3client::endpoint(&cert, bind);
                        let connected_tx = connected_tx.clone();
                        tasks.push(tokio::spawn(async move {
                            let h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e:#}"));
                            let _ = connected_tx.send(());
                            let mut h = h?;
                            let r = h.get_paced(&format!("/bytes/{}", 4 * MIB), Some(MIB)).await;
                            h.close();
                            ep.wait_idle().await;
                            r.map_err(|e| format!("GET: {e:?}"))
                        }));
                    }
                    let mut out = Vec::new();
                    for t in tasks {
                        out.push(t.await.map_err(|e| e.to_string()).and_then(|r| r));
                    }
                    out
                })
            })
        }
    });
    for _ in 0..8 {
        connected.recv_timeout(Duration::from_secs(30)).expect("the clients connect");
    }
    let t0 = Instant::now();
    let phases: [&[&str]; 4] = [&[&h1], &[&h1, &h3], &[&h1, &h2, &h3], &[&h3, &h2, &h1]];
    for hops in phases {
        std::thread::sleep(Duration::from_millis(800));
        let mut args = vec![fam, "route", "replace", anycast.as_str()];
        for h in hops {
            args.extend(["nexthop", "via", h]);
        }
        ip(router, &args);
    }
    let results = downloads.join().expect("downloads");
    eprintln!("downloads done after {:?}", t0.elapsed());
    for (n, h) in hosts.iter().enumerate() {
        let lb = h.lb_wait();
        eprintln!(
            "host {}: peers {} reasons {} fast {}",
            n + 1,
            lb["peers"],
            lb["reasons"],
            lb["fast_path"]["to_demux"]
        );
    }
    for (i, r) in results.iter().enumerate() {
        let r = r.as_ref().unwrap_or_else(|e| panic!("download {i}: {e}"));
        assert_eq!((r.status, r.len, r.pattern_ok), (200, 4 * MIB, true), "download {i}");
    }
    let p: Vec<serde_json::Value> = hosts.iter().map(peers_status).collect();
    eprintln!("peers: {p:?}");
    let sum = |k: &str| p.iter().map(|v| v[k].as_u64().unwrap_or(0)).sum::<u64>();
    // Host 2's flows crossed to host 1 while host 2 was out; host 3 owns nothing (it
    // joined after every connection was made), so all it carried was forwarded.
    assert!(p[0]["forwarded_to"]["2"].as_u64().unwrap_or(0) > 0, "host 1 forwarded nothing to host 2: {p:?}");
    // Delivered: handed to the owning worker's data connection (its instance is
    // live), or injected into the stack (not live here: a shard decides).
    let delivered =
        |v: &serde_json::Value| v["handed_over"].as_u64().unwrap_or(0) + v["injected"].as_u64().unwrap_or(0);
    assert!(p[1]["handed_over"].as_u64().unwrap_or(0) > 0, "host 2 took nothing to its worker: {p:?}");
    assert!(p[2]["forwarded"].as_u64().unwrap_or(0) > 0, "the added host forwarded nothing: {p:?}");
    assert_eq!(delivered(&p[2]), 0, "nobody forwards to a host that owns no connection: {p:?}");
    for v in &p {
        assert_eq!(delivered(v), v["received"].as_u64().unwrap_or(0), "every accepted frame delivered: {v}");
        assert_eq!(v["handed_over_dropped"], 0, "{v}");
    }
    for (n, v) in p.iter().enumerate() {
        for (why, count) in v["refused"].as_object().expect("refused").iter() {
            assert_eq!(count.as_u64(), Some(0), "host {}: refused {why}: {v}", n + 1);
        }
    }
    assert_eq!(sum("inject_errors"), 0, "{p:?}");
    assert_eq!(sum("inject_not_served"), 0, "{p:?}");
    assert!(sum("received") <= sum("forwarded"), "more received than sent: {p:?}");
}

/// (e) Every kind of bad frame is refused and counted, by real appliances, from a
/// scripted host 3 (in the router namespace, at 198.18.2.1, listed by both hosts):
/// garbage; frames sealed with anything a worker is ever sent (every 32-byte string
/// of an encoded `Assign`, and the old derivation from the reset key:
/// `unauthenticated`); an authentic frame from an address that is not host 3's
/// (`unknown_peer`); an accepted frame replayed to its receiver (`replayed`), to the
/// other host (`wrong_receiver`), and to its receiver after its data plane restarted
/// (`stale`).
#[test]
fn forged_misdirected_stale_and_replayed_frames_are_refused() {
    use proto::wire::Message;
    if !can_build() {
        return;
    }
    let _s = serial();
    let t = Topology::build(2);
    let h3: std::net::SocketAddr = format!("198.18.2.1:{PEER_PORT}").parse().unwrap();
    let (hosts, _) = appliances_with(&t, &[(3, h3)]);
    let text = std::fs::read_to_string(hosts[0].state.join("keys")).expect("key file");
    let keys = proto::keyfile::KeyFile::parse(&text).expect("key file");
    let (to1, to2) = (t.sockaddr(&host_addr(1), PEER_PORT), t.sockaddr(&host_addr(2), PEER_PORT));
    let (client, local) = (t.sockaddr("198.18.1.2", 40000), t.service());
    let datagram = [0x40u8; 40];
    let data = Body::Data { client, local, datagram: &datagram };
    let sock = in_netns(&t.router, move || std::net::UdpSocket::bind(h3).expect("bind"));
    let me = Me { host: 3, epoch: u64::from(std::process::id()) << 20 | 0x3 };
    let mut s3 = Scripted::new(sock, me, &keys.forwarding);
    s3.handshake(1, to1, Duration::from_secs(10));
    s3.handshake(2, to2, Duration::from_secs(10));
    let epoch1 = s3.outbound[&1].epoch();
    // Garbage, and an authentic frame from the client network.
    let stranger = in_netns(&t.client, || std::net::UdpSocket::bind("198.18.1.2:0").expect("bind"));
    stranger.send_to(b"not a frame at all, just bytes", to1).expect("send");
    let (_, seq) = s3.outbound[&1].data().unwrap();
    let f = s3.seal(1, epoch1, seq, data);
    stranger.send_to(&f, to1).expect("send");
    // What a worker holds, as the forwarding secret, from host 3's own socket.
    let mut assign = Vec::new();
    keys.assign(proto::ServerId(1 << 14)).encode(&mut assign);
    let mut secrets: Vec<[u8; 32]> = assign.windows(32).map(|w| w.try_into().unwrap()).collect();
    let old = aws_lc_rs::hmac::sign(
        &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &keys.reset_key),
        b"quicdemux peer forwarding v1",
    );
    secrets.push(old.as_ref().try_into().unwrap());
    for secret in &secrets {
        let forger = FrameKeys::new(secret, None);
        let (_, seq) = s3.outbound[&1].data().unwrap();
        let header = Header { from_host: 3, to_host: 1, from_epoch: s3.me.epoch, to_epoch: epoch1, seq, ack: 0 };
        let mut f = Vec::new();
        proto::peer::seal(&forger.current, &Frame { header, body: data }, &mut f);
        s3.sock.send_to(&f, to1).expect("send");
    }
    // A genuine frame, then its replays.
    let (_, seq) = s3.outbound[&1].data().unwrap();
    let genuine = s3.seal(1, epoch1, seq, data);
    s3.sock.send_to(&genuine, to1).expect("send");
    let v = wait_until("host 1 took the genuine frame", Duration::from_secs(10), || {
        let v = peers_status(&hosts[0]);
        (v["received"] == 1).then_some(v)
    });
    s3.sock.send_to(&genuine, to1).expect("send");
    s3.sock.send_to(&genuine, to2).expect("send");
    let _ = v;
    let v = wait_until("the refusals counted", Duration::from_secs(10), || {
        let v = peers_status(&hosts[0]);
        (v["refused"]["replayed"] == 1).then_some(v)
    });
    assert_eq!(v["refused"]["not_a_frame"], 1, "{v}");
    assert_eq!(v["refused"]["unauthenticated"], secrets.len() as u64, "{v}");
    assert_eq!(v["refused"]["unknown_peer"], 1, "{v}");
    assert_eq!(v["received"], 1, "the one authentic frame from the peer, once: {v}");
    wait_until("host 2 refused the frame sealed for host 1", Duration::from_secs(10), || {
        let v = peers_status(&hosts[1]);
        (v["refused"]["wrong_receiver"] == 1 && v["received"] == 0).then_some(())
    });
    // Host 1's data plane restarts (the controller starts a new one): the captured
    // frame is stale there.
    let old_pid = hosts[0].dataplane_pid();
    kill(old_pid, libc::SIGKILL);
    wait_until("host 1's new data plane", Duration::from_secs(20), || {
        let pid = hosts[0].dataplane_pid();
        (pid != old_pid && pid != 0 && hosts[0].lb().is_some_and(|l| l["peers"]["epoch"].is_string())).then_some(())
    });
    s3.sock.send_to(&genuine, to1).expect("send");
    let v = wait_until("the stale frame refused", Duration::from_secs(10), || {
        let v = peers_status(&hosts[0]);
        (v["refused"]["stale"] == 1).then_some(v)
    });
    assert_eq!((v["received"].as_u64(), v["refused"]["replayed"].as_u64()), (Some(0), Some(0)), "{v}");
}

/// The client side of the scenarios below, on one thread inside the client
/// namespace: `clients` connections, each first learning its server id (GET
/// /bytes/10), then `job(index, connection, endpoint)`.
fn clients_in_netns<F, Fut, T>(
    t: &Topology,
    cert: &Controller,
    clients: usize,
    job: F,
) -> std::thread::JoinHandle<Vec<T>>
where
    F: Fn(usize, H3, quinn::Endpoint, u16) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    let (ns, cert) = (t.client.clone(), cert.cert.der.clone());
    std::thread::spawn(move || {
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let addr: std::net::SocketAddr = format!("{ANYCAST}:{PORT}").parse().unwrap();
                let job = std::rc::Rc::new(job);
                let mut tasks = Vec::new();
                for i in 0..clients {
                    let ep = testkit::h3client::endpoint(&cert, "198.18.1.2:0".parse().unwrap());
                    let mut h = H3::connect(&ep, addr).await.expect("connect");
                    let id = h.get("/bytes/10").await.expect("first GET").server_id;
                    let job = job.clone();
                    tasks.push(tokio::task::spawn_local(async move { job(i, h, ep, id).await }));
                }
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.expect("client task"));
                }
                out
            })
        })
    })
}

/// (c) Clients change their UDP port twice mid-download (quinn `rebind`: NAT
/// rebinding, or a migration): each new 5-tuple hashes anew, so some flows move to the
/// other host and are forwarded to their owner. Every download completes. With 12
/// clients × 2 rebinds, no flow changing host has probability 2^-24.
#[test]
fn rebinding_clients_that_hash_to_another_host_finish() {
    if !can_build() {
        return;
    }
    let _s = serial();
    let t = Topology::build(2);
    let (hosts, _) = appliances(&t);
    let results = clients_in_netns(&t, &hosts[0], 12, |i, mut h, ep, _| async move {
        let rebinder = {
            let ep = ep.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..2 {
                    tokio::time::sleep(Duration::from_millis(900)).await;
                    let s = std::net::UdpSocket::bind("198.18.1.2:0").expect("bind");
                    ep.rebind(s).expect("rebind");
                }
            })
        };
        let r = h.get_paced(&format!("/bytes/{}", 3 * MIB), Some(MIB)).await;
        let _ = rebinder.await;
        h.close();
        ep.wait_idle().await;
        r.map_err(|e| format!("client {i}: {e:?}"))
    })
    .join()
    .expect("clients");
    for r in &results {
        let r = r.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.status, r.len, r.pattern_ok), (200, 3 * MIB, true));
    }
    let forwarded: u64 = hosts.iter().map(|h| peers_status(h)["forwarded"].as_u64().unwrap_or(0)).sum();
    assert!(forwarded > 0, "no rebound flow crossed hosts: {:?}", hosts.iter().map(peers_status).collect::<Vec<_>>());
}

/// (d) Host 2's appliance is killed (all its processes) and the router stops
/// sending to it. Its clients' packets now reach host 1, which stops forwarding to
/// the silent peer within a second and answers them with a stateless reset (the
/// cluster's reset key); each reconnects and is served by host 1. Host 1's clients
/// are untouched. With 16 clients, none on host 2 has probability 2^-16.
#[test]
fn clients_of_a_lost_host_are_reset_and_reconnect() {
    if !can_build() {
        return;
    }
    let _s = serial();
    let t = Topology::build(2);
    let (mut hosts, _) = appliances(&t);
    let addr: std::net::SocketAddr = format!("{ANYCAST}:{PORT}").parse().unwrap();
    let clients = clients_in_netns(&t, &hosts[0], 16, move |i, mut h, ep, id| async move {
        let first = outcome(h.get_paced(&format!("/bytes/{}", 6 * MIB), Some(MIB)).await, format!("client {i}"));
        h.close();
        // Reconnect (a new connection, placed wherever ECMP sends it now).
        let again = async {
            let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("reconnect: {e:#}"))?;
            let r = h.get("/bytes/1000").await.map_err(|e| format!("GET after reconnect: {e:?}"))?;
            h.close();
            Ok::<_, String>((r.status, r.len, r.pattern_ok, r.server_id))
        }
        .await;
        (i, id, first, again)
    });
    std::thread::sleep(Duration::from_millis(1500));
    hosts[1].kill_everything();
    ip(Some(t.router.as_str()), &["route", "replace", ANYCAST, "via", &host_addr(1)]);
    let results = clients.join().expect("clients");
    let host_of = |id: u16| id >> 14;
    let mut lost = 0;
    for (i, id, first, again) in &results {
        match host_of(*id) {
            1 => assert_eq!(first, &complete(6 * MIB), "client {i} of the surviving host"),
            2 => {
                lost += 1;
                let e = first.as_ref().expect_err("a download from the lost host cannot finish");
                assert!(e.contains("reset"), "client {i}: the lost host's connection ends in a stateless reset: {e}");
            }
            h => panic!("client {i}: server id {id} of unknown host {h}"),
        }
        let (status, len, pattern_ok, sid) = again.as_ref().unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert_eq!(
            (*status, *len, *pattern_ok, host_of(*sid)),
            (200, 1000, true, 1),
            "client {i} reconnected to the surviving host"
        );
    }
    assert!(lost > 0, "no client was on host 2: {results:?}");
    let v = peers_status(&hosts[0]);
    assert!(v["dead_peer"].as_u64().unwrap_or(0) > 0, "host 1 reset the lost host's ids: {v}");
    assert_eq!(v["peers_alive"], 0, "{v}");
}

fn rotate(c: &Controller, args: &[&str]) {
    let out =
        Command::new(DEMUX).arg("rotate-keys").args(args).arg("--state-dir").arg(&c.state).output().expect("rotate");
    assert!(out.status.success(), "rotate-keys {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// (f) The two-phase rotation across hosts while downloads run: `--stage` on every
/// host, then `--activate` on every host. Connections made before (old generation)
/// and after (new generation, on host 1) cross hosts when the route changes, and
/// every download completes. With `skip_stage_on_2`, host 2 never learns the new
/// generation: the connections made after host 1's activation are reset when their
/// packets reach host 2 (ADR 0005 §3: what breaks when a step is skipped), while the
/// older ones still cross.
/// Each client's (status, body length, body is the `/bytes/N` pattern byte for byte),
/// or why it failed.
type Outcomes = Vec<Result<(u16, u64, bool), String>>;

/// A download's outcome as `Outcomes` holds it.
fn outcome(r: Result<Resp, ReqError>, who: String) -> Result<(u16, u64, bool), String> {
    r.map(|r| (r.status, r.len, r.pattern_ok)).map_err(|e| format!("{who}: {e:?}"))
}

/// What a complete `/bytes/N` download of `n` bytes is.
fn complete(n: u64) -> Result<(u16, u64, bool), String> {
    Ok((200, n, true))
}

fn rotation_across_hosts(skip_stage_on_2: bool) -> (Outcomes, Outcomes) {
    let t = Topology::build(2);
    let (hosts, _) = appliances(&t);
    let router = Some(t.router.as_str());
    let (h1, h2) = (host_addr(1), host_addr(2));
    let addr: std::net::SocketAddr = format!("{ANYCAST}:{PORT}").parse().unwrap();
    // The clients: 6 connections over both hosts now; 4 more at 2 s (routed to host 1).
    let old = clients_in_netns(&t, &hosts[0], 6, |i, mut h, ep, _| async move {
        let r = h.get_paced(&format!("/bytes/{}", 5 * MIB), Some(MIB)).await;
        h.close();
        ep.wait_idle().await;
        outcome(r, format!("old client {i}"))
    });
    let new = {
        let (ns, cert) = (t.client.clone(), hosts[0].cert.der.clone());
        std::thread::spawn(move || {
            in_netns(&ns, move || {
                std::thread::sleep(Duration::from_millis(2000));
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for i in 0..4 {
                        let ep = testkit::h3client::endpoint(&cert, "198.18.1.2:0".parse().unwrap());
                        tasks.push(tokio::spawn(async move {
                            let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("new client {i}: {e:#}"))?;
                            let r = h.get_paced(&format!("/bytes/{}", 3 * MIB), Some(MIB)).await;
                            h.close();
                            outcome(r, format!("new client {i}"))
                        }));
                    }
                    let mut out = Vec::new();
                    for t in tasks {
                        out.push(t.await.map_err(|e| e.to_string()).and_then(|r| r));
                    }
                    out
                })
            })
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // The forwarding secrets each data plane holds (names, current first).
    let secrets = |h: &Controller| peers_status(h)["forwarding_keys"].clone();
    let before = secrets(&hosts[0]);
    assert_eq!(before, secrets(&hosts[1]), "one cluster, one forwarding secret");
    // Host 1 stages a fresh generation; host 2 stages the same one, from a copy of
    // host 1's key file (the operator's tooling carries it).
    rotate(&hosts[0], &["--stage"]);
    let copy = hosts[1].dir.join("keys-from-host-1");
    std::fs::copy(hosts[0].state.join("keys"), &copy).expect("copy the staged key file");
    if !skip_stage_on_2 {
        rotate(&hosts[1], &["--stage", "--from", copy.to_str().unwrap()]);
        // ADR 0005 §3: both still seal with the current secret and accept the staged one.
        let staged = secrets(&hosts[0]);
        assert_eq!((staged[0].clone(), staged.as_array().map(Vec::len)), (before[0].clone(), Some(2)), "{staged}");
        assert_eq!(staged, secrets(&hosts[1]));
    }
    std::thread::sleep(Duration::from_millis(500));
    rotate(&hosts[0], &["--activate"]);
    if !skip_stage_on_2 {
        rotate(&hosts[1], &["--activate"]);
        let active = secrets(&hosts[0]);
        assert_eq!(active, secrets(&hosts[1]));
        assert_eq!(active[1], before[0], "the old secret is still accepted: {active}");
        assert_ne!(active[0], before[0], "frames are sealed with the staged secret: {active}");
    }
    std::thread::sleep(Duration::from_millis(500));
    ip(router, &["route", "replace", ANYCAST, "via", &h1]);
    std::thread::sleep(Duration::from_millis(1500));
    ip(router, &["route", "replace", ANYCAST, "via", &h2]);
    let old = old.join().expect("old clients");
    let new = new.join().expect("new clients");
    for (n, h) in hosts.iter().enumerate() {
        let (s, lb) = (h.status().expect("status"), h.lb_wait());
        eprintln!(
            "host {}: keys newest {} previous {}; peers {}; reasons {}; fast {}",
            n + 1,
            s["key_newest"],
            s["key_previous"],
            lb["peers"],
            lb["reasons"],
            lb["fast_path"]["to_demux"]
        );
    }
    let s = hosts[0].status().expect("status");
    assert_eq!(s["key_newest"], 1, "host 1 issues the new generation: {s}");
    (old, new)
}

#[test]
fn two_phase_rotation_across_hosts_keeps_every_download() {
    if !can_build() {
        return;
    }
    let _s = serial();
    let (old, new) = rotation_across_hosts(false);
    for (i, r) in old.iter().enumerate() {
        assert_eq!(r, &complete(5 * MIB), "old client {i} (5 MiB)");
    }
    for (i, r) in new.iter().enumerate() {
        assert_eq!(r, &complete(3 * MIB), "new client {i} (3 MiB)");
    }
}

#[test]
fn a_host_that_skipped_the_stage_resets_the_new_generation() {
    if !can_build() {
        return;
    }
    let _s = serial();
    let (old, new) = rotation_across_hosts(true);
    for (i, r) in old.iter().enumerate() {
        assert_eq!(r, &complete(5 * MIB), "old client {i}: connections of the old generation still cross");
    }
    for r in &new {
        let e = r.as_ref().expect_err("a new-generation connection reaching the unstaged host");
        assert!(e.contains("reset"), "ends in a stateless reset: {e}");
    }
}
