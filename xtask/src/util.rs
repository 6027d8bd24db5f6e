//! Running commands, finding the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The commit the tree at `root` is at (`digits` hex digits) and whether tracked files
/// under `pathspecs` (all of them when empty) differ from it; None outside a git checkout.
pub(crate) fn commit(root: &Path, digits: usize, pathspecs: &[&str]) -> Option<(String, bool)> {
    let git = |args: &[&str]| git(root, args);
    let head =
        git(&["rev-parse", &format!("--short={digits}"), "HEAD"]).filter(|o| o.status.success())?;
    let head = String::from_utf8(head.stdout).ok()?.trim().to_owned();
    let mut diff = vec!["diff", "--quiet", "HEAD", "--"];
    diff.extend_from_slice(pathspecs);
    let clean = git(&diff).is_some_and(|o| o.status.success());
    Some((head, !clean))
}

/// `git ARGS` in the repository at `root`, how it ended; None when git cannot run.
pub(crate) fn git(root: &Path, args: &[&str]) -> Option<std::process::Output> {
    Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()
}

/// The repository root (xtask lives one level below it).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the repository")
        .to_path_buf()
}

/// The cargo that runs xtask (`$CARGO`), else `cargo` from the path.
pub(crate) fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// A command running the cargo that runs xtask, without what `cargo run` told xtask about
/// itself.
pub(crate) fn cargo_command() -> Command {
    let mut cmd = Command::new(cargo_program());
    forget_own_package(&mut cmd);
    cmd
}

/// Takes out of `cmd`'s environment the variables `cargo run` set for xtask (its manifest,
/// its package's name and version). A cargo started with them would compile again what a
/// cargo started from the shell had built: build scripts watch some of them
/// (`rerun-if-env-changed`: ring's, through the `cc` crate), and what depends on those
/// crates follows. `cargo xtask bench` rebuilt the whole release tree this way (2.5 min on
/// the bench's VM) whenever it had last been built from the shell, just before measuring.
pub(crate) fn forget_own_package(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let Some(name) = key.to_str() else { continue };
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || matches!(
                name,
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
            )
        {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// Runs `cargo <args>` in `dir`, echoing it, failing on a non-zero exit.
pub(crate) fn cargo(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    cargo_with(dir, args, &[])
}

/// [`cargo`] with more environment variables (a cross build's toolchain).
pub(crate) fn cargo_with(
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> anyhow::Result<()> {
    run(
        cargo_command()
            .args(args)
            .current_dir(dir)
            .envs(env.iter().map(|(k, v)| (k, v))),
        &format!("cargo {}", args.join(" ")),
    )
}

/// Runs a prepared command, echoing `what`, failing on a non-zero exit.
pub(crate) fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    eprintln!("xtask: $ {what}");
    let status = cmd.status().with_context(|| format!("starting `{what}`"))?;
    if !status.success() {
        bail!("`{what}` failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its standard output, or None if it cannot run.
pub(crate) fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether `tool` is on the path.
pub(crate) fn has_command(tool: &str) -> bool {
    output("sh", &["-c", &format!("command -v {tool}")]).is_some()
}

/// Installs with apt-get the Debian packages of the `tools` (program, package) that are not
/// on the path (a tool given as an absolute path: a file that is not there); `what` names
/// who needs them.
///
/// # Errors
/// Tools missing and apt-get absent or failing.
pub(crate) fn install_missing(what: &str, tools: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, _)| {
            if tool.starts_with('/') {
                !Path::new(tool).exists()
            } else {
                !has_command(tool)
            }
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !has_command("apt-get") {
        bail!("missing tools; install the packages: {}", missing.join(" "));
    }
    eprintln!("xtask: installing what {what} needs: {}", missing.join(" "));
    run(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(
        &mut install,
        &format!("apt-get install {}", missing.join(" ")),
    )
}

/// What a `cargo xtask test` from an empty target directory writes into it, bytes, with
/// room to spare: 10.6 GiB at its end (2026-12-06, `CARGO_INCREMENTAL=0` as CI runs it;
/// `du` every 30 s of a clean clone's target/); the release before's build added since
/// (2026-12-07: 17 GiB at the end with incremental compilation on, 4.1 GiB of it
/// incremental, so about 13 without).
const COLD_RUN_BYTES: u64 = 16 << 30;
/// Room any run needs for what it links and packages again.
const WARM_RUN_BYTES: u64 = 2 << 30;

/// Fails at once, saying so, when the disk that holds `target` lacks the room a run writes
/// (a cold one if `target` holds no build yet): a full disk otherwise ends the build a
/// quarter of an hour in, with a linker's bus error or a truncated file.
///
/// # Errors
/// Too little room, or `df` unable to say.
pub(crate) fn room_for_a_run(target: &Path) -> anyhow::Result<()> {
    let cold = !target.join("debug").is_dir();
    let on = if target.is_dir() {
        target
    } else {
        target.parent().context("target has a parent")?
    };
    let path = on.to_str().context("the target path is UTF-8")?;
    let answer = output("df", &["--output=avail", "-B1", path])
        .with_context(|| format!("df could not say how much room {path} has"))?;
    let free: u64 = answer
        .lines()
        .nth(1)
        .with_context(|| format!("df answered without a figure: {answer:?}"))?
        .trim()
        .parse()
        .with_context(|| format!("df's figure: {answer:?}"))?;
    judge_room(free, cold, path)
}

/// [`room_for_a_run`]'s verdict on `free` bytes at `path`.
fn judge_room(free: u64, cold: bool, path: &str) -> anyhow::Result<()> {
    let need = if cold { COLD_RUN_BYTES } else { WARM_RUN_BYTES };
    if free < need {
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        bail!(
            "{:.1} GiB free on the disk of {path}; a {} run needs about {:.0} GiB: free some room first",
            gib(free),
            if cold { "cold" } else { "warm" },
            gib(need)
        );
    }
    Ok(())
}

#[cfg(test)]
mod room_tests {
    use super::*;

    #[test]
    fn a_run_without_room_is_refused_before_it_starts() {
        let gib = 1u64 << 30;
        let e = judge_room(15 * gib, true, "/x/target")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("15.0 GiB free") && e.contains("cold run needs about 16"),
            "{e}"
        );
        judge_room(17 * gib, true, "/x/target").unwrap();
        assert!(judge_room(gib, false, "/x/target").is_err());
        judge_room(3 * gib, false, "/x/target").unwrap();
    }

    /// The disk this runs on answers (a figure, not an error), whatever its room.
    #[test]
    fn df_answers_for_the_target_directory() {
        let target = root().join("target");
        if let Err(e) = room_for_a_run(&target) {
            assert!(e.to_string().contains("GiB free on the disk"), "{e}");
        }
    }
}
