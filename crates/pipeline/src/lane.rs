//! A lane of its own: the express lane's work (stamp, process, emit at once) on a thread of
//! its own, reading from a source of its own that carries only sparse traffic (a socket the
//! kernel steers the flagged frames to). Every packet it takes goes out on its thread, one at
//! a time and in the order taken, so a flow whose packets all come this way is never
//! reordered by it; it never waits behind the pipeline's bulk batches, nor for the emitter's
//! lock (it has its own sink).
//!
//! What it keeps from the pipeline beside it: the stage, the counters, and the bound on what
//! an express packet may overtake ([`crate::Config::express_window`]): while more than that
//! is in flight beside it, a packet waits (at most [`crate::Config::in_flight_time`]) for the
//! pipeline to drain, or is refused. (The batch being filled there, at most one batch, is
//! the other thread's and not counted: the window, half a replay window, leaves room for
//! it.) The pace of the lane as a whole is the caller's: it reads at most
//! [`Lane::allowance`] packets at a time, so that a flood on the lane's source costs at most
//! the lane's rate ([`crate::Config::express_rate`]), and the kernel drops the rest at that
//! source.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::counters::Counters;
use crate::emitter::Inline;
use crate::flows::FlowTable;
use crate::{Rejected, Sink, Stage};

/// The express lane on a thread of its own; made by [`crate::Sequencer::lane`].
pub struct Lane<S: Stage> {
    stage: Arc<S>,
    sink: Box<dyn Sink<Item = S::Item>>,
    beside: Arc<dyn Inline<S::Item>>,
    counters: Arc<Counters>,
    batch_size: usize,
    express_window: usize,
    wait_max: Duration,
    /// The flows' paces, for [`Lane::push_flow`] (`None` without an express lane's flows).
    flows: Option<FlowTable>,
    /// Packets [`Lane::push_flow`] took unmarked, and of those how many are out (flushed).
    unmarked: u64,
    /// The lane's pace, shared with its siblings ([`Lane::sibling`]).
    pace: Arc<Mutex<Pace>>,
    rate: f64,
    burst: f64,
}

/// A token bucket: packets the lanes sharing it may take now, and when it last filled.
#[derive(Debug)]
struct Pace {
    tokens: f64,
    filled: Instant,
}

impl<S: Stage> core::fmt::Debug for Lane<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Lane")
            .field("rate", &self.rate)
            .field("pace", &self.pace)
            .finish_non_exhaustive()
    }
}

/// How long the lane sleeps while the pipeline beside it has too much in flight to overtake.
const ROOM_POLL: Duration = Duration::from_micros(50);

impl<S: Stage> Lane<S> {
    #[expect(clippy::too_many_arguments, reason = "wired once, by the sequencer")]
    pub(crate) fn new(
        stage: Arc<S>,
        sink: Box<dyn Sink<Item = S::Item>>,
        beside: Arc<dyn Inline<S::Item>>,
        counters: Arc<Counters>,
        batch_size: usize,
        express_window: usize,
        (wait_max, rate, burst): (Duration, u32, usize),
        flows: Option<FlowTable>,
    ) -> Self {
        #[expect(clippy::cast_precision_loss, reason = "a burst of packets, small")]
        let burst = burst.max(1) as f64;
        Self {
            stage,
            sink,
            beside,
            counters,
            batch_size,
            express_window,
            wait_max,
            flows,
            unmarked: 0,
            pace: Arc::new(Mutex::new(Pace {
                tokens: burst,
                filled: Instant::now(),
            })),
            rate: f64::from(rate.max(1)),
            burst,
        }
    }

    /// A second lane beside this one, into `sink`, for another thread reading another source
    /// of the same traffic (a socket per CPU): the same stage, counters and pipeline beside,
    /// a flow table of its own, and this lane's pace, so that the lanes together take no more
    /// than one lane's rate.
    pub fn sibling(&self, sink: Box<dyn Sink<Item = S::Item>>) -> Self {
        Self {
            stage: self.stage.clone(),
            sink,
            beside: self.beside.clone(),
            counters: self.counters.clone(),
            batch_size: self.batch_size,
            express_window: self.express_window,
            wait_max: self.wait_max,
            flows: self.flows.as_ref().map(FlowTable::sibling),
            unmarked: 0,
            pace: self.pace.clone(),
            rate: self.rate,
            burst: self.burst,
        }
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many packets the lane may take now, at most `want`; when none, waits until `want`
    /// (the lane's pace: [`crate::Config::express_rate`], bursts of the caller's batch).
    /// Read no more than this from the source, and the rest waits there (or is dropped
    /// there, counted by the source, when it is full).
    ///
    /// Out of tokens, the source is sending faster than the pace (a flood): the lane then
    /// waits for a batch's worth rather than for one packet's, so that the flood costs its
    /// thread a wake-up per batch, not per packet (a wake-up costs more than the packet:
    /// 0.01-0.05 ms on the bench's VM, docs/benchmarks.md). Within the pace it never waits.
    pub fn allowance(&mut self, want: usize) -> usize {
        #[expect(clippy::cast_precision_loss, reason = "a batch of packets, small")]
        let batch = (want.max(1) as f64).min(self.burst);
        loop {
            let now = Instant::now();
            let tokens = {
                let mut pace = self.pace();
                let elapsed = now.saturating_duration_since(pace.filled).as_secs_f64();
                pace.tokens = (pace.tokens + elapsed * self.rate).min(self.burst);
                pace.filled = now;
                pace.tokens
            };
            if tokens >= 1.0 {
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "tokens lie in 1..=burst, a small positive count"
                )]
                let whole = tokens as usize;
                return whole.min(want);
            }
            std::thread::sleep(Duration::from_secs_f64((batch - tokens) / self.rate));
        }
    }

    /// Stamps ([`Stage::sequence`]), marks ([`Stage::expressed`]), processes and emits
    /// `item` now, on this thread, once the pipeline beside has no more in flight than an
    /// express packet may overtake. Counts as one of the lane's packets, and spends one of
    /// [`Lane::allowance`]'s.
    ///
    /// # Errors
    /// [`Rejected::Dropped`] when the stage refused it; [`Rejected::Full`] when the pipeline
    /// beside did not drain below the window in time.
    pub fn push(&mut self, item: S::Item) -> Result<(), Rejected<S::Item>> {
        self.take(item, true)
    }

    /// As [`Lane::push`], for a packet of `flow` (as [`crate::Sequencer::push_flow`] names
    /// flows), marked only while its flow is sparse by the express lane's rules (its pace,
    /// and its last unmarked packet out and [`crate::SETTLE`] ago): a receiver that takes
    /// marked packets ahead of its queue then reorders no flow. Every packet goes out now,
    /// marked or not: all of a flow's packets that come this way go out in order.
    ///
    /// # Errors
    /// As [`Lane::push`].
    pub fn push_flow(
        &mut self,
        item: S::Item,
        flow: &impl std::hash::Hash,
    ) -> Result<(), Rejected<S::Item>> {
        let Some(flows) = self.flows.as_mut() else {
            return self.take(item, true);
        };
        let now = Instant::now();
        let bucket = flows.bucket(flow);
        if flows.sparse(bucket, now, true) {
            return self.take(item, true);
        }
        flows.queued(bucket, self.unmarked, now);
        self.unmarked += 1;
        self.take(item, false)
    }

    fn take(&mut self, item: S::Item, mark: bool) -> Result<(), Rejected<S::Item>> {
        {
            let mut pace = self.pace();
            pace.tokens = (pace.tokens - 1.0).max(0.0);
        }
        let arrived = Instant::now();
        while self.beside.in_flight() * self.batch_size > self.express_window {
            if arrived.elapsed() > self.wait_max {
                self.counters.count_full();
                return Err(Rejected::Full(item));
            }
            std::thread::sleep(ROOM_POLL);
        }
        let (item, verdict, times) =
            crate::sequencer::express_work(&*self.stage, &self.counters, item, arrived, mark)?;
        crate::emitter::emit_one(self.sink.as_mut(), &self.counters, item, verdict, times);
        self.counters.count_lane();
        Ok(())
    }

    /// Lets the sink send what it gathered: call after each read's packets.
    pub fn flush(&mut self) {
        self.sink.flush();
        if let (Some(flows), Some(last)) = (&self.flows, self.unmarked.checked_sub(1)) {
            flows.emitted().up_to(last);
        }
    }

    /// The live counters (the pipeline's beside it).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}
