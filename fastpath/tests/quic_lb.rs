//! QUIC-LB generations in the kernel (docs/adr/0007-quic-lb.md), the real program on
//! real sockets: a plaintext QUIC-LB generation is steered by the server id in clear
//! (CIDs built here byte by byte from draft-21 §5.4.1, and CIDs `proto` issues);
//! another config id, a server id wider than 16 bits, or a dead id go to a shard as
//! `not_live`; an encrypted QUIC-LB generation goes to a shard, counted as
//! `quic_lb_encrypted`; the siphash-2-4 generation beside them is steered as before.
//! Every counter equals the model's; each datagram arrives where the model says.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::*;
use fastpath::GenSteering;
use proto::cid_format::CidFormat;
use proto::{KeySet, ServerId};
use std::os::fd::AsFd;

/// Generation 1: plaintext, config 2, 3-byte server ids. Generation 2: encrypted.
const CONFIG_ID: u8 = 2;
const SID_LEN: usize = 3;

/// A plaintext QUIC-LB CID (draft-21 §5.4.1): first octet = config id | 5 random
/// bits, then the server id (`SID_LEN` bytes: `lead` then the 16-bit id), then nonce.
fn plaintext_cid(rng: &mut Rng, config_id: u8, lead: u8, id: u16) -> [u8; 12] {
    let mut c = [0u8; 12];
    for b in c.iter_mut() {
        *b = rng.next() as u8;
    }
    c[0] = (config_id << 5) | (c[0] & 0x1f);
    c[1] = lead;
    c[2..4].copy_from_slice(&id.to_be_bytes());
    c
}

#[test]
fn plaintext_quic_lb_is_steered_and_encrypted_is_counted() {
    let Some(g) = group(2, 3, 4, None) else {
        return;
    };
    let k0 = derive(&SECRET0);
    g.steering.set_generation(gen(0), Some(k0.into())).unwrap();
    let plain = GenSteering::QuicLbPlaintext { config_id: CONFIG_ID, server_id_len: SID_LEN as u8 };
    g.steering.set_generation_as(gen(1), plain).unwrap();
    g.steering.set_generation_as(gen(2), GenSteering::QuicLbEncrypted).unwrap();
    let bad = GenSteering::QuicLbPlaintext { config_id: 2, server_id_len: 8 };
    assert!(g.steering.set_generation_as(gen(1), bad).is_err(), "server-id length 8 refused");
    for (slot, w) in g.workers.iter().enumerate() {
        g.steering.insert_worker(slot as u32, ServerId(IDS[slot]), w.as_ref().unwrap().as_fd()).unwrap();
    }
    // proto's own QUIC-LB generation 1 with this config: its CIDs are steered too.
    let params = proto::quic_lb::Params {
        config_id: proto::quic_lb::ConfigId::new(CONFIG_ID).unwrap(),
        server_id_len: SID_LEN as u8,
        nonce_len: (11 - SID_LEN) as u8,
        key: None,
        self_encoded_len: true,
    };
    let ks = KeySet::with_formats(
        (gen(1), proto::Prf::SipHash24, [1; 32], CidFormat::QuicLb(params)),
        Some((gen(0), proto::Prf::SipHash24, SECRET0, CidFormat::Adr1)),
    )
    .unwrap();
    let srcs = senders(6);
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut plan: Vec<Dgram> = Vec::new();
    while plan.len() < 1500 {
        let seq = plan.len() as u32;
        let src = rng.below(srcs.len() as u64) as usize;
        let w = rng.below(3) as usize;
        let first = 0x40 | ((rng.next() as u8) & 0x3f);
        let len = 33 + rng.below(1000) as usize;
        let d = match rng.below(8) {
            0 | 1 => {
                let c = plaintext_cid(&mut rng, CONFIG_ID, 0, IDS[w]);
                Dgram {
                    src,
                    bytes: short_datagram(&mut rng, first, &c, len, seq),
                    expect: Expect::Worker(w),
                    outcome: Outcome::Fast,
                }
            }
            2 => {
                let mut r = [0u8; 10];
                r.iter_mut().for_each(|b| *b = rng.next() as u8);
                let c = ks.encode(ServerId(IDS[w]), &r);
                Dgram {
                    src,
                    bytes: short_datagram(&mut rng, first, &c, len, seq),
                    expect: Expect::Worker(w),
                    outcome: Outcome::Fast,
                }
            }
            3 => {
                // Generation 1's other config id (3): not this generation's CID.
                let c = plaintext_cid(&mut rng, CONFIG_ID | 1, 0, IDS[w]);
                to_shard(src, short_datagram(&mut rng, first, &c, len, seq), Outcome::NotLive)
            }
            4 => {
                // A nonzero byte before the 16-bit id.
                let lead = 1 + (rng.next() as u8 % 255);
                let c = plaintext_cid(&mut rng, CONFIG_ID, lead, IDS[w]);
                to_shard(src, short_datagram(&mut rng, first, &c, len, seq), Outcome::NotLive)
            }
            5 => {
                let mut id = rng.next() as u16;
                while IDS.contains(&id) {
                    id = rng.next() as u16;
                }
                let c = plaintext_cid(&mut rng, CONFIG_ID, 0, id);
                to_shard(src, short_datagram(&mut rng, first, &c, len, seq), Outcome::NotLive)
            }
            6 => {
                // Generation 2 (config 4 or 5), encrypted: whatever its bytes say.
                let config_id = 4 | (rng.next() as u8 & 1);
                let c = plaintext_cid(&mut rng, config_id, 0, IDS[w]);
                to_shard(src, short_datagram(&mut rng, first, &c, len, seq), Outcome::QuicLbEncrypted)
            }
            _ => fast(&mut rng, src, 0, k0, w, seq),
        };
        plan.push(d);
    }
    let del = run(&g, &srcs, &plan);
    assert_eq!(del.at.len(), plan.len());
    let want = expected_counters(&plan);
    let have = g.steering.counters().unwrap();
    assert_eq!(have, want, "counters (left: kernel, right: model)");
    assert!(want.fast > 0 && want.not_live > 0 && want.quic_lb_encrypted > 0, "{want:?}");
    for w in 0..3 {
        let got = del.per_worker.get(&w).copied().unwrap_or(0);
        assert!(got > 0);
        assert_eq!(g.steering.worker_fast(w as u32).unwrap(), got, "worker_fast({w})");
    }
    // Generation 1 back to inactive: its CIDs go to a shard as unknown_generation.
    g.steering.set_generation_as(gen(1), GenSteering::Inactive).unwrap();
    let c = plaintext_cid(&mut rng, CONFIG_ID, 0, IDS[0]);
    let plan = vec![to_shard(0, short_datagram(&mut rng, 0x40, &c, 100, 0), Outcome::UnknownGeneration)];
    run(&g, &srcs, &plan);
    let after = g.steering.counters().unwrap();
    assert_eq!(after.unknown_generation, have.unknown_generation + 1);
}
