//! The upstream: its URL (`--upstream`), the connector that always dials it, and the
//! client: for HTTP/1.1 the keep-alive pool of pool.rs, for HTTP/2 with prior
//! knowledge the one multiplexed connection of h2.rs.
//!
//! The request URI carries the HTTP/3 request's own authority (it becomes `Host` or
//! `:authority`, headers.rs); [`FixedConnector`] ignores it and dials the upstream's
//! address: a TCP `host:port`, or a Unix stream socket's path (`unix:/PATH`, as
//! nginx's `proxy_pass http://unix:/PATH`).

use super::body::RequestBody;
use super::h2::H2Client;
use super::headers::Protocol;
use super::pool::{ConnError, Http1Pool, Lease};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where the upstream listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `host:port` over TCP (a name is resolved at each new connection).
    Tcp(http::uri::Authority),
    /// A Unix stream socket's path.
    Unix(PathBuf),
}

/// `--upstream URL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub protocol: Protocol,
    pub address: Address,
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.address, self.protocol) {
            (Address::Tcp(a), Protocol::Http1) => write!(f, "http://{a}"),
            (Address::Tcp(a), Protocol::H2c) => write!(f, "h2c://{a}"),
            (Address::Unix(p), Protocol::Http1) => write!(f, "unix:{}", p.display()),
            (Address::Unix(p), Protocol::H2c) => write!(f, "h2c+unix:{}", p.display()),
        }
    }
}

/// Parses `http://HOST[:PORT][/]` (HTTP/1.1) or `h2c://HOST[:PORT][/]` (HTTP/2 with
/// prior knowledge, RFC 9113 §3.3), the port defaulting to 80; or `unix:/PATH`
/// (HTTP/1.1) or `h2c+unix:/PATH` (HTTP/2 with prior knowledge) over the Unix stream
/// socket at the absolute PATH. No request path: requests keep their own.
pub fn parse_upstream(s: &str) -> Result<Upstream, String> {
    let unix = |protocol, path: &str| {
        if !path.starts_with('/') || path.starts_with("//") || path.len() < 2 {
            return Err(format!("{s:?}: a Unix socket upstream needs an absolute path (unix:/PATH)"));
        }
        Ok(Upstream { protocol, address: Address::Unix(PathBuf::from(path)) })
    };
    let (protocol, rest) = if let Some(r) = s.strip_prefix("http://") {
        (Protocol::Http1, r)
    } else if let Some(r) = s.strip_prefix("h2c://") {
        (Protocol::H2c, r)
    } else if let Some(p) = s.strip_prefix("unix:") {
        return unix(Protocol::Http1, p);
    } else if let Some(p) = s.strip_prefix("h2c+unix:") {
        return unix(Protocol::H2c, p);
    } else {
        return Err(format!(
            "expected http://HOST[:PORT], h2c://HOST[:PORT], unix:/PATH or h2c+unix:/PATH, not {s:?} (TLS upstreams are not supported)"
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
    Ok(Upstream { protocol, address: Address::Tcp(authority) })
}

/// A connection to the upstream: TCP or a Unix stream socket.
#[derive(Debug)]
pub enum UpstreamStream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        match self {
            UpstreamStream::Tcp(s) => s.connected(),
            UpstreamStream::Unix(s) => s.connected(),
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Tcp(s) => s.is_write_vectored(),
            UpstreamStream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Dials the upstream whatever URI it is asked for.
#[derive(Clone, Debug)]
pub struct FixedConnector {
    inner: HttpConnector,
    target: Target,
    connect_timeout: Duration,
}

#[derive(Clone, Debug)]
enum Target {
    Tcp(http::Uri),
    Unix(PathBuf),
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl FixedConnector {
    /// A new connection to the upstream.
    pub fn dial(&self) -> Pin<Box<dyn Future<Output = Result<TokioIo<UpstreamStream>, BoxError>> + Send>> {
        tower_service::Service::call(&mut self.clone(), http::Uri::from_static("/"))
    }
}

impl tower_service::Service<http::Uri> for FixedConnector {
    type Response = TokioIo<UpstreamStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        match &self.target {
            Target::Tcp(uri) => {
                let fut = self.inner.call(uri.clone());
                Box::pin(async move {
                    let io = fut.await?;
                    Ok(TokioIo::new(UpstreamStream::Tcp(io.into_inner())))
                })
            }
            Target::Unix(path) => {
                let (path, limit) = (path.clone(), self.connect_timeout);
                Box::pin(async move {
                    let s = tokio::time::timeout(limit, tokio::net::UnixStream::connect(&path))
                        .await
                        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connecting timed out"))??;
                    Ok(TokioIo::new(UpstreamStream::Unix(s)))
                })
            }
        }
    }
}

/// The client of one upstream.
#[derive(Debug)]
pub enum UpstreamClient {
    Http1(Http1Pool),
    H2c(H2Client),
}

/// Whether `e` (or what caused it) is an I/O error or a connection hyper saw fail.
fn connection_failed(mut e: Option<&(dyn std::error::Error + 'static)>) -> bool {
    while let Some(s) = e {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return true;
            }
        }
        if s.is::<std::io::Error>() {
            return true;
        }
        e = s.source();
    }
    false
}

impl ConnError {
    /// A failure to connect, or the connection reset or closed before the response
    /// head; not a bad response head nor a request body's own failure.
    pub fn is_connection_error(&self) -> bool {
        match self {
            ConnError::Connect(_) => true,
            ConnError::Request(e) => connection_failed(Some(e)),
        }
    }
}

impl UpstreamClient {
    /// Sends `req`; for HTTP/1.1 the connection's lease comes with the response
    /// (released when its body ended).
    pub async fn request(
        &self,
        req: http::Request<RequestBody>,
    ) -> Result<(http::Response<hyper::body::Incoming>, Option<Lease>), ConnError> {
        match self {
            UpstreamClient::Http1(pool) => pool.send(req).await.map(|(r, l)| (r, Some(l))),
            UpstreamClient::H2c(c) => c.send(req).await.map(|r| (r, None)),
        }
    }
}

/// A client for `up`, connecting within `connect_timeout`. Call inside tokio.
pub fn client(up: &Upstream, connect_timeout: Duration) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let target = match &up.address {
        Address::Tcp(authority) => Target::Tcp(
            http::Uri::builder()
                .scheme("http")
                .authority(authority.clone())
                .path_and_query("/")
                .build()
                .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1:80/")),
        ),
        Address::Unix(path) => Target::Unix(path.clone()),
    };
    let connector = FixedConnector { inner: http, target, connect_timeout };
    match up.protocol {
        Protocol::Http1 => UpstreamClient::Http1(Http1Pool::new(connector)),
        Protocol::H2c => UpstreamClient::H2c(H2Client::new(connector)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let tcp = |s: &str| match parse_upstream(s).unwrap() {
            Upstream { protocol, address: Address::Tcp(a) } => (protocol, a.to_string()),
            u => panic!("{s}: {u:?}"),
        };
        assert_eq!(tcp("http://127.0.0.1:8080"), (Protocol::Http1, "127.0.0.1:8080".into()));
        assert_eq!(tcp("h2c://app.internal/"), (Protocol::H2c, "app.internal:80".into()));
        assert_eq!(tcp("http://[::1]:81").1, "[::1]:81");
        assert_eq!(parse_upstream("h2c://[::1]").unwrap().to_string(), "h2c://[::1]:80");
        let u = parse_upstream("unix:/run/app.sock").unwrap();
        assert_eq!(u, Upstream { protocol: Protocol::Http1, address: Address::Unix("/run/app.sock".into()) });
        assert_eq!(u.to_string(), "unix:/run/app.sock");
        let u = parse_upstream("h2c+unix:/run/app.sock").unwrap();
        assert_eq!(u, Upstream { protocol: Protocol::H2c, address: Address::Unix("/run/app.sock".into()) });
        assert_eq!(u.to_string(), "h2c+unix:/run/app.sock");
        for bad in [
            "https://a",
            "a:80",
            "http://",
            "http://a/b",
            "http://u@a",
            "http://a?x",
            "ftp://a",
            "unix:",
            "unix:/",
            "unix:run/app.sock",
            "h2c+unix:app.sock",
            "unix://run/x",
        ] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }
}
