//! The controller under live HTTP/3 load (the lifecycle events of docs/operations.md):
//! a real `demux --state-dir`
//! controller, its data plane and `worker` processes on 127.0.0.1, quinn + h3
//! clients. One test at a time (two cores); every wait bounded.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};
use support::*;

const MIB: u64 = 1 << 20;

fn ids(v: &[(u64, i64, String)]) -> Vec<u64> {
    let mut x: Vec<u64> = v.iter().map(|w| w.0).collect();
    x.sort();
    x
}

fn ready_count(c: &Controller) -> usize {
    c.workers().iter().filter(|w| w.2 == "ready").count()
}

fn assert_no_failures(what: &str, ok: u64, failed: u64, failures: &[String], c: &Controller) {
    assert!(failed == 0 && failures.is_empty(), "{what}: {failed} failed requests ({ok} ok): {failures:?}{}", c.logs());
}

/// scale-out: a worker that registers receives new connections only, and only once
/// it is ready (placeable); connections to the first worker stay there.
#[test]
fn scale_out_new_worker_gets_only_new_connections_after_ready() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("out", 1, &[]);
    let addr = c.addr();
    let first = c.workers()[0].0 as u16;
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let mut old = Vec::new();
    for _ in 0..4 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        let r = rt.block_on(h.get("/bytes/1000")).expect("GET");
        assert_eq!(r.server_id, first);
        old.push(h);
    }
    let load = Load::start(&rt, addr, &c.cert, 3, "/bytes/65536");
    load.wait_progress(6, Duration::from_secs(60));

    // A registered instance that is live but never says Ready receives nothing, even
    // while new connections arrive (a minimal worker speaking the protocol by hand).
    use proto::wire::{Announce, Data, Message, Registration, Window, PROTOCOL_VERSION};
    let ctl = seqpacket_connect(&c.control_sock());
    let announce = Announce::plain(Window::OWN);
    send_raw(&ctl, &Registration::Hello { announce, pid: std::process::id() }.to_record());
    let welcome = Registration::decode(&recv_raw(&ctl));
    assert_eq!(welcome, Ok(Registration::Welcome { version: PROTOCOL_VERSION, caps: 0 }), "{}", c.logs());
    let Ok(Registration::Assign { server_id: unready, .. }) = Registration::decode(&recv_raw(&ctl)) else {
        panic!("no Assign{}", c.logs())
    };
    let data = seqpacket_connect(&c.state.join("data.sock"));
    send_raw(&data, &Data::DataHello { announce, server_id: unready }.to_record());
    assert!(matches!(Data::decode(&recv_raw(&data)), Ok(Data::Welcome { .. })));
    assert!(matches!(Data::decode(&recv_raw(&data)), Ok(Data::Sockets { .. })));
    wait_until("the unready instance to be live", Duration::from_secs(20), || {
        c.instances().iter().any(|i| i.0 == u64::from(unready.0) && !i.1).then_some(())
    });
    for _ in 0..10 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        assert_eq!(rt.block_on(h.get("/bytes/1000")).expect("GET").server_id, first);
        h.close();
    }
    let i = c.instances();
    let u = i.iter().find(|i| i.0 == u64::from(unready.0)).expect("unready instance listed");
    assert_eq!((u.1, u.2), (false, 0), "a live but unready instance was given datagrams");
    drop(data);
    drop(ctl);
    wait_until("the unready instance to be gone", Duration::from_secs(20), || {
        (!c.instances().iter().any(|i| i.0 == u64::from(unready.0))).then_some(())
    });

    c.start_external();
    // Until the new instance is placeable, nothing reaches it.
    let mut samples_unplaceable = 0;
    let new_id = wait_until("the new instance to become placeable", Duration::from_secs(60), || {
        let inst = c.instances();
        for (id, placeable, dgrams) in &inst {
            if *id != u64::from(first) && !placeable {
                samples_unplaceable += 1;
                assert_eq!(*dgrams, 0, "instance {id} received datagrams before it was ready{}", c.logs());
            }
        }
        inst.iter().find(|i| i.0 != u64::from(first) && i.1).map(|i| i.0 as u16)
    });
    eprintln!("scale-out: new instance {new_id}; {samples_unplaceable} samples saw it live but unplaceable");
    assert!(new_id > first, "server ids are monotonic");

    // Established connections stay where they are.
    for h in old.iter_mut() {
        let r = rt.block_on(h.get("/bytes/100000")).expect("GET on an old connection");
        assert_eq!(r.server_id, first, "an established connection moved");
    }
    // New connections reach the new instance too (rendezvous placement over 2).
    let mut on_new = 0;
    for _ in 0..40 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        let r = rt.block_on(h.get("/bytes/1000")).expect("GET");
        on_new += usize::from(r.server_id == new_id);
        h.close();
        if on_new >= 2 {
            break;
        }
    }
    assert!(on_new >= 1, "no new connection reached the new instance");
    let (ok, failed, f) = load.finish(&rt);
    assert_no_failures("scale-out", ok, failed, &f, &c);
    for h in old {
        h.close();
    }
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// scale-in (an instance drains) and a rolling reload (SIGHUP: every spawned worker
/// replaced one at a time) with 1 MiB responses in flight: 0 failed requests.
#[test]
fn scale_in_and_rolling_reload_with_1mib_responses_lose_nothing() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("reload", 2, &[]);
    let ext = c.start_external();
    wait_until("3 ready workers", Duration::from_secs(60), || (ready_count(&c) == 3).then_some(()));
    let addr = c.addr();
    let load = Load::start(&rt, addr, &c.cert, 6, &format!("/bytes/{MIB}"));
    load.wait_progress(6, Duration::from_secs(120));

    // Scale-in: the external worker drains while downloads run on it.
    let ext_pid = c.externals[ext].id() as i64;
    kill(ext_pid, libc::SIGTERM);
    let st = wait_until("the drained worker to exit", Duration::from_secs(60), || {
        c.externals[ext].try_wait().ok().flatten()
    });
    assert!(st.success(), "drained worker exit: {st}");
    load.wait_progress(4, Duration::from_secs(120));

    // Rolling reload.
    let before: Vec<u64> = ids(&c.workers());
    kill(c.child.id() as i64, libc::SIGHUP);
    wait_until("the rolling reload to replace both workers", Duration::from_secs(150), || {
        let s = c.status()?;
        let w = c.workers();
        let done =
            s["reloading"] == false && w.len() == 2 && w.iter().all(|x| x.2 == "ready" && !before.contains(&x.0));
        done.then_some(())
    });
    load.wait_progress(4, Duration::from_secs(120));
    let (ok, failed, f) = load.finish(&rt);
    eprintln!("reload: {ok} × 1 MiB ok");
    assert_no_failures("scale-in + rolling reload", ok, failed, &f, &c);
    assert!(ok >= 14);
    assert_eq!(c.status_wait()["worker_replacements"], 0, "a reload is not a crash");
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// A client that rebinds its UDP socket every second keeps downloading while its
/// instance drains (scale-in): routing follows the connection ID.
#[test]
fn client_rebinding_every_second_across_scale_in_finishes() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("rebind", 0, &[]);
    c.start_external();
    c.start_external();
    wait_until("2 ready workers", Duration::from_secs(60), || (ready_count(&c) == 2).then_some(()));
    let addr = c.addr();
    let workers = c.workers();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    let owner = rt.block_on(h.get("/bytes/10")).expect("GET").server_id;
    let owner_pid = workers.iter().find(|w| w.0 == u64::from(owner)).expect("owner registered").1;

    let size = 5 * MIB;
    let download = rt.spawn(async move {
        let r = h.get_paced(&format!("/bytes/{size}"), Some(MIB)).await;
        h.close();
        r
    });
    let mut rebinds = 0;
    let start = Instant::now();
    let mut drained = false;
    while !download.is_finished() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_secs(1));
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let _g = rt.enter();
        ep.rebind(sock).expect("rebind");
        rebinds += 1;
        if !drained && rebinds == 1 {
            kill(owner_pid, libc::SIGTERM); // scale-in of the owner, mid-download
            drained = true;
        }
    }
    let r = rt.block_on(download).expect("join").unwrap_or_else(|e| panic!("download failed: {e:?}{}", c.logs()));
    assert_eq!((r.status, r.len, r.pattern_ok, r.server_id), (200, size, true, owner));
    assert!(rebinds >= 2, "only {rebinds} rebinds");
    let exited = wait_until("the drained owner to exit", Duration::from_secs(60), || {
        c.externals.iter_mut().find(|e| e.id() as i64 == owner_pid).and_then(|e| e.try_wait().ok().flatten())
    });
    assert!(exited.success());
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// Data-plane SIGKILL: the controller restarts it on the same sockets; downloads on
/// established connections finish.
#[test]
fn dataplane_sigkill_is_restarted_on_the_same_sockets_and_downloads_finish() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("dpkill", 2, &[]);
    let addr = c.addr();
    let sockets_before = c.status_wait()["sockets"].clone();
    let dp = c.dataplane_pid();
    let old_dp_inodes = socket_inodes(dp);
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let size = 4 * MIB;
    let downloads = paced_downloads(&rt, &ep, addr, 4, size, Some(MIB));
    std::thread::sleep(Duration::from_millis(1500));
    let cmdline = |pid: i64| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let grace = |c: &[u8]| c.split(|b| *b == 0).any(|a| a == b"--rejoin-grace-ms");
    let first_cmdline = cmdline(dp);
    assert!(!first_cmdline.is_empty(), "the data plane's command line");
    kill(dp, libc::SIGKILL);
    let s = wait_until("the data plane to be restarted", Duration::from_secs(30), || {
        let s = c.status()?;
        let pid = s["dataplane"]["pid"].as_i64()?;
        (pid != dp && s["dataplane"]["restarts"] == 1 && s["dataplane"]["state"] == "running").then_some(s)
    });
    assert_eq!(s["sockets"], sockets_before, "the controller's socket list is unchanged");
    // What the data planes actually serve: the controller's UDP sockets (by inode)
    // are open in the old data plane before the kill and in the restarted one after,
    // and the restarted one reports the same listen address.
    let ctl_pid = c.child.id() as i64;
    let ctl_inodes: std::collections::BTreeSet<u64> = sockets_before
        .as_array()
        .unwrap()
        .iter()
        .map(|x| socket_inode(ctl_pid, x["fd"].as_i64().unwrap()).expect("the controller's socket fd"))
        .collect();
    assert_eq!(ctl_inodes.len(), sockets_before.as_array().unwrap().len(), "{sockets_before}");
    assert!(
        ctl_inodes.is_subset(&old_dp_inodes),
        "old data plane {old_dp_inodes:?} vs the controller's {ctl_inodes:?}"
    );
    let new_dp = s["dataplane"]["pid"].as_i64().unwrap();
    assert!(!grace(&first_cmdline), "a first data plane has nobody to wait for");
    assert!(grace(&cmdline(new_dp)), "a restarted data plane holds orphans while the workers rejoin");
    let new_dp_inodes = socket_inodes(new_dp);
    assert!(
        ctl_inodes.is_subset(&new_dp_inodes),
        "the restarted data plane {new_dp} must serve the controller's sockets {ctl_inodes:?}, it holds {new_dp_inodes:?}"
    );
    let lb = c.lb_wait();
    assert_eq!(
        (lb["pid"].as_i64(), lb["listen"].clone()),
        (Some(new_dp), serde_json::json!([addr.to_string()])),
        "{lb}"
    );
    for (id, d) in downloads {
        let r = rt.block_on(d).expect("join").unwrap_or_else(|e| panic!("download failed: {e:?}{}", c.logs()));
        assert_eq!((r.status, r.len, r.pattern_ok, r.server_id), (200, size, true, id));
    }
    wait_until("both instances placeable again", Duration::from_secs(30), || {
        let i = c.instances();
        (i.len() == 2 && i.iter().all(|x| x.1)).then_some(())
    });
    // New connections work too.
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect after restart");
    assert_eq!(rt.block_on(h.get("/bytes/100000")).expect("GET").len, 100_000);
    h.close();
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// Controller SIGKILL and restart: the data plane and workers keep serving meanwhile
/// and are adopted (same data-plane pid, same server ids); traffic continues; the
/// adopted processes obey the new controller (SIGTERM stops them all).
#[test]
fn controller_restart_adopts_the_data_plane_and_workers() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("ctlkill", 2, &[]);
    let addr = c.addr();
    // One data-plane restart first: the count survives the controller restart.
    kill(c.dataplane_pid(), libc::SIGKILL);
    wait_until("a data-plane restart", Duration::from_secs(30), || {
        let s = c.status()?;
        (s["dataplane"]["restarts"] == 1 && s["dataplane"]["state"] == "running").then_some(())
    });
    wait_until("both instances back", Duration::from_secs(30), || {
        let i = c.instances();
        (i.len() == 2 && i.iter().all(|x| x.1)).then_some(())
    });
    let dp = c.dataplane_pid();
    let before = ids(&c.workers());
    let load = Load::start(&rt, addr, &c.cert, 3, "/bytes/262144");
    load.wait_progress(6, Duration::from_secs(60));

    kill(c.child.id() as i64, libc::SIGKILL);
    let _ = c.child.wait();
    load.wait_progress(4, Duration::from_secs(60)); // no controller: still served
    c.launch();
    let s = wait_until("adoption", Duration::from_secs(60), || {
        let s = c.status()?;
        let w = c.workers();
        (ids(&w) == before && w.iter().all(|x| x.2 == "ready")).then_some(s)
    });
    assert_eq!(s["dataplane"]["adopted"], true, "{s}");
    assert_eq!(s["dataplane"]["pid"].as_i64(), Some(dp));
    assert_eq!(s["dataplane"]["restarts"], 1, "restarts on these sockets survive the controller restart");
    let text = std::process::Command::new(DEMUX).arg("status").arg("--state-dir").arg(&c.state).output().expect("run");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("data plane pid {dp}")) && text.contains("(adopted)"), "{text}");
    assert!(s["workers"].as_array().is_some_and(|l| l.iter().all(|w| w["rejoined"] == true && w["managed"] == true)));
    load.wait_progress(6, Duration::from_secs(60));
    let (ok, failed, f) = load.finish(&rt);
    assert_no_failures("controller restart", ok, failed, &f, &c);

    let pids: Vec<i64> = c.workers().iter().map(|w| w.1).chain([dp]).collect();
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
    wait_until("adopted processes to exit", Duration::from_secs(20), || pids.iter().all(|p| !alive(*p)).then_some(()));
}

/// Scale-in by restarting the controller with a smaller `--spawn-workers`: it adopts
/// both workers and drains the extra one, under 1 MiB load: 0 failed requests.
#[test]
fn controller_restart_with_fewer_workers_drains_the_extra_one() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("scalein", 2, &[]);
    let addr = c.addr();
    let before = c.workers();
    let load = Load::start(&rt, addr, &c.cert, 4, &format!("/bytes/{MIB}"));
    load.wait_progress(4, Duration::from_secs(120));
    kill(c.child.id() as i64, libc::SIGKILL);
    let _ = c.child.wait();
    c.spawn = 1;
    c.launch();
    let left = wait_until("one worker left", Duration::from_secs(90), || {
        let w = c.workers();
        (w.len() == 1 && w[0].2 == "ready").then_some(w)
    });
    let gone: Vec<i64> = before.iter().map(|w| w.1).filter(|p| *p != left[0].1).collect();
    wait_until("the extra worker to exit", Duration::from_secs(60), || gone.iter().all(|p| !alive(*p)).then_some(()));
    assert!(before.iter().any(|w| w.0 == left[0].0), "the remaining worker is an adopted one");
    load.wait_progress(4, Duration::from_secs(120));
    let (ok, failed, f) = load.finish(&rt);
    assert_no_failures("scale-in by restart", ok, failed, &f, &c);
    assert_eq!(c.status_wait()["worker_replacements"], 0);
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// Controller and data plane both gone: the new controller opens new sockets, so
/// the old workers must not keep sending on the old ones — their Rejoin is refused
/// (or, spawned ones, they are sent SIGTERM) and they drain and exit; new workers
/// serve.
#[test]
fn controller_restart_without_its_data_plane_retires_the_old_workers() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("fresh", 1, &[]);
    let ext = c.start_external();
    wait_until("2 ready workers", Duration::from_secs(60), || (ready_count(&c) == 2).then_some(()));
    let old = c.workers();
    let spawned_pid = old.iter().map(|w| w.1).find(|p| *p != c.externals[ext].id() as i64).expect("spawned worker");
    let dp = c.dataplane_pid();
    kill(c.child.id() as i64, libc::SIGKILL);
    let _ = c.child.wait();
    kill(dp, libc::SIGKILL);
    wait_until("the old data plane to die", Duration::from_secs(10), || (!alive(dp)).then_some(()));
    c.launch();
    let st = wait_until("the refused external worker to exit", Duration::from_secs(90), || {
        c.externals[ext].try_wait().ok().flatten()
    });
    assert!(st.success(), "a refused worker drains and exits 0: {st}");
    wait_until("the old spawned worker to exit", Duration::from_secs(60), || (!alive(spawned_pid)).then_some(()));
    let s = c.status_wait();
    assert_eq!(s["dataplane"]["adopted"], false);
    let w = c.workers();
    let max_old = old.iter().map(|w| w.0).max().unwrap_or(0);
    assert!(w.len() == 1 && w[0].0 > max_old && w[0].2 == "ready", "{w:?}");
    let log = std::fs::read_to_string(c.dir.join("external-0.log")).unwrap_or_default();
    assert!(log.contains("refused the rejoin"), "{log}");
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let addr = c.addr();
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    let r = rt.block_on(h.get("/bytes/100000")).expect("GET");
    assert_eq!((r.len, u64::from(r.server_id)), (100_000, w[0].0));
    h.close();
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// Worker SIGKILL: its client's next packets reach another instance, which answers
/// with a stateless reset; the client reconnects; the controller replaces the worker
/// under a new server id.
#[test]
fn worker_sigkill_gives_stateless_reset_and_reconnect_succeeds() {
    let _s = serial();
    let rt = runtime();
    let c = Controller::start("wkill", 2, &[]);
    let addr = c.addr();
    let load = Load::start(&rt, addr, &c.cert, 2, "/bytes/65536");
    load.wait_progress(4, Duration::from_secs(60));
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    let victim = rt.block_on(h.get("/bytes/10")).expect("GET").server_id;
    let pid = c.workers().iter().find(|w| w.0 == u64::from(victim)).expect("victim registered").1;
    let departed = c.reason("Departed");
    kill(pid, libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(300));
    let reason = rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(10), h.get("/bytes/1000")).await;
        tokio::time::timeout(Duration::from_secs(20), h.conn.closed()).await
    });
    assert!(
        matches!(reason, Ok(quinn::ConnectionError::Reset)),
        "expected a stateless reset, got {reason:?}{}",
        c.logs()
    );
    assert!(c.reason("Departed") > departed, "the dead instance's packets are routed as Departed");
    let mut h2 = rt.block_on(H3::connect(&ep, addr)).expect("reconnect");
    let r = rt.block_on(h2.get("/bytes/100000")).expect("GET after reconnect");
    assert_eq!((r.status, r.len), (200, 100_000));
    assert_ne!(r.server_id, victim);
    h2.close();
    wait_until("the replacement worker", Duration::from_secs(60), || {
        let s = c.status()?;
        let w = c.workers();
        (s["worker_replacements"] == 1 && w.len() == 2 && w.iter().all(|x| x.2 == "ready" && x.0 != u64::from(victim)))
            .then_some(())
    });
    assert!(c.workers().iter().any(|w| w.0 > u64::from(victim)), "the replacement gets a new, higher server id");
    let (ok, failed, f) = load.finish(&rt);
    // The load's connections on the killed worker were reset before their head or
    // after it; only requests accepted by the surviving worker must all succeed.
    eprintln!("worker kill: load {ok} ok, {failed} lost with the killed worker: {f:?}");
    assert!(ok > 4);
    let mut c = c;
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// Key rotation mid-connection (`demux rotate-keys`): the data plane and workers get
/// the new generation, established connections (old-generation CIDs) still route to
/// their owners, new ones work; without a controller the file itself rotates.
#[test]
fn key_rotation_mid_connection_old_cids_still_route() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("rotate", 2, &[]);
    let addr = c.addr();
    let load = Load::start(&rt, addr, &c.cert, 2, "/bytes/262144");
    let (ep, mut conns) = connections(&rt, &c, 4);
    assert_eq!(c.status_wait()["key_newest"], 0);
    // Established datagrams reach their owner by the user path (Owner) or, for a
    // generation the kernel decodes, by the fast path: count both.
    let to_owners = |c: &Controller| c.reason("Owner") + c.lb_wait()["fast_path"]["datagrams"].as_u64().unwrap_or(0);
    let owner_before = to_owners(&c);
    let out =
        std::process::Command::new(DEMUX).arg("rotate-keys").arg("--state-dir").arg(&c.state).output().expect("run");
    assert!(out.status.success(), "rotate-keys: {}", String::from_utf8_lossy(&out.stderr));
    let s = c.status_wait();
    assert_eq!((s["key_newest"].as_u64(), s["key_previous"].as_u64()), (Some(1), Some(0)));
    let lb = c.lb_wait();
    assert_eq!((lb["key_newest"].as_u64(), lb["key_previous"].as_u64()), (Some(1), Some(0)));
    for (id, h) in conns.iter_mut() {
        let r = rt.block_on(h.get("/bytes/262144")).unwrap_or_else(|e| panic!("GET after rotation: {e:?}{}", c.logs()));
        assert_eq!((r.len, r.server_id), (262_144, *id), "an old-generation connection lost its owner");
    }
    assert!(to_owners(&c) > owner_before);
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect after rotation");
    assert_eq!(rt.block_on(h.get("/bytes/1000")).expect("GET").len, 1000);
    h.close();
    load.wait_progress(4, Duration::from_secs(60));
    let (ok, failed, f) = load.finish(&rt);
    assert_no_failures("key rotation", ok, failed, &f, &c);
    for (_, h) in conns {
        h.close();
    }
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
    // No controller running: the key file itself rotates (newest 2, previous 1) —
    // `--force`: this is within three CID lifetimes of the rotation above.
    let out = std::process::Command::new(DEMUX)
        .arg("rotate-keys")
        .arg("--state-dir")
        .arg(&c.state)
        .arg("--force")
        .output()
        .expect("run");
    assert!(out.status.success(), "offline rotate-keys: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(c.state.join("keys")).expect("key file");
    let k = proto::keyfile::KeyFile::parse(&text).expect("key file parses");
    assert_eq!((k.keys.newest.generation.get(), k.keys.previous.map(|p| p.generation.get())), (2, Some(1)));
}

/// 100 000 malformed datagrams during the load: 0 failed requests, every one counted
/// (NotQuic).
#[test]
fn malformed_datagrams_during_load_are_all_counted_and_harmless() {
    let _s = serial();
    let rt = runtime();
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let mut c = Controller::start("junk", 2, &["--metrics", &metrics.to_string()]);
    let addr = c.addr();
    let load = Load::start(&rt, addr, &c.cert, 3, "/bytes/65536");
    load.wait_progress(6, Duration::from_secs(60));
    let base = c.reason("NotQuic");
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let total: u64 = 100_000;
    let started = Instant::now();
    let mut buf = [0u8; 1200];
    let mut sent = 0u64;
    while sent < total {
        // Bursts of 2 500, then let the data plane catch up (no kernel drops).
        for _ in 0..2_500 {
            let len = 1 + (next() % 1200) as usize;
            for b in buf[..len].iter_mut() {
                *b = next() as u8;
            }
            buf[0] &= 0x3f; // short header, fixed bit clear: not QUIC (ADR 0001)
            sock.send_to(&buf[..len], addr).expect("send");
            sent += 1;
        }
        wait_until("the data plane to catch up", Duration::from_secs(30), || {
            (c.reason("NotQuic") - base + 500 >= sent).then_some(())
        });
        assert!(started.elapsed() < Duration::from_secs(120), "sending took too long");
    }
    let counted = wait_until("every malformed datagram counted", Duration::from_secs(30), || {
        let n = c.reason("NotQuic") - base;
        (n >= total).then_some(n)
    });
    assert_eq!(counted, total, "each malformed datagram counted exactly once under NotQuic");
    // The Prometheus endpoint shows the same count and both instances.
    let text = http_get(metrics);
    assert!(text.contains(&format!("quicdemux_routed_total{{reason=\"NotQuic\"}} {}", base + total)), "{text}");
    assert_eq!(text.matches("quicdemux_instance_placeable{server_id=").count(), 2, "{text}");
    assert!(text.contains("quicdemux_workers{state=\"ready\"} 2"), "{text}");
    // The kernel fast path's counters (the load's short headers go that way).
    if c.lb_wait()["fast_path"]["active"].as_bool() == Some(true) {
        assert!(text.contains("quicdemux_fast_path_active 1"), "{text}");
        let fast = text
            .lines()
            .find_map(|l| l.strip_prefix("quicdemux_fast_path_datagrams_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("fast-path datagrams metric");
        assert!(fast > 0, "the load's established datagrams took the fast path: {text}");
        assert_eq!(text.matches("quicdemux_instance_fast_datagrams_total{server_id=").count(), 2, "{text}");
        assert!(text.contains("quicdemux_fast_path_to_demux_total{why=\"short_packet\"}"), "{text}");
    } else {
        testkit::skip("fast-path metrics: the fast path is not active here");
    }
    load.wait_progress(4, Duration::from_secs(60));
    let (ok, failed, f) = load.finish(&rt);
    assert_no_failures("malformed datagrams", ok, failed, &f, &c);
    assert_eq!(c.lb_wait()["drops"]["truncated"], 0);
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

fn http_get(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// Automatic rotation every `--rotate-every` instance starts: the start that crosses
/// it makes a new generation; connections on the previous one keep routing.
#[test]
fn automatic_rotation_every_n_starts() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("autorot", 1, &["--rotate-every", "2"]);
    let addr = c.addr();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
    let first = rt.block_on(h.get("/bytes/1000")).expect("GET").server_id;
    // `next_server_id` advances by one per registration, and the registering worker
    // gets the id it showed before.
    let next = |c: &Controller| c.status_wait()["next_server_id"].as_u64().expect("next_server_id");
    let worker_ids = |c: &Controller| c.workers().iter().map(|w| w.0).collect::<std::collections::BTreeSet<u64>>();
    let (n0, ids0) = (next(&c), worker_ids(&c));
    assert_eq!(ids0.iter().copied().collect::<Vec<_>>(), vec![u64::from(first)]);
    assert_eq!(n0, u64::from(first) + 1, "one registration so far");
    c.start_external(); // 2nd start in generation 0
    wait_until("2 ready workers", Duration::from_secs(60), || (ready_count(&c) == 2).then_some(()));
    assert_eq!(c.status_wait()["key_newest"], 0);
    assert_eq!(next(&c), n0 + 1, "advanced by one");
    assert_eq!(worker_ids(&c).difference(&ids0).copied().collect::<Vec<_>>(), vec![n0], "the new worker got it");
    c.start_external(); // 3rd start: rotates first
    wait_until("3 ready workers", Duration::from_secs(60), || (ready_count(&c) == 3).then_some(()));
    assert_eq!(next(&c), n0 + 2, "advanced by one again");
    assert!(worker_ids(&c).contains(&(n0 + 1)), "the third worker got the next id");
    let s = c.status_wait();
    assert_eq!((s["key_newest"].as_u64(), s["key_previous"].as_u64()), (Some(1), Some(0)), "{s}");
    assert_eq!(s["starts_in_generation"], 1);
    let lb = c.lb_wait();
    assert_eq!((lb["key_newest"].as_u64(), lb["key_previous"].as_u64()), (Some(1), Some(0)));
    let r = rt.block_on(h.get("/bytes/100000")).expect("GET on a generation-0 connection");
    assert_eq!((r.len, r.server_id), (100_000, first));
    for _ in 0..6 {
        let mut n = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        assert_eq!(rt.block_on(n.get("/bytes/1000")).expect("GET").len, 1000);
        n.close();
    }
    h.close();
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// Bad input: a malformed control message closes that connection with a logged
/// reason; the controller keeps serving. A corrupt or foreign-mode state file stops
/// start-up with a clear error.
#[test]
fn malformed_control_messages_and_bad_state_files() {
    let _s = serial();
    let mut c = Controller::start("bad", 1, &[]);
    let fd = seqpacket_connect(&c.control_sock());
    use proto::wire::{Message, Registration};
    send_raw(&fd, &[0xc7, proto::wire::PROTOCOL_VERSION, 0xf0, 1, 2, 3]);
    let reply = recv_raw(&fd);
    let m = Registration::decode(&reply).expect("an Error reply");
    assert!(matches!(&m, Registration::Error { reason } if reason.contains("malformed")), "{m:?}");
    assert!(recv_raw(&fd).is_empty(), "the connection is closed after the Error");
    // Still serving.
    assert_eq!(c.status_wait()["dataplane"]["state"], "running");
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(log.contains("malformed control message"), "reason logged");
    assert!(c.stop(Duration::from_secs(60)));

    // Corrupt key file: refuses to start, names the file, never makes a new key.
    let keys = c.state.join("keys");
    let good = std::fs::read_to_string(&keys).expect("keys");
    std::fs::write(&keys, "quicdemux-keys 1\nnewest 0 zz\n").expect("corrupt");
    let err = start_refused(&c.state);
    assert!(err.contains("corrupt"), "{err}");
    assert_eq!(std::fs::read_to_string(&keys).expect("keys"), "quicdemux-keys 1\nnewest 0 zz\n");
    // Group-readable key file: refused too.
    std::fs::write(&keys, &good).expect("restore");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let err = start_refused(&c.state);
    assert!(err.contains("0600"), "{err}");
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // Owned by another uid (root here can chown): refused.
    // SAFETY: plain chown(2)/getuid(2) on a path we created.
    let me = unsafe { libc::getuid() };
    if me == 0 {
        let cpath = std::ffi::CString::new(keys.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::chown(cpath.as_ptr(), 4242, 4242) }, 0);
        let err = start_refused(&c.state);
        assert!(err.contains("belongs to uid 4242"), "{err}");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::chown(cpath.as_ptr(), me, me) }, 0);
    }
    // Corrupt counter: refused.
    std::fs::write(c.state.join("server-id"), "garbage\n").expect("corrupt");
    let err = start_refused(&c.state);
    assert!(err.contains("server-id"), "{err}");
}

/// The kernel fast path carries established traffic without the data plane: with the
/// data plane SIGSTOPped, downloads already running continue and complete (their
/// short headers go from the kernel straight to the workers' own sockets), while a
/// new connection waits (its Initial needs the user path) and completes once the data
/// plane runs again.
#[test]
fn established_downloads_finish_while_the_data_plane_is_stopped() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("dpstop", 2, &[]);
    let addr = c.addr();
    let lb = c.lb_wait();
    if lb["fast_path"]["active"].as_bool() != Some(true) {
        assert!(std::env::var_os("CI").is_none(), "the fast path must be active in CI: {}", lb["fast_path"]);
        testkit::skip(&format!("the kernel fast path is not active here: {}", lb["fast_path"]["reason"]));
        return;
    }
    let st =
        std::process::Command::new(DEMUX).args(["status", "--state-dir"]).arg(&c.state).output().expect("demux status");
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(text.contains("fast path: on (mode auto)"), "demux status says the fast path runs: {text}");
    let dp = c.dataplane_pid();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let size = 8 * MIB;
    let downloads = paced_downloads(&rt, &ep, addr, 4, size, Some(2 * MIB));
    std::thread::sleep(Duration::from_millis(500));
    let fast_before = c.lb_wait()["fast_path"]["datagrams"].as_u64().unwrap_or(0);
    kill(dp, libc::SIGSTOP);
    let stopped_at = Instant::now();
    // A new connection meanwhile: its Initial waits in the shard's socket.
    let pending = {
        let ep = ep.clone();
        rt.spawn(async move {
            let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e:#}"))?;
            let r = h.get("/bytes/1000").await.map_err(|e| format!("GET: {e:?}"));
            h.close();
            r
        })
    };
    for (id, d) in downloads {
        let r = rt.block_on(d).expect("join").unwrap_or_else(|e| panic!("download failed: {e:?}{}", c.logs()));
        assert_eq!((r.status, r.len, r.pattern_ok, r.server_id), (200, size, true, id));
    }
    let all_done = stopped_at.elapsed();
    // A new connection cannot complete without the data plane: still waiting, or (on a
    // loaded machine, past the client's connect bound) given up — never answered.
    let early = pending.is_finished();
    kill(dp, libc::SIGCONT);
    let r = rt.block_on(pending).expect("join");
    if early {
        assert!(r.is_err(), "a new connection completed while the data plane was stopped: {r:?}");
    } else {
        let r = r.expect("the new connection completes after SIGCONT");
        assert_eq!((r.status, r.len), (200, 1000));
    }
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect after SIGCONT");
    assert_eq!(rt.block_on(h.get("/bytes/1000")).expect("GET after SIGCONT").len, 1000);
    h.close();
    eprintln!("4 × {size} bytes finished {all_done:?} after the data plane stopped");
    let lb = c.lb_wait();
    // That they finished at all shows the kernel carried them (nothing else forwards
    // while the data plane is stopped). The counter must show it too: a receiving
    // quinn client acknowledges at least every max_ack_delay (25 ms, RFC 9000
    // §13.2.1); a quarter of that rate over the stopped time, per connection, is a
    // floor for the increase across the stop that a counter left still (or counting
    // only the user path) misses.
    let floor = 4 * (all_done.as_millis() as u64 / 100);
    let fast_after = lb["fast_path"]["datagrams"].as_u64().unwrap_or(0);
    assert!(
        fast_after.saturating_sub(fast_before) >= floor,
        "fast path carried {fast_before} → {fast_after} datagrams, at least {floor} more expected: {}",
        lb["fast_path"]
    );
    assert_eq!(c.dataplane_pid(), dp, "the data plane was stopped, never restarted");
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// A rotation that switches the PRF (`rotate-keys --prf hmac-sha256`, then back to
/// `siphash-2-4`) while connections live: both generations decode at once, the
/// siphash-2-4 one in the kernel and the hmac-sha256 one in the data plane, and every
/// connection keeps its owner.
#[test]
fn rotation_across_a_prf_switch_keeps_every_connection() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("rotprf", 2, &[]);
    let addr = c.addr();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    // `force`: within three CID lifetimes of the previous rotation (pacing).
    let rotate = |prf: &str, force: bool| {
        let out = std::process::Command::new(DEMUX)
            .args(["rotate-keys", "--prf", prf, "--state-dir"])
            .arg(&c.state)
            .args(force.then_some("--force"))
            .output()
            .expect("run rotate-keys");
        assert!(out.status.success(), "rotate-keys --prf {prf}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let mut conns = Vec::new();
    let connect = |conns: &mut Vec<(u16, H3)>| {
        for _ in 0..2 {
            let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
            let id = rt.block_on(h.get("/bytes/1000")).expect("GET").server_id;
            conns.push((id, h));
        }
    };
    connect(&mut conns); // generation 0, siphash-2-4
    rotate("hmac-sha256", false);
    let s = c.status_wait();
    assert_eq!(
        (s["key_newest_prf"].as_str(), s["key_previous_prf"].as_str()),
        (Some("hmac-sha256"), Some("siphash-2-4"))
    );
    connect(&mut conns); // generation 1, hmac-sha256: the user path only
    let lb0 = c.lb_wait();
    for (id, h) in conns.iter_mut() {
        let r =
            rt.block_on(h.get("/bytes/200000")).unwrap_or_else(|e| panic!("GET across the switch: {e:?}{}", c.logs()));
        assert_eq!((r.len, r.server_id), (200_000, *id));
    }
    let lb1 = c.lb_wait();
    let grew = |p: &str| {
        lb1.pointer(p).and_then(|v| v.as_u64()).unwrap_or(0) - lb0.pointer(p).and_then(|v| v.as_u64()).unwrap_or(0)
    };
    if lb1["fast_path"]["active"].as_bool() == Some(true) {
        assert!(grew("/fast_path/datagrams") > 0, "the siphash-2-4 connections kept the fast path");
        assert!(grew("/fast_path/to_demux/unknown_generation") > 0, "the hmac-sha256 ones went to the data plane");
    }
    assert!(grew("/reasons/Owner") > 0, "the data plane routed the hmac-sha256 generation's datagrams");
    // Generation 2 at once (--force): generation 0's connections are now two rotations old.
    rotate("siphash-2-4", true);
    let s = c.status_wait();
    assert_eq!(
        (s["key_newest_prf"].as_str(), s["key_previous_prf"].as_str()),
        (Some("siphash-2-4"), Some("hmac-sha256"))
    );
    for (id, h) in conns.iter_mut().skip(2) {
        let r = rt
            .block_on(h.get("/bytes/1000"))
            .unwrap_or_else(|e| panic!("GET after the switch back: {e:?}{}", c.logs()));
        assert_eq!(r.server_id, *id);
    }
    let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect on the new generation");
    assert_eq!(rt.block_on(h.get("/bytes/1000")).expect("GET").len, 1000);
    h.close();
    for (_, h) in conns {
        h.close();
    }
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// `n` connections to `addr`, each downloading `/bytes/SIZE` (paced at `pace` bytes/s)
/// after a first small GET: (the server id that answered it, the download).
fn paced_downloads(
    rt: &tokio::runtime::Runtime,
    ep: &quinn::Endpoint,
    addr: std::net::SocketAddr,
    n: usize,
    size: u64,
    pace: Option<u64>,
) -> Vec<(u16, tokio::task::JoinHandle<Result<Resp, ReqError>>)> {
    (0..n)
        .map(|_| {
            let mut h = rt.block_on(H3::connect(ep, addr)).expect("connect");
            let id = rt.block_on(h.get("/bytes/10")).expect("GET").server_id;
            let download = rt.spawn(async move {
                let r = h.get_paced(&format!("/bytes/{size}"), pace).await;
                h.close();
                r
            });
            (id, download)
        })
        .collect()
}

/// `demux --state-dir STATE` on a state directory it must refuse: its stderr, once
/// it has failed.
fn start_refused(state: &std::path::Path) -> String {
    let out = std::process::Command::new(DEMUX)
        .args(["--listen", "127.0.0.1:0", "--cores", "0", "--state-dir"])
        .arg(state)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started on a bad state directory: {err}");
    err
}
