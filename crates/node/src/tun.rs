//! The node's data path: the TUN device. Packets the host routes into the overlay are read
//! from it (one read per packet, straight behind the tunnel header's room in a pool buffer)
//! and submitted; decrypted packets for us are written into it.
//!
//! With offloads (`dataplane.tun_offload`), a read may bring a TCP or UDP super-packet of up
//! to 64 KiB: it lands in the buffer and a [`LargeFrames`] area behind it and is cut into the
//! tunnel's packets by the gateway's [`Segmenter`], as the adapter cuts coalesced frames.
//! Checksums the host left partial, and those of the segments, go through the tunnel deferred
//! (docs/protocol.md §1). The other way, runs of one flow go into the device as one
//! super-packet (the shared `cyphonic-offload`, as the adapter sends to its LAN), with their
//! checksums left to the host's stack.
//!
//! ```text
//! cy-tun     TUN read (a super-packet: cut) -> checks (IPv4 or IPv6, from our vIP, to the overlay)
//!            -> tunnel::Intake
//! cy-ingress-emit  TunSink (after the engine's Incoming::accept): cryptokey routing (the inner source must lie in
//!                  the sending peer's certified blocks), to us -> TUN write
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cyphonic_gateway::{GsoKind, Segmenter, complete_deferred_checksum, finish_partial_checksum};
use cyphonic_netio::{BusyPoll, Coalesced, LargeFrames, Tun, TunPacket};
use cyphonic_offload::{SEND_BATCH, send_frames};
use cyphonic_pipeline::{DropReason, Sink};
use cyphonic_tunnel::{
    Accepted, Buf, HEADROOM, Intake, PACKET_ROOM, RECV_BATCH, Shared, Submit, Submitter, bump,
};
use cyphonic_wire::FLAG_CHECKSUM_DEFERRED;

use crate::overlay::{NodeCounters, Ours, admit, outbound};

/// What the TUN thread and the TUN sink share.
#[derive(Debug)]
pub struct TunSide {
    /// The overlay interface.
    pub tun: Tun,
    /// Our addresses and the overlay's.
    pub ours: Ours,
    /// Send checksums the host left partial through the tunnel for the far end to complete
    /// (`dataplane.defer_checksums`, with offloads).
    pub defer_checksums: bool,
    /// The TUN side's counters.
    pub counters: NodeCounters,
}

/// How long a TUN read waits before the thread looks at its other work.
const READ_WAIT: Duration = Duration::from_millis(10);
/// The thread that reads the TUN device.
pub struct TunReader {
    side: Arc<TunSide>,
    shared: Arc<Shared>,
    intake: Intake,
    busy: Option<BusyPoll>,
    /// Where the rest of a super-packet lands (offloads only; one packet at a time).
    large: LargeFrames,
}

impl TunReader {
    /// A reader that hands what it reads to `intake`, polling the device for `busy_poll`
    /// after each packet (`[dataplane] busy_poll_us`; zero: it sleeps until one comes).
    pub fn new(
        side: Arc<TunSide>,
        shared: Arc<Shared>,
        intake: Intake,
        busy_poll: Duration,
    ) -> Self {
        // Without offloads nothing lands there; a single slot costs address space only.
        let large = LargeFrames::with_slots(PACKET_ROOM.len(), 1);
        Self {
            side,
            shared,
            intake,
            busy: BusyPoll::new(busy_poll, Some(READ_WAIT)),
            large,
        }
    }

    /// The thread's body: runs until the engine stops. Waits for a packet without holding
    /// the submitter, then takes the rest that are there (up to [`RECV_BATCH`] reads, and
    /// fewer once that many packets, a super-packet's segments counted, went in) under one
    /// lock, and sends them on their way.
    pub fn run(mut self) {
        let (side, shared) = (self.side.clone(), self.shared.clone());
        let (pool, counters) = (&shared.pool(), &shared.counters());
        while shared.is_running() {
            let Some(mut first) = pool.take() else {
                bump(&counters.drop_no_buffer);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let tun = &side.tun;
            let large = &mut self.large;
            let mut read = None;
            let got = cyphonic_netio::busy_receive(self.busy.as_mut(), |wait| {
                let room = &mut first[PACKET_ROOM];
                read = if wait {
                    tun.recv(room, large, READ_WAIT)
                } else {
                    tun.try_recv(room, large)
                }?;
                Ok(usize::from(read.is_some()))
            });
            let packet = match (got, read) {
                (Ok(_), Some(p)) => p,
                (Ok(_), None) => continue,
                (Err(e), _) => {
                    tracing::error!(error = %e, interface = tun.name(), "reading the TUN device failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let mut guard = self.intake.lock();
            let Some(sub) = guard.as_mut() else {
                break;
            };
            let now = Instant::now();
            let mut submitted = take(&side, &shared, large, first, packet, sub, now);
            // At most RECV_BATCH reads, and fewer once a super-packet's segments fill it.
            for _ in 1..RECV_BATCH {
                if submitted >= RECV_BATCH {
                    break;
                }
                let Some(mut buf) = pool.take() else {
                    bump(&counters.drop_no_buffer);
                    break;
                };
                match tun.try_recv(&mut buf[PACKET_ROOM], large) {
                    Ok(Some(p)) => submitted += take(&side, &shared, large, buf, p, sub, now),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(error = %e, interface = tun.name(), "reading the TUN device failed");
                        break;
                    }
                }
            }
            sub.flush();
        }
        tracing::debug!("TUN thread stopped");
    }
}

/// Checks one packet read into `buf` (the rest of a super-packet in `large`) and submits it,
/// or the segments cut from it; returns how many packets went to the pipeline.
fn take(
    side: &TunSide,
    shared: &Shared,
    large: &mut LargeFrames,
    mut buf: Buf,
    read: TunPacket,
    sub: &mut Submitter,
    now: Instant,
) -> usize {
    let c = &side.counters;
    bump(&c.tun_read);
    let room = PACKET_ROOM.len();
    if read.truncated || (read.coalesced.is_none() && read.len > room) {
        bump(&c.drop_tun_truncated);
        return 0;
    }
    if let Some(how) = read.coalesced {
        let head = &buf[HEADROOM..HEADROOM + read.len.min(room)];
        return match large.join(0, head, read.len) {
            Some(packet) => cut(side, shared, packet, how, sub, now),
            None => {
                bump(&c.drop_tun_truncated);
                0
            }
        };
    }
    let packet = &mut buf[HEADROOM..HEADROOM + read.len];
    let Some(dst) = outbound(packet, &side.ours, c) else {
        return 0;
    };
    let mut flags = 0;
    if let Some(sum) = read.checksum {
        let (start, offset) = (usize::from(sum.start), usize::from(sum.offset));
        match finish_partial_checksum(packet, start, offset, side.defer_checksums) {
            Some(true) => flags = FLAG_CHECKSUM_DEFERRED,
            Some(false) => {}
            None => {
                bump(&c.drop_tun_malformed);
                return 0;
            }
        }
    }
    sub.route(buf, read.len, dst, flags, (now, None));
    1
}

/// Cuts a super-packet from the host into the segments it stands for (the gateway's
/// segmenter, as the adapter cuts coalesced frames) and submits each; returns how many.
fn cut(
    side: &TunSide,
    shared: &Shared,
    packet: &[u8],
    how: Coalesced,
    sub: &mut Submitter,
    now: Instant,
) -> usize {
    let c = &side.counters;
    // Every segment has the super-packet's addresses: one check for all.
    let Some(dst) = outbound(packet, &side.ours, c) else {
        return 0;
    };
    let kind = match how.kind {
        cyphonic_netio::GsoKind::TcpV4 | cyphonic_netio::GsoKind::TcpV6 => GsoKind::Tcp,
        cyphonic_netio::GsoKind::UdpL4 => GsoKind::Udp,
        cyphonic_netio::GsoKind::Other(_) => {
            bump(&c.drop_tun_coalesced);
            return 0;
        }
    };
    // Deferral is IPv4's only (docs/protocol.md §1): IPv6 segments get their checksums here.
    let defer = side.defer_checksums && packet.first().is_some_and(|b| b >> 4 == 4);
    let mut segments = match Segmenter::ip(packet, kind, how.segment_size, PACKET_ROOM.len()) {
        Ok(s) => s.with_partial_checksums(defer),
        Err(_) => {
            bump(&c.drop_tun_coalesced);
            return 0;
        }
    };
    bump(&c.tun_coalesced);
    let flags = if defer { FLAG_CHECKSUM_DEFERRED } else { 0 };
    let mut submitted = 0;
    loop {
        let Some(mut seg) = shared.pool().take() else {
            bump(&shared.counters().drop_no_buffer);
            break;
        };
        let Some(len) = segments.next_into(&mut seg[PACKET_ROOM]) else {
            break;
        };
        bump(&c.tun_segments);
        sub.route(seg, len, dst, flags, (now, None));
        submitted += 1;
    }
    submitted
}

/// The ingress emitter's end: packets for us go into the TUN device, in arrival order. With
/// offloads they are held until the pipeline has no more ready (or [`SEND_BATCH`] wait), and
/// runs of one flow go in as one super-packet ([`send_frames`]), as the adapter sends to its
/// LAN.
pub struct TunSink {
    side: Arc<TunSide>,
    batch: Vec<Accepted>,
    /// Per packet of `batch`: its transport checksum came deferred.
    deferred: [bool; SEND_BATCH],
    /// Merge runs of TCP segments and of UDP datagrams ([TCP, UDP]): as the device's
    /// offloads allow, each switched off for good if the device refuses that kind.
    merge: [bool; 2],
}

impl TunSink {
    /// The sink writing into `side`'s device.
    pub fn new(side: Arc<TunSide>) -> Self {
        let merge = side.tun.offloads().map_or([false; 2], |o| [o.tcp, o.udp]);
        Self {
            side,
            batch: Vec::with_capacity(SEND_BATCH),
            deferred: [false; SEND_BATCH],
            merge,
        }
    }
}

impl Sink for TunSink {
    type Item = Accepted;

    fn emit(&mut self, mut item: Accepted) -> Result<(), DropReason> {
        let c = &self.side.counters;
        admit(&item, &self.side.ours, c)?;
        let packet = item.packet();
        let deferred = item.flags() & FLAG_CHECKSUM_DEFERRED != 0;
        if self.side.tun.offloads().is_some() {
            item.frame = packet;
            // In range: the batch is flushed (emptied) as soon as it fills.
            self.deferred[self.batch.len()] = deferred;
            self.batch.push(item);
            if self.batch.len() >= SEND_BATCH {
                self.flush();
            }
            return Ok(());
        }
        if deferred {
            // The far end left the checksum to us (docs/protocol.md §1); without offloads
            // the TUN device takes whole packets only.
            complete_deferred_checksum(&mut item.buf_mut()[packet.clone()]);
        }
        match self.side.tun.send(&item.buf()[packet], None) {
            Ok(_) => {
                bump(&c.tun_written);
                Ok(())
            }
            Err(e) => {
                bump(&c.tun_write_failed);
                tracing::debug!(error = %e, "the TUN device refused a packet");
                Err(DropReason::Unroutable)
            }
        }
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut frames: [&mut [u8]; SEND_BATCH] = std::array::from_fn(|_| <&mut [u8]>::default());
        let n = self.batch.len().min(SEND_BATCH);
        for (slot, item) in frames.iter_mut().zip(self.batch.iter_mut()) {
            let range = item.frame.clone();
            *slot = &mut item.buf_mut()[range];
        }
        let out = send_frames(
            &self.side.tun,
            &mut frames[..n],
            &self.deferred,
            &mut self.merge,
        );
        let c = &self.side.counters;
        c.tun_written.fetch_add(out.sent, Ordering::Relaxed);
        c.tun_merged.fetch_add(out.merged, Ordering::Relaxed);
        c.tun_merged_segments
            .fetch_add(out.merged_segments, Ordering::Relaxed);
        if out.failed > 0 {
            c.tun_write_failed.fetch_add(out.failed, Ordering::Relaxed);
            tracing::debug!(failed = out.failed, error = ?out.error, "the TUN device refused packets");
        }
        // Their buffers go back to the pool.
        self.batch.clear();
    }
}
