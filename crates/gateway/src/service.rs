//! The gateway's own services: what a packet addressed to the gateway vIP asks for, and the
//! UDP packets and frames the gateway sends (DHCP and DNS replies, DNS queries to peers).

use std::net::Ipv4Addr;
use std::ops::Range;

use crate::ipv4::{self, Header, PROTO_UDP};
use crate::{ETH_HEADER_LEN, ETHERTYPE_IPV4, IPV4_MIN_HEADER, Lan, checksum, icmp, write_eth};

const UDP_HEADER: usize = 8;
const TTL: u8 = 64;

/// What a packet for the gateway vIP asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayService {
    /// A UDP datagram to port `dst_port` (53: DNS), with its sender and payload range.
    Udp {
        /// Sender address.
        src: Ipv4Addr,
        /// Sender port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// The payload within the packet.
        payload: Range<usize>,
    },
    /// An ICMP echo request; the reply is in `out[..len]`.
    Echo {
        /// Bytes of the reply packet written into `out`.
        len: usize,
    },
    /// Anything else (counted and dropped).
    Other,
}

/// Classifies a whole IPv4 `packet` addressed to the gateway. For an echo request the reply
/// packet is written into `out`.
pub fn gateway_service(lan: &Lan, packet: &[u8], out: &mut [u8]) -> GatewayService {
    let Ok(h) = Header::parse(packet, true) else {
        return GatewayService::Other;
    };
    if h.dst != lan.gateway_ip || h.is_fragment() {
        return GatewayService::Other;
    }
    if icmp::is_echo_request(packet, &h) {
        return icmp::echo_reply_packet(lan, packet, &h, out)
            .map_or(GatewayService::Other, |len| GatewayService::Echo { len });
    }
    if h.proto != PROTO_UDP {
        return GatewayService::Other;
    }
    let Some(seg) = h.payload(packet) else {
        return GatewayService::Other;
    };
    if seg.len() < UDP_HEADER {
        return GatewayService::Other;
    }
    let udp_len = usize::from(u16::from_be_bytes([seg[4], seg[5]]));
    if udp_len < UDP_HEADER || udp_len > seg.len() {
        return GatewayService::Other;
    }
    GatewayService::Udp {
        src: h.src,
        src_port: u16::from_be_bytes([seg[0], seg[1]]),
        dst_port: u16::from_be_bytes([seg[2], seg[3]]),
        payload: h.header_len + UDP_HEADER..h.header_len + udp_len,
    }
}

/// Writes an IPv4/UDP packet with `payload` into `out` (checksums computed). Returns its
/// length, or None when `out` is too small or the payload too large for one datagram.
pub fn udp_packet(
    out: &mut [u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    payload: &[u8],
) -> Option<usize> {
    let udp_len = UDP_HEADER + payload.len();
    let total = IPV4_MIN_HEADER + udp_len;
    let ip = out.get_mut(..total)?;
    ipv4::write_header(
        ip,
        u16::try_from(total).ok()?,
        0,
        TTL,
        PROTO_UDP,
        src,
        dst,
        false,
    );
    let udp = &mut ip[IPV4_MIN_HEADER..];
    udp[0..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&u16::try_from(udp_len).ok()?.to_be_bytes());
    udp[6..8].fill(0);
    udp[UDP_HEADER..].copy_from_slice(payload);
    checksum::fill_transport(udp, src, dst, PROTO_UDP);
    Some(total)
}

impl Lan {
    /// Writes into `out` an Ethernet frame with a UDP datagram from the gateway to
    /// `dst_ip:dst_port` at `dst_mac`. Returns its length.
    pub fn udp_frame(
        &self,
        dst_mac: [u8; 6],
        dst_ip: Ipv4Addr,
        src_port: u16,
        dst_port: u16,
        payload: &[u8],
        out: &mut [u8],
    ) -> Option<usize> {
        let (head, ip) = out.split_at_mut_checked(ETH_HEADER_LEN)?;
        let len = udp_packet(ip, self.gateway_ip, dst_ip, src_port, dst_port, payload)?;
        // To a fixed-address device, from the old router's address to its own.
        if let Some(legacy) = self.legacy.filter(|l| l.map.overlay().contains(&dst_ip)) {
            legacy
                .inbound(&mut ip[..len], crate::Sums::Full, self.gateway_ip)
                .ok()?;
        }
        write_eth(head, dst_mac, self.mac, ETHERTYPE_IPV4);
        Some(ETH_HEADER_LEN + len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{GW_MAC, checksums_ok, ipv4_echo, ipv4_udp, lan};

    #[test]
    fn udp_frames_and_packets_are_valid() {
        let mut out = [0u8; 200];
        let n = lan()
            .udp_frame(
                [2, 0, 0, 0, 0, 9],
                Ipv4Addr::new(100, 64, 1, 10),
                67,
                68,
                b"reply",
                &mut out,
            )
            .unwrap();
        assert_eq!(&out[6..12], &GW_MAC);
        assert!(checksums_ok(&out[14..n]));
        assert_eq!(&out[n - 5..n], b"reply");
        assert!(
            udp_packet(
                &mut [0u8; 30],
                Ipv4Addr::LOCALHOST,
                Ipv4Addr::LOCALHOST,
                1,
                2,
                b"toolong"
            )
            .is_none()
        );
    }

    #[test]
    fn services_of_the_gateway() {
        let mut out = [0u8; 200];
        let q = ipv4_udp([100, 64, 2, 1], [100, 64, 1, 1], 5353, 53, b"query");
        let GatewayService::Udp {
            src,
            src_port,
            dst_port,
            payload,
        } = gateway_service(&lan(), &q, &mut out)
        else {
            panic!()
        };
        assert_eq!(
            (src, src_port, dst_port, &q[payload]),
            (Ipv4Addr::new(100, 64, 2, 1), 5353, 53, &b"query"[..])
        );
        let ping = ipv4_echo([100, 64, 2, 10], [100, 64, 1, 1], b"hello");
        let GatewayService::Echo { len } = gateway_service(&lan(), &ping, &mut out) else {
            panic!()
        };
        assert!(checksums_ok(&out[..len]));
        assert_eq!(
            (&out[12..16], &out[16..20], out[20]),
            (&[100, 64, 1, 1][..], &[100, 64, 2, 10][..], 0)
        );
        let elsewhere = ipv4_udp([100, 64, 2, 1], [100, 64, 1, 9], 5353, 53, b"query");
        assert_eq!(
            gateway_service(&lan(), &elsewhere, &mut out),
            GatewayService::Other
        );
        assert_eq!(
            gateway_service(&lan(), &[0x45, 0, 0], &mut out),
            GatewayService::Other
        );
    }
}
