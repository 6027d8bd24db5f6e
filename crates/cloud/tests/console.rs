//! The console in a real browser (docs/protocol.md §8, The console): headless Chromium
//! driven through chromedriver (WebDriver, fantoccini), against a cloud serving its API
//! over TLS on loopback and a real OpenID Connect provider. Two sites are online; Olivia
//! (an operator) signs in, sees them, makes an enrollment token that a third adapter
//! enrolls with, revokes a site, and reads all of it in the audit log, on a desktop's width
//! and a phone's; Victor (a viewer) sees but is offered no change. Screenshots of the pages
//! are written to the test's directory, and to `$CYPHONIC_SCREENSHOTS` when set (the ones
//! in docs/console came from there).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cyphonic_crypto::StaticKeypair;
use fantoccini::{Client, Locator};

mod common;
use common::browser::{self, click, fill, text};
use common::oidc::Bed;

/// chromedriver, on a port of its own (ended, by its PID, when dropped).
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // A process group of its own: the browsers it starts are in it too, and a failing
        // test ends them with it (a browser outlives its driver otherwise).
        let child = Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, url }
    }

    /// A new headless Chromium, `width` by `height`, that accepts the test's certificate.
    async fn browser(&self, width: u32, height: u32) -> Client {
        browser::session(&self.url, width, height).await
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// Saves a screenshot of what `c` shows as `name`.png.
async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    let mut dirs = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console")];
    if let Some(d) = std::env::var_os("CYPHONIC_SCREENSHOTS") {
        dirs.push(PathBuf::from(d));
    }
    for d in dirs {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("{name}.png")), &png).unwrap();
    }
}

/// Waits until the text of `css` holds `needle` (a page that changes by itself, or one
/// being replaced); returns it.
async fn until_text(c: &Client, css: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(t) = e.text().await
            && t.contains(needle)
        {
            return t;
        }
        assert!(Instant::now() < deadline, "{css} never held {needle}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the browser is at a URL starting with `prefix`.
async fn at(c: &Client, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let url = c.current_url().await.unwrap().to_string();
        if url.starts_with(prefix) {
            return;
        }
        assert!(Instant::now() < deadline, "at {url}, not {prefix}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `css` names an element of the page now.
async fn present(c: &Client, css: &str) -> bool {
    c.find(Locator::Css(css)).await.is_ok()
}

/// From the console's sign-in page through the provider's login and consent as `login`,
/// back to the fleet.
async fn sign_in(c: &Client, bed: &Bed, login: &str) {
    c.goto(&format!("{}/console/", bed.base)).await.unwrap();
    at(c, &format!("{}/console/signin", bed.base)).await;
    click(c, "#sign-in").await;
    at(c, &bed.idp.issuer).await;
    fill(c, "input[name=login]", login).await;
    fill(c, "input[name=password]", "any").await;
    click(c, "button[type=submit]").await;
    // The consent page, once the login page has gone.
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("input[name=prompt][value=consent]"))
        .await
        .unwrap();
    click(c, "button[type=submit]").await;
    at(c, &format!("{}/console/", bed.base)).await;
}

/// The fleet's row of `member`: its text.
async fn row(c: &Client, bed: &Bed, member: &str) -> String {
    c.goto(&format!("{}/console/", bed.base)).await.unwrap();
    text(c, &format!("tr[data-member='{member}']")).await
}

/// The site `us` reports its camera (1.5 MB sent) and a tunnel to the site `them`, once
/// both are known to the registry; returns when the report is kept.
async fn report(bed: &Bed, site: &cyphonic_signal::Handle, (us, them): (&str, &str)) {
    use cyphonic_signal::{DeviceKind, DeviceReport, Report, TunnelPath, TunnelReport};
    let deadline = Instant::now() + Duration::from_secs(20);
    let fingerprint = |name: &str| {
        let name = name.to_owned();
        async move {
            loop {
                let known = bed.store().reporter(&name).await.unwrap();
                if let Some((fp, _)) = known {
                    return fp;
                }
                assert!(Instant::now() < deadline, "{name} never registered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (mine, peer) = (fingerprint(us).await, fingerprint(them).await);
    let net = if us.starts_with("gw1") { 1 } else { 2 };
    site.report(Report {
        devices: vec![DeviceReport {
            mac: cyphonic_control::Mac([2, 0, 0, 0, net, 10]),
            vip: Some(std::net::Ipv4Addr::new(100, 64, net, 10)),
            vip6: None,
            legacy: None,
            name: Some(format!("cam1.{us}")),
            hostname: Some("cam1".into()),
            kind: DeviceKind::Lease,
            expires: Some(cyphonic_signal::testing::now() + 3600),
            vlan: None,
            seen: Some(cyphonic_signal::testing::now()),
            tx_bytes: 1_500_000,
            tx_packets: 1_100,
            rx_bytes: 80_000,
            rx_packets: 1_000,
        }],
        tunnels: vec![TunnelReport {
            peer,
            name: them.to_owned(),
            path: TunnelPath::Direct,
            reason: None,
            endpoint: Some(std::net::SocketAddr::from(([198, 51, 100, net ^ 3], 51820))),
            established: true,
            handshake: Some(cyphonic_signal::testing::now()),
            tx_bytes: 1_500_000,
            rx_bytes: 80_000,
        }],
    });
    while bed
        .store()
        .devices_page(&mine, None, 10)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "{us}'s report was never kept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A member online with a certificate of `pki`'s CA, as a site's adapter would be (while
/// its handle and its events are kept).
fn site(
    bed: &Bed,
    name: &str,
    block: &str,
) -> (
    cyphonic_signal::Handle,
    tokio::sync::mpsc::Receiver<cyphonic_signal::Event>,
) {
    let (h, events) = cyphonic_signal::spawn(
        client_config(bed),
        bed.pki.identity(name, block, &["sites"]),
    );
    let net: ipnet::Ipv4Net = block.parse().unwrap();
    let host = |n: u32| std::net::Ipv4Addr::from(u32::from(net.network()) + n);
    let record = |name: String, vip| cyphonic_signal::NameRecord {
        name,
        vip: Some(vip),
        vip6: None,
        legacy: None,
    };
    // An uplink address of the documentation's: nothing is sent to it.
    let uplink = std::net::SocketAddr::from(([198, 51, 100, host(0).octets()[2]], 51820));
    h.register(
        vec![uplink],
        vec![
            record(name.to_owned(), host(1)),
            record(format!("cam1.{name}"), host(10)),
        ],
    );
    (h, events)
}

fn client_config(bed: &Bed) -> cyphonic_signal::Config {
    cyphonic_signal::Config {
        clouds: vec![bed.control.to_string()],
        cloud_keys: vec![bed.key],
        agent: "cyphonic-adapter (test)".into(),
        tunnel_port: None,
        tunnel: cyphonic_signal::TunnelVersions::OURS,
        source: None,
    }
}

/// Waits until the fleet shows `member` with `state`.
async fn until_state(c: &Client, bed: &Bed, member: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = row(c, bed, member).await;
        if r.contains(state) {
            return;
        }
        if Instant::now() >= deadline {
            let revoked = bed.store().revocation_rows().await.unwrap();
            let members: Vec<(String, String)> = bed
                .store()
                .members()
                .await
                .unwrap()
                .iter()
                .map(|m| (m.client.name.clone(), m.client.fingerprint.clone()))
                .collect();
            panic!("{member}: {r}; revoked {revoked:?}; members {members:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    // Sites may reach gw1's camera's RTSP, nothing else.
    let policy = cyphonic_cloud::Policy {
        allow_by_default: false,
        groups: Vec::new(),
        rules: vec![cyphonic_cloud::Rule {
            from: vec!["sites".into()],
            to: vec!["cam1.gw1.ovl.example".into()],
            allow: vec!["tcp/554".into()],
        }],
    };
    let bed = Bed::with("normal", true, policy).await;
    let gw1 = site(&bed, "gw1.ovl.example", "100.64.1.0/24");
    let gw2 = site(&bed, "gw2.ovl.example", "100.64.2.0/24");
    report(&bed, &gw1.0, ("gw1.ovl.example", "gw2.ovl.example")).await;
    report(&bed, &gw2.0, ("gw2.ovl.example", "gw1.ovl.example")).await;
    let driver = Driver::start();
    let c = driver.browser(1280, 860).await;

    // Signed out, the console sends the browser to sign in.
    c.goto(&format!("{}/console/tokens", bed.base))
        .await
        .unwrap();
    at(&c, &format!("{}/console/signin", bed.base)).await;
    shot(&c, "signin").await;

    // Olivia signs in and sees both sites online.
    sign_in(&c, &bed, "olivia").await;
    let me = text(&c, "#me").await;
    assert!(
        me.contains("olivia@example.com") && me.contains("(operator)"),
        "{me}"
    );
    until_state(&c, &bed, "gw1.ovl.example", "online").await;
    until_state(&c, &bed, "gw2.ovl.example", "online").await;
    assert!(
        row(&c, &bed, "gw1.ovl.example")
            .await
            .contains("100.64.1.0/24")
    );
    shot(&c, "fleet").await;

    // A token for a third site, shown once; an adapter enrolls with it and comes online.
    c.goto(&format!("{}/console/tokens", bed.base))
        .await
        .unwrap();
    fill(&c, "#make-token input[name=name]", "gw3.ovl.example").await;
    fill(&c, "#make-token input[name=groups]", "sites").await;
    click(&c, "#make-token button[type=submit]").await;
    let token = text(&c, "#new-token").await;
    shot(&c, "token").await;
    assert!(token.contains('.'), "{token}");
    let tokens = text(&c, "#tokens").await;
    assert!(
        tokens.contains("gw3.ovl.example") && tokens.contains("live"),
        "{tokens}"
    );
    c.goto(&format!("{}/console/tokens", bed.base))
        .await
        .unwrap();
    assert!(!present(&c, "#new-token").await, "shown once only");
    let keypair = StaticKeypair::generate().unwrap();
    let enrolled = cyphonic_signal::enroll(&client_config(&bed), &keypair, &token)
        .await
        .unwrap();
    // The adapter's own address: the first of the block the cloud allocated.
    let enrolled_vip = enrolled
        .certificate
        .body()
        .vip_blocks
        .iter()
        .find_map(|b| match b {
            ipnet::IpNet::V4(n) => Some(std::net::Ipv4Addr::from(u32::from(n.network()) + 1)),
            ipnet::IpNet::V6(_) => None,
        })
        .unwrap();
    let identity = cyphonic_session::Identity::new(
        keypair,
        enrolled.certificate,
        bed.pki.trust(),
        cyphonic_signal::testing::now(),
    )
    .unwrap();
    let (gw3, _events) = cyphonic_signal::spawn(client_config(&bed), Arc::new(identity));
    gw3.register(
        Vec::new(),
        vec![cyphonic_signal::NameRecord {
            name: "gw3.ovl.example".into(),
            vip: Some(enrolled_vip),
            vip6: None,
            legacy: None,
        }],
    );
    until_state(&c, &bed, "gw3.ovl.example", "online").await;

    // What gw2 logged of its flows: an RTSP session and a refused scan.
    let gw2_fp = bed
        .store()
        .reporter("gw2.ovl.example")
        .await
        .unwrap()
        .unwrap()
        .0;
    let flow = cyphonic_control::FlowRecord {
        proto: 6,
        src: "100.64.2.10".parse().unwrap(),
        sport: 40_000,
        dst: "100.64.1.10".parse().unwrap(),
        dport: 554,
        dir: cyphonic_control::FlowDir::Out,
        start: cyphonic_signal::testing::now() - 60,
        end: cyphonic_signal::testing::now(),
        tx_bytes: 5_000,
        tx_packets: 40,
        rx_bytes: 2_500_000,
        rx_packets: 1_800,
        rule: 1,
    };
    let scan = cyphonic_control::RefusedRecord {
        src: "100.64.1.66".parse().unwrap(),
        dir: cyphonic_control::FlowDir::In,
        first: cyphonic_signal::testing::now() - 30,
        last: cyphonic_signal::testing::now(),
        packets: 10_000,
        ports: 1024,
    };
    bed.store()
        .keep_flows((&gw2_fp, "gw2.ovl.example"), &[flow], &[scan])
        .await
        .unwrap();

    // A site's page: its devices with what they sent, its tunnel to the other site, its
    // flows.
    c.goto(&format!("{}/console/members/gw2.ovl.example", bed.base))
        .await
        .unwrap();
    let devices = text(&c, "#devices").await;
    for seen in [
        "cam1.gw2.ovl.example",
        "100.64.2.10",
        "02:00:00:00:02:0a",
        "1.5 MB",
        "lease",
    ] {
        assert!(devices.contains(seen), "{seen} in {devices}");
    }
    let flows = text(&c, "#flows").await;
    for seen in [
        "100.64.2.10:40000",
        "100.64.1.10:554",
        "2.5 MB",
        "rule 1 (out)",
        "refused",
        "1024 port(s)",
    ] {
        assert!(flows.contains(seen), "{seen} in {flows}");
    }
    let tunnels = text(&c, "#tunnels").await;
    assert!(
        tunnels.contains("gw1.ovl.example") && tunnels.contains("direct") && tunnels.contains("up"),
        "{tunnels}"
    );
    shot(&c, "member").await;

    // The policy, and its dry run: allowed by the rule, refused without one, and a name
    // nobody holds said so on the page.
    c.goto(&format!("{}/console/policy", bed.base))
        .await
        .unwrap();
    assert_eq!(text(&c, "#default").await, "deny");
    assert!(text(&c, "#rules").await.contains("tcp/554"));
    for (to, service, says) in [
        ("cam1.gw1.ovl.example", "tcp/554", "Allowed by rule 1"),
        ("cam1.gw1.ovl.example", "tcp/22", "Refused"),
    ] {
        fill(&c, "#dry-run input[name=from]", "gw2.ovl.example").await;
        fill(&c, "#dry-run input[name=to]", to).await;
        fill(&c, "#dry-run input[name=service]", service).await;
        click(&c, "#dry-run button[type=submit]").await;
        let verdict = until_text(&c, "#verdict", says).await;
        assert!(verdict.contains("100.64.1.10"), "{verdict}");
    }
    shot(&c, "policy").await;
    fill(&c, "#dry-run input[name=to]", "nothing.gw1.ovl.example").await;
    click(&c, "#dry-run button[type=submit]").await;
    assert!(
        text(&c, "#mistake")
            .await
            .contains("nothing.gw1.ovl.example")
    );
    // An operator is offered no API tokens, and refused their page.
    assert!(!text(&c, "nav").await.contains("API tokens"));
    c.goto(&format!("{}/console/api-tokens", bed.base))
        .await
        .unwrap();
    assert!(text(&c, "h1").await.contains("403"));

    // Revoking a site: the console asks first; then the site is revoked and offline.
    c.goto(&format!("{}/console/members/gw2.ovl.example", bed.base))
        .await
        .unwrap();
    click(&c, "#revoke").await;
    let asked = c.get_alert_text().await.unwrap();
    assert!(asked.contains("Revoke gw2.ovl.example"), "{asked}");
    c.accept_alert().await.unwrap();
    // The form's answer sends the browser back to the member's page, now with the revoked
    // certificate: navigating before it is there could have it land after, and take the
    // next page away.
    until_text(&c, "main", "revoked").await;
    until_state(&c, &bed, "gw2.ovl.example", "revoked").await;
    // Its session is cut: offline in the registry, and counted out of the fleet's online.
    let deadline = Instant::now() + Duration::from_secs(30);
    while bed
        .store()
        .members()
        .await
        .unwrap()
        .iter()
        .any(|m| m.client.name == "gw2.ovl.example" && m.client.online)
    {
        assert!(Instant::now() < deadline, "gw2's session was not cut");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its tunnels went with its session; what it said of its devices stays.
    c.goto(&format!("{}/console/members/gw2.ovl.example", bed.base))
        .await
        .unwrap();
    assert!(present(&c, "#no-tunnels").await);
    assert!(text(&c, "#devices").await.contains("cam1.gw2.ovl.example"));
    c.goto(&format!("{}/console/", bed.base)).await.unwrap();
    assert_eq!(text(&c, "#online-count").await, "2");
    assert!(!row(&c, &bed, "gw2.ovl.example").await.contains("online"));
    assert!(row(&c, &bed, "gw1.ovl.example").await.contains("online"));

    // The audit log shows who did it, from where.
    c.goto(&format!("{}/console/audit", bed.base))
        .await
        .unwrap();
    let log = text(&c, "#audit").await;
    for line in [
        "member.revoke",
        "gw2.ovl.example",
        "enrollment_token.create",
        "sign_in",
        "person:olivia olivia@example.com",
        "member:gw3.ovl.example",
        "127.0.0.1",
    ] {
        assert!(log.contains(line), "{line} in {log}");
    }
    shot(&c, "audit").await;
    fill(&c, "#filter input[name=action]", "member.revoke").await;
    click(&c, "#filter button[type=submit]").await;
    at(
        &c,
        &format!("{}/console/audit?action=member.revoke", bed.base),
    )
    .await;
    let only = text(&c, "#audit tbody").await;
    assert_eq!(only.lines().count(), 1, "{only}");
    // The revocations list the site's certificate.
    c.goto(&format!("{}/console/revocations", bed.base))
        .await
        .unwrap();
    assert!(text(&c, "#revocations").await.contains("gw2.ovl.example"));

    // A phone's width: one column, each row a card of labelled lines.
    c.set_window_size(390, 844).await.unwrap();
    c.goto(&format!("{}/console/", bed.base)).await.unwrap();
    let layout = c
        .execute(
            "return [getComputedStyle(document.querySelector('#members thead')).display,
                     getComputedStyle(document.querySelector('#members td')).display,
                     document.documentElement.scrollWidth <= window.innerWidth]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(layout, serde_json::json!(["none", "block", true]));
    shot(&c, "fleet-phone").await;

    // Signing out ends the session: the console asks to sign in again.
    c.set_window_size(1280, 860).await.unwrap();
    click(&c, "#sign-out").await;
    at(&c, &format!("{}/console/signin", bed.base)).await;
    c.goto(&format!("{}/console/", bed.base)).await.unwrap();
    at(&c, &format!("{}/console/signin", bed.base)).await;

    // Victor, a viewer, in a browser of his own (the provider remembers Olivia in hers),
    // sees the fleet and the tokens, and is offered no change.
    c.close().await.unwrap();
    let v = driver.browser(1280, 860).await;
    sign_in(&v, &bed, "victor").await;
    assert!(text(&v, "#me").await.contains("(viewer)"));
    assert!(row(&v, &bed, "gw1.ovl.example").await.contains("online"));
    v.goto(&format!("{}/console/members/gw1.ovl.example", bed.base))
        .await
        .unwrap();
    text(&v, "dl").await;
    assert!(!present(&v, "#revoke").await);
    v.goto(&format!("{}/console/tokens", bed.base))
        .await
        .unwrap();
    text(&v, "#tokens").await;
    assert!(!present(&v, "#make-token").await);
    assert_eq!(bed.audit("member.revoke").await.len(), 1);
    assert!(!text(&v, "nav").await.contains("API tokens"));
    v.close().await.unwrap();

    // Ada, an admin, makes an API token: shown once, it reads the API; revoked on the
    // console, it is refused at once.
    let a = driver.browser(1280, 860).await;
    sign_in(&a, &bed, "ada").await;
    click(&a, "nav a[href='/console/api-tokens']").await;
    fill(&a, "#make-api-token input[name=name]", "grafana").await;
    fill(&a, "#make-api-token input[name=days]", "30").await;
    click(&a, "#make-api-token button[type=submit]").await;
    let token = text(&a, "#new-api-token").await;
    assert!(token.starts_with("cyk_"), "{token}");
    let listed = text(&a, "#api-tokens").await;
    assert!(
        listed.contains("grafana") && listed.contains("live") && listed.contains("person:ada"),
        "{listed}"
    );
    shot(&a, "api-tokens").await;
    let api = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let members = |token: String| {
        let req = api
            .get(format!("{}/api/v1/members", bed.base))
            .bearer_auth(token);
        async move { req.send().await.unwrap().status() }
    };
    assert_eq!(members(token.clone()).await, reqwest::StatusCode::OK);
    a.goto(&format!("{}/console/api-tokens", bed.base))
        .await
        .unwrap();
    assert!(!present(&a, "#new-api-token").await, "shown once only");
    click(&a, "tr[data-api-token] button.danger").await;
    let asked = a.get_alert_text().await.unwrap();
    assert!(asked.contains("grafana"), "{asked}");
    a.accept_alert().await.unwrap();
    until_text(&a, "#api-tokens", "revoked").await;
    assert_eq!(members(token).await, reqwest::StatusCode::UNAUTHORIZED);
    let made = bed.audit("api_token.create").await;
    assert!(
        made.iter().any(|e| e.actor.starts_with("person:ada")),
        "{made:?}"
    );
    a.close().await.unwrap();
}
