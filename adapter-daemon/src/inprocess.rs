//! Two adapters in this process, each the production edge (capture, LAN sink, services,
//! gateway) on a LAN port that is one end of a socket pair, run by the production driver
//! (`cyphonic_daemon::run_on`) over an in-memory underlay: the tests play the devices on
//! the other ends. No root, no namespaces, no interface: the unit tier runs these.

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

/// The UDP payload of `frame` (Ethernet, IPv4) to `port`, if it is one.
fn udp_payload(frame: &[u8], port: u16) -> Option<&[u8]> {
    let ip = ipv4(frame)?;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let udp = ip.get(ihl..)?;
    (ip[9] == 17 && udp.get(2..4)? == port.to_be_bytes()).then(|| udp.get(8..))?
}

/// The IPv4 packet in `frame`, if it carries one.
fn ipv4(frame: &[u8]) -> Option<&[u8]> {
    (frame.get(12..14)? == ETH_IPV4).then(|| frame.get(IP..))?
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

/// An ICMP echo request in `frame` from `src` to `dst`, whole and with right checksums.
fn is_echo(frame: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> bool {
    ipv4(frame).is_some_and(|ip| {
        ip[9] == 1
            && ip[12..16] == src.octets()
            && ip[16..20] == dst.octets()
            && ip[20] == 8
            && checksums_ok(ip)
    })
}

/// A device on each LAN gets its lease from its adapter; a ping from each crosses the
/// tunnel (capture, the engine both ways, the LAN sink) to the other, addressed to the
/// device's MAC from its gateway's, TTL down by two (each gateway a hop); both adapters' status show the lease
/// and the peer with keys.
#[test]
fn devices_on_two_adapters_lease_and_ping_each_other() {
    let link = Link::new(1);
    let (_f, mut one, mut two) = sites(&link);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, gw2_mac) = two.device.lease("sensor-two");
    assert!(one.gateway == Ipv4Addr::new(100, 64, 1, 1) && ip1 != one.gateway);
    assert!(ip2.octets()[..3] == [100, 64, 2]);

    let ping = |from: &Site, src: Ipv4Addr, gw_mac, dst: Ipv4Addr, to: &Site| {
        let echo = ipv4_echo(src.octets(), dst.octets(), b"hello");
        from.device.send(&eth(gw_mac, from.device.mac, &echo));
        to.device
            .expect("the ping across", |f| is_echo(f, src, dst))
    };
    let got = ping(&one, ip1, gw1_mac, ip2, &two);
    assert_eq!(got[..6], two.device.mac, "to the device's MAC");
    assert_eq!(got[6..12], gw2_mac, "from its gateway's");
    assert_eq!(got[IP + 8], 62, "each gateway is a hop");
    ping(&two, ip2, gw2_mac, ip1, &one);

    let leased = |d: &serde_json::Value, ip: Ipv4Addr, host: &str| {
        d["leases"].as_array().is_some_and(|l| {
            l.iter().any(|l| {
                l["vip"].as_str() == Some(&ip.to_string()) && l["hostname"].as_str() == Some(host)
            })
        })
    };
    let doc = one
        .end
        .wait_status(PATIENCE, |d| leased(d, ip1, "sensor-one"))
        .expect("gw1 shows the lease");
    let peer = &doc["peers"][0];
    assert_eq!(
        (peer["name"].as_str(), peer["established"].as_bool()),
        (Some("gw2.ovl.example"), Some(true)),
        "{doc}"
    );
    two.end
        .wait_status(PATIENCE, |d| leased(d, ip2, "sensor-two"))
        .expect("gw2 shows the lease");
    one.end.stop().expect("gw1 stops cleanly");
    two.end.stop().expect("gw2 stops cleanly");
}

/// A DNS question for `qname`'s A record, with `id`.
fn dns_query(id: u16, qname: &str) -> Vec<u8> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(
        Name::from_ascii(qname).expect("a name"),
        RecordType::A,
    ));
    m.to_vec().expect("a query")
}

/// The answer with `id` in `payload`: its A records.
fn dns_answer(payload: &[u8], id: u16) -> Option<Vec<Ipv4Addr>> {
    use hickory_proto::rr::RData;
    let m = hickory_proto::op::Message::from_vec(payload).ok()?;
    (m.metadata.id == id).then(|| {
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect()
    })
}

/// The far gateway answers a device's ping through the tunnel (the gateway address's
/// service on the far adapter); the device's own DNS service asks the far one, through the
/// tunnel, for the far device's name (its DHCP hostname in the far zone) and answers with
/// its lease.
#[test]
fn a_device_pings_the_far_gateway_and_resolves_the_far_device_by_name() {
    let link = Link::new(2);
    let (_f, one, two) = sites(&link);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, _) = two.device.lease("sensor-two");
    let far = two.gateway;

    let echo = ipv4_echo(ip1.octets(), far.octets(), b"gateway?");
    one.device.send(&eth(gw1_mac, one.device.mac, &echo));
    let reply = one.device.expect("the far gateway's echo reply", |f| {
        ipv4(f).is_some_and(|ip| {
            ip[9] == 1
                && ip[12..16] == far.octets()
                && ip[16..20] == ip1.octets()
                && ip[20] == 0
                && checksums_ok(ip)
        })
    });
    assert_eq!(reply[..6], one.device.mac);

    let answered = one.resolve((ip1, gw1_mac), 0x4242, "sensor-two.gw2.ovl.example.");
    assert_eq!(answered, vec![ip2], "the far device's lease");
}

/// The MSS option of the TCP segment in `ip`, if it has one.
fn mss(ip: &[u8]) -> Option<u16> {
    let tcp = ip.get(usize::from(ip[0] & 0x0f) * 4..)?;
    let end = usize::from(tcp.get(12)? >> 4) * 4;
    let mut options = tcp.get(20..end)?;
    while let Some(&kind) = options.first() {
        match kind {
            0 => return None,
            1 => options = &options[1..],
            2 => return Some(u16::from_be_bytes(options.get(2..4)?.try_into().ok()?)),
            _ => options = options.get(usize::from(*options.get(1)?).max(2)..)?,
        }
    }
    None
}

/// A SYN's MSS is clamped to what the tunnel carries (inner MTU 1420 less 40) on its way
/// across; a packet too big for the tunnel with don't-fragment set is answered by the
/// device's own gateway with fragmentation-needed naming the inner MTU, and goes nowhere.
#[test]
fn a_syn_is_clamped_and_a_packet_too_big_is_answered_with_the_mtu() {
    let link = Link::new(3);
    let (_f, one, two) = sites(&link);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, _) = two.device.lease("sensor-two");

    let syn = ipv4_tcp(ip1.octets(), ip2.octets(), 0x02, Some(1460), &[]);
    one.device.send(&eth(gw1_mac, one.device.mac, &syn));
    let got = two.device.expect("the SYN across", |f| {
        ipv4(f).is_some_and(|ip| ip[9] == 6 && ip[12..16] == ip1.octets())
    });
    let ip = ipv4(&got).expect("IPv4");
    assert_eq!(mss(ip), Some(1380), "clamped to 1420 - 40");
    assert!(checksums_ok(ip), "the checksum follows the new MSS");

    let big = ipv4_udp(ip1.octets(), ip2.octets(), 4000, 4001, &[0x5a; 1472]);
    one.device.send(&eth(gw1_mac, one.device.mac, &big));
    let error = one.device.expect("fragmentation needed", |f| {
        ipv4(f).is_some_and(|ip| ip[9] == 1 && ip[20] == 3 && ip[21] == 4)
    });
    let ip = ipv4(&error).expect("IPv4");
    assert_eq!(ip[12..16], one.gateway.octets(), "from the gateway");
    assert_eq!(ip[16..20], ip1.octets(), "to the sender");
    assert_eq!(
        u16::from_be_bytes([ip[26], ip[27]]),
        1420,
        "the next hop's MTU"
    );
    assert!(checksums_ok(ip));
    assert_eq!(
        ip[28 + 12..28 + 20],
        big[12..20],
        "it quotes the packet's addresses"
    );
}

/// A restarted adapter keeps its leases (its state directory): the device asking again
/// after the restart, before any other, is given the address it had, not the first free
/// one.
#[test]
fn a_restarted_adapter_gives_a_device_its_address_again() {
    let link = Link::new(4);
    let (f, one, two) = sites(&link);
    let (first, _) = one.device.beside([0x02, 0xbb, 0, 0, 1, 11]).lease("first");
    let (ip1, _) = one.device.lease("sensor-one");
    assert_ne!(ip1, first);
    one.end.stop().expect("gw1 stops cleanly");
    let again = start(&f.path().join("adapter1.toml"), &link, 1);
    let (ip, _) = again.device.lease("sensor-one");
    assert_eq!(ip, ip1, "the same address after the restart");
    drop(two);
}

/// A UDP datagram in `frame` from `src` to `dst`:`port`.
fn is_udp(frame: &[u8], src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> bool {
    ipv4(frame).is_some_and(|ip| {
        ip[9] == 17
            && ip[12..16] == src.octets()
            && ip[16..20] == dst.octets()
            && ip[22..24] == port.to_be_bytes()
    })
}

/// The per-device policy holds at both ends: gw1 lets every flow between the two blocks
/// start, gw2 only UDP to port 5000 into its own block. A flow gw2 allows crosses and its
/// answers come back; a flow gw1 lets out is stopped on arrival at gw2; a flow gw2's device
/// starts is stopped before it leaves. Each stop is counted where it happened.
#[test]
fn the_policy_holds_at_both_ends() {
    let open = r#"
[policy]
[[policy.rule]]
from = ["100.64.1.0/24", "100.64.2.0/24"]
to = ["100.64.1.0/24", "100.64.2.0/24"]
allow = ["any"]
"#;
    let strict = r#"
[policy]
[[policy.rule]]
from = ["100.64.1.0/24"]
to = ["100.64.2.0/24"]
allow = ["udp/5000"]
"#;
    let link = Link::new(5);
    let (_f, one, mut two) = sites_with(&link, "sparse_socket = false", [open, strict]);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, gw2_mac) = two.device.lease("sensor-two");
    let send = |from: &Site, gw, src: Ipv4Addr, dst: Ipv4Addr, (sport, dport)| {
        let udp = ipv4_udp(src.octets(), dst.octets(), sport, dport, b"policy");
        from.device.send(&eth(gw, from.device.mac, &udp));
    };

    // Refused on arrival at gw2, then an allowed flow behind it: only the allowed one comes.
    send(&one, gw1_mac, ip1, ip2, (4000, 6000));
    send(&one, gw1_mac, ip1, ip2, (4000, 5000));
    let (_, before) = two
        .device
        .expect_after("the allowed flow", |f| is_udp(f, ip1, ip2, 5000));
    assert!(
        !before.iter().any(|f| is_udp(f, ip1, ip2, 6000)),
        "gw2 let in a flow its policy refuses"
    );
    // Its answer comes back (the flow is open both ways at both ends)...
    send(&two, gw2_mac, ip2, ip1, (5000, 4000));
    one.device
        .expect("the answer", |f| is_udp(f, ip2, ip1, 4000));
    // ... but a flow gw2's device starts does not leave gw2.
    send(&two, gw2_mac, ip2, ip1, (4100, 7000));
    send(&one, gw1_mac, ip1, ip2, (4001, 5000));
    two.device
        .expect("the second allowed flow", |f| is_udp(f, ip1, ip2, 5000));
    send(&two, gw2_mac, ip2, ip1, (5000, 4001));
    let (_, before) = one
        .device
        .expect_after("its answer", |f| is_udp(f, ip2, ip1, 4001));
    assert!(
        !before.iter().any(|f| is_udp(f, ip2, ip1, 7000)),
        "gw2 let out a flow its policy refuses"
    );

    // gw2 refused two flows, one of them on arrival; gw1 none.
    let refused = |d: &serde_json::Value, way: &str| d["policy"][way]["no_rule"].as_u64();
    let doc = two
        .end
        .wait_status(PATIENCE, |d| refused(d, "dropped") == Some(2))
        .expect("gw2 counts two flows refused");
    assert_eq!(refused(&doc, "dropped_in"), Some(1), "{}", doc["policy"]);
    assert_eq!(doc["counters"]["drop_policy"].as_u64(), Some(2));
    let doc = one.end.status().expect("gw1 answers");
    assert_eq!(refused(&doc, "dropped"), Some(0), "{}", doc["policy"]);
    assert_eq!(
        doc["policy"]["opened"].as_u64(),
        Some(3),
        "{}",
        doc["policy"]
    );
}

/// With the sparse class in sockets and threads of its own (`sparse_socket`, one thread):
/// the bulk socket never sees ARP, ICMP, DHCP or DNS, so the lease, the pings and the name
/// can only have come through the sparse sockets' threads; a bulk flow through the bulk
/// socket beside them. The pipelines count the sparse packets in their express lanes.
#[test]
fn the_sparse_class_crosses_in_its_own_lane() {
    let link = Link::new(6);
    let dataplane = "sparse_socket = true\nsparse_per_cpu = false";
    let (_f, mut one, two) = sites_with(&link, dataplane, ["", ""]);
    assert_eq!(one.device.wires.len(), 2, "a bulk and a sparse socket");
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, gw2_mac) = two.device.lease("sensor-two");
    for (from, src, gw, dst, to) in [
        (&one, ip1, gw1_mac, ip2, &two),
        (&two, ip2, gw2_mac, ip1, &one),
    ] {
        let echo = ipv4_echo(src.octets(), dst.octets(), b"sparse");
        from.device.send(&eth(gw, from.device.mac, &echo));
        to.device
            .expect("the ping across", |f| is_echo(f, src, dst));
    }
    let answered = one.resolve((ip1, gw1_mac), 0x5151, "sensor-two.gw2.ovl.example.");
    assert_eq!(answered, vec![ip2]);
    let bulk = ipv4_udp(ip1.octets(), ip2.octets(), 4000, 4001, b"bulk");
    one.device.send(&eth(gw1_mac, one.device.mac, &bulk));
    two.device
        .expect("the bulk datagram", |f| is_udp(f, ip1, ip2, 4001));

    // gw1 sent the ping, its DNS question and the bulk datagram, the first two in the
    // express lane; it received the ping back and the answer, both express.
    let counts = |d: &serde_json::Value, way: &str| {
        let p = &d["pipelines"][way];
        (p["submitted"].as_u64(), p["express"].as_u64())
    };
    let doc = one
        .end
        .wait_status(PATIENCE, |d| counts(d, "egress") == (Some(3), Some(2)))
        .expect("gw1's egress took the sparse packets ahead");
    assert_eq!(
        counts(&doc, "ingress"),
        (Some(2), Some(2)),
        "{}",
        doc["pipelines"]
    );
}

/// An ARP request from `mac` at `sender` for `target`, built by hand (not by the code
/// under test).
fn arp_request(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&BROADCAST);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}

/// A site as it is: a PLC with a fixed address in 192.0.2.0/28 behind gw1 (`[legacy]`,
/// mapped onto 100.64.1.224/28) finds its old gateway address answered, pings a device
/// behind gw2, which sees it at its mapped overlay address (.229 for .5) and answers
/// there; the answer reaches the PLC at its own address.
#[test]
fn a_fixed_address_device_reaches_the_far_site_under_its_mapped_address() {
    let legacy = r#"
[legacy]
subnet = "192.0.2.0/28"
onto = "100.64.1.224/28"
gateway = "192.0.2.1"
learn = false

[[legacy.device]]
name = "plc1"
mac = "02:00:5e:10:00:14"
address = "192.0.2.5"
"#;
    let link = Link::new(7);
    let (_f, one, two) = sites_with(&link, "sparse_socket = false", [legacy, ""]);
    let plc = one.device.beside([0x02, 0x00, 0x5e, 0x10, 0x00, 0x14]);
    let (plc_ip, old_gateway) = (Ipv4Addr::new(192, 0, 2, 5), Ipv4Addr::new(192, 0, 2, 1));
    let mapped = Ipv4Addr::new(100, 64, 1, 229);
    let (ip2, gw2_mac) = two.device.lease("sensor-two");

    plc.send(&arp_request(plc.mac, plc_ip, old_gateway));
    let reply = plc.expect("the old gateway's ARP reply", |f| {
        f.get(12..14) == Some(&[0x08, 0x06][..])
            && f.get(20..22) == Some(&[0, 2][..])
            && f.get(28..32) == Some(&old_gateway.octets()[..])
            && f.get(32..38) == Some(&plc.mac[..])
    });
    let gw_mac: [u8; 6] = reply[22..28].try_into().expect("a MAC");

    let echo = ipv4_echo(plc_ip.octets(), ip2.octets(), b"plc");
    plc.send(&eth(gw_mac, plc.mac, &echo));
    two.device
        .expect("the PLC's ping, mapped", |f| is_echo(f, mapped, ip2));
    let back = ipv4_echo(ip2.octets(), mapped.octets(), b"back");
    two.device.send(&eth(gw2_mac, two.device.mac, &back));
    let got = plc.expect("the answer at the PLC's own address", |f| {
        is_echo(f, ip2, plc_ip)
    });
    assert_eq!(got[..6], plc.mac, "to the PLC's MAC");
}

/// A device with a TCP/IP stack (smoltcp, over IP: the test wraps and unwraps the Ethernet
/// header with the device's and its gateway's MACs), on its wires.
struct Host {
    device: Device,
    gw_mac: [u8; 6],
    iface: smoltcp::iface::Interface,
    queues: Queues,
    sockets: smoltcp::iface::SocketSet<'static>,
    started: Instant,
}

/// The packets between a [`Host`]'s stack and its wires.
#[derive(Default)]
struct Queues {
    rx: std::collections::VecDeque<Vec<u8>>,
    tx: std::collections::VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut std::collections::VecDeque<Vec<u8>>);

impl smoltcp::phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}

impl smoltcp::phy::Device for Queues {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(Rx, Tx<'_>)> {
        let packet = self.rx.pop_front()?;
        Some((Rx(packet), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> smoltcp::phy::DeviceCapabilities {
        let mut caps = smoltcp::phy::DeviceCapabilities::default();
        caps.medium = smoltcp::phy::Medium::Ip;
        caps.max_transmission_unit = 1500;
        caps
    }
}

impl Host {
    /// `device`, leased at `ip` behind the gateway at `gw_mac`, with a stack: every overlay
    /// address on its link (the gateway's MAC takes them all).
    fn new(device: Device, ip: Ipv4Addr, gw_mac: [u8; 6]) -> Self {
        use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr};
        for wire in &device.wires {
            wire.set_nonblocking(true).expect("non-blocking");
        }
        let mut queues = Queues::default();
        let config = smoltcp::iface::Config::new(HardwareAddress::Ip);
        let mut iface =
            smoltcp::iface::Interface::new(config, &mut queues, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|ips| {
            let _ = ips.push(IpCidr::new(IpAddress::Ipv4(ip), 10));
        });
        Self {
            device,
            gw_mac,
            iface,
            queues,
            sockets: smoltcp::iface::SocketSet::new(Vec::new()),
            started: Instant::now(),
        }
    }

    /// A TCP socket with 64-KiB buffers each way.
    fn tcp(&mut self) -> smoltcp::iface::SocketHandle {
        use smoltcp::socket::tcp;
        let buffer = || tcp::SocketBuffer::new(vec![0; 65_536]);
        self.sockets.add(tcp::Socket::new(buffer(), buffer()))
    }

    fn socket(
        &mut self,
        h: smoltcp::iface::SocketHandle,
    ) -> &mut smoltcp::socket::tcp::Socket<'static> {
        self.sockets
            .get_mut::<smoltcp::socket::tcp::Socket<'static>>(h)
    }

    /// Frames in (those for its MAC, unwrapped), the stack run, packets out (wrapped).
    fn pump(&mut self) {
        let mut buf = vec![0u8; 65_536];
        for wire in &self.device.wires {
            while let Ok(n) = wire.recv(&mut buf) {
                let frame = &buf[..n];
                if frame[..6] == self.device.mac && ipv4(frame).is_some() {
                    self.queues.rx.push_back(frame[IP..].to_vec());
                }
            }
        }
        let now = smoltcp::time::Instant::from_micros(
            i64::try_from(self.started.elapsed().as_micros()).unwrap_or(i64::MAX),
        );
        self.iface.poll(now, &mut self.queues, &mut self.sockets);
        while let Some(packet) = self.queues.tx.pop_front() {
            self.device
                .send(&eth(self.gw_mac, self.device.mac, &packet));
        }
    }
}

/// A short TCP transfer between stacks on devices behind the two adapters: 256 KiB from
/// gw1's side to gw2's, whole and in order (the handshake's MSS clamped on the way, the
/// segments through both pipelines).
#[test]
fn a_tcp_transfer_crosses_whole() {
    let link = Link::new(8);
    let _ = tcp_transfer(&link, 256 * 1024);
}

/// 128 KiB over an underlay that loses, duplicates, corrupts and reorders datagrams: the
/// tunnel refuses the duplicates as replays and the corrupted as forgeries (counted), TCP
/// sends again what was lost, and the bytes arrive whole and in order.
#[test]
fn a_tcp_transfer_crosses_a_faulty_underlay_whole() {
    let link = Link::new(9);
    link.set_faults(Faults {
        drop: 0.05,
        duplicate: 0.05,
        corrupt: 0.05,
        reorder: 0.1,
        ..Faults::default()
    });
    let docs = tcp_transfer(&link, 128 * 1024);
    let stats = link.stats();
    assert!(
        stats.dropped > 0 && stats.duplicated > 0 && stats.corrupted > 0 && stats.reordered > 0,
        "{stats:?}"
    );
    // The duplicates were refused as replays and the corrupted as forgeries, by the
    // tunnel, before the LAN: a replayed or forged frame never reaches a device.
    let dropped = |why: &str| -> u64 {
        docs.iter()
            .map(|d| {
                d["pipelines"]["ingress"]["drops"][why]
                    .as_u64()
                    .expect("a drop count")
            })
            .sum()
    };
    let (replays, forged) = (dropped("replay"), dropped("auth"));
    assert!(
        (1..=stats.duplicated).contains(&replays),
        "{replays} replays, {stats:?}"
    );
    assert!(
        (1..=stats.corrupted).contains(&forged),
        "{forged} forged, {stats:?}"
    );
}

/// `size` bytes over TCP from a device behind gw1 to one behind gw2, on `link`; the two
/// adapters' status documents after it.
fn tcp_transfer(link: &Link, size: usize) -> [serde_json::Value; 2] {
    let (_f, one, two) = sites(link);
    let (ip1, gw1_mac) = one.device.lease("client");
    let (ip2, gw2_mac) = two.device.lease("server");
    let mut client = Host::new(one.device, ip1, gw1_mac);
    let mut server = Host::new(two.device, ip2, gw2_mac);
    let (c, s) = (client.tcp(), server.tcp());
    server.socket(s).listen(7000).expect("a listener");
    let cx = client.iface.context();
    client
        .sockets
        .get_mut::<smoltcp::socket::tcp::Socket<'static>>(c)
        .connect(cx, (smoltcp::wire::IpAddress::Ipv4(ip2), 7000), 49_152)
        .expect("a connection");

    let data: Vec<u8> = (0..size)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    let (mut sent, mut got) = (0, Vec::with_capacity(size));
    let mut chunk = vec![0u8; 65_536];
    let deadline = Instant::now() + PATIENCE;
    while got.len() < size {
        assert!(
            Instant::now() < deadline,
            "{} of {size} bytes within {PATIENCE:?} ({sent} sent)",
            got.len()
        );
        client.pump();
        server.pump();
        let socket = client.socket(c);
        if socket.can_send() && sent < size {
            sent += socket.send_slice(&data[sent..]).expect("sent");
        }
        let socket = server.socket(s);
        while socket.can_recv() {
            let n = socket.recv_slice(&mut chunk).expect("received");
            got.extend_from_slice(&chunk[..n]);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(got == data, "the bytes arrived whole and in order");
    assert_eq!(
        client.socket(c).remote_endpoint().map(|e| e.port),
        Some(7000)
    );
    [&one.end, &two.end].map(|end| end.status().expect("the adapter answers"))
}

/// An ICMPv6 echo request from `src` to `dst` (hop limit 64), its checksum by pnet.
fn ipv6_echo(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr, data: &[u8]) -> Vec<u8> {
    let mut icmp = vec![128, 0, 0, 0, 0x12, 0x34, 0, 1];
    icmp.extend_from_slice(data);
    let sum = pnet_packet::util::ipv6_checksum(
        &icmp,
        1,
        &[],
        &src,
        &dst,
        pnet_packet::ip::IpNextHeaderProtocols::Icmpv6,
    );
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&u16::try_from(icmp.len()).unwrap_or(0).to_be_bytes());
    p.extend_from_slice(&[58, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&icmp);
    p
}

/// An Ethernet frame carrying the IPv6 packet `ip`.
fn eth6(dst: [u8; 6], src: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + ip.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.extend_from_slice(ip);
    f
}

/// The ICMPv6 message in `frame` from `src` to `dst` of type `kind`, with its checksum
/// right, if it is one.
fn icmp6(
    frame: &[u8],
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    kind: u8,
) -> Option<&[u8]> {
    let ip = (frame.get(12..14)? == [0x86, 0xdd]).then(|| frame.get(IP..))??;
    let icmp = ip.get(40..)?;
    let ok = ip[6] == 58
        && ip[8..24] == src.octets()
        && ip[24..40] == dst.octets()
        && icmp[0] == kind
        && pnet_packet::util::ipv6_checksum(
            icmp,
            1,
            &[],
            &src,
            &dst,
            pnet_packet::ip::IpNextHeaderProtocols::Icmpv6,
        ) == u16::from_be_bytes([icmp[2], icmp[3]]);
    ok.then_some(ip)
}

/// IPv6 through the tunnel: each site's LAN has its certificate's first /64; a device
/// behind gw2 is heard at its address (its ping to its gateway, answered), and a ping from
/// a device behind gw1 to that address crosses, to the device's MAC, hop limit down by two.
#[test]
fn ipv6_crosses_between_the_sites_lans() {
    let link = Link::new(10);
    let shape = Shape {
        blocks: [
            "100.64.1.0/24 fd7a:0:1:100::/56",
            "100.64.2.0/24 fd7a:0:1:200::/56",
        ],
        adapter: "inner_mtu = 1280",
        ..Shape::default()
    };
    let (_f, one, two) = sites_shaped(&link, &shape);
    let (_, gw1_mac) = one.device.lease("sensor-one");
    let (_, gw2_mac) = two.device.lease("sensor-two");
    let a: std::net::Ipv6Addr = "fd7a:0:1:100::a".parse().expect("an address");
    let b: std::net::Ipv6Addr = "fd7a:0:1:200::b".parse().expect("an address");
    let gw2: std::net::Ipv6Addr = "fd7a:0:1:200::1".parse().expect("an address");

    two.device.send(&eth6(
        gw2_mac,
        two.device.mac,
        &ipv6_echo(b, gw2, b"hello gateway"),
    ));
    two.device.expect("the gateway's echo reply", |f| {
        icmp6(f, gw2, b, 129).is_some()
    });

    one.device
        .send(&eth6(gw1_mac, one.device.mac, &ipv6_echo(a, b, b"across")));
    let got = two
        .device
        .expect("the ping across", |f| icmp6(f, a, b, 128).is_some());
    assert_eq!(got[..6], two.device.mac, "to the device's MAC");
    assert_eq!(got[IP + 7], 62, "each gateway is a hop");
}
