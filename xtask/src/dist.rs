//! `cargo xtask dist`: builds the three programs for a target and packages them: the .deb
//! files of [`deb`] (one per program and a common one) and a tarball of the same files.
//!
//! Cross-compiling for the Raspberry Pi 4 (`aarch64-unknown-linux-gnu`) needs two things:
//! the target's Rust standard library and Debian's `gcc-aarch64-linux-gnu` (the linker, and
//! the C compiler for ring's assembly). rustup cannot download a
//! standard library on these build machines; Debian ships one for its own newer compiler
//! (`rustc-web`, at /usr/bin/rustc, with `libstd-rust-web-dev:arm64`), which `dist` then
//! uses through `RUSTC` ([`rustc_for`]). `dist` checks for both before building and says
//! what to install. The command lines and environment it uses are unit-tested here;
//! `cargo xtask test` packages both architectures and installs them into scratch roots.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{deb, util};

/// A target `dist` knows how to package for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The Rust target triple.
    pub(crate) triple: &'static str,
    /// Debian's name for the architecture.
    pub(crate) deb_arch: &'static str,
    /// The C toolchain prefix when cross-compiling (`aarch64-linux-gnu`), none for the host.
    pub(crate) cross: Option<&'static str>,
}

/// The targets: x86_64 (this machine) and the Raspberry Pi 4.
pub(crate) fn target(triple: &str) -> anyhow::Result<Target> {
    match triple {
        "x86_64-unknown-linux-gnu" => Ok(Target {
            triple: "x86_64-unknown-linux-gnu",
            deb_arch: "amd64",
            cross: (std::env::consts::ARCH != "x86_64").then_some("x86_64-linux-gnu"),
        }),
        "aarch64-unknown-linux-gnu" => Ok(Target {
            triple: "aarch64-unknown-linux-gnu",
            deb_arch: "arm64",
            cross: (std::env::consts::ARCH != "aarch64").then_some("aarch64-linux-gnu"),
        }),
        other => bail!(
            "unknown target {other:?}: dist builds x86_64-unknown-linux-gnu and aarch64-unknown-linux-gnu"
        ),
    }
}

/// How to build for a target: cargo's arguments and the environment for cross-compiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Build {
    /// `cargo` arguments.
    pub(crate) args: Vec<String>,
    /// Environment variables.
    pub(crate) env: Vec<(String, String)>,
    /// Where the binaries land, relative to the repository.
    pub(crate) out: PathBuf,
}

/// The build of `target` with cargo profile `profile` (`release`, or `dev` for a quick check).
/// For this machine's own target no `--target` is given, so the build shares `target/<profile>`
/// with every other build here.
pub(crate) fn build(target: &Target, profile: &str) -> Build {
    let mut args: Vec<String> = ["build", "--locked", "--profile", profile]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    if target.cross.is_some() {
        args.extend(["--target".to_owned(), target.triple.to_owned()]);
    }
    for p in &deb::PROGRAMS {
        args.extend(["-p".to_owned(), p.name.to_owned()]);
    }
    let mut env = Vec::new();
    if let Some(prefix) = target.cross {
        let upper = target.triple.to_uppercase().replace('-', "_");
        let lower = target.triple.replace('-', "_");
        env.push((
            format!("CARGO_TARGET_{upper}_LINKER"),
            format!("{prefix}-gcc"),
        ));
        env.push((format!("CC_{lower}"), format!("{prefix}-gcc")));
        env.push((format!("AR_{lower}"), format!("{prefix}-ar")));
    }
    let dir = if profile == "dev" { "debug" } else { profile };
    let out = if target.cross.is_some() {
        PathBuf::from("target").join(target.triple).join(dir)
    } else {
        PathBuf::from("target").join(dir)
    };
    Build { args, env, out }
}

/// What a build for `target` lacks, in words with the remedy: the C cross toolchain
/// (`has_gcc`), the target's Rust standard library (`has_std`).
fn missing(target: &Target, has_gcc: bool, has_std: bool) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(prefix) = target.cross
        && !has_gcc
    {
        out.push(format!(
            "the C cross toolchain {prefix}-gcc (Debian: apt-get install gcc-{prefix})"
        ));
    }
    if !has_std {
        out.push(format!(
            "the Rust standard library for {} (Debian: dpkg --add-architecture {}; apt-get update; apt-get install rustc-web libstd-rust-web-dev:{}, which dist then uses; or rustup target add {}, on a machine that can download it)",
            target.triple, target.deb_arch, target.deb_arch, target.triple
        ));
    }
    out
}

/// Whether `rustc` has a standard library for `triple`.
fn has_std(rustc: &str, triple: &str) -> bool {
    util::output(rustc, &["--print", "target-libdir", "--target", triple]).is_some_and(|d| {
        std::fs::read_dir(&d).is_ok_and(|mut entries| {
            entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        })
    })
}

/// The compiler to build `target` with: `$RUSTC`, else the toolchain's own `rustc`, else
/// Debian's `/usr/bin/rustc` (rustc-web), the first that has the target's standard library;
/// `None` when none has.
pub(crate) fn rustc_for(target: &Target) -> Option<String> {
    let mut candidates: Vec<String> = std::env::var("RUSTC").into_iter().collect();
    candidates.extend(["rustc".to_owned(), "/usr/bin/rustc".to_owned()]);
    candidates
        .into_iter()
        .find(|r| (target.cross.is_none() && r == "rustc") || has_std(r, target.triple))
}

/// What a build for `target` lacks on this machine, given whether a compiler has its
/// standard library (`has_std`).
fn missing_for(target: &Target, has_std: bool) -> Vec<String> {
    let has_gcc = target
        .cross
        .is_none_or(|prefix| util::has_command(&format!("{prefix}-gcc")));
    missing(target, has_gcc, has_std)
}

/// The environment of a build of `target`: [`build`]'s, and `RUSTC` when the compiler
/// with the target's standard library is not the toolchain's own.
///
/// # Errors
/// Something the build needs is missing (said what, with the remedy).
pub(crate) fn environment(target: &Target, b: &Build) -> anyhow::Result<Vec<(String, String)>> {
    let rustc = rustc_for(target);
    let missing = missing_for(target, rustc.is_some());
    if !missing.is_empty() {
        bail!(
            "cannot build for {}; missing: {}.\nSee docs/operations.md, \"Packaging for the Raspberry Pi\".",
            target.triple,
            missing.join("; ")
        );
    }
    let mut env = b.env.clone();
    if let Some(rustc) = rustc.filter(|r| r != "rustc") {
        // Its rustdoc beside it, for doctests (rustc-web ships /usr/bin/rustdoc).
        let rustdoc = Path::new(&rustc).with_file_name("rustdoc");
        if rustdoc.exists() {
            env.push(("RUSTDOC".to_owned(), rustdoc.display().to_string()));
        }
        env.push(("RUSTC".to_owned(), rustc));
    }
    Ok(env)
}

/// What the programs read at build time for `cyphonic_build_info`'s commit; one set by the
/// caller (a build from a source tarball) is kept.
pub(crate) const COMMIT: &str = "CYPHONIC_COMMIT";

/// The commit the tree at `root` is at (12 hex digits), `+dirty` when tracked files differ
/// from it; None outside a git checkout.
fn commit(root: &Path) -> Option<String> {
    let (head, dirty) = util::commit(root, 12, &[])?;
    Some(if dirty { format!("{head}+dirty") } else { head })
}

/// Builds and packages for `triple` with `profile`; returns the .deb files.
///
/// # Errors
/// Something the build needs is missing (said what), the build or packaging fails.
pub(crate) fn run(triple: &str, profile: &str) -> anyhow::Result<Vec<PathBuf>> {
    let root = util::root();
    let target = target(triple)?;
    let b = build(&target, profile);
    let mut env = environment(&target, &b)?;
    if std::env::var_os(COMMIT).is_none()
        && let Some(commit) = commit(&root)
    {
        env.push((COMMIT.to_owned(), commit));
    }
    let args: Vec<&str> = b.args.iter().map(String::as_str).collect();
    util::cargo_with(&root, &args, &env)?;
    package(triple, &root.join(&b.out), profile)
}

/// Packages the programs already built in `bins` for `triple` (`profile` chooses the
/// compression): the .deb files ([`deb::build`]; returned, the common one first) and a
/// tarball of the same files for systems without dpkg, in target/dist. `cargo xtask test`
/// packages what its tiers built rather than building the programs once more with another
/// feature set.
///
/// # Errors
/// A program is missing from `bins`, or packaging fails.
pub(crate) fn package(triple: &str, bins: &Path, profile: &str) -> anyhow::Result<Vec<PathBuf>> {
    package_programs(triple, bins, profile, &deb::PROGRAMS)
}

/// The .deb files in `dir`, sorted by name.
///
/// # Errors
/// `dir` cannot be read, or holds no package.
pub(crate) fn debs_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("the packages in {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    anyhow::ensure!(!debs.is_empty(), "no package in {}", dir.display());
    Ok(debs)
}

/// [`package`], twice: every file the second packaging writes (the .debs and the tarball)
/// must be the first's, byte for byte (reproducible-builds.org: the same binaries and the
/// same commit give the same packages; the timestamps come from [`deb::source_date_epoch`]).
///
/// # Errors
/// Packaging fails, or a file differs between the two (named).
pub(crate) fn package_reproducibly(
    triple: &str,
    bins: &Path,
    profile: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    let made = |debs: &[PathBuf]| -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
        let dir = debs
            .first()
            .and_then(|d| d.parent())
            .context("no package made")?;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with(".deb") || name.ends_with(".tar.gz") {
                files.push((path.clone(), std::fs::read(&path)?));
            }
        }
        files.sort();
        Ok(files)
    };
    let first = made(&package(triple, bins, profile)?)?;
    // A second later: a timestamp taken from the clock would now differ.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let debs = package(triple, bins, profile)?;
    let second = made(&debs)?;
    let differ: Vec<String> = first
        .iter()
        .filter(|(path, bytes)| !second.iter().any(|(p, b)| p == path && b == bytes))
        .map(|(path, _)| path.display().to_string())
        .collect();
    anyhow::ensure!(
        differ.is_empty() && first.len() == second.len(),
        "packaging the same binaries twice made different files: {differ:?} (compare them with diffoscope)"
    );
    eprintln!(
        "xtask: packaged twice, {} files the same byte for byte",
        first.len()
    );
    Ok(debs)
}

/// [`package`] for `programs` only (the Pi's tier of `cargo xtask test` packages the
/// adapter and the node: it does not build the cloud).
///
/// # Errors
/// A program is missing from `bins`, or packaging fails.
pub(crate) fn package_programs(
    triple: &str,
    bins: &Path,
    profile: &str,
    programs: &[deb::Program],
) -> anyhow::Result<Vec<PathBuf>> {
    let root = util::root();
    let target = target(triple)?;
    let dist = root.join("target/dist").join(target.deb_arch);
    std::fs::create_dir_all(&dist)?;
    // The directory holds this packaging's files: an earlier version's would be taken
    // for them (by `--upgrade-from`, the image, an operator copying `*.deb`).
    for entry in std::fs::read_dir(&dist)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("cyphonic") && (name.ends_with(".deb") || name.ends_with(".tar.gz")) {
            std::fs::remove_file(&path)?;
        }
    }
    // A quick check's large unoptimised binaries need no strong (slow) compression.
    let compression = if profile == "release" {
        "-Zxz"
    } else {
        "-Zgzip"
    };
    let strip = match target.cross {
        Some(prefix) => format!("{prefix}-strip"),
        None => "strip".to_owned(),
    };
    // The programs write their own man pages and completions: the Pi's under the emulator.
    let runner = if target.cross.is_some() {
        crate::emulator::runner()
    } else {
        Vec::new()
    };
    let how = deb::Packaging {
        arch: target.deb_arch,
        strip: &strip,
        compression,
        programs,
        runner: &runner,
    };
    let debs = deb::build(&root, &how, bins, &dist)?;
    let tarball = dist.join(format!(
        "cyphonic-{}-{}.tar.gz",
        deb::version(),
        target.triple
    ));
    // Reproducible: entries by name, owned by root, dated no later than the commit, and
    // gzip without a name or a timestamp of its own.
    let mut tar = Command::new("tar");
    tar.args([
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--sort=name",
        "--clamp-mtime",
        "--exclude=./DEBIAN",
        "--use-compress-program=gzip -9n",
    ])
    .arg(format!("--mtime=@{}", deb::source_date_epoch(&root)))
    .arg("-cf")
    .arg(&tarball);
    tar.arg("-C")
        .arg(dist.join("debian").join(deb::COMMON))
        .arg(".");
    for p in programs {
        tar.arg("-C").arg(dist.join("debian").join(p.name)).arg(".");
    }
    util::run(&mut tar, "tar")?;
    for d in &debs {
        eprintln!("xtask: {}", d.display());
    }
    eprintln!("xtask: {}", tarball.display());
    Ok(debs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commit of a checkout, marked when its tracked files differ; none outside one.
    #[test]
    fn the_commit_is_the_trees_and_says_when_it_is_dirty() {
        let dir = std::env::temp_dir().join(format!("xtask-commit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(commit(&dir), None, "not a checkout");
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .arg("-C")
                .arg(&dir)
                .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
                .args(args)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(dir.join("f"), "one").unwrap_or_else(|e| panic!("{e}"));
        git(&["add", "f"]);
        git(&["commit", "-q", "-m", "one"]);
        let head = commit(&dir).unwrap_or_default();
        assert!(
            head.len() == 12 && head.chars().all(|c| c.is_ascii_hexdigit()),
            "{head:?}"
        );
        std::fs::write(dir.join("f"), "two").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(commit(&dir), Some(format!("{head}+dirty")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The Pi's build: the aarch64 target, Debian's cross gcc as linker and C compiler (ring
    /// compiles C), binaries under target/aarch64-unknown-linux-gnu/release.
    #[test]
    fn the_pi_build_uses_the_cross_toolchain() {
        let t = target("aarch64-unknown-linux-gnu").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.deb_arch, "arm64");
        let b = build(&t, "release");
        if std::env::consts::ARCH == "x86_64" {
            assert_eq!(
                b.args.join(" "),
                "build --locked --profile release --target aarch64-unknown-linux-gnu -p cyphonic-adapter -p cyphonic-node -p cyphonic-cloud"
            );
            assert_eq!(
                b.env,
                [
                    (
                        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER".to_owned(),
                        "aarch64-linux-gnu-gcc".to_owned()
                    ),
                    (
                        "CC_aarch64_unknown_linux_gnu".to_owned(),
                        "aarch64-linux-gnu-gcc".to_owned()
                    ),
                    (
                        "AR_aarch64_unknown_linux_gnu".to_owned(),
                        "aarch64-linux-gnu-ar".to_owned()
                    ),
                ]
            );
            assert_eq!(
                b.out,
                PathBuf::from("target/aarch64-unknown-linux-gnu/release")
            );
            assert_eq!(
                build(&t, "dev").out,
                PathBuf::from("target/aarch64-unknown-linux-gnu/debug")
            );
            // This machine's own target builds where every other build does.
            let native = build(
                &target("x86_64-unknown-linux-gnu").unwrap_or_else(|e| panic!("{e}")),
                "dev",
            );
            assert!(!native.args.contains(&"--target".to_owned()) && native.env.is_empty());
            assert_eq!(native.out, PathBuf::from("target/debug"));
        }
        assert!(target("mips-unknown-linux-gnu").is_err());
    }

    /// What a cross build lacks is said with the way to get it.
    #[test]
    fn missing_pieces_are_named_with_their_remedy() {
        let t = Target {
            triple: "aarch64-unknown-linux-gnu",
            deb_arch: "arm64",
            cross: Some("aarch64-linux-gnu"),
        };
        assert!(missing(&t, true, true).is_empty());
        let both = missing(&t, false, false).join("; ");
        assert!(
            both.contains("apt-get install gcc-aarch64-linux-gnu"),
            "{both}"
        );
        assert!(
            both.contains("rustup target add aarch64-unknown-linux-gnu"),
            "{both}"
        );
        assert!(
            both.contains("apt-get install rustc-web libstd-rust-web-dev:arm64"),
            "{both}"
        );
    }
}
