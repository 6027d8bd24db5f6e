//! The web console (docs/protocol.md §8, The console): server-rendered pages (askama
//! templates compiled into the binary, `templates/`), one stylesheet and one small script
//! (`static/`), for people signed in with OpenID Connect. Reads come from the store as the
//! API's do; changes are plain HTML forms carrying the session's CSRF token, checked like
//! the API's header, and go through [`crate::admin`] like every other write.

mod access;
mod policy;

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::{ApiError, ApiState, Caller, now};
use crate::admin::{self, RevokeTarget, Scope, TokenRequest};
use crate::fleet::{MemberView, TokenView};
use crate::store::AuditQuery;

/// Certificates ending within this many seconds are flagged.
const ENDING_SOON: u64 = 14 * 86_400;

/// The console's routes, under `/console`.
pub(super) fn routes() -> axum::Router<Arc<ApiState>> {
    axum::Router::new()
        .route("/console", get(|| async { see_other("/console/") }))
        .route("/console/", get(fleet))
        .route("/console/signin", get(signin))
        .route("/console/members/{name}", get(member))
        .route("/console/members/{name}/revoke", post(revoke_member))
        .route("/console/tokens", get(tokens).post(make_token))
        .route("/console/tokens/{id}/revoke", post(revoke_token))
        .route("/console/audit", get(audit))
        .route("/console/policy", get(policy::policy))
        .route("/console/revocations", get(access::revocations))
        .route(
            "/console/api-tokens",
            get(access::api_tokens).post(access::make_api_token),
        )
        .route(
            "/console/api-tokens/{id}/revoke",
            post(access::revoke_api_token),
        )
        .route(
            "/console/style.css",
            get(|| async { asset("text/css", include_str!("../../static/style.css")) }),
        )
        .route(
            "/console/console.js",
            get(|| async { asset("text/javascript", include_str!("../../static/console.js")) }),
        )
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

pub(super) fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// A page that was read (`status`), or the error's page.
fn shown_page(p: &Person, shown: Result<impl Template, ApiError>, status: StatusCode) -> Response {
    shown.map_or_else(|e| error_page(Some(p.me()), e), |v| page(status, &v))
}

/// After a change from a form: the browser sent on to `to`, or the error's page.
fn changed(p: &Person, done: Result<(), ApiError>, to: &str) -> Response {
    match done {
        Ok(()) => see_other(to),
        Err(e) => error_page(Some(p.me()), e),
    }
}

/// A page: HTML, never cached, never framed, scripts and styles only from here.
fn page(status: StatusCode, t: &impl Template) -> Response {
    match t.render() {
        Ok(html) => {
            let mut r = (status, html).into_response();
            let h = r.headers_mut();
            for (k, v) in [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; style-src 'self'; script-src 'self'; \
                     img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
                ),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::REFERRER_POLICY, "same-origin"),
            ] {
                h.insert(k, HeaderValue::from_static(v));
            }
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "a console page could not be rendered");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The person signed in, as the pages show them.
pub(super) struct Me {
    name: String,
    role: String,
    csrf: String,
}

/// A signed-in person: without a session, the console sends the browser to sign in.
pub(super) struct Person(pub(super) Caller);

impl FromRequestParts<Arc<ApiState>> for Person {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        match super::auth::person(parts, state) {
            Ok(c) => Ok(Self(c)),
            Err(e) if e.status == StatusCode::UNAUTHORIZED => Err(see_other("/console/signin")),
            Err(e) => Err(error_page(None, e)),
        }
    }
}

impl Person {
    fn me(&self) -> Me {
        let row = self.0.session.as_ref().map(|s| &s.row);
        Me {
            name: row.map_or_else(String::new, |r| r.name.clone()),
            role: row.map_or_else(String::new, |r| r.role.clone()),
            csrf: row.map_or_else(String::new, |r| r.csrf.clone()),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    me: Option<Me>,
    page: &'static str,
    status: String,
    message: String,
}

/// An error as a page.
fn error_page(me: Option<Me>, e: ApiError) -> Response {
    let status = e.status;
    page(
        status,
        &ErrorPage {
            me,
            page: "",
            status: status.to_string(),
            message: e.body.error.message,
        },
    )
}

/// A form's CSRF token.
#[derive(Debug, Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    pub(super) csrf: String,
}

/// One row of the fleet.
struct MemberRow {
    name: String,
    /// Its certificates the registry knows (a renewal adds one).
    certificates: usize,
    not_after: u64,
    fingerprint: String,
    online: bool,
    revoked: bool,
    blocks: String,
    groups: String,
    ends: String,
    ending: bool,
    endpoint: String,
    agent: String,
    names: String,
}

/// A date as people read it, UTC to the minute.
fn when(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let s = httpdate::fmt_http_date(t);
    // "Sun, 06 Nov 1994 08:49:37 GMT" -> "06 Nov 1994 08:49"
    s.get(5..22).map_or(s.clone(), str::to_owned)
}

fn member_row(m: &MemberView, revoked: &std::collections::HashSet<String>, t: u64) -> MemberRow {
    MemberRow {
        name: m.name.clone(),
        certificates: 1,
        not_after: m.not_after,
        fingerprint: m.fingerprint.clone(),
        online: m.online,
        revoked: revoked.contains(&m.fingerprint),
        blocks: m.vip_blocks.join(", "),
        groups: m.groups.join(", "),
        ends: when(m.not_after),
        ending: m.not_after.saturating_sub(t) < ENDING_SOON,
        endpoint: m
            .observed
            .or_else(|| m.endpoints.first().copied())
            .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        agent: m.agent.clone().unwrap_or_else(|| "-".to_owned()),
        names: m
            .names
            .iter()
            .map(|n| n.name.clone())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Members of the fleet's page: certificates (a renewal leaves the old one in the registry
/// until it is removed) read from the store a page at a time.
const FLEET_PAGE: u32 = 200;

/// The fingerprints revoked.
async fn revoked(s: &ApiState) -> Result<std::collections::HashSet<String>, ApiError> {
    Ok(s.nms.store().revocations().await?.into_iter().collect())
}

/// One row a member, in order: the certificate in use (online), else its newest, with how
/// many the member has.
fn by_member(
    views: &[MemberView],
    revoked: &std::collections::HashSet<String>,
    t: u64,
) -> Vec<MemberRow> {
    let mut rows: Vec<MemberRow> = Vec::new();
    let rank = |r: &MemberRow| (r.online, !r.revoked, r.not_after);
    for r in views.iter().map(|m| member_row(m, revoked, t)) {
        match rows.last_mut() {
            Some(last) if last.name == r.name => {
                let n = last.certificates + 1;
                if rank(&r) > rank(last) {
                    *last = r;
                }
                last.certificates = n;
            }
            _ => rows.push(r),
        }
    }
    rows
}

#[derive(Template)]
#[template(path = "signin.html")]
struct SignIn {
    me: Option<Me>,
    page: &'static str,
}

async fn signin() -> Response {
    page(
        StatusCode::OK,
        &SignIn {
            me: None,
            page: "signin",
        },
    )
}

#[derive(Template)]
#[template(path = "fleet.html")]
struct Fleet {
    me: Option<Me>,
    page: &'static str,
    members: Vec<MemberRow>,
    online: usize,
    ending: usize,
    /// The next page's cursor, when there is one.
    next: Option<String>,
}

async fn fleet(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let shown = async {
        p.0.may(Scope::Read)?;
        let (mut views, more) =
            super::member_views(&s, q.get("after").map(String::as_str), FLEET_PAGE).await?;
        // With more to come, the page's last member may go on past it: it is left to the
        // next page, whole (unless it is all the page holds).
        if more
            && let Some(last) = views.last().map(|v| v.name.clone())
            && views.iter().any(|v| v.name != last)
        {
            views.retain(|v| v.name != last);
        }
        let next = views.last().filter(|_| more).map(super::member_cursor);
        let rows = by_member(&views, &revoked(&s).await?, now());
        Ok::<_, ApiError>(Fleet {
            me: Some(p.me()),
            page: "fleet",
            online: rows.iter().filter(|r| r.online && !r.revoked).count(),
            ending: rows.iter().filter(|r| r.ending && !r.revoked).count(),
            members: rows,
            next,
        })
    }
    .await;
    shown_page(&p, shown, StatusCode::OK)
}

#[derive(Template)]
#[template(path = "member.html")]
struct Member {
    me: Option<Me>,
    page: &'static str,
    name: String,
    certificates: Vec<MemberRow>,
    all_revoked: bool,
    may_write: bool,
    csrf: String,
    /// When its last report came, in words (none: it never reported).
    reported: Option<String>,
    devices: Vec<DeviceLine>,
    /// The cursor of the next page of devices.
    devices_next: Option<String>,
    tunnels: Vec<TunnelLine>,
    /// Its newest flow records, when it logs them.
    flows: Vec<FlowLine>,
}

/// Flow records a member page shows: the newest.
const MEMBER_FLOWS: u32 = 50;

/// A flow record as the member page shows it.
struct FlowLine {
    end: String,
    what: String,
    from: String,
    to: String,
    sent: String,
    received: String,
    why: String,
}

impl FlowLine {
    fn of(f: &crate::store::FlowRow) -> Self {
        let proto = match f.proto {
            Some(6) => "tcp".to_owned(),
            Some(17) => "udp".to_owned(),
            Some(1) => "icmp".to_owned(),
            Some(58) => "icmp6".to_owned(),
            Some(p) => format!("proto {p}"),
            None => String::new(),
        };
        let at = |a: &str, port: Option<u16>| match port {
            Some(p) if f.proto == Some(6) || f.proto == Some(17) => format!("{a}:{p}"),
            _ => a.to_owned(),
        };
        if f.kind == "refused" {
            return Self {
                end: when(f.end),
                what: "refused".to_owned(),
                from: f.src.clone(),
                to: format!("{} port(s)", f.ports.unwrap_or_default()),
                sent: format!("{} packet(s)", f.tx_packets),
                received: "-".to_owned(),
                why: format!("no rule ({})", f.dir),
            };
        }
        Self {
            end: when(f.end),
            what: proto,
            from: at(&f.src, f.sport),
            to: at(f.dst.as_deref().unwrap_or("-"), f.dport),
            sent: cyphonic_telemetry::status::bytes(f.tx_bytes),
            received: cyphonic_telemetry::status::bytes(f.rx_bytes),
            why: match f.rule {
                Some(0) | None => format!("allowed by default ({})", f.dir),
                Some(r) => format!("rule {r} ({})", f.dir),
            },
        }
    }
}

/// Devices a member page shows at once, and tunnels.
const MEMBER_PAGE: u32 = 200;

/// A device as the member page shows it.
struct DeviceLine {
    name: String,
    addresses: String,
    mac: String,
    kind: String,
    seen: String,
    sent: String,
    received: String,
}

impl DeviceLine {
    fn of(d: &crate::store::DeviceRow) -> Self {
        let mut addresses: Vec<&str> = d.vip.iter().chain(&d.vip6).map(String::as_str).collect();
        let legacy = d.legacy.as_ref().map(|l| format!("(fixed: {l})"));
        addresses.extend(legacy.as_deref());
        Self {
            name: d
                .name
                .clone()
                .or_else(|| d.hostname.clone())
                .unwrap_or_else(|| "-".to_owned()),
            addresses: addresses.join(" "),
            mac: d.mac.clone(),
            kind: d
                .vlan
                .map_or_else(|| d.kind.clone(), |v| format!("{} (VLAN {v})", d.kind)),
            seen: d.seen.map_or_else(|| "-".to_owned(), when),
            sent: cyphonic_telemetry::status::bytes(d.tx_bytes),
            received: cyphonic_telemetry::status::bytes(d.rx_bytes),
        }
    }
}

/// A tunnel as the member page shows it.
struct TunnelLine {
    peer: String,
    path: String,
    established: bool,
    handshake: String,
    sent: String,
    received: String,
}

impl TunnelLine {
    fn of(t: &crate::store::TunnelRow) -> Self {
        Self {
            peer: t.peer.clone(),
            path: t.reason.as_ref().map_or_else(
                || t.path.clone(),
                |r| format!("{} ({})", t.path, r.replace('_', " ")),
            ),
            established: t.established,
            handshake: t.handshake.map_or_else(|| "-".to_owned(), when),
            sent: cyphonic_telemetry::status::bytes(t.tx_bytes),
            received: cyphonic_telemetry::status::bytes(t.rx_bytes),
        }
    }
}

async fn member(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let shown = async {
        p.0.may(Scope::Read)?;
        let revoked = revoked(&s).await?;
        let t = now();
        let rows: Vec<MemberRow> = s
            .nms
            .store()
            .members_named(&name)
            .await?
            .iter()
            .map(|m| member_row(&MemberView::of(m), &revoked, t))
            .collect();
        if rows.is_empty() {
            return Err(ApiError::not_found(format!("no member {name}")));
        }
        let devices =
            super::reports::device_page(&s, &name, q.get("after").map(String::as_str), MEMBER_PAGE)
                .await?;
        let tunnels = super::reports::tunnel_page(&s, Some(&name), None, MEMBER_PAGE).await?;
        let me = p.me();
        Ok(Member {
            page: "fleet",
            all_revoked: rows.iter().all(|r| r.revoked),
            certificates: rows,
            may_write: p.0.scope >= Scope::Write,
            csrf: me.csrf.clone(),
            me: Some(me),
            name: name.clone(),
            reported: devices.reported_at.map(when),
            devices: devices.items.iter().map(DeviceLine::of).collect(),
            devices_next: devices.next,
            tunnels: tunnels.items.iter().map(TunnelLine::of).collect(),
            flows: s
                .nms
                .store()
                .flows_page(&crate::store::FlowQuery {
                    member: Some(name.trim_end_matches('.').to_ascii_lowercase()),
                    limit: MEMBER_FLOWS,
                    ..Default::default()
                })
                .await?
                .iter()
                .map(FlowLine::of)
                .collect(),
        })
    }
    .await;
    shown_page(&p, shown, StatusCode::OK)
}

/// A change from a console form: its CSRF token and origin checked, then the caller's
/// scope (a refusal recorded).
async fn may_change(
    s: &ApiState,
    p: &Person,
    form: &CsrfForm,
    action: &str,
    target: &str,
) -> Result<(), ApiError> {
    p.0.check_csrf(s, Some(&form.csrf))?;
    p.0.may_change(s, Scope::Write, action, target).await
}

async fn revoke_member(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Path(name): Path<String>,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    let done = async {
        may_change(&s, &p, &form, "member.revoke", &name).await?;
        admin::revoke_member(
            s.nms.store(),
            &RevokeTarget::Name(name.clone()),
            &p.0.who,
            now(),
        )
        .await?;
        Ok::<_, ApiError>(())
    }
    .await;
    changed(&p, done, &format!("/console/members/{name}"))
}

/// One row of the tokens' table.
struct TokenLine {
    id: String,
    name: String,
    blocks: String,
    groups: String,
    state: &'static str,
    made: String,
}

/// A token just made (enrollment or API), shown once.
struct Made {
    name: String,
    token: String,
}

#[derive(Template)]
#[template(path = "tokens.html")]
struct Tokens {
    me: Option<Me>,
    page: &'static str,
    tokens: Vec<TokenLine>,
    made: Option<Made>,
    may_write: bool,
    csrf: String,
}

async fn tokens_page(s: &ApiState, p: &Person, made: Option<Made>) -> Response {
    let shown = async {
        p.0.may(Scope::Read)?;
        let t = now();
        let tokens = s
            .nms
            .store()
            .tokens()
            .await?
            .into_iter()
            .map(|r| {
                let v = TokenView::of(r, t);
                TokenLine {
                    made: when(v.created_at),
                    blocks: v.vip_blocks.join(", "),
                    groups: v.groups.join(", "),
                    id: v.id,
                    name: v.name,
                    state: v.state,
                }
            })
            .collect();
        let me = p.me();
        Ok::<_, ApiError>(Tokens {
            page: "tokens",
            tokens,
            made,
            may_write: p.0.scope >= Scope::Write,
            csrf: me.csrf.clone(),
            me: Some(me),
        })
    }
    .await;
    // A token made and shown is a page created.
    let status = match &shown {
        Ok(t) if t.made.is_some() => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    shown_page(p, shown, status)
}

async fn tokens(State(s): State<Arc<ApiState>>, p: Person) -> Response {
    tokens_page(&s, &p, None).await
}

/// The token form: a name, a prefix to allocate, groups separated by commas.
#[derive(Debug, Deserialize)]
pub(super) struct TokenForm {
    #[serde(default)]
    csrf: String,
    name: String,
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    groups: String,
}

async fn make_token(
    State(s): State<Arc<ApiState>>,
    p: Person,
    axum::Form(form): axum::Form<TokenForm>,
) -> Response {
    let made = async {
        let csrf = CsrfForm {
            csrf: form.csrf.clone(),
        };
        may_change(&s, &p, &csrf, "enrollment_token.create", "").await?;
        let prefix = match form.prefix.trim() {
            "" => None,
            p => Some(p.parse::<u8>().map_err(|_| {
                ApiError::invalid("prefix", format!("{p:?} is not a prefix length"))
            })?),
        };
        let req = TokenRequest {
            name: form.name.trim().to_owned(),
            vip_blocks: Vec::new(),
            prefix,
            prefix6: None,
            groups: form
                .groups
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_owned)
                .collect(),
            lifetime: None,
            expires: crate::enroll::TOKEN_EXPIRY,
            replace: false,
        };
        let (row, token) =
            admin::create_token(s.nms.store(), s.nms.issuer(), &req, &p.0.who, now()).await?;
        Ok::<_, ApiError>(Made {
            name: row.name,
            token: token.to_string(),
        })
    }
    .await;
    match made {
        Ok(m) => tokens_page(&s, &p, Some(m)).await,
        Err(e) => error_page(Some(p.me()), e),
    }
}

async fn revoke_token(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    let done = async {
        may_change(&s, &p, &form, "enrollment_token.revoke", &id).await?;
        admin::revoke_token(s.nms.store(), &id, &p.0.who, now()).await?;
        Ok::<_, ApiError>(())
    }
    .await;
    changed(&p, done, "/console/tokens")
}

/// One row of the audit log as shown.
struct AuditLine {
    when: String,
    actor: String,
    source: String,
    action: String,
    target: String,
    result: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct Audit {
    me: Option<Me>,
    page: &'static str,
    entries: Vec<AuditLine>,
    action: String,
}

async fn audit(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let action = q.get("action").map_or("", |a| a.trim()).to_owned();
    let shown = async {
        p.0.may(Scope::Read)?;
        let entries = s
            .nms
            .store()
            .audit_log(&AuditQuery {
                action: (!action.is_empty()).then(|| action.clone()),
                limit: 200,
                ..AuditQuery::default()
            })
            .await?
            .into_iter()
            .map(|e| AuditLine {
                when: when(e.at / 1000),
                actor: e.actor,
                source: e.source,
                action: e.action,
                target: e.target,
                result: e.result,
            })
            .collect();
        Ok::<_, ApiError>(Audit {
            me: Some(p.me()),
            page: "audit",
            entries,
            action: action.clone(),
        })
    }
    .await;
    shown_page(&p, shown, StatusCode::OK)
}
