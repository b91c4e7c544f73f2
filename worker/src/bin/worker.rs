//! `worker`: an HTTP/3 server instance behind the quicdemux data plane.
//!
//! Standalone: `worker --server-id N --keys FILE --data-socket PATH [--cert C --key K]
//! [--root DIR] [--retry] [--echo] [--drain-timeout SECS] [--fast-path on|off]`.
//! Under the controller: `worker --server-id-from-controller --control PATH
//! --data-socket PATH [...]` (server id and keys from `Assign`).
//! SIGTERM (or SIGINT) drains gracefully (docs/worker.md); a second one exits at once.

use anyhow::{anyhow, Context};
use clap::Parser;
use proto::wire::Registration;
use proto::ServerId;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use worker::control::{self, ControlConn, ControlLink};
use worker::drain::Drain;
use worker::h3_server::{self, Ctx, ServerOptions, H3_NO_ERROR};
use worker::tls::{self, Identity, ALPN_H3, ALPN_HQ};
use worker::{echo, Secrets};

#[derive(Debug, Parser)]
#[command(name = "worker", version, about = "HTTP/3 server instance behind the quicdemux data plane")]
struct Args {
    /// This instance's 16-bit server id (ADR 0001); standalone mode.
    #[arg(long, value_name = "N")]
    server_id: Option<u16>,
    /// Shared key file (`demux gen-keys --out FILE`).
    #[arg(long, value_name = "FILE")]
    keys: Option<PathBuf>,
    /// The data plane's --data-socket.
    #[arg(long, value_name = "PATH")]
    data_socket: Option<PathBuf>,
    /// Certificate chain (PEM); without --cert/--key a self-signed one is made.
    #[arg(long, value_name = "PEM", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM).
    #[arg(long, value_name = "PEM", requires = "cert")]
    key: Option<PathBuf>,
    /// Serve static files below DIR.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Answer token-less Initials with Retry (address validation, RFC 9000 §8.1.2).
    #[arg(long)]
    retry: bool,
    /// Echo every forwarded datagram back to its source, bypassing QUIC (latency tool).
    #[arg(long)]
    echo: bool,
    /// Longest graceful drain after SIGTERM.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    drain_timeout: u64,
    /// Written (atomically) once the instance is placeable: `ready SERVER_ID`.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Register with the controller and take the server id and keys from it.
    #[arg(long, requires = "control", conflicts_with_all = ["server_id", "keys"])]
    server_id_from_controller: bool,
    /// The controller's control socket.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// After losing the controller, how long to try re-registering before draining.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    controller_grace: u64,
    /// Ask the data plane for the kernel fast path (own SO_REUSEPORT sockets its
    /// SK_REUSEPORT program steers established datagrams to): on or off.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    fast_path: bool,
    /// Ask the data plane for shared-memory forwarding rings (granted by `demux
    /// --forward ring`, its default; otherwise frames come on the data connection):
    /// on or off. Asked again after every data-plane restart.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    rings: bool,
    /// Most TLS handshakes in progress at once; beyond it token-less Initials get a
    /// stateless Retry and the rest are ignored (0: no limit).
    #[arg(long, value_name = "N", default_value_t = h3_server::DEFAULT_MAX_HANDSHAKES)]
    max_handshakes: usize,
    /// Abandon a handshake not complete after this long.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = secs)]
    handshake_timeout: Duration,
    /// quinn `max_incoming`: Initials queued before the server takes them; beyond it
    /// quinn ignores new ones before deriving any key.
    #[arg(long, value_name = "N", default_value_t = worker::Limits::default().max_incoming)]
    max_incoming: usize,
    /// quinn `incoming_buffer_size`: bytes of further datagrams buffered per queued Initial.
    #[arg(long, value_name = "BYTES", default_value_t = worker::Limits::default().incoming_buffer_size)]
    incoming_buffer_size: u64,
    /// quinn `incoming_buffer_size_total`: the same over all queued Initials.
    #[arg(long, value_name = "BYTES", default_value_t = worker::Limits::default().incoming_buffer_size_total)]
    incoming_buffer_size_total: u64,
    /// CID lifetime: quinn replaces older CIDs (newest key generation), so rotations
    /// must be at least two lifetimes apart; 0: CIDs never expire.
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = secs)]
    cid_lifetime: Duration,
    /// Return freed heap to the OS (glibc `malloc_trim`) when connections close.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    malloc_trim: bool,
    /// Tests only (hidden): announce protocol version V (and V-1) instead of this
    /// build's, standing for a build that differs only in its version number
    /// (docs/wire.md "Versions"); V is this build's version up to 2 above it.
    #[arg(long, value_name = "V", hide = true)]
    protocol_version: Option<u8>,
}

fn secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e9).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("expected seconds (e.g. 5 or 0.5), not {s:?}")),
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(v) = args.protocol_version {
        if let Err(e) = sys::protocol::relabel(v) {
            eprintln!("worker: {e}");
            return ExitCode::from(2);
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // No colour codes when stderr is a file (e.g. a spawned worker logging into the
    // controller's log).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("worker: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Args) -> anyhow::Result<()> {
    let (server_id, secrets, control) = if a.server_id_from_controller {
        let path =
            a.control.clone().ok_or_else(|| anyhow!("--control PATH is required with --server-id-from-controller"))?;
        let p = path.clone();
        let asg = tokio::task::spawn_blocking(move || control::register(&p, Duration::from_secs(10)))
            .await
            .context("registration task")?
            .with_context(|| format!("registering with the controller at {}", path.display()))?;
        tracing::info!(server_id = %asg.server_id, "registered with the controller");
        let cc = ControlConn::new(asg.conn, asg.version)?;
        let link = ControlLink::new(&path, asg.server_id, cc, Duration::from_secs(a.controller_grace));
        (asg.server_id, asg.secrets, Some(link))
    } else {
        let server_id = ServerId(a.server_id.ok_or_else(|| anyhow!("--server-id N is required (standalone mode)"))?);
        let keys = a.keys.as_deref().ok_or_else(|| anyhow!("--keys FILE is required (standalone mode)"))?;
        (server_id, Secrets::load(keys)?, None)
    };
    // Under the controller the data socket is DIR/data.sock next to DIR/control.sock.
    let default_data = match (&a.data_socket, a.server_id_from_controller, &a.control) {
        (None, true, Some(c)) => c.parent().map(|d| d.join("data.sock")),
        _ => None,
    };
    let data_socket = a
        .data_socket
        .as_deref()
        .or(default_data.as_deref())
        .ok_or_else(|| anyhow!("--data-socket PATH is required"))?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;

    // Under the controller the data plane may be (re)starting: retry for a while.
    let patience = if control.is_some() { Duration::from_secs(30) } else { Duration::ZERO };
    let deadline = tokio::time::Instant::now() + patience;
    let socket = loop {
        let opts = worker::DataOptions { fast_path: a.fast_path, rings: a.rings };
        match worker::connect_socket_with(data_socket, server_id, opts).await {
            Ok(s) => break s,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %format!("{e:#}"), "data plane not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("data connection to {}", data_socket.display())),
        }
    };
    let data = Arc::clone(socket.data());
    worker::handshake_done::install(&data);

    if a.echo {
        data.ready().await.context("sending Ready")?;
        if let Some(cc) = &control {
            cc.send(&Registration::Ready).await.context("sending Ready to the controller")?;
        }
        write_ready(&a, server_id)?;
        tracing::info!(%server_id, "echo mode");
        let echo = tokio::spawn(echo::run(Arc::clone(&socket)));
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        echo.abort();
        data.close();
        tracing::info!(echoed = echo::ECHOED.load(Ordering::Relaxed), "echo mode stopped");
        return Ok(());
    }

    let identity = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => Identity::load_pem(c, k)?,
        _ => Identity::self_signed(&["localhost"])?,
    };
    let crypto = tls::server_crypto(identity, &[ALPN_H3, ALPN_HQ])?;
    let mut sc = quinn::ServerConfig::with_crypto(crypto);
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    sc.transport_config(Arc::new(transport));
    let limits = worker::Limits {
        max_incoming: a.max_incoming.max(1),
        incoming_buffer_size: a.incoming_buffer_size,
        incoming_buffer_size_total: a.incoming_buffer_size_total,
        cid_lifetime: (!a.cid_lifetime.is_zero()).then_some(a.cid_lifetime),
    };
    let att = worker::endpoint_on_with(Arc::clone(&socket), server_id, &secrets, sc, &limits)?;

    let drain = Drain::new();
    let opts = ServerOptions {
        root: a.root.clone(),
        retry: a.retry,
        max_handshakes: a.max_handshakes,
        handshake_timeout: a.handshake_timeout,
        ..ServerOptions::new(server_id)
    };
    let ctx = Ctx::new(opts, drain.clone())?;
    let trimmer = a.malloc_trim.then(|| {
        let d = drain.clone();
        tokio::spawn(worker::alloc::trim_after_peaks(move || d.open_connections(), Duration::from_secs(1)))
    });
    let server = tokio::spawn(h3_server::serve(att.endpoint.clone(), Arc::clone(&ctx)));
    // Key rotations from the controller (ADR 0001); re-registration when it is lost.
    let mut lost = match &control {
        Some(link) => {
            let (link, keys) = (Arc::clone(link), att.cid_keys.clone());
            tokio::spawn(async move { link.run(keys).await })
        }
        None => tokio::spawn(std::future::pending::<String>()),
    };
    data.ready().await.context("sending Ready")?;
    if let Some(cc) = &control {
        cc.send(&Registration::Ready).await.context("sending Ready to the controller")?;
    }
    write_ready(&a, server_id)?;
    tracing::info!(%server_id, local = ?att.endpoint.local_addr().ok(), retry = a.retry, "serving HTTP/3");

    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        why = &mut lost => {
            let why = why.unwrap_or_else(|e| format!("control task: {e}"));
            tracing::warn!(%why, "draining: the sockets we send on may no longer be served");
        }
    }
    // Drain (ADR-0041): unplaceable first, then GOAWAY everywhere.
    tracing::info!(open = drain.open_connections(), "draining");
    if let Err(e) = data.draining().await {
        tracing::warn!(error = %e, "could not send Draining");
    }
    if let Some(cc) = &control {
        if let Err(e) = cc.send(&Registration::Draining).await {
            tracing::warn!(error = %e, "could not send Draining to the controller");
        }
    }
    drain.start();
    let deadline = Duration::from_secs(a.drain_timeout);
    let finished = tokio::select! {
        r = tokio::time::timeout(deadline, drain.idle()) => r.is_ok(),
        _ = term.recv() => false,
        _ = int.recv() => false,
    };
    if !finished {
        tracing::warn!(open = drain.open_connections(), "drain timeout: closing the remaining connections");
    }
    att.endpoint.close(quinn::VarInt::from_u32(H3_NO_ERROR), b"shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(2), att.endpoint.wait_idle()).await;
    server.abort();
    if let Some(t) = trimmer {
        t.abort();
    }
    // Closing the data connection makes the server id dead at once.
    data.close();
    let s = &ctx.stats;
    let d = &data.stats;
    let u = socket.udp();
    eprintln!(
        "worker exit: server_id={} connections={} requests={} ok={} retries={} refused={} overload_retries={} \
         overload_ignored={} handshake_timeouts={} frames={} malformed={} \
         udp_sends={} udp_bytes={} udp_errors={} gso_max={} fast_sockets={} fast_datagrams={} fast_bytes={} \
         fast_sends={} fast_errors={} rings={} ring_frames={} drained={}",
        server_id,
        s.connections.load(Ordering::Relaxed),
        s.requests.load(Ordering::Relaxed),
        s.responses_ok.load(Ordering::Relaxed),
        s.retries_sent.load(Ordering::Relaxed),
        s.refused_incoming.load(Ordering::Relaxed),
        s.overload_retries.load(Ordering::Relaxed),
        s.overload_ignored.load(Ordering::Relaxed),
        s.handshake_timeouts.load(Ordering::Relaxed),
        d.frames.load(Ordering::Relaxed),
        d.malformed.load(Ordering::Relaxed),
        u.stats.transmits.load(Ordering::Relaxed),
        u.stats.bytes.load(Ordering::Relaxed),
        u.stats.errors.load(Ordering::Relaxed),
        u.max_transmit_segments(),
        socket.fast().len(),
        d.fast_datagrams.load(Ordering::Relaxed),
        d.fast_bytes.load(Ordering::Relaxed),
        d.fast_transmits.load(Ordering::Relaxed),
        d.fast_errors.load(Ordering::Relaxed),
        socket.rings().len(),
        d.ring_frames.load(Ordering::Relaxed),
        finished,
    );
    Ok(())
}

fn write_ready(a: &Args, id: ServerId) -> anyhow::Result<()> {
    if let Some(p) = &a.ready_file {
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, format!("ready {id}\n")).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, p).with_context(|| format!("renaming to {}", p.display()))?;
    }
    Ok(())
}
