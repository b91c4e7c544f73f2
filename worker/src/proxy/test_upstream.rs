//! Test-only upstream on loopback for the pool and h2c client tests: answers
//! `ok PATH` over HTTP/1.1 or h2c, counts the connections it accepted and keeps their
//! tasks, so a test can close them from the upstream's side.

use http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Which protocol the upstream speaks.
#[derive(Clone, Copy)]
pub enum Speaks {
    Http1,
    H2c,
}

pub struct Server {
    pub addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Server {
    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections still served (their task not ended).
    pub fn open(&self) -> usize {
        self.conns.lock().unwrap().iter().filter(|t| !t.is_finished()).count()
    }

    /// Closes every connection from the upstream's side.
    pub fn close_all(&self) {
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

pub async fn server(speaks: Speaks) -> Server {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let conns = Arc::new(Mutex::new(Vec::new()));
    let (a, c) = (Arc::clone(&accepted), Arc::clone(&conns));
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                let body = bytes::Bytes::from(format!("ok {}", req.uri().path()));
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(body)))
            });
            let io = TokioIo::new(s);
            let t = tokio::spawn(async move {
                let _ = match speaks {
                    Speaks::Http1 => hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await,
                    Speaks::H2c => {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new()).serve_connection(io, svc).await
                    }
                };
            });
            c.lock().unwrap().push(t);
        }
    });
    Server { addr, accepted, conns }
}
