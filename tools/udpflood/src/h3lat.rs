//! `--latency-h3`: HTTP/3 request latency over N real QUIC connections (quinn + h3),
//! each from its own loopback source port, requests sent one after another on each
//! connection (closed loop), all connections at once.

use anyhow::{anyhow, Context};
use bytes::Buf;
use hdrhistogram::Histogram;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A certificate verifier that ACCEPTS ANY CERTIFICATE. Insecure, for benchmarks only:
/// it lets udpflood measure a server with a self-signed certificate on loopback. It
/// still checks the handshake signature against the (unverified) certificate, so the
/// client does the same cryptographic work as a real one.
#[derive(Debug)]
pub struct InsecureAcceptAnyCertForBenchmarksOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for InsecureAcceptAnyCertForBenchmarksOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// QUIC client config offering ALPN h3 and trusting any certificate (benchmarks only).
fn insecure_client_config() -> anyhow::Result<quinn::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with aws-lc-rs")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(InsecureAcceptAnyCertForBenchmarksOnly(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let qc = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| anyhow!("QUIC client TLS: {e}"))?;
    Ok(quinn::ClientConfig::new(Arc::new(qc)))
}

#[derive(Clone, Debug)]
pub struct Target {
    pub uri: http::Uri,
    pub addr: SocketAddr,
    pub server_name: String,
}

/// Parses `https://127.0.0.1:PORT/path`, `https://[::1]:PORT/path` or
/// `https://localhost:PORT/path`; only loopback hosts are accepted.
pub fn parse_url(s: &str) -> Result<Target, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("--url '{s}': {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("--url '{s}' must start with https://"));
    }
    let host = uri.host().ok_or_else(|| format!("--url '{s}' has no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = if bare.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        bare.parse().map_err(|_| format!("--url host '{host}' must be a loopback IP address or localhost"))?
    };
    if !crate::flood::is_loopback(ip) {
        return Err(format!("--url host {ip} is not loopback: udpflood only talks to 127.0.0.0/8 and ::1"));
    }
    let addr = SocketAddr::new(ip, uri.port_u16().unwrap_or(443));
    let server_name = if bare.eq_ignore_ascii_case("localhost") { "localhost".into() } else { ip.to_string() };
    Ok(Target { uri, addr, server_name })
}

#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub connections: usize,
    /// Requests per connection.
    pub requests: u64,
    /// Upper bound on the whole run.
    pub duration: Duration,
    /// Upper bound on one handshake or one request.
    pub timeout: Duration,
}

pub struct Report {
    pub connections_ok: u64,
    pub connections_failed: u64,
    pub requests_ok: u64,
    pub requests_failed: u64,
    /// Request latency (send_request to the end of the response body), ns.
    pub hist: Histogram<u64>,
    /// Handshake time (connect to established), ns.
    pub handshake: Histogram<u64>,
    pub elapsed: Duration,
    pub last_error: Option<String>,
}

#[derive(Default)]
struct ConnResult {
    handshake_ns: Option<u64>,
    latencies: Vec<u64>,
    failed: u64,
    error: Option<String>,
}

async fn one_request(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    uri: &http::Uri,
) -> anyhow::Result<http::StatusCode> {
    let req = http::Request::get(uri.clone()).body(())?;
    let mut s = send.send_request(req).await?;
    s.finish().await?;
    let resp = s.recv_response().await?;
    while let Some(mut chunk) = s.recv_data().await? {
        let n = chunk.remaining();
        chunk.advance(n);
    }
    Ok(resp.status())
}

async fn one_connection(cfg: Arc<Config>, client: quinn::ClientConfig) -> ConnResult {
    let mut r = ConnResult::default();
    let bind: SocketAddr = match cfg.target.addr {
        SocketAddr::V4(_) => (Ipv4Addr::LOCALHOST, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::LOCALHOST, 0).into(),
    };
    let ep = match quinn::Endpoint::client(bind) {
        Ok(mut ep) => {
            ep.set_default_client_config(client);
            ep
        }
        Err(e) => {
            r.error = Some(format!("client endpoint: {e}"));
            return r;
        }
    };
    let t0 = Instant::now();
    let connecting = match ep.connect(cfg.target.addr, &cfg.target.server_name) {
        Ok(c) => c,
        Err(e) => {
            r.error = Some(format!("connect: {e}"));
            return r;
        }
    };
    let conn = match tokio::time::timeout(cfg.timeout, connecting).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            r.error = Some(format!("handshake: {e}"));
            return r;
        }
        Err(_) => {
            r.error = Some("handshake timed out".into());
            return r;
        }
    };
    r.handshake_ns = Some(t0.elapsed().as_nanos() as u64);
    let (mut driver, mut send) = match h3::client::new(h3_quinn::Connection::new(conn.clone())).await {
        Ok(x) => x,
        Err(e) => {
            r.error = Some(format!("h3 setup: {e}"));
            return r;
        }
    };
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    for _ in 0..cfg.requests {
        let t = Instant::now();
        match tokio::time::timeout(cfg.timeout, one_request(&mut send, &cfg.target.uri)).await {
            Ok(Ok(status)) if status.is_success() => r.latencies.push(t.elapsed().as_nanos() as u64),
            Ok(Ok(status)) => {
                r.failed += 1;
                r.error = Some(format!("HTTP status {status}"));
            }
            Ok(Err(e)) => {
                r.failed += 1;
                r.error = Some(format!("request: {e:#}"));
            }
            Err(_) => {
                r.failed += 1;
                r.error = Some("request timed out".into());
            }
        }
        if conn.close_reason().is_some() {
            // The connection is gone: the rest of this connection's requests fail.
            let done = (r.latencies.len() as u64) + r.failed;
            r.failed += cfg.requests - done;
            break;
        }
    }
    drop(send);
    conn.close(0u32.into(), b"done");
    let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
    drive.abort();
    r
}

pub fn run(cfg: &Config) -> anyhow::Result<Report> {
    if cfg.connections == 0 || cfg.connections > 10_000 {
        anyhow::bail!("--connections must be in 1..=10000");
    }
    if cfg.requests == 0 || cfg.requests > 10_000_000 {
        anyhow::bail!("--requests must be in 1..=10000000");
    }
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("tokio runtime")?;
    let client = insecure_client_config()?;
    let cfg = Arc::new(cfg.clone());
    let start = Instant::now();
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..cfg.connections {
            set.spawn(one_connection(cfg.clone(), client.clone()));
        }
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + cfg.duration;
        loop {
            match tokio::time::timeout_at(deadline, set.join_next()).await {
                Ok(Some(Ok(r))) => out.push(r),
                Ok(Some(Err(e))) => out.push(ConnResult { error: Some(format!("task: {e}")), ..Default::default() }),
                Ok(None) => break,
                Err(_) => {
                    let left = set.len();
                    set.abort_all();
                    for _ in 0..left {
                        out.push(ConnResult { error: Some("run exceeded --duration".into()), ..Default::default() });
                    }
                    break;
                }
            }
        }
        out
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut handshake = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut rep_failed = 0u64;
    let (mut conn_ok, mut conn_failed, mut last_error) = (0u64, 0u64, None);
    let mut ok = 0u64;
    for r in results {
        match r.handshake_ns {
            Some(h) => {
                conn_ok += 1;
                handshake.saturating_record(h.max(1));
            }
            None => {
                conn_failed += 1;
                rep_failed += cfg.requests;
            }
        }
        for l in &r.latencies {
            hist.saturating_record((*l).max(1));
        }
        ok += r.latencies.len() as u64;
        if r.handshake_ns.is_some() {
            rep_failed += r.failed;
        }
        last_error = r.error.or(last_error);
    }
    Ok(Report {
        connections_ok: conn_ok,
        connections_failed: conn_failed,
        requests_ok: ok,
        requests_failed: rep_failed,
        hist,
        handshake,
        elapsed: start.elapsed(),
        last_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("https://127.0.0.1:4433/bytes/0").unwrap();
        assert_eq!(t.addr, "127.0.0.1:4433".parse().unwrap());
        assert_eq!(t.uri.path(), "/bytes/0");
        let t = parse_url("https://[::1]:8443/").unwrap();
        assert_eq!(t.addr, "[::1]:8443".parse().unwrap());
        let t = parse_url("https://localhost/x").unwrap();
        assert_eq!((t.addr.port(), t.server_name.as_str()), (443, "localhost"));
        assert!(parse_url("http://127.0.0.1:1/").is_err());
        assert!(parse_url("https://10.0.0.1:1/").is_err());
        assert!(parse_url("https://example.com/").is_err());
        assert!(parse_url("not a url").is_err());
    }
}
