//! Which peer a packet goes to (crates/tunnel/src/routes.rs), per packet, with 2, 100 and
//! 10,000 peers: the table the adapter looks every outgoing packet up in, against the
//! ordered list it replaced (every route compared in turn, longest prefix first), in the same
//! run. The peers are /32 nodes and one /24 site added last, and the packets go to the site:
//! the list's worst case, and the common one for an adapter talking to another site while
//! thousands of nodes are up (issue 24).

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use cyphonic_benches::BURST;
use cyphonic_tunnel::routes::Routes;
use ipnet::Ipv4Net;

/// `n` peers: n - 1 nodes at 100.80.0.0 + i/32, then the site 100.64.2.0/24 (id n - 1).
fn blocks(n: usize) -> Vec<(Ipv4Net, u32)> {
    let mut v: Vec<(Ipv4Net, u32)> = (0..n - 1)
        .map(|i| {
            let i = u32::try_from(i).unwrap_or(0);
            let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 80, 0, 0)) + i);
            (Ipv4Net::from(a), i)
        })
        .collect();
    let site = Ipv4Net::new(Ipv4Addr::new(100, 64, 2, 0), 24).unwrap_or_default();
    v.push((site, u32::try_from(n - 1).unwrap_or(0)));
    v
}

fn routes(c: &mut Criterion) {
    let mut group = c.benchmark_group("routes");
    group.throughput(Throughput::Elements(BURST as u64));
    let dsts: Vec<Ipv4Addr> = (0..BURST)
        .map(|i| Ipv4Addr::new(100, 64, 2, u8::try_from(i % 250).unwrap_or(0) + 1))
        .collect();
    for n in [2usize, 100, 10_000] {
        let blocks = blocks(n);
        let site = u32::try_from(n - 1).unwrap_or(0);
        let mut table = Routes::default();
        for (net, id) in &blocks {
            table.insert((*net).into(), *id);
        }
        group.bench_with_input(BenchmarkId::new("table", n), &dsts, |b, dsts| {
            b.iter(|| {
                for d in dsts {
                    assert_eq!(table.lookup(black_box((*d).into())), Some(site));
                }
            });
        });
        // The list the table replaced: sorted longest prefix first, scanned in order.
        let mut list = blocks.clone();
        list.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        group.bench_with_input(BenchmarkId::new("ordered_list", n), &dsts, |b, dsts| {
            b.iter(|| {
                for d in dsts {
                    let found = list
                        .iter()
                        .find(|(net, _)| net.contains(black_box(d)))
                        .map(|(_, id)| *id);
                    assert_eq!(found, Some(site));
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, routes);
criterion_main!(benches);
