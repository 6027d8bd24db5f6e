//! The release before: the programs of the commit before issue 57's protocol changes (tunnel
//! version ranges, control version 15), built for the kernel tier's test of members a release
//! apart (e2e/tests/releases.rs, docs/protocol.md §2 and §4, *Versions*).
//!
//! Its source comes out of the repository's history into `target/previous/src` (once per
//! commit: the tree's mtimes then stay, so a second run compiles nothing) and builds into the
//! workspace's own target directory: the dependencies are the same crates with the same
//! features, so only its ~30 workspace units compile (3 minutes on 2 cores).
//!
//! Cargo names a workspace crate's artifacts by its path relative to the workspace root, so
//! the release before's crates would take the very files of ours (and an older source tree
//! could pass for fresh against our newer artifacts): they compile through a wrapper of their
//! own ([`WRAPPER`]), which cargo hashes into their names. Their programs are still copied up
//! to `target/debug` under our programs' names, so they are copied on to
//! `target/previous/bin` here, before the workspace's own build, which copies ours back up
//! (cargo does so for fresh units too).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util;

/// The commit of the release before: the last before issue 57's protocol changes. Move it
/// on when a release's protocol changes are done (what the test calls N-1 is the release the
/// fleet upgrades from).
pub(crate) const COMMIT: &str = "38f4aecd67978a1ea7de0d316cd1b503a257ed39";

/// The workspace wrapper the release before's crates compile through (it runs the compiler
/// it is given): its path sets their artifacts apart from ours.
const WRAPPER: &str = "#!/bin/sh\n# The release before's crates compile through this: cargo hashes it into their names.\nexec \"$@\"\n";

/// The programs a member or a cloud runs.
const PROGRAMS: [&str; 3] = ["cyphonic-adapter", "cyphonic-cloud", "cyphonic-node"];

/// What cargo builds of the release before: every program, and one small test target so that
/// the dependencies resolve with the dev-dependencies' features as the workspace's own build
/// resolves them (without a test target, 15 of them compiled again with other features).
const BUILD: &[&str] = &[
    "build",
    "--workspace",
    "--locked",
    "--bins",
    "--test",
    "channel",
];

/// Builds the release before and returns the directory of its programs
/// (`target/previous/bin`), which the kernel tier's tests find there.
///
/// # Errors
/// The commit is not in the repository's history (and a shallow clone cannot be deepened),
/// or its build fails.
pub(crate) fn build(root: &Path) -> anyhow::Result<PathBuf> {
    let dir = root.join("target/previous");
    let src = dir.join("src");
    let stamp = src.join(".previous-commit");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(COMMIT) {
        have_commit(root)?;
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(&src)?;
        let tar = dir.join("src.tar");
        util::run(
            Command::new("git")
                .arg("-C")
                .arg(root)
                .args(["archive", "--output"])
                .arg(&tar)
                .arg(COMMIT),
            &format!("git archive {COMMIT} (the release before)"),
        )?;
        util::run(
            Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&src),
            "tar -x (the release before)",
        )?;
        std::fs::remove_file(&tar)?;
        std::fs::write(&stamp, COMMIT)?;
    }
    let wrapper = dir.join("rustc-wrapper");
    if std::fs::read_to_string(&wrapper).ok().as_deref() != Some(WRAPPER) {
        std::fs::write(&wrapper, WRAPPER)?;
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
    }
    let target = root.join("target");
    let mut args = BUILD.to_vec();
    let target_arg = target.to_str().context("the target directory's path")?;
    args.extend(["--target-dir", target_arg]);
    let wrapped = wrapper.to_str().context("the wrapper's path")?;
    util::cargo_with(
        &src,
        &args,
        &[("RUSTC_WORKSPACE_WRAPPER".to_owned(), wrapped.to_owned())],
    )?;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    for program in PROGRAMS {
        copy_out(&target.join("debug").join(program), &bin.join(program))?;
    }
    // Its own xtask (a member of its workspace), which packages its programs as it did.
    copy_out(&target.join("debug/xtask"), &dir.join("xtask"))?;
    Ok(bin)
}

/// Copies a program of the release before out of the target directory, where ours will
/// take its place.
fn copy_out(from: &Path, to: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to)
        .map(drop)
        .with_context(|| format!("copying the release before's {}", from.display()))
}

/// Packages the release before's programs (as [`build`] left them) with its own xtask, as
/// it shipped them (`dist --prebuilt`, the dev profile, amd64): the packages a fleet
/// upgrades from, for the test of an upgrade through apt ([`crate::deb::check_upgrade`]).
/// Their timestamps and commit are the commit's. Returns the .deb files.
///
/// # Errors
/// [`build`] has not run, or the packaging fails.
pub(crate) fn package(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = root.join("target/previous");
    let src = dir.join("src");
    let out = src.join("target/dist/amd64");
    let _ = std::fs::remove_dir_all(&out);
    let epoch = util::git(root, &["log", "-1", "--format=%ct", COMMIT])
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .context("the release before's commit time")?;
    util::run(
        Command::new(dir.join("xtask"))
            .args(["dist", "--profile", "dev", "--prebuilt"])
            .arg(dir.join("bin"))
            .current_dir(&src)
            .env("SOURCE_DATE_EPOCH", epoch)
            .env(crate::dist::COMMIT, &COMMIT[..12]),
        "the release before's xtask dist --prebuilt (its packages)",
    )?;
    crate::dist::debs_in(&out)
}

/// Makes sure [`COMMIT`] is in the repository: a shallow clone (CI's may be one) is deepened
/// from where it came from.
fn have_commit(root: &Path) -> anyhow::Result<()> {
    let git = |args: &[&str]| util::git(root, args).is_some_and(|o| o.status.success());
    let present = || git(&["cat-file", "-e", &format!("{COMMIT}^{{commit}}")]);
    if present() {
        return Ok(());
    }
    let shallow = util::git(root, &["rev-parse", "--is-shallow-repository"])
        .is_some_and(|o| o.stdout.starts_with(b"true"));
    if shallow {
        eprintln!("xtask: a shallow clone: fetching the history for the release before");
        if git(&["fetch", "--quiet", "--unshallow"]) && present() {
            return Ok(());
        }
    }
    bail!(
        "commit {COMMIT} (the release before, for e2e/tests/releases.rs) is not in this \
         repository: clone it with its history"
    )
}
