//! Demux-minted stateless Retry (docs/adr/0003-demux-retry.md).
//!
//! Above `--retry-above` token-less client Initials per second per shard (or always,
//! `--retry always`), the shard answers a token-less client Initial that would be
//! placed with a Retry (RFC 9000 §17.2.5, §8.1.2) instead of placing it:
//!
//! - the Retry's SCID is an ADR 0001 CID of the instance the Initial would have been
//!   placed on (rendezvous winner), so the client's next Initial — whose DCID is that
//!   SCID — routes as `Owner` to that instance, statelessly;
//! - the Retry is the one a quinn-proto 0.11.19 server would send, minted without an
//!   endpoint by proto::retry::RetryMinter (pure; this module adds the clock, the
//!   randomness and the socket): the same checks first — at least 1200 bytes, a DCID
//!   of at least 8 bytes, header protection removed with the Initial keys of the DCID
//!   (RFC 9001 §5.2, §5.4) and the reserved bits zero (RFC 9000 §17.2), about 3 in 4
//!   random-garbage Initials fail that; the payload is not decrypted, so a well-formed
//!   spoofed Initial does get a Retry (smaller than the Initial: no amplification,
//!   RFC 9000 §8.1) — then quinn's Retry token under the instances' shared token key
//!   (proto::token, bound to the client address and original DCID, RFC 9000 §8.1.4)
//!   and the integrity tag (RFC 9001 §5.8);
//! - the Retry leaves from the socket address the Initial arrived on (IP_PKTINFO /
//!   IPV6_PKTINFO when the socket is bound to a wildcard address);
//! - a first Initial of a version the workers do not speak (QUIC v2, RFC 9369: the
//!   demux parses it, quinn 0.11 does not serve it) gets a Version Negotiation listing
//!   [`SPOKEN`] instead (RFC 9000 §6.1, §17.2.1; proto::version_negotiation), as a
//!   worker would answer it; the client starts again in v1 (RFC 9368 §2.2) and then
//!   meets the Retry. Dropping it would leave a v2-first client with silence.
//!
//! Nothing is kept between datagrams but key schedules.

use crate::dataplane::counters::{bump, ShardCounters};
use proto::cid::{KeySet, ServerId, CID_RANDOM_LEN};
use proto::header::VERSION_1;
use proto::initial_protection::NotRetryable;
use proto::retry::{RetryMinter, MAX_RETRY};
use proto::token::NONCE_LEN;
use proto::version_negotiation;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use socket2::SockAddr;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{BorrowedFd, RawFd};
use std::time::{SystemTime, UNIX_EPOCH};
use sys::mmsg::{SendMeta, SendMmsg};

/// Wall-clock Unix seconds, as Retry tokens carry them (0 before 1970).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `--retry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryMode {
    Off,
    /// Above `above` token-less Initials per second (per shard).
    Auto {
        above: u32,
    },
    Always,
}

/// What every shard needs to mint Retries.
#[derive(Clone)]
pub struct RetryConfig {
    pub mode: RetryMode,
    /// The key file's `token` secret (shared with every instance).
    pub token_secret: [u8; 32],
}

impl std::fmt::Debug for RetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryConfig").field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// Decides per datagram whether Retry is on: `Always`, or `Auto` when this shard saw
/// at least `above` token-less Initials to place in the current or the previous
/// second. Counting attempts, not placements, keeps it on while it works.
#[derive(Debug)]
pub struct RetryGate {
    mode: RetryMode,
    second: u64,
    this: u32,
    last: u32,
}

impl RetryGate {
    pub fn new(mode: RetryMode) -> RetryGate {
        RetryGate { mode, second: 0, this: 0, last: 0 }
    }

    /// A token-less Initial is about to be placed at `ms`: should it get a Retry?
    #[inline]
    pub fn want_retry(&mut self, ms: u64) -> bool {
        match self.mode {
            RetryMode::Off => false,
            RetryMode::Always => true,
            RetryMode::Auto { above } => {
                let s = ms / 1000;
                if s != self.second {
                    self.last = if s == self.second + 1 { self.this } else { 0 };
                    self.this = 0;
                    self.second = s;
                }
                self.this = self.this.saturating_add(1);
                self.this.max(self.last) > above
            }
        }
    }
}

/// The QUIC versions the workers serve: quinn-proto 0.11.19 speaks v1 (its draft
/// versions are of no use here: the demux parses only v1 and v2). Listed in the
/// Version Negotiation answering any other first Initial.
pub const SPOKEN: [u32; 1] = [VERSION_1];

/// Retries queued before they are sent (one sendmmsg(2) per socket): a round of the
/// shard loop flushes them at its end ([`Minter::flush`]), a full queue sooner.
pub const RETRY_BATCH: usize = 64;

/// A queue slot's address before it holds a Retry.
const UNSPECIFIED: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// One queued Retry: its bytes, where it goes, the source address to send it from.
struct Queued {
    fd: RawFd,
    /// Sent because its client was over its limits (counted as retry.sent_over_limit).
    over_limit: bool,
    /// A Version Negotiation, not a Retry (counted as retry.version_negotiations).
    negotiation: bool,
    len: usize,
    dst: SockAddr,
    src: Option<IpAddr>,
    bytes: [u8; MAX_RETRY],
}

/// One shard's Retry minter: the pure minter (its key schedules made once), a buffer
/// for the Retry, the Retries queued for the end of the round, and the shard's
/// sockets to send them from.
pub struct Minter {
    minter: RetryMinter,
    rng: StdRng,
    out: [u8; MAX_RETRY],
    /// (local address, fd) of this shard's sockets.
    sockets: Vec<(SocketAddr, RawFd)>,
    /// `RETRY_BATCH` slots, the first `queued` of them filled: a Retry is minted in
    /// place, never moved.
    queue: Vec<Queued>,
    queued: usize,
    /// sendmmsg's arrays, filled at flush over `queue` (allocated once).
    send: SendMmsg,
}

impl Minter {
    /// `sockets`: (local address, fd) of the shard's sockets, which stay open as long as
    /// the minter lives.
    pub fn new(cfg: &RetryConfig, sockets: Vec<(SocketAddr, RawFd)>) -> anyhow::Result<Minter> {
        let mut seed = [0u8; 32];
        sys::os_random(&mut seed)?;
        Ok(Minter {
            minter: RetryMinter::new(&cfg.token_secret),
            rng: StdRng::from_seed(seed),
            out: [0; MAX_RETRY],
            sockets,
            queue: (0..RETRY_BATCH)
                .map(|_| Queued {
                    fd: -1,
                    over_limit: false,
                    negotiation: false,
                    len: 0,
                    dst: SockAddr::from(UNSPECIFIED),
                    src: None,
                    bytes: [0; MAX_RETRY],
                })
                .collect(),
            queued: 0,
            send: SendMmsg::new(RETRY_BATCH, 1),
        })
    }

    /// Retries queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Writes the Retry for the client Initial `datagram` from `client`, naming
    /// instance `target` under `keys`, into this minter's buffer at `now_unix`; the
    /// Retry. Fresh randomness per Retry: the token nonce (which must be unique, it
    /// picks the token's AEAD key) and the random bits of the SCID, from this shard's
    /// ChaCha12 generator (rand's StdRng, what quinn's endpoint draws its token nonces
    /// from), seeded once from the kernel.
    pub fn mint(
        &mut self,
        datagram: &[u8],
        client: SocketAddr,
        keys: &KeySet,
        target: ServerId,
        now_unix: u64,
    ) -> Result<&[u8], NotRetryable> {
        let n = mint_into(&self.minter, &mut self.rng, datagram, client, keys, target, now_unix, &mut self.out)?;
        Ok(&self.out[..n])
    }

    /// Answers the token-less client Initial `datagram` from `client` (arrived on
    /// `local`, destination `local_ip`) with a Retry naming instance `target` under
    /// `keys`, its token issued at `now_unix` (the shard reads the clock once per
    /// round), queued for [`Minter::flush`] (a full queue is flushed first);
    /// `over_limit`: its client is over its limits (limits::Refusal::RetryOverLimit).
    /// Counts what happened (a Retry when it has gone out); `true` when one was queued.
    #[allow(clippy::too_many_arguments)] // the datagram's facts, flat: one hot call site
    pub fn answer(
        &mut self,
        datagram: &[u8],
        client: SocketAddr,
        local: SocketAddr,
        local_ip: Option<IpAddr>,
        keys: &KeySet,
        target: ServerId,
        now_unix: u64,
        over_limit: bool,
        c: &ShardCounters,
    ) -> bool {
        let Some(fd) = self
            .sockets
            .iter()
            .find(|(a, _)| {
                a.port() == local.port()
                    && a.is_ipv4() == local.is_ipv4()
                    && (a.ip().is_unspecified() || a.ip() == local.ip())
            })
            .map(|s| s.1)
        else {
            bump(&c.retry_dropped, 1);
            return false;
        };
        let wildcard = self.sockets.iter().any(|(a, f)| *f == fd && a.ip().is_unspecified());
        let src = if wildcard { local_ip } else { None };
        if self.queued >= RETRY_BATCH {
            self.flush(c);
        }
        let Some(q) = self.queue.get_mut(self.queued) else {
            bump(&c.retry_dropped, 1);
            return false;
        };
        // RFC 9000 §6.1: a version the workers do not speak gets Version
        // Negotiation, not a Retry of that version.
        let negotiation = datagram.get(1..5) != Some(&VERSION_1.to_be_bytes()[..]);
        let made = if negotiation {
            let random = (self.rng.next_u32() & 0x7f) as u8;
            version_negotiation::answer(datagram, &SPOKEN, random, &mut q.bytes).ok()
        } else {
            mint_into(&self.minter, &mut self.rng, datagram, client, keys, target, now_unix, &mut q.bytes).ok()
        };
        match made {
            Some(n) => {
                q.len = n;
                q.fd = fd;
                q.over_limit = over_limit;
                q.negotiation = negotiation;
                q.dst = SockAddr::from(client);
                q.src = src;
            }
            // Not a first Initial quinn would retry (too short, DCID under 8 bytes,
            // reserved bits set after header protection removal, already validated),
            // nor one to negotiate: dropped, nothing sent.
            None => {
                bump(&c.retry_dropped, 1);
                return false;
            }
        }
        self.queued += 1;
        true
    }

    /// Sends every queued Retry (and Version Negotiation): one sendmmsg(2) per run on
    /// the same socket, MSG_DONTWAIT. Counts `retries_sent` (and
    /// `retries_sent_over_limit`), `version_negotiations_sent` and, for what the kernel
    /// refused, `retry_send_errors` (nothing is sent twice: the client resends its
    /// Initial).
    pub fn flush(&mut self, c: &ShardCounters) {
        let n = self.queued;
        if n == 0 {
            return;
        }
        let mut start = 0;
        while start < n {
            let fd = self.queue[start].fd;
            let mut end = start;
            while end < n && self.queue[end].fd == fd {
                end += 1;
            }
            let queue = &self.queue[start..end];
            let mut batch = self.send.batch();
            for q in queue {
                batch.push(&[&q.bytes[..q.len]], SendMeta { to: Some(&q.dst), source: q.src, segment_size: None });
            }
            let (mut refused_over_limit, mut refused_negotiations) = (0, 0);
            // SAFETY: `fd` is one of the shard's sockets, open while this minter lives
            // (Minter::new).
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let sent = batch.send_skipping(fd, libc::MSG_DONTWAIT, |k, _| {
                let q = &queue[k];
                refused_over_limit += u64::from(q.over_limit && !q.negotiation);
                refused_negotiations += u64::from(q.negotiation);
            });
            let count = |f: fn(&Queued) -> bool| queue.iter().filter(|q| f(q)).count() as u64;
            let negotiations = count(|q| q.negotiation) - refused_negotiations;
            bump(&c.retries_sent, sent as u64 - negotiations);
            bump(&c.version_negotiations_sent, negotiations);
            bump(&c.retries_sent_over_limit, count(|q| q.over_limit && !q.negotiation) - refused_over_limit);
            bump(&c.retry_send_errors, (end - start - sent) as u64);
            start = end;
        }
        self.queued = 0;
    }
}

/// RFC 9000 §17.2.5 via [`RetryMinter::mint`], with this shard's randomness: the token
/// nonce (which must be unique, it picks the token's AEAD key) and the SCID's random
/// bits. The Retry's length.
#[allow(clippy::too_many_arguments)]
fn mint_into(
    minter: &RetryMinter,
    rng: &mut StdRng,
    datagram: &[u8],
    client: SocketAddr,
    keys: &KeySet,
    target: ServerId,
    now_unix: u64,
    out: &mut [u8; MAX_RETRY],
) -> Result<usize, NotRetryable> {
    let mut rand = [0u8; NONCE_LEN + CID_RANDOM_LEN];
    rng.fill_bytes(&mut rand);
    let (nonce, cid_rand) = rand.split_at(NONCE_LEN);
    let (Ok(nonce), Ok(cid_rand)) = (<[u8; NONCE_LEN]>::try_from(nonce), <&[u8; CID_RANDOM_LEN]>::try_from(cid_rand))
    else {
        return Err(NotRetryable::Malformed);
    };
    let scid = keys.encode(target, cid_rand);
    minter.mint(datagram, client, &scid, now_unix, nonce, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_modes() {
        let mut g = RetryGate::new(RetryMode::Off);
        assert!(!g.want_retry(0));
        let mut g = RetryGate::new(RetryMode::Always);
        assert!(g.want_retry(0));
        let mut g = RetryGate::new(RetryMode::Auto { above: 3 });
        let v: Vec<bool> = (0..5).map(|_| g.want_retry(10)).collect();
        assert_eq!(v, [false, false, false, true, true]);
        // Next second: still on (the previous second was over the threshold).
        assert!(g.want_retry(1_010));
        // Two quiet seconds later: off.
        assert!(!g.want_retry(3_500));
    }
}

/// proto::token reads the tokens this module's quinn endpoint mints: the data plane's
/// check and quinn's format agree.
#[cfg(test)]
mod token_format {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    #[test]
    fn proto_token_validates_a_quinn_minted_retry_token() {
        let secret = [0x42u8; 32];
        let cfg = RetryConfig { mode: RetryMode::Always, token_secret: secret };
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (local, caddr) = (server.local_addr().unwrap(), client.local_addr().unwrap());
        let mut m = Minter::new(&cfg, vec![(local, server.as_raw_fd())]).unwrap();
        let keys = KeySet::new((proto::Generation::new(0).unwrap(), [1; 32]), None).unwrap();
        let odcid = [7u8; 8];
        let init =
            proto::initial::build_client_initial(1, &odcid, &[5; 8], &[], 0, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap();
        let c = ShardCounters::new(1);
        assert!(m.answer(&init, caddr, local, None, &keys, ServerId(3), unix_now(), false, &c));
        assert_eq!((m.queued(), c.retries_sent.load(std::sync::atomic::Ordering::Relaxed)), (1, 0), "queued, not sent");
        m.flush(&c);
        assert_eq!((m.queued(), c.retries_sent.load(std::sync::atomic::Ordering::Relaxed)), (0, 1));
        let mut buf = [0u8; 1500];
        let n = client.recv(&mut buf).unwrap();
        let r = proto::retry::parse(&buf[..n]).expect("a Retry");
        assert!(proto::retry::verify(&buf[..n], &odcid));
        let key = proto::token::TokenKey::new(&secret);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        use proto::token::TokenCheck;
        assert_eq!(key.check(r.token, caddr, now), TokenCheck::Retry);
        assert_eq!(key.check(r.token, caddr, now + proto::token::RETRY_LIFETIME + 2), TokenCheck::Invalid);
        let other = SocketAddr::new(caddr.ip(), caddr.port().wrapping_add(1));
        assert_eq!(key.check(r.token, other, now), TokenCheck::Invalid);
        assert_eq!(proto::token::TokenKey::new(&[0; 32]).check(r.token, caddr, now), TokenCheck::Invalid);
        // The Retry SCID decodes to the target (the client's next DCID: Owner).
        assert_eq!(keys.decode(r.scid).map(|d| d.server_id), Ok(ServerId(3)));
        // And the client's post-Retry Initial (that token, DCID = the SCID) is one the
        // data plane sends to its owner on its token; without it, it would be placed
        // and admitted (proto::limits::owner_initial).
        let again =
            proto::initial::build_client_initial(1, r.scid, &[5; 8], r.token, 1, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap();
        let Ok(proto::Header::Long(h)) = proto::header::parse(&again, 12) else { panic!() };
        use proto::token::{owner_initial_proof, OwnerInitialProof};
        assert_eq!(owner_initial_proof(Some(&key), &h, &again, 0, caddr, now), OwnerInitialProof::Token);
        let bare =
            proto::initial::build_client_initial(1, r.scid, &[5; 8], &[], 1, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap();
        let Ok(proto::Header::Long(h)) = proto::header::parse(&bare, 12) else { panic!() };
        assert_eq!(owner_initial_proof(Some(&key), &h, &bare, 0, caddr, now), OwnerInitialProof::StartsConnection);
    }
}

/// Retries are queued and sent in batches: a full queue is flushed by the next
/// answer, one the kernel refuses (port 0: EINVAL) is counted and skipped, and every
/// other Retry of the batch still arrives, in order.
#[cfg(test)]
mod batching {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    #[test]
    fn queued_retries_go_out_in_batches_and_refusals_are_skipped() {
        let cfg = RetryConfig { mode: RetryMode::Always, token_secret: [3; 32] };
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sys::sockopt::set_recv_buffer(&client, 4 << 20);
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (local, caddr) = (server.local_addr().unwrap(), client.local_addr().unwrap());
        let nowhere: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut m = Minter::new(&cfg, vec![(local, server.as_raw_fd())]).unwrap();
        let keys = KeySet::new((proto::Generation::new(0).unwrap(), [1; 32]), None).unwrap();
        let c = ShardCounters::new(1);
        let dcid = |i: usize| {
            let mut d = [0u8; 8];
            d[..4].copy_from_slice(&(i as u32).to_le_bytes());
            d
        };
        // 150 answers; every 7th to port 0, which the kernel refuses; every 3rd over
        // its client's limits; every 5th a QUIC v2 Initial, answered with a Version
        // Negotiation (counted apart, never as over the limits).
        let total = 150;
        let v2 = |i: usize| i % 5 == 1;
        let mut want = Vec::new();
        for i in 0..total {
            let version = if v2(i) { proto::header::VERSION_2 } else { VERSION_1 };
            let init =
                proto::initial::build_client_initial(version, &dcid(i), &[5; 8], &[], 0, &[6, 0, 1, 0], 1200).unwrap();
            let to = if i % 7 == 3 { nowhere } else { caddr };
            assert!(m.answer(&init, to, local, None, &keys, ServerId(3), unix_now(), i % 3 == 0, &c));
            if to == caddr {
                want.push(i);
            }
            // Flushed by the answer after each full queue: 64 and 128 in.
            let flushed = (i / RETRY_BATCH) * RETRY_BATCH;
            assert_eq!(m.queued(), i + 1 - flushed, "after answer {i}");
        }
        let refused = (0..total).filter(|i| i % 7 == 3).count() as u64;
        let negotiations = (0..total).filter(|&i| v2(i) && i % 7 != 3).count() as u64;
        m.flush(&c);
        assert_eq!(m.queued(), 0);
        assert_eq!(
            (
                c.retries_sent.load(Relaxed),
                c.version_negotiations_sent.load(Relaxed),
                c.retry_send_errors.load(Relaxed)
            ),
            (total as u64 - refused - negotiations, negotiations, refused),
            "each refusal counted once, the rest sent, each under its kind"
        );
        // Over-limit Retries count when they have gone out, not when queued.
        let over_limit_sent = (0..total).filter(|&i| i % 3 == 0 && i % 7 != 3 && !v2(i)).count() as u64;
        assert_eq!(c.retries_sent_over_limit.load(Relaxed), over_limit_sent);
        let mut buf = [0u8; 1500];
        for i in want {
            let n = client.recv(&mut buf).unwrap();
            if v2(i) {
                let vn = proto::header::parse(&buf[..n], 12);
                let want_vn = proto::header::Header::VersionNegotiation { dcid: &[5; 8], scid: &dcid(i) };
                assert_eq!(vn, Ok(want_vn), "Version Negotiation {i}, in order");
                assert_eq!(&buf[n - 4..n], &VERSION_1.to_be_bytes(), "listing v1");
            } else {
                assert!(proto::retry::verify(&buf[..n], &dcid(i)), "Retry {i}, in order");
            }
        }
        client.set_nonblocking(true).unwrap();
        assert!(client.recv(&mut buf).is_err(), "nothing more");
    }
}

/// The oracle: quinn-proto itself. A quinn client's first Initial gets a Retry from
/// [`Minter::mint`]; the client checks its integrity tag and comes back with the
/// token; a quinn server endpoint configured exactly as a worker (worker::secrets:
/// the same token key, ADR 0001 CIDs) takes that token as a Retry token for this
/// client (validated, may not retry again) and the handshake completes — which also
/// has the client check the server's original_destination_connection_id and
/// retry_source_connection_id transport parameters against the ODCID and the Retry
/// SCID (RFC 9000 §7.3).
#[cfg(test)]
mod quinn_oracle {
    use super::*;
    use bytes::BytesMut;
    use proptest::prelude::*;
    use proto::keyfile::{KeyFile, RANDOM_LEN};
    use quinn_proto::{
        ClientConfig, Connection, ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, Event, ServerConfig,
    };
    use std::sync::Arc;
    use std::time::Instant;

    struct Side {
        ep: Endpoint,
        conn: Option<(ConnectionHandle, Connection)>,
        addr: SocketAddr,
        connected: bool,
    }

    /// Delivers every datagram `from` has to send to `to`.
    fn deliver(from: &mut Side, to: &mut Side) {
        let now = Instant::now();
        let mut buf = Vec::new();
        let Some((ch, conn)) = from.conn.as_mut() else { return };
        while let Some(ev) = conn.poll_endpoint_events() {
            if let Some(back) = from.ep.handle_event(*ch, ev) {
                conn.handle_event(back);
            }
        }
        while let Some(e) = conn.poll() {
            match e {
                Event::Connected => from.connected = true,
                Event::ConnectionLost { reason } => panic!("connection lost: {reason}"),
                _ => {}
            }
        }
        loop {
            buf.clear();
            let Some(t) = conn.poll_transmit(now, 10, &mut buf) else { break };
            let seg = t.segment_size.unwrap_or(t.size);
            for d in buf[..t.size].chunks(seg) {
                let mut rbuf = Vec::new();
                match to.ep.handle(now, from.addr, None, None, BytesMut::from(d), &mut rbuf) {
                    Some(DatagramEvent::ConnectionEvent(_, ev)) => {
                        to.conn.as_mut().expect("a connection").1.handle_event(ev)
                    }
                    Some(DatagramEvent::NewConnection(_)) => panic!("a second connection attempt"),
                    Some(DatagramEvent::Response(_)) => panic!("a stateless response mid-handshake"),
                    None => {}
                }
            }
        }
    }

    /// One handshake through a demux-minted Retry from `client_addr`.
    fn handshake_through_retry(client_addr: SocketAddr) {
        let kf = KeyFile::generate(&[0x5a; RANDOM_LEN], proto::cid::Prf::SipHash24);
        let keys = kf.keys.key_set().unwrap();
        let secrets = worker::secrets::Secrets::from_key_file(&kf);
        let target = ServerId(3);
        let id = worker::tls::Identity::self_signed(&["localhost"]).unwrap();
        let roots = id.certs.clone();
        let mut sc = ServerConfig::with_crypto(worker::tls::server_crypto(id, &[b"h3"]).unwrap());
        secrets.apply_token_key(&mut sc);
        let server_ec = secrets.endpoint_config(&secrets.cid_keys().unwrap(), target);
        let server_addr: SocketAddr = if client_addr.is_ipv4() {
            "192.0.2.1:443".parse().unwrap()
        } else {
            "[2001:db8::443]:443".parse().unwrap()
        };
        let mut server = Side {
            ep: Endpoint::new(Arc::new(server_ec), Some(Arc::new(sc)), false, None),
            conn: None,
            addr: server_addr,
            connected: false,
        };
        let mut cep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
        let crypto = worker::tls::client_crypto(&roots, &[b"h3"]).unwrap();
        let (ch, mut conn) =
            cep.connect(Instant::now(), ClientConfig::new(Arc::new(crypto)), server_addr, "localhost").unwrap();
        let mut buf = Vec::new();
        let t = conn.poll_transmit(Instant::now(), 1, &mut buf).unwrap();
        let first = buf[..t.size].to_vec();
        let odcid = proto::initial_protection::parse(&first).unwrap().dcid.to_vec();

        let mut m = Minter::new(&RetryConfig { mode: RetryMode::Always, token_secret: kf.token_key }, vec![]).unwrap();
        let now_unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let retry = m.mint(&first, client_addr, &keys, target, now_unix).unwrap().to_vec();
        assert!(proto::retry::verify(&retry, &odcid));
        let scid = proto::retry::parse(&retry).unwrap().scid.to_vec();
        assert_eq!(keys.decode(&scid).map(|d| d.server_id), Ok(target));

        // The client takes the Retry (it drops one with a wrong tag: RFC 9001 §5.8).
        let mut rbuf = Vec::new();
        match cep.handle(Instant::now(), server_addr, None, None, BytesMut::from(&retry[..]), &mut rbuf) {
            Some(DatagramEvent::ConnectionEvent(_, ev)) => conn.handle_event(ev),
            _ => panic!("the client did not take the Retry"),
        }
        buf.clear();
        let t = conn.poll_transmit(Instant::now(), 1, &mut buf).unwrap();
        let second = buf[..t.size].to_vec();
        let h = proto::initial_protection::parse(&second).unwrap();
        assert_eq!(h.dcid, &scid[..], "the client's next DCID is the Retry SCID");
        assert!(!h.token.is_empty());
        let key = proto::token::TokenKey::new(&kf.token_key);
        assert_eq!(key.check(h.token, client_addr, now_unix), proto::token::TokenCheck::Retry);

        // The worker's quinn: the token is a valid Retry token for this client.
        let mut sbuf = Vec::new();
        let incoming =
            match server.ep.handle(Instant::now(), client_addr, None, None, BytesMut::from(&second[..]), &mut sbuf) {
                Some(DatagramEvent::NewConnection(i)) => i,
                Some(DatagramEvent::Response(_)) => panic!("quinn refused the token (INVALID_TOKEN close)"),
                _ => panic!("quinn ignored the post-Retry Initial"),
            };
        assert!(incoming.remote_address_validated(), "quinn validated the address with our token");
        assert!(!incoming.may_retry(), "quinn read it as a Retry token");
        let (sch, sconn) = server.ep.accept(incoming, Instant::now(), &mut sbuf, None).map_err(|e| e.cause).unwrap();
        server.conn = Some((sch, sconn));
        let mut client = Side { ep: cep, conn: Some((ch, conn)), addr: client_addr, connected: false };
        for _ in 0..50 {
            deliver(&mut client, &mut server);
            deliver(&mut server, &mut client);
            if client.connected && server.connected {
                return;
            }
        }
        panic!("no handshake after 50 rounds (client {}, server {})", client.connected, server.connected);
    }

    #[test]
    fn quinn_completes_a_handshake_through_a_minted_retry() {
        handshake_through_retry("198.51.100.7:40000".parse().unwrap());
        handshake_through_retry("[2001:db8::7]:1".parse().unwrap());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
        #[test]
        fn quinn_accepts_minted_tokens_for_any_client(v4 in any::<bool>(), ip in any::<u128>(), port in 1u16..) {
            let addr = if v4 {
                SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::from(ip as u32)), port)
            } else {
                SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::from(ip)), port)
            };
            handshake_through_retry(addr);
        }
    }
}
