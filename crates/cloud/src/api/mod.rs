//! The cloud's HTTP API (docs/protocol.md §8): JSON under `/api/v1`, for programs with an API
//! token and for the console. Every instance serves it alike from the shared store. The
//! handlers read the store and call [`crate::admin`] for writes, which records each in the
//! audit log; this module adds who may ask (tokens and scopes), the shapes of answers and
//! errors, and pages.

mod auth;
mod console;
mod doc;
mod flows;
mod local;
mod reports;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use crate::admin::{self, AdminError, RevokeTarget, Revoked, Scope, TokenRequest};
use crate::fleet::{MemberView, TokenView};
use crate::nms::Nms;
use crate::store::{AuditEntry, AuditQuery, StoreError};

pub use auth::{Caller, REFRESH, SESSION_COOKIE};
pub use doc::openapi;
pub use flows::FlowParams;
pub use local::{LOCAL_CONNECTIONS, serve_local};
pub use reports::{DevicePage, TunnelParams};
pub use session::{LOGIN_COOKIE, WhoAmI};

/// What the handlers share: the NMS (its store, its issuer), the API tokens and sessions
/// known, and the sign-in provider.
#[derive(Debug)]
pub struct ApiState {
    nms: Arc<Nms>,
    tokens: auth::Tokens,
    sessions: auth::Sessions,
    signin: Option<crate::signin::Provider>,
    signin_rates: session::SourceRates,
    /// Every caller on the local admin socket together.
    local_rates: Arc<auth::Rates>,
}

impl ApiState {
    /// The API over `nms`'s registry, without sign-in for people.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn new(nms: Arc<Nms>) -> Result<Arc<Self>, StoreError> {
        Self::with_signin(nms, None).await
    }

    /// The API over `nms`'s registry, people signing in through `signin`. The API tokens
    /// and sessions are read at once and every [`REFRESH`] after ([`ApiState::refresh`]).
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn with_signin(
        nms: Arc<Nms>,
        signin: Option<crate::signin::Provider>,
    ) -> Result<Arc<Self>, StoreError> {
        let state = Arc::new(Self {
            nms,
            tokens: auth::Tokens::default(),
            sessions: auth::Sessions::default(),
            signin,
            signin_rates: session::SourceRates::default(),
            local_rates: Arc::new(auth::Rates::local()),
        });
        state.refresh().await?;
        Ok(state)
    }

    /// Reads the API tokens and the live sessions from the store again: tokens made or
    /// revoked, sessions begun or ended, on any instance take effect here.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let store = self.nms.store();
        self.tokens.replace(store.api_tokens().await?);
        if let Some(signin) = &self.signin {
            let idle = signin.config().idle.as_secs();
            self.sessions.replace(store.sessions(now(), idle).await?);
        }
        self.signin_rates.forget_idle();
        Ok(())
    }

    /// Refreshes the API tokens and sessions every [`REFRESH`], for ever.
    pub async fn keep_fresh(self: Arc<Self>) {
        loop {
            tokio::time::sleep(REFRESH).await;
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "the API tokens and sessions could not be read again");
            }
        }
    }
}

/// The largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// The API's routes over `state`: `/api/v1`, sign-in and the console.
pub fn router(state: Arc<ApiState>) -> axum::Router {
    finish(
        axum::Router::new()
            .nest("/api/v1", v1())
            .route("/auth/login", get(session::login))
            .route(crate::signin::CALLBACK, get(session::callback))
            .route("/auth/logout", post(session::logout))
            .merge(console::routes()),
        state,
    )
}

/// The local admin socket's routes over `state`: `/api/v1` alone.
pub fn local_router(state: Arc<ApiState>) -> axum::Router {
    finish(axum::Router::new().nest("/api/v1", v1()), state)
}

/// `routes` with the answers to unknown paths and methods, and the body limit.
fn finish(routes: axum::Router<Arc<ApiState>>, state: Arc<ApiState>) -> axum::Router {
    routes
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The endpoints under `/api/v1`.
fn v1() -> axum::Router<Arc<ApiState>> {
    axum::Router::new()
        .route("/members", get(members))
        .route("/members/{name}", get(member).delete(remove_member))
        .route("/members/{name}/revoke", post(revoke_member))
        .route("/members/{name}/devices", get(reports::devices))
        .route("/tunnels", get(reports::tunnels))
        .route("/flows", get(flows::flows))
        .route(
            "/enrollment-tokens",
            get(enrollment_tokens).post(create_enrollment_token),
        )
        .route(
            "/enrollment-tokens/{id}",
            axum::routing::delete(revoke_enrollment_token),
        )
        .route("/revocations", get(revocations).post(revoke_certificate))
        .route("/api-tokens", get(api_tokens).post(create_api_token))
        .route("/api-tokens/{id}", axum::routing::delete(revoke_api_token))
        .route("/audit", get(audit))
        .route("/policy", get(policy))
        .route("/policy/check", post(policy_check))
        .route("/policy/{member}", get(member_policy))
        .route("/session", get(session::whoami))
        .route("/openapi.json", get(|| async { Json(openapi()) }))
}

/// What one listener admits: connections in all and from one address, and how long a
/// connection may take to send a request's head and may stay open at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub connections: usize,
    /// Of those, from one address: fewer than `connections` / 50, so that 50 addresses
    /// cannot take every one.
    pub per_source: usize,
    /// From a connection's start, or the end of its last answer, to a request's whole head.
    pub header: std::time::Duration,
    /// The longest a connection stays open.
    pub lifetime: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 512,
            per_source: 8,
            header: std::time::Duration::from_secs(10),
            lifetime: std::time::Duration::from_secs(600),
        }
    }
}

/// Connections open per source address, each released when its connection ends.
#[derive(Debug, Default)]
struct Sources(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection's place in [`Sources`].
#[derive(Debug)]
struct Place(Arc<Sources>, std::net::IpAddr);

impl Sources {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, most: usize) -> Option<Place> {
        let mut open = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_default();
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(Place(self.clone(), ip))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self
            .0
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let std::collections::hash_map::Entry::Occupied(mut e) = open.entry(self.1) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// The address a request comes from: its connection's peer; or, from a trusted proxy
/// (`proxies`), the last address its `X-Forwarded-For` names (the one that proxy added),
/// when there is one that reads.
pub fn source_of(
    peer: SocketAddr,
    headers: &axum::http::HeaderMap,
    proxies: &[ipnet::IpNet],
) -> SocketAddr {
    if !proxies
        .iter()
        .any(|p| p.contains(&peer.ip().to_canonical()))
    {
        return peer;
    }
    headers
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|last| last.trim().parse::<std::net::IpAddr>().ok())
        .map_or(peer, |ip| SocketAddr::new(ip, 0))
}

/// The API's TLS configuration as it stands: a reload may replace it, and each new
/// connection takes the one current then.
pub type LiveTls = tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>;

/// A [`LiveTls`] that never changes.
pub fn fixed_tls(config: Arc<rustls::ServerConfig>) -> LiveTls {
    tokio::sync::watch::channel(config).1
}

/// Serves `router` on `listener` (over TLS with `tls`) within `limits` until the task is
/// dropped, each connection's peer address (or the client a trusted proxy in `proxies`
/// names, [`source_of`]) known to the handlers: the audit log's source. A proxy's
/// connections count in all but not against the per-address limit, since every client
/// behind it shares its address. A connection over a limit is closed at once, and
/// `refused` is called.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Option<LiveTls>,
    proxies: Arc<[ipnet::IpNet]>,
    limits: Limits,
    refused: impl Fn() + Send + 'static,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    http.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(32);
    let open = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let sources = Arc::new(Sources::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!(error = %e, "the API could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let proxy = proxies
            .iter()
            .any(|p| p.contains(&peer.ip().to_canonical()));
        let place = if proxy {
            Some(None)
        } else {
            sources.take(peer.ip(), limits.per_source).map(Some)
        };
        let admitted = open.clone().try_acquire_owned().ok().zip(place);
        let Some((permit, place)) = admitted else {
            refused();
            drop(stream);
            continue;
        };
        let (router, proxies) = (router.clone(), proxies.clone());
        let service =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                let source = source_of(peer, req.headers(), &proxies);
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(source));
                tower::ServiceExt::oneshot(router.clone(), req)
            });
        let (http, tls) = (http.clone(), tls.as_ref().map(|t| t.borrow().clone()));
        tokio::spawn(async move {
            // A connection that says nothing is closed after the header time: hyper's own
            // timeout starts only once it has a first byte to tell HTTP/1 from HTTP/2 by.
            let mut byte = [0u8; 1];
            let first = tokio::time::timeout(limits.header, stream.peek(&mut byte)).await;
            if !matches!(first, Ok(Ok(1))) {
                return;
            }
            let served = async {
                match tls {
                    None => {
                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    }
                    Some(config) => {
                        // The handshake, too, within the header time.
                        let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
                        if let Ok(Ok(stream)) = tokio::time::timeout(limits.header, accept).await {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                }
            };
            let _ = tokio::time::timeout(limits.lifetime, served).await;
            drop((permit, place));
        });
    }
}

/// An error as the API answers it: `{"error": {"code", "message", "field"?}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable: `unauthorized` (401), `forbidden` (403), `not_found` (404),
    /// `method_not_allowed` (405), `conflict` (409), `too_large` (413), `invalid` (422),
    /// `rate_limited` (429, with `Retry-After`), `unavailable` (503).
    pub code: String,
    /// In words, for people.
    pub message: String,
    /// With `invalid`: which input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
    /// With 429: seconds until a request may come.
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                error: ErrorDetail {
                    code: code.to_owned(),
                    message: message.into(),
                    field: None,
                },
            },
            retry_after: None,
        }
    }

    fn rate_limited(wait: std::time::Duration) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests with this token: wait and try again",
        );
        e.retry_after = Some(wait.as_secs() + u64::from(wait.subsec_nanos() > 0));
        e
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message);
        e.body.error.field = Some(field.to_owned());
        e
    }

    fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "give a valid API token: Authorization: Bearer cyk_...",
        )
    }
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> Self {
        let status = match &e {
            AdminError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut out = Self::new(status, e.code(), e.to_string());
        if let AdminError::Invalid { field, .. } = e {
            out.body.error.field = Some(field.to_owned());
        }
        out
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the registry is unavailable; try again",
        )
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        let mut out = Self::invalid("body", e.body_text());
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            out.status = StatusCode::PAYLOAD_TOO_LARGE;
            out.body.error.code = "too_large".to_owned();
        }
        out
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::invalid("query", e.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        Self::invalid("path", e.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body)).into_response();
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.max(1).into());
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

type Answer<T> = Result<Json<T>, ApiError>;

/// A page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    /// The items, at most `limit`.
    pub items: Vec<T>,
    /// The cursor of the next page (`?after=`), None on the last.
    pub next: Option<String>,
}

/// Which page: `?limit=` (1-500, default 100) and `?after=` (the `next` of the page before).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// At most this many items (1-500, default 100).
    pub limit: Option<u32>,
    /// The cursor of the page before.
    pub after: Option<String>,
}

/// The largest page.
pub const MAX_PAGE: u32 = 500;
const DEFAULT_PAGE: u32 = 100;

fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        n => Err(ApiError::invalid(
            "limit",
            format!("limit {n}: give 1 to {MAX_PAGE}"),
        )),
    }
}

/// The page query of a list that `needs` a scope: the caller may, the query reads.
fn asked(
    caller: &Caller,
    needs: Scope,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<PageQuery, ApiError> {
    caller.may(needs)?;
    let Query(q) = q?;
    page_limit(q.limit)?;
    Ok(q)
}

/// A list's cursor for the item known by `key`: hex, so that it is opaque and URL-safe.
fn cursor_of(key: &str) -> String {
    hex::encode(key)
}

/// The key a cursor of [`cursor_of`] holds.
fn key_of(cursor: &str) -> Result<String, ApiError> {
    hex::decode(cursor)
        .ok()
        .and_then(|k| String::from_utf8(k).ok())
        .ok_or_else(bad_cursor)
}

/// The member (name, fingerprint) a members list's cursor names.
fn member_after(cursor: Option<&str>) -> Result<Option<(String, String)>, ApiError> {
    let Some(cursor) = cursor else {
        return Ok(None);
    };
    let key = key_of(cursor)?;
    let (name, fingerprint) = key.split_once(' ').ok_or_else(bad_cursor)?;
    Ok(Some((name.to_owned(), fingerprint.to_owned())))
}

/// At most `limit` members (each certificate apart) after the one `cursor` names, read
/// from the store a page at a time, and whether more follow (one more is asked for).
async fn member_views(
    s: &ApiState,
    cursor: Option<&str>,
    limit: u32,
) -> Result<(Vec<MemberView>, bool), ApiError> {
    let after = member_after(cursor)?;
    let after = after.as_ref().map(|(n, f)| (n.as_str(), f.as_str()));
    let mut views: Vec<MemberView> = s
        .nms
        .store()
        .members_page(after, limit + 1)
        .await?
        .iter()
        .map(MemberView::of)
        .collect();
    let more = views.len() > limit as usize;
    views.truncate(limit as usize);
    Ok((views, more))
}

/// A members list's cursor after `m`.
fn member_cursor(m: &MemberView) -> String {
    cursor_of(&format!("{} {}", m.name, m.fingerprint))
}

fn bad_cursor() -> ApiError {
    ApiError::invalid("after", "the cursor is not one this list gave")
}

/// The page `q` asks of `items`, each known by `key` (unique, in the items' order): the
/// cursor is the last item's key ([`cursor_of`]).
fn page<T>(items: Vec<T>, key: impl Fn(&T) -> String, q: &PageQuery) -> Result<Page<T>, ApiError> {
    let limit = page_limit(q.limit)? as usize;
    let start = match &q.after {
        None => 0,
        Some(cursor) => {
            let wanted = key_of(cursor)?;
            items
                .iter()
                .position(|i| key(i) == wanted)
                .ok_or_else(bad_cursor)?
                + 1
        }
    };
    let mut rest: Vec<T> = items.into_iter().skip(start).collect();
    let next = (rest.len() > limit).then(|| cursor_of(&key(&rest[limit - 1])));
    rest.truncate(limit);
    Ok(Page { items: rest, next })
}

/// A page of `items`, which the store was asked one more of than `limit`: at most `limit`
/// of them, and when more follow, the cursor after the last (`key` names an item).
fn store_page<T>(mut items: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> Page<T> {
    let more = items.len() > limit as usize;
    items.truncate(limit as usize);
    let next = items.last().filter(|_| more).map(|i| cursor_of(&key(i)));
    Page { items, next }
}

fn now() -> u64 {
    crate::clock::unix_now_ms() / 1000
}

/// The members, each certificate apart, by name.
#[utoipa::path(get, path = "/api/v1/members", params(PageQuery),
    responses((status = 200, body = Page<MemberView>), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn members(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Answer<Page<MemberView>> {
    let q = asked(&caller, Scope::Read, q)?;
    let limit = page_limit(q.limit)?;
    // Paged by the store: a page costs its own members, not the whole registry's.
    let (views, more) = member_views(&s, q.after.as_deref(), limit).await?;
    let next = views.last().filter(|_| more).map(member_cursor);
    Ok(Json(Page { items: views, next }))
}

/// One member: every certificate of the name.
#[utoipa::path(get, path = "/api/v1/members/{name}", params(("name" = String, Path, description = "The member's name")),
    responses((status = 200, body = Vec<MemberView>), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn member(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    name: Result<Path<String>, PathRejection>,
) -> Answer<Vec<MemberView>> {
    caller.may(Scope::Read)?;
    let Path(name) = name?;
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let views: Vec<MemberView> = s
        .nms
        .store()
        .members_named(&name)
        .await?
        .iter()
        .map(MemberView::of)
        .collect();
    if views.is_empty() {
        return Err(ApiError::not_found(format!("no member named {name}")));
    }
    Ok(Json(views))
}

/// Revokes every certificate of a member: every instance cuts its session and every client
/// drops it within about 2 s.
#[utoipa::path(post, path = "/api/v1/members/{name}/revoke", params(("name" = String, Path, description = "The member's name")),
    responses((status = 200, body = Revoked), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn revoke_member(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    name: Result<Path<String>, PathRejection>,
) -> Answer<Revoked> {
    let Path(name) = name?;
    caller
        .may_change(&s, Scope::Write, "member.revoke", &name)
        .await?;
    let r =
        admin::revoke_member(s.nms.store(), &RevokeTarget::Name(name), &caller.who, now()).await?;
    Ok(Json(r))
}

/// What removing a member did.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Removed {
    /// How many offline certificates of it were forgotten, with the names they hosted.
    pub removed: usize,
}

/// Forgets a member's offline certificates and the names they host (`members remove`); an
/// online certificate stays. Its certificates stay valid: revoke them too.
#[utoipa::path(delete, path = "/api/v1/members/{name}", params(("name" = String, Path, description = "The member's name")),
    responses((status = 200, body = Removed), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn remove_member(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    name: Result<Path<String>, PathRejection>,
) -> Answer<Removed> {
    let Path(name) = name?;
    caller
        .may_change(&s, Scope::Write, "member.remove", &name)
        .await?;
    let removed = admin::remove_member(s.nms.store(), &name, &caller.who).await?;
    Ok(Json(Removed { removed }))
}

/// One certificate to revoke.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeCertificate {
    /// Its fingerprint (hex).
    pub fingerprint: String,
}

/// Revokes one certificate by its fingerprint (`revoke --fingerprint`): every instance cuts
/// its session and every client drops it within about 2 s.
#[utoipa::path(post, path = "/api/v1/revocations", request_body = RevokeCertificate,
    responses((status = 200, body = Revoked), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn revoke_certificate(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    body: Result<Json<RevokeCertificate>, JsonRejection>,
) -> Answer<Revoked> {
    let Json(req) = body?;
    caller
        .may_change(&s, Scope::Write, "member.revoke", &req.fingerprint)
        .await?;
    let target = RevokeTarget::Fingerprint(req.fingerprint);
    Ok(Json(
        admin::revoke_member(s.nms.store(), &target, &caller.who, now()).await?,
    ))
}

/// The enrollment tokens, newest first (never their secrets).
#[utoipa::path(get, path = "/api/v1/enrollment-tokens", params(PageQuery),
    responses((status = 200, body = Page<TokenView>), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
async fn enrollment_tokens(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Answer<Page<TokenView>> {
    let q = asked(&caller, Scope::Read, q)?;
    let t = now();
    let views = s
        .nms
        .store()
        .tokens()
        .await?
        .into_iter()
        .map(|row| TokenView::of(row, t))
        .collect();
    Ok(Json(page(views, |v: &TokenView| v.id.clone(), &q)?))
}

/// A new enrollment token, shown once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewEnrollmentToken {
    /// The token to give the device (`cyphonic-adapter enroll --token`): shown only here.
    pub token: String,
    /// What it is bound to.
    pub item: TokenView,
}

/// Makes an enrollment token.
#[utoipa::path(post, path = "/api/v1/enrollment-tokens", request_body = TokenRequest,
    responses((status = 201, body = NewEnrollmentToken), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_enrollment_token(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    body: Result<Json<TokenRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<NewEnrollmentToken>), ApiError> {
    caller
        .may_change(&s, Scope::Write, "enrollment_token.create", "")
        .await?;
    let Json(req) = body?;
    let t = now();
    let (row, token) =
        admin::create_token(s.nms.store(), s.nms.issuer(), &req, &caller.who, t).await?;
    Ok((
        StatusCode::CREATED,
        Json(NewEnrollmentToken {
            token: token.to_string(),
            item: TokenView::of(row, t),
        }),
    ))
}

/// What a revocation of a token found.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenRevoked {
    /// Whether it was live (false: revoked before).
    pub was_live: bool,
}

/// Revokes an unused enrollment token.
#[utoipa::path(delete, path = "/api/v1/enrollment-tokens/{id}", params(("id" = String, Path, description = "The token's id")),
    responses((status = 200, body = TokenRevoked), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
async fn revoke_enrollment_token(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Answer<TokenRevoked> {
    let Path(id) = id?;
    caller
        .may_change(&s, Scope::Write, "enrollment_token.revoke", &id)
        .await?;
    let was_live = admin::revoke_token(s.nms.store(), &id, &caller.who, now()).await?;
    Ok(Json(TokenRevoked { was_live }))
}

/// A certificate revoked online.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RevocationView {
    /// Its fingerprint (hex).
    pub fingerprint: String,
    /// The member's name, when revoked by name.
    pub name: String,
    /// When (unix seconds).
    pub revoked_at: u64,
}

/// The certificates revoked online, newest first.
#[utoipa::path(get, path = "/api/v1/revocations", params(PageQuery),
    responses((status = 200, body = Page<RevocationView>), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
async fn revocations(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Answer<Page<RevocationView>> {
    let q = asked(&caller, Scope::Read, q)?;
    let views = s
        .nms
        .store()
        .revocation_rows()
        .await?
        .into_iter()
        .map(|(fingerprint, name, revoked_at)| RevocationView {
            fingerprint,
            name,
            revoked_at,
        })
        .collect();
    Ok(Json(page(
        views,
        |v: &RevocationView| v.fingerprint.clone(),
        &q,
    )?))
}

/// An API token as lists show it (never its secret or hash).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApiTokenView {
    /// Names the token: the 16 hex digits after `cyk_`.
    pub id: String,
    /// What it is for.
    pub name: String,
    /// What it may do.
    pub scope: String,
    /// `live`, `expired` or `revoked`.
    pub state: &'static str,
    /// Who made it.
    pub created_by: String,
    /// When (unix seconds).
    pub created_at: u64,
    /// When it ends, if ever.
    pub expires_at: Option<u64>,
    /// When it was revoked.
    pub revoked_at: Option<u64>,
}

impl ApiTokenView {
    /// The view of `t` at unix time `now`.
    pub fn of(t: crate::store::ApiTokenRow, now: u64) -> Self {
        Self {
            state: t.state(now),
            id: t.id,
            name: t.name,
            scope: t.scope,
            created_by: t.created_by,
            created_at: t.created_at,
            expires_at: t.expires_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// The API tokens, newest first.
#[utoipa::path(get, path = "/api/v1/api-tokens", params(PageQuery),
    responses((status = 200, body = Page<ApiTokenView>), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
async fn api_tokens(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Answer<Page<ApiTokenView>> {
    let q = asked(&caller, Scope::Admin, q)?;
    let views = api_token_views(&s).await?;
    Ok(Json(page(views, |v: &ApiTokenView| v.id.clone(), &q)?))
}

/// Every API token, newest first, for the API and the console.
async fn api_token_views(s: &ApiState) -> Result<Vec<ApiTokenView>, ApiError> {
    let t = now();
    Ok(s.nms
        .store()
        .api_tokens()
        .await?
        .into_iter()
        .map(|row| ApiTokenView::of(row, t))
        .collect())
}

/// What a new API token is for (`api-token create`, `POST /api-tokens`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenRequest {
    /// What it is for (1-64 printable characters).
    pub name: String,
    /// What it may do.
    pub scope: Scope,
    /// Seconds until it ends (at most a year); none: until revoked.
    #[serde(default)]
    pub expires: Option<u64>,
}

/// A new API token, shown once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewApiToken {
    /// The token (`cyk_...`): shown only here.
    pub token: String,
    /// What it is.
    pub item: ApiTokenView,
}

/// Makes an API token.
#[utoipa::path(post, path = "/api/v1/api-tokens", request_body = ApiTokenRequest,
    responses((status = 201, body = NewApiToken), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_api_token(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    body: Result<Json<ApiTokenRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<NewApiToken>), ApiError> {
    caller
        .may_change(&s, Scope::Admin, "api_token.create", "")
        .await?;
    let Json(req) = body?;
    let t = now();
    let (row, token) = admin::create_api_token(
        s.nms.store(),
        &req.name,
        req.scope,
        req.expires,
        &caller.who,
        t,
    )
    .await?;
    s.refresh().await?;
    Ok((
        StatusCode::CREATED,
        Json(NewApiToken {
            token: token.to_string(),
            item: ApiTokenView::of(row, t),
        }),
    ))
}

/// Revokes an API token.
#[utoipa::path(delete, path = "/api/v1/api-tokens/{id}", params(("id" = String, Path, description = "The token's id")),
    responses((status = 200, body = TokenRevoked), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn revoke_api_token(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Answer<TokenRevoked> {
    let Path(id) = id?;
    caller
        .may_change(&s, Scope::Admin, "api_token.revoke", &id)
        .await?;
    let was_live = admin::revoke_api_token(s.nms.store(), &id, &caller.who, now()).await?;
    s.refresh().await?;
    Ok(Json(TokenRevoked { was_live }))
}

/// Which rows of the audit log, newest first.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// Only this target.
    pub target: Option<String>,
    /// At most this many rows (1-500, default 100).
    pub limit: Option<u32>,
    /// The cursor of the page before.
    pub after: Option<String>,
}

/// The audit log, newest first.
#[utoipa::path(get, path = "/api/v1/audit", params(AuditParams),
    responses((status = 200, body = Page<AuditEntry>), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn audit(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<AuditParams>, QueryRejection>,
) -> Answer<Page<AuditEntry>> {
    caller.may(Scope::Read)?;
    let Query(q) = q?;
    let limit = page_limit(q.limit)?;
    let before = match &q.after {
        None => None,
        Some(c) => {
            let key = key_of(c)?;
            let (at, id) = key.split_once(' ').ok_or_else(bad_cursor)?;
            Some((at.parse().map_err(|_| bad_cursor())?, id.to_owned()))
        }
    };
    // One more than asked tells whether there is a next page.
    let rows = s
        .nms
        .store()
        .audit_log(&AuditQuery {
            actor: q.actor,
            action: q.action,
            target: q.target,
            before,
            limit: limit + 1,
        })
        .await?;
    Ok(Json(store_page(rows, limit, |r| {
        format!("{} {}", r.at, r.id)
    })))
}

/// A group of the policy.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GroupView {
    /// Its name.
    pub name: String,
    /// What it holds: members, devices, groups, addresses, patterns.
    pub members: Vec<String>,
}

/// The policy as configured, and what of it stands for nobody now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PolicyView {
    /// With no rule that matches: `allow` (nothing enforced) or `deny`.
    pub default: &'static str,
    /// The groups.
    pub groups: Vec<GroupView>,
    /// The rules, numbered from 1.
    pub rules: Vec<crate::policy::NumberedRule>,
    /// Names the rules use that stand for nobody now.
    pub unresolved: Vec<String>,
}

/// The policy, as the running cloud holds it (after its last reload).
#[utoipa::path(get, path = "/api/v1/policy",
    responses((status = 200, body = PolicyView), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
async fn policy(State(s): State<Arc<ApiState>>, caller: Caller) -> Answer<PolicyView> {
    caller.may(Scope::Read)?;
    Ok(Json(policy_view(&s)))
}

/// The policy in force, for the API and the console.
fn policy_view(s: &ApiState) -> PolicyView {
    let policy = s.nms.policy();
    PolicyView {
        default: if policy.allow_by_default {
            "allow"
        } else {
            "deny"
        },
        groups: policy
            .groups
            .iter()
            .map(|g| GroupView {
                name: g.name.clone(),
                members: g.members.clone(),
            })
            .collect(),
        rules: (1..).map_while(|n| policy.numbered(n)).collect(),
        unresolved: s.nms.compiled().unresolved.clone(),
    }
}

/// A flow to judge.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowQuestion {
    /// Who opens: a registered name (`camera1.gw1.ovl.example`) or an address.
    pub from: String,
    /// To whom: the same.
    pub to: String,
    /// What: `tcp/PORT`, `udp/PORT` or `icmp`.
    pub service: String,
}

/// The answer to a dry run, with the addresses the ends stand for.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FlowAnswer {
    /// The verdict.
    #[serde(flatten)]
    pub verdict: crate::policy::Verdict,
    /// The address `from` stands for.
    pub src: String,
    /// The address `to` stands for.
    pub dst: String,
}

/// A dry run: may `from` open `service` to `to` under the policy in force, and by which rule.
#[utoipa::path(post, path = "/api/v1/policy/check", request_body = FlowQuestion,
    responses((status = 200, body = FlowAnswer), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn policy_check(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    body: Result<Json<FlowQuestion>, JsonRejection>,
) -> Answer<FlowAnswer> {
    caller.may(Scope::Read)?;
    let Json(q) = body?;
    Ok(Json(dry_run(&s, &q).await?))
}

/// Whether the flow `q` may start, for the API and the console.
async fn dry_run(s: &ApiState, q: &FlowQuestion) -> Result<FlowAnswer, ApiError> {
    let (proto, port) =
        cyphonic_filter::parse_flow(&q.service).map_err(|e| ApiError::invalid("service", e))?;
    let (src, dst) = crate::fleet::flow_ends(s.nms.store(), &q.from, &q.to).await?;
    let verdict = s
        .nms
        .policy()
        .verdict(&s.nms.compiled(), proto, src, dst, port);
    Ok(FlowAnswer {
        verdict,
        src: src.to_string(),
        dst: dst.to_string(),
    })
}

/// A rule in addresses, as a member enforces it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EnforcedRule {
    /// The rule's number.
    pub id: u32,
    /// Who may open.
    pub from: Vec<String>,
    /// To whom.
    pub to: Vec<String>,
    /// What: `any`, `tcp`, `udp`, `icmp`.
    pub proto: &'static str,
    /// Destination ports (TCP, UDP); empty: all.
    pub ports: Vec<String>,
}

/// What one member enforces.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MemberPolicy {
    /// Whether it enforces anything (`default = "deny"`).
    pub enforced: bool,
    /// The set's version, as the member's status shows it.
    pub version: Option<u64>,
    /// The rules that concern it.
    pub rules: Vec<EnforcedRule>,
}

/// The compiled rules one member receives: those whose `from` or `to` meets its blocks.
#[utoipa::path(get, path = "/api/v1/policy/{member}", params(("member" = String, Path, description = "The member's name")),
    responses((status = 200, body = MemberPolicy), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn member_policy(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    name: Result<Path<String>, PathRejection>,
) -> Answer<MemberPolicy> {
    caller.may(Scope::Read)?;
    let Path(name) = name?;
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let members = s.nms.store().members_named(&name).await?;
    // Its newest certificate's blocks (a renewal keeps them).
    let blocks = members
        .iter()
        .filter_map(|m| cyphonic_crypto::Certificate::from_pem(&m.client.certificate).ok())
        .max_by_key(|c| c.body().not_before)
        .map(|c| c.body().vip_blocks.clone())
        .ok_or_else(|| ApiError::not_found(format!("no member named {name}")))?;
    let set = s.nms.compiled().for_client(&blocks);
    let proto = |p: cyphonic_filter::Proto| match p {
        cyphonic_filter::Proto::Tcp => "tcp",
        cyphonic_filter::Proto::Udp => "udp",
        cyphonic_filter::Proto::Icmp => "icmp",
        cyphonic_filter::Proto::Any => "any",
    };
    Ok(Json(MemberPolicy {
        enforced: set.is_some(),
        version: set.as_ref().map(|s| s.version),
        rules: set
            .map(|set| {
                set.rules
                    .into_iter()
                    .map(|r| EnforcedRule {
                        id: r.id,
                        from: r.from.iter().map(ToString::to_string).collect(),
                        to: r.to.iter().map(ToString::to_string).collect(),
                        proto: proto(r.proto),
                        ports: r
                            .ports
                            .iter()
                            .map(|p| {
                                if p.start() == p.end() {
                                    p.start().to_string()
                                } else {
                                    format!("{}-{}", p.start(), p.end())
                                }
                            })
                            .collect(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }))
}
