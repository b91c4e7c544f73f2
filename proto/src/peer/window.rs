//! Anti-replay over one sender's sequence numbers (RFC 4303 §3.4.3).

/// Accepts each number at most once, and nothing [`ReplayWindow::SIZE`] or more
/// below the highest accepted. Reordering within the window is fine.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    /// The highest accepted sequence number (`None`: nothing accepted yet).
    top: Option<u64>,
    /// Bit `i`: `top − i` was accepted.
    seen: [u64; ReplayWindow::WORDS],
}

impl ReplayWindow {
    const WORDS: usize = 16;
    /// How far below the highest accepted number a frame may still arrive.
    pub const SIZE: u64 = 64 * ReplayWindow::WORDS as u64;

    /// The highest number accepted so far.
    pub fn top(&self) -> Option<u64> {
        self.top
    }

    /// Whether `seq` is new; if so, it is recorded. Call only after the tag verified
    /// (an unauthenticated frame must not move the window).
    pub fn accept(&mut self, seq: u64) -> bool {
        let Some(top) = self.top else {
            self.top = Some(seq);
            self.seen = [0; Self::WORDS];
            self.seen[0] = 1;
            return true;
        };
        if seq > top {
            self.shift(seq - top);
            self.top = Some(seq);
            self.seen[0] |= 1;
            return true;
        }
        let behind = top - seq;
        if behind >= Self::SIZE {
            return false;
        }
        let (w, b) = ((behind / 64) as usize, behind % 64);
        if self.seen[w] & (1 << b) != 0 {
            return false;
        }
        self.seen[w] |= 1 << b;
        true
    }

    /// Moves every recorded bit `by` places older (bits past the window fall off).
    fn shift(&mut self, by: u64) {
        if by >= Self::SIZE {
            self.seen = [0; Self::WORDS];
            return;
        }
        let (words, bits) = ((by / 64) as usize, (by % 64) as u32);
        for i in (0..Self::WORDS).rev() {
            let lo = i.checked_sub(words).map_or(0, |j| self.seen[j]);
            let carry = match (bits, i.checked_sub(words + 1)) {
                (0, _) | (_, None) => 0,
                (_, Some(j)) => self.seen[j] >> (64 - bits),
            };
            self.seen[i] = (lo << bits) | carry;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplayWindow;

    #[test]
    fn replay_window_basics() {
        let mut w = ReplayWindow::default();
        assert_eq!(w.top(), None);
        assert!(w.accept(100));
        assert!(!w.accept(100), "a replay");
        assert!(w.accept(99), "reordered within the window");
        assert!(!w.accept(99));
        assert_eq!(w.top(), Some(100));
        assert!(w.accept(100 + ReplayWindow::SIZE));
        assert!(!w.accept(100), "fell out of the window");
        assert!(w.accept(101), "still inside");
        let top = 100 + ReplayWindow::SIZE;
        assert!(!w.accept(top - ReplayWindow::SIZE), "exactly SIZE below the top is outside");
        assert!(w.accept(top - ReplayWindow::SIZE + 2), "near the oldest number inside, not yet seen");
        assert!(w.accept(0).eq(&false) && w.accept(u64::MAX) && w.top() == Some(u64::MAX));
    }
}
