//! The per-device policy filter (crates/filter) per packet, against sealing the same number
//! of packets in the same run: what policy costs the tunnel as a ratio. A burst of 1420-byte
//! TCP segments spread over 10,000 established flows under 300 rules (the common case: a
//! flow-table hit), then new flows judged by those 300 rules (the first allowed by the last
//! rule, all 300 about its destination or spread over 300 destinations; or denied), then the
//! bare seal of the same burst with the default
//! AEAD. `cargo xtask bench` turns the ratio into docs/benchmarks.md.

use std::net::Ipv4Addr;
use std::time::Instant;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use cyphonic_benches::BURST;
use cyphonic_benches::engine::Sealing;
use cyphonic_benches::filter::{ACK, CAMERA, FLOWS, SIZE, SYN, rules, segment, spread_rules};
use cyphonic_crypto::Backend;
use cyphonic_filter::{Direction, Filter, Timeouts, Verdict};

fn filter(c: &mut Criterion) {
    let mut group = c.benchmark_group("filter");
    group.throughput(Throughput::Elements(BURST as u64));
    let now = Instant::now();
    // 10,000 flows open.
    let mut f = Filter::new(rules(), 65_536, Timeouts::default());
    for port in 0..FLOWS {
        let syn = segment(10_000 + port, CAMERA, SYN, 60);
        assert_eq!(f.check(&syn, Direction::Out, now), Verdict::Pass);
    }
    let burst: Vec<Vec<u8>> = (0..BURST)
        .map(|i| {
            let port = 10_000 + u16::try_from(i % usize::from(FLOWS)).unwrap_or(0);
            segment(port, CAMERA, ACK, SIZE)
        })
        .collect();
    group.bench_function("established_10k_flows_300_rules", |b| {
        b.iter(|| {
            for p in &burst {
                assert_eq!(f.check(p, Direction::Out, now), Verdict::Pass);
            }
        });
    });
    // New flows: each SYN scans the rules; allowed by the last one, or by none.
    let syns: Vec<Vec<u8>> = (0..BURST)
        .map(|i| segment(30_000 + u16::try_from(i).unwrap_or(0), CAMERA, SYN, 60))
        .collect();
    group.bench_function("new_allowed_by_rule_300", |b| {
        b.iter_batched_ref(
            || Filter::new(rules(), 65_536, Timeouts::default()),
            |f| {
                for p in &syns {
                    assert_eq!(f.check(p, Direction::Out, now), Verdict::Pass);
                }
            },
            BatchSize::LargeInput,
        );
    });
    group.bench_function("new_allowed_by_rule_300_spread", |b| {
        b.iter_batched_ref(
            || Filter::new(spread_rules(), 65_536, Timeouts::default()),
            |f| {
                for p in &syns {
                    assert_eq!(f.check(p, Direction::Out, now), Verdict::Pass);
                }
            },
            BatchSize::LargeInput,
        );
    });
    let denied: Vec<Vec<u8>> = (0..BURST)
        .map(|i| {
            segment(
                30_000 + u16::try_from(i).unwrap_or(0),
                Ipv4Addr::new(100, 64, 3, 7),
                SYN,
                60,
            )
        })
        .collect();
    let mut f = Filter::new(rules(), 65_536, Timeouts::default());
    group.bench_function("new_denied_after_300_rules", |b| {
        b.iter(|| {
            for p in &denied {
                assert!(matches!(f.check(p, Direction::Out, now), Verdict::Drop(_)));
            }
        });
    });
    // The same number of packets sealed, moments apart: the yardstick.
    let sealing = Sealing::new(Backend::default(), SIZE);
    group.bench_function("seal_1420_yardstick", |b| {
        b.iter_batched_ref(
            || sealing.bare_burst(),
            |bufs| sealing.seal_bare(bufs),
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = filter
}
criterion_main!(benches);
