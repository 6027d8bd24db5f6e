//! Ingress: a packet out of the tunnel, on its way to a device on the LAN.

use std::ops::Range;

use ipnet::IpNet;

use crate::ipv4::{self, Header, Invalid};
use crate::{ETH_HEADER_LEN, ETHERTYPE_IPV4, Lan, Neighbors, Sums, tcp, write_eth};

/// Why a decrypted packet is not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IngressDrop {
    /// Not IPv4.
    NotIpv4,
    /// Inconsistent lengths or a wrong header checksum.
    Malformed,
    /// The inner source is not inside the sending peer's certified vIP blocks (cryptokey
    /// routing): a peer may only speak for the addresses its certificate names.
    SourceNotCertified,
    /// The destination is not a device on this LAN.
    NotOurLan,
    /// The TTL ran out.
    TtlExpired,
    /// An address of our block that no device holds (no lease, no reservation): there is
    /// nobody to deliver to, and ARP may not make anybody (issue 49, finding 7).
    NoHolder,
    /// The caller left no room for the Ethernet header in front of the packet.
    NoHeadroom,
}

/// The verdict on a decrypted packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingress {
    /// For the gateway itself (its DNS service, ping): `buf[packet]`, checked against the
    /// peer's blocks, for the driver to serve (see [`crate::gateway_service`]).
    ToGateway {
        /// The IPv4 packet within the buffer.
        packet: Range<usize>,
    },
    /// Send `buf[frame]` on the LAN: the Ethernet header was written in front of the packet.
    Deliver {
        /// The Ethernet frame within the buffer.
        frame: Range<usize>,
    },
    /// Nothing to do but count.
    Drop(IngressDrop),
}

impl Lan {
    /// Prepares the decrypted packet `buf[packet]` for the LAN. `peer_blocks` are the vIP
    /// blocks certified to the peer it came from; `sums` says what its TCP or UDP checksum
    /// holds (partial when the far end deferred it). `packet.start` must leave 14 bytes of
    /// headroom: the Ethernet header is written there, so the frame needs no copy.
    pub fn deliver(
        &self,
        buf: &mut [u8],
        packet: Range<usize>,
        peer_blocks: &[IpNet],
        neighbors: &impl Neighbors,
        sums: Sums,
    ) -> Ingress {
        let Some(ip) = buf.get_mut(packet.clone()) else {
            return Ingress::Drop(IngressDrop::Malformed);
        };
        let h = match Header::parse(ip, true) {
            Ok(h) => h,
            Err(Invalid::NotIpv4) if ip.first().is_some_and(|b| b >> 4 == 6) => {
                return self.deliver6(buf, packet, peer_blocks, neighbors);
            }
            Err(Invalid::NotIpv4) => return Ingress::Drop(IngressDrop::NotIpv4),
            Err(Invalid::Malformed) => return Ingress::Drop(IngressDrop::Malformed),
        };
        if !peer_blocks
            .iter()
            .any(|b| b.contains(&std::net::IpAddr::V4(h.src)))
        {
            return Ingress::Drop(IngressDrop::SourceNotCertified);
        }
        if h.dst == self.gateway_ip {
            return Ingress::ToGateway {
                packet: packet.start..packet.start + h.total_len,
            };
        }
        if !self.block.contains(&h.dst) || h.dst == self.block.broadcast() {
            return Ingress::Drop(IngressDrop::NotOurLan);
        }
        if h.ttl <= 1 {
            return Ingress::Drop(IngressDrop::TtlExpired);
        }
        ipv4::decrement_ttl(ip);
        if self.mss_clamp {
            tcp::clamp_mss(ip, &h, self.max_mss());
        }
        // A fixed-address device: reached in its own terms (the legacy map), and beside a
        // site's router, through it.
        let mapped = self.legacy.filter(|l| l.map.overlay().contains(&h.dst));
        let holder = if mapped.is_some_and(|l| l.router.is_some()) {
            neighbors.router_mac()
        } else {
            neighbors.leased_mac(h.dst)
        };
        let Some(mac) = holder else {
            return Ingress::Drop(IngressDrop::NoHolder);
        };
        if let Some(legacy) = mapped
            && legacy.inbound(ip, sums, self.gateway_ip).is_err()
        {
            return Ingress::Drop(IngressDrop::Malformed);
        }
        let Some(start) = packet.start.checked_sub(ETH_HEADER_LEN) else {
            return Ingress::Drop(IngressDrop::NoHeadroom);
        };
        write_eth(&mut buf[start..], mac, self.mac, ETHERTYPE_IPV4);
        Ingress::Deliver {
            frame: start..packet.start + h.total_len,
        }
    }

    /// Writes into `out` the time-exceeded the gateway sends back through the tunnel about
    /// `packet`, a peer's packet whose TTL ran out here ([`IngressDrop::TtlExpired`]): from
    /// the gateway vIP to its source, quoting its header and first 8 payload bytes as they
    /// arrived (RFC 1812 §4.3.2.8 limits the rate: the caller's). Returns its length; None
    /// where no error may be sent (about an ICMP error, a later fragment) or `out` is short.
    pub fn time_exceeded(&self, packet: &[u8], out: &mut [u8]) -> Option<usize> {
        let h = Header::parse(packet, true).ok()?;
        crate::icmp::error_packet(self, packet, &h, crate::icmp::IcmpError::TimeExceeded, out)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::testutil::*;

    struct Leases;
    impl Neighbors for Leases {
        fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
            (ip == Ipv4Addr::new(100, 64, 1, 10)).then_some(DEV_MAC)
        }
    }

    fn peer_blocks() -> Vec<IpNet> {
        vec!["100.64.2.0/24".parse().unwrap()]
    }

    /// Puts `ip` at offset 16 of a buffer (as after a tunnel header) and delivers it.
    fn run(ip: &[u8]) -> (Ingress, Vec<u8>) {
        let mut buf = vec![0u8; 16 + ip.len()];
        buf[16..].copy_from_slice(ip);
        let v = lan().deliver(
            &mut buf,
            16..16 + ip.len(),
            &peer_blocks(),
            &Leases,
            Sums::Full,
        );
        (v, buf)
    }

    /// A peer's packet that runs out of TTL here is answered through the tunnel with a
    /// time-exceeded from the gateway vIP quoting it as it arrived; an ICMP error is not.
    #[test]
    fn an_expired_packet_is_answered_with_a_time_exceeded() {
        let mut p = ipv4_udp([100, 64, 2, 20], [100, 64, 1, 10], 33434, 33435, b"probe");
        p[8] = 1;
        p[10..12].fill(0);
        let sum = crate::checksum::internet(&p[..20]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        let (v, _) = run(&p);
        assert_eq!(v, Ingress::Drop(IngressDrop::TtlExpired));
        let mut out = [0u8; 128];
        let len = lan().time_exceeded(&p, &mut out).unwrap();
        let e = &out[..len];
        assert_eq!(
            (&e[12..16], &e[16..20]),
            (&[100, 64, 1, 1][..], &[100, 64, 2, 20][..])
        );
        assert_eq!((e[20], e[21]), (11, 0));
        assert_eq!(
            &e[28..],
            &p[..28],
            "the header and 8 bytes, as they arrived"
        );
        assert!(checksums_ok(e));
        let mut error = ipv4_echo([100, 64, 2, 20], [100, 64, 1, 10], b"");
        error[20] = 3;
        assert_eq!(lan().time_exceeded(&error, &mut out), None);
    }

    #[test]
    fn delivers_with_an_ethernet_header_in_place() {
        let p = ipv4_udp([100, 64, 2, 20], [100, 64, 1, 10], 1, 2, b"hi");
        let (v, buf) = run(&p);
        assert_eq!(
            v,
            Ingress::Deliver {
                frame: 2..16 + p.len()
            }
        );
        assert_eq!(&buf[2..8], &DEV_MAC);
        assert_eq!(&buf[8..14], &GW_MAC);
        assert_eq!(&buf[14..16], &[0x08, 0x00]);
        assert_eq!(buf[16 + 8], 63);
        assert!(checksums_ok(&buf[16..]));
    }

    #[test]
    fn cryptokey_routing_and_lan_checks() {
        let check = |src: [u8; 4], dst: [u8; 4], expect| {
            assert_eq!(
                run(&ipv4_udp(src, dst, 1, 2, b"x")).0,
                Ingress::Drop(expect),
                "{src:?} -> {dst:?}"
            );
        };
        check(
            [100, 64, 3, 20],
            [100, 64, 1, 10],
            IngressDrop::SourceNotCertified,
        );
        check(
            [100, 64, 1, 10],
            [100, 64, 1, 10],
            IngressDrop::SourceNotCertified,
        );
        check([100, 64, 2, 20], [100, 64, 9, 10], IngressDrop::NotOurLan);
        check([100, 64, 2, 20], [100, 64, 1, 255], IngressDrop::NotOurLan);
        let mut dying = ipv4_udp([100, 64, 2, 20], [100, 64, 1, 10], 1, 2, b"x");
        dying[8] = 1;
        ipv4::fill_header_checksum(&mut dying, 20);
        assert_eq!(run(&dying).0, Ingress::Drop(IngressDrop::TtlExpired));
        assert_eq!(run(&[0x60; 40]).0, Ingress::Drop(IngressDrop::NotIpv4));
        assert_eq!(run(&[0x45; 10]).0, Ingress::Drop(IngressDrop::Malformed));
    }

    #[test]
    fn packets_for_the_gateway_are_served_not_delivered() {
        let p = ipv4_udp([100, 64, 2, 1], [100, 64, 1, 1], 53, 53, b"dns");
        assert_eq!(
            run(&p).0,
            Ingress::ToGateway {
                packet: 16..16 + p.len()
            }
        );
        let spoofed = ipv4_udp([100, 64, 3, 1], [100, 64, 1, 1], 53, 53, b"dns");
        assert_eq!(
            run(&spoofed).0,
            Ingress::Drop(IngressDrop::SourceNotCertified)
        );
    }

    /// An address of the block nobody holds is delivered to nobody: no ARP is asked, so no
    /// device can answer for it (issue 49, finding 7).
    #[test]
    fn an_address_nobody_holds_is_not_delivered() {
        let (v, _) = run(&ipv4_udp([100, 64, 2, 20], [100, 64, 1, 77], 1, 2, b"x"));
        assert_eq!(v, Ingress::Drop(IngressDrop::NoHolder));
    }

    #[test]
    fn syn_ack_is_clamped_on_the_way_in() {
        let mut p = ipv4_tcp([100, 64, 2, 20], [100, 64, 1, 10], 0x12, Some(1460), &[]);
        ipv4::fill_header_checksum(&mut p, 20);
        let (v, buf) = run(&p);
        assert!(matches!(v, Ingress::Deliver { .. }));
        assert_eq!(u16::from_be_bytes([buf[16 + 44], buf[16 + 45]]), 1380);
        assert!(checksums_ok(&buf[16..]));
    }

    #[test]
    fn no_headroom_is_an_error_not_a_panic() {
        let p = ipv4_udp([100, 64, 2, 20], [100, 64, 1, 10], 1, 2, b"x");
        let mut buf = p.clone();
        assert_eq!(
            lan().deliver(&mut buf, 0..p.len(), &peer_blocks(), &Leases, Sums::Full),
            Ingress::Drop(IngressDrop::NoHeadroom)
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_packets_never_panic(ip in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600)) {
            let _ = run(&ip);
        }
    }
}
