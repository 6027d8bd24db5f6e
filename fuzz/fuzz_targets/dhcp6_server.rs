//! The DHCPv6 server: any sequence of messages, from any MACs, at any times, never panics, and
//! never breaks its invariants: every reply parses, every address handed out is inside the
//! pool or a reservation, no address is bound to two clients at once, no MAC holds more than
//! its share of bindings, and what it would save loads again.
#![no_main]

use std::collections::HashMap;
use std::net::Ipv6Addr;

use cyphonic_vip::testing::read_reply6;
use cyphonic_vip::{Dhcp6Config, PER_MAC, Reservation6, Server6};

const T0: u64 = 1_800_000_000;

fn config() -> Dhcp6Config {
    let prefix = "fd7a:0:1:100::/64".parse().expect("prefix");
    Dhcp6Config {
        prefix,
        // A small pool, so exhaustion and reclaiming are reached.
        pool: (
            "fd7a:0:1:100::1000".parse().expect("first"),
            "fd7a:0:1:100::1007".parse().expect("last"),
        ),
        lease_secs: 60,
        server_mac: [0x02, 0, 0, 0, 0, 1],
        dns: Some("fd7a:0:1:100::1".parse().expect("dns")),
        domain: "gw1.ovl.example".into(),
        reservations: vec![Reservation6 {
            mac: [0x02, 0, 0, 0, 0, 0xee],
            ip: "fd7a:0:1:100::50".parse().expect("reserved"),
        }],
        new_lease_share: 0.5,
        new_lease_window_secs: 30,
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let cfg = config();
    let mut server = Server6::new(cfg.clone(), Vec::new(), T0).expect("config");
    let mut now = T0;
    let in_scope = |ip: Ipv6Addr| {
        (cfg.pool.0..=cfg.pool.1).contains(&ip) || cfg.reservations.iter().any(|r| r.ip == ip)
    };
    // Messages: [mac byte, seconds to advance, length, bytes...].
    let mut rest = data;
    while let [mac_byte, advance, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (msg, next) = tail.split_at(len);
        rest = next;
        now += u64::from(*advance);
        let mac = [0x02, 0, 0, 0, 0, mac_byte % 8 | (mac_byte & 0xe0)];
        if let Ok(reply) = server.handle(now, msg, mac) {
            let read = read_reply6(&reply.payload).expect("our reply parses");
            for (_, ip, _) in read.ias {
                assert!(ip.is_none_or(in_scope), "{ip:?} handed out");
            }
        }
        if *advance > 200 {
            server.handle_timeout(now);
        }
        while server.poll_event().is_some() {}
        let mut holders: HashMap<Ipv6Addr, (Vec<u8>, u32)> = HashMap::new();
        let mut per_mac: HashMap<[u8; 6], usize> = HashMap::new();
        for l in server.active() {
            assert!(in_scope(l.ip), "{} bound", l.ip);
            assert!(holders.insert(l.ip, (l.duid.clone(), l.iaid)).is_none(), "{} bound twice", l.ip);
            *per_mac.entry(l.mac).or_default() += 1;
        }
        assert!(per_mac.values().all(|n| *n <= PER_MAC));
        let _ = server.take_dirty();
    }
    let again = Server6::new(cfg, server.leases(), now).expect("reload");
    assert_eq!(again.active().count(), server.active().count());
});
