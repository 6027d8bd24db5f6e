//! IPv6 on the LAN (docs/protocol.md §7, *The LAN*): the gateway's own addresses answered by
//! Neighbour Discovery, Router Advertisements for the segment's /64, the guards (RA guard,
//! ND spoofing, claims of the gateway's addresses), and the devices' packets both ways.
//!
//! Who holds which address is the [`Neighbors`] table's: a device's address is learned from
//! the first MAC heard at it (a packet's source, its Duplicate Address Detection, its
//! unsolicited Neighbour Advertisement); a packet from an address another MAC holds is
//! dropped as spoofed. The gateway solicits nobody: a packet from the tunnel for an address
//! no device holds is dropped.

use std::net::Ipv6Addr;
use std::ops::Range;

use ipnet::{IpNet, Ipv6Net};

use crate::egress::{Egress, EgressDrop, ReplyKind};
use crate::ingress::{Ingress, IngressDrop};
use crate::{ETH_HEADER_LEN, ETHERTYPE_IPV6, Lan, Lan6, Neighbors, checksum, tcp, write_eth};

/// The fixed IPv6 header.
const HEADER_LEN: usize = 40;
/// IPv6 plus TCP headers without options: MSS = MTU - this.
const IPV6_TCP_HEADERS: u16 = 60;
/// The smallest MTU IPv6 allows (RFC 8200 §5).
const IPV6_MIN_MTU: u16 = 1280;

const NEXT_TCP: u8 = 6;
const NEXT_ICMPV6: u8 = 58;

const PACKET_TOO_BIG: u8 = 2;
const TIME_EXCEEDED: u8 = 3;
const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;
const ROUTER_SOLICIT: u8 = 133;
const ROUTER_ADVERT: u8 = 134;
const NEIGHBOR_SOLICIT: u8 = 135;
const NEIGHBOR_ADVERT: u8 = 136;
const REDIRECT: u8 = 137;

const OPT_SOURCE_LL: u8 = 1;
const OPT_TARGET_LL: u8 = 2;
const OPT_PREFIX: u8 = 3;
const OPT_MTU: u8 = 5;
/// Recursive DNS Server (RFC 8106).
const OPT_RDNSS: u8 = 25;
/// DNS Search List (RFC 8106).
const OPT_DNSSL: u8 = 31;
/// Router Advertisement flags: addresses by DHCPv6 (Managed), other configuration too.
const RA_MANAGED: u8 = 0x80;
const RA_OTHER: u8 = 0x40;

const NEXT_UDP: u8 = 17;
const DNS_PORT: u16 = 53;
/// The port DHCPv6 servers listen on (RFC 8415 §7.2).
const DHCP6_SERVER_PORT: u16 = 547;
/// All DHCPv6 relay agents and servers on the link (RFC 8415 §7.1).
const ALL_DHCP_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
const UDP_HEADER_LEN: usize = 8;
/// How long devices may use the gateway as DNS server, seconds: three times the RA interval
/// (RFC 8106 §5.1 asks for at least the interval).
const RDNSS_LIFETIME: u32 = 600;

/// Neighbour Advertisement flags.
const NA_ROUTER: u8 = 0x80;
const NA_SOLICITED: u8 = 0x40;
const NA_OVERRIDE: u8 = 0x20;

/// All nodes on the link (RFC 4291 §2.7.1).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// How long devices may take the gateway as their default router, seconds (an RA repeats
/// every 200 s).
const ROUTER_LIFETIME: u16 = 1800;
/// The prefix's valid and preferred lifetimes in RAs, seconds.
const VALID_LIFETIME: u32 = 86_400;
const PREFERRED_LIFETIME: u32 = 14_400;

/// The link-local address made from `mac` (modified EUI-64, RFC 4291 appendix A).
const fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    with_interface_id(0xfe80 << 112, mac)
}

/// The address in the /64 `prefix` whose interface ID is made from `mac` (the stable SLAAC
/// address of a device that does not use RFC 7217's).
pub fn eui64_address(prefix: Ipv6Net, mac: [u8; 6]) -> Ipv6Addr {
    with_interface_id(prefix.network().to_bits(), mac)
}

const fn with_interface_id(prefix: u128, mac: [u8; 6]) -> Ipv6Addr {
    let id = u64::from_be_bytes([
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]);
    Ipv6Addr::from_bits((prefix & !(u64::MAX as u128)) | id as u128)
}

/// The multicast MAC an IPv6 multicast address maps to (RFC 2464 §7).
const fn multicast_mac(ip: Ipv6Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// The fixed header of an IPv6 packet, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header6 {
    pub(crate) src: Ipv6Addr,
    pub(crate) dst: Ipv6Addr,
    /// The next header after the fixed one.
    pub(crate) next: u8,
    pub(crate) hop_limit: u8,
    /// The whole packet: header and payload.
    pub(crate) total_len: usize,
}

impl Header6 {
    /// The header at the start of `packet`; with `whole`, the buffer must hold the whole
    /// packet its payload length says (else only the header: a truncated capture). None: not
    /// version 6, or its lengths do not hold (a jumbogram's zero length among them).
    pub(crate) fn parse(packet: &[u8], whole: bool) -> Option<Self> {
        let fixed = packet.get(..HEADER_LEN)?;
        if fixed[0] >> 4 != 6 {
            return None;
        }
        let payload = usize::from(u16::from_be_bytes([fixed[4], fixed[5]]));
        let total_len = HEADER_LEN + payload;
        if whole && total_len > packet.len() {
            return None;
        }
        let addr = |at: usize| {
            let mut o = [0u8; 16];
            o.copy_from_slice(&fixed[at..at + 16]);
            Ipv6Addr::from(o)
        };
        Some(Self {
            src: addr(8),
            dst: addr(24),
            next: fixed[6],
            hop_limit: fixed[7],
            total_len,
        })
    }
}

/// The options of a Neighbour Discovery message, as far as the gateway reads them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct NdOptions {
    source_ll: Option<[u8; 6]>,
    target_ll: Option<[u8; 6]>,
}

impl NdOptions {
    /// Walks `opts`; None when an option's length is zero or runs past the end, or a
    /// link-layer address option is not an Ethernet one (RFC 4861 §4.6: the message is
    /// then dropped).
    fn parse(mut opts: &[u8]) -> Option<Self> {
        let mut found = Self::default();
        while !opts.is_empty() {
            let kind = *opts.first()?;
            let len = usize::from(*opts.get(1)?) * 8;
            if len == 0 {
                return None;
            }
            let opt = opts.get(..len)?;
            if kind == OPT_SOURCE_LL || kind == OPT_TARGET_LL {
                if len != 8 {
                    return None;
                }
                let mac = crate::mac_at(opt, 2);
                if kind == OPT_SOURCE_LL {
                    found.source_ll = Some(mac);
                } else {
                    found.target_ll = Some(mac);
                }
            }
            opts = &opts[len..];
        }
        Some(found)
    }
}

impl Lan {
    /// Whether `ip` is one of the gateway's IPv6 addresses on the LAN.
    fn is_gateway_address6(&self, v6: &Lan6, ip: Ipv6Addr) -> bool {
        ip == v6.address() || ip == link_local(self.mac)
    }

    /// Lowers the MSS of a TCP SYN in the IPv6 packet `ip` to fit `inner_mtu`, when
    /// `mss_clamp` asks it (a segment behind extension headers is left as it is).
    fn clamp_mss6(&self, ip: &mut [u8], h: &Header6) {
        if !self.mss_clamp {
            return;
        }
        let Some((NEXT_TCP, at)) = upper_layer(ip, h) else {
            return;
        };
        let (src, dst) = (h.src, h.dst);
        let max_mss = self.inner_mtu.saturating_sub(IPV6_TCP_HEADERS);
        tcp::clamp_segment(&mut ip[at..h.total_len], max_mss, |seg| {
            checksum::transport6(seg, src, dst, NEXT_TCP, 8)
        });
    }

    /// [`Lan::handle_frame`] for an IPv6 frame.
    #[expect(
        clippy::too_many_arguments,
        reason = "one frame's facts, passed down once"
    )]
    pub(crate) fn handle_ipv6(
        &self,
        frame: &mut [u8],
        src_mac: [u8; 6],
        multicast: bool,
        truncated: bool,
        checksum_partial: bool,
        neighbors: &impl Neighbors,
        out: &mut [u8],
    ) -> Egress {
        // An end without an IPv6 block has no IPv6 on its LAN (docs/protocol.md §7).
        let Some(v6) = &self.v6 else {
            return Egress::Drop(EgressDrop::NotIpv4);
        };
        let ip_start = ETH_HEADER_LEN;
        let Some(h) = Header6::parse(&frame[ip_start..], !truncated) else {
            return Egress::Drop(EgressDrop::Malformed);
        };
        let packet = ip_start..ip_start + h.total_len;
        if h.next == NEXT_ICMPV6 && !truncated {
            let icmp = &frame[ip_start + HEADER_LEN..packet.end];
            if let Some(&ty) = icmp.first()
                && (ROUTER_SOLICIT..=REDIRECT).contains(&ty)
            {
                return self.neighbour_discovery(v6, &h, icmp, src_mac, neighbors, out);
            }
        }
        if v6.dhcp
            && h.dst == ALL_DHCP_SERVERS
            && h.next == NEXT_UDP
            && h.src.is_unicast_link_local()
            && !truncated
        {
            return dhcp6_message(&h, &frame[packet], src_mac, checksum_partial);
        }
        if multicast || h.dst.is_multicast() {
            // MLD and the devices' own multicast: nothing for the gateway.
            return Egress::Drop(EgressDrop::NotForUs);
        }
        if !self.holds(v6, h.src, src_mac, neighbors) {
            return Egress::Drop(EgressDrop::Spoofed);
        }
        if self.is_gateway_address6(v6, h.dst) {
            let sums = (truncated, checksum_partial);
            return self.to_gateway6(&h, &frame[packet], src_mac, sums, out);
        }
        if !v6.overlay.contains(&h.dst) {
            return Egress::Drop(EgressDrop::NoRoute);
        }
        if v6.prefix.contains(&h.dst) {
            return Egress::Drop(EgressDrop::LocalDestination);
        }
        if h.hop_limit <= 1 {
            return self.icmp6_error(&h, &frame[ip_start..], src_mac, TIME_EXCEEDED, 0, out);
        }
        if h.total_len > usize::from(self.inner_mtu) {
            // IPv6 is never fragmented on the way: the sender learns the path's MTU.
            let mtu = u32::from(self.inner_mtu);
            return self.icmp6_error(&h, &frame[ip_start..], src_mac, PACKET_TOO_BIG, mtu, out);
        }
        if truncated {
            return Egress::Drop(EgressDrop::Truncated);
        }
        let ip = &mut frame[packet.clone()];
        ip[7] -= 1;
        // The sender's kernel left its checksum partial: computed afresh.
        if checksum_partial && let Some((next, at)) = upper_layer(ip, &h) {
            checksum::fill_transport6(&mut ip[at..h.total_len], h.src, h.dst, next);
        }
        self.clamp_mss6(ip, &h);
        Egress::Forward6 { packet, dst: h.dst }
    }

    /// Whether `mac` may send from `src`: an address of the segment's /64 it holds, or one
    /// nobody holds that the table lets it learn now.
    fn holds(&self, v6: &Lan6, src: Ipv6Addr, mac: [u8; 6], neighbors: &impl Neighbors) -> bool {
        if !v6.prefix.contains(&src) || self.is_gateway_address6(v6, src) {
            return false;
        }
        match neighbors.holder6(src) {
            Some(holder) => holder == mac,
            None => neighbors.heard6(src, mac),
        }
    }

    /// A packet for the gateway's own address: echo is answered, DNS queries go to the
    /// service (when it runs); nothing else is offered. `(truncated, checksum_partial)`: the
    /// capture's facts about the frame.
    fn to_gateway6(
        &self,
        h: &Header6,
        packet: &[u8],
        src_mac: [u8; 6],
        (truncated, checksum_partial): (bool, bool),
        out: &mut [u8],
    ) -> Egress {
        let icmp = packet.get(HEADER_LEN..).unwrap_or_default();
        if !truncated
            && h.next == NEXT_UDP
            && self
                .v6
                .as_ref()
                .is_some_and(|v| v.dns && h.dst == v.address())
        {
            return dns_query(h, packet, src_mac, checksum_partial);
        }
        if truncated || h.next != NEXT_ICMPV6 || icmp.first() != Some(&ECHO_REQUEST) {
            return Egress::Drop(EgressDrop::GatewayService);
        }
        if !checksum::valid6(icmp, h.src, h.dst, NEXT_ICMPV6) {
            return Egress::Drop(EgressDrop::Malformed);
        }
        let reply = self.icmp6_frame(src_mac, h.dst, h.src, 64, icmp.len(), out, |body| {
            body.copy_from_slice(icmp);
            body[0] = ECHO_REPLY;
        });
        reply_or_drop(reply, ReplyKind::EchoReply)
    }

    /// An ICMPv6 error about `packet` to its sender: from the gateway's address, quoting as
    /// much of the packet as fits in the minimum MTU (RFC 4443 §2.4). None of an error is
    /// sent about an ICMPv6 error.
    fn icmp6_error(
        &self,
        h: &Header6,
        packet: &[u8],
        src_mac: [u8; 6],
        ty: u8,
        value: u32,
        out: &mut [u8],
    ) -> Egress {
        let Some(v6) = &self.v6 else {
            return Egress::Drop(EgressDrop::NoReply);
        };
        if h.next == NEXT_ICMPV6 && packet.get(HEADER_LEN).is_none_or(|t| *t < ECHO_REQUEST) {
            return Egress::Drop(EgressDrop::NoReply);
        }
        let room = usize::from(IPV6_MIN_MTU) - HEADER_LEN - 8;
        let quote = &packet[..packet.len().min(h.total_len).min(room)];
        let reply = self.icmp6_frame(
            src_mac,
            v6.address(),
            h.src,
            64,
            8 + quote.len(),
            out,
            |body| {
                body[0] = ty;
                body[4..8].copy_from_slice(&value.to_be_bytes());
                body[8..].copy_from_slice(quote);
            },
        );
        let kind = if ty == PACKET_TOO_BIG {
            ReplyKind::PacketTooBig
        } else {
            ReplyKind::TimeExceeded
        };
        reply_or_drop(reply, kind)
    }

    /// Router Solicitation, Router and Neighbour Advertisement, Neighbour Solicitation and
    /// Redirect from a device.
    fn neighbour_discovery(
        &self,
        v6: &Lan6,
        h: &Header6,
        icmp: &[u8],
        src_mac: [u8; 6],
        neighbors: &impl Neighbors,
        out: &mut [u8],
    ) -> Egress {
        let ty = icmp[0];
        // Only a device on the link can send ND (RFC 4861 §6.1, §7.1), and a message that
        // does not add up is dropped before it is believed.
        if h.hop_limit != 255
            || icmp.get(1) != Some(&0)
            || !checksum::valid6(icmp, h.src, h.dst, NEXT_ICMPV6)
        {
            return Egress::Drop(EgressDrop::Malformed);
        }
        if ty == ROUTER_ADVERT || ty == REDIRECT {
            // RA guard (RFC 6105): only the gateway routes here.
            return Egress::Drop(EgressDrop::RouterGuard);
        }
        let fixed = if ty == ROUTER_SOLICIT { 8 } else { 24 };
        let Some(opts) = icmp.get(fixed..).and_then(NdOptions::parse) else {
            return Egress::Drop(EgressDrop::Malformed);
        };
        // A link-layer address that is not the frame's own would point the neighbours'
        // caches elsewhere.
        if opts.source_ll.is_some_and(|m| m != src_mac)
            || opts.target_ll.is_some_and(|m| m != src_mac)
        {
            return Egress::Drop(EgressDrop::NeighbourSpoofed);
        }
        let unspecified = h.src.is_unspecified();
        if unspecified && opts.source_ll.is_some() {
            return Egress::Drop(EgressDrop::Malformed);
        }
        // From an address of the /64, only its holder (or one who may learn it).
        if !unspecified
            && !h.src.is_unicast_link_local()
            && !self.holds(v6, h.src, src_mac, neighbors)
        {
            return Egress::Drop(EgressDrop::NeighbourSpoofed);
        }
        if ty == ROUTER_SOLICIT {
            // To every node (RFC 4861 §6.2.6): one answer serves all who asked meanwhile,
            // which the caller's rate (one a segment every 3 s) then allows.
            let reply = self.router_advert(out);
            return reply_or_drop(reply, ReplyKind::RouterAdvert);
        }
        let mut t = [0u8; 16];
        t.copy_from_slice(&icmp[8..24]);
        let target = Ipv6Addr::from(t);
        if target.is_multicast() {
            return Egress::Drop(EgressDrop::Malformed);
        }
        let ours = self.is_gateway_address6(v6, target);
        match ty {
            NEIGHBOR_SOLICIT if ours && !unspecified => {
                let reply = self.neighbour_advert(
                    src_mac,
                    h.src,
                    target,
                    NA_ROUTER | NA_SOLICITED | NA_OVERRIDE,
                    out,
                );
                reply_or_drop(reply, ReplyKind::NeighbourAdvert)
            }
            // A device's Duplicate Address Detection of a gateway address, or its
            // advertisement of one: the gateway defends it to every node at once.
            NEIGHBOR_SOLICIT | NEIGHBOR_ADVERT if ours => {
                let reply = self.neighbour_advert(
                    multicast_mac(ALL_NODES),
                    ALL_NODES,
                    target,
                    NA_ROUTER | NA_OVERRIDE,
                    out,
                );
                reply_or_drop(reply, ReplyKind::NeighbourClaim)
            }
            // Its own DAD or advertisement of an address of the /64: the first MAC heard at
            // an address holds it; another MAC's claim is refused and counted.
            NEIGHBOR_SOLICIT if unspecified && v6.prefix.contains(&target) => {
                match neighbors.holder6(target) {
                    Some(holder) if holder != src_mac => Egress::Drop(EgressDrop::NeighbourIgnored),
                    _ => {
                        neighbors.heard6(target, src_mac);
                        Egress::Drop(EgressDrop::NeighbourIgnored)
                    }
                }
            }
            NEIGHBOR_ADVERT if v6.prefix.contains(&target) => {
                if self.holds(v6, target, src_mac, neighbors) {
                    Egress::Drop(EgressDrop::NeighbourIgnored)
                } else {
                    Egress::Drop(EgressDrop::NeighbourSpoofed)
                }
            }
            // Devices resolve each other directly.
            _ => Egress::Drop(EgressDrop::NeighbourIgnored),
        }
    }

    /// Writes into `out` the gateway's Router Advertisement for the segment, to every node
    /// (answering a solicitation too, RFC 4861 §6.2.6): the /64 on-link and for SLAAC, the
    /// inner MTU, the gateway's MAC, the gateway as DNS server with the search list when the
    /// service runs, and M and O when the DHCPv6 server does.
    /// Returns its length; None without IPv6 or when `out` is short.
    pub fn router_advert(&self, out: &mut [u8]) -> Option<usize> {
        let v6 = self.v6.as_ref()?;
        let prefix = v6.prefix;
        let mac = self.mac;
        let mtu = u32::from(self.inner_mtu);
        let rdnss = if v6.dns { 24 } else { 0 };
        // Type, length, reserved, lifetime, the names padded to 8 bytes.
        let dnssl = if v6.dns && !v6.search.is_empty() {
            (8 + v6.search.len()).div_ceil(8) * 8
        } else {
            0
        };
        self.icmp6_frame(
            multicast_mac(ALL_NODES),
            link_local(mac),
            ALL_NODES,
            255,
            16 + 8 + 8 + 32 + rdnss + dnssl,
            out,
            |b| {
                b[0] = ROUTER_ADVERT;
                b[4] = 64; // the hop limit devices use
                if v6.dhcp {
                    b[5] = RA_MANAGED | RA_OTHER;
                }
                b[6..8].copy_from_slice(&ROUTER_LIFETIME.to_be_bytes());
                let o = &mut b[16..];
                o[0] = OPT_SOURCE_LL;
                o[1] = 1;
                o[2..8].copy_from_slice(&mac);
                o[8] = OPT_MTU;
                o[9] = 1;
                o[12..16].copy_from_slice(&mtu.to_be_bytes());
                let p = &mut o[16..];
                p[0] = OPT_PREFIX;
                p[1] = 4;
                p[2] = prefix.prefix_len();
                p[3] = 0xc0; // on-link, autonomous
                p[4..8].copy_from_slice(&VALID_LIFETIME.to_be_bytes());
                p[8..12].copy_from_slice(&PREFERRED_LIFETIME.to_be_bytes());
                p[16..32].copy_from_slice(&prefix.network().octets());
                if v6.dns {
                    let r = &mut p[32..];
                    r[0] = OPT_RDNSS;
                    r[1] = 3;
                    r[4..8].copy_from_slice(&RDNSS_LIFETIME.to_be_bytes());
                    r[8..24].copy_from_slice(&v6.address().octets());
                }
                if dnssl > 0 {
                    let d = &mut p[32 + rdnss..];
                    d[0] = OPT_DNSSL;
                    d[1] = u8::try_from(dnssl / 8).unwrap_or(0);
                    d[4..8].copy_from_slice(&RDNSS_LIFETIME.to_be_bytes());
                    d[8..8 + v6.search.len()].copy_from_slice(&v6.search);
                }
            },
        )
    }

    /// Writes into `out` an Ethernet frame with a UDP datagram from the gateway's IPv6
    /// address (its link-local one to a link-local address, RFC 6724's scope rule) to
    /// `dst_ip:dst_port` at `dst_mac` (its checksum computed). Returns its length; None
    /// without IPv6, or when it does not fit.
    pub fn udp6_frame(
        &self,
        dst_mac: [u8; 6],
        dst_ip: Ipv6Addr,
        src_port: u16,
        dst_port: u16,
        payload: &[u8],
        out: &mut [u8],
    ) -> Option<usize> {
        let v6 = self.v6.as_ref()?;
        let src = if dst_ip.is_unicast_link_local() {
            link_local(self.mac)
        } else {
            v6.address()
        };
        let len = UDP_HEADER_LEN + payload.len();
        let total = ETH_HEADER_LEN + HEADER_LEN + len;
        let frame = out.get_mut(..total)?;
        write_eth(frame, dst_mac, self.mac, ETHERTYPE_IPV6);
        let ip = &mut frame[ETH_HEADER_LEN..];
        write_header6(ip, len, NEXT_UDP, 64, src, dst_ip)?;
        let udp = &mut ip[HEADER_LEN..];
        udp[0..2].copy_from_slice(&src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&u16::try_from(len).ok()?.to_be_bytes());
        udp[6..8].fill(0);
        udp[UDP_HEADER_LEN..].copy_from_slice(payload);
        checksum::fill_transport6(udp, src, dst_ip, NEXT_UDP);
        Some(total)
    }

    /// Writes the gateway's Neighbour Advertisement of `target` (one of its addresses) with
    /// `flags`, its MAC as target link-layer address.
    fn neighbour_advert(
        &self,
        dst_mac: [u8; 6],
        dst: Ipv6Addr,
        target: Ipv6Addr,
        flags: u8,
        out: &mut [u8],
    ) -> Option<usize> {
        let mac = self.mac;
        self.icmp6_frame(dst_mac, target, dst, 255, 32, out, |b| {
            b[0] = NEIGHBOR_ADVERT;
            b[4] = flags;
            b[8..24].copy_from_slice(&target.octets());
            b[24] = OPT_TARGET_LL;
            b[25] = 1;
            b[26..32].copy_from_slice(&mac);
        })
    }

    /// Writes into `out` an Ethernet frame with an IPv6 packet holding an ICMPv6 message of
    /// `len` bytes that `fill` writes (onto zeros); the checksum is filled in after.
    #[expect(
        clippy::too_many_arguments,
        reason = "a frame's addresses, each of its own kind"
    )]
    fn icmp6_frame(
        &self,
        dst_mac: [u8; 6],
        src: Ipv6Addr,
        dst: Ipv6Addr,
        hop_limit: u8,
        len: usize,
        out: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<usize> {
        let total = ETH_HEADER_LEN + HEADER_LEN + len;
        let frame = out.get_mut(..total)?;
        frame.fill(0);
        write_eth(frame, dst_mac, self.mac, ETHERTYPE_IPV6);
        let ip = &mut frame[ETH_HEADER_LEN..];
        write_header6(ip, len, NEXT_ICMPV6, hop_limit, src, dst)?;
        let body = &mut ip[HEADER_LEN..];
        fill(body);
        let sum = checksum::transport6(body, src, dst, NEXT_ICMPV6, 1);
        body[2..4].copy_from_slice(&sum.to_be_bytes());
        Some(total)
    }

    /// [`Lan::deliver`] for an IPv6 packet from a peer.
    pub(crate) fn deliver6(
        &self,
        buf: &mut [u8],
        packet: Range<usize>,
        peer_blocks: &[IpNet],
        neighbors: &impl Neighbors,
    ) -> Ingress {
        let Some(v6) = &self.v6 else {
            return Ingress::Drop(IngressDrop::NotIpv4);
        };
        let Some(ip) = buf.get_mut(packet.clone()) else {
            return Ingress::Drop(IngressDrop::Malformed);
        };
        let Some(h) = Header6::parse(ip, true) else {
            return Ingress::Drop(IngressDrop::Malformed);
        };
        if !peer_blocks
            .iter()
            .any(|b| b.contains(&std::net::IpAddr::V6(h.src)))
        {
            return Ingress::Drop(IngressDrop::SourceNotCertified);
        }
        if !v6.prefix.contains(&h.dst) || self.is_gateway_address6(v6, h.dst) {
            return Ingress::Drop(IngressDrop::NotOurLan);
        }
        if h.hop_limit <= 1 {
            return Ingress::Drop(IngressDrop::TtlExpired);
        }
        ip[7] -= 1;
        self.clamp_mss6(ip, &h);
        let Some(mac) = neighbors.holder6(h.dst) else {
            return Ingress::Drop(IngressDrop::NoHolder);
        };
        let Some(start) = packet.start.checked_sub(ETH_HEADER_LEN) else {
            return Ingress::Drop(IngressDrop::NoHeadroom);
        };
        write_eth(&mut buf[start..], mac, self.mac, ETHERTYPE_IPV6);
        Ingress::Deliver {
            frame: start..packet.start + h.total_len,
        }
    }
}

/// A UDP datagram to the gateway's address: a DNS query to port 53 with a right checksum
/// (or one the sender's kernel left partial, as a local sender's often is: nothing to
/// check) goes to the DNS service; anything else is no service of the gateway.
fn dns_query(h: &Header6, packet: &[u8], src_mac: [u8; 6], partial: bool) -> Egress {
    match udp_to(h, packet, DNS_PORT, partial) {
        Ok((client_port, udp_payload)) => Egress::Dns6 {
            client_mac: src_mac,
            client_ip: h.src,
            client_port,
            udp_payload,
        },
        Err(why) => Egress::Drop(why),
    }
}

/// A UDP datagram to the DHCPv6 servers: one to port 547 with a right checksum (or a
/// partial one, as for DNS) goes to the server; anything else is malformed.
fn dhcp6_message(h: &Header6, packet: &[u8], src_mac: [u8; 6], partial: bool) -> Egress {
    let Ok((client_port, udp_payload)) = udp_to(h, packet, DHCP6_SERVER_PORT, partial) else {
        return Egress::Drop(EgressDrop::Malformed);
    };
    Egress::Dhcp6 {
        client_mac: src_mac,
        client_ip: h.src,
        client_port,
        udp_payload,
    }
}

/// The source port and payload (within the frame) of the UDP datagram in `packet` to
/// `port`, when its lengths and checksum (unless `partial`) hold. Else why not: its lengths
/// or checksum are wrong (`Malformed`), or it is for another port (`GatewayService`).
fn udp_to(
    h: &Header6,
    packet: &[u8],
    port: u16,
    partial: bool,
) -> Result<(u16, Range<usize>), EgressDrop> {
    let udp = packet
        .get(HEADER_LEN..h.total_len)
        .ok_or(EgressDrop::Malformed)?;
    let udp_len = udp
        .get(4..6)
        .map_or(0, |l| usize::from(u16::from_be_bytes([l[0], l[1]])));
    if udp.len() < UDP_HEADER_LEN || udp_len != udp.len() {
        return Err(EgressDrop::Malformed);
    }
    if u16::from_be_bytes([udp[2], udp[3]]) != port {
        return Err(EgressDrop::GatewayService);
    }
    if !partial && !checksum::valid6(udp, h.src, h.dst, NEXT_UDP) {
        return Err(EgressDrop::Malformed);
    }
    let start = ETH_HEADER_LEN + HEADER_LEN + UDP_HEADER_LEN;
    Ok((
        u16::from_be_bytes([udp[0], udp[1]]),
        start..ETH_HEADER_LEN + h.total_len,
    ))
}

/// Writes the fixed IPv6 header of a packet with `payload_len` bytes after it at the start
/// of `ip` (traffic class and flow label zero); None when the length does not fit the field.
fn write_header6(
    ip: &mut [u8],
    payload_len: usize,
    next: u8,
    hop_limit: u8,
    src: Ipv6Addr,
    dst: Ipv6Addr,
) -> Option<()> {
    ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&u16::try_from(payload_len).ok()?.to_be_bytes());
    ip[6] = next;
    ip[7] = hop_limit;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    Some(())
}

/// A reply written, or the drop for one that did not fit.
fn reply_or_drop(len: Option<usize>, kind: ReplyKind) -> Egress {
    match len {
        Some(len) => Egress::Reply { len, kind },
        None => Egress::Drop(EgressDrop::NoReply),
    }
}

/// The upper-layer protocol right after the fixed header, and where it starts, when it is
/// TCP or UDP (the ones with a checksum to complete or an MSS to clamp); None behind
/// extension headers, which the gateway leaves as they are.
fn upper_layer(ip: &[u8], h: &Header6) -> Option<(u8, usize)> {
    let end = h.total_len.min(ip.len());
    match h.next {
        NEXT_TCP if end >= HEADER_LEN + 20 => Some((NEXT_TCP, HEADER_LEN)),
        checksum::PROTO_UDP if end >= HEADER_LEN + 8 => Some((checksum::PROTO_UDP, HEADER_LEN)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

    use std::cell::RefCell;
    use std::collections::HashMap;

    use pnet_packet::Packet as _;
    use pnet_packet::icmpv6::ndp::{NdpOptionTypes, NeighborAdvertPacket, RouterAdvertPacket};
    use pnet_packet::icmpv6::{Icmpv6Packet, Icmpv6Types};
    use pnet_packet::ip::IpNextHeaderProtocols;
    use pnet_packet::ipv6::Ipv6Packet;

    use super::*;
    use crate::testutil::{DEV_MAC, GW_MAC, lan};

    const OTHER_MAC: [u8; 6] = [0x02, 0xbb, 0, 0, 0, 11];

    fn lan6() -> Lan {
        Lan {
            v6: Some(Lan6 {
                prefix: "fd7a:0:1:100::/64".parse().unwrap(),
                overlay: "fd7a:0:1::/48".parse().unwrap(),
                dns: true,
                dhcp: false,
                search: Lan6::search_list("site-a.example.").unwrap(),
            }),
            ..lan()
        }
    }

    fn addr(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    const DEV: &str = "fd7a:0:1:100::10";
    const GW: &str = "fd7a:0:1:100::1";
    const FAR: &str = "fd7a:0:1:200::7";

    /// The table of the tests: learns every address heard that nobody holds.
    #[derive(Default)]
    struct Table(RefCell<HashMap<Ipv6Addr, [u8; 6]>>);

    impl Table {
        fn with(ip: &str, mac: [u8; 6]) -> Self {
            let t = Self::default();
            t.0.borrow_mut().insert(addr(ip), mac);
            t
        }
    }

    impl Neighbors for Table {
        fn leased_mac(&self, _: std::net::Ipv4Addr) -> Option<[u8; 6]> {
            None
        }
        fn holder6(&self, ip: Ipv6Addr) -> Option<[u8; 6]> {
            self.0.borrow().get(&ip).copied()
        }
        fn heard6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> bool {
            *self.0.borrow_mut().entry(ip).or_insert(mac) == mac
        }
    }

    /// An IPv6 packet, by hand (the checksum by pnet's own code, not ours).
    fn packet(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hop: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        p[6] = next;
        p[7] = hop;
        p[8..24].copy_from_slice(&src.octets());
        p[24..40].copy_from_slice(&dst.octets());
        p.extend_from_slice(payload);
        p
    }

    fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, ty: u8, rest: &[u8]) -> Vec<u8> {
        let mut m = vec![ty, 0, 0, 0];
        m.extend_from_slice(rest);
        let sum =
            pnet_packet::util::ipv6_checksum(&m, 1, &[], &src, &dst, IpNextHeaderProtocols::Icmpv6);
        m[2..4].copy_from_slice(&sum.to_be_bytes());
        packet(src, dst, NEXT_ICMPV6, hop, &m)
    }

    fn frame(dst_mac: [u8; 6], src_mac: [u8; 6], ip: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f.extend_from_slice(ip);
        f
    }

    fn solicited_node(target: Ipv6Addr) -> Ipv6Addr {
        let o = target.octets();
        Ipv6Addr::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | u16::from(o[13]),
            u16::from_be_bytes([o[14], o[15]]),
        )
    }

    /// A Neighbour Solicitation (or, `ty`, Advertisement) of `target`, with a link-layer
    /// address option of `ll` (source for a solicitation, target for an advertisement).
    fn nd(ty: u8, src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr, ll: Option<[u8; 6]>) -> Vec<u8> {
        let mut rest = vec![0u8; 4];
        rest.extend_from_slice(&target.octets());
        if let Some(mac) = ll {
            let kind = if ty == NEIGHBOR_SOLICIT { 1 } else { 2 };
            rest.extend_from_slice(&[kind, 1]);
            rest.extend_from_slice(&mac);
        }
        icmp6(src, dst, 255, ty, &rest)
    }

    fn run(lan: &Lan, f: &mut [u8], t: &Table, out: &mut [u8]) -> Egress {
        let len = f.len();
        lan.handle_frame(f, len, false, t, out)
    }

    /// The verdict on the frame of `ip` from `src_mac` to `dst_mac`.
    fn judge(lan: &Lan, t: &Table, dst_mac: [u8; 6], src_mac: [u8; 6], ip: &[u8]) -> Egress {
        let mut f = frame(dst_mac, src_mac, ip);
        run(lan, &mut f, t, &mut [0u8; 1500])
    }

    /// The reply frame's IPv6 packet, its ICMPv6 checksum checked by pnet.
    fn reply_packet(out: &[u8], len: usize) -> Ipv6Packet<'_> {
        assert_eq!(&out[12..14], &ETHERTYPE_IPV6.to_be_bytes());
        let p = Ipv6Packet::new(&out[14..len]).unwrap();
        let icmp = Icmpv6Packet::new(p.payload()).unwrap();
        let want = pnet_packet::icmpv6::checksum(&icmp, &p.get_source(), &p.get_destination());
        assert_eq!(icmp.get_checksum(), want, "ICMPv6 checksum");
        p
    }

    fn udp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut udp = vec![0u8; 8];
        udp[0..2].copy_from_slice(&sport.to_be_bytes());
        udp[2..4].copy_from_slice(&dport.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        udp.extend_from_slice(payload);
        checksum::fill_transport6(&mut udp, src, dst, NEXT_UDP);
        packet(src, dst, NEXT_UDP, 1, &udp)
    }

    #[test]
    fn dhcpv6_from_a_link_local_address_goes_to_the_server_when_it_runs() {
        let on = Lan {
            v6: lan6().v6.map(|v| Lan6 { dhcp: true, ..v }),
            ..lan6()
        };
        let t = Table::default();
        let dst_mac = [0x33, 0x33, 0, 1, 0, 2];
        let ll = link_local(DEV_MAC);
        let solicit = udp6(ll, ALL_DHCP_SERVERS, 546, 547, b"\x01abc");
        let Egress::Dhcp6 {
            client_mac,
            client_ip,
            client_port,
            udp_payload,
        } = judge(&on, &t, dst_mac, DEV_MAC, &solicit)
        else {
            panic!("not for the server")
        };
        assert_eq!((client_mac, client_ip, client_port), (DEV_MAC, ll, 546));
        assert_eq!(udp_payload, 62..66);
        // Without the server, from a global address, to another port, with a bad checksum:
        // not for the server.
        assert_eq!(
            judge(&lan6(), &t, dst_mac, DEV_MAC, &solicit),
            Egress::Drop(EgressDrop::NotForUs)
        );
        let global = udp6(addr("fd7a:0:1:100::9"), ALL_DHCP_SERVERS, 546, 547, b"x");
        assert_eq!(
            judge(&on, &t, dst_mac, DEV_MAC, &global),
            Egress::Drop(EgressDrop::NotForUs)
        );
        let port = udp6(ll, ALL_DHCP_SERVERS, 546, 548, b"x");
        assert_eq!(
            judge(&on, &t, dst_mac, DEV_MAC, &port),
            Egress::Drop(EgressDrop::Malformed)
        );
        let mut bad = solicit.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(
            judge(&on, &t, dst_mac, DEV_MAC, &bad),
            Egress::Drop(EgressDrop::Malformed)
        );
        // The reply goes from the gateway's link-local address.
        let mut out = [0u8; 200];
        let len = on
            .udp6_frame(DEV_MAC, ll, 547, 546, b"reply", &mut out)
            .unwrap();
        let p = Ipv6Packet::new(&out[14..len]).unwrap();
        assert_eq!(
            (p.get_source(), p.get_destination()),
            (link_local(GW_MAC), ll)
        );
    }

    #[test]
    fn a_router_solicitation_gets_the_segments_advertisement() {
        let lan = lan6();
        let t = Table::default();
        let rs = icmp6(
            link_local(DEV_MAC),
            addr("ff02::2"),
            255,
            ROUTER_SOLICIT,
            &[0, 0, 0, 0, 1, 1, 2, 0xbb, 0, 0, 0, 10],
        );
        let mut f = frame([0x33, 0x33, 0, 0, 0, 2], DEV_MAC, &rs);
        let mut out = [0u8; 1500];
        let Egress::Reply { len, kind } = run(&lan, &mut f, &t, &mut out) else {
            panic!("no advertisement")
        };
        assert_eq!(kind, ReplyKind::RouterAdvert);
        assert_eq!(&out[..6], &[0x33, 0x33, 0, 0, 0, 1], "to every node");
        let p = reply_packet(&out, len);
        assert_eq!(p.get_source(), link_local(GW_MAC));
        assert_eq!(p.get_destination(), ALL_NODES);
        assert_eq!(p.get_hop_limit(), 255);
        let ra = RouterAdvertPacket::new(p.payload()).unwrap();
        assert_eq!(ra.get_lifetime(), ROUTER_LIFETIME);
        let opts = ra.get_options();
        let mtu = opts
            .iter()
            .find(|o| o.option_type == NdpOptionTypes::MTU)
            .unwrap();
        assert_eq!(&mtu.data[2..6], &1420u32.to_be_bytes());
        let ll = opts
            .iter()
            .find(|o| o.option_type == NdpOptionTypes::SourceLLAddr)
            .unwrap();
        assert_eq!(&ll.data[..6], &GW_MAC);
        let prefix = opts
            .iter()
            .find(|o| o.option_type == NdpOptionTypes::PrefixInformation)
            .unwrap();
        assert_eq!(prefix.data[0], 64);
        assert_eq!(prefix.data[1], 0xc0, "on-link and autonomous");
        assert_eq!(&prefix.data[14..30], &addr("fd7a:0:1:100::").octets());
        let rdnss = opts.iter().find(|o| o.option_type.0 == OPT_RDNSS).unwrap();
        assert_eq!(&rdnss.data[2..6], &RDNSS_LIFETIME.to_be_bytes());
        assert_eq!(
            &rdnss.data[6..22],
            &addr(GW).octets(),
            "the gateway as DNS server"
        );
        let dnssl = opts.iter().find(|o| o.option_type.0 == OPT_DNSSL).unwrap();
        assert_eq!(&dnssl.data[2..6], &RDNSS_LIFETIME.to_be_bytes());
        assert_eq!(&dnssl.data[6..], b"\x06site-a\x07example\x00");
        assert_eq!(ra.get_flags(), 0, "no DHCPv6: neither M nor O");
        let managed = Lan {
            v6: lan.v6.clone().map(|v| Lan6 {
                dhcp: true,
                search: Lan6::search_list("a.example").unwrap(),
                ..v
            }),
            ..lan.clone()
        };
        let len = managed.router_advert(&mut out).unwrap();
        let p = reply_packet(&out, len);
        let ra = RouterAdvertPacket::new(p.payload()).unwrap();
        assert_eq!(ra.get_flags(), RA_MANAGED | RA_OTHER);
        let dnssl = ra
            .get_options()
            .into_iter()
            .find(|o| o.option_type.0 == OPT_DNSSL);
        let padded = b"\x01a\x07example\x00\x00\x00\x00\x00\x00";
        assert_eq!(&dnssl.unwrap().data[6..], padded, "padded to 8 bytes");
        // Without the DNS service, no RDNSS.
        let quiet = Lan {
            v6: lan.v6.clone().map(|v| Lan6 { dns: false, ..v }),
            ..lan.clone()
        };
        let len = quiet.router_advert(&mut out).unwrap();
        let p = reply_packet(&out, len);
        let ra = RouterAdvertPacket::new(p.payload()).unwrap();
        assert!(
            ra.get_options()
                .iter()
                .all(|o| o.option_type.0 != OPT_RDNSS && o.option_type.0 != OPT_DNSSL)
        );
        // From the unspecified address, which may not carry a link-layer address.
        let rs = icmp6(
            Ipv6Addr::UNSPECIFIED,
            addr("ff02::2"),
            255,
            ROUTER_SOLICIT,
            &[0; 4],
        );
        let mut f = frame([0x33, 0x33, 0, 0, 0, 2], DEV_MAC, &rs);
        assert!(matches!(
            run(&lan, &mut f, &t, &mut out),
            Egress::Reply { .. }
        ));
        let rs = icmp6(
            Ipv6Addr::UNSPECIFIED,
            addr("ff02::2"),
            255,
            ROUTER_SOLICIT,
            &[0, 0, 0, 0, 1, 1, 2, 0xbb, 0, 0, 0, 10],
        );
        assert_eq!(
            judge(&lan, &t, [0x33, 0x33, 0, 0, 0, 2], DEV_MAC, &rs),
            Egress::Drop(EgressDrop::Malformed)
        );
    }

    #[test]
    fn the_gateways_addresses_are_answered_and_defended() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let mut out = [0u8; 1500];
        for target in [addr(GW), link_local(GW_MAC)] {
            let ns = nd(
                NEIGHBOR_SOLICIT,
                addr(DEV),
                solicited_node(target),
                target,
                Some(DEV_MAC),
            );
            let mut f = frame([0x33, 0x33, 0xff, 0, 0, 1], DEV_MAC, &ns);
            let Egress::Reply { len, kind } = run(&lan, &mut f, &t, &mut out) else {
                panic!("{target}: no advertisement")
            };
            assert_eq!(kind, ReplyKind::NeighbourAdvert);
            let p = reply_packet(&out, len);
            assert_eq!((p.get_source(), p.get_destination()), (target, addr(DEV)));
            let na = NeighborAdvertPacket::new(p.payload()).unwrap();
            assert_eq!(na.get_target_addr(), target);
            assert_eq!(na.get_flags(), NA_ROUTER | NA_SOLICITED | NA_OVERRIDE);
            assert_eq!(&na.get_options()[0].data[..6], &GW_MAC);
        }
        // A device claiming the gateway's address, or probing it: every node is told.
        for (ty, src) in [
            (NEIGHBOR_ADVERT, addr(DEV)),
            (NEIGHBOR_SOLICIT, Ipv6Addr::UNSPECIFIED),
        ] {
            let ll = (ty == NEIGHBOR_ADVERT).then_some(DEV_MAC);
            let claim = nd(ty, src, ALL_NODES, addr(GW), ll);
            let mut f = frame([0x33, 0x33, 0, 0, 0, 1], DEV_MAC, &claim);
            let Egress::Reply { len, kind } = run(&lan, &mut f, &t, &mut out) else {
                panic!("not defended")
            };
            assert_eq!(kind, ReplyKind::NeighbourClaim);
            assert_eq!(reply_packet(&out, len).get_destination(), ALL_NODES);
        }
    }

    #[test]
    fn router_advertisements_redirects_and_lying_link_addresses_are_dropped() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let ra = icmp6(
            link_local(DEV_MAC),
            ALL_NODES,
            255,
            ROUTER_ADVERT,
            &[64, 0, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        assert_eq!(
            judge(&lan, &t, [0x33, 0x33, 0, 0, 0, 1], DEV_MAC, &ra),
            Egress::Drop(EgressDrop::RouterGuard)
        );
        let redirect = icmp6(link_local(DEV_MAC), addr(DEV), 255, REDIRECT, &[0; 36]);
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &redirect),
            Egress::Drop(EgressDrop::RouterGuard)
        );
        // A solicitation whose source link-layer address is another MAC's.
        let ns = nd(
            NEIGHBOR_SOLICIT,
            addr(DEV),
            solicited_node(addr(GW)),
            addr(GW),
            Some(OTHER_MAC),
        );
        assert_eq!(
            judge(&lan, &t, [0x33, 0x33, 0xff, 0, 0, 1], DEV_MAC, &ns),
            Egress::Drop(EgressDrop::NeighbourSpoofed)
        );
        // Another MAC advertising the device's address.
        let na = nd(
            NEIGHBOR_ADVERT,
            addr(DEV),
            ALL_NODES,
            addr(DEV),
            Some(OTHER_MAC),
        );
        assert_eq!(
            judge(&lan, &t, [0x33, 0x33, 0, 0, 0, 1], OTHER_MAC, &na),
            Egress::Drop(EgressDrop::NeighbourSpoofed)
        );
        assert_eq!(t.holder6(addr(DEV)), Some(DEV_MAC));
        // Not from the link (hop limit below 255), or a wrong checksum: not believed.
        let mut ns = nd(
            NEIGHBOR_SOLICIT,
            addr(DEV),
            addr(GW),
            addr(GW),
            Some(DEV_MAC),
        );
        ns[7] = 254;
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &ns),
            Egress::Drop(EgressDrop::Malformed)
        );
        let mut ns = nd(
            NEIGHBOR_SOLICIT,
            addr(DEV),
            addr(GW),
            addr(GW),
            Some(DEV_MAC),
        );
        ns[42] ^= 1;
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &ns),
            Egress::Drop(EgressDrop::Malformed)
        );
        // An option of length zero.
        let mut rest = vec![0u8; 4];
        rest.extend_from_slice(&addr(GW).octets());
        rest.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        let ns = icmp6(addr(DEV), addr(GW), 255, NEIGHBOR_SOLICIT, &rest);
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &ns),
            Egress::Drop(EgressDrop::Malformed)
        );
    }

    fn udp(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, len: usize) -> Vec<u8> {
        let mut u = vec![0u8; 8 + len];
        u[..2].copy_from_slice(&4000u16.to_be_bytes());
        u[2..4].copy_from_slice(&7u16.to_be_bytes());
        u[4..6].copy_from_slice(&((8 + len) as u16).to_be_bytes());
        let sum =
            pnet_packet::util::ipv6_checksum(&u, 3, &[], &src, &dst, IpNextHeaderProtocols::Udp);
        u[6..8].copy_from_slice(&sum.to_be_bytes());
        packet(src, dst, 17, hop, &u)
    }

    #[test]
    fn the_first_mac_heard_at_an_address_holds_it() {
        let lan = lan6();
        let t = Table::default();
        let mut out = [0u8; 1500];
        let new = addr("fd7a:0:1:100::abcd");
        // Its duplicate address detection teaches the table.
        let dad = nd(
            NEIGHBOR_SOLICIT,
            Ipv6Addr::UNSPECIFIED,
            solicited_node(new),
            new,
            None,
        );
        assert_eq!(
            judge(&lan, &t, [0x33, 0x33, 0xff, 0, 0xab, 0xcd], DEV_MAC, &dad),
            Egress::Drop(EgressDrop::NeighbourIgnored)
        );
        assert_eq!(t.holder6(new), Some(DEV_MAC));
        // Another MAC's probe of it teaches nothing; its packets from it are spoofed.
        let mut f = frame([0x33, 0x33, 0xff, 0, 0xab, 0xcd], OTHER_MAC, &dad);
        run(&lan, &mut f, &t, &mut out);
        assert_eq!(t.holder6(new), Some(DEV_MAC));
        assert_eq!(
            judge(&lan, &t, GW_MAC, OTHER_MAC, &udp(new, addr(FAR), 64, 10)),
            Egress::Drop(EgressDrop::Spoofed)
        );
        // The holder's go on; a first packet from a new address teaches it too.
        let mut f = frame(GW_MAC, DEV_MAC, &udp(new, addr(FAR), 64, 10));
        assert!(matches!(
            run(&lan, &mut f, &t, &mut out),
            Egress::Forward6 { .. }
        ));
        let privacy = addr("fd7a:0:1:100:1234:5678:9abc:def0");
        let mut f = frame(GW_MAC, OTHER_MAC, &udp(privacy, addr(FAR), 64, 10));
        assert!(matches!(
            run(&lan, &mut f, &t, &mut out),
            Egress::Forward6 { .. }
        ));
        assert_eq!(t.holder6(privacy), Some(OTHER_MAC));
        // Never from outside the /64, nor from a gateway address.
        for src in [addr("fd7a:0:1:101::10"), addr(GW), link_local(DEV_MAC)] {
            assert_eq!(
                judge(&lan, &t, GW_MAC, DEV_MAC, &udp(src, addr(FAR), 64, 10)),
                Egress::Drop(EgressDrop::Spoofed),
                "{src}"
            );
        }
    }

    #[test]
    fn packets_into_the_tunnel_lose_a_hop_and_fit_the_mtu() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let mut out = [0u8; 1500];
        let mut f = frame(GW_MAC, DEV_MAC, &udp(addr(DEV), addr(FAR), 64, 100));
        let Egress::Forward6 { packet, dst } = run(&lan, &mut f, &t, &mut out) else {
            panic!("not forwarded")
        };
        assert_eq!((packet, dst), (14..14 + 148, addr(FAR)));
        assert_eq!(f[14 + 7], 63);
        // Outside the overlay, or on the segment: not carried.
        assert_eq!(
            judge(
                &lan,
                &t,
                GW_MAC,
                DEV_MAC,
                &udp(addr(DEV), addr("2001:db8::1"), 64, 10)
            ),
            Egress::Drop(EgressDrop::NoRoute)
        );
        assert_eq!(
            judge(
                &lan,
                &t,
                GW_MAC,
                DEV_MAC,
                &udp(addr(DEV), addr("fd7a:0:1:100::20"), 64, 10)
            ),
            Egress::Drop(EgressDrop::LocalDestination)
        );
        // Too big for the tunnel: Packet Too Big with its MTU, quoting the packet.
        let big = udp(addr(DEV), addr(FAR), 64, 1500 - 48);
        let mut f = frame(GW_MAC, DEV_MAC, &big);
        let mut out = [0u8; 2000];
        let Egress::Reply { len, kind } = run(&lan, &mut f, &t, &mut out) else {
            panic!("no packet too big")
        };
        assert_eq!(kind, ReplyKind::PacketTooBig);
        let p = reply_packet(&out, len);
        assert_eq!((p.get_source(), p.get_destination()), (addr(GW), addr(DEV)));
        let icmp = Icmpv6Packet::new(p.payload()).unwrap();
        assert_eq!(icmp.get_icmpv6_type(), Icmpv6Types::PacketTooBig);
        assert_eq!(&icmp.payload()[..4], &1420u32.to_be_bytes());
        assert_eq!(&icmp.payload()[4..44], &big[..40], "the packet quoted");
        assert!(len - 14 <= 1280, "within the minimum MTU");
        // Its last hop: time exceeded.
        let mut f = frame(GW_MAC, DEV_MAC, &udp(addr(DEV), addr(FAR), 1, 10));
        let Egress::Reply { len, kind } = run(&lan, &mut f, &t, &mut out) else {
            panic!("no time exceeded")
        };
        assert_eq!(kind, ReplyKind::TimeExceeded);
        let p = reply_packet(&out, len);
        assert_eq!(
            Icmpv6Packet::new(p.payload()).unwrap().get_icmpv6_type(),
            Icmpv6Types::TimeExceeded
        );
    }

    #[test]
    fn a_syn_over_ipv6_is_clamped_with_its_checksum_right() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let mut seg = vec![0u8; 24];
        seg[12] = 6 << 4;
        seg[13] = 0x02; // SYN
        seg[20..24].copy_from_slice(&[2, 4, 0x05, 0xa0]); // MSS 1440
        let (src, dst) = (addr(DEV), addr(FAR));
        let sum =
            pnet_packet::util::ipv6_checksum(&seg, 8, &[], &src, &dst, IpNextHeaderProtocols::Tcp);
        seg[16..18].copy_from_slice(&sum.to_be_bytes());
        let mut f = frame(GW_MAC, DEV_MAC, &packet(src, dst, NEXT_TCP, 64, &seg));
        let mut out = [0u8; 1500];
        assert!(matches!(
            run(&lan, &mut f, &t, &mut out),
            Egress::Forward6 { .. }
        ));
        let tcp = &f[54..];
        assert_eq!(&tcp[22..24], &1360u16.to_be_bytes(), "1420 less 60");
        let want =
            pnet_packet::util::ipv6_checksum(tcp, 8, &[], &src, &dst, IpNextHeaderProtocols::Tcp);
        assert_eq!(&tcp[16..18], &want.to_be_bytes());
    }

    #[test]
    fn the_gateway_answers_echo_at_its_address() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let mut out = [0u8; 1500];
        let ping = icmp6(
            addr(DEV),
            addr(GW),
            64,
            ECHO_REQUEST,
            &[0, 1, 0, 2, b'h', b'i'],
        );
        let mut f = frame(GW_MAC, DEV_MAC, &ping);
        let Egress::Reply { len, kind } = run(&lan, &mut f, &t, &mut out) else {
            panic!("no reply")
        };
        assert_eq!(kind, ReplyKind::EchoReply);
        let p = reply_packet(&out, len);
        assert_eq!((p.get_source(), p.get_destination()), (addr(GW), addr(DEV)));
        assert_eq!(p.payload()[0], ECHO_REPLY);
        assert_eq!(&p.payload()[4..], &[0, 1, 0, 2, b'h', b'i']);
        // Anything else for the gateway is no service of it.
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &udp(addr(DEV), addr(GW), 64, 10)),
            Egress::Drop(EgressDrop::GatewayService)
        );
    }

    /// A DNS query to the gateway's IPv6 address goes to the DNS service (its payload
    /// located); a wrong checksum or length is malformed; without the service it is none of
    /// the gateway's. The answer goes back in a UDP datagram with its checksum right.
    #[test]
    fn dns_queries_over_ipv6_reach_the_service_and_are_answered() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let mut query = udp(addr(DEV), addr(GW), 64, 12);
        query[40 + 2..40 + 4].copy_from_slice(&53u16.to_be_bytes());
        let sum = pnet_packet::util::ipv6_checksum(
            &query[40..],
            3,
            &[],
            &addr(DEV),
            &addr(GW),
            IpNextHeaderProtocols::Udp,
        );
        query[46..48].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &query),
            Egress::Dns6 {
                client_mac: DEV_MAC,
                client_ip: addr(DEV),
                client_port: 4000,
                udp_payload: 14 + 48..14 + 60,
            }
        );
        let mut bad = query.clone();
        bad[50] ^= 1;
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &bad),
            Egress::Drop(EgressDrop::Malformed)
        );
        // Left partial by the sender's kernel: nothing to check.
        let mut f = frame(GW_MAC, DEV_MAC, &bad);
        let len = f.len();
        let partial = lan.handle_frame(&mut f, len, true, &t, &mut [0u8; 1500]);
        assert!(matches!(partial, Egress::Dns6 { .. }), "{partial:?}");
        let mut short = query.clone();
        short[44..46].copy_from_slice(&9u16.to_be_bytes());
        assert_eq!(
            judge(&lan, &t, GW_MAC, DEV_MAC, &short),
            Egress::Drop(EgressDrop::Malformed)
        );
        let off = Lan {
            v6: lan.v6.clone().map(|v| Lan6 { dns: false, ..v }),
            ..lan.clone()
        };
        assert_eq!(
            judge(&off, &t, GW_MAC, DEV_MAC, &query),
            Egress::Drop(EgressDrop::GatewayService)
        );
        let mut out = [0u8; 1500];
        let len = lan
            .udp6_frame(DEV_MAC, addr(DEV), 53, 4000, b"answer", &mut out)
            .unwrap();
        let p = Ipv6Packet::new(&out[14..len]).unwrap();
        assert_eq!((p.get_source(), p.get_destination()), (addr(GW), addr(DEV)));
        let want = pnet_packet::util::ipv6_checksum(
            p.payload(),
            3,
            &[],
            &addr(GW),
            &addr(DEV),
            IpNextHeaderProtocols::Udp,
        );
        assert_eq!(&p.payload()[6..8], &want.to_be_bytes());
        assert_eq!(&p.payload()[8..], b"answer");
        assert_eq!(&out[..6], &DEV_MAC);
    }

    #[test]
    fn without_an_ipv6_block_ipv6_frames_are_dropped() {
        let t = Table::with(DEV, DEV_MAC);
        assert_eq!(
            judge(
                &lan(),
                &t,
                GW_MAC,
                DEV_MAC,
                &udp(addr(DEV), addr(FAR), 64, 10)
            ),
            Egress::Drop(EgressDrop::NotIpv4)
        );
    }

    #[test]
    fn a_peers_packet_reaches_the_holder_of_its_destination() {
        let lan = lan6();
        let t = Table::with(DEV, DEV_MAC);
        let blocks: Vec<IpNet> = vec!["fd7a:0:1:200::/56".parse().unwrap()];
        let deliver = |p: Vec<u8>| {
            let mut buf = vec![0u8; 14];
            buf.extend_from_slice(&p);
            let end = buf.len();
            let verdict = lan.deliver(&mut buf, 14..end, &blocks, &t, crate::Sums::Full);
            (verdict, buf)
        };
        let (verdict, buf) = deliver(udp(addr(FAR), addr(DEV), 64, 10));
        assert_eq!(verdict, Ingress::Deliver { frame: 0..14 + 58 });
        assert_eq!(&buf[..6], &DEV_MAC);
        assert_eq!(&buf[6..12], &GW_MAC);
        assert_eq!(&buf[12..14], &ETHERTYPE_IPV6.to_be_bytes());
        assert_eq!(buf[14 + 7], 63);
        let spoofed = deliver(udp(addr("fd7a:0:1:300::7"), addr(DEV), 64, 10)).0;
        assert_eq!(spoofed, Ingress::Drop(IngressDrop::SourceNotCertified));
        let nobody = deliver(udp(addr(FAR), addr("fd7a:0:1:100::99"), 64, 10)).0;
        assert_eq!(nobody, Ingress::Drop(IngressDrop::NoHolder));
        let elsewhere = deliver(udp(addr(FAR), addr("fd7a:0:1:101::10"), 64, 10)).0;
        assert_eq!(elsewhere, Ingress::Drop(IngressDrop::NotOurLan));
        let last_hop = deliver(udp(addr(FAR), addr(DEV), 1, 10)).0;
        assert_eq!(last_hop, Ingress::Drop(IngressDrop::TtlExpired));
    }

    proptest::proptest! {
        /// Any bytes as an IPv6 frame to the gateway (or to a multicast group), and as a
        /// peer's packet: never a panic; what goes on fits its buffer and the MTU.
        #[test]
        fn any_ipv6_bytes_are_judged_without_a_panic(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600),
            icmp in proptest::prelude::any::<bool>(),
            multicast in proptest::prelude::any::<bool>(),
        ) {
            let lan = lan6();
            let t = Table::with(DEV, DEV_MAC);
            let mut ip = body.clone();
            if icmp && ip.len() >= 48 {
                // A plausible ND header, so the option walk is reached.
                ip[0] = 0x60;
                ip[6] = NEXT_ICMPV6;
                ip[7] = 255;
                let len = u16::try_from(ip.len() - 40).unwrap_or(0);
                ip[4..6].copy_from_slice(&len.to_be_bytes());
                ip[40] = ROUTER_SOLICIT + ip[41] % 5;
            }
            let dst = if multicast { [0x33, 0x33, 0, 0, 0, 1] } else { GW_MAC };
            let mut f = frame(dst, DEV_MAC, &ip);
            let mut out = [0u8; 1500];
            let len = f.len();
            match lan.handle_frame(&mut f, len, false, &t, &mut out) {
                Egress::Forward6 { packet, .. } => {
                    proptest::prop_assert!(packet.end <= f.len() && packet.len() <= 1420);
                }
                Egress::Reply { len, .. } => proptest::prop_assert!(len <= out.len()),
                _ => {}
            }
            let mut buf = vec![0u8; 14];
            buf.extend_from_slice(&ip);
            let end = buf.len();
            let blocks: Vec<IpNet> = vec!["fd7a::/16".parse().unwrap()];
            if let Ingress::Deliver { frame } = lan.deliver(&mut buf, 14..end, &blocks, &t, crate::Sums::Full) {
                proptest::prop_assert!(frame.end <= buf.len());
            }
        }
    }
}
