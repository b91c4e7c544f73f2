//! Serving control connections from an epoll loop (the controller's control.sock,
//! the data plane's data and control sockets): every record waiting on a readable
//! connection is decoded as that connection's conversation (`proto::wire`) and handed
//! to the server; EOF, an error, an over-long or a malformed record ends it, and so
//! does a record in a protocol version this process does not speak (refused as a
//! version mismatch, crate::versions).

use proto::wire::{Message, WireError};
use sys::seqpacket::{Channel, Incoming};

/// Records read from one connection per readiness event at most, so one chatty peer
/// cannot starve the others.
const RECORDS_PER_EVENT: usize = 64;

/// A server of control connections, each named by its epoll token.
pub trait ControlServer {
    /// Closes the connection (peer gone, socket error).
    fn close(&mut self, token: u64, why: &str);
    /// Answers `Error{why}` and closes (a bad record).
    fn refuse(&mut self, token: u64, why: &str);
    /// Refuses a record in protocol version `version`, which this process does not
    /// speak (`crate::versions::refuse_record`), and closes.
    fn refuse_version(&mut self, token: u64, version: u8);
    /// The receive buffer, lent to [`serve_ready`] while it drains.
    fn recv_buf(&mut self) -> &mut Vec<u8>;
}

/// A server whose connections carry conversation `M`.
pub trait Serves<M: Message>: ControlServer {
    /// Connection `token`, while it is open and speaks `M`.
    fn channel(&self, token: u64) -> Option<Channel<'_, M>>;
    /// Handles one message; false when it closed the connection.
    fn on_message(&mut self, token: u64, m: M) -> bool;
}

/// A readable connection `token` (epoll events `ev`): the records waiting on it (at
/// most [`RECORDS_PER_EVENT`]) go to `s`, in order, until `s` closes it. EOF, a socket
/// error, an over-long or a malformed record end the drain with `close` / `refuse`;
/// after an EAGAIN, a hang-up in `ev` (EPOLLHUP / EPOLLERR) closes it.
pub fn serve_ready<M: Message, S: Serves<M>>(s: &mut S, token: u64, ev: u32) {
    let mut buf = std::mem::take(s.recv_buf());
    drain(s, token, &mut buf, ev);
    *s.recv_buf() = buf;
}

fn drain<M: Message, S: Serves<M>>(s: &mut S, token: u64, buf: &mut [u8], ev: u32) {
    for _ in 0..RECORDS_PER_EVENT {
        let Some(ch) = s.channel(token) else { return };
        match ch.dont_wait().recv(buf) {
            // Descriptors a peer attached are closed here: servers accept none.
            Ok(Incoming::Message { msg, .. }) => {
                if !s.on_message(token, msg) {
                    return;
                }
            }
            Ok(Incoming::Closed) => return s.close(token, "peer closed"),
            Ok(Incoming::TooLong) => return s.refuse(token, "record too long"),
            Ok(Incoming::Malformed(WireError::UnsupportedVersion(v))) => return s.refuse_version(token, v),
            Ok(Incoming::Malformed(e)) => return s.refuse(token, &format!("malformed control message: {e}")),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return s.close(token, &format!("recv: {e}")),
        }
    }
    if ev & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
        s.close(token, "hang-up");
    }
}
