//! Sites as they are (issue 52) with the real binaries: devices that keep the fixed
//! addresses and the default gateway they were set up with, the same subnet at both sites
//! (192.0.2.16/28, on purpose), mapped onto each adapter's block (`[legacy]`,
//! docs/protocol.md §6). See e2e/src/bed.rs for the rest of the topology.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use cyphonic_e2e::bed::{BedOptions, Side, TwoSites};
use cyphonic_e2e::pair::{PINGS, PairBed, PingRun, gaps};
use cyphonic_e2e::{Netns, inject, uint};
use serde_json::Value;

/// The legacy subnet of both sites, its old router, and the PLC's address in it.
const SUBNET: &str = "192.0.2.16/28";
const OLD_ROUTER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 17);
const PLC: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
/// A device nobody declared, in the same subnet.
const METER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 21);

/// The PLC's MAC at each site.
fn plc_mac(side: Side) -> &'static str {
    match side {
        Side::A => "02:00:5e:10:0a:14",
        Side::B => "02:00:5e:10:0b:14",
    }
}

/// Site `n`'s (1 for A, 2 for B) overlay address of the PLC: `onto`'s fifth.
fn plc_vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(100, 64, n, 228)
}

/// `[legacy]` of site `n`, with its PLC, and a DHCP pool clear of `onto` (inside
/// 100.64.n.96/27).
fn legacy(n: u8, side: Side, groups: &str) -> String {
    format!(
        "\n[dhcp]\npool = \"100.64.{n}.100-100.64.{n}.127\"\n\n[legacy]\nsubnet = \"{SUBNET}\"\nonto = \"100.64.{n}.224/28\"\ngateway = \"{OLD_ROUTER}\"\n\n[[legacy.device]]\nname = \"plc\"\nmac = \"{}\"\naddress = \"{PLC}\"\ngroups = [{groups}]\n",
        plc_mac(side)
    )
}

/// A host on `side`'s LAN with `mac`, set up by hand as a device of ten years ago: `ip` in
/// the legacy subnet, the old router as default gateway and DNS server; no DHCP client.
fn fixed_device(bed: &mut TwoSites, side: Side, label: &str, mac: &str, ip: Ipv4Addr) -> Netns {
    fixed_device_on(bed, side, label, mac, ip, None)
}

/// As [`fixed_device`], behind an access port of VLAN `tag` when given.
fn fixed_device_on(
    bed: &mut TwoSites,
    side: Side,
    label: &str,
    mac: &str,
    ip: Ipv4Addr,
    tag: Option<u16>,
) -> Netns {
    let (ns, _) = match tag {
        None => bed.add_host(side, label).unwrap(),
        Some(tag) => bed.add_vlan_host(side, label, tag).unwrap(),
    };
    ns.ip(&["link", "set", "eth0", "down"]).unwrap();
    ns.ip(&["link", "set", "eth0", "address", mac]).unwrap();
    ns.ip(&["link", "set", "eth0", "up"]).unwrap();
    ns.ip(&["addr", "add", &format!("{ip}/28"), "dev", "eth0"])
        .unwrap();
    ns.ip(&["route", "add", "default", "via", &OLD_ROUTER.to_string()])
        .unwrap();
    ns.set_resolv_conf(&format!("nameserver {OLD_ROUTER}\n"))
        .unwrap();
    ns
}

/// A TCP service in `ns` on `port` that answers each of `n` connections with the address
/// it came from, and a UDP one on the same port that answers each datagram so; stops after
/// `n` of each, or 30 s.
fn who_am_i(ns: &Netns, port: u16, n: usize) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let h = inject::spawn_inside(ns, move || {
        let tcp = TcpListener::bind(("0.0.0.0", port))?;
        let udp = UdpSocket::bind(("0.0.0.0", port))?;
        tcp.set_nonblocking(true)?;
        udp.set_read_timeout(Some(Duration::from_millis(20)))?;
        let _ = ready_tx.send(());
        let end = std::time::Instant::now() + Duration::from_secs(30);
        let (mut tcp_left, mut udp_left) = (n, n);
        let mut buf = [0u8; 512];
        while (tcp_left > 0 || udp_left > 0) && std::time::Instant::now() < end {
            if let Ok((mut c, from)) = tcp.accept() {
                c.write_all(from.ip().to_string().as_bytes())?;
                tcp_left = tcp_left.saturating_sub(1);
            }
            if let Ok((_, from)) = udp.recv_from(&mut buf) {
                udp.send_to(from.ip().to_string().as_bytes(), from)?;
                udp_left = udp_left.saturating_sub(1);
            }
        }
        Ok(())
    });
    ready
        .recv_timeout(Duration::from_secs(5))
        .expect("the service did not start");
    h
}

/// What `who_am_i` at `to` says from `ns`, over TCP and over UDP.
fn seen_as(ns: &Netns, to: SocketAddr) -> (String, String) {
    inject::inside(ns, move || {
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        c.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut tcp = String::new();
        c.read_to_string(&mut tcp)?;
        let u = UdpSocket::bind("0.0.0.0:0")?;
        u.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut buf = [0u8; 512];
        for _ in 0..3 {
            u.send_to(b"who", to)?;
            if let Ok(n) = u.recv(&mut buf) {
                return Ok((tcp, String::from_utf8_lossy(&buf[..n]).into_owned()));
            }
        }
        Ok((tcp, "no answer".to_owned()))
    })
    .unwrap()
}

/// Whether a UDP datagram from `ns` to `to`, where nothing listens, comes back refused: the
/// port unreachable the far device sends is mapped at both ends, its quote too, so that
/// this end's kernel finds the socket it is about.
fn refused(ns: &Netns, to: SocketAddr) -> bool {
    inject::inside(ns, move || {
        let u = UdpSocket::bind("0.0.0.0:0")?;
        u.connect(to)?;
        u.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            u.send(b"anyone?")?;
            if let Err(e) = u.recv(&mut buf)
                && e.kind() == std::io::ErrorKind::ConnectionRefused
            {
                return Ok(true);
            }
        }
        Ok(false)
    })
    .unwrap()
}

/// What `ping` prints for one echo request of `size` bytes from `ns` to `to` with DF set.
fn ping_df(ns: &Netns, to: Ipv4Addr, size: u16) -> String {
    let out = ns
        .exec_output(
            "ping",
            &[
                "-n",
                "-c",
                "1",
                "-M",
                "do",
                "-s",
                &size.to_string(),
                "-W",
                "2",
                &to.to_string(),
            ],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The path MTU `ns`'s kernel holds for `to` (learned from a fragmentation needed), if any.
fn path_mtu(ns: &Netns, to: Ipv4Addr) -> Option<u32> {
    let route = ns.ip(&["route", "get", &to.to_string()]).unwrap();
    let mut words = route.split_whitespace();
    words.find(|w| *w == "mtu")?;
    words.next()?.parse().ok()
}

/// The leases entry of `vip` in a site's status.
fn device(bed: &TwoSites, side: Side, vip: Ipv4Addr) -> Value {
    let s = bed.status(side).unwrap();
    s["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["vip"] == vip.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("no device {vip}: {s}"))
}

/// A PLC at each site with the same fixed address and gateway, no DHCP client: each finds
/// the other by name at the old router's address, reaches it by ping, TCP and UDP, and sees
/// it at its overlay address; a port unreachable and a time-exceeded from across the tunnel
/// arrive with their quotes mapped, and so does the gateway's fragmentation needed; a box on A's LAN taking the PLC's address from its own MAC is dropped and
/// counted; the status shows each PLC's own address beside its vIP and name.
#[test]
fn fixed_address_devices_with_one_address_at_both_sites_reach_each_other() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    opts.a.extra = legacy(1, Side::A, "\"ot\"");
    opts.b.extra = legacy(2, Side::B, "\"ot\"");
    let mut bed = TwoSites::new(&opts).unwrap();
    let plc_a = fixed_device(&mut bed, Side::A, "plca", plc_mac(Side::A), PLC);
    let plc_b = fixed_device(&mut bed, Side::B, "plcb", plc_mac(Side::B), PLC);
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();

    // Names, at the old router's address: each PLC is its overlay address.
    let b_name = bed.resolve(&plc_a, OLD_ROUTER, "plc.gw2.ovl.example");
    assert_eq!(b_name, vec![plc_vip(2).to_string()]);
    let a_name = bed.resolve(&plc_b, OLD_ROUTER, "plc.gw1.ovl.example");
    assert_eq!(a_name, vec![plc_vip(1).to_string()]);

    // The old router answers pings; the other site's PLC too.
    for (ns, to) in [
        (&plc_a, OLD_ROUTER),
        (&plc_a, plc_vip(2)),
        (&plc_b, plc_vip(1)),
    ] {
        let out = ns
            .exec_output(
                "ping",
                &["-c", "2", "-i", "0.2", "-W", "2", &to.to_string()],
            )
            .unwrap();
        assert!(out.status.success(), "ping {to}\n{}", bed.logs());
    }

    // TCP and UDP both ways: each sees the other at its overlay address.
    let service = who_am_i(&plc_b, 7000, 1);
    let (tcp, udp) = seen_as(&plc_a, (plc_vip(2), 7000).into());
    assert_eq!(
        (tcp.as_str(), udp.as_str()),
        ("100.64.1.228", "100.64.1.228")
    );
    service.join().unwrap().unwrap();
    let service = who_am_i(&plc_a, 7000, 1);
    let (tcp, udp) = seen_as(&plc_b, (plc_vip(1), 7000).into());
    assert_eq!(
        (tcp.as_str(), udp.as_str()),
        ("100.64.2.228", "100.64.2.228")
    );
    service.join().unwrap().unwrap();

    // ICMP errors from across the tunnel, their quotes mapped at both ends: the far PLC's
    // port unreachable, and the far adapter's time-exceeded for a TTL that ran out there
    // (ping matches it to its socket by the quote).
    assert!(refused(&plc_a, (plc_vip(2), 7999).into()), "{}", bed.logs());
    let out = plc_a
        .exec_output(
            "ping",
            &[
                "-n",
                "-c",
                "1",
                "-t",
                "2",
                "-W",
                "2",
                &plc_vip(2).to_string(),
            ],
        )
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("From 100.64.2.1") && said.contains("Time to live exceeded"),
        "{said}\n{}",
        bed.logs()
    );
    assert_eq!(bed.counter(Side::B, "icmp_time_exceeded").unwrap(), 1);
    // A packet too large for the tunnel, with DF: A's fragmentation needed comes from the
    // old router's address and quotes what the PLC sent, so the PLC's kernel takes the
    // tunnel's MTU for the path.
    let said = ping_df(&plc_a, plc_vip(2), 1472);
    assert!(
        said.contains(&format!("From {OLD_ROUTER}")) && said.contains("Frag needed"),
        "{said}\n{}",
        bed.logs()
    );
    let mtu = path_mtu(&plc_a, plc_vip(2));
    assert!(mtu.is_some_and(|m| m < 1500), "{mtu:?}");

    // A box on A's LAN takes the PLC's address from its own MAC: none of it leaves.
    let spoofed_before = bed.counter(Side::A, "drop_spoofed").unwrap();
    let rogue = fixed_device(&mut bed, Side::A, "rogue", "02:00:5e:10:0a:66", PLC);
    let out = rogue
        .exec_output(
            "ping",
            &["-c", "3", "-i", "0.2", "-W", "1", &plc_vip(2).to_string()],
        )
        .unwrap();
    assert!(!out.status.success(), "the spoofer reached B");
    assert!(bed.counter(Side::A, "drop_spoofed").unwrap() >= spoofed_before + 3);

    // A meter nobody declared is learned at its first frames: it reaches B without a name,
    // and the status lists it, to declare; a second MAC at its address is a spoofer.
    let meter = fixed_device(&mut bed, Side::A, "meter", "02:00:5e:10:0a:15", METER);
    assert!(pings(&meter, plc_vip(2)), "{}", bed.logs());
    let d = device(&bed, Side::A, Ipv4Addr::new(100, 64, 1, 229));
    assert_eq!(
        (&d["legacy"], &d["learned"], &d["name"]),
        (
            &Value::from(METER.to_string()),
            &Value::from(true),
            &Value::Null
        ),
        "{d}"
    );
    let copy = fixed_device(&mut bed, Side::A, "copy", "02:00:5e:10:0a:16", METER);
    assert!(
        !pings(&copy, plc_vip(2)),
        "a second MAC at the meter's address got through"
    );

    // The status: the PLC's own address beside its vIP and name.
    let d = device(&bed, Side::A, plc_vip(1));
    assert_eq!(d["legacy"], PLC.to_string(), "{d}");
    assert_eq!(d["name"], "plc.gw1.ovl.example", "{d}");
    assert_eq!(d["mac"], plc_mac(Side::A), "{d}");
}

/// With `learn = false`, only declared devices pass: an undeclared one is dropped and
/// counted, and nothing is learned.
#[test]
fn without_learning_only_declared_devices_pass() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    opts.a.extra =
        legacy(1, Side::A, "").replace("\n[[legacy.device]]", "learn = false\n\n[[legacy.device]]");
    let mut bed = TwoSites::new(&opts).unwrap();
    let plc = fixed_device(&mut bed, Side::A, "plc", plc_mac(Side::A), PLC);
    let meter = fixed_device(&mut bed, Side::A, "meter", "02:00:5e:10:0a:15", METER);
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let host_b = bed.b.host_ip;
    assert!(pings(&plc, host_b), "{}", bed.logs());
    let before = bed.counter(Side::A, "drop_spoofed").unwrap();
    assert!(!pings(&meter, host_b), "an undeclared device passed");
    assert!(bed.counter(Side::A, "drop_spoofed").unwrap() >= before + 2);
    let s = bed.status(Side::A).unwrap();
    assert!(
        s["leases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["learned"] != true),
        "{s}"
    );
}

/// Whether a TCP connection from `ns` to `to` opens within 2 s.
fn connects(ns: &Netns, to: SocketAddr) -> bool {
    inject::inside(ns, move || {
        Ok(TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok())
    })
    .unwrap()
}

/// Whether any of two pings from `ns` to `to` is answered.
fn pings(ns: &Netns, to: Ipv4Addr) -> bool {
    ns.exec_output(
        "ping",
        &["-c", "2", "-i", "0.2", "-W", "1", &to.to_string()],
    )
    .unwrap()
    .status
    .success()
}

/// A TCP service in `ns` on each of `ports` that takes connections for 30 s.
fn listen(ns: &Netns, ports: &[u16]) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let ports = ports.to_vec();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let h = inject::spawn_inside(ns, move || {
        let listeners = ports
            .iter()
            .map(|p| {
                let l = TcpListener::bind(("0.0.0.0", *p))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let _ = ready_tx.send(());
        let end = std::time::Instant::now() + Duration::from_secs(30);
        let mut open = Vec::new();
        while std::time::Instant::now() < end {
            for l in &listeners {
                if let Ok((c, _)) = l.accept() {
                    open.push(c);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
    ready
        .recv_timeout(Duration::from_secs(5))
        .expect("the service did not start");
    h
}

/// One LAN holds a DHCP device and a fixed-address one; they reach each other through the
/// gateway (one wire, two subnets), and both reach the other site. The policy names the fixed device by name (TCP) and by group (ping), one way, and each end
/// enforces it: A stops what the PLC may not open before sealing it, and what B lets its host
/// open to the PLC is stopped where it arrives, at A.
#[test]
fn the_policy_names_a_fixed_device_by_name_and_group_at_both_ends() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    let nvr = Ipv4Addr::new(100, 64, 2, 10);
    opts.a.extra = format!(
        "{}\n[policy]\n\n[[policy.rule]]\nfrom = [\"plc\"]\nto = [\"{nvr}\"]\nallow = [\"tcp/7000\"]\n\n[[policy.rule]]\nfrom = [\"ot\"]\nto = [\"{nvr}\"]\nallow = [\"icmp\"]\n\n[[policy.rule]]\nfrom = [\"100.64.1.96/27\"]\nto = [\"{nvr}\"]\nallow = [\"tcp/7001\"]\n",
        legacy(1, Side::A, "\"ot\"")
    );
    // B lets its host open TCP to the PLC as well: A alone says no to that.
    opts.b.extra = format!(
        "\n[policy]\n\n[[policy.rule]]\nfrom = [\"{}\"]\nto = [\"host\"]\nallow = [\"tcp/7000\", \"icmp\"]\n\n[[policy.rule]]\nfrom = [\"100.64.1.96/27\"]\nto = [\"host\"]\nallow = [\"tcp/7001\"]\n\n[[policy.rule]]\nfrom = [\"host\"]\nto = [\"{}\"]\nallow = [\"tcp/7002\"]\n",
        plc_vip(1),
        plc_vip(1)
    );
    let mut bed = TwoSites::new(&opts).unwrap();
    let plc = fixed_device(&mut bed, Side::A, "plc", plc_mac(Side::A), PLC);
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let (laptop, laptop_ip) = bed.dhcp_device(Side::A, "laptop").unwrap();
    assert!(
        (100..=127).contains(&laptop_ip.octets()[3]),
        "{laptop_ip} is outside the pool"
    );
    let _nvr = listen(&bed.b.lan, &[7000, 7001]);
    let _plc = listen(&plc, &[7002]);

    // On the one wire, the laptop and the PLC reach each other through the gateway, by name.
    let plc_name = bed.resolve(
        &laptop.ns,
        Ipv4Addr::new(100, 64, 1, 1),
        "plc.gw1.ovl.example",
    );
    assert_eq!(plc_name, vec![plc_vip(1).to_string()]);
    let service = who_am_i(&plc, 7100, 1);
    let (tcp, udp) = seen_as(&laptop.ns, (plc_vip(1), 7100).into());
    assert_eq!((tcp, udp), (laptop_ip.to_string(), laptop_ip.to_string()));
    service.join().unwrap().unwrap();
    let service = who_am_i(&laptop.ns, 7100, 1);
    let (tcp, udp) = seen_as(&plc, (laptop_ip, 7100).into());
    assert_eq!(
        (tcp.as_str(), udp.as_str()),
        ("100.64.1.228", "100.64.1.228")
    );
    service.join().unwrap().unwrap();
    assert!(bed.counter(Side::A, "lan_hairpinned").unwrap() >= 8);

    // The PLC by name (TCP) and by group (ping); the laptop by its pool's block.
    assert!(connects(&plc, (nvr, 7000).into()), "{}", bed.logs());
    assert!(pings(&plc, nvr));
    assert!(connects(&laptop.ns, (nvr, 7001).into()));
    let a_before = uint(&bed.status(Side::A).unwrap()["policy"]["dropped"]["no_rule"]);
    assert!(!connects(&plc, (nvr, 7001).into()), "the PLC opened 7001");
    assert!(
        !connects(&laptop.ns, (nvr, 7000).into()),
        "the laptop opened 7000"
    );
    assert!(
        !pings(&laptop.ns, nvr),
        "the laptop pinged: it is not in group ot"
    );
    let a = bed.status(Side::A).unwrap()["policy"].clone();
    assert!(
        uint(&a["dropped"]["no_rule"]) >= a_before + 3,
        "A stops them before sealing: {a}"
    );

    // One way: the NVR's host may not open to the PLC; B lets it out, A stops it.
    let in_before = uint(&a["dropped_in"]["no_rule"]);
    assert!(
        !connects(&bed.b.lan, (plc_vip(1), 7002).into()),
        "B's host opened a connection to the PLC"
    );
    let a = bed.status(Side::A).unwrap()["policy"].clone();
    assert!(
        uint(&a["dropped_in"]["no_rule"]) > in_before,
        "A drops it on arrival: {a}"
    );
}

/// Pings `to` from each of `from` every 10 ms ([`PINGS`] of them) while `meanwhile` runs 2 s
/// in; what each saw.
fn pings_through(
    from: &[&Netns],
    to: Ipv4Addr,
    meanwhile: impl FnOnce() -> anyhow::Result<()>,
) -> Vec<(PingRun, String)> {
    let count = PINGS.to_string();
    let to = to.to_string();
    let pingers: Vec<_> = from
        .iter()
        .map(|ns| {
            ns.command(
                "ping",
                &["-n", "-D", "-i", "0.01", "-W", "1", "-c", &count, &to],
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let done = meanwhile();
    let seen = pingers
        .into_iter()
        .map(|p| {
            let out = String::from_utf8_lossy(&p.wait_with_output().unwrap().stdout).into_owned();
            (gaps(&out), out)
        })
        .collect();
    done.unwrap();
    seen
}

/// Issue 51 with issue 52: a declared PLC and a learned meter behind an HA pair. The
/// serving box is killed; the standby answers for the old router's address with the pair's
/// MAC (the devices' ARP caches stay right), knows the PLC from the file and learns the meter
/// again from its next frame: both reach B again within seconds, without doing anything.
#[test]
fn fixed_devices_keep_reaching_the_other_site_across_a_failover() {
    let mut pair = PairBed::up_configured(true, &legacy(1, Side::A, "")).unwrap();
    let plc = fixed_device(&mut pair.bed, Side::A, "plc", plc_mac(Side::A), PLC);
    let meter = fixed_device(&mut pair.bed, Side::A, "meter", "02:00:5e:10:0a:15", METER);
    let host_b = pair.bed.b.host_ip;
    assert!(
        pings(&plc, host_b) && pings(&meter, host_b),
        "{}",
        pair.logs()
    );
    let seen = pings_through(&[&plc, &meter], host_b, || {
        pair.bed.stop(Side::A, "KILL").map(drop)
    });
    for (who, (run, out)) in ["PLC", "meter"].iter().zip(&seen) {
        eprintln!(
            "HA, SIGKILL, {who}: {}/{PINGS} replies, longest gap {:?}",
            run.replies, run.gap
        );
        assert!(
            run.to_the_end() && run.gap < Duration::from_secs(5),
            "{who}: {run:?}\n{out}\n{}",
            pair.logs()
        );
    }
    let serving = pair.second_status().unwrap();
    assert_eq!(serving["ha"]["role"], "active", "{serving}");
    let learned: Vec<&Value> = serving["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["learned"] == true)
        .collect();
    assert_eq!(learned.len(), 1, "{serving}");
    assert_eq!(learned[0]["legacy"], METER.to_string(), "{serving}");
}

/// The site's router on A's LAN (behind VLAN `tag`'s access port when given): the old
/// router's address, forwarding on, no ICMP redirects (devices keep sending through it).
fn site_router(bed: &mut TwoSites, tag: Option<u16>) -> Netns {
    let (router, _) = match tag {
        None => bed.add_host(Side::A, "router").unwrap(),
        Some(tag) => bed.add_vlan_host(Side::A, "router", tag).unwrap(),
    };
    router
        .ip(&["addr", "add", &format!("{OLD_ROUTER}/28"), "dev", "eth0"])
        .unwrap();
    for key in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.all.send_redirects=0",
        "net.ipv4.conf.eth0.send_redirects=0",
    ] {
        router.exec("sysctl", &["-qw", key]).unwrap();
    }
    router
}

/// Source and destination as they follow each other in an IPv4 header: what a packet in
/// clear between `src` and `dst` carries.
fn in_clear(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut bytes = src.octets().to_vec();
    bytes.extend(dst.octets());
    bytes
}

/// Beside the site's router (issue 52, item 3): a router namespace stays the PLC's gateway
/// (192.0.2.17) and A sits beside it at 192.0.2.18, without DHCP. A asks for the router's
/// MAC itself. Without the router's route to the overlay, the PLC reaches nothing and
/// nothing of it leaves A's uplink in clear; with it, the PLC reaches B's host by name, B's
/// host sees it at its overlay address and reaches it back (through the router), and still
/// nothing leaves in clear. The router's fragmentation needed reaches B's host mapped.
#[test]
fn beside_a_router_devices_reach_the_other_site_once_it_routes_the_overlay() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    opts.a.extra = format!(
        "\n[dhcp]\nenabled = false\n\n[legacy]\nsubnet = \"{SUBNET}\"\nonto = \"100.64.1.224/28\"\ngateway = \"192.0.2.18\"\nrouter = \"{OLD_ROUTER}\"\n\n[[legacy.device]]\nname = \"plc\"\nmac = \"{}\"\naddress = \"{PLC}\"\n",
        plc_mac(Side::A)
    );
    let mut bed = TwoSites::new(&opts).unwrap();
    let router = site_router(&mut bed, None);
    let plc = fixed_device(&mut bed, Side::A, "plc", plc_mac(Side::A), PLC);
    let adapter_at = Ipv4Addr::new(192, 0, 2, 18);
    plc.set_resolv_conf(&format!("nameserver {adapter_at}\n"))
        .unwrap();
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(5), "A heard the router", || {
        bed.site_ref(Side::A)
            .log_text()
            .contains("the site's router is heard")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let host_b = bed.b.host_ip;
    let needles = vec![in_clear(PLC, host_b), in_clear(plc_vip(1), host_b)];
    let clear_while = |f: &dyn Fn() -> bool| {
        std::thread::scope(|s| {
            let capture = s.spawn(|| {
                inject::count_frames_containing_each(
                    &bed.wan,
                    "toa",
                    needles.clone(),
                    Duration::from_secs(4),
                )
            });
            std::thread::sleep(Duration::from_millis(300));
            let ok = f();
            (capture.join().unwrap().unwrap(), ok)
        })
    };

    let (seen, reached) = clear_while(&|| pings(&plc, host_b));
    assert!(!reached, "the PLC reached B without the router's route");
    assert_eq!(seen, vec![0, 0], "in clear on A's uplink");

    router
        .ip(&[
            "route",
            "add",
            "100.64.0.0/10",
            "via",
            &adapter_at.to_string(),
        ])
        .unwrap();
    let (seen, reached) = clear_while(&|| pings(&plc, host_b));
    assert!(reached, "{}", bed.logs());
    assert_eq!(seen, vec![0, 0], "in clear on A's uplink");
    let named = bed.resolve(&plc, adapter_at, "host.gw2.ovl.example");
    assert_eq!(named, vec![host_b.to_string()]);
    let service = who_am_i(&bed.b.lan, 7000, 1);
    let (tcp, udp) = seen_as(&plc, (host_b, 7000).into());
    assert_eq!(
        (tcp.as_str(), udp.as_str()),
        ("100.64.1.228", "100.64.1.228")
    );
    service.join().unwrap().unwrap();
    // B's host opens to the PLC: A hands those packets to the router, which forwards them.
    router
        .exec(
            "nft",
            &[
                "add table ip t; add chain ip t f { type filter hook forward priority 0; }; add rule ip t f ip daddr 192.0.2.20 counter",
            ],
        )
        .unwrap();
    let service = who_am_i(&plc, 7000, 1);
    let (tcp, udp) = seen_as(&bed.b.lan, (plc_vip(1), 7000).into());
    assert_eq!((tcp, udp), (host_b.to_string(), host_b.to_string()));
    service.join().unwrap().unwrap();
    let counted = router
        .exec("nft", &["list", "chain", "ip", "t", "f"])
        .unwrap();
    let packets: u64 = counted
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {counted}"));
    assert!(
        packets >= 4,
        "the router forwarded {packets} packets to the PLC"
    );
    assert_eq!(bed.counter(Side::A, "drop_spoofed").unwrap(), 0);

    // A fragmentation needed from across the tunnel: the router's way to the PLC takes 1200
    // bytes. B's host's DF packet meets the router's error, which A maps (its source, the
    // router, and its quote's destination, the PLC) so that B's kernel finds the socket it is
    // about and takes 1200 as the path's MTU to the PLC's overlay address.
    router
        .ip(&[
            "route",
            "add",
            &format!("{PLC}/32"),
            "dev",
            "eth0",
            "mtu",
            "1200",
        ])
        .unwrap();
    let said = ping_df(&bed.b.lan, plc_vip(1), 1300);
    assert!(
        said.contains("From 100.64.1.225") && said.contains("mtu = 1200"),
        "{said}\n{}",
        bed.logs()
    );
    assert_eq!(path_mtu(&bed.b.lan, plc_vip(1)), Some(1200));
}

/// What `cyphonic-cloud members show NAME` prints (`--json` when `json`), from the bed's
/// cloud.
fn members_show(bed: &TwoSites, name: &str, json: bool) -> String {
    let mut args = vec!["members", "show", name];
    if json {
        args.push("--json");
    }
    let out = bed.cloud_cli(&args).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The fleet view (issue 52, item 5): with a cloud, the adapter registers its fixed device's
/// own address with its name (control version 7), and `members show` prints it beside the
/// vIP; the name resolves from the other site through the cloud.
#[test]
fn the_clouds_members_show_a_fixed_devices_own_address() {
    let mut opts = BedOptions {
        lan_switch: true,
        cloud: Some(cyphonic_e2e::bed::CloudOptions::default()),
        ..BedOptions::default()
    };
    opts.a.extra = legacy(1, Side::A, "");
    let mut bed = TwoSites::new(&opts).unwrap();
    let plc = fixed_device(&mut bed, Side::A, "plc", plc_mac(Side::A), PLC);
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let hosted = |shown: &Value| -> Option<Value> {
        shown.as_array()?.iter().find_map(|cert| {
            cert["names"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == "plc.gw1.ovl.example")
                .cloned()
        })
    };
    let mut found = None;
    cyphonic_e2e::wait_until(
        Duration::from_secs(10),
        "the cloud holds plc's name",
        || {
            let shown: Value = serde_json::from_str(&members_show(&bed, "gw1.ovl.example", true))
                .unwrap_or(Value::Null);
            found = hosted(&shown);
            found.is_some()
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let plc_row = found.unwrap();
    assert_eq!(plc_row["vip"], plc_vip(1).to_string(), "{plc_row}");
    assert_eq!(plc_row["legacy"], PLC.to_string(), "{plc_row}");
    let text = members_show(&bed, "gw1.ovl.example", false);
    assert!(
        text.lines().any(|l| l.contains("plc.gw1.ovl.example")
            && l.contains("100.64.1.228")
            && l.contains("fixed 192.0.2.20")),
        "{text}"
    );
    // Through the cloud, B's host finds the PLC by name and reaches it.
    let named = bed.resolve(
        &bed.b.lan,
        Ipv4Addr::new(100, 64, 2, 1),
        "plc.gw1.ovl.example",
    );
    assert_eq!(named, vec![plc_vip(1).to_string()]);
    assert!(pings(&bed.b.lan, plc_vip(1)), "{}", bed.logs());
    drop(plc);
}

/// An 802.1Q trunk on A's LAN port (docs/protocol.md §6, *VLAN trunks*): a camera VLAN (20)
/// and an OT VLAN (30) beside the untagged segment. A device on each VLAN takes its address
/// from its VLAN's pool and its name from the VLAN's gateway, and the policy holds each VLAN
/// to its group's rule. Nothing crosses between segments; a device may not send from
/// another segment's address; a tag no segment has is dropped and counted.
#[test]
fn a_trunk_gives_each_vlan_its_pool_its_gateway_and_its_group() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    let nvr = Ipv4Addr::new(100, 64, 2, 10);
    opts.a.extra = format!(
        "\n[dhcp]\npool = \"100.64.1.100-100.64.1.127\"\n\n[[vlan]]\ntag = 20\nblock = \"100.64.1.192/27\"\ngroups = [\"cameras\"]\n\n[[vlan]]\ntag = 30\nblock = \"100.64.1.160/28\"\ngroups = [\"ot\"]\n\n[policy]\n\n[[policy.rule]]\nfrom = [\"cameras\"]\nto = [\"{nvr}\"]\nallow = [\"tcp/7000\", \"icmp\"]\n\n[[policy.rule]]\nfrom = [\"ot\"]\nto = [\"{nvr}\"]\nallow = [\"tcp/7001\"]\n\n[[policy.rule]]\nfrom = [\"100.64.1.96/27\"]\nto = [\"{nvr}\"]\nallow = [\"any\"]\n"
    );
    let mut bed = TwoSites::new(&opts).unwrap();
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let _nvr = listen(&bed.b.lan, &[7000, 7001]);
    let (cam, cam_ip) = bed.dhcp_device_on(Side::A, "cam", Some(20)).unwrap();
    let (meter, meter_ip) = bed.dhcp_device_on(Side::A, "meter", Some(30)).unwrap();
    let (laptop, laptop_ip) = bed.dhcp_device(Side::A, "laptop").unwrap();
    let in_block =
        |ip: Ipv4Addr, block: &str| block.parse::<ipnet::Ipv4Net>().unwrap().contains(&ip);
    assert!(in_block(cam_ip, "100.64.1.192/27"), "cam at {cam_ip}");
    assert!(in_block(meter_ip, "100.64.1.160/28"), "meter at {meter_ip}");
    assert!(
        (100..=127).contains(&laptop_ip.octets()[3]),
        "laptop at {laptop_ip}"
    );
    // Each VLAN's gateway (its first host address) is its router and DNS server.
    let cam_gw = Ipv4Addr::new(100, 64, 1, 193);
    assert!(
        pings(&cam.ns, cam_gw),
        "the camera VLAN's gateway\n{}",
        bed.logs()
    );
    assert_eq!(
        bed.resolve(&cam.ns, cam_gw, "meter.gw1.ovl.example"),
        vec![meter_ip.to_string()]
    );

    // Each VLAN's group, at A before sealing; the untagged laptop by its pool's block.
    assert!(connects(&cam.ns, (nvr, 7000).into()), "{}", bed.logs());
    assert!(pings(&cam.ns, nvr));
    assert!(connects(&meter.ns, (nvr, 7001).into()));
    assert!(connects(&laptop.ns, (nvr, 7001).into()));
    let no_rule =
        |bed: &TwoSites| uint(&bed.status(Side::A).unwrap()["policy"]["dropped"]["no_rule"]);
    let before = no_rule(&bed);
    assert!(
        !connects(&cam.ns, (nvr, 7001).into()),
        "a camera opened 7001"
    );
    assert!(
        !connects(&meter.ns, (nvr, 7000).into()),
        "the meter opened 7000"
    );
    assert!(
        !pings(&meter.ns, nvr),
        "the meter pinged: it is not in group cameras"
    );
    assert!(no_rule(&bed) >= before + 3);

    // Nothing between segments, either way.
    let local = bed.counter(Side::A, "drop_local_destination").unwrap();
    assert!(!connects(&cam.ns, (meter_ip, 7001).into()));
    assert!(!pings(&laptop.ns, cam_ip));
    assert!(bed.counter(Side::A, "drop_local_destination").unwrap() >= local + 2);

    // The camera's MAC on the untagged segment, sending as the camera: its address is its
    // VLAN's, so there it is a spoof, dropped and counted (whatever MAC it takes).
    let spoofed = bed.counter(Side::A, "drop_spoofed").unwrap();
    let (twin, _) = bed.add_host(Side::A, "twin").unwrap();
    twin.ip(&["link", "set", "eth0", "down"]).unwrap();
    twin.ip(&["link", "set", "eth0", "address", &cam.mac])
        .unwrap();
    twin.ip(&["link", "set", "eth0", "up"]).unwrap();
    twin.ip(&["addr", "add", &format!("{cam_ip}/24"), "dev", "eth0"])
        .unwrap();
    twin.ip(&["route", "add", "default", "via", "100.64.1.1"])
        .unwrap();
    assert!(
        !pings(&twin, nvr),
        "the camera's twin pinged from the untagged segment"
    );
    assert!(bed.counter(Side::A, "drop_spoofed").unwrap() > spoofed);

    // A tag no segment has.
    let vlan_drops = bed.counter(Side::A, "drop_vlan").unwrap();
    let (stray, _) = bed.add_vlan_host(Side::A, "stray", 40).unwrap();
    stray
        .ip(&["addr", "add", "100.64.1.230/24", "dev", "eth0"])
        .unwrap();
    assert!(!pings(&stray, Ipv4Addr::new(100, 64, 1, 1)));
    assert!(bed.counter(Side::A, "drop_vlan").unwrap() > vlan_drops);

    // The status lists each segment with its server, and each device's VLAN.
    let status = bed.status(Side::A).unwrap();
    let vlans = status["vlans"].as_array().unwrap();
    assert_eq!(vlans.len(), 2, "{status}");
    assert_eq!(
        (vlans[0]["tag"].as_u64(), vlans[0]["gateway"].as_str()),
        (Some(20), Some("100.64.1.193"))
    );
    // One lease file for every segment.
    assert_eq!(vlans[0]["dhcp"]["lease_file"], status["dhcp"]["lease_file"]);
    let file = std::fs::read(bed.a.lease_file()).unwrap();
    let kept = cyphonic_vip::file::decode(&file).unwrap().leases;
    assert!(kept.iter().any(|l| l.ip == cam_ip && l.active), "{kept:?}");
    let vlan_of = |ip: Ipv4Addr| {
        status["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["vip"] == ip.to_string())
            .map(|l| l["vlan"].as_u64())
    };
    assert_eq!(vlan_of(cam_ip), Some(Some(20)), "{status}");
    assert_eq!(vlan_of(meter_ip), Some(Some(30)));
    assert_eq!(vlan_of(laptop_ip), Some(None));
}

/// A VLAN with a legacy map of its own (`[vlan.legacy]`): the OT VLAN's PLC keeps the very
/// address the untagged segment's PLC has (192.0.2.20, on one port of one adapter), and
/// each reaches the other site as its own overlay address, by name, both ways.
#[test]
fn a_vlan_keeps_fixed_devices_at_the_untagged_segments_own_addresses() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    let ot_plc_mac = "02:00:5e:10:1e:14";
    opts.a.extra = format!(
        "{}\n[[vlan]]\ntag = 30\nblock = \"100.64.1.160/27\"\npool = \"100.64.1.162-100.64.1.175\"\n\n[vlan.legacy]\nsubnet = \"{SUBNET}\"\nonto = \"100.64.1.176/28\"\ngateway = \"{OLD_ROUTER}\"\n\n[[vlan.legacy.device]]\nname = \"plc2\"\nmac = \"{ot_plc_mac}\"\naddress = \"{PLC}\"\n",
        legacy(1, Side::A, "")
    );
    let mut bed = TwoSites::new(&opts).unwrap();
    let plc = fixed_device(&mut bed, Side::A, "plc", plc_mac(Side::A), PLC);
    let plc2 = fixed_device_on(&mut bed, Side::A, "plc2", ot_plc_mac, PLC, Some(30));
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let ot_vip = Ipv4Addr::new(100, 64, 1, 180);
    let nvr = Ipv4Addr::new(100, 64, 2, 10);

    // Out: each PLC is seen at the other site as its own overlay address.
    let service = who_am_i(&bed.b.lan, 7100, 2);
    let untagged = seen_as(&plc, (nvr, 7100).into());
    let ot = seen_as(&plc2, (nvr, 7100).into());
    service.join().unwrap().unwrap();
    assert_eq!(
        (untagged.0.as_str(), untagged.1.as_str()),
        ("100.64.1.228", "100.64.1.228"),
        "{}",
        bed.logs()
    );
    assert_eq!(
        (ot.0.as_str(), ot.1.as_str()),
        ("100.64.1.180", "100.64.1.180")
    );

    // In: by name from the other site, each reaches its own PLC in its own terms.
    let b_gw = Ipv4Addr::new(100, 64, 2, 1);
    assert_eq!(
        bed.resolve(&bed.b.lan, b_gw, "plc2.gw1.ovl.example"),
        vec![ot_vip.to_string()]
    );
    // Asked at the VLAN's own gateway across the tunnel, the answer comes from it.
    assert_eq!(
        bed.resolve(
            &bed.b.lan,
            Ipv4Addr::new(100, 64, 1, 161),
            "plc2.gw1.ovl.example"
        ),
        vec![ot_vip.to_string()]
    );
    let service = who_am_i(&plc2, 7200, 1);
    let (tcp, udp) = seen_as(&bed.b.lan, (ot_vip, 7200).into());
    service.join().unwrap().unwrap();
    assert_eq!((tcp, udp), (nvr.to_string(), nvr.to_string()));
    let service = who_am_i(&plc, 7200, 1);
    let (tcp, _) = seen_as(&bed.b.lan, (plc_vip(1), 7200).into());
    service.join().unwrap().unwrap();
    assert_eq!(tcp, nvr.to_string());

    // The status has each PLC's own address and segment.
    let status = bed.status(Side::A).unwrap();
    let entry = |vip: Ipv4Addr| {
        status["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["vip"] == vip.to_string())
            .map(|l| (l["legacy"].clone(), l["vlan"].as_u64()))
    };
    assert_eq!(
        entry(ot_vip),
        Some((PLC.to_string().into(), Some(30))),
        "{status}"
    );
    assert_eq!(entry(plc_vip(1)), Some((PLC.to_string().into(), None)));
}

/// Issue 51 with a trunk: a camera on VLAN 20 takes its address from the serving box of an
/// HA pair, which is then killed. The standby holds every segment's leases (one lease file)
/// and takes the VLAN over with the rest: the camera keeps reaching site B across the
/// failover, the new serving box lists its lease on VLAN 20, and renews it unchanged.
#[test]
fn a_vlans_devices_keep_their_leases_and_reach_across_a_failover() {
    let extra = "\n[dhcp]\npool = \"100.64.1.100-100.64.1.127\"\n\n[[vlan]]\ntag = 20\nblock = \"100.64.1.192/27\"\ngroups = [\"cameras\"]\n";
    let mut pair = PairBed::up_configured(true, extra).unwrap();
    let (cam, cam_ip) = pair.bed.dhcp_device_on(Side::A, "cam", Some(20)).unwrap();
    assert!(
        "100.64.1.192/27"
            .parse::<ipnet::Ipv4Net>()
            .unwrap()
            .contains(&cam_ip),
        "{cam_ip}"
    );
    let host_b = pair.bed.b.host_ip;
    assert!(pings(&cam.ns, host_b), "{}", pair.logs());
    // The new serving box's announcement of the VLAN's gateway (100.64.1.193), as the
    // camera hears it through its access port: a request from the pair's gateway MAC whose
    // sender and target are that address (RFC 5227).
    let vlan_gw = [100, 64, 1, 193];
    let mut announced = vec![0, 1, 0x02, 0x63, 0x79, 64, 1, 1];
    announced.extend(vlan_gw);
    announced.extend([0; 6]);
    announced.extend(vlan_gw);
    let (seen, heard) = std::thread::scope(|scope| {
        let heard = scope.spawn(|| {
            inject::count_frames_containing(&cam.ns, "eth0", announced, Duration::from_secs(8))
        });
        let seen = pings_through(&[&cam.ns], host_b, || {
            pair.bed.stop(Side::A, "KILL").map(drop)
        });
        (seen, heard.join().unwrap())
    });
    assert!(
        heard.unwrap() >= 1,
        "no announcement of the VLAN's gateway\n{}",
        pair.logs()
    );
    let (run, out) = &seen[0];
    eprintln!(
        "HA, SIGKILL, a VLAN's camera: {}/{PINGS} replies, longest gap {:?}",
        run.replies, run.gap
    );
    assert!(
        run.to_the_end() && run.gap < Duration::from_secs(5),
        "{run:?}\n{out}\n{}",
        pair.logs()
    );
    let serving = pair.second_status().unwrap();
    assert_eq!(serving["ha"]["role"], "active", "{serving}");
    let lease = serving["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["vip"] == cam_ip.to_string())
        .cloned();
    assert_eq!(
        lease.as_ref().and_then(|l| l["vlan"].as_u64()),
        Some(20),
        "{serving}"
    );
    // The camera renews with the box now serving: the same address, on its VLAN.
    let renewed = cam
        .renewed(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", pair.logs()));
    assert_eq!(renewed, cam_ip.to_string(), "{}", pair.logs());
}

/// Beside a site's router on a VLAN: the OT VLAN (30) has its own router (192.0.2.17, its
/// PLC's gateway and DHCP server, so the VLAN's `dhcp` is off) and A sits beside it at
/// 192.0.2.18, while the untagged segment keeps A's DHCP. A asks for and hears the VLAN's
/// router; once the router routes the overlay to A, the PLC reaches B's host, which sees it
/// at its overlay address and reaches it back through the router.
#[test]
fn beside_a_router_on_a_vlan_the_vlans_devices_reach_the_other_site() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    let ot_plc_mac = "02:00:5e:10:1e:14";
    opts.a.extra = format!(
        "\n[dhcp]\npool = \"100.64.1.100-100.64.1.127\"\n\n[[vlan]]\ntag = 30\nblock = \"100.64.1.160/27\"\ndhcp = false\n\n[vlan.legacy]\nsubnet = \"{SUBNET}\"\nonto = \"100.64.1.176/28\"\ngateway = \"192.0.2.18\"\nrouter = \"{OLD_ROUTER}\"\n\n[[vlan.legacy.device]]\nname = \"plc2\"\nmac = \"{ot_plc_mac}\"\naddress = \"{PLC}\"\n"
    );
    let mut bed = TwoSites::new(&opts).unwrap();
    let router = site_router(&mut bed, Some(30));
    let plc = fixed_device_on(&mut bed, Side::A, "plc2", ot_plc_mac, PLC, Some(30));
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(5), "A heard the VLAN's router", || {
        bed.site_ref(Side::A)
            .log_text()
            .contains("the site's router is heard")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let host_b = bed.b.host_ip;
    router
        .ip(&["route", "add", "100.64.0.0/10", "via", "192.0.2.18"])
        .unwrap();
    assert!(pings(&plc, host_b), "{}", bed.logs());
    let service = who_am_i(&bed.b.lan, 7000, 1);
    let (tcp, udp) = seen_as(&plc, (host_b, 7000).into());
    service.join().unwrap().unwrap();
    assert_eq!(
        (tcp.as_str(), udp.as_str()),
        ("100.64.1.180", "100.64.1.180")
    );
    let service = who_am_i(&plc, 7000, 1);
    let (tcp, _) = seen_as(&bed.b.lan, (Ipv4Addr::new(100, 64, 1, 180), 7000).into());
    service.join().unwrap().unwrap();
    assert_eq!(tcp, host_b.to_string());
    assert_eq!(bed.counter(Side::A, "drop_spoofed").unwrap(), 0);
}

/// Issue 53: a VLAN segment has its own IPv6 /64 (by default the IPv6 block's second): a
/// device behind VLAN 20's access port takes a SLAAC address in it from the VLAN's
/// advertisement, reaches the VLAN's gateway and site B's device over IPv6 both ways, and
/// the untagged segment keeps its own /64.
#[test]
fn a_vlan_segment_has_its_own_ipv6_64() {
    use cyphonic_e2e::lan::slaac_address;
    let mut opts = BedOptions {
        lan_switch: true,
        ipv6: true,
        ..BedOptions::default()
    };
    opts.a.extra =
        "\n[dhcp]\npool = \"100.64.1.100-100.64.1.127\"\n\n[[vlan]]\ntag = 20\nblock = \"100.64.1.192/27\"\n"
            .into();
    let mut bed = TwoSites::up(&opts).unwrap();
    let (cam, _) = bed.add_vlan_host(Side::A, "cam6", 20).unwrap();
    // The access port relays from the moment its sockets are open: the device's first Router
    // Solicitations may come before that, and the next ones back off (4 s, 8 s, ...). A link
    // flap now starts them again, as plugging the device in would.
    cam.ip(&["link", "set", "eth0", "down"]).unwrap();
    cam.ip(&["link", "set", "eth0", "up"]).unwrap();
    let within = Duration::from_secs(20);
    let cam6 = slaac_address(&cam, "fd7a:0:1:101:", within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let host6 = slaac_address(&bed.a.lan, "fd7a:0:1:100:", within).unwrap();
    let b6 = slaac_address(&bed.b.lan, "fd7a:0:1:200:", within).unwrap();
    let ping6 = |ns: &Netns, to: &str| {
        let out = ns
            .exec_output("ping", &["-6", "-c", "2", "-i", "0.2", "-W", "2", to])
            .unwrap();
        out.status.success()
    };
    assert!(
        ping6(&cam, "fd7a:0:1:101::1"),
        "the VLAN's gateway\n{}",
        bed.logs()
    );
    assert!(ping6(&bed.b.lan, "fd7a:0:1:200::1"), "{}", bed.logs());
    assert!(ping6(&cam, &b6.to_string()), "VLAN to B\n{}", bed.logs());
    assert!(
        ping6(&bed.b.lan, &cam6.to_string()),
        "B to the VLAN\n{}",
        bed.logs()
    );
    assert!(
        ping6(&bed.a.lan, &b6.to_string()),
        "untagged to B\n{}",
        bed.logs()
    );
    // A DHCPv6 client on the VLAN gets an address of its /64's pool from its own server.
    let (ns, mac) = bed.add_vlan_host(Side::A, "vcam", 20).unwrap();
    let mut vcam =
        cyphonic_e2e::lan::DhcpHost::new(ns, mac, cyphonic_e2e::lan::DhcpClient::Dhclient6, "vcam")
            .unwrap();
    vcam.start().unwrap();
    let bound = vcam
        .wait_for(&["bound6"], 1, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    let ip: std::net::Ipv6Addr = bound.get("ip").parse().unwrap();
    assert!(
        ip.to_string().starts_with("fd7a:0:1:101::")
            && (0x1000..=0x1fff).contains(&ip.segments()[7]),
        "{bound:?}"
    );
    assert_eq!(bound.get("dns"), "fd7a:0:1:101::1", "{bound:?}");
    // The VLAN's server counts its own messages and binding; the untagged one saw none.
    let status = bed.status(Side::A).unwrap();
    let vlan6 = &status["vlans"][0]["dhcp6"];
    assert_eq!(vlan6["bindings"].as_u64(), Some(1), "{vlan6}");
    assert!(vlan6["requests"].as_u64() >= Some(1), "{vlan6}");
    assert_eq!(
        status["dhcp6"]["requests"].as_u64(),
        Some(0),
        "{}",
        status["dhcp6"]
    );
    vcam.stop().unwrap();
    assert_eq!(
        status["vlans"][0]["block6"], "fd7a:0:1:101::/64",
        "{}",
        status["vlans"]
    );
    assert!(host6.to_string().starts_with("fd7a:0:1:100:"), "{host6}");
    assert_eq!(uint(&status["counters"]["drop_not_ipv4"]), 0);
}
