//! The Raspberry Pi image, booted: `cargo xtask image --check` runs this with
//! `CYPHONIC_IMAGE` naming the image (it is ignored otherwise: it takes minutes).
//!
//! The Pi's own board is not emulated by the QEMU at hand, so the image's kernel, initrd and
//! disk boot on qemu-system-aarch64's `virt` machine, two virtio NICs standing for the Pi's
//! port (eth0, the uplink) and the USB adapter (eth1, the LAN). Site A of the two-site bed
//! is the appliance: its adapter namespace holds the emulator, whose NICs are bridged to the
//! bed's uplink and LAN links. Site B is the native adapter. The test writes the operator's
//! files into a copy of the image's boot partition (mtools, no mount), exactly as an operator
//! would from a laptop, and checks that systemd brings the adapter up from them: a device on
//! A's LAN gets its lease by DHCP from the appliance, resolves a name at the other site, and
//! pings across the tunnel; the first-boot report on the boot partition says what was taken.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cyphonic_e2e::bed::{BedOptions, Ping, Side, TwoSites};

/// Where the boot partition starts in the image (xtask image.rs: 4 MiB).
const BOOT_OFFSET: &str = "@@4M";

/// Runs a command, failing with its output (the bed's own runner).
fn run(program: &str, args: &[&str]) -> String {
    cyphonic_e2e::sh(program, args).unwrap()
}

/// `mtools`' name for the boot partition of `disk`.
fn fat(disk: &Path) -> String {
    format!("{}{BOOT_OFFSET}", disk.display())
}

/// Copies `from` (a host file) to `to` (a path on the boot partition).
fn put(disk: &Path, from: &Path, to: &str) {
    run(
        "mcopy",
        &[
            "-o",
            "-i",
            &fat(disk),
            from.to_str().unwrap(),
            &format!("::{to}"),
        ],
    );
}

/// A file of the boot partition, read.
fn get(disk: &Path, path: &str) -> String {
    run("mtype", &["-i", &fat(disk), &format!("::{path}")])
}

/// The kernel and initrd `config.txt` names (raspi-firmware copies them to the boot
/// partition), extracted into `dir`.
fn kernel_and_initrd(disk: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let config = get(disk, "config.txt");
    let kernel = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("kernel="))
        .unwrap_or_else(|| panic!("no kernel= in config.txt:\n{config}"))
        .trim()
        .to_owned();
    let initrd = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("initramfs "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no initramfs in config.txt:\n{config}"))
        .to_owned();
    let (k, i) = (dir.join("kernel"), dir.join("initrd"));
    for (from, to) in [(&kernel, &k), (&initrd, &i)] {
        run(
            "mcopy",
            &[
                "-o",
                "-i",
                &fat(disk),
                &format!("::{from}"),
                to.to_str().unwrap(),
            ],
        );
    }
    (k, i)
}

#[test]
#[ignore = "boots the Pi image under qemu-system-aarch64 (minutes); cargo xtask image --check"]
fn the_image_boots_to_an_adapter_that_serves_its_lan_and_reaches_the_other_site() {
    let image = PathBuf::from(
        std::env::var_os("CYPHONIC_IMAGE").expect("CYPHONIC_IMAGE names the image to boot"),
    );
    let mut bed = TwoSites::new(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })
    .unwrap();
    bed.start(Side::B).unwrap();
    let work = bed.a.dir.join("appliance");
    std::fs::create_dir_all(&work).unwrap();
    // A copy of the card, as the operator's laptop would write it.
    let disk = work.join("card.img");
    run(
        "cp",
        &[
            "--sparse=always",
            image.to_str().unwrap(),
            disk.to_str().unwrap(),
        ],
    );
    let (kernel, initrd) = kernel_and_initrd(&disk, &work);
    let cmdline = get(&disk, "cmdline.txt");
    assert!(
        cmdline.contains("root=LABEL=RASPIROOT") && cmdline.contains("net.ifnames=0"),
        "cmdline.txt: {cmdline}"
    );
    // The operator's files: the bed's configuration of site A, for the Pi's ports, and a
    // static uplink (the bed's uplink has no DHCP server).
    let config = std::fs::read_to_string(bed.a.config()).unwrap();
    let config: String = config
        .lines()
        .filter(|l| !l.starts_with("status_socket") && !l.starts_with("state_dir"))
        .map(|l| {
            if l.starts_with("lan_interface") {
                "lan_interface = \"eth1\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(work.join("adapter.toml"), config).unwrap();
    std::fs::write(
        work.join("uplink.network"),
        "[Match]\nName=eth0\n\n[Network]\nAddress=198.51.100.2/24\nGateway=198.51.100.1\n",
    )
    .unwrap();
    run("mmd", &["-D", "s", "-i", &fat(&disk), "::cyphonic/peers"]);
    for name in ["gw1.ovl.example.crt", "gw1.ovl.example.key", "ca.crt"] {
        put(&disk, &bed.a.dir.join(name), &format!("cyphonic/{name}"));
    }
    put(
        &disk,
        &bed.a.dir.join("peers/gw2.ovl.example.crt"),
        "cyphonic/peers/gw2.ovl.example.crt",
    );
    put(
        &disk,
        &work.join("uplink.network"),
        "cyphonic/uplink.network",
    );
    put(&disk, &work.join("adapter.toml"), "cyphonic/adapter.toml");

    // Site A's adapter namespace becomes the appliance's cable ends: its uplink and LAN
    // links bridged to the emulator's two taps, its own address given up to the appliance.
    let ns = &bed.a.adapter_ns;
    ns.ip(&["addr", "flush", "dev", "wan"]).unwrap();
    for (bridge, link, tap) in [("brw", "wan", "tap0"), ("brl", "lan", "tap1")] {
        ns.ip(&["link", "add", bridge, "type", "bridge"]).unwrap();
        ns.ip(&["tuntap", "add", "dev", tap, "mode", "tap"])
            .unwrap();
        for port in [link, tap] {
            ns.ip(&["link", "set", port, "master", bridge]).unwrap();
            ns.ip(&["link", "set", port, "up"]).unwrap();
        }
        ns.ip(&["link", "set", bridge, "up"]).unwrap();
    }
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
    let args = [
        "-M",
        "virt",
        "-cpu",
        "cortex-a72",
        "-smp",
        "2",
        "-m",
        "1024",
        "-display",
        "none",
        "-serial",
        &format!("file:{}", console.display()),
        "-no-reboot",
        "-kernel",
        kernel.to_str().unwrap(),
        "-initrd",
        initrd.to_str().unwrap(),
        "-append",
        &append,
        "-drive",
        &drive,
        "-device",
        "virtio-blk-pci,drive=card,romfile=",
        "-netdev",
        "tap,id=uplink,ifname=tap0,script=no,downscript=no",
        "-device",
        "virtio-net-pci,netdev=uplink,mac=52:54:00:00:01:01,romfile=",
        "-netdev",
        "tap,id=lan,ifname=tap1,script=no,downscript=no",
        "-device",
        "virtio-net-pci,netdev=lan,mac=52:54:00:00:01:02,romfile=",
    ];
    let started = Instant::now();
    let mut vm = ns
        .daemon(
            Path::new("/usr/bin/qemu-system-aarch64"),
            &args,
            &work.join("qemu.log"),
            || true,
        )
        .unwrap();
    let shown = || std::fs::read_to_string(&console).unwrap_or_default();
    // Booted when the adapter says it captures the LAN.
    let booted = cyphonic_e2e::wait_until(
        Duration::from_secs(600),
        "the appliance's adapter capturing its LAN",
        || {
            assert!(
                vm.running(),
                "the emulator stopped: {}\nconsole:\n{}",
                std::fs::read_to_string(work.join("qemu.log")).unwrap_or_default(),
                shown()
            );
            shown().contains("capturing the LAN")
        },
    );
    let boot_time = started.elapsed();
    booted.unwrap_or_else(|e| panic!("{e}\nconsole:\n{}", shown()));
    eprintln!("image: the adapter was up {boot_time:?} after power-on");
    let (device, ip) = bed
        .dhcp_device(Side::A, "sensor")
        .unwrap_or_else(|e| panic!("no lease from the appliance: {e}\nconsole:\n{}", shown()));
    assert!(
        ip.octets()[..3] == [100, 64, 1],
        "leased {ip}, outside A's block"
    );
    let names = bed.resolve(&device.ns, bed.a.gateway, "host.gw2.ovl.example");
    assert_eq!(names, vec![bed.b.host_ip.to_string()]);
    bed.ping_ok(&device.ns, bed.b.host_ip, Ping::count(5).wait(5));
    drop(vm);
    // What the first boot took, as the operator reads it back on the laptop.
    let report = get(&disk, "cyphonic/imported.txt");
    assert!(
        report.contains("installed /etc/cyphonic/adapter.toml: checked"),
        "{report}"
    );
    assert!(
        report.contains("removed gw1.ovl.example.key from the boot partition"),
        "{report}"
    );
    let left = run("mdir", &["-b", "-i", &fat(&disk), "::cyphonic"]);
    assert!(!left.contains(".key"), "a key stayed on the card: {left}");
    let console = shown();
    for unit in ["cyphonic-firstboot.service", "cyphonic-adapter.service"] {
        assert!(
            console.contains(&format!("Finished {unit}"))
                || console.contains(&format!("Started {unit}")),
            "{unit} not started\n{console}"
        );
    }
    // The LAN port held closed under the unit's sandbox, and nothing on the image (networkd
    // leaves eth1 unmanaged) fighting the adapter over it.
    assert!(!console.contains("cannot close the LAN port"), "{console}");
    assert!(!console.contains("cannot hold the LAN port"), "{console}");
    assert!(!console.contains("changed the LAN port"), "{console}");
}
