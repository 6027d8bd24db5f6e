//! `cargo xtask fuzz`: every cargo-fuzz target for a bounded time.

use anyhow::{Context, bail};

use crate::util;

/// Where the table of the last run goes.
const DOC: &str = "docs/fuzzing.md";
const MARKERS: (&str, &str) = ("<!-- xtask fuzz: begin -->", "<!-- xtask fuzz: end -->");

/// What one target's run showed (libFuzzer's final statistics).
#[derive(Debug, Default, PartialEq)]
struct Ran {
    executions: u64,
    per_second: u64,
    /// Edges covered (libFuzzer's `cov:`).
    coverage: u64,
    /// Inputs in the corpus at the end.
    corpus: u64,
}

/// Reads libFuzzer's output: the last `cov:`/`corp:`/`exec/s:` status line and the final
/// `stat::number_of_executed_units`.
fn parse(log: &str) -> Ran {
    let mut ran = Ran::default();
    let field = |line: &str, key: &str| -> Option<u64> {
        let at = line.find(key)? + key.len();
        line[at..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    for line in log.lines() {
        if let Some(c) = field(line, "cov:") {
            ran.coverage = c;
        }
        if let Some(c) = field(line, "corp:") {
            ran.corpus = c;
        }
        if let Some(e) = field(line, "exec/s:") {
            ran.per_second = e;
        }
        if let Some(n) = field(line, "stat::number_of_executed_units:") {
            ran.executions = n;
        }
    }
    ran
}

/// Runs `targets` (all when empty) for `seconds` each with the nightly toolchain, each from
/// its corpus and its checked-in seeds (`fuzz/seeds/<target>`), and writes what each did into
/// docs/fuzzing.md (when all ran).
pub(crate) fn run(seconds: u64, targets: &[String]) -> anyhow::Result<()> {
    let root = util::root();
    if util::output("rustup", &["run", "nightly", "rustc", "--version"]).is_none() {
        bail!("cargo-fuzz needs a nightly toolchain (`rustup toolchain install nightly`)");
    }
    if util::output("rustup", &["run", "nightly", "cargo", "fuzz", "--version"]).is_none() {
        nightly_cargo(&root, &["install", "cargo-fuzz", "--locked"], None)
            .context("installing cargo-fuzz")?;
    }
    let all = list(&root)?;
    let chosen: Vec<String> = if targets.is_empty() {
        all.clone()
    } else {
        targets.to_vec()
    };
    let max_time = format!("-max_total_time={seconds}");
    let logs = root.join("target/fuzz-logs");
    std::fs::create_dir_all(&logs)?;
    let mut rows = Vec::new();
    for target in &chosen {
        let corpus = format!("fuzz/corpus/{target}");
        std::fs::create_dir_all(root.join(&corpus))?;
        let seeds = format!("fuzz/seeds/{target}");
        let mut args = vec!["fuzz", "run", target.as_str(), corpus.as_str()];
        if root.join(&seeds).is_dir() {
            args.push(&seeds);
        }
        args.extend([
            "--",
            &max_time,
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
        ]);
        let log = logs.join(format!("{target}.log"));
        let result = nightly_cargo(&root, &args, Some(&log));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Err(e) = result {
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("{e}\n{}", tail.join("\n"));
        }
        let ran = parse(&text);
        eprintln!("xtask: {target}: {ran:?}");
        rows.push((target.clone(), ran));
    }
    if chosen.len() == all.len() {
        let mut body = format!(
            "Each target run for {seconds} s on {} ({}), from its corpus and seeds, {}.\n\n",
            cyphonic_report::cpu(),
            util::output("rustup", &["run", "nightly", "rustc", "--version"]).unwrap_or_default(),
            cyphonic_report::utc_now(),
        );
        body.push_str("| target | executions | per second | edges covered | corpus |\n");
        body.push_str("|---|---:|---:|---:|---:|\n");
        for (t, r) in &rows {
            body.push_str(&format!(
                "| `{t}` | {} | {} | {} | {} |\n",
                r.executions, r.per_second, r.coverage, r.corpus
            ));
        }
        let path = root.join(DOC);
        let doc = std::fs::read_to_string(&path).with_context(|| format!("reading {DOC}"))?;
        std::fs::write(&path, crate::bench::replace_between(&doc, MARKERS, &body)?)?;
        eprintln!("xtask: updated {}", path.display());
    }
    Ok(())
}

/// `cargo` of the nightly toolchain. Inside `cargo xtask`, `cargo +nightly` does not work:
/// `$CARGO` is the pinned toolchain's own binary, not rustup's proxy.
/// With `log`, its output goes to that file instead of the terminal.
fn nightly_cargo(
    dir: &std::path::Path,
    args: &[&str],
    log: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("rustup");
    if let Some(log) = log {
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdout(file.try_clone()?).stderr(file);
    }
    cmd.args(["run", "nightly", "cargo"])
        .args(args)
        .current_dir(dir);
    // The pinned toolchain's variables must not leak into the nightly build.
    util::forget_own_package(&mut cmd);
    for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
        cmd.env_remove(var);
    }
    util::run(&mut cmd, &format!("cargo +nightly {}", args.join(" ")))
}

/// The targets declared in fuzz/Cargo.toml.
fn list(root: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(root.join("fuzz/Cargo.toml")).context("reading fuzz/Cargo.toml")?;
    let manifest: toml::Table = toml::from_str(&text).context("parsing fuzz/Cargo.toml")?;
    let bins = manifest
        .get("bin")
        .and_then(toml::Value::as_array)
        .context("fuzz/Cargo.toml has no [[bin]] targets")?;
    Ok(bins
        .iter()
        .filter_map(|b| b.get("name")?.as_str().map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzers_final_figures() {
        let log = "#2\tINITED cov: 10 ft: 11 corp: 3/40b exec/s: 0 rss: 30Mb\n\
                   #1605112\tDONE   cov: 2782 ft: 5573 corp: 1636/94Kb lim: 2446 exec/s: 76433 rss: 524Mb\n\
                   Done 1605112 runs in 21 second(s)\n\
                   stat::number_of_executed_units: 1605112\n";
        assert_eq!(
            parse(log),
            Ran {
                executions: 1_605_112,
                per_second: 76_433,
                coverage: 2782,
                corpus: 1636,
            }
        );
    }
}
