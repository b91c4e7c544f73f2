//! `--steer cpu` (step 2).
use crate::socket::UdpSock;
use anyhow::{bail, Result};

pub fn attach_cpu_steering(_sockets: &[Vec<UdpSock>], _cores: &[core_affinity::CoreId]) -> Result<()> {
    bail!("--steer cpu not built yet")
}
