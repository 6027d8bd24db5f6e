//! Builds the adapter from its configuration and runs it: sockets, threads, pipelines, the
//! control runtime. This is the only place that knows how the parts fit together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use cyphonic_crypto::PublicKey;
use cyphonic_gateway::Lan;
use cyphonic_netio::{Interface, PacketOptions, PacketSocket, UdpOptions, UdpSocket};
use cyphonic_session::{Clock, Identity, Peer, PeerConfig, Timing};

use crate::cloud::{Asker, CloudLink};
use crate::config::Config;
use crate::control::Control;
use crate::counters::Counters;
use crate::egress::{Capture, SealStage, UdpSink};
use crate::ingress::{LanSink, OpenStage, Receiver};
use crate::neighbors::LanTable;
use crate::peers::{PeerSlot, PeerTable};
use crate::pool::Pool;
use crate::services::{Client, Services, ServicesStatus};
use crate::status::Static;

/// Messages from the data threads to the control thread.
#[derive(Debug)]
pub enum ToControl {
    /// A handshake message from the underlay.
    Handshake {
        /// The whole frame.
        frame: Vec<u8>,
        /// Its sender.
        from: SocketAddr,
        /// When it arrived.
        at: Instant,
    },
    /// Traffic for keys we do not have from this peer's address: handshake now.
    Kick(u32),
}

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

/// Messages from the control thread to the capture thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToCapture {
    /// The peer has keys: send what waited for them.
    Established(u32),
    /// The peer cannot be reached: drop what waited for it.
    GaveUp(u32),
}

/// State every thread shares.
#[derive(Debug)]
pub struct Shared {
    /// The LAN segment.
    pub lan: Lan,
    /// Who holds which address.
    pub table: LanTable,
    /// The peers.
    pub peers: PeerTable,
    /// Data-plane counters.
    pub counters: Counters,
    /// Packet buffers.
    pub pool: Pool,
    /// Cleared to stop the data threads.
    pub running: AtomicBool,
    /// To the control thread (bounded; data threads only `try_send`).
    pub control: tokio::sync::mpsc::Sender<ToControl>,
    /// To the LAN services on the control thread (bounded; `try_send` only).
    pub services_tx: tokio::sync::mpsc::Sender<ToServices>,
    /// Whether the DHCP server runs (otherwise DHCP messages are only counted).
    pub dhcp_on: bool,
    /// Whether the DNS service runs.
    pub dns_on: bool,
    /// The services' part of the status document.
    pub services: std::sync::Mutex<ServicesStatus>,
    /// The control plane's part of the status document (null without a cloud).
    pub cloud: std::sync::Mutex<serde_json::Value>,
    /// Wakes the control thread when a peer's timers changed on a data thread.
    pub notify: tokio::sync::Notify,
}

impl Shared {
    /// Wakes the control thread (never blocks).
    pub fn wake_control(&self) {
        self.notify.notify_one();
    }
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

    let iface = Interface::lookup_up(&config.lan_interface)?;
    if d.disable_offloads {
        for state in cyphonic_netio::disable_receive_offloads(&iface.name)? {
            match (state.was_on, state.now_on) {
                (Some(true), Some(false)) => {
                    tracing::info!(interface = %iface.name, offload = ?state.offload, "switched off: every frame arrives as it was on the wire");
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
            recv_buffer: d.lan_buffer,
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
    let lan_tx = capture_sock
        .try_clone()
        .context("duplicating the LAN socket")?;
    let udp = UdpSocket::bind(
        config.listen,
        &UdpOptions {
            recv_buffer: d.udp_buffer,
            send_buffer: d.udp_buffer,
            ..UdpOptions::default()
        },
    )?;
    tracing::info!(listen = %udp.local_addr()?, buffers = ?udp.buffer_sizes(), "tunnel socket bound");

    let lan = Lan {
        mac: iface.mac,
        gateway_ip: config.gateway_vip,
        block: config.lan_block,
        overlay: config.overlay,
        inner_mtu: config.inner_mtu,
        mss_clamp: config.mss_clamp,
    };
    let timing = Timing::default();
    let mut slots = Vec::new();
    let mut keys = Vec::new();
    for (i, p) in config.peers.iter().enumerate() {
        let id = u32::try_from(i + 1).context("too many peers")?;
        let mut pc = PeerConfig::from_certificate(&p.certificate, p.endpoint);
        pc.persistent_keepalive = p.persistent_keepalive;
        keys.push(PublicKey(p.certificate.body().public_key));
        slots.push(Arc::new(PeerSlot::new(
            id,
            &p.certificate,
            "static",
            Peer::new(id, identity.clone(), pc, timing, clock, d.aead),
        )));
    }
    let (control_tx, control_rx) = tokio::sync::mpsc::channel(1024);
    let (services_tx, services_rx) = tokio::sync::mpsc::channel(SERVICES_QUEUE);
    let shared = Arc::new(Shared {
        lan,
        table: LanTable::new(&config.reservations),
        peers: PeerTable::new(slots, &keys),
        counters: Counters::default(),
        pool: Pool::new(d.buffers),
        running: AtomicBool::new(true),
        control: control_tx,
        services_tx,
        dhcp_on: config.dhcp.is_some(),
        dns_on: config.dns.is_some(),
        services: std::sync::Mutex::new(ServicesStatus::default()),
        cloud: std::sync::Mutex::new(config.cloud.as_ref().map_or(
            serde_json::Value::Null,
            |c| serde_json::json!({ "address": c.address.to_string(), "connected": false }),
        )),
        notify: tokio::sync::Notify::new(),
    });
    // The control runtime exists before the services: the upstream resolver spawns on it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    let (upstream_tx, upstream_rx) = tokio::sync::mpsc::channel(256);
    let (answers_tx, cloud_answers) = tokio::sync::mpsc::channel(256);
    let tunnel_port = udp.local_addr()?.port();
    let cloud = config.cloud.as_ref().map(|c| {
        let _in_runtime = runtime.enter();
        let (handle, events) = cyphonic_signal::spawn(
            cyphonic_signal::Config {
                cloud: c.address,
                cloud_key: c.public_key,
                agent: format!("cyphonic-adapter {}", env!("CARGO_PKG_VERSION")),
                tunnel_port: Some(tunnel_port),
            },
            identity.clone(),
        );
        tracing::info!(cloud = %c.address, key = %c.public_key, "control plane: connecting");
        CloudLink::new(
            handle,
            events,
            c.endpoints.clone(),
            identity.clone(),
            timing,
            clock,
            d.aead,
            config.dns.as_ref().map_or(60, |d| d.ttl),
        )
    });
    let asker = cloud.as_ref().map(|c| Asker {
        handle: c.handle.clone(),
        answers: answers_tx,
    });
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

    let workers = if d.workers == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    } else {
        d.workers
    };
    let rayon = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("cy-crypto-{i}"))
            .build()
            .context("starting the crypto workers")?,
    );
    let pconfig = |name: &str| cyphonic_pipeline::Config {
        batch_size: d.batch_size,
        batches_in_flight: d.batches_in_flight,
        ordering: d.ordering,
        name: name.to_owned(),
    };
    let udp_tx = udp.try_clone().context("duplicating the tunnel socket")?;
    let (egress_seq, egress_emit) = cyphonic_pipeline::start(
        &pconfig("cy-egress-emit"),
        rayon.clone(),
        SealStage {
            shared: shared.clone(),
        },
        UdpSink {
            shared: shared.clone(),
            udp: udp_tx,
            batch: Vec::with_capacity(64),
        },
    )?;
    let (ingress_seq, ingress_emit) = cyphonic_pipeline::start(
        &pconfig("cy-ingress-emit"),
        rayon,
        OpenStage,
        LanSink {
            shared: shared.clone(),
            lan_tx,
            batch: Vec::with_capacity(64),
            arp_sent: std::collections::HashMap::new(),
            out: [0; 64],
        },
    )?;
    let status = Arc::new(Static {
        name: name.clone(),
        lan_interface: iface.name.clone(),
        listen: udp.local_addr()?.to_string(),
        gateway_vip: config.gateway_vip.to_string(),
        lan_block: config.lan_block.to_string(),
        started,
        egress: egress_seq.counters().clone(),
        ingress: ingress_seq.counters().clone(),
    });

    let (to_capture, capture_events) = crossbeam_channel::bounded(1024);
    let capture = Capture {
        shared: shared.clone(),
        sock: capture_sock,
        seq: egress_seq,
        events: capture_events,
        queue_per_peer: d.queue_per_peer,
    };
    let capture = std::thread::Builder::new()
        .name("cy-capture".into())
        .spawn(move || capture.run())
        .context("starting the capture thread")?;
    let receiver = Receiver {
        shared: shared.clone(),
        udp: udp.try_clone().context("duplicating the tunnel socket")?,
        seq: ingress_seq,
    };
    let receiver = std::thread::Builder::new()
        .name("cy-udp-rx".into())
        .spawn(move || receiver.run())
        .context("starting the receive thread")?;

    tracing::info!(
        %name,
        lan_block = %config.lan_block,
        gateway = %config.gateway_vip,
        peers = config.peers.len(),
        reservations = config.reservations.len(),
        workers,
        aead = %d.aead,
        "cyphonic-adapter running"
    );
    let control = Control {
        shared: shared.clone(),
        identity,
        udp,
        rx: control_rx,
        to_capture,
        clock,
        status,
        status_socket: config.status_socket.clone(),
        kicks: std::collections::HashMap::new(),
        services,
        services_rx,
        upstream_rx,
        cloud,
        cloud_answers,
    };
    let result = runtime.block_on(control.run());

    // Stop the data threads; dropping their sequencers drains the pipelines.
    shared.running.store(false, Ordering::Relaxed);
    let joined = [capture.join(), receiver.join()];
    let _ = egress_emit.join();
    let _ = ingress_emit.join();
    if joined.iter().any(Result::is_err) {
        anyhow::bail!("a data thread panicked");
    }
    // Give the log a moment to flush before the process exits.
    std::thread::sleep(Duration::from_millis(10));
    result
}
