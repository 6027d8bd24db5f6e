//! Instructions per packet, counted by valgrind's callgrind through iai-callgrind: the same
//! count on a busy machine as on an idle one, so a regression shows as a number
//! (`cargo xtask bench --instructions` writes the table in docs/benchmarks.md). Each
//! benchmark handles a batch; its id ends in `_x<packets>` so that the table divides by it.
//! The fixtures are made in the argument expressions, which iai-callgrind leaves out of the
//! count.
//!
//! Needs valgrind and `iai-callgrind-runner` of the same version as the library (xtask
//! installs the runner when it is missing).
#![allow(
    unused_qualifications,
    missing_docs,
    reason = "iai-callgrind's macros qualify the bench arguments and make undocumented modules"
)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

use cyphonic_benches::engine::{Opening, PACKET, Sealing};
use cyphonic_benches::filter::{ACK, CAMERA, FLOWS, SYN, rules, segment as tcp};
use cyphonic_benches::offload::{self, MAX_FRAME, SEGMENTS};
use cyphonic_crypto::Backend;
use cyphonic_filter::{Direction, Filter, Timeouts, Verdict};
use cyphonic_gateway::{Egress, Lan, Neighbors};
use iai_callgrind::{library_benchmark, library_benchmark_group, main};

/// Packets per sealing, opening and classifying batch.
const BATCH: usize = 64;

/// A batch of packets to seal, and the fixture that seals them.
fn to_seal(backend: Backend) -> (Sealing, Vec<Vec<u8>>) {
    let s = Sealing::new(backend, PACKET);
    let mut bufs = s.bare_burst();
    bufs.truncate(BATCH);
    (s, bufs)
}

/// A batch of sealed frames, and the fixture that opens them.
fn to_open(backend: Backend) -> (Opening, Vec<Vec<u8>>) {
    let o = Opening::new(backend, PACKET);
    let mut frames = o.bare_burst();
    frames.truncate(BATCH);
    (o, frames)
}

#[library_benchmark]
#[bench::ring_1420_x64(to_seal(Backend::Ring))]
#[bench::rustcrypto_1420_x64(to_seal(Backend::RustCrypto))]
fn seal((sealing, mut bufs): (Sealing, Vec<Vec<u8>>)) -> (Sealing, Vec<Vec<u8>>) {
    sealing.seal_bare(&mut bufs);
    (sealing, bufs)
}

#[library_benchmark]
#[bench::ring_1420_x64(to_open(Backend::Ring))]
#[bench::rustcrypto_1420_x64(to_open(Backend::RustCrypto))]
fn open((opening, mut frames): (Opening, Vec<Vec<u8>>)) -> (Opening, Vec<Vec<u8>>) {
    let failed = opening.open_bare(&mut frames);
    assert_eq!(failed, 0, "the fixture's frames open");
    // Returned, as every fixture here: dropping them (the engine's whole state, the
    // buffers) would be counted too.
    (opening, frames)
}

/// The device on the LAN (100.64.1.10, its lease) and the gateway's MACs.
const DEVICE: ([u8; 6], Ipv4Addr) = ([2, 0, 0, 0, 0, 2], Ipv4Addr::new(100, 64, 1, 10));
const GATEWAY_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

/// The one lease the classifier knows.
struct OneLease;

impl Neighbors for OneLease {
    fn leased_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        (ip == DEVICE.1).then_some(DEVICE.0)
    }
}

/// A LAN as the adapter's default configuration makes it, and `BATCH` full-sized TCP
/// frames from the device to a host behind another adapter (100.64.2.20).
fn to_classify() -> (Lan, Vec<Vec<u8>>) {
    let lan = Lan {
        mac: GATEWAY_MAC,
        host_mac: [2, 0xf0, 0, 0, 0, 1],
        gateway_ip: Ipv4Addr::new(100, 64, 1, 1),
        block: "100.64.1.0/24".parse().expect("a block"),
        overlay: "100.64.0.0/10".parse().expect("the overlay"),
        inner_mtu: 1420,
        mss_clamp: true,
        defer_checksums: false,
        legacy: None,
        v6: None,
    };
    // One segment of the offload fixture's stream, its IP packet cut to the inner MTU.
    let mut frame = offload::segments().swap_remove(0);
    frame.truncate(14 + PACKET);
    frame[16..18].copy_from_slice(&u16::try_from(PACKET).expect("small").to_be_bytes());
    frame[24..26].fill(0);
    let sum = ip4sum::checksum(&frame[14..34]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    (lan, vec![frame; BATCH])
}

#[library_benchmark]
#[bench::tcp_1420_x64(to_classify())]
fn classify((lan, frames): (Lan, Vec<Vec<u8>>)) -> (Lan, Vec<Vec<u8>>) {
    forward_all(lan, frames)
}

/// Classifies every frame of `frames`, each of which must be forwarded.
fn forward_all(lan: Lan, mut frames: Vec<Vec<u8>>) -> (Lan, Vec<Vec<u8>>) {
    let mut out = [0u8; 128];
    let mut forwarded = 0;
    for f in &mut frames {
        let len = f.len();
        if matches!(
            lan.handle_frame(f, len, false, &OneLease, &mut out),
            Egress::Forward { .. }
        ) {
            forwarded += 1;
        }
    }
    assert_eq!(forwarded, BATCH, "the fixture's frames are forwarded");
    (lan, frames)
}

/// The classify fixture's LAN with a legacy map of 192.0.2.8/29 onto 100.64.1.8/29
/// (docs/protocol.md §6), and its frames from a fixed-address device, 192.0.2.10, whose
/// overlay address is the one lease's: what the classifier adds for such a device.
fn to_map() -> (Lan, Vec<Vec<u8>>) {
    let (mut lan, frames) = to_classify();
    lan.legacy = Some(cyphonic_gateway::Legacy {
        map: cyphonic_gateway::Netmap::new(
            "192.0.2.8/29".parse().expect("a subnet"),
            "100.64.1.8/29".parse().expect("a block"),
        )
        .expect("one size"),
        gateway: Ipv4Addr::new(192, 0, 2, 9),
        router: None,
    });
    let mut frame = frames[0].clone();
    let ip = &mut frame[14..];
    ip[12..16].copy_from_slice(&[192, 0, 2, 10]);
    ip[10..12].fill(0);
    let sum = ip4sum::checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    // The TCP checksum as the device sent it (its own source in the pseudo-header).
    let tcp_sum = ip4sum::checksum(&tcp_pseudo_and_segment(ip));
    let at = 20 + 16;
    ip[at..at + 2].copy_from_slice(&tcp_sum.to_be_bytes());
    (lan, vec![frame; BATCH])
}

/// A TCP segment's pseudo-header and segment, its checksum field zeroed, for summing.
fn tcp_pseudo_and_segment(ip: &[u8]) -> Vec<u8> {
    let segment = &ip[20..];
    let mut bytes = Vec::with_capacity(12 + segment.len() + 1);
    bytes.extend_from_slice(&ip[12..20]);
    bytes.extend_from_slice(&[0, 6]);
    bytes.extend_from_slice(&u16::try_from(segment.len()).expect("small").to_be_bytes());
    bytes.extend_from_slice(segment);
    bytes[12 + 16..12 + 18].fill(0);
    if bytes.len() % 2 == 1 {
        bytes.push(0);
    }
    bytes
}

#[library_benchmark]
#[bench::tcp_1420_x64(to_map())]
fn legacy_map((lan, frames): (Lan, Vec<Vec<u8>>)) -> (Lan, Vec<Vec<u8>>) {
    forward_all(lan, frames)
}

/// `BATCH` frames from the tunnel as the LAN sink has them: an Ethernet header and a packet
/// of `PACKET` bytes two bytes into a buffer of the pool's size, room left behind.
fn to_tag() -> Vec<Vec<u8>> {
    (0..BATCH)
        .map(|i| {
            let mut buf = vec![0u8; 2048];
            buf[2..8].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
            buf[14..16].copy_from_slice(&0x0800u16.to_be_bytes());
            buf[16..16 + PACKET].fill(u8::try_from(i).expect("a small batch"));
            buf
        })
        .collect()
}

#[library_benchmark]
#[bench::tcp_1420_x64(to_tag())]
fn vlan_tag(mut bufs: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    for buf in &mut bufs {
        let tagged = cyphonic_gateway::tag_frame(buf, 2..16 + PACKET, black_box(20));
        assert_eq!(tagged, Some(2..20 + PACKET));
    }
    bufs
}

#[library_benchmark]
#[bench::tcp_64k_x45(offload::coalesced_tcp())]
fn segment(frame: Vec<u8>) -> Vec<u8> {
    let mut out = [0u8; MAX_FRAME];
    let n = offload::cut(&frame, true, &mut out, |s| {
        black_box(s);
    });
    assert_eq!(n, SEGMENTS);
    frame
}

#[library_benchmark]
#[bench::tcp_64k_x45(offload::segments())]
fn coalesce(mut segments: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let (run, last) = {
        let refs: Vec<&[u8]> = segments.iter().map(Vec::as_slice).collect();
        let deferred = [false; SEGMENTS];
        let run =
            cyphonic_gateway::find_run(cyphonic_gateway::Framing::Ethernet, &refs, &deferred, 64)
                .expect("one run");
        (
            run,
            cyphonic_gateway::tcp_flags(cyphonic_gateway::Framing::Ethernet, refs[SEGMENTS - 1]),
        )
    };
    assert_eq!(run.count, SEGMENTS);
    // The first frame carries the run's headers, edited in place as the sender does.
    cyphonic_gateway::merge_headers(&mut segments[0], &run, last);
    segments
}

/// The policy filter with 300 rules and 10,000 flows open, and `BATCH` packets: segments of
/// those flows (`established`), or the first of new flows the last rule allows (`new`).
fn to_filter(established: bool) -> (Filter, Vec<Vec<u8>>, Instant) {
    let now = Instant::now();
    let mut f = Filter::new(rules(), 65_536, Timeouts::default());
    for port in 0..FLOWS {
        let syn = tcp(10_000 + port, CAMERA, SYN, 60);
        assert_eq!(f.check(&syn, Direction::Out, now), Verdict::Pass);
    }
    let packets = (0..BATCH)
        .map(|i| {
            let i = u16::try_from(i).expect("a small batch");
            if established {
                tcp(10_000 + i * 97, CAMERA, ACK, PACKET)
            } else {
                tcp(40_000 + i, CAMERA, SYN, 60)
            }
        })
        .collect();
    (f, packets, now)
}

#[library_benchmark]
#[bench::established_x64(to_filter(true))]
#[bench::new_by_rule_300_x64(to_filter(false))]
fn filter((mut f, packets, now): (Filter, Vec<Vec<u8>>, Instant)) -> (Filter, Vec<Vec<u8>>) {
    for p in &packets {
        assert_eq!(f.check(p, Direction::Out, now), Verdict::Pass);
    }
    (f, packets)
}

library_benchmark_group!(
    name = per_packet;
    benchmarks = seal, open, classify, legacy_map, vlan_tag, filter, segment, coalesce
);

main!(library_benchmark_groups = per_packet);
