//! The control core, on the control thread (a small tokio runtime): handshake messages, the
//! peers' timers (handshakes, keepalives, rekeys, expiry) and events, the cloud's events and
//! answers, and each cloud peer's route (relay binds, relay requests). The binary's control
//! loop calls into it alongside its own services; what concerns them comes back through
//! [`Hooks`]. Nothing here ever makes a data thread wait.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use cyphonic_netio::UdpSocket;
use cyphonic_session::{Clock, Event, Identity, read_init};
use cyphonic_signal::{NameRecord, RelayInfo};
use cyphonic_wire::{Frame, MessageType};
use tokio::sync::mpsc;

use crate::cloud::{CloudAnswer, CloudLink, Settled};
use crate::counters::bump;
use crate::peers::{PeerSlot, Relay};
use crate::{Shared, ToControl, ToEgress};

/// At most one handshake started because of unknown-index traffic per peer per this interval.
const KICK_INTERVAL: Duration = Duration::from_secs(1);
/// Initiations to a peer from the cloud unanswered this long: the direct path does not work,
/// ask the cloud for a relay. (Both sides initiate at once, so an answer normally comes
/// within a round trip; the first retry goes out after 1 s.)
const DIRECT_PATIENCE: Duration = Duration::from_secs(2);
/// At most one relay request per peer per this interval.
const RELAY_ASK_EVERY: Duration = Duration::from_secs(10);
/// A relayed peer's bind is sent again this often: a NAT may have moved our address, and
/// the channel must know where we are.
const RELAY_BIND_EVERY: Duration = Duration::from_secs(20);

/// What the engine tells the binary's services.
pub trait Hooks {
    /// A peer's keys are usable: what waited for it may go.
    fn peer_up(&mut self, peer: u32);
    /// A peer could not be reached: what waited for it is dropped.
    fn peer_gave_up(&mut self, peer: u32);
    /// A DNS question parked for the cloud is settled (the cloud's answer, or the tunnel it
    /// waited for came up or gave up).
    fn settled(&mut self, settled: Settled);
}

/// The control core. See the module docs.
pub struct Control {
    shared: Arc<Shared>,
    identity: Arc<Identity>,
    udp: UdpSocket,
    to_egress: Sender<ToEgress>,
    clock: Clock,
    kicks: HashMap<u32, Instant>,
    admissions: HashMap<String, Instant>,
    refusal_log: cyphonic_telemetry::Throttle,
    /// The control plane, when configured.
    pub cloud: Option<CloudLink>,
    /// The data threads' messages.
    pub rx: mpsc::Receiver<ToControl>,
    /// The cloud's answers to DNS questions ([`crate::Asker`]).
    pub cloud_answers: mpsc::Receiver<CloudAnswer>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("cloud", &self.cloud)
            .finish_non_exhaustive()
    }
}

/// The next event of the signal client, or never without a cloud (a free function, so that a
/// `select!` can wait on it and on `Control`'s other receivers at once).
pub async fn cloud_event(cloud: &mut Option<CloudLink>) -> Option<cyphonic_signal::Event> {
    match cloud {
        Some(c) => c.events.recv().await,
        None => std::future::pending().await,
    }
}

/// Binds our tunnel socket's address to a relay channel.
fn bind(udp: &UdpSocket, relay: &Relay) {
    let frame = cyphonic_signal::probe_frame(&relay.token);
    if let Err(e) = udp.send_to(&frame, relay.address) {
        tracing::debug!(relay = %relay.address, error = %e, "relay bind not sent");
    }
}

impl Control {
    /// The core over `shared`, sending handshakes on `udp` and telling the egress thread
    /// about peers through `to_egress`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: Arc<Shared>,
        identity: Arc<Identity>,
        udp: UdpSocket,
        to_egress: Sender<ToEgress>,
        clock: Clock,
        cloud: Option<CloudLink>,
        rx: mpsc::Receiver<ToControl>,
        cloud_answers: mpsc::Receiver<CloudAnswer>,
    ) -> Self {
        Self {
            shared,
            identity,
            udp,
            to_egress,
            clock,
            kicks: HashMap::new(),
            admissions: HashMap::new(),
            refusal_log: cyphonic_telemetry::Throttle::new(Duration::from_secs(1)),
            cloud,
            rx,
            cloud_answers,
        }
    }

    /// The next moment a peer's timer is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.shared
            .peers
            .all()
            .iter()
            .filter_map(|s| s.lock().poll_timeout())
            .min()
    }

    /// Keeps what we register with the cloud current: `names`, changed when `version` is.
    pub fn register(&mut self, version: u64, names: &[NameRecord]) {
        if let Some(c) = self.cloud.as_mut()
            && c.registered != Some(version)
        {
            c.handle.register(c.endpoints.clone(), names.to_vec());
            c.registered = Some(version);
        }
    }

    /// Runs the peers' timers due at `now`, and keeps the cloud peers' routes.
    pub fn run_timers(&mut self, now: Instant, hooks: &mut impl Hooks) {
        let slots = self.shared.peers.all();
        for slot in &slots {
            let mut peer = slot.lock();
            if peer.poll_timeout().is_some_and(|t| t <= now) {
                peer.handle_timeout(now);
            }
            let unanswered = peer
                .unanswered_since()
                .filter(|_| !peer.is_established(now));
            drop(peer);
            self.drain(slot, hooks);
            self.keep_route(slot, unanswered, now);
        }
    }

    /// Handles a message from a data thread.
    pub fn handle(&mut self, msg: ToControl, hooks: &mut impl Hooks) {
        match msg {
            ToControl::Handshake { frame, from, at } => self.handshake(&frame, from, at, hooks),
            ToControl::Kick(id) => {
                let now = Instant::now();
                if self
                    .kicks
                    .get(&id)
                    .is_some_and(|t| now.saturating_duration_since(*t) < KICK_INTERVAL)
                {
                    return;
                }
                self.kicks.insert(id, now);
                if let Some(slot) = self.shared.peers.by_index(id << 8) {
                    tracing::info!(peer = %slot.name, "traffic on unknown keys from the peer's address: handshaking");
                    let _ = slot.lock().initiate(now);
                    self.drain(&slot, hooks);
                }
            }
            ToControl::NetworkChanged => self.network_changed(hooks),
        }
    }

    /// Our addresses or routes changed (a DHCP renewal with a new address, an uplink
    /// failover): a peer that only sends to us would go on sending to where we were, and a
    /// relay channel would go on forwarding there. Show every peer with keys where we are
    /// now (an authenticated keepalive, which it follows), bind to our relay channels again,
    /// and have the cloud probe us again.
    fn network_changed(&mut self, hooks: &mut impl Hooks) {
        let now = Instant::now();
        bump(&self.shared.counters.network_changes);
        let slots = self.shared.peers.all();
        tracing::debug!(
            peers = slots.len(),
            "our addresses or routes changed: telling peers and the cloud where we are"
        );
        for slot in &slots {
            if let Some(r) = slot.route().relay.as_mut() {
                r.bound_at = Some(now);
                bind(&self.udp, r);
            }
            slot.lock().local_address_changed(now);
            self.drain(slot, hooks);
        }
        if let Some(c) = self.cloud.as_ref() {
            c.handle.network_changed();
        }
    }

    /// Handles an event of the signal client.
    pub fn handle_cloud_event(&mut self, event: cyphonic_signal::Event, hooks: &mut impl Hooks) {
        use cyphonic_signal::Event as E;
        {
            let mut st = self
                .shared
                .cloud
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match &event {
                E::Connected { .. } => {
                    st["connected"] = true.into();
                    st["last_error"] = serde_json::Value::Null;
                }
                E::Disconnected { reason } | E::Refused { reason } => {
                    st["connected"] = false.into();
                    st["last_error"] = reason.clone().into();
                }
                E::Observed(addr) => st["observed"] = addr.to_string().into(),
                _ => {}
            }
        }
        match event {
            E::Probe { to, frame } => {
                if let Err(e) = self.udp.send_to(&frame, to) {
                    tracing::debug!(%to, error = %e, "endpoint probe not sent");
                }
            }
            E::Expect(info) => {
                let now = Instant::now();
                let Some(slot) = self
                    .cloud
                    .as_ref()
                    .and_then(|c| c.peer(&self.shared, &info, now))
                else {
                    return;
                };
                // Both sides initiate at once: each side's initiation opens its NAT for the
                // other's (hole punching).
                tracing::info!(peer = %slot.name, endpoints = ?info.endpoints, relay = ?info.relay.as_ref().map(|r| r.address), "the cloud asks us to expect a peer: handshaking");
                self.apply_relay(&slot, info.relay.as_ref(), now, hooks);
                if !slot.lock().is_established(now) {
                    let _ = slot.lock().initiate(now);
                }
                self.drain(&slot, hooks);
            }
            E::Observed(addr) => {
                tracing::info!(%addr, "the cloud sees our tunnel socket at this address");
            }
            E::Connected { observed } => {
                tracing::info!(%observed, "control plane: connected");
            }
            E::Disconnected { reason } => {
                tracing::warn!(%reason, "control plane: disconnected; existing tunnels carry on");
            }
            E::Refused { reason } => {
                tracing::error!(%reason, "control plane: the cloud refused our certificate");
            }
            E::NotPaired { peer, reason } => {
                tracing::warn!(%peer, %reason, "the cloud will not pair us with a peer");
            }
            E::NamesRefused(names) => {
                for (name, reason) in names {
                    tracing::warn!(%name, %reason, "the cloud refused a name");
                }
            }
            _ => {}
        }
    }

    /// The cloud answered a DNS question: settle it now, or once its tunnel is up.
    pub fn cloud_answered(&mut self, answer: CloudAnswer, hooks: &mut impl Hooks) {
        let now = Instant::now();
        let Some(c) = self.cloud.as_mut() else {
            return;
        };
        let (settled, slot) = c.answered(&self.shared, answer, now);
        if let Some(s) = settled {
            hooks.settled(s);
        }
        if let Some((slot, relay)) = slot {
            self.apply_relay(&slot, relay.as_ref(), now, hooks);
            let _ = slot.lock().initiate(now);
            self.drain(&slot, hooks);
        }
    }

    /// A valid node we do not know is handshaking with us (we restarted, and it still has us
    /// as a peer): ask the cloud whether it may, at most once per [`KICK_INTERVAL`] per node.
    /// If so, the cloud's answer adds it, and its next initiation (or ours) succeeds.
    fn admit(&mut self, cert: &cyphonic_crypto::Certificate, from: SocketAddr, at: Instant) {
        let name = &cert.body().name;
        let Some(cloud) = self.cloud.as_ref() else {
            tracing::warn!(%from, %name, "handshake from a valid node that is not one of our peers");
            return;
        };
        let fingerprint = cert.fingerprint().to_string();
        if self
            .admissions
            .get(&fingerprint)
            .is_some_and(|t| at.saturating_duration_since(*t) < KICK_INTERVAL)
        {
            return;
        }
        if self.admissions.len() > 4096 {
            self.admissions.clear();
        }
        self.admissions.insert(fingerprint.clone(), at);
        match cloud.handle.admit(&fingerprint) {
            Ok(()) => {
                tracing::info!(%from, %name, "handshake from a node we do not know: asking the cloud");
            }
            Err(e) => {
                tracing::warn!(%from, %name, error = %e, "handshake from a node we do not know, and the cloud cannot be asked");
            }
        }
    }

    /// Keeps a cloud peer's path working: binds to its relay channel again now and then, and
    /// asks the cloud for a relay when initiations go unanswered.
    fn keep_route(&mut self, slot: &Arc<PeerSlot>, unanswered: Option<Instant>, now: Instant) {
        if slot.origin != "cloud" {
            return;
        }
        let mut route = slot.route();
        if let Some(r) = route.relay.as_mut()
            && r.bound_at
                .is_none_or(|t| now.saturating_duration_since(t) >= RELAY_BIND_EVERY)
        {
            r.bound_at = Some(now);
            bind(&self.udp, r);
        }
        let Some(since) = unanswered else {
            return;
        };
        let Some(cloud) = self.cloud.as_ref() else {
            return;
        };
        if now.saturating_duration_since(since) < DIRECT_PATIENCE
            || route
                .relay_asked
                .is_some_and(|t| now.saturating_duration_since(t) < RELAY_ASK_EVERY)
        {
            return;
        }
        route.relay_asked = Some(now);
        let relayed = route.relay.is_some();
        drop(route);
        match cloud.handle.request_relay(&slot.fingerprint) {
            Ok(()) => tracing::info!(
                peer = %slot.name,
                relayed,
                "no answer to handshakes on this path: asking the cloud for a relay"
            ),
            Err(e) => tracing::debug!(peer = %slot.name, error = %e, "relay not requested"),
        }
    }

    /// Applies the relay the cloud gave for `slot` (if any): bind to the channel, and send
    /// handshakes there from now on.
    fn apply_relay(
        &mut self,
        slot: &Arc<PeerSlot>,
        relay: Option<&RelayInfo>,
        now: Instant,
        hooks: &mut impl Hooks,
    ) {
        let Some(info) = relay else {
            return;
        };
        let mut route = slot.route();
        let fresh = route
            .relay
            .as_ref()
            .is_none_or(|r| r.address != info.address || r.token != info.token);
        if fresh {
            let r = Relay {
                address: info.address,
                token: info.token,
                reason: info.reason,
                bound_at: Some(now),
            };
            // The bind goes out before any handshake towards the channel.
            bind(&self.udp, &r);
            route.relay = Some(r);
            tracing::info!(peer = %slot.name, relay = %info.address, reason = %info.reason, "peer relayed");
        }
        drop(route);
        let mut peer = slot.lock();
        if !peer.is_established(now)
            && let Err(e) = peer.redirect(info.address, now)
        {
            tracing::warn!(peer = %slot.name, error = %e, "handshake through the relay");
        }
        drop(peer);
        self.drain(slot, hooks);
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

    fn handshake(&mut self, frame: &[u8], from: SocketAddr, at: Instant, hooks: &mut impl Hooks) {
        let Ok(view) = Frame::new_checked(frame) else {
            return;
        };
        match view.msg_type() {
            MessageType::HandshakeInit => {
                bump(&self.shared.counters.handshake_inits);
                let init = match read_init(&self.identity, self.clock.unix_secs(at), frame) {
                    Ok(init) => init,
                    Err(e) => {
                        self.refused(e.kind(), from, &e);
                        return;
                    }
                };
                let Some(slot) = self.shared.peers.by_key(&init.remote_static) else {
                    let what = format!("{} is not one of our peers", init.cert.body().name);
                    self.refused("not_a_peer", from, &what);
                    self.admit(&init.cert, from, at);
                    return;
                };
                let result = slot.lock().handle_init(at, from, init);
                if let Err(e) = result {
                    let what = format!("{}: {e}", slot.name);
                    self.refused(e.kind(), from, &what);
                }
                self.drain(&slot, hooks);
            }
            MessageType::HandshakeResp => {
                bump(&self.shared.counters.handshake_responses);
                let Some(slot) = self.shared.peers.by_index(view.receiver_index()) else {
                    self.refused("unknown_index", from, &"a response for no peer of ours");
                    return;
                };
                let result = slot.lock().handle_response(at, from, frame);
                if let Err(e) = result {
                    let what = format!("{}: {e}", slot.name);
                    self.refused(e.kind(), from, &what);
                }
                self.drain(&slot, hooks);
            }
            _ => {}
        }
    }

    /// Sends what the peer wants sent and acts on what happened to it.
    fn drain(&mut self, slot: &Arc<PeerSlot>, hooks: &mut impl Hooks) {
        let (transmits, events): (Vec<_>, Vec<_>) = {
            let mut peer = slot.lock();
            (
                std::iter::from_fn(|| peer.poll_transmit()).collect(),
                std::iter::from_fn(|| peer.poll_event()).collect(),
            )
        };
        for t in transmits {
            match self.udp.send_to(&t.frame, t.destination) {
                Ok(_) => bump(&self.shared.counters.udp_sent),
                Err(e) => {
                    bump(&self.shared.counters.udp_send_failed);
                    tracing::debug!(peer = %slot.name, to = %t.destination, error = %e, "sending a handshake or keepalive failed");
                }
            }
        }
        for event in events {
            match event {
                Event::Established { initiator, rekey } => {
                    bump(&self.shared.counters.sessions_established);
                    if rekey {
                        tracing::debug!(peer = %slot.name, initiator, "keys rotated");
                    } else {
                        tracing::info!(peer = %slot.name, initiator, "peer up");
                    }
                    let _ = self.to_egress.send(ToEgress::Established(slot.id));
                    hooks.peer_up(slot.id);
                    for s in self
                        .cloud
                        .as_mut()
                        .map(|c| c.peer_up(slot.id))
                        .unwrap_or_default()
                    {
                        hooks.settled(s);
                    }
                }
                Event::HandshakeGaveUp => {
                    tracing::warn!(peer = %slot.name, "no answer to handshakes for 90 s; dropping queued packets");
                    let _ = self.to_egress.send(ToEgress::GaveUp(slot.id));
                    hooks.peer_gave_up(slot.id);
                    for s in self
                        .cloud
                        .as_mut()
                        .map(|c| c.peer_gave_up(slot.id))
                        .unwrap_or_default()
                    {
                        hooks.settled(s);
                    }
                }
                Event::EndpointChanged { old, new } => {
                    tracing::info!(peer = %slot.name, ?old, %new, "peer moved to a new address");
                }
                Event::Expired => tracing::info!(peer = %slot.name, "peer idle: keys expired"),
                _ => {}
            }
        }
    }
}
