//! `cargo xtask bench --instructions`: instructions per packet for seal, open, classify,
//! the legacy map, a VLAN's tag, the policy filter, segment and coalesce, counted by callgrind (benches/benches/instructions.rs, through
//! iai-callgrind), rendered into docs/benchmarks.md. The counts do not depend on how busy
//! the machine is, so a change in them is a change in the code.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::util;

/// The iai-callgrind library's version (Cargo.toml): its runner must be the same.
const RUNNER_VERSION: &str = "0.16.1";

/// What each benchmark function measures, for the table.
const OPERATIONS: [(&str, &str); 8] = [
    (
        "seal",
        "seal (counter, ChaCha20-Poly1305 in place, frame header)",
    ),
    (
        "open",
        "open (replay pre-check, ChaCha20-Poly1305 in place)",
    ),
    (
        "classify",
        "classify a LAN frame (anti-spoofing, MSS clamp, route decision)",
    ),
    (
        "legacy_map",
        "classify a fixed-address device's LAN frame (legacy map, then as above)",
    ),
    (
        "vlan_tag",
        "tag a frame from the tunnel for a VLAN (the packet moved four bytes on)",
    ),
    (
        "filter",
        "policy filter, 300 rules, 10,000 flows open (a flow's packet; a new flow's first)",
    ),
    (
        "segment",
        "segment: cut a GRO-merged 64 KiB TCP frame (per segment)",
    ),
    (
        "coalesce",
        "coalesce: find a run of TCP segments and merge its headers (per segment)",
    ),
];

/// One benchmark as iai-callgrind's JSON output gives it (the parts read here).
#[derive(Debug, Deserialize)]
struct Bench {
    function_name: String,
    id: Option<String>,
    profiles: Vec<Profile>,
}

#[derive(Debug, Deserialize)]
struct Profile {
    summaries: Summaries,
}

#[derive(Debug, Deserialize)]
struct Summaries {
    total: Total,
}

#[derive(Debug, Deserialize)]
struct Total {
    summary: serde_json::Value,
}

/// One row: the function, the case, packets per call, and the counts per packet.
#[derive(Debug, PartialEq)]
struct Row {
    function: String,
    case: String,
    instructions: f64,
    cycles: f64,
}

/// An event's count from a callgrind summary: `{"Left": n}` on a first run, `{"Both":
/// [new, old]}` after one.
fn count(summary: &serde_json::Value, event: &str) -> Option<u64> {
    let m = &summary["Callgrind"][event]["metrics"];
    m["Left"]["Int"]
        .as_u64()
        .or_else(|| m["Both"][0]["Int"].as_u64())
}

/// Parses the JSON lines of `cargo bench --bench instructions -- --output-format=json`.
fn rows(output: &str) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for line in output.lines().filter(|l| l.trim_start().starts_with('{')) {
        let b: Bench = serde_json::from_str(line).context("an iai-callgrind summary line")?;
        let id = b.id.unwrap_or_default();
        let (case, packets): (&str, u32) = id
            .rsplit_once("_x")
            .and_then(|(case, n)| Some((case, n.parse().ok()?)))
            .with_context(|| {
                format!(
                    "{}: the id {id:?} does not end in _x<packets>",
                    b.function_name
                )
            })?;
        let summary = &b
            .profiles
            .first()
            .with_context(|| format!("{}.{case}: no profile", b.function_name))?
            .summaries
            .total
            .summary;
        let per = |event: &str| -> anyhow::Result<f64> {
            #[expect(
                clippy::cast_precision_loss,
                reason = "instruction counts of one call: far below 2^52"
            )]
            let n = count(summary, event)
                .with_context(|| format!("{}.{case}: no {event} count", b.function_name))?
                as f64;
            Ok(n / f64::from(packets))
        };
        rows.push(Row {
            instructions: per("Ir")?,
            cycles: per("EstimatedCycles")?,
            case: case.to_owned(),
            function: b.function_name,
        });
    }
    if rows.is_empty() {
        bail!("no benchmark in the output");
    }
    Ok(rows)
}

/// The table, in [`OPERATIONS`]' order.
fn render(rows: &[Row], measured: &str) -> String {
    let mut out = format!(
        "Counted by callgrind ({measured}); the same on a busy machine as on an idle one. \
         Estimated cycles are iai-callgrind's model of the simulated caches (an L1 hit 1, \
         a last-level hit 5, a memory access 35); \
         valgrind runs the AVX2 code paths at most (no AVX-512).\n\n\
         | operation | case | instructions per packet | estimated cycles per packet |\n\
         |---|---|---:|---:|\n"
    );
    for (function, what) in OPERATIONS {
        for r in rows.iter().filter(|r| r.function == function) {
            let _ = writeln!(
                out,
                "| {what} | {} | {:.0} | {:.0} |",
                r.case, r.instructions, r.cycles
            );
        }
    }
    out
}

/// Runs the benchmark under callgrind and returns the table.
///
/// # Errors
/// valgrind is missing, the runner cannot be installed, or the benchmark fails.
pub(crate) fn run(root: &Path) -> anyhow::Result<String> {
    let valgrind = util::output("valgrind", &["--version"])
        .context("valgrind is missing (apt-get install valgrind)")?;
    let runner = util::output("iai-callgrind-runner", &["--version"]).unwrap_or_default();
    if !runner.contains(RUNNER_VERSION) {
        util::cargo(
            root,
            &[
                "install",
                "iai-callgrind-runner",
                "--version",
                RUNNER_VERSION,
                "--locked",
            ],
        )?;
    }
    let out = util::cargo_command()
        .args([
            "bench",
            "--locked",
            "-p",
            "cyphonic-benches",
            "--bench",
            "instructions",
            "--",
            "--output-format=json",
        ])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the instructions benchmark")?;
    if !out.status.success() {
        bail!("the instructions benchmark failed ({})", out.status);
    }
    let measured = format!(
        "{}, {}, iai-callgrind {RUNNER_VERSION}",
        cyphonic_report::utc_now(),
        valgrind
    );
    Ok(render(
        &rows(&String::from_utf8_lossy(&out.stdout))?,
        &measured,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: &str = r#"{"function_name":"seal","id":"ring_1420_x64","profiles":[{"summaries":{"total":{"summary":{"Callgrind":{"Ir":{"diffs":null,"metrics":{"Left":{"Int":587031}}},"EstimatedCycles":{"diffs":null,"metrics":{"Left":{"Int":688564}}}}}}}}]}"#;
    const AGAIN: &str = r#"{"function_name":"segment","id":"tcp_64k_x45","profiles":[{"summaries":{"total":{"summary":{"Callgrind":{"Ir":{"diffs":{"diff_pct":"0","factor":"1"},"metrics":{"Both":[{"Int":19779},{"Int":19000}]}},"EstimatedCycles":{"metrics":{"Both":[{"Int":33587},{"Int":1}]}}}}}}}]}"#;

    #[test]
    fn counts_are_divided_by_the_packets_the_id_names() {
        let r = rows(&format!("noise\n{FIRST}\n{AGAIN}\n")).unwrap();
        assert_eq!(
            r,
            [
                Row {
                    function: "seal".into(),
                    case: "ring_1420".into(),
                    instructions: 587_031.0 / 64.0,
                    cycles: 688_564.0 / 64.0,
                },
                Row {
                    function: "segment".into(),
                    case: "tcp_64k".into(),
                    instructions: 19_779.0 / 45.0,
                    cycles: 33_587.0 / 45.0,
                },
            ]
        );
        let table = render(&r, "today");
        assert!(table.contains("| ring_1420 | 9172 | 10759 |"), "{table}");
        assert!(table.find("seal (").unwrap() < table.find("segment:").unwrap());
    }

    #[test]
    fn an_id_without_its_packets_or_a_missing_count_is_an_error() {
        assert!(rows(&FIRST.replace("_x64", "")).is_err());
        assert!(rows(&FIRST.replace("\"Ir\"", "\"Dr\"")).is_err());
        assert!(rows("").is_err());
    }
}
