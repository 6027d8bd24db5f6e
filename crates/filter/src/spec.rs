//! Rules as people write them, and their compilation into a [`RuleSet`]: the one piece of
//! code the tunnel ends' files and the cloud share.
//!
//! A rule names who may open (`from`) and to whom (`to`) by names a [`Directory`] knows (a
//! group, a device, a member) or by address (`100.64.2.7`, `100.64.2.0/24`), and says what
//! (`allow`: `tcp/22`, `udp/5000-5100`, `tcp` for every TCP port, `icmp` for ping, `any`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

use crate::{Proto, Rule, RuleSet};

/// One thing a rule allows: a protocol, and for TCP and UDP a port range (`None`: every
/// port).
pub type Allow = (Proto, Option<RangeInclusive<u16>>);

/// Reads one `allow` item: `tcp/22`, `udp/5000-5100`, `tcp`, `udp`, `icmp`, `any`.
///
/// # Errors
/// What is wrong with it, in words.
pub fn parse_allow(text: &str) -> Result<Allow, String> {
    let (proto, ports) = match text.split_once('/') {
        Some((p, ports)) => (p, Some(ports)),
        None => (text, None),
    };
    let proto = match proto {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        "icmp" => Proto::Icmp,
        "any" => Proto::Any,
        other => {
            return Err(format!(
                "`{other}` is not a protocol (tcp, udp, icmp or any, with /PORT or /FIRST-LAST for tcp and udp)"
            ));
        }
    };
    let Some(ports) = ports else {
        return Ok((proto, None));
    };
    if !matches!(proto, Proto::Tcp | Proto::Udp) {
        return Err(format!("`{text}`: only tcp and udp have ports"));
    }
    let port = |s: &str| {
        s.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("`{text}`: `{s}` is not a port (1 to 65535)"))
    };
    let range = match ports.split_once('-') {
        Some((a, b)) => port(a)?..=port(b)?,
        None => port(ports)?..=port(ports)?,
    };
    if range.is_empty() {
        return Err(format!("`{text}`: the range ends before it starts"));
    }
    Ok((proto, Some(range)))
}

/// Reads a flow to ask about (`tcp/554`, `udp/53`, `icmp`): its IP protocol number and
/// destination port (0 for ICMP).
///
/// # Errors
/// It is not one port of tcp or udp, or icmp.
pub fn parse_flow(text: &str) -> Result<(u8, u16), String> {
    match parse_allow(text)? {
        (Proto::Tcp, Some(p)) if p.start() == p.end() => Ok((crate::rules::TCP, *p.start())),
        (Proto::Udp, Some(p)) if p.start() == p.end() => Ok((crate::rules::UDP, *p.start())),
        (Proto::Icmp, _) => Ok((crate::rules::ICMP, 0)),
        _ => Err(format!("`{text}`: give tcp/PORT, udp/PORT or icmp")),
    }
}

/// The names rules may use, each standing for address blocks: groups (the union of their
/// members'), devices, members. Patterns (`cam*`, `*.gw2.ovl.example`) match the names of
/// devices and members ([`Directory::add_named`]), never groups.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    names: HashMap<String, Vec<IpNet>>,
    /// The devices' and members' names, in order (patterns match these).
    named: std::collections::BTreeSet<String>,
}

/// Whether `item` is a pattern: it has a `*` and is not `*` alone (everyone, where the
/// directory has it).
pub fn is_pattern(item: &str) -> bool {
    item.contains('*') && item != "*"
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
pub fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return pattern == name;
    };
    if parts.len() == 1 {
        return pattern == name;
    }
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(at) => rest = &rest[at + mid.len()..],
            None => return false,
        }
    }
    true
}

impl Directory {
    /// An empty directory (rules may then name addresses only).
    pub fn new() -> Self {
        Self::default()
    }

    /// `name` stands for `blocks` too (a group gains members by being added to again), of
    /// either family.
    pub fn add<B: Into<IpNet>>(&mut self, name: &str, blocks: impl IntoIterator<Item = B>) {
        let entry = self.names.entry(name.to_owned()).or_default();
        for b in blocks {
            let b = b.into();
            if !entry.contains(&b) {
                entry.push(b);
            }
        }
    }

    /// A device or a member: `name` stands for `blocks` (too), and patterns match it.
    pub fn add_named<B: Into<IpNet>>(&mut self, name: &str, blocks: impl IntoIterator<Item = B>) {
        self.named.insert(name.to_owned());
        self.add(name, blocks);
    }

    /// What `pattern` stands for: the blocks of every device and member whose name it
    /// matches, in name order; `None` when it matches none.
    pub fn matching(&self, pattern: &str) -> Option<Vec<IpNet>> {
        let mut out = Vec::new();
        let mut any = false;
        for name in self.named.iter().filter(|n| glob(pattern, n)) {
            any = true;
            for b in self.names.get(name).into_iter().flatten() {
                if !out.contains(b) {
                    out.push(*b);
                }
            }
        }
        any.then_some(out)
    }

    /// What an item of a group's members stands for: a pattern's matches
    /// ([`Directory::matching`]), or the name or address it is ([`Directory::resolve`]).
    pub fn member(&self, item: &str) -> Option<Vec<IpNet>> {
        if is_pattern(item) {
            self.matching(item)
        } else {
            self.resolve(item)
        }
    }

    /// Whether `name` is known.
    pub fn knows(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// What `name` stands for: the blocks it was added with, or the address or block it
    /// spells (`100.64.2.7`, `100.64.2.0/24`, `fd7a:0:1::/56`); `None` when it is neither.
    pub fn resolve(&self, name: &str) -> Option<Vec<IpNet>> {
        if let Some(blocks) = self.names.get(name) {
            return Some(blocks.clone());
        }
        if let Ok(net) = name.parse::<IpNet>() {
            return Some(vec![net.trunc()]);
        }
        name.parse::<IpAddr>().ok().map(|ip| vec![IpNet::from(ip)])
    }
}

/// Why a rule does not compile, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The rule's index in the list.
    pub rule: usize,
    /// Its field (`from`, `to`, `allow`).
    pub field: &'static str,
    /// The item's index in that field.
    pub item: usize,
    /// What is wrong.
    pub message: String,
}

/// One rule as written: names or addresses on both sides, and what it allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSpec {
    /// Who may open.
    pub from: Vec<String>,
    /// To whom.
    pub to: Vec<String>,
    /// What (see [`parse_allow`]).
    pub allow: Vec<String>,
}

/// Compiles `specs` against `dir` into rule set `version`: rule `i` gets id `i + 1` (its
/// number in the file, for counters and the dry run), one [`Rule`] per protocol it allows.
///
/// # Errors
/// The first name `dir` does not know, the first `allow` item that does not read, an empty
/// side.
pub fn compile(specs: &[RuleSpec], dir: &Directory, version: u64) -> Result<RuleSet, SpecError> {
    let mut rules = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let err = |field, item, message| SpecError {
            rule: i,
            field,
            item,
            message,
        };
        let side = |field: &'static str, names: &[String]| {
            if names.is_empty() {
                return Err(err(
                    field,
                    0,
                    "names nobody: give a name or an address".into(),
                ));
            }
            let mut blocks = Vec::new();
            for (j, n) in names.iter().enumerate() {
                let found = dir.resolve(n).ok_or_else(|| {
                    err(
                        field,
                        j,
                        format!("`{n}` is not a group, a device, a member or an address"),
                    )
                })?;
                blocks.extend(found);
            }
            Ok(blocks)
        };
        let from = side("from", &spec.from)?;
        let to = side("to", &spec.to)?;
        if spec.allow.is_empty() {
            return Err(err(
                "allow",
                0,
                "allows nothing: give tcp/PORT, udp/PORT, icmp or any".into(),
            ));
        }
        // One rule per protocol, its port ranges together.
        let mut by_proto: Vec<(Proto, Vec<RangeInclusive<u16>>, bool)> = Vec::new();
        for (j, a) in spec.allow.iter().enumerate() {
            let (proto, ports) = parse_allow(a).map_err(|m| err("allow", j, m))?;
            let slot = match by_proto.iter_mut().position(|(p, ..)| *p == proto) {
                Some(k) => &mut by_proto[k],
                None => {
                    by_proto.push((proto, Vec::new(), false));
                    by_proto
                        .last_mut()
                        .ok_or_else(|| err("allow", j, String::new()))?
                }
            };
            match ports {
                Some(r) => slot.1.push(r),
                // Every port: no list (an empty list means all).
                None => slot.2 = true,
            }
        }
        let id = u32::try_from(i + 1).unwrap_or(u32::MAX);
        for (proto, ports, all) in by_proto {
            rules.push(Rule {
                id,
                from: from.clone(),
                to: to.clone(),
                proto,
                ports: if all { Vec::new() } else { ports },
            });
        }
    }
    Ok(RuleSet { version, rules })
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_match_names_of_devices_and_members_only() {
        use super::{Directory, IpNet, glob, is_pattern};
        assert!(glob("cam*.gw2.ovl.example", "cam-1.gw2.ovl.example"));
        assert!(glob("*.gw2.ovl.example", "nvr.gw2.ovl.example"));
        assert!(!glob("cam*.gw2.ovl.example", "nvr.gw2.ovl.example"));
        assert!(glob("a*b*c", "abc") && glob("a*b*c", "axxbyyc") && !glob("a*b*c", "acb"));
        assert!(!glob("ab*ba", "aba"), "the ends may not overlap");
        assert!(glob("exact", "exact") && !glob("exact", "exactly"));
        assert!(is_pattern("cam*") && !is_pattern("*") && !is_pattern("cam1"));
        let net = |s: &str| s.parse::<IpNet>().unwrap_or_default();
        let mut dir = Directory::new();
        dir.add_named("cam2", [net("100.64.1.22/32")]);
        dir.add_named("cam1", [net("100.64.1.21/32")]);
        dir.add_named("nvr", [net("100.64.1.20/32")]);
        dir.add("cameras-group", [net("100.64.1.99/32")]);
        assert_eq!(
            dir.matching("cam*"),
            Some(vec![net("100.64.1.21/32"), net("100.64.1.22/32")]),
            "name order, groups left out"
        );
        assert_eq!(dir.matching("printer*"), None);
    }

    use super::*;
    use crate::rules::{ICMP, TCP, UDP};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_default()
    }

    fn spec(from: &[&str], to: &[&str], allow: &[&str]) -> RuleSpec {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect();
        RuleSpec {
            from: v(from),
            to: v(to),
            allow: v(allow),
        }
    }

    #[test]
    fn allow_items_read_or_say_why_not() {
        assert_eq!(parse_allow("tcp/22"), Ok((Proto::Tcp, Some(22..=22))));
        assert_eq!(
            parse_allow("udp/5000-5100"),
            Ok((Proto::Udp, Some(5000..=5100)))
        );
        assert_eq!(parse_allow("icmp"), Ok((Proto::Icmp, None)));
        assert_eq!(parse_allow("any"), Ok((Proto::Any, None)));
        assert_eq!(parse_allow("tcp"), Ok((Proto::Tcp, None)));
        for bad in [
            "sctp/1",
            "tcp/0",
            "tcp/70000",
            "tcp/",
            "icmp/8",
            "udp/9-3",
            "tcp/a-b",
            "",
            "TCP/22",
        ] {
            assert!(parse_allow(bad).is_err(), "{bad} was read");
        }
        assert!(
            parse_allow("icmp/8").is_err_and(|e| e.contains("only tcp and udp have ports")),
            "the reason is given"
        );
        assert_eq!(parse_flow("tcp/554"), Ok((TCP, 554)));
        assert_eq!(parse_flow("udp/53"), Ok((UDP, 53)));
        assert_eq!(parse_flow("icmp"), Ok((ICMP, 0)));
        for bad in ["tcp", "tcp/1-2", "any", "udp/x"] {
            assert!(parse_flow(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_compile_to_blocks_and_one_rule_per_protocol() {
        let mut dir = Directory::new();
        dir.add("ops", [net("100.64.1.0/25")]);
        dir.add("ops", [net("100.64.3.7/32"), net("100.64.1.0/25")]);
        dir.add("camera1", [net("100.64.2.10/32")]);
        let set = compile(
            &[
                spec(&["ops"], &["100.64.2.0/24"], &["tcp/22", "icmp", "tcp/80"]),
                spec(&["camera1"], &["100.64.9.20"], &["tcp/554"]),
            ],
            &dir,
            7,
        );
        let Ok(set) = set else {
            panic!("did not compile: {set:?}");
        };
        assert_eq!(set.version, 7);
        assert_eq!(set.rules.len(), 3, "{set:?}");
        let ssh = &set.rules[0];
        assert_eq!((ssh.id, ssh.proto), (1, Proto::Tcp));
        assert_eq!(ssh.ports, vec![22..=22, 80..=80]);
        assert_eq!(ssh.from, vec![net("100.64.1.0/25"), net("100.64.3.7/32")]);
        let (ops, iot, cam, nvr) = (
            IpAddr::from([100, 64, 3, 7]),
            IpAddr::from([100, 64, 2, 5]),
            IpAddr::from([100, 64, 2, 10]),
            IpAddr::from([100, 64, 9, 20]),
        );
        assert_eq!(set.first_allowing(TCP, ops, iot, 22), Some(1));
        assert_eq!(set.first_allowing(ICMP, ops, iot, 0), Some(1));
        assert_eq!(set.first_allowing(UDP, ops, iot, 22), None);
        assert_eq!(set.first_allowing(TCP, iot, ops, 22), None, "one way");
        assert_eq!(set.first_allowing(TCP, cam, nvr, 554), Some(2));
        assert_eq!(set.first_allowing(TCP, cam, nvr, 555), None);
        // `tcp` with `tcp/22`: every port.
        let all = compile(&[spec(&["ops"], &["camera1"], &["tcp/22", "tcp"])], &dir, 1);
        assert!(all.is_ok_and(|s| s.rules[0].ports.is_empty()));
    }

    #[test]
    fn mistakes_are_located() {
        let dir = Directory::new();
        let e = compile(
            &[
                spec(&["100.64.1.1"], &["100.64.2.1"], &["icmp"]),
                spec(&["100.64.1.1"], &["nobody"], &["icmp"]),
            ],
            &dir,
            1,
        );
        assert!(
            e.as_ref()
                .is_err_and(|e| (e.rule, e.field, e.item) == (1, "to", 0)
                    && e.message.contains("`nobody` is not a group")),
            "{e:?}"
        );
        let e = compile(&[spec(&["10"], &[], &["icmp"])], &dir, 1);
        assert!(e.is_err_and(|e| e.field == "from"));
        let e = compile(&[spec(&["100.64.1.1"], &[], &["icmp"])], &dir, 1);
        assert!(e.is_err_and(|e| e.field == "to" && e.message.contains("names nobody")));
        let e = compile(&[spec(&["100.64.1.1"], &["100.64.1.2"], &[])], &dir, 1);
        assert!(e.is_err_and(|e| e.field == "allow"));
        let e = compile(
            &[spec(&["100.64.1.1"], &["100.64.1.2"], &["icmp", "tcp/x"])],
            &dir,
            1,
        );
        assert!(e.is_err_and(|e| (e.field, e.item) == ("allow", 1)));
    }
}
