//! The DNS service: any message from a LAN device, from a peer over the tunnel, or as a
//! peer's answer, never panics; every response it gives parses as DNS and fits the size the
//! asker can take.
#![no_main]

use std::net::Ipv4Addr;
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use cyphonic_resolver::{Action, PeerZone, Resolver, ZoneConfig};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::Name;

fn resolver() -> Resolver<u32> {
    let name = |s: &str| Name::from_str(s).expect("name");
    let mut r = Resolver::new(ZoneConfig {
        overlay_domain: name("ovl.example."),
        own_name: name("gw1.ovl.example."),
        own_ip: Ipv4Addr::new(100, 64, 1, 1),
        own_ip6: None,
        own_block: "100.64.1.0/24".parse().expect("block"),
        overlay: "100.64.0.0/10".parse().expect("overlay"),
        ttl: 60,
        upstream: true,
        ask_cloud: true,
    });
    r.set_hosts([
        ("host", Some(Ipv4Addr::new(100, 64, 1, 10)), None),
        (
            "sensor",
            Some(Ipv4Addr::new(100, 64, 1, 100)),
            "fd7a:0:1:100::100".parse().ok(),
        ),
        ("thread", None, "fd7a:0:1:100::101".parse().ok()),
    ]);
    r.set_peers(vec![PeerZone {
        peer: 1,
        name: name("gw2.ovl.example."),
        blocks: vec!["100.64.2.0/24".parse().expect("block")],
    }]);
    r
}

/// Every response goes out over UDP to whoever asked.
fn check(resp: &[u8]) {
    let m = Message::from_vec(resp).expect("our response parses");
    // Without EDNS the classic 512 bytes; with it, at most what we advertise.
    let limit = if m.edns.is_some() { 1232 } else { 512 };
    assert!(resp.len() <= limit, "{} bytes", resp.len());
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut r = resolver();
    let t0 = Instant::now();
    let mut now = t0;
    let mut keys = Vec::new();
    let mut asked: Option<Vec<u8>> = None;
    let mut rest = data;
    // Messages: [what, length, bytes...].
    while let [what, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (msg, next) = tail.split_at(len);
        rest = next;
        now += Duration::from_millis(u64::from(what >> 3) * 50);
        let action = match what % 4 {
            0 => r.handle_query(now, msg, 0, None),
            1 => r.handle_query(now, msg, 1, Some(1)),
            2 => {
                // A short message answers the last question asked of the peer (QR set, the
                // message's first byte as the response code); a longer one is what it is.
                let answer = match (&asked, msg) {
                    (Some(q), [] | [_]) if q.len() >= 4 => {
                        let mut a = q.clone();
                        a[2] |= 0x80;
                        a[3] = (a[3] & 0xf0) | (msg.first().copied().unwrap_or(0) & 0x0f);
                        a
                    }
                    _ => msg.to_vec(),
                };
                if let Some((_, resp)) = r.handle_peer_answer(&answer, 1 + u32::from(what >> 7)) {
                    check(&resp);
                }
                continue;
            }
            _ => {
                // Finish an upstream or cloud lookup, with no records or a failure.
                if let Some(key) = keys.pop() {
                    let result = if what & 8 == 0 { Ok(Vec::new()) } else { Err(ResponseCode::NXDomain) };
                    if let Some((_, resp)) = r.complete(key, result) {
                        check(&resp);
                    }
                }
                continue;
            }
        };
        match action {
            Action::Respond(resp) => check(&resp),
            Action::AskPeer { query, .. } => {
                Message::from_vec(&query).expect("our query parses");
                asked = Some(query);
            }
            Action::AskUpstream { key, .. } | Action::AskCloud { key, .. } => keys.push(key),
            _ => {}
        }
        for (_, resp) in r.handle_timeout(now) {
            check(&resp);
        }
    }
});
