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

/// The native build of `cargo xtask test`: every package with its dev-dependencies, libraries,
/// programs (the bed's among them) and tests. A build of some packages, or without their
/// tests, resolves the dependencies' features differently and compiles dozens of them again
/// (the bed's programs and the kernel tier's tests each did, 4 minutes apiece on a fresh
/// machine), so every tier runs what this one build made.
const TEST_BUILD: &[&str] = &[
    "build",
    "--workspace",
    "--locked",
    "--lib",
    "--bins",
    "--tests",
];

/// Builds [`TEST_BUILD`]; the bed's programs are then in target/debug.
///
/// # Errors
/// The build fails.
pub(crate) fn build_for_tests(root: &Path) -> anyhow::Result<()> {
    util::cargo(root, TEST_BUILD)
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
