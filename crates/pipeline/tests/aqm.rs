//! The queue manager (CoDel on the wait before the pipeline) and the socket wait histogram.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cyphonic_pipeline::{Aqm, Config, DropReason, Rejected, Sink, Stage, Wait, WaitTally, start};

/// A packet of `flow` that waited `waited` in the kernel before the pipeline read it.
#[derive(Debug)]
struct Queued {
    flow: u8,
    waited: Duration,
}

struct Judged;

impl Stage for Judged {
    type Item = Queued;

    fn waited(&self, item: &Queued) -> Option<Duration> {
        Some(item.waited)
    }

    fn process(&self, _item: &mut Queued) -> Result<(), DropReason> {
        Ok(())
    }
}

#[derive(Default)]
struct Count(Arc<Mutex<Vec<u8>>>);

impl Sink for Count {
    type Item = Queued;

    fn emit(&mut self, item: Queued) -> Result<(), DropReason> {
        self.0.lock().unwrap().push(item.flow);
        Ok(())
    }
}

fn config(aqm: Option<Aqm>) -> Config {
    Config {
        batch_size: 8,
        batches_in_flight: 64,
        aqm,
        ..Config::default()
    }
}

/// The longest a feed goes on for want of what its test needs: a loaded machine (the arm64
/// tier runs under qemu beside the native tiers) may run the loop below only now and then.
const DEADLINE: Duration = Duration::from_secs(30);

/// What a feed did: per flow (index 1 bulk, 2 sparse), the packets pushed and those lost to
/// congestion (by the callers' count, checked against the counters); and the flows of the
/// packets emitted, in order.
struct Fed {
    sent: [usize; 3],
    congested: [usize; 3],
    out: Vec<u8>,
}

/// Feeds a bulk flow (1) whose packets waited `waited` each, eight packets every 800 µs, and
/// a sparse flow (2) a packet every 50 ms, for at least `span` and then until `enough` says
/// the feed has shown what its test needs (or [`DEADLINE`]). The test is judged on what was
/// fed, not on how much the clock allowed.
fn feed(
    aqm: Option<Aqm>,
    waited: Duration,
    span: Duration,
    enough: impl Fn(&[usize; 3], &[usize; 3]) -> bool,
) -> Fed {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let sink = Count::default();
    let seen = sink.0.clone();
    let (mut seq, emitter) = start(&config(aqm), pool, Judged, sink).unwrap();
    let mut sent = [0usize; 3];
    let mut congested = [0usize; 3];
    let start_at = Instant::now();
    let mut last_sparse = start_at;
    while start_at.elapsed() < span || (!enough(&sent, &congested) && start_at.elapsed() < DEADLINE)
    {
        let mut batch: Vec<_> = (0..8).map(|_| Queued { flow: 1, waited }).collect();
        if last_sparse.elapsed() >= Duration::from_millis(50) {
            last_sparse = Instant::now();
            batch.push(Queued { flow: 2, waited });
        }
        for item in batch {
            let flow = item.flow;
            sent[flow as usize] += 1;
            match seq.push_flow(item, &flow) {
                Ok(()) => {}
                Err(Rejected::Dropped(_, DropReason::Congestion)) => congested[flow as usize] += 1,
                Err(other) => panic!("{other:?}"),
            }
        }
        seq.flush();
        std::thread::sleep(Duration::from_micros(800));
    }
    let counters = seq.counters().clone();
    drop(seq);
    emitter.join();
    assert_eq!(
        counters.dropped(DropReason::Congestion),
        (congested[1] + congested[2]) as u64
    );
    let out = seen.lock().unwrap().clone();
    Fed {
        sent,
        congested,
        out,
    }
}

fn emitted(fed: &Fed, flow: u8) -> usize {
    fed.out.iter().filter(|&&f| f == flow).count()
}

#[test]
fn a_standing_wait_drops_bulk_packets_and_never_the_sparse_flow() {
    let aqm = Aqm {
        target: Duration::from_millis(5),
        interval: Duration::from_millis(40),
    };
    let fed = feed(
        Some(aqm),
        Duration::from_millis(8),
        Duration::from_millis(400),
        |sent, congested| congested[1] >= 3 && sent[2] >= 4,
    );
    assert!(fed.congested[1] >= 3, "bulk drops: {:?}", fed.congested);
    assert_eq!(fed.congested[2], 0, "the sparse flow lost packets");
    assert!(fed.sent[2] >= 4, "sparse packets sent: {:?}", fed.sent);
    assert_eq!(emitted(&fed, 2), fed.sent[2], "{:?}", fed.out);
    assert_eq!(emitted(&fed, 1), fed.sent[1] - fed.congested[1]);
}

#[test]
fn below_target_or_switched_off_nothing_is_dropped() {
    let aqm = Aqm {
        target: Duration::from_millis(5),
        interval: Duration::from_millis(40),
    };
    // Enough packets that a wait above target would have been judged many times over.
    let many = |sent: &[usize; 3], _: &[usize; 3]| sent[1] >= 800;
    let below = feed(
        Some(aqm),
        Duration::from_millis(2),
        Duration::from_millis(300),
        many,
    );
    assert!(many(&below.sent, &below.congested), "{:?}", below.sent);
    assert_eq!(below.congested, [0; 3]);
    let off = feed(
        None,
        Duration::from_millis(8),
        Duration::from_millis(300),
        many,
    );
    assert!(many(&off.sent, &off.congested), "{:?}", off.sent);
    assert_eq!(off.congested, [0; 3]);
}

#[test]
fn the_socket_waits_the_edge_counts_show_in_the_snapshot() {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let (seq, emitter) = start(&config(None), pool, Judged, Count::default()).unwrap();
    let mut tally = WaitTally::default();
    for us in [3, 3, 100, 5_000] {
        tally.add(Duration::from_micros(us));
    }
    assert_eq!(tally.packets(), 4);
    seq.counters().record_socket(&mut tally);
    assert_eq!(tally.packets(), 0, "flushed");
    let stats = seq.counters().snapshot();
    assert_eq!(stats.waited(Wait::Socket), 4);
    // 3 µs: below 4 (bucket 2); 100 µs: below 128 (7); 5 ms: below 8192 (13).
    let h = &stats.waits[Wait::Socket.index()];
    assert_eq!((h[2], h[7], h[13]), (2, 1, 1), "{h:?}");
    assert_eq!(
        stats.mean_wait(Wait::Socket),
        Some(Duration::from_nanos(5_106_000 / 4))
    );
    // Socket waits are not pipeline waits.
    assert_eq!(stats.waited(Wait::Total), 0);
    drop(seq);
    emitter.join();
}
