//! A test TLS identity and the quinn + h3 client the end-to-end tests load servers with.

use bytes::Buf;
use rustls::pki_types::CertificateDer;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A self-signed `localhost` identity, written as PEM files.
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: CertificateDer<'static>,
}

/// A fresh identity in `dir` (cert.pem, key.pem).
pub fn cert(dir: &Path) -> Cert {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("rcgen");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.key_pair.serialize_pem()).expect("write key");
    Cert { cert, key, der: ck.cert.der().clone() }
}

/// QUIC client crypto (TLS 1.3, aws-lc-rs) trusting `roots`, offering `alpns`.
pub fn client_crypto(roots: &[CertificateDer<'static>], alpns: &[&[u8]]) -> quinn::crypto::rustls::QuicClientConfig {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).expect("trust root");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(store)
        .with_no_client_auth();
    tls.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
    quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC client TLS config")
}

/// A client endpoint on 127.0.0.1 trusting `c`, ALPN h3, 30 s idle timeout.
pub fn client_endpoint(c: &Cert) -> quinn::Endpoint {
    client_endpoint_on(c, "127.0.0.1:0")
}

/// [`client_endpoint`] bound to `bind`.
pub fn client_endpoint_on(c: &Cert, bind: &str) -> quinn::Endpoint {
    endpoint(&c.der, bind.parse().expect("addr"))
}

/// A client endpoint on `bind` trusting `root`, ALPN h3, 30 s idle timeout.
pub fn endpoint(root: &CertificateDer<'static>, bind: SocketAddr) -> quinn::Endpoint {
    let mut cfg = quinn::ClientConfig::new(Arc::new(client_crypto(std::slice::from_ref(root), &[b"h3"])));
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    cfg.transport_config(Arc::new(t));
    let mut ep = quinn::Endpoint::client(bind).expect("client endpoint");
    ep.set_default_client_config(cfg);
    ep
}

/// A multi-threaded tokio runtime of two workers (the machines tests run on are small).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// One HTTP/3 connection.
pub struct H3 {
    pub conn: quinn::Connection,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

/// A completed response. `pattern_ok`: a `/bytes/N` body had byte i == i % 256.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub len: u64,
    pub server_id: u16,
    pub pattern_ok: bool,
}

/// Where a request failed: before the response head (not accepted: safe to retry)
/// or after it (an accepted request lost).
#[derive(Debug)]
pub enum ReqError {
    BeforeHead(String),
    AfterHead(String),
}

impl std::fmt::Display for ReqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// How long [`H3::connect`] waits for the handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

fn header<T: std::str::FromStr>(resp: &http::Response<()>, name: &str) -> Option<T> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

impl H3 {
    /// Connects to `addr` as `localhost` (at most [`CONNECT_TIMEOUT`]) and starts h3.
    pub async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> anyhow::Result<H3> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, ep.connect(addr, "localhost")?).await??;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(H3 { conn, send, driver })
    }

    /// GET `path`. `on_progress(bytes so far)` runs after every chunk; with `rate`,
    /// the body is read at most `rate` bytes per second (a slow reader keeps the
    /// download in flight; flow control slows the server).
    pub async fn get_full(
        &mut self,
        path: &str,
        rate: Option<u64>,
        mut on_progress: impl FnMut(u64),
    ) -> Result<Resp, ReqError> {
        let started = tokio::time::Instant::now();
        let before = |e: &dyn std::fmt::Display| ReqError::BeforeHead(e.to_string());
        let req = http::Request::get(format!("https://localhost{path}")).body(()).map_err(|e| before(&e))?;
        let mut s = self.send.send_request(req).await.map_err(|e| before(&e))?;
        s.finish().await.map_err(|e| before(&e))?;
        let resp = s.recv_response().await.map_err(|e| before(&e))?;
        let server_id = header(&resp, "x-server-id").unwrap_or(0);
        let want: Option<u64> = header(&resp, "content-length");
        let (mut len, mut pattern_ok) = (0u64, true);
        while let Some(mut chunk) = s.recv_data().await.map_err(|e| ReqError::AfterHead(e.to_string()))? {
            while chunk.has_remaining() {
                let b = chunk.chunk();
                if pattern_ok && path.starts_with("/bytes/") {
                    pattern_ok = b.iter().enumerate().all(|(i, x)| *x == ((len + i as u64) % 256) as u8);
                }
                len += b.len() as u64;
                let n = b.len();
                chunk.advance(n);
            }
            on_progress(len);
            if let Some(rate) = rate {
                tokio::time::sleep_until(started + Duration::from_secs_f64(len as f64 / rate as f64)).await;
            }
        }
        match want {
            Some(w) if w != len => Err(ReqError::AfterHead(format!("body {len} bytes, content-length {w}"))),
            _ => Ok(Resp { status: resp.status().as_u16(), len, server_id, pattern_ok }),
        }
    }

    /// Another handle to send requests on this connection while one is in flight
    /// (h3's `SendRequest` is a cheap clone). After the server's GOAWAY
    /// (RFC 9114 §5.2) its `send_request` fails with `RemoteClosing`.
    pub fn sender(&self) -> h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes> {
        self.send.clone()
    }

    pub async fn get(&mut self, path: &str) -> Result<Resp, ReqError> {
        self.get_full(path, None, |_| {}).await
    }

    /// GET `path`, calling `on_progress(bytes so far)` after every chunk.
    pub async fn get_with(&mut self, path: &str, on_progress: impl FnMut(u64)) -> Result<Resp, ReqError> {
        self.get_full(path, None, on_progress).await
    }

    /// GET `path`, reading at most `rate` bytes per second when given.
    pub async fn get_paced(&mut self, path: &str, rate: Option<u64>) -> Result<Resp, ReqError> {
        self.get_full(path, rate, |_| {}).await
    }

    /// Closes the connection (application code 0x100) and stops the h3 driver.
    pub fn close(self) {
        self.conn.close(quinn::VarInt::from_u32(0x100), b"");
        self.driver.abort();
    }
}

/// Serves every connection `ep` accepts: each bidirectional stream gets its bytes
/// (up to 1 MiB) echoed back. Returns when the endpoint closes.
pub async fn serve_echo(ep: quinn::Endpoint) {
    while let Some(incoming) = ep.accept().await {
        tokio::spawn(echo_connection(incoming));
    }
}

async fn echo_connection(incoming: quinn::Incoming) {
    let Ok(conn) = incoming.await else { return };
    while let Ok((send, recv)) = conn.accept_bi().await {
        tokio::spawn(echo_stream(send, recv));
    }
}

async fn echo_stream(mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    if let Ok(data) = recv.read_to_end(1 << 20).await {
        let _ = send.write_all(&data).await;
        let _ = send.finish();
        let _ = send.stopped().await;
    }
}
