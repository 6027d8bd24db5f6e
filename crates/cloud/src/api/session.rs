//! People's sign-in and sessions (docs/protocol.md §8, Who may do what): `/auth/login`
//! sends the person to the provider, `/auth/callback` takes them back and begins a session,
//! `/auth/logout` ends it, and `GET /api/v1/session` says who the caller is.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;

use axum::Json;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use governor::{Quota, RateLimiter};
use serde::Serialize;

use super::auth::{SESSION_COOKIE, cookie};
use super::console::{CsrfForm, Person};
use super::{ApiError, ApiState, Caller};
use crate::admin::{self, AdminError, Scope, Who};
use crate::signin::{Pending, Role, SignInError};
use std::sync::Arc;

/// The cookie that carries a sign-in under way (state, nonce, PKCE verifier) for ten
/// minutes.
pub const LOGIN_COOKIE: &str = "__Host-cyphonic-login";

/// How long a sign-in may take at the provider.
const LOGIN_LASTS: u64 = 600;

/// Where a person lands once signed in...
const LANDING: &str = "/console/";
/// ...and once signed out.
const SIGNED_OUT: &str = "/console/signin";

/// Sources tracked at once by the sign-in rate; beyond, a new source waits for room.
const SOURCES_TRACKED: usize = 65_536;

/// Sign-in requests (starts and returns together) per source address: 20 a minute, 10 at
/// once, so that nobody can keep the provider busy for everyone. IPv6 sources count per
/// /64.
#[derive(Debug)]
pub(super) struct SourceRates(
    RateLimiter<
        IpAddr,
        governor::state::keyed::DefaultKeyedStateStore<IpAddr>,
        governor::clock::DefaultClock,
    >,
);

impl Default for SourceRates {
    fn default() -> Self {
        let per_minute = NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN);
        Self(RateLimiter::keyed(
            Quota::per_minute(per_minute).allow_burst(burst),
        ))
    }
}

impl SourceRates {
    fn check(&self, source: IpAddr) -> Result<(), ApiError> {
        let key = match source.to_canonical() {
            IpAddr::V6(a) => {
                let mut o = a.octets();
                o[8..].fill(0);
                IpAddr::from(o)
            }
            v4 => v4,
        };
        let over = || {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many sign-ins from this address: wait and try again",
            )
        };
        if self.0.len() >= SOURCES_TRACKED {
            self.0.retain_recent();
            if self.0.len() >= SOURCES_TRACKED {
                return Err(over());
            }
        }
        self.0.check_key(&key).map_err(|_| over())
    }

    /// Forgets sources whose buckets are full again.
    pub(super) fn forget_idle(&self) {
        self.0.retain_recent();
        self.0.shrink_to_fit();
    }
}

/// A cookie for this host only, over HTTPS only, out of scripts' reach.
fn set_cookie(name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let age = max_age.map_or_else(String::new, |s| format!("; Max-Age={s}"));
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/; Secure; HttpOnly; SameSite=Lax{age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// A `303 See Other` to `to`, setting `cookies`.
fn see_other(to: &str, cookies: &[HeaderValue]) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(to) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, to);
    }
    for c in cookies {
        r.headers_mut().append(header::SET_COOKIE, c.clone());
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Where a request comes from (as [`super::serve`] found it): its address, and as the
/// audit log writes it (`local` when served without a listener, in tests).
pub(super) struct Source(IpAddr, String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Source {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(
                || Self(IpAddr::from([127, 0, 0, 1]), "local".to_owned()),
                |c| Self(c.0.ip(), c.0.ip().to_string()),
            ))
    }
}

/// The provider, for a sign-in request from `ip` within its source's rate.
fn admit(state: &ApiState, ip: IpAddr) -> Result<&crate::signin::Provider, ApiError> {
    let signin = state
        .signin
        .as_ref()
        .ok_or_else(|| ApiError::not_found("sign-in is not set up here ([api.oidc])"))?;
    state
        .signin_rates
        .check(ip)
        .map_err(|e| refused(state, e))?;
    Ok(signin)
}

/// Counts a refused sign-in and answers it.
fn refused(state: &ApiState, e: ApiError) -> ApiError {
    state
        .nms
        .stats
        .signins_refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    e
}

/// `GET /auth/login`: to the provider, the sign-in's secrets in this browser's cookie.
pub(super) async fn login(
    State(state): State<Arc<ApiState>>,
    Source(ip, _): Source,
) -> Result<Response, ApiError> {
    let signin = admit(&state, ip)?;
    let (to, pending) = signin.begin().await.map_err(|e| unavailable(&e))?;
    Ok(see_other(
        to.as_str(),
        &[set_cookie(
            LOGIN_COOKIE,
            &pending.to_cookie(),
            Some(LOGIN_LASTS),
        )],
    ))
}

fn unavailable(e: &SignInError) -> ApiError {
    tracing::warn!(error = %e, "sign-in");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the sign-in provider cannot be reached; try again",
    )
}

/// `GET /auth/callback`: the provider sends the person back with a code; a session begins
/// if the code proves who they are and a role is theirs.
pub(super) async fn callback(
    State(state): State<Arc<ApiState>>,
    Source(ip, from): Source,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let signin = admit(&state, ip)?;
    let unauthorized = |message: String| {
        refused(
            &state,
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message),
        )
    };
    let pending = cookie(&headers, LOGIN_COOKIE)
        .and_then(Pending::from_cookie)
        .ok_or_else(|| {
            unauthorized("no sign-in is under way in this browser: start at /auth/login".into())
        })?;
    if let Some(error) = query.get("error") {
        return Err(unauthorized(format!(
            "the provider refused the sign-in: {error}"
        )));
    }
    let (Some(code), Some(given)) = (query.get("code"), query.get("state")) else {
        return Err(unauthorized("the provider sent no code and state".into()));
    };
    if !pending.is_state(given) {
        return Err(unauthorized(
            "this answer is not for the sign-in under way in this browser".into(),
        ));
    }
    let person = match signin.finish(&pending, code).await {
        Ok(p) => p,
        Err(e @ SignInError::Provider(_)) => return Err(refused(&state, unavailable(&e))),
        Err(SignInError::NoRole { subject, name }) => {
            let who = Who {
                actor: format!("person:{subject} {name}"),
                source: from,
            };
            let e = admin::refuse_sign_in(state.nms.store(), &who, &subject, &name).await;
            return Err(refused(
                &state,
                e.err()
                    .map_or_else(|| ApiError::from(AdminError::Forbidden(name)), Into::into),
            ));
        }
        Err(e) => return Err(unauthorized(e.to_string())),
    };
    let who = Who {
        actor: format!("person:{} {}", person.subject, person.name),
        source: from,
    };
    let lasts = signin.config().session.as_secs();
    let (row, value) =
        admin::sign_in(state.nms.store(), &who, &person, super::now(), lasts).await?;
    state.sessions.insert(row);
    state
        .nms
        .stats
        .signins
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(person = %person.name, role = %person.role, "signed in");
    Ok(see_other(
        LANDING,
        &[
            set_cookie(SESSION_COOKIE, &value, Some(lasts)),
            set_cookie(LOGIN_COOKIE, "", Some(0)),
        ],
    ))
}

/// `POST /auth/logout`: ends the caller's session (a change: its CSRF token, in
/// `X-CSRF-Token` or the console's form field `csrf`, and the console's origin).
pub(super) async fn logout(
    State(state): State<Arc<ApiState>>,
    Person(caller): Person,
    headers: HeaderMap,
    form: Result<axum::Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ApiError> {
    let token = headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| form.ok().map(|f| f.0.csrf));
    caller.check_csrf(&state, token.as_deref())?;
    let Some(session) = &caller.session else {
        return Err(ApiError::unauthorized());
    };
    let id = &session.row.id_sha256;
    admin::sign_out(state.nms.store(), &caller.who, id).await?;
    state.sessions.remove(id);
    Ok(see_other(
        SIGNED_OUT,
        &[set_cookie(SESSION_COOKIE, "", Some(0))],
    ))
}

/// Who the caller is.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// As the audit log names them: `token:<id> <name>` or `person:<subject> <name>`.
    pub actor: String,
    /// What they may do.
    pub scope: Scope,
    /// A person's role; none for a token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// A person's CSRF token: every change from their session carries it in
    /// `X-CSRF-Token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csrf: Option<String>,
    /// When a person's session ends at the latest (unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<u64>,
}

/// Who the caller is: a token, or a person with their session's CSRF token.
#[utoipa::path(get, path = "/api/v1/session",
    responses((status = 200, body = WhoAmI), (status = 401, body = super::ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn whoami(caller: Caller) -> Json<WhoAmI> {
    let session = caller.session.as_ref().map(|s| &s.row);
    Json(WhoAmI {
        actor: caller.who.actor.clone(),
        scope: caller.scope,
        role: session.and_then(|r| Role::parse(&r.role)),
        csrf: session.map(|r| r.csrf.clone()),
        ends_at: session.map(|r| r.ends_at),
    })
}
