//! The command line as an operator uses it, with the real binary: the CA's `show`, `verify`
//! and `list --json`, `check-config --json` and its exit status, and the completions.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::cli as ok;

/// `cyphonic-cloud ARGS`, as it ended.
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cyphonic-cloud"))
        .args(args)
        .output()
        .unwrap()
}

/// A CA issues two members; `ca show` reads one's fields; `ca verify` accepts it against the
/// CA, and refuses it once revoked, and a certificate of another CA, each with exit status 1
/// and the reason; `ca list --json` gives each one's state.
#[test]
fn the_ca_shows_verifies_and_lists_its_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let ca = ca.to_str().unwrap();
    ok(&["ca", "init", "--dir", ca, "--domain", "ovl.example"]);
    let out = dir.path().to_str().unwrap();
    for (name, block) in [
        ("gw1.ovl.example", "100.64.1.0/24"),
        ("n1.ovl.example", "100.64.9.1/32"),
    ] {
        ok(&[
            "ca",
            "issue",
            "--dir",
            ca,
            "--name",
            name,
            "--vip-block",
            block,
            "--group",
            "ops",
            "--out",
            out,
        ]);
    }
    let gw1 = format!("{out}/gw1.ovl.example.crt");
    let shown: Value = serde_json::from_str(&ok(&["ca", "show", &gw1, "--json"])).unwrap();
    assert_eq!(shown["kind"], "node", "{shown}");
    assert_eq!(shown["name"], "gw1.ovl.example", "{shown}");
    assert_eq!(
        shown["vip_blocks"],
        serde_json::json!(["100.64.1.0/24"]),
        "{shown}"
    );
    assert_eq!(shown["groups"], serde_json::json!(["ops"]), "{shown}");
    let not_after = shown["not_after"].as_u64().unwrap();
    assert!(not_after > shown["not_before"].as_u64().unwrap(), "{shown}");
    let fingerprint = shown["fingerprint"].as_str().unwrap().to_owned();
    assert!(ok(&["ca", "show", &gw1]).contains(&fingerprint));

    let root = format!("{ca}/ca.crt");
    let said = ok(&["ca", "verify", &gw1, "--ca", &root]);
    assert!(said.starts_with("ok: gw1.ovl.example"), "{said}");

    ok(&["ca", "revoke", "--dir", ca, &gw1]);
    let revoked = format!("{ca}/revoked.txt");
    let refused = run(&["ca", "verify", &gw1, "--ca", &root, "--revoked", &revoked]);
    assert_eq!(refused.status.code(), Some(1));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("is refused") && why.contains("revoked"),
        "{why}"
    );

    let other = dir.path().join("other");
    let other = other.to_str().unwrap();
    ok(&["ca", "init", "--dir", other, "--domain", "ovl.example"]);
    let stranger = run(&["ca", "verify", &gw1, "--ca", &format!("{other}/ca.crt")]);
    assert_eq!(stranger.status.code(), Some(1));

    let listed: Value = serde_json::from_str(&ok(&["ca", "list", "--dir", ca, "--json"])).unwrap();
    let states: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [("gw1.ovl.example", "revoked"), ("n1.ovl.example", "valid")]
    );
}

/// `check-config --json` says why a file is refused, in JSON, with exit status 78; the
/// default file is the packaged one.
#[test]
fn check_config_answers_in_json_with_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("cloud.toml");
    std::fs::write(&broken, "[cloud]\nlisten = 7\n").unwrap();
    let out = run(&["check-config", "-c", broken.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(78));
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["ok"], false, "{said}");
    assert_eq!(said["config"], broken.to_str().unwrap(), "{said}");
    assert!(
        said["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{said}"
    );
    // Without -c: /etc/cyphonic/cloud.toml, which this machine need not have.
    let out = run(&["check-config", "--json"]);
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["config"], "/etc/cyphonic/cloud.toml", "{said}");
}

/// The completions know the commands.
#[test]
fn completions_name_the_commands() {
    let bash = ok(&["completions", "bash"]);
    for word in ["check-config", "token", "members", "ca"] {
        assert!(bash.contains(word), "{word}");
    }
    let zsh = ok(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef cyphonic-cloud"), "{zsh}");
}
