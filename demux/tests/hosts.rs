//! Several hosts behind one anycast address (docs/adr/0005-server-ids-across-hosts.md):
//! the host id in the server id. A real controller, data plane and workers on
//! 127.0.0.1.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

#[path = "controller_support/mod.rs"]
mod support;

use std::time::Duration;
use support::*;

/// `--host-bits 4 --host-id 3`: every server id the controller hands out carries host
/// 3 in its top four bits, the ids are consecutive from the host's first one, and the
/// appliance serves HTTP/3 on them (the workers' CIDs decode to those ids).
#[test]
fn server_ids_carry_the_host_id() {
    let _s = serial();
    let mut c = Controller::start("host-ids", 2, &["--host-bits", "4", "--host-id", "3"]);
    let mut ids: Vec<u64> = c.workers().iter().map(|w| w.0).collect();
    ids.sort();
    let first = 3u64 << 12;
    assert_eq!(ids, vec![first, first + 1], "{}", c.logs());
    let s = c.status().expect("status");
    assert_eq!((s["host"]["bits"].as_u64(), s["host"]["id"].as_u64()), (Some(4), Some(3)), "{s}");
    assert_eq!(s["next_server_id"].as_u64(), Some(first + 2), "{s}");
    let rt = runtime();
    let ep = {
        let _g = rt.enter();
        client_endpoint(&c.cert)
    };
    for _ in 0..4 {
        let mut h = rt.block_on(H3::connect(&ep, c.addr())).expect("connect");
        let r = rt.block_on(h.get("/bytes/1000")).expect("GET");
        h.close();
        assert_eq!((r.status, r.len), (200, 1000));
        assert!(ids.contains(&u64::from(r.server_id)), "served by {} (ids {ids:?})", r.server_id);
    }
    assert!(c.stop(Duration::from_secs(60)), "controller did not stop cleanly{}", c.logs());
}

/// A host id that does not fit the host bits, or too many host bits, is refused at
/// start with a message naming the flag.
#[test]
fn bad_host_layouts_are_refused() {
    for (args, want) in [
        (&["--host-bits", "2", "--host-id", "4"][..], "--host-id 4 does not fit in --host-bits 2"),
        (&["--host-bits", "9"][..], "--host-bits 9: at most 8"),
        (&["--host-bits", "8", "--rotate-every", "200"][..], "--rotate-every must be 1..=128"),
    ] {
        let dir = testkit::temp_dir("host-bad");
        let out = std::process::Command::new(DEMUX)
            .args(["--listen", "127.0.0.1:0", "--cores", "0", "--state-dir"])
            .arg(dir.join("state"))
            .args(args)
            .output()
            .expect("demux");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
}
