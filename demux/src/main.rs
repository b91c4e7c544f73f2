//! `demux`: argument dispatch only (the roles live in the library: `demux::dataplane`,
//! `demux::controller`, `demux::operator`; `--config FILE` is read by `demux::config`).

use clap::Parser;
use demux::cli::{Cli, Command};
use demux::{config, controller, dataplane, operator};
use std::ffi::OsString;

fn main() {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // `--config FILE`: the file's keys become flags before the command line's own.
    let effective = match config::effective_argv(argv.clone()) {
        Ok(a) => a,
        Err(e) => fail(e),
    };
    let cli = Cli::parse_from(&effective);
    let logging = match sys::logging::init(cli.log.log_level.as_deref(), cli.log.log_format.to_sys(), "DEMUX_LOG") {
        Ok(l) => l,
        Err(e) => fail(anyhow::anyhow!("logging: {e}")),
    };
    if let Some(v) = cli.protocol_version() {
        if let Err(e) = sys::protocol::relabel(v) {
            eprintln!("demux: error: {e}");
            std::process::exit(2);
        }
    }
    let json = cli.log.log_format == demux::cli::LogFormat::Json;
    let controller_run = |dp, mut opts: demux::cli::ControllerOpts| {
        opts.argv = argv.clone();
        controller::run(dp, opts, cli.log.clone(), logging)
    };
    let r = match cli.command {
        None if cli.controller.state_dir.is_some() || cli.controller.config.is_some() => {
            controller_run(cli.dataplane, cli.controller)
        }
        None => dataplane::run(cli.dataplane),
        Some(Command::Dataplane(a)) => dataplane::run(a),
        Some(Command::Controller { dataplane, controller }) => controller_run(dataplane, controller),
        Some(Command::CheckConfig { file }) => match config::check(&file) {
            Ok(summary) => {
                println!("{summary}");
                Ok(())
            }
            Err(errors) => {
                eprintln!("{errors}");
                std::process::exit(1);
            }
        },
        Some(Command::Status { state_dir, json }) => controller::client::status(&state_dir, json),
        Some(Command::RotateKeys { state_dir, prf, force, stage, activate, from, cid_format }) => {
            let phase = match (stage, activate) {
                (true, _) => proto::wire::admin::RotatePhase::Stage,
                (_, true) => proto::wire::admin::RotatePhase::Activate,
                _ => proto::wire::admin::RotatePhase::Rotate,
            };
            controller::client::rotate_keys(&state_dir, prf, force, phase, from.as_deref(), cid_format)
        }
        Some(Command::Upgrade { state_dir, demux_bin, worker_bin, timeout }) => controller::upgrade::request(
            &state_dir,
            demux_bin.as_deref(),
            worker_bin.as_deref(),
            std::time::Duration::from_secs(timeout),
        ),
        Some(Command::CheckState { state_dir, controller_args_stdin, .. }) => {
            let args = controller_args_stdin.then(controller::upgrade::args_from_stdin).transpose();
            args.and_then(|a| controller::upgrade::check_state(&state_dir, a)).map(|s| println!("{s}"))
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
        if json {
            // Every line JSON under --log-format json, the last one too.
            tracing::error!(error = %format!("{e:#}"), "demux: error");
            std::process::exit(1);
        }
        fail(e);
    }
}

fn fail(e: anyhow::Error) -> ! {
    eprintln!("demux: error: {e:#}");
    std::process::exit(1);
}
