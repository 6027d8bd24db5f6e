//! `cyphonic-bed rivals`: our tunnel beside wireguard-go, boringtun and nebula and plain
//! routing on one bed, in one run, the carriers interleaved round by round.

use cyphonic_e2e::rivals::{self, Rival, Tools};

use super::*;

/// What carries lanA's traffic to lanB in one column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    Plain,
    Rival(Rival),
    Cyphonic,
}

impl Carrier {
    fn all() -> Vec<Self> {
        let mut all = vec![Self::Plain];
        all.extend(Rival::ALL.map(Self::Rival));
        all.push(Self::Cyphonic);
        all
    }

    fn name(self) -> String {
        match self {
            Self::Plain => "plain routing".to_owned(),
            Self::Rival(r) => r.name(),
            Self::Cyphonic => "cyphonic".to_owned(),
        }
    }
}

/// One carrier's figures in one round.
#[derive(Debug, Clone, Copy)]
struct Sample {
    tcp1: f64,
    tcp4: f64,
    /// The most received under 1% loss, Mbit/s; none when even the lowest rate lost more.
    udp: Option<f64>,
    /// Gateway A's process, % of a core per Gbit/s in the one-stream run; none for plain
    /// routing (the kernel's softirq time belongs to no process).
    cpu_per_gbit: Option<f64>,
    /// Adapter A's capture overflows during the TCP runs and during the UDP search.
    overflows: Option<(u64, u64)>,
}

/// `cyphonic-bed rivals`: see [`Command::Rivals`].
pub(crate) fn rivals_table(
    seconds: u64,
    rounds: usize,
    gro: bool,
    only: &[String],
    perf: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let tools = Tools::find()?;
    let mut carriers = Carrier::all();
    if !only.is_empty() {
        carriers.retain(|c| *c == Carrier::Cyphonic || only.contains(&c.name()));
    }
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); carriers.len()];
    for round in 1..=rounds.max(1) {
        for (i, &carrier) in carriers.iter().enumerate() {
            let profile = perf.map(|dir| {
                dir.join(format!(
                    "{}-gro-{}-round{round}.data",
                    carrier.name().replace([' ', ','], ""),
                    if gro { "on" } else { "off" }
                ))
            });
            let s = sample(carrier, &tools, seconds, gro, profile.as_deref())
                .with_context(|| format!("round {round}, {}", carrier.name()))?;
            eprintln!(
                "cyphonic-bed rivals: GRO {}, round {round}, {}: {s:?}",
                if gro { "on" } else { "off" },
                carrier.name()
            );
            samples[i].push(s);
        }
    }
    let profile = if gro { "GRO on" } else { "GRO off" };
    let names: Vec<String> = carriers.iter().map(|c| c.name()).collect();
    println!(
        "| gateways' LAN side, row | {} | cyphonic / best peer | cyphonic / plain |",
        names.join(" | ")
    );
    println!("|---|{}---:|---:|", "---:|".repeat(carriers.len()));
    let peers: Vec<usize> = (0..carriers.len())
        .filter(|&i| matches!(carriers[i], Carrier::Rival(_)))
        .collect();
    // Last, whatever `only` kept.
    let ours = carriers.len() - 1;
    let plain = carriers.iter().position(|c| *c == Carrier::Plain);
    // `absent`: what a carrier without the figure shows.
    let row = |label: &str,
               (digits, absent): (usize, &str),
               lower_is_better: bool,
               f: &dyn Fn(&Sample) -> Option<f64>| {
        let figures: Vec<Vec<f64>> = samples
            .iter()
            .map(|s| s.iter().filter_map(f).collect())
            .collect();
        let medians: Vec<Option<f64>> = figures.iter().map(|all| median(all)).collect();
        let cells: Vec<String> = figures
            .iter()
            .zip(&medians)
            .map(|(all, m)| m.map_or_else(|| absent.to_owned(), |m| cell(m, all, digits)))
            .collect();
        let best = peers
            .iter()
            .filter_map(|&i| medians[i])
            .reduce(|a, b| if lower_is_better { a.min(b) } else { a.max(b) });
        let ratio = |of: Option<f64>| match (medians[ours], of) {
            (Some(us), Some(them)) if them > 0.0 => format!("{:.2}", us / them),
            _ => "—".to_owned(),
        };
        println!(
            "| {profile}: {label} | {} | {} | {} |",
            cells.join(" | "),
            ratio(best),
            ratio(plain.and_then(|p| medians[p]))
        );
    };
    row("TCP, 1 stream (Gbit/s)", (2, "—"), false, &|s| {
        Some(s.tcp1)
    });
    row("TCP, 4 streams (Gbit/s)", (2, "—"), false, &|s| {
        Some(s.tcp4)
    });
    row(
        "UDP, most received with < 1% loss (Mbit/s)",
        (0, "none under 1%"),
        false,
        &|s| s.udp,
    );
    // Plain routing forwards in the kernel's softirqs, in no process of its own.
    row(
        "gateway A's CPU per Gbit/s, TCP 1 stream (% of a core)",
        (0, "—"),
        true,
        &|s| s.cpu_per_gbit,
    );
    let overflows: Vec<String> = samples[ours]
        .iter()
        .filter_map(|s| s.overflows)
        .map(|(tcp, udp)| format!("{tcp} / {udp}"))
        .collect();
    println!(
        "| {profile}: adapter A's capture overflows, TCP runs / UDP search, each round | {}{} | | |",
        "— | ".repeat(carriers.len() - 1),
        overflows.join(", ")
    );
    Ok(())
}

/// The median of `v` (the mean of the middle two for an even count); none when empty.
fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some(f64::midpoint(v[n / 2 - 1], v[n / 2])),
    }
}

/// A median and, over several rounds, their range: "2.20 (2.10-2.31)".
fn cell(m: f64, all: &[f64], digits: usize) -> String {
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if all.len() > 1 {
        format!("{m:.digits$} ({lo:.digits$}-{hi:.digits$})")
    } else {
        format!("{m:.digits$}")
    }
}

/// One round of one carrier on a bed of its own; with `profile`, `perf record` samples the
/// whole machine into that file while the one-stream run lasts.
fn sample(
    carrier: Carrier,
    tools: &Tools,
    seconds: u64,
    gro: bool,
    profile: Option<&std::path::Path>,
) -> anyhow::Result<Sample> {
    let opts = tuned("", gro);
    let (bed, rival) = match carrier {
        Carrier::Plain => (quick_bed(&opts, true, None)?, None),
        Carrier::Cyphonic => (quick_bed(&opts, false, None)?, None),
        Carrier::Rival(r) => {
            let bed = TwoSites::new(&opts)?;
            let carrying = rivals::carry(&bed, r, tools)?;
            rivals::wait_carried(&bed).with_context(|| carrying.logs())?;
            (bed, Some(carrying))
        }
    };
    measure::warm_up(&bed)?;
    // The gateways' processes: A's, whose CPU the table counts, and B's.
    let pids = match (&rival, carrier) {
        (Some(r), _) => Some((r.pid_a(), r.pid_b())),
        (None, Carrier::Cyphonic) => bed
            .a
            .adapter
            .as_ref()
            .zip(bed.b.adapter.as_ref())
            .map(|(a, b)| (a.pid(), b.pid())),
        _ => None,
    };
    let pid = pids.map(|(a, _)| a);
    let overflows = || -> anyhow::Result<Option<u64>> {
        match carrier {
            Carrier::Cyphonic => Ok(Some(bed.counter(Side::A, "drop_capture_overflow")?)),
            _ => Ok(None),
        }
    };
    let before = overflows()?;
    let (tcp1, cpu) = cpu_during(pid, || {
        let Some(file) = profile else {
            return measure::tcp(&bed, 1, seconds);
        };
        let recorder = Recording::start(&["record", "-a", "-g", "-F", "499"], file)?;
        let run = measure::tcp(&bed, 1, seconds);
        recorder.finish()?;
        run
    })?;
    if let (Some(file), Some((a, b))) = (profile, pids) {
        eprintln!(
            "cyphonic-bed rivals: {}, {}: {}",
            carrier.name(),
            file.display(),
            split_samples(file, [a, b], tcp1.gbps)?
        );
    }
    let tcp4 = measure::tcp(&bed, 4, seconds)?;
    let after_tcp = overflows()?;
    let (udp, _) = measure::udp_search(&bed, &UDP_RATES, UDP_SIZE, 3)?;
    let after_udp = overflows()?;
    let overflows = match (before, after_tcp, after_udp) {
        (Some(b), Some(t), Some(u)) => Some((
            t.checked_sub(b).context("the overflow counter went back")?,
            u.checked_sub(t).context("the overflow counter went back")?,
        )),
        _ => None,
    };
    Ok(Sample {
        tcp1: tcp1.gbps,
        tcp4: tcp4.gbps,
        udp: udp.map(|u| u.received_mbps),
        cpu_per_gbit: pid.map(|_| cpu / tcp1.gbps),
        overflows,
    })
}

/// The kinds of work [`split_samples`] tells apart, in its order.
const WORK: [&str; 6] = [
    "AEAD",
    "our copies",
    "checksums",
    "our other work",
    "the kernel's copies",
    "the kernel's other work",
];

/// Which of [`WORK`] a sample in `sym` is, in the kernel or not.
fn work_of(sym: &str, kernel: bool) -> usize {
    let sym = sym.to_ascii_lowercase();
    let any = |names: &[&str]| names.iter().any(|n| sym.contains(n));
    if any(&["chacha", "poly1305"]) {
        0
    } else if any(&["checksum", "csum"]) {
        2
    } else if kernel && any(&["_copy_to_iter", "_copy_from_iter", "copy_user"]) {
        4
    } else if kernel {
        5
    } else if any(&["memmove", "memcpy"]) {
        1
    } else {
        3
    }
}

/// One line of `perf script -F pid,ip,sym,dso`, `  <pid>  <ip> <sym> (<dso>)`: the process,
/// the symbol (a Rust one may hold spaces, `<T as Trait>::f`) and whether it is the kernel's.
fn sample_of(line: &str) -> Option<(u32, &str, bool)> {
    let (pid, rest) = line.trim_start().split_once(char::is_whitespace)?;
    let (_ip, rest) = rest.trim_start().split_once(char::is_whitespace)?;
    let (sym, dso) = rest.trim_start().rsplit_once(" (")?;
    // The kernel and its modules (`[kernel.kallsyms]`, `[veth]`); not the vDSO, nor what
    // perf could not place.
    let kernel =
        dso.starts_with('[') && !dso.starts_with("[vdso]") && !dso.starts_with("[unknown]");
    Some((pid.parse().ok()?, sym, kernel))
}

/// Where `file`'s samples (`perf record -a` on every core) fell: in each of the two gateways'
/// processes, in their own code (user) and in the kernel, as cores and as microseconds per
/// 1,420-byte packet at `gbps`, then by kind of work ([`WORK`]); and on no task (idle).
fn split_samples(file: &std::path::Path, [a, b]: [u32; 2], gbps: f64) -> anyhow::Result<String> {
    let out = std::process::Command::new("perf")
        .args(["script", "-G", "-F", "pid,ip,sym,dso", "-i"])
        .arg(file)
        .output()
        .context("running perf script")?;
    anyhow::ensure!(out.status.success(), "perf script failed");
    // [a user, a kernel, b user, b kernel, idle], and all;
    // per gateway, by kind of work.
    let (mut counts, mut all) = ([0u64; 5], 0u64);
    let mut work = [[0u64; WORK.len()]; 2];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((pid, sym, kernel)) = sample_of(line) else {
            continue;
        };
        all += 1;
        let (at, side) = match pid {
            0 => (4, None),
            p if p == a => (usize::from(kernel), Some(0)),
            p if p == b => (2 + usize::from(kernel), Some(1)),
            _ => continue,
        };
        counts[at] += 1;
        if let Some(side) = side {
            work[side][work_of(sym, kernel)] += 1;
        }
    }
    anyhow::ensure!(all > 0, "no samples in {}", file.display());
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let share = |n: u64| cores * n as f64 / all as f64;
    let per_packet = |c: f64| 1e6 * c / (gbps * 1e9 / 8.0 / 1420.0);
    let side = |name: &str, user: u64, kernel: u64, work: &[u64; WORK.len()]| {
        let (u, k) = (share(user), share(kernel));
        let kinds: Vec<String> = WORK
            .iter()
            .zip(work)
            .map(|(what, n)| format!("{what} {:.2}", per_packet(share(*n))))
            .collect();
        format!(
            "{name} {:.2} cores ({u:.2} user + {k:.2} kernel), {:.1} us per packet ({:.1} + {:.1}: {})",
            u + k,
            per_packet(u + k),
            per_packet(u),
            per_packet(k),
            kinds.join(", ")
        )
    };
    Ok(format!(
        "{}; {}; idle {:.2} cores ({all} samples, {gbps:.2} Gbit/s)",
        side("gateway A", counts[0], counts[1], &work[0]),
        side("gateway B", counts[2], counts[3], &work[1]),
        share(counts[4])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_script_lines_give_process_symbol_and_side() {
        assert_eq!(
            sample_of("   28829  ffffffff813cc541 do_sched_yield ([kernel.kallsyms])"),
            Some((28829, "do_sched_yield", true))
        );
        assert_eq!(
            sample_of(
                "28844      55d0c1a2b3c4 <cyphonic_tunnel::ingress::Accepting<K> as cyphonic_pipeline::Sink>::emit (/usr/bin/cyphonic-adapter)"
            ),
            Some((
                28844,
                "<cyphonic_tunnel::ingress::Accepting<K> as cyphonic_pipeline::Sink>::emit",
                false
            ))
        );
        assert_eq!(
            sample_of("7 ffffffffc0a1b2c3 veth_xmit ([veth])"),
            Some((7, "veth_xmit", true))
        );
        assert_eq!(
            sample_of("7 7ffd12345678 __vdso_clock_gettime ([vdso])"),
            Some((7, "__vdso_clock_gettime", false))
        );
        // Not a sample line, or one cut short: skipped, never a guess.
        assert_eq!(sample_of(""), None);
        assert_eq!(sample_of("perf: no samples"), None);
        assert_eq!(sample_of("123 ffff"), None);
    }

    #[test]
    fn samples_are_told_apart_by_kind_of_work() {
        let kind = |sym, kernel| WORK[work_of(sym, kernel)];
        for (sym, kernel, want) in [
            (
                "ring_core_0_17_14__chacha20_poly1305_seal_avx2",
                false,
                "AEAD",
            ),
            (
                "golang.org/x/crypto/chacha20poly1305.(*chacha20poly1305).sealGeneric",
                false,
                "AEAD",
            ),
            ("__memmove_avx512_unaligned_erms", false, "our copies"),
            (
                "gvisor.dev/gvisor/pkg/tcpip/checksum.checksumNoFold",
                false,
                "checksums",
            ),
            ("csum_partial", true, "checksums"),
            (
                "cyphonic_gateway::segment::Segmenter::next_into",
                false,
                "our other work",
            ),
            ("_copy_to_iter", true, "the kernel's copies"),
            ("_copy_from_iter", true, "the kernel's copies"),
            ("veth_xmit", true, "the kernel's other work"),
        ] {
            assert_eq!(kind(sym, kernel), want, "{sym}");
        }
    }
}
