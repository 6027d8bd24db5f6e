//! The LAN side end to end: real DHCP clients (busybox udhcpc, ISC dhclient) and real DNS
//! tools (dig, ping by name through the system resolver) against the adapter's DHCP server and
//! DNS service, on the two-site bed with a switch on each LAN (see e2e/src/bed.rs).

#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::time::Duration;

use cyphonic_e2e::bed::{BedOptions, Side, SiteOptions, TwoSites};
use cyphonic_e2e::inject;
use cyphonic_e2e::lan::{DhcpClient, DhcpHost, dig};
use cyphonic_vip::testing::{MessageType, client_message};
use serde_json::Value;

fn switched(extra_a: &str, extra_b: &str) -> BedOptions {
    BedOptions {
        lan_switch: true,
        a: SiteOptions {
            extra: extra_a.to_owned(),
            ..SiteOptions::default()
        },
        b: SiteOptions {
            extra: extra_b.to_owned(),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    }
}

fn bed(opts: &BedOptions) -> TwoSites {
    TwoSites::up(opts).unwrap()
}

fn host(bed: &mut TwoSites, side: Side, kind: DhcpClient, hostname: &str) -> DhcpHost {
    let (ns, mac) = bed.add_host(side, hostname).unwrap();
    DhcpHost::new(ns, mac, kind, hostname).unwrap()
}

/// The leases in a site's status, by MAC.
fn lease_of<'a>(status: &'a Value, mac: &str) -> Option<&'a Value> {
    status["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["mac"] == mac)
}

fn in_pool(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    o[..3] == [100, 64, 1] && (100..=199).contains(&o[3])
}

const SHORT_LEASES: &str = "[dhcp]\npool = \"100.64.1.100-100.64.1.199\"\nlease_time = 60\n";

/// Both clients get a lease with everything a device needs, use it (ping the gateway: the
/// lease reached the anti-spoofing table), renew it, come back after a restart with the same
/// address (dhclient: INIT-REBOOT), and give it back.
#[test]
fn udhcpc_and_dhclient_get_renew_reboot_and_release_leases() {
    let mut bed = bed(&switched(SHORT_LEASES, ""));
    let mut small = host(&mut bed, Side::A, DhcpClient::Udhcpc, "sensor");
    let mut server = host(&mut bed, Side::A, DhcpClient::Dhclient, "dbserver");
    small.start().unwrap();
    server.start().unwrap();
    let within = Duration::from_secs(20);
    for h in [&small, &server] {
        let e = h.wait_for(&["bound"], 1, within).unwrap_or_else(|e| {
            panic!("{:?}: {e}\n{}", h.kind, bed.logs());
        });
        let ip: Ipv4Addr = e.get("ip").parse().unwrap();
        assert!(in_pool(ip), "{:?} got {ip}", h.kind);
        // What the server said, as the client understood it...
        assert_eq!(e.get("router"), "100.64.1.1", "{e:?}");
        assert_eq!(e.get("dns"), "100.64.1.1", "{e:?}");
        assert_eq!(e.get("domain"), "gw1.ovl.example", "{e:?}");
        assert_eq!(e.get("mtu"), "1420", "{e:?}");
        assert_eq!(e.get("lease"), "60", "{e:?}");
        assert!(
            e.get("mask") == "24" || e.get("mask") == "255.255.255.0",
            "{e:?}"
        );
        // ... and as the host now runs.
        assert_eq!(h.address(), Some((ip, 24)), "{:?}", h.kind);
        assert_eq!(h.default_route(), Some(Ipv4Addr::new(100, 64, 1, 1)));
        assert_eq!(h.mtu(), Some(1420));
        let ping =
            h.ns.exec_output("ping", &["-c", "2", "-i", "0.2", "-W", "2", "100.64.1.1"])
                .unwrap();
        assert!(
            ping.status.success(),
            "{:?} cannot reach its gateway with its lease\n{}",
            h.kind,
            bed.logs()
        );
    }
    let (a, b) = (
        small.last_address().unwrap(),
        server.last_address().unwrap(),
    );
    assert_ne!(a, b);
    let s = bed.status(Side::A).unwrap();
    let l = lease_of(&s, &small.mac).unwrap();
    assert_eq!(l["vip"], a.to_string());
    assert_eq!(l["name"], "sensor.gw1.ovl.example");
    assert_eq!(
        lease_of(&s, &server.mac).unwrap()["name"],
        "dbserver.gw1.ovl.example"
    );

    // Renewal: udhcpc on demand (unicast REQUEST to the server), dhclient at T1 = 30 s.
    small.renew().unwrap();
    let e = small.wait_for(&["renew"], 1, within).unwrap();
    assert_eq!(e.get("ip"), a.to_string());
    let e = server
        .wait_for(&["renew"], 1, Duration::from_secs(45))
        .unwrap();
    assert_eq!(e.get("ip"), b.to_string());

    // Restart: dhclient reboots with its saved lease (INIT-REBOOT), udhcpc asks for its
    // address again; both get the same one.
    server.stop().unwrap();
    small.stop().unwrap();
    server.start().unwrap();
    small.start().unwrap();
    let e = server.wait_for(&["reboot"], 1, within).unwrap();
    assert_eq!(e.get("ip"), b.to_string(), "INIT-REBOOT kept the address");
    let e = small.wait_for(&["bound"], 2, within).unwrap();
    assert_eq!(e.get("ip"), a.to_string());

    // Release: the leases end at once, and the addresses no longer pass anti-spoofing.
    small.release().unwrap();
    server.release().unwrap();
    // The clients do not wait for the server: give the adapter a moment to take the RELEASEs.
    let _ = cyphonic_e2e::wait_until(Duration::from_secs(5), "the releases", || {
        bed.status(Side::A)
            .is_ok_and(|s| s["dhcp"]["releases"].as_u64() == Some(2))
    });
    let s = bed.status(Side::A).unwrap();
    assert!(lease_of(&s, &small.mac).is_none(), "{}", s["leases"]);
    assert!(lease_of(&s, &server.mac).is_none(), "{}", s["leases"]);
    let dhcp = &s["dhcp"];
    assert_eq!(dhcp["releases"], 2, "{dhcp}");
    assert!(dhcp["acks"].as_u64().unwrap() >= 6, "{dhcp}");
    assert_eq!(dhcp["naks"], 0, "{dhcp}");
    assert_eq!(
        s["counters"]["dhcp_received"].as_u64().unwrap(),
        dhcp["discovers"].as_u64().unwrap()
            + dhcp["requests"].as_u64().unwrap()
            + dhcp["releases"].as_u64().unwrap()
            + dhcp["declines"].as_u64().unwrap()
            + dhcp["informs"].as_u64().unwrap()
            + dhcp["ignored"].as_u64().unwrap(),
        "every DHCP message the capture handed over was accounted for: {dhcp}"
    );
}

fn parse_mac(text: &str) -> [u8; 6] {
    cyphonic_e2e::bed::parse_mac(text).unwrap()
}

/// A renewal as a device in RENEWING/REBINDING state sends it: `ciaddr` set, no server
/// identifier, broadcast. The server ACKs it and saves the lease file each time.
fn renewal_frame(mac: [u8; 6], ip: Ipv4Addr, xid: u32) -> Vec<u8> {
    let msg = client_message(MessageType::Request, mac, xid, vec![], ip, false);
    inject::udp_frame([0xff; 6], mac, ip, Ipv4Addr::BROADCAST, 68, 67, &msg)
}

/// Leases outlive the adapter: a clean restart (SIGTERM), and kill -9 in the middle of a
/// stream of renewals (answered at once, the lease file written at most once a second),
/// leave a lease file that loads, with the same address and name, and the device renews its
/// address from the restarted adapter.
#[test]
fn leases_survive_restart_and_kill_during_writes() {
    let mut bed = bed(&switched(SHORT_LEASES, ""));
    let mut dev = host(&mut bed, Side::A, DhcpClient::Udhcpc, "printer");
    dev.start().unwrap();
    let within = Duration::from_secs(20);
    let ip: Ipv4Addr = dev
        .wait_for(&["bound"], 1, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()))
        .get("ip")
        .parse()
        .unwrap();
    let lease_file = bed.a.lease_file();
    let saved = |bed: &TwoSites| -> Value {
        let text = std::fs::read_to_string(&lease_file).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "the lease file does not parse ({e}):\n{text}\n{}",
                bed.logs()
            )
        })
    };
    assert!(saved(&bed).to_string().contains(&ip.to_string()));

    // A clean restart.
    bed.stop(Side::A, "TERM").unwrap();
    bed.start(Side::A).unwrap();
    let s = bed.status(Side::A).unwrap();
    let l = lease_of(&s, &dev.mac).unwrap_or_else(|| panic!("lease lost: {}", s["leases"]));
    assert_eq!(l["vip"], ip.to_string());
    assert_eq!(l["name"], "printer.gw1.ovl.example");

    // kill -9 while renewals stream in: each is answered at once, and the lease file is
    // written at most once a second, always whole.
    let mac = parse_mac(&dev.mac);
    // A counter that is not there is an error, not a zero (the write bound below would pass
    // on nothing).
    let count = |s: &Value, what: &str| {
        s["dhcp"][what]
            .as_u64()
            .unwrap_or_else(|| panic!("no dhcp.{what} in the status: {s}"))
    };
    let (acks_before, writes_before) = (count(&s, "acks"), count(&s, "lease_writes"));
    let mut seen = (0, 0);
    let (sent, killed_after) = std::thread::scope(|scope| {
        // From the device itself, as its own renewals would come.
        let flood = scope.spawn(|| {
            #[expect(clippy::cast_possible_truncation, reason = "an xid")]
            inject::send_frames_for(&dev.ns, "eth0", Duration::from_secs(3), 400, move |n| {
                renewal_frame(mac, ip, 0x5eed_0000 ^ n as u32)
            })
        });
        let started = std::time::Instant::now();
        cyphonic_e2e::wait_until(Duration::from_secs(3), "renewals answered", || {
            bed.status(Side::A).is_ok_and(|s| {
                seen = (
                    count(&s, "acks") - acks_before,
                    count(&s, "lease_writes") - writes_before,
                );
                seen.0 > 50
            })
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
        bed.stop(Side::A, "KILL").unwrap();
        let killed_after = started.elapsed();
        (flood.join().unwrap().unwrap(), killed_after)
    });
    eprintln!(
        "{} renewals answered with {} lease file writes in {killed_after:?}",
        seen.0, seen.1
    );
    assert!(sent > 100, "only {sent} renewals sent");
    assert!(
        killed_after < Duration::from_secs(3),
        "the kill came after the stream"
    );
    assert!(
        seen.1 <= killed_after.as_secs() + 2,
        "{} writes for {} renewals in {killed_after:?}: not coalesced",
        seen.1,
        seen.0
    );
    let text = saved(&bed).to_string();
    assert!(text.contains(&ip.to_string()), "{text}");

    bed.start(Side::A).unwrap();
    let s = bed.status(Side::A).unwrap();
    let l = lease_of(&s, &dev.mac).unwrap_or_else(|| panic!("lease lost: {}", s["leases"]));
    assert_eq!(l["vip"], ip.to_string());
    assert_eq!(l["name"], "printer.gw1.ovl.example");
    let log = bed.a.log_text();
    assert!(!log.contains("corrupt"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    // The device renews with the restarted adapter and keeps its address.
    let renewals = dev.events().iter().filter(|e| e.reason == "renew").count();
    dev.renew().unwrap();
    let e = dev.wait_for(&["renew"], renewals + 1, within).unwrap();
    assert_eq!(e.get("ip"), ip.to_string());
}

/// The reverse-lookup name of `ip`.
fn reverse(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("{d}.{c}.{b}.{a}.in-addr.arpa")
}

/// Names across the overlay: a device that joined lanB by DHCP is found by name from lanA
/// (asked of the peer's DNS through the tunnel), forward and reverse; the overlay's own zone
/// is answered with authority; other names go to the configured upstream (a dnsmasq on the
/// router) or are refused when there is none; and a host using the gateway as its system
/// resolver pings the device by name.
#[test]
fn names_resolve_across_the_tunnel_and_devices_ping_by_name() {
    let mut bed = bed(&switched("[dns]\nupstream = [\"198.51.100.1\"]\n", ""));
    let _upstream = bed
        .wan
        .spawn(
            "dnsmasq",
            &[
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=198.51.100.1",
                "--address=/upstream.example/192.0.2.80",
                "--pid-file=",
                "--user=root",
            ],
        )
        .unwrap();
    let mut camera = host(&mut bed, Side::B, DhcpClient::Udhcpc, "camera");
    camera.start().unwrap();
    let cam: Ipv4Addr = camera
        .wait_for(&["bound"], 1, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()))
        .get("ip")
        .parse()
        .unwrap();
    let ask = |side: Side, name: &str, qtype: &str| {
        let site = bed.site_ref(side);
        dig(&site.lan, site.gateway, name, qtype).unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()))
    };
    let answer = |side, name: &str, qtype| {
        let d = ask(side, name, qtype);
        assert_eq!(d.status, "NOERROR", "{name} {qtype}: {d:?}");
        d.answers
    };

    // Behind the peer: asked of gw2 through the tunnel.
    assert_eq!(
        answer(Side::A, "camera.gw2.ovl.example", "A"),
        [cam.to_string()]
    );
    assert_eq!(answer(Side::A, "gw2.ovl.example", "A"), ["100.64.2.1"]);
    assert_eq!(
        answer(Side::A, &reverse(cam), "PTR"),
        ["camera.gw2.ovl.example."]
    );
    // Inside the overlay there is no IPv6: "no such data", not "no such name".
    assert!(answer(Side::A, "camera.gw2.ovl.example", "AAAA").is_empty());
    assert_eq!(
        ask(Side::A, "nobody.gw2.ovl.example", "A").status,
        "NXDOMAIN"
    );

    // Our own zone, with authority; from the other side through the tunnel too.
    let d = ask(Side::A, "host.gw1.ovl.example", "A");
    assert_eq!(
        (d.status.as_str(), d.answers.as_slice()),
        ("NOERROR", &["100.64.1.10".to_owned()][..])
    );
    assert!(d.flags.iter().any(|f| f == "aa"), "{d:?}");
    assert_eq!(answer(Side::A, "gw1.ovl.example", "A"), ["100.64.1.1"]);
    let d = ask(Side::A, "nobody.gw1.ovl.example", "A");
    assert_eq!(d.status, "NXDOMAIN");
    assert!(d.flags.iter().any(|f| f == "aa"), "{d:?}");
    assert_eq!(
        answer(Side::B, "host.gw1.ovl.example", "A"),
        ["100.64.1.10"]
    );
    assert_eq!(
        answer(Side::B, &reverse(Ipv4Addr::new(100, 64, 1, 10)), "PTR"),
        ["host.gw1.ovl.example."]
    );

    // Outside the overlay: A forwards to its upstream; B has none and refuses.
    let d = ask(Side::A, "upstream.example", "A");
    assert_eq!(d.answers, ["192.0.2.80"], "{d:?}");
    assert!(!d.flags.iter().any(|f| f == "aa"), "{d:?}");
    assert_eq!(ask(Side::B, "upstream.example", "A").status, "REFUSED");

    // A plain host that uses the gateway as its resolver reaches the device by name.
    bed.a
        .lan
        .set_resolv_conf("nameserver 100.64.1.1\nsearch gw1.ovl.example\n")
        .unwrap();
    for name in ["camera.gw2.ovl.example", "gw2.ovl.example"] {
        let ping = bed
            .a
            .lan
            .exec_output("ping", &["-c", "2", "-i", "0.2", "-W", "2", name])
            .unwrap();
        let text = String::from_utf8_lossy(&ping.stdout);
        assert!(ping.status.success(), "ping {name}: {text}\n{}", bed.logs());
        if name.starts_with("camera") {
            assert!(text.contains(&cam.to_string()), "{text}");
        }
    }

    let s = bed.status(Side::A).unwrap();
    let dns = &s["dns"];
    assert_eq!(dns["upstream"][0], "198.51.100.1", "{dns}");
    assert!(dns["asked"].as_u64().unwrap() >= 6, "{dns}");
    assert_eq!(dns["servfail"], 0, "{dns}");
    assert_eq!(dns["dropped"], 0, "{dns}");
    assert_eq!(bed.status(Side::B).unwrap()["dns"]["refused"], 1);

    // What the operator reads: the device, its address and name, the services' figures.
    let text = std::process::Command::new(&bed.bins.adapter)
        .args(["status", "--socket", bed.b.socket().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let row = text
        .lines()
        .find(|l| l.contains(&camera.mac))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains(&cam.to_string()) && row.contains("camera.gw2.ovl.example"),
        "{row}"
    );
    assert!(text.contains("dns: queries"), "{text}");
}

/// A DISCOVER from a made-up MAC: `n` picks the MAC.
fn discover_from_random_mac(n: u64) -> Vec<u8> {
    let b = n.to_be_bytes();
    let mac = [0x02, 0xba, b[4], b[5], b[6], b[7]];
    #[expect(clippy::cast_possible_truncation, reason = "an xid")]
    let msg = client_message(
        MessageType::Discover,
        mac,
        n as u32,
        vec![],
        Ipv4Addr::UNSPECIFIED,
        true,
    );
    dhcp_broadcast(mac, &msg)
}

/// A DHCP message as a device without an address sends it: broadcast, from 0.0.0.0.
fn dhcp_broadcast(mac: [u8; 6], msg: &[u8]) -> Vec<u8> {
    inject::udp_frame(
        [0xff; 6],
        mac,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        68,
        67,
        msg,
    )
}

/// A starvation attack (DISCOVERs from ever new MACs, 1,000 a second; issue 49, finding 7)
/// is answered, but its offers hold at most the newcomers' share of the pool (25 of 100)
/// and spend nothing of their bindings: a genuine new device gets its lease within 5 s in
/// the middle of the flood, a device that had a lease gets it back, and the pool never runs
/// dry.
#[test]
fn a_discover_flood_locks_no_newcomer_out() {
    let cfg = "[dhcp]\npool = \"100.64.1.100-100.64.1.199\"\n";
    let mut bed = bed(&switched(cfg, ""));
    let mut known = host(&mut bed, Side::A, DhcpClient::Udhcpc, "known");
    known.start().unwrap();
    let within = Duration::from_secs(20);
    let ip = known
        .wait_for(&["bound"], 1, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()))
        .get("ip")
        .to_owned();
    let mut newcomer = host(&mut bed, Side::A, DhcpClient::Udhcpc, "newcomer");
    let (attacker, _) = bed.add_host(Side::A, "attacker").unwrap();
    let flood_for = Duration::from_secs(9);
    let (sent, took) = std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            inject::send_frames_for(&attacker, "eth0", flood_for, 1000, discover_from_random_mac)
        });
        // Two seconds into it, a device never seen before asks, and the known one again.
        std::thread::sleep(Duration::from_secs(2));
        let start = std::time::Instant::now();
        newcomer.start().unwrap();
        let bound = newcomer.wait_for(&["bound"], 1, Duration::from_secs(5));
        let took = start.elapsed();
        let e = bound
            .unwrap_or_else(|e| panic!("no lease in 5 s during the flood: {e}\n{}", bed.logs()));
        assert!(in_pool(e.get("ip").parse().unwrap()), "{e:?}");
        known.stop().unwrap();
        known.start().unwrap();
        let e = known
            .wait_for(&["bound"], 2, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
        assert_eq!(e.get("ip"), ip, "the known device kept its address");
        (flood.join().unwrap().unwrap(), took)
    });
    let s = bed.status(Side::A).unwrap();
    let dhcp = &s["dhcp"];
    eprintln!("{sent} DISCOVERs in {flood_for:?}, the newcomer bound after {took:?}: {dhcp}");
    let n = |k: &str| dhcp[k].as_u64().unwrap_or_else(|| panic!("no {k}: {dhcp}"));
    assert!(sent > 8000, "only {sent} DISCOVERs sent");
    // The flood was answered and contained: its offers made room for one another.
    assert!(n("offers_displaced") > 1000, "{dhcp}");
    assert_eq!(n("pool_exhausted"), 0, "{dhcp}");
    assert_eq!(n("starvation_refused"), 0, "{dhcp}");
}

/// ARP on the LAN (issue 49, finding 7): a device that announces an address of the pool
/// nobody holds gets nothing sent to it (the other site's pings to that address are dropped
/// and counted); a device that claims the gateway's own address is answered at once with
/// the gateway's announcement, and its neighbour's cache points at the gateway again within
/// a second.
#[test]
fn arp_claims_take_neither_an_unleased_address_nor_the_gateways() {
    let mut bed = bed(&switched("", ""));
    let (spoofer, spoofer_mac) = bed.add_host(Side::A, "spoofer").unwrap();
    let spoofer_mac = parse_mac(&spoofer_mac);
    let gw = bed.a.gateway;
    let gw_mac = bed.status(Side::A).unwrap()["adapter"]["gateway_mac"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = bed.status(Side::A).unwrap();

    // An unleased address of the pool, announced: the other site's pings to it go nowhere.
    let free: Ipv4Addr = "100.64.1.150".parse().unwrap();
    // ping fills its payload with this pattern (16 bytes at most).
    let needle = b"for-the-unleased".to_vec();
    inject::send_frames(
        &spoofer,
        "eth0",
        vec![
            inject::arp_frame(1, spoofer_mac, free, free),
            inject::arp_frame(2, spoofer_mac, free, free),
        ],
    )
    .unwrap();
    let heard = std::thread::scope(|s| {
        let capture = s.spawn(|| {
            inject::count_frames_containing(
                &spoofer,
                "eth0",
                needle.clone(),
                Duration::from_secs(3),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        let _ = bed.b.lan.exec_output(
            "ping",
            &[
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "1",
                "-p",
                &hex(b"for-the-unleased"),
                &free.to_string(),
            ],
        );
        capture.join().unwrap().unwrap()
    });
    assert_eq!(heard, 0, "the announcing device got the pings for {free}");
    let after = bed.status(Side::A).unwrap();
    assert!(
        counter(&after, "drop_neighbour_unknown") >= counter(&before, "drop_neighbour_unknown") + 3,
        "{}",
        after["counters"]
    );

    // The gateway's address, claimed: the LAN host (which knows the gateway) is put right.
    bed.ping_ok(&bed.a.lan, gw, cyphonic_e2e::bed::Ping::count(1));
    let neigh = |bed: &TwoSites| {
        bed.a
            .lan
            .ip(&["neigh", "show", &gw.to_string(), "dev", "eth0"])
            .unwrap()
    };
    assert!(neigh(&bed).contains(&gw_mac), "{}", neigh(&bed));
    let announcement = {
        // The gateway's own: sender MAC and address the gateway's, target the gateway.
        let mut n = parse_mac(&gw_mac).to_vec();
        n.extend(gw.octets());
        n.extend([0; 6]);
        n.extend(gw.octets());
        n
    };
    let claimed_at = std::time::Instant::now();
    let seen = std::thread::scope(|s| {
        let capture = s.spawn(|| {
            inject::count_frames_containing(
                &bed.a.lan,
                "eth0",
                announcement.clone(),
                Duration::from_secs(1),
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        inject::send_frames(
            &spoofer,
            "eth0",
            vec![inject::arp_frame(1, spoofer_mac, gw, gw)],
        )
        .unwrap();
        capture.join().unwrap().unwrap()
    });
    assert!(
        seen >= 1,
        "no announcement of the gateway within a second of the claim"
    );
    assert!(claimed_at.elapsed() < Duration::from_secs(2));
    let cache = neigh(&bed);
    assert!(
        cache.contains(&gw_mac),
        "the LAN host's cache still points at the claimant: {cache}"
    );
    let claims = counter(&bed.status(Side::A).unwrap(), "arp_gateway_claims");
    assert!(claims >= 1, "the claim was not counted");
}

/// The bytes of `b` in hex, for ping's `-p` pattern.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Fragments that would end past a datagram's 65,535 bytes (issue 49, finding 7) are not
/// carried across; a later fragment that fits is.
#[test]
fn fragments_past_the_largest_datagram_are_not_carried() {
    let bed = bed(&BedOptions::default());
    let gw_mac = parse_mac(
        bed.status(Side::A).unwrap()["adapter"]["gateway_mac"]
            .as_str()
            .unwrap(),
    );
    let (src, dst, mac) = (bed.a.host_ip, bed.b.host_ip, parse_mac(&bed.a.host_mac));
    let tagged = |tag: &str, len: usize| {
        let mut t = tag.as_bytes().to_vec();
        t.resize(len, b'.');
        t
    };
    let frames: Vec<Vec<u8>> = [
        (100u16, tagged("a later fragment that fits", 104)),
        (8191, tagged("ending past 65535 by 100", 100)),
        (8180, tagged("ending past 65535 by 1400", 1400)),
    ]
    .iter()
    .map(|(offset, payload)| {
        inject::ipv4_frame(
            gw_mac,
            mac,
            &inject::ipv4_packet(17, src, dst, 0x6161, *offset, payload),
        )
    })
    .collect();
    let before = bed.status(Side::A).unwrap();
    let seen = std::thread::scope(|s| {
        let capture = s.spawn(|| {
            inject::count_frames_containing_each(
                &bed.b.lan,
                "eth0",
                vec![
                    b"a later fragment that fits".to_vec(),
                    b"ending past 65535 by 100".to_vec(),
                    b"ending past 65535 by 1400".to_vec(),
                ],
                Duration::from_secs(3),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        inject::send_frames(&bed.a.lan, "eth0", frames).unwrap();
        capture.join().unwrap().unwrap()
    });
    assert_eq!(seen, [1, 0, 0], "{}", bed.logs());
    let after = bed.status(Side::A).unwrap();
    assert_eq!(
        counter(&after, "drop_malformed") - counter(&before, "drop_malformed"),
        2,
        "{}",
        after["counters"]
    );
}

/// A small deterministic generator (xorshift64) for the garbage.
struct Noise(u64);

impl Noise {
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0.to_le_bytes()[0]
            })
            .collect()
    }

    fn below(&mut self, n: usize) -> usize {
        usize::from(u16::from_le_bytes([self.bytes(1)[0], self.bytes(1)[0]])) % n
    }
}

/// DHCP payloads that are not DHCP, or broken DHCP.
fn dhcp_garbage(mac: [u8; 6]) -> Vec<Vec<u8>> {
    let mut noise = Noise(0x00d1_ce5e_ed00_0001);
    let discover = client_message(
        MessageType::Discover,
        mac,
        7,
        vec![],
        Ipv4Addr::UNSPECIFIED,
        true,
    );
    let mut corpus = vec![
        vec![],
        vec![1],
        vec![0; 240],
        discover[..100].to_vec(),
        discover[..239].to_vec(),
    ];
    // A reply where a request belongs.
    let mut reply = discover.clone();
    reply[0] = 2;
    corpus.push(reply);
    // Options that run past the end: message type with length 200.
    let mut overrun = discover[..240].to_vec();
    overrun.extend_from_slice(&[53, 200, 1]);
    corpus.push(overrun);
    // A message type nobody defined.
    let mut odd = discover[..240].to_vec();
    odd.extend_from_slice(&[53, 1, 99, 255]);
    corpus.push(odd);
    // Then noise of every length, some with the magic cookie in place.
    for i in 0..150 {
        let len = noise.below(600);
        let mut m = noise.bytes(len);
        if i % 2 == 0 && m.len() >= 240 {
            m[0] = 1;
            m[236..240].copy_from_slice(&[99, 130, 83, 99]);
        }
        corpus.push(m);
    }
    corpus
}

/// DNS payloads that are not DNS, or not questions.
fn dns_garbage() -> Vec<Vec<u8>> {
    let mut noise = Noise(0x0d05_ba5e_0000_0002);
    // Header: id 0x4242, a standard query with RD, one question.
    let query = |qd: u8, body: &[u8]| {
        let mut m = vec![0x42, 0x42, 0x01, 0x00, 0, qd, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(body);
        m
    };
    let question = b"\x04host\x03gw1\x03ovl\x07example\x00\x00\x01\x00\x01";
    let mut corpus = vec![
        vec![],
        vec![0x42],
        vec![0x42, 0x42, 0x01, 0x00, 0, 1],
        // A question cut short.
        query(1, &question[..9]),
        // More questions announced than sent.
        query(5, question),
        // A label longer than the message.
        query(1, b"\x3fabc"),
        // A compression pointer to itself.
        query(1, b"\xc0\x0c\x00\x01\x00\x01"),
    ];
    // A response where a question belongs: QR set.
    let mut response = query(1, question);
    response[2] |= 0x80;
    corpus.push(response);
    for _ in 0..150 {
        let len = noise.below(300);
        corpus.push(noise.bytes(len));
    }
    corpus
}

/// Sends each payload as a UDP datagram from `ns` to `to`, a millisecond apart.
fn send_datagrams(ns: &cyphonic_e2e::Netns, to: &str, payloads: Vec<Vec<u8>>) {
    let to = to.to_owned();
    inject::inside(ns, move || {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
        for p in payloads {
            sock.send_to(&p, to.as_str())?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    })
    .unwrap();
}

fn counter(s: &Value, name: &str) -> u64 {
    s["counters"][name].as_u64().unwrap()
}

/// Truncated and garbage DHCP and DNS, from the LAN and through the tunnel from the peer's
/// LAN, never bring the daemon down: every message is counted as ignored or dropped, and real
/// clients are still served afterwards.
#[test]
fn garbage_dhcp_and_dns_are_counted_and_dropped() {
    let mut bed = bed(&switched("", ""));
    // The tunnel is up before the garbage goes through it.
    let d = dig(&bed.b.lan, bed.b.gateway, "host.gw1.ovl.example", "A").unwrap();
    assert_eq!(d.answers, ["100.64.1.10"], "{d:?}\n{}", bed.logs());
    let before = bed.status(Side::A).unwrap();

    // DHCP, broadcast from a device without an address.
    let mac = parse_mac(&bed.a.host_mac);
    let dhcp = dhcp_garbage(mac);
    let dhcp_sent = dhcp.len() as u64;
    // Each from a MAC of its own: one device is held to a few DHCP messages a second
    // (drop_service_rate), and here every message is to reach the parser.
    let frames: Vec<Vec<u8>> = dhcp
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let [hi, lo] = u16::try_from(i).unwrap().to_be_bytes();
            dhcp_broadcast([0x02, 0xdd, 0, 0, hi, lo], p)
        })
        .collect();
    for chunk in frames.chunks(20) {
        inject::send_frames(&bed.a.lan, "eth0", chunk.to_vec()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    // Broken IPv4 and UDP headers around port 67 and 53.
    // Devices reach the gateway at its own MAC, not the LAN interface's (gateway_mac).
    let gw_mac = parse_mac(before["adapter"]["gateway_mac"].as_str().unwrap());
    assert_ne!(
        gw_mac,
        parse_mac(&cyphonic_e2e::bed::mac_of(&bed.a.adapter_ns, "lan").unwrap())
    );
    let mut broken = Vec::new();
    for (dst, port) in [(Ipv4Addr::BROADCAST, 67), (bed.a.gateway, 53)] {
        let good = inject::udp_frame(gw_mac, mac, bed.a.host_ip, dst, 5353, port, b"\x00\x00");
        let mut long_ip = good.clone();
        long_ip[16..18].copy_from_slice(&1400u16.to_be_bytes());
        let mut long_udp = good.clone();
        long_udp[38..40].copy_from_slice(&900u16.to_be_bytes());
        let mut bad_ihl = good.clone();
        bad_ihl[14] = 0x44;
        broken.extend([long_ip, long_udp, bad_ihl, good[..30].to_vec()]);
    }
    inject::send_frames(&bed.a.lan, "eth0", broken).unwrap();

    // DNS from the LAN and from the peer's LAN through the tunnel.
    let dns = dns_garbage();
    let dns_sent = 2 * dns.len() as u64;
    send_datagrams(&bed.a.lan, "100.64.1.1:53", dns.clone());
    send_datagrams(&bed.b.lan, "100.64.1.1:53", dns);

    let got = |s: &Value| {
        counter(s, "dns_received") - counter(&before, "dns_received") >= dns_sent
            && counter(s, "dhcp_received") - counter(&before, "dhcp_received") >= dhcp_sent
    };
    let mut after = bed.status(Side::A).unwrap();
    let _ = cyphonic_e2e::wait_until(Duration::from_secs(5), "the garbage counted", || {
        bed.status(Side::A).is_ok_and(|s| {
            let done = got(&s);
            after = s;
            done
        })
    });
    let delta = |name: &str| counter(&after, name) - counter(&before, name);
    eprintln!(
        "DHCP {dhcp_sent} sent: {}\nDNS {dns_sent} sent: {}\ncounters: {}",
        after["dhcp"], after["dns"], after["counters"]
    );
    assert!(bed.a.adapter.as_mut().unwrap().running(), "{}", bed.logs());
    assert!(!bed.a.log_text().contains("panicked"), "{}", bed.logs());

    // Every DHCP message reached the server and none got an answer.
    assert_eq!(delta("dhcp_received"), dhcp_sent, "{}", after["counters"]);
    let ignored =
        after["dhcp"]["ignored"].as_u64().unwrap() - before["dhcp"]["ignored"].as_u64().unwrap();
    assert_eq!(ignored, dhcp_sent, "{}", after["dhcp"]);
    assert!(
        after["dhcp"]["ignored_by_reason"]["malformed"]
            .as_u64()
            .unwrap()
            > 50,
        "{}",
        after["dhcp"]
    );
    assert_eq!(delta("dhcp_sent"), 0);
    // Every DNS message reached the service: dropped, or answered with an error.
    assert_eq!(delta("dns_received"), dns_sent, "{}", after["counters"]);
    let dns_delta =
        |k: &str| after["dns"][k].as_u64().unwrap() - before["dns"][k].as_u64().unwrap();
    assert_eq!(
        dns_delta("queries") + dns_delta("dropped"),
        dns_sent,
        "{}",
        after["dns"]
    );
    assert!(dns_delta("dropped") > 2 * 100, "{}", after["dns"]);
    // The broken headers died in the data plane.
    assert!(delta("drop_malformed") >= 6, "{}", after["counters"]);

    // Real clients are still served.
    let d = dig(&bed.b.lan, bed.b.gateway, "host.gw1.ovl.example", "A").unwrap();
    assert_eq!(d.answers, ["100.64.1.10"], "{d:?}");
    let d = dig(&bed.a.lan, bed.a.gateway, "gw2.ovl.example", "A").unwrap();
    assert_eq!(d.answers, ["100.64.2.1"], "{d:?}");
    let mut dev = host(&mut bed, Side::A, DhcpClient::Udhcpc, "survivor");
    dev.start().unwrap();
    dev.wait_for(&["bound"], 1, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
}

/// The ICMP errors the gateway sends its LAN keep to one rate (200 a second after a burst of
/// as many, RFC 1812 §4.3.2.8) however many capture threads read the LAN: a burst of TTL-1
/// pings from each CPU (each CPU's frames reach the sparse capture thread of that CPU) gets
/// no more time-exceeded answers than one bucket allows, and the rest are counted.
#[test]
fn icmp_errors_keep_one_rate_across_capture_threads() {
    const PER_CPU: u32 = 400;
    let bed = bed(&BedOptions::default());
    let before = bed.status(Side::A).unwrap();
    let gw_mac = parse_mac(before["adapter"]["gateway_mac"].as_str().unwrap());
    let (mac, src, dst) = (parse_mac(&bed.a.host_mac), bed.a.host_ip, bed.b.host_ip);
    let cpus = cyphonic_netio::allowed_cpus().unwrap();
    let start = std::time::Instant::now();
    let senders: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            inject::spawn_inside(&bed.a.lan, move || {
                let place = cyphonic_netio::Placement {
                    cpus: vec![cpu],
                    realtime_priority: 0,
                };
                place.apply()?;
                let sock = inject::sender("eth0")?;
                for i in 0..PER_CPU {
                    let mut f = inject::echo_frame(gw_mac, mac, src, dst, &i.to_be_bytes());
                    // TTL 1, and the header's checksum again.
                    f[22] = 1;
                    f[24..26].fill(0);
                    let sum = inject::checksum(&f[14..34]);
                    f[24..26].copy_from_slice(&sum.to_be_bytes());
                    sock.send(&f)?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for s in senders {
        inject::joined(s).unwrap();
    }
    let sent = u64::from(PER_CPU) * cpus.len() as u64;
    let delta = |s: &Value, name: &str| counter(s, name) - counter(&before, name);
    let mut after = before.clone();
    let handled = cyphonic_e2e::wait_until(Duration::from_secs(5), "the pings handled", || {
        bed.status(Side::A).is_ok_and(|s| {
            let done = delta(&s, "icmp_time_exceeded") + delta(&s, "icmp_rate_limited") >= sent;
            after = s;
            done
        })
    });
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!(
        "{} CPUs, {sent} TTL-1 pings in {elapsed:.3} s: {} answered, {} rate-limited",
        cpus.len(),
        delta(&after, "icmp_time_exceeded"),
        delta(&after, "icmp_rate_limited")
    );
    assert!(handled.is_ok(), "{}\n{}", after["counters"], bed.logs());
    // One bucket: its burst, and what it gained while the pings were handled.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "small"
    )]
    let allowed = 200 + (200.0 * elapsed).ceil() as u64;
    assert!(
        delta(&after, "icmp_time_exceeded") <= allowed,
        "{} answered, {allowed} allowed\n{}",
        delta(&after, "icmp_time_exceeded"),
        after["counters"]
    );
    assert!(
        delta(&after, "icmp_rate_limited") > 0,
        "{}",
        after["counters"]
    );
}

/// A DHCPv6 Request as a device sends it, from a made-up MAC and DUID (`n` picks both), to
/// the server whose DUID is `server`: from its link-local address to the servers' group.
fn dhcp6_request_from_random_duid(n: u64, server: &[u8]) -> Vec<u8> {
    use cyphonic_vip::testing::{MessageType6, client_message6};
    let b = n.to_be_bytes();
    let mac = [0x02, 0xd6, b[4], b[5], b[6], b[7]];
    let duid = [&[0u8, 4][..], &b].concat();
    let msg = client_message6(MessageType6::Request, &duid, &[(1, None)], Some(server));
    let ll = std::net::Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        0xd6,
        u16::from_be_bytes([b[4], b[5]]),
        0,
        u16::from_be_bytes([b[6], b[7]]),
    );
    let to = "ff02::1:2".parse().unwrap();
    inject::udp6_frame(([0x33, 0x33, 0, 1, 0, 2], mac), (ll, 546), (to, 547), &msg)
}

/// Issue 53: a device running ISC `dhclient -6` gets a stateful address of the adapter's
/// DHCPv6 pool with the gateway as DNS server and the adapter's zone as search list, and
/// uses it (the adapter's anti-spoofing table holds it for its MAC). A flood of Requests
/// from random DUIDs and MACs takes at most the newcomers' share of the pool; the adapter is
/// killed (-9) while it writes their bindings; the lease file it leaves loads, the genuine
/// binding is in it, and the device gets the same address back from the restarted adapter.
#[test]
fn dhclient6_gets_an_address_that_survives_a_duid_flood_and_kill_9() {
    let mut opts = switched("", "");
    opts.ipv6 = true;
    let mut bed = bed(&opts);
    let mut dev = host(&mut bed, Side::A, DhcpClient::Dhclient6, "sensor");
    dev.start().unwrap();
    let within = Duration::from_secs(20);
    let bound = dev
        .wait_for(&["bound6"], 1, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let ip: std::net::Ipv6Addr = bound.get("ip").parse().unwrap();
    let low = ip.segments()[7];
    assert!(
        ip.to_string().starts_with("fd7a:0:1:100::") && (0x1000..=0x1fff).contains(&low),
        "{bound:?}"
    );
    assert_eq!(bound.get("dns"), "fd7a:0:1:100::1", "{bound:?}");
    assert!(bound.get("domain").contains("gw1.ovl.example"), "{bound:?}");
    // The device uses it: the gateway answers a ping from that address.
    let ping = |dev: &DhcpHost| ping_gateway6_from(&dev.ns, ip);
    // The /64 is on-link once the adapter's advertisement answered the device's
    // solicitation (DHCPv6 gives an address only: RFC 8415 §21.6).
    let routes = || {
        let out = dev.ns.exec_output("ip", &["-6", "route"]).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    cyphonic_e2e::wait_until(within, "the advertised /64", || {
        routes().contains("fd7a:0:1:100::/64")
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", routes(), bed.logs()));
    let out = ping(&dev);
    let routes = routes();
    let addrs = dev.ns.exec_output("ip", &["-6", "addr"]).unwrap();
    assert!(
        out.status.success(),
        "{out:?}\n{routes}\n{addrs:?}\n{}\n{}",
        bed.status(Side::A).unwrap()["counters"],
        bed.logs()
    );
    let s = bed.status(Side::A).unwrap();
    let dhcp6 = |s: &Value, k: &str| {
        s["dhcp6"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("no dhcp6.{k} in the status: {}", s["dhcp6"]))
    };
    assert_eq!(dhcp6(&s, "bindings"), 1);
    let lease_file = bed.a.lease_file();
    assert!(
        std::fs::read_to_string(&lease_file)
            .unwrap()
            .contains(&ip.to_string())
    );

    // The flood: Requests from ever new DUIDs and MACs, 1,000 a second; the adapter is killed
    // while their bindings are being written.
    let gw_mac = s["adapter"]["gateway_mac"].as_str().unwrap().to_owned();
    let server = [&[0u8, 3, 0, 1][..], &parse_mac(&gw_mac)].concat();
    let (attacker, _) = bed.add_host(Side::A, "attacker").unwrap();
    let writes_before = s["dhcp"]["lease_writes"].as_u64().unwrap();
    let mut seen = Value::Null;
    let sent = std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            let server = server.clone();
            inject::send_frames_for(&attacker, "eth0", Duration::from_secs(3), 1000, move |n| {
                dhcp6_request_from_random_duid(n, &server)
            })
        });
        // Killed as soon as the guard refuses: the writer (at most a write a second) is still
        // catching up with the last bindings.
        cyphonic_e2e::wait_until(Duration::from_secs(3), "the guard refusing", || {
            bed.status(Side::A).is_ok_and(|s| {
                seen = s.clone();
                s["dhcp"]["lease_writes"].as_u64() > Some(writes_before)
                    && s["dhcp6"]["starvation_refused"].as_u64() > Some(0)
            })
        })
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", seen["dhcp6"], bed.logs()));
        bed.stop(Side::A, "KILL").unwrap();
        flood.join().unwrap().unwrap()
    });
    eprintln!("{sent} Requests; killed at {}", seen["dhcp6"]);
    // The newcomers' share of the 4,096 addresses (1,024), the genuine one among them: it
    // too was new within the window.
    assert_eq!(dhcp6(&seen, "bindings"), 1024, "{}", seen["dhcp6"]);
    let text = std::fs::read_to_string(&lease_file).unwrap();
    let file: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    let kept = file["leases6"].as_array().unwrap();
    assert!(
        kept.iter()
            .any(|l| l["ip"] == ip.to_string() && l["active"] == true),
        "the genuine binding is not in the file"
    );

    bed.start(Side::A).unwrap();
    let s = bed.status(Side::A).unwrap();
    assert!(dhcp6(&s, "bindings") >= 1, "{}", s["dhcp6"]);
    let log = bed.a.log_text();
    assert!(
        !log.contains("corrupt") && !log.contains("panicked"),
        "{log}"
    );
    // The device, restarted, gets its address back (the flood's newcomers took none of it).
    dev.stop().unwrap();
    dev.start().unwrap();
    let again = dev
        .wait_for(&["bound6", "reboot6", "renew6", "rebind6"], 2, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert_eq!(again.get("ip"), ip.to_string(), "{again:?}");
    let out = ping(&dev);
    assert!(out.status.success(), "{out:?}\n{}", bed.logs());
}

/// Issue 53: dhcpcd as Raspberry Pi OS runs it (dual stack) gets a DHCPv4 lease and, from
/// the advertisement's M flag, a DHCPv6 address with the DNS server and search list; the
/// device is one name with an A and an AAAA (its DHCPv6 address), and it pings the gateway
/// from that address.
#[test]
fn dhcpcd_gets_both_families_and_one_name() {
    let mut opts = switched("", "");
    opts.ipv6 = true;
    let mut bed = bed(&opts);
    let mut dev = host(&mut bed, Side::A, DhcpClient::Dhcpcd, "pi");
    dev.start().unwrap();
    let within = Duration::from_secs(30);
    let v4 = dev
        .wait_for(&["bound", "reboot"], 1, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let v4_ip: Ipv4Addr = v4.get("ip").parse().unwrap();
    assert_eq!(v4_ip.octets()[..3], [100, 64, 1], "{v4:?}");
    let v6 = dev
        .wait_for(&["bound6", "reboot6"], 1, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let ip: std::net::Ipv6Addr = v6.get("ip").parse().unwrap();
    assert!(
        ip.to_string().starts_with("fd7a:0:1:100::")
            && (0x1000..=0x1fff).contains(&ip.segments()[7]),
        "{v6:?}"
    );
    assert_eq!(v6.get("dns"), "fd7a:0:1:100::1", "{v6:?}");
    assert!(v6.get("domain").contains("gw1.ovl.example"), "{v6:?}");
    // One name, both families: its AAAA is the DHCPv6 address.
    let name = "pi.gw1.ovl.example";
    wait_for_aaaa(&bed, &dev.ns, name, ip);
    cyphonic_e2e::wait_until(within, "a ping from the DHCPv6 address", || {
        ping_gateway6_from(&dev.ns, ip).status.success()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    dev.stop().unwrap();
}

/// `ns` pings the gateway's IPv6 address twice from its address `src`.
fn ping_gateway6_from(ns: &cyphonic_e2e::Netns, src: std::net::Ipv6Addr) -> std::process::Output {
    let src = src.to_string();
    let args = [
        "-6",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "2",
        "-I",
        &src,
        "fd7a:0:1:100::1",
    ];
    ns.exec_output("ping", &args).unwrap()
}

/// The AAAA the adapter's DNS service at the gateway vIP gives `name`, asked from `ns`
/// (`dig +short`: empty for none).
fn aaaa_of(ns: &cyphonic_e2e::Netns, name: &str) -> String {
    let args = ["+tries=1", "+time=2", "+short", "@100.64.1.1", name, "AAAA"];
    let out = ns.exec_output("dig", &args).unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Waits (10 s at most) until `name`'s AAAA, asked from `ns`, is `ip`.
fn wait_for_aaaa(bed: &TwoSites, ns: &cyphonic_e2e::Netns, name: &str, ip: std::net::Ipv6Addr) {
    cyphonic_e2e::wait_until(Duration::from_secs(10), "the AAAA", || {
        aaaa_of(ns, name) == ip.to_string()
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", aaaa_of(ns, name), bed.logs()));
}

/// The global IPv6 addresses on a host's `eth0` inside `prefix` (dotted text start).
fn addresses6(ns: &cyphonic_e2e::Netns, prefix: &str) -> Vec<std::net::Ipv6Addr> {
    let out = ns
        .exec_output(
            "ip",
            &["-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("tentative"))
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet6").nth(1))
        .filter_map(|a| a.split('/').next())
        .filter(|a| a.starts_with(prefix))
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// Issue 53: systemd-networkd's clients get a DHCPv4 lease and, from the advertisement's M
/// flag, a DHCPv6 address of the pool beside their SLAAC one, with the DNS server and search
/// list; the device's AAAA is its DHCPv6 address.
#[test]
fn systemd_networkd_gets_both_families_and_one_name() {
    let mut opts = switched("", "");
    opts.ipv6 = true;
    let mut bed = bed(&opts);
    let mut dev = host(&mut bed, Side::A, DhcpClient::Networkd, "nw");
    dev.start().unwrap();
    let within = Duration::from_secs(30);
    let in_pool6 = |a: &std::net::Ipv6Addr| (0x1000..=0x1fff).contains(&a.segments()[7]);
    let mut found = Vec::new();
    cyphonic_e2e::wait_until(within, "a DHCPv6 address", || {
        found = addresses6(&dev.ns, "fd7a:0:1:100:");
        found.iter().any(in_pool6) && dev.address().is_some()
    })
    .unwrap_or_else(|e| panic!("{e}: {found:?} {:?}\n{}", dev.address(), bed.logs()));
    let ip = *found.iter().find(|a| in_pool6(a)).unwrap();
    let state = dev.networkd_state();
    assert!(state.contains("fd7a:0:1:100::1"), "{state}");
    assert!(state.contains("gw1.ovl.example"), "{state}");
    wait_for_aaaa(&bed, &dev.ns, "nw.gw1.ovl.example", ip);
    let out = ping_gateway6_from(&dev.ns, ip);
    assert!(out.status.success(), "{out:?}\n{}", bed.logs());
    dev.stop().unwrap();
}

/// Issue 53: a reservation's fixed IPv6 address (`vip6`), added by a reload, is what ISC
/// `dhclient -6` gets on that MAC, and the reserved name's AAAA.
#[test]
fn a_reservation_fixes_a_devices_ipv6_address() {
    let mut opts = switched("", "");
    opts.ipv6 = true;
    let mut bed = bed(&opts);
    let mut dev = host(&mut bed, Side::A, DhcpClient::Dhclient6, "fixed");
    let fixed: std::net::Ipv6Addr = "fd7a:0:1:100::77".parse().unwrap();
    opts.a.extra = format!(
        "[[reservation]]\nmac = \"{}\"\nvip = \"100.64.1.77\"\nvip6 = \"{fixed}\"\nhostname = \"fixed\"\n",
        dev.mac
    );
    bed.write_config(Side::A, &opts).unwrap();
    let log = bed.reload(Side::A, 1).unwrap();
    assert!(!log.contains("the running one stays"), "{log}");
    dev.start().unwrap();
    let bound = dev
        .wait_for(&["bound6"], 1, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert_eq!(bound.get("ip"), fixed.to_string(), "{bound:?}");
    // Asked by the site's other host (the device itself has no IPv4).
    assert_eq!(
        aaaa_of(&bed.a.lan, "fixed.gw1.ovl.example"),
        fixed.to_string()
    );
    dev.stop().unwrap();
}
