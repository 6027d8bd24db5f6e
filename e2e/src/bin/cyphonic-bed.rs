//! `cyphonic-bed`: the two-site bed as a program, for `cargo xtask demo` and
//! `cargo xtask bench`. Builds everything in network namespaces of its own and removes it
//! again, also when interrupted by an error.
#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::cast_precision_loss)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use cyphonic_e2e::bed::{BedOptions, CloudOptions, Priority, Side, SiteOptions, TwoSites};
use cyphonic_e2e::impair::{ImpairedLink, Impairment};
use cyphonic_e2e::lan::{DhcpClient, DhcpHost, dig};
use cyphonic_e2e::report::{
    self, Ablation, AblationRow, AttackReport, AttackRow, BenchReport, Cut, LatencyColumn,
    LatencyReport, LatencyRole, LatencyRound, Measured, PeersReport, Profile, Quick,
};
use cyphonic_e2e::{fleet, measure};

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
    /// Captures real traffic on the bed (tunnel frames both ways, a control handshake's first
    /// message, endpoint probes) and writes it as fuzz seeds under `DIR/<target>/`.
    Seeds {
        /// The seed directory (fuzz/seeds).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// The whole system: the cloud, two adapters with DHCP devices, a node; names, ping and
    /// iperf3 by name; the status tables.
    Demo {
        /// Shorter measurements (for CI).
        #[arg(long)]
        short: bool,
    },
    /// Plain kernel routing against the tunnel, the ordering ablation, GRO on, busy polling;
    /// prints the figures as JSON (`cargo xtask bench` renders them into
    /// docs/benchmarks.md).
    Bench {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
    /// The adapter under a handshake flood: TCP, RTT, its threads' CPU and DHCP answers
    /// without a flood and at 10,000 and 50,000 initiations a second; prints JSON.
    Attack {
        /// Seconds of TCP per rate.
        #[arg(long, default_value_t = 5)]
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
    /// Where a sparse flow waits while a bulk one runs: RTT idle (`count` pings 10 ms
    /// apart), then while one TCP stream runs with its two ends at default priority and at
    /// idle priority (`chrt --idle 0`, as if they were machines of their own); for the
    /// tunnel, where adapter A's egress and adapter B's ingress packets waited meanwhile.
    /// Prints lines.
    Latency {
        /// Pings idle, 10 ms apart.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Seconds of each loaded phase (100 pings a second).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Lines for both adapters' `[dataplane]` table, `;`-separated.
        #[arg(long, default_value = "")]
        dataplane: String,
        /// GRO on on the gateways' LAN side.
        #[arg(long)]
        gro: bool,
        /// Plain kernel routing instead of the tunnel (the baseline).
        #[arg(long)]
        plain: bool,
    },
    /// A device flooding the sparse class while a bulk stream runs (issue 24; the adapter's
    /// sparse capture socket and its real-time thread): per round, one TCP stream from lanA
    /// to lanB alone, then the same beside lanA sending 64-byte UDP datagrams to lanB's port
    /// 53 as fast as iperf3 can (the DNS class, which the adapter's sparse socket carries),
    /// with what adapter A's sparse side took and dropped and its thread's CPU meanwhile.
    /// Prints lines.
    Flood {
        /// Seconds of each TCP measurement.
        #[arg(long, default_value_t = 8)]
        seconds: u64,
        /// Rounds (each measures the stream alone, then beside the flood).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Lines for both adapters' `[dataplane]` table, `;`-separated.
        #[arg(long, default_value = "")]
        dataplane: String,
        /// Plain kernel routing instead of the tunnel (the baseline).
        #[arg(long)]
        plain: bool,
    },
    /// Issue 24's latency rows in one run, as JSON (`cargo xtask bench --latency` renders
    /// them): `latency`'s three phases for plain routing, the adapter of an earlier build
    /// (`--base`), this build at its defaults and with each `--setting`, the columns
    /// alternating within each round.
    LatencyTable {
        /// Rounds (each runs every column once).
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Pings idle, 10 ms apart.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Seconds of each loaded phase (100 pings a second).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// A directory holding an earlier build's three daemons (the commit before).
        #[arg(long, value_name = "DIR")]
        base: Option<std::path::PathBuf>,
        /// `[dataplane]` lines (`;`-separated) for a column of their own; repeatable.
        #[arg(long)]
        setting: Vec<String>,
    },
    /// TCP through the tunnel against plain routing, both across the same impaired link
    /// between adapter B and the router (netem's `delay`, jitter, `loss` and `reorder`, done
    /// in userspace): one row per impairment, up to `delay 2ms 2ms loss 0.25% reorder 0.5%`;
    /// prints a Markdown table.
    Impair {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Measurements per row and side (the median and the range are reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Where UDP bursts are lost: iperf3 UDP from lanA to lanB (`-w 2M`) at each rate and
    /// datagram size, with what each place on the way dropped meanwhile (adapter A's capture
    /// socket and pipeline, the kernel's UDP receive queues at adapter B and at lanB, B's
    /// pipeline) and how many fragmentation-needed A sent. lanA's MTU stays 1500, so
    /// datagrams over the tunnel's MTU go through path MTU discovery. Prints a Markdown table.
    Bursts {
        /// Seconds per rate.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Offered rates, Mbit/s, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "200,400,600,800,1000")]
        rates: Vec<u64>,
        /// Datagram sizes (UDP payload bytes), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1300,1400")]
        sizes: Vec<usize>,
        /// GRO on on the gateways' LAN side.
        #[arg(long)]
        gro: bool,
        /// Lines for both adapters' `[dataplane]` table, `;`-separated.
        #[arg(long, default_value = "")]
        dataplane: String,
        /// Threads that keep the CPUs busy at default priority while each rate runs (a
        /// machine with other work, as in the run): 0 for none.
        #[arg(long, default_value_t = 0)]
        busy: usize,
        /// Send in trains of this many datagrams back to back (the bed's own sender, not
        /// iperf3): the rate holds on average, the arrivals come as line-rate bursts. 0:
        /// iperf3, paced as it paces.
        #[arg(long, default_value_t = 0)]
        train: usize,
    },
    /// The node against the devices: iperf3 TCP from node C to the host behind adapter A,
    /// and back, against the same from the host behind adapter B (device to device through
    /// two adapters), in one bed, with the node's TUN offloads on and then off
    /// (`dataplane.tun_offload`, the node restarted between); prints a Markdown table.
    Node {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Measurements of each kind per setting (the median and the range are reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Another build of `cyphonic-node` (the commit before, say) for a last row, run with
        /// the same configuration but no `[dataplane]` table.
        #[arg(long)]
        baseline: Option<std::path::PathBuf>,
    },
    /// Many members against the cloud (issue 24, item 4): for each count, a fresh cloud (one
    /// instance on SQLite, or with `--postgres` two on one PostgreSQL, members alternating
    /// between them) and that many signal clients from this process, each with its own
    /// certificate and IPv6 source address: registrations, then one resolution each, then
    /// the cloud idle with all of them connected. Prints a Markdown table.
    Members {
        /// Member counts, comma-separated (at most 65,535).
        #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
        counts: Vec<usize>,
        /// Registrations (resolutions) in progress at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Two instances on PostgreSQL instead of one on SQLite.
        #[arg(long)]
        postgres: bool,
        /// Seconds of idleness measured with every member connected.
        #[arg(long, default_value_t = 10)]
        idle: u64,
    },
    /// Failover of an HA pair (issue 51): for each fault to the serving box (SIGKILL; its
    /// LAN and uplink cut; SIGSTOP then SIGCONT; a planned handover; and nothing, the
    /// baseline), `rounds` fresh pairs on site A, each with pings every 10 ms from a DHCP
    /// device and the LAN host to site B and an 8-s TCP stream through it. Prints a Markdown
    /// table of the longest gaps, the streams that lived and their retransmissions.
    Ha {
        /// Rounds per fault.
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Only these faults (kill, power, uplink, freeze, handover, nothing); all without.
        #[arg(long)]
        fault: Vec<String>,
    },
    /// Many peers speaking the tunnel protocol against one adapter (issue 24, item 4): for
    /// each count, a fresh bed (its cloud, adapter A dual-stack) and that many peers from
    /// this process, each with its own certificate, IPv6 address, control session and
    /// tunnel socket: pairings with the adapter, pings through it to the host behind it,
    /// then the adapter idle with every peer up. Prints a Markdown table.
    Swarm {
        /// Peer counts, comma-separated (at most 16,000).
        #[arg(long, value_delimiter = ',', default_value = "1,100,1000,10000")]
        counts: Vec<usize>,
        /// Registrations (pairings) in progress at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Pings through the adapter, one at a time, spread over the peers.
        #[arg(long, default_value_t = 1000)]
        pings: usize,
        /// Seconds of idleness measured with every peer up.
        #[arg(long, default_value_t = 10)]
        idle: u64,
        /// Adapter A starts with this many devices' leases in its lease file (at most 250).
        #[arg(long, default_value_t = 0)]
        leases: usize,
    },
    /// The floor under any userspace forwarder's idle RTT on this machine: ping over one
    /// veth (the kernel answers) against a UDP echo answered by a thread blocked in `recv`;
    /// prints one line.
    Floor {
        /// Round trips of each kind, 10 ms apart.
        #[arg(long, default_value_t = 300)]
        count: usize,
    },
    /// The per-device policy's cost end to end: TCP with 1 and 4 streams, no policy against
    /// `rules` rules (the one that allows last) with `flows` other flows kept, switched by
    /// SIGHUP on both adapters of one bed, `rounds` times each; prints one line per run and
    /// the ratios.
    Policy {
        /// Rules in force.
        #[arg(long, default_value_t = 300)]
        rules: usize,
        /// Flows opened (one UDP datagram each) before measuring.
        #[arg(long, default_value_t = 10_000)]
        flows: u16,
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Rounds (each: without, then with the policy).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Boots the Raspberry Pi image under qemu-system-aarch64 as one site of the bed and
    /// checks that its adapter comes up from the boot partition's files, leases an address
    /// and reaches the other site (`cargo xtask image --check`).
    ImageCheck {
        /// The image file.
        #[arg(long)]
        image: std::path::PathBuf,
    },
    /// The soak: the cloud, two adapters and a node for a long time, with devices coming and
    /// going, names, traffic bursts, rekeys, restarts and loss switched on and off; every
    /// daemon's memory, files, threads and buffers recorded each cycle into OUT
    /// (`samples.csv`, `report.json`). Fails on a stall or on growth.
    Soak {
        /// How long, seconds.
        #[arg(long)]
        seconds: u64,
        /// One cycle (a device, names, traffic, a sample), seconds.
        #[arg(long, default_value_t = 60)]
        cycle: u64,
        /// Where the samples go.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Draws a soak's curves (OUT/samples.csv, OUT/report.json) into OUT/soak.png, as every
    /// soak does at its end: for a run made before, or to draw it again.
    SoakPlot {
        /// The soak's directory.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Many nodes talking to the host behind one adapter (RTT, aggregate TCP, the adapter's
    /// memory and threads per fleet size); prints the figures as JSON.
    Peers {
        /// Fleet sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,5,10,50")]
        counts: Vec<usize>,
        /// Seconds of TCP per fleet.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
}

/// The soak, then its curves, drawn whether it passed or not (a failed run's are the ones
/// most worth seeing).
fn soak(seconds: u64, cycle: Duration, out: &std::path::Path) -> anyhow::Result<()> {
    let run = cyphonic_e2e::soak::run(seconds, cycle, &cyphonic_e2e::soak::Bounds::default(), out);
    let plot = cyphonic_e2e::soak::plot::render_dir(out);
    if let (Err(_), Err(e)) = (&run, &plot) {
        eprintln!("cyphonic-bed: no curves either: {e:#}");
    }
    let report = run?;
    let png = plot?;
    println!(
        "soak: {} cycles in {} s, no stall, no growth beyond the bounds; samples in {}, curves in {}",
        report.cycles,
        report.seconds,
        out.display(),
        png.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    cyphonic_e2e::tear_down_on_abnormal_exit();
    let result = match Cli::parse().command {
        Command::Demo { short } => demo(short),
        Command::Seeds { out } => seeds(&out),
        Command::Bench { seconds } => bench(seconds).and_then(|r| print_json(&r)),
        Command::Attack { seconds } => attack(seconds).and_then(|r| print_json(&r)),
        Command::Peers { counts, seconds } => peers(&counts, seconds).and_then(|r| print_json(&r)),
        Command::Soak {
            seconds,
            cycle,
            out,
        } => soak(seconds, Duration::from_secs(cycle), &out),
        Command::SoakPlot { out } => cyphonic_e2e::soak::plot::render_dir(&out).map(|png| {
            println!("soak: curves in {}", png.display());
        }),
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
        Command::ImageCheck { image } => cyphonic_e2e::image::boot_check(&image).map(|up| {
            println!(
                "image check passed: the adapter was up {:.1} s after power-on",
                up.as_secs_f64()
            );
        }),
        Command::Tune {
            dataplane,
            seconds,
            udp,
            gro,
            plain,
        } => tune(&dataplane, seconds, udp, gro, plain),
        Command::Latency {
            count,
            seconds,
            dataplane,
            gro,
            plain,
        } => latency(&dataplane, count, seconds, gro, plain),
        Command::Flood {
            seconds,
            rounds,
            dataplane,
            plain,
        } => flood(seconds, rounds, &dataplane, plain),
        Command::LatencyTable {
            rounds,
            count,
            seconds,
            base,
            setting,
        } => latency_table(rounds, count, seconds, base.as_deref(), &setting)
            .and_then(|r| print_json(&r)),
        Command::Policy {
            rules,
            flows,
            seconds,
            rounds,
        } => policy_cost(rules, flows, seconds, rounds),
        Command::Impair { seconds, runs } => impairment_table(seconds, runs),
        Command::Node {
            seconds,
            runs,
            baseline,
        } => node_table(seconds, runs, baseline),
        Command::Bursts {
            seconds,
            rates,
            sizes,
            gro,
            dataplane,
            busy,
            train,
        } => bursts(seconds, &rates, &sizes, &tuned(&dataplane, gro), busy, train),
        Command::Members {
            counts,
            concurrency,
            postgres,
            idle,
        } => members_table(&counts, concurrency, postgres, idle),
        Command::Swarm {
            counts,
            concurrency,
            pings,
            idle,
            leases,
        } => swarm_table(&counts, concurrency, pings, idle, leases),
        Command::Ha { rounds, fault } => ha_table(rounds, &fault),
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

fn measure_bed(bed: &TwoSites, seconds: u64) -> anyhow::Result<Profile> {
    measure::warm_up(bed)?;
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
    Ok(Profile {
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
fn ablation_run(opts: &BedOptions, seconds: u64) -> anyhow::Result<Ablation> {
    let bed = TwoSites::up(opts)?;
    measure::warm_up(&bed)?;
    let tcp1 = measure::tcp_median(&bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(&bed, 4, seconds, RUNS)?;
    Ok(Ablation {
        tcp1,
        tcp4,
        out_of_order: egress_out_of_order(&bed)?,
    })
}

/// Packets adapter A's egress pipeline emitted out of order so far.
fn egress_out_of_order(bed: &TwoSites) -> anyhow::Result<u64> {
    Ok(bed.status(Side::A)?["pipelines"]["egress"]["out_of_order"]
        .as_u64()
        .unwrap_or(u64::MAX))
}

/// `[policy]` with `rules` rules: `rules - 1` that allow nothing on the bed (other
/// addresses), then the one that lets A's block open anything to B's, and `flows` room.
fn policy_table(rules: usize, flows: usize) -> String {
    let mut t = format!("\n[policy]\nflows = {flows}\n");
    for i in 0..rules.saturating_sub(1) {
        t.push_str(&format!(
            "\n[[policy.rule]]\nfrom = [\"100.64.{}.0/24\"]\nto = [\"100.64.{}.0/24\"]\nallow = [\"tcp/{}\", \"udp/{}\"]\n",
            100 + i % 100,
            200 + i % 50,
            1000 + i,
            1000 + i
        ));
    }
    t.push_str("\n[[policy.rule]]\nfrom = [\"gw1.ovl.example\"]\nto = [\"gw2.ovl.example\"]\nallow = [\"any\"]\n");
    t
}

/// `cyphonic-bed policy`: see [`Command::Policy`].
fn policy_cost(rules: usize, flows: u16, seconds: u64, rounds: usize) -> anyhow::Result<()> {
    let opts = BedOptions {
        lan_gro: false,
        ..BedOptions::default()
    };
    let bed = TwoSites::up(&opts)?;
    let base: Vec<String> = [Side::A, Side::B]
        .iter()
        .map(|s| std::fs::read_to_string(bed.site_ref(*s).config()))
        .collect::<Result<_, _>>()?;
    let table = policy_table(rules, usize::from(flows) + 6000);
    let mut reloads = 0;
    let mut set = |on: bool| -> anyhow::Result<()> {
        reloads += 1;
        for (side, text) in [Side::A, Side::B].iter().zip(&base) {
            let extra = if on { table.as_str() } else { "" };
            std::fs::write(bed.site_ref(*side).config(), format!("{text}{extra}"))?;
            let log = bed.reload(*side, reloads)?;
            anyhow::ensure!(
                !log.contains("the running one stays"),
                "the policy was refused:\n{log}"
            );
        }
        Ok(())
    };
    measure::warm_up(&bed)?;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        set(false)?;
        let t = (
            measure::tcp(&bed, 1, seconds)?,
            measure::tcp(&bed, 4, seconds)?,
        );
        println!(
            "round {round} no policy: TCP1 {:.2} Gbit/s ({} retr) | TCP4 {:.2} Gbit/s ({} retr)",
            t.0.gbps, t.0.retransmits, t.1.gbps, t.1.retransmits
        );
        off.push(t);
        set(true)?;
        // The other flows: one datagram each from A's host to B's, to ports of their own.
        let (a, b) = (bed.a.host_ip, bed.b.host_ip);
        cyphonic_e2e::inject::inside(&bed.a.lan, move || {
            let sock = std::net::UdpSocket::bind((a, 0))?;
            for port in 0..flows {
                let _ = sock.send_to(b"x", (b, 20_000 + port));
                if port % 64 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Ok(())
        })?;
        let t = (
            measure::tcp(&bed, 1, seconds)?,
            measure::tcp(&bed, 4, seconds)?,
        );
        let p = &bed.status(Side::A)?["policy"];
        let q = &bed.status(Side::B)?["policy"];
        println!(
            "round {round} {rules} rules: TCP1 {:.2} Gbit/s ({} retr) | TCP4 {:.2} Gbit/s ({} retr) | A: {} flows, {} dropped; B: {} flows, {} dropped",
            t.0.gbps,
            t.0.retransmits,
            t.1.gbps,
            t.1.retransmits,
            p["flows"],
            p["dropped"],
            q["flows"],
            q["dropped"]
        );
        on.push(t);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    for (label, pick) in [
        (
            "TCP1",
            (|t: &(measure::Tcp, measure::Tcp)| t.0.gbps) as fn(&_) -> f64,
        ),
        ("TCP4", |t| t.1.gbps),
    ] {
        let (mut a, mut b): (Vec<f64>, Vec<f64>) = (
            off.iter().map(pick).collect(),
            on.iter().map(pick).collect(),
        );
        let (a, b) = (median(&mut a), median(&mut b));
        println!(
            "{label}: median {a:.2} Gbit/s without policy, {b:.2} with {rules} rules and {flows} flows: {:.0}%",
            100.0 * b / a
        );
    }
    Ok(())
}

/// The bed of `tune` and `latency`: `dataplane` lines (`;`-separated) for both adapters'
/// `[dataplane]`, GRO on the gateways' LAN side or not.
fn tuned(dataplane: &str, gro: bool) -> BedOptions {
    BedOptions {
        dataplane_extra: dataplane.replace(';', "\n"),
        lan_gro: gro,
        ..BedOptions::default()
    }
}

/// A bed of `opts` routed plainly, or with both adapters running: `daemons`' when given
/// (an earlier build's), else the bed's own.
fn quick_bed(
    opts: &BedOptions,
    plain: bool,
    daemons: Option<&cyphonic_e2e::hosts::Bins>,
) -> anyhow::Result<TwoSites> {
    let mut bed = TwoSites::new(opts)?;
    if plain {
        bed.route_plainly()?;
    } else {
        if let Some(bins) = daemons {
            bed.bins = bins.clone();
        }
        bed.start(Side::A)?;
        bed.start(Side::B)?;
    }
    Ok(bed)
}

/// The rows of [`Command::Impair`]: each impairment alone, then all together.
fn impairments() -> [Impairment; 5] {
    let ms = Duration::from_millis;
    let all = Impairment {
        loss: 0.0025,
        delay: ms(2),
        jitter: ms(2),
        reorder: 0.005,
    };
    [
        Impairment::NONE,
        Impairment {
            delay: ms(2),
            jitter: ms(2),
            ..Impairment::NONE
        },
        Impairment {
            loss: 0.0025,
            ..Impairment::NONE
        },
        Impairment {
            delay: ms(2),
            reorder: 0.005,
            ..Impairment::NONE
        },
        all,
    ]
}

/// `cyphonic-bed impair`: see [`Command::Impair`].
fn impairment_table(seconds: u64, runs: usize) -> anyhow::Result<()> {
    println!(
        "| underlay impairment (netem terms) | tunnel TCP, Mbit/s: median (range; its retransmits) | plain TCP, the same | tunnel / plain, medians | the link, tunnel runs: dropped / reordered / forwarded frames |"
    );
    println!("|---|---:|---:|---:|---|");
    for imp in impairments() {
        let opts = BedOptions {
            b: SiteOptions {
                impair: Some(imp),
                ..SiteOptions::default()
            },
            ..BedOptions::default()
        };
        // The runs of one side, sorted by goodput: the median and the range go in the table.
        let side = |plain: bool| -> anyhow::Result<(Vec<measure::Tcp>, String)> {
            let bed = quick_bed(&opts, plain, None)?;
            measure::warm_up(&bed)?;
            let mut all = (0..runs.max(1))
                .map(|_| measure::tcp(&bed, 1, seconds))
                .collect::<anyhow::Result<Vec<_>>>()?;
            all.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
            Ok((all, link_counts(bed.b.link.as_ref())))
        };
        let cell = |all: &[measure::Tcp]| {
            let mbps = |t: &measure::Tcp| t.gbps * 1e3;
            let median = &all[all.len() / 2];
            format!(
                "{:.0} ({:.0}-{:.0}; {})",
                mbps(median),
                mbps(&all[0]),
                mbps(&all[all.len() - 1]),
                median.retransmits
            )
        };
        let (tunnel, link) = side(false)?;
        let (plain, _) = side(true)?;
        let median = |all: &[measure::Tcp]| all[all.len() / 2].gbps;
        println!(
            "| {} | {} | {} | {:.2} | {link} |",
            imp.netem(),
            cell(&tunnel),
            cell(&plain),
            median(&tunnel) / median(&plain)
        );
    }
    Ok(())
}

/// Goodputs in Gbit/s as a table cell: "median (lowest-highest)" in Mbit/s.
fn median_cell(all: &mut [f64]) -> (f64, String) {
    all.sort_by(f64::total_cmp);
    let median = all[all.len() / 2];
    let cell = format!(
        "{:.0} ({:.0}-{:.0})",
        median * 1e3,
        all[0] * 1e3,
        all[all.len() - 1] * 1e3
    );
    (median, cell)
}

/// `cyphonic-bed ha`: see [`Command::Ha`].
fn ha_table(rounds: usize, only: &[String]) -> anyhow::Result<()> {
    use cyphonic_e2e::pair::{Fault, failover_round};
    if let Some(unknown) = only
        .iter()
        .find(|n| !Fault::ALL.iter().any(|f| f.name() == n.as_str()))
    {
        anyhow::bail!(
            "--fault {unknown}: not one of kill, power, uplink, freeze, handover, nothing"
        );
    }
    println!(
        "| fault to the serving box | rounds | longest ping gap, median / worst, ms | pings answered to the end | TCP streams that lived | TCP retransmissions per stream, median / worst |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let chosen = Fault::ALL
        .into_iter()
        .filter(|f| only.is_empty() || only.iter().any(|n| n == f.name()));
    for fault in chosen {
        let (mut gaps, mut retransmits) = (Vec::new(), Vec::new());
        let (mut answered, mut lived) = (0, 0);
        for round in 0..rounds {
            let r = failover_round(fault)?;
            eprintln!(
                "cyphonic-bed ha: {} round {}: pings {:?}, TCP lived {}, retransmissions {:?}",
                fault.describe(),
                round + 1,
                r.pings,
                r.tcp_survived,
                r.retransmits
            );
            if let Some(logs) = &r.logs {
                eprintln!("cyphonic-bed ha: that round broke; its logs:\n{logs}");
            }
            for p in r.pings {
                gaps.push(p.gap.as_secs_f64() * 1000.0);
                answered += usize::from(p.to_the_end());
            }
            lived += usize::from(r.tcp_survived);
            retransmits.extend(r.retransmits);
        }
        retransmits.sort_unstable();
        let resent = match (retransmits.get(retransmits.len() / 2), retransmits.last()) {
            (Some(m), Some(w)) => format!("{m} / {w}"),
            _ => "-".to_owned(),
        };
        gaps.sort_by(f64::total_cmp);
        let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0);
        let worst = gaps.last().copied().unwrap_or(0.0);
        println!(
            "| {} | {rounds} | {median:.0} / {worst:.0} | {answered} of {} | {lived} of {rounds} | {resent} |",
            fault.describe(),
            gaps.len()
        );
    }
    Ok(())
}

/// `cyphonic-bed members`: see [`Command::Members`].
fn members_table(
    counts: &[usize],
    concurrency: usize,
    postgres: bool,
    idle: u64,
) -> anyhow::Result<()> {
    use cyphonic_e2e::members::{MembersBed, MembersOptions};
    println!(
        "| store | members | registered | registrations/s | registration p50 / p99, ms | resolved (failed) | resolutions/s | resolution p50 / p99, ms | cloud RSS before / after, MiB | cloud KiB per member | database, bytes per member | cloud CPU idle, % of a core | driver RSS, MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &members in counts {
        let bed = MembersBed::new(members, postgres)?;
        let f = bed.run(&MembersOptions {
            concurrency,
            idle_seconds: idle,
        })?;
        let mib = |kib: u64| kib as f64 / 1024.0;
        let db = f.database_bytes.map_or_else(
            || "-".to_owned(),
            |b| format!("{:.0}", b as f64 / members.max(1) as f64),
        );
        println!(
            "| {} | {} | {} | {:.0} | {:.1} / {:.1} | {} ({}) | {:.0} | {:.2} / {:.2} | {:.1} / {:.1} | {:.1} | {db} | {:.1} | {:.1} |",
            f.store,
            f.members,
            f.registered,
            f.registrations_per_second(),
            f.register_ms.0,
            f.register_ms.1,
            f.resolved,
            f.resolve_failed,
            f.resolutions_per_second(),
            f.resolve_ms.0,
            f.resolve_ms.1,
            mib(f.cloud_rss_kib.0),
            mib(f.cloud_rss_kib.1),
            f.cloud_kib_per_member(),
            f.idle_cpu_percent,
            mib(f.driver_rss_kib),
        );
    }
    Ok(())
}

/// `cyphonic-bed swarm`: see [`Command::Swarm`].
fn swarm_table(
    counts: &[usize],
    concurrency: usize,
    pings: usize,
    idle: u64,
    leases: usize,
) -> anyhow::Result<()> {
    use cyphonic_e2e::swarm::{SwarmBed, SwarmOptions};
    println!(
        "| peers | leases | registered | up | joined/s | resolve to keys p50 / p99, ms | storm: rekeyed | storm: handshakes/s | storm: ask to keys p50 / p99, ms | pings answered (lost) | RTT mean / p50 / p99, ms | adapter RSS before / after, MiB | adapter bytes per peer | adapter CPU idle, % of a core | adapter: inits, sessions, refused, cookies, queue drops | driver RSS, MiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for &peers in counts {
        let bed = SwarmBed::new(peers, leases)?;
        let f = bed.run(&SwarmOptions {
            concurrency,
            pings,
            idle_seconds: idle,
        })?;
        let mib = |kib: u64| kib as f64 / 1024.0;
        let [inits, sessions, refused, cookies, queue] = f.handshakes;
        if !f.refusal_reasons.is_empty() {
            eprintln!(
                "{peers} peers: the adapter refused handshakes for {}",
                f.refusal_reasons.join(", ")
            );
        }
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.1} / {:.1} | {} | {:.0} | {:.1} / {:.1} | {} ({}) | {:.3} / {:.3} / {:.3} | {:.1} / {:.1} | {:.0} | {:.1} | {inits}, {sessions}, {refused}, {cookies}, {queue} | {:.1} |",
            f.peers,
            f.leases,
            f.registered,
            f.up,
            f.joins_per_second(),
            f.join_ms.0,
            f.join_ms.1,
            f.rekeyed,
            f.handshakes_per_second(),
            f.storm_ms.0,
            f.storm_ms.1,
            f.pings.0,
            f.pings.1,
            f.rtt_ms.0,
            f.rtt_ms.1,
            f.rtt_ms.2,
            mib(f.adapter_rss_kib.0),
            mib(f.adapter_rss_kib.1),
            f.adapter_bytes_per_peer(),
            f.idle_cpu_percent,
            mib(f.driver_rss_kib),
        );
    }
    Ok(())
}

/// `cyphonic-bed node`: see [`Command::Node`].
fn node_table(
    seconds: u64,
    runs: usize,
    baseline: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        node_c: Some(None),
        ..BedOptions::default()
    })?;
    let host = bed.a.host_ip.to_string();
    let config = bed.c.as_ref().context("node C")?.dir.join("node.toml");
    let base = std::fs::read_to_string(&config)?;
    // B's host asks B for A's host by name: adapter B learns adapter A from the cloud.
    resolve(&bed.b.lan, bed.b.gateway, "host.gw1.ovl.example")?;
    measure::ping(&bed, Side::B, bed.a.host_ip, 3, Duration::from_millis(100))?;
    println!(
        "| node's TUN offloads | node -> device, Mbit/s | node's CPU per Gbit/s sent (% of a core) | device -> node | device -> device (through two adapters) | node -> device / device -> device, medians |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    // (row, the node's binary, its [dataplane] table)
    let mut rows = vec![
        (
            "on".to_owned(),
            bed.bins.node.clone(),
            "[dataplane]\ntun_offload = true\n",
        ),
        (
            "off".to_owned(),
            bed.bins.node.clone(),
            "[dataplane]\ntun_offload = false\n",
        ),
    ];
    if let Some(b) = baseline {
        rows.push((format!("the commit before (`{}`)", b.display()), b, ""));
    }
    for (row, binary, dataplane) in rows {
        let mut bins = bed.bins.clone();
        bins.node = binary;
        let c = bed.c.as_mut().context("node C")?;
        if c.proc.is_some() {
            c.stop("TERM")?;
        }
        std::fs::write(&config, format!("{base}\n{dataplane}"))?;
        c.start(&bins)?;
        let c = bed.c.as_ref().context("node C")?;
        let (node_ns, vip) = (&c.ns, c.vip);
        // The name through the node's stub builds the tunnel; a few pings see it up.
        resolve(node_ns, vip, "host.gw1.ovl.example")?;
        ping_line(node_ns, &host, 3)?;
        let lan_a = &bed.a.lan;
        let pid = c.proc.as_ref().context("node C runs")?.pid();
        let (mut out, mut back, mut d2d, mut cpu) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let (ticks, started) = (fleet::cpu_ticks(pid), std::time::Instant::now());
            let gbps = tcp_by_name(lan_a, node_ns, &host, seconds)?;
            let used = (fleet::cpu_ticks(pid) - ticks) as f64 / fleet::ticks_per_second();
            // Cores the node used, per Gbit/s it carried.
            cpu.push(used / started.elapsed().as_secs_f64() / gbps);
            out.push(gbps);
            back.push(tcp_by_name(node_ns, lan_a, &vip.to_string(), seconds)?);
            // From B's host to A's: the same receiving side as the node's runs.
            let r = cyphonic_e2e::bed::iperf3(&bed, Side::A, &[], seconds)?;
            let bps = r["end"]["sum_received"]["bits_per_second"].as_f64();
            d2d.push(bps.context("no bits_per_second")? / 1e9);
        }
        let (out_median, out_cell) = median_cell(&mut out);
        let (_, back_cell) = median_cell(&mut back);
        let (d2d_median, d2d_cell) = median_cell(&mut d2d);
        cpu.sort_by(f64::total_cmp);
        println!(
            "| {row} | {out_cell} | {:.0}% | {back_cell} | {d2d_cell} | {:.2} |",
            cpu[cpu.len() / 2] * 100.0,
            out_median / d2d_median
        );
    }
    Ok(())
}

/// `cyphonic-bed bursts`: see [`Command::Bursts`].
fn bursts(
    seconds: u64,
    rates: &[u64],
    sizes: &[usize],
    opts: &BedOptions,
    busy: usize,
    train: usize,
) -> anyhow::Result<()> {
    let bed = quick_bed(opts, false, None)?;
    measure::warm_up(&bed)?;
    // What every place counted so far, in the table's order.
    let places = |bed: &TwoSites| -> anyhow::Result<[u64; 8]> {
        let (a, b) = (bed.status(Side::A)?, bed.status(Side::B)?);
        // A counter missing from the status is an error, not a zero.
        let n = |s: &serde_json::Value, name: &str| {
            s["counters"][name]
                .as_u64()
                .with_context(|| format!("no counter {name}"))
        };
        Ok([
            n(&a, "icmp_frag_needed")?,
            n(&a, "drop_capture_overflow")?,
            n(&a, "drop_pipeline_full")?,
            n(&a, "drop_no_buffer")?,
            n(&a, "udp_send_failed")?,
            udp_rcvbuf_errors(&bed.b.adapter_ns)?,
            n(&b, "drop_pipeline_full")?,
            udp_rcvbuf_errors(&bed.b.lan)?,
        ])
    };
    println!(
        "| datagram, bytes | offered, Mbit/s | received, Mbit/s | lost | A: frag-needed sent | A: capture socket overflow | A: pipeline full | A: no buffer | A: sends refused | B: UDP socket overflow (kernel) | B: pipeline full | lanB: iperf3 socket overflow (kernel) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &size in sizes {
        // The path MTU exchange first, as its own step: a connected UDP socket (iperf3's)
        // that gets the fragmentation-needed reports EMSGSIZE on its next send, and iperf3
        // quits on it. Pings as large as the datagrams (the same IP length), with DF, let
        // lanA's kernel learn the path's MTU; datagrams over it then leave lanA in fragments.
        let before = places(&bed)?;
        let probe = bed.ping(
            Side::A,
            bed.b.host_ip,
            &[
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "1",
                "-M",
                "want",
                "-s",
                &size.to_string(),
            ],
        )?;
        let after = places(&bed)?;
        println!(
            "| {size} | path MTU exchange: {} fragmentation-needed; ping's 2 requests: {} |  |  |  |  |  |  |  |  |  |  |",
            after[0].saturating_sub(before[0]),
            String::from_utf8_lossy(&probe.stdout)
                .lines()
                .find(|l| l.contains("transmitted"))
                .unwrap_or("no summary")
        );
        for &rate in rates {
            let before = places(&bed)?;
            let u = {
                let _hogs = Hogs::start(busy);
                if train > 0 {
                    measure::udp_trains(&bed, rate, size, seconds, train)?
                } else {
                    measure::udp(&bed, rate, size, seconds)?
                }
            };
            let after = places(&bed)?;
            let counts = after
                .iter()
                .zip(before)
                .map(|(a, b)| a.saturating_sub(b).to_string())
                .collect::<Vec<_>>();
            println!(
                "| {size} | {:.0} | {:.0} | {:.2}% | {} |",
                u.offered_mbps,
                u.received_mbps,
                u.loss_pct,
                counts.join(" | ")
            );
        }
    }
    // How far the bursts reached into adapter A's egress pipeline: the batch buffers it
    // needed at once, and what its in-flight budget refused.
    let egress = &bed.status(Side::A)?["pipelines"]["egress"];
    println!(
        "\nadapter A egress: batch buffers made {}, refused {} (for bytes {}, for time {})",
        egress["batch_buffers"],
        egress["rejected_full"],
        egress["rejected_bytes"],
        egress["rejected_late"]
    );
    Ok(())
}

/// Threads that spin at default priority until dropped: other work on the machine.
struct Hogs {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn start(n: usize) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The kernel's count of UDP datagrams dropped for a full receive buffer in `ns` (IPv4 and
/// IPv6), since the namespace was made.
fn udp_rcvbuf_errors(ns: &cyphonic_e2e::Netns) -> anyhow::Result<u64> {
    let out = ns.exec("nstat", &["-asz", "UdpRcvbufErrors", "Udp6RcvbufErrors"])?;
    let values: Vec<u64> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .collect();
    // Both counters, or the count would be a silent zero.
    anyhow::ensure!(values.len() == 2, "nstat in {}: {out}", ns.name());
    Ok(values.iter().sum())
}

/// What an impaired link did, for a table cell; a fault or an overflow is said, as it
/// would make the row a measurement of the link.
fn link_counts(link: Option<&ImpairedLink>) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(link) = link else {
        return "-".to_owned();
    };
    let s = &link.stats;
    let mut text = format!(
        "{} / {} / {}",
        s.dropped.load(Relaxed),
        s.reordered.load(Relaxed),
        s.forwarded.load(Relaxed)
    );
    for (what, n) in [
        ("overflow", s.overflow.load(Relaxed)),
        ("faults", s.faults.load(Relaxed)),
    ] {
        if n > 0 {
            text.push_str(&format!(", {n} {what}"));
        }
    }
    text
}

/// `cyphonic-bed tune`: see [`Command::Tune`].
fn tune(
    dataplane: &str,
    seconds: u64,
    udp_mbps: u64,
    gro: bool,
    plain: bool,
) -> anyhow::Result<()> {
    let bed = quick_bed(&tuned(dataplane, gro), plain, None)?;
    measure::warm_up(&bed)?;
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
            "  adapter A: egress batches {} (inline {}, buffers {}), ingress batches {} (inline {}, buffers {}), drop_pipeline_full {} (egress for bytes {}, time {}), drop_capture_overflow {}, out of order {}, coalesced frames {} -> segments {} ({} refused)",
            p["egress"]["batches"],
            p["egress"]["inline_batches"],
            p["egress"]["batch_buffers"],
            p["ingress"]["batches"],
            p["ingress"]["inline_batches"],
            p["ingress"]["batch_buffers"],
            s["counters"]["drop_pipeline_full"],
            p["egress"]["rejected_bytes"],
            p["egress"]["rejected_late"],
            s["counters"]["drop_capture_overflow"],
            p["egress"]["out_of_order"],
            s["counters"]["coalesced"],
            s["counters"]["segments"],
            s["counters"]["drop_coalesced"]
        );
        let b = bed.status(Side::B)?;
        println!(
            "  adapter B: merged frames to the LAN {} carrying {} segments, lan_sent {}, lan_send_failed {}, drop_pipeline_full {} (ingress for bytes {}, time {}; buffers {})",
            b["counters"]["lan_merged"],
            b["counters"]["lan_merged_segments"],
            b["counters"]["lan_sent"],
            b["counters"]["lan_send_failed"],
            b["counters"]["drop_pipeline_full"],
            b["pipelines"]["ingress"]["rejected_bytes"],
            b["pipelines"]["ingress"]["rejected_late"],
            b["pipelines"]["ingress"]["batch_buffers"]
        );
    }
    Ok(())
}

/// See `Command::Flood`.
fn flood(seconds: u64, rounds: usize, dataplane: &str, plain: bool) -> anyhow::Result<()> {
    let bed = quick_bed(&tuned(dataplane, false), plain, None)?;
    measure::warm_up(&bed)?;
    println!(
        "{}",
        if plain {
            "plain".to_owned()
        } else {
            format!("tunnel [{dataplane}]")
        }
    );
    // Plain routing has no adapter: its figures read 0.
    let pid = bed.a.adapter.as_ref().map(cyphonic_e2e::Proc::pid);
    let sparse_ticks = || -> anyhow::Result<u64> {
        Ok(match pid {
            // One per CPU by default (`cy-sparse-cap0`, ..), or one.
            Some(pid) => cyphonic_e2e::attack::thread_ticks(pid)?
                .iter()
                .filter(|(name, _)| name.starts_with("cy-sparse-cap"))
                .map(|(_, ticks)| ticks)
                .sum(),
            None => 0,
        })
    };
    let host = bed.b.host_ip.to_string();
    let sparse = |bed: &TwoSites| -> (u64, u64) {
        bed.status(Side::A).map_or((0, 0), |s| {
            (
                s["counters"]["drop_sparse_overflow"].as_u64().unwrap_or(0),
                s["pipelines"]["egress"]["lane"].as_u64().unwrap_or(0),
            )
        })
    };
    for round in 1..=rounds {
        let alone = measure::tcp(&bed, 1, seconds)?;
        println!(
            "round {round}: 1 TCP stream alone {:.2} Gbit/s ({} retransmits)",
            alone.gbps, alone.retransmits
        );
        let (before, ticks) = (sparse(&bed), sparse_ticks()?);
        let server = bed.b.lan.spawn("iperf3", &["-s", "-1", "-p", "53"])?;
        std::thread::sleep(Duration::from_millis(300));
        let secs = (seconds + 3).to_string();
        let flood = bed.a.lan.spawn(
            "iperf3",
            &[
                "-J", "-u", "-c", &host, "-p", "53", "-b", "0", "-l", "64", "-t", &secs,
            ],
        )?;
        std::thread::sleep(Duration::from_secs(1));
        let beside = measure::tcp(&bed, 1, seconds);
        let out = flood.wait(Duration::from_secs(seconds + 20))?;
        drop(server);
        let beside = beside?;
        let (after, ticks) = (sparse(&bed), sparse_ticks()? - ticks);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "iperf3 gave no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let end = &report["end"];
        let sent = end["sum"]["packets"].as_u64().unwrap_or(0);
        let lost = end["sum"]["lost_packets"].as_u64().unwrap_or(0);
        let flood_secs = (seconds + 3) as f64;
        println!(
            "  beside the flood {:.2} Gbit/s ({} retransmits), {:.0}% of alone; the flood: {} datagrams sent ({:.0} a second), {} arrived, {} lost; adapter A's sparse side: {} taken by its lane, {} dropped at its socket; its thread {:.0}% of a core",
            beside.gbps,
            beside.retransmits,
            100.0 * beside.gbps / alone.gbps,
            sent,
            sent as f64 / flood_secs,
            sent.saturating_sub(lost),
            lost,
            after.1 - before.1,
            after.0 - before.0,
            ticks as f64 / flood_secs,
        );
    }
    Ok(())
}

/// See `Command::Latency`.
fn latency(
    dataplane: &str,
    count: usize,
    seconds: u64,
    gro: bool,
    plain: bool,
) -> anyhow::Result<()> {
    let bed = quick_bed(&tuned(dataplane, gro), plain, None)?;
    println!(
        "{}{}",
        if plain {
            "plain".to_owned()
        } else {
            format!("tunnel [{dataplane}]")
        },
        if gro { ", GRO on" } else { ", GRO off" }
    );
    measure::warm_up(&bed)?;
    let line = |phase: &str, p: &measure::PingStats| {
        println!(
            "  {phase}: RTT avg {:.3} p50 {:.3} p99 {:.3} ms ({} of {} answered)",
            p.avg_ms, p.p50_ms, p.p99_ms, p.received, p.sent
        );
    };
    // Each pipeline a ping crosses: the request out of A and into B (behind the stream's
    // data), the reply out of B and into A (behind its acknowledgements).
    type Snapshot = (Vec<(&'static str, measure::Waits)>, u64, u64, u64);
    let snapshot = |bed: &TwoSites| -> anyhow::Result<Option<Snapshot>> {
        if plain {
            return Ok(None);
        }
        let (a, b) = (bed.status(Side::A)?, bed.status(Side::B)?);
        Ok(Some((
            vec![
                ("A egress", measure::Waits::read(&a, "egress")),
                ("B ingress", measure::Waits::read(&b, "ingress")),
                ("B egress", measure::Waits::read(&b, "egress")),
                ("A ingress", measure::Waits::read(&a, "ingress")),
            ],
            a["pipelines"]["egress"]["express"].as_u64().unwrap_or(0),
            a["pipelines"]["egress"]["drops"]["congestion"]
                .as_u64()
                .unwrap_or(0),
            b["pipelines"]["ingress"]["lane"].as_u64().unwrap_or(0),
        )))
    };
    let waits = |before: Option<Snapshot>, after: Option<Snapshot>| {
        let (Some(before), Some(after)) = (before, after) else {
            return;
        };
        println!(
            "    A egress: {} packets by the express lane, {} dropped by the queue manager",
            after.1.saturating_sub(before.1),
            after.2.saturating_sub(before.2)
        );
        println!(
            "    B ingress: {} frames by the sparse socket's lane",
            after.3.saturating_sub(before.3)
        );
        for ((name, b), (_, a)) in before.0.iter().zip(&after.0) {
            let stages = a
                .since(b)
                .summary(0.99)
                .into_iter()
                .map(|(stage, n, mean, p99)| {
                    format!(
                        "{stage} {mean:.0}/{} us ({n})",
                        p99.map_or("-".to_owned(), |v| format!("<{v}"))
                    )
                })
                .collect::<Vec<_>>();
            println!("    {name} waits, mean/p99: {}", stages.join(", "));
        }
    };
    let before = snapshot(&bed)?;
    let idle = measure::idle_pings(&bed, count)?;
    line("idle", &idle);
    waits(before, snapshot(&bed)?);
    for (phase, priority) in [
        ("1 TCP stream, default priority", Priority::Default),
        ("1 TCP stream, idle priority", Priority::Idle),
    ] {
        let before = snapshot(&bed)?;
        let (loaded, stream) = measure::ping_under_load_at(&bed, seconds, priority)?;
        line(phase, &loaded);
        println!(
            "    the stream: {:.2} Gbit/s, {} retransmits",
            stream.gbps, stream.retransmits
        );
        waits(before, snapshot(&bed)?);
    }
    Ok(())
}

/// See `Command::LatencyTable`.
fn latency_table(
    rounds: usize,
    count: usize,
    seconds: u64,
    base: Option<&std::path::Path>,
    settings: &[String],
) -> anyhow::Result<LatencyReport> {
    // Each column, with its `[dataplane]` lines and the daemons it runs (`None`: this build's).
    let column = |name: &str, role| LatencyColumn {
        name: name.into(),
        role,
        rounds: Vec::new(),
    };
    let mut plan = vec![(
        column("plain routing", LatencyRole::Plain),
        String::new(),
        None,
    )];
    if let Some(dir) = base {
        let bins = cyphonic_e2e::hosts::Bins::at(dir)?;
        plan.push((column("base", LatencyRole::Base), String::new(), Some(bins)));
    }
    plan.push((
        column("defaults", LatencyRole::Defaults),
        String::new(),
        None,
    ));
    for s in settings {
        plan.push((column(s, LatencyRole::Setting), s.clone(), None));
    }
    for round in 1..=rounds {
        for (column, dataplane, bins) in &mut plan {
            eprintln!(
                "latency-table: round {round} of {rounds}, {} ...",
                column.name
            );
            let plain = column.role == LatencyRole::Plain;
            let bed = quick_bed(&tuned(dataplane, false), plain, bins.as_ref())?;
            measure::warm_up(&bed)?;
            let idle = measure::idle_pings(&bed, count)?;
            let (loaded, stream) = measure::ping_under_load_at(&bed, seconds, Priority::Default)?;
            let (loaded_idle_ends, stream_idle_ends) =
                measure::ping_under_load_at(&bed, seconds, Priority::Idle)?;
            column.rounds.push(LatencyRound {
                idle,
                loaded,
                stream,
                loaded_idle_ends,
                stream_idle_ends,
            });
        }
    }
    let columns = plan.into_iter().map(|(column, _, _)| column).collect();
    Ok(LatencyReport {
        measured: measured(seconds),
        count,
        columns,
    })
}

/// Prints a report as JSON, for `cargo xtask bench` to render.
fn print_json(report: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(report)?);
    Ok(())
}

fn bench(seconds: u64) -> anyhow::Result<BenchReport> {
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
    let (tunnel, tunnel_out_of_order) = {
        let bed = TwoSites::up(&gro_off)?;
        let r = measure_bed(&bed, seconds)?;
        (r, egress_out_of_order(&bed)?)
    };
    let mut ablation = Vec::new();
    for batch in [32usize, 1] {
        let run = |ordering| {
            eprintln!("bench: ablation, batch_size = {batch}, ordering = {ordering} ...");
            let opts = BedOptions {
                ordering,
                // Every batch through the pool: inline batches never overtake anything, so
                // they would hide what ordering does.
                dataplane_extra: format!("batch_size = {batch}\ninline_max = 0"),
                ..gro_off.clone()
            };
            ablation_run(&opts, seconds)
        };
        ablation.push(AblationRow {
            batch,
            ordered: run(true)?,
            unordered: run(false)?,
        });
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
        let bed = TwoSites::up(&gro_on)?;
        let r = measure_gro(&bed, seconds)?;
        let count = |k: &str| bed.counter(Side::A, k).unwrap_or(0);
        let cut = Cut {
            coalesced: count("coalesced"),
            segments: count("segments"),
            refused: count("drop_coalesced"),
            out_of_order: egress_out_of_order(&bed)?,
        };
        (r, cut)
    };

    let busy = |opts: &BedOptions| -> anyhow::Result<Quick> {
        let bed = TwoSites::up(&BedOptions {
            dataplane_extra: format!("busy_poll_us = {BUSY_POLL_US}"),
            ..opts.clone()
        })?;
        measure_gro(&bed, seconds)
    };
    eprintln!("bench: busy polling, GRO off ...");
    let busy_off = busy(&gro_off)?;
    eprintln!("bench: busy polling, GRO on ...");
    let busy_on = busy(&gro_on)?;
    Ok(BenchReport {
        measured: measured(seconds),
        runs: RUNS,
        udp_size: UDP_SIZE,
        udp_refine: measure::REFINE,
        inner_mtu: INNER_MTU,
        big_rate: BIG_RATE,
        busy_poll_us: BUSY_POLL_US,
        plain,
        tunnel,
        tunnel_out_of_order,
        ablation,
        plain_gro,
        tunnel_gro,
        cut,
        busy_off,
        busy_on,
    })
}

/// The floods of `attack`: initiations a second offered (0: none), from how many addresses
/// that answer B's cookie-replies (0: one forged address that never does), and to which
/// port of B's: its tunnel's, or a closed one (the control of the row before it: the same
/// flood, the same sending, nothing for B to do but drop it).
const ATTACK_FLOODS: [(u32, usize, u16); 5] = [
    (0, 0, 51820),
    (10_000, 0, 51820),
    (50_000, 0, 51820),
    (10_000, 250, 51899),
    (10_000, 250, 51820),
];
/// DHCP DISCOVERs the device on lanB sends a second during each row.
const DHCP_PER_SEC: u64 = 10;

/// Real frames off the bed, as fuzz seeds: each target's directory gets the captures its
/// input is made of.
fn seeds(out: &std::path::Path) -> anyhow::Result<()> {
    use cyphonic_e2e::{attack, inject};
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions::default()),
        ..BedOptions::default()
    })?;
    let control = bed.cloud.as_ref().context("the cloud runs")?.address;
    // A's control handshake and probes, as it reconnects.
    bed.stop(Side::A, "TERM")?;
    let hello = attack::spawn_capture_first_control_frame(
        &bed.wan,
        "toa",
        control.port(),
        Duration::from_secs(10),
    );
    let probes =
        inject::spawn_capture_udp(&bed.wan, "toa", 7001, 2, Duration::from_secs(10), |p| {
            p.get(1) == Some(&6)
        });
    std::thread::sleep(Duration::from_millis(500));
    bed.start(Side::A)?;
    let hello = inject::joined(hello)?;
    let probes = inject::joined(probes)?;
    // The tunnel's frames both ways while a device pings across: initiation, response,
    // keepalives and data.
    let from_a =
        inject::spawn_capture_udp(&bed.wan, "toa", 51820, 8, Duration::from_secs(10), |_| true);
    let from_b =
        inject::spawn_capture_udp(&bed.wan, "tob", 51820, 8, Duration::from_secs(10), |_| true);
    std::thread::sleep(Duration::from_millis(500));
    // A's device asks B's device's name: the cloud pairs the adapters, the tunnel comes up.
    cyphonic_e2e::wait_until(Duration::from_secs(10), "A resolves B's device", || {
        dig(&bed.a.lan, bed.a.gateway, "host.gw2.ovl.example", "A")
            .is_ok_and(|d| !d.answers.is_empty())
    })?;
    bed.ping_ok(
        &bed.a.lan,
        bed.b.host_ip,
        cyphonic_e2e::bed::Ping::count(4).wait(3),
    );
    let mut tunnel = inject::joined(from_a)?;
    tunnel.extend(inject::joined(from_b)?);
    let write = |target: &str, name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let dir = out.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
        Ok(())
    };
    let kind = |f: &[u8]| {
        f.get(1).map_or_else(
            || "empty".to_owned(),
            |t| {
                cyphonic_wire::MessageType::from(*t)
                    .to_string()
                    .replace(' ', "-")
            },
        )
    };
    for (i, f) in tunnel.iter().enumerate() {
        write("wire_frame", &format!("captured-{i:02}-{}", kind(f)), f)?;
        if f.get(1) == Some(&1) {
            write("handshake_init", &format!("captured-{i:02}"), f)?;
        }
    }
    // `ServerHandshake::accept` takes the frame without its length prefix.
    write(
        "control_message",
        "captured-hello",
        hello.get(2..).unwrap_or_default(),
    )?;
    for (i, p) in probes.iter().enumerate() {
        write("control_message", &format!("captured-probe-{i}"), p)?;
    }
    println!(
        "{} tunnel frames, a control hello of {} bytes and {} probes written under {}",
        tunnel.len(),
        hello.len(),
        probes.len(),
        out.display()
    );
    Ok(())
}

fn attack(seconds: u64) -> anyhow::Result<AttackReport> {
    use cyphonic_e2e::{attack, inject};
    use std::net::SocketAddr;
    use std::time::Instant;
    let mut bed = TwoSites::up(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })?;
    let init = attack::capture_initiation(&bed)?;
    let (asker_ns, asker_mac) = bed.add_host(Side::B, "asker")?;
    let asker_mac = cyphonic_e2e::bed::parse_mac(&asker_mac)?;
    let pid = bed.b.adapter.as_ref().context("adapter B runs")?.pid();
    let forged: SocketAddr = "203.0.113.1:0".parse()?;
    let target = bed.b.host_ip.to_string();
    let mut rows = Vec::new();
    // The cookie-answering addresses' initiations carry a hint of their own: they never saw
    // A's (docs/protocol.md §2, known peers first).
    let b_key = attack::static_key(&bed.b.dir.join("gw2.ovl.example.crt"))?;
    let answering_init = attack::with_hint(&init, &b_key, [0x5a; 16])?;
    let mut flooders = Vec::new();
    for (rate, sources, port) in ATTACK_FLOODS {
        eprintln!(
            "bench: attack, {rate} initiations a second from {sources} sources to port {port} ..."
        );
        let to_b = SocketAddr::new(bed.b.underlay, port);
        // Long enough for the settling second, TCP, the pings, and a margin.
        let flood_for = Duration::from_secs(seconds + 6);
        let flood = match (rate, sources) {
            (0, _) => None,
            (_, 0) => Some(inject::spawn_flood_udp(
                &bed.wan,
                forged,
                to_b,
                init.clone(),
                rate,
                flood_for,
            )),
            (_, n) => {
                // One host for every such row (the addresses are set up once).
                if flooders.is_empty() {
                    flooders.push(attack::flooding_host(&bed, n)?);
                }
                let (host, addresses) = &flooders[0];
                let per_source = rate / u32::try_from(n)?;
                let flood = attack::spawn_cookie_answering_flood(
                    host,
                    addresses.clone(),
                    to_b,
                    answering_init.clone(),
                    b_key,
                    per_source,
                    flood_for,
                );
                Some(std::thread::spawn(move || {
                    flood
                        .join()
                        .map_err(|_| anyhow::anyhow!("the flood thread panicked"))?
                        .map(|f| f.sent)
                }))
            }
        };
        // Two seconds: the cookie-answering sources need their cookies first.
        std::thread::sleep(Duration::from_secs(if sources > 0 { 2 } else { 1 }));
        let counter = |name: &str| bed.counter(Side::B, name).unwrap_or(0);
        let (checked0, cookies0, dhcp0) = (
            counter("handshake_inits"),
            counter("cookie_replies_sent"),
            counter("dhcp_sent"),
        );
        let ticks0 = attack::thread_ticks(pid)?;
        let start = Instant::now();
        let stop_asking = std::sync::atomic::AtomicBool::new(false);
        let (tcp, rtt, asked) = std::thread::scope(|s| -> anyhow::Result<_> {
            let asking = s.spawn(|| -> anyhow::Result<u64> {
                let mut asked = 0u64;
                while !stop_asking.load(std::sync::atomic::Ordering::Relaxed) {
                    let msg = cyphonic_vip::testing::client_message(
                        cyphonic_vip::testing::MessageType::Discover,
                        asker_mac,
                        u32::try_from(asked).unwrap_or(0) + 1,
                        vec![],
                        std::net::Ipv4Addr::UNSPECIFIED,
                        true,
                    );
                    let frame = inject::udp_frame(
                        [0xff; 6],
                        asker_mac,
                        std::net::Ipv4Addr::UNSPECIFIED,
                        std::net::Ipv4Addr::BROADCAST,
                        68,
                        67,
                        &msg,
                    );
                    inject::send_frames(&asker_ns, "eth0", vec![frame])?;
                    asked += 1;
                    std::thread::sleep(Duration::from_millis(1000 / DHCP_PER_SEC));
                }
                Ok(asked)
            });
            let tcp = tcp_by_name(&bed.b.lan, &bed.a.lan, &target, seconds);
            let ping = bed
                .a
                .lan
                .exec_output("ping", &["-c", "20", "-i", "0.1", "-W", "2", &target]);
            stop_asking.store(true, std::sync::atomic::Ordering::Relaxed);
            let asked = asking
                .join()
                .map_err(|_| anyhow::anyhow!("the DHCP asker panicked"))??;
            let rtt = measure::parse_ping(&String::from_utf8_lossy(&ping?.stdout), 20);
            Ok((tcp?, rtt, asked))
        })?;
        let elapsed = start.elapsed().as_secs_f64();
        // The last replies are on their way for a moment.
        std::thread::sleep(Duration::from_millis(300));
        let ticks1 = attack::thread_ticks(pid)?;
        let cpu = |name: &str| {
            let used =
                ticks1.get(name).copied().unwrap_or(0) - ticks0.get(name).copied().unwrap_or(0);
            used as f64 / attack::TICKS_PER_SEC / elapsed * 100.0
        };
        let sent = match flood {
            Some(f) => f
                .join()
                .map_err(|_| anyhow::anyhow!("the flood thread panicked"))??,
            None => 0,
        };
        rows.push(AttackRow {
            rate,
            sources: u32::try_from(sources)?,
            closed_port: port != 51820,
            sent,
            tcp_gbps: tcp,
            rtt,
            control_cpu_pct: cpu("control"),
            handshake_cpu_pct: cpu("cy-handshake"),
            receive_cpu_pct: cpu("cy-udp-rx"),
            checked: counter("handshake_inits") - checked0,
            cookie_replies: counter("cookie_replies_sent") - cookies0,
            dhcp_asked: asked,
            dhcp_answered: counter("dhcp_sent") - dhcp0,
        });
    }
    Ok(AttackReport {
        measured: measured(seconds),
        dhcp_per_sec: DHCP_PER_SEC,
        rows,
    })
}

fn measured(seconds: u64) -> Measured {
    Measured {
        date: report::utc_now(),
        machine: format!("{}, Linux {}", report::cpu(), report::kernel()),
        seconds,
    }
}

/// A quick profile: idle RTT, TCP with 1 and 4 streams, RTT under one stream.
fn measure_gro(bed: &TwoSites, seconds: u64) -> anyhow::Result<Quick> {
    measure::warm_up(bed)?;
    let idle = measure::ping(bed, Side::A, bed.b.host_ip, 300, Duration::from_millis(10))?;
    let tcp1 = measure::tcp_median(bed, 1, seconds, RUNS)?;
    let tcp4 = measure::tcp_median(bed, 4, seconds, RUNS)?;
    let loaded = measure::ping_under_load(bed, 5)?;
    Ok(Quick {
        tcp1,
        tcp4,
        idle,
        loaded,
    })
}

/// Many nodes: a fresh bed per fleet size, the cloud and adapter A running.
fn peers(counts: &[usize], seconds: u64) -> anyhow::Result<PeersReport> {
    let mut rows = Vec::new();
    for &n in counts {
        eprintln!("bench: {n} node(s) ...");
        let mut bed = TwoSites::new(&BedOptions {
            cloud: Some(CloudOptions::default()),
            ..BedOptions::default()
        })?;
        bed.start(Side::A)?;
        rows.push(fleet::measure(&bed, n, seconds)?);
    }
    Ok(PeersReport {
        measured: measured(seconds),
        rows,
    })
}
