//! The portable backend: non-blocking recvmmsg(2) driven by a level-triggered epoll.
//! Same routing, forwarding and counters as the io_uring backend (crate::dataplane::shard).

use crate::dataplane::cmsg;
use crate::dataplane::shard::{pin_thread, Router, ShardSetup, SockInfo};
use crate::dataplane::snapshot::Snapshot;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use sys::mmsg::{Received, RecvMmsg};
use sys::Epoll;

/// Receive buffer per message: the largest UDP payload (a whole GRO train).
pub const BUF_LEN: usize = 65_535;
/// Control buffer per message: pktinfo (v6: 20 B), tclass/tos, UDP_GRO, with headers.
pub const CTRL_LEN: usize = 128;
/// recvmmsg rounds per socket per readiness before going back to epoll (fairness).
const ROUNDS: usize = 8;

/// One received message taken apart into its client, its control data (parsed) and
/// its payload. None when anything was cut: MSG_TRUNC (a payload longer than the
/// buffer), MSG_CTRUNC (control data longer than CTRL_LEN), or a name that is not an
/// address. The caller counts those as truncated.
fn take_apart<'b>(m: &Received<'b>) -> Option<(SocketAddr, cmsg::RecvMeta, &'b [u8])> {
    if m.truncated() || m.control_truncated() {
        return None;
    }
    Some((m.source()?, cmsg::parse(m.control), m.data))
}

pub fn run(setup: ShardSetup) -> Result<()> {
    pin_thread(&setup);
    let batch = setup.batch.clamp(1, 1024);
    let mut router = Router::new(&setup).context("shard router")?;
    let mut cache = arc_swap::Cache::new(Arc::clone(&setup.shared));
    let mut batch = RecvMmsg::new(batch, BUF_LEN).with_names().with_control(CTRL_LEN);
    let epoll = Epoll::new().context("epoll_create1")?;
    let infos: Vec<SockInfo> = setup.sockets.iter().map(|s| SockInfo { local: s.local }).collect();
    for (i, s) in setup.sockets.iter().enumerate() {
        epoll.add(s.fd.as_raw_fd(), libc::EPOLLIN as u32, i as u64).context("epoll_ctl ADD udp socket")?;
    }
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; setup.sockets.len().max(1)];
    tracing::info!(shard = setup.index, core = setup.core.id, backend = "mmsg", "shard running");
    let _ = setup.started.send(setup.index);
    loop {
        let n = epoll.wait(&mut events, 1000).context("epoll_wait")?;
        if n == 0 {
            // Idle: refresh the cached snapshot so an old one (and the fds of
            // departed workers it names) is released.
            let _ = cache.load();
        }
        for ev in &events[..n] {
            let i = ev.u64 as usize;
            let (Some(sock), Some(info)) = (setup.sockets.get(i), infos.get(i)) else { continue };
            for _ in 0..ROUNDS {
                let got = match batch.recv(&sock.fd, libc::MSG_DONTWAIT) {
                    Ok(got) => got,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => break,
                    Err(e) => {
                        tracing::warn!(shard = setup.index, error = %e, "recvmmsg failed");
                        break;
                    }
                };
                router.begin();
                let snap: &Arc<Snapshot> = cache.load();
                for m in batch.iter() {
                    let Some((client, meta, payload)) = take_apart(&m) else {
                        router.truncated();
                        continue;
                    };
                    // SAFETY: `payload` lives in `batch`, untouched until the flush below.
                    unsafe { router.datagram(snap, info, client, &meta, payload) };
                }
                router.flush(snap);
                if got < batch.capacity() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::UdpSocket;

    /// Receives one waiting datagram on `s` with a `data_len`-byte payload buffer and a
    /// `ctrl_len`-byte control buffer, as the shard does.
    fn recv_one(s: &UdpSocket, data_len: usize, ctrl_len: usize) -> RecvMmsg {
        let mut r = RecvMmsg::new(1, data_len).with_names().with_control(ctrl_len);
        assert_eq!(r.recv(s, 0).unwrap(), 1);
        r
    }

    /// A loopback pair: the sender marks ECT(0) (RFC 3168), the receiver asks for the
    /// TOS byte as the shard does, so every datagram carries control data.
    fn pair() -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket2::SockRef::from(&rx).set_recv_tos_v4(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.2:0").unwrap();
        socket2::SockRef::from(&tx).set_tos_v4(0b10).unwrap();
        (rx, tx)
    }

    /// Real kernel output: a whole datagram is taken apart (client, payload, control
    /// data); a payload cut by a short buffer, control data cut by a short control
    /// buffer, and a name that is not an address are refused.
    #[test]
    fn received_messages_are_taken_apart_and_cut_ones_refused() {
        let (rx, tx) = pair();
        let payload: Vec<u8> = (0..=199).collect();
        tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        let whole = recv_one(&rx, 256, CTRL_LEN);
        let (client, meta, got) = take_apart(&whole.get(0).unwrap()).expect("a whole datagram");
        assert_eq!(client, tx.local_addr().unwrap());
        assert_eq!(got, &payload[..], "exactly the payload, not the whole buffer");
        assert_eq!(meta.ecn, 0b10, "ECT(0) read from the control data");

        tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        let cut = recv_one(&rx, 199, CTRL_LEN);
        assert!(cut.get(0).unwrap().truncated(), "the kernel cut the payload");
        assert!(take_apart(&cut.get(0).unwrap()).is_none(), "a cut payload is refused");

        tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        let cut = recv_one(&rx, 256, 8);
        assert!(cut.get(0).unwrap().control_truncated(), "the kernel cut the control data");
        assert!(take_apart(&cut.get(0).unwrap()).is_none(), "cut control data is refused");

        let no_name = Received { name: &[], ..whole.get(0).unwrap() };
        assert!(take_apart(&no_name).is_none(), "a name that is not an address is refused");
    }
}
