//! The LAN side end to end: leases, pings, names, the gateway's answers, MSS and MTU,
//! a restart, a fixed-address device, IPv6, the sparse class's own lane.

use super::*;

/// A device on each LAN gets its lease from its adapter; a ping from each crosses the
/// tunnel (capture, the engine both ways, the LAN sink) to the other, addressed to the
/// device's MAC from its gateway's, TTL down by two (each gateway a hop); both adapters' status show the lease
/// and the peer with keys.
#[test]
fn devices_on_two_adapters_lease_and_ping_each_other() {
    let link = Link::new(1);
    let (_f, mut one, mut two) = sites(&link);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, gw2_mac) = two.device.lease("sensor-two");
    assert!(one.gateway == Ipv4Addr::new(100, 64, 1, 1) && ip1 != one.gateway);
    assert!(ip2.octets()[..3] == [100, 64, 2]);

    let ping = |from: &Site, src: Ipv4Addr, gw_mac, dst: Ipv4Addr, to: &Site| {
        let echo = ipv4_echo(src.octets(), dst.octets(), b"hello");
        from.device.send(&eth(gw_mac, from.device.mac, &echo));
        to.device
            .expect("the ping across", |f| is_echo(f, src, dst))
    };
    let got = ping(&one, ip1, gw1_mac, ip2, &two);
    assert_eq!(got[..6], two.device.mac, "to the device's MAC");
    assert_eq!(got[6..12], gw2_mac, "from its gateway's");
    assert_eq!(got[IP + 8], 62, "each gateway is a hop");
    ping(&two, ip2, gw2_mac, ip1, &one);

    let leased = |d: &serde_json::Value, ip: Ipv4Addr, host: &str| {
        d["leases"].as_array().is_some_and(|l| {
            l.iter().any(|l| {
                l["vip"].as_str() == Some(&ip.to_string()) && l["hostname"].as_str() == Some(host)
            })
        })
    };
    let doc = one
        .end
        .wait_status(PATIENCE, |d| leased(d, ip1, "sensor-one"))
        .expect("gw1 shows the lease");
    let peer = &doc["peers"][0];
    assert_eq!(
        (peer["name"].as_str(), peer["established"].as_bool()),
        (Some("gw2.ovl.example"), Some(true)),
        "{doc}"
    );
    two.end
        .wait_status(PATIENCE, |d| leased(d, ip2, "sensor-two"))
        .expect("gw2 shows the lease");
    one.end.stop().expect("gw1 stops cleanly");
    two.end.stop().expect("gw2 stops cleanly");
}

/// The far gateway answers a device's ping through the tunnel (the gateway address's
/// service on the far adapter); the device's own DNS service asks the far one, through the
/// tunnel, for the far device's name (its DHCP hostname in the far zone) and answers with
/// its lease.
#[test]
fn a_device_pings_the_far_gateway_and_resolves_the_far_device_by_name() {
    let link = Link::new(2);
    let (_f, one, two) = sites(&link);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, _) = two.device.lease("sensor-two");
    let far = two.gateway;

    let echo = ipv4_echo(ip1.octets(), far.octets(), b"gateway?");
    one.device.send(&eth(gw1_mac, one.device.mac, &echo));
    let reply = one
        .device
        .expect("the far gateway's echo reply", |f| is_icmp(f, far, ip1, 0));
    assert_eq!(reply[..6], one.device.mac);

    let answered = one.resolve((ip1, gw1_mac), 0x4242, "sensor-two.gw2.ovl.example.");
    assert_eq!(answered, vec![ip2], "the far device's lease");
}

/// A SYN's MSS is clamped to what the tunnel carries (inner MTU 1420 less 40) on its way
/// across; a packet too big for the tunnel with don't-fragment set is answered by the
/// device's own gateway with fragmentation-needed naming the inner MTU, and goes nowhere.
#[test]
fn a_syn_is_clamped_and_a_packet_too_big_is_answered_with_the_mtu() {
    let link = Link::new(3);
    let (_f, one, two) = sites(&link);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, _) = two.device.lease("sensor-two");

    let syn = ipv4_tcp(ip1.octets(), ip2.octets(), 0x02, Some(1460), &[]);
    one.device.send(&eth(gw1_mac, one.device.mac, &syn));
    let got = two.device.expect("the SYN across", |f| {
        ipv4(f).is_some_and(|ip| ip[9] == 6 && ip[12..16] == ip1.octets())
    });
    let ip = ipv4(&got).expect("IPv4");
    assert_eq!(mss(ip), Some(1380), "clamped to 1420 - 40");
    assert!(checksums_ok(ip), "the checksum follows the new MSS");

    let big = ipv4_udp(ip1.octets(), ip2.octets(), 4000, 4001, &[0x5a; 1472]);
    one.device.send(&eth(gw1_mac, one.device.mac, &big));
    let error = one.device.expect("fragmentation needed", |f| {
        ipv4(f).is_some_and(|ip| ip[9] == 1 && ip[20] == 3 && ip[21] == 4)
    });
    let ip = ipv4(&error).expect("IPv4");
    assert_eq!(ip[12..16], one.gateway.octets(), "from the gateway");
    assert_eq!(ip[16..20], ip1.octets(), "to the sender");
    assert_eq!(
        u16::from_be_bytes([ip[26], ip[27]]),
        1420,
        "the next hop's MTU"
    );
    assert!(checksums_ok(ip));
    assert_eq!(
        ip[28 + 12..28 + 20],
        big[12..20],
        "it quotes the packet's addresses"
    );
}

/// A restarted adapter keeps its leases (its state directory): the device asking again
/// after the restart, before any other, is given the address it had, not the first free
/// one.
#[test]
fn a_restarted_adapter_gives_a_device_its_address_again() {
    let link = Link::new(4);
    let (f, one, two) = sites(&link);
    let (first, _) = one.device.beside([0x02, 0xbb, 0, 0, 1, 11]).lease("first");
    let (ip1, _) = one.device.lease("sensor-one");
    assert_ne!(ip1, first);
    one.end.stop().expect("gw1 stops cleanly");
    let again = start(&f.path().join("adapter1.toml"), &link, 1);
    let (ip, _) = again.device.lease("sensor-one");
    assert_eq!(ip, ip1, "the same address after the restart");
    drop(two);
}

/// With the sparse class in sockets and threads of its own (`sparse_socket`, one thread):
/// the bulk socket never sees ARP, ICMP, DHCP or DNS, so the lease, the pings and the name
/// can only have come through the sparse sockets' threads; a bulk flow through the bulk
/// socket beside them. The pipelines count the sparse packets in their express lanes.
#[test]
fn the_sparse_class_crosses_in_its_own_lane() {
    let link = Link::new(6);
    let dataplane = "sparse_socket = true\nsparse_per_cpu = false";
    let (_f, mut one, two) = sites_with(&link, dataplane, ["", ""]);
    assert_eq!(one.device.wires.len(), 2, "a bulk and a sparse socket");
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, gw2_mac) = two.device.lease("sensor-two");
    for (from, src, gw, dst, to) in [
        (&one, ip1, gw1_mac, ip2, &two),
        (&two, ip2, gw2_mac, ip1, &one),
    ] {
        let echo = ipv4_echo(src.octets(), dst.octets(), b"sparse");
        from.device.send(&eth(gw, from.device.mac, &echo));
        to.device
            .expect("the ping across", |f| is_echo(f, src, dst));
    }
    let answered = one.resolve((ip1, gw1_mac), 0x5151, "sensor-two.gw2.ovl.example.");
    assert_eq!(answered, vec![ip2]);
    let bulk = ipv4_udp(ip1.octets(), ip2.octets(), 4000, 4001, b"bulk");
    one.device.send(&eth(gw1_mac, one.device.mac, &bulk));
    two.device
        .expect("the bulk datagram", |f| is_udp(f, ip1, ip2, 4001));

    // gw1 sent the ping, its DNS question and the bulk datagram, the first two in the
    // express lane; it received the ping back and the answer, both express.
    let counts = |d: &serde_json::Value, way: &str| {
        let p = &d["pipelines"][way];
        (p["submitted"].as_u64(), p["express"].as_u64())
    };
    // A pipeline counts a packet once its batch is done, which may be after the packet was
    // delivered: the counts are waited for, both ways, and must be exactly these.
    let settled = |d: &serde_json::Value| {
        counts(d, "egress") == (Some(3), Some(2)) && counts(d, "ingress") == (Some(2), Some(2))
    };
    let doc = one.end.wait_status(PATIENCE, settled).unwrap_or_else(|e| {
        panic!("gw1's pipelines did not count the sparse packets as express: {e:#}")
    });
    assert_eq!(counts(&doc, "egress"), (Some(3), Some(2)));
    assert_eq!(counts(&doc, "ingress"), (Some(2), Some(2)));
}

/// A site as it is: a PLC with a fixed address in 192.0.2.0/28 behind gw1 (`[legacy]`,
/// mapped onto 100.64.1.224/28) finds its old gateway address answered, pings a device
/// behind gw2, which sees it at its mapped overlay address (.229 for .5) and answers
/// there; the answer reaches the PLC at its own address.
#[test]
fn a_fixed_address_device_reaches_the_far_site_under_its_mapped_address() {
    let legacy = r#"
[legacy]
subnet = "192.0.2.0/28"
onto = "100.64.1.224/28"
gateway = "192.0.2.1"
learn = false

[[legacy.device]]
name = "plc1"
mac = "02:00:5e:10:00:14"
address = "192.0.2.5"
"#;
    let link = Link::new(7);
    let (_f, one, two) = sites_with(&link, "sparse_socket = false", [legacy, ""]);
    let plc = one.device.beside([0x02, 0x00, 0x5e, 0x10, 0x00, 0x14]);
    let (plc_ip, old_gateway) = (Ipv4Addr::new(192, 0, 2, 5), Ipv4Addr::new(192, 0, 2, 1));
    let mapped = Ipv4Addr::new(100, 64, 1, 229);
    let (ip2, gw2_mac) = two.device.lease("sensor-two");

    plc.send(&arp_request(plc.mac, plc_ip, old_gateway));
    let reply = plc.expect("the old gateway's ARP reply", |f| {
        f.get(12..14) == Some(&[0x08, 0x06][..])
            && f.get(20..22) == Some(&[0, 2][..])
            && f.get(28..32) == Some(&old_gateway.octets()[..])
            && f.get(32..38) == Some(&plc.mac[..])
    });
    let gw_mac: [u8; 6] = reply[22..28].try_into().expect("a MAC");

    let echo = ipv4_echo(plc_ip.octets(), ip2.octets(), b"plc");
    plc.send(&eth(gw_mac, plc.mac, &echo));
    two.device
        .expect("the PLC's ping, mapped", |f| is_echo(f, mapped, ip2));
    let back = ipv4_echo(ip2.octets(), mapped.octets(), b"back");
    two.device.send(&eth(gw2_mac, two.device.mac, &back));
    let got = plc.expect("the answer at the PLC's own address", |f| {
        is_echo(f, ip2, plc_ip)
    });
    assert_eq!(got[..6], plc.mac, "to the PLC's MAC");
}

/// IPv6 through the tunnel: each site's LAN has its certificate's first /64; a device
/// behind gw2 is heard at its address (its ping to its gateway, answered), and a ping from
/// a device behind gw1 to that address crosses, to the device's MAC, hop limit down by two.
#[test]
fn ipv6_crosses_between_the_sites_lans() {
    let link = Link::new(10);
    let shape = Shape {
        blocks: [
            "100.64.1.0/24 fd7a:0:1:100::/56",
            "100.64.2.0/24 fd7a:0:1:200::/56",
        ],
        adapter: "inner_mtu = 1280",
        ..Shape::default()
    };
    let (_f, one, two) = sites_shaped(&link, &shape);
    let (_, gw1_mac) = one.device.lease("sensor-one");
    let (_, gw2_mac) = two.device.lease("sensor-two");
    let a: std::net::Ipv6Addr = "fd7a:0:1:100::a".parse().expect("an address");
    let b: std::net::Ipv6Addr = "fd7a:0:1:200::b".parse().expect("an address");
    let gw2: std::net::Ipv6Addr = "fd7a:0:1:200::1".parse().expect("an address");

    two.device.send(&eth6(
        gw2_mac,
        two.device.mac,
        &ipv6_echo(b, gw2, b"hello gateway"),
    ));
    two.device.expect("the gateway's echo reply", |f| {
        icmp6(f, gw2, b, 129).is_some()
    });

    one.device
        .send(&eth6(gw1_mac, one.device.mac, &ipv6_echo(a, b, b"across")));
    let got = two
        .device
        .expect("the ping across", |f| icmp6(f, a, b, 128).is_some());
    assert_eq!(got[..6], two.device.mac, "to the device's MAC");
    assert_eq!(got[IP + 7], 62, "each gateway is a hop");
}
