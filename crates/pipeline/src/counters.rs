//! Pipeline counters: lock-free, written by the pipeline's threads, read by anyone.
//!
//! The sequencer and the emitter run on different cores; counters each of them writes live on
//! cache lines of their own and are updated once per batch, not per packet, so that counting
//! does not make the two threads fight over a cache line (false sharing).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::DropReason;

/// Buckets of the hold-time and wait histograms: bucket `i` counts packets that waited less
/// than `2^i` µs (the last bucket takes everything longer).
pub const HOLD_BUCKETS: usize = 24;

/// Where a packet waits on its way through a pipeline: before it (in the kernel, until the
/// edge read it), then from the moment it joins a batch until the sink takes it. Every packet
/// that leaves the pipeline (emitted or dropped by the stage) is counted once in each stage
/// but [`Wait::Socket`], with its batch's times. The wait in the reorder ring is
/// [`Stats::hold_histogram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// In the kernel, before the edge read it: from the kernel's first sight of the packet
    /// (the device's receive path) through the host's backlog and the socket's receive queue.
    /// Counted for every frame or datagram the edge read that carried the kernel's stamp
    /// (also those that never entered the pipeline, such as ARP), when the edge reports it
    /// ([`Counters::record_socket`]).
    Socket,
    /// Of the packets the express lane took ([`crate::Sequencer::push_flow`]), the same wait
    /// in the kernel: what a sparse flow's packet still waits behind bulk flows' packets in
    /// a queue the pipeline does not order (recorded by the sequencer from
    /// [`crate::Stage::waited`]).
    SocketExpress,
    /// Its batch filling: from the batch's first packet until the batch left the sequencer
    /// (full, or flushed at the end of a receive burst).
    Batching,
    /// The batch waiting for a worker thread (0 for a batch processed inline).
    Queued,
    /// The batch being sealed or opened, then handed to the emitter's thread.
    Processing,
    /// The whole way through the pipeline: from its batch's first packet to the sink.
    Total,
}

impl Wait {
    /// Every stage, in [`Wait::index`] order.
    pub const ALL: [Self; 6] = [
        Self::Socket,
        Self::SocketExpress,
        Self::Batching,
        Self::Queued,
        Self::Processing,
        Self::Total,
    ];
    /// How many there are.
    pub const COUNT: usize = Self::ALL.len();
    /// The stages inside the pipeline: every packet that leaves it is counted in each.
    pub const PIPELINE: [Self; 4] = [Self::Batching, Self::Queued, Self::Processing, Self::Total];

    /// Its position in [`Stats::waits`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its name in status and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Socket => "socket",
            Self::SocketExpress => "socket_express",
            Self::Batching => "batching",
            Self::Queued => "queued",
            Self::Processing => "processing",
            Self::Total => "total",
        }
    }
}

/// Packets by how long they waited (bucket `i`: below `2^i` µs) and the sum of their waits:
/// the reorder ring's hold and each [`Wait`] are one of these.
#[derive(Debug, Default)]
struct Log2Histogram {
    buckets: [AtomicU64; HOLD_BUCKETS],
    nanos: AtomicU64,
}

impl Log2Histogram {
    /// Records that `packets` waited `d` each.
    fn record(&self, d: Duration, packets: usize) {
        let packets = packets as u64;
        self.buckets[bucket_of(d)].fetch_add(packets, Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos.saturating_mul(packets), Relaxed);
    }

    fn counts(&self) -> [u64; HOLD_BUCKETS] {
        core::array::from_fn(|i| self.buckets[i].load(Relaxed))
    }

    /// Adds `tally` in, one atomic add per bucket it used.
    fn add(&self, tally: &WaitTally) {
        for (bucket, &n) in self.buckets.iter().zip(&tally.buckets) {
            if n > 0 {
                bucket.fetch_add(n, Relaxed);
            }
        }
        self.nanos.fetch_add(tally.nanos, Relaxed);
    }
}

/// Bucket of a wait in a log2 histogram: below `2^i` µs, the last takes the rest.
fn bucket_of(d: Duration) -> usize {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    ((u64::BITS - micros.leading_zeros()) as usize).min(HOLD_BUCKETS - 1)
}

/// Waits counted on the edge's own thread, packet by packet, without atomics, then added to
/// the shared histogram at once ([`Counters::record_socket`]) once per receive.
#[derive(Debug, Clone, Default)]
pub struct WaitTally {
    buckets: [u64; HOLD_BUCKETS],
    nanos: u64,
    packets: u64,
}

impl WaitTally {
    /// Counts one packet that waited `d`.
    pub fn add(&mut self, d: Duration) {
        self.buckets[bucket_of(d)] += 1;
        self.nanos = self
            .nanos
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.packets += 1;
    }

    /// Packets counted since the last flush.
    pub const fn packets(&self) -> u64 {
        self.packets
    }
}

/// Written by the sequencer thread.
#[derive(Debug, Default)]
struct Head {
    submitted: AtomicU64,
    rejected_full: AtomicU64,
    over_bytes: AtomicU64,
    over_time: AtomicU64,
    batch_buffers: AtomicU64,
    batches: AtomicU64,
    inline_batches: AtomicU64,
    /// [`Wait::Socket`], written by the edge's receiving thread.
    socket: Log2Histogram,
    /// [`Wait::SocketExpress`], written by the sequencer.
    socket_express: Log2Histogram,
}

/// Written by the emitter thread.
#[derive(Debug, Default)]
struct Tail {
    emitted: AtomicU64,
    out_of_order: AtomicU64,
    express: AtomicU64,
    lane: AtomicU64,
    ring_depth: AtomicU64,
    ring_depth_max: AtomicU64,
    hold: Log2Histogram,
    waits: [Log2Histogram; Wait::COUNT],
}

/// Live counters of one pipeline. Read them with [`Counters::snapshot`].
#[derive(Debug, Default)]
pub struct Counters {
    head: CachePadded<Head>,
    tail: CachePadded<Tail>,
    /// Written by both ends, but only when a packet is dropped.
    drops: CachePadded<[AtomicU64; DropReason::COUNT]>,
}

impl Counters {
    pub(crate) fn count_drop(&self, reason: DropReason) {
        self.drops[reason.index()].fetch_add(1, Relaxed);
    }

    pub(crate) fn count_dispatch(&self, packets: usize) {
        self.head.submitted.fetch_add(packets as u64, Relaxed);
        self.head.batches.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_inline(&self) {
        self.head.inline_batches.fetch_add(1, Relaxed);
    }

    /// A sparse flow's packet went by the express lane (`emitted`: 1 if the sink took it).
    pub(crate) fn count_express(&self, emitted: u64) {
        self.head.submitted.fetch_add(1, Relaxed);
        self.tail.express.fetch_add(1, Relaxed);
        self.tail.emitted.fetch_add(emitted, Relaxed);
    }

    /// Of those, one a lane of its own took ([`crate::Lane`]).
    pub(crate) fn count_lane(&self) {
        self.tail.lane.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_full(&self) {
        self.head.rejected_full.fetch_add(1, Relaxed);
    }

    /// A packet refused because the bytes in flight reached the budget.
    pub(crate) fn count_over_bytes(&self) {
        self.head.over_bytes.fetch_add(1, Relaxed);
        self.count_full();
    }

    /// A packet refused because the oldest batch in flight was out too long.
    pub(crate) fn count_over_time(&self) {
        self.head.over_time.fetch_add(1, Relaxed);
        self.count_full();
    }

    /// A batch buffer was made (on first use).
    pub(crate) fn count_batch_buffer(&self) {
        self.head.batch_buffers.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_emitted(&self, emitted: u64, out_of_order: u64) {
        self.tail.emitted.fetch_add(emitted, Relaxed);
        if out_of_order > 0 {
            self.tail.out_of_order.fetch_add(out_of_order, Relaxed);
        }
    }

    /// Records a batch of `packets` that passed `times`, reached the emitter's side at
    /// `arrived` and was emitted at `now`, in every [`Wait`]. Called by whoever holds the
    /// emitter's state (its thread, or the sequencer's emitting inline), once per batch.
    pub(crate) fn record_waits(
        &self,
        times: &crate::Times,
        arrived: Instant,
        now: Instant,
        packets: usize,
    ) {
        let between = |a: Instant, b: Instant| b.saturating_duration_since(a);
        for (stage, d) in [
            (Wait::Batching, between(times.opened, times.dispatched)),
            (Wait::Queued, between(times.dispatched, times.started)),
            (Wait::Processing, between(times.started, arrived)),
            (Wait::Total, between(times.opened, now)),
        ] {
            self.tail.waits[stage.index()].record(d, packets);
        }
    }

    /// Adds the kernel queue waits the edge counted in `tally` ([`Wait::Socket`]) and clears
    /// it. For the thread that reads the pipeline's input.
    pub fn record_socket(&self, tally: &mut WaitTally) {
        if tally.packets > 0 {
            self.head.socket.add(tally);
            *tally = WaitTally::default();
        }
    }

    /// An express packet had waited `d` in the kernel before the edge read it.
    pub(crate) fn record_express_socket(&self, d: Duration) {
        self.head.socket_express.record(d, 1);
    }

    pub(crate) fn record_hold(&self, held: Duration, packets: usize) {
        self.tail.hold.record(held, packets);
    }

    pub(crate) fn record_depth(&self, depth: usize) {
        let depth = depth as u64;
        self.tail.ring_depth.store(depth, Relaxed);
        self.tail.ring_depth_max.fetch_max(depth, Relaxed);
    }

    fn wait_histogram(&self, index: usize) -> &Log2Histogram {
        if index == Wait::Socket.index() {
            &self.head.socket
        } else if index == Wait::SocketExpress.index() {
            &self.head.socket_express
        } else {
            &self.tail.waits[index]
        }
    }

    /// Packets dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()].load(Relaxed)
    }

    /// A copy for reports (each field is read once, atomically). Packets are counted as
    /// submitted when their batch leaves the sequencer.
    pub fn snapshot(&self) -> Stats {
        let hold_histogram = self.tail.hold.counts();
        Stats {
            submitted: self.head.submitted.load(Relaxed),
            emitted: self.tail.emitted.load(Relaxed),
            rejected_full: self.head.rejected_full.load(Relaxed),
            rejected_bytes: self.head.over_bytes.load(Relaxed),
            rejected_late: self.head.over_time.load(Relaxed),
            batch_buffers: self.head.batch_buffers.load(Relaxed),
            batches: self.head.batches.load(Relaxed),
            inline_batches: self.head.inline_batches.load(Relaxed),
            out_of_order: self.tail.out_of_order.load(Relaxed),
            express: self.tail.express.load(Relaxed),
            lane: self.tail.lane.load(Relaxed),
            held_packets: hold_histogram.iter().sum(),
            held_nanos: self.tail.hold.nanos.load(Relaxed),
            ring_depth: self.tail.ring_depth.load(Relaxed),
            ring_depth_max: self.tail.ring_depth_max.load(Relaxed),
            drops: core::array::from_fn(|i| self.drops[i].load(Relaxed)),
            hold_histogram,
            waits: core::array::from_fn(|w| self.wait_histogram(w).counts()),
            wait_nanos: core::array::from_fn(|w| self.wait_histogram(w).nanos.load(Relaxed)),
        }
    }
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Packets that got a slot (counted when their batch left the sequencer).
    pub submitted: u64,
    /// Packets the sink's `emit` accepted.
    pub emitted: u64,
    /// Packets refused at the head because the in-flight budget was spent: the bytes
    /// ([`Stats::rejected_bytes`]), the time ([`Stats::rejected_late`]) or every batch
    /// buffer (the rest).
    pub rejected_full: u64,
    /// Of those, refused because the bytes in flight reached [`crate::Config::in_flight_bytes`].
    pub rejected_bytes: u64,
    /// Of those, refused because the oldest batch in flight was out longer than
    /// [`crate::Config::in_flight_time`].
    pub rejected_late: u64,
    /// Batch buffers made so far (on first use; at most [`crate::Config::batches_in_flight`]):
    /// the most batches a burst has needed in flight at once, give or take one.
    pub batch_buffers: u64,
    /// Batches that left the sequencer (to the workers, or inline).
    pub batches: u64,
    /// Of those, batches processed and emitted on the sequencer's own thread because nothing
    /// was in flight ([`crate::Config::inline_max`]).
    pub inline_batches: u64,
    /// Packets emitted after a packet that arrived later. Stays 0 with ordering on (the
    /// express lane's packets are not among them: they overtake other flows by design).
    pub out_of_order: u64,
    /// Packets of sparse flows that went by the express lane
    /// ([`crate::Sequencer::push_flow`]), emitted at once ahead of other flows' batches.
    pub express: u64,
    /// Of those, packets a lane of its own took ([`crate::Lane`]: read by a thread of its
    /// own, from a source the kernel steered them to).
    pub lane: u64,
    /// Packets that waited in the reorder ring for an earlier batch.
    pub held_packets: u64,
    /// Sum of their waits, in nanoseconds.
    pub held_nanos: u64,
    /// Batches waiting in the reorder ring after the last release.
    pub ring_depth: u64,
    /// Highest ring depth seen.
    pub ring_depth_max: u64,
    /// Drops per [`DropReason::index`] (sequencer, stage and sink drops together).
    pub drops: [u64; DropReason::COUNT],
    /// Held packets per hold-time bucket ([`HOLD_BUCKETS`]).
    pub hold_histogram: [u64; HOLD_BUCKETS],
    /// Packets per wait bucket ([`HOLD_BUCKETS`]), for each [`Wait`] by its index.
    pub waits: [[u64; HOLD_BUCKETS]; Wait::COUNT],
    /// Sum of each [`Wait`]'s waits over its packets, nanoseconds.
    pub wait_nanos: [u64; Wait::COUNT],
}

impl Stats {
    /// Drops for `reason`.
    pub const fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }

    /// All drops and refusals by the stage, the sink and the sequencer.
    pub fn dropped_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Packets counted in `stage` (the same for every stage of [`Wait::PIPELINE`] once the
    /// pipeline is idle).
    pub fn waited(&self, stage: Wait) -> u64 {
        self.waits[stage.index()].iter().sum()
    }

    /// Mean wait of the packets in `stage`.
    pub fn mean_wait(&self, stage: Wait) -> Option<Duration> {
        let n = self.waited(stage);
        (n > 0).then(|| Duration::from_nanos(self.wait_nanos[stage.index()] / n))
    }

    /// Mean wait of held packets.
    pub fn mean_hold(&self) -> Option<Duration> {
        (self.held_packets > 0).then(|| Duration::from_nanos(self.held_nanos / self.held_packets))
    }
}
