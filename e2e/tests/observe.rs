//! What operators see, checked against what a scenario sent: the Prometheus endpoints of the
//! adapter and the cloud (scraped over HTTP inside their namespaces), and the `status`
//! commands' text and JSON.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use cyphonic_e2e::bed::{BedOptions, CloudOptions, Side, SiteOptions, TwoSites};
use cyphonic_e2e::lan::dig;
use cyphonic_e2e::{HA_METRICS, NODE_METRICS, POLICY_METRICS, http_get, metric, uint};

const METRICS: &str = "[metrics]\nlisten = \"127.0.0.1:9464\"\n";

fn scrape(bed: &TwoSites, side: Side) -> String {
    let ns = &bed.site_ref(side).adapter_ns;
    let addr: SocketAddr = "127.0.0.1:9464".parse().unwrap();
    let (status, body) = http_get(ns, addr, "/metrics").unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    body
}

/// 20 pings from lanA to lanB through static peers: adapter A's metrics show exactly 20
/// packets each way for the peer, 20 emitted by each pipeline, none out of order; the status
/// command says the same in its table.
#[test]
fn adapter_metrics_count_what_the_scenario_sent() {
    let bed = TwoSites::up(&BedOptions {
        a: SiteOptions {
            extra: METRICS.into(),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    let before = scrape(&bed, Side::A);
    assert_eq!(metric(&before, "cyphonic_peers"), Some(1.0), "{before}");
    let ping = bed
        .ping(
            Side::A,
            bed.b.host_ip,
            &["-c", "20", "-i", "0.05", "-W", "2"],
        )
        .unwrap();
    assert!(ping.status.success(), "{}", bed.logs());
    let m = scrape(&bed, Side::A);
    let peer = |dir: &str| {
        metric(
            &m,
            &format!("cyphonic_peer_packets_total{{peer=\"gw2.ovl.example\",direction=\"{dir}\"}}"),
        )
    };
    assert_eq!((peer("tx"), peer("rx")), (Some(20.0), Some(20.0)), "{m}");
    for dir in ["egress", "ingress"] {
        assert_eq!(
            metric(
                &m,
                &format!("cyphonic_pipeline_emitted_total{{direction=\"{dir}\"}}")
            ),
            Some(20.0),
            "{dir}: {m}"
        );
        assert_eq!(
            metric(
                &m,
                &format!("cyphonic_pipeline_out_of_order_total{{direction=\"{dir}\"}}")
            ),
            Some(0.0),
            "{m}"
        );
    }
    assert_eq!(
        metric(&m, "cyphonic_peer_up{peer=\"gw2.ovl.example\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        metric(&m, "cyphonic_captured_total").unwrap_or(0.0) >= 20.0,
        "{m}"
    );
    assert!(
        metric(&m, "cyphonic_sessions_established_total").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(
        m.contains("# TYPE cyphonic_pipeline_hold_seconds histogram"),
        "{m}"
    );
    // Prometheus' own tool finds nothing to say of the text format, and HEAD is answered.
    let addr: SocketAddr = "127.0.0.1:9464".parse().unwrap();
    cyphonic_e2e::promtool_check(&bed.a.adapter_ns, addr).unwrap();
    // What serves them, at the workspace's version (the commit is stamped by dist only).
    let info = format!(
        "cyphonic_build_info{{program=\"cyphonic-adapter\",version=\"{}\",commit=",
        env!("CARGO_PKG_VERSION")
    );
    let built: Vec<&str> = m.lines().filter(|l| l.starts_with(&info)).collect();
    assert!(
        built.len() == 1 && built[0].ends_with("} 1.0"),
        "{info} in {m}"
    );
    // Where the packets waited: each of the 20 is counted once in every stage's histogram.
    for dir in ["egress", "ingress"] {
        for stage in ["batching", "queued", "processing", "total"] {
            assert_eq!(
                metric(
                    &m,
                    &format!("cyphonic_pipeline_{stage}_seconds_count{{direction=\"{dir}\"}}")
                ),
                Some(20.0),
                "{dir} {stage}: {m}"
            );
        }
    }
    assert!(
        m.contains("cyphonic_peer_info{peer=\"gw2.ovl.example\",origin=\"static\",route=\"direct\",relay_reason=\"\"} 1"),
        "{m}"
    );
    // Anything but /metrics is not found.
    let (status, _) = http_get(
        &bed.a.adapter_ns,
        "127.0.0.1:9464".parse().unwrap(),
        "/secrets",
    )
    .unwrap();
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");

    // 100 connections that each hold half a request line (issue 49, finding 9) do not keep
    // a scrape waiting: it is answered within a second.
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let (stop_tx, stop) = std::sync::mpsc::channel::<()>();
    let holder = cyphonic_e2e::inject::spawn_inside(&bed.a.adapter_ns, move || {
        use std::io::Write as _;
        let addr: SocketAddr = "127.0.0.1:9464".parse()?;
        let mut held = Vec::new();
        for _ in 0..100 {
            let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            c.write_all(b"GET /metr")?;
            held.push(c);
        }
        ready_tx.send(())?;
        let _ = stop.recv_timeout(Duration::from_secs(20));
        Ok(held.len())
    });
    ready.recv_timeout(Duration::from_secs(10)).unwrap();
    let start = std::time::Instant::now();
    let body = scrape(&bed, Side::A);
    let took = start.elapsed();
    drop(stop_tx);
    assert_eq!(cyphonic_e2e::inject::joined(holder).unwrap(), 100);
    assert!(body.contains("cyphonic_peers"), "{body}");
    assert!(
        took < Duration::from_secs(1),
        "the scrape took {took:?} beside 100 idle connections"
    );

    // The status command: the same figures, in the table and in JSON.
    let out = std::process::Command::new(&bed.bins.adapter)
        .args(["status", "--socket", bed.a.socket().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("gw2.ovl.example"))
        .unwrap_or_else(|| panic!("{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], "static", "{row}");
    assert_eq!(cells[4], "direct", "{row}");
    assert_eq!(
        &cells[cells.len() - 3..cells.len() - 1],
        ["20", "20"],
        "{row}"
    );
    assert!(text.contains("out_of_order 0"), "{text}");
    // What runs, first in the table and in the document (the commit is dist's to stamp).
    let runs = format!("cyphonic-adapter {}", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&runs), "{text}");
    let doc = bed.status(Side::A).unwrap();
    assert!(
        doc["software"]
            .as_str()
            .is_some_and(|s| s.starts_with(&runs)),
        "{doc}"
    );
    // 20 pings 50 ms apart: a sparse flow, each sent at once by the express lane on the way
    // out, but for any that waited for the tunnel's handshake (released in order behind it);
    // the 20 replies came flagged as sparse by B, the kernel steered them to the tunnel
    // socket's sparse companion, and its thread opened them at once (the lane).
    let queued = doc["counters"]["queued_for_handshake"].as_u64().unwrap();
    assert!(queued <= 2, "{doc}");
    // The capture's sparse socket took the pings, and its thread sent them (the lane).
    assert!(
        text.contains(&format!(
            "pipeline egress: emitted 20 express {} lane {} ",
            20 - queued,
            20 - queued
        )),
        "{text}"
    );
    assert!(
        text.contains("pipeline ingress: emitted 20 express 20 lane 20 "),
        "{text}"
    );
    assert_eq!(doc["peers"][0]["tx_packets"], 20, "{doc}");
    let total = &doc["pipelines"]["egress"]["waits"]["total"];
    assert_eq!(total["packets"], 20, "{doc}");
    assert!(
        total["mean_us"].as_f64().is_some_and(|us| us > 0.0),
        "{doc}"
    );
    assert!(text.contains("total_us "), "{text}");
    // Certificate expiry: ours and the peer's, the same in the table, the JSON and metrics.
    let ours = doc["certificate"]["not_after"].as_u64().unwrap();
    let theirs = doc["peers"][0]["certificate_expires"].as_u64().unwrap();
    let at = doc["at"].as_u64().unwrap();
    assert!(ours > at && theirs > at, "{doc}");
    assert_eq!(doc["certificate"]["name"], "gw1.ovl.example", "{doc}");
    assert_eq!(
        metric(&m, "cyphonic_certificate_expiry_timestamp_seconds"),
        Some(ours as f64),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "cyphonic_peer_certificate_expiry_timestamp_seconds{peer=\"gw2.ovl.example\"}"
        ),
        Some(theirs as f64),
        "{m}"
    );
    let days = format!("{}d", (theirs - at) / 86_400);
    assert_eq!(cells[cells.len() - 1], days, "{row}");
    assert!(
        text.contains(&format!(
            "certificate gw1.ovl.example (100.64.1.0/24)  expires in {}d",
            (ours - at) / 86_400
        )),
        "{text}"
    );
    assert_eq!(
        doc["counters"]["sessions_established"],
        m.lines()
            .find_map(|l| l.strip_prefix("cyphonic_sessions_established_total "))
            .unwrap()
            .parse::<u64>()
            .unwrap(),
        "{doc}"
    );
}

/// The cloud's endpoint and status: both adapters online, the resolution the scenario made,
/// the sessions by name.
#[test]
fn cloud_metrics_and_status_show_the_sessions_and_resolutions() {
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            extra: "[metrics]\nlisten = \"127.0.0.1:9466\"\n".into(),
            // It issues too: its issuing CA's end is watched.
            enroll: Some(3600),
            ..CloudOptions::default()
        }),
        a: SiteOptions {
            extra: METRICS.into(),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    let gw = Ipv4Addr::new(100, 64, 1, 1);
    let mut found = false;
    for _ in 0..24 {
        if dig(&bed.a.lan, gw, "host.gw2.ovl.example", "A")
            .is_ok_and(|d| d.answers == ["100.64.2.10"])
        {
            found = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(found, "{}", bed.logs());
    let cloud = bed.cloud.as_ref().unwrap();
    let addr: SocketAddr = "127.0.0.1:9466".parse().unwrap();
    // The registry's sizes are read every 2 s.
    let mut m = String::new();
    for _ in 0..30 {
        m = http_get(&cloud.ns, addr, "/metrics").unwrap().1;
        if metric(&m, "cyphonic_registry_online") == Some(2.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(metric(&m, "cyphonic_registry_online"), Some(2.0), "{m}");
    assert_eq!(metric(&m, "cyphonic_nms_sessions_open"), Some(2.0), "{m}");
    assert!(
        metric(&m, "cyphonic_nms_resolves_total").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "cyphonic_nms_probes_total").unwrap_or(0.0) >= 4.0,
        "{m}"
    );
    assert_eq!(metric(&m, "cyphonic_relay_channels_open"), Some(0.0), "{m}");
    cyphonic_e2e::promtool_check(&cloud.ns, addr).unwrap();
    // The issuing CA, delegated for 365 days as the bed started.
    let left = metric(&m, "cyphonic_enroll_issuing_ca_expiry_seconds").unwrap_or(-1.0);
    assert!(
        (364.0 * 86_400.0..=365.0 * 86_400.0).contains(&left),
        "{left} s: {m}"
    );
    // Every metric the Grafana dashboard we ship queries is one of these two exports (a renamed
    // counter would otherwise leave an empty panel that nobody notices).
    let exported = format!("{m}{}", scrape(&bed, Side::A));
    let exported = cyphonic_e2e::sample_names(&exported);
    // The HA pair's panels are checked against a pair (adapter.rs), the policy's and the
    // node's against a site with rules and a node (node.rs).
    let missing = cyphonic_e2e::dashboard_metrics()
        .into_iter()
        .filter(|name| {
            ![HA_METRICS, POLICY_METRICS, NODE_METRICS]
                .iter()
                .any(|p| name.starts_with(p))
                && !exported.contains(name)
        })
        .collect::<Vec<_>>();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which nothing exports"
    );
    // And each of its queries is PromQL.
    assert!(cyphonic_e2e::dashboard_queries_parse().unwrap() > 40);
    let doc = cloud.status(&bed.bins).unwrap();
    let names: Vec<&str> = doc["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["gw1.ovl.example", "gw2.ovl.example"], "{doc}");
    assert_eq!(doc["registry"]["clients"], 2, "{doc}");
    assert!(
        doc["cloud"]["software"].as_str().is_some_and(
            |s| s.starts_with(&format!("cyphonic-cloud {}", env!("CARGO_PKG_VERSION")))
        ),
        "{doc}"
    );
    assert!(uint(&doc["counters"]["resolves"]) >= 1, "{doc}");
    let enroll = &doc["enroll"];
    assert!(
        enroll["expires_in_secs"]
            .as_i64()
            .is_some_and(|s| (364 * 86_400..=365 * 86_400).contains(&s)),
        "{doc}"
    );
    assert_eq!(
        enroll["issuing_ca"].as_str().map(str::len),
        Some(64),
        "{doc}"
    );
}
