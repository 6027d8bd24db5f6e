//! `[identity]`: our key, certificate, CA and revocations, read and verified together.

use std::ops::Range;
use std::path::PathBuf;

use cyphonic_crypto::{Certificate, RevocationList, StaticKeypair, TrustStore};
use cyphonic_session::Identity;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use toml::Spanned;

use crate::{ConfigError, Source};

/// Where a daemon keeps what it writes at run time: the directory the packages' units let
/// the service user write (`StateDirectory=cyphonic`). An enrolled end's identity files
/// are there by default.
pub const STATE_DIR: &str = "/var/lib/cyphonic";

crate::table! {
    /// Who this end is: its certificate, its key and the CAs it trusts. Relative paths are
    /// relative to the file's directory. Enrollment writes the three files, and renewal the
    /// certificate and the CA bundle, where these keys name them: by default in the state
    /// directory, which the service may write.
    pub struct RawIdentity in "identity" {
        /// This end's certificate (from `cyphonic-cloud ca issue`, or written by
        /// enrollment): binds its FQDN, its vIP block and its Noise key. Unset:
        /// `/var/lib/cyphonic/<adapter|node>.crt`.
        certificate: Option<Spanned<PathBuf>> = None,
        /// Its Noise private key (mode 0640, group cyphonic: readable by the service user
        /// alone). Unset: `/var/lib/cyphonic/<adapter|node>.key`.
        key: Option<Spanned<PathBuf>> = None,
        /// The overlay CA's certificate (several CAs may be concatenated in one file).
        /// Unset: `/var/lib/cyphonic/<adapter|node>-ca.crt`.
        ca: Option<Spanned<PathBuf>> = None,
        /// Revoked certificate fingerprints, one per line. Unset: none.
        revocations: Option<Spanned<PathBuf>> = None,
        /// An enrollment token from `cyphonic-cloud token create`. While the certificate file
        /// does not exist, `run` (or `enroll`) makes the Noise key at `key`, asks the cloud
        /// named in `[cloud]` for the certificate, and writes it and the CA bundle to the paths
        /// above. The token works once and is read only while the certificate is missing: it
        /// may stay in the file afterwards.
        token: Option<Spanned<String>> = None,
    }
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

/// The identity's three files as given, or their defaults for the end `end` (`adapter`,
/// `node`) in [`STATE_DIR`] (an unwritten key: located by its name, not a line).
struct Named {
    certificate: Spanned<PathBuf>,
    key: Spanned<PathBuf>,
    ca: Spanned<PathBuf>,
}

impl RawIdentity {
    fn named(&self, end: &str) -> Named {
        let or = |given: &Option<Spanned<PathBuf>>, file: String| {
            given
                .clone()
                .unwrap_or_else(|| Spanned::new(0..0, std::path::Path::new(STATE_DIR).join(file)))
        };
        Named {
            certificate: or(&self.certificate, format!("{end}.crt")),
            key: or(&self.key, format!("{end}.key")),
            ca: or(&self.ca, format!("{end}-ca.crt")),
        }
    }

    /// Where the end `end`'s (`adapter`, `node`) certificate, key and CA bundle are.
    pub fn files(&self, src: &Source<'_>, end: &str) -> IdentityFiles {
        let named = self.named(end);
        IdentityFiles {
            certificate: src.resolve(named.certificate.get_ref()),
            key: src.resolve(named.key.get_ref()),
            ca: src.resolve(named.ca.get_ref()),
        }
    }

    /// The enrollment token, checked: of the shape the cloud hands out (none when unset).
    ///
    /// # Errors
    /// Not `<16 hex digits>.<64 hex digits>`.
    pub fn checked_token(&self, src: &Source<'_>) -> Result<Option<&str>, ConfigError> {
        let Some(token) = &self.token else {
            return Ok(None);
        };
        if cyphonic_control::parse_token(token.get_ref()).is_none() {
            return src.err(
                &token.span(),
                Self::token,
                format!(
                    "not an enrollment token: expected {} as `cyphonic-cloud token create` printed it",
                    cyphonic_control::TOKEN_SHAPE
                ),
            );
        }
        Ok(Some(token.get_ref()))
    }

    /// What enrolling needs of the files, as this user sees them: the key readable when it
    /// is there, else its place writable; the certificate's and the CA bundle's places
    /// writable (they are written, the bundle replaced, after the cloud answers).
    ///
    /// # Errors
    /// The first that is not so, at its key.
    pub fn check_enrollable(&self, src: &Source<'_>, end: &str) -> Result<(), ConfigError> {
        let named = self.named(end);
        let key = src.resolve(named.key.get_ref());
        if key.exists() {
            let text = src.read(&named.key, Self::key)?;
            if let Err(e) = StaticKeypair::from_pem(&text) {
                return src.err(
                    &named.key.span(),
                    Self::key,
                    format!("not a Noise private key: {e}"),
                );
            }
        }
        let places = [
            (&named.key, Self::key),
            (&named.certificate, Self::certificate),
            (&named.ca, Self::ca),
        ];
        for (p, name) in places {
            let path = src.resolve(p.get_ref());
            // A key that is there is read, not written; the CA bundle is replaced.
            if name == Self::key && path.exists() {
                continue;
            }
            if let Err(e) = cyphonic_telemetry::files::can_write(&path) {
                return src.err(
                    &p.span(),
                    name,
                    format!(
                        "enrolling writes {}, but this user cannot write there: {e}",
                        path.display()
                    ),
                );
            }
        }
        Ok(())
    }

    /// Where the certificate key is written (to locate errors about what it certifies);
    /// nowhere (0..0) when it is not.
    pub fn certificate_span(&self) -> Range<usize> {
        self.certificate.as_ref().map_or(0..0, Spanned::span)
    }

    /// Reads and checks our key, certificate, CA and revocations: our identity.
    ///
    /// # Errors
    /// Unreadable files, malformed keys or certificates, a certificate that does not verify
    /// under the CA or certifies another key.
    pub fn load(&self, src: &Source<'_>, end: &str) -> Result<Identity, ConfigError> {
        let Named {
            certificate,
            key,
            ca,
        } = self.named(end);
        let key_text = src.read(&key, Self::key)?;
        let keypair = StaticKeypair::from_pem(&key_text).or_else(|e| {
            src.err(
                &key.span(),
                Self::key,
                format!("not a Noise private key: {e}"),
            )
        })?;
        let ca_text = src.read(&ca, Self::ca)?;
        let cas = Certificate::all_from_pem(&ca_text)
            .or_else(|e| src.err(&ca.span(), Self::ca, format!("not a CA certificate: {e}")))?;
        if cas.is_empty() {
            return src.err(
                &ca.span(),
                Self::ca,
                "the file holds no CYPHONIC CERTIFICATE block",
            );
        }
        let revoked = match &self.revocations {
            Some(r) => RevocationList::parse(&src.read(r, Self::revocations)?)
                .or_else(|e| src.err(&r.span(), Self::revocations, e.to_string()))?,
            None => RevocationList::default(),
        };
        let trust = TrustStore::new(cas, revoked).or_else(|e| {
            src.err(
                &ca.span(),
                Self::ca,
                format!("not a valid self-signed CA certificate: {e}"),
            )
        })?;
        let cert_text = src.read(&certificate, Self::certificate)?;
        let cert = Certificate::from_pem(&cert_text)
            .or_else(|e| src.err(&certificate.span(), Self::certificate, e.to_string()))?;
        Identity::new(keypair, cert.clone(), trust, src.now_secs).or_else(|e| {
            src.err(
                &certificate.span(),
                Self::certificate,
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

/// The overlay's IPv6 range: the IPv6 block of the root CA above our certificate (its
/// issuer, or the issuer's root when an issuing CA signed it); `None` when that root has
/// none (an overlay made before issue 53, docs/protocol.md §7: it carries no IPv6).
pub fn overlay6(identity: &Identity) -> Option<Ipv6Net> {
    let cas = identity.trust().cas();
    let issued_by = |cert: &Certificate| {
        cas.iter()
            .find(|ca| ca.body().public_key == cert.body().issuer)
    };
    let issuer = issued_by(identity.certificate())?;
    let root = if issuer.is_root() {
        issuer
    } else {
        issued_by(issuer).filter(|r| r.is_root())?
    };
    root.body().vip_blocks.iter().find_map(|b| match b {
        IpNet::V6(n) => Some(*n),
        IpNet::V4(_) => None,
    })
}

/// Our IPv6 in the overlay: the certificate's first IPv6 block and the overlay's range
/// ([`overlay6`]) that holds it; `None` without either (no IPv6 at this end,
/// docs/protocol.md §7).
pub fn ipv6_plan(identity: &Identity) -> Option<(Ipv6Net, Ipv6Net)> {
    let block = first_v6_block(identity.certificate())?;
    let overlay = overlay6(identity).filter(|o| o.contains(&block))?;
    Some((block, overlay))
}

/// The first IPv6 block a certificate certifies.
pub fn first_v6_block(cert: &Certificate) -> Option<Ipv6Net> {
    cert.body().vip_blocks.iter().find_map(|b| match b {
        IpNet::V6(n) => Some(*n),
        IpNet::V4(_) => None,
    })
}

/// The first IPv4 block a certificate certifies.
pub fn first_v4_block(cert: &Certificate) -> Option<Ipv4Net> {
    cert.body().v4_blocks().first().copied()
}

// ---- [[peer]] --------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// An `[identity]` that names no files has them in the state directory, named after the
    /// end (so that an adapter and a node on one host keep theirs apart); named ones are
    /// relative to the file's directory.
    #[test]
    fn the_identity_files_default_to_the_state_directory() {
        let src = |text: &'static str| Source {
            path: std::path::Path::new("/etc/cyphonic/node.toml"),
            text,
            now_secs: 0,
        };
        let text = "token = \"x\"\n";
        let raw: RawIdentity = toml::from_str(text).unwrap();
        let state = std::path::Path::new(STATE_DIR);
        assert_eq!(
            raw.files(&src(text), "node"),
            IdentityFiles {
                certificate: state.join("node.crt"),
                key: state.join("node.key"),
                ca: state.join("node-ca.crt"),
            }
        );
        assert_eq!(
            raw.files(&src(text), "adapter").key,
            state.join("adapter.key")
        );
        assert_eq!(raw.certificate_span(), 0..0);
        let text = "certificate = \"n.crt\"\nkey = \"/k/n.key\"\n";
        let raw: RawIdentity = toml::from_str(text).unwrap();
        let files = raw.files(&src(text), "node");
        assert_eq!(
            files.certificate,
            std::path::Path::new("/etc/cyphonic/n.crt")
        );
        assert_eq!(files.key, std::path::Path::new("/k/n.key"));
        assert_eq!(files.ca, state.join("node-ca.crt"));
    }
}
