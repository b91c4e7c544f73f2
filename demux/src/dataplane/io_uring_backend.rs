//! The io_uring backend: per shard one ring (IORING_SETUP_SINGLE_ISSUER |
//! IORING_SETUP_DEFER_TASKRUN when the kernel accepts them), one registered
//! provided-buffer ring (io_uring_register_buf_ring(3), kernel ≥ 5.19) and one
//! multishot RecvMsg per UDP socket (kernel ≥ 6.0). Every completion carries one
//! datagram or GRO train in a buffer the kernel picked from the ring, laid out as
//! `io_uring_recvmsg_out | name | control | payload` (io_uring_prep_recvmsg_multishot(3)).
//! A buffer goes back to the ring as soon as its datagram is routed, or, when a
//! SEQPACKET frame points into it, after the batch's sendmmsg calls; which buffers the
//! kernel is offered is crate::dataplane::buffer_stock's. Forwarding is the same as
//! the mmsg backend's (crate::dataplane::forward).

use crate::dataplane::buffer_stock::Stock;
use crate::dataplane::cmsg;
use crate::dataplane::shard::{pin_thread, Router, ShardSetup, SockInfo};
use crate::dataplane::snapshot::Snapshot;
use anyhow::{bail, Context, Result};
use io_uring::types::{BufRingEntry, Fd, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, IoUring, Probe};
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

/// Buffer group id of the shard's provided-buffer ring.
const BGID: u16 = 0;
/// Room for the recvmsg_out header, the name (sockaddr_in6: 28 B) and control data.
const HEADROOM: usize = 512;
/// Control bytes reserved per datagram: pktinfo (v6: 20 B), tos/tclass, UDP_GRO.
const CTRL_LEN: usize = 128;
/// Name bytes reserved per datagram: the larger of sockaddr_in / sockaddr_in6.
const NAME_LEN: usize = size_of::<libc::sockaddr_in6>();
/// One buffer: a whole 64 KiB GRO train plus headroom.
pub const BUF_LEN: usize = 65_536 + HEADROOM;
const RING_ENTRIES: u32 = 64;
const CQ_ENTRIES: u32 = 4096;

/// Receives one round of the shard loop may take before it routes and forwards them:
/// at saturation the kernel hands a multishot recvmsg at most 32 datagrams per task
/// run (MULTISHOT_MAX_RETRY), and every per-round cost (io_uring_enter, one sendmmsg
/// or ring flush per worker, a sleeping worker's eventfd write) is shared by the
/// receives of a round. The round only grows with completions the kernel already has
/// pending (IORING_SQ_TASKRUN): it never waits for more.
const ROUND_RECEIVES: usize = 448;
/// Receives one task run of one multishot may post (the kernel's MULTISHOT_MAX_RETRY
/// plus the first): a round asks for more only while this many buffers per socket are free.
const RECEIVES_PER_TASK_RUN: usize = 33;

/// Builds a ring with the single-issuer + deferred-taskrun flags (and
/// IORING_SETUP_TASKRUN_FLAG, so that pending receives are visible without a system
/// call), or without them when the kernel refuses (they need 6.1). Returns the ring
/// and whether they took.
fn build_ring() -> std::io::Result<(IoUring, bool)> {
    let fast = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_cqsize(CQ_ENTRIES)
        .build(RING_ENTRIES);
    match fast {
        Ok(r) => Ok((r, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Ok((IoUring::builder().setup_cqsize(CQ_ENTRIES).build(RING_ENTRIES)?, false))
        }
        Err(e) => Err(e),
    }
}

fn explain(e: &std::io::Error) -> String {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok().map(|s| s.trim().to_string());
    match (e.raw_os_error(), sysctl.as_deref()) {
        (Some(libc::EPERM), Some(v)) if v != "0" => format!("io_uring_setup: {e} (kernel.io_uring_disabled={v})"),
        (Some(libc::EPERM), _) => format!("io_uring_setup: {e} (refused, e.g. by a seccomp profile)"),
        (Some(libc::ENOSYS), _) => format!("io_uring_setup: {e} (kernel without io_uring or filtered by seccomp)"),
        _ => format!("io_uring_setup: {e}"),
    }
}

/// Checks that this process can use everything the backend needs: a ring, the
/// RECVMSG opcode, a provided-buffer ring. The error says why not.
pub fn probe() -> Result<()> {
    let (ring, _) = build_ring().map_err(|e| anyhow::anyhow!(explain(&e)))?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).context("IORING_REGISTER_PROBE")?;
    if !probe.is_supported(opcode::RecvMsg::CODE) {
        bail!("the kernel's io_uring lacks IORING_OP_RECVMSG");
    }
    // Multishot recvmsg (IORING_RECV_MULTISHOT) arrived in Linux 6.0; Probe cannot
    // see flags, so check the release.
    if let Some((major, minor)) = kernel_release() {
        if (major, minor) < (6, 0) {
            bail!("Linux {major}.{minor} lacks multishot recvmsg (needs 6.0)");
        }
    }
    let br = BufRing::new(8).context("mmap for a probe buffer ring")?;
    // SAFETY: `br` is a page-aligned mapping of 8 entries that outlives the ring
    // registration (unregistered right below, before `br` drops).
    unsafe { ring.submitter().register_buf_ring_with_flags(br.addr(), 8, BGID, 0) }
        .context("io_uring_register_buf_ring (needs Linux 5.19)")?;
    let _ = ring.submitter().unregister_buf_ring(BGID);
    Ok(())
}

/// (major, minor) of the running kernel, from uname(2).
fn kernel_release() -> Option<(u32, u32)> {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let rel: String = u.release.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
    let mut it = rel.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The mmap'd ring of `io_uring_buf` entries shared with the kernel.
struct BufRing {
    base: *mut BufRingEntry,
    entries: u16,
    map_len: usize,
    tail: u16,
}

impl BufRing {
    fn new(entries: u16) -> std::io::Result<BufRing> {
        let map_len = usize::from(entries) * size_of::<BufRingEntry>();
        // SAFETY: anonymous private mapping; checked for MAP_FAILED below. mmap memory
        // is page aligned and zeroed, as the buf-ring ABI requires.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_ANONYMOUS | libc::MAP_PRIVATE | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(BufRing { base: p.cast(), entries, map_len, tail: 0 })
    }

    fn addr(&self) -> u64 {
        self.base as u64
    }

    /// Writes a buffer into the next free entry (not yet visible to the kernel).
    fn add(&mut self, addr: *const u8, len: u32, bid: u16) {
        let idx = usize::from(self.tail & (self.entries - 1));
        // SAFETY: idx < entries: inside the mapping; the kernel only reads entries
        // between its head and the published tail, and this one is past the tail.
        let e = unsafe { &mut *self.base.add(idx) };
        e.set_addr(addr as u64);
        e.set_len(len);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes every added buffer visible to the kernel (release store of the tail).
    fn publish(&self) {
        // SAFETY: the tail field overlays entry 0's `resv` (io_uring_buf_ring ABI),
        // a properly aligned u16 inside the mapping, which the kernel reads with
        // acquire semantics; we are its only writer.
        unsafe {
            let tail = BufRingEntry::tail(self.base) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in new(); the ring that used it
        // is dropped or unregistered first (field order / explicit unregister).
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}

struct Socket {
    info: SockInfo,
    fd: i32,
    /// The msghdr template of the multishot recvmsg (only namelen/controllen count);
    /// boxed so its address is stable while the request lives.
    msghdr: Box<libc::msghdr>,
    armed: bool,
}

pub fn run(setup: ShardSetup) -> Result<()> {
    pin_thread(&setup);
    let nbuf = setup.uring_buffers;
    let mut router = Router::new(&setup).context("shard router")?;
    let mut cache = arc_swap::Cache::new(Arc::clone(&setup.shared));
    let mut socks: Vec<Socket> = setup
        .sockets
        .iter()
        .map(|s| {
            // SAFETY: plain old data; all-zero is valid.
            let mut h: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
            h.msg_namelen = NAME_LEN as libc::socklen_t;
            h.msg_controllen = CTRL_LEN;
            Socket { info: SockInfo { local: s.local }, fd: s.fd.as_raw_fd(), msghdr: h, armed: false }
        })
        .collect();
    let mut br = BufRing::new(nbuf).context("mmap buffer ring")?;
    let mut bufs = vec![0u8; usize::from(nbuf) * BUF_LEN];
    // Every access goes through this one raw pointer: the kernel writes buffers we
    // do not currently hold, so no reference to the whole Vec is ever formed again.
    let base: *mut u8 = bufs.as_mut_ptr();
    // Declared after `socks`, `br` and `bufs`, so dropped before them: nothing the
    // kernel may still reference is freed while the ring lives.
    let (mut ring, fast) = build_ring().map_err(|e| anyhow::anyhow!(explain(&e)))?;
    // SAFETY: `br` is page aligned, sized for `nbuf` entries, and outlives `ring`
    // (declared before it, so dropped after it): valid while registered.
    unsafe { ring.submitter().register_buf_ring_with_flags(br.addr(), nbuf, BGID, 0) }
        .context("io_uring_register_buf_ring")?;
    // Which buffers the kernel is offered (crate::dataplane::buffer_stock): a few at a
    // time, the most recently given back first, so that the same ones stay in cache.
    let mut stock = Stock::new(nbuf, RECEIVES_PER_TASK_RUN * socks.len());
    let refill = |br: &mut BufRing, stock: &mut Stock| {
        let offered = stock.refill(|bid| {
            // SAFETY: bid < nbuf (Stock hands out 0..nbuf): bid * BUF_LEN + BUF_LEN
            // <= bufs.len(), inside the allocation.
            let p = unsafe { base.add(usize::from(bid) * BUF_LEN) };
            br.add(p, BUF_LEN as u32, bid);
        });
        if offered {
            br.publish();
        }
    };
    refill(&mut br, &mut stock);

    tracing::info!(
        shard = setup.index,
        core = setup.core.id,
        backend = "uring",
        buffers = nbuf,
        single_issuer_defer_taskrun = fast,
        "shard running"
    );
    let _ = setup.started.send(setup.index);
    // This round's receive buffers that a queued SEQPACKET frame points into (given
    // back after the flush; every other one goes back to `stock` as soon as it is
    // routed, and is offered again before the next io_uring_enter).
    let mut held: Vec<u16> = Vec::with_capacity(usize::from(nbuf));
    let mut rearm: Vec<usize> = (0..socks.len()).collect();
    let mut failures = 0u32;
    let idle = Timespec::new().sec(1);
    loop {
        // A busy poll waits for receives, so not while a multishot is unarmed.
        let spin = !setup.busy_poll.is_zero() && rearm.is_empty();
        // Re-arm every multishot that ended (first round: arm them all).
        for &i in &rearm {
            let s = &mut socks[i];
            let e = opcode::RecvMsgMulti::new(Fd(s.fd), &*s.msghdr as *const libc::msghdr, BGID)
                .build()
                .user_data(i as u64);
            // SAFETY: the msghdr is boxed in `socks`, which lives as long as the ring;
            // the buffers come from the registered ring.
            let pushed = unsafe { ring.submission().push(&e) };
            if pushed.is_err() {
                // Cannot happen: at most one SQE per socket is outstanding.
                bail!("io_uring submission queue full");
            }
            s.armed = true;
        }
        rearm.clear();
        if spin {
            busy_poll(&mut ring, setup.busy_poll, &setup.counters);
        }
        // Wake at least once a second even without traffic, so an idle shard drops
        // its reference to an old snapshot (and the fds of departed workers) too.
        let args = SubmitArgs::new().timespec(&idle);
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)) => {}
            Err(e) => return Err(e).context("io_uring_enter"),
        }
        router.begin();
        let snap: &Arc<Snapshot> = cache.load();
        let mut taken = 0usize;
        loop {
            let before = taken;
            take_completions(
                &mut ring,
                &mut socks,
                &mut rearm,
                Buffers { held: &mut held, stock: &mut stock, taken: &mut taken },
                &mut failures,
                nbuf,
                base,
                &mut router,
                snap,
            )
            .with_context(|| format!("shard {}", setup.index))?;
            // A fuller round (ROUND_RECEIVES): run the receives the kernel has queued
            // as task work, without waiting, while buffers last.
            refill(&mut br, &mut stock);
            if !fast
                || taken == before
                || taken >= ROUND_RECEIVES
                || stock.offered() < RECEIVES_PER_TASK_RUN * socks.len()
                || !ring.submission().taskrun()
            {
                break;
            }
            match ring.submitter().submit_and_wait(0) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)) => break,
                Err(e) => return Err(e).context("io_uring_enter"),
            }
        }
        router.flush(snap);
        held.drain(..).for_each(|bid| stock.give_back(bid));
        refill(&mut br, &mut stock);
    }
}

/// `--busy-poll-us`: before the round's blocking io_uring_enter, spins up to `limit`
/// until the kernel has receives for us: task work queued (IORING_SQ_TASKRUN, set by
/// the kernel without waking us, IORING_SETUP_TASKRUN_FLAG) or completions posted.
/// Either way the io_uring_enter that follows returns at once, without a sleep and
/// a wake-up. Bounded: after `limit` the shard sleeps as it would without the flag.
fn busy_poll(ring: &mut IoUring, limit: std::time::Duration, counters: &crate::dataplane::counters::ShardCounters) {
    use crate::dataplane::counters::bump;
    let ready = |ring: &mut IoUring| ring.submission().taskrun() || !ring.completion().is_empty();
    if ready(ring) {
        return; // work is already there: no spin, nothing to count
    }
    bump(&counters.busy_poll_spins, 1);
    let until = std::time::Instant::now() + limit;
    loop {
        // The clock is read once per 64 checks (a vDSO call costs ≈ 20 ns here).
        for _ in 0..64 {
            if ready(ring) {
                bump(&counters.busy_poll_found, 1);
                return;
            }
            std::hint::spin_loop();
        }
        if std::time::Instant::now() >= until {
            return;
        }
    }
}

/// One multishot receive's buffer, `io_uring_recvmsg_out | name | control | payload`
/// (io_uring_prep_recvmsg_multishot(3)), taken apart: the client's address, what the
/// control data says, the payload. `None` (a `drops_truncated`) when the kernel cut
/// the payload, the control data or the name short, or the name is no address.
#[inline]
fn take_apart<'b>(buf: &'b [u8], msghdr: &libc::msghdr) -> Option<(std::net::SocketAddr, cmsg::RecvMeta, &'b [u8])> {
    let out = RecvMsgOut::parse(buf, msghdr).ok()?;
    if out.is_payload_truncated() || out.is_control_data_truncated() || out.is_name_data_truncated() {
        return None;
    }
    let client = sys::addr::sockaddr_from_bytes(out.name_data())?;
    // The payload as a slice of `buf` itself (RecvMsgOut lends it only for its own
    // lifetime): where it starts in `buf`, and how long it is.
    let p = out.payload_data();
    let start = (p.as_ptr() as usize).checked_sub(buf.as_ptr() as usize)?;
    let payload = buf.get(start..start + p.len())?;
    Some((client, cmsg::parse(out.control_data()), payload))
}

/// Routes every completion in the queue: each one datagram or GRO train in a provided
/// buffer, whose id goes to `used` (given back to the kernel after the round's flush).
/// A multishot that ended goes to `rearm`.
#[allow(clippy::too_many_arguments)]
fn take_completions(
    ring: &mut IoUring,
    socks: &mut [Socket],
    rearm: &mut Vec<usize>,
    bufs: Buffers<'_>,
    failures: &mut u32,
    nbuf: u16,
    base: *mut u8,
    router: &mut Router,
    snap: &Snapshot,
) -> Result<()> {
    {
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            let res = cqe.result();
            let flags = cqe.flags();
            if !cqueue::more(flags) {
                if let Some(s) = socks.get_mut(i) {
                    s.armed = false;
                    rearm.push(i);
                }
            }
            let Some(bid) = cqueue::buffer_select(flags) else {
                if res == -libc::ENOBUFS {
                    // The buffer ring ran empty: held buffers come back after this batch's
                    // flush; the multishot is re-armed above.
                    crate::dataplane::counters::bump(&router.counters.recv_no_buffers, 1);
                } else if res < 0 {
                    let err = std::io::Error::from_raw_os_error(-res);
                    *failures += 1;
                    // A multishot the kernel refuses outright would otherwise spin.
                    if *failures > 1000 {
                        bail!("multishot recvmsg keeps failing: {err}");
                    }
                    tracing::debug!(error = %err, "multishot recvmsg ended");
                }
                continue;
            };
            if bid >= nbuf {
                continue; // not one of ours: cannot happen, never indexes out of range
            }
            *bufs.taken += 1;
            bufs.stock.taken(1);
            *failures = 0;
            let Some(sock) = socks.get(i) else {
                bufs.stock.give_back(bid);
                continue;
            };
            if res <= 0 {
                bufs.stock.give_back(bid);
                continue;
            }
            let start = usize::from(bid) * BUF_LEN;
            let len = (res as usize).min(BUF_LEN);
            // SAFETY: start + len <= nbuf * BUF_LEN (bid < nbuf, len <= BUF_LEN); the
            // kernel filled this buffer and hands it to us until we give it back.
            let buf: &[u8] = unsafe { std::slice::from_raw_parts(base.add(start), len) };
            let Some((client, meta, payload)) = take_apart(buf, &sock.msghdr) else {
                router.truncated();
                bufs.stock.give_back(bid);
                continue;
            };
            let queued_before = router.payloads_queued();
            // SAFETY: the payload lives in `bufs`; its buffer id is in `used` and goes
            // back to the kernel only after the flush below.
            unsafe { router.datagram(snap, &sock.info, client, &meta, payload) };
            if router.payloads_queued() == queued_before {
                bufs.stock.give_back(bid); // copied into a ring, answered or dropped
            } else {
                bufs.held.push(bid); // a SEQPACKET frame points into it until the flush
            }
        }
    }
    Ok(())
}

/// Where `take_completions` puts each receive buffer it takes.
struct Buffers<'a> {
    /// Pointed into by a frame queued for the flush: given back after it.
    held: &'a mut Vec<u16>,
    /// Every buffer's owner: told of each one the kernel filled, and given back each
    /// one nothing points into any more (offered again before the next receives).
    stock: &'a mut Stock,
    /// Buffers the kernel filled this round.
    taken: &'a mut usize,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on their own setup
mod tests {
    use super::*;

    /// The msghdr template the shard arms its multishots with.
    fn template() -> libc::msghdr {
        // SAFETY: plain old data; all-zero is valid.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_namelen = NAME_LEN as libc::socklen_t;
        h.msg_controllen = CTRL_LEN;
        h
    }

    /// A buffer as the kernel lays it out: the io_uring_recvmsg_out header (namelen,
    /// controllen, payloadlen, flags), the name field, the control field, the payload.
    fn received(namelen: u32, name: &[u8], control: &[u8], payload: &[u8], flags: i32) -> Vec<u8> {
        let mut b = Vec::new();
        for w in [namelen, control.len() as u32, payload.len() as u32, flags as u32] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        let mut field = name.to_vec();
        field.resize(NAME_LEN, 0);
        b.extend_from_slice(&field);
        let mut field = control.to_vec();
        field.resize(CTRL_LEN, 0);
        b.extend_from_slice(&field);
        b.extend_from_slice(payload);
        b
    }

    fn sockaddr_v4(ip: [u8; 4], port: u16) -> Vec<u8> {
        // SAFETY: plain old data; all-zero is valid.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = port.to_be();
        sa.sin_addr.s_addr = u32::from_ne_bytes(ip);
        // SAFETY: reads the bytes of a live plain-old-data value.
        unsafe {
            std::slice::from_raw_parts((&sa as *const libc::sockaddr_in).cast::<u8>(), size_of::<libc::sockaddr_in>())
        }
        .to_vec()
    }

    /// A whole receive is taken apart; every kind of cut (payload, control data, name),
    /// a name that is no address and a buffer too short for its fields are refused:
    /// the shard counts them as `drops_truncated` and routes nothing.
    #[test]
    fn receives_are_taken_apart_and_cut_ones_refused() {
        let h = template();
        let name = sockaddr_v4([127, 0, 0, 9], 4433);
        let namelen = name.len() as u32;
        let payload = [0x40u8; 1200];
        let buf = received(namelen, &name, &[], &payload, 0);
        let (client, meta, got) = take_apart(&buf, &h).unwrap();
        assert_eq!(client, "127.0.0.9:4433".parse().unwrap());
        assert_eq!(got, &payload[..]);
        assert_eq!((meta.ecn, meta.gro_size, meta.local_ip), (0, None, None));

        assert!(take_apart(&received(namelen, &name, &[], &payload, libc::MSG_TRUNC), &h).is_none(), "payload cut");
        assert!(take_apart(&received(namelen, &name, &[], &payload, libc::MSG_CTRUNC), &h).is_none(), "control cut");
        let long_name = (NAME_LEN + 4) as u32;
        assert!(take_apart(&received(long_name, &name, &[], &payload, 0), &h).is_none(), "name cut");
        let mut not_inet = name.clone();
        not_inet[..2].copy_from_slice(&(libc::AF_UNIX as libc::sa_family_t).to_ne_bytes());
        assert!(take_apart(&received(namelen, &not_inet, &[], &payload, 0), &h).is_none(), "no address");
        assert!(take_apart(&received(0, &[], &[], &payload, 0), &h).is_none(), "no name at all");
        assert!(take_apart(&buf[..16 + NAME_LEN + CTRL_LEN - 1], &h).is_none(), "shorter than its fields");
    }
}
