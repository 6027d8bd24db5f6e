//! `cyphonic-cloud token`: enrollment tokens (docs/protocol.md §4, Enrollment). `create`
//! binds a one-time token to a name, a block (given, or allocated from `[enroll] pool`
//! without overlapping any other member's or live token's), groups and a certificate
//! lifetime, stores it hashed and prints it once; `list` shows every token and its state;
//! `revoke` makes an unused one worthless. Works on the registry the configuration names, so
//! on PostgreSQL every instance sees the same tokens.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use cyphonic_cloud::enroll::{MAX_TOKEN_EXPIRY, MIN_LIFETIME, TOKEN_EXPIRY, Token, allocate};
use cyphonic_cloud::store::TokenRow;
use cyphonic_crypto::{Certificate, validate_name};
use cyphonic_telemetry::status::time_left;
use ipnet::IpNet;
use serde::Serialize;

/// What `token` does.
#[derive(Subcommand)]
pub(crate) enum Tokens {
    /// Make a one-time enrollment token for a new adapter or node, and print it (once: only
    /// its hash is kept).
    Create {
        /// The cloud's configuration file (its `database` and `[enroll]`).
        #[arg(long)]
        config: PathBuf,
        /// The member's FQDN, below the overlay domain.
        #[arg(long)]
        name: String,
        /// Its vIP block, given (repeatable)...
        #[arg(long = "vip-block", conflicts_with = "prefix")]
        vip_blocks: Vec<IpNet>,
        /// ...or allocated from `[enroll] pool` with this prefix length (24 for an adapter's
        /// LAN, 32 for a node).
        #[arg(long, required_unless_present = "vip_blocks")]
        prefix: Option<u8>,
        /// With --prefix, when the pool has an IPv6 block: the prefix length of the IPv6
        /// block allocated beside the IPv4 one (56 for an adapter's site, 128 for a node).
        /// Default: 128 with `--prefix 32`, else 56.
        #[arg(long, requires = "prefix")]
        prefix6: Option<u8>,
        /// Policy groups (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Lifetime of its certificates in seconds (renewed automatically at two thirds).
        /// Default: `[enroll] lifetime`.
        #[arg(long)]
        lifetime: Option<u64>,
        /// Seconds until the token expires unused (at most 30 days).
        #[arg(long, default_value_t = TOKEN_EXPIRY)]
        expires: u64,
        /// The name is a member already: enroll a replacement (a new device for it). Revoke
        /// the old certificate once the new one is up (`cyphonic-cloud revoke
        /// --fingerprint`).
        #[arg(long)]
        replace: bool,
    },
    /// Every token: what it is bound to, and whether it is live, used, expired or revoked.
    List {
        /// The cloud's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an unused token (by its id, the part before the dot).
    Revoke {
        /// The token's id.
        id: String,
        /// The cloud's configuration file.
        #[arg(long)]
        config: PathBuf,
    },
}

/// A token as `list` shows it (never its secret or hash).
#[derive(Debug, Serialize)]
struct View {
    id: String,
    name: String,
    vip_blocks: Vec<String>,
    groups: Vec<String>,
    lifetime: u64,
    state: &'static str,
    created_at: u64,
    expires_at: u64,
    used_at: Option<u64>,
    used_by: Option<String>,
    revoked_at: Option<u64>,
}

#[expect(clippy::print_stdout, reason = "the command's output")]
fn say(text: &str) {
    println!("{text}");
}

/// The blocks `token create --prefix` hands out from `pool`: an IPv4 block of `prefix`,
/// and, when the pool has an IPv6 block, an IPv6 block of `prefix6` (by default a node's
/// /128 beside a /32, else a site's /56), each the first free past `taken`.
fn allocate_both(
    pool: &[IpNet],
    prefix: u8,
    prefix6: Option<u8>,
    taken: &[IpNet],
) -> anyhow::Result<Vec<IpNet>> {
    let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = pool.iter().partition(|b| matches!(b, IpNet::V4(_)));
    let pick = |blocks: &[IpNet], len: u8, family: &str| {
        allocate(blocks, len, taken).with_context(|| {
            let shown: Vec<String> = blocks.iter().map(ToString::to_string).collect();
            format!(
                "no free /{len} left in the enrollment pool's {family} blocks {}",
                shown.join(" ")
            )
        })
    };
    if v4.is_empty() {
        bail!("the enrollment pool has no IPv4 block: give --vip-block");
    }
    let mut blocks = vec![pick(&v4, prefix, "IPv4")?];
    if v6.is_empty() {
        if let Some(p) = prefix6 {
            bail!("--prefix6 {p}: the enrollment pool has no IPv6 block");
        }
        return Ok(blocks);
    }
    blocks.push(pick(
        &v6,
        prefix6.unwrap_or(if prefix == 32 { 128 } else { 56 }),
        "IPv6",
    )?);
    Ok(blocks)
}

pub(crate) fn run(cmd: Tokens, now: u64) -> anyhow::Result<()> {
    let open = |config: &std::path::Path| crate::Registry::open(config, now);
    match cmd {
        Tokens::Create {
            config,
            name,
            vip_blocks,
            prefix,
            prefix6,
            groups,
            lifetime,
            expires,
            replace,
        } => {
            let registry = open(&config)?;
            let store = &registry.store;
            let Some(issuer) = &registry.config.enroll else {
                bail!(
                    "{} has no [enroll] section: this cloud cannot enroll",
                    config.display()
                );
            };
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            validate_name(&name)?;
            if !(1..=MAX_TOKEN_EXPIRY).contains(&expires) {
                bail!("--expires {expires}: give 1 to {MAX_TOKEN_EXPIRY} seconds");
            }
            let lifetime = lifetime.unwrap_or(issuer.lifetime);
            if lifetime < MIN_LIFETIME {
                bail!("--lifetime {lifetime}: give at least {MIN_LIFETIME} seconds");
            }
            let tokens = registry.block_on(store.tokens())?;
            if let Some(t) = tokens
                .iter()
                .find(|t| t.name == name && matches!(t.state(now), "live" | "issued"))
            {
                bail!(
                    "token {} for {name} is still live: revoke it first (token revoke {})",
                    t.id,
                    t.id
                );
            }
            let members = registry.block_on(store.members())?;
            if !replace && members.iter().any(|m| m.client.name == name) {
                bail!(
                    "{name} is a member already (cyphonic-cloud members show {name}); give --replace to enroll a replacement device for it"
                );
            }
            // Blocks held by others: members of another name, live or used tokens of
            // another name.
            let mut taken: Vec<IpNet> = Vec::new();
            for m in members {
                if m.client.name == name {
                    continue;
                }
                if let Ok(cert) = Certificate::from_pem(&m.client.certificate) {
                    taken.extend(cert.body().vip_blocks.iter().copied());
                }
            }
            for t in &tokens {
                if t.name != name && matches!(t.state(now), "live" | "issued" | "used") {
                    taken.extend(t.blocks.iter().copied());
                }
            }
            let blocks = match prefix {
                Some(p) => allocate_both(&issuer.pool, p, prefix6, &taken)?,
                None => {
                    let blocks: Vec<IpNet> = vip_blocks.iter().map(IpNet::trunc).collect();
                    if let Some((b, t)) = cyphonic_crypto::first_overlap(&blocks, &taken) {
                        bail!("{b} overlaps {t}, which another member or token holds");
                    }
                    blocks
                }
            };
            // What the issuing CA cannot certify fails now, not at the device.
            let probe = TokenRow {
                id: String::new(),
                secret_sha256: String::new(),
                name: name.clone(),
                blocks: blocks.clone(),
                groups: groups.clone(),
                lifetime,
                created_at: now,
                expires_at: now + expires,
                used_at: None,
                used_by: None,
                used_key: None,
                confirmed_at: None,
                revoked_at: None,
            };
            issuer
                .enroll(&probe, [0; 32], now)
                .map_err(|e| anyhow::anyhow!(e))?;
            let token = Token::generate()?;
            let row = TokenRow {
                id: token.id.clone(),
                secret_sha256: token.secret_sha256(),
                ..probe
            };
            registry.block_on(store.add_token(&row))?;
            let shown: Vec<String> = blocks.iter().map(ToString::to_string).collect();
            say(&format!(
                "token {} for {name} ({}), certificates for {lifetime} s, expires in {}:\n{token}\n\
                 on the device: cyphonic-adapter enroll --config FILE --token TOKEN (or cyphonic-node)",
                token.id,
                shown.join(" "),
                time_left(now + expires, now)
            ));
            Ok(())
        }
        Tokens::List { config, json } => {
            let registry = open(&config)?;
            let views: Vec<View> = registry
                .block_on(registry.store.tokens())?
                .into_iter()
                .map(|t| View {
                    state: t.state(now),
                    vip_blocks: t.blocks.iter().map(ToString::to_string).collect(),
                    id: t.id,
                    name: t.name,
                    groups: t.groups,
                    lifetime: t.lifetime,
                    created_at: t.created_at,
                    expires_at: t.expires_at,
                    used_at: t.used_at,
                    used_by: t.used_by,
                    revoked_at: t.revoked_at,
                })
                .collect();
            if json {
                say(&serde_json::to_string_pretty(&views)?);
                return Ok(());
            }
            let mut text = format!(
                "{:<16} {:<32} {:<20} {:<8} {:<8} {}",
                "TOKEN", "NAME", "VIP BLOCKS", "STATE", "EXPIRES", "USED BY"
            );
            for v in &views {
                text.push_str(&format!(
                    "\n{:<16} {:<32} {:<20} {:<8} {:<8} {}",
                    v.id,
                    v.name,
                    v.vip_blocks.join(","),
                    v.state,
                    if matches!(v.state, "live" | "issued") {
                        time_left(v.expires_at, now)
                    } else {
                        "-".to_owned()
                    },
                    v.used_by.as_deref().unwrap_or("-")
                ));
            }
            say(&text);
            Ok(())
        }
        Tokens::Revoke { id, config } => {
            let registry = open(&config)?;
            let store = &registry.store;
            let id = id.trim().to_ascii_lowercase();
            match registry.block_on(store.token(&id))? {
                None => bail!("no token {id}"),
                Some(t) if t.used_at.is_some() => bail!(
                    "token {id} was used already (by {}): revoke that certificate instead",
                    t.used_by.as_deref().unwrap_or("?")
                ),
                Some(_) => {
                    if registry.block_on(store.revoke_token(&id, now))? {
                        say(&format!("revoked token {id}"));
                    } else {
                        say(&format!("token {id} was revoked already"));
                    }
                    Ok(())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(all: &[&str]) -> Vec<IpNet> {
        all.iter().map(|b| b.parse().unwrap_or_default()).collect()
    }

    /// A site gets a /56 beside its /24, a node a /128 beside its /32, or the length asked;
    /// a pool without IPv6 gives IPv4 alone and refuses --prefix6; a full family and a pool
    /// without IPv4 are refused, naming the blocks.
    #[test]
    fn a_token_gets_a_block_of_each_family_the_pool_has() {
        let pool = nets(&["100.64.128.0/17", "fd7a:0:1:8000::/49"]);
        let taken = nets(&["100.64.128.0/24", "fd7a:0:1:8000::/56"]);
        let got = |prefix, prefix6| {
            allocate_both(&pool, prefix, prefix6, &taken).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(
            got(24, None),
            Ok(nets(&["100.64.129.0/24", "fd7a:0:1:8100::/56"]))
        );
        assert_eq!(
            got(32, None),
            Ok(nets(&["100.64.129.0/32", "fd7a:0:1:8100::/128"]))
        );
        assert_eq!(
            got(24, Some(64)),
            Ok(nets(&["100.64.129.0/24", "fd7a:0:1:8100::/64"]))
        );
        let v4 = nets(&["100.64.128.0/17"]);
        assert_eq!(
            allocate_both(&v4, 24, None, &taken).map_err(|e| e.to_string()),
            Ok(nets(&["100.64.129.0/24"]))
        );
        let err =
            |pool: &[IpNet], prefix, prefix6| match allocate_both(pool, prefix, prefix6, &taken) {
                Ok(b) => panic!("allocated {b:?}"),
                Err(e) => format!("{e:#}"),
            };
        assert!(
            err(&v4, 24, Some(56)).contains("--prefix6 56: the enrollment pool has no IPv6 block")
        );
        let full6 = nets(&["100.64.128.0/17", "fd7a:0:1:8000::/56"]);
        assert!(
            err(&full6, 24, None).contains(
                "no free /56 left in the enrollment pool's IPv6 blocks fd7a:0:1:8000::/56"
            ),
            "{}",
            err(&full6, 24, None)
        );
        assert!(err(&nets(&["100.64.128.0/24"]), 24, None).contains("IPv4 blocks 100.64.128.0/24"));
        assert!(err(&nets(&["fd7a:0:1:8000::/49"]), 24, None).contains("no IPv4 block"));
    }
}
