//! The LAN services on one core: what one DNS answer and one DHCP renewal cost the adapter's
//! control thread, on a site with 200 devices. The renewal includes building the ACK, not
//! writing the lease file (that is the disk's cost, a few milliseconds on an SD card).

use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use cyphonic_benches::lan::{
    DEVICES, NOW, dhcp_server, discover, flood_mac, flood_server, mac, query, renewal, resolver,
};
use cyphonic_resolver::Action;
use hickory_proto::rr::RecordType;

fn dns(c: &mut Criterion) {
    let mut group = c.benchmark_group("lan_dns");
    let mut r = resolver();
    let now = Instant::now();
    let a = query(1, "dev150.gw1.ovl.example.", RecordType::A);
    group.bench_function("own_zone_a", |b| {
        b.iter(|| match r.handle_query(now, &a, 0, None) {
            Action::Respond(v) => v.len(),
            _ => unreachable!("answered from the zone"),
        });
    });
    let ptr = query(2, "170.1.64.100.in-addr.arpa.", RecordType::PTR);
    group.bench_function("own_ptr", |b| {
        b.iter(|| match r.handle_query(now, &ptr, 0, None) {
            Action::Respond(v) => v.len(),
            _ => unreachable!("answered from the zone"),
        });
    });
    let garbage: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) | 0x80).collect();
    group.bench_function("malformed", |b| {
        b.iter(|| r.handle_query(now, &garbage, 0, None));
    });
    group.finish();
}

fn dhcp(c: &mut Criterion) {
    let mut group = c.benchmark_group("lan_dhcp");
    let mut s = dhcp_server();
    let renewals: Vec<Vec<u8>> = (0..DEVICES).map(|n| renewal(&s, n)).collect();
    let mut n = 0usize;
    group.bench_function("renewal", |b| {
        b.iter(|| {
            n = (n + 1) % renewals.len();
            #[expect(clippy::cast_possible_truncation, reason = "fewer than 256 devices")]
            let r = s.handle(NOW + 1800, &renewals[n], mac(n as u8));
            while s.poll_event().is_some() {}
            r
        });
    });
    group.finish();
}

/// A DISCOVER from a new MAC on a /16 pool while a flood has `k` offers outstanding: what
/// choosing an address costs must not grow with `k`.
fn dhcp_flood(c: &mut Criterion) {
    let mut group = c.benchmark_group("lan_dhcp_flood");
    group.sample_size(20);
    for k in [0u32, 1_000, 10_000] {
        let base = flood_server(k);
        let m = flood_mac(k);
        let msg = discover(m);
        group.bench_function(format!("discover_{k}_offers"), |b| {
            b.iter_batched(
                || base.clone(),
                |mut s| {
                    let r = s.handle(NOW, &msg, m);
                    (r, s)
                },
                criterion::BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, dns, dhcp, dhcp_flood);
criterion_main!(benches);
