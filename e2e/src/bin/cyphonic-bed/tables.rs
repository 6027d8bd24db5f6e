//! The tables of one question each: the policy's cost, impairments, the HA pair's
//! failovers, many members, a swarm of peers, the node.

use super::*;

/// `[policy]` with `rules` rules: `rules - 1` that allow nothing on the bed (other
/// addresses), then the one that lets A's block open anything to B's, and `flows` room.
pub(crate) fn policy_table(rules: usize, flows: usize) -> String {
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

/// `cyphonic-bed legacy`: see [`Command::Legacy`].
pub(crate) fn legacy_cost(seconds: u64, rounds: usize) -> anyhow::Result<()> {
    const MAC: &str = "02:00:5e:10:0a:14";
    let fixed = std::net::Ipv4Addr::new(192, 0, 2, 20);
    let mut opts = BedOptions::default();
    opts.a.extra = format!(
        "\n[dhcp]\npool = \"100.64.1.100-100.64.1.199\"\n\n[legacy]\nsubnet = \"192.0.2.16/28\"\nonto = \"100.64.1.224/28\"\ngateway = \"192.0.2.17\"\n\n[[legacy.device]]\nname = \"plc\"\nmac = \"{MAC}\"\naddress = \"{fixed}\"\n"
    );
    let mut bed = TwoSites::new(&opts)?;
    // The fixed address on a macvlan of its own MAC, its packets routed by their source.
    let ns = &bed.a.lan;
    ns.ip(&[
        "link", "add", "plc0", "link", "eth0", "type", "macvlan", "mode", "bridge",
    ])?;
    ns.ip(&["link", "set", "plc0", "address", MAC])?;
    ns.ip(&["addr", "add", "192.0.2.20/28", "dev", "plc0"])?;
    ns.ip(&["link", "set", "plc0", "up"])?;
    if opts.wire_like_lan {
        ns.exec("ethtool", &["-K", "plc0", "tso", "off", "gso", "off"])?;
    }
    ns.ip(&["rule", "add", "from", "192.0.2.20", "table", "100"])?;
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "192.0.2.17",
        "dev",
        "plc0",
        "table",
        "100",
    ])?;
    bed.start(Side::A)?;
    bed.start(Side::B)?;
    measure::warm_up(&bed)?;
    let (mut plain, mut mapped) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (label, from, into) in [
            ("vIP", None, &mut plain),
            ("fixed", Some(fixed), &mut mapped),
        ] {
            let t = (
                measure::tcp_from(&bed, 1, seconds, from)?,
                measure::tcp_from(&bed, 4, seconds, from)?,
            );
            eprintln!(
                "round {round} from the {label} address: TCP1 {:.2} Gbit/s ({} retr) | TCP4 {:.2} Gbit/s ({} retr)",
                t.0.gbps, t.0.retransmits, t.1.gbps, t.1.retransmits
            );
            into.push(t);
        }
    }
    let s = bed.status(Side::A)?;
    let spoofed = s["counters"]["drop_spoofed"]
        .as_u64()
        .context("no drop_spoofed")?;
    anyhow::ensure!(
        spoofed == 0,
        "A dropped {spoofed} frames as spoofed: the bed is wrong"
    );
    print_ratios(&plain, &mapped, "from the vIP", "from the fixed address");
    Ok(())
}

/// Prints, as a Markdown table, the medians of two sets of (TCP1, TCP4) measurements and
/// their ratio (the rounds went to stderr as they ran).
fn print_ratios(
    before: &[(measure::Tcp, measure::Tcp)],
    after: &[(measure::Tcp, measure::Tcp)],
    was: &str,
    is: &str,
) {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    println!(
        "| {} rounds, medians | {was} | {is} | ratio |",
        before.len().min(after.len())
    );
    println!("|---|---:|---:|---:|");
    for (label, pick) in [
        (
            "TCP, 1 stream",
            (|t: &(measure::Tcp, measure::Tcp)| t.0.gbps) as fn(&_) -> f64,
        ),
        ("TCP, 4 streams", |t| t.1.gbps),
    ] {
        let (mut a, mut b): (Vec<f64>, Vec<f64>) = (
            before.iter().map(pick).collect(),
            after.iter().map(pick).collect(),
        );
        let (a, b) = (median(&mut a), median(&mut b));
        println!(
            "| {label} | {a:.2} Gbit/s | {b:.2} Gbit/s | {:.0}% |",
            100.0 * b / a
        );
    }
}

/// `cyphonic-bed policy`: see [`Command::Policy`].
pub(crate) fn policy_cost(
    rules: usize,
    flows: u16,
    seconds: u64,
    rounds: usize,
) -> anyhow::Result<()> {
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
        eprintln!(
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
        eprintln!(
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
    print_ratios(
        &off,
        &on,
        "without policy",
        &format!("with {rules} rules and {flows} flows"),
    );
    Ok(())
}

/// The bed of `tune` and `latency`: `dataplane` lines (`;`-separated) for both adapters'
/// `[dataplane]`, GRO on the gateways' LAN side or not.
pub(crate) fn tuned(dataplane: &str, gro: bool) -> BedOptions {
    BedOptions {
        dataplane_extra: dataplane.replace(';', "\n"),
        lan_gro: gro,
        ..BedOptions::default()
    }
}

/// A bed of `opts` routed plainly, or with both adapters running: `daemons`' when given
/// (an earlier build's), else the bed's own.
pub(crate) fn quick_bed(
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
pub(crate) fn impairments() -> [Impairment; 5] {
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
pub(crate) fn impairment_table(seconds: u64, runs: usize) -> anyhow::Result<()> {
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

/// `cyphonic-bed relay-stream`: see [`Command::RelayStream`].
pub(crate) fn relay_stream_table(
    seconds: u64,
    runs: usize,
    losses: &[f64],
    delay: Duration,
) -> anyhow::Result<()> {
    println!(
        "| A's link (netem terms) | TCP through the relay, both sides on UDP: Mbit/s, median (range) | A's side over TLS, the same | TLS / UDP, medians |"
    );
    println!("|---|---:|---:|---:|");
    for loss in losses {
        let opts = BedOptions {
            cloud: Some(CloudOptions {
                relay_stream: true,
                ..CloudOptions::default()
            }),
            block_direct: true,
            a: SiteOptions {
                impair: Some(Impairment {
                    loss: loss / 100.0,
                    delay,
                    ..Impairment::NONE
                }),
                ..SiteOptions::default()
            },
            ..BedOptions::default()
        };
        let bed = quick_bed(&opts, false, None)?;
        bed.resolve(
            &bed.a.lan,
            std::net::Ipv4Addr::new(100, 64, 1, 1),
            "host.gw2.ovl.example",
        );
        // A's peer relayed, established, its side over the stream (`over`) or not.
        let relayed = |over: bool| {
            cyphonic_e2e::wait_until(Duration::from_secs(60), "the pair relayed", || {
                bed.status(Side::A).is_ok_and(|s| {
                    let p = &s["peers"][0];
                    p["route"] == "relay"
                        && p["established"] == true
                        && p["relay"]["stream"].is_null() != over
                })
            })
            .with_context(|| bed.logs())
        };
        let runs_of = || -> anyhow::Result<Vec<f64>> {
            measure::warm_up(&bed)?;
            let mut all = Vec::new();
            for _ in 0..runs.max(1) {
                let t = measure::tcp(&bed, 1, seconds)?;
                eprintln!(
                    "cyphonic-bed relay-stream: loss {loss}%: {:.0} Mbit/s, {} retransmits",
                    t.gbps * 1e3,
                    t.retransmits
                );
                all.push(t.gbps);
            }
            Ok(all)
        };
        relayed(false)?;
        let mut udp = runs_of()?;
        bed.block_udp(Side::A, true)?;
        relayed(true)?;
        let mut tls = runs_of()?;
        let (udp_median, udp_cell) = median_cell(&mut udp);
        let (tls_median, tls_cell) = median_cell(&mut tls);
        let link = Impairment {
            loss: loss / 100.0,
            delay,
            ..Impairment::NONE
        };
        println!(
            "| {} | {udp_cell} | {tls_cell} | {:.2} |",
            link.netem(),
            tls_median / udp_median
        );
    }
    Ok(())
}

/// Goodputs in Gbit/s as a table cell: "median (lowest-highest)" in Mbit/s.
pub(crate) fn median_cell(all: &mut [f64]) -> (f64, String) {
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
pub(crate) fn ha_table(rounds: usize, only: &[String]) -> anyhow::Result<()> {
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
pub(crate) fn members_table(
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
pub(crate) fn swarm_table(
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
/// The node's `[userspace]` table in [`node_table`]: a forward to host A's iperf3 port.
const USERSPACE: &str = "[userspace]\n[[userspace.forward]]\nlisten = \"127.0.0.1:15201\"\nto = \"host.gw1.ovl.example:5201\"\n";

pub(crate) fn node_table(
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
        "| node's TUN offloads (or no TUN) | node -> device, Mbit/s | node's CPU per Gbit/s sent (% of a core) | device -> node | device -> device (through two adapters) | node -> device / device -> device, medians |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    // (row, the node's binary, its [dataplane] or [userspace] table)
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
        (
            "no TUN: `[userspace]`, as nobody, through a forward (back: `-R`)".to_owned(),
            bed.bins.node.clone(),
            USERSPACE,
        ),
    ];
    if let Some(b) = baseline {
        rows.push((format!("the commit before (`{}`)", b.display()), b, ""));
    }
    for (row, binary, table) in rows {
        let mut bins = bed.bins.clone();
        bins.node = binary;
        let c = bed.c.as_mut().context("node C")?;
        if c.proc.is_some() {
            c.stop("TERM")?;
        }
        std::fs::write(&config, format!("{base}\n{table}"))?;
        let userspace = table == USERSPACE;
        if userspace {
            c.start_unprivileged(&bins)?;
        } else {
            c.start(&bins)?;
        }
        let c = bed.c.as_ref().context("node C")?;
        let (node_ns, vip) = (&c.ns, c.vip);
        let lan_a = &bed.a.lan;
        if userspace {
            // The forward asks the stub for the name, which builds the tunnel.
            tcp_with(lan_a, node_ns, "127.0.0.1", 1, &["-p", "15201"])?;
        } else {
            // The name through the node's stub builds the tunnel; a few pings see it up.
            resolve(node_ns, vip, "host.gw1.ovl.example")?;
            ping_line(node_ns, &host, 3)?;
        }
        let pid = c.proc.as_ref().context("node C runs")?.pid();
        let (mut out, mut back, mut d2d, mut cpu) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let (ticks, started) = (fleet::cpu_ticks(pid), std::time::Instant::now());
            let gbps = if userspace {
                tcp_with(lan_a, node_ns, "127.0.0.1", seconds, &["-p", "15201"])?
            } else {
                tcp_by_name(lan_a, node_ns, &host, seconds)?
            };
            let used = (fleet::cpu_ticks(pid) - ticks) as f64 / fleet::ticks_per_second();
            // Cores the node used, per Gbit/s it carried.
            cpu.push(used / started.elapsed().as_secs_f64() / gbps);
            out.push(gbps);
            back.push(if userspace {
                tcp_with(lan_a, node_ns, "127.0.0.1", seconds, &["-p", "15201", "-R"])?
            } else {
                tcp_by_name(node_ns, lan_a, &vip.to_string(), seconds)?
            });
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

/// `cyphonic-bed api`: see [`Command::Api`].
pub(crate) fn api_table(members: usize, postgres: bool, seconds: u64) -> anyhow::Result<()> {
    let store = if postgres { "postgresql" } else { "sqlite" };
    println!(
        "| store | members | asked | requests/s | per request (walk: per walk), p50 / p99 ms | answered (refused) | body, bytes |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for r in cyphonic_e2e::apiload::run(members, postgres, seconds)? {
        println!(
            "| {store} | {members} | {} | {:.0} | {:.2} / {:.2} | {} ({}) | {} |",
            r.what, r.per_sec, r.p50_ms, r.p99_ms, r.answered, r.refused, r.body_bytes
        );
    }
    Ok(())
}
