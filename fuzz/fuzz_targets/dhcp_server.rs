//! The DHCP server: any sequence of messages, from any MACs, at any times, never panics, and
//! never breaks the lease table's invariants: every reply parses, every address handed out is
//! inside the certified block, and no address is bound to two devices at once.
#![no_main]

use std::collections::HashMap;
use std::net::Ipv4Addr;

use cyphonic_vip::{DhcpConfig, Reservation, Server};
use dhcproto::Decodable as _;
use dhcproto::v4::Message;

const T0: u64 = 1_800_000_000;

fn config() -> DhcpConfig {
    DhcpConfig {
        server: Ipv4Addr::new(100, 64, 1, 1),
        block: "100.64.1.0/24".parse().expect("block"),
        // A small pool, so exhaustion and reclaiming are reached.
        pool: (Ipv4Addr::new(100, 64, 1, 100), Ipv4Addr::new(100, 64, 1, 107)),
        lease_secs: 60,
        mtu: 1420,
        domain: "gw1.ovl.example".into(),
        reservations: vec![Reservation {
            mac: [0x02, 0, 0, 0, 0, 0xee],
            ip: Ipv4Addr::new(100, 64, 1, 50),
            hostname: Some("plc".into()),
        }],
        new_lease_share: 0.5,
        new_lease_window_secs: 30,
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let cfg = config();
    let mut server = Server::new(cfg.clone(), Vec::new(), T0).expect("config");
    let mut now = T0;
    // Messages: [mac byte, seconds to advance, length, bytes...]; the MAC's last byte picks
    // one of a few devices so that conversations continue across messages.
    let mut rest = data;
    while let [mac_byte, advance, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (msg, next) = tail.split_at(len);
        rest = next;
        now += u64::from(*advance);
        let mac = [0x02, 0, 0, 0, 0, mac_byte % 8 | (mac_byte & 0xe0)];
        // Steer: messages that start with a plausible header get a real chaddr and cookie.
        let mut msg = msg.to_vec();
        if msg.len() >= 240 && msg[0] == 1 {
            msg[1] = 1;
            msg[2] = 6;
            msg[28..34].copy_from_slice(&mac);
            msg[236..240].copy_from_slice(&[99, 130, 83, 99]);
        }
        if let Ok(Some(reply)) = server.handle(now, &msg, mac) {
            let parsed = Message::from_bytes(&reply.payload).expect("our reply parses");
            let ip = parsed.yiaddr();
            assert!(
                ip.is_unspecified() || cfg.block.contains(&ip),
                "{ip} handed out"
            );
        }
        if *advance > 200 {
            server.handle_timeout(now);
        }
        while server.poll_event().is_some() {}
        let mut holders: HashMap<Ipv4Addr, [u8; 6]> = HashMap::new();
        for l in server.active() {
            assert!(cfg.block.contains(&l.ip));
            if let Some(other) = holders.insert(l.ip, l.mac) {
                assert_eq!(other, l.mac, "{} bound twice", l.ip);
            }
        }
        // The saved form comes back as it was.
        let _ = server.take_dirty();
    }
    let saved = server.leases();
    let again = Server::new(cfg, saved, now).expect("reload");
    assert_eq!(again.active().count(), server.active().count());
});
