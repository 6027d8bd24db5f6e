//! The audit log and the API tokens in the store (docs/protocol.md §8).

use sqlx::Row as _;

use super::{Store, StoreError, db_secs, from_db, opt_from_db};

/// One row of the audit log: a change to the registry, or a refused attempt at one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Names the row (16 hex digits, random).
    pub id: String,
    /// When (unix milliseconds).
    pub at: u64,
    /// Who: `token:<id> <name>`, `person:<subject> <email>`, `cli:<unix user>`,
    /// `member:<name>` (enrollment, renewal) or `cloud` (a reload).
    pub actor: String,
    /// From where: an address, or `local`.
    pub source: String,
    /// What, as `<object>.<verb>`: `enrollment_token.create`, `member.revoke`, ...
    pub action: String,
    /// On what: a member's name, a token's id, ...
    pub target: String,
    /// `ok`, or the error's stable code (`invalid`, `not_found`, `conflict`, ...).
    pub result: String,
    /// The rest, as a JSON object.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// Which rows of the audit log a listing wants, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only this actor (exactly).
    pub actor: Option<String>,
    /// Only this action (exactly).
    pub action: Option<String>,
    /// Only this target (exactly).
    pub target: Option<String>,
    /// Only rows before this `(at, id)`: the cursor of the page before.
    pub before: Option<(u64, String)>,
    /// At most this many.
    pub limit: u32,
}

/// An API token as the store holds it (its secret only hashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTokenRow {
    /// Names the token (16 hex digits); not secret.
    pub id: String,
    /// SHA-256 of the secret, hex.
    pub secret_sha256: String,
    /// What it is for, in the operator's words.
    pub name: String,
    /// `read`, `write` or `admin`.
    pub scope: String,
    /// The actor who made it.
    pub created_by: String,
    /// When (unix seconds).
    pub created_at: u64,
    /// When it stops being accepted, if ever.
    pub expires_at: Option<u64>,
    /// When it was revoked.
    pub revoked_at: Option<u64>,
}

impl ApiTokenRow {
    /// At unix time `now`: `live`, `expired` or `revoked`.
    pub fn state(&self, now: u64) -> &'static str {
        if self.revoked_at.is_some() {
            "revoked"
        } else if self.expires_at.is_some_and(|e| now >= e) {
            "expired"
        } else {
            "live"
        }
    }
}

const API_TOKEN_COLUMNS: &str =
    "id, secret_sha256, name, scope, created_by, created_at, expires_at, revoked_at";

fn api_token_row(row: &sqlx::any::AnyRow) -> Result<ApiTokenRow, StoreError> {
    let secs = |v: i64| from_db::<u64>("api_tokens", v);
    let opt = |v: Option<i64>| opt_from_db::<u64>("api_tokens", v);
    Ok(ApiTokenRow {
        id: row.try_get(0)?,
        secret_sha256: row.try_get(1)?,
        name: row.try_get(2)?,
        scope: row.try_get(3)?,
        created_by: row.try_get(4)?,
        created_at: secs(row.try_get(5)?)?,
        expires_at: opt(row.try_get(6)?)?,
        revoked_at: opt(row.try_get(7)?)?,
    })
}

fn audit_row(row: &sqlx::any::AnyRow) -> Result<AuditEntry, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt {
        table: "audit",
        what,
    };
    let at: i64 = row.try_get(1)?;
    let details: String = row.try_get(7)?;
    Ok(AuditEntry {
        id: row.try_get(0)?,
        at: u64::try_from(at).map_err(|_| corrupt(format!("at {at}")))?,
        actor: row.try_get(2)?,
        source: row.try_get(3)?,
        action: row.try_get(4)?,
        target: row.try_get(5)?,
        result: row.try_get(6)?,
        details: serde_json::from_str(&details)
            .map_err(|_| corrupt(format!("details {details:?}")))?,
    })
}

impl Store {
    /// Adds `entry` to the audit log.
    ///
    /// # Errors
    /// Database failures.
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO audit (id, at, actor, source, action, target, result, details) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&entry.id)
        .bind(db_secs(entry.at))
        .bind(&entry.actor)
        .bind(&entry.source)
        .bind(&entry.action)
        .bind(&entry.target)
        .bind(&entry.result)
        .bind(entry.details.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The rows of the audit log `q` asks for, newest first.
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn audit_log(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        // Placeholders are numbered in the order the filters are bound.
        let mut filters = Vec::new();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        for (column, given) in [
            ("actor", &q.actor),
            ("action", &q.action),
            ("target", &q.target),
        ] {
            if given.is_some() {
                filters.push(format!("{column} = ${}", next()));
            }
        }
        if q.before.is_some() {
            let (a, b, c) = (next(), next(), next());
            filters.push(format!("(at < ${a} OR (at = ${b} AND id < ${c}))"));
        }
        let limit = next();
        let sql = format!(
            "SELECT id, at, actor, source, action, target, result, details FROM audit {} \
             ORDER BY at DESC, id DESC LIMIT ${limit}",
            if filters.is_empty() {
                String::new()
            } else {
                format!("WHERE {}", filters.join(" AND "))
            }
        );
        let mut query = sqlx::query(&sql);
        for given in [&q.actor, &q.action, &q.target].into_iter().flatten() {
            query = query.bind(given);
        }
        if let Some((at, id)) = &q.before {
            query = query.bind(db_secs(*at)).bind(db_secs(*at)).bind(id);
        }
        let rows = query.bind(i64::from(q.limit)).fetch_all(&self.pool).await?;
        rows.iter().map(audit_row).collect()
    }

    /// Forgets the audit log's rows older than `before` (unix milliseconds); returns how
    /// many. The only deletion of audit rows there is.
    ///
    /// # Errors
    /// Database failures.
    pub async fn audit_sweep(&self, before: u64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM audit WHERE at < $1")
            .bind(db_secs(before))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Writes a new API token.
    ///
    /// # Errors
    /// Database failures (an id already taken among them).
    pub async fn add_api_token(&self, t: &ApiTokenRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_tokens (id, secret_sha256, name, scope, created_by, created_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&t.id)
        .bind(&t.secret_sha256)
        .bind(&t.name)
        .bind(&t.scope)
        .bind(&t.created_by)
        .bind(db_secs(t.created_at))
        .bind(t.expires_at.map(db_secs))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every API token, newest first.
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn api_tokens(&self) -> Result<Vec<ApiTokenRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {API_TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at DESC, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(api_token_row).collect()
    }

    /// The API token `id`.
    ///
    /// # Errors
    /// Database failures, an unreadable row.
    pub async fn api_token(&self, id: &str) -> Result<Option<ApiTokenRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {API_TOKEN_COLUMNS} FROM api_tokens WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(api_token_row).transpose()
    }

    /// Revokes the API token `id` unless it was revoked; returns whether it was.
    ///
    /// # Errors
    /// Database failures.
    pub async fn revoke_api_token(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE api_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .bind(db_secs(now))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
