//! The shared daemon core: what every tunnel end (`cyphonic-adapter`, `cyphonic-node`) runs
//! around the engine, written once. An end supplies only its [`Edge`]:
//! the adapter its capture thread, its LAN sink and its LAN services; the node its TUN
//! reader and writer and its DNS stub.
//!
//! ```text
//! run():   the log filter, the tunnel socket (UDP), the process's signals -> run_on()
//! run_on(): clock, identity, static peers, Engine::start(edge's sink) on the devices
//!        -> the edge's services and threads -> metrics endpoint
//!        -> the control loop (one tokio current-thread runtime), a Loop::step per wake-up:
//!             tunnel::Control  handshakes, peer timers, relay channels
//!             CloudLink        the signal client: peers on demand, DNS answers, relays
//!             Upstream         DNS forwarded outside the overlay
//!             the edge's Services, the status socket, Signals (reload, stop)
//!        -> stop: the engine drains, the edge's threads end
//! ```
//!
//! [`run_on`] takes its devices ([`Devices`]: the tunnel socket and the signals), so that
//! tests run whole tunnel ends in one process over an in-memory link (module `testing`,
//! feature `testing`).
//!
//! Also here: the typed [`status`] document both ends serve and their `status` commands
//! read, the engine's [`metrics`], and the command line both binaries share ([`cli`]).
//!
//! What it deliberately does not do: touch packets (the engine and the edges do), or know
//! what an edge is made of (a LAN port, a TUN device).

#![forbid(unsafe_code)]

pub mod cli;
pub mod cloud;
pub mod dns;
pub mod enroll;
pub mod expiry;
pub mod metrics;
pub mod rules;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use cyphonic_netio::UdpSocket;
use cyphonic_pipeline::{Sink, ThreadStart};
use cyphonic_session::{Clock, Identity};
use cyphonic_settings::Common;
use cyphonic_signal::NameRecord;
use cyphonic_telemetry::CounterSet;
use cyphonic_telemetry::metrics::Collector;
use cyphonic_tunnel::control::Removal;
use cyphonic_tunnel::socket::TunnelSocket;
use cyphonic_tunnel::{
    Accepted, Control, ControlEvent, DataPlane, Engine, Intake, Local, Shared, SparseIntake,
    SparseSubmitter,
};
use serde::Serialize;
use tokio::sync::mpsc;

pub use cloud::{Asker, CloudAnswer, CloudLink, CloudSettings, CloudWork, Settled};
pub use status::Status;
pub use upstream::Upstream;

/// Wake at least this often even with no timer due (cheap; bounds any missed wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(500);
/// Messages the data threads may queue for the control thread.
const CONTROL_QUEUE: usize = 1024;

/// What the core hands an edge: the running engine, and what the daemon is.
#[derive(Debug, Clone)]
pub struct Core {
    /// Our FQDN.
    pub name: String,
    /// The tunnel socket's address.
    pub listen: SocketAddr,
    /// When the daemon started.
    pub started: Instant,
    /// The engine's shared state: peers, buffers, its counters.
    pub shared: Arc<Shared>,
    /// The way into the tunnel (the edge thread's packets, and the services' own).
    pub intake: Intake,
    /// The data plane's parameters.
    pub dataplane: DataPlane,
    /// What every data-plane thread runs first (placement): the edge's threads too.
    pub thread_start: ThreadStart,
    /// The ways into the tunnel for the edge's threads that read only sparse traffic, one
    /// per `DataPlane::sparse_threads` entry, each with what its thread runs first (its CPU,
    /// then `dataplane.sparse_priority`).
    pub sparse: SparseIntake,
}

impl Core {
    /// Starts one of the edge's data-plane threads, `name` (`cy-capture`): placed as
    /// `[dataplane]` says first, then `run`.
    ///
    /// # Errors
    /// The thread cannot start.
    pub fn spawn(
        &self,
        name: &str,
        run: impl FnOnce() + Send + 'static,
    ) -> anyhow::Result<std::thread::JoinHandle<()>> {
        let place = self.thread_start.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                (place.0)();
                run();
            })
            .with_context(|| format!("starting the {name} thread"))
    }

    /// Starts the edge's threads that read only sparse traffic, one per source in `sources`
    /// (in `DataPlane::sparse_threads`'s order, as the edge opened them), each named `name`
    /// and its CPU, running `run` on its source with its way into the tunnel; none when
    /// there are none (`dataplane.sparse_socket` off, or taken already).
    ///
    /// # Errors
    /// A thread cannot start, or the engine has fewer ways in than `sources` (their frames
    /// would never be read).
    pub fn spawn_sparse<T: Send + 'static>(
        &self,
        name: &str,
        sources: Vec<T>,
        run: impl Fn(T, SparseSubmitter) + Clone + Send + 'static,
    ) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        let ways = self.sparse.take();
        anyhow::ensure!(
            ways.len() >= sources.len(),
            "{} sparse sources but {} sparse lanes in the engine",
            sources.len(),
            ways.len()
        );
        sources
            .into_iter()
            .zip(ways)
            .map(|(source, way)| {
                let run = run.clone();
                let name = cyphonic_tunnel::sparse_thread_name(name, way.cpu);
                std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        (way.start.0)();
                        run(source, way.submitter);
                    })
                    .with_context(|| format!("starting the {name} thread"))
            })
            .collect()
    }
}

/// The static peers in the peer table, each with the id the engine gave it.
pub type StaticPeers = Vec<(u32, cyphonic_settings::Peer)>;

/// Reads the configuration file again, as at start (every check, file:line: key errors): the
/// keys every end has, our identity, and what the edge's services take of its own keys
/// (`R`). The reader names the edge's keys that take effect only at a restart.
pub type Reloader<R> = Box<dyn FnMut() -> anyhow::Result<(Common, Identity, R)>>;

/// What an edge's services get to work with.
#[derive(Debug)]
pub struct ServiceContext {
    /// The running engine.
    pub core: Core,
    /// Asks the cloud about names, when a cloud is configured.
    pub cloud: Option<Asker>,
    /// Asks the upstream resolvers, when `[dns] upstream` names some.
    pub upstream: Option<Upstream>,
    /// The static peers, by their ids in the engine.
    pub peers: StaticPeers,
}

/// The edge's part of the status document, and its counters, as they are now. Called on the
/// status socket's thread.
pub type Reporter<S, C> = Box<dyn Fn() -> (S, C) + Send + Sync>;

/// What differs between tunnel ends: how packets enter and leave the engine, and the
/// services next to it.
pub trait Edge {
    /// The program, for logs and the cloud (`cyphonic-adapter`).
    const PROGRAM: &'static str;
    /// The sink at the end of the ingress pipeline: where decrypted packets go.
    type Sink: Sink<Item = Accepted>;
    /// The services on the control thread.
    type Services: Services;
    /// Its part of the status document (flattened into [`Status`]).
    type Status: Serialize + Send + 'static;
    /// Its counters (the status document's `counters` table holds them with the engine's).
    type Counters: Serialize + CounterSet + Send + 'static;

    /// An ingress sink; called two or more times before the engine starts: the emitter's,
    /// the express lane's own (used on the tunnel receiver's thread, beside the first), and
    /// with `dataplane.sparse_socket` each sparse receive thread's. It gets only packets the
    /// engine accepted ([`Accepted`]).
    ///
    /// # Errors
    /// What the edge cannot set up.
    fn sink(&mut self) -> anyhow::Result<Self::Sink>;

    /// The services; called on the control runtime (entered), once the engine runs and
    /// before the edge's threads start.
    ///
    /// # Errors
    /// What the services cannot set up (their state directory, their socket).
    fn services(&mut self, ctx: ServiceContext) -> anyhow::Result<Self::Services>;

    /// Starts the edge's data threads: they feed `core.intake`, run `core.thread_start`
    /// first, and end once `core.shared` stops running.
    ///
    /// # Errors
    /// A thread cannot start.
    fn start(&mut self, core: &Core) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>>;

    /// Its part of the status document and its counters.
    fn reporter(&self, core: &Core) -> Reporter<Self::Status, Self::Counters>;

    /// Its counters, as the engine's metrics write them beside its own (a drop of either is
    /// a row of one `cyphonic_dropped` family).
    fn counters(&self) -> Arc<dyn CounterSet + Send + Sync>;

    /// Its other metrics (next to the engine's).
    fn collector(&self, core: &Core) -> Box<dyn Collector>;

    /// A wall clock (since the unix epoch) this end's handshake timestamps are to stay
    /// above: an HA pair's new active box has the newest clock the other box's heartbeats
    /// carried, since peers refuse an initiation not newer than the last they took from the
    /// site (docs/protocol.md §5). `None`: the system clock alone.
    fn clock_floor(&self) -> Option<Duration> {
        None
    }

    /// Whether to handshake with every static peer at once, not at the first packet for
    /// it: an HA pair's new active box is to have its tunnels before the devices' traffic
    /// reaches it, and its handshakes move the peers to it (docs/protocol.md §5).
    fn handshake_at_start(&self) -> bool {
        false
    }
}

/// How far ahead of the system clock a [`Edge::clock_floor`] is followed: beyond it, the two
/// clocks disagree too much to trust either, and the system's stays.
pub const CLOCK_FLOOR_AHEAD: Duration = Duration::from_secs(10);

/// The wall clock a tunnel end starts from: `system`, or just above `floor` when that is
/// ahead of it by at most [`CLOCK_FLOOR_AHEAD`]. Returns it, and how far it moved forward
/// (`Err`: the floor is further ahead, and was not followed).
pub fn floored(
    system: Duration,
    floor: Option<Duration>,
) -> (Duration, Result<Duration, Duration>) {
    match floor {
        Some(f) if f >= system => {
            let ahead = f - system;
            if ahead <= CLOCK_FLOOR_AHEAD {
                let start = f + Duration::from_millis(1);
                (start, Ok(start - system))
            } else {
                (system, Err(ahead))
            }
        }
        _ => (system, Ok(Duration::ZERO)),
    }
}

/// An edge's services, on the control thread: they wait for their own work, run timers, and
/// hear what the engine and the cloud settled.
pub trait Services {
    /// What woke them.
    type Work;
    /// What they take of a configuration read again (SIGHUP).
    type Reload;

    /// Waits for the next piece of work. Cancel-safe: nothing is lost when another wake-up
    /// comes first (receives on channels and sockets are).
    fn next(&mut self) -> impl Future<Output = Self::Work>;

    /// Does it.
    fn handle(&mut self, work: Self::Work, now: Instant);

    /// Runs the timers due at `now` (called on every wake-up of the control loop).
    fn tick(&mut self, now: Instant);

    /// When [`Services::tick`] has work next.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The names we host, registered with the cloud, and a version that changes with them.
    fn hosted(&self) -> (u64, &[NameRecord]);

    /// A DNS question parked for the cloud or the upstream resolvers is settled.
    fn settled(&mut self, settled: Settled);

    /// A peer's keys are usable.
    fn peer_up(&mut self, _peer: u32) {}

    /// A peer could not be reached.
    fn peer_gave_up(&mut self, _peer: u32) {}

    /// The configuration file was read again (SIGHUP) and accepted: their part of it.
    fn reload(&mut self, edge: Self::Reload, now: Instant);

    /// The static peers are now these (a reload, a peer removed).
    fn set_peers(&mut self, peers: &StaticPeers);

    /// The upstream resolvers are now these (a reload changed `[dns] upstream`).
    fn set_upstream(&mut self, upstream: Option<Upstream>);

    /// The cloud peers in use changed: their fingerprints, sorted. An edge that keeps state
    /// for whoever holds this tunnel end next (the adapter's lease file) keeps them.
    fn cloud_peers(&mut self, _fingerprints: &[String]) {}

    /// What this tunnel end reports to the cloud of the HA pair it serves for
    /// (docs/protocol.md §5, *Seen from the cloud*); none when it is not one of a pair.
    fn pair(&self) -> Option<cyphonic_control::PairState> {
        None
    }

    /// The devices behind this tunnel end, as the cloud is told of them (docs/protocol.md
    /// §8, *Devices and tunnels*): an adapter's; a node has none.
    fn devices(&self) -> Vec<cyphonic_control::DeviceReport> {
        Vec::new()
    }

    /// The cloud peers this tunnel end's previous holder had (kept by
    /// [`Services::cloud_peers`]), to be paired with again once the cloud is reached; asked
    /// once, at start.
    fn resumed_peers(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// Runs a tunnel end with `edge` until SIGINT or SIGTERM; on SIGHUP, reads the configuration
/// again with `reload` and applies what can change while running. Sets the process's log
/// filter from `[log] level` and binds the tunnel socket `listen` names, then [`run_on`].
///
/// # Errors
/// Anything that prevents starting: sockets, threads, the edge's own parts. Each says what
/// to fix.
pub fn run<E: Edge>(
    common: &Common,
    identity: Identity,
    edge: E,
    reload: Reloader<<E::Services as Services>::Reload>,
) -> anyhow::Result<()> {
    apply_log_level(None, common.log_level.as_deref());
    let udp = UdpSocket::bind(common.listen, &common.dataplane.udp_options())?;
    tracing::info!(listen = %udp.local_addr()?, buffers = ?udp.buffer_sizes(), gso = udp.segmentation(), gro = udp.coalescing(), "tunnel socket bound");
    run_on(
        common,
        identity,
        edge,
        reload,
        Devices {
            socket: Box::new(udp),
            signals: Signals::Process,
        },
    )
}

/// What a tunnel end runs on besides its edge: its underlay socket, and where it hears that
/// it is to stop or read its configuration again.
#[derive(Debug)]
pub struct Devices {
    /// The tunnel socket (the UDP socket `listen` names, or an in-memory link's).
    pub socket: Box<dyn TunnelSocket>,
    /// Its signals.
    pub signals: Signals,
}

/// What a running tunnel end is told from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Read the configuration again (SIGHUP).
    Reload,
    /// Stop (SIGTERM, SIGINT).
    Stop,
}

/// Where a tunnel end hears its [`Signal`]s.
#[derive(Debug)]
pub enum Signals {
    /// The process's: SIGHUP, SIGTERM and SIGINT.
    Process,
    /// A channel's (a test, or a program that runs tunnel ends of its own); its closing is
    /// a stop.
    Channel(mpsc::Receiver<Signal>),
}

impl Signals {
    /// A channel and its sending end.
    pub fn channel() -> (mpsc::Sender<Signal>, Self) {
        let (tx, rx) = mpsc::channel(8);
        (tx, Self::Channel(rx))
    }

    /// A channel the signals arrive on; for the process's, a task on the current runtime
    /// turns them into messages.
    ///
    /// # Errors
    /// A signal handler cannot be installed.
    fn listen(self) -> anyhow::Result<mpsc::Receiver<Signal>> {
        use tokio::signal::unix::{SignalKind, signal};
        let rx = match self {
            Self::Channel(rx) => rx,
            Self::Process => {
                let mut hup =
                    signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
                let mut term =
                    signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
                let mut int =
                    signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
                let (tx, rx) = mpsc::channel(8);
                tokio::spawn(async move {
                    loop {
                        let signal = tokio::select! {
                            _ = hup.recv() => Signal::Reload,
                            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); Signal::Stop }
                            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); Signal::Stop }
                        };
                        if tx.send(signal).await.is_err() {
                            return;
                        }
                    }
                });
                rx
            }
        };
        Ok(rx)
    }
}

/// Runs a tunnel end with `edge` on `devices` until a [`Signal::Stop`] (or the signals'
/// channel closing); at [`Signal::Reload`], reads the configuration again with `reload`.
/// Leaves the process's log filter alone (several ends may run in one process).
///
/// # Errors
/// Anything that prevents starting: the placement, threads, the status socket, the edge's
/// own parts. Each says what to fix.
pub fn run_on<E: Edge>(
    common: &Common,
    identity: Identity,
    mut edge: E,
    reload: Reloader<<E::Services as Services>::Reload>,
    devices: Devices,
) -> anyhow::Result<()> {
    let started = Instant::now();
    // What this program is, as its status, its metrics and the cloud are told.
    let build = cyphonic_telemetry::build!(E::PROGRAM);
    let system = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let (unix, moved) = floored(system, edge.clock_floor());
    match moved {
        Ok(d) if d > Duration::ZERO => {
            tracing::info!(
                ahead_ms = d.as_millis(),
                "starting from the clock the other box of the pair last showed, ahead of ours: handshakes stay newer than its"
            );
        }
        Ok(_) => {}
        Err(d) => tracing::warn!(
            ahead_secs = d.as_secs(),
            "the other box of the pair showed a clock far ahead of ours: not followed (peers may refuse our handshakes until ours passes it; check NTP on both)"
        ),
    }
    let clock = Clock::new(started, unix);
    let identity = Arc::new(identity);
    let name = identity.certificate().body().name.clone();
    let dp = &common.dataplane;
    dp.check_placement().map_err(anyhow::Error::msg)?;
    let Devices { socket, signals } = devices;
    let listen = socket
        .local_addr()
        .context("reading the tunnel socket's address")?;
    let timing = dp.timing();
    if dp.rekeys_shortened() {
        tracing::warn!(rekey_after = ?dp.rekey_after, rekey_after_messages = dp.rekey_after_messages, "danger_ keys in [dataplane]: keys rotate sooner than the defaults (for tests)");
    }
    let local = Local {
        identity: identity.clone(),
        clock: clock.clone(),
        timing,
        aead: dp.aead,
    };
    let (shared, control_rx) = Shared::new(local, dp.buffers, CONTROL_QUEUE);
    let peers = add_static_peers(&shared, common, Vec::new());
    let shared = Arc::new(shared);

    // The control runtime exists before the services: the upstream resolver and the signal
    // client spawn on it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    let (mut cloud, asker) = match &common.cloud {
        Some(c) => {
            let _in_runtime = runtime.enter();
            let settings = CloudSettings {
                addresses: c.addresses.clone(),
                public_keys: c.public_keys.clone(),
                endpoints: c.endpoints.clone(),
                agent: build.to_string(),
                dns_ttl: common.dns_ttl(),
                certificate_file: common.certificate_file.clone(),
                ca_file: common.ca_file.clone(),
                port_mapping: c.port_mapping,
            };
            let (link, asker) = CloudLink::connect(&settings, &shared, listen);
            (Some(link), Some(asker))
        }
        None => (None, None),
    };
    // The file's [policy], or with a cloud the set it sent last (kept beside our certificate).
    let rules = match &common.cloud {
        Some(_) => rules::Rules::with_cloud(
            common.policy.clone(),
            common
                .certificate_file
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join(rules::STORED),
            common.dns_rules.clone(),
        ),
        None => rules::Rules::from_file(common.policy.clone()),
    };
    rules.apply(&shared);
    if let Some(p) = rules.effective() {
        tracing::info!(rules = p.rules.rules.len(), version = %format_args!("{:x}", p.rules.version), flows = p.flows, "per-device policy in force: new flows only as its rules allow");
    }
    let (upstream_tx, upstream_rx) = mpsc::channel(256);
    let upstream = {
        let _in_runtime = runtime.enter();
        upstream_for(common, &upstream_tx)?
    };

    let (sink, express) = (edge.sink()?, edge.sink()?);
    let lanes = dp
        .sparse_threads()
        .iter()
        .map(|_| edge.sink())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let engine = Engine::start(dp, &shared, &*socket, sink, Some(express), lanes, true)?;
    let core = Core {
        name: name.clone(),
        listen,
        started,
        shared: shared.clone(),
        intake: engine.intake(),
        dataplane: dp.clone(),
        thread_start: engine.thread_start(),
        sparse: engine.sparse_intake(),
    };
    let mut services = {
        let _in_runtime = runtime.enter();
        edge.services(ServiceContext {
            core: core.clone(),
            cloud: asker,
            upstream,
            peers: peers.clone(),
        })?
    };
    if let Some(c) = cloud.as_mut() {
        c.resume(services.resumed_peers());
    }
    let cloud_status = cloud.as_ref().map(CloudLink::status);
    let stream_stats = cloud.as_ref().and_then(CloudLink::stream_stats);
    let carried = cloud.as_ref().and_then(CloudLink::carried);
    // Served until this end stops (an end in a test harness frees its address).
    let _metrics = if let Some(addr) = common.metrics {
        let engine_metrics = metrics::EngineCollector::new(
            shared.clone(),
            edge.counters(),
            engine.egress_counters.clone(),
            engine.ingress_counters.clone(),
            cloud_status.clone(),
        )
        .with_streams(stream_stats);
        let endpoint = cyphonic_telemetry::metrics::start(
            addr,
            build,
            vec![Box::new(engine_metrics), edge.collector(&core)],
        )
        .with_context(|| format!("opening the metrics endpoint {addr} ([metrics] listen)"))?;
        Some(endpoint)
    } else {
        None
    };
    let report = {
        let (shared, egress, ingress) = (
            shared.clone(),
            engine.egress_counters.clone(),
            engine.ingress_counters.clone(),
        );
        let edge_report = edge.reporter(&core);
        move || {
            let (edge, edge_counters) = edge_report();
            let now = Instant::now();
            Status {
                version: status::VERSION,
                edge,
                at: shared.clock().unix_secs(now),
                software: build.to_string(),
                certificate: Some(status::CertificateStatus::of(
                    shared.identity().certificate(),
                )),
                peers: status::peers(&shared, now, carried.as_ref()),
                cloud: cloud_status.as_ref().map(|c| {
                    c.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone()
                }),
                counters: status::CounterTable {
                    edge: edge_counters,
                    engine: shared.counters().copied(),
                },
                pipelines: status::Pipelines {
                    egress: (&egress.snapshot()).into(),
                    ingress: (&ingress.snapshot()).into(),
                },
                buffers: status::Buffers {
                    allocated: shared.pool().allocated(),
                    free: shared.pool().free(),
                },
                policy: shared.policy().report().as_ref().map(Into::into),
            }
        }
    };
    let threads = edge.start(&core)?;
    tracing::info!(
        %name,
        peers = common.peers.len(),
        workers = engine.workers,
        aead = %dp.aead,
        "{} running",
        E::PROGRAM
    );
    let mut control = Control::new(shared.clone(), socket, core.intake.clone());
    control.set_idle_timeout(common.cloud.as_ref().map(|c| c.idle_peer_timeout));
    if edge.handshake_at_start() {
        let now = Instant::now();
        for slot in peers.iter().filter_map(|(id, _)| shared.peers().by_id(*id)) {
            control.initiate(&slot, now);
        }
    }
    drop(core);
    let result = runtime.block_on(control_loop(
        Loop {
            control,
            rx: control_rx,
            services,
            cloud,
            rules,
            upstream: upstream_rx,
            clock,
            running: Running {
                common: common.clone(),
                peers,
                reload,
                upstream: upstream_tx,
            },
            expiry: expiry::Watch::default(),
        },
        signals,
        report,
    ));

    // Stop the data threads: the submitter goes, the pipelines drain, the edge's threads see
    // `running` clear and end.
    let stopped = engine.stop();
    let mut panicked = stopped.is_err();
    for t in threads {
        panicked |= t.join().is_err();
    }
    if panicked {
        anyhow::bail!("a data thread panicked");
    }
    // Give the log a moment to flush before the process exits.
    std::thread::sleep(Duration::from_millis(10));
    result
}

/// The upstream resolvers `common` names, answering into `tx`; none without.
///
/// # Errors
/// The resolver cannot be set up.
fn upstream_for(common: &Common, tx: &mpsc::Sender<Settled>) -> anyhow::Result<Option<Upstream>> {
    match common.dns.as_ref().filter(|d| !d.upstream.is_empty()) {
        Some(d) => Upstream::new(&d.upstream, tx.clone())
            .map(Some)
            .context("setting up the upstream DNS resolvers"),
        None => Ok(None),
    }
}

/// Sets the log filter `[log] level` names, when it differs from `was` (`RUST_LOG`, when set,
/// wins; without either, `info`).
fn apply_log_level(was: Option<&str>, level: Option<&str>) {
    if was == level {
        return;
    }
    if cyphonic_telemetry::logging::env_filter_set() {
        tracing::info!(level = ?level, "RUST_LOG is set: it keeps deciding what is logged, not log.level");
        return;
    }
    let directives = level.unwrap_or(cyphonic_telemetry::logging::DEFAULT_FILTER);
    match cyphonic_telemetry::logging::set_filter(directives) {
        Ok(()) => tracing::info!(level = directives, "log filter set"),
        Err(e) => tracing::error!(error = %e, "the log filter stays as it was"),
    }
}

/// Puts `common`'s static peers that are not revoked into the peer table, except those of
/// `kept` (already there, with their ids); returns all of them by id.
fn add_static_peers(shared: &Shared, common: &Common, mut kept: StaticPeers) -> StaticPeers {
    for p in &common.peers {
        let name = &p.certificate.body().name;
        if p.revoked {
            tracing::warn!(peer = %name, "static peer's certificate is revoked: not a peer");
        } else if !kept.iter().any(|(_, k)| same_peer(k, p)) {
            let slot = shared.add_static_peer(&p.to_static());
            tracing::debug!(peer = %name, id = slot.id, "static peer added");
            kept.push((slot.id, p.clone()));
        }
    }
    kept
}

/// Whether two static peers are the same to the engine: certificate, endpoint, keepalive.
fn same_peer(a: &cyphonic_settings::Peer, b: &cyphonic_settings::Peer) -> bool {
    a.certificate.fingerprint() == b.certificate.fingerprint()
        && a.endpoint == b.endpoint
        && a.persistent_keepalive == b.persistent_keepalive
}

/// What the daemon runs with now, and how to read its configuration again.
struct Running<R> {
    common: Common,
    /// The static peers in the table, by id.
    peers: StaticPeers,
    reload: Reloader<R>,
    /// Where upstream resolvers made on reload answer.
    upstream: mpsc::Sender<Settled>,
}

/// What the control loop drives.
struct Loop<S: Services> {
    control: Control,
    rx: mpsc::Receiver<cyphonic_tunnel::ToControl>,
    services: S,
    cloud: Option<CloudLink>,
    /// The per-device rules in force, and where they came from.
    rules: rules::Rules,
    upstream: mpsc::Receiver<Settled>,
    /// The wall-clock mapping every thread's certificate checks and handshake timestamps use.
    clock: Clock,
    running: Running<S::Reload>,
    /// When certificates' expiry is looked at next.
    expiry: expiry::Watch,
}

/// The cloud's next work, or never without a cloud.
async fn cloud_work(cloud: &mut Option<CloudLink>) -> Option<CloudWork> {
    match cloud {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

/// What woke the control loop.
#[expect(
    clippy::large_enum_variant,
    reason = "one at a time, on the control thread's stack, moved once"
)]
enum Wake<W> {
    /// A message from the data threads; `None`: they are gone.
    Message(Option<cyphonic_tunnel::ToControl>),
    /// The services' own work.
    Service(W),
    /// The upstream resolvers settled a question.
    Upstream(Settled),
    /// The cloud's.
    Cloud(CloudWork),
    /// From outside.
    Signal(Signal),
    /// A timer, or the data threads' nudge: only the upkeep.
    Timer,
}

/// Whether the control loop goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Go,
    Stop,
}

/// The control thread: every message, event and timer of the engine's control core, the
/// cloud and the edge's services, until a stop. Data threads reach it only by bounded
/// channels and a `Notify`; nothing here makes them wait. Each turn waits for one
/// [`Wake`] and runs [`Loop::step`].
async fn control_loop<S: Services, T: Serialize>(
    mut l: Loop<S>,
    signals: Signals,
    report: impl Fn() -> T + Send + 'static,
) -> anyhow::Result<()> {
    let status_socket = l.running.common.status_socket.clone();
    let _status = cyphonic_telemetry::status::serve(&status_socket, report)
        .with_context(|| format!("opening the status socket {}", status_socket.display()))?;
    let mut signals = signals.listen()?;
    // Peers with a persistent keepalive handshake right away and are kept up; the others
    // at their first packet (tests/ends.rs sees no keys before traffic).
    l.upkeep(Instant::now());
    // The data plane and this loop run: systemd may call the unit active, and watch it.
    cyphonic_telemetry::service::ready();
    let mut watchdog = cyphonic_telemetry::service::Watchdog::from_env(Instant::now());
    loop {
        let wake = l.wait(&mut signals).await;
        let now = Instant::now();
        if l.step(wake, now) == Flow::Stop {
            break;
        }
        // Pinged from here: a loop stuck anywhere above misses its pings and is restarted.
        if let Some(w) = watchdog.as_mut() {
            w.kick(now);
        }
    }
    cyphonic_telemetry::service::stopping();
    if let Some(c) = l.cloud.as_mut() {
        c.stop().await;
    }
    Ok(())
}

impl<S: Services> Loop<S> {
    /// Waits for what wakes the loop next: a message, the services' or the cloud's work, a
    /// signal, or the first timer due (at most [`MAX_SLEEP`] away).
    async fn wait(&mut self, signals: &mut mpsc::Receiver<Signal>) -> Wake<S::Work> {
        let now = Instant::now();
        let deadline = self
            .control
            .next_deadline()
            .into_iter()
            .chain(self.services.poll_timeout())
            .min()
            .unwrap_or(now + MAX_SLEEP)
            .min(now + MAX_SLEEP);
        let shared = self.control.shared();
        tokio::select! {
            msg = self.rx.recv() => Wake::Message(msg),
            work = self.services.next() => Wake::Service(work),
            Some(settled) = self.upstream.recv() => Wake::Upstream(settled),
            Some(work) = cloud_work(&mut self.cloud) => Wake::Cloud(work),
            signal = signals.recv() => Wake::Signal(signal.unwrap_or(Signal::Stop)),
            () = shared.control_woken() => Wake::Timer,
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => Wake::Timer,
        }
    }

    /// One turn of the loop: handles what woke it, then the upkeep at `now` (timers,
    /// registrations, events). [`Flow::Stop`] at a stop or when the data threads are gone.
    fn step(&mut self, wake: Wake<S::Work>, now: Instant) -> Flow {
        match wake {
            Wake::Message(Some(msg)) => self.control.handle(msg),
            Wake::Message(None) | Wake::Signal(Signal::Stop) => return Flow::Stop,
            Wake::Service(work) => self.services.handle(work, now),
            Wake::Upstream(settled) => self.services.settled(settled),
            Wake::Cloud(CloudWork::Event(cyphonic_signal::Event::Policy(set))) => {
                self.cloud_policy(set);
            }
            Wake::Cloud(work) => self.settle_from_cloud(|c, control| c.handle(work, control)),
            Wake::Signal(Signal::Reload) => {
                cyphonic_telemetry::service::reloading();
                self.reload(now);
                cyphonic_telemetry::service::ready();
            }
            Wake::Timer => {}
        }
        self.upkeep(now);
        Flow::Go
    }

    /// A reload: reads the configuration file again; a file with any mistake is refused whole
    /// and the running configuration stays. Otherwise the trust (CAs, revocations) applies at
    /// once (peers it no longer trusts leave), static peers follow the file (a changed one is
    /// replaced, an unchanged one keeps its tunnel), the upstream resolvers change; what
    /// needs a restart is named in the log.
    fn reload(&mut self, now: Instant) {
        tracing::info!(file = %self.running.common.path.display(), "SIGHUP: reading the configuration again");
        let (common, identity, edge) = match (self.running.reload)() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("the configuration is refused, the running one stays: {e:#}");
                return;
            }
        };
        let ours = self.control.shared().identity();
        let unix = self.clock.unix_secs(now);
        let same_cert = |a: &Identity, b: &Identity| {
            let (a, b) = (a.certificate().body(), b.certificate().body());
            a.name == b.name && a.vip_blocks == b.vip_blocks && a.groups == b.groups
        };
        let identity = if identity.public_key() == ours.public_key() && same_cert(&identity, &ours)
        {
            identity
        } else {
            tracing::warn!(
                "identity.key or what our certificate certifies changed: takes effect at the next restart (the trust applies now)"
            );
            match ours.with_trust(identity.trust().clone(), unix) {
                Ok(id) => id,
                Err(e) => {
                    tracing::error!(
                        "the configuration is refused, the running one stays: our running certificate does not verify under its trust: {e}"
                    );
                    return;
                }
            }
        };
        for key in self.running.common.needs_restart(&common) {
            tracing::warn!(key, "changed in the file: takes effect at the next restart");
        }
        // The cloud's issuing CAs stay trusted; a renewed certificate in the file reaches
        // the control session too.
        let identity = Arc::new(match self.cloud.as_ref() {
            Some(c) => c.with_learned(identity, unix),
            None => identity,
        });
        let removed = self.control.set_identity(&identity, now);
        if let Some(c) = self.cloud.as_ref() {
            c.set_identity(identity);
        }
        // Static peers: those gone from the file, or changed, leave; new ones come.
        let (kept, gone): (StaticPeers, StaticPeers) = std::mem::take(&mut self.running.peers)
            .into_iter()
            .partition(|(_, old)| common.active_peers().any(|p| same_peer(p, old)));
        for (id, _) in &gone {
            if let Some(slot) = self.control.shared().peers().by_id(*id) {
                self.control
                    .remove(&slot, &Removal::Dropped("no longer configured as it was"));
            }
        }
        // The kept ones take the file's other settings (their DNS server).
        let kept = kept
            .into_iter()
            .filter(|(id, _)| self.control.shared().peers().by_id(*id).is_some())
            .filter_map(|(id, old)| {
                common
                    .active_peers()
                    .find(|p| same_peer(p, &old))
                    .map(|p| (id, p.clone()))
            })
            .collect();
        self.running.peers = add_static_peers(self.control.shared(), &common, kept);
        self.services.set_peers(&self.running.peers);
        apply_log_level(
            self.running.common.log_level.as_deref(),
            common.log_level.as_deref(),
        );
        let upstreams = |c: &Common| {
            c.dns
                .as_ref()
                .map(|d| d.upstream.clone())
                .unwrap_or_default()
        };
        if upstreams(&common) != upstreams(&self.running.common) {
            match upstream_for(&common, &self.running.upstream) {
                Ok(u) => self.services.set_upstream(u),
                Err(e) => tracing::error!("the upstream resolvers stay as they were: {e:#}"),
            }
        }
        if self
            .rules
            .set_file(common.policy.clone(), common.dns_rules.clone())
        {
            self.apply_rules("the file's [policy]");
        }
        self.services.reload(edge, now);
        tracing::info!(
            revoked = self.control.shared().identity().trust().revocations().len(),
            peers_removed = removed.len() + gone.len(),
            static_peers = self.running.peers.len(),
            "configuration reloaded"
        );
        self.running.common = common;
        self.expiry.soon();
        self.upkeep(now);
    }

    /// The cloud sent its per-device rules (`None`: it enforces none).
    fn cloud_policy(&mut self, set: Option<cyphonic_filter::RuleSet>) {
        if self.rules.set_cloud(set) {
            self.apply_rules("the cloud");
        }
    }

    /// Puts the rules in force into the data plane (after `from` changed them) and says so.
    fn apply_rules(&self, from: &str) {
        let cut = self.rules.apply(self.control.shared());
        match self.rules.effective() {
            Some(p) => tracing::info!(
                from,
                rules = p.rules.rules.len(),
                version = %format_args!("{:x}", p.rules.version),
                flows_cut = cut,
                "the per-device policy changed: new flows follow it, flows it no longer allows are cut"
            ),
            None => tracing::warn!(
                from,
                "no per-device policy any more: every flow between certified addresses passes"
            ),
        }
    }

    /// Runs `f` on the cloud link (nothing without a cloud) and hands the services the DNS
    /// questions it settled.
    fn settle_from_cloud(&mut self, f: impl FnOnce(&mut CloudLink, &mut Control) -> Vec<Settled>) {
        if let Some(c) = self.cloud.as_mut() {
            for s in f(c, &mut self.control) {
                self.services.settled(s);
            }
        }
    }

    /// Timers, registrations, relay requests, and what the control core reported.
    fn upkeep(&mut self, now: Instant) {
        // A Pi without a real-time clock starts before NTP has set the time: once it is set,
        // certificates and handshake timestamps follow (forward only; session::Clock).
        if let Ok(wall) = SystemTime::now().duration_since(UNIX_EPOCH)
            && let Some(jump) = self.clock.follow(now, wall)
        {
            tracing::warn!(
                forward_secs = jump.as_secs(),
                "the wall clock was set forward (NTP?): certificates are checked against the new time"
            );
        }
        if self.expiry.due(now) {
            let shared = self.control.shared();
            let peers: Vec<_> = shared
                .peers()
                .all()
                .iter()
                .map(|s| (s.name.clone(), s.current_certificate()))
                .collect();
            expiry::log(
                shared.identity().certificate(),
                &peers,
                self.clock.unix_secs(now),
            );
        }
        self.services.tick(now);
        self.control.shared().policy().expire(now);
        if let Some(c) = self.cloud.as_mut() {
            let (version, names) = self.services.hosted();
            c.register(version, names);
        }
        self.control.run_timers(now);
        if let Some(c) = self.cloud.as_mut() {
            c.keep_routes(&mut self.control, now);
            if let Some(in_use) = c.peers_in_use(self.control.shared(), now) {
                self.services.cloud_peers(&in_use);
            }
            c.report_pair(now, || self.services.pair());
            let unix = self.clock.unix_secs(now);
            c.report(now, unix, self.control.shared(), || self.services.devices());
            c.send_flows(now, unix, self.control.shared());
        }
        while let Some(event) = self.control.poll_event() {
            match event {
                ControlEvent::PeerUp(id) => {
                    self.services.peer_up(id);
                    self.settle_from_cloud(|c, _| c.peer_up(id));
                }
                ControlEvent::PeerGaveUp(id) => {
                    self.services.peer_gave_up(id);
                    self.settle_from_cloud(|c, _| c.peer_gave_up(id));
                }
                ControlEvent::PeerRemoved(id) => {
                    self.services.peer_gave_up(id);
                    self.settle_from_cloud(|c, _| c.peer_gave_up(id));
                    let before = self.running.peers.len();
                    self.running.peers.retain(|(p, _)| *p != id);
                    if self.running.peers.len() != before {
                        self.services.set_peers(&self.running.peers);
                    }
                }
                ControlEvent::UnknownPeer {
                    certificate,
                    from,
                    at,
                } => match self.cloud.as_mut() {
                    Some(c) => c.admit(&certificate, from, at),
                    // The refusal was counted and logged (throttled) by the control core.
                    None => {
                        let name = &certificate.body().name;
                        tracing::debug!(%from, %name, "handshake from a valid node that is not one of our peers");
                    }
                },
                ControlEvent::Wanted(certificate) => {
                    if let Some(c) = self.cloud.as_mut() {
                        c.wake(&certificate, now);
                    }
                }
                ControlEvent::NetworkChanged => {
                    if let Some(c) = self.cloud.as_ref() {
                        c.network_changed();
                    }
                }
                ControlEvent::Challenged { from, cookie } => {
                    if let Some(c) = self.cloud.as_ref() {
                        c.challenged(from, cookie);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A floor a little ahead is followed, just above it; one behind changes nothing; one
    /// too far ahead is refused, and the system clock stays.
    #[test]
    fn the_clock_starts_above_a_near_floor_only() {
        let s = Duration::from_secs(1_795_000_000);
        let ms = Duration::from_millis;
        assert_eq!(floored(s, None), (s, Ok(Duration::ZERO)));
        assert_eq!(floored(s, Some(s - ms(5))), (s, Ok(Duration::ZERO)));
        assert_eq!(floored(s, Some(s + ms(40))), (s + ms(41), Ok(ms(41))));
        assert_eq!(
            floored(s, Some(s + CLOCK_FLOOR_AHEAD)),
            (s + CLOCK_FLOOR_AHEAD + ms(1), Ok(CLOCK_FLOOR_AHEAD + ms(1)))
        );
        let far = CLOCK_FLOOR_AHEAD + ms(1);
        assert_eq!(floored(s, Some(s + far)), (s, Err(far)));
    }
}
