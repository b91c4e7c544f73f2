//! The per-source limit sketches against plain,
//! obviously right models (exact-model testing):
//! - (a) the lane arithmetic against per-lane loops over 100 000 random words;
//! - (b) `ConcurrencySketch` against an exact live count per client over 200 000+
//!   random acquires and releases in a small shared table: nobody over the cap, every
//!   admission allowed by the exact count, the table back to zero, honest refusals
//!   under 1 % at the documented load (limits module docs);
//! - (c) `RateSketch` against exact per-client GCRA on the same tick grid over 300 000
//!   steps with pauses (a window, an hour, …) that force epoch rebases: whenever the
//!   sketch admits, exact GCRA admits too; honest refusals under 1 %;
//! - (d) two threads hammering one word of a `ConcurrencySketch`: the bound holds and
//!   the word returns to zero; two threads through a `RateSketch` that rebases all the
//!   time: never more than GCRA's bound in any interval;
//! - targeted cases: a neighbour (one shared lane) of a client at its limit loses
//!   nothing in either sketch, a twin does; the seed's counterexample to conservative
//!   update; cap and parameter edges; rate tests fail after 120 s instead of hanging
//!   (a rebase that does not move the epoch loops forever).
//!
//! The exact models are fed only the connections the sketch admitted (a refused
//! connection never happened), which is the history the server actually sees.
#![allow(clippy::unwrap_used)] // tests and benches may panic on their own setup

use proto::limits::lanes::{lane, LANE_LIMIT, LANE_MAX};
use proto::limits::{
    lane_pair, lanes_at_least, sub_sat, ClientKey, ConcurrencySketch, Gcra, LanePair, RateSketch, Ticket, DEFAULT_GCRA,
    MAX_CAP,
};
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// SplitMix64: reproducible randomness without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    fn key(&mut self) -> [u8; 16] {
        let mut k = [0; 16];
        k[..8].copy_from_slice(&self.next().to_le_bytes());
        k[8..].copy_from_slice(&self.next().to_le_bytes());
        k
    }
}

fn client(i: usize) -> ClientKey {
    ClientKey::from(Ipv4Addr::from(0x0a00_0000 + i as u32))
}

/// Two clients whose lane pairs (in a one-word table, as `locate` reports them) share
/// exactly `shared` lanes (1: a neighbour; 2: a twin).
fn two_clients(locate: impl Fn(ClientKey) -> (usize, LanePair), shared: usize) -> (ClientKey, ClientKey) {
    for i in 0..1000 {
        for j in i + 1..1000 {
            let (pa, pb) = (locate(client(i)).1.lanes(), locate(client(j)).1.lanes());
            let n = [pa.0, pa.1].iter().filter(|l| **l == pb.0 || **l == pb.1).count();
            if n == shared {
                return (client(i), client(j));
            }
        }
    }
    unreachable!("6 pairs among 1000 clients")
}

/// Runs `f` on its own thread and fails (instead of hanging the suite) if it takes
/// longer than `secs`; a hung thread is left spinning until the test binary exits.
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(h.join().unwrap_err()),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("still running after {secs} s: hung"),
    }
}

// ---------------------------------------------------------------- (a) lane arithmetic

fn lanes_of(w: u64) -> [u64; 4] {
    [0, 1, 2, 3].map(|i| (w >> (16 * i)) & 0xffff)
}

/// A random word with every lane below 2^15; lanes often near `near`, to hit the
/// boundary of the comparison.
fn word_near(r: &mut Rng, near: u64) -> u64 {
    let mut w = 0;
    for i in 0..4 {
        let v = match r.below(4) {
            0 => r.below(LANE_LIMIT),
            1 => near.saturating_sub(1).min(LANE_MAX),
            2 => near.min(LANE_MAX),
            _ => (near + r.below(3)).min(LANE_MAX).saturating_sub(r.below(3)),
        };
        w |= v << (16 * i);
    }
    w
}

fn limit(r: &mut Rng) -> u64 {
    match r.below(5) {
        0 => 0,
        1 => LANE_LIMIT,
        2 => r.below(64),
        _ => r.below(LANE_LIMIT + 1),
    }
}

#[test]
fn lanes_at_least_matches_loop() {
    let mut r = Rng(1);
    for _ in 0..100_000 {
        let l = limit(&mut r);
        let w = word_near(&mut r, l);
        let mut want = 0;
        for (i, v) in lanes_of(w).into_iter().enumerate() {
            if v >= l {
                want |= 0x8000 << (16 * i);
            }
        }
        assert_eq!(lanes_at_least(w, l), want, "word {w:#018x} limit {l}");
    }
}

#[test]
fn sub_sat_matches_loop() {
    let mut r = Rng(2);
    for _ in 0..100_000 {
        let d = limit(&mut r);
        let w = word_near(&mut r, d);
        let mut want = 0;
        for (i, v) in lanes_of(w).into_iter().enumerate() {
            want |= v.saturating_sub(d) << (16 * i);
        }
        assert_eq!(sub_sat(w, d), want, "word {w:#018x} d {d}");
    }
}

#[test]
fn lane_pairs_are_six_and_even() {
    let mut r = Rng(3);
    let mut seen = [0u32; 6];
    for _ in 0..60_000 {
        let p = lane_pair(r.next());
        let (a, b) = p.lanes();
        assert!(a < b && b < 4);
        assert_eq!(p.ones(), (1 << (16 * a)) | (1 << (16 * b)));
        assert_eq!(p.high(), p.ones() << 15);
        assert_eq!(LanePair::from_id(p.id()), Some(p));
        seen[p.id() as usize] += 1;
    }
    // 10 000 expected each; 5 sigma is about 500.
    for n in seen {
        assert!((9_500..=10_500).contains(&n), "{seen:?}");
    }
    let all: HashSet<(u32, u32)> = (0..6).map(|i| LanePair::from_id(i).unwrap().lanes()).collect();
    assert_eq!(all.len(), 6);
    assert_eq!(LanePair::from_id(6), None);
}

#[test]
fn client_keys() {
    let a: Ipv6Addr = "2001:db8:1:2:aaaa::1".parse().unwrap();
    let b: Ipv6Addr = "2001:db8:1:2:ffff:1:2:3".parse().unwrap();
    let c: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
    assert_eq!(ClientKey::from(a), ClientKey::from(b), "one /64");
    assert_ne!(ClientKey::from(a), ClientKey::from(c));
    assert_eq!(ClientKey::from(a), ClientKey::V6Prefix(0x2001_0db8_0001_0002));
    let v4 = Ipv4Addr::new(192, 0, 2, 7);
    assert_eq!(ClientKey::from(IpAddr::V6(v4.to_ipv6_mapped())), ClientKey::V4(v4));
    assert_ne!(ClientKey::from(v4), ClientKey::from(Ipv4Addr::new(192, 0, 2, 8)));
    // IPv4 0.0.0.0 and the IPv6 prefix 0 must not share a hash input.
    let h = proto::limits::ClientHasher::new([9; 16]);
    assert_ne!(h.hash(ClientKey::V4(Ipv4Addr::UNSPECIFIED)), h.hash(ClientKey::V6Prefix(0)));
}

#[test]
fn tickets_pack_into_32_bits() {
    let s = ConcurrencySketch::new(1 << 10, [1; 16]);
    for i in 0..100 {
        let t = s.try_acquire(client(i), 4).unwrap();
        let (idx, pair) = (t.index(), t.pair());
        assert_eq!((idx, pair), s.locate(client(i)));
        let t = Ticket::from_raw(t.to_raw()).unwrap();
        assert_eq!((t.index(), t.pair()), (idx, pair));
        s.release(t);
    }
    assert!((0..s.words()).all(|i| s.word(i) == 0));
    assert!(Ticket::from_raw(7).is_none());
}

// ------------------------------------------------------ (b) the concurrency sketch

struct ConcRun {
    honest_tries: u64,
    honest_refused: u64,
    admitted: u64,
    abuser_refused_with_room: u64,
    ops: u64,
}

/// `ops` random acquires and releases over `clients` clients in a table of `words`
/// words, `abusers` of them pushing past `cap` and rarely letting go; the abusers
/// change halfway. Honest clients hold at most `cap / 2`.
fn conc_run(seed: u64, words: usize, clients: usize, abusers: usize, cap: u16, ops: u64) -> ConcRun {
    let mut r = Rng(seed);
    let s = ConcurrencySketch::new(words, r.key());
    let keys: Vec<ClientKey> = (0..clients).map(client).collect();
    let loc: Vec<(usize, LanePair)> = keys.iter().map(|&k| s.locate(k)).collect();
    let mut live: Vec<u16> = vec![0; clients];
    let mut tickets: Vec<Vec<Ticket>> = (0..clients).map(|_| Vec::new()).collect();
    let demand: Vec<u16> = (0..clients).map(|_| 1 + r.below(u64::from(cap / 2)) as u16).collect();
    let mut abusive: Vec<bool> = vec![false; clients];
    let pick = |r: &mut Rng, abusive: &mut Vec<bool>| {
        abusive.iter_mut().for_each(|a| *a = false);
        for _ in 0..abusers {
            abusive[r.below(clients as u64) as usize] = true;
        }
    };
    pick(&mut r, &mut abusive);
    let mut run = ConcRun { honest_tries: 0, honest_refused: 0, admitted: 0, abuser_refused_with_room: 0, ops };
    for op in 0..ops {
        if op == ops / 2 {
            pick(&mut r, &mut abusive);
        }
        // A third of the operations go to the abusers, the rest to everybody.
        let c = if abusers > 0 && r.chance(1, 3) {
            let ab: Vec<usize> = (0..clients).filter(|&i| abusive[i]).collect();
            ab[r.below(ab.len() as u64) as usize]
        } else {
            r.below(clients as u64) as usize
        };
        let acquire = if abusive[c] { r.chance(9, 10) } else { live[c] < demand[c] && r.chance(1, 2) };
        if acquire {
            let exact_allows = live[c] < cap;
            match s.try_acquire(keys[c], cap) {
                Some(t) => {
                    assert!(exact_allows, "op {op}: client {c} admitted with {} live, cap {cap}", live[c]);
                    assert_eq!((t.index(), t.pair()), loc[c]);
                    live[c] += 1;
                    tickets[c].push(t);
                    run.admitted += 1;
                }
                None if exact_allows && !abusive[c] => run.honest_refused += 1,
                None if exact_allows => run.abuser_refused_with_room += 1,
                None => {}
            }
            if !abusive[c] && exact_allows {
                run.honest_tries += 1;
            }
        } else if let Some(i) = (!tickets[c].is_empty()).then(|| r.below(tickets[c].len() as u64) as usize) {
            s.release(tickets[c].swap_remove(i));
            live[c] -= 1;
        }
        if op % 4096 == 0 || op == ops - 1 {
            // Plain update: every lane is exactly the sum of its clients' live counts,
            // and at most 3 * cap.
            let mut want = vec![0u64; s.words()];
            for (i, &(w, p)) in loc.iter().enumerate() {
                want[w] += u64::from(live[i]) * p.ones();
            }
            for (w, &v) in want.iter().enumerate() {
                assert_eq!(s.word(w), v, "op {op}: word {w}");
                assert!(lanes_at_least(v, 3 * u64::from(cap) + 1) == 0, "op {op}: lane above 3 * cap");
            }
        }
    }
    for (c, ts) in tickets.iter_mut().enumerate() {
        for t in ts.drain(..) {
            s.release(t);
            live[c] -= 1;
        }
    }
    assert!((0..s.words()).all(|w| s.word(w) == 0), "table not back to zero");
    run
}

#[test]
fn concurrency_sketch_against_exact_counts() {
    // The documented load (limits module docs): 2 * words clients, words / 64 of them
    // abusers at the cap, in a 1024-word table; cap 8 as in the seed (more collisions
    // than the real 64; ~340 pairs of twins).
    let words = 1024;
    let run = conc_run(11, words, 2 * words, words / 64, 8, 240_000);
    let rate = run.honest_refused as f64 / run.honest_tries as f64;
    eprintln!(
        "concurrency: {} ops, {} admitted, honest refusals {}/{} = {:.3} %, abusers refused below the cap {}",
        run.ops,
        run.admitted,
        run.honest_refused,
        run.honest_tries,
        100.0 * rate,
        run.abuser_refused_with_room
    );
    assert!(run.honest_tries > 50_000);
    assert!(rate < 0.01, "honest refusal rate {rate}");
}

#[test]
fn concurrency_sketch_crowded_table_keeps_the_bound() {
    // Far beyond the documented load (8 clients a word, a quarter of them abusive):
    // refusals are many, the bound still holds.
    let run = conc_run(12, 16, 128, 32, 5, 200_000);
    eprintln!("crowded: honest refusals {}/{}", run.honest_refused, run.honest_tries);
}

#[test]
fn concurrency_cap_edges() {
    let s = ConcurrencySketch::new(1, [3; 16]);
    assert!(s.try_acquire(client(1), 0).is_none(), "cap 0 refuses");
    let mut held = Vec::new();
    while let Some(t) = s.try_acquire(client(1), u16::MAX) {
        held.push(t);
        assert!(held.len() <= usize::from(MAX_CAP));
    }
    assert_eq!(held.len(), usize::from(MAX_CAP), "cap clamped to MAX_CAP");
    held.into_iter().for_each(|t| s.release(t));
    assert_eq!(s.word(0), 0);
}

/// The seed's counterexample to conservative update, with lanes chosen by hand: A on
/// (L1, L3), B on (L1, L2). With plain update B stays bounded after A leaves.
#[test]
fn concurrency_conservative_counterexample() {
    let s = ConcurrencySketch::new(1, [5; 16]);
    let (a, b) = two_clients(|c| s.locate(c), 1);
    let cap = 6;
    let ta: Vec<Ticket> = (0..5).map(|_| s.try_acquire(a, cap).unwrap()).collect();
    let mut tb: Vec<Ticket> = (0..3).map(|_| s.try_acquire(b, cap).unwrap()).collect();
    ta.into_iter().for_each(|t| s.release(t));
    while let Some(t) = s.try_acquire(b, cap) {
        tb.push(t);
    }
    assert_eq!(tb.len(), usize::from(cap), "B holds exactly its cap");
}

/// A neighbour (one shared lane) of a client at its cap loses nothing: the smaller
/// lane decides. A twin (both lanes shared) is the price of the sketch.
#[test]
fn concurrency_neighbour_of_a_full_client_gets_its_cap() {
    let cap = 8;
    let s = ConcurrencySketch::new(1, [6; 16]);
    let (a, b) = two_clients(|c| s.locate(c), 1);
    let ta: Vec<Ticket> = std::iter::from_fn(|| s.try_acquire(a, cap)).collect();
    let tb: Vec<Ticket> = std::iter::from_fn(|| s.try_acquire(b, cap)).collect();
    assert_eq!((ta.len(), tb.len()), (8, 8));
    let s = ConcurrencySketch::new(1, [6; 16]);
    let (a, b) = two_clients(|c| s.locate(c), 2);
    let ta: Vec<Ticket> = std::iter::from_fn(|| s.try_acquire(a, cap)).collect();
    assert_eq!(ta.len(), 8);
    assert!(s.try_acquire(b, cap).is_none(), "a twin of a full client is refused");
}

// ------------------------------------------------------------ (c) the rate sketch

/// Exact GCRA for one client: admit at `now` iff `max(tat, now) - now <=
/// tau`, then `tat = max(tat, now) + T`.
fn gcra_allows(g: Gcra, tat: u64, now: u64) -> bool {
    tat.max(now) - now <= g.tau()
}

struct RateRun {
    honest_tries: u64,
    honest_refused: u64,
    admitted: u64,
    rebases: u64,
}

/// `steps` attempts on a 1-tick grid; `abusers` clients attempt every few ticks (far
/// above the rate), honest clients about 2/s with occasional bursts of up to 20; one
/// step in 4 000 is a pause (a window ± 1, an hour, a day, random), one in 1 000 steps
/// the clock back by up to 20 ticks (another shard's older clock read).
fn rate_run(seed: u64, words: usize, clients: usize, abusers: usize, g: Gcra, steps: u64) -> RateRun {
    let mut r = Rng(seed);
    let mut now: u64 = 1_000_000_000 + r.below(1 << 20);
    let s = RateSketch::new(words, r.key(), g, now);
    let keys: Vec<ClientKey> = (0..clients).map(client).collect();
    let loc: Vec<(usize, LanePair)> = keys.iter().map(|&k| s.locate(k)).collect();
    let mut tat: Vec<u64> = vec![0; clients];
    let abusive: Vec<usize> = (0..abusers).map(|_| r.below(clients as u64) as usize).collect();
    let is_abusive: HashSet<usize> = abusive.iter().copied().collect();
    let mut burst: Option<(usize, u32)> = None;
    let mut run = RateRun { honest_tries: 0, honest_refused: 0, admitted: 0, rebases: 0 };
    let mut epoch = s.epoch();
    for step in 0..steps {
        // Time.
        if r.chance(1, 4_000) {
            now += match r.below(5) {
                0 => g.window() - 1,
                1 => g.window(),
                2 => g.window() + 1,
                3 => 3_600_000 * (1 + r.below(24)),
                _ => r.below(1 << 17),
            };
        } else if r.chance(1, 1_000) {
            now -= r.below(21);
        } else {
            now += r.below(3);
        }
        // Who.
        let c = if let Some((c, left)) = burst {
            burst = if left > 1 { Some((c, left - 1)) } else { None };
            c
        } else if abusers > 0 && r.chance(1, 4) {
            abusive[r.below(abusers as u64) as usize]
        } else {
            let c = r.below(clients as u64) as usize;
            if r.chance(1, 200) && !is_abusive.contains(&c) {
                burst = Some((c, 1 + r.below(20) as u32));
            }
            c
        };
        let exact = gcra_allows(g, tat[c], now);
        let admitted = s.try_admit(keys[c], now);
        if admitted {
            assert!(exact, "step {step}: client {c} admitted at {now}, exact TAT {} (tau {})", tat[c], g.tau());
            tat[c] = tat[c].max(now) + g.interval();
            run.admitted += 1;
        }
        if exact && !is_abusive.contains(&c) {
            run.honest_tries += 1;
            run.honest_refused += u64::from(!admitted);
        }
        if s.epoch() != epoch {
            epoch = s.epoch();
            run.rebases += 1;
        }
        if step % 2048 == 0 || step == steps - 1 {
            // Every lane is at least the TAT of each client on it (relative to the
            // epoch; TATs before the epoch are all alike).
            for (i, &(w, p)) in loc.iter().enumerate() {
                let (a, b) = p.lanes();
                let word = s.word(w);
                let need = tat[i].saturating_sub(epoch);
                assert!(
                    lane(word, a) >= need && lane(word, b) >= need,
                    "step {step}: client {i} TAT {} epoch {epoch}: lanes {} {}",
                    tat[i],
                    lane(word, a),
                    lane(word, b)
                );
            }
        }
    }
    run
}

#[test]
fn rate_sketch_against_exact_gcra() {
    // The documented load, with the default GCRA (10/s, burst 40, 1 ms ticks).
    let words = 1024;
    let run = std::sync::Arc::new(std::sync::Mutex::new(None));
    let out = run.clone();
    within(120, move || *out.lock().unwrap() = Some(rate_run(21, words, 2 * words, words / 64, DEFAULT_GCRA, 300_000)));
    let run = run.lock().unwrap().take().unwrap();
    let rate = run.honest_refused as f64 / run.honest_tries as f64;
    eprintln!(
        "rate: {} admitted, {} rebases, honest refusals {}/{} = {:.3} %",
        run.admitted,
        run.rebases,
        run.honest_refused,
        run.honest_tries,
        100.0 * rate
    );
    assert!(run.rebases >= 50, "pauses must force rebases");
    assert!(run.honest_tries > 100_000);
    assert!(rate < 0.01, "honest refusal rate {rate}");
}

#[test]
fn rate_sketch_small_span_crowded() {
    // Tiny T and tau (many rebases relative to the traffic), a crowded table, a
    // quarter of the clients abusive: refusals are many, nobody gets more than GCRA.
    let g = Gcra::new(3, 4).unwrap();
    within(120, move || {
        let run = rate_run(22, 8, 64, 16, g, 200_000);
        eprintln!("rate crowded: {} rebases, honest refusals {}/{}", run.rebases, run.honest_refused, run.honest_tries);
    });
}

#[test]
fn gcra_parameters() {
    within(120, || {
        let g = DEFAULT_GCRA;
        assert_eq!((g.interval(), g.tau(), g.burst(), g.window()), (100, 3_900, 40, 28_767));
        assert!(Gcra::new(0, 1).is_none());
        assert!(Gcra::new(1, 0).is_none());
        assert!(Gcra::new(1 << 14, 1).is_some());
        assert!(Gcra::new(1 << 14, 2).is_none());
        assert!(Gcra::new(1 << 13, 2).is_some());
        assert!(Gcra::per_second(0, 1, 1000).is_none());
        // Exactly `burst` at one instant, then one per T.
        let s = RateSketch::new(1, [7; 16], g, 5);
        let c = client(1);
        assert_eq!((0..100).filter(|_| s.try_admit(c, 5)).count(), 40);
        assert!(!s.try_admit(c, 5 + 99));
        assert!(s.try_admit(c, 5 + 100));
        assert!(!s.try_admit(c, 5 + 100));
        // An hour later (rebases) the full burst again.
        let later = 5 + 3_600_000;
        assert_eq!((0..100).filter(|_| s.try_admit(c, later)).count(), 40);
        assert_eq!(s.epoch(), later);
    });
}

/// After a rebase the table is shifted by the next decisions, `SWEEP_CHUNK` words each.
#[test]
fn rate_pass_is_spread_over_decisions() {
    within(120, || {
        let g = DEFAULT_GCRA;
        let s = RateSketch::new(1024, [11; 16], g, 0);
        assert!(s.swept());
        for i in 0..1024 {
            assert!(s.try_admit(client(i), 1));
        }
        assert!(s.try_admit(client(0), 1 + g.window()), "rebased");
        assert_eq!(s.epoch(), 1 + g.window());
        assert!(!s.swept());
        let calls = 1024 / proto::limits::rate::SWEEP_CHUNK;
        for i in 0..calls {
            assert!(!s.swept(), "after {i} calls");
            s.try_admit(client(5000 + i), 1 + g.window());
        }
        assert!(s.swept());
        // Every client's lanes now count from the new epoch: its TAT (1 + T) is past.
        for i in 1..1024 {
            let (w, p) = s.locate(client(i));
            let (a, b) = p.lanes();
            let word = s.word(w);
            assert!(lane(word, a).min(lane(word, b)) <= g.interval(), "client {i}");
        }
    });
}

/// A neighbour (one shared lane) of a client at its limit gets its whole burst and
/// then exactly its rate, like exact GCRA: the smaller lane is the estimate, and each
/// lane is raised only to the client's own TAT.
#[test]
fn rate_neighbour_of_a_flooding_client_loses_nothing() {
    within(120, || {
        let g = DEFAULT_GCRA;
        let s = RateSketch::new(1, [10; 16], g, 0);
        let (a, b) = two_clients(|c| s.locate(c), 1);
        let (mut tat_b, mut got_b, mut exact_b) = (0u64, 0, 0);
        for now in 1_000..61_000u64 {
            while s.try_admit(a, now) {}
            if now % 50 == 0 {
                // b tries twice as often as its rate allows, from its first burst on.
                let burst = if now == 1_000 { 60 } else { 1 };
                for _ in 0..burst {
                    if gcra_allows(g, tat_b, now) {
                        exact_b += 1;
                        tat_b = tat_b.max(now) + g.interval();
                        got_b += u64::from(s.try_admit(b, now));
                    }
                }
            }
        }
        assert_eq!(got_b, exact_b, "every admission exact GCRA makes");
        assert!(exact_b >= 40 + 590, "{exact_b}");
    });
}

// ------------------------------------------------------------- (d) two threads

#[test]
fn concurrency_two_threads_one_word() {
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
    let s = ConcurrencySketch::new(1, [8; 16]);
    let cap: u16 = 3;
    // Three clients on the one word; per-client count of tickets held, raised after
    // the acquire and lowered before the release, so it never exceeds the truth.
    let keys = [client(1), client(2), client(3)];
    let held: Vec<AtomicI64> = keys.iter().map(|_| AtomicI64::new(0)).collect();
    std::thread::scope(|sc| {
        for th in 0..2u64 {
            let (s, held, keys) = (&s, &held, &keys);
            sc.spawn(move || {
                let mut r = Rng(100 + th);
                let mut mine: Vec<(usize, Ticket)> = Vec::new();
                for _ in 0..200_000 {
                    let c = r.below(3) as usize;
                    if mine.len() < 8 && r.chance(3, 5) {
                        if let Some(t) = s.try_acquire(keys[c], cap) {
                            let n = held[c].fetch_add(1, SeqCst) + 1;
                            assert!(n <= i64::from(cap), "client {c} holds {n} > {cap}");
                            mine.push((c, t));
                        }
                    } else if let Some((c, t)) = mine.pop() {
                        held[c].fetch_sub(1, SeqCst);
                        s.release(t);
                    }
                }
                for (c, t) in mine {
                    held[c].fetch_sub(1, SeqCst);
                    s.release(t);
                }
            });
        }
    });
    assert_eq!(s.word(0), 0, "every release undid its admission");
}

/// Two threads admitting one client on a shared clock (`now` from one counter, so
/// the calls' `now`s are not in order) through a rate sketch that rebases all the time
/// never get more than GCRA's bound `1 + (elapsed + tau) / T` admissions (each
/// admission raises the TAT by T and needs it at most `now + tau`).
fn two_threads_rate(g: Gcra, words: usize, calls: u64) {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let s = RateSketch::new(words, [9; 16], g, 0);
    // A client whose word comes late in the table, so that admissions happen while a
    // rebase's pass over the table has not reached it yet.
    let c = (0..).map(client).find(|&c| s.locate(c).0 >= words * 7 / 8).unwrap();
    let clock = AtomicU64::new(0);
    let admitted = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for _ in 0..2 {
            sc.spawn(|| {
                for _ in 0..calls {
                    let now = clock.fetch_add(3, SeqCst);
                    if s.try_admit(c, now) {
                        admitted.fetch_add(1, SeqCst);
                    }
                }
            });
        }
    });
    let elapsed = clock.load(SeqCst);
    let bound = 1 + (elapsed + g.tau()) / g.interval();
    let n = admitted.load(SeqCst);
    eprintln!("two threads, {words} words: {n} admitted in {elapsed} ticks, bound {bound}");
    assert!(n <= bound, "{n} > {bound}");
}

/// Two threads in bursts over many clients that sit idle for more than a window, all
/// late in a big table: admissions happen while a rebase's pass has not reached their
/// word. Exact GCRA admits at most `1 + (L + tau) / T` connections of a client with
/// `now` in any interval of length L (the first raises its TAT past the start, each
/// needs it at most `end + tau`, each raises it by T), whatever the order of the calls.
fn two_threads_rate_bursts(g: Gcra, words: usize, calls: u64) {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::Mutex;
    let s = RateSketch::new(words, [12; 16], g, 0);
    let keys: Vec<ClientKey> = (0..).map(client).filter(|&c| s.locate(c).0 >= words * 7 / 8).take(2_000).collect();
    let clock = AtomicU64::new(0);
    let log: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for th in 0..2 {
            let (s, keys, clock, log) = (&s, &keys, &clock, &log);
            sc.spawn(move || {
                let mut r = Rng(300 + th);
                let mut mine = Vec::new();
                let mut n = 0;
                while n < calls {
                    let c = r.below(keys.len() as u64) as usize;
                    for _ in 0..g.burst() + 2 {
                        let now = clock.fetch_add(3, SeqCst);
                        if s.try_admit(keys[c], now) {
                            mine.push((c, now));
                        }
                        n += 1;
                    }
                }
                log.lock().unwrap().extend(mine);
            });
        }
    });
    let mut log = log.into_inner().unwrap();
    log.sort_unstable();
    for w in log.chunk_by(|a, b| a.0 == b.0) {
        for (i, &(c, start)) in w.iter().enumerate() {
            for span in [0, g.interval(), g.tau(), 10 * g.interval()] {
                let k = w[i..].iter().take_while(|&&(_, t)| t <= start + span).count() as u64;
                let bound = 1 + (span + g.tau()) / g.interval();
                assert!(k <= bound, "client {c}: {k} admissions in [{start}, {}], bound {bound}", start + span);
            }
        }
    }
    eprintln!("two threads in bursts: {} admissions, {} clients", log.len(), keys.len());
}

#[test]
fn rate_two_threads_with_rebases() {
    within(120, || {
        // A window of 8 191 ticks, a rebase every ~1 400 calls per thread.
        two_threads_rate(Gcra::new(1 << 13, 2).unwrap(), 4, 300_000);
        // A 4 096-word table (long passes), an admission every ~21 calls.
        two_threads_rate(Gcra::new(64, 2).unwrap(), 1 << 12, 300_000);
        // Idle clients meeting a rebase in the middle of its pass.
        two_threads_rate_bursts(Gcra::new(64, 4).unwrap(), 1 << 12, 600_000);
    });
}
