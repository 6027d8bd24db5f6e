//! The ordered emitter: a reorder ring of batches, released strictly in sequence order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::counters::Counters;
use crate::flows::Emitted;
use crate::pulse::Pulse;
use crate::{Batch, BuildError, Config, DropReason, Entry, Sink, Times};

/// The emitter thread of a pipeline. [`Emitter::join`] waits for it to drain and returns the
/// sink.
#[derive(Debug)]
pub struct Emitter<K> {
    handle: JoinHandle<K>,
    counters: Arc<Counters>,
}

impl<K: Sink> Emitter<K> {
    /// Starts the emitter thread over `shared`, fed by `done_rx`.
    pub(crate) fn spawn(
        config: &Config,
        shared: Arc<EmitShared<K>>,
        done_rx: Receiver<Batch<K::Item>>,
        counters: Arc<Counters>,
    ) -> Result<Self, BuildError> {
        let start = config.on_thread_start.clone();
        let pulses = config.pulses.clone();
        let handle = std::thread::Builder::new()
            .name(config.name.clone())
            .spawn(move || {
                if let Some(start) = start {
                    (start.0)();
                }
                let pulse = pulses.map(|p| p.register_here());
                run(&shared, &done_rx, pulse.as_ref())
            })?;
        Ok(Self { handle, counters })
    }

    /// The live counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Waits until every packet pushed before the sequencer was dropped has been emitted, and
    /// returns the sink.
    ///
    /// # Panics
    /// If the sink panicked on the emitter thread (re-raised here).
    pub fn join(self) -> K {
        match self.handle.join() {
            Ok(sink) => sink,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Batches that arrived ahead of their turn, indexed by sequence number modulo the capacity.
/// The capacity equals the number of batch buffers, so a batch can never be more than that many
/// ahead of the next one due: slots never collide.
pub struct ReorderRing<T> {
    slots: Vec<Option<(T, Instant)>>,
    next: u64,
    held: usize,
}

impl<T> core::fmt::Debug for ReorderRing<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReorderRing")
            .field("next", &self.next)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl<T> ReorderRing<T> {
    /// A ring for sequence numbers `next..next + capacity`.
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            next: 0,
            held: 0,
        }
    }

    /// Stores item `seq`, which must lie in `next..next + capacity` and not be stored yet.
    ///
    /// # Panics
    /// On a sequence number outside the window or stored twice: a pipeline bug, which must
    /// not go unnoticed as silent reordering or loss.
    pub fn insert(&mut self, seq: u64, item: T, arrived: Instant) {
        let cap = self.slots.len() as u64;
        assert!(
            seq >= self.next && seq - self.next < cap,
            "sequence {seq} outside the ring at {}",
            self.next
        );
        let index = self.slot(seq);
        let slot = &mut self.slots[index];
        assert!(slot.is_none(), "sequence {seq} inserted twice");
        *slot = Some((item, arrived));
        self.held += 1;
    }

    /// Takes the next item in order if it has arrived, with its arrival time.
    pub fn pop_next(&mut self) -> Option<(T, Instant)> {
        let next = self.slot(self.next);
        let taken = self.slots[next].take()?;
        self.next += 1;
        self.held -= 1;
        Some(taken)
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "the remainder is below slots.len()"
    )]
    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    /// Passes over `seq`, which must be the next due with nothing held (it was emitted by
    /// other means).
    ///
    /// # Panics
    /// When `seq` is not the next due or items are held: a pipeline bug.
    pub fn skip(&mut self, seq: u64) {
        assert!(
            seq == self.next && self.held == 0,
            "sequence {seq} skipped at {} with {} held",
            self.next,
            self.held
        );
        self.next += 1;
    }

    /// Items stored and waiting.
    pub const fn held(&self) -> usize {
        self.held
    }
}

/// What the emitter thread and the sequencer's inline path share: the sink and the reorder
/// ring behind one lock (whoever emits holds it), and the count of batches handed to the pool
/// and not yet emitted.
pub(crate) struct EmitShared<K: Sink> {
    state: Mutex<Option<EmitterState<K>>>,
    /// Batches dispatched to the pool and not yet emitted. Only the sequencer's thread adds
    /// to it; the emitter subtracts once a batch is out, under the lock.
    in_flight: AtomicUsize,
    /// What those batches' packets count for in the in-flight budget ([`crate::Stage::bytes`]),
    /// kept the same way.
    bytes_in_flight: AtomicUsize,
}

impl<K: Sink> EmitShared<K> {
    pub(crate) fn new(
        config: &Config,
        sink: K,
        free_tx: Sender<Vec<Entry<K::Item>>>,
        counters: Arc<Counters>,
        flows: Option<Arc<Emitted>>,
    ) -> Self {
        Self {
            state: Mutex::new(Some(EmitterState {
                sink,
                ring: ReorderRing::new(config.batches_in_flight),
                ordering: config.ordering,
                free_tx,
                counters,
                last_emitted: None,
                flows,
                unpublished: None,
                unflushed: 0,
            })),
            in_flight: AtomicUsize::new(0),
            bytes_in_flight: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<EmitterState<K>>> {
        // A panic in the sink is re-raised by `Emitter::join`; the state itself stays usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The sequencer's side of [`EmitShared`], without the sink's type.
pub(crate) trait Inline<T>: Send + Sync {
    /// Whether nothing is in flight: a batch processed now on the caller's thread may be
    /// emitted right away without overtaking anything.
    fn idle(&self) -> bool;
    /// A batch whose packets count `bytes` is being handed to the pool.
    fn dispatched(&self, bytes: usize);
    /// Batches handed to the pool and not yet emitted.
    fn in_flight(&self) -> usize;
    /// What their packets count for in the in-flight budget.
    fn bytes_in_flight(&self) -> usize;
    /// Emits batch `seq`, already processed on the caller's thread, now. Call only after
    /// [`Inline::idle`] said so (and with no dispatch since): `seq` is then the next due.
    /// Leaves `entries` empty, for reuse. Returns false when the emitter is gone.
    fn emit_now(&self, seq: u64, entries: &mut Vec<Entry<T>>, times: Times) -> bool;
    /// Emits a sparse flow's packet, processed on the caller's thread, now, outside the
    /// ring: after whatever the sink holds, ahead of every batch still in flight.
    fn emit_express(&self, item: T, verdict: Result<(), DropReason>, times: Times);
}

impl<K: Sink> Inline<K::Item> for EmitShared<K> {
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    fn dispatched(&self, bytes: usize) {
        self.bytes_in_flight.fetch_add(bytes, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn bytes_in_flight(&self) -> usize {
        self.bytes_in_flight.load(Ordering::Acquire)
    }

    fn emit_now(&self, seq: u64, entries: &mut Vec<Entry<K::Item>>, times: Times) -> bool {
        let mut guard = self.lock();
        let Some(st) = guard.as_mut() else {
            return false;
        };
        if st.ordering {
            st.ring.skip(seq);
        }
        let now = Instant::now();
        st.counters.record_waits(&times, now, now, entries.len());
        st.emit_entries(entries);
        st.counters.count_inline();
        st.flush();
        true
    }

    fn emit_express(&self, item: K::Item, verdict: Result<(), DropReason>, times: Times) {
        let mut guard = self.lock();
        let Some(st) = guard.as_mut() else {
            return;
        };
        emit_one(&mut st.sink, &st.counters, item, verdict, times);
        st.flush();
    }
}

struct EmitterState<K: Sink> {
    sink: K,
    ring: ReorderRing<Batch<K::Item>>,
    ordering: bool,
    free_tx: Sender<Vec<Entry<K::Item>>>,
    counters: Arc<Counters>,
    last_emitted: Option<u64>,
    /// How far this has emitted, for the sparse flows' table: published once the sink has
    /// flushed ([`EmitterState::flush`]).
    flows: Option<Arc<Emitted>>,
    /// The highest sequence number handed to the sink and not yet published.
    unpublished: Option<u64>,
    /// Packets handed to the sink since it last flushed.
    unflushed: usize,
}

/// Packets handed to the sink after which the emitter has it flush even while more batches
/// are ready (a sink's own send batch, `sendmmsg`): the sparse flows' table learns they are
/// out no later than that.
const PUBLISH_EVERY: usize = 64;

/// Emits one express packet into `sink` and counts it: the express lane's last step, on the
/// sequencer's thread, into the emitter's sink (under its lock) or into a sink of its own
/// ([`crate::start_with_express`]). The caller flushes the sink after it.
pub(crate) fn emit_one<T: Send + 'static>(
    sink: &mut dyn Sink<Item = T>,
    counters: &Counters,
    item: T,
    verdict: Result<(), DropReason>,
    times: Times,
) {
    let now = Instant::now();
    counters.record_waits(&times, now, now, 1);
    let emitted = match verdict {
        Ok(()) => match sink.emit(item) {
            Ok(()) => 1,
            Err(reason) => {
                counters.count_drop(reason);
                0
            }
        },
        Err(reason) => {
            counters.count_drop(reason);
            sink.dropped(item, reason);
            0
        }
    };
    counters.count_express(emitted);
}

/// How long the emitter waits for a batch before it goes round again (and beats).
const IDLE_TURN: Duration = Duration::from_millis(100);

/// The emitter thread: batches from the pool go through the reorder ring and out, in order;
/// the sink flushes whenever nothing more is ready. Ends when every sender is gone (the
/// sequencer dropped, every batch done) and returns the sink. It beats `pulse` each turn that
/// finds the ring empty or releases a batch: one that waits on a batch that never comes (a
/// worker stuck) stops beating.
fn run<K: Sink>(
    shared: &EmitShared<K>,
    done_rx: &Receiver<Batch<K::Item>>,
    pulse: Option<&Pulse>,
) -> K {
    loop {
        let batch = match done_rx.try_recv() {
            Ok(b) => b,
            Err(TryRecvError::Empty) => {
                // Nothing more is ready: let the sink push out what it gathered.
                if let Some(st) = shared.lock().as_mut() {
                    st.flush();
                    if let Some(p) = pulse
                        && st.ring.held() == 0
                    {
                        p.beat(Instant::now());
                    }
                }
                match done_rx.recv_timeout(IDLE_TURN) {
                    Ok(b) => b,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let mut guard = shared.lock();
        let st = guard
            .as_mut()
            .expect("only this thread takes the state, at its end");
        let (released, bytes) = st.release(batch);
        shared.bytes_in_flight.fetch_sub(bytes, Ordering::AcqRel);
        shared.in_flight.fetch_sub(released, Ordering::AcqRel);
        if let Some(p) = pulse
            && released > 0
        {
            p.beat(Instant::now());
        }
    }
    let mut st = shared
        .lock()
        .take()
        .expect("only this thread takes the state, at its end");
    debug_assert_eq!(st.ring.held(), 0, "batches left unreleased at shutdown");
    st.flush();
    st.sink
}

impl<K: Sink> EmitterState<K> {
    /// Takes `batch` from a worker and emits every batch now due, in order; returns how
    /// many left and what their packets counted for in the budget.
    fn release(&mut self, batch: Batch<K::Item>) -> (usize, usize) {
        let arrived = Instant::now();
        if !self.ordering {
            let bytes = batch.bytes;
            self.emit(batch, arrived, arrived);
            return (1, bytes);
        }
        let seq = batch.seq;
        self.ring.insert(seq, batch, arrived);
        let (mut released, mut bytes) = (0, 0);
        while let Some((batch, arrived_at)) = self.ring.pop_next() {
            bytes += batch.bytes;
            // Every batch released here but the one that just arrived waited for it.
            if batch.seq != seq {
                self.counters.record_hold(
                    arrived.saturating_duration_since(arrived_at),
                    batch.entries.len(),
                );
            }
            self.emit(batch, arrived_at, arrived);
            released += 1;
        }
        self.counters.record_depth(self.ring.held());
        if self.unflushed >= PUBLISH_EVERY {
            self.flush();
        }
        (released, bytes)
    }

    /// Has the sink push out what it gathered; only then does the sparse flows' table count
    /// those packets as out, so that an express packet sent after it learns so (on any
    /// thread, without this lock) cannot overtake them.
    fn flush(&mut self) {
        self.sink.flush();
        self.unflushed = 0;
        if let (Some(flows), Some(seq)) = (&self.flows, self.unpublished.take()) {
            flows.up_to(seq);
        }
    }

    /// Emits `batch`, which reached this thread at `arrived`, now (`now`).
    fn emit(&mut self, batch: Batch<K::Item>, arrived: Instant, now: Instant) {
        self.counters
            .record_waits(&batch.times, arrived, now, batch.entries.len());
        let mut entries = batch.entries;
        self.emit_entries(&mut entries);
        // Back to the sequencer; if it is gone the buffer is simply freed.
        let _ = self.free_tx.try_send(entries);
    }

    fn emit_entries(&mut self, entries: &mut Vec<Entry<K::Item>>) {
        if let Some(last) = entries.last() {
            // In order: everything up to the batch's last packet is out once the sink flushes.
            self.unpublished = Some(last.seq);
            self.unflushed += entries.len();
        }
        let (mut emitted, mut out_of_order) = (0, 0);
        for entry in entries.drain(..) {
            if self.last_emitted.is_some_and(|last| entry.seq < last) {
                out_of_order += 1;
            }
            self.last_emitted = Some(self.last_emitted.map_or(entry.seq, |l| l.max(entry.seq)));
            match entry.verdict {
                Ok(()) => match self.sink.emit(entry.item) {
                    Ok(()) => emitted += 1,
                    Err(reason) => self.counters.count_drop(reason),
                },
                Err(reason) => {
                    self.counters.count_drop(reason);
                    self.sink.dropped(entry.item, reason);
                }
            }
        }
        self.counters.count_emitted(emitted, out_of_order);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_releases_in_order() {
        let mut r = ReorderRing::new(4);
        let t = Instant::now();
        r.insert(2, 'c', t);
        r.insert(1, 'b', t);
        assert_eq!(r.pop_next(), None);
        r.insert(0, 'a', t);
        let out: Vec<char> = std::iter::from_fn(|| r.pop_next().map(|(c, _)| c)).collect();
        assert_eq!(out, vec!['a', 'b', 'c']);
        r.insert(6, 'g', t);
        assert_eq!(r.held(), 1);
        assert_eq!(r.pop_next(), None);
    }

    #[test]
    #[should_panic(expected = "outside the ring")]
    fn ring_refuses_out_of_window() {
        let mut r = ReorderRing::new(4);
        r.insert(4, (), Instant::now());
    }

    #[test]
    #[should_panic(expected = "inserted twice")]
    fn ring_refuses_duplicates() {
        let mut r = ReorderRing::new(4);
        r.insert(1, (), Instant::now());
        r.insert(1, (), Instant::now());
    }

    /// A sink that records what it took and how much of it it has flushed.
    #[derive(Default)]
    struct Flushing {
        taken: usize,
        flushed: usize,
    }

    impl Sink for Flushing {
        type Item = u64;

        fn emit(&mut self, _: u64) -> Result<(), DropReason> {
            self.taken += 1;
            Ok(())
        }

        fn flush(&mut self) {
            self.flushed = self.taken;
        }
    }

    fn batch(seq: u64, first: u64, packets: u64) -> Batch<u64> {
        let now = Instant::now();
        Batch {
            seq,
            entries: (first..first + packets)
                .map(|s| Entry {
                    seq: s,
                    item: s,
                    verdict: Ok(()),
                })
                .collect(),
            bytes: 0,
            times: Times {
                opened: now,
                dispatched: now,
                started: now,
            },
        }
    }

    /// The sparse flows' table counts a packet as out only once the sink has flushed it, and
    /// the emitter flushes once it has handed `PUBLISH_EVERY` packets, though more batches
    /// are ready (an express packet sent on another thread relies on both).
    #[test]
    fn what_is_out_follows_the_sink_s_flushes_at_least_every_64_packets() {
        let flows = Arc::new(Emitted::default());
        let (free_tx, _free_rx) = crossbeam_channel::bounded(8);
        let mut st = EmitterState {
            sink: Flushing::default(),
            ring: ReorderRing::new(8),
            ordering: true,
            free_tx,
            counters: Arc::new(Counters::default()),
            last_emitted: None,
            flows: Some(flows.clone()),
            unpublished: None,
            unflushed: 0,
        };
        // Handed, not flushed: not out.
        st.release(batch(0, 0, 32));
        assert_eq!((st.sink.taken, st.sink.flushed, flows.get()), (32, 0, 0));
        // 64 handed: flushed and out.
        st.release(batch(1, 32, 32));
        assert_eq!((st.sink.flushed, flows.get()), (64, 64));
        // A batch ahead of its turn is neither; its predecessor releases both.
        st.release(batch(3, 96, 32));
        assert_eq!((st.sink.taken, flows.get()), (64, 64));
        st.release(batch(2, 64, 32));
        assert_eq!((st.sink.flushed, flows.get()), (128, 128));
        // Fewer than 64: out once the emitter flushes (when nothing more is ready).
        st.release(batch(4, 128, 8));
        assert_eq!(flows.get(), 128);
        st.flush();
        assert_eq!((st.sink.flushed, flows.get()), (136, 136));
    }
}
