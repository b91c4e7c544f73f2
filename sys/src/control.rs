//! One request, one reply on a control socket (the data plane's `--control-socket`,
//! the controller's `control.sock`; the admin conversation, `proto::wire::Admin`):
//! connect, say `Hello` and take the `Welcome` (docs/wire.md "Versions"), send the
//! request's messages in order in the negotiated version, read the one reply. One
//! timeout policy for every caller: [`REPLY_TIMEOUT`] on each send and on each wait.

use crate::seqpacket::{self, Channel, Incoming};
use proto::wire::{Admin, Announce};
use rustix::net::sockopt::{set_socket_timeout, Timeout};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// How long a request may wait for its peer: to take each record, and to answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest reply taken (a status JSON with every instance fits).
pub const REPLY_BUF: usize = 128 * 1024;

/// A decoded reply and the descriptors that came with it.
#[derive(Debug)]
pub struct Reply<M> {
    pub msg: M,
    pub fds: Vec<OwnedFd>,
}

/// Connects to the control socket at `path`, with [`REPLY_TIMEOUT`] on both directions.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket::connect(path)?;
    set_socket_timeout(&fd, Timeout::Recv, Some(REPLY_TIMEOUT))?;
    set_socket_timeout(&fd, Timeout::Send, Some(REPLY_TIMEOUT))?;
    Ok(fd)
}

fn timed_out(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(
            io::ErrorKind::TimedOut,
            "no reply within the socket timeout (REPLY_TIMEOUT unless the caller set another)".to_string(),
        ),
        _ => e,
    }
}

/// Reads one record. A record that does not come within the socket's timeout is
/// `TimedOut`; the peer closing is `UnexpectedEof`; a cut or undecodable one is
/// `InvalidData`.
fn read_one(ch: Channel<'_, Admin>, buf: &mut [u8]) -> io::Result<Reply<Admin>> {
    let got = loop {
        match ch.recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r.map_err(timed_out)?,
        }
    };
    match got {
        Incoming::Message { msg, fds } => Ok(Reply { msg, fds }),
        Incoming::Closed => {
            Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed the connection without answering"))
        }
        Incoming::TooLong => Err(io::Error::new(io::ErrorKind::InvalidData, "reply too long")),
        Incoming::Malformed(e) => Err(io::Error::new(io::ErrorKind::InvalidData, format!("malformed reply: {e}"))),
    }
}

/// The hello on a connection from [`connect`]: `Hello` with this process's window,
/// then the answer. `Ok(Ok(version))`: the negotiated version; `Ok(Err(reply))`: the
/// peer refused (`Error`, e.g. a version outside its window) or answered something
/// else.
pub fn hello_on(fd: BorrowedFd<'_>) -> io::Result<Result<u8, Reply<Admin>>> {
    let window = crate::protocol::window();
    let ch = Channel::<Admin>::new(fd);
    ch.send(&Admin::Hello { announce: Announce::plain(window), pid: std::process::id() }).map_err(timed_out)?;
    let mut buf = vec![0u8; REPLY_BUF];
    let answer = read_one(ch, &mut buf)?;
    match answer.msg {
        Admin::Welcome { version, .. } if window.speaks(version) => Ok(Ok(version)),
        Admin::Welcome { version, .. } => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answered in protocol version {version}: this build speaks {window}"),
        )),
        _ => Ok(Err(answer)),
    }
}

/// Sends `msgs` in order on a connection from [`connect`], after the hello
/// ([`hello_on`]) and in the version it negotiated, and reads one reply: the answer
/// to the hello instead when that was not `Welcome` (an `Error`).
pub fn request_on(fd: BorrowedFd<'_>, msgs: &[&Admin]) -> io::Result<Reply<Admin>> {
    let version = match hello_on(fd)? {
        Ok(v) => v,
        Err(refused) => return Ok(refused),
    };
    let ch = Channel::<Admin>::new(fd).at(version);
    for m in msgs {
        ch.send(m).map_err(timed_out)?;
    }
    let mut buf = vec![0u8; REPLY_BUF];
    read_one(ch, &mut buf)
}

/// Connects to `path`, sends `msgs` and returns the decoded reply ([`request_on`]).
pub fn request(path: &Path, msgs: &[&Admin]) -> io::Result<Reply<Admin>> {
    let fd = connect(path)?;
    request_on(fd.as_fd(), msgs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::wire::{Message, PROTOCOL_VERSION};

    /// The hello first, the request in the negotiated version, one reply; a peer that
    /// closes, one that never answers, one that refuses the hello, one that answers in
    /// a version we do not speak.
    #[test]
    fn request_reply_eof_timeout_and_refusal() {
        let dir = std::env::temp_dir().join(format!("sys-control-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("c.sock");
        let l = seqpacket::listen_private(&path).unwrap();
        socket2::SockRef::from(&l).set_nonblocking(false).unwrap();
        let v = PROTOCOL_VERSION;
        let server = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let mut read = |c: &OwnedFd| {
                let r = seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
                Admin::decode(&buf[..r.len]).map(|m| (buf[1], m)).unwrap()
            };
            let send = |c: &OwnedFd, m: &Admin| seqpacket::send_record(c.as_fd(), &m.to_record(), &[], 0).unwrap();
            // 1: Welcome, then answer the request (an fd attached to a Status).
            let c = seqpacket::accept(l.as_fd()).unwrap();
            let (hv, hello) = read(&c);
            assert!(
                matches!(hello, Admin::Hello { announce, pid } if announce.window == crate::protocol::window() && pid == std::process::id())
            );
            assert_eq!(hv, crate::protocol::window().newest, "the hello is in our newest");
            send(&c, &Admin::Welcome { version: v, caps: 0 });
            assert_eq!(read(&c), (v, Admin::StatusRequest), "the request is in the negotiated version");
            let status = Admin::Status { json: "{}".into() }.to_record();
            seqpacket::send_record(c.as_fd(), &status, &[c.as_fd()], 0).unwrap();
            // 2: close without answering.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            read(&c);
            drop(c);
            // 3: refuse the hello.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            read(&c);
            send(&c, &Admin::Error { reason: "protocol version 3 not supported: this build speaks 5 and 4".into() });
            // 4: welcome in a version we do not speak.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            read(&c);
            send(&c, &Admin::Welcome { version: v + 1, caps: 0 });
            // 5: Welcome, then never answer (until the client gives up).
            let c = seqpacket::accept(l.as_fd()).unwrap();
            read(&c);
            send(&c, &Admin::Welcome { version: v, caps: 0 });
            c
        });
        let r = request(&path, &[&Admin::StatusRequest]).unwrap();
        assert!(matches!(r.msg, Admin::Status { .. }));
        assert!(r.fds.is_empty(), "Status carries no descriptors: the one attached was closed");
        let e = request(&path, &[&Admin::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let r = request(&path, &[&Admin::StatusRequest]).unwrap();
        assert!(matches!(r.msg, Admin::Error { ref reason } if reason.starts_with("protocol version 3 not supported")));
        let e = request(&path, &[&Admin::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains(&format!("answered in protocol version {}", v + 1)), "{e}");
        let fd = connect(&path).unwrap();
        set_socket_timeout(&fd, Timeout::Recv, Some(Duration::from_millis(50))).unwrap();
        let e = request_on(fd.as_fd(), &[&Admin::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(server.join().unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
