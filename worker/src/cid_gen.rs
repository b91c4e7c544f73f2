//! [`AdrCidGenerator`]: quinn's `ConnectionIdGenerator` issuing ADR 0001 connection
//! IDs — 12 bytes, the newest key generation in `cr`, this instance's server id
//! encrypted under it, and fresh OS randomness (nonce and random bits) per CID.
//!
//! When the newest generation's format is `quic-lb` (docs/adr/0007-quic-lb.md) the
//! same generator issues QUIC-LB CIDs carrying the server id: `KeySet::encode` picks
//! the format, and every format's CIDs are 12 bytes, the length quinn parses with.
//!
//! Every CID quinn hands out for a connection (handshake SCID, NEW_CONNECTION_ID,
//! the Retry SCID) comes from here, so each of them routes back to this instance
//! (ADR 0001 "Unique, not reused").

use arc_swap::ArcSwap;
use proto::cid::{KeySet, ServerId, CID_LEN, CID_RANDOM_LEN};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use std::sync::Arc;
use std::time::Duration;

/// Default CID lifetime (`--cid-lifetime`): quinn replaces every CID it issued this
/// long ago with a fresh one (NEW_CONNECTION_ID with Retire Prior To, RFC 9000
/// §5.1.1-2), so connections move to the newest key generation within about two
/// lifetimes of a rotation. Rotations must therefore be at least three lifetimes
/// apart (two plus one of margin; ADR 0001: the previous generation stays decodable
/// for one rotation only).
pub const DEFAULT_CID_LIFETIME: Duration = Duration::from_secs(600);

/// The live key generations, shared between the generators of all endpoints of a
/// process and replaceable on rotation (`KeysChanged`).
#[derive(Debug, Clone)]
pub struct CidKeys(Arc<ArcSwap<KeySet>>);

impl CidKeys {
    pub fn new(keys: KeySet) -> CidKeys {
        CidKeys(Arc::new(ArcSwap::from_pointee(keys)))
    }
    /// Rotation (ADR 0001): new CIDs use the new newest generation at once.
    pub fn replace(&self, keys: KeySet) {
        self.0.store(Arc::new(keys));
    }
    pub fn load(&self) -> Arc<KeySet> {
        self.0.load_full()
    }
}

/// ADR 0001 connection-ID generator for one server id.
#[derive(Debug, Clone)]
pub struct AdrCidGenerator {
    keys: CidKeys,
    server_id: ServerId,
    lifetime: Option<Duration>,
}

impl AdrCidGenerator {
    /// A generator whose CIDs live [`DEFAULT_CID_LIFETIME`].
    pub fn new(keys: CidKeys, server_id: ServerId) -> AdrCidGenerator {
        AdrCidGenerator { keys, server_id, lifetime: Some(DEFAULT_CID_LIFETIME) }
    }

    /// Let quinn retire and replace CIDs after `d` (None: never).
    pub fn with_lifetime(mut self, d: Option<Duration>) -> AdrCidGenerator {
        self.lifetime = d;
        self
    }

    /// A factory for `quinn::EndpointConfig::cid_generator` ([`DEFAULT_CID_LIFETIME`]).
    pub fn factory(
        keys: CidKeys,
        server_id: ServerId,
    ) -> impl Fn() -> Box<dyn ConnectionIdGenerator> + Send + Sync + 'static {
        Self::factory_with_lifetime(keys, server_id, Some(DEFAULT_CID_LIFETIME))
    }

    /// A factory whose CIDs live `lifetime` (None: forever — connections then keep
    /// their first generation's CIDs and are orphaned by the second rotation).
    pub fn factory_with_lifetime(
        keys: CidKeys,
        server_id: ServerId,
        lifetime: Option<Duration>,
    ) -> impl Fn() -> Box<dyn ConnectionIdGenerator> + Send + Sync + 'static {
        move || Box::new(AdrCidGenerator::new(keys.clone(), server_id).with_lifetime(lifetime))
    }

    /// Mints one CID.
    pub fn mint(&self) -> [u8; CID_LEN] {
        let mut rand = [0u8; CID_RANDOM_LEN];
        fill_random(&mut rand);
        self.keys.load().encode(self.server_id, &rand)
    }
}

/// Fresh OS randomness (aws-lc-rs, i.e. getrandom); the thread-local CSPRNG of `rand`
/// (itself seeded from the OS) in the practically impossible case that fails.
fn fill_random(out: &mut [u8]) {
    if aws_lc_rs::rand::fill(out).is_err() {
        tracing::error!("OS randomness unavailable; using the thread-local CSPRNG");
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), out);
    }
}

impl ConnectionIdGenerator for AdrCidGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        ConnectionId::new(&self.mint())
    }

    /// quinn asks this only for a short-header datagram whose DCID matches none of its
    /// connections, and sends a stateless reset (rate-limited by
    /// `EndpointConfig::min_reset_interval`) exactly when it returns `Ok`; `Err`
    /// drops the datagram silently (quinn-proto `Endpoint::handle`).
    ///
    /// Such a datagram reached us because the data plane routed it here: as ours
    /// (a connection we forgot), or as an orphan — a dead server id, `cr` = 3, or a
    /// generation rotated away (ADR 0001 routing rules: "Orphan → any serving
    /// instance (stateless reset)"). All of them must be reset (RFC 9000 §10.3), so
    /// every CID of our length passes, whatever it decodes to. The reset token is
    /// HMAC(shared reset key, CID), the one the issuing instance advertised, so the
    /// peer accepts it. Only a wrong length (impossible: quinn parses short headers
    /// with our fixed length) is refused.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if cid.len() == CID_LEN {
            Ok(())
        } else {
            Err(InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.lifetime
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::cid::Generation;

    fn keys() -> KeySet {
        KeySet::new((Generation::new(1).unwrap(), [3; 32]), Some((Generation::ZERO, [4; 32]))).unwrap()
    }

    #[test]
    fn issues_routable_cids_with_our_id_and_newest_generation() {
        let mut g = AdrCidGenerator::new(CidKeys::new(keys()), ServerId(4242));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let cid = g.generate_cid();
            assert_eq!(cid.len(), CID_LEN);
            let d = keys().decode(&cid).unwrap();
            assert_eq!(d.server_id, ServerId(4242));
            assert_eq!(d.generation, Generation::new(1).unwrap());
            assert!(seen.insert(cid[..].to_vec()), "fresh nonce per CID");
            assert!(g.validate(&cid).is_ok());
        }
        assert_eq!(g.cid_len(), 12);
        assert_eq!(g.cid_lifetime(), Some(DEFAULT_CID_LIFETIME));
        assert_eq!(g.clone().with_lifetime(None).cid_lifetime(), None);
    }

    #[test]
    /// ADR 0001 routing rules: orphans (dead id, cr = 3, unknown generation) reach a
    /// serving instance to be reset, so `validate` (quinn's "send a reset?") passes them.
    fn validate_passes_orphans_so_quinn_resets_them() {
        let ks = keys();
        let g = AdrCidGenerator::new(CidKeys::new(ks.clone()), ServerId(1));
        let other = ks.encode_with(Generation::ZERO, ServerId(9), &[5; 10]).unwrap();
        assert!(g.validate(&ConnectionId::new(&other)).is_ok(), "other (dead) instance, previous generation");
        let mut unroutable = other;
        unroutable[0] |= 0xc0;
        assert!(ks.decode(&unroutable).is_err());
        assert!(g.validate(&ConnectionId::new(&unroutable)).is_ok(), "cr = 3");
        let mut gen2 = other;
        gen2[0] = (gen2[0] & 0x3f) | 0x80;
        assert!(ks.decode(&gen2).is_err());
        assert!(g.validate(&ConnectionId::new(&gen2)).is_ok(), "generation 2 not live");
        assert!(g.validate(&ConnectionId::new(&[0; 8])).is_err(), "wrong length");
    }

    #[test]
    fn rotation_switches_new_cids_to_the_new_generation() {
        let ck = CidKeys::new(keys());
        let mut g = AdrCidGenerator::new(ck.clone(), ServerId(7));
        let before = g.generate_cid();
        ck.replace(keys().rotated([8; 32]));
        let after = g.generate_cid();
        assert_eq!(after[0] >> 6, 2);
        assert_eq!(ck.load().decode(&after).unwrap().server_id, ServerId(7));
        assert!(g.validate(&before).is_ok(), "previous generation still live");
    }

    /// ADR 0007: with a quic-lb newest generation the generator issues 12-byte QUIC-LB
    /// CIDs that a QUIC-LB load balancer holding the config (`quic_lb::ConfigSet`)
    /// decodes to this instance's server id; `validate` still passes them.
    #[test]
    fn issues_quic_lb_cids_when_the_newest_generation_is_quic_lb() {
        use proto::cid_format::{CidFormat, FormatSpec};
        let spec: FormatSpec = "quic-lb server-id=2 key=generate".parse().unwrap();
        let g1 = Generation::new(1).unwrap();
        let format = spec.for_generation(g1, &[3; 32]).unwrap();
        let ks = KeySet::with_formats(
            (g1, proto::Prf::SipHash24, [3; 32], format),
            Some((Generation::ZERO, proto::Prf::SipHash24, [4; 32], CidFormat::Adr1)),
        )
        .unwrap();
        let CidFormat::QuicLb(p) = format else { unreachable!() };
        let mut lb = proto::quic_lb::ConfigSet::new();
        lb.insert(proto::quic_lb::Config::new(p).unwrap());
        let mut g = AdrCidGenerator::new(CidKeys::new(ks.clone()), ServerId(0x0a0b));
        for _ in 0..200 {
            let cid = g.generate_cid();
            assert_eq!(cid.len(), CID_LEN);
            assert_eq!(lb.decode(&cid).unwrap().server_id.as_bytes(), &[0x0a, 0x0b]);
            assert_eq!(ks.decode(&cid).unwrap().server_id, ServerId(0x0a0b));
            assert!(g.validate(&cid).is_ok());
        }
    }
}
