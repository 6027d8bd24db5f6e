//! `cargo xtask dist`: builds the three programs for a target and packages them as a .deb
//! (binaries, systemd units, example configurations, documentation, a postinst that creates
//! the service user and directories) and a tarball.
//!
//! Cross-compiling for the Raspberry Pi 4 (`aarch64-unknown-linux-gnu`) needs two things:
//! the target's Rust standard library and Debian's `gcc-aarch64-linux-gnu` (the linker, and
//! the C compiler for ring's assembly and tun-tap's ioctl helper). rustup cannot download a
//! standard library on these build machines; Debian ships one for its own newer compiler
//! (`rustc-web`, at /usr/bin/rustc, with `libstd-rust-web-dev:arm64`), which `dist` then
//! uses through `RUSTC` ([`rustc_for`]). `dist` checks for both before building and says
//! what to install. The command lines and environment it uses are unit-tested here;
//! `cargo xtask test` builds both packages and installs them into scratch roots.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

use crate::util;

/// The programs packaged, each with its systemd unit.
const PROGRAMS: [&str; 3] = ["cyphonic-adapter", "cyphonic-node", "cyphonic-cloud"];

/// Documents shipped in /usr/share/doc/cyphonic.
const DOCS: [&str; 5] = [
    "README.md",
    "ARCHITECTURE.md",
    "docs/operations.md",
    "docs/protocol.md",
    "docs/grafana-dashboard.json",
];

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
    for p in PROGRAMS {
        args.extend(["-p".to_owned(), p.to_owned()]);
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
    let has_gcc = target.cross.is_none_or(|prefix| {
        util::output("sh", &["-c", &format!("command -v {prefix}-gcc")]).is_some()
    });
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

/// The Debian control file.
pub(crate) fn control(version: &str, arch: &str, installed_kib: u64) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "Package: cyphonic");
    let _ = writeln!(c, "Version: {version}");
    let _ = writeln!(c, "Architecture: {arch}");
    let _ = writeln!(c, "Maintainer: cyphonic developers <dev@example.invalid>");
    let _ = writeln!(c, "Installed-Size: {installed_kib}");
    let _ = writeln!(c, "Depends: libc6, adduser | passwd");
    let _ = writeln!(c, "Section: net");
    let _ = writeln!(c, "Priority: optional");
    let _ = writeln!(
        c,
        "Description: end-to-end encrypted overlay for devices that cannot run VPN software"
    );
    let _ = writeln!(
        c,
        " cyphonic-adapter puts the devices on a gateway's LAN port onto the overlay, each with its"
    );
    let _ = writeln!(
        c,
        " own address and name; cyphonic-node puts a host on it; cyphonic-cloud finds peers,"
    );
    let _ = writeln!(
        c,
        " checks identities and relays where no direct path exists. See /usr/share/doc/cyphonic."
    );
    c
}

/// The postinst: the service user `cyphonic` and its directories. With `DPKG_ROOT` set (an
/// installation into another root, as the test does), it works on that root's files.
pub(crate) const POSTINST: &str = r#"#!/bin/sh
# cyphonic postinst: the service user and its directories.
set -e
root="${DPKG_ROOT:-}"
case "$1" in
  configure)
    if ! grep -q '^cyphonic:' "$root/etc/passwd" 2>/dev/null; then
      if [ -n "$root" ]; then
        useradd --prefix "$root" --system --user-group --home-dir /var/lib/cyphonic \
          --no-create-home --shell /usr/sbin/nologin cyphonic
      else
        useradd --system --user-group --home-dir /var/lib/cyphonic \
          --no-create-home --shell /usr/sbin/nologin cyphonic
      fi
    fi
    uid=$(awk -F: '$1 == "cyphonic" { print $3 }' "$root/etc/passwd")
    gid=$(awk -F: '$1 == "cyphonic" { print $3 }' "$root/etc/group")
    mkdir -p "$root/etc/cyphonic" "$root/var/lib/cyphonic"
    chown "0:$gid" "$root/etc/cyphonic"
    chmod 0750 "$root/etc/cyphonic"
    chown "$uid:$gid" "$root/var/lib/cyphonic"
    chmod 0700 "$root/var/lib/cyphonic"
    if [ -z "$root" ] && [ -d /run/systemd/system ]; then
      systemctl daemon-reload >/dev/null 2>&1 || true
    fi
    ;;
esac
exit 0
"#;

/// The postrm: on purge, the state and the user go.
pub(crate) const POSTRM: &str = r#"#!/bin/sh
set -e
root="${DPKG_ROOT:-}"
if [ "$1" = purge ]; then
  rm -rf "$root/var/lib/cyphonic"
  if [ -z "$root" ] && getent passwd cyphonic >/dev/null; then
    userdel cyphonic >/dev/null 2>&1 || true
  fi
fi
exit 0
"#;

/// Copies `from` to `to`, creating directories, with `mode`.
fn put(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(to: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(to, text)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The staged package tree: what the .deb installs, and the tarball holds.
fn stage(root: &Path, bins: &Path, dir: &Path, version: &str, arch: &str) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    for p in PROGRAMS {
        put(&bins.join(p), &dir.join("usr/bin").join(p), 0o755)?;
        put(
            &root.join("config").join(format!("{p}.service")),
            &dir.join("lib/systemd/system").join(format!("{p}.service")),
            0o644,
        )?;
    }
    for example in ["adapter", "node", "cloud"] {
        put(
            &root.join("config").join(format!("{example}.example.toml")),
            &dir.join("usr/share/doc/cyphonic/examples")
                .join(format!("{example}.example.toml")),
            0o644,
        )?;
    }
    for doc in DOCS {
        let name = Path::new(doc).file_name().context("a file name")?;
        put(
            &root.join(doc),
            &dir.join("usr/share/doc/cyphonic").join(name),
            0o644,
        )?;
    }
    let installed: u64 = walk(dir)?.iter().map(|(_, len)| *len).sum::<u64>() / 1024 + 1;
    write(
        &dir.join("DEBIAN/control"),
        &control(version, arch, installed),
        0o644,
    )?;
    write(&dir.join("DEBIAN/postinst"), POSTINST, 0o755)?;
    write(&dir.join("DEBIAN/postrm"), POSTRM, 0o755)?;
    Ok(())
}

/// Every file below `dir` with its size.
fn walk(dir: &Path) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            out.extend(walk(&entry.path())?);
        } else {
            out.push((entry.path(), meta.len()));
        }
    }
    Ok(out)
}

/// The package version: the workspace's.
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Builds and packages for `triple` with `profile`; returns the .deb's path.
///
/// # Errors
/// Something the build needs is missing (said what), the build or packaging fails.
pub(crate) fn run(triple: &str, profile: &str) -> anyhow::Result<PathBuf> {
    let root = util::root();
    let target = target(triple)?;
    let b = build(&target, profile);
    let env = environment(&target, &b)?;
    let args: Vec<&str> = b.args.iter().map(String::as_str).collect();
    util::cargo_with(&root, &args, &env)?;
    package(triple, &root.join(&b.out), profile)
}

/// Packages the programs already built in `bins` for `triple` (`profile` chooses the
/// compression); returns the .deb's path. `cargo xtask test` packages what its tiers built
/// rather than building the programs once more with another feature set.
///
/// # Errors
/// A program is missing from `bins`, or packaging fails.
pub(crate) fn package(triple: &str, bins: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    let root = util::root();
    let target = target(triple)?;
    let dist = root.join("target/dist");
    let name = format!("cyphonic_{}_{}", version(), target.deb_arch);
    let staged = dist.join(&name);
    stage(&root, bins, &staged, version(), target.deb_arch)?;
    let deb = dist.join(format!("{name}.deb"));
    // A quick check's large unoptimised binaries need no strong (slow) compression.
    let compression = if profile == "release" {
        "-Zxz"
    } else {
        "-Zgzip"
    };
    util::run(
        Command::new("dpkg-deb").args([
            "--root-owner-group",
            compression,
            "--build",
            staged.to_str().context("path")?,
            deb.to_str().context("path")?,
        ]),
        "dpkg-deb --build",
    )?;
    let tarball = dist.join(format!("cyphonic-{}-{}.tar.gz", version(), target.triple));
    util::run(
        Command::new("tar").args([
            "--owner=0",
            "--group=0",
            "--exclude=DEBIAN",
            "-czf",
            tarball.to_str().context("path")?,
            "-C",
            staged.to_str().context("path")?,
            ".",
        ]),
        "tar",
    )?;
    eprintln!("xtask: {}\nxtask: {}", deb.display(), tarball.display());
    Ok(deb)
}

/// Installs `deb` into a scratch root with dpkg (maintainer scripts run outside a chroot,
/// on that root: `DPKG_ROOT`) and checks what landed: binaries, units, the service user, the
/// directories and their modes. The scratch root is removed afterwards.
///
/// # Errors
/// The installation fails, or a check does.
pub(crate) fn check_install(deb: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let scratch = std::env::temp_dir().join(format!("cyphonic-dist-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let result = (|| -> anyhow::Result<()> {
        for d in [
            "etc",
            "var/lib/dpkg/info",
            "var/lib/dpkg/updates",
            "var/log",
        ] {
            std::fs::create_dir_all(scratch.join(d))?;
        }
        write(&scratch.join("var/lib/dpkg/status"), "", 0o644)?;
        write(
            &scratch.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n",
            0o644,
        )?;
        write(&scratch.join("etc/group"), "root:x:0:\n", 0o644)?;
        write(
            &scratch.join("etc/shadow"),
            "root:*:19000:0:99999:7:::\n",
            0o640,
        )?;
        write(&scratch.join("etc/gshadow"), "root:*::\n", 0o640)?;
        let admin = format!("--admindir={}", scratch.join("var/lib/dpkg").display());
        util::run(
            Command::new("dpkg").args([
                &format!("--root={}", scratch.display()),
                &admin,
                "--force-script-chrootless",
                "--force-not-root",
                "--force-depends",
                // The scratch database knows no foreign architecture (the arm64 package).
                "--force-architecture",
                &format!("--log={}", scratch.join("var/log/dpkg.log").display()),
                "--install",
                deb.to_str().context("path")?,
            ]),
            "dpkg --install (scratch root)",
        )?;
        for p in PROGRAMS {
            let bin = scratch.join("usr/bin").join(p);
            let mode = std::fs::metadata(&bin)
                .with_context(|| format!("{} not installed", bin.display()))?
                .permissions()
                .mode();
            ensure!(mode & 0o111 != 0, "{} is not executable", bin.display());
            let unit = std::fs::read_to_string(
                scratch
                    .join("lib/systemd/system")
                    .join(format!("{p}.service")),
            )?;
            ensure!(
                unit.contains(&format!("ExecStart=/usr/bin/{p} ")),
                "{p}.service does not start /usr/bin/{p}"
            );
        }
        let passwd = std::fs::read_to_string(scratch.join("etc/passwd"))?;
        let user = passwd
            .lines()
            .find(|l| l.starts_with("cyphonic:"))
            .context("the postinst created no cyphonic user")?;
        let uid: u32 = user.split(':').nth(2).context("uid")?.parse()?;
        ensure!(
            user.ends_with(":/var/lib/cyphonic:/usr/sbin/nologin"),
            "the cyphonic user: {user}"
        );
        let etc = std::fs::metadata(scratch.join("etc/cyphonic"))?;
        ensure!(
            etc.mode() & 0o777 == 0o750,
            "/etc/cyphonic mode {:o}",
            etc.mode()
        );
        let state = std::fs::metadata(scratch.join("var/lib/cyphonic"))?;
        ensure!(
            state.mode() & 0o777 == 0o700 && state.uid() == uid,
            "/var/lib/cyphonic mode {:o} uid {}",
            state.mode(),
            state.uid()
        );
        ensure!(
            scratch
                .join("usr/share/doc/cyphonic/examples/adapter.example.toml")
                .exists(),
            "no example configuration"
        );
        let listed = util::output("dpkg-deb", &["--contents", deb.to_str().context("path")?])
            .unwrap_or_default();
        ensure!(
            listed.contains("./usr/bin/cyphonic-adapter") && listed.contains("root/root"),
            "the package's files are not root-owned: {listed}"
        );
        eprintln!(
            "xtask: {} installs into a scratch root as expected",
            deb.display()
        );
        verify_units(&scratch)?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Checks the installed units with systemd's own tools, on `root` (where the package was
/// installed): `systemd-analyze verify` must have nothing to say (it exits 0 even on an
/// unknown key, so any output fails), and `systemd-analyze security` rates each unit, which
/// is printed (docs/operations.md records the figures). The units they name from systemd
/// itself, and `/bin/kill`, are copied from this machine into `root` first.
///
/// # Errors
/// systemd-analyze is missing, or says something about a unit.
fn verify_units(root: &Path) -> anyhow::Result<()> {
    let units = root.join("lib/systemd/system");
    for e in std::fs::read_dir("/lib/systemd/system").context("this machine's systemd units")? {
        let e = e?;
        let to = units.join(e.file_name());
        if !to.exists() && e.file_type()?.is_file() {
            std::fs::copy(e.path(), &to)?;
        }
    }
    std::fs::create_dir_all(root.join("bin"))?;
    std::fs::copy("/bin/kill", root.join("bin/kill")).context("/bin/kill")?;
    let root_arg = format!("--root={}", root.display());
    let paths: Vec<String> = PROGRAMS
        .iter()
        .map(|p| format!("/lib/systemd/system/{p}.service"))
        .collect();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&root_arg)
        .args(&paths)
        .output()
        .context("systemd-analyze (Debian: apt-get install systemd)")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
    for p in PROGRAMS {
        let out = Command::new("systemd-analyze")
            .args([
                "security",
                "--offline=yes",
                &root_arg,
                &format!("{p}.service"),
            ])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let overall = text
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .with_context(|| format!("systemd-analyze security {p}: {text}"))?;
        eprintln!("xtask: {}", overall.trim_start_matches('→').trim());
    }
    eprintln!("xtask: systemd-analyze verify: the units are clean");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Pi's build: the aarch64 target, Debian's cross gcc as linker and C compiler (ring
    /// and tun-tap compile C), binaries under target/aarch64-unknown-linux-gnu/release.
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

    #[test]
    fn the_control_file_names_the_architecture() {
        let c = control("0.1.0", "arm64", 12_000);
        assert!(
            c.contains("Package: cyphonic\nVersion: 0.1.0\nArchitecture: arm64\n"),
            "{c}"
        );
        assert!(c.lines().skip(9).all(|l| l.starts_with(' ')), "{c}");
    }
}
