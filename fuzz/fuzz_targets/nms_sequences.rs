//! NMS under sequences of control messages from three authenticated clients, against a fresh
//! in-memory SQLite store each run: registrations with names in and out of each
//! certificate's zone and blocks, resolutions of registered, foreign and arbitrary names,
//! relay and admission requests for real and made-up peers, pings, HA pair reports. Every
//! request gets the answer of its kind (never the registry's error), a resolution answers
//! with the asked id, and what it finds is another client's certificate whose blocks hold the
//! address; a pair report is kept (no answer) or refused as malformed.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use cyphonic_cloud::{Nms, Policy, Rule, Store};
use cyphonic_control::{
    ClientMsg, CloudMsg, DeviceKind, DeviceReport, FlowDir, FlowRecord, Mac, MapProtocol, Mapping, NameRecord, PairBox, PairHealth,
    PairRole, RefusedRecord, Resolution, TunnelPath, TunnelReport,
};
use cyphonic_crypto::{
    Certificate, CertificateAuthority, IssueRequest, RevocationList, StaticKeypair, TrustStore,
};

struct Fixtures {
    runtime: tokio::runtime::Runtime,
    trust: TrustStore,
    clients: Vec<Certificate>,
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let ca = CertificateAuthority::generate("ovl.example", &["100.64.0.0/10".parse().unwrap()], 0, u64::MAX)
            .expect("CA");
        let clients = (1..=3u8)
            .map(|n| {
                ca.issue(&IssueRequest {
                    name: format!("gw{n}.ovl.example"),
                    vip_blocks: vec![format!("100.64.{n}.0/24").parse().unwrap()],
                    public_key: StaticKeypair::generate().expect("key").public().0,
                    groups: vec![if n == 3 { "cameras".into() } else { "sites".into() }],
                    not_before: 0,
                    not_after: u64::MAX,
                })
                .expect("cert")
            })
            .collect();
        Fixtures {
            runtime: tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
            trust: TrustStore::new(vec![ca.certificate().clone()], RevocationList::default()).expect("trust"),
            clients,
        }
    })
}

#[derive(Arbitrary, Debug)]
enum Name {
    /// `<label>.gw<client>.ovl.example`, or the client's own name for label 0.
    Of { client: u8, label: u8 },
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Peer {
    Client(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// The mapping: held (at an address and port) or refused (with a reason).
    Register {
        endpoints: Vec<([u8; 4], u16)>,
        names: Vec<(Name, [u8; 4])>,
        mapping: Option<Result<([u8; 4], u16), String>>,
        /// Tunnel versions: any two bytes, a range or not (the cloud stores what parses).
        tunnel: Option<(u8, u8)>,
    },
    Resolve { id: u64, name: Name },
    Relay(Peer),
    Admit(Peer),
    Ping,
    /// Boxes: MAC, role, priority, health bits, in contact.
    HaPair { term: u64, reason: String, boxes: Vec<([u8; 6], u8, u8, u8, bool)> },
    /// Devices: MAC, vIP (none: IPv6 only, or no address), name, host name, counters;
    /// tunnels: peer, name, counters; more parts follow.
    Report {
        devices: Vec<([u8; 6], Option<[u8; 4]>, bool, Name, String, u64)>,
        tunnels: Vec<(Peer, Name, u64)>,
        more: bool,
    },
    /// Flows: addresses, ports, counters; refused: source, packets, ports; unreported.
    Flows {
        flows: Vec<([u8; 4], u16, [u8; 4], u16, u64)>,
        refused: Vec<([u8; 4], u64, u32)>,
        unreported: u64,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Sites may reach sites, not cameras (else everyone reaches everyone).
    policy: bool,
    ops: Vec<(u8, Op)>,
}

fn name(n: &Name) -> String {
    match n {
        Name::Of { client, label: 0 } => format!("gw{}.ovl.example", client % 4 + 1),
        Name::Of { client, label } => format!("h{label}.gw{}.ovl.example", client % 4 + 1),
        Name::Raw(s) => s.chars().take(300).collect(),
    }
}

fn peer(p: &Peer, clients: &[Certificate]) -> String {
    match p {
        Peer::Client(i) => clients[usize::from(*i) % clients.len()].fingerprint().to_string(),
        Peer::Raw(s) => s.chars().take(100).collect(),
    }
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let f = fixtures();
    f.runtime.block_on(async {
        let store = Store::open("sqlite::memory:").await.expect("an in-memory store");
        for c in &f.clients {
            store
                .client_online(
                    &c.fingerprint().to_string(),
                    (&c.body().name, &hex::encode(c.body().issuer)),
                    (&c.to_pem(), &c.body().vip_blocks),
                    "cyphonic-fuzz",
                )
                .await
                .expect("online");
        }
        let policy = if input.policy {
            Policy {
                allow_by_default: false,
                groups: Vec::new(),
                rules: vec![Rule {
                    from: vec!["sites".into()],
                    to: vec!["sites".into()],
                    allow: vec!["any".into()],
                }],
            }
        } else {
            Policy::default()
        };
        // Every member logs its flows: their records reach the store.
        let flows = cyphonic_cloud::config::FlowLogs { members: vec!["*".into()], ..Default::default() };
        let nms = Nms::new(StaticKeypair::generate().expect("key"), f.trust.clone(), store, policy, vec![7001, 7002], None)
            .with_flows(flows);
        for (who, op) in input.ops.into_iter().take(32) {
            let me = &f.clients[usize::from(who) % f.clients.len()];
            let msg = match &op {
                Op::Register { endpoints, names, mapping, tunnel } => ClientMsg::Register {
                    tunnel: tunnel.and_then(|(o, n)| cyphonic_control::TunnelVersions::try_from([o, n]).ok()),
                    mapping: mapping.as_ref().map(|m| match m {
                        Ok((ip, port)) => Mapping::Mapped {
                            protocol: MapProtocol::Pcp,
                            endpoint: SocketAddr::from((*ip, *port)),
                        },
                        Err(reason) => Mapping::Refused { protocol: MapProtocol::Upnp, reason: reason.clone() },
                    }),
                    endpoints: endpoints.iter().take(20).map(|(ip, port)| SocketAddr::from((*ip, *port))).collect(),
                    names: names
                        .iter()
                        .take(20)
                        .map(|(n, vip)| {
                            let vip = Ipv4Addr::from(*vip);
                            // Every other name a fixed device's, with its own address.
                            let own = vip.octets()[3];
                            NameRecord {
                                name: name(n),
                                // Every eighth one without: a device with IPv6 only, or no
                                // address at all.
                                vip: (own & 7 != 4).then_some(vip),
                                // Every fourth one with an IPv6 address, inside or outside.
                                vip6: (own & 3 == 0).then(|| {
                                    std::net::Ipv6Addr::new(0xfd7a, 0, 1, u16::from(own), 0, 0, 0, 1)
                                }),
                                legacy: (own & 1 == 1).then(|| Ipv4Addr::new(192, 0, 2, own)),
                            }
                        })
                        .collect(),
                },
                Op::Resolve { id, name: n } => ClientMsg::Resolve { id: *id, name: name(n) },
                Op::Relay(p) => ClientMsg::Relay { peer: peer(p, &f.clients) },
                Op::Admit(p) => ClientMsg::Admit { peer: peer(p, &f.clients) },
                Op::Ping => ClientMsg::Ping {},
                Op::HaPair { term, reason, boxes } => ClientMsg::HaPair {
                    term: *term,
                    reason: reason.clone(),
                    boxes: boxes
                        .iter()
                        .take(4)
                        .map(|(mac, role, priority, health, in_contact)| PairBox {
                            mac: Mac(*mac),
                            role: [PairRole::Starting, PairRole::Standby, PairRole::Active][usize::from(*role % 3)],
                            priority: *priority,
                            health: [PairHealth::Lan, PairHealth::Uplink, PairHealth::DataPlane, PairHealth::Reached]
                                .into_iter()
                                .enumerate()
                                .filter(|(i, _)| health & (1 << i) != 0)
                                .map(|(_, h)| h)
                                .collect(),
                            in_contact: *in_contact,
                        })
                        .collect(),
                },
                Op::Report { devices, tunnels, more } => ClientMsg::Report {
                    devices: devices
                        .iter()
                        .take(64)
                        .map(|(mac, vip, v6, n, hostname, count)| DeviceReport {
                            mac: Mac(*mac),
                            vip: vip.map(Ipv4Addr::from),
                            vip6: v6.then(|| std::net::Ipv6Addr::new(0xfd7a, 0, 1, 0, 0, 0, 0, mac[5].into())),
                            legacy: None,
                            name: Some(name(n)),
                            hostname: Some(hostname.chars().take(300).collect()),
                            kind: DeviceKind::Lease,
                            expires: None,
                            vlan: None,
                            seen: Some(*count),
                            tx_bytes: *count,
                            tx_packets: count / 1000,
                            rx_bytes: !*count,
                            rx_packets: 0,
                        })
                        .collect(),
                    tunnels: tunnels
                        .iter()
                        .take(16)
                        .map(|(p, n, count)| TunnelReport {
                            peer: peer(p, &f.clients),
                            name: name(n),
                            path: TunnelPath::Direct,
                            reason: None,
                            endpoint: None,
                            established: count & 1 == 1,
                            handshake: Some(*count),
                            tx_bytes: *count,
                            rx_bytes: !*count,
                        })
                        .collect(),
                    more: *more,
                },
                Op::Flows { flows, refused, unreported } => ClientMsg::Flows {
                    flows: flows
                        .iter()
                        .take(64)
                        .map(|(src, sport, dst, dport, count)| FlowRecord {
                            proto: 6,
                            src: Ipv4Addr::from(*src).into(),
                            sport: *sport,
                            dst: Ipv4Addr::from(*dst).into(),
                            dport: *dport,
                            dir: FlowDir::Out,
                            start: *count,
                            end: count.wrapping_add(1),
                            tx_bytes: *count,
                            tx_packets: count >> 10,
                            rx_bytes: !*count,
                            rx_packets: 0,
                            rule: 0,
                        })
                        .collect(),
                    refused: refused
                        .iter()
                        .take(16)
                        .map(|(src, packets, ports)| RefusedRecord {
                            src: Ipv4Addr::from(*src).into(),
                            dir: FlowDir::In,
                            first: *packets,
                            last: *packets,
                            packets: *packets,
                            ports: *ports,
                        })
                        .collect(),
                    unreported: *unreported,
                },
            };
            let answer = nms.serve_message(me, msg.clone()).await;
            match (&msg, answer) {
                (ClientMsg::Register { names, .. }, Some(CloudMsg::Registered { accepted, refused })) => {
                    assert!(accepted + refused.len() <= names.len());
                }
                (ClientMsg::Resolve { id, .. }, Some(CloudMsg::Resolved { id: got, resolution, .. })) => {
                    assert_eq!(*id, got);
                    if let Resolution::Found { vip, vip6, peer } = resolution {
                        let cert = Certificate::from_pem(&peer.certificate).expect("a certificate");
                        assert_ne!(cert.fingerprint(), me.fingerprint(), "found itself");
                        assert!(vip.is_some() || vip6.is_some(), "found without an address");
                        if let Some(v4) = vip {
                            assert!(cert.body().covers(v4.into()), "{v4} outside {:?}", cert.body().vip_blocks);
                        }
                        if let Some(v6) = vip6 {
                            assert!(cert.body().covers(v6.into()), "{v6} outside {:?}", cert.body().vip_blocks);
                        }
                    }
                }
                (ClientMsg::Relay { .. } | ClientMsg::Admit { .. }, Some(CloudMsg::Expect { peer })) => {
                    let cert = Certificate::from_pem(&peer.certificate).expect("a certificate");
                    assert_ne!(cert.fingerprint(), me.fingerprint(), "paired with itself");
                }
                (ClientMsg::Relay { .. } | ClientMsg::Admit { .. }, Some(CloudMsg::NotPaired { .. })) => {}
                (ClientMsg::Ping {}, Some(CloudMsg::Pong {})) => {}
                (ClientMsg::HaPair { .. } | ClientMsg::Report { .. }, None) => {}
                (ClientMsg::Flows { .. }, None) => {}
                (ClientMsg::Report { .. } | ClientMsg::Flows { .. }, Some(CloudMsg::Error { reason })) => {
                    assert_ne!(reason, "the registry is unavailable");
                }
                (ClientMsg::HaPair { .. }, Some(CloudMsg::Error { reason })) => {
                    assert_ne!(reason, "the registry is unavailable");
                }
                (m, a) => panic!("{m:?} was answered {a:?}"),
            }
        }
    });
});
