//! Sparse flows, in the spirit of fq_codel's new-flow queue: a packet whose flow has nothing
//! in the pipeline and sends slowly (a ping, a DNS question, a keystroke, an ACK now and then)
//! need not wait behind the batches of a bulk flow. The caller names each packet's flow; the
//! flow hashes (keyed, so that nobody can aim at another flow's bucket) into a fixed table of
//! buckets, each with the count of its packets in flight and its pace.
//!
//! The pace is a GCRA (the virtual-scheduling form of a token bucket) per bucket: every packet
//! moves the bucket's theoretical arrival time `tat` one interval (`1 / rate`) on, and a
//! packet is sparse when `tat` lies less than `burst` intervals ahead of now. Every packet
//! counts, sparse or not, so a bulk flow's `tat` runs ahead; it is held at most [`MEMORY`]
//! ahead, so a bulk flow that falls quiet counts as sparse again after about that long, by
//! which time its last packets have long left both ends' pipelines.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Buckets in a flow table: flows hash into these.
pub const FLOW_BUCKETS: usize = 4096;

/// How far a bucket's pace may run ahead of now: a bulk flow counts as sparse again once it
/// has been quiet about this long.
pub const MEMORY: Duration = Duration::from_millis(100);

/// A bucket index, kept with each packet in flight; [`NO_FLOW`] for packets pushed without one.
pub(crate) type Bucket = u16;

/// The bucket of a packet pushed without a flow.
pub(crate) const NO_FLOW: Bucket = Bucket::MAX;

/// Packets in flight per bucket: added by the sequencer, released by whoever emits.
#[derive(Debug)]
pub(crate) struct InFlight(Box<[AtomicU32]>);

impl InFlight {
    fn new() -> Self {
        Self((0..FLOW_BUCKETS).map(|_| AtomicU32::new(0)).collect())
    }

    /// A packet of `bucket` left the pipeline (emitted or dropped).
    pub(crate) fn release(&self, bucket: Bucket) {
        if let Some(n) = self.0.get(usize::from(bucket)) {
            n.fetch_sub(1, Relaxed);
        }
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
        let memory = u64::try_from(MEMORY.as_nanos()).unwrap_or(u64::MAX);
        *tat = ((*tat).max(now) + self.interval).min(now + memory.max(self.tolerance));
        kept
    }
}

/// The sequencer's side: the buckets' paces and the key, and the shared in-flight counts.
#[derive(Debug)]
pub(crate) struct FlowTable {
    in_flight: Arc<InFlight>,
    tat: Box<[u64]>,
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
        (rate > 0).then(|| Self {
            in_flight: Arc::new(InFlight::new()),
            tat: vec![0; FLOW_BUCKETS].into_boxed_slice(),
            lane_tat: 0,
            flow: Pace::new(rate, burst),
            lane: Pace::new(lane_rate.max(rate), burst.saturating_mul(2)),
            base: Instant::now(),
            key: std::collections::hash_map::RandomState::new(),
        })
    }

    /// The counts the emitting side releases.
    pub(crate) fn in_flight(&self) -> Arc<InFlight> {
        self.in_flight.clone()
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
    /// nothing of its bucket in flight, the bucket within its pace and the lane within its.
    pub(crate) fn sparse(&mut self, bucket: Bucket, now: Instant) -> bool {
        let i = usize::from(bucket);
        let ns =
            u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        let paced = self.flow.count(&mut self.tat[i], ns);
        paced && self.in_flight.0[i].load(Relaxed) == 0 && self.lane.count(&mut self.lane_tat, ns)
    }

    /// A packet of `bucket` joined a batch.
    pub(crate) fn add(&self, bucket: Bucket) {
        self.in_flight.0[usize::from(bucket)].fetch_add(1, Relaxed);
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
    fn a_flow_with_packets_in_flight_is_not_sparse_until_they_leave() {
        let mut table = FlowTable::new(1000, 32, 20_000).unwrap();
        let now = Instant::now();
        let b = table.bucket(&("flow", 1));
        assert!(table.sparse(b, now));
        table.add(b);
        assert!(!table.sparse(b, now));
        let in_flight = table.in_flight();
        in_flight.release(b);
        assert!(table.sparse(b, now));
        // Another flow is not held back by this one's packets.
        table.add(b);
        let other = (0..100)
            .map(|i| table.bucket(&("other", i)))
            .find(|o| *o != b)
            .unwrap();
        assert!(table.sparse(other, now));
    }

    #[test]
    fn the_lane_as_a_whole_is_paced() {
        // Flows at 1000/s each with bursts of 4, the lane at 1000/s with bursts of 8: many
        // fresh flows at once get the lane's burst, not more.
        let mut table = FlowTable::new(1000, 4, 1000).unwrap();
        let now = Instant::now();
        let granted = (0..100u32)
            .filter(|i| {
                let b = table.bucket(i);
                table.sparse(b, now)
            })
            .count();
        assert_eq!(granted, 8);
        assert!(FlowTable::new(0, 4, 1000).is_none());
    }
}
