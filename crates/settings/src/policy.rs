//! `[policy]`: per-device rules a tunnel end enforces without a cloud (issue "Policy per
//! device"). Rules name groups, devices (the adapter's reservations, by hostname), members
//! (our certificate's name, a static peer's) and the groups in members' certificates, or
//! addresses; a group may also take in devices and members by pattern (`cam*`). They compile
//! with the same code the cloud uses (`cyphonic_filter::compile`).
//!
//! ```toml
//! [policy]
//! flows = 16384
//!
//! [[policy.group]]
//! name = "nvr"
//! members = ["100.64.2.20"]
//!
//! [[policy.rule]]
//! from = ["cameras"]
//! to = ["nvr"]
//! allow = ["tcp/554"]
//! ```

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr};

use cyphonic_filter::{Directory, Proto, Rule, RuleSpec, compile, is_pattern};
use cyphonic_session::Identity;
use cyphonic_tunnel::PolicySettings;
use cyphonic_tunnel::policy::DEFAULT_FLOWS;
use ipnet::{IpNet, Ipv4Net};
use toml::Spanned;

use crate::{ConfigError, Peer, Source};

/// The number of the rule that lets DNS through between the ends' DNS servers.
pub const DNS_RULE: u32 = 0;

/// Rule 0: DNS (udp and tcp 53) from anywhere in `overlay` to `servers` (our DNS service and
/// the static peers'), which every rule set an end enforces ends with, its file's or the
/// cloud's: names keep resolving between the ends whatever the rules say.
pub fn dns_rules(overlay: Ipv4Net, servers: &[Ipv4Addr]) -> Vec<Rule> {
    if servers.is_empty() {
        return Vec::new();
    }
    let to: Vec<IpNet> = servers
        .iter()
        .map(|ip| IpNet::from(IpAddr::V4(*ip)))
        .collect();
    [Proto::Udp, Proto::Tcp]
        .into_iter()
        .map(|proto| Rule {
            id: DNS_RULE,
            from: vec![overlay.into()],
            to: to.clone(),
            proto,
            ports: vec![53..=53],
        })
        .collect()
}

/// Most flows `policy.flows` may ask for (a flow costs about 100 bytes).
const MAX_FLOWS: usize = 1 << 20;

/// A device of ours that rules may name: a reservation with a hostname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its hostname, if it has one.
    pub name: Option<String>,
    /// Its addresses (a /32, and a /128 when it has a fixed IPv6 address), or the block a
    /// whole segment's devices come from (a VLAN's): one device to the rules over both
    /// families.
    pub blocks: Vec<IpNet>,
    /// The groups it is in (`reservation.groups`, `vlan.groups`).
    pub groups: Vec<String>,
}

crate::table! {
    /// Which new flows may start, from whom to whom, without a cloud. With this table, what
    /// no rule allows is dropped (default deny), both where it would leave (before it is
    /// sealed) and where it arrives; the replies of an allowed flow pass without a rule.
    /// Without it, every packet between certified addresses passes. The peer needs the same
    /// rules. Changes with a reload (SIGHUP): new flows follow at once, flows no longer
    /// allowed are cut. The `policy` command answers whether a flow may start.
    pub struct RawPolicy in "policy" {
        /// Flows tracked at most (1 to 1048576); when full, the oldest goes. Unset: 16384.
        flows: Option<Spanned<usize>> = None,
        /// The groups rules may name.
        group: Vec<RawGroup> = Vec::new(),
        /// The rules, numbered from 1 in this order for counters, status and metrics.
        rule: Vec<RawRule> = Vec::new(),
    }
}

crate::table! {
    /// A group rules may name. Repeat the table for each group.
    struct RawGroup in "policy.group" {
        /// Its name.
        name: Spanned<String>,
        /// Devices (a reservation's hostname), members of the overlay (a certificate's name),
        /// groups (these, or those in certificates and reservations), addresses or blocks.
        /// Names may be patterns where `*` stands for any run of characters; a pattern that
        /// matches nothing is a mistake.
        members: Spanned<Vec<Spanned<String>>>,
    }
}

crate::table! {
    /// A rule: new flows from any of `from` to any of `to`, of what `allow` lists. Repeat the
    /// table for each rule.
    struct RawRule in "policy.rule" {
        /// Where the flows start: names as in `policy.group.members`.
        from: Spanned<Vec<Spanned<String>>>,
        /// Where they go: names as in `policy.group.members`.
        to: Spanned<Vec<Spanned<String>>>,
        /// What they may be: `tcp/PORT`, `tcp/FIRST-LAST`, `tcp` (every port), the same for
        /// `udp`, `icmp` (ping; ICMP errors follow their flow), `any`.
        allow: Spanned<Vec<Spanned<String>>>,
    }
}

/// The names rules may use at this end: our certificate (its name and groups), the static
/// peers' (theirs), our devices (hostname and groups).
pub fn directory(identity: &Identity, peers: &[Peer], devices: &[Device]) -> Directory {
    let mut dir = Directory::new();
    // A revoked peer keeps its names with nothing behind them: a rule naming it is not a
    // mistake (revocation lists go to a whole fleet), it just matches nobody.
    let certs = std::iter::once((identity.certificate(), false))
        .chain(peers.iter().map(|p| (&p.certificate, p.revoked)));
    for (cert, revoked) in certs {
        let body = cert.body();
        // Every certified block, of both families: a rule naming the member holds over both.
        let blocks = if revoked {
            Vec::new()
        } else {
            body.vip_blocks.clone()
        };
        dir.add_named(&body.name, blocks.iter().copied());
        for g in &body.groups {
            dir.add(g, blocks.iter().copied());
        }
    }
    for d in devices {
        if let Some(name) = &d.name {
            dir.add_named(name, d.blocks.iter().copied());
        }
        for g in &d.groups {
            dir.add(g, d.blocks.iter().copied());
        }
    }
    dir
}

impl RawPolicy {
    /// Checks the table against the names `dir` knows: groups first (a group may name
    /// groups above it), then the rules, compiled, with rule 0 after them: DNS (udp and
    /// tcp 53) from anywhere in `overlay` to `dns_servers` (ours and the static peers'),
    /// so that names keep resolving between the ends whatever the rules say. Returns the
    /// rules, and `dir` with the groups (for the dry run).
    ///
    /// # Errors
    /// The first mistake, located.
    pub fn check(
        &self,
        src: &Source<'_>,
        mut dir: Directory,
        overlay: Ipv4Net,
        dns_servers: &[Ipv4Addr],
    ) -> Result<(PolicySettings, Directory), ConfigError> {
        let flows = match &self.flows {
            None => DEFAULT_FLOWS,
            Some(f) if (1..=MAX_FLOWS).contains(f.get_ref()) => *f.get_ref(),
            Some(f) => {
                return src.err(
                    &f.span(),
                    RawPolicy::flows,
                    format!("must be 1 to {MAX_FLOWS}"),
                );
            }
        };
        for (i, g) in self.group.iter().enumerate() {
            let name = g.name.get_ref();
            if name.is_empty()
                || name.parse::<Ipv4Net>().is_ok()
                || name.parse::<Ipv4Addr>().is_ok()
            {
                return src.err(
                    &g.name.span(),
                    &crate::indexed(RawGroup::name, i),
                    "a group's name is a word, not empty and not an address",
                );
            }
            if g.members.get_ref().is_empty() {
                return src.err(
                    &g.members.span(),
                    &crate::indexed(RawGroup::members, i),
                    "the group has no members",
                );
            }
            let mut blocks = Vec::new();
            for (j, m) in g.members.get_ref().iter().enumerate() {
                let item = m.get_ref();
                let missing = if is_pattern(item) {
                    "matches no device or member"
                } else {
                    "is not a group above, a device, a member or an address"
                };
                match dir.member(item) {
                    Some(b) => blocks.extend(b),
                    None => {
                        return src.err(
                            &m.span(),
                            &format!("{}[{j}]", crate::indexed(RawGroup::members, i)),
                            format!("`{item}` {missing}"),
                        );
                    }
                }
            }
            dir.add(name, blocks);
        }
        let strings = |v: &Spanned<Vec<Spanned<String>>>| {
            v.get_ref().iter().map(|s| s.get_ref().clone()).collect()
        };
        let specs: Vec<RuleSpec> = self
            .rule
            .iter()
            .map(|r| RuleSpec {
                from: strings(&r.from),
                to: strings(&r.to),
                allow: strings(&r.allow),
            })
            .collect();
        let mut rules = match compile(&specs, &dir, 0) {
            Ok(rules) => rules,
            Err(e) => {
                let raw = &self.rule[e.rule];
                let field = match e.field {
                    "from" => &raw.from,
                    "to" => &raw.to,
                    _ => &raw.allow,
                };
                let (span, key) = match field.get_ref().get(e.item) {
                    Some(item) => (
                        item.span(),
                        format!("policy.rule[{}].{}[{}]", e.rule, e.field, e.item),
                    ),
                    None => (field.span(), format!("policy.rule[{}].{}", e.rule, e.field)),
                };
                return src.err(&span, &key, e.message);
            }
        };
        rules.rules.extend(dns_rules(overlay, dns_servers));
        // The same rules give the same version, across reloads and restarts.
        let mut h = std::hash::DefaultHasher::new();
        format!("{:?}", rules.rules).hash(&mut h);
        rules.version = h.finish() >> 16;
        Ok((PolicySettings { rules, flows }, dir))
    }
}
