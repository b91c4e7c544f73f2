//! Graceful drain (docs/operations.md "Lifecycle", RFC 9114 §5.2): one signal every connection
//! task watches, and a count of open connections so the process can exit when idle.
//!
//! Order on SIGTERM (driven by the binary): `Draining` on the data connection (the
//! data plane places nothing new here), [`Drain::start`] (new Incomings are refused,
//! every HTTP/3 connection sends GOAWAY and finishes its accepted requests, then
//! closes with H3_NO_ERROR), [`Drain::idle`] or the drain timeout, exit.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{watch, Notify};

#[derive(Debug)]
struct Inner {
    tx: watch::Sender<bool>,
    open: AtomicUsize,
    total: AtomicU64,
    idle: Notify,
}

/// Shared drain state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Drain(Arc<Inner>);

impl Default for Drain {
    fn default() -> Self {
        Drain::new()
    }
}

impl Drain {
    pub fn new() -> Drain {
        let (tx, _) = watch::channel(false);
        Drain(Arc::new(Inner { tx, open: AtomicUsize::new(0), total: AtomicU64::new(0), idle: Notify::new() }))
    }

    /// Starts draining (idempotent).
    pub fn start(&self) {
        self.0.tx.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        *self.0.tx.borrow()
    }

    /// Resolves once draining has started.
    pub async fn started(&self) {
        let mut rx = self.0.tx.subscribe();
        // The sender lives in `self`, so wait_for only ends when the value is true.
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Counts a connection as open until the guard drops.
    pub fn track(&self) -> ConnGuard {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        self.0.total.fetch_add(1, Ordering::Relaxed);
        ConnGuard(self.clone())
    }

    pub fn open_connections(&self) -> usize {
        self.0.open.load(Ordering::Acquire)
    }

    pub fn total_connections(&self) -> u64 {
        self.0.total.load(Ordering::Relaxed)
    }

    /// Resolves when no connection is open.
    pub async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            if self.open_connections() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Keeps one connection counted as open.
#[derive(Debug)]
pub struct ConnGuard(Drain);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if self.0 .0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0 .0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_after_last_guard_and_start_signal() {
        let d = Drain::new();
        let g1 = d.track();
        let g2 = d.track();
        assert_eq!(d.open_connections(), 2);
        let d2 = d.clone();
        let waiter = tokio::spawn(async move { d2.idle().await });
        drop(g1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(g2);
        tokio::time::timeout(Duration::from_secs(1), waiter).await.unwrap().unwrap();
        assert!(!d.is_draining());
        let d3 = d.clone();
        let s = tokio::spawn(async move { d3.started().await });
        d.start();
        tokio::time::timeout(Duration::from_secs(1), s).await.unwrap().unwrap();
        assert!(d.is_draining());
        assert_eq!(d.total_connections(), 2);
    }
}
