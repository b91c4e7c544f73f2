//! The real program on real sockets: reuseport groups on 127.0.0.1, single datagrams
//! from several 127.x.y.z sources, and a plain-Rust model of where each one must
//! arrive (tests/common). Trains: tests/trains.rs.
//!
//! If this machine refuses to load the program the tests report it with
//! `testkit::skip` (a failure under `CI=true`) and pass.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use fastpath::{Config, Counters, LoadError, Steering, Variant};
use proto::{Generation, ServerId};
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

// ---------- tests ----------

/// Test 1 (and 4): the exact model over a few thousand datagrams of every kind, for
/// each variant of the program (single datagrams: both must steer them alike).
#[test]
fn steering_matches_the_model_exactly() {
    model_test(Variant::GsoWalk);
}

#[test]
fn size_limit_variant_matches_the_model_exactly() {
    model_test(Variant::SizeLimit);
}

fn model_test(variant: Variant) {
    let Some(g) = group_at("127.0.0.1:0", Some(variant), 2, 3, 8, None) else {
        return;
    };
    assert_eq!(g.steering.variant(), variant);
    let (k0, k1) = (derive(&SECRET0), derive(&SECRET1));
    g.steering.set_generation(gen(0), Some(k0.into())).unwrap();
    g.steering.set_generation(gen(1), Some(k1.into())).unwrap();
    g.steering.set_generation(gen(2), None).unwrap();
    for (slot, w) in g.workers.iter().enumerate() {
        g.steering.insert_worker(slot as u32, ServerId(IDS[slot]), w.as_ref().unwrap().as_fd()).unwrap();
    }
    let srcs = senders(8);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut plan: Vec<Dgram> = Vec::new();
    let n = 3000;
    while plan.len() < n {
        let seq = plan.len() as u32;
        let src = rng.below(srcs.len() as u64) as usize;
        let kind = rng.below(12);
        let d = match kind {
            0..=3 => {
                let cr = (kind & 1) as u8;
                let w = rng.below(3) as usize;
                fast(&mut rng, src, cr, if cr == 0 { k0 } else { k1 }, w, seq)
            }
            4 => {
                // A dead id in a live generation.
                let mut id = rng.next() as u16;
                while IDS.contains(&id) {
                    id = rng.next() as u16;
                }
                let cr = rng.below(2) as u8;
                let c = cid(&mut rng, cr, id, Some(if cr == 0 { k0 } else { k1 }));
                let (first, len) = (0x40 | ((rng.next() as u8) & 0x3f), 33 + rng.below(200) as usize);
                to_shard(src, short_datagram(&mut rng, first, &c, len, seq), Outcome::NotLive)
            }
            5 => {
                // Live id encoded with generation 0's key but marked cr = 3.
                let mut c = cid(&mut rng, 0, IDS[0], Some(k0));
                c[0] |= 0xc0;
                to_shard(src, short_datagram(&mut rng, 0x40, &c, 60, seq), Outcome::CrUnroutable)
            }
            6 => {
                // cr = 2: inactive generation (encoded with k0: must not matter).
                let mut c = cid(&mut rng, 0, IDS[1], Some(k0));
                c[0] = (c[0] & 0x3f) | 0x80;
                to_shard(src, short_datagram(&mut rng, 0x40, &c, 80, seq), Outcome::UnknownGeneration)
            }
            7 => {
                // Long header whose DCID bytes would decode to a live worker.
                let c = cid(&mut rng, 0, IDS[2], Some(k0));
                let first = 0x80 | (rng.next() as u8);
                let len = 40 + rng.below(1200) as usize;
                to_shard(src, short_datagram(&mut rng, first, &c, len, seq), Outcome::LongHeader)
            }
            8 => {
                // Fixed bit clear, otherwise a perfect fast datagram.
                let c = cid(&mut rng, 1, IDS[1], Some(k1));
                let first = (rng.next() as u8) & 0x3f;
                to_shard(src, short_datagram(&mut rng, first, &c, 100, seq), Outcome::ShortPacket)
            }
            9 => {
                // Too short by 1..=16 bytes: live id, 17..=32 bytes.
                let c = cid(&mut rng, 0, IDS[0], Some(k0));
                let len = 17 + rng.below(16) as usize;
                to_shard(src, short_datagram(&mut rng, 0x40, &c, len, seq), Outcome::ShortPacket)
            }
            10 => {
                // The boundary: exactly 33 bytes is fast, 32 is not.
                if rng.below(2) == 0 {
                    let w = rng.below(3) as usize;
                    let c = cid(&mut rng, 1, IDS[w], Some(k1));
                    Dgram {
                        src,
                        bytes: short_datagram(&mut rng, 0x7f, &c, 33, seq),
                        expect: Expect::Worker(w),
                        outcome: Outcome::Fast,
                    }
                } else {
                    let c = cid(&mut rng, 1, IDS[0], Some(k1));
                    to_shard(src, short_datagram(&mut rng, 0x7f, &c, 32, seq), Outcome::ShortPacket)
                }
            }
            _ => continue,
        };
        plan.push(d);
    }
    // Tiny datagrams (0..=16 bytes, one per source and length): short_packet.
    for src in 0..srcs.len() {
        for len in 0..17usize {
            let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if let Some(f) = b.first_mut() {
                *f = 0x40 | (*f & 0x3f);
            }
            plan.push(to_shard(src, b, Outcome::ShortPacket));
        }
    }
    // The tiny block must not straddle a batch boundary with another tiny block of the
    // same (source, length): it doesn't, each (source, length) occurs once overall.

    let del = run(&g, &srcs, &plan);
    assert_eq!(del.at.len(), plan.len());
    let want = expected_counters(&plan);
    let have = g.steering.counters().unwrap();
    assert_eq!(have, want, "counters (left: kernel, right: model)");
    assert_eq!(have.total(), plan.len() as u64);
    for kind in
        [want.fast, want.long_header, want.short_packet, want.cr_unroutable, want.unknown_generation, want.not_live]
    {
        assert!(kind > 0, "the plan covers every outcome: {want:?}");
    }
    // Test 4 within the mix: worker_fast(slot) = datagrams delivered to that worker.
    for w in 0..3 {
        let got = del.per_worker.get(&w).copied().unwrap_or(0);
        assert!(got > 0);
        assert_eq!(g.steering.worker_fast(w as u32).unwrap(), got, "worker_fast({w})");
    }
    for slot in 3..8 {
        assert_eq!(g.steering.worker_fast(slot).unwrap(), 0);
    }
    // Shard choice by hash: one 4-tuple, one shard; both shards used.
    let mut used = [false; 2];
    for (src, shards) in &del.src_shards {
        assert!(shards.iter().all(|&s| s == shards[0]), "{src} reached shards {shards:?}");
        used[shards[0]] = true;
    }
    assert!(used[0] && used[1], "both shards used: {used:?} over {} sources", del.src_shards.len());
}

/// Test 2: a closed worker socket leaves the sockarray; its datagrams go to a shard
/// and count as select_failed.
#[test]
fn closed_worker_socket_falls_back_to_a_shard() {
    let Some(mut g) = group(2, 3, 4, None) else {
        return;
    };
    let k0 = prepare(&g);
    let srcs = senders(4);
    let mut rng = Rng(7);
    // Before: fast.
    let plan = fast_plan(&mut rng, k0, 1, 100, srcs.len(), 0, Expect::Worker(1), Outcome::Fast);
    run(&g, &srcs, &plan);
    assert_eq!(g.steering.counters().unwrap().fast, 100);
    drop(g.workers[1].take());
    let mut plan2 = fast_plan(&mut rng, k0, 1, 200, srcs.len(), 0, Expect::AnyShard, Outcome::SelectFailed);
    // Other workers are unaffected.
    plan2.extend(fast_plan(&mut rng, k0, 2, 50, srcs.len(), 200, Expect::Worker(2), Outcome::Fast));
    run(&g, &srcs, &plan2);
    let c = g.steering.counters().unwrap();
    assert_eq!((c.fast, c.select_failed, c.shard_select_failed), (150, 200, 0), "{c:?}");
    assert_eq!(g.steering.worker_fast(1).unwrap(), 100);
    // remove_worker of a slot whose socket is already gone is fine.
    g.steering.remove_worker(1, ServerId(IDS[1])).unwrap();
}

/// Test 3 (and 4): remove_worker → not_live; re-insert in a new slot → fast again,
/// counted in the new slot.
#[test]
fn remove_and_reinsert_worker() {
    let Some(g) = group(2, 3, 6, None) else {
        return;
    };
    let k0 = prepare(&g);
    let srcs = senders(4);
    let mut rng = Rng(99);
    run(&g, &srcs, &fast_plan(&mut rng, k0, 0, 64, srcs.len(), 0, Expect::Worker(0), Outcome::Fast));
    g.steering.remove_worker(0, ServerId(IDS[0])).unwrap();
    run(&g, &srcs, &fast_plan(&mut rng, k0, 0, 80, srcs.len(), 0, Expect::AnyShard, Outcome::NotLive));
    let c = g.steering.counters().unwrap();
    assert_eq!((c.fast, c.not_live, c.select_failed), (64, 80, 0), "{c:?}");
    // Same socket, new slot 4.
    g.steering.insert_worker(4, ServerId(IDS[0]), g.workers[0].as_ref().unwrap().as_fd()).unwrap();
    let mut plan = fast_plan(&mut rng, k0, 0, 90, srcs.len(), 0, Expect::Worker(0), Outcome::Fast);
    plan.extend(fast_plan(&mut rng, k0, 2, 10, srcs.len(), 90, Expect::Worker(2), Outcome::Fast));
    run(&g, &srcs, &plan);
    let c = g.steering.counters().unwrap();
    assert_eq!((c.fast, c.not_live), (64 + 100, 80), "{c:?}");
    assert_eq!(g.steering.worker_fast(4).unwrap(), 90);
    assert_eq!(g.steering.worker_fast(0).unwrap(), 64, "the old slot keeps its count");
    assert_eq!(g.steering.worker_fast(2).unwrap(), 10);
    // Removing the old slot now must not unsteer the id that moved to slot 4.
    g.steering.remove_worker(0, ServerId(IDS[0])).unwrap();
    run(&g, &srcs, &fast_plan(&mut rng, k0, 0, 20, srcs.len(), 0, Expect::Worker(0), Outcome::Fast));
    assert_eq!(g.steering.worker_fast(4).unwrap(), 110);
    // Re-using a slot restarts its worker_fast count.
    g.steering.remove_worker(4, ServerId(IDS[0])).unwrap();
    g.steering.insert_worker(0, ServerId(IDS[0]), g.workers[0].as_ref().unwrap().as_fd()).unwrap();
    assert_eq!(g.steering.worker_fast(0).unwrap(), 0, "insert_worker resets the slot's count");
    run(&g, &srcs, &fast_plan(&mut rng, k0, 0, 5, srcs.len(), 0, Expect::Worker(0), Outcome::Fast));
    assert_eq!(g.steering.worker_fast(0).unwrap(), 5);
    // Out-of-range slots are refused.
    assert!(g.steering.insert_worker(6, ServerId(1), g.workers[1].as_ref().unwrap().as_fd()).is_err());
    assert!(g.steering.worker_fast(6).is_err());
    assert!(Generation::new(3).is_none(), "cr = 3 is no generation: set_generation cannot name it");
}

fn pin_to(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write within it, and
    // sched_setaffinity(0) affects only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Test 5: `--steer cpu`: the shard is cpu_shard[cpu of the sender] (loopback runs the
/// receive path on the sending CPU). Fast datagrams still reach their workers.
#[test]
fn by_cpu_picks_the_cpu_shard() {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if cpus < 2 {
        testkit::skip(&format!("by_cpu needs at least 2 CPUs, this machine has {cpus}"));
        return;
    }
    // Deliberately not cpu % shards: cpu c -> shard (c + 1) % 2.
    let table: Vec<u32> = (0..256u32).map(|c| (c + 1) % 2).collect();
    let Some(g) = group(2, 3, 4, Some(&table)) else {
        return;
    };
    let k0 = prepare(&g);
    let mut total = Counters::default();
    for cpu in [0usize, 1] {
        let shard = table[cpu] as usize;
        let g = &g;
        let (del, n) = std::thread::scope(|s| {
            s.spawn(move || {
                pin_to(cpu).expect("sched_setaffinity");
                let srcs = senders(8);
                let mut rng = Rng(1234 + cpu as u64);
                let mut plan: Vec<Dgram> = (0..200)
                    .map(|i| {
                        let c = cid(&mut rng, 3, 0, None);
                        to_shard(i % 8, short_datagram(&mut rng, 0x40, &c, 50, i as u32), Outcome::CrUnroutable)
                    })
                    .collect();
                plan.extend(fast_plan(&mut rng, k0, 2, 40, 8, 200, Expect::Worker(2), Outcome::Fast));
                (run(g, &srcs, &plan), plan.len())
            })
            .join()
            .unwrap()
        });
        assert_eq!(del.at.len(), n);
        let mut count = 0;
        for (src, shards) in &del.src_shards {
            assert!(shards.iter().all(|&s| s == shard), "cpu {cpu}: {src} reached shards {shards:?}, want {shard}");
            count += shards.len();
        }
        assert_eq!(count, 200);
        total.cr_unroutable += 200;
        total.fast += 40;
        total.fast_datagrams += 40;
    }
    assert_eq!(g.steering.counters().unwrap(), total);
}

/// A shard socket that is gone: datagrams for it are dropped and counted
/// (shard_select_failed), never handed to a worker; fast datagrams still flow.
#[test]
fn failed_shard_select_is_a_counted_drop() {
    // Every CPU's shard is shard 1, which is then closed.
    let table = vec![1u32; 256];
    let Some(mut g) = group(2, 3, 4, Some(&table)) else {
        return;
    };
    let k0 = prepare(&g);
    drop(g.shards.remove(1));
    let srcs = senders(4);
    let mut rng = Rng(5);
    for i in 0..100 {
        let c = cid(&mut rng, 3, 0, None);
        srcs[i % 4].send_to(&short_datagram(&mut rng, 0x40, &c, 50, i as u32), g.addr).unwrap();
    }
    // Fast datagrams are unaffected (and, being delivered, prove the others had time).
    run(&g, &srcs, &fast_plan(&mut rng, k0, 1, 30, 4, 0, Expect::Worker(1), Outcome::Fast));
    std::thread::sleep(Duration::from_millis(50));
    let mut buf = [0u8; 2048];
    for s in g.shards.iter().chain(g.workers.iter().flatten()) {
        assert!(s.recv_from(&mut buf).is_err(), "a dropped datagram arrived at {:?}", s.local_addr());
    }
    let c = g.steering.counters().unwrap();
    assert_eq!((c.cr_unroutable, c.shard_select_failed, c.fast), (100, 100, 30), "{c:?}");
}

/// The same program over IPv6 (::1): open_worker_socket's v6 path, and the UDP
/// payload offset is the same for both families.
#[test]
fn ipv6_group_steers_too() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        testkit::skip_optional("ipv6-loopback", "no IPv6 loopback here");
        return;
    }
    let Some(g) = group_at("[::1]:0", None, 2, 3, 4, None) else {
        return;
    };
    let k0 = prepare(&g);
    let srcs: Vec<UdpSocket> = (0..6).map(|_| UdpSocket::bind("[::1]:0").unwrap()).collect();
    let mut rng = Rng(66);
    let mut plan = Vec::new();
    for w in 0..3 {
        let start = plan.len();
        plan.extend(fast_plan(&mut rng, k0, w, 50, srcs.len(), start, Expect::Worker(w), Outcome::Fast));
    }
    for i in 0..50 {
        let c = cid(&mut rng, 3, 0, None);
        let seq = plan.len() as u32;
        plan.push(to_shard(i % 6, short_datagram(&mut rng, 0xc0, &c, 1200, seq), Outcome::LongHeader));
    }
    let del = run(&g, &srcs, &plan);
    assert_eq!(del.at.len(), plan.len());
    assert_eq!(g.steering.counters().unwrap(), expected_counters(&plan));
    assert!(g.addr.is_ipv6());
}

/// Without CAP_BPF / CAP_SYS_ADMIN (dropped for one thread: capabilities are per
/// thread) loading is refused with EPERM, which is `Unsupported`.
#[test]
fn unprivileged_load_is_unsupported() {
    let unpriv = std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled").unwrap_or_default();
    std::thread::spawn(move || {
        let s = UdpSocket::from(fastpath::open_worker_socket("127.0.0.1:0".parse().unwrap()).unwrap());
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut hdr = Header { version: 0x2008_0522, pid: 0 }; // _LINUX_CAPABILITY_VERSION_3
        let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
        // SAFETY: capset(2) with a v3 header and the two data words it reads; pid 0 =
        // this thread only.
        let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) };
        assert_eq!(rc, 0, "capset: {}", io::Error::last_os_error());
        match Steering::attach(&[s.as_fd()], &Config::new(4)) {
            Err(LoadError::Unsupported(m)) => {
                eprintln!("unprivileged attach refused as expected: {}", m)
            }
            Ok(_) if unpriv.trim() == "0" => {
                testkit::skip_optional("unprivileged-bpf-off", "unprivileged BPF is enabled here")
            }
            other => panic!("unprivileged attach: {other:?}"),
        }
    })
    .join()
    .unwrap();
}

/// A program the verifier refuses (a read past the context) is `Unsupported`, and
/// the message carries the verifier's log.
#[test]
fn verifier_refusal_is_unsupported() {
    let dir = std::env::temp_dir().join(format!("fastpath-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, obj) = (dir.join("bad.bpf.c"), dir.join("bad.bpf.o"));
    std::fs::write(
        &src,
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"sk_reuseport\") int steer(struct sk_reuseport_md *ctx)\n\
         { return *(volatile __u32 *)((char *)ctx + 1000) ? SK_PASS : SK_DROP; }\n\
         char LICENSE[] SEC(\"license\") = \"Dual BSD/GPL\";\n",
    )
    .unwrap();
    let arch = if cfg!(target_arch = "aarch64") { "aarch64" } else { "x86_64" };
    let built = std::process::Command::new(std::env::var("CLANG").unwrap_or_else(|_| "clang".into()))
        .args(["-O2", "-g", "-target", "bpf"])
        .arg(format!("-I/usr/include/{arch}-linux-gnu"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !built {
        testkit::skip("cannot compile a test BPF program here (clang / libbpf-dev missing)");
        return;
    }
    let bytes = std::fs::read(&obj).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let s = UdpSocket::from(fastpath::open_worker_socket("127.0.0.1:0".parse().unwrap()).unwrap());
    match Steering::attach_object(&bytes, Variant::SizeLimit, &[s.as_fd()], &Config::new(4)) {
        Err(LoadError::Unsupported(m)) => {
            assert!(m.starts_with("loading the SK_REUSEPORT program"), "{m}");
            assert!(m.contains("invalid bpf_context access"), "verifier log in: {m}");
        }
        other => panic!("verifier refusal: {other:?}"),
    }
}

/// Test 6: the "built without clang" and "unsupported" paths.
#[test]
fn unsupported_paths_are_reported_as_such() {
    let s = UdpSocket::from(fastpath::open_worker_socket("127.0.0.1:0".parse().unwrap()).unwrap());
    match Steering::attach_object(&[], Variant::GsoWalk, &[s.as_fd()], &Config::new(4)) {
        Err(LoadError::Unsupported(m)) => {
            assert_eq!(m, fastpath::BUILT_WITHOUT_CLANG);
            assert!(m.contains("clang") && m.contains("libbpf-dev"));
        }
        other => panic!("empty object: {other:?}"),
    }
    for errno in [libc::EPERM, libc::EACCES, libc::ENOSYS, libc::EOPNOTSUPP, libc::EINVAL] {
        let e = fastpath::classify_os("loading", io::Error::from_raw_os_error(errno));
        assert!(matches!(e, LoadError::Unsupported(ref m) if m.starts_with("loading: ")), "errno {errno}: {e:?}");
    }
    for errno in [libc::EBADF, libc::ENOMEM, libc::EBUSY] {
        let e = fastpath::classify_os("loading", io::Error::from_raw_os_error(errno));
        assert!(matches!(e, LoadError::Other(_)), "errno {errno}: {e:?}");
    }
    assert!(matches!(
        fastpath::classify("verifier", io::ErrorKind::PermissionDenied, "refused"),
        LoadError::Unsupported(ref m) if m == "verifier: refused"
    ));
    assert!(matches!(fastpath::classify("x", io::ErrorKind::NotFound, "y"), LoadError::Other(_)));
    // No shard sockets is a caller error, not "unsupported".
    assert!(matches!(Steering::attach(&[], &Config::new(4)), Err(LoadError::Other(_))));
    // A shard table naming a shard that does not exist is refused.
    let bad_table = Config { shard_by_cpu: Some(&[0, 1]), ..Config::new(4) };
    assert!(matches!(Steering::attach(&[s.as_fd()], &bad_table), Err(LoadError::Other(_))));
}

/// A data-plane restart: the old process's program stays attached to the group (its
/// maps frozen) and its socket array still holds the shard sockets when the new data
/// plane attaches over the very same sockets. The new attach must replace the old
/// program and take the shard sockets over (a socket sits in one sockarray at a time:
/// inserting before the replacement fails with EBUSY), and the new maps steer.
#[test]
fn reattach_over_the_same_sockets_replaces_the_program() {
    let Some(g) = group(2, 2, 4, None) else {
        return;
    };
    let k0 = prepare(&g);
    let srcs = senders(4);
    let mut rng = Rng(11);
    run(&g, &srcs, &fast_plan(&mut rng, k0, 0, 50, srcs.len(), 0, Expect::Worker(0), Outcome::Fast));
    // The old data plane dies: its fds to the program and maps close, the group keeps
    // the program (and so its maps, whose socket array still holds the shard sockets).
    let Group { addr, shards, workers, steering } = g;
    drop(steering);
    let fds: Vec<BorrowedFd<'_>> = shards.iter().map(|s| s.as_fd()).collect();
    let fresh = Steering::attach(&fds, &Config::new(4)).expect("attach over sockets of a replaced program");
    let mut g = Group { addr, shards, workers, steering: fresh };
    // Nothing inserted yet in the new maps: worker 0's datagrams go to a shard.
    let k0b = derive(&SECRET0);
    g.steering.set_generation(gen(0), Some(k0b.into())).unwrap();
    run(&g, &srcs, &fast_plan(&mut rng, k0b, 0, 30, srcs.len(), 0, Expect::AnyShard, Outcome::NotLive));
    // Then the worker (with a new socket, as a reconnecting worker gets) is fast again.
    let new_sock = UdpSocket::from(fastpath::open_worker_socket(g.addr).unwrap());
    set_rcvbuf(&new_sock);
    g.workers[0] = Some(new_sock);
    g.steering.insert_worker(0, ServerId(IDS[0]), g.workers[0].as_ref().unwrap().as_fd()).unwrap();
    run(&g, &srcs, &fast_plan(&mut rng, k0b, 0, 40, srcs.len(), 0, Expect::Worker(0), Outcome::Fast));
    let c = g.steering.counters().unwrap();
    assert_eq!((c.fast, c.not_live, c.shard_select_failed), (40, 30, 0), "{c:?}");
}
