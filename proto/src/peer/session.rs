//! Binding frames to their receiver and its boot (docs/adr/0005-server-ids-across-hosts.md
//! §4, "Replay").
//!
//! Every data plane draws a random nonzero 64-bit **epoch** when it starts (never
//! stored). Receiver R (host id `h`, epoch `e`) takes an authentic frame from a
//! listed peer P (its tag verified, its source P's listed address) as follows:
//!
//! 1. `to host ≠ h`: refused, *wrong receiver*.
//! 2. `to epoch ≠ e`: refused, *stale* (sealed before R's boot, or by a P that has
//!    not learned it yet). R raises its counter towards P to the frame's `ack`, and
//!    answers with a heartbeat to the frame's `from epoch`, at most one per
//!    [`NUDGE_INTERVAL_MS`] per peer, so that P learns `e`.
//! 3. `sequence` already accepted, or [`ReplayWindow::SIZE`] or more below the
//!    highest accepted, in R's window for P: refused, *replayed*. The window is made
//!    at R's boot and lives as long as it.
//! 4. Otherwise accepted (P is alive). A frame that raised the window's top teaches
//!    R P's epoch and `ack` ([`Learned`]).
//!
//! Sender S numbers its frames to R with one counter per receiver ([`Outbound`]),
//! from 0 at S's boot, raised to every `ack` R sends (every frame carries the
//! sender's `ack`: one past the highest sequence number it accepted from the
//! receiver in its current boot). S sends data to R only once it learned R's epoch,
//! and a frame of R that teaches the epoch carries R's ack too; so S's frames that R
//! can accept are numbered above everything R accepted from S's earlier boots.
//! No wall clock is involved: a sender's clock step changes nothing, and `now_ms`
//! below is a monotonic clock used only for liveness and to pace rule 2's answers.
//!
//! A host that knows nothing of P (both just started) sends it *hellos*: heartbeats
//! with `to epoch` 0, which P refuses by rule 2 and answers with a heartbeat to the
//! host's epoch, which the host accepts and learns from.

use super::frame::Header;
use super::window::ReplayWindow;
use std::sync::atomic::{AtomicU64, Ordering};

/// At most one answer to stale frames per peer this often (rule 2).
pub const NUDGE_INTERVAL_MS: u64 = 20;

/// The receiving host: its id and its current epoch (nonzero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Me {
    pub host: u16,
    pub epoch: u64,
}

/// What an accepted frame taught: frames to its sender carry `to epoch = epoch`
/// and a sequence number of at least `ack` from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learned {
    pub epoch: u64,
    pub ack: u64,
}

/// The receiver's decision on one authentic frame (module docs, rules 1–4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted: a data frame is delivered. `learned`: apply it to the
    /// [`Outbound`] towards this peer.
    Fresh { learned: Option<Learned> },
    /// Refused (rule 2): raise the [`Outbound`] towards this peer to `ack`;
    /// `nudge`: send this peer a heartbeat to that epoch now.
    Stale { ack: u64, nudge: Option<u64> },
    /// Refused (rule 3).
    Replayed,
    /// Refused (rule 1).
    WrongReceiver,
}

/// What a receiver keeps about one peer for the length of its own boot.
#[derive(Clone, Debug, Default)]
pub struct Session {
    window: ReplayWindow,
    /// The peer's epoch, learned from an accepted frame (0: none yet).
    peer_epoch: u64,
    last_fresh_ms: Option<u64>,
    last_nudge_ms: Option<u64>,
}

impl Session {
    /// Rules 1–4 for a frame whose tag verified and whose source is the peer's
    /// listed address.
    pub fn receive(&mut self, me: Me, h: &Header, now_ms: u64) -> Verdict {
        if h.to_host != me.host {
            return Verdict::WrongReceiver;
        }
        if h.to_epoch != me.epoch {
            let nudge = self.may_nudge(now_ms).then_some(h.from_epoch);
            return Verdict::Stale { ack: h.ack, nudge };
        }
        let top = self.window.top();
        if !self.window.accept(h.seq) {
            return Verdict::Replayed;
        }
        self.last_fresh_ms = Some(now_ms);
        // A frame of an older boot of the peer, delayed past a newer boot's frames,
        // does not raise the top: the newer epoch stays.
        if top.is_some_and(|t| h.seq <= t) {
            return Verdict::Fresh { learned: None };
        }
        self.peer_epoch = h.from_epoch;
        Verdict::Fresh { learned: Some(Learned { epoch: h.from_epoch, ack: h.ack }) }
    }

    fn may_nudge(&mut self, now_ms: u64) -> bool {
        // A clock that went back (now < last) does not silence the answers.
        let due = self.last_nudge_ms.is_none_or(|t| now_ms < t || now_ms - t >= NUDGE_INTERVAL_MS);
        if due {
            self.last_nudge_ms = Some(now_ms);
        }
        due
    }

    /// The `ack` of this host's frames to the peer: one past the highest sequence
    /// number accepted from it in this boot (0: none).
    pub fn ack(&self) -> u64 {
        self.window.top().map_or(0, |t| t.saturating_add(1))
    }

    /// The epoch this host's periodic heartbeat goes to: the peer's learned one, or
    /// 0 (a hello, which the peer answers by rule 2).
    pub fn peer_epoch(&self) -> u64 {
        self.peer_epoch
    }

    /// Whether an accepted frame came from the peer within `dead_ms` of `now_ms`.
    pub fn alive(&self, now_ms: u64, dead_ms: u64) -> bool {
        self.last_fresh_ms.is_some_and(|t| now_ms.saturating_sub(t) < dead_ms)
    }

    /// Called now and then: a clock that went back pulls the remembered times back
    /// with it, so liveness is judged on the new clock from here on.
    pub fn tick(&mut self, now_ms: u64) {
        for t in [&mut self.last_fresh_ms, &mut self.last_nudge_ms].into_iter().flatten() {
            *t = (*t).min(now_ms);
        }
    }
}

/// The sending side towards one peer, shared by every thread that sends to it.
#[derive(Debug, Default)]
pub struct Outbound {
    /// The peer's epoch (0: not learned: no data is sent).
    epoch: AtomicU64,
    next: AtomicU64,
}

impl Outbound {
    /// Applies a [`Learned`]: the counter first, then the epoch (Release), so a
    /// thread that sees the new epoch numbers its frame from the raised counter.
    pub fn learn(&self, l: Learned) {
        self.raise(l.ack);
        self.epoch.store(l.epoch, Ordering::Release);
    }

    /// Rule 2: the next sequence number is at least `ack`.
    pub fn raise(&self, ack: u64) {
        self.next.fetch_max(ack, Ordering::Relaxed);
    }

    /// The peer's epoch and a fresh sequence number for a data frame; `None` until
    /// the peer's epoch is learned.
    pub fn data(&self) -> Option<(u64, u64)> {
        let e = self.epoch.load(Ordering::Acquire);
        (e != 0).then(|| (e, self.next.fetch_add(1, Ordering::Relaxed)))
    }

    /// A fresh sequence number (heartbeats).
    pub fn seq(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The learned epoch (0: none).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Me = Me { host: 1, epoch: 0xaaaa };
    const DEAD: u64 = 1000;

    fn h(to_host: u16, to_epoch: u64, seq: u64, ack: u64) -> Header {
        Header { from_host: 2, to_host, from_epoch: 0xbbbb, to_epoch, seq, ack }
    }

    fn learned(ack: u64) -> Verdict {
        Verdict::Fresh { learned: Some(Learned { epoch: 0xbbbb, ack }) }
    }

    #[test]
    fn the_four_rules() {
        let mut s = Session::default();
        assert_eq!(s.peer_epoch(), 0, "hellos until something is learned");
        assert_eq!(s.receive(R, &h(3, R.epoch, 5, 0), 0), Verdict::WrongReceiver);
        assert_eq!(s.receive(R, &h(1, 0x1234, 5, 7), 0), Verdict::Stale { ack: 7, nudge: Some(0xbbbb) });
        assert_eq!(s.receive(R, &h(1, 0x1234, 6, 8), 5), Verdict::Stale { ack: 8, nudge: None }, "paced");
        assert_eq!(
            s.receive(R, &h(1, 0, 7, 8), NUDGE_INTERVAL_MS),
            Verdict::Stale { ack: 8, nudge: Some(0xbbbb) },
            "a hello"
        );
        assert!(!s.alive(30, DEAD), "nothing accepted yet");
        assert_eq!(s.ack(), 0);
        assert_eq!(s.receive(R, &h(1, R.epoch, 5, 40), 30), learned(40));
        assert_eq!(s.receive(R, &h(1, R.epoch, 5, 40), 31), Verdict::Replayed);
        assert!(s.alive(31, DEAD) && !s.alive(30 + DEAD, DEAD));
        assert_eq!((s.ack(), s.peer_epoch()), (6, 0xbbbb));
        assert_eq!(s.receive(R, &h(1, R.epoch, 9, 41), 32), learned(41));
        assert_eq!(s.receive(R, &h(1, R.epoch, 8, 42), 33), Verdict::Fresh { learned: None }, "top not raised");
        assert_eq!(s.receive(R, &h(1, R.epoch, 9 + ReplayWindow::SIZE, 43), 34), learned(43));
        assert_eq!(s.receive(R, &h(1, R.epoch, 8, 0), 34), Verdict::Replayed, "not seen, but out of the window");
    }

    /// A delayed frame of an older boot of the peer does not bring its epoch back.
    #[test]
    fn the_newest_epoch_stays() {
        let mut s = Session::default();
        let mut new = h(1, R.epoch, 100, 0);
        new.from_epoch = 0xcccc;
        assert!(matches!(s.receive(R, &new, 0), Verdict::Fresh { learned: Some(_) }));
        assert_eq!(s.receive(R, &h(1, R.epoch, 99, 0), 0), Verdict::Fresh { learned: None });
        assert_eq!(s.peer_epoch(), 0xcccc);
    }

    /// A receiver clock stepped back by an hour neither keeps a silent peer alive
    /// for that hour (after one tick) nor silences the answers to stale frames.
    #[test]
    fn a_clock_stepped_back_is_followed() {
        let hour = 3_600_000;
        let mut s = Session::default();
        let t = 10 * hour;
        assert!(matches!(s.receive(R, &h(1, 0, 1, 0), t), Verdict::Stale { nudge: Some(_), .. }));
        assert_eq!(s.receive(R, &h(1, R.epoch, 2, 0), t), learned(0));
        let back = t - hour;
        assert_eq!(s.receive(R, &h(1, 0, 3, 0), back), Verdict::Stale { ack: 0, nudge: Some(0xbbbb) }, "not silenced");
        assert!(s.alive(back, DEAD));
        s.tick(back);
        assert!(s.alive(back + DEAD - 1, DEAD) && !s.alive(back + DEAD, DEAD), "judged on the new clock");
        assert_eq!(s.receive(R, &h(1, R.epoch, 4, 0), back + 5), learned(0));
    }

    #[test]
    fn outbound_counts_per_peer_and_takes_acks() {
        let o = Outbound::default();
        assert_eq!(o.data(), None, "no data before the peer's epoch is known");
        assert_eq!((o.seq(), o.seq()), (0, 1));
        o.raise(10);
        assert_eq!(o.seq(), 10);
        o.learn(Learned { epoch: 9, ack: 100 });
        assert_eq!(o.data(), Some((9, 100)));
        o.learn(Learned { epoch: 9, ack: 50 });
        assert_eq!(o.data(), Some((9, 101)), "an old ack never moves the counter back");
        assert_eq!(o.epoch(), 9);
    }
}
