//! The two-site test bed, with the real binaries:
//!
//! ```text
//! [lanA] eth0 -- lan [adapterA] wan -- toa [wan router] tob -- wan [adapterB] lan -- eth0 [lanB]
//!  100.64.1.10/24      198.51.100.2    198.51.100.1  203.0.113.1   203.0.113.2      100.64.2.10/24
//!  gateway 100.64.1.1 (adapterA's vIP)                                 gateway 100.64.2.1
//! ```
//!
//! Certificates come from `cyphonic-cloud ca`, configurations are written like an operator
//! would, adapters run as `cyphonic-adapter run`. Everything is removed on drop.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

pub use crate::hosts::{
    Bins, CloudHost, MappingRouter, Nat, TempDir, mac_of, parse_mac, port_mappings,
};
use crate::hosts::{nat_router, port_mapper};
use crate::impair::{ImpairedLink, Impairment};
use crate::{Netns, Proc, sh, unique, veth};

/// The two sites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Site A (lanA, adapterA).
    A,
    /// Site B (lanB, adapterB).
    B,
}

/// How to build one site.
#[derive(Debug, Clone, Default)]
pub struct SiteOptions {
    /// Put the adapter behind a NAT router of this kind (its own address 192.0.2.130, the
    /// NAT's public one the site's usual address).
    pub nat: Option<Nat>,
    /// Give the adapter an IPv6 underlay only (the site's network spelt into fd00::/16): the
    /// cloud, dual-stack, is then the only place where it meets an IPv4-only site.
    pub v6_only: bool,
    /// Give the adapter (without NAT) an IPv6 address besides its IPv4 one, the site's network
    /// spelt into fd00::/16 as for `v6_only`, and register it with the cloud
    /// (`[cloud] endpoints`).
    pub dual_stack: bool,
    /// Extra configuration for the adapter (whole tables such as `[dhcp]`, appended).
    pub extra: String,
    /// Revoke the adapter's certificate at the CA before the cloud starts (the cloud reads
    /// the CA's `revoked.txt` as `revocations`).
    pub revoked: bool,
    /// Carry the adapter's underlay link to the router through an impaired link (loss,
    /// delay, jitter, reordering as netem would; [`ImpairedLink`]). Not behind a NAT.
    pub impair: Option<Impairment>,
    /// Run a port mapping service (miniupnpd) on the NAT router (with `nat` only).
    pub mapping: Option<MappingRouter>,
    /// Run this `cyphonic-adapter` instead of the one under test: a member of another
    /// release ([`crate::hosts::Bins::previous`]).
    pub program: Option<PathBuf>,
}

/// The cloud of a bed: `cyphonic-cloud serve` on its own host behind the router
/// (192.0.2.10); the adapters get no static peers and find each other through it.
#[derive(Debug, Clone, Default)]
pub struct CloudOptions {
    /// Extra lines for its configuration (`[policy]`, say).
    pub extra: String,
    /// Carry relay channels over TCP too, in TLS on port 443 (`[relay] stream_listen`, with
    /// a self-signed certificate): `extra` then holds no `[relay]` table.
    pub relay_stream: bool,
    /// Enroll online: the root delegates to an issuing CA for [`ENROLL_POOL`] and
    /// [`ENROLL_POOL6`] (`ca delegate`), which the cloud's `[enroll]` names, with certificates of this many
    /// seconds.
    pub enroll: Option<u64>,
    /// Serve with this `cyphonic-cloud` instead of the one under test (a cloud of another
    /// release); the CA's commands stay the tested one's.
    pub program: Option<PathBuf>,
}

/// The blocks the cloud's issuing CA hands out, with [`CloudOptions::enroll`].
pub const ENROLL_POOL: &str = "100.64.128.0/17";

/// The overlay's IPv6 range, the root's block beside 100.64.0.0/10.
pub const OVERLAY6: &str = "fd7a:0:1::/48";

/// The IPv6 half of what the issuing CA hands out, with [`CloudOptions::enroll`].
pub const ENROLL_POOL6: &str = "fd7a:0:1:8000::/49";

/// How to build the bed.
#[derive(Debug, Clone)]
pub struct BedOptions {
    /// Site A.
    pub a: SiteOptions,
    /// Site B.
    pub b: SiteOptions,
    /// The cloud; without one the adapters are each other's static peers.
    pub cloud: Option<CloudOptions>,
    /// `dataplane.ordering` of both adapters.
    pub ordering: bool,
    /// Extra lines for both adapters' `[dataplane]` section.
    pub dataplane_extra: String,
    /// Peers' persistent keepalive, seconds (0 = off).
    pub persistent_keepalive: u64,
    /// Make the LAN hosts' veths behave like a wire (TSO and GSO off), as a real NIC would
    /// segment before the wire.
    pub wire_like_lan: bool,
    /// Also switch transmit checksum offload off on the LAN hosts (no partial checksums).
    pub lan_tx_checksum_off: bool,
    /// GRO on on the gateways' LAN side: the bed switches it on on their LAN veths and the
    /// adapters run with `lan_gro = true` (they take coalesced frames and cut them back into
    /// segments); plain routing keeps it on. Off: the adapters run with `lan_gro = false`
    /// and switch GRO off themselves; plain routing turns it off too.
    pub lan_gro: bool,
    /// Put a switch (a bridge in a namespace of its own) on each LAN, so that more hosts can
    /// join it with [`TwoSites::add_host`]. Off for the benchmarks: a bridge costs a little.
    pub lan_switch: bool,
    /// The router drops UDP between the two sites' underlay networks: only the cloud (and its
    /// relay) reach both. Hole punching has no chance.
    pub block_direct: bool,
    /// Add node C, a host running `cyphonic-node`, on its own segment behind the router
    /// (192.0.2.66), or behind a NAT of this kind. Needs the cloud.
    pub node_c: Option<Option<Nat>>,
    /// The adapters' certificates hold an IPv6 /56 beside their IPv4 block ([`SITE6`]):
    /// their LANs have IPv6 (docs/protocol.md §7).
    pub ipv6: bool,
}

/// The sites' IPv6 blocks, with [`BedOptions::ipv6`]: each LAN's /64 is the first of its.
pub const SITE6: [&str; 2] = ["fd7a:0:1:100::/56", "fd7a:0:1:200::/56"];

impl Default for BedOptions {
    fn default() -> Self {
        Self {
            a: SiteOptions::default(),
            b: SiteOptions::default(),
            cloud: None,
            ordering: true,
            dataplane_extra: String::new(),
            persistent_keepalive: 0,
            wire_like_lan: true,
            lan_tx_checksum_off: false,
            lan_gro: true,
            lan_switch: false,
            block_direct: false,
            node_c: None,
            ipv6: false,
        }
    }
}

impl BedOptions {
    /// The options of `side`.
    pub const fn site(&self, side: Side) -> &SiteOptions {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }
}

/// One site: its LAN host, its adapter.
#[derive(Debug)]
pub struct Site {
    /// The port mapping service on the NAT router, if any: the STUN server it asks, and
    /// miniupnpd (ended before the namespaces go).
    pub mapper: Option<[Proc; 2]>,
    /// The NAT router in front of the adapter, if any.
    pub nat: Option<Netns>,
    /// The LAN host (a "general node").
    pub lan: Netns,
    /// The adapter's namespace.
    pub adapter_ns: Netns,
    /// The adapter's configuration directory.
    pub dir: PathBuf,
    /// The LAN host's address.
    pub host_ip: Ipv4Addr,
    /// The LAN host's MAC.
    pub host_mac: String,
    /// The gateway vIP.
    pub gateway: Ipv4Addr,
    /// The adapter's underlay address.
    pub underlay: IpAddr,
    /// The running adapter.
    pub adapter: Option<Proc>,
    /// The adapter program it runs when not the one under test ([`SiteOptions::program`]).
    pub program: Option<PathBuf>,
    /// The LAN switch, with the options' `lan_switch`.
    pub switch: Option<Netns>,
    /// The impaired link between the adapter and the router, with the site's `impair`.
    pub link: Option<ImpairedLink>,
    ports: u32,
}

impl Site {
    /// The adapter's configuration file.
    pub fn config(&self) -> PathBuf {
        self.dir.join("adapter.toml")
    }

    /// The adapter's status socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("adapter.sock")
    }

    /// Where the adapter's tunnel socket is reached: its underlay address, the port of the
    /// configurations the bed writes. The other site's static peer endpoint.
    pub fn endpoint(&self) -> SocketAddr {
        SocketAddr::from((self.underlay, 51820))
    }

    /// The adapter's log file.
    pub fn log(&self) -> PathBuf {
        self.dir.join("adapter.log")
    }

    /// The adapter's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// The adapter's saved DHCP leases.
    pub fn lease_file(&self) -> PathBuf {
        self.dir.join("state/leases.json")
    }

    /// The LAN switch's port the last host plugged into it hangs on (`p0` is the adapter's).
    pub fn last_port(&self) -> String {
        format!("p{}", self.ports.saturating_sub(1))
    }
}

/// The status document of the adapter whose status socket is `socket`.
///
/// # Errors
/// `cyphonic-adapter status` fails (the adapter does not run, or has no such socket).
pub fn adapter_status(bins: &Bins, socket: &Path) -> anyhow::Result<Value> {
    let out = Command::new(&bins.adapter)
        .args([
            "status",
            "--json",
            "--socket",
            socket.to_str().context("path")?,
        ])
        .output()?;
    if !out.status.success() {
        bail!("status failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Plugs `ns`'s interface `ns_if` into the next port of `switch`.
fn plug(switch: &Netns, ports: &mut u32, ns: &Netns, ns_if: &str) -> anyhow::Result<()> {
    let port = format!("p{ports}");
    *ports += 1;
    veth(ns, ns_if, switch, &port)?;
    switch.ip(&["link", "set", "dev", &port, "master", "br0"])?;
    Ok(())
}

/// How [`TwoSites::ping_ok`] pings: `count` echo requests `interval` seconds apart, each
/// waited for `wait` seconds, with ping's further `args`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ping<'a> {
    /// Echo requests.
    pub count: u32,
    /// Seconds between them.
    pub interval: &'a str,
    /// Seconds each reply may take.
    pub wait: u32,
    /// More arguments (`-s 1400`, `-p <pattern>`).
    pub args: &'a [&'a str],
}

impl Default for Ping<'_> {
    fn default() -> Self {
        Self::count(3)
    }
}

impl<'a> Ping<'a> {
    /// `count` requests, 0.2 s apart, each waited for 2 s.
    pub const fn count(count: u32) -> Self {
        Self {
            count,
            interval: "0.2",
            wait: 2,
            args: &[],
        }
    }

    /// The same, `interval` seconds apart.
    #[must_use]
    pub const fn interval(self, interval: &'a str) -> Self {
        Self { interval, ..self }
    }

    /// The same, each reply waited for `wait` seconds.
    #[must_use]
    pub const fn wait(self, wait: u32) -> Self {
        Self { wait, ..self }
    }

    /// The same, with ping's further `args`.
    #[must_use]
    pub const fn args(self, args: &'a [&'a str]) -> Self {
        Self { args, ..self }
    }
}

/// Revokes `cert` in the CA at `ca` (appends to its `revoked.txt`).
fn ca_revoke(bins: &Bins, ca: &Path, cert: &Path) -> anyhow::Result<()> {
    let cloud = bins.cloud.to_str().context("binary path")?;
    sh(
        cloud,
        &[
            "ca",
            "revoke",
            "--dir",
            ca.to_str().context("path")?,
            cert.to_str().context("path")?,
        ],
    )?;
    Ok(())
}

/// The bed.
#[derive(Debug)]
pub struct TwoSites {
    /// Site A.
    pub a: Site,
    /// Site B.
    pub b: Site,
    /// The router between them.
    pub wan: Netns,
    /// The binaries.
    pub bins: Bins,
    /// Those the cloud's own commands (`serve`, `status`, the admin commands) run: ours, or
    /// its release's with [`CloudOptions::program`].
    pub serving: Bins,
    /// The cloud, with [`BedOptions::cloud`] (started by [`TwoSites::new`]).
    pub cloud: Option<CloudHost>,
    /// Node C, with [`BedOptions::node_c`] (not started).
    pub c: Option<crate::node::NodeHost>,
    /// Whether hosts added to the LANs get wire-like veths (as the options said).
    wire_like_lan: bool,
    /// Whether the gateways keep GRO on their LAN side (as the options said).
    lan_gro: bool,
    /// The VLAN access ports of hosts added with [`TwoSites::add_vlan_host`].
    access_ports: Vec<crate::vlan::AccessPort>,
    tmp: TempDir,
}

/// The /24 of `site`'s LAN, as `ip route` takes it.
pub fn lan_prefix(site: &Site) -> String {
    format!(
        "{}/24",
        Ipv4Addr::from(u32::from(site.host_ip) & 0xffff_ff00)
    )
}

/// Drops everything the router `wan` forwards between the two sites' underlays (`on`), or
/// lets it through again: a firewall on the direct path.
fn block_between_sites(wan: &Netns, on: bool) -> anyhow::Result<()> {
    if !on {
        wan.exec("nft", &["delete", "table", "inet", "sites"])?;
        return Ok(());
    }
    wan.exec("nft", &["add", "table", "inet", "sites"])?;
    wan.exec(
        "nft",
        &["add chain inet sites between { type filter hook forward priority 0 ; }"],
    )?;
    for (from, to) in [
        ("198.51.100.0/24", "203.0.113.0/24"),
        ("203.0.113.0/24", "198.51.100.0/24"),
    ] {
        wan.exec(
            "nft",
            &[
                "add", "rule", "inet", "sites", "between", "ip", "saddr", from, "ip", "daddr", to,
                "drop",
            ],
        )?;
    }
    Ok(())
}

impl TwoSites {
    /// Blocks the direct path between the two sites at the router (`on`), or opens it
    /// again (as [`BedOptions::block_direct`] starts the bed).
    ///
    /// # Errors
    /// An `nft` command fails (blocking twice, opening what is not blocked).
    pub fn block_direct(&self, on: bool) -> anyhow::Result<()> {
        block_between_sites(&self.wan, on)
    }

    /// Drops every UDP datagram to and from `side`'s site at the router (`on`), as a
    /// network that lets only TCP through; or lets UDP through again.
    ///
    /// # Errors
    /// An `nft` command fails (blocking twice, opening what is not blocked).
    pub fn block_udp(&self, side: Side, on: bool) -> anyhow::Result<()> {
        let (table, net) = match side {
            Side::A => ("udp_a", "198.51.100.0/24"),
            Side::B => ("udp_b", "203.0.113.0/24"),
        };
        if !on {
            self.wan.exec("nft", &["delete", "table", "inet", table])?;
            return Ok(());
        }
        self.wan.exec("nft", &["add", "table", "inet", table])?;
        self.wan.exec(
            "nft",
            &[&format!(
                "add chain inet {table} blocked {{ type filter hook forward priority -10 ; }}"
            )],
        )?;
        for dir in ["saddr", "daddr"] {
            self.wan.exec(
                "nft",
                &[
                    "add", "rule", "inet", table, "blocked", "ip", dir, net, "meta", "l4proto",
                    "udp", "drop",
                ],
            )?;
        }
        Ok(())
    }

    /// Revokes a site's certificate in the overlay CA (its `revoked.txt`).
    ///
    /// # Errors
    /// `cyphonic-cloud ca revoke` fails.
    pub fn revoke(&self, side: Side) -> anyhow::Result<()> {
        let name = match side {
            Side::A => "gw1",
            Side::B => "gw2",
        };
        let cert = self
            .site_ref(side)
            .dir
            .join(format!("{name}.ovl.example.crt"));
        ca_revoke(&self.bins, &self.ca_dir(), &cert)
    }

    /// The overlay CA's directory (`ca.crt`, `ca.key`), to issue more certificates.
    pub fn ca_dir(&self) -> PathBuf {
        self.tmp.path().join("ca")
    }

    /// Builds the bed and starts both adapters: what most tests and measurements want.
    ///
    /// # Errors
    /// As [`TwoSites::new`] and [`TwoSites::start`].
    pub fn up(opts: &BedOptions) -> anyhow::Result<Self> {
        let mut bed = Self::new(opts)?;
        bed.start(Side::A)?;
        bed.start(Side::B)?;
        Ok(bed)
    }

    /// Builds the namespaces, certificates and configurations (adapters not started).
    ///
    /// # Errors
    /// Any step of the setup failing (missing tools, no root).
    pub fn new(opts: &BedOptions) -> anyhow::Result<Self> {
        crate::require_root();
        let bins = Bins::find()?;
        let tmp = TempDir::new("bed")?;
        let wan = Netns::new("wan")?;
        let a = Self::site("A", &wan, "toa", [198, 51, 100], 1, &opts.a, opts)?;
        let b = Self::site("B", &wan, "tob", [203, 0, 113], 2, &opts.b, opts)?;
        wan.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        wan.exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
        if opts.block_direct {
            block_between_sites(&wan, true)?;
        }

        // The overlay CA and the two adapters' certificates, as an operator makes them.
        let ca = tmp.path().join("ca");
        let cloud = bins.cloud.to_str().context("binary path")?;
        sh(
            cloud,
            &[
                "ca",
                "init",
                "--dir",
                ca.to_str().context("path")?,
                "--domain",
                "ovl.example",
                "--vip-block",
                "100.64.0.0/10",
                "--vip-block",
                OVERLAY6,
            ],
        )?;
        for (site, name, block, block6) in [
            (&a, "gw1.ovl.example", "100.64.1.0/24", SITE6[0]),
            (&b, "gw2.ovl.example", "100.64.2.0/24", SITE6[1]),
        ] {
            let blocks = if opts.ipv6 {
                format!("{block} {block6}")
            } else {
                block.to_owned()
            };
            crate::ca_issue(Path::new(cloud), &ca, name, &blocks, &site.dir)?;
            std::fs::copy(ca.join("ca.crt"), site.dir.join("ca.crt"))?;
            std::fs::create_dir_all(site.dir.join("peers"))?;
        }
        std::fs::copy(
            a.dir.join("gw1.ovl.example.crt"),
            b.dir.join("peers/gw1.ovl.example.crt"),
        )?;
        std::fs::copy(
            b.dir.join("gw2.ovl.example.crt"),
            a.dir.join("peers/gw2.ovl.example.crt"),
        )?;
        let serving = Bins {
            cloud: (opts.cloud.as_ref())
                .and_then(|c| c.program.clone())
                .unwrap_or_else(|| bins.cloud.clone()),
            ..bins.clone()
        };
        let cloud = if let Some(cloud_opts) = &opts.cloud {
            let mut extra = String::new();
            let revoked = [(&a, &opts.a, "gw1"), (&b, &opts.b, "gw2")];
            for (site, _, name) in revoked.iter().filter(|(_, o, _)| o.revoked) {
                ca_revoke(
                    &bins,
                    &ca,
                    &site.dir.join(format!("{name}.ovl.example.crt")),
                )?;
            }
            if revoked.iter().any(|(_, o, _)| o.revoked) {
                extra.push_str(&format!(
                    "revocations = \"{}\"\n",
                    ca.join("revoked.txt").display()
                ));
            }
            extra.push_str(&cloud_opts.extra);
            if cloud_opts.relay_stream {
                let ck = rcgen::generate_simple_self_signed(vec!["relay.example".to_owned()])?;
                let (cert, key) = (tmp.path().join("relay.crt"), tmp.path().join("relay.key"));
                std::fs::write(&cert, ck.cert.pem())?;
                std::fs::write(&key, ck.signing_key.serialize_pem())?;
                writeln!(
                    extra,
                    "\n[relay]\nstream_listen = \"[::]:443\"\ntls_cert = \"{}\"\ntls_key = \"{}\"",
                    cert.display(),
                    key.display()
                )?;
            }
            if let Some(lifetime) = cloud_opts.enroll {
                let issuing = tmp.path().join("issuing");
                sh(
                    cloud,
                    &[
                        "ca",
                        "delegate",
                        "--dir",
                        ca.to_str().context("path")?,
                        "--vip-block",
                        ENROLL_POOL,
                        "--vip-block",
                        ENROLL_POOL6,
                        "--out",
                        issuing.to_str().context("path")?,
                    ],
                )?;
                writeln!(
                    extra,
                    "\n[enroll]\ncertificate = \"{}\"\nkey = \"{}\"\nlifetime = {lifetime}",
                    issuing.join("issuing.crt").display(),
                    issuing.join("issuing.key").display()
                )?;
            }
            let mut c = CloudHost::new(&wan, &bins, &ca, tmp.path(), &extra)?;
            c.start(&serving)?;
            Some(c)
        } else {
            None
        };
        let c = match (opts.node_c, &cloud) {
            (Some(nat), Some(cloud)) => Some(crate::node::NodeHost::new(
                &wan,
                &bins,
                &ca,
                tmp.path(),
                cloud,
                &crate::node::NodeSpec::c(nat),
            )?),
            (Some(_), None) => bail!("node C needs the cloud"),
            (None, _) => None,
        };
        let mut bed = Self {
            a,
            b,
            wan,
            bins,
            serving,
            cloud,
            c,
            wire_like_lan: opts.wire_like_lan,
            lan_gro: opts.lan_gro,
            access_ports: Vec::new(),
            tmp,
        };
        bed.write_config(Side::A, opts)?;
        bed.write_config(Side::B, opts)?;
        Ok(bed)
    }

    fn site(
        label: &str,
        wan: &Netns,
        wan_if: &str,
        net: [u8; 3],
        n: u8,
        own: &SiteOptions,
        opts: &BedOptions,
    ) -> anyhow::Result<Site> {
        let (nat, v6_only) = (own.nat, own.v6_only);
        let lan = Netns::new(&format!("lan{label}"))?;
        let adapter_ns = Netns::new(&format!("ad{label}"))?;
        let switch = if opts.lan_switch {
            let sw = Netns::new(&format!("sw{label}"))?;
            sw.ip(&["link", "add", "name", "br0", "type", "bridge"])?;
            sw.ip(&["link", "set", "dev", "br0", "up"])?;
            // A switch forwards frames without judging their IP headers; with br_netfilter
            // loaded (Docker loads it) the bridge would drop malformed IPv4 before the
            // adapter saw it. Without the module there is no such setting and nothing to do.
            let _ = sw.exec("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=0"]);
            Some(sw)
        } else {
            None
        };
        let [x, y, z] = net;
        let router = format!("{x}.{y}.{z}.1");
        let public = Ipv4Addr::new(x, y, z, 2);
        // fd00:198:51:100::/64 and fd00:203:0:113::/64: the site's IPv4 network spelt into
        // the IPv6 plan; the router at ::1, the adapter at ::2 (its address returned).
        let ipv6 = || -> anyhow::Result<IpAddr> {
            let net6 = format!("fd00:{x}:{y}:{z}::");
            let (router6, own6) = (format!("{net6}1"), format!("{net6}2"));
            wan.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{router6}/64"),
                "dev",
                wan_if,
                "nodad",
            ])?;
            adapter_ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{own6}/64"),
                "dev",
                "wan",
                "nodad",
            ])?;
            adapter_ns.ip(&["-6", "route", "add", "default", "via", &router6])?;
            Ok(own6.parse()?)
        };
        // The adapter's link to the router: a veth, or an impaired link when asked for.
        let mut link = None;
        let mut wire = || -> anyhow::Result<()> {
            match own.impair {
                Some(imp) => {
                    let seed = 0x00c0_ffee ^ u64::from(n);
                    link = Some(ImpairedLink::wire(
                        &adapter_ns,
                        "wan",
                        wan,
                        wan_if,
                        imp,
                        seed,
                    )?);
                }
                None => veth(&adapter_ns, "wan", wan, wan_if)?,
            }
            Ok(())
        };
        let (underlay, nat_ns): (IpAddr, _) = match nat {
            None if v6_only => {
                wire()?;
                (ipv6()?, None)
            }
            None => {
                wire()?;
                adapter_ns.ip(&["addr", "add", &format!("{public}/24"), "dev", "wan"])?;
                adapter_ns.ip(&["route", "add", "default", "via", &router])?;
                if own.dual_stack {
                    ipv6()?;
                }
                (public.into(), None)
            }
            Some(_) if v6_only => bail!("no NAT on an IPv6-only site in this bed"),
            Some(_) if own.impair.is_some() => bail!("no impaired link behind a NAT in this bed"),
            Some(kind) => (
                Ipv4Addr::new(192, 0, 2, 130).into(),
                Some(nat_router(
                    label,
                    wan,
                    wan_if,
                    &adapter_ns,
                    &format!("{public}/24"),
                    &router,
                    kind,
                )?),
            ),
        };
        wan.ip(&["addr", "add", &format!("{router}/24"), "dev", wan_if])?;
        let host_ip = Ipv4Addr::new(100, 64, n, 10);
        let gateway = Ipv4Addr::new(100, 64, n, 1);
        let dir = std::env::temp_dir().join(unique(&format!("cyphonic-site{label}-")));
        std::fs::create_dir_all(&dir)?;
        let mapper = match (&nat_ns, own.mapping) {
            (Some(nat), Some(m)) => Some(port_mapper(nat, wan, &router, &dir, m)?),
            (None, Some(_)) => bail!("a port mapping service needs a NAT router"),
            _ => None,
        };
        let mut ports = 0;
        if let Some(sw) = &switch {
            plug(sw, &mut ports, &adapter_ns, "lan")?;
            plug(sw, &mut ports, &lan, "eth0")?;
        } else {
            veth(&lan, "eth0", &adapter_ns, "lan")?;
        }
        if opts.lan_gro {
            adapter_ns.exec("ethtool", &["-K", "lan", "gro", "on"])?;
        }
        lan.ip(&["addr", "add", &format!("{host_ip}/24"), "dev", "eth0"])?;
        lan.ip(&["route", "add", "default", "via", &gateway.to_string()])?;
        if opts.wire_like_lan {
            lan.exec("ethtool", &["-K", "eth0", "tso", "off", "gso", "off"])?;
        }
        if opts.lan_tx_checksum_off {
            lan.exec("ethtool", &["-K", "eth0", "tx", "off"])?;
        }
        let host_mac = mac_of(&lan, "eth0")?;
        Ok(Site {
            mapper,
            nat: nat_ns,
            lan,
            adapter_ns,
            dir,
            host_ip,
            host_mac,
            gateway,
            underlay,
            adapter: None,
            program: own.program.clone(),
            switch,
            link,
            ports,
        })
    }

    /// A new host on a site's LAN (the bed must have `lan_switch`): a namespace with `eth0`
    /// plugged into the switch, up, without an address, wire-like as the bed's options say.
    /// Returns it with its MAC.
    ///
    /// # Errors
    /// No switch on this LAN, or `ip` failing.
    pub fn add_host(&mut self, side: Side, label: &str) -> anyhow::Result<(Netns, String)> {
        let wire_like = self.wire_like_lan;
        let site = self.site_mut(side);
        anyhow::ensure!(
            site.switch.is_some(),
            "add_host needs a bed built with lan_switch"
        );
        let ns = Netns::new(label)?;
        let switch = site.switch.as_ref().context("no switch")?;
        plug(switch, &mut site.ports, &ns, "eth0")?;
        if wire_like {
            ns.exec("ethtool", &["-K", "eth0", "tso", "off", "gso", "off"])?;
        }
        let mac = mac_of(&ns, "eth0")?;
        Ok((ns, mac))
    }

    /// Plugs `ns`'s new interface `ns_if` into `side`'s LAN switch (the bed must have
    /// `lan_switch`): a second adapter on the same LAN, say.
    ///
    /// # Errors
    /// No switch on this LAN, or `ip` failing.
    pub fn plug_into_lan(&mut self, side: Side, ns: &Netns, ns_if: &str) -> anyhow::Result<()> {
        let site = self.site_mut(side);
        let switch = site
            .switch
            .as_ref()
            .context("plug_into_lan needs a bed built with lan_switch")?;
        plug(switch, &mut site.ports, ns, ns_if)
    }

    /// A host on the underlay beside the sites and the cloud, on a segment of its own behind
    /// the router (`[wan router] tov 192.0.2.193/26 -- eth0 192.0.2.200/26 [host]`): a third
    /// party an attacker may try to aim traffic at. At most one per bed.
    ///
    /// # Errors
    /// `ip` failing, or one was added already.
    pub fn add_underlay_host(&self, label: &str) -> anyhow::Result<(Netns, Ipv4Addr)> {
        let ns = Netns::new(label)?;
        veth(&self.wan, "tov", &ns, "eth0")?;
        self.wan
            .ip(&["addr", "add", "192.0.2.193/26", "dev", "tov"])?;
        ns.ip(&["addr", "add", "192.0.2.200/26", "dev", "eth0"])?;
        ns.ip(&["route", "add", "default", "via", "192.0.2.193"])?;
        Ok((ns, Ipv4Addr::new(192, 0, 2, 200)))
    }

    /// A device that joins `side`'s LAN (the bed must have `lan_switch`) and takes its
    /// address by DHCP, asking for `hostname`, and uses the DNS server its lease names.
    /// Returns it with its address.
    ///
    /// # Errors
    /// No switch, no lease within 20 s (the bed's logs are in the error).
    pub fn dhcp_device(
        &mut self,
        side: Side,
        hostname: &str,
    ) -> anyhow::Result<(crate::lan::DhcpHost, Ipv4Addr)> {
        self.dhcp_device_on(side, hostname, None)
    }

    /// A host on `side`'s LAN switch behind an access port of VLAN `tag`
    /// ([`crate::vlan::AccessPort`]): what it sends reaches the switch, and the adapter's
    /// trunked port, tagged; it hears only its VLAN. The switch passes tags as they are.
    ///
    /// # Errors
    /// No switch on this LAN; a namespace, veth or socket cannot be made.
    pub fn add_vlan_host(
        &mut self,
        side: Side,
        label: &str,
        tag: u16,
    ) -> anyhow::Result<(Netns, String)> {
        let site = self.site_mut(side);
        let switch = site
            .switch
            .as_ref()
            .context("add_vlan_host needs a bed built with lan_switch")?;
        let ns = Netns::new(label)?;
        let port = format!("p{}", site.ports);
        site.ports += 1;
        let access = crate::vlan::AccessPort::new(&ns, "eth0", switch, &port, tag)?;
        switch.ip(&["link", "set", "dev", &port, "master", "br0"])?;
        let mac = mac_of(&ns, "eth0")?;
        self.access_ports.push(access);
        Ok((ns, mac))
    }

    /// As [`TwoSites::dhcp_device`], on VLAN `tag` when given ([`TwoSites::add_vlan_host`]).
    ///
    /// # Errors
    /// As [`TwoSites::dhcp_device`].
    pub fn dhcp_device_on(
        &mut self,
        side: Side,
        hostname: &str,
        tag: Option<u16>,
    ) -> anyhow::Result<(crate::lan::DhcpHost, Ipv4Addr)> {
        let (ns, mac) = match tag {
            None => self.add_host(side, hostname)?,
            Some(tag) => self.add_vlan_host(side, hostname, tag)?,
        };
        let mut dev = crate::lan::DhcpHost::new(ns, mac, crate::lan::DhcpClient::Udhcpc, hostname)?;
        dev.start()?;
        let lease = dev
            .wait_for(&["bound"], 1, Duration::from_secs(20))
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))?;
        let ip: Ipv4Addr = lease.get("ip").parse()?;
        dev.ns
            .set_resolv_conf(&format!("nameserver {}\n", lease.get("dns")))?;
        Ok((dev, ip))
    }

    /// Asks `server` from `ns` for `name` until the answer has addresses (names take a
    /// moment to be registered, and "not found" is cached 5 s), for about 12 s; the
    /// addresses.
    ///
    /// # Panics
    /// No answer with addresses in that time (the bed's logs in the message).
    pub fn resolve(&self, ns: &Netns, server: Ipv4Addr, name: &str) -> Vec<String> {
        for _ in 0..24 {
            if let Ok(d) = crate::lan::dig(ns, server, name, "A")
                && d.status == "NOERROR"
                && !d.answers.is_empty()
            {
                return d.answers;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("{name}: no answer from {server}\n{}", self.logs());
    }

    /// (Re)writes a site's configuration file.
    ///
    /// # Errors
    /// Writing fails.
    pub fn write_config(&mut self, side: Side, opts: &BedOptions) -> anyhow::Result<()> {
        let (me, peer, name, peer_name) = match side {
            Side::A => (&self.a, &self.b, "gw1.ovl.example", "gw2.ovl.example"),
            Side::B => (&self.b, &self.a, "gw2.ovl.example", "gw1.ovl.example"),
        };
        let mut text = String::new();
        writeln!(
            text,
            "[adapter]\nlan_interface = \"lan\"\ngateway_vip = \"{}\"\nstatus_socket = \"adapter.sock\"\nstate_dir = \"state\"\n",
            me.gateway
        )?;
        writeln!(
            text,
            "[identity]\ncertificate = \"{name}.crt\"\nkey = \"{name}.key\"\nca = \"ca.crt\"\n"
        )?;
        writeln!(
            text,
            "[dataplane]\nordering = {}\nlan_gro = {}\n{}\n",
            opts.ordering, opts.lan_gro, opts.dataplane_extra
        )?;
        writeln!(
            text,
            "[[reservation]]\nmac = \"{}\"\nvip = \"{}\"\nhostname = \"host\"\n",
            me.host_mac, me.host_ip
        )?;
        if let Some(cloud) = &self.cloud {
            let address = if me.underlay.is_ipv6() {
                cloud.address6
            } else {
                cloud.address
            };
            writeln!(
                text,
                "[cloud]\naddress = \"{address}\"\npublic_key = \"{}\"",
                cloud.public_key
            )?;
            if let (true, IpAddr::V4(v4)) = (opts.site(side).dual_stack, me.underlay) {
                let [x, y, z, _] = v4.octets();
                writeln!(text, "endpoints = [\"[fd00:{x}:{y}:{z}::2]:51820\"]")?;
            }
            writeln!(text)?;
        } else {
            writeln!(
                text,
                "[[peer]]\ncertificate = \"peers/{peer_name}.crt\"\nendpoint = \"{}\"\npersistent_keepalive = {}\n",
                peer.endpoint(),
                opts.persistent_keepalive
            )?;
        }
        text.push_str(&opts.site(side).extra);
        std::fs::write(me.config(), text)?;
        Ok(())
    }

    /// A site.
    pub fn site_mut(&mut self, side: Side) -> &mut Site {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// A site.
    pub fn site_ref(&self, side: Side) -> &Site {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// Starts a site's adapter and waits until its status socket answers.
    ///
    /// # Errors
    /// It exits or does not come up within 10 s (its log is in the error).
    pub fn start(&mut self, side: Side) -> anyhow::Result<()> {
        let tested = self.bins.adapter.clone();
        let site = self.site_mut(side);
        let adapter = site.program.clone().unwrap_or(tested);
        let socket = site.socket();
        let _ = std::fs::remove_file(&socket);
        let config = site.config();
        let proc = site.adapter_ns.daemon(
            &adapter,
            &["run", "--config", config.to_str().context("path")?],
            &site.log(),
            || socket.exists(),
        )?;
        site.adapter = Some(proc);
        Ok(())
    }

    /// Stops a site's adapter with `signal` (KILL, TERM) and waits for it.
    ///
    /// # Errors
    /// It was not running or did not stop.
    pub fn stop(&mut self, side: Side, signal: &str) -> anyhow::Result<std::process::Output> {
        let site = self.site_mut(side);
        let proc = site.adapter.take().context("the adapter is not running")?;
        proc.stop(signal, Duration::from_secs(10))
    }

    /// Sends a site's running adapter `signal` (HUP: read the configuration again).
    ///
    /// # Errors
    /// It is not running, or kill fails.
    pub fn signal(&self, side: Side, signal: &str) -> anyhow::Result<()> {
        let proc = self
            .site_ref(side)
            .adapter
            .as_ref()
            .context("the adapter is not running")?;
        sh("kill", &["-s", signal, &proc.pid().to_string()])?;
        Ok(())
    }

    /// Sends a site's adapter SIGHUP and waits (5 s at most) until its log shows `count`
    /// reloads ended since it started, taken (`configuration reloaded`) or refused (`the
    /// running one stays`); returns the log.
    ///
    /// # Errors
    /// It is not running, or the reload did not end in time.
    pub fn reload(&self, side: Side, count: usize) -> anyhow::Result<String> {
        self.signal(side, "HUP")?;
        let site = self.site_ref(side);
        let ended = |log: &str| {
            log.matches("configuration reloaded").count()
                + log.matches("the running one stays").count()
        };
        crate::wait_until(Duration::from_secs(5), "the reload to end", || {
            ended(&site.log_text()) >= count
        })?;
        Ok(site.log_text())
    }

    /// The running adapter's status document.
    ///
    /// # Errors
    /// `cyphonic-adapter status` fails.
    pub fn status(&self, side: Side) -> anyhow::Result<Value> {
        adapter_status(&self.bins, &self.site_ref(side).socket())
    }

    /// Runs `cyphonic-cloud ARGS --config <the bed's cloud's file>` (an admin command,
    /// `members show NAME`, `token create ...`) and returns how it ended.
    ///
    /// # Errors
    /// No cloud, or the program cannot start.
    pub fn cloud_cli(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let cloud = self.cloud.as_ref().context("the bed has no cloud")?;
        Ok(Command::new(&self.serving.cloud)
            .args(args)
            .arg("--config")
            .arg(cloud.dir.join("cloud.toml"))
            .output()?)
    }

    /// `cyphonic-cloud token create --name NAME ARGS` on the bed's cloud: the token it
    /// printed (`<16 hex>.<64 hex>`).
    ///
    /// # Errors
    /// No cloud, the command fails (its output in the message) or printed no token.
    pub fn create_token(&self, name: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["token", "create", "--name", name];
        all.extend_from_slice(args);
        let out = self.cloud_cli(&all)?;
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(out.status.success(), "token create: {said}");
        said.lines()
            .find(|l| l.len() == 81 && l.as_bytes()[16] == b'.')
            .map(str::to_owned)
            .with_context(|| format!("no token in {said}"))
    }

    /// The state (`unused`, `issued`, `used`, ...) of the token for `name`, as `token list
    /// --json` says.
    ///
    /// # Errors
    /// No cloud, the command fails, or no token is for `name`.
    pub fn token_state(&self, name: &str) -> anyhow::Result<String> {
        let out = self.cloud_cli(&["token", "list", "--json"])?;
        anyhow::ensure!(
            out.status.success(),
            "token list: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout)?;
        list.as_array()
            .and_then(|all| all.iter().find(|t| t["name"] == name))
            .and_then(|t| t["state"].as_str())
            .map(str::to_owned)
            .with_context(|| format!("no token for {name}: {list}"))
    }

    /// A counter from the cloud's status.
    ///
    /// # Errors
    /// No cloud, `cyphonic-cloud status` fails, or it has no such counter.
    pub fn cloud_counter(&self, name: &str) -> anyhow::Result<u64> {
        let cloud = self.cloud.as_ref().context("the bed has no cloud")?;
        cloud.status(&self.serving)?["counters"][name]
            .as_u64()
            .with_context(|| format!("the cloud has no counter {name}"))
    }

    /// A counter of the cloud's relay, from its status.
    ///
    /// # Errors
    /// As [`TwoSites::cloud_counter`]; no relay.
    pub fn relay_counter(&self, name: &str) -> anyhow::Result<u64> {
        let cloud = self.cloud.as_ref().context("the bed has no cloud")?;
        cloud.status(&self.serving)?["relay"]["counters"][name]
            .as_u64()
            .with_context(|| format!("the relay has no counter {name}"))
    }

    /// A counter from a site's status.
    ///
    /// # Errors
    /// As [`TwoSites::status`].
    pub fn counter(&self, side: Side, name: &str) -> anyhow::Result<u64> {
        let s = self.status(side)?;
        s["counters"][name]
            .as_u64()
            .with_context(|| format!("no counter {name}"))
    }

    /// Runs `ping` on a site's LAN host; returns its output whatever the result.
    ///
    /// # Errors
    /// ping cannot start.
    pub fn ping(
        &self,
        from: Side,
        to: Ipv4Addr,
        args: &[&str],
    ) -> anyhow::Result<std::process::Output> {
        let mut all: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        all.push(to.to_string());
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        self.site_ref(from).lan.exec_output("ping", &refs)
    }

    /// Pings `to` from the host `from` (a site's LAN host, node C, a device) as `ping` says,
    /// and fails the test unless every request was answered; the message has the bed's logs.
    ///
    /// # Panics
    /// When ping cannot run, or a request went unanswered.
    #[track_caller]
    pub fn ping_ok(&self, from: &Netns, to: impl std::fmt::Display, ping: Ping<'_>) {
        let (count, wait, to) = (
            ping.count.to_string(),
            ping.wait.to_string(),
            to.to_string(),
        );
        let mut args = vec!["-c", &count, "-i", ping.interval, "-W", &wait];
        args.extend_from_slice(ping.args);
        args.push(&to);
        let out = from
            .exec_output("ping", &args)
            .unwrap_or_else(|e| panic!("ping {to} from {}: {e}", from.name()));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(&format!(" {count} received")),
            "ping {to} from {}:\n{text}{}\n{}",
            from.name(),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
    }

    /// Turns the two adapter namespaces into plain kernel routers (no tunnel), for the
    /// baseline of the benchmarks: same hosts, same links, the LAN hosts' default routes now
    /// end at a kernel address. GRO on the LAN side is off, as the adapter keeps it, unless
    /// the options asked for it.
    ///
    /// # Errors
    /// An `ip` or `sysctl` command fails (for instance, an adapter is running).
    pub fn route_plainly(&self) -> anyhow::Result<()> {
        self.kernel_gateways()?;
        for (me, other) in [(&self.a, &self.b), (&self.b, &self.a)] {
            let IpAddr::V4(underlay) = me.underlay else {
                bail!("plain routing needs IPv4 underlays");
            };
            let router = Ipv4Addr::from(u32::from(underlay) & 0xffff_ff00 | 1).to_string();
            me.adapter_ns
                .ip(&["route", "add", &lan_prefix(other), "via", &router])?;
            self.wan.ip(&[
                "route",
                "add",
                &lan_prefix(me),
                "via",
                &me.underlay.to_string(),
            ])?;
        }
        Ok(())
    }

    /// The kernel of each adapter namespace as its LAN's gateway (the gateway vIP on `lan`,
    /// forwarding on, GRO on the LAN side as the options say) without a route to the other
    /// LAN: the half of [`TwoSites::route_plainly`] that another tunnel shares
    /// ([`crate::rivals`]).
    ///
    /// # Errors
    /// An `ip`, `sysctl` or `ethtool` command fails (for instance, an adapter is running).
    pub fn kernel_gateways(&self) -> anyhow::Result<()> {
        for me in [&self.a, &self.b] {
            let prefix = format!("{}/24", me.gateway);
            me.adapter_ns.ip(&["addr", "add", &prefix, "dev", "lan"])?;
            me.adapter_ns
                .exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
            let gro = if self.lan_gro { "on" } else { "off" };
            me.adapter_ns.exec("ethtool", &["-K", "lan", "gro", gro])?;
        }
        Ok(())
    }

    /// Both adapters' logs, for failure messages.
    pub fn logs(&self) -> String {
        let cloud = self.cloud.as_ref().map_or(String::new(), |c| {
            format!(
                "\n--- cloud ---\n{}",
                std::fs::read_to_string(c.log()).unwrap_or_default()
            )
        });
        let node = self.c.as_ref().map_or(String::new(), |c| {
            format!("\n--- node C ---\n{}", c.log_text())
        });
        let routers: String = [&self.a, &self.b]
            .iter()
            .filter(|s| s.mapper.is_some())
            .map(|s| {
                let log = std::fs::read_to_string(s.dir.join("miniupnpd.log")).unwrap_or_default();
                format!("\n--- miniupnpd in {} ---\n{log}", s.dir.display())
            })
            .collect();
        format!(
            "--- adapter A ---\n{}\n--- adapter B ---\n{}{cloud}{node}{routers}",
            self.a.log_text(),
            self.b.log_text()
        )
    }

    /// The bed's scratch directory.
    pub fn tmp(&self) -> &Path {
        self.tmp.path()
    }
}

impl Drop for TwoSites {
    fn drop(&mut self) {
        // Processes and the impaired links first (they hold the namespaces' sockets), then
        // directories.
        self.a.adapter.take();
        self.b.adapter.take();
        if let Some(c) = self.c.as_mut() {
            c.proc.take();
        }
        self.a.link.take();
        self.b.link.take();
        if let Some(c) = self.cloud.as_mut() {
            c.proc.take();
        }
        let _ = std::fs::remove_dir_all(&self.a.dir);
        let _ = std::fs::remove_dir_all(&self.b.dir);
    }
}

/// The scheduling class of a bed's bulk senders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// As started: they compete with the gateways for the same cores.
    Default,
    /// `SCHED_IDLE` (`chrt --idle 0`): they run only when nothing else wants the core, as if
    /// they were the separate machines they are in real life.
    Idle,
}

/// An iperf3 measurement in progress: a one-shot server and a client, both owned here (they
/// are killed if this is dropped), borrowing nothing from the bed.
#[derive(Debug)]
pub struct IperfRun {
    server: Proc,
    client: Proc,
    seconds: u64,
}

impl IperfRun {
    /// Starts a one-shot server on `server`'s LAN host and the client on the other one, with
    /// `args` and JSON output, for `seconds`.
    ///
    /// # Errors
    /// A process cannot start.
    pub fn start(
        bed: &TwoSites,
        server: Side,
        args: &[&str],
        seconds: u64,
    ) -> anyhow::Result<Self> {
        Self::start_at(bed, server, args, seconds, Priority::Default)
    }

    /// [`IperfRun::start`] with both iperf3 processes at `priority`.
    ///
    /// # Errors
    /// A process cannot start.
    pub fn start_at(
        bed: &TwoSites,
        server: Side,
        args: &[&str],
        seconds: u64,
        priority: Priority,
    ) -> anyhow::Result<Self> {
        let host = bed.site_ref(server).host_ip.to_string();
        Self::start_to(bed, (server, &host), args, seconds, priority)
    }

    /// [`IperfRun::start_at`] to the server's LAN host at `target` (an address of it, of
    /// either family).
    ///
    /// # Errors
    /// A process cannot start.
    pub fn start_to(
        bed: &TwoSites,
        (server, target): (Side, &str),
        args: &[&str],
        seconds: u64,
        priority: Priority,
    ) -> anyhow::Result<Self> {
        let (srv, cli) = match server {
            Side::A => (&bed.a, &bed.b),
            Side::B => (&bed.b, &bed.a),
        };
        let run = |ns: &Netns, args: &[&str]| match priority {
            Priority::Default => ns.spawn("iperf3", args),
            Priority::Idle => {
                let mut all = vec!["--idle", "0", "iperf3"];
                all.extend_from_slice(args);
                ns.spawn("chrt", &all)
            }
        };
        let server_proc = run(&srv.lan, &["-s", "-1", "--idle-timeout", "30"])?;
        std::thread::sleep(Duration::from_millis(300));
        let secs = seconds.to_string();
        let mut all = vec!["-J", "-c", target, "-t", secs.as_str()];
        all.extend_from_slice(args);
        let client = run(&cli.lan, &all)?;
        Ok(Self {
            server: server_proc,
            client,
            seconds,
        })
    }

    /// Waits for the client (at most its duration plus 15 s) and returns its JSON report.
    ///
    /// # Errors
    /// iperf3 fails, hangs, or reports an error.
    pub fn finish(self) -> anyhow::Result<Value> {
        let out = self.client.wait(Duration::from_secs(self.seconds + 15))?;
        drop(self.server);
        let report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "iperf3 gave no JSON: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        if let Some(err) = report["error"].as_str() {
            bail!("iperf3: {err}");
        }
        Ok(report)
    }
}

/// Runs iperf3 between the sites (see [`IperfRun`]) and returns the client's JSON report.
///
/// # Errors
/// iperf3 fails or reports an error (the adapters' logs are in the message).
pub fn iperf3(bed: &TwoSites, server: Side, args: &[&str], seconds: u64) -> anyhow::Result<Value> {
    IperfRun::start(bed, server, args, seconds)?
        .finish()
        .map_err(|e| anyhow::anyhow!("{e}\n{}", bed.logs()))
}
