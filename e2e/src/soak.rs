//! The soak (`cargo xtask soak`): the cloud, two adapters and a node on the bed for a long
//! time, with DHCP devices coming and going, names resolved, traffic in bursts, keys rotated
//! every 30 s, the cloud and adapter B restarted now and then, and 2 % loss on the underlay
//! switched on and off. Every cycle each daemon's resident memory, open files, threads and
//! packet buffers are recorded; the run fails at once on a stall (a step that does not
//! complete in time) and at the end on growth beyond [`Bounds`].
//!
//! The analysis ([`Sample`], [`growth`]) is plain data and tested here; the run itself is
//! [`run`].

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;

use crate::bed::{BedOptions, CloudOptions, Side, TwoSites};
use crate::lan::DhcpHost;

pub mod plot;

/// The daemons sampled, by the names samples carry.
pub const DAEMONS: [&str; 4] = ["adapter-a", "adapter-b", "node-c", "cloud"];

/// The first line of `samples.csv`.
pub const CSV_HEADER: &str = "at,daemon,pid,rss_kib,fds,threads,buffers\n";

/// The events a run records (`report.json`'s `events`) that its plot marks.
pub const CLOUD_RESTARTED: &str = "cloud restarted";
/// Adapter B restarted.
pub const ADAPTER_RESTARTED: &str = "adapter B restarted";
/// Loss on the underlay switched on.
pub const LOSS_ON: &str = "2 % UDP loss on the underlay on";
/// ... and off.
pub const LOSS_OFF: &str = "2 % UDP loss on the underlay off";

/// One daemon's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// Resident memory, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
    /// Packet buffers allocated (adapters and node; 0 for the cloud).
    pub buffers: u64,
}

/// A sample: which daemon, when (seconds into the run), its process, its figures.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// `adapter-a`, `adapter-b`, `node-c`, `cloud`.
    pub daemon: &'static str,
    /// Seconds since the run started.
    pub at: u64,
    /// Its process id (a restarted daemon has a new one).
    pub pid: u32,
    /// What was read.
    pub figures: Figures,
}

/// How much a daemon may grow from the first third of the run (after the warm-up) to the
/// last third, comparing the largest figures of each.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Samples of each daemon not judged (start-up, first peers, first leases).
    pub warmup: usize,
    /// Resident memory: this share more ...
    pub rss_ratio: f64,
    /// ... plus this many KiB.
    pub rss_kib: u64,
    /// Open files more.
    pub fds: u64,
    /// Threads more.
    pub threads: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            warmup: 2,
            rss_ratio: 0.25,
            rss_kib: 4096,
            fds: 8,
            threads: 4,
        }
    }
}

/// The fewest samples of a daemon, after the warm-up, that growth is judged on (two thirds
/// compared: three each).
pub const JUDGED: usize = 6;

/// Whether `daemon`'s samples stayed within `bounds`: `Err` with what grew, or that there
/// are too few samples to tell (fewer than [`JUDGED`] after the warm-up: a verdict that
/// could not fail is not given).
///
/// # Errors
/// What grew, or too few samples.
pub fn growth(samples: &[Sample], daemon: &str, bounds: &Bounds) -> Result<(), String> {
    let mine: Vec<&Figures> = samples
        .iter()
        .filter(|s| s.daemon == daemon)
        .map(|s| &s.figures)
        .skip(bounds.warmup)
        .collect();
    if mine.len() < JUDGED {
        return Err(format!(
            "{daemon}: too few samples to judge growth ({} after the warm-up of {}, {JUDGED} needed)",
            mine.len(),
            bounds.warmup
        ));
    }
    let third = mine.len() / 3;
    let (first, last) = (&mine[..third], &mine[mine.len() - third..]);
    let max = |part: &[&Figures], f: fn(&Figures) -> u64| part.iter().map(|x| f(x)).max();
    let mut out = String::new();
    let (Some(r0), Some(r1)) = (max(first, |f| f.rss_kib), max(last, |f| f.rss_kib)) else {
        unreachable!("a third of {JUDGED} or more samples is not empty");
    };
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "KiB of a process: far below 2^52, and the bound is rounded anyway"
    )]
    let rss_limit = (r0 as f64 * (1.0 + bounds.rss_ratio)) as u64 + bounds.rss_kib;
    if r1 > rss_limit {
        let _ = write!(
            out,
            "resident memory {r0} -> {r1} KiB (bound {rss_limit}); "
        );
    }
    for (what, f, allowed) in [
        (
            "open files",
            (|f: &Figures| f.fds) as fn(&Figures) -> u64,
            bounds.fds,
        ),
        ("threads", |f: &Figures| f.threads, bounds.threads),
    ] {
        if let (Some(a), Some(b)) = (max(first, f), max(last, f))
            && b > a + allowed
        {
            let _ = write!(out, "{what} {a} -> {b} (bound +{allowed}); ");
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(format!("{daemon}: {}", out.trim_end_matches("; ")))
    }
}

/// Reads `samples.csv` as a run writes it.
///
/// # Errors
/// A line that is not `at,daemon,pid,rss_kib,fds,threads,buffers` with a known daemon.
pub fn read_samples(csv: &str) -> anyhow::Result<Vec<Sample>> {
    csv.lines()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            let bad = || format!("samples.csv line {}: {line:?}", i + 1);
            let f: Vec<&str> = line.split(',').collect();
            let [at, daemon, pid, rss, fds, threads, buffers] = f[..] else {
                anyhow::bail!("{}: not seven fields", bad());
            };
            let daemon = DAEMONS
                .iter()
                .find(|d| **d == daemon)
                .with_context(|| format!("{}: unknown daemon", bad()))?;
            let n = |v: &str| v.parse::<u64>().with_context(bad);
            Ok(Sample {
                daemon,
                at: n(at)?,
                pid: pid.parse().with_context(bad)?,
                figures: Figures {
                    rss_kib: n(rss)?,
                    fds: n(fds)?,
                    threads: n(threads)?,
                    buffers: n(buffers)?,
                },
            })
        })
        .collect()
}

/// One line of `samples.csv`.
pub fn csv_line(s: &Sample) -> String {
    let f = &s.figures;
    format!(
        "{},{},{},{},{},{},{}\n",
        s.at, s.daemon, s.pid, f.rss_kib, f.fds, f.threads, f.buffers
    )
}

/// `pid`'s figures from /proc, and `buffers` as given.
///
/// # Errors
/// The process is gone or /proc cannot be read.
pub fn figures(pid: u32, buffers: u64) -> anyhow::Result<Figures> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("reading /proc/{pid}/fd"))?
        .count();
    Ok(Figures {
        rss_kib: field("VmRSS:")?,
        fds: u64::try_from(fds)?,
        threads: field("Threads:")?,
        buffers,
    })
}

/// What a run found.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    /// Seconds it ran.
    pub seconds: u64,
    /// Cycles completed.
    pub cycles: u64,
    /// Every sample, in order.
    pub samples: Vec<Sample>,
    /// What each cycle did besides the checks, for the record.
    pub events: Vec<(u64, String)>,
}

/// The length of one cycle.
pub const CYCLE: Duration = Duration::from_secs(60);

/// Runs the soak for `seconds`, writing `samples.csv` and `report.json` into `out` as it goes.
///
/// # Errors
/// A stall (a step that did not complete in time, named with its cycle), a daemon that died,
/// or growth beyond `bounds` at the end.
pub fn run(
    seconds: u64,
    cycle: Duration,
    bounds: &Bounds,
    out: &Path,
) -> anyhow::Result<SoakReport> {
    // Said before the bed is built, not after the run: growth needs its samples.
    let cycles = seconds / cycle.as_secs().max(1);
    anyhow::ensure!(
        usize::try_from(cycles).is_ok_and(|c| c >= bounds.warmup + JUDGED),
        "{seconds} s in cycles of {} s is {cycles} samples: growth needs {} (a warm-up of {}, \
         then {JUDGED}); run longer or in shorter cycles",
        cycle.as_secs(),
        bounds.warmup + JUDGED,
        bounds.warmup
    );
    std::fs::create_dir_all(out)?;
    let mut bed = TwoSites::new(&BedOptions {
        cloud: Some(CloudOptions::default()),
        lan_switch: true,
        node_c: Some(None),
        dataplane_extra: "danger_rekey_after_secs = 30\n".into(),
        ..BedOptions::default()
    })?;
    bed.start(Side::A)?;
    bed.start(Side::B)?;
    let bins = bed.bins.clone();
    bed.c.as_mut().context("node C")?.start(&bins)?;
    bed.wan.exec("nft", &["add", "table", "inet", "soak"])?;
    bed.wan.exec(
        "nft",
        &["add chain inet soak loss { type filter hook forward priority 0 ; }"],
    )?;
    let started = Instant::now();
    let mut report = SoakReport {
        seconds: 0,
        cycles: 0,
        samples: Vec::new(),
        events: Vec::new(),
    };
    let mut csv = String::from(CSV_HEADER);
    let mut devices: Vec<DhcpHost> = Vec::new();
    let mut lossy = false;
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let cycle_start = Instant::now();
        n += 1;
        let at = started.elapsed().as_secs();
        let mut note = |what: String| report.events.push((at, what));
        // A device joins lanA (DHCP, its name registered); the oldest of four leaves.
        let host = format!("dev{n}");
        let (dev, ip) = bed
            .dhcp_device(Side::A, &host)
            .with_context(|| format!("stall in cycle {n}: DHCP for {host}"))?;
        devices.push(dev);
        if devices.len() > 4 {
            devices.remove(0);
        }
        // Names and traffic: B's host reaches the new device by name; the node reaches it too;
        // a 3-s TCP burst from A's host to B's.
        let name = format!("{host}.gw1.ovl.example");
        check(
            &bed,
            &bed.b.lan,
            Ipv4Addr::new(100, 64, 2, 1),
            &name,
            &ip,
            n,
        )?;
        let node = &bed.c.as_ref().context("node C")?.ns;
        check(&bed, node, crate::node::VIP, &name, &ip, n)?;
        crate::bed::iperf3(&bed, Side::B, &[], 3)
            .with_context(|| format!("stall in cycle {n}: TCP from A's host to B's"))?;
        // Now and then: loss on the underlay on or off, the cloud restarted, adapter B
        // restarted.
        if n.is_multiple_of(4) {
            lossy = !lossy;
            if lossy {
                bed.wan.exec(
                    "nft",
                    &["add rule inet soak loss meta l4proto udp numgen random mod 100 < 2 drop"],
                )?;
            } else {
                bed.wan.exec("nft", &["flush chain inet soak loss"])?;
            }
            note(if lossy { LOSS_ON } else { LOSS_OFF }.into());
        }
        if n.is_multiple_of(5) {
            let cloud = bed.cloud.as_mut().context("the cloud")?;
            cloud.stop("TERM")?;
            cloud.start(&bins)?;
            note(CLOUD_RESTARTED.into());
        }
        if n.is_multiple_of(7) {
            bed.stop(Side::B, "TERM")?;
            bed.start(Side::B)?;
            note(ADAPTER_RESTARTED.into());
        }
        // The figures.
        let at = started.elapsed().as_secs();
        for (daemon, pid, buffers) in daemons(&bed)? {
            let figures = figures(pid, buffers)
                .with_context(|| format!("cycle {n}: {daemon} (pid {pid}) is gone"))?;
            let sample = Sample {
                daemon,
                at,
                pid,
                figures,
            };
            csv.push_str(&csv_line(&sample));
            report.samples.push(sample);
        }
        report.cycles = n;
        report.seconds = at;
        std::fs::write(out.join("samples.csv"), &csv)?;
        std::fs::write(out.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
        eprintln!("soak: cycle {n} done at {at} s");
        std::thread::sleep(cycle.saturating_sub(cycle_start.elapsed()));
    }
    let grown: Vec<String> = DAEMONS
        .iter()
        .filter_map(|d| growth(&report.samples, d, bounds).err())
        .collect();
    if !grown.is_empty() {
        bail!("growth not within the bounds: {}", grown.join("; "));
    }
    Ok(report)
}

/// Resolves `name` from `ns` through the DNS at `server`, which must answer `ip`, and pings
/// the address: a stall in cycle `n` otherwise.
fn check(
    bed: &TwoSites,
    ns: &crate::Netns,
    server: Ipv4Addr,
    name: &str,
    ip: &Ipv4Addr,
    n: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answered = crate::lan::dig(ns, server, name, "A")
            .is_ok_and(|d| d.status == "NOERROR" && d.answers == [ip.to_string()]);
        if answered {
            let to = ip.to_string();
            let ping = ns.exec_output("ping", &["-c", "3", "-i", "0.2", "-W", "2", &to])?;
            if ping.status.success() {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "stall in cycle {n}: {name} from {} not answered or not reached in 20 s\n{}",
                ns.name(),
                bed.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every daemon's name, process and packet buffers allocated.
fn daemons(bed: &TwoSites) -> anyhow::Result<Vec<(&'static str, u32, u64)>> {
    let buffers = |status: &serde_json::Value| {
        status["buffers"]["allocated"]
            .as_u64()
            .with_context(|| format!("no buffers.allocated in the status: {status}"))
    };
    let mut out = Vec::new();
    for (daemon, side) in [("adapter-a", Side::A), ("adapter-b", Side::B)] {
        let site = bed.site_ref(side);
        let pid = site.adapter.as_ref().context("adapter not running")?.pid();
        out.push((daemon, pid, buffers(&bed.status(side)?)?));
    }
    let c = bed.c.as_ref().context("node C")?;
    let pid = c.proc.as_ref().context("node not running")?.pid();
    out.push(("node-c", pid, buffers(&c.status(&bed.bins)?)?));
    let cloud = bed.cloud.as_ref().context("the cloud")?;
    let pid = cloud.proc.as_ref().context("cloud not running")?.pid();
    out.push(("cloud", pid, 0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(daemon: &'static str, rss: &[u64], fds: &[u64]) -> Vec<Sample> {
        rss.iter()
            .zip(fds)
            .enumerate()
            .map(|(i, (r, f))| Sample {
                daemon,
                at: i as u64 * 60,
                pid: 1,
                figures: Figures {
                    rss_kib: *r,
                    fds: *f,
                    threads: 10,
                    buffers: 64,
                },
            })
            .collect()
    }

    #[test]
    fn samples_read_back_as_written_and_bad_lines_are_named() {
        let s = Sample {
            daemon: "node-c",
            at: 120,
            pid: 77,
            figures: Figures {
                rss_kib: 9000,
                fds: 31,
                threads: 9,
                buffers: 512,
            },
        };
        let csv = format!("{}{}", CSV_HEADER, csv_line(&s));
        let back = read_samples(&csv).unwrap_or_default();
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].daemon, back[0].at, back[0].pid, back[0].figures),
            ("node-c", 120, 77, s.figures)
        );
        let unknown = read_samples("h\n1,gateway,2,3,4,5,6\n").unwrap_err();
        assert!(
            format!("{unknown:#}").contains("line 2") && format!("{unknown:#}").contains("unknown"),
            "{unknown:#}"
        );
        assert!(read_samples("h\n1,cloud,2,3,4,5\n").is_err());
        assert!(read_samples("h\n1,cloud,2,3,x,5,6\n").is_err());
    }

    #[test]
    fn flat_figures_pass_and_growth_is_named() {
        let b = Bounds::default();
        // Warm-up (two samples) is not judged, then flat with noise.
        let flat = series(
            "adapter-a",
            &[
                1000, 30_000, 40_000, 41_000, 39_000, 40_500, 40_000, 41_000, 40_000,
            ],
            &[5, 20, 30, 30, 31, 30, 30, 32, 30],
        );
        assert_eq!(growth(&flat, "adapter-a", &b), Ok(()));
        // A leak: memory climbing steadily, files too.
        let leak = series(
            "cloud",
            &[
                1000, 30_000, 40_000, 45_000, 50_000, 55_000, 60_000, 65_000, 70_000,
            ],
            &[5, 20, 30, 32, 34, 36, 38, 40, 50],
        );
        let why = growth(&leak, "cloud", &b).unwrap_err();
        assert!(
            why.starts_with("cloud: resident memory") && why.contains("open files"),
            "{why}"
        );
        // Other daemons' samples are not mixed in (none: too few); too few samples fail.
        let none = growth(&leak, "adapter-a", &b).unwrap_err();
        assert!(
            none.contains("too few samples to judge growth (0 after"),
            "{none}"
        );
        let few = growth(&leak[..7], "cloud", &b).unwrap_err();
        assert!(
            few.starts_with("cloud: too few samples to judge growth (5 after"),
            "{few}"
        );
    }
}
