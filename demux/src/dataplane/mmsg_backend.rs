//! The portable backend: non-blocking recvmmsg(2) driven by a level-triggered epoll.
//! Same routing, forwarding and counters as the io_uring backend (crate::dataplane::shard).

use crate::dataplane::cmsg;
use crate::dataplane::shard::{pin_thread, Router, ShardSetup, SockInfo};
use crate::dataplane::snapshot::Snapshot;
use crate::sys::{self, Epoll};
use anyhow::{Context, Result};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Receive buffer per message: the largest UDP payload (a whole GRO train).
pub const BUF_LEN: usize = 65_535;
/// Control buffer per message: pktinfo (v6: 20 B), tclass/tos, UDP_GRO, with headers.
pub const CTRL_LEN: usize = 128;
/// recvmmsg rounds per socket per readiness before going back to epoll (fairness).
const ROUNDS: usize = 8;

struct Bufs {
    data: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<u8>,
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

impl Bufs {
    fn new(batch: usize) -> Bufs {
        let mut b = Bufs {
            data: vec![0u8; batch * BUF_LEN],
            // SAFETY: plain old data, all-zero is valid.
            names: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
            ctrl: vec![0u8; batch * CTRL_LEN],
            iovs: Vec::with_capacity(batch),
            // SAFETY: plain old data, all-zero is valid.
            msgs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
        };
        for i in 0..batch {
            b.iovs.push(libc::iovec {
                // SAFETY: i * BUF_LEN < data.len(): stays inside the allocation.
                iov_base: unsafe { b.data.as_mut_ptr().add(i * BUF_LEN) }.cast(),
                iov_len: BUF_LEN,
            });
        }
        b
    }

    /// Resets the in/out fields recvmmsg overwrites.
    fn arm(&mut self) {
        for i in 0..self.msgs.len() {
            let h = &mut self.msgs[i].msg_hdr;
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            // SAFETY: i * CTRL_LEN < ctrl.len().
            h.msg_control = unsafe { self.ctrl.as_mut_ptr().add(i * CTRL_LEN) }.cast();
            h.msg_controllen = CTRL_LEN;
            h.msg_flags = 0;
            self.msgs[i].msg_len = 0;
        }
    }
}

pub fn run(setup: ShardSetup) -> Result<()> {
    pin_thread(&setup);
    let batch = setup.batch.clamp(1, 1024);
    let mut router = Router::new(&setup).context("shard router")?;
    let mut cache = arc_swap::Cache::new(Arc::clone(&setup.shared));
    let mut bufs = Bufs::new(batch);
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
                bufs.arm();
                // SAFETY: msgs[..batch] are armed to point at live buffers owned by
                // `bufs`, with their sizes; the timeout is null.
                let r = unsafe {
                    libc::recvmmsg(
                        sock.fd.as_raw_fd(),
                        bufs.msgs.as_mut_ptr(),
                        batch as libc::c_uint,
                        libc::MSG_DONTWAIT,
                        std::ptr::null_mut(),
                    )
                };
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EAGAIN | libc::EINTR) => break,
                        _ => {
                            tracing::warn!(shard = setup.index, error = %e, "recvmmsg failed");
                            break;
                        }
                    }
                }
                let got = r as usize;
                router.begin();
                let snap: &Arc<Snapshot> = cache.load();
                for k in 0..got {
                    let m = &bufs.msgs[k];
                    let flags = m.msg_hdr.msg_flags;
                    if flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
                        router.truncated();
                        continue;
                    }
                    let len = (m.msg_len as usize).min(BUF_LEN);
                    let ctrl_len = m.msg_hdr.msg_controllen.min(CTRL_LEN);
                    let namelen = m.msg_hdr.msg_namelen;
                    let Some(client) = sys::sockaddr_from_bytes(sys::storage_bytes(&bufs.names[k], namelen)) else {
                        router.truncated();
                        continue;
                    };
                    let meta = cmsg::parse(&bufs.ctrl[k * CTRL_LEN..k * CTRL_LEN + ctrl_len]);
                    let payload = &bufs.data[k * BUF_LEN..k * BUF_LEN + len];
                    // SAFETY: `payload` lives in `bufs`, untouched until the flush below.
                    unsafe { router.datagram(snap, info, client, &meta, payload) };
                }
                router.flush(snap);
                if got < batch {
                    break;
                }
            }
        }
    }
}
