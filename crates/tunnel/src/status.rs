//! The parts of the status document the engine owns (peers, the cloud, the engine's counters,
//! the pipelines), and their text for a terminal. The socket it is read from is
//! `cyphonic_telemetry::status`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use cyphonic_pipeline::{Counters as PipelineCounters, DropReason, Stats};
use serde_json::{Map, Value, json};

use crate::Shared;

/// A pipeline's counters as the status document shows them.
pub fn pipeline_json(s: &Stats) -> Value {
    let drops: Map<String, Value> = DropReason::ALL
        .iter()
        .map(|r| (r.name().to_owned(), json!(s.dropped(*r))))
        .collect();
    json!({
        "submitted": s.submitted,
        "emitted": s.emitted,
        "rejected_full": s.rejected_full,
        "batches": s.batches,
        "inline_batches": s.inline_batches,
        "out_of_order": s.out_of_order,
        "held_packets": s.held_packets,
        "mean_hold_us": s.mean_hold().map_or(0.0, |d| d.as_secs_f64() * 1e6),
        "ring_depth_max": s.ring_depth_max,
        "drops": drops,
        "hold_histogram_log2_us": s.hold_histogram.to_vec(),
    })
}

/// The engine's part of the status document: `peers`, `cloud`, `counters` (the engine's,
/// followed by `extra`, the binary's own), `pipelines`, and the buffers in use.
pub fn document(
    shared: &Shared,
    egress: &Arc<PipelineCounters>,
    ingress: &Arc<PipelineCounters>,
    extra: Vec<(&'static str, u64)>,
) -> Map<String, Value> {
    let now = Instant::now();
    let counters: Map<String, Value> = extra
        .into_iter()
        .chain(shared.counters.snapshot())
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    let mut doc = Map::new();
    doc.insert("peers".into(), Value::Array(shared.peers_json(now)));
    doc.insert(
        "cloud".into(),
        shared.cloud.lock().map_or(Value::Null, |c| c.clone()),
    );
    doc.insert("counters".into(), Value::Object(counters));
    doc.insert(
        "pipelines".into(),
        json!({
            "egress": pipeline_json(&egress.snapshot()),
            "ingress": pipeline_json(&ingress.snapshot()),
        }),
    );
    doc.insert(
        "buffers".into(),
        json!({ "allocated": shared.pool.allocated(), "free": shared.pool.free() }),
    );
    doc
}

/// The engine's part of the document as text for a terminal: the cloud line, the peers
/// table.
pub fn peers_text(doc: &Value) -> String {
    let mut out = String::new();
    let c = &doc["cloud"];
    if c.is_object() {
        let _ = writeln!(
            out,
            "cloud {}  {}{}{}",
            c["address"].as_str().unwrap_or("?"),
            if c["connected"].as_bool() == Some(true) {
                "connected"
            } else {
                "NOT CONNECTED"
            },
            c["observed"]
                .as_str()
                .map(|o| format!("  our tunnel socket as it sees it: {o}"))
                .unwrap_or_default(),
            c["last_error"]
                .as_str()
                .map(|e| format!("  last error: {e}"))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<28} {:<7} {:<18} {:<24} {:<34} {:<5} {:>10} {:>10}",
        "PEER", "ORIGIN", "VIP BLOCK", "ENDPOINT", "ROUTE", "UP", "TX PKTS", "RX PKTS"
    );
    for p in doc["peers"].as_array().into_iter().flatten() {
        let route = p["relay"]["reason"]
            .as_str()
            .map_or_else(|| "direct".to_owned(), |why| format!("relay ({why})"));
        let _ = writeln!(
            out,
            "{:<28} {:<7} {:<18} {:<24} {:<34} {:<5} {:>10} {:>10}",
            p["name"].as_str().unwrap_or("?"),
            p["origin"].as_str().unwrap_or("?"),
            p["vip_blocks"][0].as_str().unwrap_or("-"),
            p["endpoint"].as_str().unwrap_or("-"),
            route,
            if p["established"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            p["tx_packets"].as_u64().unwrap_or(0),
            p["rx_packets"].as_u64().unwrap_or(0)
        );
    }
    out
}

/// The counters that are not zero and the pipelines' order figures, as text.
pub fn counters_text(doc: &Value) -> String {
    let mut out = String::from("counters (non-zero):\n");
    if let Some(map) = doc["counters"].as_object() {
        for (k, v) in map.iter().filter(|(_, v)| v.as_u64() != Some(0)) {
            let _ = writeln!(out, "  {k:<28} {v}");
        }
    }
    for dir in ["egress", "ingress"] {
        let p = &doc["pipelines"][dir];
        let _ = writeln!(
            out,
            "pipeline {dir}: emitted {} out_of_order {} held {} mean_hold_us {:.1}",
            p["emitted"],
            p["out_of_order"],
            p["held_packets"],
            p["mean_hold_us"].as_f64().unwrap_or(0.0)
        );
    }
    out
}
