//! Operator commands that talk to no controller: `gen-keys` and `lb-status`.

use crate::dataplane::status;
use anyhow::{bail, Context, Result};
use proto::keyfile::KeyFile;
use proto::wire::Admin;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// `demux gen-keys --out FILE`: a fresh key file, mode 0600.
pub fn gen_keys(out: &Path, force: bool) -> Result<()> {
    let mut random = [0u8; proto::keyfile::RANDOM_LEN];
    sys::os_random(&mut random).context("getrandom")?;
    let text = KeyFile::generate(&random, proto::cid::Prf::SipHash24).to_text();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(out).with_context(|| format!("creating key file {}", out.display()))?;
    // An existing file opened with --force keeps its mode: set 0600 explicitly.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// `demux lb-status`: the data plane's status over its control socket.
pub fn lb_status(path: &Path, json: bool) -> Result<()> {
    let reply = sys::control::request(path, &[&Admin::StatusRequest])
        .with_context(|| format!("the data plane did not answer on {}", path.display()))?;
    match reply.msg {
        Admin::Status { json: text } => {
            if json {
                println!("{text}");
            } else {
                print!("{}", status::pretty(&text).context("status is not valid JSON")?);
            }
            Ok(())
        }
        Admin::Error { reason } => bail!("data plane refused: {reason}"),
        _ => bail!("unexpected reply to StatusRequest"),
    }
}
