//! Starting and stopping the engine's threads: the crypto workers, the two ordered pipelines
//! and the UDP receive thread. The binary adds its edge (the thread that feeds the
//! [`Submitter`], the sink that delivers [`Incoming`] packets) and the control loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::Sender;
use cyphonic_crypto::{Backend, Certificate, PublicKey};
use cyphonic_netio::{Placement, UdpSocket};
use cyphonic_pipeline::{Counters as PipelineCounters, Emitter, Sink, ThreadStart};
use cyphonic_session::{Clock, Identity, Peer, PeerConfig, Timing};

use crate::egress::{SealStage, Submitter, UdpSink};
use crate::ingress::{Incoming, OpenStage, Receiver};
use crate::peers::{PeerSlot, PeerTable};
use crate::{Shared, ToEgress};

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The crypto worker pool.
    #[error("starting the crypto workers: {0}")]
    Workers(#[from] rayon::ThreadPoolBuildError),
    /// A pipeline (its settings, or its emitter thread).
    #[error("starting a pipeline: {0}")]
    Pipeline(#[from] cyphonic_pipeline::BuildError),
    /// A thread or a socket duplicate.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// More static peers than session indices can tell apart.
    #[error("too many peers")]
    TooManyPeers,
}

/// How the data plane is sized (the `[dataplane]` settings of the binaries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPlane {
    /// Crypto workers; 0 = one per core.
    pub workers: usize,
    /// Packets per batch handed to a worker.
    pub batch_size: usize,
    /// Batches in flight per direction.
    pub batches_in_flight: usize,
    /// Batches this small are processed on the receiving thread when nothing is in flight.
    pub inline_max: usize,
    /// Emit in arrival order (`false` only for experiments).
    pub ordering: bool,
    /// Packets held per peer while its handshake completes.
    pub queue_per_peer: usize,
    /// CPU affinity and priority of the data-plane threads (workers, emitters, receive and
    /// capture threads); the default leaves them to the scheduler.
    pub placement: Placement,
}

/// The placement `[dataplane] cpus` and `realtime_priority` ask for, checked against the CPUs
/// this process may use, and logged when it is not the default.
///
/// # Errors
/// A CPU out of reach, saying which are allowed.
pub fn placement(cpus: &[usize], realtime_priority: u8) -> Result<Placement, String> {
    let p = Placement {
        cpus: cpus.to_vec(),
        realtime_priority,
    };
    p.check().map_err(|e| format!("dataplane.cpus: {e}"))?;
    if !p.is_default() {
        tracing::info!(cpus = ?p.cpus, realtime_priority, "placing the data-plane threads");
    }
    Ok(p)
}

/// The set-up every data-plane thread runs first: `placement`, with a warning the first time
/// the kernel refuses (the data plane runs on, unplaced).
fn thread_start(placement: Placement) -> ThreadStart {
    let warned = std::sync::atomic::AtomicBool::new(false);
    ThreadStart(Arc::new(move || {
        if placement.is_default() {
            return;
        }
        if let Err(e) = placement.apply()
            && !warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                error = %e,
                cpus = ?placement.cpus,
                realtime_priority = placement.realtime_priority,
                "could not place the data-plane threads (a real-time priority needs CAP_SYS_NICE); running unplaced"
            );
        }
    }))
}

/// A peer known from configuration.
#[derive(Debug, Clone)]
pub struct StaticPeer {
    /// Its certificate: name, blocks, key.
    pub certificate: Certificate,
    /// Where to reach it first.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval that holds NAT mappings open.
    pub persistent_keepalive: Option<Duration>,
}

/// The peer table of `peers` (ids 1, 2, ...), as `identity` talks to them.
///
/// # Errors
/// [`StartError::TooManyPeers`].
pub fn static_peers(
    identity: &Arc<Identity>,
    peers: &[StaticPeer],
    timing: Timing,
    clock: Clock,
    aead: Backend,
) -> Result<PeerTable, StartError> {
    let mut slots = Vec::new();
    let mut keys = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let id = u32::try_from(i + 1)
            .ok()
            .filter(|id| *id <= cyphonic_session::MAX_PEER_ID)
            .ok_or(StartError::TooManyPeers)?;
        let mut pc = PeerConfig::from_certificate(&p.certificate, p.endpoint);
        pc.persistent_keepalive = p.persistent_keepalive;
        keys.push(PublicKey(p.certificate.body().public_key));
        slots.push(Arc::new(PeerSlot::new(
            id,
            &p.certificate,
            "static",
            Peer::new(id, identity.clone(), pc, timing, clock, aead),
        )));
    }
    Ok(PeerTable::new(slots, &keys))
}

/// How often the network watch looks at `running`, and how long its news must be quiet before
/// it is passed on: `ip addr add`, `ip addr del`, `ip route replace` in a row (or a DHCP
/// client's equivalent) become one announcement, not three.
const WATCH_POLL: Duration = Duration::from_millis(200);
/// A stream of changes is passed on at least this often.
const WATCH_SETTLE_MAX: Duration = Duration::from_secs(1);

/// Starts the thread that tells the control thread when our addresses or routes changed.
/// Without it (netlink unavailable) the tunnel still works: peers follow us when we next
/// send, only later.
fn watch_network(shared: Arc<Shared>) -> Option<std::thread::JoinHandle<()>> {
    let watch = match cyphonic_netio::AddressWatch::open(WATCH_POLL) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "not watching our addresses: peers learn of a new address only when we next send");
            return None;
        }
    };
    let run = move || {
        let mut since: Option<std::time::Instant> = None;
        while shared.running.load(Ordering::Relaxed) {
            let changed = match watch.wait() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "the address watch failed; no longer watching");
                    return;
                }
            };
            let now = std::time::Instant::now();
            if changed {
                since.get_or_insert(now);
            }
            if let Some(t) = since
                && (!changed || now.saturating_duration_since(t) >= WATCH_SETTLE_MAX)
            {
                since = None;
                let _ = shared.control.try_send(crate::ToControl::NetworkChanged);
            }
        }
    };
    std::thread::Builder::new()
        .name("cy-netwatch".into())
        .spawn(run)
        .inspect_err(|e| tracing::warn!(error = %e, "not watching our addresses"))
        .ok()
}

/// The engine's threads, running.
#[derive(Debug)]
pub struct Engine<K: Sink<Item = Incoming>> {
    /// Crypto workers started.
    pub workers: usize,
    /// The egress pipeline's counters.
    pub egress: Arc<PipelineCounters>,
    /// The ingress pipeline's counters.
    pub ingress: Arc<PipelineCounters>,
    shared: Arc<Shared>,
    submitter: Option<Submitter>,
    to_egress: Sender<ToEgress>,
    receiver: std::thread::JoinHandle<()>,
    watcher: Option<std::thread::JoinHandle<()>>,
    egress_emit: Emitter<UdpSink>,
    ingress_emit: Emitter<K>,
    place: ThreadStart,
}

impl<K: Sink<Item = Incoming>> Engine<K> {
    /// Starts the workers, both pipelines (egress into `udp`, ingress into `sink`) and the
    /// receive thread on `udp`.
    ///
    /// # Errors
    /// [`StartError`]: a thread, the worker pool or a socket duplicate.
    pub fn start(
        dp: &DataPlane,
        shared: &Arc<Shared>,
        udp: &UdpSocket,
        sink: K,
    ) -> Result<Self, StartError> {
        let io = |what| move |source| StartError::Io { what, source };
        let workers = if dp.workers == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        } else {
            dp.workers
        };
        let place = thread_start(dp.placement.clone());
        let rayon = Arc::new({
            let place = place.clone();
            rayon::ThreadPoolBuilder::new()
                .num_threads(workers)
                .thread_name(|i| format!("cy-crypto-{i}"))
                .start_handler(move |_| (place.0)())
                .build()?
        });
        let pconfig = |name: &str| cyphonic_pipeline::Config {
            batch_size: dp.batch_size,
            batches_in_flight: dp.batches_in_flight,
            inline_max: dp.inline_max,
            ordering: dp.ordering,
            name: name.to_owned(),
            on_thread_start: Some(place.clone()),
        };
        let (egress_seq, egress_emit) = cyphonic_pipeline::start(
            &pconfig("cy-egress-emit"),
            rayon.clone(),
            SealStage::new(shared.clone()),
            UdpSink::new(
                shared.clone(),
                udp.try_clone()
                    .map_err(io("duplicating the tunnel socket"))?,
            ),
        )?;
        let (ingress_seq, ingress_emit) =
            cyphonic_pipeline::start(&pconfig("cy-ingress-emit"), rayon, OpenStage, sink)?;
        let (egress, ingress) = (
            egress_seq.counters().clone(),
            ingress_seq.counters().clone(),
        );
        let (to_egress, events) = crossbeam_channel::bounded(1024);
        let submitter = Submitter::new(shared.clone(), egress_seq, events, dp.queue_per_peer);
        let receiver = Receiver::new(
            shared.clone(),
            udp.try_clone()
                .map_err(io("duplicating the tunnel socket"))?,
            ingress_seq,
        );
        let receiver = std::thread::Builder::new()
            .name("cy-udp-rx".into())
            .spawn({
                let place = place.clone();
                move || {
                    (place.0)();
                    receiver.run();
                }
            })
            .map_err(io("starting the receive thread"))?;
        let watcher = watch_network(shared.clone());
        Ok(Self {
            workers,
            egress,
            ingress,
            shared: shared.clone(),
            submitter: Some(submitter),
            to_egress,
            receiver,
            watcher,
            egress_emit,
            ingress_emit,
            place,
        })
    }

    /// Places the calling thread as [`DataPlane::placement`] says: for the edge thread that
    /// feeds the tunnel (capture, TUN reader), first thing.
    pub fn place_thread(&self) -> impl FnOnce() + Send + 'static {
        let place = self.place.clone();
        move || (place.0)()
    }

    /// The submitter, for the edge thread that feeds the tunnel (once).
    ///
    /// # Panics
    /// When taken twice: a wiring bug.
    pub fn take_submitter(&mut self) -> Submitter {
        self.submitter
            .take()
            .expect("the submitter is taken once, by the edge thread")
    }

    /// The engine's metrics collector (for `/metrics`).
    pub fn collector(&self) -> crate::metrics::EngineCollector {
        crate::metrics::EngineCollector::new(
            self.shared.clone(),
            self.egress.clone(),
            self.ingress.clone(),
        )
    }

    /// Where the control thread tells the submitter about peers.
    pub fn to_egress(&self) -> Sender<ToEgress> {
        self.to_egress.clone()
    }

    /// Stops the data threads: the receive thread ends, and each pipeline drains once its
    /// sequencer is gone (the edge thread drops the submitter's when it sees `running` clear).
    ///
    /// # Errors
    /// The receive thread panicked.
    pub fn stop(self) -> Result<(), StartError> {
        self.shared.running.store(false, Ordering::Relaxed);
        drop(self.submitter);
        let joined = self.receiver.join();
        if let Some(w) = self.watcher {
            let _ = w.join();
        }
        let _ = self.egress_emit.join();
        let _ = self.ingress_emit.join();
        joined.map_err(|_| StartError::Io {
            what: "the receive thread",
            source: std::io::Error::other("panicked"),
        })
    }
}
