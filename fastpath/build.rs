//! Compiles bpf/steer.bpf.c with clang twice into OUT_DIR, which src/lib.rs embeds:
//! `steer_gso_walk.bpf.o` (with `-DSTEER_GSO_WALK`: walks the segments of GSO/GRO
//! trains, needs kfuncs, Linux >= 6.2) and `steer_size_limit.bpf.o` (the fallback:
//! sends any skb longer than the workers' largest datagram to a shard). Without clang
//! (or without libbpf-dev's bpf/bpf_helpers.h) the crate still builds: it embeds empty
//! objects and `Steering::attach` then fails with
//! `LoadError::Unsupported("built without clang; install clang and libbpf-dev")`.
//! With both present, a compile error is a build error (a broken program must not
//! hide behind a silent fallback).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = "bpf/steer.bpf.c";
/// XDP programs that measure a CID decode under BPF_PROG_TEST_RUN (src/cid_cost.rs).
const COST_SRC: &str = "bpf/cid_cost.bpf.c";
const COST_OBJECT: &str = "cid_cost.bpf.o";
const HEADERS: [&str; 2] = ["bpf/steer.h", "bpf/siphash.h"];
/// (object file, extra clang arguments) of each variant.
const VARIANTS: [(&str, &[&str]); 2] =
    [("steer_gso_walk.bpf.o", &["-DSTEER_GSO_WALK"]), ("steer_size_limit.bpf.o", &[])];

fn main() {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed={COST_SRC}");
    for h in HEADERS {
        println!("cargo:rerun-if-changed={h}");
    }
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
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
            "cargo:warning=quicdemux-fastpath: {why}; embedding empty BPF objects, the kernel fast path is \
             unavailable (install clang and libbpf-dev, e.g. tools/install-deps)"
        );
        for (obj, _) in VARIANTS {
            std::fs::write(out.join(obj), b"").expect("write empty object");
        }
        std::fs::write(out.join(COST_OBJECT), b"").expect("write empty object");
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
    let sources = VARIANTS.iter().map(|(obj, defines)| (SRC, *obj, *defines)).chain([(COST_SRC, COST_OBJECT, &[][..])]);
    for (src, obj, defines) in sources {
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall"])
            .arg(format!("-I/usr/include/{triplet}"))
            .args(defines)
            .arg("-c")
            .arg(src)
            .arg("-o")
            .arg(out.join(obj))
            .status()
            .expect("run clang");
        assert!(status.success(), "clang failed to compile {src} ({obj})");
    }
}
