//! The handshake thread: every handshake message from the underlay is answered here, off the
//! control thread that also serves timers, the cloud and the edge's services (DHCP, DNS).
//! An initiation costs Diffie-Hellman operations and a signature check before we know
//! whether it is genuine; here a flood of them costs this thread, never the others.
//!
//! ```text
//! receive thread --(responses and cookie-replies, 64)-> handshake thread: those first,
//!  (HandshakeGate)--(known peers' initiations, 64)---->  then these,
//!                 --(initiations, 256)----------------->  read_init / handle_init /
//!                                                         handle_response / handle_cookie_reply
//!                                         -> the peer's transmits, on the tunnel socket
//!                                         -> keys changed: wake the control thread
//!                                         -> a stranger with a valid certificate: ToControl
//! ```
//!
//! Each class has its own bounded queue, and responses (to handshakes we started: rekeys,
//! new peers) are served before initiations, so no flood of initiations delays a response;
//! under load, a known peer's initiation (the gate knows its hint or its endpoint) is served
//! before the rest, so a flood neither delays nor crowds out a peer coming back.
//! What gets into the queues at all is the receive thread's [`crate::HandshakeGate`]'s call.
//! A full queue drops the message and counts it (`drop_handshake_queue`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use cyphonic_session::{HandshakeError, read_init};
use cyphonic_wire::{Frame, MessageType};

use crate::counters::bump;
use crate::peers::PeerSlot;
use crate::socket::TunnelSocket;
use crate::{Shared, ToControl};

/// Initiations waiting at most: about a tenth of a second of work on a Pi 4.
pub const INITIATIONS: usize = 256;
/// Responses waiting at most (one per handshake we started, and those are few at a time).
const RESPONSES: usize = 64;
/// Known peers' initiations waiting at most, under load (each hint at most a few a second).
const KNOWN: usize = 64;
/// How often an idle handshake thread looks whether the engine is stopping.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// A handshake message from the underlay.
#[derive(Debug)]
pub struct HandshakeMsg {
    /// The whole frame.
    pub frame: Vec<u8>,
    /// Its sender.
    pub from: SocketAddr,
    /// When it arrived.
    pub at: Instant,
}

/// The receive thread's end of the handshake queues.
#[derive(Debug, Clone)]
pub struct HandshakeQueue {
    initiations: Sender<HandshakeMsg>,
    responses: Sender<HandshakeMsg>,
    known: Sender<HandshakeMsg>,
}

impl HandshakeQueue {
    /// Queues `msg` by its type (responses and cookie-replies, answers to handshakes we
    /// started, in one queue; anything else counts as an initiation); false when its queue
    /// is full (or the handshake thread is gone).
    pub fn push(&self, msg: HandshakeMsg) -> bool {
        let queue = match Frame::new_checked(&msg.frame[..]).map(|f| f.msg_type()) {
            Ok(MessageType::HandshakeResp | MessageType::CookieReply) => &self.responses,
            _ => &self.initiations,
        };
        queue.try_send(msg).is_ok()
    }

    /// Queues a known peer's initiation (the gate said so under load) ahead of the others;
    /// false when its queue is full (or the handshake thread is gone).
    pub fn push_known(&self, msg: HandshakeMsg) -> bool {
        self.known.try_send(msg).is_ok()
    }

    /// Initiations waiting: how loaded the handshake thread is.
    pub fn initiations_waiting(&self) -> usize {
        self.initiations.len()
    }
}

/// The handshake thread's state. See the module docs.
pub struct Handshakes {
    shared: Arc<Shared>,
    socket: Box<dyn TunnelSocket>,
    initiations: Receiver<HandshakeMsg>,
    responses: Receiver<HandshakeMsg>,
    known: Receiver<HandshakeMsg>,
    refusal_log: cyphonic_telemetry::Throttle,
}

impl std::fmt::Debug for Handshakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshakes")
            .field("initiations", &self.initiations.len())
            .field("responses", &self.responses.len())
            .field("known", &self.known.len())
            .finish_non_exhaustive()
    }
}

impl Handshakes {
    /// The handshake thread's state and the queue that feeds it, answering as the shared
    /// state's identity of the moment on `socket`.
    pub fn new(shared: Arc<Shared>, socket: Box<dyn TunnelSocket>) -> (Self, HandshakeQueue) {
        let (initiations_tx, initiations) = crossbeam_channel::bounded(INITIATIONS);
        let (responses_tx, responses) = crossbeam_channel::bounded(RESPONSES);
        let (known_tx, known) = crossbeam_channel::bounded(KNOWN);
        (
            Self {
                shared,
                socket,
                initiations,
                responses,
                known,
                refusal_log: cyphonic_telemetry::Throttle::new(Duration::from_secs(1)),
            },
            HandshakeQueue {
                initiations: initiations_tx,
                responses: responses_tx,
                known: known_tx,
            },
        )
    }

    /// The thread's body: runs until the engine stops.
    pub fn run(mut self) {
        let pulse = self.shared.pulses().register_here();
        while self.shared.is_running() {
            pulse.beat(Instant::now());
            if let Some(msg) = self.next() {
                self.handle(&msg);
            }
        }
        tracing::debug!("handshake thread stopped");
    }

    /// The next message: a waiting response first, then a known peer's initiation, then
    /// any other.
    fn next(&self) -> Option<HandshakeMsg> {
        if let Ok(msg) = self.responses.try_recv() {
            return Some(msg);
        }
        if let Ok(msg) = self.known.try_recv() {
            return Some(msg);
        }
        crossbeam_channel::select! {
            recv(self.responses) -> msg => msg.ok(),
            recv(self.known) -> msg => msg.ok(),
            recv(self.initiations) -> msg => msg.ok(),
            default(IDLE_POLL) => None,
        }
    }

    /// Counts a refused handshake message under `kind`, and logs it (at most once a second:
    /// a flood of forged initiations must not become a flood of log lines).
    fn refused(&mut self, kind: &'static str, from: SocketAddr, what: &dyn std::fmt::Display) {
        bump(&self.shared.counters.handshake_refused);
        *self
            .shared
            .handshake_refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(kind)
            .or_default() += 1;
        if let Some(held) = self.refusal_log.due(Instant::now()) {
            tracing::warn!(%from, reason = kind, held_back = held, "handshake refused: {what}");
        }
    }

    /// Counts and logs what peer `slot`'s state machine refused, naming the peer.
    fn refused_by(&mut self, slot: &PeerSlot, from: SocketAddr, e: &HandshakeError) {
        let what = format!("{}: {e}", slot.name);
        self.refused(e.kind(), from, &what);
    }

    /// Answers one handshake message.
    pub fn handle(&mut self, msg: &HandshakeMsg) {
        let HandshakeMsg { frame, from, at } = msg;
        let (frame, from, at) = (&frame[..], *from, *at);
        let Ok(view) = Frame::new_checked(frame) else {
            return;
        };
        match view.msg_type() {
            MessageType::HandshakeInit => {
                bump(&self.shared.counters.handshake_inits);
                let identity = self.shared.identity();
                let init = match read_init(&identity, self.shared.clock.unix_secs(at), frame) {
                    Ok(init) => init,
                    Err(e) => {
                        self.refused(e.kind(), from, &e);
                        return;
                    }
                };
                let Some(slot) = self.shared.peers.by_key(&init.remote_static) else {
                    let what = format!("{} is not one of our peers", init.cert.body().name);
                    self.refused("not_a_peer", from, &what);
                    let _ = self.shared.control.try_send(ToControl::UnknownPeer {
                        certificate: Box::new(init.cert),
                        from,
                        at,
                    });
                    return;
                };
                let result = slot.lock().handle_init(at, from, init);
                if let Err(e) = result {
                    self.refused_by(&slot, from, &e);
                }
                self.flush(&slot);
            }
            MessageType::CookieReply => {
                let Some(slot) = self.shared.peers.by_index(view.receiver_index()) else {
                    self.refused(
                        "unknown_index",
                        from,
                        &"a cookie-reply for no handshake of ours",
                    );
                    return;
                };
                let result = slot.lock().handle_cookie_reply(at, frame);
                match result {
                    Ok(()) => bump(&self.shared.counters.cookie_replies_received),
                    Err(e) => self.refused_by(&slot, from, &e),
                }
            }
            MessageType::HandshakeResp => {
                bump(&self.shared.counters.handshake_responses);
                let Some(slot) = self.shared.peers.by_index(view.receiver_index()) else {
                    self.refused(
                        "unknown_index",
                        from,
                        &"a response for no handshake of ours",
                    );
                    return;
                };
                let result = slot.lock().handle_response(at, from, frame);
                if let Err(e) = result {
                    self.refused_by(&slot, from, &e);
                }
                self.flush(&slot);
            }
            _ => {}
        }
    }

    /// Sends what the peer wants sent (a response, the keepalive that confirms new keys);
    /// what happened to it (keys, a new address) is the control thread's to act on, so it
    /// is woken.
    fn flush(&self, slot: &Arc<PeerSlot>) {
        let (transmits, events) = {
            let mut peer = slot.lock();
            let transmits: Vec<_> = std::iter::from_fn(|| peer.poll_transmit()).collect();
            (transmits, peer.has_events())
        };
        crate::control::send_transmits(&self.shared, &*self.socket, slot, transmits);
        if events {
            self.shared.wake_control_for(slot.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Link, test_ca, test_identity};

    fn frame(kind: MessageType, receiver: u32) -> Vec<u8> {
        let mut f = vec![1, u8::from(kind), 0, 0];
        f.extend(receiver.to_be_bytes());
        f.extend([0; 8]);
        f.resize(16 + 200, 0x5a);
        f
    }

    /// A flood of initiations fills only its own queue: a response still gets in, and it is
    /// the first message the handshake thread takes.
    #[test]
    fn responses_have_their_own_queue_and_go_first() {
        let (identity, _) = test_identity(&test_ca(), "gw1.ovl.example", "100.64.1.0/24");
        let local = crate::Local {
            identity,
            clock: cyphonic_session::Clock::new(Instant::now(), Duration::ZERO),
            timing: cyphonic_session::Timing::default(),
            aead: cyphonic_crypto::Backend::default(),
        };
        let (shared, _rx) = Shared::new(local, 16, 16);
        let socket = Link::new(1).socket(SocketAddr::from(([192, 0, 2, 1], 51820)));
        let (handshakes, queue) = Handshakes::new(Arc::new(shared), Box::new(socket));
        let msg = |kind| HandshakeMsg {
            frame: frame(
                kind,
                if kind == MessageType::HandshakeInit {
                    0
                } else {
                    7
                },
            ),
            from: SocketAddr::from(([203, 0, 113, 9], 4000)),
            at: Instant::now(),
        };
        for _ in 0..INITIATIONS {
            assert!(queue.push(msg(MessageType::HandshakeInit)));
        }
        assert!(!queue.push(msg(MessageType::HandshakeInit)), "full");
        assert!(queue.push(msg(MessageType::HandshakeResp)));
        let first = handshakes.next().expect("a message");
        assert_eq!(first.frame[1], u8::from(MessageType::HandshakeResp));
        let second = handshakes.next().expect("a message");
        assert_eq!(second.frame[1], u8::from(MessageType::HandshakeInit));
    }
}
