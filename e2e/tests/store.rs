//! The cloud's store on both of its databases: the same checks against a SQLite file and a
//! real PostgreSQL server (a throwaway one, see e2e/src/postgres.rs); and two cloud instances
//! sharing one PostgreSQL serving one overlay, signals crossing by LISTEN/NOTIFY.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use cyphonic_cloud::config::RelayConfig;
use cyphonic_cloud::store::Store;
use cyphonic_cloud::{CloudConfig, Policy};
use cyphonic_crypto::{Certificate, StaticKeypair};
use cyphonic_e2e::bed::TempDir;
use cyphonic_e2e::postgres::Postgres;
use cyphonic_signal::testing::Pki;
use cyphonic_signal::{Event, NameRecord, RelayReason, Resolution, TunnelVersions};

fn rec(name: &str, vip: [u8; 4]) -> NameRecord {
    NameRecord {
        name: name.into(),
        vip: Some(Ipv4Addr::from(vip)),
        vip6: None,
        legacy: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What the NMS relies on, whatever the database.
/// Online revocations: recorded once each, counted, listed; the names' certificates found.
async fn revocations(store: &Store) {
    assert_eq!(store.revocation_count().await.unwrap(), 0);
    let fps = ["aa".repeat(32), "bb".repeat(32)];
    assert_eq!(store.revoke(&fps, "gw9.ovl.example", 5).await.unwrap(), 2);
    assert_eq!(
        store.revoke(&fps[..1], "gw9.ovl.example", 6).await.unwrap(),
        0
    );
    assert_eq!(store.revocation_count().await.unwrap(), 2);
    assert_eq!(store.revocations().await.unwrap(), fps);
    // The certificates the registry knows of a name: connected ones, and what tokens were
    // redeemed for (`tokens` redeemed t1's for fp-a, then again for fp-a2, which connected;
    // the NMS revokes fp-a when it redeems the token again).
    let named = store.fingerprints_named("t1.ovl.example").await.unwrap();
    assert_eq!(named, ["fp-a2"]);
    assert!(
        store
            .fingerprints_named("nobody.ovl.example")
            .await
            .unwrap()
            .is_empty()
    );
}

/// The audit log and the API tokens (docs/protocol.md §8): rows read back newest first,
/// filtered and paged by their cursor; the sweep drops only older rows; an API token is
/// written, read back, revoked once; revocations list with their names and times.
async fn audit(store: &Store) {
    use cyphonic_cloud::store::{ApiTokenRow, AuditEntry, AuditQuery};
    let entry = |id: &str, at: u64, action: &str| AuditEntry {
        id: id.into(),
        at,
        actor: "cli:root".into(),
        source: "local".into(),
        action: action.into(),
        target: "gw9.ovl.example".into(),
        result: "ok".into(),
        details: serde_json::json!({ "n": at }),
    };
    for (id, at, action) in [
        ("a1", 1_000, "member.revoke"),
        ("a2", 2_000, "enrollment_token.create"),
        ("a3", 2_000, "member.revoke"),
        ("a4", 3_000, "member.revoke"),
    ] {
        store.audit(&entry(id, at, action)).await.unwrap();
    }
    let ids = |rows: Vec<AuditEntry>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let all = store
        .audit_log(&AuditQuery {
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(all[0], entry("a4", 3_000, "member.revoke"));
    assert_eq!(ids(all), ["a4", "a3", "a2", "a1"]);
    let page = |before: Option<(u64, String)>| AuditQuery {
        action: Some("member.revoke".into()),
        before,
        limit: 2,
        ..AuditQuery::default()
    };
    assert_eq!(
        ids(store.audit_log(&page(None)).await.unwrap()),
        ["a4", "a3"]
    );
    assert_eq!(
        ids(store
            .audit_log(&page(Some((2_000, "a3".into()))))
            .await
            .unwrap()),
        ["a1"]
    );
    assert_eq!(store.audit_sweep(2_000).await.unwrap(), 1);
    assert_eq!(
        ids(store
            .audit_log(&AuditQuery {
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .unwrap()),
        ["a4", "a3", "a2"]
    );

    let token = ApiTokenRow {
        id: "0123456789abcdef".into(),
        secret_sha256: "cd".repeat(32),
        name: "ci".into(),
        scope: "read".into(),
        created_by: "cli:root".into(),
        created_at: 10,
        expires_at: Some(20),
        revoked_at: None,
    };
    store.add_api_token(&token).await.unwrap();
    assert!(store.add_api_token(&token).await.is_err(), "an id twice");
    assert_eq!(
        store.api_tokens().await.unwrap(),
        std::slice::from_ref(&token)
    );
    assert!(store.revoke_api_token(&token.id, 15).await.unwrap());
    assert!(!store.revoke_api_token(&token.id, 16).await.unwrap());
    assert_eq!(
        store.api_token(&token.id).await.unwrap(),
        Some(ApiTokenRow {
            revoked_at: Some(15),
            ..token
        })
    );
    assert_eq!(store.api_token("ffffffffffffffff").await.unwrap(), None);
}

/// The members' pages: walked one or two at a time they give every member once, in the
/// order of name then fingerprint, each with its names as the whole list has them.
async fn pages(store: &Store) {
    let mut all = store.members().await.unwrap();
    assert!(all.len() >= 2, "the conformance run left members");
    all.sort_by(|a, b| {
        (&a.client.name, &a.client.fingerprint).cmp(&(&b.client.name, &b.client.fingerprint))
    });
    for limit in [1, 2, 500] {
        let mut seen = Vec::new();
        let mut after: Option<(String, String)> = None;
        loop {
            let page = store
                .members_page(after.as_ref().map(|(n, f)| (n.as_str(), f.as_str())), limit)
                .await
                .unwrap();
            assert!(page.len() <= limit as usize);
            let Some(last) = page.last() else { break };
            after = Some((last.client.name.clone(), last.client.fingerprint.clone()));
            seen.extend(page);
            assert!(seen.len() <= all.len(), "past the end");
        }
        let key = |m: &cyphonic_cloud::store::Member| {
            (
                m.client.fingerprint.clone(),
                m.names.clone(),
                m.names6.clone(),
            )
        };
        assert_eq!(
            seen.iter().map(key).collect::<Vec<_>>(),
            all.iter().map(key).collect::<Vec<_>>(),
            "pages of {limit}"
        );
    }
}

/// Members' reports and flow records: kept whole, read back in order, paged, forgotten.
async fn reports_and_flows(store: &Store) {
    use cyphonic_control::report::Report;
    use cyphonic_control::{
        DeviceKind, DeviceReport, FlowDir, FlowRecord, Mac, RefusedRecord, TunnelPath, TunnelReport,
    };
    for (fp, name) in [("rp1", "r1.ovl.example"), ("rp2", "r2.ovl.example")] {
        store
            .client_online(fp, (name, "ca1"), ("CERT", &[]), "test")
            .await
            .unwrap();
    }
    let device = |i: u8, v6: bool| DeviceReport {
        mac: Mac([2, 0, 0, 0, 0, i]),
        vip: (!v6).then(|| Ipv4Addr::new(100, 64, 1, i)),
        vip6: v6.then(|| format!("fd7a:0:1::{i:x}").parse().unwrap()),
        legacy: None,
        name: Some(format!("d{i}.r1.ovl.example")),
        hostname: None,
        kind: if v6 {
            DeviceKind::V6
        } else {
            DeviceKind::Lease
        },
        expires: None,
        vlan: None,
        seen: Some(1),
        tx_bytes: u64::MAX,
        tx_packets: 1,
        rx_bytes: 2,
        rx_packets: 3,
    };
    let tunnel = |peer: &str| TunnelReport {
        peer: peer.repeat(32),
        name: "r2.ovl.example".into(),
        path: TunnelPath::Direct,
        reason: None,
        endpoint: None,
        established: true,
        handshake: Some(5),
        tx_bytes: 1,
        rx_bytes: 2,
    };
    let report = Report {
        devices: vec![device(100, false), device(9, false), device(7, true)],
        tunnels: vec![tunnel("ab"), tunnel("cd")],
    };
    store.keep_report("rp1", &report, 10).await.unwrap();
    store.keep_report("rp2", &report, 11).await.unwrap();
    let devices = store.devices_page("rp1", None, 10).await.unwrap();
    let addresses: Vec<_> = devices.iter().map(|d| d.address.as_str()).collect();
    assert_eq!(addresses, ["100.64.1.9", "100.64.1.100", "fd7a:0:1::7"]);
    assert_eq!(devices[0].tx_bytes, i64::MAX as u64);
    let after: std::net::IpAddr = "100.64.1.9".parse().unwrap();
    let rest = store.devices_page("rp1", Some(&after), 1).await.unwrap();
    assert_eq!(rest[0].address, "100.64.1.100");
    assert_eq!(
        store.reporter("r1.ovl.example").await.unwrap(),
        Some(("rp1".to_owned(), Some(10)))
    );
    let all = store.tunnels_page(None, None, 10).await.unwrap();
    assert_eq!(all.len(), 4);
    let second = store
        .tunnels_page(
            None,
            Some((
                &all[1].member,
                &all[1].member_fingerprint,
                &all[1].peer_fingerprint,
            )),
            10,
        )
        .await
        .unwrap();
    assert_eq!(second, all[2..]);
    store.client_offline("rp2").await.unwrap();
    assert_eq!(store.tunnels_page(None, None, 10).await.unwrap().len(), 2);
    assert_eq!(
        store
            .tunnels_page(Some("r2.ovl.example"), None, 10)
            .await
            .unwrap(),
        []
    );

    let flow = |end: u64| FlowRecord {
        proto: 6,
        src: "100.64.1.9".parse().unwrap(),
        sport: 1,
        dst: "fd7a:0:1::7".parse().unwrap(),
        dport: 2,
        dir: FlowDir::In,
        start: end - 1,
        end,
        tx_bytes: u64::MAX,
        tx_packets: 1,
        rx_bytes: 2,
        rx_packets: 3,
        rule: 4,
    };
    let refused = RefusedRecord {
        src: "100.64.9.9".parse().unwrap(),
        dir: FlowDir::Out,
        first: 100,
        last: 160,
        packets: 9,
        ports: 3,
    };
    let flows: Vec<_> = [150, 100, 100, 120].into_iter().map(flow).collect();
    store
        .keep_flows(("rp1", "r1.ovl.example"), &flows, &[refused])
        .await
        .unwrap();
    let q = |after, limit| cyphonic_cloud::store::FlowQuery {
        after,
        limit,
        ..Default::default()
    };
    let all = store.flows_page(&q(None, 100)).await.unwrap();
    let ends: Vec<u64> = all.iter().map(|f| f.end).collect();
    assert_eq!(ends, [160, 150, 120, 100, 100]);
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = store.flows_page(&q(after.clone(), 2)).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some((last.end, last.id.clone()));
        paged.extend(page);
    }
    assert_eq!(paged, all);
    assert_eq!(all[0].kind, "refused");
    assert_eq!((all[0].ports, all[0].dst.clone()), (Some(3), None));
    assert_eq!(all[1].dst.as_deref(), Some("fd7a:0:1::7"));
    let at = cyphonic_cloud::store::FlowQuery {
        address: Some("100.64.9.9".into()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(store.flows_page(&at).await.unwrap().len(), 1);
    assert_eq!(store.flows_sweep(120).await.unwrap(), 2);
    assert_eq!(store.flows_page(&q(None, 100)).await.unwrap().len(), 3);
}

/// People's sessions: written, listed while live (not ended, not idle), noted at most
/// forward, ended once, at most `most` per person (the oldest go), swept when ended.
async fn sessions(store: &Store) {
    use cyphonic_cloud::store::SessionRow;
    let row = |id: &str, subject: &str, created: u64| SessionRow {
        id_sha256: id.repeat(64 / id.len()),
        subject: subject.into(),
        name: format!("{subject}@example.com"),
        role: "operator".into(),
        csrf: "cs".repeat(16),
        source: "192.0.2.7".into(),
        created_at: created,
        seen_at: created,
        ends_at: created + 1000,
    };
    for (i, id) in ["a1", "a2", "a3"].into_iter().enumerate() {
        store
            .add_session(&row(id, "olivia", 100 + i as u64), 2)
            .await
            .unwrap();
    }
    store
        .add_session(&row("b1", "victor", 100), 2)
        .await
        .unwrap();
    let ids = |rows: Vec<SessionRow>| {
        let mut ids: Vec<String> = rows
            .into_iter()
            .map(|r| r.id_sha256[..2].to_owned())
            .collect();
        ids.sort();
        ids
    };
    // Olivia's oldest went when her third began; at 150 with 100 s of idleness all live.
    assert_eq!(
        ids(store.sessions(150, 100).await.unwrap()),
        ["a2", "a3", "b1"]
    );
    assert_eq!(
        store
            .sessions(150, 100)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.id_sha256.starts_with("b1")),
        Some(row("b1", "victor", 100))
    );
    // At 201 Victor's (seen at 100) and a2 (seen at 101) have been idle for 100 s; a3 is
    // noted at 160, and not moved back by a late note.
    store.touch_session(&"a3".repeat(32), 160).await.unwrap();
    store.touch_session(&"a3".repeat(32), 150).await.unwrap();
    assert_eq!(ids(store.sessions(201, 100).await.unwrap()), ["a3"]);
    assert_eq!(store.sessions(201, 100).await.unwrap()[0].seen_at, 160);
    // Past its end nothing is live, however recent.
    assert!(store.sessions(1102, 100_000).await.unwrap().is_empty());
    assert!(store.end_session(&"b1".repeat(32)).await.unwrap());
    assert!(!store.end_session(&"b1".repeat(32)).await.unwrap());
    assert_eq!(store.sessions_sweep(201, 100).await.unwrap(), 1, "a2, idle");
    assert_eq!(ids(store.sessions(150, 100).await.unwrap()), ["a3"]);
    assert_eq!(
        store.sessions_sweep(1103, 100_000).await.unwrap(),
        1,
        "a3, ended"
    );
}

/// Enrollment tokens: written, read back, revoked once; redeemed once only, never when
/// expired or revoked (one conditional update: two instances cannot both redeem one).
async fn tokens(store: &Store) {
    use cyphonic_cloud::store::TokenRow;
    let row = |id: &str, expires_at: u64| TokenRow {
        id: id.into(),
        secret_sha256: "ab".repeat(32),
        name: format!("{id}.ovl.example"),
        blocks: vec!["100.64.128.0/24".parse().unwrap()],
        groups: vec!["site".into()],
        lifetime: 600,
        created_at: 1_000,
        expires_at,
        used_at: None,
        used_by: None,
        revoked_at: None,
        used_key: None,
        confirmed_at: None,
    };
    for t in [row("t1", 2_000), row("t2", 2_000), row("t3", 1_500)] {
        store.add_token(&t).await.unwrap();
    }
    assert_eq!(store.token("t1").await.unwrap(), Some(row("t1", 2_000)));
    assert_eq!(store.token("nope").await.unwrap(), None);
    // Once by one key: another key cannot redeem it; the same key may again (its device
    // refused the first certificate) until a certificate of it connects.
    assert!(
        store
            .redeem_token("t1", 1_100, "fp-a", "key-a")
            .await
            .unwrap()
    );
    assert!(
        !store
            .redeem_token("t1", 1_101, "fp-b", "key-b")
            .await
            .unwrap()
    );
    let issued = store.token("t1").await.unwrap().unwrap();
    assert_eq!(
        (
            issued.used_at,
            issued.used_by.as_deref(),
            issued.used_key.as_deref()
        ),
        (Some(1_100), Some("fp-a"), Some("key-a"))
    );
    assert_eq!(issued.state(1_200), "issued");
    assert!(
        store
            .redeem_token("t1", 1_150, "fp-a2", "key-a")
            .await
            .unwrap()
    );
    store
        .confirm_token("fp-a2", "t1.ovl.example", "key-a", 1_160)
        .await
        .unwrap();
    assert!(
        !store
            .redeem_token("t1", 1_170, "fp-a3", "key-a")
            .await
            .unwrap()
    );
    let used = store.token("t1").await.unwrap().unwrap();
    assert_eq!(
        (used.used_by.as_deref(), used.confirmed_at),
        (Some("fp-a2"), Some(1_160))
    );
    assert_eq!(used.state(1_200), "used");
    // A used token cannot be revoked; a live one can, once; then it cannot be redeemed.
    assert!(!store.revoke_token("t1", 1_200).await.unwrap());
    assert!(store.revoke_token("t2", 1_200).await.unwrap());
    assert!(!store.revoke_token("t2", 1_201).await.unwrap());
    assert!(
        !store
            .redeem_token("t2", 1_300, "fp-c", "key-c")
            .await
            .unwrap()
    );
    // Expired.
    assert!(
        !store
            .redeem_token("t3", 1_500, "fp-d", "key-d")
            .await
            .unwrap()
    );
    let states: Vec<(String, &str)> = store
        .tokens()
        .await
        .unwrap()
        .iter()
        .map(|t| (t.id.clone(), t.state(1_600)))
        .collect();
    for want in [("t1", "used"), ("t2", "revoked"), ("t3", "expired")] {
        assert!(states.contains(&(want.0.to_owned(), want.1)), "{states:?}");
    }
}

async fn conformance(store: &Store) {
    store
        .client_online(
            "fp1",
            ("gw1.ovl.example", "ca1"),
            ("CERT1", &[]),
            "cyphonic-adapter 0.9.0",
        )
        .await
        .unwrap();
    store
        .client_online(
            "fp2",
            ("gw2.ovl.example", "ca1"),
            ("CERT2", &[]),
            "cyphonic-adapter 1.0.0",
        )
        .await
        .unwrap();
    let e1: SocketAddr = "198.51.100.2:51820".parse().unwrap();
    let taken = store
        .register(
            "fp1",
            (&[e1], None, Some(TunnelVersions::OURS)),
            &[
                rec("gw1.ovl.example", [100, 64, 1, 1]),
                rec("cam.gw1.ovl.example", [100, 64, 1, 100]),
            ],
        )
        .await
        .unwrap();
    assert!(taken.is_empty());
    // A name another client holds is not taken over.
    let taken = store
        .register(
            "fp2",
            (&[], None, None),
            &[
                rec("cam.gw1.ovl.example", [100, 64, 2, 9]),
                rec("gw2.ovl.example", [100, 64, 2, 1]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        taken,
        [(
            "cam.gw1.ovl.example".to_owned(),
            "registered by another client".to_owned()
        )]
    );
    let found = store.lookup("cam.gw1.ovl.example").await.unwrap().unwrap();
    assert_eq!(found.vip, Some(Ipv4Addr::new(100, 64, 1, 100)));
    assert_eq!(found.owner.fingerprint, "fp1");
    assert_eq!(found.owner.certificate, "CERT1");
    assert_eq!(found.owner.endpoints, [e1]);
    assert_eq!(found.owner.tunnel, Some(TunnelVersions::OURS));
    assert!(found.owner.online);
    let gw2 = store.client("fp2").await.unwrap().unwrap();
    assert_eq!(
        gw2.tunnel, None,
        "registered none (a client before control version 15)"
    );
    // The observed address goes first.
    let seen: SocketAddr = "203.0.113.7:40000".parse().unwrap();
    store.observed("fp1", seen, false).await.unwrap();
    let found = store.lookup("gw1.ovl.example").await.unwrap().unwrap();
    assert_eq!(found.owner.reach(), [seen, e1]);
    // The second probe port's observation is kept apart: it only tells the NAT's kind.
    let alt: SocketAddr = "203.0.113.7:40001".parse().unwrap();
    store.observed("fp1", alt, true).await.unwrap();
    let row = store.client("fp1").await.unwrap().unwrap();
    assert_eq!((row.observed, row.observed_alt), (Some(seen), Some(alt)));
    assert_eq!(row.reach(), [seen, e1]);
    // A port mapping (control version 14) is kept as registered; at the observed address it
    // goes first.
    let mapped: SocketAddr = "203.0.113.7:51820".parse().unwrap();
    let mapping = cyphonic_control::Mapping::Mapped {
        protocol: cyphonic_control::MapProtocol::NatPmp,
        endpoint: mapped,
    };
    let names = [rec("gw1.ovl.example", [100, 64, 1, 1])];
    store
        .register("fp1", (&[e1], Some(&mapping), None), &names)
        .await
        .unwrap();
    let row = store.client("fp1").await.unwrap().unwrap();
    assert_eq!(row.mapping.as_ref(), Some(&mapping));
    assert_eq!(row.reach(), [mapped, seen, e1]);
    let found = store.lookup("gw1.ovl.example").await.unwrap().unwrap();
    assert_eq!(found.owner.mapping, Some(mapping));
    store
        .register("fp1", (&[e1], None, None), &names)
        .await
        .unwrap();
    assert_eq!(store.client("fp1").await.unwrap().unwrap().mapping, None);
    // A device with IPv6 only (control version 9): its name has no vIP, and the registry
    // keeps it so, in the member's IPv6 names alone.
    let thread = NameRecord {
        vip: None,
        vip6: Some("fd7a:0:1:100::1abc".parse().unwrap()),
        ..rec("thread.gw1.ovl.example", [0; 4])
    };
    let taken = store
        .register(
            "fp1",
            (&[e1], None, None),
            &[rec("gw1.ovl.example", [100, 64, 1, 1]), thread.clone()],
        )
        .await
        .unwrap();
    assert!(taken.is_empty());
    let found = store
        .lookup("thread.gw1.ovl.example")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((found.vip, found.vip6), (None, thread.vip6));
    let (names, names6) = store.names_of("fp1").await.unwrap();
    assert_eq!(
        names,
        [("gw1.ovl.example".to_owned(), Ipv4Addr::new(100, 64, 1, 1))]
    );
    assert_eq!(names6.get("thread.gw1.ovl.example").copied(), thread.vip6);
    let members = store.members().await.unwrap();
    let fp1 = members
        .iter()
        .find(|m| m.client.fingerprint == "fp1")
        .unwrap();
    assert_eq!(fp1.names.len(), 1);
    assert_eq!(
        fp1.names6.get("thread.gw1.ovl.example").copied(),
        thread.vip6
    );
    // Registering again replaces the names.
    store
        .register(
            "fp1",
            (&[e1], None, None),
            &[rec("gw1.ovl.example", [100, 64, 1, 1])],
        )
        .await
        .unwrap();
    assert!(
        store
            .lookup("thread.gw1.ovl.example")
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.lookup("cam.gw1.ovl.example").await.unwrap().is_none());
    assert_eq!(store.name_count().await.unwrap(), 2);
    // Offline clients keep their names (a tunnel to them may still work).
    store.client_offline("fp1").await.unwrap();
    let found = store.lookup("gw1.ovl.example").await.unwrap().unwrap();
    assert!(!found.owner.online);
    assert_eq!(store.counts().await.unwrap(), (2, 1));
    assert!(store.client("nobody").await.unwrap().is_none());
    assert_eq!(
        store.client("fp2").await.unwrap().unwrap().name,
        "gw2.ovl.example"
    );
    identities(store).await;
    fleet(store).await;
}

/// The fleet view: every certificate a member used, online or not, with the names it hosts;
/// removing a member forgets its certificates and names, but never one that is online.
async fn fleet(store: &Store) {
    // A client that reconnects: its old session's end, written after the new session
    // opened, leaves it online; the new session's end marks it offline.
    let online = |fp: &'static str| async move {
        store
            .members()
            .await
            .unwrap()
            .into_iter()
            .find(|m| m.client.fingerprint == fp)
            .unwrap()
            .client
            .online
    };
    let session = |n: u8| {
        store.client_online(
            "fp8",
            ("gw8.ovl.example", "ca1"),
            ("CERT8", &[]),
            if n == 0 { "old" } else { "new" },
        )
    };
    let old = session(0).await.unwrap();
    let new = session(1).await.unwrap();
    assert_ne!(old, new);
    store.session_ended("fp8", &old).await.unwrap();
    assert!(
        online("fp8").await,
        "an older session's end marked a newer one offline"
    );
    store.session_ended("fp8", &new).await.unwrap();
    assert!(!online("fp8").await);
    assert_eq!(store.remove_member("gw8.ovl.example").await.unwrap(), 1);
    // A renewal issued to a member that has not connected with it yet.
    store
        .issued("fp7", ("gw7.ovl.example", "ca1"), ("CERT7", &[]))
        .await
        .unwrap();
    let members = store.members().await.unwrap();
    let gw1: Vec<_> = members
        .iter()
        .filter(|m| m.client.name == "gw1.ovl.example")
        .map(|m| m.client.fingerprint.as_str())
        .collect();
    assert_eq!(gw1.len(), 3, "fp1, fp1b and fp1x: {gw1:?}");
    // fp1b's last registration asked only for a name fp1x holds: it hosts nothing now.
    let holder = |fp: &str| members.iter().find(|m| m.client.fingerprint == fp).unwrap();
    assert!(holder("fp1b").names.is_empty());
    // Each certificate shows what it ran as its last connection said; one that never
    // connected, nothing.
    assert_eq!(
        holder("fp1").agent.as_deref(),
        Some("cyphonic-adapter 0.9.0")
    );
    assert_eq!(
        holder("fp1x").agent.as_deref(),
        Some("cyphonic-adapter 1.0.0")
    );
    assert_eq!(holder("fp7").agent, None);
    assert_eq!(store.remove_member("gw7.ovl.example").await.unwrap(), 1);
    assert_eq!(
        holder("fp1x").names,
        [(
            "cam.gw1.ovl.example".to_owned(),
            Ipv4Addr::new(100, 64, 1, 7)
        )]
    );
    // Its fixed address on the site's legacy subnet, as registered (version 7).
    assert_eq!(
        holder("fp1x").legacy,
        [(
            "cam.gw1.ovl.example".to_owned(),
            Ipv4Addr::new(192, 0, 2, 7)
        )]
        .into()
    );
    assert!(holder("fp2").legacy.is_empty());
    assert!(holder("fp1x").last_seen > 0);
    assert!(holder("fp2").client.online);
    assert!(matches!(
        store.remove_member("gw2.ovl.example").await,
        Err(cyphonic_cloud::store::StoreError::Online(_))
    ));
    // An HA pair's report (control version 10) is kept with the certificate, and a new
    // session of it clears it.
    assert_eq!(holder("fp2").pair, None);
    let report = cyphonic_cloud::store::PairReport {
        term: 2,
        reason: "the active box went silent".into(),
        boxes: vec![cyphonic_control::PairBox {
            mac: cyphonic_control::Mac([2, 0, 0, 0, 0, 2]),
            role: cyphonic_control::PairRole::Active,
            priority: 100,
            health: vec![cyphonic_control::PairHealth::Lan],
            in_contact: true,
        }],
        at: 1_800_000_000,
    };
    store.report_pair("fp2", &report).await.unwrap();
    let pair_of = |members: Vec<cyphonic_cloud::store::Member>| {
        members
            .into_iter()
            .find(|m| m.client.fingerprint == "fp2")
            .unwrap()
            .pair
    };
    assert_eq!(pair_of(store.members().await.unwrap()), Some(report));
    store
        .client_online(
            "fp2",
            ("gw2.ovl.example", "ca1"),
            ("CERT2", &[]),
            "cyphonic-adapter 1.0.0",
        )
        .await
        .unwrap();
    assert_eq!(pair_of(store.members().await.unwrap()), None);
    store.client_offline("fp1b").await.unwrap();
    store.client_offline("fp1x").await.unwrap();
    assert_eq!(store.remove_member("gw1.ovl.example").await.unwrap(), 3);
    assert!(store.lookup("gw1.ovl.example").await.unwrap().is_none());
    assert!(store.lookup("cam.gw1.ovl.example").await.unwrap().is_none());
    assert!(
        store
            .members()
            .await
            .unwrap()
            .iter()
            .all(|m| m.client.name != "gw1.ovl.example")
    );
    assert_eq!(store.remove_member("gw1.ovl.example").await.unwrap(), 0);
}

/// Names belong to (issuing CA, certificate name), not to one certificate.
async fn identities(store: &Store) {
    let gw1 = [rec("gw1.ovl.example", [100, 64, 1, 1])];
    // gw1 renewed (new fingerprint, same CA and name): it takes its names over at once.
    store
        .client_online(
            "fp1b",
            ("gw1.ovl.example", "ca1"),
            ("CERT1B", &[]),
            "cyphonic-adapter 1.0.0",
        )
        .await
        .unwrap();
    let refused = store
        .register("fp1b", (&[], None, None), &gw1)
        .await
        .unwrap();
    assert!(refused.is_empty(), "{refused:?}");
    let found = store.lookup("gw1.ovl.example").await.unwrap().unwrap();
    assert_eq!(found.owner.fingerprint, "fp1b");
    // The same name from another CA is another identity: it takes nothing over.
    store
        .client_online(
            "fp1x",
            ("gw1.ovl.example", "ca2"),
            ("CERT1X", &[]),
            "cyphonic-adapter 1.0.0",
        )
        .await
        .unwrap();
    let refused = store
        .register(
            "fp1x",
            (&[], None, None),
            &[NameRecord {
                vip6: None,
                legacy: Some(Ipv4Addr::new(192, 0, 2, 7)),
                ..rec("cam.gw1.ovl.example", [100, 64, 1, 7])
            }],
        )
        .await
        .unwrap();
    assert!(refused.is_empty(), "a free name: {refused:?}");
    let refused = store
        .register(
            "fp1b",
            (&[], None, None),
            &[rec("cam.gw1.ovl.example", [100, 64, 1, 8])],
        )
        .await
        .unwrap();
    assert_eq!(
        refused,
        [(
            "cam.gw1.ovl.example".to_owned(),
            "registered by another client".to_owned()
        )]
    );
    // Another member's certificate name cannot be registered as a device's, and a member
    // takes its own name back from a client that registered it for a device.
    let refused = store
        .register(
            "fp2",
            (&[], None, None),
            &[
                rec("gw1.ovl.example", [100, 64, 2, 5]),
                rec("sensor.gw2.ovl.example", [100, 64, 2, 6]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        refused,
        [(
            "gw1.ovl.example".to_owned(),
            "the name of another member".to_owned()
        )]
    );
    store
        .client_online(
            "fp9",
            ("sensor.gw2.ovl.example", "ca1"),
            ("CERT9", &[]),
            "cyphonic-adapter 1.0.0",
        )
        .await
        .unwrap();
    let refused = store
        .register(
            "fp9",
            (&[], None, None),
            &[rec("sensor.gw2.ovl.example", [100, 64, 2, 6])],
        )
        .await
        .unwrap();
    assert!(refused.is_empty(), "{refused:?}");
    let found = store
        .lookup("sensor.gw2.ovl.example")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.owner.fingerprint, "fp9");
}

/// Which names `store` says hold a block overlapping one of `blocks`, for a client named
/// `name`, sorted.
async fn overlapping(store: &Store, name: &str, blocks: &[&str]) -> Vec<String> {
    let blocks: Vec<ipnet::IpNet> = blocks.iter().map(|b| b.parse().unwrap()).collect();
    let mut names: Vec<String> = store
        .certificates_overlapping(name, &blocks)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names
}

/// The blocks table (issue 49, finding 6): who holds addresses that overlap a block, by
/// blocks inside it and blocks holding it, in each family apart, never the asker's name.
async fn blocks(store: &Store) {
    let net = |b: &str| b.parse::<ipnet::IpNet>().unwrap();
    for (fp, name, blocks) in [
        ("fpa", "a.blocks.example", vec![net("100.64.1.0/24")]),
        (
            "fpb",
            "b.blocks.example",
            vec![net("100.64.2.0/25"), net("fd7a::2:0/112")],
        ),
        ("fpc", "c.blocks.example", vec![net("100.64.0.0/16")]),
        ("fpd", "d.blocks.example", vec![net("100.64.4.0/30")]),
    ] {
        store
            .client_online(
                fp,
                (name, "ca1"),
                ("CERT", &blocks),
                "cyphonic-adapter 1.0.0",
            )
            .await
            .unwrap();
    }
    let (a, b, c, d) = (
        "a.blocks.example",
        "b.blocks.example",
        "c.blocks.example",
        "d.blocks.example",
    );
    assert_eq!(overlapping(store, "x", &["100.64.1.128/25"]).await, [a, c]);
    assert_eq!(overlapping(store, "x", &["100.64.1.5/32"]).await, [a, c]);
    assert_eq!(overlapping(store, "x", &["100.64.0.0/22"]).await, [a, b, c]);
    assert_eq!(overlapping(store, "x", &["0.0.0.0/0"]).await, [a, b, c, d]);
    assert_eq!(overlapping(store, a, &["100.64.1.0/24"]).await, [c]);
    // d starts where a holder of 100.64.4.8/30 would, and ends before it.
    assert_eq!(overlapping(store, "x", &["100.64.4.8/30"]).await, [c]);
    assert_eq!(overlapping(store, c, &["100.64.4.0/30"]).await, [d]);
    assert!(overlapping(store, "x", &["100.65.0.0/16"]).await.is_empty());
    assert_eq!(overlapping(store, "x", &["fd7a::2:80/121"]).await, [b]);
    assert_eq!(overlapping(store, "x", &["fd7a::/16"]).await, [b]);
    assert_eq!(
        overlapping(store, "x", &["fd7a::9:0/112", "100.64.2.64/26"]).await,
        [b, c]
    );
    // The families never mix, even where an IPv6 block maps IPv4 addresses.
    assert!(
        overlapping(store, "x", &["::ffff:100.64.1.0/120"])
            .await
            .is_empty()
    );
    assert!(overlapping(store, "x", &["fd7a::3:0/112"]).await.is_empty());
    // A member removed holds nothing.
    store.client_offline("fpd").await.unwrap();
    assert_eq!(store.remove_member(d).await.unwrap(), 1);
    assert!(overlapping(store, c, &["100.64.4.0/30"]).await.is_empty());
}

#[test]
fn the_store_behaves_the_same_on_sqlite_and_postgresql() {
    let rt = runtime();
    let dir = TempDir::new("store").unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("cloud.db").display());
    let pg = Postgres::start().unwrap();
    for url in [sqlite, pg.url()] {
        rt.block_on(async {
            let store = Store::open(&url).await.unwrap();
            assert_eq!(store.is_shared(), url.starts_with("postgres"));
            conformance(&store).await;
            pages(&store).await;
            tokens(&store).await;
            revocations(&store).await;
            assert_eq!(
                store.revocation_rows().await.unwrap(),
                [
                    ("aa".repeat(32), "gw9.ovl.example".to_owned(), 5),
                    ("bb".repeat(32), "gw9.ovl.example".to_owned(), 5)
                ]
            );
            audit(&store).await;
            sessions(&store).await;
            reports_and_flows(&store).await;
            blocks(&store).await;
            // A certificate registered without its blocks (as before the table) has them
            // filled in when the store opens again.
            let pki = Pki::new();
            let old = pki.identity("e.ovl.example", "100.66.0.0/24", &[]);
            let pem = old.certificate().to_pem();
            store
                .client_online(
                    "fpe",
                    ("e.ovl.example", "ca1"),
                    (&pem, &[]),
                    "cyphonic-adapter 1.0.0",
                )
                .await
                .unwrap();
            assert!(
                overlapping(&store, "x", &["100.66.0.9/32"])
                    .await
                    .is_empty()
            );
            if !store.is_shared() {
                // SQLite runs with a write-ahead log (one fsync a transaction).
                let wal = dir.path().join("cloud.db-wal");
                assert!(wal.exists(), "no {}", wal.display());
            }
            // Opening again runs no migration twice and keeps the data.
            let names = store.name_count().await.unwrap();
            assert!(names >= 1, "{url}: nothing left to keep");
            let again = Store::open(&url).await.unwrap();
            assert_eq!(again.name_count().await.unwrap(), names, "{url}");
            assert_eq!(
                overlapping(&again, "x", &["100.66.0.9/32"]).await,
                ["e.ovl.example"],
                "{url}"
            );
            assert_eq!(
                again.members().await.unwrap(),
                store.members().await.unwrap()
            );
        });
    }
}

/// A signal client's configuration for the clouds at `at`, pinning `key`.
fn client_config(key: &StaticKeypair, at: &[SocketAddr]) -> cyphonic_signal::Config {
    cyphonic_signal::Config {
        clouds: at.iter().map(ToString::to_string).collect(),
        cloud_keys: vec![key.public()],
        agent: "test".into(),
        tunnel_port: None,
        tunnel: TunnelVersions::OURS,
        source: None,
    }
}

async fn instance(
    pki: &Pki,
    key: &StaticKeypair,
    url: &str,
    relay_ports: std::ops::RangeInclusive<u16>,
) -> cyphonic_cloud::Running {
    instance_with(pki, key, url, relay_ports, Policy::default()).await
}

async fn instance_with(
    pki: &Pki,
    key: &StaticKeypair,
    url: &str,
    relay_ports: std::ops::RangeInclusive<u16>,
    policy: Policy,
) -> cyphonic_cloud::Running {
    cyphonic_cloud::start(CloudConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        probe_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        probe_listen_alt: SocketAddr::from(([127, 0, 0, 1], 0)),
        status_socket: std::env::temp_dir().join(cyphonic_e2e::unique("cy-cloud-status-")),
        admin_socket: std::env::temp_dir().join(cyphonic_e2e::unique("cy-cloud-admin-")),
        metrics: None,
        // Instances sharing a store name their relay's address: a client on another
        // instance cannot be given the address it reached this one on.
        relay: Some(RelayConfig {
            addresses: vec!["127.0.0.1".parse().unwrap()],
            ports: relay_ports,
            ..RelayConfig::default()
        }),
        key: StaticKeypair::from_pem(&key.to_pem()).unwrap(),
        trust: pki.trust(),
        database: url.to_owned(),
        policy,
        enroll: None,
        api: None,
        audit_days: 365,
        flows: cyphonic_cloud::config::FlowLogs::default(),
        api_tls: None,
        api_proxies: Vec::new(),
        api_oidc: None,
    })
    .await
    .unwrap()
}

/// (i) Two instances, one PostgreSQL: gw1 on instance 1 resolves a name gw2 registered on
/// instance 2, and gw2 hears `expect` from instance 1 through NOTIFY; likewise the relay
/// instance 1 allocates when gw1 asks for one.
#[test]
fn two_cloud_instances_serve_one_overlay_through_postgresql() {
    let rt = runtime();
    let pg = Postgres::start().unwrap();
    let url = pg.url();
    rt.block_on(async {
        let pki = Pki::new();
        let key = StaticKeypair::generate().unwrap();
        let one = instance(&pki, &key, &url, 41_200..=41_209).await;
        let two = instance(&pki, &key, &url, 41_210..=41_219).await;
        let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
        let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
        let config = |at: SocketAddr| client_config(&key, &[at]);
        let (h1, _e1) = cyphonic_signal::spawn(config(one.control), gw1.clone());
        let gw2_fp = gw2.certificate().fingerprint().to_string();
        let (h2, mut e2) = cyphonic_signal::spawn(config(two.control), gw2);
        h2.register(vec![], vec![rec("cam.gw2.ovl.example", [100, 64, 2, 100])]);
        let mut found = None;
        for _ in 0..50 {
            match h1.resolve("cam.gw2.ovl.example").await {
                Ok(r @ Resolution::Found { .. }) => {
                    found = Some(r);
                    break;
                }
                _ => {
                    h1.cache().clear();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let Some(Resolution::Found { vip, .. }) = found else {
            panic!("instance 1 never found what instance 2 registered");
        };
        assert_eq!(vip, Some(Ipv4Addr::new(100, 64, 2, 100)));
        let expect = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(Event::Expect(p)) = e2.recv().await {
                    return p;
                }
            }
        })
        .await
        .expect("the signal did not cross instances");
        assert_eq!(
            Certificate::from_pem(&expect.certificate).unwrap(),
            *gw1.certificate()
        );
        assert_eq!(expect.relay, None);
        // gw1's handshakes fail: instance 1 pairs the two on its relay, and gw2 hears of it
        // from instance 1 too.
        h1.request_relay(&gw2_fp).unwrap();
        let relayed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(Event::Expect(p)) = e2.recv().await
                    && let Some(r) = p.relay
                {
                    return r;
                }
            }
        })
        .await
        .expect("the relay's signal did not cross instances");
        assert_eq!(relayed.reason, RelayReason::NoDirectHandshake);
        assert_eq!(relayed.address.ip().to_string(), "127.0.0.1");
        assert_eq!(one.trs.as_ref().unwrap().open_channels(), 1);
        // gw1 revoked online (the registry both share): instance 1 cuts gw1 off, and gw2,
        // on instance 2, is told within a few seconds.
        let gw1_fp = gw1.certificate().fingerprint();
        let store = Store::open(&url).await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            store
                .revoke(&[gw1_fp.to_string()], "gw1.ovl.example", 1)
                .await
                .unwrap(),
            1
        );
        let told = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                if let Some(Event::Revoked(fps)) = e2.recv().await {
                    return fps;
                }
            }
        })
        .await
        .expect("the revocation did not cross instances");
        assert_eq!(told, [gw1_fp]);
        eprintln!(
            "revoked on the shared registry: told on the other instance after {:?}",
            started.elapsed()
        );
        tokio::time::timeout(Duration::from_secs(5), async {
            while h1.is_connected() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("instance 1 kept the revoked client's session");
        one.stop();
        two.stop();
    });
}

/// (ii) The per-device policy across instances: a camera registered through instance 2
/// joins a pattern's group, and gw1, on instance 1, gets the rule that names it within
/// seconds (each instance compiles from the registry they share).
#[test]
fn the_policy_follows_registrations_across_instances() {
    let rt = runtime();
    let pg = Postgres::start().unwrap();
    let url = pg.url();
    rt.block_on(async {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let policy = Policy {
            allow_by_default: false,
            groups: vec![cyphonic_cloud::policy::Group {
                name: "cameras".into(),
                members: v(&["cam*.gw2.ovl.example"]),
            }],
            rules: vec![cyphonic_cloud::Rule {
                from: v(&["gw1.ovl.example"]),
                to: v(&["cameras"]),
                allow: v(&["tcp/554"]),
            }],
        };
        let pki = Pki::new();
        let key = StaticKeypair::generate().unwrap();
        let one = instance_with(&pki, &key, &url, 41_240..=41_249, policy.clone()).await;
        let two = instance_with(&pki, &key, &url, 41_250..=41_259, policy).await;
        let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
        let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
        let config = |at: SocketAddr| client_config(&key, &[at]);
        let (_h1, mut e1) = cyphonic_signal::spawn(config(one.control), gw1);
        let (h2, _e2) = cyphonic_signal::spawn(config(two.control), gw2);
        h2.register(vec![], vec![rec("cam7.gw2.ovl.example", [100, 64, 2, 70])]);
        let started = std::time::Instant::now();
        let set = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                if let Some(Event::Policy(Some(s))) = e1.recv().await
                    && !s.rules.is_empty()
                {
                    return s;
                }
            }
        })
        .await
        .expect("the registration on instance 2 never reached gw1's rules on instance 1");
        eprintln!(
            "registered on instance 2: rule on instance 1's client after {:?}",
            started.elapsed()
        );
        let (gw1_ip, cam) = (Ipv4Addr::new(100, 64, 1, 5), Ipv4Addr::new(100, 64, 2, 70));
        assert_eq!(set.first_allowing(6, gw1_ip, cam, 554), Some(1));
        assert_eq!(set.first_allowing(6, cam, gw1_ip, 554), None);
        one.stop();
        two.stop();
    });
}

/// The cloud instance of the next session `events` report.
async fn connected(events: &mut tokio::sync::mpsc::Receiver<Event>) -> SocketAddr {
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Some(Event::Connected { cloud, .. }) = events.recv().await {
                return cloud;
            }
        }
    })
    .await
    .expect("no session")
}

/// What `cam.gw2.ovl.example` resolves to through `h`, asking until it does (bounded).
async fn resolves(h: &cyphonic_signal::Handle) -> Option<Ipv4Addr> {
    for _ in 0..100 {
        h.cache().clear();
        if let Ok(Resolution::Found { vip, .. }) = h.resolve("cam.gw2.ovl.example").await {
            return vip;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cam.gw2.ovl.example never resolved");
}

/// (ii) A client given several cloud instances (the first one dead, each pinned key tried):
/// it opens its session with a live one; when that instance stops, it moves to the other
/// within seconds, registers again there, and names resolve as before. The time it took is
/// printed for docs/benchmarks.md.
#[test]
fn a_client_fails_over_between_cloud_instances() {
    let rt = runtime();
    let pg = Postgres::start().unwrap();
    let url = pg.url();
    rt.block_on(async {
        let pki = Pki::new();
        let key = StaticKeypair::generate().unwrap();
        let old_key = StaticKeypair::generate().unwrap();
        let one = instance(&pki, &key, &url, 41_220..=41_229).await;
        let two = instance(&pki, &key, &url, 41_230..=41_239).await;
        // Nothing listens here: connections are refused at once.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_at = dead.local_addr().unwrap();
        drop(dead);
        let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
        let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
        let (h1, mut e1) = cyphonic_signal::spawn(
            cyphonic_signal::Config {
                clouds: vec![
                    dead_at.to_string(),
                    format!("localhost:{}", one.control.port()),
                    two.control.to_string(),
                ],
                // The key being retired first: the cloud does not answer it, the next is tried.
                cloud_keys: vec![old_key.public(), key.public()],
                agent: "test".into(),
                tunnel_port: None,
                tunnel: TunnelVersions::OURS,
                source: None,
            },
            gw1,
        );
        let first = connected(&mut e1).await;
        assert_eq!(first.port(), one.control.port(), "localhost is instance one");
        let (h2, _e2) = cyphonic_signal::spawn(client_config(&key, &[two.control]), gw2);
        h2.register(vec![], vec![rec("cam.gw2.ovl.example", [100, 64, 2, 100])]);
        assert_eq!(resolves(&h1).await, Some(Ipv4Addr::new(100, 64, 2, 100)));
        // Instance one stops: gw1 moves to instance two.
        let stopped = std::time::Instant::now();
        one.stop();
        let second = connected(&mut e1).await;
        let moved = stopped.elapsed();
        assert_eq!(second, two.control);
        assert_eq!(resolves(&h1).await, Some(Ipv4Addr::new(100, 64, 2, 100)));
        let resolved = stopped.elapsed();
        eprintln!("failover: session with the other instance after {moved:?}, resolving again after {resolved:?}");
        assert!(moved < Duration::from_secs(10), "{moved:?}");
        two.stop();
    });
}

/// A CA certificate and a cloud key in `dir` (`ca.crt`, `cloud.key`), readable by all: what
/// a cloud configuration needs to load.
fn cloud_keys(dir: &std::path::Path) {
    let ca = cyphonic_crypto::CertificateAuthority::generate(
        "ovl.example",
        &["100.64.0.0/10".parse().unwrap()],
        0,
        4_000_000_000,
    )
    .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.certificate().to_pem()).unwrap();
    std::fs::write(
        dir.join("cloud.key"),
        StaticKeypair::generate().unwrap().to_pem(),
    )
    .unwrap();
}

/// `cyphonic-cloud check-config` asks a shared store as the daemon will need it: the
/// PostgreSQL server answering passes; a role it does not know, and a port where nothing
/// listens, are refused at the `database` key with status 78 (issue 56).
#[test]
fn check_config_asks_the_shared_store() {
    let pg = Postgres::start().unwrap();
    let bins = cyphonic_e2e::hosts::Bins::find().unwrap();
    let dir = TempDir::new("check-store").unwrap();
    cloud_keys(dir.path());
    let path = dir.path().join("cloud.toml");
    let check = |database: &str| {
        std::fs::write(
            &path,
            format!("key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"{database}\"\n"),
        )
        .unwrap();
        std::process::Command::new(&bins.cloud)
            .args(["check-config", "-c", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = check(&pg.url());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for refused in [
        pg.url()
            .replace("postgres://cyphonic@", "postgres://nobody@"),
        "postgres://cyphonic@127.0.0.1:1/postgres".to_owned(),
    ] {
        let out = check(&refused);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{refused}: {said}");
        assert!(
            said.contains("cloud.toml:3: key `database`") && said.contains("does not answer"),
            "{refused}: {said}"
        );
    }
}

/// Issue 56: an admin command run as root before the first start (`members list` here, as
/// `token create` would) must not leave the registry root's. It becomes the owner of the
/// registry's directory (the service user) before opening it: the registry it creates, and
/// one root already owned there, are that user's, who then passes `check-config` (which
/// proves it can write them).
#[test]
fn an_admin_command_run_as_root_leaves_the_registry_to_the_service_user() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    const NOBODY: u32 = 65_534;
    let bins = cyphonic_e2e::hosts::Bins::find().unwrap();
    let dir = TempDir::new("registry-owner").unwrap();
    cloud_keys(dir.path());
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let db = state.join("cloud.db");
    let config = dir.path().join("cloud.toml");
    std::fs::write(
        &config,
        format!(
            "key = \"cloud.key\"\nca = \"ca.crt\"\ndatabase = \"sqlite://{}\"\n",
            db.display()
        ),
    )
    .unwrap();
    let run = |setpriv: bool, args: &[&str]| {
        let mut c = if setpriv {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&bins.cloud);
            c
        } else {
            std::process::Command::new(&bins.cloud)
        };
        let out = c.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let list = ["members", "list", "--config", config.to_str().unwrap()];
    // Runs `members list` as root; the registry's files then, all the service user's.
    let as_root = || -> Vec<std::path::PathBuf> {
        run(false, &list);
        let owned: Vec<(std::path::PathBuf, u32)> = std::fs::read_dir(&state)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path(), e.metadata().unwrap().uid())
            })
            .collect();
        assert!(
            owned.iter().any(|(f, _)| *f == db) && owned.iter().all(|(_, uid)| *uid == NOBODY),
            "{owned:?}"
        );
        owned.into_iter().map(|(f, _)| f).collect()
    };
    // A registry root made by hand (empty: SQLite takes it as a new database).
    std::fs::write(&db, b"").unwrap();
    let made = as_root();
    run(true, &["check-config", "-c", config.to_str().unwrap()]);
    // A registry created by root from nothing is the service user's too.
    for f in made {
        std::fs::remove_file(f).unwrap();
    }
    as_root();
    run(true, &list);
}
