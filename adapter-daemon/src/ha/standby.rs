//! The status socket of a box that stands by (docs/operations.md, *Two adapters as one
//! gateway*): `cyphonic-adapter status` works on either box of a pair. A standby runs no
//! engine, so its document has no peers, no pipelines and zero counters; it has the adapter's
//! own part, the leases the standby holds (the serving box's table, as last kept), and the
//! pair's table (`ha`), which is what an operator asks a standby about.
//!
//! The pair's thread answers it between its rounds, without blocking: a connection is
//! written once, as much as the socket takes at once, and closed (a reader that does not
//! read gets a cut document, never a heartbeat late). The socket goes before the box serves,
//! so that the daemon's own takes its place.

use std::io::Write as _;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use cyphonic_daemon::status::{Buffers, CertificateStatus, CounterTable, Pipelines, VERSION};
use cyphonic_settings::Identity;

use crate::config::{AdapterConfig, Mac};
use crate::leases::LeaseStore;
use crate::names::Names;
use crate::status::{AdapterDocument, AdapterInfo, AdapterStatus, HaStatus};

/// Connections answered in one round at most (the rest wait for the next).
const PER_ROUND: usize = 4;

/// A standby's status socket.
pub(super) struct StandbyStatus {
    listener: UnixListener,
    path: PathBuf,
    info: AdapterInfo,
    certificate: CertificateStatus,
    names: Names,
    started: Instant,
}

impl std::fmt::Debug for StandbyStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandbyStatus")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl StandbyStatus {
    /// Binds the status socket `config` names (mode 0600).
    ///
    /// # Errors
    /// The socket cannot be bound.
    pub(super) fn bind(config: &AdapterConfig, identity: &Identity) -> anyhow::Result<Self> {
        let path = config.common.status_socket.clone();
        let listener = cyphonic_telemetry::status::bind_private(&path)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .with_context(|| format!("opening the status socket {}", path.display()))?;
        let name = identity.certificate().body().name.clone();
        Ok(Self {
            listener,
            path,
            info: AdapterInfo {
                name: name.clone(),
                lan_interface: config.lan_interface.clone(),
                gateway_mac: Mac(super::gateway_mac(config.gateway_vip)).to_string(),
                listen: config.common.listen.to_string(),
                gateway_vip: config.gateway_vip.to_string(),
                lan_block: config.lan_block().to_string(),
                uptime_secs: 0,
                buffers_allocated: 0,
                buffers_free: 0,
            },
            certificate: CertificateStatus::of(identity.certificate()),
            names: Names::new(
                &config.reservations,
                &name,
                config.gateway_vip,
                config.lan6().map(|v| v.address()),
            ),
            started: Instant::now(),
        })
    }

    /// Answers the connections waiting, with the document of now: the pair's table `ha`,
    /// the leases in `leases`.
    pub(super) fn answer(&mut self, ha: &HaStatus, leases: &LeaseStore) {
        let mut text: Option<Vec<u8>> = None;
        for _ in 0..PER_ROUND {
            let Ok((mut stream, _)) = self.listener.accept() else {
                return;
            };
            // One document for every reader of this round.
            let text = text.get_or_insert_with(|| {
                let doc = serde_json::to_vec_pretty(&self.document(ha, leases));
                [doc.unwrap_or_default(), b"\n".to_vec()].concat()
            });
            // As much as the socket takes now: a reader that does not read never holds the
            // heartbeats up.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(text);
        }
    }

    fn document(&mut self, ha: &HaStatus, leases: &LeaseStore) -> AdapterDocument {
        let unix = cyphonic_settings::now_secs();
        let kept = leases.load(unix).map(|l| l.leases).unwrap_or_default();
        let named = self.names.refresh(
            kept.iter().filter(|l| l.active && l.expires > unix),
            // The standby hears no device: the active box names their IPv6.
            &std::collections::HashMap::new(),
            &std::collections::HashMap::new(),
        );
        AdapterDocument {
            version: VERSION,
            edge: AdapterStatus {
                adapter: AdapterInfo {
                    uptime_secs: self.started.elapsed().as_secs(),
                    ..self.info.clone()
                },
                leases: named.leases,
                devices6: Vec::new(),
                dhcp: None,
                dhcp6: None,
                dns: None,
                vlans: Vec::new(),
                ha: Some(ha.clone()),
            },
            at: unix,
            software: cyphonic_telemetry::build!(crate::PROGRAM).to_string(),
            certificate: Some(self.certificate.clone()),
            peers: Vec::new(),
            cloud: None,
            counters: CounterTable {
                edge: crate::counters::LanCounters::default(),
                engine: cyphonic_tunnel::EngineCounters::default(),
            },
            pipelines: Pipelines::default(),
            buffers: Buffers::default(),
            policy: None,
        }
    }
}

impl Drop for StandbyStatus {
    /// The socket goes: the daemon binds its own when the box serves.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
