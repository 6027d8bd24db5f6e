//! `[cloud]`: where the control plane is and the keys it is pinned to.

use std::net::SocketAddr;
use std::time::Duration;

use cyphonic_crypto::PublicKey;
use toml::Spanned;

use crate::{ConfigError, OneOrMore, Source};

crate::table! {
    /// The control plane (`cyphonic-cloud`). With it, peers need not be listed: a name asked
    /// under the overlay's domain is resolved through the cloud, which tells both ends to
    /// handshake at once (hole punching); this end registers its own name and its devices'.
    /// Unset: static peers only.
    pub struct RawCloud in "cloud" {
        /// Where the cloud (NMS) listens, TCP: one `host:port` or address and port, or a list
        /// of them for several instances on one database, tried in turn. Host names are
        /// looked up at each attempt.
        address: Spanned<OneOrMore>,
        /// The cloud's Noise public key as `cyphonic-cloud keygen` printed it: pinned, nothing
        /// else is believed. A list while the key is being replaced (the old and the new one).
        public_key: Spanned<OneOrMore>,
        /// Tunnel endpoints to register besides the address the cloud sees our probes come
        /// from (behind NAT, that one is the one that works).
        endpoints: Vec<Spanned<SocketAddr>> = Vec::new(),
        /// Seconds (5 to 86400) after which a peer found through the cloud leaves without
        /// traffic either way; traffic for its block asks the cloud for it again.
        idle_peer_timeout: Spanned<u64> = crate::unwritten(600),
        /// When the cloud sees us behind a NAT, ask the router in front of us for a mapping
        /// of the tunnel port (PCP, NAT-PMP, then UPnP-IGD), register it with the cloud, renew
        /// it and remove it at stop: peers behind a symmetric NAT then reach us directly.
        /// false: never ask.
        port_mapping: bool = true,
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
    /// Whether to ask the router for a mapping of the tunnel port when behind a NAT.
    pub port_mapping: bool,
}

impl RawCloud {
    /// Checks the cloud's key and our extra endpoints.
    ///
    /// # Errors
    /// A key that is not 64 hex digits, an endpoint nobody can reach.
    pub fn check(&self, src: &Source<'_>) -> Result<Cloud, ConfigError> {
        let mut public_keys = Vec::new();
        for text in self.public_key.get_ref().list() {
            let Ok(key) = text.parse::<PublicKey>() else {
                return src.err(
                    &self.public_key.span(),
                    RawCloud::public_key,
                    "expected the 64 hex digits `cyphonic-cloud keygen` printed",
                );
            };
            public_keys.push(key);
        }
        let mut addresses = Vec::new();
        for text in self.address.get_ref().list() {
            addresses.push(
                cloud_address(&text)
                    .or_else(|e| src.err(&self.address.span(), RawCloud::address, e))?,
            );
        }
        for (key, span, count) in [
            (RawCloud::address, self.address.span(), addresses.len()),
            (
                RawCloud::public_key,
                self.public_key.span(),
                public_keys.len(),
            ),
        ] {
            if count == 0 {
                return src.err(&span, key, "give at least one");
            }
        }
        for e in &self.endpoints {
            if !cyphonic_control::reachable(*e.get_ref()) {
                return src.err(
                    &e.span(),
                    RawCloud::endpoints,
                    format!("{} cannot be reached by peers", e.get_ref()),
                );
            }
        }
        let idle = *self.idle_peer_timeout.get_ref();
        if !(5..=86_400).contains(&idle) {
            return src.err(
                &self.idle_peer_timeout.span(),
                RawCloud::idle_peer_timeout,
                format!("{idle} s: give 5 to 86400 seconds"),
            );
        }
        Ok(Cloud {
            addresses,
            public_keys,
            endpoints: self.endpoints.iter().map(|e| *e.get_ref()).collect(),
            idle_peer_timeout: Duration::from_secs(idle),
            port_mapping: self.port_mapping,
        })
    }
}

// ---- [metrics] -------------------------------------------------------------------------------
