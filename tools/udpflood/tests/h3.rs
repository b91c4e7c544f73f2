//! `--latency-h3` against a tiny in-test HTTP/3 server (quinn + h3, self-signed cert).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use bytes::Bytes;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

const BIN: &str = env!("CARGO_BIN_EXE_udpflood");

use testkit::json_num;

/// Serves `GET /...` with 200 and `len` bytes of body on every request.
async fn server(len: usize) -> SocketAddr {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let qc = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let ep = quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(qc)), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = ep.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok(mut h3c) = h3::server::builder().build::<_, Bytes>(h3_quinn::Connection::new(conn)).await else {
                    return;
                };
                while let Ok(Some(resolver)) = h3c.accept().await {
                    tokio::spawn(async move {
                        let Ok((_req, mut stream)) = resolver.resolve_request().await else { return };
                        let resp =
                            http::Response::builder().status(200).header("content-length", len).body(()).unwrap();
                        if stream.send_response(resp).await.is_err() {
                            return;
                        }
                        if len > 0 {
                            let _ = stream.send_data(Bytes::from(vec![0x61u8; len])).await;
                        }
                        let _ = stream.finish().await;
                    });
                }
            });
        }
    });
    addr
}

#[test]
fn h3_latency_over_real_quic_connections() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let addr = rt.block_on(server(1000));
    let url = format!("https://127.0.0.1:{}/bytes/1000", addr.port());
    let hgrm = std::env::temp_dir().join(format!("udpflood-h3-{}.hgrm", std::process::id()));
    let out = Command::new(BIN)
        .args(["--latency-h3", "--url", &url, "--connections", "3", "--requests", "40", "--duration", "20"])
        .args(["--json", "--hgrm-out", hgrm.to_str().unwrap()])
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{json}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_num(&json, "connections_ok"), 3.0, "{json}");
    assert_eq!(json_num(&json, "requests_ok"), 120.0, "{json}");
    assert_eq!(json_num(&json, "requests_failed"), 0.0, "{json}");
    let (p50, p99, max) = (json_num(&json, "p50_us"), json_num(&json, "p99_us"), json_num(&json, "max_us"));
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max && max < 5_000_000.0, "{json}");
    assert!(json_num(&json, "handshake_p50_us") > 0.0);
    let text = std::fs::read_to_string(&hgrm).unwrap();
    assert!(text.contains("Total count    =          120]"), "{text}");
    let _ = std::fs::remove_file(hgrm);
    drop(rt);
}

#[test]
fn h3_nothing_listening_fails_cleanly() {
    // A bound but silent UDP socket: the handshake times out.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let url = format!("https://127.0.0.1:{}/", silent.local_addr().unwrap().port());
    let out = Command::new(BIN)
        .args(["--latency-h3", "--url", &url, "--requests", "1", "--request-timeout", "0.5", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("no request succeeded"), "{err}");
    let json = String::from_utf8_lossy(&out.stdout);
    assert_eq!(json_num(&json, "connections_failed"), 1.0, "{json}");
}
