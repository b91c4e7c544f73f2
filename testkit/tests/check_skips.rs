//! tools/check-skips, the CI gate on skipped tests: under CI=true a skip fails the
//! run unless it names a capability the README lists as optional.

#![allow(clippy::unwrap_used)] // a test: its own set-up may panic

use std::path::Path;
use std::process::Command;

const README: &str = "# x\n\n## Optional capabilities\n\nText.\n\n- `ipv6-loopback`: an IPv6 loopback.\n- `other-cap`: more.\n\n## Next\n\n- `not-listed`: after the section.\n";

fn run(lines: &[&str], ci: bool) -> (bool, String) {
    let d = testkit::temp_dir("chkskip");
    let log = d.join("skips");
    let readme = d.join("README.md");
    std::fs::write(&readme, README).unwrap();
    std::fs::write(&log, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/check-skips");
    let mut cmd = Command::new(script);
    cmd.arg(&log).arg(&readme).env_remove("CI");
    if ci {
        cmd.env("CI", "true");
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn no_skips_pass() {
    assert!(run(&[], true).0);
}

#[test]
fn a_required_skip_fails_only_under_ci() {
    let line = "SKIPPED: fast_path a_test: the kernel fast path is not active here";
    let (ok, out) = run(&[line], true);
    assert!(!ok, "{out}");
    assert!(out.contains("must run in CI"), "{out}");
    assert!(run(&[line], false).0);
}

#[test]
fn an_optional_skip_listed_in_the_readme_passes_and_is_printed() {
    let line = "SKIPPED: flood v6: optional capability 'ipv6-loopback': no IPv6 loopback";
    let (ok, out) = run(&[line], true);
    assert!(ok, "{out}");
    assert!(out.contains("allowed (README, optional capability 'ipv6-loopback')"), "{out}");
}

#[test]
fn a_capability_outside_the_readme_section_fails() {
    for cap in ["not-listed", "unknown"] {
        let line = format!("SKIPPED: t t: optional capability '{cap}': why");
        let (ok, out) = run(&[&line], true);
        assert!(!ok, "{cap}: {out}");
    }
}

#[test]
fn one_required_skip_among_optional_ones_fails() {
    let ok_line = "SKIPPED: a b: optional capability 'other-cap': why";
    let bad = "SKIPPED: a c: gtlsclient not installed";
    assert!(!run(&[ok_line, bad, ok_line], true).0);
}
