//! Your own quinn server behind the quicdemux data plane, in ~40 lines: a QUIC
//! echo server (ALPN "echo": each bidirectional stream gets its bytes back).
//!
//! ```text
//! demux gen-keys --out keys
//! demux --listen 127.0.0.1:4433 --cores 0 --keys keys --data-socket /tmp/d.sock &
//! cargo run -p worker --example own_server -- /tmp/d.sock keys 7
//! ```

use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: own_server DATA_SOCKET KEY_FILE SERVER_ID";
    let data_socket = args.next().ok_or_else(|| anyhow::anyhow!(usage))?;
    let key_file = args.next().ok_or_else(|| anyhow::anyhow!(usage))?;
    let server_id: u16 = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;

    // 1. The shared secrets (same file as the demux) and your TLS config.
    let secrets = worker::Secrets::load(key_file.as_ref())?;
    let identity = worker::tls::Identity::self_signed(&["localhost"])?;
    let server_config = quinn::ServerConfig::with_crypto(worker::tls::server_crypto(identity, &[b"echo"])?);

    // 2. Attach: data connection + DemuxSocket + quinn endpoint with ADR 0001 CIDs,
    //    the shared reset/token keys and no fixed-bit greasing.
    let att = worker::attach(data_socket.as_ref(), proto::ServerId(server_id), &secrets, server_config).await?;

    // 3. Placeable from now on: the demux starts sending new connections here.
    att.socket.data().ready().await?;

    // 4. An ordinary quinn server loop.
    while let Some(incoming) = att.endpoint.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let conn = Arc::new(conn);
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    if let Ok(data) = recv.read_to_end(1 << 20).await {
                        let _ = send.write_all(&data).await;
                        let _ = send.finish();
                        let _ = send.stopped().await;
                    }
                });
            }
        });
    }
    Ok(())
}
