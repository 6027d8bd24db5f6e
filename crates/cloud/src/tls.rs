//! The HTTP API's TLS (docs/protocol.md §8): a certificate chain and its key, read from
//! files into a rustls server configuration.

use std::sync::Arc;

/// A listener's TLS (the API's, the relay stream's): the files it was read from, the
/// server configuration they make and the certificate's digest.
#[derive(Debug, Clone)]
pub struct Tls {
    /// The certificate chain's file and the key's.
    pub files: [std::path::PathBuf; 2],
    /// The server's configuration.
    pub config: Arc<rustls::ServerConfig>,
    /// The SHA-256 of the server's certificate (DER): what relay clients pin.
    pub digest: [u8; 32],
}

impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files && self.digest == other.digest
    }
}

impl Eq for Tls {}

/// The ALPN of the HTTP API: HTTP/2, HTTP/1.1.
pub const API_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// The ALPN of the relay's stream (docs/protocol.md §4, *Relay over a stream*).
pub const RELAY_ALPN: &[&[u8]] = &[cyphonic_control::relay::STREAM_ALPN];

/// The SHA-256 of the first certificate of a PEM chain.
///
/// # Errors
/// A chain that does not read, or holds no certificate.
pub fn leaf_digest(chain_pem: &[u8]) -> Result<[u8; 32], String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let leaf = CertificateDer::pem_slice_iter(chain_pem)
        .next()
        .ok_or("no certificate in the chain's file")?
        .map_err(|e| format!("the certificate chain does not read: {e}"))?;
    let d = ring::digest::digest(&ring::digest::SHA256, &leaf);
    d.as_ref()
        .try_into()
        .map_err(|_| "a SHA-256 digest of another length".to_owned())
}

/// The TLS server configuration of a certificate chain and its private key, both PEM,
/// offering `alpn`.
///
/// # Errors
/// A chain or key that does not read, or that do not belong together.
pub fn tls_config(
    chain_pem: &[u8],
    key_pem: &[u8],
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate chain does not read: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the chain's file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("the private key does not read: {e}"))?;
    // ring, as the rest of the tree: no C toolchain for aws-lc. rustls marks ring's
    // provider deprecated for its lack of post-quantum key exchange, a want on a
    // management API, not a flaw of what it offers.
    #[expect(deprecated, reason = "ring's provider: see above")]
    let provider = rustls::crypto::ring::default_provider();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and the key do not make a TLS server: {e}"))?;
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(config))
}
