//! `worker --upstream`: the worker as an HTTP/3 reverse proxy, through a real data
//! plane, against real upstreams (a hyper server in this test, speaking HTTP/1.1 and
//! h2c; Python's `http.server`, HTTP/1.0 without keep-alive) and real clients (the
//! quinn/h3 client, aioquic, ngtcp2's gtlsclient).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use bytes::{Buf, Bytes};
use common::*;
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const MIB: u64 = 1 << 20;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

// ---------------------------------------------------------------------------
// The upstream: a hyper server (HTTP/1.1 and h2c on one port, hyper-util auto).

/// The pattern of every generated body: byte i is i % 256.
fn pattern_chunk(offset: u64, len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| ((offset + i as u64) % 256) as u8).collect::<Vec<u8>>())
}

/// N pattern bytes in 64 KiB frames; `fail_after`: past that many bytes, a pause
/// (the head and those bytes go out) and then an error (the upstream breaks mid-body).
struct PatternBody {
    sent: u64,
    len: u64,
    fail_after: Option<u64>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl PatternBody {
    fn new(len: u64, fail_after: Option<u64>) -> PatternBody {
        PatternBody { sent: 0, len, fail_after, pause: None }
    }
}

impl http_body::Body for PatternBody {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.sent >= self.len {
            return Poll::Ready(None);
        }
        if self.fail_after.is_some_and(|f| self.sent >= f) {
            let pause = self.pause.get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(300))));
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            return Poll::Ready(Some(Err("upstream breaks mid-body".into())));
        }
        let n = (self.len - self.sent).min(64 * 1024) as usize;
        let c = pattern_chunk(self.sent, n);
        self.sent += n as u64;
        Poll::Ready(Some(Ok(Frame::data(c))))
    }
    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.len)
    }
}

/// Frames given in advance (data, then trailers).
struct Frames(VecDeque<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A body that sends a chunk every 20 ms until dropped, and reports the drop.
struct Endless {
    tick: tokio::time::Interval,
    dropped: Option<mpsc::UnboundedSender<&'static str>>,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.tick.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&[7u8; 1024]))))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Endless {
    fn drop(&mut self) {
        if let Some(tx) = self.dropped.take() {
            let _ = tx.send("response body dropped");
        }
    }
}

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: HeaderMap,
}

struct Upstream {
    addr: SocketAddr,
    /// The same server on a Unix stream socket.
    unix: std::path::PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Events: a response body dropped, a request body aborted.
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<&'static str>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(dir) = self.unix.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(b.into()).map_err(|e| match e {}).boxed()
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    events: mpsc::UnboundedSender<&'static str>,
) -> Result<Response<Body>, Infallible> {
    seen.lock().unwrap().push(Seen {
        method: req.method().clone(),
        uri: req.uri().clone(),
        version: req.version(),
        headers: req.headers().clone(),
    });
    let path = req.uri().path().to_string();
    let resp = Response::builder();
    let r = if let Some(n) = path.strip_prefix("/bytes/") {
        let n: u64 = n.parse().unwrap_or(0);
        resp.header("content-length", n).body(PatternBody::new(n, None).boxed())
    } else if path == "/echo" {
        // Streams the request body back as it arrives.
        let body = req.into_body().map_err(|e| -> BoxError { e.into() }).boxed();
        resp.header("x-echo", "1").body(body)
    } else if path == "/count" {
        // Reads the whole body, answers its length and whether it was the pattern.
        let mut body = req.into_body();
        let (mut n, mut ok) = (0u64, true);
        let mut trailers = None;
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => match f.into_data() {
                    Ok(d) => {
                        ok &= d.iter().enumerate().all(|(i, b)| *b == ((n + i as u64) % 256) as u8);
                        n += d.len() as u64;
                    }
                    Err(f) => trailers = f.into_trailers().ok(),
                },
                Err(_) => {
                    let _ = events.send("request body aborted");
                    return Ok(Response::builder().status(400).body(full("aborted")).unwrap());
                }
            }
        }
        let t = trailers.and_then(|t| t.get("x-checksum").map(|v| v.to_str().unwrap().to_string()));
        resp.body(full(format!("len={n} pattern={ok} trailer={}", t.unwrap_or_default())))
    } else if path == "/headers" {
        resp.header("x-resp", "yes")
            .header("connection", "x-hop")
            .header("x-hop", "must not pass")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
            .body(full("h"))
    } else if path == "/trailers" {
        let mut t = HeaderMap::new();
        t.insert("x-checksum", "abc123".parse().unwrap());
        let frames = VecDeque::from([Frame::data(Bytes::from_static(b"body")), Frame::trailers(t)]);
        resp.body(Frames(frames).boxed())
    } else if path == "/slow" {
        tokio::time::sleep(Duration::from_secs(4)).await;
        resp.body(full("late"))
    } else if path == "/break" {
        resp.header("content-length", 4 * MIB).body(PatternBody::new(4 * MIB, Some(256 * 1024)).boxed())
    } else if path == "/endless" {
        let tick = tokio::time::interval(Duration::from_millis(20));
        resp.body(Endless { tick, dropped: Some(events) }.boxed())
    } else {
        resp.status(404).body(full("nope"))
    };
    Ok(r.unwrap())
}

/// Starts the upstream on 127.0.0.1 and on a Unix stream socket (HTTP/1.1
/// keep-alive and h2c prior knowledge on both).
async fn upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let unix = temp_dir("upstream").join("upstream.sock");
    let unix_listener = tokio::net::UnixListener::bind(&unix).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::unbounded_channel();
    let s = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        loop {
            let (s, tx) = (Arc::clone(&s), tx.clone());
            let svc = hyper::service::service_fn(move |req| handle(req, Arc::clone(&s), tx.clone()));
            let b = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            tokio::select! {
                a = listener.accept() => {
                    let Ok((tcp, _)) = a else { return };
                    tokio::spawn(async move { b.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc).await });
                }
                a = unix_listener.accept() => {
                    let Ok((stream, _)) = a else { return };
                    tokio::spawn(async move { b.serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await });
                }
            }
        }
    });
    Upstream { addr, unix, seen, events: tokio::sync::Mutex::new(rx), task }
}

impl Upstream {
    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().expect("the upstream saw a request")
    }

    async fn event(&self, within: Duration) -> Option<&'static str> {
        let mut rx = self.events.lock().await;
        tokio::time::timeout(within, rx.recv()).await.ok().flatten()
    }
}

// ---------------------------------------------------------------------------
// The appliance and an HTTP/3 client.

struct Appliance {
    d: Demux,
    _w: Vec<Worker>,
    cert: Cert,
}

fn appliance(tag: &str, workers: u16, upstream: &str, extra: &[&str]) -> Appliance {
    let d = Demux::start(tag);
    let cert = cert(&d.dir);
    let mut args = vec!["--upstream", upstream];
    args.extend_from_slice(extra);
    let w = (1..=workers).map(|id| Worker::start(&d, &cert, id, &args)).collect();
    d.wait_instances("workers placeable", |i| i.iter().filter(|x| x.1).count() == workers as usize);
    Appliance { d, _w: w, cert }
}

/// One exchange's result.
struct Exchange {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
}

/// The body as its length (a failed assertion prints no megabytes).
impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body_len", &self.body.len())
            .field("trailers", &self.trailers)
            .finish()
    }
}

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// Sends `method path` (or a whole `https://` URL) with `headers` and `body` (streamed in 64 KiB chunks, on a
/// task of its own so that sending and receiving overlap), reads the whole response.
/// `Err`: the response stream failed (after or before its head).
async fn exchange(
    send: &mut Sender,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<(u64, Option<HeaderMap>)>,
) -> Result<Exchange, String> {
    // `path`, or a whole URL for another authority.
    let uri = if path.starts_with("https://") { path.to_string() } else { format!("https://localhost{path}") };
    let mut req = Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let s = send.send_request(req.body(()).unwrap()).await.map_err(|e| e.to_string())?;
    let (mut tx, mut rx) = s.split();
    let sender = tokio::spawn(async move {
        if let Some((n, trailers)) = body {
            let mut off = 0;
            while off < n {
                let k = (n - off).min(64 * 1024) as usize;
                if tx.send_data(pattern_chunk(off, k)).await.is_err() {
                    return;
                }
                off += k as u64;
            }
            if let Some(t) = trailers {
                let _ = tx.send_trailers(t).await;
            }
        }
        let _ = tx.finish().await;
    });
    let resp = rx.recv_response().await.map_err(|e| format!("before head: {e}"))?;
    let mut out = Vec::new();
    while let Some(mut c) = rx.recv_data().await.map_err(|e| format!("after head: {e}"))? {
        while c.has_remaining() {
            let b = c.chunk();
            out.extend_from_slice(b);
            let n = b.len();
            c.advance(n);
        }
    }
    let trailers = rx.recv_trailers().await.map_err(|e| format!("trailers: {e}"))?;
    let _ = sender.await;
    Ok(Exchange { status: resp.status().as_u16(), headers: resp.headers().clone(), body: out, trailers })
}

async fn connect(a: &Appliance) -> (quinn::Endpoint, H3) {
    let ep = client_endpoint(&a.cert);
    let h3 = H3::connect(&ep, a.d.addr).await.unwrap();
    (ep, h3)
}

fn is_pattern(b: &[u8]) -> bool {
    b.iter().enumerate().all(|(i, x)| *x == (i % 256) as u8)
}

// ---------------------------------------------------------------------------

/// 32 MiB each way, byte-exact, over HTTP/1.1 and h2c upstreams, on TCP and on a
/// Unix socket: a GET of generated bytes, a POST counted by the upstream, and a
/// POST echoed back while it streams.
#[test]
fn bodies_of_32_mib_each_way_are_byte_exact() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let tcp = format!("{}", up.addr);
        let unix = format!("{}", up.unix.display());
        for (scheme, sep, at) in
            [("http", "://", &tcp), ("h2c", "://", &tcp), ("unix", ":", &unix), ("h2c+unix", ":", &unix)]
        {
            let tag = format!("proxy-big-{}", scheme.replace('+', "-"));
            let a = appliance(&tag, 1, &format!("{scheme}{sep}{at}"), &[]);
            let (_ep, h3) = connect(&a).await;
            let mut s = h3.sender();
            let n = 32 * MIB;
            let r = exchange(&mut s, "GET", &format!("/bytes/{n}"), &[], None).await.unwrap();
            assert_eq!((r.status, r.body.len() as u64), (200, n), "{scheme} GET");
            assert!(is_pattern(&r.body), "{scheme} GET body");
            assert_eq!(r.headers.get("content-length").unwrap(), &n.to_string());
            let want_version = if scheme.starts_with("h2c") { http::Version::HTTP_2 } else { http::Version::HTTP_11 };
            assert_eq!(up.last().version, want_version);

            let len = n.to_string();
            let r = exchange(&mut s, "POST", "/count", &[("content-length", &len)], Some((n, None))).await.unwrap();
            assert_eq!(String::from_utf8_lossy(&r.body), format!("len={n} pattern=true trailer="), "{scheme} POST");

            // Without Content-Length (chunked to HTTP/1.1), echoed while it streams.
            let r = exchange(&mut s, "POST", "/echo", &[], Some((n, None))).await.unwrap();
            assert_eq!((r.status, r.body.len() as u64), (200, n), "{scheme} echo");
            assert!(is_pattern(&r.body), "{scheme} echo body");
            h3.close();
        }
    });
}

/// The upstream sees the request as sent (method, path and query, Host = the
/// client's authority, its fields), minus hop-by-hop fields, plus `Forwarded` with
/// the client's address as the worker's QUIC connection sees it; the client sees the
/// upstream's response fields minus the hop-by-hop ones.
#[test]
fn headers_pass_as_sent_with_forwarded() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-headers", 1, &format!("http://{}", up.addr), &["--upstream-x-forwarded", "on"]);
        let (ep, h3) = connect(&a).await;
        let client = ep.local_addr().unwrap();
        let mut s = h3.sender();
        let r = exchange(
            &mut s,
            "GET",
            "/headers?q=1&r=%20",
            &[("x-custom", "a"), ("x-custom", "b"), ("accept", "text/plain"), ("forwarded", "for=198.51.100.9")],
            None,
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
        let seen = up.last();
        assert_eq!((seen.method.as_str(), seen.uri.to_string().as_str()), ("GET", "/headers?q=1&r=%20"));
        assert_eq!(seen.headers.get("host").unwrap(), "localhost");
        let custom: Vec<_> = seen.headers.get_all("x-custom").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(custom, ["a", "b"]);
        assert_eq!(seen.headers.get("accept").unwrap(), "text/plain");
        let fwd: Vec<_> = seen.headers.get_all("forwarded").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(fwd, ["for=198.51.100.9".to_string(), format!("for={};proto=https;host=localhost", client.ip())]);
        assert_eq!(seen.headers.get("x-forwarded-for").unwrap(), &client.ip().to_string());
        assert_eq!(seen.headers.get("x-forwarded-proto").unwrap(), "https");
        // Response: the upstream's fields, without what its Connection field names.
        assert_eq!(r.headers.get("x-resp").unwrap(), "yes");
        let cookies: Vec<_> = r.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(r.headers.get("x-hop").is_none() && r.headers.get("connection").is_none(), "{:?}", r.headers);
        h3.close();
    });
}

/// Trailers cross both ways where the upstream speaks HTTP/2.
#[test]
fn trailers_pass_through_an_h2c_upstream() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-trailers", 1, &format!("h2c://{}", up.addr), &[]);
        let (_ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        let r = exchange(&mut s, "GET", "/trailers", &[], None).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"body"[..]));
        assert_eq!(r.trailers.unwrap().get("x-checksum").unwrap(), "abc123");
        let mut t = HeaderMap::new();
        t.insert("x-checksum", "zz9".parse().unwrap());
        let r = exchange(&mut s, "POST", "/count", &[("te", "trailers")], Some((1000, Some(t)))).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&r.body), "len=1000 pattern=true trailer=zz9");
        h3.close();
    });
}

/// 502 for an upstream that refuses connections, 504 for one slower than
/// `--upstream-timeout`, 413 for bodies over `--upstream-max-body` (declared or not).
#[test]
fn errors_502_504_413() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        // A port nothing listens on: bound, then closed.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let a = appliance("proxy-502", 1, &format!("http://{dead}"), &[]);
        let (_ep, h3) = connect(&a).await;
        let r = exchange(&mut h3.sender(), "GET", "/x", &[], None).await.unwrap();
        assert_eq!(r.status, 502);
        h3.close();
        drop(a);
        // A Unix socket path nothing listens on.
        let none = temp_dir("none").join("none.sock");
        let a = appliance("proxy-502-unix", 1, &format!("unix:{}", none.display()), &[]);
        let (_ep, h3) = connect(&a).await;
        let r = exchange(&mut h3.sender(), "GET", "/x", &[], None).await.unwrap();
        assert_eq!(r.status, 502);
        h3.close();
        drop(a);

        let up = upstream().await;
        let extra = ["--upstream-timeout", "1", "--upstream-max-body", "100000"];
        let a = appliance("proxy-504", 1, &format!("http://{}", up.addr), &extra);
        let (_ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        let t0 = Instant::now();
        let r = exchange(&mut s, "GET", "/slow", &[], None).await.unwrap();
        assert_eq!(r.status, 504);
        assert!(t0.elapsed() < Duration::from_secs(4), "504 comes at the timeout, not the upstream's answer");
        // Declared too large: refused before the upstream sees it.
        let before = up.seen.lock().unwrap().len();
        let r =
            exchange(&mut s, "POST", "/count", &[("content-length", "200000")], Some((200_000, None))).await.unwrap();
        assert_eq!(r.status, 413);
        assert_eq!(up.seen.lock().unwrap().len(), before, "a declared 413 never reaches the upstream");
        // Undeclared and too large: refused once it passes the limit; the upstream
        // sees its body aborted, not a short one.
        let r = exchange(&mut s, "POST", "/count", &[], Some((300_000, None))).await.unwrap();
        assert_eq!(r.status, 413);
        assert_eq!(up.event(Duration::from_secs(5)).await, Some("request body aborted"));
        // At the limit: fine.
        let r = exchange(&mut s, "POST", "/count", &[], Some((100_000, None))).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&r.body), "len=100000 pattern=true trailer=");
        h3.close();
    });
}

/// A QUIC variable-length integer (RFC 9000 §16) read off `s`.
async fn read_varint(s: &mut quinn::RecvStream) -> u64 {
    let mut b = [0u8; 8];
    s.read_exact(&mut b[..1]).await.unwrap();
    let len = 1usize << (b[0] >> 6);
    s.read_exact(&mut b[1..len]).await.unwrap();
    let mut v = u64::from(b[0] & 0x3f);
    for x in &b[1..len] {
        v = (v << 8) | u64::from(*x);
    }
    v
}

/// The stream id of the server's GOAWAY (RFC 9114 §7.2.6), read off its control
/// stream (RFC 9114 §6.2.1), which the test accepts itself: the h3 client's driver
/// is never polled.
async fn read_goaway(conn: &quinn::Connection) -> u64 {
    loop {
        let mut s = conn.accept_uni().await.unwrap();
        if read_varint(&mut s).await != 0x00 {
            continue; // QPACK or a reserved stream type
        }
        loop {
            let (kind, len) = (read_varint(&mut s).await, read_varint(&mut s).await);
            if kind == 0x07 {
                return read_varint(&mut s).await;
            }
            let mut skip = vec![0u8; len as usize];
            s.read_exact(&mut skip).await.unwrap();
        }
    }
}

/// RFC 9114 §5.2: a request on a stream the GOAWAY still covers, taken after the
/// worker began draining, is answered 503 and never reaches the upstream. The window
/// is deterministic: the client's h3 driver is never polled, so the client learns
/// nothing of the GOAWAY (the test reads it off the control stream) and opens the
/// next request stream after it, well within the worker's wait for late requests
/// (at least 250 ms of quiet before it closes).
#[test]
fn a_request_taken_after_goaway_is_answered_503() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-late", 1, &format!("http://{}", up.addr), &["--drain-timeout", "10"]);
        let ep = client_endpoint(&a.cert);
        let conn = ep.connect(a.d.addr, "localhost").unwrap().await.unwrap();
        let (_unpolled_driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await.unwrap();
        let r = exchange(&mut send, "GET", "/bytes/10", &[], None).await.unwrap();
        assert_eq!((r.status, r.body.len()), (200, 10));
        let seen = up.seen.lock().unwrap().len();

        a._w[0].signal(libc::SIGTERM);
        let goaway = tokio::time::timeout(Duration::from_secs(10), read_goaway(&conn)).await.expect("GOAWAY");
        // The first request was stream 0; one more is let in (stream 4).
        assert_eq!(goaway, 4);
        let r = exchange(&mut send, "GET", "/bytes/10", &[], None).await.unwrap();
        assert_eq!((r.status, String::from_utf8_lossy(&r.body).as_ref()), (503, "draining\n"));
        assert_eq!(up.seen.lock().unwrap().len(), seen, "a late request never reaches the upstream");
    });
}

/// An upstream that breaks its response mid-body: the client's stream fails (a
/// reset), never a clean short body.
#[test]
fn upstream_closing_mid_body_resets_the_client_stream() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        for scheme in ["http", "h2c"] {
            let a = appliance(&format!("proxy-break-{scheme}"), 1, &format!("{scheme}://{}", up.addr), &[]);
            let (_ep, h3) = connect(&a).await;
            let r = exchange(&mut h3.sender(), "GET", "/break", &[], None).await;
            let e = r.expect_err("a broken upstream body must fail the client's stream");
            assert!(e.starts_with("after head"), "{scheme}: {e}");
            // The connection is still fine.
            let r = exchange(&mut h3.sender(), "GET", "/bytes/10", &[], None).await.unwrap();
            assert_eq!(r.body.len(), 10);
            h3.close();
        }
    });
}

/// A client that cancels its request (resets the stream) cancels the upstream's:
/// the upstream sees its response body dropped (a download) or its request body
/// aborted (an upload).
#[test]
fn client_reset_reaches_the_upstream() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        for scheme in ["http", "h2c"] {
            let a = appliance(&format!("proxy-reset-{scheme}"), 1, &format!("{scheme}://{}", up.addr), &[]);
            let (_ep, h3) = connect(&a).await;
            // Download: read a little, then stop.
            let req = Request::get("https://localhost/endless").body(()).unwrap();
            let mut st = h3.sender().send_request(req).await.unwrap();
            st.finish().await.unwrap();
            st.recv_response().await.unwrap();
            st.recv_data().await.unwrap().unwrap();
            assert_eq!(up.event(Duration::from_millis(300)).await, None, "{scheme}: not dropped while read");
            // Dropping the stream stops it (quinn: STOP_SENDING); h3-quinn's own
            // stop_sending may not be called while a read is in flight.
            drop(st);
            assert_eq!(up.event(Duration::from_secs(5)).await, Some("response body dropped"), "{scheme} download");

            // Upload: send part of a body, then reset.
            let req = Request::post("https://localhost/count").body(()).unwrap();
            let mut st = h3.sender().send_request(req).await.unwrap();
            st.send_data(pattern_chunk(0, 10_000)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            st.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
            drop(st);
            assert_eq!(up.event(Duration::from_secs(5)).await, Some("request body aborted"), "{scheme} upload");
            h3.close();
        }
    });
}

/// Python's http.server: HTTP/1.0 responses, a connection per request.
#[test]
fn python_http_server_upstream() {
    let dir = temp_dir("proxy-python");
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    let file: Vec<u8> = (0..3 * MIB as usize + 17).map(|i| (i % 256) as u8).collect();
    std::fs::write(root.join("f.bin"), &file).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut py = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1", "--directory"])
        .arg(&root)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "http.server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let a = appliance("proxy-python", 1, &format!("http://127.0.0.1:{port}"), &[]);
        let (_ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        for _ in 0..3 {
            let r = exchange(&mut s, "GET", "/f.bin", &[], None).await.unwrap();
            assert_eq!(r.status, 200);
            assert!(r.body == file, "byte-exact ({} bytes)", r.body.len());
        }
        let r = exchange(&mut s, "GET", "/missing", &[], None).await.unwrap();
        assert_eq!(r.status, 404);
        h3.close();
    });
    let _ = py.kill();
    let _ = py.wait();
}

/// 1,000 small requests at once over 50 connections, through the data plane to two
/// workers: every one answered, byte-exact, and both workers took connections.
#[test]
fn thousand_concurrent_requests_over_50_connections_and_2_workers() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-many", 2, &format!("http://{}", up.addr), &[]);
        let ep = client_endpoint(&a.cert);
        let mut conns = Vec::new();
        for _ in 0..50 {
            conns.push(H3::connect(&ep, a.d.addr).await.unwrap());
        }
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..1000usize {
            let mut s = conns[i % 50].sender();
            let n = 100 + i % 900;
            tasks.spawn(async move {
                let r = exchange(&mut s, "GET", &format!("/bytes/{n}"), &[], None).await;
                (n, r)
            });
        }
        let mut ok = 0;
        while let Some(r) = tasks.join_next().await {
            let (n, r) = r.unwrap();
            let r = r.unwrap_or_else(|e| panic!("request for {n} bytes: {e}"));
            assert_eq!((r.status, r.body.len()), (200, n));
            assert!(is_pattern(&r.body));
            ok += 1;
        }
        assert_eq!(ok, 1000);
        assert_eq!(up.seen.lock().unwrap().len(), 1000);
        // Both workers served (the data plane spreads new connections).
        let served: Vec<u64> = a.d.instances().iter().map(|i| i.2).collect();
        assert!(served.len() == 2 && served.iter().all(|d| *d > 0), "datagrams per worker: {served:?}");
        for c in conns {
            c.close();
        }
    });
}

// ---------------------------------------------------------------------------
// Other clients: aioquic and gtlsclient, a GET each through the proxy.

#[test]
fn aioquic_gets_through_the_proxy() {
    if !testkit::bin::have_aioquic() {
        return;
    }
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-aioquic", 1, &format!("h2c://{}", up.addr), &[]);
        let script = testkit::bin::python_script("aioquic_h3_get.py");
        let out_path = a.d.dir.join("aioquic.out");
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .args(["127.0.0.1", &a.d.addr.port().to_string(), &format!("/bytes/{MIB}")])
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(Stdio::piped());
        let (ok, log) =
            tokio::task::spawn_blocking(move || run_with_timeout(cmd, Duration::from_secs(40))).await.unwrap();
        let line = std::fs::read_to_string(&out_path).unwrap_or_default();
        assert!(ok && line.contains(&format!("status=200 bytes={MIB} ")) && line.contains("ok=True"), "{line} {log}");
        assert_eq!(up.last().uri.path(), format!("/bytes/{MIB}"));
    });
}

#[test]
fn gtlsclient_gets_through_the_proxy() {
    let have = Command::new("gtlsclient").arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !have_tool(have, "gtlsclient (ngtcp2-client)") {
        return;
    }
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-gtls", 1, &format!("http://{}", up.addr), &[]);
        let dl = a.d.dir.join("dl");
        std::fs::create_dir_all(&dl).unwrap();
        let port = a.d.addr.port().to_string();
        let mut cmd = Command::new("gtlsclient");
        cmd.args(["-q", "--exit-on-all-streams-close", "--timeout=15s"])
            .arg(format!("--download={}", dl.display()))
            .args(["127.0.0.1", &port, &format!("https://localhost:{port}/bytes/{MIB}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let (ok, log) =
            tokio::task::spawn_blocking(move || run_with_timeout(cmd, Duration::from_secs(40))).await.unwrap();
        let got = std::fs::read(dl.join(MIB.to_string())).unwrap_or_default();
        assert!(ok && got.len() as u64 == MIB && is_pattern(&got), "gtlsclient: {} bytes; {log}", got.len());
        assert_eq!(up.last().uri.path(), format!("/bytes/{MIB}"));
    });
}

/// `--access-log FILE --access-log-format json`: one line per request with the
/// client's address, the server id, method, authority, path, status, bytes each way
/// and the times; SIGHUP reopens the file (after a rotation), and text lines too.
#[test]
fn access_log_lines_and_reopen_on_sighup() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let dir = temp_dir("proxy-accesslog");
        let log = dir.join("access.log");
        let log_s = log.to_str().unwrap().to_string();
        let extra = ["--access-log", &log_s, "--access-log-format", "json"];
        let a = appliance("proxy-accesslog", 1, &format!("http://{}", up.addr), &extra);
        let (ep, h3) = connect(&a).await;
        let client = ep.local_addr().unwrap();
        let mut s = h3.sender();
        let r = exchange(&mut s, "GET", "/bytes/1234?x=1", &[], None).await.unwrap();
        assert_eq!(r.status, 200);
        let r = exchange(&mut s, "POST", "/count", &[], Some((5000, None))).await.unwrap();
        assert_eq!(r.status, 200);
        let lines = |p: &Path| -> Vec<serde_json::Value> {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
                .collect()
        };
        // The line is written when the request's task ends, just after the response.
        let deadline = Instant::now() + Duration::from_secs(5);
        while lines(&log).len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let l = lines(&log);
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!(l[0]["client"], client.to_string());
        assert_eq!(l[0]["server_id"], 1);
        assert_eq!((l[0]["method"].as_str(), l[0]["authority"].as_str()), (Some("GET"), Some("localhost")));
        assert_eq!((l[0]["path"].as_str(), l[0]["status"].as_u64()), (Some("/bytes/1234?x=1"), Some(200)));
        assert_eq!((l[0]["bytes_in"].as_u64(), l[0]["bytes_out"].as_u64()), (Some(0), Some(1234)));
        assert!(l[0]["time"].as_str().unwrap().ends_with('Z'));
        let (total, upstream) = (l[0]["total_ms"].as_f64().unwrap(), l[0]["upstream_ms"].as_f64().unwrap());
        assert!(upstream > 0.0 && total >= upstream, "{total} {upstream}");
        let body = "len=5000 pattern=true trailer=".len() as u64;
        assert_eq!((l[1]["method"].as_str(), l[1]["bytes_in"].as_u64()), (Some("POST"), Some(5000)));
        assert_eq!(l[1]["bytes_out"].as_u64(), Some(body));

        // Rotation: move the file away, SIGHUP, and the next line goes to a new file.
        let rotated = dir.join("access.log.1");
        std::fs::rename(&log, &rotated).unwrap();
        a._w[0].signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !log.exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(log.exists(), "SIGHUP reopened (created) the access log");
        let r = exchange(&mut s, "GET", "/nope", &[], None).await.unwrap();
        assert_eq!(r.status, 404);
        let deadline = Instant::now() + Duration::from_secs(5);
        while lines(&log).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(lines(&rotated).len(), 2);
        let l = lines(&log);
        assert_eq!((l.len(), l[0]["status"].as_u64()), (1, Some(404)));
        h3.close();
        drop(a);

        // Text: the common log format's first fields.
        let log = dir.join("access.txt");
        let log_s = log.to_str().unwrap().to_string();
        let a = appliance("proxy-accesslog-text", 1, &format!("http://{}", up.addr), &["--access-log", &log_s]);
        let (ep, h3) = connect(&a).await;
        let client = ep.local_addr().unwrap();
        exchange(&mut h3.sender(), "GET", "/bytes/10", &[], None).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&log).unwrap_or_default().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let want = format!("{client} - - [");
        assert!(text.starts_with(&want), "{text}");
        assert!(text.contains("] \"GET /bytes/10 HTTP/3\" 200 10 \"localhost\" server_id=1 in=0 total_ms="), "{text}");
        h3.close();
    });
}

/// `Forwarded` carries the client's address as the QUIC path has it when the request
/// arrives: after the client moves from 127.0.0.1 to 127.0.0.2 (connection
/// migration, RFC 9000 §9), the new one.
#[test]
fn forwarded_follows_a_migrated_client() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = upstream().await;
        let a = appliance("proxy-migrate", 1, &format!("http://{}", up.addr), &[]);
        let (ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        exchange(&mut s, "GET", "/bytes/1", &[], None).await.unwrap();
        let fwd = |seen: Seen| seen.headers.get("forwarded").unwrap().to_str().unwrap().to_string();
        assert_eq!(fwd(up.last()), "for=127.0.0.1;proto=https;host=localhost");
        ep.rebind(std::net::UdpSocket::bind("127.0.0.2:0").unwrap()).unwrap();
        // The first packets from the new address carry this request.
        exchange(&mut s, "GET", "/bytes/2", &[], None).await.unwrap();
        assert_eq!(fwd(up.last()), "for=127.0.0.2;proto=https;host=localhost");
        h3.close();
    });
}

/// Without `--upstream` the access log has the built-in routes' requests (no
/// upstream time).
#[test]
fn access_log_of_built_in_routes() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let d = Demux::start("proxy-accesslog-builtin");
        let cert = cert(&d.dir);
        let log = d.dir.join("access.log");
        let log_s = log.to_str().unwrap().to_string();
        let w = Worker::start(&d, &cert, 9, &["--access-log", &log_s, "--access-log-format", "json"]);
        d.wait_instances("worker placeable", |i| i.iter().any(|x| x.1));
        let ep = client_endpoint(&cert);
        let h3 = H3::connect(&ep, d.addr).await.unwrap();
        let r = exchange(&mut h3.sender(), "GET", "/bytes/100", &[], None).await.unwrap();
        assert_eq!((r.status, r.body.len()), (200, 100));
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&log).unwrap_or_default().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let l: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(
            (l["server_id"].as_u64(), l["status"].as_u64(), l["bytes_out"].as_u64()),
            (Some(9), Some(200), Some(100))
        );
        assert_eq!((l["path"].as_str(), l["upstream_ms"].is_null()), (Some("/bytes/100"), true));
        assert_eq!(l["client"], ep.local_addr().unwrap().to_string());
        h3.close();
        drop(w);
    });
}

// ---------------------------------------------------------------------------
// Routes, retries and the passive health check.

/// Requests each upstream has seen.
fn seen_count(u: &Upstream) -> usize {
    u.seen.lock().unwrap().len()
}

/// Two upstreams: the default, and `/api` (segment boundaries) and the host
/// `other.example` (any case, any port) on the second.
#[test]
fn routes_pick_the_upstream_by_authority_and_path_prefix() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let (a_up, b_up) = (upstream().await, upstream().await);
        let api = format!("/api=http://{}", b_up.addr);
        let other = format!("other.example=h2c://{}", b_up.addr);
        let a =
            appliance("proxy-routes", 1, &format!("http://{}", a_up.addr), &["--upstream", &api, "--upstream", &other]);
        let (_ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        // (request, whether the second upstream takes it)
        let cases = [
            ("/bytes/3", false),
            ("/api", true),
            ("/api/bytes/3", true),
            ("/apix", false),
            ("https://OTHER.example:8443/bytes/3", true),
            ("https://other.example/apix", true),
            ("https://third.example/api/x", true),
            ("https://third.example/x", false),
        ];
        for (path, to_b) in cases {
            let (na, nb) = (seen_count(&a_up), seen_count(&b_up));
            let r = exchange(&mut s, "GET", path, &[], None).await.unwrap();
            assert!(r.status == 200 || r.status == 404, "{path}: {r:?}");
            let want = if to_b { (na, nb + 1) } else { (na + 1, nb) };
            assert_eq!((seen_count(&a_up), seen_count(&b_up)), want, "{path}");
        }
        let paths: Vec<String> = b_up.seen.lock().unwrap().iter().map(|x| x.uri.path().to_string()).collect();
        assert_eq!(paths, ["/api", "/api/bytes/3", "/bytes/3", "/apix", "/api/x"], "paths pass as sent");
        assert_eq!(b_up.seen.lock().unwrap()[2].version, http::Version::HTTP_2, "other.example goes over h2c");
        h3.close();
    });
}

/// An HTTP/1.1 upstream that closes each accepted connection without answering
/// while `close` is above zero (counting it down), then answers 200 `served` with
/// `connection: close` (so no connection is reused); counts accepted connections.
struct Flaky {
    addr: SocketAddr,
    accepts: Arc<AtomicU64>,
    close: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Flaky {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn flaky() -> Flaky {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepts, close) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (n, c) = (Arc::clone(&accepts), Arc::clone(&close));
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            n.fetch_add(1, Ordering::SeqCst);
            if c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1)).is_ok() {
                drop(tcp);
                continue;
            }
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::builder().header("connection", "close").body(full("served")).unwrap())
                });
                let b = hyper::server::conn::http1::Builder::new();
                let _ = b.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc).await;
            });
        }
    });
    Flaky { addr, accepts, close, task }
}

/// A GET whose first connection closes unanswered is retried and served; a POST is
/// not retried. Three connection errors in a row take the upstream down: 502 at
/// once without a connection attempt, until one trial after `--upstream-down-ms`
/// brings it back. The exit line counts retries, rejects and downs.
#[test]
fn idempotent_retry_and_passive_health() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = flaky().await;
        let mut a = appliance("proxy-health", 1, &format!("http://{}", up.addr), &["--upstream-down-ms", "1500"]);
        let (_ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        let accepts = || up.accepts.load(Ordering::SeqCst);

        up.close.store(1, Ordering::SeqCst);
        let r = exchange(&mut s, "GET", "/r", &[], None).await.unwrap();
        assert_eq!((r.status, r.body.as_slice(), accepts()), (200, &b"served"[..], 2), "GET retried once");

        up.close.store(1, Ordering::SeqCst);
        let r = exchange(&mut s, "POST", "/r", &[], None).await.unwrap();
        assert_eq!((r.status, accepts()), (502, 3), "POST not retried");
        // A response clears the run of failures: two more do not take it down.
        let r = exchange(&mut s, "DELETE", "/r", &[], None).await.unwrap();
        assert_eq!((r.status, accepts()), (200, 4));

        up.close.store(3, Ordering::SeqCst);
        for i in 1..=3 {
            let r = exchange(&mut s, "POST", "/r", &[], None).await.unwrap();
            assert_eq!((r.status, accepts()), (502, 4 + i), "failure {i}");
        }
        // Down: 502 without dialing (the upstream would now serve).
        for _ in 0..2 {
            let r = exchange(&mut s, "GET", "/r", &[], None).await.unwrap();
            assert_eq!((r.status, r.body.as_slice(), accepts()), (502, &b"upstream down\n"[..], 7));
        }
        // After the period, one trial: served, and the upstream is up again.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        for k in 1..=2 {
            let r = exchange(&mut s, "GET", "/r", &[], None).await.unwrap();
            assert_eq!((r.status, accepts()), (200, 7 + k));
        }
        h3.close();
        let w = &mut a._w[0];
        w.signal(libc::SIGTERM);
        let (_, log) = w.wait_exit(Duration::from_secs(10));
        let stat = |k: &str| Worker::exit_stat(&log, k).unwrap_or_else(|| panic!("{k} in {log}"));
        assert_eq!((stat("upstream_retries"), stat("upstream_down_rejects"), stat("upstream_marked_down")), (1, 2, 1));
    });
}

/// The passive health state is each worker's own: with two workers, the upstream
/// taken down by one worker's three failures is still tried (and served) by the
/// other. New connections land on either worker (the data plane's rendezvous
/// placement by connection id), so the test opens connections until it has met
/// both: one answering `upstream down` without dialing, one dialing and served.
#[test]
fn passive_health_is_per_worker() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        let up = flaky().await;
        let a = appliance("proxy-health2", 2, &format!("http://{}", up.addr), &["--upstream-down-ms", "60000"]);
        let accepts = || up.accepts.load(Ordering::SeqCst);
        let (_ep, h3) = connect(&a).await;
        let mut s = h3.sender();
        up.close.store(3, Ordering::SeqCst);
        for i in 1..=3 {
            let r = exchange(&mut s, "POST", "/r", &[], None).await.unwrap();
            assert_eq!((r.status, accepts()), (502, i), "failure {i}");
        }
        let r = exchange(&mut s, "GET", "/r", &[], None).await.unwrap();
        assert_eq!((r.status, r.body.as_slice(), accepts()), (502, &b"upstream down\n"[..], 3));
        h3.close();

        let (mut down, mut served) = (0, 0);
        for _ in 0..30 {
            let (_ep, h3) = connect(&a).await;
            let before = accepts();
            let r = exchange(&mut h3.sender(), "GET", "/r", &[], None).await.unwrap();
            match (r.status, r.body.as_slice()) {
                (502, b"upstream down\n") => {
                    assert_eq!(accepts(), before, "the worker that took it down does not dial");
                    down += 1;
                }
                (200, b"served") => {
                    assert_eq!(accepts(), before + 1, "the other worker dials");
                    served += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
            h3.close();
            if down > 0 && served > 0 {
                break;
            }
        }
        assert!(down > 0 && served > 0, "both workers met: down {down}, served {served}");
    });
}

/// A GET whose stream ends (FIN) only after its HEADERS, in a later packet, is
/// still a GET without a body: no chunked encoding towards HTTP/1.1, and retried
/// once after a connection error like any other.
#[test]
fn a_get_whose_fin_comes_late_is_bodiless() {
    let rt = testkit::h3client::runtime();
    rt.block_on(async {
        async fn late_fin_get(send: &mut Sender, path: &str) -> (u16, Vec<u8>) {
            let req = Request::builder().method("GET").uri(format!("https://localhost{path}")).body(()).unwrap();
            let mut s = send.send_request(req).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            s.finish().await.unwrap();
            let resp = s.recv_response().await.unwrap();
            let mut body = Vec::new();
            while let Some(mut c) = s.recv_data().await.unwrap() {
                while c.has_remaining() {
                    let n = c.chunk().len();
                    body.extend_from_slice(c.chunk());
                    c.advance(n);
                }
            }
            (resp.status().as_u16(), body)
        }
        let up = upstream().await;
        let a = appliance("proxy-latefin", 1, &format!("http://{}", up.addr), &[]);
        let (_ep, h3) = connect(&a).await;
        let (status, _) = late_fin_get(&mut h3.sender(), "/headers").await;
        assert_eq!(status, 200);
        let seen = up.last();
        assert!(seen.headers.get("transfer-encoding").is_none(), "{:?}", seen.headers);
        assert!(seen.headers.get("content-length").is_none(), "{:?}", seen.headers);
        h3.close();

        let flaky = flaky().await;
        let a = appliance("proxy-latefin2", 1, &format!("http://{}", flaky.addr), &[]);
        let (_ep, h3) = connect(&a).await;
        flaky.close.store(1, Ordering::SeqCst);
        let (status, body) = late_fin_get(&mut h3.sender(), "/r").await;
        assert_eq!((status, body.as_slice(), flaky.accepts.load(Ordering::SeqCst)), (200, &b"served"[..], 2));
        h3.close();
    });
}
