//! Operator commands that talk to a running controller through `DIR/control.sock`:
//! `demux status --state-dir DIR`, `demux rotate-keys --state-dir DIR` (which
//! rotates the key file itself when no controller runs).

use super::state::{self, Paths};
use anyhow::{bail, Context, Result};
use proto::wire::Admin;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

/// How long an operator command waits for the controller's answer.
const OPERATOR_WAIT: Duration = Duration::from_secs(2 * sys::control::REPLY_TIMEOUT.as_secs() + 1);

/// One request on the controller's control socket; its `Status` JSON.
fn ask(dir: &Path, m: &Admin) -> Result<serde_json::Value> {
    let p = Paths::new(dir);
    let fd = sys::control::connect(&p.control_sock())
        .with_context(|| format!("no controller answers on {} (is it running?)", p.control_sock().display()))?;
    // The controller may itself wait up to REPLY_TIMEOUT on the data plane (a
    // rotation's acknowledgement) before it answers: wait longer than that, so its
    // answer (e.g. "rolled back") reaches the operator instead of our own timeout.
    rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, Some(OPERATOR_WAIT))
        .context("SO_RCVTIMEO")?;
    let reply = sys::control::request_on(fd.as_fd(), &[m]).context("the controller did not answer")?;
    match reply.msg {
        Admin::Status { json } => serde_json::from_str(&json).context("status is not valid JSON"),
        Admin::Error { reason } => bail!("the controller refused: {reason}"),
        _ => bail!("unexpected reply"),
    }
}

pub fn status(dir: &Path, json: bool) -> Result<()> {
    let mut v = ask(dir, &Admin::StatusRequest)?;
    // The kernel fast path is the data plane's: ask it (not the controller's loop,
    // which must never wait on the data plane), and say so when it does not answer.
    let fast = super::status::dataplane_status(&Paths::new(dir).dataplane_sock())
        .map(|dp| dp["fast_path"].clone())
        .unwrap_or_else(
            |e| serde_json::json!({ "active": null, "reason": format!("data plane did not answer: {e:#}") }),
        );
    v["fast_path"] = fast;
    if json {
        println!("{v}");
    } else {
        print!("{}", super::status::pretty(&v));
    }
    Ok(())
}

pub fn rotate_keys(
    dir: &Path,
    prf: Option<proto::cid::Prf>,
    force: bool,
    phase: proto::wire::admin::RotatePhase,
    from: Option<&Path>,
    format: Option<proto::cid_format::FormatSpec>,
) -> Result<()> {
    let p = Paths::new(dir);
    let from = from.map(std::path::absolute).transpose().context("--from")?;
    let path = from.as_ref().map(|f| f.display().to_string());
    match ask(dir, &Admin::RotateKeys { prf, force, phase, from: path, format }) {
        Ok(v) => {
            println!(
                "{phase:?} by the running controller: key generation {} issued ({}, {}); also decoded: {}",
                v["key_newest"],
                v["key_newest_prf"].as_str().unwrap_or("?"),
                v["key_newest_format"].as_str().unwrap_or("?"),
                v["key_previous"]
            );
            Ok(())
        }
        Err(e) if !p.control_sock().exists() || state::lock(&p).is_ok() => {
            // No controller: rotate the file under the controller lock.
            tracing::debug!(error = %format!("{e:#}"), "no controller; rotating the key file");
            let _lock = state::lock(&p)?;
            // Paced by the lifetime recorded at the last rotation (the workers'
            // CIDs do not know this command is offline). The data plane, if one
            // still runs, and the workers get the new file's keys when the
            // controller starts again (adoption re-sends them before any rejoin).
            if phase != proto::wire::admin::RotatePhase::Activate {
                super::pacing::check(&p, None, force)?;
            }
            let Some(text) = state::read_private(&p.keys())? else {
                bail!("{} has no key file yet (start the controller once)", dir.display())
            };
            let k =
                proto::keyfile::KeyFile::parse(&text).with_context(|| format!("key file {}", p.keys().display()))?;
            let k = state::rotate_keys(&p, &k, prf, phase, from.as_deref(), format.as_ref())?;
            if phase != proto::wire::admin::RotatePhase::Stage {
                let mut c = state::load_or_create_counter(&p)?;
                c.starts_in_generation = 0;
                state::store_counter(&p, c)?;
            }
            let last = super::pacing::load(&p).ok().flatten();
            let life = last.map_or(Duration::from_secs(600).as_millis() as u64, |r| r.cid_lifetime_ms);
            super::pacing::store(
                &p,
                super::pacing::Record { at_unix_ms: super::pacing::now_unix_ms(), cid_lifetime_ms: life },
            )?;
            println!(
                "{phase:?} in the key file (no controller running): key generation {} issued ({}, {}); also decoded: {:?}",
                k.keys.newest.generation.get(),
                k.keys.newest.prf,
                k.keys.newest.format.describe(),
                k.keys.previous.map(|g| g.generation.get())
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}
