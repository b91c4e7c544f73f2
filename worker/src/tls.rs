//! TLS 1.3 for QUIC (RFC 9001) with rustls 0.23 and aws-lc-rs: the certificate from
//! `--cert/--key` (PEM), else a self-signed one made at start (rcgen).

use anyhow::{anyhow, Context};
use quinn::crypto::rustls::QuicServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::path::Path;
use std::sync::Arc;

/// ALPN of HTTP/3 (RFC 9114 §3.1).
pub const ALPN_H3: &[u8] = b"h3";
/// ALPN of HTTP/0.9 over QUIC as used by the QUIC interop runner.
pub const ALPN_HQ: &[u8] = b"hq-interop";

/// A certificate chain and its private key.
#[derive(Debug)]
pub struct Identity {
    pub certs: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Reads a PEM certificate chain and a PEM private key.
    pub fn load_pem(cert: &Path, key: &Path) -> anyhow::Result<Identity> {
        let certs = CertificateDer::pem_file_iter(cert)
            .with_context(|| format!("reading {}", cert.display()))?
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("parsing {}", cert.display()))?;
        if certs.is_empty() {
            return Err(anyhow!("{}: no certificate", cert.display()));
        }
        let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading key {}", key.display()))?;
        Ok(Identity { certs, key })
    }

    /// A fresh self-signed certificate for `names` (e.g. "localhost").
    pub fn self_signed(names: &[&str]) -> anyhow::Result<Identity> {
        let ck = rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .context("generating a self-signed certificate")?;
        Ok(Identity {
            certs: vec![ck.cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der())),
        })
    }
}

/// The rustls provider used everywhere in the worker: aws-lc-rs.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// QUIC server crypto offering `alpns`.
pub fn server_crypto(id: Identity, alpns: &[&[u8]]) -> anyhow::Result<Arc<QuicServerConfig>> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with aws-lc-rs")?
        .with_no_client_auth()
        .with_single_cert(id.certs, id.key)
        .context("certificate and key do not match")?;
    tls.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(QuicServerConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS config: {e}"))?))
}

/// QUIC client crypto trusting exactly `roots` (tests, examples).
pub fn client_crypto(
    roots: &[CertificateDer<'static>],
    alpns: &[&[u8]],
) -> anyhow::Result<quinn::crypto::rustls::QuicClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).context("adding a trust root")?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with aws-lc-rs")?
        .with_root_certificates(store)
        .with_no_client_auth();
    tls.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
    quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| anyhow!("QUIC client TLS config: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_round_trips_through_pem() {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let dir = std::env::temp_dir().join(format!("worker-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
        std::fs::write(&c, ck.cert.pem()).unwrap();
        std::fs::write(&k, ck.key_pair.serialize_pem()).unwrap();
        let id = Identity::load_pem(&c, &k).unwrap();
        assert_eq!(id.certs.len(), 1);
        server_crypto(id, &[ALPN_H3]).unwrap();
        server_crypto(Identity::self_signed(&["localhost"]).unwrap(), &[ALPN_H3, ALPN_HQ]).unwrap();
        assert!(Identity::load_pem(&dir.join("missing"), &k).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
