//! The node's services on the control thread: its DNS stub for the overlay zone, a UDP
//! socket on the node's vIP (port 53 by default) that answers the node's own name, asks the
//! cloud about other overlay names (the answer comes once the tunnel is up, as on the
//! adapter), asks static peers about names in their zones (over the tunnel: the query simply
//! goes to the peer's DNS address, which the host routes into the TUN device), and forwards
//! the rest to upstream resolvers or refuses it. The host's resolver points at it
//! (docs/operations.md).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cyphonic_daemon::dns::{Dns, OwnZone, Said};
use cyphonic_daemon::status::DnsStatus;
use cyphonic_daemon::{Asker, Services, Settled, StaticPeers, Upstream};
use cyphonic_signal::NameRecord;
use ipnet::Ipv4Net;
use tokio::net::UdpSocket;

use crate::config::NodeConfig;

const DNS_PORT: u16 = 53;
/// The largest DNS message read over UDP.
const MAX_MESSAGE: usize = 4096;

/// Who sent a DNS message to the stub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    /// This node: loopback, or its own vIP.
    Node,
    /// A peer, by id.
    Peer(u32),
    /// Anyone else.
    Stranger,
}

/// Who sent a datagram from `from`: the node itself (loopback, its own `vip`), a peer (an
/// address in a peer's certified blocks, which only the tunnel delivers), or a stranger (a
/// neighbour on the node's LAN that routed to our vIP, say).
fn sender(vip: Ipv4Addr, peer_of: impl Fn(Ipv4Addr) -> Option<u32>, from: SocketAddr) -> Sender {
    match from.ip() {
        ip if ip.is_loopback() || ip == IpAddr::V4(vip) => Sender::Node,
        IpAddr::V4(ip) => peer_of(ip).map_or(Sender::Stranger, Sender::Peer),
        IpAddr::V6(_) => Sender::Stranger,
    }
}

/// The stub's way to the overlay without a TUN device (`[userspace]`): messages to overlay
/// addresses (questions to static peers' servers, answers to peers) go out through the
/// userspace stack, from our vIP's port 53; what comes to that port comes back in.
#[derive(Debug)]
pub struct OverlayDns {
    /// Messages for the overlay, and where to.
    pub out: tokio::sync::mpsc::Sender<(Vec<u8>, SocketAddr)>,
    /// Messages from it, and who sent them.
    pub inbound: tokio::sync::mpsc::Receiver<(Vec<u8>, SocketAddr)>,
}

/// The stub: the daemon core's DNS service ([`Dns`]) on a UDP socket of its own.
pub struct Stub {
    sock: UdpSocket,
    /// Without a TUN device: the overlay's side, through the userspace stack.
    overlay: Option<OverlayDns>,
    buf: Box<[u8; MAX_MESSAGE]>,
    dns: Dns<SocketAddr>,
    /// Our vIP: with loopback, the only addresses the node itself asks from.
    vip: Ipv4Addr,
    /// The engine's peers (static and from the cloud), to tell which peer a question came
    /// from by their certified blocks.
    shared: Arc<cyphonic_tunnel::Shared>,
    /// Answers that matched no question we asked.
    dropped: u64,
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub")
            .field("sock", &self.sock)
            .finish_non_exhaustive()
    }
}

/// The node's services: its name, registered with the cloud, and the stub when it runs. What
/// the stub counts is published for the status document and the metrics.
#[derive(Debug)]
pub struct NodeServices {
    stub: Option<Stub>,
    hosted: [NameRecord; 1],
    status: Arc<Mutex<Option<DnsStatus>>>,
}

impl NodeServices {
    /// The services hosting our `name` at `vip` (and its IPv6 address), publishing the
    /// stub's state in `status`.
    pub fn new(
        stub: Option<Stub>,
        name: &str,
        (vip, vip6): (Ipv4Addr, Option<std::net::Ipv6Addr>),
        status: Arc<Mutex<Option<DnsStatus>>>,
    ) -> Self {
        Self {
            stub,
            hosted: [NameRecord {
                name: name.to_owned(),
                vip: Some(vip),
                vip6,
                legacy: None,
            }],
            status,
        }
    }

    fn publish(&self) {
        if let Some(s) = &self.stub {
            *self.status.lock().unwrap_or_else(PoisonError::into_inner) = Some(s.status());
        }
    }
}

impl Services for NodeServices {
    type Work = (usize, SocketAddr);
    type Reload = ();

    async fn next(&mut self) -> (usize, SocketAddr) {
        match self.stub.as_mut() {
            Some(s) => s.recv().await,
            None => std::future::pending().await,
        }
    }

    fn handle(&mut self, (len, from): (usize, SocketAddr), now: Instant) {
        if let Some(s) = self.stub.as_mut() {
            s.handle_received(now, len, from);
        }
    }

    fn tick(&mut self, now: Instant) {
        if let Some(s) = self.stub.as_mut() {
            let expired = s.dns.timeouts(now);
            s.say(expired);
        }
        self.publish();
    }

    /// The node's own keys (interface, vIP, the stub's address) all take effect at a
    /// restart: nothing here changes.
    fn reload(&mut self, (): (), _now: Instant) {}

    fn set_peers(&mut self, peers: &StaticPeers) {
        if let Some(s) = self.stub.as_mut()
            && let Err(e) = s.dns.set_peers(peers)
        {
            tracing::error!(error = %e, "the static peers' zones stay as they were");
        }
    }

    fn set_upstream(&mut self, upstream: Option<Upstream>) {
        if let Some(s) = self.stub.as_mut() {
            s.dns.set_upstream(upstream);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.stub.as_ref().and_then(|s| s.dns.poll_timeout())
    }

    fn hosted(&self) -> (u64, &[NameRecord]) {
        (1, &self.hosted)
    }

    fn settled(&mut self, settled: Settled) {
        if let Some(s) = self.stub.as_mut() {
            let said = s.dns.settled(settled);
            s.say(said);
        }
    }
}

impl Stub {
    /// Binds the stub's socket on `listen` (the vIP must be on the TUN device already; call
    /// inside the control runtime) and sets up its zone: our name at our vIP.
    ///
    /// # Errors
    /// The socket cannot be bound, a name does not parse.
    pub fn new(
        config: &NodeConfig,
        listen: SocketAddr,
        name: &str,
        peers: &StaticPeers,
        (cloud, upstream): (Option<Asker>, Option<Upstream>),
        (shared, overlay): (Arc<cyphonic_tunnel::Shared>, Option<OverlayDns>),
    ) -> anyhow::Result<Self> {
        let bound = || -> std::io::Result<UdpSocket> {
            let std_sock = std::net::UdpSocket::bind(listen)?;
            std_sock.set_nonblocking(true)?;
            UdpSocket::from_std(std_sock)
        };
        let sock = bound().with_context(|| format!("binding the DNS stub to {listen}"))?;
        let common = &config.common;
        let own = OwnZone {
            name: name.to_owned(),
            ip: config.vip,
            ip6: config.ipv6.map(|(ip6, _)| ip6),
            block: Ipv4Net::new(config.vip, 32).context("a /32")?,
        };
        let mut dns = Dns::new(common, &own, peers, cloud, upstream)?;
        dns.set_hosts(std::iter::empty());

        tracing::info!(%listen, "DNS stub listening");
        Ok(Self {
            sock,
            overlay,
            buf: Box::new([0; MAX_MESSAGE]),
            dns,
            vip: config.vip,
            shared,
            dropped: 0,
        })
    }

    /// The next datagram on the stub's socket: its length (in the stub's buffer) and sender.
    /// Cancel-safe. A failing receive (an ICMP error from an earlier answer, say) is logged
    /// and retried after a moment.
    async fn recv(&mut self) -> (usize, SocketAddr) {
        let Self {
            sock, buf, overlay, ..
        } = self;
        loop {
            let from_overlay = async {
                match overlay.as_mut() {
                    Some(o) => o.inbound.recv().await,
                    None => std::future::pending().await,
                }
            };
            let got = tokio::select! {
                got = sock.recv_from(&mut buf[..]) => Ok(got),
                Some(message) = from_overlay => Err(message),
            };
            let got = got.unwrap_or_else(|(msg, from)| {
                let n = msg.len().min(MAX_MESSAGE);
                buf[..n].copy_from_slice(&msg[..n]);
                Ok((n, from))
            });
            match got {
                Ok(got) => return got,
                Err(e) => {
                    tracing::debug!(error = %e, "the DNS stub's receive failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// Answers the datagram [`Stub::recv`] left in the buffer.
    fn handle_received(&mut self, now: Instant, len: usize, from: SocketAddr) {
        let msg = self.buf[..len.min(MAX_MESSAGE)].to_vec();
        self.handle(now, &msg, from);
    }

    /// A datagram arrived on the stub's socket.
    fn handle(&mut self, now: Instant, msg: &[u8], from: SocketAddr) {
        let is_response = msg.get(2).is_some_and(|b| b & 0x80 != 0);
        let said = if is_response {
            // The answer to something we asked a static peer.
            let peer = match from.ip() {
                IpAddr::V4(ip) if from.port() == DNS_PORT => self.dns.peer_with_server(ip),
                _ => None,
            };
            let said = peer.and_then(|p| self.dns.peer_answer(p, msg));
            if said.is_none() {
                self.dropped += 1;
            }
            said
        } else {
            let peers = &self.shared.peers();
            match sender(self.vip, |ip| peers.route(ip).map(|p| p.id), from) {
                Sender::Node => self.dns.query(now, from, msg, None),
                // A peer gets our own zone and nothing else (the DNS service sees to that).
                Sender::Peer(peer) => self.dns.query(now, from, msg, Some(peer)),
                Sender::Stranger => {
                    // The stub serves this node only: no answer, not even a refusal.
                    self.dropped += 1;
                    tracing::debug!(%from, "DNS question from outside this node and its peers dropped");
                    None
                }
            }
        };
        self.say(said);
    }

    /// Sends what the DNS service said: answers to who asked, questions for a static peer to
    /// its DNS server (the host routes them into the TUN device; without one, they go
    /// through the userspace stack, as answers to peers do).
    fn say(&self, said: impl IntoIterator<Item = Said<SocketAddr>>) {
        for s in said {
            let (msg, to) = match s {
                Said::Answer(to, msg) => (msg, to),
                Said::AskPeer { server, query, .. } => {
                    (query, SocketAddr::from((server, DNS_PORT)))
                }
            };
            match self.overlay.as_ref().filter(|_| !to.ip().is_loopback()) {
                Some(o) => {
                    if o.out.try_send((msg, to)).is_err() {
                        tracing::debug!(%to, "DNS message for the overlay not sent: its queue is full");
                    }
                }
                None => {
                    if let Err(e) = self.sock.try_send_to(&msg, to) {
                        tracing::debug!(%to, error = %e, "DNS message not sent");
                    }
                }
            }
        }
    }

    /// Where the stub answers (its port, when `dns.listen` left it to the system).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.sock.local_addr().ok()
    }

    /// The stub's part of the status document.
    fn status(&self) -> DnsStatus {
        let listen = self.sock.local_addr().map(|a| a.to_string()).ok();
        self.dns.status(listen, self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stub serves the node (loopback, its own vIP), answers peers from their certified
    /// blocks (the DNS service gives them our zone only), and nobody else: not a neighbour on
    /// the node's LAN, not another address of the node's own block.
    #[test]
    fn the_stub_serves_the_node_and_its_peers_only() {
        let vip = Ipv4Addr::new(100, 64, 3, 1);
        let block: Ipv4Net = "100.64.2.0/24".parse().unwrap();
        let peers = |ip: Ipv4Addr| block.contains(&ip).then_some(7);
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 40000);
        assert_eq!(sender(vip, peers, at("127.0.0.1")), Sender::Node);
        assert_eq!(sender(vip, peers, at("::1")), Sender::Node);
        assert_eq!(sender(vip, peers, at("100.64.3.1")), Sender::Node);
        assert_eq!(sender(vip, peers, at("100.64.2.10")), Sender::Peer(7));
        for stranger in ["192.0.2.7", "100.64.3.2", "100.64.9.9", "fd00::7"] {
            assert_eq!(
                sender(vip, peers, at(stranger)),
                Sender::Stranger,
                "{stranger}"
            );
        }
    }
}
