//! The library used directly (your own quinn server behind the demux, as in
//! docs/worker.md), and the binary's static files and HTTP/0.9 (`hq-interop`).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// `worker::attach` + an ordinary quinn echo server, in this process, behind the
/// real demux: a raw QUIC client (ALPN "echo") gets its bytes back, the data plane
/// sees the instance placeable after `ready()` and unplaceable after `draining()`,
/// and gone after `close()`.
#[test]
fn own_quinn_server_behind_the_demux() {
    let d = Demux::start("lib");
    let c = cert(&d.dir);
    rt().block_on(async {
        let secrets = worker::Secrets::load(&d.keys_path).expect("keys");
        let id = worker::tls::Identity::load_pem(&c.cert, &c.key).expect("identity");
        let sc = quinn::ServerConfig::with_crypto(worker::tls::server_crypto(id, &[b"echo"]).expect("crypto"));
        let att = worker::attach(&d.data, proto::ServerId(77), &secrets, sc).await.expect("attach");
        let data = Arc::clone(att.socket.data());
        let ep = att.endpoint.clone();
        let server = tokio::spawn(testkit::h3client::serve_echo(ep));
        data.ready().await.expect("ready");
        let dd = &d;
        tokio::task::block_in_place(|| dd.wait_instances("77 placeable", |i| i.iter().any(|x| x.0 == 77 && x.1)));

        let crypto = worker::tls::client_crypto(std::slice::from_ref(&c.der), &[b"echo"]).expect("client crypto");
        let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client");
        client.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let conn = client.connect(d.addr, "localhost").expect("connect").await.expect("handshake");
        for size in [1usize, 1000, 300_000] {
            let msg: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
            let (mut s, mut r) = conn.open_bi().await.expect("open");
            s.write_all(&msg).await.expect("write");
            s.finish().expect("finish");
            let back = r.read_to_end(1 << 20).await.expect("read");
            assert_eq!(back, msg);
        }
        // Everything arrived through the data connection.
        let stats = att.socket.data().stats.frames.load(std::sync::atomic::Ordering::Relaxed);
        assert!(stats > 0);
        conn.close(0u32.into(), b"");

        data.draining().await.expect("draining");
        tokio::task::block_in_place(|| dd.wait_instances("77 unplaceable", |i| i.iter().any(|x| x.0 == 77 && !x.1)));
        data.close();
        tokio::task::block_in_place(|| dd.wait_instances("77 gone", |i| i.iter().all(|x| x.0 != 77)));
        server.abort();
        client.wait_idle().await;
    });
}

/// Static files from --root over HTTP/3 (and no escaping it), /health, HEAD, 405.
#[test]
fn static_files_health_and_methods() {
    let d = Demux::start("static");
    let c = cert(&d.dir);
    let root = d.dir.join("www");
    std::fs::create_dir_all(root.join("sub")).expect("root");
    let file: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("sub/file.bin"), &file).expect("file");
    std::fs::write(d.dir.join("secret"), b"secret").expect("secret");
    let root_s = root.to_string_lossy().to_string();
    let _w = Worker::start(&d, &c, 5, &["--root", &root_s]);
    d.wait_instances("placeable", |i| i.iter().any(|x| x.1));
    rt().block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, d.addr).await.expect("connect");
        let r = h.get("/sub/file.bin").await.expect("file");
        assert_eq!((r.status, r.len, r.server_id), (200, file.len() as u64, 5));
        for bad in ["/../secret", "/sub/../../secret", "/nope"] {
            let r = h.get(bad).await.expect("response");
            assert!(r.status == 403 || r.status == 404, "{bad}: {}", r.status);
        }
        let r = h.get("/health").await.expect("health");
        assert_eq!(r.status, 200);
        let r = h.get("/bytes/notanumber").await.expect("bad N");
        assert_eq!(r.status, 400);
        h.close();
        ep.wait_idle().await;
    });
}

/// HTTP/0.9 over QUIC (ALPN hq-interop), as the QUIC interop runner uses it.
#[test]
fn hq_interop_get() {
    let d = Demux::start("hq");
    let c = cert(&d.dir);
    let _w = Worker::start(&d, &c, 6, &[]);
    d.wait_instances("placeable", |i| i.iter().any(|x| x.1));
    rt().block_on(async {
        let crypto = worker::tls::client_crypto(std::slice::from_ref(&c.der), &[b"hq-interop"]).expect("crypto");
        let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client");
        client.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let conn = client.connect(d.addr, "localhost").expect("connect").await.expect("handshake");
        let (mut s, mut r) = conn.open_bi().await.expect("open");
        s.write_all(b"GET /bytes/100000\r\n").await.expect("write");
        s.finish().expect("finish");
        let body = tokio::time::timeout(Duration::from_secs(10), r.read_to_end(1 << 20))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(body.len(), 100_000);
        assert!(body.iter().enumerate().all(|(i, b)| *b == i as u8));
        conn.close(0u32.into(), b"");
        client.wait_idle().await;
    });
}

/// `--server-id-from-controller`: the worker says Hello, takes its server id and
/// every secret from Assign (an in-test controller here),
/// serves through the demux under that id, and reports Ready and Draining to the
/// controller as well as to the data plane.
#[test]
fn registers_with_a_controller() {
    use proto::wire::{Message, Registration};
    use std::os::fd::AsFd;
    let d = Demux::start("ctl");
    let c = cert(&d.dir);
    let ctl_path = d.dir.join("ctl.sock");
    let listener = sys::seqpacket::listen(&ctl_path, 64).expect("listen");
    let keys = d.keys.clone();
    let controller = std::thread::spawn(move || {
        let conn = sys::seqpacket::accept(listener.as_fd()).expect("accept");
        let mut buf = vec![0u8; 4096];
        let mut read = |conn: &std::os::fd::OwnedFd| {
            let r = sys::seqpacket::recv_record(conn.as_fd(), &mut buf, 0).expect("recv");
            Registration::decode(&buf[..r.len]).expect("decode")
        };
        let hello = read(&conn);
        assert!(matches!(hello, Registration::Hello { .. }), "{hello:?}");
        let welcome = Registration::Welcome { version: proto::wire::PROTOCOL_VERSION, caps: 0 };
        sys::seqpacket::send_record(conn.as_fd(), &Message::to_record(&welcome), &[], 0).expect("Welcome");
        let assign = Registration::Assign {
            server_id: proto::ServerId(501),
            keys: keys.keys.clone(),
            reset_key: keys.reset_key,
            token_key: keys.token_key,
        };
        sys::seqpacket::send_record(conn.as_fd(), &Message::to_record(&assign), &[], 0).expect("Assign");
        let ready = read(&conn);
        let draining = read(&conn);
        (ready, draining)
    });
    let log = d.dir.join("wctl.log");
    let mut child = std::process::Command::new(WORKER)
        .arg("--server-id-from-controller")
        .arg("--control")
        .arg(&ctl_path)
        .arg("--data-socket")
        .arg(&d.data)
        .arg("--cert")
        .arg(&c.cert)
        .arg("--key")
        .arg(&c.key)
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn worker");
    d.wait_instances("501 placeable", |i| i.iter().any(|x| x.0 == 501 && x.1));
    rt().block_on(async {
        let ep = client_endpoint(&c);
        let mut h = H3::connect(&ep, d.addr).await.expect("connect");
        let r = h.get("/bytes/5000").await.expect("request");
        assert_eq!((r.status, r.len, r.server_id), (200, 5000, 501));
        h.close();
        ep.wait_idle().await;
    });
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().expect("wait");
    assert!(st.success(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    let (ready, draining) = controller.join().expect("controller thread");
    assert_eq!((ready, draining), (Registration::Ready, Registration::Draining));
}
