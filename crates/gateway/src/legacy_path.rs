//! The LAN path of a fixed-address device (the legacy map, docs/protocol.md §6): what the
//! gateway does with its frames, and with packets and answers for it.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::Ipv4Addr;

use crate::testutil::{GW_MAC, checksums_ok, eth, ipv4_echo, ipv4_tcp, ipv4_udp, lan};
use crate::{
    BROADCAST, ETHERTYPE_ARP, Egress, EgressDrop, Ingress, Lan, Legacy, Neighbors, Netmap,
    ReplyKind, Sums,
};

/// The site's 192.0.2.0/25 onto 100.64.1.128/25; the old router was 192.0.2.1.
fn site() -> Lan {
    Lan {
        legacy: Some(Legacy {
            map: Netmap::new(
                "192.0.2.0/25".parse().unwrap(),
                "100.64.1.128/25".parse().unwrap(),
            )
            .unwrap(),
            gateway: Ipv4Addr::new(192, 0, 2, 1),
            router: None,
        }),
        ..lan()
    }
}

const PLC_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x14];
const OTHER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x15];
const PLC: [u8; 4] = [192, 0, 2, 20];
const PLC_VIP: [u8; 4] = [100, 64, 1, 148];
const OLD_ROUTER: [u8; 4] = [192, 0, 2, 1];
const GW: [u8; 4] = [100, 64, 1, 1];
const REMOTE: [u8; 4] = [100, 64, 2, 20];

/// The PLC is declared: its overlay address is held by its MAC.
struct Declared;

impl Neighbors for Declared {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        HashMap::from([(Ipv4Addr::from(PLC_VIP), PLC_MAC)])
            .get(&ip)
            .copied()
    }
}

fn src(p: &[u8]) -> [u8; 4] {
    p[12..16].try_into().unwrap()
}

fn dst(p: &[u8]) -> [u8; 4] {
    p[16..20].try_into().unwrap()
}

/// A broadcast ARP request from `mac` at `sender` for `target`.
fn arp_request(mac: [u8; 6], sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut arp = vec![0u8; 42];
    crate::write_eth(&mut arp, BROADCAST, mac, ETHERTYPE_ARP);
    arp[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp[22..28].copy_from_slice(&mac);
    arp[28..32].copy_from_slice(&sender);
    arp[38..42].copy_from_slice(&target);
    arp
}

/// Runs a frame from `mac` through the site's gateway; the verdict, the frame, `out`.
fn egress(mac: [u8; 6], ip: &[u8], partial: bool) -> (Egress, Vec<u8>, Vec<u8>) {
    let mut frame = eth(GW_MAC, mac, ip);
    let mut out = vec![0u8; 2048];
    let len = frame.len();
    let v = site().handle_frame(&mut frame, len, partial, &Declared, &mut out);
    (v, frame, out)
}

/// Its packets leave in the overlay's terms, with every checksum right, whether the kernel
/// left the transport checksum partial or not.
#[test]
fn a_fixed_devices_packets_leave_with_its_overlay_address() {
    for ip in [
        ipv4_udp(PLC, REMOTE, 502, 40000, b"holding registers"),
        ipv4_tcp(PLC, REMOTE, 0x12, Some(1460), b""),
        ipv4_echo(PLC, REMOTE, b"ping"),
    ] {
        let (v, frame, _) = egress(PLC_MAC, &ip, false);
        let Egress::Forward {
            packet, dst: to, ..
        } = v
        else {
            panic!("{v:?}");
        };
        assert_eq!(to, Ipv4Addr::from(REMOTE));
        let p = &frame[packet];
        assert_eq!((src(p), dst(p)), (PLC_VIP, REMOTE));
        assert!(checksums_ok(p));
    }
}

/// Another MAC sending from the PLC's address, or the PLC from an address it does not
/// hold, is a spoofer.
#[test]
fn a_fixed_address_sent_from_another_mac_is_spoofed() {
    let (v, _, _) = egress(OTHER_MAC, &ipv4_udp(PLC, REMOTE, 1, 2, b"x"), false);
    assert_eq!(v, Egress::Drop(EgressDrop::Spoofed));
    let (v, _, _) = egress(
        PLC_MAC,
        &ipv4_udp([192, 0, 2, 21], REMOTE, 1, 2, b"x"),
        false,
    );
    assert_eq!(v, Egress::Drop(EgressDrop::Spoofed));
}

/// To the device, the gateway is the old router: ARP for it is answered with the gateway's
/// MAC, a claim of it is answered with an announcement, a ping to it comes back from it.
#[test]
fn the_old_routers_address_is_the_gateways() {
    let mut arp = arp_request(PLC_MAC, PLC, OLD_ROUTER);
    let mut out = vec![0u8; 64];
    let len = arp.len();
    let v = site().handle_frame(&mut arp.clone(), len, false, &Declared, &mut out);
    assert_eq!(
        v,
        Egress::Reply {
            len: 42,
            kind: ReplyKind::Arp
        }
    );
    assert_eq!(&out[22..28], &GW_MAC);
    assert_eq!(&out[28..32], &OLD_ROUTER);
    // Another box claims it.
    arp[28..32].copy_from_slice(&OLD_ROUTER);
    let v = site().handle_frame(&mut arp, len, false, &Declared, &mut out);
    assert_eq!(
        v,
        Egress::Reply {
            len: 42,
            kind: ReplyKind::ArpAnnounce
        }
    );
    assert_eq!(
        (&out[28..32], &out[38..42]),
        (&OLD_ROUTER[..], &OLD_ROUTER[..])
    );

    let (v, _, out) = egress(PLC_MAC, &ipv4_echo(PLC, OLD_ROUTER, b"hello"), false);
    let Egress::Reply {
        len,
        kind: ReplyKind::EchoReply,
    } = v
    else {
        panic!("{v:?}");
    };
    let reply = &out[14..len];
    assert_eq!((src(reply), dst(reply)), (OLD_ROUTER, PLC));
    assert_eq!(&out[..6], &PLC_MAC);
    assert!(checksums_ok(reply));
}

/// A DNS question to the old router's address reaches the service as one from the
/// device's overlay address, and the answer goes back from the old router to the device.
#[test]
fn dns_at_the_old_routers_address_is_answered_from_it() {
    let (v, _, _) = egress(PLC_MAC, &ipv4_udp(PLC, OLD_ROUTER, 5353, 53, b"q"), false);
    let Egress::Dns {
        client_mac,
        client_ip,
        client_port,
        ..
    } = v
    else {
        panic!("{v:?}");
    };
    assert_eq!(
        (client_mac, client_ip, client_port),
        (PLC_MAC, Ipv4Addr::from(PLC_VIP), 5353)
    );
    let mut out = [0u8; 128];
    let len = site()
        .udp_frame(client_mac, client_ip, 53, client_port, b"answer", &mut out)
        .unwrap();
    let ip = &out[14..len];
    assert_eq!((src(ip), dst(ip)), (OLD_ROUTER, PLC));
    assert!(checksums_ok(ip));
}

/// A packet whose TTL runs out at the gateway gets a time-exceeded from the old router's
/// address, quoting the packet as the device sent it.
#[test]
fn an_icmp_error_for_the_device_quotes_what_it_sent() {
    let mut ip = ipv4_udp(PLC, REMOTE, 33434, 33435, b"traceroute");
    ip[8] = 1;
    ip[10..12].fill(0);
    let sum = crate::checksum::internet(&ip[..20]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let (v, _, out) = egress(PLC_MAC, &ip, false);
    let Egress::Reply {
        len,
        kind: ReplyKind::TimeExceeded,
    } = v
    else {
        panic!("{v:?}");
    };
    let reply = &out[14..len];
    assert_eq!((src(reply), dst(reply)), (OLD_ROUTER, PLC));
    assert!(checksums_ok(reply));
    let quote = &reply[28..];
    assert_eq!(&quote[..28], &ip[..28], "the quoted header and ports");
}

/// From the tunnel, a packet for the device's overlay address reaches it at its own, with
/// sums that verify (or, deferred, a partial sum the NIC completes rightly).
#[test]
fn packets_for_the_overlay_address_reach_the_device_at_its_own() {
    let blocks = ["100.64.2.0/24".parse().unwrap()];
    let ip = ipv4_udp(REMOTE, PLC_VIP, 40000, 502, b"read coils");
    let mut buf = vec![0u8; 16 + ip.len()];
    buf[16..].copy_from_slice(&ip);
    let v = site().deliver(&mut buf, 16..16 + ip.len(), &blocks, &Declared, Sums::Full);
    assert_eq!(
        v,
        Ingress::Deliver {
            frame: 2..16 + ip.len()
        }
    );
    assert_eq!(&buf[2..8], &PLC_MAC);
    let p = &buf[16..];
    assert_eq!((src(p), dst(p)), (REMOTE, PLC));
    assert!(checksums_ok(p));
    // Nobody holds the next overlay address: nothing to deliver to.
    let ip = ipv4_udp(REMOTE, [100, 64, 1, 149], 1, 2, b"x");
    let mut buf = vec![0u8; 16 + ip.len()];
    buf[16..].copy_from_slice(&ip);
    let v = site().deliver(&mut buf, 16..16 + ip.len(), &blocks, &Declared, Sums::Full);
    assert_eq!(v, Ingress::Drop(crate::IngressDrop::NoHolder));
}

/// A partial (offload) checksum leaves as the pseudo-header's sum of the new addresses.
#[test]
fn a_partial_checksum_follows_the_source() {
    let full = ipv4_udp(PLC, REMOTE, 7, 9, b"partial");
    let mut ip = full.clone();
    let pseudo = |s: [u8; 4], d: [u8; 4]| {
        let mut sum = 0u32;
        for w in [
            u16::from_be_bytes([s[0], s[1]]),
            u16::from_be_bytes([s[2], s[3]]),
            u16::from_be_bytes([d[0], d[1]]),
            u16::from_be_bytes([d[2], d[3]]),
            17,
            u16::try_from(ip_len(&full) - 20).unwrap(),
        ] {
            sum += u32::from(w);
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        u16::try_from(sum).unwrap()
    };
    ip[26..28].copy_from_slice(&pseudo(PLC, REMOTE).to_be_bytes());
    // Completed here: the sum verifies over the new source.
    let (v, frame, _) = egress(PLC_MAC, &ip, true);
    let Egress::Forward { packet, .. } = v else {
        panic!("{v:?}");
    };
    assert!(checksums_ok(&frame[packet]));
    // Left to the far end: the pseudo-header's sum over the new source.
    let deferring = Lan {
        defer_checksums: true,
        ..site()
    };
    let mut frame = eth(GW_MAC, PLC_MAC, &ip);
    let mut out = vec![0u8; 2048];
    let len = frame.len();
    let v = deferring.handle_frame(&mut frame, len, true, &Declared, &mut out);
    let Egress::Forward {
        packet,
        checksum_deferred: true,
        ..
    } = v
    else {
        panic!("{v:?}");
    };
    assert_eq!(
        &frame[packet][26..28],
        &pseudo(PLC_VIP, REMOTE).to_be_bytes()
    );
}

fn ip_len(p: &[u8]) -> usize {
    usize::from(u16::from_be_bytes([p[2], p[3]]))
}

/// Without a legacy map, the same frames are what they always were: a spoofer.
#[test]
fn without_a_map_the_subnet_is_nobodys() {
    let mut frame = eth(GW_MAC, PLC_MAC, &ipv4_udp(PLC, REMOTE, 1, 2, b"x"));
    let mut out = vec![0u8; 2048];
    let len = frame.len();
    let v = lan().handle_frame(&mut frame, len, false, &Declared, &mut out);
    assert_eq!(v, Egress::Drop(EgressDrop::Spoofed));
    assert!(!lan().is_gateway_address(Ipv4Addr::from(OLD_ROUTER)));
    assert!(site().is_gateway_address(Ipv4Addr::from(GW)));
}

/// A table that learns whatever it is told, and remembers what it heard.
#[derive(Default)]
struct Learning(std::cell::RefCell<Vec<(Ipv4Addr, [u8; 6])>>);

impl Neighbors for Learning {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        Declared.leased_mac(ip).or_else(|| {
            self.0
                .borrow()
                .iter()
                .find(|(at, _)| *at == ip)
                .map(|(_, mac)| *mac)
        })
    }

    fn heard(&self, ip: Ipv4Addr, mac: [u8; 6]) {
        self.0.borrow_mut().push((ip, mac));
    }
}

/// A device not declared is heard at its overlay address, by its ARP or its packets' source,
/// only while nobody holds the address; the old router's address and the subnet's own are
/// never heard; once learned, its packets pass as a declared device's.
#[test]
fn an_undeclared_device_is_heard_at_its_overlay_address() {
    const METER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x21];
    let meter = [192, 0, 2, 21];
    let meter_vip = Ipv4Addr::new(100, 64, 1, 149);
    let table = Learning::default();
    let mut out = vec![0u8; 2048];
    for sender in [OLD_ROUTER, [192, 0, 2, 0], [192, 0, 2, 127], PLC, meter] {
        let mut f = arp_request(METER_MAC, sender, OLD_ROUTER);
        let len = f.len();
        site().handle_frame(&mut f, len, false, &table, &mut out);
    }
    assert_eq!(*table.0.borrow(), vec![(meter_vip, METER_MAC)]);

    let table = Learning::default();
    let mut f = eth(GW_MAC, METER_MAC, &ipv4_udp(meter, REMOTE, 1, 2, b"x"));
    let len = f.len();
    let v = site().handle_frame(&mut f, len, false, &table, &mut out);
    assert!(matches!(v, Egress::Forward { .. }), "{v:?}");
    assert_eq!(*table.0.borrow(), vec![(meter_vip, METER_MAC)]);
    // Another MAC at the same address: not heard again, a spoofer.
    let mut f = eth(GW_MAC, OTHER_MAC, &ipv4_udp(meter, REMOTE, 1, 2, b"x"));
    let v = site().handle_frame(&mut f, len, false, &table, &mut out);
    assert_eq!(v, Egress::Drop(EgressDrop::Spoofed));
    assert_eq!(table.0.borrow().len(), 1);
}

/// A DHCP device of the block, at 100.64.1.10.
const LAPTOP_MAC: [u8; 6] = [0x02, 0xbb, 0, 0, 0, 10];
const LAPTOP: [u8; 4] = [100, 64, 1, 10];

/// The PLC and the laptop are both held.
struct Both;

impl Neighbors for Both {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if ip == Ipv4Addr::from(LAPTOP) {
            return Some(LAPTOP_MAC);
        }
        Declared.leased_mac(ip)
    }
}

/// A fixed-address device and a device of the block share the wire but not a subnet: the
/// gateway answers the laptop's ARP for the PLC's overlay address, and carries their packets
/// back onto the LAN each way, readdressed to the holder, in the receiver's terms, with sums
/// that verify; devices of one kind still reach each other directly.
#[test]
fn the_two_kinds_on_one_wire_reach_each_other_through_the_gateway() {
    let mut out = vec![0u8; 2048];
    // The laptop asks who has the PLC's overlay address.
    let mut arp = arp_request(LAPTOP_MAC, LAPTOP, PLC_VIP);
    let len = arp.len();
    let v = site().handle_frame(&mut arp, len, false, &Both, &mut out);
    assert_eq!(
        v,
        Egress::Reply {
            len: 42,
            kind: ReplyKind::Arp
        }
    );

    let run = |from: [u8; 6], ip: Vec<u8>, partial: bool| {
        let mut frame = eth(GW_MAC, from, &ip);
        let mut out = vec![0u8; 2048];
        let len = frame.len();
        let v = site().handle_frame(&mut frame, len, partial, &Both, &mut out);
        (v, frame)
    };
    // Laptop to PLC: to the PLC's MAC, at its own address.
    let (v, frame) = run(
        LAPTOP_MAC,
        ipv4_tcp(LAPTOP, PLC_VIP, 0x02, Some(1460), b""),
        false,
    );
    let Egress::Hairpin { frame: f } = v else {
        panic!("{v:?}");
    };
    let f = &frame[f];
    assert_eq!((&f[..6], &f[6..12]), (&PLC_MAC[..], &GW_MAC[..]));
    assert_eq!((src(&f[14..]), dst(&f[14..])), (LAPTOP, PLC));
    assert_eq!(f[14 + 8], 63, "the TTL went down");
    assert!(checksums_ok(&f[14..]));
    // PLC to laptop: from its overlay address.
    let full = ipv4_udp(PLC, LAPTOP, 502, 40000, b"coils");
    let (v, frame) = run(PLC_MAC, full, false);
    let Egress::Hairpin { frame: f } = v else {
        panic!("{v:?}");
    };
    let f = &frame[f];
    assert_eq!(&f[..6], &LAPTOP_MAC[..]);
    assert_eq!((src(&f[14..]), dst(&f[14..])), (PLC_VIP, LAPTOP));
    assert!(checksums_ok(&f[14..]));
    // Nobody holds the overlay address next to the PLC's; laptops reach laptops directly.
    let (v, _) = run(
        LAPTOP_MAC,
        ipv4_udp(LAPTOP, [100, 64, 1, 149], 1, 2, b"x"),
        false,
    );
    assert_eq!(v, Egress::Drop(EgressDrop::NoHolder));
    let (v, _) = run(
        LAPTOP_MAC,
        ipv4_udp(LAPTOP, [100, 64, 1, 11], 1, 2, b"x"),
        false,
    );
    assert_eq!(v, Egress::Drop(EgressDrop::LocalDestination));
}

const ROUTER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x01];

/// The site beside its router (192.0.2.1 stays the devices' gateway; the adapter is .2).
fn beside() -> Lan {
    let mut lan = site();
    lan.legacy = lan.legacy.map(|l| Legacy {
        gateway: Ipv4Addr::new(192, 0, 2, 2),
        router: Some(Ipv4Addr::from(OLD_ROUTER)),
        ..l
    });
    lan
}

/// The PLC declared; the router's MAC heard once `known`; what was heard, remembered.
#[derive(Default)]
struct RouterTable {
    known: bool,
    heard: std::cell::RefCell<Vec<[u8; 6]>>,
}

impl Neighbors for RouterTable {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        Declared.leased_mac(ip)
    }

    fn heard(&self, _: Ipv4Addr, mac: [u8; 6]) {
        self.heard.borrow_mut().push(mac);
    }

    fn router_mac(&self) -> Option<[u8; 6]> {
        self.known.then_some(ROUTER_MAC)
    }

    fn heard_router(&self, mac: [u8; 6]) {
        self.heard.borrow_mut().push(mac);
    }
}

/// Beside the site's router: its ARP teaches the table its MAC; what it forwards passes
/// from any address of the subnet, and teaches nothing; another MAC still sends only from
/// what it holds; every packet for a mapped address goes to the router's MAC, and none
/// while it is not known.
#[test]
fn beside_a_router_its_mac_vouches_for_the_subnet_and_takes_the_replies() {
    let table = RouterTable {
        known: true,
        ..RouterTable::default()
    };
    let mut out = vec![0u8; 2048];
    let mut arp = arp_request(ROUTER_MAC, OLD_ROUTER, [192, 0, 2, 2]);
    let len = arp.len();
    let v = beside().handle_frame(&mut arp, len, false, &table, &mut out);
    assert_eq!(
        v,
        Egress::Reply {
            len: 42,
            kind: ReplyKind::Arp
        },
        "the router asks for the adapter's own address"
    );
    assert_eq!(*table.heard.borrow(), vec![ROUTER_MAC]);
    table.heard.borrow_mut().clear();

    let undeclared = [192, 0, 2, 30];
    let mut f = eth(
        GW_MAC,
        ROUTER_MAC,
        &ipv4_udp(undeclared, REMOTE, 1, 2, b"x"),
    );
    let len = f.len();
    let v = beside().handle_frame(&mut f, len, false, &table, &mut out);
    let Egress::Forward { packet, .. } = v else {
        panic!("{v:?}");
    };
    assert_eq!(src(&f[packet]), [100, 64, 1, 158]);
    assert!(
        table.heard.borrow().is_empty(),
        "nothing learned from the router"
    );
    let mut f = eth(GW_MAC, OTHER_MAC, &ipv4_udp(undeclared, REMOTE, 1, 2, b"x"));
    let v = beside().handle_frame(&mut f, len, false, &table, &mut out);
    assert_eq!(v, Egress::Drop(EgressDrop::Spoofed));

    let blocks = ["100.64.2.0/24".parse().unwrap()];
    let ip = ipv4_udp(REMOTE, PLC_VIP, 40000, 502, b"read");
    let mut buf = vec![0u8; 16 + ip.len()];
    buf[16..].copy_from_slice(&ip);
    let v = beside().deliver(&mut buf, 16..16 + ip.len(), &blocks, &table, Sums::Full);
    assert!(matches!(v, Ingress::Deliver { .. }), "{v:?}");
    assert_eq!(
        &buf[2..8],
        &ROUTER_MAC,
        "to the router, not the PLC's own MAC"
    );
    assert_eq!(dst(&buf[16..]), PLC);
    let unknown = RouterTable::default();
    let mut buf = vec![0u8; 16 + ip.len()];
    buf[16..].copy_from_slice(&ip);
    let v = beside().deliver(&mut buf, 16..16 + ip.len(), &blocks, &unknown, Sums::Full);
    assert_eq!(v, Ingress::Drop(crate::IngressDrop::NoHolder));
}

/// A valid IPv4 header from the PLC to `dst` with `proto`, `ttl` and the fragment field
/// `frag`, before `payload` (anything: a transport header or an ICMP message and its quote).
fn packet_from_the_plc(dst: [u8; 4], proto: u8, ttl: u8, frag: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = ipv4_udp(PLC, dst, 1, 2, &[]);
    p.truncate(20);
    p.extend_from_slice(payload);
    let total = u16::try_from(p.len()).unwrap();
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p[6..8].copy_from_slice(&frag.to_be_bytes());
    p[8] = ttl;
    p[9] = proto;
    p[10..12].fill(0);
    let sum = crate::checksum::internet(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p
}

proptest::proptest! {
    /// Any packet from a fixed device (a valid header, anything after it: TCP, UDP, ICMP
    /// errors with any quote, fragments) through the site's gateway, and beside a router, to
    /// the tunnel, the old router, a DHCP device or itself; and the same bytes from the
    /// tunnel; sums whole or partial: a verdict, never a panic, and what leaves lies within
    /// the frame.
    #[test]
    fn any_packet_of_a_fixed_device_is_judged_never_a_panic(
        mut payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        proto in proptest::prop_oneof![proptest::prelude::Just(1u8), proptest::prelude::Just(6), proptest::prelude::Just(17), proptest::prelude::any::<u8>()],
        dst in proptest::prop_oneof![proptest::prelude::Just(REMOTE), proptest::prelude::Just(OLD_ROUTER), proptest::prelude::Just(LAPTOP), proptest::prelude::Just(PLC_VIP)],
        ttl in 0u8..3,
        frag in proptest::prop_oneof![proptest::prelude::Just(0u16), proptest::prelude::Just(0x4000), proptest::prelude::Just(0x2000), proptest::prelude::any::<u16>()],
        error_type in proptest::prop_oneof![proptest::prelude::Just(3u8), proptest::prelude::Just(11), proptest::prelude::any::<u8>()],
        partial in proptest::prelude::any::<bool>(),
        beside_router in proptest::prelude::any::<bool>(),
    ) {
        let lan = if beside_router { beside() } else { site() };
        let table = RouterTable { known: true, ..RouterTable::default() };
        // ICMP errors, with quotes of every length, more often than chance would make them.
        if proto == 1 && let Some(t) = payload.first_mut() {
            *t = error_type;
        }
        let ip = packet_from_the_plc(dst, proto, ttl, frag, &payload);
        let mut frame = eth(GW_MAC, PLC_MAC, &ip);
        let mut out = vec![0u8; 2048];
        let len = frame.len();
        match lan.handle_frame(&mut frame, len, partial, &table, &mut out) {
            Egress::Forward { packet, .. } | Egress::Fragment { packet, .. } => {
                proptest::prop_assert!(packet.end <= frame.len());
                proptest::prop_assert_eq!(src(&frame[packet]), PLC_VIP);
            }
            Egress::Hairpin { frame: f } => proptest::prop_assert!(f.end <= frame.len()),
            Egress::Reply { len, .. } => proptest::prop_assert!(len <= out.len()),
            _ => {}
        }
        let mut ip = ip;
        ip[12..16].copy_from_slice(&REMOTE);
        ip[16..20].copy_from_slice(&PLC_VIP);
        ip[10..12].fill(0);
        let sum = crate::checksum::internet(&ip[..20]);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let mut buf = vec![0u8; 16 + ip.len()];
        buf[16..].copy_from_slice(&ip);
        let sums = if partial { Sums::Partial } else { Sums::Full };
        let blocks = ["100.64.2.0/24".parse().unwrap()];
        let _ = lan.deliver(&mut buf, 16..16 + ip.len(), &blocks, &table, sums);
    }
}
