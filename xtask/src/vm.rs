//! The arm64 adapter in an arm64 machine (issue 57, item 5): qemu-user cannot set the packet
//! socket's options, so the emulated demo runs the adapter natively; this machine runs the
//! adapter's aarch64 build on an aarch64 kernel, with its own packet sockets, under
//! qemu-system-aarch64 (`cyphonic-bed vm-check`, e2e/src/vm.rs, boots it in the bed).
//!
//! The machine is Debian's arm64 cloud kernel (`linux-image-cloud-arm64`: virtio built as
//! modules, nothing of a board's) and an initramfs made here, with no root file system: a
//! static busybox (`busybox-static:arm64`), the kernel's modules the adapter and the virtio
//! NICs need, the adapter with the C libraries it names (from the multiarch libc6:arm64),
//! and an `/init` that loads the modules and hands over to the site's `/site/start`, which
//! the bed adds as a second archive (the kernel unpacks archives one after the other). The
//! two packages are fetched with `apt-get download` into `target/vm/debs` once (the arm64
//! architecture is known to apt wherever `libstd-rust-web-dev:arm64` is installed).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail, ensure};

use crate::util;

/// The kernel's package: its dependency names the kernel of the day.
const KERNEL_META: &str = "linux-image-cloud-arm64:arm64";
/// The shell and tools of the init.
const BUSYBOX: &str = "busybox-static:arm64";

/// The modules `/init` loads, in order (each after those it depends on): the virtio NICs,
/// and the `clsact` qdisc and BPF classifier the adapter closes its LAN port with.
const MODULES: [&str; 10] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "failover",
    "net_failover",
    "virtio_net",
    "sch_ingress",
    "cls_bpf",
];

/// Where the arm64 C libraries are: the multiarch libc6:arm64's, then the cross sysroot's.
const LIBRARY_DIRS: [&str; 3] = [
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/aarch64-linux-gnu/lib",
];

/// The machine's first program: the file systems, the modules, then the site's start
/// script; the machine powers off when that ends.
fn init() -> String {
    format!(
        r#"#!/bin/busybox sh
# The arm64 machine's init (xtask/src/vm.rs): no root file system, this initramfs is all.
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
for m in {modules}; do
    insmod /lib/modules/$m.ko || echo "cyphonic-vm: insmod $m failed"
done
echo "cyphonic-vm: kernel $(uname -r) on $(uname -m), modules loaded"
if [ -x /site/start ]; then
    /site/start
    echo "cyphonic-vm: /site/start ended ($?)"
else
    echo "cyphonic-vm: no /site/start"
fi
poweroff -f
"#,
        modules = MODULES.join(" ")
    )
}

/// The machine: its kernel and base initramfs.
pub(crate) struct Machine {
    pub(crate) kernel: PathBuf,
    pub(crate) initramfs: PathBuf,
}

/// Makes the machine around the adapter in `arm64_bins` (its aarch64 build), in
/// `target/vm`.
///
/// # Errors
/// A package cannot be fetched (apt without the arm64 architecture: said how to add it), a
/// file the machine needs is missing, or a tool fails.
pub(crate) fn prepare(root: &Path, arm64_bins: &Path) -> anyhow::Result<Machine> {
    let dir = root.join("target/vm");
    let debs = dir.join("debs");
    std::fs::create_dir_all(&debs)?;
    let kernel_package = kernel_package()?;
    let kernel_tree = dir.join("kernel");
    let busybox_tree = dir.join("busybox");
    for (package, tree) in [
        (kernel_package.as_str(), &kernel_tree),
        (BUSYBOX, &busybox_tree),
    ] {
        let deb = fetch(&debs, package)?;
        let stamp = tree.join(".from");
        let name = deb.display().to_string();
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(name.as_str()) {
            let _ = std::fs::remove_dir_all(tree);
            std::fs::create_dir_all(tree)?;
            util::run(
                Command::new("dpkg-deb").arg("-x").arg(&deb).arg(tree),
                &format!("dpkg-deb -x {}", deb.display()),
            )?;
            std::fs::write(&stamp, name)?;
        }
    }
    let kernel = only_file(&kernel_tree.join("boot"), "vmlinuz-")?;
    let modules = only_file(&kernel_tree.join("lib/modules"), "")?;

    let tree = dir.join("root");
    let _ = std::fs::remove_dir_all(&tree);
    for d in [
        "bin",
        "usr/bin",
        "lib/modules",
        "proc",
        "sys",
        "dev",
        "run",
        "tmp",
        "site",
    ] {
        std::fs::create_dir_all(tree.join(d))?;
    }
    std::fs::copy(busybox_tree.join("bin/busybox"), tree.join("bin/busybox"))
        .context("busybox-static's bin/busybox")?;
    for module in MODULES {
        let from = find_module(&modules, module)?;
        std::fs::copy(&from, tree.join("lib/modules").join(format!("{module}.ko")))?;
    }
    let adapter = arm64_bins.join("cyphonic-adapter");
    ensure!(
        adapter.exists(),
        "no arm64 adapter at {} (the Pi's build makes it)",
        adapter.display()
    );
    // Stripped: the debug build's symbols are most of its 100 MB.
    util::run(
        Command::new("aarch64-linux-gnu-strip")
            .arg("-o")
            .arg(tree.join("usr/bin/cyphonic-adapter"))
            .arg(&adapter),
        "aarch64-linux-gnu-strip the adapter",
    )?;
    for library in libraries(&adapter)? {
        let name = library.file_name().context("a library's name")?;
        std::fs::copy(&library, tree.join("lib").join(name))
            .with_context(|| format!("copying {}", library.display()))?;
    }
    let first = tree.join("init");
    std::fs::write(&first, init())?;
    std::fs::set_permissions(&first, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let initramfs = dir.join("base.cpio");
    cpio(&tree, &initramfs)?;
    Ok(Machine { kernel, initramfs })
}

/// Writes the tree at `dir` as a newc archive (busybox's cpio), entries sorted, owned by
/// root.
///
/// # Errors
/// busybox fails.
fn cpio(dir: &Path, out: &Path) -> anyhow::Result<()> {
    util::run(
        Command::new("sh")
            .arg("-c")
            .arg("cd \"$1\" && find . | LC_ALL=C sort | busybox cpio -o -H newc -R 0:0 > \"$2\"")
            .arg("sh")
            .arg(dir)
            .arg(out),
        "busybox cpio (the machine's initramfs)",
    )
}

/// The versioned kernel package the meta package depends on.
fn kernel_package() -> anyhow::Result<String> {
    let said = util::output("apt-cache", &["depends", KERNEL_META]).unwrap_or_default();
    said.lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .map(|p| {
            p.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned()
        })
        .with_context(|| {
            format!(
                "apt knows no {KERNEL_META}: add the architecture (dpkg --add-architecture \
                 arm64 && apt-get update)"
            )
        })
}

/// `package`'s .deb in `debs`, fetched with `apt-get download` when it is not there.
fn fetch(debs: &Path, package: &str) -> anyhow::Result<PathBuf> {
    // Its file is `<name>_<version>_<arch>.deb`.
    let prefix = format!("{}_", package.split(':').next().unwrap_or(package));
    if let Ok(deb) = only_file(debs, &prefix) {
        return Ok(deb);
    }
    let download = || {
        util::run(
            Command::new("apt-get")
                .args(["download", "-q", "-o", "APT::Sandbox::User=root", package])
                .current_dir(debs),
            &format!("apt-get download {package}"),
        )
    };
    if download().is_err() {
        // Lists older than the mirror name a file it no longer has.
        util::run(
            Command::new("apt-get").args(["update", "-qq"]),
            "apt-get update",
        )?;
        download()?;
    }
    only_file(debs, &prefix).with_context(|| format!("apt-get download {package}"))
}

/// The one entry of `dir` whose name starts with `prefix`.
fn only_file(dir: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("{} has {found:?} for {prefix:?}", dir.display()),
    }
}

/// The file of `module` below the kernel's module tree `modules`.
fn find_module(modules: &Path, module: &str) -> anyhow::Result<PathBuf> {
    let out = util::output(
        "find",
        &[
            &modules.display().to_string(),
            "-name",
            &format!("{module}.ko"),
        ],
    )
    .unwrap_or_default();
    let found: Vec<&str> = out.lines().collect();
    match found.as_slice() {
        [one] => Ok(PathBuf::from(one)),
        _ => bail!("the kernel has {found:?} for the module {module}"),
    }
}

/// The shared libraries `program` needs, its loader among them, each found in
/// [`LIBRARY_DIRS`], and theirs in turn.
fn libraries(program: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = Vec::new();
    let mut queue = vec![program.to_owned()];
    while let Some(file) = queue.pop() {
        let dynamic = util::output(
            "aarch64-linux-gnu-readelf",
            &[
                "--dynamic",
                "--program-headers",
                &file.display().to_string(),
            ],
        )
        .with_context(|| format!("aarch64-linux-gnu-readelf {}", file.display()))?;
        for name in needed(&dynamic) {
            let path = LIBRARY_DIRS
                .iter()
                .map(|d| Path::new(d).join(&name))
                .find(|p| p.exists())
                .with_context(|| {
                    format!(
                        "{name} (for {}) is in none of {LIBRARY_DIRS:?}",
                        file.display()
                    )
                })?;
            // Copied under this name (through a link, to its file): the loader looks for
            // a library by the name a program says.
            if !found.contains(&path) {
                found.push(path.clone());
                queue.push(path);
            }
        }
    }
    Ok(found)
}

/// The library names readelf's `--dynamic --program-headers` output names: `NEEDED`
/// entries, and the loader the program asks for.
fn needed(readelf: &str) -> Vec<String> {
    readelf
        .lines()
        .filter_map(|l| {
            let (_, rest) = l
                .split_once("Shared library: [")
                .or_else(|| l.split_once("Requesting program interpreter: "))?;
            let name = rest.trim_end_matches(']').trim();
            Path::new(name).file_name()?.to_str().map(str::to_owned)
        })
        .collect()
}

/// Boots the machine in the bed and checks the arm64 adapter serves a DHCP device and
/// carries its pings and a TCP transfer to the other site (`cyphonic-bed vm-check`).
///
/// # Errors
/// The machine cannot be made, or the check fails.
pub(crate) fn check(root: &Path, arm64_bins: &Path, host_bins: &Path) -> anyhow::Result<()> {
    util::install_missing(
        "the arm64 machine",
        &[
            ("qemu-system-aarch64", "qemu-system-arm"),
            ("busybox", "busybox"),
            ("aarch64-linux-gnu-readelf", "binutils-aarch64-linux-gnu"),
        ],
    )?;
    let machine = prepare(root, arm64_bins)?;
    util::run(
        Command::new(host_bins.join("cyphonic-bed"))
            .args(["vm-check", "--kernel"])
            .arg(&machine.kernel)
            .arg("--initramfs")
            .arg(&machine.initramfs)
            .env("CYPHONIC_BIN_DIR", host_bins),
        "cyphonic-bed vm-check (the arm64 adapter in an arm64 machine)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_are_the_needed_entries_and_the_loader() {
        let said = "
 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x000000000000000e (SONAME)             Library soname: [libm.so.6]
      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]
";
        assert_eq!(
            needed(said),
            ["libgcc_s.so.1", "libc.so.6", "ld-linux-aarch64.so.1"]
        );
    }

    #[test]
    fn init_loads_every_module_in_order_then_starts_the_site() {
        let init = init();
        assert!(init.starts_with("#!/bin/busybox sh\n"), "{init}");
        assert!(init.contains(&format!("for m in {}; do", MODULES.join(" "))));
        let start = init.find("/site/start").unwrap();
        assert!(init.find("insmod").unwrap() < start);
        assert!(init.trim_end().ends_with("poweroff -f"));
    }
}
