//! The kernel fast path from the worker's side, against a fake data plane in the test:
//! a SOCK_SEQPACKET listener that answers the worker's `DataHello` with `Welcome`,
//! `Sockets`, `FastSockets` and `Rings { 0, 0 }`. No eBPF: the quinn client talks to the fast
//! socket's port directly, so every datagram of its connection arrives on the fast
//! socket and every reply must leave from it (a quinn client drops datagrams from
//! any other address).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use proto::wire::data::{CAPS_KNOWN, CAP_FAST_PATH, CAP_RINGS};
use proto::wire::{Announce, Data, Message, Window, PROTOCOL_VERSION};
use proto::ServerId;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use worker::datasock::{handshake_on_opts, HandshakeError};
use worker::DataOptions;

const MIB: u64 = 1 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn secrets() -> worker::Secrets {
    let mut random = [0u8; proto::keyfile::RANDOM_LEN];
    for (i, b) in random.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    worker::Secrets::from_key_file(&proto::keyfile::KeyFile::generate(&random, proto::cid::Prf::SipHash24))
}

/// The next control message other than the `Load` heartbeat (sent at once and every
/// 250 ms from the start, so it races with `Ready`).
fn read_control(conn: &OwnedFd) -> Data {
    let mut buf = vec![0u8; 4096];
    loop {
        let r = sys::seqpacket::recv_record(conn.as_fd(), &mut buf, 0).expect("recv");
        assert!(r.len > 0, "worker closed the data connection");
        match Data::decode(&buf[..r.len]).expect("decode") {
            Data::Load { .. } => continue,
            m => return m,
        }
    }
}

fn send(conn: &OwnedFd, m: &Data, fds: &[&UdpSocket]) {
    let fds: Vec<_> = fds.iter().map(|s| s.as_fd()).collect();
    sys::seqpacket::send_record(conn.as_fd(), &Message::to_record(m), &fds, 0).expect("send");
}

/// One data-plane side of the handshake: reads the hello, answers `Sockets` (a UDP
/// socket on 127.0.0.1:0, announced as `listen`, the address the fast socket is
/// bound to, as a real data plane's shared and fast sockets share the listen
/// address), `FastSockets { [listen] }` with `fast`, and `Rings { 0, 0 }`. Closes
/// its copy of every socket, as the data plane does. Returns the hello.
/// `fast: None`: an empty `FastSockets` (fast path not active).
fn answer(conn: &OwnedFd, fast: Option<UdpSocket>) -> Data {
    let hello = read_control(conn);
    send(conn, &Data::Welcome { version: PROTOCOL_VERSION, caps: CAPS_KNOWN }, &[]);
    let shared = UdpSocket::bind("127.0.0.1:0").expect("shared socket");
    let listen = fast.as_ref().map_or(shared.local_addr(), |f| f.local_addr()).expect("listen addr");
    send(conn, &Data::Sockets { addrs: vec![listen] }, &[&shared]);
    match &fast {
        Some(f) => send(conn, &Data::FastSockets { addrs: vec![listen] }, &[f]),
        None => send(conn, &Data::FastSockets { addrs: vec![] }, &[]),
    }
    send(conn, &Data::Rings { count: 0, bytes: 0 }, &[]);
    hello
}

async fn download(c: &Cert, to: SocketAddr) -> Resp {
    let ep = client_endpoint(c);
    let mut h = tokio::time::timeout(Duration::from_secs(10), H3::connect(&ep, to))
        .await
        .unwrap_or_else(|_| panic!("handshake with {to} in time"))
        .expect("connect");
    let r = tokio::time::timeout(Duration::from_secs(20), h.get(&format!("/bytes/{MIB}")))
        .await
        .unwrap_or_else(|_| panic!("download from {to} in time"))
        .expect("download");
    h.close();
    ep.wait_idle().await;
    r
}

/// Whether nothing holds 127.0.0.1:`port` any more (binding it without
/// SO_REUSEPORT succeeds only then), within `within`.
fn port_released(port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A library worker asks for the fast path, serves a 1 MiB download entirely over
/// its fast socket (counted as `fast_datagrams`, nothing on the data connection),
/// and after the data plane restarts swaps to the new data plane's fast socket and
/// closes the old one.
#[test]
fn serves_over_the_fast_socket_and_swaps_it_on_reconnect() {
    let dir = temp_dir("fast");
    let c = cert(&dir);
    let path = dir.join("d.sock");
    let listener = sys::seqpacket::listen(&path, 64).expect("listen");
    let fast1 = UdpSocket::bind("127.0.0.1:0").expect("fast socket 1");
    let fast2 = UdpSocket::bind("127.0.0.1:0").expect("fast socket 2");
    let (p1, p2) = (fast1.local_addr().expect("p1"), fast2.local_addr().expect("p2"));
    let (restart_tx, restart_rx) = mpsc::channel::<()>();
    let (hello_tx, hello_rx) = mpsc::channel::<Data>();
    let plane = std::thread::spawn(move || {
        let conn = sys::seqpacket::accept(listener.as_fd()).expect("accept 1");
        hello_tx.send(answer(&conn, Some(fast1))).expect("hello 1");
        assert_eq!(read_control(&conn), Data::Ready);
        restart_rx.recv().expect("restart signal");
        drop(conn); // the data plane dies
        let conn = sys::seqpacket::accept(listener.as_fd()).expect("accept 2");
        hello_tx.send(answer(&conn, Some(fast2))).expect("hello 2");
        assert_eq!(read_control(&conn), Data::Ready, "Ready resent after the reconnection");
        restart_rx.recv().expect("restart signal 2");
        drop(conn);
        // A data plane without the fast path: empty FastSockets.
        let conn = sys::seqpacket::accept(listener.as_fd()).expect("accept 3");
        hello_tx.send(answer(&conn, None)).expect("hello 3");
        assert_eq!(read_control(&conn), Data::Ready);
        // Stay up until the test ends (it drops the sender).
        let _ = restart_rx.recv();
    });

    rt().block_on(async {
        let id = worker::tls::Identity::load_pem(&c.cert, &c.key).expect("identity");
        let sc = quinn::ServerConfig::with_crypto(worker::tls::server_crypto(id, &[b"h3"]).expect("crypto"));
        let opts = DataOptions::default();
        assert!(opts.fast_path && opts.rings, "both asked by default");
        let att = worker::attach_with(&path, ServerId(9), &secrets(), sc, opts).await.expect("attach");
        let hello = hello_rx.recv().expect("hello");
        match hello {
            Data::DataHello { announce, server_id } => {
                assert_eq!(server_id, ServerId(9));
                assert_eq!(announce.window, sys::protocol::window());
                assert_ne!(announce.caps & CAP_FAST_PATH, 0, "CAP_FAST_PATH asked");
                assert_ne!(announce.caps & CAP_RINGS, 0, "CAP_RINGS asked (this plane grants none)");
            }
            other => panic!("expected DataHello, got {other:?}"),
        }
        assert_eq!(att.socket.fast().addrs().collect::<Vec<_>>(), vec![p1]);
        let ctx = worker::h3_server::Ctx::new(
            worker::h3_server::ServerOptions::new(ServerId(9)),
            worker::drain::Drain::new(),
        )
        .expect("ctx");
        let server = tokio::spawn(worker::h3_server::serve(att.endpoint.clone(), ctx));
        att.socket.data().ready().await.expect("ready");
        let stats = &att.socket.data().stats;

        let r = download(&c, p1).await;
        assert_eq!((r.status, r.len, r.pattern_ok), (200, MIB, true));
        let fast_rx = stats.fast_datagrams.load(Ordering::Relaxed);
        assert!(fast_rx > 0, "datagrams received on the fast socket");
        assert!(stats.fast_bytes.load(Ordering::Relaxed) > 0);
        assert!(stats.fast_transmits.load(Ordering::Relaxed) > 0, "replies from the fast socket");
        assert_eq!(stats.frames.load(Ordering::Relaxed), 0, "nothing came over the data connection");
        assert!(!port_released(p1.port(), Duration::ZERO), "the worker holds the fast socket");

        // The data plane restarts and hands out a different fast socket.
        restart_tx.send(()).expect("restart");
        let hello = tokio::task::block_in_place(|| hello_rx.recv_timeout(Duration::from_secs(10))).expect("hello 2");
        assert!(
            matches!(hello, Data::DataHello { announce, .. } if announce.caps & CAP_FAST_PATH != 0),
            "the reconnection asks for the fast path again: {hello:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while att.socket.fast().addrs().collect::<Vec<_>>() != vec![p2] {
            assert!(Instant::now() < deadline, "fast socket not replaced: {:?}", att.socket.fast());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let r = download(&c, p2).await;
        assert_eq!((r.status, r.len, r.pattern_ok), (200, MIB, true));
        assert!(stats.fast_datagrams.load(Ordering::Relaxed) > fast_rx, "the new fast socket is read");
        assert_eq!(stats.frames.load(Ordering::Relaxed), 0);
        assert_eq!(stats.reconnects.load(Ordering::Relaxed), 1);
        // The old fast socket is closed: nothing holds its port any more.
        assert!(
            tokio::task::block_in_place(|| port_released(p1.port(), Duration::from_secs(2))),
            "the old fast socket ({p1}) is still open"
        );
        assert!(!port_released(p2.port(), Duration::ZERO), "the new one is held");

        // Restarted again, without the fast path: the worker drops its fast socket.
        restart_tx.send(()).expect("restart 2");
        let hello = tokio::task::block_in_place(|| hello_rx.recv_timeout(Duration::from_secs(10))).expect("hello 3");
        assert!(matches!(hello, Data::DataHello { announce, .. } if announce.caps & CAP_FAST_PATH != 0), "{hello:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.reconnects.load(Ordering::Relaxed) < 2 {
            assert!(Instant::now() < deadline, "second reconnection");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(att.socket.fast().is_empty(), "{:?}", att.socket.fast());
        assert!(
            tokio::task::block_in_place(|| port_released(p2.port(), Duration::from_secs(2))),
            "the fast socket ({p2}) is still open without a fast path"
        );
        server.abort();
        att.endpoint.close(0u32.into(), b"");
        att.socket.data().close();
    });
    drop(restart_tx);
    plane.join().expect("fake data plane");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the `worker` binary against a listener that only reads the hello.
fn binary_hello(dir: &Path, extra: &[&str]) -> Data {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let keys = dir.join("keys");
    let random = [5u8; proto::keyfile::RANDOM_LEN];
    std::fs::write(&keys, proto::keyfile::KeyFile::generate(&random, proto::cid::Prf::SipHash24).to_text())
        .expect("key file");
    let path = dir.join(format!("d{}.sock", CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let _ = std::fs::remove_file(&path);
    let listener = sys::seqpacket::listen(&path, 64).expect("listen");
    let log = dir.join("w.log");
    let mut child = std::process::Command::new(WORKER)
        .args(["--server-id", "5", "--keys"])
        .arg(&keys)
        .arg("--data-socket")
        .arg(&path)
        .args(extra)
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn worker");
    rustix::net::sockopt::set_socket_timeout(
        &listener,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(20)),
    )
    .expect("timeout");
    let conn = sys::seqpacket::accept(listener.as_fd());
    let hello = conn.map(|c| read_control(&c));
    let _ = child.kill();
    let _ = child.wait();
    hello.unwrap_or_else(|e| panic!("no hello ({e}): {}", std::fs::read_to_string(&log).unwrap_or_default()))
}

/// `--fast-path off` leaves CAP_FAST_PATH out and `--rings off` CAP_RINGS (both off:
/// no capability); by default the worker asks for both. No environment variable
/// changes that. The hello announces this build's protocol window, or with the
/// hidden test flag `--protocol-version V` (this build's to 2 above) V and V-1.
#[test]
fn fast_path_and_rings_flags_set_the_capabilities() {
    let dir = temp_dir("fastflag");
    let hello_in = |window, caps| Data::DataHello { announce: Announce { window, caps }, server_id: ServerId(5) };
    let hello = |caps| hello_in(Window::OWN, caps);
    assert_eq!(binary_hello(&dir, &[]), hello(CAP_FAST_PATH | CAP_RINGS), "both by default");
    assert_eq!(binary_hello(&dir, &["--fast-path", "off", "--rings", "off"]), hello(0));
    let v = PROTOCOL_VERSION + 2;
    assert_eq!(
        binary_hello(&dir, &["--protocol-version", &v.to_string()]),
        hello_in(Window { oldest: v - 1, newest: v }, CAP_FAST_PATH | CAP_RINGS),
        "relabelled"
    );
    for bad in [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 3] {
        let out = std::process::Command::new(WORKER)
            .args(["--protocol-version", &bad.to_string(), "--server-id", "5"])
            .output()
            .expect("run worker");
        assert_eq!(out.status.code(), Some(2), "--protocol-version {bad} is refused");
        assert!(String::from_utf8_lossy(&out.stderr).contains("a test relabelling"), "{out:?}");
    }
    let help = std::process::Command::new(WORKER).arg("--help").output().expect("worker --help");
    assert!(!String::from_utf8_lossy(&help.stdout).contains("protocol-version"), "the test flag is hidden");
    assert_eq!(binary_hello(&dir, &["--fast-path", "off"]), hello(CAP_RINGS));
    assert_eq!(binary_hello(&dir, &["--rings", "off"]), hello(CAP_FAST_PATH));
    assert_eq!(binary_hello(&dir, &["--fast-path", "on", "--rings", "on"]), hello(CAP_FAST_PATH | CAP_RINGS));
    for bad in [["--fast-path", "maybe"], ["--rings", "1"]] {
        let st = std::process::Command::new(WORKER)
            .args(bad)
            .args(["--server-id", "5"])
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run worker");
        assert!(!st.success(), "{bad:?}: on|off only");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the worker's handshake against `plane` (the data plane's end of a socket
/// pair, given the hello it read).
fn handshake_against(
    opts: DataOptions,
    plane: impl FnOnce(&OwnedFd, Data) + Send + 'static,
) -> Result<worker::datasock::Handshake, HandshakeError> {
    let (w, p) = sys::seqpacket::pair().expect("pair");
    let t = std::thread::spawn(move || {
        let hello = read_control(&p);
        plane(&p, hello);
        // Keep the connection open until the worker is done with it.
        let mut b = [0u8; 64];
        let _ = sys::seqpacket::recv_record(p.as_fd(), &mut b, 0);
    });
    let r = handshake_on_opts(w, ServerId(3), Duration::from_secs(5), opts);
    // On error the worker's end is closed already (the plane's read returns 0); on
    // success a record ends the plane's wait.
    if let Ok(h) = &r {
        sys::seqpacket::send_record(h.conn.as_fd(), &Message::to_record(&Data::Ready), &[], 0).expect("Ready");
    }
    t.join().expect("plane thread");
    r
}

/// `FastSockets` that announces an address but carries no descriptor is a clear
/// handshake error (no panic); an empty `FastSockets`, or none at all (a data plane
/// that does not know CAP_FAST_PATH), means no fast path; a non-UDP descriptor is
/// refused.
#[test]
fn fast_sockets_handshake_checks() {
    let fast = || DataOptions { rings: false, fast_path: true };
    let sockets = |p: &OwnedFd| {
        send(p, &Data::Welcome { version: PROTOCOL_VERSION, caps: CAPS_KNOWN }, &[]);
        let s = UdpSocket::bind("127.0.0.1:0").expect("udp");
        send(p, &Data::Sockets { addrs: vec![s.local_addr().expect("addr")] }, &[&s]);
    };
    let a: SocketAddr = "127.0.0.1:4433".parse().expect("addr");

    let r = handshake_against(fast(), move |p, hello| {
        assert!(matches!(hello, Data::DataHello { announce, .. } if announce.caps & CAP_FAST_PATH != 0));
        sockets(p);
        // Nothing after it: the worker hangs up at once (a send would race EPIPE).
        send(p, &Data::FastSockets { addrs: vec![a] }, &[]);
    });
    match r {
        Err(HandshakeError::Protocol(m)) => {
            assert!(m.contains("FastSockets lists 1 addresses but carries 0 descriptors"), "{m}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }

    let h = handshake_against(fast(), move |p, _| {
        sockets(p);
        send(p, &Data::FastSockets { addrs: vec![] }, &[]);
        send(p, &Data::Rings { count: 0, bytes: 0 }, &[]);
    })
    .expect("empty FastSockets");
    assert!(h.fast.is_empty() && h.sockets.len() == 1);

    let h = handshake_against(fast(), move |p, _| {
        sockets(p);
        send(p, &Data::Rings { count: 0, bytes: 0 }, &[]);
    })
    .expect("no FastSockets at all");
    assert!(h.fast.is_empty() && h.rings.is_empty());

    let h = handshake_against(fast(), move |p, _| {
        sockets(p);
        let f = UdpSocket::bind("127.0.0.1:0").expect("udp");
        send(p, &Data::FastSockets { addrs: vec![f.local_addr().expect("addr")] }, &[&f]);
        send(p, &Data::Rings { count: 0, bytes: 0 }, &[]);
    })
    .expect("one fast socket");
    assert_eq!(h.fast.len(), 1);

    let r = handshake_against(fast(), move |p, _| {
        sockets(p);
        let (x, _y) = sys::seqpacket::pair().expect("pair");
        let fds = [x.as_fd()];
        sys::seqpacket::send_record(p.as_fd(), &Message::to_record(&Data::FastSockets { addrs: vec![a] }), &fds, 0)
            .expect("send");
    });
    assert!(matches!(&r, Err(HandshakeError::Protocol(m)) if m.contains("not a UDP socket")), "{r:?}");

    // Not asked for: FastSockets is out of order.
    let r = handshake_against(DataOptions { rings: true, fast_path: false }, move |p, hello| {
        assert!(matches!(hello, Data::DataHello { announce, .. } if announce.caps == CAP_RINGS));
        sockets(p);
        send(p, &Data::FastSockets { addrs: vec![] }, &[]);
    });
    assert!(matches!(&r, Err(HandshakeError::Protocol(_))), "{r:?}");

    // A data plane whose Welcome lacks CAP_FAST_PATH (a build that does not know it;
    // unknown bits set): no fast path, and FastSockets from it would be out of order.
    let unknown = 0xffff_0000_0000_0000;
    let no_fast = move |p: &OwnedFd| {
        send(p, &Data::Welcome { version: PROTOCOL_VERSION, caps: CAP_RINGS | unknown }, &[]);
        let s = UdpSocket::bind("127.0.0.1:0").expect("udp");
        send(p, &Data::Sockets { addrs: vec![s.local_addr().expect("addr")] }, &[&s]);
    };
    let h = handshake_against(fast(), move |p, _| {
        no_fast(p);
        send(p, &Data::Rings { count: 0, bytes: 0 }, &[]);
    })
    .expect("no fast path from that data plane");
    assert!(h.fast.is_empty());
    assert_eq!(h.caps, 0, "the capabilities in effect: both announced and known");
    let r = handshake_against(fast(), move |p, _| {
        no_fast(p);
        send(p, &Data::FastSockets { addrs: vec![] }, &[]);
    });
    assert!(matches!(&r, Err(HandshakeError::Protocol(m)) if m.contains("FastSockets out of order")), "{r:?}");
}
