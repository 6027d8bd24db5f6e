//! The DNS service every tunnel end runs for its overlay zone (crates/resolver, on the
//! control thread): authoritative for its own zone, it asks static peers about theirs, the
//! cloud about other overlay names, and the upstream resolvers about the rest. It sends
//! nothing itself: what it says comes out as [`Said`], and the edge carries it (the adapter
//! to a device on its LAN or through the tunnel, the node on its stub's socket). `C` is how
//! the edge names whoever asked.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Instant;

use anyhow::Context as _;
use cyphonic_resolver::{Action, Client, PeerZone, Resolver, ZoneConfig};
use cyphonic_settings::Common;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Name;
use ipnet::Ipv4Net;

use crate::status::DnsStatus;
use crate::{Asker, Settled, StaticPeers, Upstream};

/// What the DNS service says, for the edge to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said<C> {
    /// An answer to `C`.
    Answer(C, Vec<u8>),
    /// A question for static peer `peer`'s DNS server at `server` (over the tunnel).
    AskPeer {
        /// The peer.
        peer: u32,
        /// Its DNS server.
        server: Ipv4Addr,
        /// The query.
        query: Vec<u8>,
    },
}

/// Who we are in DNS: our name, and the address and block it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnZone {
    /// Our FQDN: the zone we are authoritative for.
    pub name: String,
    /// The address our own name has.
    pub ip: Ipv4Addr,
    /// Its IPv6 address (its AAAA), if it has one.
    pub ip6: Option<std::net::Ipv6Addr>,
    /// The block whose reverse zone is ours.
    pub block: Ipv4Net,
}

/// The DNS service. See the module docs.
pub struct Dns<C: Client> {
    resolver: Resolver<C>,
    upstream: Option<Upstream>,
    cloud: Option<Asker>,
    /// Each static peer's DNS server, by peer id.
    peer_dns: HashMap<u32, Ipv4Addr>,
}

impl<C: Client> std::fmt::Debug for Dns<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns")
            .field("upstream", &self.upstream)
            .field("peers", &self.peer_dns.len())
            .finish_non_exhaustive()
    }
}

/// `name` as a fully qualified DNS name.
///
/// # Errors
/// It is not a DNS name.
pub fn fqdn(name: &str) -> anyhow::Result<Name> {
    Name::from_ascii(format!("{}.", name.trim_end_matches('.')))
        .with_context(|| format!("{name:?} is not a DNS name"))
}

impl<C: Client> Dns<C> {
    /// The service for `own` in `common`'s overlay: the zones of the static `peers` (by the
    /// ids the engine gave them) asked over the tunnel, the cloud and the upstream resolvers
    /// asked when given.
    ///
    /// # Errors
    /// A name does not parse.
    pub fn new(
        common: &Common,
        own: &OwnZone,
        peers: &StaticPeers,
        cloud: Option<Asker>,
        upstream: Option<Upstream>,
    ) -> anyhow::Result<Self> {
        let resolver = Resolver::new(ZoneConfig {
            overlay_domain: fqdn(&common.overlay_domain)?,
            own_name: fqdn(&own.name)?,
            own_ip: own.ip,
            own_ip6: own.ip6,
            own_block: own.block,
            overlay: common.overlay,
            ttl: common.dns_ttl(),
            upstream: upstream.is_some(),
            ask_cloud: cloud.is_some(),
        });
        tracing::info!(upstream = ?upstream.as_ref().map(Upstream::servers), zone = %own.name, cloud = cloud.is_some(), "DNS service for the overlay");
        let mut dns = Self {
            resolver,
            upstream,
            cloud,
            peer_dns: HashMap::new(),
        };
        dns.set_peers(peers)?;
        Ok(dns)
    }

    /// The static peers whose zones are asked over the tunnel, from now on.
    ///
    /// # Errors
    /// A name does not parse (the zones stay as they were).
    pub fn set_peers(&mut self, peers: &StaticPeers) -> anyhow::Result<()> {
        let mut zones = Vec::new();
        let mut peer_dns = HashMap::new();
        for (peer, p) in peers {
            let body = p.certificate.body();
            zones.push(PeerZone {
                peer: *peer,
                name: fqdn(&body.name)?,
                blocks: body.vip_blocks.clone(),
            });
            peer_dns.insert(*peer, p.dns);
        }
        self.resolver.set_peers(zones);
        self.peer_dns = peer_dns;
        Ok(())
    }

    /// The upstream resolvers asked from now on (`None`: names outside the overlay are
    /// refused). Questions already with the old ones are answered from there.
    pub fn set_upstream(&mut self, upstream: Option<Upstream>) {
        tracing::info!(upstream = ?upstream.as_ref().map(Upstream::servers), "DNS upstream resolvers");
        self.resolver.set_upstream(upstream.is_some());
        self.upstream = upstream;
    }

    /// A query from `client`; `from_peer` when it came over the tunnel from that peer (which
    /// gets our own zone and nothing else).
    pub fn query(
        &mut self,
        now: Instant,
        client: C,
        msg: &[u8],
        from_peer: Option<u32>,
    ) -> Option<Said<C>> {
        let action = self.resolver.handle_query(now, msg, client, from_peer);
        self.act(client, action)
    }

    /// An answer from `peer` to something we asked it on someone's behalf; `None` when it
    /// answers nothing we asked.
    pub fn peer_answer(&mut self, peer: u32, msg: &[u8]) -> Option<Said<C>> {
        self.resolver
            .handle_peer_answer(msg, peer)
            .map(|(client, resp)| Said::Answer(client, resp))
    }

    /// The static peer whose DNS server is `ip`.
    pub fn peer_with_server(&self, ip: Ipv4Addr) -> Option<u32> {
        self.peer_dns
            .iter()
            .find(|(_, server)| **server == ip)
            .map(|(peer, _)| *peer)
    }

    /// A question parked for the cloud or the upstream resolvers is settled.
    pub fn settled(&mut self, (key, result): Settled) -> Option<Said<C>> {
        self.resolver
            .complete(key, result)
            .map(|(client, resp)| Said::Answer(client, resp))
    }

    /// SERVFAIL for what waited too long.
    pub fn timeouts(&mut self, now: Instant) -> Vec<Said<C>> {
        self.resolver
            .handle_timeout(now)
            .into_iter()
            .map(|(client, resp)| Said::Answer(client, resp))
            .collect()
    }

    /// When [`Dns::timeouts`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.resolver.poll_timeout()
    }

    /// The names in our zone (label, address).
    pub fn set_hosts<'a>(
        &mut self,
        hosts: impl Iterator<Item = (&'a str, Option<Ipv4Addr>, Option<std::net::Ipv6Addr>)>,
    ) {
        self.resolver.set_hosts(hosts);
    }

    /// Its part of the status document, listening at `listen` (the node's stub), with
    /// `dropped` more messages dropped before they reached it.
    pub fn status(&self, listen: Option<String>, dropped: u64) -> DnsStatus {
        let mut stats = self.resolver.stats();
        stats.dropped += dropped;
        DnsStatus {
            listen,
            upstream: self
                .upstream
                .as_ref()
                .map_or(&[][..], Upstream::servers)
                .iter()
                .map(ToString::to_string)
                .collect(),
            stats,
        }
    }

    fn act(&mut self, client: C, action: Action) -> Option<Said<C>> {
        match action {
            Action::Respond(resp) => Some(Said::Answer(client, resp)),
            Action::AskPeer { peer, query } => {
                let server = self.peer_dns.get(&peer).copied()?;
                Some(Said::AskPeer {
                    peer,
                    server,
                    query,
                })
            }
            Action::AskUpstream {
                name,
                record_type,
                key,
            } => {
                if let Some(upstream) = &self.upstream {
                    upstream.ask(key, name, record_type);
                }
                None
            }
            Action::AskCloud {
                name,
                record_type,
                key,
            } => {
                if let Some(cloud) = &self.cloud {
                    cloud.ask(key, name, record_type);
                    return None;
                }
                // Not produced without a cloud; answer rather than leave the asker waiting.
                self.settled((key, Err(ResponseCode::ServFail)))
            }
            _ => None,
        }
    }
}
