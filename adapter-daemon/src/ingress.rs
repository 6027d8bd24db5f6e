//! Ingress, overlay to LAN: the LAN sink at the end of the engine's ingress pipeline
//! (`cyphonic_tunnel::Receiver` and `OpenStage` before it).
//!
//! ```text
//! emitter: LanSink: Incoming::accept (replay window, in order), cryptokey routing, Ethernet
//!          header, sendmmsg on AF_PACKET
//! ```
//!
//! With `dataplane.lan_gso`, consecutive TCP segments or UDP datagrams of one flow in a send
//! batch go out as one large frame that the kernel cuts again on the way to the device (GSO,
//! or the NIC's TSO/USO): one trip through the LAN side's stack per run instead of per packet.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cyphonic_gateway::{
    ETH_HEADER_LEN, GsoKind, IPV4_MIN_HEADER, Ingress, IngressDrop, Run, find_run, merge_headers,
    restore_headers, tcp_flags,
};
use cyphonic_netio::{Gathered, Gso, PacketSocket, segmentation_unsupported};
use cyphonic_pipeline::{DropReason, Sink};
use cyphonic_tunnel::Incoming;

use crate::counters::bump;
use crate::daemon::{Shared, ToServices};

const SEND_BATCH: usize = 64;
/// At most one ARP request per device address per this interval.
const ARP_INTERVAL: Duration = Duration::from_secs(1);

/// The ingress emitter's end.
pub struct LanSink {
    pub(crate) shared: Arc<Shared>,
    pub(crate) lan_tx: PacketSocket,
    pub(crate) batch: Vec<Incoming>,
    pub(crate) arp_sent: HashMap<Ipv4Addr, Instant>,
    pub(crate) out: [u8; 64],
    /// Merge runs of TCP segments and UDP datagrams into frames for the kernel to segment
    /// (`dataplane.lan_gso`): one switch per kind ([TCP, UDP]), each turned off for good if
    /// the interface says it does not segment that kind (older kernels take TCP but not UDP).
    pub(crate) merge: [bool; 2],
}

/// The Ethernet frame the LAN sink wrote around a delivered packet.
fn frame_of(item: &Incoming) -> &[u8] {
    &item.buf()[item.frame.clone()]
}

/// Which of [`LanSink::merge`]'s switches governs runs of `kind`.
const fn merge_slot(kind: GsoKind) -> usize {
    match kind {
        GsoKind::Tcp => 0,
        GsoKind::Udp => 1,
    }
}

impl LanSink {
    fn give_back(&self, item: Incoming, reason: DropReason) -> Result<(), DropReason> {
        self.shared.tunnel.pool.put(item.into_buf());
        Err(reason)
    }
}

impl Sink for LanSink {
    type Item = Incoming;

    fn emit(&mut self, item: Incoming) -> Result<(), DropReason> {
        let Some((mut item, packet)) = item.accept(&self.shared.tunnel)? else {
            return Ok(());
        };
        let c = &self.shared.counters;
        let now = item.now();
        let (buf, peer) = item.buf_and_peer();
        let peer_id = peer.id;
        let verdict = self.shared.lan.deliver(
            &mut buf[..],
            packet,
            &peer.blocks,
            &self.shared.table,
            &mut self.out,
        );
        match verdict {
            Ingress::ToGateway { packet } => {
                // DNS asks and answers, pings: served on the control thread.
                let msg = ToServices::FromPeer {
                    peer: peer_id,
                    packet: item.buf()[packet].to_vec(),
                    at: now,
                };
                if self.shared.services_tx.try_send(msg).is_err() {
                    bump(&c.drop_service_busy);
                }
                self.shared.tunnel.pool.put(item.into_buf());
                Ok(())
            }
            Ingress::Deliver { frame } => {
                item.frame = frame;
                self.batch.push(item);
                if self.batch.len() >= SEND_BATCH {
                    self.flush();
                }
                Ok(())
            }
            Ingress::NeedArp { len } => {
                bump(&c.drop_neighbour_unknown);
                let ip = Ipv4Addr::new(self.out[38], self.out[39], self.out[40], self.out[41]);
                let due = self
                    .arp_sent
                    .get(&ip)
                    .is_none_or(|t| now.saturating_duration_since(*t) >= ARP_INTERVAL);
                if due {
                    if self.arp_sent.len() > 4096 {
                        self.arp_sent.clear();
                    }
                    self.arp_sent.insert(ip, now);
                    if self.lan_tx.send(&self.out[..len]).is_ok() {
                        bump(&c.arp_requests);
                    }
                }
                self.give_back(item, DropReason::Unroutable)
            }
            Ingress::Drop(reason) => {
                let (counter, dr) = match reason {
                    IngressDrop::NotIpv4 => (&c.drop_inner_not_ipv4, DropReason::Malformed),
                    IngressDrop::Malformed | IngressDrop::NoHeadroom => {
                        (&c.drop_inner_malformed, DropReason::Malformed)
                    }
                    IngressDrop::SourceNotCertified => {
                        (&c.drop_source_not_certified, DropReason::Policy)
                    }
                    IngressDrop::NotOurLan => (&c.drop_not_our_lan, DropReason::Policy),
                    IngressDrop::TtlExpired => (&c.drop_ttl_expired, DropReason::Policy),
                };
                bump(counter);
                self.give_back(item, dr)
            }
        }
    }

    fn dropped(&mut self, item: Incoming, _reason: DropReason) {
        self.shared.tunnel.pool.put(item.into_buf());
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let n = self.batch.len().min(SEND_BATCH);
        let mut runs: [Option<Run>; SEND_BATCH] = [None; SEND_BATCH];
        let mut flags = [0u8; SEND_BATCH];
        if self.merge.contains(&true) {
            let mut frames: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
            for (slot, item) in frames.iter_mut().zip(&self.batch) {
                *slot = frame_of(item);
            }
            let mut i = 0;
            while i < n {
                runs[i] =
                    find_run(&frames[i..n], SEND_BATCH).filter(|r| self.merge[merge_slot(r.kind)]);
                flags[i] = tcp_flags(frames[i]);
                let last = runs[i].map_or(i, |r| i + r.count - 1);
                flags[last] = tcp_flags(frames[last]);
                i = last + 1;
            }
            for i in 0..n {
                if let Some(run) = runs[i] {
                    let last_flags = flags[i + run.count - 1];
                    let item = &mut self.batch[i];
                    let frame = item.frame.clone();
                    merge_headers(&mut item.buf_mut()[frame], &run, last_flags);
                }
            }
        }
        let mut refused = [false; SEND_BATCH];
        // Per refused run: whether the answer means "this kind is never segmented here".
        let mut unsupported = [false; SEND_BATCH];
        let mut refusal = None;
        let mut first_of = [0usize; SEND_BATCH];
        {
            let mut parts: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
            let mut messages: [Gathered; SEND_BATCH] = std::array::from_fn(|_| Gathered {
                parts: 0..0,
                gso: None,
            });
            let (mut i, mut m) = (0, 0);
            while i < n {
                let count = runs[i].map_or(1, |r| r.count);
                for k in 0..count {
                    let frame = frame_of(&self.batch[i + k]);
                    parts[i + k] = if k == 0 {
                        frame
                    } else {
                        runs[i].map_or(frame, |r| &frame[r.headers..])
                    };
                }
                messages[m] = Gathered {
                    parts: i..i + count,
                    gso: runs[i].map(|r| Gso {
                        kind: match r.kind {
                            GsoKind::Tcp => cyphonic_netio::GsoKind::TcpV4,
                            GsoKind::Udp => cyphonic_netio::GsoKind::UdpL4,
                        },
                        headers: u16::try_from(r.headers).unwrap_or(u16::MAX),
                        l4_start: u16::try_from(ETH_HEADER_LEN + IPV4_MIN_HEADER)
                            .unwrap_or(u16::MAX),
                        segment_size: r.segment_size,
                    }),
                };
                first_of[m] = i;
                i += count;
                m += 1;
            }
            self.lan_tx
                .send_gathered(&parts[..n], &messages[..m], |msg, e| {
                    refused[first_of[msg]] = true;
                    unsupported[first_of[msg]] = segmentation_unsupported(&e);
                    refusal = Some(e);
                });
        }
        let c = &self.shared.counters;
        let (mut sent, mut failed) = (0u64, 0u64);
        let mut i = 0;
        while i < n {
            let count = runs[i].map_or(1, |r| r.count);
            let segments = count as u64;
            match (refused[i], runs[i]) {
                (false, run) => {
                    sent += segments;
                    if run.is_some() {
                        bump(&c.lan_merged);
                        c.lan_merged_segments.fetch_add(segments, Ordering::Relaxed);
                    }
                }
                (true, None) => failed += 1,
                (true, Some(run)) => {
                    // Give the first frame its own headers back and send the run one frame at
                    // a time. If the interface will not segment this kind at all, stop merging
                    // runs of it; a passing failure (link down, queue full) leaves merging on.
                    let slot = merge_slot(run.kind);
                    if unsupported[i] && self.merge[slot] {
                        tracing::warn!(error = ?refusal, interface = self.lan_tx.name(), kind = ?run.kind, "the LAN interface refused a frame to segment: sending these packets alone from now on");
                        self.merge[slot] = false;
                    }
                    let item = &mut self.batch[i];
                    let frame = item.frame.clone();
                    restore_headers(&mut item.buf_mut()[frame], run.kind, flags[i]);
                    let mut frames: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
                    for (slot, item) in frames.iter_mut().zip(&self.batch[i..i + count]) {
                        *slot = frame_of(item);
                    }
                    let (ok, bad, _) = self.lan_tx.send_batch(&frames[..count]);
                    sent += ok as u64;
                    failed += bad as u64;
                }
            }
            i += count;
        }
        c.lan_sent.fetch_add(sent, Ordering::Relaxed);
        if failed > 0 {
            c.lan_send_failed.fetch_add(failed, Ordering::Relaxed);
            tracing::debug!(failed, error = ?refusal, "the LAN interface refused frames");
        }
        for item in self.batch.drain(..) {
            self.shared.tunnel.pool.put(item.into_buf());
        }
    }
}
