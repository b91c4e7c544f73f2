//! One request, one reply on a control socket (the data plane's `--control-socket`,
//! the controller's `control.sock`): connect, send the request's records in order,
//! read the one reply. One timeout policy for every caller: [`REPLY_TIMEOUT`] on
//! each send and on the wait for the reply.

use crate::seqpacket::{self, Received};
use crate::sockopt::{set_recv_timeout, set_send_timeout};
use proto::wire::{decode_control, encode_control, Control};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// How long a request may wait for its peer: to take each record, and to answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest reply taken (a status JSON with every instance fits).
pub const REPLY_BUF: usize = 128 * 1024;

/// A decoded reply and the descriptors that came with it.
#[derive(Debug)]
pub struct Reply {
    pub msg: Control,
    pub fds: Vec<OwnedFd>,
}

/// Connects to the control socket at `path`, with [`REPLY_TIMEOUT`] on both directions.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket::connect(path)?;
    set_recv_timeout(fd.as_raw_fd(), Some(REPLY_TIMEOUT))?;
    set_send_timeout(fd.as_raw_fd(), Some(REPLY_TIMEOUT))?;
    Ok(fd)
}

/// Sends `records` in order on `fd` and reads one reply record into `buf`. A reply
/// that does not come within the socket's timeout is `TimedOut`.
pub fn exchange(fd: BorrowedFd<'_>, records: &[&[u8]], buf: &mut [u8]) -> io::Result<Received> {
    let timed_out = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(
            io::ErrorKind::TimedOut,
            "no reply within the socket timeout (REPLY_TIMEOUT unless the caller set another)".to_string(),
        ),
        _ => e,
    };
    for r in records {
        seqpacket::send_record(fd, r, &[], 0).map_err(timed_out)?;
    }
    loop {
        match seqpacket::recv_record(fd, buf, 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.map_err(timed_out),
        }
    }
}

/// [`exchange`] of control messages on a connection from [`connect`]: the reply decoded.
/// The peer closing without a reply is `UnexpectedEof`; a cut or undecodable reply
/// is `InvalidData`.
pub fn request_on(fd: BorrowedFd<'_>, msgs: &[&Control]) -> io::Result<Reply> {
    let recs: Vec<Vec<u8>> = msgs.iter().map(|m| encode_control(m)).collect();
    let recs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
    let mut buf = vec![0u8; REPLY_BUF];
    let r = exchange(fd, &recs, &mut buf)?;
    if r.len == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed the connection without answering"));
    }
    if r.truncated {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "reply too long"));
    }
    let msg = decode_control(&buf[..r.len])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("malformed reply: {e}")))?;
    Ok(Reply { msg, fds: r.fds })
}

/// Connects to `path`, sends `msgs` and returns the decoded reply ([`request_on`]).
pub fn request(path: &Path, msgs: &[&Control]) -> io::Result<Reply> {
    let fd = connect(path)?;
    request_on(fd.as_fd(), msgs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_reply_eof_and_timeout() {
        let dir = std::env::temp_dir().join(format!("sys-control-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("c.sock");
        let l = seqpacket::listen_private(&path).unwrap();
        crate::sockopt::set_nonblocking(l.as_fd(), false).unwrap();
        let server = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            // 1: answer the second record.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            for _ in 0..2 {
                seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            }
            let status = encode_control(&Control::Status { json: "{}".into() });
            seqpacket::send_record(c.as_fd(), &status, &[c.as_fd()], 0).unwrap();
            // 2: close without answering.
            let c = seqpacket::accept(l.as_fd()).unwrap();
            seqpacket::recv_record(c.as_fd(), &mut buf, 0).unwrap();
            drop(c);
            // 3: never answer (until the client gives up).
            seqpacket::accept(l.as_fd()).unwrap()
        });
        let r = request(&path, &[&Control::Ready, &Control::StatusRequest]).unwrap();
        assert!(matches!(r.msg, Control::Status { .. }));
        assert_eq!(r.fds.len(), 1);
        let e = request(&path, &[&Control::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let fd = connect(&path).unwrap();
        set_recv_timeout(fd.as_raw_fd(), Some(Duration::from_millis(50))).unwrap();
        let e = request_on(fd.as_fd(), &[&Control::StatusRequest]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(server.join().unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
