//! `cyphonic-cloud token`: enrollment tokens (docs/protocol.md §4, Enrollment). `create`
//! binds a one-time token to a name, a block (given, or allocated from `[enroll] pool`
//! without overlapping any other member's or live token's), groups and a certificate
//! lifetime, stores it hashed and prints it once; `list` shows every token and its state;
//! `revoke` makes an unused one worthless. Works on the registry the configuration names, so
//! on PostgreSQL every instance sees the same tokens.

use std::path::PathBuf;

use clap::Subcommand;
use cyphonic_cloud::admin::{self, TokenRequest, Who};
use cyphonic_cloud::api::NewEnrollmentToken;
use cyphonic_cloud::enroll::TOKEN_EXPIRY;
use cyphonic_cloud::fleet::TokenView;
use cyphonic_telemetry::status::time_left;
use ipnet::IpNet;

use crate::running::Change;

/// What `token` does.
#[derive(Subcommand)]
pub(crate) enum Tokens {
    /// Make a one-time enrollment token for a new adapter or node, and print it (once: only
    /// its hash is kept).
    Create {
        /// The cloud's configuration file (its `database` and `[enroll]`).
        #[arg(short, long, default_value = crate::CONFIG)]
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
        /// Lifetime of its certificates (`7d`, `12h`, or seconds; renewed automatically at
        /// two thirds). Default: `[enroll] lifetime`.
        #[arg(long, value_parser = crate::seconds)]
        lifetime: Option<u64>,
        /// How long the token stays usable unused (`24h`, `3d`, or seconds; at most 30 days).
        #[arg(long, value_parser = crate::seconds, default_value_t = TOKEN_EXPIRY)]
        expires: u64,
        /// Print JSON: `{"id", "name", "blocks", "token", "lifetime_secs", "expires_at"}`.
        #[arg(long)]
        json: bool,
        /// The name is a member already: enroll a replacement (a new device for it). Revoke
        /// the old certificate once the new one is up (`cyphonic-cloud revoke
        /// --fingerprint`).
        #[arg(long)]
        replace: bool,
    },
    /// Every token: what it is bound to, and whether it is live, used, expired or revoked.
    List {
        /// The cloud's configuration file.
        #[arg(short, long, default_value = crate::CONFIG)]
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
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
    },
}

/// A new enrollment token as the command line prints it (from the API's
/// `NewEnrollmentToken`).
#[derive(serde::Deserialize)]
struct Made {
    token: String,
    item: MadeItem,
}

/// What the new token is bound to.
#[derive(serde::Deserialize)]
struct MadeItem {
    id: String,
    name: String,
    vip_blocks: Vec<String>,
    lifetime: u64,
    expires_at: u64,
}

#[expect(clippy::print_stdout, reason = "the command's output")]
fn say(text: &str) {
    println!("{text}");
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
            json,
            replace,
        } => {
            let req = TokenRequest {
                name,
                vip_blocks,
                prefix,
                prefix6,
                groups,
                lifetime,
                expires,
                replace,
            };
            let made: Made = Change {
                method: reqwest::Method::POST,
                path: &["enrollment-tokens"],
                body: Some(serde_json::to_value(&req)?),
            }
            .make(&config, now, |registry| {
                let (row, token) = registry.block_on(admin::create_token(
                    &registry.store,
                    registry.config.enroll.as_ref(),
                    &req,
                    &Who::cli(),
                    now,
                ))?;
                Ok(NewEnrollmentToken {
                    token: token.to_string(),
                    item: TokenView::of(row, now),
                })
            })?;
            let (row, token) = (made.item, made.token);
            let shown = row.vip_blocks;
            if json {
                say(&serde_json::json!({
                    "id": row.id,
                    "name": row.name,
                    "blocks": shown,
                    "token": token,
                    "lifetime_secs": row.lifetime,
                    "expires_at": row.expires_at,
                })
                .to_string());
                return Ok(());
            }
            say(&format!(
                "token {} for {} ({}), certificates for {}, expires in {}:\n{token}\n\
                 on the device: cyphonic-adapter enroll --token TOKEN (or cyphonic-node)",
                row.id,
                row.name,
                shown.join(" "),
                crate::human(row.lifetime),
                time_left(row.expires_at, now)
            ));
            Ok(())
        }
        Tokens::List { config, json } => {
            let registry = open(&config)?;
            let views: Vec<TokenView> = registry
                .block_on(registry.store.tokens())?
                .into_iter()
                .map(|t| TokenView::of(t, now))
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
        Tokens::Revoke { id, config } => crate::running::revoke_token(
            &config,
            now,
            ("enrollment-tokens", "token"),
            &id,
            |registry| {
                Ok(registry.block_on(admin::revoke_token(
                    &registry.store,
                    &id,
                    &Who::cli(),
                    now,
                ))?)
            },
        ),
    }
}
