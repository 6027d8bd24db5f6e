//! The cloud's HTTP API under load (issue 54): `cyphonic-bed api`. A cloud in this process
//! on loopback, its registry (SQLite, or a throwaway PostgreSQL) filled with N members,
//! each with a certificate of a test CA and a name; then HTTP/1.1 keep-alive connections
//! ask one endpoint as fast as answers come, for a bounded time. Asked: the members list's
//! first page (`?limit=100`), every page of it (`?limit=500`, a walk), and, for the cost
//! of HTTP, a token's check and JSON alone, `GET /api/v1/session`. Each connection sends
//! with tokens of its own in turn, so that no token's rate (50/s) is what is measured.
//! The load and the cloud share the machine's cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use cyphonic_cloud::admin::{self, Scope, Who};
use cyphonic_cloud::{CloudConfig, Policy, Store};
use cyphonic_crypto::StaticKeypair;
use cyphonic_signal::testing::Pki;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

use crate::bed::TempDir;
use crate::postgres::Postgres;

/// Members at most: a /24 each in 100.64.0.0/10.
pub const MAX_MEMBERS: usize = 16_384;
/// Connections at once: the API admits 8 from one address.
pub const CONNECTIONS: usize = 8;
/// API tokens made for the load (each good for 50 requests a second: 150,000 together).
const TOKENS: usize = 3000;

/// One endpoint's figures.
#[derive(Debug, Clone)]
pub struct Rate {
    /// What was asked.
    pub what: &'static str,
    /// Answers with status 200 in the time.
    pub answered: u64,
    /// Answers with another status.
    pub refused: u64,
    /// Answers a second (requests, also in a walk).
    pub per_sec: f64,
    /// One answer's time, median and 99th percentile, milliseconds.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// Bytes of one answer's body (the last).
    pub body_bytes: usize,
}

/// A cloud on loopback over a filled registry, with its store kept.
struct Cloud {
    running: cyphonic_cloud::Running,
    api: SocketAddr,
    tokens: Vec<String>,
    _pg: Option<Postgres>,
    _dir: TempDir,
}

/// `members` members in `store` as their sessions leave them: a certificate of `pki`'s CA
/// for a /24, an endpoint, two names (the adapter's and a device's), then offline.
async fn fill(store: &Store, pki: &Pki, members: usize) -> anyhow::Result<()> {
    use cyphonic_control::NameRecord;
    let issuer = hex::encode(pki.ca.certificate().fingerprint().0);
    if members > MAX_MEMBERS {
        bail!("at most {MAX_MEMBERS} members (a /24 each in 100.64.0.0/10)");
    }
    for i in 0..members {
        let name = format!("gw{i}.ovl.example");
        let n = u32::try_from(i)?;
        let net =
            std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(100, 64, 0, 0)) + (n << 8));
        let [_, b2, b3, _] = net.octets();
        let id = pki.identity(&name, &format!("{net}/24"), &["sites"]);
        let cert = id.certificate();
        let fp = cert.fingerprint().to_string();
        store
            .client_online(
                &fp,
                (&name, &issuer),
                (&cert.to_pem(), &cert.body().vip_blocks),
                "cyphonic-adapter (load)",
            )
            .await
            .with_context(|| format!("member {i}"))?;
        let record = |name: String, host: u8| NameRecord {
            name,
            vip: Some(std::net::Ipv4Addr::new(100, b2, b3, host)),
            vip6: None,
            legacy: None,
        };
        // A documentation address: it is only written down, nothing is sent to it.
        let endpoint = SocketAddr::from(([198, 51, 100, b3 | 1], 51820));
        store
            .register(
                &fp,
                (
                    &[endpoint],
                    None,
                    Some(cyphonic_control::TunnelVersions::OURS),
                ),
                &[record(name.clone(), 1), record(format!("cam.{name}"), 10)],
            )
            .await?;
        store.client_offline(&fp).await?;
    }
    Ok(())
}

impl Cloud {
    async fn start(members: usize, postgres: bool) -> anyhow::Result<Self> {
        let dir = TempDir::new("api-load")?;
        let pg = if postgres {
            Some(Postgres::start()?)
        } else {
            None
        };
        let url = pg.as_ref().map_or_else(
            || format!("sqlite://{}", dir.path().join("cloud.db").display()),
            Postgres::url,
        );
        let pki = Pki::new();
        {
            let store = Store::open(&url).await?;
            fill(&store, &pki, members).await?;
        }
        let config = CloudConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            probe_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            probe_listen_alt: SocketAddr::from(([127, 0, 0, 1], 0)),
            status_socket: dir.path().join("cloud.sock"),
            admin_socket: dir.path().join("cloud-admin.sock"),
            metrics: None,
            relay: None,
            key: StaticKeypair::generate()?,
            trust: pki.trust(),
            database: url,
            policy: Policy::default(),
            enroll: None,
            api: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            audit_days: 365,
            flows: cyphonic_cloud::config::FlowLogs::default(),
            api_tls: None,
            api_proxies: Vec::new(),
            api_oidc: None,
        };
        // The tokens exist before the API reads them at its start.
        let store = Store::open(&config.database).await?;
        let now = cyphonic_signal::testing::now();
        let mut tokens = Vec::with_capacity(TOKENS);
        for i in 0..TOKENS {
            let (_, t) = admin::create_api_token(
                &store,
                &format!("load{i}"),
                Scope::Read,
                None,
                &Who::cli(),
                now,
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            tokens.push(t.to_string());
        }
        let running = cyphonic_cloud::start(config).await?;
        let api = running.api.context("the API did not start")?;
        Ok(Self {
            running,
            api,
            tokens,
            _pg: pg,
            _dir: dir,
        })
    }
}

/// One keep-alive connection's request of `path` with `token`: the status and the body's
/// length.
async fn ask(
    conn: &mut BufReader<tokio::net::TcpStream>,
    path: &str,
    token: &str,
) -> anyhow::Result<(u16, usize)> {
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: cloud\r\nAuthorization: Bearer {token}\r\n\r\n");
    conn.get_mut().write_all(req.as_bytes()).await?;
    let (status, body) = read_body(conn).await?;
    Ok((status, body.len()))
}

/// Asks `paths` in turn (one request each) on `CONNECTIONS` connections for `secs`
/// seconds: the figures.
async fn load(
    cloud: &Cloud,
    what: &'static str,
    paths: Arc<Vec<String>>,
    secs: u64,
) -> anyhow::Result<Rate> {
    let end = Instant::now() + Duration::from_secs(secs);
    let tokens = Arc::new(cloud.tokens.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CONNECTIONS {
        let (paths, tokens, api) = (paths.clone(), tokens.clone(), cloud.api);
        tasks.spawn(async move {
            let mut conn = BufReader::new(tokio::net::TcpStream::connect(api).await?);
            let (mut times, mut ok, mut other, mut bytes) = (Vec::new(), 0u64, 0u64, 0);
            let mut n = c;
            while Instant::now() < end {
                let started = Instant::now();
                for p in paths.iter() {
                    let token = &tokens[n % tokens.len()];
                    n += CONNECTIONS;
                    let (status, len) = ask(&mut conn, p, token).await?;
                    bytes = len;
                    if status == 200 {
                        ok += 1;
                    } else {
                        other += 1;
                    }
                }
                times.push(started.elapsed());
            }
            anyhow::Ok((times, ok, other, bytes))
        });
    }
    let started = Instant::now();
    let (mut times, mut ok, mut other, mut bytes) = (Vec::new(), 0, 0, 0);
    while let Some(done) = tasks.join_next().await {
        let (t, o, x, b) = done??;
        times.extend(t);
        ok += o;
        other += x;
        bytes = b;
    }
    let took = started.elapsed().as_secs_f64();
    times.sort();
    let at = |percent: usize| {
        times
            .get(times.len().saturating_sub(1) * percent / 100)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(Rate {
        what,
        answered: ok,
        refused: other,
        per_sec: (ok + other) as f64 / took,
        p50_ms: at(50),
        p99_ms: at(99),
        body_bytes: bytes,
    })
}

/// The figures of one store at `members` members, `secs` seconds an endpoint: the members'
/// first page, a walk of every page, and the session check alone.
///
/// # Errors
/// The store, the cloud or a connection failing.
pub fn run(members: usize, postgres: bool, secs: u64) -> anyhow::Result<Vec<Rate>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cloud = Cloud::start(members, postgres).await?;
        let pages = members.div_ceil(500).max(1);
        // The walk's cursors, read once: what a client walking the list would send.
        let mut walk = vec!["/api/v1/members?limit=500".to_owned()];
        let mut conn = BufReader::new(tokio::net::TcpStream::connect(cloud.api).await?);
        let mut after = None::<String>;
        for _ in 1..pages {
            let path = after.as_ref().map_or_else(
                || "/api/v1/members?limit=500".to_owned(),
                |c| format!("/api/v1/members?limit=500&after={c}"),
            );
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: cloud\r\nAuthorization: Bearer {}\r\n\r\n",
                cloud.tokens[0]
            );
            conn.get_mut().write_all(req.as_bytes()).await?;
            let (status, body) = read_body(&mut conn).await?;
            if status != 200 {
                bail!("{path}: {status}");
            }
            let v: serde_json::Value = serde_json::from_slice(&body)?;
            let next = v["next"].as_str().context("a next page")?.to_owned();
            walk.push(format!("/api/v1/members?limit=500&after={next}"));
            after = Some(next);
        }
        drop(conn);
        let rates = vec![
            load(
                &cloud,
                "GET /api/v1/session",
                Arc::new(vec!["/api/v1/session".to_owned()]),
                secs,
            )
            .await?,
            load(
                &cloud,
                "GET /api/v1/members?limit=100",
                Arc::new(vec!["/api/v1/members?limit=100".to_owned()]),
                secs,
            )
            .await?,
            load(&cloud, "every page at limit=500", Arc::new(walk), secs).await?,
        ];
        cloud.running.stop();
        Ok(rates)
    })
}

async fn read_body(conn: &mut BufReader<tokio::net::TcpStream>) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("a status line")?;
    let mut length = 0;
    loop {
        line.clear();
        conn.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse()?;
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body).await?;
    Ok((status, body))
}
