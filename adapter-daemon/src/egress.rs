//! Egress, LAN to overlay: the capture thread, the seal stage, the UDP sink.
//!
//! ```text
//! capture thread: recvmmsg on AF_PACKET -> Lan::handle_frame -> route to a peer -> Sequencer
//!   (replies to ARP/ICMP go straight back out; packets for a peer whose handshake is pending
//!    wait in a bounded queue of that peer, in order, until the control thread says it is up)
//! workers:        SealStage::process (ChaCha20-Poly1305 in place)
//! emitter:        UdpSink: sendmmsg, in arrival order
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use cyphonic_gateway::{Egress, EgressDrop, Fragmenter, ReplyKind};
use cyphonic_netio::{FrameMeta, PacketSocket, UdpSocket};
use cyphonic_pipeline::{DropReason, Rejected, Sequencer, Sink, Stage};
use cyphonic_session::{SendError, Session};
use cyphonic_wire::{HEADER_LEN, TAG_LEN};

use crate::counters::bump;
use crate::daemon::{Shared, ToCapture, ToServices};
use crate::peers::PeerSlot;
use crate::pool::{BUF_LEN, Buf, FRAME_OFFSET, RECV_BATCH, RecvBuffers};
use crate::services::Client;

/// Datagrams per sendmmsg.
const SEND_BATCH: usize = 64;

/// A packet on its way into the tunnel. Its IP packet sits at `buf[HEADER_LEN..][..len]`.
pub struct Outgoing {
    buf: Buf,
    len: usize,
    peer: Arc<PeerSlot>,
    now: Instant,
    session: Option<Arc<Session>>,
    counter: u64,
    dest: Option<SocketAddr>,
    frame_len: usize,
}

/// Picks the session and counter in order; seals on the workers.
pub struct SealStage {
    pub(crate) shared: Arc<Shared>,
}

impl Stage for SealStage {
    type Item = Outgoing;

    fn sequence(&self, item: &mut Outgoing) -> Result<(), DropReason> {
        let mut peer = item.peer.lock();
        let result = peer.send_session(item.now);
        let dest = peer.endpoint();
        // A handshake asked for on this path is built by the control thread: wake it.
        let due = peer.poll_timeout().is_some_and(|t| t <= item.now);
        drop(peer);
        if due {
            self.shared.wake_control();
        }
        match result {
            Ok(session) => {
                item.counter = session
                    .reserve_counter()
                    .map_err(|_| DropReason::KeyExhausted)?;
                item.session = Some(session);
                item.dest = dest;
                Ok(())
            }
            Err(SendError::NoSession) => Err(DropReason::NoSession),
            Err(_) => Err(DropReason::Unroutable),
        }
    }

    fn process(&self, item: &mut Outgoing) -> Result<(), DropReason> {
        let session = item.session.as_ref().ok_or(DropReason::NoSession)?;
        item.frame_len = session
            .seal(item.counter, &mut item.buf[..], item.len)
            .map_err(|_| DropReason::TooBig)?;
        Ok(())
    }
}

/// The egress emitter's end: batches sealed frames into sendmmsg, in order.
pub struct UdpSink {
    pub(crate) shared: Arc<Shared>,
    pub(crate) udp: UdpSocket,
    pub(crate) batch: Vec<Outgoing>,
}

impl Sink for UdpSink {
    type Item = Outgoing;

    fn emit(&mut self, item: Outgoing) -> Result<(), DropReason> {
        if item.dest.is_none() {
            self.shared.pool.put(item.buf);
            return Err(DropReason::Unroutable);
        }
        item.peer.tx_packets.fetch_add(1, Ordering::Relaxed);
        item.peer
            .tx_bytes
            .fetch_add(item.len as u64, Ordering::Relaxed);
        self.batch.push(item);
        if self.batch.len() >= SEND_BATCH {
            self.flush();
        }
        Ok(())
    }

    fn dropped(&mut self, item: Outgoing, _reason: DropReason) {
        self.shared.pool.put(item.buf);
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut msgs: [(SocketAddr, &[u8]); SEND_BATCH] =
            [(SocketAddr::from(([0, 0, 0, 0], 0)), &[]); SEND_BATCH];
        let mut n = 0;
        for item in &self.batch {
            if let Some(dest) = item.dest {
                msgs[n] = (dest, &item.buf[..item.frame_len]);
                n += 1;
            }
        }
        let (sent, failed, err) = self.udp.send_batch(&msgs[..n]);
        let c = &self.shared.counters;
        c.udp_sent.fetch_add(sent as u64, Ordering::Relaxed);
        if failed > 0 {
            c.udp_send_failed
                .fetch_add(failed as u64, Ordering::Relaxed);
            tracing::debug!(failed, error = ?err, "the kernel refused tunnel datagrams");
        }
        for item in self.batch.drain(..) {
            self.shared.pool.put(item.buf);
        }
    }
}

/// A token bucket for the ICMP errors the gateway originates (RFC 1812 §4.3.2.8).
struct RateLimit {
    tokens: f64,
    last: Instant,
    per_sec: f64,
}

impl RateLimit {
    fn allow(&mut self, now: Instant) -> bool {
        self.tokens = (self.tokens
            + now.saturating_duration_since(self.last).as_secs_f64() * self.per_sec)
            .min(self.per_sec);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The capture thread: runs until `shared.running` goes false.
pub struct Capture {
    pub(crate) shared: Arc<Shared>,
    pub(crate) sock: PacketSocket,
    pub(crate) seq: Sequencer<SealStage>,
    pub(crate) events: Receiver<ToCapture>,
    pub(crate) queue_per_peer: usize,
}

impl Capture {
    /// The thread's body.
    pub fn run(mut self) {
        let mut pending: HashMap<u32, VecDeque<Outgoing>> = HashMap::new();
        let mut icmp = RateLimit {
            tokens: 200.0,
            last: Instant::now(),
            per_sec: 200.0,
        };
        let mut reply = [0u8; BUF_LEN];
        let mut rx = RecvBuffers::new(FRAME_OFFSET..BUF_LEN - TAG_LEN);
        let mut meta = [FrameMeta::default(); RECV_BATCH];
        while self.shared.running.load(Ordering::Relaxed) {
            self.handle_events(&mut pending);
            let sock = &mut self.sock;
            let Some(received) = rx.receive(&self.shared.pool, |slices| {
                sock.recv_batch(slices, &mut meta)
            }) else {
                bump(&self.shared.counters.drop_no_buffer);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let frames = match received {
                Ok(frames) => frames,
                Err(e) => {
                    tracing::error!(error = %e, interface = self.sock.name(), "receiving from the LAN interface failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if frames.len() == 0 {
                continue;
            }
            let now = Instant::now();
            for (buf, m) in frames.zip(meta) {
                self.handle(buf, m, now, &mut pending, &mut icmp, &mut reply);
            }
            self.seq.flush();
        }
        rx.release(&self.shared.pool);
        tracing::debug!("capture thread stopped");
    }

    fn handle(
        &mut self,
        mut buf: Buf,
        meta: FrameMeta,
        now: Instant,
        pending: &mut HashMap<u32, VecDeque<Outgoing>>,
        icmp: &mut RateLimit,
        reply: &mut [u8],
    ) {
        let shared = self.shared.clone();
        let c = &shared.counters;
        if meta.outgoing {
            self.shared.pool.put(buf);
            return;
        }
        bump(&c.captured);
        if meta.truncated {
            bump(&c.captured_truncated);
        }
        let held = meta.len.min(BUF_LEN - TAG_LEN - FRAME_OFFSET);
        let frame = &mut buf[FRAME_OFFSET..FRAME_OFFSET + held];
        let verdict = if meta.vlan.is_some() {
            Egress::Drop(EgressDrop::Vlan)
        } else {
            self.shared.lan.handle_frame(
                frame,
                meta.len,
                meta.checksum_partial,
                &self.shared.table,
                reply,
            )
        };
        match verdict {
            Egress::Reply { len, kind } => {
                let counter = match kind {
                    ReplyKind::Arp => &c.arp_replies,
                    ReplyKind::EchoReply => &c.echo_replies,
                    ReplyKind::FragNeeded => &c.icmp_frag_needed,
                    ReplyKind::TimeExceeded => &c.icmp_time_exceeded,
                };
                let is_error = matches!(kind, ReplyKind::FragNeeded | ReplyKind::TimeExceeded);
                if is_error && !icmp.allow(now) {
                    bump(&c.icmp_rate_limited);
                } else if self.sock.send(&reply[..len]).is_ok() {
                    bump(counter);
                } else {
                    bump(&c.lan_send_failed);
                }
                self.shared.pool.put(buf);
            }
            Egress::Forward { packet, dst } => {
                let Some(peer) = self.shared.peers.route(dst) else {
                    bump(&c.drop_no_peer);
                    self.shared.pool.put(buf);
                    return;
                };
                let len = packet.len();
                debug_assert_eq!(
                    FRAME_OFFSET + packet.start,
                    HEADER_LEN,
                    "IP packet sits behind the tunnel header's room"
                );
                self.submit(
                    Outgoing {
                        buf,
                        len,
                        peer,
                        now,
                        session: None,
                        counter: 0,
                        dest: None,
                        frame_len: 0,
                    },
                    pending,
                );
            }
            Egress::Fragment { packet, dst } => {
                let Some(peer) = self.shared.peers.route(dst) else {
                    bump(&c.drop_no_peer);
                    self.shared.pool.put(buf);
                    return;
                };
                let ip = &buf[FRAME_OFFSET + packet.start..FRAME_OFFSET + packet.end];
                match Fragmenter::new(ip, self.shared.lan.inner_mtu) {
                    Ok(mut frags) => {
                        bump(&c.fragmented);
                        loop {
                            let Some(mut fbuf) = self.shared.pool.take() else {
                                bump(&c.drop_no_buffer);
                                break;
                            };
                            let Some(flen) =
                                frags.next_into(&mut fbuf[HEADER_LEN..BUF_LEN - TAG_LEN])
                            else {
                                self.shared.pool.put(fbuf);
                                break;
                            };
                            let item = Outgoing {
                                buf: fbuf,
                                len: flen,
                                peer: peer.clone(),
                                now,
                                session: None,
                                counter: 0,
                                dest: None,
                                frame_len: 0,
                            };
                            self.submit(item, pending);
                        }
                    }
                    Err(_) => bump(&c.drop_malformed),
                }
                self.shared.pool.put(buf);
            }
            Egress::Learn { ip, mac } => {
                if self.shared.table.learn(ip, mac) {
                    bump(&c.arp_learned);
                }
                self.shared.pool.put(buf);
            }
            Egress::Dhcp {
                client_mac,
                udp_payload,
            } => {
                if self.shared.dhcp_on {
                    let payload = buf[FRAME_OFFSET..][udp_payload].to_vec();
                    self.to_services(ToServices::Dhcp {
                        mac: client_mac,
                        payload,
                    });
                } else {
                    bump(&c.dhcp_unserved);
                }
                self.shared.pool.put(buf);
            }
            Egress::Dns {
                client_mac,
                client_ip,
                client_port,
                udp_payload,
            } => {
                if self.shared.dns_on {
                    let payload = buf[FRAME_OFFSET..][udp_payload].to_vec();
                    self.to_services(ToServices::Dns {
                        client: Client::Lan {
                            mac: client_mac,
                            ip: client_ip,
                            port: client_port,
                        },
                        payload,
                    });
                } else {
                    bump(&c.dns_unserved);
                }
                self.shared.pool.put(buf);
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
                    EgressDrop::GatewayService => &c.drop_gateway_service,
                    EgressDrop::NoReply => &c.drop_no_reply,
                    EgressDrop::ArpIgnored => &c.drop_arp_ignored,
                });
                self.shared.pool.put(buf);
            }
        }
    }

    /// Hands a DHCP or DNS message to the control thread, never waiting for it.
    fn to_services(&self, msg: ToServices) {
        if self.shared.services_tx.try_send(msg).is_err() {
            bump(&self.shared.counters.drop_service_busy);
        }
    }

    /// Hands a packet to the pipeline, or queues it behind its peer's pending handshake.
    /// A peer with queued packets gets new ones queued too, so nothing overtakes them.
    fn submit(&mut self, item: Outgoing, pending: &mut HashMap<u32, VecDeque<Outgoing>>) {
        let id = item.peer.id;
        if let Some(q) = pending.get_mut(&id).filter(|q| !q.is_empty()) {
            self.enqueue_in(q, item);
            return;
        }
        match self.seq.push(item) {
            Ok(()) => {}
            Err(Rejected::Dropped(item, DropReason::NoSession)) => {
                let q = pending.entry(id).or_default();
                self.enqueue_in(q, item);
            }
            Err(Rejected::Full(item)) => {
                bump(&self.shared.counters.drop_pipeline_full);
                self.shared.pool.put(item.buf);
            }
            Err(Rejected::Dropped(item, _)) => self.shared.pool.put(item.buf),
        }
    }

    fn enqueue_in(&self, q: &mut VecDeque<Outgoing>, item: Outgoing) {
        if q.len() >= self.queue_per_peer {
            bump(&self.shared.counters.drop_queue);
            self.shared.pool.put(item.buf);
        } else {
            bump(&self.shared.counters.queued_for_handshake);
            q.push_back(item);
        }
    }

    fn handle_events(&mut self, pending: &mut HashMap<u32, VecDeque<Outgoing>>) {
        while let Ok(event) = self.events.try_recv() {
            match event {
                ToCapture::Established(id) => {
                    let Some(mut q) = pending.remove(&id) else {
                        continue;
                    };
                    let now = Instant::now();
                    while let Some(mut item) = q.pop_front() {
                        item.now = now;
                        match self.seq.push(item) {
                            Ok(()) => {}
                            Err(Rejected::Dropped(item, DropReason::NoSession)) => {
                                // Not usable after all (expired again): keep waiting, in order.
                                q.push_front(item);
                                pending.insert(id, q);
                                break;
                            }
                            Err(rejected) => {
                                bump(&self.shared.counters.drop_queue);
                                self.shared.pool.put(rejected.into_item().buf);
                            }
                        }
                    }
                    self.seq.flush();
                }
                ToCapture::GaveUp(id) => {
                    for item in pending.remove(&id).unwrap_or_default() {
                        bump(&self.shared.counters.drop_queue);
                        self.shared.pool.put(item.buf);
                    }
                }
            }
        }
    }
}
