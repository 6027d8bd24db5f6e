//! Flow records (docs/protocol.md §8, *Flow logs*): kept as members send them, read back
//! newest first, forgotten after `[flows] keep_days`.

use cyphonic_control::{FlowRecord, RefusedRecord};
use serde::Serialize;
use sqlx::Row as _;

use super::{Params, Store, StoreError, db_count, db_secs, from_db, opt_from_db};

/// Rows one INSERT carries at most (SQLite's limit of bound values is the tighter).
const ROWS_PER_INSERT: usize = 50;

/// A flow record as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FlowRow {
    /// Names the record.
    pub id: String,
    /// `flow` (one that ended) or `refused` (new flows from `src` no rule allowed).
    pub kind: String,
    /// The member that recorded it.
    pub member: String,
    /// Its certificate's fingerprint.
    pub fingerprint: String,
    /// The IP protocol number (a flow's).
    pub proto: Option<u8>,
    /// The opener's address (refused: the source's).
    pub src: String,
    /// Its port.
    pub sport: Option<u16>,
    /// The answerer's address.
    pub dst: Option<String>,
    /// Its port.
    pub dport: Option<u16>,
    /// `out` (opened from the member's side) or `in` (from the tunnel).
    pub dir: String,
    /// Its first packet (refused: the first refused), unix seconds.
    pub start: u64,
    /// Its end (refused: the last refused), unix seconds.
    pub end: u64,
    /// Bytes from the opener.
    pub tx_bytes: u64,
    /// Packets from the opener (refused: packets refused).
    pub tx_packets: u64,
    /// Bytes from the answerer.
    pub rx_bytes: u64,
    /// Packets from the answerer.
    pub rx_packets: u64,
    /// The rule that allowed it (0: allowed by default).
    pub rule: Option<u32>,
    /// Refused: distinct destination ports (counted up to 1,024).
    pub ports: Option<u32>,
}

/// Which flow records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowQuery {
    /// Only this member's.
    pub member: Option<String>,
    /// Only those from or to this address.
    pub address: Option<String>,
    /// Only those that ended at or after (unix seconds).
    pub since: Option<u64>,
    /// Only those that ended at or before.
    pub until: Option<u64>,
    /// After this record (its end and id), newest first.
    pub after: Option<(u64, String)>,
    /// At most this many.
    pub limit: u32,
}

/// A record's id: 8 random bytes and a counter of this process, in hex (should the system's
/// generator fail, the counter alone still tells this instance's records apart).
fn record_id() -> String {
    use ring::rand::SecureRandom as _;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}{n:016x}", hex::encode(b))
}

const COLUMNS: &str = "id, kind, member, fingerprint, proto, src, sport, dst, dport, dir, \
     started, ended, tx_bytes, tx_packets, rx_bytes, rx_packets, rule, ports";

fn flow_row(row: &sqlx::any::AnyRow) -> Result<FlowRow, StoreError> {
    let t = "flows";
    Ok(FlowRow {
        id: row.try_get(0)?,
        kind: row.try_get(1)?,
        member: row.try_get(2)?,
        fingerprint: row.try_get(3)?,
        proto: opt_from_db(t, row.try_get(4)?)?,
        src: row.try_get(5)?,
        sport: opt_from_db(t, row.try_get(6)?)?,
        dst: row.try_get(7)?,
        dport: opt_from_db(t, row.try_get(8)?)?,
        dir: row.try_get(9)?,
        start: from_db(t, row.try_get(10)?)?,
        end: from_db(t, row.try_get(11)?)?,
        tx_bytes: from_db(t, row.try_get(12)?)?,
        tx_packets: from_db(t, row.try_get(13)?)?,
        rx_bytes: from_db(t, row.try_get(14)?)?,
        rx_packets: from_db(t, row.try_get(15)?)?,
        rule: opt_from_db(t, row.try_get(16)?)?,
        ports: opt_from_db(t, row.try_get(17)?)?,
    })
}

impl Store {
    /// Keeps the flow records the member `name` (certificate `fingerprint`) sent, in one
    /// transaction.
    ///
    /// # Errors
    /// Database failures.
    pub async fn keep_flows(
        &self,
        (fingerprint, name): (&str, &str),
        flows: &[FlowRecord],
        refused: &[RefusedRecord],
    ) -> Result<(), StoreError> {
        if flows.is_empty() && refused.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let (member, fp) = (Some(name.to_owned()), Some(fingerprint.to_owned()));
        for chunk in flows.chunks(ROWS_PER_INSERT) {
            let mut p = Params::default();
            let rows: Vec<String> = chunk
                .iter()
                .map(|f| {
                    let values = [
                        p.text(Some(record_id())),
                        p.text(Some("flow".to_owned())),
                        p.text(member.clone()),
                        p.text(fp.clone()),
                        p.int(Some(i64::from(f.proto))),
                        p.text(Some(f.src.to_string())),
                        p.int(Some(i64::from(f.sport))),
                        p.text(Some(f.dst.to_string())),
                        p.int(Some(i64::from(f.dport))),
                        p.text(Some(f.dir.as_str().to_owned())),
                        p.int(Some(db_secs(f.start))),
                        p.int(Some(db_secs(f.end))),
                        p.int(Some(db_count(f.tx_bytes))),
                        p.int(Some(db_count(f.tx_packets))),
                        p.int(Some(db_count(f.rx_bytes))),
                        p.int(Some(db_count(f.rx_packets))),
                        p.int(Some(i64::from(f.rule))),
                        p.int(None),
                    ];
                    format!("({})", values.join(", "))
                })
                .collect();
            let sql = format!("INSERT INTO flows ({COLUMNS}) VALUES {}", rows.join(", "));
            p.query(&sql).execute(&mut *tx).await?;
        }
        for chunk in refused.chunks(ROWS_PER_INSERT) {
            let mut p = Params::default();
            let rows: Vec<String> = chunk
                .iter()
                .map(|r| {
                    let values = [
                        p.text(Some(record_id())),
                        p.text(Some("refused".to_owned())),
                        p.text(member.clone()),
                        p.text(fp.clone()),
                        p.int(None),
                        p.text(Some(r.src.to_string())),
                        p.int(None),
                        p.text(None),
                        p.int(None),
                        p.text(Some(r.dir.as_str().to_owned())),
                        p.int(Some(db_secs(r.first))),
                        p.int(Some(db_secs(r.last))),
                        p.int(Some(0)),
                        p.int(Some(db_count(r.packets))),
                        p.int(Some(0)),
                        p.int(Some(0)),
                        p.int(None),
                        p.int(Some(i64::from(r.ports))),
                    ];
                    format!("({})", values.join(", "))
                })
                .collect();
            let sql = format!("INSERT INTO flows ({COLUMNS}) VALUES {}", rows.join(", "));
            p.query(&sql).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The flow records `q` asks for, newest first (by end, then id).
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn flows_page(&self, q: &FlowQuery) -> Result<Vec<FlowRow>, StoreError> {
        let mut p = Params::default();
        let mut sql = format!("SELECT {COLUMNS} FROM flows WHERE 1 = 1");
        if let Some(m) = &q.member {
            sql += &format!(" AND member = {}", p.text(Some(m.clone())));
        }
        if let Some(a) = &q.address {
            let (src, dst) = (p.text(Some(a.clone())), p.text(Some(a.clone())));
            sql += &format!(" AND (src = {src} OR dst = {dst})");
        }
        if let Some(t) = q.since {
            sql += &format!(" AND ended >= {}", p.int(Some(db_secs(t))));
        }
        if let Some(t) = q.until {
            sql += &format!(" AND ended <= {}", p.int(Some(db_secs(t))));
        }
        if let Some((end, id)) = &q.after {
            let (before, same, id) = (
                p.int(Some(db_secs(*end))),
                p.int(Some(db_secs(*end))),
                p.text(Some(id.clone())),
            );
            sql += &format!(" AND (ended < {before} OR (ended = {same} AND id < {id}))");
        }
        sql += &format!(
            " ORDER BY ended DESC, id DESC LIMIT {}",
            p.int(Some(i64::from(q.limit)))
        );
        let rows = p.query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(flow_row).collect()
    }

    /// Forgets the flow records that ended before `before` (unix seconds); how many.
    ///
    /// # Errors
    /// Database failures.
    pub async fn flows_sweep(&self, before: u64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM flows WHERE ended < $1")
            .bind(db_secs(before))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
