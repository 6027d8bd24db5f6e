//! The node's edge of the engine: the TUN device ([`crate::tun`]) or, with `[userspace]`,
//! the stack in the process ([`crate::userspace`]), and the DNS stub ([`crate::dns`]), as the
//! shared daemon core (`cyphonic-daemon`) runs them. It opens the device (or binds the local
//! listeners), hands the core the sink, starts the `cy-tun` (or `cy-stack`) thread, and
//! reports the node and the stub.

use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;

use cyphonic_daemon::status::DnsStatus;
use cyphonic_daemon::{Core, Edge, Reporter, ServiceContext};
use cyphonic_netio::Tun;
use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder, named_counters};
use cyphonic_telemetry::{CounterSet, CountersOf};
use serde::{Deserialize, Serialize};

use crate::config::NodeConfig;
use crate::dns::{NodeServices, OverlayDns, Stub};
use crate::overlay::{NodeCounters, Ours};
use crate::tun::{TunReader, TunSide, TunSink};
use crate::userspace::{Listeners, StackDns, StackSide, StackSink, StackThread};

/// The node in the status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Our FQDN.
    pub name: String,
    /// The TUN interface (`userspace` without one).
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
pub type NodeDocument = cyphonic_daemon::Status<NodeStatus, NodeCounters>;

/// The node's edge.
#[derive(Debug)]
pub struct NodeEdge<'a> {
    config: &'a NodeConfig,
    side: Side,
    dns: Arc<Mutex<Option<DnsStatus>>>,
    /// Where the DNS stub answers, once it runs.
    stub_at: Option<std::net::SocketAddr>,
    /// Without a TUN device: the stub's side of its way to the overlay, until it starts.
    stub_overlay: Option<OverlayDns>,
    /// Without a TUN device, until the stack's thread starts: the channel's end it reads,
    /// its local listeners and its side of the stub's way to the overlay.
    stack_start: Option<(tokio::sync::mpsc::Receiver<Vec<u8>>, Listeners, StackDns)>,
}

/// What carries the host's packets.
#[derive(Debug, Clone)]
enum Side {
    /// The TUN device.
    Tun(Arc<TunSide>),
    /// The stack in the process.
    Stack(Arc<StackSide>),
}

impl Side {
    /// The node's counters, where this side keeps them.
    fn counters(&self) -> &NodeCounters {
        match self {
            Self::Tun(t) => &t.counters,
            Self::Stack(s) => &s.counters,
        }
    }
}

impl<'a> NodeEdge<'a> {
    /// Creates and configures the TUN device `config` names; with `[userspace]`, binds the
    /// proxy's and the forwards' addresses instead.
    ///
    /// # Errors
    /// The device cannot be created or configured (privileges, name in use); an address
    /// cannot be bound.
    pub fn open(config: &'a NodeConfig) -> anyhow::Result<Self> {
        let common = &config.common;
        let v6 = config.ipv6;
        let ours = Ours {
            vip: config.vip,
            overlay: common.overlay,
            ipv6: v6,
        };
        let (mut stub_overlay, mut stack_start) = (None, None);
        let side = if let Some(u) = &config.userspace {
            let listeners = Listeners::bind(u)?;
            let (side, from_sink) = StackSide::new(ours);
            let (stub, stack) = crate::userspace::dns_link();
            stub_overlay = Some(stub);
            tracing::info!(vip = %config.vip, overlay = %common.overlay, ipv6 = ?v6, mtu = common.inner_mtu, "overlay in userspace: no TUN device");
            stack_start = Some((from_sink, listeners, stack));
            Side::Stack(side)
        } else {
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
            Side::Tun(Arc::new(TunSide {
                tun,
                ours,
                defer_checksums: config.defer_checksums && offloads.is_some(),
                counters: NodeCounters::default(),
            }))
        };
        Ok(Self {
            config,
            side,
            dns: Arc::new(Mutex::new(None)),
            stub_at: None,
            stub_overlay,
            stack_start,
        })
    }
}

/// The node's sink: into the TUN device, or into the stack.
pub enum NodeSink {
    /// The TUN device.
    Tun(TunSink),
    /// The stack in the process.
    Stack(StackSink),
}

impl cyphonic_pipeline::Sink for NodeSink {
    type Item = cyphonic_tunnel::Accepted;

    fn emit(&mut self, item: Self::Item) -> Result<(), cyphonic_pipeline::DropReason> {
        match self {
            Self::Tun(t) => t.emit(item),
            Self::Stack(s) => s.emit(item),
        }
    }

    fn flush(&mut self) {
        match self {
            Self::Tun(t) => t.flush(),
            Self::Stack(s) => s.flush(),
        }
    }
}

impl Edge for NodeEdge<'_> {
    const PROGRAM: &'static str = crate::PROGRAM;
    type Sink = NodeSink;
    type Services = NodeServices;
    type Status = NodeStatus;
    type Counters = NodeCounters;

    fn sink(&mut self) -> anyhow::Result<NodeSink> {
        Ok(match &self.side {
            Side::Tun(t) => NodeSink::Tun(TunSink::new(t.clone())),
            Side::Stack(s) => NodeSink::Stack(StackSink::new(s.clone())),
        })
    }

    fn services(&mut self, ctx: ServiceContext) -> anyhow::Result<NodeServices> {
        let stub = match self.config.dns_listen {
            Some(listen) => Some(Stub::new(
                self.config,
                listen,
                &ctx.core.name,
                &ctx.peers,
                (ctx.cloud, ctx.upstream),
                (ctx.core.shared.clone(), self.stub_overlay.take()),
            )?),
            None => None,
        };
        self.stub_at = stub.as_ref().and_then(Stub::local_addr);
        Ok(NodeServices::new(
            stub,
            &ctx.core.name,
            (self.config.vip, self.config.ipv6.map(|(ip6, _)| ip6)),
            self.dns.clone(),
        ))
    }

    fn start(&mut self, core: &Core) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        match &self.side {
            Side::Tun(side) => {
                let reader = TunReader::new(
                    side.clone(),
                    core.shared.clone(),
                    core.intake.clone(),
                    core.dataplane.busy_poll,
                );
                Ok(vec![core.spawn("cy-tun", move || reader.run())?])
            }
            Side::Stack(side) => {
                let (from_sink, listeners, dns) = self
                    .stack_start
                    .take()
                    .context("the userspace stack's thread started twice")?;
                let connections = self.config.userspace.as_ref().map_or(1, |u| u.connections);
                let thread = StackThread::new(
                    (side.clone(), from_sink),
                    (core.shared.clone(), core.intake.clone()),
                    (listeners, connections),
                    usize::from(self.config.common.inner_mtu),
                    (self.stub_at, dns),
                )?;
                Ok(vec![core.spawn("cy-stack", move || thread.run())?])
            }
        }
    }

    fn reporter(&self, core: &Core) -> Reporter<NodeStatus, NodeCounters> {
        let dns = self.dns.clone();
        let interface = match &self.side {
            Side::Tun(t) => t.tun.name().to_owned(),
            Side::Stack(_) => "userspace".to_owned(),
        };
        let info = NodeInfo {
            name: core.name.clone(),
            interface,
            vip: self.config.vip.to_string(),
            listen: core.listen.to_string(),
            uptime_secs: 0,
        };
        let started = core.started;
        let side = self.side.clone();
        Box::new(move || {
            let status = NodeStatus {
                node: NodeInfo {
                    uptime_secs: started.elapsed().as_secs(),
                    ..info.clone()
                },
                dns: dns.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            };
            (status, side.counters().copied())
        })
    }

    fn counters(&self) -> Arc<dyn CounterSet + Send + Sync> {
        Arc::new(CountersOf::new(Arc::new(self.side.clone()), |s| {
            s.counters()
        }))
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
