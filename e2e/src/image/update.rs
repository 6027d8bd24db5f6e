//! The image's A/B updates, booted (config/image/boot.cmd has the scheme): a card that
//! enrolled by token takes the image's own bundle over SSH (`rauc install`) and reboots
//! into slot B, which proves healthy and is kept, and still boots after another reboot;
//! then a bundle whose adapter cannot start goes into slot A, which boots once, fails its
//! trial and is marked bad, and the box comes back to slot B by itself. U-Boot's counters
//! are read on the box (`fw_printenv`) at each step, and the device leased before the
//! updates keeps pinging the other site through all of them. On a site without a cloud
//! ([`static_update_check`]), the update is kept with no traffic during its trial.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use super::{Card, appliance_bed, enrolling_cloud, site_files, token_config};
use crate::bed::{ENROLL_POOL, TwoSites};
use crate::{Netns, sh, vm};

/// How long a boot of the emulated Pi may take, to the slot check's verdict.
const BOOT: Duration = Duration::from_secs(600);
/// What the slot check says on the console (config/image/slot-check).
const WELL: &str = "cyphonic-slot-check: slot well";
const KEPT: &str = "cyphonic-slot-check: update kept";
const ROLLED_BACK: &str = "cyphonic-slot-check: update rolled back";

/// The key that signs bundles, and its certificate.
#[derive(Debug, Clone)]
pub struct Signer {
    /// The private key (PEM).
    pub key: PathBuf,
    /// Its certificate (PEM), which the image's keyring trusts.
    pub cert: PathBuf,
}

/// How long the updates took, from `rauc install` to the slot check's verdict.
#[derive(Debug, Clone, Copy)]
pub struct Updates {
    /// Copying the good bundle to the box and installing it.
    pub install: Duration,
    /// From the reboot into the new slot to its being kept.
    pub kept: Duration,
    /// From the reboot into the bad slot to the old slot's coming back well.
    pub rolled_back: Duration,
}

/// SSH to the appliance from a namespace of the bed, with a key of the check's own
/// (the card's `authorized_keys`).
struct Shell {
    /// The namespace's name.
    ns: String,
    key: PathBuf,
    host: String,
}

impl Shell {
    fn new(ns: &Netns, work: &Path, host: &str) -> anyhow::Result<Self> {
        let key = work.join("ssh-key");
        let _ = std::fs::remove_file(&key);
        let _ = std::fs::remove_file(key.with_extension("pub"));
        sh(
            "ssh-keygen",
            &[
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "image-check",
                "-f",
                key.to_str().context("path")?,
            ],
        )?;
        Ok(Self {
            ns: ns.name().to_owned(),
            key,
            host: host.to_owned(),
        })
    }

    fn public_key(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.key.with_extension("pub"))?)
    }

    /// `program` in the namespace, with the options that reach the box.
    fn options(&self, program: &str) -> anyhow::Result<Vec<String>> {
        Ok([
            "netns",
            "exec",
            &self.ns,
            program,
            "-i",
            self.key.to_str().context("path")?,
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
        ]
        .map(str::to_owned)
        .to_vec())
    }

    /// Runs `command` on the box; its output, or an error with it.
    fn run(&self, command: &str) -> anyhow::Result<String> {
        let mut args = self.options("ssh")?;
        args.extend([format!("root@{}", self.host), command.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sh("ip", &args)
    }

    /// Copies `file` to `to` on the box.
    fn copy(&self, file: &Path, to: &str) -> anyhow::Result<()> {
        let mut args = self.options("scp")?;
        args.extend([
            file.to_str().context("path")?.to_owned(),
            format!("root@{}:{to}", self.host),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sh("ip", &args)?;
        Ok(())
    }

    /// Waits until the box answers.
    fn wait(&self) -> anyhow::Result<()> {
        crate::wait_until(Duration::from_secs(120), "the box's SSH", || {
            self.run("true").is_ok()
        })
    }

    /// Waits until the box's adapter has its control session with the cloud (its status).
    fn wait_adapter(&self) -> anyhow::Result<()> {
        let mut last = String::new();
        crate::wait_until(
            Duration::from_secs(180),
            "the box's adapter in contact with the cloud",
            || match self.run(
                "doc=$(cyphonic-adapter status --json) && \
                 echo \"$doc\" | jq -e '.cloud.connected == true'",
            ) {
                Ok(_) => true,
                Err(e) => {
                    last = e.to_string();
                    false
                }
            },
        )
        .map_err(|e| anyhow::anyhow!("{e}: {last}"))
    }

    /// U-Boot's counters as the box reads them.
    fn counters(&self) -> anyhow::Result<String> {
        Ok(self
            .run("fw_printenv BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT")?
            .lines()
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// Installs `bundle` and checks the counters it leaves: the other slot first, one try.
    fn install(&self, bundle: &Path, slot: char) -> anyhow::Result<()> {
        self.copy(bundle, "/var/tmp/update.raucb")?;
        let said = self.run(
            "rauc install /var/tmp/update.raucb 2>&1; s=$?; rm -f /var/tmp/update.raucb; exit $s",
        )?;
        let counters = self.counters()?;
        let other = if slot == 'A' { 'B' } else { 'A' };
        ensure!(
            counters.contains(&format!("BOOT_ORDER={slot} {other}"))
                && counters.contains(&format!("BOOT_{slot}_LEFT=1")),
            "after installing {} into slot {slot}: {counters}\n{said}",
            bundle.display()
        );
        Ok(())
    }

    /// Reboots the box; returns where the console stood.
    fn reboot(&self, console: &Path) -> anyhow::Result<usize> {
        let since = std::fs::metadata(console)?.len();
        // The connection may drop before ssh hears the answer.
        let _ = self.run("systemctl reboot");
        Ok(usize::try_from(since)?)
    }
}

/// Pings the other site's host from `device` (every request answered); otherwise an error
/// with what the box and its console say.
fn device_pings_b(
    bed: &TwoSites,
    device: &Netns,
    shell: &Shell,
    console: &Path,
) -> anyhow::Result<()> {
    let to = bed.b.host_ip.to_string();
    let out = device.exec_output("ping", &["-c", "5", "-i", "0.2", "-W", "5", &to])?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains(" 5 received") {
        return Ok(());
    }
    let said = shell
        .run("cyphonic-adapter status; journalctl -b -u cyphonic-adapter --no-pager | tail -n 40")
        .unwrap_or_else(|e| e.to_string());
    let shown = vm::console_since(console, 0);
    let tail: Vec<&str> = shown.lines().rev().take(120).collect();
    anyhow::bail!(
        "ping {to} from {}:\n{text}\nthe box:\n{said}\nconsole:\n{}\n{}",
        device.name(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        bed.logs()
    )
}

/// A bundle of `good`'s root file system whose adapter cannot start (a program that says
/// so and exits 1 in its place), version `<good's>-broken`, signed by `signer`.
fn broken_bundle(good: &Path, signer: &Signer, work: &Path) -> anyhow::Result<PathBuf> {
    let dir = work.join("broken");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let path = |p: &Path| p.to_str().map(str::to_owned).context("path");
    sh(
        "rauc",
        &[
            "extract",
            "--keyring",
            &path(&signer.cert)?,
            &path(good)?,
            &path(&dir)?,
        ],
    )?;
    let failing = work.join("failing-adapter");
    std::fs::write(
        &failing,
        "#!/bin/sh\necho 'cyphonic-adapter: broken on purpose by the image check' >&2\nexit 1\n",
    )?;
    let commands = work.join("debugfs.cmd");
    std::fs::write(
        &commands,
        format!(
            "rm /usr/bin/cyphonic-adapter\nwrite {} /usr/bin/cyphonic-adapter\n\
             sif /usr/bin/cyphonic-adapter mode 0100755\n",
            failing.display()
        ),
    )?;
    sh(
        "debugfs",
        &[
            "-w",
            "-f",
            &path(&commands)?,
            &path(&dir.join("root.ext4"))?,
        ],
    )?;
    // The manifest as it was, but for its version and what `rauc bundle` adds again.
    let manifest = dir.join("manifest.raucm");
    let text = std::fs::read_to_string(&manifest)?;
    let mut versioned = false;
    let edited: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("verity-"))
        .map(|l| match l.strip_prefix("version=") {
            Some(v) => {
                versioned = true;
                format!("version={v}-broken")
            }
            None => l.to_owned(),
        })
        .collect();
    ensure!(versioned, "no version in the bundle's manifest:\n{text}");
    std::fs::write(&manifest, edited.join("\n") + "\n")?;
    let out = work.join("broken.raucb");
    let _ = std::fs::remove_file(&out);
    sh(
        "rauc",
        &[
            "bundle",
            "--cert",
            &path(&signer.cert)?,
            "--key",
            &path(&signer.key)?,
            &path(&dir)?,
            &path(&out)?,
        ],
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok(out)
}

/// A booted appliance in the bed, reachable over SSH, with a device on its LAN that
/// reached the other site.
struct Appliance {
    bed: TwoSites,
    card: Card,
    shell: Shell,
    console: PathBuf,
    machine: crate::Proc,
    device: crate::lan::DhcpHost,
}

impl Appliance {
    /// Boots a card of `image` with a token and the bed's cloud (`cloud`), or with site
    /// A's files and its static peer, and SSH keys; waits for its device's ping and the
    /// first boot's slot check (slot A, one try taken and given back).
    fn up(image: &Path, cloud: bool) -> anyhow::Result<Self> {
        let (mut bed, card) = appliance_bed(image, cloud.then(enrolling_cloud))?;
        if cloud {
            card.write("adapter.toml", &token_config(&bed)?)?;
        } else {
            site_files(&bed, &card)?;
        }
        // From site B's adapter namespace, across the underlay (site A's gave its address
        // up to the machine).
        let shell = Shell::new(&bed.b.adapter_ns, &card.work, &card.uplink)?;
        card.write("authorized_keys", &shell.public_key()?)?;
        let console = card.work.join("console.log");
        let (mut machine, _) = card.boot(&bed, &console)?;
        let block = if cloud {
            let pool: ipnet::Ipv4Net = ENROLL_POOL.parse()?;
            (pool.network(), pool.prefix_len())
        } else {
            (std::net::Ipv4Addr::new(100, 64, 1, 0), 24)
        };
        let device = vm::device_reaches_b(&mut bed, &console, block)?;
        vm::wait_console(&mut machine, (&console, 0), (WELL, &[]), BOOT)?;
        let first = vm::console_since(&console, 0);
        ensure!(
            first.contains("cyphonic: booting slot A (BOOT_ORDER A, A 2 left, B 0 left)"),
            "the first boot was not slot A's:\n{first}"
        );
        shell.wait()?;
        Ok(Self {
            bed,
            card,
            shell,
            console,
            machine,
            device,
        })
    }

    /// Installs `bundle` into slot B and reboots into it: it must be kept. Returns how
    /// long the copy and install took, how long after the reboot it was kept, and what the
    /// console showed since the reboot.
    fn update_kept(&mut self, bundle: &Path) -> anyhow::Result<(Duration, Duration, String)> {
        let started = Instant::now();
        self.shell.install(bundle, 'B')?;
        let install = started.elapsed();
        let (_, kept, shown) = self.reboot_until((KEPT, &[ROLLED_BACK]))?;
        Ok((install, kept, shown))
    }

    /// Reboots the box and waits until its console shows `up` (failing at once on one of
    /// `gone`); returns where the console stood at the reboot, how long the wait took and
    /// what the console showed since the reboot.
    fn reboot_until(
        &mut self,
        (up, gone): (&str, &[&str]),
    ) -> anyhow::Result<(usize, Duration, String)> {
        let since = self.shell.reboot(&self.console)?;
        let started = Instant::now();
        vm::wait_console(&mut self.machine, (&self.console, since), (up, gone), BOOT)?;
        Ok((
            since,
            started.elapsed(),
            vm::console_since(&self.console, since),
        ))
    }

    /// The device pings the other site ([`device_pings_b`]).
    fn device_pings_b(&self) -> anyhow::Result<()> {
        device_pings_b(&self.bed, &self.device.ns, &self.shell, &self.console)
    }

    /// Powers the machine off and checks what the adapter logged in all its boots.
    fn off(self) -> anyhow::Result<()> {
        let console = self.console.clone();
        drop(self.machine);
        vm::adapter_was_well(&vm::console_since(&console, 0))
    }
}

/// The check (the module's documentation says what it does).
///
/// # Errors
/// Any step failing, with the console or the box's answer in the message.
pub fn update_check(image: &Path, bundle: &Path, signer: &Signer) -> anyhow::Result<Updates> {
    let mut pi = Appliance::up(image, true)?;
    let broken = broken_bundle(bundle, signer, &pi.card.work)?;

    // The image's own bundle: into slot B, on trial, kept.
    let (install, kept, shown) = pi.update_kept(bundle)?;
    ensure!(
        shown.contains("cyphonic: booting slot B (BOOT_ORDER B A, A 3 left, B 0 left)"),
        "the update's boot was not slot B's, with its one try:\n{shown}"
    );
    let shell = &pi.shell;
    shell.wait()?;
    shell.wait_adapter()?;
    pi.device_pings_b()?;
    let counters = shell.counters()?;
    ensure!(
        counters.contains("BOOT_ORDER=B A") && counters.contains("BOOT_B_LEFT=3"),
        "slot B kept, yet: {counters}"
    );
    // It sticks: the next boot is B's again.
    let (_, _, shown) = pi.reboot_until((WELL, &[ROLLED_BACK]))?;
    ensure!(
        shown.contains("cyphonic: booting slot B (BOOT_ORDER B A, A 3 left, B 2 left)"),
        "the boot after the update was not slot B's:\n{shown}"
    );

    // A bundle whose adapter cannot start: into slot A, one try, rolled back.
    let shell = &pi.shell;
    shell.wait()?;
    shell.install(&broken, 'A')?;
    let (since, until_bad, _) = pi.reboot_until((ROLLED_BACK, &[KEPT]))?;
    // Then the old slot again, well.
    let after = usize::try_from(std::fs::metadata(&pi.console)?.len())?;
    let started = Instant::now();
    vm::wait_console(&mut pi.machine, (&pi.console, after), (WELL, &[KEPT]), BOOT)?;
    let rolled_back = until_bad + started.elapsed();
    let shown = vm::console_since(&pi.console, since);
    for (what, line) in [
        (
            "the bad slot's one try",
            "cyphonic: booting slot A (BOOT_ORDER A B, A 0 left, B 3 left)",
        ),
        (
            "the adapter's failure",
            "broken on purpose by the image check",
        ),
        ("the slot check's verdict", "the adapter cannot start"),
        (
            "the way back",
            "cyphonic: booting slot B (BOOT_ORDER B, A 0 left, B 2 left)",
        ),
    ] {
        ensure!(
            shown.contains(line),
            "no sign of {what} ({line:?}):\n{shown}"
        );
    }
    let shell = &pi.shell;
    shell.wait()?;
    let counters = shell.counters()?;
    ensure!(
        counters.contains("BOOT_ORDER=B ") && counters.contains("BOOT_A_LEFT=0"),
        "back on slot B, yet: {counters}"
    );
    let status = shell.run("rauc status")?;
    ensure!(status.contains("Booted from: rootfs.1 (B)"), "{status}");
    shell.wait_adapter()?;
    pi.device_pings_b()?;
    pi.off()?;
    Ok(Updates {
        install,
        kept,
        rolled_back,
    })
}

/// An update on a site without a cloud (the card's files, a static peer): its tunnel comes
/// up only with traffic, and none flows during the trial, yet the slot is kept (the route
/// to the static peer out of the uplink stands for reach); the device leased before then
/// pings the other site. Returns how long after the reboot the slot was kept.
///
/// # Errors
/// Any step failing, with the console or the box's answer in the message.
pub fn static_update_check(image: &Path, bundle: &Path) -> anyhow::Result<Duration> {
    let mut pi = Appliance::up(image, false)?;
    let (_, kept, _) = pi.update_kept(bundle)?;
    pi.device_pings_b()?;
    pi.off()?;
    Ok(kept)
}
