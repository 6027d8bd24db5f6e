//! `cyphonic-cloud serve`'s configuration: config/cloud.example.toml documents every key.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cyphonic_crypto::{Certificate, RevocationList, StaticKeypair, TrustStore};
use serde::Deserialize;
use toml::Spanned;

use crate::policy::{Group, Policy, Rule};

/// What `serve` needs, checked.
#[derive(Debug)]
pub struct CloudConfig {
    /// NMS control sessions (TCP).
    pub listen: SocketAddr,
    /// Endpoint probes (UDP).
    pub probe_listen: SocketAddr,
    /// The second probe port: a NAT that maps the two probes to different ports is
    /// symmetric.
    pub probe_listen_alt: SocketAddr,
    /// The relay (TRS); `None` when switched off.
    pub relay: Option<RelayConfig>,
    /// Where `cyphonic-cloud status` finds the running cloud.
    pub status_socket: PathBuf,
    /// Where the Prometheus endpoint listens; off without.
    pub metrics: Option<SocketAddr>,
    /// The cloud's Noise key (clients pin its public half).
    pub key: StaticKeypair,
    /// The CA(s) and revocations client certificates are checked against.
    pub trust: TrustStore,
    /// The store's URL.
    pub database: String,
    /// Who may resolve whom.
    pub policy: Policy,
    /// Online issuing (enrollment and renewal); `None` without `[enroll]`.
    pub enroll: Option<crate::enroll::Issuer>,
}

/// The relay's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The addresses channels are bound on and given to clients, at most one per IP
    /// version. Empty: every address, and each client is given the address it reached the
    /// control port on.
    pub addresses: Vec<IpAddr>,
    /// The UDP ports channels take, one per channel.
    pub ports: RangeInclusive<u16>,
    /// A channel that relays nothing for this long is closed.
    pub idle: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            addresses: Vec::new(),
            ports: 50_000..=50_999,
            idle: Duration::from_secs(120),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    #[serde(default = "default_probe_listen")]
    probe_listen: SocketAddr,
    probe_listen_alt: Option<SocketAddr>,
    key: Spanned<PathBuf>,
    ca: Spanned<PathBuf>,
    revocations: Option<Spanned<PathBuf>>,
    #[serde(default = "default_database")]
    database: String,
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    relay: RawRelay,
    #[serde(default = "default_status_socket")]
    status_socket: PathBuf,
    #[serde(default)]
    metrics: RawMetrics,
    enroll: Option<RawEnroll>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnroll {
    certificate: Spanned<PathBuf>,
    key: Spanned<PathBuf>,
    pool: Option<Spanned<Vec<String>>>,
    #[serde(default = "default_lifetime")]
    lifetime: Spanned<u64>,
}

/// A week.
fn default_lifetime() -> Spanned<u64> {
    Spanned::new(0..0, 7 * 24 * 3600)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<Spanned<SocketAddr>>,
}

fn default_status_socket() -> PathBuf {
    PathBuf::from("/run/cyphonic/cloud.sock")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelay {
    #[serde(default = "yes")]
    enabled: bool,
    addresses: Option<Spanned<Vec<IpAddr>>>,
    ports: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<u64>>,
}

impl Default for RawRelay {
    fn default() -> Self {
        Self {
            enabled: true,
            addresses: None,
            ports: None,
            idle_timeout: None,
        }
    }
}

const fn yes() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    default: Option<Spanned<String>>,
    #[serde(default)]
    group: Vec<RawGroup>,
    #[serde(default)]
    rule: Vec<RawRule>,
}

/// One name, or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Names {
    One(String),
    Many(Vec<String>),
}

impl Names {
    fn list(&self) -> Vec<String> {
        match self {
            Self::One(n) => vec![n.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: Spanned<String>,
    members: Spanned<Names>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    from: Spanned<Names>,
    to: Spanned<Names>,
    allow: Option<Spanned<Vec<String>>>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 7000))
}
fn default_probe_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 7001))
}
fn default_database() -> String {
    "sqlite:///var/lib/cyphonic/cloud.db".into()
}

/// What of a configuration takes effect only at a restart (a reload applies the trust and
/// the policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    listen: [SocketAddr; 3],
    key: cyphonic_crypto::PublicKey,
    database: String,
    relay: bool,
    metrics: Option<SocketAddr>,
    status_socket: PathBuf,
    enroll: Option<(cyphonic_crypto::Fingerprint, Vec<ipnet::IpNet>, u64)>,
}

impl Restart {
    /// The restart-only part of `c`.
    pub fn of(c: &CloudConfig) -> Self {
        Self {
            listen: [c.listen, c.probe_listen, c.probe_listen_alt],
            key: c.key.public(),
            database: c.database.clone(),
            relay: c.relay.is_some(),
            metrics: c.metrics,
            status_socket: c.status_socket.clone(),
            enroll: c
                .enroll
                .as_ref()
                .map(|e| (e.certificate().fingerprint(), e.pool.clone(), e.lifetime)),
        }
    }

    /// The keys that differ in `new`.
    pub fn changed(&self, new: &Self) -> Vec<&'static str> {
        [
            (
                "listen, probe_listen, probe_listen_alt",
                self.listen != new.listen,
            ),
            ("key", self.key != new.key),
            ("database", self.database != new.database),
            ("[relay]", self.relay != new.relay),
            ("[metrics]", self.metrics != new.metrics),
            ("status_socket", self.status_socket != new.status_socket),
            ("[enroll]", self.enroll != new.enroll),
        ]
        .into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
    }
}

/// Reads and checks the configuration at `path`, with the files it names. Errors name the
/// file, and where possible the line and key.
///
/// # Errors
/// Unreadable or invalid configuration, key or CA files.
pub fn load(path: &Path, now_secs: u64) -> anyhow::Result<CloudConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read the configuration: {e}", path.display()))?;
    let raw: Raw = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| line_of(&text, s.start));
        anyhow::anyhow!(
            "{}{}: {}",
            path.display(),
            line.map(|l| format!(":{l}")).unwrap_or_default(),
            e.message().trim()
        )
    })?;
    let err = |span: std::ops::Range<usize>, key: &str, msg: String| {
        anyhow::anyhow!(
            "{}:{}: key `{key}`: {msg}",
            path.display(),
            line_of(&text, span.start)
        )
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let read = |p: &Spanned<PathBuf>, key: &str| {
        let full = dir.join(p.get_ref());
        std::fs::read_to_string(&full).map_err(|e| {
            err(
                p.span(),
                key,
                format!("cannot read {}: {e}", full.display()),
            )
        })
    };
    let key = StaticKeypair::from_pem(&read(&raw.key, "key")?)
        .map_err(|e| err(raw.key.span(), "key", e.to_string()))?;
    let cas = Certificate::all_from_pem(&read(&raw.ca, "ca")?)
        .map_err(|e| err(raw.ca.span(), "ca", e.to_string()))?;
    let revoked = match &raw.revocations {
        Some(r) => RevocationList::parse(&read(r, "revocations")?)
            .map_err(|e| err(r.span(), "revocations", e.to_string()))?,
        None => RevocationList::default(),
    };
    let mut trust =
        TrustStore::new(cas, revoked).map_err(|e| err(raw.ca.span(), "ca", e.to_string()))?;
    let enroll = match &raw.enroll {
        Some(e) => Some(enroll(e, &mut trust, now_secs, &read, &err)?),
        None => None,
    };
    for ca in trust.cas() {
        let b = ca.body();
        if b.not_after <= now_secs {
            return Err(err(
                raw.ca.span(),
                "ca",
                format!("the CA {} has expired", b.name),
            ));
        }
    }
    let allow_by_default = match &raw.policy.default {
        None => true,
        Some(d) => match d.get_ref().as_str() {
            "allow" => true,
            "deny" => false,
            other => {
                return Err(err(
                    d.span(),
                    "policy.default",
                    format!("expected \"allow\" or \"deny\", found {other:?}"),
                ));
            }
        },
    };
    let database = if let Some(rest) = raw.database.strip_prefix("sqlite://")
        && !rest.starts_with('/')
        && !rest.starts_with(':')
    {
        // A relative SQLite path is relative to the configuration file, like the others.
        format!("sqlite://{}", dir.join(rest).display())
    } else {
        raw.database
    };
    let relay = if raw.relay.enabled {
        Some(relay(&raw.relay, &err)?)
    } else {
        None
    };
    let probe_listen_alt = raw.probe_listen_alt.unwrap_or_else(|| {
        SocketAddr::new(
            raw.probe_listen.ip(),
            raw.probe_listen.port().wrapping_add(1),
        )
    });
    let metrics = match &raw.metrics.listen {
        Some(l) if l.get_ref().port() == 0 => {
            return Err(err(
                l.span(),
                "metrics.listen",
                "give the port Prometheus scrapes (9466, say)".into(),
            ));
        }
        Some(l) => Some(*l.get_ref()),
        None => None,
    };
    let status_socket = if raw.status_socket.is_absolute() {
        raw.status_socket.clone()
    } else {
        dir.join(&raw.status_socket)
    };
    Ok(CloudConfig {
        listen: raw.listen,
        probe_listen: raw.probe_listen,
        probe_listen_alt,
        relay,
        status_socket,
        metrics,
        key,
        trust,
        database,
        policy: policy(&raw.policy, allow_by_default, &err)?,
        enroll,
    })
}

/// `[policy]`'s groups and rules, checked: names and lists not empty, `allow` items that
/// read (`tcp/22`, `udp/5000-5100`, `icmp`, `any`; without `allow`, `any`).
fn policy(
    raw: &RawPolicy,
    allow_by_default: bool,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> anyhow::Error,
) -> anyhow::Result<Policy> {
    let mut groups = Vec::new();
    for (i, g) in raw.group.iter().enumerate() {
        let name = g.name.get_ref();
        if name.is_empty() || name == "*" || name.contains('/') {
            return Err(err(
                g.name.span(),
                &format!("policy.group[{i}].name"),
                "a group's name is a word, not empty, \"*\" or an address".into(),
            ));
        }
        let members = g.members.get_ref().list();
        if members.is_empty() || members.iter().any(String::is_empty) {
            return Err(err(
                g.members.span(),
                &format!("policy.group[{i}].members"),
                "list at least one member, device, group, pattern or address (none empty)".into(),
            ));
        }
        groups.push(Group {
            name: name.clone(),
            members,
        });
    }
    let mut rules = Vec::new();
    for (i, r) in raw.rule.iter().enumerate() {
        let side = |s: &Spanned<Names>, key: &str| {
            let names = s.get_ref().list();
            if names.is_empty() || names.iter().any(String::is_empty) {
                return Err(err(
                    s.span(),
                    &format!("policy.rule[{i}].{key}"),
                    "name at least one group, member, device or address (none empty)".into(),
                ));
            }
            Ok(names)
        };
        let (from, to) = (side(&r.from, "from")?, side(&r.to, "to")?);
        let allow = match &r.allow {
            None => vec!["any".to_owned()],
            Some(a) => {
                if a.get_ref().is_empty() {
                    return Err(err(
                        a.span(),
                        &format!("policy.rule[{i}].allow"),
                        "allows nothing: give tcp/PORT, udp/PORT, icmp or any".into(),
                    ));
                }
                for item in a.get_ref() {
                    cyphonic_filter::parse_allow(item)
                        .map_err(|m| err(a.span(), &format!("policy.rule[{i}].allow"), m))?;
                }
                a.get_ref().clone()
            }
        };
        rules.push(Rule { from, to, allow });
    }
    Ok(Policy {
        allow_by_default,
        groups,
        rules,
    })
}

/// `[enroll]`: the issuing CA (trusted from here on: members it enrolled connect), its pool
/// and the default lifetime.
fn enroll(
    raw: &RawEnroll,
    trust: &mut TrustStore,
    now_secs: u64,
    read: &dyn Fn(&Spanned<PathBuf>, &str) -> anyhow::Result<String>,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> anyhow::Error,
) -> anyhow::Result<crate::enroll::Issuer> {
    let cert_text = read(&raw.certificate, "enroll.certificate")?;
    let key_text = read(&raw.key, "enroll.key")?;
    let ca = cyphonic_crypto::CertificateAuthority::from_pem(&key_text, &cert_text)
        .map_err(|e| err(raw.key.span(), "enroll.key", e.to_string()))?;
    let cert = ca.certificate().clone();
    if !cert.is_root() {
        trust.add_issuer(cert.clone()).map_err(|e| {
            err(
                raw.certificate.span(),
                "enroll.certificate",
                format!("not an issuing CA under `ca`: {e}"),
            )
        })?;
    } else if !trust.cas().contains(&cert) {
        return Err(err(
            raw.certificate.span(),
            "enroll.certificate",
            "a root that `ca` does not list".into(),
        ));
    }
    if cert.body().not_after <= now_secs {
        return Err(err(
            raw.certificate.span(),
            "enroll.certificate",
            "the issuing CA has expired".into(),
        ));
    }
    let roots: Vec<Certificate> = trust
        .cas()
        .iter()
        .filter(|r| r.is_root() && r.body().public_key == cert.body().issuer)
        .cloned()
        .collect();
    let pool = match &raw.pool {
        None => cert.body().vip_blocks.clone(),
        Some(p) => {
            let mut out = Vec::new();
            for text in p.get_ref() {
                let block: ipnet::IpNet = text.parse().map_err(|_| {
                    err(
                        p.span(),
                        "enroll.pool",
                        format!("{text:?} is not a CIDR block"),
                    )
                })?;
                if !cert.body().covers_block(&block) {
                    return Err(err(
                        p.span(),
                        "enroll.pool",
                        format!("{block} lies outside the issuing CA's blocks"),
                    ));
                }
                out.push(block.trunc());
            }
            out
        }
    };
    let lifetime = *raw.lifetime.get_ref();
    if !(crate::enroll::MIN_LIFETIME..=365 * 24 * 3600).contains(&lifetime) {
        return Err(err(
            raw.lifetime.span(),
            "enroll.lifetime",
            format!("{lifetime} s: give 30 to 31536000 seconds"),
        ));
    }
    Ok(crate::enroll::Issuer::new(ca, roots, pool, lifetime))
}

fn relay(
    raw: &RawRelay,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> anyhow::Error,
) -> anyhow::Result<RelayConfig> {
    let mut config = RelayConfig::default();
    let empty = Spanned::new(0..0, Vec::new());
    let spanned = raw.addresses.as_ref().unwrap_or(&empty);
    let addresses = spanned.get_ref();
    for (i, a) in addresses.iter().enumerate() {
        if a.is_unspecified() || a.is_multicast() {
            return Err(err(
                spanned.span(),
                "relay.addresses",
                format!("{a} cannot be given to clients as the relay's address"),
            ));
        }
        if addresses[..i].iter().any(|b| b.is_ipv4() == a.is_ipv4()) {
            return Err(err(
                spanned.span(),
                "relay.addresses",
                "at most one IPv4 and one IPv6 address".into(),
            ));
        }
    }
    config.addresses.clone_from(addresses);
    if let Some(p) = &raw.ports {
        let parsed = p.get_ref().split_once('-').and_then(|(a, b)| {
            let (a, b) = (a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?);
            (a >= 1024 && a <= b).then_some(a..=b)
        });
        config.ports = parsed.ok_or_else(|| {
            err(
                p.span(),
                "relay.ports",
                format!(
                    "expected a range \"FIRST-LAST\" of ports from 1024 up, found {:?}",
                    p.get_ref()
                ),
            )
        })?;
    }
    if let Some(t) = &raw.idle_timeout {
        if !(30..=86_400).contains(t.get_ref()) {
            return Err(err(
                t.span(),
                "relay.idle_timeout",
                format!("expected 30 to 86400 seconds, found {}", t.get_ref()),
            ));
        }
        config.idle = Duration::from_secs(*t.get_ref());
    }
    Ok(config)
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .map_or(1, |t| t.matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use cyphonic_crypto::CertificateAuthority;

    /// config/cloud.example.toml loads once the files it names exist, and mistakes point at
    /// their line and key.
    #[test]
    fn the_example_loads_and_mistakes_are_located() {
        let dir = tempfile::tempdir().unwrap();
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/cloud.example.toml");
        let text = std::fs::read_to_string(example).unwrap();
        let ca = CertificateAuthority::generate(
            "ovl.example",
            &["100.64.0.0/10".parse().unwrap()],
            0,
            4_000_000_000,
        )
        .unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.certificate().to_pem()).unwrap();
        std::fs::write(
            dir.path().join("cloud.key"),
            StaticKeypair::generate().unwrap().to_pem(),
        )
        .unwrap();
        let path = dir.path().join("cloud.toml");
        std::fs::write(&path, &text).unwrap();
        let c = load(&path, 1_800_000_000).unwrap();
        assert_eq!(c.listen, "0.0.0.0:7000".parse().unwrap());
        assert!(c.policy.allow_by_default);
        assert_eq!(
            c.database,
            format!("sqlite://{}", dir.path().join("cloud.db").display())
        );

        let broken = text.replace(
            "[policy]\ndefault = \"allow\"",
            "[policy]\ndefault = \"maybe\"",
        );
        std::fs::write(&path, &broken).unwrap();
        let line = broken
            .lines()
            .position(|l| l == "default = \"maybe\"")
            .unwrap()
            + 1;
        let e = load(&path, 1_800_000_000).unwrap_err().to_string();
        assert!(
            e.contains(&format!("cloud.toml:{line}: key `policy.default`")),
            "{e}"
        );
        std::fs::write(&path, text.replace("ca.crt", "nope.crt")).unwrap();
        let e = load(&path, 1_800_000_000).unwrap_err().to_string();
        assert!(e.contains("key `ca`") && e.contains("nope.crt"), "{e}");
        std::fs::write(&path, format!("{text}\nlisten_typo = 1\n")).unwrap();
        let e = load(&path, 1_800_000_000).unwrap_err().to_string();
        assert!(e.contains("listen_typo"), "{e}");
        assert_eq!(c.probe_listen_alt, "0.0.0.0:7002".parse().unwrap());
        assert_eq!(c.relay, Some(RelayConfig::default()));
        for (bad, key) in [
            ("ports = \"50999-50000\"", "relay.ports"),
            ("ports = \"80-90\"", "relay.ports"),
            ("idle_timeout = 5", "relay.idle_timeout"),
            ("addresses = [\"0.0.0.0\"]", "relay.addresses"),
            (
                "addresses = [\"192.0.2.10\", \"192.0.2.11\"]",
                "relay.addresses",
            ),
        ] {
            let base = &text[..text.find("\n[relay]").unwrap()];
            let t = format!("{base}\n[relay]\n{bad}\n");
            std::fs::write(&path, &t).unwrap();
            let line = t.lines().position(|l| l == bad).unwrap() + 1;
            let e = load(&path, 1_800_000_000).unwrap_err().to_string();
            assert!(
                e.contains(&format!("cloud.toml:{line}: key `{key}`")),
                "{bad}: {e}"
            );
        }
        // [policy]: groups and rules, one name or a list, `allow` defaulting to any.
        let with_policy = |policy: &str| {
            let t = text.replace("[policy]\ndefault = \"allow\"\n", policy);
            assert_ne!(t, text, "the example's [policy] changed shape");
            std::fs::write(&path, &t).unwrap();
            (load(&path, 1_800_000_000), t)
        };
        let (c, _) = with_policy(
            "[policy]\ndefault = \"deny\"\n[[policy.group]]\nname = \"cams\"\nmembers = \"cam*.gw2.ovl.example\"\n[[policy.rule]]\nfrom = \"ops\"\nto = [\"cams\", \"100.64.2.0/24\"]\n[[policy.rule]]\nfrom = [\"cams\"]\nto = \"nvr.gw2.ovl.example\"\nallow = [\"tcp/554\", \"icmp\"]\n",
        );
        let p = c.unwrap().policy;
        assert!(!p.allow_by_default);
        assert_eq!(p.groups[0].members, vec!["cam*.gw2.ovl.example".to_owned()]);
        assert_eq!(p.rules[0].to.len(), 2);
        assert_eq!(p.rules[0].allow, vec!["any".to_owned()]);
        assert_eq!(p.rules[1].allow.len(), 2);
        for (bad, key, says) in [
            ("allow = [\"tcp/0\"]", "policy.rule[0].allow", "not a port"),
            ("allow = []", "policy.rule[0].allow", "allows nothing"),
            ("to = []", "policy.rule[0].to", "at least one"),
        ] {
            let rule = if bad.starts_with("to") {
                format!("from = \"ops\"\n{bad}\n")
            } else {
                format!("from = \"ops\"\nto = \"iot\"\n{bad}\n")
            };
            let (e, t) = with_policy(&format!(
                "[policy]\ndefault = \"deny\"\n[[policy.rule]]\n{rule}"
            ));
            let e = e.unwrap_err().to_string();
            let line = t.lines().position(|l| l == bad).unwrap() + 1;
            assert!(
                e.contains(&format!("cloud.toml:{line}: key `{key}`")) && e.contains(says),
                "{bad}: {e}"
            );
        }
        let (e, _) = with_policy(
            "[policy]\ndefault = \"deny\"\n[[policy.group]]\nname = \"*\"\nmembers = [\"x\"]\n",
        );
        assert!(e.unwrap_err().to_string().contains("policy.group[0].name"));
    }
}
