//! The HTTP API's TLS (docs/protocol.md §8): a certificate chain and its key, read from
//! files into a rustls server configuration.

use std::sync::Arc;

/// The API's TLS: the files it was read from, and the server configuration they make.
#[derive(Debug, Clone)]
pub struct Tls {
    /// The certificate chain's file and the key's.
    pub files: [std::path::PathBuf; 2],
    /// The server's configuration (ALPN: HTTP/2, HTTP/1.1).
    pub config: Arc<rustls::ServerConfig>,
}

/// The TLS server configuration of a certificate chain and its private key, both PEM.
///
/// # Errors
/// A chain or key that does not read, or that do not belong together.
pub fn tls_config(chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
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
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
