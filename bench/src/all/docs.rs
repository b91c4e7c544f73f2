//! docs/benchmarks.md: the block `bench all` generates, between its two markers.

use anyhow::Result;
use std::path::Path;

/// The start of the generated block (the marker line continues with a note).
pub(super) const BEGIN: &str = "<!-- bench all: begin";
/// The end of the generated block.
pub(super) const END: &str = "<!-- bench all: end -->";

/// Replaces the generated block in the doc at `path` with `block`, or appends `block`
/// when the doc has none (a missing doc is started with a "# Benchmarks" heading).
pub(super) fn write_doc(path: &Path, block: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let begin = old.find(BEGIN);
    let end = old.find(END);
    let new = match (begin, end) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{}{}", &old[..b], block.trim_end(), &old[e + END.len()..])
        }
        _ => format!("{}\n{}", old.trim_end(), block),
    };
    std::fs::write(path, new)?;
    Ok(())
}
