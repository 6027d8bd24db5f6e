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
    self, Ablation, AblationRow, AttackReport, AttackRow, BenchReport, Cut, FamilyRow, Ipv6Report,
    LatencyColumn, LatencyReport, LatencyRole, LatencyRound, Measured, PeersReport, Profile, Quick,
};
use cyphonic_e2e::{fleet, measure};

mod attack;
mod bench;
mod demo;
mod load;
mod rivals;
mod sched;
mod tables;

use {attack::*, bench::*, demo::*, load::*, rivals::*, tables::*};

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
    /// The packages as shipped: the cloud, an adapter and a node, each from the scratch
    /// root its package was installed into (`cargo xtask test` makes them), run from their
    /// /etc/cyphonic files filled in where they say so, as the service user under their
    /// units: enrollment, renewal and a restart (e2e/src/shipped.rs).
    AsShipped {
        /// The cloud's machine (a scratch root's base: `root/`, `upper/`).
        #[arg(long)]
        cloud: std::path::PathBuf,
        /// The adapter's.
        #[arg(long)]
        adapter: std::path::PathBuf,
        /// The node's.
        #[arg(long)]
        node: std::path::PathBuf,
    },
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
        /// The UDP run's two iperf3 ends at idle priority (`chrt --idle 0`), as if the LAN
        /// hosts were machines of their own.
        #[arg(long)]
        hosts_idle: bool,
        /// Adapter A's capture thread at this nice value for the UDP run (negative: ahead of
        /// the others; needs root).
        #[arg(long, allow_hyphen_values = true)]
        capture_nice: Option<i32>,
        /// Record the scheduler (`perf sched record -a`) into this file while the UDP run
        /// lasts, then say how adapter A's capture thread waited to run and who held the
        /// CPUs meanwhile.
        #[arg(long)]
        sched: Option<std::path::PathBuf>,
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
    /// TCP through the relay over UDP against the relay over TLS (issue 55, docs/protocol.md
    /// §4, *Relay over a stream*): the sites blocked from each other, the pair relayed; one
    /// TCP stream lanA -> lanB with both sides on the channel's UDP port, then with site A's
    /// UDP dropped at the router and its side on the relay's TLS stream; for each loss on
    /// A's link to the router (userspace netem). Prints a Markdown table.
    RelayStream {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Measurements per cell (the median and the range are reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Loss on A's link, percent, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,1")]
        loss: Vec<f64>,
        /// Delay on A's link each way, ms.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
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
    /// (`dataplane.tun_offload`), then without a TUN device (`[userspace]`, as nobody, iperf3
    /// through a forward), the node restarted between; prints a Markdown table.
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
    /// The cloud's HTTP API under load (issue 54): a cloud in this process on loopback over
    /// a registry of `members` (SQLite, or a throwaway PostgreSQL), and 8 keep-alive
    /// connections asking as fast as answers come: the session check alone, the members'
    /// first page, every page. Prints a Markdown table.
    Api {
        /// Members in the registry.
        #[arg(long, default_value_t = 10_000)]
        members: usize,
        /// PostgreSQL instead of SQLite.
        #[arg(long)]
        postgres: bool,
        /// Seconds per endpoint.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// The legacy map's cost end to end (issue 52): TCP with 1 and 4 streams from A's host
    /// to B's, from its own vIP and from a fixed address of a legacy subnet that A maps
    /// (a macvlan of its own MAC in the same namespace), alternating, `rounds` times each;
    /// one line per run on stderr, the medians and their ratios as a Markdown table.
    Legacy {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Rounds (each: from the vIP, then from the fixed address).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
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
    /// SIGHUP on both adapters of one bed, `rounds` times each; one line per run on stderr,
    /// the medians and their ratios as a Markdown table.
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
    /// and reaches the other site; then from a card with only an enrollment token and the
    /// cloud, with which it enrolls (`cargo xtask image --check`).
    ImageCheck {
        /// The image file.
        #[arg(long)]
        image: std::path::PathBuf,
        /// The image's update bundle: then also an update to it sticks, and one whose
        /// adapter cannot start (made from it) rolls back (e2e/src/image/update.rs).
        #[arg(long, requires_all = ["bundle_key", "bundle_cert"])]
        bundle: Option<std::path::PathBuf>,
        /// The key that signed the bundle (PEM), to sign the bad one.
        #[arg(long)]
        bundle_key: Option<std::path::PathBuf>,
        /// Its certificate (PEM).
        #[arg(long)]
        bundle_cert: Option<std::path::PathBuf>,
    },
    /// Boots an arm64 machine (a kernel and the initramfs `cargo xtask test` makes around
    /// the adapter's aarch64 build) under qemu-system-aarch64 as one site of the bed and
    /// checks that its adapter leases an address to a device and carries its name lookup,
    /// pings and a TCP transfer to the other site (e2e/src/vm.rs).
    VmCheck {
        /// The arm64 kernel.
        #[arg(long)]
        kernel: std::path::PathBuf,
        /// The machine's base initramfs (the site's files are added to it).
        #[arg(long)]
        initramfs: std::path::PathBuf,
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
    /// TCP over IPv4 and over IPv6 between the two LAN hosts through one tunnel (SLAAC
    /// addresses, GRO on), 1 and 4 streams, the families alternating; prints JSON.
    Ipv6 {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// The tunnel beside other tunnels on the same bed: plain routing, wireguard-go,
    /// boringtun with 1 and 4 threads, nebula and cyphonic carry lanA's traffic to lanB in
    /// turn, round after round (TCP with 1 and 4 streams, the UDP rate lost under 1%, gateway
    /// A's CPU per Gbit/s); prints a table of medians. The rivals' programs are in
    /// `$CYPHONIC_RIVALS_DIR` (`cargo xtask bench --table rivals` installs them).
    Rivals {
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Rounds, each carrier once per round.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// GRO on on the gateways' LAN side; without it, the GRO-off profile.
        #[arg(long)]
        gro: bool,
        /// Only these carriers beside cyphonic, by their names in the table (repeatable).
        #[arg(long)]
        only: Vec<String>,
        /// Sample the whole machine with `perf record -a -g` during each one-stream run,
        /// into a file per carrier, profile and round in this directory.
        #[arg(long)]
        perf: Option<std::path::PathBuf>,
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
        Command::AsShipped {
            cloud,
            adapter,
            node,
        } => as_shipped(&cloud, &adapter, &node),
        Command::Seeds { out } => seeds(&out),
        Command::Bench { seconds } => bench(seconds).and_then(|r| print_json(&r)),
        Command::Attack { seconds } => attack(seconds).and_then(|r| print_json(&r)),
        Command::Rivals {
            seconds,
            rounds,
            gro,
            only,
            perf,
        } => rivals_table(seconds, rounds, gro, &only, perf.as_deref()),
        Command::Peers { counts, seconds } => peers(&counts, seconds).and_then(|r| print_json(&r)),
        Command::Ipv6 { seconds } => ipv6(seconds).and_then(|r| print_json(&r)),
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
        Command::ImageCheck {
            image,
            bundle,
            bundle_key,
            bundle_cert,
        } => cyphonic_e2e::image::boot_check(&image).and_then(|(files, token)| {
            println!(
                "image check passed: the adapter was up {:.1} s after power-on from the card's files, {:.1} s from a token it enrolled with",
                files.as_secs_f64(),
                token.as_secs_f64()
            );
            let (Some(bundle), Some(key), Some(cert)) = (bundle, bundle_key, bundle_cert) else {
                return Ok(());
            };
            let signer = cyphonic_e2e::image::update::Signer { key, cert };
            let u = cyphonic_e2e::image::update::update_check(&image, &bundle, &signer)?;
            println!(
                "update check passed: the bundle copied and installed in {:.1} s; slot B kept {:.1} s after the reboot, and kept at the next; a bad bundle rolled back to B {:.1} s after its reboot",
                u.install.as_secs_f64(),
                u.kept.as_secs_f64(),
                u.rolled_back.as_secs_f64()
            );
            let kept = cyphonic_e2e::image::update::static_update_check(&image, &bundle)?;
            println!(
                "update check without a cloud passed: slot B kept {:.1} s after the reboot, with no traffic during its trial",
                kept.as_secs_f64()
            );
            Ok(())
        }),
        Command::VmCheck { kernel, initramfs } => {
            cyphonic_e2e::vm::adapter_check(&kernel, &initramfs).map(|up| {
                println!(
                    "arm64 machine check passed: its adapter captured the LAN {:.1} s after power-on; a lease, a name, 5 pings and 4 MiB over TCP to the other site",
                    up.as_secs_f64()
                );
            })
        }
        Command::Tune {
            dataplane,
            seconds,
            udp,
            gro,
            plain,
            hosts_idle,
            capture_nice,
            sched,
        } => tune(
            &dataplane,
            seconds,
            udp,
            (gro, plain),
            &UdpLook {
                hosts_idle,
                capture_nice,
                sched,
            },
        ),
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
        Command::RelayStream {
            seconds,
            runs,
            loss,
            delay_ms,
        } => relay_stream_table(seconds, runs, &loss, Duration::from_millis(delay_ms)),
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
        Command::Api {
            members,
            postgres,
            seconds,
        } => api_table(members, postgres, seconds),
        Command::Swarm {
            counts,
            concurrency,
            pings,
            idle,
            leases,
        } => swarm_table(&counts, concurrency, pings, idle, leases),
        Command::Ha { rounds, fault } => ha_table(rounds, &fault),
        Command::Legacy { seconds, rounds } => legacy_cost(seconds, rounds),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cyphonic-bed: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a report as JSON, for `cargo xtask bench` to render.
fn print_json(report: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(report)?);
    Ok(())
}

/// `as-shipped`: the three machines, checked (e2e/src/shipped.rs).
fn as_shipped(
    cloud: &std::path::Path,
    adapter: &std::path::Path,
    node: &std::path::Path,
) -> anyhow::Result<()> {
    use cyphonic_e2e::shipped::{Machine, run};
    run(
        &Machine::at(cloud, "cyphonic-cloud")?,
        &Machine::at(adapter, "cyphonic-adapter")?,
        &Machine::at(node, "cyphonic-node")?,
    )
}
