//! The adapter's LAN-side packet logic, sans-IO: what a gateway does with the Ethernet frames
//! of the devices behind it, and how it hands packets from the tunnel back to them.
//!
//! - [`Lan::handle_frame`] (egress): classifies a captured frame and says what to do with it:
//!   answer on the LAN ([`Egress::Reply`]: ARP for the gateway vIP and proxy ARP for off-link
//!   overlay vIPs, ICMP echo for the gateway, ICMP fragmentation-needed and time-exceeded),
//!   hand it to the DHCP or DNS service, forward it into the tunnel (after anti-spoofing
//!   against the lease table, TTL decrement, MSS clamping, and checksum completion for
//!   offloaded frames, or their checksums left to the far end), fragment it, or drop it with a
//!   reason.
//! - [`Lan::deliver`] (ingress): checks a decrypted packet against the sending peer's certified
//!   vIP blocks (cryptokey routing) and our LAN, clamps MSS, and writes the Ethernet header in
//!   front of it for the device's MAC, or asks for an ARP request when the MAC is unknown.
//! - [`Fragmenter`]: RFC 791 fragmentation of oversize packets without DF.
//! - [`Netmap`]: a site's fixed-address subnet mapped one to one onto part of the block
//!   (docs/protocol.md §6), packets rewritten with every checksum following (not on the
//!   adapter's path yet).
//! - [`find_run`], [`merge_headers`]: consecutive TCP segments or UDP datagrams of one flow
//!   going to the LAN become one frame for the kernel to segment again (GSO), as GRO would
//!   have merged them.
//! - IPv6 on the LAN ([`Lan6`], docs/protocol.md §7): [`Lan::handle_frame`] and
//!   [`Lan::deliver`] take IPv6 too when the segment has it; [`Lan::router_advert`] writes
//!   the gateway's Router Advertisement.
//! - [`tag_frame`]: the 802.1Q tag of a frame for a VLAN segment of a trunked LAN port.
//! - [`Segmenter`]: cuts a frame the kernel coalesced (GRO) back into the TCP segments or UDP
//!   datagrams it was made of, each with its own headers and checksums.
//!
//! Frames are edited in place and replies are written into the caller's buffer: nothing here
//! allocates, reads a clock or touches a socket. Packet views come from pnet (`pnet_packet`);
//! lengths are validated before any view is built, so malformed input is a drop reason, never
//! a panic.
#![forbid(unsafe_code)]

mod arp;
mod checksum;
mod coalesce;
mod egress;
mod frag;
mod icmp;
mod ingress;
mod ipv4;
mod lan6;
mod netmap;
mod segment;
mod service;
mod tcp;
mod vlan;

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

pub use arp::{announcement, request};
pub use coalesce::{Run, find_run, merge_headers, restore_headers, tcp_flags};
pub use egress::{Egress, EgressDrop, ReplyKind};
pub use frag::{FragError, Fragmenter};
pub use ingress::{Ingress, IngressDrop};
pub use ipv4::{complete_deferred_checksum, finish_partial_checksum};
pub use lan6::eui64_address;
pub use netmap::{Legacy, Netmap, NetmapError, Sums, Unmapped};
pub use segment::{GsoKind, SegmentError, Segmenter};
pub use service::{GatewayService, gateway_service, udp_packet};
pub use vlan::{TAG_LEN as VLAN_TAG_LEN, VID_MAX, tag_frame};

/// Length of an Ethernet II header.
pub const ETH_HEADER_LEN: usize = 14;
/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// The Ethernet broadcast address.
pub const BROADCAST: [u8; 6] = [0xff; 6];
/// Smallest IPv4 header.
pub const IPV4_MIN_HEADER: usize = 20;

/// What comes in front of the IP packet in the frames a function is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// An untagged Ethernet header (the adapter's LAN side).
    Ethernet,
    /// Nothing: bare IP packets (the node's TUN device).
    Ip,
}

impl Framing {
    /// Bytes in front of the IP packet.
    pub const fn header_len(self) -> usize {
        match self {
            Self::Ethernet => ETH_HEADER_LEN,
            Self::Ip => 0,
        }
    }
}
/// IPv4 plus TCP headers without options: MSS = MTU - this (RFC 879).
pub const IPV4_TCP_HEADERS: u16 = 40;

/// Who holds which address on the LAN. The adapter implements it over its reservations and
/// DHCP leases; ARP teaches it nothing of the block (an address nobody holds is not
/// learnable), and of a legacy subnet only what [`Neighbors::heard`] lets it.
pub trait Neighbors {
    /// The MAC that holds a lease or reservation for `ip`: the only MAC allowed to send from
    /// it, and the only one packets for it are delivered to.
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]>;

    /// A device on a legacy subnet said it is at the overlay address `ip` (its ARP, or a
    /// packet's source) from `mac`, and nobody holds `ip`: the table may let `mac` hold it
    /// from now on (learning, and its bounds, are the table's). Learns nothing by default.
    fn heard(&self, ip: Ipv4Addr, mac: [u8; 6]) {
        let _ = (ip, mac);
    }

    /// The site router's MAC, beside which the adapter runs (a legacy subnet's `router`),
    /// once heard. None by default.
    fn router_mac(&self) -> Option<[u8; 6]> {
        None
    }

    /// The site's router said by its ARP that it is at `mac`: the table may take it as the
    /// router's MAC (the first heard, say). Learns nothing by default.
    fn heard_router(&self, mac: [u8; 6]) {
        let _ = mac;
    }

    /// The MAC that holds the IPv6 address `ip` of the segment's /64, if any.
    fn holder6(&self, ip: std::net::Ipv6Addr) -> Option<[u8; 6]> {
        let _ = ip;
        None
    }

    /// `mac` was heard at `ip`, an address of the segment's /64 that nobody holds (a
    /// packet's source, its duplicate address detection or advertisement): the table may let
    /// it hold `ip` from now on (within its bounds). Returns whether `mac` holds `ip` now.
    /// Learns nothing by default.
    fn heard6(&self, ip: std::net::Ipv6Addr, mac: [u8; 6]) -> bool {
        let _ = (ip, mac);
        false
    }
}

/// The MAC the gateway answers with on the LAN, derived from the internal NIC's own `nic`:
/// locally administered, unicast, stable across restarts, and never the NIC's own MAC.
///
/// Devices address their frames to it, and the host's kernel takes IP in only from frames
/// for its own MAC (`PACKET_HOST`): whatever its `ip_forward` and routes say, it never sees a
/// device's packet as one to forward, so none leaves the host in clear beside the sealed copy.
/// The capture still receives them, since the LAN port is promiscuous.
pub const fn gateway_mac(nic: [u8; 6]) -> [u8; 6] {
    [
        (nic[0] | 0x02) & !0x01,
        nic[1] ^ 0x5a,
        nic[2],
        nic[3],
        nic[4],
        nic[5],
    ]
}

/// A segment's IPv6 (docs/protocol.md §7): its /64 and the overlay's range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lan6 {
    /// The segment's /64, advertised on-link and for SLAAC.
    pub prefix: ipnet::Ipv6Net,
    /// The overlay's IPv6 range: destinations worth carrying into the tunnel.
    pub overlay: ipnet::Ipv6Net,
    /// The DNS service answers at the gateway's address: Router Advertisements name it
    /// (RDNSS) and queries to it go to the service.
    pub dns: bool,
    /// The DHCPv6 server runs: Router Advertisements say so (M and O), and its messages go
    /// to it.
    pub dhcp: bool,
    /// The search list Router Advertisements carry (DNSSL, RFC 8106) with the DNS server:
    /// one domain in DNS wire form ([`Lan6::search_list`]), empty for none.
    pub search: Vec<u8>,
}

impl Lan6 {
    /// `domain` (dotted, a final dot or not) in DNS wire form; None when a label is empty or
    /// over 63 bytes, or the name over 255.
    pub fn search_list(domain: &str) -> Option<Vec<u8>> {
        let mut wire = Vec::new();
        for label in domain.trim_end_matches('.').split('.') {
            if label.is_empty() || label.len() > 63 {
                return None;
            }
            wire.push(u8::try_from(label.len()).ok()?);
            wire.extend_from_slice(label.as_bytes());
        }
        wire.push(0);
        (wire.len() <= 255).then_some(wire)
    }

    /// The gateway's address on the segment: the /64's `::1`.
    pub fn address(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.prefix.network().to_bits() | 1)
    }
}

/// The adapter's view of its LAN segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lan {
    /// The gateway's MAC ([`gateway_mac`]): frames to the gateway carry it, and it is the
    /// source of every frame the adapter sends on the LAN.
    pub mac: [u8; 6],
    /// The internal NIC's own MAC: frames from it are the host's, not a device's.
    pub host_mac: [u8; 6],
    /// The gateway's own vIP (the devices' default router and DNS server).
    pub gateway_ip: Ipv4Addr,
    /// The certified vIP block the devices' addresses come from.
    pub block: Ipv4Net,
    /// The whole overlay: destinations worth carrying into the tunnel.
    pub overlay: Ipv4Net,
    /// Largest inner packet the tunnel carries.
    pub inner_mtu: u16,
    /// Rewrite the MSS option of TCP SYN and SYN-ACK to fit `inner_mtu`.
    pub mss_clamp: bool,
    /// Forward frames whose TCP or UDP checksum the kernel left partial without completing it
    /// ([`Egress::Forward`]'s `checksum_deferred`): the tunnel's far end fills it in, or has
    /// its NIC do it, after the AEAD has carried the payload intact.
    pub defer_checksums: bool,
    /// A site's fixed-address devices, mapped onto part of `block`, with the old router's
    /// address the gateway answers for (docs/protocol.md §6). `None`: every device holds an
    /// address of the block.
    pub legacy: Option<Legacy>,
    /// The segment's IPv6 (docs/protocol.md §7): `None` when the certificate holds no IPv6
    /// block, and then IPv6 frames are dropped as not IPv4.
    pub v6: Option<Lan6>,
}

impl Lan {
    /// Whether `ip` is the gateway's on the LAN: its vIP, or the old router's address of a
    /// legacy subnet.
    pub fn is_gateway_address(&self, ip: Ipv4Addr) -> bool {
        ip == self.gateway_ip || self.legacy.is_some_and(|l| l.gateway == ip)
    }

    /// The MSS that fits `inner_mtu` (IPv4 and TCP headers without options).
    pub const fn max_mss(&self) -> u16 {
        self.inner_mtu.saturating_sub(IPV4_TCP_HEADERS)
    }
}

pub(crate) fn mac_at(frame: &[u8], at: usize) -> [u8; 6] {
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&frame[at..at + 6]);
    mac
}

/// Writes an Ethernet II header at the start of `buf` (which must hold at least 14 bytes).
pub(crate) fn write_eth(buf: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    buf[..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

#[cfg(any(test, feature = "testing"))]
pub mod testutil;

#[cfg(test)]
mod legacy_path;

#[cfg(test)]
mod tests {
    use super::gateway_mac;

    /// The gateway's MAC is never the NIC's, is unicast and locally administered, and is the
    /// same every time for one NIC (devices' ARP caches stay right across restarts).
    #[test]
    fn the_gateway_mac_is_never_the_nics_own() {
        for nic in [
            [0x00, 0x1b, 0x21, 0x3a, 0x4b, 0x5c],
            [0x02, 0xaa, 0, 0, 0, 1],
            [0xfe, 0x5a, 1, 2, 3, 4],
            [0xdc, 0xa6, 0x32, 0x01, 0x02, 0x03],
            [0xff; 6],
            [0; 6],
        ] {
            let gw = gateway_mac(nic);
            assert_ne!(gw, nic);
            assert_eq!(gw[0] & 0x01, 0, "unicast");
            assert_eq!(gw[0] & 0x02, 0x02, "locally administered");
            assert_eq!(gw, gateway_mac(nic));
        }
    }
}
