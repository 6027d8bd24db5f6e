//! The signal client against a real `cyphonic-cloud` on loopback (SQLite store): sessions,
//! registration, resolution with policy and the pushed Expect, endpoint probes, refused
//! certificates and names, hostile bytes, and a cloud restart.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cyphonic_cloud::{Config, Policy, Rule};
use cyphonic_crypto::{Certificate, StaticKeypair};
use cyphonic_session::Identity;
use cyphonic_signal::testing::Pki;
use cyphonic_signal::{Event, Handle, NameRecord, Resolution};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

struct Cloud {
    key: StaticKeypair,
    db: String,
    _dir: tempfile::TempDir,
}

impl Cloud {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("cloud.db").display());
        Self {
            key: StaticKeypair::generate().unwrap(),
            db,
            _dir: dir,
        }
    }

    async fn start(&self, pki: &Pki, policy: Policy, control: u16) -> cyphonic_cloud::Running {
        let config = Config {
            listen: SocketAddr::from(([127, 0, 0, 1], control)),
            probe_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            key: StaticKeypair::from_pem(&self.key.to_pem()).unwrap(),
            trust: pki.trust(),
            database: self.db.clone(),
            policy,
        };
        cyphonic_cloud::start(config).await.unwrap()
    }
}

fn client(cloud: &Cloud, at: SocketAddr, id: Arc<Identity>) -> (Handle, mpsc::Receiver<Event>) {
    cyphonic_signal::spawn(
        cyphonic_signal::Config {
            cloud: at,
            cloud_key: cloud.key.public(),
            agent: "test".into(),
        },
        id,
    )
}

/// The next event that `pick` accepts, within five seconds.
async fn next<T>(rx: &mut mpsc::Receiver<Event>, mut pick: impl FnMut(Event) -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(t) = pick(rx.recv().await.expect("events end")) {
                return t;
            }
        }
    })
    .await
    .expect("no such event within 5 s")
}

fn rec(name: &str, vip: [u8; 4]) -> NameRecord {
    NameRecord {
        name: name.into(),
        vip: Ipv4Addr::from(vip),
    }
}

async fn resolved(h: &Handle, name: &str) -> Resolution {
    // Registration is asynchronous: ask until it has landed (or five seconds passed).
    for _ in 0..50 {
        match h.resolve(name).await {
            Ok(Resolution::NotFound) | Err(_) => {
                h.cache().clear();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(r) => return r,
        }
    }
    h.resolve(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_signals_both_sides_and_probes_show_the_mapped_address() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let (h1, mut e1) = client(&cloud, running.control, gw1.clone());
    let (h2, mut e2) = client(&cloud, running.control, gw2.clone());
    next(&mut e1, |e| {
        matches!(e, Event::Connected { .. }).then_some(())
    })
    .await;

    // gw2 sends its probe from "its tunnel socket".
    let (to, frame) = next(&mut e2, |e| match e {
        Event::Probe { to, frame } => Some((to, frame)),
        _ => None,
    })
    .await;
    assert_eq!(to, running.probe);
    let tunnel = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    tunnel.send_to(&frame, to).await.unwrap();
    let observed = next(&mut e2, |e| match e {
        Event::Observed(a) => Some(a),
        _ => None,
    })
    .await;
    assert_eq!(observed, tunnel.local_addr().unwrap());

    let gw2_endpoint: SocketAddr = "198.51.100.2:51820".parse().unwrap();
    h2.register(
        vec![gw2_endpoint],
        vec![
            rec("gw2.ovl.example", [100, 64, 2, 1]),
            rec("cam.gw2.ovl.example", [100, 64, 2, 100]),
        ],
    );
    h1.register(
        vec!["198.51.100.1:51820".parse().unwrap()],
        vec![rec("gw1.ovl.example", [100, 64, 1, 1])],
    );
    let Resolution::Found { vip, peer } = resolved(&h1, "CAM.gw2.ovl.example.").await else {
        panic!("not found");
    };
    assert_eq!(vip, Ipv4Addr::new(100, 64, 2, 100));
    assert_eq!(
        Certificate::from_pem(&peer.certificate).unwrap(),
        *gw2.certificate()
    );
    assert_eq!(
        peer.endpoints,
        vec![observed, gw2_endpoint],
        "the observed address comes first"
    );
    // gw2 is told to expect gw1, with gw1's certificate and endpoints.
    let expect = next(&mut e2, |e| match e {
        Event::Expect(p) => Some(p),
        _ => None,
    })
    .await;
    assert_eq!(
        Certificate::from_pem(&expect.certificate).unwrap(),
        *gw1.certificate()
    );
    assert_eq!(
        expect.endpoints,
        vec!["198.51.100.1:51820".parse::<SocketAddr>().unwrap()]
    );
    assert_eq!(
        h1.resolve("gw1.ovl.example").await.unwrap(),
        Resolution::Own
    );
    assert_eq!(
        h1.resolve("nothing.gw2.ovl.example").await.unwrap(),
        Resolution::NotFound
    );
    // A second ask comes from the cache: the cloud counts no more resolutions.
    let asked = running.nms.stats.resolves.load(Ordering::Relaxed);
    h1.resolve("cam.gw2.ovl.example").await.unwrap();
    assert_eq!(running.nms.stats.resolves.load(Ordering::Relaxed), asked);

    // Hostile bytes: a garbage probe, a garbage handshake, a probe with an unknown token.
    let refused = running.nms.stats.refused.load(Ordering::Relaxed);
    tunnel.send_to(b"\x01\x06garbage", to).await.unwrap();
    tunnel
        .send_to(&cyphonic_control::probe_frame(&[0; 16]), to)
        .await
        .unwrap();
    let mut tcp = tokio::net::TcpStream::connect(running.control)
        .await
        .unwrap();
    tcp.write_all(&[0, 40]).await.unwrap();
    tcp.write_all(&[0x55; 40]).await.unwrap();
    let stats = &running.nms.stats;
    for _ in 0..50 {
        if stats.probes_refused.load(Ordering::Relaxed) >= 2
            && stats.refused.load(Ordering::Relaxed) > refused
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats.probes_refused.load(Ordering::Relaxed), 2);
    assert_eq!(stats.refused.load(Ordering::Relaxed), refused + 1);
    assert!(h1.is_connected() && h2.is_connected());
    running.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_outside_the_certificate_revoked_certificates_and_policy_are_refused() {
    let mut pki = Pki::new();
    let revoked = pki.identity("old.ovl.example", "100.64.9.0/24", &[]);
    pki.revoked.revoke(revoked.certificate().fingerprint());
    let cloud = Cloud::new();
    let policy = Policy {
        allow_by_default: false,
        rules: vec![Rule {
            from: "ops".into(),
            to: "*".into(),
        }],
    };
    let running = cloud.start(&pki, policy, 0).await;

    let (_hr, mut er) = client(&cloud, running.control, revoked);
    let reason = next(&mut er, |e| match e {
        Event::Refused { reason } => Some(reason),
        _ => None,
    })
    .await;
    assert!(reason.contains("revoked"), "{reason}");

    let ops = pki.identity("ops.ovl.example", "100.64.3.0/24", &["ops"]);
    let iot = pki.identity("gw2.ovl.example", "100.64.2.0/24", &["iot"]);
    let (hops, _eops) = client(&cloud, running.control, ops);
    let (hiot, mut eiot) = client(&cloud, running.control, iot);
    hops.register(vec![], vec![rec("ops.ovl.example", [100, 64, 3, 1])]);
    hiot.register(
        vec![],
        vec![
            rec("cam.gw2.ovl.example", [100, 64, 2, 100]),
            rec("cam.gw1.ovl.example", [100, 64, 2, 101]),
            rec("x.gw2.ovl.example", [100, 64, 1, 5]),
        ],
    );
    let refused = next(&mut eiot, |e| match e {
        Event::NamesRefused(r) => Some(r),
        _ => None,
    })
    .await;
    let names: Vec<&str> = refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cam.gw1.ovl.example", "x.gw2.ovl.example"]);
    // ops may reach anyone; iot may reach no one.
    assert!(matches!(
        resolved(&hops, "cam.gw2.ovl.example").await,
        Resolution::Found { .. }
    ));
    assert_eq!(resolved(&hiot, "ops.ovl.example").await, Resolution::Denied);
    assert_eq!(running.nms.stats.denied.load(Ordering::Relaxed), 1);
    // The refused names were never stored.
    assert_eq!(
        hops.resolve("cam.gw1.ovl.example").await.unwrap(),
        Resolution::NotFound
    );
    running.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_come_back_after_the_cloud_restarts_and_the_registry_survives() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let port = running.control.port();
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let (h1, mut e1) = client(&cloud, running.control, gw1);
    let (h2, _e2) = client(&cloud, running.control, gw2);
    h2.register(vec![], vec![rec("cam.gw2.ovl.example", [100, 64, 2, 100])]);
    assert!(matches!(
        resolved(&h1, "cam.gw2.ovl.example").await,
        Resolution::Found { .. }
    ));
    next(&mut e1, |e| {
        matches!(e, Event::Connected { .. }).then_some(())
    })
    .await;

    running.stop();
    next(&mut e1, |e| {
        matches!(e, Event::Disconnected { .. }).then_some(())
    })
    .await;
    assert!(matches!(
        h1.resolve("gw2.ovl.example").await,
        Err(cyphonic_signal::SignalError::NotConnected)
    ));
    // Same port, same database file: the clients reconnect by themselves (backoff starts
    // at one second, with jitter).
    let running = cloud.start(&pki, Policy::default(), port).await;
    next(&mut e1, |e| {
        matches!(e, Event::Connected { .. }).then_some(())
    })
    .await;
    assert!(matches!(
        resolved(&h1, "cam.gw2.ovl.example").await,
        Resolution::Found { .. }
    ));
    running.stop();
}
