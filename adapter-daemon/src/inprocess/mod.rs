//! Two adapters in this process, each the production edge (capture, LAN sink, services,
//! gateway) on a LAN port that is one end of a socket pair, run by the production driver
//! (`cyphonic_daemon::run_on`) over an in-memory underlay: the tests play the devices on
//! the other ends. No root, no namespaces, no interface: the unit tier runs these.
//!
//! Here the pair of adapters and the devices' wires; `frames.rs` builds and reads the
//! devices' frames, `host.rs` is a device with a TCP/IP stack; the tests are in `lan.rs`,
//! `policy.rs` and `tcp.rs`.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use cyphonic_daemon::testing::RunningEnd;
use cyphonic_gateway::testutil::{checksums_ok, eth, ipv4_echo, ipv4_tcp, ipv4_udp};
use cyphonic_netio::{Interface, PacketSocket};
use cyphonic_settings::testing::{Fixture, Node};
use cyphonic_tunnel::testing::{Faults, Link};
use cyphonic_vip::testing::{DhcpOption, MessageType, client_message};
use dhcproto::Decodable as _;

use crate::edge::AdapterEdge;

mod frames;
mod host;
mod lan;
mod policy;
mod tcp;

use frames::*;

/// How long a test waits for what must happen; the wait ends as soon as it does.
const PATIENCE: Duration = Duration::from_secs(30);

const BROADCAST: [u8; 6] = [0xff; 6];

const ETH_IPV4: [u8; 2] = [0x08, 0x00];

const IP: usize = 14;

/// One adapter of the pair: its end, and the device on its LAN.
struct Site {
    end: RunningEnd,
    device: Device,
    gateway: Ipv4Addr,
}

impl Site {
    /// What the adapter's DNS service answers its device (at `ip`, its gateway's MAC
    /// `gw_mac`) for `qname`'s A record, asked with `id`.
    fn resolve(&self, (ip, gw_mac): (Ipv4Addr, [u8; 6]), id: u16, qname: &str) -> Vec<Ipv4Addr> {
        let query = dns_query(id, qname);
        let udp = ipv4_udp(ip.octets(), self.gateway.octets(), 5353, 53, &query);
        self.device.send(&eth(gw_mac, self.device.mac, &udp));
        let answer = self.device.expect("the answer", |f| {
            udp_payload(f, 5353).is_some_and(|p| dns_answer(p, id).is_some())
        });
        udp_payload(&answer, 5353)
            .and_then(|p| dns_answer(p, id))
            .expect("an answer")
    }
}

/// A device on an adapter's LAN: the other ends of its capture sockets (the bulk one's
/// first; with `dataplane.sparse_socket`, the sparse one's next). Every socket of a port
/// sees every frame and keeps what its filter keeps, as on an interface.
struct Device {
    wires: Vec<UnixDatagram>,
    mac: [u8; 6],
}

impl Device {
    /// Another device on the same wires, with MAC `mac`.
    fn beside(&self, mac: [u8; 6]) -> Self {
        Self {
            wires: self
                .wires
                .iter()
                .map(|w| w.try_clone().expect("a second handle"))
                .collect(),
            mac,
        }
    }

    /// Sends `frame` on every wire (waiting for room on a non-blocking one, as a NIC's
    /// queue would, up to [`PATIENCE`]).
    fn send(&self, frame: &[u8]) {
        let deadline = Instant::now() + PATIENCE;
        for wire in &self.wires {
            loop {
                match wire.send(frame) {
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        assert!(Instant::now() < deadline, "the LAN port stays full");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("the LAN port refuses the frame: {e}"),
                }
            }
        }
    }

    /// The next frame `want` picks (others, such as announcements, are passed over), within
    /// [`PATIENCE`].
    fn expect(&self, what: &str, want: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        self.expect_after(what, want).0
    }

    /// [`Self::expect`], and the frames passed over before it.
    fn expect_after(&self, what: &str, want: impl Fn(&[u8]) -> bool) -> (Vec<u8>, Vec<Vec<u8>>) {
        let deadline = Instant::now() + PATIENCE;
        let mut buf = vec![0u8; 65_536];
        for wire in &self.wires {
            wire.set_read_timeout(Some(Duration::from_millis(5)))
                .expect("a timeout");
        }
        let mut passed = Vec::new();
        while Instant::now() < deadline {
            for wire in &self.wires {
                if let Ok(n) = wire.recv(&mut buf) {
                    if want(&buf[..n]) {
                        return (buf[..n].to_vec(), passed);
                    }
                    passed.push(buf[..n].to_vec());
                }
            }
        }
        panic!(
            "{what}: not within {PATIENCE:?} ({} other frames)",
            passed.len()
        );
    }

    /// DISCOVER, OFFER, REQUEST, ACK with `hostname`: the address leased, and the gateway's
    /// MAC (the answers' source).
    fn lease(&self, hostname: &str) -> (Ipv4Addr, [u8; 6]) {
        let zero = Ipv4Addr::UNSPECIFIED;
        let ask = |kind, xid, opts| {
            let dhcp = client_message(kind, self.mac, xid, opts, zero, true);
            eth(
                BROADCAST,
                self.mac,
                &ipv4_udp(zero.octets(), [255; 4], 68, 67, &dhcp),
            )
        };
        let answer = |frame: &[u8], kind| {
            let m = dhcproto::v4::Message::from_bytes(udp_payload(frame, 68)?).ok()?;
            (m.opts().msg_type() == Some(kind) && m.chaddr().get(..6) == Some(&self.mac[..]))
                .then(|| (m.yiaddr(), m.siaddr()))
        };
        self.send(&ask(MessageType::Discover, 1, Vec::new()));
        let offer = self.expect("an offer", |f| answer(f, MessageType::Offer).is_some());
        let (ip, _) = answer(&offer, MessageType::Offer).expect("an offer");
        let server = dhcproto::v4::Message::from_bytes(udp_payload(&offer, 68).expect("udp"))
            .ok()
            .and_then(
                |m| match m.opts().get(dhcproto::v4::OptionCode::ServerIdentifier) {
                    Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
                    _ => None,
                },
            )
            .expect("the offer names its server");
        self.send(&ask(
            MessageType::Request,
            2,
            vec![
                DhcpOption::ServerIdentifier(server),
                DhcpOption::RequestedIpAddress(ip),
                DhcpOption::Hostname(hostname.into()),
            ],
        ));
        let ack = self.expect("an ack", |f| answer(f, MessageType::Ack).is_some());
        assert_eq!(answer(&ack, MessageType::Ack).map(|a| a.0), Some(ip));
        (ip, ack[6..12].try_into().expect("a MAC"))
    }
}

/// An adapter for `name` (block `100.64.n.0/24`, at `192.0.2.n` on `link`) with DHCP and
/// DNS, `peer` its static peer, shaped by `shape`, and the tables of `more`.
fn site(f: &Fixture, link: &Link, n: u8, peer: u8, (shape, more): (&Shape<'_>, &str)) -> Site {
    let dir = f.path().display();
    let (adapter, dataplane) = (shape.adapter, shape.dataplane);
    let text = format!(
        r#"
[adapter]
lan_interface = "lan{n}"
listen = "192.0.2.{n}:51820"
status_socket = "{dir}/adapter{n}.sock"
state_dir = "{dir}/state{n}"
{adapter}

[identity]
certificate = "gw{n}.ovl.example.crt"
key = "gw{n}.ovl.example.key"
ca = "ca.crt"

[dhcp]
enabled = true
pool = "100.64.{n}.100-100.64.{n}.199"

[dns]
enabled = true
upstream = []

[dataplane]
workers = 2
buffers = 1024
{dataplane}

[[peer]]
certificate = "gw{peer}.ovl.example.crt"
endpoint = "192.0.2.{peer}:51820"
dns = "100.64.{peer}.1"

{more}
"#
    );
    let path = f.write(&format!("adapter{n}.toml"), &text);
    start(&path, link, n)
}

/// Starts adapter `n` from the file at `path` (again, for a restart: its state directory
/// kept), with a device (MAC `02:bb:00:00:0n:0a`) on its LAN port.
fn start(path: &std::path::Path, link: &Link, n: u8) -> Site {
    let (config, identity) =
        crate::config::load(path, cyphonic_settings::now_secs()).expect("a valid file");
    // As AdapterEdge::open opens them: with the sparse class steered, the bulk socket
    // leaves it to the sparse ones.
    let name = format!("lan{n}");
    let dp = &config.common.dataplane;
    let bulk = dp.steers_sparse().then(|| crate::steer::lan_filter(false));
    let (port, wire) = PacketSocket::pair(&name, bulk.as_deref()).expect("a LAN port");
    let mut wires = vec![wire];
    let sparse_ports = dp
        .sparse_threads()
        .iter()
        .map(|_| {
            let sparse = crate::steer::lan_filter(true);
            let (port, wire) = PacketSocket::pair(&name, Some(&sparse)).expect("a LAN port");
            wires.push(wire);
            port
        })
        .collect();
    let socket = Box::new(link.socket(SocketAddr::from(([192, 0, 2, n], 51820))));
    let gateway = config.gateway_vip;
    let status = config.common.status_socket.clone();
    let iface = Interface {
        name: format!("lan{n}"),
        index: 0,
        mac: [0x02, 0xf0, 0, 0, 0, n],
        mtu: 1500,
        up: true,
    };
    let end = RunningEnd::start("cy-adapter", crate::PROGRAM, &status, move |signals| {
        let edge = AdapterEdge::on_ports(&config, iface, vec![port], sparse_ports, None);
        let reload = Box::new(|| anyhow::bail!("no reloads in this test"));
        let devices = cyphonic_daemon::Devices { socket, signals };
        cyphonic_daemon::run_on(&config.common, identity, edge, reload, devices)
    });
    Site {
        end,
        device: Device {
            wires,
            mac: [0x02, 0xbb, 0, 0, n, 10],
        },
        gateway,
    }
}

/// Two adapters, `gw1` and `gw2`, peers of each other; the sparse class read with the
/// rest (`sparse_socket = false`).
fn sites(link: &Link) -> (Fixture, Site, Site) {
    sites_with(link, "sparse_socket = false", ["", ""])
}

/// [`sites`], both adapters with `dataplane` in their `[dataplane]`, each one's file with
/// its tables of `more` besides.
fn sites_with(link: &Link, dataplane: &str, more: [&str; 2]) -> (Fixture, Site, Site) {
    sites_shaped(
        link,
        &Shape {
            dataplane,
            more,
            ..Shape::default()
        },
    )
}

/// What differs between the tests' pairs of adapters.
struct Shape<'a> {
    /// The certificates' blocks, gw1's and gw2's.
    blocks: [&'a str; 2],
    /// More keys in both files' `[adapter]`.
    adapter: &'a str,
    /// Keys in both files' `[dataplane]`.
    dataplane: &'a str,
    /// More tables in gw1's file and in gw2's.
    more: [&'a str; 2],
}

impl Default for Shape<'_> {
    fn default() -> Self {
        Self {
            blocks: ["100.64.1.0/24", "100.64.2.0/24"],
            adapter: "",
            dataplane: "sparse_socket = false",
            more: ["", ""],
        }
    }
}

/// Two adapters, `gw1` and `gw2`, peers of each other, as `shape` says.
fn sites_shaped(link: &Link, shape: &Shape<'_>) -> (Fixture, Site, Site) {
    let now = cyphonic_settings::now_secs();
    let nodes = [
        Node::keyed("gw1.ovl.example", shape.blocks[0]),
        Node::keyed("gw2.ovl.example", shape.blocks[1]),
    ];
    let f = Fixture::new("inprocess", now, &nodes);
    let (one, two) = (
        site(&f, link, 1, 2, (shape, shape.more[0])),
        site(&f, link, 2, 1, (shape, shape.more[1])),
    );
    (f, one, two)
}
