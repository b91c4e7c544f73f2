//! Out-of-process tests of the data plane: the real binary on loopback,
//! test workers on the data socket, handcrafted QUIC datagrams. Every test runs for
//! both io backends (`<test>::uring`, `<test>::mmsg`); the key ones also with
//! `--forward ring` (`<test>::uring_ring`, `<test>::mmsg_ring`).
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;
use common::*;
use proto::wire::{Admin, Data, Message};
use std::time::{Duration, Instant};

/// A short header for a live server id reaches its owner; after the client's source
/// port changes (NAT rebinding) it still does (ADR 0001 routing rule 1).
fn short_header_reaches_owner(io: &str) {
    let d = Demux::start(io, "0-1");
    let mut rng = Rng(1);
    let w1 = Worker::connect(&d, 11, true);
    let w2 = Worker::connect(&d, 12, true);
    assert_eq!(w1.sockets, d.udp, "Sockets lists the listen addresses");
    assert_eq!(w1.socket_fds.len(), 1, "one UDP fd per listen address");
    d.wait_instances(&[(11, true), (12, true)]);
    let cid = d.cid(12, &mut rng);
    let c1 = client();
    c1.send_to(&short(&cid, 100, &mut rng), d.addr()).unwrap();
    wait_for("first frame at owner", || w2.datagrams() == 1);
    let c2 = client(); // a new source port
    assert_ne!(c1.local_addr().unwrap().port(), c2.local_addr().unwrap().port());
    c2.send_to(&short(&cid, 200, &mut rng), d.addr()).unwrap();
    wait_for("second frame at owner", || w2.datagrams() == 2);
    let f = w2.frames();
    assert_eq!(f[0].meta.client, c1.local_addr().unwrap());
    assert_eq!(f[1].meta.client, c2.local_addr().unwrap());
    assert_eq!(f[1].meta.local, Some(d.addr()), "IP_PKTINFO destination + listen port");
    assert_eq!(f[0].dcid(), cid.to_vec());
    assert_eq!((f[0].len, f[1].len), (100, 200));
    assert_eq!(w1.datagrams(), 0);
    // Instance counters are bumped right after sendmmsg returns: wait for them.
    let s = d.wait_status("instance counted", |s| u64_at(instance(s, 12), "/datagrams") == 2);
    assert_eq!(reason(&s, "Owner"), 2);
    assert_eq!(u64_at(instance(&s, 12), "/datagrams"), 2);
    assert_eq!(u64_at(instance(&s, 12), "/bytes"), 300);
}
both_backends!(short_header_reaches_owner, rings);

/// Initials with random client DCIDs spread over 3 instances; the 2nd and 3rd Initial
/// of one DCID and its 0-RTT reach the same instance (pin table, ADR 0001).
fn initials_spread_and_stick(io: &str) {
    // One source places hundreds of connections at once: per-source limits off here
    // (demux/tests/flood.rs tests them).
    let d = Demux::start_with(io, "0", &["--limits", "off"]);
    let mut rng = Rng(2);
    let ws: Vec<Worker> = [21u16, 22, 23].iter().map(|&id| Worker::connect(&d, id, true)).collect();
    d.wait_instances(&[(21, true), (22, true), (23, true)]);
    let c = client();
    let n = 60;
    let dcids: Vec<Vec<u8>> = (0..n).map(|_| rng.bytes(8)).collect();
    for dcid in &dcids {
        c.send_to(&initial(dcid, &mut rng), d.addr()).unwrap();
    }
    wait_for("all first Initials", || ws.iter().map(Worker::datagrams).sum::<usize>() == n);
    for w in &ws {
        assert!(w.datagrams() > 0, "instance {} got no Initial of {n}", w.server_id);
    }
    // Where did each DCID go?
    let owner_of = |dcid: &[u8]| -> Vec<u16> {
        ws.iter().filter(|w| w.frames().iter().any(|f| f.dcid() == dcid)).map(|w| w.server_id).collect()
    };
    let firsts: Vec<u16> = dcids
        .iter()
        .take(10)
        .map(|d| {
            let o = owner_of(d);
            assert_eq!(o.len(), 1);
            o[0]
        })
        .collect();
    for w in &ws {
        w.clear();
    }
    // Second and third Initials, then a 0-RTT packet, for 10 of the DCIDs.
    for dcid in dcids.iter().take(10) {
        c.send_to(&initial(dcid, &mut rng), d.addr()).unwrap();
        c.send_to(&initial(dcid, &mut rng), d.addr()).unwrap();
        c.send_to(&long(ZERO_RTT, dcid, 300, &mut rng), d.addr()).unwrap();
    }
    wait_for("follow-ups", || ws.iter().map(Worker::datagrams).sum::<usize>() == 30);
    for (dcid, first) in dcids.iter().take(10).zip(&firsts) {
        assert_eq!(owner_of(dcid), vec![*first], "every follow-up of a DCID at its first instance");
        let w = ws.iter().find(|w| w.server_id == *first).unwrap();
        assert_eq!(w.frames().iter().filter(|f| f.dcid() == *dcid).count(), 3);
    }
    let s = d.status();
    assert_eq!(reason(&s, "Placed"), n as u64);
    assert_eq!(reason(&s, "Pinned"), 30);
}
both_backends!(initials_spread_and_stick, rings);

/// A datagram for a server id that is not live (`Departed`) reaches a serving
/// instance; after a worker disconnects, its id is dead at once and its datagrams are
/// `Departed` too. One whose DCID does not decode is an `Orphan`, and goes there too.
fn orphan_reaches_serving_instance(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(3);
    let w1 = Worker::connect(&d, 31, true);
    let w2 = Worker::connect(&d, 32, true);
    d.wait_instances(&[(31, true), (32, true)]);
    let c = client();
    c.send_to(&short(&d.cid(999, &mut rng), 80, &mut rng), d.addr()).unwrap();
    wait_for("orphan delivered", || w1.datagrams() + w2.datagrams() == 1);
    assert_eq!((reason(&d.status(), "Departed"), reason(&d.status(), "Orphan")), (1, 0));
    let mut undecodable = short(&d.cid(31, &mut rng), 80, &mut rng);
    undecodable[1] |= 0xc0; // cr = 3 (ADR 0001)
    c.send_to(&undecodable, d.addr()).unwrap();
    wait_for("undecodable delivered", || w1.datagrams() + w2.datagrams() == 2);
    assert_eq!((reason(&d.status(), "Departed"), reason(&d.status(), "Orphan")), (1, 1));
    // Kill 32: its CIDs now go to 31 as Departed.
    let cid32 = d.cid(32, &mut rng);
    w2.close();
    d.wait_instances(&[(31, true)]);
    w1.clear();
    c.send_to(&short(&cid32, 80, &mut rng), d.addr()).unwrap();
    wait_for("orphan of dead id delivered", || w1.datagrams() == 1);
    assert_eq!(w1.frames()[0].dcid(), cid32.to_vec());
    assert_eq!((reason(&d.status(), "Departed"), reason(&d.status(), "Orphan")), (2, 1));
}
both_backends!(orphan_reaches_serving_instance, rings);

/// `--rejoin-grace-ms` (what the controller gives a restarted data plane): until it
/// has passed, a short header whose DCID decodes to an id that is not live (yet) is
/// held, dropped and counted `held_for_rejoin`, not handed to a serving instance for a
/// stateless reset; one whose DCID does not decode (cr = 3) is an Orphan as always;
/// after the grace the not-live id's datagrams are `Departed`, and handed over.
fn departed_ids_are_held_while_instances_rejoin(io: &str) {
    let grace = Duration::from_secs(4);
    let t0 = Instant::now();
    let d = Demux::start_with(io, "0", &["--rejoin-grace-ms", &grace.as_millis().to_string()]);
    // The grace runs from the data plane's clock origin, which lies between `t0` (the
    // spawn) and its ready file: "within" is checked against `t0`, "after" against
    // `ready`, whatever the start-up takes (loading the eBPF program, say).
    let ready = Instant::now();
    let mut rng = Rng(4);
    let w = Worker::connect(&d, 72, true);
    d.wait_instances(&[(72, true)]);
    let c = client();
    for _ in 0..10 {
        c.send_to(&short(&d.cid(71, &mut rng), 80, &mut rng), d.addr()).unwrap();
    }
    let mut unroutable = short(&d.cid(71, &mut rng), 80, &mut rng);
    unroutable[1] |= 0xc0; // cr = 3 (ADR 0001)
    c.send_to(&unroutable, d.addr()).unwrap();
    wait_for("the undecodable one, as an Orphan", || w.datagrams() == 1);
    wait_for("the 10 of id 71 held", || u64_at(&d.status(), "/held_for_rejoin") == 10);
    assert!(t0.elapsed() < grace, "sent within the grace (the test took too long to tell)");
    assert_eq!(w.frames()[0].dcid(), unroutable[1..13].to_vec());
    assert_eq!((reason(&d.status(), "Orphan"), reason(&d.status(), "Departed")), (1, 0));
    std::thread::sleep((ready + grace + Duration::from_millis(100)).saturating_duration_since(Instant::now()));
    for _ in 0..5 {
        c.send_to(&short(&d.cid(71, &mut rng), 80, &mut rng), d.addr()).unwrap();
    }
    wait_for("after the grace, handed over", || w.datagrams() == 6);
    let s = d.status();
    assert_eq!((reason(&s, "Orphan"), reason(&s, "Departed"), u64_at(&s, "/held_for_rejoin")), (1, 5, 10));
}
both_backends!(departed_ids_are_held_while_instances_rejoin);

/// Under a controller (`--registrations`) a restarted data plane holds only the
/// datagrams of ids it waits for: registered by a process that still runs, and not
/// live yet. An id whose registering process is gone, or one nobody registered, is
/// `Departed` at once, inside the grace, so its clients get their stateless resets;
/// so is an awaited id once its process exits.
fn only_registered_running_ids_are_held(io: &str) {
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let dead_pid = {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    let me = std::process::id();
    let mut sleeper = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let reg = std::env::temp_dir().join(format!("qd-registrations-{io}-{me}"));
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&reg);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&reg).unwrap();
        write!(f, "71 {me}\n72 {me}\n73 {dead_pid}\n75 {}\n", sleeper.id()).unwrap();
    }
    let grace_ms = grace.as_millis().to_string();
    let d = Demux::start_with(io, "0", &["--rejoin-grace-ms", &grace_ms, "--registrations", reg.to_str().unwrap()]);
    let mut rng = Rng(5);
    let w = Worker::connect(&d, 72, true);
    d.wait_instances(&[(72, true)]);
    let c = client();
    for _ in 0..10 {
        c.send_to(&short(&d.cid(71, &mut rng), 80, &mut rng), d.addr()).unwrap();
    }
    wait_for("the 10 of id 71 held", || u64_at(&d.status(), "/held_for_rejoin") == 10);
    for id in [73, 74] {
        for _ in 0..5 {
            c.send_to(&short(&d.cid(id, &mut rng), 80, &mut rng), d.addr()).unwrap();
        }
    }
    wait_for("73's and 74's handed over", || w.datagrams() == 10);
    let s = d.status();
    assert_eq!((reason(&s, "Departed"), u64_at(&s, "/held_for_rejoin")), (10, 10));
    let keys = d.key_set();
    let mut ids: Vec<u16> = w.frames().iter().map(|f| keys.decode(&f.dcid()).unwrap().server_id.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, [[73u16; 5], [74; 5]].concat());
    // 75's process runs: held; once it exits, handed over (the registry looks again
    // every liveness tick while it waits).
    for _ in 0..4 {
        c.send_to(&short(&d.cid(75, &mut rng), 80, &mut rng), d.addr()).unwrap();
    }
    wait_for("the 4 of id 75 held", || u64_at(&d.status(), "/held_for_rejoin") == 14);
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let probe = short(&d.cid(75, &mut rng), 80, &mut rng);
    wait_for("75 handed over once its process is gone", || {
        c.send_to(&probe, d.addr()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        w.datagrams() > 10
    });
    let s = d.status();
    assert!(u64_at(&s, "/held_for_rejoin") >= 14);
    assert!(reason(&s, "Departed") > 10);
    assert!(t0.elapsed() < grace, "all inside the grace (the test took too long to tell)");
    let _ = std::fs::remove_file(&reg);
}
both_backends!(only_registered_running_ids_are_held);

/// Non-QUIC datagrams are dropped and counted under NotQuic; nothing reaches workers.
fn non_quic_dropped_and_counted(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(4);
    let w = Worker::connect(&d, 41, true);
    d.wait_instances(&[(41, true)]);
    let c = client();
    let cid = d.cid(41, &mut rng);
    let mut fixed_clear = short(&cid, 60, &mut rng);
    fixed_clear[0] &= !0x40; // RFC 9000 §17.3.1: fixed bit must be 1
    let junk: Vec<Vec<u8>> = vec![
        b"hello".to_vec(),
        fixed_clear,
        short(&cid, 60, &mut rng)[..20].to_vec(), // too short for a header-protection sample
        long(INITIAL, &rng.bytes(8), 600, &mut rng), // Initial below 1200 bytes (RFC 9000 §14.1)
        vec![0u8; 0],
    ];
    for j in &junk {
        c.send_to(j, d.addr()).unwrap();
    }
    let s = d.wait_status("junk counted", |s| u64_at(s, "/datagrams_in") == junk.len() as u64);
    assert_eq!(reason(&s, "NotQuic"), junk.len() as u64);
    assert_eq!(reasons_sum(&s), junk.len() as u64);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(w.datagrams(), 0);
    // And with no instance at all, routable datagrams count as NoInstance drops.
    w.close();
    d.wait_instances(&[]);
    c.send_to(&initial(&rng.bytes(8), &mut rng), d.addr()).unwrap();
    let s = d.wait_status("no instance", |s| reason(s, "NoInstance") == 1);
    assert_eq!(u64_at(&s, "/drops/no_instance"), 1);
}
both_backends!(non_quic_dropped_and_counted);

/// A GRO train sent with UDP_SEGMENT (8 × 1200 bytes, one DCID) reaches one worker
/// as ONE frame carrying segment_size 1200.
fn gro_train_is_one_frame(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(5);
    let w = Worker::connect(&d, 51, true);
    d.wait_instances(&[(51, true)]);
    let cid = d.cid(51, &mut rng);
    let mut train = Vec::new();
    for _ in 0..8 {
        train.extend_from_slice(&short(&cid, 1200, &mut rng));
    }
    let c = client();
    use std::os::fd::AsRawFd;
    let seg: libc::c_int = 1200;
    // SAFETY: udp(7) UDP_SEGMENT with a live c_int.
    let r = unsafe {
        libc::setsockopt(c.as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, (&seg as *const libc::c_int).cast(), 4)
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
    c.send_to(&train, d.addr()).unwrap();
    wait_for("train delivered", || w.datagrams() == 8);
    let f = w.frames();
    assert_eq!(f.len(), 1, "one frame for the whole train: {f:?}");
    assert_eq!(f[0].meta.segment_size, Some(1200));
    assert_eq!(f[0].len, 9600);
    let s = d.status();
    assert_eq!(u64_at(&s, "/trains_in"), 1);
    assert_eq!(reason(&s, "Owner"), 8);
    assert_eq!(u64_at(&s, "/datagrams_in"), 8);

    // A train whose segments route to different places is split into runs: segments
    // 0-3 for 51, 4-5 not QUIC (dropped), 6-7 for 52 (one frame each, with the stride;
    // a run of one segment is a plain datagram).
    let w2 = Worker::connect(&d, 52, true);
    d.wait_instances(&[(51, true), (52, true)]);
    w.clear();
    let cid2 = d.cid(52, &mut rng);
    let mut mixed = Vec::new();
    for k in 0..8 {
        let mut p = short(if k < 4 { &cid } else { &cid2 }, 1200, &mut rng);
        if k == 4 || k == 5 {
            p[0] &= !0x40; // fixed bit clear: not QUIC
        }
        mixed.extend_from_slice(&p);
    }
    mixed.extend_from_slice(&short(&cid2, 500, &mut rng)); // a shorter last segment
    c.send_to(&mixed, d.addr()).unwrap();
    wait_for("mixed train delivered", || w.datagrams() == 4 && w2.datagrams() == 3);
    let (f1, f2) = (w.frames(), w2.frames());
    assert_eq!(f1.len(), 1);
    assert_eq!((f1[0].meta.segment_size, f1[0].len), (Some(1200), 4800));
    assert_eq!(f2.len(), 1);
    assert_eq!((f2[0].meta.segment_size, f2[0].len), (Some(1200), 2900));
    assert_eq!(f2[0].dcid(), cid2.to_vec());
    let s = d.wait_status("mixed train counted", |s| u64_at(s, "/datagrams_in") == 17);
    assert_eq!(u64_at(&s, "/trains_in"), 2);
    assert_eq!(reason(&s, "Owner"), 8 + 7);
    assert_eq!(reason(&s, "NotQuic"), 2);
}
both_backends!(gro_train_is_one_frame, rings);

/// Below saturation every datagram received is forwarded: 5000 paced datagrams to two
/// instances, counted at the workers and in status, exactly.
fn below_saturation_in_equals_forwarded(io: &str) {
    let d = Demux::start(io, "0-1");
    let mut rng = Rng(6);
    let w1 = Worker::connect(&d, 61, true);
    let w2 = Worker::connect(&d, 62, true);
    d.wait_instances(&[(61, true), (62, true)]);
    let cids = [d.cid(61, &mut rng), d.cid(62, &mut rng)];
    let clients: Vec<_> = (0..4).map(|_| client()).collect();
    let total = 5000;
    for k in 0..total {
        let p = short(&cids[k % 2], 200 + (k % 900), &mut rng);
        clients[k % 4].send_to(&p, d.addr()).unwrap();
        if k % 50 == 49 {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    wait_for("all forwarded", || w1.datagrams() + w2.datagrams() >= total);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(w1.datagrams(), total / 2);
    assert_eq!(w2.datagrams(), total / 2);
    let s = d.wait_status("instances counted", |s| {
        u64_at(instance(s, 61), "/datagrams") + u64_at(instance(s, 62), "/datagrams") == total as u64
    });
    assert_eq!(u64_at(&s, "/datagrams_in"), total as u64);
    assert_eq!(reason(&s, "Owner"), total as u64);
    assert_eq!(u64_at(instance(&s, 61), "/datagrams") + u64_at(instance(&s, 62), "/datagrams"), total as u64);
    assert_eq!(u64_at(&s, "/drops/full") + u64_at(&s, "/drops/truncated") + u64_at(&s, "/drops/send_error"), 0);
}
both_backends!(below_saturation_in_equals_forwarded, rings);

/// A burst is forwarded in batches: with the data plane stopped (SIGSTOP), 96
/// datagrams for one instance queue in its socket; resumed, it reads them in
/// batches of up to `--batch` (32) and forwards each batch's frames for that
/// instance with one sendmmsg, so `sendmmsg_calls` is at most a few against 96
/// forwarded. One sendmmsg per datagram would make them equal.
fn burst_is_forwarded_in_sendmmsg_batches(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(21);
    let w = Worker::connect(&d, 131, true);
    d.wait_instances(&[(131, true)]);
    let cid = d.cid(131, &mut rng);
    let before = d.status();
    let calls_before = u64_at(&before, "/sendmmsg_calls");
    let burst = 96;
    stop(&d);
    let c = client();
    for _ in 0..burst {
        c.send_to(&short(&cid, 200, &mut rng), d.addr()).unwrap();
    }
    resume(&d);
    wait_for("the burst forwarded", || w.datagrams() == burst);
    let s = d.wait_status("the burst counted", |s| u64_at(instance(s, 131), "/datagrams") == burst as u64);
    let calls = u64_at(&s, "/sendmmsg_calls") - calls_before;
    assert_eq!(u64_at(&s, "/drops/full") + u64_at(&s, "/drops/send_error"), 0, "{s}");
    assert!(calls >= 1 && calls * 8 <= burst as u64, "{calls} sendmmsg calls for {burst} datagrams: {s}");
}
both_backends!(burst_is_forwarded_in_sendmmsg_batches);

/// SIGSTOPs the data plane and waits until every thread of it has stopped: kill(2)
/// returns before they have, and a shard still running would read what the test
/// means to queue (state T in /proc/PID/task/TID/stat).
fn stop(d: &Demux) {
    let pid = d.child.id() as i32;
    // SAFETY: kill(2) on the data plane this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_for("every data-plane thread stopped", || {
        std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().all(|t| {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    });
}

fn resume(d: &Demux) {
    // SAFETY: kill(2) on the data plane this test started.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, libc::SIGCONT) }, 0);
}

/// A receive buffer goes back to the kernel as soon as its datagram is copied into a
/// ring, but one a queued SEQPACKET frame points into only after the flush
/// (crate::dataplane::buffer_stock). 600 datagrams queue while the data plane is
/// stopped, alternately for a worker on a ring and one on SEQPACKET, each numbered;
/// resumed, the shard takes them in rounds of ≈ 450 from 128 offered buffers, so the
/// kernel refills buffers mid-round. Each worker must get exactly its own numbers,
/// each once: a held buffer given back early would be overwritten by a later
/// datagram before its frame is sent (a repeated or foreign number).
fn buffers_pointed_into_are_not_reused_before_the_flush(io: &str) {
    let mut d = Demux::start(io, "0"); // `--forward ring`, the data plane's default
    let mut rng = Rng(22);
    let seq = Worker::connect(&d, 141, true); // asks for no rings: SEQPACKET
    d.rings = true;
    let ring = Worker::connect(&d, 142, true);
    d.wait_instances(&[(141, true), (142, true)]);
    let s = d.status();
    assert_eq!(
        (instance(&s, 141)["forward"].as_str(), instance(&s, 142)["forward"].as_str()),
        (Some("seqpacket"), Some("ring"))
    );
    let cids = [d.cid(141, &mut rng), d.cid(142, &mut rng)];
    let total = 600u64;
    stop(&d);
    let c = client();
    for n in 0..total {
        let mut p = short(&cids[(n % 2) as usize], 300, &mut rng);
        p[13..21].copy_from_slice(&n.to_be_bytes());
        c.send_to(&p, d.addr()).unwrap();
    }
    resume(&d);
    wait_for("the burst forwarded", || seq.datagrams() + ring.datagrams() >= total as usize);
    for (w, parity) in [(&seq, 0), (&ring, 1)] {
        let mut got: Vec<u64> = w
            .frames()
            .iter()
            .map(|f| {
                assert_eq!(f.dcid(), cids[parity as usize], "instance {}: a foreign datagram", w.server_id);
                u64::from_be_bytes(f.head[13..21].try_into().unwrap())
            })
            .collect();
        got.sort_unstable();
        let want: Vec<u64> = (0..total).filter(|n| n % 2 == parity).collect();
        assert_eq!(got, want, "instance {}: each of its datagrams once", w.server_id);
    }
    let s = d.status();
    assert_eq!(u64_at(&s, "/drops/full") + u64_at(&s, "/drops/send_error"), 0, "{s}");
}
both_backends!(buffers_pointed_into_are_not_reused_before_the_flush);

/// `--cores 0-1`: each shard thread (`shard-<k>`) is pinned to its core: the
/// kernel's `Cpus_allowed_list` of that thread (/proc/PID/task/TID/status) is
/// exactly the core, where an unpinned thread would have the whole machine's set.
fn shard_threads_are_pinned_to_their_cores(io: &str) {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if n < 2 {
        testkit::skip(&format!("needs 2 cores, this machine has {n}"));
        return;
    }
    let d = Demux::start(io, "0-1");
    let pid = d.child.id();
    let mut pinned = std::collections::BTreeMap::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        let Some(k) = comm.trim().strip_prefix("shard-") else { continue };
        let status = std::fs::read_to_string(t.join("status")).unwrap();
        let cpus = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
        pinned.insert(k.to_string(), cpus);
    }
    let want: std::collections::BTreeMap<String, String> =
        [("0", "0"), ("1", "1")].iter().map(|(k, c)| (k.to_string(), c.to_string())).collect();
    assert_eq!(pinned, want, "shard thread → Cpus_allowed_list");
}
both_backends!(shard_threads_are_pinned_to_their_cores);

/// 100 000 random and malformed datagrams: each counted under exactly one reason,
/// the process survives, frames stay well-formed.
fn random_and_malformed_datagrams(io: &str) {
    // Every datagram under exactly one routing reason: no per-source refusals here.
    let mut d = Demux::start_with(io, "0", &["--limits", "off"]);
    let mut rng = Rng(7);
    let w1 = Worker::connect(&d, 71, true);
    let w2 = Worker::connect(&d, 72, false);
    d.wait_instances(&[(71, true), (72, false)]);
    let valid: Vec<Vec<u8>> = vec![
        short(&d.cid(71, &mut rng), 100, &mut rng),
        short(&d.cid(72, &mut rng), 100, &mut rng),
        initial(&rng.bytes(8), &mut rng),
        long(HANDSHAKE, &d.cid(72, &mut rng), 200, &mut rng),
        long(ZERO_RTT, &rng.bytes(20), 200, &mut rng),
    ];
    let c = client();
    let total: u64 = 100_000;
    let chunk = 1000;
    let mut sent = 0u64;
    while sent < total {
        for _ in 0..chunk {
            let p: Vec<u8> = match rng.below(6) {
                // Random bytes of random length.
                0 => {
                    let n = rng.below(1500) as usize;
                    rng.bytes(n)
                }
                // A valid datagram with a few bytes flipped.
                1 | 2 => {
                    let mut p = valid[rng.below(valid.len() as u64) as usize].clone();
                    for _ in 0..=rng.below(4) {
                        let i = rng.below(p.len() as u64) as usize;
                        p[i] ^= rng.next() as u8 | 1;
                    }
                    p
                }
                // A valid datagram cut short.
                3 => {
                    let p = &valid[rng.below(valid.len() as u64) as usize];
                    p[..rng.below(p.len() as u64) as usize].to_vec()
                }
                // A long header with an arbitrary version, CID lengths up to 255.
                4 => {
                    let mut p = vec![0x80 | rng.next() as u8];
                    p.extend_from_slice(&(rng.next() as u32).to_be_bytes());
                    let l = rng.below(256) as u8;
                    p.push(l);
                    let n = rng.below(1400) as usize;
                    p.extend_from_slice(&rng.bytes(n));
                    p
                }
                // Short headers with random CIDs (orphans, mostly).
                _ => {
                    let mut cid = [0u8; 12];
                    rng.fill(&mut cid);
                    short(&cid, 33 + rng.below(1000) as usize, &mut rng)
                }
            };
            c.send_to(&p, d.addr()).unwrap();
        }
        sent += chunk;
        // Pace: let the data plane catch up so no datagram is lost in the kernel.
        d.wait_status("chunk received", |s| u64_at(s, "/datagrams_in") == sent);
    }
    assert!(d.alive(), "data plane died: {}", d.log());
    let forwarded =
        |s: &serde_json::Value| u64_at(instance(s, 71), "/datagrams") + u64_at(instance(s, 72), "/datagrams");
    // Counters are updated as the batch proceeds (reasons while routing, instance
    // counters after sendmmsg): wait for the last batch to be fully accounted.
    let s = d.wait_status("every datagram accounted", |s| {
        let routed_away = reason(s, "NotQuic") + reason(s, "NoInstance");
        reasons_sum(s) == total && forwarded(s) + u64_at(s, "/drops/full") + routed_away == total
    });
    assert_eq!(u64_at(&s, "/datagrams_in"), total);
    assert_eq!(reasons_sum(&s), total, "each datagram under exactly one reason: {s}");
    assert_eq!(u64_at(&s, "/drops/truncated"), 0);
    let forwarded = forwarded(&s);
    wait_for("workers drained", || (w1.datagrams() + w2.datagrams()) as u64 == forwarded);
    assert_eq!(w1.bad_frames.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(w2.bad_frames.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(reason(&s, "NotQuic") > 10_000 && reason(&s, "Orphan") > 1_000, "mix looks wrong: {s}");
}
both_backends!(random_and_malformed_datagrams);

/// Data-connection protocol: a duplicate live server id is refused with Error;
/// Draining makes an instance unplaceable but keeps it live.
fn data_connection_protocol(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(8);
    let w1 = Worker::connect(&d, 81, true);
    let w2 = Worker::connect(&d, 82, true);
    d.wait_instances(&[(81, true), (82, true)]);
    // Duplicate id.
    let fd = seqpacket_connect(&d.data).unwrap();
    use std::os::fd::AsRawFd;
    let announce = proto::wire::Announce::plain(proto::wire::Window::OWN);
    send_record(fd.as_raw_fd(), &Data::DataHello { announce, server_id: proto::ServerId(81) }.to_record(), &[])
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, fds) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
    assert!(fds.is_empty());
    match Data::decode(&buf[..n]).unwrap() {
        Data::Error { reason } => assert!(reason.contains("81"), "{reason}"),
        other => panic!("expected Error, got {other:?}"),
    }
    let (n, _) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
    assert_eq!(n, 0, "closed after Error");
    // Draining: new connections all go to 81, 82 still gets its own CIDs.
    w2.send(&Data::Draining);
    d.wait_instances(&[(81, true), (82, false)]);
    let c = client();
    for _ in 0..20 {
        c.send_to(&initial(&rng.bytes(8), &mut rng), d.addr()).unwrap();
    }
    c.send_to(&short(&d.cid(82, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("delivered", || w1.datagrams() + w2.datagrams() == 21);
    assert_eq!(w1.datagrams(), 20);
    assert_eq!(w2.datagrams(), 1);
    // Garbage on a data connection: refused and closed, the data plane lives on.
    let fd = seqpacket_connect(&d.data).unwrap();
    send_record(fd.as_raw_fd(), b"\x00garbage", &[]).unwrap();
    let (n, _) = recv_record(fd.as_raw_fd(), &mut buf).unwrap();
    assert!(matches!(Data::decode(&buf[..n]), Ok(Data::Error { .. })));
    d.wait_instances(&[(81, true), (82, false)]);
}
both_backends!(data_connection_protocol);

/// `--cores` naming cores this machine lacks fails with a clear error, no panic.
fn cores_beyond_machine_error(io: &str) {
    let dir = temp_dir("cores");
    let keys = dir.join("keys");
    assert!(std::process::Command::new(BIN).args(["gen-keys", "--out"]).arg(&keys).status().unwrap().success());
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let out = std::process::Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--io", io, "--cores", &format!("0-{}", n + 1), "--keys"])
        .arg(&keys)
        .arg("--data-socket")
        .arg(dir.join("d.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not available") && err.contains("has cores"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A missing key file is a clear error too.
    let out = std::process::Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--io", io, "--keys", "/nonexistent/keys", "--data-socket"])
        .arg(dir.join("d.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("gen-keys") && !err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
both_backends!(cores_beyond_machine_error);

/// `demux lb-status` prints the counters, readable and as JSON.
fn lb_status_command(io: &str) {
    let d = Demux::start(io, "0");
    let _w = Worker::connect(&d, 91, true);
    d.wait_instances(&[(91, true)]);
    let out = std::process::Command::new(BIN).args(["lb-status", "--control-socket"]).arg(&d.control).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("NotQuic") && text.contains("91") && text.contains(&format!("io {io}")), "{text}");
    let out = std::process::Command::new(BIN)
        .args(["lb-status", "--json", "--control-socket"])
        .arg(&d.control)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["io"], io);
}
both_backends!(lb_status_command);

/// Pins the calling (test) thread to `core`.
fn pin_to(core: usize) {
    // SAFETY: cpu_set_t is plain old data; sched_setaffinity(0) affects this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

/// `--steer cpu`: on loopback the receive runs on the sender's CPU, so a sender
/// pinned to core c reaches the shard of core c (SO_ATTACH_REUSEPORT_CBPF, SKF_AD_CPU).
fn steer_cpu_picks_the_receiving_cpus_shard(io: &str) {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if n < 2 {
        testkit::skip(&format!("needs 2 cores, this machine has {n}"));
        return;
    }
    let d = Demux::start_with(io, "0-1", &["--steer", "cpu"]);
    let mut rng = Rng(9);
    let w = Worker::connect(&d, 101, true);
    d.wait_instances(&[(101, true)]);
    let s0 = d.status();
    assert_eq!(s0["steer"], "cpu");
    for core in [1usize, 0] {
        let sent_before: Vec<u64> =
            (0..2).map(|i| u64_at(&d.status(), &format!("/per_shard/{i}/datagrams_in"))).collect();
        let (cid, addr) = (d.cid(101, &mut rng), d.addr());
        let payloads: Vec<Vec<u8>> = (0..20).map(|_| short(&cid, 100, &mut rng)).collect();
        std::thread::spawn(move || {
            pin_to(core);
            // New sockets (new 4-tuples) each time: the hash would spread them.
            for p in &payloads {
                client().send_to(p, addr).unwrap();
            }
        })
        .join()
        .unwrap();
        let s =
            d.wait_status("steered datagrams", |s| u64_at(s, "/datagrams_in") == sent_before.iter().sum::<u64>() + 20);
        let got = u64_at(&s, &format!("/per_shard/{core}/datagrams_in")) - sent_before[core];
        assert_eq!(got, 20, "all 20 datagrams sent from core {core} went to shard {core}: {s}");
    }
    wait_for("forwarded", || w.datagrams() == 40);
}
both_backends!(steer_cpu_picks_the_receiving_cpus_shard);

/// io_uring with a tiny buffer ring (8 buffers): bursts exhaust it, the multishot
/// ends with ENOBUFS, is re-armed after the buffers come back, and nothing is lost
/// (the datagrams wait in the socket). The mmsg backend ignores the flag.
fn buffer_ring_exhaustion_loses_nothing(io: &str) {
    let d = Demux::start_with(io, "0", &["--uring-buffers", "8"]);
    let mut rng = Rng(10);
    let w = Worker::connect(&d, 111, true);
    d.wait_instances(&[(111, true)]);
    let cid = d.cid(111, &mut rng);
    let payloads: Vec<Vec<u8>> = (0..64).map(|_| short(&cid, 1000, &mut rng)).collect();
    let c = client();
    let total = 2000;
    for k in 0..total {
        c.send_to(&payloads[k % payloads.len()], d.addr()).unwrap();
    }
    d.wait_status("burst received", |s| u64_at(s, "/datagrams_in") == total as u64);
    wait_for("burst forwarded", || w.datagrams() == total);
    let s = d.wait_status("burst accounted", |s| u64_at(instance(s, 111), "/datagrams") == total as u64);
    if io == "uring" {
        assert!(u64_at(&s, "/recv_no_buffers") > 0, "expected the 8-buffer ring to run empty: {s}");
    }
}
both_backends!(buffer_ring_exhaustion_loses_nothing);

/// IPv4 and IPv6 listen addresses side by side: Sockets carries one fd per address in
/// `--listen` order; frames carry the client address, the local address
/// (IP_PKTINFO / IPV6_PKTINFO) and the ECN codepoint (IP_TOS / IPV6_TCLASS,
/// RFC 3168); an unsupported version ≥ 1200 bytes goes out for Version Negotiation
/// (RFC 9000 §6).
fn ipv6_ecn_and_version_negotiation(io: &str) {
    use std::os::fd::AsRawFd;
    let d = Demux::start_with(io, "0", &["--listen", "[::1]:0"]);
    let mut rng = Rng(11);
    let w = Worker::connect(&d, 121, true);
    assert_eq!(w.sockets, d.udp);
    assert_eq!(w.sockets.len(), 2);
    assert_eq!(w.socket_fds.len(), 2, "one UDP fd per listen address");
    assert!(d.udp[1].is_ipv6());
    d.wait_instances(&[(121, true)]);
    let cid = d.cid(121, &mut rng);
    // IPv6 with ECT(0) in the traffic class.
    let c6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
    let tclass: libc::c_int = 0x02;
    // SAFETY: setsockopt with a live c_int.
    let r = unsafe {
        libc::setsockopt(
            c6.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_TCLASS,
            (&tclass as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(r, 0);
    c6.send_to(&short(&cid, 100, &mut rng), d.udp[1]).unwrap();
    // IPv4 with ECT(1) | CE = 0x03.
    let c4 = client();
    let tos: libc::c_int = 0x03;
    // SAFETY: setsockopt with a live c_int.
    let r = unsafe {
        libc::setsockopt(c4.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, (&tos as *const libc::c_int).cast(), 4)
    };
    assert_eq!(r, 0);
    c4.send_to(&short(&cid, 100, &mut rng), d.udp[0]).unwrap();
    wait_for("both frames", || w.datagrams() == 2);
    let f = w.frames();
    let f6 = f.iter().find(|f| f.meta.client.is_ipv6()).expect("v6 frame");
    let f4 = f.iter().find(|f| f.meta.client.is_ipv4()).expect("v4 frame");
    assert_eq!(f6.meta.client, c6.local_addr().unwrap());
    assert_eq!(f6.meta.local, Some(d.udp[1]));
    assert_eq!(f6.meta.ecn, 2);
    assert_eq!(f4.meta.local, Some(d.udp[0]));
    assert_eq!(f4.meta.ecn, 3);
    // Unsupported version: 1200 bytes → VersionNegotiation, 1199 bytes → NotQuic.
    let mut vn = long(INITIAL, &rng.bytes(8), 1200, &mut rng);
    vn[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes());
    assert_eq!(vn.len(), 1200);
    c4.send_to(&vn, d.udp[0]).unwrap();
    c4.send_to(&vn[..1199], d.udp[0]).unwrap();
    wait_for("VN candidate delivered", || w.datagrams() == 3);
    let s = d.wait_status("VN counted", |s| reason(s, "NotQuic") == 1);
    assert_eq!(reason(&s, "VersionNegotiation"), 1);
    assert_eq!(reason(&s, "Owner"), 2);
}
both_backends!(ipv6_ecn_and_version_negotiation);

/// `--io auto` where io_uring is refused (a seccomp filter failing io_uring_setup with
/// EPERM): the data plane falls back to recvmmsg with one log line naming the reason,
/// and still forwards.
#[test]
fn auto_falls_back_to_mmsg_when_io_uring_is_refused() {
    let d = Demux::start_opts("auto", "0", &[], &[libc::SYS_io_uring_setup]);
    let mut rng = Rng(12);
    let w = Worker::connect(&d, 131, true);
    d.wait_instances(&[(131, true)]);
    assert_eq!(d.status()["io"], "mmsg");
    let log = d.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("io_uring unavailable")).collect();
    assert_eq!(lines.len(), 1, "exactly one fallback line: {log}");
    assert!(lines[0].contains("seccomp") && lines[0].contains("--io mmsg"), "{}", lines[0]);
    client().send_to(&short(&d.cid(131, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("forwarded", || w.datagrams() == 1);
}

/// The same with `--io uring`: a clear start-up error instead of a fallback.
#[test]
fn uring_refused_is_a_clear_error() {
    let err = refused_start("refuse", &[libc::SYS_io_uring_setup], &["--listen", "127.0.0.1:0", "--io", "uring"]);
    assert!(err.contains("io_uring") && err.contains("EPERM") || err.contains("not permitted"), "{err}");
}

/// A departed worker's data connection is closed by the data plane soon after it
/// leaves, even when no datagram arrives (idle shards refresh their snapshot).
fn departed_workers_fd_is_released(io: &str) {
    let d = Demux::start(io, "0-1");
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", d.child.id())).map(|r| r.count()).unwrap_or(0);
    // The ready file is written once every shard runs: the fd set is complete.
    let base = fds();
    let w = Worker::connect(&d, 141, true);
    d.wait_instances(&[(141, true)]);
    wait_for("data connection accepted", || fds() > base);
    // A datagram makes a shard load (and cache) the snapshot naming this worker.
    let mut rng = Rng(14);
    client().send_to(&short(&d.cid(141, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("delivered", || w.datagrams() == 1);
    w.close();
    d.wait_instances(&[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fds() > base {
        assert!(std::time::Instant::now() < deadline, "data connection fd still open: {} > {base}", fds());
        std::thread::sleep(Duration::from_millis(50));
    }
}
both_backends!(departed_workers_fd_is_released);

/// ADR 0001 key rotation: `KeysChanged` on the control socket and SIGHUP (re-read the
/// key file) install a new newest generation; the previous one still decodes to its
/// owner, a dropped one makes orphans.
fn key_rotation(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(15);
    let w1 = Worker::connect(&d, 151, true);
    let w2 = Worker::connect(&d, 152, true);
    d.wait_instances(&[(151, true), (152, true)]);
    let k0 = d.keys.clone();
    let k1 = k0.rotated([7; 32], proto::cid::Prf::SipHash24);
    let k2 = k1.rotated([8; 32], proto::cid::Prf::HmacSha256);
    let mint = |k: &proto::keyfile::KeyFile, rng: &mut Rng| {
        let mut r = [0u8; 10];
        rng.fill(&mut r);
        k.key_set().unwrap().encode(proto::ServerId(152), &r)
    };
    let c = client();
    // Before: a generation-1 CID is unroutable (cr not live) → orphan.
    c.send_to(&short(&mint(&k1, &mut rng), 100, &mut rng), d.addr()).unwrap();
    d.wait_status("orphan", |s| reason(s, "Orphan") == 1);
    // Counted when routed; delivered to a worker a little later: wait for it, or it
    // could land after the clear() below and count as a misrouted datagram.
    wait_for("orphan delivered", || w1.datagrams() + w2.datagrams() == 1);
    // KeysChanged on the control socket, sent right behind the hello in this build's
    // version (the controller's best-effort rollback does so, docs/wire.md "Versions").
    {
        use std::os::fd::AsRawFd;
        let fd = seqpacket_connect(&d.control).unwrap();
        let hello = Admin::Hello { announce: proto::wire::Announce::plain(proto::wire::Window::OWN), pid: 1 };
        let m = Admin::KeysChanged { keys: k1.keys.clone() };
        send_record(fd.as_raw_fd(), &hello.to_record(), &[]).unwrap();
        send_record(fd.as_raw_fd(), &m.to_record(), &[]).unwrap();
    }
    let s = d.wait_status("generation 1", |s| u64_at(s, "/key_newest") == 1);
    assert_eq!(s["key_previous"], 0);
    w1.clear();
    w2.clear();
    c.send_to(&short(&mint(&k1, &mut rng), 100, &mut rng), d.addr()).unwrap(); // newest
    c.send_to(&short(&mint(&k0, &mut rng), 100, &mut rng), d.addr()).unwrap(); // previous
    wait_for("both at owner", || w2.datagrams() == 2);
    assert_eq!(w1.datagrams(), 0);
    // SIGHUP: the key file now holds generation 2 (previous 1); generation 0 is gone.
    std::fs::write(d.dir.join("keys"), k2.to_text()).unwrap();
    // SAFETY: signals our own child process.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) }, 0);
    let s = d.wait_status("generation 2", |s| u64_at(s, "/key_newest") == 2);
    assert_eq!(s["key_previous"], 1);
    let orphans = reason(&s, "Orphan");
    c.send_to(&short(&mint(&k2, &mut rng), 100, &mut rng), d.addr()).unwrap();
    c.send_to(&short(&mint(&k1, &mut rng), 100, &mut rng), d.addr()).unwrap();
    wait_for("owner traffic", || w2.datagrams() >= 4);
    c.send_to(&short(&mint(&k0, &mut rng), 100, &mut rng), d.addr()).unwrap();
    let s = d.wait_status("dropped generation is orphan", |s| reason(s, "Orphan") == orphans + 1);
    assert_eq!(reason(&s, "Owner"), 4);
    // A broken key file on SIGHUP keeps the current keys.
    std::fs::write(d.dir.join("keys"), "garbage").unwrap();
    // SAFETY: signals our own child process.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) }, 0);
    wait_for("reload attempt logged", || d.log().contains("key file not reloaded"));
    assert_eq!(u64_at(&d.status(), "/key_newest"), 2);
    assert!(d.status()["pid"].as_u64().is_some());
}
both_backends!(key_rotation);

/// A worker that stops reading: its data connection fills, the rest of its frames
/// are dropped and counted for it (drops.full, instance drops_full), and the shard
/// keeps serving the other worker — it never blocks.
fn full_worker_socket_drops_and_never_blocks(io: &str) {
    let d = Demux::start(io, "0");
    let mut rng = Rng(16);
    let stuck = Worker::connect_opts(&d, 161, true, false);
    let live = Worker::connect(&d, 162, true);
    d.wait_instances(&[(161, true), (162, true)]);
    let (cid_stuck, cid_live) = (d.cid(161, &mut rng), d.cid(162, &mut rng));
    let p_stuck = short(&cid_stuck, 1200, &mut rng);
    let p_live = short(&cid_live, 100, &mut rng);
    let c = client();
    let (chunks, per_chunk) = (10u64, 1000u64);
    for k in 1..=chunks {
        for _ in 0..per_chunk {
            c.send_to(&p_stuck, d.addr()).unwrap();
        }
        for _ in 0..10 {
            c.send_to(&p_live, d.addr()).unwrap();
        }
        d.wait_status("chunk received", |s| u64_at(s, "/datagrams_in") == k * (per_chunk + 10));
    }
    let total_stuck = chunks * per_chunk;
    let s = d.wait_status("all accounted", |s| {
        let i = instance(s, 161);
        u64_at(i, "/datagrams") + u64_at(i, "/drops_full") == total_stuck
            && u64_at(instance(s, 162), "/datagrams") == chunks * 10
    });
    let i = instance(&s, 161);
    assert!(u64_at(i, "/drops_full") > 0, "the stuck worker's socket never filled: {s}");
    assert!(u64_at(i, "/datagrams") > 0);
    assert_eq!(u64_at(&s, "/drops/full"), u64_at(i, "/drops_full"));
    assert_eq!(u64_at(instance(&s, 162), "/drops_full"), 0);
    wait_for("live worker got everything", || live.datagrams() as u64 == chunks * 10);
    drop(stuck);
}
both_backends!(full_worker_socket_drops_and_never_blocks, rings);

/// `--busy-poll-us`: with datagrams arriving 100 µs apart, a shard that spins up to
/// 5 ms before sleeping finds the next receive while spinning (counted
/// `busy_poll.found`), instead of sleeping and being woken; without the flag it never
/// spins. A spin that missed arrivals (not seeing IORING_SQ_TASKRUN) finds none.
#[test]
fn busy_poll_takes_receives_while_spinning() {
    const N: u64 = 200;
    for (flags, spins) in [(&["--busy-poll-us", "5000"][..], true), (&[][..], false)] {
        let d = Demux::start_with("uring", "0", flags);
        let mut rng = Rng(21);
        let w = Worker::connect(&d, 151, true);
        d.wait_instances(&[(151, true)]);
        let cid = d.cid(151, &mut rng);
        let c = client();
        // One datagram at a time, each sent once the previous one was forwarded: the
        // shard is idle (spinning, or asleep) whenever one arrives, however loaded the
        // machine is, so every datagram ends a spin or a sleep.
        for i in 1..=N {
            c.send_to(&short(&cid, 100, &mut rng), d.addr()).unwrap();
            // Polled every 20 µs: wait_for's back-off would outlast the 5 ms spin.
            let deadline = Instant::now() + Duration::from_secs(20);
            while w.datagrams() < i as usize {
                assert!(Instant::now() < deadline, "datagram {i} not forwarded");
                std::thread::sleep(Duration::from_micros(20));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let s = d.status();
        assert_eq!(s["busy_poll_us"], if spins { 5000 } else { 0 }, "the setting is in the status");
        let (polls, found) = (u64_at(&s, "/busy_poll/spins"), u64_at(&s, "/busy_poll/found"));
        if spins {
            // A spin starts after each datagram is handled and ends when the next one
            // shows up, or after 5 ms without one: only a sender descheduled for
            // > 5 ms (and the spin after the last datagram) times out. Half is the
            // bound on a loaded machine (every quiet run here: > 95 %).
            eprintln!("busy poll: found {found} of {polls} spins for {N} datagrams");
            assert!(polls >= N / 2, "{polls} spins for {N} datagrams");
            assert!(found <= polls && found >= N / 2, "found {found} of {polls} spins for {N} datagrams");
        } else {
            assert_eq!((polls, found), (0, 0), "no spinning without the flag");
        }
    }
}

/// `--busy-poll-us` is refused where it cannot work (the recvmmsg backend) and above
/// its bound, with a clear error.
#[test]
fn busy_poll_refusals() {
    let err = refused_start("busy-mmsg", &[], &["--listen", "127.0.0.1:0", "--io", "mmsg", "--busy-poll-us", "50"]);
    assert!(err.contains("--busy-poll-us needs the io_uring backend"), "{err}");
    // Above the bound: clap's usage error (exit status 2).
    let out = std::process::Command::new(BIN)
        .args(["dataplane", "--listen", "127.0.0.1:0", "--busy-poll-us", "10001"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--busy-poll-us") && err.contains("10000"), "{err}");
}
