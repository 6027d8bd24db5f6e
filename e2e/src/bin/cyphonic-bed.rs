//! `cyphonic-bed`: the two-site bed as a program, for `cargo xtask demo` and
//! `cargo xtask bench`. Builds everything in network namespaces of its own and removes it
//! again, also when interrupted by an error.
#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::cast_precision_loss)]

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use cyphonic_e2e::bed::{BedOptions, Side, TwoSites};
use cyphonic_e2e::lan::{DhcpClient, DhcpHost, dig};
use cyphonic_e2e::measure::{self, PingStats, Tcp, Udp};

#[derive(Parser)]
#[command(
    name = "cyphonic-bed",
    about = "The cyphonic two-site test bed: demo and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole system: the cloud, two adapters with DHCP devices, a node; names, ping and
    /// iperf3 by name; the status tables.
    Demo {
        /// Shorter measurements (for CI).
        #[arg(long)]
        short: bool,
    },
    /// Plain kernel routing against the tunnel, and the ordering ablation; prints Markdown.
    Bench {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
    /// One quick look at the tunnel with some `[dataplane]` settings (for tuning): idle RTT,
    /// TCP with 1 and 4 streams, RTT under one stream, UDP at one rate; prints one line.
    Tune {
        /// Lines for both adapters' `[dataplane]` table, `;`-separated
        /// (`"inline_max = 0; batch_size = 16"`).
        #[arg(long, default_value = "")]
        dataplane: String,
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Offered UDP rate, Mbit/s (0: as fast as possible).
        #[arg(long, default_value_t = 800)]
        udp: u64,
        /// GRO on on the gateways' LAN side (the adapters take coalesced frames and cut them
        /// back into segments, `lan_gro = true`); without it, the wire-like GRO-off profile.
        #[arg(long)]
        gro: bool,
        /// Plain kernel routing instead of the tunnel (the baseline).
        #[arg(long)]
        plain: bool,
    },
    /// The floor under any userspace forwarder's idle RTT on this machine: ping over one
    /// veth (the kernel answers) against a UDP echo answered by a thread blocked in `recv`;
    /// prints one line.
    Floor {
        /// Round trips of each kind, 10 ms apart.
        #[arg(long, default_value_t = 300)]
        count: usize,
    },
    /// Many nodes talking to the host behind one adapter (RTT, aggregate TCP, the adapter's
    /// memory and threads per fleet size); prints Markdown.
    Peers {
        /// Fleet sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,5,10,50")]
        counts: Vec<usize>,
        /// Seconds of TCP per fleet.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
}

fn main() -> ExitCode {
    cyphonic_e2e::tear_down_on_abnormal_exit();
    let result = match Cli::parse().command {
        Command::Demo { short } => demo(short),
        Command::Bench { seconds } => bench(seconds).map(|md| print!("{md}")),
        Command::Peers { counts, seconds } => peers(&counts, seconds).map(|md| print!("{md}")),
        Command::Floor { count } => measure::wake_floor(count).map(|f| {
            println!(
                "kernel-answered RTT {:.3}/{:.3} ms (avg/p99) | thread-answered UDP RTT {:.3}/{:.3} ms | one wake-up adds {:.3} ms",
                f.kernel.avg_ms,
                f.kernel.p99_ms,
                f.userspace.avg_ms,
                f.userspace.p99_ms,
                f.per_wake_ms()
            );
        }),
        Command::Tune {
            dataplane,
            seconds,
            udp,
            gro,
            plain,
        } => tune(&dataplane, seconds, udp, gro, plain),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cyphonic-bed: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn step(n: u32, text: &str) {
    println!("\n{n}. {text}");
}

/// Prints a command's output, indented.
fn show(out: &std::process::Output) {
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("   {line}");
    }
}

/// Asks `server` from `ns` for `name` until the answer has an address (a fresh registration
/// takes a moment to reach the cloud): the answer, or an error after about 12 s.
fn resolve(
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
fn ping_line(ns: &cyphonic_e2e::Netns, to: &str, count: usize) -> anyhow::Result<String> {
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
fn tcp_by_name(
    server: &cyphonic_e2e::Netns,
    client: &cyphonic_e2e::Netns,
    target: &str,
    secs: u64,
) -> anyhow::Result<f64> {
    let srv = server.spawn("iperf3", &["-s", "-1", "--idle-timeout", "20"])?;
    std::thread::sleep(Duration::from_millis(300));
    let t = secs.to_string();
    let out = client.exec_output("iperf3", &["-J", "-c", target, "-t", &t])?;
    drop(srv);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3: {}", String::from_utf8_lossy(&out.stderr)))?;
    anyhow::ensure!(r["error"].is_null(), "iperf3: {}", r["error"]);
    Ok(r["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9)
}

fn demo(short: bool) -> anyhow::Result<()> {
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
        cloud: true,
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

struct Results {
    tcp1: Tcp,
    tcp4: Tcp,
    udp: Option<Udp>,
    udp_tried: Vec<Udp>,
    /// UDP offered as fast as iperf3 can send (`-b 0`).
    overload: Udp,
    /// 1400-byte datagrams, fragmented by the LAN host at the inner MTU, at [`BIG_RATE`].
    big: Udp,
    idle: PingStats,
    loaded: PingStats,
}

/// The adapters' default inner MTU (`adapter.inner_mtu`), which their DHCP hands out.
const INNER_MTU: u16 = 1420;

/// Offered rate of the 1400-byte UDP run, Mbit/s.
const BIG_RATE: u64 = 400;

const UDP_RATES: [u64; 10] = [100, 200, 400, 600, 800, 1000, 1250, 1500, 2000, 3000];
const UDP_SIZE: usize = 1300;
/// TCP runs per figure; the median is reported.
const RUNS: usize = 3;
/// `dataplane.busy_poll_us` of the busy-polling runs: longer than the 10 ms between the
/// bench's pings, so that the receiving threads poll through a whole ping run.
const BUSY_POLL_US: u32 = 20_000;

fn measure_bed(bed: &TwoSites, seconds: u64) -> anyhow::Result<Results> {
    // Warm up: ARP, the handshake.
    measure::ping(bed, Side::A, bed.b.host_ip, 3, Duration::from_millis(100))?;
    let idle = measure::ping(bed, Side::A, bed.b.host_ip, 300, Duration::from_millis(10))?;
    let tcp1 = measure::tcp_median(bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(bed, 4, seconds, RUNS)?;
    let (udp, udp_tried) = measure::udp_search(bed, &UDP_RATES, UDP_SIZE, 3)?;
    let overload = measure::udp(bed, 0, UDP_SIZE, 3)?;
    // The LAN host takes the MTU the adapter's DHCP hands out (the default inner MTU), as a
    // DHCP client would, so it fragments 1400-byte datagrams itself, in both beds.
    bed.a
        .lan
        .ip(&["link", "set", "eth0", "mtu", &INNER_MTU.to_string()])?;
    let big = measure::udp(bed, BIG_RATE, 1400, 3);
    bed.a.lan.ip(&["link", "set", "eth0", "mtu", "1500"])?;
    let big = big?;
    let loaded = measure::ping_under_load(bed, 5)?;
    Ok(Results {
        tcp1,
        tcp4,
        udp,
        udp_tried,
        overload,
        big,
        idle,
        loaded,
    })
}

/// TCP with 1 and 4 streams through a tunnel built with `opts`, and adapter A's count of
/// packets emitted out of order.
fn ablation_run(opts: &BedOptions, seconds: u64) -> anyhow::Result<(Tcp, Tcp, u64)> {
    let mut bed = TwoSites::new(opts)?;
    bed.start(Side::A)?;
    bed.start(Side::B)?;
    measure::ping(&bed, Side::A, bed.b.host_ip, 3, Duration::from_millis(100))?;
    let t1 = measure::tcp_median(&bed, 1, seconds, RUNS)?;
    let t4 = measure::tcp_median(&bed, 4, seconds, RUNS)?;
    let s = bed.status(Side::A)?;
    Ok((
        t1,
        t4,
        s["pipelines"]["egress"]["out_of_order"]
            .as_u64()
            .unwrap_or(u64::MAX),
    ))
}

/// `cyphonic-bed tune`: see [`Command::Tune`].
fn tune(
    dataplane: &str,
    seconds: u64,
    udp_mbps: u64,
    gro: bool,
    plain: bool,
) -> anyhow::Result<()> {
    let opts = BedOptions {
        dataplane_extra: dataplane.replace(';', "\n"),
        lan_gro: gro,
        ..BedOptions::default()
    };
    let mut bed = TwoSites::new(&opts)?;
    if plain {
        bed.route_plainly()?;
    } else {
        bed.start(Side::A)?;
        bed.start(Side::B)?;
    }
    measure::ping(&bed, Side::A, bed.b.host_ip, 3, Duration::from_millis(100))?;
    let idle = measure::ping(&bed, Side::A, bed.b.host_ip, 200, Duration::from_millis(10))?;
    let t1 = measure::tcp(&bed, 1, seconds)?;
    let t4 = measure::tcp(&bed, 4, seconds)?;
    let loaded = measure::ping_under_load(&bed, 3)?;
    let u = measure::udp(&bed, udp_mbps, UDP_SIZE, 3)?;
    println!(
        "{}: idle RTT {:.3}/{:.3} ms | TCP1 {:.2} Gbit/s ({} retr) | TCP4 {:.2} Gbit/s ({} retr) | loaded RTT {:.3}/{:.3} ms | UDP {:.0}->{:.0} Mbit/s ({:.2}% lost, {} ooo)",
        if plain {
            "plain".to_owned()
        } else {
            format!("tunnel [{dataplane}]")
        },
        idle.avg_ms,
        idle.p99_ms,
        t1.gbps,
        t1.retransmits,
        t4.gbps,
        t4.retransmits,
        loaded.avg_ms,
        loaded.p99_ms,
        u.offered_mbps,
        u.received_mbps,
        u.loss_pct,
        u.out_of_order
    );
    if !plain {
        let s = bed.status(Side::A)?;
        let p = &s["pipelines"];
        println!(
            "  adapter A: egress batches {} (inline {}), ingress batches {} (inline {}), drop_pipeline_full {}, drop_capture_overflow {}, out of order {}, coalesced frames {} -> segments {} ({} refused)",
            p["egress"]["batches"],
            p["egress"]["inline_batches"],
            p["ingress"]["batches"],
            p["ingress"]["inline_batches"],
            s["counters"]["drop_pipeline_full"],
            s["counters"]["drop_capture_overflow"],
            p["egress"]["out_of_order"],
            s["counters"]["coalesced"],
            s["counters"]["segments"],
            s["counters"]["drop_coalesced"]
        );
        let b = bed.status(Side::B)?;
        println!(
            "  adapter B: merged frames to the LAN {} carrying {} segments, lan_sent {}, lan_send_failed {}",
            b["counters"]["lan_merged"],
            b["counters"]["lan_merged_segments"],
            b["counters"]["lan_sent"],
            b["counters"]["lan_send_failed"]
        );
    }
    Ok(())
}

/// The time now, UTC, to the minute (`2026-11-23 15:19 UTC`).
fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.0}%", 100.0 * a / b)
    } else {
        "-".into()
    }
}

fn bench(seconds: u64) -> anyhow::Result<String> {
    let gro_off = BedOptions {
        lan_gro: false,
        ..BedOptions::default()
    };
    eprintln!("bench: plain kernel routing ...");
    let plain = {
        let bed = TwoSites::new(&gro_off)?;
        bed.route_plainly()?;
        measure_bed(&bed, seconds)?
    };
    eprintln!("bench: the cyphonic tunnel ...");
    let (tunnel, egress_ooo) = {
        let mut bed = TwoSites::new(&gro_off)?;
        bed.start(Side::A)?;
        bed.start(Side::B)?;
        let r = measure_bed(&bed, seconds)?;
        let s = bed.status(Side::A)?;
        (
            r,
            s["pipelines"]["egress"]["out_of_order"]
                .as_u64()
                .unwrap_or(u64::MAX),
        )
    };
    let mut ablation = Vec::new();
    for batch in [32usize, 1] {
        let mut row = Vec::new();
        for ordering in [true, false] {
            eprintln!("bench: ablation, batch_size = {batch}, ordering = {ordering} ...");
            let opts = BedOptions {
                ordering,
                // Every batch through the pool: inline batches never overtake anything, so
                // they would hide what ordering does.
                dataplane_extra: format!("batch_size = {batch}\ninline_max = 0"),
                ..gro_off.clone()
            };
            row.push(ablation_run(&opts, seconds)?);
        }
        ablation.push((batch, row));
    }

    let gro_on = BedOptions {
        lan_gro: true,
        ..BedOptions::default()
    };
    eprintln!("bench: GRO on, plain kernel routing ...");
    let plain_gro = {
        let bed = TwoSites::new(&gro_on)?;
        bed.route_plainly()?;
        measure_gro(&bed, seconds)?
    };
    eprintln!("bench: GRO on, the cyphonic tunnel ...");
    let (tunnel_gro, cut) = {
        let mut bed = TwoSites::new(&gro_on)?;
        bed.start(Side::A)?;
        bed.start(Side::B)?;
        let r = measure_gro(&bed, seconds)?;
        let s = bed.status(Side::A)?;
        let count = |k: &str| s["counters"][k].as_u64().unwrap_or(0);
        (
            r,
            (
                count("coalesced"),
                count("segments"),
                count("drop_coalesced"),
                s["pipelines"]["egress"]["out_of_order"]
                    .as_u64()
                    .unwrap_or(u64::MAX),
            ),
        )
    };

    let busy = |opts: &BedOptions| -> anyhow::Result<GroResults> {
        let mut bed = TwoSites::new(&BedOptions {
            dataplane_extra: format!("busy_poll_us = {BUSY_POLL_US}"),
            ..opts.clone()
        })?;
        bed.start(Side::A)?;
        bed.start(Side::B)?;
        measure_gro(&bed, seconds)
    };
    eprintln!("bench: busy polling, GRO off ...");
    let busy_off = busy(&gro_off)?;
    eprintln!("bench: busy polling, GRO on ...");
    let busy_on = busy(&gro_on)?;

    let date = utc_now();
    let mut md = String::new();
    writeln!(
        md,
        "Measured {date} on {}. All five hosts share the machine's cores. Profile: LAN hosts wire-like (TSO and GSO off on their veth, transmit checksum offload on), GRO off on the gateways' LAN side; adapters at their defaults (one crypto worker per core each); release build; TCP figures are medians of {RUNS} runs of {seconds} s; UDP rates 3 s each, {UDP_SIZE}-byte datagrams, 2 MiB UDP socket buffers.",
        machine()
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| lanA -> lanB | plain kernel routing | cyphonic tunnel | tunnel / plain |"
    )?;
    writeln!(md, "|---|---:|---:|---:|")?;
    tcp_rows(
        &mut md,
        (plain.tcp1, plain.tcp4),
        (tunnel.tcp1, tunnel.tcp4),
    )?;
    let udp_cell = |u: &Option<Udp>| {
        u.map_or_else(
            || "under the lowest rate tried".to_owned(),
            |u| {
                format!(
                    "{:.0}; {:.2}% lost; {} out of order",
                    u.received_mbps, u.loss_pct, u.out_of_order
                )
            },
        )
    };
    writeln!(
        md,
        "| UDP, most received with < 1% loss (Mbit/s; loss; out-of-order) | {} | {} | {} |",
        udp_cell(&plain.udp),
        udp_cell(&tunnel.udp),
        ratio(
            tunnel.udp.map_or(0.0, |u| u.received_mbps),
            plain.udp.map_or(0.0, |u| u.received_mbps)
        )
    )?;
    let lossless = |r: &Results| r.udp.map_or(0.0, |u| u.received_mbps);
    writeln!(
        md,
        "| UDP offered as fast as iperf3 sends (-b 0): received (Mbit/s; loss) | {:.0}; {:.1}% | {:.0}; {:.1}% | {} of plain, {} of its own lossless rate |",
        plain.overload.received_mbps,
        plain.overload.loss_pct,
        tunnel.overload.received_mbps,
        tunnel.overload.loss_pct,
        ratio(tunnel.overload.received_mbps, plain.overload.received_mbps),
        ratio(tunnel.overload.received_mbps, lossless(&tunnel)),
    )?;
    writeln!(
        md,
        "| UDP, 1400-byte datagrams fragmented by the LAN host (MTU {}), {BIG_RATE} Mbit/s offered (received; loss; out-of-order) | {} | {} | {} |",
        INNER_MTU,
        udp_cell(&Some(plain.big)),
        udp_cell(&Some(tunnel.big)),
        ratio(tunnel.big.received_mbps, plain.big.received_mbps)
    )?;
    ping_rows(
        &mut md,
        (&plain.idle, &plain.loaded),
        (&tunnel.idle, &tunnel.loaded),
    )?;
    writeln!(md)?;
    let tried = |v: &[Udp]| {
        v.iter()
            .map(|u| {
                format!(
                    "{:.0}→{:.0} ({:.1}%)",
                    u.offered_mbps, u.received_mbps, u.loss_pct
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        md,
        "UDP rates tried (a ladder, then the gap around 1% loss halved up to {} times), offered → received Mbit/s (loss): plain {}; tunnel {}.",
        measure::REFINE,
        tried(&plain.udp_tried),
        tried(&tunnel.udp_tried)
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "Ordering ablation: the same tunnel with `dataplane.ordering = false`, at the default batch of 32 packets (whole batches overtake each other) and with `batch_size = 1` (single packets overtake each other, as in the adapter paper's conventional design); `inline_max = 0` in all four, so that every batch goes through the crypto pool (inline batches cannot be overtaken)."
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| TCP lanA -> lanB, Gbit/s (retransmits) | ordered | unordered | unordered / ordered | packets emitted out of order (ordered / unordered) |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|")?;
    for (batch, row) in &ablation {
        let ((o1, o4, oo), (u1, u4, uo)) = (row[0], row[1]);
        writeln!(
            md,
            "| batch {batch}, 1 stream | {:.2} ({}) | {:.2} ({}) | {} | {oo} / {uo} |",
            o1.gbps,
            o1.retransmits,
            u1.gbps,
            u1.retransmits,
            ratio(u1.gbps, o1.gbps)
        )?;
        writeln!(
            md,
            "| batch {batch}, 4 streams | {:.2} ({}) | {:.2} ({}) | {} | |",
            o4.gbps,
            o4.retransmits,
            u4.gbps,
            u4.retransmits,
            ratio(u4.gbps, o4.gbps)
        )?;
    }
    writeln!(md)?;
    writeln!(
        md,
        "Out-of-order packets emitted by adapter A's egress pipeline during the main tunnel runs: {egress_ooo}."
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "GRO-on profile: the same bed with GRO switched on on the gateways' LAN veths (LAN hosts still wire-like). Plain routing forwards the merged packets whole; the adapters (`lan_gro = true`, the default) take them with their offload header and cut them back into segments before sealing each."
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| lanA -> lanB, GRO on | plain kernel routing | cyphonic tunnel | tunnel / plain |"
    )?;
    writeln!(md, "|---|---:|---:|---:|")?;
    tcp_rows(
        &mut md,
        (plain_gro.tcp1, plain_gro.tcp4),
        (tunnel_gro.tcp1, tunnel_gro.tcp4),
    )?;
    ping_rows(
        &mut md,
        (&plain_gro.idle, &plain_gro.loaded),
        (&tunnel_gro.idle, &tunnel_gro.loaded),
    )?;
    writeln!(md)?;
    let (coalesced, segments, refused, ooo) = cut;
    writeln!(
        md,
        "Adapter A in the GRO-on runs: {coalesced} coalesced frames cut into {segments} segments ({:.1} per frame), {refused} refused, {ooo} packets emitted out of order.",
        if coalesced > 0 {
            segments as f64 / coalesced as f64
        } else {
            0.0
        }
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "Busy polling: the tunnel again in both profiles with `busy_poll_us = {BUSY_POLL_US}` (off by default): the receiving threads keep polling their sockets, yielding the CPU between polls, for {} ms after each packet instead of sleeping until the kernel wakes them. Added idle RTT against plain routing in the same profile.",
        BUSY_POLL_US / 1000
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| lanA -> lanB | GRO off, defaults | GRO off, busy polling | GRO on, defaults | GRO on, busy polling |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|")?;
    let defaults_off = GroResults {
        tcp1: tunnel.tcp1,
        tcp4: tunnel.tcp4,
        idle: tunnel.idle,
        loaded: tunnel.loaded,
    };
    let columns = [
        (&defaults_off, &plain.idle),
        (&busy_off, &plain.idle),
        (&tunnel_gro, &plain_gro.idle),
        (&busy_on, &plain_gro.idle),
    ];
    let row = |md: &mut String, label: &str, cell: &dyn Fn(&GroResults, &PingStats) -> String| {
        let cells: Vec<String> = columns.iter().map(|(r, p)| cell(r, p)).collect();
        writeln!(md, "| {label} | {} |", cells.join(" | "))
    };
    row(&mut md, "TCP, 1 stream (Gbit/s; retransmits)", &|r, _| {
        format!("{:.2}; {}", r.tcp1.gbps, r.tcp1.retransmits)
    })?;
    row(&mut md, "TCP, 4 streams (Gbit/s; retransmits)", &|r, _| {
        format!("{:.2}; {}", r.tcp4.gbps, r.tcp4.retransmits)
    })?;
    row(&mut md, "ping RTT idle, average / p99 (ms)", &|r, _| {
        format!("{:.3} / {:.3}", r.idle.avg_ms, r.idle.p99_ms)
    })?;
    row(
        &mut md,
        "idle RTT added to plain routing's, average / p99 (ms)",
        &|r, p| {
            format!(
                "{:.3} / {:.3}",
                r.idle.avg_ms - p.avg_ms,
                r.idle.p99_ms - p.p99_ms
            )
        },
    )?;
    row(
        &mut md,
        "ping RTT while 1 TCP stream runs, average / p99 (ms)",
        &|r, _| format!("{:.3} / {:.3}", r.loaded.avg_ms, r.loaded.p99_ms),
    )?;
    Ok(md)
}

/// The TCP rows of a plain-vs-tunnel table: (1 stream, 4 streams) of each.
fn tcp_rows(md: &mut String, plain: (Tcp, Tcp), tunnel: (Tcp, Tcp)) -> std::fmt::Result {
    for (label, p, t) in [
        ("TCP, 1 stream", plain.0, tunnel.0),
        ("TCP, 4 streams", plain.1, tunnel.1),
    ] {
        writeln!(
            md,
            "| {label} (Gbit/s; retransmits) | {:.2}; {} | {:.2}; {} | {} |",
            p.gbps,
            p.retransmits,
            t.gbps,
            t.retransmits,
            ratio(t.gbps, p.gbps)
        )?;
    }
    Ok(())
}

/// The RTT rows of a plain-vs-tunnel table: (idle, under one TCP stream) of each.
fn ping_rows(
    md: &mut String,
    plain: (&PingStats, &PingStats),
    tunnel: (&PingStats, &PingStats),
) -> std::fmt::Result {
    let ((pi, pl), (ti, tl)) = (plain, tunnel);
    writeln!(
        md,
        "| ping RTT idle, average / p99 (ms) | {:.3} / {:.3} | {:.3} / {:.3} | added {:.3} / {:.3} |",
        pi.avg_ms,
        pi.p99_ms,
        ti.avg_ms,
        ti.p99_ms,
        ti.avg_ms - pi.avg_ms,
        ti.p99_ms - pi.p99_ms
    )?;
    writeln!(
        md,
        "| ping RTT while 1 TCP stream runs, average / p99 (ms) | {:.3} / {:.3} | {:.3} / {:.3} | |",
        pl.avg_ms, pl.p99_ms, tl.avg_ms, tl.p99_ms
    )
}

/// The GRO-on profile: idle RTT, TCP with 1 and 4 streams, RTT under one stream.
struct GroResults {
    tcp1: Tcp,
    tcp4: Tcp,
    idle: PingStats,
    loaded: PingStats,
}

fn measure_gro(bed: &TwoSites, seconds: u64) -> anyhow::Result<GroResults> {
    measure::ping(bed, Side::A, bed.b.host_ip, 3, Duration::from_millis(100))?;
    let idle = measure::ping(bed, Side::A, bed.b.host_ip, 300, Duration::from_millis(10))?;
    let tcp1 = measure::tcp_median(bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(bed, 4, seconds, RUNS)?;
    let loaded = measure::ping_under_load(bed, 5)?;
    Ok(GroResults {
        tcp1,
        tcp4,
        idle,
        loaded,
    })
}

/// The many-peers table: a fresh bed per fleet size, the cloud and adapter A running.
fn peers(counts: &[usize], seconds: u64) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    for &n in counts {
        eprintln!("bench: {n} node(s) ...");
        let mut bed = TwoSites::new(&BedOptions {
            cloud: true,
            ..BedOptions::default()
        })?;
        bed.start(Side::A)?;
        rows.push(cyphonic_e2e::fleet::measure(&bed, n, seconds)?);
    }
    let date = utc_now();
    let mut md = String::new();
    writeln!(
        md,
        "Measured {date} on {}. Every node, the adapter, the router, the cloud and the LAN host share the machine's cores; release build; each node resolves the LAN host's name through its DNS stub (which builds its tunnel through the cloud), then node 0 pings the host 300 times 10 ms apart with every tunnel up, then every node runs iperf3 TCP to the host at once for {seconds} s.",
        machine()
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| nodes | tunnels at adapter A | RTT node 0 -> host, average / p99 (ms) | TCP, all nodes at once (Gbit/s) | slowest node (Mbit/s) | CPU during TCP, adapter A / all nodes (% of a core) | adapter A RSS (MiB) | adapter A threads |"
    )?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in &rows {
        writeln!(
            md,
            "| {} | {} | {:.3} / {:.3} | {:.2} | {:.0} | {:.0} / {:.0} | {:.1} | {} |",
            r.nodes,
            r.adapter_peers,
            r.rtt.avg_ms,
            r.rtt.p99_ms,
            r.aggregate_gbps,
            r.slowest_gbps * 1e3,
            r.adapter_cpu_pct,
            r.nodes_cpu_pct,
            r.adapter_rss_kib as f64 / 1024.0,
            r.adapter_threads
        )?;
    }
    Ok(md)
}
