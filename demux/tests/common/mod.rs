//! Test harness: the real `demux` binary on loopback, test workers speaking the
//! data-connection protocol (docs/architecture.md), a UDP client with handcrafted
//! QUIC datagrams, and the status JSON from the control socket.
#![allow(dead_code, unused_imports)]

use proto::keyfile::KeyFile;
use proto::wire::data::{CAP_FAST_PATH, CAP_RINGS};
use proto::wire::frame::{self, FrameMeta};
use proto::wire::{Admin, Data, Message};
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

/// Runs `$body(io)` once per backend: `mod $name { fn uring(), fn mmsg() }`; with
/// `rings`, also both backends with `--forward ring` (test workers read rings).
#[macro_export]
macro_rules! both_backends {
    ($name:ident) => {
        $crate::backend_tests!($name; uring = "uring", mmsg = "mmsg");
    };
    ($name:ident, rings) => {
        $crate::backend_tests!($name; uring = "uring", mmsg = "mmsg", uring_ring = "uring+ring", mmsg_ring = "mmsg+ring");
    };
}

/// `mod $name { #[test] fn $test() { super::$name($io) } … }`.
#[macro_export]
macro_rules! backend_tests {
    ($name:ident; $($test:ident = $io:literal),*) => {
        mod $name {
            $(
                #[test]
                fn $test() {
                    super::$name($io)
                }
            )*
        }
    };
}

pub use testkit::packets::{initial, long, short, HANDSHAKE, INITIAL, ZERO_RTT};
pub use testkit::{temp_dir, Rng};

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
        Self::start_full(None, "127.0.0.1:0", io, cores, extra, denied)
    }

    /// As [`Demux::start_with`], inside network namespace `netns` (`ip netns exec`),
    /// listening on `listen`.
    pub fn start_in_netns(netns: &str, listen: &str, io: &str, cores: &str, extra: &[&str]) -> Demux {
        Self::start_full(Some(netns), listen, io, cores, extra, &[])
    }

    fn start_full(
        netns: Option<&str>,
        listen: &str,
        io: &str,
        cores: &str,
        extra: &[&str],
        denied: &[libc::c_long],
    ) -> Demux {
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
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, BIN]);
                c
            }
            None => Command::new(BIN),
        };
        if !denied.is_empty() {
            deny_syscalls_in_child(&mut cmd, denied);
        }
        cmd.args(["dataplane", "--listen", listen, "--cores", cores, "--io", io]);
        let mut child = testkit::bin::dataplane_files(&mut cmd, &keys_path, &data, &control, &ready)
            .args(forward)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let log = dir.join("demux.log");
        let text = testkit::bin::wait_ready_file(&ready, &mut child, &log, "demux", Duration::from_secs(20));
        let udp = testkit::bin::ready_udp_addrs(&text);
        Demux { child, dir, udp, data, control, keys, io: io.to_string(), rings }
    }

    pub fn addr(&self) -> SocketAddr {
        self.udp[0]
    }

    pub fn key_set(&self) -> KeySet {
        self.keys.key_set().unwrap()
    }

    /// A fresh ADR 0001 CID for `server_id`.
    pub fn cid(&self, server_id: u16, rng: &mut Rng) -> [u8; 12] {
        let mut r = [0u8; 10];
        rng.fill(&mut r);
        self.key_set().encode(ServerId(server_id), &r)
    }

    pub fn status(&self) -> Value {
        match sys::control::request(&self.control, &[&Admin::StatusRequest]).expect("status").msg {
            Admin::Status { json } => serde_json::from_str(&json).unwrap(),
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
        testkit::bin::kill_and_reap(&mut self.child);
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
    sys::seqpacket::connect(path)
}

pub fn send_record(fd: RawFd, rec: &[u8], fds: &[RawFd]) -> io::Result<()> {
    sys::seqpacket::send_record_raw(fd, rec, fds, 0).map(drop)
}

/// One record plus any fds attached (SCM_RIGHTS).
pub fn recv_record(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let r = sys::seqpacket::recv_record_raw(fd, buf, 0)?;
    Ok((r.len, r.fds))
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
    /// Each segment's short-header DCID (bytes 1..13; fewer bytes for a shorter
    /// segment): one entry per datagram of a train.
    pub segment_dcids: Vec<Vec<u8>>,
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
        let caps = if d.rings { CAP_RINGS } else { 0 } | if fast_path { CAP_FAST_PATH } else { 0 };
        let announce = proto::wire::Announce { window: proto::wire::Window::OWN, caps };
        let hello = Data::DataHello { announce, server_id: ServerId(server_id) };
        send_record(fd.as_raw_fd(), &Message::to_record(&hello), &[]).unwrap();
        let mut buf = vec![0u8; 4096];
        let (n, _) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
        match Data::decode(&buf[..n]) {
            Ok(Data::Welcome { version, caps: theirs }) => {
                assert_eq!(version, proto::wire::PROTOCOL_VERSION, "worker {server_id}: negotiated version");
                assert_eq!(theirs, proto::wire::data::CAPS_KNOWN, "worker {server_id}: the data plane's capabilities");
            }
            other => panic!("worker {server_id}: expected Welcome, got {other:?}"),
        }
        let (n, socket_fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
        let sockets = match Data::decode(&buf[..n]) {
            Ok(Data::Sockets { addrs }) => addrs,
            other => panic!("worker {server_id}: expected Sockets, got {other:?}"),
        };
        let mut fast = Vec::new();
        if fast_path {
            let (n, fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
            let Ok(Data::FastSockets { addrs }) = Data::decode(&buf[..n]) else {
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
        {
            let (n, fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
            let Ok(Data::Rings { count, bytes }) = Data::decode(&buf[..n]) else {
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
            send_record(fd.as_raw_fd(), &Message::to_record(&Data::Ready), &[]).unwrap();
        }
        let _ = rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_millis(50)),
        );
        let fd = Arc::new(fd);
        let frames = Arc::new(Mutex::new(Vec::new()));
        let bad_frames = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (fd, frames, bad, stop) = (fd.clone(), frames.clone(), bad_frames.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 70_000];
                let record = |rec: &[u8]| match frame::decode(rec) {
                    Ok((meta, payload)) => frames.lock().unwrap().push(Frame {
                        meta,
                        len: payload.len(),
                        head: payload[..payload.len().min(64)].to_vec(),
                        segment_dcids: payload
                            .chunks(meta.segment_size.map_or(payload.len(), usize::from).max(1))
                            .map(|seg| seg.get(1..13.min(seg.len())).unwrap_or_default().to_vec())
                            .collect(),
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
    /// The data plane's sockets ask for UDP_GRO: a train arrives whole and is cut
    /// into its datagrams here.
    pub fn fast_datagrams(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        for (_, u) in &self.fast {
            while let Ok((segments, _)) = testkit::trains::recv_segments(u, &mut buf) {
                out.extend(segments.into_iter().map(|d| d[..d.len().min(64)].to_vec()));
            }
        }
        out
    }

    pub fn send(&self, m: &Data) {
        send_record(self.fd.as_raw_fd(), &Message::to_record(m), &[]).unwrap();
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

/// The inode a socket is listed by in /proc/net/udp.
pub fn socket_inode(s: &UdpSocket) -> u64 {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap();
    let link = link.to_string_lossy();
    link.strip_prefix("socket:[").and_then(|l| l.strip_suffix(']')).and_then(|i| i.parse().ok()).unwrap()
}

/// Whether the kernel still has the UDP socket `inode` (IPv4 or IPv6): it leaves the
/// table, its reuseport group and any socket array when its last fd closes.
pub fn udp_socket_exists(inode: u64) -> bool {
    ["/proc/net/udp", "/proc/net/udp6"].iter().any(|p| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        demux::controller::ownership::parse_proc_net_udp(&text).iter().any(|s| s.inode == inode)
    })
}

/// Waits until `f()` holds (at most 20 s: `testkit::wait_until`), panicking with
/// `what` otherwise.
pub fn wait_for(what: &str, f: impl Fn() -> bool) {
    testkit::wait_until(what, Duration::from_secs(20), || f().then_some(()));
}

// ---------------------------------------------------------------------------------
// Handcrafted QUIC datagrams (RFC 9000 §17)
// ---------------------------------------------------------------------------------

pub fn client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").unwrap()
}

/// Starts the data plane with `args` (plus a fresh key file and data socket) under
/// a seccomp filter failing `denied` with EPERM, expecting it to refuse to start:
/// checks exit code 1 and no panic, and returns its stderr.
pub fn refused_start(tag: &str, denied: &[libc::c_long], args: &[&str]) -> String {
    let dir = temp_dir(tag);
    let keys = dir.join("keys");
    assert!(Command::new(BIN).args(["gen-keys", "--out"]).arg(&keys).status().unwrap().success());
    let mut cmd = Command::new(BIN);
    deny_syscalls_in_child(&mut cmd, denied);
    let out = cmd.args(args).arg("--keys").arg(&keys).arg("--data-socket").arg(dir.join("d.sock")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    err
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
