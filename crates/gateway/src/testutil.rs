//! Packet builders for tests, using pnet's mutable views so that the test side does not share
//! code (or bugs) with the code under test. The crate's own tests use them, and with feature
//! `testing` the adapter's tests do, as its LAN's devices; not for production use.

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::net::Ipv4Addr;

use pnet_packet::MutablePacket;
use pnet_packet::ethernet::{EtherTypes, MutableEthernetPacket};
use pnet_packet::ip::IpNextHeaderProtocols;
use pnet_packet::ipv4::{self, MutableIpv4Packet};
use pnet_packet::tcp::{self, MutableTcpPacket, TcpFlags, TcpOption};
use pnet_packet::udp::{self, MutableUdpPacket};

/// The gateway's MAC in the tests.
pub const GW_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];
/// The NIC's own MAC under the gateway's.
pub const HOST_MAC: [u8; 6] = [0x02, 0xf0, 0, 0, 0, 1];

/// The LAN of the tests: gateway 100.64.1.1 in 100.64.1.0/24, overlay 100.64.0.0/10.
pub fn lan() -> crate::Lan {
    crate::Lan {
        mac: GW_MAC,
        host_mac: HOST_MAC,
        gateway_ip: Ipv4Addr::new(100, 64, 1, 1),
        block: "100.64.1.0/24".parse().unwrap(),
        overlay: "100.64.0.0/10".parse().unwrap(),
        inner_mtu: 1420,
        mss_clamp: true,
        defer_checksums: false,
        legacy: None,
        v6: None,
    }
}
/// A device's MAC.
pub const DEV_MAC: [u8; 6] = [0x02, 0xbb, 0, 0, 0, 10];

fn ipv4(payload_len: usize, proto: u8, src: [u8; 4], dst: [u8; 4], df: bool) -> Vec<u8> {
    let mut buf = vec![0u8; 20 + payload_len];
    let mut ip = MutableIpv4Packet::new(&mut buf).unwrap();
    ip.set_version(4);
    ip.set_header_length(5);
    ip.set_total_length((20 + payload_len) as u16);
    ip.set_identification(0x1234);
    ip.set_flags(if df { ipv4::Ipv4Flags::DontFragment } else { 0 });
    ip.set_ttl(64);
    ip.set_next_level_protocol(pnet_packet::ip::IpNextHeaderProtocol(proto));
    ip.set_source(Ipv4Addr::from(src));
    ip.set_destination(Ipv4Addr::from(dst));
    buf
}

fn fix_ip_checksum(buf: &mut [u8]) {
    let mut ip = MutableIpv4Packet::new(buf).unwrap();
    let sum = ipv4::checksum(&ip.to_immutable());
    ip.set_checksum(sum);
}

/// A UDP datagram over IPv4 (don't fragment), checksums filled in.
pub fn ipv4_udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    let mut buf = ipv4(8 + data.len(), IpNextHeaderProtocols::Udp.0, src, dst, true);
    {
        let mut u = MutableUdpPacket::new(&mut buf[20..]).unwrap();
        u.set_source(sport);
        u.set_destination(dport);
        u.set_length((8 + data.len()) as u16);
        u.payload_mut().copy_from_slice(data);
        let sum = udp::ipv4_checksum(
            &u.to_immutable(),
            &Ipv4Addr::from(src),
            &Ipv4Addr::from(dst),
        );
        // RFC 768: a computed 0 is sent as 0xffff; 0 in the field means "no checksum".
        u.set_checksum(if sum == 0 { 0xffff } else { sum });
    }
    fix_ip_checksum(&mut buf);
    buf
}

/// A TCP segment with `flags` and, if given, an MSS option.
pub fn ipv4_tcp(src: [u8; 4], dst: [u8; 4], flags: u8, mss: Option<u16>, data: &[u8]) -> Vec<u8> {
    let opt_len = if mss.is_some() { 8 } else { 0 }; // NOP NOP MSS(4) NOP NOP
    let mut buf = ipv4(
        20 + opt_len + data.len(),
        IpNextHeaderProtocols::Tcp.0,
        src,
        dst,
        true,
    );
    {
        let mut t = MutableTcpPacket::new(&mut buf[20..]).unwrap();
        t.set_source(40000);
        t.set_destination(5201);
        t.set_sequence(1);
        t.set_data_offset(((20 + opt_len) / 4) as u8);
        t.set_flags(flags);
        t.set_window(65535);
        if let Some(m) = mss {
            t.set_options(&[
                TcpOption::nop(),
                TcpOption::nop(),
                TcpOption::mss(m),
                TcpOption::nop(),
                TcpOption::nop(),
            ]);
        }
        t.payload_mut().copy_from_slice(data);
        let sum = tcp::ipv4_checksum(
            &t.to_immutable(),
            &Ipv4Addr::from(src),
            &Ipv4Addr::from(dst),
        );
        t.set_checksum(sum);
    }
    fix_ip_checksum(&mut buf);
    buf
}

/// A TCP SYN from 100.64.1.10 to 100.64.2.20 with an MSS option of `mss`.
pub fn syn(mss: u16) -> Vec<u8> {
    ipv4_tcp(
        [100, 64, 1, 10],
        [100, 64, 2, 20],
        TcpFlags::SYN,
        Some(mss),
        &[],
    )
}

/// An ICMP echo request.
pub fn ipv4_echo(src: [u8; 4], dst: [u8; 4], data: &[u8]) -> Vec<u8> {
    let mut buf = ipv4(
        8 + data.len(),
        IpNextHeaderProtocols::Icmp.0,
        src,
        dst,
        false,
    );
    buf[20] = 8;
    buf[24..26].copy_from_slice(&0x0101u16.to_be_bytes());
    buf[26..28].copy_from_slice(&7u16.to_be_bytes());
    buf[28..].copy_from_slice(data);
    let sum = pnet_packet::util::checksum(&buf[20..], 1);
    buf[22..24].copy_from_slice(&sum.to_be_bytes());
    fix_ip_checksum(&mut buf);
    buf
}

/// A packet of `len` bytes total with DF as given (UDP payload filler).
pub fn ipv4_sized(len: usize, df: bool) -> Vec<u8> {
    let mut p = ipv4_udp(
        [100, 64, 1, 10],
        [100, 64, 2, 20],
        1000,
        2000,
        &vec![0x5a; len - 28],
    );
    if !df {
        p[6] &= !0x40;
        p[10..12].fill(0);
        fix_ip_checksum(&mut p);
    }
    p
}

/// Wraps an IP packet into an Ethernet frame.
pub fn eth(dst: [u8; 6], src: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 14 + ip.len()];
    let mut e = MutableEthernetPacket::new(&mut buf).unwrap();
    e.set_destination(dst.into());
    e.set_source(src.into());
    e.set_ethertype(EtherTypes::Ipv4);
    e.payload_mut().copy_from_slice(ip);
    buf
}

/// Validates IP header, and TCP/UDP/ICMP checksums of a whole IPv4 packet with pnet.
pub fn checksums_ok(p: &[u8]) -> bool {
    let ip = ipv4::Ipv4Packet::new(p).unwrap();
    if ipv4::checksum(&ip) != ip.get_checksum() {
        return false;
    }
    let hl = usize::from(ip.get_header_length()) * 4;
    let seg = &p[hl..usize::from(ip.get_total_length())];
    let (src, dst) = (ip.get_source(), ip.get_destination());
    match ip.get_next_level_protocol() {
        IpNextHeaderProtocols::Tcp => {
            let t = tcp::TcpPacket::new(seg).unwrap();
            tcp::ipv4_checksum(&t, &src, &dst) == t.get_checksum()
        }
        IpNextHeaderProtocols::Udp => {
            let u = udp::UdpPacket::new(seg).unwrap();
            let computed = udp::ipv4_checksum(&u, &src, &dst);
            // RFC 768: a computed 0 is sent as 0xffff (0 would mean "no checksum"); pnet
            // returns the 0.
            computed == u.get_checksum() || (computed == 0 && u.get_checksum() == 0xffff)
        }
        IpNextHeaderProtocols::Icmp => {
            pnet_packet::util::checksum(seg, 1) == u16::from_be_bytes([seg[2], seg[3]])
        }
        _ => true,
    }
}
