//! Demux-minted stateless Retry (docs/adr/0003-demux-retry.md).
//!
//! Above `--retry-above` token-less client Initials per second per shard (or always,
//! `--retry always`), the shard answers a token-less client Initial that would be
//! placed with a Retry (RFC 9000 §17.2.5, §8.1.2) instead of placing it:
//!
//! - the Retry's SCID is an ADR 0001 CID of the instance the Initial would have been
//!   placed on (rendezvous winner), so the client's next Initial — whose DCID is that
//!   SCID — routes as `Owner` to that instance, statelessly;
//! - the token is quinn's own: a `quinn_proto::Endpoint` per shard, configured with
//!   the instances' shared token key (HKDF-SHA-256, the key file's `token` secret, as
//!   worker::secrets), makes it with `Endpoint::retry`. quinn-proto does not export its
//!   token type; driving a real endpoint is the narrowest honest way to get its exact
//!   format (token bound to the client address and original DCID, RFC 9000 §8.1.4),
//!   and quinn also computes the Retry integrity tag (RFC 9001 §5.8). Before that it
//!   removes the Initial's header protection and drops it unless the reserved bits
//!   are zero (RFC 9000 §17.2) — about 3 in 4 random-garbage Initials; it does not
//!   decrypt the payload, so a well-formed spoofed Initial does get a Retry (smaller
//!   than the Initial: no amplification, RFC 9000 §8.1);
//! - the Retry leaves from the socket address the Initial arrived on (IP_PKTINFO /
//!   IPV6_PKTINFO when the socket is bound to a wildcard address).
//!
//! The endpoint never accepts a connection: every `Incoming` is retried or ignored, so
//! it holds no state between datagrams.

use crate::dataplane::counters::{bump, ShardCounters};
use aws_lc_rs::hkdf;
use bytes::BytesMut;
use proto::cid::{KeySet, ServerId, CID_RANDOM_LEN};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, DatagramEvent, Endpoint, EndpointConfig, ServerConfig};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// The same derivation as worker::secrets::Secrets::token_prk: any instance's quinn
/// validates a token sealed with it.
const TOKEN_SALT: &[u8] = b"quicdemux token v1";

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

/// The CID the next Retry carries as its SCID (set right before `Endpoint::handle`).
type Next = Arc<Mutex<Option<(KeySet, ServerId)>>>;

/// quinn's `ConnectionIdGenerator` handing out ADR 0001 CIDs of the chosen instance.
struct AdrRetryCid(Next);

impl ConnectionIdGenerator for AdrRetryCid {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut rand = [0u8; CID_RANDOM_LEN];
        if crate::sys::os_random(&mut rand).is_err() {
            // Never reached on Linux ≥ 3.17; a zero nonce still decodes to the target.
            rand = [0; CID_RANDOM_LEN];
        }
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &*guard {
            Some((keys, id)) => ConnectionId::new(&keys.encode(*id, &rand)),
            // Unreachable: set before every handle(); a random CID would just route as
            // a client-chosen DCID (placed anew).
            None => ConnectionId::new(&rand),
        }
    }
    fn cid_len(&self) -> usize {
        proto::CID_LEN
    }
    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// One shard's Retry minter.
pub struct Minter {
    endpoint: Endpoint,
    next: Next,
    buf: Vec<u8>,
    /// (local address, fd) of this shard's sockets.
    sockets: Vec<(SocketAddr, RawFd)>,
}

impl Minter {
    pub fn new(cfg: &RetryConfig, sockets: Vec<(SocketAddr, RawFd)>) -> anyhow::Result<Minter> {
        let next: Next = Arc::new(Mutex::new(None));
        let mut reset = [0u8; 32];
        crate::sys::os_random(&mut reset)?;
        let mut ec = EndpointConfig::new(Arc::new(aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &reset)));
        let n = next.clone();
        ec.cid_generator(move || Box::new(AdrRetryCid(n.clone())) as Box<dyn ConnectionIdGenerator>);
        // RFC 9287: never invite fixed-bit greasing (the demux drops such datagrams).
        ec.grease_quic_bit(false);
        // The TLS identity is never used: a Retry precedes TLS. quinn's ServerConfig
        // requires one, so a throwaway self-signed certificate it is.
        let ck = rcgen::generate_simple_self_signed(vec!["quicdemux-retry.invalid".to_string()])?;
        let key = rustls::pki_types::PrivateKeyDer::try_from(ck.key_pair.serialize_der())
            .map_err(|e| anyhow::anyhow!("retry key: {e}"))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)?;
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)?;
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, TOKEN_SALT).extract(&cfg.token_secret);
        let sc = ServerConfig::new(Arc::new(crypto), Arc::new(prk));
        let endpoint = Endpoint::new(Arc::new(ec), Some(Arc::new(sc)), false, None);
        Ok(Minter { endpoint, next, buf: Vec::with_capacity(1500), sockets })
    }

    /// Answers the token-less client Initial `datagram` from `client` (arrived on
    /// `local`, destination `local_ip`) with a Retry naming instance `target` under
    /// `keys`. Counts what happened; `true` when a Retry went out.
    #[allow(clippy::too_many_arguments)] // the datagram's facts, flat: one hot call site
    pub fn answer(
        &mut self,
        datagram: &[u8],
        client: SocketAddr,
        local: SocketAddr,
        local_ip: Option<IpAddr>,
        keys: &KeySet,
        target: ServerId,
        c: &ShardCounters,
    ) -> bool {
        *self.next.lock().unwrap_or_else(|p| p.into_inner()) = Some((keys.clone(), target));
        self.buf.clear();
        let ev = self.endpoint.handle(Instant::now(), client, local_ip, None, BytesMut::from(datagram), &mut self.buf);
        let incoming = match ev {
            Some(DatagramEvent::NewConnection(i)) => i,
            // Not taken as a client's first Initial (reserved bits set after header
            // protection removal, DCID shorter than 8 bytes, …): dropped, nothing sent.
            _ => {
                bump(&c.retry_dropped, 1);
                return false;
            }
        };
        self.buf.clear();
        let t = match self.endpoint.retry(incoming, &mut self.buf) {
            Ok(t) => t,
            Err(e) => {
                // Carries a token after all: not ours to retry; drop (quinn would).
                self.endpoint.ignore(e.into_incoming());
                bump(&c.retry_dropped, 1);
                return false;
            }
        };
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
        match send_from(fd, &self.buf[..t.size], t.destination, src) {
            Ok(()) => {
                bump(&c.retries_sent, 1);
                true
            }
            Err(_) => {
                bump(&c.retry_send_errors, 1);
                false
            }
        }
    }
}

/// sendmsg(2) of one datagram to `dst`, from source address `src` (IP_PKTINFO /
/// IPV6_PKTINFO) when given.
fn send_from(fd: RawFd, payload: &[u8], dst: SocketAddr, src: Option<IpAddr>) -> std::io::Result<()> {
    let (mut sa, salen) = sockaddr(dst);
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // u64 backing store: cmsg buffers must be aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain old data; all-zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut sa as *mut libc::sockaddr_storage as *mut libc::c_void;
    msg.msg_namelen = salen;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(ip) = src {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: msg_control points at `control` (64 bytes, 8-aligned), enough for one
        // cmsghdr with an in6_pktinfo (16 + 20 bytes, aligned: 40); CMSG_FIRSTHDR is
        // non-null for a buffer that large, and we write within CMSG_SPACE(len).
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(&msg);
            match ip {
                IpAddr::V4(v4) => {
                    (*cm).cmsg_level = libc::IPPROTO_IP;
                    (*cm).cmsg_type = libc::IP_PKTINFO;
                    (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::in_pktinfo>() as u32) as _;
                    let pi = libc::in_pktinfo {
                        ipi_ifindex: 0,
                        ipi_spec_dst: libc::in_addr { s_addr: u32::from_ne_bytes(v4.octets()) },
                        ipi_addr: libc::in_addr { s_addr: 0 },
                    };
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut libc::in_pktinfo, pi);
                    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::in_pktinfo>() as u32) as _;
                }
                IpAddr::V6(v6) => {
                    (*cm).cmsg_level = libc::IPPROTO_IPV6;
                    (*cm).cmsg_type = libc::IPV6_PKTINFO;
                    (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::in6_pktinfo>() as u32) as _;
                    let pi = libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: v6.octets() }, ipi6_ifindex: 0 };
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut libc::in6_pktinfo, pi);
                    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::in6_pktinfo>() as u32) as _;
                }
            }
        }
    }
    // SAFETY: `msg` points at live locals (address, iovec over `payload`, control)
    // for the duration of the call; `fd` is a socket this shard owns.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage (which is larger and aligned
            // for any sockaddr).
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            (ss, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (ss, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
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
        assert!(m.answer(&init, caddr, local, None, &keys, ServerId(3), &c));
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
        // data plane sends to its owner; without the token it would be admitted.
        let again =
            proto::initial::build_client_initial(1, r.scid, &[5; 8], r.token, 1, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap();
        let Ok(proto::Header::Long(h)) = proto::header::parse(&again, 12) else { panic!() };
        assert!(proto::token::owner_initial_allowed(&key, &h, &again, 0, caddr, now));
        let bare =
            proto::initial::build_client_initial(1, r.scid, &[5; 8], &[], 1, &[6, 0, 4, 1, 0, 0, 0], 1200).unwrap();
        let Ok(proto::Header::Long(h)) = proto::header::parse(&bare, 12) else { panic!() };
        assert!(!proto::token::owner_initial_allowed(&key, &h, &bare, 0, caddr, now));
    }
}
