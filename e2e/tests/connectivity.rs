//! Connectivity where users are (issue 25): both sites behind NATs, a NAT that changes its
//! mapping mid-stream, two symmetric NATs, two IPv6-only sites, real rekeys; on the two-site
//! bed with the cloud behind the router, nftables NATs in front of the adapters, real clients
//! on the LANs.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a test: panics are failures; Mbit/s are small and positive"
)]

use std::net::Ipv4Addr;
use std::time::Duration;

use cyphonic_e2e::bed::{
    BedOptions, CloudOptions, IperfRun, MappingRouter, Nat, Ping, Side, SiteOptions, TwoSites,
    port_mappings,
};
use cyphonic_e2e::node::VIP as NODE_VIP;
use cyphonic_e2e::{Netns, veth, wait_until};

const GW_A: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 1);
const GW_B: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 1);
const HOST_A: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 10);
const HOST_B: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 10);
const CAMERA: &str = "camera.gw1.ovl.example";

/// Both sites behind NATs of these kinds, with the cloud; started, and the cloud has recorded
/// both probes of both adapters (what it decides the route from).
fn behind(a: Nat, b: Nat) -> TwoSites {
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        a: SiteOptions {
            nat: Some(a),
            ..SiteOptions::default()
        },
        b: SiteOptions {
            nat: Some(b),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    wait_until(Duration::from_secs(10), "both adapters' probes", || {
        bed.cloud_counter("endpoint_writes").unwrap() >= 4
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    bed
}

/// A's host asks for B's host by name, then each pings the other.
fn meet(bed: &TwoSites) {
    assert_eq!(
        bed.resolve(&bed.a.lan, GW_A, "host.gw2.ovl.example"),
        [HOST_B.to_string()]
    );
    bed.ping_ok(&bed.a.lan, HOST_B, Ping::default());
    bed.ping_ok(&bed.b.lan, HOST_A, Ping::default());
}

/// A site's only peer in its status document.
fn peer(bed: &TwoSites, side: Side) -> serde_json::Value {
    bed.status(side).unwrap()["peers"][0].clone()
}

/// Both sites behind symmetric NATs whose routers run miniupnpd and grant or refuse as
/// `allow` says; started, with the cloud; each adapter's status once it shows what its router
/// said. Granting, A's router speaks PCP, NAT-PMP and UPnP-IGD (PCP is asked first), B's
/// UPnP-IGD only; refusing, both speak UPnP-IGD only: miniupnpd's PCP server walks all 65,535
/// external ports before it refuses, logging each, which takes it half a minute here.
fn behind_mapping_routers(allow: bool) -> (TwoSites, [serde_json::Value; 2]) {
    let router = |pcp: bool| MappingRouter {
        pcp,
        upnp: true,
        allow,
        // A's mapping is renewed every 10 s.
        max_lifetime: if pcp { 20 } else { 7200 },
    };
    let site = |pcp: bool| SiteOptions {
        nat: Some(Nat::Symmetric),
        mapping: Some(router(pcp)),
        ..SiteOptions::default()
    };
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        a: site(allow),
        b: site(false),
        ..BedOptions::default()
    })
    .unwrap();
    let mut said = [serde_json::Value::Null, serde_json::Value::Null];
    wait_until(Duration::from_secs(30), "both routers' answers", || {
        for (i, side) in [Side::A, Side::B].into_iter().enumerate() {
            said[i] = bed.status(side).unwrap()["cloud"]["mapping"].clone();
        }
        said.iter().all(|m| !m.is_null())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    // The cloud has them too (a registration goes out as its mapping changes).
    wait_until(Duration::from_secs(10), "the mappings at the cloud", || {
        ["gw1.ovl.example", "gw2.ovl.example"].iter().all(|name| {
            let out = bed.cloud_cli(&["members", "show", name, "--json"]).unwrap();
            let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            !shown[0]["mapping"].is_null()
        })
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    (bed, said)
}

/// What a router said, as a status's `cloud.mapping` shows it: the result and the protocol.
fn said(mapping: &serde_json::Value) -> (Option<&str>, Option<&str>) {
    (mapping["result"].as_str(), mapping["protocol"].as_str())
}

/// Two symmetric NATs would need the relay; their routers map the tunnel port (PCP on A's,
/// UPnP-IGD on B's), the adapters register the mappings, and the pair is direct through them.
/// A's mapping (a 20 s lifetime) is renewed; each adapter gives its mapping back when it stops.
#[test]
fn behind_symmetric_nats_whose_routers_map_ports_the_pair_is_direct() {
    let (mut bed, [a, b]) = behind_mapping_routers(true);
    assert_eq!(
        [said(&a), said(&b)],
        [("mapped", "pcp"), ("mapped", "upnp")].map(|(r, p)| (Some(r), Some(p))),
        "{a}\n{b}"
    );
    // Each router's public address (the sites' usual ones), at a port of its choosing.
    let at = |m: &serde_json::Value| {
        m["endpoint"]
            .as_str()
            .unwrap()
            .parse::<std::net::SocketAddr>()
            .unwrap()
    };
    assert_eq!(at(&a).ip().to_string(), "198.51.100.2", "{a}");
    assert_eq!(at(&b).ip().to_string(), "203.0.113.2", "{b}");
    meet(&bed);
    for (side, other) in [(Side::A, at(&b)), (Side::B, at(&a))] {
        let p = peer(&bed, side);
        assert_eq!(p["route"], "direct", "{side:?}: {p}\n{}", bed.logs());
        // Reached through the other's mapping, or at the port its NAT gave its answer.
        let endpoint: std::net::SocketAddr = p["endpoint"].as_str().unwrap().parse().unwrap();
        assert_eq!(endpoint.ip(), other.ip(), "{side:?}: {p}");
    }
    assert_eq!(
        bed.cloud_counter("relayed_pairs").unwrap(),
        0,
        "{}",
        bed.logs()
    );
    // A's router granted 20 s: the mapping is asked for again within 10 s, and holds.
    let log = |bed: &TwoSites| {
        let dir = &bed.site_ref(Side::A).dir;
        std::fs::read_to_string(dir.join("miniupnpd.log")).unwrap_or_default()
    };
    let maps = |bed: &TwoSites| log(bed).matches("PCP MAP: added mapping").count();
    let before = maps(&bed);
    wait_until(Duration::from_secs(15), "A's mapping renewed", || {
        maps(&bed) > before
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log(&bed)));
    bed.ping_ok(&bed.b.lan, HOST_A, Ping::default());
    // Stopped, each gives its mapping back.
    for side in [Side::A, Side::B] {
        let nat = bed.site_ref(side).nat.as_ref().unwrap();
        assert_eq!(port_mappings(nat).unwrap().len(), 1, "{side:?}");
        bed.stop(side, "TERM").unwrap();
        let nat = bed.site_ref(side).nat.as_ref().unwrap();
        assert_eq!(
            port_mappings(nat).unwrap(),
            Vec::<String>::new(),
            "{side:?}: {}",
            bed.logs()
        );
    }
}

/// The same routers refusing every mapping: the pair is relayed, and the reason says the
/// mapping was refused; each adapter shows what its router said.
#[test]
fn behind_symmetric_nats_whose_routers_refuse_mappings_the_pair_is_relayed_with_the_reason() {
    let (bed, [a, b]) = behind_mapping_routers(false);
    assert_eq!(
        [said(&a), said(&b)],
        [(Some("refused"), Some("upnp")); 2],
        "{a}\n{b}"
    );
    meet(&bed);
    for side in [Side::A, Side::B] {
        let p = peer(&bed, side);
        assert_eq!(p["route"], "relay", "{side:?}: {p}\n{}", bed.logs());
        assert_eq!(
            p["relay"]["reason"], "symmetric NAT, port mapping refused",
            "{side:?}: {p}"
        );
    }
    for side in [Side::A, Side::B] {
        let nat = bed.site_ref(side).nat.as_ref().unwrap();
        assert!(port_mappings(nat).unwrap().is_empty(), "{side:?}");
    }
}

/// Both sites behind port-preserving NATs, as two offices are: the cloud tells each the
/// other's public mapping, both initiate at once, each side's first packets open its own NAT
/// for the other's, and the tunnel is direct: no relay asked for, none given.
#[test]
fn two_sites_behind_port_preserving_nats_punch_a_direct_path() {
    let bed = behind(Nat::PortPreserving, Nat::PortPreserving);
    meet(&bed);
    // Each talks to the other's NAT (the NATs' public addresses are the sites' 198.51.100.2
    // and 203.0.113.2; the adapters' own are private, 192.0.2.130).
    for (side, nat) in [(Side::A, "203.0.113.2:"), (Side::B, "198.51.100.2:")] {
        let p = peer(&bed, side);
        assert_eq!(p["route"], "direct", "{side:?}: {p}\n{}", bed.logs());
        assert_eq!(p["established"], true, "{side:?}: {p}");
        let endpoint = p["endpoint"].as_str().unwrap_or_default();
        assert!(endpoint.starts_with(nat), "{side:?} talks to {endpoint}");
    }
    assert_eq!(bed.cloud_counter("relay_requests").unwrap(), 0);
    assert_eq!(bed.cloud_counter("relayed_pairs").unwrap(), 0);
    // Each punched first (TTL 2: the punches died at the router, none arrived).
    for side in [Side::A, Side::B] {
        assert_eq!(bed.counter(side, "punches_sent").unwrap(), 1, "{side:?}");
        assert_eq!(
            bed.counter(side, "punches_received").unwrap(),
            0,
            "{side:?}"
        );
    }
    // B's side asks for A's name: the same tunnel.
    assert_eq!(
        bed.resolve(&bed.b.lan, GW_B, "host.gw1.ovl.example"),
        [HOST_A.to_string()]
    );
    let run = IperfRun::start(&bed, Side::B, &[], 2).unwrap();
    let report = run
        .finish()
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let bps = report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    assert!(bps > 10e6, "TCP through the punched path: {bps} bit/s");
    assert_eq!(peer(&bed, Side::A)["route"], "direct");
}

/// Both sites behind symmetric NATs: neither can be reached at the port the cloud saw, so the
/// cloud pairs them through its relay from the first question, and says why.
#[test]
fn behind_two_symmetric_nats_the_pair_is_relayed_with_the_reason() {
    let bed = behind(Nat::Symmetric, Nat::Symmetric);
    meet(&bed);
    for side in [Side::A, Side::B] {
        let p = peer(&bed, side);
        assert_eq!(p["route"], "relay", "{side:?}: {p}\n{}", bed.logs());
        assert_eq!(p["relay"]["reason"], "symmetric NAT", "{side:?}: {p}");
        assert_eq!(p["endpoint"], p["relay"]["address"], "{side:?}: {p}");
    }
    assert_eq!(bed.cloud_counter("relay_requests").unwrap(), 0);
    assert_eq!(bed.cloud_counter("relayed_pairs").unwrap(), 1);
}

/// Both sites behind port-preserving NATs, a TCP stream from A's host to B's; B's NAT gets a
/// new public address mid-stream (as a carrier-grade NAT or a re-dialled line does) and
/// forgets its mappings. Adapter B sees nothing change; A's NAT lets nothing in from B's new
/// address, and A's packets go to B's old one. Both notice their data going unanswered (5 s)
/// and their handshakes too (3 s more), ask the cloud, and move to its relay, keys and all:
/// the stream goes on. Then (issue 55, item 2) the pair finds the direct path again: B's
/// call-me carries its new address, both NATs keep ports, and a pong moves both back.
#[test]
fn a_nat_that_changes_its_mapping_mid_stream_does_not_end_the_stream() {
    let bed = behind(Nat::PortPreserving, Nat::PortPreserving);
    bed.resolve(&bed.a.lan, GW_A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, HOST_B, Ping::default());
    assert_eq!(peer(&bed, Side::A)["route"], "direct");
    let run = IperfRun::start(&bed, Side::B, &["-i", "1"], STREAM_SECS).unwrap();
    let host_b = HOST_B.to_string();
    let pings = std::thread::scope(|s| {
        let pings = s.spawn(|| ping_replies(&bed.a.lan, &host_b, STREAM_SECS - 1));
        std::thread::sleep(Duration::from_secs(3));
        let at = unix_now();
        rebind_b(&bed);
        (pings.join().unwrap(), at)
    });
    let report = run
        .finish()
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let mbit = per_second(&report);
    let (replies, at) = pings;
    let silence = silence_across(&replies, at);
    eprintln!(
        "B's NAT rebound 3 s in: pings silent for {silence:?} s; TCP Mbit/s per second {mbit:?}, longest gap {} s",
        longest_gap(&mbit)
    );
    assert!(
        silence.is_some_and(|s| s < 20.0),
        "pings silent for {silence:?} s\n{}",
        bed.logs()
    );
    assert!(mbit.len() >= 33, "{report}");
    assert!(
        mbit[mbit.len() - 3..].iter().all(|m| *m >= 1),
        "the TCP stream did not come back: {mbit:?}\n{}",
        bed.logs()
    );
    assert!(bed.cloud_counter("relay_requests").unwrap() >= 1);
    for (side, log) in [("A", bed.a.log_text()), ("B", bed.b.log_text())] {
        assert!(
            log.contains("peer relayed") && log.contains("reason=no handshake on the direct path"),
            "{side} was never relayed\n{}",
            bed.logs()
        );
        for line in log.lines().filter(|l| l.contains("peer relayed")) {
            eprintln!("{side}: {line}");
        }
    }
    // Back to direct: B's call-me tells A its new address (B's probes show it to the cloud
    // within 20 s), and the first try, 35 s after the relay, finds it (the entries B's
    // handshakes left at A's NAT before the relay have gone by then): about 13 s after the
    // stream. Pings five times a second run across the move.
    let (replies, moved) = std::thread::scope(|s| {
        let pings = s.spawn(|| ping_replies(&bed.a.lan, &host_b, 30));
        let direct = wait_until(Duration::from_secs(28), "both sides direct", || {
            [Side::A, Side::B].iter().all(|side| {
                let p = peer(&bed, *side);
                p["route"] == "direct" && p["relay"].is_null()
            })
        });
        let moved = unix_now();
        assert!(
            direct.is_ok(),
            "still relayed: A {} B {}\n{}",
            peer(&bed, Side::A),
            peer(&bed, Side::B),
            bed.logs()
        );
        (pings.join().unwrap(), moved)
    });
    let silence = silence_across(&replies, moved);
    eprintln!("back to direct: pings silent for at most {silence:?} s across the move");
    assert!(
        // Five a second: 0.2 s between replies, none lost.
        silence.is_some_and(|s| s < 0.35),
        "pings silent for {silence:?} s across the move to direct\n{}",
        bed.logs()
    );
    assert_eq!(
        peer(&bed, Side::A)["endpoint"],
        "203.0.113.5:51820",
        "A reaches B at its NAT's new address"
    );
    for (side, log) in [("A", bed.a.log_text()), ("B", bed.b.log_text())] {
        for line in log.lines().filter(|l| l.contains("leaving the relay")) {
            eprintln!("{side}: {line}");
        }
    }
    bed.ping_ok(&bed.a.lan, HOST_B, Ping::default());
}

/// How long the path-change tests' TCP streams run: long enough for TCP's retransmission
/// backoff (0.2 s doubling: tries at 12.6 s and 25.4 s after a loss) to find the mended path.
const STREAM_SECS: u64 = 35;

/// B's NAT takes a new public address and forgets its mappings (the kernel's masquerade
/// forgets connections through an address that went).
fn rebind_b(bed: &TwoSites) {
    let nat = bed.b.nat.as_ref().unwrap();
    nat.exec(
        "sysctl",
        &["-qw", "net.ipv4.conf.out.promote_secondaries=1"],
    )
    .unwrap();
    nat.ip(&["addr", "add", "203.0.113.5/24", "dev", "out"])
        .unwrap();
    nat.ip(&["addr", "del", "203.0.113.2/24", "dev", "out"])
        .unwrap();
    nat.ip(&["route", "replace", "default", "via", "203.0.113.1"])
        .unwrap();
}

/// The longest run of seconds below 1 Mbit/s.
fn longest_gap(mbit: &[u64]) -> usize {
    mbit.split(|m| *m >= 1).map(<[u64]>::len).max().unwrap_or(0)
}

/// Now, in unix seconds.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Pings `to` from `ns` five times a second for `secs` seconds (it ends by itself): the unix
/// times of the replies.
fn ping_replies(ns: &Netns, to: &str, secs: u64) -> Vec<f64> {
    let count = (secs * 5).to_string();
    let out = ns
        .exec_output(
            "ping",
            &["-D", "-n", "-i", "0.2", "-W", "1", "-c", &count, to],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect()
}

/// The path's longest silence from `at` on: the longest wait between ping replies, from the
/// last one before `at`, in seconds; `None` when none came after `at`.
fn silence_across(replies: &[f64], at: f64) -> Option<f64> {
    let first = replies.iter().rposition(|t| *t <= at).unwrap_or(0);
    if !replies.iter().any(|t| *t > at) {
        return None;
    }
    let mut times = vec![at.min(replies[first])];
    times.extend(&replies[first..]);
    times.windows(2).map(|w| w[1] - w[0]).reduce(f64::max)
}

/// Two IPv6-only sites (no NAT, no IPv4 between them): the cloud hands each the other's IPv6
/// endpoint, and the tunnel is direct over IPv6; ping both ways and TCP by name.
#[test]
fn two_ipv6_only_sites_talk_directly_over_ipv6() {
    let v6 = SiteOptions {
        v6_only: true,
        ..SiteOptions::default()
    };
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        a: v6.clone(),
        b: v6,
        ..BedOptions::default()
    })
    .unwrap();
    direct_over_ipv6(&bed);
}

/// The two sites meet by name, each talks directly to the other's IPv6 address (no relay
/// asked for nor given), and TCP flows over that path.
fn direct_over_ipv6(bed: &TwoSites) {
    meet(bed);
    for (side, other) in [
        (Side::A, "[fd00:203:0:113::2]:51820"),
        (Side::B, "[fd00:198:51:100::2]:51820"),
    ] {
        let p = peer(bed, side);
        assert_eq!(p["route"], "direct", "{side:?}: {p}\n{}", bed.logs());
        assert_eq!(p["endpoint"], other, "{side:?}: {p}");
    }
    assert_eq!(
        bed.cloud_counter("relay_requests").unwrap(),
        0,
        "{}",
        bed.logs()
    );
    assert_eq!(bed.cloud_counter("relayed_pairs").unwrap(), 0);
    let report = cyphonic_e2e::bed::iperf3(bed, Side::B, &[], 2).unwrap();
    let bps = report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    assert!(bps > 10e6, "TCP over the IPv6 path: {bps} bit/s");
}

/// The Mbit/s of each interval of an iperf3 report (seconds, or what `-i` asked).
fn per_second(report: &serde_json::Value) -> Vec<u64> {
    report["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["sum"]["bits_per_second"].as_f64().unwrap() / 1e6) as u64)
        .collect()
}

/// Two static peers rotating keys every 2 s (`danger_rekey_after_secs`, for tests; the
/// default is 120 s): a 12-s TCP stream goes through about six rekeys without a second below
/// 1 Mbit/s, and no more rekeys happen than the interval allows (no rekey storm).
#[test]
fn a_tcp_stream_carries_on_across_many_rekeys() {
    let bed = TwoSites::up(&BedOptions {
        dataplane_extra: "danger_rekey_after_secs = 2\n".into(),
        ..BedOptions::default()
    })
    .unwrap();
    bed.ping_ok(&bed.a.lan, HOST_B, Ping::count(2).wait(3));
    let before = bed.counter(Side::A, "rekeys").unwrap();
    let report = cyphonic_e2e::bed::iperf3(&bed, Side::B, &["-i", "1"], 12).unwrap();
    let rekeys = bed.counter(Side::A, "rekeys").unwrap() - before;
    let mbit = per_second(&report);
    eprintln!("Mbit/s per second with keys rotated every 2 s: {mbit:?}; {rekeys} rekeys");
    assert!(
        mbit.iter().all(|m| *m >= 1),
        "a stall at a rekey: {mbit:?}\n{}",
        bed.logs()
    );
    assert!(
        (4..=8).contains(&rekeys),
        "{rekeys} rekeys in 12 s at one per 2 s\n{}",
        bed.logs()
    );
    let b = bed.counter(Side::B, "rekeys").unwrap();
    assert!(b >= 4, "B saw {b} rekeys");
    assert!(bed.a.log_text().contains("danger_ keys in [dataplane]"));
}

/// Keys rotate after 20,000 messages (`danger_rekey_after_messages`; the default is 2^60): a
/// 3-s TCP stream, hundreds of thousands of packets, rekeys many times on the counter alone
/// (the time limit, 120 s, is far away) and carries on.
#[test]
fn keys_rotate_on_the_message_count_too() {
    let bed = TwoSites::up(&BedOptions {
        dataplane_extra: "danger_rekey_after_messages = 20000\n".into(),
        ..BedOptions::default()
    })
    .unwrap();
    bed.ping_ok(&bed.a.lan, HOST_B, Ping::count(2).wait(3));
    let report = cyphonic_e2e::bed::iperf3(&bed, Side::B, &["-i", "1"], 3).unwrap();
    let rekeys = bed.counter(Side::A, "rekeys").unwrap();
    let sent = bed.counter(Side::A, "udp_sent").unwrap();
    let mbit = per_second(&report);
    eprintln!(
        "Mbit/s per second, keys rotated every 20000 messages: {mbit:?}; {rekeys} rekeys for {sent} datagrams"
    );
    assert!(mbit.iter().all(|m| *m >= 1), "{mbit:?}\n{}", bed.logs());
    assert!(sent > 100_000, "only {sent} datagrams");
    assert!(
        rekeys >= 3,
        "{rekeys} rekeys for {sent} datagrams at one per 20000\n{}",
        bed.logs()
    );
}

/// Moves the node's underlay the way a laptop's network changes: the new address comes on
/// `to` (with the default route through `gateway`), then the old one on `from` goes.
fn move_node(ns: &Netns, (to, address, gateway): (&str, &str, &str), (from, old): (&str, &str)) {
    ns.ip(&["addr", "add", address, "dev", to]).unwrap();
    ns.ip(&["route", "replace", "default", "via", gateway, "dev", to])
        .unwrap();
    ns.ip(&["addr", "del", old, "dev", from]).unwrap();
}

/// The longest run of seconds below 1 Mbit/s in `mbit[from..to]`.
fn gap_in(mbit: &[u64], from: usize, to: usize) -> usize {
    longest_gap(&mbit[from.min(mbit.len())..to.min(mbit.len())])
}

/// Node C (the laptop case) roams during a TCP stream to a camera behind adapter A: to
/// another network (a new address), behind a NAT, and out of it again. Each time the node
/// notices (netlink), tells adapter A from where it is now (an authenticated keepalive, which
/// A follows) and the cloud (it probes again); the stream goes on after each move.
#[test]
fn a_roaming_node_keeps_its_stream() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        lan_switch: true,
        node_c: Some(None),
        ..BedOptions::default()
    })
    .unwrap();
    let bins = bed.bins.clone();
    bed.c.as_mut().unwrap().start(&bins).unwrap();
    let (cam, cam_ip) = bed.dhcp_device(Side::A, "camera").unwrap();
    let node = &bed.c.as_ref().unwrap().ns;
    assert_eq!(bed.resolve(node, NODE_VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(node, CAMERA, Ping::default());
    // Two more networks on the router: a second segment for the node, and one for a NAT
    // (port-preserving) whose inside the node can join.
    veth(node, "wan2", &bed.wan, "tonc2").unwrap();
    bed.wan
        .ip(&["addr", "add", "192.0.2.193/28", "dev", "tonc2"])
        .unwrap();
    let nat = Netns::new("natR").unwrap();
    veth(&nat, "out", &bed.wan, "tonc3").unwrap();
    bed.wan
        .ip(&["addr", "add", "192.0.2.209/28", "dev", "tonc3"])
        .unwrap();
    nat.ip(&["addr", "add", "192.0.2.210/28", "dev", "out"])
        .unwrap();
    nat.ip(&["route", "add", "default", "via", "192.0.2.209"])
        .unwrap();
    veth(node, "wan3", &nat, "in").unwrap();
    nat.ip(&["addr", "add", "192.0.2.129/25", "dev", "in"])
        .unwrap();
    nat.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])
        .unwrap();
    nat.exec("nft", &["add", "table", "ip", "nat"]).unwrap();
    nat.exec(
        "nft",
        &["add chain ip nat post { type nat hook postrouting priority 100 ; }"],
    )
    .unwrap();
    nat.exec("nft", &["add rule ip nat post oifname out masquerade"])
        .unwrap();

    let server = cam
        .ns
        .spawn(
            "iperf3",
            &["-s", "-1", "-J", "-i", "0.1", "--idle-timeout", "40"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let moves = [4, 10, 16];
    let out = std::thread::scope(|s| {
        let client = s.spawn(|| {
            node.exec_output(
                "iperf3",
                &[
                    "-J",
                    "-c",
                    CAMERA,
                    "-t",
                    "24",
                    "-i",
                    "0.1",
                    "--connect-timeout",
                    "3000",
                    "--get-server-output",
                ],
            )
        });
        let started = std::time::Instant::now();
        let at = |secs: u64| {
            let due = Duration::from_secs(secs);
            std::thread::sleep(due.saturating_sub(started.elapsed()));
        };
        at(moves[0]);
        move_node(
            node,
            ("wan2", "192.0.2.194/28", "192.0.2.193"),
            ("wan", "192.0.2.66/26"),
        );
        at(moves[1]);
        move_node(
            node,
            ("wan3", "192.0.2.130/25", "192.0.2.129"),
            ("wan2", "192.0.2.194/28"),
        );
        at(moves[2]);
        move_node(
            node,
            ("wan2", "192.0.2.194/28", "192.0.2.193"),
            ("wan3", "192.0.2.130/25"),
        );
        client.join().unwrap().unwrap()
    });
    drop(server);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3: {e}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            bed.logs()
        )
    });
    assert!(report["error"].is_null(), "{report}\n{}", bed.logs());
    // Mbit/s in tenths of a second as the camera received them (the sender's count what its
    // socket took, which goes on while the path is down); the moves' positions in them.
    let mbit = per_second(&report["server_output_json"]);
    let tick = |secs: u64| usize::try_from(secs * 10).unwrap();
    let segments = [
        ("to another network", tick(moves[0]), tick(moves[1])),
        ("behind a NAT", tick(moves[1]), tick(moves[2])),
        ("out of the NAT", tick(moves[2]), mbit.len()),
    ];
    let gaps: Vec<(&str, f64)> = segments
        .iter()
        .map(|(what, from, to)| (*what, gap_in(&mbit, *from, *to) as f64 / 10.0))
        .collect();
    eprintln!(
        "the node moved at {moves:?} s; longest gaps in seconds (0.1-s intervals below 1 Mbit/s): {gaps:?}"
    );
    assert!(mbit.len() >= 230, "{} intervals", mbit.len());
    // After every move the stream carried data again before the next one.
    for (what, from, to) in segments {
        assert!(
            mbit[from..to].iter().any(|m| *m >= 1),
            "nothing got through after the move {what}: {mbit:?}\n{}",
            bed.logs()
        );
    }
    assert!(
        mbit[mbit.len() - 10..].iter().all(|m| *m >= 1),
        "{mbit:?}\n{}",
        bed.logs()
    );
    let s = bed.status(Side::A).unwrap();
    let p = s["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "nodec.ovl.example")
        .cloned()
        .unwrap();
    assert_eq!(
        p["endpoint"], "192.0.2.194:51820",
        "A follows the node: {p}"
    );
    assert_eq!(p["route"], "direct", "{p}");
    // A followed every move, the NAT's address included.
    let log = bed.a.log_text();
    let moved: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("peer moved to a new address peer=nodec.ovl.example"))
        .collect();
    assert!(moved.len() >= 3, "{moved:#?}");
    assert!(
        moved.iter().any(|l| l.contains("new=192.0.2.210:")),
        "never through the NAT: {moved:#?}"
    );
}

/// A relayed pair whose one side moves: node C behind a symmetric NAT, adapter A behind a NAT,
/// so the cloud relays them; mid-stream the node's NAT takes a new public address and
/// forgets its mappings. The relay drops what comes from an address not bound to the channel;
/// the node's data goes unanswered, it asks the cloud again, gets the same channel and binds
/// it from where it is now: the stream goes on, still relayed.
#[test]
fn a_relayed_side_whose_nat_moves_binds_again_and_keeps_its_stream() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        lan_switch: true,
        a: SiteOptions {
            nat: Some(Nat::PortPreserving),
            ..SiteOptions::default()
        },
        node_c: Some(Some(Nat::Symmetric)),
        ..BedOptions::default()
    })
    .unwrap();
    let bins = bed.bins.clone();
    bed.c.as_mut().unwrap().start(&bins).unwrap();
    let (cam, cam_ip) = bed.dhcp_device(Side::A, "camera").unwrap();
    let c = bed.c.as_ref().unwrap();
    assert_eq!(bed.resolve(&c.ns, NODE_VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(&c.ns, CAMERA, Ping::default());
    let node_peer = || c.status(&bed.bins).unwrap()["peers"][0].clone();
    assert_eq!(node_peer()["route"], "relay", "{}", node_peer());

    let server = cam
        .ns
        .spawn("iperf3", &["-s", "-1", "--idle-timeout", "60"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let nat = c.nat.as_ref().unwrap();
    let secs = STREAM_SECS.to_string();
    let (out, replies, at) = std::thread::scope(|s| {
        let client = s.spawn(|| {
            c.ns.exec_output("iperf3", &["-J", "-c", CAMERA, "-t", &secs, "-i", "1"])
        });
        let pings = s.spawn(|| ping_replies(&c.ns, CAMERA, STREAM_SECS - 1));
        std::thread::sleep(Duration::from_secs(3));
        let at = unix_now();
        nat.exec(
            "sysctl",
            &["-qw", "net.ipv4.conf.out.promote_secondaries=1"],
        )
        .unwrap();
        nat.ip(&["addr", "add", "192.0.2.67/26", "dev", "out"])
            .unwrap();
        nat.ip(&["addr", "del", "192.0.2.66/26", "dev", "out"])
            .unwrap();
        nat.ip(&["route", "replace", "default", "via", "192.0.2.65"])
            .unwrap();
        (client.join().unwrap().unwrap(), pings.join().unwrap(), at)
    });
    drop(server);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3: {e}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            bed.logs()
        )
    });
    let mbit = per_second(&report);
    let silence = silence_across(&replies, at);
    eprintln!(
        "the node's NAT moved 3 s in (relayed): pings silent for {silence:?} s; TCP Mbit/s per second {mbit:?}, longest gap {} s",
        longest_gap(&mbit)
    );
    assert!(
        silence.is_some_and(|s| s < 20.0),
        "pings silent for {silence:?} s\n{}",
        bed.logs()
    );
    assert!(mbit.len() >= 33, "{report}");
    assert!(
        mbit[mbit.len() - 3..].iter().all(|m| *m >= 1),
        "the TCP stream did not come back: {mbit:?}\nnode: {}\nA: {}\n{}",
        c.status(&bed.bins).unwrap(),
        bed.status(Side::A).unwrap(),
        bed.logs()
    );
    let p = node_peer();
    assert_eq!(p["route"], "relay", "{p}");
    let cloud = std::fs::read_to_string(bed.cloud.as_ref().unwrap().log()).unwrap();
    assert!(
        cloud.contains("relay: side bound") && cloud.contains("from=192.0.2.67:"),
        "the node never bound from its NAT's new address:\n{cloud}"
    );
}

/// Two dual-stack sites whose IPv4 path between them is blocked (the router drops UDP
/// between their IPv4 networks; the cloud stays reachable): the cloud gives each the other's
/// IPv4 mapping first and its IPv6 endpoint after; initiations go to both, IPv6 answers, and
/// the tunnel is direct over IPv6 with no relay asked for.
#[test]
fn dual_stack_sites_use_the_ip_version_that_works() {
    let dual = SiteOptions {
        dual_stack: true,
        ..SiteOptions::default()
    };
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        a: dual.clone(),
        b: dual,
        block_direct: true,
        ..BedOptions::default()
    })
    .unwrap();
    direct_over_ipv6(&bed);
}

/// Node C (public, IPv4) streams TCP to a camera behind adapter A (IPv4 only), then roams onto
/// an IPv6-only network. Its control session moves to the cloud's IPv6 address, its probes
/// show only IPv6, and its handshakes towards A's IPv4 address cannot leave: it asks the cloud,
/// which pairs the two through its relay (reachable on both versions), reason `no common IP
/// version`; the stream goes on.
#[test]
fn a_node_that_roams_from_ipv4_to_ipv6_meets_its_ipv4_peer_through_the_relay() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        lan_switch: true,
        node_c: Some(None),
        ..BedOptions::default()
    })
    .unwrap();
    let bins = bed.bins.clone();
    bed.c.as_mut().unwrap().start(&bins).unwrap();
    let (cam, cam_ip) = bed.dhcp_device(Side::A, "camera").unwrap();
    let c = bed.c.as_ref().unwrap();
    assert_eq!(bed.resolve(&c.ns, NODE_VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(&c.ns, CAMERA, Ping::default());
    let node_peer = || c.status(&bins).unwrap()["peers"][0].clone();
    assert_eq!(node_peer()["route"], "direct", "{}", node_peer());
    // The IPv6-only network: another router port.
    veth(&c.ns, "wan2", &bed.wan, "tonc2").unwrap();
    bed.wan
        .ip(&[
            "-6",
            "addr",
            "add",
            "fd00:192:0:3::1/64",
            "dev",
            "tonc2",
            "nodad",
        ])
        .unwrap();

    let server = cam
        .ns
        .spawn("iperf3", &["-s", "-1", "--idle-timeout", "60"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let secs = STREAM_SECS.to_string();
    let (out, replies, at) = std::thread::scope(|s| {
        let client = s.spawn(|| {
            c.ns.exec_output("iperf3", &["-J", "-c", CAMERA, "-t", &secs, "-i", "1"])
        });
        let pings = s.spawn(|| ping_replies(&c.ns, CAMERA, STREAM_SECS - 1));
        std::thread::sleep(Duration::from_secs(3));
        let at = unix_now();
        c.ns.ip(&[
            "-6",
            "addr",
            "add",
            "fd00:192:0:3::2/64",
            "dev",
            "wan2",
            "nodad",
        ])
        .unwrap();
        c.ns.ip(&["-6", "route", "add", "default", "via", "fd00:192:0:3::1"])
            .unwrap();
        c.ns.ip(&["addr", "del", "192.0.2.66/26", "dev", "wan"])
            .unwrap();
        (client.join().unwrap().unwrap(), pings.join().unwrap(), at)
    });
    drop(server);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3: {e}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            bed.logs()
        )
    });
    let mbit = per_second(&report);
    let silence = silence_across(&replies, at);
    eprintln!(
        "the node moved from IPv4 to IPv6 3 s in: pings silent for {silence:?} s; TCP Mbit/s per second {mbit:?}, longest gap {} s",
        longest_gap(&mbit)
    );
    assert!(
        silence.is_some_and(|s| s < 20.0),
        "pings silent for {silence:?} s\n{}",
        bed.logs()
    );
    assert!(
        mbit.len() >= 33 && mbit[mbit.len() - 3..].iter().all(|m| *m >= 1),
        "the TCP stream did not come back: {mbit:?}\n{}",
        bed.logs()
    );
    let p = node_peer();
    assert_eq!(p["route"], "relay", "{p}");
    assert_eq!(p["relay"]["reason"], "no common IP version", "{p}");
    assert!(
        p["relay"]["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("[fd00:192:0:2::10]:")),
        "the node reaches the relay over IPv6: {p}"
    );
}
