//! The load report (docs/wire.md `Load`, docs/operations.md "Liveness and
//! pressure"): every [`LOAD_INTERVAL`] the worker tells the data plane, on its data
//! connection, how many handshakes are in progress and how many bytes its QUIC stack
//! buffers for connections not yet accepted. The message is also the heartbeat: a
//! data plane that hears nothing for a second marks the instance stalled (not
//! placeable) until it hears from it again.
//!
//! In-progress handshakes are counted process-wide ([`handshake_started`], called by
//! the accept path in [`crate::h3_server`]): a worker process runs one endpoint.
//! `incoming_bytes` is always 0: quinn 0.11 does not expose its incoming buffer use
//! (only the limit, `ServerConfig::incoming_buffer_size`).

use crate::datasock::DataConn;
use proto::wire::data::LOAD_INTERVAL_MS;
use proto::wire::Data;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the report is sent.
pub const LOAD_INTERVAL: Duration = Duration::from_millis(LOAD_INTERVAL_MS);

/// Handshakes accepted and not yet established or failed, in this process.
static HANDSHAKES: AtomicU32 = AtomicU32::new(0);

/// Counts one handshake in progress until the guard is dropped.
#[derive(Debug)]
pub struct HandshakeGuard(());

/// Call when a handshake starts (`Incoming::accept`); drop the guard when it ends.
pub fn handshake_started() -> HandshakeGuard {
    HANDSHAKES.fetch_add(1, Ordering::Relaxed);
    HandshakeGuard(())
}

impl Drop for HandshakeGuard {
    fn drop(&mut self) {
        HANDSHAKES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Handshakes in progress now.
pub fn handshakes() -> u32 {
    HANDSHAKES.load(Ordering::Relaxed)
}

/// The report as it goes on the wire.
pub fn current() -> Data {
    Data::Load { handshakes: handshakes(), incoming_bytes: 0 }
}

/// Sends [`current`] on `data` every [`LOAD_INTERVAL`] (the first one at once) until
/// `data` is dropped. While the data connection is down nothing is sent; the reports
/// resume on the re-established one. Call inside tokio.
pub fn spawn(data: &Arc<DataConn>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<DataConn> = Arc::downgrade(data);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(LOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(data) = weak.upgrade() else { return };
            if !data.is_connected() {
                continue;
            }
            // Bounded: a data plane that does not read us for a whole interval is
            // not helped by a queue of reports.
            let sent = tokio::time::timeout(LOAD_INTERVAL, data.send_control(&current())).await;
            if let Ok(Err(e)) = sent {
                tracing::debug!(error = %e, "load report not sent");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_handshakes_in_progress() {
        let before = handshakes();
        let a = handshake_started();
        let b = handshake_started();
        assert!(handshakes() >= before + 2);
        drop(a);
        drop(b);
        // Other tests may run handshakes concurrently; ours are gone.
        assert!(matches!(current(), Data::Load { incoming_bytes: 0, .. }));
    }
}
