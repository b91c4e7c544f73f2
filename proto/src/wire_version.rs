//! The versions of the formats the processes speak to each other (docs/wire.md),
//! in one place: what `demux --version` and `worker --version` print, so that an
//! operator can tell whether two builds can run side by side (their control windows
//! share a version: docs/wire.md "Versions"). A new version to print is added here only.

/// The control conversations (registration, data connection, admin): the versions
/// this build speaks (the version byte of every control record is one of them).
pub const CONTROL_PROTOCOL: crate::wire::Window = crate::wire::Window::OWN;
/// The data frame (demux → worker) layout version.
pub const DATA_FRAME: u8 = crate::wire::frame::VERSION;

/// `control protocol N and N-1, data frame M` (the window; the tail of both binaries' `--version`).
pub fn describe() -> String {
    format!("control protocol {CONTROL_PROTOCOL}, data frame {DATA_FRAME}")
}

/// The whole `--version` text after the program name: `0.1.0 (commit 1a2b3c4d5e6f;
/// control protocol 3, data frame 2)`; a window of two versions reads `4 and 3`.
pub fn version_line(package_version: &str, commit: &str) -> String {
    format!("{package_version} (commit {commit}; {})", describe())
}

#[cfg(test)]
mod tests {
    /// The numbers written out: a version bump must show up here (and in what the
    /// operator reads), not pass unnoticed.
    #[test]
    fn describes_both_versions() {
        assert_eq!(super::describe(), "control protocol 4 and 3, data frame 2");
        assert_eq!(
            super::version_line("0.1.0", "abc-dirty"),
            "0.1.0 (commit abc-dirty; control protocol 4 and 3, data frame 2)"
        );
    }
}
