//! The Raspberry Pi image, booted: `cyphonic-bed image-check --image FILE`, which
//! `cargo xtask image --check` runs (not part of `cargo xtask test`: the image takes half an
//! hour to build).
//!
//! The Pi's own board is not emulated by the QEMU at hand, so the image's kernel, initrd and
//! disk boot on qemu-system-aarch64's `virt` machine, two virtio NICs standing for the Pi's
//! port (eth0, the uplink) and the USB adapter (eth1, the LAN). Site A of the two-site bed
//! is the appliance: its adapter namespace holds the emulator, whose NICs are bridged to the
//! bed's uplink and LAN links. Site B is the native adapter. The check writes the operator's
//! files into a copy of the image's boot partition (mtools, no mount), exactly as an operator
//! would from a laptop, and checks that systemd brings the adapter up from them: a device on
//! A's LAN gets its lease by DHCP from the appliance, resolves a name at the other site, and
//! pings across the tunnel; the first-boot report on the boot partition says what was taken.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};

use crate::bed::{BedOptions, Side, TwoSites};
use crate::{sh, vm};

/// Where the boot partition starts in the image (xtask image.rs: 4 MiB).
const BOOT_OFFSET: &str = "@@4M";

/// `mtools`' name for the boot partition of `disk`.
fn fat(disk: &Path) -> String {
    format!("{}{BOOT_OFFSET}", disk.display())
}

/// Copies `from` (a host file) to `to` (a path on the boot partition).
fn put(disk: &Path, from: &Path, to: &str) -> anyhow::Result<()> {
    sh(
        "mcopy",
        &[
            "-o",
            "-i",
            &fat(disk),
            from.to_str().context("path")?,
            &format!("::{to}"),
        ],
    )?;
    Ok(())
}

/// A file of the boot partition, read.
fn get(disk: &Path, path: &str) -> anyhow::Result<String> {
    sh("mtype", &["-i", &fat(disk), &format!("::{path}")])
}

/// The kernel and initrd `config.txt` names (raspi-firmware copies them to the boot
/// partition), extracted into `dir`.
fn kernel_and_initrd(disk: &Path, dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let config = get(disk, "config.txt")?;
    let kernel = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("kernel="))
        .with_context(|| format!("no kernel= in config.txt:\n{config}"))?
        .trim()
        .to_owned();
    let initrd = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("initramfs "))
        .and_then(|l| l.split_whitespace().next())
        .with_context(|| format!("no initramfs in config.txt:\n{config}"))?
        .to_owned();
    let (k, i) = (dir.join("kernel"), dir.join("initrd"));
    for (from, to) in [(&kernel, &k), (&initrd, &i)] {
        sh(
            "mcopy",
            &[
                "-o",
                "-i",
                &fat(disk),
                &format!("::{from}"),
                to.to_str().context("path")?,
            ],
        )?;
    }
    Ok((k, i))
}

/// Boots `image` as site A of a two-site bed and checks it serves its LAN and reaches site
/// B (the module's documentation says how); returns how long after power-on its adapter
/// was up.
///
/// # Errors
/// Any check failing, with the emulator's console in the message where it helps.
///
/// # Panics
/// As the bed's own checks do (`TwoSites::resolve`, `TwoSites::ping_ok`), with the bed's logs.
pub fn boot_check(image: &Path) -> anyhow::Result<Duration> {
    let mut bed = TwoSites::new(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })?;
    bed.start(Side::B)?;
    let work = bed.a.dir.join("appliance");
    std::fs::create_dir_all(&work)?;
    // A copy of the card, as the operator's laptop would write it.
    let disk = work.join("card.img");
    sh(
        "cp",
        &[
            "--sparse=always",
            image.to_str().context("path")?,
            disk.to_str().context("path")?,
        ],
    )?;
    let (kernel, initrd) = kernel_and_initrd(&disk, &work)?;
    let cmdline = get(&disk, "cmdline.txt")?;
    ensure!(
        cmdline.contains("root=LABEL=RASPIROOT") && cmdline.contains("net.ifnames=0"),
        "cmdline.txt: {cmdline}"
    );
    // Site A's adapter namespace becomes the appliance's cable ends.
    let (address, router) = vm::cable(&bed.a.adapter_ns)?;
    // The operator's files: the bed's configuration of site A, for the Pi's ports, and a
    // static uplink (the bed's uplink has no DHCP server).
    let config = vm::machine_config(&bed, &["status_socket", "state_dir"])?;
    std::fs::write(work.join("adapter.toml"), config)?;
    std::fs::write(
        work.join("uplink.network"),
        format!("[Match]\nName=eth0\n\n[Network]\nAddress={address}\nGateway={router}\n"),
    )?;
    sh("mmd", &["-D", "s", "-i", &fat(&disk), "::cyphonic/peers"])?;
    for name in ["gw1.ovl.example.crt", "gw1.ovl.example.key", "ca.crt"] {
        put(&disk, &bed.a.dir.join(name), &format!("cyphonic/{name}"))?;
    }
    put(
        &disk,
        &bed.a.dir.join("peers/gw2.ovl.example.crt"),
        "cyphonic/peers/gw2.ovl.example.crt",
    )?;
    put(
        &disk,
        &work.join("uplink.network"),
        "cyphonic/uplink.network",
    )?;
    put(&disk, &work.join("adapter.toml"), "cyphonic/adapter.toml")?;

    let console = work.join("console.log");
    let append = format!(
        "{} console=ttyAMA0 systemd.journald.forward_to_console=1",
        cmdline
            .split_whitespace()
            .filter(|w| !w.starts_with("console="))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let drive = format!("file={},format=raw,if=none,id=card", disk.display());
    let mut vm = vm::power_on(
        &bed.a.adapter_ns,
        (&kernel, &initrd),
        &append,
        &console,
        &[
            "-drive",
            &drive,
            "-device",
            "virtio-blk-pci,drive=card,romfile=",
        ],
    )?;
    let shown = || std::fs::read_to_string(&console).unwrap_or_default();
    // Booted when the adapter says it captures the LAN; given up if the emulator stops.
    let boot_time = vm::wait_up(&mut vm, &console, vm::CAPTURING, Duration::from_secs(600))?;
    vm::device_reaches_b(&mut bed, &console)?;
    drop(vm);
    // What the first boot took, as the operator reads it back on the laptop.
    let report = get(&disk, "cyphonic/imported.txt")?;
    ensure!(
        report.contains("installed /etc/cyphonic/adapter.toml: checked"),
        "{report}"
    );
    ensure!(
        report.contains("removed gw1.ovl.example.key from the boot partition"),
        "{report}"
    );
    let left = sh("mdir", &["-b", "-i", &fat(&disk), "::cyphonic"])?;
    ensure!(!left.contains(".key"), "a key stayed on the card: {left}");
    let console = shown();
    for unit in ["cyphonic-firstboot.service", "cyphonic-adapter.service"] {
        ensure!(
            console.contains(&format!("Finished {unit}"))
                || console.contains(&format!("Started {unit}")),
            "{unit} not started\n{console}"
        );
    }
    // The LAN port held closed under the unit's sandbox, and nothing on the image (networkd
    // leaves eth1 unmanaged) fighting the adapter over it.
    vm::adapter_was_well(&console)?;
    Ok(boot_time)
}
