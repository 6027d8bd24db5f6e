//! ARP (RFC 826) for IPv4 over Ethernet: parsing, the gateway's replies, its requests.

use std::net::Ipv4Addr;

use crate::{BROADCAST, ETH_HEADER_LEN, ETHERTYPE_ARP, ETHERTYPE_IPV4, Lan, write_eth};

const ARP_LEN: usize = 28;
pub(crate) const OP_REQUEST: u16 = 1;
pub(crate) const OP_REPLY: u16 = 2;

/// The fields of an IPv4-over-Ethernet ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arp {
    pub(crate) op: u16,
    pub(crate) sender_mac: [u8; 6],
    pub(crate) sender_ip: Ipv4Addr,
    pub(crate) target_ip: Ipv4Addr,
}

/// Parses the ARP packet after the Ethernet header; None for anything but IPv4 over Ethernet.
pub(crate) fn parse(arp: &[u8]) -> Option<Arp> {
    let p = pnet_packet::arp::ArpPacket::new(arp.get(..ARP_LEN)?)?;
    let ethernet_ipv4 = p.get_hardware_type() == pnet_packet::arp::ArpHardwareTypes::Ethernet
        && p.get_protocol_type().0 == ETHERTYPE_IPV4
        && p.get_hw_addr_len() == 6
        && p.get_proto_addr_len() == 4;
    ethernet_ipv4.then(|| Arp {
        op: p.get_operation().0,
        sender_mac: p.get_sender_hw_addr().octets(),
        sender_ip: p.get_sender_proto_addr(),
        target_ip: p.get_target_proto_addr(),
    })
}

/// Whether the gateway answers ARP for `ip`: its own addresses ([`Lan::is_gateway_address`]),
/// and (proxy ARP) overlay addresses that are not on this LAN, for devices whose netmask
/// covers the whole overlay, and those a legacy subnet maps onto, which the devices of the
/// block reach through the gateway.
pub(crate) fn answers_for(lan: &Lan, ip: Ipv4Addr) -> bool {
    lan.is_gateway_address(ip)
        || (lan.overlay.contains(&ip) && !lan.block.contains(&ip))
        || lan.legacy.is_some_and(|l| l.map.overlay().contains(&ip))
}

/// Writes the frame answering `req` with the gateway's MAC. Returns its length.
pub(crate) fn reply(lan: &Lan, req: &Arp, out: &mut [u8]) -> Option<usize> {
    let frame = out.get_mut(..ETH_HEADER_LEN + ARP_LEN)?;
    write_eth(frame, req.sender_mac, lan.mac, ETHERTYPE_ARP);
    write_arp(
        &mut frame[ETH_HEADER_LEN..],
        OP_REPLY,
        lan.mac,
        req.target_ip,
        req.sender_mac,
        req.sender_ip,
    );
    Some(frame.len())
}

/// Writes the announcement of `ip` at `mac` into `out` (RFC 5227 §2.3: a broadcast request
/// whose sender and target are `ip`; a gratuitous ARP, which Linux takes over an entry however
/// recently it changed); returns its length, `None` when `out` is too short. The gateway
/// sends it when a device claims one of its addresses, and an HA pair's new active box as it
/// takes over: switches learn the gateway MAC's new port at once.
pub fn announcement(mac: [u8; 6], ip: Ipv4Addr, out: &mut [u8]) -> Option<usize> {
    request(mac, ip, ip, out)
}

/// Writes the gateway's broadcast request, from `sender` at `mac`, for `target`'s MAC into
/// `out`; returns its length, `None` when `out` is too short. Beside a site's router, the
/// adapter asks for the router's MAC so.
pub fn request(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr, out: &mut [u8]) -> Option<usize> {
    let frame = out.get_mut(..ETH_HEADER_LEN + ARP_LEN)?;
    write_eth(frame, BROADCAST, mac, ETHERTYPE_ARP);
    write_arp(
        &mut frame[ETH_HEADER_LEN..],
        OP_REQUEST,
        mac,
        sender,
        [0; 6],
        target,
    );
    Some(frame.len())
}

fn write_arp(buf: &mut [u8], op: u16, sha: [u8; 6], spa: Ipv4Addr, tha: [u8; 6], tpa: Ipv4Addr) {
    buf[0..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    buf[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    buf[4] = 6;
    buf[5] = 4;
    buf[6..8].copy_from_slice(&op.to_be_bytes());
    buf[8..14].copy_from_slice(&sha);
    buf[14..18].copy_from_slice(&spa.octets());
    buf[18..24].copy_from_slice(&tha);
    buf[24..28].copy_from_slice(&tpa.octets());
}
