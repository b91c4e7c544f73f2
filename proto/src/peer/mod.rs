//! Host-to-host forwarding (docs/adr/0005-server-ids-across-hosts.md §4): a datagram
//! that reached this host but whose server id belongs to another host is sent there
//! in an authenticated frame, with the client's address and the local (anycast)
//! address it was sent to, so the owning host can hand it to its worker as if it had
//! arrived there.
//!
//! - [`frame`]: the frame codec and its key (sealed with the cluster forwarding
//!   secret of the key file, which no worker receives).
//! - [`window`]: the anti-replay window over one sender's sequence numbers.
//! - [`session`]: per peer, the epochs and sequence numbers that bind a frame to its
//!   receiver's current boot, and the heartbeat handshake that teaches them.
//! - [`peers_file`]: the `--peers` file.
//!
//! Pure: no sockets, no clocks (time is passed in as monotonic milliseconds), no
//! threads (the sending side's counters are atomics the data plane's threads share).

pub mod frame;
pub mod peers_file;
pub mod session;
pub mod window;

pub use frame::{
    open, open_with, seal, seal_append, Body, Frame, FrameError, FrameKey, FrameKeys, Header, KeyUsed, HEADER_LEN,
    MAGIC, MAX_OVERHEAD, TAG_LEN,
};
pub use peers_file::parse_peers;
pub use session::{Learned, Me, Outbound, Session, Verdict, NUDGE_INTERVAL_MS};
pub use window::ReplayWindow;
