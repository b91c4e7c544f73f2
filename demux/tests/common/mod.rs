//! Test harness: the real `demux` binary on loopback, test workers speaking the
//! data-connection protocol (docs/architecture.md), a UDP client with handcrafted
//! QUIC datagrams, and the status JSON from the control socket.
#![allow(dead_code)]

use proto::keyfile::KeyFile;
use proto::wire::{decode_control, decode_frame, encode_control, Control, FrameMeta};
use proto::{KeySet, ServerId};
use serde_json::Value;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_demux");

/// Runs `$body(io)` once per backend: `mod $name { fn uring(), fn mmsg() }`.
#[macro_export]
macro_rules! both_backends {
    ($name:ident) => {
        mod $name {
            #[test]
            fn uring() {
                super::$name("uring")
            }
            #[test]
            fn mmsg() {
                super::$name("mmsg")
            }
        }
    };
    // The same, plus both backends with `--forward ring` (test workers read rings).
    ($name:ident, rings) => {
        mod $name {
            #[test]
            fn uring() {
                super::$name("uring")
            }
            #[test]
            fn mmsg() {
                super::$name("mmsg")
            }
            #[test]
            fn uring_ring() {
                super::$name("uring+ring")
            }
            #[test]
            fn mmsg_ring() {
                super::$name("mmsg+ring")
            }
        }
    };
}

static SEQ: AtomicU64 = AtomicU64::new(0);

pub fn temp_dir(tag: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    // Short: unix socket paths are limited to 107 bytes.
    let d = PathBuf::from(format!(
        "/tmp/dmx-{}-{}-{}-{:x}",
        tag.chars().take(8).collect::<String>(),
        std::process::id(),
        n,
        nanos
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Cheap deterministic PRNG (xorshift64*) so failures reproduce.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.next() as u8;
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

pub struct Demux {
    pub child: Child,
    pub dir: PathBuf,
    pub udp: Vec<SocketAddr>,
    pub data: PathBuf,
    pub control: PathBuf,
    pub keys: KeyFile,
    pub io: String,
    /// `--forward ring` (an `io` of `uring+ring` / `mmsg+ring`): test workers ask for
    /// rings and read them.
    pub rings: bool,
}

impl Demux {
    pub fn start(io: &str, cores: &str) -> Demux {
        Self::start_with(io, cores, &[])
    }

    pub fn start_with(io: &str, cores: &str, extra: &[&str]) -> Demux {
        Self::start_opts(io, cores, extra, &[])
    }

    /// As [`Demux::start_with`]; the data plane runs under a seccomp filter that fails
    /// each of the `denied` syscalls with EPERM (as container runtimes do), e.g.
    /// `SYS_io_uring_setup` or `SYS_bpf`.
    pub fn start_opts(io: &str, cores: &str, extra: &[&str], denied: &[libc::c_long]) -> Demux {
        let dir = temp_dir(io);
        let (io, rings) = match io.strip_suffix("+ring") {
            Some(b) => (b, true),
            None => (io, false),
        };
        let forward: &[&str] = if rings { &["--forward", "ring"] } else { &[] };
        let keys_path = dir.join("keys");
        let st = Command::new(BIN).args(["gen-keys", "--out"]).arg(&keys_path).status().unwrap();
        assert!(st.success(), "gen-keys failed");
        let keys = KeyFile::parse(&std::fs::read_to_string(&keys_path).unwrap()).unwrap();
        let data = dir.join("d.sock");
        let control = dir.join("c.sock");
        let ready = dir.join("ready");
        let log = std::fs::File::create(dir.join("demux.log")).unwrap();
        let mut cmd = Command::new(BIN);
        if !denied.is_empty() {
            deny_syscalls_in_child(&mut cmd, denied);
        }
        let mut child = cmd
            .args(["dataplane", "--listen", "127.0.0.1:0", "--cores", cores, "--io", io, "--keys"])
            .arg(&keys_path)
            .arg("--data-socket")
            .arg(&data)
            .arg("--control-socket")
            .arg(&control)
            .arg("--ready-file")
            .arg(&ready)
            .args(forward)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let text = loop {
            if let Ok(t) = std::fs::read_to_string(&ready) {
                break t;
            }
            if let Ok(Some(st)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("demux.log")).unwrap_or_default();
                panic!("demux exited early ({st}): {log}");
            }
            assert!(Instant::now() < deadline, "demux not ready in time");
            std::thread::sleep(Duration::from_millis(10));
        };
        let udp = text.lines().filter_map(|l| l.strip_prefix("udp ")).map(|a| a.parse().unwrap()).collect();
        Demux { child, dir, udp, data, control, keys, io: io.to_string(), rings }
    }

    pub fn addr(&self) -> SocketAddr {
        self.udp[0]
    }

    pub fn key_set(&self) -> KeySet {
        self.keys.key_set().unwrap()
    }

    /// A fresh ADR-0040 CID for `server_id`.
    pub fn cid(&self, server_id: u16, rng: &mut Rng) -> [u8; 12] {
        let mut r = [0u8; 10];
        rng.fill(&mut r);
        self.key_set().encode(ServerId(server_id), &r)
    }

    pub fn status(&self) -> Value {
        let fd = seqpacket_connect(&self.control).expect("connect control socket");
        send_record(fd.as_raw_fd(), &encode_control(&Control::StatusRequest), &[]).unwrap();
        let mut buf = vec![0u8; 128 * 1024];
        let (n, _) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
        match decode_control(&buf[..n]).unwrap() {
            Control::Status { json } => serde_json::from_str(&json).unwrap(),
            other => panic!("unexpected reply {other:?}"),
        }
    }

    /// Polls status until `pred` holds (bounded); returns the last status.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status();
            if pred(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; status: {s}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until exactly these server ids are live with these placeable flags.
    pub fn wait_instances(&self, want: &[(u16, bool)]) {
        let mut want = want.to_vec();
        want.sort();
        self.wait_status("instance set", |s| {
            let mut got: Vec<(u16, bool)> = s["instances"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|i| (i["server_id"].as_u64().unwrap() as u16, i["placeable"].as_bool().unwrap()))
                        .collect()
                })
                .unwrap_or_default();
            got.sort();
            got == want
        });
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("demux.log")).unwrap_or_default()
    }
}

impl Drop for Demux {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn u64_at(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or_else(|| panic!("no {ptr} in status {v}"))
}

pub fn reason(v: &Value, r: &str) -> u64 {
    u64_at(v, &format!("/reasons/{r}"))
}

pub fn reasons_sum(v: &Value) -> u64 {
    proto::Reason::ALL.iter().map(|r| reason(v, r.name())).sum()
}

pub fn instance(v: &Value, id: u16) -> &Value {
    v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["server_id"].as_u64() == Some(u64::from(id))))
        .unwrap_or_else(|| panic!("instance {id} not in status {v}"))
}

// ---------------------------------------------------------------------------------
// SOCK_SEQPACKET plumbing (std has no SEQPACKET)
// ---------------------------------------------------------------------------------

pub fn seqpacket_connect(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: test helper; plain syscalls with checked results.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sun: libc::sockaddr_un = zeroed();
        sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in sun.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
            *d = *s as libc::c_char;
        }
        let len = (size_of::<libc::sa_family_t>() + path.as_os_str().len() + 1) as libc::socklen_t;
        if libc::connect(fd.as_raw_fd(), (&sun as *const libc::sockaddr_un).cast(), len) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

pub fn send_record(fd: RawFd, rec: &[u8], _fds: &[RawFd]) -> io::Result<()> {
    // SAFETY: sends from a live slice.
    let r = unsafe { libc::send(fd, rec.as_ptr().cast(), rec.len(), libc::MSG_NOSIGNAL) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One record plus any fds attached (SCM_RIGHTS).
pub fn recv_record(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    // SAFETY: recvmsg into live buffers; the cmsg walk is bounded by the CMSG macros.
    unsafe {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let mut cbuf = [0u64; 64];
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 64]>();
        let n = libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..k {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok((n as usize, fds))
    }
}

fn set_rcvtimeo(fd: RawFd, d: Duration) {
    let tv = libc::timeval { tv_sec: d.as_secs() as libc::time_t, tv_usec: d.subsec_micros() as libc::suseconds_t };
    // SAFETY: passes a live timeval of the right size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

// ---------------------------------------------------------------------------------
// Test worker
// ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Frame {
    pub meta: FrameMeta,
    pub len: usize,
    /// The payload's first 64 bytes.
    pub head: Vec<u8>,
}

impl Frame {
    pub fn segments(&self) -> usize {
        match self.meta.segment_size {
            Some(s) => self.len.div_ceil(usize::from(s)),
            None => 1,
        }
    }
    /// The short-header DCID (bytes 1..13) or the long-header DCID.
    pub fn dcid(&self) -> Vec<u8> {
        let h = &self.head;
        if h[0] & 0x80 == 0 {
            h[1..13].to_vec()
        } else {
            let l = h[5] as usize;
            h[6..6 + l].to_vec()
        }
    }
}

pub struct Worker {
    pub server_id: u16,
    pub fd: Arc<OwnedFd>,
    pub frames: Arc<Mutex<Vec<Frame>>>,
    pub bad_frames: Arc<AtomicU64>,
    /// What the data plane sent in reply to DataHello.
    pub sockets: Vec<SocketAddr>,
    pub socket_fds: Vec<OwnedFd>,
    /// `FastSockets` (a worker that asked with `CAP_FAST_PATH`): its own sockets,
    /// read by the test (non-blocking).
    pub fast: Vec<(SocketAddr, UdpSocket)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Connects, says DataHello, reads Sockets, and (if `ready`) says Ready.
    pub fn connect(d: &Demux, server_id: u16, ready: bool) -> Worker {
        Self::connect_opts(d, server_id, ready, true)
    }

    /// As [`Worker::connect`]; with `read: false` nothing ever reads the data
    /// connection (a stuck worker: its socket fills up).
    pub fn connect_opts(d: &Demux, server_id: u16, ready: bool, read: bool) -> Worker {
        Self::connect_full(d, server_id, ready, read, false)
    }

    /// As [`Worker::connect`], asking for the kernel fast path (`CAP_FAST_PATH`): the
    /// data plane answers `FastSockets` (kept in `fast`) before `Rings`.
    pub fn connect_fast(d: &Demux, server_id: u16, ready: bool) -> Worker {
        Self::connect_full(d, server_id, ready, true, true)
    }

    fn connect_full(d: &Demux, server_id: u16, ready: bool, read: bool, fast_path: bool) -> Worker {
        let fd = seqpacket_connect(&d.data).unwrap();
        let caps =
            if d.rings { proto::wire::CAP_RINGS } else { 0 } | if fast_path { proto::wire::CAP_FAST_PATH } else { 0 };
        let hello = if caps != 0 {
            Control::DataHelloV2 { server_id: ServerId(server_id), caps }
        } else {
            Control::DataHello { server_id: ServerId(server_id) }
        };
        send_record(fd.as_raw_fd(), &encode_control(&hello), &[]).unwrap();
        let mut buf = vec![0u8; 4096];
        let (n, socket_fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
        let sockets = match decode_control(&buf[..n]) {
            Ok(Control::Sockets { addrs }) => addrs,
            other => panic!("worker {server_id}: expected Sockets, got {other:?}"),
        };
        let mut fast = Vec::new();
        if fast_path {
            let (n, fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
            let Ok(Control::FastSockets { addrs }) = decode_control(&buf[..n]) else {
                panic!("worker {server_id}: expected FastSockets")
            };
            assert_eq!(addrs.len(), fds.len(), "worker {server_id}: one fd per fast socket");
            for (a, f) in addrs.into_iter().zip(fds) {
                let u = UdpSocket::from(f);
                u.set_nonblocking(true).unwrap();
                fast.push((a, u));
            }
        }
        let mut rings = Vec::new();
        if caps != 0 {
            let (n, fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
            let Ok(Control::Rings { count, bytes }) = decode_control(&buf[..n]) else {
                panic!("worker {server_id}: expected Rings")
            };
            assert_eq!(count > 0, d.rings, "worker {server_id}: rings only under --forward ring");
            assert!(fds.len() == 2 * usize::from(count), "worker {server_id}: {count} rings");
            let mut fds = fds.into_iter();
            while let (Some(m), Some(e)) = (fds.next(), fds.next()) {
                rings.push(worker::ring::Consumer::open(m, e, bytes).unwrap());
            }
        }
        if ready {
            send_record(fd.as_raw_fd(), &encode_control(&Control::Ready), &[]).unwrap();
        }
        set_rcvtimeo(fd.as_raw_fd(), Duration::from_millis(50));
        let fd = Arc::new(fd);
        let frames = Arc::new(Mutex::new(Vec::new()));
        let bad_frames = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (fd, frames, bad, stop) = (fd.clone(), frames.clone(), bad_frames.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 70_000];
                let record = |rec: &[u8]| match decode_frame(rec) {
                    Ok((meta, payload)) => frames.lock().unwrap().push(Frame {
                        meta,
                        len: payload.len(),
                        head: payload[..payload.len().min(64)].to_vec(),
                    }),
                    Err(_) => {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    if !read {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    if !rings.is_empty() {
                        // Rings first; then the connection without waiting; then the
                        // sleep protocol: flag, re-check, wait on the eventfds (and
                        // the connection) with a short timeout for `stop`.
                        let mut got = false;
                        for r in &rings {
                            while let Some(n) = r.pop(&mut buf).unwrap() {
                                record(&buf[..n]);
                                got = true;
                            }
                            r.awake();
                        }
                        // SAFETY: recv into a live buffer.
                        let n = unsafe {
                            libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                        };
                        if n == 0 {
                            return;
                        }
                        if n > 0 {
                            record(&buf[..n as usize]);
                            continue;
                        }
                        if got || !rings.iter().all(|r| r.prepare_sleep()) {
                            continue;
                        }
                        let mut pfds: Vec<libc::pollfd> = rings
                            .iter()
                            .map(|r| libc::pollfd { fd: r.eventfd(), events: libc::POLLIN, revents: 0 })
                            .chain([libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }])
                            .collect();
                        // SAFETY: poll(2) on live pollfds.
                        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 50) };
                        for r in &rings {
                            r.woke();
                        }
                        continue;
                    }
                    // SAFETY: recv into a live buffer.
                    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                    if n <= 0 {
                        if n == 0 {
                            return;
                        }
                        continue;
                    }
                    record(&buf[..n as usize]);
                }
            })
        };
        Worker { server_id, fd, frames, bad_frames, sockets, socket_fds, fast, stop, thread: Some(thread) }
    }

    /// Every datagram waiting on the fast sockets now (their first bytes, up to 64).
    pub fn fast_datagrams(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        for (_, u) in &self.fast {
            while let Ok(n) = u.recv(&mut buf) {
                out.push(buf[..n.min(64)].to_vec());
            }
        }
        out
    }

    pub fn send(&self, m: &Control) {
        send_record(self.fd.as_raw_fd(), &encode_control(m), &[]).unwrap();
    }

    pub fn frames(&self) -> Vec<Frame> {
        self.frames.lock().unwrap().clone()
    }

    /// Datagrams received (a train counts its segments).
    pub fn datagrams(&self) -> usize {
        self.frames.lock().unwrap().iter().map(Frame::segments).sum()
    }

    pub fn clear(&self) {
        self.frames.lock().unwrap().clear();
    }

    /// Closes the data connection (the server id becomes dead at once).
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // SAFETY: shutdown(2) on our own fd; wakes the reader, peer sees EOF.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Waits until `f()` holds (bounded), panicking with `what` otherwise.
pub fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------
// Handcrafted QUIC datagrams (RFC 9000 §17)
// ---------------------------------------------------------------------------------

pub fn client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").unwrap()
}

/// A 1-RTT packet (RFC 9000 §17.3.1): 0b01 form/fixed bits, 12-byte DCID, `len` bytes.
pub fn short(dcid: &[u8; 12], len: usize, rng: &mut Rng) -> Vec<u8> {
    let mut p = rng.bytes(len.max(33));
    p[0] = 0x40 | (p[0] & 0x3f);
    p[1..13].copy_from_slice(dcid);
    p
}

/// Long header type bits for QUIC v1 (RFC 9000 Table 5).
pub const INITIAL: u8 = 0;
pub const ZERO_RTT: u8 = 1;
pub const HANDSHAKE: u8 = 2;

/// A v1 long-header packet of `total` bytes (RFC 9000 §17.2) with a Length that
/// covers the rest of the datagram.
pub fn long(ty: u8, dcid: &[u8], total: usize, rng: &mut Rng) -> Vec<u8> {
    let mut p = vec![0xc0 | (ty << 4) | 0x03];
    p.extend_from_slice(&1u32.to_be_bytes());
    p.push(dcid.len() as u8);
    p.extend_from_slice(dcid);
    p.push(8);
    p.extend_from_slice(&rng.bytes(8));
    if ty == INITIAL {
        p.push(0); // token length
    }
    let rest = total.saturating_sub(p.len() + 2).max(24);
    p.extend_from_slice(&(0x4000u16 | rest as u16).to_be_bytes());
    p.extend_from_slice(&rng.bytes(rest));
    p
}

pub fn initial(dcid: &[u8], rng: &mut Rng) -> Vec<u8> {
    long(INITIAL, dcid, 1200, rng)
}

/// Installs (in the child, before exec) a seccomp filter that makes io_uring_setup
/// fail with EPERM and allows everything else (seccomp(2), SECCOMP_SET_MODE_FILTER).
pub fn deny_io_uring_in_child(cmd: &mut Command) {
    deny_syscalls_in_child(cmd, &[libc::SYS_io_uring_setup]);
}

/// Installs (in the child, before exec) a seccomp filter that fails each syscall in
/// `denied` with EPERM and allows everything else.
pub fn deny_syscalls_in_child(cmd: &mut Command, denied: &[libc::c_long]) {
    use std::os::unix::process::CommandExt;
    // struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }
    let mut filter = vec![libc::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0 }]; // ld [nr]
    for &nr in denied {
        filter.push(libc::sock_filter { code: 0x15, jt: 0, jf: 1, k: nr as u32 }); // jeq nr
        filter.push(libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x0005_0000 | libc::EPERM as u32 });
        // ret ERRNO
    }
    filter.push(libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 }); // ret ALLOW
                                                                                 // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
                                                                                 // syscalls (prctl) on data prepared before the fork (`filter` is moved in).
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
