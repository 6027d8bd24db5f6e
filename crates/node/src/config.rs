//! The node's configuration file: TOML, every key documented in config/node.example.toml,
//! safe defaults in code, errors that name the file, the line and the key. The tables it
//! shares with the adapter (`[identity]`, `[[peer]]`, `[cloud]`, the pipeline and DNS limits)
//! are checked by `cyphonic-settings`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use cyphonic_session::Identity;
pub use cyphonic_settings::{Cloud, ConfigError, Peer};
use cyphonic_settings::{RawCloud, RawIdentity, RawMetrics, RawPeer, Source};
use ipnet::Ipv4Net;
use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    node: RawNode,
    identity: RawIdentity,
    #[serde(default)]
    dns: RawDns,
    #[serde(default)]
    dataplane: RawDataplane,
    #[serde(default)]
    peer: Vec<RawPeer>,
    cloud: Option<RawCloud>,
    #[serde(default)]
    metrics: RawMetrics,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    #[serde(default = "default_interface")]
    interface: Spanned<String>,
    #[serde(default = "cyphonic_settings::defaults::listen")]
    listen: SocketAddr,
    vip: Option<Spanned<Ipv4Addr>>,
    #[serde(default = "cyphonic_settings::defaults::overlay")]
    overlay: Spanned<Ipv4Net>,
    #[serde(default = "cyphonic_settings::defaults::inner_mtu")]
    inner_mtu: Spanned<u16>,
    #[serde(default = "default_status_socket")]
    status_socket: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDns {
    #[serde(default = "cyphonic_settings::defaults::yes")]
    enabled: bool,
    listen: Option<Spanned<SocketAddr>>,
    #[serde(default)]
    upstream: Vec<Spanned<IpAddr>>,
    #[serde(default = "cyphonic_settings::defaults::dns_ttl")]
    ttl: Spanned<u32>,
}

impl Default for RawDns {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: None,
            upstream: Vec::new(),
            ttl: cyphonic_settings::defaults::dns_ttl(),
        }
    }
}

cyphonic_settings::dataplane_table! {
    /// `[dataplane]`: the keys every tunnel end has (the node adds none).
    struct RawDataplane {}
}

fn default_interface() -> Spanned<String> {
    Spanned::new(0..0, "cyo0".into())
}
fn default_status_socket() -> PathBuf {
    PathBuf::from("/run/cyphonic/node.sock")
}

/// The DNS stub for the overlay zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dns {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Resolvers for names outside the overlay; none means such queries are refused.
    pub upstream: Vec<IpAddr>,
    /// TTL of its answers, seconds.
    pub ttl: u32,
}

/// Everything the node needs to run, checked.
#[derive(Debug)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// The TUN interface's name.
    pub interface: String,
    /// The tunnel's UDP address.
    pub listen: SocketAddr,
    /// Our overlay address.
    pub vip: Ipv4Addr,
    /// Our certified block (the first IPv4 one).
    pub block: Ipv4Net,
    /// The whole overlay: routed through the TUN interface.
    pub overlay: Ipv4Net,
    /// The TUN interface's MTU.
    pub inner_mtu: u16,
    /// The status socket.
    pub status_socket: PathBuf,
    /// The overlay's domain.
    pub overlay_domain: String,
    /// The DNS stub, unless switched off.
    pub dns: Option<Dns>,
    /// Data-plane tuning.
    pub dataplane: cyphonic_settings::Dataplane,
    /// Static peers.
    pub peers: Vec<Peer>,
    /// The control plane, if this node uses one.
    pub cloud: Option<Cloud>,
    /// Where the Prometheus endpoint listens; off without.
    pub metrics: Option<SocketAddr>,
}

/// Reads, parses and checks the configuration at `path` at unix time `now_secs`, with the
/// certificates and keys it names. Returns the configuration and our identity.
///
/// # Errors
/// A [`ConfigError`] naming the file, and where possible the line and key.
pub fn load(path: &Path, now_secs: u64) -> Result<(Config, Identity), ConfigError> {
    let (raw, text): (Raw, String) = cyphonic_settings::parse(path)?;
    check(
        &Source {
            path,
            text: &text,
            now_secs,
        },
        &raw,
    )
}

fn check(src: &Source<'_>, raw: &Raw) -> Result<(Config, Identity), ConfigError> {
    let n = &raw.node;
    let identity = raw.identity.load(src)?;
    let cert = identity.certificate().clone();
    let Some(block) = cyphonic_settings::first_v4_block(&cert) else {
        return src.err(
            &raw.identity.certificate_span(),
            "identity.certificate",
            "the certificate names no IPv4 vIP block",
        );
    };
    let interface = n.interface.get_ref();
    if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ', '\0']) {
        return src.err(
            &n.interface.span(),
            "node.interface",
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
            "node.vip",
            format!(
                "{vip} must be a host address inside the block {block} certified to {}",
                cert.body().name
            ),
        );
    }
    let overlay = *n.overlay.get_ref();
    if !overlay.contains(&block) {
        return src.err(
            &n.overlay.span(),
            "node.overlay",
            format!("{overlay} does not contain this node's block {block}"),
        );
    }
    let mtu = cyphonic_settings::check_mtu(src, &n.inner_mtu, "node.inner_mtu")?;
    let peers = cyphonic_settings::peers(src, &raw.peer, &identity, block)?;
    let dns = if raw.dns.enabled {
        let upstream = cyphonic_settings::check_dns(src, &raw.dns.upstream, &raw.dns.ttl, overlay)?;
        let listen = match &raw.dns.listen {
            Some(l) => {
                let a = *l.get_ref();
                if a.ip().is_unspecified() || a.ip().is_multicast() {
                    return src.err(
                        &l.span(),
                        "dns.listen",
                        format!("{a}: give the one address the stub answers on"),
                    );
                }
                a
            }
            None => SocketAddr::from((vip, 53)),
        };
        Some(Dns {
            listen,
            upstream,
            ttl: *raw.dns.ttl.get_ref(),
        })
    } else {
        None
    };
    let dataplane = raw.dataplane.shared(src)?;
    let cloud = raw.cloud.as_ref().map(|c| c.check(src)).transpose()?;
    let metrics = raw.metrics.check(src)?;
    let config = Config {
        path: src.path.to_owned(),
        interface: interface.clone(),
        listen: n.listen,
        vip,
        block,
        overlay,
        inner_mtu: mtu,
        status_socket: src.resolve(&n.status_socket),
        overlay_domain: cyphonic_settings::overlay_domain(&identity),
        dns,
        dataplane,
        peers,
        cloud,
        metrics,
    };
    Ok((config, identity))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicU32, Ordering};

    use cyphonic_settings::testing::Node;

    use super::*;

    const NOW: u64 = 1_800_000_000;
    const EXAMPLE: &str = include_str!("../../../config/node.example.toml");

    /// A directory with a CA, the node's key and certificate (100.64.3.0/24), an adapter's
    /// certificate and the example, as its relative paths expect. Removed on drop.
    struct Fixture(PathBuf);

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fixture(node_block: &str) -> Fixture {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cyphonic-node-config-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        cyphonic_settings::testing::write_pki(
            &dir,
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
        );
        Fixture(dir)
    }

    fn load_text(f: &Fixture, text: &str) -> Result<(Config, Identity), ConfigError> {
        let path = f.0.join("node.toml");
        std::fs::write(&path, text).unwrap();
        load(&path, NOW)
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
        assert_eq!(c.block.to_string(), "100.64.3.0/24");
        assert_eq!(c.peers.len(), 1);
        assert_eq!(c.peers[0].dns, Ipv4Addr::new(100, 64, 1, 1));
        assert_eq!(c.overlay_domain, "ovl.example");
        assert!(c.cloud.is_some());
        assert_eq!(
            c.dns.as_ref().map(|d| d.listen),
            Some("100.64.3.1:53".parse().unwrap())
        );

        let minimal = "[node]\n\n[identity]\ncertificate = \"laptop.ovl.example.crt\"\nkey = \"laptop.ovl.example.key\"\nca = \"ca.crt\"\n";
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(
            (c.vip, c.inner_mtu, c.listen.port()),
            (Ipv4Addr::new(100, 64, 3, 1), 1420, 51820)
        );
        assert_eq!(
            c.dns,
            Some(Dns {
                listen: "100.64.3.1:53".parse().unwrap(),
                upstream: vec![],
                ttl: 60
            })
        );
        assert_eq!(c.dataplane.batch_size, 32);
        assert!(c.cloud.is_none() && c.peers.is_empty());
        // A node certified for one address uses it.
        let f = fixture("100.64.3.7/32");
        let (c, _) = load_text(&f, minimal).unwrap();
        assert_eq!(c.vip, Ipv4Addr::new(100, 64, 3, 7));
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
                "batch_size = 32",
                "batch_size = 0",
                "key `dataplane.batch_size`: 0 is outside 1..=1024",
            ),
            (
                "cpus = []",
                "cpus = [1, 3, 1]",
                "key `dataplane.cpus`: CPU 1 is listed twice",
            ),
            (
                "cpus = []",
                "cpus = [1024]",
                "key `dataplane.cpus`: CPU 1024 is over 1023",
            ),
            (
                "realtime_priority = 0",
                "realtime_priority = 100",
                "key `dataplane.realtime_priority`: 100 is outside 0 (off) ..= 99",
            ),
            (
                "busy_poll_us = 0",
                "busy_poll_us = 1000001",
                "key `dataplane.busy_poll_us`: 1000001 is outside 0 (off) ..= 1000000",
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
            (
                "public_key = \"5b0f",
                "public_key = \"zz0f",
                "key `cloud.public_key`: expected the 64 hex digits",
            ),
            ("[node]", "[nod]", "unknown field `nod`"),
        ];
        for (from, to, expect) in cases {
            assert!(EXAMPLE.contains(from), "the example lost {from:?}");
            let err = load_text(&f, &EXAMPLE.replacen(from, to, 1))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expect),
                "{from:?} -> {to:?}\n  got:  {err}\n  want: {expect}"
            );
        }
    }

    /// config/node.example.toml sets every key the code accepts.
    #[test]
    fn the_example_documents_every_key() {
        let probe = |table: &str| match table {
            "" => "__probe = 1\n".to_owned(),
            "cloud" => {
                "[cloud]\naddress = \"192.0.2.1:1\"\npublic_key = \"\"\n__probe = 1\n".to_owned()
            }
            "peer" => "[[peer]]\n__probe = 1\n".to_owned(),
            t => format!("[{t}]\n__probe = 1\n"),
        };
        assert_eq!(
            cyphonic_settings::accepted_keys::<Raw>(&probe("")),
            [
                "node",
                "identity",
                "dns",
                "dataplane",
                "peer",
                "cloud",
                "metrics"
            ]
        );
        let missing = cyphonic_settings::undocumented_keys::<Raw>(EXAMPLE, probe);
        assert!(
            missing.is_empty(),
            "config/node.example.toml does not show {missing:?}"
        );
    }
}
