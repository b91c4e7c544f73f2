//! The secrets every instance shares (key file in standalone mode, `Assign` under
//! the controller), turned into quinn configuration:
//!
//! - the stateless-reset key: `EndpointConfig::reset_key`. The reset token of a CID
//!   is HMAC(reset key, CID) (quinn `ResetToken::new`), so any instance can reset any
//!   instance's connection (RFC 9000 §10.3).
//! - the token key: `ServerConfig::token_key`, so any instance validates a Retry token
//!   another instance issued (RFC 9000 §8.1.2).
//! - the CID keys: [`crate::cid_gen::CidKeys`] (ADR 0001).
//!
//! `grease_quic_bit(false)`: the data plane drops datagrams whose fixed bit is clear
//! (ADR 0001 routing rules), so we must not invite peers to grease it (RFC 9287 §3).

use crate::cid_gen::{AdrCidGenerator, CidKeys};
use aws_lc_rs::{hkdf, hmac};
use proto::keyfile::KeyFile;
use proto::wire::Keys;
use proto::ServerId;
use std::path::Path;
use std::sync::Arc;

/// Labels keeping the derived keys apart from any other use of the same secrets.
const RESET_LABEL: &[u8] = b"quicdemux stateless reset v1";
const TOKEN_SALT: &[u8] = b"quicdemux token v1";

/// All shared secrets a worker needs.
#[derive(Clone)]
pub struct Secrets {
    pub keys: Keys,
    pub reset_key: [u8; 32],
    pub token_key: [u8; 32],
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").field("keys", &self.keys).finish_non_exhaustive()
    }
}

impl Secrets {
    pub fn from_key_file(k: &KeyFile) -> Secrets {
        Secrets { keys: k.keys.clone(), reset_key: k.reset_key, token_key: k.token_key }
    }

    /// Reads and parses a key file (the demux's `gen-keys` output).
    pub fn load(path: &Path) -> anyhow::Result<Secrets> {
        let text =
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading key file {}: {e}", path.display()))?;
        let k = KeyFile::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(Secrets::from_key_file(&k))
    }

    /// The CID key set (ADR 0001).
    pub fn cid_keys(&self) -> anyhow::Result<CidKeys> {
        Ok(CidKeys::new(self.keys.key_set().map_err(|e| anyhow::anyhow!("key set: {e}"))?))
    }

    /// HMAC-SHA-256 key for stateless-reset tokens (RFC 9000 §10.3.1), identical on
    /// every instance.
    pub fn reset_hmac(&self) -> Arc<hmac::Key> {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.reset_key);
        let derived = hmac::sign(&k, RESET_LABEL);
        Arc::new(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }

    /// HKDF pseudo-random key for Retry / NEW_TOKEN tokens, identical on every instance.
    pub fn token_prk(&self) -> Arc<hkdf::Prk> {
        Arc::new(hkdf::Salt::new(hkdf::HKDF_SHA256, TOKEN_SALT).extract(&self.token_key))
    }

    /// The endpoint configuration of an instance with `server_id`: shared reset key,
    /// ADR 0001 CID generator (CIDs live [`crate::cid_gen::DEFAULT_CID_LIFETIME`]), no
    /// fixed-bit greasing.
    pub fn endpoint_config(&self, cid_keys: &CidKeys, server_id: ServerId) -> quinn::EndpointConfig {
        self.endpoint_config_with(cid_keys, server_id, Some(crate::cid_gen::DEFAULT_CID_LIFETIME))
    }

    /// [`Secrets::endpoint_config`] with CIDs living `cid_lifetime` (`--cid-lifetime`).
    pub fn endpoint_config_with(
        &self,
        cid_keys: &CidKeys,
        server_id: ServerId,
        cid_lifetime: Option<std::time::Duration>,
    ) -> quinn::EndpointConfig {
        let mut c = quinn::EndpointConfig::new(self.reset_hmac());
        c.cid_generator(AdrCidGenerator::factory_with_lifetime(cid_keys.clone(), server_id, cid_lifetime));
        // RFC 9287: the data plane drops fixed-bit-clear datagrams (ADR 0001).
        c.grease_quic_bit(false);
        // The bound the kernel fast path's size-limit program relies on (ADR 0004):
        // one constant for both, within quinn's 1200..=65527.
        if let Err(e) = c.max_udp_payload_size(proto::header::MAX_UDP_PAYLOAD) {
            tracing::error!(error = %e, "max_udp_payload_size refused; quinn's default stays");
        }
        c
    }

    /// Sets the shared token key on a server configuration.
    pub fn apply_token_key(&self, sc: &mut quinn::ServerConfig) {
        sc.token_key(self.token_prk());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn_proto::crypto::{HandshakeTokenKey, HmacKey};

    fn secrets() -> Secrets {
        Secrets::from_key_file(&KeyFile::generate(&[5; proto::keyfile::RANDOM_LEN], proto::cid::Prf::SipHash24))
    }

    /// The fast path's size-limit program and quinn agree on the largest datagram.
    #[test]
    fn endpoint_accepts_exactly_the_shared_max_udp_payload() {
        let s = secrets();
        let keys = s.cid_keys().unwrap();
        let c = s.endpoint_config(&keys, proto::ServerId(1));
        assert_eq!(c.get_max_udp_payload_size(), u64::from(proto::header::MAX_UDP_PAYLOAD));
    }

    #[test]
    fn reset_key_is_deterministic_across_instances() {
        let (a, b) = (secrets().reset_hmac(), secrets().reset_hmac());
        let (mut sa, mut sb) = ([0u8; 32], [0u8; 32]);
        a.sign(b"some cid", &mut sa);
        b.sign(b"some cid", &mut sb);
        assert_eq!(sa, sb);
        assert!(b.verify(b"some cid", &sa).is_ok());
        let mut other =
            Secrets::from_key_file(&KeyFile::generate(&[6; proto::keyfile::RANDOM_LEN], proto::cid::Prf::SipHash24));
        other.reset_key[0] ^= 1;
        let mut so = [0u8; 32];
        other.reset_hmac().sign(b"some cid", &mut so);
        assert_ne!(sa, so);
    }

    #[test]
    fn token_key_opens_what_another_instance_sealed() {
        let a = secrets().token_prk().aead_from_hkdf(b"retry src cid");
        let b = secrets().token_prk().aead_from_hkdf(b"retry src cid");
        let mut data = b"token body".to_vec();
        a.seal(&mut data, b"aad").unwrap();
        let opened = b.open(&mut data, b"aad").unwrap();
        assert_eq!(opened, b"token body");
    }
}
