//! The node end to end: node C runs `cyphonic-node` (a TUN interface, its DNS stub in its
//! resolv.conf) and reaches a device that joined adapter A's LAN by DHCP, and back, by name,
//! through the cloud: directly, behind a port-preserving NAT, relayed from behind a symmetric
//! one, and again after it restarts.

#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::time::Duration;

use cyphonic_e2e::bed::{BedOptions, CloudOptions, Nat, Ping, Side, SiteOptions, TwoSites};
use cyphonic_e2e::lan::DhcpHost;
use cyphonic_e2e::node::{NAME, VIP};
use cyphonic_e2e::{Netns, uint, wait_until};
use serde_json::Value;

const CAMERA: &str = "camera.gw1.ovl.example";

/// The bed with the cloud, a switch on each LAN, node C (behind `nat_c`) and adapter A
/// (behind `nat_a`), everything started; and a camera on lanA that got its address by DHCP
/// and uses adapter A's DNS, as its lease says.
fn bed(nat_a: Option<Nat>, nat_c: Option<Nat>) -> (TwoSites, DhcpHost, Ipv4Addr) {
    bed_with(nat_a, nat_c, None)
}

/// [`bed`], node C with `userspace` (a `[userspace]` table) appended to its file and started
/// without privileges, when given.
fn bed_with(
    nat_a: Option<Nat>,
    nat_c: Option<Nat>,
    userspace: Option<&str>,
) -> (TwoSites, DhcpHost, Ipv4Addr) {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        lan_switch: true,
        a: SiteOptions {
            nat: nat_a,
            ..SiteOptions::default()
        },
        node_c: Some(nat_c),
        ..BedOptions::default()
    })
    .unwrap();
    let bins = bed.bins.clone();
    let c = bed.c.as_mut().unwrap();
    // Its metrics, in its own namespace.
    let config = c.dir.join("node.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("\n[metrics]\nlisten = \"{NODE_METRICS_AT}\"\n"));
    if let Some(table) = userspace {
        text.push_str(table);
        // Adapter A as a static peer as well: names in its zone are asked of its DNS
        // service, through the stack.
        text.push_str(&format!(
            "\n[[peer]]\ncertificate = \"{}\"\nendpoint = \"{}\"\n",
            bed.a.dir.join("gw1.ovl.example.crt").display(),
            bed.a.endpoint()
        ));
    }
    std::fs::write(&config, text).unwrap();
    if userspace.is_some() {
        c.start_unprivileged(&bins).unwrap();
    } else {
        c.start(&bins).unwrap();
    }
    let (cam, ip) = bed.dhcp_device(Side::A, "camera").unwrap();
    (bed, cam, ip)
}

/// Where node C serves its metrics (inside its namespace).
const NODE_METRICS_AT: &str = "127.0.0.1:9465";

/// iperf3 from `client` to the server on `server`, reached as `target`, with `args`, for
/// `secs`: the client's JSON report.
fn iperf(
    bed: &TwoSites,
    server: &Netns,
    client: &Netns,
    target: &str,
    args: &[&str],
    secs: u64,
) -> Value {
    let srv = server
        .spawn("iperf3", &["-s", "-1", "--idle-timeout", "20"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = secs.to_string();
    let mut all = vec!["-J", "-c", target, "-t", t.as_str()];
    all.extend_from_slice(args);
    let out = client.exec_output("iperf3", &all).unwrap();
    drop(srv);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 {args:?}: {e}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            bed.logs()
        )
    });
    assert!(
        report["error"].is_null(),
        "iperf3 {args:?}: {report}\n{}",
        bed.logs()
    );
    report
}

fn node_ns(bed: &TwoSites) -> &Netns {
    &bed.c.as_ref().unwrap().ns
}

fn node_status(bed: &TwoSites) -> Value {
    bed.c.as_ref().unwrap().status(&bed.bins).unwrap()
}

/// Node C and a DHCP-configured camera behind adapter A find each other by name and carry
/// ping, TCP and UDP both ways; no datagram arrives out of order.
#[test]
fn a_dhcp_device_and_a_node_reach_each_other_by_name() {
    let (bed, cam, cam_ip) = bed(None, None);
    let node = node_ns(&bed);
    // The node's stub answers its own name, and asks the cloud for the camera's.
    assert_eq!(bed.resolve(node, VIP, NAME), [VIP.to_string()]);
    assert_eq!(bed.resolve(node, VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(node, CAMERA, Ping::default());
    // And the camera, through adapter A's DNS, finds the node.
    assert_eq!(
        bed.resolve(&cam.ns, Ipv4Addr::new(100, 64, 1, 1), NAME),
        [VIP.to_string()]
    );
    bed.ping_ok(&cam.ns, NAME, Ping::default());

    for (server, client, target, what) in [
        (&cam.ns, node, CAMERA, "node -> camera"),
        (node, &cam.ns, NAME, "camera -> node"),
    ] {
        let tcp = iperf(&bed, server, client, target, &[], 2);
        let bps = tcp["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        eprintln!("TCP {what}: {:.0} Mbit/s", bps / 1e6);
        assert!(bps > 1e6, "TCP {what}: {tcp}");
        let udp = iperf(&bed, server, client, target, &["-u", "-b", "100M"], 2);
        let sum = &udp["end"]["sum"];
        // iperf3 reports reordering per stream only (the sum has no such field): every
        // stream must carry it, or the check below would pass on nothing.
        let streams = udp["end"]["streams"].as_array().unwrap();
        assert!(!streams.is_empty(), "UDP {what}: no streams: {udp}");
        let out_of_order: u64 = streams
            .iter()
            .map(|s| {
                s["udp"]["out_of_order"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("UDP {what}: a stream without out_of_order: {udp}"))
            })
            .sum();
        eprintln!(
            "UDP {what}: {:.0} Mbit/s, {} lost of {}, {out_of_order} out of order",
            sum["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6,
            sum["lost_packets"],
            sum["packets"],
        );
        assert!(uint(&sum["packets"]) > 1000, "{udp}");
        assert_eq!(out_of_order, 0, "UDP {what}: {udp}");
    }
    let s = node_status(&bed);
    let peer = &s["peers"][0];
    assert_eq!(peer["name"], "gw1.ovl.example", "{s}");
    assert_eq!(
        (peer["route"].as_str(), peer["established"].as_bool()),
        (Some("direct"), Some(true)),
        "{s}"
    );
    assert_eq!(s["pipelines"]["egress"]["out_of_order"], 0, "{s}");
    assert!(uint(&s["dns"]["queries"]) >= 2, "{s}");
    assert!(uint(&s["counters"]["tun_written"]) > 1000, "{s}");
    // The node's TUN offloads are on by default: the host's TCP went out as super-packets,
    // cut here.
    let count = |k: &str| uint(&s["counters"][k]);
    assert!(count("tun_coalesced") > 0, "{s}");
    assert!(count("tun_segments") >= 2 * count("tun_coalesced"), "{s}");
    assert_eq!(
        (count("drop_tun_coalesced"), count("drop_tun_truncated")),
        (0, 0),
        "{s}"
    );
    // And the camera's came into the host's stack as super-packets, runs merged here.
    assert!(count("tun_merged") > 0, "{s}");
    assert!(
        count("tun_merged_segments") >= 2 * count("tun_merged"),
        "{s}"
    );
    assert_eq!(count("tun_write_failed"), 0, "{s}");
    // Its metrics say the same, in a text Prometheus' own tool finds nothing to say of; the
    // dashboard's node panels find theirs.
    let m = cyphonic_e2e::promtool_check(node, NODE_METRICS_AT.parse().unwrap()).unwrap();
    let written = cyphonic_e2e::metric(&m, "cyphonic_tun_written_total").unwrap();
    assert!(written >= count("tun_written") as f64, "{m}");
    assert_eq!(
        cyphonic_e2e::metric(&m, "cyphonic_dropped_total{reason=\"tun_coalesced\"}"),
        Some(0.0),
        "{m}"
    );
    let lacks = cyphonic_e2e::dashboard_lacks(&m, cyphonic_e2e::NODE_METRICS);
    assert!(
        lacks.is_empty(),
        "the dashboard queries {lacks:?}, which the node lacks"
    );
}

/// Node C's SOCKS5 proxy and its forwards to the camera's iperf3 and SSH ports, as the
/// userspace test writes them.
const USERSPACE: &str = "\n[userspace]\nsocks5 = \"127.0.0.1:1080\"\n\n[[userspace.forward]]\nlisten = \"127.0.0.1:15201\"\nto = \"camera.gw1.ovl.example:5201\"\n\n[[userspace.forward]]\nlisten = \"127.0.0.1:2222\"\nto = \"camera.gw1.ovl.example:22\"\n";

/// Issue 55: node C without root (as nobody, no capabilities, none to gain, no TUN device)
/// reaches the camera behind adapter A by name through its SOCKS5 proxy (curl fetches a file
/// from the camera's web server, the same bytes) and through a forward (iperf3 both ways),
/// the camera's name asked of adapter A (a static peer too) through the stack; the camera
/// pings the node by name and asks the node's DNS stub for its name at its vIP; a name
/// nobody has, a port nothing listens on and an address outside the overlay each get
/// SOCKS5's own refusal, counted.
#[test]
fn a_node_without_root_reaches_a_device_through_its_proxy_and_forward() {
    let (bed, cam, _) = bed_with(None, None, Some(USERSPACE));
    let node = node_ns(&bed);
    let c = bed.c.as_ref().unwrap();
    // No device: the namespace has its loopback and its underlay only.
    let links = node.exec("ip", &["-o", "link", "show"]).unwrap();
    assert_eq!(links.lines().count(), 2, "{links}");
    let pid = c.proc.as_ref().unwrap().pid();
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for (key, want) in [
        ("Uid:", "65534\t65534\t65534\t65534"),
        ("CapEff:", "0000000000000000"),
        ("CapBnd:", "0000000000000000"),
        ("NoNewPrivs:", "1"),
    ] {
        let line = proc_status.lines().find(|l| l.starts_with(key)).unwrap();
        assert_eq!(line[key.len()..].trim(), want, "{proc_status}");
    }

    // A file on the camera's web server, through the proxy by name.
    let www = c.dir.parent().unwrap().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let blob: Vec<u8> = (0..3_000_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761).to_be_bytes()[1])
        .collect();
    std::fs::write(www.join("blob"), &blob).unwrap();
    let _web = cam
        .ns
        .spawn(
            "python3",
            &[
                "-m",
                "http.server",
                "8000",
                "--directory",
                www.to_str().unwrap(),
            ],
        )
        .unwrap();
    let curl = |url: &str, out: &str| {
        node.exec_output(
            "curl",
            &[
                "-sS",
                "--max-time",
                "20",
                "--socks5-hostname",
                "127.0.0.1:1080",
                "-o",
                out,
                url,
            ],
        )
        .unwrap()
    };
    let fetched = c.dir.parent().unwrap().join("fetched");
    let url = format!("http://{CAMERA}:8000/blob");
    wait_until(
        Duration::from_secs(15),
        "the camera's file through the proxy",
        || curl(&url, fetched.to_str().unwrap()).status.success(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(std::fs::read(&fetched).unwrap() == blob, "the file differs");
    // Another client's SOCKS5 (netcat's) to a server that sends the file and closes: the
    // close crosses too, so the client ends with the last byte.
    let blob_path = www.join("blob");
    let _sender = cam
        .ns
        .spawn(
            "sh",
            &[
                "-c",
                &format!("exec nc -N -l 9000 < {}", blob_path.display()),
            ],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let script = format!(
        "timeout 15 nc -d -X 5 -x 127.0.0.1:1080 {CAMERA} 9000 > {}",
        fetched.display()
    );
    let out = node.exec_output("sh", &["-c", &script]).unwrap();
    assert!(out.status.success(), "nc: {out:?}\n{}", bed.logs());
    assert!(std::fs::read(&fetched).unwrap() == blob, "the file differs");

    // The camera finds the node by name (the cloud has it) and pings it: the stack answers.
    bed.ping_ok(&cam.ns, NAME, Ping::default());
    // The camera asks the node itself, at its vIP: the stack takes the question for the stub.
    assert_eq!(bed.resolve(&cam.ns, VIP, NAME), [VIP.to_string()]);

    // iperf3 through the forward, both ways.
    for (args, what) in [
        (&["-p", "15201"][..], "node -> camera"),
        (&["-p", "15201", "-R"][..], "camera -> node"),
    ] {
        let tcp = iperf(&bed, &cam.ns, node, "127.0.0.1", args, 2);
        let bps = tcp["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        eprintln!("TCP through the forward, {what}: {:.0} Mbit/s", bps / 1e6);
        assert!(bps > 1e6, "TCP {what}: {tcp}");
    }

    // ssh into the camera through the forward, and through the proxy (ssh's proxy command:
    // netcat's SOCKS5, the name resolved by the node).
    let ssh_dir = c.dir.parent().unwrap().join("ssh");
    let (_sshd, client_home) = ssh_server(&cam.ns, &ssh_dir);
    for (how, target, what) in [
        (vec!["-p", "2222"], "root@127.0.0.1", "through the forward"),
        (
            vec!["-J", "nc -X 5 -x 127.0.0.1:1080 camera.gw1.ovl.example 22"],
            "root@camera.gw1.ovl.example",
            "through the proxy",
        ),
    ] {
        let out = ssh(node, &client_home, &how, target, &format!("echo {what}"));
        assert_eq!(out, format!("{what}\n"), "ssh {what}");
    }

    // Refusals, each in SOCKS5's words: no such name (host unreachable, 4), nothing
    // listening (connection refused, 5), not the overlay (not allowed, 2).
    let before = node_status(&bed);
    for (url, code) in [
        ("http://nowhere.gw1.ovl.example:8000/".to_owned(), "(4)"),
        (format!("http://{CAMERA}:8001/"), "(5)"),
        ("http://192.0.2.1:80/".to_owned(), "(2)"),
    ] {
        let out = curl(&url, "/dev/null");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(code), "{url}: {err}");
    }
    let s = node_status(&bed);
    let count = |doc: &Value, k: &str| uint(&doc["counters"][k]);
    assert_eq!(s["node"]["interface"], "userspace", "{s}");
    assert_eq!(
        count(&s, "proxy_refused") - count(&before, "proxy_refused"),
        2,
        "{s}"
    );
    assert_eq!(
        count(&s, "proxy_unreachable") - count(&before, "proxy_unreachable"),
        1,
        "{s}"
    );
    assert!(
        count(&s, "stack_received") > 1000 && count(&s, "stack_sent") > 1000,
        "{s}"
    );
    // Adapter A's zone was asked of its DNS service through the stack (the camera's name and
    // nowhere's; questions and answers), and the camera's question to us answered so.
    assert!(count(&s, "stack_dns") >= 6, "{s}");
    for k in [
        "drop_stack_full",
        "drop_stack_not_overlay",
        "drop_source_not_certified",
        "drop_stack_dns",
    ] {
        assert_eq!(count(&s, k), 0, "{k}: {s}");
    }
}

/// An SSH server (dropbear) on `ns` port 22 that takes a fresh client key for root, and the
/// home directory holding that key (`.ssh/id_dropbear`). Each side sees its directory as
/// /root through a bind mount private to its process (`ip netns exec` gives every command a
/// mount namespace of its own): the machine's /root is not touched.
fn ssh_server(ns: &Netns, dir: &std::path::Path) -> (cyphonic_e2e::Proc, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let (server_home, client_home) = (dir.join("server"), dir.join("client"));
    for home in [&server_home, &client_home] {
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        for d in [home.clone(), home.join(".ssh")] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
    }
    let key = |path: &std::path::Path| {
        let out = std::process::Command::new("dropbearkey")
            .args(["-t", "ed25519", "-f", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "dropbearkey: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("ssh-ed25519 "))
            .unwrap()
            .to_owned()
    };
    let host_key = dir.join("host_key");
    key(&host_key);
    let public = key(&client_home.join(".ssh/id_dropbear"));
    let authorized = server_home.join(".ssh/authorized_keys");
    std::fs::write(&authorized, format!("{public}\n")).unwrap();
    std::fs::set_permissions(&authorized, std::fs::Permissions::from_mode(0o600)).unwrap();
    let script = format!(
        "mount --bind {} /root && exec dropbear -F -E -s -p 22 -r {} -P {}",
        server_home.display(),
        host_key.display(),
        dir.join("dropbear.pid").display()
    );
    let server = ns.spawn("sh", &["-c", &script]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    (server, client_home)
}

/// Runs `command` over SSH (dbclient, with the key in `home`, no host key check) from `ns`
/// to `target` with `how` (a port, a proxy command); its output.
fn ssh(ns: &Netns, home: &std::path::Path, how: &[&str], target: &str, command: &str) -> String {
    let quoted: Vec<String> = how.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "mount --bind {} /root && exec timeout 20 dbclient -y -y {} {target} '{command}'",
        home.display(),
        quoted.join(" ")
    );
    let out = ns.exec_output("sh", &["-c", &script]).unwrap();
    assert!(out.status.success(), "dbclient {how:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Behind a port-preserving NAT the node's tunnel is direct.
#[test]
fn a_node_behind_a_port_preserving_nat_talks_directly() {
    let (bed, cam, cam_ip) = bed(None, Some(Nat::PortPreserving));
    let node = node_ns(&bed);
    assert_eq!(bed.resolve(node, VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(node, CAMERA, Ping::default());
    bed.ping_ok(&cam.ns, NAME, Ping::default());
    let s = node_status(&bed);
    assert_eq!(s["peers"][0]["route"], "direct", "{s}");
    assert_eq!(s["cloud"]["observed"], "192.0.2.66:51820", "{s}");
}

/// Behind a symmetric NAT, facing an adapter that is behind a NAT too, the node is relayed.
#[test]
fn a_node_behind_a_symmetric_nat_facing_a_nat_is_relayed() {
    let (bed, cam, cam_ip) = bed(Some(Nat::PortPreserving), Some(Nat::Symmetric));
    let node = node_ns(&bed);
    assert_eq!(bed.resolve(node, VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(node, CAMERA, Ping::default());
    bed.ping_ok(&cam.ns, NAME, Ping::default());
    let s = node_status(&bed);
    assert_eq!(s["peers"][0]["route"], "relay", "{s}");
    assert_eq!(s["peers"][0]["relay"]["reason"], "symmetric NAT", "{s}");
    let tcp = iperf(&bed, &cam.ns, node, CAMERA, &[], 2);
    assert!(
        tcp["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0)
            > 1e6,
        "{tcp}"
    );
}

/// Node C restarts: it has forgotten adapter A, which still has it. The camera's traffic
/// comes back by itself (adapter A handshakes again when its packets go unanswered; the node
/// asks the cloud whether it may admit it), and the node reaches the camera by name again.
#[test]
fn a_restarted_node_is_reached_again() {
    let (mut bed, cam, cam_ip) = bed(None, None);
    assert_eq!(
        bed.resolve(node_ns(&bed), VIP, CAMERA),
        [cam_ip.to_string()]
    );
    bed.ping_ok(node_ns(&bed), CAMERA, Ping::default());
    let bins = bed.bins.clone();
    // The log is appended to across the restart: what counts is a line written after it.
    const ASKED: &str = "handshake from a node we do not know: asking the cloud";
    let asked = |bed: &TwoSites| bed.c.as_ref().unwrap().log_text().matches(ASKED).count();
    let asked_before = asked(&bed);
    let c = bed.c.as_mut().unwrap();
    c.stop("TERM").unwrap();
    c.start(&bins).unwrap();
    // The camera pings the node's address (no new name lookup) until answers come back.
    let cam_ns = &cam.ns;
    let back = wait_until(Duration::from_secs(40), "the node answering again", || {
        cam_ns
            .exec_output("ping", &["-c", "1", "-W", "1", &VIP.to_string()])
            .is_ok_and(|o| o.status.success())
    });
    back.unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(asked(&bed) > asked_before, "{}", bed.logs());
    bed.ping_ok(node_ns(&bed), CAMERA, Ping::default());
}

/// Issue 53: two nodes whose certificates hold an IPv6 /128 beside their IPv4 block carry
/// IPv6 between them through the tunnel, both ways, by AAAA name (each stub asks the cloud,
/// which pairs them). Each TUN device holds its address in the overlay's /48 and no
/// link-local address.
#[test]
fn two_nodes_reach_each_other_over_ipv6() {
    use cyphonic_e2e::fleet::{Fleet, node_ipv6};
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..BedOptions::default()
    })
    .unwrap();
    let fleet = Fleet::start_with(&bed, 2, true).unwrap();
    let logs = || fleet.logs();
    for (from, to) in [(0, 1), (1, 0)] {
        let target = format!("n{to}.ovl.example");
        let node = &fleet.nodes[from];
        let dig = cyphonic_e2e::lan::dig(&node.ns, node.vip, &target, "AAAA").unwrap();
        assert_eq!(
            dig.answers,
            [node_ipv6(to).to_string()],
            "{dig:?}\n{}",
            logs()
        );
        ping6_by_name(
            &fleet.nodes[from].ns,
            &target,
            &format!("node {from} to {target}"),
            logs,
        );
    }
    let addrs = fleet.nodes[0]
        .ns
        .exec_output("ip", &["-6", "-o", "addr", "show", "dev", "cyo0"])
        .unwrap();
    let addrs = String::from_utf8_lossy(&addrs.stdout);
    assert!(addrs.contains(&format!("{}/48", node_ipv6(0))), "{addrs}");
    assert!(!addrs.contains("fe80"), "{addrs}");
    // TCP over IPv6 takes the TUN offloads as IPv4 does: node 0's host hands over
    // super-packets, cut there; node 1 hands its host runs merged.
    tcp_and_udp_over_ipv6(
        &bed,
        &fleet.nodes[1].ns,
        &fleet.nodes[0].ns,
        "n1.ovl.example",
    );
    let counters = |n: usize| fleet.nodes[n].status(&bed.bins).unwrap()["counters"].clone();
    let (sender, receiver) = (counters(0), counters(1));
    assert!(uint(&sender["tun_coalesced"]) > 0, "{sender}");
    assert_eq!(uint(&sender["drop_tun_coalesced"]), 0, "{sender}");
    assert!(uint(&receiver["tun_merged"]) > 0, "{receiver}");
    assert_eq!(uint(&receiver["tun_write_failed"]), 0, "{receiver}");
    // A program sending UDP with UDP_SEGMENT (one 12,000-byte message cut into ten
    // datagrams): node 0's host hands it over whole (USO), node 0 cuts it, node 1's host gets
    // the ten datagrams.
    let cut_before = uint(&counters(0)["tun_coalesced"]);
    let got = cyphonic_e2e::inject::spawn_inside(&fleet.nodes[1].ns, || {
        let sock = std::net::UdpSocket::bind("[::]:7777")?;
        sock.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while got.len() < 10 {
            let (n, _) = sock.recv_from(&mut buf)?;
            got.push(buf[..n].to_vec());
        }
        Ok(got)
    });
    std::thread::sleep(Duration::from_millis(300));
    let to = std::net::SocketAddr::new(node_ipv6(1).into(), 7777);
    let from = std::net::SocketAddr::new(node_ipv6(0).into(), 0);
    cyphonic_e2e::inject::inside(&fleet.nodes[0].ns, move || {
        let opts = cyphonic_netio::UdpOptions {
            segmentation: true,
            ..cyphonic_netio::UdpOptions::default()
        };
        let sock = cyphonic_netio::UdpSocket::bind(from, &opts)?;
        let data: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1200]).collect();
        let msgs: Vec<(std::net::SocketAddr, &[u8])> = data.iter().map(|d| (to, &d[..])).collect();
        let (sent, failed, e) = sock.send_batch(&msgs);
        anyhow::ensure!(
            (sent, failed) == (10, 0),
            "sent {sent}, failed {failed}: {e:?}"
        );
        Ok(())
    })
    .unwrap();
    let got = cyphonic_e2e::inject::joined(got).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let want: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1200]).collect();
    assert_eq!(got, want);
    let sender = counters(0);
    assert!(uint(&sender["tun_coalesced"]) > cut_before, "{sender}");
    assert_eq!(uint(&sender["drop_tun_coalesced"]), 0, "{sender}");
}

/// Issue 53: a device on an adapter's LAN takes an IPv6 address by the kernel's own SLAAC
/// from the adapter's Router Advertisement (its /64, the inner MTU, the gateway as default
/// router); the adapter learns it from the device's own packets and names it (AAAA); a node
/// and the device ping each other over IPv6, the node by the device's name.
#[test]
fn a_slaac_device_and_a_node_reach_each_other_over_ipv6() {
    use cyphonic_e2e::fleet::{Fleet, node_ipv6};
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ipv6: true,
        ..BedOptions::default()
    })
    .unwrap();
    let fleet = Fleet::start_with(&bed, 1, true).unwrap();
    let logs = || format!("{}\n{}", bed.a.log_text(), fleet.logs());
    let lan = &bed.a.lan;
    let show = |args: &[&str]| {
        String::from_utf8_lossy(&lan.exec_output("ip", args).unwrap().stdout).into_owned()
    };
    // Its address, made by the kernel from the advertised /64 once its DAD is done.
    let addr = cyphonic_e2e::lan::slaac_address(lan, "fd7a:0:1:100:", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let route = show(&["-6", "route", "show", "default"]);
    assert!(route.contains("via fe80::"), "{route}");
    let mtu = lan
        .exec_output("cat", &["/proc/sys/net/ipv6/conf/eth0/mtu"])
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&mtu.stdout).trim(), "1420");
    // The device pings the gateway's address: the adapter hears it at its address.
    let out = lan
        .exec_output(
            "ping",
            &["-6", "-c", "2", "-i", "0.2", "-W", "2", "fd7a:0:1:100::1"],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "device to gateway: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        logs()
    );
    // The adapter names it by that address.
    let named = || {
        bed.status(Side::A).is_ok_and(|s| {
            s["leases"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|l| l["vip6"].as_str() == Some(&addr.to_string()))
            })
        })
    };
    wait_until(
        Duration::from_secs(5),
        "the device's vip6 in the status",
        named,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}",
            bed.status(Side::A).map(|s| s["leases"].clone())
        )
    });
    let status = bed.status(Side::A).unwrap();
    assert!(uint(&status["counters"]["router_adverts"]) >= 1);
    // The device asks the adapter's DNS service over IPv6, at the address the adapter's
    // advertisement names (RDNSS), for its own name.
    let name = "host.gw1.ovl.example";
    let args = [
        "+tries=1",
        "+time=3",
        "+short",
        "@fd7a:0:1:100::1",
        name,
        "AAAA",
    ];
    let out = lan.exec_output("dig", &args).unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(answer, addr.to_string(), "{}", logs());
    // The node pings the device by its name (the lookup asks the cloud, which names the
    // adapter as the device's peer).
    wait_for_registered_aaaa(&bed, name, addr);
    let node = &fleet.nodes[0];
    wait_until(Duration::from_secs(15), "the device's AAAA", || {
        cyphonic_e2e::lan::dig(&node.ns, node.vip, name, "AAAA")
            .is_ok_and(|d| d.answers == [addr.to_string()])
    })
    .unwrap_or_else(|e| {
        let dig = cyphonic_e2e::lan::dig(&node.ns, node.vip, name, "AAAA");
        panic!("{e}: {dig:?}\n{}", logs())
    });
    ping6_by_name(&node.ns, name, "node to device", logs);
    // And the device the node's address, through the tunnel the name's lookup made.
    let node6 = node_ipv6(0).to_string();
    wait_until(Duration::from_secs(15), "the device's ping", || {
        let ping = ["-6", "-c", "1", "-W", "1", node6.as_str()];
        lan.exec_output("ping", &ping)
            .is_ok_and(|o| o.status.success())
    })
    .unwrap_or_else(|e| {
        let counters = bed.status(Side::A).map(|s| s["counters"].to_string());
        panic!("{e}\n{}\n{counters:?}", logs())
    });
    // TCP and UDP over IPv6 both ways by name (the device asks its adapter, which asks the
    // cloud). From the device, the adapter's LAN port merges its segments (GRO), which the
    // adapter cuts back (none dropped as not IP).
    lan.set_resolv_conf("nameserver 100.64.1.1\n").unwrap();
    let before = bed.counter(Side::A, "coalesced").unwrap();
    tcp_and_udp_over_ipv6(&bed, &node.ns, lan, "n0.ovl.example");
    assert!(bed.counter(Side::A, "coalesced").unwrap() > before);
    tcp_and_udp_over_ipv6(&bed, lan, &node.ns, name);
    assert_eq!(bed.counter(Side::A, "drop_not_ipv4").unwrap(), 0);
    assert_eq!(bed.counter(Side::A, "drop_coalesced").unwrap(), 0);
}

/// Issue 53: a device that speaks IPv6 alone (no DHCPv4, no IPv4 address) takes its
/// address by SLAAC; the adapter names it from its MAC with an AAAA and no A, lists it with
/// the devices of IPv6 only, and registers it (control version 9); a node finds its AAAA
/// through the cloud and pings it by name.
#[test]
fn a_device_with_ipv6_only_has_a_name_a_node_reaches() {
    use cyphonic_e2e::fleet::Fleet;
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ipv6: true,
        lan_switch: true,
        ..BedOptions::default()
    })
    .unwrap();
    let fleet = Fleet::start_with(&bed, 1, true).unwrap();
    let (thread, mac) = bed.add_host(Side::A, "thread").unwrap();
    let logs = || format!("{}\n{}", bed.a.log_text(), fleet.logs());
    let addr = cyphonic_e2e::lan::slaac_address(&thread, "fd7a:0:1:100:", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let out = thread
        .exec_output(
            "ping",
            &["-6", "-c", "2", "-i", "0.2", "-W", "2", "fd7a:0:1:100::1"],
        )
        .unwrap();
    assert!(out.status.success(), "device to gateway\n{}", logs());
    let name = format!(
        "dev-{}.gw1.ovl.example",
        mac.replace(':', "").to_ascii_lowercase()
    );
    let listed = || {
        bed.status(Side::A).is_ok_and(|s| {
            s["devices6"].as_array().is_some_and(|d| {
                d.iter().any(|d| {
                    d["vip6"].as_str() == Some(&addr.to_string())
                        && d["name"].as_str() == Some(name.as_str())
                })
            })
        })
    };
    wait_until(Duration::from_secs(5), "the device among devices6", listed).unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}",
            bed.status(Side::A).map(|s| s["devices6"].clone())
        )
    });
    // The adapter's own DNS service: an AAAA and, for A, the name without one (NODATA).
    let node = &fleet.nodes[0];
    let local =
        |t: &str| cyphonic_e2e::lan::dig(&bed.a.lan, Ipv4Addr::new(100, 64, 1, 1), &name, t);
    let aaaa = local("AAAA").unwrap();
    assert_eq!(aaaa.answers, [addr.to_string()], "{aaaa:?}");
    let a = local("A").unwrap();
    assert!(a.answers.is_empty() && a.status == "NOERROR", "{a:?}");
    // Through the cloud, from the node.
    wait_for_registered_aaaa(&bed, &name, addr);
    wait_until(
        Duration::from_secs(15),
        "the device's AAAA at the node",
        || {
            cyphonic_e2e::lan::dig(&node.ns, node.vip, &name, "AAAA")
                .is_ok_and(|d| d.answers == [addr.to_string()])
        },
    )
    .unwrap_or_else(|e| {
        let dig = cyphonic_e2e::lan::dig(&node.ns, node.vip, &name, "AAAA");
        panic!("{e}: {dig:?}\n{}", logs())
    });
    ping6_by_name(&node.ns, &name, "node to device", logs);
}

/// `ns` pings `name` over IPv6 three times: `what` and `logs` say whose when it does not.
fn ping6_by_name(ns: &Netns, name: &str, what: &str, logs: impl Fn() -> String) {
    let out = ns
        .exec_output("ping", &["-6", "-c", "3", "-i", "0.2", "-W", "2", name])
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        logs()
    );
}

/// 2 s of iperf3 TCP, then of UDP at 100 Mbit/s, over IPv6 from `client` to `server` by
/// `name`: the TCP stream carries data, every UDP stream reports none out of order.
fn tcp_and_udp_over_ipv6(bed: &TwoSites, server: &Netns, client: &Netns, name: &str) {
    let tcp = iperf(bed, server, client, name, &["-6"], 2);
    let bps = tcp["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    eprintln!("TCP over IPv6 to {name}: {:.0} Mbit/s", bps / 1e6);
    assert!(bps > 1e6, "TCP to {name}: {tcp}");
    let udp = iperf(bed, server, client, name, &["-6", "-u", "-b", "100M"], 2);
    let streams = udp["end"]["streams"].as_array().unwrap();
    assert!(!streams.is_empty(), "UDP to {name}: {udp}");
    for s in streams {
        let out_of_order = s["udp"]["out_of_order"]
            .as_u64()
            .unwrap_or_else(|| panic!("UDP to {name}: a stream without out_of_order: {udp}"));
        assert_eq!(out_of_order, 0, "UDP to {name}: {udp}");
    }
    assert!(uint(&udp["end"]["sum"]["packets"]) > 1000, "{udp}");
}

/// Waits until the cloud's registry holds `addr` as the AAAA of `name` (hosted by gw1): a
/// lookup before that would be answered, and cached by the asker's signal client for 30 s,
/// without it.
fn wait_for_registered_aaaa(bed: &TwoSites, name: &str, addr: std::net::Ipv6Addr) {
    let registered = || {
        bed.cloud_cli(&["members", "show", "gw1.ovl.example", "--json"])
            .ok()
            .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
            .is_some_and(|shown| {
                shown[0]["names"].as_array().is_some_and(|names| {
                    names
                        .iter()
                        .any(|n| n["name"] == name && n["vip6"].as_str() == Some(&addr.to_string()))
                })
            })
    };
    wait_until(
        Duration::from_secs(10),
        "the AAAA in the registry",
        registered,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
}

/// Issue 53, done-when: a dual-stack device on an adapter's LAN is one device to the
/// cloud's policy. A rule lets node 0 ping `host.gw1.ovl.example`: it does over IPv6 (the
/// address the device took by SLAAC, registered by its adapter) and over IPv4; the device may
/// not ping the node over either, and its adapter drops those where they start.
#[test]
fn a_rule_for_a_lan_device_holds_over_ipv4_and_ipv6_alike() {
    use cyphonic_e2e::fleet::{Fleet, node_ipv6};
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            extra: "[policy]\ndefault = \"deny\"\n\n[[policy.rule]]\nfrom = [\"n0.ovl.example\"]\n\
                    to = [\"host.gw1.ovl.example\"]\nallow = [\"icmp\"]\n"
                .into(),
            ..CloudOptions::default()
        }),
        a: SiteOptions {
            extra: "[metrics]\nlisten = \"127.0.0.1:9464\"\n".into(),
            ..SiteOptions::default()
        },
        ipv6: true,
        ..BedOptions::default()
    })
    .unwrap();
    let fleet = Fleet::start_with(&bed, 1, true).unwrap();
    let logs = || format!("{}\n{}", bed.logs(), fleet.logs());
    let lan = &bed.a.lan;
    let addr = cyphonic_e2e::lan::slaac_address(lan, "fd7a:0:1:100:", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    // Heard by its adapter, which registers its AAAA; the cloud compiles the rule with it.
    let ping = |ns: &Netns, args: &[&str]| {
        let mut all = vec!["-c", "1", "-W", "1"];
        all.extend_from_slice(args);
        ns.exec_output("ping", &all).unwrap().status.success()
    };
    assert!(ping(lan, &["-6", "fd7a:0:1:100::1"]), "{}", logs());
    // By its name, which the cloud resolves to its IPv6 address (and names its adapter as
    // the peer to reach it by).
    let node = &fleet.nodes[0];
    let name = "host.gw1.ovl.example";
    wait_for_registered_aaaa(&bed, name, addr);
    wait_until(
        Duration::from_secs(20),
        "node 0 to reach the device over IPv6",
        || {
            cyphonic_e2e::lan::dig(&node.ns, node.vip, name, "AAAA")
                .is_ok_and(|d| d.answers == [addr.to_string()])
                && ping(&node.ns, &["-6", name])
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert!(ping(&node.ns, &[&bed.a.host_ip.to_string()]), "{}", logs());
    // Refused: the device to the node, over both families.
    let dropped = || uint(&bed.status(Side::A).unwrap()["policy"]["dropped"]["no_rule"]);
    let before = dropped();
    assert!(
        !ping(lan, &["-6", &node_ipv6(0).to_string()]),
        "the device reached the node over IPv6"
    );
    assert!(
        !ping(lan, &[&node.vip.to_string()]),
        "the device reached the node over IPv4"
    );
    assert!(dropped() >= before + 2, "{}", logs());
    // The adapter's metrics count them where the status does, and hold what the dashboard's
    // policy panel asks for.
    let m =
        cyphonic_e2e::promtool_check(&bed.a.adapter_ns, "127.0.0.1:9464".parse().unwrap()).unwrap();
    let counted = cyphonic_e2e::metric(
        &m,
        "cyphonic_policy_dropped_total{direction=\"out\",reason=\"no_rule\"}",
    )
    .unwrap();
    assert!(counted >= (before + 2) as f64, "{m}");
    let lacks = cyphonic_e2e::dashboard_lacks(&m, cyphonic_e2e::POLICY_METRICS);
    assert!(
        lacks.is_empty(),
        "the dashboard queries {lacks:?}, which the adapter lacks"
    );
}

/// Issue 53, done-when: a node with IPv4 and IPv6 is one member to the cloud's policy. A
/// rule lets node 0 ping node 1: it does over IPv6 by name, and over IPv4; node 1 may not
/// ping node 0 over either (the cloud's rules, enforced by both nodes, compiled for both
/// families from the members' certified blocks).
#[test]
fn a_rule_for_a_node_holds_over_ipv4_and_ipv6_alike() {
    use cyphonic_e2e::fleet::{Fleet, node_ipv6};
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            extra: "[policy]\ndefault = \"deny\"\n\n[[policy.rule]]\nfrom = [\"n0.ovl.example\"]\n\
                    to = [\"n1.ovl.example\"]\nallow = [\"icmp\"]\n"
                .into(),
            ..CloudOptions::default()
        }),
        ..BedOptions::default()
    })
    .unwrap();
    let fleet = Fleet::start_with(&bed, 2, true).unwrap();
    let logs = || fleet.logs();
    let ping = |from: usize, args: &[&str]| {
        let mut all = vec!["-c", "2", "-i", "0.2", "-W", "1"];
        all.extend_from_slice(args);
        fleet.nodes[from]
            .ns
            .exec_output("ping", &all)
            .unwrap()
            .status
            .success()
    };
    // Allowed: 0 to 1, by AAAA name and by address.
    // The cloud compiles the rule once both nodes are members (they registered), and
    // pushes it: rule 1 and rule 0 (DNS, two protocols) on both.
    for node in &fleet.nodes {
        wait_until(
            Duration::from_secs(15),
            "the cloud's rule to arrive",
            || {
                node.status(&bed.bins)
                    .is_ok_and(|s| uint(&s["policy"]["rules"]) == 3)
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    }
    assert!(ping(0, &["-6", "n1.ovl.example"]), "{}", logs());
    let v4 = |i: usize| fleet.nodes[i].vip.to_string();
    assert!(ping(0, &[&v4(1)]), "{}", logs());
    // Refused: 1 to 0, over both families (the tunnel is up: 0 opened it).
    let v6 = |i: usize| node_ipv6(i).to_string();
    assert!(!ping(1, &["-6", &v6(0)]), "node 1 reached node 0 over IPv6");
    assert!(!ping(1, &[&v4(0)]), "node 1 reached node 0 over IPv4");
    // Dropped where they start, before sealing: two echo requests of each family.
    let status = fleet.nodes[1].status(&bed.bins).unwrap();
    assert!(
        uint(&status["policy"]["dropped"]["no_rule"]) >= 4,
        "{status}"
    );
}

/// Issue 53, done-when: the devices of the two sites take their addresses by SLAAC and reach
/// each other by AAAA name (each asks its own adapter, which asks the other's through the
/// tunnel): ping6, and iperf3 -6 TCP and UDP both ways, no datagram out of order.
#[test]
fn devices_at_two_sites_reach_each_other_over_ipv6_by_name() {
    let bed = TwoSites::up(&BedOptions {
        ipv6: true,
        ..BedOptions::default()
    })
    .unwrap();
    let within = Duration::from_secs(20);
    let a6 = cyphonic_e2e::lan::slaac_address(&bed.a.lan, "fd7a:0:1:100:", within).unwrap();
    let b6 = cyphonic_e2e::lan::slaac_address(&bed.b.lan, "fd7a:0:1:200:", within).unwrap();
    let sites = [
        (&bed.a.lan, "100.64.1.1", "fd7a:0:1:100::1", a6),
        (&bed.b.lan, "100.64.2.1", "fd7a:0:1:200::1", b6),
    ];
    for (lan, dns, gw6, _) in sites {
        // Heard by its adapter (and so named), and its resolver is the adapter's.
        let out = lan
            .exec_output("ping", &["-6", "-c", "1", "-W", "2", gw6])
            .unwrap();
        assert!(out.status.success(), "{}", bed.logs());
        lan.set_resolv_conf(&format!("nameserver {dns}\n")).unwrap();
    }
    let pairs = [
        (sites[0], sites[1], "host.gw2.ovl.example"),
        (sites[1], sites[0], "host.gw1.ovl.example"),
    ];
    for ((from, dns, _, _), (to, _, _, addr), name) in pairs {
        wait_until(within, &format!("{name}'s AAAA"), || {
            cyphonic_e2e::lan::dig(from, dns.parse().unwrap(), name, "AAAA")
                .is_ok_and(|d| d.answers == [addr.to_string()])
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
        let out = from
            .exec_output("ping", &["-6", "-c", "3", "-i", "0.2", "-W", "2", name])
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            bed.logs()
        );
        tcp_and_udp_over_ipv6(&bed, to, from, name);
    }
}
