//! The resolver's answers, decisions and refusals.

#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use cyphonic_resolver::{Action, Drop, PeerZone, Resolver, ZoneConfig};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

fn name(s: &str) -> Name {
    Name::from_str(s).unwrap()
}

fn config(upstream: bool, ask_cloud: bool) -> ZoneConfig {
    ZoneConfig {
        overlay_domain: name("ovl.example."),
        own_name: name("gw1.ovl.example."),
        own_ip: Ipv4Addr::new(100, 64, 1, 1),
        own_ip6: Some("fd7a:0:1:100::1".parse().unwrap()),
        own_block: "100.64.1.0/24".parse().unwrap(),
        overlay: "100.64.0.0/10".parse().unwrap(),
        ttl: 60,
        upstream,
        ask_cloud,
    }
}

fn resolver(upstream: bool, ask_cloud: bool) -> Resolver<&'static str> {
    let mut r = Resolver::new(config(upstream, ask_cloud));
    r.set_hosts([
        ("sensor1", Some(Ipv4Addr::new(100, 64, 1, 10)), None),
        (
            "cam",
            Some(Ipv4Addr::new(100, 64, 1, 11)),
            Some("fd7a:0:1:100::11".parse().unwrap()),
        ),
        ("thread", None, Some("fd7a:0:1:100::12".parse().unwrap())),
    ]);
    r.set_peers(vec![PeerZone {
        peer: 2,
        name: name("gw2.ovl.example."),
        blocks: vec!["100.64.2.0/24".parse().unwrap()],
    }]);
    r
}

fn query(id: u16, qname: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name(qname), qtype));
    m.to_vec().unwrap()
}

fn respond(a: Action) -> Message {
    match a {
        Action::Respond(bytes) => Message::from_vec(&bytes).unwrap(),
        other => panic!("expected a response, got {other:?}"),
    }
}

fn a_records(m: &Message) -> Vec<Ipv4Addr> {
    m.answers
        .iter()
        .filter_map(|r| {
            if let RData::A(A(ip)) = r.data {
                Some(ip)
            } else {
                None
            }
        })
        .collect()
}

/// `check(query name, type, expected rcode, expected A answers, authoritative)`.
fn check(
    r: &mut Resolver<&'static str>,
    qname: &str,
    qtype: RecordType,
    rcode: ResponseCode,
    answers: &[Ipv4Addr],
    aa: bool,
) {
    let m = respond(r.handle_query(Instant::now(), &query(77, qname, qtype), "client", None));
    assert_eq!(m.metadata.id, 77);
    assert_eq!(m.metadata.response_code, rcode, "{qname} {qtype}");
    assert_eq!(a_records(&m), answers, "{qname} {qtype}");
    assert_eq!(m.metadata.authoritative, aa, "{qname} {qtype}");
    assert_eq!(m.queries.len(), 1, "the question is echoed");
    if aa && m.answers.is_empty() {
        assert!(
            m.authorities
                .iter()
                .any(|a| a.record_type() == RecordType::SOA),
            "negative answers carry the SOA (RFC 2308)"
        );
    }
}

#[test]
fn our_zone_is_answered_with_authority() {
    let mut r = resolver(false, false);
    use RecordType::*;
    use ResponseCode::*;
    check(
        &mut r,
        "gw1.ovl.example.",
        A,
        NoError,
        &[Ipv4Addr::new(100, 64, 1, 1)],
        true,
    );
    check(
        &mut r,
        "sensor1.gw1.ovl.example.",
        A,
        NoError,
        &[Ipv4Addr::new(100, 64, 1, 10)],
        true,
    );
    check(
        &mut r,
        "SENSOR1.Gw1.Ovl.Example.",
        A,
        NoError,
        &[Ipv4Addr::new(100, 64, 1, 10)],
        true,
    );
    check(
        &mut r,
        "cam.gw1.ovl.example.",
        ANY,
        NoError,
        &[Ipv4Addr::new(100, 64, 1, 11)],
        true,
    );
    check(&mut r, "sensor1.gw1.ovl.example.", AAAA, NoError, &[], true);
    check(&mut r, "sensor1.gw1.ovl.example.", MX, NoError, &[], true);
    check(&mut r, "nobody.gw1.ovl.example.", A, NXDomain, &[], true);
    check(&mut r, "nobody.gw1.ovl.example.", AAAA, NXDomain, &[], true);
    // Elsewhere in the overlay, without the cloud: no such name, of either type.
    check(&mut r, "x.gw9.ovl.example.", A, NXDomain, &[], false);
    check(&mut r, "x.gw9.ovl.example.", AAAA, NXDomain, &[], false);
}

/// Issue 53: our own name has its AAAA beside its A (the IPv6 address our certificate gives
/// us), a device with an IPv6 address its own; a device without one has none (NODATA).
#[test]
fn our_own_name_and_devices_have_their_ipv6_addresses() {
    let mut r = resolver(false, false);
    let aaaa = |r: &mut Resolver<&'static str>, q: &str, t| {
        let m = respond(r.handle_query(Instant::now(), &query(3, q, t), "c", None));
        let got: Vec<std::net::Ipv6Addr> = m
            .answers
            .iter()
            .filter_map(|a| match a.data {
                RData::AAAA(ip) => Some(ip.0),
                _ => None,
            })
            .collect();
        (m.metadata.response_code, got, a_records(&m))
    };
    let ours: std::net::Ipv6Addr = "fd7a:0:1:100::1".parse().unwrap();
    let own = Ipv4Addr::new(100, 64, 1, 1);
    assert_eq!(
        aaaa(&mut r, "gw1.ovl.example.", RecordType::AAAA),
        (ResponseCode::NoError, vec![ours], vec![])
    );
    assert_eq!(
        aaaa(&mut r, "gw1.ovl.example.", RecordType::ANY),
        (ResponseCode::NoError, vec![ours], vec![own])
    );
    assert_eq!(
        aaaa(&mut r, "sensor1.gw1.ovl.example.", RecordType::AAAA),
        (ResponseCode::NoError, vec![], vec![])
    );
    let cam: std::net::Ipv6Addr = "fd7a:0:1:100::11".parse().unwrap();
    assert_eq!(
        aaaa(&mut r, "cam.gw1.ovl.example.", RecordType::AAAA),
        (ResponseCode::NoError, vec![cam], vec![])
    );
    assert_eq!(
        aaaa(&mut r, "cam.gw1.ovl.example.", RecordType::A),
        (
            ResponseCode::NoError,
            vec![],
            vec![Ipv4Addr::new(100, 64, 1, 11)]
        )
    );
    // A device with IPv6 only: its AAAA, and for A the name exists without one (NODATA).
    let thread: std::net::Ipv6Addr = "fd7a:0:1:100::12".parse().unwrap();
    assert_eq!(
        aaaa(&mut r, "thread.gw1.ovl.example.", RecordType::AAAA),
        (ResponseCode::NoError, vec![thread], vec![])
    );
    assert_eq!(
        aaaa(&mut r, "thread.gw1.ovl.example.", RecordType::A),
        (ResponseCode::NoError, vec![], vec![])
    );
    assert_eq!(
        aaaa(&mut r, "thread.gw1.ovl.example.", RecordType::ANY),
        (ResponseCode::NoError, vec![thread], vec![])
    );
}

#[test]
fn reverse_lookups_in_our_block() {
    let mut r = resolver(false, false);
    let ptr = |r: &mut Resolver<&'static str>, q: &str| {
        respond(r.handle_query(Instant::now(), &query(1, q, RecordType::PTR), "c", None))
    };
    let m = ptr(&mut r, "10.1.64.100.in-addr.arpa.");
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let RData::PTR(target) = &m.answers[0].data else {
        panic!()
    };
    assert_eq!(target.0, name("sensor1.gw1.ovl.example."));
    let m = ptr(&mut r, "1.1.64.100.in-addr.arpa.");
    let RData::PTR(target) = &m.answers[0].data else {
        panic!()
    };
    assert_eq!(target.0, name("gw1.ovl.example."));
    assert_eq!(
        ptr(&mut r, "99.1.64.100.in-addr.arpa.")
            .metadata
            .response_code,
        ResponseCode::NXDomain
    );
}

#[test]
fn a_peers_zone_is_asked_of_the_peer() {
    let mut r = resolver(false, false);
    let t0 = Instant::now();
    let Action::AskPeer { peer, query: fwd } = r.handle_query(
        t0,
        &query(500, "sensor9.gw2.ovl.example.", RecordType::A),
        "lan client",
        None,
    ) else {
        panic!()
    };
    assert_eq!(peer, 2);
    let asked = Message::from_vec(&fwd).unwrap();
    assert_eq!(asked.queries[0].name(), &name("sensor9.gw2.ovl.example."));
    // The peer answers (authoritatively, with its own id scheme mirrored).
    let mut answer = Message::response(asked.metadata.id, OpCode::Query);
    answer.add_query(asked.queries[0].clone());
    answer.add_answer(Record::from_rdata(
        name("sensor9.gw2.ovl.example."),
        60,
        RData::A(A(Ipv4Addr::new(100, 64, 2, 10))),
    ));
    // Planted: a record outside the peer's zone must not pass through.
    answer.add_answer(Record::from_rdata(
        name("bank.example."),
        60,
        RData::A(A(Ipv4Addr::new(192, 0, 2, 66))),
    ));
    // Planted: the asked name, pointed at another site and outside the overlay: a peer's
    // addresses are believed only inside its certified blocks (100.64.2.0/24).
    for elsewhere in [Ipv4Addr::new(100, 64, 1, 10), Ipv4Addr::new(192, 0, 2, 67)] {
        answer.add_answer(Record::from_rdata(
            name("sensor9.gw2.ovl.example."),
            60,
            RData::A(A(elsewhere)),
        ));
    }
    let bytes = answer.to_vec().unwrap();
    assert!(
        r.handle_peer_answer(&bytes, 3).is_none(),
        "an answer from another peer is not believed"
    );
    let (client, resp) = r.handle_peer_answer(&bytes, 2).unwrap();
    let m = Message::from_vec(&resp).unwrap();
    assert_eq!((client, m.metadata.id), ("lan client", 500));
    assert_eq!(a_records(&m), vec![Ipv4Addr::new(100, 64, 2, 10)]);
    assert!(r.handle_peer_answer(&bytes, 2).is_none(), "answered once");
    // Reverse lookups for the peer's block go to the peer too.
    assert!(matches!(
        r.handle_query(
            t0,
            &query(1, "10.2.64.100.in-addr.arpa.", RecordType::PTR),
            "c",
            None
        ),
        Action::AskPeer { peer: 2, .. }
    ));
}

#[test]
fn unanswered_asks_time_out_with_servfail() {
    let mut r = resolver(false, false);
    let t0 = Instant::now();
    assert!(matches!(
        r.handle_query(
            t0,
            &query(9, "a.gw2.ovl.example.", RecordType::A),
            "c",
            None
        ),
        Action::AskPeer { .. }
    ));
    assert!(r.handle_timeout(t0 + Duration::from_secs(2)).is_empty());
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(3)));
    let out = r.handle_timeout(t0 + Duration::from_secs(3));
    let (_, resp) = &out[0];
    let m = Message::from_vec(resp).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (9, ResponseCode::ServFail)
    );
}

#[test]
fn names_outside_the_overlay_go_upstream_or_are_refused() {
    let mut r = resolver(false, false);
    check(
        &mut r,
        "example.com.",
        RecordType::A,
        ResponseCode::Refused,
        &[],
        false,
    );
    let mut r = resolver(true, false);
    let Action::AskUpstream {
        name: n,
        record_type,
        key,
    } = r.handle_query(
        Instant::now(),
        &query(3, "www.example.com.", RecordType::A),
        "c",
        None,
    )
    else {
        panic!()
    };
    assert_eq!((n, record_type), (name("www.example.com."), RecordType::A));
    let rec = Record::from_rdata(
        name("www.example.com."),
        300,
        RData::A(A(Ipv4Addr::new(192, 0, 2, 80))),
    );
    let (_, resp) = r.complete(key, Ok(vec![rec])).unwrap();
    let m = Message::from_vec(&resp).unwrap();
    assert_eq!(
        (
            m.metadata.id,
            m.metadata.response_code,
            m.metadata.recursion_available
        ),
        (3, ResponseCode::NoError, true)
    );
    assert_eq!(a_records(&m), vec![Ipv4Addr::new(192, 0, 2, 80)]);
    let Action::AskUpstream { key, .. } = r.handle_query(
        Instant::now(),
        &query(4, "nx.example.com.", RecordType::A),
        "c",
        None,
    ) else {
        panic!()
    };
    let (_, resp) = r.complete(key, Err(ResponseCode::NXDomain)).unwrap();
    assert_eq!(
        Message::from_vec(&resp).unwrap().metadata.response_code,
        ResponseCode::NXDomain
    );
}

#[test]
fn the_cloud_is_asked_about_unknown_overlay_names_when_configured() {
    let mut r = resolver(false, true);
    let Action::AskCloud { name: n, key, .. } = r.handle_query(
        Instant::now(),
        &query(5, "pump.gw7.ovl.example.", RecordType::A),
        "c",
        None,
    ) else {
        panic!()
    };
    assert_eq!(n, name("pump.gw7.ovl.example."));
    let (_, resp) = r.complete(key, Err(ResponseCode::NXDomain)).unwrap();
    assert_eq!(
        Message::from_vec(&resp).unwrap().metadata.response_code,
        ResponseCode::NXDomain
    );
    // AAAA too (issue 53: the cloud knows names' IPv6 addresses).
    let asked = r.handle_query(
        Instant::now(),
        &query(6, "pump.gw7.ovl.example.", RecordType::AAAA),
        "c",
        None,
    );
    assert!(
        matches!(
            asked,
            Action::AskCloud {
                record_type: RecordType::AAAA,
                ..
            }
        ),
        "{asked:?}"
    );
}

#[test]
fn peers_get_our_zone_only() {
    let mut r = resolver(true, true);
    let ask = |r: &mut Resolver<&'static str>, q: &str| {
        respond(r.handle_query(Instant::now(), &query(1, q, RecordType::A), "peer", Some(2)))
    };
    assert_eq!(
        a_records(&ask(&mut r, "sensor1.gw1.ovl.example.")),
        vec![Ipv4Addr::new(100, 64, 1, 10)]
    );
    for q in [
        "www.example.com.",
        "x.gw2.ovl.example.",
        "x.gw9.ovl.example.",
    ] {
        assert_eq!(
            ask(&mut r, q).metadata.response_code,
            ResponseCode::Refused,
            "{q}"
        );
    }
}

#[test]
fn malformed_and_unexpected_messages() {
    let mut r = resolver(true, false);
    let now = Instant::now();
    assert_eq!(
        r.handle_query(now, b"\x01\x02", "c", None),
        Action::Drop(Drop::Malformed)
    );
    let q = query(1, "a.gw1.ovl.example.", RecordType::A);
    for len in 0..q.len() {
        let _ = r.handle_query(now, &q[..len], "c", None);
    }
    let mut resp = Message::response(1, OpCode::Query);
    resp.add_query(Query::query(name("a.b."), RecordType::A));
    assert_eq!(
        r.handle_query(now, &resp.to_vec().unwrap(), "c", None),
        Action::Drop(Drop::Unexpected)
    );
    let mut two = Message::new(8, MessageType::Query, OpCode::Query);
    two.add_query(Query::query(name("a.gw1.ovl.example."), RecordType::A));
    two.add_query(Query::query(name("b.gw1.ovl.example."), RecordType::A));
    assert_eq!(
        respond(r.handle_query(now, &two.to_vec().unwrap(), "c", None))
            .metadata
            .response_code,
        ResponseCode::FormErr
    );
    let mut notify = Message::new(8, MessageType::Query, OpCode::Notify);
    notify.add_query(Query::query(name("a.gw1.ovl.example."), RecordType::A));
    assert_eq!(
        respond(r.handle_query(now, &notify.to_vec().unwrap(), "c", None))
            .metadata
            .response_code,
        ResponseCode::NotImp
    );
    let mut chaos = Message::new(8, MessageType::Query, OpCode::Query);
    let mut cq = Query::query(name("version.bind."), RecordType::TXT);
    cq.query_class = DNSClass::CH;
    chaos.add_query(cq);
    assert_eq!(
        respond(r.handle_query(now, &chaos.to_vec().unwrap(), "c", None))
            .metadata
            .response_code,
        ResponseCode::Refused
    );
    assert!(r.stats().dropped >= 2);
}

#[test]
fn a_flood_of_forwarded_queries_stays_bounded() {
    // A hundred clients (numbered), none of them over its own share.
    let mut r: Resolver<u32> = Resolver::new(config(true, false));
    let now = Instant::now();
    let mut servfail = 0;
    for i in 0..3000u16 {
        let client = u32::from(i % 100);
        if let Action::Respond(_) = r.handle_query(
            now,
            &query(i, "www.example.com.", RecordType::A),
            client,
            None,
        ) {
            servfail += 1;
        }
    }
    assert_eq!(
        servfail,
        3000 - 1024,
        "at most 1024 queries wait; the rest get SERVFAIL at once"
    );
    assert_eq!(r.stats().client_busy, 0);
}

#[test]
fn one_client_cannot_take_every_place_for_waiting_questions() {
    let mut r = resolver(true, false);
    let now = Instant::now();
    let ask = |r: &mut Resolver<&'static str>, id: u16, who: &'static str| {
        r.handle_query(
            now,
            &query(id, "www.example.com.", RecordType::A),
            who,
            None,
        )
    };
    let mut keys = Vec::new();
    for id in 0..100 {
        match ask(&mut r, id, "flooder") {
            Action::AskUpstream { key, .. } => keys.push(key),
            Action::Respond(bytes) => {
                let m = Message::from_vec(&bytes).unwrap();
                assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
            }
            other => panic!("{other:?}"),
        }
    }
    let cap = usize::from(cyphonic_resolver::MAX_PENDING_PER_CLIENT);
    assert_eq!(keys.len(), cap);
    assert_eq!(r.stats().client_busy, 100 - cap as u64);
    // Another device is served meanwhile.
    assert!(matches!(
        ask(&mut r, 1, "device"),
        Action::AskUpstream { .. }
    ));
    // An answer frees the flooder one place, and only one.
    assert!(r.complete(keys[0], Ok(vec![])).is_some());
    assert!(matches!(
        ask(&mut r, 200, "flooder"),
        Action::AskUpstream { .. }
    ));
    assert!(matches!(ask(&mut r, 201, "flooder"), Action::Respond(_)));
    // A timeout frees them all.
    let later = now + Duration::from_secs(10);
    assert_eq!(r.handle_timeout(later).len(), cap + 1);
    assert!(matches!(
        r.handle_query(
            later,
            &query(300, "www.example.com.", RecordType::A),
            "flooder",
            None
        ),
        Action::AskUpstream { .. }
    ));
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), peer in proptest::option::of(0u32..4)) {
        let mut r = resolver(true, true);
        let _ = r.handle_query(Instant::now(), &data, "c", peer);
        let _ = r.handle_peer_answer(&data, 2);
    }
}

/// Upstream answers larger than the client takes over UDP come back truncated (TC), never cut
/// mid-record; EDNS clients get an OPT record back and up to 1232 bytes.
#[test]
fn large_answers_respect_the_clients_udp_size() {
    let many: Vec<Record> = (0..60u8)
        .map(|i| {
            Record::from_rdata(
                name("many.example.com."),
                300,
                RData::A(A(Ipv4Addr::new(192, 0, 2, i))),
            )
        })
        .collect();
    let mut r = resolver(true, false);
    let ask = |r: &mut Resolver<&'static str>, edns: Option<u16>| {
        let mut m = Message::new(9, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(name("many.example.com."), RecordType::A));
        if let Some(size) = edns {
            let mut e = hickory_proto::op::Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        let Action::AskUpstream { key, .. } =
            r.handle_query(Instant::now(), &m.to_vec().unwrap(), "c", None)
        else {
            panic!()
        };
        key
    };
    // 60 A records are about 1 KB: too much for a plain 512-byte client.
    let key = ask(&mut r, None);
    let (_, resp) = r.complete(key, Ok(many.clone())).unwrap();
    assert!(resp.len() <= 512, "{}", resp.len());
    let m = Message::from_vec(&resp).unwrap();
    assert!(m.metadata.truncation && m.answers.is_empty() && m.edns.is_none());
    assert_eq!((m.metadata.id, m.queries.len()), (9, 1));
    // An EDNS client with a 4096-byte buffer gets them all, and our OPT (1232) back.
    let key = ask(&mut r, Some(4096));
    let (_, resp) = r.complete(key, Ok(many.clone())).unwrap();
    let m = Message::from_vec(&resp).unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 60);
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(1232));
    // Twice as many do not fit 1232 bytes even for it.
    let key = ask(&mut r, Some(4096));
    let doubled: Vec<Record> = many.iter().chain(&many).cloned().collect();
    let (_, resp) = r.complete(key, Ok(doubled)).unwrap();
    assert!(resp.len() <= 1232);
    assert!(Message::from_vec(&resp).unwrap().metadata.truncation);
}

/// DNS rebinding: an upstream answer for a name outside the overlay may not point devices
/// into the overlay or at private, loopback or link-local addresses; those records are
/// dropped and counted, public ones pass. The cloud's answers (overlay names) are not judged
/// so.
#[test]
fn upstream_answers_pointing_inward_are_dropped() {
    use hickory_proto::rr::rdata::AAAA;
    let mut r = resolver(true, false);
    let Action::AskUpstream { key, .. } = r.handle_query(
        Instant::now(),
        &query(4, "evil.example.com.", RecordType::A),
        "c",
        None,
    ) else {
        panic!()
    };
    let at = |data| Record::from_rdata(name("evil.example.com."), 60, data);
    let records = vec![
        at(RData::A(A(Ipv4Addr::new(100, 64, 1, 10)))),
        at(RData::A(A(Ipv4Addr::new(100, 127, 255, 1)))),
        at(RData::A(A(Ipv4Addr::new(10, 0, 0, 1)))),
        at(RData::A(A(Ipv4Addr::new(172, 16, 5, 5)))),
        at(RData::A(A(Ipv4Addr::new(192, 168, 1, 1)))),
        at(RData::A(A(Ipv4Addr::new(127, 0, 0, 1)))),
        at(RData::A(A(Ipv4Addr::new(169, 254, 169, 254)))),
        at(RData::A(A(Ipv4Addr::UNSPECIFIED))),
        at(RData::AAAA(AAAA("fd7a::1".parse().unwrap()))),
        at(RData::AAAA(AAAA("fe80::1".parse().unwrap()))),
        at(RData::AAAA(AAAA("::1".parse().unwrap()))),
        at(RData::AAAA(AAAA("::ffff:10.0.0.1".parse().unwrap()))),
        // Public: these pass.
        at(RData::A(A(Ipv4Addr::new(192, 0, 2, 80)))),
        at(RData::A(A(Ipv4Addr::new(100, 128, 0, 1)))),
        at(RData::AAAA(AAAA("2001:db8::80".parse().unwrap()))),
    ];
    let (_, resp) = r.complete(key, Ok(records)).unwrap();
    let m = Message::from_vec(&resp).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        a_records(&m),
        vec![Ipv4Addr::new(192, 0, 2, 80), Ipv4Addr::new(100, 128, 0, 1)]
    );
    assert_eq!(m.answers.len(), 3, "{:?}", m.answers);
    assert_eq!(r.stats().rebinding, 12);
}

/// A question given up on (SERVFAIL after the timeout) keeps its key out of use while its
/// upstream lookup may still answer: 66,000 later questions never get that key, and the late
/// answer settles nothing (counted as dropped) instead of answering whoever holds the key
/// next.
#[test]
fn a_late_upstream_answer_cannot_settle_another_question() {
    let mut r = resolver(true, false);
    let t0 = Instant::now();
    let ask = |r: &mut Resolver<&'static str>, id: u16, qname: &str, at: Instant| {
        let Action::AskUpstream { key, .. } =
            r.handle_query(at, &query(id, qname, RecordType::A), "c", None)
        else {
            panic!("not asked upstream")
        };
        key
    };
    let first = ask(&mut r, 1, "first.example.com.", t0);
    let later = t0 + Duration::from_secs(4);
    assert_eq!(r.handle_timeout(later).len(), 1, "SERVFAIL for the first");
    // Enough questions to go round the whole key space, each settled at once.
    for i in 0..66_000u32 {
        let key = ask(&mut r, 2, "other.example.com.", later);
        assert_ne!(key, first, "question {i} got the key of one still out");
        r.complete(key, Ok(vec![])).unwrap();
    }
    let dropped = r.stats().dropped;
    let late = Record::from_rdata(
        name("first.example.com."),
        60,
        RData::A(A(Ipv4Addr::new(192, 0, 2, 1))),
    );
    assert!(r.complete(first, Ok(vec![late])).is_none());
    assert_eq!(r.stats().dropped, dropped + 1);
}
