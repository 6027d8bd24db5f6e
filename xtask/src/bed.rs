//! What the two-site bed needs on this machine, and its release build.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::util;

/// Tools the bed runs, with the Debian package that brings each.
const TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ethtool", "ethtool"),
    ("ping", "iputils-ping"),
    ("iperf3", "iperf3"),
    ("nc", "netcat-openbsd"),
    ("sha256sum", "coreutils"),
    ("busybox", "busybox"),
    ("dhclient", "isc-dhcp-client"),
    ("dhcpcd", "dhcpcd-base"),
    ("dig", "dnsutils"),
    ("dnsmasq", "dnsmasq-base"),
    ("nft", "nftables"),
    // procps brings /bin/kill, with which the bed ends its processes by PID; `command -v kill`
    // would find the shell's builtin, so ask for `ps`, from the same package.
    ("ps", "procps"),
];

/// Checks for root and the tools; installs missing tools with apt-get when it can.
///
/// # Errors
/// Not root, or tools missing and not installable.
pub(crate) fn prerequisites() -> anyhow::Result<()> {
    if util::output("id", &["-u"]).as_deref() != Some("0") {
        bail!(
            "the bed builds network namespaces and needs root: run this as root (e.g. sudo -E cargo xtask ...)"
        );
    }
    util::install_missing("the bed", TOOLS)
}

/// The native build of `cargo xtask test`: every package with its dev-dependencies, every
/// target (libraries, programs, the bed's among them, tests and benchmarks). A build of some
/// packages, or without their tests, resolves the dependencies' features differently and
/// compiles dozens of them again (the bed's programs and the kernel tier's tests each did, 4
/// minutes apiece on a fresh machine), so every tier runs what this one build made.
///
/// The build is also the lint: the workspace's own crates are compiled by clippy's driver
/// with warnings denied ([`LINT`]), which is what `cargo clippy --all-targets -- -D
/// warnings` does in check mode. A separate clippy run checked every dependency once more:
/// 7 minutes of a cold run.
const TEST_BUILD: &[&str] = &["build", "--workspace", "--locked", "--all-targets"];

/// The environment of every cargo command that builds in `target` for `cargo xtask test`:
/// clippy's driver compiles the workspace's crates (not the dependencies: cargo's
/// `RUSTC_WORKSPACE_WRAPPER`), with its lints' warnings and the compiler's denied
/// (`CLIPPY_ARGS`, as `cargo clippy` passes them). The wrapper is part of what cargo hashes
/// for those crates: a command that builds the same units without it compiles them again,
/// so the build, the test listing and the doctests all take this.
const LINT: [(&str, &str); 2] = [
    ("RUSTC_WORKSPACE_WRAPPER", "clippy-driver"),
    (
        "CLIPPY_ARGS",
        "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
    ),
];

/// [`LINT`] as a command's environment.
pub(crate) fn lint_env() -> Vec<(String, String)> {
    LINT.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Proves that [`LINT`] denies a lint: clippy's driver, given it, must refuse a snippet that
/// compares a length with zero (`clippy::len_zero`). If clippy ever stopped reading
/// `CLIPPY_ARGS`, the build would pass with every lint a mere warning; this fails instead.
///
/// # Errors
/// The driver cannot run, or it accepted the snippet.
fn lint_denies(root: &Path) -> anyhow::Result<()> {
    let dir = root.join("target/lint-canary");
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("canary.rs");
    std::fs::write(
        &source,
        "pub fn empty(v: &[u8]) -> bool {\n    v.len() == 0\n}\n",
    )?;
    let out = Command::new(LINT[0].1)
        .args([
            "rustc",
            "--edition=2024",
            "--crate-type=lib",
            "--emit=metadata",
        ])
        .arg("--out-dir")
        .arg(&dir)
        .arg(&source)
        .env(LINT[1].0, LINT[1].1)
        .current_dir(root)
        .output()
        .context("running clippy's driver (rustup component add clippy)")?;
    let said = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        !out.status.success() && said.contains("clippy::len_zero"),
        "clippy's driver accepted a snippet that `clippy::len_zero` denies: the build would not \
         lint ({}): {said}",
        out.status
    );
    Ok(())
}

/// Builds [`TEST_BUILD`] under [`LINT`], after [`lint_denies`]; the bed's programs are then
/// in target/debug.
///
/// # Errors
/// The lint is not denied, or the build fails (a lint among the reasons).
pub(crate) fn build_for_tests(root: &Path) -> anyhow::Result<()> {
    lint_denies(root)?;
    util::cargo_with(root, TEST_BUILD, &lint_env())
}

/// Builds what `cargo build --release` builds (every package's libraries and programs, the
/// bed's among them: after that command this builds nothing); returns their directory.
///
/// # Errors
/// The build fails.
pub(crate) fn build_release(root: &Path) -> anyhow::Result<PathBuf> {
    util::cargo(root, &["build", "--locked", "--release"])?;
    Ok(root.join("target/release"))
}

/// A test program and the directory of its package (where `cargo test` runs it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Program {
    /// Its test target's name (`adapter` for e2e/tests/adapter.rs).
    pub(crate) name: String,
    /// The executable.
    pub(crate) path: PathBuf,
    /// Its package's directory.
    pub(crate) dir: PathBuf,
}

impl Program {
    /// The command that runs it with `args`, from its package's directory as `cargo test`
    /// would.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.args(args)
            .current_dir(&self.dir)
            .env("CARGO_MANIFEST_DIR", &self.dir);
        cmd
    }
}

/// The workspace's test programs, by tier.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Programs {
    /// Everything that needs no privileges: every package's tests but the e2e package's.
    pub(crate) unit: Vec<Program>,
    /// The kernel tier: the e2e package's, its library's unit tests (the bed's own logic:
    /// parsers, the soak's judgement and plot) first, then its integration tests.
    pub(crate) kernel: Vec<Program>,
}

/// The test programs the workspace build made, found through `cargo test --no-run` over
/// the same selection as that build, so nothing is compiled again (a selection such as
/// `--exclude cyphonic-e2e`, or `-p cyphonic-e2e`, would resolve other features and compile
/// the dependencies again).
///
/// # Errors
/// The programs cannot be listed, or there are none of a tier.
pub(crate) fn test_programs(root: &Path) -> anyhow::Result<Programs> {
    let out = util::cargo_command()
        .args([
            "test",
            "--workspace",
            "--locked",
            "--no-run",
            "--message-format=json",
        ])
        .envs(LINT)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("listing the test programs (cargo test --no-run)")?;
    anyhow::ensure!(out.status.success(), "cargo test --no-run failed");
    let programs = sort_programs(
        &String::from_utf8_lossy(&out.stdout),
        &root.join("e2e/Cargo.toml"),
    );
    anyhow::ensure!(
        !programs.unit.is_empty(),
        "no unit test programs were built"
    );
    anyhow::ensure!(
        !programs.kernel.is_empty(),
        "no e2e test programs were built"
    );
    Ok(programs)
}

/// Runs `programs` one after the other with `args`, each from its package's directory as
/// `cargo test` would.
///
/// # Errors
/// A program cannot be started, or a test fails.
pub(crate) fn run_programs(programs: &[Program], args: &[&str]) -> anyhow::Result<()> {
    for p in programs {
        util::run(
            &mut p.command(args),
            &format!("{} {}", p.path.display(), args.join(" ")),
        )?;
    }
    Ok(())
}

/// The test programs in cargo's JSON messages, split into the e2e package's (whose manifest
/// is `e2e`) and the rest, each in the order cargo built them (the e2e library's before its
/// integration tests). Only test builds have an executable; libraries and programs do not
/// count.
fn sort_programs(messages: &str, e2e: &Path) -> Programs {
    let artifacts: Vec<serde_json::Value> = messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .collect();
    let program = |m: &serde_json::Value| {
        let manifest = PathBuf::from(m["manifest_path"].as_str()?);
        Some(Program {
            name: m["target"]["name"].as_str()?.to_owned(),
            path: PathBuf::from(m["executable"].as_str()?),
            dir: manifest.parent()?.to_path_buf(),
        })
    };
    let is_kind = |m: &serde_json::Value, kind: &str| {
        m["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == kind))
    };
    let in_e2e = |m: &serde_json::Value| m["manifest_path"].as_str().map(Path::new) == Some(e2e);
    let unit = artifacts
        .iter()
        .filter(|m| !in_e2e(m))
        .filter_map(program)
        .collect();
    let e2e_lib = artifacts.iter().filter(|m| in_e2e(m) && is_kind(m, "lib"));
    let e2e_tests = artifacts.iter().filter(|m| in_e2e(m) && !is_kind(m, "lib"));
    let kernel = e2e_lib.chain(e2e_tests).filter_map(program).collect();
    Programs { unit, kernel }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiers_split_the_test_programs_by_package() {
        let messages = [
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["test"],"name":"cloud"},"profile":{"test":true},"executable":"/r/target/debug/deps/cloud-1"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/signal/Cargo.toml","target":{"kind":["test"],"name":"cloud"},"profile":{"test":true},"executable":"/r/target/debug/deps/cloud-2"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["lib"],"name":"cyphonic_e2e"},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["bin"],"name":"cyphonic-bed"},"profile":{"test":false},"executable":"/r/target/debug/cyphonic-bed"}"#,
            r#"{"reason":"build-finished","success":true}"#,
            "not json",
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["test"],"name":"node"},"profile":{"test":true},"executable":"/r/target/debug/deps/node-4"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/wire/Cargo.toml","target":{"kind":["lib"],"name":"cyphonic_wire"},"profile":{"test":true},"executable":"/r/target/debug/deps/cyphonic_wire-6"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/wire/Cargo.toml","target":{"kind":["lib"],"name":"cyphonic_wire"},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["lib"],"name":"cyphonic_e2e"},"profile":{"test":true},"executable":"/r/target/debug/deps/cyphonic_e2e-5"}"#,
        ]
        .join("\n");
        let p = |path: &str, dir: &str| Program {
            name: path
                .rsplit('/')
                .next()
                .and_then(|f| f.split('-').next())
                .unwrap()
                .to_owned(),
            path: PathBuf::from(path),
            dir: PathBuf::from(dir),
        };
        // Every other package's test programs in the unit tier, where they were built;
        // the e2e library's unit tests first (seconds), then its integration tests; never a
        // library or a program.
        assert_eq!(
            sort_programs(&messages, Path::new("/r/e2e/Cargo.toml")),
            Programs {
                unit: vec![
                    p("/r/target/debug/deps/cloud-2", "/r/crates/signal"),
                    p("/r/target/debug/deps/cyphonic_wire-6", "/r/crates/wire"),
                ],
                kernel: vec![
                    p("/r/target/debug/deps/cyphonic_e2e-5", "/r/e2e"),
                    p("/r/target/debug/deps/cloud-1", "/r/e2e"),
                    p("/r/target/debug/deps/node-4", "/r/e2e"),
                ],
            }
        );
    }
}
