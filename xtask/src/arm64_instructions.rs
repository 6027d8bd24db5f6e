//! `cargo xtask bench --arm64`: instructions per packet for seal and open on the Raspberry
//! Pi's architecture, beside the same count on this one, and the Pi 4 estimate derived from
//! them. The program is benches/src/bin/count-packets.rs (the fixtures of the callgrind
//! table), built `--release` for aarch64 and for x86_64; each runs under qemu-user with a
//! counting plugin of ours (xtask/qemu/count.c, built here with the C compiler), twice:
//! the difference between a run of [`RUNS`]`.1` packets and one of [`RUNS`]`.0`, divided by
//! the packets between them, is the packets' own count (the handshake and the setup
//! cancel). Like callgrind's, the counts do not depend on how busy the machine is.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{cross, dist, emulator, util};

/// The packets of the two runs of each count.
const RUNS: (u32, u32) = (64, 576);

/// What is counted: the operation and the AEAD backend, as count-packets takes them.
const CASES: [(&str, &str); 4] = [
    ("seal", "ring"),
    ("seal", "rustcrypto"),
    ("open", "ring"),
    ("open", "rustcrypto"),
];

/// A Raspberry Pi 4's Cortex-A72 clock: 1.8 GHz on boards made from 2020 (1.5 GHz before).
const PI4_HZ: f64 = 1.8e9;

/// The instructions per cycle the estimate assumes, low and high: the A72 decodes three per
/// cycle; the AEAD's vector loops retire fewer. An assumption, not a measurement.
const IPC: (f64, f64) = (1.0, 2.0);

/// The packet the fixtures seal (bytes of inner packet).
const PACKET_BYTES: f64 = 1420.0;

/// An architecture the program is counted on.
#[derive(Debug, Clone, Copy)]
struct Arch {
    /// The Rust target.
    triple: &'static str,
    /// qemu-user's emulator for it (the dynamically linked one, which loads plugins).
    emulator: &'static str,
    /// The CPU it models: the Pi's core; on x86_64 the most qemu has (AVX2, as callgrind).
    cpu: &'static str,
}

const AARCH64: Arch = Arch {
    triple: cross::TRIPLE,
    emulator: "qemu-aarch64",
    cpu: "cortex-a72",
};

const X86_64: Arch = Arch {
    triple: "x86_64-unknown-linux-gnu",
    emulator: "qemu-x86_64",
    cpu: "max",
};

/// One row: a case's instructions per packet on each architecture.
#[derive(Debug, PartialEq)]
struct Row {
    operation: &'static str,
    backend: &'static str,
    aarch64: f64,
    x86_64: f64,
}

/// The count the plugin printed on `stderr`: exactly one `cyphonic-count: <n>` line.
fn count_in(stderr: &str) -> anyhow::Result<u64> {
    let mut counts = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("cyphonic-count: "));
    let (Some(n), None) = (counts.next(), counts.next()) else {
        bail!("not exactly one count from the plugin in:\n{stderr}");
    };
    n.trim()
        .parse()
        .with_context(|| format!("the plugin's count {n:?}"))
}

/// Instructions per packet from the counts of the two [`RUNS`].
fn per_packet(fewer: u64, more: u64) -> anyhow::Result<f64> {
    anyhow::ensure!(
        more > fewer,
        "{} packets counted {more} instructions, {} packets {fewer}: not more",
        RUNS.1,
        RUNS.0
    );
    #[expect(
        clippy::cast_precision_loss,
        reason = "instruction counts of one run: far below 2^52"
    )]
    let extra = (more - fewer) as f64;
    Ok(extra / f64::from(RUNS.1 - RUNS.0))
}

/// The Pi 4's estimate for `instructions` per packet at `ipc`: Gbit/s of inner packets one
/// core seals (or opens), the AEAD and its counter only.
fn pi4_gbits(instructions: f64, ipc: f64) -> f64 {
    PI4_HZ * ipc / instructions * PACKET_BYTES * 8.0 / 1e9
}

/// The table and the estimate.
fn render(rows: &[Row], measured: &str) -> String {
    let mut out = format!(
        "Counted under qemu-user ({measured}) by a plugin of ours (xtask/qemu/count.c: every \
         guest instruction executed), the aarch64 build on a modelled Cortex-A72 (`-cpu \
         cortex-a72`, the Pi 4's core) and the x86_64 build on `-cpu max` (AVX2, as \
         callgrind above), both `--release`; each figure is a run of {} packets less a run \
         of {}, divided by {} (benches/src/bin/count-packets.rs, the fixtures of the table \
         above: 1,420-byte packets, a counter then ChaCha20-Poly1305 in place). The same on \
         a busy machine as on an idle one.\n\n\
         | operation | backend | aarch64 instructions per packet | x86_64 | aarch64 / x86_64 \
         | Pi 4 estimate, Gbit/s per core ({:.0} to {:.0} instructions per cycle) |\n\
         |---|---|---:|---:|---:|---:|\n",
        RUNS.1,
        RUNS.0,
        RUNS.1 - RUNS.0,
        IPC.0,
        IPC.1
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} to {:.2} |",
            r.operation,
            r.backend,
            r.aarch64,
            r.x86_64,
            r.aarch64 / r.x86_64,
            pi4_gbits(r.aarch64, IPC.0),
            pi4_gbits(r.aarch64, IPC.1)
        );
    }
    let _ = write!(
        out,
        "\nThe estimate is not a measurement on a Pi: one Cortex-A72 core at {:.1} GHz \
         retiring {:.0} to {:.0} of these instructions per cycle, 1,420-byte packets. It \
         covers the AEAD and its counter only; capture, classification, the system calls, \
         the kernel's UDP and the NICs' drivers share the same four cores.\n",
        PI4_HZ / 1e9,
        IPC.0,
        IPC.1
    );
    out
}

/// Builds the counting plugin into target/qemu-count; returns its path.
///
/// # Errors
/// The C compiler is missing or fails.
fn plugin(root: &Path) -> anyhow::Result<PathBuf> {
    let dir = root.join("target/qemu-count");
    std::fs::create_dir_all(&dir)?;
    let so = dir.join("count.so");
    util::run(
        Command::new("cc")
            .args([
                "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(&so)
            .arg(root.join("xtask/qemu/count.c")),
        "cc xtask/qemu/count.c (the counting plugin)",
    )?;
    Ok(so)
}

/// Builds count-packets `--release` for `arch`; returns the program.
///
/// # Errors
/// The toolchain for `arch` is missing, or the build fails.
fn build(root: &Path, arch: Arch) -> anyhow::Result<PathBuf> {
    let target = dist::target(arch.triple)?;
    let b = dist::build(&target, "release");
    let env = dist::environment(&target, &b)?;
    let mut args = vec![
        "build",
        "--locked",
        "--release",
        "-p",
        "cyphonic-benches",
        "--bin",
        "count-packets",
    ];
    if target.cross.is_some() {
        args.extend(["--target", arch.triple]);
    }
    util::cargo_with(root, &args, &env)?;
    Ok(root.join(&b.out).join("count-packets"))
}

/// The instructions `program` executes for `operation` of `backend` on `packets`.
///
/// # Errors
/// The emulator or the program fails, or the plugin printed no count.
fn count(
    arch: Arch,
    plugin: &Path,
    program: &Path,
    (operation, backend): (&str, &str),
    packets: u32,
) -> anyhow::Result<u64> {
    let mut cmd = Command::new(arch.emulator);
    cmd.args(["-cpu", arch.cpu, "-d", "plugin", "-plugin"])
        .arg(plugin);
    if arch.triple == cross::TRIPLE {
        cmd.args(emulator::library_args(emulator::multiarch()));
    }
    let out = cmd
        .arg(program)
        .args([operation, backend, &packets.to_string()])
        .output()
        .with_context(|| format!("running {}", arch.emulator))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "{} {operation} {backend} {packets} failed ({}): {stderr}",
            program.display(),
            out.status
        );
    }
    count_in(&stderr)
}

/// Counts every case on both architectures and returns the table.
///
/// # Errors
/// qemu-user, the C compiler or the Pi's toolchain is missing, or a count fails.
pub(crate) fn run(root: &Path) -> anyhow::Result<String> {
    util::install_missing(
        "counting instructions under the emulator",
        &[
            ("qemu-aarch64", "qemu-user"),
            ("qemu-x86_64", "qemu-user"),
            ("cc", "build-essential"),
        ],
    )?;
    let plugin = plugin(root)?;
    let aarch64 = build(root, AARCH64)?;
    let x86_64 = build(root, X86_64)?;
    let mut rows = Vec::new();
    for case in CASES {
        let per = |arch: Arch, program: &Path| -> anyhow::Result<f64> {
            per_packet(
                count(arch, &plugin, program, case, RUNS.0)?,
                count(arch, &plugin, program, case, RUNS.1)?,
            )
        };
        rows.push(Row {
            operation: case.0,
            backend: case.1,
            aarch64: per(AARCH64, &aarch64)?,
            x86_64: per(X86_64, &x86_64)?,
        });
    }
    let qemu = util::output(AARCH64.emulator, &["--version"])
        .and_then(|v| v.lines().next().map(str::to_owned))
        .context("qemu-aarch64 --version")?;
    Ok(render(
        &rows,
        &format!("{}, {qemu}", cyphonic_report::utc_now()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_read_strictly() {
        assert_eq!(
            count_in("noise\ncyphonic-count: 6083944\n").unwrap(),
            6_083_944
        );
        assert!(count_in("").is_err(), "no count");
        assert!(count_in("cyphonic-count: 1\ncyphonic-count: 2\n").is_err());
        assert!(count_in("cyphonic-count: lots\n").is_err());
    }

    #[test]
    fn per_packet_is_the_difference_over_the_packets_between() {
        assert!((per_packet(1_000_000, 1_000_000 + 512 * 9000).unwrap() - 9000.0).abs() < 1e-9);
        assert!(per_packet(5, 5).is_err(), "no more for more packets");
        assert!(per_packet(6, 5).is_err());
    }

    #[test]
    fn the_table_and_the_estimate() {
        let rows = [Row {
            operation: "seal",
            backend: "ring",
            aarch64: 11_360.0,
            x86_64: 9_088.0,
        }];
        let table = render(&rows, "today");
        // 1.8e9 / 11,360 packets/s x 11,360 bits = 1.8 Gbit/s at 1 per cycle, 3.6 at 2.
        assert!(
            table.contains("| seal | ring | 11360 | 9088 | 1.25 | 1.80 to 3.60 |"),
            "{table}"
        );
        assert!(table.contains("not a measurement on a Pi"), "{table}");
    }
}
