//! Key rotation and live connections (library level, plain loopback UDP, no demux).
//!
//! Two quinn server endpoints built with the worker's `Secrets` (same reset key, one
//! shared `CidKeys`), server ids 1 ("A", the owner) and 2 ("B"), sit behind an in-test
//! relay that routes like the data plane (ADR 0001 routing rules, docs/adr/0002):
//! long headers → A; a short header whose DCID decodes under the live keys to id 1 →
//! A; anything else (a rotated-away generation, cr = 3, another id) is an orphan →
//! B, "any serving instance", which must answer with a stateless reset.
//!
//! - `connection_survives_two_rotations_with_a_cid_lifetime`: CIDs live 1 s, the keys
//!   rotate twice 3 s apart (three lifetimes): the connection keeps echoing, its DCIDs
//!   move to the newest generation and nothing becomes an orphan.
//! - `orphaned_connection_gets_a_stateless_reset`: CIDs never expire, the keys rotate
//!   twice: the client's DCID generation is unknown, its next packet reaches B, and
//!   the client's connection ends with `ConnectionError::Reset` (RFC 9000 §10.3).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proto::cid::{KeySet, ServerId};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use worker::{CidKeys, Secrets};

const A: ServerId = ServerId(1);
const B: ServerId = ServerId(2);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn secrets() -> Secrets {
    let mut seed = [0u8; proto::keyfile::RANDOM_LEN];
    aws_lc_rs::rand::fill(&mut seed).expect("random");
    Secrets::from_key_file(&proto::keyfile::KeyFile::generate(&seed, proto::cid::Prf::HmacSha256))
}

fn fresh_key() -> [u8; 32] {
    let mut k = [0u8; 32];
    aws_lc_rs::rand::fill(&mut k).expect("random");
    k
}

/// What the relay saw.
#[derive(Default)]
struct Seen {
    /// Short-header datagrams routed to A / to B (orphans).
    to_a: AtomicU64,
    orphans: AtomicU64,
    /// `cr` of the last short-header DCID the client sent.
    last_gen: Mutex<Option<u8>>,
}

struct Setup {
    relay: SocketAddr,
    keys: CidKeys,
    seen: Arc<Seen>,
    server_a: quinn::Endpoint,
    _server_b: quinn::Endpoint,
    cert: rustls::pki_types::CertificateDer<'static>,
}

fn server(
    secrets: &Secrets,
    keys: &CidKeys,
    id: ServerId,
    lifetime: Option<Duration>,
    ck: &rcgen::CertifiedKey,
) -> quinn::Endpoint {
    let ident = worker::tls::Identity {
        certs: vec![ck.cert.der().clone()],
        key: rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into()),
    };
    let mut sc = quinn::ServerConfig::with_crypto(worker::tls::server_crypto(ident, &[b"echo"]).expect("crypto"));
    secrets.apply_token_key(&mut sc);
    let ep_cfg = secrets.endpoint_config_with(keys, id, lifetime);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    quinn::Endpoint::new(ep_cfg, Some(sc), sock, Arc::new(quinn::TokioRuntime)).expect("endpoint")
}

fn serve_echo(ep: quinn::Endpoint) {
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    tokio::spawn(async move {
                        if let Ok(data) = recv.read_to_end(1 << 16).await {
                            let _ = send.write_all(&data).await;
                            let _ = send.finish();
                        }
                    });
                }
            });
        }
    });
}

/// The ADR 0001 routing decision for a datagram from the client.
fn route(keys: &KeySet, d: &[u8]) -> Option<bool> {
    let first = *d.first()?;
    if first & 0x80 != 0 {
        return Some(true); // long header: the handshake with A
    }
    let dcid = d.get(1..13)?;
    Some(matches!(keys.decode(dcid), Ok(x) if x.server_id == A))
}

async fn setup(lifetime: Option<Duration>) -> Setup {
    let secrets = secrets();
    let keys = secrets.cid_keys().expect("cid keys");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("rcgen");
    let server_a = server(&secrets, &keys, A, lifetime, &ck);
    let server_b = server(&secrets, &keys, B, lifetime, &ck);
    serve_echo(server_a.clone());
    serve_echo(server_b.clone());
    let (addr_a, addr_b) = (server_a.local_addr().expect("a"), server_b.local_addr().expect("b"));

    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("relay"));
    let to_a = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("relay a"));
    let to_b = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("relay b"));
    let relay = front.local_addr().expect("relay addr");
    let seen = Arc::new(Seen::default());
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    {
        let (front, to_a, to_b, seen, client, keys) =
            (front.clone(), to_a.clone(), to_b.clone(), seen.clone(), client.clone(), keys.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = front.recv_from(&mut buf).await {
                *client.lock().expect("lock") = Some(from);
                let d = &buf[..n];
                let Some(owner) = route(&keys.load(), d) else { continue };
                if d[0] & 0x80 == 0 {
                    *seen.last_gen.lock().expect("lock") = Some(d[1] >> 6);
                    let c = if owner { &seen.to_a } else { &seen.orphans };
                    c.fetch_add(1, Ordering::Relaxed);
                }
                let (s, to) = if owner { (&to_a, addr_a) } else { (&to_b, addr_b) };
                let _ = s.send_to(d, to).await;
            }
        });
    }
    for back in [to_a, to_b] {
        let (front, client) = (front.clone(), client.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, _)) = back.recv_from(&mut buf).await {
                let dest = *client.lock().expect("lock");
                if let Some(c) = dest {
                    let _ = front.send_to(&buf[..n], c).await;
                }
            }
        });
    }
    Setup { relay, keys, seen, server_a, _server_b: server_b, cert: ck.cert.der().clone() }
}

fn client(cert: &rustls::pki_types::CertificateDer<'static>) -> quinn::Endpoint {
    let crypto = worker::tls::client_crypto(std::slice::from_ref(cert), &[b"echo"]).expect("client crypto");
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(10_000))));
    cfg.transport_config(Arc::new(t));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client endpoint");
    ep.set_default_client_config(cfg);
    ep
}

async fn echo(conn: &quinn::Connection, msg: &[u8]) -> Result<Vec<u8>, String> {
    let (mut s, mut r) = conn.open_bi().await.map_err(|e| e.to_string())?;
    s.write_all(msg).await.map_err(|e| e.to_string())?;
    s.finish().map_err(|e| e.to_string())?;
    r.read_to_end(1 << 16).await.map_err(|e| e.to_string())
}

/// Echoes every 100 ms for `d`; each must succeed.
async fn keep_talking(conn: &quinn::Connection, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        let got = tokio::time::timeout(Duration::from_secs(3), echo(conn, b"ping")).await;
        assert_eq!(got, Ok(Ok(b"ping".to_vec())), "echo failed: {:?}", conn.close_reason());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn connection_survives_two_rotations_with_a_cid_lifetime() {
    rt().block_on(async {
        let lifetime = Duration::from_secs(1);
        let s = setup(Some(lifetime)).await;
        let c = client(&s.cert);
        let conn = c.connect(s.relay, "localhost").expect("connect").await.expect("handshake");
        keep_talking(&conn, Duration::from_millis(500)).await;
        let g0 = s.keys.load().newest();
        assert_eq!(*s.seen.last_gen.lock().expect("lock"), Some(g0.get()));
        for round in 1..=2 {
            s.keys.replace(s.keys.load().rotated(fresh_key()));
            // Rotations three lifetimes apart, as docs/worker.md asks.
            keep_talking(&conn, 3 * lifetime).await;
            let newest = s.keys.load().newest();
            assert_eq!(
                *s.seen.last_gen.lock().expect("lock"),
                Some(newest.get()),
                "rotation {round}: the client's DCID should be of the newest generation"
            );
        }
        assert_eq!(s.seen.orphans.load(Ordering::Relaxed), 0, "no datagram of the connection became an orphan");
        assert!(s.seen.to_a.load(Ordering::Relaxed) > 0);
        assert_eq!(s.server_a.open_connections(), 1);
        conn.close(0u32.into(), b"");
    });
}

#[test]
fn orphaned_connection_gets_a_stateless_reset() {
    rt().block_on(async {
        let s = setup(None).await;
        let c = client(&s.cert);
        let conn = c.connect(s.relay, "localhost").expect("connect").await.expect("handshake");
        keep_talking(&conn, Duration::from_millis(300)).await;
        // Two rotations: the connection's CIDs (never replaced) are of a generation no
        // longer live, so its datagrams are orphans and reach B.
        s.keys.replace(s.keys.load().rotated(fresh_key()));
        s.keys.replace(s.keys.load().rotated(fresh_key()));
        let started = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(8), echo(&conn, b"after rotation")).await;
        assert!(matches!(r, Ok(Err(_))), "the request should fail, got {r:?}");
        let why = conn.close_reason();
        assert!(
            matches!(why, Some(quinn::ConnectionError::Reset)),
            "expected a stateless reset, got {why:?} after {:?}",
            started.elapsed()
        );
        assert!(s.seen.orphans.load(Ordering::Relaxed) > 0);
        println!("reset after {:?}, orphans {}", started.elapsed(), s.seen.orphans.load(Ordering::Relaxed));
    });
}
