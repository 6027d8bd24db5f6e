//! One remote peer: handshakes, the current/previous/next keys, timers, endpoint.
//!
//! Key rotation follows WireGuard's three slots. `current` seals outgoing packets. `previous`
//! keeps the keys replaced by the last handshake so that packets sealed with them and still in
//! flight are opened, not dropped. `next` holds keys we answered a handshake for as responder:
//! we may receive on them at once, but send on them only once the initiator has used them
//! (key confirmation), which promotes them to `current`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cyphonic_crypto::cookie::hint_epoch;
use cyphonic_crypto::{Backend, Certificate, Cookie, KnownKey, MacKeys, PublicKey};
use cyphonic_wire::{Frame, FrameRepr, HEADER_LEN, MAC_LEN, MessageType, TAG_LEN, Versions};
use ipnet::IpNet;

use crate::clock::{Clock, Timing};
use crate::cookie::{self, COOKIE_LIFETIME};
use crate::error::{HandshakeError, RecvError, SendError};
use crate::handshake::{self, Identity, IncomingInit};
use crate::index::{Indices, LocalIndex};
use crate::path::PathMsg;
use crate::session::Session;

/// What we know and expect of a peer before talking to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer's Noise static key; needed to initiate (IK). Unknown for peers that only ever
    /// initiate towards us.
    pub remote_static: Option<PublicKey>,
    /// Where to send handshakes first. Authenticated frames from elsewhere move it (roaming).
    pub endpoint: Option<SocketAddr>,
    /// The FQDN the peer's certificate must carry.
    pub expect_name: Option<String>,
    /// vIP blocks the peer's certificate must cover.
    pub expect_blocks: Vec<IpNet>,
    /// Send a keepalive when nothing was sent for this long, to hold NAT mappings open; also
    /// keeps a session up with an idle peer.
    pub persistent_keepalive: Option<Duration>,
    /// The tunnel versions the peer speaks, as the cloud described it (docs/protocol.md §2,
    /// *Versions*); `None` when nobody did: we then initiate in our oldest.
    pub versions: Option<Versions>,
}

impl PeerConfig {
    /// A static peer known by its certificate: its key, name and blocks become expectations.
    pub fn from_certificate(cert: &Certificate, endpoint: Option<SocketAddr>) -> Self {
        let body = cert.body();
        Self {
            remote_static: Some(PublicKey(body.public_key)),
            endpoint,
            expect_name: Some(body.name.clone()),
            expect_blocks: body.vip_blocks.clone(),
            persistent_keepalive: None,
            versions: None,
        }
    }

    fn check(&self, cert: &Certificate) -> Result<(), HandshakeError> {
        let body = cert.body();
        if let Some(key) = self.remote_static
            && key.0 != body.public_key
        {
            return Err(HandshakeError::KeyMismatch);
        }
        if let Some(name) = &self.expect_name
            && *name != body.name
        {
            return Err(HandshakeError::NameMismatch {
                expected: name.clone(),
                got: body.name.clone(),
            });
        }
        if let Some(block) = self.expect_blocks.iter().find(|b| !body.covers_block(b)) {
            return Err(HandshakeError::VipMismatch(*block));
        }
        Ok(())
    }
}

/// A frame for the driver to send on the underlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The peer's underlay address.
    pub destination: SocketAddr,
    /// The whole UDP payload.
    pub frame: Vec<u8>,
}

/// Something the driver should know about (log, count, act on).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Keys usable in both directions: flush packets queued for this peer.
    Established {
        /// Whether we initiated the handshake.
        initiator: bool,
        /// Whether these keys replace earlier ones.
        rekey: bool,
    },
    /// No handshake answer for [`Timing::handshake_attempt_time`]: drop queued packets.
    HandshakeGaveUp,
    /// An authenticated frame arrived from a new underlay address; we now send there.
    EndpointChanged {
        /// The address used so far.
        old: Option<SocketAddr>,
        /// The new address.
        new: SocketAddr,
    },
    /// All keys expired: the peer is idle.
    Expired,
}

/// What an authenticated data or keepalive frame carried.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'a> {
    /// An inner packet.
    Data(&'a mut [u8]),
    /// A keepalive (authenticated, empty).
    Keepalive,
}

/// The initiator side of a handshake in progress. A response that fails to decrypt leaves it
/// as it was (snow restores its state after a failed read), so a forged response cannot take
/// the place of the genuine one. `state` is `None` once a response decrypted (it came from
/// the responder) but was refused: the attempt then only waits for its retry time, when a
/// fresh initiation goes out.
struct Pending {
    state: Option<snow::HandshakeState>,
    local_index: LocalIndex,
    retry_at: Instant,
    /// The mac1 of the initiation sent: a cookie-reply for it is sealed to it.
    mac1: [u8; MAC_LEN],
    /// The frame version of the initiation: the response's and the session's.
    version: u8,
}

/// The state machine for one remote peer. See the crate docs.
pub struct Peer {
    id: u32,
    identity: Arc<Identity>,
    indices: Arc<Indices>,
    config: PeerConfig,
    timing: Timing,
    clock: Clock,
    backend: Backend,
    endpoint: Option<SocketAddr>,
    remote_cert: Option<Certificate>,

    pending: Option<Pending>,
    /// Start of the current series of unanswered initiations.
    attempts_since: Option<Instant>,
    retry_backoff: Duration,
    last_timestamp_sent: u64,
    /// The responder's last cookie and when it came: mac2 on our initiations while fresh.
    cookie: Option<(Cookie, Instant)>,
    /// The key we share with the peer's static key, when it has one and it is not of low
    /// order: the hints of our initiations to it, and of its to us.
    known: Option<KnownKey>,
    /// The hints by which the peer's initiations to us show it (epochs before, at and after
    /// ours), and the epoch they are for.
    known_hints: Option<(u64, [[u8; MAC_LEN]; 3])>,

    current: Option<Arc<Session>>,
    previous: Option<Arc<Session>>,
    next: Option<Arc<Session>>,
    had_session: bool,

    newest_init_timestamp: Option<u64>,
    last_init_accepted: Option<Instant>,
    last_sent: Option<Instant>,
    passive_keepalive_at: Option<Instant>,
    /// Set when data is sent, cleared when anything authenticated arrives.
    awaiting_reply_since: Option<Instant>,
    /// A handshake was asked for on the data path; `handle_timeout` builds it.
    handshake_requested: bool,
    /// Initiations wait until then (the lead of a hole punch, docs/protocol.md §4): one asked
    /// for meanwhile goes out when the hold ends, unless keys exist by then.
    hold_until: Option<Instant>,
    last_handshake: Option<Instant>,
    /// The pair's relay channel, when the cloud gave one: where relayed frames come from.
    relay: Option<SocketAddr>,
    /// When an authenticated frame last came from the peer at an address other than the
    /// relay channel: while recent, relayed frames do not move us off the direct path.
    direct_heard: Option<Instant>,

    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
}

/// The key our static key shares with the peer's, when we know its key and it is not of
/// low order (docs/protocol.md §2, *Known peers first*).
fn known_key(identity: &Identity, config: &PeerConfig) -> Option<KnownKey> {
    config
        .remote_static
        .and_then(|theirs| KnownKey::new(identity.keypair(), &theirs))
}

impl core::fmt::Debug for Peer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Peer")
            .field("id", &self.id)
            .field("endpoint", &self.endpoint)
            .field(
                "name",
                &self.remote_cert.as_ref().map(|c| c.body().name.clone()),
            )
            .field("current", &self.current)
            .field(
                "pending",
                &self.pending.as_ref().map(|p| p.local_index.value()),
            )
            .finish_non_exhaustive()
    }
}

impl Peer {
    /// A peer with id `id` (the driver keeps ids unique), taking its session indices from
    /// `indices`, the table the driver looks frames up in.
    pub fn new(
        id: u32,
        identity: Arc<Identity>,
        indices: Arc<Indices>,
        config: PeerConfig,
        timing: Timing,
        clock: Clock,
        backend: Backend,
    ) -> Self {
        let known = known_key(&identity, &config);
        Self {
            id,
            identity,
            indices,
            known,
            known_hints: None,
            endpoint: config.endpoint,
            config,
            timing,
            clock,
            backend,
            remote_cert: None,
            pending: None,
            attempts_since: None,
            retry_backoff: timing.handshake_retry_initial,
            last_timestamp_sent: 0,
            cookie: None,
            current: None,
            previous: None,
            next: None,
            had_session: false,
            newest_init_timestamp: None,
            last_init_accepted: None,
            last_sent: None,
            passive_keepalive_at: None,
            awaiting_reply_since: None,
            handshake_requested: false,
            hold_until: None,
            last_handshake: None,
            relay: None,
            direct_heard: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The driver's id of this peer (what [`Indices::peer_of`] answers for its sessions).
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The hints the peer's initiations to us carry about `now` (docs/protocol.md §2, *Known
    /// peers first*): for the epochs before, at and after our clock's, so that a clock off by
    /// up to an epoch still matches. None when the peer has no key we share.
    pub fn known_hints(&mut self, now: Instant) -> Option<[[u8; MAC_LEN]; 3]> {
        let known = self.known.as_ref()?;
        let epoch = hint_epoch(self.clock.unix_secs(now));
        if let Some((at, hints)) = self.known_hints
            && at == epoch
        {
            return Some(hints);
        }
        let ours = self.identity.public_key();
        let hints =
            [epoch.saturating_sub(1), epoch, epoch.saturating_add(1)].map(|e| known.hint(&ours, e));
        self.known_hints = Some((epoch, hints));
        Some(hints)
    }

    /// Where frames for this peer go.
    pub const fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }

    /// Sets the endpoint (learned from the cloud, for instance).
    pub fn set_endpoint(&mut self, endpoint: SocketAddr) {
        self.endpoint = Some(endpoint);
    }

    /// Sends to `endpoint` from now on (a relay channel the cloud allocated, for instance).
    /// A handshake waiting for an answer from the old endpoint starts over at the new one at
    /// once instead of at its next retry.
    ///
    /// # Errors
    /// [`HandshakeError`] when the new initiation cannot be built.
    pub fn redirect(&mut self, endpoint: SocketAddr, now: Instant) -> Result<(), HandshakeError> {
        if self.endpoint == Some(endpoint) {
            return Ok(());
        }
        let old = self.endpoint.replace(endpoint);
        self.events
            .push_back(Event::EndpointChanged { old, new: endpoint });
        if self.pending.take().is_some() {
            self.start_handshake(now)?;
        }
        Ok(())
    }

    /// Sends a pending initiation again now instead of at its next retry (the path under it
    /// was just repaired: bound again to a relay channel). Nothing when none is pending.
    ///
    /// # Errors
    /// [`HandshakeError`] when the new initiation cannot be built.
    pub fn retry_now(&mut self, now: Instant) -> Result<(), HandshakeError> {
        if self.pending.take().is_some() {
            self.start_handshake(now)?;
        }
        Ok(())
    }

    /// Since when initiations to this peer have gone unanswered (`None` when none is
    /// pending). A caller may try another path after a while.
    pub const fn unanswered_since(&self) -> Option<Instant> {
        if self.pending.is_some() {
            self.attempts_since
        } else {
            None
        }
    }

    /// The peer's certificate, once a handshake verified it.
    pub const fn certificate(&self) -> Option<&Certificate> {
        self.remote_cert.as_ref()
    }

    /// When the last handshake completed.
    pub const fn last_handshake(&self) -> Option<Instant> {
        self.last_handshake
    }

    /// When a handshake last completed, or an initiation from the peer was last answered
    /// (keys not confirmed yet): the peer is about to use the tunnel.
    pub fn last_handshake_seen(&self) -> Option<Instant> {
        self.last_handshake.max(self.last_init_accepted)
    }

    /// Replaces our identity (a renewed certificate, new revocations).
    pub fn set_identity(&mut self, identity: Arc<Identity>) {
        if identity.public_key() != self.identity.public_key() {
            self.known = known_key(&identity, &self.config);
            self.known_hints = None;
        }
        self.identity = identity;
    }

    /// Whether keys usable for sending exist at `now`.
    pub fn is_established(&self, now: Instant) -> bool {
        self.current.as_ref().is_some_and(|s| self.alive(s, now))
    }

    /// The keys to seal the next data packet with. Also the trigger for handshakes: without
    /// usable keys it asks for one; with keys due for rotation it asks for the rekey and still
    /// returns the current keys. It never computes a handshake itself (that is Diffie-Hellman
    /// work, which must not run on a data thread): it makes [`Peer::poll_timeout`] due at once,
    /// and the driver's [`Peer::handle_timeout`] builds the initiation. Counts as sending for
    /// the keepalive and reply timers.
    ///
    /// # Errors
    /// [`SendError::NoSession`] while a handshake is pending, [`SendError::Unreachable`] when
    /// none can be started.
    pub fn send_session(&mut self, now: Instant) -> Result<Arc<Session>, SendError> {
        let session = self.sending_session(now)?;
        self.awaiting_reply_since.get_or_insert(now);
        Ok(session)
    }

    /// [`Peer::send_session`] without arming the reply timer: for keepalives, which nobody
    /// answers.
    fn sending_session(&mut self, now: Instant) -> Result<Arc<Session>, SendError> {
        let usable = self
            .current
            .as_ref()
            .filter(|s| self.alive(s, now) && s.counters_used() < self.timing.reject_after_messages)
            .cloned();
        let Some(session) = usable else {
            return match self.request_handshake() {
                Ok(()) => Err(SendError::NoSession),
                Err(_) => Err(SendError::Unreachable),
            };
        };
        let old = now.saturating_duration_since(session.created());
        if session.counters_used() >= self.timing.rekey_after_messages
            || (session.is_initiator() && old >= self.timing.rekey_after_time)
        {
            // Ignored failure: we keep sending on the current keys meanwhile.
            let _ = self.request_handshake();
        }
        self.note_sent(now);
        Ok(session)
    }

    /// The frame version our initiations to the peer take: the newest both speak, as the
    /// cloud described the peer, or our oldest (docs/protocol.md §2, *Versions*).
    ///
    /// # Errors
    /// [`HandshakeError::NoCommonVersion`]: the peer's versions and ours are apart.
    pub fn version_to_speak(&self) -> Result<u8, HandshakeError> {
        let ours = self.identity.versions();
        match self.config.versions {
            None => Ok(ours.oldest()),
            Some(theirs) => ours
                .to_speak(Some(theirs))
                .ok_or(HandshakeError::NoCommonVersion { ours, theirs }),
        }
    }

    /// The tunnel versions the cloud said the peer speaks (`None`: nobody said), for the
    /// next initiation on.
    pub fn set_versions(&mut self, versions: Option<Versions>) {
        self.config.versions = versions;
    }

    /// The frame version of the keys we send on, while we have any.
    pub fn session_version(&self, now: Instant) -> Option<u8> {
        self.current
            .as_ref()
            .filter(|s| self.alive(s, now))
            .map(|s| s.version())
    }

    /// The live session that owns `index` (from a frame's receiver index), if any.
    pub fn session_for_index(&self, index: u32, now: Instant) -> Option<Arc<Session>> {
        [&self.current, &self.previous, &self.next]
            .into_iter()
            .flatten()
            .find(|s| s.local_index() == index && self.alive(s, now))
            .cloned()
    }

    /// Tells the peer that a frame sealed by `session` authenticated and passed the replay
    /// check: confirms responder keys, updates timers, follows the peer to a new address.
    pub fn handle_authenticated(
        &mut self,
        now: Instant,
        local_index: u32,
        from: SocketAddr,
        is_data: bool,
    ) {
        if self
            .next
            .as_ref()
            .is_some_and(|s| s.local_index() == local_index)
        {
            // Key confirmation: the initiator used the keys we answered with.
            self.previous = self.current.take();
            self.current = self.next.take();
            self.last_handshake = Some(now);
            self.events.push_back(Event::Established {
                initiator: false,
                rekey: self.had_session,
            });
            self.had_session = true;
        }
        self.awaiting_reply_since = None;
        if is_data && self.passive_keepalive_at.is_none() {
            self.passive_keepalive_at = Some(now + self.timing.keepalive_timeout);
        }
        self.roam(from, now);
        // An initiator whose keys are about to expire while the peer still sends on them
        // starts a last-minute handshake (WireGuard's keep_key_fresh on receive).
        let late = self
            .timing
            .reject_after_time
            .saturating_sub(self.timing.keepalive_timeout + self.timing.handshake_retry_max);
        if let Some(s) = &self.current
            && s.is_initiator()
            && now.saturating_duration_since(s.created()) >= late
        {
            let _ = self.request_handshake();
        }
    }

    /// Our own underlay address changed: show the peer where we are now. With usable keys an
    /// authenticated keepalive goes out at once, and the peer follows it as it follows any
    /// authenticated frame; otherwise nothing (the next packet for the peer starts a
    /// handshake from the new address anyway). Without this, a peer we only receive from
    /// would keep sending to our old address until our next keepalive or its reply timer.
    pub fn local_address_changed(&mut self, now: Instant) {
        self.send_keepalive(now);
    }

    /// The pair's relay channel (`None`: not relayed, or never). Frames from it never move
    /// the peer off a direct path that carried a frame in the last [`DIRECT_HOLD`].
    pub fn set_relay(&mut self, relay: Option<SocketAddr>) {
        self.relay = relay;
    }

    /// Whether frames to the peer go through its relay channel now.
    pub fn is_relayed(&self) -> bool {
        self.relay.is_some() && self.endpoint == self.relay
    }

    /// Seals `msg` in a path frame to `to` under the current keys (docs/protocol.md §4,
    /// *Back to direct*). Arms no timer and asks for no handshake: `None` without usable
    /// keys.
    pub fn path_transmit(
        &mut self,
        now: Instant,
        msg: &PathMsg,
        to: SocketAddr,
    ) -> Option<Transmit> {
        let session = self.current.as_ref().filter(|s| {
            self.alive(s, now) && s.counters_used() < self.timing.reject_after_messages
        })?;
        let payload = msg.encode();
        let mut frame = vec![0u8; HEADER_LEN + payload.len() + TAG_LEN];
        frame[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(&payload);
        let counter = session.reserve_counter().ok()?;
        session.seal_path(counter, &mut frame, payload.len()).ok()?;
        Some(Transmit {
            destination: to,
            frame,
        })
    }

    /// Opens a path frame in place. The replay window moves; nothing else changes (no
    /// roaming, no key confirmation, no timer), so a path that works one way moves nothing.
    ///
    /// # Errors
    /// [`RecvError`]; [`RecvError::PathMessage`] for a message the protocol does not define.
    pub fn open_path(&mut self, now: Instant, frame: &mut [u8]) -> Result<PathMsg, RecvError> {
        let (_, _, plain) = self.open_sealed(now, frame, Session::open_path)?;
        PathMsg::decode(plain).ok_or(RecvError::PathMessage)
    }

    /// The sequential receive path's steps for a sealed frame: the session its index
    /// names, the replay pre-check, `open` (which also checks the type), the window moved.
    /// The session, the frame's type and the plaintext.
    fn open_sealed<'a>(
        &self,
        now: Instant,
        frame: &'a mut [u8],
        open: impl FnOnce(&Session, &'a mut [u8]) -> Result<(u64, &'a mut [u8]), RecvError>,
    ) -> Result<(Arc<Session>, MessageType, &'a mut [u8]), RecvError> {
        let repr = FrameRepr::parse(&Frame::new_checked(&*frame)?, self.identity.versions())?;
        let session = self
            .session_for_index(repr.receiver_index, now)
            .ok_or(RecvError::UnknownIndex(repr.receiver_index))?;
        session.check_replay(repr.counter)?;
        let (counter, plain) = open(&session, frame)?;
        session.accept_counter(counter)?;
        Ok((session, repr.msg_type, plain))
    }

    /// Sends to `to` from now on: a pong proved the direct path to it both ways. An
    /// authenticated keepalive goes there at once, so that the peer follows.
    pub fn move_direct(&mut self, to: SocketAddr, now: Instant) {
        self.direct_heard = Some(now);
        if self.endpoint != Some(to) {
            let old = self.endpoint.replace(to);
            self.events
                .push_back(Event::EndpointChanged { old, new: to });
        }
        self.send_keepalive(now);
    }

    /// Starts a handshake now if none is pending (the cloud asks for it when hole punching), or
    /// when the hold of [`Peer::hold_initiations_until`] ends.
    ///
    /// # Errors
    /// [`HandshakeError::CannotInitiate`] without the peer's static key or endpoint.
    pub fn initiate(&mut self, now: Instant) -> Result<(), HandshakeError> {
        self.start_handshake(now)
    }

    /// Sends no initiation before `until` (a hole punch's lead: our punch has opened our NAT,
    /// the peer's must open its own before our initiation arrives there). One asked for
    /// meanwhile goes out at `until`, unless keys exist by then (the peer's initiation came
    /// first and was answered: answering is never held).
    pub fn hold_initiations_until(&mut self, until: Instant) {
        self.hold_until = Some(until);
    }

    fn held(&self, now: Instant) -> bool {
        self.hold_until.is_some_and(|h| now < h)
    }

    /// Answers an initiation that [`handshake::read_init`] accepted for this peer.
    ///
    /// # Errors
    /// [`HandshakeError`]: the certificate is not what this peer must present, the initiation
    /// is replayed or too frequent.
    pub fn handle_init(
        &mut self,
        now: Instant,
        from: SocketAddr,
        init: IncomingInit,
    ) -> Result<(), HandshakeError> {
        self.config.check(&init.cert)?;
        if let Some(newest) = self.newest_init_timestamp
            && init.timestamp <= newest
        {
            return Err(HandshakeError::Replay {
                timestamp: init.timestamp,
                newest,
            });
        }
        if self
            .last_init_accepted
            .is_some_and(|t| now.saturating_duration_since(t) < self.timing.init_min_interval)
        {
            return Err(HandshakeError::TooFrequent);
        }
        let local_index = self.next_index();
        let cert = init.cert.clone();
        let (timestamp, remote_index, version) = (init.timestamp, init.sender_index, init.version);
        let (frame, keys) = handshake::write_response(&self.identity, init, local_index.value())?;
        self.newest_init_timestamp = Some(timestamp);
        self.last_init_accepted = Some(now);
        // The initiator chose the version; we answered in it.
        let session = Session::new(
            (local_index, remote_index),
            false,
            now,
            self.backend,
            keys,
            self.timing.reject_after_messages,
            version,
        );
        // As responder the new keys wait in `next` for confirmation; the oldest keys go.
        self.next = Some(Arc::new(session));
        self.previous = None;
        self.remote_cert = Some(cert);
        self.roam(from, now);
        self.transmits.push_back(Transmit {
            destination: from,
            frame,
        });
        Ok(())
    }

    /// Completes our pending handshake with the responder's answer.
    ///
    /// # Errors
    /// [`HandshakeError`]: not for a pending handshake, not decryptable, certificate refused
    /// or not the expected one. A response that does not decrypt changes nothing: the genuine
    /// one is still accepted after it. One that decrypts (so the responder sent it) but is
    /// refused ends the attempt; the next retry starts afresh.
    pub fn handle_response(
        &mut self,
        now: Instant,
        from: SocketAddr,
        frame: &[u8],
    ) -> Result<(), HandshakeError> {
        let index = handshake::response_receiver(frame, self.identity.versions())?;
        let remote = self
            .config
            .remote_static
            .ok_or(HandshakeError::CannotInitiate("static key"))?;
        let unix_secs = self.clock.unix_secs(now);
        let Some((state, version)) = self
            .pending
            .as_mut()
            .filter(|p| p.local_index.value() == index)
            .and_then(|p| Some((p.state.as_mut()?, p.version)))
        else {
            return Err(HandshakeError::UnknownIndex(index));
        };
        let result =
            handshake::read_response(&self.identity, state, (&remote, version), unix_secs, frame)
                .and_then(|r| self.config.check(&r.cert).map(|()| r));
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                if state.is_handshake_finished() {
                    // The responder's own message, refused: this attempt is spent.
                    if let Some(p) = self.pending.as_mut() {
                        p.state = None;
                    }
                }
                return Err(e);
            }
        };
        let Some(pending) = self.pending.take() else {
            return Err(HandshakeError::UnknownIndex(index));
        };
        let session = Arc::new(Session::new(
            (pending.local_index, response.sender_index),
            true,
            now,
            self.backend,
            response.keys,
            self.timing.reject_after_messages,
            pending.version,
        ));
        if let Some(next) = self.next.take() {
            self.previous = Some(next);
        } else {
            self.previous = self.current.take();
        }
        self.current = Some(session);
        self.remote_cert = Some(response.cert);
        self.attempts_since = None;
        self.retry_backoff = self.timing.handshake_retry_initial;
        self.last_handshake = Some(now);
        self.events.push_back(Event::Established {
            initiator: true,
            rekey: self.had_session,
        });
        self.had_session = true;
        self.roam(from, now);
        // Confirm the keys to the responder right away, whether or not data is waiting.
        self.send_keepalive(now);
        Ok(())
    }

    /// Takes the cookie a responder under load sent for our pending initiation; the next
    /// initiation (at the ordinary retry time, not at once) carries mac2 with it.
    ///
    /// # Errors
    /// [`HandshakeError::UnknownIndex`] when no pending initiation has the frame's index,
    /// [`HandshakeError::Cookie`] when it does not open for that initiation.
    pub fn handle_cookie_reply(
        &mut self,
        now: Instant,
        frame: &[u8],
    ) -> Result<(), HandshakeError> {
        let view = Frame::new_checked(frame)?;
        let repr = FrameRepr::parse(&view, self.identity.versions())?;
        if repr.msg_type != MessageType::CookieReply {
            return Err(HandshakeError::WrongType {
                expected: MessageType::CookieReply,
                got: repr.msg_type,
            });
        }
        let remote = self
            .config
            .remote_static
            .ok_or(HandshakeError::CannotInitiate("static key"))?;
        let Some(pending) = self
            .pending
            .as_ref()
            .filter(|p| p.local_index.value() == repr.receiver_index)
        else {
            return Err(HandshakeError::UnknownIndex(repr.receiver_index));
        };
        let cookie = cookie::open_reply(frame, &MacKeys::new(&remote), &pending.mac1)
            .ok_or(HandshakeError::Cookie)?;
        self.cookie = Some((cookie, now));
        Ok(())
    }

    /// Seals `payload` for the peer into `out` (header, ciphertext, tag) and returns the frame
    /// length: the sequential path, for control traffic and tests. The adapter's data plane
    /// uses [`Peer::send_session`] and seals on its crypto workers instead.
    ///
    /// # Errors
    /// [`SendError`].
    pub fn encapsulate(
        &mut self,
        now: Instant,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, SendError> {
        let needed = HEADER_LEN + payload.len() + TAG_LEN;
        let Some(body) = out.get_mut(HEADER_LEN..HEADER_LEN + payload.len()) else {
            return Err(SendError::BufferTooSmall { needed });
        };
        body.copy_from_slice(payload);
        let session = self.send_session(now)?;
        let counter = session.reserve_counter()?;
        session.seal(counter, out, payload.len())
    }

    /// Opens a data or keepalive frame from `from` in place: the sequential receive path.
    ///
    /// # Errors
    /// [`RecvError`]; the frame is then dropped and nothing changes.
    pub fn decapsulate<'a>(
        &mut self,
        now: Instant,
        from: SocketAddr,
        frame: &'a mut [u8],
    ) -> Result<Received<'a>, RecvError> {
        let (session, msg_type, plain) = self.open_sealed(now, frame, Session::open)?;
        let is_data = msg_type == MessageType::Data;
        self.handle_authenticated(now, session.local_index(), from, is_data);
        Ok(if is_data {
            Received::Data(plain)
        } else {
            Received::Keepalive
        })
    }

    /// The next moment [`Peer::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let expiries = [&self.current, &self.previous, &self.next]
            .into_iter()
            .flatten()
            .map(|s| s.created() + self.timing.reject_after_time);
        let keepalive = self.current.as_ref().and(self.passive_keepalive_at);
        // A requested handshake is due at once (the clock's origin lies before any `now`), or
        // when a hold ends.
        let requested = self
            .handshake_requested
            .then(|| self.hold_until.unwrap_or(self.clock.origin()));
        let reply = self
            .awaiting_reply_since
            .map(|t| t + self.timing.reply_timeout);
        expiries
            .chain(self.pending.as_ref().map(|p| p.retry_at))
            .chain(keepalive)
            .chain(self.persistent_due())
            .chain(requested)
            .chain(reply)
            .min()
    }

    /// Runs the timers due at `now`: expiry, handshake retries, keepalives.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire(now);
        if self.hold_until.take_if(|h| now >= *h).is_some() && self.is_established(now) {
            // The peer's initiation won the race: the held one is not needed.
            self.handshake_requested = false;
        }
        if std::mem::take(&mut self.handshake_requested) {
            let _ = self.start_handshake(now);
        }
        if self
            .awaiting_reply_since
            .take_if(|t| now >= *t + self.timing.reply_timeout)
            .is_some()
        {
            // Our data went unanswered: the peer may have lost our keys.
            let _ = self.start_handshake(now);
        }
        if let Some(retry_at) = self.pending.as_ref().map(|p| p.retry_at)
            && now >= retry_at
        {
            self.pending = None;
            let since = *self.attempts_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= self.timing.handshake_attempt_time {
                self.attempts_since = None;
                self.retry_backoff = self.timing.handshake_retry_initial;
                self.events.push_back(Event::HandshakeGaveUp);
            } else {
                self.retry_backoff = (self.retry_backoff * 2).min(self.timing.handshake_retry_max);
                let _ = self.start_handshake(now);
            }
        }
        // Every timer that fires is consumed, whether or not its action succeeds, so that
        // `poll_timeout` never returns a deadline in the past twice.
        if self.passive_keepalive_at.take_if(|t| now >= *t).is_some() {
            self.send_keepalive(now);
        }
        if self.persistent_due().is_some_and(|t| now >= t) {
            if self.is_established(now) {
                self.send_keepalive(now);
            } else if self.attempts_since.is_none() {
                // Keep an idle peer reachable: try a handshake once per interval.
                let _ = self.start_handshake(now);
            }
            self.last_sent = Some(now);
        }
    }

    /// When the persistent keepalive is due; none while a handshake is pending (its retry
    /// timer drives) or when not configured. Before anything was sent, it is due at once.
    fn persistent_due(&self) -> Option<Instant> {
        let every = self.config.persistent_keepalive?;
        if self.pending.is_some() {
            return None;
        }
        Some(self.last_sent.map_or(self.clock.origin(), |t| t + every))
    }

    /// Whether events wait for [`Peer::poll_event`] (a data thread that confirmed keys in
    /// [`Peer::handle_authenticated`] wakes the driver with this).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next frame to send (handshakes, keepalives).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn alive(&self, s: &Session, now: Instant) -> bool {
        now.saturating_duration_since(s.created()) < self.timing.reject_after_time
    }

    fn expire(&mut self, now: Instant) {
        let timing = self.timing;
        let dead = |slot: &Option<Arc<Session>>| {
            slot.as_ref().is_some_and(|s| {
                now.saturating_duration_since(s.created()) >= timing.reject_after_time
            })
        };
        let mut expired = false;
        for slot in [&mut self.current, &mut self.previous, &mut self.next] {
            if dead(slot) {
                *slot = None;
                expired = true;
            }
        }
        if expired && self.current.is_none() && self.previous.is_none() && self.next.is_none() {
            self.passive_keepalive_at = None;
            self.events.push_back(Event::Expired);
        }
    }

    fn next_index(&self) -> LocalIndex {
        self.indices.allocate(self.id)
    }

    /// Asks for a handshake without computing it; see [`Peer::send_session`].
    fn request_handshake(&mut self) -> Result<(), HandshakeError> {
        if self.config.remote_static.is_none() {
            return Err(HandshakeError::CannotInitiate("static key"));
        }
        if self.endpoint.is_none() {
            return Err(HandshakeError::CannotInitiate("endpoint"));
        }
        self.version_to_speak()?;
        if self.pending.is_none() {
            self.handshake_requested = true;
        }
        Ok(())
    }

    fn start_handshake(&mut self, now: Instant) -> Result<(), HandshakeError> {
        if self.held(now) {
            self.handshake_requested = true;
            return Ok(());
        }
        self.handshake_requested = false;
        if self.pending.is_some() {
            return Ok(());
        }
        let remote = self
            .config
            .remote_static
            .ok_or(HandshakeError::CannotInitiate("static key"))?;
        let destination = self
            .endpoint
            .ok_or(HandshakeError::CannotInitiate("endpoint"))?;
        let version = self.version_to_speak()?;
        let local_index = self.next_index();
        // Strictly increasing even if the wall clock stalls, so the peer never sees a replay.
        let timestamp = self.clock.unix_nanos(now).max(self.last_timestamp_sent + 1);
        // Zeros, never known, when we share no key with the peer.
        let hint = self.known.as_ref().map_or([0; MAC_LEN], |k| {
            k.hint(&remote, hint_epoch(self.clock.unix_secs(now)))
        });
        let (state, mut frame) = handshake::write_init(
            &self.identity,
            (&remote, version),
            local_index.value(),
            timestamp,
            &hint,
        )?;
        let cookie = self
            .cookie
            .filter(|(_, at)| now.saturating_duration_since(*at) < COOKIE_LIFETIME)
            .map(|(c, _)| c);
        let mac1 = cookie::seal_macs(&mut frame, &MacKeys::new(&remote), cookie.as_ref());
        self.last_timestamp_sent = timestamp;
        self.attempts_since.get_or_insert(now);
        self.pending = Some(Pending {
            state: Some(state),
            local_index,
            retry_at: now + self.retry_backoff,
            mac1,
            version,
        });
        self.transmits.push_back(Transmit { destination, frame });
        Ok(())
    }

    /// Sends an empty authenticated frame on the current keys. It goes through
    /// [`Peer::send_session`] like data, so keepalives alone also rotate keys on time.
    fn send_keepalive(&mut self, now: Instant) {
        let Some(destination) = self.endpoint else {
            return;
        };
        if !self.is_established(now) {
            return;
        }
        let Ok(session) = self.sending_session(now) else {
            return;
        };
        let Ok(counter) = session.reserve_counter() else {
            return;
        };
        let mut frame = vec![0u8; HEADER_LEN + TAG_LEN];
        if session.seal(counter, &mut frame, 0).is_ok() {
            self.transmits.push_back(Transmit { destination, frame });
        }
    }

    fn note_sent(&mut self, now: Instant) {
        self.last_sent = Some(now);
        self.passive_keepalive_at = None;
    }

    /// Follows the peer to `from`, the source of an authenticated frame or an accepted
    /// initiation (WireGuard's roaming), except from the relay channel back off a direct
    /// path that carried a frame in the last [`DIRECT_HOLD`] (docs/protocol.md §4, *Back
    /// to direct*).
    fn roam(&mut self, from: SocketAddr, now: Instant) {
        let from_relay = self.relay == Some(from);
        if !from_relay {
            self.direct_heard = Some(now);
        }
        if self.endpoint == Some(from) {
            return;
        }
        let direct_live = self.endpoint.is_some()
            && self
                .direct_heard
                .is_some_and(|t| now.saturating_duration_since(t) < DIRECT_HOLD);
        if from_relay && direct_live {
            return;
        }
        let old = self.endpoint.replace(from);
        self.events
            .push_back(Event::EndpointChanged { old, new: from });
    }
}

/// How long after an authenticated frame from the peer's direct address relayed frames
/// still do not move the peer back to the relay: those the relay held when the pair moved.
pub const DIRECT_HOLD: Duration = Duration::from_secs(3);
