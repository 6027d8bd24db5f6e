//! The node's configuration file: TOML, every key documented in config/node.example.toml,
//! safe defaults in code, errors that name the file, the line and the key. The keys every
//! tunnel end has (`listen`, `overlay`, `inner_mtu`, `status_socket`, `[identity]`,
//! `[[peer]]`, `[cloud]`, `[metrics]`, `[dataplane]`, `[dns]`'s upstreams and TTL) are declared
//! and checked by `cyphonic-settings`; this file adds the node's own.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::Ipv6Net;
use std::path::Path;

use cyphonic_settings::{Common, ConfigError, Identity, Source};
use toml::Spanned;

cyphonic_settings::config_file! {
    /// `cyphonic-node`'s file. The tables every tunnel end has are the adapter's too.
    struct Raw {
        /// The node.
        node: RawNode,
        /// The node without a TUN device.
        userspace: Option<RawUserspace> = None,
    }
}

cyphonic_settings::table! {
    /// The node without a TUN device. Present, the node opens no device and needs
    /// no privileges: the overlay's TCP runs inside it (`node.interface` and the TUN side's
    /// `[dataplane]` keys are not used), reached through a SOCKS5 proxy and static forwards on
    /// loopback; it resolves overlay names with its DNS stub (on `dns.listen`, by default
    /// a free port of 127.0.0.1). Other programs of the host reach the overlay only through
    /// them.
    struct RawUserspace in "userspace" {
        /// A SOCKS5 proxy (CONNECT, no authentication: it acts as this node, so only on a
        /// loopback address) to overlay names and addresses. Unset: none.
        socks5: Option<Spanned<SocketAddr>> = None,
        /// Connections through the overlay at once, proxied and forwarded (1 to 4096); each
        /// holds 256 KiB of buffers.
        connections: Spanned<u32> = cyphonic_settings::unwritten(256),
        /// Static forwards: a local port to an overlay name or address and port.
        forward: Vec<RawForward> = Vec::new(),
    }
}

cyphonic_settings::table! {
    /// A static forward: each connection to `listen` is carried to `to` through the overlay.
    struct RawForward in "userspace.forward" {
        /// The local address and port, on a loopback address.
        listen: Spanned<SocketAddr>,
        /// Where it goes: an overlay name or address, and a port (`cam.gw1.ovl.example:554`,
        /// `100.64.1.20:22`, `[fd7a:0:1:100::20]:22`).
        to: Spanned<String>,
    }
}

cyphonic_settings::end_table! {
    /// The node and its TUN interface.
    struct RawNode("node", status_socket = "/run/cyphonic/node.sock") {
        /// The TUN interface the node creates for the overlay (removed when it stops), 1 to
        /// 15 bytes, no `/` or spaces. `%d` in the name is replaced by a free number.
        interface: Spanned<String> = cyphonic_settings::unwritten("cyo0".to_owned()),
        /// This host's overlay address, inside the vIP block of the node's certificate. Unset:
        /// the block's address for a /32 (or /31), else its first host address.
        vip: Option<Spanned<Ipv4Addr>> = None,
    }
}

cyphonic_settings::dns_table! {
    /// A DNS stub for the overlay: it answers this node's name, asks the cloud (or a static
    /// peer) about other names in the overlay's domain, and forwards other names to
    /// `upstream`. Point the host's resolver at it for the overlay's domain
    /// (docs/operations.md: split DNS).
    struct RawDns {
        /// Where the stub answers, one address and port. Unset: the node's `vip`, port 53.
        listen: Option<Spanned<SocketAddr>> = None,
    }
}

cyphonic_settings::dataplane_table! {
    /// The data plane: the keys every tunnel end has, and the TUN side's.
    struct RawDataplane {
        /// The TUN device with offloads: super-packets and partial checksums both ways.
        tun_offload: bool = true,
        /// With offloads, checksums the host left partial go through the tunnel for the far
        /// end to complete (docs/protocol.md §1).
        defer_checksums: bool = true,
    }
}

/// Everything the node needs to run, checked.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// What every tunnel end has.
    pub common: Common,
    /// The TUN interface's name.
    pub interface: String,
    /// Our overlay address.
    pub vip: Ipv4Addr,
    /// Our IPv6 overlay address and the overlay's IPv6 range (what goes into the tunnel),
    /// when our certificate holds an IPv6 block and the overlay's root one (docs/protocol.md
    /// §7): the block's address for a /128, else its first host address.
    pub ipv6: Option<(Ipv6Addr, Ipv6Net)>,
    /// Where the DNS stub listens, unless it is switched off.
    pub dns_listen: Option<SocketAddr>,
    /// `dataplane.tun_offload`: the TUN device with offloads (super-packets and partial
    /// checksums both ways).
    pub tun_offload: bool,
    /// `dataplane.defer_checksums`: with offloads, checksums the host left partial go through
    /// the tunnel for the far end to complete (docs/protocol.md §1).
    pub defer_checksums: bool,
    /// `[userspace]`: no TUN device, the overlay's TCP in the process.
    pub userspace: Option<Userspace>,
}

/// `[userspace]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Userspace {
    /// The SOCKS5 proxy's address.
    pub socks5: Option<SocketAddr>,
    /// Connections through the overlay at once.
    pub connections: usize,
    /// The static forwards.
    pub forwards: Vec<Forward>,
}

/// A static forward, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// The local address.
    pub listen: SocketAddr,
    /// The overlay name or address it goes to.
    pub host: String,
    /// And the port.
    pub port: u16,
}

/// The most connections `userspace.connections` may say.
const CONNECTIONS_MAX: u32 = 4096;

impl AsRef<Common> for NodeConfig {
    fn as_ref(&self) -> &Common {
        &self.common
    }
}

impl NodeConfig {
    /// The node's own keys that differ in `new`: each takes effect at a restart (the keys
    /// every tunnel end has are compared by the daemon core).
    pub fn needs_restart(&self, new: &Self) -> Vec<&'static str> {
        cyphonic_settings::changed_keys([
            (RawNode::interface, self.interface != new.interface),
            (RawNode::vip, self.vip != new.vip),
            (RawDns::listen, self.dns_listen != new.dns_listen),
            (
                RawDataplane::tun_offload,
                self.tun_offload != new.tun_offload,
            ),
            (
                RawDataplane::defer_checksums,
                self.defer_checksums != new.defer_checksums,
            ),
            (
                RawUserspace::socks5,
                userspace(self, |u| u.socks5) != userspace(new, |u| u.socks5),
            ),
            (
                RawUserspace::connections,
                userspace(self, |u| u.connections) != userspace(new, |u| u.connections),
            ),
            (
                RawUserspace::forward,
                userspace(self, |u| &u.forwards) != userspace(new, |u| &u.forwards),
            ),
        ])
    }
}

/// `part` of `c`'s `[userspace]`, if it has one.
fn userspace<'a, T>(c: &'a NodeConfig, part: impl Fn(&'a Userspace) -> T) -> Option<T> {
    c.userspace.as_ref().map(part)
}

/// Reads, parses and checks the configuration at `path` at unix time `now_secs`, with the
/// certificates and keys it names. Returns the configuration and our identity.
///
/// # Errors
/// A [`ConfigError`] naming the file, and where possible the line and key.
pub fn load(path: &Path, now_secs: u64) -> Result<(NodeConfig, Identity), ConfigError> {
    cyphonic_settings::load(path, now_secs, check)
}

fn check(raw: &Raw, src: &Source<'_>) -> Result<(NodeConfig, Identity), ConfigError> {
    let (common, identity) = raw.common(src)?;
    let n = &raw.node;
    let block = common.block;
    let interface = n.interface.get_ref();
    if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ', '\0']) {
        return src.err(
            &n.interface.span(),
            RawNode::interface,
            format!("{interface:?} is not an interface name (1 to 15 bytes, no '/' or spaces)"),
        );
    }
    // A /32 certifies exactly our address; a larger block, by convention, its first host.
    let default_vip = if block.prefix_len() >= 31 {
        block.network()
    } else {
        Ipv4Addr::from(u32::from(block.network()).saturating_add(1))
    };
    let vip = n.vip.as_ref().map_or(default_vip, |v| *v.get_ref());
    if let Some(v) = &n.vip
        && (!block.contains(&vip)
            || (block.prefix_len() < 31 && (vip == block.network() || vip == block.broadcast())))
    {
        return src.err(
            &v.span(),
            RawNode::vip,
            format!(
                "{vip} must be a host address inside the block {block} certified to {}",
                identity.certificate().body().name
            ),
        );
    }
    let userspace = raw
        .userspace
        .as_ref()
        .map(|u| check_userspace(u, src, &common))
        .transpose()?;
    let dns_listen = match (&common.dns, &raw.dns.listen) {
        (None, _) => None,
        // Without a TUN device our vIP is on no interface of the host: the stub is the
        // proxy's own, on loopback.
        (Some(_), None) if userspace.is_some() => Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        (Some(_), None) => Some(SocketAddr::from((vip, 53))),
        (Some(_), Some(l)) => {
            let a = *l.get_ref();
            if a.ip().is_unspecified() || a.ip().is_multicast() {
                return src.err(
                    &l.span(),
                    RawDns::listen,
                    format!("{a}: give the one address the stub answers on"),
                );
            }
            Some(a)
        }
    };
    // Peers ask the DNS stub when it listens on our vIP; without a TUN device the stack
    // takes their questions there for it.
    let dns = dns_listen.and_then(|a| match a.ip() {
        std::net::IpAddr::V4(ip) if ip == vip => Some(ip),
        _ if userspace.is_some() => Some(vip),
        _ => None,
    });
    let ipv6 = common.ipv6.map(node_ipv6);
    let common = raw.with_policy(src, common, &identity, &[], dns)?;
    let config = NodeConfig {
        common,
        interface: interface.clone(),
        vip,
        ipv6,
        dns_listen,
        tun_offload: raw.dataplane.tun_offload,
        defer_checksums: raw.dataplane.defer_checksums,
        userspace,
    };
    Ok((config, identity))
}

/// `[userspace]`: the proxy and forwards on loopback, each address once, forwards to a host
/// and port (an address in the overlay), at least one way in.
fn check_userspace(
    u: &RawUserspace,
    src: &Source<'_>,
    common: &Common,
) -> Result<Userspace, ConfigError> {
    let mut taken: Vec<SocketAddr> = Vec::new();
    let mut local = |a: &Spanned<SocketAddr>, key: &str| {
        let addr = *a.get_ref();
        if !addr.ip().is_loopback() {
            return src.err(
                &a.span(),
                key,
                format!("{addr}: it acts as this node in the overlay: give a loopback address"),
            );
        }
        if addr.port() == 0 || taken.contains(&addr) {
            return src.err(
                &a.span(),
                key,
                format!("{addr}: give a port of its own (not 0, not used by another key here)"),
            );
        }
        taken.push(addr);
        Ok(addr)
    };
    let socks5 = u
        .socks5
        .as_ref()
        .map(|a| local(a, RawUserspace::socks5))
        .transpose()?;
    let mut forwards = Vec::new();
    for (i, f) in u.forward.iter().enumerate() {
        let key = cyphonic_settings::indexed(RawForward::listen, i);
        let listen = local(&f.listen, &key)?;
        let to_key = cyphonic_settings::indexed(RawForward::to, i);
        let Some((host, port)) = split_host_port(f.to.get_ref()) else {
            return src.err(
                &f.to.span(),
                &to_key,
                format!(
                    "{:?} is not a name or address and a port (`cam.gw1.ovl.example:554`)",
                    f.to.get_ref()
                ),
            );
        };
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            let inside = match ip {
                std::net::IpAddr::V4(v4) => common.overlay.contains(&v4),
                std::net::IpAddr::V6(v6) => common.ipv6.is_some_and(|(_, o)| o.contains(&v6)),
            };
            if !inside {
                return src.err(
                    &f.to.span(),
                    &to_key,
                    format!("{ip} is not in the overlay: the node reaches nothing else"),
                );
            }
        }
        forwards.push(Forward { listen, host, port });
    }
    if socks5.is_none() && forwards.is_empty() {
        return src.err(
            &(0..0),
            RawUserspace::socks5,
            "give `socks5` or a `[[userspace.forward]]`: without either nothing reaches the overlay",
        );
    }
    let connections = *u.connections.get_ref();
    if !(1..=CONNECTIONS_MAX).contains(&connections) {
        return src.err(
            &u.connections.span(),
            RawUserspace::connections,
            format!("{connections} is outside 1..={CONNECTIONS_MAX}"),
        );
    }
    Ok(Userspace {
        socks5,
        connections: usize::try_from(connections).unwrap_or(usize::MAX),
        forwards,
    })
}

/// `host:port` (a name, an IPv4 address, or an IPv6 address in brackets; a port not 0).
fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']')?.parse::<Ipv6Addr>().ok()?.to_string(),
        None if host.contains(':') => return None,
        None => host.to_owned(),
    };
    let name_like = host.len() <= 253
        && !host.is_empty()
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    (name_like || host.parse::<std::net::IpAddr>().is_ok()).then_some((host, port))
}

/// [`NodeConfig::ipv6`] from our IPv6 block and the overlay's range: a /128's address, else
/// the block's first host.
fn node_ipv6((block, overlay): (Ipv6Net, Ipv6Net)) -> (Ipv6Addr, Ipv6Net) {
    let vip = if block.prefix_len() == 128 {
        block.network()
    } else {
        Ipv6Addr::from(block.network().to_bits().saturating_add(1))
    };
    (vip, overlay)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cyphonic_settings::testing::{
        Fixture, Node, SHARED_MISTAKES, assert_documents_every_key, assert_mistakes,
    };

    use super::*;

    const NOW: u64 = 1_800_000_000;
    const EXAMPLE: &str = include_str!("../../../config/node.example.toml");

    /// A directory with a CA, the node's key and certificate (`node_block`) and an adapter's
    /// certificate, as the example's relative paths expect. Removed on drop.
    fn fixture(node_block: &str) -> Fixture {
        Fixture::new(
            "node-config",
            NOW,
            &[
                Node {
                    name: "laptop.ovl.example",
                    block: node_block,
                    path: "laptop.ovl.example",
                    with_key: true,
                },
                Node {
                    name: "gw1.ovl.example",
                    block: "100.64.1.0/24",
                    path: "peers/gw1.ovl.example",
                    with_key: false,
                },
            ],
        )
    }

    fn load_text(f: &Fixture, text: &str) -> Result<(NodeConfig, Identity), ConfigError> {
        load(&f.write("node.toml", text), NOW)
    }

    #[test]
    fn the_example_is_valid_and_defaults_fill_what_is_left_out() {
        let f = fixture("100.64.3.0/24");
        let (c, id) = load_text(&f, EXAMPLE).unwrap();
        assert_eq!(id.certificate().body().name, "laptop.ovl.example");
        assert_eq!(
            (c.interface.as_str(), c.vip),
            ("cyo0", Ipv4Addr::new(100, 64, 3, 1))
        );
        assert_eq!(c.common.block.to_string(), "100.64.3.0/24");
        assert_eq!(c.common.peers.len(), 1);
        assert_eq!(c.common.peers[0].dns, Ipv4Addr::new(100, 64, 1, 1));
        assert_eq!(c.common.overlay_domain, "ovl.example");
        assert!(c.common.cloud.is_some());
        assert_eq!(c.dns_listen, Some("100.64.3.1:53".parse().unwrap()));

        let minimal = "[node]\n\n[identity]\ncertificate = \"laptop.ovl.example.crt\"\nkey = \"laptop.ovl.example.key\"\nca = \"ca.crt\"\n";
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(
            (c.vip, c.common.inner_mtu, c.common.listen.port()),
            (Ipv4Addr::new(100, 64, 3, 1), 1420, 51820)
        );
        assert_eq!(c.dns_listen, Some("100.64.3.1:53".parse().unwrap()));
        assert_eq!(
            c.common.dns,
            Some(cyphonic_settings::Dns {
                upstream: vec![],
                ttl: 60
            })
        );
        assert_eq!(
            c.common.status_socket,
            std::path::PathBuf::from("/run/cyphonic/node.sock")
        );
        assert_eq!(c.common.dataplane.batch_size, 32);
        assert!(c.common.cloud.is_none() && c.common.peers.is_empty());
        // A node certified for one address uses it.
        let f = fixture("100.64.3.7/32");
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(c.vip, Ipv4Addr::new(100, 64, 3, 7));
    }

    /// Issue 53: a certificate with an IPv6 block beside the IPv4 one gives the node its
    /// IPv6 address (the /128's, or a larger block's first host) in the root's /48; without
    /// one the node has no IPv6; IPv6 needs an inner MTU of 1280, said at the key.
    #[test]
    fn an_ipv6_block_gives_the_node_ipv6_in_the_overlays_range() {
        let minimal = "[node]\n\n[identity]\ncertificate = \"laptop.ovl.example.crt\"\nkey = \"laptop.ovl.example.key\"\nca = \"ca.crt\"\n";
        let overlay: Ipv6Net = "fd7a:0:1::/48".parse().unwrap();
        let f = fixture("100.64.3.7/32 fd7a:0:1:4000::9/128");
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(c.ipv6, Some(("fd7a:0:1:4000::9".parse().unwrap(), overlay)));
        let f = fixture("100.64.3.7/32 fd7a:0:1:4000::/64");
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(c.ipv6, Some(("fd7a:0:1:4000::1".parse().unwrap(), overlay)));
        let f = fixture("100.64.3.7/32");
        assert_eq!(load_text(&f, minimal).unwrap().0.ipv6, None);
        let f = fixture("100.64.3.7/32 fd7a:0:1:4000::9/128");
        let small = minimal.replace("[node]\n", "[node]\ninner_mtu = 1200\n");
        let e = load_text(&f, &small).unwrap_err().to_string();
        assert!(
            e.contains("key `node.inner_mtu`: 1200: the certificate holds an IPv6 block"),
            "{e}"
        );
    }

    /// `[userspace]`: the proxy and forwards parsed, the DNS stub on a free loopback port
    /// (our vIP is on no interface); each mistake named at its key: an address off loopback
    /// (the proxy acts as this node), a port twice, a target that is not a host and port or
    /// lies outside the overlay, a bound out of range, no way in at all.
    #[test]
    fn userspace_is_checked() {
        let f = fixture("100.64.3.0/24");
        let base = "[node]\n\n[identity]\ncertificate = \"laptop.ovl.example.crt\"\nkey = \"laptop.ovl.example.key\"\nca = \"ca.crt\"\n";
        let good = format!(
            "{base}[userspace]\nsocks5 = \"127.0.0.1:1080\"\n[[userspace.forward]]\nlisten = \"127.0.0.1:8554\"\nto = \"cam.gw1.ovl.example:554\"\n[[userspace.forward]]\nlisten = \"[::1]:2222\"\nto = \"100.64.1.20:22\"\n"
        );
        let (c, _) = load_text(&f, &good).unwrap();
        let u = c.userspace.clone().unwrap();
        assert_eq!(u.socks5, Some("127.0.0.1:1080".parse().unwrap()));
        assert_eq!(u.connections, 256);
        assert_eq!(
            u.forwards,
            [
                Forward {
                    listen: "127.0.0.1:8554".parse().unwrap(),
                    host: "cam.gw1.ovl.example".into(),
                    port: 554
                },
                Forward {
                    listen: "[::1]:2222".parse().unwrap(),
                    host: "100.64.1.20".into(),
                    port: 22
                },
            ]
        );
        assert_eq!(c.dns_listen, Some("127.0.0.1:0".parse().unwrap()));
        // Peers may ask the stub at our vIP (the stack takes their questions there), so the
        // DNS rule that every rule set starts with lets them.
        let vip: ipnet::IpNet = "100.64.3.1/32".parse().unwrap();
        assert!(
            c.common.dns_rules.iter().any(|r| r.to.contains(&vip)),
            "{:?}",
            c.common.dns_rules
        );
        let (tun, _) = load_text(&f, base).unwrap();
        assert_eq!(tun.userspace, None);
        // A reload names the keys that changed: each takes effect at a restart.
        let mut fewer = c.clone();
        if let Some(u) = fewer.userspace.as_mut() {
            u.forwards.pop();
        }
        assert_eq!(c.needs_restart(&fewer), ["userspace.forward"]);
        assert_eq!(
            c.needs_restart(&tun),
            [
                "dns.listen",
                "userspace.socks5",
                "userspace.connections",
                "userspace.forward"
            ]
        );

        let with = |table: &str| format!("{base}[userspace]\n{table}");
        for (table, expect) in [
            (
                "socks5 = \"0.0.0.0:1080\"\n",
                "key `userspace.socks5`: 0.0.0.0:1080: it acts as this node in the overlay: give a loopback address",
            ),
            (
                "socks5 = \"127.0.0.1:1080\"\n[[userspace.forward]]\nlisten = \"127.0.0.1:1080\"\nto = \"a.ovl.example:1\"\n",
                "key `userspace.forward[0].listen`: 127.0.0.1:1080: give a port of its own",
            ),
            (
                "[[userspace.forward]]\nlisten = \"127.0.0.1:22\"\nto = \"cam.gw1.ovl.example\"\n",
                "key `userspace.forward[0].to`: \"cam.gw1.ovl.example\" is not a name or address and a port",
            ),
            (
                "[[userspace.forward]]\nlisten = \"127.0.0.1:22\"\nto = \"fd7a::1:22\"\n",
                "key `userspace.forward[0].to`",
            ),
            (
                "[[userspace.forward]]\nlisten = \"127.0.0.1:22\"\nto = \"192.0.2.1:22\"\n",
                "key `userspace.forward[0].to`: 192.0.2.1 is not in the overlay",
            ),
            (
                "socks5 = \"127.0.0.1:1080\"\nconnections = 0\n",
                "key `userspace.connections`: 0 is outside 1..=4096",
            ),
            (
                "",
                "key `userspace.socks5`: give `socks5` or a `[[userspace.forward]]`",
            ),
        ] {
            let e = load_text(&f, &with(table)).unwrap_err().to_string();
            assert!(e.contains(expect), "{table}: {e}");
        }
    }

    /// Each mistake is reported with the file, its line and its key.
    #[test]
    fn mistakes_name_the_line_and_key() {
        let f = fixture("100.64.3.0/24");
        let vip_line = EXAMPLE
            .lines()
            .position(|l| l == "vip = \"100.64.3.1\"")
            .unwrap()
            + 1;
        let vip_error = format!(
            ":{vip_line}: key `node.vip`: 100.64.4.1 must be a host address inside the block 100.64.3.0/24"
        );
        let cases: &[(&str, &str, &str)] = &[
            ("vip = \"100.64.3.1\"", "vip = \"100.64.4.1\"", &vip_error),
            (
                "vip = \"100.64.3.1\"",
                "vip = \"100.64.3.255\"",
                "key `node.vip`",
            ),
            (
                "interface = \"cyo0\"",
                "interface = \"a-very-long-interface-name\"",
                "key `node.interface`: \"a-very-long-interface-name\" is not an interface name",
            ),
            (
                "overlay = \"100.64.0.0/10\"",
                "overlay = \"100.96.0.0/11\"",
                "key `node.overlay`: 100.96.0.0/11 does not contain",
            ),
            (
                "inner_mtu = 1420",
                "inner_mtu = 9000",
                "key `node.inner_mtu`: 9000 is outside 576..=1480",
            ),
            (
                "listen = \"100.64.3.1:53\"",
                "listen = \"0.0.0.0:53\"",
                "key `dns.listen`: 0.0.0.0:53: give the one address",
            ),
            (
                "upstream = []",
                "upstream = [\"100.64.1.1\"]",
                "key `dns.upstream[0]`: 100.64.1.1 cannot be an upstream resolver",
            ),
            (
                "buffers = 8192",
                "lan_buffer = 8192",
                "key `dataplane.lan_buffer`: unknown field `lan_buffer`",
            ),
            (
                "certificate = \"peers/gw1.ovl.example.crt\"",
                "certificate = \"laptop.ovl.example.crt\"",
                "key `peer[0].certificate`: this is our own certificate",
            ),
            ("[node]", "[nod]", "unknown field `nod`"),
        ];
        assert_mistakes(&f, EXAMPLE, cases, load, NOW);
        assert_mistakes(&f, EXAMPLE, SHARED_MISTAKES, load, NOW);
    }

    /// docs/configuration/node.md is the reference the declarations make.
    #[test]
    fn the_configuration_reference_is_current() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        cyphonic_settings::testing::assert_reference_current::<Raw>(&root, "node");
    }

    /// config/node.toml, the packages' /etc/cyphonic/node.toml, takes only keys the file
    /// has, and marks to fill in what has no value that works everywhere.
    #[test]
    fn the_starter_reads_and_marks_what_to_fill_in() {
        cyphonic_settings::testing::assert_starter::<Raw>(
            include_str!("../../../config/node.toml"),
            "config/node.toml",
            &["identity.token", "cloud.address", "cloud.public_key"],
        );
    }

    /// config/node.example.toml sets every key the code accepts.
    #[test]
    fn the_example_documents_every_key() {
        assert_documents_every_key::<Raw>(
            EXAMPLE,
            "config/node.example.toml",
            &[
                "userspace.socks5",
                "userspace.connections",
                "userspace.forward.listen",
                "userspace.forward.to",
            ],
        );
    }
}
