//! quicdemux's `demux`: the data plane (`dataplane`, docs/architecture.md), the
//! controller that supervises it and the workers (`controller`, docs/operations.md),
//! the operator commands (`operator`), and the configuration file (`config`).
//! `main.rs` only dispatches arguments.
//! Modules are public so that benches and tests can drive the internals.

pub mod accept_guard;
pub mod cli;
pub mod config;
pub mod control_server;
pub mod controller;
pub mod dataplane;
pub mod operator;
pub mod trust;
pub mod versions;
