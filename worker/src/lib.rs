//! # worker
//!
//! Puts quinn endpoints behind the quicdemux data plane (docs/architecture.md,
//! docs/worker.md).
//!
//! - [`socket::DemuxSocket`]: a quinn `AsyncUdpSocket` that receives the datagrams
//!   the data plane forwards on the data connection and sends replies straight out
//!   of the shared UDP socket (quinn-udp: GSO, ECN, IP_PKTINFO source address).
//! - [`datasock`]: the data-connection handshake (`DataHello` → `Welcome`, `Sockets` + fds,
//!   `FastSockets`, `Rings`) and lifecycle (`Ready`, `Draining`), with reconnection.
//! - [`fast_udp`]: the kernel fast path's own sockets, read and written with quinn-udp.
//! - [`cid_gen::AdrCidGenerator`]: ADR 0001 connection IDs.
//! - [`secrets::Secrets`]: shared reset and token keys, `grease_quic_bit(false)`.
//! - [`load_report`]: the `Load` heartbeat and handshake-pressure report (every 250 ms).
//! - [`control`]: registration with the controller (server id, keys, rotations).
//! - [`h3_server`], [`drain`], [`echo`], [`tls`]: the `worker` binary's HTTP/3 server;
//!   [`cli`]: its command line; [`proxy`]: `--upstream`, the reverse proxy, and [`access_log`].
//!
//! Minimal use (see docs/worker.md):
//!
//! ```no_run
//! # async fn f(server_config: quinn::ServerConfig) -> anyhow::Result<()> {
//! use worker::{attach, secrets::Secrets};
//! let secrets = Secrets::load("/etc/quicdemux/keys".as_ref())?;
//! let server_id = proto::ServerId(7);
//! let att = attach("/run/quicdemux/data.sock".as_ref(), server_id, &secrets, server_config).await?;
//! att.socket.data().ready().await?; // placeable from now on
//! while let Some(incoming) = att.endpoint.accept().await { /* serve */ let _ = incoming; }
//! # Ok(()) }
//! ```

pub mod access_log;
pub mod alloc;
pub mod async_fd;
pub mod cid_gen;
pub mod cli;
pub mod control;
pub mod datasock;
pub mod drain;
pub mod echo;
pub mod fast_udp;
pub mod h3_server;
pub mod handshake_done;
pub mod load_report;
pub mod proxy;
pub mod ring;
pub mod secrets;
pub mod socket;
pub mod tls;
pub mod udp_send;

use anyhow::Context;
use proto::ServerId;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use cid_gen::{AdrCidGenerator, CidKeys};
pub use datasock::{DataConn, DataOptions};
pub use secrets::Secrets;
pub use socket::DemuxSocket;

/// How long to wait for the data plane's `Sockets` reply.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds on what an endpoint keeps for connections that are not established yet,
/// and the CID lifetime (docs/worker.md, "Bounded handshakes" and "CID lifetime").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `ServerConfig::max_incoming`: Initials quinn holds as `Incoming` before the
    /// server accepts, refuses or ignores them; beyond it quinn ignores new Initials
    /// before deriving any key (cheap).
    pub max_incoming: usize,
    /// `ServerConfig::incoming_buffer_size`: bytes of further datagrams buffered per
    /// `Incoming` (a client's Initial flight), dropped beyond.
    pub incoming_buffer_size: u64,
    /// `ServerConfig::incoming_buffer_size_total`: the same, over all `Incoming`s.
    pub incoming_buffer_size_total: u64,
    /// `ConnectionIdGenerator::cid_lifetime` ([`cid_gen::DEFAULT_CID_LIFETIME`]).
    pub cid_lifetime: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_incoming: 8192,
            incoming_buffer_size: 64 << 10,
            incoming_buffer_size_total: 8 << 20,
            cid_lifetime: Some(cid_gen::DEFAULT_CID_LIFETIME),
        }
    }
}

impl Limits {
    /// Applies the `Incoming` bounds to a server configuration.
    pub fn apply(&self, sc: &mut quinn::ServerConfig) {
        sc.max_incoming(self.max_incoming)
            .incoming_buffer_size(self.incoming_buffer_size)
            .incoming_buffer_size_total(self.incoming_buffer_size_total);
    }
}

/// A quinn endpoint attached to the data plane.
#[derive(Debug)]
pub struct Attached {
    pub endpoint: quinn::Endpoint,
    pub socket: Arc<DemuxSocket>,
    pub cid_keys: CidKeys,
}

/// Connects to the data plane at `data_socket` as `server_id`: runs the handshake,
/// builds the [`DemuxSocket`] (reconnecting if the data plane restarts) and returns
/// a socket ready for quinn. Asks for the kernel fast path and for forwarding rings
/// ([`DataOptions::default`]). Call inside tokio.
pub async fn connect_socket(data_socket: &Path, server_id: ServerId) -> anyhow::Result<Arc<DemuxSocket>> {
    connect_socket_with(data_socket, server_id, DataOptions::default()).await
}

/// [`connect_socket`] asking for `opts` (e.g. `fast_path: false`).
pub async fn connect_socket_with(
    data_socket: &Path,
    server_id: ServerId,
    opts: DataOptions,
) -> anyhow::Result<Arc<DemuxSocket>> {
    let path = data_socket.to_path_buf();
    let p = path.clone();
    let h = tokio::task::spawn_blocking(move || datasock::handshake_opts(&p, server_id, HANDSHAKE_TIMEOUT, opts))
        .await
        .context("handshake task")??;
    if !h.fast.is_empty() {
        tracing::info!(addrs = ?h.fast.iter().map(|s| s.addr).collect::<Vec<_>>(), "kernel fast path active");
    }
    let data = DataConn::with_options(h.conn, server_id, Some(path), opts, h.version)?;
    // A reconnection (data plane restart) repeats this handshake with the same
    // options: the new data plane's rings and fast sockets replace these.
    // The heartbeat and handshake-pressure report (docs/wire.md `Load`).
    load_report::spawn(&data);
    let sock = DemuxSocket::with_fast(data, h.sockets, h.fast, h.rings)?;
    sock.spawn_reconnector();
    Ok(sock)
}

/// Builds a quinn server endpoint on `socket` with the shared secrets: ADR 0001 CIDs,
/// shared reset key, shared token key, no fixed-bit greasing, and the default
/// [`Limits`] (which replace quinn's `Incoming` limits in `server_config`).
pub fn endpoint_on(
    socket: Arc<DemuxSocket>,
    server_id: ServerId,
    secrets: &Secrets,
    server_config: quinn::ServerConfig,
) -> anyhow::Result<Attached> {
    endpoint_on_with(socket, server_id, secrets, server_config, &Limits::default())
}

/// [`endpoint_on`] with `limits`.
pub fn endpoint_on_with(
    socket: Arc<DemuxSocket>,
    server_id: ServerId,
    secrets: &Secrets,
    mut server_config: quinn::ServerConfig,
    limits: &Limits,
) -> anyhow::Result<Attached> {
    let cid_keys = secrets.cid_keys()?;
    let ep_cfg = secrets.endpoint_config_with(&cid_keys, server_id, limits.cid_lifetime);
    secrets.apply_token_key(&mut server_config);
    limits.apply(&mut server_config);
    let runtime = Arc::new(quinn::TokioRuntime);
    let endpoint = quinn::Endpoint::new_with_abstract_socket(ep_cfg, Some(server_config), socket.clone(), runtime)
        .context("creating the quinn endpoint")?;
    Ok(Attached { endpoint, socket, cid_keys })
}

/// [`connect_socket`] + [`endpoint_on`]. Send `Ready` (`att.socket.data().ready()`)
/// once the server accepts connections.
pub async fn attach(
    data_socket: &Path,
    server_id: ServerId,
    secrets: &Secrets,
    server_config: quinn::ServerConfig,
) -> anyhow::Result<Attached> {
    attach_with(data_socket, server_id, secrets, server_config, DataOptions::default()).await
}

/// [`attach`] asking the data plane for `opts`.
pub async fn attach_with(
    data_socket: &Path,
    server_id: ServerId,
    secrets: &Secrets,
    server_config: quinn::ServerConfig,
    opts: DataOptions,
) -> anyhow::Result<Attached> {
    let socket = connect_socket_with(data_socket, server_id, opts).await?;
    endpoint_on(socket, server_id, secrets, server_config)
}
