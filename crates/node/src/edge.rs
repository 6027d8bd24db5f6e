//! The node's edge of the engine: the TUN device ([`crate::tun`]) and the DNS stub
//! ([`crate::dns`]), as the shared daemon core (`cyphonic-daemon`) runs them. It opens the
//! device, hands the core the TUN sink, starts the `cy-tun` thread, and reports the TUN side
//! and the stub.

use std::sync::{Arc, Mutex, PoisonError};

use cyphonic_daemon::status::DnsStatus;
use cyphonic_daemon::{Core, Edge, Reporter, ServiceContext};
use cyphonic_netio::Tun;
use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder, named_counters};
use cyphonic_telemetry::{CounterSet, CountersOf};
use serde::{Deserialize, Serialize};

use crate::config::NodeConfig;
use crate::dns::{NodeServices, Stub};
use crate::tun::{TunCounters, TunReader, TunSide, TunSink};

/// The node in the status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Our FQDN.
    pub name: String,
    /// The TUN interface.
    pub interface: String,
    /// Our vIP.
    pub vip: String,
    /// The tunnel socket's address.
    pub listen: String,
    /// Seconds since start.
    pub uptime_secs: u64,
}

/// The node's part of the status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub node: NodeInfo,
    /// The DNS stub, when it runs.
    pub dns: Option<DnsStatus>,
}

/// The node's status document.
pub type NodeDocument = cyphonic_daemon::Status<NodeStatus, TunCounters>;

/// The node's edge.
#[derive(Debug)]
pub struct NodeEdge<'a> {
    config: &'a NodeConfig,
    side: Arc<TunSide>,
    dns: Arc<Mutex<Option<DnsStatus>>>,
}

impl<'a> NodeEdge<'a> {
    /// Creates and configures the TUN device `config` names.
    ///
    /// # Errors
    /// The device cannot be created or configured (privileges, name in use).
    pub fn open(config: &'a NodeConfig) -> anyhow::Result<Self> {
        let common = &config.common;
        let v6 = config.ipv6;
        // USO too: the reader cuts UDP super-packets of both IP versions.
        let tun = Tun::create(&config.interface, config.tun_offload, true)?;
        tun.configure(
            config.vip,
            common.overlay.prefix_len(),
            v6.map(|(vip, overlay)| (vip, overlay.prefix_len())),
            u32::from(common.inner_mtu),
        )?;
        let offloads = tun.offloads();
        tracing::info!(interface = tun.name(), vip = %config.vip, overlay = %common.overlay, ipv6 = ?v6, mtu = common.inner_mtu, ?offloads, "overlay interface up");
        Ok(Self {
            config,
            side: Arc::new(TunSide {
                tun,
                ours: crate::tun::Ours {
                    vip: config.vip,
                    overlay: common.overlay,
                    ipv6: v6,
                },
                defer_checksums: config.defer_checksums && offloads.is_some(),
                counters: TunCounters::default(),
            }),
            dns: Arc::new(Mutex::new(None)),
        })
    }
}

impl Edge for NodeEdge<'_> {
    const PROGRAM: &'static str = crate::PROGRAM;
    type Sink = TunSink;
    type Services = NodeServices;
    type Status = NodeStatus;
    type Counters = TunCounters;

    fn sink(&mut self) -> anyhow::Result<TunSink> {
        Ok(TunSink::new(self.side.clone()))
    }

    fn services(&mut self, ctx: ServiceContext) -> anyhow::Result<NodeServices> {
        let stub = match self.config.dns_listen {
            Some(listen) => Some(Stub::new(
                self.config,
                listen,
                &ctx.core.name,
                &ctx.peers,
                (ctx.cloud, ctx.upstream),
                ctx.core.shared.clone(),
            )?),
            None => None,
        };
        Ok(NodeServices::new(
            stub,
            &ctx.core.name,
            (self.config.vip, self.config.ipv6.map(|(ip6, _)| ip6)),
            self.dns.clone(),
        ))
    }

    fn start(&mut self, core: &Core) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        let reader = TunReader::new(
            self.side.clone(),
            core.shared.clone(),
            core.intake.clone(),
            core.dataplane.busy_poll,
        );
        Ok(vec![core.spawn("cy-tun", move || reader.run())?])
    }

    fn reporter(&self, core: &Core) -> Reporter<NodeStatus, TunCounters> {
        let (side, dns) = (self.side.clone(), self.dns.clone());
        let info = NodeInfo {
            name: core.name.clone(),
            interface: side.tun.name().to_owned(),
            vip: self.config.vip.to_string(),
            listen: core.listen.to_string(),
            uptime_secs: 0,
        };
        let started = core.started;
        Box::new(move || {
            let status = NodeStatus {
                node: NodeInfo {
                    uptime_secs: started.elapsed().as_secs(),
                    ..info.clone()
                },
                dns: dns.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            };
            (status, side.counters.copied())
        })
    }

    fn counters(&self) -> Arc<dyn CounterSet + Send + Sync> {
        Arc::new(CountersOf::new(self.side.clone(), |side| &side.counters))
    }

    fn collector(&self, _core: &Core) -> Box<dyn Collector> {
        Box::new(NodeCollector {
            dns: self.dns.clone(),
        })
    }
}

/// The node's own metrics beside its counters: the DNS stub's.
#[derive(Debug)]
struct NodeCollector {
    dns: Arc<Mutex<Option<DnsStatus>>>,
}

impl Collector for NodeCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use cyphonic_daemon::metrics::PREFIX;
        let stats = self
            .dns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|d| d.stats);
        match stats {
            Some(s) => named_counters(&mut e, &format!("{PREFIX}_dns"), "DNS stub", &s.named()),
            None => Ok(()),
        }
    }
}
