//! Egress: what to do with a frame captured on the internal NIC.

use std::net::Ipv4Addr;
use std::ops::Range;

use crate::arp::{self, OP_REQUEST};
use crate::icmp::{self, IcmpError};
use crate::ipv4::{self, Header, Invalid, PROTO_UDP};
use crate::{
    BROADCAST, ETH_HEADER_LEN, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, Lan, Neighbors, Sums,
    mac_at, tcp,
};

const DHCP_SERVER_PORT: u16 = 67;
const DNS_PORT: u16 = 53;
const ETHERTYPE_VLAN: u16 = 0x8100;

/// What a reply frame is, for counters and ICMP rate limiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplyKind {
    /// An ARP reply.
    Arp,
    /// The gateway's announcement of its own address, answering a device that claimed it.
    ArpAnnounce,
    /// An ICMP echo reply from the gateway.
    EchoReply,
    /// ICMP fragmentation needed, with the tunnel's MTU.
    FragNeeded,
    /// ICMP time exceeded (ICMPv6's too).
    TimeExceeded,
    /// ICMPv6 Packet Too Big, with the tunnel's MTU.
    PacketTooBig,
    /// A Router Advertisement answering a Router Solicitation.
    RouterAdvert,
    /// A Neighbour Advertisement of the gateway's IPv6 address, answering a solicitation.
    NeighbourAdvert,
    /// The gateway's Neighbour Advertisement to every node, answering a device that claimed
    /// one of its IPv6 addresses (or probed it for duplicates).
    NeighbourClaim,
}

/// Why a captured frame goes no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EgressDrop {
    /// Addressed to another MAC (the NIC is promiscuous), a multicast group, or sent by us.
    NotForUs,
    /// Not IPv4 or ARP (IPv6, LLDP, ...).
    NotIpv4,
    /// A VLAN-tagged frame: the LAN side is untagged.
    Vlan,
    /// Too short, inconsistent lengths, or a wrong IPv4 header checksum.
    Malformed,
    /// Longer than the capture buffer and not answerable from its head.
    Truncated,
    /// Source IP and MAC do not match a lease or reservation (anti-spoofing).
    Spoofed,
    /// Destination outside the overlay: the adapter is not an internet gateway.
    NoRoute,
    /// Destination on this LAN: devices reach each other directly.
    LocalDestination,
    /// To an address of the block, through the gateway, that nobody holds.
    NoHolder,
    /// To the gateway vIP, but not a service it offers.
    GatewayService,
    /// An ICMP error that RFC 1122 forbids sending (about an ICMP error, a non-first fragment,
    /// or from a broadcast source), or a reply that did not fit the buffer.
    NoReply,
    /// ARP that asks for nobody we answer for.
    ArpIgnored,
    /// A Router Advertisement or Redirect from a device (RA guard, RFC 6105).
    RouterGuard,
    /// Neighbour Discovery that lies: a link-layer address option that is not its frame's
    /// source, or an advertisement of an address another device holds.
    NeighbourSpoofed,
    /// Neighbour Discovery that needs no answer from the gateway (devices resolving each
    /// other, their duplicate address detection: what it taught the table, it taught).
    NeighbourIgnored,
}

/// The verdict on a captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// Send `out[..len]` back on the LAN.
    Reply {
        /// Bytes written into `out`.
        len: usize,
        /// What it is.
        kind: ReplyKind,
    },
    /// A DHCP message for the server: hand `frame[udp_payload]` to it.
    Dhcp {
        /// The client's MAC (from the Ethernet header).
        client_mac: [u8; 6],
        /// The DHCP message within the frame.
        udp_payload: Range<usize>,
    },
    /// A DNS query to the gateway vIP, from a device that holds its address.
    Dns {
        /// The device's MAC.
        client_mac: [u8; 6],
        /// The device's vIP.
        client_ip: Ipv4Addr,
        /// Its UDP source port.
        client_port: u16,
        /// The DNS message within the frame.
        udp_payload: Range<usize>,
    },
    /// A DNS query to the gateway's IPv6 address, from a device that holds its address.
    Dns6 {
        /// The device's MAC.
        client_mac: [u8; 6],
        /// Its address.
        client_ip: std::net::Ipv6Addr,
        /// Its UDP source port.
        client_port: u16,
        /// The DNS message within the frame.
        udp_payload: Range<usize>,
    },
    /// A DHCPv6 message to the servers' multicast address, from a device's link-local
    /// address.
    Dhcp6 {
        /// The device's MAC.
        client_mac: [u8; 6],
        /// Its link-local address.
        client_ip: std::net::Ipv6Addr,
        /// Its UDP source port.
        client_port: u16,
        /// The DHCPv6 message within the frame.
        udp_payload: Range<usize>,
    },
    /// Carry `frame[packet]` into the tunnel towards `dst` (TTL decremented, checksum
    /// completed or deferred, MSS clamped, all in place).
    Forward {
        /// The IPv4 packet within the frame.
        packet: Range<usize>,
        /// Its destination.
        dst: Ipv4Addr,
        /// Its TCP or UDP checksum was left partial ([`crate::Lan::defer_checksums`]): send
        /// it with `FLAG_CHECKSUM_DEFERRED` so that the far end completes it.
        checksum_deferred: bool,
    },
    /// Like [`Egress::Forward`], but larger than the inner MTU without DF: split it with a
    /// [`crate::Fragmenter`] first.
    Fragment {
        /// The IPv4 packet within the frame.
        packet: Range<usize>,
        /// Its destination.
        dst: Ipv4Addr,
    },
    /// Carry the IPv6 packet `frame[packet]` into the tunnel towards `dst` (hop limit
    /// decremented, checksum completed, MSS clamped, all in place).
    Forward6 {
        /// The IPv6 packet within the frame.
        packet: Range<usize>,
        /// Its destination.
        dst: std::net::Ipv6Addr,
    },
    /// Send `frame[frame]` back on the LAN: a packet between a fixed-address device and a
    /// device of the block, readdressed to its holder in place.
    Hairpin {
        /// The frame within the buffer.
        frame: Range<usize>,
    },
    /// Nothing to do but count.
    Drop(EgressDrop),
}

impl Lan {
    /// Decides what to do with a frame captured on the internal NIC. `frame` is what the
    /// buffer holds, `wire_len` the frame's real length (larger when the capture was
    /// truncated), `checksum_partial` whether the kernel left its L4 checksum to offload.
    /// May edit `frame` in place; may write a reply into `out`.
    pub fn handle_frame(
        &self,
        frame: &mut [u8],
        wire_len: usize,
        checksum_partial: bool,
        neighbors: &impl Neighbors,
        out: &mut [u8],
    ) -> Egress {
        if frame.len() < ETH_HEADER_LEN {
            return Egress::Drop(EgressDrop::Malformed);
        }
        let dst_mac = mac_at(frame, 0);
        let src_mac = mac_at(frame, 6);
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        // IPv6 multicast (Neighbour Discovery among it) is judged by its packet.
        let multicast6 = ethertype == ETHERTYPE_IPV6 && dst_mac[..2] == [0x33, 0x33];
        if src_mac == self.mac
            || src_mac == self.host_mac
            || !(dst_mac == self.mac || dst_mac == BROADCAST || multicast6)
        {
            return Egress::Drop(EgressDrop::NotForUs);
        }
        match ethertype {
            ETHERTYPE_ARP => self.handle_arp(&frame[ETH_HEADER_LEN..], neighbors, out),
            ETHERTYPE_IPV4 => {
                let truncated = wire_len > frame.len();
                self.handle_ipv4(
                    frame,
                    src_mac,
                    dst_mac == BROADCAST,
                    truncated,
                    checksum_partial,
                    neighbors,
                    out,
                )
            }
            ETHERTYPE_VLAN => Egress::Drop(EgressDrop::Vlan),
            ETHERTYPE_IPV6 if dst_mac != BROADCAST => self.handle_ipv6(
                frame,
                src_mac,
                multicast6,
                wire_len > frame.len(),
                checksum_partial,
                neighbors,
                out,
            ),
            _ => Egress::Drop(EgressDrop::NotIpv4),
        }
    }

    fn handle_arp(&self, payload: &[u8], neighbors: &impl Neighbors, out: &mut [u8]) -> Egress {
        let Some(a) = arp::parse(payload) else {
            return Egress::Drop(EgressDrop::Malformed);
        };
        // A fixed-address device saying where it is: the table may learn it; the site's
        // router, beside which the adapter runs, likewise.
        if let Some(vip) = self.legacy_device(a.sender_ip) {
            hear(neighbors, vip, a.sender_mac);
        } else if self.legacy.and_then(|l| l.router) == Some(a.sender_ip) {
            neighbors.heard_router(a.sender_mac);
        }
        match a.op {
            // A device claims the gateway's own address (ARP spoofing: its neighbours would
            // send it what they send the overlay, in clear): the gateway's announcement goes
            // out at once and puts their caches right.
            _ if self.is_gateway_address(a.sender_ip) && a.sender_mac != self.mac => {
                match arp::announcement(self.mac, a.sender_ip, out) {
                    Some(len) => Egress::Reply {
                        len,
                        kind: ReplyKind::ArpAnnounce,
                    },
                    None => Egress::Drop(EgressDrop::NoReply),
                }
            }
            OP_REQUEST if arp::answers_for(self, a.target_ip) && !a.sender_ip.is_unspecified() => {
                match arp::reply(self, &a, out) {
                    Some(len) => Egress::Reply {
                        len,
                        kind: ReplyKind::Arp,
                    },
                    None => Egress::Drop(EgressDrop::NoReply),
                }
            }
            // Nothing is learned from the rest: only a lease or a reservation says where a
            // device of the block is (an address nobody holds must not be claimable by
            // announcing it); of a legacy subnet, what the table learned above.
            _ => Egress::Drop(EgressDrop::ArpIgnored),
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one frame's facts, passed down once"
    )]
    fn handle_ipv4(
        &self,
        frame: &mut [u8],
        src_mac: [u8; 6],
        broadcast: bool,
        truncated: bool,
        checksum_partial: bool,
        neighbors: &impl Neighbors,
        out: &mut [u8],
    ) -> Egress {
        let ip_start = ETH_HEADER_LEN;
        let h = match Header::parse(&frame[ip_start..], !truncated) {
            Ok(h) => h,
            Err(Invalid::NotIpv4) => return Egress::Drop(EgressDrop::NotIpv4),
            Err(Invalid::Malformed) => return Egress::Drop(EgressDrop::Malformed),
        };
        let packet = ip_start..ip_start + h.total_len;

        // DHCP comes before anti-spoofing: clients have no address yet.
        if !truncated
            && let Some((_, DHCP_SERVER_PORT, payload)) = udp_ports(&frame[ip_start..], &h)
        {
            return Egress::Dhcp {
                client_mac: src_mac,
                udp_payload: offset(payload, ip_start),
            };
        }
        if broadcast {
            return Egress::Drop(EgressDrop::NotForUs);
        }
        // A fixed-address device's packet goes on in the overlay's terms (the legacy map);
        // what the gateway answers it goes back into the device's own.
        let Some(legacy) = self.legacy.filter(|l| l.map.legacy().contains(&h.src)) else {
            return self.route_ipv4(
                frame,
                h,
                src_mac,
                truncated,
                checksum_partial,
                neighbors,
                out,
            );
        };
        if truncated {
            return Egress::Drop(EgressDrop::Truncated);
        }
        let sums = if checksum_partial {
            Sums::Partial
        } else {
            Sums::Full
        };
        let device = self.legacy_device(h.src);
        let Ok(h) = legacy.outbound(&mut frame[packet], &h, sums, self.gateway_ip) else {
            return Egress::Drop(EgressDrop::Malformed);
        };
        // Beside a site's router, what it forwards carries its MAC: it vouches for every
        // address of its LAN, and teaches nothing about who holds which.
        let via_router = legacy.router.is_some() && neighbors.router_mac() == Some(src_mac);
        let verdict = if via_router {
            let vouched = Vouched {
                neighbors,
                ip: h.src,
                mac: src_mac,
            };
            self.route_ipv4(frame, h, src_mac, false, checksum_partial, &vouched, out)
        } else {
            if let Some(vip) = device {
                hear(neighbors, vip, src_mac);
            }
            self.route_ipv4(frame, h, src_mac, false, checksum_partial, neighbors, out)
        };
        if let Egress::Reply { len, .. } = verdict {
            let back = out
                .get_mut(ip_start..len)
                .map(|ip| legacy.inbound(ip, Sums::Full, self.gateway_ip));
            if back != Some(Ok(())) {
                return Egress::Drop(EgressDrop::NoReply);
            }
        }
        verdict
    }

    /// The rest of [`Lan::handle_ipv4`], for a packet in the overlay's terms.
    #[expect(
        clippy::too_many_arguments,
        reason = "one frame's facts, passed down once"
    )]
    fn route_ipv4(
        &self,
        frame: &mut [u8],
        h: Header,
        src_mac: [u8; 6],
        truncated: bool,
        checksum_partial: bool,
        neighbors: &impl Neighbors,
        out: &mut [u8],
    ) -> Egress {
        let ip_start = ETH_HEADER_LEN;
        let packet = ip_start..ip_start + h.total_len;
        if neighbors.leased_mac(h.src) != Some(src_mac) {
            return Egress::Drop(EgressDrop::Spoofed);
        }
        if h.dst == self.gateway_ip {
            return self.to_gateway(frame, &h, src_mac, truncated, out);
        }
        if !self.overlay.contains(&h.dst) {
            return Egress::Drop(EgressDrop::NoRoute);
        }
        let local = self.block.contains(&h.dst);
        if local && !self.hairpins(&h) {
            return Egress::Drop(EgressDrop::LocalDestination);
        }
        if h.ttl <= 1 {
            return self.icmp_error(
                src_mac,
                &frame[ip_start..],
                &h,
                IcmpError::TimeExceeded,
                out,
            );
        }
        if local {
            return self.hairpin(frame, &h, truncated, checksum_partial, neighbors);
        }
        if h.total_len > usize::from(self.inner_mtu) && h.df {
            return self.icmp_error(
                src_mac,
                &frame[ip_start..],
                &h,
                IcmpError::FragNeeded(self.inner_mtu),
                out,
            );
        }
        if truncated {
            return Egress::Drop(EgressDrop::Truncated);
        }
        let ip = &mut frame[packet.clone()];
        ipv4::decrement_ttl(ip);
        let fragment = h.total_len > usize::from(self.inner_mtu);
        // A checksum left partial goes through the tunnel as it is, for the far end to
        // complete, unless this packet is to be fragmented (the far end could not reach the
        // whole payload) or has no checksum to complete.
        let checksum_deferred = checksum_partial
            && self.defer_checksums
            && !fragment
            && ipv4::has_transport_checksum(ip, &h);
        if checksum_partial && !checksum_deferred {
            ipv4::complete_transport_checksum(ip, &h);
        }
        if self.mss_clamp {
            // Updates the checksum field incrementally: harmless on a deferred one, which the
            // far end computes afresh.
            tcp::clamp_mss(ip, &h, self.max_mss());
        }
        if fragment {
            return Egress::Fragment { packet, dst: h.dst };
        }
        Egress::Forward {
            packet,
            dst: h.dst,
            checksum_deferred,
        }
    }

    /// Whether a packet for an address of the block goes back onto the LAN through the
    /// gateway: between a fixed-address device and a device of the block, which share the
    /// wire but not a subnet. Devices of one subnet reach each other directly.
    fn hairpins(&self, h: &Header) -> bool {
        self.legacy.is_some_and(|l| {
            let onto = l.map.overlay();
            onto.contains(&h.src) != onto.contains(&h.dst)
        })
    }

    /// Sends a packet between the two kinds of device on the LAN back out to the holder of
    /// its destination (in its own terms), its TTL decremented and its checksum complete.
    fn hairpin(
        &self,
        frame: &mut [u8],
        h: &Header,
        truncated: bool,
        checksum_partial: bool,
        neighbors: &impl Neighbors,
    ) -> Egress {
        if truncated {
            return Egress::Drop(EgressDrop::Truncated);
        }
        let Some(mac) = neighbors.leased_mac(h.dst) else {
            return Egress::Drop(EgressDrop::NoHolder);
        };
        let end = ETH_HEADER_LEN + h.total_len;
        let ip = &mut frame[ETH_HEADER_LEN..end];
        ipv4::decrement_ttl(ip);
        if checksum_partial {
            ipv4::complete_transport_checksum(ip, h);
        }
        if let Some(legacy) = self.legacy.filter(|l| l.map.overlay().contains(&h.dst))
            && legacy.inbound(ip, Sums::Full, self.gateway_ip).is_err()
        {
            return Egress::Drop(EgressDrop::Malformed);
        }
        crate::write_eth(frame, mac, self.mac, ETHERTYPE_IPV4);
        Egress::Hairpin { frame: 0..end }
    }

    /// The overlay address of `ip` when it is a device's address on the legacy subnet (a
    /// host address, not the old router's).
    fn legacy_device(&self, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        let legacy = self.legacy?;
        let subnet = legacy.map.legacy();
        let device = ip != legacy.gateway
            && Some(ip) != legacy.router
            && ip != subnet.network()
            && ip != subnet.broadcast();
        device.then(|| legacy.map.to_overlay(ip)).flatten()
    }

    fn to_gateway(
        &self,
        frame: &[u8],
        h: &Header,
        src_mac: [u8; 6],
        truncated: bool,
        out: &mut [u8],
    ) -> Egress {
        if truncated {
            return Egress::Drop(EgressDrop::Truncated);
        }
        let ip = &frame[ETH_HEADER_LEN..];
        if icmp::is_echo_request(ip, h) {
            return match icmp::echo_reply(self, src_mac, ip, h, out) {
                Some(len) => Egress::Reply {
                    len,
                    kind: ReplyKind::EchoReply,
                },
                None => Egress::Drop(EgressDrop::NoReply),
            };
        }
        if let Some((sport, DNS_PORT, payload)) = udp_ports(ip, h) {
            return Egress::Dns {
                client_mac: src_mac,
                client_ip: h.src,
                client_port: sport,
                udp_payload: offset(payload, ETH_HEADER_LEN),
            };
        }
        Egress::Drop(EgressDrop::GatewayService)
    }

    fn icmp_error(
        &self,
        dst_mac: [u8; 6],
        ip: &[u8],
        h: &Header,
        kind: IcmpError,
        out: &mut [u8],
    ) -> Egress {
        let reply = match kind {
            IcmpError::FragNeeded(_) => ReplyKind::FragNeeded,
            IcmpError::TimeExceeded => ReplyKind::TimeExceeded,
        };
        match icmp::error(self, dst_mac, ip, h, kind, out) {
            Some(len) => Egress::Reply { len, kind: reply },
            None => Egress::Drop(EgressDrop::NoReply),
        }
    }
}

/// UDP source port, destination port and payload range (relative to `ip`) of a whole,
/// unfragmented UDP packet with a consistent length field.
fn udp_ports(ip: &[u8], h: &Header) -> Option<(u16, u16, Range<usize>)> {
    if h.proto != PROTO_UDP || h.is_fragment() {
        return None;
    }
    let seg = h.payload(ip)?;
    if seg.len() < 8 {
        return None;
    }
    let udp_len = usize::from(u16::from_be_bytes([seg[4], seg[5]]));
    if udp_len < 8 || udp_len > seg.len() {
        return None;
    }
    let start = h.header_len + 8;
    Some((
        u16::from_be_bytes([seg[0], seg[1]]),
        u16::from_be_bytes([seg[2], seg[3]]),
        start..h.header_len + udp_len,
    ))
}

fn offset(r: Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}

/// `neighbors`, but for one packet the router forwarded: its source address is taken as held
/// by the router's MAC.
struct Vouched<'a, N> {
    neighbors: &'a N,
    ip: Ipv4Addr,
    mac: [u8; 6],
}

impl<N: Neighbors> Neighbors for Vouched<'_, N> {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if ip == self.ip {
            return Some(self.mac);
        }
        self.neighbors.leased_mac(ip)
    }
}

/// Tells `neighbors` that `mac` is at the legacy device address `vip`, when nobody holds it.
fn hear(neighbors: &impl Neighbors, vip: Ipv4Addr, mac: [u8; 6]) {
    if neighbors.leased_mac(vip).is_none() {
        neighbors.heard(vip, mac);
    }
}

#[cfg(test)]
#[expect(
    clippy::needless_pass_by_value,
    reason = "test helpers take what they are given"
)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::testutil::*;

    pub(crate) struct Leases(pub(crate) HashMap<Ipv4Addr, [u8; 6]>);

    impl Neighbors for Leases {
        fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
            self.0.get(&ip).copied()
        }
    }

    pub(crate) fn leases() -> Leases {
        Leases([(Ipv4Addr::new(100, 64, 1, 10), DEV_MAC)].into())
    }

    const DEV: [u8; 4] = [100, 64, 1, 10];
    const REMOTE: [u8; 4] = [100, 64, 2, 20];
    const GW: [u8; 4] = [100, 64, 1, 1];

    /// Runs a frame through `handle_frame`; returns the verdict, the (edited) frame and `out`.
    fn run(
        mut frame: Vec<u8>,
        wire_len: Option<usize>,
        partial: bool,
    ) -> (Egress, Vec<u8>, Vec<u8>) {
        let mut out = vec![0u8; 2048];
        let len = wire_len.unwrap_or(frame.len());
        let v = lan().handle_frame(&mut frame, len, partial, &leases(), &mut out);
        (v, frame, out)
    }

    fn check(frame: Vec<u8>, expect: Egress) {
        assert_eq!(run(frame, None, false).0, expect);
    }

    fn arp_frame(op: u16, sender_mac: [u8; 6], sender_ip: [u8; 4], target_ip: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        crate::write_eth(&mut f, BROADCAST, sender_mac, ETHERTYPE_ARP);
        let a = &mut f[14..];
        a[0..2].copy_from_slice(&1u16.to_be_bytes());
        a[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
        a[4] = 6;
        a[5] = 4;
        a[6..8].copy_from_slice(&op.to_be_bytes());
        a[8..14].copy_from_slice(&sender_mac);
        a[14..18].copy_from_slice(&sender_ip);
        a[24..28].copy_from_slice(&target_ip);
        f
    }

    /// A device that claims the gateway's address, by announcement, reply or request, gets
    /// the gateway's own announcement broadcast at once (finding 7); the gateway's own frames
    /// (its MAC) are not a claim.
    #[test]
    fn a_claim_of_the_gateways_address_is_answered_with_an_announcement() {
        for (op, target) in [(1, GW), (2, GW), (2, DEV), (1, [100, 64, 1, 11])] {
            let (v, _, out) = run(arp_frame(op, DEV_MAC, GW, target), None, false);
            assert_eq!(
                v,
                Egress::Reply {
                    len: 42,
                    kind: ReplyKind::ArpAnnounce
                },
                "op {op} target {target:?}"
            );
            assert_eq!(&out[..6], &BROADCAST);
            assert_eq!(&out[6..12], &GW_MAC);
            let a = pnet_packet::arp::ArpPacket::new(&out[14..42]).unwrap();
            assert_eq!(a.get_operation().0, 1);
            assert_eq!(a.get_sender_hw_addr().octets(), GW_MAC);
            assert_eq!(a.get_sender_proto_addr(), Ipv4Addr::from(GW));
            assert_eq!(a.get_target_proto_addr(), Ipv4Addr::from(GW));
        }
    }

    #[test]
    fn arp_for_the_gateway_and_proxy_for_remote_vips() {
        for target in [GW, REMOTE] {
            let (v, _, out) = run(arp_frame(1, DEV_MAC, DEV, target), None, false);
            assert_eq!(
                v,
                Egress::Reply {
                    len: 42,
                    kind: ReplyKind::Arp
                },
                "target {target:?}"
            );
            let reply = pnet_packet::arp::ArpPacket::new(&out[14..42]).unwrap();
            assert_eq!(reply.get_operation().0, 2);
            assert_eq!(reply.get_sender_hw_addr().octets(), GW_MAC);
            assert_eq!(reply.get_sender_proto_addr(), Ipv4Addr::from(target));
            assert_eq!(reply.get_target_hw_addr().octets(), DEV_MAC);
            assert_eq!(&out[..6], &DEV_MAC);
        }
        // For another device on the LAN we stay silent, and learn nothing: neither from a
        // request nor from an announcement of an address nobody holds (finding 7).
        for (op, sender, target) in [
            (1, DEV, [100, 64, 1, 11]),
            (2, DEV, [100, 64, 1, 11]),
            (1, [100, 64, 1, 150], [100, 64, 1, 150]),
            (2, [100, 64, 1, 150], [100, 64, 1, 150]),
        ] {
            check(
                arp_frame(op, DEV_MAC, sender, target),
                Egress::Drop(EgressDrop::ArpIgnored),
            );
        }
        // DHCP clients probe with sender 0.0.0.0 (RFC 5227): never answered.
        check(
            arp_frame(1, DEV_MAC, [0, 0, 0, 0], [100, 64, 1, 10]),
            Egress::Drop(EgressDrop::ArpIgnored),
        );
        // A target outside the overlay is not ours to answer.
        check(
            arp_frame(1, DEV_MAC, DEV, [192, 0, 2, 1]),
            Egress::Drop(EgressDrop::ArpIgnored),
        );
        check(
            arp_frame(1, DEV_MAC, [192, 0, 2, 9], [192, 0, 2, 1]),
            Egress::Drop(EgressDrop::ArpIgnored),
        );
        let mut bad = arp_frame(1, DEV_MAC, DEV, GW);
        bad[18] = 8; // hardware length 8
        check(bad, Egress::Drop(EgressDrop::Malformed));
        check(
            arp_frame(1, DEV_MAC, DEV, GW)[..30].to_vec(),
            Egress::Drop(EgressDrop::Malformed),
        );
    }

    #[test]
    fn echo_to_the_gateway_is_answered() {
        let (v, _, out) = run(
            eth(GW_MAC, DEV_MAC, &ipv4_echo(DEV, GW, b"ping data")),
            None,
            false,
        );
        let Egress::Reply {
            len,
            kind: ReplyKind::EchoReply,
        } = v
        else {
            panic!("{v:?}")
        };
        let ip = &out[14..len];
        assert!(checksums_ok(ip));
        assert_eq!((&ip[12..16], &ip[16..20]), (&GW[..], &DEV[..]));
        assert_eq!(ip[20], 0, "echo reply");
        assert_eq!(&ip[28..], b"ping data");
        assert_eq!(&out[..6], &DEV_MAC);
    }

    #[test]
    fn dhcp_and_dns_are_handed_off() {
        let discover = eth(
            BROADCAST,
            DEV_MAC,
            &ipv4_udp([0, 0, 0, 0], [255, 255, 255, 255], 68, 67, b"dhcp message"),
        );
        let (v, frame, _) = run(discover, None, false);
        let Egress::Dhcp {
            client_mac,
            udp_payload,
        } = v
        else {
            panic!("{v:?}")
        };
        assert_eq!(
            (client_mac, &frame[udp_payload]),
            (DEV_MAC, &b"dhcp message"[..])
        );

        let query = eth(GW_MAC, DEV_MAC, &ipv4_udp(DEV, GW, 33333, 53, b"dns query"));
        let (v, frame, _) = run(query, None, false);
        let Egress::Dns {
            client_mac,
            client_ip,
            client_port,
            udp_payload,
        } = v
        else {
            panic!("{v:?}")
        };
        assert_eq!(
            (client_mac, client_ip, client_port),
            (DEV_MAC, DEV.into(), 33333)
        );
        assert_eq!(&frame[udp_payload], b"dns query");
        // DNS from a device that holds no lease is spoofed.
        check(
            eth(GW_MAC, [2, 0, 0, 0, 0, 66], &ipv4_udp(DEV, GW, 1, 53, b"q")),
            Egress::Drop(EgressDrop::Spoofed),
        );
        check(
            eth(GW_MAC, DEV_MAC, &ipv4_udp(DEV, GW, 1, 123, b"ntp?")),
            Egress::Drop(EgressDrop::GatewayService),
        );
    }

    #[test]
    fn data_is_forwarded_after_checks() {
        let p = ipv4_udp(DEV, REMOTE, 5000, 5001, b"payload");
        let (v, frame, _) = run(eth(GW_MAC, DEV_MAC, &p), None, false);
        assert_eq!(
            v,
            Egress::Forward {
                packet: 14..14 + p.len(),
                dst: REMOTE.into(),
                checksum_deferred: false,
            }
        );
        assert_eq!(frame[14 + 8], 63, "TTL decremented");
        assert!(checksums_ok(&frame[14..]));
    }

    #[test]
    fn anti_spoofing_and_routing_refusals() {
        use EgressDrop::*;
        let to_remote = |src: [u8; 4]| ipv4_udp(src, REMOTE, 1, 2, b"x");
        check(
            eth(GW_MAC, DEV_MAC, &to_remote([100, 64, 1, 99])),
            Egress::Drop(Spoofed),
        );
        check(
            eth(GW_MAC, [2, 0, 0, 0, 0, 66], &to_remote(DEV)),
            Egress::Drop(Spoofed),
        );
        check(
            eth(GW_MAC, DEV_MAC, &ipv4_udp(DEV, [192, 0, 2, 50], 1, 2, b"x")),
            Egress::Drop(NoRoute),
        );
        check(
            eth(
                GW_MAC,
                DEV_MAC,
                &ipv4_udp(DEV, [100, 64, 1, 11], 1, 2, b"x"),
            ),
            Egress::Drop(LocalDestination),
        );
        check(
            eth([2, 0, 0, 0, 0, 77], DEV_MAC, &to_remote(DEV)),
            Egress::Drop(NotForUs),
        );
        check(
            eth([0x01, 0, 0x5e, 0, 0, 0xfb], DEV_MAC, &to_remote(DEV)),
            Egress::Drop(NotForUs),
        );
        check(eth(GW_MAC, GW_MAC, &to_remote(DEV)), Egress::Drop(NotForUs));
        // Frames to the host's own MAC are the kernel's business (never a device's way out),
        // and frames from it are the host's own.
        check(
            eth(HOST_MAC, DEV_MAC, &to_remote(DEV)),
            Egress::Drop(NotForUs),
        );
        check(
            eth(GW_MAC, HOST_MAC, &to_remote(DEV)),
            Egress::Drop(NotForUs),
        );
        let mut v6 = eth(GW_MAC, DEV_MAC, &to_remote(DEV));
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        check(v6, Egress::Drop(NotIpv4));
        let mut vlan = eth(GW_MAC, DEV_MAC, &to_remote(DEV));
        vlan[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        check(vlan, Egress::Drop(Vlan));
        let mut bad_sum = eth(GW_MAC, DEV_MAC, &to_remote(DEV));
        bad_sum[24] ^= 0xff;
        check(bad_sum, Egress::Drop(Malformed));
        check(vec![0u8; 13], Egress::Drop(Malformed));
    }

    #[test]
    fn ttl_and_mtu_get_icmp_answers() {
        let mut p = ipv4_udp(DEV, REMOTE, 1, 2, b"dying");
        p[8] = 1;
        ipv4::fill_header_checksum(&mut p, 20);
        let (v, _, out) = run(eth(GW_MAC, DEV_MAC, &p), None, false);
        let Egress::Reply {
            len,
            kind: ReplyKind::TimeExceeded,
        } = v
        else {
            panic!("{v:?}")
        };
        assert!(checksums_ok(&out[14..len]));
        assert_eq!((out[34], out[35]), (11, 0));
        assert_eq!(&out[42..62], &p[..20], "quotes the original header");

        let big = ipv4_sized(1500, true);
        let (v, _, out) = run(eth(GW_MAC, DEV_MAC, &big), None, false);
        let Egress::Reply {
            len,
            kind: ReplyKind::FragNeeded,
        } = v
        else {
            panic!("{v:?}")
        };
        let icmp = &out[34..len];
        assert_eq!((icmp[0], icmp[1]), (3, 4));
        assert_eq!(
            u16::from_be_bytes([icmp[6], icmp[7]]),
            1420,
            "next-hop MTU (RFC 1191)"
        );
        assert_eq!(&icmp[8..28], &big[..20]);
        assert_eq!(&icmp[28..36], &big[20..28], "and the first 8 payload bytes");
        assert!(checksums_ok(&out[14..len]));
        // Exactly the MTU passes.
        let fits = ipv4_sized(1420, true);
        assert!(matches!(
            run(eth(GW_MAC, DEV_MAC, &fits), None, false).0,
            Egress::Forward { .. }
        ));
        // Without DF: fragment.
        let no_df = ipv4_sized(1500, false);
        assert_eq!(
            run(eth(GW_MAC, DEV_MAC, &no_df), None, false).0,
            Egress::Fragment {
                packet: 14..1514,
                dst: REMOTE.into()
            }
        );
    }

    #[test]
    fn truncated_captures_are_answered_or_counted() {
        let big = eth(GW_MAC, DEV_MAC, &ipv4_sized(3000, true));
        let (v, _, _) = run(big[..2048].to_vec(), Some(3014), false);
        assert!(
            matches!(
                v,
                Egress::Reply {
                    kind: ReplyKind::FragNeeded,
                    ..
                }
            ),
            "{v:?}"
        );
        let big = eth(GW_MAC, DEV_MAC, &ipv4_sized(3000, false));
        assert_eq!(
            run(big[..2048].to_vec(), Some(3014), false).0,
            Egress::Drop(EgressDrop::Truncated)
        );
    }

    #[test]
    fn syn_is_clamped_and_partial_checksums_completed() {
        let (v, frame, _) = run(
            eth(GW_MAC, DEV_MAC, &{
                let mut s = syn(1460);
                s[12..16].copy_from_slice(&DEV);
                ipv4::fill_header_checksum(&mut s, 20);
                let sum = crate::checksum::transport(&s[20..], DEV.into(), REMOTE.into(), 6, 8);
                s[36..38].copy_from_slice(&sum.to_be_bytes());
                s
            }),
            None,
            false,
        );
        assert!(matches!(v, Egress::Forward { .. }), "{v:?}");
        assert_eq!(u16::from_be_bytes([frame[14 + 44], frame[14 + 45]]), 1380);
        assert!(checksums_ok(&frame[14..]));

        let mut p = ipv4_udp(DEV, REMOTE, 1, 2, b"offloaded");
        p[26..28].copy_from_slice(&[0x12, 0x34]);
        let (v, frame, _) = run(eth(GW_MAC, DEV_MAC, &p), None, true);
        assert!(
            matches!(
                v,
                Egress::Forward {
                    checksum_deferred: false,
                    ..
                }
            ),
            "not deferred unless asked: {v:?}"
        );
        assert!(
            checksums_ok(&frame[14..]),
            "checksum completed before sealing"
        );
    }

    #[test]
    fn partial_checksums_are_deferred_when_asked_unless_the_packet_is_fragmented() {
        let deferring = Lan {
            defer_checksums: true,
            legacy: None,
            ..lan()
        };
        let handle = |mut frame: Vec<u8>, partial: bool| {
            let mut out = vec![0u8; 2048];
            let len = frame.len();
            let v = deferring.handle_frame(&mut frame, len, partial, &leases(), &mut out);
            (v, frame)
        };
        // Partial: forwarded as it is, flagged; the far end's completion makes it right.
        let mut p = ipv4_udp(DEV, REMOTE, 1, 2, b"offloaded");
        p[26..28].copy_from_slice(&[0x12, 0x34]);
        let (v, mut frame) = handle(eth(GW_MAC, DEV_MAC, &p), true);
        let Egress::Forward {
            packet,
            checksum_deferred: true,
            ..
        } = v
        else {
            panic!("{v:?}");
        };
        assert_eq!(
            frame[14 + 26..14 + 28],
            [0x12, 0x34],
            "left for the far end"
        );
        assert!(crate::complete_deferred_checksum(&mut frame[packet]));
        assert!(checksums_ok(&frame[14..]));
        // A partial SYN: clamped, deferred, and right once completed.
        let mut s = syn(1460);
        s[12..16].copy_from_slice(&DEV);
        ipv4::fill_header_checksum(&mut s, 20);
        let (v, mut frame) = handle(eth(GW_MAC, DEV_MAC, &s), true);
        assert!(
            matches!(
                v,
                Egress::Forward {
                    checksum_deferred: true,
                    ..
                }
            ),
            "{v:?}"
        );
        assert_eq!(u16::from_be_bytes([frame[14 + 44], frame[14 + 45]]), 1380);
        assert!(crate::complete_deferred_checksum(&mut frame[14..]));
        assert!(checksums_ok(&frame[14..]));
        // A whole checksum stays whole and is not flagged.
        let p = ipv4_udp(DEV, REMOTE, 1, 2, b"whole");
        let (v, frame) = handle(eth(GW_MAC, DEV_MAC, &p), false);
        assert!(matches!(
            v,
            Egress::Forward {
                checksum_deferred: false,
                ..
            }
        ));
        assert!(checksums_ok(&frame[14..]));
        // Too large for the tunnel without DF: fragmented here, so completed here.
        let mut big = ipv4_udp(DEV, REMOTE, 1, 2, &[7u8; 1500]);
        big[6] = 0; // no DF
        ipv4::fill_header_checksum(&mut big, 20);
        big[26..28].copy_from_slice(&[0x12, 0x34]);
        let (v, frame) = handle(eth(GW_MAC, DEV_MAC, &big), true);
        assert!(matches!(v, Egress::Fragment { .. }), "{v:?}");
        assert!(checksums_ok(&frame[14..]), "completed before fragmenting");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_frames_never_panic(mut frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600), extra in 0usize..3000) {
            // Aim some at us so they get past the MAC filter.
            if frame.len() >= 14 && extra % 2 == 0 {
                frame[..6].copy_from_slice(&GW_MAC);
                frame[12..14].copy_from_slice(&[0x08, if extra % 4 == 0 { 0x00 } else { 0x06 }]);
            }
            let mut out = vec![0u8; 2048];
            let wire = frame.len() + extra % 3;
            let _ = lan().handle_frame(&mut frame, wire, extra % 5 == 0, &leases(), &mut out);
        }
    }
}
