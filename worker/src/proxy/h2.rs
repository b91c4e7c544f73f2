//! The HTTP/2 connection to one `h2c` upstream (hyper's `client::conn::http2`, prior
//! knowledge, RFC 9113 §3.3): one multiplexed connection that every request shares,
//! driven by a task of its own; dialled when there is none or the last one closed
//! (one dial at a time), dropped after [`H2_IDLE_TIMEOUT`] without a request.
//!
//! A request the connection refused unsent (it closed, or the upstream sent GOAWAY,
//! before the request went out) goes on a new connection once.

use super::body::RequestBody;
use super::pool::ConnError;
use super::upstream::FixedConnector;
use http::{Request, Response};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long an idle HTTP/2 upstream connection is kept.
pub const H2_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

type Sender = http2::SendRequest<RequestBody>;

struct Current {
    tx: Sender,
    used: Instant,
}

struct Inner {
    connector: FixedConnector,
    current: Mutex<Option<Current>>,
    /// Held while dialling, so that concurrent requests wait for one connection.
    dialing: tokio::sync::Mutex<()>,
}

/// The connection of one upstream.
pub struct H2Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for H2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Client").field("connected", &self.connected()).finish()
    }
}

impl Inner {
    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connection, marked used now.
    fn take_open(&self) -> Option<Sender> {
        let mut cur = self.current();
        match cur.as_mut() {
            Some(c) if !c.tx.is_closed() => {
                c.used = Instant::now();
                Some(c.tx.clone())
            }
            _ => None,
        }
    }
}

impl H2Client {
    /// A client dialling with `connector`. Call inside tokio: a task drops the
    /// connection once idle for too long.
    pub fn new(connector: FixedConnector) -> H2Client {
        let inner = Arc::new(Inner { connector, current: Mutex::new(None), dialing: tokio::sync::Mutex::new(()) });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&inner)));
        }
        H2Client { inner }
    }

    /// Whether a connection is open now.
    pub fn connected(&self) -> bool {
        self.inner.current().as_ref().is_some_and(|c| !c.tx.is_closed())
    }

    /// Sends `req` (absolute URI: it gives `:scheme` and `:authority`).
    pub async fn send(&self, mut req: Request<RequestBody>) -> Result<Response<hyper::body::Incoming>, ConnError> {
        let mut again = true;
        loop {
            let (mut tx, reused) = match self.inner.take_open() {
                Some(tx) => (tx, true),
                None => (self.connect().await?, false),
            };
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => match e.take_message() {
                    // Refused unsent by a connection that was already open: a new one.
                    Some(r) if reused && again => {
                        again = false;
                        req = r;
                    }
                    _ => return Err(ConnError::Request(e.into_error())),
                },
            }
        }
    }

    async fn connect(&self) -> Result<Sender, ConnError> {
        let _one = self.inner.dialing.lock().await;
        // Another request may have dialled meanwhile.
        if let Some(tx) = self.inner.take_open() {
            return Ok(tx);
        }
        let io = self.inner.connector.dial().await.map_err(ConnError::Connect)?;
        let mut b = http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new());
        let (tx, conn) = b.handshake(io).await.map_err(ConnError::Request)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        *self.inner.current() = Some(Current { tx: tx.clone(), used: Instant::now() });
        Ok(tx)
    }
}

/// Every half idle timeout, drops the connection when idle for too long or closed,
/// until the client is gone. A dropped connection ends once its last stream does.
async fn sweep(client: Weak<Inner>) {
    loop {
        tokio::time::sleep(H2_IDLE_TIMEOUT / 2).await;
        let Some(c) = client.upgrade() else { return };
        let mut cur = c.current();
        if cur.as_ref().is_some_and(|x| x.used.elapsed() >= H2_IDLE_TIMEOUT || x.tx.is_closed()) {
            *cur = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::routes::parse_route;
    use crate::proxy::test_upstream::{server, Server, Speaks};
    use crate::proxy::upstream::{client, UpstreamClient};
    use http_body_util::BodyExt;

    fn client_for(s: &Server) -> Arc<H2Client> {
        let up = parse_route(&format!("h2c://{}", s.addr)).unwrap().upstream;
        match client(&up, Duration::from_secs(5)) {
            UpstreamClient::H2c(c) => Arc::new(c),
            c => panic!("not h2c: {c:?}"),
        }
    }

    async fn fetch(c: &H2Client, path: &str) -> String {
        let mut r = Request::new(RequestBody::empty());
        *r.uri_mut() = format!("http://app.test{path}").parse().unwrap();
        let resp = c.send(r).await.unwrap();
        String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_connection() {
        let s = server(Speaks::H2c).await;
        let c = client_for(&s);
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let c = Arc::clone(&c);
                tokio::spawn(async move { fetch(&c, &format!("/{i}")).await })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), format!("ok /{i}"));
        }
        assert_eq!(fetch(&c, "/again").await, "ok /again");
        assert_eq!(s.accepted(), 1, "one connection, dialled once");
        assert!(c.connected());
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_replaced_without_error() {
        let s = server(Speaks::H2c).await;
        let c = client_for(&s);
        assert_eq!(fetch(&c, "/a").await, "ok /a");
        s.close_all();
        for _ in 0..100 {
            if !c.connected() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!c.connected(), "the closed connection is seen closed");
        assert_eq!(fetch(&c, "/b").await, "ok /b");
        assert_eq!(s.accepted(), 2);
    }
}
