//! Fixtures shared by the criterion benchmarks in `benches/`, kept here so that they are
//! compiled and tested like other code (a benchmark of a broken fixture measures nothing).
//!
//! The bare AEAD loop and the pipeline's seal stage call the same [`seal_packet`], so their
//! ratio measures exactly what the pipeline adds: sequencing, batching, hand-off to a worker,
//! the reorder ring and emission.

#![forbid(unsafe_code)]

pub mod lan;
pub mod offload;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender};
use cyphonic_crypto::{Backend, Key, PacketKey, TAG_LEN};
use cyphonic_pipeline::{Config, DropReason, Emitter, Sequencer, Sink, Stage};

/// Inner packet sizes measured: small, medium, and the default inner MTU.
pub const SIZES: [usize; 3] = [64, 512, 1420];
/// Packets per measured burst.
pub const BURST: usize = 4096;
const HDR: usize = 16;

/// A preallocated frame buffer: header, payload, room for the tag.
#[derive(Debug)]
pub struct Packet {
    buf: Box<[u8]>,
    counter: u64,
}

impl Packet {
    /// A packet carrying `size` payload bytes.
    pub fn new(size: usize) -> Self {
        let mut buf = vec![0u8; HDR + size + TAG_LEN].into_boxed_slice();
        buf[0] = 1;
        buf[1] = 3;
        for (b, i) in buf[HDR..HDR + size].iter_mut().zip((0..=u8::MAX).cycle()) {
            *b = i;
        }
        Self { buf, counter: 0 }
    }

    /// Sets the counter the next seal uses.
    pub fn set_counter(&mut self, counter: u64) {
        self.counter = counter;
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

/// Seals one packet in place with its counter: the unit of work of both measurements.
pub fn seal_packet(key: &dyn PacketKey, p: &mut Packet) -> Result<(), DropReason> {
    p.buf[8..16].copy_from_slice(&p.counter.to_be_bytes());
    let (hdr, body) = p.buf.split_at_mut(HDR);
    key.seal(p.counter, hdr, body)
        .map_err(|_| DropReason::TooBig)
}

/// The seal stage: counters in arrival order on the sequencer, sealing on workers.
#[derive(Debug)]
pub struct SealStage {
    key: Box<dyn PacketKey>,
    next_counter: AtomicU64,
}

impl SealStage {
    /// A stage sealing with a fixed test key on `backend`.
    pub fn new(backend: Backend) -> Self {
        Self {
            key: backend.key(&Key::from_bytes([7; 32])),
            next_counter: AtomicU64::new(0),
        }
    }
}

impl Stage for SealStage {
    type Item = Packet;

    fn sequence(&self, p: &mut Packet) -> Result<(), DropReason> {
        p.counter = self.next_counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn process(&self, p: &mut Packet) -> Result<(), DropReason> {
        seal_packet(&*self.key, p)
    }
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
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(workers)
                .build()
                .expect("rayon pool"),
        );
        let (back_tx, back) = crossbeam_channel::bounded(1);
        let sink = Gather {
            burst: BURST,
            got: Vec::with_capacity(BURST),
            back: back_tx,
            in_order: true,
            expected: 0,
        };
        let (seq, emitter) =
            cyphonic_pipeline::start(&Config::default(), pool, stage, sink).expect("pipeline");
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
        let seq = self.seq.as_mut().expect("running");
        for p in self.packets.drain(..) {
            if seq.push_wait(p).is_err() {
                panic!("the benchmark pipeline refused a packet");
            }
        }
        seq.flush();
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
    fn pipeline_fixture_seals_like_the_bare_loop() {
        for backend in Backend::ALL {
            let mut bench = PipelineBench::new(SealStage::new(backend), 2, 100);
            bench.run_burst();
            bench.run_burst();
            // Buffer i was sealed with counter i, then again with BURST + i: redo it by hand.
            let key = backend.key(&Key::from_bytes([7; 32]));
            for i in [0, 1, 777, BURST - 1] {
                let mut expected = Packet::new(100);
                for counter in [i as u64, (BURST + i) as u64] {
                    expected.counter = counter;
                    seal_packet(&*key, &mut expected).unwrap();
                }
                assert_eq!(
                    bench.packets[i].frame(),
                    expected.frame(),
                    "{backend} packet {i}"
                );
            }
            assert!(bench.finish());
        }
    }

    #[test]
    fn noop_pipeline_keeps_order() {
        let mut bench = PipelineBench::new(NoopStage::default(), 2, 64);
        for _ in 0..3 {
            bench.run_burst();
        }
        assert!(bench.finish());
    }
}
