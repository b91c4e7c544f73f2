//! Tells the data plane that a handshake completed, so that the handshake ticket its
//! pin holds (the per-source cap of concurrent handshakes, demux
//! `dataplane::limits`) leaves now rather than when the pin expires 10 s later (issue
//! "overload" item 2; docs/wire.md `HandshakeDone`).
//!
//! The key is the client's original DCID (`quinn::Incoming::orig_dst_cid`): the pin
//! table's key for the placement. The message goes on the data connection with
//! `MSG_DONTWAIT`, best effort: when the connection is down or full it is skipped,
//! and the ticket leaves with its pin as before.
//!
//! One data connection per process: [`install`] it once (the `worker` binary does);
//! without it [`report`] does nothing.

use crate::datasock::DataConn;
use proto::wire::data::MAX_ODCID_LEN;
use proto::wire::Data;
use std::os::fd::AsFd;
use std::sync::{Arc, OnceLock};
use sys::seqpacket::Channel;

static DATA: OnceLock<Arc<DataConn>> = OnceLock::new();

/// The data connection [`report`] uses (the first one installed wins).
pub fn install(data: &Arc<DataConn>) {
    let _ = DATA.set(Arc::clone(data));
}

/// quinn reports the connection whose original DCID is `odcid` established.
pub fn report(odcid: &[u8]) {
    let Some(data) = DATA.get() else { return };
    if odcid.is_empty() || odcid.len() > MAX_ODCID_LEN {
        return;
    }
    let Some(fd) = data.current() else { return };
    let done = Data::HandshakeDone { odcid: odcid.to_vec() };
    if let Err(e) = Channel::new(fd.get_ref().as_fd()).dont_wait().at(data.version()).send(&done) {
        tracing::debug!(error = %e, "HandshakeDone not sent (the ticket leaves with its pin)");
    }
}
