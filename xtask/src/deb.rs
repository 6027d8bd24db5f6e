//! The Debian packages, one per program and one they share:
//!
//! - `cyphonic-common` (`Architecture: all`): the service user `cyphonic`, the directories
//!   the programs share (`/etc/cyphonic`, `/var/lib/cyphonic`), the documents and example
//!   configurations. Purging it removes the state.
//! - `cyphonic-adapter`, `cyphonic-node`, `cyphonic-cloud`: the program (stripped), its
//!   systemd unit, its configuration in `/etc/cyphonic` as a conffile (the example; the
//!   daemon refuses it, exit 78, until the site's names and keys are in), maintainer scripts
//!   that restart a running service on upgrade and stop it on removal (config/debian/).
//!   Their shared-library dependencies are computed from the binary by `dpkg-shlibdeps`.
//!
//! Built with `dpkg-deb` from staged trees; checked by `lintian` (errors fail; the warnings
//! and why they stay are in docs/operations.md) and by installing, upgrading, removing and
//! purging them in a scratch root ([`check_install`]).

use std::fmt::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

use crate::repo::Signer;
use crate::util;

/// A program's package.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Program {
    /// The package, the binary and the unit's name.
    pub(crate) name: &'static str,
    /// Its configuration file in /etc/cyphonic (a conffile), shipped from config/ (the
    /// starter: what a first start needs).
    config: &'static str,
    /// The full example (config/), every key with its default, shipped as a document.
    example: &'static str,
    /// The control file's synopsis.
    synopsis: &'static str,
    /// The control file's long description, one paragraph.
    description: &'static str,
}

/// The programs, each in its own package.
pub(crate) const PROGRAMS: [Program; 3] = [
    Program {
        name: "cyphonic-adapter",
        config: "adapter.toml",
        example: "adapter.example.toml",
        synopsis: "overlay gateway for devices that cannot run VPN software",
        description: "The adapter runs on a gateway with two ports. Devices plugged into its LAN port get an overlay address and name by DHCP, and their traffic is carried end-to-end encrypted (ChaCha20-Poly1305 over UDP) to the other members of the overlay.",
    },
    Program {
        name: "cyphonic-node",
        config: "node.toml",
        example: "node.example.toml",
        synopsis: "overlay member for a single host",
        description: "The node puts the host it runs on onto the overlay through a TUN interface, with its own certificate, and resolves the overlay's names for it. Without privileges it runs the overlay's TCP in the process instead, behind a SOCKS5 proxy and port forwards on loopback.",
    },
    Program {
        name: "cyphonic-cloud",
        config: "cloud.toml",
        example: "cloud.example.toml",
        synopsis: "identity, signalling and relay service of the overlay",
        description: "The cloud enrolls members and certifies them, tells them where their peers are, answers for the overlay's names, pushes policy and revocations, and relays traffic where no direct path exists.",
    },
];

/// The shared package.
pub(crate) const COMMON: &str = "cyphonic-common";

/// Documents shipped in /usr/share/doc/cyphonic-common (those of docs/ at their place below
/// it: the guide's links hold there too).
const DOCS: [&str; 16] = [
    "README.md",
    "ARCHITECTURE.md",
    "docs/guide.md",
    "docs/getting-started.md",
    "docs/concepts.md",
    "docs/troubleshooting.md",
    "docs/operations.md",
    "docs/protocol.md",
    "docs/grafana-dashboard.json",
    "docs/configuration/adapter.md",
    "docs/configuration/node.md",
    "docs/configuration/cloud.md",
    "docs/cli/adapter.md",
    "docs/cli/node.md",
    "docs/cli/cloud.md",
    "docs/security.md",
];

const MAINTAINER: &str = "cyphonic developers <dev@example.invalid>";

/// The package version: the workspace's.
pub(crate) fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// A control file. `arch` is `all` for the common package; `depends` is the `Depends`
/// field's value.
pub(crate) fn control(
    package: &str,
    arch: &str,
    installed_kib: u64,
    depends: &str,
    synopsis: &str,
    description: &str,
) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "Package: {package}");
    let _ = writeln!(c, "Source: cyphonic");
    let _ = writeln!(c, "Version: {}", version());
    let _ = writeln!(c, "Architecture: {arch}");
    let _ = writeln!(c, "Maintainer: {MAINTAINER}");
    let _ = writeln!(c, "Installed-Size: {installed_kib}");
    let _ = writeln!(c, "Depends: {depends}");
    let _ = writeln!(c, "Section: net");
    let _ = writeln!(c, "Priority: optional");
    let _ = writeln!(c, "Description: {synopsis}");
    for line in wrap(description, 78) {
        let _ = writeln!(c, " {line}");
    }
    c
}

/// `text` in lines of at most `width` characters (words are not split).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("never empty");
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(word.to_owned());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

/// The copyright file every package carries (machine-readable, DEP-5).
const COPYRIGHT: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: cyphonic
Upstream-Contact: cyphonic developers <dev@example.invalid>

Files: *
Copyright: 2026 cyphonic developers
License: Apache-2.0 or MIT

License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 can be found in
 /usr/share/common-licenses/Apache-2.0.

License: MIT
 Permission is hereby granted, free of charge, to any person obtaining a copy of this
 software and associated documentation files (the \"Software\"), to deal in the Software
 without restriction, including without limitation the rights to use, copy, modify, merge,
 publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
 to whom the Software is furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in all copies or
 substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
 INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
 PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
 FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
 OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 DEALINGS IN THE SOFTWARE.
";

/// The Debian changelog of a native package: one entry for this version, dated `date`
/// (RFC 2822).
fn changelog(date: &str) -> String {
    format!(
        "cyphonic ({}) unstable; urgency=medium\n\n  * Release {}: see /usr/share/doc/cyphonic-common/README.md.\n\n -- {MAINTAINER}  {date}\n",
        version(),
        version()
    )
}

/// The time every timestamp of the packages is taken from, unix seconds: `SOURCE_DATE_EPOCH`
/// when set (reproducible-builds.org), else the last commit's time, so that a package built
/// twice from one commit is the same file; now, outside a git checkout without it.
pub(crate) fn source_date_epoch(root: &Path) -> u64 {
    if let Some(given) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return given;
    }
    util::output(
        "git",
        &[
            "-C",
            &root.display().to_string(),
            "log",
            "-1",
            "--format=%ct",
        ],
    )
    .and_then(|e| e.trim().parse().ok())
    .unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// `epoch` ([`source_date_epoch`]) as RFC 2822, the changelog's date.
fn release_date(epoch: u64) -> String {
    let at = format!("@{epoch}");
    util::output("date", &["-u", "-R", "-d", &at]).unwrap_or_default()
}

/// A maintainer script from config/debian, for `program` where it is a template.
fn script(root: &Path, file: &str, program: Option<&Program>) -> anyhow::Result<String> {
    let path = root.join("config/debian").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(match program {
        Some(p) => text
            .replace("@PROGRAM@", p.name)
            .replace("@CONFIG@", p.config),
        None => text,
    })
}

/// Copies `from` to `to`, creating directories, with `mode`.
fn put(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    let bytes = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    write(to, bytes, mode)
}

/// Writes `contents` to `to`, creating directories, with `mode`.
fn write(to: &Path, contents: impl AsRef<[u8]>, mode: u32) -> anyhow::Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(to, contents).with_context(|| format!("writing {}", to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
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

/// The installed size of a staged tree, in KiB (what `Installed-Size` says).
fn installed_kib(tree: &Path) -> anyhow::Result<u64> {
    let bytes: u64 = walk(tree)?
        .iter()
        .filter(|(p, _)| !p.strip_prefix(tree).is_ok_and(|r| r.starts_with("DEBIAN")))
        .map(|(_, len)| *len)
        .sum();
    Ok(bytes.div_ceil(1024))
}

/// The doc directory every package has: its copyright and changelog.
fn doc_dir(tree: &Path, package: &str, changelog_text: &str) -> anyhow::Result<()> {
    let doc = tree.join("usr/share/doc").join(package);
    write(&doc.join("copyright"), COPYRIGHT, 0o644)?;
    write(&doc.join("changelog"), changelog_text, 0o644)?;
    util::run(
        Command::new("gzip")
            .args(["-9", "-n", "-f"])
            .arg(doc.join("changelog")),
        "gzip the changelog",
    )
}

/// How to build the packages of one architecture.
#[derive(Debug)]
pub(crate) struct Packaging<'a> {
    /// Debian's name for the architecture of the programs.
    pub(crate) arch: &'a str,
    /// The `strip` for that architecture's binaries.
    pub(crate) strip: &'a str,
    /// dpkg-deb's compression option.
    pub(crate) compression: &'a str,
    /// The programs packaged (each its own package, beside the common one).
    pub(crate) programs: &'a [Program],
    /// What runs a program built for `arch` here (the emulator and its arguments; empty for
    /// this machine's own).
    pub(crate) runner: &'a [String],
}

/// Where a package's shell completions go, each with the file name a shell looks for.
const COMPLETIONS: [(&str, &str, &str); 3] = [
    ("bash", "usr/share/bash-completion/completions", ""),
    ("zsh", "usr/share/zsh/vendor-completions", "_"),
    ("fish", "usr/share/fish/vendor_completions.d", ""),
];

/// Puts `program`'s man pages (gzipped, as Debian wants them) and its shell completions into
/// `tree`, as the program itself writes them from its command line (`manual`,
/// `completions`), run with `runner` in front.
fn manual(tree: &Path, program: &Path, name: &str, runner: &[String]) -> anyhow::Result<()> {
    let run = |args: &[&str]| {
        let mut c = match runner.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        c.args(args);
        c
    };
    let pages = tree.join("usr/share/man/man1");
    std::fs::create_dir_all(&pages)?;
    let dir = pages.to_str().context("a path in UTF-8")?;
    util::run(
        &mut run(&["manual", "--dir", dir]),
        &format!("{name} manual"),
    )?;
    for (page, _) in walk(&pages)? {
        // -n: no name or time in the header, so that two builds give the same bytes.
        util::run(
            Command::new("gzip").args(["-9", "-n", "-f"]).arg(&page),
            &format!("gzip {}", page.display()),
        )?;
        std::fs::set_permissions(
            page.with_extension("1.gz"),
            std::fs::Permissions::from_mode(0o644),
        )?;
    }
    for (shell, dir, prefix) in COMPLETIONS {
        let out = run(&["completions", shell])
            .output()
            .with_context(|| format!("{name} completions {shell}"))?;
        anyhow::ensure!(
            out.status.success() && !out.stdout.is_empty(),
            "{name} completions {shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        write(
            &tree.join(dir).join(format!("{prefix}{name}")),
            &out.stdout,
            0o644,
        )?;
    }
    Ok(())
}

/// Stages and builds every package from the programs in `bins` under `out`
/// (`out/debian/<package>` are the staged trees; dpkg-shlibdeps wants them there). Returns
/// the .deb files, the common one first.
///
/// # Errors
/// A program is missing, a tool fails.
pub(crate) fn build(
    root: &Path,
    how: &Packaging<'_>,
    bins: &Path,
    out: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    let compression = how.compression;
    let work = out.join("debian");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    // dpkg-shlibdeps reads debian/control of the "source" it runs in.
    write(
        &work.join("control"),
        "Source: cyphonic\n\nPackage: cyphonic-adapter\nArchitecture: any\n",
        0o644,
    )?;
    let epoch = source_date_epoch(root);
    let log = changelog(&release_date(epoch));
    let mut debs = Vec::new();

    let tree = work.join(COMMON);
    for doc in DOCS {
        let name = doc.strip_prefix("docs/").unwrap_or(doc);
        put(
            &root.join(doc),
            &tree.join("usr/share/doc").join(COMMON).join(name),
            0o644,
        )?;
    }
    for p in &PROGRAMS {
        put(
            &root.join("config").join(p.example),
            &tree
                .join("usr/share/doc")
                .join(COMMON)
                .join("examples")
                .join(p.example),
            0o644,
        )?;
    }
    std::fs::create_dir_all(tree.join("etc/cyphonic"))?;
    doc_dir(&tree, COMMON, &log)?;
    let size = installed_kib(&tree)?;
    write(
        &tree.join("DEBIAN/control"),
        control(
            COMMON,
            "all",
            size,
            "passwd",
            "shared files of the cyphonic overlay's programs",
            "The service user the cyphonic programs run as, the directories they share, and the documentation with example configurations.",
        ),
        0o644,
    )?;
    write(
        &tree.join("DEBIAN/postinst"),
        &script(root, "common.postinst", None)?,
        0o755,
    )?;
    write(
        &tree.join("DEBIAN/postrm"),
        &script(root, "common.postrm", None)?,
        0o755,
    )?;
    debs.push(pack(&tree, out, COMMON, "all", compression, epoch)?);

    let strip = how.strip;
    for p in how.programs {
        let tree = work.join(p.name);
        let bin = tree.join("usr/bin").join(p.name);
        put(&bins.join(p.name), &bin, 0o755)?;
        manual(&tree, &bins.join(p.name), p.name, how.runner)?;
        // As dh_strip does; a panic still names its file and line.
        util::run(
            Command::new(strip)
                .args([
                    "--remove-section=.comment",
                    "--remove-section=.note",
                    "--strip-unneeded",
                ])
                .arg(&bin),
            &format!("{strip} {}", p.name),
        )?;
        put(
            &root.join("config").join(format!("{}.service", p.name)),
            &tree
                .join("lib/systemd/system")
                .join(format!("{}.service", p.name)),
            0o644,
        )?;
        // The conffile is the starter (what a first start needs, with "fill in" where no
        // value works everywhere); the full example is in cyphonic-common's doc.
        put(
            &root.join("config").join(p.config),
            &tree.join("etc/cyphonic").join(p.config),
            0o644,
        )?;
        doc_dir(&tree, p.name, &log)?;
        let shlibs = shlibdeps(&work, &bin)?;
        let size = installed_kib(&tree)?;
        write(
            &tree.join("DEBIAN/control"),
            control(
                p.name,
                how.arch,
                size,
                &format!("{shlibs}, {COMMON} (= {})", version()),
                p.synopsis,
                p.description,
            ),
            0o644,
        )?;
        write(
            &tree.join("DEBIAN/conffiles"),
            format!("/etc/cyphonic/{}\n", p.config),
            0o644,
        )?;
        for (file, name) in [
            ("program.postinst", "postinst"),
            ("program.prerm", "prerm"),
            ("program.postrm", "postrm"),
        ] {
            write(
                &tree.join("DEBIAN").join(name),
                &script(root, file, Some(p))?,
                0o755,
            )?;
        }
        debs.push(pack(&tree, out, p.name, how.arch, compression, epoch)?);
    }
    Ok(debs)
}

/// The `shlibs:Depends` of `binary` (versioned: what its symbols need), from
/// dpkg-shlibdeps run in `work` (which holds debian/control).
fn shlibdeps(work: &Path, binary: &Path) -> anyhow::Result<String> {
    let source = work.parent().context("the staging directory")?;
    let relative = binary.strip_prefix(source).unwrap_or(binary);
    let out = Command::new("dpkg-shlibdeps")
        .arg("-O")
        .arg(format!("-e{}", relative.display()))
        .current_dir(source)
        .output()
        .context("dpkg-shlibdeps (Debian: apt-get install dpkg-dev)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "dpkg-shlibdeps {}: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let depends = text
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .with_context(|| format!("dpkg-shlibdeps said no dependencies: {text}"))?;
    ensure!(
        depends.contains("libc6 (>="),
        "dpkg-shlibdeps gave no versioned libc6: {depends}"
    );
    Ok(depends.trim().to_owned())
}

/// Builds `<package>_<version>_<arch>.deb` in `out` from `tree`, every timestamp `epoch`
/// ([`source_date_epoch`]).
fn pack(
    tree: &Path,
    out: &Path,
    package: &str,
    arch: &str,
    compression: &str,
    epoch: u64,
) -> anyhow::Result<PathBuf> {
    let deb = out.join(format!("{package}_{}_{arch}.deb", version()));
    // dpkg-deb dates the ar members with it and clamps every file's mtime to it.
    util::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", compression, "--build"])
            .arg(tree)
            .arg(&deb)
            .env("SOURCE_DATE_EPOCH", epoch.to_string()),
        "dpkg-deb --build",
    )?;
    Ok(deb)
}

/// Runs lintian on `debs`: an error fails; what it says is printed (the warnings and
/// informational tags that stay are listed, with their reasons, in docs/operations.md).
///
/// # Errors
/// lintian is missing or reports an error.
pub(crate) fn lint(debs: &[PathBuf]) -> anyhow::Result<()> {
    let out = Command::new("lintian")
        .args(["--fail-on", "error", "--tag-display-limit", "0"])
        .args(debs)
        .output()
        .context("lintian (Debian: apt-get install lintian)")?;
    let said = String::from_utf8_lossy(&out.stdout);
    eprint!("{said}");
    ensure!(
        out.status.success(),
        "lintian found errors in the packages:\n{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("xtask: lintian: no errors in {} packages", debs.len());
    Ok(())
}

/// A scratch Debian root to install the packages into: dpkg runs the maintainer scripts
/// chrooted into it, as on a real system. Its /usr is this machine's, seen through an overlay
/// (the packages' files land in the overlay's upper layer, this machine's /usr is not
/// touched), mounted in a private mount namespace for each command, so nothing stays mounted.
/// `systemctl` and `deb-systemd-invoke` are stubs that log what the scripts asked of them, and
/// /run/systemd/system exists: the scripts act as under a running systemd.
struct Scratch {
    /// Everything: the root, the overlay's layers.
    base: PathBuf,
    /// The root dpkg installs into.
    root: PathBuf,
    /// The overlay's upper layer: what the packages put in /usr.
    usr: PathBuf,
}

/// The log the stubs write, inside the root.
const SERVICE_LOG: &str = "var/log/cyphonic-services.log";

/// The search path of dpkg and the maintainer scripts.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Scratch {
    fn new(base: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_dir_all(base);
        let root = base.join("root");
        let usr = base.join("upper");
        for d in [
            "var/lib/dpkg/info",
            "var/lib/dpkg/updates",
            "var/log",
            "tmp",
            "usr",
        ] {
            std::fs::create_dir_all(root.join(d))?;
        }
        std::fs::create_dir_all(root.join("run/systemd/system"))?;
        std::fs::create_dir_all(base.join("work"))?;
        for (link, to) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            std::os::unix::fs::symlink(to, root.join(link))?;
        }
        for (file, text, mode) in [
            ("var/lib/dpkg/status", "", 0o644),
            ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644),
            ("etc/group", "root:x:0:\n", 0o644),
            ("etc/shadow", "root:*:19000:0:99999:7:::\n", 0o640),
            ("etc/gshadow", "root:*::\n", 0o640),
        ] {
            write(&root.join(file), text, mode)?;
        }
        if Path::new("/etc/login.defs").exists() {
            put(
                Path::new("/etc/login.defs"),
                &root.join("etc/login.defs"),
                0o644,
            )?;
        }
        std::fs::create_dir_all(root.join("dev"))?;
        util::run(
            Command::new("mknod")
                .args(["-m", "666"])
                .arg(root.join("dev/null"))
                .args(["c", "1", "3"]),
            "mknod dev/null (scratch root)",
        )?;
        for stub in ["systemctl", "deb-systemd-invoke"] {
            write(
                &usr.join("local/sbin").join(stub),
                format!("#!/bin/sh\necho \"{stub} $*\" >> /{SERVICE_LOG}\n"),
                0o755,
            )?;
        }
        Ok(Self {
            base: base.to_owned(),
            root,
            usr,
        })
    }

    /// Runs `program args` in a private mount namespace with the root's /usr mounted.
    fn run(&self, program: &str, args: &[String], what: &str) -> anyhow::Result<()> {
        let overlay = format!(
            "lowerdir=/usr,upperdir={},workdir={}",
            self.usr.display(),
            self.base.join("work").display()
        );
        util::run(
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg("mount -t overlay overlay -o \"$1\" \"$2\" && shift 2 && exec \"$@\"")
                .arg("sh")
                .arg(overlay)
                .arg(self.root.join("usr"))
                .arg(program)
                .args(args)
                .env("PATH", PATH)
                .stdin(std::process::Stdio::null()),
            what,
        )
    }

    /// dpkg on the root: dependencies outside our packages are not there, nor is the
    /// foreign architecture; a changed configuration is kept, as an administrator would.
    fn dpkg(&self, args: &[String]) -> anyhow::Result<()> {
        let mut all = vec![
            format!("--root={}", self.root.display()),
            "--force-depends".to_owned(),
            "--force-architecture".to_owned(),
            "--force-confold".to_owned(),
            format!("--log={}", self.root.join("var/log/dpkg.log").display()),
        ];
        all.extend_from_slice(args);
        self.run(
            "dpkg",
            &all,
            &format!("dpkg {} (scratch root)", args.join(" ")),
        )
    }

    /// What the maintainer scripts asked of systemd since the last call; the log restarts.
    fn services(&self) -> anyhow::Result<String> {
        let path = self.root.join(SERVICE_LOG);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        write(&path, "", 0o644)?;
        Ok(text)
    }

    /// Points the root's apt at the signed repository `repo` (as [`crate::repo::make`]
    /// made it), copied into the root as /repo, with its key for `Signed-By`, as the image
    /// and the docs do; the root's package database is this machine's, so that the packages'
    /// own dependencies are there. Again later: the repository's new contents replace the
    /// copy (the next `apt-get update` reads them).
    fn apt_sources(&self, repo: &Path) -> anyhow::Result<()> {
        if !self.path("etc/apt/sources.list.d").exists() {
            put(
                Path::new("/var/lib/dpkg/status"),
                &self.path("var/lib/dpkg/status"),
                0o644,
            )?;
        }
        for dir in [
            "etc/apt/apt.conf.d",
            "etc/apt/preferences.d",
            "etc/apt/sources.list.d",
            "etc/apt/keyrings",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/log/apt",
        ] {
            std::fs::create_dir_all(self.path(dir))?;
        }
        let copy = self.path("repo");
        let _ = std::fs::remove_dir_all(&copy);
        util::run(
            Command::new("cp").arg("-a").arg(repo).arg(&copy),
            "copying the repository into the scratch root",
        )?;
        put(
            &repo.join(crate::repo::KEYRING),
            &self.path("etc/apt/keyrings/cyphonic.gpg"),
            0o644,
        )?;
        write(
            &self.path("etc/apt/sources.list.d/cyphonic.sources"),
            format!(
                "Types: deb\nURIs: file:/repo\nSuites: {}\nComponents: {}\nSigned-By: /etc/apt/keyrings/cyphonic.gpg\n",
                crate::repo::SUITE,
                crate::repo::COMPONENT
            ),
            0o644,
        )
    }

    /// `apt-get ARGS` chrooted into the root (after [`Self::apt_sources`]), its standard
    /// input closed: a question it or dpkg would ask (a changed conffile) fails the command.
    fn apt(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec![
            self.root.display().to_string(),
            "apt-get".to_owned(),
            "-q".to_owned(),
            "-o".to_owned(),
            "APT::Sandbox::User=root".to_owned(),
            // apt runs dpkg with a search path of its own, which would miss the stubs.
            "-o".to_owned(),
            format!("DPkg::Path={PATH}"),
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        self.run("chroot", &all, &format!("apt-get {}", args.join(" ")))
    }

    /// A file of the root (below /usr: where the packages put it, the upper layer).
    fn path(&self, p: &str) -> PathBuf {
        match p.strip_prefix("usr/") {
            Some(rest) => self.usr.join(rest),
            None => self.root.join(p),
        }
    }

    /// The field `field` of an installed package, from the root's dpkg database.
    fn field(&self, package: &str, field: &str) -> String {
        util::output(
            "dpkg-query",
            &[
                &format!("--admindir={}", self.root.join("var/lib/dpkg").display()),
                "-W",
                &format!("-f=${{{field}}}"),
                package,
            ],
        )
        .unwrap_or_default()
    }
}

/// Installs, upgrades, removes and purges `debs` (the common package and the programs) in a
/// scratch root, and checks each step: the files, the service user and the modes of its
/// directories and of the configurations, the conffiles and the computed dependencies, the
/// units (systemd-analyze), what the maintainer scripts ask of systemd (nothing started on a
/// first installation; running services restarted on upgrade; stopped on removal), that an
/// administrator's edits and the state survive upgrade and removal, and that purge removes
/// the state but not keys an administrator put in /etc/cyphonic. The scratch root is
/// removed afterwards.
///
/// # Errors
/// A step fails, or a check does.
pub(crate) fn check_install(debs: &[PathBuf]) -> anyhow::Result<()> {
    let programs = packaged(debs);
    let base = std::env::temp_dir().join(format!("cyphonic-deb-{}", std::process::id()));
    let result = Scratch::new(&base).and_then(|s| check_steps(&s, debs, &programs));
    let _ = std::fs::remove_dir_all(&base);
    result
}

/// Whether `deb` is a file of the package `package` (`<package>_<version>_<arch>.deb`).
fn is_package(deb: &Path, package: &str) -> bool {
    deb.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(&format!("{package}_")))
}

/// The programs whose packages are among `debs`.
fn packaged(debs: &[PathBuf]) -> Vec<Program> {
    PROGRAMS
        .iter()
        .filter(|p| debs.iter().any(|d| is_package(d, p.name)))
        .copied()
        .collect()
}

fn check_steps(s: &Scratch, debs: &[PathBuf], programs: &[Program]) -> anyhow::Result<()> {
    // As apt would: the common package (the user, the directories) is configured before
    // the programs whose scripts need it. One `dpkg --install` of them all configures them
    // in an order of its own when their dependencies are forced (the scratch root has no
    // libc): with three packages it set up a program before cyphonic-common.
    let (common, programs_debs): (Vec<&PathBuf>, Vec<&PathBuf>) =
        debs.iter().partition(|d| is_package(d, COMMON));
    let install = |s: &Scratch| -> anyhow::Result<()> {
        for set in [&common, &programs_debs] {
            let mut args = vec!["--install".to_owned()];
            args.extend(set.iter().map(|d| d.display().to_string()));
            s.dpkg(&args)?;
        }
        Ok(())
    };
    install(s)?;

    // The user, the shared directories.
    let passwd = std::fs::read_to_string(s.path("etc/passwd"))?;
    let user = passwd
        .lines()
        .find(|l| l.starts_with("cyphonic:"))
        .context("the postinst created no cyphonic user")?;
    let uid: u32 = user.split(':').nth(2).context("uid")?.parse()?;
    let gid: u32 = user.split(':').nth(3).context("gid")?.parse()?;
    ensure!(
        user.ends_with(":/var/lib/cyphonic:/usr/sbin/nologin") && uid != 0,
        "the cyphonic user: {user}"
    );
    let mode = |p: &str| -> anyhow::Result<(u32, u32, u32)> {
        let m = std::fs::metadata(s.path(p)).with_context(|| format!("/{p} is missing"))?;
        Ok((m.mode() & 0o7777, m.uid(), m.gid()))
    };
    for (dir, expected) in [
        ("etc/cyphonic", (0o750, 0, gid)),
        ("var/lib/cyphonic", (0o700, uid, gid)),
    ] {
        let found = mode(dir)?;
        ensure!(found == expected, "/{dir}: (mode, uid, gid) {found:?}");
    }
    ensure!(
        s.path("usr/share/doc/cyphonic-common/examples/adapter.example.toml")
            .exists(),
        "no example configuration"
    );

    // Each program: its binary, unit, configuration (a conffile, readable by the service
    // user and root only) and dependencies.
    for p in programs {
        let bin = format!("usr/bin/{}", p.name);
        let found = mode(&bin)?;
        ensure!(found.0 == 0o755, "/{bin}: {found:?}");
        // dpkg put it in /lib/systemd/system, that is /usr/lib (the root is merged).
        let unit =
            std::fs::read_to_string(s.path(&format!("usr/lib/systemd/system/{}.service", p.name)))
                .with_context(|| format!("{}.service not installed", p.name))?;
        ensure!(
            unit.contains(&format!("ExecStart=/usr/bin/{} ", p.name)),
            "{}.service does not start /usr/bin/{}",
            p.name,
            p.name
        );
        // Its man pages (the program's, and one per command) and its completions.
        for page in [
            format!("usr/share/man/man1/{}.1.gz", p.name),
            format!("usr/share/man/man1/{}-check-config.1.gz", p.name),
        ] {
            let found = mode(&page)?;
            ensure!(found.0 == 0o644, "/{page}: {found:?}");
        }
        for (shell, dir, prefix) in COMPLETIONS {
            let file = s.path(&format!("{dir}/{prefix}{}", p.name));
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("{} completions for {shell}", p.name))?;
            ensure!(text.contains("check-config"), "{}: {text}", file.display());
        }
        let config = format!("etc/cyphonic/{}", p.config);
        let found = mode(&config)?;
        ensure!(found == (0o640, 0, gid), "/{config}: {found:?}");
        let conffiles = s.field(p.name, "Conffiles");
        ensure!(
            conffiles.contains(&format!("/{config} ")),
            "{}: conffiles {conffiles:?}",
            p.name
        );
        let depends = s.field(p.name, "Depends");
        ensure!(
            depends.contains("libc6 (>= ")
                && depends.contains(&format!("{COMMON} (= {})", version())),
            "{}: Depends: {depends}",
            p.name
        );
    }
    let said = s.services()?;
    ensure!(
        !said.contains("start") && !said.contains("stop"),
        "a first installation must start nothing; the scripts asked: {said}"
    );
    verify_units(s, programs)?;

    // State, an administrator's key, edits and `systemctl enable`; then the upgrade.
    let edited = administer(s, programs)?;
    write(&s.path("etc/cyphonic/gw.key"), "secret", 0o640)?;
    install(s)?;
    kept_through_upgrade(s, programs, &edited)?;

    // Removal: services stopped, binaries gone, configuration and state kept.
    let mut remove = vec!["--remove".to_owned()];
    remove.extend(programs.iter().map(|p| p.name.to_owned()));
    s.dpkg(&remove)?;
    let said = s.services()?;
    for p in programs {
        ensure!(
            said.contains(&format!("deb-systemd-invoke stop {}.service", p.name)),
            "removing {} must stop it; the scripts asked: {said}",
            p.name
        );
        ensure!(
            !s.path(&format!("usr/bin/{}", p.name)).exists(),
            "{} stayed after removal",
            p.name
        );
        ensure!(
            s.path(&format!("etc/cyphonic/{}", p.config)).exists(),
            "removal (not purge) took /etc/cyphonic/{}",
            p.config
        );
    }
    ensure!(
        s.path("var/lib/cyphonic/leases.json").exists(),
        "removal (not purge) took the state"
    );

    // Purge: configurations, state and the enable link go; the administrator's key stays.
    let mut purge = vec!["--purge".to_owned()];
    purge.extend(programs.iter().map(|p| p.name.to_owned()));
    purge.push(COMMON.to_owned());
    s.dpkg(&purge)?;
    for p in programs {
        ensure!(
            !s.path(&format!("etc/cyphonic/{}", p.config)).exists(),
            "purge left /etc/cyphonic/{}",
            p.config
        );
    }
    ensure!(
        !s.path("var/lib/cyphonic").exists(),
        "purge left /var/lib/cyphonic"
    );
    let wants = s.path(WANTS);
    ensure!(
        std::fs::symlink_metadata(wants.join("cyphonic-adapter.service")).is_err(),
        "purge left the unit's enable link"
    );
    ensure!(
        s.path("etc/cyphonic/gw.key").exists(),
        "purge removed a key the administrator put in /etc/cyphonic"
    );
    eprintln!(
        "xtask: {} packages install, upgrade, remove and purge in a scratch root as expected",
        debs.len()
    );
    Ok(())
}

/// Where `systemctl enable` links a service.
const WANTS: &str = "etc/systemd/system/multi-user.target.wants";

/// What an administrator does between an installation and an upgrade: every program's
/// configuration edited, state written, every service enabled (what the maintainer
/// scripts asked of systemd until then is forgotten). Returns the edited files with their
/// text.
///
/// # Errors
/// A program's configuration is not installed, or a file cannot be written.
fn administer(s: &Scratch, programs: &[Program]) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut edited = Vec::new();
    for p in programs {
        let path = s.path(&format!("etc/cyphonic/{}", p.config));
        let text = format!(
            "{}\n# edited by the administrator\n",
            std::fs::read_to_string(&path)
                .with_context(|| format!("no /etc/cyphonic/{} installed", p.config))?
        );
        write(&path, &text, 0o640)?;
        edited.push((path, text));
    }
    write(&s.path("var/lib/cyphonic/leases.json"), "{}", 0o600)?;
    let wants = s.path(WANTS);
    std::fs::create_dir_all(&wants)?;
    for p in programs {
        std::os::unix::fs::symlink(
            format!("/lib/systemd/system/{}.service", p.name),
            wants.join(format!("{}.service", p.name)),
        )?;
    }
    s.services()?;
    Ok(edited)
}

/// What an upgrade after [`administer`] must have done: every program's running service
/// restarted (`try-restart`) and none stopped, the `edited` files as the administrator left
/// them with no maintainer's version beside them, the state kept.
///
/// # Errors
/// Which of them it did not.
fn kept_through_upgrade(
    s: &Scratch,
    programs: &[Program],
    edited: &[(PathBuf, String)],
) -> anyhow::Result<()> {
    let said = s.services()?;
    for p in programs {
        ensure!(
            said.contains(&format!(
                "deb-systemd-invoke try-restart {}.service",
                p.name
            )),
            "an upgrade must restart a running {}; the scripts asked: {said}",
            p.name
        );
    }
    ensure!(
        !said.contains(" stop "),
        "an upgrade stopped a service: {said}"
    );
    for (path, text) in edited {
        ensure!(
            std::fs::read_to_string(path)? == *text,
            "the upgrade lost the administrator's edit of {}",
            path.display()
        );
    }
    let mut aside = Vec::new();
    for entry in std::fs::read_dir(s.path("etc/cyphonic"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.contains(".dpkg-") || name.ends_with(".ucf-dist") {
            aside.push(name);
        }
    }
    ensure!(
        aside.is_empty(),
        "the upgrade left maintainers' versions beside the edited files: {aside:?}"
    );
    ensure!(
        s.path("var/lib/cyphonic/leases.json").exists(),
        "the upgrade lost the state"
    );
    Ok(())
}

/// Installs each program with the common package in a scratch root of its own (a machine
/// each) and runs `bed as-shipped` on the three: the programs from their /etc/cyphonic
/// files, filled in where they say so, as the service user under their units
/// (e2e/src/shipped.rs). The roots are removed afterwards.
///
/// # Errors
/// A package is missing, an installation fails, or the run does.
pub(crate) fn run_as_shipped(debs: &[PathBuf], bed: &Path) -> anyhow::Result<()> {
    let named = |package: &str| {
        debs.iter()
            .find(|d| is_package(d, package))
            .with_context(|| format!("no {package} package among {debs:?}"))
    };
    let common = named(COMMON)?;
    let base = std::env::temp_dir().join(format!("cyphonic-shipped-{}", std::process::id()));
    let result = (|| {
        let mut machines = Vec::new();
        for p in &PROGRAMS {
            let machine = base.join(p.name);
            let s = Scratch::new(&machine)?;
            for deb in [common, named(p.name)?] {
                s.dpkg(&["--install".to_owned(), deb.display().to_string()])?;
            }
            machines.push((p.name.trim_start_matches("cyphonic-"), machine));
        }
        let mut cmd = Command::new(bed);
        cmd.arg("as-shipped");
        for (program, machine) in &machines {
            cmd.arg(format!("--{program}")).arg(machine);
        }
        util::run(&mut cmd, "cyphonic-bed as-shipped")
    })();
    let _ = std::fs::remove_dir_all(&base);
    result
}

/// Makes the repository of `debs` (amd64) signed by a throwaway key, then installs from it
/// with apt and checks that a stranger's signature and a changed file are refused
/// ([`check_apt`]). The keys, and the gpg agents they started, are gone
/// afterwards.
///
/// # Errors
/// A step fails.
pub(crate) fn check_repository(debs: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    with_throwaway_keys(|operator, stranger| {
        let repo = crate::repo::make(debs, &["amd64", "all"], out, operator)?;
        check_apt(&repo, "cyphonic-adapter", stranger)
    })
}

/// Runs `f` with two throwaway signing keys, an operator's and a stranger's, each in a
/// GnuPG home of its own; the homes, and the gpg agents they started, are gone afterwards.
fn with_throwaway_keys(
    f: impl FnOnce(&Signer, &Signer) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let homes = std::env::temp_dir().join(format!("cyphonic-gpg-{}", std::process::id()));
    let (operator, stranger) = (homes.join("operator"), homes.join("stranger"));
    let result = Signer::throwaway(&operator)
        .and_then(|o| Signer::throwaway(&stranger).and_then(|s| f(&o, &s)));
    for home in [&operator, &stranger] {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(home)
            .args(["--kill", "all"])
            .status();
    }
    let _ = std::fs::remove_dir_all(&homes);
    result
}

/// The version of the package in the file `deb`.
fn deb_version(deb: &Path) -> anyhow::Result<String> {
    util::output(
        "dpkg-deb",
        &["--field", &deb.display().to_string(), "Version"],
    )
    .with_context(|| format!("dpkg-deb --field {} Version", deb.display()))
}

/// The upgrade a fleet makes (issue 57): the release before's packages (`previous`, as it
/// shipped them: [`crate::previous::package`]) installed with apt from the operator's signed
/// repository at `out` into a scratch root, each program's configuration edited by the
/// administrator and its service enabled; then the repository holds this release's
/// packages (`debs`) and `apt-get update && apt-get upgrade` must upgrade every one with no
/// question asked (standard input is closed: dpkg's conffile prompt fails it), keeping
/// the edits (no `.dpkg-*` beside them) and the state, restarting each service and stopping
/// none. The scratch root and the key are removed afterwards.
///
/// # Errors
/// A step fails, or a check does (this release's version must be newer than the one
/// before's).
pub(crate) fn check_upgrade(
    previous: &[PathBuf],
    debs: &[PathBuf],
    out: &Path,
) -> anyhow::Result<()> {
    ensure!(
        previous.iter().any(|d| is_package(d, COMMON)),
        "the release before has no {COMMON}"
    );
    let mut versions = previous
        .iter()
        .map(|d| deb_version(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
    versions.sort();
    versions.dedup();
    let [from] = versions.as_slice() else {
        bail!("the release before's packages are of several versions: {versions:?}");
    };
    let from = from.clone();
    ensure!(
        Command::new("dpkg")
            .args(["--compare-versions", version(), "gt", &from])
            .status()?
            .success(),
        "this release's version {} is not newer than the release before's {from}: apt would \
         not upgrade to it (raise the workspace's version in Cargo.toml)",
        version()
    );
    let base = std::env::temp_dir().join(format!("cyphonic-upgrade-{}", std::process::id()));
    let result = with_throwaway_keys(|operator, _| {
        Scratch::new(&base).and_then(|s| upgrade_steps(&s, previous, debs, out, operator))
    });
    let _ = std::fs::remove_dir_all(&base);
    result?;
    eprintln!(
        "xtask: apt upgrades {from} to {} from the signed repository: no prompt, edits kept, services restarted",
        version()
    );
    Ok(())
}

fn upgrade_steps(
    s: &Scratch,
    previous: &[PathBuf],
    debs: &[PathBuf],
    out: &Path,
    signer: &Signer,
) -> anyhow::Result<()> {
    let programs = packaged(debs);
    ensure!(
        packaged(previous).len() == programs.len(),
        "the release before packaged {:?}, this one {:?}",
        packaged(previous)
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>(),
        programs.iter().map(|p| p.name).collect::<Vec<_>>()
    );
    let names: Vec<&str> = programs.iter().map(|p| p.name).collect();
    s.apt_sources(&crate::repo::make(
        previous,
        &["amd64", "all"],
        out,
        signer,
    )?)?;
    s.apt(&["update"])?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&names);
    s.apt(&install)?;

    let edited = administer(s, &programs)?;

    // This release in the repository; the upgrade.
    s.apt_sources(&crate::repo::make(debs, &["amd64", "all"], out, signer)?)?;
    s.apt(&["update"])?;
    s.apt(&["upgrade", "-y"]).context(
        "the upgrade failed or asked a question (above; dpkg asks about a conffile that both \
         the administrator and this release changed: a conffile holds only what an operator \
         edits, and changes as rarely)",
    )?;
    for package in names.iter().copied().chain([COMMON]) {
        let installed = s.field(package, "Version");
        ensure!(
            installed == version(),
            "after the upgrade {package} is at {installed:?}, not {}",
            version()
        );
    }
    kept_through_upgrade(s, &programs, &edited)
}

/// Installs `program` with apt from the signed repository at `repo` (as [`crate::repo::make`]
/// made it, signed by the key in its keyring) into a scratch root whose package database is
/// this machine's (so the packages' own dependencies are there): `apt-get update` checks the
/// signature, `apt-get install` fetches and installs the program and the common package it
/// depends on. Then the same repository signed by `stranger` and with a Packages file
/// changed must each be refused by `apt-get update`. The scratch root is removed
/// afterwards.
///
/// # Errors
/// A step fails, or a refusal does not come.
pub(crate) fn check_apt(repo: &Path, program: &str, stranger: &Signer) -> anyhow::Result<()> {
    let base = std::env::temp_dir().join(format!("cyphonic-apt-{}", std::process::id()));
    let result = Scratch::new(&base).and_then(|s| apt_steps(&s, repo, program, stranger));
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn apt_steps(s: &Scratch, repo: &Path, program: &str, stranger: &Signer) -> anyhow::Result<()> {
    s.apt_sources(repo)?;
    let apt = |args: &[&str]| s.apt(args);
    apt(&["update"])?;
    apt(&["install", "-y", "--no-install-recommends", program])?;
    ensure!(
        s.path(&format!("usr/bin/{program}")).exists(),
        "apt installed no /usr/bin/{program}"
    );
    ensure!(
        std::fs::read_to_string(s.path("etc/passwd"))?.contains("\ncyphonic:"),
        "cyphonic-common's postinst made no service user"
    );
    let installed = s.field(program, "Version");
    ensure!(installed == version(), "{program} {installed:?} installed");

    // Signed by another key: refused.
    let dists = s.path("repo").join("dists").join(crate::repo::SUITE);
    let genuine = std::fs::read(dists.join("InRelease"))?;
    stranger.clearsign(&dists.join("Release"), &dists.join("InRelease"))?;
    std::fs::remove_file(dists.join("Release.gpg"))?;
    // `apt-get update` afresh: nothing read before is kept.
    let update_afresh = || -> anyhow::Result<bool> {
        let _ = std::fs::remove_dir_all(s.path("var/lib/apt/lists"));
        std::fs::create_dir_all(s.path("var/lib/apt/lists/partial"))?;
        Ok(apt(&["update"]).is_ok())
    };
    ensure!(
        !update_afresh()?,
        "apt-get update took a repository signed by another key"
    );
    // The genuine signature, and a Packages file changed after it: refused.
    std::fs::write(dists.join("InRelease"), genuine)?;
    let packages = dists
        .join(crate::repo::COMPONENT)
        .join(format!("binary-{}", s.field(program, "Architecture")))
        .join("Packages");
    // What one who can write the mirror but holds no key would do: another package's
    // entry, both index files remade to match each other.
    let mut text = std::fs::read_to_string(&packages)?;
    text.push_str("\nPackage: cyphonic-planted\nVersion: 1\nArchitecture: all\nFilename: pool/main/planted.deb\nSize: 1\n");
    std::fs::write(&packages, text)?;
    util::run(
        Command::new("gzip").arg("-9nkf").arg(&packages),
        "gzip the changed Packages",
    )?;
    ensure!(
        !update_afresh()?,
        "apt-get update took a Packages file changed after signing"
    );
    eprintln!(
        "xtask: {program} installs with apt from the signed repository; another key's signature and a changed Packages file are refused"
    );
    Ok(())
}

/// Checks the installed units with systemd's own tools, on the scratch root (whose /usr,
/// this machine's, has the units they name from systemd itself, and /bin/kill):
/// `systemd-analyze verify` must have nothing to say (it exits 0 even on an unknown key, so
/// any output fails), and `systemd-analyze security` rates each unit, which is printed
/// (docs/operations.md records the figures).
///
/// # Errors
/// systemd-analyze is missing, or says something about a unit.
fn verify_units(s: &Scratch, programs: &[Program]) -> anyhow::Result<()> {
    let root_arg = format!("--root={}", s.root.display());
    let log = s.base.join("analyze.log");
    let mut args = vec![
        "-c".to_owned(),
        "systemd-analyze verify \"$@\" > \"$0\" 2>&1".to_owned(),
        log.display().to_string(),
        root_arg.clone(),
    ];
    args.extend(
        programs
            .iter()
            .map(|p| format!("/lib/systemd/system/{}.service", p.name)),
    );
    s.run("sh", &args, "systemd-analyze verify (scratch root)")?;
    let said = std::fs::read_to_string(&log)?;
    ensure!(said.trim().is_empty(), "systemd-analyze verify:\n{said}");
    for p in programs {
        let args = vec![
            "-c".to_owned(),
            "systemd-analyze security --offline=yes \"$1\" \"$2\" > \"$0\" 2>&1".to_owned(),
            log.display().to_string(),
            root_arg.clone(),
            format!("{}.service", p.name),
        ];
        s.run("sh", &args, &format!("systemd-analyze security {}", p.name))?;
        let text = std::fs::read_to_string(&log)?;
        let overall = text
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .with_context(|| format!("systemd-analyze security {}: {text}", p.name))?;
        eprintln!("xtask: {}", overall.trim_start_matches('→').trim());
    }
    eprintln!("xtask: systemd-analyze verify: the units are clean");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_files_name_package_architecture_and_dependencies() {
        let c = control(
            "cyphonic-node",
            "arm64",
            12_000,
            "libc6 (>= 2.34), cyphonic-common (= 0.1.0)",
            "cyphonic-node: overlay member for a single host",
            &"word ".repeat(40),
        );
        assert!(
            c.starts_with(&format!(
                "Package: cyphonic-node\nSource: cyphonic\nVersion: {}\nArchitecture: arm64\n",
                version()
            )),
            "{c}"
        );
        assert!(
            c.contains("\nDepends: libc6 (>= 2.34), cyphonic-common (= 0.1.0)\n"),
            "{c}"
        );
        let long: Vec<&str> = c
            .lines()
            .skip_while(|l| !l.starts_with("Description:"))
            .skip(1)
            .collect();
        assert!(long.len() > 1, "{c}");
        assert!(
            long.iter().all(|l| l.starts_with(' ') && l.len() <= 80),
            "{c}"
        );
    }

    #[test]
    fn every_template_names_its_program() {
        let root = util::root();
        for p in &PROGRAMS {
            for file in ["program.postinst", "program.prerm", "program.postrm"] {
                let text = script(&root, file, Some(p)).unwrap_or_else(|e| panic!("{e}"));
                assert!(!text.contains('@'), "{file}: {text}");
                assert!(text.contains(p.name), "{file}");
            }
        }
    }
}
