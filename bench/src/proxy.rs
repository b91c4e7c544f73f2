//! `bench proxy`: the worker as a reverse proxy (`--upstream`, docs/operations.md
//! "Reverse proxy") against the same worker serving `/bytes/N` itself
//! (docs/benchmarks.md "Reverse proxy: `bench proxy`").
//!
//! It is `bench h3` (h3.rs) with two contenders, (b) `fast` and (e) `proxy`: the
//! same appliance (one worker, fast path on), (e) started with
//! `--worker-arg=--upstream=http://ADDR` to the HTTP/1.1 upstream below, and two
//! loads, `get-1k` and `download` (32 MiB by default). Server CPU is that of the
//! appliance's processes; the upstream's (a thread of this process) is measured
//! and reported on its own.

use crate::cli::{H3Args, ProxyArgs};
use crate::h3::{Flavor, Sum, Target};
use anyhow::{Context, Result};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};

const BEGIN: &str = "<!-- bench proxy: begin";
const END: &str = "<!-- bench proxy: end -->";
/// The upstream's body chunk (a slice of one shared pattern buffer).
const CHUNK: usize = 64 * 1024;

/// The upstream: a hyper 1.x HTTP/1.1 server (keep-alive) on one thread of a
/// current-thread tokio runtime, serving `GET /bytes/N` (N bytes of a fixed
/// pattern, streamed in 64 KiB chunks) and 404 to anything else.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    /// The serving thread, for its CPU time.
    tid: u32,
    requests: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    /// Listening on 127.0.0.1 (a free port), its thread pinned to `core` if given.
    pub(crate) fn start(core: Option<usize>) -> Result<Upstream> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("upstream: bind 127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("upstream runtime")?;
        let counter = requests.clone();
        let thread = std::thread::Builder::new().name("upstream".into()).spawn(move || {
            if let Some(c) = core {
                crate::sys::pin(c);
            }
            // `/proc/thread-self` links to `PID/task/TID`.
            let tid =
                std::fs::read_link("/proc/thread-self").ok().and_then(|l| l.file_name()?.to_str()?.parse::<u32>().ok());
            let _ = tid_tx.send(tid);
            rt.block_on(serve(listener, counter, stopped));
        })?;
        let tid = tid_rx.recv().ok().flatten().context("upstream thread: no id in /proc/thread-self")?;
        Ok(Upstream { addr, tid, requests, stop: Some(stop), thread: Some(thread) })
    }

    /// CPU time of the serving thread so far (schedstat(5)'s first field; 0 when
    /// unreadable).
    pub(crate) fn cpu_ns(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/self/task/{}/schedstat", self.tid))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Requests answered so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    requests: Arc<AtomicU64>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return eprintln!("upstream: {e}"),
    };
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => a,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let requests = requests.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let resp = respond(req.uri().path());
                if resp.status() == http::StatusCode::OK {
                    requests.fetch_add(1, Ordering::Relaxed);
                }
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// `/bytes/N`: 200 with N bytes; anything else 404.
fn respond(path: &str) -> hyper::Response<Pattern> {
    let n = path.strip_prefix("/bytes/").and_then(|n| n.parse::<u64>().ok());
    let mut resp = hyper::Response::new(Pattern { left: n.unwrap_or(0) });
    if n.is_none() {
        *resp.status_mut() = http::StatusCode::NOT_FOUND;
    }
    resp
}

/// A body of `left` more bytes of a fixed pattern, with an exact size (so HTTP/1.1
/// sends `content-length`).
struct Pattern {
    left: u64,
}

fn pattern() -> Bytes {
    static P: OnceLock<Bytes> = OnceLock::new();
    P.get_or_init(|| (0..CHUNK).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()).clone()
}

impl http_body::Body for Pattern {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(CHUNK as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(pattern().slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// (e)/(b) CPU per request (download: per MB) ≤ 2 for each load; rates reported.
pub(crate) fn targets(sums: &[Sum]) -> Vec<Target> {
    let mut out = Vec::new();
    for load in ["get-1k", "download"] {
        let (Some(b), Some(e)) = (crate::h3::find(sums, "fast", load), crate::h3::find(sums, "proxy", load)) else {
            continue;
        };
        let per = if load == "download" { "MB" } else { "request" };
        let r = e.server_us / b.server_us;
        out.push(Target { what: format!("(e)/(b) server CPU per {per}, {load} ≤ 2"), ratio: r, met: Some(r <= 2.0) });
        let (rate, unit) = if load == "download" { (e.mbps / b.mbps, "MB/s") } else { (e.rate / b.rate, "requests/s") };
        out.push(Target { what: format!("(e)/(b) {unit}, {load} (reported)"), ratio: rate, met: None });
    }
    out
}

pub fn main(a: ProxyArgs) -> Result<()> {
    let upstream = Upstream::start(Some(a.rounds.load_core))?;
    let o = H3Args {
        seconds: a.seconds,
        contenders: vec!["fast".into(), "proxy".into()],
        loads: vec!["get-1k".into(), "download".into()],
        connections: a.connections,
        handshakes: 1,
        download_mib: a.download_mib,
        rounds: a.rounds,
        out: a.out,
    };
    let conditions = format!(
        " (e): the appliance as (b), its worker with `--upstream http://{}`: a hyper 1.x HTTP/1.1 server (keep-alive, `/bytes/N` streamed in 64 KiB chunks) on one thread of the bench, pinned to the client's core {}; its CPU is not in the server CPU but in its own column (and in the client cores, the same process).",
        upstream.addr, o.rounds.load_core
    );
    let flavor = Flavor {
        command: "proxy",
        markers: (BEGIN, END),
        base: "fast",
        title: "HTTP/3 through the worker as a reverse proxy, served per second over (b) the built-in /bytes/N",
        line: 1.0,
        targets,
        conditions,
        upstream: Some(&upstream),
    };
    crate::h3::run(o, &flavor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body;
    use http_body_util::BodyExt;

    fn sum(kind: &str, load: &str, rate: f64, mbps: f64, server_us: f64) -> Sum {
        crate::h3::test_sum(kind, load, rate, mbps, server_us, 5.0)
    }

    #[test]
    fn targets_compare_e_with_b() {
        let sums = vec![
            sum("fast", "get-1k", 1000.0, 1.0, 10.0),
            sum("proxy", "get-1k", 400.0, 0.4, 20.0),
            sum("fast", "download", 30.0, 1000.0, 800.0),
            sum("proxy", "download", 20.0, 600.0, 1601.0),
        ];
        let t = targets(&sums);
        let got: Vec<(&str, f64, Option<bool>)> = t.iter().map(|x| (x.what.as_str(), x.ratio, x.met)).collect();
        // Exactly at 2× is met; just past it is missed; rates over (b)'s, reported.
        assert_eq!(
            got,
            [
                ("(e)/(b) server CPU per request, get-1k ≤ 2", 2.0, Some(true)),
                ("(e)/(b) requests/s, get-1k (reported)", 0.4, None),
                ("(e)/(b) server CPU per MB, download ≤ 2", 1601.0 / 800.0, Some(false)),
                ("(e)/(b) MB/s, download (reported)", 0.6, None),
            ]
        );
        // A load without both contenders has no target.
        assert_eq!(targets(&sums[..3]).len(), 2);
    }

    #[test]
    fn pattern_body_has_exactly_its_length() {
        for n in [0u64, 1, CHUNK as u64 - 1, CHUNK as u64, CHUNK as u64 + 1, 3 * CHUNK as u64 + 7] {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let body = respond(&format!("/bytes/{n}")).into_body();
            assert_eq!(body.size_hint().exact(), Some(n));
            let got = rt.block_on(body.collect()).unwrap().to_bytes();
            assert_eq!(got.len() as u64, n);
            assert!(got.iter().enumerate().all(|(i, b)| *b == ((i % CHUNK) % 251) as u8));
        }
        assert_eq!(respond("/other").status(), http::StatusCode::NOT_FOUND);
        assert_eq!(respond("/bytes/x").status(), http::StatusCode::NOT_FOUND);
    }
}
