//! bpf/cid_cost.bpf.c computes what it claims (the numbers it is timed for are in
//! benches/cid_cost.rs and docs/adr/0007-quic-lb.md): `aes1` is AES-128 (FIPS-197
//! Appendix C.1, and RustCrypto's AES through proto's single-pass QUIC-LB config on
//! random blocks), `aes3` is three chained encryptions, `siphash` is ADR 0004's
//! decode (the SipHash model of tests/common), `baseline` copies.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use fastpath::cid_cost::{CostProgram, CostPrograms};
use proto::quic_lb::{Config, ConfigId, Params};

fn load(key: &[u8; 16], sip: [u64; 2]) -> Option<CostPrograms> {
    match CostPrograms::load(key, sip.into()) {
        Ok(p) => Some(p),
        Err(e) => {
            testkit::skip(&format!("BPF programs cannot be loaded here: {e}"));
            None
        }
    }
}

/// AES-128-ECB of `block` under `key` by RustCrypto, through proto's single-pass
/// QUIC-LB config (server id 1 byte + nonce 15 = one block after the first octet).
fn reference_aes(key: &[u8; 16], block: &[u8; 16]) -> [u8; 16] {
    let p = Params {
        config_id: ConfigId::new(0).unwrap(),
        server_id_len: 1,
        nonce_len: 15,
        key: Some(*key),
        self_encoded_len: false,
    };
    let mut cid = [0u8; 17];
    Config::new(p).unwrap().encode(&block[..1], &block[1..], 0, &mut cid).unwrap();
    cid[1..].try_into().unwrap()
}

#[test]
fn the_cost_programs_compute_aes_and_siphash() {
    let key: [u8; 16] = core::array::from_fn(|i| i as u8);
    let sip = derive(&SECRET0);
    let Some(mut p) = load(&key, sip) else { return };
    // FIPS-197 Appendix C.1.
    let plain: [u8; 16] = core::array::from_fn(|i| (i as u8) * 0x11);
    let want = [0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30, 0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4, 0xc5, 0x5a];
    assert_eq!(p.run(CostProgram::Aes1, &plain, 1).unwrap().0, want);
    assert_eq!(reference_aes(&key, &plain), want, "the reference is AES");
    let mut rng = Rng(0x5eed);
    for _ in 0..64 {
        let block: [u8; 16] = core::array::from_fn(|_| rng.next() as u8);
        let one = reference_aes(&key, &block);
        assert_eq!(p.run(CostProgram::Aes1, &block, 1).unwrap().0, one);
        let three = reference_aes(&key, &reference_aes(&key, &one));
        assert_eq!(p.run(CostProgram::Aes3, &block, 1).unwrap().0, three);
        assert_eq!(p.run(CostProgram::Baseline, &block, 1).unwrap().0, block);
        let (out, _) = p.run(CostProgram::SipHash, &block, 1).unwrap();
        let m = mask(sip, &block[..9]);
        assert_eq!(out[12..14], [block[9] ^ m[0], block[10] ^ m[1]]);
        assert_eq!(out[..12], block[..12]);
    }
}
