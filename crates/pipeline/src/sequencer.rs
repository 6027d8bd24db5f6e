//! The sequencer: stamps arrival order, batches, hands batches to the pool.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::codel::Codel;
use crate::counters::Counters;
use crate::emitter::Inline;
use crate::flows::{Bucket, FlowTable, NO_FLOW};
use crate::{Batch, Config, DropReason, Entry, Stage, Stats, Times};

/// A packet the sequencer did not take, handed back to the caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Rejected<T> {
    /// The in-flight budget is spent (bytes, time or batch buffers): drop at the edge
    /// (counted as `rejected_full`), or wait.
    Full(T),
    /// [`Stage::sequence`] refused it (counted under its reason).
    Dropped(T, DropReason),
}

impl<T> Rejected<T> {
    /// The packet, to recycle its buffer.
    pub fn into_item(self) -> T {
        match self {
            Self::Full(t) | Self::Dropped(t, _) => t,
        }
    }
}

/// The head of the pipeline. Owned by one thread (the capture or receive thread): packets
/// pushed here leave the emitter in exactly this order.
pub struct Sequencer<S: Stage> {
    batch_size: usize,
    inline_max: usize,
    express_window: usize,
    /// A [`crate::Lane`]'s pace and burst, and how long it waits for room.
    lane_pace: (u32, usize, Duration),
    stage: Arc<S>,
    pool: Arc<rayon::ThreadPool>,
    // Before `done_tx`: dropped first, so that once the emitter sees the channel close it
    // holds the only reference to the shared state.
    inline: Arc<dyn Inline<S::Item>>,
    done_tx: Sender<Batch<S::Item>>,
    free_rx: Receiver<Vec<Entry<S::Item>>>,
    /// Batch buffers back from the emitter, the most recently used last (taken first: the
    /// others stay cold).
    free: Vec<Vec<Entry<S::Item>>>,
    /// Batch buffers made so far, at most `max_batches`.
    made: usize,
    max_batches: usize,
    max_bytes: usize,
    /// Zero: no bound by time.
    max_time: Duration,
    /// When each batch still in flight was dispatched, oldest first (with ordering, batches
    /// leave the emitter in this order).
    out: VecDeque<Instant>,
    /// Batches dispatched to the workers so far, and of those forgotten from `out`.
    sent: u64,
    forgotten: u64,
    filling: Option<Vec<Entry<S::Item>>>,
    /// What the filling batch's packets count for in the budget.
    filling_bytes: usize,
    /// When the filling batch got its first packet.
    opened: Instant,
    next_seq: u64,
    next_batch: u64,
    counters: Arc<Counters>,
    /// The sparse flows' table; `None` without an express lane.
    flows: Option<FlowTable>,
    /// The bulk packets' queue manager ([`Config::aqm`]).
    codel: Option<Codel>,
    /// Where the express lane's packets go: a sink of its own, or `None`: the emitter's,
    /// under its lock ([`crate::start_with_express`]).
    express_sink: Option<Box<dyn crate::Sink<Item = S::Item>>>,
}

impl<S: Stage> core::fmt::Debug for Sequencer<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sequencer")
            .field("next_seq", &self.next_seq)
            .field("next_batch", &self.next_batch)
            .field("filling", &self.filling.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

impl<S: Stage> Sequencer<S> {
    #[expect(clippy::too_many_arguments, reason = "wired once, by `crate::start`")]
    pub(crate) fn new(
        config: &Config,
        stage: Arc<S>,
        pool: Arc<rayon::ThreadPool>,
        inline: Arc<dyn Inline<S::Item>>,
        done_tx: Sender<Batch<S::Item>>,
        free_rx: Receiver<Vec<Entry<S::Item>>>,
        counters: Arc<Counters>,
        flows: Option<FlowTable>,
        express_sink: Option<Box<dyn crate::Sink<Item = S::Item>>>,
    ) -> Self {
        Self {
            batch_size: config.batch_size,
            inline_max: config.inline_max,
            express_window: config.express_window,
            lane_pace: (
                config.express_rate,
                config.sparse_burst as usize * 2,
                config.in_flight_time,
            ),
            stage,
            pool,
            inline,
            done_tx,
            free_rx,
            free: Vec::new(),
            made: 0,
            max_batches: config.batches_in_flight,
            max_bytes: config.in_flight_bytes,
            max_time: if config.ordering {
                config.in_flight_time
            } else {
                Duration::ZERO
            },
            out: VecDeque::new(),
            sent: 0,
            forgotten: 0,
            filling: None,
            filling_bytes: 0,
            opened: Instant::now(),
            next_seq: 0,
            next_batch: 0,
            counters,
            flows,
            codel: config.aqm.map(|aqm| Codel::new(aqm, Instant::now())),
            express_sink,
        }
    }

    /// Takes a packet: stamps it in order ([`Stage::sequence`]) and adds it to the current
    /// batch, which leaves for a worker once full. Never blocks.
    ///
    /// # Errors
    /// [`Rejected`] with the packet when every batch buffer is in flight or the stage refused.
    pub fn push(&mut self, item: S::Item) -> Result<(), Rejected<S::Item>> {
        self.push_in(item, NO_FLOW)
    }

    /// Takes a packet of `flow` (whatever identifies a flow to the caller: its addresses,
    /// protocol and ports). A packet of a sparse flow (the flow within
    /// [`Config::sparse_rate`], its last queued packet out and queued at least
    /// [`crate::SETTLE`] ago, the lane within [`Config::express_rate`], at most
    /// [`Config::express_window`] packets to overtake) is stamped, marked
    /// ([`Stage::expressed`]), processed and emitted at once on this thread: it overtakes
    /// other flows' packets in flight, never its own flow's. Any other packet is judged by
    /// the queue manager ([`Config::aqm`], by [`Stage::waited`]), then taken as by
    /// [`Sequencer::push_behind`]. Never blocks (but without a sink of its own,
    /// [`crate::start_with_express`], an express packet waits for the emitter's lock).
    ///
    /// # Errors
    /// [`Rejected`] with the packet when every batch buffer is in flight or the stage refused.
    pub fn push_flow(
        &mut self,
        item: S::Item,
        flow: &impl std::hash::Hash,
    ) -> Result<(), Rejected<S::Item>> {
        let Some(flows) = self.flows.as_mut() else {
            return self.push_in(item, NO_FLOW);
        };
        let bucket = flows.bucket(flow);
        // The open batch's stamp is recent enough to pace by under load; a packet that opens
        // a batch (light load) reads the clock anyway.
        let filling = self.filling.as_ref().map_or(0, Vec::len);
        let now = if filling > 0 {
            self.opened
        } else {
            Instant::now()
        };
        // What it would overtake (at most): every batch in flight, full, and the open one.
        let room = self.inline.in_flight() * self.batch_size + filling <= self.express_window;
        if flows.sparse(bucket, now, room) {
            return self.express(item, now);
        }
        if let (Some(codel), Some(waited)) = (self.codel.as_mut(), self.stage.waited(&item))
            && codel.drop(waited, now)
        {
            self.counters.count_drop(DropReason::Congestion);
            return Err(Rejected::Dropped(item, DropReason::Congestion));
        }
        self.push_in(item, bucket)
    }

    /// Takes a packet of `flow` into the queue, as [`Sequencer::push`] does, never by the
    /// express lane, and counts it as its flow's: no later packet of the flow overtakes it.
    /// For packets that waited elsewhere first (behind a handshake, say).
    ///
    /// # Errors
    /// [`Rejected`] with the packet when every batch buffer is in flight or the stage refused.
    pub fn push_behind(
        &mut self,
        item: S::Item,
        flow: &impl std::hash::Hash,
    ) -> Result<(), Rejected<S::Item>> {
        let bucket = self.flows.as_ref().map_or(NO_FLOW, |f| f.bucket(flow));
        self.push_in(item, bucket)
    }

    fn push_in(&mut self, item: S::Item, flow: Bucket) -> Result<(), Rejected<S::Item>> {
        if self.filling.is_none() {
            if self.over_budget() {
                return Err(Rejected::Full(item));
            }
            match self.batch_buffer() {
                Some(buf) => self.filling = Some(buf),
                None => {
                    self.counters.count_full();
                    return Err(Rejected::Full(item));
                }
            }
        }
        self.stamp_and_add(item, flow)
    }

    /// Whether the in-flight budget is spent (counted if so): the bytes, or the time the
    /// oldest batch in flight has been out.
    fn over_budget(&mut self) -> bool {
        if self.max_bytes > 0 && self.inline.bytes_in_flight() >= self.max_bytes {
            self.counters.count_over_bytes();
            return true;
        }
        if self.max_time.is_zero() {
            return false;
        }
        self.forget_left();
        if self
            .out
            .front()
            .is_some_and(|oldest| oldest.elapsed() > self.max_time)
        {
            self.counters.count_over_time();
            return true;
        }
        false
    }

    /// Forgets the dispatch times of the batches that left the emitter: batches leave in
    /// dispatch order, so those no longer in flight are the oldest.
    fn forget_left(&mut self) {
        let left = self.sent - self.inline.in_flight() as u64;
        while self.forgotten < left && self.out.pop_front().is_some() {
            self.forgotten += 1;
        }
    }

    /// A free batch buffer: the one used last, or a new one while fewer than
    /// `batches_in_flight` were made; `None` when all are in flight.
    fn batch_buffer(&mut self) -> Option<Vec<Entry<S::Item>>> {
        self.free.extend(self.free_rx.try_iter());
        if let Some(buf) = self.free.pop() {
            return Some(buf);
        }
        (self.made < self.max_batches).then(|| {
            self.made += 1;
            self.counters.count_batch_buffer();
            Vec::with_capacity(self.batch_size)
        })
    }

    /// A sparse flow's packet: stamped, processed and emitted now, outside the ring.
    fn express(&mut self, item: S::Item, arrived: Instant) -> Result<(), Rejected<S::Item>> {
        let (item, verdict, times) =
            express_work(&*self.stage, &self.counters, item, arrived, true)?;
        match self.express_sink.as_mut() {
            // Not behind the emitter's lock: the emitter may be sending a bulk batch (or
            // waiting for a core with the lock held) meanwhile.
            Some(sink) => {
                crate::emitter::emit_one(sink.as_mut(), &self.counters, item, verdict, times);
                sink.flush();
            }
            None => self.inline.emit_express(item, verdict, times),
        }
        Ok(())
    }

    /// Like [`Sequencer::push`], but when every batch buffer is in flight it waits for the
    /// emitter to release one (backpressure) instead of refusing. The byte and time budgets
    /// do not apply: the caller waits instead of dropping.
    ///
    /// # Errors
    /// [`Rejected::Dropped`] when the stage refused the packet.
    pub fn push_wait(&mut self, item: S::Item) -> Result<(), Rejected<S::Item>> {
        if self.filling.is_none() {
            let buf = match self.batch_buffer() {
                Some(buf) => buf,
                None => match self.free_rx.recv() {
                    Ok(buf) => buf,
                    // The emitter is gone: nothing can flow any more.
                    Err(_) => return Err(Rejected::Full(item)),
                },
            };
            self.filling = Some(buf);
        }
        self.stamp_and_add(item, NO_FLOW)
    }

    /// Sends the partial batch now. Call when the source has nothing more at the moment (end
    /// of a receive burst), so that light traffic is not held back waiting for a full batch.
    pub fn flush(&mut self) {
        if self.filling.as_ref().is_some_and(|b| !b.is_empty()) {
            self.dispatch();
        }
    }

    /// A lane of its own beside this pipeline, for another thread: it takes packets as the
    /// express lane does and emits them into `sink` (another handle on the same place),
    /// paced at [`Config::express_rate`], never overtaking more than
    /// [`Config::express_window`] packets in flight here. See [`crate::Lane`].
    pub fn lane<K: crate::Sink<Item = S::Item>>(&self, sink: K) -> crate::Lane<S> {
        let (rate, burst, wait_max) = self.lane_pace;
        crate::Lane::new(
            self.stage.clone(),
            Box::new(sink),
            self.inline.clone(),
            self.counters.clone(),
            self.batch_size,
            self.express_window,
            (wait_max, rate, burst),
            self.flows.as_ref().map(FlowTable::sibling),
        )
    }

    /// Lanes beside this pipeline, one per sink in `sinks`, each for a thread of its own
    /// (a socket per CPU), all at one pace ([`crate::Lane::sibling`]): together they take no
    /// more than one lane's [`Config::express_rate`]. None for no sinks.
    pub fn lanes<K: crate::Sink<Item = S::Item>>(
        &self,
        sinks: impl IntoIterator<Item = K>,
    ) -> Vec<crate::Lane<S>> {
        let mut lanes: Vec<crate::Lane<S>> = Vec::new();
        for sink in sinks {
            let lane = match lanes.first() {
                Some(first) => first.sibling(Box::new(sink)),
                None => self.lane(sink),
            };
            lanes.push(lane);
        }
        lanes
    }

    /// A snapshot of the pipeline's counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// The live counters, to export.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    fn stamp_and_add(&mut self, mut item: S::Item, flow: Bucket) -> Result<(), Rejected<S::Item>> {
        if let Err(reason) = self.stage.sequence(&mut item) {
            self.counters.count_drop(reason);
            return Err(Rejected::Dropped(item, reason));
        }
        let batch = self
            .filling
            .as_mut()
            .expect("a batch buffer was taken above");
        if batch.is_empty() {
            self.opened = Instant::now();
        }
        self.filling_bytes += self.stage.bytes(&item);
        batch.push(Entry {
            seq: self.next_seq,
            item,
            verdict: Ok(()),
        });
        if flow != NO_FLOW
            && let Some(flows) = &mut self.flows
        {
            flows.queued(flow, self.next_seq, self.opened);
        }
        self.next_seq += 1;
        if batch.len() >= self.batch_size {
            self.dispatch();
        }
        Ok(())
    }

    fn dispatch(&mut self) {
        let Some(mut entries) = self.filling.take() else {
            return;
        };
        self.counters.count_dispatch(entries.len());
        let bytes = std::mem::take(&mut self.filling_bytes);
        let seq = self.next_batch;
        self.next_batch += 1;
        let dispatched = Instant::now();
        let times = Times {
            opened: self.opened,
            dispatched,
            started: dispatched,
        };
        // Light load: a small batch with nothing in flight is sealed or opened here and
        // emitted at once. Nothing can overtake it (only this thread dispatches), and it
        // saves two thread wake-ups (worker, emitter): most of a gateway's added latency.
        if entries.len() <= self.inline_max && self.inline.idle() {
            for entry in &mut entries {
                entry.verdict = self.stage.process(&mut entry.item);
            }
            if self.inline.emit_now(seq, &mut entries, times) {
                self.filling = Some(entries);
            }
            return;
        }
        self.inline.dispatched(bytes);
        if !self.max_time.is_zero() {
            self.sent += 1;
            self.out.push_back(dispatched);
            // Bounded by what is in flight, whichever way packets are pushed (the emitter
            // counts a release after handing its buffers back: at most one ring's worth more).
            self.forget_left();
            debug_assert!(
                self.out.len() <= 2 * self.max_batches,
                "dispatch times kept past what is in flight"
            );
        }
        let batch = Batch {
            seq,
            entries,
            bytes,
            times,
        };
        let stage = self.stage.clone();
        let done = self.done_tx.clone();
        // FIFO: batches start in the order they were sealed off, which keeps reordering (and
        // so the emitter's hold time) small.
        self.pool.spawn_fifo(move || {
            let mut batch = batch;
            batch.times.started = Instant::now();
            for entry in &mut batch.entries {
                entry.verdict = stage.process(&mut entry.item);
            }
            // The emitter outlives every batch: it only ends once all senders are gone.
            let _ = done.send(batch);
        });
    }
}

/// A packet the express lane worked on: it, its verdict, its times.
pub(crate) type Worked<T> = (T, Result<(), DropReason>, Times);

/// The express lane's work on a packet that arrived at `arrived`, on the caller's thread:
/// stamped ([`Stage::sequence`]), marked ([`Stage::expressed`]) if `mark`, its wait in the
/// kernel recorded, processed. Returns it with its verdict and times, for the caller to emit.
///
/// # Errors
/// [`Rejected::Dropped`] when the stage refused it (counted).
pub(crate) fn express_work<S: Stage>(
    stage: &S,
    counters: &Counters,
    mut item: S::Item,
    arrived: Instant,
    mark: bool,
) -> Result<Worked<S::Item>, Rejected<S::Item>> {
    if let Err(reason) = stage.sequence(&mut item) {
        counters.count_drop(reason);
        return Err(Rejected::Dropped(item, reason));
    }
    if mark {
        stage.expressed(&mut item);
    }
    if let Some(waited) = stage.waited(&item) {
        counters.record_express_socket(waited);
    }
    let started = Instant::now();
    let verdict = stage.process(&mut item);
    let times = Times {
        opened: arrived.min(started),
        dispatched: started,
        started,
    };
    Ok((item, verdict, times))
}

impl<S: Stage> Drop for Sequencer<S> {
    fn drop(&mut self) {
        // Whatever was pushed is emitted: a partial batch leaves before the channel closes.
        self.flush();
    }
}
