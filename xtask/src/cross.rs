//! The Raspberry Pi's architecture, tested on this one: the unit tier of the Pi's packet
//! path ([`SELECTION`]) built for `aarch64-unknown-linux-gnu` and run under qemu-user, and the demo (the cloud,
//! two adapters, DHCP devices, a node, ping and iperf3 by name) with the aarch64 build of the
//! node under the emulator; the packages of the adapter and the node. Endianness, alignment,
//! atomics and the AEAD backends of the Pi's architecture are exercised here rather than
//! first on a gateway.
//!
//! The adapters of that demo stay native: qemu-user (Debian 12's 7.2) does not translate
//! `SOL_PACKET` socket options (`PACKET_ADD_MEMBERSHIP`, `PACKET_VERSION`, ...), so the
//! adapter's capture socket cannot be set up under it (`Protocol not available`). The
//! adapter's code is in the unit tier; running its program on arm64 needs a whole emulated
//! machine (qemu-system-aarch64).
//!
//! binfmt_misc need not be set up: the emulator is called explicitly, as cargo's target
//! runner for the tests, and from small wrapper scripts for the programs the bed starts.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::emulator::runner;
use crate::{dist, util};

/// The Pi's target.
pub(crate) const TRIPLE: &str = "aarch64-unknown-linux-gnu";

/// The environment of a cargo command for the Pi: the cross toolchain, the compiler with
/// the target's standard library, and the emulator as the runner of what cargo runs.
fn environment(target: &dist::Target, b: &dist::Build) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = dist::environment(target, b)?;
    let upper = TRIPLE.to_uppercase().replace('-', "_");
    let runner = runner();
    if !runner.is_empty() {
        anyhow::ensure!(
            util::has_command("qemu-aarch64-static"),
            "running aarch64 programs here needs the emulator: apt-get install qemu-user-static"
        );
        env.push((format!("CARGO_TARGET_{upper}_RUNNER"), runner.join(" ")));
    }
    if let Some(flags) = lld_flags() {
        env.push((format!("CARGO_TARGET_{upper}_RUSTFLAGS"), flags));
    }
    Ok(env)
}

/// The flags that have the cross C compiler link with LLVM's lld (Debian's `lld`), where
/// it is installed: the tier links some twenty test programs and two programs, each
/// holding most of the dependency tree (see [`DEPENDENCIES_OPT_LEVEL`] for what both
/// saved). None without lld: the build then links with GNU ld, slower, the same programs.
fn lld_flags() -> Option<String> {
    let lld = util::output("sh", &["-c", "command -v ld.lld"])?;
    // gcc looks for `ld.lld` among its own programs; -B adds lld's directory (its real
    // one: /usr/bin, where the link is, also holds this machine's `as` and `ld`).
    let dir = std::fs::canonicalize(lld).ok()?.parent()?.to_owned();
    Some(format!(
        "-C link-arg=-fuse-ld=lld -C link-arg=-B{}",
        dir.display()
    ))
}

/// What the aarch64 tier builds and tests: the Pi's two programs and the crates of their
/// packet path, with their tests. Those are where the architecture shows: the AEAD's vector
/// code (crypto), packet sockets, `recvmmsg` and their structures (netio, the only crate
/// with `unsafe`), the pipeline's atomics under arm64's weaker memory order, checksums and
/// offloads, the tunnel's socket, the session's counters. The other crates the programs
/// link (settings, DHCP, DNS, the control channel and the cloud's clients, HA, telemetry)
/// are plain logic over bytes and integers, the same on two 64-bit little-endian machines:
/// they are compiled here for the programs, and tested natively only. Not the cloud (a server's program: `cargo xtask dist --target
/// aarch64-unknown-linux-gnu` still builds and packages it), the end-to-end tests, xtask
/// nor the benchmarks.
const SELECTION: [&str; 24] = [
    "--package",
    "cyphonic-adapter",
    "--package",
    "cyphonic-node",
    "--package",
    "cyphonic-wire",
    "--package",
    "cyphonic-crypto",
    "--package",
    "cyphonic-session",
    "--package",
    "cyphonic-pipeline",
    "--package",
    "cyphonic-netio",
    "--package",
    "cyphonic-offload",
    "--package",
    "cyphonic-tunnel",
    "--package",
    "cyphonic-gateway",
    "--locked",
    "--lib",
    "--bins",
    "--tests",
];

/// The unit tier of [`SELECTION`] (its unit and integration tests; not the doctests, whose
/// examples the native tier runs) built for the Pi and run under the
/// emulator. One build makes the tests and the programs together (`cargo build --bins
/// --tests`): building the programs apart would resolve the dependencies' features without
/// the dev-dependencies and compile many of them a second time. Returns the directory of the
/// aarch64 programs, for [`smoke`] and the package.
///
/// # Errors
/// The toolchain or the emulator is missing (said with the remedy), or a test fails.
pub(crate) fn test(root: &Path) -> anyhow::Result<PathBuf> {
    let target = dist::target(TRIPLE)?;
    let b = dist::build(&target, "dev");
    let env = environment(&target, &b)?;
    for command in ["build", "test"] {
        let args = cargo_args(command);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        util::cargo_with(root, &args, &env)?;
    }
    Ok(programs_dir(root))
}

/// The Pi's tier builds in a target directory of its own: cargo locks a target directory
/// for the whole of a build, so the native builds could not run beside it in `target`
/// (its host artifacts, Debian's rustc's, are its own anyway).
const TARGET_DIR: &str = "target/pi";

/// The dependencies' opt-level in the Pi's tier: 1, not the workspace's 2. Its tests run
/// under the emulator in about the same time either way (52 s at 1, about 50 at 2). With
/// this and [`lld_flags`] the tier's build took 413 s alone from an empty target
/// directory, against 552 s at 2 with GNU ld (its units' time summed: 822 s against
/// 1,099, our crates' (where the links are) 338 against 441).
const DEPENDENCIES_OPT_LEVEL: &str = "profile.dev.package.\"*\".opt-level=1";

/// `cargo <command>` over [`SELECTION`] for the Pi.
fn cargo_args(command: &str) -> Vec<String> {
    let mut args = vec![
        command.to_owned(),
        "--config".to_owned(),
        DEPENDENCIES_OPT_LEVEL.to_owned(),
    ];
    args.extend(SELECTION.iter().map(|s| (*s).to_owned()));
    args.extend([
        "--target".to_owned(),
        TRIPLE.to_owned(),
        "--target-dir".to_owned(),
        TARGET_DIR.to_owned(),
    ]);
    args
}

/// Environment variables for a command.
pub(crate) type Env = Vec<(String, String)>;

/// What [`fn@test`] runs (the build, then the unit tier under the emulator), as cargo's
/// arguments and environment, for running it ahead: `cargo xtask test` does, in the
/// background, beside the native tiers; [`programs_dir`] then holds the programs.
///
/// # Errors
/// The toolchain or the emulator is missing (said with the remedy).
pub(crate) fn commands() -> anyhow::Result<Vec<(Vec<String>, Env)>> {
    let target = dist::target(TRIPLE)?;
    let env = environment(&target, &dist::build(&target, "dev"))?;
    Ok(["build", "test"]
        .map(|command| (cargo_args(command), env.clone()))
        .to_vec())
}

/// Where [`fn@test`] (or [`commands`]) leaves the aarch64 programs.
pub(crate) fn programs_dir(root: &Path) -> PathBuf {
    root.join(TARGET_DIR).join(TRIPLE).join("debug")
}

/// The programs of the Pi that the aarch64 tier packages (the cloud is not built here, see
/// [`SELECTION`]).
pub(crate) const PROGRAMS: [crate::deb::Program; 2] =
    [crate::deb::PROGRAMS[0], crate::deb::PROGRAMS[1]];

/// The programs the emulated demo runs as aarch64 builds (see the module's note on the
/// adapter; the cloud is not built for the Pi here, see [`SELECTION`]).
const EMULATED: [&str; 1] = ["cyphonic-node"];

/// Writes, in `target/<triple>/run`, a script per program for the bed: the [`EMULATED`]
/// ones run their aarch64 build from `bins` under the emulator, the adapter its build in
/// `host_bins`. Returns that directory, to hand the bed as `CYPHONIC_BIN_DIR`.
///
/// # Errors
/// A script cannot be written.
fn scripts(root: &Path, bins: &Path, host_bins: &Path) -> anyhow::Result<PathBuf> {
    let run = root.join("target").join(TRIPLE).join("run");
    std::fs::create_dir_all(&run)?;
    for p in ["cyphonic-adapter", "cyphonic-node", "cyphonic-cloud"] {
        let script = run.join(p);
        let text = if EMULATED.contains(&p) {
            wrapper(&runner(), &bins.join(p))
        } else {
            wrapper(&[], &host_bins.join(p))
        };
        std::fs::write(&script, text).with_context(|| format!("writing {}", script.display()))?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(run)
}

/// A script that runs `program` under `runner` with the script's arguments; `exec`, so that
/// the PID the bed knows (and signals) is the program's.
fn wrapper(runner: &[String], program: &Path) -> String {
    let mut line = runner.join(" ");
    if !line.is_empty() {
        line.push(' ');
    }
    format!(
        "#!/bin/sh\n# Written by cargo xtask: runs the aarch64 build of this program here.\nexec {line}{} \"$@\"\n",
        program.display()
    )
}

/// The demo, short, with the Pi's build of the node (from `bins`, which [`fn@test`] built)
/// under the emulator: two adapters each handing a DHCP lease to a device, the node
/// resolving a device by name through the cloud, pinging it and sending iperf3 through the
/// tunnel. The bed itself (namespaces, clients), the cloud and the adapters run natively,
/// from `host_bins`.
///
/// # Errors
/// The demo fails (a name not resolved, a ping unanswered).
pub(crate) fn smoke(root: &Path, bins: &Path, host_bins: &Path) -> anyhow::Result<()> {
    let run = scripts(root, bins, host_bins)?;
    util::run(
        Command::new(host_bins.join("cyphonic-bed"))
            .args(["demo", "--short"])
            .env("CYPHONIC_BIN_DIR", &run),
        "cyphonic-bed demo --short (the node's aarch64 build, emulated)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_execs_the_program_under_the_runner() {
        assert_eq!(crate::emulator::runner_for(true), ["qemu-aarch64-static"]);
        let runner = crate::emulator::runner_for(false);
        let w = wrapper(&runner, Path::new("/t/cyphonic-adapter"));
        assert!(w.starts_with("#!/bin/sh\n"), "{w}");
        assert!(
            w.ends_with(
                "\nexec qemu-aarch64-static -L /usr/aarch64-linux-gnu /t/cyphonic-adapter \"$@\"\n"
            ),
            "{w}"
        );
        let native = wrapper(&[], Path::new("/t/cyphonic-node"));
        assert!(
            native.ends_with("\nexec /t/cyphonic-node \"$@\"\n"),
            "{native}"
        );
    }
}
