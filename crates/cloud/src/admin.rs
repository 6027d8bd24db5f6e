//! The operator's writes, one piece of code for the command line and the HTTP API
//! (docs/protocol.md §8): each checks what it is given, changes the store and adds a row to
//! the audit log, whether it was done or refused. Every error has a stable code
//! ([`AdminError::code`]) that the API answers with.

use std::fmt;

use cyphonic_crypto::{Certificate, validate_name};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::enroll::{Issuer, MAX_TOKEN_EXPIRY, MIN_LIFETIME, TOKEN_EXPIRY, Token, allocate};
use crate::store::{ApiTokenRow, AuditEntry, Store, StoreError, TokenRow};

/// Who asks, as the audit log names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// `token:<id> <name>`, `person:<subject> <email>`, `cli:<unix user>`, `member:<name>`
    /// or `cloud`.
    pub actor: String,
    /// An address, or `local`.
    pub source: String,
}

impl Who {
    /// The user running this process on the cloud's host.
    pub fn cli() -> Self {
        Self::local(nix::unistd::getuid().as_raw())
    }

    /// The user `uid` of the cloud's host, by name where it has one.
    pub fn local(uid: u32) -> Self {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name);
        Self {
            actor: format!("cli:{user}"),
            source: "local".to_owned(),
        }
    }

    /// The cloud itself (a reload).
    pub fn cloud() -> Self {
        Self {
            actor: "cloud".to_owned(),
            source: "local".to_owned(),
        }
    }
}

/// What an API token or a person may do; each includes the ones before it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// See everything but secrets.
    Read,
    /// Also make and revoke enrollment tokens, revoke members.
    Write,
    /// Also make and revoke API tokens.
    Admin,
}

impl Scope {
    /// The scope a person's role grants.
    pub const fn of_role(role: crate::signin::Role) -> Self {
        match role {
            crate::signin::Role::Viewer => Self::Read,
            crate::signin::Role::Operator => Self::Write,
            crate::signin::Role::Admin => Self::Admin,
        }
    }

    /// Its word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }

    /// The scope a word names.
    pub fn parse(word: &str) -> Option<Self> {
        [Self::Read, Self::Write, Self::Admin]
            .into_iter()
            .find(|s| s.as_str() == word)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a write was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// An input is wrong.
    #[error("{message}")]
    Invalid {
        /// Which input.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// What it names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// It conflicts with the registry's state (a live token for the name, a used token...).
    #[error("{0}")]
    Conflict(String),
    /// The caller may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The store failed.
    #[error("the registry is unavailable: {0}")]
    Store(#[from] StoreError),
}

impl AdminError {
    /// The stable code of the error, as the API and the audit log give it.
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid",
            Self::NotFound(_) => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Forbidden(_) => "forbidden",
            Self::Store(_) => "unavailable",
        }
    }

    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// Adds the audit row of `action` on `target` by `who` with `outcome`'s result, and returns
/// the outcome. A change that was made but cannot be recorded is reported as the store's
/// failure (the change stays: the row is written after it, not with it).
///
/// # Errors
/// `outcome`'s, or the store's.
pub async fn record<T>(
    store: &Store,
    who: &Who,
    action: &str,
    target: &str,
    details: serde_json::Value,
    outcome: Result<T, AdminError>,
) -> Result<T, AdminError> {
    let entry = AuditEntry {
        id: random_id().unwrap_or_default(),
        at: audit_time(),
        actor: who.actor.clone(),
        source: who.source.clone(),
        action: action.to_owned(),
        target: target.to_owned(),
        result: match &outcome {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code().to_owned(),
        },
        details,
    };
    let written = store.audit(&entry).await;
    match (outcome, written) {
        (Ok(_), Err(e)) => {
            tracing::error!(action, target, error = %e, "done, but the audit log could not be written");
            Err(AdminError::Store(e))
        }
        (Err(refused), Err(e)) => {
            tracing::error!(action, target, error = %e, "the audit log could not be written");
            Err(refused)
        }
        (outcome, Ok(())) => outcome,
    }
}

/// The audit log's time of a row written now, unix milliseconds: never the same twice in
/// this process, so that rows read back in the order they were written (a burst of writes
/// runs the clock a little ahead).
fn audit_time() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::unix_now_ms();
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let at = now.max(last + 1);
        match LAST.compare_exchange_weak(last, at, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return at,
            Err(seen) => last = seen,
        }
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], AdminError> {
    use ring::rand::SecureRandom as _;
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| AdminError::invalid("random", "the random number generator failed"))?;
    Ok(out)
}

fn random_id() -> Result<String, AdminError> {
    random_bytes::<8>().map(hex::encode)
}

/// What a new enrollment token is bound to (`token create`, `POST /enrollment-tokens`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The member's FQDN, below the overlay domain.
    pub name: String,
    /// Its vIP blocks, given...
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub vip_blocks: Vec<IpNet>,
    /// ...or allocated from `[enroll] pool` with this prefix length (24 for an adapter's
    /// LAN, 32 for a node).
    #[serde(default)]
    pub prefix: Option<u8>,
    /// With `prefix`, when the pool has an IPv6 block: the IPv6 block's prefix length
    /// (default 128 with prefix 32, else 56).
    #[serde(default)]
    pub prefix6: Option<u8>,
    /// Policy groups.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Lifetime of its certificates in seconds (default `[enroll] lifetime`).
    #[serde(default)]
    pub lifetime: Option<u64>,
    /// Seconds until the token expires unused (1 to 30 days; default a day).
    #[serde(default = "default_expiry")]
    pub expires: u64,
    /// The name is a member already: enroll a replacement device for it.
    #[serde(default)]
    pub replace: bool,
}

const fn default_expiry() -> u64 {
    TOKEN_EXPIRY
}

/// The blocks a token gets from `pool`: an IPv4 block of `prefix`, and, when the pool has an
/// IPv6 block, an IPv6 block of `prefix6` (by default a node's /128 beside a /32, else a
/// site's /56), each the first free past `taken`.
///
/// # Errors
/// The pool has no IPv4 block, or no room; `prefix6` without an IPv6 block.
pub fn allocate_both(
    pool: &[IpNet],
    prefix: u8,
    prefix6: Option<u8>,
    taken: &[IpNet],
) -> Result<Vec<IpNet>, AdminError> {
    let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = pool.iter().partition(|b| matches!(b, IpNet::V4(_)));
    let pick = |blocks: &[IpNet], len: u8, family: &str, field| {
        allocate(blocks, len, taken).ok_or_else(|| {
            let shown: Vec<String> = blocks.iter().map(ToString::to_string).collect();
            AdminError::Conflict(format!(
                "{field}: no free /{len} left in the enrollment pool's {family} blocks {}",
                shown.join(" ")
            ))
        })
    };
    if v4.is_empty() {
        return Err(AdminError::invalid(
            "prefix",
            "the enrollment pool has no IPv4 block: give the blocks (--vip-block, vip_blocks)",
        ));
    }
    let mut blocks = vec![pick(&v4, prefix, "IPv4", "prefix")?];
    if v6.is_empty() {
        if let Some(p) = prefix6 {
            return Err(AdminError::invalid(
                "prefix6",
                format!("prefix6 {p}: the enrollment pool has no IPv6 block"),
            ));
        }
        return Ok(blocks);
    }
    blocks.push(pick(
        &v6,
        prefix6.unwrap_or(if prefix == 32 { 128 } else { 56 }),
        "IPv6",
        "prefix6",
    )?);
    Ok(blocks)
}

/// Makes an enrollment token as `req` asks, on the registry `store` of a cloud whose online
/// issuer is `issuer`, at unix time `now`; returns its row and the token (whose secret
/// exists nowhere else: show it once).
///
/// # Errors
/// What [`AdminError`] says; each is recorded.
pub async fn create_token(
    store: &Store,
    issuer: Option<&Issuer>,
    req: &TokenRequest,
    who: &Who,
    now: u64,
) -> Result<(TokenRow, Token), AdminError> {
    let name = req.name.trim_end_matches('.').to_ascii_lowercase();
    let outcome = make_token(store, issuer, req, &name, now).await;
    let details = match &outcome {
        Ok((row, _)) => serde_json::json!({
            "id": row.id,
            "vip_blocks": row.blocks.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "groups": row.groups,
            "lifetime": row.lifetime,
            "expires_at": row.expires_at,
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    };
    record(
        store,
        who,
        "enrollment_token.create",
        &name,
        details,
        outcome,
    )
    .await
}

async fn make_token(
    store: &Store,
    issuer: Option<&Issuer>,
    req: &TokenRequest,
    name: &str,
    now: u64,
) -> Result<(TokenRow, Token), AdminError> {
    let issuer = issuer.ok_or_else(|| {
        AdminError::Conflict("this cloud has no [enroll] section: it cannot enroll".into())
    })?;
    validate_name(name).map_err(|e| AdminError::invalid("name", e.to_string()))?;
    let domain = &issuer.certificate().body().name;
    if !name
        .strip_suffix(domain.as_str())
        .is_some_and(|host| host.len() > 1 && host.ends_with('.'))
    {
        return Err(AdminError::invalid(
            "name",
            format!("{name} is not below the overlay domain {domain}"),
        ));
    }
    if !(1..=MAX_TOKEN_EXPIRY).contains(&req.expires) {
        return Err(AdminError::invalid(
            "expires",
            format!(
                "expires {}: give 1 to {MAX_TOKEN_EXPIRY} seconds",
                req.expires
            ),
        ));
    }
    let lifetime = req.lifetime.unwrap_or(issuer.lifetime);
    if lifetime < MIN_LIFETIME {
        return Err(AdminError::invalid(
            "lifetime",
            format!("lifetime {lifetime}: give at least {MIN_LIFETIME} seconds"),
        ));
    }
    if req.prefix.is_some() != req.vip_blocks.is_empty() {
        return Err(AdminError::invalid(
            "prefix",
            "give either the blocks (vip_blocks) or a prefix length to allocate (prefix)",
        ));
    }
    if req.prefix6.is_some() && req.prefix.is_none() {
        return Err(AdminError::invalid("prefix6", "prefix6 needs prefix"));
    }
    let tokens = store.tokens().await?;
    if let Some(t) = tokens
        .iter()
        .find(|t| t.name == name && matches!(t.state(now), "live" | "issued"))
    {
        return Err(AdminError::Conflict(format!(
            "token {} for {name} is still live: revoke it first (token revoke {})",
            t.id, t.id
        )));
    }
    let members = store.members().await?;
    if !req.replace && members.iter().any(|m| m.client.name == name) {
        return Err(AdminError::Conflict(format!(
            "{name} is a member already (cyphonic-cloud members show {name}); ask for a replacement (--replace) to enroll a new device for it"
        )));
    }
    // Blocks held by others: members of another name, live or used tokens of another name.
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
    let blocks = match req.prefix {
        Some(p) => allocate_both(&issuer.pool, p, req.prefix6, &taken)?,
        None => {
            let blocks: Vec<IpNet> = req.vip_blocks.iter().map(IpNet::trunc).collect();
            if let Some((b, t)) = cyphonic_crypto::first_overlap(&blocks, &taken) {
                return Err(AdminError::Conflict(format!(
                    "{b} overlaps {t}, which another member or token holds"
                )));
            }
            blocks
        }
    };
    // What the issuing CA cannot certify fails now, not at the device.
    let probe = TokenRow {
        id: String::new(),
        secret_sha256: String::new(),
        name: name.to_owned(),
        blocks,
        groups: req.groups.clone(),
        lifetime,
        created_at: now,
        expires_at: now + req.expires,
        used_at: None,
        used_by: None,
        used_key: None,
        confirmed_at: None,
        revoked_at: None,
    };
    issuer
        .enroll(&probe, [0; 32], now)
        .map_err(|e| AdminError::invalid("vip_blocks", e))?;
    let token = Token::generate().map_err(|e| AdminError::invalid("random", format!("{e:#}")))?;
    let row = TokenRow {
        id: token.id.clone(),
        secret_sha256: token.secret_sha256(),
        ..probe
    };
    store.add_token(&row).await?;
    Ok((row, token))
}

/// Revokes the unused enrollment token `id`; returns whether it was live (false: revoked
/// before).
///
/// # Errors
/// No such token; it was used; the store.
pub async fn revoke_token(
    store: &Store,
    id: &str,
    who: &Who,
    now: u64,
) -> Result<bool, AdminError> {
    let id = id.trim().to_ascii_lowercase();
    let outcome = async {
        match store.token(&id).await? {
            None => Err(AdminError::NotFound(format!("no token {id}"))),
            Some(t) if t.used_at.is_some() => Err(AdminError::Conflict(format!(
                "token {id} was used already (by {}): revoke that certificate instead",
                t.used_by.as_deref().unwrap_or("?")
            ))),
            Some(_) => Ok(store.revoke_token(&id, now).await?),
        }
    }
    .await;
    let details = serde_json::json!({ "was_live": outcome.as_ref().ok() });
    record(store, who, "enrollment_token.revoke", &id, details, outcome).await
}

/// What a member's revocation names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeTarget {
    /// Every certificate the registry knows of the name.
    Name(String),
    /// One certificate, by its fingerprint (hex).
    Fingerprint(String),
}

/// What a revocation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Revoked {
    /// The certificates it names (fingerprints, hex).
    pub fingerprints: Vec<String>,
    /// How many of them were not revoked before.
    pub added: usize,
}

/// Revokes a member online at `now`: every instance cuts its session and names within about
/// 2 s and tells every client.
///
/// # Errors
/// No certificate of that name; a fingerprint that does not read; the store.
pub async fn revoke_member(
    store: &Store,
    target: &RevokeTarget,
    who: &Who,
    now: u64,
) -> Result<Revoked, AdminError> {
    let (shown, outcome) = match target {
        RevokeTarget::Name(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            let outcome = async {
                let fps = store.fingerprints_named(&name).await?;
                if fps.is_empty() {
                    return Err(AdminError::NotFound(format!(
                        "the registry knows no certificate of {name}"
                    )));
                }
                let added = store.revoke(&fps, &name, now).await?;
                Ok(Revoked {
                    fingerprints: fps,
                    added,
                })
            }
            .await;
            (name, outcome)
        }
        RevokeTarget::Fingerprint(fp) => {
            let outcome = async {
                let fp: cyphonic_crypto::Fingerprint = fp
                    .parse()
                    .map_err(|e| AdminError::invalid("fingerprint", format!("{e}")))?;
                let fps = vec![fp.to_string()];
                let added = store.revoke(&fps, "", now).await?;
                Ok(Revoked {
                    fingerprints: fps,
                    added,
                })
            }
            .await;
            (fp.clone(), outcome)
        }
    };
    let details = match &outcome {
        Ok(r) => serde_json::json!({ "fingerprints": r.fingerprints, "added": r.added }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    };
    record(store, who, "member.revoke", &shown, details, outcome).await
}

/// Forgets a member's offline certificates and the names they host; returns how many.
///
/// # Errors
/// No such member (or none offline); the store.
pub async fn remove_member(store: &Store, name: &str, who: &Who) -> Result<usize, AdminError> {
    let outcome = async {
        match store.remove_member(name).await {
            Ok(0) => Err(AdminError::NotFound(format!("no member named {name}"))),
            Ok(n) => Ok(n),
            Err(StoreError::Online(m)) => {
                Err(AdminError::Conflict(StoreError::Online(m).to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }
    .await;
    let details = serde_json::json!({ "removed": outcome.as_ref().ok() });
    record(store, who, "member.remove", name, details, outcome).await
}

/// An API token: `cyk_<id>_<secret>`, the id 16 hex digits (names the token; not secret),
/// the secret 64 hex digits (32 random bytes; the store keeps only its SHA-256).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Names the token.
    pub id: String,
    secret: [u8; 32],
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cyk_{}_{}", self.id, hex::encode(self.secret))
    }
}

impl ApiToken {
    /// Reads a token's text; None unless it is `cyk_<16 hex>_<64 hex>`.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("cyk_")?;
        let (id, secret) = rest.split_once('_')?;
        let id_bytes: [u8; 8] = hex::decode(id).ok()?.try_into().ok()?;
        let secret: [u8; 32] = hex::decode(secret).ok()?.try_into().ok()?;
        Some(Self {
            id: hex::encode(id_bytes),
            secret,
        })
    }

    /// SHA-256 of the secret, hex: what the store keeps.
    pub fn secret_sha256(&self) -> String {
        hex::encode(ring::digest::digest(&ring::digest::SHA256, &self.secret))
    }

    /// Whether `row` is this token and accepted at `now`.
    pub fn matches(&self, row: &ApiTokenRow, now: u64) -> bool {
        // Digests are compared, not secrets: the time the comparison takes tells about a
        // hash of what was sent, which brings no one closer to the secret.
        row.id == self.id
            && row.secret_sha256 == self.secret_sha256()
            && row.revoked_at.is_none()
            && row.expires_at.is_none_or(|end| now < end)
    }
}

/// The longest an API token may be made to last: a year.
pub const MAX_API_TOKEN_LIFE: u64 = 365 * 24 * 3600;

/// Makes an API token named `name` with `scope`, lasting `expires` seconds (None: until
/// revoked); returns its row and the token (show it once).
///
/// # Errors
/// An empty or unprintable name, a lifetime out of range; the store.
pub async fn create_api_token(
    store: &Store,
    name: &str,
    scope: Scope,
    expires: Option<u64>,
    who: &Who,
    now: u64,
) -> Result<(ApiTokenRow, ApiToken), AdminError> {
    let outcome = async {
        if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            return Err(AdminError::invalid(
                "name",
                "give a name of 1 to 64 printable characters",
            ));
        }
        if let Some(e) = expires
            && !(1..=MAX_API_TOKEN_LIFE).contains(&e)
        {
            return Err(AdminError::invalid(
                "expires",
                format!("expires {e}: give 1 to {MAX_API_TOKEN_LIFE} seconds"),
            ));
        }
        let token = ApiToken {
            id: random_id()?,
            secret: random_bytes()?,
        };
        let row = ApiTokenRow {
            id: token.id.clone(),
            secret_sha256: token.secret_sha256(),
            name: name.to_owned(),
            scope: scope.as_str().to_owned(),
            created_by: who.actor.clone(),
            created_at: now,
            expires_at: expires.map(|e| now + e),
            revoked_at: None,
        };
        store.add_api_token(&row).await?;
        Ok((row, token))
    }
    .await;
    let (target, details) = match &outcome {
        Ok((row, _)) => (
            row.id.clone(),
            serde_json::json!({ "name": name, "scope": scope, "expires_at": row.expires_at }),
        ),
        Err(e) => (
            String::new(),
            serde_json::json!({ "name": name, "error": e.to_string() }),
        ),
    };
    record(store, who, "api_token.create", &target, details, outcome).await
}

/// Revokes the API token `id`; returns whether it was live (false: revoked before).
///
/// # Errors
/// No such token; the store.
pub async fn revoke_api_token(
    store: &Store,
    id: &str,
    who: &Who,
    now: u64,
) -> Result<bool, AdminError> {
    let id = id.trim().to_ascii_lowercase();
    let outcome = async {
        if store.api_token(&id).await?.is_none() {
            return Err(AdminError::NotFound(format!("no API token {id}")));
        }
        Ok(store.revoke_api_token(&id, now).await?)
    }
    .await;
    let details = serde_json::json!({ "was_live": outcome.as_ref().ok() });
    record(store, who, "api_token.revoke", &id, details, outcome).await
}

/// Secrets of a new session: the cookie's value (32 random bytes, hex: give it to the
/// browser once) and its row.
///
/// # Errors
/// The random number generator failed.
fn new_session(
    person: &crate::signin::Person,
    source: &str,
    now: u64,
    lasts: u64,
) -> Result<(crate::store::SessionRow, String), AdminError> {
    let cookie = hex::encode(random_bytes::<32>()?);
    let row = crate::store::SessionRow {
        id_sha256: session_id(&cookie),
        subject: person.subject.clone(),
        name: person.name.clone(),
        role: person.role.as_str().to_owned(),
        csrf: hex::encode(random_bytes::<16>()?),
        source: source.to_owned(),
        created_at: now,
        seen_at: now,
        ends_at: now.saturating_add(lasts),
    };
    Ok((row, cookie))
}

/// The store's name of the session a cookie's value names: its SHA-256, hex.
pub fn session_id(cookie: &str) -> String {
    hex::encode(ring::digest::digest(
        &ring::digest::SHA256,
        cookie.as_bytes(),
    ))
}

/// A person may hold this many sessions; signing in again ends their oldest beyond.
pub const SESSIONS_PER_PERSON: u32 = 8;

/// Signs `person` in from `who.source` at `now`, for `lasts` seconds at most: their session's
/// row and the cookie's value. Recorded as `sign_in`.
///
/// # Errors
/// The store's.
pub async fn sign_in(
    store: &Store,
    who: &Who,
    person: &crate::signin::Person,
    now: u64,
    lasts: u64,
) -> Result<(crate::store::SessionRow, String), AdminError> {
    let made = async {
        let (row, cookie) = new_session(person, &who.source, now, lasts)?;
        store.add_session(&row, SESSIONS_PER_PERSON).await?;
        Ok((row, cookie))
    }
    .await;
    let details = serde_json::json!({ "role": person.role, "name": person.name });
    record(store, who, "sign_in", &person.subject, details, made).await
}

/// Records a sign-in the provider proved but no role allows.
///
/// # Errors
/// Always: `forbidden` (or the store's, when the row cannot be written).
pub async fn refuse_sign_in(
    store: &Store,
    who: &Who,
    subject: &str,
    name: &str,
) -> Result<(), AdminError> {
    let details = serde_json::json!({ "name": name });
    let refused = Err(AdminError::Forbidden(format!(
        "{name} may not use the console: no role of theirs is named in [api.oidc]"
    )));
    record(store, who, "sign_in", subject, details, refused).await
}

/// Ends the session `id_sha256` (signing out). Recorded as `sign_out`.
///
/// # Errors
/// The store's.
pub async fn sign_out(store: &Store, who: &Who, id_sha256: &str) -> Result<(), AdminError> {
    let ended = store
        .end_session(id_sha256)
        .await
        .map(drop)
        .map_err(AdminError::from);
    let target = who.actor.clone();
    record(
        store,
        who,
        "sign_out",
        &target,
        serde_json::json!({}),
        ended,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(all: &[&str]) -> Vec<IpNet> {
        all.iter().map(|b| b.parse().unwrap_or_default()).collect()
    }

    /// A site gets a /56 beside its /24, a node a /128 beside its /32, or the length asked;
    /// a pool without IPv6 gives IPv4 alone and refuses prefix6; a full family and a pool
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
            err(&v4, 24, Some(56)).contains("prefix6 56: the enrollment pool has no IPv6 block")
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

    /// A token's text reads back to the same token; anything else is refused; a revoked,
    /// ended or different token does not match its row.
    #[test]
    fn an_api_token_reads_back_and_matches_only_its_live_row() {
        let t = ApiToken {
            id: "0123456789abcdef".into(),
            secret: [7; 32],
        };
        let text = t.to_string();
        assert_eq!(ApiToken::parse(&text), Some(t.clone()));
        for bad in [
            "",
            "cyk_",
            "cyk_0123456789abcdef",
            &text[1..],
            &text[..text.len() - 1],
            &text.replace("cyk_", "cyx_"),
            &format!("{text}0"),
        ] {
            assert_eq!(ApiToken::parse(bad), None, "{bad:?}");
        }
        let row = ApiTokenRow {
            id: t.id.clone(),
            secret_sha256: t.secret_sha256(),
            name: "ci".into(),
            scope: "read".into(),
            created_by: "cli:root".into(),
            created_at: 100,
            expires_at: Some(200),
            revoked_at: None,
        };
        assert!(t.matches(&row, 199));
        assert!(!t.matches(&row, 200));
        assert!(t.matches(
            &ApiTokenRow {
                expires_at: None,
                ..row.clone()
            },
            u64::MAX
        ));
        assert!(!t.matches(
            &ApiTokenRow {
                revoked_at: Some(150),
                ..row.clone()
            },
            150
        ));
        let other = ApiToken {
            secret: [8; 32],
            ..t.clone()
        };
        assert!(!other.matches(&row, 150));
    }
}
