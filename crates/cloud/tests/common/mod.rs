//! What the cloud's API tests share: a cloud's configuration, and members as the registry
//! knows them.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;

use cyphonic_cloud::enroll::Issuer;
use cyphonic_cloud::{CloudConfig, Policy, Store};
use cyphonic_crypto::{CertificateAuthority, StaticKeypair};
use cyphonic_signal::testing::Pki;

pub(crate) mod browser;
pub(crate) mod oidc;

/// A cloud's configuration on `dir`'s SQLite store, issuing with `pki`'s CA.
pub(crate) fn config(
    dir: &std::path::Path,
    pki: &Pki,
    policy: Policy,
    audit_days: u64,
) -> CloudConfig {
    let ca =
        CertificateAuthority::from_pem(&pki.ca.key_pem(), &pki.ca.certificate().to_pem()).unwrap();
    let root = ca.certificate().clone();
    CloudConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        probe_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        probe_listen_alt: SocketAddr::from(([127, 0, 0, 1], 0)),
        relay: None,
        status_socket: dir.join("cloud.sock"),
        admin_socket: dir.join("cloud-admin.sock"),
        metrics: None,
        key: StaticKeypair::generate().unwrap(),
        trust: pki.trust(),
        database: format!("sqlite://{}", dir.join("cloud.db").display()),
        policy,
        enroll: Some(Issuer::new(
            ca,
            vec![root],
            vec!["100.64.128.0/17".parse().unwrap()],
            86_400,
        )),
        api: None,
        audit_days,
        flows: cyphonic_cloud::config::FlowLogs::default(),
        api_tls: None,
        api_proxies: Vec::new(),
        api_oidc: None,
    }
}

/// A member `name` with `block` in `store`, as the registry knows one that was issued a
/// certificate by `pki`'s CA; its fingerprint.
pub(crate) async fn member(store: &Store, pki: &Pki, name: &str, block: &str) -> String {
    let id = pki.identity(name, block, &["cameras"]);
    let cert = id.certificate();
    let fp = cert.fingerprint().to_string();
    store
        .issued(
            &fp,
            (name, &hex::encode(cert.body().issuer)),
            (&cert.to_pem(), &cert.body().vip_blocks),
        )
        .await
        .unwrap();
    fp
}

/// The audit log's rows of `action` in `store`, newest first.
pub(crate) async fn audit(store: &Store, action: &str) -> Vec<cyphonic_cloud::store::AuditEntry> {
    store
        .audit_log(&cyphonic_cloud::store::AuditQuery {
            action: Some(action.into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// `cyphonic-cloud ARGS`: its standard output, or a panic with both streams.
pub(crate) fn cli(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cyphonic-cloud"))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "cyphonic-cloud {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
