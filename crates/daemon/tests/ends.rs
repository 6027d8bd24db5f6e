//! Two tunnel ends run by the production driver (`run_on`: the engine, the control loop,
//! the status socket, reloads, the stop) in this process, over an in-memory link, each with a
//! small edge of its own: no root, no namespaces, no real socket.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cyphonic_daemon::Edge as _;
use cyphonic_daemon::testing::{BareEdge, BareHost, RunningEnd, common};
use cyphonic_settings::{Common, Identity, Peer, now_secs};
use cyphonic_tunnel::testing::{Link, test_ca_at, test_identity_at, udp4};

/// How long a test waits for what must happen; the wait ends as soon as it does.
const PATIENCE: Duration = Duration::from_secs(30);

/// One end's files, identity and configuration.
struct Side {
    dir: tempfile::TempDir,
    identity: Identity,
    certificate: cyphonic_crypto::Certificate,
    addr: SocketAddr,
    vip: Ipv4Addr,
    block: &'static str,
}

/// Two ends' setups: `a` (100.64.1.0/24 at 192.0.2.1) and `b` (100.64.2.0/24 at 192.0.2.2).
fn sides() -> (Side, Side) {
    let now = now_secs();
    let ca = test_ca_at(now);
    let side = |name: &str, block: &'static str, n: u8| {
        let (identity, certificate) = test_identity_at(&ca, name, block, now);
        Side {
            dir: tempfile::tempdir().expect("a directory"),
            identity,
            certificate,
            addr: SocketAddr::from(([192, 0, 2, n], 51820)),
            vip: Ipv4Addr::new(100, 64, n, 1),
            block,
        }
    };
    (
        side("gw1.ovl.example", "100.64.1.0/24", 1),
        side("gw2.ovl.example", "100.64.2.0/24", 2),
    )
}

/// `other` as a static peer with its address as endpoint.
fn peer_of(other: &Side) -> Peer {
    Peer {
        certificate: other.certificate.clone(),
        endpoint: Some(other.addr),
        persistent_keepalive: None,
        dns: other.vip,
        revoked: false,
    }
}

fn common_of(side: &Side, peers: Vec<Peer>) -> Common {
    Common {
        peers,
        ..common(side.dir.path(), side.addr, side.block)
    }
}

/// What an end's configuration reads as at each reload: the next of these, in turn (an
/// `Err` is a file refused).
type Reloads = Arc<Mutex<Vec<Result<Common, String>>>>;

/// Starts `side` with `config` on `link`; reloads read `reloads`.
fn start(
    link: &Link,
    side: &Side,
    config: Common,
    reloads: Reloads,
) -> (RunningEnd, Arc<BareHost>) {
    let seen = Arc::new(BareHost::default());
    let socket = Box::new(link.socket(side.addr));
    let identity = side
        .identity
        .with_trust(side.identity.trust().clone(), now_secs())
        .expect("the same identity");
    let again = side
        .identity
        .with_trust(side.identity.trust().clone(), now_secs())
        .expect("the same identity");
    let edge = BareEdge(seen.clone());
    let status = config.status_socket.clone();
    let end = RunningEnd::start("cy-end", BareEdge::PROGRAM, &status, move |signals| {
        let reload: cyphonic_daemon::Reloader<()> = Box::new(move || {
            let next = reloads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(0)
                .map_err(anyhow::Error::msg)?;
            let identity = again.with_trust(again.trust().clone(), now_secs())?;
            Ok((next, identity, ()))
        });
        let devices = cyphonic_daemon::Devices { socket, signals };
        cyphonic_daemon::run_on(&config, identity, edge, reload, devices)
    });
    (end, seen)
}

/// A UDP packet from `src` to `dst`, told apart by `tag` (its port).
fn udp(src: Ipv4Addr, dst: Ipv4Addr, tag: u8) -> Vec<u8> {
    udp4(src, dst, 7000 + u16::from(tag))
}

/// The status document's peer `name`, if listed.
fn peer<'a>(doc: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    doc["peers"]
        .as_array()?
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
}

fn established(doc: &serde_json::Value, name: &str) -> bool {
    peer(doc, name).and_then(|p| p["established"].as_bool()) == Some(true)
}

/// Waits until the end's edge runs.
fn wait_running(seen: &BareHost) {
    assert!(
        seen.wait_running(PATIENCE),
        "the end never started its edge"
    );
}

/// Waits until `seen` delivered `count` packets; returns them.
fn wait_delivered(seen: &BareHost, count: usize) -> Vec<Vec<u8>> {
    seen.wait_delivered(count, PATIENCE)
}

/// A first packet starts the handshake and waits for it; a packet crosses each way, whole;
/// the status documents show the keys and count the packets; a stop ends both ends
/// cleanly.
#[test]
fn two_ends_handshake_carry_packets_both_ways_and_stop() {
    let link = Link::new(1);
    let (a, b) = sides();
    let none = Reloads::default();
    let (mut end_a, seen_a) = start(&link, &a, common_of(&a, vec![peer_of(&b)]), none.clone());
    let (mut end_b, seen_b) = start(&link, &b, common_of(&b, vec![peer_of(&a)]), none);
    let doc = end_a.wait_status(PATIENCE, |_| true).expect("A runs");
    assert_eq!(doc["bare_edge"], true, "the edge's part is in the document");
    assert!(
        !established(&doc, "gw2.ovl.example"),
        "no keys before traffic"
    );
    wait_running(&seen_a);

    let there = udp(a.vip, b.vip, 1);
    assert!(seen_a.send(&there), "A takes the packet");
    assert_eq!(wait_delivered(&seen_b, 1), vec![there.clone()]);
    end_a
        .wait_status(PATIENCE, |d| established(d, "gw2.ovl.example"))
        .expect("A has keys for B");
    end_b
        .wait_status(PATIENCE, |d| established(d, "gw1.ovl.example"))
        .expect("B has keys for A");
    let back = udp(b.vip, a.vip, 2);
    assert!(seen_b.send(&back), "B takes the packet");
    assert_eq!(wait_delivered(&seen_a, 1), vec![back]);
    let counted = |d: &serde_json::Value, way: &str| {
        peer(d, "gw2.ovl.example").and_then(|p| p[way].as_u64()) == Some(1)
    };
    end_a
        .wait_status(PATIENCE, |d| {
            counted(d, "tx_packets") && counted(d, "rx_packets")
        })
        .expect("A counts one packet each way");

    end_a.stop().expect("A stops cleanly");
    end_b.stop().expect("B stops cleanly");
    assert!(
        !a.dir.path().join("status.sock").exists(),
        "A's status socket is gone"
    );
}

/// A reload applies the file's peers (one gone leaves; back, it handshakes again); a refused
/// file changes nothing.
#[test]
fn a_reload_follows_the_file_and_a_refused_file_changes_nothing() {
    let link = Link::new(2);
    let (a, b) = sides();
    let reloads = Reloads::default();
    let (end_a, seen_a) = start(
        &link,
        &a,
        common_of(&a, vec![peer_of(&b)]),
        Reloads::default(),
    );
    let (mut end_b, seen_b) = start(&link, &b, common_of(&b, vec![peer_of(&a)]), reloads.clone());
    wait_running(&seen_a);
    assert!(seen_a.send(&udp(a.vip, b.vip, 1)), "A takes the packet");
    end_b
        .wait_status(PATIENCE, |d| established(d, "gw1.ovl.example"))
        .expect("B has keys for A");
    assert_eq!(wait_delivered(&seen_b, 1).len(), 1);

    reloads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend([
            Ok(common_of(&b, Vec::new())),
            Err("a mistake in the file".into()),
            Ok(common_of(&b, vec![peer_of(&a)])),
        ]);
    end_b.reload().expect("B listens");
    end_b
        .wait_status(PATIENCE, |d| {
            d["peers"].as_array().is_some_and(Vec::is_empty)
        })
        .expect("A is no longer B's peer");
    assert_eq!(seen_b.peers(), Vec::<u32>::new(), "B's services were told");
    end_b.reload().expect("B listens");
    // The refused file was read (the next answer is the third) and B still runs, without A.
    let deadline = Instant::now() + PATIENCE;
    while reloads.lock().unwrap_or_else(PoisonError::into_inner).len() > 1
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let doc = end_b.status().expect("B answers");
    assert_eq!(doc["peers"].as_array().map(Vec::len), Some(0), "{doc}");
    end_b.reload().expect("B listens");
    end_b
        .wait_status(PATIENCE, |d| established(d, "gw1.ovl.example"))
        .expect("A is B's peer again, with keys");
    assert_eq!(seen_b.peers().len(), 1, "B's services were told");
    let again = udp(a.vip, b.vip, 3);
    assert!(seen_a.send(&again), "A takes the packet");
    assert_eq!(wait_delivered(&seen_b, 2).get(1), Some(&again));
    drop(end_a);
    end_b.stop().expect("B stops cleanly");
}

/// An end that cannot open its status socket does not start, and says why.
#[test]
fn an_end_without_its_status_socket_does_not_start() {
    let link = Link::new(3);
    let (a, _) = sides();
    let file = a.dir.path().join("a-file");
    std::fs::write(&file, "").expect("a file");
    let config = Common {
        status_socket: file.join("status.sock"),
        ..common_of(&a, Vec::new())
    };
    let (mut end, _) = start(&link, &a, config, Reloads::default());
    let err = end
        .wait_status(PATIENCE, |_| true)
        .expect_err("no status socket")
        .to_string();
    assert!(err.contains("opening the status socket"), "{err}");
}
