//! People sign in through a real OpenID Connect provider (docs/protocol.md §8, Who may do
//! what): panva's oidc-provider, installed from npm (tests/oidc) and run by node on
//! loopback, in front of the cloud's API on loopback. The test is the browser: it follows
//! the redirects, fills the provider's login and consent forms, and keeps each side's
//! cookies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use cyphonic_cloud::api::{self, ApiState, LOGIN_COOKIE, SESSION_COOKIE};
use cyphonic_cloud::signin::Provider;
use serde_json::Value;

mod common;
use common::oidc::Bed;

/// What a browser keeps: cookies by name (the test's hosts are few and trusted).
#[derive(Debug, Default, Clone)]
struct Jar(HashMap<String, String>);

impl Jar {
    fn take(&mut self, r: &reqwest::Response) {
        for c in r.headers().get_all("set-cookie") {
            let c = c.to_str().unwrap();
            let (pair, _) = c.split_once(';').unwrap_or((c, ""));
            let (k, v) = pair.split_once('=').unwrap();
            if v.is_empty() || c.contains("Max-Age=0") || c.contains("max-age=0") {
                self.0.remove(k);
            } else {
                self.0.insert(k.to_owned(), v.to_owned());
            }
        }
    }

    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get("location")
        .unwrap_or_else(|| panic!("no Location in {r:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

/// The `action` of the HTML form in `page`.
fn form_action(page: &str) -> String {
    let at = page.find("action=\"").expect("a form") + "action=\"".len();
    page[at..][..page[at..].find('"').unwrap()].replace("&amp;", "&")
}

/// A sign-in as `login`, up to the cloud's answer to the provider's redirect (not
/// followed), with what the cloud's side of the browser holds then. `tamper` may change the
/// callback's URL before it is sent.
async fn sign_in(
    bed: &Bed,
    login: &str,
    tamper: impl FnOnce(String) -> String,
) -> (reqwest::Response, Jar) {
    let b = browser();
    let mut cloud = Jar::default();
    let mut idp = Jar::default();
    let r = b
        .get(format!("{}/auth/login", bed.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "{r:?}");
    cloud.take(&r);
    assert!(cloud.0.contains_key(LOGIN_COOKIE), "{cloud:?}");
    let mut next = location(&r);
    assert!(next.starts_with(&bed.idp.issuer), "to the provider: {next}");
    for _ in 0..12 {
        if next.starts_with(&bed.base) {
            let r = b
                .get(tamper(next))
                .header("cookie", cloud.header())
                .send()
                .await
                .unwrap();
            cloud.take(&r);
            return (r, cloud);
        }
        let url = if next.starts_with('/') {
            format!("{}{next}", bed.idp.issuer)
        } else {
            next.clone()
        };
        let r = b
            .get(&url)
            .header("cookie", idp.header())
            .send()
            .await
            .unwrap();
        idp.take(&r);
        if r.status().is_redirection() {
            next = location(&r);
            continue;
        }
        let page = r.text().await.unwrap();
        let form: Vec<(&str, &str)> = if page.contains(r#"name="prompt" value="login""#) {
            vec![("prompt", "login"), ("login", login), ("password", "any")]
        } else if page.contains(r#"name="prompt" value="consent""#) {
            vec![("prompt", "consent")]
        } else {
            panic!("an unexpected page at {url}: {page}");
        };
        let action = form_action(&page);
        let action = if action.starts_with('/') {
            format!("{}{action}", bed.idp.issuer)
        } else {
            action
        };
        let r = b
            .post(&action)
            .header("cookie", idp.header())
            .form(&form)
            .send()
            .await
            .unwrap();
        idp.take(&r);
        assert!(r.status().is_redirection(), "{r:?}");
        next = location(&r);
    }
    panic!("the sign-in did not come back to the cloud");
}

/// A request to the cloud with `cookies`, and for a change `csrf` and `origin`: the status
/// and the JSON answer.
async fn call(
    bed: &Bed,
    method: reqwest::Method,
    path: &str,
    cookies: &Jar,
    csrf: Option<&str>,
    origin: Option<&str>,
) -> (u16, Value) {
    let mut req = browser()
        .request(method, format!("{}{path}", bed.base))
        .header("cookie", cookies.header());
    if let Some(t) = csrf {
        req = req.header("x-csrf-token", t);
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A console form posted with `cookies`, its field `csrf` and `origin`: the status.
async fn form(bed: &Bed, path: &str, cookies: &Jar, csrf: &str, origin: Option<&str>) -> u16 {
    let mut req = browser()
        .post(format!("{}{path}", bed.base))
        .header("cookie", cookies.header())
        .form(&[("csrf", csrf)]);
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    req.send().await.unwrap().status().as_u16()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// Olivia (net-ops: an operator) and Victor (staff: a viewer) sign in through the provider;
/// Nora, whom no role names, is refused and recorded. A session sees what its role sees; a
/// change needs its CSRF token and the console's origin, and its role's scope (Victor's
/// attempt is refused and recorded). Another instance knows the session after its refresh.
/// Signing out ends it everywhere; a made-up cookie and a state not the browser's are
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_sign_in_with_a_real_provider_and_act_by_their_role() {
    let bed = Bed::new("normal", false).await;
    let origin = bed.config.origin();
    common::member(bed.store(), &bed.pki, "gw1.ovl.example", "100.64.1.0/24").await;
    common::member(bed.store(), &bed.pki, "gw2.ovl.example", "100.64.2.0/24").await;
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;

    // Olivia: an operator.
    let (r, olivia) = sign_in(&bed, "olivia", |u| u).await;
    assert_eq!(r.status(), 303, "{r:?}");
    assert_eq!(location(&r), "/console/");
    let set: Vec<&str> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let session = set
        .iter()
        .find(|c| c.starts_with(&format!("{SESSION_COOKIE}=")))
        .expect("a session cookie");
    for attribute in ["Path=/", "Secure", "HttpOnly", "SameSite=Lax"] {
        assert!(session.contains(attribute), "{session}");
    }
    assert!(
        !olivia.0.contains_key(LOGIN_COOKIE),
        "the sign-in's cookie is cleared"
    );
    let (status, me) = call(&bed, get.clone(), "/api/v1/session", &olivia, None, None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["role"], "operator");
    assert_eq!(me["scope"], "write");
    assert_eq!(me["actor"], "person:olivia olivia@example.com");
    let csrf = me["csrf"].as_str().unwrap().to_owned();
    let (status, members) = call(&bed, get.clone(), "/api/v1/members", &olivia, None, None).await;
    assert_eq!(status, 200);
    assert_eq!(members["items"].as_array().unwrap().len(), 2);

    // A change without the CSRF token, with it but from another origin or none: refused,
    // nothing revoked.
    let revoke = "/api/v1/members/gw1.ovl.example/revoke";
    for (token, from) in [
        (None, Some(origin.as_str())),
        (
            Some("0123456789abcdef0123456789abcdef"),
            Some(origin.as_str()),
        ),
        (Some(csrf.as_str()), None),
        (Some(csrf.as_str()), Some("https://evil.example")),
    ] {
        let (status, v) = call(&bed, post.clone(), revoke, &olivia, token, from).await;
        assert_eq!(
            (status, code(&v)),
            (403, "forbidden"),
            "{token:?} {from:?}: {v}"
        );
    }
    // The console's forms carry the token in a field `csrf`, checked the same way.
    let console = "/console/members/gw1.ovl.example/revoke";
    for (token, from) in [
        ("", Some(origin.as_str())),
        ("0123456789abcdef0123456789abcdef", Some(origin.as_str())),
        (csrf.as_str(), None),
        (csrf.as_str(), Some("https://evil.example")),
    ] {
        let status = form(&bed, console, &olivia, token, from).await;
        assert_eq!(status, 403, "{token:?} {from:?}");
    }
    assert!(bed.store().revocation_rows().await.unwrap().is_empty());
    let (status, v) = call(
        &bed,
        post.clone(),
        revoke,
        &olivia,
        Some(&csrf),
        Some(&origin),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(bed.store().revocation_rows().await.unwrap().len(), 1);
    let revokes = bed.audit("member.revoke").await;
    assert_eq!(revokes.len(), 1);
    assert_eq!(revokes[0].actor, "person:olivia olivia@example.com");
    assert_eq!(revokes[0].result, "ok");

    // Victor: a viewer sees, and may not revoke.
    let (r, victor) = sign_in(&bed, "victor", |u| u).await;
    assert_eq!(r.status(), 303);
    let (_, me) = call(&bed, get.clone(), "/api/v1/session", &victor, None, None).await;
    assert_eq!(me["role"], "viewer");
    let vcsrf = me["csrf"].as_str().unwrap().to_owned();
    assert_ne!(vcsrf, csrf);
    let (status, _) = call(&bed, get.clone(), "/api/v1/members", &victor, None, None).await;
    assert_eq!(status, 200);
    let (status, v) = call(
        &bed,
        post.clone(),
        "/api/v1/members/gw2.ovl.example/revoke",
        &victor,
        Some(&vcsrf),
        Some(&origin),
    )
    .await;
    assert_eq!((status, code(&v)), (403, "forbidden"), "{v}");
    assert_eq!(bed.store().revocation_rows().await.unwrap().len(), 1);
    let revokes = bed.audit("member.revoke").await;
    assert_eq!(revokes[0].actor, "person:victor victor@example.com");
    assert_eq!(revokes[0].result, "forbidden");
    // Olivia's CSRF token is not Victor's.
    let (status, _) = call(
        &bed,
        post.clone(),
        "/api/v1/members/gw2.ovl.example/revoke",
        &olivia,
        Some(&vcsrf),
        Some(&origin),
    )
    .await;
    assert_eq!(status, 403);

    // Nora: known to the provider, named by no role: refused, recorded, no session.
    let (r, nora) = sign_in(&bed, "nora", |u| u).await;
    assert_eq!(r.status(), 403);
    assert!(!nora.0.contains_key(SESSION_COOKIE), "{nora:?}");
    let signins = bed.audit("sign_in").await;
    let results: Vec<(&str, &str)> = signins
        .iter()
        .map(|e| (e.actor.as_str(), e.result.as_str()))
        .collect();
    assert_eq!(
        results,
        [
            ("person:nora nora@example.com", "forbidden"),
            ("person:victor victor@example.com", "ok"),
            ("person:olivia olivia@example.com", "ok"),
        ]
    );
    assert_eq!(signins[1].details["role"], "viewer");

    // Another instance on the same store knows Olivia's session once it has read them.
    let other = ApiState::with_signin(
        bed.running.nms.clone(),
        Some(Provider::new(bed.config.clone()).unwrap()),
    )
    .await
    .unwrap();
    let req = axum::http::Request::get("/api/v1/session")
        .header("cookie", olivia.header())
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(api::router(other.clone()), req)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // A state that is not this browser's; a made-up session.
    let (r, _) = sign_in(&bed, "olivia", |u| u.replace("state=", "state=x")).await;
    assert_eq!(r.status(), 401, "{r:?}");
    let mut made_up = Jar::default();
    made_up.0.insert(SESSION_COOKIE.to_owned(), "ab".repeat(32));
    let (status, v) = call(&bed, get.clone(), "/api/v1/session", &made_up, None, None).await;
    assert_eq!((status, code(&v)), (401, "unauthorized"));

    // Signing out needs the CSRF token too, and ends the session here and, after its
    // refresh, on the other instance.
    let (status, _) = call(
        &bed,
        post.clone(),
        "/auth/logout",
        &olivia,
        None,
        Some(&origin),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = call(
        &bed,
        post.clone(),
        "/auth/logout",
        &olivia,
        Some(&csrf),
        Some(&origin),
    )
    .await;
    assert_eq!(status, 303);
    let (status, _) = call(&bed, get.clone(), "/api/v1/session", &olivia, None, None).await;
    assert_eq!(status, 401);
    other.refresh().await.unwrap();
    let req = axum::http::Request::get("/api/v1/session")
        .header("cookie", olivia.header())
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(api::router(other), req)
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(bed.audit("sign_out").await.len(), 1);
    // Victor is still signed in.
    let (status, _) = call(&bed, get, "/api/v1/session", &victor, None, None).await;
    assert_eq!(status, 200);
    let stats = &bed.running.nms.stats;
    let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(get(&stats.signins), 2);
    assert_eq!(get(&stats.signins_refused), 2, "Nora and the wrong state");
}

/// An ID token signed with a key its issuer does not publish, and one that had ended before
/// it came (the provider's clock two hours behind), prove no one: no session, nothing
/// recorded as signed in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_expired_id_token_is_refused() {
    for (mode, why) in [("forged-keys", "signature"), ("clock-behind", "expired")] {
        let bed = Bed::new(mode, false).await;
        let (r, jar) = sign_in(&bed, "olivia", |u| u).await;
        assert_eq!(r.status(), 401, "{mode}: {r:?}");
        let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        let message = body["error"]["message"].as_str().unwrap().to_lowercase();
        assert!(
            message.contains("id token is refused") && message.contains(why),
            "{mode}: {message}"
        );
        assert!(!jar.0.contains_key(SESSION_COOKIE), "{mode}: {jar:?}");
        assert!(bed.audit("sign_in").await.is_empty(), "{mode}");
        let refused = bed
            .running
            .nms
            .stats
            .signins_refused
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(refused, 1, "{mode}");
    }
}

/// The console's fleet comes in pages of the store's (200 certificates): walked by its
/// *Next page* links, it shows every member once, with all its certificates counted, though
/// a page's end falls between two certificates of one member (100 members of 3: the 200th
/// row is a second certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consoles_fleet_comes_in_pages() {
    let bed = Bed::new("normal", false).await;
    for i in 0..100 {
        for _ in 0..3 {
            common::member(
                bed.store(),
                &bed.pki,
                &format!("gw{i}.ovl.example"),
                &format!("100.64.{i}.0/24"),
            )
            .await;
        }
    }
    let (_, olivia) = sign_in(&bed, "olivia", |u| u).await;
    let mut seen: Vec<String> = Vec::new();
    let mut path = "/console/".to_owned();
    for _ in 0..10 {
        let page = browser()
            .get(format!("{}{path}", bed.base))
            .header("cookie", olivia.header())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for row in page.split("<tr data-member=\"").skip(1) {
            let name = &row[..row.find('"').unwrap()];
            assert!(
                row[..row.find("</tr>").unwrap()].contains("(3 certificates)"),
                "{name}"
            );
            seen.push(name.to_owned());
        }
        match page.split_once("id=\"next\" href=\"") {
            Some((_, rest)) => path = rest[..rest.find('"').unwrap()].replace("&amp;", "&"),
            None => break,
        }
    }
    let mut want: Vec<String> = (0..100).map(|i| format!("gw{i}.ovl.example")).collect();
    want.sort();
    assert_eq!(seen, want);
}
