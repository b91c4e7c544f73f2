//! Compiles bpf/steer.bpf.c with clang into OUT_DIR/steer.bpf.o, which src/lib.rs
//! embeds. Without clang (or without libbpf-dev's bpf/bpf_helpers.h) the crate still
//! builds: it embeds an empty object and `Steering::attach` then fails with
//! `LoadError::Unsupported("built without clang; install clang and libbpf-dev")`.
//! With both present, a compile error is a build error (a broken program must not
//! hide behind a silent fallback).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = "bpf/steer.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let obj = out.join("steer.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());

    let missing = if Command::new(&clang).arg("--version").output().map(|o| o.status.success()).unwrap_or(false) {
        if Path::new("/usr/include/bpf/bpf_helpers.h").exists()
            || Path::new("/usr/local/include/bpf/bpf_helpers.h").exists()
        {
            None
        } else {
            Some("bpf/bpf_helpers.h not found (libbpf-dev)")
        }
    } else {
        Some("clang not found")
    };
    if let Some(why) = missing {
        println!(
            "cargo:warning=quicdemux-fastpath: {why}; embedding an empty BPF object, the kernel fast path is \
             unavailable (install clang and libbpf-dev, e.g. tools/install-deps)"
        );
        std::fs::write(&obj, b"").expect("write empty object");
        return;
    }

    // Debian keeps asm/types.h (pulled in by linux/types.h) under the multiarch triplet.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let triplet = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "x86" => "i386-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        other => panic!("quicdemux-fastpath: no multiarch include dir known for {other}"),
    };
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall"])
        .arg(format!("-I/usr/include/{triplet}"))
        .arg("-c")
        .arg(SRC)
        .arg("-o")
        .arg(&obj)
        .status()
        .expect("run clang");
    assert!(status.success(), "clang failed to compile {SRC}");
}
