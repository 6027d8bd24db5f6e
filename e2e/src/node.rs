//! Nodes on the bed: hosts running `cyphonic-node`, with the cloud as their only way to find
//! peers. Node C sits on its own segment behind the router, optionally behind a NAT; the
//! many-peers benchmark plugs a fleet of nodes into a bridge on the router.
//!
//! ```text
//! [wan router] tonc 192.0.2.65/26 -- wan 192.0.2.66/26 [nodeC]           (no NAT)
//! [wan router] tonc 192.0.2.65/26 -- out 192.0.2.66/26 [natC] in -- wan 192.0.2.130/25 [nodeC]
//! nodeC: TUN cyo0 100.64.3.1/10, its DNS stub on 100.64.3.1:53 in its resolv.conf
//! ```

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::hosts::{Bins, CloudHost, Nat, nat_router};
use crate::{Netns, Proc, veth};

/// Node C's name.
pub const NAME: &str = "nodec.ovl.example";
/// Node C's vIP.
pub const VIP: Ipv4Addr = Ipv4Addr::new(100, 64, 3, 1);
/// The user (and group) id a node runs as without privileges: Debian's `nobody`/`nogroup`.
pub const NOBODY: u32 = 65534;

/// How a node's host is attached to the router.
#[derive(Debug, Clone)]
pub enum Attach {
    /// On its own segment (`tonc`, 192.0.2.64/26), behind a NAT of this kind or none.
    Own(Option<Nat>),
    /// A port of the bridge `bridge` in the router's namespace (192.0.2.64/26, the router at
    /// .65), at `address`; the port is called `port`.
    Bridge {
        /// The bridge.
        bridge: String,
        /// The port's name in the router's namespace.
        port: String,
        /// The node's address.
        address: Ipv4Addr,
    },
}

/// One node to build.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Its FQDN.
    pub name: String,
    /// Its certified block, and any more after it separated by spaces (an IPv6 /128, say);
    /// its vIP is the first block's first host address.
    pub block: String,
    /// How it is attached.
    pub attach: Attach,
}

impl NodeSpec {
    /// Node C, as the bed's option asks.
    pub fn c(nat: Option<Nat>) -> Self {
        Self {
            name: NAME.into(),
            block: "100.64.3.0/24".into(),
            attach: Attach::Own(nat),
        }
    }

    /// Its vIP.
    ///
    /// # Errors
    /// The block does not parse.
    pub fn vip(&self) -> anyhow::Result<Ipv4Addr> {
        let first = self.block.split_whitespace().next().unwrap_or_default();
        let net: ipnet::Ipv4Net = first.parse()?;
        Ok(Ipv4Addr::from(u32::from(net.network()) + 1))
    }
}

/// Node C.
#[derive(Debug)]
pub struct NodeHost {
    /// Its namespace.
    pub ns: Netns,
    /// The NAT in front of it, if any.
    pub nat: Option<Netns>,
    /// Its directory (configuration, key, certificates, log).
    pub dir: PathBuf,
    /// Its underlay address (its own, behind a NAT the private one).
    pub underlay: Ipv4Addr,
    /// Its vIP.
    pub vip: Ipv4Addr,
    /// The running `cyphonic-node`.
    pub proc: Option<Proc>,
}

impl NodeHost {
    /// Builds a node's host (and NAT), its certificate from the CA in `ca_dir`, and its
    /// configuration pointing at `cloud`. Not started.
    ///
    /// # Errors
    /// A setup step fails.
    pub fn new(
        wan: &Netns,
        bins: &Bins,
        ca_dir: &Path,
        tmp: &Path,
        cloud: &CloudHost,
        spec: &NodeSpec,
    ) -> anyhow::Result<Self> {
        let ns = Netns::new("node")?;
        let (underlay, nat_ns) = match &spec.attach {
            Attach::Own(None) => {
                veth(&ns, "wan", wan, "tonc")?;
                wan.ip(&["addr", "add", "192.0.2.65/26", "dev", "tonc"])?;
                ns.ip(&["addr", "add", "192.0.2.66/26", "dev", "wan"])?;
                ns.ip(&["route", "add", "default", "via", "192.0.2.65"])?;
                (Ipv4Addr::new(192, 0, 2, 66), None)
            }
            Attach::Own(Some(kind)) => {
                let nat = nat_router("C", wan, "tonc", &ns, "192.0.2.66/26", "192.0.2.65", *kind)?;
                wan.ip(&["addr", "add", "192.0.2.65/26", "dev", "tonc"])?;
                (Ipv4Addr::new(192, 0, 2, 130), Some(nat))
            }
            Attach::Bridge {
                bridge,
                port,
                address,
            } => {
                veth(&ns, "wan", wan, port)?;
                wan.ip(&["link", "set", "dev", port, "master", bridge])?;
                ns.ip(&["addr", "add", &format!("{address}/26"), "dev", "wan"])?;
                ns.ip(&["route", "add", "default", "via", "192.0.2.65"])?;
                (*address, None)
            }
        };
        let name = spec.name.as_str();
        let vip = spec.vip()?;
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(ca_dir.join("ca.crt"), dir.join("ca.crt"))?;
        crate::ca_issue(&bins.cloud, ca_dir, name, &spec.block, &dir)?;
        // The cloud's IPv4 address first, its IPv6 one for when the node has only IPv6 (a
        // laptop that roams onto an IPv6-only network).
        std::fs::write(
            dir.join("node.toml"),
            format!(
                "[node]\nstatus_socket = \"node.sock\"\n\n[identity]\ncertificate = \"{name}.crt\"\nkey = \"{name}.key\"\nca = \"ca.crt\"\n\n[cloud]\naddress = [\"{}\", \"{}\"]\npublic_key = \"{}\"\n",
                cloud.address, cloud.address6, cloud.public_key
            ),
        )?;
        // Names in the overlay through the node's stub (docs/operations.md shows the same for
        // a host with systemd-resolved).
        ns.set_resolv_conf(&format!("nameserver {vip}\n"))?;
        Ok(Self {
            ns,
            nat: nat_ns,
            dir,
            underlay,
            vip,
            proc: None,
        })
    }

    /// Its log file.
    pub fn log(&self) -> PathBuf {
        self.dir.join("node.log")
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// Its status socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("node.sock")
    }

    /// Starts `cyphonic-node run` and waits for its status socket.
    ///
    /// # Errors
    /// It exits or does not come up within 10 s (its log is in the error).
    pub fn start(&mut self, bins: &Bins) -> anyhow::Result<()> {
        let node = bins.node.to_str().context("path")?.to_owned();
        self.start_with(&[&node])
    }

    /// Starts `cyphonic-node run` as a user with no privileges at all (`nobody`, no
    /// capabilities, none to gain: `setpriv`), its directory handed to that user first, and
    /// waits for its status socket. Only `[userspace]` can run so.
    ///
    /// # Errors
    /// It exits or does not come up within 10 s (its log is in the error).
    pub fn start_unprivileged(&mut self, bins: &Bins) -> anyhow::Result<()> {
        let dir = self.dir.to_str().context("path")?;
        let out = std::process::Command::new("chown")
            .args(["-R", &format!("{NOBODY}:{NOBODY}"), dir])
            .output()?;
        if !out.status.success() {
            bail!("chown {dir}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let id = NOBODY.to_string();
        let (uid, gid) = (format!("--reuid={id}"), format!("--regid={id}"));
        let node = bins.node.to_str().context("path")?;
        self.start_with(&[
            "setpriv",
            &uid,
            &gid,
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
            node,
        ])
    }

    /// Starts `program` (with its leading arguments) `run --config ...`.
    fn start_with(&mut self, program: &[&str]) -> anyhow::Result<()> {
        let socket = self.socket();
        let _ = std::fs::remove_file(&socket);
        let config = self.dir.join("node.toml");
        let (first, lead) = program.split_first().context("no program")?;
        let mut args: Vec<&str> = lead.to_vec();
        args.extend(["run", "--config", config.to_str().context("path")?]);
        self.proc = Some(
            self.ns
                .daemon(Path::new(first), &args, &self.log(), || socket.exists())?,
        );
        Ok(())
    }

    /// Stops it with `signal` and waits.
    ///
    /// # Errors
    /// It was not running or did not stop.
    pub fn stop(&mut self, signal: &str) -> anyhow::Result<()> {
        let p = self.proc.take().context("node C is not running")?;
        p.stop(signal, Duration::from_secs(10))?;
        Ok(())
    }

    /// The running node's status document.
    ///
    /// # Errors
    /// `cyphonic-node status` fails.
    pub fn status(&self, bins: &Bins) -> anyhow::Result<Value> {
        let out = std::process::Command::new(&bins.node)
            .args([
                "status",
                "--json",
                "--socket",
                self.socket().to_str().context("path")?,
            ])
            .output()?;
        if !out.status.success() {
            bail!("status failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}
