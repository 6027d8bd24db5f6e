//! Starting and stopping the engine's threads: the crypto workers, the two ordered pipelines
//! and the tunnel socket's receive thread. The edge adds its own (the thread that feeds the
//! [`Intake`], the sink that delivers [`Accepted`] packets), and the control thread drives
//! [`crate::Control`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cyphonic_crypto::Backend;
use cyphonic_netio::{Placement, UdpOptions};
use cyphonic_pipeline::{Counters as PipelineCounters, Emitter, Sink, ThreadStart};
use cyphonic_session::Timing;

use crate::Shared;
use crate::egress::{Intake, SealStage, SocketSink, SparseSubmitter, Submitter};
use crate::gate::HandshakeGate;
use crate::handshakes::Handshakes;
use crate::ingress::{Accepted, Accepting, OpenStage, Receiver};

use crate::socket::TunnelSocket;

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
}

/// How the data plane is sized and placed: the `[dataplane]` keys every tunnel end shares
/// (the binaries' settings produce this type directly), with their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPlane {
    /// Crypto workers; 0 = one per core.
    pub workers: usize,
    /// Packets per batch handed to a worker.
    pub batch_size: usize,
    /// Batch buffers per direction at most (made on first use): the reorder ring's size,
    /// set so that the byte and time budgets bind first.
    pub batches_in_flight: usize,
    /// Bytes of packets in flight per direction (between the receiving thread and the
    /// emitter) before new packets are refused (`drop_pipeline_full`); 0: no bound but the
    /// batch buffers.
    pub in_flight_bytes: usize,
    /// New packets are refused while the oldest batch in flight was handed to the workers
    /// longer ago than this (zero: no bound by time).
    pub in_flight_time: Duration,
    /// Batches of at most this many packets are sealed or opened on the receiving thread
    /// when nothing is in flight (0: never).
    pub inline_max: usize,
    /// Packets a second a flow may send out and still take the express lane past bulk
    /// flows' batches, when nothing of its own is in flight, flagged so that the receiver
    /// may open it ahead of its queue too ([`cyphonic_pipeline::Config::sparse_rate`]). 0: no
    /// express lane, either way (flagged frames from peers then queue like the rest).
    pub sparse_rate: u32,
    /// CoDel on the way out: bulk packets are dropped by its law when the wait in the
    /// kernel before the edge read them stands above the target (the express lane's never);
    /// `None`: off, the edge's socket drops at its tail when full.
    pub aqm: Option<cyphonic_pipeline::Aqm>,
    /// Have the kernel stamp what the sockets receive, so the pipelines' `socket` waits say
    /// how long packets waited in the kernel (the capture socket's are stamped whenever `aqm`
    /// is on). Off by default: it may cost a few percent of throughput (docs/benchmarks.md).
    pub socket_timestamps: bool,
    /// Emit in arrival order (`false` only for experiments).
    pub ordering: bool,
    /// The AEAD implementation of every session.
    pub aead: Backend,
    /// The tunnel socket's kernel buffers, bytes (each direction).
    pub udp_buffer: usize,
    /// Send runs of equal-size datagrams as one segmented (GSO) message.
    pub udp_gso: bool,
    /// Receive runs of datagrams coalesced by the kernel (GRO), split here.
    pub udp_gro: bool,
    /// CPU affinity and priority of the data-plane threads (workers, emitters, receive and
    /// edge threads); the default leaves them to the scheduler.
    pub placement: Placement,
    /// How long the receiving threads keep polling their socket after a packet instead of
    /// sleeping (zero: off).
    pub busy_poll: Duration,
    /// Have the kernel steer the data frames peers flagged sparse to a second socket on the
    /// tunnel's port, read by a thread of its own that opens and delivers them at once
    /// (with the express lane on, `sparse_rate` > 0): a ping from a peer never waits behind
    /// the bulk frames in the tunnel socket's queue, nor behind the receive thread's work.
    pub sparse_socket: bool,
    /// With `sparse_socket`: one sparse socket and thread of each kind per CPU (of
    /// `placement.cpus`, or of those the process may use, at most [`MAX_SPARSE_THREADS`]),
    /// each thread on its CPU, the kernel putting a sparse packet in the socket of the CPU
    /// that received it: waking its reader is then a switch on that core, not a message to
    /// another one (which wakes an idle core: 0.03-0.05 ms on the bench's VM,
    /// docs/benchmarks.md). Off: one socket and thread, placed as the data plane.
    pub sparse_per_cpu: bool,
    /// `SCHED_FIFO` priority of the threads that read only sparse traffic (the sparse
    /// sockets' lanes; 0: the normal scheduler). They carry at most the express lane's rate
    /// ([`cyphonic_pipeline::Config::express_rate`]), so they run the moment a packet
    /// comes without taking the bulk flows' cores. Needs `CAP_SYS_NICE` or an
    /// `RLIMIT_RTPRIO` at least this high; refused, they run at normal priority (warned).
    pub sparse_priority: u8,
    /// Packets held per peer while its handshake completes (and a quarter of `buffers` for
    /// all peers together).
    pub queue_per_peer: usize,
    /// Packet buffers in all ([`crate::BUF_LEN`] bytes each): the data plane's memory ceiling.
    pub buffers: usize,
    /// Keys are rotated when this old (`danger_rekey_after_secs`: only ever shorter than the
    /// default, for tests that must see many rekeys).
    pub rekey_after: Duration,
    /// Keys are rotated after this many messages (`danger_rekey_after_messages`: likewise).
    pub rekey_after_messages: u64,
}

impl Default for DataPlane {
    fn default() -> Self {
        // The pipeline's keys take the pipeline's own defaults: each is written once, there.
        let pipeline = cyphonic_pipeline::Config::default();
        Self {
            workers: 0,
            batch_size: pipeline.batch_size,
            // Bursts arrive as many small batches: with 128, a line-rate UDP flow ran out of
            // batch buffers and lost 5%; with 1024, trains of small datagrams did
            // (docs/benchmarks.md). The budget is the bytes and the time below.
            batches_in_flight: pipeline.batches_in_flight,
            in_flight_bytes: pipeline.in_flight_bytes,
            in_flight_time: pipeline.in_flight_time,
            inline_max: pipeline.inline_max,
            sparse_rate: pipeline.sparse_rate,
            aqm: pipeline.aqm,
            socket_timestamps: false,
            ordering: pipeline.ordering,
            aead: Backend::default(),
            udp_buffer: 4 << 20,
            udp_gso: true,
            udp_gro: true,
            placement: Placement::default(),
            busy_poll: Duration::ZERO,
            sparse_socket: true,
            sparse_per_cpu: true,
            sparse_priority: 20,
            queue_per_peer: 64,
            buffers: 8192,
            rekey_after: Timing::default().rekey_after_time,
            rekey_after_messages: Timing::default().rekey_after_messages,
        }
    }
}

impl DataPlane {
    /// The session timers: the defaults, with the rekey thresholds set here.
    pub fn timing(&self) -> Timing {
        Timing {
            rekey_after_time: self.rekey_after,
            rekey_after_messages: self.rekey_after_messages,
            ..Timing::default()
        }
    }

    /// Whether a `danger_` key shortened the rekey thresholds (logged at start).
    pub fn rekeys_shortened(&self) -> bool {
        let d = Timing::default();
        self.rekey_after != d.rekey_after_time
            || self.rekey_after_messages != d.rekey_after_messages
    }

    /// How the tunnel socket is opened.
    pub fn udp_options(&self) -> UdpOptions {
        UdpOptions {
            recv_buffer: self.udp_buffer,
            send_buffer: self.udp_buffer,
            segmentation: self.udp_gso,
            coalescing: self.udp_gro,
            busy_poll: self.busy_poll,
            timestamps: self.socket_timestamps,
            steering: self.steers_sparse(),
            ..UdpOptions::default()
        }
    }

    /// Whether the tunnel socket gets a sparse companion ([`DataPlane::sparse_socket`]).
    pub const fn steers_sparse(&self) -> bool {
        self.sparse_socket && self.sparse_rate > 0
    }

    /// The threads that read only sparse traffic, one per entry, by the CPU each runs on
    /// ([`DataPlane::sparse_per_cpu`]; `None`: placed as the data plane); none without
    /// [`DataPlane::steers_sparse`]. The same on every call: the edge opens its sparse
    /// sockets by it, and the engine its lanes.
    pub fn sparse_threads(&self) -> Vec<Option<usize>> {
        if !self.steers_sparse() {
            return Vec::new();
        }
        let cpus = if self.placement.cpus.is_empty() {
            cyphonic_netio::allowed_cpus().unwrap_or_default()
        } else {
            self.placement.cpus.clone()
        };
        if !self.sparse_per_cpu || cpus.len() < 2 {
            return vec![None];
        }
        by_remainder(&cpus[..cpus.len().min(MAX_SPARSE_THREADS)])
            .into_iter()
            .map(Some)
            .collect()
    }

    /// How the sparse companion is opened: a queue of its own for a paced lane (1 MiB holds
    /// its burst many times over), stamps as the tunnel socket's, nothing to coalesce or
    /// segment, no busy polling.
    fn sparse_options(&self) -> UdpOptions {
        UdpOptions {
            recv_buffer: SPARSE_BUFFER,
            send_buffer: SPARSE_BUFFER,
            segmentation: false,
            coalescing: false,
            timestamps: self.socket_timestamps,
            steering: true,
            ..UdpOptions::default()
        }
    }

    /// Checks the placement against the CPUs this process may use, and logs it when it is not
    /// the default.
    ///
    /// # Errors
    /// A CPU out of reach, saying which are allowed.
    pub fn check_placement(&self) -> Result<(), String> {
        let p = &self.placement;
        p.check().map_err(|e| format!("dataplane.cpus: {e}"))?;
        if !p.is_default() {
            tracing::info!(cpus = ?p.cpus, realtime_priority = p.realtime_priority, "placing the data-plane threads");
        }
        Ok(())
    }
}

/// `cpus` reordered so that entry `i` is, where one is, a CPU whose number is `i` modulo
/// their count: the sparse capture sockets share frames by that remainder
/// (`PACKET_FANOUT_CPU`), so thread `i` then runs where its socket's frames are received.
/// The CPUs no remainder claims fill the remaining entries in order.
fn by_remainder(cpus: &[usize]) -> Vec<usize> {
    let n = cpus.len();
    let mut slots: Vec<Option<usize>> = vec![None; n];
    let mut rest = Vec::new();
    for &cpu in cpus {
        match &mut slots[cpu % n] {
            slot @ None => *slot = Some(cpu),
            Some(_) => rest.push(cpu),
        }
    }
    let mut rest = rest.into_iter();
    slots
        .into_iter()
        .map(|slot| slot.or_else(|| rest.next()).unwrap_or_default())
        .collect()
}

/// At most this many sparse threads of each kind ([`DataPlane::sparse_per_cpu`]): packets
/// received on the CPUs past them go to the first one's socket.
pub const MAX_SPARSE_THREADS: usize = 16;

/// The sparse companion's kernel buffers, bytes.
const SPARSE_BUFFER: usize = 1 << 20;

/// The set-up of the threads that read only sparse traffic, one per entry of `threads`
/// ([`DataPlane::sparse_threads`]): each on its CPU (or placed as the data plane), then at the
/// real-time `dp.sparse_priority` (if any); a refusal is warned once for all of them (the
/// threads run on, at normal priority).
fn sparse_thread_starts(dp: &DataPlane, threads: &[Option<usize>]) -> Vec<ThreadStart> {
    let warned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    threads
        .iter()
        .map(|&cpu| {
            let placement = match cpu {
                Some(cpu) => Placement {
                    cpus: vec![cpu],
                    realtime_priority: dp.placement.realtime_priority,
                },
                None => dp.placement.clone(),
            };
            sparse_thread_start(&placement, dp.sparse_priority, warned.clone())
        })
        .collect()
}

/// The set-up of one thread that reads only sparse traffic: `placement`, then the real-time
/// `priority` (if any), a refusal warned once (by `warned`).
fn sparse_thread_start(
    placement: &Placement,
    priority: u8,
    warned: Arc<std::sync::atomic::AtomicBool>,
) -> ThreadStart {
    let (place, floor) = (thread_start(placement.clone()), placement.realtime_priority);
    ThreadStart(Arc::new(move || {
        (place.0)();
        // Never below the data plane's own (`realtime_priority`), which the placement set.
        if priority <= floor {
            return;
        }
        let raised = Placement {
            cpus: Vec::new(),
            realtime_priority: priority,
        };
        if let Err(e) = raised.apply()
            && !warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                error = %e,
                sparse_priority = priority,
                "could not give the sparse lanes' threads a real-time priority (it needs CAP_SYS_NICE or LimitRTPRIO, and RestrictRealtime=no); they run at normal priority, sparse flows then wait longer under load"
            );
        }
    }))
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
        let mut since: Option<Instant> = None;
        while shared.running.load(Ordering::Relaxed) {
            let changed = match watch.wait() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "the address watch failed; no longer watching");
                    return;
                }
            };
            let now = Instant::now();
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

/// Opens the tunnel socket's sparse companions and starts their receive threads, one per
/// `lanes` entry (its lane, and what its thread runs first) for the same entry of `threads`
/// ([`DataPlane::sparse_threads`]); none (warned) where the socket has none or the kernel
/// refuses: the flagged frames then take the tunnel socket's express lane, as without.
fn start_sparse(
    dp: &DataPlane,
    shared: &Arc<Shared>,
    socket: &dyn TunnelSocket,
    lanes: Vec<(cyphonic_pipeline::Lane<OpenStage>, ThreadStart)>,
    threads: &[Option<usize>],
) -> Result<Vec<std::thread::JoinHandle<()>>, StartError> {
    let threads = &threads[..lanes.len().min(threads.len())];
    let companions = match socket.sparse_companions(&dp.sparse_options(), threads) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no socket of its own for the peers' sparse frames (dataplane.sparse_socket): they queue in the tunnel socket's");
            return Ok(Vec::new());
        }
    };
    companions
        .into_iter()
        .zip(lanes)
        .zip(threads)
        .map(|((companion, (lane, place)), &cpu)| {
            let receiver = Receiver::sparse(shared.clone(), companion, lane);
            std::thread::Builder::new()
                .name(sparse_thread_name("cy-sparse-rx", cpu))
                .spawn(move || {
                    (place.0)();
                    receiver.run();
                })
                .map_err(|source| StartError::Io {
                    what: "starting a sparse receive thread",
                    source,
                })
        })
        .collect()
}

/// The name of a thread that reads only sparse traffic: `base`, and the CPU it sits on if
/// one ([`DataPlane::sparse_per_cpu`]): `cy-sparse-rx1`.
pub fn sparse_thread_name(base: &str, cpu: Option<usize>) -> String {
    cpu.map_or_else(|| base.to_owned(), |c| format!("{base}{c}"))
}

/// One of the edge's sparse lanes into the tunnel, for the thread that reads its source.
#[derive(Debug)]
pub struct SparseWay {
    /// The lane's way into the tunnel.
    pub submitter: SparseSubmitter,
    /// What the thread runs first: its CPU, then `dataplane.sparse_priority`.
    pub start: ThreadStart,
    /// The CPU it sits on ([`DataPlane::sparse_threads`]), if one.
    pub cpu: Option<usize>,
}

/// Holds the [`SparseWay`]s until the edge's sparse threads take them, one per
/// [`DataPlane::sparse_threads`] entry.
#[derive(Debug, Clone)]
pub struct SparseIntake(Arc<std::sync::Mutex<Vec<SparseWay>>>);

impl SparseIntake {
    /// The sparse lanes' ways into the tunnel, in [`DataPlane::sparse_threads`]'s order;
    /// none when they were taken, or there are none (`dataplane.sparse_socket` off, no
    /// express lane).
    pub fn take(&self) -> Vec<SparseWay> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// The engine's threads, running.
#[derive(Debug)]
pub struct Engine<K: Sink<Item = Accepted>> {
    /// Crypto workers started.
    pub workers: usize,
    /// The egress pipeline's counters.
    pub egress_counters: Arc<PipelineCounters>,
    /// The ingress pipeline's counters.
    pub ingress_counters: Arc<PipelineCounters>,
    shared: Arc<Shared>,
    intake: Intake,
    sparse_intake: SparseIntake,
    receiver: std::thread::JoinHandle<()>,
    /// The sparse companions' receive threads, if it has them.
    sparse: Vec<std::thread::JoinHandle<()>>,
    handshaker: std::thread::JoinHandle<()>,
    watcher: Option<std::thread::JoinHandle<()>>,
    egress_emit: Emitter<SocketSink>,
    ingress_emit: Emitter<Accepting<K>>,
    place: ThreadStart,
}

impl<K: Sink<Item = Accepted>> Engine<K> {
    /// Starts the workers, both pipelines (egress into `socket`, ingress into `sink`; the
    /// ingress express lane into `express`, a second sink to the same place, if given), the
    /// receive thread on `socket` and the handshake thread, which answers as the shared
    /// state's identity; with [`DataPlane::sparse_socket`] and sinks `lanes` (one per
    /// [`DataPlane::sparse_threads`] entry), the receive threads of the socket's sparse
    /// companions, delivering into them (where the socket has none, or the kernel refuses,
    /// the tunnel runs without, warned);
    /// with `watch`, also the thread that tells the control thread when this host's
    /// addresses change.
    ///
    /// # Errors
    /// [`StartError`]: a thread, the worker pool or a socket duplicate.
    pub fn start(
        dp: &DataPlane,
        shared: &Arc<Shared>,
        socket: &dyn TunnelSocket,
        sink: K,
        express: Option<K>,
        lanes: Vec<K>,
        watch: bool,
    ) -> Result<Self, StartError> {
        let io = |what| move |source| StartError::Io { what, source };
        let workers = if dp.workers == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        } else {
            dp.workers
        };
        if !dp.ordering {
            tracing::warn!(
                "dataplane.ordering = false: packets leave in completion order; for experiments only"
            );
        }
        let place = thread_start(dp.placement.clone());
        let threads = dp.sparse_threads();
        let place_sparse = sparse_thread_starts(dp, &threads);
        let rayon = Arc::new({
            let place = place.clone();
            rayon::ThreadPoolBuilder::new()
                .num_threads(workers)
                .thread_name(|i| format!("cy-crypto-{i}"))
                .start_handler(move |_| (place.0)())
                .build()?
        });
        // Only the way out knows flows (the edge's packets, before sealing). The way in takes
        // ahead the frames the sender flagged as sparse, each peer's in order, paced only by
        // the lane as a whole.
        let pconfig = |name: &str, sparse_rate: u32| cyphonic_pipeline::Config {
            batch_size: dp.batch_size,
            batches_in_flight: dp.batches_in_flight,
            in_flight_bytes: dp.in_flight_bytes,
            in_flight_time: dp.in_flight_time,
            inline_max: dp.inline_max,
            sparse_rate,
            aqm: None,
            ordering: dp.ordering,
            name: name.to_owned(),
            on_thread_start: Some(place.clone()),
            pulses: Some(shared.pulses().clone()),
            ..cyphonic_pipeline::Config::default()
        };
        // Each pipeline's express lane sends through a sink of its own, on the thread that
        // reads (the edge's or the receiver): it never waits for the emitter's lock.
        let socket_sink = || -> Result<SocketSink, StartError> {
            Ok(SocketSink::new(
                shared.clone(),
                socket
                    .try_clone_box()
                    .map_err(io("duplicating the tunnel socket"))?,
            ))
        };
        // The queue manager judges the way out only: there it tells the devices' TCP senders
        // of a standing queue at the edge's socket. On the way in the frames are a peer's
        // (already judged at its edge); the flagged ones the lane does not take queue as
        // they came.
        let (egress_seq, egress_emit) = cyphonic_pipeline::start_with_express(
            &cyphonic_pipeline::Config {
                aqm: dp.aqm,
                ..pconfig("cy-egress-emit", dp.sparse_rate)
            },
            rayon.clone(),
            SealStage::new(shared.clone()),
            socket_sink()?,
            Some(socket_sink()?),
        )?;
        let (ingress_seq, ingress_emit) = cyphonic_pipeline::start_with_express(
            &pconfig(
                "cy-ingress-emit",
                if dp.sparse_rate == 0 {
                    0
                } else {
                    cyphonic_pipeline::Config::default().express_rate
                },
            ),
            rayon,
            OpenStage,
            Accepting::new(sink, shared.clone()),
            express.map(|e| Accepting::new(e, shared.clone())),
        )?;
        let (egress_counters, ingress_counters) = (
            egress_seq.counters().clone(),
            ingress_seq.counters().clone(),
        );
        // One lane of each kind per sparse thread, each kind at one pace. The edge's
        // (the adapter's sparse capture sockets) send through socket handles of their own,
        // beside the pipeline.
        let lanes = ingress_seq.lanes(
            lanes
                .into_iter()
                .take(threads.len())
                .map(|l| Accepting::new(l, shared.clone())),
        );
        let lanes = lanes
            .into_iter()
            .zip(place_sparse.iter().cloned())
            .collect();
        let sparse = start_sparse(dp, shared, socket, lanes, &threads)?;
        let egress_lanes = egress_seq.lanes(
            threads
                .iter()
                .map(|_| socket_sink())
                .collect::<Result<Vec<_>, _>>()?,
        );
        let intake = Intake::new(Submitter::new(
            shared.clone(),
            egress_seq,
            dp.queue_per_peer,
            dp.buffers / crate::egress::QUEUED_SHARE_OF_BUFFERS,
        ));
        let sparse_intake = SparseIntake(Arc::new(std::sync::Mutex::new(
            egress_lanes
                .into_iter()
                .zip(place_sparse)
                .zip(threads)
                .map(|((lane, start), cpu)| SparseWay {
                    submitter: SparseSubmitter::new(shared.clone(), lane, intake.clone()),
                    start,
                    cpu,
                })
                .collect(),
        )));
        // Our static key stays for the life of the engine (only certificates and trust are
        // replaced while running), so the gate's mac1 key does too.
        let identity_key = shared.identity().public_key();
        let (handshakes, queue) = Handshakes::new(
            shared.clone(),
            socket
                .try_clone_box()
                .map_err(io("duplicating the tunnel socket"))?,
        );
        // Not placed: handshake work must not take the data plane's reserved CPUs.
        let handshaker = std::thread::Builder::new()
            .name("cy-handshake".into())
            .spawn(move || handshakes.run())
            .map_err(io("starting the handshake thread"))?;
        let gate = HandshakeGate::new((&identity_key, shared.versions), Instant::now())
            .map_err(io("seeding the handshake cookie secret"))?;
        let receiver = Receiver::new(
            shared.clone(),
            socket
                .try_clone_box()
                .map_err(io("duplicating the tunnel socket"))?,
            ingress_seq,
            queue,
            gate,
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
        let watcher = watch.then(|| watch_network(shared.clone())).flatten();
        Ok(Self {
            workers,
            egress_counters,
            ingress_counters,
            shared: shared.clone(),
            intake,
            sparse_intake,
            receiver,
            sparse,
            handshaker,
            watcher,
            egress_emit,
            ingress_emit,
            place,
        })
    }

    /// What every data-plane thread runs first ([`DataPlane::placement`]): for the edge
    /// threads that feed the tunnel (capture, TUN reader), to run first thing.
    pub fn thread_start(&self) -> ThreadStart {
        self.place.clone()
    }

    /// The ways into the tunnel for the edge's threads that read only sparse traffic, once
    /// ([`SparseIntake::take`]); with [`DataPlane::sparse_socket`].
    pub fn sparse_intake(&self) -> SparseIntake {
        self.sparse_intake.clone()
    }

    /// A handle on the way into the tunnel, for the edge thread and the control thread.
    pub fn intake(&self) -> Intake {
        self.intake.clone()
    }

    /// The state the engine's threads share.
    pub const fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops the data threads: the receive thread ends, the submitter goes (its pipeline
    /// drains, whatever [`Intake`] handles remain), and the ingress pipeline drains once the
    /// receive thread's sequencer is gone. Edge threads end when they see `running` clear.
    /// Returns the ingress sink.
    ///
    /// # Errors
    /// The receive thread panicked.
    pub fn stop(self) -> Result<K, StartError> {
        self.shared.running.store(false, Ordering::Relaxed);
        self.intake.close();
        let joined = self.receiver.join();
        let sparse_panicked = self
            .sparse
            .into_iter()
            .map(std::thread::JoinHandle::join)
            .any(|j| j.is_err());
        let _ = self.handshaker.join();
        if let Some(w) = self.watcher {
            let _ = w.join();
        }
        let _ = self.egress_emit.join();
        let sink = self.ingress_emit.join();
        if sparse_panicked {
            return Err(StartError::Io {
                what: "the sparse receive thread",
                source: std::io::Error::other("panicked"),
            });
        }
        joined.map_err(|_| StartError::Io {
            what: "the receive thread",
            source: std::io::Error::other("panicked"),
        })?;
        Ok(sink.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sparse_thread_sits_where_its_socket_s_frames_are_received() {
        // Entry i: a CPU whose number is i modulo their count, where there is one.
        assert_eq!(by_remainder(&[0, 1, 2, 3]), [0, 1, 2, 3]);
        assert_eq!(by_remainder(&[2, 3]), [2, 3]);
        assert_eq!(by_remainder(&[1, 2]), [2, 1]);
        assert_eq!(
            by_remainder(&[0, 2]),
            [0, 2],
            "no odd CPU: the rest in order"
        );
        assert_eq!(by_remainder(&[5, 1, 3]), [3, 1, 5]);
        let on = |cpus: Vec<usize>| DataPlane {
            placement: Placement {
                cpus,
                realtime_priority: 0,
            },
            ..DataPlane::default()
        };
        assert_eq!(on(vec![1, 2]).sparse_threads(), [Some(2), Some(1)]);
        assert_eq!(on(vec![3]).sparse_threads(), [None], "one CPU: one thread");
        let one = DataPlane {
            sparse_per_cpu: false,
            ..on(vec![1, 2])
        };
        assert_eq!(one.sparse_threads(), [None]);
        let none = DataPlane {
            sparse_socket: false,
            ..on(vec![1, 2])
        };
        assert!(none.sparse_threads().is_empty());
        let many = on((0..40).collect()).sparse_threads();
        assert_eq!(many.len(), MAX_SPARSE_THREADS);
        assert_eq!(many[..2], [Some(0), Some(1)]);
    }
}
