//! What the adapter's LAN side shares between the threads that run it: the capture thread,
//! the LAN sink at the end of the engine's ingress pipeline, and the LAN services on the
//! control thread. A leaf: it names the messages the data threads hand the services, and
//! imports none of the modules that use it.

use std::net::Ipv4Addr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cyphonic_gateway::Lan;

use crate::counters::{LanCounters, bump};
use crate::neighbors::LanTable;
use crate::status::Published;

/// Who asked a DNS question, and where its answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// A device on our LAN.
    Lan {
        /// Its MAC.
        mac: [u8; 6],
        /// Its vIP.
        ip: Ipv4Addr,
        /// Its UDP port.
        port: u16,
    },
    /// A peer adapter (or a device behind it), over the tunnel.
    Peer {
        /// The peer.
        peer: u32,
        /// The asker's address.
        ip: Ipv4Addr,
        /// Its UDP port.
        port: u16,
    },
}

/// Questions waiting are counted per device (its vIP), or per peer and address behind it:
/// not per port.
impl cyphonic_resolver::Client for Client {
    type Source = (u32, Ipv4Addr);

    fn source(&self) -> (u32, Ipv4Addr) {
        match *self {
            Self::Lan { ip, .. } => (0, ip),
            Self::Peer { peer, ip, .. } => (peer, ip),
        }
    }
}

/// Work for the LAN services (DHCP, DNS, the gateway address), on the control thread. A
/// channel of its own, so that a flood from the LAN can never crowd out handshakes.
#[derive(Debug)]
pub enum ToServices {
    /// A DHCP message from the LAN.
    Dhcp {
        /// The Ethernet source.
        mac: [u8; 6],
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A DNS message from a device on the LAN to the gateway vIP.
    Dns {
        /// Who asked.
        client: Client,
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A peer's packet whose TTL ran out here: a time-exceeded goes back to its sender
    /// (within the gateway's ICMP error rate, checked before it was queued).
    Expired {
        /// The peer.
        peer: u32,
        /// The packet as it arrived.
        packet: Vec<u8>,
    },
    /// A packet a peer sent to the gateway vIP (already checked against its blocks).
    FromPeer {
        /// The peer.
        peer: u32,
        /// The decrypted IP packet.
        packet: Vec<u8>,
        /// When it arrived.
        at: Instant,
    },
}

/// DNS messages and peers' packets for the gateway waiting for the control thread at most;
/// more are dropped and counted.
pub const SERVICES_QUEUE: usize = 256;
/// DHCP messages waiting at most, in a queue of their own: no DNS flood, from the LAN or from
/// another site, can take DHCP's place.
pub const DHCP_QUEUE: usize = 256;
/// DHCP messages a second one MAC may have served (after a burst of [`DHCP_BURST`]).
pub const DHCP_PER_MAC: u32 = 20;
/// DHCP messages one MAC may send at once.
pub const DHCP_BURST: u32 = 40;
/// DNS messages (from a LAN device) or packets for the gateway (from a peer's device) a
/// second one source may have served, after a burst of [`SERVICE_BURST`].
pub const SERVICE_PER_SOURCE: u32 = 100;
/// What one source may send the services at once.
pub const SERVICE_BURST: u32 = 200;
/// Slots of the per-source tables: a fixed size whatever the sources.
pub const RATE_SLOTS: usize = 4096;
/// ICMP errors (fragmentation needed, time exceeded) the gateway sends its LAN a second, all
/// its capture threads together (RFC 1812 §4.3.2.8), after a burst of as many.
pub const ICMP_ERRORS_PER_SEC: u32 = 200;

/// The gateway's announcements of its own address, answering devices that claim it, a
/// second at most (and as many at once): one per claim, so that a device cannot make the
/// gateway flood the LAN with broadcasts by claiming faster.
pub const ANNOUNCEMENTS_PER_SEC: u32 = 10;

/// The services' two queues, the control thread's ends.
#[derive(Debug)]
pub struct ServiceQueues {
    /// DHCP, served first.
    pub dhcp: tokio::sync::mpsc::Receiver<ToServices>,
    /// DNS and the gateway's packets from peers.
    pub other: tokio::sync::mpsc::Receiver<ToServices>,
}

/// The LAN side's shared state.
#[derive(Debug)]
pub struct LanSide {
    /// The LAN segment: our MAC, the gateway vIP, the block, the router's duties.
    pub lan: Lan,
    /// Who holds which address.
    pub table: LanTable,
    /// The LAN side's counters.
    pub counters: LanCounters,
    /// To the LAN services: DNS and peers' packets for the gateway (bounded; `try_send` only).
    pub to_services: tokio::sync::mpsc::Sender<ToServices>,
    /// To the DHCP server (bounded, its own; `try_send` only).
    pub to_dhcp: tokio::sync::mpsc::Sender<ToServices>,
    /// DHCP per client MAC.
    pub dhcp_rate: cyphonic_tunnel::RateTable,
    /// DNS per LAN source address, and peers' packets for the gateway per peer and source.
    pub service_rate: cyphonic_tunnel::RateTable,
    /// The ICMP errors the gateway originates, all capture threads together.
    pub icmp_errors: cyphonic_tunnel::RateTable,
    /// The gateway's announcements of its own address, all capture threads together.
    pub announcements: cyphonic_tunnel::RateTable,
    /// Whether the DHCP server runs (otherwise DHCP messages are only counted).
    pub dhcp_on: bool,
    /// Whether the DNS service runs.
    pub dns_on: bool,
    /// What the services publish for the status document and the metrics.
    pub published: Mutex<Published>,
}

impl LanSide {
    /// The LAN side of `lan`, with who holds which address in `table`, and the services'
    /// ends of its queues (their bounds and per-source rates are this module's constants).
    pub fn new(lan: Lan, table: LanTable, dhcp_on: bool, dns_on: bool) -> (Self, ServiceQueues) {
        let (to_services, other) = tokio::sync::mpsc::channel(SERVICES_QUEUE);
        let (to_dhcp, dhcp) = tokio::sync::mpsc::channel(DHCP_QUEUE);
        let side = Self {
            lan,
            table,
            counters: LanCounters::default(),
            to_services,
            to_dhcp,
            dhcp_rate: cyphonic_tunnel::RateTable::new(RATE_SLOTS, DHCP_PER_MAC, DHCP_BURST),
            service_rate: cyphonic_tunnel::RateTable::new(
                RATE_SLOTS,
                SERVICE_PER_SOURCE,
                SERVICE_BURST,
            ),
            icmp_errors: cyphonic_tunnel::RateTable::new(
                1,
                ICMP_ERRORS_PER_SEC,
                ICMP_ERRORS_PER_SEC,
            ),
            announcements: cyphonic_tunnel::RateTable::new(
                1,
                ANNOUNCEMENTS_PER_SEC,
                ANNOUNCEMENTS_PER_SEC,
            ),
            dhcp_on,
            dns_on,
            published: Mutex::new(Published::default()),
        };
        (side, ServiceQueues { dhcp, other })
    }

    /// Whether the gateway may originate one more ICMP error now (all capture threads and
    /// the LAN sink together, RFC 1812 §4.3.2.8); one it may not is counted.
    pub fn icmp_error_admitted(&self, now: Instant) -> bool {
        let admitted = self.icmp_errors.admit((), now);
        if !admitted {
            bump(&self.counters.icmp_rate_limited);
        }
        admitted
    }

    /// Hands work to the services, never waiting: DHCP into its own queue, the rest into
    /// theirs, each source within its rate; a source over its rate, or a full queue, drops
    /// it, counted.
    pub fn to_services(&self, msg: ToServices, now: Instant) {
        let (queue, admitted) = match &msg {
            ToServices::Dhcp { mac, .. } => (&self.to_dhcp, self.dhcp_rate.admit(mac, now)),
            ToServices::Dns { client, .. } => {
                use cyphonic_resolver::Client as _;
                (
                    &self.to_services,
                    self.service_rate.admit(client.source(), now),
                )
            }
            ToServices::FromPeer { peer, packet, .. } | ToServices::Expired { peer, packet } => {
                let src = packet
                    .get(12..16)
                    .and_then(|s| <[u8; 4]>::try_from(s).ok())
                    .map_or(Ipv4Addr::UNSPECIFIED, Ipv4Addr::from);
                (
                    &self.to_services,
                    self.service_rate.admit((*peer, src), now),
                )
            }
        };
        if !admitted {
            bump(&self.counters.drop_service_rate);
        } else if queue.try_send(msg).is_err() {
            bump(&self.counters.drop_service_busy);
        }
    }

    /// What the services published.
    pub fn published(&self) -> MutexGuard<'_, Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lan_side() -> (LanSide, ServiceQueues) {
        let lan = Lan {
            mac: [0x02, 0xaa, 0, 0, 0, 1],
            host_mac: [0x02, 0xf0, 0, 0, 0, 1],
            gateway_ip: Ipv4Addr::new(100, 64, 1, 1),
            block: "100.64.1.0/24".parse().unwrap(),
            overlay: "100.64.0.0/10".parse().unwrap(),
            inner_mtu: 1420,
            mss_clamp: true,
            defer_checksums: false,
            legacy: None,
        };
        LanSide::new(lan, LanTable::new(&[]), true, true)
    }

    fn dns_from_peer(ip: Ipv4Addr) -> ToServices {
        ToServices::Dns {
            client: Client::Peer {
                peer: 2,
                ip,
                port: 5353,
            },
            payload: vec![0; 30],
        }
    }

    /// A DNS flood from one device at another site spends its own source's rate and no more:
    /// the services' queue keeps room, and DHCP, in a queue of its own, is served in full;
    /// a device flooding DHCP is held to its own rate too.
    #[test]
    fn a_dns_flood_from_one_source_leaves_dhcp_and_other_sources_served() {
        let (side, mut queues) = lan_side();
        let now = Instant::now() + std::time::Duration::from_secs(1);
        let flooder = Ipv4Addr::new(100, 64, 2, 66);
        for _ in 0..10_000 {
            side.to_services(dns_from_peer(flooder), now);
        }
        let c = &side.counters;
        let rate_drops = c
            .drop_service_rate
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(rate_drops, 10_000 - u64::from(SERVICE_BURST));
        assert_eq!(
            c.drop_service_busy
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        // Other devices at that site still get in (but for the odd collision of slots).
        for d in 10..20 {
            side.to_services(dns_from_peer(Ipv4Addr::new(100, 64, 2, d)), now);
        }
        let others = queues.other.len() - usize::try_from(SERVICE_BURST).unwrap();
        assert!(others >= 9, "{others} of 10 other devices got in");
        // DHCP from eight devices, two messages each: every one queued.
        for d in 0..8u8 {
            for _ in 0..2 {
                side.to_services(
                    ToServices::Dhcp {
                        mac: [0x02, 0xbb, 0, 0, 0, d],
                        payload: vec![0; 300],
                    },
                    now,
                );
            }
        }
        assert_eq!(queues.dhcp.len(), 16);
        // One device repeating DHCP is held to its rate.
        for _ in 0..100 {
            side.to_services(
                ToServices::Dhcp {
                    mac: [0x02, 0xcc, 0, 0, 0, 1],
                    payload: vec![0; 300],
                },
                now,
            );
        }
        assert_eq!(queues.dhcp.len(), 16 + usize::try_from(DHCP_BURST).unwrap());
        assert!(queues.dhcp.try_recv().is_ok());
    }
}
