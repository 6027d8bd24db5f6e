//! All project automation, run as `cargo xtask <command>` (the alias is in .cargo/config.toml).
//!
//! - `test`: formatting, lints, every test of the workspace, the tidy checks, and that the fuzz
//!   targets build. What CI runs (through .ci/run).
//! - `bench`: criterion benchmarks, release build; writes the tables into docs/benchmarks.md.
//! - `fuzz`: runs each cargo-fuzz target for a while (nightly toolchain and cargo-fuzz).
//! - `tidy`: the repository consistency checks alone (they also run inside `cargo test`).
//! - `demo`: the main job on embedded defaults.

#![forbid(unsafe_code)]
// A command-line tool: printing reports to stdout is its job.
#![allow(clippy::print_stdout)]

mod bed;
mod bench;
mod fuzz;
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
        /// Plain routing against the tunnel, and the ordering ablation.
        #[arg(long)]
        e2e: bool,
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
            peers,
        } => {
            let all = !(micro || e2e || peers);
            bench::run(
                !no_write,
                bench::Parts {
                    micro: micro || all,
                    e2e: e2e || all,
                    peers: peers || all,
                },
            )
        }
        Command::Fuzz { seconds, targets } => fuzz::run(seconds, &targets),
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
    util::cargo(
        &root,
        &[
            "build",
            "--locked",
            "-p",
            "cyphonic-adapter",
            "-p",
            "cyphonic-cloud",
            "-p",
            "cyphonic-node",
        ],
    )?;
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
