//! People's console sessions in the store (docs/protocol.md §8, Who may do what).

use sqlx::Row as _;

use super::{Store, StoreError, db_secs, from_db};

/// A signed-in person's session as the store holds it (its cookie only hashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// SHA-256 of the cookie's secret, hex: names the row.
    pub id_sha256: String,
    /// The provider's subject (`sub`).
    pub subject: String,
    /// How the person is shown: their email, else their name, else the subject.
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
    /// The token every write from this session carries in `X-CSRF-Token`.
    pub csrf: String,
    /// Where the person signed in from.
    pub source: String,
    /// When (unix seconds).
    pub created_at: u64,
    /// The last request seen, to the minute.
    pub seen_at: u64,
    /// When it ends whatever happens.
    pub ends_at: u64,
}

const SESSION_COLUMNS: &str =
    "id_sha256, subject, name, role, csrf, source, created_at, seen_at, ends_at";

fn session_row(row: &sqlx::any::AnyRow) -> Result<SessionRow, StoreError> {
    let secs = |v: i64| from_db::<u64>("sessions", v);
    Ok(SessionRow {
        id_sha256: row.try_get(0)?,
        subject: row.try_get(1)?,
        name: row.try_get(2)?,
        role: row.try_get(3)?,
        csrf: row.try_get(4)?,
        source: row.try_get(5)?,
        created_at: secs(row.try_get(6)?)?,
        seen_at: secs(row.try_get(7)?)?,
        ends_at: secs(row.try_get(8)?)?,
    })
}

impl Store {
    /// Writes a new session, then ends its subject's oldest beyond the newest `most`: a
    /// person signing in again and again holds at most `most` sessions.
    ///
    /// # Errors
    /// Database failures.
    pub async fn add_session(&self, s: &SessionRow, most: u32) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO sessions ({SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .bind(&s.id_sha256)
        .bind(&s.subject)
        .bind(&s.name)
        .bind(&s.role)
        .bind(&s.csrf)
        .bind(&s.source)
        .bind(db_secs(s.created_at))
        .bind(db_secs(s.seen_at))
        .bind(db_secs(s.ends_at))
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM sessions WHERE subject = $1 AND id_sha256 NOT IN (SELECT id_sha256 \
             FROM sessions WHERE subject = $2 ORDER BY created_at DESC, id_sha256 LIMIT $3)",
        )
        .bind(&s.subject)
        .bind(&s.subject)
        .bind(i64::from(most))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The sessions live at unix time `now`: not past `ends_at`, and seen within `idle`
    /// seconds.
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn sessions(&self, now: u64, idle: u64) -> Result<Vec<SessionRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE ends_at > $1 AND seen_at > $2"
        ))
        .bind(db_secs(now))
        .bind(db_secs(now.saturating_sub(idle)))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_row).collect()
    }

    /// Notes a request of session `id_sha256` at `now`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn touch_session(&self, id_sha256: &str, now: u64) -> Result<(), StoreError> {
        sqlx::query("UPDATE sessions SET seen_at = $2 WHERE id_sha256 = $1 AND seen_at < $2")
            .bind(id_sha256)
            .bind(db_secs(now))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Ends session `id_sha256` (signing out); returns whether there was one.
    ///
    /// # Errors
    /// Database failures.
    pub async fn end_session(&self, id_sha256: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE id_sha256 = $1")
            .bind(id_sha256)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Forgets the sessions ended at `now` (past `ends_at`, or idle for `idle` seconds);
    /// returns how many.
    ///
    /// # Errors
    /// Database failures.
    pub async fn sessions_sweep(&self, now: u64, idle: u64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE ends_at <= $1 OR seen_at <= $2")
            .bind(db_secs(now))
            .bind(db_secs(now.saturating_sub(idle)))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
