//! `cargo xtask fuzz`: every cargo-fuzz target for a bounded time.

use anyhow::{Context, bail};

use crate::util;

/// Runs `targets` (all when empty) for `seconds` each with the nightly toolchain.
pub(crate) fn run(seconds: u64, targets: &[String]) -> anyhow::Result<()> {
    let root = util::root();
    if util::output("rustup", &["run", "nightly", "rustc", "--version"]).is_none() {
        bail!("cargo-fuzz needs a nightly toolchain (`rustup toolchain install nightly`)");
    }
    if util::output("rustup", &["run", "nightly", "cargo", "fuzz", "--version"]).is_none() {
        nightly_cargo(&root, &["install", "cargo-fuzz", "--locked"])
            .context("installing cargo-fuzz")?;
    }
    let all = list(&root)?;
    let chosen: Vec<String> = if targets.is_empty() {
        all
    } else {
        targets.to_vec()
    };
    let max_time = format!("-max_total_time={seconds}");
    for target in &chosen {
        nightly_cargo(
            &root,
            &["fuzz", "run", target, "--", &max_time, "-rss_limit_mb=2048"],
        )?;
    }
    Ok(())
}

/// `cargo` of the nightly toolchain. Inside `cargo xtask`, `cargo +nightly` does not work:
/// `$CARGO` is the pinned toolchain's own binary, not rustup's proxy.
fn nightly_cargo(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("rustup");
    cmd.args(["run", "nightly", "cargo"])
        .args(args)
        .current_dir(dir);
    // The pinned toolchain's variables must not leak into the nightly build.
    for var in [
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTUP_TOOLCHAIN",
        "CARGO_MANIFEST_DIR",
    ] {
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
