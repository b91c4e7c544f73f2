//! A scripted peer host: the forwarding protocol between hosts (proto::peer) by hand on
//! a UDP socket, so that a test can capture, replay and forge frames. Shared by
//! tests/ecmp.rs and the unit tests of src/dataplane/peers.rs (included there by path).
#![allow(dead_code)]

use proto::peer::{self, Body, Frame, FrameKeys, Header, Me, Outbound, Session, Verdict};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

pub struct Scripted {
    pub sock: UdpSocket,
    pub me: Me,
    pub keys: FrameKeys,
    pub sessions: HashMap<u16, Session>,
    pub outbound: HashMap<u16, Outbound>,
}

impl Scripted {
    /// Host `me` on `sock` (a 20 ms read timeout is set), sealing with `secret`.
    pub fn new(sock: UdpSocket, me: Me, secret: &[u8; 32]) -> Scripted {
        sock.set_read_timeout(Some(Duration::from_millis(20))).expect("read timeout");
        Scripted { sock, me, keys: FrameKeys::new(secret, None), sessions: HashMap::new(), outbound: HashMap::new() }
    }

    pub fn addr(&self) -> SocketAddr {
        self.sock.local_addr().expect("local address")
    }

    /// A frame to `to_host` (its epoch `to_epoch`) with sequence number `seq`,
    /// acknowledging what this host has received from it.
    pub fn seal(&mut self, to_host: u16, to_epoch: u64, seq: u64, body: Body<'_>) -> Vec<u8> {
        let ack = self.sessions.entry(to_host).or_default().ack();
        let header = Header { from_host: self.me.host, to_host, from_epoch: self.me.epoch, to_epoch, seq, ack };
        let mut out = Vec::new();
        peer::seal(&self.keys.current, &Frame { header, body }, &mut out);
        out
    }

    pub fn heartbeat(&mut self, to_host: u16, to: SocketAddr, to_epoch: u64) {
        let seq = self.outbound.entry(to_host).or_default().seq();
        let f = self.seal(to_host, to_epoch, seq, Body::Heartbeat);
        self.sock.send_to(&f, to).expect("send");
    }

    /// Receives for `for_ms`, applying the rules (and answering stale frames).
    pub fn pump(&mut self, to: &HashMap<u16, SocketAddr>, for_ms: u64) {
        let end = Instant::now() + Duration::from_millis(for_ms);
        let mut buf = [0u8; 2048];
        while Instant::now() < end {
            let Ok((n, _)) = self.sock.recv_from(&mut buf) else { continue };
            let Ok(f) = peer::open(&self.keys, &buf[..n]) else { continue };
            let h = f.header;
            let v = self.sessions.entry(h.from_host).or_default().receive(self.me, &h, 0);
            let o = self.outbound.entry(h.from_host).or_default();
            match v {
                Verdict::Stale { ack, nudge } => {
                    o.raise(ack);
                    if let (Some(e), Some(&a)) = (nudge, to.get(&h.from_host)) {
                        self.heartbeat(h.from_host, a, e);
                    }
                }
                Verdict::Fresh { learned: Some(l) } => o.learn(l),
                _ => {}
            }
        }
    }

    /// Hellos until `host` at `to` is learned (at most `within`), then one heartbeat
    /// to its epoch, after which the real host has learned ours.
    pub fn handshake(&mut self, host: u16, to: SocketAddr, within: Duration) {
        let table = HashMap::from([(host, to)]);
        let deadline = Instant::now() + within;
        let round_ms = (within.as_millis() / 100).max(10) as u64;
        while self.outbound.get(&host).is_none_or(|o| o.epoch() == 0) {
            assert!(Instant::now() < deadline, "host {host} never answered");
            self.heartbeat(host, to, 0);
            self.pump(&table, round_ms);
        }
        let e = self.outbound[&host].epoch();
        self.heartbeat(host, to, e);
        self.pump(&table, round_ms);
    }

    /// A data frame to `host` at `to` (its learned epoch), sent; its bytes back.
    pub fn data(&mut self, host: u16, to: SocketAddr, client: SocketAddr, local: SocketAddr, d: &[u8]) -> Vec<u8> {
        let (e, seq) = self.outbound[&host].data().expect("host learned");
        let f = self.seal(host, e, seq, Body::Data { client, local, datagram: d });
        self.sock.send_to(&f, to).expect("send");
        f
    }
}
