//! `cyphonic-cloud`: the control plane of the overlay. `serve --config FILE` runs the AS/NMS
//! services (the library, `cyphonic_cloud`); `keygen` makes the cloud's Noise key; `ca ...` is
//! the offline certificate authority (like nebula-cert): create the overlay CA, issue node
//! certificates with fresh Noise keys, delegate to the issuing CA the cloud signs with online,
//! revoke, list; `members` is the fleet as the registry knows it (list, show, remove); `token`
//! makes, lists and revokes enrollment tokens.
//!
//! A CA directory holds `ca.crt` (give it to every node), `ca.key` (keep it offline; mode
//! 0600), `revoked.txt` (publish it) and `issued/` (a copy of every certificate issued).
#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

mod access;
mod cakey;
mod members;
mod running;
mod tokens;

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use cyphonic_cloud::admin::{self, RevokeTarget};
use cyphonic_crypto::{
    Certificate, CertificateAuthority, Fingerprint, IssueRequest, RevocationList, StaticKeypair,
};
use cyphonic_telemetry::files::{self, Access};
use cyphonic_telemetry::logging::Format as LogFormat;
use cyphonic_telemetry::service::config_refused;
use ipnet::IpNet;

const DAY: u64 = 24 * 3600;
/// Certificates start this long before "now", so a node whose clock is a little behind the
/// CA's does not refuse a certificate issued moments ago.
const SKEW: u64 = 3600;

/// The configuration file every command reads unless `-c` names another: where the package
/// puts it.
const CONFIG: &str = "/etc/cyphonic/cloud.toml";

/// A duration on the command line: humantime (`24h`, `7d`, `1h 30m`) or bare seconds, as
/// whole seconds.
fn seconds(text: &str) -> Result<u64, String> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(secs);
    }
    humantime::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|e| format!("{e}: say 24h, 7d or 3600 (seconds)"))
}

/// `secs` as people read it (`7days 2h`).
fn human(secs: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

#[derive(Parser)]
#[command(
    name = cyphonic_cloud::PROGRAM,
    version,
    about = "The cyphonic control plane and its certificate authority"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The offline certificate authority.
    #[command(subcommand)]
    Ca(Ca),
    /// Run the control plane services (AS, NMS, TRS) until SIGINT or SIGTERM (`serve` is
    /// the same command's older name).
    #[command(alias = "serve")]
    Run {
        /// The configuration file (see config/cloud.example.toml).
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Show the running cloud's sessions, registry, relay channels and counters.
    Status {
        /// The status socket of the running cloud.
        #[arg(long, default_value = "/run/cyphonic/cloud.sock")]
        socket: PathBuf,
        /// Print the raw JSON document.
        #[arg(long)]
        json: bool,
    },
    /// The fleet as the registry knows it: list members, show one (its certificates and the
    /// names it hosts: its devices), remove one.
    #[command(subcommand)]
    Members(members::Members),
    /// Enrollment tokens: create one for a new adapter or node, list them, revoke one.
    #[command(subcommand)]
    Token(tokens::Tokens),
    /// The HTTP API's tokens: create one (printed once), list them, revoke one.
    #[command(subcommand)]
    ApiToken(access::ApiTokens),
    /// The audit log: every change to the registry (from this command line, the API,
    /// enrollments and renewals, reloads) and every refused attempt, newest first.
    Audit(access::Audit),
    /// Revoke a member online: every certificate the registry knows of NAME (or the one
    /// --fingerprint names). Every cloud instance cuts its session and names within about
    /// 2 s and tells every client, which end their tunnels with it at once.
    Revoke {
        /// The member's name.
        #[arg(
            required_unless_present = "fingerprint",
            conflicts_with = "fingerprint"
        )]
        name: Option<String>,
        /// Or one certificate's fingerprint (hex).
        #[arg(long)]
        fingerprint: Option<String>,
        /// The cloud's configuration file (its `database`).
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
    },
    /// Answer from the configuration's `[policy]` and the registry whether FROM may open WHAT
    /// to TO, and by which rule (exit status 0: allowed, 1: denied, 2: no answer, 78: the
    /// configuration is refused).
    Policy {
        /// The cloud's configuration file (its `[policy]` and `database`).
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
        /// Say it as JSON: `{"allowed", "answer"}`.
        #[arg(long)]
        json: bool,
        /// Who opens: a registered name (`camera1.gw1.ovl.example`) or an address.
        from: String,
        /// To whom: the same.
        to: String,
        /// What: tcp/PORT, udp/PORT or icmp.
        what: String,
    },
    /// Check a configuration file and the files it names, and that the store answers, then
    /// exit (exit status 0: good, 78: refused, with the file, line and key).
    CheckConfig {
        /// The configuration file.
        #[arg(short, long, default_value = crate::CONFIG)]
        config: PathBuf,
        /// Say it as JSON: `{"ok", "config", "summary"}` or `{"ok": false, "config",
        /// "error"}`.
        #[arg(long)]
        json: bool,
    },
    /// Make the cloud's Noise key (mode 0600) and print its public half, which every
    /// adapter and node pins in its configuration (`[cloud] public_key`).
    Keygen {
        /// Where to write the private key (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    #[command(flatten)]
    Documentation(cyphonic_telemetry::manual::Commands),
}

#[derive(Subcommand)]
enum Ca {
    /// Create a new overlay CA in DIR.
    Init {
        /// The CA directory (created; must not hold a CA yet).
        #[arg(long)]
        dir: PathBuf,
        /// The overlay domain: every node name lies below it.
        #[arg(long)]
        domain: String,
        /// The vIP ranges the CA may certify (repeatable). A family given none gets its
        /// default: 100.64.0.0/10 for IPv4, for IPv6 a unique local /48 drawn at random
        /// (`fd` and 40 random bits, RFC 4193).
        #[arg(long = "vip-block")]
        vip_blocks: Vec<IpNet>,
        /// Validity in days.
        #[arg(long, default_value_t = 3650)]
        days: u64,
        /// Protect ca.key with a passphrase, asked twice on the terminal (or given with
        /// --passphrase-file). Every command that signs asks for it again.
        #[arg(long)]
        protect: bool,
        /// Protect ca.key with the passphrase on this file's first line (at least 8
        /// characters).
        #[arg(long, value_name = "FILE")]
        passphrase_file: Option<PathBuf>,
    },
    /// Issue a node certificate (and a fresh Noise key, unless --public-key is given).
    Issue {
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// The node's FQDN, below the CA's domain.
        #[arg(long)]
        name: String,
        /// The vIP block(s) the node may use (an adapter: its LAN block).
        #[arg(long = "vip-block", required = true)]
        vip_blocks: Vec<IpNet>,
        /// Policy groups (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Validity in days.
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// Certify this existing Noise public key (64 hex digits) instead of making a key.
        #[arg(long)]
        public_key: Option<String>,
        /// Where to write `<name>.crt` and `<name>.key`.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        passphrase: cakey::KeyPassphrase,
    },
    /// Revoke a certificate (by file or fingerprint); appends to revoked.txt.
    Revoke {
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// The certificate file to revoke.
        #[arg(
            conflicts_with = "fingerprint",
            required_unless_present = "fingerprint"
        )]
        certificate: Option<PathBuf>,
        /// Or its fingerprint.
        #[arg(long)]
        fingerprint: Option<String>,
    },
    /// Make the issuing CA the cloud's AS signs with online (enrollment, renewal), under
    /// this root: writes `issuing.crt` and `issuing.key` (mode 0600) to OUT, for the cloud's
    /// `[enroll]`. The root's key can then stay offline.
    Delegate {
        /// The (root) CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// The blocks the issuing CA may hand out (repeatable). A family (IPv4, IPv6) given
        /// none: the root's blocks of that family.
        #[arg(long = "vip-block")]
        vip_blocks: Vec<IpNet>,
        /// Validity in days (at most to the root's end).
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// Where to write issuing.crt and issuing.key (created).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        passphrase: cakey::KeyPassphrase,
    },
    /// Give this root CA more blocks (an overlay made before IPv6: its IPv6 /48): a new
    /// `ca.crt` for the same key, name and validity, with the blocks added; the old one is
    /// kept as `ca.crt.<its fingerprint>`. What the old one issued stays valid under the new
    /// one. Spread it before issuing from the new blocks: append it to every node's `ca`
    /// file and reload, then `ca delegate` again for the cloud.
    AddBlock {
        /// The (root) CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// The blocks to add (repeatable); given none: a unique local IPv6 /48 drawn at
        /// random, when the CA has no IPv6 block.
        #[arg(long = "vip-block")]
        vip_blocks: Vec<IpNet>,
        #[command(flatten)]
        passphrase: cakey::KeyPassphrase,
    },
    /// Protect ca.key with a passphrase, change its passphrase, or remove it (--remove).
    /// The key is PKCS#8, encrypted with scrypt and AES-256-CBC, as OpenSSL reads it.
    Passphrase {
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        current: cakey::KeyPassphrase,
        /// The new passphrase: this file's first line (at least 8 characters). Without it
        /// (and without --remove) it is asked twice on the terminal.
        #[arg(long, value_name = "FILE", conflicts_with = "remove")]
        new_passphrase_file: Option<PathBuf>,
        /// Store the key without a passphrase again.
        #[arg(long)]
        remove: bool,
    },
    /// List the certificates this CA issued.
    List {
        /// The CA directory.
        #[arg(long)]
        dir: PathBuf,
        /// Print JSON: one object per certificate (as `ca show --json`, with `state`).
        #[arg(long)]
        json: bool,
    },
    /// Show a certificate's fields: kind, name, blocks, groups, keys, validity, fingerprint.
    Show {
        /// The certificate (PEM).
        certificate: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a certificate as a peer would: signed by one of the CAs in `--ca` (a root, or an
    /// issuing CA under it), inside its domain and blocks, valid now, and not in
    /// `--revoked` (exit status 0: good, 1: refused, saying why).
    Verify {
        /// The certificate (PEM).
        certificate: PathBuf,
        /// The trusted CA certificates (PEM, one or more, as a member's `[identity] ca`).
        #[arg(long)]
        ca: PathBuf,
        /// A revocation list (`revoked.txt` of the CA directory).
        #[arg(long)]
        revoked: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Ca(ca) => run_ca(ca),
        Command::Run { config, log_format } => {
            cyphonic_telemetry::logging::init(log_format);
            match cyphonic_cloud::config::load(&config, now()) {
                Ok(c) => serve(&config, c),
                Err(e) => return config_refused(cyphonic_cloud::PROGRAM, &e),
            }
        }
        Command::Status { socket, json } => show_status(&socket, json),
        Command::CheckConfig { config, json } => {
            let checked = cyphonic_cloud::config::load(&config, now()).and_then(|c| {
                // A shared store must answer now, as the daemon would need it to.
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the runtime")?
                    .block_on(cyphonic_cloud::config::check_store(&config, &c))?;
                Ok(c)
            });
            return cyphonic_telemetry::service::checked_config(
                cyphonic_cloud::PROGRAM,
                &config,
                json,
                checked
                    .map(|c| summary(&config, &c))
                    .map_err(|e| format!("{e:#}")),
            );
        }
        Command::Documentation(d) => d
            .run(&mut <Cli as clap::CommandFactory>::command())
            .map_err(anyhow::Error::from),
        Command::Keygen { out } => keygen(&out),
        Command::Members(m) => members::run(m, now()),
        Command::Token(t) => tokens::run(t, now()),
        Command::ApiToken(t) => access::api_tokens(t, now()),
        Command::Audit(a) => access::audit(a, now()),
        Command::Revoke {
            name,
            fingerprint,
            config,
        } => revoke_online(name, fingerprint, &config),
        Command::Policy {
            config,
            json,
            from,
            to,
            what,
        } => {
            // A file it refuses is a configuration matter (78); the rest, no answer.
            let loaded = match cyphonic_cloud::config::load(&config, now()) {
                Ok(c) => c,
                Err(e) => return config_refused(cyphonic_cloud::PROGRAM, &e),
            };
            return cyphonic_telemetry::service::policy_answer(
                cyphonic_cloud::PROGRAM,
                json,
                Registry::with(loaded)
                    .and_then(|r| policy_check(&r, &from, &to, &what))
                    .map_err(|e| format!("{e:#}")),
            );
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            cyphonic_telemetry::service::fatal(cyphonic_cloud::PROGRAM, &e);
            ExitCode::FAILURE
        }
    }
}

/// A certificate read from the PEM file `path`.
fn read_certificate(path: &Path) -> anyhow::Result<Certificate> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Certificate::from_pem(&text).with_context(|| format!("{}: not a certificate", path.display()))
}

/// `revoked`, `expired` or `valid` at `t`.
fn cert_state(c: &Certificate, revoked: &RevocationList, t: u64) -> &'static str {
    if revoked.contains(&c.fingerprint()) {
        "revoked"
    } else if c.body().not_after <= t {
        "expired"
    } else {
        "valid"
    }
}

/// A certificate's fields as `ca show` and `ca list --json` give them (with its `state` when
/// known).
fn certificate_view(c: &Certificate, state: Option<&str>) -> serde_json::Value {
    let b = c.body();
    let mut view = serde_json::json!({
        "kind": match b.kind { cyphonic_crypto::CertKind::Ca => "ca", cyphonic_crypto::CertKind::Node => "node" },
        "name": b.name,
        "vip_blocks": b.vip_blocks.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "groups": b.groups,
        "public_key": hex::encode(b.public_key),
        "issuer": hex::encode(b.issuer),
        "not_before": b.not_before,
        "not_after": b.not_after,
        "fingerprint": c.fingerprint().to_string(),
    });
    if let (Some(state), Some(map)) = (state, view.as_object_mut()) {
        map.insert("state".into(), state.into());
    }
    view
}

/// What `check-config` says of a good configuration.
fn summary(path: &Path, c: &cyphonic_cloud::CloudConfig) -> String {
    format!(
        "{}: ok (control {}, probes {} and {}, relay {}, api {}, store {}, public key {})",
        path.display(),
        c.listen,
        c.probe_listen,
        c.probe_listen_alt,
        if c.relay.is_some() { "on" } else { "off" },
        c.api.map_or_else(|| "off".to_owned(), |a| a.to_string()),
        cyphonic_cloud::redact(&c.database),
        c.key.public()
    )
}

fn serve(path: &Path, config: cyphonic_cloud::CloudConfig) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(cyphonic_cloud::serve(config, || {
            cyphonic_cloud::config::load(path, now())
        }))
}

/// `status`: the running cloud's document as it came with `json`, else as tables, when it is
/// of the format this program reads.
fn show_status(socket: &Path, json: bool) -> anyhow::Result<()> {
    use cyphonic_cloud::observe::{STATUS_VERSION, Status};
    let doc = cyphonic_telemetry::status::fetch(socket, cyphonic_cloud::PROGRAM)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let version = doc.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(STATUS_VERSION)) {
        bail!(
            "the running cloud writes status format {}, this command reads format {STATUS_VERSION}: use `--json`, or the command of the running version",
            version.map_or_else(
                || "0 (before formats were numbered)".to_owned(),
                |v| v.to_string()
            )
        );
    }
    let status: Status = serde_json::from_value(doc).context("the status document")?;
    print!("{}", status_text(&status));
    Ok(())
}

/// The status document as tables.
fn status_text(doc: &cyphonic_cloud::observe::Status) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let c = &doc.cloud;
    let r = &doc.registry;
    let _ = writeln!(out, "{}", c.software);
    let _ = writeln!(
        out,
        "cloud control {}  probes {}  store {}  up {}",
        c.control,
        c.probes.join(" "),
        c.store,
        cyphonic_telemetry::status::ago(c.uptime_secs)
    );
    let _ = writeln!(
        out,
        "registry: {} clients ({} online), {} names",
        r.clients, r.online, r.names
    );
    if let Some(enroll) = &doc.enroll {
        let left = enroll.expires_in_secs;
        let days = left / 86_400;
        let short = enroll.issuing_ca.get(..16).unwrap_or(&enroll.issuing_ca);
        let _ = match cyphonic_cloud::enroll::expiry(left) {
            cyphonic_cloud::enroll::Expiry::Fine(_) => {
                writeln!(out, "enroll: issuing CA {short} ends in {days} days")
            }
            cyphonic_cloud::enroll::Expiry::Soon(_) => writeln!(
                out,
                "enroll: WARNING: issuing CA {short} ends in {days} days: renew it (`ca delegate`) and reload"
            ),
            _ => writeln!(
                out,
                "enroll: ERROR: issuing CA {short} has ended: nobody can enroll or renew; renew it (`ca delegate`) and reload"
            ),
        };
    }
    let p = &doc.policy;
    if p.enforce {
        let _ = writeln!(
            out,
            "policy: enforced by the clients, {} rules compiled against the registry, version {:x}",
            p.rules, p.version
        );
        if !p.unresolved.is_empty() {
            let _ = writeln!(
                out,
                "  standing for nobody now (not registered, an empty group, or a typo): {}",
                p.unresolved.join(", ")
            );
        }
    } else {
        let _ = writeln!(
            out,
            "policy: default = \"allow\", nothing enforced per device"
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<32} {:<42} {:>8}", "SESSION", "FROM", "FOR");
    for s in &doc.sessions {
        let _ = writeln!(
            out,
            "{:<32} {:<42} {:>8}",
            s.name,
            s.from,
            cyphonic_telemetry::status::ago(s.secs)
        );
    }
    let _ = writeln!(out);
    let mut counters = doc.counters.snapshot();
    match &doc.relay {
        Some(relay) => {
            let _ = writeln!(out, "relay: {}", relay.settings);
            let _ = writeln!(
                out,
                "{:>6} {:<28} {:<28} {:<32} {:>10} {:>10}",
                "PORT", "SIDE A", "SIDE B", "REASON", "PACKETS", "BYTES"
            );
            for ch in &relay.channels {
                let _ = writeln!(
                    out,
                    "{:>6} {:<28} {:<28} {:<32} {:>10} {:>10}",
                    ch.port,
                    ch.a,
                    ch.b,
                    ch.reason,
                    ch.packets,
                    cyphonic_telemetry::status::bytes(ch.bytes)
                );
            }
            counters.extend(relay.counters.snapshot());
        }
        None => {
            let _ = writeln!(out, "relay: off");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "counters (non-zero):");
    for (k, v) in counters.into_iter().filter(|(_, v)| *v != 0) {
        let _ = writeln!(out, "  {k:<28} {v}");
    }
    out
}

/// `policy`: whether `from` may open `what` to `to` under the policy compiled against the
/// registry as it is now, and the answer in words.
fn policy_check(
    registry: &Registry,
    from: &str,
    to: &str,
    what: &str,
) -> anyhow::Result<(bool, String)> {
    let store = &registry.store;
    let (proto, port) = cyphonic_filter::parse_flow(what).map_err(anyhow::Error::msg)?;
    registry.block_on(async {
        let (src, dst) = cyphonic_cloud::fleet::flow_ends(store, from, to).await?;
        let policy = &registry.config.policy;
        let mut trust = registry.config.trust.clone();
        for fp in store.revocations().await? {
            if let Ok(fp) = fp.parse() {
                trust.revocations_mut().revoke(fp);
            }
        }
        let members = store.members().await?;
        let compiled = policy
            .compile(&cyphonic_cloud::policy::entries(&members, &trust, now()))
            .map_err(anyhow::Error::msg)?;
        let v = policy.verdict(&compiled, proto, src, dst, port);
        let flow = format!("{from} ({src}) opening {what} to {to} ({dst})");
        let answer = match (&v.rule, v.allowed) {
            (Some(r), _) => format!(
                "allowed: {flow}, by rule {}: from {:?} to {:?} allow {:?}",
                r.number, r.from, r.to, r.allow
            ),
            (None, true) => format!("allowed: {flow}: {}", v.because),
            (None, false) => format!("denied: {flow}: {}", v.because),
        };
        Ok((v.allowed, answer))
    })
}

fn revoke_online(
    name: Option<String>,
    fingerprint: Option<String>,
    config: &Path,
) -> anyhow::Result<()> {
    let target = match (name, fingerprint) {
        (Some(name), _) => RevokeTarget::Name(name),
        (None, Some(fp)) => RevokeTarget::Fingerprint(fp),
        (None, None) => bail!("name a member or --fingerprint"),
    };
    // The API's two ways to the same revocation.
    let (path, body): (&[&str], _) = match &target {
        RevokeTarget::Name(name) => (&["members", name, "revoke"], None),
        RevokeTarget::Fingerprint(fp) => (
            &["revocations"],
            Some(serde_json::to_value(
                cyphonic_cloud::api::RevokeCertificate {
                    fingerprint: fp.clone(),
                },
            )?),
        ),
    };
    let r: admin::Revoked = running::Change {
        method: reqwest::Method::POST,
        path,
        body,
    }
    .make(config, now(), |registry| {
        Ok(registry.block_on(admin::revoke_member(
            &registry.store,
            &target,
            &admin::Who::cli(),
            now(),
        ))?)
    })?;
    println!(
        "revoked {} certificate(s) ({} already); the cloud cuts them off and tells every client within about 2 s",
        r.added,
        r.fingerprints.len() - r.added
    );
    for fp in &r.fingerprints {
        println!("  {fp}");
    }
    Ok(())
}

/// Run as root, becomes for good the owner of the directory of the SQLite registry `file`
/// (the service user, in the packages' /var/lib/cyphonic) before the registry is opened:
/// what the command creates there (the file on a first run, its write-ahead log) is then the
/// service's, where a root-owned database would stop it ("attempt to write a readonly
/// database"). Registry files root already owns there are given to that user first. Not as
/// root, or where root owns the directory, nothing changes.
fn as_registry_owner(file: &Path) -> anyhow::Result<()> {
    use nix::unistd::{Gid, Uid};
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let Ok(meta) = fs::metadata(files::directory(file)) else {
        return Ok(());
    };
    if meta.uid() == 0 {
        return Ok(());
    }
    let (uid, gid) = (meta.uid(), meta.gid());
    for suffix in ["", "-wal", "-shm"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        let f = Path::new(&name);
        if fs::metadata(f).is_ok_and(|m| m.uid() == 0) {
            std::os::unix::fs::chown(f, Some(uid), Some(gid))
                .with_context(|| format!("giving {} to its directory's owner", f.display()))?;
        }
    }
    nix::unistd::setgroups(&[]).context("dropping root's groups")?;
    nix::unistd::setresgid(Gid::from_raw(gid), Gid::from_raw(gid), Gid::from_raw(gid))
        .context("becoming the registry directory's group")?;
    nix::unistd::setresuid(Uid::from_raw(uid), Uid::from_raw(uid), Uid::from_raw(uid))
        .context("becoming the registry directory's owner")?;
    Ok(())
}

/// The registry a cloud configuration names, opened for a one-shot command (`members`,
/// `token`, `revoke`), with the runtime that drives its queries.
pub(crate) struct Registry {
    /// The configuration, checked.
    pub(crate) config: cyphonic_cloud::CloudConfig,
    /// Its store.
    pub(crate) store: cyphonic_cloud::Store,
    runtime: tokio::runtime::Runtime,
}

impl Registry {
    /// Reads the configuration at `path` (certificates checked at unix time `now`) and opens
    /// its store.
    pub(crate) fn open(path: &Path, now: u64) -> anyhow::Result<Self> {
        Self::with(cyphonic_cloud::config::load(path, now)?)
    }

    /// Opens the store of `config`, a configuration read already.
    pub(crate) fn with(config: cyphonic_cloud::CloudConfig) -> anyhow::Result<Self> {
        if let Some(file) = cyphonic_cloud::config::sqlite_file(&config.database) {
            as_registry_owner(&file)?;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        let store = runtime
            .block_on(cyphonic_cloud::Store::open(&config.database))
            .with_context(|| format!("opening {}", cyphonic_cloud::redact(&config.database)))?;
        Ok(Self {
            config,
            store,
            runtime,
        })
    }

    /// Runs `f` (a query on [`Registry::store`]) to its end.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}

fn keygen(out: &Path) -> anyhow::Result<()> {
    let key = StaticKeypair::generate()?;
    write_new(out, &key.to_pem(), true)?;
    println!("{}", key.public());
    Ok(())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes `contents` to a new file, never over an existing one; a `secret` file is readable
/// by its owner and, in a directory closed to others (the packages' /etc/cyphonic), by the
/// directory's group (the service user): see `cyphonic_telemetry::files`.
fn write_new(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let access = if secret {
        Access::Secret
    } else {
        Access::Public
    };
    files::create(path, contents, access).with_context(|| format!("creating {}", path.display()))
}

/// The certificates `dir`'s CA issued (its `issued/` copies; unreadable ones skipped).
fn issued(dir: &Path) -> anyhow::Result<Vec<Certificate>> {
    let Ok(entries) = fs::read_dir(dir.join("issued")) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in entries {
        let Ok(text) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        if let Ok(cert) = Certificate::from_pem(&text) {
            out.push(cert);
        }
    }
    Ok(out)
}

/// When a new certificate of `name` starts: `SKEW` before `t`, and after every one of that
/// name in `issued`, so that it is the newest of its name (the cloud lets the newest of a
/// name supersede the others: issue 49, finding 6), even issued in the same second as the
/// last. Never after `t`.
fn next_not_before(issued: &[Certificate], name: &str, t: u64) -> u64 {
    issued
        .iter()
        .filter(|c| c.body().name == name)
        .map(|c| c.body().not_before.saturating_add(1))
        .fold(t.saturating_sub(SKEW), u64::max)
        .min(t)
}

/// The first of `blocks` that overlaps a block of a certificate in `issued` of another
/// name than `name`, unrevoked (in `dir`'s revoked.txt) and unexpired: (ours, theirs, that
/// certificate).
fn overlapping_issued(
    dir: &Path,
    issued: &[Certificate],
    name: &str,
    blocks: &[IpNet],
) -> anyhow::Result<Option<(IpNet, IpNet, Certificate)>> {
    let revoked =
        RevocationList::parse(&fs::read_to_string(dir.join("revoked.txt")).unwrap_or_default())?;
    let t = now();
    for cert in issued {
        let b = cert.body();
        if b.name == name || b.not_after <= t || revoked.contains(&cert.fingerprint()) {
            continue;
        }
        if let Some((mine, theirs)) = cyphonic_crypto::first_overlap(blocks, &b.vip_blocks) {
            return Ok(Some((*mine, *theirs, cert.clone())));
        }
    }
    Ok(None)
}

/// The CA in `dir`; a protected key's passphrase comes from `passphrase`.
fn load_ca(dir: &Path, passphrase: &cakey::KeyPassphrase) -> anyhow::Result<CertificateAuthority> {
    let path = dir.join("ca.key");
    let key = zeroize::Zeroizing::new(
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    );
    let cert = fs::read_to_string(dir.join("ca.crt"))
        .with_context(|| format!("reading {}/ca.crt", dir.display()))?;
    cakey::open(&key, &cert, || passphrase.of(&path))
        .with_context(|| format!("loading the CA in {}", dir.display()))
}

/// `given`, and for a family (IPv4, IPv6) it has no block of, `defaults`' blocks of that
/// family.
fn each_family(mut given: Vec<IpNet>, defaults: &[IpNet]) -> Vec<IpNet> {
    for v6 in [false, true] {
        let of = |b: &&IpNet| matches!(b, IpNet::V6(_)) == v6;
        if !given.iter().any(|b| of(&b)) {
            given.extend(defaults.iter().filter(of).copied());
        }
    }
    given
}

/// `ca init`'s default blocks: the shared address space for IPv4, a unique local /48 drawn
/// at random for IPv6.
fn default_blocks() -> anyhow::Result<[IpNet; 2]> {
    let mut global_id = [0u8; 5];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut global_id)
        .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
    Ok([
        "100.64.0.0/10".parse()?,
        cyphonic_cloud::enroll::ula48(global_id).into(),
    ])
}

fn run_ca(cmd: Ca) -> anyhow::Result<()> {
    match cmd {
        Ca::Init {
            dir,
            domain,
            vip_blocks,
            days,
            protect,
            passphrase_file,
        } => {
            if dir.join("ca.key").exists() {
                bail!(
                    "{} already holds a CA (ca.key); refusing to overwrite it",
                    dir.display()
                );
            }
            let vip_blocks = each_family(vip_blocks, &default_blocks()?);
            // Asked before anything is written: a mistake leaves no half-made CA.
            let passphrase = if protect || passphrase_file.is_some() {
                Some(cakey::new_passphrase(passphrase_file.as_deref())?)
            } else {
                None
            };
            fs::create_dir_all(dir.join("issued"))
                .with_context(|| format!("creating {}", dir.display()))?;
            let t = now();
            let ca = CertificateAuthority::generate(
                &domain,
                &vip_blocks,
                t.saturating_sub(SKEW),
                t + days * DAY,
            )?;
            let key = match &passphrase {
                Some(p) => cakey::protect(&ca, p)?,
                None => ca.key_pem(),
            };
            write_new(&dir.join("ca.key"), &key, true)?;
            write_new(&dir.join("ca.crt"), &ca.certificate().to_pem(), false)?;
            write_new(
                &dir.join("revoked.txt"),
                "# revoked certificate fingerprints, one per line\n",
                false,
            )?;
            let shown: Vec<String> = vip_blocks.iter().map(ToString::to_string).collect();
            println!(
                "created CA for {domain} ({}) in {} (fingerprint {})",
                shown.join(" "),
                dir.display(),
                ca.certificate().fingerprint()
            );
            println!(
                "keep {}/ca.key offline; give ca.crt to every node",
                dir.display()
            );
        }
        Ca::Issue {
            dir,
            name,
            vip_blocks,
            groups,
            days,
            public_key,
            out,
            passphrase,
        } => {
            let ca = load_ca(&dir, &passphrase)?;
            // No two names may hold one address (issue 49, finding 6): a block overlapping a
            // valid certificate of another name this CA issued is refused. Revoke that one
            // first (`ca revoke`) to move the block.
            let before = issued(&dir)?;
            if let Some((mine, theirs, other)) =
                overlapping_issued(&dir, &before, &name, &vip_blocks)?
            {
                bail!(
                    "{mine} overlaps {theirs} of {} ({}), a valid certificate this CA issued: \
                     no two names may hold one address (revoke it first to move the block)",
                    other.body().name,
                    other.fingerprint()
                );
            }
            let (key, public) = match public_key {
                Some(hex) => {
                    let k = hex
                        .parse::<cyphonic_crypto::PublicKey>()
                        .context("--public-key must be 64 hex digits")?;
                    (None, k.0)
                }
                None => {
                    let kp = StaticKeypair::generate()?;
                    let public = kp.public().0;
                    (Some(kp), public)
                }
            };
            let t = now();
            let not_after = (t + days * DAY).min(ca.certificate().body().not_after);
            let cert = ca.issue(&IssueRequest {
                name: name.clone(),
                vip_blocks,
                public_key: public,
                groups,
                not_before: next_not_before(&before, &name, t),
                not_after,
            })?;
            fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let cert_path = out.join(format!("{name}.crt"));
            write_new(&cert_path, &cert.to_pem(), false)?;
            if let Some(kp) = key {
                write_new(&out.join(format!("{name}.key")), &kp.to_pem(), true)?;
            }
            let issued = dir.join("issued");
            fs::create_dir_all(&issued)?;
            let _ = write_new(
                &issued.join(format!("{}.crt", cert.fingerprint())),
                &cert.to_pem(),
                false,
            );
            println!(
                "issued {name} ({}) -> {}",
                cert.fingerprint(),
                cert_path.display()
            );
        }
        Ca::Delegate {
            dir,
            vip_blocks,
            days,
            out,
            passphrase,
        } => {
            let root = load_ca(&dir, &passphrase)?;
            let body = root.certificate().body();
            let blocks = each_family(vip_blocks, &body.vip_blocks);
            let t = now();
            let issuing = root.delegate(
                &body.name,
                &blocks,
                t.saturating_sub(SKEW).max(body.not_before),
                (t + days * DAY).min(body.not_after),
            )?;
            fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            write_new(&out.join("issuing.key"), &issuing.key_pem(), true)?;
            write_new(
                &out.join("issuing.crt"),
                &issuing.certificate().to_pem(),
                false,
            )?;
            let shown: Vec<String> = blocks.iter().map(ToString::to_string).collect();
            println!(
                "issuing CA for {} ({}) in {} (fingerprint {}); name it in the cloud's [enroll]",
                body.name,
                shown.join(" "),
                out.display(),
                issuing.certificate().fingerprint()
            );
        }
        Ca::Revoke {
            dir,
            certificate,
            fingerprint,
        } => {
            let fp: Fingerprint = match (certificate, fingerprint) {
                (Some(path), _) => {
                    let text = fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    Certificate::from_pem(&text)?.fingerprint()
                }
                (None, Some(hex)) => hex.parse()?,
                (None, None) => bail!("name a certificate file or --fingerprint"),
            };
            let path = dir.join("revoked.txt");
            let text = fs::read_to_string(&path).unwrap_or_default();
            let mut list = RevocationList::parse(&text)?;
            if list.revoke(fp) {
                let mut file = OpenOptions::new().append(true).create(true).open(&path)?;
                writeln!(file, "{fp}")?;
                println!("revoked {fp}; publish {}", path.display());
            } else {
                println!("{fp} was already revoked");
            }
        }
        Ca::AddBlock {
            dir,
            vip_blocks,
            passphrase,
        } => {
            let ca = load_ca(&dir, &passphrase)?;
            let old = ca.certificate();
            let added = if vip_blocks.is_empty() {
                let [_, ula] = default_blocks()?;
                if old
                    .body()
                    .vip_blocks
                    .iter()
                    .any(|b| matches!(b, IpNet::V6(_)))
                {
                    bail!("the CA has an IPv6 block already; name the blocks to add");
                }
                vec![ula]
            } else {
                vip_blocks
            };
            let grown = ca.with_blocks_added(&added)?;
            let new = grown.certificate();
            if new.body().vip_blocks == old.body().vip_blocks {
                bail!("the CA covers every block named already: nothing to add");
            }
            let kept = dir.join(format!("ca.crt.{}", old.fingerprint()));
            write_new(&kept, &old.to_pem(), false)?;
            files::replace(&dir.join("ca.crt"), new.to_pem(), Access::Public)
                .with_context(|| format!("writing {}/ca.crt", dir.display()))?;
            let shown: Vec<String> = new
                .body()
                .vip_blocks
                .iter()
                .map(ToString::to_string)
                .collect();
            println!(
                "{}/ca.crt now certifies {} (fingerprint {}; the old one is {}): append it to every node's ca file and reload, then delegate again",
                dir.display(),
                shown.join(" "),
                new.fingerprint(),
                kept.display()
            );
        }
        Ca::Passphrase {
            dir,
            current,
            new_passphrase_file,
            remove,
        } => {
            let ca = load_ca(&dir, &current)?;
            let (key, said) = if remove {
                (ca.key_pem(), "no longer protected by a passphrase")
            } else {
                let new = cakey::new_passphrase(new_passphrase_file.as_deref())?;
                (
                    cakey::protect(&ca, &new)?,
                    "protected by the new passphrase",
                )
            };
            let path = dir.join("ca.key");
            files::replace(&path, key.as_bytes(), Access::Secret)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("{} is {said}", path.display());
        }
        Ca::Show { certificate, json } => {
            let cert = read_certificate(&certificate)?;
            let view = certificate_view(&cert, None);
            if json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                for (k, v) in view.as_object().into_iter().flatten() {
                    let v = match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    println!("{k:<12} {v}");
                }
            }
        }
        Ca::Verify {
            certificate,
            ca,
            revoked,
        } => {
            let cert = read_certificate(&certificate)?;
            let cas = Certificate::all_from_pem(
                &fs::read_to_string(&ca).with_context(|| format!("reading {}", ca.display()))?,
            )
            .with_context(|| format!("{}: not PEM certificates", ca.display()))?;
            let revoked = match revoked {
                Some(path) => RevocationList::parse(
                    &fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?,
                )?,
                None => RevocationList::default(),
            };
            let trust = cyphonic_crypto::TrustStore::new(cas, revoked)
                .with_context(|| format!("the CAs of {}", ca.display()))?;
            let t = now();
            trust.verify(&cert, t).with_context(|| {
                format!(
                    "{} ({}) is refused",
                    cert.body().name,
                    certificate.display()
                )
            })?;
            println!(
                "ok: {} ({}), valid for {} more",
                cert.body().name,
                cert.fingerprint(),
                human(cert.body().not_after.saturating_sub(t))
            );
        }
        Ca::List { dir, json } => {
            let revoked = RevocationList::parse(
                &fs::read_to_string(dir.join("revoked.txt")).unwrap_or_default(),
            )?;
            let mut rows = Vec::new();
            for entry in fs::read_dir(dir.join("issued"))
                .with_context(|| format!("reading {}/issued", dir.display()))?
            {
                let path = entry?.path();
                let Ok(text) = fs::read_to_string(&path) else {
                    continue;
                };
                let Ok(cert) = Certificate::from_pem(&text) else {
                    continue;
                };
                rows.push(cert);
            }
            rows.sort_by(|a, b| a.body().name.cmp(&b.body().name));
            if json {
                let t = now();
                let views: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|c| certificate_view(c, Some(cert_state(c, &revoked, t))))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&views)?);
                return Ok(());
            }
            println!(
                "{:<32} {:<20} {:<12} {:<8} FINGERPRINT",
                "NAME", "VIP BLOCKS", "EXPIRES(d)", "STATE"
            );
            let t = now();
            for c in rows {
                let b = c.body();
                let blocks: Vec<String> = b.vip_blocks.iter().map(ToString::to_string).collect();
                let state = cert_state(&c, &revoked, t);
                println!(
                    "{:<32} {:<20} {:<12} {:<8} {}",
                    b.name,
                    blocks.join(","),
                    b.not_after.saturating_sub(t) / DAY,
                    state,
                    c.fingerprint()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/cli/cloud.md is the command line clap parses.
    #[test]
    fn the_command_line_reference_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli/cloud.md");
        let reference = clap_markdown::help_markdown::<Cli>();
        assert_eq!(cyphonic_declare::ensure_file(&path, &reference), Ok(()));
    }

    /// Every command that reads the configuration takes `-c`, and without it the packaged
    /// path; `serve` is still `run`; durations read as people write them, or as seconds.
    #[test]
    fn one_command_line_for_the_configuration_and_durations() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("cyphonic-cloud").chain(args.iter().copied()))
        };
        let Ok(Cli {
            command:
                Command::CheckConfig {
                    config,
                    json: false,
                },
        }) = parse(&["check-config"])
        else {
            panic!("check-config without -c");
        };
        assert_eq!(config, Path::new(CONFIG));
        let Ok(Cli {
            command: Command::Run { config, .. },
        }) = parse(&["serve", "-c", "/srv/c.toml"])
        else {
            panic!("serve -c");
        };
        assert_eq!(config, Path::new("/srv/c.toml"));
        assert!(parse(&["check-config", "/srv/c.toml"]).is_err());
        let Ok(Cli {
            command:
                Command::Token(tokens::Tokens::Create {
                    expires, lifetime, ..
                }),
        }) = parse(&[
            "token",
            "create",
            "--name",
            "n.ovl.example",
            "--prefix",
            "32",
            "--expires",
            "36h",
            "--lifetime",
            "600",
        ])
        else {
            panic!("token create");
        };
        assert_eq!((expires, lifetime), (36 * 3600, Some(600)));
        assert!(
            parse(&[
                "token",
                "create",
                "--name",
                "n",
                "--prefix",
                "32",
                "--expires",
                "soon"
            ])
            .is_err()
        );
        assert_eq!(human(7 * 86_400 + 7200), "7days 2h");
    }

    /// The status document goes through JSON and back whole, and its tables say sizes and
    /// times as people read them; zeros are left out of the counters.
    #[test]
    fn the_status_document_reads_back_and_prints() {
        use cyphonic_cloud::observe::{
            Info, PolicyState, Relay, STATUS_VERSION, Session, Sizes, Status,
        };
        use cyphonic_cloud::trs::ChannelStatus;
        let counters = cyphonic_cloud::nms::Stats::default();
        counters
            .sessions
            .store(3, std::sync::atomic::Ordering::Relaxed);
        let doc = Status {
            version: STATUS_VERSION,
            cloud: Info {
                software: "cyphonic-cloud 0.1.0".into(),
                control: "192.0.2.1:7000".into(),
                probes: vec!["192.0.2.1:7001".into(), "192.0.2.1:7002".into()],
                store: "sqlite:///var/lib/cyphonic/cloud.db".into(),
                public_key: "ab".repeat(32),
                uptime_secs: 7200,
            },
            registry: Sizes {
                clients: 3,
                online: 2,
                names: 5,
            },
            sessions: vec![Session {
                name: "gw1.ovl.example".into(),
                from: "198.51.100.2:40000".into(),
                secs: 90,
            }],
            policy: PolicyState {
                enforce: false,
                version: 0,
                rules: 0,
                unresolved: Vec::new(),
            },
            unproven_connections: 0,
            enroll: Some(cyphonic_cloud::observe::Enroll {
                issuing_ca: "cd".repeat(32),
                not_after: 2_000_000_000,
                expires_in_secs: 5 * 86_400,
            }),
            relay: Some(Relay {
                settings: "ports 50000-50999 on every address".into(),
                channels: vec![ChannelStatus {
                    port: 50001,
                    a: "gw1.ovl.example".into(),
                    b: "n1.ovl.example".into(),
                    reason: "symmetric NAT".into(),
                    age_secs: 5,
                    packets: 10,
                    bytes: 3_000_000,
                }],
                counters: {
                    let c = cyphonic_cloud::trs::TrsStats::default();
                    c.channels_opened
                        .store(2, std::sync::atomic::Ordering::Relaxed);
                    c
                },
            }),
            counters,
        };
        let json = serde_json::to_value(&doc).unwrap();
        assert_eq!(json["version"], STATUS_VERSION);
        assert_eq!(json["relay"]["channels"][0]["bytes"], 3_000_000);
        let back: Status = serde_json::from_value(json).unwrap();
        let text = status_text(&back);
        for line in [
            "cyphonic-cloud 0.1.0",
            "cloud control 192.0.2.1:7000  probes 192.0.2.1:7001 192.0.2.1:7002  store sqlite:///var/lib/cyphonic/cloud.db  up 2h",
            "registry: 3 clients (2 online), 5 names",
            "enroll: WARNING: issuing CA cdcdcdcdcdcdcdcd ends in 5 days: renew it (`ca delegate`) and reload",
            "  sessions                     3",
            "  channels_opened              2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        assert!(
            text.lines()
                .any(|l| l.starts_with("gw1.ovl.example") && l.ends_with(" 90s")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("symmetric NAT") && l.ends_with(" 3.0 MB")),
            "{text}"
        );
        assert!(!text.contains("refused "), "zeros are left out: {text}");
    }

    /// `ca init` and `ca delegate`: a family given a block keeps what was given; a family
    /// given none takes the defaults' blocks of it (the random /48 is a unique local one).
    #[test]
    fn a_family_given_no_block_takes_the_default_ones() {
        let nets =
            |all: &[&str]| -> Vec<IpNet> { all.iter().map(|b| b.parse().unwrap()).collect() };
        let root = nets(&["100.64.0.0/10", "fd7a:0:1::/48", "fd7a:0:2::/48"]);
        assert_eq!(each_family(Vec::new(), &root), root);
        assert_eq!(
            each_family(nets(&["100.64.128.0/17"]), &root),
            nets(&["100.64.128.0/17", "fd7a:0:1::/48", "fd7a:0:2::/48"])
        );
        assert_eq!(
            each_family(nets(&["fd7a:0:1:8000::/49"]), &root),
            nets(&["fd7a:0:1:8000::/49", "100.64.0.0/10"])
        );
        let given = nets(&["100.64.128.0/17", "fd7a:0:1:8000::/49"]);
        assert_eq!(each_family(given.clone(), &root), given);
        let [v4, IpNet::V6(v6)] = default_blocks().unwrap() else {
            panic!("IPv4, then IPv6");
        };
        assert_eq!(v4, "100.64.0.0/10".parse::<IpNet>().unwrap());
        assert_eq!((v6.prefix_len(), v6.network().octets()[0]), (48, 0xfd));
    }

    #[test]
    fn a_new_certificate_of_a_name_starts_after_every_one_issued_of_it() {
        let t = 1_000_000;
        let blocks: Vec<IpNet> = vec!["100.64.0.0/10".parse().unwrap()];
        let ca = CertificateAuthority::generate("ovl.example", &blocks, 0, t * 2).unwrap();
        let cert = |name: &str, not_before: u64| {
            ca.issue(&IssueRequest {
                name: name.into(),
                vip_blocks: vec!["100.64.2.0/24".parse().unwrap()],
                public_key: [7; 32],
                groups: Vec::new(),
                not_before,
                not_after: t + 100,
            })
            .unwrap()
        };
        // Nothing issued of it: an hour back, for clocks behind.
        assert_eq!(next_not_before(&[], "gw2.ovl.example", t), t - SKEW);
        // Issued the same second (a re-key right after the first issue): one second later,
        // whatever other names hold.
        let issued = [
            cert("gw2.ovl.example", t - SKEW),
            cert("gw3.ovl.example", t - 5),
        ];
        assert_eq!(next_not_before(&issued, "gw2.ovl.example", t), t - SKEW + 1);
        // Never after now.
        let issued = [cert("gw2.ovl.example", t)];
        assert_eq!(next_not_before(&issued, "gw2.ovl.example", t), t);
    }
}
