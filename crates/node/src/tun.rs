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

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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
use ipnet::{Ipv4Net, Ipv6Net};

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
    pub counters: TunCounters,
}

/// Our addresses and the overlay's: what packets from the host and from peers are checked
/// against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ours {
    /// Our vIP.
    pub vip: Ipv4Addr,
    /// The overlay: what we send into the tunnel.
    pub overlay: Ipv4Net,
    /// Our IPv6 vIP and the overlay's IPv6 range, when we carry IPv6.
    pub ipv6: Option<(Ipv6Addr, Ipv6Net)>,
}

/// How long a TUN read waits before the thread looks at its other work.
const READ_WAIT: Duration = Duration::from_millis(10);
/// The smallest IPv4 header.
const IPV4_MIN: usize = 20;
/// IPv6's fixed header.
const IPV6_HEADER: usize = 40;

cyphonic_telemetry::counters! {
    /// Counters of the node's TUN side.
    pub struct TunCounters {
        /// Packets read from the TUN device.
        tun_read,
        /// Packets from the host that are not IPv4, nor IPv6 where we carry it.
        drop_tun_not_ipv4,
        /// Packets from the host with a malformed IPv4 or IPv6 header.
        drop_tun_malformed,
        /// Packets from the host from another source than our vIP.
        drop_tun_not_our_source,
        /// Packets from the host to a destination outside the overlay, or to ourselves.
        drop_tun_not_overlay,
        /// Packets written to the TUN device.
        tun_written,
        /// Packets the TUN device refused.
        tun_write_failed,
        /// Decrypted packets that are not IPv4, nor IPv6 where we carry it.
        drop_inner_not_ipv4,
        /// Decrypted packets with a malformed IPv4 or IPv6 header.
        drop_inner_malformed,
        /// Decrypted packets whose source the sending peer is not certified for.
        drop_source_not_certified,
        /// Decrypted packets not addressed to our vIP.
        drop_not_for_us,
        /// Super-packets read from the TUN device (offloads), each cut into segments.
        tun_coalesced,
        /// Segments cut from them.
        tun_segments,
        /// Super-packets that could not be cut (malformed, or a kind the overlay does not carry).
        drop_tun_coalesced,
        /// Packets longer than the buffers (cut short by the kernel).
        drop_tun_truncated,
        /// Super-packets written to the TUN device (offloads): runs of one flow merged.
        tun_merged,
        /// The packets in them (counted in `tun_written` too).
        tun_merged_segments,
    }
}

/// A packet's source and destination, if `p` holds a well-formed IPv4 header, or IPv6 one
/// when `v6` (its length field within the packet); the error says whether it is neither at
/// all (`false`) or malformed (`true`).
fn addresses(p: &[u8], v6: bool) -> Result<(IpAddr, IpAddr), bool> {
    let first = *p.first().ok_or(true)?;
    let word = |at: usize| {
        p.get(at..at + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or(true)
    };
    match first >> 4 {
        4 => {
            let header = usize::from(first & 0x0f) * 4;
            let total = word(2)?;
            if header < IPV4_MIN || total < header || total > p.len() {
                return Err(true);
            }
            let src = <[u8; 4]>::try_from(p.get(12..16).ok_or(true)?).map_err(|_| true)?;
            let dst = <[u8; 4]>::try_from(p.get(16..20).ok_or(true)?).map_err(|_| true)?;
            Ok((src.into(), dst.into()))
        }
        6 if v6 => {
            if p.len() < IPV6_HEADER || IPV6_HEADER + word(4)? > p.len() {
                return Err(true);
            }
            let src = <[u8; 16]>::try_from(&p[8..24]).map_err(|_| true)?;
            let dst = <[u8; 16]>::try_from(&p[24..40]).map_err(|_| true)?;
            Ok((src.into(), dst.into()))
        }
        _ => Err(false),
    }
}

impl Ours {
    /// Our address of `dst`'s family, and whether `dst` lies in the overlay of that family.
    fn of(&self, dst: IpAddr) -> (Option<IpAddr>, bool) {
        match dst {
            IpAddr::V4(d) => (Some(self.vip.into()), self.overlay.contains(&d)),
            IpAddr::V6(d) => self
                .ipv6
                .map_or((None, false), |(vip, o)| (Some(vip.into()), o.contains(&d))),
        }
    }
}

/// Where a packet from the host goes: its destination in the overlay, or why it is dropped.
fn outbound(p: &[u8], ours: &Ours, c: &TunCounters) -> Option<IpAddr> {
    match addresses(p, ours.ipv6.is_some()) {
        Err(false) => bump(&c.drop_tun_not_ipv4),
        Err(true) => bump(&c.drop_tun_malformed),
        Ok((src, dst)) => match ours.of(dst) {
            (vip, _) if Some(src) != vip => bump(&c.drop_tun_not_our_source),
            (vip, inside) if !inside || Some(dst) == vip => bump(&c.drop_tun_not_overlay),
            _ => return Some(dst),
        },
    }
    None
}

/// Whether a decrypted packet from a peer certified for `blocks` may go into the TUN device:
/// only a well-formed IPv4 packet, or IPv6 one where we carry it, from those blocks
/// (cryptokey routing) to our own vIP of its family. Another address of our block, or its
/// broadcast, would be the host's to route on, out of the tunnel and in clear. The error
/// names the counter and the pipeline's drop reason.
fn inbound<'c>(
    p: &[u8],
    blocks: &[ipnet::IpNet],
    ours: &Ours,
    c: &'c TunCounters,
) -> Result<(), (&'c std::sync::atomic::AtomicU64, DropReason)> {
    match addresses(p, ours.ipv6.is_some()) {
        Err(false) => Err((&c.drop_inner_not_ipv4, DropReason::Malformed)),
        Err(true) => Err((&c.drop_inner_malformed, DropReason::Malformed)),
        Ok((src, _)) if !blocks.iter().any(|b| b.contains(&src)) => {
            Err((&c.drop_source_not_certified, DropReason::Policy))
        }
        Ok((_, dst)) if ours.of(dst).0 != Some(dst) => {
            Err((&c.drop_not_for_us, DropReason::Policy))
        }
        Ok(_) => Ok(()),
    }
}

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
        let packet = item.packet();
        let c = &self.side.counters;
        let verdict = inbound(
            &item.buf()[packet.clone()],
            &item.peer().blocks,
            &self.side.ours,
            c,
        );
        if let Err((counter, reason)) = verdict {
            bump(counter);
            return Err(reason);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A node at 100.64.3.1 without IPv6.
    fn v4_only() -> Ours {
        Ours {
            vip: Ipv4Addr::new(100, 64, 3, 1),
            overlay: "100.64.0.0/10".parse().unwrap_or_default(),
            ipv6: None,
        }
    }

    /// The same node with fd7a:0:1:4000::1 in the overlay's fd7a:0:1::/48.
    fn dual() -> Ours {
        Ours {
            ipv6: Some((
                "fd7a:0:1:4000::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
                "fd7a:0:1::/48".parse().unwrap_or_default(),
            )),
            ..v4_only()
        }
    }

    /// An IPv6 packet (a UDP header's worth of payload) from `src` to `dst`.
    fn packet6(src: &str, dst: &str) -> Vec<u8> {
        let addr = |a: &str| {
            a.parse::<Ipv6Addr>()
                .unwrap_or(Ipv6Addr::UNSPECIFIED)
                .octets()
        };
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        p.extend_from_slice(&addr(src));
        p.extend_from_slice(&addr(dst));
        p.extend_from_slice(&[0; 8]);
        p
    }

    /// Issue 53: with IPv6, the host's IPv6 from our address to the overlay's range goes into
    /// the tunnel and the rest is counted as IPv4's is; a peer's IPv6 from its blocks to our
    /// address goes into the device. Without IPv6, IPv6 is counted as not carried.
    #[test]
    fn ipv6_packets_are_checked_both_ways_where_we_carry_it() {
        let (ours, c) = (dual(), TunCounters::default());
        let me = "fd7a:0:1:4000::1";
        let peer = "fd7a:0:1:200::7";
        assert_eq!(
            outbound(&packet6(me, peer), &ours, &c),
            Some(peer.parse().unwrap_or(IpAddr::from([0; 4])))
        );
        for (p, counter) in [
            (packet6("fe80::1", "ff02::2"), &c.drop_tun_not_our_source),
            (packet6(me, "2001:db8::1"), &c.drop_tun_not_overlay),
            (packet6(me, me), &c.drop_tun_not_overlay),
            (packet6(me, peer)[..39].to_vec(), &c.drop_tun_malformed),
        ] {
            let before = counter.load(Ordering::Relaxed);
            assert_eq!(outbound(&p, &ours, &c), None, "{p:?}");
            assert_eq!(counter.load(Ordering::Relaxed), before + 1, "{p:?}");
        }
        let mut long_field = packet6(me, peer);
        long_field[5] = 9;
        assert_eq!(outbound(&long_field, &ours, &c), None);

        let blocks: Vec<ipnet::IpNet> = vec![
            "100.64.2.0/24".parse().unwrap_or_default(),
            "fd7a:0:1:200::/56".parse().unwrap_or_default(),
        ];
        assert!(inbound(&packet6(peer, me), &blocks, &ours, &c).is_ok());
        for (p, counter) in [
            (packet6(peer, "fd7a:0:1:4000::2"), &c.drop_not_for_us),
            (packet6("fd7a:0:1:300::7", me), &c.drop_source_not_certified),
        ] {
            let got = inbound(&p, &blocks, &ours, &c).map_err(|(counter, _)| counter as *const _);
            assert_eq!(got, Err(counter as *const _), "{p:?}");
        }
        // Without IPv6: neither way.
        let (v4, c) = (v4_only(), TunCounters::default());
        assert_eq!(outbound(&packet6(me, peer), &v4, &c), None);
        assert_eq!(c.drop_tun_not_ipv4.load(Ordering::Relaxed), 1);
        let got = inbound(&packet6(peer, me), &blocks, &v4, &c)
            .map_err(|(counter, _)| counter as *const _);
        assert_eq!(got, Err(&raw const c.drop_inner_not_ipv4));
    }

    fn packet(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p
    }

    /// Every packet from the host either goes to an overlay destination or is counted under
    /// its reason; nothing short or odd panics.
    #[test]
    fn outbound_packets_are_checked() {
        let ours = v4_only();
        let c = TunCounters::default();
        let me = [100, 64, 3, 1];
        assert_eq!(
            outbound(&packet(me, [100, 64, 2, 10]), &ours, &c),
            Some(IpAddr::from([100, 64, 2, 10]))
        );
        let mut v6 = packet(me, [100, 64, 2, 10]);
        v6[0] = 0x60;
        let mut long_header = packet(me, [100, 64, 2, 10]);
        long_header[0] = 0x4f;
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0x45],
            packet(me, [100, 64, 2, 10])[..19].to_vec(),
            v6,
            long_header,
            packet([100, 64, 3, 2], [100, 64, 2, 10]),
            packet(me, [192, 0, 2, 1]),
            packet(me, me),
        ];
        for p in &cases {
            assert_eq!(outbound(p, &ours, &c), None, "{p:?}");
        }
        let counts: Vec<u64> = c.snapshot().iter().map(|(_, v)| *v).collect();
        // not IPv4, malformed, not our source, not the overlay
        assert_eq!(&counts[1..5], &[1, 4, 1, 2], "{:?}", c.snapshot());
    }

    /// A peer's packet goes into the TUN device only from its certified blocks and only to
    /// our own vIP: not to another address of our block, nor its broadcast.
    #[test]
    fn inbound_packets_go_only_to_our_vip() {
        let ours = v4_only();
        let blocks: Vec<ipnet::IpNet> = vec!["100.64.2.0/24".parse().unwrap_or_default()];
        let c = TunCounters::default();
        let peer = [100, 64, 2, 10];
        assert!(inbound(&packet(peer, [100, 64, 3, 1]), &blocks, &ours, &c).is_ok());
        for (p, counter) in [
            (packet(peer, [100, 64, 3, 2]), &c.drop_not_for_us),
            (packet(peer, [100, 64, 3, 3]), &c.drop_not_for_us),
            (packet(peer, [255, 255, 255, 255]), &c.drop_not_for_us),
            (packet(peer, [192, 0, 2, 1]), &c.drop_not_for_us),
            (
                packet([100, 64, 9, 9], [100, 64, 3, 1]),
                &c.drop_source_not_certified,
            ),
            (
                packet(peer, [100, 64, 3, 1])[..10].to_vec(),
                &c.drop_inner_malformed,
            ),
        ] {
            let got = inbound(&p, &blocks, &ours, &c).map_err(|(counter, _)| counter as *const _);
            assert_eq!(got, Err(counter as *const _), "{p:?}");
        }
    }
}
