//! An arm64 machine as one site of the bed: qemu-system-aarch64's `virt` machine in site A's
//! adapter namespace, its two virtio NICs (eth0 the uplink, eth1 the LAN) bridged to the
//! bed's uplink and LAN links, as the Pi's two ports would be. The Pi image's check boots
//! the whole image so ([`crate::image`]); `cyphonic-bed vm-check` boots only a kernel and
//! an initramfs that xtask makes around the adapter's aarch64 build (xtask/src/vm.rs), in
//! the kernel tier of `cargo xtask test`: the Pi's adapter, with its own packet sockets on
//! an aarch64 kernel, serves a DHCP device and carries its name lookups, pings and a TCP
//! transfer to the native adapter of site B.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, ensure};

use crate::bed::{BedOptions, Ping, Side, TwoSites};
use crate::{Netns, Proc, sh};

/// The MAC addresses of the machine's NICs: the uplink's, the LAN's.
const MACS: [&str; 2] = ["52:54:00:00:01:01", "52:54:00:00:01:02"];

/// Makes site A's adapter namespace the machine's cable ends: its uplink and LAN links
/// bridged to two taps the emulator opens, the namespace's own underlay address given up to
/// the machine (which takes it). Returns the uplink's address and router, as the namespace
/// had them (`198.51.100.2/24`, `198.51.100.1`).
///
/// # Errors
/// A link, bridge or tap cannot be made.
pub fn cable(ns: &Netns) -> anyhow::Result<(String, String)> {
    let (ip, len) = ns
        .ipv4_address("wan")
        .context("the adapter namespace's uplink address")?;
    let router = ns
        .default_route()
        .context("the adapter namespace's router")?;
    ns.ip(&["addr", "flush", "dev", "wan"])?;
    for (bridge, link, tap) in [("brw", "wan", "tap0"), ("brl", "lan", "tap1")] {
        ns.ip(&["link", "add", bridge, "type", "bridge"])?;
        ns.ip(&["tuntap", "add", "dev", tap, "mode", "tap"])?;
        for port in [link, tap] {
            ns.ip(&["link", "set", port, "master", bridge])?;
            ns.ip(&["link", "set", port, "up"])?;
        }
        ns.ip(&["link", "set", bridge, "up"])?;
    }
    Ok((format!("{ip}/{len}"), router.to_string()))
}

/// How a machine boots.
#[derive(Debug, Clone, Copy)]
pub enum Boot<'a> {
    /// The kernel and initrd given to the emulator, with the kernel's command line; the
    /// emulator ends when the machine reboots.
    Kernel((&'a Path, &'a Path), &'a str),
    /// A firmware image (`-bios`: QEMU's U-Boot), which finds what to boot on the disks;
    /// the machine may reboot.
    Firmware(&'a Path),
}

/// Starts the machine in `ns` (after [`cable`]) as `boot` says, the serial console written
/// to `console`, `extra` arguments (a disk). Ended when the returned process is dropped.
///
/// # Errors
/// The emulator cannot be started.
pub fn power_on(
    ns: &Netns,
    boot: Boot<'_>,
    console: &Path,
    extra: &[&str],
) -> anyhow::Result<Proc> {
    let serial = format!("file:{}", console.display());
    let uplink = format!("virtio-net-pci,netdev=uplink,mac={},romfile=", MACS[0]);
    let lan = format!("virtio-net-pci,netdev=lan,mac={},romfile=", MACS[1]);
    let mut args = vec![
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
        &serial,
        "-netdev",
        "tap,id=uplink,ifname=tap0,script=no,downscript=no",
        "-device",
        &uplink,
        "-netdev",
        "tap,id=lan,ifname=tap1,script=no,downscript=no",
        "-device",
        &lan,
    ];
    match boot {
        Boot::Kernel((kernel, initrd), append) => args.extend_from_slice(&[
            "-no-reboot",
            "-kernel",
            kernel.to_str().context("path")?,
            "-initrd",
            initrd.to_str().context("path")?,
            "-append",
            append,
        ]),
        Boot::Firmware(firmware) => {
            args.extend_from_slice(&["-bios", firmware.to_str().context("path")?]);
        }
    }
    args.extend_from_slice(extra);
    let log = console.with_extension("qemu.log");
    ns.daemon(
        Path::new("/usr/bin/qemu-system-aarch64"),
        &args,
        &log,
        || true,
    )
}

/// Waits until the machine's console shows `up` (the adapter capturing its LAN); returns
/// how long after power-on. Fails at once when the emulator stops or the console shows one
/// of `gone` (what says `up` will not come).
///
/// # Errors
/// Not within `limit`, the emulator stopped (with its log) or the console said one of
/// `gone`; the console in the message.
pub fn wait_up(
    vm: &mut Proc,
    console: &Path,
    (up, gone): (&str, &[&str]),
    limit: Duration,
) -> anyhow::Result<Duration> {
    wait_console(vm, (console, 0), (up, gone), limit)
}

/// What the machine's console shows after its first `since` bytes (empty if it cannot be
/// read yet).
pub fn console_since(console: &Path, since: usize) -> String {
    let all = std::fs::read(console).unwrap_or_default();
    String::from_utf8_lossy(all.get(since..).unwrap_or_default()).into_owned()
}

/// As [`wait_up`], for what the console shows after its first `since` bytes (a later boot
/// of the same machine).
///
/// # Errors
/// As [`wait_up`]'s.
pub fn wait_console(
    vm: &mut Proc,
    (console, since): (&Path, usize),
    (up, gone): (&str, &[&str]),
    limit: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let shown = || console_since(console, since);
    let mut stopped = false;
    let mut said = None;
    let booted = crate::wait_until(
        limit,
        &format!("the machine's console to show {up:?}"),
        || {
            stopped = !vm.running();
            let text = shown();
            said = gone.iter().find(|g| text.contains(**g));
            stopped || said.is_some() || text.contains(up)
        },
    );
    let took = started.elapsed();
    ensure!(
        !stopped,
        "the emulator stopped: {}\nconsole:\n{}",
        std::fs::read_to_string(console.with_extension("qemu.log")).unwrap_or_default(),
        shown()
    );
    if let Some(said) = said {
        anyhow::bail!("the machine said {said:?}\nconsole:\n{}", shown());
    }
    booted.map_err(|e| anyhow!("{e}\nconsole:\n{}", shown()))?;
    Ok(took)
}

/// What the adapter logs once it captures its LAN.
pub const CAPTURING: &str = "capturing the LAN";

/// Site A's adapter configuration for the machine: the LAN on eth1, the lines starting with
/// any of `without` left out.
///
/// # Errors
/// The bed's file cannot be read.
pub fn machine_config(bed: &TwoSites, without: &[&str]) -> anyhow::Result<String> {
    let config = std::fs::read_to_string(bed.a.config())?;
    Ok(config
        .lines()
        .filter(|l| !without.iter().any(|w| l.starts_with(w)))
        .map(|l| {
            if l.starts_with("lan_interface") {
                "lan_interface = \"eth1\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The site's part of the machine's initramfs, in `dir`: site A's adapter files (its
/// configuration with the LAN on eth1, its certificate, key, CA and peers) in
/// /etc/cyphonic, and `/site/start`, which the base's `/init` runs: it checks that eth0 is
/// the uplink NIC, gives it the site's `address` and `router`, and runs the adapter.
fn site_tree(bed: &TwoSites, dir: &Path, address: &str, router: &str) -> anyhow::Result<()> {
    let etc = dir.join("etc/cyphonic");
    std::fs::create_dir_all(etc.join("peers"))?;
    std::fs::write(etc.join("adapter.toml"), machine_config(bed, &[])?)?;
    for (from, to) in [
        (bed.a.dir.clone(), etc.clone()),
        (bed.a.dir.join("peers"), etc.join("peers")),
    ] {
        for entry in std::fs::read_dir(&from)? {
            let path = entry?.path();
            let keep = path.extension().is_some_and(|x| x == "crt" || x == "key");
            if keep && path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().context("name")?))?;
            }
        }
    }
    std::fs::create_dir_all(dir.join("site"))?;
    let start = dir.join("site/start");
    std::fs::write(
        &start,
        format!(
            "#!/bin/sh\n\
             # The bed's site A (e2e/src/vm.rs): the uplink, then the adapter.\n\
             set -e\n\
             [ \"$(cat /sys/class/net/eth0/address)\" = \"{uplink}\" ] || {{ echo \"cyphonic-vm: eth0 is not the uplink NIC\"; exit 1; }}\n\
             ip link set lo up\n\
             ip addr add {address} dev eth0\n\
             ip link set eth0 up\n\
             ip route add default via {router}\n\
             echo \"cyphonic-vm: uplink {address} via {router}\"\n\
             exec /usr/bin/cyphonic-adapter run --config /etc/cyphonic/adapter.toml\n",
            uplink = MACS[0],
        ),
    )?;
    std::fs::set_permissions(&start, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(())
}

/// Sends `len` bytes from `from` to `to_ip` in `to` over TCP ([`crate::netcat`]) and checks
/// that what arrived is what was sent.
///
/// # Errors
/// An end fails, or the bytes differ.
pub fn tcp_transfer(
    work: &Path,
    ends: (&Netns, &Netns, std::net::Ipv4Addr),
    len: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let (input, output) = crate::netcat(work, ends, len, timeout)?;
    let (data, received) = (std::fs::read(input)?, std::fs::read(output)?);
    ensure!(
        received == data,
        "{} bytes sent, {} received, {}",
        data.len(),
        received.len(),
        if received.len() == data.len() {
            "changed on the way"
        } else {
            "cut short"
        }
    );
    Ok(())
}

/// Boots the machine (`kernel`, the base `initramfs` xtask made) as site A of a two-site
/// bed and checks its arm64 adapter: a DHCP device on its LAN gets a lease in A's block,
/// resolves a name at site B, pings B's host and sends it 4 MiB over TCP intact; the
/// adapter's log has no panic and no failure to hold the LAN port closed. Returns how long
/// after power-on the adapter captured its LAN.
///
/// # Errors
/// A check fails, with the machine's console where it helps.
///
/// # Panics
/// As the bed's own checks do (`TwoSites::ping_ok`), with the bed's logs.
pub fn adapter_check(kernel: &Path, initramfs: &Path) -> anyhow::Result<Duration> {
    let kernel = &std::fs::canonicalize(kernel).with_context(|| kernel.display().to_string())?;
    let initramfs =
        &std::fs::canonicalize(initramfs).with_context(|| initramfs.display().to_string())?;
    let mut bed = TwoSites::new(&BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    })?;
    bed.start(Side::B)?;
    let work = bed.tmp().join("vm");
    std::fs::create_dir_all(&work)?;
    let (address, router) = cable(&bed.a.adapter_ns)?;
    let site = work.join("site");
    site_tree(&bed, &site, &address, &router)?;
    // The site's archive after the base's: the kernel unpacks both into one root.
    let initrd: PathBuf = work.join("initrd.cpio");
    let site_cpio = work.join("site.cpio");
    sh(
        "sh",
        &[
            "-c",
            "cd \"$1\" && find . | LC_ALL=C sort | busybox cpio -o -H newc -R 0:0 > \"$2\" && cat \"$3\" \"$2\" > \"$4\"",
            "sh",
            site.to_str().context("path")?,
            site_cpio.to_str().context("path")?,
            initramfs.to_str().context("path")?,
            initrd.to_str().context("path")?,
        ],
    )?;
    let console = work.join("console.log");
    let mut vm = power_on(
        &bed.a.adapter_ns,
        Boot::Kernel((kernel, &initrd), "console=ttyAMA0 panic=-1"),
        &console,
        &[],
    )?;
    let shown = || std::fs::read_to_string(&console).unwrap_or_default();
    let up = wait_up(
        &mut vm,
        &console,
        (CAPTURING, &["cyphonic-vm: /site/start ended"]),
        Duration::from_secs(300),
    )?;
    ensure!(
        shown().contains("on aarch64, modules loaded") && !shown().contains("cyphonic-vm: insmod"),
        "the machine's init:\n{}",
        shown()
    );
    let device = device_reaches_b(
        &mut bed,
        &console,
        (std::net::Ipv4Addr::new(100, 64, 1, 0), 24),
    )?;
    tcp_transfer(
        &work,
        (&device.ns, &bed.b.lan, bed.b.host_ip),
        4 << 20,
        Duration::from_secs(60),
    )
    .map_err(|e| anyhow!("{e}\nconsole:\n{}", shown()))?;
    drop(vm);
    adapter_was_well(&shown())?;
    Ok(up)
}

/// What the machine on site A must do for a device on its LAN: a lease by DHCP in `block`
/// (network, prefix length: A's), the name of B's host resolved by the DNS server the lease
/// names, 5 pings to it. Returns the device.
///
/// # Errors
/// No lease, a lease outside the block or another answer to the name, with the machine's
/// `console`.
///
/// # Panics
/// A ping lost (`TwoSites::ping_ok`), with the bed's logs.
pub fn device_reaches_b(
    bed: &mut TwoSites,
    console: &Path,
    (network, prefix): (std::net::Ipv4Addr, u8),
) -> anyhow::Result<crate::lan::DhcpHost> {
    let shown = || std::fs::read_to_string(console).unwrap_or_default();
    let (device, ip) = bed.dhcp_device(Side::A, "sensor").map_err(|e| {
        anyhow!(
            "no lease from the machine's adapter: {e}\nconsole:\n{}",
            shown()
        )
    })?;
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    ensure!(
        u32::from(ip) & mask == u32::from(network) & mask,
        "leased {ip}, outside {network}/{prefix}"
    );
    let server = device
        .default_route()
        .context("the lease named no router")?;
    let names = bed.resolve(&device.ns, server, "host.gw2.ovl.example");
    ensure!(
        names == vec![bed.b.host_ip.to_string()],
        "host.gw2.ovl.example: {names:?}\nconsole:\n{}",
        shown()
    );
    bed.ping_ok(&device.ns, bed.b.host_ip, Ping::count(5).wait(5));
    Ok(device)
}

/// Checks a machine's console for what a well adapter never logs: a panic, a failure to
/// close its LAN port to the machine's kernel or to hold it closed, a change of the port
/// it had to undo.
///
/// # Errors
/// Which of them the console shows, with the console.
pub fn adapter_was_well(console: &str) -> anyhow::Result<()> {
    for bad in [
        "panicked",
        "cannot close the LAN port",
        "cannot hold the LAN port",
        "changed the LAN port",
    ] {
        ensure!(
            !console.contains(bad),
            "the adapter logged {bad:?}:\n{console}"
        );
    }
    Ok(())
}
