//! Trust over time with the real binaries: what SIGHUP re-reads while tunnels stay up
//! (revocations, static peers, DNS upstreams), what it refuses, and a revoked static peer cut
//! off at once. See e2e/src/bed.rs for the topology.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cyphonic_e2e::bed::{BedOptions, Ping, Side, TwoSites};
use cyphonic_e2e::lan::dig;
use cyphonic_e2e::wait_until;

/// What A's DNS answers for `name` from A's LAN: its status and addresses.
fn ask_a(bed: &TwoSites, name: &str) -> (String, Vec<String>) {
    let d = dig(&bed.a.lan, bed.a.gateway, name, "A").unwrap();
    (d.status, d.answers)
}

/// Site A's configuration with `revocations = "revoked.txt"` in `[identity]`, and `extra`
/// after everything else.
fn write_a(bed: &TwoSites, base: &str, extra: &str) {
    let text = base.replace(
        "ca = \"ca.crt\"\n",
        "ca = \"ca.crt\"\nrevocations = \"revoked.txt\"\n",
    );
    assert_ne!(text, base, "the bed's [identity] table changed shape");
    std::fs::write(bed.a.config(), format!("{text}{extra}")).unwrap();
}

/// Sends SIGHUP to A and waits until its log says how the reload ended (`count` reloads so
/// far); returns the log.
fn reload_a(bed: &TwoSites, count: usize) -> String {
    bed.reload(Side::A, count)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()))
}

/// A static-peer pair without a cloud: SIGHUP on A with a broken file changes nothing (the
/// tunnel stays up); with B's certificate on A's revocation list, B is cut off within
/// seconds (A's peer table drops it, pings stop, B's handshakes are refused as revoked);
/// with the list emptied again, B is back without a restart. Changes that need a restart
/// are named in the log, and a changed upstream takes effect.
#[test]
fn sighup_revokes_a_static_peer_at_once_and_a_broken_file_changes_nothing() {
    let bed = TwoSites::up(&BedOptions::default()).unwrap();
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(3).wait(3));
    let host = bed.a.host_ip.to_string();
    assert_eq!(
        ask_a(&bed, "host.gw1.ovl.example"),
        ("NOERROR".to_owned(), vec![host.clone()])
    );
    let base = std::fs::read_to_string(bed.a.config()).unwrap();
    std::fs::write(bed.a.dir.join("revoked.txt"), "# none\n").unwrap();

    // 1. A file with a mistake is refused whole; the tunnel is untouched.
    write_a(
        &bed,
        &base,
        "\n[dns]\nupstream = [\"198.51.100.53\"]\nttl = \"soon\"\n",
    );
    let log = reload_a(&bed, 1);
    assert!(
        log.contains("the configuration is refused, the running one stays")
            && log.contains("dns.ttl"),
        "{log}"
    );
    assert!(!log.contains("DNS upstream resolvers"), "{log}");
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(3).wait(3));

    // 2. A good file: the new upstream and the renamed reservation apply, a changed listen
    //    port is named as waiting for a restart, and the unchanged static peer keeps its
    //    tunnel.
    // A peer slot that is kept keeps its counters; a replaced one starts from zero.
    let sent = |bed: &TwoSites| {
        bed.status(Side::A).unwrap()["peers"][0]["tx_packets"]
            .as_u64()
            .unwrap()
    };
    let before = sent(&bed);
    //    The log level becomes debug.
    assert!(
        !bed.a.log_text().contains(" DEBUG "),
        "debug before it was asked for"
    );
    let debug = "\n[log]\nlevel = \"debug\"\n";
    let changed = base
        .replace("hostname = \"host\"", "hostname = \"renamed\"")
        .replace("[adapter]\n", "[adapter]\nlisten = \"[::]:51999\"\n");
    write_a(
        &bed,
        &changed,
        &format!("\n[dns]\nupstream = [\"198.51.100.53\"]\n{debug}"),
    );
    let log = reload_a(&bed, 2);
    for line in [
        "reservations changed: applied",
        "key=\"listen\"",
        "DNS upstream resolvers upstream=Some([198.51.100.53])",
        "log filter set level=\"debug\"",
    ] {
        assert!(log.contains(line), "no {line:?} in\n{log}");
    }
    assert!(!log.contains("key=\"[[reservation]]\""), "{log}");
    assert_eq!(
        ask_a(&bed, "renamed.gw1.ovl.example"),
        ("NOERROR".to_owned(), vec![host.clone()])
    );
    assert_eq!(ask_a(&bed, "host.gw1.ovl.example").0, "NXDOMAIN");
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(3).wait(3));
    assert_eq!(bed.counter(Side::A, "peers_removed").unwrap(), 0);
    assert!(sent(&bed) >= before + 3, "the unchanged peer was replaced");

    // 2b. The host's reservation given to another MAC: its address is no longer its own, and
    //     what it sends from it is dropped as spoofed.
    let mac = bed.a.host_mac.clone();
    let stolen = changed.replace(&format!("mac = \"{mac}\""), "mac = \"02:00:00:00:09:09\"");
    assert_ne!(stolen, changed);
    write_a(&bed, &stolen, debug);
    reload_a(&bed, 3);
    let spoofed = bed.counter(Side::A, "drop_spoofed").unwrap();
    let out = bed
        .ping(Side::A, bed.b.host_ip, &["-c", "3", "-i", "0.2", "-W", "1"])
        .unwrap();
    assert!(!out.status.success(), "the host still got through");
    assert!(bed.counter(Side::A, "drop_spoofed").unwrap() >= spoofed + 3);

    // 3. B revoked: within seconds, nothing passes and A no longer has B as a peer.
    let ca = bed.ca_dir();
    bed.revoke(Side::B).unwrap();
    std::fs::copy(ca.join("revoked.txt"), bed.a.dir.join("revoked.txt")).unwrap();
    write_a(&bed, &base, debug);
    let revoked_at = Instant::now();
    let log = reload_a(&bed, 4);
    assert!(log.contains("peer removed"), "{log}");
    let s = bed.status(Side::A).unwrap();
    assert_eq!(s["peers"].as_array().unwrap().len(), 0, "{s}");
    assert_eq!(bed.counter(Side::A, "peers_removed").unwrap(), 1);
    let out = bed
        .ping(Side::A, bed.b.host_ip, &["-c", "5", "-i", "0.2", "-W", "1"])
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stdout).contains(" 0 received"),
        "pings passed after the revocation:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // B (which still has A as its peer) handshakes again once its traffic goes unanswered
    // (15 s): A refuses it as revoked.
    let out = bed
        .ping(Side::B, bed.a.host_ip, &["-c", "20", "-i", "1", "-W", "1"])
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 0 received"));
    wait_until(
        Duration::from_secs(20),
        "B's handshake refused as revoked",
        || bed.a.log_text().contains("reason=\"cert_revoked\""),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(revoked_at.elapsed() < Duration::from_secs(50));

    // 4. The list emptied again: B is a peer again, without a restart.
    std::fs::write(bed.a.dir.join("revoked.txt"), "# none\n").unwrap();
    let log = reload_a(&bed, 5);
    // At debug level now: the peer's return is logged.
    assert!(log.contains("static peer added"), "{log}");
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(3).wait(5));
}
