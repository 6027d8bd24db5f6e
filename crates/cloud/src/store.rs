//! The registry: which clients exist, where they can be reached, which names they host. One
//! SQL schema (migrations/) through sqlx's `Any` driver: a SQLite file by default, PostgreSQL
//! by URL when several cloud instances share one overlay.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use cyphonic_control::{Mapping, NameRecord, TunnelVersions};
use ipnet::IpNet;
use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Row as _};

mod audit;
mod flows;
mod reports;
mod sessions;

pub use audit::{ApiTokenRow, AuditEntry, AuditQuery};
pub use flows::{FlowQuery, FlowRow};
pub use reports::{DeviceRow, TunnelRow};
pub use sessions::SessionRow;

/// Store failures: the database cannot be opened or migrated, or a query failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// From the database driver.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("migrating the database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row holds something this version cannot read (edited by hand, or a newer schema).
    #[error("unreadable row in {table}: {what}")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// What did not parse.
        what: String,
    },
    /// The member has a control session open.
    #[error("{0} is online: revoke its certificate (or stop it) first")]
    Online(String),
    /// The database did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// A registered client as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRow {
    /// Its certificate's fingerprint (hex).
    pub fingerprint: String,
    /// Its FQDN.
    pub name: String,
    /// Its certificate, text armor.
    pub certificate: String,
    /// The endpoints it registered.
    pub endpoints: Vec<SocketAddr>,
    /// The address its endpoint probes came from.
    pub observed: Option<SocketAddr>,
    /// The address its probes to the second probe port came from.
    pub observed_alt: Option<SocketAddr>,
    /// What its router said of a mapping of its tunnel port, as it registered it.
    pub mapping: Option<Mapping>,
    /// The tunnel versions it registered (control version 15).
    pub tunnel: Option<TunnelVersions>,
    /// Whether a control session is open to it (on any instance).
    pub online: bool,
}

impl ClientRow {
    /// Its router's mapping of its tunnel port, where the cloud takes it at its word: its
    /// address is the one the client's probes come from (docs/protocol.md §4, *Port mapping*).
    pub fn mapped(&self) -> Option<SocketAddr> {
        let endpoint = self.mapping.as_ref()?.endpoint()?;
        (Some(endpoint.ip()) == self.observed.map(|o| o.ip())).then_some(endpoint)
    }

    /// Where to send handshakes: a mapping the router holds for it first (it answers anyone),
    /// then the observed (NAT-mapped) address, then the rest.
    pub fn reach(&self) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = self.mapped().into_iter().collect();
        out.extend(self.observed.filter(|o| !out.contains(o)));
        for e in &self.endpoints {
            if !out.contains(e) {
                out.push(*e);
            }
        }
        out
    }
}

/// Names a client hosts that have a vIP, with it; and the IPv6 addresses of those that have
/// one (devices with IPv6 only too).
pub type HostedNames = (
    Vec<(String, Ipv4Addr)>,
    std::collections::BTreeMap<String, Ipv6Addr>,
);

/// A member as the fleet view shows it: a client and its registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The client.
    pub client: ClientRow,
    /// When it last connected, registered or was seen by a probe, or went offline (unix
    /// seconds).
    pub last_seen: u64,
    /// The names it hosts (its own and its devices') that have a vIP, with it, by name.
    pub names: Vec<(String, Ipv4Addr)>,
    /// Of those, the fixed-address devices' own addresses on their site's legacy subnet.
    pub legacy: std::collections::BTreeMap<String, Ipv4Addr>,
    /// The IPv6 addresses of the names that registered one (their AAAA), those of devices
    /// with IPv6 only among them.
    pub names6: std::collections::BTreeMap<String, Ipv6Addr>,
    /// The software and version it said it runs when it last connected (cleaned, see
    /// `nms::agent`); None for a certificate that never connected.
    pub agent: Option<String>,
    /// The HA pair its serving box reported in its last session, if any.
    pub pair: Option<PairReport>,
}

/// What a member's serving box reported of its HA pair (docs/protocol.md §5, *Seen from the
/// cloud*), checked for shape, as the registry keeps it: what a holder of the site's key
/// says, for the fleet view only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PairReport {
    /// The pair's term as the sender knew it.
    pub term: u64,
    /// Why the sender took its role (printable, short).
    pub reason: String,
    /// The sender first, then the other box once heard.
    pub boxes: Vec<cyphonic_control::PairBox>,
    /// When it came (unix seconds).
    pub at: u64,
}

/// A name and who hosts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameRow {
    /// Its vIP (None: a device with IPv6 only).
    pub vip: Option<Ipv4Addr>,
    /// Its IPv6 address, if it registered one.
    pub vip6: Option<Ipv6Addr>,
    /// The client hosting it.
    pub owner: ClientRow,
}

/// The registry.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    url: String,
}

/// The PostgreSQL channel that carries signals between cloud instances.
pub const SIGNAL_CHANNEL: &str = "cyphonic_signal";

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A block's first and last address as the blocks table holds them (migration 0007).
fn block_range(block: &IpNet) -> (String, String) {
    match block {
        IpNet::V4(b) => (
            format!("4:{:08x}", u32::from(b.network())),
            format!("4:{:08x}", u32::from(b.broadcast())),
        ),
        IpNet::V6(b) => (
            format!("6:{:032x}", u128::from(b.network())),
            format!("6:{:032x}", u128::from(b.broadcast())),
        ),
    }
}

/// Records `blocks` as `fingerprint`'s, in `tx` (those already recorded stay).
async fn put_blocks(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    fingerprint: &str,
    blocks: &[IpNet],
) -> Result<(), StoreError> {
    for block in blocks {
        let (first, last) = block_range(block);
        sqlx::query(
            "INSERT INTO blocks (fingerprint, first, last) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(fingerprint)
        .bind(first)
        .bind(last)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A database URL without its password, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

impl Store {
    /// Connects to the database at `url` once and asks it `SELECT 1`, within `wait`: whether
    /// it answers this user with these credentials. Nothing is created, written or migrated.
    ///
    /// # Errors
    /// It refuses or fails; [`StoreError::Timeout`] when it did not answer within `wait`.
    pub async fn reachable(url: &str, wait: std::time::Duration) -> Result<(), StoreError> {
        install_default_drivers();
        // One connection, tried once (a pool would retry a refused one until its time is
        // up and then say only that).
        let asked = async {
            let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(url).await?;
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            sqlx::Connection::close(conn).await?;
            Ok(())
        };
        tokio::time::timeout(wait, asked)
            .await
            .unwrap_or(Err(StoreError::Timeout(wait)))
    }

    /// Opens (creating a SQLite file if needed) and migrates the database at `url`
    /// (`sqlite:///var/lib/cyphonic/cloud.db`, `postgres://user@host/db`).
    ///
    /// # Errors
    /// The database cannot be reached or migrated.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        install_default_drivers();
        let url = if url.starts_with("sqlite:") && !url.contains("mode=") {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}mode=rwc")
        } else {
            url.to_owned()
        };
        // SQLite allows one writer: one connection avoids "database is locked".
        let max = if url.starts_with("sqlite:") { 1 } else { 8 };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .connect(&url)
            .await?;
        if url.starts_with("sqlite:") {
            // A write-ahead log: a transaction is one append and one fsync of the log,
            // where the default rollback journal created, synced and deleted a file of its
            // own as well (a registration's transactions cost ~8 fsyncs). Durability stays
            // (synchronous stays FULL); the mode is kept in the file. `.backup` copies it
            // whole, log included.
            sqlx::query("PRAGMA journal_mode=WAL")
                .execute(&pool)
                .await?;
        }
        sqlx::migrate!("./migrations").run(&pool).await?;
        let store = Self { pool, url };
        store.fill_blocks().await?;
        Ok(store)
    }

    /// Whether the store is PostgreSQL, which several cloud instances can share.
    pub fn is_shared(&self) -> bool {
        self.url.starts_with("postgres:") || self.url.starts_with("postgresql:")
    }

    /// The store's URL (with its password: do not log it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends `payload` to every instance listening on [`SIGNAL_CHANNEL`] (PostgreSQL only;
    /// at most 8000 bytes).
    ///
    /// # Errors
    /// Database failures, or a store that is not shared.
    pub async fn notify(&self, payload: &str) -> Result<(), StoreError> {
        // pg_notify returns void, which the Any driver cannot decode: select a constant.
        sqlx::query("SELECT 1 AS sent FROM (SELECT pg_notify($1, $2)) AS n")
            .bind(SIGNAL_CHANNEL)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records a client that just opened a control session: online, with no endpoints and
    /// names until it registers, and no tunnels until it reports them (its devices stay).
    /// Returns the session's mark, for [`Self::session_ended`].
    ///
    /// # Errors
    /// Database failures.
    pub async fn client_online(
        &self,
        fingerprint: &str,
        identity: (&str, &str),
        (certificate, blocks): (&str, &[IpNet]),
        agent: &str,
    ) -> Result<String, StoreError> {
        let mut mark = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut mark).map_err(
            |_| StoreError::Corrupt {
                table: "clients",
                what: "no random bytes for a session's mark".into(),
            },
        )?;
        let session = hex::encode(mark);
        self.put_client(
            "ON CONFLICT (fingerprint) DO UPDATE SET name = $2, certificate = $3, online = 1, updated_at = $4, issuer = $5, agent = $7, pair = NULL, session = $8",
            (1, Some(agent), Some(&session)),
            fingerprint,
            identity,
            (certificate, blocks),
        )
        .await?;
        self.forget_tunnels(fingerprint).await?;
        Ok(session)
    }

    /// The control session `session` (from [`Self::client_online`]) of the client
    /// `fingerprint` ended: it is marked offline and its tunnels forgotten, but only while
    /// that session is the newest it opened. A session that ends as a newer one opens (the
    /// client reconnected), written after the newer one's, leaves the client online.
    ///
    /// # Errors
    /// Database failures.
    pub async fn session_ended(&self, fingerprint: &str, session: &str) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE clients SET online = 0, updated_at = $2 WHERE fingerprint = $1 AND session = $3",
        )
        .bind(fingerprint)
        .bind(unix_now())
        .bind(session)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() > 0 {
            self.forget_tunnels(fingerprint).await?;
        }
        Ok(())
    }

    /// Keeps what the client `fingerprint`'s serving box reported of its HA pair, in place of
    /// what it reported before.
    ///
    /// # Errors
    /// Database failures.
    pub async fn report_pair(
        &self,
        fingerprint: &str,
        report: &PairReport,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(report).map_err(|e| StoreError::Corrupt {
            table: "clients",
            what: format!("pair of {fingerprint}: {e}"),
        })?;
        sqlx::query("UPDATE clients SET pair = $2 WHERE fingerprint = $1")
            .bind(fingerprint)
            .bind(text)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records a certificate the AS just issued (a renewal) as an offline client, so that
    /// the registry knows it before its holder connects with it (`revoke NAME` finds it).
    /// A certificate already known stays as it is.
    ///
    /// # Errors
    /// Database failures.
    pub async fn issued(
        &self,
        fingerprint: &str,
        identity: (&str, &str),
        (certificate, blocks): (&str, &[IpNet]),
    ) -> Result<(), StoreError> {
        self.put_client(
            "ON CONFLICT (fingerprint) DO NOTHING",
            (0, None, None),
            fingerprint,
            identity,
            (certificate, blocks),
        )
        .await
    }

    /// Inserts a client row with no endpoints, `online`, the agent it runs as and its
    /// session's mark given, and its certificate's `blocks`; `on_conflict` says what happens
    /// to a client row already there (a fingerprint's blocks never change: it names one
    /// certificate).
    async fn put_client(
        &self,
        on_conflict: &str,
        (online, agent, session): (i64, Option<&str>, Option<&str>),
        fingerprint: &str,
        (name, issuer): (&str, &str),
        (certificate, blocks): (&str, &[IpNet]),
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO clients (fingerprint, name, certificate, endpoints, observed, online, updated_at, issuer, agent, session) \
             VALUES ($1, $2, $3, '[]', NULL, $6, $4, $5, $7, $8) {on_conflict}"
        ))
        .bind(fingerprint)
        .bind(name)
        .bind(certificate)
        .bind(unix_now())
        .bind(issuer)
        .bind(online)
        .bind(agent)
        .bind(session)
        .execute(&mut *tx)
        .await?;
        put_blocks(&mut tx, fingerprint, blocks).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Fills in the blocks of certificates registered before the blocks table (migration
    /// 0007): each is parsed once. Rows whose certificate does not parse are left without.
    async fn fill_blocks(&self) -> Result<(), StoreError> {
        let rows = sqlx::query(
            "SELECT fingerprint, certificate FROM clients \
             WHERE fingerprint NOT IN (SELECT fingerprint FROM blocks)",
        )
        .fetch_all(&self.pool)
        .await?;
        for r in &rows {
            let (fingerprint, pem): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let Ok(cert) = cyphonic_crypto::Certificate::from_pem(&pem) else {
                continue;
            };
            let mut tx = self.pool.begin().await?;
            put_blocks(&mut tx, &fingerprint, &cert.body().vip_blocks).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    /// Marks a client offline (its names stay: a tunnel to it may still work) and forgets
    /// the tunnels it reported.
    ///
    /// # Errors
    /// Database failures.
    pub async fn client_offline(&self, fingerprint: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE clients SET online = 0, updated_at = $2 WHERE fingerprint = $1")
            .bind(fingerprint)
            .bind(unix_now())
            .execute(&self.pool)
            .await?;
        self.forget_tunnels(fingerprint).await
    }

    /// Marks every client offline: at start, after a crash left some marked online.
    ///
    /// # Errors
    /// Database failures.
    pub async fn all_offline(&self) -> Result<(), StoreError> {
        sqlx::query("UPDATE clients SET online = 0")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Replaces a client's endpoints and names. Names belong to an identity (the issuing CA
    /// and the certificate's name): what an older certificate of the same identity held is
    /// released first, so a renewed or re-keyed client keeps its names. A certificate's own
    /// name is its holder's, taken back from a client that registered it for a device; the
    /// certificate name of another member is refused, and so is a name another client holds.
    /// Returns the refused names, each with why.
    ///
    /// # Errors
    /// Database failures.
    pub async fn register(
        &self,
        fingerprint: &str,
        (endpoints, mapping, tunnel): (&[SocketAddr], Option<&Mapping>, Option<TunnelVersions>),
        names: &[NameRecord],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let endpoints = serde_json::to_string(endpoints).unwrap_or_else(|_| "[]".into());
        let mapping = mapping.and_then(|m| serde_json::to_string(m).ok());
        let tunnel = tunnel.and_then(|t| serde_json::to_string(&t).ok());
        let mut tx = self.pool.begin().await?;
        let me = sqlx::query("SELECT name, issuer FROM clients WHERE fingerprint = $1")
            .bind(fingerprint)
            .fetch_optional(&mut *tx)
            .await?;
        let (my_name, my_issuer): (String, String) = match me {
            Some(row) => (row.try_get(0)?, row.try_get(1)?),
            None => (String::new(), String::new()),
        };
        sqlx::query(
            "UPDATE clients SET endpoints = $2, mapping = $4, tunnel = $5, updated_at = $3 \
             WHERE fingerprint = $1",
        )
        .bind(fingerprint)
        .bind(&endpoints)
        .bind(unix_now())
        .bind(mapping)
        .bind(tunnel)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM names WHERE owner = $1 OR owner IN (SELECT fingerprint FROM clients \
             WHERE name = $2 AND (issuer = $3 OR issuer = ''))",
        )
        .bind(fingerprint)
        .bind(&my_name)
        .bind(&my_issuer)
        .execute(&mut *tx)
        .await?;
        let mut refused = Vec::new();
        for n in names {
            if n.name == my_name {
                sqlx::query(
                    "DELETE FROM names WHERE name = $1 AND owner IN \
                     (SELECT fingerprint FROM clients WHERE name <> $1)",
                )
                .bind(&n.name)
                .execute(&mut *tx)
                .await?;
            } else if sqlx::query("SELECT 1 AS member FROM clients WHERE name = $1")
                .bind(&n.name)
                .fetch_optional(&mut *tx)
                .await?
                .is_some()
            {
                refused.push((n.name.clone(), "the name of another member".to_owned()));
                continue;
            }
            let done = sqlx::query(
                "INSERT INTO names (name, vip, owner, legacy, vip6) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(&n.name)
            .bind(n.vip.map(|a| a.to_string()))
            .bind(fingerprint)
            .bind(n.legacy.map(|a| a.to_string()))
            .bind(n.vip6.map(|a| a.to_string()))
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                refused.push((n.name.clone(), "registered by another client".to_owned()));
            }
        }
        tx.commit().await?;
        Ok(refused)
    }

    /// Records the address a client's endpoint probe came from: to the probe port, or
    /// (`alt`) to the second probe port.
    ///
    /// # Errors
    /// Database failures.
    pub async fn observed(
        &self,
        fingerprint: &str,
        addr: SocketAddr,
        alt: bool,
    ) -> Result<(), StoreError> {
        let query = if alt {
            "UPDATE clients SET observed_alt = $2, updated_at = $3 WHERE fingerprint = $1"
        } else {
            "UPDATE clients SET observed = $2, updated_at = $3 WHERE fingerprint = $1"
        };
        sqlx::query(query)
            .bind(fingerprint)
            .bind(addr.to_string())
            .bind(unix_now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A client by fingerprint.
    ///
    /// # Errors
    /// Database failures, or a row this version cannot read.
    pub async fn client(&self, fingerprint: &str) -> Result<Option<ClientRow>, StoreError> {
        let row = sqlx::query(
            "SELECT fingerprint, name, certificate, endpoints, observed, online, observed_alt, \
             mapping, tunnel FROM clients WHERE fingerprint = $1",
        )
        .bind(fingerprint)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| client_row(&r, 0)).transpose()
    }

    /// Who hosts `name`.
    ///
    /// # Errors
    /// Database failures, or a row this version cannot read.
    pub async fn lookup(&self, name: &str) -> Result<Option<NameRow>, StoreError> {
        let row = sqlx::query(
            "SELECT n.vip, c.fingerprint, c.name, c.certificate, c.endpoints, c.observed, c.online, \
             c.observed_alt, c.mapping, c.tunnel, n.vip6 FROM names n JOIN clients c \
             ON c.fingerprint = n.owner \
             WHERE n.name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let vip = address_at(&row, 0, "vip")?;
        let vip6 = address_at(&row, 10, "vip6")?;
        let owner = client_row(&row, 1)?;
        Ok(Some(NameRow { vip, vip6, owner }))
    }

    /// The names the client `fingerprint` hosts, with their vIPs; and the IPv6 addresses
    /// of those that registered one.
    ///
    /// # Errors
    /// Database failures, or a row this version cannot read.
    pub async fn names_of(&self, fingerprint: &str) -> Result<HostedNames, StoreError> {
        let rows = sqlx::query("SELECT name, vip, vip6 FROM names WHERE owner = $1 ORDER BY name")
            .bind(fingerprint)
            .fetch_all(&self.pool)
            .await?;
        let corrupt = |what: String| StoreError::Corrupt {
            table: "names",
            what,
        };
        let mut names = Vec::with_capacity(rows.len());
        let mut names6 = std::collections::BTreeMap::new();
        for r in &rows {
            let name: String = r.try_get(0)?;
            let vip: Option<Ipv4Addr> = address_at(r, 1, "vip")?;
            let vip6: Option<Ipv6Addr> = address_at(r, 2, "vip6")?;
            if vip.is_none() && vip6.is_none() {
                return Err(corrupt(format!("{name:?} without an address")));
            }
            if let Some(ip6) = vip6 {
                names6.insert(name.clone(), ip6);
            }
            if let Some(vip) = vip {
                names.push((name, vip));
            }
        }
        Ok((names, names6))
    }

    /// Every client the registry knows (each certificate apart: a renewed member shows its
    /// older certificates too), by name, then by when it was last seen, with its names.
    ///
    /// # Errors
    /// Database failures, or a row this version cannot read.
    pub async fn members(&self) -> Result<Vec<Member>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {MEMBER_COLUMNS} FROM clients ORDER BY name, updated_at"
        ))
        .fetch_all(&self.pool)
        .await?;
        let names = sqlx::query("SELECT owner, name, vip, legacy, vip6 FROM names ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        members_of(&rows, &names)
    }

    /// At most `limit` members (each certificate apart) after the one named `after` (its
    /// name and fingerprint), ordered by name then fingerprint: a page of the list, read
    /// from the store alone (the API's `GET /members`).
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn members_page(
        &self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Member>, StoreError> {
        let sql = format!(
            "SELECT {MEMBER_COLUMNS} FROM clients {} ORDER BY name, fingerprint LIMIT ${}",
            if after.is_some() {
                "WHERE (name, fingerprint) > ($1, $2)"
            } else {
                ""
            },
            if after.is_some() { 3 } else { 1 }
        );
        let mut query = sqlx::query(&sql);
        if let Some((name, fingerprint)) = after {
            query = query.bind(name).bind(fingerprint);
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        self.with_names(&rows).await
    }

    /// The certificates of the member `name`, by fingerprint.
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn members_named(&self, name: &str) -> Result<Vec<Member>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {MEMBER_COLUMNS} FROM clients WHERE name = $1 ORDER BY fingerprint"
        ))
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        self.with_names(&rows).await
    }

    /// The members of `rows` ([`MEMBER_COLUMNS`]) with the names they own.
    async fn with_names(&self, rows: &[sqlx::any::AnyRow]) -> Result<Vec<Member>, StoreError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let owners = (1..=rows.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT owner, name, vip, legacy, vip6 FROM names WHERE owner IN ({owners}) ORDER BY name"
        );
        let mut query = sqlx::query(&sql);
        for row in rows {
            query = query.bind(row.try_get::<String, _>(0)?);
        }
        let names = query.fetch_all(&self.pool).await?;
        members_of(rows, &names)
    }

    /// Forgets the offline clients whose certificate names `name` (a member's older
    /// certificates, or all of a member that is gone), with the names they host; returns how
    /// many were forgotten. An online one stays: its session would register again (revoke it
    /// first, or stop it).
    ///
    /// # Errors
    /// Database failures; [`StoreError::Online`] when the only certificates of `name` are
    /// online.
    pub async fn remove_member(&self, name: &str) -> Result<usize, StoreError> {
        let mut tx = self.pool.begin().await?;
        // What refers to the offline certificates first.
        for (table, column) in [
            ("names", "owner"),
            ("blocks", "fingerprint"),
            ("devices", "member"),
            ("tunnels", "member"),
        ] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE {column} IN \
                 (SELECT fingerprint FROM clients WHERE name = $1 AND online = 0)"
            ))
            .bind(name)
            .execute(&mut *tx)
            .await?;
        }
        let done = sqlx::query("DELETE FROM clients WHERE name = $1 AND online = 0")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let online = sqlx::query("SELECT 1 AS online FROM clients WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        if done.rows_affected() == 0 && online.is_some() {
            return Err(StoreError::Online(name.to_owned()));
        }
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    /// Releases every name `fingerprint` holds (its certificate is no longer trusted).
    ///
    /// # Errors
    /// Database failures.
    pub async fn release_names(&self, fingerprint: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM names WHERE owner = $1")
            .bind(fingerprint)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// How many clients are registered, and how many of them are online.
    ///
    /// # Errors
    /// Database failures.
    pub async fn counts(&self) -> Result<(i64, i64), StoreError> {
        let row =
            sqlx::query("SELECT COUNT(*), COUNT(CASE WHEN online <> 0 THEN 1 END) FROM clients")
                .fetch_one(&self.pool)
                .await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// How many names are registered.
    ///
    /// # Errors
    /// Database failures.
    pub async fn name_count(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) FROM names")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }
}

/// An enrollment token as the registry holds it (its secret only hashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// Names the token (16 hex digits); not secret.
    pub id: String,
    /// SHA-256 of the secret, hex.
    pub secret_sha256: String,
    /// The name the certificate will carry.
    pub name: String,
    /// Its vIP blocks.
    pub blocks: Vec<IpNet>,
    /// Its groups.
    pub groups: Vec<String>,
    /// The certificate's lifetime, seconds.
    pub lifetime: u64,
    /// When the token was made (unix seconds).
    pub created_at: u64,
    /// When it stops being accepted.
    pub expires_at: u64,
    /// When it was (last) redeemed.
    pub used_at: Option<u64>,
    /// The fingerprint of the certificate it was (last) redeemed for.
    pub used_by: Option<String>,
    /// The Noise static key it was redeemed with, hex.
    pub used_key: Option<String>,
    /// When the certificate it was redeemed for first opened a session: from then on the
    /// token is spent for good.
    pub confirmed_at: Option<u64>,
    /// When it was revoked.
    pub revoked_at: Option<u64>,
}

impl TokenRow {
    /// What may be done with it at unix time `now`, in a word: `live`, `issued` (redeemed,
    /// its certificate not seen yet: the same key may redeem it again until it expires),
    /// `used`, `revoked` or `expired`.
    pub fn state(&self, now: u64) -> &'static str {
        if self.confirmed_at.is_some() {
            "used"
        } else if self.revoked_at.is_some() {
            "revoked"
        } else if now >= self.expires_at {
            if self.used_at.is_some() {
                "used"
            } else {
                "expired"
            }
        } else if self.used_at.is_some() {
            "issued"
        } else {
            "live"
        }
    }
}

const TOKEN_COLUMNS: &str = "id, secret_sha256, name, blocks, member_groups, lifetime, created_at, \
     expires_at, used_at, used_by, revoked_at, used_key, confirmed_at";

fn token_row(row: &sqlx::any::AnyRow) -> Result<TokenRow, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt {
        table: "tokens",
        what,
    };
    let secs = |v: i64| from_db::<u64>("tokens", v);
    let opt = |v: Option<i64>| opt_from_db::<u64>("tokens", v);
    let blocks: String = row.try_get(3)?;
    let groups: String = row.try_get(4)?;
    Ok(TokenRow {
        id: row.try_get(0)?,
        secret_sha256: row.try_get(1)?,
        name: row.try_get(2)?,
        blocks: serde_json::from_str::<Vec<String>>(&blocks)
            .ok()
            .and_then(|b| b.iter().map(|b| b.parse().ok()).collect())
            .ok_or_else(|| corrupt(format!("blocks {blocks:?}")))?,
        groups: serde_json::from_str(&groups).map_err(|_| corrupt(format!("groups {groups:?}")))?,
        lifetime: secs(row.try_get(5)?)?,
        created_at: secs(row.try_get(6)?)?,
        expires_at: secs(row.try_get(7)?)?,
        used_at: opt(row.try_get(8)?)?,
        used_by: row.try_get(9)?,
        revoked_at: opt(row.try_get(10)?)?,
        used_key: row.try_get(11)?,
        confirmed_at: opt(row.try_get(12)?)?,
    })
}

fn db_secs(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A query's values, numbered `$1`, `$2`... in the order they are added, bound in that order
/// ([`Params::query`]): SQL built piece by piece that SQLite and PostgreSQL both read through
/// sqlx's Any driver (its `QueryBuilder` writes `?`, which PostgreSQL does not).
#[derive(Debug, Default)]
struct Params(Vec<Param>);

#[derive(Debug)]
enum Param {
    Text(Option<String>),
    Int(Option<i64>),
}

impl Params {
    /// The placeholder of a text value.
    fn text(&mut self, v: Option<String>) -> String {
        self.0.push(Param::Text(v));
        format!("${}", self.0.len())
    }

    /// The placeholder of an integer value.
    fn int(&mut self, v: Option<i64>) -> String {
        self.0.push(Param::Int(v));
        format!("${}", self.0.len())
    }

    /// `sql` with the values bound.
    fn query(self, sql: &str) -> sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments<'_>> {
        let mut q = sqlx::query(sql);
        for p in self.0 {
            q = match p {
                Param::Text(v) => q.bind(v),
                Param::Int(v) => q.bind(v),
            };
        }
        q
    }
}

/// An integer column's value as `T`: one out of `T`'s range (a negative time or count, a
/// port above 65535) is a row this version cannot read.
fn from_db<T: TryFrom<i64>>(table: &'static str, v: i64) -> Result<T, StoreError> {
    T::try_from(v).map_err(|_| StoreError::Corrupt {
        table,
        what: format!("{v} out of range"),
    })
}

/// [`from_db`] of a column that may be NULL.
fn opt_from_db<T: TryFrom<i64>>(
    table: &'static str,
    v: Option<i64>,
) -> Result<Option<T>, StoreError> {
    v.map(|v| from_db(table, v)).transpose()
}

/// A counter as the store keeps it: capped at `i64::MAX`.
fn db_count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Store {
    /// Writes a new token.
    ///
    /// # Errors
    /// Database failures (an id already taken among them).
    pub async fn add_token(&self, t: &TokenRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO tokens (id, secret_sha256, name, blocks, member_groups, lifetime, created_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&t.id)
        .bind(&t.secret_sha256)
        .bind(&t.name)
        .bind(
            serde_json::to_string(&t.blocks.iter().map(ToString::to_string).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .bind(serde_json::to_string(&t.groups).unwrap_or_default())
        .bind(db_secs(t.lifetime))
        .bind(db_secs(t.created_at))
        .bind(db_secs(t.expires_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every token, newest first.
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at DESC, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(token_row).collect()
    }

    /// The token `id`.
    ///
    /// # Errors
    /// Database failures, an unreadable row.
    pub async fn token(&self, id: &str) -> Result<Option<TokenRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(token_row).transpose()
    }

    /// Revokes the token `id` unless it was used or revoked; returns whether it was.
    ///
    /// # Errors
    /// Database failures.
    pub async fn revoke_token(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE tokens SET revoked_at = $2 WHERE id = $1 AND used_at IS NULL \
             AND revoked_at IS NULL",
        )
        .bind(id)
        .bind(db_secs(now))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Redeems the token `id` for the certificate `fingerprint`: one update that succeeds
    /// only while it is unused, not revoked and unexpired at `now`, so that two instances
    /// cannot both redeem it. Returns whether it did.
    ///
    /// # Errors
    /// Database failures.
    pub async fn redeem_token(
        &self,
        id: &str,
        now: u64,
        fingerprint: &str,
        key: &str,
    ) -> Result<bool, StoreError> {
        // Unused; or redeemed by this very key for a certificate that never connected (the
        // device refused it: its clock was behind), which the new one replaces.
        let done = sqlx::query(
            "UPDATE tokens SET used_at = $2, used_by = $3, used_key = $4 WHERE id = $1 \
             AND revoked_at IS NULL AND expires_at > $2 AND confirmed_at IS NULL \
             AND (used_at IS NULL OR used_key = $4)",
        )
        .bind(id)
        .bind(db_secs(now))
        .bind(fingerprint)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The certificates of `name` from the issuing CA `issuer` (hex of its key; rows written
    /// before the column count as the same CA) that connected or were issued, with their
    /// fingerprints.
    ///
    /// # Errors
    /// Database failures.
    pub async fn certificates_named(
        &self,
        name: &str,
        issuer: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT fingerprint, certificate FROM clients WHERE name = $1 \
             AND (issuer = $2 OR issuer = '')",
        )
        .bind(name)
        .bind(issuer)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// The certificates, with their names, of clients not named `name` that hold a block
    /// overlapping one of `blocks` (no two names hold one address): found through the
    /// blocks table, so the cost is in the matches, not in the registry's size. Blocks are
    /// CIDR prefixes, so two overlap only when one holds the other: a block inside ours
    /// starts within it, and one holding ours starts at our first address masked to its
    /// shorter length.
    ///
    /// # Errors
    /// Database failures.
    pub async fn certificates_overlapping(
        &self,
        name: &str,
        blocks: &[IpNet],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut out: Vec<(String, String)> = Vec::new();
        for block in blocks {
            let (first, last) = block_range(block);
            let holders: Vec<String> = (0..block.prefix_len())
                .map(|len| block_range(&IpNet::new_assert(block.addr(), len).trunc()).0)
                .collect();
            let marks: Vec<String> = (0..holders.len()).map(|i| format!("${}", i + 4)).collect();
            let inside = "b.first >= $2 AND b.first <= $3";
            let filter = if marks.is_empty() {
                inside.to_owned()
            } else {
                format!(
                    "{inside} OR (b.last >= $2 AND b.first IN ({}))",
                    marks.join(", ")
                )
            };
            let sql = format!(
                "SELECT DISTINCT c.name, c.certificate, c.fingerprint FROM blocks b \
                 JOIN clients c ON c.fingerprint = b.fingerprint \
                 WHERE c.name <> $1 AND ({filter})"
            );
            let mut q = sqlx::query(&sql).bind(name).bind(first).bind(last);
            for h in holders {
                q = q.bind(h);
            }
            for r in q.fetch_all(&self.pool).await? {
                let found: (String, String) = (r.try_get(0)?, r.try_get(1)?);
                if !out.contains(&found) {
                    out.push(found);
                }
            }
        }
        Ok(out)
    }

    /// The certificate `fingerprint`, of `name` for the static key `key` (hex), opened a
    /// session at `now`: a token of that name redeemed by that key is spent for good, and
    /// names this certificate (the one its holder uses, whichever redemption made it).
    ///
    /// # Errors
    /// Database failures.
    pub async fn confirm_token(
        &self,
        fingerprint: &str,
        name: &str,
        key: &str,
        now: u64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE tokens SET confirmed_at = $4, used_by = $1 WHERE name = $2 AND used_key = $3 \
             AND confirmed_at IS NULL",
        )
        .bind(fingerprint)
        .bind(name)
        .bind(key)
        .bind(db_secs(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

impl Store {
    /// The fingerprints of every certificate the registry knows for `name`: those that
    /// connected, and those tokens were redeemed for.
    ///
    /// # Errors
    /// Database failures.
    pub async fn fingerprints_named(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let mut out: Vec<String> = Vec::new();
        for row in sqlx::query("SELECT fingerprint FROM clients WHERE name = $1")
            .bind(name)
            .fetch_all(&self.pool)
            .await?
        {
            out.push(row.try_get(0)?);
        }
        for row in sqlx::query("SELECT used_by FROM tokens WHERE name = $1 AND used_by IS NOT NULL")
            .bind(name)
            .fetch_all(&self.pool)
            .await?
        {
            let fp: String = row.try_get(0)?;
            if !out.contains(&fp) {
                out.push(fp);
            }
        }
        Ok(out)
    }

    /// Records `fingerprints` (of certificates named `name`) as revoked at `now`; returns
    /// how many were not revoked before.
    ///
    /// # Errors
    /// Database failures.
    pub async fn revoke(
        &self,
        fingerprints: &[String],
        name: &str,
        now: u64,
    ) -> Result<usize, StoreError> {
        let mut added = 0;
        for fp in fingerprints {
            let done = sqlx::query(
                "INSERT INTO revocations (fingerprint, name, revoked_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (fingerprint) DO NOTHING",
            )
            .bind(fp)
            .bind(name)
            .bind(db_secs(now))
            .execute(&self.pool)
            .await?;
            added += usize::try_from(done.rows_affected()).unwrap_or(0);
        }
        Ok(added)
    }

    /// How many fingerprints were revoked online.
    ///
    /// # Errors
    /// Database failures.
    pub async fn revocation_count(&self) -> Result<usize, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) FROM revocations")
            .fetch_one(&self.pool)
            .await?;
        Ok(usize::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0))
    }

    /// Every certificate revoked online, newest first: its fingerprint, the name it was
    /// revoked by (empty when by fingerprint) and when (unix seconds).
    ///
    /// # Errors
    /// Database failures.
    pub async fn revocation_rows(&self) -> Result<Vec<(String, String, u64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT fingerprint, name, revoked_at FROM revocations \
             ORDER BY revoked_at DESC, fingerprint",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let at: i64 = r.try_get(2)?;
                Ok((
                    r.try_get(0)?,
                    r.try_get(1)?,
                    u64::try_from(at).map_err(|_| StoreError::Corrupt {
                        table: "revocations",
                        what: format!("revoked_at {at}"),
                    })?,
                ))
            })
            .collect()
    }

    /// Every fingerprint revoked online, oldest first.
    ///
    /// # Errors
    /// Database failures.
    pub async fn revocations(&self) -> Result<Vec<String>, StoreError> {
        let rows =
            sqlx::query("SELECT fingerprint FROM revocations ORDER BY revoked_at, fingerprint")
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(StoreError::from))
            .collect()
    }
}

/// The address in column `at` of a `names` row (`what` names it in an error), if any.
fn address_at<T: std::str::FromStr>(
    row: &sqlx::any::AnyRow,
    at: usize,
    what: &str,
) -> Result<Option<T>, StoreError> {
    let text: Option<String> = row.try_get(at)?;
    text.map(|t| {
        t.parse().map_err(|_| StoreError::Corrupt {
            table: "names",
            what: format!("{what} {t:?}"),
        })
    })
    .transpose()
}

/// Reads the client columns `fingerprint, name, certificate, endpoints, observed, online,
/// observed_alt, mapping, tunnel` starting at column `at`.
fn client_row(row: &sqlx::any::AnyRow, at: usize) -> Result<ClientRow, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt {
        table: "clients",
        what,
    };
    let endpoints: String = row.try_get(at + 3)?;
    let observed: Option<String> = row.try_get(at + 4)?;
    let online: i64 = row.try_get(at + 5)?;
    let observed_alt: Option<String> = row.try_get(at + 6)?;
    let mapping: Option<String> = row.try_get(at + 7)?;
    let tunnel: Option<String> = row.try_get(at + 8)?;
    let addr = |o: Option<String>, what: &str| match o {
        Some(o) => o
            .parse()
            .map(Some)
            .map_err(|_| corrupt(format!("{what} {o:?}"))),
        None => Ok(None),
    };
    Ok(ClientRow {
        fingerprint: row.try_get(at)?,
        name: row.try_get(at + 1)?,
        certificate: row.try_get(at + 2)?,
        endpoints: serde_json::from_str(&endpoints)
            .map_err(|_| corrupt(format!("endpoints {endpoints:?}")))?,
        observed: addr(observed, "observed")?,
        observed_alt: addr(observed_alt, "observed_alt")?,
        mapping: mapping
            .map(|m| serde_json::from_str(&m).map_err(|_| corrupt(format!("mapping {m:?}"))))
            .transpose()?,
        tunnel: tunnel
            .map(|t| serde_json::from_str(&t).map_err(|_| corrupt(format!("tunnel {t:?}"))))
            .transpose()?,
        online: online != 0,
    })
}

/// The columns [`members_of`] reads, in its order.
const MEMBER_COLUMNS: &str = "fingerprint, name, certificate, endpoints, observed, online, \
     observed_alt, mapping, tunnel, updated_at, agent, pair";

/// Members from their `clients` rows ([`MEMBER_COLUMNS`]) and the `names` rows they own.
fn members_of(
    rows: &[sqlx::any::AnyRow],
    names: &[sqlx::any::AnyRow],
) -> Result<Vec<Member>, StoreError> {
    // Each client's names, grouped once (not looked up per client).
    let mut held: std::collections::HashMap<String, Vec<(String, Option<Ipv4Addr>)>> =
        std::collections::HashMap::new();
    let mut legacy = std::collections::BTreeMap::new();
    let mut names6 = std::collections::BTreeMap::new();
    for n in names {
        let vip: Option<Ipv4Addr> = address_at(n, 2, "vip")?;
        let name: String = n.try_get(1)?;
        if let Some(own) = address_at(n, 3, "legacy")? {
            legacy.insert(name.clone(), own);
        }
        match address_at::<Ipv6Addr>(n, 4, "vip6")? {
            Some(ip6) => {
                names6.insert(name.clone(), ip6);
            }
            None if vip.is_none() => {
                return Err(StoreError::Corrupt {
                    table: "names",
                    what: format!("{name:?} without an address"),
                });
            }
            None => {}
        }
        held.entry(n.try_get(0)?).or_default().push((name, vip));
    }
    let mut members = Vec::with_capacity(rows.len());
    for row in rows {
        let client = client_row(row, 0)?;
        let last_seen: i64 = row.try_get(9)?;
        let agent: Option<String> = row.try_get(10)?;
        let pair: Option<String> = row.try_get(11)?;
        let pair = pair
            .map(|text| {
                serde_json::from_str::<PairReport>(&text).map_err(|e| StoreError::Corrupt {
                    table: "clients",
                    what: format!("pair of {}: {e}", client.fingerprint),
                })
            })
            .transpose()?;
        let names = held.remove(&client.fingerprint).unwrap_or_default();
        members.push(Member {
            legacy: names
                .iter()
                .filter_map(|(n, _)| Some((n.clone(), *legacy.get(n)?)))
                .collect(),
            names6: names
                .iter()
                .filter_map(|(n, _)| Some((n.clone(), *names6.get(n)?)))
                .collect(),
            // A device with IPv6 only is in `names6` alone.
            names: names
                .into_iter()
                .filter_map(|(n, vip)| Some((n, vip?)))
                .collect(),
            client,
            last_seen: u64::try_from(last_seen).unwrap_or(0),
            agent,
            pair,
        });
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_stay_out_of_logs() {
        assert_eq!(
            super::redact("postgres://cy:secret@127.0.0.1/cy"),
            "postgres://cy:***@127.0.0.1/cy"
        );
        assert_eq!(super::redact("sqlite:///x.db"), "sqlite:///x.db");
    }
}
