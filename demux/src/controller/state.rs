//! The controller's state directory (ADR 0001 "Keys", "Server id"):
//!
//! - `keys`: the shared secrets and CID key generations (`proto::keyfile`), 0600,
//!   created on the first start only;
//! - `server-id`: the server-id counter (`next`, `starts_in_generation`), 0600;
//! - `controller.lock` (flock: one controller per directory), `controller.pid`,
//!   `dataplane.pid`, `workers` (pids of the workers the controller spawned).
//!
//! Every file is written atomically: temp file, fsync, rename, fsync of the
//! directory. A corrupt, group/other-accessible or foreign-owned state file stops
//! start-up with an error — never a silent new key, which would orphan every live
//! connection.

use anyhow::{bail, Context, Result};
use proto::cid_format::FormatSpec;
use proto::keyfile::KeyFile;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const COUNTER_MAGIC: &str = "quicdemux-server-id 1";

/// Paths inside the state directory.
#[derive(Clone, Debug)]
pub struct Paths {
    pub dir: PathBuf,
}

impl Paths {
    pub fn new(dir: &Path) -> Paths {
        Paths { dir: dir.to_path_buf() }
    }
    pub fn keys(&self) -> PathBuf {
        self.dir.join("keys")
    }
    pub fn counter(&self) -> PathBuf {
        self.dir.join("server-id")
    }
    pub fn lock(&self) -> PathBuf {
        self.dir.join("controller.lock")
    }
    pub fn controller_pid(&self) -> PathBuf {
        self.dir.join("controller.pid")
    }
    pub fn dataplane_pid(&self) -> PathBuf {
        self.dir.join("dataplane.pid")
    }
    /// Data-plane restarts on the current sockets (kept across controller restarts).
    pub fn dataplane_restarts(&self) -> PathBuf {
        self.dir.join("dataplane.restarts")
    }
    pub fn workers(&self) -> PathBuf {
        self.dir.join("workers")
    }
    /// The controller's registration socket (workers, operator tools).
    pub fn control_sock(&self) -> PathBuf {
        self.dir.join("control.sock")
    }
    /// The data plane's data socket (workers' data connections; by convention next
    /// to control.sock, so `worker --control DIR/control.sock` finds it).
    pub fn data_sock(&self) -> PathBuf {
        self.dir.join("data.sock")
    }
    /// The data plane's control socket (status, KeysChanged, GetSockets).
    pub fn dataplane_sock(&self) -> PathBuf {
        self.dir.join("dataplane.sock")
    }
    pub fn dataplane_ready(&self) -> PathBuf {
        self.dir.join("dataplane.ready")
    }
    /// `quicdemux-state N` (controller/state_format.rs).
    pub fn state_format(&self) -> PathBuf {
        self.dir.join("state-format")
    }
    /// `demux upgrade`'s request: the binaries to upgrade to (controller/upgrade.rs).
    pub fn upgrade_request(&self) -> PathBuf {
        self.dir.join("upgrade.request")
    }
    /// An upgrade's outcome, for `demux upgrade` (controller/upgrade.rs).
    pub fn upgrade_result(&self) -> PathBuf {
        self.dir.join("upgrade.result")
    }
    /// Written by a controller about to re-execute itself for an upgrade; the new
    /// one turns it into `upgrade.result` once it serves (controller/upgrade.rs).
    pub fn upgrade_exec(&self) -> PathBuf {
        self.dir.join("upgrade.exec")
    }
}

fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Creates the state directory (0700) or checks an existing one: a directory, ours,
/// not accessible to group or others.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    prepare_dir_for(dir, None)
}

/// As [`prepare_dir`]; with `Some(gid)` (`--worker-user`) the directory is then
/// given to that group with mode 0710 (search only: the workers reach the two
/// sockets in it, list nothing, read no file), and an existing 0710 directory of
/// that group is accepted.
pub fn prepare_dir_for(dir: &Path, group: Option<u32>) -> Result<()> {
    prepare_private_dir(dir, group)?;
    if let Some(gid) = group {
        crate::trust::share_with_group(dir, gid, 0o710)?;
    }
    Ok(())
}

fn prepare_private_dir(dir: &Path, group: Option<u32>) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating state directory {}", dir.display()))?;
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("state directory {}", dir.display())),
        Ok(md) => {
            if !md.is_dir() {
                bail!("state directory {} is not a directory", dir.display());
            }
            if md.uid() != uid() {
                bail!("state directory {} belongs to uid {}, not to us (uid {})", dir.display(), md.uid(), uid());
            }
            let group_search = if group == Some(md.gid()) { 0o010 } else { 0 };
            if md.mode() & 0o077 & !group_search != 0 {
                bail!(
                    "state directory {} has mode {:o}; it must not be accessible to group or others (chmod 700)",
                    dir.display(),
                    md.mode() & 0o777
                );
            }
            Ok(())
        }
    }
}

/// Reads a state file after checking it is a regular file of ours with mode 0600.
/// `Ok(None)` when it does not exist.
pub fn read_private(path: &Path) -> Result<Option<String>> {
    let md = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("state file {}", path.display())),
        Ok(md) => md,
    };
    if !md.is_file() {
        bail!("state file {} is not a regular file", path.display());
    }
    if md.uid() != uid() {
        bail!(
            "state file {} belongs to uid {}, not to us (uid {}); refusing to use it",
            path.display(),
            md.uid(),
            uid()
        );
    }
    if md.mode() & 0o077 != 0 {
        bail!(
            "state file {} has mode {:o}; it must be 0600 (someone else may have read or written it)",
            path.display(),
            md.mode() & 0o777
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading state file {}", path.display()))?;
    Ok(Some(text))
}

/// Writes `text` atomically with mode 0600: temp file, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", tmp.display()))?;
    f.sync_all().with_context(|| format!("fsync {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    let d = std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    d.sync_all().with_context(|| format!("fsync {}", dir.display()))?;
    Ok(())
}

/// Loads the key file, or creates it when the directory has none yet (first start).
pub fn load_or_create_keys(p: &Paths) -> Result<(KeyFile, bool)> {
    match read_private(&p.keys())? {
        Some(text) => {
            let k = KeyFile::parse(&text)
                .with_context(|| format!("key file {} is corrupt; refusing to start (restore it from a backup: a new key would orphan every live connection)", p.keys().display()))?;
            k.key_set().map_err(|e| anyhow::anyhow!("key file {}: {e:?}", p.keys().display()))?;
            Ok((k, false))
        }
        None => {
            let mut random = [0u8; proto::keyfile::RANDOM_LEN];
            sys::os_random(&mut random).context("getrandom")?;
            let k = KeyFile::generate(&random, proto::cid::Prf::SipHash24);
            write_atomic(&p.keys(), &k.to_text())?;
            Ok((k, true))
        }
    }
}

/// Rotates the key file (ADR 0001): a fresh newest generation, the old newest stays
/// decodable, the one before is dropped. Returns the new file (already persisted).
/// The new generation uses `prf`, or the newest generation's PRF when `None`.
///
/// Two phases across hosts (ADR 0005): `Stage` adds the next generation as decodable
/// and keeps issuing the current one; `Activate` issues the staged one. A plain
/// rotation or a second stage while a generation is staged is refused (it would
/// drop the key the other hosts staged), and so is an activation with nothing staged.
pub fn rotate_keys(
    p: &Paths,
    current: &KeyFile,
    prf: Option<proto::cid::Prf>,
    phase: proto::wire::admin::RotatePhase,
    from: Option<&Path>,
    format: Option<&FormatSpec>,
) -> Result<KeyFile> {
    let k = next_keys(current, prf, phase, from, format)?;
    write_atomic(&p.keys(), &k.to_text())?;
    Ok(k)
}

/// The key file a rotation makes of `current` ([`rotate_keys`] without the write):
/// the new generation takes `format`, by default the newest generation's
/// (`FormatSpec::kept`, docs/adr/0007-quic-lb.md).
pub fn next_keys(
    current: &KeyFile,
    prf: Option<proto::cid::Prf>,
    phase: proto::wire::admin::RotatePhase,
    from: Option<&Path>,
    format: Option<&FormatSpec>,
) -> Result<KeyFile> {
    use proto::wire::admin::RotatePhase;
    if format.is_some() && (from.is_some() || phase == RotatePhase::Activate) {
        bail!("a CID format applies to a new generation: not with --activate or --from (the staged one has its own)");
    }
    let newest = &current.keys.newest;
    let spec = format.copied().unwrap_or_else(|| FormatSpec::kept(&newest.format, &newest.secret));
    let (mut fresh, mut fresh_forwarding) = ([0u8; 32], [0u8; 32]);
    sys::os_random(&mut fresh).context("getrandom")?;
    sys::os_random(&mut fresh_forwarding).context("getrandom")?;
    let prf = prf.unwrap_or(current.keys.newest.prf);
    let staged_gen = current.keys.previous.map(|g| g.generation.get());
    let k = match phase {
        RotatePhase::Rotate | RotatePhase::Stage if current.is_staged() => bail!(
            "key generation {staged_gen:?} is staged: `rotate-keys --activate` it first (on every host), or the \
             hosts that staged it would lose it"
        ),
        RotatePhase::Rotate => current.rotated_as(fresh, prf, &spec)?,
        RotatePhase::Stage => match from {
            None => current.staged_as(fresh, fresh_forwarding, prf, &spec)?,
            Some(f) => {
                let text = read_private(f)?.with_context(|| format!("{} does not exist", f.display()))?;
                let other = KeyFile::parse(&text).with_context(|| format!("key file {}", f.display()))?;
                current.staged_from(&other).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
            }
        },
        RotatePhase::Activate => {
            current.activated().context("no key generation is staged (`rotate-keys --stage` on every host first)")?
        }
    };
    Ok(k)
}

/// The server-id counter (ADR 0001: 16-bit ids, monotonic per instance start, never
/// reused while a key generation lives; the generation rotates every
/// `--rotate-every` starts, and at most two generations live, so an id comes back
/// only after 65 536 starts > 2 × rotate-every).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    /// The id the next instance start gets.
    pub next: u16,
    /// Instance starts since the newest key generation was made.
    pub starts_in_generation: u32,
}

impl Counter {
    fn parse(text: &str) -> Result<Counter, String> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        if lines.next() != Some(COUNTER_MAGIC) {
            return Err(format!("first line is not '{COUNTER_MAGIC}'"));
        }
        let (mut next, mut starts) = (None, None);
        for l in lines {
            let mut it = l.split_whitespace();
            let (k, v, rest) = (it.next(), it.next(), it.next());
            if rest.is_some() {
                return Err(format!("bad line '{l}'"));
            }
            match (k, v) {
                (Some("next"), Some(v)) if next.is_none() => {
                    next = Some(v.parse::<u16>().map_err(|e| format!("next: {e}"))?)
                }
                (Some("starts_in_generation"), Some(v)) if starts.is_none() => {
                    starts = Some(v.parse::<u32>().map_err(|e| format!("starts_in_generation: {e}"))?)
                }
                _ => return Err(format!("bad or repeated line '{l}'")),
            }
        }
        match (next, starts) {
            (Some(next), Some(starts_in_generation)) => Ok(Counter { next, starts_in_generation }),
            _ => Err("missing 'next' or 'starts_in_generation'".into()),
        }
    }

    fn to_text(self) -> String {
        format!("{COUNTER_MAGIC}\nnext {}\nstarts_in_generation {}\n", self.next, self.starts_in_generation)
    }
}

pub fn load_or_create_counter(p: &Paths) -> Result<Counter> {
    match read_private(&p.counter())? {
        Some(text) => Counter::parse(&text)
            .map_err(|e| anyhow::anyhow!("server-id counter {} is corrupt ({e}); refusing to start (a reset counter would reuse live server ids)", p.counter().display())),
        None => {
            let c = Counter { next: 1, starts_in_generation: 0 };
            write_atomic(&p.counter(), &c.to_text())?;
            Ok(c)
        }
    }
}

pub fn store_counter(p: &Paths, c: Counter) -> Result<()> {
    write_atomic(&p.counter(), &c.to_text())
}

/// Takes the directory's controller lock (flock, released when the process dies).
pub fn lock(p: &Paths) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(p.lock())
        .with_context(|| format!("opening {}", p.lock().display()))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let other = std::fs::read_to_string(p.controller_pid()).unwrap_or_default();
        bail!("another controller runs on {} (pid {})", p.dir.display(), other.trim());
    }
    Ok(f)
}

/// Reads a pid file (`None` when missing or not a number).
pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok().filter(|p: &i32| *p > 0)
}

/// Whether a process with this pid exists (it may be a zombie).
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_round_trip_and_corruption() {
        let c = Counter { next: 65535, starts_in_generation: 7 };
        assert_eq!(Counter::parse(&c.to_text()), Ok(c));
        assert!(Counter::parse("").is_err());
        assert!(Counter::parse("quicdemux-server-id 1\nnext 70000\nstarts_in_generation 1\n").is_err());
        assert!(Counter::parse("quicdemux-server-id 1\nnext 1\n").is_err());
        assert!(Counter::parse("quicdemux-server-id 1\nnext 1\nnext 2\nstarts_in_generation 0\n").is_err());
    }

    #[test]
    fn files_are_private_atomic_and_checked() {
        let dir = std::env::temp_dir().join(format!("qd-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        prepare_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let p = Paths::new(&dir);
        let (k, created) = load_or_create_keys(&p).unwrap();
        assert!(created);
        assert_eq!(std::fs::metadata(p.keys()).unwrap().mode() & 0o777, 0o600);
        // Second start: the same keys, never new ones.
        let (k2, created2) = load_or_create_keys(&p).unwrap();
        assert!(!created2 && k2 == k);
        assert_eq!(k.keys.newest.prf, proto::cid::Prf::SipHash24, "new state directories use siphash-2-4");
        let r = rotate_keys(&p, &k, None, proto::wire::admin::RotatePhase::Rotate, None, None).unwrap();
        assert_eq!(load_or_create_keys(&p).unwrap().0, r);
        assert_eq!(r.keys.previous, Some(k.keys.newest));
        assert_eq!(r.keys.newest.prf, proto::cid::Prf::SipHash24, "rotation keeps the PRF");
        // rotate-keys --prf: the new generation switches, the previous keeps its own.
        let h =
            rotate_keys(&p, &r, Some(proto::cid::Prf::HmacSha256), proto::wire::admin::RotatePhase::Rotate, None, None)
                .unwrap();
        assert_eq!(
            (h.keys.newest.prf, h.keys.previous.map(|g| g.prf)),
            (proto::cid::Prf::HmacSha256, Some(proto::cid::Prf::SipHash24))
        );
        assert_eq!(load_or_create_keys(&p).unwrap().0, h);
        // Two phases (ADR 0005): stage keeps issuing, activate issues the staged one;
        // a rotation or a second stage while staged, or an activation with nothing
        // staged, is refused and changes nothing.
        use proto::wire::admin::RotatePhase::{Activate, Rotate, Stage};
        let err = |r: Result<KeyFile>| format!("{:#}", r.unwrap_err());
        assert!(err(rotate_keys(&p, &h, None, Activate, None, None)).contains("no key generation is staged"));
        let s = rotate_keys(&p, &h, None, Stage, None, None).unwrap();
        assert_eq!(s.keys.newest, h.keys.newest, "staging keeps the issuing generation");
        assert_eq!(s.keys.previous.map(|g| g.generation), Some(h.keys.newest.generation.next()));
        assert!(s.is_staged() && !h.is_staged());
        for phase in [Rotate, Stage] {
            assert!(err(rotate_keys(&p, &s, None, phase, None, None)).contains("--activate"), "{phase:?}");
        }
        assert_eq!(load_or_create_keys(&p).unwrap().0, s, "refusals leave the file");
        let a = rotate_keys(&p, &s, None, Activate, None, None).unwrap();
        assert_eq!((a.keys.newest, a.keys.previous), (s.keys.previous.unwrap(), Some(h.keys.newest)));
        assert!(!a.is_staged());
        assert_eq!(load_or_create_keys(&p).unwrap().0, a);
        // ADR 0007: `--cid-format` switches the new generation's format; a rotation
        // without it keeps the newest's (a generated key is generated afresh); a
        // format with --activate is refused.
        use proto::cid_format::CidFormat;
        let spec: FormatSpec = "quic-lb server-id=2 key=generate length=self".parse().unwrap();
        assert!(err(rotate_keys(&p, &s, None, Activate, None, Some(&spec))).contains("not with --activate"));
        let q = rotate_keys(&p, &a, None, Rotate, None, Some(&spec)).unwrap();
        let CidFormat::QuicLb(qp) = q.keys.newest.format else { panic!("quic-lb: {q:?}") };
        assert_eq!(qp.config_id.get(), 2 * q.keys.newest.generation.get());
        assert_eq!(qp.key.map(|k| k.to_vec()), Some(q.keys.newest.secret[..16].to_vec()));
        assert_eq!(load_or_create_keys(&p).unwrap().0, q);
        let kept = rotate_keys(&p, &q, None, Rotate, None, None).unwrap();
        let CidFormat::QuicLb(kp) = kept.keys.newest.format else { panic!("kept: {kept:?}") };
        assert_eq!(kp.config_id.get(), 2 * kept.keys.newest.generation.get());
        assert_eq!(kp.key.map(|k| k.to_vec()), Some(kept.keys.newest.secret[..16].to_vec()), "a fresh key");
        assert_ne!(kp.key, qp.key);
        let back = rotate_keys(&p, &kept, None, Rotate, None, Some(&FormatSpec::Adr1)).unwrap();
        assert_eq!(back.keys.newest.format, CidFormat::Adr1);
        assert_eq!(rotate_keys(&p, &back, None, Rotate, None, None).unwrap().keys.newest.format, CidFormat::Adr1);
        // No temp files left behind.
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
        // Group-readable or corrupt: an error, the file untouched.
        std::fs::set_permissions(p.keys(), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(format!("{:#}", load_or_create_keys(&p).unwrap_err()).contains("0600"));
        std::fs::set_permissions(p.keys(), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(p.keys(), "nonsense").unwrap();
        assert!(format!("{:#}", load_or_create_keys(&p).unwrap_err()).contains("corrupt"));
        assert_eq!(std::fs::read_to_string(p.keys()).unwrap(), "nonsense");
        // Counter round trip; a world-accessible directory is refused.
        let c = load_or_create_counter(&p).unwrap();
        assert_eq!(c, Counter { next: 1, starts_in_generation: 0 });
        store_counter(&p, Counter { next: 9, starts_in_generation: 3 }).unwrap();
        assert_eq!(load_or_create_counter(&p).unwrap().next, 9);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(prepare_dir(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
