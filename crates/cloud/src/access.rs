//! `cyphonic-cloud api-token` (the HTTP API's tokens: make one and print it once, list,
//! revoke) and `cyphonic-cloud audit` (the audit log, newest first), on the registry the
//! configuration names (docs/protocol.md §8).

use std::path::PathBuf;

use clap::Subcommand;
use cyphonic_cloud::admin::{self, Scope, Who};
use cyphonic_cloud::api::{ApiTokenRequest, ApiTokenView, NewApiToken};
use cyphonic_cloud::store::AuditQuery;
use cyphonic_telemetry::status::time_left;

use crate::running::Change;

/// What `api-token` does.
#[derive(Subcommand)]
pub(crate) enum ApiTokens {
    /// Make an API token and print it (once: only its hash is kept).
    Create {
        /// The cloud's configuration file (its `database`).
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
        /// What it is for (`ci`, `grafana`...).
        #[arg(long)]
        name: String,
        /// What it may do: read (everything but secrets), write (also enrollment tokens
        /// and revocations), admin (also API tokens).
        #[arg(long, value_enum)]
        scope: Scope,
        /// How long it lasts (`90d`, `12h`, or seconds; at most a year). Default: until
        /// revoked.
        #[arg(long, value_parser = crate::seconds)]
        expires: Option<u64>,
    },
    /// Every API token: name, scope, who made it, and whether it is live.
    List {
        /// The cloud's configuration file.
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
    },
    /// Revoke an API token (by its id, the 16 hex digits after `cyk_`).
    Revoke {
        /// The token's id.
        id: String,
        /// The cloud's configuration file.
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
    },
}

/// A new API token as the command line prints it (from the API's `NewApiToken`).
#[derive(serde::Deserialize)]
struct MadeApiToken {
    token: String,
    item: MadeApiTokenItem,
}

/// What the new API token is.
#[derive(serde::Deserialize)]
struct MadeApiTokenItem {
    id: String,
    expires_at: Option<u64>,
}

#[expect(clippy::print_stdout, reason = "the command's output")]
fn say(text: &str) {
    println!("{text}");
}

/// Runs `api-token`, at unix time `now`.
///
/// # Errors
/// The configuration or the store cannot be read; what the write refuses.
pub(crate) fn api_tokens(cmd: ApiTokens, now: u64) -> anyhow::Result<()> {
    match cmd {
        ApiTokens::Create {
            config,
            name,
            scope,
            expires,
        } => {
            let req = ApiTokenRequest {
                name,
                scope,
                expires,
            };
            let made: MadeApiToken = Change {
                method: reqwest::Method::POST,
                path: &["api-tokens"],
                body: Some(serde_json::to_value(&req)?),
            }
            .make(&config, now, |registry| {
                let (row, token) = registry.block_on(admin::create_api_token(
                    &registry.store,
                    &req.name,
                    req.scope,
                    req.expires,
                    &Who::cli(),
                    now,
                ))?;
                Ok(NewApiToken {
                    token: token.to_string(),
                    item: ApiTokenView::of(row, now),
                })
            })?;
            say(&format!(
                "API token {} ({}, {}), {}:\n{}\nuse it as: Authorization: Bearer TOKEN",
                made.item.id,
                req.name,
                req.scope,
                made.item.expires_at.map_or_else(
                    || "until revoked".to_owned(),
                    |e| format!("ends in {}", time_left(e, now))
                ),
                made.token
            ));
            Ok(())
        }
        ApiTokens::List { config } => {
            let registry = crate::Registry::open(&config, now)?;
            let mut text = format!(
                "{:<16} {:<20} {:<6} {:<8} {:<10} {}",
                "TOKEN", "NAME", "SCOPE", "STATE", "ENDS", "MADE BY"
            );
            for t in registry.block_on(registry.store.api_tokens())? {
                let state = t.state(now);
                text.push_str(&format!(
                    "\n{:<16} {:<20} {:<6} {:<8} {:<10} {}",
                    t.id,
                    t.name,
                    t.scope,
                    state,
                    match (state, t.expires_at) {
                        ("live", Some(e)) => time_left(e, now),
                        _ => "-".to_owned(),
                    },
                    t.created_by
                ));
            }
            say(&text);
            Ok(())
        }
        ApiTokens::Revoke { id, config } => crate::running::revoke_token(
            &config,
            now,
            ("api-tokens", "API token"),
            &id,
            |registry| {
                Ok(registry.block_on(admin::revoke_api_token(
                    &registry.store,
                    &id,
                    &Who::cli(),
                    now,
                ))?)
            },
        ),
    }
}

/// What `audit` lists.
#[derive(clap::Args)]
pub(crate) struct Audit {
    /// The cloud's configuration file (its `database`).
    #[arg(short, long, default_value = crate::CONFIG)]
    config: PathBuf,
    /// Only this actor (`cli:root`, `token:<id> <name>`, `member:<name>`...).
    #[arg(long)]
    actor: Option<String>,
    /// Only this action (`member.revoke`, `enrollment_token.create`...).
    #[arg(long)]
    action: Option<String>,
    /// Only this target (a member's name, a token's id...).
    #[arg(long)]
    target: Option<String>,
    /// At most this many rows, newest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    limit: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `audit`, at unix time `now`.
///
/// # Errors
/// The configuration or the store cannot be read.
pub(crate) fn audit(cmd: Audit, now: u64) -> anyhow::Result<()> {
    let registry = crate::Registry::open(&cmd.config, now)?;
    let rows = registry.block_on(registry.store.audit_log(&AuditQuery {
        actor: cmd.actor,
        action: cmd.action,
        target: cmd.target,
        before: None,
        limit: cmd.limit,
    }))?;
    if cmd.json {
        say(&serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let mut text = format!(
        "{:<29} {:<24} {:<12} {:<26} {:<28} {:<11} {}",
        "WHEN", "ACTOR", "FROM", "ACTION", "TARGET", "RESULT", "DETAILS"
    );
    for r in rows {
        text.push_str(&format!(
            "\n{:<29} {:<24} {:<12} {:<26} {:<28} {:<11} {}",
            httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.at)),
            r.actor,
            r.source,
            r.action,
            r.target,
            r.result,
            r.details
        ));
    }
    say(&text);
    Ok(())
}
