//! The node's DNS stub for the overlay zone, on the control thread: a UDP socket on the node's
//! vIP (port 53 by default) that answers the node's own name, asks the cloud about other
//! overlay names (the answer comes once the tunnel is up, as on the adapter), asks static
//! peers about names in their zones (over the tunnel: the query simply goes to the peer's DNS
//! address, which the host routes into the TUN device), and forwards the rest to upstream
//! resolvers or refuses it. The host's resolver points at it (docs/operations.md).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use cyphonic_resolver::{Action, PeerZone, Resolver, ZoneConfig};
use cyphonic_tunnel::{Asker, Settled, Upstream};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Name;
use ipnet::Ipv4Net;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use crate::config::{Config, Dns};

const DNS_PORT: u16 = 53;

/// The stub.
pub struct Stub {
    /// Its socket.
    pub sock: Arc<UdpSocket>,
    resolver: Resolver<SocketAddr>,
    upstream: Option<Upstream>,
    cloud: Option<Asker>,
    /// Each static peer's DNS address, and the peer.
    peer_dns: HashMap<Ipv4Addr, u32>,
    /// Our own addresses: questions from anywhere else come from a peer.
    local: Ipv4Net,
    /// Each peer's blocks, to tell which peer a question came from.
    peer_blocks: Vec<(u32, Vec<ipnet::IpNet>)>,
    /// Messages that went unanswered because they were malformed or unexpected.
    pub dropped: u64,
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub")
            .field("sock", &self.sock)
            .finish_non_exhaustive()
    }
}

fn fqdn(name: &str) -> anyhow::Result<Name> {
    Name::from_ascii(format!("{}.", name.trim_end_matches('.')))
        .with_context(|| format!("{name:?} is not a DNS name"))
}

impl Stub {
    /// Binds the stub's socket (the vIP must be on the TUN device already) and sets up its
    /// zone. Upstream results arrive on `results`'s receiver.
    ///
    /// # Errors
    /// The socket cannot be bound, a name does not parse.
    pub async fn new(
        config: &Config,
        dns: &Dns,
        name: &str,
        cloud: Option<Asker>,
        results: mpsc::Sender<Settled>,
    ) -> anyhow::Result<Self> {
        let sock = UdpSocket::bind(dns.listen)
            .await
            .with_context(|| format!("binding the DNS stub to {}", dns.listen))?;
        let own_block = Ipv4Net::new(config.vip, 32).context("a /32")?;
        let mut resolver = Resolver::new(ZoneConfig {
            overlay_domain: fqdn(&config.overlay_domain)?,
            own_name: fqdn(name)?,
            own_ip: config.vip,
            own_block,
            overlay: config.overlay,
            ttl: dns.ttl,
            upstream: !dns.upstream.is_empty(),
            ask_cloud: cloud.is_some(),
        });
        resolver.set_hosts(std::iter::empty());
        let mut zones = Vec::new();
        let mut peer_dns = HashMap::new();
        let mut peer_blocks = Vec::new();
        for (i, p) in config.peers.iter().enumerate() {
            let id = u32::try_from(i + 1).context("too many peers")?;
            let body = p.certificate.body();
            zones.push(PeerZone {
                peer: id,
                name: fqdn(&body.name)?,
                blocks: body.vip_blocks.clone(),
            });
            peer_dns.insert(p.dns, id);
            peer_blocks.push((id, body.vip_blocks.clone()));
        }
        resolver.set_peers(zones);
        let upstream = if dns.upstream.is_empty() {
            None
        } else {
            Some(
                Upstream::new(&dns.upstream, results)
                    .context("setting up the upstream DNS resolvers")?,
            )
        };
        tracing::info!(listen = %dns.listen, upstream = ?dns.upstream, zone = %name, "DNS stub for the overlay");
        Ok(Self {
            sock: Arc::new(sock),
            resolver,
            upstream,
            cloud,
            peer_dns,
            local: config.block,
            peer_blocks,
            dropped: 0,
        })
    }

    /// The peer a datagram from `from` came from, if it came over the tunnel.
    fn peer_of(&self, from: SocketAddr) -> Option<u32> {
        let IpAddr::V4(ip) = from.ip() else {
            return None;
        };
        if self.local.contains(&ip) || ip.is_loopback() {
            return None;
        }
        self.peer_blocks
            .iter()
            .find(|(_, blocks)| blocks.iter().any(|b| b.contains(&from.ip())))
            .map(|(id, _)| *id)
    }

    /// A datagram arrived on the stub's socket.
    pub fn handle(&mut self, now: Instant, msg: &[u8], from: SocketAddr) {
        let is_response = msg.get(2).is_some_and(|b| b & 0x80 != 0);
        if is_response {
            // The answer to something we asked a static peer.
            let peer = match from.ip() {
                IpAddr::V4(ip) if from.port() == DNS_PORT => self.peer_dns.get(&ip).copied(),
                _ => None,
            };
            match peer.and_then(|p| self.resolver.handle_peer_answer(msg, p)) {
                Some((client, resp)) => self.send(&resp, client),
                None => self.dropped += 1,
            }
            return;
        }
        let from_peer = self.peer_of(from);
        let action = self.resolver.handle_query(now, msg, from, from_peer);
        self.act(from, action);
    }

    fn act(&mut self, client: SocketAddr, action: Action) {
        match action {
            Action::Respond(resp) => self.send(&resp, client),
            Action::AskPeer { peer, query } => {
                if let Some((ip, _)) = self.peer_dns.iter().find(|(_, p)| **p == peer) {
                    self.send(&query, SocketAddr::from((*ip, DNS_PORT)));
                }
            }
            Action::AskUpstream {
                name,
                record_type,
                key,
            } => {
                if let Some(u) = &self.upstream {
                    u.ask(key, name, record_type);
                }
            }
            Action::AskCloud {
                name,
                record_type,
                key,
            } => match &self.cloud {
                Some(c) => c.ask(key, name, record_type),
                None => self.settled((key, Err(ResponseCode::ServFail))),
            },
            _ => self.dropped += 1,
        }
    }

    fn send(&self, msg: &[u8], to: SocketAddr) {
        if let Err(e) = self.sock.try_send_to(msg, to) {
            tracing::debug!(%to, error = %e, "DNS answer not sent");
        }
    }

    /// Answers SERVFAIL to what waited too long.
    pub fn tick(&mut self, now: Instant) {
        for (client, resp) in self.resolver.handle_timeout(now) {
            self.send(&resp, client);
        }
    }

    /// When [`Stub::tick`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.resolver.poll_timeout()
    }

    /// The stub's counters for the status document.
    pub fn status(&self) -> serde_json::Value {
        let s = self.resolver.stats();
        serde_json::json!({
            "listen": self.sock.local_addr().map(|a| a.to_string()).ok(),
            "upstream": self.upstream.as_ref().map_or(&[][..], Upstream::servers).iter().map(ToString::to_string).collect::<Vec<_>>(),
            "queries": s.queries,
            "authoritative": s.authoritative,
            "asked": s.asked,
            "nxdomain": s.nxdomain,
            "refused": s.refused,
            "servfail": s.servfail,
            "dropped": s.dropped + self.dropped,
        })
    }
}

impl Stub {
    /// A question parked for the cloud or upstream is settled.
    pub fn settled(&mut self, (key, result): Settled) {
        if let Some((client, resp)) = self.resolver.complete(key, result) {
            self.send(&resp, client);
        }
    }
}
