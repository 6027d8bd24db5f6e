//! Sealing throughput: the bare AEAD loop on one thread, then the ordered pipeline with the
//! same work at one worker and at one worker per core, for both AEAD backends and three packet
//! sizes. For each backend and size the three run back to back, so their ratios compare
//! measurements taken moments apart (`cargo xtask bench` turns them into docs/benchmarks.md).
//! Then the pipeline's own cost (a do-nothing stage) and the reorder ring alone.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use cyphonic_benches::{BURST, NoopStage, PipelineBench, SIZES, SealStage, packets, seal_packet};
use cyphonic_crypto::{Backend, Key};
use cyphonic_pipeline::ReorderRing;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

fn seal(c: &mut Criterion) {
    let mut group = c.benchmark_group("seal");
    group.throughput(Throughput::Elements(BURST as u64));
    for backend in Backend::ALL {
        for size in SIZES {
            let key = backend.key(&Key::from_bytes([7; 32]));
            let mut burst = packets(size, BURST);
            let mut counter = 0u64;
            group.bench_function(
                BenchmarkId::new(format!("{}/{size}", backend.name()), "bare"),
                |b| {
                    b.iter(|| {
                        for p in &mut burst {
                            counter += 1;
                            p.set_counter(counter);
                            seal_packet(&*key, p).expect("sealing a benchmark packet");
                        }
                    });
                },
            );
            for workers in [1, cores()] {
                let mut bench = PipelineBench::new(SealStage::new(backend), workers, size);
                let id =
                    BenchmarkId::new(format!("{}/{size}", backend.name()), format!("{workers}w"));
                group.bench_function(id, |b| b.iter(|| bench.run_burst()));
                assert!(bench.finish(), "the pipeline reordered packets");
            }
        }
    }
    group.finish();
}

fn pipeline_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("pipeline_overhead");
    group.throughput(Throughput::Elements(BURST as u64));
    for workers in [1, cores()] {
        let mut bench = PipelineBench::new(NoopStage::default(), workers, 64);
        group.bench_function(BenchmarkId::new("noop", format!("{workers}w")), |b| {
            b.iter(|| bench.run_burst());
        });
        assert!(bench.finish(), "the pipeline reordered packets");
    }
    group.finish();
}

/// The reorder ring alone: batches arriving in pairs swapped (1, 0, 3, 2, ...), so half of
/// them wait. Counted per batch; at the default batch size of 32 a packet pays 1/32 of it.
fn reorder_ring(c: &mut Criterion) {
    const SLOTS: usize = 128;
    const BATCHES: u64 = SLOTS as u64;
    let mut group = c.benchmark_group("reorder_ring");
    group.throughput(Throughput::Elements(BATCHES));
    let mut ring = ReorderRing::new(SLOTS);
    let now = std::time::Instant::now();
    let mut base = 0u64;
    group.bench_function("swapped_pairs", |b| {
        b.iter(|| {
            let mut released = 0;
            for pair in 0..BATCHES / 2 {
                let first = base + pair * 2;
                ring.insert(first + 1, first + 1, now);
                while ring.pop_next().is_some() {
                    released += 1;
                }
                ring.insert(first, first, now);
                while ring.pop_next().is_some() {
                    released += 1;
                }
            }
            base += BATCHES;
            assert_eq!(released, BATCHES);
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = seal, pipeline_overhead, reorder_ring
}
criterion_main!(benches);
