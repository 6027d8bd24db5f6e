//! Enrollment and renewal with the real binaries (docs/protocol.md §4): a fresh adapter given
//! only the cloud's address, its key and a one-time token joins, gets its certificate and
//! block from the cloud's issuing CA, and its DHCP devices are reached by name from node C;
//! the token does not work twice, and expired, revoked or malformed tokens are refused with
//! a clear message. With certificates of about a minute, a transfer through the enrolled
//! adapter runs across several renewals without a stall. See e2e/src/bed.rs for the
//! topology.

#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use cyphonic_e2e::bed::{BedOptions, CloudOptions, ENROLL_POOL, Ping, Side, TwoSites};
use cyphonic_e2e::lan::DhcpHost;
use cyphonic_e2e::node::{NAME, VIP};
use cyphonic_e2e::uint;
use serde_json::Value;

/// The name the token binds site B's adapter to.
const GW: &str = "gw9.ovl.example";
const CAMERA: &str = "camera.gw9.ovl.example";

/// What a command printed (both streams): `Ok` when it succeeded.
fn outcome(out: &std::process::Output) -> Result<String, String> {
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// `cyphonic-cloud token ARGS --config <the bed's cloud>`: its output, or its error.
fn token_cmd(bed: &TwoSites, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["token"];
    all.extend_from_slice(args);
    outcome(&bed.cloud_cli(&all).unwrap())
}

/// A new token for `name` (more `args` after), as `token create` prints it.
fn create_token(bed: &TwoSites, name: &str, args: &[&str]) -> String {
    bed.create_token(name, args).unwrap()
}

/// Site B's configuration for an adapter that has nothing yet but the cloud and (maybe) a
/// token: no certificate, key or CA file; no gateway address (it follows from the block).
fn fresh_config(bed: &TwoSites, dir: &Path, token: Option<&str>) -> std::path::PathBuf {
    let cloud = bed.cloud.as_ref().unwrap();
    let token = token
        .map(|t| format!("token = \"{t}\"\n"))
        .unwrap_or_default();
    let path = dir.join("adapter.toml");
    std::fs::write(
        &path,
        format!(
            "[adapter]\nlan_interface = \"lan\"\nstatus_socket = \"adapter.sock\"\nstate_dir = \"state\"\n\n\
             [identity]\ncertificate = \"gw9.crt\"\nkey = \"gw9.key\"\nca = \"ca.crt\"\n{token}\n\
             [cloud]\naddress = \"{}\"\npublic_key = \"{}\"\n",
            cloud.address, cloud.public_key
        ),
    )
    .unwrap();
    path
}

/// `cyphonic-adapter enroll --config CONFIG --token TOKEN` in site B's adapter namespace:
/// its output, or its error.
fn enroll(bed: &TwoSites, config: &Path, token: &str) -> Result<String, String> {
    let out = bed
        .b
        .adapter_ns
        .exec_output(
            bed.bins.adapter.to_str().unwrap(),
            &[
                "enroll",
                "--config",
                config.to_str().unwrap(),
                "--token",
                token,
            ],
        )
        .unwrap();
    outcome(&out)
}

/// [`enroll`] with the device's clock moved by `shift` (libfaketime's offset, `-2h`), or
/// as it is.
fn enroll_at(
    bed: &TwoSites,
    config: &Path,
    token: &str,
    shift: Option<&str>,
) -> Result<String, String> {
    let adapter = bed.bins.adapter.to_str().unwrap();
    let enroll = [
        "enroll",
        "--config",
        config.to_str().unwrap(),
        "--token",
        token,
    ];
    let out = match shift {
        None => bed.b.adapter_ns.exec_output(adapter, &enroll),
        // Only the wall clock: the runtime's timers keep the real monotonic clock.
        Some(shift) => {
            let mut args = vec![
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
                "faketime",
                "-f",
                shift,
                adapter,
            ];
            args.extend_from_slice(&enroll);
            bed.b.adapter_ns.exec_output("env", &args)
        }
    }
    .unwrap();
    outcome(&out)
}

/// The bed with a cloud that enrolls (certificates of `lifetime` seconds), a switch on each
/// LAN and node C; site B's adapter enrolled with a token in its `[identity]` (`run` enrolls
/// first) and started; a camera on lanB with a DHCP lease. Adapter A is not started.
fn enrolled_bed(lifetime: u64) -> (TwoSites, DhcpHost, Ipv4Addr) {
    let mut bed = TwoSites::new(&BedOptions {
        cloud: Some(CloudOptions {
            enroll: Some(lifetime),
            ..CloudOptions::default()
        }),
        lan_switch: true,
        node_c: Some(None),
        ..BedOptions::default()
    })
    .unwrap();
    let token = create_token(&bed, GW, &["--prefix", "24", "--group", "site"]);
    let config = fresh_config(&bed, &bed.b.dir.clone(), Some(&token));
    assert_eq!(config, bed.b.config(), "the bed's site file moved");
    // Not enrolled yet: the unit's check-config passes, having checked what enrolling needs.
    let out = std::process::Command::new(&bed.bins.adapter)
        .args(["check-config", "-c", config.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("not enrolled yet"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bed.start(Side::B).unwrap();
    let bins = bed.bins.clone();
    bed.c.as_mut().unwrap().start(&bins).unwrap();
    let (cam, ip) = bed.dhcp_device(Side::B, "camera").unwrap();
    (bed, cam, ip)
}

/// A fresh adapter with only a token joins: its key is made on the spot (not readable by
/// others), its certificate comes from the cloud's issuing CA with the block allocated from
/// the pool, and its DHCP camera is reached by name from node C (which learns the issuing CA
/// from the cloud). The token cannot be used twice; expired, revoked and malformed tokens are
/// refused, each with a message that says which.
#[test]
fn a_fresh_adapter_joins_with_a_token_and_its_devices_are_reached_by_name() {
    let (bed, cam, cam_ip) = enrolled_bed(7 * 24 * 3600);
    let pool: ipnet::Ipv4Net = ENROLL_POOL.parse().unwrap();
    assert!(
        pool.contains(&cam_ip),
        "the camera's {cam_ip} outside {pool}"
    );

    // Its own key, its certificate and block.
    use std::os::unix::fs::PermissionsExt as _;
    let key_mode = std::fs::metadata(bed.b.dir.join("gw9.key"))
        .unwrap()
        .permissions()
        .mode();
    // Never readable by others; by the directory's group when the directory is closed to
    // others (the packages' /var/lib/cyphonic), by its owner alone otherwise.
    let dir_mode = std::fs::metadata(&bed.b.dir).unwrap().permissions().mode();
    let expected = if dir_mode & 0o007 == 0 { 0o640 } else { 0o600 };
    assert_eq!(key_mode & 0o777, expected, "directory mode {dir_mode:o}");
    let s = bed.status(Side::B).unwrap();
    assert_eq!(s["certificate"]["name"], GW, "{s}");
    // Its blocks (issue 53): the pool's first /24, with the camera in it, and beside it
    // the first /56 of the pool's IPv6 half.
    assert_eq!(
        s["certificate"]["blocks"],
        serde_json::json!(["100.64.128.0/24", "fd7a:0:1:8000::/56"]),
        "{s}"
    );
    let log = bed.b.log_text();
    // The line the enrollment logs, not any line naming it ("not enrolled yet" would do).
    let said = format!(": enrolled name={GW} ");
    assert!(log.lines().any(|l| l.contains(&said)), "{log}");

    // Reached by name from node C, and back.
    let node = &bed.c.as_ref().unwrap().ns;
    assert_eq!(bed.resolve(node, VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(node, CAMERA, Ping::default());
    let gateway = cam.default_route().unwrap();
    assert_eq!(bed.resolve(&cam.ns, gateway, NAME), [VIP.to_string()]);
    bed.ping_ok(&cam.ns, NAME, Ping::default());
    let node_log = bed.c.as_ref().unwrap().log_text();
    assert!(
        node_log.contains("trusting the cloud's issuing CA"),
        "{node_log}"
    );

    // The node's reload keeps what it learned from the cloud: the issuing CA stays trusted
    // (the file names only the root), so the enrolled adapter stays its peer.
    let node_host = bed.c.as_ref().unwrap();
    let pid = node_host.proc.as_ref().unwrap().pid().to_string();
    cyphonic_e2e::sh("kill", &["-s", "HUP", &pid]).unwrap();
    cyphonic_e2e::wait_until(Duration::from_secs(5), "the node's reload", || {
        node_host.log_text().contains("configuration reloaded")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node_host.log_text()));
    assert!(
        !node_host.log_text().contains("peer removed"),
        "{}",
        node_host.log_text()
    );
    bed.ping_ok(node, CAMERA, Ping::default());

    // Enrolled already: enrolling again is refused, and says why.
    let err = enroll(&bed, &bed.b.config(), "0123456789abcdef.00").unwrap_err();
    assert!(err.contains("enrolled already"), "{err}");

    // The token is spent: another device cannot use it.
    let token = std::fs::read_to_string(bed.b.config())
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("token = \""))
        .unwrap()
        .trim_end_matches('"')
        .to_owned();
    let other = cyphonic_e2e::hosts::TempDir::new("enroll-again").unwrap();
    let again = fresh_config(&bed, other.path(), None);
    let err = enroll(&bed, &again, &token).unwrap_err();
    assert!(err.contains("has been used already"), "{err}");
    assert!(!other.path().join("gw9.crt").exists());

    // The name is taken: a new token for it needs --replace (a replacement device).
    let err = token_cmd(&bed, &["create", "--name", GW, "--prefix", "24"]).unwrap_err();
    assert!(err.contains("is a member already"), "{err}");
    let replacement = create_token(&bed, GW, &["--prefix", "24", "--replace"]);
    token_cmd(&bed, &["revoke", &replacement[..16]]).unwrap();

    // A node's token: a /32 and, beside it, a /128, each the first free past the site's
    // blocks; an IPv6 prefix of the operator's choice, past the node's address.
    let node = create_token(&bed, "n5.ovl.example", &["--prefix", "32"]);
    let site = create_token(
        &bed,
        "gw13.ovl.example",
        &["--prefix", "24", "--prefix6", "60"],
    );
    let listed: Value =
        serde_json::from_str(&token_cmd(&bed, &["list", "--json"]).unwrap()).unwrap();
    let blocks_of = |token: &str| {
        listed
            .as_array()
            .and_then(|all| all.iter().find(|t| t["id"] == token[..16]))
            .map(|t| t["vip_blocks"].clone())
    };
    assert_eq!(
        blocks_of(&node),
        Some(serde_json::json!([
            "100.64.129.0/32",
            "fd7a:0:1:8100::/128"
        ])),
        "{listed}"
    );
    assert_eq!(
        blocks_of(&site),
        Some(serde_json::json!(["100.64.130.0/24", "fd7a:0:1:8110::/60"])),
        "{listed}"
    );
    token_cmd(&bed, &["revoke", &node[..16]]).unwrap();
    token_cmd(&bed, &["revoke", &site[..16]]).unwrap();

    // Revoked before use.
    let revoked = create_token(&bed, "gw10.ovl.example", &["--prefix", "24"]);
    let id = &revoked[..16];
    let out = token_cmd(&bed, &["revoke", id]).unwrap();
    assert!(out.contains("revoked token"), "{out}");
    let err = enroll(&bed, &again, &revoked).unwrap_err();
    assert!(err.contains("has been revoked"), "{err}");

    // Expired before use.
    let expired = create_token(
        &bed,
        "gw11.ovl.example",
        &["--prefix", "24", "--expires", "1"],
    );
    std::thread::sleep(Duration::from_millis(2100));
    let err = enroll(&bed, &again, &expired).unwrap_err();
    assert!(err.contains("has expired"), "{err}");

    // Not a token (refused here, before the cloud is asked), or one the cloud never made.
    let err = enroll(&bed, &again, "not-a-token").unwrap_err();
    assert!(err.contains("not an enrollment token"), "{err}");
    let unknown = format!("0123456789abcdef.{}", "ab".repeat(32));
    let err = enroll(&bed, &again, &unknown).unwrap_err();
    assert!(err.contains("not known here"), "{err}");
    assert!(!other.path().join("gw9.crt").exists());

    // Issue 49, finding 5: a device whose clock is two hours behind (a Pi without a
    // real-time clock, before NTP) refuses the certificate it is given, which starts after
    // its "now"; the token is not spent by that: once the clock is right the device enrolls
    // with it (the same key), and the token names the certificate it holds, not the one it
    // refused. Another key is refused the token meanwhile.
    let late = create_token(&bed, "gw12.ovl.example", &["--prefix", "24"]);
    let behind = cyphonic_e2e::hosts::TempDir::new("clock-behind").unwrap();
    let config = fresh_config(&bed, behind.path(), None);
    let err = enroll_at(&bed, &config, &late, Some("-2h")).unwrap_err();
    assert!(err.contains("not valid before"), "{err}");
    assert!(!behind.path().join("gw9.crt").exists());
    let thief = cyphonic_e2e::hosts::TempDir::new("clock-thief").unwrap();
    let err = enroll(&bed, &fresh_config(&bed, thief.path(), None), &late).unwrap_err();
    assert!(err.contains("has been used already"), "another key: {err}");
    // A second later: the certificate issued now differs from the refused one (issued in
    // the same second, it would be the same certificate, and nothing would be retired).
    std::thread::sleep(Duration::from_millis(1_100));
    let said = enroll_at(&bed, &config, &late, None)
        .unwrap_or_else(|e| panic!("the token was spent by the refused certificate: {e}"));
    let held = cyphonic_crypto::Certificate::from_pem(
        &std::fs::read_to_string(behind.path().join("gw9.crt")).unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}: {said}"))
    .fingerprint()
    .to_string();
    let list: Value = serde_json::from_str(&token_cmd(&bed, &["list", "--json"]).unwrap()).unwrap();
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "gw12.ovl.example")
        .unwrap()
        .clone();
    assert_eq!(row["state"], "issued", "{row}");
    assert_eq!(row["used_by"], held.as_str(), "{row}");
    // The refused certificate, named by the token no more, is revoked: a revocation of the
    // name could not reach it otherwise.
    let cloud_log = std::fs::read_to_string(bed.cloud.as_ref().unwrap().log()).unwrap();
    let field = |line: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("fingerprint="))
            .map(str::to_owned)
    };
    let line = |what: &str| {
        cloud_log
            .lines()
            .find(|l| l.contains(what) && l.contains("name=gw12.ovl.example"))
            .unwrap_or_else(|| panic!("no `{what}` for gw12 in\n{cloud_log}"))
    };
    let refused = field(line("enrolled name=")).unwrap();
    assert_ne!(refused, held);
    let retired = line("the certificate it refused is revoked");
    assert_eq!(
        field(retired).as_deref(),
        Some(refused.as_str()),
        "{retired}"
    );
    assert!(retired.contains("added=1"), "{retired}");

    // The fleet view: one used, one revoked, one expired (and gw12's issued); none shows its
    // secret.
    let list: Value = serde_json::from_str(&token_cmd(&bed, &["list", "--json"]).unwrap()).unwrap();
    let states: Vec<(&str, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    for want in [
        (GW, "used"),
        ("gw10.ovl.example", "revoked"),
        ("gw11.ovl.example", "expired"),
    ] {
        assert!(states.contains(&want), "{want:?} in {states:?}");
    }
    assert!(
        !list.to_string().contains(&token[17..]),
        "a secret in {list}"
    );
    let cloud = bed.cloud.as_ref().unwrap().status(&bed.bins).unwrap();
    // GW once, gw12 twice (the certificate its clock refused, and the one it holds).
    assert_eq!(cloud["counters"]["enrolled"], 3, "{cloud}");
    assert!(uint(&cloud["counters"]["enroll_refused"]) >= 5, "{cloud}");
}

/// With certificates of a minute, the enrolled adapter renews several times while iperf3
/// runs from node C to its camera: every one-second interval carries traffic (no stall: the
/// node learns each new certificate from a rekey long before the old one ends), and names
/// still resolve afterwards.
#[test]
fn renewals_of_minute_long_certificates_do_not_stall_a_transfer() {
    let (bed, cam, cam_ip) = enrolled_bed(60);
    let node = &bed.c.as_ref().unwrap().ns;
    assert_eq!(bed.resolve(node, VIP, CAMERA), [cam_ip.to_string()]);
    bed.ping_ok(node, CAMERA, Ping::default());
    let first = bed.status(Side::B).unwrap()["certificate"]["fingerprint"].clone();

    let srv = cam
        .ns
        .spawn("iperf3", &["-s", "-1", "--idle-timeout", "20"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = node
        .exec_output("iperf3", &["-J", "-c", CAMERA, "-t", "75", "-b", "20M"])
        .unwrap();
    drop(srv);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3: {e}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            bed.logs()
        )
    });
    assert!(report["error"].is_null(), "{report}\n{}", bed.logs());
    let intervals: Vec<f64> = report["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0))
        .collect();
    assert!(intervals.len() >= 74, "{} intervals", intervals.len());
    let slowest = intervals.iter().copied().fold(f64::INFINITY, f64::min);
    eprintln!(
        "75 s at 20 Mbit/s across renewals: slowest 1-s interval {:.1} Mbit/s",
        slowest / 1e6
    );
    assert!(
        slowest > 2e6,
        "an interval fell to {slowest} bit/s: {intervals:?}\n{}",
        bed.logs()
    );

    // Renewed several times, and the node knows the latest certificate.
    let log = bed.b.log_text();
    let renewals = log.matches("certificate renewed").count();
    eprintln!("{renewals} renewals during the transfer and the setup");
    assert!(renewals >= 2, "{renewals} renewals\n{log}");
    let now = bed.status(Side::B).unwrap();
    assert_ne!(now["certificate"]["fingerprint"], first, "{now}");
    let cloud = bed.cloud.as_ref().unwrap().status(&bed.bins).unwrap();
    assert!(uint(&cloud["counters"]["renewed"]) >= 2, "{cloud}");
    // Names follow the renewed certificate: the adapter's own, asked for the first time
    // now, from the node; the node's from the camera.
    assert_eq!(
        bed.resolve(node, VIP, GW),
        [cam.default_route().unwrap().to_string()]
    );
    let gateway = cam.default_route().unwrap();
    assert_eq!(bed.resolve(&cam.ns, gateway, NAME), [VIP.to_string()]);
}

/// Issue 53: an overlay made before IPv6 (its root certifies IPv4 only) gains an IPv6 /48 by
/// `ca add-block`: a new `ca.crt` for the same key (the old one kept beside it), under which
/// what the old one issued still verifies and from which an IPv6 block can be issued; a
/// trust store holding only the old root refuses that block.
#[test]
fn ca_add_block_gives_an_old_root_ipv6_and_keeps_what_it_issued() {
    use cyphonic_crypto::cert::{Certificate, CertificateAuthority, RevocationList, TrustStore};
    let bins = cyphonic_e2e::hosts::Bins::find().unwrap();
    let tmp = cyphonic_e2e::hosts::TempDir::new("addblock").unwrap();
    let dir = tmp.path().join("ca");
    std::fs::create_dir_all(dir.join("issued")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // As `ca init` made roots before IPv6.
    let old = CertificateAuthority::generate(
        "ovl.example",
        &["100.64.0.0/10".parse().unwrap()],
        now - 86_400,
        now + 3 * 365 * 86_400,
    )
    .unwrap();
    std::fs::write(dir.join("ca.key"), old.key_pem().as_bytes()).unwrap();
    std::fs::write(dir.join("ca.crt"), old.certificate().to_pem()).unwrap();
    let cloud = bins.cloud.to_str().unwrap();
    let ca = dir.to_str().unwrap();
    let out = tmp.path().join("out");
    let issue = |name: &str, blocks: &[&str]| {
        let mut args = vec!["ca", "issue", "--dir", ca, "--name", name];
        for b in blocks {
            args.extend(["--vip-block", b]);
        }
        args.extend(["--out", out.to_str().unwrap()]);
        outcome(
            &std::process::Command::new(cloud)
                .args(&args)
                .output()
                .unwrap(),
        )
    };
    issue("gw1.ovl.example", &["100.64.1.0/24"]).unwrap();
    let dual = ["100.64.2.0/24", "fd7a:1:0:200::/56"];
    let refused = issue("gw2.ovl.example", &dual).unwrap_err();
    assert!(refused.contains("fd7a:1:0:200::/56"), "{refused}");
    let add = |blocks: &[&str]| {
        let mut args = vec!["ca", "add-block", "--dir", ca];
        for b in blocks {
            args.extend(["--vip-block", b]);
        }
        outcome(
            &std::process::Command::new(cloud)
                .args(&args)
                .output()
                .unwrap(),
        )
    };
    let said = add(&["fd7a:1::/48"]).unwrap();
    assert!(said.contains("fd7a:1::/48"), "{said}");
    let kept = dir.join(format!("ca.crt.{}", old.certificate().fingerprint()));
    assert_eq!(
        std::fs::read_to_string(&kept).unwrap(),
        old.certificate().to_pem()
    );
    issue("gw2.ovl.example", &dual).unwrap();
    // Nothing left to add, and no IPv6 drawn when it has one.
    assert!(add(&["fd7a:1:0:300::/56"]).is_err());
    assert!(add(&[]).unwrap_err().contains("IPv6 block already"));
    let read = |p: &Path| Certificate::from_pem(&std::fs::read_to_string(p).unwrap()).unwrap();
    let new = read(&dir.join("ca.crt"));
    assert_eq!(new.body().public_key, old.certificate().body().public_key);
    let store = |root: &Certificate| {
        TrustStore::new(vec![root.clone()], RevocationList::default()).unwrap()
    };
    let (gw1, gw2) = (
        read(&out.join("gw1.ovl.example.crt")),
        read(&out.join("gw2.ovl.example.crt")),
    );
    store(&new).verify(&gw1, now).unwrap();
    store(&new).verify(&gw2, now).unwrap();
    store(old.certificate()).verify(&gw1, now).unwrap();
    assert!(store(old.certificate()).verify(&gw2, now).is_err());
}
