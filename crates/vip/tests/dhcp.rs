//! The DHCP server against RFC 2131's conversations, its limits, and hostile input.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::needless_pass_by_value
)]

use std::net::Ipv4Addr;

use cyphonic_vip::testing::{DhcpOption, MessageType, client_message};
use cyphonic_vip::{
    ConfigError, DhcpConfig, Half, Ignore, Lease, LeaseEvent, Reply, Reservation, Server, Share,
};
use dhcproto::Decodable as _;
use dhcproto::v4::{Message, OptionCode};

const T0: u64 = 1_800_000_000;
const GW: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 1);
const ZERO: Ipv4Addr = Ipv4Addr::UNSPECIFIED;

fn config(first: u8, last: u8) -> DhcpConfig {
    DhcpConfig {
        server: GW,
        block: "100.64.1.0/24".parse().unwrap(),
        pool: (
            Ipv4Addr::new(100, 64, 1, first),
            Ipv4Addr::new(100, 64, 1, last),
        ),
        lease_secs: 3600,
        mtu: 1420,
        domain: "gw1.ovl.example".into(),
        reservations: vec![Reservation {
            mac: mac(0xee),
            ip: Ipv4Addr::new(100, 64, 1, 50),
            hostname: Some("plc".into()),
        }],
        new_lease_share: 1.0,
        new_lease_window_secs: 60,
    }
}

fn mac(n: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x01, n]
}

fn server(first: u8, last: u8) -> Server {
    Server::new(config(first, last), Vec::new(), T0).unwrap()
}

fn opt_ip(ip: Ipv4Addr) -> DhcpOption {
    DhcpOption::RequestedIpAddress(ip)
}

fn parse(r: &Reply) -> Message {
    Message::from_bytes(&r.payload).unwrap()
}

fn kind(r: &Reply) -> MessageType {
    parse(r).opts().msg_type().unwrap()
}

/// DISCOVER, OFFER, REQUEST, ACK for `m`; returns the address.
fn dora(s: &mut Server, now: u64, m: [u8; 6], host: Option<&str>) -> Ipv4Addr {
    let offer = s
        .handle(
            now,
            &client_message(MessageType::Discover, m, 1, vec![], ZERO, false),
            m,
        )
        .unwrap()
        .unwrap();
    assert_eq!(kind(&offer), MessageType::Offer);
    let ip = parse(&offer).yiaddr();
    let mut opts = vec![DhcpOption::ServerIdentifier(GW), opt_ip(ip)];
    if let Some(h) = host {
        opts.push(DhcpOption::Hostname(h.into()));
    }
    let ack = s
        .handle(
            now,
            &client_message(MessageType::Request, m, 2, opts, ZERO, false),
            m,
        )
        .unwrap()
        .unwrap();
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(parse(&ack).yiaddr(), ip);
    ip
}

#[test]
fn discover_offer_request_ack_with_every_option() {
    let mut s = server(100, 200);
    let m = mac(1);
    let offer = s
        .handle(
            T0,
            &client_message(MessageType::Discover, m, 7, vec![], ZERO, false),
            m,
        )
        .unwrap()
        .unwrap();
    let msg = parse(&offer);
    assert_eq!(
        (msg.xid(), msg.yiaddr()),
        (7, Ipv4Addr::new(100, 64, 1, 100))
    );
    // Without the broadcast flag, the offer goes to the offered address at the client's MAC.
    assert_eq!((offer.dst_ip, offer.dst_mac), (msg.yiaddr(), m));
    let o = msg.opts();
    assert_eq!(
        o.get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(GW))
    );
    assert_eq!(
        o.get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
    );
    assert_eq!(
        o.get(OptionCode::Router),
        Some(&DhcpOption::Router(vec![GW]))
    );
    assert_eq!(
        o.get(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![GW]))
    );
    assert_eq!(
        o.get(OptionCode::DomainName),
        Some(&DhcpOption::DomainName("gw1.ovl.example".into()))
    );
    assert_eq!(
        o.get(OptionCode::InterfaceMtu),
        Some(&DhcpOption::InterfaceMtu(1420))
    );
    assert_eq!(
        o.get(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(3600))
    );
    assert_eq!(o.get(OptionCode::Renewal), Some(&DhcpOption::Renewal(1800)));
    assert_eq!(
        o.get(OptionCode::Rebinding),
        Some(&DhcpOption::Rebinding(3150))
    );
    assert!(s.poll_event().is_none(), "an offer grants nothing yet");
    let ip = dora(&mut s, T0, m, Some("Sensor-1"));
    assert_eq!(ip, Ipv4Addr::new(100, 64, 1, 100));
    let Some(LeaseEvent::Granted(lease)) = s.poll_event() else {
        panic!()
    };
    assert_eq!(
        (lease.ip, lease.hostname.as_deref(), lease.expires),
        (ip, Some("Sensor-1"), T0 + 3600)
    );
    assert!(s.take_dirty() && !s.take_dirty());
}

#[test]
fn broadcast_flag_and_naks_are_broadcast() {
    let mut s = server(100, 200);
    let m = mac(1);
    let offer = s
        .handle(
            T0,
            &client_message(MessageType::Discover, m, 1, vec![], ZERO, true),
            m,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        (offer.dst_ip, offer.dst_mac),
        (Ipv4Addr::BROADCAST, [0xff; 6])
    );
    let nak = s
        .handle(
            T0,
            &client_message(
                MessageType::Request,
                m,
                2,
                vec![
                    DhcpOption::ServerIdentifier(GW),
                    opt_ip(Ipv4Addr::new(100, 64, 1, 150)),
                ],
                ZERO,
                false,
            ),
            m,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        kind(&nak),
        MessageType::Nak,
        "requesting an address that was not offered"
    );
    assert_eq!((nak.dst_ip, nak.dst_mac), (Ipv4Addr::BROADCAST, [0xff; 6]));
}

#[test]
fn renewing_rebinding_and_init_reboot() {
    let mut s = server(100, 200);
    let (a, b) = (mac(1), mac(2));
    let ip_a = dora(&mut s, T0, a, Some("tv"));
    let ip_b = dora(&mut s, T0, b, None);
    // RENEWING: unicast from the client's address; the lease is extended.
    let ack = s
        .handle(
            T0 + 1800,
            &client_message(MessageType::Request, a, 3, vec![], ip_a, false),
            a,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        (kind(&ack), ack.dst_ip, parse(&ack).yiaddr()),
        (MessageType::Ack, ip_a, ip_a)
    );
    let renewed = s.leases().into_iter().find(|l| l.mac == a).unwrap();
    assert_eq!(renewed.expires, T0 + 1800 + 3600);
    // The renewal left the hostname option out: the device keeps its name.
    assert_eq!(renewed.hostname.as_deref(), Some("tv"));
    // INIT-REBOOT after a reboot: known binding -> ACK.
    let ack = s
        .handle(
            T0 + 1900,
            &client_message(MessageType::Request, a, 4, vec![opt_ip(ip_a)], ZERO, false),
            a,
        )
        .unwrap()
        .unwrap();
    assert_eq!(kind(&ack), MessageType::Ack);
    // INIT-REBOOT asking for another device's address -> NAK.
    let nak = s
        .handle(
            T0 + 1900,
            &client_message(MessageType::Request, a, 5, vec![opt_ip(ip_b)], ZERO, false),
            a,
        )
        .unwrap()
        .unwrap();
    assert_eq!(kind(&nak), MessageType::Nak);
    // INIT-REBOOT for an address outside the block (the device moved networks) -> NAK.
    let nak = s
        .handle(
            T0,
            &client_message(
                MessageType::Request,
                mac(9),
                6,
                vec![opt_ip(Ipv4Addr::new(192, 0, 2, 7))],
                ZERO,
                false,
            ),
            mac(9),
        )
        .unwrap()
        .unwrap();
    assert_eq!(kind(&nak), MessageType::Nak);
    // INIT-REBOOT by a device we never saw, for an unknown address: silent (RFC 2131 §4.3.2).
    let r = s.handle(
        T0,
        &client_message(
            MessageType::Request,
            mac(8),
            7,
            vec![opt_ip(Ipv4Addr::new(100, 64, 1, 180))],
            ZERO,
            false,
        ),
        mac(8),
    );
    assert_eq!(r, Err(Ignore::NoRecord));
    // RENEWING with someone else's address -> NAK.
    let nak = s
        .handle(
            T0,
            &client_message(MessageType::Request, a, 8, vec![], ip_b, false),
            a,
        )
        .unwrap()
        .unwrap();
    assert_eq!(kind(&nak), MessageType::Nak);
}

#[test]
fn addresses_are_sticky_across_release_and_restart() {
    let mut s = server(100, 200);
    let m = mac(1);
    let ip = dora(&mut s, T0, m, Some("cam"));
    let _ = dora(&mut s, T0, mac(2), None);
    assert_eq!(
        s.handle(
            T0 + 10,
            &client_message(MessageType::Release, m, 9, vec![], ip, false),
            m
        ),
        Ok(None)
    );
    while let Some(e) = s.poll_event() {
        if let LeaseEvent::Released(l) = e {
            assert_eq!(l.ip, ip);
        }
    }
    assert!(!s.active().any(|l| l.mac == m));
    // The same device comes back: its old address again.
    assert_eq!(dora(&mut s, T0 + 20, m, Some("cam")), ip);
    // A restart resumes from the saved bindings.
    let saved: Vec<Lease> = serde_roundtrip(s.leases());
    let mut again = Server::new(config(100, 200), saved, T0 + 30).unwrap();
    let granted: Vec<_> = std::iter::from_fn(|| again.poll_event()).collect();
    assert_eq!(
        granted.len(),
        2,
        "both active leases are announced on start: {granted:?}"
    );
    let ack = again
        .handle(
            T0 + 40,
            &client_message(MessageType::Request, m, 1, vec![opt_ip(ip)], ZERO, false),
            m,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        kind(&ack),
        MessageType::Ack,
        "INIT-REBOOT after the adapter restarted"
    );
    assert_eq!(
        dora(&mut again, T0 + 50, mac(3), None),
        Ipv4Addr::new(100, 64, 1, 102)
    );
}

/// The daemon persists leases as JSON: they must come back exactly.
fn serde_roundtrip(leases: Vec<Lease>) -> Vec<Lease> {
    let text = serde_json::to_string(&leases).unwrap();
    let back: Vec<Lease> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, leases);
    back
}

#[test]
fn reservations_are_kept_for_their_device() {
    let mut s = server(45, 55); // the reserved .50 lies inside the pool
    let plc = mac(0xee);
    let ip = dora(&mut s, T0, plc, Some("ignored"));
    assert_eq!(ip, Ipv4Addr::new(100, 64, 1, 50));
    let Some(LeaseEvent::Granted(l)) = s.poll_event() else {
        panic!()
    };
    assert_eq!(
        l.hostname.as_deref(),
        Some("plc"),
        "the reservation's name wins"
    );
    let mut given = Vec::new();
    for n in 1..=10 {
        let offer = s.handle(
            T0,
            &client_message(
                MessageType::Discover,
                mac(n),
                1,
                vec![opt_ip(Ipv4Addr::new(100, 64, 1, 50))],
                ZERO,
                false,
            ),
            mac(n),
        );
        if let Ok(Some(o)) = offer {
            given.push(parse(&o).yiaddr());
        }
    }
    assert_eq!(
        given.len(),
        10,
        "45..=55 minus the reservation: ten addresses"
    );
    assert!(!given.contains(&Ipv4Addr::new(100, 64, 1, 50)));
}

#[test]
fn decline_quarantines_the_address() {
    let mut s = server(100, 200);
    let m = mac(1);
    let ip = dora(&mut s, T0, m, None);
    assert_eq!(
        s.handle(
            T0,
            &client_message(MessageType::Decline, m, 3, vec![opt_ip(ip)], ZERO, false),
            m
        ),
        Ok(None)
    );
    let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(events.contains(&LeaseEvent::Declined { ip, mac: m }));
    assert_ne!(
        dora(&mut s, T0 + 1, m, None),
        ip,
        "a declined address stays out of the pool for a while"
    );
}

#[test]
fn inform_gets_configuration_without_a_lease() {
    let mut s = server(100, 200);
    let m = mac(1);
    let ci = Ipv4Addr::new(100, 64, 1, 77);
    let ack = s
        .handle(
            T0,
            &client_message(MessageType::Inform, m, 3, vec![], ci, false),
            m,
        )
        .unwrap()
        .unwrap();
    let msg = parse(&ack);
    assert_eq!(
        (kind(&ack), msg.yiaddr(), msg.ciaddr(), ack.dst_ip),
        (MessageType::Ack, ZERO, ci, ci)
    );
    assert!(msg.opts().get(OptionCode::AddressLeaseTime).is_none());
    assert!(msg.opts().get(OptionCode::Router).is_some());
}

#[test]
fn pool_exhaustion_is_answered_with_silence_and_reported() {
    let mut s = server(100, 102);
    for n in 1..=3 {
        dora(&mut s, T0, mac(n), None);
    }
    let r = s.handle(
        T0,
        &client_message(MessageType::Discover, mac(4), 1, vec![], ZERO, false),
        mac(4),
    );
    assert_eq!(r, Err(Ignore::NoAddress));
    assert!(
        std::iter::from_fn(|| s.poll_event())
            .any(|e| e == LeaseEvent::PoolExhausted { mac: mac(4) })
    );
    assert_eq!(s.stats().pool_exhausted, 1);
    // Leases end; the oldest ended binding is reclaimed for the newcomer.
    s.handle_timeout(T0 + 3600);
    assert!(std::iter::from_fn(|| s.poll_event()).any(|e| matches!(e, LeaseEvent::Expired(_))));
    let ip = dora(&mut s, T0 + 3601, mac(4), None);
    assert!((100..=102).contains(&ip.octets()[3]));
}

/// A device never seen before, from `i`.
fn random_mac(i: u32) -> [u8; 6] {
    let b = i.to_be_bytes();
    [0x02, 0xf0, b[1], b[2], b[3], 0x77]
}

/// A REQUEST in SELECTING state from `m` for `ip`, as a device answers an offer.
fn select(s: &mut Server, now: u64, m: [u8; 6], ip: Ipv4Addr) -> Result<Option<Reply>, Ignore> {
    let opts = vec![DhcpOption::ServerIdentifier(GW), opt_ip(ip)];
    s.handle(
        now,
        &client_message(MessageType::Request, m, 2, opts, ZERO, false),
        m,
    )
}

/// Issue 49, finding 7: a flood of DISCOVERs from random MACs is offered without end, but
/// its offers hold at most the newcomers' share of the pool (each new one takes the place
/// of the oldest), and it spends nothing of the share of bindings: a genuine newcomer gets
/// its lease during the flood, even when its offer was taken back before it answered.
/// Devices that complete the exchange from random MACs take at most the share per window.
#[test]
fn a_discover_flood_never_locks_a_newcomer_out_and_bindings_take_only_their_share() {
    let mut cfg = config(10, 209); // 200 addresses, one of them (.50) reserved: 199 for newcomers
    cfg.new_lease_share = 0.25;
    cfg.new_lease_window_secs = 60;
    let mut s = Server::new(cfg, Vec::new(), T0).unwrap();
    let known = mac(1);
    let known_ip = dora(&mut s, T0, known, None);
    s.handle(
        T0,
        &client_message(MessageType::Release, known, 9, vec![], known_ip, false),
        known,
    )
    .unwrap();
    let discover = |s: &mut Server, now: u64, m: [u8; 6]| {
        s.handle(
            now,
            &client_message(MessageType::Discover, m, 1, vec![], ZERO, false),
            m,
        )
    };
    // 1000 DISCOVERs from random MACs within one window: every one is offered an address,
    // at most 49 (a quarter of 199) are out at once.
    let mut offered = Vec::new();
    for i in 0..1000u32 {
        if let Ok(Some(r)) = discover(&mut s, T0 + u64::from(i) / 100, random_mac(i)) {
            offered.push(parse(&r).yiaddr());
        }
    }
    assert_eq!(offered.len(), 1000);
    assert_eq!(s.stats().offers_displaced, 1000 - 49);
    assert_eq!(s.stats().starvation_refused, 0);
    // An address is offered again only after the never-used ones came round: any 49
    // offers in a row (those out at once) are 49 addresses.
    for w in offered.windows(49) {
        let distinct: std::collections::HashSet<_> = w.iter().collect();
        assert_eq!(distinct.len(), 49);
    }
    // A genuine newcomer amid the flood: its offer is taken back by 100 more DISCOVERs
    // before it answers, and it is bound all the same.
    let genuine = mac(2);
    let offer = discover(&mut s, T0 + 10, genuine).unwrap().unwrap();
    let ip = parse(&offer).yiaddr();
    for i in 1000..1100u32 {
        discover(&mut s, T0 + 10, random_mac(i)).unwrap();
    }
    let ack = select(&mut s, T0 + 10, genuine, ip).unwrap().unwrap();
    assert_eq!((kind(&ack), parse(&ack).yiaddr()), (MessageType::Ack, ip));
    // Random MACs that answer their offers are bound up to the share of the window (49,
    // the known device's and the genuine one's among them), then refused.
    let mut bound = 0;
    for i in 2000..2100u32 {
        let m = random_mac(i);
        let Ok(Some(r)) = discover(&mut s, T0 + 11, m) else {
            continue;
        };
        if let Ok(Some(a)) = select(&mut s, T0 + 11, m, parse(&r).yiaddr()) {
            assert_eq!(kind(&a), MessageType::Ack);
            bound += 1;
        }
    }
    assert_eq!(bound, 49 - 2);
    assert_eq!(s.stats().starvation_refused, 100 - 47);
    // A device with an earlier binding is not a newcomer: it still gets its address.
    assert_eq!(dora(&mut s, T0 + 12, known, None), known_ip);
    // The next window lets newcomers be bound again.
    let m = [0x02, 0xaa, 0, 0, 0, 1];
    let r = discover(&mut s, T0 + 120, m).unwrap().unwrap();
    assert_eq!(
        kind(
            &select(&mut s, T0 + 120, m, parse(&r).yiaddr())
                .unwrap()
                .unwrap()
        ),
        MessageType::Ack
    );
}

#[test]
fn hostile_and_misdirected_messages_are_ignored_with_a_reason() {
    let mut s = server(100, 200);
    let m = mac(1);
    assert_eq!(s.handle(T0, b"garbage", m), Err(Ignore::Malformed));
    assert_eq!(
        s.handle(T0, &[0u8; 300], m),
        Err(Ignore::Malformed),
        "no magic cookie"
    );
    let discover = client_message(MessageType::Discover, m, 1, vec![], ZERO, false);
    assert_eq!(
        s.handle(T0, &discover, mac(2)),
        Err(Ignore::ChaddrMismatch),
        "chaddr must be the frame's source MAC"
    );
    let mut relayed = discover.clone();
    relayed[24..28].copy_from_slice(&[192, 0, 2, 1]); // giaddr
    assert_eq!(s.handle(T0, &relayed, m), Err(Ignore::Relayed));
    let mut reply = discover.clone();
    reply[0] = 2; // BOOTREPLY
    assert_eq!(s.handle(T0, &reply, m), Err(Ignore::NotARequest));
    let offer = client_message(MessageType::Offer, m, 1, vec![], ZERO, false);
    assert_eq!(s.handle(T0, &offer, m), Err(Ignore::Unexpected));
    // A REQUEST for another server's offer withdraws ours.
    s.handle(T0, &discover, m).unwrap();
    let other = client_message(
        MessageType::Request,
        m,
        2,
        vec![
            DhcpOption::ServerIdentifier(Ipv4Addr::new(100, 64, 1, 254)),
            opt_ip(Ipv4Addr::new(100, 64, 1, 100)),
        ],
        ZERO,
        false,
    );
    assert_eq!(s.handle(T0, &other, m), Err(Ignore::OtherServer));
    for len in 0..discover.len() {
        let _ = s.handle(T0, &discover[..len], m);
    }
    assert!(s.stats().ignored >= 6);
}

#[test]
fn configuration_mistakes_are_refused() {
    let mut c = config(100, 200);
    c.pool = (
        Ipv4Addr::new(100, 64, 1, 100),
        Ipv4Addr::new(100, 64, 2, 10),
    );
    assert!(matches!(
        Server::new(c, vec![], T0),
        Err(ConfigError::PoolOutsideBlock { .. })
    ));
    let mut c = config(100, 200);
    c.pool = (
        Ipv4Addr::new(100, 64, 1, 200),
        Ipv4Addr::new(100, 64, 1, 100),
    );
    assert!(matches!(
        Server::new(c, vec![], T0),
        Err(ConfigError::EmptyPool { .. })
    ));
    let mut c = config(100, 200);
    c.lease_secs = 5;
    assert_eq!(
        Server::new(c, vec![], T0).unwrap_err(),
        ConfigError::LeaseTime(5)
    );
    let mut c = config(100, 200);
    c.new_lease_share = 0.0;
    assert!(matches!(
        Server::new(c, vec![], T0),
        Err(ConfigError::Share(_))
    ));
    let err = ConfigError::PoolOutsideBlock {
        first: Ipv4Addr::new(10, 0, 0, 1),
        last: Ipv4Addr::new(10, 0, 0, 9),
        block: "100.64.1.0/24".parse().unwrap(),
    };
    assert!(
        err.to_string()
            .contains("is not inside this adapter's certified block 100.64.1.0/24")
    );
}

/// The proptests' messages from device `m` about `ip`: DISCOVER, SELECTING, INIT-REBOOT,
/// RENEWING, RELEASE, DECLINE (`what` 0-5).
fn random_message(what: u8, m: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let sid = DhcpOption::ServerIdentifier(GW);
    match what {
        0 => client_message(MessageType::Discover, m, 1, vec![opt_ip(ip)], ZERO, false),
        1 => client_message(
            MessageType::Request,
            m,
            2,
            vec![sid, opt_ip(ip)],
            ZERO,
            false,
        ),
        2 => client_message(MessageType::Request, m, 3, vec![opt_ip(ip)], ZERO, false),
        3 => client_message(MessageType::Request, m, 4, vec![], ip, false),
        4 => client_message(MessageType::Release, m, 5, vec![], ip, false),
        _ => client_message(MessageType::Decline, m, 6, vec![opt_ip(ip)], ZERO, false),
    }
}

/// Every active address, and whether two devices hold one.
fn holders(servers: &[&Server]) -> Vec<(Ipv4Addr, [u8; 6])> {
    let mut v: Vec<(Ipv4Addr, [u8; 6])> = servers
        .iter()
        .flat_map(|s| s.active().map(|l| (l.ip, l.mac)))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn two_servers_out_of_contact_hand_out_only_their_own_halves() {
    // One table, as both boxes of a pair held it at the last contact.
    let mut before = server(10, 29);
    let known = dora(&mut before, T0, mac(1), None);
    let (mut a, mut b) = (before.clone(), before);
    a.set_share(Share::Only(Half::Lower));
    b.set_share(Share::Only(Half::Upper));
    assert_eq!(a.share(), Share::Only(Half::Lower));
    // Newcomers on both sides take the rest of each half, and no more.
    let on_a: Vec<Ipv4Addr> = (10..19)
        .map(|n| dora(&mut a, T0 + 1, mac(n), None))
        .collect();
    let on_b: Vec<Ipv4Addr> = (30..40)
        .map(|n| dora(&mut b, T0 + 1, mac(n), None))
        .collect();
    assert!(
        on_a.iter().all(|ip| (10..=19).contains(&ip.octets()[3])),
        "{on_a:?}"
    );
    assert!(
        on_b.iter().all(|ip| (20..=29).contains(&ip.octets()[3])),
        "{on_b:?}"
    );
    assert_eq!(offer_to(&mut a, T0 + 1, mac(60)), None, "a's half is full");
    // A newcomer asking for the other half's address gets none there.
    let d = discover_asking(mac(61), Ipv4Addr::new(100, 64, 1, 15));
    assert_eq!(b.handle(T0 + 1, &d, mac(61)), Err(Ignore::NoAddress));
    let mut b2 = b.clone();
    let _ = b2.handle(
        T0 + 1,
        &client_message(MessageType::Release, mac(39), 5, vec![], on_b[9], false),
        mac(39),
    );
    let offer = b2.handle(T0 + 1, &d, mac(61)).unwrap().unwrap();
    assert_eq!(
        parse(&offer).yiaddr(),
        on_b[9],
        "its own half's address, not the one asked"
    );
    // A device that took b's offer of an upper address asks for it: a is silent (that is
    // b's offer), where a lone server would grant it (an offer it took back, free).
    let select = |s: &mut Server| {
        let m = mac(62);
        s.handle(
            T0 + 1,
            &client_message(
                MessageType::Request,
                m,
                2,
                vec![DhcpOption::ServerIdentifier(GW), opt_ip(on_b[0])],
                ZERO,
                false,
            ),
            m,
        )
    };
    assert_eq!(select(&mut a.clone()), Err(Ignore::OtherServer));
    let mut lone = a.clone();
    lone.set_share(Share::Whole);
    assert!(select(&mut lone).is_ok_and(|r| r.is_some_and(|r| kind(&r) == MessageType::Ack)));
    // The device known before keeps its address on either box.
    for s in [&mut a, &mut b] {
        let ack = renewing(s, T0 + 1800, mac(1), known);
        assert_eq!(kind(&ack), MessageType::Ack);
    }
    let all = holders(&[&a, &b]);
    let mut ips: Vec<Ipv4Addr> = all.iter().map(|(ip, _)| *ip).collect();
    ips.dedup();
    assert_eq!(ips.len(), all.len(), "an address on two devices: {all:?}");
    assert_eq!(all.len(), 1 + 9 + 10);
    // Healed: a takes in b's bindings, and holds every device at its address.
    let (taken, clashed) = a.merge(b.leases(), T0 + 1801);
    assert_eq!((taken, clashed), (10, 0));
    assert_eq!(holders(&[&a]), all);
    let merged: Vec<Lease> = std::iter::from_fn(|| a.poll_event())
        .filter_map(|e| match e {
            LeaseEvent::Granted(l) if on_b.contains(&l.ip) => Some(l),
            _ => None,
        })
        .collect();
    assert_eq!(merged.len(), 10, "each merged binding is said");
    assert!(a.take_dirty());
    let ack = renewing(&mut a, T0 + 1900, mac(30), on_b[0]);
    assert_eq!(kind(&ack), MessageType::Ack, "a device of b's renews on a");
    // Merging again changes nothing.
    assert_eq!(a.merge(b.leases(), T0 + 1901), (0, 0));
}

#[test]
fn a_pair_in_contact_takes_its_own_half_first_then_the_other() {
    for (half, order) in [
        (Half::Upper, [12, 13, 10, 11]),
        (Half::Lower, [10, 11, 12, 13]),
    ] {
        let mut s = server(10, 13);
        s.set_share(Share::Prefer(half));
        let got: Vec<u8> = (1..=4)
            .map(|n| dora(&mut s, T0, mac(n), None).octets()[3])
            .collect();
        assert_eq!(got, order, "{half:?}");
    }
}

#[test]
fn a_merge_keeps_our_holder_of_an_address_and_a_devices_newest_binding() {
    let mut a = server(10, 29);
    let mut b = server(10, 29);
    b.set_share(Share::Only(Half::Upper));
    // a gave .10 to device 1; a server on the whole pool gave .10 to device 2.
    let mut b_whole = server(10, 29);
    let x = dora(&mut a, T0, mac(1), None);
    assert_eq!(dora(&mut b_whole, T0, mac(2), None), x);
    assert_eq!(a.merge(b_whole.leases(), T0 + 1), (0, 1), "ours stands");
    let nak = renewing(&mut a, T0 + 2, mac(2), x);
    assert_eq!(
        kind(&nak),
        MessageType::Nak,
        "the other device is sent for a new address"
    );
    // Device 3 renewed later on b, at another address: b's binding wins, ours frees.
    let old = dora(&mut a, T0, mac(3), None);
    let newer = dora(&mut b, T0 + 100, mac(3), None);
    assert_ne!(old, newer);
    assert_eq!(a.merge(b.leases(), T0 + 101), (1, 0));
    assert!(holders(&[&a]).contains(&(newer, mac(3))));
    assert!(!holders(&[&a]).iter().any(|(ip, _)| *ip == old));
    let d = discover_asking(mac(4), old);
    let offer = a.handle(T0 + 102, &d, mac(4)).unwrap().unwrap();
    assert_eq!(parse(&offer).yiaddr(), old, "the old address is free again");
    // An older binding of a device we hold newer is no news; an ended one neither.
    let mut older = b.leases();
    let mut ended = b.leases();
    for l in &mut older {
        l.expires = T0 + 3000;
    }
    for l in &mut ended {
        l.expires = T0 + 50_000;
        l.active = false;
    }
    assert_eq!(a.merge(older, T0 + 103), (0, 0));
    assert_eq!(a.merge(ended, T0 + 103), (0, 0));
}

proptest::proptest! {
    /// Two servers of one pair, out of contact, each its own half, random conversations on
    /// both: never one address on two devices across the two, and the merged table holds
    /// every device that none of the other's holds at its address.
    #[test]
    fn two_halves_never_give_one_address_twice(steps in proptest::collection::vec((0u8..10, 0u8..4, 0u8..12, 0u64..400), 1..300)) {
        let mut servers = [server(100, 109), server(100, 109)];
        servers[0].set_share(Share::Only(Half::Lower));
        servers[1].set_share(Share::Only(Half::Upper));
        let mut now = T0;
        for (dev, what, ip_byte, dt) in steps {
            now += dt;
            // Devices 0-4 live on box 0's side of the cut, 5-9 on box 1's.
            let s = &mut servers[usize::from(dev >= 5)];
            let m = mac(dev);
            let ip = Ipv4Addr::new(100, 64, 1, 98 + ip_byte);
            let _ = s.handle(now, &random_message(what, m, ip), m);
            s.handle_timeout(now);
            let all = holders(&[&servers[0], &servers[1]]);
            let mut ips: Vec<Ipv4Addr> = all.iter().map(|(ip, _)| *ip).collect();
            ips.dedup();
            proptest::prop_assert_eq!(ips.len(), all.len(), "an address on two devices: {:?}", all);
        }
        for s in &mut servers {
            s.handle_timeout(now);
        }
        let before = holders(&[&servers[0], &servers[1]]);
        let theirs = servers[1].leases();
        servers[0].merge(theirs, now);
        proptest::prop_assert_eq!(holders(&[&servers[0]]), before);
    }
}

proptest::proptest! {
    /// Random conversations from a handful of devices over a small pool: never two active
    /// leases on one address, every active address inside the block and never the gateway's.
    #[test]
    fn random_conversations_keep_the_table_consistent(steps in proptest::collection::vec((0u8..8, 0u8..6, 0u8..12, 0u64..400), 1..300)) {
        let mut s = server(100, 105);
        let mut now = T0;
        for (dev, what, ip_byte, dt) in steps {
            now += dt;
            let m = mac(dev);
            let ip = Ipv4Addr::new(100, 64, 1, 98 + ip_byte);
            let _ = s.handle(now, &random_message(what, m, ip), m);
            s.handle_timeout(now);
            let active: Vec<Ipv4Addr> = s.active().map(|l| l.ip).collect();
            let mut uniq = active.clone();
            uniq.sort();
            uniq.dedup();
            proptest::prop_assert_eq!(uniq.len(), active.len(), "two leases share an address");
            proptest::prop_assert!(active.iter().all(|ip| ip.octets()[..3] == [100, 64, 1] && *ip != GW));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
        let mut s = server(100, 200);
        let _ = s.handle(T0, &data, mac(1));
    }
}

/// `m` renews `ip` (RENEWING) on `s` at `now`: the reply.
fn renewing(s: &mut Server, now: u64, m: [u8; 6], ip: Ipv4Addr) -> Reply {
    let req = client_message(MessageType::Request, m, 3, vec![], ip, false);
    s.handle(now, &req, m).unwrap().unwrap()
}

/// A DISCOVER from `m` asking for `ip`.
fn discover_asking(m: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    client_message(MessageType::Discover, m, 1, vec![opt_ip(ip)], ZERO, false)
}

fn offer_to(s: &mut Server, now: u64, m: [u8; 6]) -> Option<Ipv4Addr> {
    let d = client_message(MessageType::Discover, m, 1, vec![], ZERO, false);
    s.handle(now, &d, m)
        .ok()
        .flatten()
        .map(|r| parse(&r).yiaddr())
}

#[test]
fn outstanding_offers_keep_their_addresses_and_lapsed_ones_come_back() {
    let mut s = server(10, 20);
    // Offers out at once each hold an address of their own.
    let offered: Vec<Ipv4Addr> = (1..=5)
        .map(|n| offer_to(&mut s, T0, mac(n)).unwrap())
        .collect();
    let mut distinct = offered.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "{offered:?}");
    assert_eq!(offered[0], Ipv4Addr::new(100, 64, 1, 10));
    // Asked again, a device gets the same offer, and nobody else gets it.
    assert_eq!(offer_to(&mut s, T0, mac(1)), Some(offered[0]));
    assert_eq!(
        offer_to(&mut s, T0, mac(6)),
        Some(Ipv4Addr::new(100, 64, 1, 15))
    );
    // A taken offer is bound; lapsed ones return to the never-used addresses, first one
    // first.
    let r = client_message(
        MessageType::Request,
        mac(2),
        2,
        vec![DhcpOption::ServerIdentifier(GW), opt_ip(offered[1])],
        ZERO,
        false,
    );
    assert_eq!(
        kind(&s.handle(T0, &r, mac(2)).unwrap().unwrap()),
        MessageType::Ack
    );
    // They come back when the never-used addresses came round (an address whose offer
    // ended is not offered again at once: its device may still be answering).
    let later = T0 + 61;
    s.handle_timeout(later);
    let next: Vec<Option<Ipv4Addr>> = (7..=13).map(|n| offer_to(&mut s, later, mac(n))).collect();
    let at = |d: u8| Some(Ipv4Addr::new(100, 64, 1, d));
    assert_eq!(
        next,
        [at(16), at(17), at(18), at(19), at(20), at(10), at(12)]
    );
    assert!(!next.contains(&Some(offered[1])), "offered[1] is bound");
}

/// A damaged or edited lease file can name one address for two devices, or one device twice
/// (found by the `lease_file` fuzz target): the binding that lasts longest wins, the others
/// end, and no address is ever held by two devices.
#[test]
fn a_lease_file_with_conflicting_bindings_loads_without_a_double_holder() {
    let lease = |n: u8, ip: u8, expires: u64| Lease {
        mac: mac(n),
        ip: Ipv4Addr::new(100, 64, 1, ip),
        hostname: None,
        client_id: None,
        expires,
        active: true,
    };
    let saved = vec![
        lease(1, 120, T0 + 100),
        lease(2, 120, T0 + 900),
        lease(3, 130, T0 + 100),
        lease(3, 131, T0 + 500),
    ];
    let s = Server::new(config(100, 200), saved, T0).unwrap();
    let mut active: Vec<(u8, Ipv4Addr)> = s.active().map(|l| (l.mac[5], l.ip)).collect();
    active.sort();
    assert_eq!(
        active,
        vec![
            (2, Ipv4Addr::new(100, 64, 1, 120)),
            (3, Ipv4Addr::new(100, 64, 1, 131)),
        ]
    );
    // The device that lost the address is offered another one, not the held one.
    let mut s = s;
    let d = discover_asking(mac(1), Ipv4Addr::new(100, 64, 1, 120));
    let offer = s.handle(T0, &d, mac(1)).unwrap().unwrap();
    assert_ne!(parse(&offer).yiaddr(), Ipv4Addr::new(100, 64, 1, 120));
}

/// Reservations replaced while running (a reload): a device bound to an address now reserved
/// for another loses it at once and is NAKed at its renewal, the reserved device gets the
/// address, a device whose reservation moved is NAKed towards its new one, and an address no
/// longer reserved joins the pool.
#[test]
fn reservations_replaced_while_running_move_devices_and_free_addresses() {
    let mut s = server(45, 55);
    let (plc, cam, newcomer) = (mac(0xee), mac(1), mac(2));
    assert_eq!(dora(&mut s, T0, plc, None), Ipv4Addr::new(100, 64, 1, 50));
    let cam_ip = dora(&mut s, T0, cam, None);
    while s.poll_event().is_some() {}
    // Now: the camera's address is reserved for the newcomer, the PLC's moved to .60, and
    // .50 is reserved for nobody.
    s.set_reservations(vec![
        Reservation {
            mac: newcomer,
            ip: cam_ip,
            hostname: Some("door".into()),
        },
        Reservation {
            mac: plc,
            ip: Ipv4Addr::new(100, 64, 1, 60),
            hostname: None,
        },
    ]);
    let Some(LeaseEvent::Released(l)) = s.poll_event() else {
        panic!("the camera's binding did not end")
    };
    assert_eq!((l.mac, l.ip), (cam, cam_ip));
    assert!(
        s.poll_event().is_none(),
        "the PLC keeps its binding until it renews"
    );
    assert!(s.take_dirty());
    let renew = |s: &mut Server, m, ip| {
        let r = s
            .handle(
                T0 + 1800,
                &client_message(MessageType::Request, m, 9, vec![], ip, false),
                m,
            )
            .unwrap()
            .unwrap();
        kind(&r)
    };
    assert_eq!(renew(&mut s, cam, cam_ip), MessageType::Nak);
    assert_eq!(
        renew(&mut s, plc, Ipv4Addr::new(100, 64, 1, 50)),
        MessageType::Nak
    );
    assert_eq!(dora(&mut s, T0 + 1800, newcomer, None), cam_ip);
    assert_eq!(
        dora(&mut s, T0 + 1800, plc, None),
        Ipv4Addr::new(100, 64, 1, 60)
    );
    // The camera gets another address, and .50 (held before, no longer reserved) can go to
    // a device again once its old holder is elsewhere.
    let again = dora(&mut s, T0 + 1800, cam, None);
    assert_ne!(again, cam_ip);
    let mut given = Vec::new();
    for n in 10..=30 {
        if let Ok(Some(o)) = s.handle(
            T0 + 1800,
            &client_message(MessageType::Discover, mac(n), 1, vec![], ZERO, false),
            mac(n),
        ) {
            given.push(parse(&o).yiaddr());
        }
    }
    assert!(given.contains(&Ipv4Addr::new(100, 64, 1, 50)), "{given:?}");
    assert!(!given.contains(&cam_ip) && !given.contains(&again));
}
