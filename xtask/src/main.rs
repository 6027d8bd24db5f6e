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

mod arm64_instructions;
mod background;
mod bed;
mod bench;
mod cross;
mod deb;
mod dist;
mod emulator;
mod fuzz;
mod image;
mod instructions;
mod lanes;
mod previous;
mod repo;
mod report;
mod rivals;
mod tidy;
mod util;
mod vm;

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
        /// Instructions per packet under callgrind (needs valgrind; installs
        /// iai-callgrind-runner if missing).
        #[arg(long)]
        instructions: bool,
        /// Instructions per packet for seal and open on aarch64 (the Pi's core, modelled)
        /// and x86_64 under qemu-user with a counting plugin, and the Pi 4's estimate
        /// (installs qemu-user if missing).
        #[arg(long)]
        arm64: bool,
        /// Issue 24's latency rows: 1,000 pings idle and under one TCP stream (its ends at
        /// default and at idle priority), plain routing against the tunnel at its defaults
        /// and with `realtime_priority = 10`, two alternating rounds.
        #[arg(long)]
        latency: bool,
        /// TCP over IPv6 beside IPv4 through one tunnel, the same two hosts, the families
        /// alternating.
        #[arg(long)]
        ipv6: bool,
        /// A results section whose table the bed prints (impair, bursts, node, ha,
        /// relay-stream, policy, legacy, members, swarm, api: docs/benchmarks.md names each
        /// one's commands); repeatable. A whole `cargo xtask bench` runs them all (each one's
        /// line in the page says how long it took).
        #[arg(long, value_name = "NAME")]
        table: Vec<String>,
        /// For `--latency`: a directory holding the commit before's three daemons, run as a
        /// column of their own (the rows' "2x over the commit before").
        #[arg(long, value_name = "DIR")]
        base: Option<std::path::PathBuf>,
    },
    /// Run the cargo-fuzz targets (needs the nightly toolchain; installs cargo-fuzz if absent).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Targets to run (default: all).
        targets: Vec<String>,
    },
    /// Build the three programs for a target and package them, in `target/dist/<arch>`: a
    /// .deb per program (binary, unit, configuration, maintainer scripts), cyphonic-common
    /// (the service user, shared directories, documents) and a tarball of the same files.
    Dist {
        /// The target: x86_64-unknown-linux-gnu, or aarch64-unknown-linux-gnu for the
        /// Raspberry Pi 4 (needs its Rust standard library and gcc-aarch64-linux-gnu).
        #[arg(long, default_value = "x86_64-unknown-linux-gnu")]
        target: String,
        /// Cargo profile: release for a package to ship, dev for a quick check.
        #[arg(long, default_value = "release")]
        profile: String,
        /// Package the programs already built in this directory instead of building them.
        #[arg(long, value_name = "DIR")]
        prebuilt: Option<std::path::PathBuf>,
        /// Then lint the packages and install, upgrade, remove and purge them in a scratch
        /// root, checking each step, and (amd64) install from a signed apt repository of
        /// them, as CI does; with --prebuilt, package twice first and require the same
        /// files.
        #[arg(long)]
        check_install: bool,
        /// Then install each program with cyphonic-common in a scratch root of its own and
        /// run the three as shipped: their /etc/cyphonic files filled in where they say so,
        /// as the service user under their units; enrollment, renewal, a restart (as CI
        /// does; needs root and target/debug/cyphonic-bed; this machine's architecture).
        #[arg(long)]
        as_shipped: bool,
        /// Then make an apt repository of the packages in `target/dist/<arch>/repo`, signed
        /// with this OpenPGP key (an id or fingerprint gpg knows; `GNUPGHOME` chooses the
        /// keyring), its public half exported there for `signed-by=`.
        #[arg(long, value_name = "KEY")]
        sign_with: Option<String>,
        /// Then upgrade the packages in this directory (an earlier release's, amd64) to
        /// these with apt, from a repository signed by a throwaway key, in a scratch root:
        /// no question asked, edits kept, services restarted (as CI does from the release
        /// before's).
        #[arg(long, value_name = "DIR")]
        upgrade_from: Option<std::path::PathBuf>,
    },
    /// The Raspberry Pi's architecture here: the unit tier built for aarch64 and run under
    /// qemu-user, then the short demo with the aarch64 build of the node under the emulator,
    /// then the aarch64 adapter in an arm64 machine under qemu-system-aarch64 (part of
    /// `test`).
    Arm64 {
        /// Only the unit tier.
        #[arg(long)]
        unit: bool,
        /// Only the arm64 machine: the adapter's aarch64 build, as the tier built it last,
        /// in an arm64 kernel under qemu-system-aarch64, serving the bed's site A.
        #[arg(long, conflicts_with = "unit")]
        machine: bool,
    },
    /// Build the Raspberry Pi 4 SD-card image (Debian bookworm arm64, the Pi's firmware,
    /// U-Boot and two root slots for A/B updates with RAUC, the adapter's arm64 packages,
    /// SSH off, first boot from the boot partition's cyphonic/ folder) in target/image/,
    /// with the signed update bundle of its root beside it. Needs root; installs mmdebstrap,
    /// dosfstools, mtools, fdisk, qemu-user-static, u-boot-tools, rauc and squashfs-tools
    /// with apt-get when they are missing.
    Image {
        /// The arm64 packages to install (default: built now, as `dist --target
        /// aarch64-unknown-linux-gnu` does).
        #[arg(long, value_name = "DIR")]
        packages: Option<std::path::PathBuf>,
        /// Where to write the image.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
        /// The key that signs the update bundle (PEM), beside the image; the image's RAUC
        /// keyring trusts its certificate (default: a development key kept in
        /// target/image/bundle-key/).
        #[arg(long, value_name = "FILE", requires = "bundle_cert")]
        bundle_key: Option<std::path::PathBuf>,
        /// The certificate of `--bundle-key` (PEM).
        #[arg(long, value_name = "FILE", requires = "bundle_key")]
        bundle_cert: Option<std::path::PathBuf>,
        /// Then boot it under qemu-system-aarch64 in the bed and check that the adapter
        /// comes up from the boot partition's files, leases an address and reaches a second
        /// adapter; that a card with a token enrolls; and that an update to the bundle
        /// sticks while a bad one rolls back.
        #[arg(long)]
        check: bool,
    },
    /// The soak (release builds, needs root): the cloud, two adapters and a node on the bed
    /// for hours, with devices coming and going, names, traffic bursts, rekeys every 30 s,
    /// restarts of the cloud and an adapter, loss switched on and off; every daemon's memory,
    /// open files, threads and buffers sampled each minute into target/soak/. Fails on a
    /// stall or on growth.
    Soak {
        /// Hours to run.
        #[arg(long, default_value_t = 2.0)]
        hours: f64,
        /// Minutes to run instead (a short check: at least 8, for the warm-up and the six
        /// samples growth is judged on).
        #[arg(long)]
        minutes: Option<u64>,
    },
    /// Build the release before (the commit xtask/src/previous.rs names) into
    /// target/previous/bin, for the kernel tier's test of members a release apart (part of
    /// `test`; run it before that test alone).
    Previous,
    /// Check repository consistency: ARCHITECTURE.md code map, crate layering, lint headers.
    Tidy,
    /// Run the main job on embedded defaults.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Test => test(),
        Command::Previous => previous::build(&util::root()).map(|bin| {
            eprintln!(
                "xtask: the release before's programs are in {}",
                bin.display()
            );
        }),
        Command::Bench {
            no_write,
            micro,
            e2e,
            attack,
            peers,
            instructions,
            arm64,
            latency,
            ipv6,
            table,
            base,
        } => {
            let all = !(micro
                || e2e
                || attack
                || peers
                || instructions
                || arm64
                || latency
                || ipv6
                || !table.is_empty());
            let tables = if all {
                Ok(bench::BED_TABLES.iter().collect())
            } else {
                table
                    .iter()
                    .map(|name| bench::BedTable::named(name))
                    .collect::<anyhow::Result<Vec<_>>>()
            };
            tables.and_then(|tables| {
                bench::run(
                    !no_write,
                    bench::Parts {
                        micro: micro || all,
                        e2e: e2e || all,
                        attack: attack || e2e || all,
                        peers: peers || all,
                        instructions: instructions || all,
                        arm64: arm64 || all,
                        latency: latency || all,
                        ipv6: ipv6 || all,
                    },
                    &tables,
                    base.as_deref(),
                )
            })
        }
        Command::Fuzz { seconds, targets } => fuzz::run(seconds, &targets),
        Command::Dist {
            target,
            profile,
            prebuilt,
            check_install,
            as_shipped,
            sign_with,
            upgrade_from,
        } => match prebuilt {
            // As CI does: twice, and the two must be the same files.
            Some(bins) if check_install => dist::package_reproducibly(&target, &bins, &profile),
            Some(bins) => dist::package(&target, &bins, &profile),
            None => dist::run(&target, &profile),
        }
        .and_then(|debs| {
            if check_install {
                deb::lint(&debs)?;
                deb::check_install(&debs)?;
                if target == "x86_64-unknown-linux-gnu" {
                    let dir = debs
                        .first()
                        .and_then(|d| d.parent())
                        .ok_or_else(|| anyhow::anyhow!("no package made"))?;
                    deb::check_repository(&debs, &dir.join("repo"))?;
                }
            }
            if as_shipped {
                deb::run_as_shipped(&debs, &util::root().join("target/debug/cyphonic-bed"))?;
            }
            if let Some(key) = sign_with {
                let dir = debs
                    .first()
                    .and_then(|d| d.parent())
                    .ok_or_else(|| anyhow::anyhow!("no package made"))?;
                let arch = dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("amd64")
                    .to_owned();
                let signer = repo::Signer { key, home: None };
                repo::make(&debs, &[&arch, "all"], &dir.join("repo"), &signer)?;
            }
            if let Some(from) = upgrade_from {
                let dir = debs
                    .first()
                    .and_then(|d| d.parent())
                    .ok_or_else(|| anyhow::anyhow!("no package made"))?;
                deb::check_upgrade(&dist::debs_in(&from)?, &debs, &dir.join("upgrade-repo"))?;
            }
            Ok(())
        }),
        Command::Arm64 { unit, machine } => arm64(unit, machine),
        Command::Image {
            packages,
            out,
            bundle_key,
            bundle_cert,
            check,
        } => image::run(
            packages,
            out,
            bundle_key
                .zip(bundle_cert)
                .map(|(key, cert)| image::Signer { key, cert }),
            check,
        ),
        Command::Tidy => tidy::run(),
        Command::Demo => demo(),
        Command::Soak { hours, minutes } => soak(minutes.map_or_else(
            || {
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "hours of a soak: small and positive"
                )]
                let secs = (hours.max(0.0) * 3600.0) as u64;
                secs
            },
            |m| m * 60,
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask soak`: the release builds, then `cyphonic-bed soak` for `seconds`.
fn soak(seconds: u64) -> anyhow::Result<()> {
    let root = util::root();
    bed::prerequisites()?;
    let bin = bed::build_release(&root)?;
    run_soak(&bin, seconds, 60, &root.join("target/soak"))
}

/// `cyphonic-bed soak` from `bin` (and the daemons beside it) for `seconds` in cycles of
/// `cycle` seconds, its samples and curves into `out`.
///
/// # Errors
/// The soak fails (a stall, growth, or a daemon gone).
fn run_soak(
    bin: &std::path::Path,
    seconds: u64,
    cycle: u64,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    util::run(
        &mut soak_command(bin, seconds, cycle, out),
        &format!(
            "cyphonic-bed soak --seconds {seconds} --cycle {cycle} (samples and curves in {})",
            out.display()
        ),
    )
}

/// The command of [`run_soak`].
fn soak_command(
    bin: &std::path::Path,
    seconds: u64,
    cycle: u64,
    out: &std::path::Path,
) -> std::process::Command {
    let mut command = std::process::Command::new(bin.join("cyphonic-bed"));
    command
        .args(["soak", "--seconds", &seconds.to_string()])
        .args(["--cycle", &cycle.to_string(), "--out"])
        .arg(out)
        .env("CYPHONIC_BIN_DIR", bin);
    command
}

fn test() -> anyhow::Result<()> {
    let root = util::root();
    util::room_for_a_run(&root.join("target"))?;
    // First, at the lowest priorities, the builds that need no privileges and nothing of
    // the rest, as two chains: the Pi's (tests and programs; the longest build of the run);
    // then, below it, the documentation with rustdoc's lints denied and the fuzz targets'
    // check (they live outside the workspace: cargo-fuzz builds them with nightly and
    // sanitizers; this makes sure they still compile against the current APIs). They take
    // what the foreground leaves idle: the single-crate tails of the native builds, the
    // kernel tier's waits on its network, the soak. Stopped if the run fails first.
    let mut background = background::Builds::start(&root)?;
    util::cargo(&root, &["fmt", "--all", "--", "--check"])?;
    // The release before, for the kernel tier's test of members a release apart; before
    // the workspace's build, which puts our programs back where its programs went (see
    // previous).
    previous::build(&root)?;
    // One build for the whole native tier, which is also clippy's lint of every target
    // (see bed::build_for_tests).
    bed::build_for_tests(&root)?;
    // Unit tier: everything that needs no privileges, from the test programs that build
    // made (`cargo test --exclude cyphonic-e2e` would resolve the dependencies' features
    // without the e2e package's and compile dozens of them again: 5 minutes on a fresh
    // machine), then the doctests.
    let programs = bed::test_programs(&root)?;
    bed::run_programs(&programs.unit, &[])?;
    util::cargo_with(
        &root,
        &["test", "--workspace", "--locked", "--doc"],
        &bed::lint_env(),
    )?;
    // Kernel tier: network namespaces, veth, AF_PACKET, the real binaries (just built) and
    // real tools. Needs root; fails (never skips) without it. Each program runs its tests
    // one at a time (they share the CPUs with the daemons they start); three jobs, the
    // short soak among them, run at once (see lanes). The native demo and packages follow,
    // while the background builds may still run.
    let mut jobs: Vec<lanes::Job> = programs
        .kernel
        .iter()
        .map(|p| lanes::Job {
            name: p.name.clone(),
            command: p.command(&["--test-threads=1"]),
            seconds: lanes::expected_seconds(&p.name),
        })
        .collect();
    jobs.push(short_soak(&root));
    lanes::run(jobs, &lanes::logs_dir(&root))?;
    native_demo_and_packages(&root)?;
    background.wait_for_the_pi()?;
    // The Pi's architecture: its unit tier passed under the emulator in the background;
    // the demo with the emulated node, and the arm64 packages of the programs built with
    // the tests. The documentation's chain may still run beside them.
    let arm64 = cross::programs_dir(&root);
    cross::smoke(&root, &arm64, &root.join("target/debug"))?;
    vm::check(&root, &arm64, &root.join("target/debug"))?;
    let debs = dist::package_programs(cross::TRIPLE, &arm64, "dev", &cross::PROGRAMS)?;
    deb::lint(&debs)?;
    deb::check_install(&debs)?;
    background.wait()?;
    eprintln!("xtask: all checks passed");
    Ok(())
}

/// The short demo, from the binaries just built (what `cargo xtask demo` shows, with
/// shorter measurements); then the amd64 packages of those binaries (dev profile: the
/// packaging is what is checked here), linted, installed, upgraded, removed and purged in a
/// scratch root, installed from a signed repository, and reached by apt's upgrade from the
/// release before's packages.
///
/// # Errors
/// The demo fails, or a package check does.
fn native_demo_and_packages(root: &std::path::Path) -> anyhow::Result<()> {
    util::run(
        std::process::Command::new(root.join("target/debug/cyphonic-bed"))
            .args(["demo", "--short"])
            .env("CYPHONIC_BIN_DIR", root.join("target/debug")),
        "cyphonic-bed demo --short",
    )?;
    if std::env::consts::ARCH == "x86_64" {
        let debs = dist::package_reproducibly(
            "x86_64-unknown-linux-gnu",
            &root.join("target/debug"),
            "dev",
        )?;
        deb::lint(&debs)?;
        deb::check_install(&debs)?;
        deb::run_as_shipped(&debs, &root.join("target/debug/cyphonic-bed"))?;
        deb::check_repository(&debs, &root.join("target/dist/amd64/repo"))?;
        // The release before's packages, as it made them, upgraded to these through apt.
        let previous = previous::package(root)?;
        deb::check_upgrade(&previous, &debs, &root.join("target/previous/repo"))?;
    }
    Ok(())
}

/// The soak's five-minute version (`cargo xtask soak` runs it for hours) as a job of the
/// kernel tier's lanes: 20-s cycles of devices joining and leaving, names, traffic, rekeys,
/// restarts and loss, by the binaries just built; a stall or growth fails. Its samples and
/// curves stay in target/soak-ci.
fn short_soak(root: &std::path::Path) -> lanes::Job {
    lanes::Job {
        name: "soak".into(),
        command: soak_command(
            &root.join("target/debug"),
            300,
            20,
            &root.join("target/soak-ci"),
        ),
        seconds: lanes::expected_seconds("soak"),
    }
}

/// The aarch64 tier: the unit tests under the emulator, then (unless `unit_only`) the short
/// demo by the emulated programs, with the bed's own tools built for this machine, and the
/// adapter in an arm64 machine (`machine_only`: that alone).
fn arm64(unit_only: bool, machine_only: bool) -> anyhow::Result<()> {
    let root = util::root();
    if machine_only {
        bed::prerequisites()?;
        bed::build_for_tests(&root)?;
        let arm64 = cross::programs_dir(&root);
        return vm::check(&root, &arm64, &root.join("target/debug"));
    }
    let arm64 = cross::test(&root)?;
    if !unit_only {
        bed::prerequisites()?;
        bed::build_for_tests(&root)?;
        cross::smoke(&root, &arm64, &root.join("target/debug"))?;
        vm::check(&root, &arm64, &root.join("target/debug"))?;
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
