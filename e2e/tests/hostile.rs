//! Hostile networks: attacks driven from namespaces the test owns (the router between the
//! sites, a device on a LAN) while real clients keep working, asserting on what the clients
//! see and on the adapters' counters. Every load is bounded in time.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use cyphonic_e2e::bed::{
    BedOptions, CloudOptions, Ping, Side, SiteOptions, TwoSites, mac_of, parse_mac,
};
use cyphonic_e2e::impair::Impairment;
use cyphonic_e2e::lan::{DhcpClient, DhcpHost, dig, slaac_address};
use cyphonic_e2e::node::{NAME, VIP};
use cyphonic_e2e::rogue::{Rogue, site_identity};
use cyphonic_e2e::{inject, uint};

/// An attacker on the underlay replays a captured initiation at B, 20,000 a second from a
/// forged address, for 12 seconds (each one would cost B two Diffie-Hellman operations and a
/// signature check before it shows as a replay). Meanwhile a new device on B's LAN gets a
/// lease, B answers DNS, and A, restarted with no keys, handshakes with B again through the
/// flood: B asks for cookies, A's retry carries one and gets through.
#[test]
fn a_handshake_flood_leaves_handshakes_dhcp_and_dns_served() {
    let mut bed = TwoSites::up(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })
    .unwrap();
    let init = cyphonic_e2e::attack::capture_initiation(&bed).unwrap();
    let to_b = SocketAddr::new(bed.b.underlay, 51820);
    let forged: SocketAddr = "203.0.113.1:0".parse().unwrap();
    let flood = inject::spawn_flood_udp(
        &bed.wan,
        forged,
        to_b,
        init,
        20_000,
        Duration::from_secs(12),
    );
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    // DHCP and DNS on B's LAN.
    let (ns, mac) = bed.add_host(Side::B, "newcomer").unwrap();
    let mut device = DhcpHost::new(ns, mac, DhcpClient::Udhcpc, "newcomer").unwrap();
    device.start().unwrap();
    let bound = device.wait_for(&["bound"], 1, Duration::from_secs(8));
    let answer = dig(&bed.b.lan, bed.b.gateway, "gw2.ovl.example", "A");
    // A restarts, keys lost: its first packets need a new handshake with B, under the flood.
    bed.stop(Side::A, "TERM").unwrap();
    bed.start(Side::A).unwrap();
    let ping = bed
        .a
        .lan
        .exec_output(
            "ping",
            &[
                "-c",
                "20",
                "-i",
                "0.2",
                "-W",
                "1",
                &bed.b.host_ip.to_string(),
            ],
        )
        .unwrap();
    let during = started.elapsed();
    let sent = flood.join().unwrap().unwrap();
    let logs = bed.logs();
    bound.unwrap_or_else(|e| panic!("no lease during the flood: {e}\n{logs}"));
    let answer = answer.unwrap_or_else(|e| panic!("no DNS answer during the flood: {e}\n{logs}"));
    assert_eq!(answer.status, "NOERROR", "{answer:?}");
    let text = String::from_utf8_lossy(&ping.stdout).into_owned();
    assert!(
        ping.status.success(),
        "A and B did not handshake during the flood:\n{text}\n{logs}"
    );
    assert!(
        during < Duration::from_secs(11),
        "the checks ran past the flood"
    );
    assert!(sent > 50_000, "the flood sent only {sent}");
    let counter = |side, name| bed.counter(side, name).unwrap();
    eprintln!(
        "flood: {sent} sent; B: {} initiations checked, {} cookie-replies, {} over rate, \
         {} queue drops; A: {} cookies taken; the checks took {during:?}",
        counter(Side::B, "handshake_inits"),
        counter(Side::B, "cookie_replies_sent"),
        counter(Side::B, "drop_handshake_rate"),
        counter(Side::B, "drop_handshake_queue"),
        counter(Side::A, "cookie_replies_received"),
    );
    assert!(counter(Side::B, "cookie_replies_sent") > 1000, "{logs}");
    assert!(counter(Side::A, "cookie_replies_received") >= 1, "{logs}");
    assert_eq!(counter(Side::B, "drop_handshake_queue"), 0, "{logs}");
    device.stop().unwrap();
}

/// `n` addresses (at most 250) of a host on the underlay replaying A's first initiation at
/// B, 40 a second each for 14 s, each answering B's cookie-replies: with its hint replaced
/// by `hint` (and mac1 sealed again) when given. Returns the host (the flood ends with it)
/// and the flood.
fn cookie_answering_flood(
    bed: &TwoSites,
    n: usize,
    hint: Option<[u8; 16]>,
) -> (
    cyphonic_e2e::Netns,
    std::thread::JoinHandle<anyhow::Result<cyphonic_e2e::attack::HandshakeFlood>>,
) {
    let init = cyphonic_e2e::attack::capture_initiation(bed).unwrap();
    let b_key = cyphonic_e2e::attack::static_key(&bed.b.dir.join("gw2.ovl.example.crt")).unwrap();
    let init = match hint {
        Some(h) => cyphonic_e2e::attack::with_hint(&init, &b_key, h).unwrap(),
        None => init,
    };
    let (flooder, sources) = cyphonic_e2e::attack::flooding_host(bed, n).unwrap();
    let to_b = SocketAddr::new(bed.b.underlay, 51820);
    let flood = cyphonic_e2e::attack::spawn_cookie_answering_flood(
        &flooder,
        sources,
        to_b,
        init,
        b_key,
        40,
        Duration::from_secs(14),
    );
    (flooder, flood)
}

/// Starts A (its keys lost) and pings B's host once from lanA, waiting at most 5 s for the
/// answer: the ping and how long after the start it ended.
fn start_a_and_ping_b(bed: &mut TwoSites) -> (std::process::Output, Duration) {
    bed.start(Side::A).unwrap();
    let started = Instant::now();
    let ping = bed
        .ping(Side::A, bed.b.host_ip, &["-c", "1", "-w", "5"])
        .unwrap();
    (ping, started.elapsed())
}

/// Issue 49, finding 4 (handshakes): 61 real addresses on the underlay replay a captured
/// initiation at B, each answering B's cookie-replies so that its initiations carry a valid
/// mac2 and each would cost B its Diffie-Hellman work, 40 a second each (past the 20 a second
/// a source may have answered). B does at most its handshake budget of them a second, not the
/// sum of the sources' rates, and A, restarted in the middle of it from where B knows it,
/// handshakes with B at once.
#[test]
fn a_cookie_answering_flood_from_sixty_addresses_is_held_to_the_budget() {
    let mut bed = TwoSites::up(&BedOptions::default()).unwrap();
    // The flooding host lives as long as the test.
    let (_flooder, flood) = cookie_answering_flood(&bed, 61, None);
    let inits = |bed: &TwoSites| bed.counter(Side::B, "handshake_inits").unwrap();
    // Two seconds for B to be under load and the sources to have their cookies.
    std::thread::sleep(Duration::from_secs(2));
    let (n0, t0) = (inits(&bed), Instant::now());
    std::thread::sleep(Duration::from_secs(5));
    let (n1, t1) = (inits(&bed), Instant::now());
    let per_sec = (n1 - n0) as f64 / (t1 - t0).as_secs_f64();
    // A restarts: keys lost, it handshakes with B through the flood.
    bed.stop(Side::A, "TERM").unwrap();
    let (ping, back) = start_a_and_ping_b(&mut bed);
    let seen = inject::joined(flood).unwrap();
    eprintln!(
        "flood from 61 addresses: {seen:?}; B did {per_sec:.0} handshakes a second; A back in {back:?}"
    );
    assert!(
        seen.with_cookie > 10_000,
        "the flood did not get past the cookies: {seen:?}"
    );
    // The budget, and the short spells between two loads when the queue is let fill up to
    // its threshold again (32 at a time): well under the 1,220 a second of the sources'
    // rates.
    assert!(
        per_sec < 250.0,
        "B did {per_sec:.0} handshakes a second\n{}",
        bed.logs()
    );
    assert!(
        ping.status.success() && back < Duration::from_secs(5),
        "A was not back within 5 s ({back:?}):\n{}\n{}",
        String::from_utf8_lossy(&ping.stdout),
        bed.logs()
    );
    let budget = bed.counter(Side::B, "drop_handshake_budget").unwrap();
    assert!(
        budget > 1_000,
        "{budget} over the budget: the budget did not act"
    );
}

/// Issue 49, finding 4 (known clients first): 250 addresses on the underlay answer B's
/// cookie-replies and send initiations (a copy of A's with a hint of their own: they never
/// saw A's), 40 a second each: far more sources than B's handshake budget of 100 a second
/// has shares for, so a newcomer's initiation gets nothing. A then comes back from an
/// address B has never seen it at (a second address on its uplink, as after a failover or a
/// new lease) with its keys lost: its initiation's hint is the one B expects of A, and B
/// lets it in first; the ping goes through within 5 s.
#[test]
fn a_member_back_from_a_new_address_comes_first_through_a_flood_from_250_addresses() {
    let mut bed = TwoSites::up(&BedOptions::default()).unwrap();
    let (_flooder, flood) = cookie_answering_flood(&bed, 250, Some([0x5a; 16]));
    // Two seconds for B to be under load and the sources to have their cookies.
    std::thread::sleep(Duration::from_secs(3));
    // A stops, takes a second address on its uplink and sends from it from now on.
    bed.stop(Side::A, "TERM").unwrap();
    let std::net::IpAddr::V4(a_old) = bed.a.underlay else {
        panic!("the default bed's A is on IPv4");
    };
    let [x, y, z, _] = a_old.octets();
    let (a_new, router) = (format!("{x}.{y}.{z}.102"), format!("{x}.{y}.{z}.1"));
    let ns = &bed.a.adapter_ns;
    ns.ip(&["addr", "add", &format!("{a_new}/24"), "dev", "wan"])
        .unwrap();
    ns.ip(&["route", "replace", "default", "via", &router, "src", &a_new])
        .unwrap();
    let known0 = bed.counter(Side::B, "handshake_known_first").unwrap();
    let (ping, back) = start_a_and_ping_b(&mut bed);
    let known = bed.counter(Side::B, "handshake_known_first").unwrap() - known0;
    let peers = bed.status(Side::B).unwrap();
    let seen = inject::joined(flood).unwrap();
    eprintln!("flood from 250 addresses: {seen:?}; A back in {back:?}; {known} known first");
    assert!(
        seen.with_cookie > 10_000,
        "the flood did not get past the cookies: {seen:?}"
    );
    assert!(
        ping.status.success() && back < Duration::from_secs(5),
        "A was not back within 5 s ({back:?}):\n{}\n{}",
        String::from_utf8_lossy(&ping.stdout),
        bed.logs()
    );
    assert!(known >= 1, "B let nothing in by its hint: {known}");
    assert!(
        peers.to_string().contains(&format!("{a_new}:51820")),
        "B does not reach A at its new address: {peers}"
    );
    let budget = bed.counter(Side::B, "drop_handshake_budget").unwrap();
    assert!(
        budget > 1_000,
        "{budget} over the budget: the budget did not act"
    );
}

/// The adapter's host forwards IPv4 (`ip_forward=1`: Docker and many images turn it on) and
/// its uplink's default route covers every destination. A device's pings to the other site
/// still leave only sealed, and so do frames a device addresses to the host's own MAC: on the
/// router side of A's uplink, no frame carries the device's and its peer's addresses in clear,
/// while every ping is answered through the tunnel.
#[test]
fn no_device_packet_leaves_in_clear_even_with_forwarding_on() {
    let bed = TwoSites::up(&BedOptions::default()).unwrap();
    let ns = &bed.a.adapter_ns;
    // As Docker does: this also turns every interface's own `forwarding` on, the LAN port's
    // included; the adapter puts that back.
    ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])
        .unwrap();
    // The bed's adapters already have a default route out of the uplink.
    let routes = ns.ip(&["route", "show", "default"]).unwrap();
    assert!(routes.contains("dev wan"), "{routes}");
    cyphonic_e2e::wait_until(
        Duration::from_secs(3),
        "the guard put forwarding back",
        || {
            bed.counter(Side::A, "forwarding_guard_restored")
                .is_ok_and(|n| n >= 1)
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let lan_forwarding = ns.exec("sysctl", &["-n", "net.ipv4.conf.lan.forwarding"]);
    assert_eq!(lan_forwarding.unwrap().trim(), "0");
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
    // A device that addresses the host's own MAC (it can learn it from the kernel's ARP
    // answers for the host's other addresses) instead of the gateway's.
    let nic = parse_mac(&mac_of(ns, "lan").unwrap()).unwrap();
    let device = parse_mac(&bed.a.host_mac).unwrap();
    let to_host: Vec<Vec<u8>> = (0..10u16)
        .map(|i| {
            let (src, dst) = (bed.a.host_ip, bed.b.host_ip);
            inject::udp_frame(nic, device, src, dst, 40000 + i, 9, b"in clear?")
        })
        .collect();
    // Source and destination, as they follow each other in an IPv4 header.
    let mut clear = bed.a.host_ip.octets().to_vec();
    clear.extend(bed.b.host_ip.octets());
    let to = bed.b.host_ip.to_string();
    sealed_only(
        &bed,
        clear,
        to_host,
        &["-c", "10", "-i", "0.2", "-W", "2", &to],
    );
}

/// Sends `to_host` from A's device and pings with `ping_args` (10 pings) while watching the
/// router side of A's uplink: no frame there holds `clear` (a source and destination pair as
/// they follow each other in an IP header), and every ping is answered.
fn sealed_only(bed: &TwoSites, clear: Vec<u8>, to_host: Vec<Vec<u8>>, ping_args: &[&str]) {
    let (seen, ping) = std::thread::scope(|s| {
        let capture = s.spawn(|| {
            inject::count_frames_containing(&bed.wan, "toa", clear, Duration::from_secs(5))
        });
        std::thread::sleep(Duration::from_millis(300));
        inject::send_frames(&bed.a.lan, "eth0", to_host).unwrap();
        let ping = bed.a.lan.exec_output("ping", ping_args).unwrap();
        (capture.join().unwrap().unwrap(), ping)
    });
    let text = String::from_utf8_lossy(&ping.stdout).into_owned();
    assert_eq!(
        seen,
        0,
        "{seen} frames left A in clear\n{text}\n{}",
        bed.logs()
    );
    assert!(
        text.contains("10 received"),
        "the pings did not all go through the tunnel:\n{text}\n{}",
        bed.logs()
    );
}

/// The LAN port is the adapter's: the host's kernel takes no frame from it. A device sends
/// UDP to a closed port of the adapter host's uplink address, addressed to the NIC's own MAC
/// (the weak host model would answer it on any interface, with no reverse-path check here):
/// no "port unreachable" comes back, while the same probe from the router, on the uplink,
/// is answered. An address put on the port and the filter removed (`tc qdisc del`) are both
/// put back within the guard's second, counted, and devices keep working. After the adapter
/// stops, the port stays closed; only removing the filter by hand opens it, and then the
/// device's probe is answered (the probe can see an open port).
#[test]
fn the_lan_port_is_closed_to_the_hosts_kernel() {
    let mut bed = TwoSites::up(&BedOptions::default()).unwrap();
    let ns = &bed.a.adapter_ns;
    for key in ["all", "lan", "wan"] {
        ns.exec(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{key}.rp_filter=0")],
        )
        .unwrap();
    }
    let filter_shown = |ns: &cyphonic_e2e::Netns| {
        ns.exec("tc", &["filter", "show", "dev", "lan", "ingress"])
            .unwrap()
    };
    let shown = filter_shown(ns);
    assert!(
        shown.contains("bpf") && shown.contains("direct-action"),
        "no drop filter on A's LAN port: {shown}"
    );
    let uplink = match bed.a.underlay {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(ip) => panic!("A's uplink is IPv4 in this bed: {ip}"),
    };
    let router: Ipv4Addr = "198.51.100.1".parse().unwrap();
    let nic = parse_mac(&mac_of(ns, "lan").unwrap()).unwrap();
    let wan_mac = parse_mac(&mac_of(ns, "wan").unwrap()).unwrap();
    let toa_mac = parse_mac(&mac_of(&bed.wan, "toa").unwrap()).unwrap();
    let device = parse_mac(&bed.a.host_mac).unwrap();
    let device_ip = bed.a.host_ip;
    // An ICMP port unreachable from the uplink address to `to`: its IPv4 source and
    // destination followed by type 3, code 3.
    let unreachable_to = |to: Ipv4Addr| {
        let mut needle = uplink.octets().to_vec();
        needle.extend(to.octets());
        needle.extend([3, 3]);
        needle
    };
    let from_device = || {
        (0..5u16)
            .map(|i| inject::udp_frame(nic, device, device_ip, uplink, 40200 + i, 9, b"probe"))
            .collect::<Vec<_>>()
    };
    // Both answers, if any, leave A by the uplink (A routes the device's address there).
    let probe = |bed: &TwoSites, with_router: bool| {
        std::thread::scope(|s| {
            let capture = s.spawn(|| {
                inject::count_frames_containing_each(
                    &bed.wan,
                    "toa",
                    vec![unreachable_to(device_ip), unreachable_to(router)],
                    Duration::from_secs(3),
                )
            });
            std::thread::sleep(Duration::from_millis(300));
            inject::send_frames(&bed.a.lan, "eth0", from_device()).unwrap();
            if with_router {
                let frames = (0..5u16)
                    .map(|i| {
                        inject::udp_frame(wan_mac, toa_mac, router, uplink, 40300 + i, 9, b"probe")
                    })
                    .collect();
                inject::send_frames(&bed.wan, "toa", frames).unwrap();
            }
            capture.join().unwrap().unwrap()
        })
    };
    let seen = probe(&bed, true);
    assert!(
        seen[1] >= 1,
        "the router's probe of the uplink was not answered: the probe is broken"
    );
    assert_eq!(
        seen[0],
        0,
        "A's kernel answered a device on the LAN port\n{}",
        bed.logs()
    );
    // Something on the host puts an address on the port and removes the filter.
    let restored = bed.counter(Side::A, "forwarding_guard_restored").unwrap();
    ns.ip(&["addr", "add", "192.0.2.77/24", "dev", "lan"])
        .unwrap();
    ns.exec("tc", &["qdisc", "del", "dev", "lan", "clsact"])
        .unwrap();
    cyphonic_e2e::wait_until(
        Duration::from_secs(3),
        "the guard put the port back",
        || {
            bed.counter(Side::A, "forwarding_guard_restored")
                .is_ok_and(|n| n >= restored + 2)
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let addresses = ns.ip(&["-4", "addr", "show", "dev", "lan"]).unwrap();
    assert!(!addresses.contains("inet "), "{addresses}");
    assert!(filter_shown(ns).contains("direct-action"));
    let log = std::fs::read_to_string(bed.a.log()).unwrap();
    assert!(
        log.contains("address 192.0.2.77/24 removed") && log.contains("ingress drop filter"),
        "the log does not say what was put back\n{log}"
    );
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
    // Stopped, the adapter leaves the port closed.
    bed.stop(Side::A, "TERM").unwrap();
    let ns = &bed.a.adapter_ns;
    assert!(filter_shown(ns).contains("direct-action"));
    assert_eq!(probe(&bed, false)[0], 0, "the port opened when A stopped");
    ns.exec("tc", &["qdisc", "del", "dev", "lan", "clsact"])
        .unwrap();
    assert!(
        probe(&bed, false)[0] >= 1,
        "with the filter removed by hand, the kernel did not answer: the probe cannot see an open port"
    );
}

/// Node C's DNS stub serves the node only. A neighbour on the node's segment (the router,
/// given a route to the node's vIP) asks it and gets nothing, not even a refusal; a device at
/// a peer's site gets the node's own name and is refused anything else (the stub would be an
/// open resolver otherwise); the node itself is served as before.
#[test]
fn the_node_dns_stub_serves_the_node_and_gives_peers_its_own_zone_only() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        node_c: Some(None),
        ..BedOptions::default()
    })
    .unwrap();
    let bins = bed.bins.clone();
    bed.c.as_mut().unwrap().start(&bins).unwrap();
    let node = bed.c.as_ref().unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(10), "the node's stub answers", || {
        dig(&node.ns, VIP, NAME, "A").is_ok_and(|d| d.status == "NOERROR")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let via = node.underlay.to_string();
    bed.wan
        .ip(&["route", "add", &format!("{VIP}/32"), "via", &via])
        .unwrap();
    let neighbour = dig(&bed.wan, VIP, NAME, "A");
    assert!(
        neighbour.is_err(),
        "a neighbour was answered: {neighbour:?}"
    );
    // A device behind adapter A, over the tunnel: adapter A finds the node through the
    // cloud when a device asks its name.
    cyphonic_e2e::wait_until(
        Duration::from_secs(12),
        "adapter A resolves the node",
        || dig(&bed.a.lan, bed.a.gateway, NAME, "A").is_ok_and(|d| !d.answers.is_empty()),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    bed.ping_ok(&bed.a.lan, VIP, Ping::count(2).wait(3));
    let own = dig(&bed.a.lan, VIP, NAME, "A").unwrap();
    assert_eq!(
        (own.status.as_str(), own.answers.clone()),
        ("NOERROR", vec![VIP.to_string()])
    );
    let other = dig(&bed.a.lan, VIP, "host.gw2.ovl.example", "A").unwrap();
    assert_eq!(other.status, "REFUSED", "{other:?}");
    let status = node.status(&bed.bins).unwrap();
    assert!(uint(&status["dns"]["dropped"]) >= 1, "{status}");
}

/// A DNS query for `name` (type A), as a device's resolver would send it.
fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend(label.as_bytes());
    }
    q.extend([0, 0, 1, 0, 1]);
    q
}

/// A device at site B floods adapter A's DNS with 5,000 questions a second through the
/// tunnel, for 10 s. Meanwhile a new device on A's LAN gets its lease and A's own device is
/// answered: DHCP has a queue of its own, and the flood spends only its source's rate.
#[test]
fn a_dns_flood_from_another_site_leaves_local_dhcp_and_dns_served() {
    let mut bed = TwoSites::up(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })
    .unwrap();
    bed.ping_ok(&bed.b.lan, bed.a.host_ip, Ping::count(2).wait(3));
    let from = SocketAddr::new(bed.b.host_ip.into(), 0);
    let to = SocketAddr::new(bed.a.gateway.into(), 53);
    let query = dns_query(0x4242, "gw1.ovl.example");
    let flood =
        inject::spawn_flood_udp(&bed.b.lan, from, to, query, 5_000, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    let (ns, mac) = bed.add_host(Side::A, "newcomer").unwrap();
    let mut device = DhcpHost::new(ns, mac, DhcpClient::Udhcpc, "newcomer").unwrap();
    device.start().unwrap();
    let bound = device.wait_for(&["bound"], 1, Duration::from_secs(8));
    let answer = dig(&bed.a.lan, bed.a.gateway, "gw1.ovl.example", "A");
    let sent = flood.join().unwrap().unwrap();
    let logs = bed.logs();
    bound.unwrap_or_else(|e| panic!("no lease during the DNS flood: {e}\n{logs}"));
    let answer = answer.unwrap_or_else(|e| panic!("no DNS answer during the flood: {e}\n{logs}"));
    assert_eq!(answer.status, "NOERROR", "{answer:?}");
    let counter = |name| bed.counter(Side::A, name).unwrap();
    eprintln!(
        "DNS flood: {sent} sent; A: {} over their source's rate, {} queue drops, {} DNS received",
        counter("drop_service_rate"),
        counter("drop_service_busy"),
        counter("dns_received"),
    );
    assert!(sent > 40_000, "the flood sent only {sent}");
    assert!(counter("drop_service_rate") > 10_000, "{logs}");
    assert_eq!(counter("drop_service_busy"), 0, "{logs}");
    device.stop().unwrap();
}

/// The cloud's counter `name`.
fn cloud_counter(bed: &TwoSites, name: &str) -> u64 {
    bed.cloud_counter(name).unwrap()
}

/// An on-path attacker (the router between the sites and the cloud) captures adapter A's first control
/// message and an endpoint probe as A reconnects, and replays both from its own address: the
/// cloud opens nothing for either (the replayed message gets only a welcome it cannot read),
/// A keeps its session and the address the cloud gives its peers. Then
/// the attacker opens 200 silent connections a second to the control port for 10 s while
/// adapter B restarts: the cloud holds at most its per-source share of them, B gets its
/// session back during the flood, and names resolve on both sides.
#[test]
fn the_cloud_turns_away_replayed_handshakes_and_probes_and_bounds_a_connection_flood() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..BedOptions::default()
    })
    .unwrap();
    let sessions = |bed: &TwoSites| cloud_counter(bed, "sessions");
    cyphonic_e2e::wait_until(Duration::from_secs(10), "both adapters connected", || {
        sessions(&bed) >= 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let control = bed.cloud.as_ref().unwrap().address;
    let probe_port = SocketAddr::new(control.ip(), 7001);

    // A reconnects while the router captures.
    bed.stop(Side::A, "TERM").unwrap();
    let hello = cyphonic_e2e::attack::spawn_capture_first_control_frame(
        &bed.wan,
        "toa",
        control.port(),
        Duration::from_secs(10),
    );
    let probe = inject::spawn_capture_udp(&bed.wan, "toa", 7001, 1, Duration::from_secs(10), |p| {
        p.len() == 88 && p[1] == 6
    });
    // The capture sockets are open well before A connects.
    std::thread::sleep(Duration::from_millis(500));
    bed.start(Side::A).unwrap();
    let (hello, probe) = (inject::joined(hello), inject::joined(probe));
    let (hello, probe) = (hello.unwrap(), probe.unwrap().remove(0));
    let a_connected = |bed: &TwoSites| {
        bed.status(Side::A).is_ok_and(|s| {
            s["cloud"]["connected"] == true && s["cloud"]["observed"] == "198.51.100.2:51820"
        })
    };
    cyphonic_e2e::wait_until(Duration::from_secs(10), "A connected again", || {
        a_connected(&bed)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let opened = sessions(&bed);

    let answer =
        cyphonic_e2e::attack::tcp_exchange(&bed.wan, control, hello, Duration::from_secs(8))
            .unwrap();
    // The replay's timestamp is not fresh (a replay, or a client whose clock went back: the
    // proof tells them apart, issue 49, finding 5): it gets at most the welcome, one frame
    // sealed to the real client's handshake, and is closed for want of proof.
    let one_frame = answer.len() >= 2
        && usize::from(u16::from_be_bytes([answer[0], answer[1]])) == answer.len() - 2;
    assert!(
        answer.is_empty() || one_frame,
        "the replay got {} bytes",
        answer.len()
    );
    let router: SocketAddr = "192.0.2.1:0".parse().unwrap();
    inject::send_udp(&bed.wan, router, probe_port, vec![probe; 3]).unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(5), "the replays counted", || {
        cloud_counter(&bed, "replays") == 1 && cloud_counter(&bed, "probes_refused") >= 3
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert_eq!(sessions(&bed), opened, "the replay opened a session");
    assert!(a_connected(&bed), "{}", bed.logs());
    let d = dig(&bed.a.lan, bed.a.gateway, "host.gw2.ovl.example", "A").unwrap();
    assert_eq!(d.answers, ["100.64.2.10"], "{d:?}\n{}", bed.logs());

    // The connection flood, and B restarting through it.
    let pid = bed.cloud.as_ref().unwrap().proc.as_ref().unwrap().pid();
    let fds_before = cyphonic_e2e::attack::open_fds(pid).unwrap();
    let flood = cyphonic_e2e::attack::spawn_connection_flood(
        &bed.wan,
        control,
        200,
        Duration::from_secs(10),
    );
    std::thread::sleep(Duration::from_secs(1));
    bed.stop(Side::B, "TERM").unwrap();
    bed.start(Side::B).unwrap();
    // Read strictly: a reading that failed must not count as "few files".
    let fds = || {
        cyphonic_e2e::attack::open_fds(pid)
            .unwrap_or_else(|e| panic!("the cloud's open files during the flood: {e:#}"))
    };
    let mut most_fds = 0;
    let back = cyphonic_e2e::wait_until(Duration::from_secs(8), "B connected again", || {
        most_fds = most_fds.max(fds());
        sessions(&bed) > opened
    });
    while !flood.is_finished() {
        most_fds = most_fds.max(fds());
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = flood.join().unwrap().unwrap();
    let refused = cloud_counter(&bed, "connections_refused");
    eprintln!(
        "connection flood: {} opened, {} closed at once, {refused} refused by the cloud; its open files {fds_before} before, at most {most_fds} during",
        seen.opened, seen.closed_at_once
    );
    back.unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(seen.opened > 1_000, "{seen:?}");
    // The source's share is 8 at a time, each held at most 5 s (the handshake timeout): over
    // 10 s at most 8 x 3 were let in; the rest were closed as they came.
    assert!(
        seen.opened.saturating_sub(refused) <= 24 && refused > 1_000,
        "{seen:?} {refused}"
    );
    assert!(
        most_fds < fds_before + 16,
        "{most_fds} open files during the flood"
    );
    let d = dig(&bed.b.lan, bed.b.gateway, "gw1.ovl.example", "A").unwrap();
    assert_eq!(d.answers, ["100.64.1.1"], "{d:?}\n{}", bed.logs());
}

/// Issue 49, finding 4: 61 addresses on the underlay keep the cloud's unproven connections
/// full between them (400 silent connections a second, each held until the cloud gives up on
/// it), and adapter B restarts in the middle of it: B takes a place of the source holding
/// the most at once and is back within 5 s (before, every place stayed taken and B was
/// refused for the whole flood and its backoff after).
#[test]
fn a_connection_flood_from_sixty_addresses_keeps_no_client_out() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..BedOptions::default()
    })
    .unwrap();
    let sessions = |bed: &TwoSites| cloud_counter(bed, "sessions");
    cyphonic_e2e::wait_until(Duration::from_secs(10), "both adapters connected", || {
        sessions(&bed) >= 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let control = bed.cloud.as_ref().unwrap().address;
    let (attacker, first) = bed.add_underlay_host("flooder").unwrap();
    let mut sources = vec![std::net::IpAddr::V4(first)];
    for last in 194..=254u8 {
        if last == 200 {
            continue;
        }
        let ip = Ipv4Addr::new(192, 0, 2, last);
        attacker
            .ip(&["addr", "add", &format!("{ip}/26"), "dev", "eth0"])
            .unwrap();
        sources.push(std::net::IpAddr::V4(ip));
    }
    assert!(sources.len() >= 60);
    let flood = cyphonic_e2e::attack::spawn_connection_flood_from(
        &attacker,
        sources,
        control,
        400,
        Duration::from_secs(14),
    );
    // Let the flood fill every place first.
    cyphonic_e2e::wait_until(Duration::from_secs(8), "the unproven places full", || {
        cloud_counter(&bed, "connections_refused") > 20
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let opened = sessions(&bed);
    bed.stop(Side::B, "TERM").unwrap();
    let start = Instant::now();
    bed.start(Side::B).unwrap();
    let back = cyphonic_e2e::wait_until(Duration::from_secs(5), "B connected again", || {
        sessions(&bed) > opened
    });
    let took = start.elapsed();
    let seen = flood.join().unwrap().unwrap();
    eprintln!(
        "connection flood from 61 addresses: {} opened; B back after {took:?}; {} refused",
        seen.opened,
        cloud_counter(&bed, "connections_refused")
    );
    back.unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(seen.opened > 4_000, "{seen:?}");
    let evicted = cloud_counter(&bed, "unproven_evicted");
    assert!(
        evicted >= 1,
        "B got in without taking a place: was the gate full?"
    );
}

/// Issue 49, finding 8: an on-path attacker who drops adapter A's endpoint probes and resends
/// them from an address of its own (here the router drops them, and a third host on the
/// underlay replays what the router saw) cannot move the address the cloud records for A:
/// the cloud only challenges the attacker's address, and A's recorded address stays its own.
#[test]
fn probes_replayed_from_another_address_move_nothing() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..BedOptions::default()
    })
    .unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(10), "both adapters connected", || {
        cloud_counter(&bed, "sessions") >= 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let control = bed.cloud.as_ref().unwrap().address;
    let probe_port = SocketAddr::new(control.ip(), 7001);
    let (victim, victim_ip) = bed.add_underlay_host("elsewhere").unwrap();
    // The router drops A's probes from now on; A reconnects, and the router keeps a copy of
    // what it dropped.
    bed.stop(Side::A, "TERM").unwrap();
    for rule in [
        "add table inet drop_probes",
        "add chain inet drop_probes passing { type filter hook forward priority 0 ; }",
        "add rule inet drop_probes passing ip saddr 198.51.100.2 udp dport 7001-7002 drop",
    ] {
        let args: Vec<&str> = rule.split(' ').collect();
        bed.wan.exec("nft", &args).unwrap();
    }
    let probes =
        inject::spawn_capture_udp(&bed.wan, "toa", 7001, 1, Duration::from_secs(10), |p| {
            p.get(1) == Some(&6) && (p.len() == 56 || p.len() == 88)
        });
    std::thread::sleep(Duration::from_millis(500));
    bed.start(Side::A).unwrap();
    let probe = inject::joined(probes).unwrap().remove(0);
    // Read strictly after the replay (a missing counter fails there).
    let challenges = bed.cloud_counter("probe_challenges").unwrap();
    inject::send_udp(
        &victim,
        SocketAddr::from((victim_ip, 51_820)),
        probe_port,
        vec![probe; 3],
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let s = bed.status(Side::A).unwrap();
    let observed = s["cloud"]["observed"].as_str().unwrap_or("none").to_owned();
    eprintln!("the cloud records A's tunnel socket at {observed}");
    assert!(
        !observed.starts_with(&victim_ip.to_string()),
        "the replayed probe moved A's address to {observed}\n{}",
        bed.logs()
    );
    assert!(
        cloud_counter(&bed, "probe_challenges") > challenges,
        "the replay was not challenged"
    );
    bed.wan
        .exec("nft", &["delete", "table", "inet", "drop_probes"])
        .unwrap();
}

/// Forged handshake responses cannot break a handshake. Adapter B's link to the router holds
/// every frame back by 300 ms each way (an impaired link: this kernel has no netem); the
/// moment A's first initiation reaches the router, the router answers A with 20
/// forged responses for that initiation's index (mac1 right, since A's public key is no
/// secret; a Noise message that does not decrypt). A refuses each and keeps waiting: B's
/// genuine response completes the handshake, and A never initiates a second time.
#[test]
fn forged_responses_do_not_break_a_pending_handshake_on_the_wire() {
    let bed = TwoSites::up(&BedOptions {
        b: SiteOptions {
            impair: Some(Impairment {
                delay: Duration::from_millis(300),
                ..Impairment::NONE
            }),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    let pem = std::fs::read_to_string(bed.a.dir.join("gw1.ovl.example.crt")).unwrap();
    let a_key = cyphonic_crypto::PublicKey(
        cyphonic_crypto::Certificate::from_pem(&pem)
            .unwrap()
            .body()
            .public_key,
    );
    let is_init = |p: &[u8]| p.len() > 16 && p[0] == cyphonic_wire::VERSION && p[1] == 1;
    // The router learns B's MAC first: an ARP exchange over the slow link would add 600 ms
    // to the first initiation's way and A would rightly try again.
    bed.wan
        .exec("ping", &["-c", "1", "-W", "3", &bed.b.underlay.to_string()])
        .unwrap();
    // A's initiations pass the router before B's slow link.
    let port = bed.b.endpoint().port();
    let inits =
        inject::spawn_capture_udp(&bed.wan, "toa", port, 5, Duration::from_secs(5), is_init);
    let first =
        inject::spawn_capture_udp(&bed.wan, "toa", port, 1, Duration::from_secs(5), is_init);
    let to_a = SocketAddr::new(bed.a.underlay, 51820);
    let router: SocketAddr = "198.51.100.1:0".parse().unwrap();
    let wan = &bed.wan;
    let forger = std::thread::scope(|s| {
        let forger = s.spawn(move || -> anyhow::Result<usize> {
            let init = inject::joined(first)?
                .pop()
                .ok_or_else(|| anyhow::anyhow!("no initiation"))?;
            let index = u32::from_be_bytes(init[4..8].try_into()?);
            let forged: Vec<Vec<u8>> = (0..20u8)
                .map(|n| cyphonic_session::sim::forged_response(&a_key, index, &[n; 400]))
                .collect();
            let count = forged.len();
            inject::send_udp_paced(wan, router, to_a, forged, Duration::from_millis(1))?;
            Ok(count)
        });
        // The capture sockets are open well before A's device starts the handshake.
        std::thread::sleep(Duration::from_millis(500));
        bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(3).wait(3));
        forger.join().unwrap()
    });
    let forged = forger.unwrap();
    let inits = inject::joined(inits).unwrap();
    let refused = bed.counter(Side::A, "handshake_refused").unwrap();
    eprintln!(
        "{forged} forged responses; A refused {refused} responses and sent {} initiations",
        inits.len()
    );
    assert!(
        refused >= 20,
        "A refused {refused} of {forged} forged responses\n{}",
        bed.logs()
    );
    assert_eq!(inits.len(), 1, "A had to start over\n{}", bed.logs());
}

/// Issue 49, finding 4 (the relay's port range) against the real cloud: 56 members, each
/// from an address of its own, fill the relay: 16 of them each ask for 4 channels with the
/// other 40 until all 64 ports are taken. A fresh pair then asks and is given a channel at
/// once, taken from one of the 16; that member cannot take it back; the 16 are refused any
/// more, and the relay has opened nothing outside its range.
#[test]
fn members_filling_the_relay_cannot_keep_a_fresh_pair_out() {
    use cyphonic_e2e::hosts::Bins;
    use cyphonic_e2e::members::{Member, MembersBed, member_name};
    use cyphonic_signal::Event;

    const HOGS: usize = 16;
    const PARTNERS: usize = 40;
    const EACH: usize = 4;
    const FRESH: (usize, usize) = (HOGS + PARTNERS, HOGS + PARTNERS + 1);
    const PORTS: &str = "51000-51063";

    /// `member` asks for a relay to `peer` and waits for the cloud's answer: the relay's
    /// address, or why not.
    async fn ask(member: &mut Member, peer: &str) -> Result<SocketAddr, String> {
        member.0.request_relay(peer).map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(e) = member.1.recv().await {
                match e {
                    Event::NotPaired { peer: p, reason } if p == peer => return Err(reason),
                    Event::Expect(info) => {
                        let fp = cyphonic_crypto::Certificate::from_pem(&info.certificate)
                            .map(|c| c.fingerprint().to_string());
                        if fp.as_deref() == Ok(peer) {
                            return info.relay.map(|r| r.address).ok_or("no relay".into());
                        }
                    }
                    _ => {}
                }
            }
            Err("the member's session ended".into())
        });
        answer
            .await
            .unwrap_or_else(|_| Err("no answer in 5 s".into()))
    }

    let bed = MembersBed::with_cloud_config(
        FRESH.1 + 1,
        false,
        &format!("[relay]\nports = \"{PORTS}\"\n"),
    )
    .unwrap();
    let log = || std::fs::read_to_string(bed.cloud.log()).unwrap_or_default();
    let outcome = bed.drive(16, |members| async move {
        let fps: Vec<String> = members
            .iter()
            .map(|(id, _)| id.certificate().fingerprint().to_string())
            .collect();
        let mut members: Vec<Member> = members
            .into_iter()
            .enumerate()
            .map(|(i, (_, m))| m.ok_or_else(|| anyhow::anyhow!("member {i} never registered")))
            .collect::<anyhow::Result<_>>()?;
        let mut partners = members.split_off(HOGS);
        let mut fresh = partners.split_off(PARTNERS);
        // Each hog asks for its channels in turn, all hogs at once.
        let mut filling = tokio::task::JoinSet::new();
        for (h, mut hog) in members.into_iter().enumerate() {
            let fps = fps.clone();
            filling.spawn(async move {
                let mut got = 0;
                for j in 0..EACH {
                    let partner = HOGS + (h * EACH + j) % PARTNERS;
                    got += usize::from(ask(&mut hog, &fps[partner]).await.is_ok());
                }
                (h, hog, got)
            });
        }
        let (mut hogs, mut held) = (Vec::new(), 0);
        while let Some(done) = filling.join_next().await {
            let (h, hog, got) = done?;
            hogs.push((h, hog));
            held += got;
        }
        // The fresh pair, timed from its ask.
        let asked = Instant::now();
        let given = ask(&mut fresh[0], &fps[FRESH.1]).await;
        let took = asked.elapsed();
        // The hog that lost a channel, and every other, asks for more: nothing.
        let mut more = Vec::new();
        for (h, hog) in &mut hogs {
            let partner = HOGS + (*h * EACH + EACH) % PARTNERS;
            more.push(ask(hog, &fps[partner]).await);
        }
        drop((hogs, partners, fresh));
        Ok((held, given, took, more))
    });
    let (held, given, took, more) = outcome.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    eprintln!("relay fill: {held} channels held; fresh pair {given:?} after {took:?}");
    assert_eq!(
        held,
        HOGS * EACH,
        "the hogs did not fill the relay\n{}",
        log()
    );
    let at = given.unwrap_or_else(|e| panic!("the fresh pair was refused: {e}\n{}", log()));
    assert!((51_000..=51_063).contains(&at.port()), "{at}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    for (h, m) in more.iter().enumerate() {
        assert!(m.is_err(), "hog {h} was given one more: {m:?}");
    }
    let status = bed.cloud.status(&Bins::find().unwrap()).unwrap();
    let relay = &status["relay"];
    let channels = relay["channels"].as_array().unwrap();
    assert_eq!(channels.len(), HOGS * EACH, "{relay}");
    let (a, b) = (member_name(FRESH.0).name, member_name(FRESH.1).name);
    assert!(
        channels
            .iter()
            .any(|c| c["a"] == a.as_str() && c["b"] == b.as_str()
                || c["a"] == b.as_str() && c["b"] == a.as_str()),
        "the fresh pair's channel is gone: {relay}"
    );
    assert_eq!(uint(&relay["counters"]["channels_reclaimed"]), 1, "{relay}");
}

/// A member of the overlay that lies about where its packets come from (cryptokey routing,
/// docs/security.md): site B's own identity, driven by the test over the real protocol
/// with adapter B stopped, seals echo requests to A's LAN host from B's host (inside B's
/// certified block) and from two addresses outside it: one of A's own LAN, one of nobody's.
/// The real adapter A delivers the first kind, which the host answers, and drops every one
/// of the others before its LAN, each counted once as `drop_source_not_certified`.
#[test]
fn a_member_sending_from_outside_its_certified_block_is_dropped_and_counted() {
    let mut bed = TwoSites::up(&BedOptions::default()).unwrap();
    bed.stop(Side::B, "TERM").unwrap();
    let identity = site_identity(&bed.b.dir, "gw2.ovl.example").unwrap();
    let theirs = std::fs::read_to_string(bed.b.dir.join("peers/gw1.ovl.example.crt")).unwrap();
    let theirs = cyphonic_crypto::Certificate::from_pem(&theirs).unwrap();
    let (local, endpoint) = (SocketAddr::from((bed.b.underlay, 51820)), bed.a.endpoint());
    let mut rogue = inject::inside(&bed.b.adapter_ns, move || {
        Rogue::connect(identity, local, &theirs, endpoint, Duration::from_secs(10))
    })
    .unwrap();

    let target = bed.a.host_ip;
    let sources = [
        bed.b.host_ip,
        Ipv4Addr::new(100, 64, 1, 77),
        Ipv4Addr::new(100, 64, 3, 3),
    ];
    let marker = |source: usize, i: usize| format!("cryptokey-{source}-{i}").into_bytes();
    let needles: Vec<Vec<u8>> = (0..sources.len())
        .map(|s| marker(s, 0)[..12].to_vec())
        .collect();
    let before = bed.counter(Side::A, "drop_source_not_certified").unwrap();
    const EACH: usize = 3;
    let (replies, seen) = std::thread::scope(|sc| {
        let capture = sc.spawn(|| {
            inject::count_frames_containing_each(
                &bed.a.lan,
                "eth0",
                needles,
                Duration::from_secs(4),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..EACH {
            for (s, source) in sources.iter().enumerate() {
                let packet = inject::echo_packet(*source, target, &marker(s, i));
                rogue.send(&packet).unwrap();
            }
        }
        let replies = rogue.receive_for(Duration::from_secs(2)).unwrap();
        (replies, capture.join().unwrap().unwrap())
    });
    let after = bed.counter(Side::A, "drop_source_not_certified").unwrap();

    for i in 0..EACH {
        assert!(
            replies
                .iter()
                .any(|p| inject::echo_reply_marker(p, target) == Some(marker(0, i).as_slice())),
            "no answer to the certified source's echo {i}: {} inner packets came back",
            replies.len()
        );
    }
    assert!(seen[0] >= EACH, "the certified echoes on A's LAN: {seen:?}");
    assert_eq!(
        seen[1..],
        [0, 0],
        "uncertified sources reached A's LAN: {seen:?}"
    );
    assert_eq!(
        after - before,
        (2 * EACH) as u64,
        "drop_source_not_certified moved from {before} to {after}"
    );
}

/// Issue 53: as above, over IPv6. The adapter's host forwards IPv6 (`all.forwarding=1`) and
/// has a default IPv6 route out of its uplink; site A's device pings site B's over IPv6
/// (both by their SLAAC addresses), and sends echo requests to B's device addressed to the
/// host's own MAC: every ping is answered through the tunnel, and no frame on the router
/// side of A's uplink carries the two addresses in clear.
#[test]
fn no_device_ipv6_packet_leaves_in_clear_even_with_forwarding_on() {
    // Dual stack: A's uplink has an IPv6 address and a default route via the router.
    let bed = TwoSites::up(&BedOptions {
        ipv6: true,
        a: SiteOptions {
            dual_stack: true,
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    let ns = &bed.a.adapter_ns;
    ns.exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])
        .unwrap();
    let routes = ns.ip(&["-6", "route", "show", "default"]).unwrap();
    assert!(routes.contains("dev wan"), "{routes}");
    let within = Duration::from_secs(20);
    let a6 = slaac_address(&bed.a.lan, "fd7a:0:1:100:", within).unwrap();
    let b6 = slaac_address(&bed.b.lan, "fd7a:0:1:200:", within).unwrap();
    // B's device makes itself heard by its adapter (its first packet from the address).
    let out = bed
        .b
        .lan
        .exec_output("ping", &["-6", "-c", "1", "-W", "2", "fd7a:0:1:200::1"])
        .unwrap();
    assert!(out.status.success(), "{}", bed.logs());
    let mut clear = a6.octets().to_vec();
    clear.extend(b6.octets());
    let to = b6.to_string();
    let nic = parse_mac(&mac_of(ns, "lan").unwrap()).unwrap();
    let device = parse_mac(&bed.a.host_mac).unwrap();
    let to_host: Vec<Vec<u8>> = (0..10u8)
        .map(|i| {
            let echo = vec![128, 0, 0, 0, 0x12, 0x34, 0, i, b'c', b'l', b'e', b'a', b'r'];
            inject::icmpv6_frame(nic, device, a6, b6, 64, echo)
        })
        .collect();
    let ping = ["-6", "-c", "10", "-i", "0.2", "-W", "2", to.as_str()];
    sealed_only(&bed, clear, to_host, &ping);
}

/// Issue 53, a hostile LAN: on site A's switch a rogue host sends a Router Advertisement, a
/// Redirect, a Neighbour Advertisement claiming the gateway's IPv6 address and one claiming
/// the victim device's. The adapter counts each; it answers the claim of its address with
/// its own advertisement to every node, so the victim's cache names the gateway's MAC again
/// and its pings to the gateway go on; the victim's address stays the victim's.
#[test]
fn router_adverts_and_neighbour_claims_from_a_rogue_are_refused() {
    let mut bed = TwoSites::up(&BedOptions {
        ipv6: true,
        lan_switch: true,
        ..BedOptions::default()
    })
    .unwrap();
    let victim = slaac_address(&bed.a.lan, "fd7a:0:1:100:", Duration::from_secs(20)).unwrap();
    let gw6: std::net::Ipv6Addr = "fd7a:0:1:100::1".parse().unwrap();
    let ping_gateway = |bed: &TwoSites| {
        let args = ["-6", "-c", "2", "-i", "0.2", "-W", "2", "fd7a:0:1:100::1"];
        let out = bed.a.lan.exec_output("ping", &args).unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            bed.logs()
        );
    };
    ping_gateway(&bed);
    let cached = |bed: &TwoSites| {
        bed.a
            .lan
            .exec(
                "ip",
                &["-6", "neigh", "show", "fd7a:0:1:100::1", "dev", "eth0"],
            )
            .unwrap_or_default()
            .split_whitespace()
            .skip_while(|w| *w != "lladdr")
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    let gw_mac = cached(&bed);
    assert!(!gw_mac.is_empty());
    let (rogue, rogue_mac) = bed.add_host(Side::A, "rogue").unwrap();
    let rmac = parse_mac(&rogue_mac).unwrap();
    let rll = std::net::Ipv6Addr::from(
        (0xfe80u128 << 112)
            | u128::from(u64::from_be_bytes([
                rmac[0] ^ 2,
                rmac[1],
                rmac[2],
                0xff,
                0xfe,
                rmac[3],
                rmac[4],
                rmac[5],
            ])),
    );
    let all_nodes: std::net::Ipv6Addr = "ff02::1".parse().unwrap();
    let to_all = [0x33, 0x33, 0, 0, 0, 1];
    let mut ra = vec![134, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    ra.extend_from_slice(&[
        3, 4, 64, 0xc0, 0, 1, 0x51, 0x80, 0, 0, 0x38, 0x40, 0, 0, 0, 0,
    ]);
    ra.extend_from_slice(&"fd00:bad::".parse::<std::net::Ipv6Addr>().unwrap().octets());
    let mut redirect = vec![137, 0, 0, 0, 0, 0, 0, 0];
    redirect.extend_from_slice(&rll.octets());
    redirect.extend_from_slice(
        &"fd7a:0:1:200::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    let claim = |target: std::net::Ipv6Addr| {
        let mut na = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
        na.extend_from_slice(&target.octets());
        na.extend_from_slice(&[2, 1]);
        na.extend_from_slice(&rmac);
        na
    };
    let counters = |bed: &TwoSites| {
        [
            "drop_router_guard",
            "neighbour_gateway_claims",
            "drop_neighbour_spoofed",
        ]
        .map(|c| bed.counter(Side::A, c).unwrap())
    };
    let before = counters(&bed);
    let frames = [ra, redirect, claim(gw6), claim(victim)]
        .into_iter()
        .map(|m| inject::icmpv6_frame(to_all, rmac, rll, all_nodes, 255, m))
        .collect();
    inject::send_frames(&rogue, "eth0", frames).unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(5), "the rogue's frames counted", || {
        let now = counters(&bed);
        now[0] >= before[0] + 2 && now[1] > before[1] && now[2] > before[2]
    })
    .unwrap_or_else(|e| panic!("{e}: {:?} then {:?}", before, counters(&bed)));
    // The gateway's answer put the victim's cache right: its pings to the gateway go on.
    ping_gateway(&bed);
    assert_eq!(cached(&bed), gw_mac);
    let status = bed.status(Side::A).unwrap();
    let leases = status["leases"].to_string();
    assert!(leases.contains(&victim.to_string()), "{leases}");
}

/// An IPv6 packet from `src` to `dst` whose headers after the fixed one are `chain` (each
/// `(next header it names, bytes)`, the first's type in the fixed header), ending in `body`.
fn ipv6_packet(
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    first: u8,
    chain: &[Vec<u8>],
    body: &[u8],
) -> Vec<u8> {
    let len: usize = chain.iter().map(Vec::len).sum::<usize>() + body.len();
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
    p.extend_from_slice(&[first, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    for h in chain {
        p.extend_from_slice(h);
    }
    p.extend_from_slice(body);
    p
}

/// A Fragment header: the next header, the offset in 8-byte units, more to come, the id.
fn fragment_header(next: u8, offset: u16, more: bool, id: u32) -> Vec<u8> {
    let mut h = vec![next, 0];
    h.extend_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h
}

/// Issue 53, a hostile LAN device under site A's policy (which lets its /64 send UDP to
/// site B's): a datagram whose second fragment overlaps its first (RFC 5722), a packet
/// behind nine Destination Options headers (RFC 9288: more than the 8 the filter walks), and
/// one with a Routing header (RFC 5095) are dropped where they would be sealed and counted
/// by reason; a plain datagram and a fragmented one whose pieces do not overlap reach B's
/// LAN; A's genuine device keeps its address and its pings to B go on.
#[test]
fn overlapping_fragments_and_long_header_chains_from_a_device_are_dropped_and_counted() {
    let policy = "[policy]\n\n[[policy.rule]]\nfrom = [\"fd7a:0:1:100::/64\"]\n\
                  to = [\"fd7a:0:1:200::/64\"]\nallow = [\"udp\", \"icmp\"]\n";
    let mut bed = TwoSites::up(&BedOptions {
        ipv6: true,
        lan_switch: true,
        a: SiteOptions {
            extra: policy.into(),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    let within = Duration::from_secs(20);
    let a6 = slaac_address(&bed.a.lan, "fd7a:0:1:100:", within).unwrap();
    let b6 = slaac_address(&bed.b.lan, "fd7a:0:1:200:", within).unwrap();
    let ping_b = |bed: &TwoSites| {
        let to = b6.to_string();
        let args = ["-6", "-c", "2", "-i", "0.2", "-W", "2", to.as_str()];
        let out = bed.a.lan.exec_output("ping", &args).unwrap();
        assert!(out.status.success(), "{out:?}\n{}", bed.logs());
    };
    // B's device makes itself heard, and A's reaches it through the tunnel.
    let heard = bed
        .b
        .lan
        .exec_output("ping", &["-6", "-c", "1", "-W", "2", "fd7a:0:1:200::1"])
        .unwrap();
    assert!(heard.status.success(), "{}", bed.logs());
    ping_b(&bed);
    let (rogue, rogue_mac) = bed.add_host(Side::A, "fragger").unwrap();
    let rmac = parse_mac(&rogue_mac).unwrap();
    let status = bed.status(Side::A).unwrap();
    let gw = parse_mac(status["adapter"]["gateway_mac"].as_str().unwrap()).unwrap();
    let src: std::net::Ipv6Addr = "fd7a:0:1:100::bad:1".parse().unwrap();
    let udp = |marker: &[u8]| {
        let mut u = vec![0x30, 0x39, 0x30, 0x39];
        u.extend_from_slice(&u16::try_from(8 + marker.len()).unwrap().to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(marker);
        u
    };
    let frame = |ip: Vec<u8>| {
        let mut f = gw.to_vec();
        f.extend_from_slice(&rmac);
        f.extend_from_slice(&[0x86, 0xdd]);
        f.extend(ip);
        f
    };
    const UDP: u8 = 17;
    const FRAG: u8 = 44;
    const DSTOPTS: u8 = 60;
    const ROUTING: u8 = 43;
    // Passes: a plain datagram, and one in two pieces (16 bytes, then the rest at 16).
    let plain = frame(ipv6_packet(src, b6, UDP, &[], &udp(b"PLAIN-PASSES")));
    let whole = udp(b"GOODHEAD-GOODTAIL-PASSES");
    let good = [
        frame(ipv6_packet(
            src,
            b6,
            FRAG,
            &[fragment_header(UDP, 0, true, 1)],
            &whole[..16],
        )),
        frame(ipv6_packet(
            src,
            b6,
            FRAG,
            &[fragment_header(UDP, 2, false, 1)],
            &whole[16..],
        )),
    ];
    // Refused: a second piece at 8 over the first's 16 bytes.
    let head = udp(b"OVL-HEAD");
    let overlap = [
        frame(ipv6_packet(
            src,
            b6,
            FRAG,
            &[fragment_header(UDP, 0, true, 2)],
            &head,
        )),
        frame(ipv6_packet(
            src,
            b6,
            FRAG,
            &[fragment_header(UDP, 1, false, 2)],
            b"OVL-TAIL-OVERLAPS",
        )),
    ];
    // Refused: nine Destination Options headers (PadN), and a Routing header (type 0).
    let pad = |next: u8| vec![next, 0, 1, 4, 0, 0, 0, 0];
    let mut nine: Vec<Vec<u8>> = (0..8).map(|_| pad(DSTOPTS)).collect();
    nine.push(pad(UDP));
    let chained = frame(ipv6_packet(src, b6, DSTOPTS, &nine, &udp(b"CHAIN-OF-NINE")));
    let mut routing = vec![UDP, 2, 0, 1, 0, 0, 0, 0];
    routing.extend_from_slice(
        &"fd7a:0:1:200::99"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    let routed = frame(ipv6_packet(
        src,
        b6,
        ROUTING,
        &[routing],
        &udp(b"ROUTED-VIA"),
    ));
    let dropped = |bed: &TwoSites, why: &str| -> u64 {
        let s = bed.status(Side::A).unwrap();
        s["policy"]["dropped"][why]
            .as_u64()
            .unwrap_or_else(|| panic!("no policy.dropped.{why}: {}", s["policy"]))
    };
    let before = (dropped(&bed, "fragment"), dropped(&bed, "extension_header"));
    let needles: Vec<Vec<u8>> = [
        &b"PLAIN-PASSES"[..],
        b"GOODHEAD",
        b"GOODTAIL",
        b"OVL-HEAD",
        b"OVL-TAIL",
        b"CHAIN-OF-NINE",
        b"ROUTED-VIA",
    ]
    .map(<[u8]>::to_vec)
    .to_vec();
    let mut frames = vec![plain];
    frames.extend(good);
    frames.extend(overlap);
    frames.extend([chained, routed]);
    let seen = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            inject::count_frames_containing_each(
                &bed.b.lan,
                "eth0",
                needles,
                Duration::from_secs(3),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        // Twice: the adapter learns the rogue's address from its first packet.
        for _ in 0..2 {
            inject::send_frames(&rogue, "eth0", frames.clone()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
        watch.join().unwrap().unwrap()
    });
    let names = [
        "plain",
        "good head",
        "good tail",
        "overlap head",
        "overlap tail",
        "chain",
        "routing",
    ];
    let got: Vec<(&str, usize)> = names.into_iter().zip(seen.iter().copied()).collect();
    for (what, n) in &got[..4] {
        assert!(*n >= 1, "{what} did not reach B: {got:?}\n{}", bed.logs());
    }
    for (what, n) in &got[4..] {
        assert_eq!(*n, 0, "{what} reached B: {got:?}");
    }
    let after = (dropped(&bed, "fragment"), dropped(&bed, "extension_header"));
    assert!(
        after.0 >= before.0 + 2,
        "fragment drops {before:?} -> {after:?}"
    );
    assert!(
        after.1 >= before.1 + 4,
        "extension_header drops {before:?} -> {after:?}"
    );
    // The genuine device keeps its address, and its way to B.
    ping_b(&bed);
    let leases = bed.status(Side::A).unwrap()["leases"].to_string();
    assert!(leases.contains(&a6.to_string()), "{leases}");
}
