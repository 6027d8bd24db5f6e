//! The console on the two-site bed (issue 54): a person signs in through a real OpenID
//! Connect provider, sees both sites with the devices their adapters report and the tunnel
//! between them, revokes one site, and watches the other's tunnel to it go. The provider
//! (panva's oidc-provider, crates/cloud/tests/oidc), chromedriver and headless Chromium run
//! inside the cloud's namespace, on its loopback beside the API; the test drives the
//! browser from a thread inside that namespace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cyphonic_e2e::bed::{BedOptions, CloudOptions, Side, TwoSites};
use cyphonic_e2e::inject::inside;
use fantoccini::{Client, Locator};

// The console's own tests' browser steps (a test file cannot use another crate's tests).
#[path = "../../crates/cloud/tests/common/browser.rs"]
mod browser;
use browser::{click, fill, text};

/// The API and console, on the cloud's loopback.
const API: &str = "http://127.0.0.1:9467";
/// The provider's port, on the same loopback.
const PROVIDER: u16 = 8089;
/// chromedriver's port, on the same loopback.
const DRIVER: u16 = 9515;

/// Installs the provider's package (`npm ci`, from its lock file) where this test program
/// keeps its files; the directory to run it from.
fn provider_dir() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crates/cloud/tests/oidc");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("oidc-provider-e2e-console");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["package.json", "package-lock.json", "provider.mjs"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let status = std::process::Command::new("npm")
        .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .status()
        .expect("npm");
    assert!(status.success(), "npm ci in {}", dir.display());
    dir
}

/// A process and those it started (its own process group), ended together when dropped.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = self.0.wait();
    }
}

/// Loads `path` again and again until the text of `css` says what `want` wants, within
/// `within` (what the adapters report reaches the cloud within seconds, not at once).
async fn until_page(
    c: &Client,
    path: &str,
    css: &str,
    within: Duration,
    want: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        c.goto(&format!("{API}{path}")).await.unwrap();
        let found = match c.find(Locator::Css(css)).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if want(&found) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path} {css}: {found:?}\n{}",
            c.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The browser's part: sign in, both sites with their devices and the tunnel, a revocation,
/// the other site's tunnel going, the audit log.
async fn browse() {
    let c = browser::session(&format!("http://127.0.0.1:{DRIVER}"), 1280, 860).await;
    // Olivia, an operator, signs in.
    c.goto(&format!("{API}/console/")).await.unwrap();
    click(&c, "#sign-in").await;
    fill(&c, "input[name=login]", "olivia").await;
    fill(&c, "input[name=password]", "any").await;
    click(&c, "button[type=submit]").await;
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("input[name=prompt][value=consent]"))
        .await
        .unwrap();
    click(&c, "button[type=submit]").await;
    assert!(text(&c, "#me").await.contains("(operator)"));

    // Both sites online, each with its reserved host, and the tunnel between them.
    let within = Duration::from_secs(30);
    for (site, host, other) in [
        ("gw1.ovl.example", "host.gw1.ovl.example", "gw2.ovl.example"),
        ("gw2.ovl.example", "host.gw2.ovl.example", "gw1.ovl.example"),
    ] {
        let row = format!("tr[data-member='{site}']");
        until_page(&c, "/console/", &row, within, |t| t.contains("online")).await;
        let page = format!("/console/members/{site}");
        until_page(&c, &page, "#devices", within, |t| t.contains(host)).await;
        until_page(&c, &page, "#tunnels", within, |t| {
            t.contains(other) && t.contains("direct") && t.contains("up")
        })
        .await;
    }

    // Revoking gw2: gw1 drops it, and its report says so within seconds.
    c.goto(&format!("{API}/console/members/gw2.ovl.example"))
        .await
        .unwrap();
    click(&c, "#revoke").await;
    c.accept_alert().await.unwrap();
    until_page(
        &c,
        "/console/",
        "tr[data-member='gw2.ovl.example']",
        within,
        |t| t.contains("revoked"),
    )
    .await;
    until_page(
        &c,
        "/console/members/gw1.ovl.example",
        "#no-tunnels",
        within,
        |t| t.contains("No tunnel"),
    )
    .await;
    c.goto(&format!("{API}/console/audit")).await.unwrap();
    let log = text(&c, "#audit").await;
    assert!(
        log.contains("member.revoke") && log.contains("person:olivia"),
        "{log}"
    );
    c.close().await.unwrap();
}

#[test]
fn the_console_shows_the_two_sites_and_a_revoked_sites_tunnel_going() {
    let secret = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-console-oidc-secret");
    std::fs::write(&secret, "a-client-secret-for-tests-only").unwrap();
    let extra = format!(
        "[api]\nlisten = \"127.0.0.1:9467\"\n[api.oidc]\nissuer = \"http://127.0.0.1:{PROVIDER}\"\n\
         client_id = \"cyphonic\"\nclient_secret_file = \"{}\"\nurl = \"{API}\"\n\
         operator = [\"net-ops\"]\nviewer = [\"staff\"]\nscopes = [\"email\", \"groups\"]\n",
        secret.display()
    );
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            extra,
            ..CloudOptions::default()
        }),
        ..BedOptions::default()
    })
    .unwrap();
    let ns = &bed.cloud.as_ref().unwrap().ns;
    // The provider, then chromedriver, inside the cloud's namespace.
    let mut provider = ns.command(
        "node",
        &["provider.mjs", &format!("{API}/auth/callback"), "normal"],
    );
    let mut provider = provider
        .current_dir(provider_dir())
        .env("PORT", PROVIDER.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("node");
    let mut out = std::io::BufReader::new(provider.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let _provider = Group(provider);
    assert_eq!(line.trim(), format!("http://127.0.0.1:{PROVIDER}"));
    let _driver = Group(
        ns.command("chromedriver", &[&format!("--port={DRIVER}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver (Debian's chromium-driver)"),
    );
    // A tunnel between the sites: a name of B's asked from A's LAN.
    let answer = bed.resolve(
        &bed.a.lan,
        std::net::Ipv4Addr::new(100, 64, 1, 1),
        "host.gw2.ovl.example",
    );
    assert_eq!(answer, ["100.64.2.10"]);
    let ping = bed
        .ping(
            Side::A,
            std::net::Ipv4Addr::new(100, 64, 2, 10),
            &["-c", "2", "-W", "2"],
        )
        .unwrap();
    assert!(ping.status.success(), "{}", bed.logs());
    inside(ns, || {
        // chromedriver listens once it is up.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", DRIVER)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(browse());
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
}
