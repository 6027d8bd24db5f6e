//! `cargo xtask image`: a Raspberry Pi 4 SD-card image that boots to a running adapter.
//!
//! Debian bookworm for arm64, made by mmdebstrap from Debian's own packages: systemd, the
//! kernel (`linux-image-arm64`) and the Pi's boot firmware (`raspi-firmware`, which puts the
//! firmware, device trees, kernel, initrd, `config.txt` and `cmdline.txt` on the FAT boot
//! partition), networkd, timesyncd, an SSH server that stays off, and our arm64 packages
//! (`cyphonic-common`, `cyphonic-adapter`). The files that make it an appliance are in
//! `config/image/`: the networkd files (the uplink eth0 by DHCP, the LAN port eth1 left to
//! the adapter) and the first-boot step that takes the operator's files from the boot
//! partition's `cyphonic/` folder, which any laptop can write.
//!
//! The image is two partitions in an MBR table, made without mounting anything (no loop
//! devices): a FAT32 boot partition (`mkfs.vfat`, filled by `mcopy`) and an ext4 root
//! (`mkfs.ext4 -d`), written into the image file at their offsets.
//!
//! The arm64 packages' maintainer scripts run under qemu-user: the build registers
//! `qemu-aarch64-static` with binfmt_misc if it is not registered (and mounts binfmt_misc if
//! it is not mounted), from qemu-user-static's own `/usr/lib/binfmt.d/qemu-aarch64.conf`.
//!
//! `--check` boots the image under qemu-system-aarch64 (`cyphonic-bed image-check`,
//! e2e/src/image.rs, see there).

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};

use crate::{bed, deb, dist, util};

/// Debian's packages the image is made of, beside the essential ones.
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "systemd-timesyncd",
    "udev",
    "kmod",
    "iproute2",
    "netbase",
    "ca-certificates",
    "e2fsprogs",
    "dosfstools",
    "initramfs-tools",
    "linux-image-arm64",
    "raspi-firmware",
    "openssh-server",
    // The A/B updates: U-Boot for the Pi, RAUC and its service, the tool that reads and
    // writes U-Boot's counters, and what the slot check reads the adapter's status with.
    "u-boot-rpi",
    "rauc",
    "rauc-service",
    "libubootenv-tool",
    "jq",
];

/// Where the boot partition starts, and its size (MiB).
const BOOT_START_MIB: u64 = 4;
const BOOT_MIB: u64 = 256;

/// The file systems' labels: Debian's Raspberry Pi images' own (both root slots carry the
/// same file system: U-Boot names the root by partition, `root=PARTUUID=`).
const ROOT_LABEL: &str = "RASPIROOT";
const BOOT_LABEL: &str = "RASPIFIRM";

/// The image's MBR disk identifier ("cyph"): the slots' PARTUUIDs are `63797068-02` and
/// `-03` (RAUC's system.conf names them).
const DISK_ID: &str = "63797068";

/// The tools the build needs, with the Debian package of each.
const TOOLS: &[(&str, &str)] = &[
    ("mmdebstrap", "mmdebstrap"),
    // What mmdebstrap checks a foreign architecture with (recommended by it, so not
    // installed with it here).
    ("arch-test", "arch-test"),
    ("mkfs.vfat", "dosfstools"),
    ("mcopy", "mtools"),
    ("mkfs.ext4", "e2fsprogs"),
    ("sfdisk", "fdisk"),
    ("qemu-aarch64-static", "qemu-user-static"),
    // The boot script and counters, the bundle and its signing key.
    ("mkimage", "u-boot-tools"),
    ("mkenvimage", "u-boot-tools"),
    ("rauc", "rauc"),
    ("mksquashfs", "squashfs-tools"),
    ("openssl", "openssl"),
];

/// Builds the image at `out` (default `target/image/cyphonic-pi4-<version>-arm64.img`) from
/// the arm64 packages in `packages` (default: built now with `cargo xtask dist --target
/// aarch64-unknown-linux-gnu`); then boots it if `check`.
pub(crate) fn run(
    packages: Option<PathBuf>,
    out: Option<PathBuf>,
    signer: Option<Signer>,
    check: bool,
) -> anyhow::Result<()> {
    let root = util::root();
    let work = root.join("target/image");
    let out =
        out.unwrap_or_else(|| work.join(format!("cyphonic-pi4-{}-arm64.img", deb::version())));
    util::install_missing("the image", TOOLS)?;
    let debs = arm64_packages(packages)?;
    binfmt_aarch64()?;
    fs::create_dir_all(&work)?;
    let signer = match signer {
        Some(s) => s,
        None => Signer::development(&work.join("bundle-key"))?,
    };
    let tree = work.join("root");
    if tree.exists() {
        // An interrupted mmdebstrap can leave the host's /proc, /sys and /dev/pts mounted
        // in its tree: removing through them would be a disaster.
        let mounted = mounts_under(&tree)?;
        ensure!(
            mounted.is_empty(),
            "an earlier build left mounts in {}: umount {} first",
            tree.display(),
            mounted.join(" ")
        );
        fs::remove_dir_all(&tree)?;
    }
    bootstrap(&root, &tree, &debs, &signer.cert)?;
    let used = assemble(&root, &tree, &work, &out)?;
    eprintln!("xtask: image: {}", out.display());
    let bundle = out.with_extension("raucb");
    make_bundle(&root, (&tree, used), &work, &signer, &bundle)?;
    eprintln!("xtask: update bundle: {}", bundle.display());
    if check {
        boot_check(&root, &out, &bundle, &signer)?;
    }
    Ok(())
}

/// The key update bundles are signed with, and its certificate, which the image's RAUC
/// keyring trusts (`/etc/rauc/keyring.pem`): an appliance installs only bundles signed by
/// the key of the image it was written from.
pub(crate) struct Signer {
    pub(crate) key: PathBuf,
    pub(crate) cert: PathBuf,
}

impl Signer {
    /// A development key (self-signed, ten years), made once in `dir` and kept for the
    /// next builds: good for tests, not for a fleet, whose operator brings their own.
    fn development(dir: &Path) -> anyhow::Result<Self> {
        let signer = Self {
            key: dir.join("key.pem"),
            cert: dir.join("cert.pem"),
        };
        if signer.key.exists() && signer.cert.exists() {
            return Ok(signer);
        }
        eprintln!(
            "xtask: image: no --bundle-key: signing bundles with a development key made in {} \
             (bring your own for a fleet: docs/operations.md)",
            dir.display()
        );
        fs::create_dir_all(dir)?;
        util::run(
            Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "3650",
                ])
                .args(["-subj", "/O=cyphonic/CN=cyphonic development bundle key"])
                .arg("-keyout")
                .arg(&signer.key)
                .arg("-out")
                .arg(&signer.cert),
            "openssl req (a development bundle key)",
        )?;
        Ok(signer)
    }
}

/// The update bundle of this image's root file system (`rauc bundle`, verity format),
/// signed by `signer`: the root file system at its own size (RAUC grows it to the slot),
/// and the hook that carries the appliance's state over to the new slot and puts it on
/// trial (config/image/rauc/bundle-hook). `used`: the bytes in `tree`'s files.
fn make_bundle(
    root: &Path,
    (tree, used): (&Path, u64),
    work: &Path,
    signer: &Signer,
    out: &Path,
) -> anyhow::Result<()> {
    let dir = work.join("bundle");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    root_file_system(
        tree,
        work,
        &dir.join("root.ext4"),
        used / (1 << 20) * 5 / 4 + 128,
    )?;
    fs::copy(root.join("config/image/rauc/bundle-hook"), dir.join("hook"))?;
    // The devices it is for, as the image's RAUC names them.
    let system = fs::read_to_string(root.join("config/image/rauc/system.conf"))?;
    let compatible = system
        .lines()
        .find_map(|l| l.strip_prefix("compatible="))
        .context("no compatible= in config/image/rauc/system.conf")?;
    fs::write(
        dir.join("manifest.raucm"),
        format!(
            "[update]\ncompatible={compatible}\nversion={}\n\
             description=cyphonic appliance, root file system\n\n\
             [bundle]\nformat=verity\n\n\
             [hooks]\nfilename=hook\n\n\
             [image.rootfs]\nfilename=root.ext4\nhooks=post-install\n",
            deb::version()
        ),
    )?;
    let _ = fs::remove_file(out);
    util::run(
        Command::new("rauc")
            .arg("bundle")
            .arg("--cert")
            .arg(&signer.cert)
            .arg("--key")
            .arg(&signer.key)
            .arg("--keyring")
            .arg(&signer.cert)
            .arg(&dir)
            .arg(out),
        "rauc bundle",
    )?;
    fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The two packages the image installs, from `dir` or built now.
fn arm64_packages(dir: Option<PathBuf>) -> anyhow::Result<Vec<PathBuf>> {
    let debs = match dir {
        Some(d) => fs::read_dir(&d)
            .with_context(|| format!("reading {}", d.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect(),
        None => dist::run("aarch64-unknown-linux-gnu", "release")?,
    };
    let pick = |prefix: &str, suffix: &str| {
        debs.iter()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
            })
            .cloned()
            .with_context(|| format!("no {prefix}*{suffix} among the packages"))
    };
    Ok(vec![
        pick("cyphonic-common_", "_all.deb")?,
        pick("cyphonic-adapter_", "_arm64.deb")?,
    ])
}

/// Registers qemu-user for arm64 binaries with binfmt_misc, unless it is.
fn binfmt_aarch64() -> anyhow::Result<()> {
    let dir = Path::new("/proc/sys/fs/binfmt_misc");
    if !dir.join("register").exists() {
        util::run(
            Command::new("mount")
                .args(["-t", "binfmt_misc", "binfmt_misc"])
                .arg(dir),
            "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc",
        )?;
    }
    if dir.join("qemu-aarch64").exists() {
        return Ok(());
    }
    let conf = fs::read_to_string("/usr/lib/binfmt.d/qemu-aarch64.conf")
        .context("qemu-user-static's binfmt entry: apt-get install qemu-user-static")?;
    let line = conf
        .lines()
        .find(|l| l.starts_with(":qemu-aarch64:"))
        .context("no :qemu-aarch64: line in /usr/lib/binfmt.d/qemu-aarch64.conf")?;
    eprintln!("xtask: registering qemu-aarch64 with binfmt_misc (arm64 maintainer scripts)");
    fs::write(dir.join("register"), line).context("registering qemu-aarch64 (needs root)")?;
    Ok(())
}

/// Makes the root tree with mmdebstrap, then makes it the appliance
/// (`config/image/customize.sh`).
fn bootstrap(root: &Path, tree: &Path, debs: &[PathBuf], cert: &Path) -> anyhow::Result<()> {
    let mut include: Vec<String> = PACKAGES.iter().map(|p| (*p).to_owned()).collect();
    for d in debs {
        include.push(fs::canonicalize(d)?.display().to_string());
    }
    let customize = root.join("config/image/customize.sh");
    let files = root.join("config/image");
    let mut cmd = Command::new("mmdebstrap");
    cmd.args([
        "--arch=arm64",
        "--variant=minbase",
        "--components=main,non-free-firmware",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-include=/usr/share/doc/cyphonic-common/*",
    ])
    .arg(format!("--include={}", include.join(",")))
    // Makes our .deb files, named by path, visible to the chrooted dpkg (and removes them
    // after): mmdebstrap's own hook for that.
    .arg("--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount")
    .arg(format!(
        "--customize-hook=sh {} \"$1\" {} {DISK_ID} {}",
        customize.display(),
        files.display(),
        fs::canonicalize(cert)?.display()
    ))
    .args(["bookworm"])
    .arg(tree)
    .arg("http://deb.debian.org/debian");
    util::run(
        &mut cmd,
        "mmdebstrap (Debian bookworm arm64 with the adapter)",
    )
}

/// Writes the image: the boot partition from `tree/boot/firmware`, the root file system
/// from the rest of `tree`. Returns the bytes in `tree`'s files.
fn assemble(root: &Path, tree: &Path, work: &Path, out: &Path) -> anyhow::Result<u64> {
    let firmware = tree.join("boot/firmware");
    for file in ["config.txt", "u-boot.bin", "boot.scr", "cyphonic.env"] {
        ensure!(
            firmware.join(file).exists(),
            "the customize step left no {file} in {}",
            firmware.display()
        );
    }
    // The boot partition: the firmware's files and the operator's folder.
    let boot = work.join("boot.vfat");
    let _ = fs::remove_file(&boot);
    util::run(
        Command::new("mkfs.vfat")
            .args(["-C", "-F", "32", "-n", BOOT_LABEL])
            .arg(&boot)
            .arg((BOOT_MIB * 1024).to_string()),
        "mkfs.vfat (boot partition)",
    )?;
    let mut entries: Vec<PathBuf> = fs::read_dir(&firmware)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut mcopy = Command::new("mcopy");
    mcopy
        .args(["-s", "-p", "-i"])
        .arg(&boot)
        .args(&entries)
        .arg("::");
    util::run(&mut mcopy, "mcopy (the firmware onto the boot partition)")?;
    util::run(
        Command::new("mmd").arg("-i").arg(&boot).arg("::cyphonic"),
        "mmd ::cyphonic",
    )?;
    util::run(
        Command::new("mcopy")
            .arg("-i")
            .arg(&boot)
            .arg(root.join("config/image/README.txt"))
            .arg("::cyphonic/README.txt"),
        "mcopy README.txt",
    )?;
    let used = dir_size(tree)?;
    // Room for the file system's own tables, upgrades and logs: half again and 512 MiB.
    let root_mib = used / (1 << 20) * 3 / 2 + 512;
    let rootfs = work.join("root.ext4");
    root_file_system(tree, work, &rootfs, root_mib)?;
    // The disk: an MBR table, the partitions at their offsets; slot B stays empty (zeros,
    // sparse) until an update writes it.
    let root_start = BOOT_START_MIB + BOOT_MIB;
    let total = (root_start + 2 * root_mib) << 20;
    let _ = fs::remove_file(out);
    {
        let f = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        f.set_len(total)?;
    }
    let table = partition_table(root_mib);
    let mut sfdisk = Command::new("sfdisk");
    sfdisk
        .arg("--quiet")
        .arg(out)
        .stdin(std::process::Stdio::piped());
    eprintln!("xtask: $ sfdisk {} <<< {table:?}", out.display());
    let mut child = sfdisk.spawn().context("starting sfdisk")?;
    child
        .stdin
        .take()
        .context("sfdisk's input")?
        .write_all(table.as_bytes())?;
    let status = child.wait()?;
    ensure!(status.success(), "sfdisk failed ({status})");
    write_at(out, &boot, BOOT_START_MIB << 20)?;
    write_at(out, &rootfs, root_start << 20)?;
    fs::remove_file(&boot)?;
    fs::remove_file(&rootfs)?;
    Ok(used)
}

/// The root file system at `out` (`mib` MiB): everything in `tree` but the boot
/// partition's files (a mount point).
fn root_file_system(tree: &Path, work: &Path, out: &Path, mib: u64) -> anyhow::Result<()> {
    let firmware = tree.join("boot/firmware");
    let aside = work.join("firmware");
    if aside.exists() {
        fs::remove_dir_all(&aside)?;
    }
    fs::rename(&firmware, &aside)?;
    fs::create_dir(&firmware)?;
    let _ = fs::remove_file(out);
    let made = util::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", ROOT_LABEL, "-d"])
            .arg(tree)
            .arg(out)
            .arg(format!("{mib}M")),
        "mkfs.ext4 -d (root file system)",
    );
    fs::remove_dir(&firmware)?;
    fs::rename(&aside, &firmware)?;
    made
}

/// The sfdisk script, in 512-byte sectors: the disk identifier, a bootable FAT32 (LBA)
/// partition, then the two root slots (Linux), A and B.
fn partition_table(root_mib: u64) -> String {
    let mib = 2048; // sectors
    let root_start = (BOOT_START_MIB + BOOT_MIB) * mib;
    format!(
        "label: dos\nlabel-id: 0x{DISK_ID}\n\
         start={}, size={}, type=c, bootable\n\
         start={root_start}, size={}, type=83\n\
         start={}, size={}, type=83\n",
        BOOT_START_MIB * mib,
        BOOT_MIB * mib,
        root_mib * mib,
        root_start + root_mib * mib,
        root_mib * mib
    )
}

/// Copies `part` into `disk` at byte `offset`.
fn write_at(disk: &Path, part: &Path, offset: u64) -> anyhow::Result<()> {
    let mut d = fs::OpenOptions::new().write(true).open(disk)?;
    d.seek(SeekFrom::Start(offset))?;
    let mut p = fs::File::open(part)?;
    std::io::copy(&mut p, &mut d)?;
    d.sync_all()?;
    Ok(())
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> anyhow::Result<Vec<String>> {
    let dir = fs::canonicalize(dir)?;
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    let mut under: Vec<String> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| Path::new(m).starts_with(&dir))
        .map(str::to_owned)
        .collect();
    under.sort_by(|a, b| b.cmp(a));
    Ok(under)
}

/// Bytes in the files under `dir` (not following links).
fn dir_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

/// Boots the image under qemu-system-aarch64 in the bed (`cyphonic-bed image-check`,
/// e2e/src/image.rs).
fn boot_check(root: &Path, image: &Path, bundle: &Path, signer: &Signer) -> anyhow::Result<()> {
    // The bed's tools (the test builds the two-site bed around the emulator) and the
    // emulator itself.
    bed::prerequisites()?;
    util::install_missing(
        "the image's boot check",
        &[
            ("qemu-system-aarch64", "qemu-system-arm"),
            // QEMU's own U-Boot, which runs the image's boot script as the Pi's does.
            ("/usr/lib/u-boot/qemu_arm64/u-boot.bin", "u-boot-qemu"),
            ("ssh", "openssh-client"),
            ("debugfs", "e2fsprogs"),
        ],
    )?;
    util::cargo(root, &["build", "--locked", "--bins"])?;
    let bins = root.join("target/debug");
    let mut cmd = Command::new(bins.join("cyphonic-bed"));
    cmd.arg("image-check")
        .arg("--image")
        .arg(fs::canonicalize(image)?)
        .arg("--bundle")
        .arg(fs::canonicalize(bundle)?)
        .arg("--bundle-key")
        .arg(fs::canonicalize(&signer.key)?)
        .arg("--bundle-cert")
        .arg(fs::canonicalize(&signer.cert)?)
        .env("CYPHONIC_BIN_DIR", &bins);
    util::run(&mut cmd, "cyphonic-bed image-check")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partitions_follow_each_other_on_mib_boundaries() {
        let t = partition_table(1000);
        assert!(t.starts_with("label: dos\n"));
        assert!(t.contains("start=8192, size=524288, type=c, bootable"));
        assert!(t.contains("label-id: 0x63797068\n"));
        assert!(t.contains("start=532480, size=2048000, type=83"));
        assert!(t.contains("start=2580480, size=2048000, type=83"));
    }

    #[test]
    fn the_image_carries_the_kernel_the_firmware_and_no_ssh_password_path() {
        for p in [
            "linux-image-arm64",
            "raspi-firmware",
            "systemd-sysv",
            "openssh-server",
            "u-boot-rpi",
            "rauc-service",
            "libubootenv-tool",
        ] {
            assert!(PACKAGES.contains(&p), "{p}");
        }
        let script = fs::read_to_string(util::root().join("config/image/customize.sh")).unwrap();
        assert!(
            script.contains("systemctl disable ssh.service"),
            "SSH is off by default"
        );
        assert!(script.contains("passwd -l root"), "no root password");
        assert!(
            script.contains("kernel=u-boot.bin") && script.contains("cyphonic-slot-check.service"),
            "U-Boot boots, and the slot check runs"
        );
    }

    /// Which partition each slot is, as U-Boot's script boots it (`setenv cy_slot X`
    /// then `setenv cy_part N`) and as RAUC writes it (`bootname=X` after
    /// `device=...-0N`): they must agree, or an update would write the running slot's twin
    /// and boot the other.
    #[test]
    fn uboot_and_rauc_agree_on_the_slots() {
        let files = util::root().join("config/image");
        let script = fs::read_to_string(files.join("boot.cmd")).unwrap();
        let mut booted = Vec::new();
        let mut slot = None;
        for line in script.lines().map(str::trim) {
            if let Some(s) = line.strip_prefix("setenv cy_slot ") {
                slot = Some(s.to_owned());
            } else if let Some(p) = line.strip_prefix("setenv cy_part ") {
                booted.push((slot.take().unwrap(), p.to_owned()));
            }
        }
        let conf = fs::read_to_string(files.join("rauc/system.conf")).unwrap();
        let mut written = Vec::new();
        let mut device = None;
        for line in conf.lines() {
            if let Some(d) = line.strip_prefix("device=/dev/disk/by-partuuid/@DISK_ID@-0") {
                device = Some(d.to_owned());
            } else if let Some(b) = line.strip_prefix("bootname=") {
                written.push((b.to_owned(), device.take().unwrap()));
            }
        }
        let want = vec![
            ("A".to_owned(), "2".to_owned()),
            ("B".to_owned(), "3".to_owned()),
        ];
        assert_eq!(booted, want, "boot.cmd");
        assert_eq!(written, want, "system.conf");
        // The partitions are there, in that order.
        let t = partition_table(1000);
        assert_eq!(t.matches("type=83").count(), 2, "{t}");
    }

    #[test]
    fn missing_packages_are_named() {
        let dir = std::env::temp_dir().join(format!("cy-image-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cyphonic-common_0.1.0_all.deb"), b"").unwrap();
        let e = arm64_packages(Some(dir.clone())).unwrap_err().to_string();
        assert!(e.contains("cyphonic-adapter_"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
