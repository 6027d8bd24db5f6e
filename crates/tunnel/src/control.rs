//! The engine's control core, on the control thread: the peers' timers (handshakes started,
//! retried and given up, keepalives, rekeys, expiry), news that our addresses changed, and
//! the relay channels peers are reached through. It builds the initiations it starts (the
//! Diffie-Hellman work) off the data threads, tells the [`Intake`] when a peer's queued
//! packets may go, and reports what its driver acts on as [`ControlEvent`]s
//! ([`Control::poll_event`]). Handshake messages from the underlay are answered on the
//! handshake thread ([`crate::handshakes`]), not here.
//!
//! It owns no runtime and no thread: whoever drives it (the daemons' control loop, a test)
//! feeds it the data threads' [`ToControl`] messages and calls [`Control::run_timers`] by
//! [`Control::next_deadline`]. Nothing here ever makes a data thread wait.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cyphonic_control::RelayInfo;
use cyphonic_crypto::{CertError, Certificate, first_overlap};
use cyphonic_session::{Event, Identity, PathMsg, Transmit};

use crate::counters::bump;
use crate::direct::Action;
use crate::egress::Intake;
use crate::peers::{PeerSlot, Relay};
use crate::socket::TunnelSocket;
use crate::timers::Timers;
use crate::{Shared, ToControl};

/// Why a cloud peer may not be added, with the cloud peers of other names whose blocks it
/// overlaps (they are not to be believed either).
type CloudRefusal = (Refusal, Vec<Arc<PeerSlot>>);

/// The peers' addresses, for kicks, are looked up again at most this often.
const ENDPOINTS_FRESH: Duration = Duration::from_secs(1);
/// A relayed peer's bind is sent again this often: a NAT may have moved our address, and
/// the channel must know where we are.
const RELAY_BIND_EVERY: Duration = Duration::from_secs(20);
/// A hole punch's TTL: enough to leave our NAT (the next hop), too little to reach the peer's.
pub const PUNCH_HOPS: u8 = 2;
/// How long initiations wait after a hole punch: longer than the cloud's two messages to the
/// pair can arrive apart, so that the peer's punch has opened its NAT before ours arrives.
pub const PUNCH_LEAD: Duration = Duration::from_millis(100);
/// Peers' certificates are compared with the clock, and cloud peers' activity looked at,
/// this often.
const PEER_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Every peer's timers are looked at this often (between, only the peers due and those the
/// data threads name): what other threads changed without waking us is seen this late at
/// most, and relay binds are sent again on this beat.
pub const TIMER_SCAN_EVERY: Duration = Duration::from_secs(1);
/// A cloud peer that handshook with us this recently is not evicted for idleness, whatever
/// its traffic: its other side wants it (the two sides' idle timers run out together, and
/// the side whose traffic came back first handshakes with the side about to evict it).
const HANDSHAKE_IS_ACTIVITY: Duration = Duration::from_secs(10);
/// Cloud peers evicted for idleness that are remembered, to wake on traffic, at most.
pub const MAX_DORMANT: usize = 1024;
/// A dormant peer is asked for again at most this often.
pub const WAKE_EVERY: Duration = Duration::from_secs(2);
/// Events held for the driver at most; older ones are dropped (a driver that never polls
/// must not grow memory).
const MAX_EVENTS: usize = 4096;

/// What happened that the driver acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlEvent {
    /// A peer's keys are usable (first keys, or new ones): what waited for it may go. Its
    /// queued packets are already on their way.
    PeerUp(u32),
    /// A peer could not be reached: what waited for it is dropped.
    PeerGaveUp(u32),
    /// A valid node that is not one of our peers is handshaking with us (we restarted, and
    /// it still has us as a peer): the cloud may know it.
    UnknownPeer {
        /// Its verified certificate.
        certificate: Box<Certificate>,
        /// Where it spoke from.
        from: SocketAddr,
        /// When.
        at: Instant,
    },
    /// Our addresses or routes changed; the peers and relays were told.
    NetworkChanged,
    /// A return-routability challenge came from `from`, which is none of our relay channels:
    /// the cloud's probe port, perhaps (the driver hands it to the signal client, which
    /// answers only its own probe addresses).
    Challenged {
        /// Its source.
        from: SocketAddr,
        /// Its cookie.
        cookie: cyphonic_control::ReturnCookie,
    },
    /// Traffic for the block of a cloud peer evicted for idleness: ask the cloud to pair us
    /// with it again (at most every [`WAKE_EVERY`] per peer).
    Wanted(Box<Certificate>),
    /// A peer left the table: its certificate no longer verifies (revoked, expired, its CA
    /// no longer trusted), or its driver removed it. Its sessions ended, its queued packets
    /// were dropped; what waited for it is to be failed.
    PeerRemoved(u32),
}

/// Peers in the table at most: a cloud peer beyond it is refused ([`Refusal::TableFull`]).
pub const MAX_PEERS: usize = 16_384;

/// Why a peer the cloud described was not added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// A block of its certificate overlaps ours, a static peer's or another peer's (other
    /// than an older certificate of its own name, which it replaces).
    Overlap {
        /// Its block.
        block: ipnet::IpNet,
        /// Whose block it overlaps: `us`, or a peer's name.
        with: String,
    },
    /// A static peer has its name: configuration wins over the cloud.
    StaticName,
    /// The table holds a newer certificate of its name.
    Older,
    /// The table is full ([`MAX_PEERS`]).
    TableFull,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Overlap { block, with } => write!(f, "its block {block} overlaps {with}'s"),
            Self::StaticName => f.write_str("a static peer has its name"),
            Self::Older => f.write_str("a newer certificate of its name is already a peer"),
            Self::TableFull => write!(f, "the peer table is full ({MAX_PEERS})"),
        }
    }
}

/// Why a peer left the table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removal {
    /// Its certificate (the one we know it by, or the one it presented) no longer verifies.
    Untrusted(CertError),
    /// A cloud peer with no traffic either way for the idle timeout.
    Idle,
    /// Its driver took it out (configuration no longer names it, a newer certificate of the
    /// same name replaced it).
    Dropped(&'static str),
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Untrusted(e) => write!(f, "certificate no longer trusted: {e}"),
            Self::Idle => f.write_str("idle: no traffic either way for the idle timeout"),
            Self::Dropped(why) => f.write_str(why),
        }
    }
}

/// The control core. See the module docs.
pub struct Control {
    shared: Arc<Shared>,
    socket: Box<dyn TunnelSocket>,
    intake: Intake,
    /// Peers by the address we reach them at, and when that was read: what a kick looks up.
    endpoints: (HashMap<SocketAddr, u32>, Option<Instant>),
    events: VecDeque<ControlEvent>,
    /// When the peers were last checked for expiry and idleness.
    peers_checked: Option<Instant>,
    /// Cloud peers with no inner traffic this long leave the table; `None`: never.
    idle_timeout: Option<Duration>,
    /// Each cloud peer's inner packets (both ways) when last looked at, and since when
    /// that count stands.
    activity: HashMap<u32, (u64, Instant)>,
    /// Cloud peers evicted for idleness, oldest first: traffic for their blocks wakes them.
    dormant: VecDeque<Dormant>,
    /// The peers' next deadlines, set whenever this core has touched a peer.
    timers: Timers,
    /// When every peer's timers were last looked at.
    scanned: Option<Instant>,
    /// Where we may be reached, as a call-me says (docs/protocol.md §4, *Back to direct*).
    reachable: Vec<SocketAddr>,
    /// Whether a NAT stands between our tunnel socket and the Internet: tries punch first.
    behind_nat: bool,
    /// Bounds the pongs we send, per peer (4 a second).
    pong_gate: crate::limit::RateTable,
}

/// A cloud peer evicted for idleness.
#[derive(Debug)]
struct Dormant {
    blocks: Vec<ipnet::IpNet>,
    certificate: Certificate,
    asked: Option<Instant>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

/// Sends a peer's handshake messages and keepalives, counting each.
pub(crate) fn send_transmits(
    shared: &Shared,
    socket: &dyn TunnelSocket,
    slot: &PeerSlot,
    transmits: Vec<Transmit>,
) {
    let send = |frame: &[u8], to: SocketAddr| match socket.send_to(frame, to) {
        Ok(_) => bump(&shared.counters.udp_sent),
        Err(e) => {
            bump(&shared.counters.udp_send_failed);
            tracing::debug!(peer = %slot.name, %to, error = %e, "sending a handshake or keepalive failed");
        }
    };
    for t in transmits {
        send(&t.frame, t.destination);
        // An initiation goes to the peer's other addresses too, while it has some (until
        // keys exist): whichever path answers first is the one (the answer's source).
        if t.frame.get(1) == Some(&u8::from(cyphonic_wire::MessageType::HandshakeInit)) {
            let candidates = slot.route().candidates.clone();
            for to in candidates.into_iter().filter(|c| *c != t.destination) {
                send(&t.frame, to);
            }
        }
    }
}

/// A ping's id: random, so that nobody who does not see the ping can answer it.
fn ping_id() -> u64 {
    cyphonic_crypto::cookie::random_nonce()
        .ok()
        .and_then(|n| n.get(..8).and_then(|b| b.try_into().ok()))
        .map_or(0, u64::from_be_bytes)
}

/// Binds our tunnel socket's address to a relay channel: a bind under our token, answering
/// the channel's last challenge (a stale one earns a new challenge, which
/// [`Control::handle`] answers at once).
fn bind(socket: &dyn TunnelSocket, relay: &Relay) {
    let frame = cyphonic_control::bind_frame(&relay.token, relay.cookie.as_ref());
    if let Err(e) = socket.send_to(&frame, relay.address) {
        tracing::debug!(relay = %relay.address, error = %e, "relay bind not sent");
    }
}

impl Control {
    /// The core over `shared`, sending handshakes on `socket` and releasing queued packets
    /// into `intake`.
    pub fn new(shared: Arc<Shared>, socket: Box<dyn TunnelSocket>, intake: Intake) -> Self {
        Self {
            shared,
            socket,
            intake,
            endpoints: (HashMap::new(), None),
            events: VecDeque::new(),
            peers_checked: None,
            idle_timeout: None,
            activity: HashMap::new(),
            dormant: VecDeque::new(),
            timers: Timers::default(),
            scanned: None,
            reachable: Vec::new(),
            behind_nat: false,
            pong_gate: crate::limit::RateTable::new(256, 4, 4),
        }
    }

    /// Where we may be reached (the address the cloud sees our tunnel socket at, our
    /// configured endpoints), and whether a NAT stands in front of us: what a try of the
    /// direct path says in its call-me, and whether it punches.
    pub fn set_reachable(&mut self, addrs: Vec<SocketAddr>, behind_nat: bool) {
        self.reachable = addrs;
        self.behind_nat = behind_nat;
    }

    /// Evicts cloud peers with no inner traffic either way for `timeout` (keepalives do not
    /// count): their keepalives stop, and the table holds only peers in use. Traffic for an
    /// evicted peer's block later asks for it again ([`ControlEvent::Wanted`]). `None`:
    /// never (the default).
    pub const fn set_idle_timeout(&mut self, timeout: Option<Duration>) {
        self.idle_timeout = timeout;
    }

    /// Takes on `identity` (a renewed certificate, new revocations, other trusted CAs; the
    /// static key stays): handshakes from now on are made and checked with it, and every
    /// peer whose current certificate no longer verifies, or whose known one is revoked,
    /// leaves at once ([`Control::remove`]). Returns the peers removed.
    pub fn set_identity(
        &mut self,
        identity: &Arc<Identity>,
        now: Instant,
    ) -> Vec<(String, Removal)> {
        self.shared.replace_identity(identity.clone());
        let unix = self.shared.clock.unix_secs(now);
        let trust = identity.trust();
        let mut removed = Vec::new();
        for slot in self.shared.peers.all() {
            slot.lock().set_identity(identity.clone());
            let known = slot.certificate.fingerprint();
            let verdict = if trust.revocations().contains(&known) {
                Err(CertError::Revoked(known))
            } else {
                trust.verify(&slot.current_certificate(), unix)
            };
            if let Err(e) = verdict {
                let why = Removal::Untrusted(e);
                self.remove(&slot, &why);
                removed.push((slot.name.clone(), why));
            }
        }
        removed
    }

    /// Adds a peer the cloud described, with certificate `cert` (already verified) and
    /// `config`, unless it conflicts with what the table holds: its blocks must not overlap
    /// ours, a static peer's or another peer's, and its name must not be a static peer's. A
    /// certificate of the same name as a cloud peer's (a re-keyed or renewed peer) replaces
    /// that peer, unless it is the older of the two: routes move to the new one and the old
    /// one's sessions end. Refusals are counted (`peers_refused`) and logged.
    ///
    /// # Errors
    /// [`Refusal`]: why it was not added.
    pub fn add_cloud_peer(
        &mut self,
        cert: &Certificate,
        config: cyphonic_session::PeerConfig,
    ) -> Result<Arc<PeerSlot>, Refusal> {
        let checked = self.check_cloud_peer(cert);
        let replaced = match checked {
            Ok(r) => r,
            Err((why, conflicting)) => {
                bump(&self.shared.counters.peers_refused);
                tracing::warn!(peer = %cert.body().name, reason = %why, "peer from the cloud refused");
                // Two certificates of different names claim one address: whichever came
                // first is no more right than the other (issue 49, finding 6), so neither
                // is believed, and the operator is told.
                for slot in conflicting {
                    tracing::error!(peer = %slot.name, other = %cert.body().name, "two peers' certificates claim overlapping blocks: neither is used (a CA issued overlapping certificates; revoke one)");
                    self.remove(
                        &slot,
                        &Removal::Dropped("another certificate claims its block too"),
                    );
                }
                return Err(why);
            }
        };
        if let Some(old) = replaced {
            self.remove(
                &old,
                &Removal::Dropped("replaced by a newer certificate of its name"),
            );
        }
        // Back from idleness (or renewed): no longer dormant.
        self.dormant
            .retain(|d| d.certificate.body().name != cert.body().name);
        self.count_dormant();
        Ok(self.shared.add_peer(cert, "cloud", config))
    }

    /// What adding `cert` would replace, or why it may not be added (with the cloud peers of
    /// other names whose blocks it overlaps: they are not to be believed either).
    fn check_cloud_peer(&self, cert: &Certificate) -> Result<Option<Arc<PeerSlot>>, CloudRefusal> {
        let body = cert.body();
        let identity = self.shared.identity();
        let ours = identity.certificate().body();
        if let Some((block, _)) = first_overlap(&body.vip_blocks, &ours.vip_blocks) {
            return Err((
                Refusal::Overlap {
                    block: *block,
                    with: "us".into(),
                },
                Vec::new(),
            ));
        }
        let mut replaced = None;
        let mut overlapping: Option<Refusal> = None;
        let mut conflicting = Vec::new();
        // Under the table's read lock, without a copy of it: this runs for every peer the
        // cloud adds, and there may be thousands.
        let refusal = self.shared.peers.find_map(|slot| {
            if slot.name == body.name {
                if slot.origin != "cloud" {
                    return Some(Refusal::StaticName);
                }
                if slot.certificate.body().not_before > body.not_before {
                    return Some(Refusal::Older);
                }
                replaced = Some(slot.clone());
                return None;
            }
            if let Some((block, _)) = first_overlap(&body.vip_blocks, &slot.blocks) {
                overlapping.get_or_insert(Refusal::Overlap {
                    block: *block,
                    with: slot.name.clone(),
                });
                // A static peer's blocks are the operator's word: only the newcomer goes.
                if slot.origin == "cloud" {
                    conflicting.push(slot.clone());
                }
            }
            None
        });
        if let Some(why) = refusal {
            return Err((why, Vec::new()));
        }
        if let Some(why) = overlapping {
            return Err((why, conflicting));
        }
        if replaced.is_none() && self.shared.peers.len() >= MAX_PEERS {
            return Err((Refusal::TableFull, Vec::new()));
        }
        Ok(replaced)
    }

    /// Takes `slot` out of the peer table: its routes and sessions end at once (frames on its
    /// session indices find nothing, packets for its blocks find no route), its queued
    /// packets are dropped, and the driver hears [`ControlEvent::PeerRemoved`].
    pub fn remove(&mut self, slot: &Arc<PeerSlot>, why: &Removal) {
        if self.shared.peers.remove(slot.id).is_none() {
            return;
        }
        bump(&self.shared.counters.peers_removed);
        self.activity.remove(&slot.id);
        if *why == Removal::Idle {
            tracing::info!(peer = %slot.name, "peer idle: removed until traffic wants it again");
        } else {
            tracing::warn!(peer = %slot.name, origin = slot.origin, reason = %why, "peer removed: its sessions end");
        }
        if let Some(sub) = self.intake.lock().as_mut() {
            sub.gave_up(slot.id);
        }
        self.endpoints.1 = None;
        self.push_event(ControlEvent::PeerRemoved(slot.id));
    }

    /// Removes the peers whose certificate ended by `now`, and the cloud peers idle past
    /// the idle timeout (checked at most once a second: a comparison or two per peer, no
    /// signature).
    fn check_peers(&mut self, now: Instant) {
        if self
            .peers_checked
            .is_some_and(|t| now.saturating_duration_since(t) < PEER_CHECK_EVERY)
        {
            return;
        }
        self.peers_checked = Some(now);
        let unix = self.shared.clock.unix_secs(now);
        for slot in self.shared.peers.all() {
            let not_after = slot.certificate_expires();
            if not_after <= unix {
                let why = Removal::Untrusted(CertError::Expired {
                    not_after,
                    now: unix,
                });
                self.remove(&slot, &why);
            } else if let Some(idle) = self.idle_timeout
                && slot.origin == "cloud"
                && now.saturating_duration_since(self.idle_since(&slot, now)) >= idle
                && slot
                    .lock()
                    .last_handshake_seen()
                    .is_none_or(|t| now.saturating_duration_since(t) >= HANDSHAKE_IS_ACTIVITY)
            {
                self.remove(&slot, &Removal::Idle);
                if self.dormant.len() >= MAX_DORMANT {
                    self.dormant.pop_front();
                }
                self.dormant.push_back(Dormant {
                    blocks: slot.blocks.clone(),
                    certificate: slot.current_certificate(),
                    asked: None,
                });
                self.count_dormant();
            }
        }
    }

    /// Since when `slot` has carried no inner packet either way (as far as the looks once a
    /// second tell).
    fn idle_since(&mut self, slot: &PeerSlot, now: Instant) -> Instant {
        let packets = slot.tx_packets.load(std::sync::atomic::Ordering::Relaxed)
            + slot.rx_packets.load(std::sync::atomic::Ordering::Relaxed);
        let seen = self.activity.entry(slot.id).or_insert((packets, now));
        if seen.0 != packets {
            *seen = (packets, now);
        }
        seen.1
    }

    /// Tells the data threads whether any peer is dormant.
    fn count_dormant(&self) {
        self.shared
            .dormant
            .store(self.dormant.len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// A packet for `dst` found no peer: if a dormant peer's block holds it, ask for that
    /// peer ([`ControlEvent::Wanted`]), at most every [`WAKE_EVERY`].
    fn wanted(&mut self, dst: std::net::IpAddr) {
        let now = Instant::now();
        let Some(d) = self
            .dormant
            .iter_mut()
            .find(|d| d.blocks.iter().any(|b| b.contains(&dst)))
        else {
            return;
        };
        if d.asked
            .is_some_and(|t| now.saturating_duration_since(t) < WAKE_EVERY)
        {
            return;
        }
        d.asked = Some(now);
        let certificate = Box::new(d.certificate.clone());
        self.push_event(ControlEvent::Wanted(certificate));
    }

    /// The state the engine's threads share.
    pub const fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The next moment a peer's timer is due (or every peer is to be looked at).
    pub fn next_deadline(&self) -> Option<Instant> {
        let scan = self.scanned.map(|t| t + TIMER_SCAN_EVERY);
        match (self.timers.first(), scan) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next thing that happened, for the driver.
    pub fn poll_event(&mut self) -> Option<ControlEvent> {
        self.events.pop_front()
    }

    /// Runs the peers' timers due at `now` and acts on what the peers the data threads woke
    /// us for have to say; every [`TIMER_SCAN_EVERY`], looks at every peer instead, binds to
    /// relay channels again when due, and removes peers whose certificates expired. The
    /// work between scans is the peers due, not all of them.
    pub fn run_timers(&mut self, now: Instant) {
        self.check_peers(now);
        let (woken, overflow) = self.shared.take_woken();
        let full = overflow
            || self
                .scanned
                .is_none_or(|t| now.saturating_duration_since(t) >= TIMER_SCAN_EVERY);
        let slots: Vec<Arc<PeerSlot>> = if full {
            self.scanned = Some(now);
            self.shared.peers.all()
        } else {
            let mut ids = woken;
            ids.extend(self.timers.take_due(now));
            ids.sort_unstable();
            ids.dedup();
            ids.into_iter()
                .filter_map(|id| self.shared.peers.by_id(id))
                .collect()
        };
        let mut endpoints = std::collections::HashSet::new();
        let mut hints = std::collections::HashSet::new();
        for slot in &slots {
            {
                let mut peer = slot.lock();
                if peer.poll_timeout().is_some_and(|t| t <= now) {
                    peer.handle_timeout(now);
                }
                if full {
                    endpoints.extend(peer.endpoint());
                    hints.extend(peer.known_hints(now).into_iter().flatten());
                }
            }
            if full && let Some(r) = slot.route().relay.as_ref() {
                endpoints.insert(r.address);
            }
            self.drain(slot);
            if full
                && let Some(r) = slot.route().relay.as_mut()
                && r.bound_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= RELAY_BIND_EVERY)
            {
                r.bound_at = Some(now);
                bind(&*self.socket, r);
            }
            if full {
                self.try_direct(slot, now);
            }
        }
        if full {
            self.shared
                .set_known_peers(crate::KnownPeers { endpoints, hints });
            // Peers that left keep no deadline.
            let gone: Vec<u32> = self
                .timers
                .ids()
                .filter(|id| self.shared.peers.by_id(*id).is_none())
                .collect();
            for id in gone {
                self.timers.set(id, None);
            }
        }
    }

    /// Handles a message from a data thread.
    pub fn handle(&mut self, msg: ToControl) {
        match msg {
            ToControl::UnknownPeer {
                certificate,
                from,
                at,
            } => self.push_event(ControlEvent::UnknownPeer {
                certificate,
                from,
                at,
            }),
            ToControl::Kick(from) => self.kick(from),
            ToControl::NetworkChanged => self.network_changed(),
            ToControl::NoRoute(dst) => self.wanted(dst),
            ToControl::Challenge { from, cookie } => self.challenged(from, cookie),
            ToControl::Path { peer, from, frame } => self.path(peer, from, frame),
        }
    }

    /// A relayed peer's way back to direct (docs/protocol.md §4, *Back to direct*): tells
    /// its [`Direct`](crate::direct::Direct) which path it is on, and sends what a try
    /// asks for: a call-me through the channel, punches, pings.
    fn try_direct(&mut self, slot: &Arc<PeerSlot>, now: Instant) {
        let relayed = slot.lock().is_relayed();
        let (actions, channel) = {
            let mut route = slot.route();
            let Some(channel) = route.relay.as_ref().map(|r| r.address) else {
                return;
            };
            route.direct.observe(relayed, now);
            (route.direct.poll(now, self.behind_nat, ping_id), channel)
        };
        self.send_direct(slot, channel, actions, now);
    }

    /// Sends what a try asks for: the call-me through `channel`, punches, pings.
    fn send_direct(
        &self,
        slot: &Arc<PeerSlot>,
        channel: SocketAddr,
        actions: Vec<Action>,
        now: Instant,
    ) {
        let c = &self.shared.counters;
        for action in actions {
            let (msg, to) = match action {
                Action::CallMe => {
                    bump(&c.direct_tries);
                    tracing::debug!(peer = %slot.name, "relayed: trying the direct path");
                    (PathMsg::CallMe(self.reachable.clone()), channel)
                }
                Action::Punch(to) => {
                    let frame = cyphonic_control::probe::punch_frame();
                    match self.socket.send_to_hops(&frame, to, PUNCH_HOPS) {
                        Ok(_) => bump(&c.punches_sent),
                        Err(e) => tracing::debug!(%to, error = %e, "hole punch not sent"),
                    }
                    continue;
                }
                Action::Ping(id, to) => {
                    bump(&c.path_pings_sent);
                    (PathMsg::Ping(id), to)
                }
            };
            let t = slot.lock().path_transmit(now, &msg, to);
            send_transmits(&self.shared, &*self.socket, slot, t.into_iter().collect());
        }
    }

    /// A path frame from `from` for peer `id`: opened here (the receive thread only found
    /// the session's index), then a ping answered, a pong judged, a call-me taken.
    fn path(&mut self, id: u32, from: SocketAddr, mut frame: Vec<u8>) {
        let now = Instant::now();
        let c = &self.shared.counters;
        let Some(slot) = self.shared.peers.by_id(id) else {
            bump(&c.drop_path_malformed);
            return;
        };
        let opened = slot.lock().open_path(now, &mut frame);
        let msg = match opened {
            Ok(m) => m,
            Err(e) => {
                bump(&c.drop_path_malformed);
                tracing::debug!(peer = %slot.name, %from, error = %e, "path frame dropped");
                return;
            }
        };
        let channel = slot.route().relay.as_ref().map(|r| r.address);
        match msg {
            PathMsg::Ping(ping) => {
                if !self.pong_gate.admit(id, now) {
                    bump(&c.drop_path_rate);
                    return;
                }
                let t = slot.lock().path_transmit(now, &PathMsg::Pong(ping), from);
                if t.is_some() {
                    bump(&c.path_pongs_sent);
                }
                send_transmits(&self.shared, &*self.socket, &slot, t.into_iter().collect());
            }
            PathMsg::Pong(pong) => {
                if channel == Some(from) || !slot.route().direct.pong(pong, from, now) {
                    return;
                }
                slot.lock().move_direct(from, now);
                slot.route().direct.observe(false, now);
                bump(&c.moves_to_direct);
                tracing::info!(peer = %slot.name, %from, relay = ?channel, "the direct path answers both ways: leaving the relay");
                self.drain(&slot);
            }
            PathMsg::CallMe(addrs) => {
                let relayed = slot.lock().is_relayed();
                let taken = {
                    let mut route = slot.route();
                    route.direct.observe(relayed, now);
                    route.direct.called(addrs, now, self.behind_nat)
                };
                match (taken, channel) {
                    (Some(punches), Some(channel)) if !punches.is_empty() => {
                        self.send_direct(&slot, channel, punches, now);
                    }
                    (Some(_), _) => self.try_direct(&slot, now),
                    (None, _) => {}
                }
            }
        }
    }

    /// The direct path to `slot` stopped answering (its initiations went unanswered, the
    /// driver judges how long): back to the pair's relay channel at once, if we hold one
    /// and are not on it (docs/protocol.md §4, *Back to direct*). Whether it moved.
    pub fn fall_back(&mut self, slot: &Arc<PeerSlot>, now: Instant) -> bool {
        let channel = {
            let mut route = slot.route();
            let Some(r) = route.relay.as_mut() else {
                return false;
            };
            r.bound_at = Some(now);
            bind(&*self.socket, r);
            r.address
        };
        if slot.lock().is_relayed() {
            return false;
        }
        if let Err(e) = slot.lock().redirect(channel, now) {
            tracing::warn!(peer = %slot.name, error = %e, "handshake through the relay");
        }
        slot.route().direct.observe(true, now);
        bump(&self.shared.counters.moves_to_relay);
        tracing::info!(peer = %slot.name, relay = %channel, "the direct path stopped answering: back to the relay");
        self.drain(slot);
        true
    }

    /// A challenge came from `from` (the receive threads' [`Shared::challenge_gate`](crate::Shared::challenge_gate)
    /// bounds them): when it is one of our relay channels, bind to it again at once with its
    /// cookie, and send a pending initiation through it right after (the channel now
    /// forwards it); anything else goes to the driver ([`ControlEvent::Challenged`]).
    fn challenged(&mut self, from: SocketAddr, cookie: cyphonic_control::ReturnCookie) {
        let now = Instant::now();
        let from = SocketAddr::new(from.ip().to_canonical(), from.port());
        let relayed = self.shared.peers.all().into_iter().find(|s| {
            s.route().relay.as_ref().is_some_and(|r| {
                SocketAddr::new(r.address.ip().to_canonical(), r.address.port()) == from
            })
        });
        let Some(slot) = relayed else {
            self.push_event(ControlEvent::Challenged { from, cookie });
            return;
        };
        bump(&self.shared.counters.relay_challenges);
        if let Some(r) = slot.route().relay.as_mut() {
            r.cookie = Some(cookie);
            r.bound_at = Some(now);
            bind(&*self.socket, r);
        }
        if !slot.lock().is_established(now) {
            let _ = slot.lock().retry_now(now);
        }
        self.drain(&slot);
    }

    /// Frames on keys we do not have came from `from` (the data threads' [`Shared::kick_gate`](crate::Shared::kick_gate)
    /// lets at most one a second through per source): a peer we have no keys with that we
    /// reach at that address most likely kept keys we lost in a restart. Handshake with it
    /// now instead of waiting until it notices. Anyone else is ignored, so frames spoofed
    /// from a peer's address cost at most a handshake a second while we have no keys anyway.
    fn kick(&mut self, from: SocketAddr) {
        let now = Instant::now();
        let (endpoints, read_at) = &mut self.endpoints;
        if read_at.is_none_or(|t| now.saturating_duration_since(t) >= ENDPOINTS_FRESH) {
            *endpoints = self
                .shared
                .peers
                .all()
                .iter()
                .filter_map(|s| Some((s.lock().endpoint()?, s.id)))
                .collect();
            *read_at = Some(now);
        }
        let Some(slot) = endpoints
            .get(&from)
            .and_then(|id| self.shared.peers.by_id(*id))
        else {
            return;
        };
        if slot.lock().is_established(now) {
            return;
        }
        tracing::info!(peer = %slot.name, "traffic on unknown keys from the peer's address: handshaking");
        self.initiate(&slot, now);
    }

    /// Starts a handshake with `slot` now (unless one is under way), and sends it.
    pub fn initiate(&mut self, slot: &Arc<PeerSlot>, now: Instant) {
        let _ = slot.lock().initiate(now);
        self.drain(slot);
    }

    /// Our addresses or routes changed (a DHCP renewal with a new address, an uplink
    /// failover): a peer that only sends to us would go on sending to where we were, and a
    /// relay channel would go on forwarding there. Show every peer with keys where we are
    /// now (an authenticated keepalive, which it follows) and bind to our relay channels
    /// again; the driver tells the cloud ([`ControlEvent::NetworkChanged`]).
    fn network_changed(&mut self) {
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
                bind(&*self.socket, r);
            }
            slot.lock().local_address_changed(now);
            self.drain(slot);
        }
        self.push_event(ControlEvent::NetworkChanged);
    }

    /// Reaches `slot` through the relay channel `info` from now on (binding our address to it
    /// first; binding again when it already is); a peer without keys is handshaken with there,
    /// and one with keys sends there from now on.
    pub fn apply_relay(&mut self, slot: &Arc<PeerSlot>, info: &RelayInfo, now: Instant) {
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
                cookie: None,
            };
            // The bind goes out before any handshake towards the channel.
            bind(&*self.socket, &r);
            route.relay = Some(r);
            tracing::info!(peer = %slot.name, relay = %info.address, reason = %info.reason, "peer relayed");
        } else if route.relay.is_some() {
            // The same channel again: a side asked because its path through it went silent
            // (a NAT on the way moved us, and the relay drops what comes from an unbound
            // address), or because the direct path we had left it for did. Bind again at
            // once rather than at the next refresh (`fall_back` does, and moves a peer
            // that had left the channel back onto it), and send a pending initiation
            // through it now rather than at its next retry.
            drop(route);
            if !self.fall_back(slot, now) {
                if let Err(e) = slot.lock().retry_now(now) {
                    tracing::warn!(peer = %slot.name, error = %e, "handshake through the relay");
                }
                self.drain(slot);
            }
            return;
        }
        drop(route);
        slot.lock().set_relay(Some(info.address));
        // A new channel moves a peer with keys too: the cloud gives one when a side's
        // handshakes found no answer, so the path under those keys is dead.
        let mut peer = slot.lock();
        if (fresh || !peer.is_established(now))
            && let Err(e) = peer.redirect(info.address, now)
        {
            tracing::warn!(peer = %slot.name, error = %e, "handshake through the relay");
        }
        drop(peer);
        self.drain(slot);
    }

    /// Punches a hole for `slot` (docs/protocol.md §4, hole punching): a punch at TTL 2 to
    /// its endpoint opens our NAT towards it, and our initiations wait [`PUNCH_LEAD`] for the
    /// peer's punch to open its NAT. For a peer we learned of from the cloud while behind a
    /// NAT, before initiating.
    pub fn punch(&mut self, slot: &Arc<PeerSlot>, now: Instant) {
        let candidates = slot.route().candidates.clone();
        let mut peer = slot.lock();
        let Some(first) = peer.endpoint() else {
            return;
        };
        let frame = cyphonic_control::probe::punch_frame();
        for to in std::iter::once(first).chain(candidates) {
            match self.socket.send_to_hops(&frame, to, PUNCH_HOPS) {
                Ok(_) => bump(&self.shared.counters.punches_sent),
                Err(e) => tracing::debug!(%to, error = %e, "hole punch not sent"),
            }
        }
        peer.hold_initiations_until(now + PUNCH_LEAD);
    }

    /// Sends `frame` (an endpoint probe the cloud asked for) from the tunnel socket.
    pub fn send_probe(&self, frame: &[u8], to: SocketAddr) {
        if let Err(e) = self.socket.send_to(frame, to) {
            tracing::debug!(%to, error = %e, "endpoint probe not sent");
        }
    }

    fn push_event(&mut self, event: ControlEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// Says so when the keys a peer just came up with are of a tunnel version older than our
    /// newest: the peer runs an older release, and the tunnel goes without what the newer
    /// versions add (docs/protocol.md §2, *Versions*).
    fn older_version(&self, slot: &PeerSlot) {
        let ours = self.shared.versions;
        let version = slot.lock().session_version(Instant::now());
        if let Some(version) = version.filter(|v| *v < ours.newest()) {
            tracing::warn!(
                peer = %slot.name,
                version,
                ours = %ours,
                "the peer speaks an older tunnel version (an older release): this tunnel goes \
                 without what later versions add until both ends run one release"
            );
        }
    }

    /// Sends what the peer wants sent and acts on what happened to it.
    pub fn drain(&mut self, slot: &Arc<PeerSlot>) {
        let (transmits, events): (Vec<_>, Vec<_>) = {
            let mut peer = slot.lock();
            self.timers.set(slot.id, peer.poll_timeout());
            (
                std::iter::from_fn(|| peer.poll_transmit()).collect(),
                std::iter::from_fn(|| peer.poll_event()).collect(),
            )
        };
        send_transmits(&self.shared, &*self.socket, slot, transmits);
        for event in events {
            match event {
                Event::Established { initiator, rekey } => {
                    bump(&self.shared.counters.sessions_established);
                    // A path answered: the other addresses are not tried any more.
                    slot.route().candidates.clear();
                    if rekey {
                        bump(&self.shared.counters.rekeys);
                        tracing::debug!(peer = %slot.name, initiator, "keys rotated");
                    } else {
                        tracing::info!(peer = %slot.name, initiator, "peer up");
                        self.older_version(slot);
                    }
                    // No peer lock is held here: the submitter takes peers' locks.
                    if let Some(sub) = self.intake.lock().as_mut() {
                        sub.established(slot.id);
                    }
                    self.push_event(ControlEvent::PeerUp(slot.id));
                }
                Event::HandshakeGaveUp => {
                    tracing::warn!(peer = %slot.name, "no answer to handshakes for 90 s; dropping queued packets");
                    if let Some(sub) = self.intake.lock().as_mut() {
                        sub.gave_up(slot.id);
                    }
                    self.push_event(ControlEvent::PeerGaveUp(slot.id));
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
