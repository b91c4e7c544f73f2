//! Registration with the controller (`--server-id-from-controller --control PATH`),
//! the registration conversation of `proto::wire` ([`Registration`]):
//!
//! 1. worker → controller: `Hello { announce, pid }` (this process's protocol
//!    window, docs/wire.md "Versions");
//! 2. controller → worker: `Welcome { version, .. }` (the negotiated version, which
//!    both sides encode in from then on), `Assign { server_id, keys, reset_key,
//!    token_key }` — the UDP socket fds may travel with it or with a following
//!    `Sockets` (both are accepted; the worker sends on the sockets its data
//!    connection hands over); or `Error` (a version outside its window, a refusal);
//! 3. worker → controller: `Ready` / `Draining` (the data connection has its own);
//! 4. controller → worker: `KeysChanged { keys }` (rotation: new CIDs use the newest
//!    generation at once, ADR 0001).
//!
//! 5. when the control connection is lost (controller restart), [`ControlLink`]
//!    re-registers with `Rejoin { server_id }` (backoff 100 ms → 2 s): a controller
//!    that adopted the running data plane answers `Assign` with the same id and the
//!    current keys; one that did not (its sockets are new) refuses, and so does
//!    silence beyond the grace period — then the worker drains and exits rather than
//!    keep sending on sockets nobody reads.

use crate::cid_gen::CidKeys;
use crate::datasock::{recv_timeout, HandshakeError, SharedSocketFd};
use crate::secrets::Secrets;
use proto::wire::{Announce, Registration, WireError, MAX_TEXT};
use proto::ServerId;
use socket2::SockRef;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use sys::seqpacket::{Channel, Incoming};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// What the controller assigned.
#[derive(Debug)]
pub struct Assignment {
    pub server_id: ServerId,
    pub secrets: Secrets,
    /// UDP sockets the controller passed (may be empty).
    pub sockets: Vec<SharedSocketFd>,
    /// The control connection (blocking mode).
    pub conn: OwnedFd,
    /// The protocol version the hello negotiated: the connection's from now on.
    pub version: u8,
}

/// This process's hello announcement (no registration capability is defined yet).
fn announce() -> Announce {
    Announce::plain(sys::protocol::window())
}

/// Connects to the controller and registers (blocking; run in `spawn_blocking`).
pub fn register(path: &Path, timeout: Duration) -> Result<Assignment, HandshakeError> {
    let conn = sys::seqpacket::connect(path)?;
    register_on(conn, timeout)
}

/// Registers on an already connected control socket.
pub fn register_on(conn: OwnedFd, timeout: Duration) -> Result<Assignment, HandshakeError> {
    register_with(conn, &Registration::Hello { announce: announce(), pid: std::process::id() }, timeout)
}

/// Registers again under `server_id` after losing the controller (`Rejoin`).
pub fn rejoin(path: &Path, server_id: ServerId, timeout: Duration) -> Result<Assignment, HandshakeError> {
    let conn = sys::seqpacket::connect(path)?;
    let a = register_with(
        conn,
        &Registration::Rejoin { announce: announce(), server_id, pid: std::process::id() },
        timeout,
    )?;
    if a.server_id != server_id {
        return Err(HandshakeError::Refused(format!("rejoin as {server_id} answered with server id {}", a.server_id)));
    }
    Ok(a)
}

fn register_with(conn: OwnedFd, first: &Registration, timeout: Duration) -> Result<Assignment, HandshakeError> {
    SockRef::from(&conn).set_nonblocking(false)?;
    let controller = Channel::<Registration>::new(conn.as_fd());
    controller.send(first)?;
    recv_timeout(&conn, Some(timeout))?;
    let mut buf = vec![0u8; 16 + MAX_TEXT];
    let mut assigned: Option<(ServerId, Secrets, Vec<OwnedFd>)> = None;
    let window = sys::protocol::window();
    let mut version: Option<u8> = None;
    let other_version = |v: u8| {
        HandshakeError::Protocol(format!("the controller answered in protocol version {v}: this build speaks {window}"))
    };
    loop {
        let got = match controller.recv(&mut buf) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // After Assign, a Sockets record is optional: a quiet line ends the wait.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && assigned.is_some() => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(HandshakeError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no Assign from the controller",
                )))
            }
            Err(e) => return Err(e.into()),
        };
        match got {
            Incoming::Closed if assigned.is_some() => break,
            Incoming::Closed => return Err(HandshakeError::Closed),
            Incoming::TooLong | Incoming::Malformed(WireError::BadMagic) => {
                return Err(HandshakeError::Protocol("unexpected record from the controller".into()))
            }
            Incoming::Malformed(WireError::UnsupportedVersion(v)) => return Err(other_version(v)),
            Incoming::Malformed(e) => return Err(HandshakeError::Protocol(format!("undecodable control record: {e}"))),
            Incoming::Message { msg: Registration::Welcome { version: v, .. }, .. } if version.is_none() => {
                if !window.speaks(v) {
                    return Err(other_version(v));
                }
                version = Some(v);
            }
            Incoming::Message { msg: Registration::Assign { .. } | Registration::Sockets { .. }, .. }
                if version.is_none() =>
            {
                return Err(HandshakeError::Protocol("the controller answered without Welcome".into()))
            }
            Incoming::Message { msg: Registration::Assign { server_id, keys, reset_key, token_key }, fds } => {
                keys.key_set().map_err(|e| HandshakeError::Protocol(format!("Assign keys: {e}")))?;
                assigned = Some((server_id, Secrets { keys, reset_key, token_key }, fds));
                // Give a following Sockets a moment, not the whole timeout.
                recv_timeout(&conn, Some(Duration::from_millis(200)))?;
            }
            Incoming::Message { msg: Registration::Sockets { addrs }, fds: more } if assigned.is_some() => {
                let (id, secrets, mut fds) = assigned.take().ok_or(HandshakeError::Closed)?;
                fds.extend(more);
                let sockets = pair_sockets(addrs, fds)?;
                recv_timeout(&conn, None)?;
                let version = version.unwrap_or(window.newest);
                return Ok(Assignment { server_id: id, secrets, sockets, conn, version });
            }
            Incoming::Message { msg: Registration::Error { reason }, .. } => {
                return Err(HandshakeError::Refused(reason))
            }
            Incoming::Message { msg: other, .. } => {
                tracing::debug!(?other, "ignoring control message during registration")
            }
        }
    }
    let (server_id, secrets, _fds_without_addresses) = assigned.ok_or(HandshakeError::Closed)?;
    recv_timeout(&conn, None)?;
    let version = version.unwrap_or(window.newest);
    Ok(Assignment { server_id, secrets, sockets: Vec::new(), conn, version })
}

fn pair_sockets(addrs: Vec<std::net::SocketAddr>, fds: Vec<OwnedFd>) -> Result<Vec<SharedSocketFd>, HandshakeError> {
    if addrs.len() != fds.len() {
        return Err(HandshakeError::Protocol(format!("{} addresses but {} descriptors", addrs.len(), fds.len())));
    }
    addrs
        .into_iter()
        .zip(fds)
        .map(|(addr, fd)| {
            if SockRef::from(&fd).r#type()? != socket2::Type::DGRAM {
                return Err(HandshakeError::Protocol(format!("descriptor for {addr} is not a UDP socket")));
            }
            Ok(SharedSocketFd { addr, fd })
        })
        .collect()
}

/// The live control connection: lifecycle messages out, key rotations in.
#[derive(Debug)]
pub struct ControlConn {
    fd: AsyncFd<OwnedFd>,
    /// The negotiated protocol version.
    version: u8,
}

impl ControlConn {
    /// Takes over the registered connection, whose hello negotiated `version`
    /// ([`Assignment::version`]). Call inside tokio.
    pub fn new(conn: OwnedFd, version: u8) -> io::Result<Arc<ControlConn>> {
        SockRef::from(&conn).set_nonblocking(true)?;
        let fd = crate::async_fd::register(conn, Interest::READABLE | Interest::WRITABLE)?;
        Ok(Arc::new(ControlConn { fd, version }))
    }

    pub async fn send(&self, m: &Registration) -> io::Result<()> {
        loop {
            let mut g = self.fd.writable().await?;
            match g.try_io(|inner| Channel::new(inner.get_ref().as_fd()).dont_wait().at(self.version).send(m)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads the controller's messages until it closes: `KeysChanged` replaces the
    /// CID keys. Returns when the connection ends.
    pub async fn run(&self, keys: CidKeys) {
        let mut buf = vec![0u8; 16 + MAX_TEXT];
        loop {
            let mut g = match self.fd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "control connection failed");
                    return;
                }
            };
            let got = match g
                .try_io(|inner| Channel::<Registration>::new(inner.get_ref().as_fd()).dont_wait().recv(&mut buf))
            {
                Err(_would_block) => continue,
                Ok(Ok(got)) => got,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "control connection failed");
                    return;
                }
            };
            match got {
                Incoming::Closed => {
                    tracing::warn!("controller closed the control connection");
                    return;
                }
                Incoming::Message { msg: Registration::KeysChanged { keys: k }, .. } => match k.key_set() {
                    Ok(ks) => {
                        tracing::info!(newest = k.newest.generation.get(), "key rotation");
                        keys.replace(ks);
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring KeysChanged with a bad key set"),
                },
                Incoming::Message { msg: Registration::Error { reason }, .. } => {
                    tracing::warn!(%reason, "controller reports an error")
                }
                Incoming::Message { msg, .. } => tracing::debug!(?msg, "ignoring control message"),
                Incoming::TooLong => tracing::warn!("over-long control record from the controller"),
                Incoming::Malformed(e) => tracing::warn!(error = %e, "malformed control record from the controller"),
            }
        }
    }
}

/// The control connection kept across controller restarts: lifecycle messages go
/// to the current connection; a lost connection is re-registered (`Rejoin`).
#[derive(Debug)]
pub struct ControlLink {
    path: std::path::PathBuf,
    server_id: ServerId,
    current: std::sync::Mutex<Option<Arc<ControlConn>>>,
    /// The last lifecycle message sent (`Ready` / `Draining`), repeated after a rejoin.
    state: std::sync::Mutex<Option<Registration>>,
    /// How long to try re-registering before giving up.
    grace: Duration,
}

impl ControlLink {
    pub fn new(path: &Path, server_id: ServerId, conn: Arc<ControlConn>, grace: Duration) -> Arc<ControlLink> {
        Arc::new(ControlLink {
            path: path.to_path_buf(),
            server_id,
            current: std::sync::Mutex::new(Some(conn)),
            state: std::sync::Mutex::new(None),
            grace,
        })
    }

    fn conn(&self) -> Option<Arc<ControlConn>> {
        self.current.lock().ok().and_then(|g| g.clone())
    }

    /// Sends `Ready` / `Draining` (remembered and repeated after a rejoin). Without a
    /// controller connection right now this succeeds: the rejoin sends it.
    pub async fn send(&self, m: &Registration) -> io::Result<()> {
        if let Ok(mut g) = self.state.lock() {
            *g = Some(m.clone());
        }
        match self.conn() {
            Some(c) => c.send(m).await,
            None => Ok(()),
        }
    }

    /// Follows the controller: key rotations in; on loss, re-registers. Returns only
    /// when the worker must stop (refused, or no controller within the grace period),
    /// with the reason.
    pub async fn run(self: Arc<Self>, keys: CidKeys) -> String {
        loop {
            let Some(cc) = self.conn() else {
                return "no control connection".into();
            };
            cc.run(keys.clone()).await;
            if let Ok(mut g) = self.current.lock() {
                *g = None;
            }
            tracing::warn!(server_id = %self.server_id, "lost the controller; re-registering");
            let deadline = tokio::time::Instant::now() + self.grace;
            let mut backoff = Duration::from_millis(100);
            loop {
                if tokio::time::Instant::now() >= deadline {
                    return format!("no controller took us back within {:?}", self.grace);
                }
                let (p, id) = (self.path.clone(), self.server_id);
                let r = tokio::task::spawn_blocking(move || rejoin(&p, id, Duration::from_secs(5))).await;
                match r {
                    Ok(Ok(asg)) => match (asg.secrets.keys.key_set(), ControlConn::new(asg.conn, asg.version)) {
                        (Ok(ks), Ok(cc)) => {
                            keys.replace(ks);
                            if let Ok(mut g) = self.current.lock() {
                                *g = Some(Arc::clone(&cc));
                            }
                            let last = self.state.lock().ok().and_then(|g| g.clone());
                            if let Some(m) = last {
                                if let Err(e) = cc.send(&m).await {
                                    tracing::warn!(error = %e, "could not repeat the lifecycle state");
                                }
                            }
                            tracing::info!(server_id = %self.server_id, "re-registered with the controller");
                            break;
                        }
                        (Err(e), _) => return format!("rejoin: bad keys: {e}"),
                        (_, Err(e)) => return format!("rejoin: {e}"),
                    },
                    Ok(Err(HandshakeError::Refused(reason))) => {
                        return format!("the controller refused the rejoin: {reason}")
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "rejoin failed; retrying"),
                    Err(e) => return format!("rejoin task: {e}"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::keyfile::KeyFile;
    use proto::wire::{Keys, Message};

    fn keys() -> KeyFile {
        KeyFile::generate(&[3; proto::keyfile::RANDOM_LEN], proto::cid::Prf::SipHash24)
    }

    fn welcome() -> Vec<u8> {
        Message::to_record(&Registration::Welcome { version: proto::wire::PROTOCOL_VERSION, caps: 0 })
    }

    fn assign(k: &KeyFile) -> Registration {
        Registration::Assign {
            server_id: ServerId(9),
            keys: k.keys.clone(),
            reset_key: k.reset_key,
            token_key: k.token_key,
        }
    }

    #[test]
    fn registration_with_and_without_sockets() {
        // Assign, then Sockets with one UDP fd.
        let (w, c) = sys::seqpacket::pair().unwrap();
        let k = keys();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let r = sys::seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            let hello = Registration::decode(&buf[..r.len]).unwrap();
            assert!(
                matches!(hello, Registration::Hello { announce, pid } if announce.window == sys::protocol::window() && pid == std::process::id()),
                "{hello:?}"
            );
            sys::seqpacket::send_record(c.as_fd(), &welcome(), &[], 0).unwrap();
            sys::seqpacket::send_record(c.as_fd(), &Message::to_record(&assign(&keys())), &[], 0).unwrap();
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let addrs = vec![udp.local_addr().unwrap()];
            sys::seqpacket::send_record(
                c.as_fd(),
                &Message::to_record(&Registration::Sockets { addrs }),
                &[udp.as_fd()],
                0,
            )
            .unwrap();
            c
        });
        let a = register_on(w, Duration::from_secs(5)).unwrap();
        assert_eq!(a.server_id, ServerId(9));
        assert_eq!(a.version, proto::wire::PROTOCOL_VERSION);
        assert_eq!(a.secrets.reset_key, k.reset_key);
        assert_eq!(a.sockets.len(), 1);
        drop(t.join());

        // Assign alone (sockets come from the data plane).
        let (w, c) = sys::seqpacket::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            sys::seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            sys::seqpacket::send_record(c.as_fd(), &welcome(), &[], 0).unwrap();
            sys::seqpacket::send_record(c.as_fd(), &Message::to_record(&assign(&keys())), &[], 0).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            c
        });
        let a = register_on(w, Duration::from_secs(5)).unwrap();
        assert!(a.sockets.is_empty());
        assert_eq!(a.secrets.keys, k.keys);
        drop(t.join());

        // Refusal and silence.
        let (w, c) = sys::seqpacket::pair().unwrap();
        sys::seqpacket::send_record(
            c.as_fd(),
            &Message::to_record(&Registration::Error { reason: "full".into() }),
            &[],
            0,
        )
        .unwrap();
        assert!(matches!(register_on(w, Duration::from_secs(5)), Err(HandshakeError::Refused(_))));
        let (w, _c) = sys::seqpacket::pair().unwrap();
        assert!(register_on(w, Duration::from_millis(100)).is_err());
    }

    /// docs/wire.md "Versions": the answer to the hello is `Welcome` in a version we
    /// speak; one in another version, or an `Assign` without it, is refused with the
    /// versions named; a refusal's text reaches the caller.
    #[test]
    fn registration_needs_a_welcome_in_a_version_we_speak() {
        let own = sys::protocol::window();
        let answer = |recs: Vec<Vec<u8>>| {
            let (w, c) = sys::seqpacket::pair().unwrap();
            for r in &recs {
                sys::seqpacket::send_record(c.as_fd(), r, &[], 0).unwrap();
            }
            let r = register_on(w, Duration::from_secs(5));
            drop(c);
            r
        };
        let newer = Message::to_record(&Registration::Welcome { version: own.newest + 1, caps: 0 });
        match answer(vec![newer, Message::to_record(&assign(&keys()))]) {
            Err(HandshakeError::Protocol(p)) => {
                assert_eq!(
                    p,
                    format!("the controller answered in protocol version {}: this build speaks {own}", own.newest + 1)
                )
            }
            other => panic!("{other:?}"),
        }
        match answer(vec![Message::to_record(&assign(&keys()))]) {
            Err(HandshakeError::Protocol(p)) => assert!(p.contains("without Welcome"), "{p}"),
            other => panic!("{other:?}"),
        }
        // Assign in a version we do not speak, after a good Welcome.
        match answer(vec![welcome(), assign(&keys()).to_record_at(own.newest + 1)]) {
            Err(HandshakeError::Protocol(p)) => {
                assert!(p.contains(&format!("protocol version {}", own.newest + 1)), "{p}")
            }
            other => panic!("{other:?}"),
        }
        let refusal = "protocol version 3 not supported: this build speaks 5 and 4";
        let err = Registration::Error { reason: refusal.into() }.to_record_at(own.newest);
        assert!(matches!(answer(vec![err]), Err(HandshakeError::Refused(r)) if r == refusal));
    }

    #[tokio::test]
    async fn keys_changed_rotates_the_cid_keys_and_lifecycle_goes_out() {
        let (w, c) = sys::seqpacket::pair().unwrap();
        let k = keys();
        let cid_keys = CidKeys::new(k.key_set().unwrap());
        let cc = ControlConn::new(w, proto::wire::PROTOCOL_VERSION).unwrap();
        cc.send(&Registration::Ready).await.unwrap();
        let mut buf = [0u8; 128];
        let r = sys::seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
        assert_eq!(Registration::decode(&buf[..r.len]).unwrap(), Registration::Ready);
        let rotated: Keys = k.rotated([7; 32], proto::cid::Prf::SipHash24).keys;
        sys::seqpacket::send_record(
            c.as_fd(),
            &Message::to_record(&Registration::KeysChanged { keys: rotated.clone() }),
            &[],
            0,
        )
        .unwrap();
        sys::seqpacket::send_record(c.as_fd(), &[0xc7, proto::wire::PROTOCOL_VERSION, 0x3f], &[], 0).unwrap(); // malformed: logged, ignored
        drop(c);
        tokio::time::timeout(Duration::from_secs(2), cc.run(cid_keys.clone())).await.unwrap();
        assert_eq!(cid_keys.load().newest(), rotated.newest.generation);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn link_rejoins_with_its_id_then_stops_when_refused() {
        let dir = std::env::temp_dir().join(format!("wk-rejoin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.sock");
        let listener = sys::seqpacket::listen(&path, 64).unwrap();
        let k = keys();
        let rotated = k.rotated([5; 32], proto::cid::Prf::SipHash24);
        let newest = rotated.keys.newest.generation;
        let (w, c) = sys::seqpacket::pair().unwrap();
        let cid_keys = CidKeys::new(k.key_set().unwrap());
        let cc = ControlConn::new(w, proto::wire::PROTOCOL_VERSION).unwrap();
        let link = ControlLink::new(&path, ServerId(9), cc, Duration::from_secs(10));
        link.send(&Registration::Ready).await.unwrap();
        // The fake controller: drop the first connection (controller death), take the
        // Rejoin and answer with the same id and rotated keys, expect Ready repeated,
        // then drop again and refuse the next Rejoin.
        let fake = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let r = sys::seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            assert_eq!(Registration::decode(&buf[..r.len]).unwrap(), Registration::Ready);
            drop(c);
            let conn = sys::seqpacket::accept(listener.as_fd()).unwrap();
            let r = sys::seqpacket::recv_record(conn.as_fd(), &mut buf, 0).unwrap();
            assert!(matches!(
                Registration::decode(&buf[..r.len]).unwrap(),
                Registration::Rejoin { server_id: ServerId(9), .. }
            ));
            sys::seqpacket::send_record(conn.as_fd(), &welcome(), &[], 0).unwrap();
            let a = Registration::Assign {
                server_id: ServerId(9),
                keys: rotated.keys.clone(),
                reset_key: rotated.reset_key,
                token_key: rotated.token_key,
            };
            sys::seqpacket::send_record(conn.as_fd(), &Message::to_record(&a), &[], 0).unwrap();
            let r = sys::seqpacket::recv_record(conn.as_fd(), &mut buf, 0).unwrap();
            assert_eq!(
                Registration::decode(&buf[..r.len]).unwrap(),
                Registration::Ready,
                "last state repeated after rejoin"
            );
            drop(conn);
            let conn = sys::seqpacket::accept(listener.as_fd()).unwrap();
            let _ = sys::seqpacket::recv_record(conn.as_fd(), &mut buf, 0).unwrap();
            let e = Registration::Error { reason: "other sockets".into() };
            sys::seqpacket::send_record(conn.as_fd(), &Message::to_record(&e), &[], 0).unwrap();
        });
        let why = tokio::time::timeout(Duration::from_secs(20), Arc::clone(&link).run(cid_keys.clone())).await.unwrap();
        assert!(why.contains("refused") && why.contains("other sockets"), "{why}");
        assert_eq!(cid_keys.load().newest(), newest, "keys from the rejoin Assign applied");
        fake.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
