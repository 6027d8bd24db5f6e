//! The in-flight budget: bytes and time, not a count of packets; batch buffers made on first
//! use and reused most recent first.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cyphonic_pipeline::{Config, DropReason, Rejected, Sequencer, Sink, Stage, start};

/// A packet of `bytes` bytes, numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pkt {
    index: usize,
    bytes: usize,
}

/// Holds every packet until the gate opens.
struct Gated(Arc<AtomicBool>);

impl Stage for Gated {
    type Item = Pkt;

    fn bytes(&self, item: &Pkt) -> usize {
        item.bytes
    }

    fn process(&self, _item: &mut Pkt) -> Result<(), DropReason> {
        while !self.0.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        Ok(())
    }
}

#[derive(Default)]
struct Collect(Vec<usize>);

impl Sink for Collect {
    type Item = Pkt;

    fn emit(&mut self, item: Pkt) -> Result<(), DropReason> {
        self.0.push(item.index);
        Ok(())
    }
}

fn pool() -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    )
}

/// One packet as a batch of its own, as a receive of one frame makes it.
fn alone(seq: &mut Sequencer<Gated>, p: Pkt) -> Result<(), Rejected<Pkt>> {
    seq.push(p)?;
    seq.flush();
    Ok(())
}

/// Waits until the pipeline emitted `n` packets in all.
fn drained(seq: &Sequencer<Gated>, n: u64) {
    let until = Instant::now() + Duration::from_secs(10);
    while seq.stats().emitted < n {
        assert!(Instant::now() < until, "not drained: {:?}", seq.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Many small batches of small packets fit (far more than a fixed count would let in, at
/// this batch size); the bytes stop the burst, and the pipeline takes packets again once
/// they left.
#[test]
fn the_bytes_in_flight_bound_a_burst_not_its_number_of_batches() {
    let gate = Arc::new(AtomicBool::new(false));
    let config = Config {
        batch_size: 32,
        batches_in_flight: 1000,
        in_flight_bytes: 10_000,
        in_flight_time: Duration::ZERO,
        inline_max: 0,
        ..Config::default()
    };
    let (mut seq, emitter) =
        start(&config, pool(), Gated(gate.clone()), Collect::default()).unwrap();
    // 900 batches of one 10-byte packet: 9,000 bytes.
    for index in 0..900 {
        alone(&mut seq, Pkt { index, bytes: 10 }).unwrap();
    }
    // One of 1,000 bytes takes the total to the budget; the next is refused.
    alone(
        &mut seq,
        Pkt {
            index: 900,
            bytes: 1000,
        },
    )
    .unwrap();
    let refused = Pkt {
        index: 901,
        bytes: 10,
    };
    assert_eq!(alone(&mut seq, refused), Err(Rejected::Full(refused)));
    let s = seq.stats();
    assert_eq!(
        (s.rejected_full, s.rejected_bytes, s.rejected_late),
        (1, 1, 0),
        "{s:?}"
    );
    assert_eq!(s.batch_buffers, 901, "{s:?}");
    gate.store(true, Ordering::Release);
    drained(&seq, 901);
    alone(
        &mut seq,
        Pkt {
            index: 901,
            bytes: 10,
        },
    )
    .unwrap();
    drop(seq);
    assert_eq!(emitter.join().0, (0..902).collect::<Vec<_>>());
}

/// A batch out longer than the time budget stops new ones, whatever the bytes; once it has
/// left, packets are taken again.
#[test]
fn a_batch_out_past_the_time_budget_refuses_new_packets() {
    let gate = Arc::new(AtomicBool::new(false));
    let config = Config {
        batch_size: 4,
        in_flight_bytes: 0,
        in_flight_time: Duration::from_millis(200),
        inline_max: 0,
        ..Config::default()
    };
    let (mut seq, emitter) =
        start(&config, pool(), Gated(gate.clone()), Collect::default()).unwrap();
    alone(&mut seq, Pkt { index: 0, bytes: 1 }).unwrap();
    alone(&mut seq, Pkt { index: 1, bytes: 1 }).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let late = Pkt { index: 2, bytes: 1 };
    assert_eq!(alone(&mut seq, late), Err(Rejected::Full(late)));
    let s = seq.stats();
    assert_eq!(
        (s.rejected_full, s.rejected_bytes, s.rejected_late),
        (1, 0, 1),
        "{s:?}"
    );
    gate.store(true, Ordering::Release);
    drained(&seq, 2);
    alone(&mut seq, late).unwrap();
    drop(seq);
    assert_eq!(emitter.join().0, vec![0, 1, 2]);
}

/// Without the budgets, the batch buffers are the bound: all in flight, the next packet is
/// refused (and counted as neither bytes nor time).
#[test]
fn past_the_budgets_the_batch_buffers_still_bound_the_pipeline() {
    let gate = Arc::new(AtomicBool::new(false));
    let config = Config {
        batch_size: 2,
        batches_in_flight: 3,
        in_flight_bytes: 0,
        in_flight_time: Duration::ZERO,
        inline_max: 0,
        ..Config::default()
    };
    let (mut seq, emitter) =
        start(&config, pool(), Gated(gate.clone()), Collect::default()).unwrap();
    for index in 0..3 {
        alone(&mut seq, Pkt { index, bytes: 1 }).unwrap();
    }
    let refused = Pkt { index: 3, bytes: 1 };
    assert_eq!(alone(&mut seq, refused), Err(Rejected::Full(refused)));
    let s = seq.stats();
    assert_eq!(
        (s.rejected_full, s.rejected_bytes, s.rejected_late),
        (1, 0, 0),
        "{s:?}"
    );
    gate.store(true, Ordering::Release);
    drop(seq);
    assert_eq!(emitter.join().0, vec![0, 1, 2]);
}

/// Light traffic reuses the batch buffer it used last: a large cap costs nothing until a
/// burst needs it.
#[test]
fn batch_buffers_are_made_on_first_use_and_the_last_used_is_taken_first() {
    let gate = Arc::new(AtomicBool::new(true));
    let config = Config {
        batches_in_flight: 4096,
        inline_max: 0,
        ..Config::default()
    };
    let (mut seq, emitter) = start(&config, pool(), Gated(gate), Collect::default()).unwrap();
    for index in 0..200 {
        alone(&mut seq, Pkt { index, bytes: 100 }).unwrap();
        drained(&seq, index as u64 + 1);
    }
    let s = seq.stats();
    // The emitter hands a buffer back just after counting its packets: at most one more.
    assert!(s.batch_buffers <= 2, "{s:?}");
    drop(seq);
    assert_eq!(emitter.join().0, (0..200).collect::<Vec<_>>());
}
