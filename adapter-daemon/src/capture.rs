//! LAN to overlay: the capture thread (`cy-capture`). What it routes into the tunnel goes
//! through the engine (`cyphonic_tunnel::Intake`, its seal stage and socket sink).
//!
//! ```text
//! capture thread: recvmmsg on AF_PACKET -> Lan::handle_frame -> route to a peer -> Intake
//!   (replies to ARP/ICMP go straight back out; DHCP and DNS go to the control thread)
//! ```
//!
//! With `dataplane.lan_gro`, the socket hands over frames the NIC's GRO merged, up to 64 KiB
//! each, with the kernel's note of how they were merged; a [`Segmenter`] cuts each back into
//! wire-sized segments, in order, and every segment then takes the path of a frame that came
//! alone.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cyphonic_gateway::{
    Egress, EgressDrop, Fragmenter, GsoKind, ReplyKind, SegmentError, Segmenter,
};
use cyphonic_netio::{Coalesced, FrameMeta, LargeFrames, PacketSocket};
use cyphonic_tunnel::{
    BUF_LEN, Buf, FRAME_OFFSET, FRAME_ROOM, HEADROOM, Intake, Outgoing, PACKET_ROOM, RECV_BATCH,
    RecvBuffers, Shared, SparseSubmitter, Submit,
};
use cyphonic_wire::FLAG_CHECKSUM_DEFERRED;

use crate::counters::bump;
use crate::lan::{Client, LanSide, ToServices};
use crate::meter::{Tally, Way};
use crate::port_guard::PortGuard;

/// How often the capture thread reads the kernel's count of frames it dropped.
const DROPS_EVERY: Duration = Duration::from_secs(1);

/// What the capture thread answers on the LAN with: a buffer for the reply (the rate of the
/// ICMP errors among them is the LAN side's, [`LanSide::icmp_errors`]).
struct Replies {
    buf: [u8; BUF_LEN],
}

/// How long the capture thread waits for a frame before it looks at its other work.
const RECV_WAIT: Duration = Duration::from_millis(10);

/// What one receive on a capture socket gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    Frames,
    Nothing,
    /// The engine stopped.
    Stop,
}

/// The capture thread's receive state, shared by its sockets.
struct Reading {
    buffers: RecvBuffers,
    meta: [FrameMeta; RECV_BATCH],
    large: Option<LargeFrames>,
    /// Waits in the kernel, counted per frame and added to the pipeline's once per batch.
    queued: cyphonic_pipeline::WaitTally,
}

/// The capture thread: runs until the engine stops.
pub struct Capture {
    lan: Arc<LanSide>,
    shared: Arc<Shared>,
    /// The capture sockets: one, or a fanout group sharing the port's frames by flow. The
    /// first also sends the thread's replies.
    socks: Vec<PacketSocket>,
    intake: Intake,
    /// The LAN port's guard: held by the main capture thread (the sparse one has none).
    guard: Option<PortGuard>,
    /// Whether the guard's failure was said already (said once, not every second).
    guard_failed: bool,
    /// The run of packets of one device this thread carried, not yet on its meter.
    tally: Tally,
}

impl Capture {
    /// The thread reading `socks` (at least one) into `intake`, holding `guard` on the LAN
    /// port (the main capture thread), or none (the sparse capture thread).
    pub const fn new(
        lan: Arc<LanSide>,
        shared: Arc<Shared>,
        socks: Vec<PacketSocket>,
        intake: Intake,
        guard: Option<PortGuard>,
    ) -> Self {
        Self {
            lan,
            shared,
            socks,
            intake,
            guard,
            guard_failed: false,
            tally: Tally::new(),
        }
    }

    /// The thread's body. Receives a batch without holding the submitter, then handles it
    /// under one lock and sends it on its way. With several capture sockets (a fanout group,
    /// `dataplane.lan_queues`), takes a batch from each in turn without waiting, and waits
    /// for any once all were empty: a light flow's frames wait for at most a batch of each
    /// other socket, not for a heavy flow's whole queue.
    pub fn run(self) {
        self.run_into(None);
    }

    /// The sparse capture thread's body: reads its one socket (the sparse class,
    /// `steer::lan_filter`) no faster than the sparse lane's pace, and sends what it routes
    /// into the tunnel through `sparse`, sealed and sent on this thread.
    pub fn run_sparse(self, sparse: SparseSubmitter) {
        self.run_into(Some(sparse));
    }

    fn run_into(mut self, mut sparse: Option<SparseSubmitter>) {
        let shared = self.shared.clone();
        let mut replies = Replies {
            buf: [0u8; BUF_LEN],
        };
        let mut rx = Reading {
            buffers: RecvBuffers::new(FRAME_OFFSET..FRAME_OFFSET + FRAME_ROOM),
            meta: [FrameMeta::default(); RECV_BATCH],
            // A socket with offload headers may hand over coalesced frames (GRO, or a local
            // sender's TSO): they need room beyond the packet buffers.
            large: self.socks[0]
                .coalesced()
                .then(|| LargeFrames::new(FRAME_ROOM)),
            queued: cyphonic_pipeline::WaitTally::default(),
        };
        let mut drops_read = Instant::now();
        let queues = self.socks.len();
        let mut busy = false;
        let pulse = shared.pulses().register_here();
        while shared.is_running() {
            pulse.beat(Instant::now());
            if drops_read.elapsed() >= DROPS_EVERY {
                drops_read = Instant::now();
                self.read_drops(sparse.is_some());
                self.hold_guard();
            }
            if queues == 1 {
                if self.take_batch(0, true, &mut rx, &mut replies, sparse.as_mut()) == Batch::Stop {
                    break;
                }
                continue;
            }
            // Which sockets have frames: asked without waiting after a round that found
            // some, else waiting for the first.
            let within = if busy { Duration::ZERO } else { RECV_WAIT };
            let ready = cyphonic_netio::wait_any(&self.socks, within).unwrap_or(0);
            busy = false;
            for i in (0..queues).filter(|i| ready & 1 << i != 0) {
                match self.take_batch(i, false, &mut rx, &mut replies, None) {
                    Batch::Stop => {
                        tracing::debug!("capture thread stopped");
                        return;
                    }
                    Batch::Frames => busy = true,
                    Batch::Nothing => {}
                }
            }
        }
        tracing::debug!("capture thread stopped");
    }

    /// Receives one batch from capture socket `i` (waiting up to its timeout, or not) and
    /// handles it: into the intake, or with `sparse` through the sparse lane (reading no more
    /// than its pace allows).
    fn take_batch(
        &mut self,
        i: usize,
        wait: bool,
        rx: &mut Reading,
        replies: &mut Replies,
        mut sparse: Option<&mut SparseSubmitter>,
    ) -> Batch {
        let shared = &*self.shared;
        let pool = &shared.pool();
        let want = sparse
            .as_mut()
            .map_or(RECV_BATCH, |s| s.allowance(RECV_BATCH));
        let sock = &mut self.socks[i];
        let (meta, large) = (&mut rx.meta, &mut rx.large);
        let Some(received) = rx.buffers.receive(pool, |slices| {
            let n = slices.len().min(want);
            let (slices, meta) = (&mut slices[..n], &mut meta[..n]);
            if wait {
                match large.as_mut() {
                    Some(large) => sock.recv_batch_large(slices, meta, large),
                    None => sock.recv_batch(slices, meta),
                }
            } else {
                sock.try_recv_batch(slices, meta, large.as_mut())
            }
        }) else {
            bump(&shared.counters().drop_no_buffer);
            std::thread::sleep(Duration::from_millis(1));
            return Batch::Nothing;
        };
        let frames = match received {
            Ok(frames) => frames,
            Err(e) if e.kind() == std::io::ErrorKind::NetworkDown => {
                // Said once per time it goes down (by the main capture thread; the sparse one
                // sees it too); capture resumes when it comes back up.
                if sparse.is_none() {
                    tracing::warn!(
                        interface = self.socks[i].name(),
                        "the LAN interface went down"
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
                return Batch::Nothing;
            }
            Err(e) => {
                tracing::error!(error = %e, interface = self.socks[i].name(), "receiving from the LAN interface failed");
                std::thread::sleep(Duration::from_millis(100));
                return Batch::Nothing;
            }
        };
        if frames.len() == 0 {
            return Batch::Nothing;
        }
        let now = Instant::now();
        // A box of a pair that has not confirmed lately that it serves forwards nothing of
        // what came meanwhile (docs/protocol.md §5, *The mandate*).
        if !self.lan.serving(now, frames.len()) {
            return Batch::Frames;
        }
        let take_all = |sub: &mut dyn Submit| {
            for (slot, (buf, m)) in frames.zip(rx.meta).enumerate() {
                self.take_frame(
                    buf,
                    slot,
                    m,
                    now,
                    (&mut rx.queued, &mut rx.large),
                    replies,
                    sub,
                );
            }
            sub.flush();
            sub.counters().record_socket(&mut rx.queued);
        };
        if let Some(sub) = sparse {
            take_all(sub);
            self.tally.flush(&self.lan.meter, Way::FromDevice);
            return Batch::Frames;
        }
        let mut guard = self.intake.lock();
        let Some(sub) = guard.as_mut() else {
            return Batch::Stop;
        };
        take_all(sub);
        drop(guard);
        self.tally.flush(&self.lan.meter, Way::FromDevice);
        Batch::Frames
    }

    /// One frame of a batch (in `slot`): counted, cut if coalesced, handled.
    #[expect(
        clippy::too_many_arguments,
        reason = "handle's arguments and the frame's origin"
    )]
    fn take_frame(
        &self,
        buf: Buf,
        slot: usize,
        m: FrameMeta,
        now: Instant,
        (queued, large): (&mut cyphonic_pipeline::WaitTally, &mut Option<LargeFrames>),
        replies: &mut Replies,
        sub: &mut dyn Submit,
    ) {
        if let Some(d) = m.queued {
            queued.add(d);
        }
        match (m.coalesced, large.as_mut()) {
            (Some(how), Some(large)) if !m.outgoing => {
                self.cut(&buf, slot, m, how, large, now, replies, sub);
            }
            _ => self.handle(buf, m, now, replies, sub),
        }
    }

    /// Puts the LAN port's guard back (settings, filter, no address) if something changed it.
    fn hold_guard(&mut self) {
        let Some(guard) = self.guard.as_mut() else {
            return;
        };
        match guard.enforce() {
            Ok(restored) if restored.is_empty() => {}
            Ok(restored) => {
                self.lan
                    .counters
                    .forwarding_guard_restored
                    .fetch_add(restored.len() as u64, Ordering::Relaxed);
                tracing::warn!(
                    changed = ?restored,
                    "something on this host changed the LAN port (a setting, the ingress drop filter or an address); put back"
                );
            }
            Err(e) if !self.guard_failed => {
                self.guard_failed = true;
                tracing::warn!(error = %e, "cannot hold the LAN port closed to this host's kernel");
            }
            Err(_) => {}
        }
    }

    /// Adds what the kernel dropped for the capture sockets since the last look to
    /// `drop_capture_overflow` (`drop_sparse_overflow` for the sparse capture socket).
    fn read_drops(&self, sparse: bool) {
        let c = &self.lan.counters;
        let counter = if sparse {
            &c.drop_sparse_overflow
        } else {
            &c.drop_capture_overflow
        };
        for sock in &self.socks {
            match sock.take_drops() {
                Ok(0) => {}
                Ok(n) => {
                    counter.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => tracing::debug!(error = %e, "reading the capture socket's drops failed"),
            }
        }
    }

    /// Cuts the coalesced frame in `slot` into its segments and handles each as a frame of its
    /// own, in order.
    #[expect(
        clippy::too_many_arguments,
        reason = "handle's arguments and the frame's origin"
    )]
    fn cut(
        &self,
        buf: &Buf,
        slot: usize,
        meta: FrameMeta,
        how: Coalesced,
        large: &mut LargeFrames,
        now: Instant,
        replies: &mut Replies,
        sub: &mut dyn Submit,
    ) {
        let (lan, shared) = (&*self.lan, &*self.shared);
        let c = &lan.counters;
        let pool = &shared.pool();
        // Leave the segments' checksums to the far end (Lan::handle_frame completes them
        // where it cannot).
        let defer = lan.lan.defer_checksums;
        let head = &buf[FRAME_OFFSET..FRAME_OFFSET + meta.len.min(FRAME_ROOM)];
        let kind = match how.kind {
            cyphonic_netio::GsoKind::TcpV4 | cyphonic_netio::GsoKind::TcpV6 => Some(GsoKind::Tcp),
            cyphonic_netio::GsoKind::UdpL4 => Some(GsoKind::Udp),
            cyphonic_netio::GsoKind::Other(_) => None,
        };
        let frame = if meta.truncated {
            bump(&c.captured_truncated);
            None
        } else {
            large.join(slot, head, meta.len)
        };
        let segmenter = match (frame, kind) {
            (None, _) => Err(SegmentError::Malformed),
            (Some(_), None) => Err(SegmentError::Malformed),
            (Some(frame), Some(kind)) => Segmenter::new(frame, kind, how.segment_size, FRAME_ROOM)
                .map(|s| s.with_partial_checksums(defer)),
        };
        match segmenter {
            Ok(mut segments) => {
                bump(&c.coalesced);
                loop {
                    let Some(mut seg) = pool.take() else {
                        bump(&shared.counters().drop_no_buffer);
                        break;
                    };
                    let Some(len) =
                        segments.next_into(&mut seg[FRAME_OFFSET..FRAME_OFFSET + FRAME_ROOM])
                    else {
                        break;
                    };
                    bump(&c.segments);
                    let one = FrameMeta {
                        len,
                        truncated: false,
                        // Whole checksums, or partial ones for the tunnel's far end.
                        checksum_partial: defer,
                        coalesced: None,
                        ..meta
                    };
                    self.handle(seg, one, now, replies, sub);
                }
            }
            Err(SegmentError::NotIpv4) => {
                bump(&c.captured);
                bump(&c.drop_not_ipv4);
            }
            Err(_) => bump(&c.drop_coalesced),
        }
    }

    /// A packet of `len` bytes from the device `mac` goes towards the tunnel.
    fn carried(&self, mac: Option<[u8; 6]>, len: usize) {
        if let Some(mac) = mac {
            self.tally.count(&self.lan.meter, Way::FromDevice, mac, len);
        }
    }

    fn handle(
        &self,
        mut buf: Buf,
        meta: FrameMeta,
        now: Instant,
        replies: &mut Replies,
        sub: &mut dyn Submit,
    ) {
        let (lan, shared) = (&*self.lan, &*self.shared);
        let c = &lan.counters;
        let pool = &shared.pool();
        if meta.outgoing {
            return;
        }
        bump(&c.captured);
        if meta.truncated {
            bump(&c.captured_truncated);
        }
        let held = meta.len.min(FRAME_ROOM);
        let frame = &mut buf[FRAME_OFFSET..FRAME_OFFSET + held];
        // An HA pair's messages are the pair's own socket's (ha/mod.rs), not a device's.
        if frame.get(12..14) == Some(&cyphonic_ha::msg::ETHERTYPE.to_be_bytes()[..]) {
            return;
        }
        // A trunked port: the frame's segment is its VLAN's; a tag no segment has is dropped.
        let Some(seg) = lan.segment(meta.vlan) else {
            bump(&c.drop_vlan);
            return;
        };
        // The sender's MAC, read before the frame is worked on.
        let device: Option<[u8; 6]> = frame.get(6..12).and_then(|m| m.try_into().ok());
        let verdict = seg.lan.handle_frame(
            frame,
            meta.len,
            meta.checksum_partial,
            &lan.neighbors(seg.tag),
            &mut replies.buf,
        );
        // Nothing is routed between segments: a VLAN's device sending to another segment's
        // address (which its own segment's view takes for an overlay address) is dropped.
        let other_segment =
            |dst: std::net::Ipv4Addr| seg.tag.is_some() && lan.lan.block.contains(&dst);
        match verdict {
            Egress::Reply { len, kind } => {
                let counter = match kind {
                    ReplyKind::Arp => &c.arp_replies,
                    ReplyKind::ArpAnnounce => &c.arp_gateway_claims,
                    ReplyKind::EchoReply => &c.echo_replies,
                    ReplyKind::FragNeeded => &c.icmp_frag_needed,
                    ReplyKind::TimeExceeded => &c.icmp_time_exceeded,
                    ReplyKind::PacketTooBig => &c.icmp6_packet_too_big,
                    ReplyKind::RouterAdvert => &c.router_adverts,
                    ReplyKind::NeighbourAdvert => &c.neighbour_adverts,
                    ReplyKind::NeighbourClaim => &c.neighbour_gateway_claims,
                };
                let is_error = matches!(
                    kind,
                    ReplyKind::FragNeeded | ReplyKind::TimeExceeded | ReplyKind::PacketTooBig
                );
                let announces = matches!(kind, ReplyKind::ArpAnnounce | ReplyKind::NeighbourClaim);
                if is_error && !lan.icmp_error_admitted(now) {
                    // Over the rate: counted as limited.
                } else if announces && !lan.announcements.admit((), now) {
                    bump(&c.arp_announce_limited);
                } else if kind == ReplyKind::RouterAdvert
                    && !lan.solicited_adverts.admit(seg.tag, now)
                {
                    // Answered already within the interval, to every node.
                } else if lan.send(&self.socks[0], &mut replies.buf, 0..len, seg.tag) {
                    bump(counter);
                }
            }
            Egress::Forward { dst, .. } | Egress::Fragment { dst, .. } if other_segment(dst) => {
                bump(&c.drop_local_destination);
            }
            Egress::Forward {
                packet,
                dst,
                checksum_deferred,
            } => {
                debug_assert_eq!(
                    FRAME_OFFSET + packet.start,
                    HEADROOM,
                    "IP packet sits behind the tunnel header's room"
                );
                let flags = if checksum_deferred {
                    bump(&c.checksum_deferred_sent);
                    FLAG_CHECKSUM_DEFERRED
                } else {
                    0
                };
                self.carried(device, packet.len());
                sub.route(buf, packet.len(), dst.into(), flags, (now, meta.queued));
            }
            Egress::Forward6 { packet, dst } => {
                self.carried(device, packet.len());
                sub.route(buf, packet.len(), dst.into(), 0, (now, meta.queued));
            }
            Egress::Fragment { packet, dst } => {
                self.carried(device, packet.len());
                let Some(peer) = shared.peers().route(dst) else {
                    bump(&shared.counters().drop_no_peer);
                    return;
                };
                let ip = &buf[FRAME_OFFSET + packet.start..FRAME_OFFSET + packet.end];
                match Fragmenter::new(ip, lan.lan.inner_mtu) {
                    Ok(mut frags) => {
                        bump(&c.fragmented);
                        loop {
                            let Some(mut fbuf) = pool.take() else {
                                bump(&shared.counters().drop_no_buffer);
                                break;
                            };
                            let Some(flen) = frags.next_into(&mut fbuf[PACKET_ROOM]) else {
                                break;
                            };
                            sub.submit(
                                Outgoing::new(fbuf, flen, peer.clone(), now)
                                    .with_queued(meta.queued),
                            );
                        }
                    }
                    Err(_) => bump(&c.drop_malformed),
                }
            }
            Egress::Dhcp {
                client_mac,
                udp_payload,
            } => {
                if lan.dhcp_on {
                    let payload = buf[FRAME_OFFSET..][udp_payload].to_vec();
                    lan.to_services(
                        ToServices::Dhcp {
                            tag: seg.tag,
                            mac: client_mac,
                            payload,
                        },
                        now,
                    );
                } else {
                    bump(&c.dhcp_unserved);
                }
            }
            Egress::Dhcp6 {
                client_mac,
                client_ip,
                client_port,
                udp_payload,
            } => {
                let payload = buf[FRAME_OFFSET..][udp_payload].to_vec();
                let from = (client_ip, client_port);
                let msg = ToServices::Dhcp6 {
                    tag: seg.tag,
                    mac: client_mac,
                    from,
                    payload,
                };
                lan.to_services(msg, now);
            }
            Egress::Dns {
                client_mac,
                client_ip,
                client_port,
                udp_payload,
            } => {
                let client = Client::Lan {
                    mac: client_mac,
                    ip: client_ip,
                    port: client_port,
                };
                lan.dns_query(client, &buf[FRAME_OFFSET..][udp_payload], now);
            }
            Egress::Dns6 {
                client_mac,
                client_ip,
                client_port,
                udp_payload,
            } => {
                let client = Client::Lan6 {
                    mac: client_mac,
                    ip: client_ip,
                    port: client_port,
                };
                lan.dns_query(client, &buf[FRAME_OFFSET..][udp_payload], now);
            }
            Egress::Hairpin { frame } => {
                if lan.send(&self.socks[0], &mut buf[FRAME_OFFSET..], frame, seg.tag) {
                    bump(&c.lan_hairpinned);
                }
            }
            Egress::Drop(reason) => {
                bump(match reason {
                    EgressDrop::NotForUs => &c.drop_not_for_us,
                    EgressDrop::NotIpv4 => &c.drop_not_ipv4,
                    EgressDrop::Vlan => &c.drop_vlan,
                    EgressDrop::Malformed => &c.drop_malformed,
                    EgressDrop::Truncated => &c.drop_truncated,
                    EgressDrop::Spoofed => &c.drop_spoofed,
                    EgressDrop::NoRoute => &c.drop_no_route,
                    EgressDrop::LocalDestination => &c.drop_local_destination,
                    EgressDrop::NoHolder => &c.drop_neighbour_unknown,
                    EgressDrop::GatewayService => &c.drop_gateway_service,
                    EgressDrop::NoReply => &c.drop_no_reply,
                    EgressDrop::ArpIgnored => &c.drop_arp_ignored,
                    EgressDrop::RouterGuard => &c.drop_router_guard,
                    EgressDrop::NeighbourSpoofed => &c.drop_neighbour_spoofed,
                    EgressDrop::NeighbourIgnored => &c.drop_neighbour_ignored,
                });
            }
        }
    }
}
