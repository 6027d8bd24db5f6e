//! Rules as the data plane sees them: compiled by the control plane from groups, members and
//! devices into address sets, so that one rule is a handful of prefix checks.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

/// Which transport a rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// Every protocol (ports are then not looked at).
    Any,
    /// TCP, to the rule's ports.
    Tcp,
    /// UDP, to the rule's ports.
    Udp,
    /// ICMP echo (ping), over IPv4 and IPv6; ICMP errors follow the flow they concern.
    Icmp,
}

impl Proto {
    /// Whether a flow of IP protocol number `proto` falls under this.
    pub const fn covers(self, proto: u8) -> bool {
        match self {
            Self::Any => true,
            Self::Tcp => proto == TCP,
            Self::Udp => proto == UDP,
            Self::Icmp => proto == ICMP || proto == ICMPV6,
        }
    }
}

pub(crate) const ICMP: u8 = 1;
pub(crate) const ICMPV6: u8 = 58;
pub(crate) const TCP: u8 = 6;
pub(crate) const UDP: u8 = 17;

/// One rule: new flows from an address in `from` to an address in `to`, of `proto`, to one of
/// `ports` (all ports when empty; only TCP and UDP have ports). The sets hold blocks of
/// either family; an address matches only blocks of its own. Replies to an allowed flow
/// pass without a rule; nothing else does (default deny).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Names the rule in counters and logs (its position in the cloud's file, say).
    pub id: u32,
    /// Who may open.
    pub from: Vec<IpNet>,
    /// To whom.
    pub to: Vec<IpNet>,
    /// What.
    pub proto: Proto,
    /// Destination ports (TCP, UDP); empty: all.
    pub ports: Vec<RangeInclusive<u16>>,
}

impl Rule {
    /// Whether this rule lets `src` open a flow of `proto` to `dst` at port `dport`.
    pub fn allows(
        &self,
        proto: u8,
        src: impl Into<IpAddr>,
        dst: impl Into<IpAddr>,
        dport: u16,
    ) -> bool {
        let (src, dst) = (src.into(), dst.into());
        self.proto.covers(proto)
            && self.from.iter().any(|n| n.contains(&src))
            && self.to.iter().any(|n| n.contains(&dst))
            && (self.ports.is_empty()
                || !matches!(self.proto, Proto::Tcp | Proto::Udp)
                || self.ports.iter().any(|r| r.contains(&dport)))
    }
}

/// The rules one end enforces, in order; the first that allows a new flow is the one it is
/// counted under. A version names the set (the cloud's), so that status can say which one
/// is in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    /// The set's version.
    pub version: u64,
    /// The rules.
    pub rules: Vec<Rule>,
}

impl RuleSet {
    /// The first rule that lets `src` open a flow of `proto` to `dst`:`dport`.
    pub fn first_allowing(
        &self,
        proto: u8,
        src: impl Into<IpAddr>,
        dst: impl Into<IpAddr>,
        dport: u16,
    ) -> Option<u32> {
        let (src, dst) = (src.into(), dst.into());
        self.rules
            .iter()
            .find(|r| r.allows(proto, src, dst, dport))
            .map(|r| r.id)
    }
}

/// A rule set indexed by destination: for each family and prefix length its rules' `to`
/// lists use, the rules (by position, in order) whose `to` holds each network of that
/// length. A new flow then costs a hash lookup per length in use and a look at the few rules
/// that can concern its destination, not a scan of every rule.
#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    by_len: Vec<(Length, HashMap<u128, Vec<usize>>)>,
}

/// A prefix length of a family: (whether IPv6, the length).
type Length = (bool, u8);

/// An address's bits (IPv4's in the low 32).
pub(crate) const fn bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => a.to_bits() as u128,
        IpAddr::V6(a) => a.to_bits(),
    }
}

/// An address as (whether IPv6, its bits).
const fn key(addr: IpAddr) -> (bool, u128) {
    (addr.is_ipv6(), bits(addr))
}

/// `addr`'s first `len` bits of its family's `width`.
fn mask(addr: u128, len: u8, width: u8) -> u128 {
    let host = u32::from(width.saturating_sub(len));
    addr & u128::MAX.checked_shl(host).unwrap_or(0)
}

/// A family's address length in bits.
const fn width(v6: bool) -> u8 {
    if v6 { 128 } else { 32 }
}

impl Index {
    pub(crate) fn new(set: &RuleSet) -> Self {
        let mut by_len: Vec<(Length, HashMap<u128, Vec<usize>>)> = Vec::new();
        for (pos, rule) in set.rules.iter().enumerate() {
            for net in &rule.to {
                let (v6, network) = key(net.network());
                let len = net.prefix_len();
                let slot = match by_len.iter().position(|(l, _)| *l == (v6, len)) {
                    Some(i) => i,
                    None => {
                        by_len.push(((v6, len), HashMap::new()));
                        by_len.len() - 1
                    }
                };
                let list = by_len[slot]
                    .1
                    .entry(mask(network, len, width(v6)))
                    .or_default();
                if list.last() != Some(&pos) {
                    list.push(pos);
                }
            }
        }
        Self { by_len }
    }

    /// What [`RuleSet::first_allowing`] answers for `set` (the set this index was made of).
    pub(crate) fn first_allowing(
        &self,
        set: &RuleSet,
        proto: u8,
        src: IpAddr,
        dst: IpAddr,
        dport: u16,
    ) -> Option<u32> {
        let mut best: Option<usize> = None;
        let (v6, to) = key(dst);
        for ((family, len), map) in &self.by_len {
            if *family != v6 {
                continue;
            }
            let Some(positions) = map.get(&mask(to, *len, width(v6))) else {
                continue;
            };
            for &p in positions {
                if best.is_some_and(|b| p >= b) {
                    break;
                }
                if set
                    .rules
                    .get(p)
                    .is_some_and(|r| r.allows(proto, src, dst, dport))
                {
                    best = Some(p);
                    break;
                }
            }
        }
        best.and_then(|p| set.rules.get(p)).map(|r| r.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The index answers exactly what the scan of every rule answers, whatever the
        /// rules' prefixes (any length, overlapping, of either family), protocols and ports.
        #[test]
        fn the_index_agrees_with_the_scan(
            rules in proptest::collection::vec(
                (
                    proptest::collection::vec((0u32..16, 20u8..=32, proptest::bool::ANY), 1..3),
                    proptest::collection::vec((0u32..16, 0u8..=32, proptest::bool::ANY), 1..3),
                    0u8..4,
                    proptest::option::of((0u16..8, 0u16..4)),
                ),
                0..40,
            ),
            probes in proptest::collection::vec(
                (0u32..16, 0u32..16, proptest::bool::ANY, 0u8..4, 0u16..12),
                1..60,
            ),
        ) {
            // IPv6 addresses mirror the IPv4 ones in their last 32 bits, prefixes 96 longer,
            // so that a confusion of the families would match.
            let addr = |i: u32, v6: bool| -> IpAddr {
                let v4 = std::net::Ipv4Addr::from(0x6440_0000 + i * 37);
                if v6 {
                    std::net::Ipv6Addr::from(u128::from(u32::from(v4))).into()
                } else {
                    v4.into()
                }
            };
            let net = |(i, len, v6): (u32, u8, bool)| {
                IpNet::new(addr(i, v6), if v6 { len + 96 } else { len })
                    .map(|n| n.trunc())
                    .unwrap_or_default()
            };
            let set = RuleSet {
                version: 1,
                rules: rules
                    .into_iter()
                    .enumerate()
                    .map(|(i, (from, to, proto, ports))| Rule {
                        id: u32::try_from(i).unwrap_or(0) + 1,
                        from: from.into_iter().map(net).collect(),
                        to: to.into_iter().map(net).collect(),
                        proto: [Proto::Any, Proto::Tcp, Proto::Udp, Proto::Icmp][usize::from(proto)],
                        ports: ports.map(|(a, w)| vec![a..=a + w]).unwrap_or_default(),
                    })
                    .collect(),
            };
            let index = Index::new(&set);
            for (s, d, v6, proto, port) in probes {
                let proto = [TCP, UDP, ICMP, ICMPV6][usize::from(proto)];
                let (src, dst) = (addr(s, v6), addr(d, v6));
                proptest::prop_assert_eq!(
                    index.first_allowing(&set, proto, src, dst, port),
                    set.first_allowing(proto, src, dst, port)
                );
            }
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_else(|_| IpNet::default())
    }

    #[test]
    fn a_rule_is_a_direction_a_protocol_and_ports() {
        let ssh = Rule {
            id: 1,
            from: vec![net("100.64.1.0/24")],
            to: vec![net("100.64.2.7/32")],
            proto: Proto::Tcp,
            ports: vec![22..=22],
        };
        let (ops, cam): (IpAddr, IpAddr) = ([100, 64, 1, 9].into(), [100, 64, 2, 7].into());
        assert!(ssh.allows(TCP, ops, cam, 22));
        assert!(!ssh.allows(TCP, ops, cam, 23), "another port");
        assert!(!ssh.allows(UDP, ops, cam, 22), "another protocol");
        assert!(!ssh.allows(TCP, cam, ops, 22), "the other direction");
        let ping = Rule {
            proto: Proto::Icmp,
            ports: vec![1..=1],
            ..ssh.clone()
        };
        assert!(ping.allows(ICMP, ops, cam, 0), "ICMP has no ports");
        let set = RuleSet {
            version: 3,
            rules: vec![ssh, Rule { id: 2, ..ping }],
        };
        assert_eq!(set.first_allowing(ICMP, ops, cam, 0), Some(2));
        assert_eq!(set.first_allowing(TCP, ops, cam, 22), Some(1));
        assert_eq!(set.first_allowing(TCP, cam, ops, 22), None);
    }
}
