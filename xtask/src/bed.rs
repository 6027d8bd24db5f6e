//! What the two-site bed needs on this machine, and its release build.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;

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
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(tool, _)| util::output("sh", &["-c", &format!("command -v {tool}")]).is_none())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if util::output("sh", &["-c", "command -v apt-get"]).is_none() {
        bail!("missing tools; install the packages: {}", missing.join(" "));
    }
    eprintln!(
        "xtask: installing what the bed needs: {}",
        missing.join(" ")
    );
    util::run(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    util::run(
        &mut install,
        &format!("apt-get install {}", missing.join(" ")),
    )
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
