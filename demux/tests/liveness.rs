//! Liveness and pressure (docs/operations.md "Liveness and pressure"): a real
//! controller, its data plane and `worker` processes on 127.0.0.1.
//!
//! - a SIGSTOPped worker under load is marked stalled (not placeable) within about a
//!   second, new connections go to the other worker, its established connections are
//!   still forwarded, and it is placeable again after SIGCONT;
//! - 1 000 idle connections on control.sock and data.sock under a lowered
//!   RLIMIT_NOFILE: status answers, CPU stays low, the log stays bounded, the idle
//!   connections are closed after the hello timeout; and with the fd limit at the
//!   number of open fds, accept fails with EMFILE without a busy loop.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use serde_json::Value;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

fn instance(lb: &Value, id: u64) -> Value {
    lb["instances"]
        .as_array()
        .and_then(|l| l.iter().find(|i| i["server_id"].as_u64() == Some(id)))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Datagrams the instance received by either path (data plane forwarding and the
/// kernel fast path).
fn received(lb: &Value, id: u64) -> u64 {
    let i = instance(lb, id);
    i["datagrams"].as_u64().unwrap_or(0) + i["fast_datagrams"].as_u64().unwrap_or(0)
}

#[test]
fn a_sigstopped_worker_is_stalled_within_a_second_and_returns_after_sigcont() {
    let _s = serial();
    let rt = runtime();
    // Every client here is 127.0.0.1: the per-client limits would refuse
    // most of 100 quick new connections (HandshakeLimited); this test is about
    // placement, not those limits.
    let c = Controller::start("stall", 2, &["--limits", "off"]);
    let addr = c.addr();
    let workers = c.workers();
    assert_eq!(workers.len(), 2, "{}", c.logs());
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    // Both workers report Load (the rule applies to them) and are placeable.
    wait_until("both instances placeable and reporting Load", Duration::from_secs(20), || {
        let lb = c.lb()?;
        workers
            .iter()
            .all(|w| {
                let i = instance(&lb, w.0);
                i["placeable"] == true && i["load_age_ms"].as_u64().is_some_and(|a| a < 1000)
            })
            .then_some(())
    });
    // An established connection to the worker we stop.
    let (victim, victim_pid) = (workers[0].0, workers[0].1);
    let other = workers[1].0;
    let mut old = None;
    for _ in 0..40 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        let r = rt.block_on(h.get("/bytes/1000")).expect("GET");
        if u64::from(r.server_id) == victim {
            old = Some(h);
            break;
        }
        h.close();
    }
    let mut old = old.expect("a connection placed on the victim within 40 tries");
    let load = Load::start(&rt, addr, &c.cert, 3, "/bytes/16384");
    load.wait_progress(20, Duration::from_secs(60));

    kill(victim_pid, libc::SIGSTOP);
    let stopped = Instant::now();
    let lb = wait_until("the stopped worker to be not placeable", Duration::from_secs(10), || {
        let lb = c.lb()?;
        (instance(&lb, victim)["placeable"] == false).then_some(lb)
    });
    let detected = stopped.elapsed();
    let v = instance(&lb, victim);
    assert_eq!(v["stalled"], true, "{v}");
    assert!(v["stalls"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(lb["liveness"]["stalls"].as_u64().unwrap_or(0) >= 1, "{lb}");
    assert_eq!(instance(&lb, other)["placeable"], true, "{lb}");
    eprintln!("stalled after {} ms", detected.as_millis());
    // The stall rule: 1 s without Load, applied every 100 ms; lb-status itself takes
    // a process start.
    assert!(detected < Duration::from_millis(1600), "not placeable only after {detected:?}");

    // The established connection to the stopped worker: its datagrams are still
    // forwarded (the request waits for the worker, then completes after SIGCONT).
    let before = received(&lb, victim);
    let pending = {
        let _g = rt.enter();
        rt.spawn(async move {
            let r = tokio::time::timeout(Duration::from_secs(60), old.get("/bytes/100000")).await;
            (r.map(|r| r.map(|r| (r.status, r.len, r.server_id)).map_err(|e| format!("{e:?}"))), old)
        })
    };

    // New connections while it is stopped: all on the other worker.
    let (mut ok, mut on_victim) = (0u32, 0u32);
    let mut errors = Vec::new();
    let probe_start = Instant::now();
    for _ in 0..100 {
        let r = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), async {
                let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e}"))?;
                let r = h.get("/bytes/1000").await.map_err(|e| format!("GET: {e:?}"))?;
                h.close();
                Ok::<_, String>(r)
            })
            .await
            .unwrap_or_else(|_| Err("timed out (5 s)".into()))
        });
        match r {
            Ok(r) if r.status == 200 && r.len == 1000 => {
                ok += 1;
                if u64::from(r.server_id) == victim {
                    on_victim += 1;
                }
            }
            Ok(r) => {
                errors.push(format!("{r:?}"));
            }
            Err(e) => {
                errors.push(e);
            }
        }
    }
    let probe_time = probe_start.elapsed();
    let lb = c.lb_wait();
    eprintln!(
        "errors: {errors:?}\nlb: reasons {} drops {} refused {} retry {} instances {}",
        lb["reasons"], lb["drops"], lb["refused"], lb["retry"], lb["instances"]
    );
    let after = received(&lb, victim);
    eprintln!(
        "during the stop: {ok} of 100 new connections ok ({on_victim} on the stopped worker) in {} ms; \
         stopped worker received {before} → {after} datagrams",
        probe_time.as_millis()
    );
    assert!(ok >= 99, "only {ok} of 100 new connections succeeded: {errors:?}{}", c.logs());
    assert_eq!(on_victim, 0);
    assert!(after > before, "the stopped worker's established connection was not forwarded ({before} → {after})");
    assert_eq!(instance(&lb, victim)["placeable"], false, "still stopped: still not placeable");

    kill(victim_pid, libc::SIGCONT);
    let resumed = Instant::now();
    wait_until("the resumed worker to be placeable again", Duration::from_secs(10), || {
        let lb = c.lb()?;
        let v = instance(&lb, victim);
        (v["placeable"] == true && v["stalled"] == false).then_some(())
    });
    eprintln!("placeable again {} ms after SIGCONT", resumed.elapsed().as_millis());
    let (r, old) = rt.block_on(pending).expect("task");
    let r = r.expect("the old connection's request did not finish within 60 s");
    assert_eq!(r, Ok((200, 100_000, victim as u16)), "the stopped worker's connection survived");
    old.close();
    // New connections reach it again.
    let mut back = false;
    for _ in 0..40 {
        let mut h = rt.block_on(H3::connect(&ep, addr)).expect("connect");
        let r = rt.block_on(h.get("/bytes/1000")).expect("GET");
        h.close();
        if u64::from(r.server_id) == victim {
            back = true;
            break;
        }
    }
    assert!(back, "no new connection placed on the resumed worker in 40 tries");
    let (lok, lfailed, lfail) = load.finish(&rt);
    eprintln!("background load: {lok} ok, {lfailed} failed {lfail:?}");
    assert_eq!(lfailed, 0, "background load lost requests: {lfail:?}{}", c.logs());
}

/// With one worker, a stall leaves no healthy instance: it is shown stalled but stays
/// placeable (an empty placement set would drop every new connection as
/// `NoInstance`), and nothing is dropped for want of an instance.
#[test]
fn the_only_worker_stays_placeable_while_stalled() {
    let _s = serial();
    let rt = runtime();
    let mut c = Controller::start("stall-one", 1, &["--limits", "off"]);
    let addr = c.addr();
    let workers = c.workers();
    assert_eq!(workers.len(), 1, "{}", c.logs());
    let (id, pid) = (workers[0].0, workers[0].1);
    wait_until("the instance placeable and reporting Load", Duration::from_secs(20), || {
        let i = instance(&c.lb()?, id);
        (i["placeable"] == true && i["load_age_ms"].as_u64().is_some_and(|a| a < 1000)).then_some(())
    });
    kill(pid, libc::SIGSTOP);
    let lb = wait_until("the stopped worker to be stalled", Duration::from_secs(10), || {
        let lb = c.lb()?;
        (instance(&lb, id)["stalled"] == true).then_some(lb)
    });
    let i = instance(&lb, id);
    assert_eq!(i["placeable"], true, "the only instance is stalled but must stay placeable: {i}");
    // A new connection meanwhile is placed on it (not dropped), and completes once
    // the worker runs again.
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    let no_instance = lb["reasons"]["NoInstance"].as_u64().unwrap_or(0);
    let pending = rt.spawn(async move {
        let mut h = H3::connect(&ep, addr).await.map_err(|e| format!("connect: {e}"))?;
        let r = h.get("/bytes/1000").await.map_err(|e| format!("GET: {e:?}"));
        h.close();
        r
    });
    std::thread::sleep(Duration::from_millis(500));
    let lb = c.lb_wait();
    assert_eq!(lb["reasons"]["NoInstance"].as_u64().unwrap_or(0), no_instance, "dropped for want of an instance: {lb}");
    kill(pid, libc::SIGCONT);
    let r = rt.block_on(pending).expect("task").expect("the connection made during the stall");
    assert_eq!((r.status, r.len), (200, 1000));
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

// ---------------------------------------------------------------------------------
// fd exhaustion and idle peers
// ---------------------------------------------------------------------------------

/// Sets the soft RLIMIT_NOFILE of `pid` (the hard limit stays, so it can go up again).
fn set_nofile(pid: i64, n: u64) {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit reading the limit of a process of ours into a live rlimit.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0, "prlimit({pid}): {}", std::io::Error::last_os_error());
    let r = libc::rlimit { rlim_cur: n.min(old.rlim_max), rlim_max: old.rlim_max };
    // SAFETY: prlimit on a process of ours with a live rlimit; no old value asked.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &r, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit({pid}, {n}): {}", std::io::Error::last_os_error());
}

fn raise_own_nofile() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on this process with a live rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

fn open_fds(pid: i64) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// utime + stime of a process, in seconds.
fn cpu_s(pid: i64) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // state is field 3 (index 0 here); utime 14, stime 15 → indices 11, 12.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (t(11) + t(12)) as f64 / hz
}

/// Non-blocking SOCK_SEQPACKET connect; `None` when the listener's backlog is full.
fn try_connect(path: &Path) -> Option<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero sockaddr_un is valid.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_encoded_bytes();
    for (d, s) in sun.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + b.len() + 1) as libc::socklen_t;
    // SAFETY: sun/len describe a valid sockaddr_un.
    let r = unsafe { libc::connect(fd, (&sun as *const libc::sockaddr_un).cast(), len) };
    (r == 0).then_some(owned)
}

/// Whether the peer has closed `fd` (EOF) — non-blocking.
fn closed_by_peer(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 256];
    // SAFETY: receives into a live buffer, non-blocking.
    let n = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
    n == 0 || (n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN))
}

/// Opens `n` connections (retrying while the backlog is full), never sending.
fn idle_flood(path: &Path, n: usize, within: Duration) -> Vec<OwnedFd> {
    let mut v = Vec::with_capacity(n);
    let deadline = Instant::now() + within;
    while v.len() < n && Instant::now() < deadline {
        match try_connect(path) {
            Some(fd) => v.push(fd),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    v
}

fn log_lines(c: &Controller, pat: &str) -> usize {
    std::fs::read_to_string(&c.log).unwrap_or_default().lines().filter(|l| l.contains(pat)).count()
}

/// Times `c.status()`, which must answer.
fn status_answers(c: &Controller, what: &str) -> Duration {
    let t = Instant::now();
    let s = c.status();
    assert!(s.is_some(), "status did not answer {what}{}", c.logs());
    t.elapsed()
}

#[test]
fn idle_connections_under_a_low_fd_limit_cost_nothing_and_are_closed() {
    let _s = serial();
    raise_own_nofile();
    let c = Controller::start("fds", 1, &[]);
    let ctl_pid = c.child.id() as i64;
    let dp_pid = c.dataplane_pid();
    set_nofile(ctl_pid, 256);
    set_nofile(dp_pid, 512);
    std::thread::sleep(Duration::from_millis(300)); // a tick: the caps follow the limit
    let (cpu_ctl, cpu_dp) = (cpu_s(ctl_pid), cpu_s(dp_pid));
    let log_before = std::fs::read_to_string(&c.log).map(|s| s.lines().count()).unwrap_or(0);
    let t0 = Instant::now();

    let ctl_idle = idle_flood(&c.control_sock(), 1000, Duration::from_secs(20));
    let data_idle = idle_flood(&c.state.join("data.sock"), 1000, Duration::from_secs(20));
    eprintln!("opened {} + {} idle connections in {} ms", ctl_idle.len(), data_idle.len(), t0.elapsed().as_millis());
    assert_eq!((ctl_idle.len(), data_idle.len()), (1000, 1000), "{}", c.logs());
    let st = status_answers(&c, "with 2 000 idle connections");
    let lb = c.lb().expect("lb-status answers");
    std::thread::sleep(Duration::from_secs(5).saturating_sub(t0.elapsed()));
    let window = t0.elapsed().as_secs_f64();
    let (d_ctl, d_dp) = (cpu_s(ctl_pid) - cpu_ctl, cpu_s(dp_pid) - cpu_dp);
    let closed = ctl_idle.iter().chain(&data_idle).filter(|f| closed_by_peer(f)).count();
    let s = c.status_wait();
    let log_after = std::fs::read_to_string(&c.log).map(|s| s.lines().count()).unwrap_or(0);
    eprintln!(
        "status in {} ms; over {window:.1} s CPU controller {d_ctl:.2} s, data plane {d_dp:.2} s; log +{} lines; \
         {closed} of 2000 closed by the peer; controller accept {}; data plane accept {}",
        st.as_millis(),
        log_after - log_before,
        s["accept"],
        lb["accept"]
    );
    assert!(d_ctl < 0.5 && d_dp < 0.5, "CPU over {window:.1} s: controller {d_ctl:.2} s, data plane {d_dp:.2} s");
    assert!(log_after - log_before < 100, "log grew by {} lines{}", log_after - log_before, c.logs());
    assert_eq!(closed, 2000, "idle connections still open after {window:.1} s (hello timeout 3 s)");
    assert!(s["accept"]["over_cap"].as_u64().unwrap_or(0) > 0, "{}", s["accept"]);
    let lb = c.lb_wait();
    let data = &lb["accept"]["data"];
    // Both listeners share the cap: an lb-status connection may evict a data one.
    let ctl = &lb["accept"]["control"];
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let gone = n(data, "over_cap") + n(data, "hello_timeouts") + n(ctl, "over_cap") + n(ctl, "hello_timeouts");
    assert!(gone >= 1000, "{}", lb["accept"]);
    drop(ctl_idle);
    drop(data_idle);

    // Now the fd limit at the data plane's open fds: accept itself fails (EMFILE).
    let open = open_fds(dp_pid) as u64;
    set_nofile(dp_pid, open + 2);
    let cpu0 = cpu_s(dp_pid);
    let warn0 = log_lines(&c, "accept failed");
    let t1 = Instant::now();
    let idle = idle_flood(&c.state.join("data.sock"), 200, Duration::from_secs(3));
    let connected = idle.len();
    std::thread::sleep(Duration::from_secs(5).saturating_sub(t1.elapsed()));
    let d = cpu_s(dp_pid) - cpu0;
    let warns = log_lines(&c, "accept failed") - warn0;
    drop(idle);
    set_nofile(dp_pid, 512);
    let lb = wait_until("lb-status after EMFILE", Duration::from_secs(20), || c.lb());
    eprintln!(
        "EMFILE phase (limit {}): {} idle connects; data plane CPU {d:.2} s over {:.1} s; {warns} 'accept failed' lines; {}",
        open + 2,
        connected,
        t1.elapsed().as_secs_f64(),
        lb["accept"]["data"]
    );
    assert!(lb["accept"]["data"]["failures"].as_u64().unwrap_or(0) >= 1, "EMFILE never hit: {}", lb["accept"]);
    assert!(d < 0.5, "data plane CPU {d:.2} s while out of fds");
    assert!((1..=10).contains(&warns), "{warns} accept-failure log lines in 5 s{}", c.logs());
    status_answers(&c, "after the EMFILE phase");

    // The same for the controller's control.sock.
    let open = open_fds(ctl_pid) as u64;
    set_nofile(ctl_pid, open + 2);
    let cpu0 = cpu_s(ctl_pid);
    let warn0 = log_lines(&c, "accept failed");
    let t2 = Instant::now();
    let idle = idle_flood(&c.control_sock(), 200, Duration::from_secs(3));
    std::thread::sleep(Duration::from_secs(5).saturating_sub(t2.elapsed()));
    let d = cpu_s(ctl_pid) - cpu0;
    let warns = log_lines(&c, "accept failed") - warn0;
    drop(idle);
    set_nofile(ctl_pid, 256);
    let s = wait_until("status after EMFILE", Duration::from_secs(20), || c.status());
    eprintln!(
        "controller EMFILE phase (limit {}): controller CPU {d:.2} s over {:.1} s; {warns} 'accept failed' lines; {}",
        open + 2,
        t2.elapsed().as_secs_f64(),
        s["accept"]
    );
    assert!(s["accept"]["failures"].as_u64().unwrap_or(0) >= 1, "EMFILE never hit: {}", s["accept"]);
    assert!(d < 0.5, "controller CPU {d:.2} s while out of fds");
    assert!((1..=10).contains(&warns), "{warns} accept-failure log lines in 5 s{}", c.logs());
}
