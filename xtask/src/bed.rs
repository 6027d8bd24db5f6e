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

/// The packages and binaries the test bed runs: the adapter, the cloud (and CA tool), the
/// node and the bed itself.
const BED_BINARIES: &[&str] = &[
    "-p",
    "cyphonic-adapter",
    "-p",
    "cyphonic-cloud",
    "-p",
    "cyphonic-node",
    "-p",
    "cyphonic-e2e",
    "--bin",
    "cyphonic-adapter",
    "--bin",
    "cyphonic-cloud",
    "--bin",
    "cyphonic-node",
    "--bin",
    "cyphonic-bed",
];

/// Builds [`BED_BINARIES`] with `profile_args` (none: dev; `--release`).
///
/// # Errors
/// The build fails.
pub(crate) fn build(root: &Path, profile_args: &[&str]) -> anyhow::Result<()> {
    let mut args = vec!["build", "--locked"];
    args.extend_from_slice(profile_args);
    args.extend_from_slice(BED_BINARIES);
    util::cargo(root, &args)
}

/// Builds the bed's binaries in release mode; returns their directory.
///
/// # Errors
/// The build fails.
pub(crate) fn build_release(root: &Path) -> anyhow::Result<PathBuf> {
    build(root, &["--release"])?;
    Ok(root.join("target/release"))
}

/// The kernel tier's test programs (the e2e package's tests, which the workspace build
/// made), found through `cargo test --no-run` over the same selection as that build, so
/// nothing is compiled again (`cargo test -p cyphonic-e2e` would resolve other features and
/// compile the dependencies again).
///
/// # Errors
/// The programs cannot be listed, or there are none.
pub(crate) fn kernel_tier_programs(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
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
    let programs = test_programs(
        &String::from_utf8_lossy(&out.stdout),
        &root.join("e2e/Cargo.toml"),
    );
    anyhow::ensure!(!programs.is_empty(), "no e2e test programs were built");
    Ok(programs)
}

/// Runs the kernel tier's test `programs` one test at a time, from the package's directory
/// as `cargo test` would.
///
/// # Errors
/// A program cannot be started, or a test fails.
pub(crate) fn kernel_tier(root: &Path, programs: &[PathBuf]) -> anyhow::Result<()> {
    let e2e = root.join("e2e");
    for p in programs {
        util::run(
            Command::new(p)
                .arg("--test-threads=1")
                .current_dir(&e2e)
                .env("CARGO_MANIFEST_DIR", &e2e),
            &format!("{} --test-threads=1", p.display()),
        )?;
    }
    Ok(())
}

/// The test programs of the package whose manifest is `manifest`, from cargo's JSON
/// messages: its library's unit tests (the bed's own logic: parsers, the soak's judgement
/// and plot), then its integration tests, each in the order cargo built them. Only test
/// builds have an executable; the library itself and the bed's program do not count.
fn test_programs(messages: &str, manifest: &Path) -> Vec<PathBuf> {
    let artifacts: Vec<serde_json::Value> = messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact"
                && m["manifest_path"].as_str().map(Path::new) == Some(manifest)
                && m["profile"]["test"] == true
        })
        .collect();
    let of_kind = |kind: &'static str| {
        artifacts
            .iter()
            .filter(move |m| {
                m["target"]["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == kind))
            })
            .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
    };
    of_kind("lib").chain(of_kind("test")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_tier_runs_the_e2e_packages_test_programs_only() {
        let messages = [
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["test"],"name":"cloud"},"profile":{"test":true},"executable":"/r/target/debug/deps/cloud-1"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/signal/Cargo.toml","target":{"kind":["test"],"name":"cloud"},"profile":{"test":true},"executable":"/r/target/debug/deps/cloud-2"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["lib"],"name":"cyphonic_e2e"},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["bin"],"name":"cyphonic-bed"},"profile":{"test":false},"executable":"/r/target/debug/cyphonic-bed"}"#,
            r#"{"reason":"build-finished","success":true}"#,
            "not json",
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["test"],"name":"node"},"profile":{"test":true},"executable":"/r/target/debug/deps/node-4"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["lib"],"name":"cyphonic_e2e"},"profile":{"test":true},"executable":"/r/target/debug/deps/cyphonic_e2e-5"}"#,
        ]
        .join("\n");
        // The library's unit tests first (seconds), then the integration tests; never the
        // bed's program or another package's tests.
        assert_eq!(
            test_programs(&messages, Path::new("/r/e2e/Cargo.toml")),
            [
                PathBuf::from("/r/target/debug/deps/cyphonic_e2e-5"),
                PathBuf::from("/r/target/debug/deps/cloud-1"),
                PathBuf::from("/r/target/debug/deps/node-4")
            ]
        );
    }
}
