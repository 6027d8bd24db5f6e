//! Fixtures for tests of the control plane (here, in the cloud and in the real-kernel tier):
//! an overlay CA that issues identities. Not for production use: the CA key lives in memory.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use cyphonic_crypto::{
    CertificateAuthority, IssueRequest, RevocationList, StaticKeypair, TrustStore,
};
use cyphonic_session::Identity;

/// Unix seconds now.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An overlay CA for `ovl.example` (100.64.0.0/10, valid two days) and its revocations.
#[derive(Debug)]
pub struct Pki {
    /// The CA.
    pub ca: CertificateAuthority,
    /// Revoked certificates.
    pub revoked: RevocationList,
}

impl Pki {
    /// A fresh CA.
    ///
    /// # Panics
    /// If the system's random number generator fails.
    #[allow(clippy::missing_panics_doc, clippy::unwrap_used)]
    pub fn new() -> Self {
        Self {
            ca: CertificateAuthority::generate(
                "ovl.example",
                &[
                    "100.64.0.0/10".parse().unwrap(),
                    "fd7a:0:1::/48".parse().unwrap(),
                ],
                0,
                now() + 2 * 86_400,
            )
            .unwrap(),
            revoked: RevocationList::default(),
        }
    }

    /// The trust store of a member of this overlay.
    ///
    /// # Panics
    /// Never for a CA made by [`Pki::new`].
    #[allow(clippy::unwrap_used)]
    pub fn trust(&self) -> TrustStore {
        TrustStore::new(vec![self.ca.certificate().clone()], self.revoked.clone()).unwrap()
    }

    /// A new identity `name` for `block` (`"100.64.1.0/24"`, or several separated by
    /// spaces: `"100.64.1.0/24 fd7a:0:1:100::/56"`) in `groups`, valid one day
    /// (within the CA's own validity: a CA loaded from elsewhere may be younger or end
    /// sooner).
    ///
    /// # Panics
    /// For a name or block the CA refuses.
    #[allow(clippy::unwrap_used)]
    pub fn identity(&self, name: &str, block: &str, groups: &[&str]) -> Arc<Identity> {
        let key = StaticKeypair::generate().unwrap();
        let ca = self.ca.certificate().body();
        let cert = self
            .ca
            .issue(&IssueRequest {
                name: name.into(),
                vip_blocks: block
                    .split_whitespace()
                    .map(|b| b.parse().unwrap())
                    .collect(),
                public_key: key.public().0,
                groups: groups.iter().map(|g| (*g).to_owned()).collect(),
                not_before: ca.not_before,
                not_after: ca.not_after.min(now() + 86_400),
            })
            .unwrap();
        Arc::new(Identity::new(key, cert, self.trust(), now()).unwrap())
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
