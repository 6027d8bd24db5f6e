//! What members say of their devices and tunnels (docs/protocol.md §8, *Devices and
//! tunnels*): kept whole per member, read back a page at a time.

use std::net::IpAddr;

use cyphonic_control::report::Report;
use serde::Serialize;
use sqlx::Row as _;

use super::{Params, Store, StoreError, db_count, db_secs, from_db, opt_from_db};

/// Rows one INSERT carries at most (SQLite's limit of bound values is the tighter).
const ROWS_PER_INSERT: usize = 50;

/// A device as the store keeps it, for the API and the console.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DeviceRow {
    /// Its vIP, else its IPv6 address: what names it within its adapter.
    pub address: String,
    /// Its MAC.
    pub mac: String,
    /// Its IPv4 vIP.
    pub vip: Option<String>,
    /// Its IPv6 address.
    pub vip6: Option<String>,
    /// A fixed-address device's own address on the legacy subnet.
    pub legacy: Option<String>,
    /// Its name in the adapter's zone.
    pub name: Option<String>,
    /// The host name it gave or was reserved with.
    pub hostname: Option<String>,
    /// `lease`, `reserved`, `learned` or `v6`.
    pub kind: String,
    /// A lease's end, unix seconds.
    pub expires: Option<u64>,
    /// Its VLAN.
    pub vlan: Option<u16>,
    /// The last packet from it the adapter carried, unix seconds.
    pub seen: Option<u64>,
    /// Bytes carried from it towards the tunnel.
    pub tx_bytes: u64,
    /// Those packets.
    pub tx_packets: u64,
    /// Bytes delivered to it from the tunnel.
    pub rx_bytes: u64,
    /// Those packets.
    pub rx_packets: u64,
}

/// A tunnel as a member reported it, for the API and the console.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TunnelRow {
    /// The reporting member's name.
    pub member: String,
    /// Its certificate's fingerprint.
    pub member_fingerprint: String,
    /// The peer's certificate name.
    pub peer: String,
    /// The peer's certificate fingerprint.
    pub peer_fingerprint: String,
    /// `direct` or `relay`.
    pub path: String,
    /// Why relayed.
    pub reason: Option<String>,
    /// Where its packets go.
    pub endpoint: Option<String>,
    /// Whether it holds keys.
    pub established: bool,
    /// Its last completed handshake, unix seconds.
    pub handshake: Option<u64>,
    /// Inner bytes sealed to the peer.
    pub tx_bytes: u64,
    /// Inner bytes opened from it.
    pub rx_bytes: u64,
    /// When the member's report came, unix seconds.
    pub reported_at: u64,
}

/// What orders devices by address: `4` and 8 hex digits for IPv4, `6` and 32 for IPv6.
fn address_key(a: IpAddr) -> String {
    match a {
        IpAddr::V4(v4) => format!("4{:08x}", v4.to_bits()),
        IpAddr::V6(v6) => format!("6{:032x}", v6.to_bits()),
    }
}

const DEVICE_COLUMNS: &str = "address, mac, vip, vip6, legacy, name, hostname, kind, expires, \
     vlan, seen, tx_bytes, tx_packets, rx_bytes, rx_packets";

fn device_row(row: &sqlx::any::AnyRow) -> Result<DeviceRow, StoreError> {
    let t = "devices";
    Ok(DeviceRow {
        address: row.try_get(0)?,
        mac: row.try_get(1)?,
        vip: row.try_get(2)?,
        vip6: row.try_get(3)?,
        legacy: row.try_get(4)?,
        name: row.try_get(5)?,
        hostname: row.try_get(6)?,
        kind: row.try_get(7)?,
        expires: opt_from_db(t, row.try_get(8)?)?,
        vlan: opt_from_db(t, row.try_get(9)?)?,
        seen: opt_from_db(t, row.try_get(10)?)?,
        tx_bytes: from_db(t, row.try_get(11)?)?,
        tx_packets: from_db(t, row.try_get(12)?)?,
        rx_bytes: from_db(t, row.try_get(13)?)?,
        rx_packets: from_db(t, row.try_get(14)?)?,
    })
}

const TUNNEL_COLUMNS: &str = "c.name, t.member, t.peer_name, t.peer, t.path, t.reason, \
     t.endpoint, t.established, t.handshake, t.tx_bytes, t.rx_bytes, c.reported_at";

fn tunnel_row(row: &sqlx::any::AnyRow) -> Result<TunnelRow, StoreError> {
    let t = "tunnels";
    let established: i64 = row.try_get(7)?;
    Ok(TunnelRow {
        member: row.try_get(0)?,
        member_fingerprint: row.try_get(1)?,
        peer: row.try_get(2)?,
        peer_fingerprint: row.try_get(3)?,
        path: row.try_get(4)?,
        reason: row.try_get(5)?,
        endpoint: row.try_get(6)?,
        established: established != 0,
        handshake: opt_from_db(t, row.try_get(8)?)?,
        tx_bytes: from_db(t, row.try_get(9)?)?,
        rx_bytes: from_db(t, row.try_get(10)?)?,
        // Set with the report that made the tunnel's row: NULL here is a broken row.
        reported_at: from_db(t, row.try_get(11)?)?,
    })
}

impl Store {
    /// Keeps `report`, the client `fingerprint`'s (made `at`, unix seconds), in place of
    /// its previous one: in one transaction, so that a reader sees the one or the other.
    /// Of two devices at one address, or two tunnels to one peer, one is kept. The strings
    /// are kept as given: the caller makes them safe to show.
    ///
    /// # Errors
    /// Database failures.
    pub async fn keep_report(
        &self,
        fingerprint: &str,
        report: &Report,
        at: u64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for table in ["devices", "tunnels"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE member = $1"))
                .bind(fingerprint)
                .execute(&mut *tx)
                .await?;
        }
        let mut devices: Vec<_> = report
            .devices
            .iter()
            .filter_map(|d| {
                let address: IpAddr = match (d.vip, d.vip6) {
                    (Some(v4), _) => v4.into(),
                    (None, Some(v6)) => v6.into(),
                    (None, None) => return None,
                };
                Some((address, d))
            })
            .collect();
        devices.sort_by_key(|a| a.0);
        devices.dedup_by(|b, a| a.0 == b.0);
        for chunk in devices.chunks(ROWS_PER_INSERT) {
            let mut p = Params::default();
            let rows: Vec<String> = chunk
                .iter()
                .map(|(address, d)| {
                    let text = |v: Option<String>, p: &mut Params| p.text(v);
                    let values = [
                        text(Some(fingerprint.to_owned()), &mut p),
                        text(Some(address_key(*address)), &mut p),
                        text(Some(address.to_string()), &mut p),
                        text(Some(d.mac.to_string()), &mut p),
                        text(d.vip.map(|v| v.to_string()), &mut p),
                        text(d.vip6.map(|v| v.to_string()), &mut p),
                        text(d.legacy.map(|v| v.to_string()), &mut p),
                        text(d.name.clone(), &mut p),
                        text(d.hostname.clone(), &mut p),
                        text(Some(d.kind.as_str().to_owned()), &mut p),
                        p.int(d.expires.map(db_secs)),
                        p.int(d.vlan.map(i64::from)),
                        p.int(d.seen.map(db_secs)),
                        p.int(Some(db_count(d.tx_bytes))),
                        p.int(Some(db_count(d.tx_packets))),
                        p.int(Some(db_count(d.rx_bytes))),
                        p.int(Some(db_count(d.rx_packets))),
                    ];
                    format!("({})", values.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO devices (member, address_key, {DEVICE_COLUMNS}) VALUES {}",
                rows.join(", ")
            );
            p.query(&sql).execute(&mut *tx).await?;
        }
        let mut tunnels: Vec<_> = report.tunnels.iter().collect();
        tunnels.sort_by(|a, b| a.peer.cmp(&b.peer));
        tunnels.dedup_by(|b, a| a.peer.eq_ignore_ascii_case(&b.peer));
        for chunk in tunnels.chunks(ROWS_PER_INSERT) {
            let mut p = Params::default();
            let rows: Vec<String> = chunk
                .iter()
                .map(|t| {
                    let values = [
                        p.text(Some(fingerprint.to_owned())),
                        p.text(Some(t.peer.to_ascii_lowercase())),
                        p.text(Some(t.name.clone())),
                        p.text(Some(t.path.as_str().to_owned())),
                        p.text(t.reason.map(|r| r.as_str().to_owned())),
                        p.text(t.endpoint.map(|e| e.to_string())),
                        p.int(Some(i64::from(t.established))),
                        p.int(t.handshake.map(db_secs)),
                        p.int(Some(db_count(t.tx_bytes))),
                        p.int(Some(db_count(t.rx_bytes))),
                    ];
                    format!("({})", values.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO tunnels (member, peer, peer_name, path, reason, endpoint, \
                 established, handshake, tx_bytes, rx_bytes) VALUES {}",
                rows.join(", ")
            );
            p.query(&sql).execute(&mut *tx).await?;
        }
        sqlx::query("UPDATE clients SET reported_at = $2 WHERE fingerprint = $1")
            .bind(fingerprint)
            .bind(db_secs(at))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets the tunnels the client `fingerprint` reported (its session began or ended).
    ///
    /// # Errors
    /// Database failures.
    pub async fn forget_tunnels(&self, fingerprint: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM tunnels WHERE member = $1")
            .bind(fingerprint)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// At most `limit` devices the member `fingerprint` last reported, after the one at
    /// `after` (its address), ordered by address (IPv4 first, as numbers).
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn devices_page(
        &self,
        fingerprint: &str,
        after: Option<&IpAddr>,
        limit: u32,
    ) -> Result<Vec<DeviceRow>, StoreError> {
        let sql = format!(
            "SELECT {DEVICE_COLUMNS} FROM devices WHERE member = $1 {} ORDER BY address_key LIMIT ${}",
            if after.is_some() {
                "AND address_key > $2"
            } else {
                ""
            },
            if after.is_some() { 3 } else { 2 }
        );
        let mut query = sqlx::query(&sql).bind(fingerprint);
        if let Some(a) = after {
            query = query.bind(address_key(*a));
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(device_row).collect()
    }

    /// The certificate whose report stands for the member `name`: the one online, else
    /// the one that reported last (the name's fingerprint, and when its report came, unix
    /// seconds); None when no certificate has that name.
    ///
    /// # Errors
    /// Database failures, an unreadable row.
    pub async fn reporter(&self, name: &str) -> Result<Option<(String, Option<u64>)>, StoreError> {
        let row = sqlx::query(
            "SELECT fingerprint, reported_at FROM clients WHERE name = $1 \
             ORDER BY online DESC, COALESCE(reported_at, -1) DESC, fingerprint LIMIT 1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(r) => Ok(Some((
                r.try_get(0)?,
                opt_from_db("clients", r.try_get(1)?)?,
            ))),
            None => Ok(None),
        }
    }

    /// At most `limit` tunnels that members online reported, after the one at `after` (the
    /// reporting member's name and fingerprint, and the peer's fingerprint), in that order;
    /// only those of the member named `member` when one is given.
    ///
    /// # Errors
    /// Database failures, unreadable rows.
    pub async fn tunnels_page(
        &self,
        member: Option<&str>,
        after: Option<(&str, &str, &str)>,
        limit: u32,
    ) -> Result<Vec<TunnelRow>, StoreError> {
        let mut p = Params::default();
        let mut sql = format!(
            "SELECT {TUNNEL_COLUMNS} FROM tunnels t JOIN clients c ON c.fingerprint = t.member \
             WHERE c.online <> 0"
        );
        if let Some(m) = member {
            sql += &format!(" AND c.name = {}", p.text(Some(m.to_owned())));
        }
        if let Some((name, fp, peer)) = after {
            let (name, fp, peer) = (
                p.text(Some(name.to_owned())),
                p.text(Some(fp.to_owned())),
                p.text(Some(peer.to_owned())),
            );
            sql += &format!(" AND (c.name, t.member, t.peer) > ({name}, {fp}, {peer})");
        }
        sql += &format!(
            " ORDER BY c.name, t.member, t.peer LIMIT {}",
            p.int(Some(i64::from(limit)))
        );
        let rows = p.query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(tunnel_row).collect()
    }
}
