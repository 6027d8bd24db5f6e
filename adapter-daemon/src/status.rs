//! The local status socket: `cyphonic-adapter status` reads a JSON document from it. The
//! socket is created with mode 0600: only root (the daemon's user) may read it.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cyphonic_pipeline::{Counters as PipelineCounters, DropReason, Stats};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::net::UnixListener;

use crate::daemon::Shared;

/// What does not change while the daemon runs.
#[derive(Debug)]
pub struct Static {
    /// Our FQDN.
    pub name: String,
    /// The LAN interface.
    pub lan_interface: String,
    /// The tunnel socket's address.
    pub listen: String,
    /// The gateway vIP.
    pub gateway_vip: String,
    /// Our block.
    pub lan_block: String,
    /// When the daemon started.
    pub started: Instant,
    /// The pipelines' counters.
    pub egress: Arc<PipelineCounters>,
    /// The pipelines' counters.
    pub ingress: Arc<PipelineCounters>,
}

/// Binds the status socket (replacing a stale one), mode 0600.
///
/// # Errors
/// The directory cannot be created or the socket bound.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers every connection with one JSON document.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>, info: Arc<Static>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let doc = snapshot(&shared, &info);
        let mut text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        text.push(b'\n');
        let _ = stream.write_all(&text).await;
    }
}

fn stats_json(s: &Stats) -> Value {
    let drops: serde_json::Map<String, Value> = DropReason::ALL
        .iter()
        .map(|r| (r.name().to_owned(), json!(s.dropped(*r))))
        .collect();
    json!({
        "submitted": s.submitted,
        "emitted": s.emitted,
        "rejected_full": s.rejected_full,
        "batches": s.batches,
        "out_of_order": s.out_of_order,
        "held_packets": s.held_packets,
        "mean_hold_us": s.mean_hold().map_or(0.0, |d| d.as_secs_f64() * 1e6),
        "ring_depth_max": s.ring_depth_max,
        "drops": drops,
        "hold_histogram_log2_us": s.hold_histogram.to_vec(),
    })
}

/// The status document.
pub fn snapshot(shared: &Shared, info: &Static) -> Value {
    let now = Instant::now();
    let peers = shared.tunnel.peers_json(now);
    let (leases, dhcp, dns) = {
        let s = shared
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (s.leases.clone(), s.dhcp.clone(), s.dns.clone())
    };
    let counters: serde_json::Map<String, Value> = shared
        .counters
        .snapshot()
        .into_iter()
        .chain(shared.tunnel.counters.snapshot())
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    json!({
        "adapter": {
            "name": info.name,
            "lan_interface": info.lan_interface,
            "listen": info.listen,
            "gateway_vip": info.gateway_vip,
            "lan_block": info.lan_block,
            "uptime_secs": now.saturating_duration_since(info.started).as_secs(),
            "buffers_allocated": shared.tunnel.pool.allocated(),
            "buffers_free": shared.tunnel.pool.free(),
        },
        "peers": peers,
        "cloud": shared.tunnel.cloud.lock().map_or(Value::Null, |c| c.clone()),
        "leases": leases,
        "dhcp": dhcp,
        "dns": dns,
        "counters": counters,
        "pipelines": {
            "egress": stats_json(&info.egress.snapshot()),
            "ingress": stats_json(&info.ingress.snapshot()),
        },
    })
}

/// Reads the status document from a running daemon.
///
/// # Errors
/// The socket is missing (daemon not running), not permitted, or the answer is not JSON.
pub fn fetch(path: &Path) -> anyhow::Result<Value> {
    use anyhow::Context as _;
    let mut stream = std::os::unix::net::UnixStream::connect(path).with_context(|| {
        format!(
            "connecting to {} (is cyphonic-adapter running? are you root?)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .context("reading the status")?;
    serde_json::from_str(&text).context("the status is not JSON")
}
