//! `worker`: an HTTP/3 server instance behind the quicdemux data plane.
//!
//! Standalone: `worker --server-id N --keys FILE --data-socket PATH [--cert C --key K]
//! [--root DIR] [--retry] [--echo] [--drain-timeout SECS] [--fast-path on|off]`.
//! Under the controller: `worker --server-id-from-controller --control PATH
//! --data-socket PATH [...]` (server id and keys from `Assign`).
//! Alone: `worker --listen ADDR:PORT [--cert C --key K] [--root DIR] [...]` serves
//! the same HTTP/3 on quinn's own UDP socket, no data plane (docs/operations.md
//! "A worker alone").
//! SIGTERM (or SIGINT) drains gracefully (docs/worker.md); a second one exits at once.

use anyhow::{anyhow, Context};
use clap::Parser;
use proto::wire::Registration;
use proto::ServerId;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use worker::cli::Args;
use worker::control::{self, ControlConn, ControlLink};
use worker::drain::Drain;
use worker::h3_server::{self, Ctx, ServerOptions, H3_NO_ERROR};
use worker::tls::{self, Identity, ALPN_H3, ALPN_HQ};
use worker::{echo, Secrets};

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(v) = args.protocol_version {
        if let Err(e) = sys::protocol::relabel(v) {
            eprintln!("worker: {e}");
            return ExitCode::from(2);
        }
    }
    // sys::logging: colours only on a terminal, journald-aware, text or JSON.
    let format = args.log_format.parse().unwrap_or(sys::logging::Format::Text);
    if let Err(e) = sys::logging::init(args.log_level.as_deref(), format, "RUST_LOG") {
        eprintln!("worker: logging: {e}");
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("worker: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = format == sys::logging::Format::Json;
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            plain_or_event(json, &format!("worker: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// The fatal error: as is on stderr, or as an event under `--log-format json`, so
/// that every line is JSON there.
fn plain_or_event(json: bool, line: &str) {
    if json {
        tracing::error!(target: "worker", line, "worker failed");
    } else {
        eprintln!("{line}");
    }
}

async fn run(a: Args) -> anyhow::Result<()> {
    if let Some(addr) = a.listen {
        return run_listen(a, addr).await;
    }
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

    let att = worker::endpoint_on_with(Arc::clone(&socket), server_id, &secrets, server_config(&a)?, &limits(&a))?;

    let drain = Drain::new();
    let ctx = Ctx::new(server_options(&a, server_id), drain.clone())?;
    let trimmer = spawn_trimmer(&a, &drain);
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
    let _reopen = proxy_and_access_log(&ctx)?;

    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        why = &mut lost => {
            let why = why.unwrap_or_else(|e| format!("control task: {e}"));
            tracing::warn!(%why, "draining: the sockets we send on may no longer be served");
        }
    }
    // Drain (worker/src/drain.rs): unplaceable first, then GOAWAY everywhere.
    tracing::info!(open = drain.open_connections(), "draining");
    if let Err(e) = data.draining().await {
        tracing::warn!(error = %e, "could not send Draining");
    }
    if let Some(cc) = &control {
        if let Err(e) = cc.send(&Registration::Draining).await {
            tracing::warn!(error = %e, "could not send Draining to the controller");
        }
    }
    let finished = drain_until_idle(&drain, Duration::from_secs(a.drain_timeout), &mut term, &mut int).await;
    close_endpoint(&att.endpoint, &drain, finished, server, trimmer).await;
    // Closing the data connection makes the server id dead at once.
    data.close();
    let s = &ctx.stats;
    let d = &data.stats;
    let u = socket.udp();
    let line = format!(
        "worker exit: server_id={} {} frames={} malformed={} \
         udp_sends={} udp_bytes={} udp_errors={} gso_max={} fast_sockets={} fast_datagrams={} fast_bytes={} \
         fast_sends={} fast_errors={} rings={} ring_frames={} drained={}{}",
        server_id,
        s.exit_fields(),
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
        proxy_exit_fields(&ctx),
    );
    if a.log_format == "json" {
        tracing::info!(target: "worker", line, "worker exit");
    } else {
        eprintln!("{line}");
    }
    Ok(())
}

fn write_ready(a: &Args, id: ServerId) -> anyhow::Result<()> {
    write_ready_text(a, &format!("ready {id}\n"))
}

/// Writes `text` to `--ready-file` (atomically: a temporary file renamed).
fn write_ready_text(a: &Args, text: &str) -> anyhow::Result<()> {
    if let Some(p) = &a.ready_file {
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, p).with_context(|| format!("renaming to {}", p.display()))?;
    }
    Ok(())
}

/// The TLS identity (`--cert/--key`, else a fresh self-signed `localhost` one),
/// ALPNs h3 and hq-interop, and a 30 s idle timeout.
fn server_config(a: &Args) -> anyhow::Result<quinn::ServerConfig> {
    let identity = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => Identity::load_pem(c, k)?,
        _ => Identity::self_signed(&["localhost"])?,
    };
    let crypto = tls::server_crypto(identity, &[ALPN_H3, ALPN_HQ])?;
    let mut sc = quinn::ServerConfig::with_crypto(crypto);
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    sc.transport_config(Arc::new(transport));
    Ok(sc)
}

fn limits(a: &Args) -> worker::Limits {
    worker::Limits {
        max_incoming: a.max_incoming.max(1),
        incoming_buffer_size: a.incoming_buffer_size,
        incoming_buffer_size_total: a.incoming_buffer_size_total,
        cid_lifetime: (!a.cid_lifetime.is_zero()).then_some(a.cid_lifetime),
    }
}

fn server_options(a: &Args, server_id: ServerId) -> ServerOptions {
    ServerOptions {
        root: a.root.clone(),
        retry: a.retry,
        max_handshakes: a.max_handshakes,
        handshake_timeout: a.handshake_timeout,
        proxy: a.proxy.options(),
        access_log: a.access_log.options(),
        ..ServerOptions::new(server_id)
    }
}

/// ` upstream_retries=N …` when proxying, else nothing.
fn proxy_exit_fields(ctx: &Ctx) -> String {
    ctx.proxy.as_ref().map(|p| format!(" {}", p.exit_fields())).unwrap_or_default()
}

/// Logs the routes when proxying; SIGHUP reopens the access log file (logrotate),
/// and means nothing else to a worker. The task lives as long as the handle.
fn proxy_and_access_log(ctx: &Ctx) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    if let Some(p) = &ctx.opts.proxy {
        for r in p.routes.routes() {
            tracing::info!(route = %r, "proxying to the upstream");
        }
    }
    Ok(match &ctx.access_log {
        Some(log) if log.path().is_some() => Some(worker::access_log::reopen_on_sighup(Arc::clone(log))?),
        _ => None,
    })
}

fn spawn_trimmer(a: &Args, drain: &Drain) -> Option<tokio::task::JoinHandle<()>> {
    a.malloc_trim.then(|| {
        let d = drain.clone();
        tokio::spawn(worker::alloc::trim_after_peaks(move || d.open_connections(), Duration::from_secs(1)))
    })
}

/// Starts the drain (worker/src/drain.rs: GOAWAY everywhere) and waits at most
/// `deadline` (or until a second signal) for every connection to finish; whether
/// they all did.
async fn drain_until_idle(
    drain: &Drain,
    deadline: Duration,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> bool {
    drain.start();
    tokio::select! {
        r = tokio::time::timeout(deadline, drain.idle()) => r.is_ok(),
        _ = term.recv() => false,
        _ = int.recv() => false,
    }
}

/// Closes what the drain left open, waits (briefly) for the closes to go out and
/// stops the server's tasks.
async fn close_endpoint(
    endpoint: &quinn::Endpoint,
    drain: &Drain,
    finished: bool,
    server: tokio::task::JoinHandle<()>,
    trimmer: Option<tokio::task::JoinHandle<()>>,
) {
    if !finished {
        tracing::warn!(open = drain.open_connections(), "drain timeout: closing the remaining connections");
    }
    endpoint.close(quinn::VarInt::from_u32(H3_NO_ERROR), b"shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    server.abort();
    if let Some(t) = trimmer {
        t.abort();
    }
}

/// `--listen`: the same HTTP/3 server on a quinn endpoint of its own (quinn's UDP
/// path: quinn-udp with GSO and GRO), no data plane and no controller. quinn's own
/// connection IDs (no ADR 0001 keys: nothing routes by them) and a random token
/// key; the server id in `x-server-id` and `/health` is 0. The ready file gets
/// `udp ADDR:PORT`, the bound address (port 0 picks one).
async fn run_listen(a: Args, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sc = server_config(&a)?;
    limits(&a).apply(&mut sc);
    let endpoint = quinn::Endpoint::server(sc, addr).with_context(|| format!("--listen {addr}"))?;
    let local = endpoint.local_addr().context("the bound address")?;
    let drain = Drain::new();
    let ctx = Ctx::new(server_options(&a, ServerId(0)), drain.clone())?;
    let trimmer = spawn_trimmer(&a, &drain);
    let server = tokio::spawn(h3_server::serve(endpoint.clone(), Arc::clone(&ctx)));
    write_ready_text(&a, &format!("udp {local}\n"))?;
    tracing::info!(%local, retry = a.retry, "serving HTTP/3 alone (--listen)");
    let _reopen = proxy_and_access_log(&ctx)?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!(open = drain.open_connections(), "draining");
    let finished = drain_until_idle(&drain, Duration::from_secs(a.drain_timeout), &mut term, &mut int).await;
    close_endpoint(&endpoint, &drain, finished, server, trimmer).await;
    let s = &ctx.stats;
    let line = format!("worker exit: listen={local} {} drained={finished}{}", s.exit_fields(), proxy_exit_fields(&ctx));
    if a.log_format == "json" {
        tracing::info!(target: "worker", line, "worker exit");
    } else {
        eprintln!("{line}");
    }
    Ok(())
}
