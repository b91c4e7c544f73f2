//! One request, one reply on a control socket (the data plane's `--control-socket`,
//! the controller's `control.sock`; the admin conversation, `proto::wire::Admin`):
//! connect, send the request's messages in order, read the one reply. One timeout
//! policy for every caller: [`REPLY_TIMEOUT`] on each send and on the wait for the
//! reply.

use crate::seqpacket::{self, Channel, Incoming};
use proto::wire::Message;
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

/// Sends `msgs` in order on a connection from [`connect`] and reads one reply. A reply
/// that does not come within the socket's timeout is `TimedOut`; the peer closing
/// without a reply is `UnexpectedEof`; a cut or undecodable reply is `InvalidData`.
pub fn request_on<M: Message>(fd: BorrowedFd<'_>, msgs: &[&M]) -> io::Result<Reply<M>> {
    let timed_out = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(
            io::ErrorKind::TimedOut,
            "no reply within the socket timeout (REPLY_TIMEOUT unless the caller set another)".to_string(),
        ),
        _ => e,
    };
    let ch = Channel::<M>::new(fd);
    for m in msgs {
        ch.send(m).map_err(timed_out)?;
    }
    let mut buf = vec![0u8; REPLY_BUF];
    let got = loop {
        match ch.recv(&mut buf) {
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

/// Connects to `path`, sends `msgs` and returns the decoded reply ([`request_on`]).
pub fn request<M: Message>(path: &Path, msgs: &[&M]) -> io::Result<Reply<M>> {
    let fd = connect(path)?;
    request_on(fd.as_fd(), msgs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::wire::Admin;

    #[test]
    fn request_reply_eof_and_timeout() {
        let dir = std::env::temp_dir().join(format!("sys-control-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("c.sock");
        let l = seqpacket::listen_private(&path).unwrap();
        socket2::SockRef::from(&l).set_nonblocking(false).unwrap();
        let server = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            // 1: answer the second record.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            for _ in 0..2 {
                seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            }
            let status = Admin::Status { json: "{}".into() }.to_record();
            seqpacket::send_record(c.as_fd(), &status, &[c.as_fd()], 0).unwrap();
            // 2: close without answering.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            drop(c);
            // 3: never answer (until the client gives up).
            seqpacket::accept(l.as_fd()).unwrap()
        });
        let r = request(&path, &[&Admin::Hello { pid: 1 }, &Admin::StatusRequest]).unwrap();
        assert!(matches!(r.msg, Admin::Status { .. }));
        assert!(r.fds.is_empty(), "Status carries no descriptors: the one attached was closed");
        let e = request(&path, &[&Admin::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let fd = connect(&path).unwrap();
        set_socket_timeout(&fd, Timeout::Recv, Some(Duration::from_millis(50))).unwrap();
        let e = request_on(fd.as_fd(), &[&Admin::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(server.join().unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
