//! Forwarding over shared-memory rings, the default (`--forward ring`, docs/wire.md
//! "Ring"): a worker that writes garbage into its rings harms nobody but itself; a
//! worker that does not ask keeps SEQPACKET; after a data-plane restart the rings are
//! offered again and the workers take them (controller, real `worker` processes,
//! `--fast-path off`, so every datagram takes the user path).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;
#[path = "controller_support/mod.rs"]
mod support;

use common::*;
use proto::ring::{OFF_HEAD, OFF_TAIL};
use proto::wire::data::CAP_RINGS;
use proto::wire::{Data, Message};
use proto::ServerId;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// user + system CPU time of `pid` so far (clock ticks, /proc/PID/stat fields 14, 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// docs/wire.md "Ring": a record is a 4-byte length word, the 48-byte data-frame
/// header and the payload, padded to 8 bytes; a record that does not fit before the
/// end of the data area goes to offset 0, the bytes before the end skipped.
const RECORD_OF_1200: u64 = (4 + 48 + 1200u64).next_multiple_of(8);

/// The tail a producer publishes after `n` records of 1200-byte datagrams from `tail`
/// into a ring of `capacity` data bytes that is never full: the layout above, written
/// out (it shares no code with `proto::ring`, the code under test).
fn tail_after_pushes(capacity: u64, mut tail: u64, n: usize) -> u64 {
    for _ in 0..n {
        let to_end = capacity - tail % capacity;
        if RECORD_OF_1200 > to_end {
            tail += to_end;
        }
        tail += RECORD_OF_1200;
    }
    tail
}

fn forward_of(s: &serde_json::Value, id: u16) -> String {
    instance(s, id)["forward"].as_str().unwrap_or_default().to_string()
}

/// A worker that maps its ring and writes garbage into it. First it consumes like an
/// honest worker (head = the published tail) across several wrap-arounds of a
/// 128 KiB ring; then it writes heads that make no sense (ahead of the tail, more than
/// the capacity behind it, unaligned, huge) and garbage tails, keeps the *sleeping*
/// flag at 1, fills the data area with 0xff (huge length words), and tries to shrink
/// the memfd (refused: its size is sealed, so the data plane can never fault on it).
/// The data plane counts every datagram for it as `drops_full`, never writes out of
/// bounds or panics, does not spin (its CPU time stays that of an idle process), and
/// keeps serving an honest worker on rings meanwhile; once the hostile worker writes
/// a sane head again its datagrams are forwarded again, from the tail the data plane
/// kept itself (it never reads the shared tail back).
fn hostile_consumer_only_loses_its_own_datagrams(io: &str) {
    let d = Demux::start_with(io, "0", &["--ring-bytes", "131072"]);
    assert!(d.rings, "a ring test");
    let honest = Worker::connect(&d, 1, true);
    // The hostile worker's own handshake: DataHello { CAP_RINGS } → Welcome, Sockets, Rings.
    let fd = seqpacket_connect(&d.data).unwrap();
    let announce = proto::wire::Announce { window: proto::wire::Window::OWN, caps: CAP_RINGS };
    let hello = Data::DataHello { announce, server_id: ServerId(2) };
    send_record(fd.as_raw_fd(), &hello.to_record(), &[]).unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
    assert!(matches!(Data::decode(&buf[..n]), Ok(Data::Welcome { .. })));
    let (n, _udp) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
    assert!(matches!(Data::decode(&buf[..n]), Ok(Data::Sockets { .. })));
    let (n, fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
    let Ok(Data::Rings { count: 1, bytes: 131072 }) = Data::decode(&buf[..n]) else {
        panic!("one 128 KiB ring (one shard)")
    };
    let bytes = 131072u64;
    let memfd = fds.into_iter().next().unwrap();
    let map = sys::ring::Mapping::open(memfd.as_fd(), bytes).unwrap();
    send_record(fd.as_raw_fd(), &Data::Ready.to_record(), &[]).unwrap();
    d.wait_instances(&[(1, true), (2, true)]);
    let s = d.status();
    assert_eq!((forward_of(&s, 1), forward_of(&s, 2)), ("ring".into(), "ring".into()));

    let mut rng = Rng(7);
    let c = client();
    let (cid1, cid2) = (d.cid(1, &mut rng), d.cid(2, &mut rng));
    let mut sent = 0u64;
    // 50 datagrams to each worker; the honest one gets all of its own.
    let batch = |rng: &mut Rng, sent: &mut u64| {
        for _ in 0..50 {
            c.send_to(&short(&cid2, 1200, rng), d.addr()).unwrap();
            c.send_to(&short(&cid1, 1200, rng), d.addr()).unwrap();
        }
        *sent += 50;
        let want = *sent;
        wait_for("the honest worker served", || honest.datagrams() as u64 == want);
        want
    };
    // Honest consumption first: 6 × 50 records of 1256 bytes wrap the ring twice.
    for _ in 0..6 {
        let want = batch(&mut rng, &mut sent);
        d.wait_status("forwarded to the ring", |s| u64_at(instance(s, 2), "/datagrams") == want);
        map.word(OFF_HEAD).store(map.word(OFF_TAIL).load(Ordering::Acquire), Ordering::Release);
    }
    let tail = map.word(OFF_TAIL).load(Ordering::Acquire);
    // 1256-byte records: 104 fit in 128 KiB (130 624 bytes), then 448 bytes are
    // skipped; two laps and 92 records: 2 × 131 072 + 92 × 1256.
    assert_eq!(RECORD_OF_1200, 1256);
    assert_eq!(tail_after_pushes(bytes, 0, 300), 2 * 131_072 + 92 * 1256);
    assert_eq!(tail, 377_696, "300 records of 1256 bytes, two skips, no drop");
    assert!(tail > 2 * bytes, "wrapped around");

    // SAFETY: ftruncate(2) on a memfd we hold; it must fail (F_SEAL_SHRINK / F_SEAL_GROW).
    let shrunk = unsafe { libc::ftruncate(memfd.as_raw_fd(), 0) };
    assert_eq!((shrunk, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EPERM)), "size sealed");
    let garbage = [(tail + 8, 3), (tail - bytes - 8, u64::MAX), (tail - 4, bytes - 1), (u64::MAX - 7, 12345)];
    for (round, (head, bad_tail)) in garbage.into_iter().enumerate() {
        map.write(0, &vec![0xff; bytes as usize]);
        map.sleeping().store(1, Ordering::Relaxed);
        map.word(OFF_HEAD).store(head, Ordering::Relaxed);
        map.word(OFF_TAIL).store(bad_tail, Ordering::Relaxed);
        batch(&mut rng, &mut sent);
        let want = 50 * (round as u64 + 1);
        let s =
            d.wait_status("the hostile worker's datagrams dropped", |s| u64_at(instance(s, 2), "/drops_full") == want);
        assert_eq!(u64_at(instance(&s, 2), "/datagrams"), 300, "round {round}: nothing more forwarded to it");
        assert_eq!((u64_at(instance(&s, 1), "/datagrams"), u64_at(instance(&s, 1), "/drops_full")), (sent, 0));
    }
    assert_eq!(honest.bad_frames.load(Ordering::Relaxed), 0);
    // No busy loop: idle for a second with the garbage in place, the data plane uses
    // a small fraction of a core (a spinning shard would use all of it: 100 ticks).
    let pid = d.child.id();
    let before = cpu_ticks(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - before;
    assert!(used < 30, "{used} ticks of CPU in {:?} while idle", t0.elapsed());
    // A sane head again: forwarded again, from the data plane's own tail.
    map.word(OFF_HEAD).store(tail, Ordering::Release);
    for _ in 0..10 {
        c.send_to(&short(&cid2, 1200, &mut rng), d.addr()).unwrap();
    }
    let s = d.wait_status("the hostile worker served again", |s| u64_at(instance(s, 2), "/datagrams") == 310);
    assert_eq!(u64_at(instance(&s, 2), "/drops_full"), 200);
    let tail_after = map.word(OFF_TAIL).load(Ordering::Acquire);
    // From 377 696 (offset 115 552 of the third lap) ten more records fit before the
    // end: no skip.
    assert_eq!(tail_after_pushes(bytes, tail, 10), tail + 10 * 1256);
    assert_eq!(tail_after, tail + 10 * 1256, "published from its own tail {tail}");
    assert_eq!(u64_at(&s, "/sendmmsg_calls"), 0, "both workers on rings: no SEQPACKET frame");
    let mut d = d;
    assert!(d.alive(), "the data plane survived: {}", d.log());
    assert!(!d.log().contains("panicked"), "{}", d.log());
}
backend_tests!(hostile_consumer_only_loses_its_own_datagrams; uring = "uring+ring", mmsg = "mmsg+ring");

/// The default data plane (`--forward ring`) with a worker that does not ask for
/// rings: it stays on SEQPACKET (status says so) and gets its datagrams there.
#[test]
fn a_worker_that_does_not_ask_keeps_seqpacket() {
    let d = Demux::start("mmsg", "0");
    let w = Worker::connect(&d, 3, true); // no CAP_RINGS: `d.rings` is false
    d.wait_instances(&[(3, true)]);
    assert_eq!(forward_of(&d.status(), 3), "seqpacket");
    let mut rng = Rng(3);
    let c = client();
    for _ in 0..20 {
        c.send_to(&short(&d.cid(3, &mut rng), 300, &mut rng), d.addr()).unwrap();
    }
    wait_for("20 frames on the data connection", || w.datagrams() == 20);
    let s = d.wait_status("counted", |s| u64_at(instance(s, 3), "/datagrams") == 20);
    assert_eq!(u64_at(&s, "/ring_wakes"), 0, "no ring involved");
}

/// Controller, two `worker` processes on the defaults (rings), `--fast-path off`:
/// both instances are on rings; a paced download runs across a data-plane SIGKILL;
/// the restarted data plane offers rings again, both workers take them (status:
/// `forward: ring`), the download finishes, and new connections' traffic flows over
/// the new rings (the instance counters grow; with the fast path off nothing else
/// carries it).
#[test]
fn after_a_dataplane_restart_the_workers_are_on_rings_again() {
    use support::*;
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("ringrestart", 2, &["--fast-path", "off"]);
    let addr = c.addr();
    let on_rings = |c: &Controller| {
        let lb = c.lb()?;
        let inst = lb["instances"].as_array()?;
        (inst.len() == 2 && inst.iter().all(|i| i["forward"] == "ring" && i["placeable"] == true)).then_some(lb)
    };
    wait_until("both instances on rings", Duration::from_secs(30), || on_rings(&c));
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let size = 2 << 20;
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    let id = rt.block_on(h.get("/bytes/10")).expect("GET").server_id;
    let download = rt.spawn(async move {
        let r = h.get_paced(&format!("/bytes/{size}"), Some(1 << 20)).await;
        h.close();
        r
    });
    std::thread::sleep(Duration::from_millis(700));
    let dp = c.dataplane_pid();
    kill(dp, libc::SIGKILL);
    wait_until("the data plane restarted", Duration::from_secs(30), || {
        let s = c.status()?;
        let pid = s["dataplane"]["pid"].as_i64()?;
        (pid != dp && s["dataplane"]["state"] == "running").then_some(())
    });
    wait_until("both instances on rings again", Duration::from_secs(30), || on_rings(&c));
    let r = rt.block_on(download).expect("join").unwrap_or_else(|e| panic!("download failed: {e:?}{}", c.logs()));
    assert_eq!((r.status, r.len, r.pattern_ok, r.server_id), (200, size, true, id));
    let before: u64 = c.instances().iter().map(|i| i.2).sum();
    for _ in 0..4 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect after the restart");
        let r = rt.block_on(h.get("/bytes/300000")).expect("GET after the restart");
        assert_eq!((r.status, r.len, r.pattern_ok), (200, 300_000, true));
        h.close();
    }
    let lb = c.lb_wait();
    let after: u64 = c.instances().iter().map(|i| i.2).sum();
    assert!(after > before, "the new connections' datagrams were forwarded ({before} → {after})");
    assert!(lb["instances"].as_array().unwrap().iter().all(|i| i["forward"] == "ring"), "{lb}");
    assert_eq!(lb["sendmmsg_calls"], 0, "no frame went over SEQPACKET: {lb}");
    assert_eq!(lb["drops"]["send_error"], 0, "{lb}");
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}
