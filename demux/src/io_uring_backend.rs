//! The io_uring backend (step 2).
use crate::shard::ShardSetup;
use anyhow::{bail, Result};

pub fn probe() -> Result<()> {
    bail!("io_uring backend not built yet")
}

pub fn run(_setup: ShardSetup) -> Result<()> {
    bail!("io_uring backend not built yet")
}
