//! What comes back to the resolver with records in it: a peer adapter's answer to a question
//! the resolver really forwarded (any records, names, types, addresses, response code, id),
//! and an upstream lookup's records. Whatever arrives, the device's answer parses, and it
//! never carries an address a peer's certificate does not cover (from the peer) nor one
//! inside the overlay or a private range (from upstream).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Instant;

use arbitrary::Arbitrary;
use cyphonic_resolver::{Action, PeerZone, Resolver, ZoneConfig};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

const PEER: u32 = 2;

#[derive(Arbitrary, Debug)]
enum NameChoice {
    Asked,
    InZone(u8),
    Elsewhere,
}

#[derive(Arbitrary, Debug)]
enum Data {
    V4([u8; 4]),
    V6([u8; 16]),
    Alias(NameChoice),
    Text(String),
}

#[derive(Arbitrary, Debug)]
struct Rec {
    name: NameChoice,
    ttl: u32,
    data: Data,
}

#[derive(Arbitrary, Debug)]
struct Input {
    upstream: bool,
    aaaa: bool,
    /// Answer from this peer instead of the one asked.
    from_peer: Option<u32>,
    /// Another id than the question's.
    id: Option<u16>,
    rcode: u8,
    answers: Vec<Rec>,
    authorities: Vec<Rec>,
}

fn name(s: &str) -> Name {
    Name::from_str(s).expect("a name")
}

fn pick(c: &NameChoice, asked: &Name) -> Name {
    match c {
        NameChoice::Asked => asked.clone(),
        NameChoice::InZone(n) => name(&format!("h{n}.gw2.ovl.example.")),
        NameChoice::Elsewhere => name("www.example.com."),
    }
}

fn record(r: &Rec, asked: &Name) -> Record {
    let data = match &r.data {
        Data::V4(a) => RData::A(A(Ipv4Addr::from(*a))),
        Data::V6(a) => RData::AAAA(AAAA(Ipv6Addr::from(*a))),
        Data::Alias(c) => RData::CNAME(CNAME(pick(c, asked))),
        Data::Text(t) => RData::TXT(TXT::new(vec![t.chars().take(200).collect()])),
    };
    Record::from_rdata(pick(&r.name, asked), r.ttl, data)
}

fn addresses(resp: &[u8]) -> Vec<IpAddr> {
    let m = Message::from_vec(resp).expect("the device's answer parses");
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let mut r: Resolver<u32> = Resolver::new(ZoneConfig {
        overlay_domain: name("ovl.example."),
        own_name: name("gw1.ovl.example."),
        own_ip: Ipv4Addr::new(100, 64, 1, 1),
        own_ip6: None,
        own_block: "100.64.1.0/24".parse().unwrap(),
        overlay: "100.64.0.0/10".parse().unwrap(),
        ttl: 60,
        upstream: true,
        ask_cloud: false,
    });
    r.set_peers(vec![PeerZone {
        peer: PEER,
        name: name("gw2.ovl.example."),
        blocks: vec!["100.64.2.0/24".parse().unwrap()],
    }]);
    let asked = if input.upstream { name("www.example.com.") } else { name("cam.gw2.ovl.example.") };
    let qtype = if input.aaaa { RecordType::AAAA } else { RecordType::A };
    let mut q = Message::new(0x1234, MessageType::Query, OpCode::Query);
    q.add_query(Query::query(asked.clone(), qtype));
    let Ok(query) = q.to_vec() else { return };
    let answers: Vec<Record> = input.answers.iter().take(32).map(|a| record(a, &asked)).collect();
    match r.handle_query(Instant::now(), &query, 1, None) {
        Action::AskPeer { peer, query: fwd } => {
            let Ok(fwd) = Message::from_vec(&fwd) else { return };
            let mut a = Message::new(input.id.unwrap_or(fwd.metadata.id), MessageType::Response, OpCode::Query);
            a.metadata.response_code = ResponseCode::from_low(input.rcode & 0x0f);
            a.add_query(Query::query(asked.clone(), qtype));
            a.add_answers(answers);
            a.add_authorities(input.authorities.iter().take(8).map(|x| record(x, &asked)));
            let Ok(bytes) = a.to_vec() else { return };
            if let Some((_, resp)) = r.handle_peer_answer(&bytes, input.from_peer.unwrap_or(peer)) {
                for ip in addresses(&resp) {
                    assert!(
                        matches!(ip, IpAddr::V4(v4) if "100.64.2.0/24".parse::<ipnet::Ipv4Net>().unwrap().contains(&v4)),
                        "a peer's answer led outside its blocks: {ip}"
                    );
                }
            }
        }
        Action::AskUpstream { key, .. } => {
            let result = if input.rcode & 1 == 0 { Ok(answers) } else { Err(ResponseCode::NXDomain) };
            if let Some((_, resp)) = r.complete(key, result) {
                for ip in addresses(&resp) {
                    let inward = match ip {
                        IpAddr::V4(v4) => v4.is_private() || v4.is_loopback() || v4.is_link_local() || v4.is_unspecified()
                            || "100.64.0.0/10".parse::<ipnet::Ipv4Net>().unwrap().contains(&v4),
                        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xfe00) == 0xfc00
                            || (v6.segments()[0] & 0xffc0) == 0xfe80
                            || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_private() || v4.is_loopback()
                                || "100.64.0.0/10".parse::<ipnet::Ipv4Net>().unwrap().contains(&v4)),
                    };
                    assert!(!inward, "an upstream answer led inward: {ip}");
                }
            }
        }
        _ => {}
    }
});
