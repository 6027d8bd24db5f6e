//! `[identity]`: our key, certificate, CA and revocations, read and verified together.

use std::ops::Range;
use std::path::PathBuf;

use cyphonic_crypto::{Certificate, RevocationList, StaticKeypair, TrustStore};
use cyphonic_session::Identity;
use ipnet::Ipv4Net;
use serde::Deserialize;
use toml::Spanned;

use crate::{ConfigError, Source};

/// `[identity]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    certificate: Spanned<PathBuf>,
    key: Spanned<PathBuf>,
    ca: Spanned<PathBuf>,
    revocations: Option<Spanned<PathBuf>>,
    token: Option<String>,
}

/// Where our identity's files are (resolved against the configuration's directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFiles {
    /// Our certificate.
    pub certificate: PathBuf,
    /// Our Noise private key.
    pub key: PathBuf,
    /// The CA bundle (roots, and issuing CAs).
    pub ca: PathBuf,
}

impl RawIdentity {
    /// Where our certificate, key and CA bundle are.
    pub fn files(&self, src: &Source<'_>) -> IdentityFiles {
        IdentityFiles {
            certificate: src.resolve(self.certificate.get_ref()),
            key: src.resolve(self.key.get_ref()),
            ca: src.resolve(self.ca.get_ref()),
        }
    }

    /// The enrollment token (`[identity] token`): used when the certificate file does not
    /// exist yet.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Where the certificate key is written (to locate errors about what it certifies).
    pub fn certificate_span(&self) -> Range<usize> {
        self.certificate.span()
    }

    /// Reads and checks our key, certificate, CA and revocations: our identity.
    ///
    /// # Errors
    /// Unreadable files, malformed keys or certificates, a certificate that does not verify
    /// under the CA or certifies another key.
    pub fn load(&self, src: &Source<'_>) -> Result<Identity, ConfigError> {
        let key_text = src.read(&self.key, "identity.key")?;
        let keypair = StaticKeypair::from_pem(&key_text).or_else(|e| {
            src.err(
                &self.key.span(),
                "identity.key",
                format!("not a Noise private key: {e}"),
            )
        })?;
        let ca_text = src.read(&self.ca, "identity.ca")?;
        let cas = Certificate::all_from_pem(&ca_text).or_else(|e| {
            src.err(
                &self.ca.span(),
                "identity.ca",
                format!("not a CA certificate: {e}"),
            )
        })?;
        if cas.is_empty() {
            return src.err(
                &self.ca.span(),
                "identity.ca",
                "the file holds no CYPHONIC CERTIFICATE block",
            );
        }
        let revoked = match &self.revocations {
            Some(r) => RevocationList::parse(&src.read(r, "identity.revocations")?)
                .or_else(|e| src.err(&r.span(), "identity.revocations", e.to_string()))?,
            None => RevocationList::default(),
        };
        let trust = TrustStore::new(cas, revoked).or_else(|e| {
            src.err(
                &self.ca.span(),
                "identity.ca",
                format!("not a valid self-signed CA certificate: {e}"),
            )
        })?;
        let cert_text = src.read(&self.certificate, "identity.certificate")?;
        let cert = Certificate::from_pem(&cert_text).or_else(|e| {
            src.err(
                &self.certificate.span(),
                "identity.certificate",
                e.to_string(),
            )
        })?;
        Identity::new(keypair, cert.clone(), trust, src.now_secs).or_else(|e| {
            src.err(
                &self.certificate.span(),
                "identity.certificate",
                format!("{e} (certificate of {})", cert.body().name),
            )
        })
    }
}

/// The overlay's domain: the name of the CA that issued our certificate.
pub fn overlay_domain(identity: &Identity) -> String {
    let cert = identity.certificate();
    identity
        .trust()
        .cas()
        .iter()
        .find(|ca| ca.body().public_key == cert.body().issuer)
        .map(|ca| ca.body().name.clone())
        .unwrap_or_default()
}

/// The first IPv4 block a certificate certifies.
pub fn first_v4_block(cert: &Certificate) -> Option<Ipv4Net> {
    cert.body().v4_blocks().first().copied()
}

// ---- [[peer]] --------------------------------------------------------------------------------
