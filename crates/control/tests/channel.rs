//! The control channel and names, as the cloud and a client see them.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};

use cyphonic_control::channel::{LEN_PREFIX, MAX_MESSAGE, frame_len};
use cyphonic_control::{
    Channel, ChannelError, ClientHandshake, ClientMsg, CloudMsg, Hello, NameError, NameRecord,
    ServerHandshake, Welcome, check_name,
};
use cyphonic_crypto::{CertBody, CertificateAuthority, IssueRequest, StaticKeypair};
use proptest::prelude::*;

fn body(name: &str, block: &str) -> CertBody {
    let ca = CertificateAuthority::generate(
        "ovl.example",
        &["100.64.0.0/10".parse().unwrap()],
        0,
        u64::MAX,
    )
    .unwrap();
    let cert = ca
        .issue(&IssueRequest {
            name: name.to_owned(),
            vip_blocks: vec![block.parse().unwrap()],
            public_key: [7; 32],
            groups: vec![],
            not_before: 0,
            not_after: u64::MAX,
        })
        .unwrap();
    cert.body().clone()
}

fn hello() -> Hello {
    Hello {
        version: 2,
        timestamp: 1,
        certificate: "CERT".into(),
        enroll: None,
        agent: "test".into(),
    }
}

fn welcome() -> Welcome {
    Welcome::Accepted {
        version: 2,
        probe_token: [9; 16],
        probe_key: [8; 16],
        probe_ports: vec![7001, 7002],
        observed: "198.51.100.2:40000".parse().unwrap(),
        issuers: Vec::new(),
    }
}

/// Version 3 adds fields a version-2 peer would refuse (unknown fields are errors): they are
/// left out when empty, so that what a version-3 cloud says to a version-2 client, and what a
/// version-3 client says when it is not enrolling, reads as version 2 did.
#[test]
fn version_3_fields_are_absent_unless_used() {
    let json = serde_json::to_string(&welcome()).unwrap();
    assert!(!json.contains("issuers"), "{json}");
    let json = serde_json::to_string(&hello()).unwrap();
    assert!(!json.contains("enroll"), "{json}");
    // A version-2 client's hello, as it wrote it, still reads.
    let v2: Hello =
        serde_json::from_str(r#"{"version":2,"timestamp":5,"certificate":"CERT","agent":"old"}"#)
            .unwrap();
    assert_eq!(v2.enroll, None);
    // An enrollment hello and answer round-trip.
    let enrolling = Hello {
        certificate: String::new(),
        enroll: Some("00112233.aabb".into()),
        ..hello()
    };
    let back: Hello = serde_json::from_str(&serde_json::to_string(&enrolling).unwrap()).unwrap();
    assert_eq!(back, enrolling);
    let enrolled = Welcome::Enrolled {
        certificate: "C".into(),
        chain: vec!["I".into()],
        roots: vec!["R".into()],
    };
    let json = serde_json::to_string(&enrolled).unwrap();
    assert!(json.contains(r#""result":"enrolled""#), "{json}");
    assert_eq!(serde_json::from_str::<Welcome>(&json).unwrap(), enrolled);
}

/// Strips the length prefix, checking it.
fn body_of(frame: &[u8]) -> &[u8] {
    let prefix: [u8; LEN_PREFIX] = frame[..LEN_PREFIX].try_into().unwrap();
    assert_eq!(frame_len(prefix), frame.len() - LEN_PREFIX);
    &frame[LEN_PREFIX..]
}

fn open_pair() -> (Channel, Channel, StaticKeypair) {
    let (client, cloud) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let (hs, first) = ClientHandshake::start(&client, &cloud.public(), &hello()).unwrap();
    let incoming = ServerHandshake::accept(&cloud, body_of(&first)).unwrap();
    assert_eq!(incoming.remote_static(), client.public());
    assert_eq!(incoming.hello(), &hello());
    let (server, answer) = incoming.answer(&welcome()).unwrap();
    let (client_ch, w) = hs.finish(body_of(&answer)).unwrap();
    assert_eq!(w, welcome());
    assert_eq!(client_ch.remote_static(), cloud.public());
    (client_ch, server, client)
}

#[test]
fn messages_flow_both_ways_in_order() {
    let (mut client, mut server, _) = open_pair();
    let reg = ClientMsg::Register {
        endpoints: vec!["198.51.100.2:51820".parse().unwrap()],
        names: vec![NameRecord {
            name: "gw1.ovl.example".into(),
            vip: Some(Ipv4Addr::new(100, 64, 1, 1)),
            vip6: None,
            legacy: Some(Ipv4Addr::new(192, 0, 2, 20)),
        }],
        mapping: None,
        tunnel: Some(cyphonic_control::TunnelVersions::OURS),
    };
    let f = client.seal(&reg).unwrap();
    assert_eq!(server.open::<ClientMsg>(body_of(&f)).unwrap(), reg);
    for id in 0..3 {
        let f = server.seal(&CloudMsg::Pong {}).unwrap();
        assert_eq!(
            client.open::<CloudMsg>(body_of(&f)).unwrap(),
            CloudMsg::Pong {}
        );
        let f = client
            .seal(&ClientMsg::Resolve {
                id,
                name: "x".into(),
            })
            .unwrap();
        assert!(matches!(
            server.open::<ClientMsg>(body_of(&f)).unwrap(),
            ClientMsg::Resolve { id: i, .. } if i == id
        ));
    }
}

#[test]
fn a_client_pinning_another_key_gets_nowhere() {
    let (client, cloud, other) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let (_, first) = ClientHandshake::start(&client, &other.public(), &hello()).unwrap();
    assert!(matches!(
        ServerHandshake::accept(&cloud, body_of(&first)),
        Err(ChannelError::Noise(_))
    ));
}

#[test]
fn an_impostor_cloud_is_not_believed() {
    let (client, cloud, impostor) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let (hs, _first) = ClientHandshake::start(&client, &cloud.public(), &hello()).unwrap();
    // The impostor cannot read the first message; the best it can do is start its own
    // handshake and answer with that.
    let (_, fake) = ClientHandshake::start(&impostor, &client.public(), &hello()).unwrap();
    assert!(hs.finish(body_of(&fake)).is_err());
}

#[test]
fn tampered_replayed_and_reordered_frames_are_refused() {
    let (mut client, mut server, _) = open_pair();
    let f1 = client.seal(&ClientMsg::Ping {}).unwrap();
    let f2 = client.seal(&ClientMsg::Ping {}).unwrap();
    let mut bad = f1.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        server.open::<ClientMsg>(body_of(&bad)),
        Err(ChannelError::Noise(_))
    ));
    // Reordered: the second frame before the first.
    let (mut client, mut server, _) = open_pair();
    let g1 = client.seal(&ClientMsg::Ping {}).unwrap();
    let g2 = client.seal(&ClientMsg::Ping {}).unwrap();
    assert!(server.open::<ClientMsg>(body_of(&g2)).is_err());
    drop((g1, f2));
    // Replayed: the same frame twice.
    let (mut client, mut server, _) = open_pair();
    let h = client.seal(&ClientMsg::Ping {}).unwrap();
    server.open::<ClientMsg>(body_of(&h)).unwrap();
    assert!(server.open::<ClientMsg>(body_of(&h)).is_err());
}

#[test]
fn a_well_sealed_message_of_the_wrong_shape_is_malformed() {
    let (mut client, mut server, _) = open_pair();
    // A cloud message sent by a client, and an unknown field.
    let f = client.seal(&CloudMsg::Pong {}).unwrap();
    assert!(matches!(
        server.open::<ClientMsg>(body_of(&f)),
        Err(ChannelError::Malformed(_))
    ));
    let f = client
        .seal(&serde_json::json!({"type": "ping", "extra": 1}))
        .unwrap();
    assert!(matches!(
        server.open::<ClientMsg>(body_of(&f)),
        Err(ChannelError::Malformed(_))
    ));
}

#[test]
fn a_message_larger_than_a_frame_is_refused_before_sending() {
    let (mut client, _, _) = open_pair();
    let name = "a".repeat(MAX_MESSAGE);
    assert!(matches!(
        client.seal(&ClientMsg::Resolve { id: 1, name }),
        Err(ChannelError::TooLarge(_))
    ));
}

/// The JSON shapes are the protocol (docs/protocol.md §3): a change here is a version bump.
#[test]
fn message_shapes_are_stable() {
    let m = ClientMsg::Resolve {
        id: 7,
        name: "cam.gw2.ovl.example".into(),
    };
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"type":"resolve","id":7,"name":"cam.gw2.ovl.example"}"#
    );
    let o = CloudMsg::Observed {
        endpoint: SocketAddr::from(([203, 0, 113, 5], 4000)),
    };
    assert_eq!(
        serde_json::to_string(&o).unwrap(),
        r#"{"type":"observed","endpoint":"203.0.113.5:4000"}"#
    );
    // The policy message as docs/protocol.md §4 *Policy* shows it.
    let p = CloudMsg::Policy {
        version: 8_034_712_255,
        enforce: true,
        rules: vec![cyphonic_control::PolicyRule {
            id: 3,
            from: vec!["100.64.1.21/32".parse().unwrap()],
            to: vec!["100.64.2.0/24".parse().unwrap()],
            proto: cyphonic_control::PolicyProto::Tcp,
            ports: vec![(554, 554)],
        }],
        more: false,
    };
    assert_eq!(
        serde_json::to_string(&p).unwrap(),
        r#"{"type":"policy","version":8034712255,"enforce":true,"rules":[{"id":3,"from":["100.64.1.21/32"],"to":["100.64.2.0/24"],"proto":"tcp","ports":[[554,554]]}],"more":false}"#
    );
    // A version-1 Hello (no timestamp) still reads, so that the cloud can answer it with the
    // version it speaks.
    let v1: Hello =
        serde_json::from_str(r#"{"version":1,"certificate":"CERT","agent":"old"}"#).unwrap();
    assert_eq!((v1.version, v1.timestamp), (1, 0));
}

/// `allowed` (version 5) reads as docs/protocol.md shows it, and a version-4 client, whose
/// `peer` refuses unknown fields, gets its messages without it.
#[test]
fn directions_go_to_version_5_and_are_taken_out_for_version_4() {
    use cyphonic_control::{Allowed, PeerInfo, Resolution};
    let peer = PeerInfo {
        certificate: "CERT".into(),
        endpoints: vec![SocketAddr::from(([203, 0, 113, 2], 51820))],
        relay: None,
        allowed: Some(Allowed::Out),
        tunnel: None,
    };
    let expect = CloudMsg::Expect { peer: peer.clone() };
    assert_eq!(
        serde_json::to_string(&expect).unwrap(),
        r#"{"type":"expect","peer":{"certificate":"CERT","endpoints":["203.0.113.2:51820"],"allowed":"out"}}"#
    );
    assert_eq!(expect.clone().for_version(5), expect);
    let found = CloudMsg::Resolved {
        id: 1,
        name: "host.gw2.ovl.example".into(),
        resolution: Resolution::Found {
            vip: Some(Ipv4Addr::new(100, 64, 2, 10)),
            vip6: Some("fd7a:0:1:200::a".parse().unwrap()),
            peer,
        },
    };
    // Version 8 carries the IPv6 address; a version-7 client reads the message without it.
    let json = |m: &CloudMsg, v| serde_json::to_string(&m.clone().for_version(v)).unwrap();
    assert!(json(&found, 8).contains(r#""vip6":"fd7a:0:1:200::a""#));
    assert!(!json(&found, 7).contains("vip6"), "{}", json(&found, 7));
    // Version 9: a name with IPv6 only resolves without a vIP; an older client does not find
    // it, and one with both addresses is found by every version.
    let CloudMsg::Resolved {
        resolution: Resolution::Found { peer: p, .. },
        ..
    } = &found
    else {
        unreachable!()
    };
    let only6 = CloudMsg::Resolved {
        id: 2,
        name: "cam.gw2.ovl.example".into(),
        resolution: Resolution::Found {
            vip: None,
            vip6: Some("fd7a:0:1:200::c".parse().unwrap()),
            peer: p.clone(),
        },
    };
    assert_eq!(only6.clone().for_version(9), only6);
    assert!(!json(&only6, 9).contains(r#""vip""#), "{}", json(&only6, 9));
    assert!(matches!(
        only6.clone().for_version(8),
        CloudMsg::Resolved {
            id: 2,
            resolution: Resolution::NotFound,
            ..
        }
    ));
    assert_eq!(found.clone().for_version(9), found);
    assert!(matches!(
        found.clone().for_version(8),
        CloudMsg::Resolved {
            resolution: Resolution::Found { vip: Some(_), .. },
            ..
        }
    ));
    for msg in [expect, found] {
        let old = serde_json::to_string(&msg.for_version(4)).unwrap();
        assert!(!old.contains("allowed"), "{old}");
        // What a version-4 peer reads: the same shape without the field.
        let back: CloudMsg = serde_json::from_str(&old).unwrap();
        assert!(matches!(
            back,
            CloudMsg::Expect {
                peer: PeerInfo { allowed: None, .. }
            } | CloudMsg::Resolved {
                resolution: Resolution::Found {
                    peer: PeerInfo { allowed: None, .. },
                    ..
                },
                ..
            }
        ));
    }
    assert_eq!(Allowed::from_sides(true, false), Some(Allowed::Out));
    assert_eq!(
        Allowed::from_sides(false, true).map(Allowed::mirror),
        Some(Allowed::Out)
    );
    assert_eq!(Allowed::from_sides(false, false), None);
    assert_eq!(Allowed::Both.mirror(), Allowed::Both);
}

/// The cloud reads no first frame above MAX_HELLO_FRAME, so a client never writes one.
#[test]
fn a_hello_that_would_pass_the_first_frame_limit_is_not_sent() {
    let (client, cloud) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let (_, first) = ClientHandshake::start(&client, &cloud.public(), &hello()).unwrap();
    assert!(first.len() <= cyphonic_control::channel::MAX_HELLO_FRAME);
    let big = Hello {
        agent: "x".repeat(cyphonic_control::channel::MAX_HELLO_FRAME),
        ..hello()
    };
    assert!(matches!(
        ClientHandshake::start(&client, &cloud.public(), &big),
        Err(ChannelError::TooLarge(n)) if n > cyphonic_control::channel::MAX_HELLO_FRAME
    ));
}

#[test]
fn names_inside_the_certificate_only() {
    let b = body("gw1.ovl.example", "100.64.1.0/24");
    let rec = |name: &str, vip: [u8; 4]| NameRecord {
        name: name.into(),
        vip: Some(vip.into()),
        vip6: None,
        legacy: None,
    };
    assert_eq!(
        check_name(&b, &rec("gw1.ovl.example", [100, 64, 1, 1])),
        Ok(())
    );
    assert_eq!(
        check_name(&b, &rec("cam.gw1.ovl.example", [100, 64, 1, 100])),
        Ok(())
    );
    assert!(matches!(
        check_name(&b, &rec("cam.gw2.ovl.example", [100, 64, 1, 100])),
        Err(NameError::OutsideZone(_))
    ));
    assert!(matches!(
        check_name(&b, &rec("a.cam.gw1.ovl.example", [100, 64, 1, 100])),
        Err(NameError::OutsideZone(_))
    ));
    // A suffix match that is not a label boundary.
    assert!(matches!(
        check_name(&b, &rec("xgw1.ovl.example", [100, 64, 1, 100])),
        Err(NameError::OutsideZone(_))
    ));
    assert_eq!(
        check_name(&b, &rec("cam.gw1.ovl.example", [100, 64, 2, 100])),
        Err(NameError::OutsideBlocks)
    );
    // A name with IPv6 only (version 9) needs its address inside an IPv6 block; a name with
    // no address is none.
    let only6 = NameRecord {
        vip: None,
        vip6: Some("fd7a:0:1:100::1234".parse().unwrap()),
        ..rec("cam.gw1.ovl.example", [0; 4])
    };
    assert_eq!(check_name(&b, &only6), Err(NameError::OutsideBlocks));
    let mut dual = b.clone();
    dual.vip_blocks.push("fd7a:0:1:100::/56".parse().unwrap());
    assert_eq!(check_name(&dual, &only6), Ok(()));
    let none = NameRecord {
        vip6: None,
        ..only6
    };
    assert_eq!(check_name(&dual, &none), Err(NameError::NoAddress));
    for bad in [
        "CAM.gw1.ovl.example",
        "-x.gw1.ovl.example",
        ".gw1.ovl.example",
        "c m.gw1.ovl.example",
    ] {
        assert_eq!(
            check_name(&b, &rec(bad, [100, 64, 1, 100])),
            Err(NameError::Invalid),
            "{bad}"
        );
    }
}

proptest! {
    /// Arbitrary bytes never panic the cloud's first step nor an open channel.
    #[test]
    fn arbitrary_frames_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let cloud = StaticKeypair::generate().unwrap();
        let _ = ServerHandshake::accept(&cloud, &bytes);
        let (_, mut server, _) = open_pair();
        prop_assert!(server.open::<ClientMsg>(&bytes).is_err());
    }
}

#[test]
fn binds_round_trip_and_nothing_else_passes_for_one() {
    let token = [0xab; 16];
    let frame = cyphonic_control::bind_frame(&token, None);
    assert_eq!(frame.len(), 64);
    assert_eq!(frame[1], 6, "type 6, endpoint probe");
    assert!(cyphonic_control::Bind::parse(&frame).is_some_and(|b| b.verify(&token)));
    let mut short = frame.clone();
    short.pop();
    assert!(cyphonic_control::Bind::parse(&short).is_none());
    let mut other = frame.clone();
    other[1] = 4;
    assert!(cyphonic_control::Bind::parse(&other).is_none());
    assert!(cyphonic_control::Bind::parse(&[]).is_none());
    // A version-5 client's: its token in clear.
    let old = cyphonic_control::legacy_bind_frame(&token);
    assert_eq!(old.len(), 32);
    assert_eq!(cyphonic_control::legacy_bind_token(&old), Some(token));
    assert_eq!(cyphonic_control::legacy_bind_token(&frame), None);
}
