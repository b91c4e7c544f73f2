// Build information for `--version` (also included by worker/build.rs): the git
// commit, `git rev-parse --short=12 HEAD`, with `-dirty` when tracked files differ
// from it, or `unknown` outside a git checkout (a source tarball). Re-run when HEAD
// moves, the index changes or this package's sources change; an edit elsewhere in
// the work tree alone does not refresh `-dirty` until one of those happens.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) => {
            // `git diff --quiet` exits 1 when tracked files differ from HEAD (and writes
            // nothing, unlike `git status`, so it does not itself trigger a re-run).
            let dirty =
                Command::new("git").args(["diff", "--quiet", "HEAD", "--"]).status().is_ok_and(|s| s.code() == Some(1));
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=QUICDEMUX_GIT_COMMIT={commit}");
    let mut watch: Vec<String> =
        ["HEAD", "index"].iter().filter_map(|p| git(&["rev-parse", "--git-path", p])).collect();
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.extend(git(&["rev-parse", "--git-path", &branch]));
    }
    for p in watch {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
}
