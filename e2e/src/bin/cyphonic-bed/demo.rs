//! `cyphonic-bed demo`: the whole system on this machine, step by step, with what each step
//! shows.

use super::*;

pub(crate) fn step(n: u32, text: &str) {
    println!("\n{n}. {text}");
}

/// Prints a command's output, indented.
pub(crate) fn show(out: &std::process::Output) {
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("   {line}");
    }
}

/// Asks `server` from `ns` for `name` until the answer has an address (a fresh registration
/// takes a moment to reach the cloud): the answer, or an error after about 12 s.
pub(crate) fn resolve(
    ns: &cyphonic_e2e::Netns,
    server: std::net::Ipv4Addr,
    name: &str,
) -> anyhow::Result<String> {
    for _ in 0..24 {
        if let Ok(d) = dig(ns, server, name, "A")
            && d.status == "NOERROR"
            && let Some(a) = d.answers.first()
        {
            return Ok(a.clone());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    anyhow::bail!("{name} did not resolve")
}

/// A ping summary line: "3/3 replies, 0.61 ms average".
pub(crate) fn ping_line(
    ns: &cyphonic_e2e::Netns,
    to: &str,
    count: usize,
) -> anyhow::Result<String> {
    let n = count.to_string();
    let out = ns.exec_output("ping", &["-c", &n, "-i", "0.2", "-W", "2", to])?;
    let p = measure::parse_ping(&String::from_utf8_lossy(&out.stdout), count);
    anyhow::ensure!(p.received > 0, "no reply from {to}");
    Ok(format!(
        "{}/{} replies, {:.3} ms average",
        p.received, p.sent, p.avg_ms
    ))
}

/// iperf3 TCP from `client` to the server on `server` reached as `target`: Gbit/s.
pub(crate) fn tcp_by_name(
    server: &cyphonic_e2e::Netns,
    client: &cyphonic_e2e::Netns,
    target: &str,
    secs: u64,
) -> anyhow::Result<f64> {
    tcp_with(server, client, target, secs, &[])
}

/// [`tcp_by_name`] with more of iperf3's client arguments (`-p`, `-R`).
pub(crate) fn tcp_with(
    server: &cyphonic_e2e::Netns,
    client: &cyphonic_e2e::Netns,
    target: &str,
    secs: u64,
    more: &[&str],
) -> anyhow::Result<f64> {
    let srv = server.spawn("iperf3", &["-s", "-1", "--idle-timeout", "20"])?;
    std::thread::sleep(Duration::from_millis(300));
    let t = secs.to_string();
    let mut args = vec!["-J", "-c", target, "-t", &t];
    args.extend_from_slice(more);
    let out = client.exec_output("iperf3", &args)?;
    drop(srv);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3: {}", String::from_utf8_lossy(&out.stderr)))?;
    anyhow::ensure!(r["error"].is_null(), "iperf3: {}", r["error"]);
    Ok(r["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9)
}

pub(crate) fn demo(short: bool) -> anyhow::Result<()> {
    println!(
        "cyphonic demo: an overlay of two sites and a host, built from network namespaces on this machine.\n"
    );
    println!(
        "  [camera, DHCP] -- [adapter gw1.ovl.example] --+                   +-- [adapter gw2.ovl.example] -- [sensor, DHCP]"
    );
    println!(
        "                       198.51.100.2              +-- [router] ----+       203.0.113.2"
    );
    println!(
        "  [nodec.ovl.example: cyphonic-node, TUN] ---------+   192.0.2.66  +-- [cyphonic-cloud: AS, NMS, relay] 192.0.2.10"
    );
    println!(
        "\n  The camera and the sensor are plain Linux hosts that only run a DHCP client; the adapters give them\n  an overlay address and a name, and build encrypted tunnels when a name is asked for."
    );
    step(
        1,
        "An overlay CA for ovl.example issues certificates: gw1 for 100.64.1.0/24, gw2 for 100.64.2.0/24, nodec for 100.64.3.0/24.",
    );
    let mut bed = TwoSites::new(&BedOptions {
        cloud: Some(CloudOptions::default()),
        lan_switch: true,
        node_c: Some(None),
        ..BedOptions::default()
    })?;
    println!("   CA and certificates: {}", bed.ca_dir().display());
    step(
        2,
        "The cloud runs (cyphonic-cloud serve, SQLite); both adapters and the node start with its address and key only: no peer lists.",
    );
    bed.start(Side::A)?;
    bed.start(Side::B)?;
    let bins = bed.bins.clone();
    bed.c.as_mut().context("node C")?.start(&bins)?;
    println!(
        "   cloud pid {}, adapter A pid {}, adapter B pid {}, node C pid {}",
        bed.cloud
            .as_ref()
            .and_then(|c| c.proc.as_ref())
            .map_or(0, cyphonic_e2e::Proc::pid),
        bed.a.adapter.as_ref().map_or(0, cyphonic_e2e::Proc::pid),
        bed.b.adapter.as_ref().map_or(0, cyphonic_e2e::Proc::pid),
        bed.c
            .as_ref()
            .and_then(|c| c.proc.as_ref())
            .map_or(0, cyphonic_e2e::Proc::pid),
    );
    step(
        3,
        "A camera joins site A and a sensor joins site B: busybox udhcpc, an unmodified DHCP client, asks each adapter for an address.",
    );
    let mut devices = Vec::new();
    for (side, name) in [(Side::A, "camera"), (Side::B, "sensor")] {
        let (ns, mac) = bed.add_host(side, name)?;
        let mut host = DhcpHost::new(ns, mac, DhcpClient::Udhcpc, name)?;
        host.start()?;
        let lease = host.wait_for(&["bound"], 1, Duration::from_secs(20))?;
        println!(
            "   {name} {}: {}/{}, router {}, DNS {}, domain {}, MTU {}, lease {} s",
            host.mac,
            lease.get("ip"),
            lease.get("mask"),
            lease.get("router"),
            lease.get("dns"),
            lease.get("domain"),
            lease.get("mtu"),
            lease.get("lease")
        );
        host.ns
            .set_resolv_conf(&format!("nameserver {}\n", lease.get("dns")))?;
        devices.push(host);
    }
    let (camera, sensor) = (&devices[0], &devices[1]);
    step(
        4,
        "The camera asks its adapter's DNS for sensor.gw2.ovl.example: adapter A asks the cloud, both adapters handshake at once, and the answer comes once the tunnel is up.",
    );
    let asked = std::time::Instant::now();
    let ip = resolve(&camera.ns, bed.a.gateway, "sensor.gw2.ovl.example")?;
    println!(
        "   sensor.gw2.ovl.example = {ip} (answered in {:.0} ms, the tunnel included)",
        asked.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "   camera -> sensor by name: {}",
        ping_line(&camera.ns, "sensor.gw2.ovl.example", 3)?
    );
    step(
        5,
        "Node C resolves the camera's name through its own DNS stub (its resolv.conf points at it) and pings it.",
    );
    let node = &bed.c.as_ref().context("node C")?.ns;
    let ip = resolve(node, cyphonic_e2e::node::VIP, "camera.gw1.ovl.example")?;
    println!("   camera.gw1.ovl.example = {ip}");
    println!(
        "   node C -> camera by name: {}",
        ping_line(node, "camera.gw1.ovl.example", 3)?
    );
    let secs = if short { 1 } else { 5 };
    step(
        6,
        &format!("iperf3 TCP by name through the tunnels, {secs} s each."),
    );
    println!(
        "   camera -> sensor: {:.2} Gbit/s",
        tcp_by_name(&sensor.ns, &camera.ns, "sensor.gw2.ovl.example", secs)?
    );
    println!(
        "   node C -> camera: {:.2} Gbit/s",
        tcp_by_name(&camera.ns, node, "camera.gw1.ovl.example", secs)?
    );
    step(7, "What adapter A reports (cyphonic-adapter status):");
    show(
        &std::process::Command::new(&bed.bins.adapter)
            .args([
                "status",
                "--socket",
                bed.a.socket().to_str().context("path")?,
            ])
            .output()?,
    );
    step(8, "What node C reports (cyphonic-node status):");
    let c = bed.c.as_ref().context("node C")?;
    show(
        &std::process::Command::new(&bed.bins.node)
            .args(["status", "--socket", c.socket().to_str().context("path")?])
            .output()?,
    );
    step(9, "What the cloud reports (cyphonic-cloud status):");
    let cloud = bed.cloud.as_ref().context("cloud")?;
    show(
        &std::process::Command::new(&bed.bins.cloud)
            .args([
                "status",
                "--socket",
                cloud.dir.join("cloud.sock").to_str().context("path")?,
            ])
            .output()?,
    );
    step(
        10,
        "Stopping everything and removing every namespace, link and file of the demo.",
    );
    for mut d in devices {
        d.stop()?;
    }
    bed.c.as_mut().context("node C")?.stop("TERM")?;
    bed.stop(Side::A, "TERM")?;
    bed.stop(Side::B, "TERM")?;
    drop(bed);
    println!("   done.");
    Ok(())
}
