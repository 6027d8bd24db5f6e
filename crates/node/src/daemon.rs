//! Builds the node from its configuration and runs it: the TUN device, the tunnel socket, the
//! engine's threads, the control runtime with the DNS stub. The only place that knows how the
//! parts fit together.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use cyphonic_netio::{Tun, UdpOptions, UdpSocket};
use cyphonic_session::{Clock, Identity, Timing};
use cyphonic_tunnel::{CloudLink, CloudSettings, DataPlane, Engine, Hooks, StaticPeer};
use ipnet::Ipv4Net;
use serde_json::{Value, json};

use crate::config::Config;
use crate::dns::Stub;
use crate::edge::{Counters, TunReader, TunSink};

/// Wake at least this often even with no timer due (cheap; bounds any missed wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(500);

/// State every thread shares.
#[derive(Debug)]
pub struct Shared {
    /// The tunnel engine's.
    pub tunnel: Arc<cyphonic_tunnel::Shared>,
    /// The overlay interface.
    pub tun: Tun,
    /// Our vIP.
    pub vip: Ipv4Addr,
    /// Our certified block: what peers may send to.
    pub block: Ipv4Net,
    /// The overlay: what we send into the tunnel.
    pub overlay: Ipv4Net,
    /// The TUN side's counters.
    pub counters: Counters,
}

/// What does not change while the node runs, for the status document.
struct Static {
    name: String,
    interface: String,
    vip: String,
    listen: String,
    started: Instant,
    egress: Arc<cyphonic_pipeline::Counters>,
    ingress: Arc<cyphonic_pipeline::Counters>,
}

fn snapshot(shared: &Shared, info: &Static, dns: &Value) -> Value {
    let mut doc = cyphonic_tunnel::status::document(
        &shared.tunnel,
        &info.egress,
        &info.ingress,
        shared.counters.snapshot(),
    );
    doc.insert(
        "node".into(),
        json!({
            "name": info.name,
            "interface": info.interface,
            "vip": info.vip,
            "listen": info.listen,
            "uptime_secs": info.started.elapsed().as_secs(),
        }),
    );
    doc.insert("dns".into(), dns.clone());
    Value::Object(doc)
}

/// The node's own metrics: the TUN side's counters and the DNS stub's.
#[derive(Debug)]
struct NodeCollector {
    shared: Arc<Shared>,
    dns: Arc<std::sync::Mutex<Value>>,
}

impl cyphonic_telemetry::metrics::Collector for NodeCollector {
    fn encode(
        &self,
        mut e: cyphonic_telemetry::metrics::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use cyphonic_tunnel::metrics::PREFIX;
        self.shared.counters.encode(PREFIX, &mut e)?;
        let dns = self.dns.lock().map(|d| d.clone()).unwrap_or_default();
        cyphonic_telemetry::metrics::json_counters(
            &mut e,
            &format!("{PREFIX}_dns"),
            "DNS stub",
            &dns,
        )
    }
}

/// Runs the node until SIGINT or SIGTERM.
///
/// # Errors
/// Anything that prevents starting: the TUN device, sockets, threads. Each says what to fix.
#[expect(clippy::too_many_lines, reason = "wiring, one part after the other")]
pub fn run(config: &Config, identity: Identity) -> anyhow::Result<()> {
    let started = Instant::now();
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let clock = Clock::new(started, unix);
    let identity = Arc::new(identity);
    let name = identity.certificate().body().name.clone();
    let d = &config.dataplane;

    let tun = Tun::create(&config.interface)?;
    tun.configure(
        config.vip,
        config.overlay.prefix_len(),
        u32::from(config.inner_mtu),
    )?;
    tracing::info!(interface = tun.name(), vip = %config.vip, overlay = %config.overlay, mtu = config.inner_mtu, "overlay interface up");
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
            Value::Null,
            |c| json!({ "address": c.address.to_string(), "connected": false }),
        ),
    );
    let tunnel = Arc::new(tunnel);
    let interface = tun.name().to_owned();
    let shared = Arc::new(Shared {
        tunnel: tunnel.clone(),
        tun,
        vip: config.vip,
        block: config.block,
        overlay: config.overlay,
        counters: Counters::default(),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    let tunnel_port = udp.local_addr()?.port();
    let (cloud, asker, cloud_answers) = match &config.cloud {
        Some(c) => {
            let _in_runtime = runtime.enter();
            let settings = CloudSettings {
                address: c.address,
                public_key: c.public_key,
                endpoints: c.endpoints.clone(),
                agent: format!("cyphonic-node {}", env!("CARGO_PKG_VERSION")),
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
    let (upstream_tx, mut upstream_rx) = tokio::sync::mpsc::channel(256);
    let stub = match &config.dns {
        Some(dns) => Some(runtime.block_on(Stub::new(config, dns, &name, asker, upstream_tx))?),
        None => None,
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
        TunSink {
            shared: shared.clone(),
        },
    )?;
    let info = Arc::new(Static {
        name: name.clone(),
        interface,
        vip: config.vip.to_string(),
        listen: udp.local_addr()?.to_string(),
        started,
        egress: engine.egress.clone(),
        ingress: engine.ingress.clone(),
    });
    let dns_status = Arc::new(std::sync::Mutex::new(Value::Null));
    if let Some(addr) = config.metrics {
        let node = NodeCollector {
            shared: shared.clone(),
            dns: dns_status.clone(),
        };
        cyphonic_telemetry::metrics::serve(
            addr,
            vec![Box::new(engine.collector()), Box::new(node)],
        )
        .with_context(|| format!("opening the metrics endpoint {addr} ([metrics] listen)"))?;
    }
    let reader = TunReader::new(shared.clone(), engine.take_submitter(), d.busy_poll);
    let reader = std::thread::Builder::new()
        .name("cy-tun".into())
        .spawn({
            let place = engine.place_thread();
            move || {
                place();
                reader.run();
            }
        })
        .context("starting the TUN thread")?;
    tracing::info!(
        %name,
        vip = %config.vip,
        peers = config.peers.len(),
        workers = engine.workers,
        aead = %d.aead,
        "cyphonic-node running"
    );
    let mut core = cyphonic_tunnel::Control::new(
        tunnel.clone(),
        identity,
        udp,
        engine.to_egress(),
        clock,
        cloud,
        control_rx,
        cloud_answers,
    );
    let names = vec![cyphonic_signal_name(&name, config.vip)];
    let status_socket = config.status_socket.clone();
    let result = runtime.block_on(async {
        let _status = {
            let (shared, info, dns_status) = (shared.clone(), info.clone(), dns_status.clone());
            cyphonic_telemetry::status::serve(&status_socket, move || {
                let dns = dns_status.lock().map_or(Value::Null, |d| d.clone());
                snapshot(&shared, &info, &dns)
            })
            .with_context(|| format!("opening the status socket {}", status_socket.display()))?
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .context("installing the SIGINT handler")?;
        let mut services = Services { stub };
        let mut buf = vec![0u8; 4096];
        core.register(1, &names);
        loop {
            let now = Instant::now();
            if let Some(s) = services.stub.as_mut() {
                s.tick(now);
            }
            core.run_timers(now, &mut services);
            if let Some(s) = &services.stub
                && let Ok(mut d) = dns_status.lock()
            {
                *d = s.status();
            }
            let deadline = core
                .next_deadline()
                .into_iter()
                .chain(services.stub.as_ref().and_then(Stub::poll_timeout))
                .min()
                .unwrap_or(now + MAX_SLEEP)
                .min(now + MAX_SLEEP);
            let sock = services.stub.as_ref().map(|s| s.sock.clone());
            tokio::select! {
                msg = core.rx.recv() => match msg {
                    Some(msg) => core.handle(msg, &mut services),
                    None => break,
                },
                Some(answer) = core.cloud_answers.recv() => core.cloud_answered(answer, &mut services),
                Some(event) = cyphonic_tunnel::control::cloud_event(&mut core.cloud) => core.handle_cloud_event(event, &mut services),
                Some(done) = upstream_rx.recv() => services.settled(done),
                Some((n, from)) = recv(sock.as_deref(), &mut buf) => {
                    if let Some(s) = services.stub.as_mut() {
                        s.handle(Instant::now(), &buf[..n], from);
                    }
                }
                () = tunnel.notify.notified() => {}
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {}
                _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
                _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            }
        }
        Ok::<_, anyhow::Error>(())
    });

    let stopped = engine.stop();
    let read = reader.join();
    if stopped.is_err() || read.is_err() {
        anyhow::bail!("a data thread panicked");
    }
    std::thread::sleep(Duration::from_millis(10));
    result
}

/// The next datagram on the stub's socket, or never without one.
async fn recv(
    sock: Option<&tokio::net::UdpSocket>,
    buf: &mut [u8],
) -> Option<(usize, std::net::SocketAddr)> {
    match sock {
        Some(s) => s.recv_from(buf).await.ok(),
        None => std::future::pending().await,
    }
}

/// The name the node registers: its own, at its vIP.
fn cyphonic_signal_name(name: &str, vip: Ipv4Addr) -> cyphonic_signal::NameRecord {
    cyphonic_signal::NameRecord {
        name: name.to_owned(),
        vip,
    }
}

/// The node's services on the control thread: the DNS stub, when it runs.
struct Services {
    stub: Option<Stub>,
}

impl Hooks for Services {
    fn peer_up(&mut self, _peer: u32) {}

    fn peer_gave_up(&mut self, _peer: u32) {}

    fn settled(&mut self, settled: cyphonic_tunnel::Settled) {
        if let Some(s) = self.stub.as_mut() {
            s.settled(settled);
        }
    }
}
