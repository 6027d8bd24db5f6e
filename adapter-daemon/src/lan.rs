//! What the adapter's LAN side shares between the threads that run it: the capture thread,
//! the LAN sink at the end of the engine's ingress pipeline, and the LAN services on the
//! control thread. A leaf: it names the messages the data threads hand the services, and
//! imports none of the modules that use it.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cyphonic_gateway::{Lan, Neighbors};
use cyphonic_netio::PacketSocket;

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
    /// A device on our LAN, asking at the gateway's IPv6 address.
    Lan6 {
        /// Its MAC.
        mac: [u8; 6],
        /// Its address.
        ip: Ipv6Addr,
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
        /// The gateway address it asked (the vIP, or a VLAN segment's): the answer's source.
        asked: Ipv4Addr,
    },
}

/// Questions waiting are counted per device (its vIP), or per peer and address behind it:
/// not per port.
impl cyphonic_resolver::Client for Client {
    type Source = (u32, std::net::IpAddr);

    fn source(&self) -> (u32, std::net::IpAddr) {
        match *self {
            Self::Lan { ip, .. } => (0, ip.into()),
            Self::Lan6 { ip, .. } => (0, ip.into()),
            Self::Peer { peer, ip, .. } => (peer, ip.into()),
        }
    }
}

/// Work for the LAN services (DHCP, DNS, the gateway address), on the control thread. A
/// channel of its own, so that a flood from the LAN can never crowd out handshakes.
#[derive(Debug)]
pub enum ToServices {
    /// A DHCP message from the LAN.
    Dhcp {
        /// The segment it came from: its VLAN, None untagged.
        tag: Option<u16>,
        /// The Ethernet source.
        mac: [u8; 6],
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A DHCPv6 message from the LAN.
    Dhcp6 {
        /// The segment it came from: its VLAN, None untagged.
        tag: Option<u16>,
        /// The Ethernet source.
        mac: [u8; 6],
        /// Its link-local address and port.
        from: (Ipv6Addr, u16),
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
/// At most one Router Advertisement answers solicitations on a segment in this time (RFC
/// 4861 §6.2.6); it goes to every node, so all who asked meanwhile have it.
pub const SOLICITED_ADVERT_EVERY: std::time::Duration = std::time::Duration::from_secs(3);
/// Unsolicited Router Advertisements on each IPv6 segment: every this long, less up to a
/// quarter at random (RFC 4861 §6.2.4).
pub const ADVERT_EVERY: std::time::Duration = std::time::Duration::from_secs(200);

/// The services' queues, the control thread's ends: two per segment of the LAN port (the
/// untagged one first, then each VLAN's), so that a flood on one segment fills only its own.
#[derive(Debug)]
pub struct ServiceQueues {
    /// DHCP, served first.
    pub dhcp: Turns<ToServices>,
    /// DNS and the gateway's packets from peers.
    pub other: Turns<ToServices>,
}

/// Queues read in turn: each read looks at the queue after the one that gave last.
#[derive(Debug)]
pub struct Turns<T> {
    /// The queues.
    pub queues: Vec<tokio::sync::mpsc::Receiver<T>>,
    /// Where the next read starts.
    turn: usize,
}

impl<T> Turns<T> {
    const fn new(queues: Vec<tokio::sync::mpsc::Receiver<T>>) -> Self {
        Self { queues, turn: 0 }
    }

    /// The next message, the queues taking turns; None once every sender is gone.
    pub async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<T>> {
        let n = self.queues.len();
        let mut closed = 0;
        for k in 0..n {
            let i = (self.turn + k) % n;
            match self.queues[i].poll_recv(cx) {
                std::task::Poll::Ready(Some(m)) => {
                    self.turn = i + 1;
                    return std::task::Poll::Ready(Some(m));
                }
                std::task::Poll::Ready(None) => closed += 1,
                std::task::Poll::Pending => {}
            }
        }
        if closed == n {
            std::task::Poll::Ready(None)
        } else {
            std::task::Poll::Pending
        }
    }
}

/// A VLAN segment of a trunked LAN port (`[[vlan]]`): its frames carry `tag`; `lan` is the
/// segment as the gateway sees it (its block, its gateway address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vlan {
    /// Its VLAN identifier.
    pub tag: u16,
    /// The segment.
    pub lan: Lan,
}

/// One segment of the LAN port: the untagged one (`tag` None) or a VLAN's.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// Its VLAN, None untagged.
    pub tag: Option<u16>,
    /// The segment as the gateway sees it.
    pub lan: &'a Lan,
}

/// Who holds which address, as one segment sees it: only the addresses of its own block (a
/// VLAN's; the untagged segment's: the certified block but the VLANs'). A device may send
/// only from an address its segment holds, and packets reach only holders in their segment.
#[derive(Debug, Clone, Copy)]
pub struct SegmentNeighbors<'a> {
    side: &'a LanSide,
    tag: Option<u16>,
}

impl Neighbors for SegmentNeighbors<'_> {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if self.side.segment_of(ip).tag != self.tag {
            return None;
        }
        self.side.table.leased_mac(ip)
    }

    /// Learns only addresses of its own segment (a legacy map's onto lies in its block).
    fn heard(&self, ip: Ipv4Addr, mac: [u8; 6]) {
        if self.side.segment_of(ip).tag == self.tag {
            self.side.table.heard(ip, mac);
        }
    }

    /// Its own segment's router.
    fn router_mac(&self) -> Option<[u8; 6]> {
        self.side.table.router_mac_of(self.tag)
    }

    fn heard_router(&self, mac: [u8; 6]) {
        self.side.table.heard_router_of(self.tag, mac);
    }

    /// One table for every segment's IPv6: each segment's /64 is its own (the gateway asks
    /// only about addresses of the segment's /64).
    fn holder6(&self, ip: Ipv6Addr) -> Option<[u8; 6]> {
        self.side.table.holder6(ip)
    }

    fn heard6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> bool {
        self.side.table.heard6(ip, mac)
    }
}

/// The IPv4 address at byte `at` of `packet` (unspecified when the packet is too short).
fn ipv4_at(packet: &[u8], at: usize) -> Ipv4Addr {
    packet
        .get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map_or(Ipv4Addr::UNSPECIFIED, Ipv4Addr::from)
}

/// The LAN side's shared state.
#[derive(Debug)]
pub struct LanSide {
    /// The LAN segment of untagged frames: our MAC, the gateway vIP, the block, the router's
    /// duties.
    pub lan: Lan,
    /// The VLAN segments of a trunked port, each on a part of the block.
    pub vlans: Vec<Vlan>,
    /// Who holds which address.
    pub table: LanTable,
    /// The LAN side's counters.
    pub counters: LanCounters,
    /// To the LAN services, per segment (the untagged one, then the VLANs'): DNS and peers'
    /// packets for the gateway (bounded; `try_send` only).
    pub to_services: Vec<tokio::sync::mpsc::Sender<ToServices>>,
    /// To the DHCP servers, per segment (bounded, their own; `try_send` only).
    pub to_dhcp: Vec<tokio::sync::mpsc::Sender<ToServices>>,
    /// DHCP per client MAC.
    pub dhcp_rate: cyphonic_tunnel::RateTable,
    /// DNS per LAN source address, and peers' packets for the gateway per peer and source.
    pub service_rate: cyphonic_tunnel::RateTable,
    /// The ICMP errors the gateway originates, all capture threads together.
    pub icmp_errors: cyphonic_tunnel::RateTable,
    /// The gateway's announcements of its own address, all capture threads together.
    pub announcements: cyphonic_tunnel::RateTable,
    /// Router Advertisements answering solicitations, per segment (by its VLAN).
    pub solicited_adverts: cyphonic_tunnel::RateTable,
    /// Whether the DHCP server runs (otherwise DHCP messages are only counted).
    pub dhcp_on: bool,
    /// Whether the DNS service runs.
    pub dns_on: bool,
    /// What the services publish for the status document and the metrics.
    pub published: Mutex<Published>,
    /// What each device sent and received through the tunnel.
    pub meter: crate::meter::Meter,
    /// Until when this box may speak for the gateway: renewed by an HA pair's thread while
    /// the box serves (docs/protocol.md §5, *The mandate*); a lone adapter's has no end.
    pub mandate: std::sync::Arc<cyphonic_ha::Mandate>,
}

impl LanSide {
    /// The LAN side of `lan` (untagged frames) and of the VLAN segments `vlans`, with who
    /// holds which address in `table`, and the services' ends of its queues (their bounds
    /// and per-source rates are this module's constants).
    pub fn new(
        lan: Lan,
        vlans: Vec<Vlan>,
        table: LanTable,
        dhcp_on: bool,
        dns_on: bool,
    ) -> (Self, ServiceQueues) {
        let segments = 1 + vlans.len();
        let (to_services, other) = (0..segments)
            .map(|_| tokio::sync::mpsc::channel(SERVICES_QUEUE))
            .unzip();
        let (to_dhcp, dhcp) = (0..segments)
            .map(|_| tokio::sync::mpsc::channel(DHCP_QUEUE))
            .unzip();
        let side = Self {
            lan,
            vlans,
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
            solicited_adverts: cyphonic_tunnel::RateTable::every(
                segments,
                SOLICITED_ADVERT_EVERY,
                1,
            ),
            dhcp_on,
            dns_on,
            published: Mutex::new(Published::default()),
            meter: crate::meter::Meter::default(),
            mandate: std::sync::Arc::new(cyphonic_ha::Mandate::unbounded(Instant::now())),
        };
        (
            side,
            ServiceQueues {
                dhcp: Turns::new(dhcp),
                other: Turns::new(other),
            },
        )
    }

    /// The index of the segment of `tag` among the queues: 0 the untagged one, then the
    /// VLANs' in order (an unknown tag: the untagged one's, which it never reaches).
    fn queue_of(&self, tag: Option<u16>) -> usize {
        tag.and_then(|t| self.vlans.iter().position(|v| v.tag == t))
            .map_or(0, |i| i + 1)
    }

    /// The segment of frames tagged `tag` (None: untagged), if there is one.
    pub fn segment(&self, tag: Option<u16>) -> Option<Segment<'_>> {
        match tag {
            None => Some(Segment {
                tag: None,
                lan: &self.lan,
            }),
            Some(t) => self.vlans.iter().find(|v| v.tag == t).map(|v| Segment {
                tag: Some(t),
                lan: &v.lan,
            }),
        }
    }

    /// The segment whose block holds `ip`: a VLAN's, else the untagged one.
    pub fn segment_of(&self, ip: Ipv4Addr) -> Segment<'_> {
        self.segment_where(|lan| lan.block.contains(&ip))
    }

    /// The first VLAN segment whose LAN `holds`, else the untagged one.
    fn segment_where(&self, holds: impl Fn(&Lan) -> bool) -> Segment<'_> {
        self.vlans.iter().find(|v| holds(&v.lan)).map_or(
            Segment {
                tag: None,
                lan: &self.lan,
            },
            |v| Segment {
                tag: Some(v.tag),
                lan: &v.lan,
            },
        )
    }

    /// The segment an IP packet is for: its destination's, by the version the packet says
    /// (a packet too short to say: the untagged one, whose own checks drop it).
    pub fn segment_of_packet(&self, packet: &[u8]) -> Segment<'_> {
        if packet.first().is_some_and(|b| b >> 4 == 6) {
            let dst = packet
                .get(24..40)
                .and_then(|s| <[u8; 16]>::try_from(s).ok())
                .map_or(Ipv6Addr::UNSPECIFIED, Ipv6Addr::from);
            return self.segment_of6(dst);
        }
        self.segment_of(ipv4_at(packet, 16))
    }

    /// Every segment's IPv6 /64, the untagged one's first.
    pub fn prefixes6(&self) -> Vec<ipnet::Ipv6Net> {
        std::iter::once(&self.lan)
            .chain(self.vlans.iter().map(|v| &v.lan))
            .filter_map(|l| Some(l.v6.as_ref()?.prefix))
            .collect()
    }

    /// The segment of an IPv6 address: the VLAN whose /64 holds it, else the untagged one.
    pub fn segment_of6(&self, ip: Ipv6Addr) -> Segment<'_> {
        self.segment_where(|lan| lan.v6.as_ref().is_some_and(|s| s.prefix.contains(&ip)))
    }

    /// Who holds which address, as the segment of `tag` sees it.
    pub const fn neighbors(&self, tag: Option<u16>) -> SegmentNeighbors<'_> {
        SegmentNeighbors { side: self, tag }
    }

    /// Sends the frame `buf[frame]` on `sock` into the segment of `tag`, tagging it in `buf`
    /// for a VLAN's; returns whether the interface took it. A frame that cannot be tagged
    /// (no room in `buf`) is counted as unsent.
    pub fn send(
        &self,
        sock: &PacketSocket,
        buf: &mut [u8],
        frame: Range<usize>,
        tag: Option<u16>,
    ) -> bool {
        if !self.serving(Instant::now(), 1) {
            return false;
        }
        let frame = match tag {
            None => Some(frame),
            Some(vid) => cyphonic_gateway::tag_frame(buf, frame, vid),
        };
        let sent = frame.is_some_and(|f| sock.send(&buf[f]).is_ok());
        if !sent {
            bump(&self.counters.lan_send_failed);
        }
        sent
    }

    /// Whether this box may speak for the gateway at `now` (its mandate holds); if not,
    /// `frames` are counted as dropped (`drop_not_serving`).
    pub fn serving(&self, now: Instant, frames: usize) -> bool {
        let holds = self.mandate.holds(now);
        if !holds {
            self.counters
                .drop_not_serving
                .fetch_add(frames as u64, std::sync::atomic::Ordering::Relaxed);
        }
        holds
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

    /// A DNS query from a device on the LAN: to the DNS service when it runs, else counted.
    pub fn dns_query(&self, client: Client, payload: &[u8], now: Instant) {
        if self.dns_on {
            let payload = payload.to_vec();
            self.to_services(ToServices::Dns { client, payload }, now);
        } else {
            bump(&self.counters.dns_unserved);
        }
    }

    /// Hands work to the services, never waiting: DHCP into its own queue, the rest into
    /// theirs, both the segment's (a device's, or the gateway address a peer's packet is
    /// for), each source within its rate; a source over its rate, or a full queue, drops
    /// it, counted.
    pub fn to_services(&self, msg: ToServices, now: Instant) {
        let (queue, admitted) = match &msg {
            ToServices::Dhcp { tag, mac, .. } => (
                &self.to_dhcp[self.queue_of(*tag)],
                self.dhcp_rate.admit(mac, now),
            ),
            // One rate a MAC for both families.
            ToServices::Dhcp6 { tag, mac, .. } => (
                &self.to_dhcp[self.queue_of(*tag)],
                self.dhcp_rate.admit(mac, now),
            ),
            ToServices::Dns { client, .. } => {
                use cyphonic_resolver::Client as _;
                let segment = match client {
                    Client::Lan { ip, .. } => self.segment_of(*ip).tag,
                    Client::Lan6 { ip, .. } => self.segment_of6(*ip).tag,
                    Client::Peer { .. } => None,
                };
                (
                    &self.to_services[self.queue_of(segment)],
                    self.service_rate.admit(client.source(), now),
                )
            }
            ToServices::FromPeer { peer, packet, .. } | ToServices::Expired { peer, packet } => {
                let segment = self.segment_of_packet(packet).tag;
                (
                    &self.to_services[self.queue_of(segment)],
                    self.service_rate.admit((*peer, ipv4_at(packet, 12)), now),
                )
            }
        };
        if !admitted {
            bump(&self.counters.drop_service_rate);
        } else if queue.try_send(msg).is_err() {
            bump(&self.counters.drop_service_busy);
        }
    }

    /// The learned legacy devices, as the status lists them: no name, their own address.
    pub fn learned(&self) -> Vec<crate::status::LeaseStatus> {
        let Some(legacy) = self.lan.legacy else {
            return Vec::new();
        };
        self.table
            .learned()
            .into_iter()
            .map(|(vip, mac)| crate::status::LeaseStatus {
                vip: vip.to_string(),
                mac: crate::config::Mac(mac).to_string(),
                name: None,
                hostname: None,
                reserved: false,
                legacy: legacy.map.to_legacy(vip).map(|a| a.to_string()),
                learned: true,
                vip6: None,
                vlan: None,
                expires: None,
            })
            .collect()
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

    /// The camera VLAN's segment of [`lan_side`]'s LAN: 100.64.1.192/27, tag 20.
    fn cameras(lan: &Lan) -> Vlan {
        Vlan {
            tag: 20,
            lan: Lan {
                gateway_ip: Ipv4Addr::new(100, 64, 1, 193),
                block: "100.64.1.192/27".parse().unwrap(),
                ..lan.clone()
            },
        }
    }

    fn lan_side() -> (LanSide, ServiceQueues) {
        trunk(|_| Vec::new())
    }

    fn trunk(vlans: impl FnOnce(&Lan) -> Vec<Vlan>) -> (LanSide, ServiceQueues) {
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
            v6: None,
        };
        let vlans = vlans(&lan);
        LanSide::new(lan, vlans, LanTable::new(&[]), true, true)
    }

    /// A trunk: the untagged segment on the block, VLAN 20 on 100.64.1.192/27. Each tag
    /// finds its segment (an unknown one none), each address its segment, and a segment's
    /// view of the table holds only its own addresses: a VLAN device's lease is no use to a
    /// frame from another segment, whatever its MAC, and packets reach it only in its own.
    #[test]
    fn each_segment_sees_only_its_own_addresses() {
        let (side, _queues) = trunk(|lan| vec![cameras(lan)]);
        let cams = cameras(&side.lan).lan;
        assert_eq!(side.segment(None).unwrap().lan, &side.lan);
        assert_eq!(side.segment(Some(20)).unwrap().lan, &cams);
        assert!(side.segment(Some(30)).is_none());
        let (camera, laptop) = (
            Ipv4Addr::new(100, 64, 1, 200),
            Ipv4Addr::new(100, 64, 1, 100),
        );
        assert_eq!(side.segment_of(camera).tag, Some(20));
        assert_eq!(side.segment_of(laptop).tag, None);
        let (cam_mac, laptop_mac) = ([2, 0, 0, 0, 0, 0xc1], [2, 0, 0, 0, 0, 0x1a]);
        side.table
            .replace_leases(Some(20), [(camera, cam_mac)].into());
        side.table
            .replace_leases(None, [(laptop, laptop_mac)].into());
        // One segment's leases do not replace the other's.
        assert_eq!(side.table.leased_mac(camera), Some(cam_mac));
        let (untagged, vlan) = (side.neighbors(None), side.neighbors(Some(20)));
        assert_eq!(vlan.leased_mac(camera), Some(cam_mac));
        assert_eq!(untagged.leased_mac(camera), None);
        assert_eq!(untagged.leased_mac(laptop), Some(laptop_mac));
        assert_eq!(vlan.leased_mac(laptop), None);
        assert_eq!(side.neighbors(Some(30)).leased_mac(camera), None);
    }

    /// A box of an HA pair whose mandate lapsed (docs/protocol.md §5, *The mandate*)
    /// speaks for the gateway no more: the LAN side says so for every batch, counting its
    /// frames, until the pair's thread renews it; a lone adapter's never lapses.
    #[test]
    fn without_a_mandate_nothing_is_sent_and_the_frames_are_counted() {
        let (side, _queues) = lan_side();
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(3600);
        assert!(side.serving(later, 1), "a lone adapter's holds");
        side.mandate.renew(now + cyphonic_ha::pair::DEAD);
        assert!(side.serving(now, 4));
        assert!(!side.serving(now + cyphonic_ha::pair::DEAD, 3));
        assert!(!side.serving(later, 2));
        let c = &side.counters;
        let dropped = || {
            c.drop_not_serving
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(dropped(), 5);
        side.mandate.renew(later + cyphonic_ha::pair::DEAD);
        assert!(side.serving(later, 1));
        assert_eq!(dropped(), 5);
    }

    fn dns_from_peer(ip: Ipv4Addr) -> ToServices {
        ToServices::Dns {
            client: Client::Peer {
                peer: 2,
                ip,
                port: 5353,
                asked: Ipv4Addr::new(100, 64, 1, 1),
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
        let others = queues.other.queues[0].len() - usize::try_from(SERVICE_BURST).unwrap();
        assert!(others >= 9, "{others} of 10 other devices got in");
        // DHCP from eight devices, two messages each: every one queued.
        for d in 0..8u8 {
            for _ in 0..2 {
                side.to_services(
                    ToServices::Dhcp {
                        tag: None,
                        mac: [0x02, 0xbb, 0, 0, 0, d],
                        payload: vec![0; 300],
                    },
                    now,
                );
            }
        }
        assert_eq!(queues.dhcp.queues[0].len(), 16);
        // One device repeating DHCP is held to its rate.
        for _ in 0..100 {
            side.to_services(
                ToServices::Dhcp {
                    tag: None,
                    mac: [0x02, 0xcc, 0, 0, 0, 1],
                    payload: vec![0; 300],
                },
                now,
            );
        }
        assert_eq!(
            queues.dhcp.queues[0].len(),
            16 + usize::try_from(DHCP_BURST).unwrap()
        );
        assert!(queues.dhcp.queues[0].try_recv().is_ok());
    }

    /// A VLAN's legacy devices are learned from that VLAN's frames only: the same address
    /// heard on the untagged segment teaches nothing.
    #[test]
    fn a_segment_learns_only_its_own_addresses() {
        let (side, _queues) = lan_side();
        let cams = cameras(&side.lan);
        let table = LanTable::new(&[]).learning(Some("100.64.1.208/28".parse().unwrap()));
        let (side, _queues) = LanSide::new(side.lan.clone(), vec![cams], table, true, true);
        let ip = Ipv4Addr::new(100, 64, 1, 210);
        side.neighbors(None).heard(ip, [2, 0, 0, 0, 0, 1]);
        assert_eq!(side.table.leased_mac(ip), None);
        side.neighbors(Some(20)).heard(ip, [2, 0, 0, 0, 0, 2]);
        assert_eq!(
            side.neighbors(Some(20)).leased_mac(ip),
            Some([2, 0, 0, 0, 0, 2])
        );
    }

    /// DHCP and DNS floods from many devices of one VLAN fill that segment's queues only:
    /// the untagged segment's devices still get in, in full, and the services take the
    /// segments in turn.
    #[test]
    fn a_flood_on_one_vlan_leaves_the_other_segments_queues_alone() {
        let (side, mut queues) = trunk(|lan| vec![cameras(lan)]);
        let now = Instant::now() + std::time::Duration::from_secs(1);
        // A DHCP and a DNS message from `mac` at `ip`, of the segment of `tag`.
        let both = |tag: Option<u16>, mac: [u8; 6], ip: Ipv4Addr| {
            side.to_services(
                ToServices::Dhcp {
                    tag,
                    mac,
                    payload: vec![0; 300],
                },
                now,
            );
            let client = Client::Lan {
                mac,
                ip,
                port: 5353,
            };
            side.to_services(
                ToServices::Dns {
                    client,
                    payload: vec![0; 30],
                },
                now,
            );
        };
        // Many MACs on VLAN 20, each within its own rate: more than the queues hold.
        for d in 0..1000u16 {
            let [hi, lo] = d.to_be_bytes();
            let ip = Ipv4Addr::new(100, 64, 1, 194 + (lo % 28));
            both(Some(20), [0x02, 0xdd, 0, 0, hi, lo], ip);
        }
        assert_eq!(queues.dhcp.queues[1].len(), DHCP_QUEUE);
        assert_eq!(queues.other.queues[1].len(), SERVICES_QUEUE);
        // The untagged segment's devices: every message queued.
        for d in 0..4u8 {
            both(
                None,
                [0x02, 0xbb, 0, 0, 0, d],
                Ipv4Addr::new(100, 64, 1, 100 + d),
            );
        }
        assert_eq!(
            (queues.dhcp.queues[0].len(), queues.other.queues[0].len()),
            (4, 4)
        );
        // Taken in turn: an untagged message every other one.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let tags: Vec<_> = rt.block_on(async {
            let mut tags = Vec::new();
            for _ in 0..8 {
                match queues.dhcp.recv().await {
                    Some(ToServices::Dhcp { tag, .. }) => tags.push(tag),
                    other => panic!("{other:?}"),
                }
            }
            tags
        });
        assert_eq!(tags.iter().filter(|t| t.is_none()).count(), 4, "{tags:?}");
        assert!(tags.windows(2).all(|w| w[0] != w[1]), "{tags:?}");
    }
}
