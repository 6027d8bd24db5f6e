//! Builds the adapter from its configuration and runs it: sockets, threads, pipelines, the
//! control runtime. This is the only place that knows how the parts fit together.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use cyphonic_gateway::Lan;
use cyphonic_netio::{Interface, PacketOptions, PacketSocket, UdpOptions, UdpSocket};
use cyphonic_session::{Clock, Identity, Timing};
use cyphonic_tunnel::{CloudLink, CloudSettings, DataPlane, Engine, StaticPeer};

use crate::config::Config;
use crate::control::Control;
use crate::counters::Counters;
use crate::egress::Capture;
use crate::ingress::LanSink;
use crate::neighbors::LanTable;
use crate::services::{Client, Services, ServicesStatus};
use crate::status::Static;

/// Work for the LAN services (DHCP, DNS, the gateway vIP), on the control thread. A channel of
/// its own, so that a flood from the LAN can never crowd out handshakes.
#[derive(Debug)]
pub enum ToServices {
    /// A DHCP message from the LAN.
    Dhcp {
        /// The Ethernet source.
        mac: [u8; 6],
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A DNS message from a device on the LAN to the gateway vIP.
    Dns {
        /// Who asked.
        client: Client,
        /// The UDP payload.
        payload: Vec<u8>,
    },
    /// A packet a peer sent to the gateway vIP.
    FromPeer {
        /// The peer.
        peer: u32,
        /// The decrypted IP packet.
        packet: Vec<u8>,
        /// When it arrived.
        at: Instant,
    },
}

/// DHCP and DNS messages waiting for the control thread at most; more are dropped and counted.
const SERVICES_QUEUE: usize = 256;

/// State every thread shares.
#[derive(Debug)]
pub struct Shared {
    /// The tunnel engine's: peers, buffers, its counters, the control channel.
    pub tunnel: Arc<cyphonic_tunnel::Shared>,
    /// The LAN segment.
    pub lan: Lan,
    /// Who holds which address.
    pub table: LanTable,
    /// The LAN side's counters.
    pub counters: Counters,
    /// To the LAN services on the control thread (bounded; `try_send` only).
    pub services_tx: tokio::sync::mpsc::Sender<ToServices>,
    /// Whether the DHCP server runs (otherwise DHCP messages are only counted).
    pub dhcp_on: bool,
    /// Whether the DNS service runs.
    pub dns_on: bool,
    /// The services' part of the status document.
    pub services: std::sync::Mutex<ServicesStatus>,
}

/// Runs the adapter until SIGINT or SIGTERM.
///
/// # Errors
/// Anything that prevents starting: interface, sockets, threads. Each says what to fix.
pub fn run(config: &Config, identity: Identity) -> anyhow::Result<()> {
    let started = Instant::now();
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let clock = Clock::new(started, unix);
    let identity = Arc::new(identity);
    let name = identity.certificate().body().name.clone();
    let d = &config.dataplane;
    let lan_side = &config.lan_dataplane;

    let iface = Interface::lookup_up(&config.lan_interface)?;
    if lan_side.gro {
        for state in cyphonic_netio::receive_offloads(&iface.name)? {
            tracing::info!(interface = %iface.name, offload = ?state.offload, on = ?state.now_on, "merged frames are taken as they come and cut back into segments here");
        }
    } else {
        for state in cyphonic_netio::disable_receive_offloads(&iface.name)? {
            match (state.was_on, state.now_on) {
                (Some(true), Some(false)) => {
                    tracing::info!(interface = %iface.name, offload = ?state.offload, "switched off: every frame arrives as it was on the wire");
                }
                // With lan_gso the socket has offload headers, so merged frames are still cut.
                (_, Some(true)) if lan_side.gso => {
                    tracing::warn!(interface = %iface.name, offload = ?state.offload, "still on: merged frames are cut back into segments here");
                }
                (_, Some(true)) => {
                    tracing::warn!(interface = %iface.name, offload = ?state.offload, "still on: merged frames over the inner MTU will be dropped, or answered with fragmentation-needed");
                }
                (_, None) => {
                    tracing::info!(interface = %iface.name, offload = ?state.offload, "not supported by the driver");
                }
                _ => {
                    tracing::debug!(interface = %iface.name, offload = ?state.offload, "already off");
                }
            }
        }
    }
    let capture_sock = PacketSocket::open(
        &iface,
        &PacketOptions {
            recv_buffer: lan_side.buffer,
            // Offload headers on the socket serve both directions.
            coalesced: lan_side.gro || lan_side.gso,
            busy_poll: d.busy_poll,
            ..PacketOptions::default()
        },
    )?;
    tracing::info!(
        interface = %iface.name,
        mac = %crate::config::Mac(iface.mac),
        ignores_outgoing = capture_sock.ignores_outgoing(),
        recv_buffer = capture_sock.recv_buffer(),
        "capturing the LAN"
    );
    let capture_coalesced = capture_sock.coalesced();
    let lan_tx = capture_sock
        .try_clone()
        .context("duplicating the LAN socket")?;
    let udp = UdpSocket::bind(
        config.listen,
        &UdpOptions {
            recv_buffer: d.udp_buffer,
            send_buffer: d.udp_buffer,
            segmentation: d.udp_gso,
            coalescing: d.udp_gro,
            busy_poll: d.busy_poll,
            ..UdpOptions::default()
        },
    )?;
    tracing::info!(listen = %udp.local_addr()?, buffers = ?udp.buffer_sizes(), gso = udp.segmentation(), gro = udp.coalescing(), "tunnel socket bound");

    let lan = Lan {
        mac: iface.mac,
        gateway_ip: config.gateway_vip,
        block: config.lan_block,
        overlay: config.overlay,
        inner_mtu: config.inner_mtu,
        mss_clamp: config.mss_clamp,
        defer_checksums: lan_side.defer_checksums,
    };
    let timing = Timing::default();
    let peers: Vec<StaticPeer> = config
        .peers
        .iter()
        .map(|p| StaticPeer {
            certificate: p.certificate.clone(),
            endpoint: p.endpoint,
            persistent_keepalive: p.persistent_keepalive,
        })
        .collect();
    let table = cyphonic_tunnel::static_peers(&identity, &peers, timing, clock, d.aead)?;
    let (tunnel, control_rx) = cyphonic_tunnel::Shared::new(
        table,
        d.buffers,
        1024,
        config.cloud.as_ref().map_or(
            serde_json::Value::Null,
            |c| serde_json::json!({ "address": c.address.to_string(), "connected": false }),
        ),
    );
    let tunnel = Arc::new(tunnel);
    let (services_tx, services_rx) = tokio::sync::mpsc::channel(SERVICES_QUEUE);
    let shared = Arc::new(Shared {
        tunnel: tunnel.clone(),
        lan,
        table: LanTable::new(&config.reservations),
        counters: Counters::default(),
        services_tx,
        dhcp_on: config.dhcp.is_some(),
        dns_on: config.dns.is_some(),
        services: std::sync::Mutex::new(ServicesStatus::default()),
    });
    // The control runtime exists before the services: the upstream resolver spawns on it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    let (upstream_tx, upstream_rx) = tokio::sync::mpsc::channel(256);
    let tunnel_port = udp.local_addr()?.port();
    let (cloud, asker, cloud_answers) = match &config.cloud {
        Some(c) => {
            let _in_runtime = runtime.enter();
            let settings = CloudSettings {
                address: c.address,
                public_key: c.public_key,
                endpoints: c.endpoints.clone(),
                agent: format!("cyphonic-adapter {}", env!("CARGO_PKG_VERSION")),
                dns_ttl: config.dns.as_ref().map_or(60, |d| d.ttl),
            };
            let (link, asker, answers) = CloudLink::connect(
                &settings,
                identity.clone(),
                tunnel_port,
                timing,
                clock,
                d.aead,
            );
            (Some(link), Some(asker), answers)
        }
        None => (None, None, tokio::sync::mpsc::channel(1).1),
    };
    let services = {
        let _in_runtime = runtime.enter();
        Services::new(
            config,
            &name,
            shared.clone(),
            capture_sock
                .try_clone()
                .context("duplicating the LAN socket")?,
            udp.try_clone().context("duplicating the tunnel socket")?,
            upstream_tx,
            asker,
        )?
    };
    if !d.ordering {
        tracing::warn!(
            "dataplane.ordering = false: packets leave in completion order; for experiments only"
        );
    }

    let mut engine = Engine::start(
        &DataPlane {
            workers: d.workers,
            batch_size: d.batch_size,
            batches_in_flight: d.batches_in_flight,
            inline_max: d.inline_max,
            ordering: d.ordering,
            queue_per_peer: d.queue_per_peer,
            placement: cyphonic_tunnel::placement(&d.cpus, d.realtime_priority)
                .map_err(anyhow::Error::msg)?,
        },
        &tunnel,
        &udp,
        LanSink {
            shared: shared.clone(),
            lan_tx,
            batch: Vec::with_capacity(64),
            arp_sent: std::collections::HashMap::new(),
            out: [0; 64],
            merge: [lan_side.gso && capture_coalesced; 2],
            deferred: [false; crate::lan_send::SEND_BATCH],
        },
    )?;
    let status = Arc::new(Static {
        name: name.clone(),
        lan_interface: iface.name.clone(),
        listen: udp.local_addr()?.to_string(),
        gateway_vip: config.gateway_vip.to_string(),
        lan_block: config.lan_block.to_string(),
        started,
        egress: engine.egress.clone(),
        ingress: engine.ingress.clone(),
    });

    if let Some(addr) = config.metrics {
        let adapter = crate::metrics::AdapterCollector {
            shared: shared.clone(),
        };
        cyphonic_telemetry::metrics::serve(
            addr,
            vec![Box::new(engine.collector()), Box::new(adapter)],
        )
        .with_context(|| format!("opening the metrics endpoint {addr} ([metrics] listen)"))?;
    }
    let capture = Capture {
        shared: shared.clone(),
        sock: capture_sock,
        submitter: engine.take_submitter(),
    };
    let capture = std::thread::Builder::new()
        .name("cy-capture".into())
        .spawn({
            let place = engine.place_thread();
            move || {
                place();
                capture.run();
            }
        })
        .context("starting the capture thread")?;

    tracing::info!(
        %name,
        lan_block = %config.lan_block,
        gateway = %config.gateway_vip,
        peers = config.peers.len(),
        reservations = config.reservations.len(),
        workers = engine.workers,
        aead = %d.aead,
        "cyphonic-adapter running"
    );
    let control = Control {
        shared: shared.clone(),
        core: cyphonic_tunnel::Control::new(
            tunnel.clone(),
            identity,
            udp,
            engine.to_egress(),
            clock,
            cloud,
            control_rx,
            cloud_answers,
        ),
        status,
        status_socket: config.status_socket.clone(),
        services,
        services_rx,
        upstream_rx,
    };
    let result = runtime.block_on(control.run());

    // Stop the data threads; dropping their sequencers drains the pipelines.
    let stopped = engine.stop();
    let captured = capture.join();
    if stopped.is_err() || captured.is_err() {
        anyhow::bail!("a data thread panicked");
    }
    // Give the log a moment to flush before the process exits.
    std::thread::sleep(Duration::from_millis(10));
    result
}
