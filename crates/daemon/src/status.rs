//! The status document: what a tunnel end serves on its status socket and its `status`
//! command reads back. One serde type, [`Status`], for both ends of the socket, with a
//! format [`VERSION`]; the edge adds its own part (`E`, flattened in) and its own counters
//! (`C`, in the same `counters` table as the engine's). Also the text the `status` command
//! prints for the parts every tunnel end has.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use cyphonic_pipeline::{DropReason, Stats, Wait};
use cyphonic_telemetry::CounterSet;
use cyphonic_telemetry::status::time_left;
use cyphonic_tunnel::Shared;
use serde::{Deserialize, Serialize};

/// The format of [`Status`]. A new field that older readers may ignore keeps it; a change
/// that would make them misread the document raises it.
pub const VERSION: u32 = 1;

/// The status document of a tunnel end with edge part `E` and edge counters `C`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status<E, C> {
    /// The document's format ([`VERSION`]).
    pub version: u32,
    /// What the edge adds (the adapter's LAN side, the node's TUN side).
    #[serde(flatten)]
    pub edge: E,
    /// When the document was made (unix seconds; 0 from daemons before it was added).
    #[serde(default)]
    pub at: u64,
    /// The program, its version and commit (`cyphonic-adapter 0.1.0 (3f2a9c81d0e4)`;
    /// empty from daemons before it was added).
    #[serde(default)]
    pub software: String,
    /// Our own certificate.
    #[serde(default)]
    pub certificate: Option<CertificateStatus>,
    /// Every peer.
    pub peers: Vec<PeerStatus>,
    /// The control plane, when configured.
    pub cloud: Option<CloudStatus>,
    /// The edge's counters and the engine's, in one table.
    pub counters: CounterTable<C>,
    /// Both pipelines.
    pub pipelines: Pipelines,
    /// The packet buffers.
    pub buffers: Buffers,
    /// The per-device policy, when rules are in force.
    #[serde(default)]
    pub policy: Option<PolicyStatus>,
}

/// The per-device policy: the rules in force, the flow table, what was dropped and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyStatus {
    /// The rule set's version.
    pub version: u64,
    /// Rules in force (one per protocol a written rule allows).
    pub rules: usize,
    /// Flows kept now.
    pub flows: usize,
    /// Flows kept at most.
    pub capacity: usize,
    /// Packets let through.
    pub passed: u64,
    /// Flows opened.
    pub opened: u64,
    /// Flows opened, by rule number (its place in the list, from 1).
    pub opened_by_rule: BTreeMap<u32, u64>,
    /// Packets dropped, by reason (`no_rule`, `no_flow`, `stray`, `wrong_way`, `malformed`).
    pub dropped: BTreeMap<String, u64>,
    /// Of those, the packets that came from the tunnel, by reason.
    pub dropped_in: BTreeMap<String, u64>,
    /// Flows forgotten after their timeout.
    pub expired: u64,
    /// Flows evicted (the oldest) to make room.
    pub evicted: u64,
    /// Flows cut because the rules changed.
    pub cut: u64,
    /// Of the flows opened, TCP connections taken up in the middle (begun before the rules
    /// were enforced, or evicted, and allowed by a rule).
    #[serde(default)]
    pub picked_up: u64,
    /// Connections taken up from their answering side that the opener's side did not have
    /// (its RST dropped), or did not confirm in time.
    #[serde(default)]
    pub picked_up_refused: u64,
}

impl From<&cyphonic_tunnel::PolicyReport> for PolicyStatus {
    fn from(r: &cyphonic_tunnel::PolicyReport) -> Self {
        use cyphonic_tunnel::policy::Reason;
        let s = &r.stats;
        let by_reason = |get: &dyn Fn(Reason) -> u64| {
            Reason::ALL
                .iter()
                .map(|r| (r.name().to_owned(), get(*r)))
                .collect()
        };
        Self {
            version: r.version,
            rules: r.rules,
            flows: r.flows,
            capacity: r.capacity,
            passed: s.passed,
            opened: s.opened,
            opened_by_rule: s.opened_by_rule.iter().map(|(k, v)| (*k, *v)).collect(),
            dropped: by_reason(&|r| s.dropped(r)),
            dropped_in: by_reason(&|r| s.dropped_in(r)),
            expired: s.expired,
            evicted: s.evicted,
            cut: s.cut,
            picked_up: s.picked_up,
            picked_up_refused: s.picked_up_refused,
        }
    }
}

/// The edge's counters and the engine's, read as one table.
#[derive(Debug, Serialize, Deserialize)]
pub struct CounterTable<C> {
    /// The edge's.
    #[serde(flatten)]
    pub edge: C,
    /// The engine's.
    #[serde(flatten)]
    pub engine: cyphonic_tunnel::EngineCounters,
}

impl<C: CounterSet> CounterTable<C> {
    /// Every counter with its name: the edge's, then the engine's.
    pub fn all(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.edge.snapshot();
        v.extend(self.engine.snapshot());
        v
    }
}

/// A certificate: whose it is, what it certifies and when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateStatus {
    /// The name it certifies.
    pub name: String,
    /// The vIP blocks it certifies, IPv4 and IPv6 (empty from a daemon before them).
    #[serde(default)]
    pub blocks: Vec<String>,
    /// Its fingerprint (hex), as revocation lists name it.
    pub fingerprint: String,
    /// When it ends (unix seconds, exclusive).
    pub not_after: u64,
}

impl CertificateStatus {
    /// What the document shows of `cert`.
    pub fn of(cert: &cyphonic_crypto::Certificate) -> Self {
        Self {
            name: cert.body().name.clone(),
            blocks: cert
                .body()
                .vip_blocks
                .iter()
                .map(ToString::to_string)
                .collect(),
            fingerprint: cert.fingerprint().to_string(),
            not_after: cert.body().not_after,
        }
    }
}

/// One peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Its FQDN.
    pub name: String,
    /// How we know it: `static` or `cloud`.
    pub origin: String,
    /// `direct` or `relay`.
    pub route: String,
    /// The relay channel, when relayed.
    pub relay: Option<RelayStatus>,
    /// Which way flows may start with it, as the cloud said when it paired us: `both`,
    /// `out` (we open, it answers) or `in` (it opens, we answer); absent when the cloud
    /// enforces nothing per device (or for a static peer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<cyphonic_signal::Allowed>,
    /// The vIP blocks its certificate certifies.
    pub vip_blocks: Vec<String>,
    /// Where it is reached.
    pub endpoint: Option<String>,
    /// Whether it has keys now.
    pub established: bool,
    /// Seconds since its last completed handshake.
    pub last_handshake_secs_ago: Option<u64>,
    /// Inner packets sent to it.
    pub tx_packets: u64,
    /// Inner bytes sent to it.
    pub tx_bytes: u64,
    /// Inner packets received from it.
    pub rx_packets: u64,
    /// Inner bytes received from it.
    pub rx_bytes: u64,
    /// When its certificate ends (unix seconds): the earlier of the one we know it by and
    /// the one it presented. 0 from daemons before it was added.
    #[serde(default)]
    pub certificate_expires: u64,
    /// The fingerprint of its current certificate (what revocation lists name); empty from
    /// daemons before it was added.
    #[serde(default)]
    pub fingerprint: String,
    /// The tunnel version its keys run at (docs/protocol.md §2, *Versions*): below our
    /// newest, the peer runs an older release. Absent without keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_version: Option<u8>,
    /// Why no tunnel can be made with it, when versions are the reason: `no common tunnel
    /// version: it speaks 5 to 6, we 4 to 4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_problem: Option<String>,
}

/// A peer's relay channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayStatus {
    /// The channel's address.
    pub address: String,
    /// Why the cloud chose the relay.
    pub reason: String,
    /// The channel's address at the relay, when it is carried over the relay's stream (UDP
    /// to the cloud fails): `address` is then this host's end of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
}

/// The control plane as we see it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudStatus {
    /// The cloud instance of the session (the configured addresses until one answered).
    pub address: String,
    /// Whether the control session is open.
    pub connected: bool,
    /// Why it last closed or was refused.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Our tunnel socket as the cloud sees it.
    #[serde(default)]
    pub observed: Option<String>,
    /// Whether UDP to the cloud works, once the probes said (relay channels go over the
    /// relay's stream while it does not).
    #[serde(default)]
    pub udp: Option<bool>,
    /// What our router said of a mapping of the tunnel port (docs/protocol.md §4, *Port
    /// mapping*): held at an endpoint, or refused with a reason; none asked or answered.
    #[serde(default)]
    pub mapping: Option<cyphonic_control::Mapping>,
}

/// Both pipelines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pipelines {
    /// Into the tunnel.
    pub egress: PipelineStatus,
    /// Out of the tunnel.
    pub ingress: PipelineStatus,
}

/// One pipeline's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineStatus {
    /// Packets that entered it.
    pub submitted: u64,
    /// Packets it emitted, in order.
    pub emitted: u64,
    /// Packets refused because the in-flight budget was spent (bytes, time or batch
    /// buffers).
    pub rejected_full: u64,
    /// Of those, refused for the bytes in flight (`dataplane.in_flight_bytes`).
    pub rejected_bytes: u64,
    /// Of those, refused because the oldest batch in flight was out too long
    /// (`dataplane.in_flight_ms`).
    pub rejected_late: u64,
    /// Batch buffers made so far: the most batches a burst needed in flight at once.
    pub batch_buffers: u64,
    /// Batches that left its sequencer.
    pub batches: u64,
    /// Of those, batches processed on the receiving thread.
    pub inline_batches: u64,
    /// Packets emitted out of arrival order (0 with ordering on).
    pub out_of_order: u64,
    /// Packets of sparse flows sent at once, ahead of bulk flows' batches (egress), or
    /// frames flagged sparse opened at once (ingress).
    #[serde(default)]
    pub express: u64,
    /// Of those, packets a thread of their own read from a socket of their own (ingress:
    /// the tunnel socket's sparse companion, `dataplane.sparse_socket`).
    #[serde(default)]
    pub lane: u64,
    /// Packets the reorder ring held for earlier ones.
    pub held_packets: u64,
    /// Their mean hold time, microseconds.
    pub mean_hold_us: f64,
    /// Most batches the reorder ring held at once.
    pub ring_depth_max: u64,
    /// Packets dropped, by reason.
    pub drops: BTreeMap<String, u64>,
    /// Hold times: bucket i counts holds below 2^i microseconds.
    pub hold_histogram_log2_us: Vec<u64>,
    /// Where packets waited, by stage (`batching`, `queued`, `processing`, `total`).
    pub waits: BTreeMap<String, WaitStatus>,
}

/// One stage's waits in a pipeline ([`cyphonic_pipeline::Wait`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WaitStatus {
    /// Packets counted.
    pub packets: u64,
    /// Their mean wait, microseconds.
    pub mean_us: f64,
    /// Bucket i counts waits below 2^i microseconds.
    pub histogram_log2_us: Vec<u64>,
}

impl From<&Stats> for PipelineStatus {
    fn from(s: &Stats) -> Self {
        Self {
            submitted: s.submitted,
            emitted: s.emitted,
            rejected_full: s.rejected_full,
            rejected_bytes: s.rejected_bytes,
            rejected_late: s.rejected_late,
            batch_buffers: s.batch_buffers,
            batches: s.batches,
            inline_batches: s.inline_batches,
            out_of_order: s.out_of_order,
            express: s.express,
            lane: s.lane,
            held_packets: s.held_packets,
            mean_hold_us: s.mean_hold().map_or(0.0, |d| d.as_secs_f64() * 1e6),
            ring_depth_max: s.ring_depth_max,
            drops: DropReason::ALL
                .iter()
                .map(|r| (r.name().to_owned(), s.dropped(*r)))
                .collect(),
            hold_histogram_log2_us: s.hold_histogram.to_vec(),
            waits: Wait::ALL
                .iter()
                .map(|w| {
                    let status = WaitStatus {
                        packets: s.waited(*w),
                        mean_us: s.mean_wait(*w).map_or(0.0, |d| d.as_secs_f64() * 1e6),
                        histogram_log2_us: s.waits[w.index()].to_vec(),
                    };
                    (w.name().to_owned(), status)
                })
                .collect(),
        }
    }
}

/// A DNS service's state (the adapter's on its gateway vIP, the node's stub).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsStatus {
    /// Where it listens (the node's stub; the adapter's answers on its gateway vIP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// The upstream resolvers it forwards to.
    pub upstream: Vec<String>,
    /// Its counters.
    #[serde(flatten)]
    pub stats: cyphonic_resolver::Stats,
}

impl DnsStatus {
    /// The text line the `status` commands print.
    pub fn text(&self) -> String {
        let s = &self.stats;
        format!(
            "queries {}  authoritative {}  asked {}  nxdomain {}  refused {}  servfail {}  dropped {}  rebinding {}",
            s.queries,
            s.authoritative,
            s.asked,
            s.nxdomain,
            s.refused,
            s.servfail,
            s.dropped,
            s.rebinding
        )
    }
}

/// The packet buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buffers {
    /// Allocated so far (the most ever in use).
    pub allocated: usize,
    /// Free now.
    pub free: usize,
}

/// Every peer of `shared` as the document shows it (`carried`: the relay channels carried
/// over a stream).
pub fn peers(
    shared: &Shared,
    now: Instant,
    carried: Option<&cyphonic_stream::Carried>,
) -> Vec<PeerStatus> {
    shared
        .peers()
        .all()
        .iter()
        .map(|slot| {
            let relay = slot.relay_in_use().map(|r| RelayStatus {
                address: r.address.to_string(),
                reason: r.reason.describe().to_owned(),
                stream: carried
                    .and_then(|c| c.channel_of(r.address))
                    .map(|a| a.to_string()),
            });
            let allowed = slot.route().allowed;
            let current = slot.current_certificate();
            let p = slot.lock();
            PeerStatus {
                name: slot.name.clone(),
                origin: slot.origin.to_owned(),
                route: if relay.is_some() { "relay" } else { "direct" }.to_owned(),
                relay,
                allowed,
                vip_blocks: slot.blocks.iter().map(ToString::to_string).collect(),
                endpoint: p.endpoint().map(|e| e.to_string()),
                established: p.is_established(now),
                last_handshake_secs_ago: p
                    .last_handshake()
                    .map(|t| now.saturating_duration_since(t).as_secs()),
                tx_packets: slot.tx_packets.load(Relaxed),
                tx_bytes: slot.tx_bytes.load(Relaxed),
                rx_packets: slot.rx_packets.load(Relaxed),
                rx_bytes: slot.rx_bytes.load(Relaxed),
                certificate_expires: current.body().not_after,
                fingerprint: current.fingerprint().to_string(),
                tunnel_version: p.session_version(now),
                version_problem: p.version_to_speak().err().map(|e| e.to_string()),
            }
        })
        .collect()
}

/// Every peer of `shared` as the cloud is told of it (docs/protocol.md §8, *Devices and
/// tunnels*); `unix` is `now` on the wall clock.
pub fn tunnels(shared: &Shared, now: Instant, unix: u64) -> Vec<cyphonic_control::TunnelReport> {
    use cyphonic_control::TunnelPath;
    shared
        .peers()
        .all()
        .iter()
        .map(|slot| {
            let reason = slot.relay_in_use().map(|r| r.reason);
            let peer = slot.current_certificate().fingerprint().to_string();
            let p = slot.lock();
            cyphonic_control::TunnelReport {
                peer,
                name: slot.name.clone(),
                path: if reason.is_some() {
                    TunnelPath::Relay
                } else {
                    TunnelPath::Direct
                },
                reason,
                endpoint: p.endpoint(),
                established: p.is_established(now),
                handshake: p
                    .last_handshake()
                    .map(|t| unix.saturating_sub(now.saturating_duration_since(t).as_secs())),
                tx_bytes: slot.tx_bytes.load(Relaxed),
                rx_bytes: slot.rx_bytes.load(Relaxed),
            }
        })
        .collect()
}

/// The cloud line and the peers table, as text for a terminal.
pub fn peers_text<E, C>(doc: &Status<E, C>) -> String {
    let mut out = String::new();
    if let Some(c) = &doc.certificate {
        let _ = writeln!(
            out,
            "certificate {} ({})  expires in {} (unix {})  fingerprint {}",
            c.name,
            c.blocks.join(" "),
            time_left(c.not_after, doc.at),
            c.not_after,
            c.fingerprint
        );
    }
    if let Some(c) = &doc.cloud {
        let _ = writeln!(
            out,
            "cloud {}  {}{}{}{}",
            c.address,
            if c.connected {
                "connected"
            } else {
                "NOT CONNECTED"
            },
            c.observed
                .as_ref()
                .map(|o| format!("  our tunnel socket as it sees it: {o}"))
                .unwrap_or_default(),
            c.mapping
                .as_ref()
                .map(|m| match m {
                    cyphonic_control::Mapping::Mapped { protocol, endpoint } => {
                        format!("  port mapping: {endpoint} ({protocol})")
                    }
                    cyphonic_control::Mapping::Refused { protocol, reason } => {
                        format!("  port mapping refused ({protocol}): {reason}")
                    }
                })
                .unwrap_or_default(),
            c.last_error
                .as_ref()
                .map(|e| format!("  last error: {e}"))
                .unwrap_or_default()
        );
    }
    if let Some(p) = &doc.policy {
        let dropped: Vec<String> = p
            .dropped
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "policy version {:x}  rules {}  flows {}/{}  opened {}  dropped {}",
            p.version,
            p.rules,
            p.flows,
            p.capacity,
            p.opened,
            if dropped.is_empty() {
                "none".to_owned()
            } else {
                dropped.join(", ")
            }
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<28} {:<7} {:<18} {:<24} {:<34} {:<5} {:<7} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8}",
        "PEER",
        "ORIGIN",
        "VIP BLOCK",
        "ENDPOINT",
        "ROUTE",
        "UP",
        "ALLOWED",
        "HANDSHAKE",
        "TX",
        "RX",
        "TX PKTS",
        "RX PKTS",
        "EXPIRES"
    );
    for p in &doc.peers {
        let route = p.relay.as_ref().map_or_else(
            || "direct".to_owned(),
            |r| match &r.stream {
                Some(_) => format!("relay over TCP ({})", r.reason),
                None => format!("relay ({})", r.reason),
            },
        );
        let _ = writeln!(
            out,
            "{:<28} {:<7} {:<18} {:<24} {:<34} {:<5} {:<7} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8}",
            p.name,
            p.origin,
            p.vip_blocks.first().map_or("-", String::as_str),
            p.endpoint.as_deref().unwrap_or("-"),
            route,
            if p.established { "yes" } else { "no" },
            p.allowed.map_or("-", cyphonic_signal::Allowed::name),
            p.last_handshake_secs_ago
                .map_or_else(|| "never".to_owned(), cyphonic_telemetry::status::ago),
            cyphonic_telemetry::status::bytes(p.tx_bytes),
            cyphonic_telemetry::status::bytes(p.rx_bytes),
            p.tx_packets,
            p.rx_packets,
            time_left(p.certificate_expires, doc.at)
        );
        if let Some(problem) = &p.version_problem {
            let _ = writeln!(out, "  {}: {problem}", p.name);
        }
    }
    out
}

/// The counters that are not zero and the pipelines' order figures, as text.
pub fn counters_text<E, C: CounterSet>(doc: &Status<E, C>) -> String {
    let mut out = String::from("counters (non-zero):\n");
    for (k, v) in doc.counters.all().into_iter().filter(|(_, v)| *v != 0) {
        let _ = writeln!(out, "  {k:<28} {v}");
    }
    for (dir, p) in [
        ("egress", &doc.pipelines.egress),
        ("ingress", &doc.pipelines.ingress),
    ] {
        let _ = write!(
            out,
            "pipeline {dir}: emitted {} express {} lane {} out_of_order {} held {} mean_hold_us {:.1}",
            p.emitted, p.express, p.lane, p.out_of_order, p.held_packets, p.mean_hold_us
        );
        // Mean waits, by stage, where packets went through.
        for (stage, w) in p.waits.iter().filter(|(_, w)| w.packets > 0) {
            let _ = write!(out, " {stage}_us {:.1}", w.mean_us);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    cyphonic_telemetry::counters! {
        /// Test counters.
        pub struct EdgeCounters {
            /// Frames seen.
            frames,
        }
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Edge {
        thing: String,
    }

    /// The document reads back as it was written, the edge's part and counters where the
    /// readers of the JSON expect them, and what the text shows comes from it.
    #[test]
    fn the_document_reads_back_and_keeps_its_shape() {
        let edge_counters = EdgeCounters::default();
        edge_counters.frames.store(3, Relaxed);
        let engine = cyphonic_tunnel::EngineCounters::default();
        engine.udp_sent.store(5, Relaxed);
        let doc = Status {
            version: VERSION,
            edge: Edge { thing: "x".into() },
            peers: vec![PeerStatus {
                name: "gw2.ovl.example".into(),
                origin: "static".into(),
                route: "relay".into(),
                relay: Some(RelayStatus {
                    address: "192.0.2.10:40000".into(),
                    reason: "symmetric NAT".into(),
                    stream: None,
                }),
                allowed: Some(cyphonic_signal::Allowed::Out),
                vip_blocks: vec!["100.64.2.0/24".into()],
                endpoint: Some("203.0.113.2:51820".into()),
                established: true,
                last_handshake_secs_ago: Some(4),
                tx_packets: 1,
                tx_bytes: 2,
                rx_packets: 3,
                rx_bytes: 1_500_000,
                certificate_expires: 1_000_000 + 9 * 3600,
                fingerprint: "cd".repeat(32),
                tunnel_version: Some(4),
                version_problem: Some(
                    "no common tunnel version: it speaks 5 to 6, we 4 to 4".into(),
                ),
            }],
            at: 1_000_000,
            software: "cyphonic-node 0.1.0".into(),
            certificate: Some(CertificateStatus {
                name: "gw1.ovl.example".into(),
                blocks: vec!["100.64.1.0/24".into(), "fd7a:0:1::/56".into()],
                fingerprint: "ab".repeat(32),
                not_after: 1_000_000 + 30 * 86_400 + 5,
            }),
            cloud: Some(CloudStatus {
                address: "192.0.2.10:7000".into(),
                connected: true,
                mapping: Some(cyphonic_control::Mapping::Mapped {
                    protocol: cyphonic_control::MapProtocol::Pcp,
                    endpoint: "198.51.100.2:51820".parse().unwrap(),
                }),
                ..CloudStatus::default()
            }),
            counters: CounterTable {
                edge: edge_counters,
                engine,
            },
            pipelines: Pipelines::default(),
            buffers: Buffers {
                allocated: 10,
                free: 7,
            },
            policy: Some(PolicyStatus {
                version: 0xabc,
                rules: 3,
                flows: 2,
                capacity: 16,
                dropped: [("no_rule".to_owned(), 4), ("stray".to_owned(), 0)].into(),
                ..PolicyStatus::default()
            }),
        };
        let json = serde_json::to_value(&doc).unwrap();
        assert_eq!(json["policy"]["dropped"]["no_rule"], 4);
        assert_eq!(json["version"], VERSION);
        assert_eq!(json["thing"], "x");
        assert_eq!(json["counters"]["frames"], 3);
        assert_eq!(json["counters"]["udp_sent"], 5);
        assert_eq!(json["peers"][0]["relay"]["reason"], "symmetric NAT");
        assert_eq!(json["peers"][0]["allowed"], "out");
        assert_eq!(json["peers"][0]["tunnel_version"], 4);
        assert_eq!(json["buffers"]["free"], 7);
        assert_eq!(json["software"], "cyphonic-node 0.1.0");
        assert_eq!(json["cloud"]["mapping"]["result"], "mapped");
        let back: Status<Edge, EdgeCounters> = serde_json::from_value(json).unwrap();
        assert_eq!(back.software, doc.software);
        assert_eq!(back.edge, doc.edge);
        assert_eq!(back.peers, doc.peers);
        assert_eq!(back.counters.all(), doc.counters.all());
        let text = counters_text(&back);
        assert!(
            text.contains("frames") && text.contains("udp_sent"),
            "{text}"
        );
        assert!(!text.contains("udp_received"), "zeros are left out: {text}");
        let table = peers_text(&back);
        assert!(table.contains("relay (symmetric NAT)"), "{table}");
        assert!(
            table.contains(
                "\n  gw2.ovl.example: no common tunnel version: it speaks 5 to 6, we 4 to 4\n"
            ),
            "{table}"
        );
        assert!(
            table.contains("port mapping: 198.51.100.2:51820 (PCP)"),
            "{table}"
        );
        assert!(table.contains(" yes   out  "), "{table}");
        // The handshake's age and the bytes each way, as people read them.
        let row = table
            .lines()
            .find(|l| l.starts_with("gw2.ovl.example"))
            .unwrap();
        assert!(
            row.ends_with("       4s       2 B    1.5 MB          1          3       9h"),
            "{table}"
        );
        assert!(
            table.contains(
                "certificate gw1.ovl.example (100.64.1.0/24 fd7a:0:1::/56)  expires in 30d"
            ),
            "{table}"
        );
        assert!(
            table
                .contains("policy version abc  rules 3  flows 2/16  opened 0  dropped no_rule 4\n"),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("gw2.ovl.example") && l.ends_with(" 9h")),
            "{table}"
        );
        // A document from an older daemon, without the new fields, still reads.
        let mut old = serde_json::to_value(&doc).unwrap();
        old["certificate"].as_object_mut().unwrap().remove("blocks");
        let back: Status<Edge, EdgeCounters> = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(back.certificate.map(|c| c.blocks), Some(Vec::new()));
        old.as_object_mut().unwrap().remove("certificate");
        old.as_object_mut().unwrap().remove("policy");
        old.as_object_mut().unwrap().remove("at");
        old["peers"][0]
            .as_object_mut()
            .unwrap()
            .remove("certificate_expires");
        for field in ["tunnel_version", "version_problem"] {
            old["peers"][0].as_object_mut().unwrap().remove(field);
        }
        let back: Status<Edge, EdgeCounters> = serde_json::from_value(old).unwrap();
        assert_eq!((back.at, back.peers[0].certificate_expires), (0, 0));
        assert_eq!(
            (back.peers[0].tunnel_version, &back.peers[0].version_problem),
            (None, &None)
        );
        assert!(peers_text(&back).lines().any(|l| l.ends_with(" -")));
    }
}
