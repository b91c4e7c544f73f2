//! Protocol versions and capabilities (docs/wire.md "Versions", docs/adr/0006).
//!
//! Every control record's second byte is the protocol version its body is encoded
//! in. Each conversation opens with the initiator's hello, which announces the
//! sender's [`Window`] (the record's version byte is its newest, the body says its
//! oldest) and its capability bits; the responder answers `Welcome` in the highest
//! version both speak ([`Window::negotiate`]) with its own capability bits, or
//! refuses with an `Error` naming both ([`VersionRefused`]). Both then encode every
//! record in the negotiated version. The hello, `Welcome` and `Error` have the same
//! layout in every version ([`super::Message::is_frozen`]), so any two builds can
//! get that far.
//!
//! A capability is a bit of a conversation's `u64` set: the hello says what the
//! initiator wants to use, `Welcome` what the responder knows; a capability is in
//! effect when both carry it ([`common_caps`]). Bits a reader does not know are
//! ignored, never an error.

/// The protocol version this build speaks, its newest (`demux --version` and
/// `worker --version` print it).
pub const PROTOCOL_VERSION: u8 = 4;

/// The first protocol version that negotiates. Version bytes 1 and 2 were the
/// control-record formats of the builds before it, whose hellos carry no version:
/// no build speaks them, and a record in either is refused as a version mismatch.
pub const FIRST_VERSION: u8 = 3;

/// How far above [`PROTOCOL_VERSION`] a test may relabel a process
/// ([`Window::relabelled`]): one for a peer inside the window, two for a gap.
pub const MAX_RELABEL: u8 = 2;

/// The protocol versions a process speaks: `oldest..=newest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub oldest: u8,
    pub newest: u8,
}

impl Window {
    /// This build's window: [`PROTOCOL_VERSION`] and the one before it.
    pub const OWN: Window = Window::ending_at(PROTOCOL_VERSION);

    /// The window of a build whose newest version is `newest`: that one and the one
    /// before, never below [`FIRST_VERSION`].
    pub const fn ending_at(newest: u8) -> Window {
        let prev = newest.saturating_sub(1);
        Window { oldest: if prev < FIRST_VERSION { FIRST_VERSION } else { prev }, newest }
    }

    /// The window a test gives a process of this build with `--protocol-version V`
    /// (hidden): [`Window::ending_at`]`(V)`, for `V` in `PROTOCOL_VERSION..=
    /// PROTOCOL_VERSION + MAX_RELABEL`. The process still encodes this build's
    /// layouts: a relabelled process stands for a later build that differs from this
    /// one only in its version number.
    pub fn relabelled(newest: u8) -> Result<Window, String> {
        let top = PROTOCOL_VERSION.saturating_add(MAX_RELABEL);
        if (PROTOCOL_VERSION..=top).contains(&newest) {
            Ok(Window::ending_at(newest))
        } else {
            Err(format!(
                "--protocol-version {newest}: a test relabelling of this build accepts {PROTOCOL_VERSION}..={top} only"
            ))
        }
    }

    /// Whether a valid window (`FIRST_VERSION <= oldest <= newest`).
    pub fn is_valid(self) -> bool {
        FIRST_VERSION <= self.oldest && self.oldest <= self.newest
    }

    pub fn speaks(self, version: u8) -> bool {
        (self.oldest..=self.newest).contains(&version)
    }

    /// The highest version both windows hold: what the responder answers in and
    /// both sides encode in from then on. `Err` when they share none.
    pub fn negotiate(self, peer: Window) -> Result<u8, VersionRefused> {
        let v = self.newest.min(peer.newest);
        if v >= self.oldest.max(peer.oldest) {
            Ok(v)
        } else {
            Err(VersionRefused { ours: self, theirs: peer })
        }
    }
}

impl std::fmt::Display for Window {
    /// `3`, `4 and 3`, `6 to 3`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.newest.saturating_sub(self.oldest) {
            0 => write!(f, "{}", self.newest),
            1 => write!(f, "{} and {}", self.newest, self.oldest),
            _ => write!(f, "{} to {}", self.newest, self.oldest),
        }
    }
}

/// Two windows with no version in common. Its text is the `Error` a refused peer
/// gets, e.g. `protocol version 5 not supported: this build speaks 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionRefused {
    pub ours: Window,
    pub theirs: Window,
}

impl std::fmt::Display for VersionRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "protocol version {} not supported: this build speaks {}", self.theirs.newest, self.ours)
    }
}
impl std::error::Error for VersionRefused {}

/// What a hello announces: the sender's window (the record's version byte is its
/// newest) and its capability bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Announce {
    pub window: Window,
    pub caps: u64,
}

impl Announce {
    /// `window` with no capabilities.
    pub const fn plain(window: Window) -> Announce {
        Announce { window, caps: 0 }
    }
}

/// The capabilities in effect on a connection: those both sides announced that
/// this build knows (`known`: the conversation's `CAPS_KNOWN`). Unknown bits fall
/// out here: they are ignored, never an error.
pub const fn common_caps(ours: u64, theirs: u64, known: u64) -> u64 {
    ours & theirs & known
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_their_text() {
        assert_eq!(Window::OWN, Window { oldest: FIRST_VERSION, newest: PROTOCOL_VERSION });
        assert_eq!(Window::ending_at(4), Window { oldest: 3, newest: 4 });
        assert_eq!(Window::ending_at(3), Window { oldest: 3, newest: 3 }, "never below the first version");
        assert_eq!(Window::ending_at(4).to_string(), "4 and 3");
        assert_eq!(Window::ending_at(3).to_string(), "3");
        assert_eq!(Window { oldest: 3, newest: 6 }.to_string(), "6 to 3");
        let refused = Window::ending_at(3).negotiate(Window::ending_at(5)).unwrap_err();
        assert_eq!(refused.to_string(), "protocol version 5 not supported: this build speaks 3");
        let refused = Window::ending_at(5).negotiate(Window::ending_at(3)).unwrap_err();
        assert_eq!(refused.to_string(), "protocol version 3 not supported: this build speaks 5 and 4");
    }

    #[test]
    fn relabelling_is_bounded() {
        assert_eq!(Window::relabelled(PROTOCOL_VERSION), Ok(Window::OWN));
        assert_eq!(Window::relabelled(PROTOCOL_VERSION + 2), Ok(Window::ending_at(PROTOCOL_VERSION + 2)));
        assert!(Window::relabelled(PROTOCOL_VERSION + 3).is_err());
        assert!(Window::relabelled(PROTOCOL_VERSION - 1).is_err());
        assert!(Window::relabelled(0).is_err() && Window::relabelled(255).is_err());
    }
}
