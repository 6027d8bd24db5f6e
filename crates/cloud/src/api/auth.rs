//! Who asks: an API token in `Authorization: Bearer`, or a person's session cookie
//! (`__Host-cyphonic`), each checked against what the store holds, kept in memory so that a
//! request with a bad token or cookie costs no query. A write from a session must also
//! carry the session's CSRF token and come from the console's origin.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use governor::DefaultDirectRateLimiter;
use governor::clock::Clock as _;

use super::{ApiError, ApiState};
use crate::admin::{AdminError, ApiToken, Scope, Who, record};
use crate::guard::quota;
use crate::store::{ApiTokenRow, SessionRow};

/// How often the tokens and sessions are read again from the store: a token made or
/// revoked, or a session begun or ended, on another instance takes effect here within this.
pub const REFRESH: Duration = Duration::from_secs(2);

/// One token's or session's request rates: every request 50/s (burst 100), writes also 5/s
/// (burst 10).
pub(super) struct Rates {
    all: DefaultDirectRateLimiter,
    writes: DefaultDirectRateLimiter,
}

impl Default for Rates {
    fn default() -> Self {
        Self {
            all: quota(50, 100),
            writes: quota(5, 10),
        }
    }
}

impl Rates {
    /// The one bucket of every caller on the local admin socket: 1,000 requests/s, writes
    /// 200/s (a provisioning script is not held to a token's rates; a runaway loop still
    /// cannot take the store).
    pub(super) fn local() -> Self {
        Self {
            all: quota(1000, 1000),
            writes: quota(200, 200),
        }
    }
}

impl std::fmt::Debug for Rates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rates").finish_non_exhaustive()
    }
}

/// Takes a token from `bucket`, or says how long until one comes.
fn take(bucket: &DefaultDirectRateLimiter) -> Result<(), ApiError> {
    bucket
        .check()
        .map_err(|not_until| ApiError::rate_limited(not_until.wait_time_from(bucket.clock().now())))
}

/// What the store holds of one kind (API tokens, sessions), by key, each with its rates,
/// which are kept across refreshes.
#[derive(Debug)]
pub(super) struct Known<R>(RwLock<HashMap<String, (R, Arc<Rates>)>>);

impl<R> Default for Known<R> {
    fn default() -> Self {
        Self(RwLock::default())
    }
}

/// Names a row of [`Known`].
pub(super) trait Keyed {
    fn key(&self) -> &str;
}

impl Keyed for ApiTokenRow {
    fn key(&self) -> &str {
        &self.id
    }
}

impl Keyed for SessionRow {
    fn key(&self) -> &str {
        &self.id_sha256
    }
}

impl<R: Keyed + Clone> Known<R> {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, (R, Arc<Rates>)>> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Everything the store holds now.
    pub(super) fn replace(&self, rows: Vec<R>) {
        let mut known = self.write();
        let map = rows
            .into_iter()
            .map(|r| {
                let rates = known
                    .get(r.key())
                    .map_or_else(Arc::default, |(_, rates)| rates.clone());
                (r.key().to_owned(), (r, rates))
            })
            .collect();
        *known = map;
    }

    /// Adds a row made here: it is known at once, before the next refresh.
    pub(super) fn insert(&self, row: R) {
        self.write()
            .insert(row.key().to_owned(), (row, Arc::default()));
    }

    /// Forgets a row ended here.
    pub(super) fn remove(&self, key: &str) {
        self.write().remove(key);
    }

    fn get(&self, key: &str) -> Option<(R, Arc<Rates>)> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }
}

/// The API tokens, by id.
pub(super) type Tokens = Known<ApiTokenRow>;
/// The live sessions, by the SHA-256 of their cookie.
pub(super) type Sessions = Known<SessionRow>;

impl Sessions {
    /// The session `id`, if live at `now` with `idle` seconds allowed between requests; a
    /// request at least a minute after the last one noted is noted, and `true` says the
    /// store should note it too.
    fn live(&self, id: &str, now: u64, idle: u64) -> Option<(SessionRow, Arc<Rates>, bool)> {
        let mut known = self.write();
        let (row, rates) = known.get_mut(id)?;
        if now >= row.ends_at || now >= row.seen_at.saturating_add(idle) {
            return None;
        }
        let touch = now >= row.seen_at.saturating_add(60);
        if touch {
            row.seen_at = now;
        }
        Some((row.clone(), rates.clone(), touch))
    }
}

/// The cookie that names a person's session.
pub const SESSION_COOKIE: &str = "__Host-cyphonic";

/// The value of cookie `name` in `headers`, if sent once.
pub(super) fn cookie<'h>(headers: &'h axum::http::HeaderMap, name: &str) -> Option<&'h str> {
    let mut found = headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v);
    let first = found.next()?;
    // Two cookies of one name: one was planted (a `__Host-` cookie cannot be, but refuse).
    found.next().is_none().then_some(first)
}

/// A person's session, as a caller holds it.
#[derive(Debug, Clone)]
pub struct Session {
    /// The row (its CSRF token, role, ends).
    pub row: SessionRow,
    /// The request's `Origin`, if it sent one.
    origin: Option<String>,
}

/// Who asks, and what they may do.
#[derive(Debug, Clone)]
pub struct Caller {
    /// As the audit log names them.
    pub who: Who,
    /// What they may do.
    pub scope: Scope,
    /// Their request rates.
    rates: Arc<Rates>,
    /// The person's session, when they came with one rather than a token.
    pub session: Option<Session>,
}

impl Caller {
    /// Whether the caller may do what `needs` allows.
    ///
    /// # Errors
    /// `forbidden`, naming the scope needed.
    pub fn may(&self, needs: Scope) -> Result<(), ApiError> {
        if self.scope >= needs {
            Ok(())
        } else {
            Err(forbidden(needs).into())
        }
    }

    /// Whether the caller may make the change `action` on `target`, which `needs` allows;
    /// a refusal is recorded in the audit log.
    ///
    /// # Errors
    /// `forbidden`, naming the scope needed.
    pub async fn may_change(
        &self,
        state: &ApiState,
        needs: Scope,
        action: &str,
        target: &str,
    ) -> Result<(), ApiError> {
        if self.scope >= needs {
            return take(&self.rates.writes);
        }
        let details = serde_json::json!({ "scope": self.scope, "needs": needs });
        let refused: Result<(), AdminError> = Err(forbidden(needs));
        record(
            state.nms.store(),
            &self.who,
            action,
            target,
            details,
            refused,
        )
        .await
        .map_err(ApiError::from)
    }
}

/// Why a caller without the scope `needs` is refused.
fn forbidden(needs: Scope) -> AdminError {
    AdminError::Forbidden(format!("this needs the {needs} scope"))
}

impl FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        if let Some(peer) = parts.extensions.get::<super::local::Peer>() {
            return by_peer(peer, state);
        }
        if parts
            .headers
            .contains_key(axum::http::header::AUTHORIZATION)
        {
            return by_token(parts, state, source_of(parts));
        }
        let caller = person(parts, state)?;
        if !parts.method.is_safe() {
            let token = parts
                .headers
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok());
            caller.check_csrf(state, token)?;
        }
        Ok(caller)
    }
}

/// As the audit log writes where a request comes from (`local` without a listener).
fn source_of(parts: &Parts) -> String {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "local".to_owned(), |c| c.0.ip().to_string())
}

/// The person a session cookie names, their CSRF token not yet checked: a change must
/// then pass [`Caller::check_csrf`] with the token it carries (a header from programs, a
/// form's field from the console).
pub(super) fn person(parts: &Parts, state: &ApiState) -> Result<Caller, ApiError> {
    let value = cookie(&parts.headers, SESSION_COOKIE).ok_or_else(ApiError::unauthorized)?;
    let origin = parts
        .headers
        .get(axum::http::header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    by_session(state, value, source_of(parts), origin)
}

impl Caller {
    /// Whether a change from this person's session carries `token`, their session's CSRF
    /// token, and comes from the console's origin (`Origin`, which browsers send with every
    /// change and no page may forge): another site's page can make the browser send the
    /// cookie, but can neither read the token nor send this origin. Callers with an API
    /// token carry no ambient credential and pass.
    ///
    /// # Errors
    /// `forbidden`.
    pub(super) fn check_csrf(&self, state: &ApiState, token: Option<&str>) -> Result<(), ApiError> {
        let (Some(session), Some(signin)) = (&self.session, &state.signin) else {
            return Ok(());
        };
        let csrf = token.is_some_and(|t| crate::signin::same_secret(t, &session.row.csrf));
        let origin = session.origin.as_deref() == Some(signin.config().origin().as_str());
        if csrf && origin {
            Ok(())
        } else {
            Err(AdminError::Forbidden(
                "a change from a session needs its CSRF token and the console's Origin".to_owned(),
            )
            .into())
        }
    }
}

/// The caller on the local admin socket: its peer, as an admin when it is root or the
/// cloud's own user; anyone else is refused.
fn by_peer(peer: &super::local::Peer, state: &ApiState) -> Result<Caller, ApiError> {
    let who = peer.who.clone().ok_or_else(|| {
        AdminError::Forbidden(
            "only root and the cloud's own user may use the admin socket".to_owned(),
        )
    })?;
    take(&state.local_rates.all)?;
    Ok(Caller {
        who,
        scope: Scope::Admin,
        rates: state.local_rates.clone(),
        session: None,
    })
}

/// The caller an API token names. The same answer whatever is wrong: not a token,
/// unknown, ended, revoked.
fn by_token(parts: &Parts, state: &ApiState, source: String) -> Result<Caller, ApiError> {
    let text = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(ApiError::unauthorized)?;
    let token = ApiToken::parse(text.trim()).ok_or_else(ApiError::unauthorized)?;
    let (row, rates) = state
        .tokens
        .get(&token.id)
        .filter(|(row, _)| token.matches(row, super::now()))
        .ok_or_else(ApiError::unauthorized)?;
    take(&rates.all)?;
    let scope = Scope::parse(&row.scope).ok_or_else(ApiError::unauthorized)?;
    Ok(Caller {
        who: Who {
            actor: format!("token:{} {}", row.id, row.name),
            source,
        },
        scope,
        rates,
        session: None,
    })
}

/// The caller a session cookie names: the same answer whatever is wrong (not a session's,
/// ended, idle too long).
fn by_session(
    state: &ApiState,
    value: &str,
    source: String,
    origin: Option<String>,
) -> Result<Caller, ApiError> {
    let signin = state.signin.as_ref().ok_or_else(ApiError::unauthorized)?;
    let config = signin.config();
    if value.len() != 64 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::unauthorized());
    }
    let id = crate::admin::session_id(value);
    let now = super::now();
    let (row, rates, touch) = state
        .sessions
        .live(&id, now, config.idle.as_secs())
        .ok_or_else(ApiError::unauthorized)?;
    take(&rates.all)?;
    if touch {
        let store = state.nms.store().clone();
        tokio::spawn(async move {
            if let Err(e) = store.touch_session(&id, now).await {
                tracing::warn!(error = %e, "a session's last request could not be noted");
            }
        });
    }
    let role = crate::signin::Role::parse(&row.role).ok_or_else(ApiError::unauthorized)?;
    Ok(Caller {
        who: Who {
            actor: format!("person:{} {}", row.subject, row.name),
            source,
        },
        scope: Scope::of_role(role),
        rates,
        session: Some(Session { row, origin }),
    })
}
