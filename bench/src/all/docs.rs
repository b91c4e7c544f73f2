//! docs/benchmarks.md: the block `bench all` generates, between its two markers.

use anyhow::Result;
use std::path::Path;

/// The start of the generated block (the marker line continues with a note).
pub(super) const BEGIN: &str = "<!-- bench all: begin";
/// The end of the generated block.
pub(super) const END: &str = "<!-- bench all: end -->";

/// Replaces the generated block in the doc at `path` with `block`, or appends `block`
/// when the doc has none.
pub(super) fn write_doc(path: &Path, block: &str) -> Result<()> {
    crate::report::replace_block(path, BEGIN, END, block)
}
