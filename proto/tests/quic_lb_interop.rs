//! Interop: CIDs made by `proto::quic_lb` decoded by a QUIC-LB decoder that is not
//! this project's code, `testkit/py/quic_lb_ref.py` (written from
//! draft-ietf-quic-load-balancers-21, AES from Python's `cryptography`, which aioquic
//! installs). The decoder first checks the draft's vectors itself (`--self-test`);
//! then one python3 process reads every request on stdin and answers on stdout.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

mod common;

use common::rng::Rng;
use proto::quic_lb::{
    Config, ConfigId, ConfigSet, Params, Unroutable, KEY_LEN, MAX_CID_LEN, MAX_PLAINTEXT_LEN, MAX_SERVER_ID_LEN,
    MIN_NONCE_LEN,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn script() -> String {
    testkit::bin::python_script("quic_lb_ref.py").display().to_string()
}

fn have_python_cryptography() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    testkit::have_tool(ok, "python3 with cryptography (pip install aioquic brings it)")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Sends every request line to one reference decoder process and returns its answers,
/// one per request (a writer thread, so neither pipe can fill up and block both sides).
fn ask_reference(requests: Vec<String>) -> Vec<String> {
    let mut child = Command::new("python3").arg(script()).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let n = requests.len();
    let writer = std::thread::spawn(move || {
        for r in requests {
            writeln!(stdin, "{r}").unwrap();
        }
    });
    let answers: Vec<String> = BufReader::new(child.stdout.take().unwrap()).lines().map(Result::unwrap).collect();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(answers.len(), n, "one answer per request");
    answers
}

/// What the reference decoder must answer for `cid` under `set`.
fn expected(set: &ConfigSet, cid: &[u8]) -> String {
    match set.decode(cid) {
        Ok(d) => format!("sid {} {}", d.config_id.get(), hex(d.server_id.as_bytes())),
        Err(Unroutable::Empty) => "unroutable empty".into(),
        Err(Unroutable::Marked) => "unroutable marked".into(),
        Err(Unroutable::UnknownConfig(_)) => "unroutable unknown-config".into(),
        Err(Unroutable::TooShort) => "unroutable too-short".into(),
    }
}

#[test]
fn reference_decoder_passes_the_draft_vectors() {
    if !have_python_cryptography() {
        return;
    }
    let out = Command::new("python3").arg(script()).arg("--self-test").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(", 0 failures"), "{text}");
}

/// Every valid (server id length, nonce length), keyed and plaintext, with and without
/// length self-encoding, over all seven config ids: CIDs for many server ids (with
/// random extra bytes on some), and for each config a few unroutable ones. The
/// reference decoder recovers exactly the server id `proto::quic_lb` encoded, and
/// agrees on why the others are unroutable.
#[test]
fn reference_decoder_recovers_our_server_ids() {
    if !have_python_cryptography() {
        return;
    }
    let mut rng = Rng::new(0x0b1b);
    let mut requests = Vec::new();
    let mut want = Vec::new();
    let mut routed = 0;
    let mut config_number = 0u8;
    let mut set = ConfigSet::new();
    for sid_len in 1..=MAX_SERVER_ID_LEN {
        for nonce_len in MIN_NONCE_LEN..=MAX_PLAINTEXT_LEN - sid_len {
            for (keyed, self_encoded_len) in [(false, false), (false, true), (true, false), (true, true)] {
                let config_id = ConfigId::new(config_number % 7).unwrap();
                config_number = config_number.wrapping_add(1);
                let key: Option<[u8; KEY_LEN]> = keyed.then(|| rng.array());
                let p = Params {
                    config_id,
                    server_id_len: sid_len as u8,
                    nonce_len: nonce_len as u8,
                    key,
                    self_encoded_len,
                };
                let c = Config::new(p).unwrap();
                // Both decoders hold the latest config of each config id.
                set.insert(c.clone());
                let key_hex = key.map_or("-".to_string(), |k| hex(&k));
                requests.push(format!("config {} {sid_len} {nonce_len} {key_hex}", config_id.get()));
                want.push("ok".to_string());
                for i in 0..8 {
                    let server_id = rng.bytes(sid_len);
                    let nonce = rng.bytes(nonce_len);
                    let extra = if i % 2 == 1 { rng.below(MAX_CID_LEN - c.cid_len() + 1) } else { 0 };
                    let mut cid = rng.bytes(c.cid_len() + extra);
                    c.encode(&server_id, &nonce, rng.u8(), &mut cid).unwrap();
                    requests.push(format!("decode {}", hex(&cid)));
                    want.push(format!("sid {} {}", config_id.get(), hex(&server_id)));
                    assert_eq!(expected(&set, &cid), want[want.len() - 1]);
                    routed += 1;
                }
                // Unroutable: 0b111, one byte too short; and another config id, unknown
                // in the first groups, later another config's decode of these bytes.
                let mut cid = rng.bytes(c.cid_len());
                c.encode(&rng.bytes(sid_len), &rng.bytes(nonce_len), 0, &mut cid).unwrap();
                let other = (config_id.get() + 1 + rng.below(6) as u8) % 7;
                for bad in [
                    [&[0xe0 | (cid[0] & 0x1f)][..], &cid[1..]].concat(),
                    [&[(other << 5) | (cid[0] & 0x1f)][..], &cid[1..]].concat(),
                    cid[..cid.len() - 1].to_vec(),
                ] {
                    requests.push(format!("decode {}", hex(&bad)));
                    want.push(expected(&set, &bad));
                }
            }
        }
    }
    assert_eq!(routed, 120 * 4 * 8);
    let got = ask_reference(requests.clone());
    for ((r, w), g) in requests.iter().zip(&want).zip(&got) {
        assert_eq!(g, w, "reference decoder on `{r}`");
    }
    // The unroutable reasons are all there.
    for reason in ["marked", "unknown-config", "too-short"] {
        assert!(got.iter().any(|g| g.ends_with(reason)), "{reason}");
    }
}
