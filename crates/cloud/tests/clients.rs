//! The signal client against a real `cyphonic-cloud` on loopback (SQLite store): sessions,
//! registration, resolution with policy and the pushed Expect, endpoint probes, refused
//! certificates and names, hostile bytes, a cloud restart, and the relay: an IPv4 client and
//! an IPv6 client paired through it, relay requests, and what the relay refuses.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cyphonic_cloud::config::RelayConfig;
use cyphonic_cloud::{CloudConfig, Policy, Rule};
use cyphonic_control::{ClientMsg, CloudMsg, MapProtocol, Mapping};
use cyphonic_crypto::{Certificate, StaticKeypair};
use cyphonic_session::Identity;
use cyphonic_signal::testing::Pki;
use cyphonic_signal::{
    Allowed, Event, Handle, NameRecord, PeerInfo, RelayInfo, RelayReason, Resolution,
};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

struct Cloud {
    key: StaticKeypair,
    db: String,
    /// `[flows]`.
    flows: cyphonic_cloud::config::FlowLogs,
    _dir: tempfile::TempDir,
}

impl Cloud {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("cloud.db").display());
        Self {
            key: StaticKeypair::generate().unwrap(),
            db,
            flows: cyphonic_cloud::config::FlowLogs::default(),
            _dir: dir,
        }
    }

    async fn start(&self, pki: &Pki, policy: Policy, control: u16) -> cyphonic_cloud::Running {
        self.start_with(
            pki,
            policy,
            SocketAddr::from(([127, 0, 0, 1], control)),
            None,
        )
        .await
    }

    async fn start_with(
        &self,
        pki: &Pki,
        policy: Policy,
        listen: SocketAddr,
        relay: Option<RelayConfig>,
    ) -> cyphonic_cloud::Running {
        let config = CloudConfig {
            listen,
            probe_listen: SocketAddr::new(listen.ip(), 0),
            probe_listen_alt: SocketAddr::new(listen.ip(), 0),
            relay,
            status_socket: self._dir.path().join("cloud.sock"),
            admin_socket: self._dir.path().join("cloud-admin.sock"),
            metrics: None,
            key: StaticKeypair::from_pem(&self.key.to_pem()).unwrap(),
            trust: pki.trust(),
            database: self.db.clone(),
            policy,
            enroll: None,
            api: None,
            audit_days: 365,
            flows: self.flows.clone(),
            api_tls: None,
            api_proxies: Vec::new(),
            api_oidc: None,
        };
        cyphonic_cloud::start(config).await.unwrap()
    }
}

fn client(cloud: &Cloud, at: SocketAddr, id: Arc<Identity>) -> (Handle, mpsc::Receiver<Event>) {
    cyphonic_signal::spawn(
        cyphonic_signal::Config {
            clouds: vec![at.to_string()],
            cloud_keys: vec![cloud.key.public()],
            agent: "test".into(),
            tunnel_port: None,
            tunnel: cyphonic_signal::TunnelVersions::OURS,
            source: None,
        },
        id,
    )
}

/// How long a test waits for an event it expects: it ends as soon as the event comes, so
/// this bounds only a failing test. Generous, for a machine busy with builds and other
/// tests (5 s was once not enough there).
const PATIENCE: Duration = Duration::from_secs(30);

/// The next event that `pick` accepts, within [`PATIENCE`].
async fn next<T>(rx: &mut mpsc::Receiver<Event>, mut pick: impl FnMut(Event) -> Option<T>) -> T {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(t) = pick(rx.recv().await.expect("events end")) {
                return t;
            }
        }
    })
    .await
    .expect("no such event within PATIENCE")
}

fn rec(name: &str, vip: [u8; 4]) -> NameRecord {
    NameRecord {
        name: name.into(),
        vip: Some(Ipv4Addr::from(vip)),
        vip6: None,
        legacy: None,
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

/// A client given a source address connects from it (the cloud sees it), and hears the
/// cloud confirm its registration with the count of names accepted; a source it cannot
/// connect from (IPv6 towards an IPv4 cloud) is a failed connection, retried, never a
/// session from another address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connects_from_its_source_and_hears_its_registration_confirmed() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let config = |source: &str| cyphonic_signal::Config {
        clouds: vec![running.control.to_string()],
        cloud_keys: vec![cloud.key.public()],
        agent: "test".into(),
        tunnel_port: None,
        tunnel: cyphonic_signal::TunnelVersions::OURS,
        source: Some(source.parse().unwrap()),
    };
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let (h1, mut e1) = cyphonic_signal::spawn(config("127.0.0.2"), gw1);
    let observed = next(&mut e1, |e| match e {
        Event::Connected { observed, .. } => Some(observed),
        _ => None,
    })
    .await;
    assert_eq!(
        observed.ip(),
        "127.0.0.2".parse::<std::net::IpAddr>().unwrap()
    );
    h1.register(
        Vec::new(),
        vec![
            rec("gw1.ovl.example", [100, 64, 1, 1]),
            rec("gw1.ovl.example", [100, 64, 1, 1]),
            rec("elsewhere.ovl.example", [100, 64, 1, 2]),
        ],
    );
    // The registration sent on connecting (no names yet) may be confirmed first, with 0.
    let accepted = next(&mut e1, |e| match e {
        Event::Registered { accepted } if accepted > 0 => Some(accepted),
        _ => None,
    })
    .await;
    assert_eq!(
        accepted, 1,
        "the duplicate is one name; the other is outside the zone"
    );

    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let (_h2, mut e2) = cyphonic_signal::spawn(config("::1"), gw2);
    let reason = next(&mut e2, |e| match e {
        Event::Connected { observed, .. } => panic!("connected from {observed}"),
        Event::Disconnected { reason } => Some(reason),
        _ => None,
    })
    .await;
    assert!(reason.contains("connect"), "{reason}");
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
    // The cloud challenges the address the probe came from; gw2 answers from there.
    let mut buf = [0u8; 256];
    let (n, from) = tokio::time::timeout(Duration::from_secs(2), tunnel.recv_from(&mut buf))
        .await
        .expect("no challenge")
        .unwrap();
    assert_eq!(from, to);
    let cookie = cyphonic_control::parse_challenge(&buf[..n]).expect("a challenge");
    // A copy of the first probe raced from another address earns a challenge there, and
    // spends nothing of gw2's.
    let racer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    h2.challenged(from, cookie);
    let (_, answer) = next(&mut e2, |e| match e {
        Event::Probe { to: t, frame } if t == to => Some((t, frame)),
        _ => None,
    })
    .await;
    racer.send_to(&answer, to).await.unwrap();
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), racer.recv_from(&mut buf))
        .await
        .expect("no challenge for the racer")
        .unwrap();
    assert!(cyphonic_control::parse_challenge(&buf[..n]).is_some());
    tunnel.send_to(&answer, to).await.unwrap();
    let frame = answer;
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
    let Resolution::Found { vip, vip6, peer } = resolved(&h1, "CAM.gw2.ovl.example.").await else {
        panic!("not found");
    };
    assert_eq!((vip, vip6), (Some(Ipv4Addr::new(100, 64, 2, 100)), None));
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

    // Hostile bytes: a garbage probe, a garbage handshake, a probe with an unknown token, a
    // copy of gw2's accepted probe (from another address: a replay), and a probe with gw2's
    // token under another key.
    let refused = running.nms.stats.refused.load(Ordering::Relaxed);
    tunnel.send_to(b"\x01\x06garbage", to).await.unwrap();
    let mut stranger = cyphonic_control::Prober::new([0; 16], [0; 16]);
    tunnel
        .send_to(&stranger.next_frame(None), to)
        .await
        .unwrap();
    let elsewhere = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    elsewhere.send_to(&frame, to).await.unwrap();
    let token = cyphonic_control::Probe::parse(&frame).unwrap().token;
    let mut forger = cyphonic_control::Prober::new(token, [0; 16]);
    for _ in 0..5 {
        elsewhere
            .send_to(&forger.next_frame(None), to)
            .await
            .unwrap();
    }
    let mut tcp = tokio::net::TcpStream::connect(running.control)
        .await
        .unwrap();
    tcp.write_all(&[0, 40]).await.unwrap();
    tcp.write_all(&[0x55; 40]).await.unwrap();
    let stats = &running.nms.stats;
    for _ in 0..50 {
        if stats.probes_refused.load(Ordering::Relaxed) >= 8
            && stats.refused.load(Ordering::Relaxed) > refused
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats.probes_refused.load(Ordering::Relaxed), 8);
    assert_eq!(
        stats.probes.load(Ordering::Relaxed),
        3,
        "only gw2's own probe, challenged, and its answer (and the racer's copy, challenged)"
    );
    assert_eq!(stats.probe_challenges.load(Ordering::Relaxed), 2);
    assert_eq!(
        h2.resolve("gw2.ovl.example").await.unwrap(),
        Resolution::Own
    );
    // The replay from elsewhere moved nothing: peers are still sent to the tunnel socket.
    h1.cache().clear();
    let Resolution::Found { peer, .. } = h1.resolve("cam.gw2.ovl.example").await.unwrap() else {
        panic!("not found");
    };
    assert_eq!(peer.endpoints[0], observed);
    assert_eq!(stats.refused.load(Ordering::Relaxed), refused + 1);

    // gw2's router maps a port for it (control version 14): at the address its probes come
    // from, peers are sent there first; elsewhere, not at all; a refusal too long for the
    // registry is left out and counted.
    let first_endpoint = async |h1: &Handle| {
        h1.cache().clear();
        match h1.resolve("cam.gw2.ovl.example").await.unwrap() {
            Resolution::Found { peer, .. } => peer.endpoints,
            other => panic!("{other:?}"),
        }
    };
    let mapped = SocketAddr::new(observed.ip(), 51999);
    let elsewhere: SocketAddr = "203.0.113.2:51999".parse().unwrap();
    for (mapping, first) in [
        (Some(mapped), mapped),
        (Some(elsewhere), observed),
        (None, observed),
    ] {
        h2.set_mapping(mapping.map(|endpoint| Mapping::Mapped {
            protocol: MapProtocol::Pcp,
            endpoint,
        }));
        let mut seen = Vec::new();
        for _ in 0..50 {
            seen = first_endpoint(&h1).await;
            if seen.first() == Some(&first) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen.first(), Some(&first), "{mapping:?}: {seen:?}");
        assert!(!seen.contains(&elsewhere), "{seen:?}");
    }
    h2.set_mapping(Some(Mapping::Refused {
        protocol: MapProtocol::Upnp,
        reason: "x".repeat(Mapping::MAX_REASON + 1),
    }));
    until_counted(&stats.mappings_refused, 1).await;
    assert_eq!(stats.mappings_refused.load(Ordering::Relaxed), 1);
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
        groups: Vec::new(),
        rules: vec![Rule {
            from: vec!["ops".into()],
            to: vec!["*".into()],
            allow: vec!["any".into()],
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

/// Control version 8 (issue 53): a name registered with an IPv6 address inside the
/// certificate's blocks resolves with it (the AAAA beside the A); one outside the blocks is
/// refused, and the name with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_names_ipv6_address_is_registered_checked_and_resolved() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let node = pki.identity("n5.ovl.example", "100.64.5.1/32 fd7a:0:1:4000::5/128", &[]);
    let (h1, _e1) = client(&cloud, running.control, gw1.clone());
    let (hn, mut en) = client(&cloud, running.control, node);
    let with6 = |name: &str, vip6: &str| NameRecord {
        vip6: Some(vip6.parse().unwrap()),
        ..rec(name, [100, 64, 5, 1])
    };
    // Beside it, a name whose IPv6 address lies outside the certificate's blocks.
    hn.register(
        vec![],
        vec![
            with6("n5.ovl.example", "fd7a:0:1:4000::5"),
            with6("bad.n5.ovl.example", "fd7a:0:1:4000::6"),
        ],
    );
    let refused = next(&mut en, |e| match e {
        Event::NamesRefused(r) => Some(r),
        _ => None,
    })
    .await;
    let names: Vec<&str> = refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["bad.n5.ovl.example"]);
    let Resolution::Found { vip6, .. } = resolved(&h1, "n5.ovl.example").await else {
        panic!("not found");
    };
    assert_eq!(vip6, Some("fd7a:0:1:4000::5".parse().unwrap()));
    assert_eq!(
        h1.resolve("bad.n5.ovl.example").await.unwrap(),
        Resolution::NotFound
    );
    // Control version 9: a device with IPv6 only registers and resolves without a vIP; a
    // name with no address at all is refused.
    let gw6 = pki.identity("gw6.ovl.example", "100.64.6.0/24 fd7a:0:1:600::/56", &[]);
    let (h6, mut e6) = client(&cloud, running.control, gw6.clone());
    let only6 = |name: &str| NameRecord {
        vip: None,
        ..with6(name, "fd7a:0:1:600::1abc")
    };
    let none = NameRecord {
        vip6: None,
        ..only6("none.gw6.ovl.example")
    };
    h6.register(
        vec![],
        vec![
            rec("gw6.ovl.example", [100, 64, 6, 1]),
            only6("thread.gw6.ovl.example"),
            none,
        ],
    );
    let refused = next(&mut e6, |e| match e {
        Event::NamesRefused(r) => Some(r),
        _ => None,
    })
    .await;
    let names: Vec<&str> = refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["none.gw6.ovl.example"]);
    let Resolution::Found { vip, vip6, .. } = resolved(&h1, "thread.gw6.ovl.example").await else {
        panic!("not found");
    };
    assert_eq!(
        (vip, vip6),
        (None, Some("fd7a:0:1:600::1abc".parse().unwrap()))
    );
    // A version-8 client does not find it, and nobody is told to expect it.
    let ask = |version| {
        running.nms.serve_message_as(
            gw1.certificate(),
            version,
            ClientMsg::Resolve {
                id: 7,
                name: "thread.gw6.ovl.example".into(),
            },
        )
    };
    assert!(matches!(
        ask(8).await,
        Some(CloudMsg::Resolved {
            resolution: Resolution::NotFound,
            ..
        })
    ));
    assert!(matches!(
        ask(9).await,
        Some(CloudMsg::Resolved {
            resolution: Resolution::Found { vip: None, .. },
            ..
        })
    ));
    // Beyond the 1,024 names a client may hold, those with IPv6 only are the ones left
    // out: a name with a vIP that sorts after all of them is kept.
    let mut many: Vec<NameRecord> = (0..1100u16)
        .map(|i| NameRecord {
            vip: None,
            vip6: Some(std::net::Ipv6Addr::new(0xfd7a, 0, 1, 0x600, 0, 0, 1, i)),
            ..rec(&format!("d{i}.gw6.ovl.example"), [0; 4])
        })
        .collect();
    many.push(rec("zz.gw6.ovl.example", [100, 64, 6, 99]));
    // (More than a frame holds: the message as the session would serve it.)
    let answer = running
        .nms
        .serve_message(
            gw6.certificate(),
            ClientMsg::Register {
                endpoints: vec![],
                names: many,
                mapping: None,
                tunnel: None,
            },
        )
        .await;
    let Some(CloudMsg::Registered { refused, .. }) = answer else {
        panic!("{answer:?}");
    };
    assert_eq!(refused.len(), 1101 - 1024);
    assert!(
        refused.iter().all(|(n, _)| n.starts_with('d')),
        "{refused:?}"
    );
    assert!(matches!(
        resolved(&h1, "zz.gw6.ovl.example").await,
        Resolution::Found { vip: Some(_), .. }
    ));
    running.stop();
}

/// The cloud compiles its per-device rules against the registry and pushes each client the
/// ones that concern it: a device that registers joins a pattern's group within seconds, a
/// reload changes the rules, `default = "allow"` takes them all back. Resolution follows the
/// direction of the rules: ops may resolve the camera, the camera's gateway not ops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_compiled_per_client_and_pushed_as_it_changes() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let policy = |allow: &[&str]| Policy {
        allow_by_default: false,
        groups: vec![cyphonic_cloud::policy::Group {
            name: "cameras".into(),
            members: v(&["cam*.gw2.ovl.example"]),
        }],
        rules: vec![Rule {
            from: v(&["ops"]),
            to: v(&["cameras"]),
            allow: v(allow),
        }],
    };
    let running = cloud.start(&pki, policy(&["tcp/554"]), 0).await;
    let ops_id = pki.identity("ops.ovl.example", "100.64.3.0/24", &["ops"]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let gw4_id = pki.identity("gw4.ovl.example", "100.64.4.0/24", &[]);
    let (hops, mut eops) = client(&cloud, running.control, ops_id.clone());
    let (h2, mut e2) = client(&cloud, running.control, gw2);
    let (_h4, mut e4) = client(&cloud, running.control, gw4_id.clone());
    let policy_event = |e: Event| match e {
        Event::Policy(set) => Some(set),
        _ => None,
    };
    // Before the camera registers, the rule names nobody: an empty set (deny all).
    let first = next(&mut eops, policy_event).await;
    assert!(
        first.as_ref().is_some_and(|s| s.rules.is_empty()),
        "{first:?}"
    );
    hops.register(vec![], vec![rec("ops.ovl.example", [100, 64, 3, 1])]);
    h2.register(vec![], vec![rec("cam1.gw2.ovl.example", [100, 64, 2, 21])]);
    let (ops_ip, cam) = (Ipv4Addr::new(100, 64, 3, 1), Ipv4Addr::new(100, 64, 2, 21));
    let with_rule = |e: Event| match e {
        Event::Policy(Some(s)) if !s.rules.is_empty() => Some(s),
        _ => None,
    };
    // (The registry is compiled again within 2 s of the registration.)
    let set = next(&mut eops, with_rule).await;
    assert_eq!(set.first_allowing(6, ops_ip, cam, 554), Some(1));
    assert_eq!(set.first_allowing(6, ops_ip, cam, 22), None);
    assert_eq!(set.first_allowing(6, cam, ops_ip, 554), None);
    let set2 = next(&mut e2, with_rule).await;
    assert_eq!(set2.first_allowing(6, ops_ip, cam, 554), Some(1));
    // gw4 is in no rule: it enforces an empty set, and is paired with nobody.
    let set4 = next(&mut e4, policy_event).await;
    assert!(set4.is_some_and(|s| s.rules.is_empty()));
    // ops resolves the camera, and is told it may open flows to gw2, which may only answer;
    // gw2 is told the mirror of that. The camera's gateway may not resolve ops.
    match resolved(&hops, "cam1.gw2.ovl.example").await {
        Resolution::Found { peer, .. } => assert_eq!(peer.allowed, Some(Allowed::Out)),
        other => panic!("{other:?}"),
    }
    let told = next(&mut e2, |e| match e {
        Event::Expect(peer) => Some(peer),
        _ => None,
    })
    .await;
    assert_eq!(told.allowed, Some(Allowed::In));
    assert_eq!(resolved(&h2, "ops.ovl.example").await, Resolution::Denied);
    // Pairing on request follows the rules either way: gw2 may be paired with ops (ops may
    // open to its camera) but not with gw4, which no rule names, by relay or by admission.
    let fp = |id: &Identity| id.certificate().fingerprint().to_string();
    let (ops_fp, gw4_fp) = (fp(&ops_id), fp(&gw4_id));
    let not_paired = |e: Event| match e {
        Event::NotPaired { peer, reason } => Some((peer, reason)),
        _ => None,
    };
    h2.admit(&gw4_fp).unwrap();
    assert_eq!(
        next(&mut e2, not_paired).await,
        (gw4_fp.clone(), "denied by policy".to_owned())
    );
    h2.request_relay(&gw4_fp).unwrap();
    assert_eq!(
        next(&mut e2, not_paired).await,
        (gw4_fp, "denied by policy".to_owned())
    );
    h2.admit(&ops_fp).unwrap();
    let expected = next(&mut e2, |e| match e {
        Event::Expect(peer) => Some(peer),
        Event::NotPaired { reason, .. } => panic!("not paired: {reason}"),
        _ => None,
    })
    .await;
    assert_eq!(expected.certificate, ops_id.certificate().to_pem());
    assert_eq!(expected.allowed, Some(Allowed::In));

    // A reload with another port: a new set, another version.
    running
        .nms
        .reload(pki.trust(), policy(&["tcp/554", "tcp/80"]))
        .await
        .unwrap();
    let again = next(&mut eops, |e| match e {
        Event::Policy(Some(s)) if s.version != set.version => Some(s),
        _ => None,
    })
    .await;
    assert_eq!(again.first_allowing(6, ops_ip, cam, 80), Some(1));
    // default = "allow": nothing is enforced any more.
    running
        .nms
        .reload(pki.trust(), Policy::default())
        .await
        .unwrap();
    next(&mut eops, |e| {
        matches!(e, Event::Policy(None)).then_some(())
    })
    .await;
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
    // Nothing enforced per device: no directions are said. The tunnel versions gw2
    // registered are said (control version 15).
    assert!(matches!(
        resolved(&h1, "cam.gw2.ovl.example").await,
        Resolution::Found {
            peer: PeerInfo {
                allowed: None,
                tunnel: Some(cyphonic_signal::TunnelVersions::OURS),
                ..
            },
            ..
        }
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

/// Control version 10 (issue 51): the serving box of an HA pair reports the pair. The
/// registry keeps it with the member and a change replaces it; a new session clears it until
/// the client reports again, which it does by itself after reconnecting (here, to a
/// restarted cloud); a malformed report, or one from a version-9 session, is answered with
/// an error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ha_pairs_report_is_kept_replaced_and_sent_again_after_a_reconnection() {
    use cyphonic_control::{Mac, PairBox, PairHealth, PairRole, PairState};
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let port = running.control.port();
    let store = cyphonic_cloud::Store::open(&cloud.db).await.unwrap();
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let fp = gw1.certificate().fingerprint().to_string();
    let state = |term, other: PairRole| PairState {
        term,
        reason: format!("term {term}\u{1b}[2J"),
        boxes: vec![
            PairBox {
                mac: Mac([2, 0, 0, 0, 0, 2]),
                role: PairRole::Active,
                priority: 100,
                // Out of order and twice: kept sorted, once.
                health: vec![PairHealth::Uplink, PairHealth::Lan, PairHealth::Lan],
                in_contact: true,
            },
            PairBox {
                mac: Mac([2, 0, 0, 0, 0, 1]),
                role: other,
                priority: 200,
                health: vec![PairHealth::Lan],
                in_contact: other == PairRole::Standby,
            },
        ],
    };
    // What the registry holds of gw1's pair while gw1 is online, once `want` says it is
    // there.
    let held = |want: fn(&Option<cyphonic_cloud::store::PairReport>) -> bool| {
        let store = store.clone();
        let fp = fp.clone();
        async move {
            tokio::time::timeout(PATIENCE, async {
                loop {
                    let online = store
                        .members()
                        .await
                        .unwrap()
                        .into_iter()
                        .find(|m| m.client.fingerprint == fp && m.client.online);
                    if let Some(m) = online
                        && want(&m.pair)
                    {
                        return m.pair;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("the registry never held the pair as expected")
        }
    };
    let (h1, mut e1) = client(&cloud, running.control, gw1.clone());
    h1.register(vec![], vec![rec("gw1.ovl.example", [100, 64, 1, 1])]);
    h1.report_pair(Some(state(3, PairRole::Standby)));
    let kept = held(Option::is_some).await.unwrap();
    assert_eq!(kept.term, 3);
    assert_eq!(kept.reason, "term 3?[2J");
    assert_eq!(kept.boxes[0].health, [PairHealth::Lan, PairHealth::Uplink]);
    assert_eq!(kept.boxes[1].role, PairRole::Standby);
    assert_eq!(running.nms.stats.pair_reports.load(Ordering::Relaxed), 1);

    // The other box went quiet: the next report replaces this one.
    h1.report_pair(Some(state(3, PairRole::Starting)));
    let kept = held(|p| p.as_ref().is_some_and(|p| !p.boxes[1].in_contact)).await;
    assert_eq!(kept.unwrap().boxes[1].role, PairRole::Starting);

    // Malformed, or from a version-9 session: an error, and the report stays as it was.
    let mut three = state(4, PairRole::Standby);
    three.boxes.push(three.boxes[0].clone());
    let mut twice = state(4, PairRole::Standby);
    twice.boxes[1].mac = twice.boxes[0].mac;
    let mut zero = state(4, PairRole::Standby);
    zero.boxes[1].priority = 0;
    let none = PairState {
        boxes: vec![],
        ..state(4, PairRole::Standby)
    };
    for (version, bad) in [
        (10, three),
        (10, twice),
        (10, zero),
        (10, none),
        (9, state(4, PairRole::Standby)),
    ] {
        let answer = running
            .nms
            .serve_message_as(gw1.certificate(), version, bad.clone().into())
            .await;
        assert!(
            matches!(answer, Some(CloudMsg::Error { .. })),
            "{bad:?} as version {version}: {answer:?}"
        );
    }
    assert_eq!(
        running
            .nms
            .stats
            .pair_reports_refused
            .load(Ordering::Relaxed),
        5
    );
    let kept = held(Option::is_some).await.unwrap();
    assert_eq!((kept.term, kept.boxes[1].role), (3, PairRole::Starting));

    // The cloud restarts: the new session starts without the report, and the client sends
    // it again by itself.
    running.stop();
    next(&mut e1, |e| {
        matches!(e, Event::Disconnected { .. }).then_some(())
    })
    .await;
    let running = cloud.start(&pki, Policy::default(), port).await;
    next(&mut e1, |e| {
        matches!(e, Event::Connected { .. }).then_some(())
    })
    .await;
    let kept = held(Option::is_some).await.unwrap();
    assert_eq!((kept.term, kept.boxes[1].role), (3, PairRole::Starting));
    assert_eq!(running.nms.stats.pair_reports.load(Ordering::Relaxed), 1);

    // A session of the same member that reports nothing (a box of a build before the
    // report, say) shows no pair: the last one is not kept beyond its session.
    drop(h1);
    let (_h2, mut e2) = client(&cloud, running.control, gw1.clone());
    next(&mut e2, |e| {
        matches!(e, Event::Connected { .. }).then_some(())
    })
    .await;
    assert_eq!(held(Option::is_none).await, None);
    running.stop();
}

/// A member's report of its devices and tunnels is kept whole (in parts), made safe to show;
/// one beyond a bound, or from a version-10 session, is refused and changes nothing; a new
/// session forgets the tunnels and keeps the devices, and the client sends its report again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_report_is_kept_and_its_tunnels_go_with_its_session() {
    use cyphonic_control::report::{MAX_TUNNELS, Report};
    use cyphonic_control::{DeviceKind, DeviceReport, Mac, RelayReason, TunnelPath, TunnelReport};
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let store = cyphonic_cloud::Store::open(&cloud.db).await.unwrap();
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let fp = gw1.certificate().fingerprint().to_string();
    let device = |i: u16| DeviceReport {
        mac: {
            let [a, b] = i.to_be_bytes();
            Mac([2, 0, 0, 0, a, b])
        },
        vip: Some(Ipv4Addr::from(0x6440_0100 + u32::from(i))),
        vip6: None,
        legacy: None,
        name: Some(format!("device-{i}.gw1.ovl.example")),
        hostname: Some(format!("printer\u{1b}[2J{i}")),
        kind: DeviceKind::Lease,
        expires: Some(1_795_000_000),
        vlan: None,
        seen: Some(1_795_000_000),
        tx_bytes: u64::MAX,
        tx_packets: 7,
        rx_bytes: 1_000,
        rx_packets: 1,
    };
    let tunnel = |i: u16| TunnelReport {
        peer: format!("{i:064x}"),
        name: format!("gw{i}.ovl.example"),
        path: TunnelPath::Relay,
        reason: Some(RelayReason::SymmetricNat),
        endpoint: Some("203.0.113.9:7003".parse().unwrap()),
        established: true,
        handshake: Some(1_795_000_000),
        tx_bytes: 10,
        rx_bytes: 20,
    };
    // 600 devices: more than one part.
    let big = Report {
        devices: (0..600).map(device).collect(),
        tunnels: vec![tunnel(2), tunnel(3)],
    };
    assert!(big.parts(cyphonic_control::VERSION).len() > 1);
    // The devices and the tunnels the registry holds of gw1 once `want` says so.
    let held = |want: fn(usize, usize) -> bool| {
        let store = store.clone();
        let fp = fp.clone();
        async move {
            tokio::time::timeout(PATIENCE, async {
                loop {
                    let devices = store.devices_page(&fp, None, 1000).await.unwrap();
                    let tunnels = store
                        .tunnels_page(Some("gw1.ovl.example"), None, 100)
                        .await
                        .unwrap();
                    if want(devices.len(), tunnels.len()) {
                        return (devices, tunnels);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("the registry never held the report as expected")
        }
    };
    let (h1, e1) = client(&cloud, running.control, gw1.clone());
    h1.register(vec![], vec![rec("gw1.ovl.example", [100, 64, 1, 1])]);
    h1.report(big.clone());
    let (devices, tunnels) = held(|d, t| d == 600 && t == 2).await;
    assert_eq!(running.nms.stats.reports.load(Ordering::Relaxed), 1);
    let first = devices.iter().find(|d| d.address == "100.64.1.0").unwrap();
    assert_eq!(first.hostname.as_deref(), Some("printer?[2J0"));
    assert_eq!(first.tx_bytes, i64::MAX as u64, "capped");
    assert_eq!((first.rx_bytes, first.kind.as_str()), (1_000, "lease"));
    assert_eq!(first.mac, "02:00:00:00:00:00");
    assert_eq!(tunnels[0].peer, "gw2.ovl.example");
    assert_eq!(tunnels[0].member, "gw1.ovl.example");
    assert_eq!(
        (tunnels[0].path.as_str(), tunnels[0].reason.as_deref()),
        ("relay", Some("symmetric_nat"))
    );
    assert_eq!(tunnels[1].peer_fingerprint, format!("{:064x}", 3));

    // Refused, and nothing changes: too many tunnels, a peer that is not a fingerprint, a
    // device without an address, a version-10 session.
    let mut bare = device(1);
    bare.vip = None;
    let mut bad_peer = tunnel(4);
    bad_peer.peer = "gw4".into();
    let too_many = (0..=u16::try_from(MAX_TUNNELS).unwrap())
        .map(tunnel)
        .collect();
    for (version, devices, tunnels) in [
        (11, vec![], too_many),
        (11, vec![], vec![bad_peer]),
        (11, vec![bare], vec![]),
        (10, vec![device(1)], vec![]),
    ] {
        let answer = running
            .nms
            .serve_message_as(
                gw1.certificate(),
                version,
                ClientMsg::Report {
                    devices,
                    tunnels,
                    more: false,
                },
            )
            .await;
        assert!(
            matches!(answer, Some(CloudMsg::Error { .. })),
            "version {version}: {answer:?}"
        );
    }
    assert_eq!(running.nms.stats.reports_refused.load(Ordering::Relaxed), 4);
    held(|d, t| d == 600 && t == 2).await;

    // The cloud stops as if its process ended (no session ends cleanly) and starts again:
    // a session of the member that reports nothing (a build before the report, say) shows
    // no tunnel; the devices stay.
    let port = running.control.port();
    running.stop();
    drop((h1, e1));
    let running = cloud.start(&pki, Policy::default(), port).await;
    let (h2, mut e2) = client(&cloud, running.control, gw1.clone());
    tokio::time::timeout(PATIENCE, async {
        while !store
            .members_named("gw1.ovl.example")
            .await
            .unwrap()
            .iter()
            .any(|m| m.client.online)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("gw1 never came online again");
    held(|d, t| d == 600 && t == 0).await;
    h2.report(Report {
        devices: vec![device(9)],
        tunnels: vec![tunnel(5)],
    });
    let (devices, tunnels) = held(|d, t| d == 1 && t == 1).await;
    assert_eq!(devices[0].address, "100.64.1.9");
    assert_eq!(tunnels[0].peer, "gw5.ovl.example");

    // The cloud restarts: the client sends its report again by itself.
    running.stop();
    next(&mut e2, |e| {
        matches!(e, Event::Disconnected { .. }).then_some(())
    })
    .await;
    let running = cloud.start(&pki, Policy::default(), port).await;
    tokio::time::timeout(PATIENCE, async {
        while running.nms.stats.reports.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the client never reported again");
    held(|d, t| d == 1 && t == 1).await;
    running.stop();
}

/// A member `[flows]` names is told to record flows (control version 12) and, under
/// `default = "allow"`, given the rule set of rule 0 that allows everything; its records are
/// kept, and what it did not send counted. A member not named, a message beyond a bound and
/// a version-11 session are refused, and nothing is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_logs_are_turned_on_kept_and_bounded() {
    use cyphonic_control::{FlowDir, FlowRecord, RefusedRecord};
    let pki = Pki::new();
    let mut cloud = Cloud::new();
    cloud.flows.members = vec!["*.sites.ovl.example".into()];
    cloud.flows.groups = vec!["loggers".into()];
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let store = cyphonic_cloud::Store::open(&cloud.db).await.unwrap();
    let gw1 = pki.identity("gw1.sites.ovl.example", "100.64.1.0/24", &[]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &["loggers"]);
    let gw3 = pki.identity("gw3.ovl.example", "100.64.3.0/24", &["cameras"]);
    for (id, logs) in [(&gw1, true), (&gw2, true), (&gw3, false)] {
        let (_h, mut events) = client(&cloud, running.control, id.clone());
        // The policy and the flow log go out before the session reads anything: both are
        // in before the registration's answer.
        let (mut told, mut set) = (None, None);
        next(&mut events, |e| match e {
            Event::FlowLog(on) => {
                told = Some(on);
                None
            }
            Event::Policy(s) => {
                set = Some(s);
                None
            }
            Event::Registered { .. } => Some(()),
            _ => None,
        })
        .await;
        if logs {
            assert_eq!(told, Some(true));
            let set = set.flatten().expect("an allow-everything rule set");
            assert_eq!(set.rules.len(), 1, "{set:?}");
            assert_eq!((set.rules[0].id, set.rules[0].from.len()), (0, 2));
        } else {
            assert_eq!(told, Some(false));
            assert_eq!(set, Some(None), "nothing enforced, nothing logged");
        }
    }
    let flow = |i: u16| FlowRecord {
        proto: 6,
        src: "100.64.1.10".parse().unwrap(),
        sport: 40000 + i,
        dst: "100.64.2.10".parse().unwrap(),
        dport: 5201,
        dir: FlowDir::Out,
        start: 1_795_000_000,
        end: 1_795_000_000 + u64::from(i),
        tx_bytes: u64::MAX,
        tx_packets: 10,
        rx_bytes: 2000,
        rx_packets: 20,
        rule: 0,
    };
    let scan = RefusedRecord {
        src: "100.64.9.9".parse().unwrap(),
        dir: FlowDir::In,
        first: 1_795_000_100,
        last: 1_795_000_160,
        packets: 10_000,
        ports: 1024,
    };
    let msg = |flows, refused| ClientMsg::Flows {
        flows,
        refused,
        unreported: 7,
    };
    let answer = running
        .nms
        .serve_message(
            gw1.certificate(),
            msg((0..3).map(flow).collect(), vec![scan.clone()]),
        )
        .await;
    assert_eq!(answer, None);
    assert_eq!(running.nms.stats.flows.load(Ordering::Relaxed), 4);
    assert_eq!(
        running.nms.stats.flows_unreported.load(Ordering::Relaxed),
        7
    );
    let all = store
        .flows_page(&cyphonic_cloud::store::FlowQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(all[0].kind, "refused", "newest first: {all:?}");
    assert_eq!((all[0].ports, all[0].tx_packets), (Some(1024), 10_000));
    assert_eq!(all[1].sport, Some(40002));
    assert_eq!(all[1].member, "gw1.sites.ovl.example");
    assert_eq!(all[1].tx_bytes, i64::MAX as u64, "capped");

    // Refused, nothing kept: a member not named, too many flows or summaries, version 11.
    for (who, version, m) in [
        (&gw3, 12, msg(vec![flow(9)], vec![])),
        (&gw1, 12, msg((0..1001).map(flow).collect(), vec![])),
        (&gw1, 12, msg(vec![], vec![scan.clone(); 1025])),
        (&gw1, 11, msg(vec![flow(9)], vec![])),
    ] {
        let answer = running
            .nms
            .serve_message_as(who.certificate(), version, m)
            .await;
        assert!(matches!(answer, Some(CloudMsg::Error { .. })), "{answer:?}");
    }
    assert_eq!(running.nms.stats.flows_refused.load(Ordering::Relaxed), 4);
    assert_eq!(running.nms.stats.flows.load(Ordering::Relaxed), 4);
    running.stop();
}

/// A client with a tunnel socket of its own on `ip` (loopback), the way an adapter runs one:
/// it sends the probes the session asks for from that socket, and registers its name.
struct Tunnel {
    handle: Handle,
    events: mpsc::Receiver<Event>,
    sock: tokio::net::UdpSocket,
    id: Arc<Identity>,
}

impl Tunnel {
    async fn new(cloud: &Cloud, at: SocketAddr, id: Arc<Identity>, ip: &str, vip: [u8; 4]) -> Self {
        let sock = tokio::net::UdpSocket::bind((ip, 0)).await.unwrap();
        let (handle, events) = cyphonic_signal::spawn(
            cyphonic_signal::Config {
                clouds: vec![at.to_string()],
                cloud_keys: vec![cloud.key.public()],
                agent: "test".into(),
                tunnel_port: Some(sock.local_addr().unwrap().port()),
                tunnel: cyphonic_signal::TunnelVersions::OURS,
                source: None,
            },
            id.clone(),
        );
        let name = id.certificate().body().name.clone();
        handle.register(vec![], vec![rec(&name, vip)]);
        let mut t = Self {
            handle,
            events,
            sock,
            id,
        };
        // Both probes go out from the tunnel socket; wait until the cloud has seen one.
        let mut probes = 0;
        t.until(|e, sock| match e {
            Event::Probe { to, frame } => {
                probes += 1;
                let _ = sock.try_send_to(&frame, to);
                None
            }
            Event::Observed(_) if probes >= 2 => Some(()),
            _ => None,
        })
        .await;
        t
    }

    /// Handles events (sending probes the session asks for, handing it the cloud's
    /// challenges as the tunnel does) until `pick` accepts one.
    async fn until<T>(
        &mut self,
        mut pick: impl FnMut(Event, &tokio::net::UdpSocket) -> Option<T>,
    ) -> T {
        let (events, sock, handle) = (&mut self.events, &self.sock, &self.handle);
        tokio::time::timeout(PATIENCE, async {
            let mut buf = [0u8; 256];
            loop {
                tokio::select! {
                    e = events.recv() => {
                        let e = e.expect("events end");
                        if let Event::Probe { to, frame } = &e {
                            let _ = sock.send_to(frame, to).await;
                        }
                        if let Some(t) = pick(e, sock) {
                            return t;
                        }
                    }
                    r = sock.recv_from(&mut buf) => {
                        if let Ok((n, from)) = r
                            && let Some(cookie) = cyphonic_control::parse_challenge(&buf[..n])
                        {
                            handle.challenged(from, cookie);
                        }
                    }
                }
            }
        })
        .await
        .expect("no such event within PATIENCE")
    }

    async fn expect(&mut self) -> PeerInfo {
        self.until(|e, _| match e {
            Event::Expect(p) => Some(p),
            _ => None,
        })
        .await
    }

    /// Binds to `relay` as the tunnel does: a bind, the channel's challenge, the answer.
    async fn bind(&self, relay: &RelayInfo) {
        bind_from(&self.sock, relay).await;
    }

    /// The next datagram within a second, if any.
    async fn recv(&self) -> Option<(Vec<u8>, SocketAddr)> {
        let mut buf = [0u8; 2048];
        let (n, from) = tokio::time::timeout(Duration::from_secs(1), self.sock.recv_from(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some((buf[..n].to_vec(), from))
    }
}

/// Binds `sock` to `relay` with its token: a bind, the channel's challenge, the answer.
async fn bind_from(sock: &tokio::net::UdpSocket, relay: &RelayInfo) {
    sock.send_to(
        &cyphonic_signal::bind_frame(&relay.token, None),
        relay.address,
    )
    .await
    .unwrap();
    let mut buf = [0u8; 256];
    let (n, from) = tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf))
        .await
        .expect("no challenge from the relay")
        .unwrap();
    assert_eq!(from, relay.address);
    let cookie = cyphonic_control::parse_challenge(&buf[..n]).expect("a challenge");
    sock.send_to(
        &cyphonic_signal::bind_frame(&relay.token, Some(&cookie)),
        relay.address,
    )
    .await
    .unwrap();
}

/// Sends `what` from `from` through `relay` and returns what `to` received, if anything.
async fn through(from: &Tunnel, relay: &RelayInfo, to: &Tunnel, what: &[u8]) -> Option<Vec<u8>> {
    // Binds travel the same path just before: give the relay a moment to take them.
    tokio::time::sleep(Duration::from_millis(50)).await;
    from.sock.send_to(what, relay.address).await.unwrap();
    to.recv().await.map(|(d, _)| d)
}

/// A cloud with its relay on `ports`, control on `listen`.
async fn with_relay(
    listen: &str,
    ports: std::ops::RangeInclusive<u16>,
) -> (Pki, Cloud, cyphonic_cloud::Running) {
    with_relay_idle(listen, ports, RelayConfig::default().idle).await
}

async fn with_relay_idle(
    listen: &str,
    ports: std::ops::RangeInclusive<u16>,
    idle: Duration,
) -> (Pki, Cloud, cyphonic_cloud::Running) {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let relay = RelayConfig {
        ports,
        idle,
        ..RelayConfig::default()
    };
    let running = cloud
        .start_with(
            &pki,
            Policy::default(),
            listen.parse().unwrap(),
            Some(relay),
        )
        .await;
    (pki, cloud, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv4_client_and_an_ipv6_client_meet_through_the_relay() {
    // One dual-stack control port; each client is given the relay's address in the IP
    // version it reached the cloud with.
    let (pki, cloud, running) = with_relay("[::]:0", 41_000..=41_099).await;
    let port = running.control.port();
    let at4 = SocketAddr::from(([127, 0, 0, 1], port));
    let at6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let a = Tunnel::new(&cloud, at4, gw1, "127.0.0.1", [100, 64, 1, 1]).await;
    let mut b = Tunnel::new(&cloud, at6, gw2, "::1", [100, 64, 2, 1]).await;

    let Resolution::Found { peer, .. } = resolved(&a.handle, "gw2.ovl.example").await else {
        panic!("not found");
    };
    let ra = peer.relay.expect("the pair shares no IP version: relayed");
    assert_eq!(ra.reason, RelayReason::NoCommonIpVersion);
    assert!(ra.address.is_ipv4(), "{ra:?}");
    let rb = b.expect().await.relay.expect("B is told the relay too");
    assert!(rb.address.is_ipv6(), "{rb:?}");
    assert_eq!(ra.address.port(), rb.address.port(), "one channel");
    assert_ne!(ra.token, rb.token);

    // Nothing passes before both sides are bound.
    a.bind(&ra).await;
    assert_eq!(through(&a, &ra, &b, b"early").await, None);
    b.bind(&rb).await;
    let got = through(&a, &ra, &b, b"from A over IPv4").await;
    assert_eq!(got.as_deref(), Some(&b"from A over IPv4"[..]));
    let got = through(&b, &rb, &a, b"from B over IPv6").await;
    assert_eq!(got.as_deref(), Some(&b"from B over IPv6"[..]));
    // To each side the relay's address is where its peer lives.
    b.sock.send_to(b"reply", rb.address).await.unwrap();
    let (_, from) = a.recv().await.unwrap();
    assert_eq!(from, ra.address);

    // No open relay: a stranger's datagrams and a bind with a forged token go nowhere.
    let trs = running.trs.clone().unwrap();
    let refused = trs.stats.refused.load(Ordering::Relaxed);
    let stranger = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    stranger.send_to(b"let me in", ra.address).await.unwrap();
    let mut forged = ra.clone();
    forged.token[0] ^= 1;
    stranger
        .send_to(
            &cyphonic_signal::bind_frame(&forged.token, None),
            ra.address,
        )
        .await
        .unwrap();
    stranger.send_to(b"now?", ra.address).await.unwrap();
    assert_eq!(b.recv().await, None);
    assert_eq!(trs.stats.refused.load(Ordering::Relaxed), refused + 3);
    // A side that moves binds again from its new address (its token, and the challenge it
    // answers there, are its proof).
    let moved = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    bind_from(&moved, &ra).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    moved.send_to(b"moved", ra.address).await.unwrap();
    assert_eq!(b.recv().await.map(|d| d.0).as_deref(), Some(&b"moved"[..]));
    assert_eq!(trs.open_channels(), 1);
    running.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_handshakes_fail_gets_a_relay_for_both_sides() {
    let (pki, cloud, running) = with_relay("127.0.0.1:0", 41_100..=41_101).await;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let gw2_fp = gw2.certificate().fingerprint().to_string();
    let mut a = Tunnel::new(&cloud, running.control, gw1, "127.0.0.1", [100, 64, 1, 1]).await;
    let mut b = Tunnel::new(&cloud, running.control, gw2, "127.0.0.1", [100, 64, 2, 1]).await;
    // Both have no NAT (their probes come from the address they registered): direct.
    let Resolution::Found { peer, .. } = resolved(&a.handle, "gw2.ovl.example").await else {
        panic!("not found");
    };
    assert_eq!(peer.relay, None);
    assert_eq!(b.expect().await.relay, None);

    // A's handshakes go unanswered: it asks for the relay; both are told.
    a.handle.request_relay(&gw2_fp).unwrap();
    let ra = a.expect().await.relay.expect("A relayed");
    let rb = b.expect().await.relay.expect("B relayed");
    assert_eq!(ra.reason, RelayReason::NoDirectHandshake);
    assert_eq!(ra.address, rb.address);
    a.bind(&ra).await;
    b.bind(&rb).await;
    assert_eq!(
        through(&a, &ra, &b, b"relayed").await.as_deref(),
        Some(&b"relayed"[..])
    );
    // B asking too gets the same channel, not a second one.
    b.handle
        .request_relay(&a.id.certificate().fingerprint().to_string())
        .unwrap();
    let again = b.expect().await.relay.unwrap();
    assert_eq!(again, rb);
    assert_eq!(running.trs.as_ref().unwrap().open_channels(), 1);

    // A peer nobody knows: refused, with the reason.
    a.handle.request_relay(&"00".repeat(32)).unwrap();
    let reason = a
        .until(|e, _| match e {
            Event::NotPaired { reason, .. } => Some(reason),
            _ => None,
        })
        .await;
    assert_eq!(reason, "unknown peer");
    running.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_channel_closes_and_frees_its_port() {
    let (pki, cloud, running) =
        with_relay_idle("127.0.0.1:0", 41_110..=41_119, Duration::from_millis(400)).await;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let gw2 = pki.identity("gw2.ovl.example", "100.64.2.0/24", &[]);
    let gw2_fp = gw2.certificate().fingerprint().to_string();
    let mut a = Tunnel::new(&cloud, running.control, gw1, "127.0.0.1", [100, 64, 1, 1]).await;
    let _b = Tunnel::new(&cloud, running.control, gw2, "127.0.0.1", [100, 64, 2, 1]).await;
    a.handle.request_relay(&gw2_fp).unwrap();
    let r = a.expect().await.relay.unwrap();
    let trs = running.trs.clone().unwrap();
    assert_eq!(trs.open_channels(), 1);
    for _ in 0..30 {
        if trs.open_channels() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(trs.open_channels(), 0, "the idle channel is still open");
    // Its port is free again.
    tokio::net::UdpSocket::bind(r.address).await.unwrap();
    running.stop();
}

/// A control client driven by hand, frame by frame, the way an attacker (or a stalled client)
/// would: it can keep its first frame to replay it, stop after the welcome, flood requests.
struct Manual {
    rd: tokio::net::tcp::OwnedReadHalf,
    wr: tokio::net::tcp::OwnedWriteHalf,
}

impl Manual {
    /// A TCP connection to `at` from `source` (a loopback address), no bytes sent yet.
    async fn connect(at: SocketAddr, source: [u8; 4]) -> Self {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from((source, 0))).unwrap();
        let (rd, wr) = sock.connect(at).await.unwrap().into_split();
        Self { rd, wr }
    }

    /// The first frame of a handshake as `id`, with `timestamp`.
    fn hello(
        cloud: &Cloud,
        id: &Identity,
        timestamp: u64,
    ) -> (cyphonic_control::ClientHandshake, Vec<u8>) {
        let hello = cyphonic_control::Hello {
            version: cyphonic_control::VERSION,
            timestamp,
            certificate: id.certificate().to_pem(),
            enroll: None,
            agent: "manual".into(),
        };
        cyphonic_control::ClientHandshake::start(id.keypair(), &cloud.key.public(), &hello).unwrap()
    }

    /// A proven session as `id` from `source`, its first frame kept.
    async fn session(
        cloud: &Cloud,
        at: SocketAddr,
        source: [u8; 4],
        id: &Identity,
        timestamp: u64,
    ) -> (Self, cyphonic_control::Channel, Vec<u8>) {
        let mut c = Self::connect(at, source).await;
        let (hs, first) = Self::hello(cloud, id, timestamp);
        let mut ch = c.open(hs, &first).await;
        assert!(c.alive(&mut ch).await);
        (c, ch, first)
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.wr.write_all(bytes).await.unwrap();
    }

    /// The next frame (without its prefix), or `None` when the cloud closed the connection;
    /// within five seconds.
    async fn frame(&mut self) -> Option<Vec<u8>> {
        self.frame_within(Duration::from_secs(5)).await
    }

    /// The same, within `limit` (longer than the cloud's own 5-s handshake timeout, when that
    /// is what is waited for).
    async fn frame_within(&mut self, limit: Duration) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt as _;
        tokio::time::timeout(limit, async {
            let mut prefix = [0u8; 2];
            self.rd.read_exact(&mut prefix).await.ok()?;
            let mut buf = vec![0; usize::from(u16::from_be_bytes(prefix))];
            self.rd.read_exact(&mut buf).await.ok()?;
            Some(buf)
        })
        .await
        .expect("the cloud neither answered nor closed in time")
    }

    /// Handshakes with `first` and reads the welcome: the open channel.
    async fn open(
        &mut self,
        hs: cyphonic_control::ClientHandshake,
        first: &[u8],
    ) -> cyphonic_control::Channel {
        self.write(first).await;
        let answer = self.frame().await.expect("a welcome");
        let (ch, welcome) = hs.finish(&answer).unwrap();
        assert!(matches!(
            welcome,
            cyphonic_control::Welcome::Accepted { .. }
        ));
        ch
    }

    async fn send(&mut self, ch: &mut cyphonic_control::Channel, msg: &ClientMsg) {
        let frame = ch.seal(msg).unwrap();
        self.write(&frame).await;
    }

    async fn recv(&mut self, ch: &mut cyphonic_control::Channel) -> Option<CloudMsg> {
        let f = self.frame().await?;
        Some(ch.open(&f).unwrap())
    }

    /// Pings and waits for the pong (skipping pushes): the session is alive.
    async fn alive(&mut self, ch: &mut cyphonic_control::Channel) -> bool {
        self.send(ch, &ClientMsg::Ping {}).await;
        while let Some(m) = self.recv(ch).await {
            if m == (CloudMsg::Pong {}) {
                return true;
            }
        }
        false
    }
}

async fn until_counted(c: &std::sync::atomic::AtomicU64, at_least: u64) -> u64 {
    for _ in 0..100 {
        if c.load(Ordering::Relaxed) >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_or_unproven_handshake_neither_replaces_nor_disconnects_the_client() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let stats = &running.nms.stats;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);

    // The real client's session, its first frame captured on the way.
    let (mut real, mut ch, captured) =
        Manual::session(&cloud, running.control, [127, 0, 0, 1], &gw1, 1_000).await;
    assert_eq!(stats.sessions.load(Ordering::Relaxed), 1);

    // The attacker replays the captured frame. Its timestamp is not fresh: a replay, or the
    // client's clock went back (issue 49, finding 5), which only the proof tells apart. It
    // gets the welcome, sealed to the handshake's ephemeral key (which it does not hold),
    // replaces nothing, and is closed for want of proof, counted as a replay; the real
    // session goes on.
    let mut replay = Manual::connect(running.control, [127, 0, 0, 2]).await;
    replay.write(&captured).await;
    assert!(replay.frame().await.is_some(), "the sealed welcome");
    assert!(
        real.alive(&mut ch).await,
        "the real session survives the replay"
    );
    assert_eq!(
        replay.frame_within(Duration::from_secs(10)).await,
        None,
        "closed for want of proof"
    );
    assert_eq!(until_counted(&stats.replays, 1).await, 1);
    assert_eq!(
        stats.unproven.load(Ordering::Relaxed),
        0,
        "a replay, not a stall"
    );
    assert!(real.alive(&mut ch).await);

    // A fresh handshake of the same identity that never proves itself (a stalled client, or
    // a replay of a first frame the cloud never saw): welcomed, but it replaces nothing and
    // is closed when no first message comes.
    let mut stalled = Manual::connect(running.control, [127, 0, 0, 3]).await;
    let (hs, first) = Manual::hello(&cloud, &gw1, 2_000);
    let _unused = stalled.open(hs, &first).await;
    assert!(
        real.alive(&mut ch).await,
        "an unproven session replaces nothing"
    );
    assert_eq!(
        stalled.frame_within(Duration::from_secs(10)).await,
        None,
        "closed for want of proof"
    );
    assert_eq!(until_counted(&stats.unproven, 1).await, 1);
    assert!(real.alive(&mut ch).await);
    assert_eq!(stats.sessions.load(Ordering::Relaxed), 1);

    // The genuine client reconnecting (a newer timestamp, and it proves itself) replaces the
    // old session.
    let (mut again, mut ch2, first) =
        Manual::session(&cloud, running.control, [127, 0, 0, 1], &gw1, 3_000).await;
    assert_eq!(real.frame().await, None, "the older session is replaced");
    assert_eq!(stats.sessions.load(Ordering::Relaxed), 2);
    // Its older frames stay replays.
    let mut replay = Manual::connect(running.control, [127, 0, 0, 2]).await;
    replay.write(&first).await;
    assert!(replay.frame().await.is_some(), "the sealed welcome");
    assert_eq!(replay.frame_within(Duration::from_secs(10)).await, None);
    assert_eq!(until_counted(&stats.replays, 2).await, 2);
    assert!(again.alive(&mut ch2).await);
    assert_eq!(stats.clock_went_back.load(Ordering::Relaxed), 0);

    // The genuine client restarting with its clock behind (a Pi before NTP: a timestamp
    // older than its last session's) proves itself: admitted at once, replacing its old
    // session (before, it was refused as a replay for up to 10 minutes).
    let (mut behind, mut ch3, _) =
        Manual::session(&cloud, running.control, [127, 0, 0, 1], &gw1, 2_500).await;
    assert_eq!(again.frame().await, None, "the older session is replaced");
    assert_eq!(stats.clock_went_back.load(Ordering::Relaxed), 1);
    assert_eq!(stats.sessions.load(Ordering::Relaxed), 3);
    assert!(behind.alive(&mut ch3).await);
    assert_eq!(stats.replays.load(Ordering::Relaxed), 2);
    running.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unproven_connections_are_capped_and_oversize_first_frames_closed() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let stats = &running.nms.stats;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);

    // Eight silent connections from one source hold its share; the ninth is closed at once.
    let mut idle = Vec::new();
    for _ in 0..cyphonic_cloud::guard::MAX_UNPROVEN_PER_SOURCE {
        idle.push(Manual::connect(running.control, [127, 0, 0, 5]).await);
    }
    let mut ninth = Manual::connect(running.control, [127, 0, 0, 5]).await;
    assert_eq!(ninth.frame().await, None);
    assert_eq!(until_counted(&stats.connections_refused, 1).await, 1);
    // A client from another source is served meanwhile.
    let (_real, _ch, _) = Manual::session(&cloud, running.control, [127, 0, 0, 1], &gw1, 1).await;

    // A first frame announced above the limit: closed before its body is read.
    let refused = stats.refused.load(Ordering::Relaxed);
    let mut big = Manual::connect(running.control, [127, 0, 0, 6]).await;
    let len = u16::try_from(cyphonic_control::channel::MAX_HELLO_FRAME + 1).unwrap();
    big.write(&len.to_be_bytes()).await;
    assert_eq!(big.frame().await, None);
    assert_eq!(
        until_counted(&stats.refused, refused + 1).await,
        refused + 1
    );

    // The silent ones are closed by the handshake timeout and the source is served again.
    for c in &mut idle {
        assert_eq!(c.frame_within(Duration::from_secs(10)).await, None);
    }
    let (_later, _ch2, _) = Manual::session(&cloud, running.control, [127, 0, 0, 5], &gw1, 2).await;
    running.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_request_rate_waits_and_loses_nothing() {
    let pki = Pki::new();
    let cloud = Cloud::new();
    let running = cloud.start(&pki, Policy::default(), 0).await;
    let gw1 = pki.identity("gw1.ovl.example", "100.64.1.0/24", &[]);
    let (mut c, mut ch, _) =
        Manual::session(&cloud, running.control, [127, 0, 0, 1], &gw1, 1).await;
    // 150 resolutions at once: the burst (100) is served at once, the rest at 50/s; every one
    // is answered, in order.
    let n: u64 = 150;
    for id in 1..=n {
        let msg = ClientMsg::Resolve {
            id,
            name: format!("n{id}.ovl.example"),
        };
        c.send(&mut ch, &msg).await;
    }
    let mut ids = Vec::new();
    while ids.len() < 150 {
        match c.recv(&mut ch).await.expect("answers") {
            CloudMsg::Resolved { id, resolution, .. } => {
                assert_eq!(resolution, Resolution::NotFound);
                ids.push(id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ids, (1..=n).collect::<Vec<_>>());
    assert!(running.nms.stats.throttled.load(Ordering::Relaxed) >= 1);
    assert!(c.alive(&mut ch).await);
    running.stop();
}
