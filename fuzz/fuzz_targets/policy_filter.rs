//! The policy filter (`cyphonic_filter::Filter`) under any sequence of packets between a few
//! devices, either way: flows' packets, ICMP errors of any type from and to any of them
//! quoting any flow's packet (with bytes after the quote), first and later fragments with
//! any identification, offset, length and flag, any bytes. Nothing panics, the tables stay
//! within their bounds, an ICMP error passes only back to its quoted packet's source from
//! that packet's destination, and a later fragment only after its own datagram's first
//! fragment passed the same way.
#![no_main]

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use cyphonic_filter::{Direction, Filter, Proto, Rule, RuleSet, Timeouts, Verdict};

const DEVICES: [Ipv4Addr; 4] = [
    Ipv4Addr::new(100, 64, 1, 9),
    Ipv4Addr::new(100, 64, 1, 20),
    Ipv4Addr::new(100, 64, 2, 7),
    Ipv4Addr::new(100, 64, 2, 8),
];

#[derive(Arbitrary, Debug)]
enum Inner {
    Tcp { sport: u8, dport: u8, flags: u8 },
    Udp { sport: u8, dport: u8 },
    Echo { id: u8, reply: bool },
}

#[derive(Arbitrary, Debug)]
enum What {
    Packet(Inner),
    Error { from: u8, to: u8, kind: u8, about: Inner, extra: u16 },
    First { inner: Inner, id: u8, eights: u8 },
    Later { proto: u8, id: u8, offset: u16, len: u16, more: bool },
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Step {
    src: u8,
    dst: u8,
    inbound: bool,
    advance_ms: u16,
    what: What,
}

fn ipv4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, l4: &[u8]) -> Vec<u8> {
    let len = u16::try_from(20 + l4.len()).unwrap_or(u16::MAX);
    let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0];
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(l4);
    p
}

fn packet(inner: &Inner, src: Ipv4Addr, dst: Ipv4Addr, data: usize) -> Vec<u8> {
    match *inner {
        Inner::Tcp { sport, dport, flags } => {
            let mut l4 = vec![0u8; 20 + data];
            l4[0..2].copy_from_slice(&(40_000 + u16::from(sport % 4)).to_be_bytes());
            l4[2..4].copy_from_slice(&(20 + u16::from(dport % 4)).to_be_bytes());
            l4[12] = 0x50;
            l4[13] = flags;
            ipv4(6, src, dst, &l4)
        }
        Inner::Udp { sport, dport } => {
            let mut l4 = vec![0u8; 8 + data];
            l4[0..2].copy_from_slice(&(5000 + u16::from(sport % 4)).to_be_bytes());
            l4[2..4].copy_from_slice(&(5000 + u16::from(dport % 4)).to_be_bytes());
            ipv4(17, src, dst, &l4)
        }
        Inner::Echo { id, reply } => {
            let mut l4 = vec![if reply { 0 } else { 8 }, 0, 0, 0, 0, id % 4, 0, 1];
            l4.resize(8 + data, 0);
            ipv4(1, src, dst, &l4)
        }
    }
}

fn frag(mut p: Vec<u8>, id: u8, offset: u16, more: bool) -> Vec<u8> {
    let field = (offset / 8) | if more { 0x2000 } else { 0 };
    p[4..6].copy_from_slice(&u16::from(id % 4).to_be_bytes());
    p[6..8].copy_from_slice(&field.to_be_bytes());
    p
}

fn rules() -> RuleSet {
    let site = |s: &str| vec![s.parse().expect("a prefix")];
    RuleSet {
        version: 1,
        rules: vec![
            Rule { id: 1, from: site("100.64.1.0/24"), to: site("100.64.2.0/24"), proto: Proto::Tcp, ports: vec![20..=21] },
            Rule { id: 2, from: site("100.64.1.0/24"), to: site("100.64.2.0/24"), proto: Proto::Udp, ports: vec![5000..=5001] },
            Rule { id: 3, from: site("100.64.2.0/24"), to: site("100.64.1.9/32"), proto: Proto::Icmp, ports: Vec::new() },
        ],
    }
}

libfuzzer_sys::fuzz_target!(|steps: Vec<Step>| {
    let mut f = Filter::new(rules(), 32, Timeouts::default());
    let mut now = Instant::now();
    // (protocol, source, destination, identification, direction) of first fragments let through.
    let mut firsts: HashSet<(u8, Ipv4Addr, Ipv4Addr, u16, bool)> = HashSet::new();
    for step in steps.into_iter().take(256) {
        now += Duration::from_millis(u64::from(step.advance_ms) * 8);
        let (src, dst) = (DEVICES[usize::from(step.src % 4)], DEVICES[usize::from(step.dst % 4)]);
        let dir = if step.inbound { Direction::In } else { Direction::Out };
        let bytes = match &step.what {
            What::Packet(inner) => packet(inner, src, dst, 0),
            What::Error { from, to, kind, about, extra } => {
                let quoted = packet(about, src, dst, 0);
                let mut l4 = vec![*kind, 0, 0, 0, 0, 0, 0, 0];
                l4.extend_from_slice(&quoted[..quoted.len().min(28)]);
                l4.resize(l4.len() + usize::from(*extra % 1200), 0x41);
                let (from, to) = (DEVICES[usize::from(from % 4)], DEVICES[usize::from(to % 4)]);
                ipv4(1, from, to, &l4)
            }
            What::First { inner, id, eights } => {
                frag(packet(inner, src, dst, usize::from(*eights % 8) * 8), *id, 0, true)
            }
            What::Later { proto, id, offset, len, more } => {
                let proto = [1, 6, 17][usize::from(proto % 3)];
                frag(ipv4(proto, src, dst, &vec![0; usize::from(*len % 1500)]), *id, *offset, *more)
            }
            What::Bytes(b) => b.clone(),
        };
        let verdict = f.check(&bytes, dir, now);
        assert!(f.flows() <= 32);
        assert!(f.datagrams() <= 64);
        if steps_expire(&step) {
            f.expire(now);
        }
        if verdict != Verdict::Pass {
            continue;
        }
        judge_pass(&bytes, step.inbound, &mut firsts);
    }
});

fn addr(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

/// What a packet that passed must be, read from its own bytes: a first fragment is noted;
/// a later fragment follows a first of its datagram that passed the same way; an ICMP
/// error goes back to its quoted packet's source from that packet's destination, is of a
/// type that answers a flow, and is at most 576 bytes.
fn judge_pass(b: &[u8], inbound: bool, firsts: &mut HashSet<(u8, Ipv4Addr, Ipv4Addr, u16, bool)>) {
    assert!(b.len() >= 20 && b[0] >> 4 == 4, "a packet the filter cannot read passed");
    let ihl = usize::from(b[0] & 0x0f) * 4;
    let field = u16::from_be_bytes([b[6], b[7]]);
    let (offset, more) = (field & 0x1fff, field & 0x2000 != 0);
    let key = (b[9], addr(b, 12), addr(b, 16), u16::from_be_bytes([b[4], b[5]]), inbound);
    if offset != 0 {
        assert!(firsts.contains(&key), "a later fragment passed before any first fragment of its datagram");
        return;
    }
    if more {
        firsts.insert(key);
    }
    let kind = b.get(ihl).copied();
    if b[9] == 1 && matches!(kind, Some(3 | 4 | 5 | 11 | 12)) {
        assert!(matches!(kind, Some(3 | 11 | 12)), "an ICMP error of type {kind:?} passed");
        assert!(b.len() <= 576, "an error of {} bytes passed", b.len());
        let quoted = &b[ihl + 8..];
        assert_eq!(
            (addr(b, 12), addr(b, 16)),
            (addr(quoted, 16), addr(quoted, 12)),
            "an error passed that does not go back to the quoted packet's source from its destination"
        );
    }
}

/// Now and then the table is swept, as the control thread does.
fn steps_expire(step: &Step) -> bool {
    step.advance_ms % 7 == 0
}
