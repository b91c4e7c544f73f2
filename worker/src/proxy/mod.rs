//! `--upstream [AUTHORITY][/PREFIX]=URL`: the worker as an HTTP/3 reverse proxy. Each
//! HTTP/3 request goes to the HTTP/1.1 or HTTP/2 (h2c) upstream its route names
//! (docs/operations.md "Reverse proxy").
//!
//! - [`headers`]: the request and response head mapping (RFC 9114 §4.3, RFC 9110
//!   §7.6.1, RFC 7239), pure.
//! - [`body`]: the request body, streamed through a small bounded channel.
//! - [`upstream`]: the URL (TCP or Unix socket), the connector, the client per protocol.
//! - [`pool`]: the HTTP/1.1 keep-alive connections of one upstream (hyper `conn::http1`).
//! - [`h2`]: the one HTTP/2 connection of one h2c upstream (hyper `conn::http2`).
//! - [`routes`]: which upstream a request goes to (authority, path prefix), pure.
//! - [`health`]: the passive health check of one upstream.
//!
//! Per request: the head is mapped; the body is pumped from the HTTP/3 stream into
//! the upstream request while the upstream's response frames go out as HTTP/3 DATA
//! (and trailers) as they come, so memory per request is bounded whatever the body
//! sizes. Errors: 400 (unmappable head), 413 (body over `--upstream-max-body`), 502
//! (upstream unreachable, reset or closed before its response head), 504 (no
//! response head within `--upstream-timeout`), 503 (a request taken after the worker
//! began draining), 404 (no route). An idempotent request without a body is retried
//! once after a connection error (RFC 9110 §9.2.2); an upstream down by the health
//! check gets 502 at once. A failure after the response head resets the client's stream
//! (H3_INTERNAL_ERROR) so that it never takes a short body for a whole one; a client
//! that resets its stream drops the upstream request (hyper then closes that
//! HTTP/1.1 connection or resets that HTTP/2 stream).

pub mod body;
pub mod h2;
pub mod headers;
pub mod health;
pub mod pool;
pub mod routes;
#[cfg(test)]
mod test_upstream;
pub mod upstream;

use body::{Chunk, PumpEnd, RequestBody, BODY_QUEUE};
use bytes::{Buf, Bytes};
use headers::ForwardOptions;
use health::{Admit, Health, HealthPolicy};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use pool::{ConnError, Lease};
use routes::{Route, RouteTable};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use upstream::{Upstream, UpstreamClient};

/// The proxy's flags (flattened into the worker's command line).
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Proxy HTTP/3 requests to this HTTP/1.1 (`http://HOST:PORT`) or HTTP/2 with
    /// prior knowledge (`h2c://HOST:PORT`) upstream; `[AUTHORITY][/PREFIX]=URL` only
    /// those for that host and path prefix. May be given several times.
    #[arg(long, value_name = "[AUTHORITY][/PREFIX]=URL", value_parser = routes::parse_route)]
    pub upstream: Vec<Route>,
    /// Answer 504 when the upstream has not sent its response head after this long
    /// (also: connecting, and the longest pause inside a response body).
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = crate::cli::secs)]
    pub upstream_timeout: Duration,
    /// Answer 413 to a request body larger than this (bytes).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY)]
    pub upstream_max_body: u64,
    /// Add X-Forwarded-For and X-Forwarded-Proto besides Forwarded: on or off.
    #[arg(long, value_name = "on|off", default_value = "off", value_parser = crate::cli::on_off, action = clap::ArgAction::Set)]
    pub upstream_x_forwarded: bool,
    /// Connection errors in a row that take an upstream down (0: never).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub upstream_fail_threshold: u32,
    /// How long an upstream stays down before one trial request (milliseconds).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub upstream_down_ms: u64,
}

/// `--upstream-max-body` default: 1 GiB.
pub const DEFAULT_MAX_BODY: u64 = 1 << 30;

/// What the proxy was configured with.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub routes: RouteTable,
    pub health: HealthPolicy,
    pub timeout: Duration,
    pub max_body: u64,
    pub forward: ForwardOptions,
}

impl ProxyArgs {
    /// The options, when `--upstream` is set.
    pub fn options(&self) -> Option<ProxyOptions> {
        (!self.upstream.is_empty()).then(|| ProxyOptions {
            routes: RouteTable::new(self.upstream.clone()),
            health: HealthPolicy {
                threshold: self.upstream_fail_threshold,
                period: Duration::from_millis(self.upstream_down_ms),
            },
            timeout: self.upstream_timeout,
            max_body: self.upstream_max_body,
            forward: ForwardOptions { x_forwarded: self.upstream_x_forwarded },
        })
    }
}

/// One upstream (routes naming the same URL share it): its pooled client and health.
#[derive(Debug)]
struct Backend {
    upstream: Upstream,
    client: UpstreamClient,
    health: Health,
}

/// The proxy's counters (the worker's exit line).
#[derive(Debug, Default)]
pub struct ProxyCounters {
    /// Requests sent a second time after a connection error.
    pub retries: AtomicU64,
    /// Requests answered 502 at once because their upstream was down.
    pub down_rejects: AtomicU64,
    /// Times an upstream was marked down.
    pub marked_down: AtomicU64,
}

/// The proxy: options, one backend per distinct upstream, counters.
#[derive(Debug)]
pub struct Proxy {
    pub opts: ProxyOptions,
    backends: Vec<Backend>,
    /// For each route, its index in `backends`.
    route_backend: Vec<usize>,
    pub counters: ProxyCounters,
}

/// Marks the upstream's trial request abandoned when dropped while armed (a
/// timeout, or the client gone), so that the next request may try.
struct TrialGuard<'a>(Option<&'a Health>);

impl Drop for TrialGuard<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            h.trial_abandoned();
        }
    }
}

/// RFC 9110 §9.2.2: the idempotent methods retried after a connection error.
fn is_idempotent(m: &http::Method) -> bool {
    [http::Method::GET, http::Method::HEAD, http::Method::OPTIONS, http::Method::PUT, http::Method::DELETE].contains(m)
}

/// Methods whose requests carry no body by custom (RFC 9110 §9.3: a body has no
/// defined meaning for them).
fn usually_bodiless(m: &http::Method) -> bool {
    [http::Method::GET, http::Method::HEAD, http::Method::OPTIONS, http::Method::DELETE, http::Method::TRACE]
        .contains(m)
}

type Attempt = Result<Result<(Response<hyper::body::Incoming>, Option<Lease>), ConnError>, tokio::time::error::Elapsed>;

/// What became of one request (for the access log).
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The status sent, 0 if none was (the client went away first).
    pub status: u16,
    /// Request body bytes read from the client.
    pub bytes_in: u64,
    /// Response body bytes sent to the client.
    pub bytes_out: u64,
    /// From sending the request upstream to its response head.
    pub upstream: Option<Duration>,
}

type H3Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;
type H3Send = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Aborts a spawned task when dropped (a cancelled request takes its reader along).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A small text response with `status`.
async fn reply(send: &mut H3Send, status: StatusCode, text: &str, out: &mut Outcome) -> anyhow::Result<()> {
    let resp = Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .header("content-length", text.len())
        .body(())?;
    send.send_response(resp).await?;
    out.status = status.as_u16();
    send.send_data(Bytes::copy_from_slice(text.as_bytes())).await?;
    out.bytes_out = text.len() as u64;
    send.finish().await?;
    Ok(())
}

/// The first chunk of the request body if it is already here: `Ok(None)` when the
/// stream already ended (no body), `Err(())` when nothing is here yet.
fn ready_first(recv: &mut body::H3Recv) -> Poll<Result<Option<Bytes>, ()>> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match recv.poll_recv_data(&mut cx) {
        Poll::Ready(Ok(Some(mut b))) => Poll::Ready(Ok(Some(b.copy_to_bytes(b.remaining())))),
        Poll::Ready(Ok(None)) => Poll::Ready(Ok(None)),
        Poll::Ready(Err(_)) => Poll::Ready(Err(())),
        Poll::Pending => Poll::Pending,
    }
}

/// `fut`'s output, or `Elapsed` after `limit`; no timer when `fut` is ready at once
/// (a response body's next frame usually is).
async fn within<F: std::future::Future>(limit: Duration, fut: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let now = std::future::poll_fn(|cx| {
        Poll::Ready(match fut.as_mut().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await;
    match now {
        Some(v) => Ok(v),
        None => tokio::time::timeout(limit, fut).await,
    }
}

impl Proxy {
    /// A proxy to the upstreams of `opts.routes`. Call inside tokio.
    pub fn new(opts: ProxyOptions) -> Proxy {
        let mut backends: Vec<Backend> = Vec::new();
        let mut route_backend = Vec::new();
        for r in opts.routes.routes() {
            let i = match backends.iter().position(|b| b.upstream == r.upstream) {
                Some(i) => i,
                None => {
                    let client = upstream::client(&r.upstream, opts.timeout);
                    backends.push(Backend { upstream: r.upstream.clone(), client, health: Health::default() });
                    backends.len() - 1
                }
            };
            route_backend.push(i);
        }
        Proxy { opts, backends, route_backend, counters: ProxyCounters::default() }
    }

    /// `upstream_retries=N upstream_down_rejects=N upstream_marked_down=N`.
    pub fn exit_fields(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "upstream_retries={} upstream_down_rejects={} upstream_marked_down={}",
            n(&self.counters.retries),
            n(&self.counters.down_rejects),
            n(&self.counters.marked_down)
        )
    }

    /// One attempt at `b`, its outcome recorded by the health check. `trial` (armed
    /// when this is the trial request) goes with the future: dropped unfinished, even
    /// unpolled, it lets the next request try.
    async fn attempt(&self, b: &Backend, req: Request<RequestBody>, mut trial: TrialGuard<'_>) -> Attempt {
        let r = tokio::time::timeout(self.opts.timeout, b.client.request(req)).await;
        match &r {
            Ok(Ok(_)) => {
                b.health.success();
                trial.0 = None;
            }
            Ok(Err(e)) if e.is_connection_error() => {
                if b.health.failure(Instant::now(), self.opts.health) {
                    self.counters.marked_down.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(upstream = %b.upstream, period = ?self.opts.health.period, "upstream down");
                }
                trial.0 = None;
            }
            _ => {}
        }
        r
    }

    /// Forwards one request from `client` (its address as the QUIC path sees it now).
    /// `late`: taken after this connection's GOAWAY (draining), answered 503.
    pub async fn handle(&self, req: Request<()>, stream: H3Stream, client: SocketAddr, late: bool) -> Outcome {
        let mut out = Outcome::default();
        if let Err(e) = self.forward(req, stream, client, late, &mut out).await {
            tracing::debug!(error = %e, "proxied request failed");
        }
        out
    }

    async fn forward(
        &self,
        req: Request<()>,
        stream: H3Stream,
        client: SocketAddr,
        late: bool,
        out: &mut Outcome,
    ) -> anyhow::Result<()> {
        let (mut send, mut recv) = stream.split();
        // `recv.stop_sending` only before its first read (h3-quinn: see body::pump).
        if late {
            recv.stop_sending(h3::error::Code::H3_NO_ERROR);
            return reply(&mut send, StatusCode::SERVICE_UNAVAILABLE, "draining\n", out).await;
        }
        // The route: by the authority (else Host) and the path.
        let authority = req
            .uri()
            .authority()
            .map(|a| a.as_str())
            .or_else(|| req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()));
        let host = if self.opts.routes.by_host() { routes::host_of(authority.unwrap_or("")) } else { String::new() };
        let Some(route) = self.opts.routes.choose(&host, req.uri().path()) else {
            recv.stop_sending(h3::error::Code::H3_NO_ERROR);
            return reply(&mut send, StatusCode::NOT_FOUND, "no upstream route for this request\n", out).await;
        };
        let backend = &self.backends[self.route_backend[route]];
        let protocol = backend.upstream.protocol;
        let head =
            match headers::map_request(req.method(), req.uri(), req.headers(), client, protocol, self.opts.forward) {
                Ok(h) => h,
                Err(e) => {
                    recv.stop_sending(h3::error::Code::H3_NO_ERROR);
                    let code = if e == headers::MapError::Connect {
                        StatusCode::NOT_IMPLEMENTED
                    } else {
                        StatusCode::BAD_REQUEST
                    };
                    return reply(&mut send, code, &format!("{e}\n"), out).await;
                }
            };
        let declared: Option<u64> =
            req.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        if declared.is_some_and(|n| n > self.opts.max_body) {
            recv.stop_sending(h3::error::Code::H3_NO_ERROR);
            return reply(&mut send, StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n", out).await;
        }
        // A request whose stream already ended gets an empty body (HTTP/1.1: no
        // chunked encoding for a GET), and can be retried; otherwise the body streams.
        // A GET (HEAD, OPTIONS, DELETE, TRACE) without Content-Length whose FIN came
        // in a packet after its HEADERS is waited for: it is bodiless nearly always.
        let progress = Arc::new(body::Progress::default());
        let seen = &progress.bytes;
        let first = match ready_first(&mut recv) {
            Poll::Pending if declared.is_none() && usually_bodiless(req.method()) => {
                match within(self.opts.timeout, recv.recv_data()).await {
                    Ok(Ok(Some(mut b))) => Poll::Ready(Ok(Some(b.copy_to_bytes(b.remaining())))),
                    Ok(Ok(None)) => Poll::Ready(Ok(None)),
                    Ok(Err(_)) => Poll::Ready(Err(())),
                    Err(_) => Poll::Pending,
                }
            }
            first => first,
        };
        let (body, mut pump) = match first {
            Poll::Ready(Ok(None)) if declared.unwrap_or(0) == 0 => (RequestBody::empty(), None),
            Poll::Ready(Err(())) => return Ok(()), // reset before we began
            first => {
                let first = match first {
                    Poll::Ready(Ok(b)) => b,
                    _ => None,
                };
                let (tx, rx) = mpsc::channel::<Chunk>(BODY_QUEUE);
                let task = tokio::spawn(body::pump(recv, tx, first, self.opts.max_body, Arc::clone(&progress)));
                (RequestBody::channel(rx, declared), Some(AbortOnDrop(task)))
            }
        };
        let admit = backend.health.admit(Instant::now());
        if admit == Admit::Down {
            self.counters.down_rejects.fetch_add(1, Ordering::Relaxed);
            return reply(&mut send, StatusCode::BAD_GATEWAY, "upstream down\n", out).await;
        }
        // Without a body (nothing of it sent), an idempotent request can go again
        // (its head mapped anew: the first went with the first attempt).
        let again = pump.is_none() && is_idempotent(&head.method);
        let mut upstream_req = Request::new(body);
        *upstream_req.method_mut() = head.method;
        *upstream_req.uri_mut() = head.uri;
        *upstream_req.headers_mut() = head.headers;
        let trial = TrialGuard((admit == Admit::Trial).then_some(&backend.health));
        let sent_at = Instant::now();
        let mut response = std::pin::pin!(async {
            let first = self.attempt(backend, upstream_req, trial).await;
            if !again {
                return first;
            }
            match first {
                Ok(Err(e)) if e.is_connection_error() => match backend.health.admit(Instant::now()) {
                    Admit::Down => Ok(Err(e)),
                    admit => {
                        self.counters.retries.fetch_add(1, Ordering::Relaxed);
                        let Ok(head) = headers::map_request(
                            req.method(),
                            req.uri(),
                            req.headers(),
                            client,
                            protocol,
                            self.opts.forward,
                        ) else {
                            return Ok(Err(e));
                        };
                        let mut req = Request::new(RequestBody::empty());
                        *req.method_mut() = head.method;
                        *req.uri_mut() = head.uri;
                        *req.headers_mut() = head.headers;
                        let trial = TrialGuard((admit == Admit::Trial).then_some(&backend.health));
                        self.attempt(backend, req, trial).await
                    }
                },
                r => r,
            }
        });

        // Until the response head: the reader may fail first.
        let result = loop {
            let reader = async {
                match pump.as_mut() {
                    Some(p) => (&mut p.0).await.unwrap_or(PumpEnd::ClientGone),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = &mut response => break r,
                end = reader => {
                    pump = None;
                    out.bytes_in = seen.load(Ordering::Relaxed);
                    match end {
                        PumpEnd::TooLarge => {
                            return reply(&mut send, StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n", out).await
                        }
                        // Cancelled: dropping the request future drops the upstream request.
                        PumpEnd::ClientGone => return Ok(()),
                        PumpEnd::Complete | PumpEnd::UpstreamGone => {}
                    }
                }
            }
        };
        out.upstream = Some(sent_at.elapsed());
        let resp = match result {
            Err(_) => {
                out.bytes_in = seen.load(Ordering::Relaxed);
                return reply(&mut send, StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n", out).await;
            }
            // The body went over the limit and hyper saw it abort first.
            Ok(Err(_)) if progress.too_large.load(Ordering::Acquire) => {
                out.bytes_in = seen.load(Ordering::Relaxed);
                return reply(&mut send, StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n", out).await;
            }
            Ok(Err(e)) => {
                out.bytes_in = seen.load(Ordering::Relaxed);
                tracing::debug!(error = %e, upstream = %backend.upstream, "upstream failed");
                return reply(&mut send, StatusCode::BAD_GATEWAY, "upstream unreachable or failed\n", out).await;
            }
            Ok(Ok(r)) => r,
        };
        let (resp, lease) = resp;
        let (parts, mut upstream_body) = resp.into_parts();
        let mut h3_resp = Response::new(());
        *h3_resp.status_mut() = parts.status;
        *h3_resp.headers_mut() = headers::map_response(&parts.headers);
        send.send_response(h3_resp).await?;
        out.status = parts.status.as_u16();
        loop {
            let frame = match within(self.opts.timeout, upstream_body.frame()).await {
                Ok(Some(Ok(f))) => f,
                Ok(None) => {
                    if let Some(l) = lease {
                        l.release();
                    }
                    break;
                }
                Ok(Some(Err(e))) => {
                    tracing::debug!(error = %e, "upstream response body failed");
                    send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                    out.bytes_in = seen.load(Ordering::Relaxed);
                    return Ok(());
                }
                Err(_) => {
                    tracing::debug!("upstream response body stalled");
                    send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                    out.bytes_in = seen.load(Ordering::Relaxed);
                    return Ok(());
                }
            };
            match frame.into_data() {
                Ok(d) => {
                    let n = d.len() as u64;
                    // A failure here is the client gone: returning drops the upstream body.
                    send.send_data(d).await?;
                    out.bytes_out += n;
                }
                Err(f) => {
                    if let Ok(t) = f.into_trailers() {
                        send.send_trailers(t).await?;
                    }
                }
            }
        }
        send.finish().await?;
        out.bytes_in = seen.load(Ordering::Relaxed);
        // Whatever the client still sends is not needed: dropping the reader (with
        // the request stream) asks it to stop.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `within`: a ready future's output at once; a pending one's when it comes
    /// before the limit; `Elapsed` at the limit.
    #[tokio::test]
    async fn within_the_limit_or_elapsed() {
        let limit = Duration::from_millis(300);
        assert_eq!(within(limit, async { 7 }).await.unwrap(), 7);
        let late = within(limit, async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            8
        });
        assert_eq!(late.await.unwrap(), 8);
        let t0 = Instant::now();
        assert!(within(limit, std::future::pending::<()>()).await.is_err());
        assert!(t0.elapsed() >= limit);
    }

    /// A trial attempt dropped before it was ever polled (the client went away at
    /// once) does not leave the upstream waiting for a trial that never ends.
    #[test]
    fn an_unpolled_trial_is_abandoned_when_dropped() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let policy = HealthPolicy { threshold: 1, period: Duration::ZERO };
            let p = Proxy::new(ProxyOptions {
                routes: RouteTable::new(vec![routes::parse_route("http://127.0.0.1:9").unwrap()]),
                health: policy,
                timeout: Duration::from_secs(1),
                max_body: DEFAULT_MAX_BODY,
                forward: ForwardOptions { x_forwarded: false },
            });
            let b = &p.backends[0];
            assert!(b.health.failure(Instant::now(), policy));
            assert_eq!(b.health.admit(Instant::now()), Admit::Trial);
            let never_polled = p.attempt(b, Request::new(RequestBody::empty()), TrialGuard(Some(&b.health)));
            drop(never_polled);
            assert_eq!(b.health.admit(Instant::now()), Admit::Trial);
        });
    }
}
