//! Echo mode for the latency tool: every datagram the data plane forwards goes back
//! to its source on the shared UDP socket, from the address it was sent to,
//! bypassing QUIC entirely.

use crate::socket::DemuxSocket;
use quinn::udp::{RecvMeta, Transmit};
use quinn::AsyncUdpSocket;
use std::io::{self, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Datagrams echoed so far (all echo loops of the process).
pub static ECHOED: AtomicU64 = AtomicU64::new(0);

const BATCH: usize = 32;
const BUF: usize = 64 * 1024;

/// Echoes forever (until the task is dropped).
pub async fn run(sock: Arc<DemuxSocket>) -> io::Result<()> {
    let mut store = vec![0u8; BATCH * BUF];
    let mut meta = [RecvMeta::default(); BATCH];
    let mut poller = Arc::clone(&sock).create_io_poller();
    let gso = sock.max_transmit_segments();
    loop {
        let n = {
            let mut bufs: Vec<IoSliceMut<'_>> = store.chunks_mut(BUF).map(IoSliceMut::new).collect();
            std::future::poll_fn(|cx| sock.poll_recv(cx, &mut bufs, &mut meta)).await?
        };
        for (m, buf) in meta.iter().zip(store.chunks(BUF)).take(n) {
            let data = &buf[..m.len];
            let stride = m.stride.max(1);
            let segments = m.len.div_ceil(stride);
            // One GSO send per train when the kernel can, else one send per datagram.
            let pieces: Vec<&[u8]> = if segments <= gso { vec![data] } else { data.chunks(stride).collect() };
            for piece in pieces {
                let t = Transmit {
                    destination: m.addr,
                    ecn: m.ecn,
                    contents: piece,
                    segment_size: (piece.len() > stride).then_some(stride),
                    src_ip: m.dst_ip,
                };
                loop {
                    match sock.try_send(&t) {
                        Ok(()) => break,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx)).await?;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            ECHOED.fetch_add(segments as u64, Ordering::Relaxed);
        }
    }
}
