//! `cyphonic-cloud serve`'s configuration: config/cloud.example.toml documents every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cyphonic_crypto::{Certificate, RevocationList, StaticKeypair, TrustStore};
use serde::Deserialize;
use toml::Spanned;

use crate::policy::{Policy, Rule};

/// What `serve` needs, checked.
#[derive(Debug)]
pub struct Config {
    /// NMS control sessions (TCP).
    pub listen: SocketAddr,
    /// Endpoint probes (UDP).
    pub probe_listen: SocketAddr,
    /// The cloud's Noise key (clients pin its public half).
    pub key: StaticKeypair,
    /// The CA(s) and revocations client certificates are checked against.
    pub trust: TrustStore,
    /// The store's URL.
    pub database: String,
    /// Who may resolve whom.
    pub policy: Policy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    #[serde(default = "default_probe_listen")]
    probe_listen: SocketAddr,
    key: Spanned<PathBuf>,
    ca: Spanned<PathBuf>,
    revocations: Option<Spanned<PathBuf>>,
    #[serde(default = "default_database")]
    database: String,
    #[serde(default)]
    policy: RawPolicy,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    default: Option<Spanned<String>>,
    #[serde(default)]
    rule: Vec<Rule>,
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

/// Reads and checks the configuration at `path`, with the files it names. Errors name the
/// file, and where possible the line and key.
///
/// # Errors
/// Unreadable or invalid configuration, key or CA files.
pub fn load(path: &Path, now_secs: u64) -> anyhow::Result<Config> {
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
    let trust =
        TrustStore::new(cas, revoked).map_err(|e| err(raw.ca.span(), "ca", e.to_string()))?;
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
    Ok(Config {
        listen: raw.listen,
        probe_listen: raw.probe_listen,
        key,
        trust,
        database,
        policy: Policy {
            allow_by_default,
            rules: raw.policy.rule,
        },
    })
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
    }
}
