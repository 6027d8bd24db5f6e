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
}

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
        ])
    }
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
    let dns_listen = match (&common.dns, &raw.dns.listen) {
        (None, _) => None,
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
    // Peers ask the DNS stub when it listens on our vIP.
    let dns = dns_listen.and_then(|a| match a.ip() {
        std::net::IpAddr::V4(ip) if ip == vip => Some(ip),
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
    };
    Ok((config, identity))
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
        assert_documents_every_key::<Raw>(EXAMPLE, "config/node.example.toml", &[]);
    }
}
