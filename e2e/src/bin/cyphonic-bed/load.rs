//! Loads and their latency: bursts, tuning runs, floods, latency against an earlier
//! build.

use super::*;

/// `cyphonic-bed bursts`: see [`Command::Bursts`].
pub(crate) fn bursts(
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
    // needed at once, and what its in-flight budget refused (on stderr: stdout is the
    // table, which xtask writes into docs/benchmarks.md).
    let egress = &bed.status(Side::A)?["pipelines"]["egress"];
    eprintln!(
        "adapter A egress: batch buffers made {}, refused {} (for bytes {}, for time {})",
        egress["batch_buffers"],
        egress["rejected_full"],
        egress["rejected_bytes"],
        egress["rejected_late"]
    );
    Ok(())
}

/// Threads that spin at default priority until dropped: other work on the machine.
pub(crate) struct Hogs {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    pub(crate) fn start(n: usize) -> Self {
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
pub(crate) fn udp_rcvbuf_errors(ns: &cyphonic_e2e::Netns) -> anyhow::Result<u64> {
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
pub(crate) fn link_counts(link: Option<&ImpairedLink>) -> String {
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

/// How `tune` runs and looks at its UDP measurement: see [`Command::Tune`].
pub(crate) struct UdpLook {
    pub hosts_idle: bool,
    pub capture_nice: Option<i32>,
    pub sched: Option<std::path::PathBuf>,
}

/// `cyphonic-bed tune`: see [`Command::Tune`].
pub(crate) fn tune(
    dataplane: &str,
    seconds: u64,
    udp_mbps: u64,
    (gro, plain): (bool, bool),
    look: &UdpLook,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(plain && (look.sched.is_some() || look.capture_nice.is_some())),
        "--sched and --capture-nice look at adapter A's capture thread: plain routing has none"
    );
    let bed = quick_bed(&tuned(dataplane, gro), plain, None)?;
    measure::warm_up(&bed)?;
    // Adapter A's CPU while a measurement ran, % of a core (plain routing has none).
    let pid = bed.a.adapter.as_ref().map(cyphonic_e2e::Proc::pid);
    let idle = measure::ping(&bed, Side::A, bed.b.host_ip, 200, Duration::from_millis(10))?;
    let (t1, t1_cpu) = cpu_during(pid, || measure::tcp(&bed, 1, seconds))?;
    let t4 = measure::tcp(&bed, 4, seconds)?;
    let loaded = measure::ping_under_load(&bed, 3)?;
    // Adapter A's capture thread, if a flag looks at it (plain routing was refused above).
    let capture = match pid {
        Some(pid) if look.capture_nice.is_some() || look.sched.is_some() => {
            let tids = cyphonic_e2e::attack::thread_ids(pid, |name| name == "cy-capture")?;
            Some(*tids.first().context("adapter A has no cy-capture thread")?)
        }
        _ => None,
    };
    if let (Some(nice), Some(tid)) = (look.capture_nice, capture) {
        let out = std::process::Command::new("renice")
            .args(["-n", &nice.to_string(), "-p", &tid.to_string()])
            .output()
            .context("running renice")?;
        anyhow::ensure!(
            out.status.success(),
            "renice: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let priority = if look.hosts_idle {
        Priority::Idle
    } else {
        Priority::Default
    };
    let machine = machine_ticks()?;
    let recorder = look
        .sched
        .as_deref()
        .map(|file| Recording::start(&["sched", "record", "-a"], file))
        .transpose()?;
    let ((u, u_cpu), u_threads) = threads_during(pid, || {
        cpu_during(pid, || {
            measure::udp_at(&bed, udp_mbps, UDP_SIZE, 3, priority)
        })
    })?;
    let machine = machine_ticks()?.since(machine)?;
    let waited = match (recorder, capture) {
        (Some(recorder), Some(tid)) => {
            let file = recorder.finish()?;
            let gateways: Vec<(u32, &str)> = [(&bed.a, "A"), (&bed.b, "B")]
                .into_iter()
                .filter_map(|(site, name)| Some((site.adapter.as_ref()?.pid(), name)))
                .collect();
            Some(sched::read(file, tid, &gateways)?.summary("adapter A's capture thread"))
        }
        _ => None,
    };
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
        println!(
            "  adapter A CPU: {t1_cpu:.0}% of a core in TCP1 ({:.0}% per Gbit/s), {u_cpu:.0}% in UDP ({:.0}% per Gbit/s)",
            t1_cpu / t1.gbps,
            u_cpu / (u.received_mbps / 1000.0)
        );
        let threads: Vec<String> = u_threads
            .iter()
            .map(|(name, pct)| format!("{name} {pct:.0}%"))
            .collect();
        println!(
            "  adapter A's threads in UDP (% of a core): {}; the machine's cores {:.0}% busy",
            threads.join(", "),
            machine
        );
        let s = bed.status(Side::A)?;
        let p = &s["pipelines"];
        println!(
            "  adapter A: packet buffers allocated {}, egress batches {} (inline {}, buffers {}), ingress batches {} (inline {}, buffers {}), drop_pipeline_full {} (egress for bytes {}, time {}), drop_capture_overflow {}, out of order {}, coalesced frames {} -> segments {} ({} refused)",
            s["buffers"]["allocated"],
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
        if let Some(waited) = waited {
            println!("  in UDP, {waited}");
        }
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

/// A `perf` recording of the whole machine into a file, until [`Recording::finish`].
pub(crate) struct Recording<'a> {
    file: &'a std::path::Path,
    perf: cyphonic_e2e::Proc,
}

impl<'a> Recording<'a> {
    /// Starts `perf <args> -o file` (`args` from `record` or `sched record` on).
    pub(crate) fn start(args: &[&str], file: &'a std::path::Path) -> anyhow::Result<Self> {
        let mut cmd = std::process::Command::new("perf");
        cmd.args(args)
            .args(["-q", "-o"])
            .arg(file)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let perf = cyphonic_e2e::Proc::from_child(cmd.spawn().context("starting perf")?, "perf");
        Ok(Self { file, perf })
    }

    /// Stops it and gives its file, which must hold something.
    pub(crate) fn finish(self) -> anyhow::Result<&'a std::path::Path> {
        // perf exits with the interrupt's status; what it wrote is what counts.
        let stopped = self.perf.stop("INT", Duration::from_secs(30))?;
        anyhow::ensure!(
            std::fs::metadata(self.file).is_ok_and(|m| m.len() > 0),
            "perf wrote nothing into {}: {}",
            self.file.display(),
            String::from_utf8_lossy(&stopped.stderr)
        );
        Ok(self.file)
    }
}

/// What `run` gives, and the CPU process `pid` used meanwhile, % of a core (0 without one).
pub(crate) fn cpu_during<T>(
    pid: Option<u32>,
    run: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, f64)> {
    let ticks = || pid.map_or(Ok(0), fleet::cpu_ticks_of);
    let (t0, c0) = (std::time::Instant::now(), ticks()?);
    let out = run()?;
    let spent = ticks()?.saturating_sub(c0) as f64 / fleet::ticks_per_second();
    Ok((out, 100.0 * spent / t0.elapsed().as_secs_f64()))
}

/// The machine's CPU time so far (`/proc/stat`'s first line): busy and all ticks.
#[derive(Debug, Clone, Copy)]
struct MachineTicks {
    busy: u64,
    all: u64,
}

fn machine_ticks() -> anyhow::Result<MachineTicks> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("an empty /proc/stat")?;
    // cpu user nice system idle iowait irq softirq steal ...
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("/proc/stat's line {line:?}"))?;
    anyhow::ensure!(fields.len() >= 5, "/proc/stat's line {line:?}");
    let all: u64 = fields.iter().sum();
    Ok(MachineTicks {
        busy: all - fields[3] - fields[4],
        all,
    })
}

impl MachineTicks {
    /// The share of the machine's CPU time that was busy since `before`, %.
    fn since(self, before: Self) -> anyhow::Result<f64> {
        let all = self.all.saturating_sub(before.all);
        anyhow::ensure!(all > 0, "no CPU time passed");
        Ok(100.0 * self.busy.saturating_sub(before.busy) as f64 / all as f64)
    }
}

/// What `run` gives, and the CPU each thread of process `pid` used meanwhile (threads of
/// one name summed), % of a core, busiest first; none without a process.
fn threads_during<T>(
    pid: Option<u32>,
    run: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Vec<(String, f64)>)> {
    let ticks = || pid.map(cyphonic_e2e::attack::thread_ticks).transpose();
    let (t0, before) = (std::time::Instant::now(), ticks()?);
    let out = run()?;
    let (Some(before), Some(after)) = (before, ticks()?) else {
        return Ok((out, Vec::new()));
    };
    let mut spent: Vec<(String, f64)> =
        cyphonic_e2e::attack::thread_percent(&before, &after, t0.elapsed().as_secs_f64())
            .into_iter()
            .collect();
    spent.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok((out, spent))
}

/// See `Command::Flood`.
pub(crate) fn flood(
    seconds: u64,
    rounds: usize,
    dataplane: &str,
    plain: bool,
) -> anyhow::Result<()> {
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
    // Plain routing has no adapter, hence no sparse side: (0, 0). An adapter's counters are
    // read strictly (a missing one is an error, not a zero).
    let sparse = |bed: &TwoSites| -> anyhow::Result<(u64, u64)> {
        if plain {
            return Ok((0, 0));
        }
        let s = bed.status(Side::A)?;
        Ok((
            s["counters"]["drop_sparse_overflow"]
                .as_u64()
                .context("no counters.drop_sparse_overflow")?,
            s["pipelines"]["egress"]["lane"]
                .as_u64()
                .context("no pipelines.egress.lane")?,
        ))
    };
    for round in 1..=rounds {
        let alone = measure::tcp(&bed, 1, seconds)?;
        println!(
            "round {round}: 1 TCP stream alone {:.2} Gbit/s ({} retransmits)",
            alone.gbps, alone.retransmits
        );
        let (before, ticks) = (sparse(&bed)?, sparse_ticks()?);
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
        let (after, ticks) = (sparse(&bed)?, sparse_ticks()? - ticks);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "iperf3 gave no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let end = &report["end"];
        let sent = end["sum"]["packets"]
            .as_u64()
            .context("the flood's report without sum.packets")?;
        let lost = end["sum"]["lost_packets"]
            .as_u64()
            .context("the flood's report without sum.lost_packets")?;
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
pub(crate) fn latency(
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
                ("A egress", measure::Waits::read(&a, "egress")?),
                ("B ingress", measure::Waits::read(&b, "ingress")?),
                ("B egress", measure::Waits::read(&b, "egress")?),
                ("A ingress", measure::Waits::read(&a, "ingress")?),
            ],
            a["pipelines"]["egress"]["express"]
                .as_u64()
                .context("no pipelines.egress.express")?,
            a["pipelines"]["egress"]["drops"]["congestion"]
                .as_u64()
                .context("no pipelines.egress.drops.congestion")?,
            b["pipelines"]["ingress"]["lane"]
                .as_u64()
                .context("no pipelines.ingress.lane")?,
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
pub(crate) fn latency_table(
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
