//! All project automation, run as `cargo xtask <command>` (the alias is in .cargo/config.toml).
//!
//! - `test`: formatting, lints, every test of the workspace, the tidy checks, and that the fuzz
//!   targets build. What CI runs (through .ci/run).
//! - `bench`: criterion benchmarks, release build; writes the tables into docs/benchmarks.md.
//! - `fuzz`: runs each cargo-fuzz target for a while (nightly toolchain and cargo-fuzz).
//! - `tidy`: the repository consistency checks alone (they also run inside `cargo test`).
//! - `demo`: the main job on embedded defaults.
//! - `dist`: builds and packages for x86_64 or the Raspberry Pi 4 (.deb and tarball).

#![forbid(unsafe_code)]
// A command-line tool: printing reports to stdout is its job.
#![allow(clippy::print_stdout)]

mod bed;
mod bench;
mod cross;
mod dist;
mod fuzz;
mod report;
mod tidy;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "cyphonic project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Format check, clippy with warnings denied, unit tests with tidy checks, the real-kernel
    /// tier (root), fuzz targets build.
    Test,
    /// Run the benchmarks (release) and update docs/benchmarks.md: criterion (pipeline,
    /// AEAD), end to end on the two-site bed, and many nodes against one adapter (needs root).
    /// Without a selection, all of them.
    Bench {
        /// Print the tables instead of writing them into docs/benchmarks.md.
        #[arg(long)]
        no_write: bool,
        /// The criterion benchmarks.
        #[arg(long)]
        micro: bool,
        /// Plain routing against the tunnel, the ordering ablation, and the adapter under a
        /// handshake flood.
        #[arg(long)]
        e2e: bool,
        /// Only the adapter under a handshake flood (part of `--e2e`).
        #[arg(long)]
        attack: bool,
        /// Many nodes against one adapter.
        #[arg(long)]
        peers: bool,
    },
    /// Run the cargo-fuzz targets (needs the nightly toolchain; installs cargo-fuzz if absent).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Targets to run (default: all).
        targets: Vec<String>,
    },
    /// Build the three programs for a target and package them: a .deb (binaries, systemd
    /// units, example configurations, docs, a postinst for the service user) and a tarball,
    /// in target/dist.
    Dist {
        /// The target: x86_64-unknown-linux-gnu, or aarch64-unknown-linux-gnu for the
        /// Raspberry Pi 4 (needs its Rust standard library and gcc-aarch64-linux-gnu).
        #[arg(long, default_value = "x86_64-unknown-linux-gnu")]
        target: String,
        /// Cargo profile: release for a package to ship, dev for a quick check.
        #[arg(long, default_value = "release")]
        profile: String,
        /// Then install the .deb into a scratch root and check what landed (as CI does).
        #[arg(long)]
        check_install: bool,
    },
    /// The Raspberry Pi's architecture here: the unit tier built for aarch64 and run under
    /// qemu-user, then the short demo with the aarch64 builds of the cloud and the node
    /// under the emulator (part of `test`).
    Arm64 {
        /// Only the unit tier.
        #[arg(long)]
        unit: bool,
    },
    /// Check repository consistency: ARCHITECTURE.md code map, crate layering, lint headers.
    Tidy,
    /// Run the main job on embedded defaults.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Test => test(),
        Command::Bench {
            no_write,
            micro,
            e2e,
            attack,
            peers,
        } => {
            let all = !(micro || e2e || attack || peers);
            bench::run(
                !no_write,
                bench::Parts {
                    micro: micro || all,
                    e2e: e2e || all,
                    attack: attack || e2e || all,
                    peers: peers || all,
                },
            )
        }
        Command::Fuzz { seconds, targets } => fuzz::run(seconds, &targets),
        Command::Dist {
            target,
            profile,
            check_install,
        } => dist::run(&target, &profile).and_then(|deb| {
            if check_install {
                dist::check_install(&deb)
            } else {
                Ok(())
            }
        }),
        Command::Arm64 { unit } => arm64(unit),
        Command::Tidy => tidy::run(),
        Command::Demo => demo(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn test() -> anyhow::Result<()> {
    let root = util::root();
    util::cargo(&root, &["fmt", "--all", "--", "--check"])?;
    util::cargo(
        &root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // Unit tier: everything that needs no privileges.
    util::cargo(
        &root,
        &[
            "test",
            "--workspace",
            "--exclude",
            "cyphonic-e2e",
            "--locked",
        ],
    )?;
    // The kernel tier runs the real binaries.
    bed::build(&root, &[])?;
    // Kernel tier: network namespaces, veth, AF_PACKET, the real binaries and real tools.
    // Needs root; fails (never skips) without it. One test at a time: they share the CPUs
    // with the daemons they start.
    util::cargo(
        &root,
        &[
            "test",
            "-p",
            "cyphonic-e2e",
            "--locked",
            "--",
            "--test-threads=1",
        ],
    )?;
    // The short demo, from the binaries just built: what `cargo xtask demo` shows, with
    // shorter measurements.
    util::run(
        std::process::Command::new(root.join("target/debug/cyphonic-bed"))
            .args(["demo", "--short"])
            .env("CYPHONIC_BIN_DIR", root.join("target/debug")),
        "cyphonic-bed demo --short",
    )?;
    // The package: the x86_64 .deb, from the binaries just built (dev profile: the packaging
    // is what is checked here), installed into a scratch root.
    if std::env::consts::ARCH == "x86_64" {
        let deb = dist::package(
            "x86_64-unknown-linux-gnu",
            &root.join("target/debug"),
            "dev",
        )?;
        dist::check_install(&deb)?;
    }
    // The Pi's architecture: the unit tier under the emulator, the demo with the emulated
    // cloud and node, and the arm64 package (of the programs the unit tier built).
    let arm64 = cross::test(&root)?;
    cross::smoke(&root, &arm64, &root.join("target/debug"))?;
    let deb = dist::package(cross::TRIPLE, &arm64, "dev")?;
    dist::check_install(&deb)?;
    // The fuzz targets live outside the workspace (cargo-fuzz builds them with nightly and
    // sanitizers); make sure they still compile against the current APIs.
    // Sharing the target directory reuses the workspace's compiled dependencies.
    util::cargo(
        &root,
        &[
            "check",
            "--manifest-path",
            "fuzz/Cargo.toml",
            "--bins",
            "--target-dir",
            "target",
        ],
    )?;
    eprintln!("xtask: all checks passed");
    Ok(())
}

/// The aarch64 tier: the unit tests under the emulator, then (unless `unit_only`) the short
/// demo by the emulated programs, with the bed's own tools built for this machine.
fn arm64(unit_only: bool) -> anyhow::Result<()> {
    let root = util::root();
    let arm64 = cross::test(&root)?;
    if !unit_only {
        bed::prerequisites()?;
        bed::build(&root, &[])?;
        cross::smoke(&root, &arm64, &root.join("target/debug"))?;
    }
    Ok(())
}

fn demo() -> anyhow::Result<()> {
    let root = util::root();
    bed::prerequisites()?;
    let bin = bed::build_release(&root)?;
    util::run(
        std::process::Command::new(bin.join("cyphonic-bed"))
            .arg("demo")
            .env("CYPHONIC_BIN_DIR", &bin),
        "cyphonic-bed demo",
    )
}
