//! Fixtures for the LAN services benchmark: a DNS service and a DHCP server as a busy site
//! has them (a full /24 of devices), and the messages devices send them.

use std::net::Ipv4Addr;
use std::str::FromStr as _;

use cyphonic_resolver::{PeerZone, Resolver, ZoneConfig};
use cyphonic_vip::testing::{DhcpOption, MessageType, client_message};
use cyphonic_vip::{DhcpConfig, Server};
use hickory_proto::op::{Message, MessageType as DnsType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};

/// Devices on the benchmark LAN.
pub const DEVICES: u8 = 200;
/// Unix time the DHCP benchmarks run at.
pub const NOW: u64 = 1_800_000_000;
const GW: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 1);

fn name(s: &str) -> Name {
    Name::from_str(s).expect("a benchmark name")
}

/// The MAC of device `n`.
pub const fn mac(n: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x01, n]
}

/// gw1's DNS service with [`DEVICES`] named devices and one peer.
pub fn resolver() -> Resolver<u32> {
    let mut r = Resolver::new(ZoneConfig {
        overlay_domain: name("ovl.example."),
        own_name: name("gw1.ovl.example."),
        own_ip: GW,
        own_ip6: None,
        own_block: "100.64.1.0/24".parse().expect("block"),
        overlay: "100.64.0.0/10".parse().expect("overlay"),
        ttl: 60,
        upstream: false,
        ask_cloud: false,
    });
    let labels: Vec<(String, Ipv4Addr)> = (0..DEVICES)
        .map(|n| (format!("dev{n}"), Ipv4Addr::new(100, 64, 1, 20 + n)))
        .collect();
    r.set_hosts(labels.iter().map(|(l, ip)| (l.as_str(), Some(*ip), None)));
    r.set_peers(vec![PeerZone {
        peer: 1,
        name: name("gw2.ovl.example."),
        blocks: vec!["100.64.2.0/24".parse().expect("block")],
    }]);
    r
}

/// A standard query, as `dig` sends it (with EDNS).
pub fn query(id: u16, qname: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, DnsType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name(qname), qtype));
    let mut edns = hickory_proto::op::Edns::new();
    edns.set_max_payload(1232);
    m.edns = Some(edns);
    m.to_vec().expect("a benchmark query")
}

/// A DHCP server at `server` for `block`, handing out `pool`, with no bindings yet.
fn server(server: Ipv4Addr, block: &str, pool: (Ipv4Addr, Ipv4Addr)) -> Server {
    Server::new(
        DhcpConfig {
            server,
            block: block.parse().expect("block"),
            pool,
            lease_secs: 3600,
            mtu: 1420,
            domain: "gw1.ovl.example".into(),
            reservations: Vec::new(),
            new_lease_share: 1.0,
            new_lease_window_secs: 60,
        },
        Vec::new(),
        NOW,
    )
    .expect("a benchmark DHCP config")
}

/// gw1's DHCP server with [`DEVICES`] devices bound (pool 100.64.1.20-254).
pub fn dhcp_server() -> Server {
    let mut s = server(
        GW,
        "100.64.1.0/24",
        (
            Ipv4Addr::new(100, 64, 1, 20),
            Ipv4Addr::new(100, 64, 1, 254),
        ),
    );
    for n in 0..DEVICES {
        let m = mac(n);
        let offer = s
            .handle(NOW, &discover(m), m)
            .expect("an offer")
            .expect("an offer");
        let ip = yiaddr(&offer.payload);
        s.handle(
            NOW,
            &client_message(
                MessageType::Request,
                m,
                2,
                vec![
                    DhcpOption::ServerIdentifier(GW),
                    DhcpOption::RequestedIpAddress(ip),
                ],
                Ipv4Addr::UNSPECIFIED,
                false,
            ),
            m,
        )
        .expect("an ack");
    }
    while s.poll_event().is_some() {}
    s
}

/// The MAC of flooding device `n`.
pub const fn flood_mac(n: u32) -> [u8; 6] {
    let b = n.to_be_bytes();
    [0x02, 0xf1, b[0], b[1], b[2], b[3]]
}

/// A DISCOVER from `mac`, as a new device (or a flood with random MACs) sends it.
pub fn discover(mac: [u8; 6]) -> Vec<u8> {
    client_message(
        MessageType::Discover,
        mac,
        1,
        vec![],
        Ipv4Addr::UNSPECIFIED,
        false,
    )
}

/// A DHCP server for a /16 (100.64.0.0/16, pool .0.10 to .255.250, no bindings) in the middle
/// of a DISCOVER flood: `outstanding` offers made to flooding MACs and not taken yet.
pub fn flood_server(outstanding: u32) -> Server {
    let mut s = server(
        Ipv4Addr::new(100, 64, 0, 1),
        "100.64.0.0/16",
        (
            Ipv4Addr::new(100, 64, 0, 10),
            Ipv4Addr::new(100, 64, 255, 250),
        ),
    );
    for n in 0..outstanding {
        let m = flood_mac(n);
        s.handle(NOW, &discover(m), m)
            .expect("an offer")
            .expect("an offer");
    }
    while s.poll_event().is_some() {}
    s
}

/// `yiaddr` of a BOOTP message (bytes 16..20).
pub fn yiaddr(msg: &[u8]) -> Ipv4Addr {
    let b: [u8; 4] = msg[16..20].try_into().expect("a BOOTP message");
    Ipv4Addr::from(b)
}

/// Device `n`'s renewal (RENEWING: `ciaddr` set, unicast), with its hostname.
pub fn renewal(s: &Server, n: u8) -> Vec<u8> {
    let m = mac(n);
    let ip = s
        .active()
        .find(|l| l.mac == m)
        .map(|l| l.ip)
        .expect("a bound device");
    client_message(
        MessageType::Request,
        m,
        3,
        vec![DhcpOption::Hostname(format!("dev{n}"))],
        ip,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cyphonic_resolver::Action;
    use std::time::Instant;

    #[test]
    fn the_fixtures_answer() {
        let mut r = resolver();
        let q = query(1, "dev7.gw1.ovl.example.", RecordType::A);
        assert!(matches!(
            r.handle_query(Instant::now(), &q, 0, None),
            Action::Respond(_)
        ));
        let q = query(2, "x.gw2.ovl.example.", RecordType::A);
        assert!(matches!(
            r.handle_query(Instant::now(), &q, 0, None),
            Action::AskPeer { .. }
        ));
        let mut s = dhcp_server();
        assert_eq!(s.active().count(), usize::from(DEVICES));
        let renew = renewal(&s, 5);
        let ack = s.handle(NOW + 1800, &renew, mac(5)).unwrap().unwrap();
        assert_eq!(yiaddr(&ack.payload), Ipv4Addr::new(100, 64, 1, 25));
        // Every flooding device got an address of its own, and the next one does too.
        let mut f = flood_server(100);
        let m = flood_mac(100);
        let offer = f.handle(NOW, &discover(m), m).unwrap().unwrap();
        assert_eq!(yiaddr(&offer.payload), Ipv4Addr::new(100, 64, 0, 110));
    }
}
