//! Overlay to LAN: the LAN sink at the end of the engine's ingress pipeline, on its emitter
//! thread (`cyphonic_tunnel::Receiver` and `OpenStage` before it).
//!
//! ```text
//! emitter: (the engine's Incoming::accept: replay window, in order), LanSink: cryptokey routing, Ethernet
//!          header, sendmmsg on AF_PACKET
//! ```
//!
//! With `dataplane.lan_gso`, consecutive TCP segments or UDP datagrams of one flow in a send
//! batch go out as one large frame that the kernel cuts again on the way to the device (GSO,
//! or the NIC's TSO/USO): one trip through the LAN side's stack per run instead of per packet.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cyphonic_gateway::{ETH_HEADER_LEN, Ingress, IngressDrop, Sums, complete_deferred_checksum};
use cyphonic_netio::PacketSocket;
use cyphonic_pipeline::{DropReason, Sink};
use cyphonic_tunnel::Accepted;
use cyphonic_wire::FLAG_CHECKSUM_DEFERRED;

use crate::counters::bump;
use crate::lan::{LanSide, ToServices};
use crate::meter::{Tally, Way};
use cyphonic_offload::{SEND_BATCH, send_frames};

/// The ingress emitter's end.
pub struct LanSink {
    lan: Arc<LanSide>,
    lan_tx: PacketSocket,
    batch: Vec<Accepted>,
    /// Merge runs of TCP segments and UDP datagrams into frames for the kernel to segment
    /// (`dataplane.lan_gso`): one switch per kind ([TCP, UDP]), each turned off for good if
    /// the interface says it does not segment that kind (older kernels take TCP but not UDP).
    merge: [bool; 2],
    /// Per frame of `batch`: it came with its transport checksum deferred
    /// (`FLAG_CHECKSUM_DEFERRED`), to be computed here or by the offload.
    deferred: [bool; SEND_BATCH],
    /// The run of packets to one device not yet on its meter.
    tally: Tally,
}

impl LanSink {
    /// The sink sending on `lan_tx`, merging runs of segments when `merge` (lan_gso, and the
    /// socket has offload headers).
    pub fn new(lan: Arc<LanSide>, lan_tx: PacketSocket, merge: bool) -> Self {
        Self {
            lan,
            lan_tx,
            batch: Vec::with_capacity(SEND_BATCH),
            merge: [merge; 2],
            deferred: [false; SEND_BATCH],
            tally: Tally::new(),
        }
    }
}

impl Sink for LanSink {
    type Item = Accepted;

    fn emit(&mut self, mut item: Accepted) -> Result<(), DropReason> {
        let packet = item.packet();
        let arrived = packet.clone();
        let c = &self.lan.counters;
        let now = item.now();
        // Read before the Ethernet header goes where the tunnel header was.
        let deferred = item.flags() & FLAG_CHECKSUM_DEFERRED != 0;
        if deferred {
            bump(&c.checksum_deferred_received);
        }
        let sums = if deferred { Sums::Partial } else { Sums::Full };
        let (buf, peer) = item.buf_and_peer();
        let peer_id = peer.id;
        // The destination's segment (a VLAN's block, else the untagged one) takes it.
        let seg = self
            .lan
            .segment_of_packet(buf.get(packet.clone()).unwrap_or_default());
        let verdict = seg.lan.deliver(
            &mut buf[..],
            packet,
            &peer.blocks,
            &self.lan.neighbors(seg.tag),
            sums,
        );
        match verdict {
            Ingress::ToGateway { packet } => {
                // DNS asks and answers, pings: served on the control thread.
                let mut packet = item.buf()[packet].to_vec();
                if deferred {
                    complete_deferred_checksum(&mut packet);
                }
                self.lan.to_services(
                    ToServices::FromPeer {
                        peer: peer_id,
                        packet,
                        at: now,
                    },
                    now,
                );
                Ok(())
            }
            Ingress::Deliver { frame } => {
                // Into a VLAN: tagged, its checksum completed here (a tagged frame is sent
                // alone, never merged for the offload).
                let (frame, deferred) = match seg.tag {
                    None => (frame, deferred),
                    Some(vid) => {
                        if deferred {
                            complete_deferred_checksum(
                                &mut buf[frame.start + ETH_HEADER_LEN..frame.end],
                            );
                        }
                        let Some(tagged) = cyphonic_gateway::tag_frame(&mut buf[..], frame, vid)
                        else {
                            bump(&c.drop_inner_malformed);
                            return Err(DropReason::Malformed);
                        };
                        (tagged, false)
                    }
                };
                // The device is the frame's destination (its MAC just written); the IP
                // packet's bytes are counted, as from it.
                if let Some(mac) = buf.get(frame.start..frame.start + 6) {
                    let mac = mac.try_into().unwrap_or_default();
                    self.tally
                        .count(&self.lan.meter, Way::ToDevice, mac, arrived.len());
                }
                item.frame = frame;
                // In range: the batch is flushed (emptied) as soon as it fills.
                self.deferred[self.batch.len()] = deferred;
                self.batch.push(item);
                if self.batch.len() >= SEND_BATCH {
                    self.flush();
                }
                Ok(())
            }
            Ingress::Drop(reason) => {
                // Its sender hears why (RFC 1812 §4.3.2.8), from the services' thread.
                if reason == IngressDrop::TtlExpired && self.lan.icmp_error_admitted(now) {
                    let packet = item.buf()[arrived].to_vec();
                    self.lan.to_services(
                        ToServices::Expired {
                            peer: peer_id,
                            packet,
                        },
                        now,
                    );
                }
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
                    IngressDrop::NoHolder => (&c.drop_neighbour_unknown, DropReason::Unroutable),
                };
                bump(counter);
                Err(dr)
            }
        }
    }

    fn flush(&mut self) {
        self.tally.flush(&self.lan.meter, Way::ToDevice);
        if self.batch.is_empty() {
            return;
        }
        if !self
            .lan
            .serving(std::time::Instant::now(), self.batch.len())
        {
            self.batch.clear();
            return;
        }
        let mut frames: [&mut [u8]; SEND_BATCH] = std::array::from_fn(|_| <&mut [u8]>::default());
        let n = self.batch.len().min(SEND_BATCH);
        for (slot, item) in frames.iter_mut().zip(self.batch.iter_mut()) {
            let range = item.frame.clone();
            *slot = &mut item.buf_mut()[range];
        }
        let out = send_frames(
            &self.lan_tx,
            &mut frames[..n],
            &self.deferred,
            &mut self.merge,
        );
        let c = &self.lan.counters;
        c.lan_sent.fetch_add(out.sent, Ordering::Relaxed);
        if out.merged > 0 {
            c.lan_merged.fetch_add(out.merged, Ordering::Relaxed);
            c.lan_merged_segments
                .fetch_add(out.merged_segments, Ordering::Relaxed);
        }
        if out.failed > 0 {
            c.lan_send_failed.fetch_add(out.failed, Ordering::Relaxed);
            tracing::debug!(failed = out.failed, error = ?out.error, "the LAN interface refused frames");
        }
        // Their buffers go back to the pool.
        self.batch.clear();
    }
}
