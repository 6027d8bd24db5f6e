//! Sparse flows, in the spirit of fq_codel's new-flow queue: a packet whose flow has nothing
//! in the pipeline and sends slowly (a ping, a DNS question, a keystroke, an ACK now and then)
//! need not wait behind the batches of a bulk flow. The caller names each packet's flow; the
//! flow hashes (keyed, so that nobody can aim at another flow's bucket) into a fixed table of
//! buckets, each with the sequence number of its last queued packet, when that was queued,
//! and its pace. All of it lives on the sequencer's thread; the emitter publishes one number
//! each time its sink flushes, how far it has emitted (it emits in sequence order, and a
//! packet counts as out once the sink has sent it), so the bulk path pays no shared write
//! per packet.
//!
//! The pace is a GCRA (the virtual-scheduling form of a token bucket) per bucket: every packet
//! moves the bucket's theoretical arrival time `tat` one interval (`1 / rate`) on, and a
//! packet keeps to the pace when `tat` lies less than `burst` intervals ahead of now. Every
//! packet counts, sparse or not, so a bulk flow's `tat` runs ahead; it is held at most
//! [`MEMORY`] ahead, so a bulk flow that falls quiet counts as sparse again after about that
//! long.
//!
//! A packet is sparse when its bucket keeps to its pace, its last queued packet has been
//! emitted and was queued at least [`SETTLE`] ago: every earlier packet of the flow has left
//! this end, and a receiver that takes the packet ahead of its own queue (docs/protocol.md
//! §1, `FLAG_SPARSE`) reorders the flow only if it held one of them for longer than that
//! (less what it waited here).

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Buckets in a flow table: flows hash into these.
pub const FLOW_BUCKETS: usize = 4096;

/// How far a bucket's pace may run ahead of now: a bulk flow counts as sparse again once it
/// has been quiet about this long.
pub const MEMORY: Duration = Duration::from_millis(100);

/// How long after a flow's last packet was queued its next may take the express lane.
pub const SETTLE: Duration = Duration::from_millis(10);

/// A bucket index.
pub(crate) type Bucket = u16;

/// The bucket of a packet pushed without a flow.
pub(crate) const NO_FLOW: Bucket = Bucket::MAX;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How far the emitter has emitted: one past the highest sequence number out (in order, so
/// every lower one is out too). Written once per flush of the emitter's sink.
#[derive(Debug, Default)]
pub(crate) struct Emitted(AtomicU64);

impl Emitted {
    /// Packets up to `seq` have left.
    pub(crate) fn up_to(&self, seq: u64) {
        self.0.fetch_max(seq + 1, Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A pace: `rate` packets a second with bursts of `burst`.
#[derive(Debug, Clone, Copy)]
struct Pace {
    interval: u64,
    tolerance: u64,
}

impl Pace {
    fn new(rate: u32, burst: u32) -> Self {
        let interval = 1_000_000_000 / u64::from(rate.max(1));
        Self {
            interval,
            tolerance: interval * u64::from(burst.max(1) - 1),
        }
    }

    /// Counts a packet at `now` (ns) against `tat`; whether it kept to the pace.
    fn count(self, tat: &mut u64, now: u64) -> bool {
        let kept = tat.saturating_sub(now) <= self.tolerance;
        *tat = ((*tat).max(now) + self.interval).min(now + nanos(MEMORY).max(self.tolerance));
        kept
    }
}

/// The sequencer's side: per bucket its pace, its last queued packet and when; the key; and
/// the emitter's progress.
#[derive(Debug)]
pub(crate) struct FlowTable {
    emitted: std::sync::Arc<Emitted>,
    tat: Box<[u64]>,
    /// One past the sequence number of the bucket's last queued packet (0: none yet).
    last: Box<[u64]>,
    /// When that was queued, ns since `base` (0: never).
    queued_at: Box<[u64]>,
    /// The express lane as a whole: a bound on the work the caller's thread takes on.
    lane_tat: u64,
    flow: Pace,
    lane: Pace,
    base: Instant,
    key: std::collections::hash_map::RandomState,
}

impl FlowTable {
    /// A table with flows paced at `rate` packets a second (bursts of `burst`) and the lane
    /// at `lane_rate`; `None` when `rate` is 0 (no express lane).
    pub(crate) fn new(rate: u32, burst: u32, lane_rate: u32) -> Option<Self> {
        (rate > 0).then(|| {
            Self::with_paces(
                Pace::new(rate, burst),
                Pace::new(lane_rate.max(rate), burst.saturating_mul(2)),
            )
        })
    }

    /// A table of its own with this one's paces (for another thread: a [`crate::Lane`]),
    /// its own key and its own count of what is out.
    pub(crate) fn sibling(&self) -> Self {
        Self::with_paces(self.flow, self.lane)
    }

    /// An empty table keeping flows to `flow` and the express lane to `lane`.
    fn with_paces(flow: Pace, lane: Pace) -> Self {
        Self {
            emitted: std::sync::Arc::default(),
            tat: vec![0; FLOW_BUCKETS].into_boxed_slice(),
            last: vec![0; FLOW_BUCKETS].into_boxed_slice(),
            queued_at: vec![0; FLOW_BUCKETS].into_boxed_slice(),
            lane_tat: 0,
            flow,
            lane,
            base: Instant::now(),
            key: std::collections::hash_map::RandomState::new(),
        }
    }

    /// What the emitting side moves on.
    pub(crate) fn emitted(&self) -> std::sync::Arc<Emitted> {
        self.emitted.clone()
    }

    fn ns(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.base))
    }

    /// `flow`'s bucket.
    pub(crate) fn bucket(&self, flow: &impl Hash) -> Bucket {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "below FLOW_BUCKETS, which fits"
        )]
        let b = (self.key.hash_one(flow) % FLOW_BUCKETS as u64) as Bucket;
        b
    }

    /// Counts a packet of `bucket` arriving at `now`; whether it may go ahead of the queue:
    /// `room` (the pipeline has room for it to overtake), its bucket within its pace, its last
    /// queued packet out and settled, and the lane within its pace.
    pub(crate) fn sparse(&mut self, bucket: Bucket, now: Instant, room: bool) -> bool {
        let i = usize::from(bucket);
        let ns = self.ns(now);
        let paced = self.flow.count(&mut self.tat[i], ns);
        paced
            && room
            && self.emitted.get() >= self.last[i]
            && (self.queued_at[i] == 0 || ns >= self.queued_at[i].saturating_add(nanos(SETTLE)))
            && self.lane.count(&mut self.lane_tat, ns)
    }

    /// Packet `seq` of `bucket` joined a batch at `now`.
    pub(crate) fn queued(&mut self, bucket: Bucket, seq: u64, now: Instant) {
        let i = usize::from(bucket);
        self.last[i] = seq + 1;
        // 0 stands for "never".
        self.queued_at[i] = self.ns(now).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_pace_lets_a_burst_through_then_one_per_interval() {
        let pace = Pace::new(1000, 4);
        let mut tat = 0;
        // Four at once.
        let kept: Vec<bool> = (0..6).map(|_| pace.count(&mut tat, 10 * MS)).collect();
        assert_eq!(kept, [true, true, true, true, false, false]);
        // One interval per packet after that.
        let mut t = 10 * MS;
        for _ in 0..3 {
            t += 3 * MS;
            assert!(pace.count(&mut tat, t));
        }
    }

    #[test]
    fn a_bulk_flow_counts_as_sparse_again_after_its_memory() {
        let pace = Pace::new(1000, 32);
        let mut tat = 0;
        let mut t = 0;
        // A million packets a second for a second.
        for _ in 0..1_000_000 {
            t += 1_000;
            pace.count(&mut tat, t);
        }
        assert!(!pace.count(&mut tat, t));
        let memory = u64::try_from(MEMORY.as_nanos()).unwrap();
        // Its debt is bounded by MEMORY, not by the million packets.
        assert!(tat <= t + memory, "{tat} {t}");
        assert!(!pace.count(&mut tat, t + memory / 2));
        assert!(pace.count(&mut tat, t + 2 * memory));
    }

    #[test]
    fn a_flow_with_a_packet_in_flight_is_not_sparse_until_it_left_and_settled() {
        let mut table = FlowTable::new(1000, 32, 20_000).unwrap();
        let now = Instant::now() + MEMORY;
        let b = table.bucket(&("flow", 1));
        assert!(table.sparse(b, now, true));
        assert!(!table.sparse(b, now, false), "no room");
        table.queued(b, 7, now);
        assert!(!table.sparse(b, now + SETTLE, true), "in flight");
        table.emitted().up_to(6);
        assert!(!table.sparse(b, now + SETTLE, true), "still in flight");
        table.emitted().up_to(7);
        assert!(!table.sparse(b, now + SETTLE / 2, true), "not settled");
        assert!(table.sparse(b, now + SETTLE, true));
        // Another flow is not held back by this one's packets.
        table.queued(b, 8, now + SETTLE);
        let other = (0..100)
            .map(|i| table.bucket(&("other", i)))
            .find(|o| *o != b)
            .unwrap();
        assert!(table.sparse(other, now + SETTLE, true));
    }

    #[test]
    fn the_lane_as_a_whole_is_paced() {
        // Flows at 1000/s each with bursts of 4, the lane at 1000/s with bursts of 8: many
        // fresh flows at once get the lane's burst, not more.
        let mut table = FlowTable::new(1000, 4, 1000).unwrap();
        let now = Instant::now() + MEMORY;
        let granted = (0..100u32)
            .filter(|i| {
                let b = table.bucket(i);
                table.sparse(b, now, true)
            })
            .count();
        assert_eq!(granted, 8);
        assert!(FlowTable::new(0, 4, 1000).is_none());
    }
}
