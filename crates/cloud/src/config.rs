//! `cyphonic-cloud serve`'s configuration: config/cloud.example.toml documents every key.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cyphonic_crypto::{Certificate, RevocationList, StaticKeypair, TrustStore};
use toml::Spanned;

use cyphonic_declare::{OneOrMore, line_of};

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
    /// Where the CLI's changes to the registry reach the running cloud.
    pub admin_socket: PathBuf,
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
    /// Where the HTTP API listens; off without.
    pub api: Option<SocketAddr>,
    /// Days the audit log keeps a row.
    pub audit_days: u64,
    /// Flow logs: who records them, how long they are kept.
    pub flows: FlowLogs,
    /// The API's TLS; plain HTTP without.
    pub api_tls: Option<crate::tls::Tls>,
    /// The reverse proxies in front of the API.
    pub api_proxies: Vec<ipnet::IpNet>,
    /// Sign-in for people; none without `[api.oidc]`.
    pub api_oidc: Option<crate::signin::OidcConfig>,
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
    /// The stream listener, if any.
    pub stream: Option<StreamListen>,
}

/// The relay's stream listener (docs/protocol.md §4, *Relay over a stream*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamListen {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Its TLS; `None`: plain TCP.
    pub tls: Option<crate::tls::Tls>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            addresses: Vec::new(),
            ports: 50_000..=50_999,
            idle: Duration::from_secs(120),
            stream: None,
        }
    }
}

/// Flow logs (docs/protocol.md §8, *Flow logs*): the members that record their flows, and
/// how long the cloud keeps the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowLogs {
    /// Member names, or patterns over them (`*.sites.ovl.example`).
    pub members: Vec<String>,
    /// Certificate groups.
    pub groups: Vec<String>,
    /// Days a record is kept.
    pub keep_days: u64,
}

impl Default for FlowLogs {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            groups: Vec::new(),
            keep_days: 7,
        }
    }
}

impl FlowLogs {
    /// Whether the member of certificate `body` records its flows.
    pub fn logs(&self, body: &cyphonic_crypto::CertBody) -> bool {
        self.members.iter().any(|m| {
            m == "*"
                || *m == body.name
                || cyphonic_filter::is_pattern(m) && cyphonic_filter::glob(m, &body.name)
        }) || body.groups.iter().any(|g| self.groups.contains(g))
    }
}

cyphonic_declare::table! {
    /// `cyphonic-cloud serve`'s file.
    struct Raw in "" {
        /// NMS control sessions (TCP, Noise). Adapters and nodes name this address in
        /// `[cloud] address`.
        listen: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 7000)),
        /// Endpoint probes (UDP): clients send one from their tunnel socket so that the cloud
        /// sees the address their NAT maps it to. The same IP as `listen`.
        probe_listen: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 7001)),
        /// The second probe port: clients probe both, and a NAT that maps the two probes to
        /// different ports is symmetric (such pairs are relayed). Unset: `probe_listen`'s
        /// address, its port + 1.
        probe_listen_alt: Option<SocketAddr> = None,
        /// The cloud's Noise private key, made by `cyphonic-cloud keygen`, which prints the
        /// public half every client pins (`[cloud] public_key`). Mode 0640, group cyphonic.
        key: Spanned<PathBuf>,
        /// The overlay CA certificate(s) client certificates must chain to.
        ca: Spanned<PathBuf>,
        /// The revocation list `ca revoke` maintains. Unset: none.
        revocations: Option<Spanned<PathBuf>> = None,
        /// The registry: a SQLite file (created on first start), or PostgreSQL by URL when
        /// several cloud instances serve one overlay (`postgres://USER:PASSWORD@HOST/DB`).
        database: Spanned<String> = Spanned::new(0..0, "sqlite:///var/lib/cyphonic/cloud.db".to_owned()),
        /// Who may reach whom.
        policy: RawPolicy = Default::default(),
        /// The relay.
        relay: RawRelay = RawRelay::default(),
        /// Where `cyphonic-cloud status` finds the running cloud (mode 0600).
        status_socket: PathBuf = PathBuf::from("/run/cyphonic/cloud.sock"),
        /// Where the command line's changes to the registry (`token create`, `revoke`...)
        /// reach the running cloud: the API's endpoints for root and the cloud's user (mode
        /// 0600). Unset: beside `status_socket`, its name with `-admin`
        /// (`/run/cyphonic/cloud-admin.sock`).
        admin_socket: Option<Spanned<PathBuf>> = None,
        /// The metrics endpoint.
        metrics: RawMetrics = RawMetrics::default(),
        /// The HTTP API.
        api: RawApi = RawApi::default(),
        /// Flow logs.
        flows: RawFlows = RawFlows::default(),
        /// Online issuing.
        enroll: Option<RawEnroll> = None,
    }
}

cyphonic_declare::table! {
    /// Online issuing: new adapters and nodes enroll with a token (`cyphonic-cloud token
    /// create`), and certificates issued here are renewed automatically. The key is an
    /// issuing CA the root delegated to (`cyphonic-cloud ca delegate`), so that the root's key
    /// stays offline. Without this table the cloud neither enrolls nor renews. Restart-only.
    struct RawEnroll in "enroll" {
        /// The issuing CA's certificate.
        certificate: Spanned<PathBuf>,
        /// The issuing CA's key (mode 0640, group cyphonic).
        key: Spanned<PathBuf>,
        /// Blocks `token create --prefix N` allocates from, first free first. Unset: the
        /// issuing CA's blocks.
        pool: Option<Spanned<Vec<String>>> = None,
        /// Lifetime of the certificates issued, seconds (30 to 31536000); clients renew at two
        /// thirds of it. A token may give its own (`--lifetime`).
        lifetime: Spanned<u64> = cyphonic_declare::unwritten(7 * 24 * 3600),
    }
}

cyphonic_declare::table! {
    /// The Prometheus endpoint (`http://<listen>/metrics`): sessions, registrations,
    /// resolutions and denials, probes, relay channels and bytes. Keep it on loopback or a
    /// management network.
    struct RawMetrics in "metrics" (optional) {
        /// Where it listens, with a port. Unset: no endpoint.
        listen: Option<Spanned<SocketAddr>> = None,
    }
}

cyphonic_declare::table! {
    /// The HTTP API (`http://<listen>/api/v1`, docs/protocol.md §8): the fleet, enrollment
    /// and API tokens, revocations and the audit log, for programs holding an API token
    /// (`cyphonic-cloud api-token create`). Plain HTTP: keep it on loopback or a management
    /// network, or behind a reverse proxy that adds TLS.
    struct RawApi in "api" (optional) {
        /// Where it listens, with a port. Unset: no API.
        listen: Option<Spanned<SocketAddr>> = None,
        /// Serve it over TLS with this certificate chain (PEM, the server's first)...
        tls_cert: Option<Spanned<PathBuf>> = None,
        /// ...and its private key (PEM; mode 0640, group cyphonic). Both or neither. A reload
        /// (SIGHUP) reads both files again; other file names take a restart.
        tls_key: Option<Spanned<PathBuf>> = None,
        /// Reverse proxies in front of it (addresses or blocks): a request through one is
        /// taken to come from the last address its `X-Forwarded-For` names (the audit log's
        /// source), and its connections are not held to the per-address limit.
        trusted_proxies: Spanned<Vec<String>> = Spanned::new(0..0, Vec::new()),
        /// Days the audit log keeps a row (1 to 3650); every instance forgets older rows
        /// hourly. Applies with or without `listen`.
        audit_days: Spanned<u64> = cyphonic_declare::unwritten(365),
        /// Sign-in for people (the console).
        oidc: Option<RawOidc> = None,
    }
}

cyphonic_declare::table! {
    /// Flow logs (docs/protocol.md §8): the members named here record each flow that ends
    /// (addresses, ports, bytes and packets each way, the rule that allowed it) and a
    /// summary a minute of what no rule allowed, and send them to the cloud, which keeps
    /// them for `keep_days` and serves them at `/api/v1/flows`. Members of control version
    /// 12 and later. Restart-only.
    struct RawFlows in "flows" (optional) {
        /// Members by name, or patterns over names (`*.sites.ovl.example`); `"*"`: all.
        members: Vec<String> = Vec::new(),
        /// Members whose certificate holds one of these groups.
        groups: Vec<String> = Vec::new(),
        /// Days the cloud keeps a record (1 to 365); every instance forgets older ones hourly.
        keep_days: Spanned<u64> = cyphonic_declare::unwritten(7),
    }
}

cyphonic_declare::table! {
    /// People sign in to the console with OpenID Connect (authorization code with PKCE)
    /// against the organisation's provider. Register this cloud there as a confidential
    /// client whose redirect URL is `url`'s `/auth/callback`. A person's role comes from one
    /// claim of their ID token (or userinfo); someone no role names is refused. Restart-only.
    struct RawOidc in "api.oidc" {
        /// The provider's issuer URL (`https://id.example.com/realms/ops`); its discovery
        /// document is read from there.
        issuer: Spanned<String>,
        /// This cloud's client id at the provider.
        client_id: Spanned<String>,
        /// A file holding this cloud's client secret (mode 0640, group cyphonic).
        client_secret_file: Spanned<PathBuf>,
        /// The console's address as people's browsers reach it (`https://cloud.example.com`):
        /// the provider sends them back to its `/auth/callback`, and a change made from a
        /// session must come from its origin. `https`, or `http` on loopback.
        url: Spanned<String>,
        /// The claim whose values name roles.
        roles_claim: String = "groups".to_owned(),
        /// Values of `roles_claim` that make an admin (everything, API tokens too).
        admin: Vec<String> = Vec::new(),
        /// Values that make an operator (enrollment tokens, revoking members).
        operator: Vec<String> = Vec::new(),
        /// Values that make a viewer (sees everything but secrets); `"*"`: anyone the
        /// provider signs in.
        viewer: Vec<String> = Vec::new(),
        /// Scopes asked for besides `openid` (some providers send groups only for a
        /// `groups` scope).
        scopes: Vec<String> = vec!["email".to_owned(), "profile".to_owned()],
        /// Hours a session lasts after sign-in (1 to 168).
        session_hours: Spanned<u64> = cyphonic_declare::unwritten(12),
        /// Minutes a session lasts without a request (5 to 1440).
        idle_minutes: Spanned<u64> = cyphonic_declare::unwritten(480),
    }
}

cyphonic_declare::table! {
    /// The relay (TRS): pairs that cannot reach each other directly (IPv4-only facing
    /// IPv6-only, a symmetric NAT facing another NAT, or handshakes that never came through)
    /// talk through a channel here: one UDP port that relays frames, unchanged and still
    /// end-to-end encrypted, between the two addresses its pair bound to it. The relay holds
    /// no key and serves no one the cloud did not pair.
    struct RawRelay in "relay" (optional) {
        /// Run the relay.
        enabled: bool = true,
        /// Where channels listen, given to clients as the relay's address: at most one IPv4
        /// and one IPv6 address. Give them when clients reach the cloud through a NAT or load
        /// balancer, or when several instances share the store. Empty: every address, and
        /// each client is given the address it reached the control port on.
        addresses: Spanned<Vec<IpAddr>> =
            cyphonic_declare::unwritten(RelayConfig::default().addresses),
        /// UDP ports for channels, `"FIRST-LAST"` from 1024 up, one per relayed pair (open
        /// them in the firewall).
        ports: Spanned<String> = cyphonic_declare::unwritten({
            let ports = RelayConfig::default().ports;
            format!("{}-{}", ports.start(), ports.end())
        }),
        /// Seconds a channel may relay nothing before it closes (30 to 86400; clients keep
        /// theirs busy with keepalives every 25 s).
        idle_timeout: Spanned<u64> =
            cyphonic_declare::unwritten(RelayConfig::default().idle.as_secs()),
        /// Also carry channels over TCP here (`"[::]:443"`, say), for clients on networks
        /// that drop UDP (docs/protocol.md §4, *Relay over a stream*). Unset: UDP only.
        stream_listen: Option<Spanned<SocketAddr>> = None,
        /// The stream in TLS with this certificate chain (PEM, the server's first; clients
        /// pin its digest, which the cloud tells them, so any certificate serves)...
        tls_cert: Option<Spanned<PathBuf>> = None,
        /// ...and its private key (PEM; mode 0640, group cyphonic). Both or neither; without
        /// them the stream is plain TCP. Changes take a restart.
        tls_key: Option<Spanned<PathBuf>> = None,
    }
}

cyphonic_declare::table! {
    /// Who may reach whom: groups, members (a certificate's name, or a group its certificate
    /// carries: `ca issue --group`), devices (the names members register), patterns over
    /// those names (`cam*.gw2.ovl.example`), addresses and blocks; `"*"` is everyone. Rules
    /// are numbered from 1 in the file's order (counters, status, metrics). A reload (SIGHUP)
    /// applies changes within seconds. `cyphonic-cloud policy` answers from the registry
    /// whether a flow may start, and by which rule.
    struct RawPolicy in "policy" (optional) {
        /// `"allow"`: anyone may resolve and reach anyone; nothing is enforced per device.
        /// `"deny"`: the cloud pairs two members only where a rule lets one open a flow to the
        /// other, and sends every adapter and node the rules that concern it, which they
        /// enforce where packets leave and where they arrive. Unset: `"allow"`.
        default: Option<Spanned<String>> = None,
        /// The groups rules may name.
        group: Vec<RawGroup> = Vec::new(),
        /// The rules.
        rule: Vec<RawRule> = Vec::new(),
    }
}

cyphonic_declare::table! {
    /// A group rules may name. Repeat the table for each group.
    struct RawGroup in "policy.group" {
        /// Its name: a word, not `"*"` or an address.
        name: Spanned<String>,
        /// Members, devices, groups, patterns or addresses.
        members: Spanned<OneOrMore>,
    }
}

cyphonic_declare::table! {
    /// A rule: `from` may open flows of `allow` to `to`; replies flow back, nothing else
    /// passes. Repeat the table for each rule.
    struct RawRule in "policy.rule" {
        /// Where the flows start: names as in `policy.group.members`.
        from: Spanned<OneOrMore>,
        /// Where they go: names as in `policy.group.members`.
        to: Spanned<OneOrMore>,
        /// What they may be: `tcp/PORT`, `tcp/FIRST-LAST`, `tcp`, the same for `udp`,
        /// `icmp`, `any`. Unset: `any`.
        allow: Option<Spanned<Vec<String>>> = None,
    }
}

/// What of a configuration takes effect only at a restart (a reload applies the trust and
/// the policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    listen: [SocketAddr; 3],
    key: cyphonic_crypto::PublicKey,
    database: String,
    relay: Option<RelayConfig>,
    metrics: Option<SocketAddr>,
    api: Option<SocketAddr>,
    audit_days: u64,
    flows: FlowLogs,
    api_tls: Option<[PathBuf; 2]>,
    api_proxies: Vec<ipnet::IpNet>,
    api_oidc: Option<crate::signin::OidcConfig>,
    status_socket: PathBuf,
    admin_socket: PathBuf,
    enroll: Option<(cyphonic_crypto::Fingerprint, Vec<ipnet::IpNet>, u64)>,
}

impl Restart {
    /// The restart-only part of `c`.
    pub fn of(c: &CloudConfig) -> Self {
        Self {
            listen: [c.listen, c.probe_listen, c.probe_listen_alt],
            key: c.key.public(),
            database: c.database.clone(),
            relay: c.relay.clone(),
            metrics: c.metrics,
            api: c.api,
            audit_days: c.audit_days,
            flows: c.flows.clone(),
            api_tls: c.api_tls.as_ref().map(|t| t.files.clone()),
            api_proxies: c.api_proxies.clone(),
            api_oidc: c.api_oidc.clone(),
            status_socket: c.status_socket.clone(),
            admin_socket: c.admin_socket.clone(),
            enroll: c
                .enroll
                .as_ref()
                .map(|e| (e.certificate().fingerprint(), e.pool.clone(), e.lifetime)),
        }
    }

    /// The API's certificate and key files (their contents are read again at a reload).
    pub const fn api_tls(&self) -> Option<&[PathBuf; 2]> {
        self.api_tls.as_ref()
    }

    /// The keys that differ in `new`.
    pub fn changed(&self, new: &Self) -> Vec<&'static str> {
        [
            (
                "listen, probe_listen, probe_listen_alt",
                self.listen != new.listen,
            ),
            (Raw::key, self.key != new.key),
            (Raw::database, self.database != new.database),
            ("[relay]", self.relay != new.relay),
            ("[metrics]", self.metrics != new.metrics),
            (
                "[api]",
                self.api != new.api || self.audit_days != new.audit_days,
            ),
            ("[api] tls_cert, tls_key", self.api_tls != new.api_tls),
            ("[flows]", self.flows != new.flows),
            (RawApi::trusted_proxies, self.api_proxies != new.api_proxies),
            ("[api.oidc]", self.api_oidc != new.api_oidc),
            (Raw::status_socket, self.status_socket != new.status_socket),
            (Raw::admin_socket, self.admin_socket != new.admin_socket),
            ("[enroll]", self.enroll != new.enroll),
        ]
        .into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
    }
}

/// The file of a SQLite store URL (`sqlite:///var/lib/cyphonic/cloud.db?mode=rwc`), none for
/// another store or one in memory.
pub fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && !path.starts_with(':')).then(|| PathBuf::from(path))
}

/// Reads and checks the configuration at `path`, with the files it names (a SQLite
/// registry's place writable by this user). Errors name the file, and where possible the
/// line and key.
///
/// # Errors
/// Unreadable or invalid configuration, key or CA files; a SQLite registry this user cannot
/// write.
pub fn load(path: &Path, now_secs: u64) -> anyhow::Result<CloudConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read the configuration: {e}", path.display()))?;
    let raw: Raw = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|s| s.start);
        anyhow::anyhow!(
            "{}{}{}: {}",
            path.display(),
            at.map(|o| format!(":{}", line_of(&text, o)))
                .unwrap_or_default(),
            at.and_then(|o| cyphonic_declare::key_at(&text, o))
                .map(|k| format!(": key `{k}`"))
                .unwrap_or_default(),
            cyphonic_declare::with_value(
                e.message().trim(),
                at.and_then(|o| cyphonic_declare::value_at(&text, o))
            )
        )
    })?;
    let err =
        |span: std::ops::Range<usize>, key: &str, msg: String| at_key(path, &text, span, key, &msg);
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
    let key = StaticKeypair::from_pem(&read(&raw.key, Raw::key)?)
        .map_err(|e| err(raw.key.span(), Raw::key, e.to_string()))?;
    let cas = Certificate::all_from_pem(&read(&raw.ca, Raw::ca)?)
        .map_err(|e| err(raw.ca.span(), Raw::ca, e.to_string()))?;
    if cas.is_empty() {
        return Err(err(
            raw.ca.span(),
            Raw::ca,
            format!(
                "no certificate in {}: give the CA's certificate (ca.crt), not its key",
                dir.join(raw.ca.get_ref()).display()
            ),
        ));
    }
    let revoked = match &raw.revocations {
        Some(r) => RevocationList::parse(&read(r, Raw::revocations)?)
            .map_err(|e| err(r.span(), Raw::revocations, e.to_string()))?,
        None => RevocationList::default(),
    };
    let mut trust =
        TrustStore::new(cas, revoked).map_err(|e| err(raw.ca.span(), Raw::ca, e.to_string()))?;
    let enroll = match &raw.enroll {
        Some(e) => Some(enroll(e, &mut trust, now_secs, &read, &err)?),
        None => None,
    };
    for ca in trust.cas() {
        let b = ca.body();
        if b.not_after <= now_secs {
            return Err(err(
                raw.ca.span(),
                Raw::ca,
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
                    RawPolicy::default,
                    format!("expected \"allow\" or \"deny\", found {other:?}"),
                ));
            }
        },
    };
    let database = if let Some(rest) = raw.database.get_ref().strip_prefix("sqlite://")
        && !rest.starts_with('/')
        && !rest.starts_with(':')
    {
        // A relative SQLite path is relative to the configuration file, like the others.
        format!("sqlite://{}", dir.join(rest).display())
    } else {
        raw.database.get_ref().clone()
    };
    // The cloud writes its SQLite file (and the journal beside it): this user must be able
    // to, or the first start fails after every other check passed.
    if let Some(file) = sqlite_file(&database) {
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let writable = if !dir.is_dir() {
            // SQLite makes the file, not the directory it is in.
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("its directory {} does not exist", dir.display()),
            ))
        } else if file.exists() {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .map(drop)
        } else {
            Ok(())
        }
        .and_then(|()| cyphonic_telemetry::files::can_write(&file));
        if let Err(e) = writable {
            return Err(err(
                raw.database.span(),
                Raw::database,
                format!(
                    "the registry {} cannot be written by this user: {e}",
                    file.display()
                ),
            ));
        }
    }
    let relay = if raw.relay.enabled {
        Some(relay(&raw.relay, dir, &err)?)
    } else {
        None
    };
    let probe_listen_alt = raw.probe_listen_alt.unwrap_or_else(|| {
        SocketAddr::new(
            raw.probe_listen.ip(),
            raw.probe_listen.port().wrapping_add(1),
        )
    });
    let with_port = |l: &Option<Spanned<SocketAddr>>, key: &str, hint: &str| match l {
        Some(l) if l.get_ref().port() == 0 => Err(err(l.span(), key, hint.into())),
        Some(l) => Ok(Some(*l.get_ref())),
        None => Ok(None),
    };
    let metrics = with_port(
        &raw.metrics.listen,
        RawMetrics::listen,
        "give the port Prometheus scrapes (9466, say)",
    )?;
    let api = with_port(
        &raw.api.listen,
        RawApi::listen,
        "give the port the API listens on (9467, say)",
    )?;
    let audit_days = *raw.api.audit_days.get_ref();
    if !(1..=3650).contains(&audit_days) {
        return Err(err(
            raw.api.audit_days.span(),
            RawApi::audit_days,
            format!("{audit_days}: give 1 to 3650 days"),
        ));
    }
    let api_tls = tls_pair(
        [&raw.api.tls_cert, &raw.api.tls_key],
        [RawApi::tls_cert, RawApi::tls_key, "[api] tls_cert, tls_key"],
        crate::tls::API_ALPN,
        dir,
        &err,
    )?;
    let api_proxies = raw
        .api
        .trusted_proxies
        .get_ref()
        .iter()
        .map(|p| {
            p.parse::<ipnet::IpNet>()
                .or_else(|_| p.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map(|n| n.trunc())
                .map_err(|_| {
                    err(
                        raw.api.trusted_proxies.span(),
                        RawApi::trusted_proxies,
                        format!("{p:?}: give an address or a block (192.0.2.10, 192.0.2.0/28)"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let keep_days = *raw.flows.keep_days.get_ref();
    if !(1..=365).contains(&keep_days) {
        return Err(err(
            raw.flows.keep_days.span(),
            RawFlows::keep_days,
            format!("{keep_days}: give 1 to 365 days"),
        ));
    }
    let flows = FlowLogs {
        members: raw.flows.members.clone(),
        groups: raw.flows.groups.clone(),
        keep_days,
    };
    let api_oidc = match &raw.api.oidc {
        Some(o) => Some(oidc(o, dir, &err)?),
        None => None,
    };
    let status_socket = dir.join(&raw.status_socket);
    let (admin_socket, span, named) = raw.admin_socket.as_ref().map_or_else(
        || {
            let mut name = status_socket.file_stem().unwrap_or_default().to_owned();
            name.push("-admin");
            let mut beside = status_socket.with_file_name(name);
            if let Some(ext) = status_socket.extension() {
                beside.set_extension(ext);
            }
            (beside, 0..0, Raw::status_socket)
        },
        |p| (dir.join(p.get_ref()), p.span(), Raw::admin_socket),
    );
    if admin_socket == status_socket {
        return Err(err(
            span,
            named,
            format!(
                "{} is the status socket too: give each its own path",
                admin_socket.display()
            ),
        ));
    }
    Ok(CloudConfig {
        listen: raw.listen,
        probe_listen: raw.probe_listen,
        probe_listen_alt,
        relay,
        status_socket,
        admin_socket,
        metrics,
        api,
        audit_days,
        flows,
        api_tls,
        api_proxies,
        api_oidc,
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
                &cyphonic_declare::indexed(RawGroup::name, i),
                "a group's name is a word, not empty, \"*\" or an address".into(),
            ));
        }
        let members = g.members.get_ref().list();
        if members.is_empty() || members.iter().any(String::is_empty) {
            return Err(err(
                g.members.span(),
                &cyphonic_declare::indexed(RawGroup::members, i),
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
        let side = |s: &Spanned<OneOrMore>, key: &str| {
            let names = s.get_ref().list();
            if names.is_empty() || names.iter().any(String::is_empty) {
                return Err(err(
                    s.span(),
                    &cyphonic_declare::indexed(key, i),
                    "name at least one group, member, device or address (none empty)".into(),
                ));
            }
            Ok(names)
        };
        let (from, to) = (side(&r.from, RawRule::from)?, side(&r.to, RawRule::to)?);
        let allow = match &r.allow {
            None => vec!["any".to_owned()],
            Some(a) => {
                if a.get_ref().is_empty() {
                    return Err(err(
                        a.span(),
                        &cyphonic_declare::indexed(RawRule::allow, i),
                        "allows nothing: give tcp/PORT, udp/PORT, icmp or any".into(),
                    ));
                }
                for item in a.get_ref() {
                    cyphonic_filter::parse_allow(item).map_err(|m| {
                        err(a.span(), &cyphonic_declare::indexed(RawRule::allow, i), m)
                    })?;
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
    let cert_text = read(&raw.certificate, RawEnroll::certificate)?;
    let key_text = read(&raw.key, RawEnroll::key)?;
    let ca = cyphonic_crypto::CertificateAuthority::from_pem(&key_text, &cert_text)
        .map_err(|e| err(raw.key.span(), RawEnroll::key, e.to_string()))?;
    let cert = ca.certificate().clone();
    if !cert.is_root() {
        trust.add_issuer(cert.clone()).map_err(|e| {
            err(
                raw.certificate.span(),
                RawEnroll::certificate,
                format!("not an issuing CA under `ca`: {e}"),
            )
        })?;
    } else if !trust.cas().contains(&cert) {
        return Err(err(
            raw.certificate.span(),
            RawEnroll::certificate,
            "a root that `ca` does not list".into(),
        ));
    }
    if cert.body().not_after <= now_secs {
        return Err(err(
            raw.certificate.span(),
            RawEnroll::certificate,
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
                        RawEnroll::pool,
                        format!("{text:?} is not a CIDR block"),
                    )
                })?;
                if !cert.body().covers_block(&block) {
                    return Err(err(
                        p.span(),
                        RawEnroll::pool,
                        format!("{block} lies outside the issuing CA's blocks"),
                    ));
                }
                let block = block.trunc();
                // Blocks are handed out whole from the pool: two that overlap would hand
                // one address range out twice.
                if let Some(other) = out
                    .iter()
                    .find(|o: &&ipnet::IpNet| o.contains(&block) || block.contains(*o))
                {
                    return Err(err(
                        p.span(),
                        RawEnroll::pool,
                        format!("{block} overlaps {other}: the pool's blocks must be disjoint"),
                    ));
                }
                out.push(block);
            }
            out
        }
    };
    let lifetime = *raw.lifetime.get_ref();
    if !(crate::enroll::MIN_LIFETIME..=365 * 24 * 3600).contains(&lifetime) {
        return Err(err(
            raw.lifetime.span(),
            RawEnroll::lifetime,
            format!("{lifetime} s: give 30 to 31536000 seconds"),
        ));
    }
    Ok(crate::enroll::Issuer::new(ca, roots, pool, lifetime))
}

fn oidc(
    raw: &RawOidc,
    dir: &Path,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> anyhow::Error,
) -> anyhow::Result<crate::signin::OidcConfig> {
    use crate::signin::Role;
    // https, or http to this host (a provider or console under test).
    let web = |v: &Spanned<String>, key: &str| {
        let u = openidconnect::url::Url::parse(v.get_ref())
            .map_err(|e| err(v.span(), key, format!("{:?}: {e}", v.get_ref())))?;
        let loopback = match u.host() {
            Some(openidconnect::url::Host::Domain(d)) => d == "localhost",
            Some(openidconnect::url::Host::Ipv4(a)) => a.is_loopback(),
            Some(openidconnect::url::Host::Ipv6(a)) => a.is_loopback(),
            None => false,
        };
        if u.scheme() == "https" || (u.scheme() == "http" && loopback) {
            Ok(u)
        } else {
            Err(err(
                v.span(),
                key,
                format!("{}: give an https URL (http only on loopback)", v.get_ref()),
            ))
        }
    };
    web(&raw.issuer, RawOidc::issuer)?;
    let url = web(&raw.url, RawOidc::url)?;
    if raw.client_id.get_ref().trim().is_empty() {
        return Err(err(
            raw.client_id.span(),
            RawOidc::client_id,
            "give the client id the provider knows this cloud by".into(),
        ));
    }
    let path = dir.join(raw.client_secret_file.get_ref());
    let secret = std::fs::read_to_string(&path)
        .map_err(|e| {
            err(
                raw.client_secret_file.span(),
                RawOidc::client_secret_file,
                format!("cannot read {}: {e}", path.display()),
            )
        })?
        .trim()
        .to_owned();
    if secret.is_empty() {
        return Err(err(
            raw.client_secret_file.span(),
            RawOidc::client_secret_file,
            format!("{} is empty", path.display()),
        ));
    }
    let roles: Vec<(Role, Vec<String>)> = [
        (Role::Admin, &raw.admin),
        (Role::Operator, &raw.operator),
        (Role::Viewer, &raw.viewer),
    ]
    .into_iter()
    .filter(|(_, values)| !values.is_empty())
    .map(|(role, values)| (role, values.clone()))
    .collect();
    if roles.is_empty() {
        return Err(err(
            raw.client_id.span(),
            "[api.oidc] admin, operator, viewer",
            "name the claim's values of at least one role: no one could sign in".into(),
        ));
    }
    let within = |v: &Spanned<u64>, key: &str, range: RangeInclusive<u64>, unit: &str| {
        if range.contains(v.get_ref()) {
            Ok(*v.get_ref())
        } else {
            Err(err(
                v.span(),
                key,
                format!(
                    "{}: give {} to {} {unit}",
                    v.get_ref(),
                    range.start(),
                    range.end()
                ),
            ))
        }
    };
    let hours = within(&raw.session_hours, RawOidc::session_hours, 1..=168, "hours")?;
    let minutes = within(
        &raw.idle_minutes,
        RawOidc::idle_minutes,
        5..=1440,
        "minutes",
    )?;
    Ok(crate::signin::OidcConfig {
        issuer: raw.issuer.get_ref().clone(),
        client_id: raw.client_id.get_ref().clone(),
        client_secret: secret,
        url,
        claim: raw.roles_claim.clone(),
        roles,
        scopes: raw.scopes.clone(),
        session: Duration::from_secs(hours * 3600),
        idle: Duration::from_secs(minutes * 60),
    })
}

/// A listener's TLS from its certificate chain's and key's files (`keys`: their keys' dotted
/// names, then both together), read relative to `dir`: both or neither.
fn tls_pair(
    files: [&Option<Spanned<PathBuf>>; 2],
    keys: [&str; 3],
    alpn: &[&[u8]],
    dir: &Path,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> anyhow::Error,
) -> anyhow::Result<Option<crate::tls::Tls>> {
    match files {
        [None, None] => Ok(None),
        [Some(cert), Some(key)] => {
            let read = |p: &Spanned<PathBuf>, k: &str| {
                let path = dir.join(p.get_ref());
                std::fs::read(&path)
                    .map(|bytes| (path.clone(), bytes))
                    .map_err(|e| err(p.span(), k, format!("{}: {e}", path.display())))
            };
            let (cert_path, chain) = read(cert, keys[0])?;
            let (key_path, key) = read(key, keys[1])?;
            let config = crate::tls::tls_config(&chain, &key, alpn)
                .map_err(|e| err(cert.span(), keys[0], e))?;
            let digest =
                crate::tls::leaf_digest(&chain).map_err(|e| err(cert.span(), keys[0], e))?;
            Ok(Some(crate::tls::Tls {
                files: [cert_path, key_path],
                config,
                digest,
            }))
        }
        [Some(one), None] | [None, Some(one)] => Err(err(
            one.span(),
            keys[2],
            "give both tls_cert and tls_key, or neither".into(),
        )),
    }
}

fn relay(
    raw: &RawRelay,
    dir: &Path,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> anyhow::Error,
) -> anyhow::Result<RelayConfig> {
    let addresses = raw.addresses.get_ref();
    for (i, a) in addresses.iter().enumerate() {
        if a.is_unspecified() || a.is_multicast() {
            return Err(err(
                raw.addresses.span(),
                RawRelay::addresses,
                format!("{a} cannot be given to clients as the relay's address"),
            ));
        }
        if addresses[..i].iter().any(|b| b.is_ipv4() == a.is_ipv4()) {
            return Err(err(
                raw.addresses.span(),
                RawRelay::addresses,
                "at most one IPv4 and one IPv6 address".into(),
            ));
        }
    }
    let p = &raw.ports;
    let parsed = p.get_ref().split_once('-').and_then(|(a, b)| {
        let (a, b) = (a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?);
        (a >= 1024 && a <= b).then_some(a..=b)
    });
    let ports = parsed.ok_or_else(|| {
        err(
            p.span(),
            RawRelay::ports,
            format!(
                "expected a range \"FIRST-LAST\" of ports from 1024 up, found {:?}",
                p.get_ref()
            ),
        )
    })?;
    let t = &raw.idle_timeout;
    if !(30..=86_400).contains(t.get_ref()) {
        return Err(err(
            t.span(),
            RawRelay::idle_timeout,
            format!("expected 30 to 86400 seconds, found {}", t.get_ref()),
        ));
    }
    let tls = tls_pair(
        [&raw.tls_cert, &raw.tls_key],
        [
            RawRelay::tls_cert,
            RawRelay::tls_key,
            "[relay] tls_cert, tls_key",
        ],
        crate::tls::RELAY_ALPN,
        dir,
        err,
    )?;
    let stream = match &raw.stream_listen {
        Some(l) if l.get_ref().port() == 0 => {
            return Err(err(
                l.span(),
                RawRelay::stream_listen,
                "give the port clients connect to (443, say)".into(),
            ));
        }
        Some(l) => Some(StreamListen {
            listen: *l.get_ref(),
            tls,
        }),
        None if tls.is_some() => {
            return Err(err(
                raw.tls_cert.as_ref().map_or(0..0, Spanned::span),
                RawRelay::tls_cert,
                "a certificate for the relay's stream, but no stream_listen".into(),
            ));
        }
        None => None,
    };
    Ok(RelayConfig {
        addresses: addresses.clone(),
        ports,
        idle: Duration::from_secs(*t.get_ref()),
        stream,
    })
}

/// How long `check-config` waits for a shared store (PostgreSQL) to answer.
pub const STORE_WAIT: Duration = Duration::from_secs(5);

/// Proves, as `check-config` does, that the store `config` names answers this user: a
/// PostgreSQL server is connected to with the configured credentials and asked `SELECT 1`
/// within [`STORE_WAIT`] (nothing is written or migrated). A SQLite file is [`load`]'s to
/// check (the first start creates it).
///
/// # Errors
/// The server refuses or does not answer: said at the `database` key of the file at `path`.
pub async fn check_store(path: &Path, config: &CloudConfig) -> anyhow::Result<()> {
    if config.database.starts_with("sqlite:") {
        return Ok(());
    }
    let Err(e) = crate::store::Store::reachable(&config.database, STORE_WAIT).await else {
        return Ok(());
    };
    // The key's place, read again: `load` keeps no spans in what it returns.
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let span = toml::from_str::<Raw>(&text).map_or(0..0, |raw| raw.database.span());
    Err(at_key(
        path,
        &text,
        span,
        Raw::database,
        &format_args!(
            "the registry {} does not answer this user: {e}",
            crate::store::redact(&config.database)
        ),
    ))
}

/// `msg` about `key` of the file at `path` (its `text`), at the line `span` starts on; a key
/// left out (its default: an empty span) has no line.
fn at_key(
    path: &Path,
    text: &str,
    span: std::ops::Range<usize>,
    key: &str,
    msg: &dyn std::fmt::Display,
) -> anyhow::Error {
    let line = if span.end == 0 {
        String::new()
    } else {
        format!(":{}", line_of(text, span.start))
    };
    anyhow::anyhow!("{}{line}: key `{key}`: {msg}", path.display())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use cyphonic_crypto::CertificateAuthority;

    /// docs/configuration/cloud.md is the reference the declarations make.
    #[test]
    fn the_configuration_reference_is_current() {
        let reference = cyphonic_declare::Reference::of::<Raw>().markdown(
            "cyphonic-cloud's configuration",
            "Every key of `/etc/cyphonic/cloud.toml`, by table. `cyphonic-cloud check-config \
             FILE` checks a file as `serve` would; config/cloud.example.toml shows every key. \
             Relative paths are relative to the file's directory.",
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration/cloud.md");
        assert_eq!(cyphonic_declare::ensure_file(&path, &reference), Ok(()));
    }

    /// config/cloud.toml, the packages' /etc/cyphonic/cloud.toml, takes only keys the file
    /// has; it has nothing to fill in (its files are made by the steps it names).
    #[test]
    fn the_starter_reads() {
        let starter = include_str!("../../../config/cloud.toml");
        toml::from_str::<Raw>(starter).unwrap();
        assert!(!starter.contains("fill in"));
    }

    /// config/cloud.example.toml shows every key the code declares, set or as a comment (a
    /// new key without documentation there fails here).
    #[test]
    fn the_example_shows_every_key() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/cloud.example.toml");
        let text = std::fs::read_to_string(example).unwrap();
        let unshown = cyphonic_declare::Reference::of::<Raw>().unshown_in(&text);
        assert!(
            unshown.is_empty(),
            "config/cloud.example.toml does not show {unshown:?}"
        );
    }

    /// A directory with the overlay CA (`ca.crt`, and its key `ca.key`) and the cloud's key
    /// (`cloud.key`), as a configuration names them.
    fn keys() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate(
            "ovl.example",
            &["100.64.0.0/10".parse().unwrap()],
            0,
            4_000_000_000,
        )
        .unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.certificate().to_pem()).unwrap();
        std::fs::write(dir.path().join("ca.key"), ca.key_pem().as_str()).unwrap();
        std::fs::write(
            dir.path().join("cloud.key"),
            StaticKeypair::generate().unwrap().to_pem(),
        )
        .unwrap();
        dir
    }

    /// The admin socket sits beside the status socket, named after it, unless given; one
    /// path for both is refused at the key that set it.
    #[test]
    fn the_admin_socket_is_named_after_the_status_socket() {
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        let load_with = |extra: &str| {
            let text = format!(
                "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\n{extra}"
            );
            std::fs::write(&path, text).unwrap();
            load(&path, 1_800_000_000)
        };
        let c = load_with("").unwrap();
        assert_eq!(c.admin_socket, Path::new("/run/cyphonic/cloud-admin.sock"));
        let c = load_with("status_socket = \"run/gw1.sock\"\n").unwrap();
        assert_eq!(c.admin_socket, dir.path().join("run/gw1-admin.sock"));
        let c = load_with("admin_socket = \"/run/x.sock\"\n").unwrap();
        assert_eq!(c.admin_socket, Path::new("/run/x.sock"));
        let e = load_with("status_socket = \"a.sock\"\nadmin_socket = \"a.sock\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":5:") && e.contains("admin_socket") && e.contains("status socket too"),
            "{e}"
        );
    }

    /// A shared store that does not answer is refused at its key (nothing listens on
    /// loopback port 1); a SQLite file is not asked (the first start creates it).
    #[test]
    fn a_shared_store_that_does_not_answer_is_refused_at_its_key() {
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let check = |database: &str| {
            let text =
                format!("key = \"cloud.key\"\nca = \"ca.crt\"\n\ndatabase = \"{database}\"\n");
            std::fs::write(&path, text).unwrap();
            let c = load(&path, 1_800_000_000).unwrap();
            rt.block_on(check_store(&path, &c))
        };
        let e = check("postgres://cyphonic:secret@127.0.0.1:1/cyphonic")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cloud.toml:4: key `database`: the registry")
                && e.contains("does not answer"),
            "{e}"
        );
        assert!(!e.contains("secret"), "the password is not said: {e}");
        assert!(check("sqlite://cloud.db").is_ok());
    }

    /// `[api] tls_cert` and `tls_key`: both read into a TLS server, or the file is refused
    /// at the key: one without the other, a file missing, a key of another certificate.
    #[test]
    fn the_apis_tls_needs_a_chain_and_its_key() {
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        let made = |name: &str| {
            let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
            (ck.cert.pem(), ck.signing_key.serialize_pem())
        };
        let (chain, key) = made("cloud.example");
        let (_, other_key) = made("other.example");
        std::fs::write(dir.path().join("api.crt"), chain).unwrap();
        std::fs::write(dir.path().join("api.key"), key).unwrap();
        std::fs::write(dir.path().join("other.key"), other_key).unwrap();
        let with = |tls: &str| {
            let text = format!(
                "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\n\n[api]\nlisten = \"127.0.0.1:9467\"\n{tls}"
            );
            std::fs::write(&path, text).unwrap();
            load(&path, 1_800_000_000).map_err(|e| format!("{e:#}"))
        };
        let c = with("tls_cert = \"api.crt\"\ntls_key = \"api.key\"\n").unwrap();
        let tls = c.api_tls.unwrap();
        assert_eq!(tls.files[0], dir.path().join("api.crt"));
        assert_eq!(
            tls.config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert!(with("").unwrap().api_tls.is_none());
        for (tls, says) in [
            ("tls_cert = \"api.crt\"\n", "give both tls_cert and tls_key"),
            ("tls_key = \"api.key\"\n", "give both tls_cert and tls_key"),
            (
                "tls_cert = \"none.crt\"\ntls_key = \"api.key\"\n",
                "none.crt",
            ),
            (
                "tls_cert = \"api.crt\"\ntls_key = \"other.key\"\n",
                "do not make a TLS server",
            ),
            (
                "tls_cert = \"api.key\"\ntls_key = \"api.key\"\n",
                "no certificate",
            ),
        ] {
            let e = with(tls).unwrap_err();
            assert!(e.contains(says) && e.contains("cloud.toml:"), "{tls}: {e}");
        }
    }

    /// `[api.oidc]`: the secret read from its file and trimmed, roles highest first, the
    /// callback under `url`; refused at the key: a URL neither https nor http on loopback,
    /// no secret, no role at all, times out of range.
    #[test]
    fn sign_in_needs_a_provider_a_secret_and_a_role() {
        use crate::signin::Role;
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        std::fs::write(dir.path().join("oidc-secret"), "s3cret\n").unwrap();
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        let base = "issuer = \"https://id.example.com/realms/ops\"\nclient_id = \"cyphonic\"\n";
        let with = |rest: &str| {
            let text = format!(
                "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\n\n[api.oidc]\n{rest}"
            );
            std::fs::write(&path, text).unwrap();
            load(&path, 1_800_000_000).map_err(|e| format!("{e:#}"))
        };
        let good = format!(
            "{base}client_secret_file = \"oidc-secret\"\nurl = \"https://cloud.example.com:9467/x\"\n\
             viewer = [\"*\"]\noperator = [\"net-ops\"]\n"
        );
        let c = with(&good).unwrap().api_oidc.unwrap();
        assert_eq!(c.client_secret, "s3cret");
        assert_eq!(
            c.roles,
            [
                (Role::Operator, vec!["net-ops".to_owned()]),
                (Role::Viewer, vec!["*".to_owned()])
            ]
        );
        assert_eq!(
            c.redirect().as_str(),
            "https://cloud.example.com:9467/auth/callback"
        );
        assert_eq!(c.claim, "groups");
        assert_eq!(c.session, Duration::from_secs(12 * 3600));
        assert_eq!(c.idle, Duration::from_secs(480 * 60));
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the secret is not logged"
        );
        let loopback = good.replace("https://cloud.example.com:9467/x", "http://127.0.0.1:9467");
        assert!(with(&loopback).is_ok());
        for (text, says) in [
            (
                good.replace("https://id.example.com", "http://id.example.com"),
                "issuer",
            ),
            (
                good.replace(
                    "https://cloud.example.com:9467/x",
                    "http://cloud.example.com",
                ),
                "url",
            ),
            (good.replace("\"oidc-secret\"", "\"none\""), "cannot read"),
            (good.replace("\"oidc-secret\"", "\"empty\""), "is empty"),
            (
                good.replace("viewer = [\"*\"]\noperator = [\"net-ops\"]\n", ""),
                "at least one role",
            ),
            (format!("{good}session_hours = 0\n"), "session_hours"),
            (format!("{good}idle_minutes = 2000\n"), "idle_minutes"),
            (
                good.replace("client_id = \"cyphonic\"", "client_id = \" \""),
                "client_id",
            ),
        ] {
            let e = with(&text).unwrap_err();
            assert!(e.contains(says) && e.contains("cloud.toml"), "{text}: {e}");
        }
    }

    /// A reload names the keys that take a restart: the API's address, its TLS files'
    /// names (their contents are read again), its proxies; not the policy.
    #[test]
    fn a_reload_names_what_takes_a_restart() {
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        let ck = rcgen::generate_simple_self_signed(vec!["cloud.example".to_owned()]).unwrap();
        for name in ["a", "b"] {
            std::fs::write(dir.path().join(format!("{name}.crt")), ck.cert.pem()).unwrap();
            std::fs::write(
                dir.path().join(format!("{name}.key")),
                ck.signing_key.serialize_pem(),
            )
            .unwrap();
        }
        let with = |api: &str| {
            std::fs::write(
                &path,
                format!(
                    "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\n\n[api]\n{api}"
                ),
            )
            .unwrap();
            Restart::of(&load(&path, 1_800_000_000).unwrap())
        };
        let base = "listen = \"127.0.0.1:9467\"\ntls_cert = \"a.crt\"\ntls_key = \"a.key\"\n";
        let started = with(base);
        assert!(started.changed(&with(base)).is_empty());
        assert_eq!(
            started.changed(&with(
                &base.replace("a.crt", "b.crt").replace("a.key", "b.key")
            )),
            ["[api] tls_cert, tls_key"]
        );
        assert_eq!(
            started.changed(&with(&format!("{base}trusted_proxies = [\"192.0.2.1\"]\n"))),
            [RawApi::trusted_proxies]
        );
        assert_eq!(
            started.changed(&with(&base.replace("9467", "9468"))),
            ["[api]"]
        );
        assert_eq!(started.api_tls().unwrap()[0], dir.path().join("a.crt"));
    }

    /// `[api] trusted_proxies`: addresses and blocks, each read as a block; anything else
    /// is refused at the key.
    #[test]
    fn trusted_proxies_are_addresses_or_blocks() {
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        let with = |list: &str| {
            let text = format!(
                "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\n\n[api]\ntrusted_proxies = [{list}]\n"
            );
            std::fs::write(&path, text).unwrap();
            load(&path, 1_800_000_000).map_err(|e| format!("{e:#}"))
        };
        let c = with("\"192.0.2.10\", \"198.51.100.7/24\", \"fd00::1\"").unwrap();
        let shown: Vec<String> = c.api_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["192.0.2.10/32", "198.51.100.0/24", "fd00::1/128"]);
        assert!(with("").unwrap().api_proxies.is_empty());
        let e = with("\"proxy.example\"").unwrap_err();
        assert!(
            e.contains("cloud.toml:6") && e.contains("\"proxy.example\""),
            "{e}"
        );
    }

    /// `[enroll] pool`: blocks of the issuing CA, disjoint.
    #[test]
    fn an_enroll_pool_of_overlapping_blocks_is_refused() {
        let dir = keys();
        let path = dir.path().join("cloud.toml");
        let with_pool = |pool: &str| {
            let text = format!(
                "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://cloud.db\"\n\n\
                 [enroll]\ncertificate = \"ca.crt\"\nkey = \"ca.key\"\npool = {pool}\n"
            );
            std::fs::write(&path, text).unwrap();
            load(&path, 1_800_000_000)
        };
        let c = with_pool(r#"["100.64.128.0/18", "100.64.192.0/18"]"#).unwrap();
        assert_eq!(c.enroll.unwrap().pool.len(), 2);
        let e = with_pool(r#"["100.64.128.0/17", "100.64.192.0/18"]"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `enroll.pool`")
                && e.contains("100.64.192.0/18 overlaps 100.64.128.0/17"),
            "{e}"
        );
        let e = with_pool(r#"["100.64.200.0/24", "100.64.128.0/17"]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlaps"), "{e}");
    }

    /// config/cloud.example.toml loads once the files it names exist, and mistakes point at
    /// their line and key.
    #[test]
    fn the_example_loads_and_mistakes_are_located() {
        let dir = keys();
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/cloud.example.toml");
        let text = std::fs::read_to_string(example).unwrap();
        let path = dir.path().join("cloud.toml");
        // The shipped registry's place is the unit's state directory; here, the test's.
        let text = text.replace("sqlite:///var/lib/cyphonic/cloud.db", "sqlite://cloud.db");
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
        // A registry this user cannot write is refused at its key, not at the first start.
        let unwritable = text.replace("sqlite://cloud.db", "sqlite:///proc/self/cloud.db");
        std::fs::write(&path, &unwritable).unwrap();
        let line = unwritable
            .lines()
            .position(|l| l.starts_with("database = "))
            .unwrap()
            + 1;
        let e = load(&path, 1_800_000_000).unwrap_err().to_string();
        assert!(
            e.contains(&format!("cloud.toml:{line}: key `database`"))
                && e.contains("cannot be written"),
            "{e}"
        );
        assert_eq!(
            sqlite_file("sqlite:///var/lib/cyphonic/cloud.db?mode=rwc"),
            Some(PathBuf::from("/var/lib/cyphonic/cloud.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://u:p@db/cyphonic"), None);
        std::fs::write(&path, text.replace("ca.crt", "nope.crt")).unwrap();
        let e = load(&path, 1_800_000_000).unwrap_err().to_string();
        assert!(e.contains("key `ca`") && e.contains("nope.crt"), "{e}");
        std::fs::write(&path, format!("{text}\nlisten_typo = 1\n")).unwrap();
        let e = load(&path, 1_800_000_000).unwrap_err().to_string();
        assert!(e.contains("listen_typo"), "{e}");
        assert_eq!(c.probe_listen_alt, "0.0.0.0:7002".parse().unwrap());
        assert_eq!(c.relay, Some(RelayConfig::default()));
        for (bad, key) in [
            ("ports = \"50999-50000\"", RawRelay::ports),
            ("ports = \"80-90\"", RawRelay::ports),
            ("idle_timeout = 5", RawRelay::idle_timeout),
            ("addresses = [\"0.0.0.0\"]", RawRelay::addresses),
            (
                "addresses = [\"192.0.2.10\", \"192.0.2.11\"]",
                RawRelay::addresses,
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
