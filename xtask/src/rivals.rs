//! The tunnels `cargo xtask bench --table rivals` measures ours against, installed from their
//! registries into `target/rivals/bin` at pinned versions: wireguard-go and nebula from Go's
//! module proxy (built by a Go toolchain fetched from the same proxy, so that no system Go of
//! another version decides what is built), boringtun from crates.io; `wg` (wireguard-tools)
//! from apt. An installation whose versions match is kept.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::util;

/// The Go toolchain that builds the Go rivals (nebula 1.11 asks for Go 1.26).
const GO: &str = "1.26.8";
/// wireguard-go: the module's newest version when the table was first measured.
const WIREGUARD_GO: &str = "golang.zx2c4.com/wireguard@v0.0.0-20260522210424-ecfc5a8d5446";
/// nebula: the newest release whose dependencies the module proxy serves (1.11.1 and later
/// need modules it refuses).
const NEBULA: &str = "v1.11.0";
/// boringtun's command line, from crates.io.
const BORINGTUN: &str = "0.7.1";

/// The programs in `target/rivals/bin` (the bed's `cyphonic_e2e::rivals::PROGRAMS`).
const PROGRAMS: [&str; 4] = ["wireguard", "boringtun-cli", "nebula", "nebula-cert"];

/// Installs the rivals unless the installation there is of these versions; returns the
/// directory of their programs, for `CYPHONIC_RIVALS_DIR`.
///
/// # Errors
/// A download, a build or apt-get fails.
pub(crate) fn install(root: &Path) -> anyhow::Result<PathBuf> {
    util::install_missing(
        "installing the rivals",
        &[
            ("wg", "wireguard-tools"),
            ("curl", "curl"),
            ("unzip", "unzip"),
        ],
    )?;
    let dir = root.join("target/rivals");
    let bin = dir.join("bin");
    let stamp = bin.join("versions");
    let want = format!("go {GO}\n{WIREGUARD_GO}\nnebula {NEBULA}\nboringtun-cli {BORINGTUN}\n");
    let installed = std::fs::read_to_string(&stamp).is_ok_and(|s| s == want)
        && PROGRAMS.iter().all(|p| bin.join(p).is_file());
    if installed {
        return Ok(bin);
    }
    eprintln!("xtask: installing the rivals into {}", dir.display());
    let go = toolchain(&dir)?;
    let nebula = [
        format!("github.com/slackhq/nebula/cmd/nebula@{NEBULA}"),
        format!("github.com/slackhq/nebula/cmd/nebula-cert@{NEBULA}"),
    ];
    for module in [vec![WIREGUARD_GO.to_owned()], nebula.to_vec()] {
        let mut cmd = Command::new(&go);
        cmd.arg("install")
            .args(&module)
            .env("GOPATH", dir.join("go"))
            .env("GOCACHE", dir.join("go-build"))
            .env("GOBIN", &bin)
            .env("GOFLAGS", "-modcacherw")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0");
        util::run(&mut cmd, &format!("go install {}", module.join(" ")))?;
    }
    let mut cargo = util::cargo_command();
    cargo
        .args([
            "install",
            "--locked",
            "boringtun-cli",
            "--version",
            BORINGTUN,
        ])
        .arg("--root")
        .arg(&dir);
    util::run(&mut cargo, "cargo install boringtun-cli")?;
    for p in PROGRAMS {
        if !bin.join(p).is_file() {
            bail!("the installation left no {p} in {}", bin.display());
        }
    }
    std::fs::write(&stamp, want).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(bin)
}

/// Go [`GO`] from the module proxy (`golang.org/toolchain`, what `GOTOOLCHAIN` downloads),
/// unpacked under `dir` once; its `go`.
fn toolchain(dir: &Path) -> anyhow::Result<PathBuf> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no Go toolchain for {other}"),
    };
    let version = format!("v0.0.1-go{GO}.linux-{arch}");
    let unpacked = dir.join("toolchain");
    let go = unpacked.join(format!("golang.org/toolchain@{version}/bin/go"));
    if go.is_file() {
        return Ok(go);
    }
    std::fs::create_dir_all(&unpacked)?;
    let zip = unpacked.join(format!("{version}.zip"));
    util::run(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&zip)
            .arg(format!(
                "https://proxy.golang.org/golang.org/toolchain/@v/{version}.zip"
            )),
        "downloading the Go toolchain",
    )?;
    util::run(
        Command::new("unzip")
            .args(["-q", "-o"])
            .arg(&zip)
            .arg("-d")
            .arg(&unpacked),
        "unpacking the Go toolchain",
    )?;
    std::fs::remove_file(&zip)?;
    if !go.is_file() {
        bail!("the Go toolchain has no {}", go.display());
    }
    Ok(go)
}
