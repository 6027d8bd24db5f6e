//! Rules as the data plane sees them: compiled by the control plane from groups, members and
//! devices into address sets, so that one rule is a handful of prefix checks.

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use ipnet::Ipv4Net;

/// Which transport a rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// Every protocol (ports are then not looked at).
    Any,
    /// TCP, to the rule's ports.
    Tcp,
    /// UDP, to the rule's ports.
    Udp,
    /// ICMP echo (ping); ICMP errors follow the flow they concern.
    Icmp,
}

impl Proto {
    /// Whether a flow of IP protocol number `proto` falls under this.
    pub const fn covers(self, proto: u8) -> bool {
        match self {
            Self::Any => true,
            Self::Tcp => proto == TCP,
            Self::Udp => proto == UDP,
            Self::Icmp => proto == ICMP,
        }
    }
}

pub(crate) const ICMP: u8 = 1;
pub(crate) const TCP: u8 = 6;
pub(crate) const UDP: u8 = 17;

/// One rule: new flows from an address in `from` to an address in `to`, of `proto`, to one of
/// `ports` (all ports when empty; only TCP and UDP have ports). Replies to an allowed flow
/// pass without a rule; nothing else does (default deny).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Names the rule in counters and logs (its position in the cloud's file, say).
    pub id: u32,
    /// Who may open.
    pub from: Vec<Ipv4Net>,
    /// To whom.
    pub to: Vec<Ipv4Net>,
    /// What.
    pub proto: Proto,
    /// Destination ports (TCP, UDP); empty: all.
    pub ports: Vec<RangeInclusive<u16>>,
}

impl Rule {
    /// Whether this rule lets `src` open a flow of `proto` to `dst` at port `dport`.
    pub fn allows(&self, proto: u8, src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> bool {
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
        src: Ipv4Addr,
        dst: Ipv4Addr,
        dport: u16,
    ) -> Option<u32> {
        self.rules
            .iter()
            .find(|r| r.allows(proto, src, dst, dport))
            .map(|r| r.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap_or_else(|_| Ipv4Net::default())
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
        let (ops, cam) = (Ipv4Addr::new(100, 64, 1, 9), Ipv4Addr::new(100, 64, 2, 7));
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
