//! Fixtures for the policy filter (crates/filter): 300 rules of which only the last lets
//! 100.64.1.0/24 open TCP to 100.64.2.0/24, the same rules spread over 300 destinations, and
//! TCP segments from a device on 100.64.1.0/24.

use std::net::Ipv4Addr;

use cyphonic_filter::{Proto, Rule, RuleSet};

/// Established flows in the flow-table benchmarks.
pub const FLOWS: u16 = 10_000;
/// Rules in the rule set.
pub const RULES: u32 = 300;
/// A full-sized packet at the default inner MTU.
pub const SIZE: usize = 1420;
/// TCP flags.
pub const SYN: u8 = 0x02;
/// TCP flags.
pub const ACK: u8 = 0x10;
/// The destination the last rule allows: a camera behind another adapter.
pub const CAMERA: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 7);

/// 300 rules; only the last lets 100.64.1.0/24 open TCP to 100.64.2.0/24.
pub fn rules() -> RuleSet {
    let mut rules: Vec<Rule> = (0..RULES - 1)
        .map(|i| Rule {
            id: i,
            from: vec![
                format!("100.65.{}.0/24", i % 250)
                    .parse()
                    .unwrap_or_default(),
            ],
            to: vec!["100.64.2.0/24".parse().unwrap_or_default()],
            proto: Proto::Tcp,
            ports: vec![1000..=1010, 2000..=2010],
        })
        .collect();
    rules.push(Rule {
        id: RULES - 1,
        from: vec!["100.64.1.0/24".parse().unwrap_or_default()],
        to: vec!["100.64.2.0/24".parse().unwrap_or_default()],
        proto: Proto::Tcp,
        ports: Vec::new(),
    });
    RuleSet { version: 1, rules }
}

/// The same 300 rules spread over 300 destinations (one device each), only the last about
/// 100.64.2.0/24: what the index by destination is for.
pub fn spread_rules() -> RuleSet {
    let mut set = rules();
    let others = usize::try_from(RULES).unwrap_or(0) - 1;
    for (i, r) in set.rules.iter_mut().enumerate().take(others) {
        r.to = vec![
            format!("100.66.{}.{}/32", i / 250, i % 250 + 1)
                .parse()
                .unwrap_or_default(),
        ];
    }
    set
}

/// A TCP segment of `len` bytes from 100.64.1.9:`sport` to `dst`:443 with `flags`.
pub fn segment(sport: u16, dst: Ipv4Addr, flags: u8, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[100, 64, 1, 9]);
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&443u16.to_be_bytes());
    p[32] = 0x50;
    p[33] = flags;
    p
}
