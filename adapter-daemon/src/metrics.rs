//! The adapter's own metrics (its LAN side), next to the engine's
//! (`cyphonic_tunnel::metrics::EngineCollector`): the LAN counters, the devices with an
//! address, the DHCP server's and the DNS service's counters.

use std::sync::Arc;

use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder, gauge, json_counters};
use cyphonic_tunnel::metrics::PREFIX;

use crate::daemon::Shared;

/// Collects the adapter's own metrics.
#[derive(Debug)]
pub struct AdapterCollector {
    pub(crate) shared: Arc<Shared>,
}

impl Collector for AdapterCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.shared.counters.encode(PREFIX, &mut e)?;
        let (leases, dhcp, dns) = {
            let s = self
                .shared
                .services
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (s.leases.clone(), s.dhcp.clone(), s.dns.clone())
        };
        #[expect(clippy::cast_precision_loss, reason = "a count of devices")]
        let devices = leases.as_array().map_or(0, Vec::len) as f64;
        gauge(
            &mut e,
            "cyphonic_lan_devices",
            "Devices with an address (leases and reservations).",
            devices,
        )?;
        json_counters(&mut e, &format!("{PREFIX}_dhcp"), "DHCP server", &dhcp)?;
        json_counters(&mut e, &format!("{PREFIX}_dns"), "DNS service", &dns)
    }
}
