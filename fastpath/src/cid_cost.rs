//! What a CID decode costs inside an eBPF program (docs/adr/0007-quic-lb.md):
//! bpf/cid_cost.bpf.c's XDP programs run by BPF_PROG_TEST_RUN, never attached.
//! `benches/cid_cost.rs` times them (the kernel's own per-run average);
//! `tests/cid_cost.rs` checks what they compute (FIPS-197, a SipHash model).

use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder};
use proto::cid::SipHashKey;
use std::ffi::OsStr;
use std::io;
use std::time::Duration;

static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cid_cost.bpf.o"));

/// One of the programs (bpf/cid_cost.bpf.c has what each computes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostProgram {
    /// 16 bytes through the stack: the harness's own cost.
    Baseline,
    /// ADR 0004's SipHash-2-4 decode of a 12-byte CID; the id at bytes 12..=13.
    SipHash,
    /// One AES-128 block encryption.
    Aes1,
    /// Three chained AES-128 encryptions: a 3-pass Feistel decode's AES work.
    Aes3,
}

impl CostProgram {
    pub const ALL: [CostProgram; 4] =
        [CostProgram::Baseline, CostProgram::SipHash, CostProgram::Aes1, CostProgram::Aes3];

    pub fn name(self) -> &'static str {
        match self {
            CostProgram::Baseline => "baseline",
            CostProgram::SipHash => "siphash",
            CostProgram::Aes1 => "aes1",
            CostProgram::Aes3 => "aes3",
        }
    }
}

/// The loaded programs with their keys set.
pub struct CostPrograms {
    obj: Object,
}

fn other(what: String) -> io::Error {
    io::Error::other(what)
}

impl CostPrograms {
    /// Loads the object (needs CAP_BPF; fails on a build without clang) and writes the
    /// AES-128 round keys of `aes_key` and the SipHash key.
    pub fn load(aes_key: &[u8; 16], siphash: SipHashKey) -> io::Result<CostPrograms> {
        if OBJECT.is_empty() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "built without clang"));
        }
        let open = ObjectBuilder::default().open_memory(OBJECT).map_err(|e| other(format!("open: {e:#}")))?;
        let obj = open.load().map_err(|e| other(format!("load: {e:#}")))?;
        let p = CostPrograms { obj };
        p.write("cost_aes_key", &aes128_round_keys(aes_key))?;
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&siphash.k0.to_ne_bytes());
        k[8..].copy_from_slice(&siphash.k1.to_ne_bytes());
        p.write("cost_siphash", &k)?;
        Ok(p)
    }

    fn write(&self, name: &str, value: &[u8]) -> io::Result<()> {
        let map = self
            .obj
            .maps()
            .find(|m| m.name() == OsStr::new(name))
            .ok_or_else(|| other(format!("map {name} missing")))?;
        map.update(&0u32.to_ne_bytes(), value, MapFlags::ANY).map_err(|e| other(format!("{name}: {e:#}")))
    }

    /// Runs `which` `repeat` times (at least once) on a 64-byte packet starting with
    /// `block`: the packet's first 16 bytes afterwards and the kernel's average time
    /// per run.
    pub fn run(&mut self, which: CostProgram, block: &[u8; 16], repeat: u32) -> io::Result<([u8; 16], Duration)> {
        let prog = self
            .obj
            .progs_mut()
            .find(|p| p.name() == OsStr::new(which.name()))
            .ok_or_else(|| other(format!("program {} missing", which.name())))?;
        let mut data_in = [0u8; 64];
        data_in[..16].copy_from_slice(block);
        let mut data_out = [0u8; 64];
        let input = libbpf_rs::ProgramInput {
            data_in: Some(&data_in),
            data_out: Some(&mut data_out),
            repeat,
            ..Default::default()
        };
        let out = prog.test_run(input).map_err(|e| other(format!("test run {}: {e:#}", which.name())))?;
        // XDP_PASS (2): the block was long enough and the maps were there.
        if out.return_value != 2 {
            return Err(other(format!("{} returned {}", which.name(), out.return_value)));
        }
        let duration = out.duration;
        let mut block = [0u8; 16];
        block.copy_from_slice(&data_out[..16]);
        Ok((block, duration))
    }
}

/// FIPS-197 §5.2 key expansion: the 11 round keys of AES-128, 176 bytes.
pub fn aes128_round_keys(key: &[u8; 16]) -> [u8; 176] {
    let mut w = [0u8; 176];
    w[..16].copy_from_slice(key);
    let mut rcon = 1u8;
    for i in 4..44 {
        let mut t = [w[4 * i - 4], w[4 * i - 3], w[4 * i - 2], w[4 * i - 1]];
        if i % 4 == 0 {
            t = [
                SBOX[usize::from(t[1])] ^ rcon,
                SBOX[usize::from(t[2])],
                SBOX[usize::from(t[3])],
                SBOX[usize::from(t[0])],
            ];
            rcon = (rcon << 1) ^ if rcon & 0x80 != 0 { 0x1b } else { 0 };
        }
        for j in 0..4 {
            w[4 * i + j] = w[4 * i - 16 + j] ^ t[j];
        }
    }
    w
}

/// The AES S-box (FIPS-197 Figure 7).
const SBOX: [u8; 256] = [
    0x63, 0x7c, 0x77, 0x7b, 0xf2, 0x6b, 0x6f, 0xc5, 0x30, 0x01, 0x67, 0x2b, 0xfe, 0xd7, 0xab, 0x76, 0xca, 0x82, 0xc9,
    0x7d, 0xfa, 0x59, 0x47, 0xf0, 0xad, 0xd4, 0xa2, 0xaf, 0x9c, 0xa4, 0x72, 0xc0, 0xb7, 0xfd, 0x93, 0x26, 0x36, 0x3f,
    0xf7, 0xcc, 0x34, 0xa5, 0xe5, 0xf1, 0x71, 0xd8, 0x31, 0x15, 0x04, 0xc7, 0x23, 0xc3, 0x18, 0x96, 0x05, 0x9a, 0x07,
    0x12, 0x80, 0xe2, 0xeb, 0x27, 0xb2, 0x75, 0x09, 0x83, 0x2c, 0x1a, 0x1b, 0x6e, 0x5a, 0xa0, 0x52, 0x3b, 0xd6, 0xb3,
    0x29, 0xe3, 0x2f, 0x84, 0x53, 0xd1, 0x00, 0xed, 0x20, 0xfc, 0xb1, 0x5b, 0x6a, 0xcb, 0xbe, 0x39, 0x4a, 0x4c, 0x58,
    0xcf, 0xd0, 0xef, 0xaa, 0xfb, 0x43, 0x4d, 0x33, 0x85, 0x45, 0xf9, 0x02, 0x7f, 0x50, 0x3c, 0x9f, 0xa8, 0x51, 0xa3,
    0x40, 0x8f, 0x92, 0x9d, 0x38, 0xf5, 0xbc, 0xb6, 0xda, 0x21, 0x10, 0xff, 0xf3, 0xd2, 0xcd, 0x0c, 0x13, 0xec, 0x5f,
    0x97, 0x44, 0x17, 0xc4, 0xa7, 0x7e, 0x3d, 0x64, 0x5d, 0x19, 0x73, 0x60, 0x81, 0x4f, 0xdc, 0x22, 0x2a, 0x90, 0x88,
    0x46, 0xee, 0xb8, 0x14, 0xde, 0x5e, 0x0b, 0xdb, 0xe0, 0x32, 0x3a, 0x0a, 0x49, 0x06, 0x24, 0x5c, 0xc2, 0xd3, 0xac,
    0x62, 0x91, 0x95, 0xe4, 0x79, 0xe7, 0xc8, 0x37, 0x6d, 0x8d, 0xd5, 0x4e, 0xa9, 0x6c, 0x56, 0xf4, 0xea, 0x65, 0x7a,
    0xae, 0x08, 0xba, 0x78, 0x25, 0x2e, 0x1c, 0xa6, 0xb4, 0xc6, 0xe8, 0xdd, 0x74, 0x1f, 0x4b, 0xbd, 0x8b, 0x8a, 0x70,
    0x3e, 0xb5, 0x66, 0x48, 0x03, 0xf6, 0x0e, 0x61, 0x35, 0x57, 0xb9, 0x86, 0xc1, 0x1d, 0x9e, 0xe1, 0xf8, 0x98, 0x11,
    0x69, 0xd9, 0x8e, 0x94, 0x9b, 0x1e, 0x87, 0xe9, 0xce, 0x55, 0x28, 0xdf, 0x8c, 0xa1, 0x89, 0x0d, 0xbf, 0xe6, 0x42,
    0x68, 0x41, 0x99, 0x2d, 0x0f, 0xb0, 0x54, 0xbb, 0x16,
];

#[cfg(test)]
mod tests {
    /// FIPS-197 Appendix A.1: the last round key of 2b7e1516 28aed2a6 abf71588 09cf4f3c.
    #[test]
    fn key_expansion_matches_fips_197() {
        let key = [0x2b, 0x7e, 0x15, 0x16, 0x28, 0xae, 0xd2, 0xa6, 0xab, 0xf7, 0x15, 0x88, 0x09, 0xcf, 0x4f, 0x3c];
        let w = super::aes128_round_keys(&key);
        assert_eq!(w[16..20], [0xa0, 0xfa, 0xfe, 0x17]);
        assert_eq!(
            w[160..176],
            [0xd0, 0x14, 0xf9, 0xa8, 0xc9, 0xee, 0x25, 0x89, 0xe1, 0x3f, 0x0c, 0xc8, 0xb6, 0x63, 0x0c, 0xa6]
        );
    }
}
