//! Order, completeness and bounds of the pipeline under random worker delays.

// Test code: unwrapping and narrowing casts of small test values are fine here.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::needless_pass_by_value
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cyphonic_pipeline::{
    Config, DropReason, Pulses, Rejected, Sink, Stage, Wait, start, start_with_express,
};
use proptest::prelude::*;

/// A test packet: its input position, how long its processing takes, and its fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pkt {
    index: usize,
    delay_us: u32,
    fail_in_stage: bool,
    fail_in_sink: bool,
    refuse_in_sequence: bool,
}

impl Pkt {
    fn plain(index: usize) -> Self {
        Self {
            index,
            delay_us: 0,
            fail_in_stage: false,
            fail_in_sink: false,
            refuse_in_sequence: false,
        }
    }
}

/// Sleeps (or spins, for short delays) as the packet says, and fails where it says.
struct DelayStage {
    gate: Option<Arc<AtomicBool>>,
}

impl Stage for DelayStage {
    type Item = Pkt;

    fn sequence(&self, item: &mut Pkt) -> Result<(), DropReason> {
        if item.refuse_in_sequence {
            Err(DropReason::NoSession)
        } else {
            Ok(())
        }
    }

    fn process(&self, item: &mut Pkt) -> Result<(), DropReason> {
        if let Some(gate) = &self.gate {
            while !gate.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        if item.delay_us > 50 {
            std::thread::sleep(Duration::from_micros(item.delay_us.into()));
        } else {
            let until = std::time::Instant::now() + Duration::from_micros(item.delay_us.into());
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        if item.fail_in_stage {
            Err(DropReason::Auth)
        } else {
            Ok(())
        }
    }
}

#[derive(Default)]
struct Collect {
    emitted: Vec<usize>,
    dropped: Vec<(usize, DropReason)>,
    flushes: usize,
}

impl Sink for Collect {
    type Item = Pkt;

    fn emit(&mut self, item: Pkt) -> Result<(), DropReason> {
        if item.fail_in_sink {
            return Err(DropReason::Replay);
        }
        self.emitted.push(item.index);
        Ok(())
    }

    fn dropped(&mut self, item: Pkt, reason: DropReason) {
        self.dropped.push((item.index, reason));
    }

    fn flush(&mut self) {
        self.flushes += 1;
    }
}

fn pool(workers: usize) -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .build()
            .unwrap(),
    )
}

/// Runs `pkts` through a pipeline and returns the sink and the final counters.
fn run(
    pkts: &[Pkt],
    workers: usize,
    config: &Config,
) -> (Collect, cyphonic_pipeline::Stats, Vec<usize>) {
    let (mut seq, emitter) = start(
        config,
        pool(workers),
        DelayStage { gate: None },
        Collect::default(),
    )
    .unwrap();
    let mut refused = Vec::new();
    for (i, p) in pkts.iter().enumerate() {
        match seq.push_wait(*p) {
            Ok(()) => {}
            Err(Rejected::Dropped(p, DropReason::NoSession)) => refused.push(p.index),
            Err(other) => panic!("unexpected {other:?}"),
        }
        if i % 7 == 0 {
            seq.flush();
        }
    }
    let counters = seq.counters().clone();
    drop(seq);
    let sink = emitter.join();
    (sink, counters.snapshot(), refused)
}

fn arb_pkts() -> impl Strategy<Value = Vec<Pkt>> {
    prop::collection::vec((0u32..300, 0u8..20), 1..250).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(index, (delay_us, fate))| Pkt {
                index,
                delay_us,
                fail_in_stage: fate == 1,
                fail_in_sink: fate == 2,
                refuse_in_sequence: fate == 3,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Output order equals input order at 1 to 8 workers and any batch geometry; nothing is
    /// lost or duplicated; every drop is accounted for under its reason.
    #[test]
    fn order_is_kept_and_everything_is_accounted_for(
        pkts in arb_pkts(),
        workers in 1usize..=8,
        batch_size in 1usize..=16,
        batches_in_flight in 1usize..=16,
        inline_max in 0usize..=20,
    ) {
        let config = Config { batch_size, batches_in_flight, inline_max, ..Config::default() };
        let (sink, stats, refused) = run(&pkts, workers, &config);
        let expect_emitted: Vec<usize> = pkts.iter().filter(|p| !(p.fail_in_stage || p.fail_in_sink || p.refuse_in_sequence)).map(|p| p.index).collect();
        let expect_dropped: Vec<(usize, DropReason)> = pkts.iter().filter(|p| p.fail_in_stage && !p.refuse_in_sequence).map(|p| (p.index, DropReason::Auth)).collect();
        let expect_refused: Vec<usize> = pkts.iter().filter(|p| p.refuse_in_sequence).map(|p| p.index).collect();
        prop_assert_eq!(&sink.emitted, &expect_emitted);
        prop_assert_eq!(&sink.dropped, &expect_dropped);
        prop_assert_eq!(&refused, &expect_refused);
        prop_assert_eq!(stats.out_of_order, 0);
        prop_assert_eq!(stats.emitted, expect_emitted.len() as u64);
        prop_assert_eq!(stats.submitted, (pkts.len() - refused.len()) as u64);
        prop_assert_eq!(stats.dropped(DropReason::Auth), expect_dropped.len() as u64);
        prop_assert_eq!(stats.dropped(DropReason::Replay), pkts.iter().filter(|p| p.fail_in_sink && !p.fail_in_stage && !p.refuse_in_sequence).count() as u64);
        prop_assert_eq!(stats.dropped(DropReason::NoSession), refused.len() as u64);
        prop_assert_eq!(stats.emitted + stats.dropped(DropReason::Auth) + stats.dropped(DropReason::Replay), stats.submitted);
        prop_assert!(stats.ring_depth_max <= batches_in_flight as u64);
    }
}

/// Light load: a small batch that finds nothing in flight is processed and emitted on the
/// caller's thread, before `flush` returns; a small batch behind one in flight goes to the
/// workers like any other, and order holds across both paths.
#[test]
fn small_batches_go_inline_only_when_nothing_is_in_flight() {
    let config = Config {
        batch_size: 16,
        batches_in_flight: 4,
        inline_max: 8,
        ..Config::default()
    };
    let (mut seq, emitter) = start(
        &config,
        pool(2),
        DelayStage { gate: None },
        Collect::default(),
    )
    .unwrap();
    seq.push(Pkt::plain(0)).unwrap();
    seq.flush();
    let s = seq.stats();
    assert_eq!((s.emitted, s.inline_batches), (1, 1), "{s:?}");
    // A full batch of slow packets goes to the workers; the single packet after it must not
    // overtake it.
    for i in 1..=16 {
        seq.push(Pkt {
            delay_us: 2_000,
            ..Pkt::plain(i)
        })
        .unwrap();
    }
    seq.push(Pkt::plain(17)).unwrap();
    seq.flush();
    let s = seq.stats();
    assert_eq!(s.inline_batches, 1, "{s:?}");
    assert!(s.emitted < 18, "{s:?}");
    let counters = seq.counters().clone();
    drop(seq);
    let sink = emitter.join();
    assert_eq!(sink.emitted, (0..18).collect::<Vec<_>>());
    let s = counters.snapshot();
    assert_eq!((s.batches, s.inline_batches, s.out_of_order), (3, 1, 0));
}

/// The control experiment: with ordering off, the same kind of load does reorder, and the
/// out-of-order counter sees it. Without this, "out_of_order == 0" could be vacuous.
#[test]
fn ordering_off_reorders_and_is_counted() {
    let mut pkts: Vec<Pkt> = (0..64).map(Pkt::plain).collect();
    pkts[0].delay_us = 30_000; // the first batch is slow; later ones overtake it
    // Inline processing off: an idle pipeline would seal the slow first packet on the
    // pushing thread, and nothing could overtake it.
    let config = Config {
        batch_size: 1,
        batches_in_flight: 64,
        ordering: false,
        inline_max: 0,
        ..Config::default()
    };
    let (sink, stats, _) = run(&pkts, 4, &config);
    assert_eq!(sink.emitted.len(), 64);
    assert_ne!(sink.emitted, (0..64).collect::<Vec<_>>());
    assert!(stats.out_of_order >= 1, "{stats:?}");
    // The same load with ordering on: in order, and the slow batch made others wait.
    let config = Config {
        ordering: true,
        ..config
    };
    let (sink, stats, _) = run(&pkts, 4, &config);
    assert_eq!(sink.emitted, (0..64).collect::<Vec<_>>());
    assert_eq!(stats.out_of_order, 0);
    assert!(
        stats.held_packets >= 1 && stats.mean_hold().unwrap() > Duration::ZERO,
        "{stats:?}"
    );
}

/// Every packet that leaves is counted once in each wait, and the waits add up: a batch of
/// packets that take 2 ms each shows it in `processing`, and `total` is never less.
#[test]
fn waits_count_every_packet_and_show_where_time_went() {
    let mut pkts: Vec<Pkt> = (0..16).map(Pkt::plain).collect();
    for p in &mut pkts {
        p.delay_us = 2_000; // slept; `run` flushes every 7 packets, so batches hold 1 to 4
    }
    pkts[5].fail_in_stage = true; // dropped by the stage: still counted
    let config = Config {
        batch_size: 4,
        batches_in_flight: 8,
        inline_max: 0,
        ..Config::default()
    };
    let (sink, stats, _) = run(&pkts, 2, &config);
    assert_eq!(sink.emitted.len() + sink.dropped.len(), 16);
    for w in Wait::PIPELINE {
        assert_eq!(stats.waited(w), 16, "{}: {stats:?}", w.name());
    }
    let mean = |w: Wait| stats.mean_wait(w).unwrap();
    assert!(
        mean(Wait::Processing) >= Duration::from_millis(2),
        "{stats:?}"
    );
    assert!(mean(Wait::Total) >= mean(Wait::Processing), "{stats:?}");
    assert!(mean(Wait::Total) >= mean(Wait::Batching), "{stats:?}");
    // Bucket 11 holds waits of 1.0-2.0 ms: no packet's processing wait is below it.
    assert_eq!(
        stats.waits[Wait::Processing.index()][..11]
            .iter()
            .sum::<u64>(),
        0,
        "{stats:?}"
    );

    // Inline: the same packets one at a time on the pushing thread, never queued.
    let config = Config {
        batch_size: 1,
        inline_max: 1,
        ..Config::default()
    };
    let (_, stats, _) = run(&pkts[..4], 2, &config);
    assert_eq!(stats.inline_batches, 4, "{stats:?}");
    assert_eq!(stats.waits[Wait::Queued.index()][0], 4, "{stats:?}");
    assert!(stats.mean_wait(Wait::Processing).unwrap() >= Duration::from_millis(2));
}

/// A full pipeline refuses at the head and says so; memory stays bounded; waiting works.
#[test]
fn backpressure_is_reported_not_buffered() {
    let gate = Arc::new(AtomicBool::new(false));
    // Inline processing off: the gate would hold the pushing thread itself.
    let config = Config {
        batch_size: 2,
        batches_in_flight: 3,
        inline_max: 0,
        ..Config::default()
    };
    let (mut seq, emitter) = start(
        &config,
        pool(2),
        DelayStage {
            gate: Some(gate.clone()),
        },
        Collect::default(),
    )
    .unwrap();
    // 3 buffers of 2: six packets fit (the third batch is still filling), the seventh does not.
    for i in 0..6 {
        seq.push(Pkt::plain(i)).unwrap();
    }
    assert_eq!(seq.push(Pkt::plain(6)), Err(Rejected::Full(Pkt::plain(6))));
    assert_eq!(seq.stats().rejected_full, 1);
    // Open the gate: the pipeline drains and takes packets again.
    gate.store(true, Ordering::Release);
    for i in 6..100 {
        seq.push_wait(Pkt::plain(i)).unwrap();
    }
    drop(seq);
    let sink = emitter.join();
    assert_eq!(sink.emitted, (0..100).collect::<Vec<_>>());
    assert!(sink.flushes >= 1);
}

/// A run of failures does not stall what follows: every slot resolves.
#[test]
fn failures_resolve_their_slots() {
    let pkts: Vec<Pkt> = (0..1000)
        .map(|i| Pkt {
            fail_in_stage: i % 3 == 0,
            delay_us: (i % 5) as u32 * 10,
            ..Pkt::plain(i)
        })
        .collect();
    let (sink, stats, _) = run(
        &pkts,
        3,
        &Config {
            batch_size: 4,
            batches_in_flight: 8,
            ..Config::default()
        },
    );
    assert_eq!(sink.emitted.len() + sink.dropped.len(), 1000);
    assert_eq!(stats.dropped(DropReason::Auth), 334);
    assert!(sink.emitted.windows(2).all(|w| w[0] < w[1]));
}

/// At least a million packets through the pipeline with cheap work: in order, none lost.
#[test]
fn stress_one_million_packets() {
    const N: usize = 1_000_000;
    struct Cheap;
    impl Stage for Cheap {
        type Item = u64;
        fn process(&self, item: &mut u64) -> Result<(), DropReason> {
            // A little work that varies per packet, so workers finish out of order.
            let mut x = *item;
            for _ in 0..(x % 17) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            std::hint::black_box(x);
            Ok(())
        }
    }
    struct Check {
        next: u64,
    }
    impl Sink for Check {
        type Item = u64;
        fn emit(&mut self, item: u64) -> Result<(), DropReason> {
            assert_eq!(item, self.next, "out of order");
            self.next += 1;
            Ok(())
        }
    }
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let (mut seq, emitter) =
        start(&Config::default(), pool(workers), Cheap, Check { next: 0 }).unwrap();
    for i in 0..N as u64 {
        seq.push_wait(i).unwrap();
    }
    let stats = seq.counters().clone();
    drop(seq);
    let sink = emitter.join();
    assert_eq!(sink.next, N as u64);
    let stats = stats.snapshot();
    assert_eq!(
        (stats.emitted, stats.out_of_order, stats.dropped_total()),
        (N as u64, 0, 0)
    );
}

#[test]
fn invalid_config_is_an_error() {
    for config in [
        Config {
            batch_size: 0,
            ..Config::default()
        },
        Config {
            batches_in_flight: 0,
            ..Config::default()
        },
    ] {
        assert!(
            start(
                &config,
                pool(1),
                DelayStage { gate: None },
                Collect::default()
            )
            .is_err()
        );
    }
}

/// A packet of the express-lane tests: its flow, its place in the input, and whether its
/// processing waits for the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flowing {
    flow: u8,
    index: usize,
    blocked: bool,
    delay_us: u32,
    /// Set by the stage when the express lane took it.
    marked: bool,
}

struct GateStage(Arc<AtomicBool>);

impl Stage for GateStage {
    type Item = Flowing;

    fn expressed(&self, item: &mut Flowing) {
        item.marked = true;
    }

    fn process(&self, item: &mut Flowing) -> Result<(), DropReason> {
        while item.blocked && !self.0.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let until = std::time::Instant::now() + Duration::from_micros(item.delay_us.into());
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// Every packet in the order it reached a sink; clones record into the same lists (the
/// emitter's sink and the express lane's own).
#[derive(Default, Clone)]
struct Arrivals {
    seen: Arc<std::sync::Mutex<Vec<(u8, usize)>>>,
    marked: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Sink for Arrivals {
    type Item = Flowing;

    fn emit(&mut self, item: Flowing) -> Result<(), DropReason> {
        self.seen.lock().unwrap().push((item.flow, item.index));
        if item.marked {
            self.marked.lock().unwrap().push(item.index);
        }
        Ok(())
    }
}

/// A packet of `flow` for the express-lane tests, processed at once or held by the gate.
fn flowing(flow: u8, index: usize, blocked: bool) -> Flowing {
    Flowing {
        flow,
        index,
        blocked,
        delay_us: 0,
        marked: false,
    }
}

/// How long the express-lane tests let batches stay in flight before the sequencer refuses
/// more (`in_flight_time`): their batches wait on a closed gate or a stuck sink on purpose,
/// for as long as a loaded machine takes between the test's steps (under qemu beside the
/// native tiers, more than the default 100 ms), and that budget is not what they test.
const STUCK_FOR: Duration = Duration::from_secs(30);

/// A pipeline for the express-lane tests: batches of 4, nothing inline (so batches wait for
/// `gate` on the workers), flows at 100 packets a second one at a time, the lane at 1000, at
/// most `window` packets overtaken.
fn stuck_lane(
    gate: &Arc<AtomicBool>,
    window: usize,
    sink: Arrivals,
) -> (
    cyphonic_pipeline::Sequencer<GateStage>,
    cyphonic_pipeline::Emitter<Arrivals>,
) {
    let config = Config {
        in_flight_time: STUCK_FOR,
        ..lane_config(window)
    };
    start(&config, pool(2), GateStage(gate.clone()), sink).unwrap()
}

/// The express-lane tests' pipeline settings (see [`stuck_lane`]).
fn lane_config(window: usize) -> Config {
    Config {
        batch_size: 4,
        batches_in_flight: 8,
        inline_max: 0,
        sparse_rate: 100,
        sparse_burst: 1,
        express_rate: 1000,
        express_window: window,
        ..Config::default()
    }
}

/// fq_codel's promise, in the pipeline: a sparse flow's packet goes out while a bulk flow's
/// batches are stuck on the workers; once a flow has packets in flight (or sends faster than
/// its pace) its packets queue behind them, so no flow's packets overtake each other.
#[test]
fn a_sparse_flow_overtakes_a_stuck_bulk_flow_but_no_flow_overtakes_itself() {
    let gate = Arc::new(AtomicBool::new(false));
    let sink = Arrivals::default();
    let (seen, marked) = (sink.seen.clone(), sink.marked.clone());
    let (mut seq, emitter) = stuck_lane(&gate, 4096, sink);
    let mut index = 0;
    let mut push = |seq: &mut cyphonic_pipeline::Sequencer<GateStage>, flow: u8, blocked| {
        let p = Flowing {
            flow,
            index,
            blocked,
            delay_us: 0,
            marked: false,
        };
        index += 1;
        seq.push_flow(p, &flow).unwrap();
    };
    let out = || seen.lock().unwrap().clone();
    // Bulk flow 1: its first packet is sparse and leaves at once; the rest exceed its pace
    // and are stuck on the workers.
    push(&mut seq, 1, false);
    for _ in 0..8 {
        push(&mut seq, 1, true);
    }
    seq.flush();
    assert_eq!(out(), [(1, 0)]);
    // Sparse flow 2 goes past them (processed on this thread: not held by the gate).
    push(&mut seq, 2, false);
    assert_eq!(out(), [(1, 0), (2, 9)]);
    // Its next packet at once exceeds its pace (100/s): it queues.
    push(&mut seq, 2, true);
    seq.flush();
    // Within its pace again, but its own packet is still in flight: it queues behind it.
    std::thread::sleep(Duration::from_millis(30));
    push(&mut seq, 2, true);
    assert_eq!(out(), [(1, 0), (2, 9)]);
    let counters = seq.counters().clone();
    gate.store(true, Ordering::Release);
    drop(seq);
    emitter.join();
    let mut expect = vec![(1, 0), (2, 9)];
    expect.extend((1..=8).map(|i| (1, i)));
    expect.extend([(2, 10), (2, 11)]);
    assert_eq!(out(), expect);
    // The stage marked exactly the two the lane took.
    assert_eq!(*marked.lock().unwrap(), [0, 9]);
    let stats = counters.snapshot();
    assert_eq!(stats.express, 2, "{stats:?}");
    assert_eq!((stats.emitted, stats.submitted), (12, 12), "{stats:?}");
    assert_eq!(stats.out_of_order, 0, "{stats:?}");
    for w in Wait::PIPELINE {
        assert_eq!(stats.waited(w), 12, "{}: {stats:?}", w.name());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// With the express lane open to every flow that keeps to a generous pace, each flow's
    /// packets still leave in their order, and every packet leaves once.
    #[test]
    fn with_the_express_lane_every_flow_keeps_its_order(
        pkts in prop::collection::vec((0u8..4, 0u32..200), 1..200),
        workers in 1usize..=4,
        batch_size in 1usize..=8,
        inline_max in 0usize..=8,
        sparse_burst in 1u32..=8,
        own_sink in any::<bool>(),
    ) {
        let config = Config {
            batch_size,
            batches_in_flight: 4,
            inline_max,
            sparse_rate: 20_000,
            sparse_burst,
            express_rate: 1_000_000,
            ..Config::default()
        };
        let sink = Arrivals::default();
        let seen = sink.seen.clone();
        let gate = Arc::new(AtomicBool::new(true));
        // With a sink of its own the lane does not take the emitter's lock: only the order
        // in which the emitter says packets are out keeps a flow's packets in order.
        let express = own_sink.then(|| sink.clone());
        let (mut seq, emitter) =
            start_with_express(&config, pool(workers), GateStage(gate), sink, express).unwrap();
        for (index, (flow, delay_us)) in pkts.iter().copied().enumerate() {
            let mut p = Flowing { flow, index, blocked: false, delay_us, marked: false };
            loop {
                match seq.push_flow(p, &flow) {
                    Ok(()) => break,
                    Err(Rejected::Full(back)) => {
                        p = back;
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            if index % 5 == 0 {
                seq.flush();
            }
        }
        let counters = seq.counters().clone();
        drop(seq);
        emitter.join();
        let out = seen.lock().unwrap().clone();
        prop_assert_eq!(out.len(), pkts.len());
        for flow in 0..4u8 {
            let mine: Vec<usize> = out.iter().filter(|(f, _)| *f == flow).map(|(_, i)| *i).collect();
            let want: Vec<usize> = pkts.iter().enumerate().filter(|(_, (f, _))| *f == flow).map(|(i, _)| i).collect();
            prop_assert_eq!(mine, want);
        }
        let stats = counters.snapshot();
        prop_assert_eq!(stats.emitted, pkts.len() as u64);
        prop_assert_eq!(stats.out_of_order, 0);
        // A flow's first packet is always sparse.
        prop_assert!(stats.express > 0);
    }
}

/// The lane never lets a packet overtake more than `express_window` packets in flight (a
/// receiver's replay window must hold them): beyond it, a sparse flow's packet queues.
#[test]
fn an_express_packet_overtakes_at_most_the_window() {
    let gate = Arc::new(AtomicBool::new(false));
    let sink = Arrivals::default();
    let seen = sink.seen.clone();
    let (mut seq, emitter) = stuck_lane(&gate, 8, sink);
    // Flow 1 uses its one sparse packet, then two batches of it are stuck: 8 in flight.
    seq.push_flow(flowing(1, 0, false), &1u8).unwrap();
    for i in 1..=8 {
        seq.push_flow(flowing(1, i, true), &1u8).unwrap();
    }
    // Flow 2 may overtake 8.
    seq.push_flow(flowing(2, 9, false), &2u8).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(1, 0), (2, 9)]);
    // A third stuck batch: 12 in flight, more than the window. Flow 3 queues.
    for i in 10..14 {
        seq.push_flow(flowing(1, i, true), &1u8).unwrap();
    }
    seq.push_flow(flowing(3, 14, true), &3u8).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(1, 0), (2, 9)]);
    let counters = seq.counters().clone();
    gate.store(true, Ordering::Release);
    drop(seq);
    emitter.join();
    assert_eq!(seen.lock().unwrap().last(), Some(&(3, 14)));
    assert_eq!(counters.snapshot().express, 2);
}

/// A packet pushed behind the queue as its flow's (it waited elsewhere first) holds the
/// flow's next packets behind it, though the flow never used the lane before.
#[test]
fn a_packet_pushed_behind_holds_its_flow_out_of_the_lane() {
    let gate = Arc::new(AtomicBool::new(false));
    let sink = Arrivals::default();
    let seen = sink.seen.clone();
    let (mut seq, emitter) = stuck_lane(&gate, 4096, sink);
    seq.push_behind(flowing(5, 0, true), &5u8).unwrap();
    seq.flush();
    seq.push_flow(flowing(5, 1, true), &5u8).unwrap();
    // Another flow still may go ahead.
    seq.push_flow(flowing(6, 2, false), &6u8).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(6, 2)]);
    let counters = seq.counters().clone();
    gate.store(true, Ordering::Release);
    drop(seq);
    emitter.join();
    assert_eq!(*seen.lock().unwrap(), [(6, 2), (5, 0), (5, 1)]);
    assert_eq!(counters.snapshot().express, 1);
}

/// The emitter's sink stuck in a send (as when the emitter thread waits for a core in the
/// middle of a `sendmmsg`): flow 1's packets wait in it until `release`.
struct StuckSink {
    inner: Arrivals,
    entered: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
}

impl Sink for StuckSink {
    type Item = Flowing;

    fn emit(&mut self, item: Flowing) -> Result<(), DropReason> {
        if item.flow == 1 {
            self.entered.store(true, Ordering::Release);
            while !self.release.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        self.inner.emit(item)
    }
}

/// With a sink of its own, a sparse flow's packet leaves while the emitter is stuck in its
/// sink with the lock held, and still no flow overtakes itself: flow 1's packets stuck in
/// the emitter's sink are not out, so flow 1's next packet queues behind them.
#[test]
fn the_express_lane_with_a_sink_of_its_own_does_not_wait_for_a_stuck_emitter() {
    let open = Arc::new(AtomicBool::new(true));
    let arrivals = Arrivals::default();
    let seen = arrivals.seen.clone();
    let (entered, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let sink = StuckSink {
        inner: arrivals.clone(),
        entered: entered.clone(),
        release: release.clone(),
    };
    let config = Config {
        in_flight_time: STUCK_FOR,
        ..lane_config(Config::default().express_window)
    };
    // The lane's own sink never sticks.
    let own = StuckSink {
        inner: arrivals,
        entered: Arc::new(AtomicBool::new(false)),
        release: Arc::new(AtomicBool::new(true)),
    };
    let (mut seq, emitter) =
        start_with_express(&config, pool(2), GateStage(open), sink, Some(own)).unwrap();
    // Flow 1's four packets take the queue (pushed behind: never by the lane); wait until
    // the emitter is stuck in its sink with them.
    for i in 0..4 {
        seq.push_behind(flowing(1, i, false), &1u8).unwrap();
    }
    seq.flush();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !entered.load(Ordering::Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "the emitter never reached its sink"
        );
        std::thread::yield_now();
    }
    // Flow 2 goes by its own sink at once (with the emitter's lock it would wait here).
    seq.push_flow(flowing(2, 4, false), &2u8).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(2, 4)]);
    // Flow 1, within its pace again, is not out yet: it queues behind its stuck packets.
    std::thread::sleep(Duration::from_millis(30));
    seq.push_flow(flowing(1, 5, false), &1u8).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(2, 4)]);
    let counters = seq.counters().clone();
    release.store(true, Ordering::Release);
    drop(seq);
    emitter.join();
    assert_eq!(
        *seen.lock().unwrap(),
        [(2, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 5)]
    );
    let stats = counters.snapshot();
    assert_eq!(stats.express, 1, "{stats:?}");
    assert_eq!((stats.emitted, stats.submitted), (6, 6), "{stats:?}");
}

/// A lane of its own ([`cyphonic_pipeline::Lane`], on another thread) emits at once while
/// the pipeline beside it is stuck, marks its packets as the express lane's, and overtakes
/// no more than the window: past it, it waits for the pipeline to drain and gives up after
/// `in_flight_time`.
#[test]
fn a_lane_of_its_own_emits_at_once_within_the_window_and_waits_beyond_it() {
    let gate = Arc::new(AtomicBool::new(false));
    let sink = Arrivals::default();
    let (seen, marked) = (sink.seen.clone(), sink.marked.clone());
    // The time budget is long enough that no slow machine (qemu after a soak) spends it
    // between the pushes below: with 30 ms, the sequencer itself refused the third batch,
    // and with 500 ms once too, under qemu beside a release build.
    let budget = Duration::from_secs(2);
    let config = Config {
        in_flight_time: budget,
        ..lane_config(8)
    };
    let (mut seq, emitter) =
        start(&config, pool(2), GateStage(gate.clone()), sink.clone()).unwrap();
    let mut lane = seq.lane(sink);
    // Two batches of flow 1 stuck on the workers: 8 in flight, as many as the window.
    for i in 0..8 {
        seq.push(flowing(1, i, true)).unwrap();
    }
    let stuck = std::thread::spawn(move || {
        lane.push(flowing(2, 8, false)).unwrap();
        lane.flush();
        lane
    });
    let mut lane = stuck.join().unwrap();
    assert_eq!(*seen.lock().unwrap(), [(2, 8)]);
    assert_eq!(*marked.lock().unwrap(), [8]);
    // A third batch: 12 in flight. The lane waits, then refuses.
    for i in 9..13 {
        seq.push(flowing(1, i, true)).unwrap();
    }
    let asked = std::time::Instant::now();
    assert!(matches!(
        lane.push(flowing(3, 13, false)),
        Err(Rejected::Full(_))
    ));
    assert!(asked.elapsed() >= budget);
    // Once the pipeline drains below the window, the lane's packet goes, after the rest.
    let counters = seq.counters().clone();
    gate.store(true, Ordering::Release);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut refused = 0;
    while let Err(Rejected::Full(_)) = lane.push(flowing(3, 14, false)) {
        // A slow machine may take longer than the budget to drain.
        refused += 1;
        assert!(std::time::Instant::now() < deadline, "never drained");
    }
    drop(seq);
    emitter.join();
    assert_eq!(seen.lock().unwrap().len(), 14);
    let stats = counters.snapshot();
    assert_eq!((stats.express, stats.lane), (2, 2), "{stats:?}");
    assert_eq!(stats.rejected_full, 1 + refused, "{stats:?}");
}

/// The lane's pace: a burst at once, then one packet per interval of `express_rate`;
/// once spent, `allowance` waits for as many as asked (up to the burst), so that a flood
/// costs a wake-up per batch (only the lower bound is checked, sleeps never end early).
#[test]
fn a_lane_takes_a_burst_then_keeps_to_its_rate() {
    let config = Config {
        express_rate: 200,
        sparse_burst: 2,
        ..lane_config(8)
    };
    let sink = Arrivals::default();
    let (seq, emitter) = start(
        &config,
        pool(1),
        GateStage(Arc::new(AtomicBool::new(true))),
        sink.clone(),
    )
    .unwrap();
    let mut lane = seq.lane(sink.clone());
    // A burst of twice the flows' burst.
    assert_eq!(lane.allowance(64), 4);
    assert_eq!(lane.allowance(2), 2, "no more than asked");
    // The bucket refills from the first packet taken: the waits below are bounded from
    // before it (a slow machine, qemu, refills part of it while it pushes the rest).
    let taken = std::time::Instant::now();
    for i in 0..4 {
        lane.push(flowing(1, i, false)).unwrap();
    }
    // Spent: asked for many, it waits for a burst's worth (4 intervals of 5 ms at 200 a
    // second), not for the first packet's.
    assert_eq!(lane.allowance(64), 4);
    assert!(taken.elapsed() >= Duration::from_millis(19));
    let taken = std::time::Instant::now();
    for i in 4..8 {
        lane.push(flowing(1, i, false)).unwrap();
    }
    // Asked for one, it waits for one (about one interval).
    assert_eq!(lane.allowance(1), 1);
    assert!(taken.elapsed() >= Duration::from_millis(4));
    drop(seq);
    emitter.join();
    assert_eq!(sink.seen.lock().unwrap().len(), 8);
}

/// Sibling lanes (`Sequencer::lanes`, one per CPU's socket) share one pace: what one took,
/// the other may not, and each sends into its own sink.
#[test]
fn sibling_lanes_share_one_pace() {
    let config = Config {
        express_rate: 200,
        sparse_burst: 2,
        ..lane_config(8)
    };
    let (first, second) = (Arrivals::default(), Arrivals::default());
    let (seq, emitter) = start(
        &config,
        pool(1),
        GateStage(Arc::new(AtomicBool::new(true))),
        first.clone(),
    )
    .unwrap();
    let mut lanes = seq.lanes([first.clone(), second.clone()]);
    let (mut sibling, mut lane) = (lanes.pop().unwrap(), lanes.pop().unwrap());
    assert_eq!(
        sibling.allowance(64),
        4,
        "a whole burst before either took any"
    );
    // The bucket (4, full) refills from here at one packet per 5 ms, for both lanes: so
    // whatever a lane is allowed beyond the 4 has been earned by time since. On a slow
    // machine (qemu) the pushes below can take long enough to earn some back: then the
    // allowances are larger and come at once, but never before they are earned.
    let taken = std::time::Instant::now();
    let earned = |consumed: usize, got: usize, what: &str| {
        let owed = u64::try_from((consumed + got).saturating_sub(4)).unwrap_or(u64::MAX);
        let elapsed = taken.elapsed();
        assert!(
            elapsed >= Duration::from_millis((owed * 5).saturating_sub(1)),
            "{what}: {got} allowed after {consumed} taken, within {elapsed:?}"
        );
    };
    for i in 0..3 {
        lane.push(flowing(1, i, false)).unwrap();
    }
    let got = sibling.allowance(64);
    assert!(got >= 1, "never none");
    earned(3, got, "what the first lane took is gone for both");
    sibling.push(flowing(2, 0, false)).unwrap();
    // Spent for both: the sibling waits a burst's worth (4 intervals of 5 ms), unless time
    // earned some back meanwhile.
    let got = sibling.allowance(64);
    assert!((1..=4).contains(&got), "{got}");
    earned(4, got, "spent for both");
    drop(seq);
    emitter.join();
    assert_eq!(
        (
            first.seen.lock().unwrap().len(),
            second.seen.lock().unwrap().len()
        ),
        (3, 1)
    );
}

/// A lane of its own marks a flow's packets only while the flow is sparse by the express
/// lane's rules (its pace; its last unmarked packet out, flushed, and settled), and sends
/// every packet at once, marked or not, in the order taken.
#[test]
fn a_lane_marks_a_flow_only_while_it_keeps_to_its_pace() {
    // Flows at 10 packets a second, one at a time.
    let config = Config {
        sparse_rate: 10,
        ..lane_config(8)
    };
    let sink = Arrivals::default();
    let (seen, marked) = (sink.seen.clone(), sink.marked.clone());
    let (seq, emitter) = start(
        &config,
        pool(1),
        GateStage(Arc::new(AtomicBool::new(true))),
        sink.clone(),
    )
    .unwrap();
    let mut lane = seq.lane(sink);
    lane.push_flow(flowing(1, 0, false), &1u8).unwrap();
    // Faster than its pace: out at once, unmarked.
    lane.push_flow(flowing(1, 1, false), &1u8).unwrap();
    // Another flow is not held back by it.
    lane.push_flow(flowing(2, 2, false), &2u8).unwrap();
    // Within its pace again (two packets: 200 ms), settled, but its last unmarked packet is
    // not flushed: unmarked.
    std::thread::sleep(Duration::from_millis(250));
    lane.push_flow(flowing(1, 3, false), &1u8).unwrap();
    lane.flush();
    // Flushed, paced and settled: marked.
    std::thread::sleep(Duration::from_millis(250));
    lane.push_flow(flowing(1, 4, false), &1u8).unwrap();
    lane.flush();
    drop(seq);
    emitter.join();
    assert_eq!(
        *seen.lock().unwrap(),
        [(1, 0), (1, 1), (2, 2), (1, 3), (1, 4)]
    );
    assert_eq!(*marked.lock().unwrap(), [0, 2, 4]);
}

/// The emitter beats while it idles (every 100 ms) or releases batches, and not while its
/// ring waits on a batch a worker never finishes: a stuck worker shows as a stuck emitter
/// (what an HA pair's box judges its data plane by).
#[test]
fn an_emitter_waiting_on_a_stuck_worker_stops_beating() {
    let gate = Arc::new(AtomicBool::new(false));
    let pulses = Pulses::new();
    let config = Config {
        sparse_rate: 0,
        name: "test-emit".into(),
        pulses: Some(pulses.clone()),
        ..lane_config(4096)
    };
    let (mut seq, emitter) = start(
        &config,
        pool(2),
        GateStage(gate.clone()),
        Arrivals::default(),
    )
    .unwrap();
    let second = Duration::from_secs(1);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(pulses.threads(), 1);
    assert!(
        pulses.stuck(std::time::Instant::now(), second).is_empty(),
        "an idle emitter goes round"
    );
    // The first batch waits for the gate on a worker; the second is done at once and
    // waits in the ring for the first.
    for i in 0..8 {
        seq.push(flowing(0, i, i < 4)).unwrap();
    }
    seq.flush();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        pulses.stuck(std::time::Instant::now(), second),
        ["test-emit"]
    );
    gate.store(true, Ordering::Release);
    drop(seq);
    assert_eq!(emitter.join().seen.lock().unwrap().len(), 8);
    assert_eq!(pulses.threads(), 0, "an emitter that ended is not judged");
}
