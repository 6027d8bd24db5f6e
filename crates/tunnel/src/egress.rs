//! Intake, into the tunnel: the seal stage, the socket sink, and the submitter that holds
//! packets behind a pending handshake.
//!
//! ```text
//! edge thread or control thread: Intake -> Submitter -> Sequencer (session and counter in
//!   arrival order; packets for a peer whose handshake is pending wait in a bounded queue of
//!   that peer, in order, until the control core says it is up)
//! workers:     SealStage::process (ChaCha20-Poly1305 in place)
//! emitter:     SocketSink: sendmmsg, in arrival order
//! ```
//!
//! Every sealed packet leaves through the emitter: the edge's traffic and the edge's own
//! packets (the adapter's DNS answers and echo replies to peers) alike go through the one
//! [`Submitter`], behind the [`Intake`] handle that the edge thread and the control thread
//! share. Only the handshake messages and keepalives the control core builds leave outside it.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cyphonic_pipeline::{DropReason, Lane, Rejected, Sequencer, Sink, Stage};
use cyphonic_session::{SendError, Session};

use crate::Shared;
use crate::counters::bump;
use crate::peers::PeerSlot;
use crate::pool::Buf;
use crate::socket::TunnelSocket;

/// Datagrams per sendmmsg.
const SEND_BATCH: usize = 64;

/// A packet on its way into the tunnel. Its IP packet sits at `buf[HEADROOM..][..len]`.
pub struct Outgoing {
    buf: Buf,
    len: usize,
    peer: Arc<PeerSlot>,
    now: Instant,
    session: Option<Arc<Session>>,
    counter: u64,
    dest: Option<SocketAddr>,
    frame_len: usize,
    flags: u16,
    /// How long it waited in the kernel before the edge read it, if the edge knows.
    queued: Option<std::time::Duration>,
}

impl Outgoing {
    /// The IP packet at `buf[HEADROOM..][..len]`, for `peer`, arrived at `now`.
    pub fn new(buf: Buf, len: usize, peer: Arc<PeerSlot>, now: Instant) -> Self {
        Self {
            buf,
            len,
            peer,
            now,
            session: None,
            counter: 0,
            dest: None,
            frame_len: 0,
            flags: 0,
            queued: None,
        }
    }

    /// The same packet, which waited `queued` in the kernel before the edge read it (judged
    /// by the queue manager, [`crate::DataPlane::aqm`]).
    #[must_use]
    pub const fn with_queued(mut self, queued: Option<std::time::Duration>) -> Self {
        self.queued = queued;
        self
    }

    /// The IP packet, if its length fits the buffer.
    fn packet(&self) -> Option<&[u8]> {
        self.buf.get(crate::HEADROOM..crate::HEADROOM + self.len)
    }

    /// The same packet, sent with header `flags` (`cyphonic_wire::FLAG_CHECKSUM_DEFERRED`).
    #[must_use]
    pub const fn with_flags(mut self, flags: u16) -> Self {
        self.flags = flags;
        self
    }
}

/// Picks the session and counter in order; seals on the workers.
#[derive(Debug)]
pub struct SealStage {
    shared: Arc<Shared>,
}

impl SealStage {
    /// The stage over `shared`'s peers.
    pub const fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
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
            self.shared.wake_control_for(item.peer.id);
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

    fn waited(&self, item: &Outgoing) -> Option<std::time::Duration> {
        item.queued
    }

    fn bytes(&self, item: &Outgoing) -> usize {
        item.len
    }

    fn expressed(&self, item: &mut Outgoing) {
        // The receiver may take it ahead of its own queue too (docs/protocol.md §1).
        item.flags |= cyphonic_wire::FLAG_SPARSE;
    }

    fn process(&self, item: &mut Outgoing) -> Result<(), DropReason> {
        let session = item.session.as_ref().ok_or(DropReason::NoSession)?;
        item.frame_len = session
            .seal_flagged(item.counter, &mut item.buf[..], item.len, item.flags)
            .map_err(|_| DropReason::TooBig)?;
        Ok(())
    }
}

/// The egress emitter's end: batches sealed frames into sendmmsg, in order.
#[derive(Debug)]
pub struct SocketSink {
    shared: Arc<Shared>,
    socket: Box<dyn TunnelSocket>,
    batch: Vec<Outgoing>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("len", &self.len)
            .field("peer", &self.peer.id)
            .finish_non_exhaustive()
    }
}

impl SocketSink {
    /// The sink sending on `socket`.
    pub fn new(shared: Arc<Shared>, socket: Box<dyn TunnelSocket>) -> Self {
        Self {
            shared,
            socket,
            batch: Vec::with_capacity(SEND_BATCH),
        }
    }
}

impl Sink for SocketSink {
    type Item = Outgoing;

    fn emit(&mut self, item: Outgoing) -> Result<(), DropReason> {
        if item.dest.is_none() {
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
        let (sent, failed, err) = self.socket.send_batch(&msgs[..n]);
        let c = &self.shared.counters;
        c.udp_sent.fetch_add(sent as u64, Ordering::Relaxed);
        if failed > 0 {
            c.udp_send_failed
                .fetch_add(failed as u64, Ordering::Relaxed);
            tracing::debug!(failed, error = ?err, "the kernel refused tunnel datagrams");
        }
        // Their buffers go back to the pool.
        self.batch.clear();
    }
}

/// The way into the tunnel: hands packets to the pipeline, or holds them behind their peer's
/// pending handshake (bounded, in order) until the control core says the peer is up
/// ([`Submitter::established`]) or gave up ([`Submitter::gave_up`]). Reached through an
/// [`Intake`] handle.
#[derive(Debug)]
pub struct Submitter {
    shared: Arc<Shared>,
    seq: Sequencer<SealStage>,
    pending: HashMap<u32, VecDeque<Outgoing>>,
    /// Packets in `pending`, all peers together.
    queued: usize,
    queue_per_peer: usize,
    /// At most this many packets wait in all: many pending peers cannot take the pool's
    /// buffers from everything else (capture, the LAN services, established tunnels).
    queue_total: usize,
}

/// The share of the packet buffers that packets waiting for handshakes may hold, all peers
/// together.
pub const QUEUED_SHARE_OF_BUFFERS: usize = 4;

impl Submitter {
    /// Submits to `seq`, holding at most `queue_per_peer` packets per pending peer and
    /// `queue_total` in all.
    pub fn new(
        shared: Arc<Shared>,
        seq: Sequencer<SealStage>,
        queue_per_peer: usize,
        queue_total: usize,
    ) -> Self {
        Self {
            shared,
            seq,
            pending: HashMap::new(),
            queued: 0,
            queue_per_peer,
            queue_total,
        }
    }

    /// Queues `item` at the back of its peer's queue `id`, or counts it dropped when that
    /// queue, or all queues together, are full.
    fn enqueue(&mut self, id: u32, item: Outgoing) {
        let q = self.pending.entry(id).or_default();
        if q.len() >= self.queue_per_peer || self.queued >= self.queue_total {
            bump(&self.shared.counters.drop_queue);
        } else {
            bump(&self.shared.counters.queued_for_handshake);
            item.peer.held.fetch_add(1, Ordering::Relaxed);
            q.push_back(item);
            self.queued += 1;
        }
    }

    /// Hands a packet to the pipeline, or queues it behind its peer's pending handshake.
    /// A peer with queued packets gets new ones queued too, so nothing overtakes them.
    /// A new flow no rule allows is dropped here, before it costs a handshake or a seal
    /// (counted by the policy).
    pub fn submit(&mut self, item: Outgoing) {
        if !allowed(&self.shared, &item) {
            return;
        }
        let packet = item.packet();
        let id = item.peer.id;
        if self.pending.get(&id).is_some_and(|q| !q.is_empty()) {
            self.enqueue(id, item);
            return;
        }
        // A packet of a sparse flow may go ahead of bulk flows' batches (never of its own).
        let flow = packet.and_then(cyphonic_filter::flow_of);
        let pushed = match flow {
            Some(flow) => self.seq.push_flow(item, &flow),
            None => self.seq.push(item),
        };
        match pushed {
            Ok(()) => {}
            Err(Rejected::Dropped(item, DropReason::NoSession)) => self.enqueue(id, item),
            Err(Rejected::Full(_)) => bump(&self.shared.counters.drop_pipeline_full),
            Err(Rejected::Dropped(..)) => {}
        }
    }

    /// Sends what the pipeline holds in its current batch on its way.
    pub fn flush(&mut self) {
        self.seq.flush();
    }

    /// Peer `id` has keys: what waited for them goes, in order.
    pub fn established(&mut self, id: u32) {
        let Some(mut q) = self.pending.remove(&id) else {
            return;
        };
        let now = Instant::now();
        while let Some(mut item) = q.pop_front() {
            item.now = now;
            let slot = item.peer.clone();
            // Queued as their flows' packets: a later packet of the same flow must not take
            // the express lane past them.
            let flow = item.packet().and_then(cyphonic_filter::flow_of);
            let pushed = match flow {
                Some(flow) => self.seq.push_behind(item, &flow),
                None => self.seq.push(item),
            };
            match pushed {
                Ok(()) => self.released(&slot),
                Err(Rejected::Dropped(item, DropReason::NoSession)) => {
                    // Not usable after all (expired again): keep waiting, in order.
                    q.push_front(item);
                    self.pending.insert(id, q);
                    break;
                }
                Err(_) => {
                    self.released(&slot);
                    bump(&self.shared.counters.drop_queue);
                }
            }
        }
        self.seq.flush();
    }

    /// Peer `id` cannot be reached: what waited for it is dropped.
    pub fn gave_up(&mut self, id: u32) {
        for item in self.pending.remove(&id).unwrap_or_default() {
            self.released(&item.peer);
            bump(&self.shared.counters.drop_queue);
        }
    }

    /// A packet of `peer`'s that waited behind its handshake left the queue.
    fn released(&mut self, peer: &PeerSlot) {
        self.queued -= 1;
        peer.held.fetch_sub(1, Ordering::Relaxed);
    }

    /// The pipeline's counters.
    pub fn counters(&self) -> &Arc<cyphonic_pipeline::Counters> {
        self.seq.counters()
    }
}

/// Whether the policy lets `item` out: a new flow no rule allows is dropped before it costs
/// a handshake or a seal (counted by the policy, and as `drop_policy`).
fn allowed(shared: &Shared, item: &Outgoing) -> bool {
    let ok = item.packet().is_some_and(|p| {
        shared
            .policy
            .allows(p, crate::policy::Direction::Out, item.now)
    });
    if !ok {
        bump(&shared.counters.drop_policy);
    }
    ok
}

/// Where an edge thread's packets go into the tunnel: the [`Submitter`] (under the
/// [`Intake`]'s lock), or the sparse lane's own ([`SparseSubmitter`]).
pub trait Submit {
    /// The packet at `buf[HEADROOM..][..len]` for the peer whose block holds `dst`, sent with
    /// header `flags`, or counted and dropped when no peer's block does; it arrived at `now`
    /// after waiting `queued` in the kernel ([`Outgoing::with_queued`]).
    fn route(
        &mut self,
        buf: Buf,
        len: usize,
        dst: std::net::IpAddr,
        flags: u16,
        at: (Instant, Option<std::time::Duration>),
    ) {
        if let Some(item) = outgoing(self.shared(), buf, len, dst, flags, at) {
            self.submit(item);
        }
    }

    /// Sends one packet into the tunnel (or holds it behind its peer's handshake).
    fn submit(&mut self, item: Outgoing);

    /// Sends what was gathered on its way (call after each batch read).
    fn flush(&mut self);

    /// The counters of the pipeline it feeds.
    fn counters(&self) -> &Arc<cyphonic_pipeline::Counters>;

    /// The state the engine's threads share.
    fn shared(&self) -> &Shared;
}

impl Submit for Submitter {
    fn submit(&mut self, item: Outgoing) {
        Self::submit(self, item);
    }

    fn flush(&mut self) {
        Self::flush(self);
    }

    fn counters(&self) -> &Arc<cyphonic_pipeline::Counters> {
        Self::counters(self)
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// The packet for the peer whose block holds `dst`; `None` (counted, the control core told
/// when a dormant peer may cover it) when no peer's does.
fn outgoing(
    shared: &Shared,
    buf: Buf,
    len: usize,
    dst: std::net::IpAddr,
    flags: u16,
    (now, queued): (Instant, Option<std::time::Duration>),
) -> Option<Outgoing> {
    let Some(peer) = shared.peers.route(dst) else {
        bump(&shared.counters.drop_no_peer);
        // An idle peer evicted from the table may cover it: the control core asks the
        // cloud to pair us again (TCP's retransmission then finds the tunnel).
        if shared.dormant.load(Ordering::Relaxed) > 0 && shared.wake_gate.admit(dst, now) {
            let _ = shared.control.try_send(crate::ToControl::NoRoute(dst));
        }
        return None;
    };
    Some(
        Outgoing::new(buf, len, peer, now)
            .with_flags(flags)
            .with_queued(queued),
    )
}

/// The way into the tunnel for a thread that reads only sparse traffic (the adapter's sparse
/// capture socket): each packet is sealed and sent at once on that thread ([`Lane`]),
/// flagged `FLAG_SPARSE` while its flow keeps to the sparse pace. A packet whose peer has no
/// keys yet, or has packets waiting for them, goes through the [`Intake`] instead, behind
/// them.
#[derive(Debug)]
pub struct SparseSubmitter {
    shared: Arc<Shared>,
    lane: Lane<SealStage>,
    intake: Intake,
}

impl SparseSubmitter {
    /// Sends through `lane`, falling back on `intake`.
    pub const fn new(shared: Arc<Shared>, lane: Lane<SealStage>, intake: Intake) -> Self {
        Self {
            shared,
            lane,
            intake,
        }
    }

    /// How many packets the lane may take now, at most `want` (waits for one): read no more.
    pub fn allowance(&mut self, want: usize) -> usize {
        self.lane.allowance(want)
    }

    /// Through the submitter, behind what waits there; false once the engine stopped.
    fn behind(&self, item: Outgoing) -> bool {
        let mut guard = self.intake.lock();
        let Some(sub) = guard.as_mut() else {
            return false;
        };
        sub.submit(item);
        sub.flush();
        true
    }
}

impl Submit for SparseSubmitter {
    fn submit(&mut self, item: Outgoing) {
        if !allowed(&self.shared, &item) {
            return;
        }
        if item.peer.held.load(Ordering::Relaxed) > 0 {
            self.behind(item);
            return;
        }
        let flow = item.packet().and_then(cyphonic_filter::flow_of);
        let pushed = match flow {
            Some(flow) => self.lane.push_flow(item, &flow),
            None => self.lane.push(item),
        };
        match pushed {
            // No keys yet: it waits for the handshake with the rest.
            Err(Rejected::Dropped(item, DropReason::NoSession)) => {
                self.behind(item);
            }
            Ok(()) | Err(Rejected::Dropped(..)) => {}
            Err(Rejected::Full(_)) => bump(&self.shared.counters.drop_pipeline_full),
        }
    }

    fn flush(&mut self) {
        self.lane.flush();
    }

    /// The egress pipeline's counters (the lane counts there).
    fn counters(&self) -> &Arc<cyphonic_pipeline::Counters> {
        self.lane.counters()
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// A handle on the engine's one [`Submitter`], shared by the threads that send into the
/// tunnel: the edge thread (a batch at a time), the control thread (packets of the edge's own,
/// queues released when a peer comes up). One submitter keeps one arrival order and one
/// sequencer, whoever submits; the lock is held for a batch at most, never across a wait.
///
/// Once the engine stops, the submitter is gone ([`Intake::lock`] holds `None`) and its
/// pipeline drains, whatever handles are still around.
#[derive(Debug, Clone)]
pub struct Intake {
    inner: Arc<Mutex<Option<Submitter>>>,
}

impl Intake {
    /// A handle on `submitter`.
    pub fn new(submitter: Submitter) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Some(submitter))),
        }
    }

    /// The submitter, locked; `None` once the engine stopped. Never call this while holding
    /// a peer's lock (the submitter takes peers' locks).
    pub fn lock(&self) -> MutexGuard<'_, Option<Submitter>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Submits one packet and sends it on its way at once (a packet of the edge's own).
    /// Returns false when the engine stopped.
    pub fn submit_now(&self, item: Outgoing) -> bool {
        let mut guard = self.lock();
        let Some(sub) = guard.as_mut() else {
            return false;
        };
        sub.submit(item);
        sub.flush();
        true
    }

    /// Takes the submitter out (the engine stops): its pipeline drains.
    pub(crate) fn close(&self) {
        drop(self.lock().take());
    }
}
