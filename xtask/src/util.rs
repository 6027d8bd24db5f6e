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
        Command::new(cargo_program())
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
