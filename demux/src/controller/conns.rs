//! The control socket `DIR/control.sock` (SOCK_SEQPACKET, 0600; docs/wire.md):
//!
//! Two conversations share the socket (`proto::wire::ControlSocket`): a worker's
//! registration and an operator's admin requests; the first record tells which.
//!
//! - every connection opens with a hello (worker `Hello` / `Rejoin`, operator
//!   `Hello`), answered by `Welcome` in the protocol version both speak, which the
//!   connection uses from then on; no version in common is refused
//!   (crate::versions, docs/wire.md "Versions").
//! - worker `Hello` → a fresh server id (persisted before it is handed out),
//!   `Assign{server_id, keys, reset_key, token_key}`, then `Sockets` with shard 0's
//!   UDP fds (SCM_RIGHTS). The data socket is `DIR/data.sock` by convention.
//! - worker `Rejoin{server_id}` after losing its controller → `Assign` with the same
//!   id when this controller serves the sockets it sends on, else `Error`.
//! - worker `Ready` / `Draining`: recorded for `demux status` (the data plane learns
//!   placeability from the worker's data connection, docs/architecture.md).
//! - operator `StatusRequest` → `Status{json}`; `RotateKeys` → rotate, `Status`.
//! - anything malformed or unexpected: `Error{reason}`, logged, connection closed.
//! - accepting is guarded (crate::accept_guard): EMFILE and friends pause accepts
//!   (the listener leaves epoll) and are logged once per interval; a connection that
//!   sends nothing within `HELLO_TIMEOUT` is closed; at most `pending_cap` such
//!   connections are kept, a new one beyond that evicts the oldest.

use super::lifecycle::Event;
use super::{state, Conn, Ctl, Kind};
use crate::control_server::{self, ControlServer, Serves};
use proto::wire::{admin, registration, Admin, ControlSocket, Message, Registration, Window};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Instant;
use sys::seqpacket::Channel;

impl Ctl {
    pub(super) fn accept_all(&mut self) {
        loop {
            if self.accept_guard.paused() {
                return;
            }
            match sys::seqpacket::accept_nonblocking(self.listener.as_fd()) {
                Ok(Some(fd)) => {
                    if !self.admit_peer(&fd) {
                        continue;
                    }
                    let now = Instant::now();
                    let waiting = self.conns.values().filter(|c| c.idle_since.is_some()).count();
                    if self.accept_guard.evict_oldest(waiting, self.pending_cap, now) {
                        let oldest = self.conns.iter().filter_map(|(t, c)| Some((c.idle_since?, *t))).min();
                        if let Some((_, t)) = oldest {
                            self.close(t, "evicted: too many connections without hello");
                        }
                    }
                    let token = self.next_token;
                    self.next_token += 1;
                    if let Err(e) = self.epoll.add(fd.as_raw_fd(), (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, token) {
                        tracing::warn!(error = %e, "epoll_ctl ADD control connection");
                        continue;
                    }
                    self.conns.insert(token, Conn { fd, kind: Kind::Pending, idle_since: Some(now), version: None });
                }
                Ok(None) => return,
                Err(e) => {
                    // EMFILE and friends: out of the (level-triggered) epoll set until
                    // the pause is over (accept_tick); logged once per interval.
                    self.accept_guard.on_error(&e, Instant::now());
                    let _ = self.epoll.delete(self.listener.as_raw_fd());
                    return;
                }
            }
        }
    }

    /// Every supervision tick: resumes a paused listener and closes connections that
    /// sent nothing within the hello timeout.
    pub(super) fn accept_tick(&mut self, now: Instant) {
        // The fd limit may change under us (prlimit): the cap follows it.
        self.pending_cap = crate::accept_guard::pending_cap();
        if self.accept_guard.resume_due(now) {
            if let Err(e) = self.epoll.add(self.listener.as_raw_fd(), libc::EPOLLIN as u32, super::TOKEN_LISTENER) {
                tracing::warn!(error = %e, "epoll_ctl ADD control.sock listener");
            }
            self.accept_all();
        }
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.idle_since.is_some_and(|t| now.saturating_duration_since(t) >= crate::accept_guard::HELLO_TIMEOUT)
            })
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            self.accept_guard.hello_timed_out();
            self.close(t, "no hello within the timeout");
        }
    }

    pub(super) fn on_conn(&mut self, token: u64, ev: u32) {
        control_server::serve_ready::<ControlSocket, _>(self, token, ev);
    }

    /// Handles one message; false when the connection was closed.
    fn on_message(&mut self, token: u64, m: ControlSocket) -> bool {
        if !self.authorize(token, &m) {
            return false;
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return false;
        };
        conn.idle_since = None;
        use ControlSocket::{Admin as Adm, Registration as Reg};
        match (&mut conn.kind, m) {
            (Kind::Pending, Reg(Registration::Hello { announce, pid })) => {
                self.negotiate::<Registration>(token, announce.window, registration::CAPS_KNOWN)
                    && self.register(token, pid, None)
            }
            (Kind::Pending, Reg(Registration::Rejoin { announce, server_id, pid })) => {
                self.negotiate::<Registration>(token, announce.window, registration::CAPS_KNOWN)
                    && self.register(token, pid, Some(server_id.0))
            }
            (Kind::Pending, Adm(Admin::Hello { announce, .. })) => {
                let ok = self.negotiate::<Admin>(token, announce.window, admin::CAPS_KNOWN);
                if let Some(c) = self.conns.get_mut(&token).filter(|_| ok) {
                    c.kind = Kind::Operator;
                }
                ok
            }
            (Kind::Worker, Reg(Registration::Ready)) => {
                self.lifecycle(Event::Said { token, ready: true });
                true
            }
            (Kind::Worker, Reg(Registration::Draining)) => {
                self.lifecycle(Event::Said { token, ready: false });
                true
            }
            (Kind::Operator, Adm(Admin::StatusRequest)) => {
                let json = self.status_json().to_string();
                self.reply(token, &Admin::Status { json })
            }
            (Kind::Operator, Adm(Admin::RotateKeys { prf, force, phase, from, format })) => {
                let from = from.map(std::path::PathBuf::from);
                match self.rotate("demux rotate-keys", prf, force, phase, from.as_deref(), format.as_ref()) {
                    Ok(()) => {
                        let json = self.status_json().to_string();
                        self.reply(token, &Admin::Status { json })
                    }
                    Err(e) => {
                        self.refuse(token, &format!("rotation failed: {e:#}"));
                        false
                    }
                }
            }
            (_, other) => {
                self.refuse(token, &format!("unexpected message {}", other.name()));
                false
            }
        }
    }

    /// The hello's protocol version (crate::versions): `Welcome` with `caps` sent and
    /// the version kept for the connection, or refused and closed.
    fn negotiate<M: Message>(&mut self, token: u64, theirs: Window, caps: u64) -> bool {
        let Some(c) = self.conns.get(&token) else { return false };
        match crate::versions::answer::<M>(c.fd.as_fd(), "control.sock", theirs, caps) {
            Some(v) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.version = Some(v);
                }
                true
            }
            None => {
                self.close(token, "hello refused");
                false
            }
        }
    }

    /// Answers an operator's request; a failure closes the connection.
    fn reply(&mut self, token: u64, m: &Admin) -> bool {
        let Some(c) = self.conns.get(&token) else { return false };
        if let Err(e) = c.channel::<Admin>().dont_wait().send(m) {
            self.close(token, &format!("reply: {e}"));
            return false;
        }
        true
    }

    /// A worker's Hello (fresh id) or Rejoin (its id again).
    fn register(&mut self, token: u64, pid: u32, rejoin: Option<u16>) -> bool {
        if !self.lc.accepts_registrations() {
            self.refuse(token, "the controller is shutting down");
            return false;
        }
        let server_id = match rejoin {
            Some(id) => {
                // Any id of a worker on the adopted sockets is taken back (however
                // long ago it was issued: held ids are never handed out again).
                let ours = self.issued_here.contains(&id) || self.adopted_sockets;
                if !ours {
                    self.refuse(
                        token,
                        &format!("server id {id} cannot rejoin: this controller did not adopt the sockets it was issued with; drain and exit"),
                    );
                    return false;
                }
                if self.id_held(id) {
                    self.refuse(token, &format!("server id {id} is already registered"));
                    return false;
                }
                id
            }
            None => match self.allocate_id() {
                Ok(id) => id,
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "cannot hand out a server id");
                    self.refuse(token, &format!("cannot allocate a server id: {e:#}"));
                    return false;
                }
            },
        };
        // The data plane admits this id's data hello from this pid only.
        if let Err(e) = self.store_registrations(Some((server_id, pid))) {
            tracing::error!(error = %format!("{e:#}"), "cannot record the registration");
            self.refuse(token, &format!("cannot record the registration: {e:#}"));
            return false;
        }
        // ADR 0005 §4: only what `KeyFile::assign` shares (never the forwarding secret).
        let assign = self.keys.assign(proto::ServerId(server_id));
        let shard0: Vec<RawFd> = self.udp[..self.per_shard].iter().map(|f| f.as_raw_fd()).collect();
        let sockets = Registration::Sockets { addrs: self.udp_addrs[..self.per_shard].to_vec() };
        let sent = match self.conns.get(&token) {
            Some(c) => {
                let ch = c.channel::<Registration>().dont_wait();
                ch.send(&assign).and_then(|()| ch.send_with_raw_fds(&sockets, &shard0))
            }
            None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        };
        if let Err(e) = sent {
            self.close(token, &format!("sending Assign: {e}"));
            return false;
        }
        if !self.lifecycle(Event::Registered { token, pid, server_id, rejoined: rejoin.is_some() }) {
            self.close(token, "registration refused by the lifecycle");
            return false;
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.kind = Kind::Worker;
        }
        true
    }

    pub(super) fn host_layout(&self) -> proto::host::HostLayout {
        // Validated at start (controller::run).
        self.host
    }

    fn id_held(&self, id: u16) -> bool {
        self.lc.server_id_held(id)
    }

    /// The next server id, persisted before it is handed out; rotates the key
    /// generation every `--rotate-every` starts (ADR 0001).
    fn allocate_id(&mut self) -> anyhow::Result<u16> {
        // This host's ids only (ADR 0005; with no host bits, 1..=65535). A counter
        // from another layout restarts in this host's range.
        let host = self.host_layout();
        let mut id =
            if (host.first()..=host.last()).contains(&self.counter.next) { self.counter.next } else { host.first() };
        // After a wrap, skip ids that are still registered (a range later).
        for _ in 0..host.per_host() {
            if !self.id_held(id) {
                break;
            }
            id = host.next(id);
        }
        if self.counter.starts_in_generation >= self.opts.rotate_every {
            let why = format!("{} instance starts in this generation", self.counter.starts_in_generation);
            if host.bits() > 0 {
                // A cluster shares one key file (ADR 0005): one host rotating alone
                // would split it. The operator's tooling rotates every host in two
                // phases; this host says when it is due.
                tracing::warn!(
                    why,
                    "key rotation due: run `rotate-keys --stage` on every host, then `rotate-keys --activate` on every host"
                );
            } else {
                // Paced like an operator's rotation (deferred, not refused: the id is
                // still handed out), unless the id space itself needs the new generation.
                let force = self.counter.starts_in_generation >= host.per_host() / 2;
                let phase = proto::wire::admin::RotatePhase::Rotate;
                if let Err(e) = self.rotate(&why, None, force, phase, None, None) {
                    tracing::warn!(error = %format!("{e:#}"), "automatic key rotation deferred");
                }
            }
        }
        let c = state::Counter { next: host.next(id), starts_in_generation: self.counter.starts_in_generation + 1 };
        state::store_counter(&self.paths, c)?;
        self.counter = c;
        self.issued_here.insert(id);
        Ok(id)
    }

    /// Sends `Error{reason}` (best effort), logs the reason and closes.
    pub(super) fn refuse(&mut self, token: u64, reason: &str) {
        if let Some(c) = self.conns.get(&token) {
            crate::trust::send_error::<ControlSocket>(c.fd.as_fd(), reason);
        }
        tracing::warn!(reason, "closing control connection");
        self.close(token, reason);
    }

    pub(super) fn close(&mut self, token: u64, why: &str) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        let _ = self.epoll.delete(c.fd.as_raw_fd());
        if c.kind == Kind::Worker {
            let who = self.lc.worker_by_token(token).map(|w| (w.server_id(), w.pid()));
            tracing::info!(
                server_id = who.and_then(|w| w.0),
                pid = who.map(|w| w.1),
                why,
                "worker left the controller"
            );
            self.lifecycle(Event::RegistrationClosed { token });
            if let Err(e) = self.store_registrations(None) {
                tracing::warn!(error = %format!("{e:#}"), "could not update the registrations file");
            }
        }
    }
}

/// Sends one message to the data plane's control socket and waits until it has
/// handled it (a StatusRequest behind it is answered in order).
pub(crate) fn tell_dataplane(path: &std::path::Path, m: &Admin) -> anyhow::Result<()> {
    match sys::control::request(path, &[m, &Admin::StatusRequest])?.msg {
        Admin::Status { .. } => Ok(()),
        Admin::Error { reason } => anyhow::bail!("data plane refused: {reason}"),
        _ => anyhow::bail!("unexpected answer from the data plane"),
    }
}

impl ControlServer for Ctl {
    fn close(&mut self, token: u64, why: &str) {
        Ctl::close(self, token, why)
    }
    fn refuse(&mut self, token: u64, why: &str) {
        Ctl::refuse(self, token, why)
    }
    fn refuse_version(&mut self, token: u64, version: u8) {
        if let Some(c) = self.conns.get(&token) {
            crate::versions::refuse_record::<ControlSocket>(c.fd.as_fd(), "control.sock", version);
        }
        Ctl::close(self, token, "protocol version not supported")
    }
    fn recv_buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

impl Conn {
    /// This connection, in its negotiated protocol version once it said its hello.
    pub(super) fn channel<M: Message>(&self) -> Channel<'_, M> {
        let ch = Channel::new(self.fd.as_fd());
        match self.version {
            Some(v) => ch.at(v),
            None => ch,
        }
    }
}

impl Serves<ControlSocket> for Ctl {
    fn channel(&self, token: u64) -> Option<Channel<'_, ControlSocket>> {
        self.conns.get(&token).map(Conn::channel)
    }
    fn on_message(&mut self, token: u64, m: ControlSocket) -> bool {
        Ctl::on_message(self, token, m)
    }
}
