//! The LAN-side offloads' own cost per segment, with and without deferred checksums
//! (docs/protocol.md §1): the capture thread cutting a 64 KiB GRO frame into its 45 segments
//! (whole TCP checksums, or partial ones left to the far end), and the far end finding the run
//! those segments make for its LAN (every checksum verified, or none, since they were deferred).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use cyphonic_benches::offload::{MAX_FRAME, SEGMENTS, coalesced_tcp, cut, segments};
use cyphonic_gateway::find_run;

fn checksums(c: &mut Criterion) {
    let mut group = c.benchmark_group("deferred_checksums");
    let frame = coalesced_tcp();
    let mut out = [0u8; MAX_FRAME];
    for (name, partial) in [("cut_full", false), ("cut_partial", true)] {
        group.bench_function(name, |b| {
            b.iter(|| cut(black_box(&frame), partial, &mut out, |_| {}));
        });
    }
    let segs = segments();
    let refs: Vec<&[u8]> = segs.iter().map(Vec::as_slice).collect();
    for (name, deferred) in [
        ("run_verified", [false; SEGMENTS]),
        ("run_deferred", [true; SEGMENTS]),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                find_run(
                    cyphonic_gateway::Framing::Ethernet,
                    black_box(&refs),
                    &deferred,
                    64,
                )
            });
        });
    }
    group.finish();
}

criterion_group!(benches, checksums);
criterion_main!(benches);
