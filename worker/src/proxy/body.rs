//! The request body on its way upstream: a small bounded channel from the task that
//! reads the HTTP/3 request stream ([`pump`]) to the hyper body ([`RequestBody`]), so
//! at most [`BODY_QUEUE`] chunks wait per request and a slow upstream slows the
//! client (QUIC flow control) instead of filling memory.
//!
//! The body ends cleanly only at the explicit end of the request ([`Chunk::End`]); if
//! the reader stops first (client reset, body over the limit), the body ends with an
//! error, so the upstream sees an aborted request, never a short one.

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Chunks queued between the HTTP/3 stream and the upstream connection.
pub const BODY_QUEUE: usize = 4;

/// What the reader sends.
#[derive(Debug)]
pub enum Chunk {
    Data(Bytes),
    Trailers(HeaderMap),
    End,
}

/// The request body ended without its end: the client reset its stream or the body
/// went over the limit.
#[derive(Debug)]
pub struct BodyAborted;

impl std::fmt::Display for BodyAborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body aborted")
    }
}

impl std::error::Error for BodyAborted {}

/// The upstream request's body.
#[derive(Debug)]
pub struct RequestBody {
    rx: Option<mpsc::Receiver<Chunk>>,
    /// Exact length (Content-Length) when known.
    len: Option<u64>,
}

impl RequestBody {
    /// An empty body (the request stream ended with its headers).
    pub fn empty() -> RequestBody {
        RequestBody { rx: None, len: Some(0) }
    }

    /// A body fed by a [`pump`] through `rx`; `len` from Content-Length.
    pub fn channel(rx: mpsc::Receiver<Chunk>, len: Option<u64>) -> RequestBody {
        RequestBody { rx: Some(rx), len }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyAborted;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyAborted>>> {
        let Some(rx) = self.rx.as_mut() else { return Poll::Ready(None) };
        let last = match rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Chunk::Data(b))) => return Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(Some(Chunk::Trailers(t))) => Some(Ok(Frame::trailers(t))),
            Poll::Ready(Some(Chunk::End)) => None,
            Poll::Ready(None) => Some(Err(BodyAborted)),
        };
        // Trailers, the end or an abort: nothing follows.
        self.rx = None;
        Poll::Ready(last)
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// How the request stream's reader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpEnd {
    /// The whole request went into the body.
    Complete,
    /// More than the body limit: reading stopped (the client is told to stop sending).
    TooLarge,
    /// The client reset the stream (or the connection went away).
    ClientGone,
    /// The upstream no longer reads the body (it answered or failed).
    UpstreamGone,
}

/// What the reader has done so far, shared with the request's task.
#[derive(Debug, Default)]
pub struct Progress {
    /// Request body bytes read.
    pub bytes: AtomicU64,
    /// The body went over the limit. Set before the body is aborted, so that the
    /// upstream request's failure can be told from an upstream fault.
    pub too_large: AtomicBool,
}

/// The HTTP/3 request stream's receive side.
pub type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// Reads the request body (and trailers) into `tx`, `first` first. Counts bytes in
/// `progress`; past `limit` stops with [`PumpEnd::TooLarge`].
pub async fn pump(
    mut recv: H3Recv,
    tx: mpsc::Sender<Chunk>,
    first: Option<Bytes>,
    limit: u64,
    progress: Arc<Progress>,
) -> PumpEnd {
    let mut next = first;
    loop {
        let chunk = match next.take() {
            Some(b) => b,
            None => match recv.recv_data().await {
                Ok(Some(mut buf)) => buf.copy_to_bytes(buf.remaining()),
                Ok(None) => break,
                Err(_) => return PumpEnd::ClientGone,
            },
        };
        let total = progress.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
        if total > limit {
            progress.too_large.store(true, Ordering::Release);
            // Dropping `recv` stops the stream (quinn: STOP_SENDING). Not h3's
            // stop_sending: h3-quinn 0.0.10 panics there while a read is in flight,
            // which h3 may leave behind after returning data.
            return PumpEnd::TooLarge;
        }
        if tx.send(Chunk::Data(chunk)).await.is_err() {
            return PumpEnd::UpstreamGone;
        }
    }
    let last = match recv.recv_trailers().await {
        Ok(Some(t)) => Chunk::Trailers(t),
        Ok(None) => Chunk::End,
        Err(_) => return PumpEnd::ClientGone,
    };
    if tx.send(last).await.is_err() {
        return PumpEnd::UpstreamGone;
    }
    PumpEnd::Complete
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn ends_cleanly_only_at_the_end() {
        let (tx, rx) = mpsc::channel(BODY_QUEUE);
        let mut b = RequestBody::channel(rx, None);
        tx.send(Chunk::Data(Bytes::from_static(b"ab"))).await.unwrap();
        tx.send(Chunk::End).await.unwrap();
        assert_eq!(b.frame().await.unwrap().unwrap().into_data().unwrap(), "ab");
        assert!(b.frame().await.is_none());
        assert!(b.is_end_stream());

        let (tx, rx) = mpsc::channel(BODY_QUEUE);
        let mut b = RequestBody::channel(rx, Some(10));
        assert_eq!(b.size_hint().exact(), Some(10));
        tx.send(Chunk::Data(Bytes::from_static(b"ab"))).await.unwrap();
        drop(tx);
        assert!(b.frame().await.unwrap().is_ok());
        assert!(b.frame().await.unwrap().is_err(), "a reader that stops early aborts the body");
        assert!(b.frame().await.is_none());

        let (tx, rx) = mpsc::channel(BODY_QUEUE);
        let mut b = RequestBody::channel(rx, None);
        let mut t = HeaderMap::new();
        t.insert("x-sum", "1".parse().unwrap());
        tx.send(Chunk::Trailers(t.clone())).await.unwrap();
        assert_eq!(b.frame().await.unwrap().unwrap().into_trailers().unwrap(), t);
        assert!(b.frame().await.is_none());
        assert!(RequestBody::empty().is_end_stream());
    }
}
