//! `demux`: argument dispatch only (the roles live in the library: `demux::dataplane`,
//! `demux::controller`, `demux::operator`).

use clap::Parser;
use demux::cli::{Cli, Command};
use demux::{controller, dataplane, operator};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DEMUX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if let Some(v) = cli.protocol_version() {
        if let Err(e) = sys::protocol::relabel(v) {
            eprintln!("demux: error: {e}");
            std::process::exit(2);
        }
    }
    let r = match cli.command {
        None if cli.controller.state_dir.is_some() => controller::run(cli.dataplane, cli.controller),
        None => dataplane::run(cli.dataplane),
        Some(Command::Dataplane(a)) => dataplane::run(a),
        Some(Command::Controller { dataplane, controller }) => controller::run(dataplane, controller),
        Some(Command::Status { state_dir, json }) => controller::client::status(&state_dir, json),
        Some(Command::RotateKeys { state_dir, prf, force, stage, activate, from }) => {
            let phase = match (stage, activate) {
                (true, _) => proto::wire::admin::RotatePhase::Stage,
                (_, true) => proto::wire::admin::RotatePhase::Activate,
                _ => proto::wire::admin::RotatePhase::Rotate,
            };
            controller::client::rotate_keys(&state_dir, prf, force, phase, from.as_deref())
        }
        Some(Command::GenKeys { out, force }) => operator::gen_keys(&out, force),
        Some(Command::LbStatus { control_socket, state_dir, json }) => {
            match control_socket.or_else(|| state_dir.map(|d| controller::state::Paths::new(&d).dataplane_sock())) {
                Some(p) => operator::lb_status(&p, json),
                None => Err(anyhow::anyhow!("--control-socket PATH or --state-dir DIR is required")),
            }
        }
    };
    if let Err(e) = r {
        eprintln!("demux: error: {e:#}");
        std::process::exit(1);
    }
}
