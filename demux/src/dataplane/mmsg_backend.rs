//! The portable backend: non-blocking recvmmsg(2) driven by a level-triggered epoll.
//! Same routing, forwarding and counters as the io_uring backend (crate::dataplane::shard).

use crate::dataplane::cmsg;
use crate::dataplane::shard::{pin_thread, Router, ShardSetup, SockInfo};
use crate::dataplane::snapshot::Snapshot;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use sys::Epoll;

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

/// One message recvmmsg(2) filled, taken apart into its client, its control data
/// (parsed) and its payload, a view of `data`. None when anything was cut: MSG_TRUNC
/// (a payload longer than `data`), MSG_CTRUNC (control data longer than `ctrl`), or a
/// name that is not an address. The caller counts those as truncated.
fn take_apart<'b>(
    m: &libc::mmsghdr,
    name: &libc::sockaddr_storage,
    ctrl: &[u8],
    data: &'b [u8],
) -> Option<(SocketAddr, cmsg::RecvMeta, &'b [u8])> {
    if m.msg_hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return None;
    }
    let client = sys::addr::sockaddr_from_bytes(sys::addr::storage_bytes(name, m.msg_hdr.msg_namelen))?;
    let control = ctrl.get(..m.msg_hdr.msg_controllen)?;
    let payload = data.get(..m.msg_len as usize)?;
    Some((client, cmsg::parse(control), payload))
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
                    let ctrl = &bufs.ctrl[k * CTRL_LEN..(k + 1) * CTRL_LEN];
                    let data = &bufs.data[k * BUF_LEN..(k + 1) * BUF_LEN];
                    let Some((client, meta, payload)) = take_apart(&bufs.msgs[k], &bufs.names[k], ctrl, data) else {
                        router.truncated();
                        continue;
                    };
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::UdpSocket;

    /// What one real recvmmsg(2) of one message left: the header and its buffers.
    struct Received {
        msg: libc::mmsghdr,
        name: Box<libc::sockaddr_storage>,
        ctrl: Vec<u8>,
        data: Vec<u8>,
    }

    impl Received {
        fn take_apart(&self) -> Option<(SocketAddr, cmsg::RecvMeta, &[u8])> {
            take_apart(&self.msg, &self.name, &self.ctrl, &self.data)
        }
    }

    /// Receives one waiting datagram on `s` with a `data_len`-byte payload buffer and a
    /// `ctrl_len`-byte control buffer.
    fn recv_one(s: &UdpSocket, data_len: usize, ctrl_len: usize) -> Received {
        let mut r = Received {
            // SAFETY: plain old data; all-zero is valid.
            msg: unsafe { std::mem::zeroed() },
            // SAFETY: plain old data; all-zero is valid.
            name: Box::new(unsafe { std::mem::zeroed() }),
            ctrl: vec![0; ctrl_len],
            data: vec![0; data_len],
        };
        let mut iov = libc::iovec { iov_base: r.data.as_mut_ptr().cast(), iov_len: data_len };
        let h = &mut r.msg.msg_hdr;
        h.msg_name = (&mut *r.name as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = r.ctrl.as_mut_ptr().cast();
        h.msg_controllen = ctrl_len;
        // SAFETY: one armed message whose pointers are live for the call; no timeout.
        let n = unsafe { libc::recvmmsg(s.as_raw_fd(), &mut r.msg, 1, 0, std::ptr::null_mut()) };
        assert_eq!(n, 1, "{}", std::io::Error::last_os_error());
        r.msg.msg_hdr.msg_iov = std::ptr::null_mut(); // `iov` dies here
        r
    }

    fn set_ip_option(s: &UdpSocket, option: libc::c_int, value: libc::c_int) {
        // SAFETY: setsockopt on our own socket with a live c_int.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_IP,
                option,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    }

    /// A loopback pair: the sender marks ECT(0) (RFC 3168), the receiver asks for the
    /// TOS byte as the shard does, so every datagram carries control data.
    fn pair() -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_ip_option(&rx, libc::IP_RECVTOS, 1);
        let tx = UdpSocket::bind("127.0.0.2:0").unwrap();
        set_ip_option(&tx, libc::IP_TOS, 0b10);
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
        let (client, meta, got) = whole.take_apart().expect("a whole datagram");
        assert_eq!(client, tx.local_addr().unwrap());
        assert_eq!(got, &payload[..], "exactly the payload, not the whole buffer");
        assert_eq!(meta.ecn, 0b10, "ECT(0) read from the control data");

        tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        let cut = recv_one(&rx, 199, CTRL_LEN);
        assert_ne!(cut.msg.msg_hdr.msg_flags & libc::MSG_TRUNC, 0, "the kernel cut the payload");
        assert!(cut.take_apart().is_none(), "a cut payload is refused");

        tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        let cut = recv_one(&rx, 256, 8);
        assert_ne!(cut.msg.msg_hdr.msg_flags & libc::MSG_CTRUNC, 0, "the kernel cut the control data");
        assert!(cut.take_apart().is_none(), "cut control data is refused");

        let mut no_name = whole;
        no_name.msg.msg_hdr.msg_namelen = 0;
        assert!(no_name.take_apart().is_none(), "a name that is not an address is refused");
    }
}
