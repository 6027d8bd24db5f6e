//! The per-device policy on the control channel (version 4, docs/protocol.md §4 *Policy*):
//! a client's compiled rule set cut into `policy` messages by the cloud ([`messages`]) and put
//! back together by the client ([`Assembler`]).

use cyphonic_filter::{Proto, Rule, RuleSet};

use crate::msg::{CloudMsg, PolicyProto, PolicyRule};

/// Rules' bytes per message at most (a message is at most 65519 bytes of JSON).
pub const PART_BYTES: usize = 48 << 10;

/// Parts of one set a client takes at most.
pub const MAX_PARTS: usize = 64;

/// Prefixes (over all rules' `from` and `to`) of one set a client takes at most.
pub const MAX_PREFIXES: usize = 100_000;

/// Prefixes of one side of a rule per message at most: a rule with more is sent as several.
const PREFIXES_PER_PIECE: usize = 1000;

impl From<&Rule> for PolicyRule {
    fn from(r: &Rule) -> Self {
        Self {
            id: r.id,
            from: r.from.clone(),
            to: r.to.clone(),
            proto: match r.proto {
                Proto::Tcp => PolicyProto::Tcp,
                Proto::Udp => PolicyProto::Udp,
                Proto::Icmp => PolicyProto::Icmp,
                Proto::Any => PolicyProto::Any,
            },
            ports: r.ports.iter().map(|p| (*p.start(), *p.end())).collect(),
        }
    }
}

impl PolicyRule {
    /// The rule as the filter takes it; `None` for a port range that ends before it starts.
    pub fn to_rule(&self) -> Option<Rule> {
        let ports = self
            .ports
            .iter()
            .map(|(a, b)| (a <= b).then_some(*a..=*b))
            .collect::<Option<Vec<_>>>()?;
        Some(Rule {
            id: self.id,
            from: self.from.clone(),
            to: self.to.clone(),
            proto: match self.proto {
                PolicyProto::Tcp => Proto::Tcp,
                PolicyProto::Udp => Proto::Udp,
                PolicyProto::Icmp => Proto::Icmp,
                PolicyProto::Any => Proto::Any,
            },
            ports,
        })
    }

    /// About how many bytes of JSON it takes.
    fn size(&self) -> usize {
        64 + 20 * (self.from.len() + self.to.len()) + 14 * self.ports.len()
    }
}

/// `set` as the `policy` messages that carry it (`None`: the cloud enforces nothing per
/// device). Always at least one message; a rule with many prefixes is cut into several with
/// its id, whose union is the rule.
pub fn messages(set: Option<&RuleSet>) -> Vec<CloudMsg> {
    let Some(set) = set else {
        return vec![CloudMsg::Policy {
            version: 0,
            enforce: false,
            rules: Vec::new(),
            more: false,
        }];
    };
    let mut pieces = Vec::new();
    for r in &set.rules {
        let wire = PolicyRule::from(r);
        for from in wire.from.chunks(PREFIXES_PER_PIECE) {
            for to in wire.to.chunks(PREFIXES_PER_PIECE) {
                pieces.push(PolicyRule {
                    from: from.to_vec(),
                    to: to.to_vec(),
                    ..wire.clone()
                });
            }
        }
    }
    let mut parts: Vec<Vec<PolicyRule>> = vec![Vec::new()];
    let mut bytes = 0;
    for p in pieces {
        let size = p.size();
        if bytes + size > PART_BYTES && parts.last().is_some_and(|l| !l.is_empty()) {
            parts.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        if let Some(last) = parts.last_mut() {
            last.push(p);
        }
    }
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, rules)| CloudMsg::Policy {
            version: set.version,
            enforce: true,
            rules,
            more: i + 1 < n,
        })
        .collect()
}

/// Why a client refuses what the cloud sent as its policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// More parts or prefixes than a client takes.
    #[error("a policy of more than {MAX_PARTS} parts or {MAX_PREFIXES} prefixes")]
    TooBig,
    /// A rule that does not read (a port range backwards).
    #[error("a policy rule with a port range that ends before it starts")]
    BadRule,
    /// Rules with `enforce: false`.
    #[error("a policy that enforces nothing but has rules")]
    Inconsistent,
}

/// Gathers the parts of a set.
#[derive(Debug, Default)]
pub struct Assembler {
    version: Option<u64>,
    rules: Vec<Rule>,
    parts: usize,
    prefixes: usize,
}

impl Assembler {
    /// A part arrived. Returns the whole set once its last part is in: `Some(None)` when the
    /// cloud enforces nothing per device, `Some(Some(set))` otherwise; `None` while parts are
    /// missing. A part of another version than the ones before starts over.
    ///
    /// # Errors
    /// [`PolicyError`]: the set is dropped (the session should close).
    pub fn take(
        &mut self,
        version: u64,
        enforce: bool,
        rules: &[PolicyRule],
        more: bool,
    ) -> Result<Option<Option<RuleSet>>, PolicyError> {
        if !enforce {
            *self = Self::default();
            if !rules.is_empty() {
                return Err(PolicyError::Inconsistent);
            }
            return Ok(Some(None));
        }
        if self.version != Some(version) {
            *self = Self {
                version: Some(version),
                ..Self::default()
            };
        }
        self.parts += 1;
        self.prefixes += rules
            .iter()
            .map(|r| r.from.len() + r.to.len())
            .sum::<usize>();
        if self.parts > MAX_PARTS || self.prefixes > MAX_PREFIXES {
            *self = Self::default();
            return Err(PolicyError::TooBig);
        }
        for r in rules {
            let Some(rule) = r.to_rule() else {
                *self = Self::default();
                return Err(PolicyError::BadRule);
            };
            self.rules.push(rule);
        }
        if more {
            return Ok(None);
        }
        let rules = std::mem::take(&mut self.rules);
        *self = Self::default();
        Ok(Some(Some(RuleSet { version, rules })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::{IpNet, Ipv4Net};

    fn net(i: u32) -> IpNet {
        Ipv4Net::new(std::net::Ipv4Addr::from(0x6440_0000 + i), 32)
            .unwrap_or_default()
            .into()
    }

    /// Control version 8 carries a rule's IPv6 blocks; for a version-7 client they are left
    /// out, and a side of IPv6 blocks alone arrives empty (it matches nobody).
    #[test]
    fn a_version_7_client_gets_a_rules_ipv4_blocks_only() {
        let v6: IpNet = "fd7a:0:1::/56".parse().unwrap_or_default();
        let mut r = rule(1, 1, 1);
        r.from.push(v6);
        r.to = vec![v6];
        let set = RuleSet {
            version: 3,
            rules: vec![r.clone()],
        };
        let [msg] = messages(Some(&set))
            .try_into()
            .unwrap_or_else(|_| panic!("one part"));
        let rules = |m: CloudMsg| match m {
            CloudMsg::Policy { rules, .. } => rules,
            other => panic!("{other:?}"),
        };
        let new = rules(msg.clone());
        assert_eq!(new[0].to_rule(), Some(r));
        let old = rules(msg.for_version(7));
        assert_eq!(
            (old[0].from.clone(), old[0].to.clone()),
            (vec![net(0)], Vec::new())
        );
    }

    fn rule(id: u32, from: u32, to: u32) -> Rule {
        Rule {
            id,
            from: (0..from).map(net).collect(),
            to: (0..to).map(|i| net(100_000 + i)).collect(),
            proto: Proto::Tcp,
            ports: vec![22..=22, 5000..=5100],
        }
    }

    /// Whatever its size, a set arrives whole and allows exactly what it allowed; each
    /// message stays within the channel's bound.
    #[test]
    fn sets_go_in_parts_and_come_back_whole() {
        let set = RuleSet {
            version: 77,
            rules: vec![rule(1, 3, 2), rule(2, 4500, 1200), rule(3, 1, 1)],
        };
        let msgs = messages(Some(&set));
        assert!(msgs.len() > 1, "{} messages", msgs.len());
        let mut a = Assembler::default();
        let mut out = None;
        for (i, m) in msgs.iter().enumerate() {
            let json = serde_json::to_vec(m).unwrap_or_default();
            assert!(json.len() < 65_519, "part {i}: {} bytes", json.len());
            let back: CloudMsg = serde_json::from_slice(&json).unwrap_or(CloudMsg::Pong {});
            let CloudMsg::Policy {
                version,
                enforce,
                rules,
                more,
            } = back
            else {
                panic!("not a policy message");
            };
            assert_eq!(more, i + 1 < msgs.len());
            out = a.take(version, enforce, &rules, more).unwrap_or(None);
        }
        let Some(Some(got)) = out else {
            panic!("no set");
        };
        assert_eq!(got.version, 77);
        let probe = |s: &RuleSet, f: u32, t: u32, port| {
            s.first_allowing(6, net(f).addr(), net(100_000 + t).addr(), port)
        };
        for (f, t, port) in [(0, 0, 22), (4499, 1199, 5050), (2, 1, 22), (4000, 1100, 23)] {
            assert_eq!(
                probe(&got, f, t, port),
                probe(&set, f, t, port),
                "{f} {t} {port}"
            );
        }
        assert_eq!(probe(&got, 4499, 1199, 22), Some(2));
    }

    #[test]
    fn no_policy_and_bad_parts() {
        let msgs = messages(None);
        let mut a = Assembler::default();
        let Some(CloudMsg::Policy {
            version,
            enforce,
            rules,
            more,
        }) = msgs.first().cloned()
        else {
            panic!("no message");
        };
        assert_eq!(a.take(version, enforce, &rules, more), Ok(Some(None)));
        let mut backwards = PolicyRule::from(&rule(1, 1, 1));
        backwards.ports = vec![(9, 3)];
        assert_eq!(
            a.take(1, true, &[backwards.clone()], false),
            Err(PolicyError::BadRule)
        );
        assert_eq!(
            a.take(1, false, &[backwards], false),
            Err(PolicyError::Inconsistent)
        );
        // A new version starts over: the old version's parts are dropped.
        let one = PolicyRule::from(&rule(1, 1, 1));
        assert_eq!(a.take(5, true, std::slice::from_ref(&one), true), Ok(None));
        let got = a.take(6, true, std::slice::from_ref(&one), false);
        assert!(matches!(got, Ok(Some(Some(ref s))) if s.rules.len() == 1 && s.version == 6));
        // Too many parts.
        for _ in 0..MAX_PARTS {
            assert_eq!(a.take(7, true, &[], true), Ok(None));
        }
        assert_eq!(a.take(7, true, &[], true), Err(PolicyError::TooBig));
    }
}
