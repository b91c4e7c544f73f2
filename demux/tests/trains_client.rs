//! The train defect as a real client meets it (docs/adr/0004-kernel-fast-path.md,
//! "Trains"): one quinn client endpoint (one UDP socket) holds two connections placed
//! on different workers and downloads on both at once, across a veth pair whose
//! receiving side coalesces datagrams with GRO. The client's packets of the two
//! connections share one 4-tuple and are often the same size (ACKs), so GRO joins
//! them into trains whatever their DCIDs. Steered by its first datagram, such a train
//! would hand the other connection's packets to the wrong worker, which answers with
//! a stateless reset and kills a healthy connection.
//!
//! The appliance (controller, data plane, two workers) runs in namespace b
//! (198.18.100.2), the client in namespace a; both made and removed by the test.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime, UdpPoller};
use std::collections::HashSet;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use support::*;
use testkit::netns::{in_netns, VethPair};

const MIB: u64 = 1 << 20;
const PORT: u16 = 4433;

/// The client's UDP socket, watching for stateless resets (RFC 9000 §10.3): it
/// records the DCID of every short header the client sends and counts received
/// datagrams whose last 16 bytes are the reset token of one of them. The workers'
/// tokens are HMAC-SHA-256(reset key, DCID)[..16] under the cluster's shared reset
/// key (`worker::Secrets::reset_hmac`), so this sees a reset from any worker.
struct Watched {
    inner: Arc<dyn AsyncUdpSocket>,
    key: Arc<aws_lc_rs::hmac::Key>,
    dcids: Mutex<HashSet<[u8; 12]>>,
    tokens: Mutex<HashSet<[u8; 16]>>,
    received: AtomicU64,
    resets: AtomicU64,
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched").field("resets", &self.resets).finish()
    }
}

impl AsyncUdpSocket for Watched {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
        for d in t.contents.chunks(seg) {
            if d.len() >= 13 && d[0] & 0x80 == 0 {
                let dcid: [u8; 12] = d[1..13].try_into().unwrap();
                if self.dcids.lock().unwrap().insert(dcid) {
                    let tag = aws_lc_rs::hmac::sign(&self.key, &dcid);
                    self.tokens.lock().unwrap().insert(tag.as_ref()[..16].try_into().unwrap());
                }
            }
        }
        self.inner.try_send(t)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let r = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(n)) = &r {
            let tokens = self.tokens.lock().unwrap();
            for (m, b) in meta.iter().zip(bufs.iter()).take(*n) {
                for d in b[..m.len].chunks(m.stride.max(1)) {
                    self.received.fetch_add(1, Ordering::Relaxed);
                    if d.len() >= 21 && d[0] & 0x80 == 0 && tokens.contains(&d[d.len() - 16..]) {
                        self.resets.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        r
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// Two connections of one client endpoint, on different workers, download 8 MiB
/// each at once through the kernel fast path with GRO trains: both complete byte
/// for byte, no stateless reset reaches the client, and the status shows the
/// program sent mixed trains to the data plane (so the test met the defect's
/// conditions) and kept one connection's trains on the fast path.
#[test]
fn two_connections_on_one_client_socket_download_through_gro_trains() {
    let _serial = serial();
    if !testkit::netns::available() {
        return;
    }
    let pair = VethPair::new("trains-c");
    pair.gro_on_b(200_000);
    let listen = format!("{}:{PORT}", pair.b_addr);
    let c = Controller::start_in_netns("trains-client", 2, &pair.b, &listen, None, &[]);
    let fp = c.lb_wait()["fast_path"].clone();
    if fp["active"].as_bool() != Some(true) || fp["program"] != "gso-walk" {
        testkit::skip(&format!("the fast path's gso-walk program does not run here: {fp}"));
        return;
    }
    let keys = proto::keyfile::KeyFile::parse(&std::fs::read_to_string(c.state.join("keys")).unwrap()).unwrap();
    let key = worker::Secrets::from_key_file(&keys).reset_hmac();
    let server: SocketAddr = listen.parse().unwrap();
    let a_addr = pair.a_addr;
    let std_sock = in_netns(&pair.a, move || std::net::UdpSocket::bind((a_addr, 0)).unwrap());
    let root = c.cert.der.clone();

    let rt = runtime();
    let (watched, results) = rt.block_on(async move {
        let runtime = Arc::new(quinn::TokioRuntime);
        let watched = Arc::new(Watched {
            inner: runtime.wrap_udp_socket(std_sock).unwrap(),
            key,
            dcids: Mutex::default(),
            tokens: Mutex::default(),
            received: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        });
        let mut ep =
            quinn::Endpoint::new_with_abstract_socket(quinn::EndpointConfig::default(), None, watched.clone(), runtime)
                .unwrap();
        let mut cfg =
            quinn::ClientConfig::new(Arc::new(testkit::h3client::client_crypto(std::slice::from_ref(&root), &[b"h3"])));
        let mut t = quinn::TransportConfig::default();
        t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
        cfg.transport_config(Arc::new(t));
        ep.set_default_client_config(cfg);
        // Connections until two are on different workers (placement spreads them).
        let mut on: Vec<(u16, H3)> = Vec::new();
        for _ in 0..20 {
            let mut h = H3::connect(&ep, server).await.expect("connect");
            let id = h.get("/bytes/1000").await.expect("GET").server_id;
            if on.iter().any(|(i, _)| *i == id) {
                h.close();
            } else {
                on.push((id, h));
            }
            if on.len() == 2 {
                break;
            }
        }
        assert_eq!(on.len(), 2, "no two connections on different workers");
        let (mut h1, mut h2) = (on.remove(0), on.remove(0));
        let path = format!("/bytes/{}", 8 * MIB);
        let (r1, r2) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(60), h1.1.get(&path)),
            tokio::time::timeout(Duration::from_secs(60), h2.1.get(&path))
        );
        let closed = [h1.1.conn.close_reason(), h2.1.conn.close_reason()];
        h1.1.close();
        h2.1.close();
        ep.wait_idle().await;
        (watched, (h1.0, h2.0, r1, r2, closed))
    });
    let (id1, id2, r1, r2, closed) = results;
    assert_ne!(id1, id2);
    for (id, r) in [(id1, r1), (id2, r2)] {
        let r = r
            .unwrap_or_else(|_| panic!("download from worker {id} timed out"))
            .unwrap_or_else(|e| panic!("download from worker {id}: {e}; {}", c.logs()));
        assert_eq!((r.status, r.len, r.pattern_ok, r.server_id), (200, 8 * MIB, true, id));
    }
    assert_eq!(closed, [None, None], "both connections were alive after their downloads");
    assert!(watched.received.load(Ordering::Relaxed) > 1000);
    assert_eq!(watched.resets.load(Ordering::Relaxed), 0, "stateless resets reached the client");
    let fp = c.lb_wait()["fast_path"].clone();
    let n = |k: &str| fp.pointer(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    assert!(n("/to_demux/train_to_shard") > 0, "no mixed GRO train: the test did not meet the defect: {fp}");
    assert!(n("/datagrams") > 0, "the fast path carried nothing: {fp}");
    eprintln!(
        "fast path: {} datagrams to workers, trains kept whole {}, mixed trains to the data plane {}; client got {} datagrams",
        n("/datagrams"),
        n("/train_fast"),
        n("/to_demux/train_to_shard"),
        watched.received.load(Ordering::Relaxed)
    );
}
