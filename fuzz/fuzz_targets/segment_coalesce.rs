//! Offloads, both ways: a coalesced frame as the kernel could hand it over (any bytes, any
//! segment size and kind) cut into segments, and those segments found as a run and merged
//! back. Segments never pass the frame limit and together carry the frame's payload; a run
//! found over them never claims more payload than they hold. Ethernet frames (the adapter's
//! LAN port) and bare IP packets (the node's TUN device) alike.
#![no_main]

use arbitrary::Arbitrary;
use cyphonic_gateway::{Framing, GsoKind, Segmenter, find_run, merge_headers, tcp_flags};

#[derive(Arbitrary, Debug)]
struct Input {
    /// A bare IP packet instead of an Ethernet frame.
    bare: bool,
    udp: bool,
    size: u16,
    max_frame: u16,
    partial: bool,
    /// Frames whose checksum came deferred through the tunnel.
    deferred: Vec<bool>,
    frame: Vec<u8>,
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let kind = if input.udp { GsoKind::Udp } else { GsoKind::Tcp };
    let max_frame = usize::from(input.max_frame).max(64);
    let (framing, seg) = if input.bare {
        let seg = Segmenter::ip(&input.frame, kind, input.size, max_frame);
        (Framing::Ip, seg)
    } else {
        let seg = Segmenter::new(&input.frame, kind, input.size, max_frame);
        (Framing::Ethernet, seg)
    };
    let Ok(seg) = seg else {
        return;
    };
    let mut seg = seg.with_partial_checksums(input.partial);
    let count = seg.count();
    let mut segments = Vec::new();
    let mut out = vec![0u8; max_frame];
    while let Some(n) = seg.next_into(&mut out) {
        assert!(n <= max_frame, "a segment of {n} bytes past the limit {max_frame}");
        segments.push(out[..n].to_vec());
        assert!(segments.len() <= count, "more segments than announced");
    }
    assert_eq!(segments.len(), count);
    let views: Vec<&[u8]> = segments.iter().map(Vec::as_slice).collect();
    if let Some(run) = find_run(framing, &views, &input.deferred, 64) {
        assert!(run.count >= 2 && run.count <= views.len());
        let carried: usize = views[..run.count].iter().map(|f| f.len() - run.headers).sum();
        assert_eq!(run.payload, carried, "the run's payload is its frames' payload");
        let mut first = segments[0].clone();
        merge_headers(&mut first, &run, tcp_flags(framing, &segments[run.count - 1]));
    }
});
