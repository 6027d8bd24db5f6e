//! `cargo xtask bench`: runs the criterion benchmarks and writes their tables, with ratios
//! taken within the same run, into docs/benchmarks.md between marker comments.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::util;

const MICRO: (&str, &str) = (
    "<!-- xtask bench micro: begin -->",
    "<!-- xtask bench micro: end -->",
);
const E2E: (&str, &str) = (
    "<!-- xtask bench e2e: begin -->",
    "<!-- xtask bench e2e: end -->",
);
const ATTACK: (&str, &str) = (
    "<!-- xtask bench attack: begin -->",
    "<!-- xtask bench attack: end -->",
);
const PEERS: (&str, &str) = (
    "<!-- xtask bench peers: begin -->",
    "<!-- xtask bench peers: end -->",
);
const LATENCY: (&str, &str) = (
    "<!-- xtask bench latency: begin -->",
    "<!-- xtask bench latency: end -->",
);
/// The setting the latency part measures beside the defaults: the data plane at real-time
/// priority, the one setting that met issue 24's loaded rows on the bed.
const LATENCY_SETTING: &str = "realtime_priority = 10";
const IPV6: (&str, &str) = (
    "<!-- xtask bench ipv6: begin -->",
    "<!-- xtask bench ipv6: end -->",
);
const INSTRUCTIONS: (&str, &str) = (
    "<!-- xtask bench instructions: begin -->",
    "<!-- xtask bench instructions: end -->",
);

const ARM64: (&str, &str) = (
    "<!-- xtask bench arm64: begin -->",
    "<!-- xtask bench arm64: end -->",
);

/// A results section whose table `cyphonic-bed` prints as Markdown: `cargo xtask bench
/// --table NAME` runs its commands on the release build and writes what they printed (one
/// table, the first command's header over every command's rows) between `<!-- xtask bench
/// table NAME: begin -->` and its end marker, after a line saying when, where, at which
/// commit and with which commands it was measured.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BedTable {
    /// Its name on the command line and in its markers.
    pub(crate) name: &'static str,
    /// The `cyphonic-bed` commands, in order.
    runs: &'static [&'static [&'static str]],
    /// They run other tunnels: xtask installs them first ([`crate::rivals`]).
    rivals: bool,
}

/// Every section `cargo xtask bench --table` writes.
pub(crate) const BED_TABLES: &[BedTable] = &[
    BedTable {
        name: "rivals",
        runs: &[
            &["rivals", "--seconds", "5", "--rounds", "2"],
            &["rivals", "--seconds", "5", "--rounds", "2", "--gro"],
        ],
        rivals: true,
    },
    BedTable {
        name: "impair",
        runs: &[&["impair", "--seconds", "10", "--runs", "5"]],

        rivals: false,
    },
    BedTable {
        name: "bursts",
        runs: &[&[
            "bursts",
            "--seconds",
            "5",
            "--rates",
            "400,800,1000,1200,1500",
        ]],

        rivals: false,
    },
    BedTable {
        name: "node",
        runs: &[&["node", "--seconds", "5", "--runs", "3"]],

        rivals: false,
    },
    BedTable {
        name: "ha",
        runs: &[&["ha", "--rounds", "10"]],

        rivals: false,
    },
    BedTable {
        name: "relay-stream",
        runs: &[
            &["relay-stream", "--seconds", "8", "--runs", "3"],
            &[
                "relay-stream",
                "--seconds",
                "8",
                "--runs",
                "3",
                "--delay-ms",
                "10",
            ],
        ],

        rivals: false,
    },
    BedTable {
        name: "policy",
        runs: &[&["policy", "--rounds", "5"]],

        rivals: false,
    },
    BedTable {
        name: "legacy",
        runs: &[&["legacy", "--rounds", "5"]],

        rivals: false,
    },
    BedTable {
        name: "members",
        runs: &[
            &["members", "--counts", "200,1000,10000"],
            &["members", "--counts", "10000", "--postgres"],
        ],

        rivals: false,
    },
    BedTable {
        name: "swarm",
        runs: &[&["swarm", "--counts", "1,100,1000,10000", "--leases", "250"]],

        rivals: false,
    },
    BedTable {
        name: "api",
        runs: &[
            &["api", "--members", "10000", "--seconds", "10"],
            &["api", "--members", "10000", "--postgres", "--seconds", "10"],
        ],

        rivals: false,
    },
];

impl BedTable {
    /// The table of this name.
    pub(crate) fn named(name: &str) -> anyhow::Result<&'static Self> {
        BED_TABLES.iter().find(|t| t.name == name).with_context(|| {
            let names: Vec<_> = BED_TABLES.iter().map(|t| t.name).collect();
            format!("no table {name:?}: the tables are {}", names.join(", "))
        })
    }

    fn markers(&self) -> (String, String) {
        (
            format!("<!-- xtask bench table {}: begin -->", self.name),
            format!("<!-- xtask bench table {}: end -->", self.name),
        )
    }

    /// The commands as a reader runs them.
    fn commands(&self) -> String {
        self.runs
            .iter()
            .map(|r| format!("`cyphonic-bed {}`", r.join(" ")))
            .collect::<Vec<_>>()
            .join(", then ")
    }
}

/// One Markdown table from the tables `printed` by a section's commands: the first's header,
/// then every one's rows.
///
/// # Errors
/// A command printed something other than one table, or a header unlike the first's.
fn join_tables(printed: &[String]) -> anyhow::Result<String> {
    let mut header: Option<(&str, &str)> = None;
    let mut out = String::new();
    for (n, text) in printed.iter().enumerate() {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let (Some(names), Some(rule)) = (lines.next(), lines.next()) else {
            bail!("command {} printed no table", n + 1);
        };
        if !names.starts_with('|') || !rule.starts_with("|-") && !rule.starts_with("|:") {
            bail!("command {} printed no table: {names:?}", n + 1);
        }
        match header {
            None => {
                header = Some((names, rule));
                let _ = writeln!(out, "{names}\n{rule}");
            }
            Some(h) if h == (names, rule) => {}
            Some((first, _)) => {
                bail!(
                    "command {} printed the header {names:?}, not {first:?}",
                    n + 1
                );
            }
        }
        for row in lines {
            if !row.starts_with('|') {
                bail!("command {} printed a line that is no row: {row:?}", n + 1);
            }
            let _ = writeln!(out, "{row}");
        }
    }
    if header.is_none() {
        bail!("no command");
    }
    Ok(out)
}

/// Which parts `cargo xtask bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parts {
    /// The criterion benchmarks.
    pub(crate) micro: bool,
    /// Plain routing against the tunnel, and the ordering ablation.
    pub(crate) e2e: bool,
    /// The adapter under a handshake flood.
    pub(crate) attack: bool,
    /// Many nodes against one adapter.
    pub(crate) peers: bool,
    /// Instructions per packet under callgrind.
    pub(crate) instructions: bool,
    /// Instructions per packet on aarch64 and x86_64 under qemu-user, the Pi 4's estimate.
    pub(crate) arm64: bool,
    /// Issue 24's latency rows.
    pub(crate) latency: bool,
    /// TCP over IPv6 beside IPv4 through one tunnel.
    pub(crate) ipv6: bool,
}
/// Packets per criterion iteration (benches/src/lib.rs `BURST`).
const BURST: f64 = 4096.0;
/// Packets per batch at the pipeline's default configuration.
const BATCH: f64 = 32.0;
/// Segments per coalesced frame in the offload benchmarks (benches/src/offload.rs `SEGMENTS`).
const SEGMENTS: f64 = 45.0;

/// Runs `parts` and writes `tables`; `base`: the commit before's daemons, a column of the
/// latency table.
pub(crate) fn run(
    write: bool,
    parts: Parts,
    tables: &[&BedTable],
    base: Option<&Path>,
) -> anyhow::Result<()> {
    let root = util::root();
    let mut sections = Vec::new();
    if parts.micro {
        let criterion_dir = root.join("target/criterion");
        // Stale results from an earlier run must not mix into this one's ratios.
        for group in [
            "seal",
            "open",
            "pipeline_overhead",
            "reorder_ring",
            "lan_dns",
            "lan_dhcp",
            "lan_dhcp_flood",
            "deferred_checksums",
            "filter",
        ] {
            let _ = std::fs::remove_dir_all(criterion_dir.join(group));
        }
        util::cargo(
            &root,
            &[
                "bench",
                "-p",
                "cyphonic-benches",
                "--bench",
                "pipeline",
                "--bench",
                "lan",
                "--bench",
                "offload",
                "--bench",
                "filter",
            ],
        )?;
        sections.push((owned(MICRO), render(&collect(&criterion_dir)?)?));
    }
    if parts.instructions {
        sections.push((owned(INSTRUCTIONS), crate::instructions::run(&root)?));
    }
    if parts.arm64 {
        sections.push((owned(ARM64), crate::arm64_instructions::run(&root)?));
    }
    if parts.e2e || parts.attack || parts.peers || parts.latency || parts.ipv6 || !tables.is_empty()
    {
        crate::bed::prerequisites()?;
        let bin = crate::bed::build_release(&root)?;
        let rivals = if tables.iter().any(|t| t.rivals) {
            Some(crate::rivals::install(&root)?)
        } else {
            None
        };
        // The bed measures and prints its figures as JSON; the Markdown is written here.
        let bed_with = |what: &str, args: &[&std::ffi::OsStr]| -> anyhow::Result<Vec<u8>> {
            let out = std::process::Command::new(bin.join("cyphonic-bed"))
                .arg(what)
                .args(args)
                .env("CYPHONIC_BIN_DIR", &bin)
                .envs(rivals.iter().map(|dir| ("CYPHONIC_RIVALS_DIR", dir)))
                .stderr(std::process::Stdio::inherit())
                .output()
                .with_context(|| format!("running cyphonic-bed {what}"))?;
            if !out.status.success() {
                bail!("cyphonic-bed {what} failed ({})", out.status);
            }
            Ok(out.stdout)
        };
        let bed = |what: &str| bed_with(what, &[]);
        if parts.e2e {
            let report = serde_json::from_slice(&bed("bench")?)
                .context("reading cyphonic-bed bench's report")?;
            sections.push((owned(E2E), crate::report::bench(&report)?));
        }
        if parts.attack {
            let report = serde_json::from_slice(&bed("attack")?)
                .context("reading cyphonic-bed attack's report")?;
            sections.push((owned(ATTACK), crate::report::attack(&report)?));
        }
        if parts.peers {
            let report = serde_json::from_slice(&bed("peers")?)
                .context("reading cyphonic-bed peers's report")?;
            sections.push((owned(PEERS), crate::report::peers(&report)?));
        }
        if parts.ipv6 {
            let report = serde_json::from_slice(&bed("ipv6")?)
                .context("reading cyphonic-bed ipv6's report")?;
            sections.push((owned(IPV6), crate::report::ipv6(&report)?));
        }
        if parts.latency {
            let mut args: Vec<&std::ffi::OsStr> =
                vec!["--setting".as_ref(), LATENCY_SETTING.as_ref()];
            if let Some(dir) = base {
                args.extend(["--base".as_ref(), dir.as_os_str()]);
            }
            let report = serde_json::from_slice(&bed_with("latency-table", &args)?)
                .context("reading cyphonic-bed latency-table's report")?;
            sections.push((owned(LATENCY), crate::report::latency(&report)?));
        }
        for table in tables {
            let started = std::time::Instant::now();
            let at = cyphonic_report::utc_now();
            let printed = table
                .runs
                .iter()
                .map(|run| {
                    let args: Vec<&std::ffi::OsStr> =
                        run[1..].iter().map(std::ffi::OsStr::new).collect();
                    String::from_utf8(bed_with(run[0], &args)?)
                        .with_context(|| format!("cyphonic-bed {} printed no text", run[0]))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let body = format!(
                "Measured {at} ({} min) on {}, Linux {}, at {}, release build: {}.\n\n{}",
                started.elapsed().as_secs().div_ceil(60),
                cyphonic_report::cpu(),
                cyphonic_report::kernel(),
                head_commit(&root),
                table.commands(),
                join_tables(&printed).with_context(|| format!("the table {}", table.name))?
            );
            sections.push((table.markers(), body));
        }
    }
    let path = root.join("docs/benchmarks.md");
    let mut doc =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for ((begin, end), body) in sections {
        if write {
            doc = replace_between(&doc, (&begin, &end), &body)?;
        } else {
            print!("{body}");
        }
    }
    if write {
        std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: updated {}", path.display());
    }
    Ok(())
}

fn owned((begin, end): (&str, &str)) -> (String, String) {
    (begin.to_owned(), end.to_owned())
}

/// The commit checked out, `+` when the tree has changes outside docs/ (what a table was
/// measured at: the tables written before it in the same sequence change the results page).
fn head_commit(root: &Path) -> String {
    match util::commit(root, 7, &[".", ":!docs"]) {
        Some((head, true)) => format!("{head}+"),
        Some((head, false)) => head,
        None => "an unknown commit".into(),
    }
}

#[derive(Deserialize)]
struct BenchmarkJson {
    group_id: String,
    function_id: Option<String>,
    value_str: Option<String>,
}

#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}

#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
}

/// Median nanoseconds per iteration, keyed by (group, function, value).
type Results = BTreeMap<(String, String, String), f64>;

fn collect(dir: &Path) -> anyhow::Result<Results> {
    let mut out = Results::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.ends_with("new/benchmark.json") {
                let meta: BenchmarkJson = serde_json::from_str(&std::fs::read_to_string(&path)?)
                    .with_context(|| format!("parsing {}", path.display()))?;
                let est: Estimates = serde_json::from_str(&std::fs::read_to_string(
                    path.with_file_name("estimates.json"),
                )?)
                .with_context(|| format!("parsing estimates next to {}", path.display()))?;
                out.insert(
                    (
                        meta.group_id,
                        meta.function_id.unwrap_or_default(),
                        meta.value_str.unwrap_or_default(),
                    ),
                    est.median.point_estimate,
                );
            }
        }
    }
    if out.is_empty() {
        bail!("no criterion results under {}", dir.display());
    }
    Ok(out)
}

fn get(r: &Results, group: &str, function: &str, value: &str) -> anyhow::Result<f64> {
    r.get(&(group.to_owned(), function.to_owned(), value.to_owned()))
        .copied()
        .with_context(|| format!("missing benchmark {group}/{function}/{value}"))
}

fn render(r: &Results) -> anyhow::Result<String> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let all = format!("{cores}w");
    let mut s = String::new();
    writeln!(
        s,
        "Measured {} on {}.",
        cyphonic_report::utc_now(),
        machine()
    )?;
    writeln!(s)?;
    for (group, what) in [
        (
            "seal",
            "Sealing with the engine's seal stage (`cyphonic_tunnel::SealStage`: peer, session and counter in order, then ChaCha20-Poly1305 in place on a worker)",
        ),
        (
            "open",
            "Opening with the engine's open stage (`cyphonic_tunnel::OpenStage`: replay pre-check in order, then authentication and decryption in place on a worker)",
        ),
    ] {
        writeln!(
            s,
            "{what}, packets per second (payload Gbit/s). The bare loop makes the same seal or open calls on one thread; ratios are to it, measured moments before in the same run."
        )?;
        writeln!(s)?;
        writeln!(
            s,
            "| AEAD | size (B) | bare loop, 1 thread | pipeline, 1 worker | 1 worker / bare | pipeline, {cores} workers | {cores} workers / bare |"
        )?;
        writeln!(s, "|---|---:|---:|---:|---:|---:|---:|")?;
        for backend in ["ring", "rustcrypto"] {
            for size in ["64", "512", "1420"] {
                let f = format!("{backend}/{size}");
                let bare = pps(get(r, group, &f, "bare")?);
                let one = pps(get(r, group, &f, "1w")?);
                let many = pps(get(r, group, &f, &all)?);
                let bytes: f64 = size.parse()?;
                writeln!(
                    s,
                    "| {backend} | {size} | {} | {} | {:.0}% | {} | {:.0}% |",
                    rate(bare, bytes),
                    rate(one, bytes),
                    100.0 * one / bare,
                    rate(many, bytes),
                    100.0 * many / bare
                )?;
            }
        }
        writeln!(s)?;
    }
    let noop_1 = get(r, "pipeline_overhead", "noop", "1w")? / BURST;
    let noop_n = get(r, "pipeline_overhead", "noop", &all)? / BURST;
    let ring_batch = get(r, "reorder_ring", "swapped_pairs", "")? / 128.0;
    writeln!(s, "| pipeline cost | per packet |")?;
    writeln!(s, "|---|---:|")?;
    writeln!(
        s,
        "| whole pipeline, do-nothing stage, 1 worker | {noop_1:.0} ns |"
    )?;
    writeln!(
        s,
        "| whole pipeline, do-nothing stage, {cores} workers | {noop_n:.0} ns |"
    )?;
    writeln!(
        s,
        "| reorder ring alone (half the batches wait), per batch {ring_batch:.1} ns | {:.2} ns |",
        ring_batch / BATCH
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "LAN services on the control thread (one core), a site with 200 devices:"
    )?;
    writeln!(s)?;
    writeln!(s, "| message | time each | per second, one core |")?;
    writeln!(s, "|---|---:|---:|")?;
    for (group, function, what) in [
        ("lan_dns", "own_zone_a", "DNS: A of a device, answered"),
        ("lan_dns", "own_ptr", "DNS: PTR of a device, answered"),
        ("lan_dns", "malformed", "DNS: 40 bytes of garbage, dropped"),
        (
            "lan_dhcp",
            "renewal",
            "DHCP: a renewal, ACK built (lease file write not included)",
        ),
    ] {
        let ns = get(r, group, function, "")?;
        writeln!(s, "| {what} | {} | {} |", duration(ns), per_second(ns))?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "DHCP under a DISCOVER flood, a /16 pool: one DISCOVER from a new device while the flood has offers out (choosing the address must not grow with them):"
    )?;
    writeln!(s)?;
    writeln!(s, "| offers out | time each | ratio to none out |")?;
    writeln!(s, "|---:|---:|---:|")?;
    let none = get(r, "lan_dhcp_flood", "discover_0_offers", "")?;
    for k in ["0", "1000", "10000"] {
        let ns = get(r, "lan_dhcp_flood", &format!("discover_{k}_offers"), "")?;
        writeln!(s, "| {k} | {} | {:.2} |", duration(ns), ns / none)?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "LAN-side offloads per segment, a 64 KiB GRO frame of {SEGMENTS:.0} TCP segments of 1448 bytes (one core, cache-warm):"
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| step | checksums whole | checksums deferred | deferred / whole |"
    )?;
    writeln!(s, "|---|---:|---:|---:|")?;
    for (whole, deferred, what) in [
        (
            "cut_full",
            "cut_partial",
            "capture: cut the frame into segments",
        ),
        (
            "run_verified",
            "run_deferred",
            "far end: find the run to merge for the LAN",
        ),
    ] {
        let w = get(r, "deferred_checksums", whole, "")? / SEGMENTS;
        let d = get(r, "deferred_checksums", deferred, "")? / SEGMENTS;
        writeln!(
            s,
            "| {what} | {} | {} | {:.0}% |",
            duration(w),
            duration(d),
            100.0 * d / w
        )?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "Per-device policy (crates/filter), per packet on one core, against the bare seal of {BURST:.0} packets of 1420 bytes in the same run (300 rules, the allowing one last):"
    )?;
    writeln!(s)?;
    writeln!(s, "| packet | time each | share of a seal |")?;
    writeln!(s, "|---|---:|---:|")?;
    let seal = get(r, "filter", "seal_1420_yardstick", "")? / BURST;
    for (function, what) in [
        (
            "established_10k_flows_300_rules",
            "a packet of one of 10,000 established flows",
        ),
        (
            "new_allowed_by_rule_300",
            "a new flow, allowed by rule 300 (all 300 about its destination)",
        ),
        (
            "new_allowed_by_rule_300_spread",
            "a new flow, allowed by rule 300 (the others about 299 other destinations)",
        ),
        (
            "new_denied_after_300_rules",
            "a new flow to a destination no rule names",
        ),
        ("seal_1420_yardstick", "sealing it (the yardstick)"),
    ] {
        let ns = get(r, "filter", function, "")? / BURST;
        writeln!(
            s,
            "| {what} | {} | {:.0}% |",
            duration(ns),
            100.0 * ns / seal
        )?;
    }
    Ok(s)
}

fn duration(ns: f64) -> String {
    if ns >= 1000.0 {
        format!("{:.2} µs", ns / 1000.0)
    } else {
        format!("{ns:.0} ns")
    }
}

fn per_second(ns: f64) -> String {
    let n = 1e9 / ns;
    if n >= 1e6 {
        format!("{:.1} M", n / 1e6)
    } else {
        format!("{:.0} k", n / 1e3)
    }
}

fn pps(ns_per_burst: f64) -> f64 {
    BURST / (ns_per_burst * 1e-9)
}

fn rate(pps: f64, bytes: f64) -> String {
    let gbit = pps * bytes * 8.0 / 1e9;
    if pps >= 1e6 {
        format!("{:.2} M ({gbit:.2})", pps / 1e6)
    } else {
        format!("{:.0} k ({gbit:.2})", pps / 1e3)
    }
}

fn machine() -> String {
    let rustc = util::output("rustc", &["--version"]).unwrap_or_default();
    format!(
        "{}, {} {}, {rustc}",
        cyphonic_report::cpu(),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

pub(crate) fn replace_between(
    doc: &str,
    (begin, end): (&str, &str),
    body: &str,
) -> anyhow::Result<String> {
    let (Some(b), Some(e)) = (doc.find(begin), doc.find(end)) else {
        bail!("the document lacks the markers {begin} / {end}");
    };
    if e < b {
        bail!("the document has its end marker before its begin marker");
    }
    Ok(format!("{}{begin}\n{body}{}", &doc[..b], &doc[e..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_the_tables_of_a_sections_commands_under_one_header() {
        let first = "| a | b |\n|---|---:|\n| x | 1 |\n".to_owned();
        let second = "\n| a | b |\n|---|---:|\n| y | 2 |\n| z | 3 |\n".to_owned();
        assert_eq!(
            join_tables(&[first.clone(), second]).unwrap(),
            "| a | b |\n|---|---:|\n| x | 1 |\n| y | 2 |\n| z | 3 |\n"
        );
        let other = "| a | c |\n|---|---:|\n| y | 2 |\n".to_owned();
        assert!(
            join_tables(&[first.clone(), other]).is_err(),
            "another header"
        );
        let chatter = "| a | b |\n|---|---:|\nround 0: 3 Gbit/s\n".to_owned();
        assert!(join_tables(&[chatter]).is_err(), "a line that is no row");
        assert!(join_tables(&["TCP1: 3 Gbit/s\n".to_owned()]).is_err());
        assert!(join_tables(&[]).is_err());
    }

    /// Every table `--table` writes has its markers in the results page, once, and a name of
    /// its own; and the page names each one's commands, so a reader can run them alone.
    #[test]
    fn every_bed_table_has_its_place_in_the_results_page() {
        let doc = std::fs::read_to_string(util::root().join("docs/benchmarks.md")).unwrap();
        for (i, t) in BED_TABLES.iter().enumerate() {
            let (begin, end) = t.markers();
            assert_eq!(doc.matches(&begin).count(), 1, "{begin}");
            assert_eq!(doc.matches(&end).count(), 1, "{end}");
            assert!(doc.find(&begin) < doc.find(&end), "{}", t.name);
            assert!(doc.contains(&format!("--table {}`", t.name)), "{}", t.name);
            assert!(!t.runs.is_empty() && t.runs.iter().all(|r| !r.is_empty()));
            assert_eq!(BedTable::named(t.name).unwrap(), t);
            assert!(BED_TABLES[..i].iter().all(|o| o.name != t.name));
        }
        assert!(BedTable::named("nothing").is_err());
    }

    #[test]
    fn replaces_only_between_markers() {
        let (b, e) = MICRO;
        let doc = format!("intro\n{b}\nold\n{e}\n{}\nkeep\n{}\noutro\n", E2E.0, E2E.1);
        let out = replace_between(&doc, MICRO, "new\n").unwrap();
        assert_eq!(
            out,
            format!("intro\n{b}\nnew\n{e}\n{}\nkeep\n{}\noutro\n", E2E.0, E2E.1)
        );
        assert!(replace_between("no markers", MICRO, "x").is_err());
    }

    #[test]
    fn renders_rates() {
        assert_eq!(rate(1_270_000.0, 1420.0), "1.27 M (14.43)");
        assert_eq!(rate(245_000.0, 64.0), "245 k (0.13)");
        assert_eq!(
            (duration(2669.0), per_second(2669.0)),
            ("2.67 µs".into(), "375 k".into())
        );
        assert_eq!(
            (duration(97.7), per_second(97.7)),
            ("98 ns".into(), "10.2 M".into())
        );
    }
}
