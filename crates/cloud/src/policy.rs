//! Who may reach whom (issue "Policy per device"). The cloud's `[policy]` names groups,
//! members (certificates' names and groups), devices (names members registered) and
//! addresses; against the registry it compiles into one [`RuleSet`] of addresses
//! ([`Policy::compile`]), from which each client gets the rules that concern it
//! ([`Compiled::for_client`], docs/protocol.md §4 *Policy*), and by which the cloud pairs
//! clients ([`Compiled::pairs`]).

use cyphonic_control::Allowed;
use cyphonic_crypto::{Certificate, TrustStore};
use cyphonic_filter::{Directory, RuleSet, RuleSpec, compile};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::store::Member;

/// The registry's `members` whose certificates `trust` believes at unix time `now`, as the
/// policy sees them.
pub fn entries(members: &[Member], trust: &TrustStore, now: u64) -> Vec<Entry> {
    members
        .iter()
        .filter_map(|m| {
            let cert = Certificate::from_pem(&m.client.certificate).ok()?;
            trust.verify(&cert, now).ok()?;
            let body = cert.body();
            Some(Entry {
                name: body.name.clone(),
                blocks: body.vip_blocks.clone(),
                groups: body.groups.clone(),
                devices: m.names.clone(),
                devices6: m.names6.clone(),
            })
        })
        .collect()
}

/// One rule: members or devices of `from` may open flows of `allow` to those of `to`.
/// `"*"` matches everyone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Who may open.
    pub from: Vec<String>,
    /// To whom.
    pub to: Vec<String>,
    /// What (`tcp/22`, `udp/5000-5100`, `icmp`, `any`; checked when the file is read).
    pub allow: Vec<String>,
}

/// A named group: members, devices, groups above, addresses, or patterns (`cam*.gw1.ovl.example`)
/// over the names of members and devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its name.
    pub name: String,
    /// What it holds.
    pub members: Vec<String>,
}

/// The policy as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// With no matching rule: allow (an open overlay, nothing enforced per device) or deny
    /// (only what rules allow, enforced by every client).
    pub allow_by_default: bool,
    /// Named groups.
    pub groups: Vec<Group>,
    /// The rules, numbered from 1 in this order.
    pub rules: Vec<Rule>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_by_default: true,
            groups: Vec::new(),
            rules: Vec::new(),
        }
    }
}

/// A member as the policy sees it: its certificate's name, blocks and groups, and the
/// devices (names) it registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The certificate's name.
    pub name: String,
    /// Its blocks, of both families: a rule that names the member or one of its groups
    /// names them all (docs/protocol.md §7, one device, both families).
    pub blocks: Vec<IpNet>,
    /// The certificate's groups.
    pub groups: Vec<String>,
    /// The names it registered (its own and its devices'), with their addresses.
    pub devices: Vec<(String, std::net::Ipv4Addr)>,
    /// Of those, the IPv6 addresses of the ones that registered one: a device is one name
    /// of both families to the rules.
    pub devices6: std::collections::BTreeMap<String, std::net::Ipv6Addr>,
}

/// The policy compiled against the registry (by default: nothing enforced).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    /// Whether clients enforce rules (`default = "deny"`).
    pub enforce: bool,
    /// Every rule, in addresses.
    pub rules: RuleSet,
    /// Names the rules use that stand for nobody now (a device not registered, a group
    /// nobody is in, a typo): their rules match nothing through them.
    pub unresolved: Vec<String>,
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether a rule side `nets` meets one of a client's `blocks`.
fn meets(nets: &[IpNet], blocks: &[IpNet]) -> bool {
    nets.iter().any(|n| blocks.iter().any(|b| overlaps(n, b)))
}

impl Policy {
    /// Compiles the policy against `members`. Names nobody holds (a device not registered
    /// yet, a group nobody is in) stand for no address: the rule matches nothing through
    /// them until someone does.
    ///
    /// # Errors
    /// An `allow` item that does not read (checked when the file is read: not expected).
    pub fn compile(&self, members: &[Entry]) -> Result<Compiled, String> {
        if self.allow_by_default {
            return Ok(Compiled::default());
        }
        let mut dir = Directory::new();
        for m in members {
            dir.add_named(&m.name, m.blocks.iter().copied());
            for g in &m.groups {
                dir.add(g, m.blocks.iter().copied());
            }
            for (d, vip) in &m.devices {
                let v6 = m.devices6.get(d).map(|ip| IpNet::V6(Ipv6Net::from(*ip)));
                dir.add_named(d, std::iter::once(IpNet::V4(Ipv4Net::from(*vip))).chain(v6));
            }
            // Devices with IPv6 only: their /128 alone.
            for (d, ip) in &m.devices6 {
                if !m.devices.iter().any(|(n, _)| n == d) {
                    dir.add_named(d, [IpNet::V6(Ipv6Net::from(*ip))]);
                }
            }
        }
        // Everyone, of both families.
        dir.add(
            "*",
            [IpNet::V4(Ipv4Net::default()), IpNet::V6(Ipv6Net::default())],
        );
        for g in &self.groups {
            let mut blocks = Vec::new();
            for item in &g.members {
                blocks.extend(dir.member(item).unwrap_or_default());
            }
            dir.add(&g.name, blocks);
        }
        let specs: Vec<RuleSpec> = self
            .rules
            .iter()
            .map(|r| RuleSpec {
                from: r.from.clone(),
                to: r.to.clone(),
                allow: r.allow.clone(),
            })
            .collect();
        let mut unresolved = Vec::new();
        for n in specs.iter().flat_map(|s| s.from.iter().chain(&s.to)) {
            let found = dir.resolve(n);
            if found.as_ref().is_none_or(Vec::is_empty) && !unresolved.contains(n) {
                unresolved.push(n.clone());
            }
            if found.is_none() {
                dir.add(n, [] as [IpNet; 0]);
            }
        }
        let mut rules = compile(&specs, &dir, 0).map_err(|e| e.message)?;
        // Rules whose sides name nobody yet can allow nothing.
        rules
            .rules
            .retain(|r| !r.from.is_empty() && !r.to.is_empty());
        rules.version = version_of(&rules);
        Ok(Compiled {
            enforce: true,
            rules,
            unresolved,
        })
    }
}

/// A version for a set of rules: the same rules give the same version anywhere.
fn version_of(rules: &RuleSet) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    format!("{:?}", rules.rules).hash(&mut h);
    h.finish() >> 16
}

impl Compiled {
    /// The rules that concern a client with `blocks` (their `from` or `to` meets one), as
    /// the set it enforces; `None` when nothing is enforced.
    pub fn for_client(&self, blocks: &[IpNet]) -> Option<RuleSet> {
        if !self.enforce {
            return None;
        }
        let mut set = RuleSet {
            version: 0,
            rules: self
                .rules
                .rules
                .iter()
                .filter(|r| meets(&r.from, blocks) || meets(&r.to, blocks))
                .cloned()
                .collect(),
        };
        set.version = version_of(&set);
        Some(set)
    }

    /// Whether some rule lets an address in `a` open a flow to one in `b` (always, when
    /// nothing is enforced): whether `a` may resolve `b`.
    pub fn opens(&self, a: &[IpNet], b: &[IpNet]) -> bool {
        !self.enforce
            || self
                .rules
                .rules
                .iter()
                .any(|r| meets(&r.from, a) && meets(&r.to, b))
    }

    /// Which way flows may start between clients with blocks `a` and `b`, seen from `a`:
    /// what each side of a pair is told (docs/protocol.md §4 *Policy*, Directions). `None`
    /// when nothing is enforced, or no way is open.
    pub fn allowed(&self, a: &[IpNet], b: &[IpNet]) -> Option<Allowed> {
        if !self.enforce {
            return None;
        }
        Allowed::from_sides(self.opens(a, b), self.opens(b, a))
    }

    /// Whether clients with blocks `a` and `b` may be paired: some rule lets one open a flow
    /// to the other (always, when nothing is enforced).
    pub fn pairs(&self, a: &[IpNet], b: &[IpNet]) -> bool {
        self.opens(a, b) || self.opens(b, a)
    }

    /// The rule that lets `src` open `proto` (IP protocol number) to `dst`:`port`, by
    /// number; `None` when none does (and when nothing is enforced: everything passes).
    pub fn first_allowing(
        &self,
        proto: u8,
        src: impl Into<std::net::IpAddr>,
        dst: impl Into<std::net::IpAddr>,
        port: u16,
    ) -> Option<u32> {
        self.rules.first_allowing(proto, src, dst, port)
    }
}

/// A rule as the configuration gives it, with its number.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct NumberedRule {
    /// Its number: its place in the file, from 1.
    pub number: u32,
    /// Who may open.
    pub from: Vec<String>,
    /// To whom.
    pub to: Vec<String>,
    /// What.
    pub allow: Vec<String>,
}

/// The answer of a dry run: whether a flow may start, and by which rule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Verdict {
    /// Whether it may.
    pub allowed: bool,
    /// The first rule that allows it; none when nothing allows it, or nothing is enforced.
    pub rule: Option<NumberedRule>,
    /// Why, in words.
    pub because: String,
}

impl Policy {
    /// Rule `number` (from 1), as configured.
    pub fn numbered(&self, number: u32) -> Option<NumberedRule> {
        let r = self
            .rules
            .get(usize::try_from(number).ok()?.checked_sub(1)?)?;
        Some(NumberedRule {
            number,
            from: r.from.clone(),
            to: r.to.clone(),
            allow: r.allow.clone(),
        })
    }

    /// Whether `src` may open `proto` (IP protocol number) to `dst`:`port` under this policy
    /// compiled as `compiled`, and by which rule.
    pub fn verdict(
        &self,
        compiled: &Compiled,
        proto: u8,
        src: std::net::IpAddr,
        dst: std::net::IpAddr,
        port: u16,
    ) -> Verdict {
        if self.allow_by_default {
            return Verdict {
                allowed: true,
                rule: None,
                because: "[policy] default = \"allow\" enforces nothing".into(),
            };
        }
        match compiled.first_allowing(proto, src, dst, port) {
            Some(n) => Verdict {
                allowed: true,
                rule: self.numbered(n),
                because: format!("rule {n}"),
            },
            None => Verdict {
                allowed: false,
                rule: None,
                because: "no rule allows it (default = \"deny\")".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_default()
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| (*x).to_owned()).collect()
    }

    fn fleet() -> Vec<Entry> {
        vec![
            Entry {
                name: "gw1.ovl.example".into(),
                blocks: vec![net("100.64.1.0/24")],
                groups: v(&["ops"]),
                devices: vec![
                    ("gw1.ovl.example".into(), [100, 64, 1, 1].into()),
                    ("laptop.gw1.ovl.example".into(), [100, 64, 1, 10].into()),
                ],
                devices6: std::collections::BTreeMap::new(),
            },
            Entry {
                name: "gw2.ovl.example".into(),
                blocks: vec![net("100.64.2.0/24")],
                groups: v(&["iot"]),
                devices: vec![
                    ("cam-1.gw2.ovl.example".into(), [100, 64, 2, 21].into()),
                    ("cam-2.gw2.ovl.example".into(), [100, 64, 2, 22].into()),
                    ("nvr.gw2.ovl.example".into(), [100, 64, 2, 30].into()),
                ],
                devices6: std::collections::BTreeMap::new(),
            },
            Entry {
                name: "gw3.ovl.example".into(),
                blocks: vec![net("100.64.3.0/24")],
                groups: Vec::new(),
                devices: Vec::new(),
                devices6: std::collections::BTreeMap::new(),
            },
        ]
    }

    fn deny(groups: Vec<Group>, rules: Vec<Rule>) -> Policy {
        Policy {
            allow_by_default: false,
            groups,
            rules,
        }
    }

    /// Issue 53: a member's IPv4 and IPv6 blocks are one member to the rules: a rule naming
    /// it (or its group) allows it over both families, and what it refuses is refused over
    /// both; a client is sent the rules that meet any of its blocks, and pairing follows
    /// either family.
    #[test]
    fn a_members_ipv6_block_is_the_same_member_to_the_rules() {
        let nodes = vec![
            Entry {
                name: "n0.ovl.example".into(),
                blocks: vec![net("100.64.100.0/24"), net("fd7a:0:1:4000::1/128")],
                groups: v(&["ops"]),
                devices: vec![("n0.ovl.example".into(), [100, 64, 100, 1].into())],
                devices6: std::collections::BTreeMap::new(),
            },
            Entry {
                name: "n1.ovl.example".into(),
                blocks: vec![net("100.64.101.0/24"), net("fd7a:0:1:4000::2/128")],
                groups: Vec::new(),
                devices: vec![("n1.ovl.example".into(), [100, 64, 101, 1].into())],
                devices6: std::collections::BTreeMap::new(),
            },
        ];
        let p = deny(
            Vec::new(),
            vec![Rule {
                from: v(&["ops"]),
                to: v(&["n1.ovl.example"]),
                allow: v(&["icmp"]),
            }],
        );
        let c = p.compile(&nodes).unwrap_or_default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or(IpAddr::from([0; 4]));
        let (n0, n1, n0_6, n1_6) = (
            ip("100.64.100.1"),
            ip("100.64.101.1"),
            ip("fd7a:0:1:4000::1"),
            ip("fd7a:0:1:4000::2"),
        );
        assert_eq!(c.first_allowing(1, n0, n1, 0), Some(1));
        assert_eq!(c.first_allowing(58, n0_6, n1_6, 0), Some(1));
        assert_eq!(c.first_allowing(1, n1, n0, 0), None);
        assert_eq!(c.first_allowing(58, n1_6, n0_6, 0), None);
        // A client known by its IPv6 block alone is still sent the rule, and paired.
        let only6 = [net("fd7a:0:1:4000::2/128")];
        assert_eq!(c.for_client(&only6).map(|s| s.rules.len()), Some(1));
        assert!(c.opens(&[net("fd7a:0:1:4000::1/128")], &only6));
        assert!(!c.opens(&only6, &[net("fd7a:0:1:4000::1/128")]));
    }

    /// Issue 53: a device an adapter registered with an IPv6 address beside its IPv4 one is
    /// one device to the rules: a rule naming it allows it over both families, and nothing
    /// else of its adapter's /56 is let in by that rule.
    #[test]
    fn a_devices_ipv6_address_is_the_same_device_to_the_rules() {
        let mut fleet = fleet();
        let cam6: std::net::Ipv6Addr = "fd7a:0:1:200::21"
            .parse()
            .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED);
        fleet[1].blocks.push(net("fd7a:0:1:200::/56"));
        fleet[1]
            .devices6
            .insert("cam-1.gw2.ovl.example".into(), cam6);
        fleet[0].blocks.push(net("fd7a:0:1:100::/56"));
        let p = deny(
            Vec::new(),
            vec![Rule {
                from: v(&["gw1.ovl.example"]),
                to: v(&["cam-1.gw2.ovl.example"]),
                allow: v(&["tcp/554"]),
            }],
        );
        let c = p.compile(&fleet).unwrap_or_default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or(IpAddr::from([0; 4]));
        let from6 = ip("fd7a:0:1:100::10");
        assert_eq!(
            c.first_allowing(6, ip("100.64.1.10"), ip("100.64.2.21"), 554),
            Some(1)
        );
        assert_eq!(c.first_allowing(6, from6, IpAddr::V6(cam6), 554), Some(1));
        assert_eq!(
            c.first_allowing(6, from6, ip("fd7a:0:1:200::22"), 554),
            None
        );
        assert_eq!(c.first_allowing(6, from6, IpAddr::V6(cam6), 80), None);
        // A device with IPv6 only (control version 9) is named by its /128 alone.
        let thread6: std::net::Ipv6Addr = "fd7a:0:1:200::1abc"
            .parse()
            .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED);
        fleet[1]
            .devices6
            .insert("thread.gw2.ovl.example".into(), thread6);
        let p = deny(
            Vec::new(),
            vec![Rule {
                from: v(&["gw1.ovl.example"]),
                to: v(&["thread.gw2.ovl.example"]),
                allow: v(&["udp/5683"]),
            }],
        );
        let c = p.compile(&fleet).unwrap_or_default();
        assert_eq!(
            c.first_allowing(17, from6, IpAddr::V6(thread6), 5683),
            Some(1)
        );
        assert_eq!(c.first_allowing(17, from6, IpAddr::V6(cam6), 5683), None);
    }

    /// Groups of certificates, devices by name and pattern, one-way rules: what each client
    /// is sent and whom the cloud pairs.
    #[test]
    fn rules_compile_per_client_and_pairing_follows_them() {
        let p = deny(
            vec![Group {
                name: "cameras".into(),
                members: v(&["cam*.gw2.ovl.example", "unknown-device.gw9.ovl.example"]),
            }],
            vec![
                Rule {
                    from: v(&["ops"]),
                    to: v(&["iot"]),
                    allow: v(&["tcp/22", "icmp"]),
                },
                Rule {
                    from: v(&["cameras"]),
                    to: v(&["nvr.gw2.ovl.example"]),
                    allow: v(&["tcp/554"]),
                },
                Rule {
                    from: v(&["not-registered-yet.gw3.ovl.example"]),
                    to: v(&["*"]),
                    allow: v(&["any"]),
                },
            ],
        );
        let c = p.compile(&fleet()).unwrap_or_default();
        assert!(c.enforce);
        assert_eq!(
            c.unresolved,
            vec!["not-registered-yet.gw3.ovl.example".to_owned()]
        );
        let (laptop, cam1, cam2, nvr): (IpAddr, IpAddr, IpAddr, IpAddr) = (
            [100, 64, 1, 10].into(),
            [100, 64, 2, 21].into(),
            [100, 64, 2, 22].into(),
            [100, 64, 2, 30].into(),
        );
        assert_eq!(c.first_allowing(6, laptop, nvr, 22), Some(1));
        assert_eq!(c.first_allowing(6, nvr, laptop, 22), None, "one way");
        assert_eq!(c.first_allowing(6, cam1, nvr, 554), Some(2));
        assert_eq!(c.first_allowing(6, cam2, nvr, 554), Some(2));
        assert_eq!(c.first_allowing(6, nvr, cam1, 554), None);
        // gw1 gets rule 1 (two protocols); gw2 rules 1 and 2; gw3 nothing.
        let gw1 = c.for_client(&[net("100.64.1.0/24")]).unwrap_or_default();
        assert_eq!(gw1.rules.len(), 2);
        let gw2 = c.for_client(&[net("100.64.2.0/24")]).unwrap_or_default();
        assert_eq!(gw2.rules.len(), 3);
        let gw3 = c.for_client(&[net("100.64.3.0/24")]);
        assert!(gw3.as_ref().is_some_and(|s| s.rules.is_empty()), "{gw3:?}");
        assert_ne!(gw1.version, gw2.version);
        // Pairing: gw1 with gw2 (one way is enough); gw3 with nobody. gw1 may resolve gw2's
        // names, not the other way.
        assert!(c.opens(&[net("100.64.1.0/24")], &[net("100.64.2.0/24")]));
        assert!(!c.opens(&[net("100.64.2.0/24")], &[net("100.64.1.0/24")]));
        assert!(c.pairs(&[net("100.64.1.0/24")], &[net("100.64.2.0/24")]));
        assert!(c.pairs(&[net("100.64.2.0/24")], &[net("100.64.1.0/24")]));
        assert!(!c.pairs(&[net("100.64.3.0/24")], &[net("100.64.1.0/24")]));
        // The same policy over the same registry: the same versions.
        assert_eq!(p.compile(&fleet()).ok(), Some(c.clone()));
        // A device registering changes what a pattern holds, and the versions.
        let mut more = fleet();
        more[1]
            .devices
            .push(("cam-3.gw2.ovl.example".into(), [100, 64, 2, 23].into()));
        let c2 = p.compile(&more).unwrap_or_default();
        assert_eq!(
            c2.first_allowing(6, std::net::Ipv4Addr::new(100, 64, 2, 23), nvr, 554),
            Some(2)
        );
        assert_ne!(c2.rules.version, c.rules.version);
    }

    #[test]
    fn allow_by_default_enforces_nothing() {
        let c = Policy::default().compile(&fleet()).unwrap_or_default();
        assert!(!c.enforce);
        assert_eq!(c.for_client(&[net("100.64.1.0/24")]), None);
        assert!(c.pairs(&[net("100.64.3.0/24")], &[net("100.64.1.0/24")]));
    }
}
