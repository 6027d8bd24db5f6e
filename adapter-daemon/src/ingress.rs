//! Ingress, overlay to LAN: the UDP receive thread, the open stage, the LAN sink.
//!
//! ```text
//! receive thread: recvmmsg on UDP -> frame type -> data/keepalive: find the session -> Sequencer
//!                                                 handshakes: to the control thread
//! workers:        OpenStage::process (authenticate and decrypt in place)
//! emitter:        LanSink: replay window update (in order), cryptokey routing, Ethernet header,
//!                 sendmmsg on AF_PACKET
//! ```

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cyphonic_gateway::{Ingress, IngressDrop};
use cyphonic_netio::{DatagramMeta, PacketSocket, UdpSocket};
use cyphonic_pipeline::{DropReason, Rejected, Sequencer, Sink, Stage};
use cyphonic_session::Session;
use cyphonic_wire::{Frame, FrameRepr, HEADER_LEN, MessageType};

use crate::counters::bump;
use crate::daemon::{Shared, ToControl, ToServices};
use crate::peers::PeerSlot;
use crate::pool::{BUF_LEN, Buf, RECV_BATCH, RecvBuffers};

const SEND_BATCH: usize = 64;
/// At most one ARP request per device address per this interval.
const ARP_INTERVAL: Duration = Duration::from_secs(1);

/// A frame on its way out of the tunnel. The datagram is `buf[..len]`; once opened, the inner
/// packet is `buf[HEADER_LEN..][..plain_len]`.
pub struct Incoming {
    buf: Buf,
    len: usize,
    from: SocketAddr,
    peer: Arc<PeerSlot>,
    session: Arc<Session>,
    counter: u64,
    is_data: bool,
    now: Instant,
    plain_len: usize,
    frame: std::ops::Range<usize>,
}

/// Pre-checks replays in order; opens on the workers.
pub struct OpenStage;

impl Stage for OpenStage {
    type Item = Incoming;

    fn sequence(&self, item: &mut Incoming) -> Result<(), DropReason> {
        item.session
            .check_replay(item.counter)
            .map_err(|_| DropReason::Replay)
    }

    fn process(&self, item: &mut Incoming) -> Result<(), DropReason> {
        let (_, plain) = item
            .session
            .open(&mut item.buf[..item.len])
            .map_err(|_| DropReason::Auth)?;
        item.plain_len = plain.len();
        Ok(())
    }
}

/// The ingress emitter's end.
pub struct LanSink {
    pub(crate) shared: Arc<Shared>,
    pub(crate) lan_tx: PacketSocket,
    pub(crate) batch: Vec<Incoming>,
    pub(crate) arp_sent: HashMap<Ipv4Addr, Instant>,
    pub(crate) out: [u8; 64],
}

impl LanSink {
    fn give_back(&self, item: Incoming, reason: DropReason) -> Result<(), DropReason> {
        self.shared.pool.put(item.buf);
        Err(reason)
    }
}

impl Sink for LanSink {
    type Item = Incoming;

    fn emit(&mut self, mut item: Incoming) -> Result<(), DropReason> {
        // The replay window moves here, in arrival order, after authentication.
        if item.session.accept_counter(item.counter).is_err() {
            return self.give_back(item, DropReason::Replay);
        }
        let confirmed = {
            let mut peer = item.peer.lock();
            peer.handle_authenticated(
                item.now,
                item.session.local_index(),
                item.from,
                item.is_data,
            );
            peer.has_events()
        };
        if confirmed {
            // Keys confirmed (or the peer moved): the control thread acts on it now, not at
            // its next wake-up — packets and DNS answers may be waiting for these keys.
            self.shared.wake_control();
        }
        let c = &self.shared.counters;
        if !item.is_data {
            bump(&c.keepalives_received);
            self.shared.pool.put(item.buf);
            return Ok(());
        }
        item.peer.rx_packets.fetch_add(1, Ordering::Relaxed);
        item.peer
            .rx_bytes
            .fetch_add(item.plain_len as u64, Ordering::Relaxed);
        let packet = HEADER_LEN..HEADER_LEN + item.plain_len;
        match self.shared.lan.deliver(
            &mut item.buf[..],
            packet,
            &item.peer.blocks,
            &self.shared.table,
            &mut self.out,
        ) {
            Ingress::ToGateway { packet } => {
                // DNS asks and answers, pings: served on the control thread.
                let msg = ToServices::FromPeer {
                    peer: item.peer.id,
                    packet: item.buf[packet].to_vec(),
                    at: item.now,
                };
                if self.shared.services_tx.try_send(msg).is_err() {
                    bump(&c.drop_service_busy);
                }
                self.shared.pool.put(item.buf);
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
                    .is_none_or(|t| item.now.saturating_duration_since(*t) >= ARP_INTERVAL);
                if due {
                    if self.arp_sent.len() > 4096 {
                        self.arp_sent.clear();
                    }
                    self.arp_sent.insert(ip, item.now);
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
        self.shared.pool.put(item.buf);
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut frames: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        for (slot, item) in frames.iter_mut().zip(&self.batch) {
            *slot = &item.buf[item.frame.clone()];
        }
        let (sent, failed, err) = self.lan_tx.send_batch(&frames[..self.batch.len()]);
        let c = &self.shared.counters;
        c.lan_sent.fetch_add(sent as u64, Ordering::Relaxed);
        if failed > 0 {
            c.lan_send_failed
                .fetch_add(failed as u64, Ordering::Relaxed);
            tracing::debug!(failed, error = ?err, "the LAN interface refused frames");
        }
        for item in self.batch.drain(..) {
            self.shared.pool.put(item.buf);
        }
    }
}

/// The UDP receive thread.
pub struct Receiver {
    pub(crate) shared: Arc<Shared>,
    pub(crate) udp: UdpSocket,
    pub(crate) seq: Sequencer<OpenStage>,
}

impl Receiver {
    /// The thread's body: runs until `shared.running` goes false.
    pub fn run(mut self) {
        let mut rx = RecvBuffers::new(0..BUF_LEN);
        let mut meta = [DatagramMeta::default(); RECV_BATCH];
        while self.shared.running.load(Ordering::Relaxed) {
            let udp = &mut self.udp;
            let Some(received) = rx.receive(&self.shared.pool, |slices| {
                udp.recv_batch(slices, &mut meta)
            }) else {
                bump(&self.shared.counters.drop_no_buffer);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let datagrams = match received {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(error = %e, "receiving from the tunnel socket failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if datagrams.len() == 0 {
                continue;
            }
            let now = Instant::now();
            for (buf, m) in datagrams.zip(meta) {
                self.handle(buf, m, now);
            }
            self.seq.flush();
        }
        rx.release(&self.shared.pool);
        tracing::debug!("receive thread stopped");
    }

    fn handle(&mut self, buf: Buf, m: DatagramMeta, now: Instant) {
        let c = &self.shared.counters;
        bump(&c.udp_received);
        if m.truncated || m.len > BUF_LEN {
            bump(&c.udp_truncated);
            self.shared.pool.put(buf);
            return;
        }
        let Ok(repr) = Frame::new_checked(&buf[..m.len]).and_then(|f| FrameRepr::parse(&f)) else {
            bump(&c.drop_frame_malformed);
            self.shared.pool.put(buf);
            return;
        };
        match repr.msg_type {
            MessageType::Data | MessageType::Keepalive => {
                let Some(peer) = self.shared.peers.by_index(repr.receiver_index) else {
                    bump(&c.drop_unknown_index);
                    self.shared.pool.put(buf);
                    return;
                };
                let (session, endpoint) = {
                    let p = peer.lock();
                    (p.session_for_index(repr.receiver_index, now), p.endpoint())
                };
                let Some(session) = session else {
                    bump(&c.drop_unknown_index);
                    // A peer that restarted sends on keys we lost: if it speaks from where we
                    // expect it, ask the control thread to handshake now rather than wait.
                    if endpoint == Some(m.from) {
                        let _ = self.shared.control.try_send(ToControl::Kick(peer.id));
                    }
                    self.shared.pool.put(buf);
                    return;
                };
                let item = Incoming {
                    buf,
                    len: m.len,
                    from: m.from,
                    peer,
                    session,
                    counter: repr.counter,
                    is_data: repr.msg_type == MessageType::Data,
                    now,
                    plain_len: 0,
                    frame: 0..0,
                };
                match self.seq.push(item) {
                    Ok(()) => {}
                    Err(Rejected::Full(item)) => {
                        bump(&c.drop_pipeline_full);
                        self.shared.pool.put(item.buf);
                    }
                    Err(Rejected::Dropped(item, _)) => self.shared.pool.put(item.buf),
                }
            }
            MessageType::HandshakeInit | MessageType::HandshakeResp => {
                let msg = ToControl::Handshake {
                    frame: buf[..m.len].to_vec(),
                    from: m.from,
                    at: now,
                };
                if self.shared.control.try_send(msg).is_err() {
                    bump(&c.drop_handshake_queue);
                }
                self.shared.pool.put(buf);
            }
            _ => {
                bump(&c.drop_frame_unhandled);
                self.shared.pool.put(buf);
            }
        }
    }
}
