//! `[cloud]`: where the control plane is and the keys it is pinned to.

use std::net::SocketAddr;
use std::time::Duration;

use cyphonic_crypto::PublicKey;
use serde::Deserialize;
use toml::Spanned;

use crate::{ConfigError, Source};

/// `[cloud]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCloud {
    address: Spanned<OneOrMore>,
    public_key: Spanned<OneOrMore>,
    #[serde(default)]
    endpoints: Vec<Spanned<SocketAddr>>,
    #[serde(default = "default_idle_peer_timeout")]
    idle_peer_timeout: Spanned<u64>,
}

/// A key that takes one string or a list of them (`address = "a"`, `address = ["a", "b"]`).
/// (Errors point at the whole value: toml's spans do not survive serde's untagged enums.)
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMore {
    One(String),
    More(Vec<String>),
}

impl OneOrMore {
    fn items(&self) -> Vec<&String> {
        match self {
            Self::One(one) => vec![one],
            Self::More(more) => more.iter().collect(),
        }
    }
}

/// Checks a cloud address, `host:port` or an IP address and port; returns it as written.
fn cloud_address(text: &str) -> Result<String, String> {
    if text.parse::<SocketAddr>().is_ok() {
        return Ok(text.to_owned());
    }
    let bad = || {
        format!(
            "{text:?} is not host:port or an IP address and port (192.0.2.10:7000, cloud.example.net:7000, [2001:db8::10]:7000)"
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 || host.is_empty() || host.contains(['[', ']', ':']) {
        return Err(bad());
    }
    cyphonic_crypto::validate_name(&host.to_ascii_lowercase())
        .map_err(|e| format!("{text:?}: {e}"))?;
    Ok(text.to_owned())
}

/// Ten minutes without traffic.
fn default_idle_peer_timeout() -> Spanned<u64> {
    Spanned::new(0..0, 600)
}

/// Where the cloud is (`[cloud]`), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloud {
    /// The cloud's instances (NMS's control address): `host:port` or an IP address and
    /// port, tried in turn.
    pub addresses: Vec<String>,
    /// Its Noise public keys, pinned (more than one while the key is being replaced).
    pub public_keys: Vec<PublicKey>,
    /// Tunnel endpoints to register besides the one the cloud observes.
    pub endpoints: Vec<SocketAddr>,
    /// Peers found through the cloud leave the table after this long without traffic.
    pub idle_peer_timeout: Duration,
}

impl RawCloud {
    /// Checks the cloud's key and our extra endpoints.
    ///
    /// # Errors
    /// A key that is not 64 hex digits, an endpoint nobody can reach.
    pub fn check(&self, src: &Source<'_>) -> Result<Cloud, ConfigError> {
        let mut public_keys = Vec::new();
        for text in self.public_key.get_ref().items() {
            let Ok(key) = text.parse::<PublicKey>() else {
                return src.err(
                    &self.public_key.span(),
                    "cloud.public_key",
                    "expected the 64 hex digits `cyphonic-cloud keygen` printed",
                );
            };
            public_keys.push(key);
        }
        let mut addresses = Vec::new();
        for text in self.address.get_ref().items() {
            addresses.push(
                cloud_address(text)
                    .or_else(|e| src.err(&self.address.span(), "cloud.address", e))?,
            );
        }
        for (key, span, count) in [
            ("cloud.address", self.address.span(), addresses.len()),
            (
                "cloud.public_key",
                self.public_key.span(),
                public_keys.len(),
            ),
        ] {
            if count == 0 {
                return src.err(&span, key, "give at least one");
            }
        }
        for e in &self.endpoints {
            let ip = e.get_ref().ip();
            if ip.is_unspecified() || ip.is_multicast() || e.get_ref().port() == 0 {
                return src.err(
                    &e.span(),
                    "cloud.endpoints",
                    format!("{} cannot be reached by peers", e.get_ref()),
                );
            }
        }
        let idle = *self.idle_peer_timeout.get_ref();
        if !(5..=86_400).contains(&idle) {
            return src.err(
                &self.idle_peer_timeout.span(),
                "cloud.idle_peer_timeout",
                format!("{idle} s: give 5 to 86400 seconds"),
            );
        }
        Ok(Cloud {
            addresses,
            public_keys,
            endpoints: self.endpoints.iter().map(|e| *e.get_ref()).collect(),
            idle_peer_timeout: Duration::from_secs(idle),
        })
    }
}

// ---- [metrics] -------------------------------------------------------------------------------
