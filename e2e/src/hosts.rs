//! The hosts a test bed is made of, apart from its sites: where the binaries are, scratch
//! directories, the cloud's host, NAT routers. A leaf of the bed: the two-site bed
//! (`bed.rs`) and node hosts (`node.rs`) both build on it.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::{Netns, Proc, unique, veth};

/// Where the binaries under test are.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `cyphonic-adapter`.
    pub adapter: PathBuf,
    /// `cyphonic-cloud`.
    pub cloud: PathBuf,
    /// `cyphonic-node`.
    pub node: PathBuf,
}

/// `$var`, or what `beside` makes of the directory this test binary was built into
/// (`target/<profile>`).
fn bin_dir(var: &str, beside: impl FnOnce(&Path) -> PathBuf) -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os(var) {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> -> target/<profile>
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("cannot find the target directory")?;
    Ok(beside(profile))
}

impl Bins {
    /// `$CYPHONIC_BIN_DIR`, or the target directory this test binary was built into.
    ///
    /// # Errors
    /// The binaries are not built.
    pub fn find() -> anyhow::Result<Self> {
        Self::at(&bin_dir("CYPHONIC_BIN_DIR", Path::to_owned)?)
    }

    /// The release before's binaries (e2e/tests/releases.rs): `$CYPHONIC_PREVIOUS_BIN_DIR`,
    /// or `previous/bin` in the target directory this test binary was built into, where
    /// `cargo xtask test` (and `cargo xtask previous`) builds them.
    ///
    /// # Errors
    /// They are not built.
    pub fn previous() -> anyhow::Result<Self> {
        let dir = bin_dir("CYPHONIC_PREVIOUS_BIN_DIR", |profile| {
            profile.with_file_name("previous").join("bin")
        })?;
        Self::at(&dir).context("the release before is built by `cargo xtask previous`")
    }

    /// The three binaries in `dir`.
    ///
    /// # Errors
    /// One of them is not there.
    pub fn at(dir: &Path) -> anyhow::Result<Self> {
        let bins = Self {
            adapter: dir.join("cyphonic-adapter"),
            cloud: dir.join("cyphonic-cloud"),
            node: dir.join("cyphonic-node"),
        };
        for b in [&bins.adapter, &bins.cloud, &bins.node] {
            if !b.exists() {
                bail!(
                    "{} is not built; run `cargo xtask test` (or `cargo build -p cyphonic-adapter -p cyphonic-cloud -p cyphonic-node`)",
                    b.display()
                );
            }
        }
        Ok(bins)
    }
}

/// A directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory under the system's temporary directory.
    ///
    /// # Errors
    /// It cannot be created.
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(unique(&format!("cyphonic-{prefix}-")));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How the NAT in front of adapter B maps addresses (nftables masquerade).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nat {
    /// Keeps the source port when it can, one mapping per source (cone-like).
    PortPreserving,
    /// A random port for every new destination (`fully-random`): a symmetric NAT.
    Symmetric,
}

/// The cloud's host, dual-stack: `[wan router] toc 192.0.2.1/26 fd00:192:0:2::1/64 -- wan
/// 192.0.2.10/26 fd00:192:0:2::10/64 [cloud]`.
#[derive(Debug)]
pub struct CloudHost {
    /// Its namespace.
    pub ns: Netns,
    /// Its directory (configuration, key, CA certificate, database, log).
    pub dir: PathBuf,
    /// NMS's control address.
    pub address: SocketAddr,
    /// NMS's control address over IPv6.
    pub address6: SocketAddr,
    /// The cloud's public key, as the adapters pin it.
    pub public_key: String,
    /// The running `cyphonic-cloud serve`.
    pub proc: Option<Proc>,
}

impl CloudHost {
    const IP: [u8; 4] = [192, 0, 2, 10];

    /// The cloud's host behind the router `wan` (its port `toc`), with its key, the CA of
    /// `ca_dir` and a configuration with `extra` lines (not started).
    pub(crate) fn new(
        wan: &Netns,
        bins: &Bins,
        ca_dir: &Path,
        tmp: &Path,
        extra: &str,
    ) -> anyhow::Result<Self> {
        let ns = Netns::new("cloud")?;
        veth(&ns, "wan", wan, "toc")?;
        // 192.0.2.0/26; node C's segment is 192.0.2.64/26, and the upper half is the private
        // side of a NAT (`nat_router`).
        wan.ip(&["addr", "add", "192.0.2.1/26", "dev", "toc"])?;
        ns.ip(&["addr", "add", "192.0.2.10/26", "dev", "wan"])?;
        ns.ip(&["route", "add", "default", "via", "192.0.2.1"])?;
        wan.ip(&[
            "-6",
            "addr",
            "add",
            "fd00:192:0:2::1/64",
            "dev",
            "toc",
            "nodad",
        ])?;
        ns.ip(&[
            "-6",
            "addr",
            "add",
            "fd00:192:0:2::10/64",
            "dev",
            "wan",
            "nodad",
        ])?;
        ns.ip(&["-6", "route", "add", "default", "via", "fd00:192:0:2::1"])?;
        let dir = tmp.join("cloud");
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(ca_dir.join("ca.crt"), dir.join("ca.crt"))?;
        let key = dir.join("cloud.key");
        let out = Command::new(&bins.cloud)
            .args(["keygen", "--out", key.to_str().context("path")?])
            .output()?;
        if !out.status.success() {
            bail!("keygen: {}", String::from_utf8_lossy(&out.stderr));
        }
        let public_key = String::from_utf8(out.stdout)?.trim().to_owned();
        std::fs::write(
            dir.join("cloud.toml"),
            // Top-level keys first: `extra` may open a table.
            format!(
                "listen = \"[::]:7000\"\nprobe_listen = \"[::]:7001\"\nprobe_listen_alt = \"[::]:7002\"\nkey = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\nstatus_socket = \"cloud.sock\"\n{extra}"
            ),
        )?;
        Ok(Self {
            ns,
            dir,
            address: SocketAddr::from((Self::IP, 7000)),
            address6: "[fd00:192:0:2::10]:7000".parse()?,
            public_key,
            proc: None,
        })
    }

    /// The cloud's log.
    pub fn log(&self) -> PathBuf {
        self.dir.join("cloud.log")
    }

    /// The running cloud's status document.
    ///
    /// # Errors
    /// `cyphonic-cloud status` fails.
    pub fn status(&self, bins: &Bins) -> anyhow::Result<Value> {
        let out = Command::new(&bins.cloud)
            .args([
                "status",
                "--json",
                "--socket",
                self.dir.join("cloud.sock").to_str().context("path")?,
            ])
            .output()?;
        if !out.status.success() {
            bail!("status failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Starts `cyphonic-cloud serve` and waits until it accepts connections.
    ///
    /// # Errors
    /// It exits or does not listen within 10 s (its log is in the error).
    pub fn start(&mut self, bins: &Bins) -> anyhow::Result<()> {
        let config = self.dir.join("cloud.toml");
        let log = self.log();
        let ready =
            || std::fs::read_to_string(&log).is_ok_and(|t| t.contains("cyphonic-cloud serving"));
        self.proc = Some(self.ns.daemon(
            &bins.cloud,
            &["serve", "--config", config.to_str().context("path")?],
            &self.log(),
            ready,
        )?);
        Ok(())
    }

    /// Moves the cloud onto the shared store at `database` (a PostgreSQL URL), its instance
    /// listening on `first` only, and starts a second instance on `second` (added to the
    /// cloud's interface with that prefix length): the same key, CA and database, its own
    /// address, relay ports, status socket and log (in `dir/two`). The first instance is
    /// (re)started; the second is returned.
    ///
    /// # Errors
    /// The configuration is not of the shape `CloudHost::new` writes, or an instance
    /// does not start.
    pub fn two_instances(
        &mut self,
        bins: &Bins,
        database: &str,
        (first, (second, prefix)): (IpAddr, (IpAddr, u8)),
    ) -> anyhow::Result<Proc> {
        if self.proc.is_some() {
            self.stop("TERM")?;
        }
        let host = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let path = self.dir.join("cloud.toml");
        let text = std::fs::read_to_string(&path)?;
        let one = text
            .replace(
                "database = \"sqlite://cloud.db\"",
                &format!("database = \"{database}\""),
            )
            .replace("\"[::]:700", &format!("\"{}:700", host(first)));
        if one == text {
            bail!("the cloud's configuration is not of the shape CloudHost::new writes");
        }
        std::fs::write(&path, &one)?;
        let dir2 = self.dir.join("two");
        std::fs::create_dir_all(&dir2)?;
        for f in ["cloud.key", "ca.crt"] {
            std::fs::copy(self.dir.join(f), dir2.join(f))?;
        }
        std::fs::write(
            dir2.join("cloud.toml"),
            format!(
                "{}\n[relay]\nports = \"51000-51099\"\n",
                one.replace(&format!("{}:", host(first)), &format!("{}:", host(second)))
            ),
        )?;
        let address = format!("{second}/{prefix}");
        if second.is_ipv4() {
            self.ns.ip(&["addr", "add", &address, "dev", "wan"])?;
        } else {
            self.ns
                .ip(&["-6", "addr", "add", &address, "dev", "wan", "nodad"])?;
        }
        self.start(bins)?;
        let log2 = dir2.join("cloud.log");
        let config2 = dir2.join("cloud.toml");
        self.ns.daemon(
            &bins.cloud,
            &["serve", "--config", config2.to_str().context("path")?],
            &log2,
            || std::fs::read_to_string(&log2).is_ok_and(|t| t.contains("cyphonic-cloud serving")),
        )
    }

    /// Stops it with `signal` and waits.
    ///
    /// # Errors
    /// It was not running or did not stop.
    pub fn stop(&mut self, signal: &str) -> anyhow::Result<()> {
        let p = self.proc.take().context("the cloud is not running")?;
        p.stop(signal, Duration::from_secs(10))?;
        Ok(())
    }
}

/// A NAT router between a host and the router: `[host] wan 192.0.2.130/25 -- in
/// 192.0.2.129/25 [natX] out <public> -- <wan_if> [wan router]`, masquerading what leaves by
/// `out`.
pub fn nat_router(
    label: &str,
    wan: &Netns,
    wan_if: &str,
    adapter_ns: &Netns,
    public: &str,
    router: &str,
    kind: Nat,
) -> anyhow::Result<Netns> {
    let ns = Netns::new(&format!("nat{label}"))?;
    veth(&ns, "out", wan, wan_if)?;
    ns.ip(&["addr", "add", public, "dev", "out"])?;
    ns.ip(&["route", "add", "default", "via", router])?;
    veth(adapter_ns, "wan", &ns, "in")?;
    ns.ip(&["addr", "add", "192.0.2.129/25", "dev", "in"])?;
    adapter_ns.ip(&["addr", "add", "192.0.2.130/25", "dev", "wan"])?;
    adapter_ns.ip(&["route", "add", "default", "via", "192.0.2.129"])?;
    ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    ns.exec("nft", &["add", "table", "ip", "nat"])?;
    ns.exec(
        "nft",
        &["add chain ip nat post { type nat hook postrouting priority 100 ; }"],
    )?;
    let mut rule = vec![
        "add",
        "rule",
        "ip",
        "nat",
        "post",
        "oifname",
        "out",
        // What the router sends itself leaves as it is (a port mapping service's STUN).
        "ip",
        "saddr",
        "192.0.2.128/25",
        "masquerade",
    ];
    if kind == Nat::Symmetric {
        rule.push("fully-random");
    }
    ns.exec("nft", &rule)?;
    Ok(ns)
}

/// What a NAT router's port mapping service (miniupnpd, Debian's, nftables backend) speaks,
/// and whether it grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingRouter {
    /// PCP and NAT-PMP (`enable_natpmp`).
    pub pcp: bool,
    /// UPnP-IGD (`enable_upnp`).
    pub upnp: bool,
    /// Whether its rules let the NAT's inside ask (otherwise every request is refused).
    pub allow: bool,
    /// The longest lifetime it grants a PCP or NAT-PMP mapping, seconds (renewals come at
    /// half of it).
    pub max_lifetime: u32,
}

/// A STUN server answering Binding requests with the address they came from, in Python:
/// miniupnpd asks one for its own public address (`ext_perform_stun`), and forwards
/// nothing when its outside address is in a reserved range (the documentation ranges of
/// this bed are) unless STUN shows it is not behind another NAT. It answers every request,
/// CHANGE-REQUEST or not, from its one socket: no filter stands before the router's
/// outside, which is what miniupnpd concludes.
const STUN: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 3478))
print("stun ready", flush=True)
cookie = b"\x21\x12\xa4\x42"
while True:
    d, (ip, port) = s.recvfrom(2048)
    if len(d) < 20 or d[0:2] != b"\x00\x01" or d[4:8] != cookie:
        continue
    xip = bytes(a ^ b for a, b in zip(socket.inet_aton(ip), cookie))
    attr = struct.pack("!HHBBH4s", 0x0020, 8, 0, 1, port ^ 0x2112, xip)
    s.sendto(struct.pack("!HH", 0x0101, len(attr)) + d[4:20] + attr, (ip, port))
"#;

/// Runs a port mapping service on the NAT router `nat` (made by [`nat_router`]): a STUN
/// server in `wan` on the router's next hop `router` (an address of `wan`), and miniupnpd on
/// the NAT, its files in `dir`. Returns both processes (ended when dropped).
///
/// # Errors
/// A program does not start or is not ready.
pub fn port_mapper(
    nat: &Netns,
    wan: &Netns,
    router: &str,
    dir: &Path,
    opts: MappingRouter,
) -> anyhow::Result<[Proc; 2]> {
    let stun_log = dir.join("stun.log");
    let stun = wan.daemon(
        Path::new("python3"),
        &["-c", STUN, router],
        &stun_log,
        || std::fs::read_to_string(&stun_log).is_ok_and(|t| t.contains("stun ready")),
    )?;
    // The chains miniupnpd fills (its nft_init.sh, here: Debian's calls a script it does not
    // ship); forwarding stays open as the NAT's was.
    nat.exec(
        "nft",
        &["add table inet filter
           add chain inet filter forward { type filter hook forward priority 0 ; policy accept ; }
           add chain inet filter miniupnpd
           add rule inet filter forward jump miniupnpd
           add chain inet filter prerouting { type nat hook prerouting priority -100 ; policy accept ; }
           add chain inet filter prerouting_miniupnpd
           add rule inet filter prerouting jump prerouting_miniupnpd
           add chain inet filter postrouting { type nat hook postrouting priority 100 ; policy accept ; }
           add chain inet filter postrouting_miniupnpd
           add rule inet filter postrouting jump postrouting_miniupnpd"],
    )?;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let rule = if opts.allow { "allow" } else { "deny" };
    let config = format!(
        "ext_ifname=out\nlistening_ip=in\nhttp_port=0\nenable_natpmp={}\nenable_upnp={}\n\
         ext_perform_stun=yes\next_stun_host={router}\next_stun_port=3478\n\
         secure_mode=yes\nsystem_uptime=yes\nmin_lifetime=10\nmax_lifetime={}\n\
         lease_file={}\nuuid=3a7b5c1e-0000-4000-8000-00000000cafe\n\
         {rule} 1024-65535 192.0.2.128/25 1024-65535\ndeny 0-65535 0.0.0.0/0 0-65535\n",
        yes(opts.pcp),
        yes(opts.upnp),
        opts.max_lifetime,
        dir.join("upnp.leases").display(),
    );
    let conf = dir.join("miniupnpd.conf");
    std::fs::write(&conf, config)?;
    let log = dir.join("miniupnpd.log");
    let pid = dir.join("miniupnpd.pid");
    let upnpd = nat.daemon(
        Path::new("miniupnpd"),
        &[
            "-d",
            "-f",
            conf.to_str().context("path")?,
            "-P",
            pid.to_str().context("path")?,
        ],
        &log,
        || {
            std::fs::read_to_string(&log).is_ok_and(|t| {
                t.contains("STUN: ... done") || t.contains("is now behind unrestricted")
            })
        },
    )?;
    Ok([stun, upnpd])
}

/// The port mappings miniupnpd made on `nat`: its DNAT rules (`nft list chain`), one line each.
///
/// # Errors
/// `nft` fails.
pub fn port_mappings(nat: &Netns) -> anyhow::Result<Vec<String>> {
    let text = nat.exec(
        "nft",
        &["list", "chain", "inet", "filter", "prerouting_miniupnpd"],
    )?;
    Ok(text
        .lines()
        .filter(|l| l.contains("dnat"))
        .map(|l| l.trim().to_owned())
        .collect())
}

/// A MAC written `aa:bb:cc:dd:ee:ff`, as `ip` and the status documents write it.
///
/// # Errors
/// Not six hexadecimal bytes separated by colons.
pub fn parse_mac(text: &str) -> anyhow::Result<[u8; 6]> {
    let bytes = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<Vec<u8>, _>>()
        .with_context(|| format!("{text:?} is not a MAC"))?;
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("{text:?} is not six bytes"))
}

/// The MAC of `iface` in `ns` (`aa:bb:...`).
///
/// # Errors
/// `ip` fails or shows no MAC.
pub fn mac_of(ns: &Netns, iface: &str) -> anyhow::Result<String> {
    let link = ns.ip(&["-o", "link", "show", "dev", iface])?;
    Ok(link
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .context("no MAC")?
        .to_owned())
}

#[cfg(test)]
mod tests {
    use super::parse_mac;

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(
            parse_mac("02:aa:0b:C0:00:ff").unwrap(),
            [0x02, 0xaa, 0x0b, 0xc0, 0x00, 0xff]
        );
        for bad in [
            "",
            "02:aa:0b:c0:00",
            "02:aa:0b:c0:00:ff:01",
            "02:aa:0b:c0:00:gg",
            "02aa0bc000ff",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad:?}");
        }
    }
}
