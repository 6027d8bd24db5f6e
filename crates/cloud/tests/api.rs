//! The HTTP API in process (docs/protocol.md §8): every endpoint under every scope, bad
//! tokens, bad input, pages, and the audit log each write leaves, against a real cloud on
//! loopback with its SQLite store.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use cyphonic_cloud::admin::{self, Scope, Who};
use cyphonic_cloud::api::{ApiState, router};
use cyphonic_cloud::store::AuditQuery;
use cyphonic_cloud::{Policy, Store};
use cyphonic_signal::testing::{Pki, now};
use serde_json::{Value, json};
use tower::ServiceExt as _;

mod common;
use common::{cli, config};

struct Bed {
    running: cyphonic_cloud::Running,
    app: axum::Router,
    state: Arc<ApiState>,
    pki: Pki,
    /// A token of each scope.
    read: String,
    write: String,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Bed {
    async fn new() -> Self {
        Self::with(Policy::default()).await
    }

    async fn with(policy: Policy) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new();
        let config = config(dir.path(), &pki, policy, 365);
        let running = cyphonic_cloud::start(config).await.unwrap();
        let store = running.nms.store().clone();
        let mut tokens = Vec::new();
        for scope in [Scope::Read, Scope::Write, Scope::Admin] {
            let (_, t) =
                admin::create_api_token(&store, scope.as_str(), scope, None, &Who::cli(), now())
                    .await
                    .unwrap();
            tokens.push(t.to_string());
        }
        let state = ApiState::new(running.nms.clone()).await.unwrap();
        let [read, write, admin] = tokens.try_into().unwrap();
        Self {
            app: router(state.clone()),
            state,
            running,
            pki,
            read,
            write,
            admin,
            _dir: dir,
        }
    }

    fn store(&self) -> &Store {
        self.running.nms.store()
    }

    /// A new token of `scope`, known to the API at once: a fresh rate for each step of a
    /// test that makes more writes than one token's burst.
    async fn fresh(&self, scope: Scope) -> String {
        let (_, t) =
            admin::create_api_token(self.store(), "fresh", scope, None, &Who::cli(), now())
                .await
                .unwrap();
        self.state.refresh().await.unwrap();
        t.to_string()
    }

    /// A member `name` with `block`, as the registry knows one that was issued a
    /// certificate.
    async fn member(&self, name: &str, block: &str) -> String {
        common::member(self.store(), &self.pki, name, block).await
    }

    /// `method path` with `token` (none: no Authorization) and a JSON `body`: the status
    /// and the JSON answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {bytes:?}"));
        (status, value)
    }

    async fn get(&self, path: &str, token: &str) -> Value {
        let (status, v) = self.call(Method::GET, path, Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {v}");
        v
    }

    async fn audit(&self, action: &str) -> Vec<cyphonic_cloud::store::AuditEntry> {
        common::audit(self.store(), action).await
    }

    /// Every item of the list at `path` (ending in `?` or `&`), asked `size` at a time;
    /// more than `most` is an error (a list that never ends).
    async fn walk(&self, path: &str, size: usize, most: usize) -> Vec<Value> {
        let mut seen = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let path = match &next {
                None => format!("{path}limit={size}"),
                Some(c) => format!("{path}limit={size}&after={c}"),
            };
            let page = self.get(&path, &self.read).await;
            let items = page["items"].as_array().unwrap();
            assert!(items.len() <= size, "{path}: {page}");
            assert!(seen.len() < most, "{path}: past the end: {page}");
            seen.extend(items.iter().cloned());
            match page["next"].as_str() {
                Some(c) => next = Some(c.to_owned()),
                None => return seen,
            }
        }
    }

    /// The member of `id` with a control session open, as its session would record it:
    /// its fingerprint.
    async fn online(&self, id: &cyphonic_session::Identity) -> String {
        let name = &id.certificate().body().name;
        let cert = id.certificate();
        let fp = cert.fingerprint().to_string();
        self.store()
            .client_online(
                &fp,
                (name, &hex::encode(cert.body().issuer)),
                (&cert.to_pem(), &cert.body().vip_blocks),
                "test",
            )
            .await
            .unwrap();
        fp
    }
}

fn code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

/// Every endpoint answers 401 without a valid token and 403 below its scope (a refused
/// write recorded, nothing changed), and answers at its scope and above.
#[tokio::test]
async fn every_endpoint_needs_its_scope() {
    let bed = Bed::new().await;
    bed.member("cam1.gw1.ovl.example", "100.64.1.0/24").await;
    let token_body = r#"{"name": "gw9.ovl.example", "prefix": 24}"#;
    let api_token_body = r#"{"name": "grafana", "scope": "read"}"#;
    let check_body = r#"{"from": "100.64.1.2", "to": "100.64.1.3", "service": "icmp"}"#;
    let fingerprint_body = format!(r#"{{"fingerprint": "{}"}}"#, "ab".repeat(32));
    // (method, path, body, scope needed, status when allowed)
    let endpoints: &[(Method, &str, Option<&str>, Scope, StatusCode)] = &[
        (
            Method::GET,
            "/api/v1/members",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/members/cam1.gw1.ovl.example",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/members/cam1.gw1.ovl.example/devices",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/tunnels",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/flows",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/enrollment-tokens",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/revocations",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/audit",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/policy",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/policy/cam1.gw1.ovl.example",
            None,
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::POST,
            "/api/v1/policy/check",
            Some(check_body),
            Scope::Read,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/api/v1/api-tokens",
            None,
            Scope::Admin,
            StatusCode::OK,
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(token_body),
            Scope::Write,
            StatusCode::CREATED,
        ),
        (
            Method::POST,
            "/api/v1/api-tokens",
            Some(api_token_body),
            Scope::Admin,
            StatusCode::CREATED,
        ),
        (
            Method::POST,
            "/api/v1/members/cam1.gw1.ovl.example/revoke",
            None,
            Scope::Write,
            StatusCode::OK,
        ),
        (
            Method::POST,
            "/api/v1/revocations",
            Some(fingerprint_body.as_str()),
            Scope::Write,
            StatusCode::OK,
        ),
        (
            Method::DELETE,
            "/api/v1/members/cam1.gw1.ovl.example",
            None,
            Scope::Write,
            StatusCode::OK,
        ),
    ];
    let bad = [
        None,
        Some("cyk_0123"),
        Some(
            "cyk_0123456789abcdef_0000000000000000000000000000000000000000000000000000000000000000",
        ),
        // A real token's id with another secret.
        Some(&*format!(
            "{}{}",
            &bed.admin[..bed.admin.len() - 1],
            if bed.admin.ends_with('0') { '1' } else { '0' }
        )),
    ];
    for (method, path, body, needs, ok) in endpoints {
        for token in bad {
            let (status, v) = bed.call(method.clone(), path, token, *body).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {token:?}: {v}"
            );
            assert_eq!(code(&v), "unauthorized");
        }
        for (scope, token) in [
            (Scope::Read, &bed.read),
            (Scope::Write, &bed.write),
            (Scope::Admin, &bed.admin),
        ] {
            if scope >= *needs {
                continue;
            }
            let before = bed.store().tokens().await.unwrap().len();
            let (status, v) = bed.call(method.clone(), path, Some(token), *body).await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{method} {path} as {scope}: {v}"
            );
            assert_eq!(code(&v), "forbidden");
            assert_eq!(bed.store().tokens().await.unwrap().len(), before);
        }
        // Allowed at its scope, and (for reads) above it.
        let (status, v) = bed
            .call(
                method.clone(),
                path,
                Some(match needs {
                    Scope::Read => &bed.read,
                    Scope::Write => &bed.write,
                    Scope::Admin => &bed.admin,
                }),
                *body,
            )
            .await;
        assert_eq!(status, *ok, "{method} {path} as {needs}: {v}");
    }
    // The member was revoked, one more certificate by its fingerprint, the member
    // forgotten; the refusals recorded.
    assert_eq!(
        bed.store().revocation_rows().await.unwrap().len(),
        2,
        "two certificates revoked"
    );
    assert!(bed.store().members().await.unwrap().is_empty());
    let removed = bed.audit("member.remove").await;
    assert!(
        removed
            .iter()
            .any(|e| e.result == "ok" && e.actor.ends_with(" write")),
        "{removed:?}"
    );
    let refused = bed.audit("member.revoke").await;
    assert!(
        refused
            .iter()
            .any(|e| e.result == "forbidden" && e.actor.ends_with(" read")),
        "{refused:?}"
    );
    let done: Vec<_> = refused
        .iter()
        .filter(|e| e.result == "ok" && e.target.starts_with("cam1"))
        .collect();
    assert_eq!(done.len(), 1, "{refused:?}");
    assert!(done[0].actor.starts_with("token:") && done[0].actor.ends_with(" write"));
    assert_eq!(done[0].target, "cam1.gw1.ovl.example");
    assert_eq!(done[0].source, "local");
}

/// A token revoked or past its end is refused at once on this instance; the answer is the
/// same as for a token never made.
#[tokio::test]
async fn revoked_and_expired_tokens_are_refused() {
    let bed = Bed::new().await;
    let store = bed.store();
    let (_, short) =
        admin::create_api_token(store, "short", Scope::Read, Some(1), &Who::cli(), now() - 5)
            .await
            .unwrap();
    bed.state.refresh().await.unwrap();
    let (status, v) = bed
        .call(
            Method::GET,
            "/api/v1/members",
            Some(&short.to_string()),
            None,
        )
        .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );

    let (status, made) = bed
        .call(
            Method::POST,
            "/api/v1/api-tokens",
            Some(&bed.admin),
            Some(r#"{"name": "ci", "scope": "write"}"#),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let ci = made["token"].as_str().unwrap().to_owned();
    assert_eq!(bed.get("/api/v1/members", &ci).await["items"], json!([]));
    let id = made["item"]["id"].as_str().unwrap();
    let (status, v) = bed
        .call(
            Method::DELETE,
            &format!("/api/v1/api-tokens/{id}"),
            Some(&bed.admin),
            None,
        )
        .await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"was_live": true})));
    let (status, v) = bed
        .call(Method::GET, "/api/v1/members", Some(&ci), None)
        .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    // The list shows it revoked, and never a secret.
    let list = bed.get("/api/v1/api-tokens", &bed.admin).await;
    let shown = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap();
    assert_eq!(shown["state"], "revoked");
    assert!(!list.to_string().contains(&ci[21..]), "a secret in {list}");
    assert_eq!(bed.audit("api_token.revoke").await.len(), 1);
}

/// Bad input gets a JSON error naming the input, and changes nothing but the audit log.
#[tokio::test]
async fn bad_input_is_refused_with_a_clear_error_and_changes_nothing() {
    let bed = Bed::new().await;
    // (method, path, body, status, code, field)
    type Case<'a> = (
        Method,
        &'a str,
        Option<&'a str>,
        StatusCode,
        &'a str,
        Option<&'a str>,
    );
    let cases: &[Case<'_>] = &[
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some("{"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("body"),
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(r#"{"name": "gw9.ovl.example", "prefix": 24, "colour": 1}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("body"),
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(r#"{"name": "gw9.elsewhere.example", "prefix": 24}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("name"),
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(r#"{"name": "gw9.ovl.example"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("prefix"),
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(r#"{"name": "gw9.ovl.example", "prefix": 24, "expires": 0}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("expires"),
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(r#"{"name": "gw9.ovl.example", "vip_blocks": ["10.0.0.0/24"]}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("vip_blocks"),
        ),
        (
            Method::POST,
            "/api/v1/api-tokens",
            Some(r#"{"name": "", "scope": "read"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("name"),
        ),
        (
            Method::POST,
            "/api/v1/api-tokens",
            Some(r#"{"name": "x", "scope": "root"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("body"),
        ),
        (
            Method::GET,
            "/api/v1/members?limit=0",
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("limit"),
        ),
        (
            Method::GET,
            "/api/v1/members?limit=501",
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("limit"),
        ),
        (
            Method::GET,
            "/api/v1/members?limit=x",
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("query"),
        ),
        (
            Method::GET,
            "/api/v1/members?after=zz",
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("after"),
        ),
        (
            Method::GET,
            "/api/v1/audit?after=00",
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("after"),
        ),
        (
            Method::GET,
            "/api/v1/members?sort=name",
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("query"),
        ),
        (
            Method::GET,
            "/api/v1/members/nobody.ovl.example",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            Method::POST,
            "/api/v1/members/nobody.ovl.example/revoke",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            Method::DELETE,
            "/api/v1/enrollment-tokens/0123456789abcdef",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            Method::DELETE,
            "/api/v1/api-tokens/0123456789abcdef",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            Method::GET,
            "/api/v1/nothing",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            Method::PUT,
            "/api/v1/members",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            None,
        ),
    ];
    let body = "x".repeat(cyphonic_cloud::api::MAX_BODY + 1);
    let too_big = (
        Method::POST,
        "/api/v1/enrollment-tokens",
        Some(body.as_str()),
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        Some("body"),
    );
    for (method, path, body, status, want, field) in cases.iter().chain([&too_big]) {
        let token = bed.fresh(Scope::Admin).await;
        let before = (
            bed.store().tokens().await.unwrap(),
            bed.store().api_tokens().await.unwrap(),
            bed.store().revocation_rows().await.unwrap(),
        );
        let (got, v) = bed.call(method.clone(), path, Some(&token), *body).await;
        assert_eq!(got, *status, "{method} {path}: {v}");
        assert_eq!(code(&v), *want, "{method} {path}: {v}");
        assert_eq!(v["error"]["field"].as_str(), *field, "{method} {path}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
        let after = (
            bed.store().tokens().await.unwrap(),
            bed.store().api_tokens().await.unwrap(),
            bed.store().revocation_rows().await.unwrap(),
        );
        assert_eq!(before, after, "{method} {path} changed the registry");
    }
    // Refusals past the input's shape are in the audit log, with their codes.
    let refused: Vec<String> = bed
        .audit("enrollment_token.create")
        .await
        .iter()
        .map(|e| e.result.clone())
        .collect();
    assert_eq!(refused, ["invalid"; 4], "name, prefix, expires and blocks");
}

/// An enrollment token made through the API is stored hashed, listed without its secret,
/// refused a second time for the same name, revoked, and each step is in the audit log.
#[tokio::test]
async fn an_enrollment_token_is_made_listed_and_revoked() {
    let bed = Bed::new().await;
    let (status, made) = bed
        .call(
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(&bed.write),
            Some(r#"{"name": "GW9.ovl.example.", "prefix": 24, "groups": ["sites"]}"#),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let token = made["token"].as_str().unwrap();
    let parsed = cyphonic_cloud::enroll::Token::parse(token).unwrap();
    let row = bed.store().token(&parsed.id).await.unwrap().unwrap();
    assert_eq!(row.secret_sha256, parsed.secret_sha256());
    assert_eq!(row.name, "gw9.ovl.example");
    assert_eq!(made["item"]["vip_blocks"], json!(["100.64.128.0/24"]));
    assert_eq!(made["item"]["state"], "live");
    let list = bed.get("/api/v1/enrollment-tokens", &bed.read).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(
        !list.to_string().contains(&token[17..]),
        "a secret in {list}"
    );

    let (status, v) = bed
        .call(
            Method::POST,
            "/api/v1/enrollment-tokens",
            Some(&bed.write),
            Some(r#"{"name": "gw9.ovl.example", "prefix": 24}"#),
        )
        .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::CONFLICT, "conflict"),
        "{v}"
    );

    let path = format!("/api/v1/enrollment-tokens/{}", parsed.id);
    let (status, v) = bed
        .call(Method::DELETE, &path, Some(&bed.write), None)
        .await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"was_live": true})));
    let (status, v) = bed
        .call(Method::DELETE, &path, Some(&bed.write), None)
        .await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"was_live": false})));
    assert_eq!(
        bed.get("/api/v1/enrollment-tokens", &bed.read).await["items"][0]["state"],
        "revoked"
    );

    let log = bed
        .get("/api/v1/audit?action=enrollment_token.create", &bed.read)
        .await;
    let results: Vec<&str> = log["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["conflict", "ok"], "newest first: {log}");
    assert_eq!(log["items"][1]["target"], "gw9.ovl.example");
    assert_eq!(log["items"][1]["details"]["id"], json!(parsed.id));
    let revokes = bed.audit("enrollment_token.revoke").await;
    assert_eq!(revokes.len(), 2);
    assert!(
        revokes
            .iter()
            .all(|e| e.result == "ok" && e.target == parsed.id)
    );
}

/// Lists come in pages: every item once, in order, whatever the page size.
#[tokio::test]
async fn lists_come_in_pages_that_cover_every_item_once() {
    let bed = Bed::new().await;
    let mut fps = Vec::new();
    for i in 0..7 {
        fps.push(
            bed.member(&format!("gw{i}.ovl.example"), &format!("100.64.{i}.0/24"))
                .await,
        );
    }
    for fp in &fps {
        admin::revoke_member(
            bed.store(),
            &admin::RevokeTarget::Fingerprint(fp.clone()),
            &Who::cli(),
            now(),
        )
        .await
        .unwrap();
    }
    for list in ["members", "revocations", "audit"] {
        let all = bed
            .get(&format!("/api/v1/{list}?limit=500"), &bed.read)
            .await;
        let all = all["items"].as_array().unwrap().clone();
        assert!(all.len() >= 7, "{list}: {all:?}");
        for size in [1, 2, 3, 7] {
            let seen = bed.walk(&format!("/api/v1/{list}?"), size, all.len()).await;
            assert_eq!(seen, all, "{list} in pages of {size}");
        }
    }
    let first = bed.get("/api/v1/members?limit=1", &bed.read).await;
    assert_eq!(first["items"][0]["name"], "gw0.ovl.example");
    assert_eq!(first["items"][0]["groups"], json!(["cameras"]));
}

/// A member's devices come a page at a time from its last report, with when it came; the
/// tunnels listed are those members online reported, all or one member's; an unknown
/// member, or a cursor the list did not give, is refused.
#[tokio::test]
async fn devices_and_tunnels_come_from_the_members_reports() {
    use cyphonic_control::report::Report;
    use cyphonic_control::{DeviceKind, DeviceReport, Mac, TunnelPath, TunnelReport};
    let bed = Bed::new().await;
    let store = bed.store();
    let gw1 = bed
        .online(&bed.pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]))
        .await;
    let gw2_id = bed.pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let gw2 = bed.online(&gw2_id).await;
    store.client_offline(&gw2).await.unwrap();
    bed.member("gw3.ovl.example", "100.64.3.0/24").await;
    let device = |i: u8| DeviceReport {
        mac: Mac([2, 0, 0, 0, 1, i]),
        vip: Some(std::net::Ipv4Addr::new(100, 64, 1, i)),
        vip6: i
            .is_multiple_of(2)
            .then(|| format!("fd7a:0:1::{i:x}").parse().unwrap()),
        legacy: None,
        name: Some(format!("d{i}.gw1.ovl.example")),
        hostname: None,
        kind: DeviceKind::Lease,
        expires: None,
        vlan: Some(20),
        seen: Some(1_795_000_000 + u64::from(i)),
        tx_bytes: u64::from(i) * 1000,
        tx_packets: u64::from(i),
        rx_bytes: 5,
        rx_packets: 1,
    };
    let tunnel = |peer: &str, name: &str| TunnelReport {
        peer: peer.to_owned(),
        name: name.to_owned(),
        path: TunnelPath::Direct,
        reason: None,
        endpoint: Some("198.51.100.2:51820".parse().unwrap()),
        established: true,
        handshake: Some(1_795_000_000),
        tx_bytes: 1,
        rx_bytes: 2,
    };
    let report = Report {
        devices: (60..120).map(device).collect(),
        tunnels: vec![tunnel(&gw2, "gw2.ovl.example")],
    };
    store
        .keep_report(&gw1, &report, 1_795_000_100)
        .await
        .unwrap();
    // gw2 reported, but its session is not open: its tunnels are not listed.
    let from_gw2 = Report {
        devices: vec![],
        tunnels: vec![tunnel(&gw1, "gw1.ovl.example")],
    };
    store
        .keep_report(&gw2, &from_gw2, 1_795_000_200)
        .await
        .unwrap();

    let page = bed
        .get("/api/v1/members/gw1.ovl.example/devices?limit=2", &bed.read)
        .await;
    assert_eq!(page["fingerprint"], gw1);
    assert_eq!(page["reported_at"], 1_795_000_100);
    assert_eq!(page["items"][0]["address"], "100.64.1.60");
    assert_eq!(page["items"][0]["vip6"], "fd7a:0:1::3c");
    assert_eq!(page["items"][0]["tx_bytes"], 60_000);
    assert_eq!(page["items"][0]["vlan"], 20);
    assert_eq!(page["items"][1]["vip6"], Value::Null);
    // Every device once, by address as numbers (.99 before .100).
    let expected: Vec<_> = (60..120).map(|i| json!(format!("100.64.1.{i}"))).collect();
    for size in [1, 7, 500] {
        let all = bed
            .walk("/api/v1/members/gw1.ovl.example/devices?", size, 60)
            .await;
        let addresses: Vec<_> = all.iter().map(|d| d["address"].clone()).collect();
        assert_eq!(addresses, expected, "pages of {size}");
    }
    let none = bed
        .get("/api/v1/members/gw3.ovl.example/devices", &bed.read)
        .await;
    assert_eq!(
        (none["items"].clone(), none["reported_at"].clone()),
        (json!([]), Value::Null)
    );
    let (status, v) = bed
        .call(
            Method::GET,
            "/api/v1/members/gw9.ovl.example/devices",
            Some(&bed.read),
            None,
        )
        .await;
    assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, "not_found"));

    let tunnels = bed.get("/api/v1/tunnels", &bed.read).await;
    assert_eq!(tunnels["items"].as_array().unwrap().len(), 1, "{tunnels}");
    assert_eq!(tunnels["items"][0]["member"], "gw1.ovl.example");
    assert_eq!(tunnels["items"][0]["peer"], "gw2.ovl.example");
    assert_eq!(tunnels["items"][0]["peer_fingerprint"], gw2);
    assert_eq!(tunnels["items"][0]["reported_at"], 1_795_000_100);
    // gw2 comes online and reports: both ends of the pair are listed, each once.
    bed.online(&gw2_id).await;
    store
        .keep_report(&gw2, &from_gw2, 1_795_000_300)
        .await
        .unwrap();
    let both = bed.walk("/api/v1/tunnels?", 1, 2).await;
    let members: Vec<_> = both.iter().map(|t| t["member"].clone()).collect();
    assert_eq!(
        members,
        [json!("gw1.ovl.example"), json!("gw2.ovl.example")]
    );
    let one = bed
        .get("/api/v1/tunnels?member=gw2.ovl.example", &bed.read)
        .await;
    assert_eq!(one["items"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["items"][0]["peer"], "gw1.ovl.example");
    // gw2's session ends: its tunnels go.
    store.client_offline(&gw2).await.unwrap();
    let left = bed.get("/api/v1/tunnels", &bed.read).await;
    assert_eq!(left["items"].as_array().unwrap().len(), 1, "{left}");

    for path in [
        "/api/v1/tunnels?after=zz",
        "/api/v1/tunnels?after=6162",
        "/api/v1/members/gw1.ovl.example/devices?after=zz",
        "/api/v1/tunnels?limit=0",
        "/api/v1/tunnels?colour=red",
    ] {
        let (status, v) = bed.call(Method::GET, path, Some(&bed.read), None).await;
        assert_eq!(
            (status, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            "{path}"
        );
    }
}

/// Flow records come newest first, a page at a time, filtered by member, address and time;
/// a filter that does not read is refused.
#[tokio::test]
async fn flow_records_come_newest_first_filtered_and_paged() {
    use cyphonic_control::{FlowDir, FlowRecord};
    let bed = Bed::new().await;
    let flow = |i: u64| FlowRecord {
        proto: 17,
        src: format!("100.64.1.{}", 10 + i % 3).parse().unwrap(),
        sport: 5000,
        dst: "100.64.2.10".parse().unwrap(),
        dport: 53,
        dir: FlowDir::Out,
        start: 1_795_000_000 + i,
        end: 1_795_000_100 + i / 2,
        tx_bytes: i,
        tx_packets: 1,
        rx_bytes: 0,
        rx_packets: 0,
        rule: 1,
    };
    let store = bed.store();
    let ones: Vec<_> = (0..30).map(flow).collect();
    store
        .keep_flows(("aa", "gw1.ovl.example"), &ones, &[])
        .await
        .unwrap();
    let twos: Vec<_> = (100..105).map(flow).collect();
    store
        .keep_flows(("bb", "gw2.ovl.example"), &twos, &[])
        .await
        .unwrap();
    let all = bed.walk("/api/v1/flows?", 500, 35).await;
    assert_eq!(all.len(), 35);
    let ends: Vec<u64> = all.iter().map(|f| f["end"].as_u64().unwrap()).collect();
    assert!(
        ends.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {ends:?}"
    );
    for size in [1, 4, 7] {
        assert_eq!(
            bed.walk("/api/v1/flows?", size, 35).await,
            all,
            "pages of {size}"
        );
    }
    let of = |path: &str| {
        let path = path.to_owned();
        let bed = &bed;
        async move { bed.walk(&path, 500, 35).await }
    };
    assert_eq!(of("/api/v1/flows?member=gw2.ovl.example&").await.len(), 5);
    let at = of("/api/v1/flows?address=100.64.1.11&").await;
    assert_eq!(at.len(), 10 + 2, "{at:?}");
    assert!(at.iter().all(|f| f["src"] == "100.64.1.11"));
    assert_eq!(of("/api/v1/flows?address=100.64.2.10&").await.len(), 35);
    let window = of("/api/v1/flows?since=1795000101&until=1795000102&").await;
    assert_eq!(window.len(), 4, "{window:?}");
    for path in [
        "/api/v1/flows?address=nope",
        "/api/v1/flows?after=zz",
        "/api/v1/flows?since=yesterday",
        "/api/v1/flows?limit=501",
    ] {
        let (status, v) = bed.call(Method::GET, path, Some(&bed.read), None).await;
        assert_eq!(
            (status, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            "{path}"
        );
    }
}

/// The OpenAPI description is served without a token and names every route.
#[tokio::test]
async fn the_openapi_description_names_every_route() {
    let bed = Bed::new().await;
    let (status, doc) = bed
        .call(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/api/v1/members", "get"),
        ("/api/v1/members/{name}", "get"),
        ("/api/v1/members/{name}/revoke", "post"),
        ("/api/v1/enrollment-tokens", "get"),
        ("/api/v1/enrollment-tokens", "post"),
        ("/api/v1/enrollment-tokens/{id}", "delete"),
        ("/api/v1/revocations", "get"),
        ("/api/v1/api-tokens", "get"),
        ("/api/v1/api-tokens", "post"),
        ("/api/v1/api-tokens/{id}", "delete"),
        ("/api/v1/audit", "get"),
        ("/api/v1/policy", "get"),
        ("/api/v1/policy/check", "post"),
        ("/api/v1/policy/{member}", "get"),
        ("/api/v1/session", "get"),
        ("/api/v1/members/{name}/devices", "get"),
        ("/api/v1/tunnels", "get"),
        ("/api/v1/flows", "get"),
    ] {
        assert!(paths[path][method].is_object(), "{method} {path} missing");
    }
    assert_eq!(paths.len(), 16, "{:?}", paths.keys());
    // Valid against the OpenAPI Initiative's schema of 3.1 documents (tests/data, from
    // openapi-spec-validator 0.9.0, Apache-2.0).
    let schema: Value = serde_json::from_str(include_str!("data/openapi-3.1.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    // And the check has teeth: a document without its info is refused.
    let mut broken = doc.clone();
    broken.as_object_mut().unwrap().remove("info");
    assert!(!validator.is_valid(&broken));
}

/// A `cyphonic-cloud serve` this test started, ended by PID when dropped.
struct Served(std::process::Child);

impl Served {
    /// `cyphonic-cloud run --config CONFIG`, started.
    fn start(config: &str) -> Self {
        Self(
            std::process::Command::new(env!("CARGO_BIN_EXE_cyphonic-cloud"))
                .args(["run", "--config", config])
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    /// [`Served::start`], once the API at `api` takes connections (within 30 s).
    fn listening(config: &str, api: SocketAddr) -> Self {
        let served = Self::start(config);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(api).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the API never listened"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        served
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cloud's file in `d` (its key, a CA, a SQLite store, free loopback ports, the relay
/// off), its `[api]` listening with `api_extra` lines added: the file's path and the API's
/// address.
fn binary_config(d: &std::path::Path, api_extra: &str) -> (String, SocketAddr) {
    let path = |f: &str| d.join(f).display().to_string();
    cli(&["keygen", "--out", &path("cloud.key")]);
    cli(&[
        "ca",
        "init",
        "--dir",
        &path("ca"),
        "--domain",
        "ovl.example",
    ]);
    let api = SocketAddr::from(([127, 0, 0, 1], free_port(false)));
    let config = path("cloud.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{}\"\nprobe_listen = \"127.0.0.1:{}\"\n\
             probe_listen_alt = \"127.0.0.1:{}\"\nkey = \"cloud.key\"\nca = \"ca/ca.crt\"\n\
             database = \"sqlite://{}\"\nstatus_socket = \"cloud.sock\"\n\
             [relay]\nenabled = false\n[api]\nlisten = \"{api}\"\n{api_extra}",
            free_port(false),
            free_port(true),
            free_port(true),
            path("cloud.db"),
        ),
    )
    .unwrap();
    (config, api)
}

/// A port on loopback that was free a moment ago.
fn free_port(udp: bool) -> u16 {
    if udp {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    } else {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }
}

/// One HTTP/1.1 request to `addr` over TCP: the status and the JSON body.
fn http(addr: SocketAddr, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// `cyphonic-cloud ARGS`: its exit status and what it said on stderr.
fn cli_fails(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cyphonic-cloud"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The API tokens' names in the store `config` names.
fn api_token_names(config: &str) -> Vec<String> {
    cli(&["api-token", "list", "--config", config])
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
        .collect()
}

/// The command line's changes go through the running cloud's admin socket: a file naming
/// another store but the same socket changes the running cloud's store, not its own, as
/// `cli:<user>` from `local`; `revoke --fingerprint` and `members remove` take the same
/// road, and the cloud's refusal is the command's error. Once the cloud stops, the same
/// command changes the file's own store.
#[test]
fn the_command_line_changes_the_registry_through_the_running_cloud() {
    let dir = tempfile::tempdir().unwrap();
    let (config, api) = binary_config(dir.path(), "");
    // The same cloud's socket (beside status_socket), another store.
    let other = dir.path().join("other.toml").display().to_string();
    let text = std::fs::read_to_string(&config).unwrap();
    let db = dir.path().join("cloud.db").display().to_string();
    std::fs::write(
        &other,
        text.replace(&db, &dir.path().join("other.db").display().to_string()),
    )
    .unwrap();
    let served = Served::listening(&config, api);
    let made = cli(&[
        "api-token",
        "create",
        "--config",
        &other,
        "--name",
        "through",
        "--scope",
        "read",
    ]);
    assert!(made.contains("cyk_"), "{made}");
    assert_eq!(api_token_names(&config), ["through"]);
    assert!(api_token_names(&other).is_empty());
    let log: Vec<Value> =
        serde_json::from_str(&cli(&["audit", "--config", &config, "--json"])).unwrap();
    let row = log
        .iter()
        .find(|e| e["action"] == "api_token.create")
        .unwrap_or_else(|| panic!("{log:#?}"));
    assert!(
        row["actor"].as_str().unwrap().starts_with("cli:") && row["source"] == "local",
        "{row}"
    );
    let fingerprint = "cd".repeat(32);
    let said = cli(&["revoke", "--fingerprint", &fingerprint, "--config", &other]);
    assert!(said.contains("revoked 1 certificate"), "{said}");
    let (status, why) = cli_fails(&["members", "remove", "gone.ovl.example", "-c", &other]);
    assert_eq!(status, Some(1));
    assert!(why.contains("no member named gone.ovl.example"), "{why}");
    let (status, why) = cli_fails(&["api-token", "revoke", "0123", "-c", &other]);
    assert_eq!(status, Some(1), "{why}");
    let log: Vec<Value> =
        serde_json::from_str(&cli(&["audit", "--config", &config, "--json"])).unwrap();
    for (action, target, result) in [
        ("member.revoke", fingerprint.as_str(), "ok"),
        ("member.remove", "gone.ovl.example", "not_found"),
    ] {
        assert!(
            log.iter()
                .any(|e| e["action"] == action && e["target"] == target && e["result"] == result),
            "no {action} {target} {result} in {log:#?}"
        );
    }
    let theirs: Vec<Value> =
        serde_json::from_str(&cli(&["audit", "--config", &other, "--json"])).unwrap();
    assert!(theirs.is_empty(), "{theirs:#?}");

    // No cloud: the command writes the store its file names.
    drop(served);
    cli(&[
        "api-token",
        "create",
        "--config",
        &other,
        "--name",
        "direct",
        "--scope",
        "read",
    ]);
    assert_eq!(api_token_names(&other), ["direct"]);
    assert_eq!(api_token_names(&config), ["through"]);
}

/// The real binary: `[api] listen` serves the API; a token made with the command line works
/// at once and stops working at once when revoked there; the command line's,
/// the API's and the reload's changes and refusals are all in `cyphonic-cloud audit`.
#[test]
fn the_binary_serves_the_api_and_its_audit_log_holds_every_side() {
    let dir = tempfile::tempdir().unwrap();
    let (config, api) = binary_config(dir.path(), "");
    assert!(cli(&["check-config", "-c", &config]).contains(&format!("api {api}")));
    let made = cli(&[
        "api-token",
        "create",
        "--config",
        &config,
        "--name",
        "ci",
        "--scope",
        "write",
    ]);
    let token = made
        .lines()
        .find(|l| l.starts_with("cyk_"))
        .unwrap_or_else(|| panic!("no token in {made}"))
        .to_owned();
    let _served = Served::listening(&config, api);
    assert_eq!(
        http(api, "GET", "/api/v1/members", &token, ""),
        (200, json!({"items": [], "next": null}))
    );
    let (status, v) = http(
        api,
        "POST",
        "/api/v1/api-tokens",
        &token,
        r#"{"name": "x", "scope": "admin"}"#,
    );
    assert_eq!((status, &v["error"]["code"]), (403, &json!("forbidden")));
    let (status, v) = http(
        api,
        "POST",
        "/api/v1/enrollment-tokens",
        &token,
        r#"{"name": "gw9.ovl.example", "prefix": 24}"#,
    );
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("conflict")),
        "{v}"
    );
    // A reload, recorded as the cloud's.
    let pid = _served.0.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Revoked on the command line, which the running cloud does: refused at once.
    let id = &token[4..20];
    cli(&["api-token", "revoke", id, "--config", &config]);
    assert_eq!(http(api, "GET", "/api/v1/members", &token, "").0, 401);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let log: Vec<Value> = loop {
        let log: Vec<Value> =
            serde_json::from_str(&cli(&["audit", "--config", &config, "--json"])).unwrap();
        if log.iter().any(|e| e["action"] == "policy.reload")
            || std::time::Instant::now() > deadline
        {
            break log;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let row = |action: &str, result: &str| {
        log.iter()
            .find(|e| e["action"] == action && e["result"] == result)
            .unwrap_or_else(|| panic!("no {action} {result} in {log:#?}"))
    };
    let user = row("api_token.create", "ok")["actor"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(user.starts_with("cli:"), "{user}");
    let refused = row("api_token.create", "forbidden");
    assert_eq!(refused["actor"], format!("token:{id} ci"));
    assert_eq!(refused["source"], "127.0.0.1");
    assert_eq!(
        row("enrollment_token.create", "conflict")["target"],
        "gw9.ovl.example"
    );
    assert_eq!(row("policy.reload", "ok")["actor"], "cloud");
    assert_eq!(row("api_token.revoke", "ok")["target"], id);
    let text = cli(&["audit", "--config", &config, "--action", "api_token.create"]);
    assert_eq!(text.lines().count(), 3, "a header and two rows: {text}");
}

/// Whether a TLS client that trusts only `cert` (DER) is served by `api`.
async fn trusted_by(api: SocketAddr, cert: &rcgen::Certificate) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    #[expect(deprecated, reason = "ring, as the server")]
    let provider = rustls::crypto::ring::default_provider();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let Ok(tcp) = tokio::net::TcpStream::connect(api).await else {
        return false;
    };
    tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect("cloud.example".try_into().unwrap(), tcp)
        .await
        .is_ok()
}

/// `[api] tls_cert` and `tls_key` are read again on SIGHUP (a renewed certificate under the
/// same names): new connections get the new certificate; a file that does not read is
/// refused with the whole configuration, and the certificate in use stays.
#[tokio::test]
async fn the_apis_certificate_is_read_again_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let made = || rcgen::generate_simple_self_signed(vec!["cloud.example".to_owned()]).unwrap();
    let write = |ck: &rcgen::CertifiedKey<rcgen::KeyPair>| {
        std::fs::write(dir.path().join("api.crt"), ck.cert.pem()).unwrap();
        std::fs::write(dir.path().join("api.key"), ck.signing_key.serialize_pem()).unwrap();
    };
    let (first, second) = (made(), made());
    write(&first);
    let (config, api) = binary_config(
        dir.path(),
        "tls_cert = \"api.crt\"\ntls_key = \"api.key\"\n",
    );
    let served = Served::start(&config);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !trusted_by(api, &first.cert).await {
        assert!(
            std::time::Instant::now() < deadline,
            "never served over TLS"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!trusted_by(api, &second.cert).await);
    let hup = || {
        assert!(
            std::process::Command::new("kill")
                .args(["-HUP", &served.0.id().to_string()])
                .status()
                .unwrap()
                .success()
        );
    };
    write(&second);
    hup();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !trusted_by(api, &second.cert).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the new certificate was not taken"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!trusted_by(api, &first.cert).await);
    // A key file that does not read: the reload is refused, the second certificate stays.
    std::fs::write(dir.path().join("api.key"), "not a key").unwrap();
    hup();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // (`cyphonic-cloud audit` reads the file too, so the store is read here.)
    let store = Store::open(&format!(
        "sqlite://{}",
        dir.path().join("cloud.db").display()
    ))
    .await
    .unwrap();
    let refused = loop {
        let log = common::audit(&store, "policy.reload").await;
        if let Some(r) = log.iter().find(|e| e.result != "ok") {
            break r.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refused reload in {log:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let why = refused.details["error"].as_str().unwrap();
    assert!(why.contains("tls_cert"), "{why}");
    assert!(trusted_by(api, &second.cert).await);
}

/// Connects to `to` from `from` (a loopback address).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> tokio::net::TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((from, 0))).unwrap();
    s.connect(to).await.unwrap()
}

/// Whether the server closes `s` within `within` (it reads the end of the stream).
async fn closed(s: &mut tokio::net::TcpStream, within: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 512];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// The listener's limits: one address holds at most its share of connections (the next is
/// closed at once and counted) while another address is still served; a connection that
/// sends no request is closed after the header time; places come back as connections end.
#[tokio::test]
async fn one_address_cannot_take_every_connection_and_idle_ones_are_closed() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let bed = Bed::new().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(AtomicU64::new(0));
    let limits = cyphonic_cloud::api::Limits {
        connections: 4,
        per_source: 2,
        header: std::time::Duration::from_secs(1),
        lifetime: std::time::Duration::from_secs(60),
    };
    let counted = refused.clone();
    let server = tokio::spawn(cyphonic_cloud::api::serve(
        listener,
        bed.app.clone(),
        None,
        Vec::new().into(),
        limits,
        move || {
            counted.fetch_add(1, Ordering::Relaxed);
        },
    ));
    let mut idle = vec![
        connect_from([127, 0, 0, 1], addr).await,
        connect_from([127, 0, 0, 1], addr).await,
    ];
    let mut third = connect_from([127, 0, 0, 1], addr).await;
    assert!(
        closed(&mut third, std::time::Duration::from_secs(5)).await,
        "a third from one address"
    );
    assert_eq!(refused.load(Ordering::Relaxed), 1);
    // Another address is served meanwhile.
    let other = tokio::task::spawn_blocking({
        let token = bed.read.clone();
        move || {
            use std::io::{Read as _, Write as _};
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into()).unwrap();
            s.connect(&addr.into()).unwrap();
            let mut s: std::net::TcpStream = s.into();
            write!(s, "GET /api/v1/members HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            answer
        }
    })
    .await
    .unwrap();
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    // The idle ones are closed after the header time, and their places come back.
    for s in &mut idle {
        assert!(
            closed(s, std::time::Duration::from_secs(5)).await,
            "an idle connection stayed"
        );
    }
    let mut again = connect_from([127, 0, 0, 1], addr).await;
    assert!(!closed(&mut again, std::time::Duration::from_millis(300)).await);
    assert_eq!(refused.load(Ordering::Relaxed), 1);
    server.abort();
}

/// The policy as the cloud holds it, the set one member enforces, and dry runs: allowed by
/// its rule, denied, and questions that do not read.
#[tokio::test]
async fn the_policy_and_its_dry_run() {
    use cyphonic_cloud::policy::{Group, Rule};
    let policy = Policy {
        allow_by_default: false,
        groups: vec![Group {
            name: "sites".into(),
            members: vec!["gw1.ovl.example".into()],
        }],
        rules: vec![
            Rule {
                from: vec!["gw2.ovl.example".into()],
                to: vec!["sites".into()],
                allow: vec!["tcp/554".into(), "udp/5000-5100".into()],
            },
            Rule {
                from: vec!["nobody.ovl.example".into()],
                to: vec!["*".into()],
                allow: vec!["icmp".into()],
            },
        ],
    };
    let bed = Bed::with(policy).await;
    bed.member("gw1.ovl.example", "100.64.1.0/24").await;
    bed.member("gw2.ovl.example", "100.64.2.0/24").await;
    bed.member("gw3.ovl.example", "100.64.3.0/24").await;
    bed.running.nms.compile_policy().await.unwrap();

    let p = bed.get("/api/v1/policy", &bed.read).await;
    assert_eq!(p["default"], "deny");
    assert_eq!(
        p["groups"],
        json!([{"name": "sites", "members": ["gw1.ovl.example"]}])
    );
    assert_eq!(p["rules"][0]["number"], 1);
    assert_eq!(p["rules"][1]["allow"], json!(["icmp"]));
    assert_eq!(p["rules"].as_array().unwrap().len(), 2);
    assert_eq!(p["unresolved"], json!(["nobody.ovl.example"]));

    let gw1 = bed.get("/api/v1/policy/gw1.ovl.example", &bed.read).await;
    assert_eq!(gw1["enforced"], true);
    let rules = gw1["rules"].as_array().unwrap();
    assert!(!rules.is_empty(), "{gw1}");
    assert!(rules.iter().all(|r| r["id"] == 1), "{gw1}");
    assert!(
        rules.iter().any(|r| r["proto"] == "tcp"
            && r["ports"] == json!(["554"])
            && r["from"] == json!(["100.64.2.0/24"])),
        "{gw1}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r["proto"] == "udp" && r["ports"] == json!(["5000-5100"])),
        "{gw1}"
    );
    let gw3 = bed.get("/api/v1/policy/gw3.ovl.example", &bed.read).await;
    assert_eq!(gw3["rules"], json!([]), "no rule concerns gw3");
    let (status, v) = bed
        .call(
            Method::GET,
            "/api/v1/policy/nobody.ovl.example",
            Some(&bed.read),
            None,
        )
        .await;
    assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, "not_found"));

    let ask = |body: Value| {
        let bed = &bed;
        async move {
            bed.call(
                Method::POST,
                "/api/v1/policy/check",
                Some(&bed.read),
                Some(&body.to_string()),
            )
            .await
        }
    };
    let (status, v) =
        ask(json!({"from": "100.64.2.7", "to": "100.64.1.10", "service": "tcp/554"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["rule"]["number"], 1);
    assert_eq!(v["rule"]["to"], json!(["sites"]));
    assert_eq!(
        (v["src"].as_str(), v["dst"].as_str()),
        (Some("100.64.2.7"), Some("100.64.1.10"))
    );
    for denied in [
        json!({"from": "100.64.2.7", "to": "100.64.1.10", "service": "tcp/22"}),
        json!({"from": "100.64.1.10", "to": "100.64.2.7", "service": "tcp/554"}),
        json!({"from": "100.64.3.1", "to": "100.64.1.10", "service": "icmp"}),
    ] {
        let (status, v) = ask(denied.clone()).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            (&v["allowed"], &v["rule"]),
            (&json!(false), &Value::Null),
            "{denied}: {v}"
        );
    }
    for (bad, field) in [
        (
            json!({"from": "100.64.2.7", "to": "100.64.1.10", "service": "tcp/x"}),
            "service",
        ),
        (
            json!({"from": "nobody.ovl.example", "to": "100.64.1.10", "service": "icmp"}),
            "from",
        ),
        (
            json!({"from": "100.64.2.7", "to": "fd7a:0:1::1", "service": "icmp"}),
            "to",
        ),
        (json!({"from": "100.64.2.7", "to": "100.64.1.10"}), "body"),
    ] {
        let (status, v) = ask(bad.clone()).await;
        assert_eq!(
            (status, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            "{bad}: {v}"
        );
        assert_eq!(v["error"]["field"], field, "{bad}: {v}");
    }
    let (status, _) = bed
        .call(Method::POST, "/api/v1/policy/check", None, Some("{}"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// The cloud forgets audit rows older than `[api] audit_days` when it starts (and hourly),
/// and keeps the rest.
#[tokio::test]
async fn old_audit_rows_are_forgotten_and_new_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let url = format!("sqlite://{}", dir.path().join("cloud.db").display());
    let store = Store::open(&url).await.unwrap();
    let ms = now() * 1000;
    for (id, at) in [("old", ms - 2 * 86_400_000), ("new", ms - 3_600_000)] {
        store
            .audit(&cyphonic_cloud::store::AuditEntry {
                id: id.into(),
                at,
                actor: "cli:root".into(),
                source: "local".into(),
                action: "member.revoke".into(),
                target: "gw9.ovl.example".into(),
                result: "ok".into(),
                details: json!({}),
            })
            .await
            .unwrap();
    }
    let running = cyphonic_cloud::start(config(dir.path(), &pki, Policy::default(), 1))
        .await
        .unwrap();
    let all = || async {
        store
            .audit_log(&AuditQuery {
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while all().await.len() > 1 {
        assert!(std::time::Instant::now() < deadline, "old rows stayed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(all().await, ["new"]);
    running.stop();
}

/// A token's requests are limited (429 with Retry-After), writes more tightly; another
/// token is served meanwhile.
#[tokio::test]
async fn a_token_past_its_rate_gets_429_and_others_are_still_served() {
    let bed = Bed::new().await;
    let until_limited = |method: Method, path: &'static str, token: String| {
        let bed = &bed;
        async move {
            for n in 1..=2_000 {
                let req = Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .header("authorization", format!("Bearer {token}"))
                    .body(Body::empty())
                    .unwrap();
                let resp = bed.app.clone().oneshot(req).await.unwrap();
                if resp.status() == StatusCode::TOO_MANY_REQUESTS {
                    let wait: u64 = resp.headers()["retry-after"]
                        .to_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                        .await
                        .unwrap();
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(code(&v), "rate_limited");
                    assert!((1..=2).contains(&wait), "Retry-After {wait}");
                    return n;
                }
            }
            panic!("{method} {path}: never limited");
        }
    };
    let reads = until_limited(Method::GET, "/api/v1/revocations", bed.read.clone()).await;
    assert!(
        reads > 100,
        "limited after {reads} reads, before the burst of 100"
    );
    // Reading the tokens again (every 2 s) keeps each one's rate: the token is limited again
    // within the few requests its bucket refilled meanwhile (50 a second), not after a new
    // burst of 100.
    bed.state.refresh().await.unwrap();
    let again = until_limited(Method::GET, "/api/v1/revocations", bed.read.clone()).await;
    assert!(
        again < 50,
        "a new burst after the refresh: limited after {again}"
    );
    assert_eq!(
        bed.get("/api/v1/revocations", &bed.write).await["items"],
        json!([])
    );
    let writes = until_limited(
        Method::DELETE,
        "/api/v1/enrollment-tokens/0123456789abcdef",
        bed.admin.clone(),
    )
    .await;
    assert!(
        (11..100).contains(&writes),
        "writes limited after {writes}, not after the burst of 10"
    );
}

/// Over TLS (`[api] tls_cert`, `tls_key`): a client that trusts the certificate is served;
/// plain HTTP to the same port gets no answer.
#[tokio::test]
async fn the_api_is_served_over_tls() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let bed = Bed::new().await;
    let ck = rcgen::generate_simple_self_signed(vec!["cloud.example".to_owned()]).unwrap();
    let tls = cyphonic_cloud::tls::tls_config(
        ck.cert.pem().as_bytes(),
        ck.signing_key.serialize_pem().as_bytes(),
        cyphonic_cloud::tls::API_ALPN,
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(cyphonic_cloud::api::serve(
        listener,
        bed.app.clone(),
        Some(cyphonic_cloud::api::fixed_tls(tls)),
        Vec::new().into(),
        cyphonic_cloud::api::Limits::default(),
        || {},
    ));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    #[expect(deprecated, reason = "ring, as the server")]
    let provider = rustls::crypto::ring::default_provider();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect("cloud.example".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let request = format!(
        "GET /api/v1/members HTTP/1.1\r\nHost: cloud.example\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        bed.read
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(r#"{"items":[],"next":null}"#), "{answer}");

    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        plain.read_to_end(&mut answer),
    )
    .await
    .unwrap();
    assert!(
        !String::from_utf8_lossy(&answer).contains("200"),
        "plain HTTP was served"
    );
    server.abort();
}

/// Behind a trusted proxy: a request's source is the client its `X-Forwarded-For` names
/// (the audit log says so), and the proxy's connections are not held to the per-address
/// limit; an untrusted address's header is ignored and its limit holds.
#[tokio::test]
async fn a_trusted_proxy_names_the_client_and_is_not_held_to_one_address_limit() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let bed = Bed::new().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = cyphonic_cloud::api::Limits {
        connections: 16,
        per_source: 2,
        ..cyphonic_cloud::api::Limits::default()
    };
    let server = tokio::spawn(cyphonic_cloud::api::serve(
        listener,
        bed.app.clone(),
        None,
        vec!["127.0.0.1/32".parse().unwrap()].into(),
        limits,
        || {},
    ));
    // Four connections from the proxy, all open, all served.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from([127, 0, 0, 1], addr).await);
    }
    let ask = |from: [u8; 4], target: &'static str| {
        let token = bed.read.clone();
        async move {
            let mut s = connect_from(from, addr).await;
            let req = format!(
                "POST /api/v1/members/{target}/revoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 X-Forwarded-For: 203.0.113.9, 198.51.100.7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer).await;
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    let answer = ask([127, 0, 0, 1], "a.ovl.example").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let answer = ask([127, 0, 0, 2], "b.ovl.example").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let rows = bed.audit("member.revoke").await;
    let source = |target: &str| {
        rows.iter()
            .find(|e| e.target == target)
            .map(|e| e.source.clone())
    };
    assert_eq!(source("a.ovl.example").as_deref(), Some("198.51.100.7"));
    assert_eq!(source("b.ovl.example").as_deref(), Some("127.0.0.2"));
    // An untrusted address still holds at most its two.
    let _two = [
        connect_from([127, 0, 0, 3], addr).await,
        connect_from([127, 0, 0, 3], addr).await,
    ];
    let mut third = connect_from([127, 0, 0, 3], addr).await;
    assert!(closed(&mut third, std::time::Duration::from_secs(5)).await);
    for s in &mut held {
        assert!(
            !closed(s, std::time::Duration::from_millis(50)).await,
            "a proxy connection was closed"
        );
    }
    server.abort();
}
