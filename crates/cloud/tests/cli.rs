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

/// A cloud's configuration that `check-config` accepts, in `dir`: its key, a root CA and an
/// issuing CA under it, SQLite in `dir`, the relay, a policy, enrollment and the API.
fn good_config(dir: &std::path::Path) -> String {
    let at = |f: &str| dir.join(f).to_str().unwrap().to_owned();
    ok(&["keygen", "--out", &at("cloud.key")]);
    ok(&["ca", "init", "--dir", &at("ca"), "--domain", "ovl.example"]);
    ok(&[
        "ca",
        "delegate",
        "--dir",
        &at("ca"),
        "--out",
        &at("issuing"),
    ]);
    format!(
        "listen = \"127.0.0.1:7000\"\n\
         probe_listen = \"127.0.0.1:7001\"\n\
         probe_listen_alt = \"127.0.0.1:7002\"\n\
         key = \"cloud.key\"\n\
         ca = \"ca/ca.crt\"\n\
         database = \"sqlite://{}\"\n\
         status_socket = \"cloud.sock\"\n\
         \n\
         [relay]\n\
         enabled = true\n\
         ports = \"50000-50999\"\n\
         \n\
         [policy]\n\
         default = \"allow\"\n\
         \n\
         [enroll]\n\
         certificate = \"issuing/issuing.crt\"\n\
         key = \"issuing/issuing.key\"\n\
         pool = [\"100.64.128.0/17\"]\n\
         lifetime = 604800\n\
         \n\
         [api]\n\
         listen = \"127.0.0.1:9467\"\n",
        at("cloud.db")
    )
}

/// Realistic mistakes in a cloud's file, each made alone: `check-config` refuses each with
/// exit status 78, naming the file, the line and the key, and saying the value or what is
/// wrong with it; the file without them passes.
#[test]
fn check_config_names_the_line_key_and_value_of_each_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_config(dir.path());
    let path = dir.path().join("cloud.toml");
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = run(&["check-config", "-c", path.to_str().unwrap(), "--json"]);
        let said: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), said)
    };
    let (code, said) = check(&good);
    assert_eq!((code, &said["ok"]), (Some(0), &Value::Bool(true)), "{said}");
    let mistakes: [(&str, &str, &str, &str); 12] = [
        // (what the line was, what it became, line and key, what the error must say)
        (
            "listen = \"127.0.0.1:7000\"",
            "listen = \"127.0.0.1\"",
            "1: key `listen`",
            "\"127.0.0.1\"",
        ),
        (
            "key = \"cloud.key\"",
            "key = \"clod.key\"",
            "4: key `key`",
            "clod.key",
        ),
        (
            "ca = \"ca/ca.crt\"",
            "ca = \"ca/ca.key\"",
            "5: key `ca`",
            "no certificate",
        ),
        (
            "database = \"sqlite://",
            "database = \"mysql://db/cloud\"\n# ",
            "6: key `database`",
            "mysql",
        ),
        (
            "database = \"sqlite://",
            "database = \"sqlite:///nonexistent/cyphonic/\"\n# ",
            "6: key `database`",
            "does not exist",
        ),
        (
            "status_socket",
            "status_sockett",
            "7: ",
            "unknown field `status_sockett`",
        ),
        (
            "ports = \"50000-50999\"",
            "ports = \"50999-50000\"",
            "11: key `relay.ports`",
            "50999-50000",
        ),
        (
            "default = \"allow\"",
            "default = \"maybe\"",
            "14: key `policy.default`",
            "maybe",
        ),
        (
            "pool = [\"100.64.128.0/17\"]",
            "pool = [\"100.64.128.0/17\", \"100.64.192.0/18\"]",
            "19: key `enroll.pool`",
            "overlaps",
        ),
        (
            "pool = [\"100.64.128.0/17\"]",
            "pool = [\"10.0.0.0/8\"]",
            "19: key `enroll.pool`",
            "10.0.0.0/8",
        ),
        (
            "lifetime = 604800",
            "lifetime = 10",
            "20: key `enroll.lifetime`",
            "10 s",
        ),
        (
            "listen = \"127.0.0.1:9467\"",
            "listen = \"nowhere\"",
            "23: key `api.listen`",
            "\"nowhere\"",
        ),
    ];
    for (was, now, at, says) in mistakes {
        assert!(good.contains(was), "{was}");
        let text = if was == "listen = \"127.0.0.1:9467\"" {
            good.replace(was, now)
        } else {
            good.replacen(was, now, 1)
        };
        let (code, said) = check(&text);
        let error = said["error"].as_str().unwrap_or_default();
        assert_eq!(code, Some(78), "{now}: {said}");
        assert!(
            error.starts_with(&format!("{}:{at}", path.display())) && error.contains(says),
            "{now}: {error}"
        );
    }
}

/// `policy` answers in its exit status: 0 allowed, 1 denied, 2 when it cannot say (a name
/// nobody holds, a flow that does not read), 78 for a file it refuses; `--json` says the
/// same as `{allowed, answer}`.
#[test]
fn policy_says_allowed_denied_or_no_answer_in_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_config(dir.path());
    let path = dir.path().join("cloud.toml");
    let policy = |text: &str, args: &[&str]| {
        std::fs::write(&path, text).unwrap();
        let mut all = vec!["policy", "-c", path.to_str().unwrap(), "--json"];
        all.extend_from_slice(args);
        let out = run(&all);
        let said: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), said)
    };
    let flow = ["100.64.1.1", "100.64.2.1", "tcp/22"];
    let (code, said) = policy(&good, &flow);
    assert_eq!(
        (code, &said["allowed"]),
        (Some(0), &Value::Bool(true)),
        "{said}"
    );
    let deny = good.replace("default = \"allow\"", "default = \"deny\"");
    let (code, said) = policy(&deny, &flow);
    assert_eq!(
        (code, &said["allowed"]),
        (Some(1), &Value::Bool(false)),
        "{said}"
    );
    assert!(
        said["answer"]
            .as_str()
            .is_some_and(|a| a.starts_with("denied: ")),
        "{said}"
    );
    for args in [
        ["nobody.ovl.example", "100.64.2.1", "icmp"],
        ["100.64.1.1", "100.64.2.1", "sctp/9"],
    ] {
        let (code, said) = policy(&good, &args);
        assert_eq!((code, &said), (Some(2), &Value::Null), "{args:?}");
    }
    let refused = good.replace("lifetime = 604800", "lifetime = 10");
    assert_eq!(policy(&refused, &flow).0, Some(78));
}

/// `ca init --passphrase-file` protects ca.key (PKCS#8, encrypted, as OpenSSL reads it);
/// every command that signs then needs the passphrase: without one and without a terminal
/// it says how to give it, a wrong one is refused, the right one signs. `ca passphrase`
/// changes it and removes it. A short one is refused before anything is written.
#[test]
fn a_ca_key_protected_by_a_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let path = |f: &str| dir.path().join(f).display().to_string();
    let ca = path("ca");
    for (file, text) in [
        ("short", "seven77\n"),
        ("old", "correct horse battery\n"),
        ("new", "staple stable table\nsecond line ignored\n"),
    ] {
        std::fs::write(path(file), text).unwrap();
    }
    let init = |pass: &str| {
        run(&[
            "ca",
            "init",
            "--dir",
            &ca,
            "--domain",
            "ovl.example",
            "--passphrase-file",
            pass,
        ])
    };
    let short = init(&path("short"));
    assert_eq!(short.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&short.stderr).contains("at least 8 characters"));
    assert!(!dir.path().join("ca").exists(), "a refused init wrote a CA");
    assert!(init(&path("old")).status.success());
    let key = std::fs::read_to_string(path("ca/ca.key")).unwrap();
    assert!(
        key.starts_with("-----BEGIN ENCRYPTED PRIVATE KEY-----") && !key.contains("CYPHONIC"),
        "{key}"
    );
    // OpenSSL reads it with the passphrase, as an Ed25519 key.
    let openssl = Command::new("openssl")
        .args([
            "pkey",
            "-in",
            &path("ca/ca.key"),
            "-noout",
            "-text",
            "-passin",
        ])
        .arg(format!("file:{}", path("old")))
        .output()
        .unwrap();
    assert!(
        openssl.status.success()
            && String::from_utf8_lossy(&openssl.stdout).contains("ED25519 Private-Key"),
        "{openssl:?}"
    );

    let issue = |n: u32, pass: Option<&str>| {
        let name = format!("n{n}.ovl.example");
        let block = format!("100.64.9.{n}/32");
        let out = path("out");
        let mut args = vec![
            "ca",
            "issue",
            "--dir",
            &ca,
            "--name",
            &name,
            "--vip-block",
            &block,
            "--out",
            &out,
        ];
        if let Some(p) = pass {
            args.extend(["--passphrase-file", p]);
        }
        let done = Command::new(env!("CARGO_BIN_EXE_cyphonic-cloud"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            done.status.code(),
            String::from_utf8_lossy(&done.stderr).into_owned(),
        )
    };
    let (status, why) = issue(1, None);
    assert_eq!(status, Some(1));
    assert!(
        why.contains("no terminal to ask on: give --passphrase-file"),
        "{why}"
    );
    let (status, why) = issue(1, Some(&path("new")));
    assert_eq!(status, Some(1));
    assert!(why.contains("wrong passphrase"), "{why}");
    assert_eq!(issue(1, Some(&path("old"))), (Some(0), String::new()));
    let said = ok(&[
        "ca",
        "verify",
        &path("out/n1.ovl.example.crt"),
        "--ca",
        &path("ca/ca.crt"),
    ]);
    assert!(said.starts_with("ok: n1.ovl.example"), "{said}");

    // `ca passphrase` with the current passphrase and `then`.
    let passphrase = |current: &str, then: &[&str]| {
        let mut args = vec![
            "ca",
            "passphrase",
            "--dir",
            &ca,
            "--passphrase-file",
            current,
        ];
        args.extend(then);
        ok(&args)
    };
    // A new passphrase (its file's first line); the old one no longer opens it.
    passphrase(&path("old"), &["--new-passphrase-file", &path("new")]);
    assert!(issue(2, Some(&path("old"))).1.contains("wrong passphrase"));
    assert_eq!(issue(2, Some(&path("new"))).0, Some(0));
    // No passphrase: the plain key, as before.
    passphrase(&path("new"), &["--remove"]);
    let key = std::fs::read_to_string(path("ca/ca.key")).unwrap();
    assert!(key.contains("BEGIN CYPHONIC CA PRIVATE KEY"), "{key}");
    assert_eq!(issue(3, None), (Some(0), String::new()));
}
