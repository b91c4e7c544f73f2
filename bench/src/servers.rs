//! The contenders the bench runs as its own subprocesses, so their CPU time can be
//! measured apart from the bench's sender and sinks:
//!
//! - `bench floor-server --listen ADDR --ready-file R --counters F [--gro]`: one thread,
//!   recvmmsg into a batch of 32 and discard — the least any socket reader can spend.
//! - `bench baseline-server --listen ADDR --keys K --worker ID=PATH... --ready-file R --counters F`:
//!   the design being replaced — one thread, per datagram one recvmsg, one ADR 0001
//!   CID decode (`KeySet::decode`) and one `send()` of a frame (proto::wire header +
//!   payload) to that server id's SEQPACKET socket.
//! - `bench retry-floor-server --listen ADDR --reply-len N --ready-file R --counters F`:
//!   what the kernel alone costs a Retry — one thread, recvmmsg of 64 Initials and one
//!   sendmmsg of a reply per Initial (its first N bytes, a Retry's length) to its
//!   source, DF set as the demux sets it; no parsing and no cryptography.
//!
//! They publish their counters in a small shared file (`Counters`): the bench maps
//! it and reads them while they run; they are simply killed at the end.

use crate::cli::{BaselineArgs, FloorArgs, RetryFloorArgs, ServerArgs};
use anyhow::{bail, Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::frame::{self, FrameMeta, HEADER_LEN as FRAME_HEADER_LEN};
use socket2::SockAddr;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use sys::cmsg;
use sys::mmsg::{RecvMmsg, SendMeta, SendMmsg};

/// `n` u64 counters in a file mapped MAP_SHARED by the server and the bench.
pub(crate) struct Counters {
    ptr: *mut AtomicU64,
    n: usize,
}

// SAFETY: the mapping is only accessed through atomics.
unsafe impl Send for Counters {}
// SAFETY: as for Send: every access to the mapping is atomic.
unsafe impl Sync for Counters {}

impl Counters {
    /// `create`: the server makes a zeroed file; otherwise (the bench) map an existing one.
    pub(crate) fn map(path: &Path, n: usize, create: bool) -> Result<Counters> {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(create).truncate(create).open(path)?;
        if create {
            f.set_len((n * 8) as u64)?;
        } else if f.metadata()?.len() < (n * 8) as u64 {
            bail!("{} is too short", path.display());
        }
        // SAFETY: maps a file of exactly n * 8 bytes, shared, page aligned (so the
        // AtomicU64s are aligned); the fd may be closed after mmap.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap {}: {}", path.display(), std::io::Error::last_os_error());
        }
        Ok(Counters { ptr: p.cast(), n })
    }

    fn at(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.n);
        // SAFETY: in bounds of the live mapping.
        unsafe { &*self.ptr.add(i) }
    }

    pub(crate) fn get(&self, i: usize) -> u64 {
        self.at(i).load(Ordering::Relaxed)
    }

    fn add(&self, i: usize, v: u64) {
        // Only the server writes: a plain load + store is enough (no lock prefix).
        let a = self.at(i);
        a.store(a.load(Ordering::Relaxed) + v, Ordering::Relaxed);
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        // SAFETY: unmaps what create() mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.n * 8) };
    }
}

/// Counter indices.
pub(crate) const RECEIVED: usize = 0;
pub(crate) const FORWARDED: usize = 1;
pub(crate) const DROPPED: usize = 2;
pub(crate) const N_COUNTERS: usize = 3;

fn setsockopt_int(fd: i32, level: i32, opt: i32, v: i32) -> Result<()> {
    sys::sockopt::setsockopt_int(fd, level, opt, v).with_context(|| format!("setsockopt({level}, {opt})"))
}

fn bind(a: &ServerArgs, gro: bool) -> Result<UdpSocket> {
    let s = UdpSocket::bind(a.listen)?;
    // The receive buffer the demux asks for (8 MiB, forced as root).
    let _ = setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20);
    if gro {
        setsockopt_int(s.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1)?;
    }
    Ok(s)
}

fn ready(a: &ServerArgs, s: &UdpSocket) -> Result<()> {
    let tmp = a.ready_file.with_extension("tmp");
    std::fs::write(&tmp, format!("udp {}\n", s.local_addr()?))?;
    std::fs::rename(&tmp, &a.ready_file)?;
    Ok(())
}

/// recvmmsg into 32 buffers and discard; with --gro, count GRO segments from the
/// UDP_GRO control message.
pub fn floor(a: FloorArgs) -> Result<()> {
    let c = Counters::map(&a.server.counters, N_COUNTERS, true)?;
    let s = bind(&a.server, a.gro)?;
    ready(&a.server, &s)?;
    const N: usize = 32;
    const LEN: usize = 65_536;
    const CMSG: usize = 64;
    let mut batch = RecvMmsg::new(N, LEN).with_control(if a.gro { CMSG } else { 0 });
    loop {
        let Ok(got) = batch.recv(&s, libc::MSG_WAITFORONE) else { continue };
        if got == 0 {
            continue;
        }
        let mut n = got as u64;
        if a.gro {
            n = batch
                .iter()
                .map(|m| {
                    let gro = cmsg::iter(m.control).find(|c| (c.level, c.ty) == (libc::SOL_UDP, libc::UDP_GRO));
                    let seg = gro.and_then(|c| c.int()).map_or(m.len, |v| v as usize);
                    m.len.div_ceil(seg.max(1)) as u64
                })
                .sum();
        }
        c.add(RECEIVED, n);
    }
}

/// The kernel's share of a Retry: receive each Initial, send `reply_len` bytes of it
/// back to its source, batched as the demux batches (recvmmsg of 64, one sendmmsg).
/// A refused reply is counted as dropped and skipped, as the demux's Minter::flush
/// skips it.
pub fn retry_floor(a: RetryFloorArgs) -> Result<()> {
    let c = Counters::map(&a.server.counters, N_COUNTERS, true)?;
    let s = bind(&a.server, false)?;
    // DF, as on every data-plane socket (RFC 9000 §14; demux dataplane::socket).
    let (level, opt, v) = match a.server.listen {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_PROBE),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_PROBE),
    };
    setsockopt_int(s.as_raw_fd(), level, opt, v)?;
    ready(&a.server, &s)?;
    const N: usize = 64;
    const LEN: usize = 2048;
    let reply_len = a.reply_len.min(LEN);
    let mut batch = RecvMmsg::new(N, LEN).with_names();
    let mut replies = SendMmsg::new(N, 1);
    let mut to: Vec<Option<SockAddr>> = Vec::with_capacity(N);
    loop {
        let Ok(got) = batch.recv(&s, libc::MSG_WAITFORONE) else { continue };
        if got == 0 {
            continue;
        }
        c.add(RECEIVED, got as u64);
        to.clear();
        to.extend(batch.iter().map(|m| m.source().map(SockAddr::from)));
        let mut out = replies.batch();
        for (m, to) in batch.iter().zip(&to) {
            match to {
                Some(to) => _ = out.push(&[&m.data[..reply_len.min(m.len)]], SendMeta::to(to)),
                None => c.add(DROPPED, 1),
            }
        }
        let sent = out.send_skipping(&s, libc::MSG_DONTWAIT, |_, _| c.add(DROPPED, 1));
        c.add(FORWARDED, sent as u64);
    }
}

/// The design being replaced: per datagram one recvmsg, one CID decode, one send().
pub fn baseline(a: BaselineArgs) -> Result<()> {
    let keys = KeyFile::parse(&std::fs::read_to_string(&a.keys)?)?.key_set().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut table: Vec<Option<OwnedFd>> = Vec::new();
    for (id, p) in &a.workers {
        let fd = sys::seqpacket::connect(p)?;
        // The send buffer the demux gives its data connections (4 MiB).
        let _ = setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 4 << 20);
        let i = usize::from(*id);
        if table.len() <= i {
            table.resize_with(i + 1, || None);
        }
        table[i] = Some(fd);
    }
    let c = Counters::map(&a.server.counters, N_COUNTERS, true)?;
    let s = bind(&a.server, false)?;
    ready(&a.server, &s)?;
    let mut buf = vec![0u8; FRAME_HEADER_LEN + 65_536];
    loop {
        // SAFETY: plain old data.
        let mut from: libc::sockaddr_in6 = unsafe { zeroed() };
        let mut iov = libc::iovec { iov_base: buf[FRAME_HEADER_LEN..].as_mut_ptr().cast(), iov_len: 65_536 };
        // SAFETY: plain old data.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_in6).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_in6>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        // SAFETY: msg points at live buffers.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
        if n <= 0 {
            continue;
        }
        let n = n as usize;
        c.add(RECEIVED, 1);
        let p = &buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + n];
        // The DCID: short header bytes 1..13 (ADR 0001 length), long header after the version.
        let dcid = if p[0] & 0x80 == 0 { p.get(1..13) } else { p.get(5).and_then(|&l| p.get(6..6 + usize::from(l))) };
        let Some(id) = dcid.and_then(|d| keys.decode(d).ok()).map(|d| usize::from(d.server_id.0)) else {
            c.add(DROPPED, 1);
            continue;
        };
        let Some(Some(fd)) = table.get(id) else {
            c.add(DROPPED, 1);
            continue;
        };
        let client = if from.sin6_family == libc::AF_INET as u16 {
            // SAFETY: the kernel wrote a sockaddr_in.
            let v4: libc::sockaddr_in = unsafe { std::ptr::read((&from as *const libc::sockaddr_in6).cast()) };
            SocketAddr::from((u32::from_be(v4.sin_addr.s_addr).to_be_bytes(), u16::from_be(v4.sin_port)))
        } else {
            SocketAddr::from((from.sin6_addr.s6_addr, u16::from_be(from.sin6_port)))
        };
        let meta = FrameMeta { client, local: None, ecn: 0, segment_size: None };
        let mut h = [0u8; FRAME_HEADER_LEN];
        frame::encode_header(&meta, &mut h);
        buf[..FRAME_HEADER_LEN].copy_from_slice(&h);
        // SAFETY: sends from a live buffer.
        let r = unsafe {
            libc::send(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                FRAME_HEADER_LEN + n,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        c.add(if r > 0 { FORWARDED } else { DROPPED }, 1);
    }
}
