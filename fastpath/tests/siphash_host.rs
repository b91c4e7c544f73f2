//! The program's SipHash (`bpf/siphash.h`, the text `bpf/steer.bpf.c` includes)
//! compiled as ordinary host C by the system C compiler and run as a process: no BPF,
//! no privileges. It must give ADR 0004's known answer and, for a few thousand
//! random CIDs, the hash and server id `proto` computes.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proto::cid::{siphash_key, Generation, KeySet, Prf, ServerId, SipHashKey};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use testkit::Rng;

/// Builds tests/siphash_host.c against bpf/siphash.h; `None` (after reporting)
/// without a C compiler.
fn build(dir: &Path) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = dir.join("siphash_host");
    let out = Command::new(&cc)
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(root.join("bpf"))
        .arg(root.join("tests/siphash_host.c"))
        .arg("-o")
        .arg(&exe)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("{cc} failed on bpf/siphash.h:\n{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            testkit::have_tool(false, &format!("a C compiler ({cc}: {e})"));
            None
        }
    }
}

/// (h, server id) from the host build for each (key, CID).
fn run(exe: &Path, inputs: &[(SipHashKey, [u8; 12])]) -> Vec<(u64, u16)> {
    let mut child = Command::new(exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let text: String = inputs
        .iter()
        .map(|(k, c)| {
            let hex: String = c.iter().map(|b| format!("{b:02x}")).collect();
            format!("{:x} {:x} {hex}\n", k.k0, k.k1)
        })
        .collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success());
    let lines: Vec<(u64, u16)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (h, id) = l.split_once(' ').unwrap();
            (u64::from_str_radix(h, 16).unwrap(), id.parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), inputs.len());
    lines
}

/// ADR 0004 Decision 4: secret 00..1f, prefix 6a 01..08, server id 0x1234.
#[test]
fn host_build_gives_the_adr_known_answer() {
    let dir = testkit::temp_dir("siphash-host");
    let Some(exe) = build(&dir) else { return };
    let secret: [u8; 32] = std::array::from_fn(|i| i as u8);
    let key = SipHashKey::from(siphash_key(&secret));
    assert_eq!(key, SipHashKey { k0: 0xdbef_f3a1_3033_7d30, k1: 0x098d_192a_c906_4a42 });
    let mut cid = [0x6a, 1, 2, 3, 4, 5, 6, 7, 8, 0x20, 0xb6, 0x77];
    let got = run(&exe, &[(key, cid)]);
    assert_eq!(got, vec![(0xa647_6302_8e33_8232, 0x1234)]);
    // Byte 11 is not part of the hash; bytes 9..=10 carry the id.
    cid[11] = 0;
    cid[10] ^= 1;
    assert_eq!(run(&exe, &[(key, cid)]), vec![(0xa647_6302_8e33_8232, 0x1235)]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Thousands of CIDs under random keys: the C hash is proto's SipHash-2-4 of the
/// first 9 bytes, and the C server id is what `KeySet::decode` reads, both for CIDs
/// `KeySet::encode` minted and for arbitrary bytes.
#[test]
fn host_build_agrees_with_proto_on_random_cids() {
    let dir = testkit::temp_dir("siphash-host");
    let Some(exe) = build(&dir) else { return };
    let mut rng = Rng(0x5eed_0004);
    let mut inputs = Vec::new();
    let mut want = Vec::new();
    for _ in 0..16 {
        let mut secret = [0u8; 32];
        rng.fill(&mut secret);
        let g = Generation::new(rng.below(3) as u8).unwrap();
        let keys = KeySet::with_prfs((g, Prf::SipHash24, secret), None).unwrap();
        let key = keys.siphash_key(g).unwrap();
        for i in 0..250 {
            let cid: [u8; 12] = if i % 2 == 0 {
                let mut r = [0u8; 10];
                rng.fill(&mut r);
                keys.encode(ServerId(rng.next() as u16), &r)
            } else {
                let mut c = [0u8; 12];
                rng.fill(&mut c);
                c[0] = (g.get() << 6) | (c[0] & 0x3f);
                c
            };
            let h = proto::prf::siphash24([key.k0, key.k1], &cid[..9]);
            want.push((h, keys.decode(&cid).unwrap().server_id.0));
            inputs.push((key, cid));
        }
    }
    let got = run(&exe, &inputs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "CID {:02x?}", inputs[i].1);
    }
    assert_eq!(got.len(), 4000);
    let _ = std::fs::remove_dir_all(&dir);
}
