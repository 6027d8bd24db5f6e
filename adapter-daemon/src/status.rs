//! The adapter's status document, served on the local status socket
//! (`cyphonic_telemetry::status`): what the engine reports, with the adapter's LAN side.

use std::sync::Arc;
use std::time::Instant;

use cyphonic_pipeline::Counters as PipelineCounters;
use serde_json::{Value, json};

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

/// The status document.
pub fn snapshot(shared: &Shared, info: &Static) -> Value {
    let now = Instant::now();
    let (leases, dhcp, dns) = {
        let s = shared
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (s.leases.clone(), s.dhcp.clone(), s.dns.clone())
    };
    let mut doc = cyphonic_tunnel::status::document(
        &shared.tunnel,
        &info.egress,
        &info.ingress,
        shared.counters.snapshot(),
    );
    doc.insert(
        "adapter".into(),
        json!({
            "name": info.name,
            "lan_interface": info.lan_interface,
            "listen": info.listen,
            "gateway_vip": info.gateway_vip,
            "lan_block": info.lan_block,
            "uptime_secs": now.saturating_duration_since(info.started).as_secs(),
            "buffers_allocated": shared.tunnel.pool.allocated(),
            "buffers_free": shared.tunnel.pool.free(),
        }),
    );
    doc.insert("leases".into(), leases);
    doc.insert("dhcp".into(), dhcp);
    doc.insert("dns".into(), dns);
    Value::Object(doc)
}
