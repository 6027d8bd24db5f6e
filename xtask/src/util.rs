//! Running commands, finding the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

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
/// on the path; `what` names who needs them.
///
/// # Errors
/// Tools missing and apt-get absent or failing.
pub(crate) fn install_missing(what: &str, tools: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, _)| !has_command(tool))
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
