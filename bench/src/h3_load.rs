//! The load `bench h3` offers: an in-process quinn + h3 client on a tokio runtime of
//! its own (its threads pinned to the load core when one is given), one client
//! endpoint (one UDP socket), trusting exactly the bench's certificate, with TLS
//! session resumption off so that every new connection is a full handshake
//! (RFC 9001 §4.6 would otherwise let it skip the certificate).
//!
//! Every load is closed-loop: each task sends its next request when the previous
//! one has completed, until the window ends; a request counts as served only with
//! status 200 and exactly the body length asked for. Latency is from sending the
//! request (or, for new connections, from starting the handshake) to the last body
//! byte. The server's CPU time is read at the two ends of the timed window.

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, Bytes};
use hdrhistogram::Histogram;
use rustls::pki_types::CertificateDer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Longest a request (with its handshake, for new connections) may take; beyond it
/// it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The small GET of the new-connection load.
pub(crate) const SMALL: u64 = 1024;
/// H3_NO_ERROR (RFC 9114 §8.1).
const H3_NO_ERROR: u32 = 0x100;

/// The client: its runtime, its endpoint, the server's address.
pub(crate) struct Client {
    rt: tokio::runtime::Runtime,
    ep: quinn::Endpoint,
    addr: SocketAddr,
}

/// What one timed load measured.
pub(crate) struct Measured {
    /// Requests sent (each new connection carries one).
    pub(crate) issued: u64,
    /// Requests answered in full (status 200, the whole body).
    pub(crate) ok: u64,
    pub(crate) failed: u64,
    /// Body bytes received by the requests that were served.
    pub(crate) bytes: u64,
    /// The window, from its start until the last request completed.
    pub(crate) secs: f64,
    /// CPU time of every server process over the window.
    pub(crate) server_ns: u64,
    /// CPU time of this process (the client) over the window.
    pub(crate) client_ns: u64,
    /// Latency of the served requests, µs.
    pub(crate) latency: Histogram<u64>,
    /// The first few failures, for the log.
    pub(crate) errors: Vec<String>,
}

/// One task's tally.
struct Tally {
    issued: u64,
    ok: u64,
    failed: u64,
    bytes: u64,
    latency: Histogram<u64>,
    errors: Vec<String>,
}

impl Tally {
    fn new() -> Result<Tally> {
        Ok(Tally {
            issued: 0,
            ok: 0,
            failed: 0,
            bytes: 0,
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            errors: Vec::new(),
        })
    }

    fn record(&mut self, started: Instant, r: Result<Result<u64>, tokio::time::error::Elapsed>) {
        self.issued += 1;
        match r {
            Ok(Ok(n)) => {
                self.ok += 1;
                self.bytes += n;
                let us = started.elapsed().as_micros().clamp(1, 60_000_000) as u64;
                let _ = self.latency.record(us);
            }
            Ok(Err(e)) => self.fail(format!("{e:#}")),
            Err(_) => self.fail(format!("no answer in {REQUEST_TIMEOUT:?}")),
        }
    }

    fn fail(&mut self, why: String) {
        self.failed += 1;
        if self.errors.len() < 3 {
            self.errors.push(why);
        }
    }

    fn merge(&mut self, o: Tally) -> Result<()> {
        self.issued += o.issued;
        self.ok += o.ok;
        self.failed += o.failed;
        self.bytes += o.bytes;
        self.latency.add(&o.latency).map_err(|e| anyhow!("merging histograms: {e:?}"))?;
        self.errors.extend(o.errors.into_iter().take(3usize.saturating_sub(self.errors.len())));
        Ok(())
    }
}

/// An HTTP/3 connection and its h3 driver task.
struct Conn {
    conn: quinn::Connection,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl Conn {
    async fn open(ep: &quinn::Endpoint, addr: SocketAddr) -> Result<Conn> {
        let conn = ep.connect(addr, "localhost")?.await.context("handshake")?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await.context("h3")?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Conn { conn, send, driver })
    }

    fn close(self) {
        self.conn.close(quinn::VarInt::from_u32(H3_NO_ERROR), b"");
        self.driver.abort();
    }
}

/// GET `path` on `send`; the body's length, which must be `want`.
async fn get(send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>, path: &str, want: u64) -> Result<u64> {
    let req = http::Request::get(format!("https://localhost{path}")).body(())?;
    let mut s = send.send_request(req).await?;
    s.finish().await?;
    let resp = s.recv_response().await?;
    if resp.status() != http::StatusCode::OK {
        bail!("status {}", resp.status());
    }
    let mut n = 0u64;
    while let Some(chunk) = s.recv_data().await? {
        n += chunk.remaining() as u64;
    }
    if n != want {
        bail!("body of {n} bytes, not {want}");
    }
    Ok(n)
}

/// This process's CPU time (every thread), ns.
fn own_cpu_ns() -> u64 {
    crate::sys::schedstat_ns(std::process::id(), crate::sys::Schedstat::OnCpu)
}

/// The client's QUIC configuration: TLS 1.3 trusting `root` only, ALPN h3, no
/// session resumption, 30 s idle timeout.
fn client_config(root: &CertificateDer<'static>) -> Result<quinn::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    store.add(root.clone()).context("the bench's certificate as trust root")?;
    let mut tls = rustls::ClientConfig::builder_with_provider(worker::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_root_certificates(store)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.resumption = rustls::client::Resumption::disabled();
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS: {e}"))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    cfg.transport_config(Arc::new(t));
    Ok(cfg)
}

impl Client {
    /// A client of `threads` runtime threads (pinned to `core` when given) for the
    /// server at `addr`, trusting `root`.
    pub(crate) fn new(
        addr: SocketAddr,
        root: &CertificateDer<'static>,
        threads: usize,
        core: Option<usize>,
    ) -> Result<Client> {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads).enable_all();
        if let Some(core) = core {
            b.on_thread_start(move || crate::sys::pin(core));
        }
        let rt = b.build().context("client runtime")?;
        let bind: SocketAddr = if addr.is_ipv4() { ([127, 0, 0, 1], 0).into() } else { ([0u16; 8], 0).into() };
        let ep = {
            let _g = rt.enter();
            let mut ep = quinn::Endpoint::client(bind).context("client endpoint")?;
            ep.set_default_client_config(client_config(root)?);
            ep
        };
        Ok(Client { rt, ep, addr })
    }

    /// `conns` established connections, each GETting `/bytes/SIZE` in a loop for
    /// `seconds` (connections opened before the window, closed after it).
    pub(crate) fn established(
        &self,
        size: u64,
        conns: usize,
        seconds: f64,
        server_ns: &dyn Fn() -> u64,
    ) -> Result<Measured> {
        self.rt.block_on(async {
            let mut open = Vec::with_capacity(conns);
            for _ in 0..conns {
                open.push(tokio::time::timeout(REQUEST_TIMEOUT, Conn::open(&self.ep, self.addr)).await??);
            }
            let path = format!("/bytes/{size}");
            let (s0, c0, t0) = (server_ns(), own_cpu_ns(), Instant::now());
            let deadline = t0 + Duration::from_secs_f64(seconds);
            let mut tasks = JoinSet::new();
            for c in &open {
                let (mut send, path) = (c.send.clone(), path.clone());
                tasks.spawn(async move {
                    let mut t = Tally::new()?;
                    while Instant::now() < deadline {
                        let started = Instant::now();
                        let r = tokio::time::timeout(REQUEST_TIMEOUT, get(&mut send, &path, size)).await;
                        t.record(started, r);
                    }
                    anyhow::Ok(t)
                });
            }
            let m = collect(tasks, t0, s0, c0, server_ns).await;
            for c in open {
                c.close();
            }
            m
        })
    }

    /// `at_once` tasks, each opening a connection, GETting `/bytes/1024` on it and
    /// closing it, in a loop for `seconds`.
    pub(crate) fn new_connections(
        &self,
        at_once: usize,
        seconds: f64,
        server_ns: &dyn Fn() -> u64,
    ) -> Result<Measured> {
        self.rt.block_on(async {
            let (s0, c0, t0) = (server_ns(), own_cpu_ns(), Instant::now());
            let deadline = t0 + Duration::from_secs_f64(seconds);
            let mut tasks = JoinSet::new();
            for _ in 0..at_once {
                let (ep, addr) = (self.ep.clone(), self.addr);
                tasks.spawn(async move {
                    let mut t = Tally::new()?;
                    while Instant::now() < deadline {
                        let started = Instant::now();
                        let r = tokio::time::timeout(REQUEST_TIMEOUT, async {
                            let mut c = Conn::open(&ep, addr).await?;
                            let n = get(&mut c.send, &format!("/bytes/{SMALL}"), SMALL).await;
                            c.close();
                            n
                        })
                        .await;
                        t.record(started, r);
                    }
                    anyhow::Ok(t)
                });
            }
            collect(tasks, t0, s0, c0, server_ns).await
        })
    }

    /// One connection (opened before the window) downloading `/bytes/BYTES` once.
    pub(crate) fn download(&self, bytes: u64, server_ns: &dyn Fn() -> u64) -> Result<Measured> {
        self.rt.block_on(async {
            let c = tokio::time::timeout(REQUEST_TIMEOUT, Conn::open(&self.ep, self.addr)).await??;
            let (s0, c0, t0) = (server_ns(), own_cpu_ns(), Instant::now());
            let mut tasks = JoinSet::new();
            let mut send = c.send.clone();
            tasks.spawn(async move {
                let mut t = Tally::new()?;
                let started = Instant::now();
                // A download may take long on a slow machine: a minute per 256 MiB.
                let limit = REQUEST_TIMEOUT.max(Duration::from_secs(60 * (bytes >> 28).max(1)));
                let r = tokio::time::timeout(limit, get(&mut send, &format!("/bytes/{bytes}"), bytes)).await;
                t.record(started, r);
                anyhow::Ok(t)
            });
            let m = collect(tasks, t0, s0, c0, server_ns).await;
            c.close();
            m
        })
    }

    /// Waits (at most 2 s) for the closed connections to finish closing.
    pub(crate) fn finish(self) {
        self.rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(2), self.ep.wait_idle()).await;
        });
    }
}

async fn collect(
    mut tasks: JoinSet<Result<Tally>>,
    t0: Instant,
    s0: u64,
    c0: u64,
    server_ns: &dyn Fn() -> u64,
) -> Result<Measured> {
    let mut all = Tally::new()?;
    while let Some(t) = tasks.join_next().await {
        all.merge(t.context("load task")??)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(Measured {
        issued: all.issued,
        ok: all.ok,
        failed: all.failed,
        bytes: all.bytes,
        secs,
        server_ns: server_ns().saturating_sub(s0),
        client_ns: own_cpu_ns().saturating_sub(c0),
        latency: all.latency,
        errors: all.errors,
    })
}
