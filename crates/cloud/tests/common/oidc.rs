//! A real OpenID Connect provider for the tests: panva's oidc-provider from npm (tests/oidc),
//! run by node on loopback.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cyphonic_cloud::api::{self, ApiState};
use cyphonic_cloud::signin::{OidcConfig, Provider, Role};
use cyphonic_cloud::{Policy, Store};
use cyphonic_signal::testing::Pki;

/// Installs the provider's package once (`npm ci`, from the lock file) where tests keep
/// their files; returns the directory to run it from.
fn provider_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
        // One directory per test program: npm ci empties node_modules first.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(concat!("oidc-provider-", env!("CARGO_CRATE_NAME")));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["package.json", "package-lock.json", "provider.mjs"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let status = Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .expect("npm (the test's OpenID provider is installed from npm)");
        assert!(status.success(), "npm ci in {}", dir.display());
        dir
    })
}

/// A provider running (ended, by its PID, when dropped).
pub(crate) struct Idp {
    child: Child,
    /// Its issuer URL.
    pub(crate) issuer: String,
}

impl Idp {
    /// Starts the provider in `mode`, sending people back to `redirect`.
    pub(crate) fn start(redirect: &str, mode: &str) -> Self {
        let mut child = Command::new("node")
            .arg("provider.mjs")
            .args([redirect, mode])
            .current_dir(provider_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node (the test's OpenID provider)");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        // The rest is read and dropped: a closed pipe would end the provider at its next line.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let issuer = line.trim().to_owned();
        assert!(
            issuer.starts_with("http://127.0.0.1:"),
            "the provider said {line:?}"
        );
        Self { child, issuer }
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cloud whose API listens on loopback (over TLS with `tls`, a certificate for
/// 127.0.0.1 that the test's browser is told to accept), people signing in through a
/// provider in `mode`: Ada is an admin, Olivia an operator, Victor a viewer, Nora nobody.
pub(crate) struct Bed {
    pub(crate) running: cyphonic_cloud::Running,
    /// `http(s)://127.0.0.1:PORT`.
    pub(crate) base: String,
    pub(crate) pki: Pki,
    pub(crate) idp: Idp,
    pub(crate) config: OidcConfig,
    /// The cloud's control address and key, for clients.
    pub(crate) control: std::net::SocketAddr,
    pub(crate) key: cyphonic_crypto::PublicKey,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Bed {
    pub(crate) async fn new(mode: &str, tls: bool) -> Self {
        Self::with(mode, tls, Policy::default()).await
    }

    /// [`Bed::new`] with `policy` in force.
    pub(crate) async fn with(mode: &str, tls: bool, policy: Policy) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new();
        let cloud = super::config(dir.path(), &pki, policy, 365);
        let key = cloud.key.public();
        let running = cyphonic_cloud::start(cloud).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls { "https" } else { "http" };
        let base = format!("{scheme}://{}", listener.local_addr().unwrap());
        let idp = Idp::start(&format!("{base}/auth/callback"), mode);
        let config = OidcConfig {
            issuer: idp.issuer.clone(),
            client_id: "cyphonic".into(),
            client_secret: "a-client-secret-for-tests-only".into(),
            url: base.parse().unwrap(),
            claim: "groups".into(),
            roles: vec![
                (Role::Admin, vec!["net-admins".into()]),
                (Role::Operator, vec!["net-ops".into()]),
                (Role::Viewer, vec!["staff".into()]),
            ],
            scopes: vec!["email".into(), "groups".into()],
            session: Duration::from_secs(3600),
            idle: Duration::from_secs(600),
        };
        let state = ApiState::with_signin(
            running.nms.clone(),
            Some(Provider::new(config.clone()).unwrap()),
        )
        .await
        .unwrap();
        let tls = tls.then(|| {
            let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
            cyphonic_cloud::tls::tls_config(
                ck.cert.pem().as_bytes(),
                ck.signing_key.serialize_pem().as_bytes(),
                cyphonic_cloud::tls::API_ALPN,
            )
            .unwrap()
        });
        let tls = tls.map(api::fixed_tls);
        let server = tokio::spawn(api::serve(
            listener,
            api::router(state),
            tls,
            Arc::from(Vec::new()),
            api::Limits::default(),
            || {},
        ));
        Self {
            control: running.control,
            running,
            base,
            pki,
            idp,
            config,
            key,
            server,
            _dir: dir,
        }
    }

    pub(crate) fn store(&self) -> &Store {
        self.running.nms.store()
    }

    pub(crate) async fn audit(&self, action: &str) -> Vec<cyphonic_cloud::store::AuditEntry> {
        super::audit(self.store(), action).await
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.server.abort();
    }
}
