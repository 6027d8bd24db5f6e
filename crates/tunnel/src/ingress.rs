//! Ingress, out of the tunnel: the UDP receive thread and the open stage. The emitter accepts
//! each packet (`Incoming::accept`, through `Accepting`) before the edge's sink (the
//! adapter's LAN, the node's TUN) sees it: the edge gets only [`Accepted`] packets, which
//! nothing else can make.
//!
//! ```text
//! receive thread: recvmmsg on the tunnel socket -> frame type -> data/keepalive: find the session -> Sequencer
//!                                                 handshakes: HandshakeGate -> the handshake thread
//! workers:        OpenStage::process (authenticate and decrypt in place)
//! emitter:        Accepting: Incoming::accept (replay window, in order), then the edge's sink
//! ```

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cyphonic_netio::DatagramMeta;
use cyphonic_pipeline::{DropReason, Lane, Rejected, Sequencer, Sink, Stage};
use cyphonic_session::Session;
use cyphonic_wire::{Frame, FrameRepr, HEADER_LEN, MessageType};

use crate::counters::bump;
use crate::gate::{Admission, HandshakeGate};
use crate::handshakes::{HandshakeMsg, HandshakeQueue};
use crate::peers::PeerSlot;
use crate::pool::{BUF_LEN, Buf, RECV_BATCH, RecvBuffers};
use crate::socket::TunnelSocket;
use crate::{Shared, ToControl};

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
    /// How long it waited in the kernel before the receive thread read it.
    queued: Option<Duration>,
    /// Where the edge put what it delivers (an Ethernet frame around the packet, say).
    pub frame: Range<usize>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("len", &self.len)
            .field("from", &self.from)
            .field("peer", &self.peer.id)
            .finish_non_exhaustive()
    }
}

impl Incoming {
    /// The buffer (the packet, and room in front of it).
    pub fn buf(&self) -> &Buf {
        &self.buf
    }

    /// The buffer, to write around the packet.
    pub fn buf_mut(&mut self) -> &mut Buf {
        &mut self.buf
    }

    /// The buffer, to write around the packet, and the peer it came from at once.
    pub fn buf_and_peer(&mut self) -> (&mut Buf, &Arc<PeerSlot>) {
        (&mut self.buf, &self.peer)
    }

    /// The frame's header flags (authenticated once opened), such as
    /// `cyphonic_wire::FLAG_CHECKSUM_DEFERRED`.
    pub fn flags(&self) -> u16 {
        Frame::new_unchecked(&self.buf[..]).flags()
    }

    /// The peer it came from.
    pub fn peer(&self) -> &Arc<PeerSlot> {
        &self.peer
    }

    /// When it arrived.
    pub const fn now(&self) -> Instant {
        self.now
    }

    /// The emitter's first step for every packet, in arrival order (`Accepting`): moves
    /// the replay window, tells the peer an authenticated frame arrived (confirming keys,
    /// following a roaming peer, waking the control thread when that matters), counts.
    /// Returns the packet to deliver; a keepalive ends here (`None`).
    ///
    /// # Errors
    /// [`DropReason::Replay`]; [`DropReason::Policy`] for a packet the policy does not let
    /// in.
    pub(crate) fn accept(self, shared: &Shared) -> Result<Option<Accepted>, DropReason> {
        if self.session.accept_counter(self.counter).is_err() {
            return Err(DropReason::Replay);
        }
        let confirmed = {
            let mut peer = self.peer.lock();
            peer.handle_authenticated(
                self.now,
                self.session.local_index(),
                self.from,
                self.is_data,
            );
            peer.has_events()
        };
        if confirmed {
            // Keys confirmed (or the peer moved): the control thread acts on it now, not at
            // its next wake-up: packets and DNS answers may be waiting for these keys.
            shared.wake_control_for(self.peer.id);
        }
        if !self.is_data {
            bump(&shared.counters.keepalives_received);
            return Ok(None);
        }
        let packet = HEADER_LEN..HEADER_LEN + self.plain_len;
        // Authenticated and in order: now the policy's flow table may learn from it, if the
        // peer may send from its source (otherwise the edge drops it as not certified: a
        // peer must not fill our flow table in another peer's name).
        let allowed = !shared.policy.is_on()
            || self.buf.get(packet.clone()).is_some_and(|p| {
                let certified =
                    source(p).is_some_and(|src| self.peer.blocks.iter().any(|b| b.contains(&src)));
                !certified
                    || shared
                        .policy
                        .allows(p, crate::policy::Direction::In, self.now)
            });
        if !allowed {
            bump(&shared.counters.drop_policy);
            return Err(DropReason::Policy);
        }
        self.peer.rx_packets.fetch_add(1, Ordering::Relaxed);
        self.peer
            .rx_bytes
            .fetch_add(self.plain_len as u64, Ordering::Relaxed);
        Ok(Some(Accepted {
            incoming: self,
            packet,
        }))
    }
}

/// The source address of `packet`, an IPv4 or IPv6 packet (fixed offsets, nothing checked).
fn source(packet: &[u8]) -> Option<std::net::IpAddr> {
    match packet.first()? >> 4 {
        4 => <[u8; 4]>::try_from(packet.get(12..16)?)
            .ok()
            .map(std::net::IpAddr::from),
        6 => <[u8; 16]>::try_from(packet.get(8..24)?)
            .ok()
            .map(std::net::IpAddr::from),
        _ => None,
    }
}

/// A packet out of the tunnel that the engine accepted (`Incoming::accept`: in the replay
/// window and in order, its peer told, the policy's flow table asked): what an edge's sink
/// gets. It reads as the [`Incoming`] it was; dropping it returns its buffer.
#[derive(Debug)]
pub struct Accepted {
    incoming: Incoming,
    packet: Range<usize>,
}

impl Accepted {
    /// Where the inner packet lies in the buffer.
    pub fn packet(&self) -> Range<usize> {
        self.packet.clone()
    }
}

impl std::ops::Deref for Accepted {
    type Target = Incoming;

    fn deref(&self) -> &Incoming {
        &self.incoming
    }
}

impl std::ops::DerefMut for Accepted {
    fn deref_mut(&mut self) -> &mut Incoming {
        &mut self.incoming
    }
}

/// The ingress pipeline's sink around the edge's: accepts each packet, in order, and hands
/// the edge only what was accepted (a keepalive ends here).
#[derive(Debug)]
pub(crate) struct Accepting<K> {
    sink: K,
    shared: Arc<Shared>,
}

impl<K> Accepting<K> {
    /// Around the edge's `sink`.
    pub(crate) const fn new(sink: K, shared: Arc<Shared>) -> Self {
        Self { sink, shared }
    }

    /// The edge's sink again.
    pub(crate) fn into_inner(self) -> K {
        self.sink
    }
}

impl<K: Sink<Item = Accepted>> Sink for Accepting<K> {
    type Item = Incoming;

    fn emit(&mut self, item: Incoming) -> Result<(), DropReason> {
        match item.accept(&self.shared)? {
            Some(accepted) => self.sink.emit(accepted),
            None => Ok(()),
        }
    }

    fn flush(&mut self) {
        self.sink.flush();
    }
}

/// Pre-checks replays in order; opens on the workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenStage;

impl Stage for OpenStage {
    type Item = Incoming;

    fn waited(&self, item: &Incoming) -> Option<Duration> {
        item.queued
    }

    fn bytes(&self, item: &Incoming) -> usize {
        item.len
    }

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

/// What [`arrival`] made of a datagram.
#[derive(Debug)]
pub enum Arrival {
    /// A data frame or keepalive for one of our sessions: to open, in order.
    Sealed(Incoming),
    /// A handshake message (or a cookie-reply to one of ours): for the handshake thread,
    /// once the [`crate::HandshakeGate`] lets it through.
    Handshake(HandshakeMsg),
    /// A frame of another protocol version than ours (counted; the caller may say so).
    OtherVersion(u8),
    /// Counted and dropped (truncated, malformed, unknown index, unhandled type).
    Dropped,
}

/// The first look at a datagram from the underlay, cheap checks only: length, frame header,
/// a session that knows its receiver index. Nothing is decrypted here.
pub fn arrival(shared: &Shared, buf: Buf, m: DatagramMeta, now: Instant) -> Arrival {
    let c = &shared.counters;
    bump(&c.udp_received);
    if m.truncated || m.len > BUF_LEN {
        bump(&c.udp_truncated);
        return Arrival::Dropped;
    }
    let parsed =
        Frame::new_checked(&buf[..m.len]).and_then(|f| FrameRepr::parse(&f, shared.versions));
    let repr = match parsed {
        Ok(repr) => repr,
        Err(cyphonic_wire::Error::Version(version)) => {
            bump(&c.drop_frame_version);
            return Arrival::OtherVersion(version);
        }
        Err(_) => {
            bump(&c.drop_frame_malformed);
            return Arrival::Dropped;
        }
    };
    match repr.msg_type {
        MessageType::Data | MessageType::Keepalive => {
            let found = shared.peers.by_index(repr.receiver_index).and_then(|peer| {
                let session = peer.lock().session_for_index(repr.receiver_index, now)?;
                Some((peer, session))
            });
            let Some((peer, session)) = found else {
                // No key work at all for an index we did not hand out.
                bump(&c.drop_unknown_index);
                // We may have restarted while a peer kept its keys: the control thread
                // handshakes with the peer that speaks from this address, if there is one.
                if shared.kick_gate.admit(m.from, now) {
                    let _ = shared.control.try_send(ToControl::Kick(m.from));
                }
                return Arrival::Dropped;
            };
            Arrival::Sealed(Incoming {
                buf,
                len: m.len,
                from: m.from,
                peer,
                session,
                counter: repr.counter,
                is_data: repr.msg_type == MessageType::Data,
                now,
                plain_len: 0,
                queued: m.queued,
                frame: 0..0,
            })
        }
        MessageType::Path => {
            // Opened on the control thread (a few a second at most): only the index here.
            let Some(peer) = shared.peers.by_index(repr.receiver_index) else {
                bump(&c.drop_unknown_index);
                return Arrival::Dropped;
            };
            // Per peer, whatever the source: a member spoofing many sources spends only its
            // own budget, and the control queue sees at most this much per peer.
            if !shared.path_gate.admit(peer.id, now) {
                bump(&c.drop_path_rate);
                return Arrival::Dropped;
            }
            let msg = ToControl::Path {
                peer: peer.id,
                from: m.from,
                frame: buf[..m.len].to_vec(),
            };
            if shared.control.try_send(msg).is_ok() {
                bump(&c.path_frames_received);
            } else {
                bump(&c.drop_path_rate);
            }
            Arrival::Dropped
        }
        MessageType::HandshakeResp | MessageType::CookieReply
            if shared.peers.by_index(repr.receiver_index).is_none() =>
        {
            // An answer to no handshake of ours: nothing to spend on it.
            bump(&c.drop_unknown_index);
            Arrival::Dropped
        }
        MessageType::HandshakeInit | MessageType::HandshakeResp | MessageType::CookieReply => {
            Arrival::Handshake(HandshakeMsg {
                frame: buf[..m.len].to_vec(),
                from: m.from,
                at: now,
            })
        }
        MessageType::EndpointProbe if cyphonic_control::probe::is_punch(&buf[..m.len]) => {
            bump(&c.punches_received);
            Arrival::Dropped
        }
        MessageType::EndpointProbe => {
            match cyphonic_control::parse_challenge(&buf[..m.len]) {
                Some(cookie) if shared.challenge_gate.admit(m.from, now) => {
                    bump(&c.challenges_received);
                    let _ = shared.control.try_send(ToControl::Challenge {
                        from: m.from,
                        cookie,
                    });
                }
                _ => bump(&c.drop_frame_unhandled),
            }
            Arrival::Dropped
        }
        _ => {
            bump(&c.drop_frame_unhandled);
            Arrival::Dropped
        }
    }
}

/// A receive thread: the tunnel socket's, or its sparse companion's.
#[derive(Debug)]
pub struct Receiver {
    shared: Arc<Shared>,
    socket: Box<dyn TunnelSocket>,
    into: Into,
    version_log: cyphonic_telemetry::Throttle,
}

/// Where a receive thread's frames go.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per receive thread, made once and never moved after"
)]
enum Into {
    /// The tunnel socket's: sealed frames into the ingress pipeline, handshake messages
    /// through the gate into their queue.
    Pipeline {
        seq: Sequencer<OpenStage>,
        handshakes: HandshakeQueue,
        gate: HandshakeGate,
    },
    /// The sparse companion's ([`crate::socket::sparse_program`]): flagged data frames, each
    /// opened and delivered at once on this thread ([`Lane`]). Nothing else is steered there;
    /// anything else that came would be dropped and counted.
    Lane(Lane<OpenStage>),
}

/// How often frames of another protocol version are logged, at most.
const VERSION_LOG_INTERVAL: Duration = Duration::from_secs(60);

impl Receiver {
    /// Receives on `socket`: sealed frames into `seq`, handshake messages through `gate`
    /// into `handshakes`.
    pub fn new(
        shared: Arc<Shared>,
        socket: Box<dyn TunnelSocket>,
        seq: Sequencer<OpenStage>,
        handshakes: HandshakeQueue,
        gate: HandshakeGate,
    ) -> Self {
        Self {
            shared,
            socket,
            into: Into::Pipeline {
                seq,
                handshakes,
                gate,
            },
            version_log: cyphonic_telemetry::Throttle::new(VERSION_LOG_INTERVAL),
        }
    }

    /// Receives on the tunnel socket's sparse companion: every data frame into `lane`.
    pub fn sparse(
        shared: Arc<Shared>,
        socket: Box<dyn TunnelSocket>,
        lane: Lane<OpenStage>,
    ) -> Self {
        Self {
            shared,
            socket,
            into: Into::Lane(lane),
            version_log: cyphonic_telemetry::Throttle::new(VERSION_LOG_INTERVAL),
        }
    }

    /// Lets a handshake message through the gate into its queue, or answers it with a
    /// cookie-reply, or drops it; every outcome but queueing is counted.
    fn handshake(&mut self, msg: HandshakeMsg) {
        let c = &self.shared.counters;
        let Into::Pipeline {
            handshakes, gate, ..
        } = &mut self.into
        else {
            bump(&c.drop_frame_unhandled);
            return;
        };
        let Ok(kind) = Frame::new_checked(&msg.frame[..]).map(|f| f.msg_type()) else {
            return;
        };
        let waiting = handshakes.initiations_waiting();
        let known = self.shared.known_peers();
        let admission = gate.admit(c, &msg.frame, kind, msg.from, msg.at, waiting, &known);
        drop(known);
        match admission {
            Admission::Queue => {
                if !handshakes.push(msg) {
                    bump(&c.drop_handshake_queue);
                }
            }
            Admission::Known => {
                if !handshakes.push_known(msg) {
                    bump(&c.drop_handshake_queue);
                }
            }
            Admission::Reply(reply) => {
                if self.socket.send_to(&reply, msg.from).is_ok() {
                    bump(&c.udp_sent);
                } else {
                    bump(&c.udp_send_failed);
                }
            }
            Admission::Dropped => {}
        }
    }

    /// The thread's body: runs until `shared.running` goes false.
    pub fn run(mut self) {
        let mut rx = RecvBuffers::new(0..BUF_LEN);
        let mut meta = [DatagramMeta::default(); RECV_BATCH];
        let mut queued = cyphonic_pipeline::WaitTally::default();
        let pulse = self.shared.pulses().register_here();
        while self.shared.is_running() {
            pulse.beat(Instant::now());
            // The lane reads no faster than its pace: the rest waits in its socket.
            let want = match &mut self.into {
                Into::Lane(lane) => lane.allowance(RECV_BATCH),
                Into::Pipeline { .. } => RECV_BATCH,
            };
            let socket = &mut self.socket;
            let Some(received) = rx.receive(&self.shared.pool, |slices| {
                let n = slices.len().min(want);
                socket.recv_batch(&mut slices[..n], &mut meta[..n])
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
                if let Some(d) = m.queued {
                    queued.add(d);
                }
                match arrival(&self.shared, buf, m, now) {
                    Arrival::Sealed(item) => {
                        let pushed = match &mut self.into {
                            // The sender took it ahead of its queue: it may go ahead of ours
                            // too, but never ahead of another such frame of the same peer.
                            Into::Pipeline { seq, .. }
                                if item.is_data
                                    && item.flags() & cyphonic_wire::FLAG_SPARSE != 0 =>
                            {
                                let peer = item.peer.id;
                                seq.push_flow(item, &peer)
                            }
                            Into::Pipeline { seq, .. } => seq.push(item),
                            // One at a time, in the order read: no flagged frame of a peer
                            // overtakes another.
                            Into::Lane(lane) => lane.push(item),
                        };
                        match pushed {
                            Ok(()) | Err(Rejected::Dropped(..)) => {}
                            Err(Rejected::Full(_)) => {
                                bump(&self.shared.counters.drop_pipeline_full);
                            }
                        }
                    }
                    Arrival::Handshake(msg) => self.handshake(msg),
                    Arrival::OtherVersion(version) => {
                        if let Some(held) = self.version_log.due(now) {
                            tracing::warn!(
                                from = %m.from,
                                version,
                                ours = %self.shared.versions,
                                held_back = held,
                                "a tunnel frame of a protocol version we do not speak: that end (a \
                                 peer, or the cloud) runs a release more than one apart from ours \
                                 (docs/protocol.md §2, Versions)"
                            );
                        }
                    }
                    Arrival::Dropped => {}
                }
            }
            let counters = match &mut self.into {
                Into::Pipeline { seq, .. } => {
                    seq.flush();
                    seq.counters()
                }
                Into::Lane(lane) => {
                    lane.flush();
                    lane.counters()
                }
            };
            counters.record_socket(&mut queued);
        }
        tracing::debug!("receive thread stopped");
    }
}
