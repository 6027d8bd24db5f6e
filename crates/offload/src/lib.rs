//! Sending a batch of packets out of a tunnel end's edge with segmentation offload: runs of
//! one flow (the gateway's [`find_run`]) merged into one frame for the kernel to segment
//! (GSO, or the NIC's TSO/USO), the rest one by one, and what to do when the device refuses a
//! merged frame. One piece of code for both edges: the adapter's LAN port (Ethernet frames on
//! a packet socket, `dataplane.lan_gso`) and the node's TUN device (bare IP packets, with
//! `dataplane.tun_offload`). Kept apart from the sinks so that the refusals, which this
//! machine's kernel never gives, can be tested with a stand-in for the device.
//!
//! ```text
//! sink.flush -> send_frames: find_run / merge_headers (gateway) -> FrameTx::send_gathered
//!                            refused: restore_headers, the run alone -> FrameTx::send_batch
//! ```

#![forbid(unsafe_code)]

use std::io;

use cyphonic_gateway::{
    Framing, GsoKind, IPV4_MIN_HEADER, Run, complete_deferred_checksum, find_run, merge_headers,
    restore_headers, tcp_flags,
};
use cyphonic_netio::{Gathered, Gso, PacketSocket, Tun, segmentation_unsupported};

/// The most frames one call sends.
pub const SEND_BATCH: usize = 64;

/// What sends the frames: the LAN port's packet socket, the node's TUN device (a test's
/// stand-in in the tests).
pub trait FrameTx {
    /// What is in front of each IP packet it is given.
    fn framing(&self) -> Framing;
    /// [`PacketSocket::send_gathered`].
    fn send_gathered(
        &self,
        parts: &[&[u8]],
        messages: &[Gathered],
        refused: impl FnMut(usize, io::Error),
    ) -> usize;
    /// [`PacketSocket::send_batch`].
    fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>);
    /// The interface's name, for the log.
    fn name(&self) -> &str;
}

impl FrameTx for PacketSocket {
    fn framing(&self) -> Framing {
        Framing::Ethernet
    }
    fn send_gathered(
        &self,
        parts: &[&[u8]],
        messages: &[Gathered],
        refused: impl FnMut(usize, io::Error),
    ) -> usize {
        Self::send_gathered(self, parts, messages, refused)
    }
    fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
        Self::send_batch(self, frames)
    }
    fn name(&self) -> &str {
        Self::name(self)
    }
}

impl FrameTx for Tun {
    fn framing(&self) -> Framing {
        Framing::Ip
    }
    fn send_gathered(
        &self,
        parts: &[&[u8]],
        messages: &[Gathered],
        refused: impl FnMut(usize, io::Error),
    ) -> usize {
        Self::send_gathered(self, parts, messages, refused)
    }
    fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
        Self::send_batch(self, frames)
    }
    fn name(&self) -> &str {
        Self::name(self)
    }
}

/// What [`send_frames`] did.
#[derive(Debug, Default)]
pub struct Sent {
    /// Frames (segments) the interface took.
    pub sent: u64,
    /// Frames it refused.
    pub failed: u64,
    /// Merged frames it took.
    pub merged: u64,
    /// The segments in them.
    pub merged_segments: u64,
    /// The last refusal.
    pub error: Option<io::Error>,
}

/// Which of the merge switches governs runs of `kind`.
const fn slot(kind: GsoKind) -> usize {
    match kind {
        GsoKind::Tcp => 0,
        GsoKind::Udp => 1,
    }
}

/// Sends the first [`SEND_BATCH`] of `frames` (whole frames as `tx` takes them, in order): runs of TCP
/// segments or UDP datagrams of one flow as one merged frame, while `merge` ([TCP, UDP])
/// allows that kind. A merged frame the interface refuses gets its own headers back and its
/// run goes out frame by frame; if the refusal means the interface never segments that kind,
/// its switch in `merge` goes off for good, while a passing failure (link down, queue full)
/// leaves it on. `deferred[i]` says that frame `i` came through the tunnel with its transport
/// checksum deferred: a merged frame gets its checksums from the offload, a frame sent alone
/// gets its checksum computed here. Otherwise the frames' bytes are borrowed for the headers'
/// rewriting only: each leaves as it came.
pub fn send_frames(
    tx: &impl FrameTx,
    frames: &mut [&mut [u8]],
    deferred: &[bool; SEND_BATCH],
    merge: &mut [bool; 2],
) -> Sent {
    let n = frames.len().min(SEND_BATCH);
    let framing = tx.framing();
    let mut runs: [Option<Run>; SEND_BATCH] = [None; SEND_BATCH];
    // The TCP flags of each run's first and last frame, as they came.
    let mut flags = [0u8; SEND_BATCH];
    if merge.contains(&true) {
        let mut view: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        for (v, f) in view.iter_mut().zip(frames.iter()) {
            *v = f;
        }
        let mut i = 0;
        while i < n {
            runs[i] = find_run(framing, &view[i..n], &deferred[i..n], SEND_BATCH)
                .filter(|r| merge[slot(r.kind)]);
            flags[i] = tcp_flags(framing, view[i]);
            let last = runs[i].map_or(i, |r| i + r.count - 1);
            flags[last] = tcp_flags(framing, view[last]);
            i = last + 1;
        }
        for i in 0..n {
            if let Some(run) = runs[i] {
                merge_headers(frames[i], &run, flags[i + run.count - 1]);
            }
        }
    }
    complete_alone(framing, frames, &runs[..n], deferred);
    // Per message, by its first frame: refused, and whether the answer means "this kind is
    // never segmented here".
    let mut refused: [Option<bool>; SEND_BATCH] = [None; SEND_BATCH];
    let mut out = Sent::default();
    {
        let mut parts: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        let mut messages: [Gathered; SEND_BATCH] = std::array::from_fn(|_| Gathered {
            parts: 0..0,
            gso: None,
        });
        let mut first_of = [0usize; SEND_BATCH];
        let (mut i, mut m) = (0, 0);
        while i < n {
            let count = runs[i].map_or(1, |r| r.count);
            for k in 0..count {
                let frame: &[u8] = frames[i + k];
                parts[i + k] = match runs[i] {
                    Some(r) if k > 0 => &frame[r.headers..],
                    _ => frame,
                };
            }
            messages[m] = Gathered {
                parts: i..i + count,
                gso: runs[i].map(|r| Gso {
                    kind: match r.kind {
                        GsoKind::Tcp if r.ip_header > IPV4_MIN_HEADER => {
                            cyphonic_netio::GsoKind::TcpV6
                        }
                        GsoKind::Tcp => cyphonic_netio::GsoKind::TcpV4,
                        GsoKind::Udp => cyphonic_netio::GsoKind::UdpL4,
                    },
                    headers: u16::try_from(r.headers).unwrap_or(u16::MAX),
                    l4_start: u16::try_from(framing.header_len() + r.ip_header).unwrap_or(u16::MAX),
                    segment_size: r.segment_size,
                }),
            };
            first_of[m] = i;
            i += count;
            m += 1;
        }
        tx.send_gathered(&parts[..n], &messages[..m], |msg, e| {
            refused[first_of[msg]] = Some(segmentation_unsupported(&e));
            out.error = Some(e);
        });
    }
    let mut i = 0;
    while i < n {
        let count = runs[i].map_or(1, |r| r.count);
        match (refused[i], runs[i]) {
            (None, run) => {
                out.sent += count as u64;
                if run.is_some() {
                    out.merged += 1;
                    out.merged_segments += count as u64;
                }
            }
            (Some(_), None) => out.failed += 1,
            (Some(unsupported), Some(run)) => {
                if unsupported && merge[slot(run.kind)] {
                    tracing::warn!(error = ?out.error, interface = tx.name(), kind = ?run.kind, "the interface refused a frame to segment: sending these packets alone from now on");
                    merge[slot(run.kind)] = false;
                }
                restore_headers(framing, frames[i], run.kind, flags[i]);
                for k in 1..count {
                    if deferred[i + k] {
                        let link = framing.header_len();
                        complete_deferred_checksum(&mut frames[i + k][link..]);
                    }
                }
                let mut alone: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
                for (a, f) in alone.iter_mut().zip(&frames[i..i + count]) {
                    *a = f;
                }
                let (ok, bad, e) = tx.send_batch(&alone[..count]);
                out.sent += ok as u64;
                out.failed += bad as u64;
                if e.is_some() {
                    out.error = e;
                }
            }
        }
        i += count;
    }
    out
}

/// Computes the deferred checksums of the frames that go alone (no run starts at them, and
/// none covers them): nobody after us would.
fn complete_alone(
    framing: Framing,
    frames: &mut [&mut [u8]],
    runs: &[Option<Run>],
    deferred: &[bool],
) {
    let mut i = 0;
    while i < runs.len() {
        match runs[i] {
            Some(run) => i += run.count,
            None => {
                if deferred[i] {
                    complete_deferred_checksum(&mut frames[i][framing.header_len()..]);
                }
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// A LAN interface that refuses merged frames of one kind with one error, and records
    /// what it took.
    struct Refusing {
        framing: Framing,
        kind: cyphonic_netio::GsoKind,
        errno: i32,
        /// What was taken: (merged frame's bytes or a lone frame, segments in it).
        taken: RefCell<Vec<(Vec<u8>, usize)>>,
    }

    impl Refusing {
        fn new(kind: cyphonic_netio::GsoKind, errno: i32) -> Self {
            Self {
                framing: Framing::Ethernet,
                kind,
                errno,
                taken: RefCell::new(Vec::new()),
            }
        }
    }

    impl FrameTx for Refusing {
        fn framing(&self) -> Framing {
            self.framing
        }
        fn send_gathered(
            &self,
            parts: &[&[u8]],
            messages: &[Gathered],
            mut refused: impl FnMut(usize, io::Error),
        ) -> usize {
            let mut sent = 0;
            for (m, msg) in messages.iter().enumerate() {
                if msg.gso.is_some_and(|g| g.kind == self.kind) {
                    refused(m, io::Error::from_raw_os_error(self.errno));
                    continue;
                }
                let bytes = parts[msg.parts.clone()].concat();
                self.taken.borrow_mut().push((bytes, msg.parts.len()));
                sent += 1;
            }
            sent
        }
        fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
            for f in frames {
                self.taken.borrow_mut().push((f.to_vec(), 1));
            }
            (frames.len(), 0, None)
        }
        fn name(&self) -> &str {
            "test0"
        }
    }

    /// An Ethernet frame of one IPv4 packet (TCP with ACK, or UDP) from 100.64.2.10:5000 to
    /// 100.64.1.10:6000 with `payload`, every checksum right (`restore_headers` fills them).
    fn frame(kind: GsoKind, seq: u32, payload: &[u8]) -> Vec<u8> {
        let l4 = if kind == GsoKind::Tcp { 20 } else { 8 };
        let mut f = vec![0u8; 14 + 20 + l4];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&[8, 0]);
        let proto = if kind == GsoKind::Tcp { 6 } else { 17 };
        f[14..34].copy_from_slice(&[
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 63, proto, 0, 0, 100, 64, 2, 10, 100, 64, 1, 10,
        ]);
        f[34..38].copy_from_slice(&[0x13, 0x88, 0x17, 0x70]);
        if kind == GsoKind::Tcp {
            f[38..42].copy_from_slice(&seq.to_be_bytes());
            f[46] = 5 << 4;
            f[47] = 0x10;
            f[48..50].copy_from_slice(&512u16.to_be_bytes());
        }
        f.extend_from_slice(payload);
        let flags = tcp_flags(Framing::Ethernet, &f);
        restore_headers(Framing::Ethernet, &mut f, kind, flags);
        f
    }

    /// Six frames: three TCP segments of one flow, then three UDP datagrams of one flow.
    fn batch() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0..3u8)
            .map(|i| frame(GsoKind::Tcp, 1000 + 100 * u32::from(i), &[i; 100]))
            .collect();
        v.extend((0..3u8).map(|i| frame(GsoKind::Udp, 0, &[i; 80])));
        v
    }

    fn send(tx: &Refusing, merge: &mut [bool; 2]) -> (Sent, Vec<Vec<u8>>) {
        let mut frames = batch();
        let mut refs: Vec<&mut [u8]> = frames.iter_mut().map(Vec::as_mut_slice).collect();
        let out = send_frames(tx, &mut refs, &[false; SEND_BATCH], merge);
        (out, frames)
    }

    /// The batch as a sender that deferred its transport checksums leaves it: every field
    /// holding something else.
    fn deferred_batch() -> Vec<Vec<u8>> {
        let mut frames = batch();
        for f in &mut frames {
            let at = if f[14 + 9] == 6 {
                14 + 20 + 16
            } else {
                14 + 20 + 6
            };
            f[at..at + 2].copy_from_slice(&[0xde, 0xad]);
        }
        frames
    }

    #[test]
    fn deferred_checksums_are_merged_unchecked_and_computed_for_frames_sent_alone() {
        let tx = Refusing::new(cyphonic_netio::GsoKind::UdpL4, libc::EINVAL);
        let mut merge = [true, true];
        for round in 0..2 {
            let mut frames = deferred_batch();
            let mut refs: Vec<&mut [u8]> = frames.iter_mut().map(Vec::as_mut_slice).collect();
            let out = send_frames(&tx, &mut refs, &[true; SEND_BATCH], &mut merge);
            assert_eq!(
                (out.sent, out.failed, out.merged, out.merged_segments),
                (6, 0, 1, 3),
                "round {round}"
            );
            let taken = tx.taken.take();
            assert_eq!(taken.len(), 4, "round {round}");
            assert_eq!(
                taken[0].1, 3,
                "the TCP run, merged though its checksums were not"
            );
            // The UDP datagrams went alone (refused merged, then not merged at all), each
            // with its checksum computed: exactly the frames a non-deferring sender sends.
            let alone: Vec<(Vec<u8>, usize)> =
                batch()[3..].iter().map(|f| (f.clone(), 1)).collect();
            assert_eq!(taken[1..], alone[..], "round {round}");
        }
        // Without merging, every frame goes alone and right.
        let mut frames = deferred_batch();
        let mut refs: Vec<&mut [u8]> = frames.iter_mut().map(Vec::as_mut_slice).collect();
        let out = send_frames(&tx, &mut refs, &[true; SEND_BATCH], &mut [false, false]);
        assert_eq!((out.sent, out.merged), (6, 0));
        let alone: Vec<(Vec<u8>, usize)> = batch().into_iter().map(|f| (f, 1)).collect();
        assert_eq!(tx.taken.take(), alone);
        // Not deferred, the same spoiled frames are sent as they are, unmerged.
        let mut frames = deferred_batch();
        let mut refs: Vec<&mut [u8]> = frames.iter_mut().map(Vec::as_mut_slice).collect();
        let out = send_frames(&tx, &mut refs, &[false; SEND_BATCH], &mut [true, false]);
        assert_eq!((out.sent, out.merged), (6, 0));
        assert_eq!(frames, deferred_batch());
    }

    #[test]
    fn a_kind_the_interface_cannot_segment_goes_alone_from_then_on() {
        let tx = Refusing::new(cyphonic_netio::GsoKind::UdpL4, libc::EINVAL);
        let mut merge = [true, true];
        let (out, after) = send(&tx, &mut merge);
        assert_eq!(merge, [true, false], "only UDP merging stops");
        assert_eq!(
            (out.sent, out.failed, out.merged, out.merged_segments),
            (6, 0, 1, 3)
        );
        let taken = tx.taken.take();
        let original = batch();
        // The TCP run went merged; the refused UDP run went frame by frame, each exactly as
        // it came (its first frame's headers given back).
        assert_eq!(taken.len(), 4, "{taken:?}");
        assert_eq!(taken[0].1, 3);
        let alone: Vec<(Vec<u8>, usize)> = original[3..].iter().map(|f| (f.clone(), 1)).collect();
        assert_eq!(taken[1..], alone[..]);
        assert_eq!(after[3..], original[3..]);

        // The next batch: UDP is not even tried merged, TCP still is.
        let (out, _) = send(&tx, &mut merge);
        assert_eq!((out.sent, out.failed, out.merged), (6, 0, 1));
        assert!(out.error.is_none(), "nothing was refused: {:?}", out.error);
    }

    #[test]
    fn a_passing_refusal_sends_the_run_alone_but_leaves_merging_on() {
        let tx = Refusing::new(cyphonic_netio::GsoKind::TcpV4, libc::ENOBUFS);
        let mut merge = [true, true];
        let (out, after) = send(&tx, &mut merge);
        assert_eq!(merge, [true, true]);
        assert_eq!((out.sent, out.failed, out.merged), (6, 0, 1));
        assert_eq!(
            after[..3],
            batch()[..3],
            "the refused TCP run's first frame is whole again"
        );
    }

    /// Bare IP packets (the node's TUN device) are merged and sent exactly like the same
    /// packets in Ethernet frames: the same messages without the Ethernet headers, offload
    /// notes counted from the IP header.
    #[test]
    fn bare_packets_go_as_their_frames_would() {
        let framed = Refusing::new(cyphonic_netio::GsoKind::UdpL4, libc::EINVAL);
        let (out, _) = send(&framed, &mut [true, true]);
        let mut bare = Refusing::new(cyphonic_netio::GsoKind::UdpL4, libc::EINVAL);
        bare.framing = Framing::Ip;
        let mut packets: Vec<Vec<u8>> = batch().into_iter().map(|f| f[14..].to_vec()).collect();
        let mut refs: Vec<&mut [u8]> = packets.iter_mut().map(Vec::as_mut_slice).collect();
        let mut merge = [true, true];
        let bare_out = send_frames(&bare, &mut refs, &[false; SEND_BATCH], &mut merge);
        assert_eq!(merge, [true, false]);
        assert_eq!(
            (bare_out.sent, bare_out.merged, bare_out.merged_segments),
            (out.sent, out.merged, out.merged_segments)
        );
        let (framed, bare) = (framed.taken.take(), bare.taken.take());
        assert_eq!(framed.len(), bare.len());
        for ((f, fn_), (b, bn)) in framed.iter().zip(&bare) {
            assert_eq!((&f[14..], fn_), (&b[..], bn));
        }
        // The TCP run's note, as the device gets it.
        let mut packets: Vec<Vec<u8>> = batch().into_iter().map(|f| f[14..].to_vec()).collect();
        let gso = bare_gso(&mut packets);
        assert_eq!((gso.headers, gso.l4_start), (40, 20));
    }

    /// The offload note of the first merged message of `packets`, sent bare.
    fn bare_gso(packets: &mut [Vec<u8>]) -> Gso {
        struct Note(std::cell::Cell<Option<Gso>>);
        impl FrameTx for Note {
            fn framing(&self) -> Framing {
                Framing::Ip
            }
            fn send_gathered(
                &self,
                _: &[&[u8]],
                messages: &[Gathered],
                _: impl FnMut(usize, io::Error),
            ) -> usize {
                if self.0.get().is_none() {
                    self.0.set(messages.iter().find_map(|m| m.gso));
                }
                messages.len()
            }
            fn send_batch(&self, frames: &[&[u8]]) -> (usize, usize, Option<io::Error>) {
                (frames.len(), 0, None)
            }
            fn name(&self) -> &str {
                "tun0"
            }
        }
        let note = Note(std::cell::Cell::new(None));
        let mut refs: Vec<&mut [u8]> = packets.iter_mut().map(Vec::as_mut_slice).collect();
        send_frames(&note, &mut refs, &[false; SEND_BATCH], &mut [true, true]);
        note.0.get().expect("a merged message")
    }
}
