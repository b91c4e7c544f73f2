//! The HTTP/1.1 connections to one upstream (hyper's `client::conn::http1`), kept
//! alive between requests (RFC 9112 §9.3).
//!
//! A request takes the most recently used idle connection, else dials a new one
//! (each connection is driven by a task of its own). The connection comes back
//! only through [`Lease::release`], once its response body ended and hyper has it
//! ready for the next request; a lease dropped unreleased (a failure, a client that
//! went away) drops the connection, which hyper then closes. At most
//! [`POOL_IDLE_MAX`] connections wait idle, none longer than [`POOL_IDLE_TIMEOUT`].
//!
//! An idle connection the upstream closed before our request went out is not an
//! error: the request goes on another connection (hyper hands it back unsent).

use super::body::RequestBody;
use super::upstream::{BoxError, FixedConnector};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::client::conn::http1;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Idle upstream connections kept per upstream.
pub const POOL_IDLE_MAX: usize = 64;
/// How long an idle upstream connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

type Sender = http1::SendRequest<RequestBody>;

/// Why a request got no response head (HTTP/1.1 here, HTTP/2 in h2.rs).
#[derive(Debug)]
pub enum ConnError {
    /// Dialling the upstream failed.
    Connect(BoxError),
    /// The connection failed (or closed) before the response head, or the request
    /// body was aborted.
    Request(hyper::Error),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Connect(e) => write!(f, "connecting: {e}"),
            ConnError::Request(e) => write!(f, "{e}"),
        }
    }
}

struct Idle {
    tx: Sender,
    since: Instant,
}

struct Inner {
    connector: FixedConnector,
    builder: http1::Builder,
    /// [`POOL_IDLE_TIMEOUT`] but in tests.
    idle_timeout: Duration,
    /// Oldest first.
    idle: Mutex<Vec<Idle>>,
}

/// The pool of one upstream.
pub struct Http1Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Http1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Pool").field("idle", &self.inner.idle().len()).finish()
    }
}

/// A connection lent to one request.
pub struct Lease {
    pool: Arc<Inner>,
    tx: Sender,
}

impl Inner {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection still usable.
    fn take(&self) -> Option<Sender> {
        let mut idle = self.idle();
        while let Some(i) = idle.pop() {
            if i.since.elapsed() < self.idle_timeout && i.tx.is_ready() {
                return Some(i.tx);
            }
        }
        None
    }

    fn put(&self, tx: Sender) {
        let now = Instant::now();
        let mut idle = self.idle();
        let expired = idle.iter().take_while(|i| now.duration_since(i.since) >= self.idle_timeout).count();
        idle.drain(..expired);
        if idle.len() >= POOL_IDLE_MAX {
            idle.remove(0);
        }
        idle.push(Idle { tx, since: now });
    }
}

impl Http1Pool {
    /// A pool dialling with `connector`. Call inside tokio: a task drops connections
    /// idle for too long, or closed by the upstream, while no request comes.
    pub fn new(connector: FixedConnector) -> Http1Pool {
        Http1Pool::with_idle_timeout(connector, POOL_IDLE_TIMEOUT)
    }

    fn with_idle_timeout(connector: FixedConnector, idle_timeout: Duration) -> Http1Pool {
        let inner =
            Arc::new(Inner { connector, builder: http1::Builder::new(), idle_timeout, idle: Mutex::new(Vec::new()) });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&inner), idle_timeout));
        }
        Http1Pool { inner }
    }

    /// Idle connections now.
    pub fn idle_count(&self) -> usize {
        self.inner.idle().len()
    }

    /// Sends `req` (its URI absolute or origin-form; sent in origin-form, RFC 9112
    /// §3.2.1) on an idle connection or a new one. The lease goes with the response.
    pub async fn send(
        &self,
        mut req: Request<RequestBody>,
    ) -> Result<(Response<hyper::body::Incoming>, Lease), ConnError> {
        let target = req.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(target);
        loop {
            let (mut tx, reused) = match self.inner.take() {
                Some(tx) => (tx, true),
                None => (self.connect().await?, false),
            };
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok((resp, Lease { pool: Arc::clone(&self.inner), tx })),
                Err(mut e) => match e.take_message() {
                    // Closed while idle, the request unsent: another connection.
                    Some(r) if reused => req = r,
                    _ => return Err(ConnError::Request(e.into_error())),
                },
            }
        }
    }

    async fn connect(&self) -> Result<Sender, ConnError> {
        let io = self.inner.connector.dial().await.map_err(ConnError::Connect)?;
        let (tx, conn) = self.inner.builder.handshake(io).await.map_err(ConnError::Request)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(tx)
    }
}

impl Lease {
    /// The response body ended: the connection serves another request once hyper
    /// has it ready (at once, nearly always; else when it gets there).
    pub fn release(self) {
        let Lease { pool, mut tx } = self;
        if tx.is_ready() {
            pool.put(tx);
        } else if !tx.is_closed() {
            tokio::spawn(async move {
                if let Ok(Ok(())) = tokio::time::timeout(pool.idle_timeout, tx.ready()).await {
                    pool.put(tx);
                }
            });
        }
    }
}

/// Every half idle timeout, drops the expired and closed idle connections, until
/// the pool is gone.
async fn sweep(pool: Weak<Inner>, idle_timeout: Duration) {
    loop {
        tokio::time::sleep(idle_timeout / 2).await;
        let Some(p) = pool.upgrade() else { return };
        let now = Instant::now();
        p.idle().retain(|i| now.duration_since(i.since) < idle_timeout && !i.tx.is_closed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::routes::parse_route;
    use crate::proxy::test_upstream::{server, Server, Speaks};
    use crate::proxy::upstream::{client, UpstreamClient};
    use http_body_util::BodyExt;

    fn pool_for(s: &Server) -> Http1Pool {
        let up = parse_route(&format!("http://{}", s.addr)).unwrap().upstream;
        match client(&up, Duration::from_secs(5)) {
            UpstreamClient::Http1(p) => p,
            c => panic!("not HTTP/1.1: {c:?}"),
        }
    }

    fn get() -> Request<RequestBody> {
        let mut r = Request::new(RequestBody::empty());
        *r.uri_mut() = "http://app.test/x?y=1".parse().unwrap();
        r.headers_mut().insert(http::header::HOST, "app.test".parse().unwrap());
        r
    }

    /// Sends a GET and reads its whole body.
    async fn fetch(p: &Http1Pool) -> Lease {
        let (resp, lease) = p.send(get()).await.unwrap();
        assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok /x");
        lease
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn a_released_connection_serves_the_next_request_an_unreleased_one_does_not() {
        let s = server(Speaks::Http1).await;
        let p = pool_for(&s);
        fetch(&p).await.release();
        settle().await;
        assert_eq!(p.idle_count(), 1);
        fetch(&p).await.release();
        assert_eq!(s.accepted(), 1, "kept alive and reused");
        settle().await;
        // Not released (a request that failed after its head, a client gone): dropped.
        drop(fetch(&p).await);
        assert_eq!(p.idle_count(), 0);
        fetch(&p).await.release();
        assert_eq!(s.accepted(), 2);
    }

    #[tokio::test]
    async fn an_idle_connection_the_upstream_closed_costs_no_error() {
        let s = server(Speaks::Http1).await;
        let p = pool_for(&s);
        fetch(&p).await.release();
        settle().await;
        s.close_all();
        settle().await;
        // No error: a new connection.
        fetch(&p).await.release();
        assert_eq!(s.accepted(), 2);
    }

    /// An idle connection past the idle timeout is not reused, and the sweep drops it
    /// (the upstream sees it closed) while no request comes.
    #[tokio::test]
    async fn a_connection_idle_past_the_timeout_is_dropped_not_reused() {
        let s = server(Speaks::Http1).await;
        let p = Http1Pool::with_idle_timeout(pool_for(&s).inner.connector.clone(), Duration::from_millis(200));
        fetch(&p).await.release();
        settle().await;
        assert_eq!(p.idle_count(), 1);
        fetch(&p).await.release();
        assert_eq!(s.accepted(), 1, "reused within the timeout");
        tokio::time::sleep(Duration::from_millis(250)).await;
        fetch(&p).await.release();
        assert_eq!(s.accepted(), 2, "an expired connection is not taken");
        settle().await;
        assert_eq!(p.idle_count(), 1);
        // No request: the sweep (every half timeout) drops it within 1.5 timeouts.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(p.idle_count(), 0, "swept");
        assert_eq!(s.open(), 0, "the upstream saw every connection closed");
    }

    #[tokio::test]
    async fn at_most_the_idle_maximum_waits() {
        let s = server(Speaks::Http1).await;
        let p = Arc::new(pool_for(&s));
        let tasks: Vec<_> = (0..POOL_IDLE_MAX + 3)
            .map(|_| {
                let p = Arc::clone(&p);
                tokio::spawn(async move { fetch(&p).await })
            })
            .collect();
        let mut leases = Vec::new();
        for t in tasks {
            leases.push(t.await.unwrap());
        }
        assert_eq!(s.accepted(), POOL_IDLE_MAX + 3);
        leases.into_iter().for_each(Lease::release);
        settle().await;
        assert_eq!(p.idle_count(), POOL_IDLE_MAX);
    }

    /// What goes out, read off a raw socket: origin-form (RFC 9112 §3.2.1).
    #[tokio::test]
    async fn requests_go_in_origin_form() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = parse_route(&format!("http://{}", l.local_addr().unwrap())).unwrap().upstream;
        let UpstreamClient::Http1(raw) = client(&up, Duration::from_secs(5)) else { panic!() };
        let sent = tokio::spawn(async move { raw.send(get()).await.map(|_| ()) });
        let (mut c, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 256];
        let n = tokio::io::AsyncReadExt::read(&mut c, &mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /x?y=1 HTTP/1.1\r\nhost: app.test\r\n"));
        sent.abort();
    }
}

#[cfg(test)]
mod close_tests {
    use super::*;
    use crate::proxy::routes::parse_route;
    use crate::proxy::upstream::{client, UpstreamClient};

    /// An upstream that accepts and closes at once: every way that can end (the
    /// request written or not, EOF or a reset) is a connection error.
    #[tokio::test]
    async fn an_upstream_closing_unanswered_is_a_connection_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        });
        let up = parse_route(&format!("http://{addr}")).unwrap().upstream;
        let UpstreamClient::Http1(p) = client(&up, Duration::from_secs(5)) else { panic!() };
        for _ in 0..200 {
            let mut r = Request::new(RequestBody::empty());
            *r.uri_mut() = "http://app.test/x".parse().unwrap();
            r.headers_mut().insert(http::header::HOST, "app.test".parse().unwrap());
            let e = p.send(r).await.err().expect("no response");
            assert!(e.is_connection_error(), "{e:?}");
        }
    }
}
