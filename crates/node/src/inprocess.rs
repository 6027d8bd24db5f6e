//! The node's production edge in userspace mode (`[userspace]`: the overlay's stack in the
//! process, no TUN device, no privileges), run by the daemon's production driver
//! (`cyphonic_daemon::run_on`) in this process over an in-memory underlay, against a bare
//! tunnel end (`cyphonic_daemon::testing::BareEdge`) the test speaks through. The unit tier
//! runs it.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use cyphonic_daemon::Edge as _;
use cyphonic_daemon::testing::{BareEdge, BareHost, RunningEnd};
use cyphonic_gateway::testutil::{checksums_ok, ipv4_echo, ipv4_udp};
use cyphonic_settings::testing::{Fixture, Node};
use cyphonic_tunnel::testing::Link;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};

use crate::edge::NodeEdge;

/// How long a test waits for what must happen; the wait ends as soon as it does.
const PATIENCE: Duration = Duration::from_secs(30);
const NODE: Ipv4Addr = Ipv4Addr::new(100, 64, 3, 1);
const PROBE: Ipv4Addr = Ipv4Addr::new(100, 64, 4, 1);

/// A node's file: `name` at `vip` on the link's `192.0.2.n`, `peer` its static peer; in
/// userspace with its SOCKS5 proxy on `socks`, if given.
fn file(f: &Fixture, name: &str, n: u8, (peer, at): (&str, u8), socks: Option<u16>) -> String {
    let dir = f.path().display();
    let userspace = match socks {
        Some(port) => format!("[userspace]\nsocks5 = \"127.0.0.1:{port}\"\n"),
        None => String::new(),
    };
    format!(
        r#"
[node]
interface = "cyt{n}"
listen = "192.0.2.{n}:51820"
vip = "100.64.{m}.1"
status_socket = "{dir}/{name}.sock"

[identity]
certificate = "{name}.crt"
key = "{name}.key"
ca = "ca.crt"

[dns]
enabled = true
listen = "127.0.0.1:0"
upstream = []

[dataplane]
workers = 2
buffers = 1024
sparse_socket = false

{userspace}
[[peer]]
certificate = "{peer}.crt"
endpoint = "192.0.2.{at}:51820"
dns = "100.64.{pm}.1"
"#,
        m = n + 2,
        pm = at + 2,
    )
}

/// The node (`laptop`, 100.64.3.1, userspace) and a bare end (`probe`, 100.64.4.1), peers
/// of each other on `link`; the probe's host.
fn ends(link: &Link) -> (Fixture, RunningEnd, RunningEnd, Arc<BareHost>, u16) {
    let now = cyphonic_settings::now_secs();
    let node = Node::keyed;
    let f = Fixture::new(
        "node-inprocess",
        now,
        &[
            node("laptop.ovl.example", "100.64.3.0/24"),
            node("probe.ovl.example", "100.64.4.0/24"),
        ],
    );
    let load = |name: &str, n, peer, socks| {
        let text = file(&f, name, n, peer, socks);
        let path = f.write(&format!("{name}.toml"), &text);
        crate::config::load(&path, now).expect("a valid file")
    };
    // A port free a moment ago, for the proxy (the file takes no port 0).
    let socks = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let (config, identity) = load(
        "laptop.ovl.example",
        1,
        ("probe.ovl.example", 2),
        Some(socks),
    );
    let at = |n| Box::new(link.socket(SocketAddr::from(([192, 0, 2, n], 51820))));
    let socket = at(1);
    let status = config.common.status_socket.clone();
    let laptop = RunningEnd::start("cy-node", crate::NAMES.name, &status, move |signals| {
        let edge = NodeEdge::open(&config)?;
        let reload = Box::new(|| anyhow::bail!("no reloads in this test"));
        let devices = cyphonic_daemon::Devices { socket, signals };
        cyphonic_daemon::run_on(&config.common, identity, edge, reload, devices)
    });
    let (config, identity) = load("probe.ovl.example", 2, ("laptop.ovl.example", 1), None);
    let host = Arc::new(BareHost::default());
    let (socket, edge) = (at(2), BareEdge(host.clone()));
    let status = config.common.status_socket.clone();
    let probe = RunningEnd::start("cy-probe", BareEdge::PROGRAM, &status, move |signals| {
        let reload = Box::new(|| anyhow::bail!("no reloads in this test"));
        let devices = cyphonic_daemon::Devices { socket, signals };
        cyphonic_daemon::run_on(&config.common, identity, edge, reload, devices)
    });
    assert!(host.wait_running(PATIENCE), "the probe runs");
    (f, laptop, probe, host, socks)
}

/// The first delivered packet `want` picks, within [`PATIENCE`].
fn delivered(host: &BareHost, what: &str, want: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(p) = host.delivered().into_iter().find(|p| want(p)) {
            return p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The node in userspace answers a peer's ping from its stack, and a peer's DNS question
/// for its own name (at its vIP's port 53, through the stack to its stub), through the
/// tunnel both ways; a local client's SOCKS5 CONNECT reaches the peer as a SYN; its status
/// says it runs without a TUN device.
#[test]
fn a_userspace_node_answers_pings_and_its_name_and_proxies() {
    let link = Link::new(1);
    let (_f, mut laptop, probe, host, socks) = ends(&link);
    assert!(host.send(&ipv4_echo(PROBE.octets(), NODE.octets(), b"node?")));
    let reply = delivered(&host, "the echo reply", |p| p[9] == 1 && p[20] == 0);
    assert_eq!(
        (&reply[12..16], &reply[16..20]),
        (&NODE.octets()[..], &PROBE.octets()[..])
    );
    assert!(checksums_ok(&reply));

    let mut query = Message::new(0x2a2a, MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(
        Name::from_ascii("laptop.ovl.example.").expect("a name"),
        RecordType::A,
    ));
    let query = query.to_vec().expect("a query");
    assert!(host.send(&ipv4_udp(PROBE.octets(), NODE.octets(), 5353, 53, &query)));
    let answer = delivered(&host, "the DNS answer", |p| {
        p[9] == 17 && p[22..24] == 5353u16.to_be_bytes()
    });
    let answer = Message::from_vec(&answer[28..]).expect("a DNS message");
    assert_eq!(answer.metadata.id, 0x2a2a);
    let ips: Vec<Ipv4Addr> = answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    assert_eq!(ips, vec![NODE], "its own name");

    // A local client's connection through the proxy leaves the stack as a SYN to the
    // peer's address and port.
    let mut client = std::net::TcpStream::connect(("127.0.0.1", socks)).expect("the proxy");
    client.set_read_timeout(Some(PATIENCE)).expect("a timeout");
    client.write_all(&[5, 1, 0]).expect("a greeting");
    let mut chosen = [0u8; 2];
    client.read_exact(&mut chosen).expect("the method");
    assert_eq!(chosen, [5, 0], "no authentication");
    let [a, b, c, d] = PROBE.octets();
    client
        .write_all(&[5, 1, 0, 1, a, b, c, d, 0x1f, 0x90])
        .expect("a CONNECT");
    let syn = delivered(&host, "the SYN", |p| {
        p[9] == 6 && p[22..24] == 8080u16.to_be_bytes() && p[33] & 0x02 != 0
    });
    assert_eq!(syn[12..16], NODE.octets(), "from the node's vIP");
    drop(client);

    let doc = laptop
        .wait_status(PATIENCE, |d| d["node"]["interface"].is_string())
        .expect("the node answers");
    assert_eq!(doc["node"]["interface"], "userspace", "{doc}");
    laptop.stop().expect("the node stops cleanly");
    probe.stop().expect("the probe stops cleanly");
}
