//! The control plane end to end: two adapters without static peers find each other through
//! `cyphonic-cloud` when a device asks DNS for a name behind the other one, on the two-site bed with the cloud behind the router; directly where they can,
//! through the cloud's relay where they cannot.

#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::time::Duration;

use cyphonic_e2e::bed::{
    BedOptions, CloudOptions, IperfRun, Nat, Ping, Side, SiteOptions, TwoSites,
};
use cyphonic_e2e::inject::count_frames_containing_each;
use cyphonic_e2e::lan::dig;
use cyphonic_e2e::node::{Attach, NodeHost, NodeSpec};
use cyphonic_e2e::wait_until;

const GW_A: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 1);

fn cloud_bed() -> TwoSites {
    bed_with(None)
}

fn bed_with(nat_b: Option<Nat>) -> TwoSites {
    TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        b: SiteOptions {
            nat: nat_b,
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap()
}

fn count(text: &str, what: &str) -> usize {
    text.matches(what).count()
}

/// (a) Names resolved through the cloud, the tunnel built on demand, ping and iperf3 by
/// name; unknown names are NXDOMAIN; (e) the cloud killed: the tunnel carries on; the cloud
/// back: both adapters reconnect and register again.
#[test]
fn adapters_reach_each_other_by_name_through_the_cloud() {
    let mut bed = cloud_bed();
    // Both adapters have registered (their own name and the reserved host's).
    let registered = |bed: &TwoSites| {
        let log = std::fs::read_to_string(bed.cloud.as_ref().unwrap().log()).unwrap_or_default();
        count(&log, "control session open") >= 2
    };
    wait_until(Duration::from_secs(10), "both adapters connected", || {
        registered(&bed)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));

    // No tunnel yet: adapter A knows no peer.
    assert_eq!(
        bed.status(Side::A).unwrap()["peers"]
            .as_array()
            .unwrap()
            .len(),
        0
    );

    // The first question builds the tunnel; the answer comes once it is up. The names may
    // take a moment to be registered: ask until the answer is there (bounded).
    let mut answer = None;
    for _ in 0..10 {
        let asked = std::time::Instant::now();
        let d = dig(&bed.a.lan, GW_A, "host.gw2.ovl.example", "A").unwrap();
        if d.status == "NOERROR" && !d.answers.is_empty() {
            // For the record: the resolution, the handshake and dig's own start-up.
            eprintln!(
                "first answer, with the tunnel built, after {:?}",
                asked.elapsed()
            );
            answer = Some(d);
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let answer = answer.unwrap_or_else(|| panic!("no answer\n{}", bed.logs()));
    assert_eq!(answer.answers, ["100.64.2.10"], "{answer:?}");
    let s = bed.status(Side::A).unwrap();
    let peers = s["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "{s}");
    assert_eq!(peers[0]["name"], "gw2.ovl.example");
    assert_eq!(peers[0]["origin"], "cloud");
    assert_eq!(s["cloud"]["connected"], true, "{s}");
    assert_eq!(s["cloud"]["observed"], "198.51.100.2:51820", "{s}");
    // B was told to expect A: it knows A as a peer without ever resolving anything.
    let s = bed.status(Side::B).unwrap();
    assert_eq!(s["peers"][0]["name"], "gw1.ovl.example", "{s}");

    let d = dig(&bed.a.lan, GW_A, "nothing.gw2.ovl.example", "A").unwrap();
    assert_eq!(d.status, "NXDOMAIN", "{d:?}");
    let d = dig(&bed.a.lan, GW_A, "gw2.ovl.example", "A").unwrap();
    assert_eq!(d.answers, ["100.64.2.1"], "{d:?}");

    // Devices use the names as they are.
    bed.a
        .lan
        .set_resolv_conf("nameserver 100.64.1.1\nsearch gw1.ovl.example\n")
        .unwrap();
    let ping = bed
        .a
        .lan
        .exec_output(
            "ping",
            &["-c", "3", "-i", "0.2", "-W", "2", "host.gw2.ovl.example"],
        )
        .unwrap();
    assert!(
        ping.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&ping.stdout),
        bed.logs()
    );
    let report = iperf_a_to_b(&bed, "host.gw2.ovl.example");
    let bps = report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(bps > 1e6, "iperf3 by name: {report}\n{}", bed.logs());
    let iperf_sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    let iperf_received = report["end"]["sum_received"]["bytes"].as_u64().unwrap();

    // The cloud goes away: the tunnel does not.
    bed.cloud.as_mut().unwrap().stop("KILL").unwrap();
    wait_until(Duration::from_secs(10), "both adapters noticing", || {
        count(&bed.a.log_text(), "control plane: disconnected") >= 1
            && count(&bed.b.log_text(), "control plane: disconnected") >= 1
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let ping = bed
        .ping(
            Side::A,
            Ipv4Addr::new(100, 64, 2, 10),
            &["-c", "3", "-i", "0.2", "-W", "2"],
        )
        .unwrap();
    assert!(
        ping.status.success(),
        "the tunnel must outlive the cloud\n{}",
        bed.logs()
    );
    let s = bed.status(Side::A).unwrap();
    assert_eq!(s["cloud"]["connected"], false, "{s}");
    assert!(s["cloud"]["last_error"].is_string(), "{s}");
    // And back: both reconnect by themselves (backoff 1 s doubling, with jitter) and
    // register again, so names resolve again.
    let bins = bed.bins.clone();
    bed.cloud.as_mut().unwrap().start(&bins).unwrap();
    wait_until(Duration::from_secs(20), "both adapters back", || {
        count(&bed.a.log_text(), "control plane: connected") >= 2
            && count(&bed.b.log_text(), "control plane: connected") >= 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let mut back = false;
    for _ in 0..10 {
        let d = dig(&bed.a.lan, GW_A, "gw2.ovl.example", "A").unwrap();
        if d.answers == ["100.64.2.1"] {
            back = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        back,
        "names resolve after the cloud came back\n{}",
        bed.logs()
    );

    // What the adapters reported (docs/protocol.md §8, Devices and tunnels): each its
    // reserved host, with at least iperf3's bytes each way (counters alone go to the cloud
    // once a minute), and its tunnel to the other, direct and with keys.
    let db = format!(
        "sqlite://{}",
        bed.cloud.as_ref().unwrap().dir.join("cloud.db").display()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(cyphonic_cloud::Store::open(&db)).unwrap();
    let reported = |name: &str| {
        rt.block_on(async {
            let (fp, _) = store.reporter(name).await.unwrap()?;
            let devices = store.devices_page(&fp, None, 100).await.unwrap();
            let tunnels = store.tunnels_page(Some(name), None, 100).await.unwrap();
            Some((devices, tunnels))
        })
    };
    let counted = |bed: &TwoSites| {
        let (Some((a_devices, a_tunnels)), Some((b_devices, b_tunnels))) =
            (reported("gw1.ovl.example"), reported("gw2.ovl.example"))
        else {
            return false;
        };
        let host = |devices: &[cyphonic_cloud::store::DeviceRow], vip: &str| {
            devices
                .iter()
                .find(|d| d.vip.as_deref() == Some(vip))
                .cloned()
        };
        let (Some(a_host), Some(b_host)) = (
            host(&a_devices, "100.64.1.10"),
            host(&b_devices, "100.64.2.10"),
        ) else {
            return false;
        };
        assert_eq!(
            (a_host.kind.as_str(), a_host.name.as_deref()),
            ("reserved", Some("host.gw1.ovl.example")),
            "{a_host:?}\n{}",
            bed.logs()
        );
        let tunnel_ok = |tunnels: &[cyphonic_cloud::store::TunnelRow], peer: &str| {
            tunnels.len() == 1
                && tunnels[0].peer == peer
                && tunnels[0].path == "direct"
                && tunnels[0].established
        };
        a_host.tx_bytes >= iperf_sent
            && b_host.rx_bytes >= iperf_received
            && a_host.seen.is_some()
            && tunnel_ok(&a_tunnels, "gw2.ovl.example")
            && tunnel_ok(&b_tunnels, "gw1.ovl.example")
    };
    wait_until(
        Duration::from_secs(90),
        "the adapters' reports of the iperf3 run",
        || counted(&bed),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: gw1 {:?}\ngw2 {:?}\n{}",
            reported("gw1.ovl.example"),
            reported("gw2.ovl.example"),
            bed.logs()
        )
    });
}

/// iperf3 for 2 s from A's LAN host to B's (`to`: its name or address), through a server
/// started for it: iperf3's JSON report.
fn iperf_a_to_b(bed: &TwoSites, to: &str) -> serde_json::Value {
    let _server = bed
        .b
        .lan
        .spawn("iperf3", &["-s", "-1", "--idle-timeout", "20"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = bed
        .a
        .lan
        .exec_output("iperf3", &["-J", "-c", to, "-t", "2"])
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// A TCP connection to each of ports 1 to 10,000 of B's host, 200 at a time (a closed port
/// answers with a RST).
const SCAN: &str = r"
import selectors, socket
sel = selectors.DefaultSelector()
ports = iter(range(1, 10001))
def start(p):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(('100.64.2.10', p))
    sel.register(s, selectors.EVENT_WRITE)
for _ in range(200):
    start(next(ports))
while sel.get_map():
    for key, _ in sel.select(timeout=2) or []:
        sel.unregister(key.fileobj)
        key.fileobj.close()
        p = next(ports, None)
        if p:
            start(p)
";

/// Flow logs on the two-site bed (docs/protocol.md §8): gw1 records its flows (`[flows]`),
/// so that an iperf3 flow to site B is in the cloud's store with at least its bytes within
/// seconds of its end; then a scan of 10,000 TCP ports of B's host from A's makes at most
/// what a minute's bounds let through, and the rest is counted as unreported.
#[test]
fn flow_logs_hold_an_iperf3_flow_and_bound_a_port_scan() {
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            extra: "[flows]\nmembers = [\"gw1.ovl.example\"]\n".into(),
            ..CloudOptions::default()
        }),
        ..BedOptions::default()
    })
    .unwrap();
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"],
        "{}",
        bed.logs()
    );
    let report = iperf_a_to_b(&bed, "100.64.2.10");
    let ended = std::time::Instant::now();
    let sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
    assert!(sent > 1_000_000, "iperf3: {report}\n{}", bed.logs());

    let db = format!(
        "sqlite://{}",
        bed.cloud.as_ref().unwrap().dir.join("cloud.db").display()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(cyphonic_cloud::Store::open(&db)).unwrap();
    let records = || {
        rt.block_on(store.flows_page(&cyphonic_cloud::store::FlowQuery {
            member: Some("gw1.ovl.example".into()),
            limit: 100_000,
            ..Default::default()
        }))
        .unwrap()
    };
    wait_until(
        Duration::from_secs(15),
        "iperf3's flow in the store",
        || {
            records().iter().any(|f| {
                f.kind == "flow"
                    && f.proto == Some(6)
                    && f.dport == Some(5201)
                    && f.dst.as_deref() == Some("100.64.2.10")
                    && f.dir == "out"
                    && f.tx_bytes >= sent
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", records(), bed.logs()));
    eprintln!(
        "iperf3's flow was in the store {:?} after its end",
        ended.elapsed()
    );
    let before = records().len();

    // The scan.
    let out = bed.a.lan.exec_output("python3", &["-c", SCAN]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bins = bed.bins.clone();
    let unreported = || {
        bed.cloud.as_ref().unwrap().status(&bins).unwrap()["counters"]["flows_unreported"]
            .as_u64()
            .unwrap_or(0)
    };
    // The cloud counts a message's unreported flows before its records are in the store:
    // wait until every flow of the scan is one or the other.
    wait_until(
        Duration::from_secs(20),
        "the scan's overflow counted and its records stored",
        || unreported() >= 5_000 && (records().len() - before) as u64 + unreported() >= 10_000 - 10,
    )
    .unwrap_or_else(|e| {
        let counters = &bed.cloud.as_ref().unwrap().status(&bins).unwrap()["counters"];
        panic!(
            "{e}: {} records of the scan kept; the cloud's counters {counters}; A's policy {}",
            records().len() - before,
            bed.status(Side::A).unwrap()["policy"]
        )
    });
    let scanned = records().len() - before;
    assert!(
        (100..=4_000).contains(&scanned),
        "{scanned} records of the scan kept, {} unreported",
        unreported()
    );
    assert!(scanned as u64 + unreported() >= 10_000 - 10);
    eprintln!(
        "the scan: {scanned} records kept, {} unreported",
        unreported()
    );
}

/// Asks `name` from `side`'s LAN host through its adapter until an answer with addresses
/// comes (the names may take a moment to be registered, and the adapter caches "not found"
/// for 5 s), for about 12 s of answers at most. A question may also go unanswered: a name
/// behind the other adapter is answered by it, through a tunnel that may still be on its way
/// up (2 s of handshakes on a blocked direct path, then the relay), longer than dig waits.
fn resolve(bed: &TwoSites, side: Side, name: &str) -> Vec<String> {
    let (lan, gw) = match side {
        Side::A => (&bed.a.lan, GW_A),
        Side::B => (&bed.b.lan, Ipv4Addr::new(100, 64, 2, 1)),
    };
    let mut last = None;
    for _ in 0..24 {
        match dig(lan, gw, name, "A") {
            Ok(d) if d.status == "NOERROR" && !d.answers.is_empty() => return d.answers,
            Ok(d) => last = Some(format!("{d:?}")),
            Err(e) => last = Some(format!("{e:#}")),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "{name}: no answer from {side:?}; the last: {last:?}\n{}",
        bed.logs()
    );
}

/// (b) Adapter B behind a port-preserving NAT: the cloud sees B's tunnel socket at the NAT's
/// address, both sides initiate at once, and the tunnel is direct (through the NAT, not a
/// relay) whichever side asks first.
#[test]
fn behind_a_port_preserving_nat_the_tunnel_is_direct() {
    direct_through_nat(Nat::PortPreserving);
}

/// A symmetric NAT on one side only needs no relay either: B's initiation reaches A from
/// whatever port the NAT chose, and A answers there.
#[test]
fn behind_a_symmetric_nat_facing_a_public_peer_the_tunnel_is_direct() {
    direct_through_nat(Nat::Symmetric);
}

fn direct_through_nat(nat: Nat) {
    let bed = bed_with(Some(nat));
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    let s = bed.status(Side::A).unwrap();
    // Direct: A talks to the NAT's public address. The port is the one B's own initiation
    // got: A's initiation may reach the NAT first and hold 51820 in its connection table,
    // and the NAT then maps B's packets to A from another port; A follows the authenticated
    // source.
    let endpoint = s["peers"][0]["endpoint"].as_str().unwrap_or_default();
    assert!(
        endpoint.starts_with("203.0.113.2:"),
        "A talks to the NAT's address: {s}"
    );
    assert_eq!(s["peers"][0]["established"], true, "{s}");
    let ping = bed
        .ping(
            Side::A,
            Ipv4Addr::new(100, 64, 2, 10),
            &["-c", "3", "-i", "0.2", "-W", "2"],
        )
        .unwrap();
    assert!(ping.status.success(), "{}", bed.logs());
    // And the other way: B asks for a name behind A.
    assert_eq!(
        resolve(&bed, Side::B, "host.gw1.ovl.example"),
        ["100.64.1.10"]
    );
    let ping = bed
        .ping(
            Side::B,
            Ipv4Addr::new(100, 64, 1, 10),
            &["-c", "3", "-i", "0.2", "-W", "2"],
        )
        .unwrap();
    assert!(ping.status.success(), "{}", bed.logs());
    let log = bed.b.log_text();
    assert!(
        log.contains("the cloud sees our tunnel socket at this address addr=203.0.113.2:"),
        "{log}"
    );
}

/// (f) Policy denies: the device gets NXDOMAIN, and no tunnel forms (neither side adds a
/// peer). (The policy's rules themselves are tested against a real cloud in
/// crates/signal/tests/cloud.rs.)
#[test]
fn a_policy_denial_is_nxdomain_and_no_tunnel() {
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            extra: "[policy]\ndefault = \"deny\"\n".into(),
            ..CloudOptions::default()
        }),
        ..BedOptions::default()
    })
    .unwrap();
    // The name exists (gw2 registers it) but may not be reached: ask until the cloud has
    // gw2's registration, which the denial counter in its log shows.
    let cloud_log = bed.cloud.as_ref().unwrap().log();
    let mut denied = false;
    for _ in 0..10 {
        let d = dig(&bed.a.lan, GW_A, "host.gw2.ovl.example", "A").unwrap();
        assert_eq!(d.status, "NXDOMAIN", "{d:?}");
        if std::fs::read_to_string(&cloud_log)
            .unwrap_or_default()
            .contains("resolution denied by policy")
        {
            denied = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(denied, "the cloud never denied\n{}", bed.logs());
    for side in [Side::A, Side::B] {
        let s = bed.status(side).unwrap();
        assert_eq!(s["peers"].as_array().unwrap().len(), 0, "{side:?}: {s}");
        assert_eq!(s["counters"]["handshake_inits"], 0, "{side:?}: {s}");
    }
}

/// (g) A revoked certificate is refused by the cloud: B cannot register, so its names do not
/// resolve, and B says why in its log.
#[test]
fn a_revoked_adapter_is_refused_by_the_cloud() {
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        b: SiteOptions {
            revoked: true,
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    wait_until(Duration::from_secs(10), "B refused", || {
        bed.b
            .log_text()
            .contains("the cloud refused our certificate")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(bed.b.log_text().contains("revoked"), "{}", bed.logs());
    let d = dig(&bed.a.lan, GW_A, "host.gw2.ovl.example", "A").unwrap();
    assert_eq!(d.status, "NXDOMAIN", "{d:?}");
    assert_eq!(
        bed.status(Side::A).unwrap()["peers"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

/// Moves adapter B's underlay address from `from` to `to` the way a DHCP renewal with a new
/// lease does: the new address comes, the old one goes (taking the default route with it),
/// the route comes back.
fn move_b(bed: &TwoSites, from: &str, to: &str) {
    let ns = &bed.b.adapter_ns;
    ns.exec(
        "sysctl",
        &["-qw", "net.ipv4.conf.wan.promote_secondaries=1"],
    )
    .unwrap();
    ns.ip(&["addr", "add", &format!("{to}/24"), "dev", "wan"])
        .unwrap();
    ns.ip(&["addr", "del", &format!("{from}/24"), "dev", "wan"])
        .unwrap();
    ns.ip(&["route", "replace", "default", "via", "203.0.113.1"])
        .unwrap();
}

/// (h) Adapter B's underlay address changes, twice.
///
/// While the tunnel is idle: B notices (netlink), tells A with an authenticated keepalive
/// from the new address, which A follows, and reconnects to the cloud and probes again, so
/// the cloud sees the new address too. Without the announcement A would go on sending to
/// the old address until B next spoke, which an idle or receive-only B never does.
///
/// In the middle of a TCP stream from A's host to B's: the stream goes on.
#[test]
fn a_peer_that_changes_address_keeps_its_tunnel() {
    let bed = cloud_bed();
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    bed.ping_ok(&bed.a.lan, Ipv4Addr::new(100, 64, 2, 10), Ping::default());
    let endpoint_of_b = || bed.status(Side::A).unwrap()["peers"][0]["endpoint"].clone();
    assert_eq!(endpoint_of_b(), "203.0.113.2:51820");

    move_b(&bed, "203.0.113.2", "203.0.113.3");
    wait_until(Duration::from_secs(5), "A to follow B to .3", || {
        endpoint_of_b() == "203.0.113.3:51820"
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    wait_until(Duration::from_secs(10), "the cloud to see B at .3", || {
        let s = bed.status(Side::B).unwrap();
        s["cloud"]["connected"] == true && s["cloud"]["observed"] == "203.0.113.3:51820"
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let s = bed.status(Side::B).unwrap();
    assert!(s["counters"]["network_changes"].as_u64() >= Some(1), "{s}");

    let run = IperfRun::start(&bed, Side::B, &["-i", "1"], 6).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    move_b(&bed, "203.0.113.3", "203.0.113.4");
    let report = run
        .finish()
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    // Every second after the move carried data.
    let intervals = report["intervals"].as_array().unwrap();
    let per_second: Vec<f64> = intervals
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0))
        .collect();
    assert!(per_second.len() >= 5, "{report}");
    eprintln!("bits per second, address changed after 2 s: {per_second:?}");
    assert!(
        per_second[3..].iter().all(|b| *b > 1e6),
        "the stream stalled after the move: {per_second:?}\n{}",
        bed.logs()
    );
    assert_eq!(endpoint_of_b(), "203.0.113.4:51820");
    // Each move by its own line (the first one's would satisfy a check of the second).
    let log = bed.a.log_text();
    let said = "peer moved to a new address peer=gw2.ovl.example";
    for to in ["203.0.113.3", "203.0.113.4"] {
        let new = format!(" new={to}:51820");
        assert!(
            log.lines().any(|l| l.contains(said) && l.contains(&new)),
            "no move to {to} in A's log\n{}",
            bed.logs()
        );
    }
}

fn bed_of(opts: &BedOptions) -> TwoSites {
    TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..opts.clone()
    })
    .unwrap()
}

/// The relay both adapters talk through: (A's channel address, B's), after checking both
/// show the peer relayed for `reason`, established, with the channel as its endpoint.
fn relayed(bed: &TwoSites, reason: &str) -> (String, String) {
    let mut addresses = Vec::new();
    for side in [Side::A, Side::B] {
        let s = bed.status(side).unwrap();
        let p = &s["peers"][0];
        assert_eq!(p["route"], "relay", "{side:?}: {s}\n{}", bed.logs());
        assert_eq!(p["relay"]["reason"], reason, "{side:?}: {s}");
        assert_eq!(p["established"], true, "{side:?}: {s}");
        assert_eq!(p["endpoint"], p["relay"]["address"], "{side:?}: {s}");
        addresses.push(p["endpoint"].as_str().unwrap().to_owned());
    }
    (addresses.remove(0), addresses.remove(0))
}

/// (c) Both adapters behind NATs, B's symmetric: hole punching cannot work, the cloud sees it
/// in B's two probes and pairs them through its relay from the first question. The relay
/// carries the traffic and cannot read it: a capture on the cloud's host during pings with a
/// recognisable payload shows tunnel frames, and not one byte of the payload.
#[test]
fn behind_two_nats_one_symmetric_the_pair_is_relayed_and_the_relay_sees_no_plaintext() {
    let bed = bed_of(&BedOptions {
        a: SiteOptions {
            nat: Some(Nat::PortPreserving),
            ..SiteOptions::default()
        },
        b: SiteOptions {
            nat: Some(Nat::Symmetric),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    });
    // The first question must find what the probes show: both ports' sources of both
    // adapters recorded (an adapter probes both at once, as its session opens).
    wait_until(Duration::from_secs(10), "both adapters' probes", || {
        bed.cloud_counter("endpoint_writes").unwrap() >= 4
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    let (a_relay, b_relay) = relayed(&bed, "symmetric NAT");
    // Paired through the relay by the answer to the question, not after a failed direct try.
    assert_eq!(
        bed.cloud_counter("relay_requests").unwrap(),
        0,
        "{}",
        bed.logs()
    );
    assert_eq!(a_relay, b_relay, "one channel, one IP version");
    assert!(a_relay.starts_with("192.0.2.10:"), "{a_relay}");

    // The payload pattern, in the clear on both LANs; data frames start with our version, type
    // 3 and their flags (pings go flagged as sparse, unless they queued).
    let pattern = "c0ffee00deadbeef0badf00dfeedface";
    let marker = vec![0xde, 0xad, 0xbe, 0xef, 0x0b, 0xad, 0xf0, 0x0d];
    let data_frame = |flags: u16| {
        let [hi, lo] = flags.to_be_bytes();
        vec![cyphonic_wire::VERSION, 0x03, hi, lo]
    };
    let cloud_ns = &bed.cloud.as_ref().unwrap().ns;
    std::thread::scope(|scope| {
        let at_relay = scope.spawn(|| {
            count_frames_containing_each(
                cloud_ns,
                "wan",
                vec![
                    marker.clone(),
                    data_frame(0),
                    data_frame(cyphonic_wire::FLAG_SPARSE),
                ],
                Duration::from_secs(4),
            )
        });
        let at_lan_b = scope.spawn(|| {
            count_frames_containing_each(
                &bed.b.lan,
                "eth0",
                vec![marker.clone()],
                Duration::from_secs(4),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        bed.ping_ok(
            &bed.a.lan,
            Ipv4Addr::new(100, 64, 2, 10),
            Ping::count(10).args(&["-s", "1000", "-p", pattern]),
        );
        let at_relay = at_relay.join().unwrap().unwrap();
        let at_lan_b = at_lan_b.join().unwrap().unwrap();
        eprintln!(
            "frames with the payload / tunnel data frames at the relay: {at_relay:?}; with the payload on lanB: {at_lan_b:?}"
        );
        assert!(
            at_lan_b[0] >= 10,
            "the payload never reached lanB: {at_lan_b:?}"
        );
        assert!(
            at_relay[1] + at_relay[2] >= 10,
            "the relay carried no tunnel frames: {at_relay:?}"
        );
        assert_eq!(at_relay[0], 0, "plaintext at the relay");
    });
    // And the other way, by name.
    assert_eq!(
        resolve(&bed, Side::B, "host.gw1.ovl.example"),
        ["100.64.1.10"]
    );
    bed.ping_ok(&bed.b.lan, Ipv4Addr::new(100, 64, 1, 10), Ping::default());
    let log = std::fs::read_to_string(bed.cloud.as_ref().unwrap().log()).unwrap();
    assert!(
        log.contains("pair relayed") && log.contains("reason=symmetric NAT"),
        "{log}"
    );
}

/// (d) Adapter A has IPv4 only, adapter B IPv6 only: no common IP version, so the cloud pairs
/// them through its relay, which listens on both; ping and TCP by name both ways.
#[test]
fn an_ipv4_only_adapter_and_an_ipv6_only_adapter_meet_through_the_relay() {
    let bed = bed_of(&BedOptions {
        b: SiteOptions {
            v6_only: true,
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    });
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    let (a_relay, b_relay) = relayed(&bed, "no common IP version");
    assert!(a_relay.starts_with("192.0.2.10:"), "{a_relay}");
    assert!(b_relay.starts_with("[fd00:192:0:2::10]:"), "{b_relay}");
    assert_eq!(
        bed.status(Side::B).unwrap()["cloud"]["observed"],
        "[fd00:203:0:113::2]:51820"
    );
    bed.ping_ok(&bed.a.lan, Ipv4Addr::new(100, 64, 2, 10), Ping::default());
    let report = cyphonic_e2e::bed::iperf3(&bed, Side::B, &[], 2).unwrap();
    let bps = report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    eprintln!(
        "TCP lanA -> lanB through the relay, IPv4 to IPv6: {:.0} Mbit/s",
        bps / 1e6
    );
    assert!(bps > 1e6, "{report}");
    assert_eq!(
        resolve(&bed, Side::B, "host.gw1.ovl.example"),
        ["100.64.1.10"]
    );
    bed.ping_ok(&bed.b.lan, Ipv4Addr::new(100, 64, 1, 10), Ping::default());
}

/// When the cloud expects the direct path to work and it does not (here the router drops
/// everything between the two sites), the adapters find no answer to their handshakes, ask
/// for the relay, and carry on through it: the device's question is still answered.
///
/// Issue 55, item 2: once the block is lifted the pair goes back to the direct path at its
/// first try (35 s after it was relayed, then a second of pings), with a ping every 50 ms
/// across the move losing nothing; blocked again, it finds the direct path dead and falls
/// back to the relay channel, the gap measured.
#[test]
fn a_blocked_pair_is_relayed_goes_back_to_direct_when_the_path_opens_and_back_when_it_closes() {
    let bed = bed_of(&BedOptions {
        block_direct: true,
        ..BedOptions::default()
    });
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    relayed(&bed, "no handshake on the direct path");
    // Both sides handshake; whichever gives up first asks, and the cloud relays both.
    let asked = "no answer to handshakes on this path: asking the cloud for a relay";
    assert!(
        bed.a.log_text().contains(asked) || bed.b.log_text().contains(asked),
        "{}",
        bed.logs()
    );
    let (a_at, b_at) = (bed.a.endpoint().to_string(), bed.b.endpoint().to_string());
    let route = |side: Side| {
        let s = bed.status(side).unwrap();
        let p = &s["peers"][0];
        (
            p["route"].as_str().unwrap_or("").to_owned(),
            p["endpoint"].as_str().unwrap_or("").to_owned(),
        )
    };
    let pings = |count: u32| pings_lost(&bed, count);
    // Blocks the direct path (or lifts the block) while `count` pings run, and waits
    // `within` for both sides to reach `path` (A's endpoint B's when direct, and so on):
    // how long that took, and (lost, sent) of the pings.
    let change = |block: bool, count: u32, within: u64, path: &str| {
        std::thread::scope(|scope| {
            let stream = scope.spawn(|| pings(count));
            std::thread::sleep(Duration::from_secs(1));
            bed.block_direct(block).unwrap();
            let changed = std::time::Instant::now();
            let reached = |side: Side, peer_at: &str| {
                let (route, endpoint) = route(side);
                route == path && (path == "relay" || endpoint == peer_at)
            };
            let done = wait_until(Duration::from_secs(within), path, || {
                reached(Side::A, &b_at) && reached(Side::B, &a_at)
            });
            let took = changed.elapsed();
            assert!(
                done.is_ok(),
                "not {path} {took:?} after the change (block {block}): {:?} {:?}\n{}",
                route(Side::A),
                route(Side::B),
                bed.logs()
            );
            (took, stream.join().unwrap())
        })
    };
    let (took, (lost, sent)) = change(false, 900, 60, "direct");
    eprintln!(
        "back to direct {:.1} s after the lift; {lost} of {sent} pings lost across the move",
        took.as_secs_f64()
    );
    assert_eq!(
        lost,
        0,
        "pings lost across the move to direct\n{}",
        bed.logs()
    );
    let moved = bed.counter(Side::A, "moves_to_direct").unwrap()
        + bed.counter(Side::B, "moves_to_direct").unwrap();
    assert!(moved >= 1, "no side moved on a pong: {moved}");
    assert!(
        bed.counter(Side::A, "direct_tries").unwrap()
            + bed.counter(Side::B, "direct_tries").unwrap()
            >= 1
    );
    // Closed again: the direct path is found dead and the pair falls back to its channel.
    let (took, (lost, sent)) = change(true, 600, 40, "relay");
    let gap = f64::from(lost) * 0.05;
    eprintln!(
        "back on the relay {:.1} s after the block; {lost} of {sent} pings lost (a gap of about {gap:.1} s)",
        took.as_secs_f64()
    );
    // The path's death shows after 5 s of unanswered data and 3 s of unanswered
    // initiations (docs/protocol.md §4, *Back to direct*); then the channel carries.
    assert!(gap < 15.0, "a gap of {gap:.1} s\n{}", bed.logs());
    bed.ping_ok(&bed.a.lan, Ipv4Addr::new(100, 64, 2, 10), Ping::default());
}

/// (lost, sent) of `count` pings 50 ms apart from LAN A to the device behind B.
fn pings_lost(bed: &TwoSites, count: u32) -> (u32, u32) {
    let out = bed
        .ping(
            Side::A,
            Ipv4Addr::new(100, 64, 2, 10),
            &["-c", &count.to_string(), "-i", "0.05", "-W", "1"],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |what: &str| -> u32 {
        let at = text
            .find(what)
            .unwrap_or_else(|| panic!("no {what:?} in\n{text}"));
        let before = text[..at].trim_end();
        before[before.rfind([' ', '\n']).map_or(0, |i| i + 1)..]
            .parse()
            .unwrap_or_else(|e| panic!("{what:?} in\n{text}: {e}"))
    };
    (
        field(" packets transmitted") - field(" received"),
        field(" packets transmitted"),
    )
}

/// Issue 55 (1), docs/protocol.md §4, *Relay over a stream*: site A's router drops all UDP.
/// A's probes go unanswered, so A knows; its handshakes to B find no path, the cloud relays
/// the pair, and A carries its side of the channel over the relay's TLS stream on port 443
/// while B binds over UDP. Ping and TCP pass by name. When the router lets UDP through
/// again, A's next probe is answered and A moves its side to the channel's UDP port: within
/// the blocked probe interval and its wait, with the gap in a stream of pings measured.
#[test]
fn a_site_that_drops_udp_is_relayed_over_tls_and_back_over_udp_when_it_opens() {
    let mut bed = TwoSites::new(&BedOptions {
        cloud: Some(CloudOptions {
            relay_stream: true,
            ..CloudOptions::default()
        }),
        ..BedOptions::default()
    })
    .unwrap();
    bed.block_udp(Side::A, true).unwrap();
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let udp = |side: Side| bed.status(side).unwrap()["cloud"]["udp"].clone();
    let judged = wait_until(Duration::from_secs(20), "A finds UDP blocked", || {
        udp(Side::A) == false
    });
    assert!(judged.is_ok(), "{:?}\n{}", udp(Side::A), bed.logs());
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    let peer = |side: Side| bed.status(side).unwrap()["peers"][0].clone();
    let up = wait_until(Duration::from_secs(30), "relayed over the stream", || {
        let (a, b) = (peer(Side::A), peer(Side::B));
        a["established"] == true
            && b["established"] == true
            && a["route"] == "relay"
            && b["route"] == "relay"
            && a["endpoint"]
                .as_str()
                .and_then(|e| e.parse::<std::net::SocketAddr>().ok())
                .is_some_and(|e| e.ip().is_loopback())
    });
    assert!(
        up.is_ok(),
        "A: {}\nB: {}\n{}",
        peer(Side::A),
        peer(Side::B),
        bed.logs()
    );
    let b_at = peer(Side::B)["endpoint"].as_str().unwrap().to_owned();
    assert!(
        b_at.starts_with("192.0.2.10:"),
        "B on the channel's UDP port: {b_at}"
    );
    // A's status names the channel its loopback end stands for.
    assert_eq!(peer(Side::A)["relay"]["stream"], b_at.as_str());
    bed.ping_ok(&bed.a.lan, Ipv4Addr::new(100, 64, 2, 10), Ping::default());
    let over_tls = IperfRun::start(&bed, Side::B, &[], 3)
        .unwrap()
        .finish()
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let mbits = over_tls["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e6;
    eprintln!("TCP through the relay, A's side over TLS: {mbits:.0} Mbit/s");
    assert!(mbits > 0.0);
    assert_eq!(bed.relay_counter("streams").unwrap(), 1);
    // UDP again: A's side leaves the stream for the channel's UDP port.
    let (took, (lost, sent)) = std::thread::scope(|scope| {
        let stream = scope.spawn(|| pings_lost(&bed, 600));
        std::thread::sleep(Duration::from_secs(1));
        bed.block_udp(Side::A, false).unwrap();
        let lifted = std::time::Instant::now();
        let moved = wait_until(Duration::from_secs(20), "A on UDP", || {
            peer(Side::A)["endpoint"]
                .as_str()
                .is_some_and(|e| e.starts_with("192.0.2.10:"))
        });
        let took = lifted.elapsed();
        assert!(moved.is_ok(), "A: {}\n{}", peer(Side::A), bed.logs());
        (took, stream.join().unwrap())
    });
    let gap = f64::from(lost) * 0.05;
    eprintln!(
        "off the stream {:.1} s after UDP was let through; {lost} of {sent} pings lost (a gap of about {gap:.2} s)",
        took.as_secs_f64()
    );
    assert_eq!(udp(Side::A), true);
    assert!(
        peer(Side::A)["relay"]["stream"].is_null(),
        "{}",
        peer(Side::A)
    );
    // Probes every 5 s while blocked, an answer within a round trip, then the bind.
    assert!(took < Duration::from_secs(12), "{took:?}\n{}", bed.logs());
    assert!(gap < 2.0, "a gap of {gap:.2} s\n{}", bed.logs());
    bed.ping_ok(&bed.a.lan, Ipv4Addr::new(100, 64, 2, 10), Ping::default());
}

/// Issue 49, finding 3: a relay bind cannot point the channel at a third party. Adapter A's
/// binds are taken off the path as the pair is relayed, and replayed from a host that is
/// neither side (what anyone on the path, or the member itself, could do); then both sides
/// ping each other. The third host gets nothing but the relay's challenges (at most a few,
/// each smaller than the bind that caused it), and the pair's traffic keeps flowing.
#[test]
fn a_relay_bind_replayed_from_a_third_address_sends_it_nothing() {
    let bed = bed_of(&BedOptions {
        block_direct: true,
        ..BedOptions::default()
    });
    let a_underlay = match bed.a.underlay {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(ip) => panic!("A's underlay is IPv4 in this bed: {ip}"),
    };
    // Binds, old and new layout: type 6, a 16-byte token or a 48-byte body of kind 1.
    let is_bind = move |(from, to, p): &cyphonic_e2e::inject::Seen| {
        from.ip() == std::net::IpAddr::V4(a_underlay)
            && to.ip() == std::net::IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10))
            && p.get(1) == Some(&6)
            && (p.len() == 32 || (p.len() == 64 && p.get(16..18) == Some(&[2, 1])))
    };
    let binds = cyphonic_e2e::inject::spawn_capture_datagrams(
        &bed.wan,
        "toa",
        2,
        Duration::from_secs(25),
        is_bind,
    );
    assert_eq!(
        resolve(&bed, Side::A, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    relayed(&bed, "no handshake on the direct path");
    let binds = binds.join().unwrap().unwrap();
    assert!(!binds.is_empty(), "no bind of A's seen\n{}", bed.logs());
    let relay = binds[0].1;
    let (victim, victim_ip) = bed.add_underlay_host("victim").unwrap();
    // The victim counts every datagram that reaches it but the relay's challenges (32-byte
    // bodies), while the binds are replayed from there and the sides ping each other.
    let heard = cyphonic_e2e::inject::spawn_inside(&victim, move || {
        let sock = std::net::UdpSocket::bind((victim_ip, 40_404))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        for (_, _, bind) in &binds {
            sock.send_to(bind, relay)?;
        }
        let (mut other, mut challenges, mut buf) = (0u64, 0u64, [0u8; 2048]);
        let end = std::time::Instant::now() + Duration::from_secs(4);
        while std::time::Instant::now() < end {
            if let Ok(n) = sock.recv(&mut buf) {
                if cyphonic_control::parse_challenge(&buf[..n]).is_some() {
                    challenges += 1;
                } else {
                    other += 1;
                }
            }
        }
        Ok((other, challenges))
    });
    std::thread::sleep(Duration::from_millis(300));
    let ping = ["-c", "20", "-i", "0.05", "-W", "2"];
    let a_to_b = bed
        .ping(Side::A, Ipv4Addr::new(100, 64, 2, 10), &ping)
        .unwrap();
    let b_to_a = bed
        .ping(Side::B, Ipv4Addr::new(100, 64, 1, 10), &ping)
        .unwrap();
    let (other, challenges) = cyphonic_e2e::inject::joined(heard).unwrap();
    eprintln!("the third host got {other} datagrams and {challenges} challenges");
    assert_eq!(
        other,
        0,
        "the relay sent the pair's traffic to a third host\n{}",
        bed.logs()
    );
    assert!(challenges <= 4, "{challenges} challenges");
    for (way, out) in [("A to B", a_to_b), ("B to A", b_to_a)] {
        assert!(
            out.status.success(),
            "{way}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            bed.logs()
        );
    }
}

/// Re-keys site B (stopped): a new key and certificate of gw2's name and block from the
/// bed's CA, put in place of the old ones (which are copied into `B/old-key`). Returns the
/// new certificate's fingerprint. B is left stopped.
fn rekey_b(bed: &mut TwoSites) -> String {
    let fresh = bed.b.dir.join("rekeyed");
    let ca = bed.ca_dir();
    cyphonic_e2e::ca_issue(
        &bed.bins.cloud,
        &ca,
        "gw2.ovl.example",
        "100.64.2.0/24",
        &fresh,
    )
    .unwrap();
    bed.stop(Side::B, "TERM").unwrap();
    let old = bed.b.dir.join("old-key");
    std::fs::create_dir_all(&old).unwrap();
    for f in ["gw2.ovl.example.crt", "gw2.ovl.example.key"] {
        std::fs::copy(bed.b.dir.join(f), old.join(f)).unwrap();
        std::fs::copy(fresh.join(f), bed.b.dir.join(f)).unwrap();
    }
    let new_cert = std::fs::read_to_string(fresh.join("gw2.ovl.example.crt")).unwrap();
    fingerprint_of(&new_cert)
}

fn fingerprint_of(pem: &str) -> String {
    cyphonic_crypto::Certificate::from_pem(pem)
        .unwrap()
        .fingerprint()
        .to_string()
}

/// The peer table and the registry follow identity: adapter B is re-keyed (a new key and a
/// new certificate of the same name) and restarted. Its names are its own again at once (they
/// belong to the CA and the name, not to the old certificate), and when B's host reaches A,
/// A takes the new certificate in place of the old peer (routes and all): traffic flows both
/// ways, and A's peer is the new certificate.
#[test]
fn a_peer_re_keyed_under_the_same_name_is_used_at_once() {
    let mut bed = cloud_bed();
    let b_host = resolve(&bed, Side::A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(3).wait(3));
    let old = bed.status(Side::A).unwrap()["peers"][0]["name"].clone();
    assert_eq!(old, "gw2.ovl.example");

    let new_fp = rekey_b(&mut bed);
    bed.start(Side::B).unwrap();

    // B's host reaches A's by name: the cloud tells A to expect the new gw2.
    let a_host = resolve(&bed, Side::B, "host.gw1.ovl.example");
    bed.ping_ok(&bed.b.lan, &a_host[0], Ping::count(3).wait(5));
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(3).wait(3));
    let s = bed.status(Side::A).unwrap();
    let peers = s["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "the old gw2 was replaced: {s}");
    assert_eq!(bed.counter(Side::A, "peers_removed").unwrap(), 1, "{s}");
    // Replaced when the cloud described the new gw2, or dropped a moment before when the
    // cloud retired the old certificate (revoked online once the new one connected): the
    // first of the two to reach A.
    let log = bed.a.log_text();
    assert!(
        log.contains("replaced by a newer certificate of its name")
            || log.contains("peer removed: revoked by the cloud"),
        "{log}"
    );
    // The registry gives gw2's own name to the new certificate (it was refused to it before
    // names followed identity: the old certificate held them).
    assert_eq!(
        resolve(&bed, Side::A, "gw2.ovl.example"),
        ["100.64.2.1"],
        "{}",
        bed.logs()
    );
    let cloud_log = std::fs::read_to_string(bed.cloud.as_ref().unwrap().log()).unwrap();
    assert!(
        !cloud_log.contains("registered by another client"),
        "{cloud_log}"
    );
    // A talks to the new key: its peer is the new certificate.
    assert_eq!(peers[0]["fingerprint"], new_fp, "{s}");

    // The fleet view shows both of gw2's certificates: the new one online with its names,
    // the old one offline with none. An online member is not removed.
    let members = |args: &[&str]| {
        let mut all = vec!["members"];
        all.extend_from_slice(args);
        bed.cloud_cli(&all).unwrap()
    };
    let out = members(&["show", "gw2.ovl.example", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let certs = shown.as_array().unwrap();
    assert_eq!(certs.len(), 2, "{shown}");
    let new = certs.iter().find(|c| c["fingerprint"] == new_fp).unwrap();
    let old = certs.iter().find(|c| c["fingerprint"] != new_fp).unwrap();
    assert_eq!(
        (new["online"].clone(), old["online"].clone()),
        (true.into(), false.into())
    );
    // Each says what it runs, as its last connection said (both connected once).
    let runs = format!("cyphonic-adapter {}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        (new["agent"].as_str(), old["agent"].as_str()),
        (Some(runs.as_str()), Some(runs.as_str())),
        "{shown}"
    );
    let names: Vec<&str> = new["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"gw2.ovl.example") && names.contains(&"host.gw2.ovl.example"),
        "{shown}"
    );
    assert!(old["names"].as_array().unwrap().is_empty(), "{shown}");
    let out = members(&["list"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("gw1.ovl.example") && l.contains(" yes ") && l.contains(&runs)),
        "{table}"
    );
    // Removing gw2 forgets its old certificate; the online one stays, and then nothing
    // offline is left to remove.
    let out = members(&["remove", "gw2.ovl.example"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed 1 offline certificate(s)"));
    let out = members(&["show", "gw2.ovl.example", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown.as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(shown[0]["fingerprint"], new_fp);
    let out = members(&["remove", "gw2.ovl.example"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("gw2.ovl.example is online"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 49, finding 6: gw2 re-keyed (a new key and certificate of its name) and B restarted
/// on it, and nothing on B's side reaching A. The cloud retires the old certificate (revoked
/// online) once the new one connects; A drops it and takes the new one without a device
/// asking DNS again: A's host reaches B's at the address it had, within seconds (at
/// d2129cb, A kept the old certificate and nothing got through). The old key brought up
/// elsewhere (a node holding the old certificate and key) is refused by the cloud, and A's
/// traffic keeps going to the new B.
#[test]
fn a_re_keyed_member_is_used_at_once_and_its_old_key_gets_nothing() {
    let mut bed = cloud_bed();
    let b_host = resolve(&bed, Side::A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(3).wait(3));
    let new_fp = rekey_b(&mut bed);
    bed.start(Side::B).unwrap();
    let to_b = b_host[0].to_string();
    wait_until(Duration::from_secs(10), "A to reach the re-keyed B", || {
        bed.a
            .lan
            .exec_output("ping", &["-c", "1", "-W", "1", &to_b])
            .is_ok_and(|o| o.status.success())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let s = bed.status(Side::A).unwrap();
    let peers = s["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "{s}");
    assert_eq!(peers[0]["fingerprint"], new_fp, "{s}");
    let cloud_log = std::fs::read_to_string(bed.cloud.as_ref().unwrap().log()).unwrap();
    assert!(
        cloud_log.contains("the older ones are revoked online"),
        "{cloud_log}"
    );

    // The old key comes up at another address, claiming gw2's name and block.
    let spec = NodeSpec {
        name: "gw2.ovl.example".into(),
        block: "100.64.2.0/24".into(),
        attach: Attach::Own(None),
    };
    let mut impostor = NodeHost::new(
        &bed.wan,
        &bed.bins,
        &bed.ca_dir(),
        bed.tmp(),
        bed.cloud.as_ref().unwrap(),
        &spec,
    )
    .unwrap();
    for f in ["gw2.ovl.example.crt", "gw2.ovl.example.key"] {
        std::fs::copy(bed.b.dir.join("old-key").join(f), impostor.dir.join(f)).unwrap();
    }
    impostor.start(&bed.bins).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the cloud to refuse the old key",
        || impostor.log_text().contains("is revoked"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", impostor.log_text(), bed.logs()));
    // A's traffic still goes to the new B: every ping comes back from B's host.
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(5).wait(2));
    let s = bed.status(Side::A).unwrap();
    assert_eq!(s["peers"][0]["fingerprint"], new_fp, "{s}");
    let st = impostor.status(&bed.bins).unwrap();
    assert!(
        st["peers"].as_array().is_none_or(Vec::is_empty),
        "the old key was given no peer: {st}"
    );
    impostor.stop("TERM").unwrap();
}

/// Peers found through the cloud leave the table after `idle_peer_timeout` without traffic
/// (their keepalives end with them), and traffic brings them back: a device that kept the
/// address (it asks DNS nothing) reaches the peer again within seconds, through the cloud's
/// pairing.
#[test]
fn an_idle_cloud_peer_leaves_and_traffic_brings_it_back() {
    let idle = || SiteOptions {
        extra: "idle_peer_timeout = 5\n".into(),
        ..SiteOptions::default()
    };
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        a: idle(),
        b: idle(),
        ..BedOptions::default()
    })
    .unwrap();
    let b_host = resolve(&bed, Side::A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(2).wait(3));
    let peers = |bed: &TwoSites, side| bed.status(side).unwrap()["peers"].as_array().unwrap().len();
    assert_eq!(peers(&bed, Side::A), 1);
    wait_until(Duration::from_secs(15), "A evicts the idle gw2", || {
        peers(&bed, Side::A) == 0
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(
        bed.a.log_text().contains("peer idle: removed"),
        "{}",
        bed.logs()
    );

    // The device pings the address it already has: the first packets find no peer and ask
    // for it; the cloud pairs the two again and the rest are answered.
    let out = bed
        .ping(
            Side::A,
            b_host[0].parse().unwrap(),
            &["-c", "10", "-i", "0.5", "-W", "2"],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let received: u32 = text
        .split(" received")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // For the record: how many of the first packets the re-pairing cost.
    eprintln!("after eviction: {received} of 10 answered");
    assert!(received >= 6, "{text}\n{}", bed.logs());
    assert!(
        bed.a
            .log_text()
            .contains("traffic for an idle peer's block: asking the cloud"),
        "{}",
        bed.logs()
    );
    assert_eq!(peers(&bed, Side::A), 1);
}

/// Two cloud instances (the real binaries) on one PostgreSQL in the cloud's namespace, at
/// 192.0.2.10 and 192.0.2.11; both adapters are given both. The instance adapter A has its
/// session with is killed (-9): A moves to the other within seconds, registers again, and
/// names resolve. The time it took is printed for docs/benchmarks.md.
#[test]
fn killing_the_cloud_instance_a_client_uses_moves_it_to_the_other() {
    let mut bed = cloud_bed();
    let bins = bed.bins.clone();
    let cloud = bed.cloud.as_mut().unwrap();
    let pg = cyphonic_e2e::postgres::Postgres::start_in(Some(&cloud.ns)).unwrap();
    let _two = cloud
        .two_instances(
            &bins,
            &pg.url(),
            (
                Ipv4Addr::new(192, 0, 2, 10).into(),
                (Ipv4Addr::new(192, 0, 2, 11).into(), 26),
            ),
        )
        .unwrap();
    for side in [Side::A, Side::B] {
        let config = bed.site_ref(side).config();
        let text = std::fs::read_to_string(&config).unwrap();
        let both = text.replace(
            "address = \"192.0.2.10:7000\"",
            "address = [\"192.0.2.10:7000\", \"192.0.2.11:7000\"]",
        );
        assert_ne!(both, text);
        std::fs::write(&config, both).unwrap();
        bed.stop(side, "TERM").unwrap();
        bed.start(side).unwrap();
    }
    let b_host = resolve(&bed, Side::A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(2).wait(3));
    let instance = |bed: &TwoSites| {
        let s = bed.status(Side::A).unwrap();
        (s["cloud"]["connected"] == true)
            .then(|| s["cloud"]["address"].as_str().unwrap_or("").to_owned())
    };
    assert_eq!(instance(&bed).as_deref(), Some("192.0.2.10:7000"));

    let killed = std::time::Instant::now();
    bed.cloud.as_mut().unwrap().stop("KILL").unwrap();
    wait_until(Duration::from_secs(20), "A on the other instance", || {
        instance(&bed).as_deref() == Some("192.0.2.11:7000")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let moved = killed.elapsed();
    // A name not asked before: the answer comes from the registry through instance two.
    assert_eq!(resolve(&bed, Side::A, "gw2.ovl.example"), ["100.64.2.1"]);
    let resolved = killed.elapsed();
    eprintln!(
        "failover (real binaries): session with the other instance after {moved:?}, a new name resolved after {resolved:?}"
    );
    assert!(moved < Duration::from_secs(10), "{moved:?}");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(2).wait(3));
    drop(pg);
}

/// The cloud reloaded (SIGHUP): a broken file changes nothing; with adapter B's certificate
/// on its revocation list, B's session is closed at once, its names are released (a name of
/// B's no longer resolves for A), and B is refused when it reconnects.
#[test]
fn the_cloud_reloaded_with_a_revocation_cuts_the_client_off_and_releases_its_names() {
    let bed = cloud_bed();
    let b_host = resolve(&bed, Side::A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(2).wait(3));
    let cloud = bed.cloud.as_ref().unwrap();
    let path = cloud.dir.join("cloud.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let cloud_log = || std::fs::read_to_string(cloud.log()).unwrap_or_default();
    let hup = || {
        let pid = cloud.proc.as_ref().unwrap().pid().to_string();
        cyphonic_e2e::sh("kill", &["-s", "HUP", &pid]).unwrap();
    };

    // A mistake: refused, nothing changes.
    std::fs::write(&path, format!("listen = \"nowhere\"\n{text}")).unwrap();
    hup();
    wait_until(Duration::from_secs(5), "the refusal", || {
        cloud_log().contains("the configuration is refused, the running one stays")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(bed.status(Side::B).unwrap()["cloud"]["connected"] == true);

    // B revoked.
    let ca = bed.ca_dir();
    bed.revoke(Side::B).unwrap();
    std::fs::write(
        &path,
        format!(
            "revocations = \"{}\"\n{text}",
            ca.join("revoked.txt").display()
        ),
    )
    .unwrap();
    hup();
    wait_until(Duration::from_secs(5), "the reload", || {
        cloud_log().contains("configuration reloaded cut_off=1")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(
        cloud_log().contains("control session closed: the certificate is no longer trusted"),
        "{}",
        bed.logs()
    );
    wait_until(
        Duration::from_secs(10),
        "B refused when it reconnects",
        || bed.b.log_text().contains("the cloud refused us"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(bed.status(Side::B).unwrap()["cloud"]["connected"] == false);
    // A name of B's A never asked for is not found any more.
    let d = dig(&bed.a.lan, GW_A, "gw2.ovl.example", "A").unwrap();
    assert!(d.answers.is_empty(), "{d:?}");
    let out = bed
        .cloud_cli(&["members", "show", "gw2.ovl.example", "--json"])
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown[0]["online"], false, "{shown}");
    assert!(shown[0]["names"].as_array().unwrap().is_empty(), "{shown}");
}

/// Revoked online, with traffic flowing (`cyphonic-cloud revoke NAME`, no reload anywhere):
/// within a few seconds the cloud closes B's session and releases its names, A is told and
/// drops B from its peer table (pings stop; B's handshakes are refused), B is refused when
/// it reconnects, and B's names no longer resolve, even the one A had cached.
#[test]
fn a_member_revoked_online_loses_its_tunnels_within_seconds() {
    let bed = cloud_bed();
    let b_host = resolve(&bed, Side::A, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, &b_host[0], Ping::count(2).wait(3));
    let a_host = resolve(&bed, Side::B, "host.gw1.ovl.example");
    let peers = |bed: &TwoSites| {
        bed.status(Side::A).unwrap()["peers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(peers(&bed), ["gw2.ovl.example"]);

    let cloud = bed.cloud.as_ref().unwrap();
    let started = std::time::Instant::now();
    let out = bed.cloud_cli(&["revoke", "gw2.ovl.example"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(Duration::from_secs(8), "A to drop gw2", || {
        peers(&bed).is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let dropped = started.elapsed();
    eprintln!("revoked online: A dropped B after {dropped:?}");
    // The table changes a moment before the daemon says why (its log line follows the
    // removal): the reason is waited for, briefly, not read at once.
    wait_until(Duration::from_secs(2), "A to say why gw2 left", || {
        bed.a
            .log_text()
            .contains("peer removed: revoked by the cloud")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.a.log_text()));
    // Nothing passes any more: no reply at all to three more pings.
    let after = bed.ping(Side::A, b_host[0].parse().unwrap(), &["-c", "3", "-W", "1"]);
    assert!(!after.unwrap().status.success(), "{}", bed.logs());
    // Nor the other way: B, which still knows A, handshakes anew, and A refuses its
    // certificate as revoked.
    let back = bed.ping(Side::B, a_host[0].parse().unwrap(), &["-c", "3", "-W", "1"]);
    assert!(!back.unwrap().status.success(), "{}", bed.logs());
    wait_until(Duration::from_secs(8), "A to refuse B's handshake", || {
        bed.a
            .log_text()
            .lines()
            .any(|l| l.contains("handshake refused") && l.contains("reason=\"cert_revoked\""))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    // B is refused when it comes back; its names are gone, even from A's cache.
    wait_until(
        Duration::from_secs(10),
        "B refused when it reconnects",
        || bed.b.log_text().contains("the cloud refused us"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    for name in ["host.gw2.ovl.example", "gw2.ovl.example"] {
        let d = dig(&bed.a.lan, GW_A, name, "A").unwrap();
        assert!(d.answers.is_empty(), "{name}: {d:?}");
    }
    let cloud_log = std::fs::read_to_string(cloud.log()).unwrap_or_default();
    assert!(
        cloud_log.contains("certificates revoked online"),
        "{cloud_log}"
    );
    assert!(peers(&bed).is_empty());
    // A client that was away hears of it when it connects: A restarted is told again.
    let mut bed = bed;
    let applied = |bed: &TwoSites| {
        bed.a
            .log_text()
            .matches("revocations from the cloud applied")
            .count()
    };
    assert_eq!(applied(&bed), 1);
    bed.stop(Side::A, "TERM").unwrap();
    bed.start(Side::A).unwrap();
    wait_until(Duration::from_secs(10), "A told again", || {
        applied(&bed) == 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
}

/// No two names hold one address (issue 49, finding 6). `ca issue` refuses a block inside
/// a valid certificate of another name it issued (at d2129cb it issued it without a word).
/// A certificate made anyway, by a copy of the CA that does not know what the CA issued (a
/// second laptop holding the key), is refused by the cloud when it connects (counted, and
/// the node told why), so no client is ever given it: A does not hear of the squatter, and
/// B still reaches A's host. (A client that is told of two such peers all the same uses
/// neither: crates/tunnel/tests/engine.rs.)
#[test]
fn an_overlapping_certificate_is_refused_at_issue_and_by_the_cloud() {
    let bed = cloud_bed();
    let scratch = bed.tmp().join("squat-cert");
    let issue = |ca: &std::path::Path| {
        cyphonic_e2e::ca_issue(
            &bed.bins.cloud,
            ca,
            "squat.ovl.example",
            "100.64.1.128/25",
            &scratch,
        )
    };
    let err = issue(&bed.ca_dir()).expect_err("the CA tool issued an overlapping block");
    let err = format!("{err:#}");
    assert!(
        err.contains("100.64.1.128/25 overlaps 100.64.1.0/24 of gw1.ovl.example"),
        "{err}"
    );
    assert!(!scratch.join("squat.ovl.example.crt").exists());

    // A copy of the CA without its record of what it issued.
    let copy = bed.tmp().join("ca-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(bed.ca_dir().join(f), copy.join(f)).unwrap();
    }
    let spec = NodeSpec {
        name: "squat.ovl.example".into(),
        block: "100.64.1.128/25".into(),
        attach: Attach::Own(None),
    };
    let mut node = NodeHost::new(
        &bed.wan,
        &bed.bins,
        &copy,
        bed.tmp(),
        bed.cloud.as_ref().unwrap(),
        &spec,
    )
    .unwrap();
    node.start(&bed.bins).unwrap();
    wait_until(
        Duration::from_secs(12),
        "the cloud to refuse the squatter",
        || bed.cloud_counter("overlapping").unwrap_or(0) >= 1,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", node.log_text(), bed.logs()));
    wait_until(Duration::from_secs(5), "the squatter to hear why", || {
        node.log_text()
            .contains("blocks overlap those of the member gw1.ovl.example")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.log_text()));
    let d = dig(&bed.a.lan, GW_A, "squat.ovl.example", "A").unwrap();
    assert!(d.answers.is_empty(), "{d:?}");
    let peers = bed.status(Side::A).unwrap()["peers"].clone();
    assert!(!peers.to_string().contains("squat.ovl.example"), "{peers}");
    let a_host = resolve(&bed, Side::B, "host.gw1.ovl.example");
    bed.ping_ok(&bed.b.lan, &a_host[0], Ping::count(3).wait(5));
    let peers = bed.status(Side::B).unwrap()["peers"].clone();
    assert!(!peers.to_string().contains("squat.ovl.example"), "{peers}");
    node.stop("TERM").unwrap();
}

/// The members driver (`cyphonic-bed members`) against the real cloud binary: 50 signal
/// clients from one process, each with its own certificate and IPv6 source address, all
/// register and each resolves another's name to its vIP.
#[test]
fn fifty_members_from_one_process_register_and_resolve() {
    use cyphonic_e2e::members::{MembersBed, MembersOptions};
    let bed = MembersBed::new(50, false).unwrap();
    let f = bed
        .run(&MembersOptions {
            concurrency: 16,
            idle_seconds: 0,
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}",
                std::fs::read_to_string(bed.cloud.log()).unwrap_or_default()
            )
        });
    assert_eq!(f.registered, 50, "{f:?}");
    assert_eq!((f.resolved, f.resolve_failed), (50, 0), "{f:?}");
    assert!(f.cloud_rss_kib.1 > 0, "{f:?}");
}

/// The swarm (`cyphonic-bed swarm`) against the real adapter and cloud: 30 peers from one
/// process, each with its own certificate, IPv6 address, control session and tunnel
/// socket, all join the adapter through the cloud, every ping through the adapter to the
/// host behind it comes back, and every peer handshakes again when all are asked at once.
/// The adapter started with 20 devices' leases in its lease file, and holds them.
#[test]
fn thirty_peers_from_one_process_join_the_adapter_and_ping_through_it() {
    use cyphonic_e2e::bed::Side;
    use cyphonic_e2e::swarm::{SwarmBed, SwarmOptions, peer_name};
    let bed = SwarmBed::new(30, 20).unwrap();
    let f = bed
        .run(&SwarmOptions {
            concurrency: 8,
            pings: 60,
            idle_seconds: 0,
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.bed.logs()));
    let logs = || bed.bed.logs();
    assert_eq!((f.registered, f.up), (30, 30), "{f:?}\n{}", logs());
    assert_eq!(f.pings, (60, 0), "{f:?}\n{}", logs());
    assert_eq!(f.rekeyed, 30, "{f:?}\n{}", logs());
    // The adapter holds each peer once, by its certificate's name, and counted every
    // session: 30 joins and 30 rekeys at least.
    let status = bed.bed.status(Side::A).unwrap();
    let mut names: Vec<String> = status["peers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..30).map(|i| peer_name(i).name).collect();
    want.sort();
    assert_eq!(names, want, "{status}");
    assert!(f.handshakes[1] >= 60, "{f:?}");
    assert!(f.adapter_rss_kib.1 > 0, "{f:?}");
    // The lease file it started with: 20 devices, and the reserved LAN host.
    assert_eq!(f.leases, 21, "{status}");
}
