//! The engine's metrics, read at every scrape from the same counters the status document
//! shows: the engine's events, both pipelines (drops by reason, out-of-order emissions, the
//! reorder ring's depth and hold-time histogram), each peer (bytes, packets, route, last
//! handshake), handshake refusals by reason, the control plane's state, the buffers.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cyphonic_pipeline::{Counters as PipelineCounters, DropReason, HOLD_BUCKETS, Wait};
use cyphonic_telemetry::CounterSet;
use cyphonic_telemetry::Family;
use cyphonic_telemetry::metrics::{
    Collector, DescriptorEncoder, Observed, counter_sets, gauge, histograms,
};

use cyphonic_tunnel::Shared;

use crate::status::CloudStatus;

/// Prefix of every metric name.
pub const PREFIX: &str = "cyphonic";

/// Collects the engine's metrics, with the edge's counters (their drops and refusals are
/// rows of the same families as the engine's).
#[derive(Debug)]
pub struct EngineCollector {
    shared: Arc<Shared>,
    edge: Arc<dyn CounterSet + Send + Sync>,
    egress: Arc<PipelineCounters>,
    ingress: Arc<PipelineCounters>,
    cloud: Option<Arc<std::sync::Mutex<CloudStatus>>>,
    streams: Option<Arc<cyphonic_stream::StreamStats>>,
}

impl EngineCollector {
    /// Over `shared`, the edge's counters, the two pipelines' counters and the control
    /// plane's state.
    pub fn new(
        shared: Arc<Shared>,
        edge: Arc<dyn CounterSet + Send + Sync>,
        egress: Arc<PipelineCounters>,
        ingress: Arc<PipelineCounters>,
        cloud: Option<Arc<std::sync::Mutex<CloudStatus>>>,
    ) -> Self {
        Self {
            shared,
            edge,
            egress,
            ingress,
            cloud,
            streams: None,
        }
    }

    /// With the relay streams' counters (`cyphonic_relay_stream_*`).
    #[must_use]
    pub fn with_streams(mut self, streams: Option<Arc<cyphonic_stream::StreamStats>>) -> Self {
        self.streams = streams;
        self
    }
}

/// Labels of one row.
type Labels = Vec<(&'static str, String)>;

#[expect(clippy::cast_precision_loss, reason = "counters as metric values")]
fn f(v: u64) -> f64 {
    v as f64
}

impl Collector for EngineCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        counter_sets(&mut e, PREFIX, &[self.shared.counters(), &*self.edge])?;
        let refusals: Vec<(Labels, f64)> = self
            .shared
            .handshake_refusals()
            .into_iter()
            .map(|(k, v)| (vec![("reason", k.to_owned())], f(v)))
            .collect();
        Family::counters(
            "cyphonic_handshake_refusals",
            "Handshake messages refused, by reason.",
        )
        .encode(&mut e, refusals)?;

        // Pipelines.
        let stats = [
            ("egress", self.egress.snapshot()),
            ("ingress", self.ingress.snapshot()),
        ];
        let per_dir = |get: &dyn Fn(&cyphonic_pipeline::Stats) -> f64| -> Vec<(Labels, f64)> {
            stats
                .iter()
                .map(|(d, s)| (vec![("direction", (*d).to_owned())], get(s)))
                .collect()
        };
        Family::counters(
            "cyphonic_pipeline_submitted",
            "Packets that entered a pipeline.",
        )
        .encode(&mut e, per_dir(&|s| f(s.submitted)))?;
        Family::counters(
            "cyphonic_pipeline_emitted",
            "Packets a pipeline emitted, in order.",
        )
        .encode(&mut e, per_dir(&|s| f(s.emitted)))?;
        Family::counters(
            "cyphonic_pipeline_batches",
            "Batches that left a pipeline's sequencer.",
        )
        .encode(&mut e, per_dir(&|s| f(s.batches)))?;
        Family::counters(
            "cyphonic_pipeline_inline_batches",
            "Of those, batches sealed or opened on the receiving thread (nothing in flight).",
        )
        .encode(&mut e, per_dir(&|s| f(s.inline_batches)))?;
        Family::counters(
            "cyphonic_pipeline_rejected_full",
            "Packets refused because the in-flight budget was spent (bytes, time or batch buffers).",
        )
        .encode(&mut e, per_dir(&|s| f(s.rejected_full)))?;
        Family::counters(
            "cyphonic_pipeline_rejected_bytes",
            "Of those, refused for the bytes in flight (dataplane.in_flight_bytes).",
        )
        .encode(&mut e, per_dir(&|s| f(s.rejected_bytes)))?;
        Family::counters(
            "cyphonic_pipeline_rejected_late",
            "Of those, refused because the oldest batch in flight was out too long (dataplane.in_flight_ms).",
        )
        .encode(&mut e, per_dir(&|s| f(s.rejected_late)))?;
        Family::gauges(
            "cyphonic_pipeline_batch_buffers",
            "Batch buffers made so far: the most batches a burst needed in flight at once.",
        )
        .encode(&mut e, per_dir(&|s| f(s.batch_buffers)))?;
        Family::counters(
            "cyphonic_pipeline_out_of_order",
            "Packets emitted out of arrival order (stays 0 with ordering on).",
        )
        .encode(&mut e, per_dir(&|s| f(s.out_of_order)))?;
        Family::counters(
            "cyphonic_pipeline_express",
            "Packets of sparse flows sent at once, ahead of bulk flows' batches (egress).",
        )
        .encode(&mut e, per_dir(&|s| f(s.express)))?;
        Family::counters(
            "cyphonic_pipeline_lane",
            "Of the express packets, those a thread of their own read from a socket of their own (ingress: the tunnel socket's sparse companion).",
        )
        .encode(&mut e, per_dir(&|s| f(s.lane)))?;
        Family::counters(
            "cyphonic_pipeline_held",
            "Packets the reorder ring held for earlier ones.",
        )
        .encode(&mut e, per_dir(&|s| f(s.held_packets)))?;
        Family::gauges(
            "cyphonic_pipeline_ring_depth_max",
            "Most batches the reorder ring held at once.",
        )
        .encode(&mut e, per_dir(&|s| f(s.ring_depth_max)))?;
        let drops: Vec<(Labels, f64)> = stats
            .iter()
            .flat_map(|(d, s)| {
                DropReason::ALL.iter().map(move |r| {
                    (
                        vec![
                            ("direction", (*d).to_owned()),
                            ("reason", r.name().to_owned()),
                        ],
                        f(s.dropped(*r)),
                    )
                })
            })
            .collect();
        Family::counters(
            "cyphonic_pipeline_dropped",
            "Packets a pipeline dropped, by reason.",
        )
        .encode(&mut e, drops)?;
        let holds: Vec<_> = stats
            .iter()
            .map(|(d, s)| (*d, log2_us(&s.hold_histogram, s.mean_hold())))
            .collect();
        histograms(
            &mut e,
            "cyphonic_pipeline_hold_seconds",
            "How long batches waited in the reorder ring for earlier ones.",
            holds.iter().map(|(d, h)| (direction(d), h.observed())),
        )?;
        for w in Wait::ALL {
            let waits: Vec<_> = stats
                .iter()
                .map(|(d, s)| (*d, log2_us(&s.waits[w.index()], s.mean_wait(w))))
                .collect();
            histograms(
                &mut e,
                &format!("cyphonic_pipeline_{}_seconds", w.name()),
                wait_help(w),
                waits.iter().map(|(d, h)| (direction(d), h.observed())),
            )?;
        }

        // Peers.
        let now = Instant::now();
        let peers = self.shared.peers().all();
        let mut bytes = Vec::new();
        let mut packets = Vec::new();
        let mut up = Vec::new();
        let mut since = Vec::new();
        let mut info = Vec::new();
        let mut expiry = Vec::new();
        for slot in &peers {
            expiry.push((
                vec![("peer", slot.name.clone())],
                f(slot.certificate_expires()),
            ));
            let (established, last) = {
                let p = slot.lock();
                (p.is_established(now), p.last_handshake())
            };
            let (kind, reason) = slot.relay_in_use().map_or(("direct", String::new()), |r| {
                ("relay", r.reason.describe().to_owned())
            });
            let name = slot.name.clone();
            for (dir, v) in [("tx", &slot.tx_bytes), ("rx", &slot.rx_bytes)] {
                bytes.push((
                    vec![("peer", name.clone()), ("direction", dir.to_owned())],
                    f(v.load(Ordering::Relaxed)),
                ));
            }
            for (dir, v) in [("tx", &slot.tx_packets), ("rx", &slot.rx_packets)] {
                packets.push((
                    vec![("peer", name.clone()), ("direction", dir.to_owned())],
                    f(v.load(Ordering::Relaxed)),
                ));
            }
            up.push((
                vec![("peer", name.clone())],
                if established { 1.0 } else { 0.0 },
            ));
            if let Some(t) = last {
                since.push((
                    vec![("peer", name.clone())],
                    now.saturating_duration_since(t).as_secs_f64(),
                ));
            }
            info.push((
                vec![
                    ("peer", name),
                    ("origin", slot.origin.to_owned()),
                    ("route", kind.to_owned()),
                    ("relay_reason", reason),
                ],
                1.0,
            ));
        }
        gauge(
            &mut e,
            "cyphonic_peers",
            "Peers known.",
            f(peers.len() as u64),
        )?;
        Family::counters("cyphonic_peer_bytes", "Inner bytes to and from each peer.")
            .encode(&mut e, bytes)?;
        Family::counters(
            "cyphonic_peer_packets",
            "Inner packets to and from each peer.",
        )
        .encode(&mut e, packets)?;
        Family::gauges(
            "cyphonic_peer_up",
            "Whether the tunnel to a peer has keys (1) or not (0).",
        )
        .encode(&mut e, up)?;
        Family::gauges(
            "cyphonic_peer_last_handshake_seconds",
            "Seconds since a peer's last completed handshake.",
        )
        .encode(&mut e, since)?;
        Family::gauges(
            "cyphonic_peer_certificate_expiry_timestamp_seconds",
            "When a peer's certificate ends (unix seconds): the peer leaves then.",
        )
        .encode(&mut e, expiry)?;
        gauge(
            &mut e,
            "cyphonic_certificate_expiry_timestamp_seconds",
            "When our own certificate ends (unix seconds): peers refuse us from then on.",
            f(self.shared.identity().certificate().body().not_after),
        )?;
        Family::gauges(
            "cyphonic_peer_info",
            "A peer, how we know it and how it is reached (always 1).",
        )
        .encode(&mut e, info)?;

        // The control plane and the buffers.
        if let Some(cloud) = &self.cloud {
            let connected = cloud
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .connected;
            gauge(
                &mut e,
                "cyphonic_cloud_connected",
                "Whether the control session with the cloud is open.",
                if connected { 1.0 } else { 0.0 },
            )?;
        }
        if let Some(s) = &self.streams {
            counter_sets(&mut e, "cyphonic_relay_stream", &[&**s])?;
        }
        if let Some(p) = self.shared.policy().report() {
            use cyphonic_tunnel::policy::Reason;
            gauge(
                &mut e,
                "cyphonic_policy_flows",
                "Flows the per-device policy keeps now.",
                f(p.flows as u64),
            )?;
            gauge(
                &mut e,
                "cyphonic_policy_version",
                "The version of the per-device rules in force.",
                f(p.version),
            )?;
            let s = &p.stats;
            let drops: Vec<(Labels, f64)> = Reason::ALL
                .iter()
                .flat_map(|r| {
                    let (all, inbound) = (s.dropped(*r), s.dropped_in(*r));
                    [("in", inbound), ("out", all.saturating_sub(inbound))].map(|(dir, n)| {
                        (
                            vec![
                                ("direction", dir.to_owned()),
                                ("reason", r.name().to_owned()),
                            ],
                            f(n),
                        )
                    })
                })
                .collect();
            Family::counters(
                "cyphonic_policy_dropped",
                "Packets the per-device policy dropped, by direction (in: from the tunnel) and reason.",
            )
            .encode(&mut e, drops)?;
            let opened: Vec<(Labels, f64)> = s
                .opened_by_rule
                .iter()
                .map(|(rule, n)| (vec![("rule", rule.to_string())], f(*n)))
                .collect();
            Family::counters(
                "cyphonic_policy_flows_opened",
                "Flows the per-device policy let open, by rule (its place in the list, from 1).",
            )
            .encode(&mut e, opened)?;
            Family::counters(
                "cyphonic_policy_flows_removed",
                "Flows the policy forgot, by why: expired, evicted (the table was full), cut (the rules changed).",
            )
            .encode(
                &mut e,
                vec![
                    (vec![("why", "expired".to_owned())], f(s.expired)),
                    (vec![("why", "evicted".to_owned())], f(s.evicted)),
                    (vec![("why", "cut".to_owned())], f(s.cut)),
                ],
            )?;
        }
        gauge(
            &mut e,
            "cyphonic_buffers_allocated",
            "Packet buffers allocated so far (the most ever in use).",
            f(self.shared.pool().allocated() as u64),
        )?;
        gauge(
            &mut e,
            "cyphonic_buffers_free",
            "Packet buffers free now.",
            f(self.shared.pool().free() as u64),
        )
    }
}

/// What each [`Wait`] histogram measures.
const fn wait_help(w: Wait) -> &'static str {
    match w {
        Wait::Socket => {
            "How long packets waited in the kernel (backlog and socket queue) before the pipeline's edge read them."
        }
        Wait::SocketExpress => {
            "How long the express lane's packets (sparse flows) waited in the kernel before the pipeline's edge read them."
        }
        Wait::Batching => "How long packets waited for their batch to leave the sequencer.",
        Wait::Queued => "How long batches waited for a worker thread (0 when processed inline).",
        Wait::Processing => "How long batches took to seal or open and reach the emitter.",
        Wait::Total => {
            "How long packets took through the pipeline, from joining a batch to the sink."
        }
    }
}

/// The labels of a pipeline's row.
fn direction(d: &str) -> [(&'static str, String); 1] {
    [("direction", d.to_owned())]
}

/// A histogram whose bucket i counts waits below 2^i microseconds (the last: the rest), with
/// the mean wait for its sum.
struct Log2Us {
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum: f64,
}

impl Log2Us {
    fn observed(&self) -> Observed<'_> {
        Observed {
            sum: self.sum,
            count: self.count,
            buckets: &self.buckets,
        }
    }
}

/// [`Log2Us`] of `counts` and their `mean`.
fn log2_us(counts: &[u64; HOLD_BUCKETS], mean: Option<std::time::Duration>) -> Log2Us {
    let buckets: Vec<(f64, u64)> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let bound = if i + 1 == HOLD_BUCKETS {
                f64::MAX
            } else {
                f64::from(1u32 << i) / 1e6
            };
            (bound, *n)
        })
        .collect();
    let count: u64 = counts.iter().sum();
    #[expect(
        clippy::cast_precision_loss,
        reason = "a packet count, for a sum in seconds"
    )]
    let sum = mean.map_or(0.0, |m| m.as_secs_f64() * count as f64);
    Log2Us {
        buckets,
        count,
        sum,
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use cyphonic_telemetry::metrics::{Registry, render};

    use super::*;

    /// The edge's counters: one drop, one refusal, one plain counter.
    #[derive(Debug)]
    struct Edge;

    impl CounterSet for Edge {
        fn snapshot(&self) -> Vec<(&'static str, u64)> {
            vec![("drop_lan_full", 3), ("lease_refused", 2), ("lan_sent", 7)]
        }

        fn helps(&self) -> Vec<(&'static str, &'static str)> {
            vec![
                ("drop_lan_full", "Frames the LAN had no room for."),
                ("lease_refused", "Leases refused."),
                ("lan_sent", "Frames sent on the LAN."),
            ]
        }
    }

    /// The value of the sample `name{labels}` (as written, labels in order) in `text`,
    /// strictly: none when no such line is there.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// One scrape of an engine with a peer that has keys: the peer's rows, the edge's
    /// counters as rows of the shared families beside the engine's, both pipelines, the
    /// buffers.
    #[test]
    fn a_scrape_shows_the_peer_the_edge_and_the_pipelines() {
        let (a, _b) = cyphonic_tunnel::testing::keyed(cyphonic_crypto::Backend::Ring, 64);
        a.counters().udp_sent.fetch_add(5, Ordering::Relaxed);
        let egress = Arc::new(PipelineCounters::default());
        let ingress = Arc::new(PipelineCounters::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(EngineCollector::new(
            a.clone(),
            Arc::new(Edge),
            egress,
            ingress,
            None,
        )));
        let text = render(&registry).expect("a scrape");
        let peer = "peer=\"gw2.ovl.example\"";
        for (series, value) in [
            ("cyphonic_peers".to_owned(), 1.0),
            (format!("cyphonic_peer_up{{{peer}}}"), 1.0),
            (
                "cyphonic_dropped_total{reason=\"lan_full\"}".to_owned(),
                3.0,
            ),
            ("cyphonic_refusals_total{what=\"lease\"}".to_owned(), 2.0),
            ("cyphonic_lan_sent_total".to_owned(), 7.0),
            ("cyphonic_udp_sent_total".to_owned(), 5.0),
            (
                "cyphonic_pipeline_submitted_total{direction=\"egress\"}".to_owned(),
                0.0,
            ),
            (
                "cyphonic_pipeline_dropped_total{direction=\"ingress\",reason=\"replay\"}"
                    .to_owned(),
                0.0,
            ),
            ("cyphonic_buffers_allocated".to_owned(), 0.0),
        ] {
            assert_eq!(sample(&text, &series), Some(value), "{series} in:\n{text}");
        }
        assert!(
            text.contains("# HELP cyphonic_dropped Packets or messages dropped, by reason"),
            "the families' help:\n{text}"
        );
    }
}
