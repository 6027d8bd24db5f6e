//! The adapter's edge of the engine, as the shared daemon core (`cyphonic-daemon`) runs it:
//! the LAN port. It opens the port (switching its receive offloads as `[dataplane]` says),
//! hands the core the [`LanSink`], builds the LAN services, starts the capture thread, and
//! reports the LAN side.
//!
//! ```text
//! cy-capture       AF_PACKET recvmmsg -> gateway::Lan::handle_frame -> Intake   (capture.rs)
//!                  (ARP/ICMP replies straight back; DHCP and DNS to the services)
//! cy-ingress-emit  LanSink (after the engine's Incoming::accept): cryptokey routing,
//!                  sendmmsg (runs merged for the kernel to segment)        (lan_sink.rs)
//! control thread   AdapterServices: DHCP and leases, DNS, the gateway address (services.rs)
//! ```

use std::sync::Arc;

use anyhow::Context as _;
use cyphonic_daemon::dns::OwnZone;
use cyphonic_daemon::{Core, Edge, Reporter, ServiceContext};
use cyphonic_gateway::Lan;
use cyphonic_netio::{Interface, PacketOptions, PacketSocket};
use cyphonic_telemetry::metrics::{Collector, DescriptorEncoder, gauge, named_counters};
use cyphonic_telemetry::{CounterSet, CountersOf};

use crate::capture::Capture;
use crate::config::{AdapterConfig, Mac};
use crate::counters::LanCounters;
use crate::dhcp::Dhcp;
use crate::gateway::Gateway;
use crate::lan::{LanSide, ServiceQueues, Vlan};
use crate::lan_sink::LanSink;
use crate::names::Names;
use crate::neighbors::LanTable;
use crate::port_guard::PortGuard;
use crate::services::{AdapterServices, Dns};
use crate::status::{AdapterInfo, AdapterStatus, VlanStatus};
use crate::steer;

/// The adapter's edge.
#[derive(Debug)]
pub struct AdapterEdge<'a> {
    config: &'a AdapterConfig,
    iface: Interface,
    /// The capture sockets (a fanout group with `lan_queues` > 1); the first also sends.
    capture: Option<Vec<PacketSocket>>,
    /// The sparse class's capture sockets (`dataplane.sparse_socket`), one per sparse
    /// thread (`DataPlane::sparse_threads`), for their threads.
    sparse_capture: Vec<PacketSocket>,
    /// The LAN port's guard, held once at open and then every second by the capture thread.
    guard: Option<PortGuard>,
    lan: Arc<LanSide>,
    work: Option<ServiceQueues>,
    /// One of an HA pair: the newest clock the other box showed ([`Edge::clock_floor`]).
    clock_floor: Option<std::time::Duration>,
    /// One of an HA pair: the pair's part of the status document.
    ha: Option<Arc<std::sync::Mutex<crate::status::HaStatus>>>,
    /// One of an HA pair: where the services say the tunnels are up, hear where new DHCP
    /// addresses come from, and read what to report of the pair to the cloud.
    pair: Option<(crate::ha::Ready, crate::ha::PairLink, crate::ha::Report)>,
}

impl<'a> AdapterEdge<'a> {
    /// One of an HA pair: with the clock the other box last showed (for the handshakes to
    /// stay above), the pair's part of the status document and its report to the cloud.
    #[must_use]
    pub fn in_pair(
        mut self,
        floor: Option<std::time::Duration>,
        (status, report): (
            Arc<std::sync::Mutex<crate::status::HaStatus>>,
            crate::ha::Report,
        ),
        (ready, pool): (crate::ha::Ready, crate::ha::PairLink),
    ) -> Self {
        self.clock_floor = floor;
        self.ha = Some(status);
        self.pair = Some((ready, pool, report));
        self
    }

    /// Until when this box may speak for the gateway: an HA pair's thread renews it.
    pub fn mandate(&self) -> Arc<cyphonic_ha::Mandate> {
        self.lan.mandate.clone()
    }

    /// Opens the LAN port `config` names: its receive offloads as `[dataplane]` wants them,
    /// and the capture socket.
    ///
    /// # Errors
    /// The interface is missing or down, or the socket cannot be opened (privileges).
    pub fn open(config: &'a AdapterConfig) -> anyhow::Result<Self> {
        let d = &config.common.dataplane;
        let lan_side = &config.lan_dataplane;
        // The LAN port is ours: down (nothing on the host configures it), we bring it up.
        if Interface::bring_up(&config.lan_interface)? {
            tracing::info!(interface = %config.lan_interface, "the LAN port was down: brought up");
        }
        let iface = Interface::lookup_up(&config.lan_interface)?;
        set_receive_offloads(&iface.name, lan_side.gro, lan_side.gso)?;
        let opts = PacketOptions {
            recv_buffer: lan_side.buffer,
            // Offload headers on the socket serve both directions.
            coalesced: lan_side.gro || lan_side.gso,
            busy_poll: d.busy_poll,
            // The queue manager judges frames by their wait in the kernel.
            timestamps: d.socket_timestamps || d.aqm.is_some(),
            // With a sparse capture socket, the others leave its frames to it.
            filter: d.steers_sparse().then(|| steer::lan_filter(false)),
            ring: lan_side.ring,
            ..PacketOptions::default()
        };
        let capture = PacketSocket::open_group(&iface, &opts, lan_side.queues)?;
        // The sparse class (ARP, ICMP, DNS, DHCP) in sockets of its own, read by threads of
        // their own: a ping never waits behind a download's frames. One per CPU (the kernel
        // gives each the frames its CPU received), or one.
        let sparse_threads = d.sparse_threads().len();
        let sparse_capture = if sparse_threads == 0 {
            Vec::new()
        } else {
            PacketSocket::open_per_cpu(
                &iface,
                &PacketOptions {
                    recv_buffer: SPARSE_BUFFER,
                    busy_poll: std::time::Duration::ZERO,
                    filter: Some(steer::lan_filter(true)),
                    // A ring's block timer would hold a lone frame: the class that waits on
                    // its every frame reads from the queue.
                    ring: false,
                    ..opts.clone()
                },
                sparse_threads,
            )?
        };
        if sparse_capture.len() < sparse_threads {
            tracing::info!(
                "one sparse capture socket, not one per CPU: this kernel cannot keep a fanout group off the frames the adapter sends (PACKET_FANOUT_FLAG_IGNORE_OUTGOING, Linux 6.2); the tunnel side still has one per CPU"
            );
        }
        tracing::info!(
            interface = %iface.name,
            mac = %Mac(iface.mac),
            gateway_mac = %Mac(gateway_mac(config, &iface)),
            ignores_outgoing = capture[0].ignores_outgoing(),
            recv_buffer = capture[0].recv_buffer(),
            ring = ?capture[0].ring_bytes(),
            queues = capture.len(),
            sparse_sockets = sparse_capture.len(),
            "capturing the LAN"
        );
        if let Some(refused) = capture[0].ring_refused() {
            tracing::warn!(
                error = refused,
                "the kernel refused the capture ring (dataplane.lan_ring): the LAN is read from the sockets' queues"
            );
        }
        if (d.socket_timestamps || d.aqm.is_some()) && !capture[0].timestamps() {
            tracing::warn!(
                "the kernel refused receive stamps on the capture socket: no socket waits, and the queue manager (dataplane.aqm_target_us) has nothing to judge"
            );
        }
        // Before the engine starts: turning the port's IPv6 off removes its link-local
        // address, which the engine's network watcher would take for an uplink change.
        let mut guard = PortGuard::new(&iface.name, iface.index);
        match guard.enforce() {
            Ok(changed) if !changed.is_empty() => {
                tracing::info!(changed = ?changed, "LAN port: closed to this host's kernel (no address, no IPv6, no forwarding, every frame dropped after capture)");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "cannot close the LAN port to this host's kernel entirely; frames devices address to the gateway still never reach the kernel's IP stack (they carry the gateway's own MAC)"
            ),
        }
        Ok(Self::on_ports(
            config,
            iface,
            capture,
            sparse_capture,
            Some(guard),
        ))
    }

    /// The edge on the LAN port `iface`, opened already: its capture sockets (one, or the
    /// `lan_queues` group; the first also sends), its sparse class's (one per
    /// `DataPlane::sparse_threads` entry, or none), and the guard that holds the port closed
    /// to this host's kernel, if any. [`Self::open`] opens them on the interface; a test, on
    /// a pair inside the process (`PacketSocket::pair`).
    pub fn on_ports(
        config: &'a AdapterConfig,
        iface: Interface,
        capture: Vec<PacketSocket>,
        sparse_capture: Vec<PacketSocket>,
        guard: Option<PortGuard>,
    ) -> Self {
        let lan_side = &config.lan_dataplane;
        let gateway_mac = gateway_mac(config, &iface);
        let untagged = Lan {
            mac: gateway_mac,
            host_mac: iface.mac,
            gateway_ip: config.gateway_vip,
            block: config.lan_block(),
            overlay: config.common.overlay,
            inner_mtu: config.common.inner_mtu,
            mss_clamp: config.mss_clamp,
            defer_checksums: lan_side.defer_checksums,
            legacy: config.legacy,
            v6: config.lan6(),
        };
        // Each VLAN segment: the same gateway on its own part of the block, with its own
        // legacy map, if any.
        let vlans = config
            .vlans
            .iter()
            .map(|v| Vlan {
                tag: v.tag,
                lan: Lan {
                    gateway_ip: v.gateway,
                    block: v.block,
                    legacy: v.legacy,
                    v6: config.vlan_lan6(v),
                    ..untagged.clone()
                },
            })
            .collect();
        let (lan, work) = LanSide::new(
            untagged,
            vlans,
            LanTable::new(&config.reservations)
                .learning(
                    std::iter::once((config.legacy, config.learn_legacy))
                        .chain(config.vlans.iter().map(|v| (v.legacy, v.learn_legacy)))
                        .filter_map(|(legacy, learn)| legacy.filter(|_| learn))
                        .map(|l| l.map.overlay()),
                )
                .beside_routers(
                    std::iter::once((None, config.legacy))
                        .chain(config.vlans.iter().map(|v| (Some(v.tag), v.legacy)))
                        .filter(|(_, legacy)| legacy.is_some_and(|l| l.router.is_some()))
                        .map(|(tag, _)| tag),
                ),
            config.dhcp.is_some(),
            config.common.dns.is_some(),
        );
        let lan = Arc::new(lan);
        Self {
            config,
            iface,
            capture: Some(capture),
            sparse_capture,
            guard,
            lan,
            work: Some(work),
            clock_floor: None,
            ha: None,
            pair: None,
        }
    }

    fn socket(&self) -> anyhow::Result<&PacketSocket> {
        self.capture
            .as_ref()
            .and_then(|c| c.first())
            .context("the capture socket went to the capture thread")
    }
}

/// The gateway's MAC on `iface`: a pair's is the pair's, the same on both boxes.
fn gateway_mac(config: &AdapterConfig, iface: &Interface) -> [u8; 6] {
    if config.ha.is_some() {
        crate::ha::gateway_mac(config.gateway_vip)
    } else {
        cyphonic_gateway::gateway_mac(iface.mac)
    }
}

/// The sparse capture socket's kernel buffer, bytes: the sparse class is small and paced.
const SPARSE_BUFFER: usize = 1 << 20;

/// Switches the LAN port's receive offloads (GRO/LRO) as `[dataplane]` wants them, and says
/// what that means for the frames the adapter will see.
fn set_receive_offloads(iface: &str, gro: bool, gso: bool) -> anyhow::Result<()> {
    if gro {
        for state in cyphonic_netio::receive_offloads(iface)? {
            tracing::info!(interface = %iface, offload = ?state.offload, on = ?state.now_on, "merged frames are taken as they come and cut back into segments here");
        }
        return Ok(());
    }
    for state in cyphonic_netio::disable_receive_offloads(iface)? {
        match (state.was_on, state.now_on) {
            (Some(true), Some(false)) => {
                tracing::info!(interface = %iface, offload = ?state.offload, "switched off: every frame arrives as it was on the wire");
            }
            // With lan_gso the socket has offload headers, so merged frames are still cut.
            (_, Some(true)) if gso => {
                tracing::warn!(interface = %iface, offload = ?state.offload, "still on: merged frames are cut back into segments here");
            }
            (_, Some(true)) => {
                tracing::warn!(interface = %iface, offload = ?state.offload, "still on: merged frames over the inner MTU will be dropped, or answered with fragmentation-needed");
            }
            (_, None) => {
                tracing::info!(interface = %iface, offload = ?state.offload, "not supported by the driver (or the kernel interface: state unknown)");
            }
            _ => {
                tracing::debug!(interface = %iface, offload = ?state.offload, "already off");
            }
        }
    }
    Ok(())
}

impl Edge for AdapterEdge<'_> {
    const PROGRAM: &'static str = crate::PROGRAM;
    type Sink = LanSink;
    type Services = AdapterServices;
    type Status = AdapterStatus;
    type Counters = LanCounters;

    fn sink(&mut self) -> anyhow::Result<LanSink> {
        let capture = self.socket()?;
        let lan_tx = capture.try_clone().context("duplicating the LAN socket")?;
        let merge = self.config.lan_dataplane.gso && capture.coalesced();
        Ok(LanSink::new(self.lan.clone(), lan_tx, merge))
    }

    fn services(&mut self, ctx: ServiceContext) -> anyhow::Result<AdapterServices> {
        let config = self.config;
        let lan_tx = self
            .socket()?
            .try_clone()
            .context("duplicating the LAN socket")?;
        // Every segment's scope (the untagged one first), in the one lease file.
        let scopes = config.dhcp_scopes();
        let dhcp = if scopes.is_empty() {
            None
        } else {
            let v6 = config.dhcp6_scopes(self.lan.lan.mac);
            Some(Dhcp::open(
                &scopes,
                &v6,
                &config.state_dir,
                cyphonic_settings::now_secs(),
            )?)
        };
        let name = &ctx.core.name;
        let own = OwnZone {
            name: name.clone(),
            ip: config.gateway_vip,
            ip6: None,
            block: config.lan_block(),
        };
        let dns = match &config.common.dns {
            Some(_) => Some(Dns::new(
                &config.common,
                &own,
                &ctx.peers,
                ctx.cloud,
                ctx.upstream,
            )?),
            None => None,
        };
        let work = self
            .work
            .take()
            .context("the LAN services are built once")?;
        let services = AdapterServices::new(
            self.lan.clone(),
            work,
            Gateway::new(self.lan.clone(), &ctx.core, lan_tx),
            dhcp,
            dns,
            (
                Names::new(
                    &config.reservations,
                    name,
                    config.gateway_vip,
                    config.lan6().map(|v| v.address()),
                ),
                config.reservations.clone(),
            ),
        );
        Ok(match &self.pair {
            Some((ready, pool, report)) => services.in_pair(
                crate::ha::ReadyWatch::new(ready.clone(), ctx.peers.iter().map(|(id, _)| *id)),
                pool.clone(),
                report.clone(),
            ),
            None => services,
        })
    }

    fn start(&mut self, core: &Core) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        let sock = self
            .capture
            .take()
            .context("the capture thread starts once")?;
        let capture = Capture::new(
            self.lan.clone(),
            core.shared.clone(),
            sock,
            core.intake.clone(),
            self.guard.take(),
        );
        let mut threads = vec![core.spawn("cy-capture", move || capture.run())?];
        // The other capture sockets leave the sparse class to these: without their threads
        // those frames would be lost, so a missing one is an error.
        let sparse: Vec<Capture> = std::mem::take(&mut self.sparse_capture)
            .into_iter()
            .map(|sock| {
                Capture::new(
                    self.lan.clone(),
                    core.shared.clone(),
                    vec![sock],
                    core.intake.clone(),
                    None,
                )
            })
            .collect();
        threads.extend(
            core.spawn_sparse("cy-sparse-cap", sparse, Capture::run_sparse)
                .context(
                    "the sparse capture sockets are open but the engine has no sparse lanes",
                )?,
        );
        tracing::info!(
            lan_block = %self.config.lan_block(),
            gateway = %self.config.gateway_vip,
            reservations = self.config.reservations.len(),
            "LAN side running"
        );
        // One of a pair judges its data plane by its threads' beats from now on.
        if let Some((_, link, _)) = &self.pair {
            link.watch_data_plane(core.shared.pulses().clone());
        }
        Ok(threads)
    }

    fn reporter(&self, core: &Core) -> Reporter<AdapterStatus, LanCounters> {
        let (lan, shared) = (self.lan.clone(), core.shared.clone());
        let info = AdapterInfo {
            name: core.name.clone(),
            lan_interface: self.iface.name.clone(),
            gateway_mac: Mac(self.lan.lan.mac).to_string(),
            listen: core.listen.to_string(),
            gateway_vip: self.config.gateway_vip.to_string(),
            lan_block: self.config.lan_block().to_string(),
            uptime_secs: 0,
            buffers_allocated: 0,
            buffers_free: 0,
        };
        let started = core.started;
        let ha = self.ha.clone();
        Box::new(move || {
            let mut p = lan.published().clone();
            p.leases.extend(lan.learned());
            for l in &mut p.leases {
                l.vlan = l.vip.parse().ok().and_then(|ip| lan.segment_of(ip).tag);
            }
            let vlans = lan
                .vlans
                .iter()
                .map(|v| VlanStatus {
                    tag: v.tag,
                    block: v.lan.block.to_string(),
                    gateway: v.lan.gateway_ip.to_string(),
                    block6: v.lan.v6.as_ref().map(|s| s.prefix.to_string()),
                    dhcp: of_segment(&p.vlan_dhcp, v.tag),
                    dhcp6: of_segment(&p.vlan_dhcp6, v.tag),
                })
                .collect();
            let status = AdapterStatus {
                adapter: AdapterInfo {
                    uptime_secs: started.elapsed().as_secs(),
                    buffers_allocated: shared.pool().allocated(),
                    buffers_free: shared.pool().free(),
                    ..info.clone()
                },
                leases: p.leases,
                devices6: p.devices6,
                dhcp: p.dhcp,
                dhcp6: p.dhcp6,
                dns: p.dns,
                vlans,
                ha: ha.as_ref().map(|h| {
                    h.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone()
                }),
            };
            (status, lan.counters.copied())
        })
    }

    fn counters(&self) -> Arc<dyn CounterSet + Send + Sync> {
        Arc::new(CountersOf::new(self.lan.clone(), |lan| &lan.counters))
    }

    fn collector(&self, _core: &Core) -> Box<dyn Collector> {
        Box::new(AdapterCollector {
            lan: self.lan.clone(),
            ha: self.ha.clone().map(crate::ha::HaCollector::new),
        })
    }

    fn clock_floor(&self) -> Option<std::time::Duration> {
        self.clock_floor
    }

    fn handshake_at_start(&self) -> bool {
        self.pair.is_some()
    }
}

/// The adapter's own metrics (its LAN side) beside its counters: the devices with an
/// address, the DHCP servers' (every segment's together) and the DNS
/// service's counters; in a pair, the pair's.
#[derive(Debug)]
struct AdapterCollector {
    lan: Arc<LanSide>,
    ha: Option<crate::ha::HaCollector>,
}

impl Collector for AdapterCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use cyphonic_daemon::metrics::PREFIX;
        let (devices, dhcp, dhcp6, dns) = {
            let p = self.lan.published();
            // Every segment's DHCP servers together (the status has each VLAN's own).
            let dhcp = summed(
                p.dhcp
                    .iter()
                    .chain(p.vlan_dhcp.iter().map(|(_, d)| d))
                    .map(|d| d.stats.named()),
            );
            let dhcp6 = summed(
                p.dhcp6
                    .iter()
                    .chain(p.vlan_dhcp6.iter().map(|(_, d)| d))
                    .map(|d| d.stats.named()),
            );
            let devices = p.leases.len() + p.devices6.len();
            (devices, dhcp, dhcp6, p.dns.as_ref().map(|d| d.stats))
        };
        #[expect(clippy::cast_precision_loss, reason = "a count of devices")]
        gauge(
            &mut e,
            "cyphonic_lan_devices",
            "Devices with an address (leases and reservations, and devices with IPv6 only).",
            devices as f64,
        )?;
        if let Some(s) = dhcp {
            named_counters(&mut e, &format!("{PREFIX}_dhcp"), "DHCP server", &s)?;
        }
        if let Some(s) = dhcp6 {
            named_counters(&mut e, &format!("{PREFIX}_dhcp6"), "DHCPv6 server", &s)?;
        }
        if let Some(s) = dns {
            named_counters(&mut e, &format!("{PREFIX}_dns"), "DNS service", &s.named())?;
        }
        if let Some(ha) = &self.ha {
            ha.encode(e)?;
        }
        Ok(())
    }
}

/// The part of `by_tag` of the segment of VLAN `tag`, if any.
fn of_segment<T: Clone>(by_tag: &[(u16, T)], tag: u16) -> Option<T> {
    by_tag
        .iter()
        .find(|(t, _)| *t == tag)
        .map(|(_, d)| d.clone())
}

/// Named counters of several servers, summed name by name (all name the same counters in
/// one order); None for none.
fn summed<const N: usize>(
    each: impl Iterator<Item = [(&'static str, u64); N]>,
) -> Option<[(&'static str, u64); N]> {
    each.reduce(|mut all, one| {
        for (a, b) in all.iter_mut().zip(one) {
            a.1 += b.1;
        }
        all
    })
}
