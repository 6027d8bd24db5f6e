//! What may cross between this host and the overlay, both ways, whichever edge carries it
//! (the TUN device, or the userspace stack): from the host only packets from our vIP to the
//! overlay; from peers only packets from their certified blocks to our vIP. And the node's
//! counters, of both edges.

use std::net::IpAddr;

use cyphonic_pipeline::DropReason;
use cyphonic_tunnel::bump;

/// Our addresses and the overlay's: what packets from the host and from peers are checked
/// against (the userspace stack's own, so that both edges judge by one description).
pub use cyphonic_netstack::Addresses as Ours;

/// The smallest IPv4 header.
const IPV4_MIN: usize = 20;
/// IPv6's fixed header.
const IPV6_HEADER: usize = 40;

cyphonic_telemetry::counters! {
    /// The node's counters: its TUN device's, or its userspace stack's, and the checks of
    /// what crosses between the host and the overlay.
    pub struct NodeCounters {
        /// Packets read from the TUN device.
        tun_read,
        /// Packets from the host that are not IPv4, nor IPv6 where we carry it.
        drop_tun_not_ipv4,
        /// Packets from the host with a malformed IPv4 or IPv6 header.
        drop_tun_malformed,
        /// Packets from the host from another source than our vIP.
        drop_tun_not_our_source,
        /// Packets from the host to a destination outside the overlay, or to ourselves.
        drop_tun_not_overlay,
        /// Packets written to the TUN device.
        tun_written,
        /// Packets the TUN device refused.
        tun_write_failed,
        /// Decrypted packets that are not IPv4, nor IPv6 where we carry it.
        drop_inner_not_ipv4,
        /// Decrypted packets with a malformed IPv4 or IPv6 header.
        drop_inner_malformed,
        /// Decrypted packets whose source the sending peer is not certified for.
        drop_source_not_certified,
        /// Decrypted packets not addressed to our vIP.
        drop_not_for_us,
        /// Super-packets read from the TUN device (offloads), each cut into segments.
        tun_coalesced,
        /// Segments cut from them.
        tun_segments,
        /// Super-packets that could not be cut (malformed, or a kind the overlay does not carry).
        drop_tun_coalesced,
        /// Packets longer than the buffers (cut short by the kernel).
        drop_tun_truncated,
        /// Super-packets written to the TUN device (offloads): runs of one flow merged.
        tun_merged,
        /// The packets in them (counted in `tun_written` too).
        tun_merged_segments,
        /// Packets the tunnel delivered into the userspace stack.
        stack_received,
        /// Packets for the userspace stack dropped: it had as many waiting as it holds.
        drop_stack_full,
        /// Packets the userspace stack sent into the tunnel.
        stack_sent,
        /// Packets the userspace stack made that were not from us to the overlay, or not in a buffer.
        drop_stack_not_overlay,
        /// Connections taken on the userspace node's proxy and forwards.
        proxy_accepted,
        /// Of those, refused: not SOCKS5 CONNECT, a name unknown or outside the overlay, too many.
        proxy_refused,
        /// Of those, whose overlay end did not answer or refused.
        proxy_unreachable,
        /// DNS messages the stub exchanged with the overlay through the userspace stack.
        stack_dns,
        /// Of those, dropped: a queue between the stub and the stack was full.
        drop_stack_dns,
    }
}

/// A packet's source and destination, if `p` holds a well-formed IPv4 header, or IPv6 one
/// when `v6` (its length field within the packet); the error says whether it is neither at
/// all (`false`) or malformed (`true`).
fn addresses(p: &[u8], v6: bool) -> Result<(IpAddr, IpAddr), bool> {
    let first = *p.first().ok_or(true)?;
    let word = |at: usize| {
        p.get(at..at + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or(true)
    };
    match first >> 4 {
        4 => {
            let header = usize::from(first & 0x0f) * 4;
            let total = word(2)?;
            if header < IPV4_MIN || total < header || total > p.len() {
                return Err(true);
            }
            let src = <[u8; 4]>::try_from(p.get(12..16).ok_or(true)?).map_err(|_| true)?;
            let dst = <[u8; 4]>::try_from(p.get(16..20).ok_or(true)?).map_err(|_| true)?;
            Ok((src.into(), dst.into()))
        }
        6 if v6 => {
            if p.len() < IPV6_HEADER || IPV6_HEADER + word(4)? > p.len() {
                return Err(true);
            }
            let src = <[u8; 16]>::try_from(&p[8..24]).map_err(|_| true)?;
            let dst = <[u8; 16]>::try_from(&p[24..40]).map_err(|_| true)?;
            Ok((src.into(), dst.into()))
        }
        _ => Err(false),
    }
}

/// Our address of `dst`'s family, and whether `dst` lies in the overlay of that family.
fn of(ours: &Ours, dst: IpAddr) -> (Option<IpAddr>, bool) {
    match dst {
        IpAddr::V4(d) => (Some(ours.vip.into()), ours.overlay.contains(&d)),
        IpAddr::V6(d) => ours
            .ipv6
            .map_or((None, false), |(vip, o)| (Some(vip.into()), o.contains(&d))),
    }
}

/// Why a packet from the host does not go into the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOutbound {
    /// Neither IPv4 nor IPv6 where we carry it.
    NotIp,
    /// A malformed header.
    Malformed,
    /// Not from our vIP.
    NotOurSource,
    /// Not to the overlay, or to ourselves.
    NotOverlay,
}

/// Where a packet from the host (or from our userspace stack) goes: its destination in the
/// overlay, or why it does not.
pub fn destination(p: &[u8], ours: &Ours) -> Result<IpAddr, NotOutbound> {
    match addresses(p, ours.ipv6.is_some()) {
        Err(false) => Err(NotOutbound::NotIp),
        Err(true) => Err(NotOutbound::Malformed),
        Ok((src, dst)) => match of(ours, dst) {
            (vip, _) if Some(src) != vip => Err(NotOutbound::NotOurSource),
            (vip, inside) if !inside || Some(dst) == vip => Err(NotOutbound::NotOverlay),
            _ => Ok(dst),
        },
    }
}

/// [`destination`] of a packet read from the TUN device, what does not go counted.
pub fn outbound(p: &[u8], ours: &Ours, c: &NodeCounters) -> Option<IpAddr> {
    destination(p, ours)
        .map_err(|why| {
            bump(match why {
                NotOutbound::NotIp => &c.drop_tun_not_ipv4,
                NotOutbound::Malformed => &c.drop_tun_malformed,
                NotOutbound::NotOurSource => &c.drop_tun_not_our_source,
                NotOutbound::NotOverlay => &c.drop_tun_not_overlay,
            });
        })
        .ok()
}

/// Whether a decrypted packet from a peer certified for `blocks` may go into the TUN device:
/// only a well-formed IPv4 packet, or IPv6 one where we carry it, from those blocks
/// (cryptokey routing) to our own vIP of its family. Another address of our block, or its
/// broadcast, would be the host's to route on, out of the tunnel and in clear. The error
/// names the counter and the pipeline's drop reason.
pub fn inbound<'c>(
    p: &[u8],
    blocks: &[ipnet::IpNet],
    ours: &Ours,
    c: &'c NodeCounters,
) -> Result<(), (&'c std::sync::atomic::AtomicU64, DropReason)> {
    match addresses(p, ours.ipv6.is_some()) {
        Err(false) => Err((&c.drop_inner_not_ipv4, DropReason::Malformed)),
        Err(true) => Err((&c.drop_inner_malformed, DropReason::Malformed)),
        Ok((src, _)) if !blocks.iter().any(|b| b.contains(&src)) => {
            Err((&c.drop_source_not_certified, DropReason::Policy))
        }
        Ok((_, dst)) if of(ours, dst).0 != Some(dst) => {
            Err((&c.drop_not_for_us, DropReason::Policy))
        }
        Ok(_) => Ok(()),
    }
}

/// [`inbound`] for a packet the engine accepted, as both edges' sinks judge it: what may
/// not go in is counted, and the pipeline gets its reason.
pub fn admit(
    item: &cyphonic_tunnel::Accepted,
    ours: &Ours,
    c: &NodeCounters,
) -> Result<(), DropReason> {
    let packet = item.packet();
    inbound(&item.buf()[packet], &item.peer().blocks, ours, c).map_err(|(counter, reason)| {
        bump(counter);
        reason
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    /// A node at 100.64.3.1 without IPv6.
    fn v4_only() -> Ours {
        Ours {
            vip: Ipv4Addr::new(100, 64, 3, 1),
            overlay: "100.64.0.0/10".parse().unwrap_or_default(),
            ipv6: None,
        }
    }

    /// The same node with fd7a:0:1:4000::1 in the overlay's fd7a:0:1::/48.
    fn dual() -> Ours {
        Ours {
            ipv6: Some((
                "fd7a:0:1:4000::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
                "fd7a:0:1::/48".parse().unwrap_or_default(),
            )),
            ..v4_only()
        }
    }

    /// An IPv6 packet (a UDP header's worth of payload) from `src` to `dst`.
    fn packet6(src: &str, dst: &str) -> Vec<u8> {
        let addr = |a: &str| {
            a.parse::<Ipv6Addr>()
                .unwrap_or(Ipv6Addr::UNSPECIFIED)
                .octets()
        };
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        p.extend_from_slice(&addr(src));
        p.extend_from_slice(&addr(dst));
        p.extend_from_slice(&[0; 8]);
        p
    }

    /// Issue 53: with IPv6, the host's IPv6 from our address to the overlay's range goes into
    /// the tunnel and the rest is counted as IPv4's is; a peer's IPv6 from its blocks to our
    /// address goes into the device. Without IPv6, IPv6 is counted as not carried.
    #[test]
    fn ipv6_packets_are_checked_both_ways_where_we_carry_it() {
        let (ours, c) = (dual(), NodeCounters::default());
        let me = "fd7a:0:1:4000::1";
        let peer = "fd7a:0:1:200::7";
        assert_eq!(
            outbound(&packet6(me, peer), &ours, &c),
            Some(peer.parse().unwrap_or(IpAddr::from([0; 4])))
        );
        for (p, counter) in [
            (packet6("fe80::1", "ff02::2"), &c.drop_tun_not_our_source),
            (packet6(me, "2001:db8::1"), &c.drop_tun_not_overlay),
            (packet6(me, me), &c.drop_tun_not_overlay),
            (packet6(me, peer)[..39].to_vec(), &c.drop_tun_malformed),
        ] {
            let before = counter.load(Ordering::Relaxed);
            assert_eq!(outbound(&p, &ours, &c), None, "{p:?}");
            assert_eq!(counter.load(Ordering::Relaxed), before + 1, "{p:?}");
        }
        let mut long_field = packet6(me, peer);
        long_field[5] = 9;
        assert_eq!(outbound(&long_field, &ours, &c), None);

        let blocks: Vec<ipnet::IpNet> = vec![
            "100.64.2.0/24".parse().unwrap_or_default(),
            "fd7a:0:1:200::/56".parse().unwrap_or_default(),
        ];
        assert!(inbound(&packet6(peer, me), &blocks, &ours, &c).is_ok());
        for (p, counter) in [
            (packet6(peer, "fd7a:0:1:4000::2"), &c.drop_not_for_us),
            (packet6("fd7a:0:1:300::7", me), &c.drop_source_not_certified),
        ] {
            let got = inbound(&p, &blocks, &ours, &c).map_err(|(counter, _)| counter as *const _);
            assert_eq!(got, Err(counter as *const _), "{p:?}");
        }
        // Without IPv6: neither way.
        let (v4, c) = (v4_only(), NodeCounters::default());
        assert_eq!(outbound(&packet6(me, peer), &v4, &c), None);
        assert_eq!(c.drop_tun_not_ipv4.load(Ordering::Relaxed), 1);
        let got = inbound(&packet6(peer, me), &blocks, &v4, &c)
            .map_err(|(counter, _)| counter as *const _);
        assert_eq!(got, Err(&raw const c.drop_inner_not_ipv4));
    }

    fn packet(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p
    }

    /// Every packet from the host either goes to an overlay destination or is counted under
    /// its reason; nothing short or odd panics.
    #[test]
    fn outbound_packets_are_checked() {
        let ours = v4_only();
        let c = NodeCounters::default();
        let me = [100, 64, 3, 1];
        assert_eq!(
            outbound(&packet(me, [100, 64, 2, 10]), &ours, &c),
            Some(IpAddr::from([100, 64, 2, 10]))
        );
        let mut v6 = packet(me, [100, 64, 2, 10]);
        v6[0] = 0x60;
        let mut long_header = packet(me, [100, 64, 2, 10]);
        long_header[0] = 0x4f;
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0x45],
            packet(me, [100, 64, 2, 10])[..19].to_vec(),
            v6,
            long_header,
            packet([100, 64, 3, 2], [100, 64, 2, 10]),
            packet(me, [192, 0, 2, 1]),
            packet(me, me),
        ];
        for p in &cases {
            assert_eq!(outbound(p, &ours, &c), None, "{p:?}");
        }
        let counts: Vec<u64> = c.snapshot().iter().map(|(_, v)| *v).collect();
        // not IPv4, malformed, not our source, not the overlay
        assert_eq!(&counts[1..5], &[1, 4, 1, 2], "{:?}", c.snapshot());
    }

    /// A peer's packet goes into the TUN device only from its certified blocks and only to
    /// our own vIP: not to another address of our block, nor its broadcast.
    #[test]
    fn inbound_packets_go_only_to_our_vip() {
        let ours = v4_only();
        let blocks: Vec<ipnet::IpNet> = vec!["100.64.2.0/24".parse().unwrap_or_default()];
        let c = NodeCounters::default();
        let peer = [100, 64, 2, 10];
        assert!(inbound(&packet(peer, [100, 64, 3, 1]), &blocks, &ours, &c).is_ok());
        for (p, counter) in [
            (packet(peer, [100, 64, 3, 2]), &c.drop_not_for_us),
            (packet(peer, [100, 64, 3, 3]), &c.drop_not_for_us),
            (packet(peer, [255, 255, 255, 255]), &c.drop_not_for_us),
            (packet(peer, [192, 0, 2, 1]), &c.drop_not_for_us),
            (
                packet([100, 64, 9, 9], [100, 64, 3, 1]),
                &c.drop_source_not_certified,
            ),
            (
                packet(peer, [100, 64, 3, 1])[..10].to_vec(),
                &c.drop_inner_malformed,
            ),
        ] {
            let got = inbound(&p, &blocks, &ours, &c).map_err(|(counter, _)| counter as *const _);
            assert_eq!(got, Err(counter as *const _), "{p:?}");
        }
    }
}
