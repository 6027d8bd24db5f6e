//! docs/benchmarks.md's end-to-end tables, rendered from what `cyphonic-bed bench` and
//! `cyphonic-bed peers` measured (their JSON reports, `cyphonic_report`): the bed takes
//! the figures, the words and tables around them are written here.

use std::fmt::Write as _;

use cyphonic_report::{
    AttackReport, BenchReport, Ipv6Report, LatencyColumn, LatencyReport, LatencyRole, LatencyRound,
    PeersReport, PingStats, Quick, Tcp, Udp,
};

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.0}%", 100.0 * a / b)
    } else {
        "-".into()
    }
}

/// `cyphonic-bed ipv6`'s report as Markdown.
pub(crate) fn ipv6(r: &Ipv6Report) -> Result<String, std::fmt::Error> {
    let m = &r.measured;
    let mut md = String::new();
    writeln!(
        md,
        "Measured {} on {}. The two-site bed with IPv6 (release build, GRO on: the defaults); lanA's host runs iperf3 TCP to lanB's for {} s, to its IPv4 address and to its SLAAC address in turn, three runs of each, the median shown. IPv4 segments carry an MSS clamped to 1380, IPv6 ones 1360 (the advertised MTU, 1420, less 60).",
        m.date, m.machine, m.seconds
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| streams | IPv4 (Gbit/s) | IPv6 (Gbit/s) | IPv6 / IPv4 | retransmits IPv4 / IPv6 |"
    )?;
    writeln!(md, "|---:|---:|---:|---:|---:|")?;
    for row in &r.rows {
        writeln!(
            md,
            "| {} | {:.2} | {:.2} | {} | {} / {} |",
            row.streams,
            row.v4.gbps,
            row.v6.gbps,
            ratio(row.v6.gbps, row.v4.gbps),
            row.v4.retransmits,
            row.v6.retransmits
        )?;
    }
    writeln!(md)?;
    writeln!(
        md,
        "Frames adapter B handed its LAN merged for the kernel to cut (GSO): {} during the IPv4 runs, {} during the IPv6 ones.",
        r.merged.0, r.merged.1
    )?;
    Ok(md)
}

/// `cyphonic-bed bench`'s report as Markdown.
pub(crate) fn bench(r: &BenchReport) -> Result<String, std::fmt::Error> {
    let (plain, tunnel) = (&r.plain, &r.tunnel);
    let m = &r.measured;
    let mut md = String::new();
    writeln!(
        md,
        "Measured {} on {}. All five hosts share the machine's cores. Profile: LAN hosts wire-like (TSO and GSO off on their veth, transmit checksum offload on), GRO off on the gateways' LAN side; adapters at their defaults (one crypto worker per core each); release build; TCP figures are medians of {} runs of {} s; UDP rates 3 s each, {}-byte datagrams, 2 MiB UDP socket buffers.",
        m.date, m.machine, r.runs, m.seconds, r.udp_size
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
    let udp_cell = |u: Option<&Udp>| {
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
    let lossless = |u: Option<&Udp>| u.map_or(0.0, |u| u.received_mbps);
    writeln!(
        md,
        "| UDP, most received with < 1% loss (Mbit/s; loss; out-of-order) | {} | {} | {} |",
        udp_cell(plain.udp.as_ref()),
        udp_cell(tunnel.udp.as_ref()),
        ratio(lossless(tunnel.udp.as_ref()), lossless(plain.udp.as_ref()))
    )?;
    writeln!(
        md,
        "| UDP offered as fast as iperf3 sends (-b 0): received (Mbit/s; loss) | {:.0}; {:.1}% | {:.0}; {:.1}% | {} of plain, {} of its own lossless rate |",
        plain.overload.received_mbps,
        plain.overload.loss_pct,
        tunnel.overload.received_mbps,
        tunnel.overload.loss_pct,
        ratio(tunnel.overload.received_mbps, plain.overload.received_mbps),
        ratio(tunnel.overload.received_mbps, lossless(tunnel.udp.as_ref())),
    )?;
    writeln!(
        md,
        "| UDP, 1400-byte datagrams fragmented by the LAN host (MTU {}), {} Mbit/s offered (received; loss; out-of-order) | {} | {} | {} |",
        r.inner_mtu,
        r.big_rate,
        udp_cell(Some(&plain.big)),
        udp_cell(Some(&tunnel.big)),
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
        r.udp_refine,
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
    for row in &r.ablation {
        let (o, u, batch) = (&row.ordered, &row.unordered, row.batch);
        writeln!(
            md,
            "| batch {batch}, 1 stream | {:.2} ({}) | {:.2} ({}) | {} | {} / {} |",
            o.tcp1.gbps,
            o.tcp1.retransmits,
            u.tcp1.gbps,
            u.tcp1.retransmits,
            ratio(u.tcp1.gbps, o.tcp1.gbps),
            o.out_of_order,
            u.out_of_order
        )?;
        writeln!(
            md,
            "| batch {batch}, 4 streams | {:.2} ({}) | {:.2} ({}) | {} | |",
            o.tcp4.gbps,
            o.tcp4.retransmits,
            u.tcp4.gbps,
            u.tcp4.retransmits,
            ratio(u.tcp4.gbps, o.tcp4.gbps)
        )?;
    }
    writeln!(md)?;
    writeln!(
        md,
        "Out-of-order packets emitted by adapter A's egress pipeline during the main tunnel runs: {}.",
        r.tunnel_out_of_order
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
    let (pg, tg) = (&r.plain_gro, &r.tunnel_gro);
    tcp_rows(&mut md, (pg.tcp1, pg.tcp4), (tg.tcp1, tg.tcp4))?;
    ping_rows(&mut md, (&pg.idle, &pg.loaded), (&tg.idle, &tg.loaded))?;
    writeln!(md)?;
    let c = &r.cut;
    #[expect(clippy::cast_precision_loss, reason = "a ratio of counts")]
    let per_frame = if c.coalesced > 0 {
        c.segments as f64 / c.coalesced as f64
    } else {
        0.0
    };
    writeln!(
        md,
        "Adapter A in the GRO-on runs: {} coalesced frames cut into {} segments ({per_frame:.1} per frame), {} refused, {} packets emitted out of order.",
        c.coalesced, c.segments, c.refused, c.out_of_order
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "Busy polling: the tunnel again in both profiles with `busy_poll_us = {}` (off by default): the receiving threads keep polling their sockets, yielding the CPU between polls, for {} ms after each packet instead of sleeping until the kernel wakes them. Added idle RTT against plain routing in the same profile.",
        r.busy_poll_us,
        r.busy_poll_us / 1000
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| lanA -> lanB | GRO off, defaults | GRO off, busy polling | GRO on, defaults | GRO on, busy polling |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|")?;
    let defaults_off = Quick {
        tcp1: tunnel.tcp1,
        tcp4: tunnel.tcp4,
        idle: tunnel.idle,
        loaded: tunnel.loaded,
    };
    let columns = [
        (&defaults_off, &plain.idle),
        (&r.busy_off, &plain.idle),
        (tg, &pg.idle),
        (&r.busy_on, &pg.idle),
    ];
    let row = |md: &mut String, label: &str, cell: &dyn Fn(&Quick, &PingStats) -> String| {
        let cells: Vec<String> = columns.iter().map(|(q, p)| cell(q, p)).collect();
        writeln!(md, "| {label} | {} |", cells.join(" | "))
    };
    row(&mut md, "TCP, 1 stream (Gbit/s; retransmits)", &|q, _| {
        format!("{:.2}; {}", q.tcp1.gbps, q.tcp1.retransmits)
    })?;
    row(&mut md, "TCP, 4 streams (Gbit/s; retransmits)", &|q, _| {
        format!("{:.2}; {}", q.tcp4.gbps, q.tcp4.retransmits)
    })?;
    row(&mut md, "ping RTT idle, average / p99 (ms)", &|q, _| {
        format!("{:.3} / {:.3}", q.idle.avg_ms, q.idle.p99_ms)
    })?;
    row(
        &mut md,
        "idle RTT added to plain routing's, average / p99 (ms)",
        &|q, p| {
            format!(
                "{:.3} / {:.3}",
                q.idle.avg_ms - p.avg_ms,
                q.idle.p99_ms - p.p99_ms
            )
        },
    )?;
    row(
        &mut md,
        "ping RTT while 1 TCP stream runs, average / p99 (ms)",
        &|q, _| format!("{:.3} / {:.3}", q.loaded.avg_ms, q.loaded.p99_ms),
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

/// `cyphonic-bed peers`'s report as Markdown.
pub(crate) fn peers(r: &PeersReport) -> Result<String, std::fmt::Error> {
    let m = &r.measured;
    let mut md = String::new();
    writeln!(
        md,
        "Measured {} on {}. Every node, the adapter, the router, the cloud and the LAN host share the machine's cores; release build; each node resolves the LAN host's name through its DNS stub (which builds its tunnel through the cloud), then node 0 pings the host 300 times 10 ms apart with every tunnel up, then every node runs iperf3 TCP to the host at once for {} s.",
        m.date, m.machine, m.seconds
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| nodes | tunnels at adapter A | RTT node 0 -> host, average / p99 (ms) | TCP, all nodes at once (Gbit/s) | slowest node (Mbit/s) | CPU during TCP, adapter A / all nodes (% of a core) | adapter A RSS (MiB) | adapter A threads |"
    )?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for f in &r.rows {
        #[expect(clippy::cast_precision_loss, reason = "KiB to MiB for a table")]
        let rss = f.adapter_rss_kib as f64 / 1024.0;
        writeln!(
            md,
            "| {} | {} | {:.3} / {:.3} | {:.2} | {:.0} | {:.0} / {:.0} | {rss:.1} | {} |",
            f.nodes,
            f.adapter_peers,
            f.rtt.avg_ms,
            f.rtt.p99_ms,
            f.aggregate_gbps,
            f.slowest_gbps * 1e3,
            f.adapter_cpu_pct,
            f.nodes_cpu_pct,
            f.adapter_threads
        )?;
    }
    Ok(md)
}

/// Issue 24's latency rows (`cyphonic-bed latency-table`): every round of every column,
/// then the rows read from the means of the rounds.
pub(crate) fn latency(r: &LatencyReport) -> Result<String, std::fmt::Error> {
    let m = &r.measured;
    let mut md = String::new();
    let order = r
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    writeln!(
        md,
        "Measured {} on {}. The two-site bed, GRO off, release builds, every host on the machine's cores. Each round runs every column once, in this order: {order}. Per column and round: {} pings 10 ms apart idle, then {} while one iperf3 TCP stream runs from lanA to lanB with its two ends at default priority, then {} with its ends at idle priority (`chrt --idle 0`, as if they were machines of their own). Cells: average / p99 in ms, one per round.",
        m.date,
        m.machine,
        r.count,
        m.seconds * 100,
        m.seconds * 100
    )?;
    writeln!(md)?;
    write!(md, "| RTT, ms |")?;
    for c in &r.columns {
        write!(md, " {} |", c.name)?;
    }
    writeln!(md)?;
    writeln!(md, "|---|{}", "---:|".repeat(r.columns.len()))?;
    type Cell = fn(&LatencyRound) -> String;
    let rows: [(&str, Cell); 4] = [
        ("idle", |x| ping_cell(&x.idle)),
        ("1 TCP stream, ends at default priority", |x| {
            ping_cell(&x.loaded)
        }),
        ("1 TCP stream, ends at idle priority", |x| {
            ping_cell(&x.loaded_idle_ends)
        }),
        (
            "the stream meanwhile, Gbit/s (default / idle priority)",
            |x| format!("{:.2} / {:.2}", x.stream.gbps, x.stream_idle_ends.gbps),
        ),
    ];
    for (name, cell) in rows {
        write!(md, "| {name} |")?;
        for c in &r.columns {
            let cells = c.rounds.iter().map(cell).collect::<Vec<_>>();
            write!(md, " {} |", cells.join("; "))?;
        }
        writeln!(md)?;
    }
    writeln!(md)?;
    let find = |role: LatencyRole| r.columns.iter().find(|c| c.role == role);
    let plain = find(LatencyRole::Plain);
    let base = find(LatencyRole::Base);
    writeln!(md, "Issue 24's rows, from the means of the rounds:")?;
    writeln!(md)?;
    for c in r.columns.iter().filter(|c| c.role != LatencyRole::Plain) {
        let idle_avg = mean(c, |x| x.idle.avg_ms);
        let idle_p99 = mean(c, |x| x.idle.p99_ms);
        let mut parts = Vec::new();
        if let Some(p) = plain {
            parts.push(format!(
                "idle RTT added to plain routing's {:.3} ms on average (target 0.15) and {:.3} ms at the p99 (target 0.5)",
                idle_avg - mean(p, |x| x.idle.avg_ms),
                idle_p99 - mean(p, |x| x.idle.p99_ms)
            ));
        }
        // The base is measured against, not against itself.
        let against = base.filter(|_| c.role != LatencyRole::Base);
        let loaded_p99 = mean(c, |x| x.loaded.p99_ms);
        match against {
            Some(b) => parts.push(format!(
                "p99 under the stream {loaded_p99:.2} ms, the base's / this = {:.1}x (target 2x)",
                mean(b, |x| x.loaded.p99_ms) / loaded_p99
            )),
            None => parts.push(format!("p99 under the stream {loaded_p99:.2} ms")),
        }
        parts.push(format!(
            "with the ends at idle priority {:.2} ms above the idle p99 (target 1 ms)",
            mean(c, |x| x.loaded_idle_ends.p99_ms) - idle_p99
        ));
        let stream = mean(c, |x| x.stream.gbps);
        match against {
            Some(b) => parts.push(format!(
                "the stream {stream:.2} Gbit/s, {} of the base's",
                ratio(stream, mean(b, |x| x.stream.gbps))
            )),
            None => parts.push(format!("the stream {stream:.2} Gbit/s")),
        }
        writeln!(md, "- {}: {}.", c.name, parts.join("; "))?;
    }
    Ok(md)
}

/// A ping run's average and p99, ms.
fn ping_cell(p: &PingStats) -> String {
    format!("{:.3} / {:.3}", p.avg_ms, p.p99_ms)
}

/// The mean over a column's rounds of one figure.
fn mean(c: &LatencyColumn, f: impl Fn(&LatencyRound) -> f64) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "a handful of rounds")]
    let n = c.rounds.len().max(1) as f64;
    c.rounds.iter().map(f).sum::<f64>() / n
}

/// The "under attack" table: each flood rate against the row without one, in one run.
pub(crate) fn attack(r: &AttackReport) -> Result<String, std::fmt::Error> {
    let m = &r.measured;
    let mut md = String::new();
    writeln!(
        md,
        "Measured {} on {}. The two-site bed (release build, every host on the machine's cores); for each row a replayed initiation is sent at adapter B at the offered rate, from one forged address or from many real addresses that answer B's cookie-replies (their initiations carry a hint of their own, not A's), while lanA's host runs iperf3 TCP to lanB's host for {} s, then pings it 20 times 0.1 s apart, and a device on lanB sends {} DHCP DISCOVERs a second. Ratios are to the row without a flood, from the same run; for a flood from many addresses also to the same flood at a closed port of B's (what the attacker's own sending costs the shared cores, B doing nothing).",
        m.date, m.machine, m.seconds, r.dhcp_per_sec
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| flood (initiations/s) | sent | TCP (Gbit/s) | TCP ratio | TCP ratio to the flood at a closed port | RTT average (ms) | RTT ratio | replies | CPU of B's control / handshake / receive thread (% of a core) | initiations checked | cookie-replies | DHCP answered |"
    )?;
    writeln!(
        md,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    let Some(base) = r.rows.first() else {
        return Ok(md);
    };
    for row in &r.rows {
        let closed = r.rows.iter().find(|c| {
            c.closed_port && !row.closed_port && c.rate == row.rate && c.sources == row.sources
        });
        writeln!(
            md,
            "| {} | {} | {:.2} | {} | {} | {:.3} | {} | {}/{} | {:.0} / {:.0} / {:.0} | {} | {} | {}/{} |",
            match (row.sources, row.closed_port) {
                (0, _) => row.rate.to_string(),
                (n, false) => format!("{}, from {n} addresses answering cookies", row.rate),
                (n, true) => format!("{}, from {n} addresses, to a closed port", row.rate),
            },
            row.sent,
            row.tcp_gbps,
            ratio(row.tcp_gbps, base.tcp_gbps),
            closed.map_or_else(|| "-".to_owned(), |c| ratio(row.tcp_gbps, c.tcp_gbps)),
            row.rtt.avg_ms,
            ratio(row.rtt.avg_ms, base.rtt.avg_ms),
            row.rtt.received,
            row.rtt.sent,
            row.control_cpu_pct,
            row.handshake_cpu_pct,
            row.receive_cpu_pct,
            row.checked,
            row.cookie_replies,
            row.dhcp_answered,
            row.dhcp_asked,
        )?;
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use cyphonic_report::{Ablation, AblationRow, Cut, Measured, Profile};

    use super::*;

    fn ping(avg_ms: f64) -> PingStats {
        PingStats {
            sent: 300,
            received: 300,
            avg_ms,
            p50_ms: avg_ms,
            p99_ms: avg_ms * 2.0,
        }
    }

    fn quick(gbps: f64, avg_ms: f64) -> Quick {
        let tcp = Tcp {
            gbps,
            retransmits: 7,
        };
        Quick {
            tcp1: tcp,
            tcp4: tcp,
            idle: ping(avg_ms),
            loaded: ping(avg_ms * 10.0),
        }
    }

    fn profile(gbps: f64, avg_ms: f64) -> Profile {
        let q = quick(gbps, avg_ms);
        let udp = Udp {
            offered_mbps: 1000.0,
            received_mbps: 990.0 * gbps,
            loss_pct: 0.5,
            out_of_order: 0,
        };
        Profile {
            tcp1: q.tcp1,
            tcp4: q.tcp4,
            udp: Some(udp),
            udp_tried: vec![udp],
            overload: udp,
            big: udp,
            idle: q.idle,
            loaded: q.loaded,
        }
    }

    /// A report goes through JSON (as from the bed's stdout) and renders its figures where
    /// the tables expect them.
    #[test]
    fn a_bench_report_renders_its_figures() {
        let ablation = Ablation {
            tcp1: Tcp {
                gbps: 1.0,
                retransmits: 0,
            },
            tcp4: Tcp {
                gbps: 2.0,
                retransmits: 0,
            },
            out_of_order: 3,
        };
        let report = BenchReport {
            measured: Measured {
                date: "2026-11-24 10:00 UTC".into(),
                machine: "test CPU".into(),
                seconds: 8,
            },
            runs: 3,
            udp_size: 1300,
            udp_refine: 3,
            inner_mtu: 1420,
            big_rate: 400,
            busy_poll_us: 20_000,
            plain: profile(2.0, 0.05),
            tunnel: profile(1.0, 0.2),
            tunnel_out_of_order: 0,
            ablation: vec![AblationRow {
                batch: 32,
                ordered: ablation,
                unordered: ablation,
            }],
            plain_gro: quick(4.0, 0.05),
            tunnel_gro: quick(2.0, 0.1),
            cut: Cut {
                coalesced: 10,
                segments: 440,
                refused: 0,
                out_of_order: 0,
            },
            busy_off: quick(1.0, 0.06),
            busy_on: quick(2.0, 0.06),
        };
        let json = serde_json::to_string(&report).unwrap();
        let back: BenchReport = serde_json::from_str(&json).unwrap();
        let md = bench(&back).unwrap();
        assert!(
            md.starts_with("Measured 2026-11-24 10:00 UTC on test CPU."),
            "{md}"
        );
        assert!(
            md.contains("| TCP, 1 stream (Gbit/s; retransmits) | 2.00; 7 | 1.00; 7 | 50% |"),
            "{md}"
        );
        assert!(md.contains("44.0 per frame"), "{md}");
        assert!(
            md.contains("| batch 32, 1 stream | 1.00 (0) | 1.00 (0) | 100% | 3 / 3 |"),
            "{md}"
        );
    }

    /// The latency report renders every round and reads the rows from the means: against
    /// plain routing (added idle RTT) and against the base (the p99's ratio).
    #[test]
    fn a_latency_report_reads_the_rows_from_the_rounds() {
        let round = |idle: f64, loaded_p99: f64, gbps: f64| LatencyRound {
            idle: PingStats {
                sent: 1000,
                received: 1000,
                avg_ms: idle,
                p50_ms: idle,
                p99_ms: idle * 2.0,
            },
            loaded: PingStats {
                sent: 1000,
                received: 1000,
                avg_ms: 1.0,
                p50_ms: 1.0,
                p99_ms: loaded_p99,
            },
            stream: Tcp {
                gbps,
                retransmits: 0,
            },
            loaded_idle_ends: PingStats {
                sent: 1000,
                received: 1000,
                avg_ms: 0.5,
                p50_ms: 0.5,
                p99_ms: 1.5,
            },
            stream_idle_ends: Tcp {
                gbps: gbps / 2.0,
                retransmits: 0,
            },
        };
        let column = |name: &str, role, rounds| LatencyColumn {
            name: name.into(),
            role,
            rounds,
        };
        let report = LatencyReport {
            measured: Measured {
                date: "2026-11-28 23:00 UTC".into(),
                machine: "test CPU".into(),
                seconds: 10,
            },
            count: 1000,
            columns: vec![
                column(
                    "plain routing",
                    LatencyRole::Plain,
                    vec![round(0.05, 0.1, 4.0), round(0.07, 0.1, 4.0)],
                ),
                column(
                    "base",
                    LatencyRole::Base,
                    vec![round(0.2, 6.0, 3.0), round(0.2, 8.0, 3.0)],
                ),
                column(
                    "defaults",
                    LatencyRole::Defaults,
                    vec![round(0.16, 2.0, 3.3), round(0.2, 1.5, 2.7)],
                ),
            ],
        };
        let json = serde_json::to_string(&report).unwrap();
        let back: LatencyReport = serde_json::from_str(&json).unwrap();
        let md = latency(&back).unwrap();
        assert!(
            md.contains("| idle | 0.050 / 0.100; 0.070 / 0.140 | 0.200 / 0.400; 0.200 / 0.400 | 0.160 / 0.320; 0.200 / 0.400 |"),
            "{md}"
        );
        assert!(
            md.contains("| the stream meanwhile, Gbit/s (default / idle priority) | 4.00 / 2.00; 4.00 / 2.00 |"),
            "{md}"
        );
        // Idle added: 0.18 - 0.06 on average, 0.36 - 0.12 at the p99; the p99 under load 7.0
        // (base) against 1.75: 4.0x; idle ends 1.5 - 0.36; the stream 3.0 of 3.0.
        assert!(
            md.contains("- defaults: idle RTT added to plain routing's 0.120 ms on average (target 0.15) and 0.240 ms at the p99 (target 0.5); p99 under the stream 1.75 ms, the base's / this = 4.0x (target 2x); with the ends at idle priority 1.14 ms above the idle p99 (target 1 ms); the stream 3.00 Gbit/s, 100% of the base's."),
            "{md}"
        );
        assert!(md.contains("- base: idle RTT added"), "{md}");
        assert!(!md.contains("- plain routing:"), "{md}");
    }

    /// A ping run without replies (NaN) goes through JSON as null and back.
    #[test]
    fn nan_figures_survive_json() {
        let p = PingStats {
            sent: 3,
            received: 0,
            avg_ms: f64::NAN,
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
        };
        let back: PingStats = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert!(back.avg_ms.is_nan() && back.received == 0);
    }
}
