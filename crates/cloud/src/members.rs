//! `cyphonic-cloud members`: the fleet as the registry knows it. `list` (every member's
//! certificates, online or when last seen, expiry, how many names, the software and version
//! each last said it runs), `show NAME` (its
//! certificates, groups, blocks, endpoints and the names it hosts: its devices) and
//! `remove NAME` (forget it and its names), in tables or JSON. Read from the store the
//! configuration names, so on PostgreSQL it shows the whole fleet of every instance.

use std::path::Path;

use clap::Subcommand;
use cyphonic_cloud::api::Removed;
use cyphonic_cloud::fleet::MemberView;
use cyphonic_cloud::store::PairReport;
use cyphonic_control::{PairBox, PairRole};
use cyphonic_telemetry::status::{age, time_left};

/// What `members` does.
#[derive(Subcommand)]
pub(crate) enum Members {
    /// Every member the registry knows (each certificate apart: a renewed member shows its
    /// older certificates as offline).
    List {
        /// The cloud's configuration file (its `database`).
        #[arg(short, long, default_value = crate::CONFIG)]
        config: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One member: its certificates, groups, blocks, endpoints and the names it hosts.
    Show {
        /// The member's name (its certificate's).
        name: String,
        /// The cloud's configuration file.
        #[arg(short, long, default_value = crate::CONFIG)]
        config: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget a member's offline certificates and the names they host (all of a member that
    /// is gone; the older ones of a renewed member). An online one stays. A certificate stays
    /// valid: revoke it too (`ca revoke`), or it registers again when it reconnects.
    Remove {
        /// The member's name.
        name: String,
        /// The cloud's configuration file.
        #[arg(short, long, default_value = crate::CONFIG)]
        config: std::path::PathBuf,
    },
}

/// Runs `members`, at unix time `now`.
///
/// # Errors
/// The configuration or the store cannot be read; no such member; a member online.
pub(crate) fn run(cmd: Members, now: u64) -> anyhow::Result<()> {
    let open = |config: &Path| crate::Registry::open(config, now);
    match cmd {
        Members::List { config, json } => {
            let registry = open(&config)?;
            let views: Vec<MemberView> = registry
                .block_on(registry.store.members())?
                .iter()
                .map(MemberView::of)
                .collect();
            print(json, &views, || list_text(&views, now))
        }
        Members::Show { name, config, json } => {
            let registry = open(&config)?;
            let views: Vec<MemberView> = registry
                .block_on(registry.store.members())?
                .iter()
                .filter(|m| m.client.name == name)
                .map(MemberView::of)
                .collect();
            anyhow::ensure!(!views.is_empty(), "no member named {name}");
            print(json, &views, || show_text(&views, now))
        }
        Members::Remove { name, config } => {
            let removed: Removed = crate::running::Change {
                method: reqwest::Method::DELETE,
                path: &["members", &name],
                body: None,
            }
            .make(&config, now, |registry| {
                let removed = registry.block_on(cyphonic_cloud::admin::remove_member(
                    &registry.store,
                    &name,
                    &cyphonic_cloud::admin::Who::cli(),
                ))?;
                Ok(Removed { removed })
            })?;
            let removed = removed.removed;
            say(&format!(
                "removed {removed} offline certificate(s) of {name} and the names they hosted; a certificate stays valid until revoked (ca revoke)"
            ));
            Ok(())
        }
    }
}

#[expect(clippy::print_stdout, reason = "the command's output")]
fn say(text: &str) {
    println!("{text}");
}

fn print(json: bool, views: &[MemberView], text: impl FnOnce() -> String) -> anyhow::Result<()> {
    if json {
        say(&serde_json::to_string_pretty(views)?);
    } else {
        say(text().trim_end());
    }
    Ok(())
}

fn list_text(views: &[MemberView], now: u64) -> String {
    use std::fmt::Write as _;
    let mut t = format!(
        "{:<32} {:<7} {:<10} {:<8} {:>5}  {:<24} {:<16} {}\n",
        "MEMBER", "ONLINE", "LAST SEEN", "EXPIRES", "NAMES", "AGENT", "HA PAIR", "FINGERPRINT"
    );
    for v in views {
        let _ = writeln!(
            t,
            "{:<32} {:<7} {:<10} {:<8} {:>5}  {:<24} {:<16} {}",
            v.name,
            if v.online { "yes" } else { "no" },
            age(v.last_seen, now),
            time_left(v.not_after, now),
            v.names.len(),
            v.agent.as_deref().unwrap_or("-"),
            v.pair.as_ref().map_or_else(|| "-".to_owned(), pair_brief),
            v.fingerprint
        );
    }
    t
}

fn show_text(views: &[MemberView], now: u64) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    for v in views {
        let _ = writeln!(t, "member {}  certificate {}", v.name, v.fingerprint);
        let _ = writeln!(
            t,
            "  {}  last seen {}  expires in {} (unix {})  runs {}",
            if v.online { "online" } else { "offline" },
            age(v.last_seen, now),
            time_left(v.not_after, now),
            v.not_after,
            v.agent.as_deref().unwrap_or("-")
        );
        let _ = writeln!(
            t,
            "  blocks {}  groups {}",
            v.vip_blocks.join(" "),
            if v.groups.is_empty() {
                "-".to_owned()
            } else {
                v.groups.join(" ")
            }
        );
        let endpoints: Vec<String> = v.endpoints.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            t,
            "  endpoints {}  seen at {}",
            if endpoints.is_empty() {
                "-".to_owned()
            } else {
                endpoints.join(" ")
            },
            v.observed.map_or_else(|| "-".to_owned(), |o| o.to_string())
        );
        for n in &v.names {
            let own = n
                .legacy
                .map_or_else(String::new, |a| format!("  fixed {a}"));
            let v6 = n.vip6.map_or_else(String::new, |a| format!("  {a}"));
            let vip = n.vip.map_or_else(|| "-".to_owned(), |a| a.to_string());
            let _ = writeln!(t, "  {:<40} {vip}{v6}{own}", n.name);
        }
        if let Some(p) = &v.pair {
            t.push_str(&pair_text(p, now));
        }
    }
    t
}

fn role(r: PairRole) -> &'static str {
    match r {
        PairRole::Starting => "starting",
        PairRole::Standby => "standby",
        PairRole::Active => "active",
    }
}

/// A pair in a word or two: the reporting box's role, then the other's (`lost`: not in
/// contact), e.g. `active+standby`.
fn pair_brief(p: &PairReport) -> String {
    p.boxes
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if i > 0 && !b.in_contact {
                "lost"
            } else {
                role(b.role)
            }
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// A pair's lines under its member in `show`.
fn pair_text(p: &PairReport, now: u64) -> String {
    use std::fmt::Write as _;
    let when = match age(p.at, now) {
        now if now == "now" => now,
        ago => format!("{ago} ago"),
    };
    let mut t = format!(
        "  HA pair  term {}  reported {when}  ({})\n",
        p.term, p.reason
    );
    for (i, b) in p.boxes.iter().enumerate() {
        let PairBox {
            mac,
            role: r,
            priority,
            health,
            in_contact,
        } = b;
        let well: Vec<&str> = health
            .iter()
            .map(|h| match h {
                cyphonic_control::PairHealth::Lan => "lan",
                cyphonic_control::PairHealth::Uplink => "uplink",
                cyphonic_control::PairHealth::DataPlane => "data_plane",
                cyphonic_control::PairHealth::Reached => "reached",
            })
            .collect();
        let said = match (i, in_contact) {
            (0, _) => "reporting",
            (_, true) => "in contact",
            (_, false) => "not in contact",
        };
        let _ = writeln!(
            t,
            "    {mac}  {:<8} priority {priority:<3}  well: {:<32} {said}",
            role(*r),
            if well.is_empty() {
                "-".to_owned()
            } else {
                well.join(" ")
            }
        );
    }
    t
}
