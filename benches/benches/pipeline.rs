//! Sealing and opening throughput of the engine's production stages: the bare seal (or
//! open) calls on one thread, then the ordered pipeline with the production stage
//! (`cyphonic_tunnel::SealStage`, `OpenStage`) at one worker and at one worker per core, for
//! both AEAD backends and three packet sizes. For each backend and size the three run back to
//! back, so their ratios compare measurements taken moments apart (`cargo xtask bench` turns
//! them into docs/benchmarks.md). Preparing each burst (pool buffers, frames) is not timed.
//! Then the pipeline's own cost (a do-nothing stage) and the reorder ring alone.

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use cyphonic_benches::engine::{Opening, Sealing, StageBench};
use cyphonic_benches::{BURST, NoopStage, PipelineBench, SIZES};
use cyphonic_crypto::Backend;
use cyphonic_pipeline::ReorderRing;
use cyphonic_tunnel::OpenStage;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

fn seal(c: &mut Criterion) {
    let mut group = c.benchmark_group("seal");
    group.throughput(Throughput::Elements(BURST as u64));
    for backend in Backend::ALL {
        for size in SIZES {
            let sealing = Sealing::new(backend, size);
            let f = format!("{}/{size}", backend.name());
            group.bench_function(BenchmarkId::new(&f, "bare"), |b| {
                b.iter_batched_ref(
                    || sealing.bare_burst(),
                    |bufs| sealing.seal_bare(bufs),
                    BatchSize::PerIteration,
                );
            });
            for workers in [1, cores()] {
                let mut bench = StageBench::new(sealing.stage(), workers);
                group.bench_function(BenchmarkId::new(&f, format!("{workers}w")), |b| {
                    b.iter_batched(
                        || sealing.burst(),
                        |burst| assert_eq!(bench.run_burst(burst), 0, "a packet failed to seal"),
                        BatchSize::PerIteration,
                    );
                });
            }
        }
    }
    group.finish();
}

fn open(c: &mut Criterion) {
    let mut group = c.benchmark_group("open");
    group.throughput(Throughput::Elements(BURST as u64));
    for backend in Backend::ALL {
        for size in SIZES {
            let opening = Opening::new(backend, size);
            let f = format!("{}/{size}", backend.name());
            group.bench_function(BenchmarkId::new(&f, "bare"), |b| {
                b.iter_batched_ref(
                    || opening.bare_burst(),
                    |frames| assert_eq!(opening.open_bare(frames), 0, "a frame failed to open"),
                    BatchSize::PerIteration,
                );
            });
            for workers in [1, cores()] {
                let mut bench = StageBench::new(OpenStage, workers);
                group.bench_function(BenchmarkId::new(&f, format!("{workers}w")), |b| {
                    b.iter_batched(
                        || opening.burst(),
                        |burst| assert_eq!(bench.run_burst(burst), 0, "a frame failed to open"),
                        BatchSize::PerIteration,
                    );
                });
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
    targets = seal, open, pipeline_overhead, reorder_ring
}
criterion_main!(benches);
