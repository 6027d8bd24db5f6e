//! The apt repository `cargo xtask dist` makes beside the packages (issue 57): `pool/main`
//! with the .debs, `dists/stable/main/binary-<arch>/Packages` (and `.gz`), and the suite's
//! `Release`, made by `apt-ftparchive`, signed with the operator's OpenPGP key (`InRelease`
//! and `Release.gpg`, gpg), whose public half is exported beside it as
//! `cyphonic-archive-keyring.gpg` for `signed-by=`. Served by any web server, or as a
//! directory (`file:`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, ensure};

use crate::util;

/// The suite and component every repository has.
pub(crate) const SUITE: &str = "stable";
/// The component.
pub(crate) const COMPONENT: &str = "main";
/// The public key's file, in the repository's root.
pub(crate) const KEYRING: &str = "cyphonic-archive-keyring.gpg";

/// Who signs: a key in a GnuPG home.
#[derive(Debug, Clone)]
pub(crate) struct Signer {
    /// The key's id or fingerprint (as `gpg --local-user` takes it).
    pub(crate) key: String,
    /// The GnuPG home holding it; none: gpg's default.
    pub(crate) home: Option<PathBuf>,
}

impl Signer {
    /// `gpg` with this signer's home, in batch mode.
    fn gpg(&self) -> Command {
        let mut cmd = Command::new("gpg");
        if let Some(home) = &self.home {
            cmd.arg("--homedir").arg(home);
        }
        cmd.args(["--batch", "--yes", "--local-user", &self.key]);
        cmd
    }

    /// Signs `release` inline into `out` (a suite's `InRelease`).
    ///
    /// # Errors
    /// gpg fails.
    pub(crate) fn clearsign(&self, release: &Path, out: &Path) -> anyhow::Result<()> {
        util::run(
            self.gpg()
                .arg("--clearsign")
                .arg("--output")
                .arg(out)
                .arg(release),
            "gpg --clearsign (InRelease)",
        )
    }

    /// A new signing key (Ed25519, no passphrase) in a GnuPG home of its own at `home`, for
    /// tests: what an operator makes once and keeps.
    ///
    /// # Errors
    /// gpg fails.
    pub(crate) fn throwaway(home: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(home)?;
        std::fs::set_permissions(home, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let uid = "cyphonic test archive <archive@example.invalid>";
        util::run(
            Command::new("gpg")
                .arg("--homedir")
                .arg(home)
                .args(["--batch", "--passphrase", "", "--quick-gen-key", uid])
                .args(["ed25519", "sign", "never"]),
            "gpg --quick-gen-key",
        )?;
        Ok(Self {
            key: uid.to_owned(),
            home: Some(home.to_owned()),
        })
    }
}

/// Makes the repository of `debs` (of the architectures `arches`, `all` included) in
/// `out`, signed by `signer`; returns its root. An existing one there is replaced.
///
/// # Errors
/// apt-ftparchive or gpg is missing or fails.
pub(crate) fn make(
    debs: &[PathBuf],
    arches: &[&str],
    out: &Path,
    signer: &Signer,
) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(out);
    let pool = out.join("pool").join(COMPONENT);
    std::fs::create_dir_all(&pool)?;
    for deb in debs {
        let name = deb.file_name().context("a package without a name")?;
        std::fs::copy(deb, pool.join(name))?;
    }
    let dists = out.join("dists").join(SUITE);
    for arch in arches.iter().filter(|a| **a != "all") {
        let dir = dists.join(COMPONENT).join(format!("binary-{arch}"));
        std::fs::create_dir_all(&dir)?;
        let packages = ftparchive(
            out,
            &["--arch", arch, "packages", &format!("pool/{COMPONENT}")],
        )?;
        std::fs::write(dir.join("Packages"), &packages)?;
        util::run(
            Command::new("gzip")
                .args(["-9nkf"])
                .arg(dir.join("Packages")),
            "gzip Packages",
        )?;
    }
    let release = ftparchive(
        out,
        &[
            "-o",
            &format!("APT::FTPArchive::Release::Suite={SUITE}"),
            "-o",
            &format!("APT::FTPArchive::Release::Codename={SUITE}"),
            "-o",
            &format!("APT::FTPArchive::Release::Components={COMPONENT}"),
            "-o",
            &format!(
                "APT::FTPArchive::Release::Architectures={}",
                arches.join(" ")
            ),
            "-o",
            "APT::FTPArchive::Release::Origin=cyphonic",
            "-o",
            "APT::FTPArchive::Release::Label=cyphonic",
            "release",
            &format!("dists/{SUITE}"),
        ],
    )?;
    let release_file = dists.join("Release");
    std::fs::write(&release_file, release)?;
    signer.clearsign(&release_file, &dists.join("InRelease"))?;
    util::run(
        signer
            .gpg()
            .args(["--armor", "--detach-sign", "--output"])
            .arg(dists.join("Release.gpg"))
            .arg(&release_file),
        "gpg --detach-sign (Release.gpg)",
    )?;
    util::run(
        signer
            .gpg()
            .arg("--output")
            .arg(out.join(KEYRING))
            .args(["--export", &signer.key]),
        "gpg --export (the keyring)",
    )?;
    ensure!(
        std::fs::metadata(out.join(KEYRING))?.len() > 0,
        "gpg exported no key for {}",
        signer.key
    );
    eprintln!("xtask: apt repository in {}", out.display());
    Ok(out.to_owned())
}

/// `apt-ftparchive ARGS`, run in `dir`: what it printed.
fn ftparchive(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("apt-ftparchive")
        .args(args)
        .current_dir(dir)
        .output()
        .context("apt-ftparchive (apt-utils) is needed to make the repository")?;
    ensure!(
        out.status.success(),
        "apt-ftparchive {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
