//! Per-device policy with the real binaries (issue "Policy per device"), from the adapters'
//! own files (`[policy]`, static peers): one-way rules, rules that name single devices,
//! rules changed by SIGHUP while flows run, a full flow table. See e2e/src/bed.rs for the
//! topology: site A's host is 100.64.1.10, site B's 100.64.2.10.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cyphonic_e2e::bed::{BedOptions, IperfRun, Ping, Side, TwoSites};
use cyphonic_e2e::hosts::Bins;
use cyphonic_e2e::pair::PairBed;
use cyphonic_e2e::{Netns, inject, uint, wait_until};
use serde_json::Value;

/// A TCP service inside a namespace that accepts every connection and counts the bytes it
/// reads; it stops when dropped (or after a minute at most).
struct Sink {
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Sink {
    fn start(ns: &Netns, at: SocketAddr) -> Self {
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (bytes.clone(), stop.clone());
        let (ready_tx, ready) = std::sync::mpsc::channel();
        drop(inject::spawn_inside(ns, move || {
            let listener = TcpListener::bind(at)?;
            listener.set_nonblocking(true)?;
            let _ = ready_tx.send(());
            let end = Instant::now() + Duration::from_secs(60);
            let mut conns: Vec<TcpStream> = Vec::new();
            let mut buf = [0u8; 4096];
            while !s.load(Ordering::Relaxed) && Instant::now() < end {
                if let Ok((c, _)) = listener.accept() {
                    c.set_nonblocking(true)?;
                    conns.push(c);
                }
                conns.retain_mut(|c| match c.read(&mut buf) {
                    Ok(0) => false,
                    Ok(n) => {
                        b.fetch_add(n as u64, Ordering::Relaxed);
                        true
                    }
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                });
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        }));
        ready
            .recv_timeout(Duration::from_secs(5))
            .expect("the sink did not start");
        Self { bytes, stop }
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Whether a TCP connection from `ns` to `to` opens within 2 s.
fn connects(ns: &Netns, to: SocketAddr) -> bool {
    inject::inside(ns, move || {
        Ok(TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok())
    })
    .unwrap()
}

/// Counts the datagrams that reach `at` inside `ns` within `within` (on a thread).
fn count_udp(
    ns: &Netns,
    at: SocketAddr,
    within: Duration,
) -> std::thread::JoinHandle<anyhow::Result<u64>> {
    inject::spawn_inside(ns, move || {
        let sock = std::net::UdpSocket::bind(at)?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let end = Instant::now() + within;
        let (mut got, mut buf) = (0, [0u8; 2048]);
        while Instant::now() < end {
            if sock.recv(&mut buf).is_ok() {
                got += 1;
            }
        }
        Ok(got)
    })
}

/// Whether any of three pings from a site's host to `to` is answered (1 s each).
fn pings(bed: &TwoSites, from: Side, to: Ipv4Addr) -> bool {
    let out = bed
        .ping(from, to, &["-c", "3", "-i", "0.2", "-W", "1"])
        .unwrap();
    out.status.success()
}

/// A site's `[policy]` status table.
fn policy(bed: &TwoSites, side: Side) -> Value {
    bed.status(side).unwrap()["policy"].clone()
}

/// `[policy]` with one rule per `(from, to, allow)`.
fn rules(flows: Option<u32>, rules: &[(&str, &str, &[&str])]) -> String {
    let mut text = String::from("\n[policy]\n");
    if let Some(f) = flows {
        text.push_str(&format!("flows = {f}\n"));
    }
    for (from, to, allow) in rules {
        let allow: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
        text.push_str(&format!(
            "\n[[policy.rule]]\nfrom = [\"{from}\"]\nto = [\"{to}\"]\nallow = [{}]\n",
            allow.join(", ")
        ));
    }
    text
}

/// Rewrites a site's file as the bed wrote it with `extra` appended, sends SIGHUP and waits
/// until the log says it was reloaded (`count` reloads so far).
fn reload(bed: &TwoSites, side: Side, base: &str, extra: &str, count: usize) {
    std::fs::write(bed.site_ref(side).config(), format!("{base}{extra}")).unwrap();
    let log = bed
        .reload(side, count)
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(!log.contains("the running one stays"), "refused:\n{log}");
}

/// Issue 51: site A is an HA pair under a one-way rule (A may open tcp/5201 and ping to B).
/// A stream A opened, with B sending (iperf3 -R), lives through the serving box's kill: the
/// new active takes the connection up from A's side as its packets come (no flow table
/// moves between the boxes), and B's data flows again; a connection B tries to open to A is
/// refused before the failover and after it.
#[test]
fn a_flow_allowed_before_a_failover_flows_after_it_and_a_refused_one_stays_refused() {
    let extra = rules(
        None,
        &[("gw1.ovl.example", "gw2.ovl.example", &["tcp/5201", "icmp"])],
    );
    let mut pair = PairBed::up_configured(true, &extra).unwrap();
    let a = pair.bed.a.host_ip;
    let _a22 = Sink::start(&pair.bed.a.lan, (a, 22).into());
    assert!(
        !connects(&pair.bed.b.lan, (a, 22).into()),
        "B opened tcp/22 to A"
    );
    let stream = IperfRun::start(&pair.bed, Side::B, &["-R", "-b", "20M"], 8).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    pair.bed.stop(Side::A, "KILL").unwrap();
    let report = stream
        .finish()
        .unwrap_or_else(|e| panic!("the stream died: {e}\n{}", pair.logs()));
    // A receives (-R): its last intervals, after the kill, carried B's data.
    let intervals = report["intervals"].as_array().unwrap();
    let late: Vec<f64> = intervals[intervals.len() - 3..]
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap())
        .collect();
    assert!(
        late.iter().all(|bps| *bps > 1e6),
        "B's data stopped after the failover: {late:?} bit/s\n{}",
        pair.logs()
    );
    let second = |pair: &PairBed| pair.second_status().unwrap()["policy"].clone();
    let p = second(&pair);
    assert_eq!(pair.second_status().unwrap()["ha"]["role"], "active");
    assert!(uint(&p["picked_up"]) >= 1, "taken up from A's side: {p}");
    let refused_before = uint(&p["dropped_in"]["no_rule"]);
    assert!(
        !connects(&pair.bed.b.lan, (a, 22).into()),
        "B opened tcp/22 to A after the failover"
    );
    let p = second(&pair);
    assert!(
        uint(&p["dropped_in"]["no_rule"]) > refused_before,
        "refused where it arrived: {p}"
    );
    pair.device.stop().unwrap();
}

/// ops (site A) may open tcp/22 and ping to iot (site B); replies flow. iot opens nothing
/// to ops: with B enforcing nothing (a misbehaving member), A drops it where it arrives and
/// counts it; once B has the same rules, B drops it before sealing and A sees nothing more.
#[test]
fn one_way_rules_let_ops_open_and_iot_only_answer() {
    let mut opts = BedOptions::default();
    opts.a.extra = rules(
        None,
        &[("gw1.ovl.example", "gw2.ovl.example", &["tcp/22", "icmp"])],
    );
    let bed = TwoSites::up(&opts).unwrap();
    let (a, b) = (bed.a.host_ip, bed.b.host_ip);
    let _b22 = Sink::start(&bed.b.lan, (b, 22).into());
    let _b23 = Sink::start(&bed.b.lan, (b, 23).into());
    let _a22 = Sink::start(&bed.a.lan, (a, 22).into());

    bed.ping_ok(&bed.a.lan, b, Ping::count(3).wait(3));
    assert!(connects(&bed.a.lan, (b, 22).into()), "{}", bed.logs());
    assert!(
        !connects(&bed.a.lan, (b, 23).into()),
        "tcp/23 is not allowed"
    );
    assert!(!pings(&bed, Side::B, a), "iot pinged ops");
    assert!(
        !connects(&bed.b.lan, (a, 22).into()),
        "iot opened tcp/22 to ops"
    );
    // What nothing answers shows where it ends: at A, before ops' host.
    let heard = count_udp(&bed.a.lan, (a, 9999).into(), Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(200));
    inject::send_udp(
        &bed.b.lan,
        (b, 0).into(),
        (a, 9999).into(),
        vec![vec![1; 100]; 5],
    )
    .unwrap();
    assert_eq!(
        inject::joined(heard).unwrap(),
        0,
        "iot's datagrams reached ops"
    );

    let p = policy(&bed, Side::A);
    // Three pings, at least one SYN and five datagrams from B, dropped where they arrived.
    assert!(uint(&p["dropped_in"]["no_rule"]) >= 9, "{p}");
    // The SYN to port 23 (and its retry), dropped before sealing.
    assert!(
        uint(&p["dropped"]["no_rule"]) > uint(&p["dropped_in"]["no_rule"]),
        "{p}"
    );
    assert!(uint(&p["opened_by_rule"]["1"]) >= 2, "ping and ssh: {p}");
    assert!(uint(&p["flows"]) >= 1, "{p}");
    assert!(
        bed.counter(Side::A, "drop_policy").unwrap() >= 5,
        "the engine's counter"
    );
    assert!(policy(&bed, Side::B).is_null(), "B enforces nothing yet");
    assert!(
        bed.a
            .log_text()
            .contains("policy dropped a packet (a sample)"),
        "a sample is logged"
    );

    // B takes the same rules: its hosts' attempts end at B now.
    let base_b = std::fs::read_to_string(bed.b.config()).unwrap();
    let same = rules(
        None,
        &[("gw1.ovl.example", "gw2.ovl.example", &["tcp/22", "icmp"])],
    );
    reload(&bed, Side::B, &base_b, &same, 1);
    let before = uint(&policy(&bed, Side::A)["dropped_in"]["no_rule"]);
    assert!(!pings(&bed, Side::B, a));
    let pb = policy(&bed, Side::B);
    assert!(
        uint(&pb["dropped"]["no_rule"]) >= 3 && uint(&pb["dropped_in"]["no_rule"]) == 0,
        "B drops its own hosts' pings before sealing: {pb}"
    );
    assert_eq!(
        uint(&policy(&bed, Side::A)["dropped_in"]["no_rule"]),
        before,
        "nothing reached A"
    );
    // ops still reaches iot, through both ends' rules.
    bed.ping_ok(&bed.a.lan, b, Ping::count(3).wait(3));
    assert!(connects(&bed.a.lan, (b, 22).into()));
}

/// Two cameras behind the same adapter, in different groups (their reservations'): camera1
/// may reach the NVR (site B's host) on tcp/554 and nothing else; camera2 may not. The dry
/// run says the same, naming the rule.
#[test]
fn a_rule_names_single_devices_behind_one_adapter() {
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    let mut bed = TwoSites::new(&opts).unwrap();
    let mut cams = Vec::new();
    for (label, ip) in [("cam1", "100.64.1.21"), ("cam2", "100.64.1.22")] {
        let (ns, mac) = bed.add_host(Side::A, label).unwrap();
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])
            .unwrap();
        ns.ip(&["route", "add", "default", "via", "100.64.1.1"])
            .unwrap();
        cams.push((ns, mac));
    }
    let nvr = bed.b.host_ip;
    opts.a.extra = format!(
        "\n[[reservation]]\nmac = \"{}\"\nvip = \"100.64.1.21\"\nhostname = \"camera1\"\ngroups = [\"cameras\"]\n\n[[reservation]]\nmac = \"{}\"\nvip = \"100.64.1.22\"\nhostname = \"camera2\"\ngroups = [\"doorbells\"]\n\n[policy]\n\n[[policy.group]]\nname = \"nvr\"\nmembers = [\"{nvr}\"]\n\n[[policy.rule]]\nfrom = [\"cameras\"]\nto = [\"nvr\"]\nallow = [\"tcp/554\"]\n",
        cams[0].1, cams[1].1
    );
    // The NVR's site lets in what camera1 opens to its host, and nothing else.
    opts.b.extra = rules(None, &[("100.64.1.21", "host", &["tcp/554"])]);
    bed.write_config(Side::A, &opts).unwrap();
    bed.write_config(Side::B, &opts).unwrap();
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let _rtsp = Sink::start(&bed.b.lan, (nvr, 554).into());
    let _web = Sink::start(&bed.b.lan, (nvr, 80).into());

    let (cam1, cam2) = (&cams[0].0, &cams[1].0);
    assert!(connects(cam1, (nvr, 554).into()), "{}", bed.logs());
    assert!(!connects(cam1, (nvr, 80).into()), "camera1 reached port 80");
    assert!(
        !connects(cam2, (nvr, 554).into()),
        "camera2 reached the NVR"
    );
    let ping = cam1
        .exec_output(
            "ping",
            &["-c", "2", "-i", "0.2", "-W", "1", &nvr.to_string()],
        )
        .unwrap();
    assert!(!ping.status.success(), "camera1 pinged the NVR");
    let p = policy(&bed, Side::A);
    assert!(uint(&p["opened_by_rule"]["1"]) >= 1, "{p}");
    assert!(uint(&p["dropped"]["no_rule"]) >= 4, "{p}");
    assert_eq!(
        uint(&policy(&bed, Side::B)["dropped_in"]["no_rule"]),
        0,
        "A stopped all of it before sealing"
    );

    // The dry run, from A's file: 0 allowed, 1 denied, 2 no answer; the same in JSON.
    let ask = |from: &str, what: &str, json: bool| {
        let out = std::process::Command::new(&bed.bins.adapter)
            .args(["policy", "--config", bed.a.config().to_str().unwrap()])
            .args(json.then_some("--json"))
            .args([from, "nvr", what])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, said) = ask("camera1", "tcp/554", false);
    assert!(code == Some(0) && said.contains("by rule 1"), "{said}");
    let (code, said) = ask("camera2", "tcp/554", false);
    assert!(code == Some(1) && said.starts_with("denied"), "{said}");
    let (code, _) = ask("camera1", "tcp/80", false);
    assert_eq!(code, Some(1));
    let (code, said) = ask("nobody", "tcp/554", false);
    assert_eq!((code, said.as_str()), (Some(2), ""));
    let (code, said) = ask("camera2", "tcp/554", true);
    let said: Value = serde_json::from_str(&said).unwrap();
    assert_eq!(
        (code, &said["allowed"]),
        (Some(1), &Value::Bool(false)),
        "{said}"
    );
}

/// A rule removed by SIGHUP while a TCP flow runs cuts it within seconds (nothing more
/// arrives, a new connection fails); added back, new connections pass again; the adapter
/// is never restarted.
#[test]
fn rules_changed_by_reload_cut_and_open_flows_without_a_restart() {
    let with_tcp = rules(
        None,
        &[("gw1.ovl.example", "gw2.ovl.example", &["tcp/7000", "icmp"])],
    );
    let without = rules(None, &[("gw1.ovl.example", "gw2.ovl.example", &["icmp"])]);
    let mut opts = BedOptions::default();
    opts.a.extra = with_tcp.clone();
    let bed = TwoSites::up(&opts).unwrap();
    let base_a = std::fs::read_to_string(bed.a.config())
        .unwrap()
        .replace(&with_tcp, "");
    let pid = bed.a.adapter.as_ref().unwrap().pid();
    let b = bed.b.host_ip;
    let sink = Sink::start(&bed.b.lan, (b, 7000).into());

    // A stream of 1 KB every 50 ms for 12 s at most.
    let streaming = inject::spawn_inside(&bed.a.lan, move || {
        let mut s = TcpStream::connect_timeout(&(b, 7000).into(), Duration::from_secs(3))?;
        s.set_write_timeout(Some(Duration::from_millis(500)))?;
        let end = Instant::now() + Duration::from_secs(12);
        while Instant::now() < end {
            let _ = s.write_all(&[7u8; 1000]);
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    });
    wait_until(Duration::from_secs(5), "the stream to flow", || {
        sink.bytes() >= 10_000
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));

    reload(&bed, Side::A, &base_a, &without, 1);
    std::thread::sleep(Duration::from_secs(1));
    let at_cut = sink.bytes();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        sink.bytes(),
        at_cut,
        "the stream still flows after its rule went"
    );
    let p = policy(&bed, Side::A);
    assert!(uint(&p["cut"]) >= 1, "{p}");
    assert!(!connects(&bed.a.lan, (b, 7000).into()));
    bed.ping_ok(&bed.a.lan, b, Ping::count(2).wait(3));

    reload(&bed, Side::A, &base_a, &with_tcp, 2);
    let started = Instant::now();
    assert!(connects(&bed.a.lan, (b, 7000).into()), "{}", bed.logs());
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(bed.a.adapter.as_ref().unwrap().pid(), pid, "no restart");
    inject::joined(streaming).unwrap();
}

/// Many short flows against a small table: it never holds more than its size, the oldest
/// flows make room and are counted, and the tunnel carries on.
#[test]
fn a_full_flow_table_evicts_the_oldest_and_counts() {
    let mut opts = BedOptions::default();
    opts.a.extra = rules(
        Some(32),
        &[(
            "gw1.ovl.example",
            "gw2.ovl.example",
            &["udp/1000-1999", "icmp"],
        )],
    );
    let bed = TwoSites::up(&opts).unwrap();
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
    let (a, b) = (bed.a.host_ip, bed.b.host_ip);
    // 300 flows: one datagram each to a port of its own.
    inject::inside(&bed.a.lan, move || {
        let sock = std::net::UdpSocket::bind(SocketAddr::from((a, 0)))?;
        for port in 1000..1300u16 {
            let _ = sock.send_to(b"x", SocketAddr::from((b, port)));
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    })
    .unwrap();
    let p = policy(&bed, Side::A);
    assert_eq!(uint(&p["capacity"]), 32, "{p}");
    assert!(uint(&p["flows"]) <= 32, "{p}");
    assert!(uint(&p["opened"]) >= 300, "{p}");
    assert!(uint(&p["evicted"]) >= 300 - 32, "{p}");
    bed.ping_ok(&bed.a.lan, b, Ping::count(2).wait(3));
}

/// `[policy]` in the cloud's file with `default = "deny"`.
fn cloud_policy(allow: &[&str]) -> String {
    let allow: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[policy]\ndefault = \"deny\"\n\n[[policy.rule]]\nfrom = \"host.gw1.ovl.example\"\nto = \"host.gw2.ovl.example\"\nallow = [{}]\n",
        allow.join(", ")
    )
}

/// Waits until a site enforces a policy whose version differs from `not` with at least
/// `rules` rules (the cloud's and the site's own rule 0, DNS, two); returns its version.
fn wait_policy(bed: &TwoSites, side: Side, not: Option<u64>, rules: u64, what: &str) -> u64 {
    let mut version = None;
    wait_until(Duration::from_secs(10), what, || {
        let p = policy(bed, side);
        version = p["version"].as_u64().filter(|v| Some(*v) != not);
        version.is_some() && uint(&p["rules"]) >= rules
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    version.unwrap_or_default()
}

/// The cloud compiles its rules per adapter and pushes them; the adapters enforce them both
/// ways (one-way: A's host may open tcp/7000 and ping to B's, B's may not even resolve A's
/// name); with the cloud stopped, and across an adapter's restart without it, the rules
/// stay as last pushed; a rule the cloud's reload removes cuts the flow within seconds.
#[test]
fn the_clouds_rules_are_pushed_enforced_and_kept_through_its_outage() {
    let mut bed = TwoSites::up(&BedOptions {
        cloud: Some(cyphonic_e2e::bed::CloudOptions {
            extra: cloud_policy(&["tcp/7000", "icmp"]),
            ..Default::default()
        }),
        ..BedOptions::default()
    })
    .unwrap();
    let (a, b) = (bed.a.host_ip, bed.b.host_ip);
    // The cloud's two (tcp, icmp) once both hosts' names are registered, and rule 0.
    let va = wait_policy(&bed, Side::A, None, 4, "A to get the cloud's rules");
    wait_policy(&bed, Side::B, None, 4, "B to get the cloud's rules");
    let cloud = bed.cloud.as_ref().unwrap().status(&bed.bins).unwrap();
    assert_eq!(cloud["policy"]["enforce"], true, "{cloud}");
    assert_eq!(cloud["policy"]["rules"], 2, "tcp and icmp: {cloud}");
    let _b7000 = Sink::start(&bed.b.lan, (b, 7000).into());
    let _b7001 = Sink::start(&bed.b.lan, (b, 7001).into());

    // A's host resolves B's by name: the cloud pairs them (the rule goes A -> B).
    let found = bed.resolve(&bed.a.lan, bed.a.gateway, "host.gw2.ovl.example");
    assert_eq!(found, vec![b.to_string()]);
    bed.ping_ok(&bed.a.lan, b, Ping::count(3).wait(3));
    // Each side was told which way flows may start.
    for (side, allowed) in [(Side::A, "out"), (Side::B, "in")] {
        let peers = bed.status(side).unwrap()["peers"].clone();
        assert_eq!(peers[0]["allowed"], allowed, "{side:?}: {peers}");
    }
    assert!(connects(&bed.a.lan, (b, 7000).into()), "{}", bed.logs());
    assert!(!connects(&bed.a.lan, (b, 7001).into()));
    // B's host may open nothing to A's, and may not resolve it.
    assert!(!pings(&bed, Side::B, a));
    let d = cyphonic_e2e::lan::dig(&bed.b.lan, bed.b.gateway, "host.gw1.ovl.example", "A").unwrap();
    assert_eq!(d.status, "NXDOMAIN", "{d:?}");
    assert!(uint(&policy(&bed, Side::B)["dropped"]["no_rule"]) >= 3);

    // The cloud stops: the rules hold.
    bed.cloud.as_mut().unwrap().stop("TERM").unwrap();
    assert!(connects(&bed.a.lan, (b, 7000).into()));
    assert!(!connects(&bed.a.lan, (b, 7001).into()));
    assert!(!pings(&bed, Side::B, a));
    // A restarts without the cloud: it enforces what the cloud sent last.
    bed.stop(Side::A, "TERM").unwrap();
    bed.start(Side::A).unwrap();
    let p = policy(&bed, Side::A);
    assert_eq!(p["version"].as_u64(), Some(va), "{p}");
    assert!(
        bed.a
            .log_text()
            .contains("enforcing the policy the cloud sent last"),
        "{}",
        bed.a.log_text()
    );

    // The cloud comes back with tcp/7000 gone: B's and A's sets change, the flow is cut.
    let config = bed.cloud.as_ref().unwrap().dir.join("cloud.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let fewer = text.replace(
        &cloud_policy(&["tcp/7000", "icmp"]),
        &cloud_policy(&["icmp"]),
    );
    assert_ne!(fewer, text);
    std::fs::write(&config, fewer).unwrap();
    let bins = Bins::find().unwrap();
    bed.cloud.as_mut().unwrap().start(&bins).unwrap();
    let vb = uint(&policy(&bed, Side::B)["version"]);
    wait_policy(&bed, Side::B, Some(vb), 3, "B to get the new rules");
    wait_policy(&bed, Side::A, Some(va), 3, "A to get the new rules");
    bed.resolve(&bed.a.lan, bed.a.gateway, "host.gw2.ovl.example");
    bed.ping_ok(&bed.a.lan, b, Ping::count(2).wait(3));
    assert!(!connects(&bed.a.lan, (b, 7000).into()), "{}", bed.logs());
}

/// A member the rules leave out gets no tunnel by initiating: site A, told of B by its own
/// file (a static peer, handshaking every second) while the cloud's `default = "deny"` has
/// no rule between them, keeps handshaking; B asks the cloud whether to admit it and is
/// refused, so B answers nothing and the two never share keys. Once the cloud's reload adds
/// a rule (A's host may ping B's), B's next question is answered, the tunnel comes up, and
/// each side is told which way flows may start: A out, B in.
#[test]
fn a_member_no_rule_allows_gets_no_tunnel_by_initiating() {
    let deny_all = "[policy]\ndefault = \"deny\"\n";
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(cyphonic_e2e::bed::CloudOptions {
            extra: deny_all.to_owned(),
            ..Default::default()
        }),
        a: cyphonic_e2e::bed::SiteOptions {
            extra: "\n[[peer]]\ncertificate = \"peers/gw2.ovl.example.crt\"\nendpoint = \"203.0.113.2:51820\"\npersistent_keepalive = 1\n".to_owned(),
            ..Default::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    let cloud = bed.cloud.as_ref().unwrap();
    let counter = |name: &str| uint(&cloud.status(&bed.bins).unwrap()["counters"][name]);
    let peers = |side: Side| bed.status(side).unwrap()["peers"].clone();
    // Rule 0 alone (DNS, udp and tcp): the cloud's set is empty.
    wait_policy(&bed, Side::B, None, 2, "B to get the cloud's (empty) rules");
    wait_until(Duration::from_secs(10), "B to ask about A, refused", || {
        bed.b
            .log_text()
            .contains("the cloud will not pair us with a peer")
            && counter("denied") >= 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert!(
        bed.b.log_text().contains("denied by policy"),
        "{}",
        bed.b.log_text()
    );
    // Seconds of initiations later: no keys anywhere, no peer at B.
    std::thread::sleep(Duration::from_secs(3));
    let (pa, pb) = (peers(Side::A), peers(Side::B));
    assert!(
        pa.as_array()
            .unwrap()
            .iter()
            .all(|p| p["established"] == false),
        "{pa}"
    );
    assert_eq!(pb.as_array().map(Vec::len), Some(0), "{pb}");
    assert!(!pings(&bed, Side::A, bed.b.host_ip));

    // The cloud's reload adds the rule: admitted, the tunnel comes up, the ping passes.
    let path = cloud.dir.join("cloud.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let with_rule = text.replace(deny_all, &cloud_policy(&["icmp"]));
    assert_ne!(with_rule, text);
    std::fs::write(&path, with_rule).unwrap();
    let pid = cloud.proc.as_ref().unwrap().pid().to_string();
    cyphonic_e2e::sh("kill", &["-s", "HUP", &pid]).unwrap();
    wait_until(Duration::from_secs(15), "B to admit A", || {
        peers(Side::B)
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["established"] == true))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(2).wait(3));
    let pb = peers(Side::B);
    assert_eq!(pb[0]["name"], "gw1.ovl.example", "{pb}");
    assert_eq!(pb[0]["allowed"], "in", "{pb}");
    assert!(
        !pings(&bed, Side::B, bed.a.host_ip),
        "B's host opens nothing to A's"
    );
}

/// What a device behind a misbehaving peer can send about a flow it knows (issue 49,
/// findings 1 and 2). Site A enforces one rule, ops (A's host) -> iot (B's host) tcp/22; B
/// enforces nothing. While ops holds a connection to iot's port 22, iot and a third device
/// of B's send ICMP errors quoting that connection and IP fragments between the two. What
/// arrives is judged on the victims' own interfaces (ops's, and a bystander of A's site,
/// "guest", that has no flow at all): only the error that answers the connection (iot to
/// ops, about ops's packet) and the later fragment of a datagram whose first fragment
/// passed (a segment of the connection itself) arrive; every other one is dropped at A and
/// counted.
#[test]
fn icmp_errors_and_fragments_pass_only_for_their_own_flow() {
    const GUEST: Ipv4Addr = Ipv4Addr::new(100, 64, 1, 20);
    const THIRD: Ipv4Addr = Ipv4Addr::new(100, 64, 2, 30);
    let mut opts = BedOptions {
        lan_switch: true,
        ..BedOptions::default()
    };
    let mut bed = TwoSites::new(&opts).unwrap();
    let mut joined = Vec::new();
    for (side, label, ip, gw) in [
        (Side::A, "guest", GUEST, "100.64.1.1"),
        (Side::B, "third", THIRD, "100.64.2.1"),
    ] {
        let (ns, mac) = bed.add_host(side, label).unwrap();
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])
            .unwrap();
        ns.ip(&["route", "add", "default", "via", gw]).unwrap();
        joined.push((ns, mac));
    }
    let (guest, third) = (&joined[0], &joined[1]);
    let (ops, iot) = (bed.a.host_ip, bed.b.host_ip);
    let reservation = |mac: &str, ip: Ipv4Addr, name: &str| {
        format!("\n[[reservation]]\nmac = \"{mac}\"\nvip = \"{ip}\"\nhostname = \"{name}\"\n")
    };
    opts.a.extra = reservation(&guest.1, GUEST, "guest")
        + &rules(None, &[("host", &iot.to_string(), &["tcp/22"])]);
    opts.b.extra = reservation(&third.1, THIRD, "third");
    bed.write_config(Side::A, &opts).unwrap();
    bed.write_config(Side::B, &opts).unwrap();
    bed.start(Side::A).unwrap();
    bed.start(Side::B).unwrap();
    let _ssh = Sink::start(&bed.b.lan, (iot, 22).into());

    // Ops's connection, held open while the attack runs; its port is what the attacker knows.
    let stop = Arc::new(AtomicBool::new(false));
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let held = {
        let stop = stop.clone();
        inject::spawn_inside(&bed.a.lan, move || {
            let c = TcpStream::connect_timeout(&(iot, 22).into(), Duration::from_secs(5))?;
            port_tx.send(c.local_addr()?.port())?;
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        })
    };
    let port = port_rx
        .recv_timeout(Duration::from_secs(8))
        .unwrap_or_else(|_| panic!("ops could not connect to iot's port 22\n{}", bed.logs()));

    let gw_b = cyphonic_e2e::bed::parse_mac(
        bed.status(Side::B).unwrap()["adapter"]["gateway_mac"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let (iot_mac, third_mac) = (
        cyphonic_e2e::bed::parse_mac(&bed.b.host_mac).unwrap(),
        cyphonic_e2e::bed::parse_mac(&third.1).unwrap(),
    );
    // Ops's packets of the connection as iot received them: what every error quotes.
    let quoted = inject::ipv4_packet(6, ops, iot, 7, 0x4000, &inject::tcp_header(port, 22, 0x10));
    let error = |from: Ipv4Addr, to: Ipv4Addr, kind: u8, code: u8, extra: &[u8]| {
        inject::ipv4_packet(
            1,
            from,
            to,
            9,
            0,
            &inject::icmp_error(kind, code, &quoted, extra),
        )
    };
    // What an ICMP error's bytes start with where it arrives: its addresses, type and code.
    let needle = |from: Ipv4Addr, to: Ipv4Addr, kind: u8, code: u8| {
        let mut n = from.octets().to_vec();
        n.extend(to.octets());
        n.extend([kind, code]);
        n
    };
    let tagged = |tag: &[u8]| {
        let mut t = tag.to_vec();
        t.resize(64, b'.');
        t
    };
    // Fragments, from iot to ops. The answer: a segment of the connection (iot:22 -> ops)
    // in two fragments, which passes whole. A lone fragment at offset 800 whose first was
    // never sent; the rest of a SYN to ops's port 80, whose first fragment no rule lets in.
    let segment = [inject::tcp_header(22, port, 0x18), vec![0; 4]].concat();
    let fragments = [
        inject::ipv4_packet(6, iot, ops, 0x5151, 0x2000, &segment),
        inject::ipv4_packet(
            6,
            iot,
            ops,
            0x5151,
            3,
            &tagged(b"the answer's second fragment"),
        ),
        inject::ipv4_packet(6, iot, ops, 0x5252, 100, &tagged(b"a lone later fragment")),
        inject::ipv4_packet(
            6,
            iot,
            ops,
            0x5353,
            0x2000,
            &[inject::tcp_header(41000, 80, 0x02), vec![0; 4]].concat(),
        ),
        inject::ipv4_packet(6, iot, ops, 0x5353, 3, &tagged(b"the denied SYN's rest")),
    ];
    let from_iot: Vec<Vec<u8>> = [
        error(iot, ops, 3, 1, &[]),
        error(iot, GUEST, 3, 3, &[]),
        error(iot, GUEST, 11, 0, &[]),
        error(
            iot,
            GUEST,
            3,
            3,
            &tagged(b"1,000 bytes of the attacker's own").repeat(16),
        ),
        error(
            iot,
            ops,
            3,
            3,
            &tagged(b"the same after the quote, to ops").repeat(16),
        ),
        error(iot, ops, 5, 1, &[]),
    ]
    .into_iter()
    .chain(fragments)
    .map(|ip| inject::ipv4_frame(gw_b, iot_mac, &ip))
    .collect();
    let from_third = vec![inject::ipv4_frame(
        gw_b,
        third_mac,
        &error(THIRD, ops, 3, 3, &[]),
    )];
    // (what, needle, where it would arrive, may it)
    let expect: Vec<(&str, Vec<u8>, bool, bool)> = vec![
        (
            "the error that answers the connection",
            needle(iot, ops, 3, 1),
            true,
            true,
        ),
        (
            "the answer's second fragment",
            tagged(b"the answer's second fragment"),
            true,
            true,
        ),
        (
            "an error to a bystander",
            needle(iot, GUEST, 3, 3),
            false,
            false,
        ),
        (
            "time exceeded to a bystander",
            needle(iot, GUEST, 11, 0),
            false,
            false,
        ),
        (
            "1,000 bytes after the quote, to a bystander",
            tagged(b"1,000 bytes of the attacker's own"),
            false,
            false,
        ),
        (
            "1,000 bytes after the quote, to ops",
            tagged(b"the same after the quote, to ops"),
            true,
            false,
        ),
        ("a redirect", needle(iot, ops, 5, 1), true, false),
        (
            "an error from a third device",
            needle(THIRD, ops, 3, 3),
            true,
            false,
        ),
        (
            "a lone later fragment",
            tagged(b"a lone later fragment"),
            true,
            false,
        ),
        (
            "the rest of a denied SYN",
            tagged(b"the denied SYN's rest"),
            true,
            false,
        ),
    ];
    let needles = |at_ops: bool| -> Vec<Vec<u8>> {
        expect
            .iter()
            .filter(|e| e.2 == at_ops)
            .map(|e| e.1.clone())
            .collect()
    };
    let (at_ops, at_guest) = (needles(true), needles(false));
    let seen_ops = std::thread::scope(|s| {
        let ops_capture = s.spawn(|| {
            inject::count_frames_containing_each(&bed.a.lan, "eth0", at_ops, Duration::from_secs(4))
        });
        let guest_capture = s.spawn(|| {
            inject::count_frames_containing_each(&guest.0, "eth0", at_guest, Duration::from_secs(4))
        });
        std::thread::sleep(Duration::from_millis(500));
        inject::send_frames(&bed.b.lan, "eth0", from_iot).unwrap();
        inject::send_frames(&third.0, "eth0", from_third).unwrap();
        (
            ops_capture.join().unwrap().unwrap(),
            guest_capture.join().unwrap().unwrap(),
        )
    });
    stop.store(true, Ordering::Relaxed);
    inject::joined(held).unwrap();
    let (mut ops_counts, mut guest_counts) = (seen_ops.0.into_iter(), seen_ops.1.into_iter());
    let mut wrong = Vec::new();
    for (what, _, at_ops, may) in &expect {
        let seen = if *at_ops {
            ops_counts.next()
        } else {
            guest_counts.next()
        }
        .unwrap();
        if (seen > 0) != *may {
            wrong.push(format!("{what}: seen {seen} times"));
        }
    }
    let p = policy(&bed, Side::A);
    assert!(wrong.is_empty(), "{wrong:#?}\n{p}\n{}", bed.logs());
    // Six forged errors and two stray fragments, dropped where they arrived at A.
    assert!(uint(&p["dropped_in"]["forged_error"]) >= 6, "{p}");
    assert!(uint(&p["dropped_in"]["fragment"]) >= 2, "{p}");
}
