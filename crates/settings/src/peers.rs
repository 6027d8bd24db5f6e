//! `[[peer]]`: the static peers, each a certificate and where to reach it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use cyphonic_crypto::{CertError, Certificate};
use cyphonic_session::Identity;
use cyphonic_tunnel::StaticPeer;
use ipnet::{IpNet, Ipv4Net};
use toml::Spanned;

use crate::{ConfigError, Source, first_v4_block};

crate::table! {
    /// A peer known in advance (with a cloud, peers need not be listed). Its certificate
    /// names the peer and the vIP blocks it serves: packets for those blocks go to it, and it
    /// may only send from them. Repeat the table for each peer.
    pub struct RawPeer in "peer" {
        /// The peer's certificate, verified against `identity.ca`.
        certificate: Spanned<PathBuf>,
        /// Where to reach it first (it may roam). Unset: wait for the peer to call.
        endpoint: Option<SocketAddr> = None,
        /// Seconds between keepalives that hold NAT mappings open. Unset or 0: off.
        persistent_keepalive: Option<u64> = None,
        /// The peer's DNS server, asked about names under the peer's name. Unset: the first
        /// host address of its block, where adapters conventionally put their `gateway_vip`.
        dns: Option<Spanned<Ipv4Addr>> = None,
    }
}

/// A static peer, checked.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its certificate (verified against our CA when loading).
    pub certificate: Certificate,
    /// Where to reach it first; without one, we wait for it to call.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval to hold NAT mappings open.
    pub persistent_keepalive: Option<Duration>,
    /// The peer's DNS server (an adapter's gateway vIP): where names in its zone are asked.
    pub dns: Ipv4Addr,
    /// Its certificate is on our revocation list: it is left out of the peer table (and its
    /// zone out of DNS) until the list no longer names it. Revocation lists are handed out
    /// to a whole fleet, apart from each site's peers, so a revoked peer does not make the
    /// file wrong.
    pub revoked: bool,
}

impl Peer {
    /// The peer as the engine takes it.
    pub fn to_static(&self) -> StaticPeer {
        StaticPeer {
            certificate: self.certificate.clone(),
            endpoint: self.endpoint,
            persistent_keepalive: self.persistent_keepalive,
        }
    }
}

/// Checks the `[[peer]]` tables: certificates that verify under our CA, not ours, distinct,
/// with blocks apart from `own` and from each other; reachable endpoints.
///
/// # Errors
/// The first mistake, located.
pub fn peers(
    src: &Source<'_>,
    raw: &[RawPeer],
    identity: &Identity,
    own: Ipv4Net,
) -> Result<Vec<Peer>, ConfigError> {
    let ours = identity.certificate().body();
    let mut peers: Vec<Peer> = Vec::new();
    let mut names = HashMap::new();
    for (i, p) in raw.iter().enumerate() {
        let key = crate::indexed(RawPeer::certificate, i);
        let span = p.certificate.span();
        let pcert = Certificate::from_pem(&src.read(&p.certificate, &key)?)
            .or_else(|e| src.err(&span, &key, e.to_string()))?;
        let body = pcert.body().clone();
        let revoked = match identity.trust().verify(&pcert, src.now_secs) {
            Ok(()) => false,
            Err(CertError::Revoked(_)) => true,
            Err(e) => return src.err(&span, &key, format!("{} refused: {e}", body.name)),
        };
        if body.public_key == ours.public_key {
            return src.err(&span, &key, "this is our own certificate");
        }
        if let Some(prev) = names.insert(body.name.clone(), i) {
            return src.err(
                &span,
                &key,
                format!("{} is already peer[{prev}]", body.name),
            );
        }
        for b in &body.vip_blocks {
            if let IpNet::V4(b4) = b
                && (b4.contains(&own) || own.contains(b4))
            {
                return src.err(
                    &span,
                    &key,
                    format!("{}'s block {b} overlaps ours {own}", body.name),
                );
            }
            if let Some(other) = peers.iter().find(|q| {
                q.certificate
                    .body()
                    .vip_blocks
                    .iter()
                    .any(|qb| qb.contains(b) || b.contains(qb))
            }) {
                return src.err(
                    &span,
                    &key,
                    format!("block {b} overlaps {}'s", other.certificate.body().name),
                );
            }
        }
        let dns = match (&p.dns, first_v4_block(&pcert)) {
            (Some(d), _) => {
                let ip = *d.get_ref();
                if !body.covers(IpAddr::V4(ip)) {
                    return src.err(
                        &d.span(),
                        &crate::indexed(RawPeer::dns, i),
                        format!("{ip} is not inside {}'s certified blocks", body.name),
                    );
                }
                ip
            }
            // By convention a peer's gateway vIP is the first host of its block.
            (None, Some(b)) => Ipv4Addr::from(u32::from(b.network()).saturating_add(1)),
            (None, None) => Ipv4Addr::UNSPECIFIED,
        };
        if let Some(ep) = p.endpoint
            && (ep.port() == 0
                || ep.ip().is_unspecified()
                || matches!(ep.ip(), IpAddr::V4(v4) if v4.is_broadcast()))
        {
            return src.err(
                &span,
                &crate::indexed(RawPeer::endpoint, i),
                format!("{ep} is not a reachable address"),
            );
        }
        peers.push(Peer {
            certificate: pcert,
            endpoint: p.endpoint,
            persistent_keepalive: p
                .persistent_keepalive
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
            dns,
            revoked,
        });
    }
    Ok(peers)
}

// ---- [cloud] ---------------------------------------------------------------------------------
