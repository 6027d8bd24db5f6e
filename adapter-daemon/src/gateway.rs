//! The gateway address: what the adapter says from its gateway vIP, on the control thread.
//! To the devices on its LAN (DHCP and DNS replies) it sends Ethernet frames on its own clone
//! of the LAN socket; to peers (echo replies, DNS questions and answers) it hands IP packets to
//! the engine like any other packet, so they are sealed in order and leave through the
//! pipeline's reorder ring, queued behind a pending handshake like the devices' traffic.
//!
//! ```text
//! ingress emitter --packet for the gateway vIP--> services --> Gateway::handle_peer_packet
//!   echo request: the reply, written into a pool buffer --> Intake --> the peer
//!   UDP to port 53: handed back to the DNS service
//! ```

use std::net::Ipv4Addr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use cyphonic_daemon::Core;
use cyphonic_gateway::{GatewayService, gateway_service, udp_packet};
use cyphonic_netio::PacketSocket;
use cyphonic_tunnel::{BUF_LEN, Intake, Outgoing, PACKET_ROOM, Shared};

use crate::counters::bump;
use crate::lan::LanSide;

/// What a peer's packet to the gateway vIP was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromPeer {
    /// An echo request, answered.
    Answered,
    /// A UDP datagram: for the service on `dst_port`.
    Udp {
        /// Its sender.
        src: Ipv4Addr,
        /// The gateway address it was sent to.
        dst: Ipv4Addr,
        /// Its sender's port.
        src_port: u16,
        /// The port it was sent to.
        dst_port: u16,
        /// Its payload within the packet.
        payload: Range<usize>,
    },
    /// Nothing the gateway offers (counted).
    Other,
}

/// The gateway address. See the module docs.
pub struct Gateway {
    lan: Arc<LanSide>,
    shared: Arc<Shared>,
    intake: Intake,
    lan_tx: PacketSocket,
    frame: Box<[u8; BUF_LEN]>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("ip", &self.lan.lan.gateway_ip)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// The gateway of `lan`, sending on the LAN with `lan_tx` and to peers through `core`.
    pub fn new(lan: Arc<LanSide>, core: &Core, lan_tx: PacketSocket) -> Self {
        Self {
            lan,
            shared: core.shared.clone(),
            intake: core.intake.clone(),
            lan_tx,
            frame: Box::new([0; BUF_LEN]),
        }
    }

    /// The gateway's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.lan.lan.gateway_ip
    }

    /// The site's routers whose MAC is not known yet, beside which the adapter runs: each
    /// one's segment (its VLAN, None untagged), its address, and the adapter's own on its
    /// subnet to ask from.
    pub fn routers_to_ask(&self) -> Vec<(Option<u16>, Ipv4Addr, Ipv4Addr)> {
        std::iter::once((None, &self.lan.lan))
            .chain(self.lan.vlans.iter().map(|v| (Some(v.tag), &v.lan)))
            .filter_map(|(tag, lan)| {
                let legacy = lan.legacy?;
                let router = legacy.router?;
                self.lan
                    .table
                    .router_mac_of(tag)
                    .is_none()
                    .then_some((tag, router, legacy.gateway))
            })
            .collect()
    }

    /// Asks for each site's router's MAC on its segment, when [`Gateway::routers_to_ask`]
    /// names it.
    pub fn ask_for_routers(&mut self) {
        for (tag, router, from) in self.routers_to_ask() {
            let Some(len) =
                cyphonic_gateway::request(self.lan.lan.mac, from, router, &mut self.frame[..])
            else {
                continue;
            };
            self.lan
                .send(&self.lan_tx, &mut self.frame[..], 0..len, tag);
        }
    }

    /// Sends the gateway's Router Advertisement to every node of each segment with IPv6.
    pub fn advertise_routers(&mut self) {
        let side = &*self.lan;
        let segments = std::iter::once((None, &side.lan))
            .chain(side.vlans.iter().map(|v| (Some(v.tag), &v.lan)));
        for (tag, lan) in segments {
            let Some(len) = lan.router_advert(&mut self.frame[..]) else {
                continue;
            };
            if side.send(&self.lan_tx, &mut self.frame[..], 0..len, tag) {
                bump(&side.counters.router_adverts);
            }
        }
    }

    /// A packet peer `peer` sent to a gateway address (the vIP, or a VLAN segment's; already
    /// checked against its blocks): an echo request is answered here, a UDP datagram is
    /// handed back.
    pub fn handle_peer_packet(&mut self, peer: u32, packet: &[u8]) -> FromPeer {
        bump(&self.lan.counters.gateway_from_peers);
        let lan = self.lan.segment_of_packet(packet).lan;
        match gateway_service(lan, packet, &mut self.frame[..]) {
            GatewayService::Echo { len } => {
                let reply = &self.frame[..len];
                self.to_peer(peer, |room| {
                    room.get_mut(..len)?.copy_from_slice(reply);
                    Some(len)
                });
                FromPeer::Answered
            }
            GatewayService::Udp {
                src,
                src_port,
                dst_port,
                payload,
            } => FromPeer::Udp {
                src,
                // The segment's gateway: the address the packet was for.
                dst: lan.gateway_ip,
                src_port,
                dst_port,
                payload,
            },
            _ => {
                bump(&self.lan.counters.drop_gateway_from_peer);
                FromPeer::Other
            }
        }
    }

    /// Sends a UDP datagram from the gateway address `src` (the vIP, or a VLAN segment's),
    /// port `src_port`, to `dst:dst_port` behind `peer`, through the tunnel.
    pub fn udp_to_peer(
        &self,
        peer: u32,
        (src, src_port): (Ipv4Addr, u16),
        dst: Ipv4Addr,
        dst_port: u16,
        payload: &[u8],
    ) {
        self.to_peer(peer, |room| {
            udp_packet(room, src, dst, src_port, dst_port, payload)
        });
    }

    /// Tells `peer` that its `packet` ran out of TTL here: a time-exceeded from the gateway
    /// vIP through the tunnel (counted as the LAN's are), unless none may be sent about it.
    pub fn time_exceeded_to_peer(&mut self, peer: u32, packet: &[u8]) {
        let Some(len) = self.lan.lan.time_exceeded(packet, &mut self.frame[..]) else {
            return;
        };
        let error = &self.frame[..len];
        let sent = self.to_peer(peer, |room| {
            room.get_mut(..len)?.copy_from_slice(error);
            Some(len)
        });
        if sent {
            bump(&self.lan.counters.icmp_time_exceeded);
        }
    }

    /// Hands `peer` an IP packet of the gateway's own: `write` puts it into a pool buffer's
    /// room behind the tunnel header and returns its length (`None`: it does not fit), and
    /// the engine seals and sends it in order with the devices' traffic. What cannot go is
    /// counted. Returns whether it went.
    fn to_peer(&self, peer: u32, write: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        let Some(mut buf) = self.shared.pool().take() else {
            bump(&self.shared.counters().drop_no_buffer);
            bump(&self.lan.counters.drop_gateway_to_peer);
            return false;
        };
        let sent = write(&mut buf[PACKET_ROOM]).is_some_and(|len| {
            self.shared.peers().by_id(peer).is_some_and(|slot| {
                self.intake
                    .submit_now(Outgoing::new(buf, len, slot, Instant::now()))
            })
        });
        if !sent {
            bump(&self.lan.counters.drop_gateway_to_peer);
        }
        sent
    }

    /// Sends a UDP datagram from the gateway's `src_port` (from the segment's gateway
    /// address of `ip`'s family) to a device on the segment of VLAN `tag` (None: untagged);
    /// returns whether the interface took it (false on a segment without IPv6 for IPv6).
    pub fn udp_to_lan(
        &mut self,
        tag: Option<u16>,
        mac: [u8; 6],
        ip: std::net::IpAddr,
        src_port: u16,
        dst_port: u16,
        payload: &[u8],
    ) -> bool {
        let Some(seg) = self.lan.segment(tag) else {
            return false;
        };
        let out = &mut self.frame[..];
        let written = match ip {
            std::net::IpAddr::V4(ip) => {
                seg.lan.udp_frame(mac, ip, src_port, dst_port, payload, out)
            }
            std::net::IpAddr::V6(ip) => seg
                .lan
                .udp6_frame(mac, ip, src_port, dst_port, payload, out),
        };
        let Some(len) = written else {
            return false;
        };
        self.lan
            .send(&self.lan_tx, &mut self.frame[..], 0..len, tag)
    }
}
