//! The Raspberry Pi image, booted: `cyphonic-bed image-check --image FILE`, which
//! `cargo xtask image --check` runs (not part of `cargo xtask test`: the image takes half an
//! hour to build).
//!
//! The Pi's own board is not emulated by the QEMU at hand, so the card boots on
//! qemu-system-aarch64's `virt` machine through QEMU's own U-Boot (Debian's u-boot-qemu),
//! which runs the image's boot script as the Pi's U-Boot does and boots root slot A's
//! kernel; two virtio NICs stand for the Pi's port (eth0, the uplink) and the USB adapter
//! (eth1, the LAN). Site A of the two-site bed
//! is the appliance: its adapter namespace holds the emulator, whose NICs are bridged to the
//! bed's uplink and LAN links. Site B is the native adapter. The check writes the operator's
//! files into a copy of the image's boot partition (mtools, no mount), exactly as an operator
//! would from a laptop, and checks that systemd brings the adapter up from them: a device on
//! A's LAN gets its lease by DHCP from the appliance, resolves a name at the other site, and
//! pings across the tunnel; the first-boot report on the boot partition says what was taken.
//! With the image's bundle, [`update`] then checks its A/B updates.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};

use crate::bed::{BedOptions, CloudOptions, ENROLL_POOL, Side, TwoSites};
use crate::{sh, vm};

pub mod update;

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

/// QEMU's own U-Boot (Debian's u-boot-qemu), which finds the image's boot script on the
/// card as the Pi's U-Boot does.
const FIRMWARE: &str = "/usr/lib/u-boot/qemu_arm64/u-boot.bin";

/// A copy of the card in `work`, as the operator's laptop would write it.
struct Card {
    work: PathBuf,
    disk: PathBuf,
    /// The appliance's uplink address, once cabled.
    uplink: String,
}

impl Card {
    fn copy(image: &Path, work: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(work)?;
        let disk = work.join("card.img");
        sh(
            "cp",
            &[
                "--sparse=always",
                image.to_str().context("path")?,
                disk.to_str().context("path")?,
            ],
        )?;
        let config = get(&disk, "config.txt")?;
        ensure!(
            config.lines().any(|l| l.trim() == "kernel=u-boot.bin"),
            "config.txt does not start U-Boot:\n{config}"
        );
        let card = Self {
            work: work.to_owned(),
            disk,
            uplink: String::new(),
        };
        // The kernel's messages and the journal on the serial console, which the check
        // reads (the boot script adds the line's arguments).
        card.write(
            "boot.conf",
            "extraargs=systemd.journald.forward_to_console=1\n",
        )?;
        Ok(card)
    }

    /// Writes the file `name` (`text`) into the boot partition's cyphonic/ folder.
    fn write(&self, name: &str, text: &str) -> anyhow::Result<()> {
        let local = self.work.join(name.replace('/', "-"));
        std::fs::write(&local, text)?;
        put(&self.disk, &local, &format!("cyphonic/{name}"))
    }

    /// Powers the card on in site A's adapter namespace (after [`vm::cable`]) and waits for
    /// its adapter to capture the LAN; returns the machine and how long that took.
    fn boot(&self, bed: &TwoSites, console: &Path) -> anyhow::Result<(crate::Proc, Duration)> {
        let drive = format!("file={},format=raw,if=none,id=card", self.disk.display());
        let mut machine = vm::power_on(
            &bed.a.adapter_ns,
            vm::Boot::Firmware(Path::new(FIRMWARE)),
            console,
            &[
                "-drive",
                &drive,
                "-device",
                "virtio-blk-pci,drive=card,romfile=",
            ],
        )?;
        // A configuration the first boot refused leaves the image's starter, which does
        // not start: said at once, with the card's report of why.
        let up = vm::wait_up(
            &mut machine,
            console,
            (vm::CAPTURING, &["adapter.toml refused"]),
            Duration::from_secs(600),
        )
        .map_err(|e| {
            // Read once the first-boot step synced it to the card.
            let _ = crate::wait_until(Duration::from_secs(30), "the first boot's end", || {
                std::fs::read_to_string(console)
                    .is_ok_and(|c| c.contains("Finished cyphonic-firstboot.service"))
            });
            let report = get(&self.disk, "cyphonic/imported.txt").unwrap_or_default();
            anyhow::anyhow!("the card's imported.txt:\n{report}\n{e}")
        })?;
        Ok((machine, up))
    }
}

/// The bed for a card (with `cloud`, if any): site B's adapter started, a copy of `image`
/// in site A's directory, site A's adapter namespace cabled for it ([`vm::cable`]) and the
/// card's static uplink written (the bed's uplink has no DHCP server).
fn appliance_bed(image: &Path, cloud: Option<CloudOptions>) -> anyhow::Result<(TwoSites, Card)> {
    let mut bed = TwoSites::new(&BedOptions {
        lan_switch: true,
        cloud,
        ..BedOptions::default()
    })?;
    bed.start(Side::B)?;
    let card = Card::copy(image, &bed.a.dir.join("appliance"))?;
    let (address, router) = vm::cable(&bed.a.adapter_ns)?;
    card.write(
        "uplink.network",
        &format!("[Match]\nName=eth0\n\n[Network]\nAddress={address}\nGateway={router}\n"),
    )?;
    let card = Card {
        uplink: address
            .split('/')
            .next()
            .context("the uplink's address")?
            .to_owned(),
        ..card
    };
    Ok((bed, card))
}

/// Checks what the first boot did with a card, as the operator reads it back on the laptop
/// (the report says the configuration was checked and installed; no key is left on the
/// card) and as the `console` shows: the first-boot step and the adapter's unit ran, and
/// the adapter was well ([`vm::adapter_was_well`]: the LAN port held closed under the
/// unit's sandbox, nothing on the image fighting it over it). Returns the report.
fn first_boot_went_well(card: &Card, console: &Path) -> anyhow::Result<String> {
    let report = get(&card.disk, "cyphonic/imported.txt")?;
    ensure!(
        report.contains("installed /etc/cyphonic/adapter.toml: checked"),
        "{report}"
    );
    let left = sh("mdir", &["-b", "-i", &fat(&card.disk), "::cyphonic"])?;
    ensure!(!left.contains(".key"), "a key is on the card: {left}");
    let console = std::fs::read_to_string(console)?;
    for unit in ["cyphonic-firstboot.service", "cyphonic-adapter.service"] {
        ensure!(
            console.contains(&format!("Finished {unit}"))
                || console.contains(&format!("Started {unit}")),
            "{unit} not started\n{console}"
        );
    }
    vm::adapter_was_well(&console)?;
    Ok(report)
}

/// Boots `image` twice as site A of a two-site bed (the module's documentation says how):
/// from a card with the site's files and keys (`files_card`), then from a card with only
/// an enrollment token and the cloud (`token_card`). Returns how long after power-on the
/// adapter was up in each.
///
/// # Errors
/// Any check failing, with the emulator's console in the message where it helps.
///
/// # Panics
/// As the bed's own checks do (`TwoSites::resolve`, `TwoSites::ping_ok`), with the bed's logs.
pub fn boot_check(image: &Path) -> anyhow::Result<(Duration, Duration)> {
    Ok((files_card(image)?, token_card(image)?))
}

/// Writes site A's files onto `card`: the bed's configuration of site A for the Pi's
/// ports, its certificate and key, the CA and the static peer's certificate.
fn site_files(bed: &TwoSites, card: &Card) -> anyhow::Result<()> {
    let disk = &card.disk;
    sh("mmd", &["-D", "s", "-i", &fat(disk), "::cyphonic/peers"])?;
    for name in ["gw1.ovl.example.crt", "gw1.ovl.example.key", "ca.crt"] {
        put(disk, &bed.a.dir.join(name), &format!("cyphonic/{name}"))?;
    }
    put(
        disk,
        &bed.a.dir.join("peers/gw2.ovl.example.crt"),
        "cyphonic/peers/gw2.ovl.example.crt",
    )?;
    let config = vm::machine_config(bed, &["status_socket", "state_dir"])?;
    card.write("adapter.toml", &config)
}

/// A card with the operator's files (the bed's configuration of site A for the Pi's ports,
/// its certificate and key, the CA, the static peer, a static uplink): a device gets its
/// lease, resolves site B's host and pings it; the report on the card says the
/// configuration was checked and the key removed from the card, and no key is left there.
fn files_card(image: &Path) -> anyhow::Result<Duration> {
    let (mut bed, card) = appliance_bed(image, None)?;
    site_files(&bed, &card)?;

    let console = card.work.join("console.log");
    let (machine, up) = card.boot(&bed, &console)?;
    vm::device_reaches_b(&mut bed, &console, (Ipv4Addr::new(100, 64, 1, 0), 24))?;
    drop(machine);
    // What the first boot took, as the operator reads it back on the laptop.
    let report = first_boot_went_well(&card, &console)?;
    ensure!(
        report.contains("removed gw1.ovl.example.key from the boot partition"),
        "{report}"
    );
    Ok(up)
}

/// The bed with a cloud that enrolls by token.
fn enrolling_cloud() -> CloudOptions {
    CloudOptions {
        enroll: Some(7 * 24 * 3600),
        ..CloudOptions::default()
    }
}

/// An `adapter.toml` with only the LAN port, a new enrollment token for site A's name and
/// the bed's cloud.
fn token_config(bed: &TwoSites) -> anyhow::Result<String> {
    let token = bed.create_token("gw1.ovl.example", &["--prefix", "24"])?;
    let cloud = bed.cloud.as_ref().context("the bed's cloud")?;
    Ok(format!(
        "[adapter]\nlan_interface = \"eth1\"\n\n[identity]\ntoken = \"{token}\"\n\n\
         [cloud]\naddress = \"{}\"\npublic_key = \"{}\"\n",
        cloud.address, cloud.public_key
    ))
}

/// A card with only `adapter.toml`: the LAN port, an enrollment token and the cloud's
/// address and key (the bed's cloud enrolls from its pool). The adapter must enroll at its
/// first start and serve a device a lease from the block the cloud gave it, resolve site
/// B's host (known through the cloud) and ping it; the token is then spent, and the card
/// held no key.
fn token_card(image: &Path) -> anyhow::Result<Duration> {
    let (mut bed, card) = appliance_bed(image, Some(enrolling_cloud()))?;
    card.write("adapter.toml", &token_config(&bed)?)?;

    let console = card.work.join("console.log");
    let (machine, up) = card.boot(&bed, &console)?;
    let shown = std::fs::read_to_string(&console)?;
    ensure!(
        shown.contains(": enrolled name=gw1.ovl.example "),
        "the adapter did not say it enrolled:\n{shown}"
    );
    let pool: ipnet::Ipv4Net = ENROLL_POOL.parse()?;
    vm::device_reaches_b(&mut bed, &console, (pool.network(), pool.prefix_len()))?;
    // Online: the token is spent, so the copy on the card opens nothing.
    let spent = crate::wait_until(Duration::from_secs(10), "the token spent", || {
        bed.token_state("gw1.ovl.example")
            .is_ok_and(|state| state == "used")
    });
    drop(machine);
    spent.map_err(|e| anyhow::anyhow!("{e}: {:?}", bed.token_state("gw1.ovl.example")))?;
    first_boot_went_well(&card, &console)?;
    Ok(up)
}
