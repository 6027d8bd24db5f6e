//! Fixtures shared by the criterion benchmarks in `benches/`, kept here so that they are
//! compiled and tested like other code (a benchmark of a broken fixture measures nothing).
//!
//! [`engine`] feeds the production seal and open stages of the tunnel engine; its bare loops
//! make the same seal and open calls on one thread, so their ratio measures what the engine
//! adds around the AEAD: the peer lookup and counter in order, batching, the hand-off to a
//! worker, the reorder ring and emission. [`NoopStage`] measures the pipeline's own cost.

#![forbid(unsafe_code)]

pub mod engine;
pub mod filter;
pub mod lan;
pub mod offload;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender};
use cyphonic_pipeline::{Config, DropReason, Emitter, Sequencer, Sink, Stage};

/// Inner packet sizes measured: small, medium, and the default inner MTU.
pub const SIZES: [usize; 3] = [64, 512, 1420];
/// Packets per measured burst.
pub const BURST: usize = 4096;
const HDR: usize = 16;
const TAG: usize = 16;

/// A preallocated frame buffer: header, payload, room for the tag.
#[derive(Debug)]
pub struct Packet {
    buf: Box<[u8]>,
    counter: u64,
}

impl Packet {
    /// A packet carrying `size` payload bytes.
    pub fn new(size: usize) -> Self {
        let mut buf = vec![0u8; HDR + size + TAG].into_boxed_slice();
        buf[0] = 1;
        buf[1] = 3;
        for (b, i) in buf[HDR..HDR + size].iter_mut().zip((0..=u8::MAX).cycle()) {
            *b = i;
        }
        Self { buf, counter: 0 }
    }

    /// The whole frame.
    pub fn frame(&self) -> &[u8] {
        &self.buf
    }
}

/// `n` packets of `size` payload bytes.
pub fn packets(size: usize, n: usize) -> Vec<Packet> {
    (0..n).map(|_| Packet::new(size)).collect()
}

/// A pipeline of `stage` on `workers` rayon threads into `sink`, at the engine's default
/// pipeline configuration.
///
/// # Panics
/// If it cannot start.
pub fn start<S: Stage, K: Sink<Item = S::Item>>(
    stage: S,
    workers: usize,
    sink: K,
) -> (Sequencer<S>, Emitter<K>) {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .build()
            .expect("rayon pool"),
    );
    cyphonic_pipeline::start(&Config::default(), pool, stage, sink).expect("pipeline")
}

/// Pushes `burst` into `seq`, waiting for room, and sends it on its way.
///
/// # Panics
/// If the pipeline refuses an item (it stopped).
pub fn push_burst<S: Stage>(seq: &mut Sequencer<S>, burst: impl IntoIterator<Item = S::Item>) {
    for item in burst {
        assert!(
            seq.push_wait(item).is_ok(),
            "the benchmark pipeline refused a packet"
        );
    }
    seq.flush();
}

/// A stage that only numbers packets: measures the pipeline's own cost per packet.
#[derive(Debug, Default)]
pub struct NoopStage {
    next_counter: AtomicU64,
}

impl Stage for NoopStage {
    type Item = Packet;

    fn sequence(&self, p: &mut Packet) -> Result<(), DropReason> {
        p.counter = self.next_counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn process(&self, _: &mut Packet) -> Result<(), DropReason> {
        Ok(())
    }
}

/// Collects a burst in emission order and hands it back in one message.
#[derive(Debug)]
pub struct Gather {
    burst: usize,
    got: Vec<Packet>,
    back: Sender<Vec<Packet>>,
    in_order: bool,
    expected: u64,
}

impl Sink for Gather {
    type Item = Packet;

    fn emit(&mut self, p: Packet) -> Result<(), DropReason> {
        self.in_order &= p.counter == self.expected;
        self.expected += 1;
        self.got.push(p);
        if self.got.len() == self.burst {
            let full = std::mem::replace(&mut self.got, Vec::with_capacity(self.burst));
            let _ = self.back.send(full);
        }
        Ok(())
    }
}

/// A long-lived pipeline that a benchmark feeds burst after burst, reusing the same buffers.
#[derive(Debug)]
pub struct PipelineBench<S: Stage<Item = Packet>> {
    seq: Option<Sequencer<S>>,
    emitter: Option<Emitter<Gather>>,
    back: Receiver<Vec<Packet>>,
    packets: Vec<Packet>,
}

impl<S: Stage<Item = Packet>> PipelineBench<S> {
    /// A pipeline of `stage` on `workers` rayon threads, with bursts of [`BURST`] packets of
    /// `size` bytes.
    ///
    /// # Panics
    /// If the pipeline cannot start.
    pub fn new(stage: S, workers: usize, size: usize) -> Self {
        let (back_tx, back) = crossbeam_channel::bounded(1);
        let sink = Gather {
            burst: BURST,
            got: Vec::with_capacity(BURST),
            back: back_tx,
            in_order: true,
            expected: 0,
        };
        let (seq, emitter) = start(stage, workers, sink);
        Self {
            seq: Some(seq),
            emitter: Some(emitter),
            back,
            packets: packets(size, BURST),
        }
    }

    /// Pushes one burst through and waits until all of it was emitted.
    ///
    /// # Panics
    /// If the pipeline refuses a packet or stops.
    pub fn run_burst(&mut self) {
        push_burst(self.seq.as_mut().expect("running"), self.packets.drain(..));
        self.packets = self.back.recv().expect("the emitter returns every burst");
    }

    /// Stops the pipeline; returns whether every packet left in order.
    ///
    /// # Panics
    /// If the emitter thread panicked.
    pub fn finish(mut self) -> bool {
        drop(self.seq.take());
        let sink = self.emitter.take().expect("running").join();
        sink.in_order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noop_pipeline_keeps_order() {
        let mut bench = PipelineBench::new(NoopStage::default(), 2, 64);
        for _ in 0..3 {
            bench.run_burst();
        }
        assert!(bench.finish());
    }
}
