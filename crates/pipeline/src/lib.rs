//! The ordered parallel packet pipeline of the CYPHONIC adapter paper: packets
//! are stamped in arrival order, processed (sealed or opened) in parallel on a rayon pool, and
//! emitted strictly in arrival order. Reordering inside a gateway collapses TCP (37.3 to
//! 1.68 Mbit/s on a Raspberry Pi 4 in the paper); this crate makes it impossible by design.
//!
//! ```text
//!  caller ──push──▶ Sequencer ──batch──▶ rayon workers ──done──▶ Emitter thread ──▶ Sink
//!         (in order:                 (Stage::process,          (reorder ring,
//!          Stage::sequence)           any order)                in-order release)
//! ```
//!
//! - [`Sequencer`] (the caller's thread): runs [`Stage::sequence`] on each packet in arrival
//!   order (the seal stage assigns nonce counters there), groups packets into batches and hands
//!   each batch to the pool. Batching amortises the hand-off: one rayon job and one channel
//!   message per batch, not per packet.
//! - Workers run [`Stage::process`] on every packet of a batch.
//! - The emitter thread releases batches in sequence order through a reorder ring and calls
//!   [`Sink::emit`] (or [`Sink::dropped`]) for every packet, in order. A packet that failed
//!   still resolves its slot, so nothing ever waits for it.
//! - Under light load the hand-offs are skipped: a batch of at most [`Config::inline_max`]
//!   packets that finds nothing in flight is processed and emitted on the sequencer's thread
//!   (the sink sits behind a lock the emitter thread takes too). Only the sequencer's thread
//!   dispatches, so "nothing in flight" stays true while it works, and order holds.
//!
//! - Sparse flows skip the queue ([`Sequencer::push_flow`], fq_codel's new-flow queue in
//!   spirit): a packet whose flow has nothing in flight and keeps to
//!   [`Config::sparse_rate`] is stamped, processed and emitted on the caller's thread at
//!   once, outside the ring, ahead of other flows' batches; a ping does not wait behind a
//!   download. A flow's own packets never overtake each other: while one is in flight the
//!   next queues behind it (`flows.rs`); the emitter counts a packet as out only once its
//!   sink has flushed it. With a sink of its own ([`start_with_express`]) the lane does not
//!   wait for the emitter's lock either. A [`Lane`] ([`Sequencer::lane`]) does the same
//!   work on a thread of its own, for a source that carries only sparse traffic (a socket
//!   the kernel steers flagged frames to): nothing of the bulk flows is ever read ahead of
//!   it.
//!
//! The in-flight budget is bytes and time, not a count of packets: a new batch is not opened
//! while the packets between the sequencer and the emitter hold [`Config::in_flight_bytes`]
//! (as [`Stage::bytes`] counts them), nor while the oldest batch in flight has been out
//! longer than [`Config::in_flight_time`]; [`Sequencer::push`] then refuses the packet
//! ([`Rejected::Full`]) and the caller drops it at the edge (or waits with
//! [`Sequencer::push_wait`]). A burst of small packets, which arrives as many small batches,
//! is held as long as it is small in bytes and young. [`Config::batches_in_flight`] caps the
//! batch buffers (and sizes the reorder ring): they are made on first use and reused most
//! recent first, so memory grows to the largest burst met, never past the cap.
//!
//! [`Config::ordering`] `= false` exists only to reproduce the papers' problem in experiments.
//!
//! This crate knows nothing of keys, sockets or packets' contents: stages and sinks do.
#![forbid(unsafe_code)]

mod codel;
mod counters;
mod emitter;
mod flows;
mod lane;
mod pulse;
mod sequencer;
mod start;

use std::sync::Arc;
use std::time::Instant;

pub use codel::Aqm;
pub use counters::{Counters, HOLD_BUCKETS, Stats, Wait, WaitTally};
pub use emitter::{Emitter, ReorderRing};
pub use flows::{FLOW_BUCKETS, MEMORY, SETTLE};
pub use lane::Lane;
pub use pulse::{Pulse, Pulses};
pub use sequencer::{Rejected, Sequencer};
pub use start::{start, start_with_express};

/// Why a packet left the pipeline without being emitted. Counted per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// No session with the destination (handshake pending or impossible).
    NoSession,
    /// The session's counter space is used up.
    KeyExhausted,
    /// The frame did not authenticate (forged, corrupted, wrong keys).
    Auth,
    /// Duplicate or too old for the replay window.
    Replay,
    /// Not a well-formed frame or packet.
    Malformed,
    /// Authentic but not allowed: cryptokey routing or anti-spoofing refused it.
    Policy,
    /// Larger than the path allows.
    TooBig,
    /// The destination could not take it (full socket, unknown neighbour).
    Unroutable,
    /// A bulk packet dropped by the queue manager ([`Config::aqm`]) to tell its sender the
    /// queue before the pipeline is standing.
    Congestion,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [Self; 9] = [
        Self::NoSession,
        Self::KeyExhausted,
        Self::Auth,
        Self::Replay,
        Self::Malformed,
        Self::Policy,
        Self::TooBig,
        Self::Unroutable,
        Self::Congestion,
    ];
    /// Number of reasons.
    pub const COUNT: usize = Self::ALL.len();

    /// Position in [`DropReason::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Short name for metrics and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoSession => "no_session",
            Self::KeyExhausted => "key_exhausted",
            Self::Auth => "auth",
            Self::Replay => "replay",
            Self::Malformed => "malformed",
            Self::Policy => "policy",
            Self::TooBig => "too_big",
            Self::Unroutable => "unroutable",
            Self::Congestion => "congestion",
        }
    }
}

/// The work of a pipeline: an in-order step on the sequencer thread and a parallel step on the
/// workers. Shared by all workers through `Arc`, so it holds no per-packet mutable state.
pub trait Stage: Send + Sync + 'static {
    /// What flows through: usually a packet buffer plus what the steps learn about it.
    type Item: Send + 'static;

    /// Runs on the sequencer thread, in arrival order, before the packet gets a slot: the place
    /// to pick the session and assign the nonce counter, so counters follow arrival order.
    /// An error refuses the packet (it is counted and handed back to the caller).
    ///
    /// # Errors
    /// The reason to refuse the packet.
    fn sequence(&self, _item: &mut Self::Item) -> Result<(), DropReason> {
        Ok(())
    }

    /// Runs on the caller's thread, after [`Stage::sequence`], on a packet the express lane
    /// takes ahead of the queue ([`Sequencer::push_flow`]): the place to mark it as such.
    fn expressed(&self, _item: &mut Self::Item) {}

    /// How long the packet waited before the pipeline got it (in the kernel's queues), if
    /// the edge knows: what the queue manager ([`Config::aqm`]) judges.
    fn waited(&self, _item: &Self::Item) -> Option<std::time::Duration> {
        None
    }

    /// What the packet counts for in the in-flight budget ([`Config::in_flight_bytes`]): its
    /// length. A stage that says nothing (0) is bounded by time and batch buffers only.
    fn bytes(&self, _item: &Self::Item) -> usize {
        0
    }

    /// Runs on a worker, in any order relative to other packets: seal or open.
    ///
    /// # Errors
    /// The reason to drop the packet; its slot is still released in order.
    fn process(&self, item: &mut Self::Item) -> Result<(), DropReason>;
}

/// Where packets leave, in order. Lives on the emitter thread.
pub trait Sink: Send + 'static {
    /// The pipeline's item type.
    type Item: Send + 'static;

    /// Takes a processed packet, in arrival order. This is also the place for checks that must
    /// run in order (the replay window update of the receive direction).
    ///
    /// # Errors
    /// A reason to count the packet as dropped instead of emitted (the sink keeps the item).
    fn emit(&mut self, item: Self::Item) -> Result<(), DropReason>;

    /// Takes back a packet that was dropped by the stage, in arrival order (to recycle its
    /// buffer).
    fn dropped(&mut self, item: Self::Item, reason: DropReason) {
        let _ = (item, reason);
    }

    /// Called when no further packet is ready right now: the moment to push out a batch of
    /// emitted packets (sendmmsg).
    fn flush(&mut self) {}
}

/// Pipeline settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest batch handed to a worker. Larger amortises more; smaller keeps latency down
    /// under light load (a partial batch leaves on [`Sequencer::flush`]).
    pub batch_size: usize,
    /// Batches that may be between the sequencer and the emitter at once: the cap on batch
    /// buffers (made on first use) and the reorder ring's size. In-flight packets never
    /// exceed `batch_size * batches_in_flight`. Set it so that the byte and time budgets bind
    /// first: a burst of small packets comes as many batches of a few packets each.
    pub batches_in_flight: usize,
    /// Bytes ([`Stage::bytes`]) that may be in flight: no new batch opens past them (0: no
    /// bound but the batch buffers).
    pub in_flight_bytes: usize,
    /// No new batch opens while the oldest batch in flight was handed to the workers longer
    /// ago than this: the pipeline is behind, and holding more would only add delay (zero:
    /// no bound by time). Measured with [`Config::ordering`] only.
    pub in_flight_time: std::time::Duration,
    /// Batches of at most this many packets are processed and emitted on the sequencer's
    /// thread when nothing is in flight (0: never). Under light load that removes the two
    /// thread hand-offs from a packet's path; under load batches fill up or find others in
    /// flight, and go to the workers.
    pub inline_max: usize,
    /// Packets a second a flow may send and still count as sparse ([`Sequencer::push_flow`]):
    /// a packet of a sparse flow with nothing of its flow in flight is processed and emitted
    /// at once on the caller's thread, ahead of other flows' packets in flight. 0: no
    /// express lane (every packet queues in arrival order).
    pub sparse_rate: u32,
    /// The burst a sparse flow may send at once, packets.
    pub sparse_burst: u32,
    /// Packets a second the express lane takes in all, whatever the number of sparse flows:
    /// the most work it puts on the caller's thread.
    pub express_rate: u32,
    /// An express packet never overtakes more than this many packets in flight: what a
    /// receiver's replay window must hold beside it (a sealed packet's counter is assigned in
    /// arrival order, so an overtaken packet arrives that far behind).
    pub express_window: usize,
    /// Drop bulk packets (never the express lane's) by CoDel's law when the wait before the
    /// pipeline ([`Stage::waited`]) stands above [`Aqm::target`]; `None`: off.
    pub aqm: Option<Aqm>,
    /// Emit in arrival order. `false` only to reproduce the papers' reordering problem.
    pub ordering: bool,
    /// Thread name of the emitter, for `top -H` and debuggers.
    pub name: String,
    /// Run first on the emitter thread (CPU affinity, priority).
    pub on_thread_start: Option<ThreadStart>,
    /// Where the emitter thread beats, when its liveness is judged.
    pub pulses: Option<Pulses>,
}

/// Set-up run at the start of a pipeline thread.
#[derive(Clone)]
pub struct ThreadStart(pub Arc<dyn Fn() + Send + Sync>);

impl core::fmt::Debug for ThreadStart {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ThreadStart")
    }
}

impl PartialEq for ThreadStart {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ThreadStart {}

impl Default for Config {
    fn default() -> Self {
        Self {
            batch_size: 32,
            batches_in_flight: 4096,
            in_flight_bytes: 16 << 20,
            in_flight_time: std::time::Duration::from_millis(100),
            inline_max: 8,
            sparse_rate: 1000,
            sparse_burst: 32,
            express_rate: 20_000,
            express_window: 4096,
            aqm: None,
            ordering: true,
            name: "cyphonic-emit".into(),
            on_thread_start: None,
            pulses: None,
        }
    }
}

/// Errors of building a pipeline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A zero batch size or zero batches in flight.
    #[error("pipeline needs batch_size >= 1 and batches_in_flight >= 1")]
    Config,
    /// The emitter thread could not be spawned.
    #[error("spawning the emitter thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// One packet in a batch: its arrival sequence number and the stage's verdict so far.
#[derive(Debug)]
struct Entry<T> {
    seq: u64,
    item: T,
    verdict: Result<(), DropReason>,
}

/// A batch on its way from the sequencer through a worker to the emitter.
#[derive(Debug)]
struct Batch<T> {
    seq: u64,
    entries: Vec<Entry<T>>,
    /// What its packets count for in the in-flight budget.
    bytes: usize,
    times: Times,
}

/// When a batch passed each point before the emitter: what [`Wait`]s are measured from.
#[derive(Debug, Clone, Copy)]
struct Times {
    /// Its first packet joined it.
    opened: Instant,
    /// It left the sequencer.
    dispatched: Instant,
    /// A worker (or, inline, the sequencer's thread) began on it.
    started: Instant,
}
