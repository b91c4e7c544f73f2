//! [`AdrCidGenerator`]: quinn's `ConnectionIdGenerator` issuing ADR-0040 connection
//! IDs — 12 bytes, the newest key generation in `cr`, this instance's server id
//! encrypted under it, and fresh OS randomness (nonce and random bits) per CID.
//!
//! Every CID quinn hands out for a connection (handshake SCID, NEW_CONNECTION_ID,
//! the Retry SCID) comes from here, so each of them routes back to this instance
//! (ADR-0040 "Unique, not reused").

use arc_swap::ArcSwap;
use proto::cid::{KeySet, ServerId, CID_LEN, CID_RANDOM_LEN};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use std::sync::Arc;
use std::time::Duration;

/// The live key generations, shared between the generators of all endpoints of a
/// process and replaceable on rotation (`KeysChanged`).
#[derive(Debug, Clone)]
pub struct CidKeys(Arc<ArcSwap<KeySet>>);

impl CidKeys {
    pub fn new(keys: KeySet) -> CidKeys {
        CidKeys(Arc::new(ArcSwap::from_pointee(keys)))
    }
    /// Rotation (ADR-0040): new CIDs use the new newest generation at once.
    pub fn replace(&self, keys: KeySet) {
        self.0.store(Arc::new(keys));
    }
    pub fn load(&self) -> Arc<KeySet> {
        self.0.load_full()
    }
}

/// ADR-0040 connection-ID generator for one server id.
#[derive(Debug, Clone)]
pub struct AdrCidGenerator {
    keys: CidKeys,
    server_id: ServerId,
    lifetime: Option<Duration>,
}

impl AdrCidGenerator {
    pub fn new(keys: CidKeys, server_id: ServerId) -> AdrCidGenerator {
        AdrCidGenerator { keys, server_id, lifetime: None }
    }

    /// Let quinn retire and replace CIDs after `d` (None: never).
    pub fn with_lifetime(mut self, d: Option<Duration>) -> AdrCidGenerator {
        self.lifetime = d;
        self
    }

    /// A factory for `quinn::EndpointConfig::cid_generator`.
    pub fn factory(
        keys: CidKeys,
        server_id: ServerId,
    ) -> impl Fn() -> Box<dyn ConnectionIdGenerator> + Send + Sync + 'static {
        move || Box::new(AdrCidGenerator::new(keys.clone(), server_id))
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

    /// Accepts every CID that decodes under a live generation, whatever its server id:
    /// a short-header packet for another (dead) instance's connection reaches us as
    /// an orphan and must still be answered with a stateless reset (RFC 9000 §10.3),
    /// which quinn only sends for CIDs that pass this check.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        self.keys.load().decode(cid).map(|_| ()).map_err(|_| InvalidCid)
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
        assert_eq!(g.cid_lifetime(), None);
    }

    #[test]
    fn validate_accepts_other_ids_and_live_generations_only() {
        let ks = keys();
        let g = AdrCidGenerator::new(CidKeys::new(ks.clone()), ServerId(1));
        let other = ks.encode_with(Generation::ZERO, ServerId(9), &[5; 10]).unwrap();
        assert!(g.validate(&ConnectionId::new(&other)).is_ok(), "other instance, previous generation");
        let mut unroutable = other;
        unroutable[0] |= 0xc0;
        assert!(g.validate(&ConnectionId::new(&unroutable)).is_err(), "cr = 3");
        let mut gen2 = other;
        gen2[0] = (gen2[0] & 0x3f) | 0x80;
        assert!(g.validate(&ConnectionId::new(&gen2)).is_err(), "generation 2 not live");
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
}
