//! Many peers (the papers' experiment in 000: one responder, many initiators): a fleet of
//! nodes, each in its own namespace on a bridge behind the router, all talking through the
//! cloud to the host behind adapter A.
//!
//! ```text
//! [node 0..N] wan 192.0.2.66+i/26 -- brn 192.0.2.65/26 [wan router] -- [adapter A] -- [lanA host]
//! node i: n<i>.ovl.example, 100.64.(100+i).1
//! ```

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, bail};

pub use cyphonic_report::FleetFigures;

use crate::bed::{Side, TwoSites};
use crate::lan::dig;
use crate::measure::parse_ping;
use crate::node::{Attach, NodeHost, NodeSpec};

/// Nodes at most (the /26 the fleet lives in).
pub const MAX_NODES: usize = 60;

/// The fleet.
#[derive(Debug)]
pub struct Fleet {
    /// The nodes, running.
    pub nodes: Vec<NodeHost>,
}

impl Fleet {
    /// Builds and starts `n` nodes on `bed` (which has the cloud and adapter A running).
    ///
    /// # Errors
    /// Too many nodes, or a node does not come up.
    pub fn start(bed: &TwoSites, n: usize) -> anyhow::Result<Self> {
        Self::start_with(bed, n, false)
    }

    /// [`Fleet::start`], each node with an IPv6 /128 beside its block when `ipv6`: node i's
    /// is fd7a:0:1:4000::(i+1), in the bed's overlay (`bed::OVERLAY6`).
    ///
    /// # Errors
    /// Too many nodes, or a node does not come up.
    pub fn start_with(bed: &TwoSites, n: usize, ipv6: bool) -> anyhow::Result<Self> {
        if n > MAX_NODES {
            bail!("at most {MAX_NODES} nodes");
        }
        let cloud = bed.cloud.as_ref().context("the fleet needs the cloud")?;
        bed.wan
            .ip(&["link", "add", "name", "brn", "type", "bridge"])?;
        bed.wan.ip(&["link", "set", "dev", "brn", "up"])?;
        bed.wan
            .ip(&["addr", "add", "192.0.2.65/26", "dev", "brn"])?;
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let octet = u8::try_from(66 + i).context("node address")?;
            let spec = NodeSpec {
                name: format!("n{i}.ovl.example"),
                block: if ipv6 {
                    format!("100.64.{}.0/24 {}/128", 100 + i, node_ipv6(i))
                } else {
                    format!("100.64.{}.0/24", 100 + i)
                },
                attach: Attach::Bridge {
                    bridge: "brn".into(),
                    port: format!("n{i}"),
                    address: Ipv4Addr::new(192, 0, 2, octet),
                },
            };
            let mut node =
                NodeHost::new(&bed.wan, &bed.bins, &bed.ca_dir(), bed.tmp(), cloud, &spec)?;
            node.start(&bed.bins)?;
            nodes.push(node);
        }
        Ok(Self { nodes })
    }

    /// Every node's log, one after the other (for a failing test's message).
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(NodeHost::log_text)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Makes every node resolve `name` (which builds its tunnel), asking each up to 20 times.
    ///
    /// # Errors
    /// A node never gets an answer.
    pub fn resolve_all(&self, name: &str) -> anyhow::Result<()> {
        for node in &self.nodes {
            let mut ok = false;
            for _ in 0..20 {
                if dig(&node.ns, node.vip, name, "A")
                    .is_ok_and(|d| d.status == "NOERROR" && !d.answers.is_empty())
                {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            if !ok {
                bail!("{} never resolved {name}:\n{}", node.vip, node.log_text());
            }
        }
        Ok(())
    }
}

/// Node `i`'s IPv6 address in a fleet started with IPv6.
pub fn node_ipv6(i: usize) -> std::net::Ipv6Addr {
    let last = u16::try_from(i + 1).unwrap_or(u16::MAX);
    std::net::Ipv6Addr::new(0xfd7a, 0, 1, 0x4000, 0, 0, 0, last)
}

/// The resident memory (KiB) and thread count of process `pid`.
fn process_figures(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

/// The resident memory of process `pid`, KiB (0 when it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    process_figures(pid).0
}

/// CPU time process `pid` has used (user + system), in clock ticks (0 when it is gone).
pub fn cpu_ticks(pid: u32) -> u64 {
    cpu_ticks_of(pid).unwrap_or(0)
}

/// [`cpu_ticks`], read strictly: an error when the process is gone or its line unreadable.
///
/// # Errors
/// No `/proc/PID/stat`, or no user and system times in it.
pub fn cpu_ticks_of(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces, in parentheses): utime is the
    // 14th field of the line, stime the 15th.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("no command name in /proc/PID/stat")?;
    let field = |i| -> anyhow::Result<u64> {
        Ok(rest
            .split_whitespace()
            .nth(i)
            .with_context(|| format!("/proc/{pid}/stat has no field {}", i + 3))?
            .parse()?)
    };
    Ok(field(11)? + field(12)?)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we run on).
pub fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Measures a fleet of `n` nodes against the host behind adapter A: RTT from one node with
/// every tunnel up, then TCP from all nodes at once for `seconds`.
///
/// # Errors
/// A step of the setup or of the measurement fails.
pub fn measure(bed: &TwoSites, n: usize, seconds: u64) -> anyhow::Result<FleetFigures> {
    let fleet = Fleet::start(bed, n)?;
    fleet.resolve_all("host.gw1.ovl.example")?;
    let host = bed.a.host_ip.to_string();
    let first = &fleet.nodes[0];
    // Warm up (ARP on the LAN), then 300 pings 10 ms apart.
    first
        .ns
        .exec_output("ping", &["-c", "3", "-i", "0.1", &host])?;
    let out = first
        .ns
        .exec_output("ping", &["-c", "300", "-i", "0.01", "-W", "1", &host])?;
    let rtt = parse_ping(&String::from_utf8_lossy(&out.stdout), 300);

    let servers: Vec<crate::Proc> = (0..n)
        .map(|i| {
            let port = (5201 + i).to_string();
            bed.a
                .lan
                .spawn("iperf3", &["-s", "-1", "-p", &port, "--idle-timeout", "30"])
        })
        .collect::<anyhow::Result<_>>()?;
    std::thread::sleep(Duration::from_millis(500));
    let pid = bed.a.adapter.as_ref().map_or(0, crate::Proc::pid);
    let node_pids: Vec<u32> = fleet
        .nodes
        .iter()
        .map(|n| n.proc.as_ref().map_or(0, crate::Proc::pid))
        .collect();
    let nodes_ticks = || node_pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>();
    let (ticks_before, nodes_before) = (cpu_ticks(pid), nodes_ticks());
    let started = std::time::Instant::now();
    let secs = seconds.to_string();
    let clients: Vec<crate::Proc> = fleet
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let port = (5201 + i).to_string();
            node.ns
                .spawn("iperf3", &["-J", "-c", &host, "-p", &port, "-t", &secs])
        })
        .collect::<anyhow::Result<_>>()?;
    let mut rates = Vec::with_capacity(n);
    for c in clients {
        let out = c.wait(Duration::from_secs(seconds + 20))?;
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("iperf3: {}", String::from_utf8_lossy(&out.stderr)))?;
        rates.push(
            report["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .unwrap_or(0.0)
                / 1e9,
        );
    }
    #[expect(clippy::cast_precision_loss, reason = "clock ticks of a few seconds")]
    let pct =
        |ticks: u64| 100.0 * ticks as f64 / ticks_per_second() / started.elapsed().as_secs_f64();
    let adapter_cpu_pct = pct(cpu_ticks(pid).saturating_sub(ticks_before));
    let nodes_cpu_pct = pct(nodes_ticks().saturating_sub(nodes_before));
    drop(servers);
    let (adapter_rss_kib, adapter_threads) = process_figures(pid);
    let status = bed.status(Side::A)?;
    let adapter_peers = status["peers"]
        .as_array()
        .map_or(0, |p| p.iter().filter(|p| p["established"] == true).count());
    Ok(FleetFigures {
        nodes: n,
        rtt,
        aggregate_gbps: rates.iter().sum(),
        slowest_gbps: rates.iter().copied().fold(f64::INFINITY, f64::min),
        adapter_rss_kib,
        adapter_threads,
        adapter_cpu_pct,
        nodes_cpu_pct,
        adapter_peers,
    })
}
