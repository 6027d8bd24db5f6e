//! The adapter's classify path: arbitrary Ethernet frames from the LAN (and arbitrary
//! decrypted packets from the tunnel) must never panic, and what is forwarded must be a
//! well-formed packet within the frame; with a legacy map too (fixed-address devices), and
//! over IPv6 (Neighbour Discovery, learning, forwarding and delivery).
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};

use cyphonic_gateway::{
    Egress, Fragmenter, Lan, Lan6, Legacy, Neighbors, Netmap, Sums, complete_deferred_checksum,
};

struct OneLease;

impl Neighbors for OneLease {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        // The DHCP device, and the fixed one (192.0.2.20) at its overlay address.
        [Ipv4Addr::new(100, 64, 1, 10), Ipv4Addr::new(100, 64, 1, 148)]
            .contains(&ip)
            .then_some([0x02, 0xbb, 0, 0, 0, 10])
    }

    /// One IPv6 address held; any other may be learned by anyone.
    fn holder6(&self, ip: Ipv6Addr) -> Option<[u8; 6]> {
        (ip == Ipv6Addr::new(0xfd7a, 0, 1, 0x100, 0, 0, 0, 0x10))
            .then_some([0x02, 0xbb, 0, 0, 0, 10])
    }

    fn heard6(&self, _: Ipv6Addr, _: [u8; 6]) -> bool {
        true
    }
}

fn lan() -> Lan {
    Lan {
        mac: [0x02, 0xaa, 0, 0, 0, 1],
        host_mac: [0x02, 0xf0, 0, 0, 0, 1],
        gateway_ip: Ipv4Addr::new(100, 64, 1, 1),
        block: "100.64.1.0/24".parse().expect("block"),
        overlay: "100.64.0.0/10".parse().expect("overlay"),
        inner_mtu: 1420,
        mss_clamp: true,
        defer_checksums: false,
        legacy: None,
        v6: Some(Lan6 {
            prefix: "fd7a:0:1:100::/64".parse().expect("prefix"),
            overlay: "fd7a:0:1::/48".parse().expect("overlay"),
            dns: true,
            dhcp: true,
            search: Lan6::search_list("site-a.example").expect("search list"),
        }),
    }
}

/// 192.0.2.0/25 onto 100.64.1.128/25, the old router at 192.0.2.1.
fn legacy() -> Legacy {
    Legacy {
        map: Netmap::new(
            "192.0.2.0/25".parse().expect("subnet"),
            "100.64.1.128/25".parse().expect("onto"),
        )
        .expect("one size"),
        gateway: Ipv4Addr::new(192, 0, 2, 1),
        router: None,
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let lan = Lan {
        defer_checksums: flags & 8 != 0,
        legacy: (flags & 16 != 0).then(legacy),
        ..lan()
    };
    let mut frame = rest.to_vec();
    // Steer half the inputs past the MAC filter so the IPv4 paths get exercised.
    if flags & 1 == 1 && frame.len() >= 14 {
        frame[..6].copy_from_slice(&lan.mac);
        frame[6..12].copy_from_slice(&[0x02, 0xbb, 0, 0, 0, 10]);
        let ethertype: &[u8] = match (flags & 2 != 0, flags & 4 != 0 && flags & 8 != 0) {
            (_, true) => &[0x86, 0xdd],
            (false, false) => &[0x08, 0x00],
            (true, false) => &[0x08, 0x06],
        };
        frame[12..14].copy_from_slice(ethertype);
        // With the map, from the fixed device's own address.
        if flags & 16 != 0 && frame.len() >= 30 {
            frame[26..30].copy_from_slice(&[192, 0, 2, 20]);
        }
    }
    let wire_len = frame.len() + usize::from(flags >> 5);
    let mut out = [0u8; 2048];
    match lan.handle_frame(&mut frame, wire_len, flags & 4 != 0, &OneLease, &mut out) {
        Egress::Forward {
            packet,
            checksum_deferred,
            ..
        } => {
            assert!(packet.end <= frame.len() && packet.len() <= 1420);
            if checksum_deferred {
                // What the far end does with it.
                assert!(complete_deferred_checksum(&mut frame[packet]));
            }
        }
        Egress::Fragment { packet, .. } => {
            if let Ok(mut f) = Fragmenter::new(&frame[packet], 1420) {
                let mut buf = [0u8; 1420];
                while let Some(n) = f.next_into(&mut buf) {
                    assert!(n <= 1420);
                }
            }
        }
        Egress::Forward6 { packet, .. } => {
            assert!(packet.end <= frame.len() && packet.len() <= 1420);
        }
        Egress::Reply { len, .. } => assert!(len <= out.len()),
        Egress::Hairpin { frame: f } => assert!(f.end <= frame.len()),
        _ => {}
    }
    // The same bytes as a decrypted packet from a peer.
    let mut buf = vec![0u8; 16 + rest.len()];
    buf[16..].copy_from_slice(rest);
    let peer = [
        "100.64.2.0/24".parse().expect("block"),
        "fd7a:0:1:200::/56".parse().expect("block"),
    ];
    let sums = if flags & 4 != 0 { Sums::Partial } else { Sums::Full };
    let _ = lan.deliver(&mut buf, 16..16 + rest.len(), &peer, &OneLease, sums);
});
