//! Other tunnels on the two-site bed, for the comparison the benchmarks make (issue 58):
//! wireguard-go, boringtun and nebula carry lanA's traffic to lanB in place of the adapters.
//! The kernel of each gateway namespace is the LAN's gateway ([`TwoSites::kernel_gateways`])
//! and routes the other LAN into the rival's TUN device; the rival seals it and sends it over
//! the same underlay the adapters use. Their programs are installed by `cargo xtask bench`
//! from the registries (Go's module proxy, crates.io) into the directory
//! `$CYPHONIC_RIVALS_DIR` names; `wg` (wireguard-tools) configures the two WireGuard ones.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail, ensure};

use crate::bed::{Site, TempDir, TwoSites, lan_prefix};
use crate::{Netns, Proc, wait_until};

/// A tunnel the benchmarks compare ours with, run with its defaults but for the MTU (1420
/// inside, as our adapters' DHCP hands out) and, for boringtun, its thread count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rival {
    /// `wireguard-go` (the module `golang.zx2c4.com/wireguard`): TUN offloads, UDP GSO/GRO.
    WireguardGo,
    /// Cloudflare's `boringtun-cli` with this many threads.
    Boringtun {
        /// `--threads`.
        threads: usize,
    },
    /// Slack's `nebula`, the LANs as its unsafe routes (one routine, its default).
    Nebula,
}

impl Rival {
    /// Every rival, in the order the tables show them.
    pub const ALL: [Self; 4] = [
        Self::WireguardGo,
        Self::Boringtun { threads: 1 },
        Self::Boringtun { threads: 4 },
        Self::Nebula,
    ];

    /// Its name in a table.
    pub fn name(self) -> String {
        match self {
            Self::WireguardGo => "wireguard-go".to_owned(),
            Self::Boringtun { threads: 1 } => "boringtun, 1 thread".to_owned(),
            Self::Boringtun { threads } => format!("boringtun, {threads} threads"),
            Self::Nebula => "nebula".to_owned(),
        }
    }
}

/// The programs the rivals run: `$CYPHONIC_RIVALS_DIR/{wireguard, boringtun-cli, nebula,
/// nebula-cert}`, and `wg` on the `PATH`.
#[derive(Debug, Clone)]
pub struct Tools {
    dir: PathBuf,
}

/// The programs [`Tools::find`] expects in its directory.
pub const PROGRAMS: [&str; 4] = ["wireguard", "boringtun-cli", "nebula", "nebula-cert"];

impl Tools {
    /// The directory `$CYPHONIC_RIVALS_DIR` names, holding every one of [`PROGRAMS`].
    ///
    /// # Errors
    /// The variable is not set, or a program (or `wg`) is missing.
    pub fn find() -> anyhow::Result<Self> {
        let dir = std::env::var_os("CYPHONIC_RIVALS_DIR")
            .map(PathBuf::from)
            .context(
                "CYPHONIC_RIVALS_DIR is not set: `cargo xtask bench --table rivals` installs the \
             rivals and sets it",
            )?;
        for p in PROGRAMS {
            ensure!(dir.join(p).is_file(), "no {p} in {}", dir.display());
        }
        crate::sh("wg", &["--version"]).context("wg (wireguard-tools) is missing")?;
        Ok(Self { dir })
    }

    fn program(&self, name: &str) -> anyhow::Result<String> {
        self.dir
            .join(name)
            .to_str()
            .map(str::to_owned)
            .context("program path")
    }
}

/// A rival carrying the bed's traffic: its two daemons (ended by PID when dropped) and their
/// scratch directory (keys, configurations, logs).
#[derive(Debug)]
pub struct Carrying {
    daemons: [Proc; 2],
    scratch: TempDir,
}

impl Carrying {
    /// The PID of site A's daemon, whose CPU the benchmarks count.
    pub fn pid_a(&self) -> u32 {
        self.daemons[0].pid()
    }

    /// The PID of site B's daemon.
    pub fn pid_b(&self) -> u32 {
        self.daemons[1].pid()
    }

    /// Both daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        ["a", "b"]
            .iter()
            .map(|s| {
                let log = std::fs::read_to_string(self.scratch.path().join(format!("{s}.log")));
                format!("--- rival {s} ---\n{}\n", log.unwrap_or_default())
            })
            .collect()
    }
}

/// The tunnel device's name at a site: distinct per site because the WireGuard daemons'
/// control sockets (`/var/run/wireguard/<name>.sock`) share one file system.
const DEVICES: [&str; 2] = ["rival-a", "rival-b"];
/// The rivals' overlay addresses (their tunnel devices), A's and B's.
const OVERLAY: [&str; 2] = ["100.64.0.1", "100.64.0.2"];
/// The UDP port every rival listens on.
const PORT: u16 = 51820;
/// The tunnel's MTU: the adapters' inner MTU.
const MTU: &str = "1420";

/// Makes `rival` carry the bed's traffic between the LANs: the gateways' kernels route each
/// LAN into the rival's device, the bed's routers carry only its datagrams. The bed must be
/// new ([`TwoSites::new`]), its adapters not started.
///
/// # Errors
/// A program is missing or fails, or a daemon does not come up.
pub fn carry(bed: &TwoSites, rival: Rival, tools: &Tools) -> anyhow::Result<Carrying> {
    bed.kernel_gateways()?;
    let scratch = TempDir::new("rival")?;
    let sites = [&bed.a, &bed.b];
    let daemons = match rival {
        Rival::WireguardGo | Rival::Boringtun { .. } => wireguard(&sites, rival, tools, &scratch)?,
        Rival::Nebula => nebula(&sites, tools, &scratch)?,
    };
    let daemons = <[Proc; 2]>::try_from(daemons)
        .map_err(|d| anyhow::anyhow!("{} daemons started, not two", d.len()))?;
    let carrying = Carrying { daemons, scratch };
    // Nebula brings its device up with its certificate's address and routes its unsafe
    // networks itself; the WireGuard ones leave that to us.
    if rival == Rival::Nebula {
        return Ok(carrying);
    }
    for (i, (me, other)) in [(&bed.a, &bed.b), (&bed.b, &bed.a)].into_iter().enumerate() {
        let dev = DEVICES[i];
        let ns = &me.adapter_ns;
        ns.ip(&["link", "set", dev, "mtu", MTU, "up"])
            .and_then(|_| ns.ip(&["addr", "add", &format!("{}/24", OVERLAY[i]), "dev", dev]))
            .and_then(|_| ns.ip(&["route", "add", &lan_prefix(other), "dev", dev]))
            .with_context(|| carrying.logs())?;
    }
    Ok(carrying)
}

/// Starts `program args` in `ns`, its output in `dir/<log>.log`, until `dev` exists.
fn start(
    ns: &Netns,
    program: &str,
    args: &[&str],
    dir: &Path,
    log: &str,
    dev: &str,
) -> anyhow::Result<Proc> {
    ns.daemon(
        Path::new(program),
        args,
        &dir.join(format!("{log}.log")),
        || ns.ip(&["link", "show", dev]).is_ok(),
    )
}

/// A key pair from `wg genkey` and `wg pubkey`: the private key's file, the public key.
fn wg_keys(dir: &Path, name: &str) -> anyhow::Result<(PathBuf, String)> {
    let private = crate::sh("wg", &["genkey"])?;
    let file = dir.join(format!("{name}.key"));
    std::fs::write(&file, &private)?;
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting wg pubkey")?;
    child
        .stdin
        .take()
        .context("wg pubkey's stdin")?
        .write_all(private.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "wg pubkey failed");
    Ok((file, String::from_utf8(out.stdout)?.trim().to_owned()))
}

/// wireguard-go or boringtun at both sites, each the other's one peer, configured by `wg`.
fn wireguard(
    sites: &[&Site; 2],
    rival: Rival,
    tools: &Tools,
    dir: &TempDir,
) -> anyhow::Result<Vec<Proc>> {
    let keys = [wg_keys(dir.path(), "a")?, wg_keys(dir.path(), "b")?];
    let mut daemons = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        let dev = DEVICES[i];
        // A socket of an earlier run's daemon that did not remove it.
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{dev}.sock"));
        let log = ["a", "b"][i];
        let daemon = match rival {
            Rival::WireguardGo => start(
                &site.adapter_ns,
                &tools.program("wireguard")?,
                &["-f", dev],
                dir.path(),
                log,
                dev,
            )?,
            Rival::Boringtun { threads } => {
                let log_file = dir.path().join(format!("{log}.boringtun.log"));
                start(
                    &site.adapter_ns,
                    &tools.program("boringtun-cli")?,
                    &[
                        dev,
                        "--foreground",
                        "--disable-drop-privileges",
                        "--threads",
                        &threads.to_string(),
                        "--log",
                        log_file.to_str().context("path")?,
                    ],
                    dir.path(),
                    log,
                    dev,
                )?
            }
            Rival::Nebula => bail!("nebula is no WireGuard"),
        };
        daemons.push(daemon);
        let other = sites[1 - i];
        let allowed = format!("{},{}/32", lan_prefix(other), OVERLAY[1 - i]);
        let endpoint = format!("{}:{PORT}", other.underlay);
        site.adapter_ns.exec(
            "wg",
            &[
                "set",
                dev,
                "private-key",
                keys[i].0.to_str().context("path")?,
                "listen-port",
                &PORT.to_string(),
                "peer",
                &keys[1 - i].1,
                "allowed-ips",
                &allowed,
                "endpoint",
                &endpoint,
            ],
        )?;
    }
    Ok(daemons)
}

/// Nebula at both sites: a CA of its own, each site's certificate carrying its LAN as an
/// unsafe network, each the other's static host (no lighthouse), every flow allowed.
fn nebula(sites: &[&Site; 2], tools: &Tools, dir: &TempDir) -> anyhow::Result<Vec<Proc>> {
    let cert = tools.program("nebula-cert")?;
    let path = |name: &str| -> anyhow::Result<String> {
        dir.path()
            .join(name)
            .to_str()
            .map(str::to_owned)
            .context("path")
    };
    crate::sh(
        &cert,
        &[
            "ca",
            "-name",
            "bench",
            "-out-crt",
            &path("ca.crt")?,
            "-out-key",
            &path("ca.key")?,
        ],
    )?;
    let mut daemons = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        let name = ["a", "b"][i];
        crate::sh(
            &cert,
            &[
                "sign",
                "-ca-crt",
                &path("ca.crt")?,
                "-ca-key",
                &path("ca.key")?,
                "-name",
                name,
                "-networks",
                &format!("{}/24", OVERLAY[i]),
                "-unsafe-networks",
                &lan_prefix(site),
                "-out-crt",
                &path(&format!("{name}.crt"))?,
                "-out-key",
                &path(&format!("{name}.key"))?,
            ],
        )?;
        let other = sites[1 - i];
        let mut config = String::new();
        let _ = write!(
            config,
            "pki:\n  ca: {ca}\n  cert: {crt}\n  key: {key}\n\
             static_host_map:\n  \"{peer}\": [\"{endpoint}:{PORT}\"]\n\
             lighthouse:\n  am_lighthouse: false\n  hosts: []\n\
             listen:\n  host: 0.0.0.0\n  port: {PORT}\n\
             punchy:\n  punch: false\n\
             tun:\n  dev: {dev}\n  mtu: {MTU}\n  unsafe_routes:\n    - route: {route}\n      via: {peer}\n\
             logging:\n  level: warning\n\
             firewall:\n  outbound:\n    - port: any\n      proto: any\n      host: any\n      local_cidr: any\n\
             \x20 inbound:\n    - port: any\n      proto: any\n      host: any\n      local_cidr: any\n",
            ca = path("ca.crt")?,
            crt = path(&format!("{name}.crt"))?,
            key = path(&format!("{name}.key"))?,
            peer = OVERLAY[1 - i],
            endpoint = other.underlay,
            dev = DEVICES[i],
            route = lan_prefix(other),
        );
        let file = path(&format!("{name}.yml"))?;
        std::fs::write(&file, config)?;
        daemons.push(start(
            &site.adapter_ns,
            &tools.program("nebula")?,
            &["-config", &file],
            dir.path(),
            name,
            DEVICES[i],
        )?);
    }
    Ok(daemons)
}

/// Waits up to 10 s for lanA's host to reach lanB's through the bed (a rival's handshake).
///
/// # Errors
/// No echo reply in time.
pub fn wait_carried(bed: &TwoSites) -> anyhow::Result<()> {
    let to = bed.b.host_ip.to_string();
    wait_until(
        std::time::Duration::from_secs(10),
        "lanB through the rival",
        || {
            bed.a
                .lan
                .exec_output("ping", &["-c", "1", "-W", "1", &to])
                .is_ok_and(|o| o.status.success())
        },
    )
}
