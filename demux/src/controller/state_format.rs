//! `DIR/state-format`: the layout of the state directory (its files and what each
//! holds), one line `quicdemux-state N` (docs/operations.md "Upgrading"). Formats
//! move forward only: a build takes over a directory of its own format or an
//! older one (and writes its own), and refuses a newer one — a downgrade across a
//! format change — with an error naming both, before it changes anything. A
//! directory without the file predates it: format 1.
//!
//! The key file carries its own version line (`quicdemux-keys N`,
//! proto::keyfile), which a build that does not read it refuses the same way;
//! `demux check-state` checks both (what an upgrade's preflight runs with the new
//! binary).

use super::state::{self, Paths};
use anyhow::{bail, Context, Result};

/// This build's state format.
pub const STATE_FORMAT: u32 = 1;
const MAGIC: &str = "quicdemux-state";

/// The file's text for `format`.
pub fn text(format: u32) -> String {
    format!("{MAGIC} {format}\n")
}

/// Parses the file's text: its format number.
pub fn parse(text: &str) -> Result<u32> {
    let line = text.lines().next().unwrap_or("").trim();
    let Some(n) = line.strip_prefix(MAGIC).and_then(|r| r.strip_prefix(' ')) else {
        bail!("not a state-format line (want `{MAGIC} N`): {line:?}");
    };
    match n.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => bail!("bad state format number {n:?} (want `{MAGIC} N`, N >= 1)"),
    }
}

/// The directory's format (1 without the file); an error for a format this build
/// does not take over.
pub fn check(p: &Paths) -> Result<u32> {
    let path = p.state_format();
    let found = match state::read_private(&path)? {
        None => 1,
        Some(t) => parse(&t).with_context(|| format!("{}", path.display()))?,
    };
    if found > STATE_FORMAT {
        bail!(
            "the state directory {} is in state format {found}, newer than this build's {STATE_FORMAT}: a downgrade \
             across a state-format change is refused (run a build that reads format {found})",
            p.dir.display()
        );
    }
    Ok(found)
}

/// At start: [`check`], then the file says this build's format (migrated forward).
pub fn ensure(p: &Paths) -> Result<()> {
    let found = check(p)?;
    if found < STATE_FORMAT || !p.state_format().exists() {
        state::write_atomic(&p.state_format(), &text(STATE_FORMAT))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_its_own_text_and_refuses_others() {
        assert_eq!(parse(&text(STATE_FORMAT)).unwrap(), STATE_FORMAT);
        assert_eq!(parse("quicdemux-state 7").unwrap(), 7);
        for bad in
            ["", "quicdemux-state", "quicdemux-state 0", "quicdemux-state x", "quicdemux-keys 1", "quicdemux-state1"]
        {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    /// A fresh 0700 directory, removed when dropped.
    struct Dir(Paths);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0.dir);
        }
    }
    fn dir(tag: &str) -> (Dir, Paths) {
        let d = testkit::temp_dir(tag);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = Paths::new(&d);
        (Dir(p.clone()), p)
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_and_left_alone() {
        let (_t, p) = dir("sf-newer");
        state::write_atomic(&p.state_format(), &text(STATE_FORMAT + 1)).unwrap();
        let e = format!("{:#}", ensure(&p).unwrap_err());
        assert!(
            e.contains(&format!("state format {}", STATE_FORMAT + 1))
                && e.contains(&format!("this build's {STATE_FORMAT}")),
            "{e}"
        );
        assert!(e.contains("downgrade"), "{e}");
        assert_eq!(std::fs::read_to_string(p.state_format()).unwrap(), text(STATE_FORMAT + 1), "not rewritten");
    }

    #[test]
    fn a_directory_without_the_file_is_format_1_and_gets_ours() {
        let (_t, p) = dir("sf-none");
        assert_eq!(check(&p).unwrap(), 1);
        ensure(&p).unwrap();
        assert_eq!(std::fs::read_to_string(p.state_format()).unwrap(), text(STATE_FORMAT));
    }

    proptest! {
        /// Against the obvious model: a format is taken over exactly when it is not
        /// above this build's.
        #[test]
        fn taken_over_iff_not_newer(n in 1u32..1000) {
            let (_t, p) = dir("sf-prop");
            state::write_atomic(&p.state_format(), &text(n)).unwrap();
            prop_assert_eq!(check(&p).is_ok(), n <= STATE_FORMAT);
        }
    }
}
