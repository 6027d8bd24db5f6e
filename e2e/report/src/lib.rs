//! What `cyphonic-bed bench`, `peers` and `attack` measured, as data: the bed (cyphonic-e2e)
//! prints these as JSON, and `cargo xtask bench` renders them into docs/benchmarks.md. A
//! crate of its own so that xtask reads them without building the bed and its dependencies.
//! The figures are taken in cyphonic-e2e; the prose and tables around them are xtask's.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// The time now, UTC, to the minute (`2026-11-23 15:19 UTC`).
pub fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// This machine's CPU and its cores (`Intel Xeon ..., 2 cores`).
pub fn cpu() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    format!("{model}, {cores} cores")
}

/// The running kernel's release.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Where and when a report was measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measured {
    /// UTC, to the minute.
    pub date: String,
    /// The CPU, its cores, the kernel.
    pub machine: String,
    /// Seconds per TCP measurement.
    pub seconds: u64,
}

/// One bed measured in the main profile (GRO off on the gateways' LAN side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// TCP, 1 stream.
    pub tcp1: Tcp,
    /// TCP, 4 streams.
    pub tcp4: Tcp,
    /// The most UDP received with under 1% loss; `None` when even the lowest rate lost more.
    pub udp: Option<Udp>,
    /// Every UDP rate tried on the way there.
    pub udp_tried: Vec<Udp>,
    /// UDP offered as fast as iperf3 sends (`-b 0`).
    pub overload: Udp,
    /// 1400-byte datagrams, fragmented by the LAN host at the inner MTU.
    pub big: Udp,
    /// Ping RTT, idle.
    pub idle: PingStats,
    /// Ping RTT while one TCP stream runs.
    pub loaded: PingStats,
}

/// A bed in a quicker profile (GRO on, or busy polling): TCP and RTT only.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quick {
    /// TCP, 1 stream.
    pub tcp1: Tcp,
    /// TCP, 4 streams.
    pub tcp4: Tcp,
    /// Ping RTT, idle.
    pub idle: PingStats,
    /// Ping RTT while one TCP stream runs.
    pub loaded: PingStats,
}

/// One run of the ordering ablation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ablation {
    /// TCP, 1 stream.
    pub tcp1: Tcp,
    /// TCP, 4 streams.
    pub tcp4: Tcp,
    /// Packets adapter A's egress pipeline emitted out of order.
    pub out_of_order: u64,
}

/// The ordering ablation at one batch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AblationRow {
    /// `dataplane.batch_size`.
    pub batch: usize,
    /// `ordering = true`.
    pub ordered: Ablation,
    /// `ordering = false`.
    pub unordered: Ablation,
}

/// What adapter A did with GRO-merged frames in the GRO-on runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// Coalesced frames taken.
    pub coalesced: u64,
    /// Segments cut from them.
    pub segments: u64,
    /// Coalesced frames that could not be cut.
    pub refused: u64,
    /// Packets emitted out of order.
    pub out_of_order: u64,
}

/// `cyphonic-bed bench`: plain kernel routing against the tunnel, the ordering ablation,
/// the GRO-on profile and busy polling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Where and when.
    pub measured: Measured,
    /// TCP runs per figure (the median is reported).
    pub runs: usize,
    /// UDP datagram size, bytes.
    pub udp_size: usize,
    /// Halvings of the gap around 1% loss in the UDP search.
    pub udp_refine: usize,
    /// The inner MTU the LAN host fragments the big datagrams at.
    pub inner_mtu: u16,
    /// Offered rate of the big datagrams, Mbit/s.
    pub big_rate: u64,
    /// `dataplane.busy_poll_us` of the busy-polling runs.
    pub busy_poll_us: u32,
    /// Plain routing, GRO off.
    pub plain: Profile,
    /// The tunnel, GRO off.
    pub tunnel: Profile,
    /// Packets adapter A's egress pipeline emitted out of order in the tunnel runs.
    pub tunnel_out_of_order: u64,
    /// The ordering ablation, by batch size.
    pub ablation: Vec<AblationRow>,
    /// Plain routing, GRO on.
    pub plain_gro: Quick,
    /// The tunnel, GRO on.
    pub tunnel_gro: Quick,
    /// Adapter A's cutting in the GRO-on tunnel runs.
    pub cut: Cut,
    /// The tunnel with busy polling, GRO off.
    pub busy_off: Quick,
    /// The tunnel with busy polling, GRO on.
    pub busy_on: Quick,
}

/// `cyphonic-bed latency-table`: issue 24's latency rows in one run. Columns alternate
/// within each round (plain routing, the commit before if given, the tunnel at its
/// defaults, the tunnel with each extra setting), so that their ratios share the hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyReport {
    /// Where and when (`seconds`: of each loaded phase, 100 pings a second).
    pub measured: Measured,
    /// Pings in each idle phase, 10 ms apart.
    pub count: usize,
    /// The columns, each with one entry per round.
    pub columns: Vec<LatencyColumn>,
}

/// What a column of [`LatencyReport`] runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LatencyRole {
    /// Plain kernel routing: the floor.
    Plain,
    /// The adapter of an earlier build (the commit before), at its defaults.
    Base,
    /// This build at its defaults.
    Defaults,
    /// This build with extra `[dataplane]` lines.
    Setting,
}

/// One column of [`LatencyReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyColumn {
    /// Its heading (`plain routing`, `defaults`, `realtime_priority = 10`).
    pub name: String,
    /// What it runs.
    pub role: LatencyRole,
    /// One per round.
    pub rounds: Vec<LatencyRound>,
}

/// One round of one column: pings idle, then under one TCP stream whose two ends run at
/// default priority, then at idle priority (`chrt --idle 0`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyRound {
    /// Idle.
    pub idle: PingStats,
    /// Under the stream, its ends at default priority.
    pub loaded: PingStats,
    /// That stream.
    pub stream: Tcp,
    /// Under the stream, its ends at idle priority.
    pub loaded_idle_ends: PingStats,
    /// That stream.
    pub stream_idle_ends: Tcp,
}

/// `cyphonic-bed ipv6`: TCP over IPv4 and over IPv6 through one tunnel, between the same
/// two LAN hosts, the families alternating run by run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ipv6Report {
    /// Where and when.
    pub measured: Measured,
    /// One row per stream count.
    pub rows: Vec<FamilyRow>,
    /// Frames adapter B sent its LAN merged for the kernel to cut (GSO), during the IPv4
    /// runs and during the IPv6 ones.
    pub merged: (u64, u64),
}

/// TCP over each family with one stream count (medians of the runs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FamilyRow {
    /// Parallel streams.
    pub streams: usize,
    /// Over IPv4.
    pub v4: Tcp,
    /// Over IPv6.
    pub v6: Tcp,
}

/// `cyphonic-bed peers`: many nodes against one adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeersReport {
    /// Where and when (`seconds`: of TCP per fleet).
    pub measured: Measured,
    /// One row per fleet size.
    pub rows: Vec<FleetFigures>,
}

/// The adapter under a handshake flood (`cyphonic-bed attack`): one row per offered rate,
/// the first without a flood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttackReport {
    /// Where and when.
    pub measured: Measured,
    /// DHCP DISCOVERs the device on lanB sends a second during each row.
    pub dhcp_per_sec: u64,
    /// The rows, by rate.
    pub rows: Vec<AttackRow>,
}

/// One flood: a replayed initiation sent at B from a forged address, or from many addresses
/// that answer its cookie-replies, while lanA's host runs TCP to lanB's, then pings it, and
/// a device on lanB asks for DHCP offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttackRow {
    /// Initiations a second offered (0: no flood).
    pub rate: u32,
    /// Addresses the flood comes from, each answering B's cookie-replies (0: one forged
    /// address that never does).
    pub sources: u32,
    /// Sent to a closed port of B's, not its tunnel's: the same flood with nothing for B to
    /// do, the control of the row after it.
    pub closed_port: bool,
    /// Initiations sent during the row.
    pub sent: u64,
    /// TCP goodput lanA -> lanB, Gbit/s.
    pub tcp_gbps: f64,
    /// Ping lanA -> lanB after the TCP run, flood still on.
    pub rtt: PingStats,
    /// CPU of B's control thread (timers, DHCP, DNS), % of a core, over the row.
    pub control_cpu_pct: f64,
    /// CPU of B's handshake thread, % of a core.
    pub handshake_cpu_pct: f64,
    /// CPU of B's receive thread (where the handshake gate runs), % of a core.
    pub receive_cpu_pct: f64,
    /// Initiations B's handshake thread checked.
    pub checked: u64,
    /// Cookie-replies B sent.
    pub cookie_replies: u64,
    /// DHCP DISCOVERs the device sent during the row.
    pub dhcp_asked: u64,
    /// DHCP replies B sent during the row.
    pub dhcp_answered: u64,
}

/// Round-trip times from one ping run (NaN without replies; `null` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PingStats {
    /// Requests sent.
    pub sent: usize,
    /// Replies received.
    pub received: usize,
    /// Mean RTT, milliseconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub avg_ms: f64,
    /// Median RTT.
    #[serde(deserialize_with = "nan_if_null")]
    pub p50_ms: f64,
    /// 99th percentile RTT.
    #[serde(deserialize_with = "nan_if_null")]
    pub p99_ms: f64,
}

/// A number that JSON wrote as `null` because it was NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Parses ping's output: one `time=X ms` per reply.
pub fn parse_ping(output: &str, sent: usize) -> PingStats {
    let times: Vec<f64> = output
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next())
        .filter_map(|t| t.parse().ok())
        .collect();
    stats(times, sent)
}

/// Statistics of round-trip times in milliseconds (one per reply) out of `sent` requests.
pub fn stats(mut times: Vec<f64>, sent: usize) -> PingStats {
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if times.is_empty() {
            f64::NAN
        } else {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss,
                reason = "an index into a short list"
            )]
            let i = ((times.len() as f64 * p).ceil() as usize).clamp(1, times.len()) - 1;
            times[i]
        }
    };
    #[expect(clippy::cast_precision_loss, reason = "a count of pings")]
    let avg = if times.is_empty() {
        f64::NAN
    } else {
        times.iter().sum::<f64>() / times.len() as f64
    };
    PingStats {
        sent,
        received: times.len(),
        avg_ms: avg,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    }
}

/// A TCP result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tcp {
    /// Goodput at the receiver, Gbit/s.
    pub gbps: f64,
    /// Retransmitted segments.
    pub retransmits: u64,
}

/// A UDP result at one offered rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Udp {
    /// Offered rate, Mbit/s.
    pub offered_mbps: f64,
    /// Received rate, Mbit/s.
    pub received_mbps: f64,
    /// Lost datagrams, percent.
    pub loss_pct: f64,
    /// Datagrams the receiver saw out of order.
    pub out_of_order: u64,
}

/// What one fleet size measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FleetFigures {
    /// Nodes.
    pub nodes: usize,
    /// Ping from node 0 to the host behind adapter A while every node has a tunnel.
    pub rtt: PingStats,
    /// TCP from every node to the host at once, summed, Gbit/s.
    pub aggregate_gbps: f64,
    /// The slowest node's share of it, Gbit/s.
    pub slowest_gbps: f64,
    /// Adapter A's resident memory afterwards, KiB.
    pub adapter_rss_kib: u64,
    /// Adapter A's threads.
    pub adapter_threads: u64,
    /// Adapter A's CPU time during the TCP run, in percent of one core.
    pub adapter_cpu_pct: f64,
    /// All nodes' CPU time during the TCP run, summed, in percent of one core.
    pub nodes_cpu_pct: f64,
    /// Tunnels adapter A has established.
    pub adapter_peers: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ping_output() {
        let out = "PING 100.64.2.10 (100.64.2.10) 56(84) bytes of data.\n\
                   64 bytes from 100.64.2.10: icmp_seq=1 ttl=62 time=0.412 ms\n\
                   64 bytes from 100.64.2.10: icmp_seq=2 ttl=62 time=0.300 ms\n\
                   64 bytes from 100.64.2.10: icmp_seq=3 ttl=62 time=1.5 ms\n\
                   \n--- 100.64.2.10 ping statistics ---\n";
        let s = parse_ping(out, 4);
        assert_eq!((s.sent, s.received), (4, 3));
        assert!((s.avg_ms - 0.737_333).abs() < 1e-3);
        assert!((s.p50_ms - 0.412).abs() < 1e-9);
        assert!((s.p99_ms - 1.5).abs() < 1e-9);
        assert!(parse_ping("", 5).avg_ms.is_nan());
    }
}
