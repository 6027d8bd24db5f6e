//! A lease file as the adapter may find it at start (damaged, hand-edited, from another
//! version, or hostile): decoded, handed to the DHCP server, which then serves a device's
//! conversation. Loading never panics, the server keeps its invariants (one device per
//! address, addresses inside the pool's block), and what it would save decodes again.
#![no_main]

use std::collections::HashMap;
use std::net::Ipv4Addr;

use cyphonic_vip::testing::{DhcpOption, MessageType, client_message};
use cyphonic_vip::{Dhcp6Config, DhcpConfig, Server, Server6};

const NOW: u64 = 1_800_000_000;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(table) = cyphonic_vip::file::decode(data) else {
        return;
    };
    let (saved, saved6) = (table.leases, table.leases6);
    let prefix = "fd7a:0:1:100::/64".parse().unwrap();
    let cfg6 = Dhcp6Config {
        prefix,
        pool: Dhcp6Config::default_pool(prefix),
        lease_secs: 3600,
        server_mac: [0x02, 0, 0, 0, 0, 1],
        dns: None,
        domain: "gw1.ovl.example".into(),
        reservations: vec![],
        new_lease_share: 1.0,
        new_lease_window_secs: 60,
    };
    if let Ok(s6) = Server6::new(cfg6, saved6, NOW) {
        let mut owner = HashMap::new();
        for l in s6.active() {
            assert!(prefix.contains(&l.ip), "an active binding outside the /64: {}", l.ip);
            assert!(owner.insert(l.ip, (l.duid.clone(), l.iaid)).is_none(), "{} bound twice", l.ip);
        }
    }
    let cfg = DhcpConfig {
        server: Ipv4Addr::new(100, 64, 1, 1),
        block: "100.64.1.0/24".parse().unwrap(),
        pool: (Ipv4Addr::new(100, 64, 1, 100), Ipv4Addr::new(100, 64, 1, 199)),
        lease_secs: 3600,
        mtu: 1420,
        domain: "gw1.ovl.example".into(),
        reservations: vec![],
        new_lease_share: 1.0,
        new_lease_window_secs: 60,
    };
    let Ok(mut s) = Server::new(cfg.clone(), saved, NOW) else {
        return;
    };
    // A device's whole conversation against whatever was loaded.
    let mac = [0x02, 0, 0, 0, 0x42, 0x42];
    let discover = client_message(MessageType::Discover, mac, 1, vec![], Ipv4Addr::UNSPECIFIED, false);
    if let Ok(Some(offer)) = s.handle(NOW, &discover, mac) {
        let ip = cyphonic_vip::testing::yiaddr(&offer.payload);
        let request = client_message(
            MessageType::Request,
            mac,
            2,
            vec![DhcpOption::ServerIdentifier(cfg.server), DhcpOption::RequestedIpAddress(ip)],
            Ipv4Addr::UNSPECIFIED,
            false,
        );
        let _ = s.handle(NOW, &request, mac);
    }
    s.handle_timeout(NOW + 7200);
    let mut owner: HashMap<Ipv4Addr, [u8; 6]> = HashMap::new();
    for l in s.active() {
        assert!(cfg.block.contains(&l.ip), "an active lease outside the block: {}", l.ip);
        if let Some(other) = owner.insert(l.ip, l.mac) {
            assert_eq!(other, l.mac, "two devices hold {}", l.ip);
        }
    }
    let leases = s.leases();
    let table = cyphonic_vip::file::Table { leases, ..cyphonic_vip::file::Table::default() };
    let bytes = cyphonic_vip::file::encode(&table, NOW).expect("encodes");
    assert_eq!(cyphonic_vip::file::decode(&bytes).map(|t| t.leases.len()), Ok(table.leases.len()));
});
