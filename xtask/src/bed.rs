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

/// Builds the adapter, the cloud (and CA tool), the node and the bed in release mode; returns
/// their directory.
///
/// # Errors
/// The build fails.
pub(crate) fn build_release(root: &Path) -> anyhow::Result<PathBuf> {
    util::cargo(
        root,
        &[
            "build",
            "--release",
            "--locked",
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
        ],
    )?;
    Ok(root.join("target/release"))
}
