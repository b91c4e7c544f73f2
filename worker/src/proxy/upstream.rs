//! The upstream: its URL (`--upstream`), the connector that always dials it, and the
//! pooled hyper client (keep-alive; HTTP/1.1, or HTTP/2 with prior knowledge).
//!
//! The request URI the client is given carries the HTTP/3 request's own authority
//! (it becomes `Host` or `:authority`, headers.rs); [`FixedConnector`] ignores it and
//! dials the upstream's address. hyper's pool is keyed by that authority, so each
//! authority the clients use has its own idle connections to the one upstream.

use super::body::RequestBody;
use super::headers::Protocol;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// `--upstream URL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub protocol: Protocol,
    /// `host:port` dialled (a name is resolved at each new connection).
    pub authority: http::uri::Authority,
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.protocol {
            Protocol::Http1 => "http",
            Protocol::H2c => "h2c",
        };
        write!(f, "{scheme}://{}", self.authority)
    }
}

/// Parses `http://HOST[:PORT][/]` (HTTP/1.1) or `h2c://HOST[:PORT][/]` (HTTP/2 with
/// prior knowledge, RFC 9113 §3.3); the port defaults to 80. No path: requests keep
/// their own.
pub fn parse_upstream(s: &str) -> Result<Upstream, String> {
    let (protocol, rest) = if let Some(r) = s.strip_prefix("http://") {
        (Protocol::Http1, r)
    } else if let Some(r) = s.strip_prefix("h2c://") {
        (Protocol::H2c, r)
    } else {
        return Err(format!(
            "expected http://HOST[:PORT] or h2c://HOST[:PORT], not {s:?} (TLS upstreams are not supported)"
        ));
    };
    let host = rest.strip_suffix('/').unwrap_or(rest);
    if host.is_empty() || host.contains(['/', '?', '#', '@']) {
        return Err(format!("{s:?}: only HOST[:PORT] may follow the scheme (no path, query or user)"));
    }
    let authority: http::uri::Authority = host.parse().map_err(|e| format!("{s:?}: {e}"))?;
    let authority = if authority.port_u16().is_some() {
        authority
    } else {
        format!("{}:80", authority.host()).parse().map_err(|e| format!("{s:?}: {e}"))?
    };
    Ok(Upstream { protocol, authority })
}

/// Dials the upstream whatever URI it is asked for.
#[derive(Clone, Debug)]
pub struct FixedConnector {
    inner: HttpConnector,
    target: http::Uri,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for FixedConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let fut = self.inner.call(self.target.clone());
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}

/// The pooled client.
pub type UpstreamClient = Client<FixedConnector, RequestBody>;

/// Idle upstream connections kept per authority.
pub const POOL_IDLE_PER_AUTHORITY: usize = 64;
/// How long an idle upstream connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A client for `up`, connecting within `connect_timeout`.
pub fn client(up: &Upstream, connect_timeout: Duration) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let target = http::Uri::builder()
        .scheme("http")
        .authority(up.authority.clone())
        .path_and_query("/")
        .build()
        .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1:80/"));
    let connector = FixedConnector { inner: http, target };
    let mut b = Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_IDLE_PER_AUTHORITY)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .timer(hyper_util::rt::TokioTimer::new())
        // Host is set by headers::map_request (the client's authority).
        .set_host(false)
        .http2_only(up.protocol == Protocol::H2c);
    b.build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let u = parse_upstream("http://127.0.0.1:8080").unwrap();
        assert_eq!((u.protocol, u.authority.as_str()), (Protocol::Http1, "127.0.0.1:8080"));
        let u = parse_upstream("h2c://app.internal/").unwrap();
        assert_eq!((u.protocol, u.authority.as_str()), (Protocol::H2c, "app.internal:80"));
        assert_eq!(parse_upstream("http://[::1]:81").unwrap().authority.as_str(), "[::1]:81");
        assert_eq!(parse_upstream("h2c://[::1]").unwrap().to_string(), "h2c://[::1]:80");
        for bad in ["https://a", "a:80", "http://", "http://a/b", "http://u@a", "http://a?x", "ftp://a"] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }
}
